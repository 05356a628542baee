//! Each malformed configuration gives its own error, naming the key.

use super::*;

fn err(text: &str) -> String {
    match Config::from_toml(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

fn assert_err(text: &str, needles: &[&str]) {
    let e = err(text);
    for n in needles {
        assert!(e.contains(n), "error {e:?} does not mention {n:?}");
    }
}

#[test]
fn empty_file_is_the_default_run() {
    let c = Config::from_toml("").unwrap();
    assert_eq!(c, Config::default());
    let nodes = c.nodes();
    assert_eq!(nodes.len(), 5);
    assert_eq!(
        nodes.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(),
        ["evm", "ru0", "ru1", "bu0", "bu1"]
    );
    // and it survives a round trip through TOML
    assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
}

#[test]
fn the_commented_default_file_is_the_default() {
    assert_eq!(Config::from_toml(DEFAULT_TOML).unwrap(), Config::default());
}

#[test]
fn counts_and_base_port_make_addresses() {
    let c = Config::from_toml("[topology]\nrus = 3\nbus = 2\nbase_port = 9000\n").unwrap();
    let addrs: Vec<String> = c.nodes().into_iter().map(|n| n.addr).collect();
    assert_eq!(addrs[0], "127.0.0.1:9000");
    assert_eq!(addrs[3], "127.0.0.1:9003");
    assert_eq!(addrs[5], "127.0.0.1:9005");
}

#[test]
fn explicit_nodes() {
    let c = Config::from_toml(
        r#"
        [evm]
        addr = "127.0.0.1:7000"
        [[ru]]
        id = "ru-a"
        addr = "127.0.0.1:7001"
        source_id = 841
        [[bu]]
        id = "bu-a"
        addr = "127.0.0.1:7002"
        credits = 4
        sink = "count"
        "#,
    )
    .unwrap();
    let n = c.nodes();
    assert_eq!(n.len(), 3);
    assert_eq!(n[1].source_id, 841);
    assert_eq!(n[2].credits, 4);
    assert_eq!(n[2].sink, SinkKind::Count);
}

#[test]
fn unknown_keys_are_named() {
    assert_err("[fragments]\nsize = 10\nsizee = 3\n", &["sizee"]);
    assert_err("[runn]\nid = \"x\"\n", &["runn"]);
    assert_err(
        "[[bu]]\nid = \"b\"\naddr = \"127.0.0.1:1\"\ncredit = 3\n",
        &["credit"],
    );
}

#[test]
fn wrong_types_and_values_are_named() {
    assert_err("[run]\nevents = \"many\"\n", &["events"]);
    assert_err("[fragments]\ndistribution = \"gaussian\"\n", &["gaussian"]);
    assert_err("[builder]\nverify = \"maybe\"\n", &["maybe"]);
    assert_err(
        "[transport]\nkind = \"carrier-pigeon\"\n",
        &["carrier-pigeon"],
    );
    assert_err("this is not toml", &["line 1"]);
}

#[test]
fn affinity_names_nodes_of_the_run_and_real_cpu_numbers() {
    let c = Config::from_toml("[affinity]\nevm = [0]\nbu1 = [1, 0]\n").unwrap();
    assert_eq!(c.affinity["bu1"], vec![1, 0]);
    assert_err("[affinity]\nbu9 = [0]\n", &["affinity.bu9", "no node"]);
    assert_err("[affinity]\nru0 = []\n", &["affinity.ru0", "at least one"]);
    assert_err("[affinity]\nru0 = [0, 4096]\n", &["affinity.ru0", "4096"]);
    assert_err("[affinity]\nru0 = [-1]\n", &["ru0 = [-1]", "usize"]);
}

#[test]
fn semantic_errors_name_the_key() {
    assert_err("[topology]\nbus = 0\n", &["topology.bus", "BU count 0"]);
    assert_err("[topology]\nrus = 0\n", &["topology.rus"]);
    assert_err(
        "[run]\nduration_s = 0\nevents = 0\n",
        &["`run`", "must end"],
    );
    assert_err("[run]\nid = \"\"\n", &["run.id"]);
    assert_err("[run]\nrate_hz = -1.0\n", &["run.rate_hz"]);
    assert_err("[fragments]\nsize = 0\n", &["fragments.size"]);
    assert_err(
        "[fragments]\nstddev = 5\n",
        &["fragments.stddev", "lognormal"],
    );
    assert_err(
        "[fragments]\ndistribution = \"lognormal\"\nsize = 100\nmax = 50\n",
        &["fragments.max"],
    );
    let auto = |frag: u64| {
        Config::from_toml(&format!("[fragments]\nsize = {frag}\n"))
            .unwrap()
            .nodes()[3]
            .credits
    };
    assert_eq!(auto(524288), 16, "1 MiB events: 16 in flight");
    assert_eq!(auto(256), 4096, "small events: many in flight");
    assert_err("[buffers]\nblock_size = 100\n", &["buffers.block_size"]);
    assert_err(
        "[buffers]\nru_pool_mib = 1\n",
        &["buffers.ru_pool_mib", "too small"],
    );
    assert_err("[messaging]\npage_size = 1\n", &["messaging.page_size"]);
}

#[test]
fn node_list_errors_name_the_entry() {
    let dup = r#"
        [[ru]]
        id = "a"
        addr = "127.0.0.1:7001"
        [[bu]]
        id = "a"
        addr = "127.0.0.1:7002"
    "#;
    assert_err(dup, &["bu[0].id", "duplicate node id", "ru[0]"]);
    let clash = r#"
        [[ru]]
        id = "r"
        addr = "127.0.0.1:7001"
        [[bu]]
        id = "b"
        addr = "127.0.0.1:7001"
    "#;
    assert_err(clash, &["bu[0].addr", "port clash"]);
    let bad_addr = "[[ru]]\nid = \"r\"\naddr = \"localhost\"\n";
    assert_err(bad_addr, &["ru[0].addr", "IP:port"]);
    let same_source = r#"
        [[ru]]
        id = "r1"
        addr = "127.0.0.1:7001"
        source_id = 3
        [[ru]]
        id = "r2"
        addr = "127.0.0.1:7002"
        source_id = 3
    "#;
    assert_err(same_source, &["ru[1].source_id"]);
    let zero_credit = "[[bu]]\nid = \"b\"\naddr = \"127.0.0.1:7009\"\ncredits = 0\n";
    assert_err(zero_credit, &["bu[0].credits"]);
    // an entry without an address gets one from the topology host
    let c = Config::from_toml("[[bu]]\nid = \"b\"\n").unwrap();
    assert_eq!(c.nodes()[3].addr, "127.0.0.1:0");
    assert_err("[evm]\nid = \"ru0\"\n", &["duplicate node id"]);
}

#[test]
fn file_sources_and_sinks_are_checked() {
    let fed = r#"
        [run]
        duration_s = 0
        [source]
        kind = "fed"
        [[ru]]
        id = "ru0"
        source_id = 841
        files = ["a.raw"]
        [[ru]]
        id = "ru1"
        source_id = 843
        files = ["b.raw", "c.raw"]
    "#;
    let c = Config::from_toml(fed).unwrap();
    assert_eq!(c.nodes()[2].files, vec!["b.raw", "c.raw"]);
    assert_err("[source]\nkind = \"fed\"\n", &["source.kind", "[[ru]]"]);
    assert_err(
        &fed.replace("files = [\"a.raw\"]", ""),
        &["ru[0].files", "needs at least one file"],
    );
    assert_err(
        "[[ru]]\nid = \"r\"\nfiles = [\"x\"]\n",
        &["ru[0].files", "only read"],
    );
    // looping forever with no events or duration never ends
    assert_err(
        &fed.replace("kind = \"fed\"", "kind = \"fed\"\nloop = true"),
        &["must end"],
    );
    assert_err("[sink]\nkind = \"file\"\n", &["sink.dir"]);
    assert_err("[source]\non_error = \"ignore\"\n", &["ignore"]);
    let c = Config::from_toml("[sink]\nkind = \"file\"\ndir = \"/tmp/x\"\n").unwrap();
    assert!(c
        .nodes()
        .iter()
        .filter(|n| n.role == Role::Bu)
        .all(|n| n.sink == SinkKind::File));
}

#[test]
fn listening_beyond_loopback_needs_a_secret() {
    let open = "[[ru]]\nid = \"r\"\naddr = \"10.1.2.3:7001\"\n";
    if std::env::var("EVB_SECRET").is_err() {
        assert_err(open, &["ru[0].addr", "beyond loopback", "secret"]);
    }
    let c = Config::from_toml(&format!("[run]\nsecret = \"s3cret\"\n{open}")).unwrap();
    assert_eq!(c.secret().as_deref(), Some("s3cret"));
    assert!(!c.to_toml().is_empty());
}

mod props {
    use proptest::prelude::*;

    use crate::Config;

    proptest! {
        #[test]
        fn any_text_gives_a_config_or_an_error_never_a_panic(text in "[\\[\\]a-z_=\"0-9. \\n-]{0,200}") {
            let _ = Config::from_toml(&text);
        }
    }
}

#[test]
fn local_transport_is_checked() {
    let c = Config::from_toml("[transport]\nkind = \"tcp\"\nlocal = \"shm\"\n").unwrap();
    assert_eq!(c.transport.local, Some(TransportKind::Shm));
    assert_err(
        "[transport]\nkind = \"shm\"\nlocal = \"shm\"\n",
        &["transport.local", "same"],
    );
    assert_err(
        "[transport]\nkind = \"tcp\"\nlocal = \"inproc\"\n",
        &["transport.local", "inproc"],
    );
}

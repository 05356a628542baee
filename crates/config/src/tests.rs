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

/// Every choice a key of the commented default file accepts is named in its comment (issue
/// 71: `evb config default` omitted "hdf5" from sink.kind and "frames" from source.format).
/// Each `key = "word"  # comment` line is tried with a word no key accepts: the error lists
/// the accepted ones, and each must be in the comment.
#[test]
fn the_default_file_names_every_choice_of_its_keys() {
    let mut section = String::new();
    let mut checked = 0;
    for line in DEFAULT_TOML.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            section = l.split('#').next().unwrap_or(l).trim().to_string();
            continue;
        }
        let Some((assign, comment)) = l.split_once('#') else {
            continue;
        };
        let Some((key, value)) = assign.split_once('=') else {
            continue;
        };
        if !value.trim().starts_with('"') || l.starts_with('#') {
            continue;
        }
        let toml = format!("{section}\n{} = \"no-such-choice\"\n", key.trim());
        let Err(e) = Config::from_toml(&toml) else {
            continue;
        };
        let said = e.to_string();
        let Some(expected) = said.split("expected one of").nth(1) else {
            continue;
        };
        for choice in expected.split('`').skip(1).step_by(2) {
            assert!(
                comment.contains(&format!("\"{choice}\"")),
                "{section} {}: the comment does not name \"{choice}\": {line}",
                key.trim()
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 5,
        "only {checked} keys with choices were checked"
    );
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
    // a run with neither events nor a duration: valid (under `evb up` it runs until
    // stopped), refused for `evb run`, naming the key
    let endless = Config::from_toml("[run]\nduration_s = 0\nevents = 0\n").unwrap();
    assert!(!endless.ends_by_itself());
    let e = endless.validate_once().unwrap_err().to_string();
    assert!(e.contains("`run`") && e.contains("must end"), "{e}");
    assert!(Config::default().validate_once().is_ok());
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
    // looping forever with no events or duration never ends by itself
    let looped =
        Config::from_toml(&fed.replace("kind = \"fed\"", "kind = \"fed\"\nloop = true")).unwrap();
    assert!(!looped.ends_by_itself());
    assert!(looped
        .validate_once()
        .unwrap_err()
        .to_string()
        .contains("must end"));
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
fn the_hdf5_sink_and_its_deflate_level_are_checked_by_name() {
    let h5 = "[sink]\nkind = \"hdf5\"\ndir = \"/tmp/x\"\n";
    assert_err("[sink]\nkind = \"hdf5\"\n", &["sink.dir"]);
    if cfg!(feature = "hdf5") {
        let c = Config::from_toml(&format!("{h5}hdf5_deflate = 9\n")).unwrap();
        assert_eq!(c.sink.hdf5_deflate, 9);
        assert!(c.sink.kind.commits() && c.sink.kind.writes_files());
        assert_err(
            &format!("{h5}hdf5_deflate = 10\n"),
            &["sink.hdf5_deflate", "0 to 9"],
        );
        // one BU of several
        let one = "[sink]\ndir = \"/tmp/x\"\n[[bu]]\nid = \"b0\"\nsink = \"hdf5\"\n";
        assert!(Config::from_toml(one).is_ok());
    } else {
        assert_err(h5, &["sink.kind", "--features hdf5"]);
        let one = "[sink]\ndir = \"/tmp/x\"\n[[bu]]\nid = \"b0\"\nsink = \"hdf5\"\n";
        assert_err(one, &["bu[0].sink", "--features hdf5"]);
    }
    // zstd for evb's own files only, at a level zstd has
    let c = Config::from_toml(
        "[sink]\nkind = \"file\"\ndir = \"/tmp/x\"\ncompress = \"zstd\"\ncompress_level = 19\n",
    )
    .unwrap();
    assert_eq!(
        (c.sink.compress, c.sink.compress_level),
        (crate::Compress::Zstd, Some(19))
    );
    assert_err(
        "[sink]\nkind = \"file\"\ndir = \"/tmp/x\"\ncompress_level = 5\n",
        &["sink.compress_level", "only read"],
    );
    assert_err(
        "[sink]\nkind = \"file\"\ndir = \"/tmp/x\"\ncompress = \"zstd\"\ncompress_level = 0\n",
        &["sink.compress_level", "1 to 19"],
    );
    assert_err(
        "[sink]\ncompress = \"zstd\"\n",
        &["sink.compress", "only read"],
    );
    assert_err(
        "[sink]\nkind = \"file\"\ndir = \"/tmp/x\"\ncompress = \"lz4\"\n",
        &["compress"],
    );
    // a level for a sink that does not compress is refused, not ignored
    assert_err(
        "[sink]\nkind = \"file\"\ndir = \"/tmp/x\"\nhdf5_deflate = 3\n",
        &["sink.hdf5_deflate", "only read"],
    );
}

/// Committed files leave the page cache unless asked to stay, and only a sink that writes
/// files reads the key.
#[test]
fn the_page_cache_is_given_back_by_default_and_kept_only_for_file_sinks() {
    let c = Config::from_toml("[sink]\nkind = \"file\"\ndir = \"/tmp/x\"\n").unwrap();
    assert!(!c.sink.keep_in_page_cache);
    let c =
        Config::from_toml("[sink]\nkind = \"file\"\ndir = \"/tmp/x\"\nkeep_in_page_cache = true\n")
            .unwrap();
    assert!(c.sink.keep_in_page_cache);
    assert_err(
        "[sink]\nkeep_in_page_cache = true\n",
        &["sink.keep_in_page_cache", "only read"],
    );
}

#[test]
fn the_hdf5_layout_is_read_by_name_and_only_for_an_hdf5_sink() {
    let h5 = "[sink]\nkind = \"hdf5\"\ndir = \"/tmp/x\"\n";
    let c = Config::from_toml("").unwrap();
    assert_eq!(
        c.sink.hdf5_layout,
        crate::Hdf5Layout::Evb,
        "evb's own by default"
    );
    if cfg!(feature = "hdf5") {
        let c = Config::from_toml(&format!("{h5}hdf5_layout = \"dune\"\n")).unwrap();
        assert_eq!(c.sink.hdf5_layout, crate::Hdf5Layout::Dune);
        let c = Config::from_toml(&format!("{h5}hdf5_layout = \"evb\"\n")).unwrap();
        assert_eq!(c.sink.hdf5_layout, crate::Hdf5Layout::Evb);
        let c = Config::from_toml(&format!("{h5}hdf5_layout = \"packed\"\n")).unwrap();
        assert_eq!(c.sink.hdf5_layout, crate::Hdf5Layout::Packed);
        // one BU of several writes HDF5: the key is read
        let one = "[sink]\ndir = \"/tmp/x\"\nhdf5_layout = \"dune\"\n\
                   [[bu]]\nid = \"b0\"\nsink = \"hdf5\"\n";
        assert!(Config::from_toml(one).is_ok());
    }
    assert_err(
        &format!("{h5}hdf5_layout = \"DUNE5\"\n"),
        &[
            "sink.hdf5_layout",
            "\"DUNE5\"",
            "\"evb\", \"dune\" or \"packed\"",
        ],
    );
    assert_err(
        "[sink]\nkind = \"file\"\ndir = \"/tmp/x\"\nhdf5_layout = \"dune\"\n",
        &["sink.hdf5_layout", "only read"],
    );
    assert_err(
        "[sink]\nkind = \"file\"\ndir = \"/tmp/x\"\nhdf5_layout = \"packed\"\n",
        &["sink.hdf5_layout", "only read"],
    );
    // evb config default shows it, and it reads back
    let shown = toml::to_string(&Config::from_toml("").unwrap()).unwrap();
    assert!(shown.contains("hdf5_layout = \"evb\""), "{shown}");
}

#[test]
fn listening_beyond_loopback_needs_a_secret() {
    let open = "[[ru]]\nid = \"r\"\naddr = \"10.1.2.3:7001\"\n";
    if std::env::var("EVB_SECRET").is_err() {
        assert_err(open, &["ru[0].addr", "beyond loopback", "secret"]);
    }
    let c = Config::from_toml(&format!("[run]\nsecret = \"s3cret-6e1f0b7d2a\"\n{open}")).unwrap();
    assert_eq!(c.secret().as_deref(), Some("s3cret-6e1f0b7d2a"));
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

#[test]
fn multipath_is_tcp_only_and_round_trips() {
    let c = Config::from_toml("[transport]\nmultipath = true\n").unwrap();
    assert!(c.transport.multipath);
    assert!(Config::from_toml(&c.to_toml()).unwrap().transport.multipath);
    assert!(!Config::default().to_toml().contains("multipath"));
    assert_err(
        "[transport]\nkind = \"shm\"\nmultipath = true\n",
        &["transport.multipath", "tcp"],
    );
}

/// Every number has a range; a value outside it is refused with the key, the value and the
/// range named (issue #16: `duration_s = 1e20` used to pass and then panic in every node).
#[test]
fn every_number_out_of_range_is_named() {
    let cases: &[(&str, &[&str])] = &[
        (
            "[run]\nduration_s = 1e20\n",
            &["`run.duration_s`", "1e20 is out of range", "0 ..= 604800 s"],
        ),
        ("[run]\nduration_s = 604800.5\n", &["run.duration_s"]),
        ("[run]\nduration_s = nan\n", &["run.duration_s", "NaN"]),
        ("[run]\nduration_s = inf\n", &["run.duration_s", "inf"]),
        ("[run]\nduration_s = -1.0\n", &["run.duration_s"]),
        (
            "[run]\nstall_timeout_s = 1e19\n",
            &["run.stall_timeout_s", "1e19 is out of range"],
        ),
        ("[run]\nstall_timeout_s = 0.0\n", &["run.stall_timeout_s"]),
        ("[run]\nstall_timeout_s = -inf\n", &["run.stall_timeout_s"]),
        (
            "[run]\nconnect_timeout_s = 1e300\n",
            &["run.connect_timeout_s"],
        ),
        (
            "[run]\nconnect_timeout_s = nan\n",
            &["run.connect_timeout_s"],
        ),
        ("[run]\nrate_hz = inf\n", &["run.rate_hz"]),
        ("[run]\nrate_hz = 2e9\n", &["run.rate_hz", "2e9"]),
        ("[run]\nrate_hz = nan\n", &["run.rate_hz"]),
        ("[run]\nevents = 18446744073709551615\n", &[]), // not even a TOML integer
        ("[run]\nevents = 9223372036854775807\n", &["run.events"]),
        ("[run]\nheartbeat_ms = 0\n", &["run.heartbeat_ms"]),
        (
            "[run]\nheartbeat_ms = 86400000\nheartbeat_timeout_ms = 172800000\n",
            &["run.heartbeat_ms"],
        ),
        (
            "[run]\nheartbeat_timeout_ms = 300\n",
            &["run.heartbeat_timeout_ms", "at least twice"],
        ),
        (
            "[run]\nheartbeat_timeout_ms = 9223372036854775807\n",
            &["run.heartbeat_timeout_ms"],
        ),
        (
            "[fragments]\nsize = 268435457\n",
            &["fragments.size", "268435456"],
        ),
        (
            "[fragments]\ndistribution = \"lognormal\"\nstddev = 9223372036854775807\n",
            &["fragments.stddev"],
        ),
        (
            "[fragments]\ndistribution = \"lognormal\"\nmax = 9223372036854775807\n",
            &["fragments.max"],
        ),
        (
            "[builder]\ncredits = 1048577\n",
            &["builder.credits", "1048576"],
        ),
        ("[builder]\ncredits = 4294967295\n", &["builder.credits"]),
        ("[builder]\nbatch = 65537\n", &["builder.batch"]),
        (
            "[buffers]\nblock_size = 2147483648\n",
            &["buffers.block_size"],
        ),
        (
            "[buffers]\nru_pool_mib = 2097152\n",
            &["buffers.ru_pool_mib", "MiB"],
        ),
        (
            "[buffers]\nbu_pool_mib = 17592186044416\n",
            &["buffers.bu_pool_mib"],
        ),
        (
            "[messaging]\npage_size = 134217728\n",
            &["messaging.page_size"],
        ),
        (
            "[messaging]\nflush_us = 9223372036854775807\n",
            &["messaging.flush_us"],
        ),
        (
            "[messaging]\nbusy_poll_us = 2000000\n",
            &["messaging.busy_poll_us"],
        ),
        ("[topology]\nrus = 4097\n", &["topology.rus", "4096"]),
        ("[topology]\nbus = 100000\n", &["topology.bus"]),
        (
            "[topology]\nrus = 100\nbus = 100\nbase_port = 65400\n",
            &["topology.base_port", "65600"],
        ),
        ("[source]\nmax_fragment = 0\n", &["source.max_fragment"]),
        (
            "[source]\nmax_fragment = 268435457\n",
            &["source.max_fragment"],
        ),
        (
            "[sink]\nfile_max_mib = 17592186044416\n",
            &["sink.file_max_mib"],
        ),
        (
            "[sink]\nfile_max_events = 9223372036854775807\n",
            &["sink.file_max_events"],
        ),
        (
            "[[bu]]\nid = \"b\"\ncredits = 4294967295\n",
            &["bu[0].credits", "1048576"],
        ),
        (
            "[[bu]]\nid = \"b\"\nsink_delay_us = 9223372036854775807\n",
            &["bu[0].sink_delay_us"],
        ),
        (
            "[[bu]]\nid = \"b\"\nsink_delay_events = 9223372036854775807\n",
            &["bu[0].sink_delay_events"],
        ),
    ];
    for (text, needles) in cases {
        assert_err(text, needles);
    }
}

#[test]
fn numbers_at_the_edges_of_their_ranges_are_accepted() {
    let c = Config::from_toml(
        "[run]\nduration_s = 604800\nstall_timeout_s = 0.001\nconnect_timeout_s = 604800\n\
         rate_hz = 1e9\nheartbeat_ms = 60000\nheartbeat_timeout_ms = 120000\n\
         events = 1000000000000000\n[builder]\ncredits = 1048576\nbatch = 65536\n\
         [messaging]\nflush_us = 1000000\nbusy_poll_us = 1000000\n\
         [fragments]\nsize = 64\n[topology]\nrus = 1\nbus = 1\n",
    )
    .unwrap();
    assert_eq!(c.run.heartbeat_timeout_ms, 2 * c.run.heartbeat_ms);
    assert_eq!(c.nodes()[2].credits, 1 << 20);
    // the last node takes the last port
    let c = Config::from_toml("[topology]\nrus = 3\nbus = 2\nbase_port = 65530\n").unwrap();
    assert_eq!(c.nodes()[5].addr, "127.0.0.1:65535");
    assert_err(
        "[topology]\nrus = 3\nbus = 2\nbase_port = 65531\n",
        &["topology.base_port", "65536"],
    );
}

/// `topology.rus` is ignored next to `[[ru]]` entries, but it still has a range, and the
/// port check counts the nodes the run really has (it used to add `topology.rus` and
/// overflow).
#[test]
fn base_port_counts_the_real_nodes() {
    let listed = "[[ru]]\nid = \"r\"\n[[bu]]\nid = \"b\"\n";
    assert_err(
        &format!("[topology]\nrus = 4294967295\nbase_port = 1\n{listed}"),
        &["topology.rus"],
    );
    let c = Config::from_toml(&format!(
        "[topology]\nrus = 4000\nbus = 4000\nbase_port = 65533\n{listed}"
    ))
    .unwrap();
    assert_eq!(c.nodes()[2].addr, "127.0.0.1:65535");
}

/// A configuration that validates can be turned into durations, deadlines and pools by
/// every node without a panic (what `evb-node` does with it).
mod safe_when_valid {
    use std::time::{Duration, Instant};

    use proptest::prelude::*;

    use crate::*;

    fn edgy_f64() -> impl Strategy<Value = f64> {
        prop_oneof![
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(f64::MAX),
            Just(1e20),
            Just(-1.0),
            Just(0.0),
            Just(1e-300),
            0.0..1e7,
        ]
    }

    fn edgy_u64() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0),
            Just(1),
            Just(u64::MAX),
            Just(i64::MAX as u64),
            Just(1 << 20),
            Just(1 << 32),
            0u64..10_000_000,
        ]
    }

    fn edgy_u32() -> impl Strategy<Value = u32> {
        prop_oneof![Just(0), Just(u32::MAX), Just(1 << 20), 0u32..5000]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn validated_numbers_never_panic_later(
            secs in proptest::collection::vec(edgy_f64(), 4),
            ints in proptest::collection::vec(edgy_u64(), 14),
            small in proptest::collection::vec(edgy_u32(), 4),
            port: u16,
        ) {
            let mut c = Config::default();
            c.run.duration_s = secs[0];
            c.run.stall_timeout_s = secs[1];
            c.run.connect_timeout_s = secs[2];
            c.run.rate_hz = secs[3];
            c.run.events = ints[0];
            c.run.heartbeat_ms = ints[1];
            c.run.heartbeat_timeout_ms = ints[2];
            c.fragments.size = ints[3];
            c.buffers.block_size = ints[4];
            c.buffers.ru_pool_mib = ints[5];
            c.buffers.bu_pool_mib = ints[6];
            c.messaging.page_size = ints[7];
            c.messaging.flush_us = ints[8];
            c.messaging.busy_poll_us = ints[9];
            c.source.max_fragment = ints[10];
            c.sink.file_max_mib = ints[11];
            c.sink.file_max_events = ints[12];
            c.fragments.content = if ints[13] % 2 == 0 { Content::Unique } else { Content::Static };
            c.builder.credits = small[0];
            c.builder.batch = small[1];
            c.topology.rus = small[2];
            c.topology.bus = small[3];
            c.topology.base_port = port;
            if c.validate().is_ok() {
                let now = Instant::now();
                let r = &c.run;
                let _ = now + Duration::from_secs_f64(r.duration_s);
                let _ = now + Duration::from_secs_f64(r.stall_timeout_s);
                let _ = now + Duration::from_secs_f64(r.connect_timeout_s);
                let _ = now + Duration::from_millis(r.heartbeat_timeout_ms);
                let _ = now + Duration::from_micros(c.messaging.flush_us);
                let _ = now + Duration::from_micros(c.messaging.busy_poll_us);
                prop_assert!(r.heartbeat_timeout_ms >= 2 * r.heartbeat_ms);
                prop_assert!(c.sink.file_max_mib.checked_shl(20).is_some());
                let nodes = c.nodes();
                for n in &nodes {
                    let plan = c.pool_plan(n.role).unwrap();
                    prop_assert!(plan.checked_bytes().is_some());
                    let port: u16 = n.addr.rsplit(':').next().unwrap().parse().unwrap();
                    prop_assert!(c.topology.base_port == 0 || port >= c.topology.base_port);
                }
                c.pool_bytes(&nodes).unwrap();
            }
        }
    }
}

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

#[test]
fn pools_larger_than_the_host_are_refused_naming_the_key() {
    let host = HostMemory {
        total: 8 * GIB,
        available: 6 * GIB,
    };
    // 1 MiB fragments, 2 RUs, 2 BUs of 4096 credits: each BU ~16 GiB
    let big =
        Config::from_toml("[fragments]\nsize = 1048576\n[builder]\ncredits = 4096\n").unwrap();
    let e = big
        .check_memory(&big.nodes(), host)
        .unwrap_err()
        .to_string();
    for needle in [
        "`builder.credits`",
        "more than this host's memory (8.0 GiB)",
        "buffers.bu_pool_mib",
    ] {
        assert!(e.contains(needle), "{e:?} lacks {needle:?}");
    }
    // the default run fits
    let small = Config::default();
    assert_eq!(small.check_memory(&small.nodes(), host), Ok(None));
    // more than is free now, less than there is: a warning
    let need = small.pool_bytes(&small.nodes()).unwrap();
    let tight = HostMemory {
        total: need + MIB,
        available: need - MIB,
    };
    let w = small.check_memory(&small.nodes(), tight).unwrap().unwrap();
    assert!(w.contains("available now"), "{w}");
    // an explicit BU pool that is too large is named
    let explicit = Config::from_toml("[buffers]\nbu_pool_mib = 8192\n").unwrap();
    let e = explicit.check_memory(&explicit.nodes(), host).unwrap_err();
    assert!(
        matches!(&e, ConfigError::Invalid { key, .. } if key == "buffers.bu_pool_mib"),
        "{e}"
    );
    let explicit = Config::from_toml("[buffers]\nru_pool_mib = 8192\n").unwrap();
    let e = explicit.check_memory(&explicit.nodes(), host).unwrap_err();
    assert!(
        matches!(&e, ConfigError::Invalid { key, .. } if key == "buffers.ru_pool_mib"),
        "{e}"
    );
    // only the nodes asked about count: one BU of the big run on a host of its own fits
    let one_bu: Vec<NodeSpec> = big.nodes().into_iter().filter(|n| n.id == "bu0").collect();
    let bu_bytes = big.pool_plan(Role::Bu).unwrap().checked_bytes().unwrap();
    assert_eq!(big.pool_bytes(&one_bu).unwrap(), bu_bytes);
    let roomy = HostMemory {
        total: bu_bytes + GIB,
        available: bu_bytes + GIB,
    };
    assert_eq!(big.check_memory(&one_bu, roomy), Ok(None));
    assert!(big.check_memory(&big.nodes(), roomy).is_err());
}

#[test]
fn pool_plan_adds_up_what_the_nodes_allocate() {
    let c = Config::from_toml(
        "[fragments]\nsize = 1000\n[builder]\ncredits = 10\n[topology]\nrus = 3\nbus = 2\n",
    )
    .unwrap();
    let block = c.buffers.block_size;
    let (ru_need, bu_need) = c.pool_needs().unwrap();
    // 2 × blocks(20 credits × 1064 bytes) + 4 blocks
    assert_eq!(ru_need, 2 * block + 4 * block);
    // 2 × blocks(10 × 3 × 1064) + 2 × (3 + 4) blocks
    assert_eq!(bu_need, 2 * block + 14 * block);
    let small = 4 * 6 + 8;
    assert_eq!(
        c.pool_plan(Role::Evm).unwrap(),
        PoolPlan {
            block_size: block,
            rx_blocks: small,
            fragment_blocks: 0
        }
    );
    assert_eq!(
        c.pool_plan(Role::Ru).unwrap(),
        PoolPlan {
            block_size: block,
            rx_blocks: small,
            fragment_blocks: 6
        }
    );
    assert_eq!(
        c.pool_plan(Role::Bu).unwrap(),
        PoolPlan {
            block_size: block,
            rx_blocks: 16,
            fragment_blocks: 0
        }
    );
    assert_eq!(
        c.pool_bytes(&c.nodes()).unwrap(),
        block * (small + 3 * (small + 6) + 2 * 16)
    );
}

#[test]
fn meminfo_is_read() {
    let text =
        "MemTotal:       16318412 kB\nMemFree:         1000 kB\nMemAvailable:   12000000 kB\n";
    assert_eq!(
        HostMemory::parse(text),
        Some(HostMemory {
            total: 16318412 * 1024,
            available: 12000000 * 1024
        })
    );
    assert_eq!(HostMemory::parse("MemFree: 3 kB\n"), None);
    assert_eq!(HostMemory::parse("MemTotal: lots kB\n"), None);
    // this host has memory, and the default run fits in it
    if let Some(h) = HostMemory::read() {
        assert!(h.total > 0 && h.available <= h.total);
        assert_eq!(Config::default().check_host_memory(), Ok(None));
    }
}

/// The barrel shifter's slot: never over-filled, so it must hold the largest fragment (and
/// holds exactly that unless given); its length given or derived from the link rate, not
/// both.
#[test]
fn barrel_slots_hold_the_largest_fragment_and_have_one_length() {
    let barrel = "[traffic]\nshaping = \"barrel\"\n";
    assert_err(
        &format!("[fragments]\nsize = 65536\n{barrel}slot_bytes = 65575\n"),
        &["traffic.slot_bytes", "65576"],
    );
    Config::from_toml(&format!(
        "[fragments]\nsize = 65536\n{barrel}slot_bytes = 65576\n"
    ))
    .unwrap();
    assert_err(
        &format!("{barrel}slot_us = 500\nlink_mbps = 100\n"),
        &["traffic.slot_us", "not both"],
    );
    // 65,576 bytes at 100 Mb/s: 5,246.08 µs, rounded up
    let c = Config::from_toml(&format!(
        "[fragments]\nsize = 65536\n{barrel}slot_bytes = 65576\nlink_mbps = 100\n"
    ))
    .unwrap();
    assert_eq!(c.slot_us(), 5247);
    assert_eq!(Config::default().slot_us(), 1000);
    // unset, a slot holds exactly the largest fragment with its prefix: 64 KiB fragments
    // fill their slots (a fixed 131,072 held one and 65,496 bytes it could not use), and
    // the default run's 512 KiB fragments are no longer refused under the barrel
    let c = Config::from_toml(&format!(
        "[fragments]\nsize = 65536\n{barrel}link_mbps = 100\n"
    ))
    .unwrap();
    assert_eq!((c.slot_bytes(), c.slot_us()), (65_576, 5247));
    let c = Config::from_toml(barrel).unwrap();
    assert_eq!(c.slot_bytes(), 512 * 1024 + 40);
    // given, it is the operator's, within its range
    assert_err(
        &format!("{barrel}slot_bytes = 1000\n"),
        &["traffic.slot_bytes", "1024"],
    );
}

/// Many nodes on one host at the default credits: the launcher lowers the credits to what
/// three quarters of the available memory holds, and says so; an operator's credits or pool
/// sizes are left alone; a run that fits is not touched.
#[test]
fn default_credits_are_fitted_to_the_host() {
    let gib = 1u64 << 30;
    let host = HostMemory {
        total: 16 * gib,
        available: 15 * gib,
    };
    let big = "[topology]\nrus = 24\nbus = 24\n";
    let mut c = Config::from_toml(big).unwrap();
    let before = c.pool_bytes(&c.local_nodes()).unwrap();
    assert!(
        before > host.available,
        "the test needs a run that does not fit"
    );
    let said = c.fit_credits_to(host).expect("lowered");
    let after = c.pool_bytes(&c.local_nodes()).unwrap();
    assert!(after <= host.available / 4 * 3, "{said}");
    assert!(c.builder.credits >= Config::FIT_MIN_CREDITS && c.builder.credits < 16);
    // one more credit would not have fitted: the most that fit
    let mut more = c.clone();
    more.builder.credits += 1;
    assert!(more.pool_bytes(&more.local_nodes()).unwrap() > host.available / 4 * 3);
    assert!(said.contains("builder.credits lowered to"), "{said}");
    c.validate().unwrap();
    // the operator's word stands
    let mut set = Config::from_toml(&format!("{big}[builder]\ncredits = 16\n")).unwrap();
    assert_eq!(set.fit_credits_to(host), None);
    assert_eq!(set.builder.credits, 16);
    let mut pooled = Config::from_toml(&format!("{big}[buffers]\nru_pool_mib = 512\n")).unwrap();
    assert_eq!(pooled.fit_credits_to(host), None);
    // a run that fits is left as it is
    let mut small = Config::default();
    assert_eq!(small.fit_credits_to(host), None);
    assert_eq!(small.builder.credits, 0);
}

#[test]
fn local_nodes_are_those_with_addresses_here() {
    let c = Config::from_toml(
        "[run]\nsecret = \"test-secret-5f1c0a\"\n[[ru]]\nid = \"here\"\naddr = \"127.0.0.1:7001\"\n\
         [[bu]]\nid = \"there\"\naddr = \"192.0.2.7:7002\"\n",
    )
    .unwrap();
    let ids: Vec<String> = c.local_nodes().into_iter().map(|n| n.id).collect();
    assert_eq!(ids, ["evm", "here"]);
}

/// An explicit pool too small for recorded fragments up to `source.max_fragment` is caught
/// before the run, naming the fragment limit.
#[test]
fn explicit_pools_must_hold_the_largest_recorded_fragment() {
    let files = "[run]\nduration_s = 0\n[[ru]]\nid = \"r\"\nfiles = [\"a\"]\n[[bu]]\nid = \"b\"\ncredits = 4\n";
    let ok = format!(
        "[source]\nkind = \"fed\"\nmax_fragment = 1048576\n[buffers]\nbu_pool_mib = 16\n{files}"
    );
    Config::from_toml(&ok).unwrap();
    assert_err(
        &ok.replace("1048576", "16777216"),
        &["buffers.bu_pool_mib", "source.max_fragment", "16777216"],
    );
}

#[test]
fn stream_sources_are_checked_naming_the_key() {
    let base = r#"
[run]
duration_s = 0
[source]
kind = "stream"
[[ru]]
id = "ru0"
streams = ["127.0.0.1:7301", "127.0.0.1:7302"]
stream_sources = [841, 843]
"#;
    let cfg = Config::from_toml(base).unwrap();
    cfg.validate().unwrap();
    let nodes = cfg.nodes();
    assert_eq!(nodes[1].streams.len(), 2);
    assert_eq!(nodes[1].stream_sources, vec![841, 843]);
    // a super-fragment of two streams: the frame limit and pools follow
    assert_eq!(cfg.max_fragment(), 2 * (1 << 20) + 8 + 32);

    let bad = |edit: &dyn Fn(&str) -> String, key: &str| {
        let text = edit(base);
        let e = Config::from_toml(&text)
            .and_then(|c| c.validate())
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "expected {key} in: {e}");
    };
    bad(
        &|t| t.replace("stream_sources = [841, 843]", ""),
        "ru[0].stream_sources",
    );
    bad(
        &|t| t.replace("[841, 843]", "[841, 841]"),
        "ru[0].stream_sources",
    );
    bad(
        &|t| t.replace("127.0.0.1:7302", "127.0.0.1:0"),
        "ru[0].streams[1]",
    );
    bad(
        &|t| t.replace("127.0.0.1:7302", "127.0.0.1:7301"),
        "ru[0].streams[1]",
    );
    bad(
        &|t| t.replace("127.0.0.1:7302", "localhost"),
        "ru[0].streams[1]",
    );
    bad(
        &|t| {
            t.replace(
                "streams = [\"127.0.0.1:7301\", \"127.0.0.1:7302\"]",
                "streams = []",
            )
        },
        "ru[0].streams",
    );
    bad(
        &|t| {
            t.replace("kind = \"stream\"", "kind = \"stream\"\nloop = true")
                .replace("duration_s = 0", "duration_s = 1")
        },
        "source.loop",
    );
    bad(
        &|t| t.replace("kind = \"stream\"", "kind = \"stream\"\nread_ahead = 0"),
        "source.read_ahead",
    );
    bad(
        &|t| t.replace("kind = \"stream\"", "kind = \"stream\"\nstall_warn_s = nan"),
        "source.stall_warn_s",
    );
    bad(
        &|t| {
            t.replace(
                "kind = \"stream\"",
                "kind = \"stream\"\nmax_fragment = 268435456",
            )
        },
        "source.max_fragment",
    );
    bad(
        &|t| {
            t.replace("kind = \"stream\"", "kind = \"generator\"")
                .replace("duration_s = 0", "duration_s = 1")
        },
        "ru[0].streams",
    );
    // one stream: its source id defaults to the RU's
    let one = base
        .replace(", \"127.0.0.1:7302\"", "")
        .replace("stream_sources = [841, 843]", "source_id = 841");
    let cfg = Config::from_toml(&one).unwrap();
    cfg.validate().unwrap();
    assert_eq!(cfg.nodes()[1].stream_sources, vec![841]);
}

#[test]
fn producer_sources_are_checked_naming_the_key() {
    let base = r#"
[run]
duration_s = 0
[source]
kind = "api"
max_fragment = 4096
[[ru]]
id = "ru0"
producer_sources = [841, 843, 845]
[[ru]]
id = "ru1"
"#;
    let cfg = Config::from_toml(base).unwrap();
    cfg.validate().unwrap();
    assert_eq!(cfg.nodes()[1].stream_sources, vec![841, 843, 845]);
    assert!(cfg.nodes()[2].stream_sources.is_empty());
    // a super-fragment of three producers: the frame limit and pools follow
    assert_eq!(cfg.max_fragment(), 3 * 4096 + 8 + 48);
    for (text, key) in [
        (
            base.replace("[841, 843, 845]", "[841, 843, 841]"),
            "ru[0].producer_sources",
        ),
        (
            base.replace("[841, 843, 845]", "[841]"),
            "ru[0].producer_sources",
        ),
        (
            base.replace("kind = \"api\"", "kind = \"generator\"")
                .replace("duration_s = 0", "duration_s = 1"),
            "ru[0].producer_sources",
        ),
        (
            base.replace("max_fragment = 4096", "max_fragment = 8000000"),
            "source.max_fragment",
        ),
    ] {
        let e = Config::from_toml(&text)
            .and_then(|c| c.validate())
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "expected {key} in: {e}");
    }
}

/// The serve sink's keys: each range-checked, errors naming the key.
#[test]
fn serve_sink_settings_are_checked() {
    let c = Config::from_toml("[sink]\nkind = \"serve\"\nserve_base_port = 7400\n").unwrap();
    assert_eq!(c.serve_addr(1), "127.0.0.1:7401");
    assert_eq!(Config::default().serve_addr(0), "127.0.0.1:0");
    let c = Config::from_toml(
        "[run]\nsecret = \"test-secret-5f1c0a\"\n[sink]\nkind = \"serve\"\n[[bu]]\nid = \"b\"\nserve = \"10.0.0.1:9000\"\n",
    )
    .unwrap();
    assert_eq!(c.serve_addr(0), "10.0.0.1:9000");
    let s = "[sink]\nkind = \"serve\"\n";
    assert_err(
        &format!("{s}serve_max_held = 0\n"),
        &["sink.serve_max_held"],
    );
    assert_err(
        &format!("{s}serve_max_held = 100000\n"),
        &["sink.serve_max_held"],
    );
    assert_err(&format!("{s}serve_hold = 2000000\n"), &["sink.serve_hold"]);
    assert_err(
        &format!("{s}serve_ack_timeout_s = 0.0\n"),
        &["sink.serve_ack_timeout_s"],
    );
    assert_err(
        &format!("{s}serve_ack_timeout_s = nan\n"),
        &["sink.serve_ack_timeout_s"],
    );
    assert_err(
        &format!("{s}serve_drain_timeout_s = -1.0\n"),
        &["sink.serve_drain_timeout_s"],
    );
    assert_err(
        &format!("{s}serve_drain_timeout_s = 20.0\n"),
        &["sink.serve_drain_timeout_s", "run.stall_timeout_s"],
    );
    assert_err(
        &format!("{s}serve_base_port = 65535\n"),
        &["sink.serve_base_port"],
    );
    assert_err(&format!("{s}serve_host = \"\"\n"), &["sink.serve_host"]);
    // a consumer port beyond loopback needs a secret, as every other listener does
    assert_err(
        &format!("{s}serve_host = \"0.0.0.0\"\n"),
        &["sink.serve_host", "beyond loopback", "run.secret"],
    );
    assert_err(
        &format!("{s}[[bu]]\nid = \"b\"\nserve = \"10.0.0.5:9000\"\n"),
        &["bu[0].serve", "beyond loopback"],
    );
    assert!(Config::from_toml(&format!(
        "[run]\nsecret = \"test-secret-5f1c0a\"\n{s}serve_host = \"0.0.0.0\"\n"
    ))
    .is_ok());
    assert_err(
        "[[bu]]\nid = \"b\"\nserve = \"127.0.0.1:9000\"\n",
        &["bu[0].serve", "only read"],
    );
    assert_err(
        &format!("{s}[[bu]]\nid = \"b\"\nserve = \"somewhere\"\n"),
        &["bu[0].serve", "IP:port"],
    );
    assert_err(&format!("{s}serve_holds = 3\n"), &["serve_holds"]);
}

/// `transport.interface`: names, addresses and networks; anything else names the key.
#[test]
fn interface_forms() {
    use crate::Interface;
    assert_eq!(
        Interface::parse("ib0").unwrap(),
        Interface::Name("ib0".into())
    );
    let net = Interface::parse("10.1.0.0/16").unwrap();
    assert!(net.holds("10.1.200.3".parse().unwrap()));
    assert!(!net.holds("10.2.0.1".parse().unwrap()));
    assert!(!net.holds("::1".parse().unwrap()));
    assert!(Interface::parse("0.0.0.0/0")
        .unwrap()
        .holds("192.0.2.1".parse().unwrap()));
    assert!(Interface::parse("fd00::/8")
        .unwrap()
        .holds("fd12::1".parse().unwrap()));
    assert!(Interface::parse("127.0.0.1")
        .unwrap()
        .holds("127.0.0.1".parse().unwrap()));
    for bad in [
        "10.1.0.0/33",
        "10.1/8",
        "eth 0",
        "a-very-long-interface-name",
        "",
    ] {
        assert!(Interface::parse(bad).is_err(), "{bad}");
    }
    let e = Config::from_toml("[transport]\ninterface = \"10.0.0.0/40\"\n").unwrap_err();
    assert!(e.to_string().contains("transport.interface"), "{e}");
}

/// Port 0 marks a node whose address is discovered at start; a learnt address replaces it.
#[test]
fn discovered_addresses() {
    let mut cfg = Config::default();
    let bu1 = cfg.nodes()[4].clone();
    assert!(cfg.is_discovered(&bu1.addr), "{}", bu1.addr);
    cfg.learnt.insert("bu1".into(), "127.0.0.1:4567".into());
    assert_eq!(cfg.nodes()[4].addr, "127.0.0.1:4567");
    assert!(!cfg.is_discovered("127.0.0.1:4567"));
    cfg.transport.kind = crate::TransportKind::Inproc;
    assert!(!cfg.is_discovered("127.0.0.1:0"));
}

#[test]
fn stream_allow_list_is_checked_naming_the_key() {
    let base = r#"
[run]
duration_s = 0
[source]
kind = "stream"
[[ru]]
id = "ru0"
streams = ["127.0.0.1:7301"]
"#;
    let check = |text: &str| Config::from_toml(text).and_then(|c| c.validate().map(|()| c));
    // unset on loopback: loopback only
    let cfg = check(base).unwrap();
    let allow = cfg.source.stream_allow();
    let ok = |ip: &str| allow.iter().any(|n| n.contains(ip.parse().unwrap()));
    assert!(ok("127.0.0.1") && ok("127.0.0.2") && ok("::1") && ok("::ffff:127.0.0.1"));
    assert!(!ok("10.0.0.7") && !ok("192.168.1.1") && !ok("::2"));
    // a listener beyond loopback needs the list, and the error names the key and the stream
    for addr in ["10.0.0.11:7301", "0.0.0.0:7301", "[::]:7301"] {
        let e = check(&base.replace("127.0.0.1:7301", addr))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("source.allow_from") && e.contains("ru[0].streams[0]"),
            "{e}"
        );
    }
    let with = |list: &str| {
        base.replace("127.0.0.1:7301", "10.0.0.11:7301").replace(
            "kind = \"stream\"",
            &format!("kind = \"stream\"\nallow_from = {list}"),
        )
    };
    let cfg = check(&with("[\"10.0.0.0/24\", \"192.168.1.9\", \"fd00::/8\"]")).unwrap();
    let allow = cfg.source.stream_allow();
    let ok = |ip: &str| allow.iter().any(|n| n.contains(ip.parse().unwrap()));
    assert!(ok("10.0.0.7") && ok("::ffff:10.0.0.200") && ok("192.168.1.9") && ok("fd12::1"));
    assert!(!ok("10.0.1.7") && !ok("192.168.1.10") && !ok("127.0.0.1") && !ok("fe80::1"));
    assert_eq!(allow[0].to_string(), "10.0.0.0/24");
    assert_eq!(allow[1].to_string(), "192.168.1.9");
    // "0.0.0.0/0" is every IPv4 address, said explicitly
    let cfg = check(&with("[\"0.0.0.0/0\"]")).unwrap();
    assert!(cfg.source.stream_allow()[0].contains("203.0.113.5".parse().unwrap()));
    for (list, key) in [
        ("[]", "source.allow_from"),
        ("[\"10.0.0.0/33\"]", "source.allow_from[0]"),
        ("[\"10.0.0.1\", \"ten\"]", "source.allow_from[1]"),
        ("[\"::1/129\"]", "source.allow_from[0]"),
    ] {
        let e = check(&with(list)).unwrap_err().to_string();
        assert!(e.contains(key), "{list}: {e}");
    }
    // only for streams
    let e = check("[run]\nduration_s = 1\n[source]\nallow_from = [\"127.0.0.1\"]\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("source.allow_from"), "{e}");
    // and it survives a round trip through TOML
    let cfg = check(&with("[\"10.0.0.0/24\"]")).unwrap();
    assert_eq!(Config::from_toml(&cfg.to_toml()).unwrap(), cfg);
}

#[test]
fn a_standby_is_checked() {
    let ok = Config::from_toml("[evm]\nstandby = \"127.0.0.1:0\"\n").unwrap();
    assert_eq!(ok.evm.standby, "127.0.0.1:0");
    assert_err(
        "[evm]\nstandby = \"here\"\n",
        &["evm.standby", "not an IP:port"],
    );
    assert_err(
        "[evm]\nstandby_control = \"127.0.0.1:0\"\n",
        &["evm.standby_control", "set evm.standby too"],
    );
    // RUs fed live take a standby too (they announce what they hold to the new EVM)
    assert!(Config::from_toml(
        "[evm]\nstandby = \"127.0.0.1:0\"\n[source]\nkind = \"api\"\nmax_fragment = 1024\n"
    )
    .is_ok());
}

/// `evb up --standby`: once the standby controls, its addresses are the EVM's and no
/// standby is left; against that, the old EVM's configuration needs a restart (a node
/// refuses a run from it: the old EVM is fenced).
#[test]
fn a_promoted_standby_is_the_evm_and_the_old_evm_is_refused() {
    let cfg = Config::from_toml(
        "[evm]\naddr = \"127.0.0.1:7000\"\ncontrol = \"127.0.0.1:7001\"\n\
         standby = \"127.0.0.1:7100\"\nstandby_control = \"127.0.0.1:7101\"\n",
    )
    .unwrap();
    let p = cfg.with_standby_promoted().unwrap();
    assert_eq!(p.evm.addr, "127.0.0.1:7100");
    assert_eq!(p.evm.control, "127.0.0.1:7101");
    // the roles swap: the old EVM's addresses are the next standby's
    assert_eq!(p.evm.standby, "127.0.0.1:7000");
    assert_eq!(p.evm.standby_control, "127.0.0.1:7001");
    assert_eq!(p.evm.control_epoch, 1);
    p.validate().unwrap();
    // a standby's own copy (`evb node --standby`: the standby's addresses as its own, the
    // EVM followed) promotes to the same
    let mut own = cfg.clone();
    own.evm.follow = "127.0.0.1:7000".into();
    own.evm.follow_control = "127.0.0.1:7001".into();
    own.evm.addr = own.evm.standby.clone();
    own.evm.control = own.standby_control();
    assert_eq!(own.with_standby_promoted().unwrap().evm, p.evm);
    let keys = p.restart_needed(&cfg);
    assert!(keys.contains(&"evm.addr".to_string()), "{keys:?}");
    assert!(keys.contains(&"evm.control".to_string()), "{keys:?}");
    assert!(p.restart_needed(&p.clone()).is_empty());
    // two swaps: the first EVM's addresses again, and still the old one is refused, by
    // the epoch (a run from it cannot pass for one of the promoted control's)
    let pp = p.with_standby_promoted().unwrap();
    assert_eq!(pp.evm.addr, "127.0.0.1:7000");
    assert_eq!(pp.evm.control_epoch, 2);
    assert_eq!(pp.restart_needed(&cfg), ["evm.control_epoch"]);
    // it travels in the configuration a run is started with
    let back = Config::from_toml(&pp.to_toml()).unwrap();
    assert_eq!(back.evm.control_epoch, 2);
    // a node's own configuration follows one takeover or two at once (a run saw both), and
    // never back: a run from an old EVM is not adopted, and differs by the epoch
    assert_eq!(cfg.promoted_to(&p).map(|c| c.evm), Some(p.evm.clone()));
    assert_eq!(cfg.promoted_to(&pp).map(|c| c.evm), Some(pp.evm.clone()));
    assert!(pp.promoted_to(&cfg).is_none() && p.promoted_to(&cfg).is_none());
    assert!(!pp.restart_needed(&cfg).is_empty());
    // a run of a higher epoch that names another system is not adopted either
    let mut other = pp.clone();
    other.run.secret = "another-secret-0123456789".into();
    assert!(cfg.promoted_to(&other).is_none());
    assert!(Config::default().with_standby_promoted().is_none());
}

/// A stream-fed run at the default `source.max_fragment` (1 MiB) gets the fewest credits
/// and is told why; a bound near the fragments' size, or credits set, says nothing.
#[test]
fn live_sources_hear_when_max_fragment_shrinks_the_credits() {
    let streams = "[run]\nduration_s = 0\n[source]\nkind = \"stream\"\n\
                   [[ru]]\nid = \"ru0\"\nstreams = [\"127.0.0.1:7301\"]\n\
                   [[ru]]\nid = \"ru1\"\nstreams = [\"127.0.0.1:7302\"]\n\
                   [[bu]]\nid = \"bu0\"\n";
    let c = Config::from_toml(streams).unwrap();
    c.validate().unwrap();
    assert_eq!(c.default_credits(), 16);
    let said = c.live_credits_notice().expect("said");
    assert!(said.contains("source.max_fragment = 1048576"), "{said}");
    let bounded = streams.replace(
        "kind = \"stream\"\n",
        "kind = \"stream\"\nmax_fragment = 32768\n",
    );
    let c = Config::from_toml(&bounded).unwrap();
    assert!(c.default_credits() > 200, "{}", c.default_credits());
    assert_eq!(c.live_credits_notice(), None);
    let set = format!("{streams}[builder]\ncredits = 16\n");
    assert_eq!(Config::from_toml(&set).unwrap().live_credits_notice(), None);
    // the generator's credits follow its own fragment sizes: nothing to say
    assert_eq!(Config::default().live_credits_notice(), None);
    // a run built by time (docs/operations/streaming.md's live.toml): records at the slices'
    // pace, nothing to say either (its recipe warned about its own credits)
    let slices = streams.replace(
        "[source]\nkind = \"stream\"\n",
        "[builder]\nby = \"time\"\nslice_ticks = 1000000\n[frames]\nticks = 10000\n\
         [source]\nkind = \"stream\"\nformat = \"frames\"\nmax_fragment = 16384\n",
    );
    let c = Config::from_toml(&slices).unwrap();
    c.validate().unwrap();
    assert_eq!(c.default_credits(), 16);
    assert_eq!(c.live_credits_notice(), None);
}

/// Output files of a run with a secret are its user's alone (or its group's too); the
/// group switch without a secret would do nothing, so it is refused.
#[test]
fn output_files_are_private_with_a_secret() {
    if std::env::var("EVB_SECRET").is_ok_and(|s| !s.is_empty()) {
        return; // the environment's secret would be in force
    }
    let plain = Config::from_toml("[sink]\nkind = \"file\"\ndir = \"/tmp/x\"\n").unwrap();
    assert_eq!(plain.output_file_mode(), 0o666);
    let private = Config::from_toml(
        "[run]\nsecret = \"s3cret-s3cret-0042\"\n[sink]\nkind = \"file\"\ndir = \"/tmp/x\"\n",
    )
    .unwrap();
    assert_eq!(private.output_file_mode(), 0o600);
    let group = Config::from_toml(
        "[run]\nsecret = \"s3cret-s3cret-0042\"\n[sink]\nkind = \"file\"\ndir = \"/tmp/x\"\nfile_group_read = true\n",
    )
    .unwrap();
    assert_eq!(group.output_file_mode(), 0o640);
    assert_err(
        "[sink]\nkind = \"file\"\ndir = \"/tmp/x\"\nfile_group_read = true\n",
        &["sink.file_group_read", "run.secret"],
    );
}

/// A short or repetitive secret is refused, naming the key and how to make a strong one.
#[test]
fn a_weak_secret_is_refused() {
    if std::env::var("EVB_SECRET").is_ok_and(|s| !s.is_empty()) {
        return; // the environment's secret would be in force
    }
    assert_err(
        "[run]\nsecret = \"door key\"\n",
        &["run.secret", "8 characters", "evb config secret"],
    );
    assert_err(
        "[run]\nsecret = \"abababababababababab\"\n",
        &["run.secret", "2 different characters"],
    );
    assert!(Config::from_toml("[run]\nsecret = \"door-key-0f3a9c2e\"\n").is_ok());
    assert_eq!(weak_secret(&"0123456789abcdef".repeat(4)), None);
}

/// Building by time: its keys are refused where they would do nothing (a run by event), the
/// event keys where they would do nothing (a run by time), and a slicing whose window
/// fragment could not travel; each error names its key.
#[test]
fn building_by_time_refuses_what_would_not_do_what_it_says() {
    let time = "[builder]\nby = \"time\"\n";
    let c = Config::from_toml(time).unwrap();
    assert!(c.by_time());
    // default slicing: 101 frames of 1024 bytes, headers and directory
    assert_eq!(c.max_window_frames(), 102);
    assert_eq!(c.max_fragment(), 102 * (1024 + 32) + 32);
    assert_err(
        "[frames]\nticks = 5\n",
        &["`frames`", "builder.by = \"time\""],
    );
    assert_err("[builder]\nslice_ticks = 5\n", &["builder.slice_ticks"]);
    assert_err("[builder]\noverlap_ticks = 5\n", &["builder.overlap_ticks"]);
    assert_err(
        &format!("{time}[fragments]\nsize = 100\n"),
        &["`fragments`", "[frames]"],
    );
    assert_err(
        &format!("{time}[source]\nkind = \"fed\"\n"),
        &["builder.by", "generator", "stream", "api"],
    );
    assert_err(
        &format!("{time}overlap_ticks = 200000\n"),
        &["builder.overlap_ticks", "slice_ticks"],
    );
    assert_err(
        &format!("{time}slice_ticks = 0\n"),
        &["builder.slice_ticks"],
    );
    assert_err(&format!("{time}[frames]\nticks = 0\n"), &["frames.ticks"]);
    assert_err(
        &format!("{time}slice_ticks = 10000000\n[frames]\nticks = 1\n"),
        &["builder.slice_ticks", "frames"],
    );
    assert_err(
        &format!("{time}[frames]\nsize = 10000000\n"),
        &["frames.size", "bytes"],
    );
    assert_err(
        &format!("{time}[frames]\nmin = 5\n"),
        &["frames.min", "lognormal"],
    );
    Config::from_toml(&format!(
        "{time}slice_ticks = 5000\noverlap_ticks = 5000\n[frames]\nticks = 7\nsize = 30\n\
         distribution = \"lognormal\"\nmax = 200\n"
    ))
    .unwrap();
}

/// Decision windows: `[windows]` only where it does something, a trigger rate required (the
/// decisions come at it), the delays in order, a window of at least a tick, bounded waits.
#[test]
fn building_by_windows_refuses_what_would_not_do_what_it_says() {
    let win = "[run]\nrate_hz = 1000\n[builder]\nby = \"window\"\n";
    let c = Config::from_toml(win).unwrap();
    assert!(c.by_time());
    // 62500 ticks of 1000-tick frames, two more for the ends
    assert_eq!(c.max_window_frames(), 65);
    assert_err(
        "[windows]\nwait_ms = 5\n",
        &["`windows`", "builder.by = \"window\""],
    );
    assert_err(
        "[builder]\nby = \"time\"\n[windows]\nwait_ms = 5\n",
        &["`windows`"],
    );
    assert_err(
        &format!("{win}slice_ticks = 7\n"),
        &["builder.slice_ticks", "\"time\""],
    );
    assert_err(
        "[builder]\nby = \"window\"\n",
        &["run.rate_hz", "decisions"],
    );
    assert_err(
        &format!("{win}[windows]\ndelay_min_ticks = 5\ndelay_max_ticks = 4\n"),
        &["windows.delay_max_ticks"],
    );
    assert_err(
        &format!("{win}[windows]\nbefore_ticks = 0\nafter_ticks = 0\n"),
        &["windows.after_ticks", "one tick"],
    );
    assert_err(
        &format!("{win}[windows]\nwait_ms = 10001\n"),
        &["windows.wait_ms"],
    );
    assert_err(
        &format!("{win}[windows]\nbuffer_ms = 0\n"),
        &["windows.buffer_ms"],
    );
    assert_err(
        &format!("{win}[windows]\ntick_hz = 0\n"),
        &["windows.tick_hz"],
    );
    assert_err(
        &format!("{win}[windows]\ndelay_min_ticks = -2000000000000\n"),
        &["windows.delay_min_ticks"],
    );
    Config::from_toml(&format!(
        "{win}[windows]\ndelay_min_ticks = -500\ndelay_max_ticks = 90000\nbuffer_ms = 50\n"
    ))
    .unwrap();
    // decisions from a file give every window: the seeded windows' keys do nothing then
    let listed = "[run]\nevents = 10\nrate_hz = 1000\n[builder]\nby = \"window\"\n";
    assert_err(
        &format!("{listed}[windows]\ndecisions = \"d.txt\"\nbefore_ticks = 7\n"),
        &["windows.before_ticks", "windows.decisions"],
    );
    assert_err(
        &format!("{listed}[windows]\ndecisions = \"d.txt\"\ndelay_max_ticks = 7\n"),
        &["windows.delay_max_ticks"],
    );
    assert_err(
        "[run]\nduration_s = 5\nrate_hz = 1000\n[builder]\nby = \"window\"\n\
         [windows]\ndecisions = \"d.txt\"\n",
        &["run.events", "windows.decisions"],
    );
    Config::from_toml(&format!("{listed}[windows]\ndecisions = \"d.txt\"\n")).unwrap();
}

/// Time slices from front-end streams of frames: one or several streams per RU, frames only, bad frames
/// stop the run, no decision windows yet; `frames` refused in a run by event. The largest
/// slice follows `source.max_fragment`, the longest frame the stream may carry.
#[test]
fn slices_from_streams_of_frames_refuse_what_would_not_do_what_it_says() {
    let base = "[builder]\nby = \"time\"\n[source]\nkind = \"stream\"\nformat = \"frames\"\n\
                max_fragment = 4096\n[[ru]]\nid = \"ru0\"\nstreams = [\"127.0.0.1:7301\"]\n";
    let c = Config::from_toml(base).unwrap();
    c.validate().unwrap();
    assert_eq!(c.max_fragment(), 102 * (4096 + 8) + 32);
    let bad = |text: String, want: &[&str]| {
        let e = Config::from_toml(&text)
            .and_then(|c| c.validate())
            .unwrap_err()
            .to_string();
        assert!(
            want.iter().all(|w| e.contains(w)),
            "expected {want:?} in: {e}"
        );
    };
    bad(
        base.replace("format = \"frames\"\n", ""),
        &["source.format", "\"frames\""],
    );
    bad(
        base.replace("by = \"time\"", "by = \"event\""),
        &["source.format", "builder.by = \"time\""],
    );
    // decision windows over the stream: the windows' keys apply
    let windows = base.replace("by = \"time\"", "by = \"window\"\n[run]\nrate_hz = 10");
    Config::from_toml(&windows).unwrap().validate().unwrap();
    // the run's first tick: on the frames' grid
    Config::from_toml(&format!(
        "{windows}[frames]\nticks = 1000\nfirst_tick = 5000000\n"
    ))
    .unwrap()
    .validate()
    .unwrap();
    bad(
        format!("{windows}[frames]\nticks = 1000\nfirst_tick = 5000001\n"),
        &["frames.first_tick", "multiple of frames.ticks"],
    );
    // a bound in bytes on the latency buffer: at least one frame (4096 + 24), and only
    // for live frames (the generator's are made when asked for)
    Config::from_toml(&format!("{windows}[windows]\nbuffer_bytes = 4120\n"))
        .unwrap()
        .validate()
        .unwrap();
    bad(
        format!("{windows}[windows]\nbuffer_bytes = 4119\n"),
        &["windows.buffer_bytes", "4120"],
    );
    bad(
        format!(
            "{}[windows]\nbuffer_bytes = 1000000\n",
            windows.replace("kind = \"stream\"", "kind = \"generator\"")
        ),
        &["windows.buffer_bytes", "generator"],
    );
    bad(
        base.replace(
            "streams = [\"127.0.0.1:7301\"]",
            "streams = [\"127.0.0.1:7301\"]\nstream_sources = [5]",
        ),
        &["ru[0].stream_sources", "source_id"],
    );
    bad(
        base.replace(
            "kind = \"stream\"",
            "kind = \"stream\"\non_error = \"drop\"",
        ),
        &["source.on_error", "hole"],
    );
    bad(
        base.replace(
            "kind = \"stream\"",
            "kind = \"stream\"\non_sync_loss = \"flag\"",
        ),
        &["source.on_sync_loss"],
    );
    // several streams into one RU: each its own source, the fragment a super-fragment of
    // their window fragments
    let two = base.replace(
        "streams = [\"127.0.0.1:7301\"]",
        "streams = [\"127.0.0.1:7301\", \"127.0.0.1:7302\"]\nstream_sources = [1, 2]",
    );
    let c = Config::from_toml(&two).unwrap();
    c.validate().unwrap();
    assert_eq!(c.max_fragment(), 2 * (102 * (4096 + 8) + 32) + 8 + 32);
    bad(
        two.replace("stream_sources = [1, 2]", "stream_sources = [1]"),
        &["ru[0].stream_sources"],
    );
    bad(
        base.replace("max_fragment = 4096", "max_fragment = 10000000"),
        &["source.max_fragment", "bytes"],
    );
}

/// Decisions from outside: each carries its window, so the seeded windows' keys and a file
/// of decisions are refused as doing nothing; the longest window must be said (it bounds
/// the fragments), and only applies with `outside`; the decisions pace the run.
#[test]
fn decisions_from_outside_refuse_what_would_do_nothing() {
    let base = "[run]\nevents = 10\n[builder]\nby = \"window\"\n[windows]\noutside = true\n";
    let c = Config::from_toml(&format!("{base}longest_ticks = 62500\n")).unwrap();
    c.validate().unwrap();
    // 62500 ticks of 1000-tick frames, two more for the ends
    assert_eq!(c.max_window_frames(), 65);
    assert_err(base, &["windows.longest_ticks"]);
    for (key, line) in [
        ("windows.decisions", "decisions = \"d.txt\""),
        ("windows.before_ticks", "before_ticks = 5"),
        ("windows.after_ticks", "after_ticks = 5"),
        ("windows.delay_min_ticks", "delay_min_ticks = -5"),
        ("windows.delay_max_ticks", "delay_max_ticks = 5"),
    ] {
        assert_err(
            &format!("{base}longest_ticks = 100\n{line}\n"),
            &[key, "each decision carries its window"],
        );
    }
    assert_err(
        "[run]\nrate_hz = 10\n[builder]\nby = \"window\"\n[windows]\nlongest_ticks = 100\n",
        &["windows.longest_ticks", "windows.outside"],
    );
}

#[test]
fn run_folders_come_from_placeholders_only() {
    let mut cfg = Config::default();
    assert_eq!(cfg.run_folder("x", 3), None);
    cfg.sink.dir = "/data/out".into();
    assert_eq!(cfg.run_folder("x", 3), None);
    cfg.sink.dir = "/data/{run_id}/{run}".into();
    assert_eq!(
        cfg.run_folder("cms/../p2 #1", 42).as_deref(),
        Some("/data/cms_.._p2__1/000042")
    );
    assert_eq!(crate::safe_file_name(".."), "___");
    assert_eq!(crate::safe_file_name(""), "_");
}

/// Spare BUs (issue 69 item 1): made after the counted BUs, or marked in `[[bu]]`; the run
/// needs one BU that is not a spare, and a spare is refused where a joining BU is not
/// followed (a barrel cycle, a standby EVM), naming the key.
#[test]
fn spare_bus_are_made_after_the_others_and_refused_where_they_cannot_join() {
    let c = Config::from_toml("[topology]\nbus = 2\nspare_bus = 2\n").unwrap();
    let bus: Vec<(String, bool)> = c
        .nodes()
        .into_iter()
        .filter(|n| n.role == Role::Bu)
        .map(|n| (n.id, n.spare))
        .collect();
    assert_eq!(
        bus,
        [
            ("bu0".to_string(), false),
            ("bu1".to_string(), false),
            ("bu2".to_string(), true),
            ("bu3".to_string(), true)
        ]
    );
    let listed =
        Config::from_toml("[[bu]]\nid = \"a\"\n[[bu]]\nid = \"b\"\nspare = true\n").unwrap();
    assert_eq!(listed.nodes().iter().filter(|n| n.spare).count(), 1);
    // a spare's mark is a node's identity: changing it needs the nodes restarted
    assert!(c
        .restart_needed(&Config::from_toml("[topology]\nbus = 3\nspare_bus = 1\n").unwrap())
        .iter()
        .any(|k| k.ends_with(".spare")));
    assert_err(
        "[[bu]]\nid = \"a\"\nspare = true\n",
        &["bu.spare", "every BU is a spare"],
    );
    assert_err(
        "[topology]\nspare_bus = 1\n[[bu]]\nid = \"a\"\n",
        &["topology.spare_bus", "[[bu]]"],
    );
    assert_err(
        "[topology]\nspare_bus = 1\n[traffic]\nshaping = \"barrel\"\n",
        &["topology.spare_bus", "barrel"],
    );
    assert_err(
        "[topology]\nspare_bus = 1\n[evm]\nstandby = \"127.0.0.1:7999\"\n",
        &["topology.spare_bus", "standby"],
    );
    assert_err("[topology]\nspare_bus = 5000\n", &["topology.spare_bus"]);
}

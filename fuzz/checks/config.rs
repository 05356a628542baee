//! The `config` fuzz target: configuration files. Shared by `fuzz_targets/config.rs`
//! (cargo-fuzz) and the stable replay test `crates/config/tests/fuzz_replay.rs`.

use evb_config::{Config, HostMemory, DEFAULT_TOML};

/// A configuration is refused, or it validates and everything the nodes compute from it
/// (nodes, pools, the memory check, the TOML round trip) works without a panic.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = Config::from_toml(text) else {
        return;
    };
    let nodes = cfg.nodes();
    cfg.pool_needs().unwrap();
    for n in &nodes {
        let plan = cfg.pool_plan(n.role).unwrap();
        assert!(plan.checked_bytes().is_some());
    }
    let total = cfg.pool_bytes(&nodes).unwrap();
    let host = HostMemory {
        total: total / 2 + 1,
        available: total / 4,
    };
    assert!(cfg.check_memory(&nodes, host).is_err() || total < 2);
    let _ = cfg.local_nodes();
    assert_eq!(Config::from_toml(&cfg.to_toml()).unwrap(), cfg);
}

/// Valid configurations.
pub fn seeds() -> Vec<Vec<u8>> {
    [
        DEFAULT_TOML,
        "",
        "[run]\nevents = 1000\nduration_s = 0\nrate_hz = 5e3\n[topology]\nrus = 8\nbus = 3\nbase_port = 9000\n",
        "[fragments]\nsize = 1000\ndistribution = \"lognormal\"\nmax = 9000\ncontent = \"static\"\n[builder]\ncredits = 64\nbatch = 4\n",
        "[run]\nsecret = \"test-secret-5f1c0a\"\n[evm]\naddr = \"127.0.0.1:7000\"\n[[ru]]\nid = \"ru-a\"\naddr = \"10.0.0.1:7001\"\nsource_id = 841\n[[bu]]\nid = \"bu-a\"\naddr = \"127.0.0.1:7002\"\ncredits = 4\nsink = \"count\"\n[affinity]\nevm = [0]\n",
        "[run]\nduration_s = 0\n[source]\nkind = \"fed\"\nmax_fragment = 4194304\n[buffers]\nbu_pool_mib = 600\n[[ru]]\nid = \"r\"\nfiles = [\"a.raw\"]\n[[bu]]\nid = \"b\"\ncredits = 8\n",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

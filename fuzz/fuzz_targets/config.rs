//! Configuration files.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(cfg) = evb_config::Config::from_toml(text) {
            let _ = cfg.nodes();
            let _ = cfg.pool_needs();
            for n in cfg.nodes() {
                let _ = cfg.pool_plan(n.role);
            }
        }
    }
});

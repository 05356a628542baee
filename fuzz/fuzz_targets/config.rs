//! cargo-fuzz target: see fuzz/checks/config.rs (also replayed on stable by
//! crates/config/tests/fuzz_replay.rs).
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "../checks/config.rs"]
#[allow(dead_code)] // seeds() is for the stable replay
mod checks;

fuzz_target!(|data: &[u8]| checks::check(data));

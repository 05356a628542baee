//! cargo-fuzz target: see fuzz/checks/shm.rs (also replayed on stable by
//! crates/transport/tests/fuzz_replay.rs).
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "../checks/shm.rs"]
#[allow(dead_code)] // seeds() is for the stable replay
mod checks;

fuzz_target!(|data: &[u8]| checks::check(data));

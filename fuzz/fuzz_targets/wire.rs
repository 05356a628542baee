//! cargo-fuzz target: see fuzz/checks/wire.rs (also replayed on stable by
//! crates/wire/tests/fuzz_replay.rs).
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "../checks/wire.rs"]
#[allow(dead_code)] // seeds() is for the stable replay
mod checks;

fuzz_target!(|data: &[u8]| checks::check(data));

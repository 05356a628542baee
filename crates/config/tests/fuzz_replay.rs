//! The `config` fuzz target's checks on stable Rust: its checked-in seeds and fixed crashes
//! (fuzz/seeds/config, fuzz/regressions/config), the seeds made in code and damaged
//! copies of them. The coverage-guided fuzzing itself needs nightly: scripts/fuzz.sh.

#[path = "../../../fuzz/checks/config.rs"]
mod config;
#[path = "../../../fuzz/checks/replay.rs"]
mod replay;

#[test]
fn config_fuzz_corpus_and_damaged_valid_inputs() {
    let seeds = config::seeds();
    let n = replay::run("config", config::check, &seeds, 1500);
    assert!(n >= seeds.len() * (1500 + 1), "{n} inputs checked");
}

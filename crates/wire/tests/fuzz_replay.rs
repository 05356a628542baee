//! The `wire` fuzz target's checks on stable Rust: its checked-in seeds and fixed crashes
//! (fuzz/seeds/wire, fuzz/regressions/wire), the seeds made in code and damaged
//! copies of them. The coverage-guided fuzzing itself needs nightly: scripts/fuzz.sh.

#[path = "../../../fuzz/checks/replay.rs"]
mod replay;
#[path = "../../../fuzz/checks/wire.rs"]
mod wire;

#[test]
fn wire_fuzz_corpus_and_damaged_valid_inputs() {
    let seeds = wire::seeds();
    let n = replay::run("wire", wire::check, &seeds, 3000);
    assert!(n >= seeds.len() * (3000 + 1), "{n} inputs checked");
}

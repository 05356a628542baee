//! The `shm` fuzz target's checks on stable Rust: its checked-in seeds and fixed crashes
//! (fuzz/seeds/shm, fuzz/regressions/shm), the seeds made in code and damaged copies of
//! them. The coverage-guided fuzzing itself needs nightly: scripts/fuzz.sh.

#[path = "../../../fuzz/checks/replay.rs"]
mod replay;
#[path = "../../../fuzz/checks/shm.rs"]
mod shm;

#[test]
fn shm_packet_fuzz_corpus_and_damaged_valid_inputs() {
    let seeds = shm::seeds();
    let n = replay::run("shm", shm::check, &seeds, 4000);
    assert!(n >= seeds.len() * (4000 + 1), "{n} inputs checked");
}

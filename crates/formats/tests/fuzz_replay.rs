//! The `files` fuzz target's checks on stable Rust: its checked-in seeds and fixed crashes
//! (fuzz/seeds/files, fuzz/regressions/files), the seeds made in code and damaged
//! copies of them. The coverage-guided fuzzing itself needs nightly: scripts/fuzz.sh.

#[path = "../../../fuzz/checks/files.rs"]
mod files;
#[path = "../../../fuzz/checks/replay.rs"]
mod replay;

#[test]
fn files_fuzz_corpus_and_damaged_valid_inputs() {
    let seeds = files::seeds();
    let n = replay::run("files", files::check, &seeds, 2000);
    assert!(n >= seeds.len() * (2000 + 1), "{n} inputs checked");
}

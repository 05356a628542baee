//! The `page` fuzz target's checks on stable Rust: its checked-in seeds and fixed crashes
//! (fuzz/seeds/page, fuzz/regressions/page), the seeds made in code and damaged
//! copies of them. The coverage-guided fuzzing itself needs nightly: scripts/fuzz.sh.

#[path = "../../../fuzz/checks/page.rs"]
mod page;
#[path = "../../../fuzz/checks/replay.rs"]
mod replay;

#[test]
fn page_fuzz_corpus_and_damaged_valid_inputs() {
    let seeds = page::seeds();
    let n = replay::run("page", page::check, &seeds, 2000);
    assert!(n >= seeds.len() * (2000 + 1), "{n} inputs checked");
}

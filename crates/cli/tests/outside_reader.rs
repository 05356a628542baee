//! A reader written from docs/formats.md alone (`tests/outside/check_evb.py`, Python) checks
//! a run's built-event files: every header and CRC, and every generated payload byte by byte
//! with the run's seed (docs/formats.md §5), so that an outsider can check content, not
//! only structure.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const EVENTS: u64 = 1500;

/// `evb run` of `EVENTS` events with the file sink and `fragments`; returns the output folder
/// (kept alive by the returned guard).
fn run_with(fragments: &str, seed: u64) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = common::out_dir();
    let out = dir.path().join("out");
    let base = common::free_base_port(12);
    let toml = format!(
        "[run]\nid = \"reader\"\nevents = {EVENTS}\nduration_s = 0\nseed = {seed}\n\
         [topology]\nrus = 2\nbus = 2\nbase_port = {base}\n[control]\nbase_port = {}\n\
         [fragments]\n{fragments}\n[sink]\nkind = \"file\"\ndir = \"{}\"\nfile_max_events = 400\n",
        base + 6,
        out.display()
    );
    let (o, _) = common::evb_run_in(dir.path(), &toml);
    assert!(o.status.success(), "{}", common::text(&o));
    (dir, out)
}

/// The outside reader's verdict on `dir` read with `seed`.
fn check(dir: &Path, seed: u64, static_content: bool) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/outside/check_evb.py");
    let mut c = Command::new("python3");
    c.arg(&script).arg(dir).args(["--seed", &seed.to_string()]);
    if static_content {
        c.arg("--static");
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn outside_reader_checks_every_generated_byte() {
    if !Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        evb_buffers::skips::skipped("outside reader", "python3 is not installed");
        return;
    }
    // fixed sizes, unique content, the default seed
    let (_keep, out) = run_with("size = 256", 1);
    let r = check(&out, 1, false);
    assert_eq!(r["events"], EVENTS, "{r}");
    assert_eq!(r["ids"], EVENTS, "{r}");
    assert_eq!(r["problems"], 0, "{r}");
    // the same files read with another seed: every fragment's bytes are wrong, and only
    // the byte check says so (the CRCs hold)
    let r = check(&out, 2, false);
    assert_eq!(r["problems"], 2 * EVENTS, "{r}");
    assert!(
        r["first_problems"][0]
            .as_str()
            .is_some_and(|p| p.contains("payload bytes")),
        "{r}"
    );
    // log-normal sizes, static content, a large seed (TOML integers stop at 2^63)
    let seed = 0x7eed_5eed_0123_4567;
    let (_keep, out) = run_with(
        "size = 300\ndistribution = \"lognormal\"\nstddev = 120\ncontent = \"static\"",
        seed,
    );
    let r = check(&out, seed, true);
    assert_eq!(r["events"], EVENTS, "{r}");
    assert_eq!(r["ids"], EVENTS, "{r}");
    assert_eq!(r["problems"], 0, "{r}");
}

//! Triggered readout windows through `evb run` (issue 54, DUNE-like): trigger decisions at
//! 1 kHz ask every RU for a window of its continuous frames, some reaching back past the
//! RUs' latency buffers (MISSING), some into data that has not arrived (LATE), many
//! overlapping one another; judged by a reader written from docs/formats.md alone
//! (`tests/outside/check_windows.py`): every record's windows, every frame's bytes, each
//! status true to the frames it holds, and every window whose data was gone flagged MISSING.
//! The verdict's counts must be the files' counts.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const DECISIONS: u64 = 1500;
const TICK_HZ: u64 = 62_500_000;
const FRAME: u64 = 6250; // 100 us
const BEFORE: u64 = 62_500; // 1 ms
const AFTER: u64 = 93_750; // 1.5 ms
const RUS: usize = 3;

/// `evb run` of `DECISIONS` windows with delays in `delays` (ticks) over `transport`, the
/// RUs' buffers keeping `buffer_ms`.
fn run_windows(
    transport: &str,
    delays: (i64, i64),
    buffer_ms: u64,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    std::process::Output,
    Value,
) {
    let dir = common::out_dir();
    let out = dir.path().join("out");
    let base = common::free_base_port(12);
    let toml = format!(
        "[run]\nid = \"windows\"\nevents = {DECISIONS}\nduration_s = 0\nrate_hz = 1000\nseed = 3\n\
         [topology]\nrus = {RUS}\nbus = 2\nbase_port = {base}\n[control]\nbase_port = {}\n\
         [transport]\nkind = \"{transport}\"\n[builder]\nby = \"window\"\n\
         [frames]\nticks = {FRAME}\nsize = 200\ndistribution = \"lognormal\"\n\
         [windows]\ntick_hz = {TICK_HZ}\nbefore_ticks = {BEFORE}\nafter_ticks = {AFTER}\n\
         delay_min_ticks = {}\ndelay_max_ticks = {}\nbuffer_ms = {buffer_ms}\nwait_ms = 10\n\
         [sink]\nkind = \"file\"\ndir = \"{}\"\nfile_max_events = 300\n",
        base + 6,
        delays.0,
        delays.1,
        out.display()
    );
    let (o, s) = common::evb_run_in(dir.path(), &toml);
    (dir, out, o, s)
}

/// The outside reader's verdict on `dir`.
fn check(dir: &Path, delays: (i64, i64), buffer_ms: u64, seed: u64) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/outside/check_windows.py");
    let o = Command::new("python3")
        .arg(&script)
        .arg(dir)
        .args(["--seed", &seed.to_string(), "--rate-hz", "1000"])
        .args(["--tick-hz", &TICK_HZ.to_string()])
        .args(["--before", &BEFORE.to_string()])
        .args(["--after", &AFTER.to_string()])
        .args(["--delay-min", &delays.0.to_string()])
        .args(["--delay-max", &delays.1.to_string()])
        .args(["--frame", &FRAME.to_string()])
        .args(["--buffer-ticks", &(buffer_ms * TICK_HZ / 1000).to_string()])
        // the RUs' clocks start with their Start, the decisions' with the EVM's: 100 ms of
        // skew allowed, for a loaded host
        .args(["--slack", &(TICK_HZ / 10).to_string()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn bus_sum(s: &Value, key: &str) -> u64 {
    s["run"]["bus"]
        .as_array()
        .map_or(0, |b| b.iter().map(|b| b[key].as_u64().unwrap_or(0)).sum())
}

#[test]
fn windows_late_and_evicted_are_flagged_as_the_files_show() {
    if !common::python3("windows") {
        return;
    }
    // decisions about data from 300 ms in the future to 500 ms in the past, the buffer
    // keeping 100 ms: about a third LATE, half MISSING
    let delays = (-(TICK_HZ as i64) * 3 / 10, TICK_HZ as i64 / 2);
    let (_keep, out, o, s) = run_windows("tcp", delays, 100);
    let text = common::text(&o);
    assert!(o.status.success(), "{text}");
    assert_eq!(s["run"]["evm"]["released"], DECISIONS, "{text}");
    let r = check(&out, delays, 100, 3);
    assert_eq!(r["problems"], 0, "{r}");
    assert_eq!(r["records"], DECISIONS, "{r}");
    let c = &r["components"];
    let (late, missing) = (c["late"].as_u64().unwrap(), c["missing"].as_u64().unwrap());
    assert!(
        late > 0 && missing > 0 && c["complete"].as_u64().unwrap() > 0,
        "{r}"
    );
    assert!(r["overlapping"].as_u64().unwrap() > 0, "{r}");
    // every reader says the same: the verdict's counts, the BUs' reports, the files
    assert_eq!(bus_sum(&s, "late_components"), late, "{r}");
    assert_eq!(bus_sum(&s, "missing_components"), missing, "{r}");
    assert!(
        text.contains(&format!(
            "{late} components LATE (their data had not arrived within windows.wait_ms), \
             {missing} MISSING (evicted from the RUs' latency buffers)"
        )),
        "{text}"
    );
    assert_eq!(bus_sum(&s, "window_errors"), 0);
    // evb inspect reads the same from the files: the windows' statuses, and every record
    // with one flagged partial in its file as the BUs counted it
    let i = Command::new(common::EVB)
        .arg("inspect")
        .arg(&out)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&i.stdout);
    assert!(i.status.success(), "{said}");
    let sum = |before: &str, after: &str| -> u64 {
        said.lines()
            .filter_map(|l| l.split_once(before))
            .filter_map(|(_, rest)| rest.split(after).next()?.trim().parse::<u64>().ok())
            .sum()
    };
    assert_eq!(sum("(LATE ", ","), late, "{said}");
    assert_eq!(sum(", MISSING ", ","), missing, "{said}");
    assert_eq!(
        sum("  partial ", ","),
        bus_sum(&s, "partial_events"),
        "{said}"
    );
    // the reader is not a rubber stamp: read with another seed, the windows are elsewhere
    let r = check(&out, delays, 100, 4);
    assert!(r["problems"].as_u64().unwrap() > 0, "{r}");
}

/// Decisions within the buffer and never ahead of the data, over shm: every window whole,
/// the verdict OK and complete.
#[test]
fn windows_within_the_buffer_are_all_complete_over_shm() {
    if !common::python3("windows") {
        return;
    }
    // windows ending 50 ms to 200 ms before their decisions, the buffers keeping 2 s: room
    // for the nodes' clocks to differ and for a loaded host's delays
    let delays = (
        TICK_HZ as i64 / 20 + AFTER as i64,
        TICK_HZ as i64 / 5 + AFTER as i64,
    );
    let (_keep, out, o, _) = run_windows("shm", delays, 2000);
    let text = common::text(&o);
    assert!(o.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "VERDICT: OK - every trigger decision's window ({DECISIONS}) built exactly once, \
             complete, checksums valid"
        )),
        "{text}"
    );
    let r = check(&out, delays, 2000, 3);
    assert_eq!(r["problems"], 0, "{r}");
    assert_eq!(r["components"]["complete"], DECISIONS * RUS as u64, "{r}");
}

/// Decisions from a file (`windows.decisions`), every node reading the same: each record's
/// window is its line, those far behind the data come MISSING, those ahead of it LATE, the
/// rest whole; overlapping windows hold the same frames; a decision naming one source gets
/// the other's fragment EMPTY, not counted as partial. A file that lists fewer decisions
/// than the run asks for, a line that is not `begin end`, or one naming a source no RU
/// reads, stops the run naming it.
#[test]
fn decisions_from_a_file_build_the_windows_it_lists() {
    if !common::python3("windows") {
        return;
    }
    let dir = common::out_dir();
    let out = dir.path().join("out");
    // a microsecond a tick, decisions at 1 kHz: decision k is due at tick 1000 k
    let mut lines = String::from("# begin end (ticks)\n");
    for k in 0..DECISIONS as i64 {
        let at = 1000 * k;
        let (begin, end) = match k % 10 {
            3 => (at - 2_000_000, at - 1_990_000), // 2 s back: evicted
            7 => (at + 500_000, at + 501_000),     // 0.5 s ahead: LATE
            _ => (at - 60_000, at - 50_000),       // within the buffer, overlapping
        };
        // every 10th from the 5th names source 1 only: source 0 sends it EMPTY
        let named = if k % 10 == 5 { " 1" } else { "" };
        lines += &format!("{} {}{named}\n", begin.max(0), end.max(1));
    }
    std::fs::write(dir.path().join("decisions.txt"), &lines).unwrap();
    let base = common::free_base_port(12);
    let toml = |events: u64| {
        format!(
            "[run]\nid = \"decided\"\nevents = {events}\nduration_s = 0\nrate_hz = 1000\n\
             [topology]\nrus = 2\nbus = 2\nbase_port = {base}\n[control]\nbase_port = {}\n\
             [builder]\nby = \"window\"\n[frames]\nticks = 1000\nsize = 64\n\
             [windows]\ntick_hz = 1000000\nbuffer_ms = 1000\nwait_ms = 10\n\
             decisions = \"{}\"\n\
             [sink]\nkind = \"file\"\ndir = \"{}\"\n",
            base + 5,
            dir.path().join("decisions.txt").display(),
            out.display()
        )
    };
    // `evb config check` says the file's windows, not the extents the file overrides
    let checked = dir.path().join("check.toml");
    std::fs::write(&checked, toml(DECISIONS)).unwrap();
    let c = Command::new(common::EVB)
        .args(["config", "check"])
        .arg(&checked)
        .output()
        .unwrap();
    let said = common::text(&c);
    assert!(c.status.success(), "{said}");
    assert!(
        said.contains("decisions.txt (") && said.contains("the longest 10000 ticks"),
        "{said}"
    );
    let (o, s) = common::evb_run_in(dir.path(), &toml(DECISIONS));
    let text = common::text(&o);
    assert!(o.status.success(), "{text}");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/outside/check_windows.py");
    let r = Command::new("python3")
        .arg(&script)
        .arg(&out)
        .args([
            "--rate-hz",
            "1000",
            "--tick-hz",
            "1000000",
            "--frame",
            "1000",
        ])
        .args(["--buffer-ticks", "1000000", "--slack", "100000"])
        .arg("--decisions")
        .arg(dir.path().join("decisions.txt"))
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let r: Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(r["problems"], 0, "{r}");
    assert_eq!(r["records"], DECISIONS, "{r}");
    let c = &r["components"];
    // every 10th from the 3rd reaches 2 s back, past the 1 s buffer, once the run is 1 s old
    let evicted = (1000..DECISIONS).filter(|k| k % 10 == 3).count() as u64 * 2;
    assert!(c["missing"].as_u64().unwrap() >= evicted, "{r}");
    assert!(c["late"].as_u64().unwrap() > 0, "{r}");
    assert!(r["overlapping"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(
        bus_sum(&s, "missing_components"),
        c["missing"].as_u64().unwrap()
    );
    let empty = (0..DECISIONS).filter(|k| k % 10 == 5).count() as u64;
    assert_eq!(c["empty"], empty, "{r}");
    assert_eq!(bus_sum(&s, "empty_components"), empty);
    assert!(
        text.contains(&format!(
            "{empty} components EMPTY (not named by their decision"
        )),
        "{text}"
    );
    // partial: the LATE and MISSING windows' records only, never an EMPTY one's
    let partial = bus_sum(&s, "partial_events");
    assert!(partial <= c["late"].as_u64().unwrap() + c["missing"].as_u64().unwrap());
    // a file shorter than the run: the run stops, naming the file and the counts (the
    // first run's files moved away: evb run refuses a folder holding them)
    std::fs::rename(dir.path().join("out"), dir.path().join("out-1")).unwrap();
    let (o, _) = common::evb_run_in(dir.path(), &toml(DECISIONS + 1));
    let text = common::text(&o);
    assert!(!o.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "lists {DECISIONS} decisions, and run.events asks for {}",
            DECISIONS + 1
        )),
        "{text}"
    );
    // a line that is not a decision: named by file and line
    std::fs::write(dir.path().join("decisions.txt"), "# one\n5 9\n7 x\n").unwrap();
    let (o, _) = common::evb_run_in(dir.path(), &toml(1));
    let text = common::text(&o);
    assert!(!o.status.success(), "{text}");
    assert!(text.contains("decisions.txt:3: not a tick"), "{text}");
    // a decision naming a source no RU reads
    std::fs::write(dir.path().join("decisions.txt"), "5 9 1,7\n").unwrap();
    let (o, _) = common::evb_run_in(dir.path(), &toml(1));
    let text = common::text(&o);
    assert!(!o.status.success(), "{text}");
    assert!(
        text.contains("decision 0 of") && text.contains("names source 7, which no RU"),
        "{text}"
    );
}

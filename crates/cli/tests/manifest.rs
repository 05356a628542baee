//! The run manifest (docs/formats.md §7): a run through `evb run` with a BU killed from
//! outside at a seeded moment, then `evb inspect --run` and an outside reader written from
//! the docs (`tests/outside/check_manifest.py`) both judge the output complete from the
//! folder alone, and both refuse, naming the ids, once a published file is deleted.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{free_base_port, pids_with, triggered_at_least, wait_node, Rng};
use serde_json::Value;

const EVB: &str = env!("CARGO_BIN_EXE_evb");

fn inspect_run(dir: &Path, clean: bool) -> Output {
    let mut c = Command::new(EVB);
    c.args(["inspect", "--run"]).arg(dir);
    if clean {
        c.arg("--clean");
    }
    c.output().unwrap()
}

/// The outside reader's judgement of `dir`, or `None` without python3.
fn outside(dir: &Path) -> Option<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/outside/check_manifest.py");
    let o = Command::new("python3")
        .arg(&script)
        .arg(dir)
        .output()
        .ok()?;
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    Some(serde_json::from_slice(&o.stdout).unwrap())
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn a_run_with_a_killed_bu_is_judged_complete_from_its_files_and_a_deleted_part_is_named() {
    let seed = std::env::var("EVB_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(common::clock_seed);
    println!("manifest: seed {seed} (EVB_CHAOS_SEED={seed} replays it)");
    let mut rng = Rng(seed | 1);
    let victim = rng.below(3);
    let at = 800 + rng.below(3000);
    let events = 6000;
    let d = common::out_dir();
    let out = d.path().join("out");
    let base = free_base_port(12);
    let cfg = d.path().join("run.toml");
    std::fs::write(
        &cfg,
        format!(
            "[run]\nid = \"man\"\nevents = {events}\nduration_s = 0\nrate_hz = 2000\n\
             [topology]\nrus = 2\nbus = 3\nbase_port = {base}\n[control]\nbase_port = {}\n\
             [fragments]\nsize = 256\n[sink]\nkind = \"file\"\ndir = \"{}\"\n\
             file_max_events = 300\n",
            base + 6,
            out.display()
        ),
    )
    .unwrap();
    let mut l = Command::new(EVB)
        .args(["run", "--config"])
        .arg(&cfg)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let marker = format!("evb-run-{}-", l.id());
    wait_node(
        &format!("127.0.0.1:{}", base + 6),
        &format!("{at} events triggered"),
        60,
        || match l.try_wait() {
            Ok(Some(st)) => Some(format!("evb run ended ({st})")),
            _ => None,
        },
        |line| triggered_at_least(line, at),
    );
    let pids = pids_with(&marker, &format!("--id bu{victim} "));
    assert_eq!(pids.len(), 1, "bu{victim}'s process: {pids:?}");
    common::signal(pids[0] as u64, "-KILL");
    let o = l.wait_with_output().unwrap();
    let said = text(&o);
    println!("killed bu{victim} at {at} events triggered\n{said}");

    // the manifest says what `evb run` said
    let m: Value =
        serde_json::from_slice(&std::fs::read(out.join("man.manifest.json")).unwrap()).unwrap();
    let verdict = if o.status.success() { "OK" } else { "FAILED" };
    assert_eq!(m["verdict"], verdict, "{m}\n{said}");
    assert!(said.contains(&format!("VERDICT: {verdict}")));
    assert_eq!(m["triggered"], events, "{m}");
    assert_eq!(m["released"], events, "{m}");

    let good = inspect_run(&out, false);
    let said = text(&good);
    assert_eq!(good.status.success(), verdict == "OK", "{said}");
    assert!(said.contains("complete: every triggered event"), "{said}");
    if let Some(r) = outside(&out) {
        assert_eq!(r["complete"], true, "{r}");
        assert_eq!(r["verdict"], verdict, "{r}");
    }

    // --clean takes away what the killed BU left under temporary names, and nothing else
    let files_before = published(&out);
    let cleaned = inspect_run(&out, true);
    assert!(
        !names_in(&out).iter().any(|n| n.ends_with(".tmp")),
        "{}",
        text(&cleaned)
    );
    assert_eq!(published(&out), files_before);

    // a part deleted: both name its ids
    let victim_file = files_before
        .iter()
        .find(|f| f.starts_with(&format!("man_bu{}_", (victim + 1) % 3)))
        .unwrap_or(&files_before[0])
        .clone();
    let meta: Value =
        serde_json::from_slice(&std::fs::read(out.join(format!("{victim_file}.json"))).unwrap())
            .unwrap();
    let (first, count) = (
        meta["ranges"][0][0].as_u64().unwrap(),
        meta["ranges"][0][1].as_u64().unwrap(),
    );
    std::fs::remove_file(out.join(&victim_file)).unwrap();
    let bad = inspect_run(&out, false);
    let said = text(&bad);
    assert!(!bad.status.success(), "{said}");
    assert!(
        said.contains("INCOMPLETE") && said.contains(&victim_file),
        "{said}"
    );
    let run = if count == 1 {
        format!("{first}")
    } else {
        format!("{first}..{} ({count})", first + count - 1)
    };
    assert!(said.contains(&run), "ids {run} not named: {said}");
    if let Some(r) = outside(&out) {
        assert_eq!(r["complete"], false, "{r}");
        assert_eq!(r["bad_files"][0], victim_file.as_str(), "{r}");
        let named = r["missing"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x[0] == first && x[1] == first + count - 1);
        assert!(named, "{r}");
    }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The published data files in `dir`.
fn published(dir: &Path) -> Vec<String> {
    names_in(dir)
        .into_iter()
        .filter(|n| n.ends_with(".evb") && !n.starts_with('.'))
        .collect::<Vec<_>>()
}

/// `evb run` numbers its runs in the run records (`run.records_dir`): `{run}` in `sink.dir`
/// gives each run a folder of its own, each judged complete alone, and each run's record is
/// closed with its verdict; without `{run}`, a second run into a folder that holds the
/// first's files is refused by name and writes nothing.
#[test]
fn evb_run_numbers_its_runs_and_never_mixes_their_files() {
    let dir = common::out_dir();
    let d = dir.path().display();
    let cfg = |sink: &str| {
        format!(
            "[run]\nid = \"numbered\"\nevents = 600\nduration_s = 0\nrecords_dir = \"{d}/records\"\n\
             [sink]\nkind = \"file\"\ndir = \"{d}/{sink}\"\n"
        )
    };
    for n in 1..=2 {
        let (o, _) = common::evb_run_in(dir.path(), &cfg("out/{run}"));
        assert!(o.status.success(), "run {n}: {}", text(&o));
        let folder = dir.path().join("out").join(format!("{n:06}"));
        let j = inspect_run(&folder, false);
        assert!(j.status.success(), "run {n}: {}", text(&j));
        assert!(text(&j).contains("600 events"), "run {n}: {}", text(&j));
    }
    let records = std::fs::read_to_string(dir.path().join("records/numbered.jsonl")).unwrap();
    let last: Vec<Value> = records
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["record"].clone())
        .collect();
    for n in 1..=2u64 {
        let rec = last.iter().rev().find(|r| r["run"] == n).unwrap();
        assert_eq!(rec["state"], "complete", "{rec}");
        assert_eq!(rec["events_built"], 600, "{rec}");
    }
    // one folder for every run: the second is refused, naming the folder, and writes nothing
    let (o, _) = common::evb_run_in(dir.path(), &cfg("flat"));
    assert!(o.status.success(), "{}", text(&o));
    let before = std::fs::read_dir(dir.path().join("flat")).unwrap().count();
    let (o, _) = common::evb_run_in(dir.path(), &cfg("flat"));
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("already holds files of an earlier run of run id \"numbered\""),
        "{}",
        text(&o)
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("flat")).unwrap().count(),
        before
    );
}

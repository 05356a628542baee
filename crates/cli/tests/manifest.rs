//! The run manifest (docs/formats.md §7): a run through `evb run` with a BU killed from
//! outside at a seeded moment, then `evb inspect --run` and an outside reader written from
//! the docs (`tests/outside/check_manifest.py`) both judge the output complete from the
//! folder alone, and both refuse, naming the ids, once a published file is deleted. And the
//! folder judged whole: each file planted in a real run's folder (junk, another run id's
//! file, another run of the same id's), and each listed file truncated, changed or deleted,
//! is named for what it is, and `evb inspect --run` exits 1.

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
             records_dir = \"{}\"\n[topology]\nrus = 2\nbus = 3\nbase_port = {base}\n[control]\nbase_port = {}\n\
             [fragments]\nsize = 256\n[sink]\nkind = \"file\"\ndir = \"{}\"\n\
             file_max_events = 300\n",
            d.path().join("records").display(),
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

/// Copies the files of `from` (flat) into a new folder `to`.
fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// `evb run` of run id `id` into `<dir>/out`: 2 RUs, 2 BUs, `events` events of fragments
/// of `size` bytes, files of at most `per_file` events; its output folder.
fn small_run(dir: &Path, id: &str, events: u64, size: u32, per_file: u32) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let d = dir.display();
    let (o, _) = common::evb_run_in(
        dir,
        &format!(
            "[run]\nid = \"{id}\"\nevents = {events}\nduration_s = 0\n\
             records_dir = \"{d}/records\"\n[topology]\nrus = 2\nbus = 2\n\
             [fragments]\nsize = {size}\n[sink]\nkind = \"file\"\ndir = \"{d}/out\"\n\
             file_max_events = {per_file}\n"
        ),
    );
    assert!(o.status.success(), "run {id} in {d}: {}", text(&o));
    dir.join("out")
}

/// `evb inspect --run` of a copy of `clean` (in `work/<case>`) that `tamper` changed: its
/// exit status and what it said.
fn judged_after(
    clean: &Path,
    work: &Path,
    case: &str,
    tamper: impl FnOnce(&Path),
) -> (Option<i32>, String) {
    let dir = work.join(case);
    copy_folder(clean, &dir);
    tamper(&dir);
    let o = inspect_run(&dir, false);
    let said = text(&o);
    println!("--- {case}\n{said}");
    (o.status.code(), said)
}

/// The line of `said` that names `file` first (`- file: ...`).
fn line_of<'a>(said: &'a str, file: &str) -> &'a str {
    let key = format!("- {file}: ");
    said.lines()
        .find(|l| l.trim_start().starts_with(&key))
        .unwrap_or_else(|| panic!("{file} is not named:\n{said}"))
}

/// The folder judged whole (docs/formats.md §7): a real run's folder is judged clean (exit
/// 0); then, each on a copy of it, a junk file, another run id's file with its metadata,
/// another run of the same id's file with its metadata (and, over a listed name, its
/// file and metadata), a copy of a listed file under another name, a truncated part, a
/// part with one byte flipped, and a deleted part are each named for what they are, and
/// the judgement exits 1.
#[test]
fn every_file_planted_in_or_changed_in_a_run_folder_is_named_and_fails_the_judgement() {
    let d = common::out_dir();
    let clean = small_run(&d.path().join("a"), "man", 900, 256, 200);
    // another run of the same run id, with other fragments and more, smaller files (so that
    // some of its file names are not this run's), and another run id, each in a folder of
    // its own
    let same_id = small_run(&d.path().join("b"), "man", 700, 200, 50);
    let other_id = small_run(&d.path().join("c"), "other", 300, 256, 200);
    let work = d.path().join("work");
    let m: Value =
        serde_json::from_slice(&std::fs::read(clean.join("man.manifest.json")).unwrap()).unwrap();
    let parts = m["parts"].as_array().unwrap().clone();
    assert!(parts.len() >= 5, "900 events, at most 200 a file: {m}");
    let names = |m: &Value| -> Vec<String> {
        m["parts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["file"].as_str().unwrap().to_string())
            .collect()
    };
    let (ours, theirs) = (
        names(&m),
        names(
            &serde_json::from_slice(&std::fs::read(same_id.join("man.manifest.json")).unwrap())
                .unwrap(),
        ),
    );
    // 700 events, at most 50 a file: more files than this run has
    let not_ours = theirs.iter().find(|f| !ours.contains(f)).unwrap().clone();
    let part = |i: usize| {
        (
            parts[i]["file"].as_str().unwrap().to_string(),
            parts[i]["bytes"].as_u64().unwrap(),
            parts[i]["crc32c"].as_u64().unwrap() as u32,
        )
    };
    let refused = |code: Option<i32>, said: &str| {
        assert_eq!(code, Some(1), "{said}");
        assert!(
            !said.contains("absent, or not the file"),
            "the old, undecided wording: {said}"
        );
    };

    // the clean run, and a file that is not named as data beside it: exit 0
    let (code, said) = judged_after(&clean, &work, "clean", |dir| {
        std::fs::write(dir.join("README.txt"), "taken at point 5\n").unwrap();
    });
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("run man: verdict OK, 900 triggered, 900 released")
            && said.contains("complete: every triggered event is in exactly one intact file")
            && said
                .contains("not judged (not named as data, a manifest or a temporary): README.txt")
            && !said.contains("NOT ONLY"),
        "{said}"
    );

    // junk named like a run's file
    let (code, said) = judged_after(&clean, &work, "junk", |dir| {
        let junk: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        std::fs::write(dir.join("cms_bu0_000099.evb"), junk).unwrap();
    });
    refused(code, &said);
    assert!(said.contains("complete: every triggered event"), "{said}");
    assert!(
        said.contains("NOT ONLY THE RUN'S OUTPUT: 1 file looks like data"),
        "{said}"
    );
    assert!(
        line_of(&said, "cms_bu0_000099.evb")
            .contains("junk: not an evb event file (magic \"EVBE\" missing)"),
        "{said}"
    );

    // another run id's file with its metadata
    let (code, said) = judged_after(&clean, &work, "other-run-id", |dir| {
        for f in ["other_bu0_000000.evb", "other_bu0_000000.evb.json"] {
            std::fs::copy(other_id.join(f), dir.join(f)).unwrap();
        }
    });
    refused(code, &said);
    assert!(
        line_of(&said, "other_bu0_000000.evb")
            .contains("another run id's: its header names run id \"other\""),
        "{said}"
    );
    assert!(
        line_of(&said, "other_bu0_000000.evb.json")
            .contains("another run id's: its metadata names run id \"other\""),
        "{said}"
    );

    // another run of the same id: a file whose name this run has not, with its metadata
    let not_ours_meta = format!("{not_ours}.json");
    let (code, said) = judged_after(&clean, &work, "same-run-id", |dir| {
        for f in [&not_ours, &not_ours_meta] {
            std::fs::copy(same_id.join(f), dir.join(f)).unwrap();
        }
    });
    refused(code, &said);
    assert!(said.contains("complete: every triggered event"), "{said}");
    for (f, by) in [(&not_ours, "its header"), (&not_ours_meta, "its metadata")] {
        assert!(
            line_of(&said, f).contains(&format!(
                "not this run's: {by} names run id \"man\", the run's own, but the manifest \
                 does not list it: another run of the same id, or a copy"
            )),
            "{said}"
        );
    }

    // another run of the same id: one of its files and its metadata copied over a listed
    // file's
    let (file, bytes, crc) = part(0);
    let their_data = std::fs::read(same_id.join(&theirs[0])).unwrap();
    let (their_bytes, their_crc) = (their_data.len() as u64, crc32c::crc32c(&their_data));
    let (code, said) = judged_after(&clean, &work, "same-run-id-over-a-part", |dir| {
        std::fs::write(dir.join(&file), &their_data).unwrap();
        std::fs::copy(
            same_id.join(format!("{}.json", theirs[0])),
            dir.join(format!("{file}.json")),
        )
        .unwrap();
    });
    refused(code, &said);
    assert!(said.contains("INCOMPLETE:"), "{said}");
    let expected = if their_bytes != bytes {
        format!("changed: size {their_bytes} bytes where the manifest lists {bytes}")
    } else {
        format!("changed: CRC32C {their_crc:#010x} where the manifest lists {crc:#010x}")
    };
    assert!(line_of(&said, &file).contains(&expected), "{said}");
    assert!(
        line_of(&said, &format!("{file}.json")).contains("changed: its \""),
        "{said}"
    );
    assert!(said.contains("METADATA NOT AS LISTED:"), "{said}");

    // a listed file copied under another name
    let (code, said) = judged_after(&clean, &work, "copy", |dir| {
        std::fs::copy(dir.join(&file), dir.join("man_bu0_000000-copy.evb")).unwrap();
    });
    refused(code, &said);
    assert!(
        line_of(&said, "man_bu0_000000-copy.evb").contains(&format!(
            "not this run's: a copy of {file} of run \"man\" (the same size and CRC32C)"
        )),
        "{said}"
    );

    // a truncated part
    let (file, bytes, crc) = part(1);
    let (code, said) = judged_after(&clean, &work, "truncated", |dir| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join(&file))
            .unwrap()
            .set_len(bytes / 2)
            .unwrap();
    });
    refused(code, &said);
    let line = line_of(&said, &file);
    assert!(
        line.contains(&format!(
            "changed: size {} bytes where the manifest lists {bytes}",
            bytes / 2
        )) && line.contains(&format!("listed {crc:#010x})"))
            && line.contains("whole events, then at byte")
            && line.contains("truncated event"),
        "{said}"
    );
    assert!(said.contains("ids in no file:"), "{said}");

    // one byte flipped in the middle of a part
    let (file, bytes, crc) = part(2);
    let mut found = 0u32;
    let (code, said) = judged_after(&clean, &work, "flipped", |dir| {
        let mut data = std::fs::read(dir.join(&file)).unwrap();
        let at = data.len() / 2;
        data[at] ^= 0x10;
        found = crc32c::crc32c(&data);
        std::fs::write(dir.join(&file), &data).unwrap();
    });
    refused(code, &said);
    let line = line_of(&said, &file);
    assert!(
        line.contains(&format!(
            "changed: CRC32C {found:#010x} where the manifest lists {crc:#010x} \
             (size {bytes} bytes, as listed)"
        )) && line.contains("whole events, then at byte"),
        "{said}"
    );

    // a deleted part
    let (file, _, _) = part(3);
    let (code, said) = judged_after(&clean, &work, "deleted", |dir| {
        std::fs::remove_file(dir.join(&file)).unwrap();
    });
    refused(code, &said);
    assert!(line_of(&said, &file).ends_with(": absent"), "{said}");
    assert!(said.contains("ids in no file:"), "{said}");
}

/// `evb inspect --run DIR --verify` with `--records`, or the records the folder's
/// configuration copy names: its exit status and what it said.
fn verified(dir: &Path, records: Option<&Path>) -> (Option<i32>, String) {
    let mut c = Command::new(EVB);
    c.args(["inspect", "--run"]).arg(dir).arg("--verify");
    if let Some(r) = records {
        c.arg("--records").arg(r);
    }
    let o = c.output().unwrap();
    let said = text(&o);
    println!("--- verify {}\n{said}", dir.display());
    (o.status.code(), said)
}

/// Issue 67 item 5, records that prove: two runs of one run id through `evb run` (their
/// folders `out/000001`, `out/000002`, one records file). Run 2's folder is proven (its
/// record names its manifest and configuration copy by SHA-256, and chains to run 1's
/// record); then, each on a copy, a byte flipped in a data file, in the manifest and in the
/// configuration copy, and run 1's record edited or deleted in a copy of the records, are
/// each named, and `--verify` exits 1.
#[test]
fn a_run_folder_is_proven_against_its_records_and_each_tampering_is_named() {
    let d = common::out_dir();
    let root = d.path();
    let cfg = format!(
        "[run]\nid = \"proof\"\nevents = 600\nduration_s = 0\nrecords_dir = \"{r}/records\"\n\
         [topology]\nrus = 2\nbus = 2\n[fragments]\nsize = 256\n\
         [sink]\nkind = \"file\"\ndir = \"{r}/out/{{run}}\"\nfile_max_events = 100\n",
        r = root.display()
    );
    for _ in 0..2 {
        let (o, _) = common::evb_run_in(root, &cfg);
        assert!(o.status.success(), "{}", text(&o));
    }
    let run2 = root.join("out/000002");
    let records = root.join("records/proof.jsonl");
    let (code, said) = verified(&run2, None);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("run record 2") && said.contains("proven"),
        "{said}"
    );

    let work = root.join("work");
    let case = |name: &str, tamper: &dyn Fn(&Path)| -> (Option<i32>, String) {
        let dir = work.join(name);
        copy_folder(&run2, &dir);
        tamper(&dir);
        verified(&dir, None)
    };
    let replace = |p: &Path, from: &str, to: &str| {
        let t = std::fs::read_to_string(p).unwrap();
        assert!(t.contains(from), "{} holds no {from:?}", p.display());
        std::fs::write(p, t.replacen(from, to, 1)).unwrap();
    };
    // a byte of a data file
    let (code, said) = case("data", &|dir| {
        let part = published(dir)[0].clone();
        let p = dir.join(&part);
        let mut b = std::fs::read(&p).unwrap();
        let at = b.len() - 10;
        b[at] ^= 0x20;
        std::fs::write(&p, &b).unwrap();
    });
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("INCOMPLETE"), "{said}");
    // the manifest
    let (code, said) = case("manifest", &|dir| {
        replace(
            &dir.join("proof.manifest.json"),
            "\"partial\": 0",
            "\"partial\": 1",
        )
    });
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("no run record in") && said.contains("names this manifest as it is"),
        "{said}"
    );
    // the configuration copy
    let (code, said) = case("config", &|dir| {
        replace(
            &dir.join("proof.config.toml"),
            "events = 600",
            "events = 601",
        )
    });
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("NOT PROVEN: the configuration copy proof.config.toml"),
        "{said}"
    );
    // run 1's record edited, then deleted, in copies of the records
    let text1 = std::fs::read_to_string(&records).unwrap();
    let edited = root.join("edited.jsonl");
    let last1 = text1
        .lines()
        .rfind(|l| l.contains("\"run\":1,"))
        .unwrap()
        .to_string();
    std::fs::write(
        &edited,
        text1.replace(
            &last1,
            &last1.replace("\"events_built\":600", "\"events_built\":599"),
        ),
    )
    .unwrap();
    let (code, said) = verified(&run2, Some(&edited));
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("CHAIN BROKEN: run 2's record"), "{said}");
    let deleted = root.join("deleted.jsonl");
    let kept: Vec<&str> = text1
        .lines()
        .filter(|l| !l.contains("\"run\":1,"))
        .collect();
    std::fs::write(&deleted, kept.join("\n") + "\n").unwrap();
    let (code, said) = verified(&run2, Some(&deleted));
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("CHAIN BROKEN: run 2's record"), "{said}");
    // and the records as they are still prove run 2
    let (code, said) = verified(&run2, Some(&records));
    assert_eq!(code, Some(0), "{said}");
}

/// Issue 71 item 6: `evb inspect` of an HDF5 file says what it is and what reads it (it said
/// "not an evb event file" though docs/formats.md lists the HDF5 sink), and exits non-zero:
/// it checked nothing.
#[test]
fn inspect_of_an_hdf5_file_says_what_reads_it() {
    let d = common::out_dir();
    let f = d.path().join("run_bu0_000000.h5");
    let mut bytes = b"\x89HDF\r\n\x1a\n".to_vec();
    bytes.resize(512, 0);
    std::fs::write(&f, bytes).unwrap();
    let out = Command::new(EVB).arg("inspect").arg(&f).output().unwrap();
    let said = common::text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("an HDF5 file (the hdf5 sink)")
            && said.contains("evb inspect --run")
            && !said.contains("not an evb event file"),
        "{said}"
    );
}

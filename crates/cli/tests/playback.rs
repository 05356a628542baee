//! Recorded data in, files out, as real processes: FED and framed playback with exact event
//! counts, both error policies on corrupt files, trigger-number mismatches, the file sink's
//! round trip (write, inspect, replay, identical bytes), disk-full back-pressure, and the
//! real CMS files of the repository (data/cms).

mod common;
use common::{evb_run_in, text, EVB};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use evb_formats::events::EventFile;
use evb_formats::{fed, framed};
use serde_json::Value;

/// A FED file of `n` fragments (LV1 ids from `first_lv1`) of varying sizes.
fn fed_file(path: &Path, source: u16, first_lv1: u32, n: u32) {
    let mut data = Vec::new();
    for k in 0..n {
        let words: Vec<u64> = (0..(k * 7 % 50))
            .map(|w| (w as u64) << 8 | source as u64 | (k as u64) << 32)
            .collect();
        data.extend(fed::build(first_lv1 + k, source, &words));
    }
    std::fs::write(path, data).unwrap();
}

fn sum(s: &Value, role: &str, key: &str) -> u64 {
    s["run"][role]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x[key].as_u64().unwrap())
        .sum()
}

fn playback_toml(kind: &str, files: &[(u16, Vec<PathBuf>)], bus: u32, extra: &str) -> String {
    let mut t = format!("[run]\nid = \"pb\"\nduration_s = 0\n[source]\nkind = \"{kind}\"\n{extra}\n[topology]\nbus = {bus}\n");
    for (i, (src, fs)) in files.iter().enumerate() {
        let list: Vec<String> = fs
            .iter()
            .map(|p| format!("{:?}", p.display().to_string()))
            .collect();
        t += &format!(
            "[[ru]]\nid = \"ru{i}\"\nsource_id = {src}\nfiles = [{}]\n",
            list.join(", ")
        );
    }
    t
}

#[test]
fn fed_playback_two_by_one_and_two_by_two() {
    let d = common::out_dir();
    let (a, b) = (d.path().join("a.raw"), d.path().join("b.raw"));
    fed_file(&a, 841, 1, 700);
    fed_file(&b, 843, 1, 700);
    for bus in [1, 2] {
        let (out, s) = evb_run_in(
            d.path(),
            &playback_toml(
                "fed",
                &[(841, vec![a.clone()]), (843, vec![b.clone()])],
                bus,
                "",
            ),
        );
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(
            s["run"]["evm"]["triggered"], 700,
            "the run ends with the data"
        );
        assert_eq!(sum(&s, "bus", "events_built"), 700);
        assert_eq!(sum(&s, "bus", "trigger_mismatches"), 0);
        assert_eq!(sum(&s, "bus", "crc_errors"), 0);
        assert_eq!(sum(&s, "bus", "partial_events"), 0);
    }
}

#[test]
fn framed_playback_with_several_files_per_ru() {
    let d = common::out_dir();
    let mut files = Vec::new();
    for (src, names) in [(1u16, ["x1", "x2"]), (2u16, ["y1", "y2"])] {
        let mut paths = Vec::new();
        for (f, name) in names.iter().enumerate() {
            let data: Vec<u8> = (0..150u32)
                .flat_map(|k| {
                    framed::encode(
                        f as u32 * 150 + k,
                        &vec![src as u8; (k as usize * 13) % 900],
                    )
                })
                .collect();
            let p = d.path().join(name);
            std::fs::write(&p, data).unwrap();
            paths.push(p);
        }
        files.push((src, paths));
    }
    let (out, s) = evb_run_in(d.path(), &playback_toml("framed", &files, 2, ""));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(sum(&s, "bus", "events_built"), 300);
    assert_eq!(sum(&s, "bus", "trigger_mismatches"), 0);
}

/// a.raw with fragments 10 and 20 damaged (a payload bit: the CRC catches it).
fn corrupt_pair(d: &Path) -> (PathBuf, PathBuf) {
    let (a, b) = (d.join("a.raw"), d.join("b.raw"));
    fed_file(&a, 841, 1, 100);
    fed_file(&b, 843, 1, 100);
    let mut data = std::fs::read(&a).unwrap();
    let ranges = fed::split(&data).unwrap();
    for k in [10, 20] {
        data[ranges[k].start + 8] ^= 0x01;
    }
    std::fs::write(&a, data).unwrap();
    (a, b)
}

#[test]
fn corrupt_fragments_stop_the_run_by_default() {
    let d = common::out_dir();
    let (a, b) = corrupt_pair(d.path());
    let t0 = Instant::now();
    let (out, _) = evb_run_in(
        d.path(),
        &playback_toml("fed", &[(841, vec![a.clone()]), (843, vec![b])], 1, ""),
    );
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("a.raw") && t.contains("CRC"),
        "the error names the file and the check: {t}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "a bad file must not wait for time-outs"
    );
}

#[test]
fn corrupt_fragments_dropped_make_flagged_partial_events() {
    let d = common::out_dir();
    let (a, b) = corrupt_pair(d.path());
    let out_dir = d.path().join("out");
    let extra = format!(
        "on_error = \"drop\"\n[sink]\nkind = \"file\"\ndir = {:?}\n",
        out_dir.display().to_string()
    );
    let (out, s) = evb_run_in(
        d.path(),
        &playback_toml("fed", &[(841, vec![a]), (843, vec![b])], 2, &extra),
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(sum(&s, "bus", "events_built"), 100, "no event lost");
    assert_eq!(sum(&s, "bus", "partial_events"), 2);
    assert_eq!(sum(&s, "rus", "dropped_at_source"), 2);
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 built as partial events"));
    // the two partial events are in the files, flagged, with source 841 marked missing
    let mut partial = Vec::new();
    for f in std::fs::read_dir(&out_dir).unwrap() {
        let p = f.unwrap().path();
        if p.extension().is_some_and(|e| e == "evb") {
            for ev in EventFile::open(&p).unwrap() {
                let ev = ev.unwrap();
                if ev.flags & evb_formats::events::EVENT_PARTIAL != 0 {
                    let missing: Vec<u16> = ev
                        .fragments
                        .iter()
                        .filter(|(h, _)| h.flags & evb_wire::FLAG_MISSING != 0)
                        .map(|(h, _)| h.source_id)
                        .collect();
                    assert_eq!(missing, vec![841]);
                    partial.push(ev.trigger_number);
                }
            }
        }
    }
    partial.sort();
    assert_eq!(partial, vec![11, 21], "LV1 ids of the damaged fragments");
}

#[test]
fn misaligned_trigger_numbers_are_flagged() {
    let d = common::out_dir();
    let (a, b) = (d.path().join("a.raw"), d.path().join("b.raw"));
    fed_file(&a, 841, 1, 50);
    fed_file(&b, 843, 2, 50); // one event ahead
    let (out, s) = evb_run_in(
        d.path(),
        &playback_toml("fed", &[(841, vec![a]), (843, vec![b])], 1, ""),
    );
    assert!(
        !out.status.success(),
        "mismatched events must fail the verdict"
    );
    assert_eq!(sum(&s, "bus", "trigger_mismatches"), 50);
}

fn evb_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "evb"))
        .collect();
    v.sort();
    v
}

/// event id -> (source id, payload) of every event in these files
fn read_all(files: &[PathBuf]) -> BTreeMap<u64, Vec<(u16, Vec<u8>)>> {
    let mut m = BTreeMap::new();
    for f in files {
        for ev in EventFile::open(f).unwrap() {
            let ev = ev.unwrap();
            let frags = ev
                .fragments
                .into_iter()
                .map(|(h, p)| (h.source_id, p))
                .collect();
            assert!(
                m.insert(ev.event_id, frags).is_none(),
                "event {} twice",
                ev.event_id
            );
        }
    }
    m
}

#[test]
fn file_sink_round_trip_write_inspect_replay() {
    let d = common::out_dir();
    let first = d.path().join("first");
    let second = d.path().join("second");
    let toml = format!(
        "[run]\nid = \"rec\"\nevents = 600\nduration_s = 0\n[fragments]\nsize = 3000\ndistribution = \"lognormal\"\n\
         [sink]\nkind = \"file\"\ndir = {:?}\nfile_max_events = 100\n",
        first.display().to_string()
    );
    let (out, s) = evb_run_in(d.path(), &toml);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(sum(&s, "bus", "events_built"), 600);
    let files = evb_files(&first);
    assert!(files.len() >= 6, "rolled every 100 events: {files:?}");
    for f in &files {
        assert!(
            PathBuf::from(format!("{}.json", f.display())).exists(),
            "metadata beside {}",
            f.display()
        );
    }
    assert!(std::fs::read_dir(&first).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".tmp")));

    let inspect = Command::new(EVB)
        .arg("inspect")
        .args(&files)
        .output()
        .unwrap();
    assert!(inspect.status.success(), "{}", text(&inspect));
    let said = String::from_utf8_lossy(&inspect.stdout);
    assert!(said.contains("checksums: all valid"));
    // the grand total over the files
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    let total = format!("total: {} files, 600 events, {bytes} bytes", files.len());
    assert!(said.lines().any(|l| l == total), "no {total:?} in\n{said}");

    // replay the recorded run through the event builder into new files
    let replay = playback_toml("evb", &[(0, files.clone()), (1, files.clone())], 2, "")
        + &format!(
            "[sink]\nkind = \"file\"\ndir = {:?}\n",
            second.display().to_string()
        );
    let (out, s) = evb_run_in(d.path(), &replay);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(sum(&s, "bus", "events_built"), 600);
    let (a, b) = (read_all(&files), read_all(&evb_files(&second)));
    assert_eq!(a.len(), 600);
    assert_eq!(a, b, "replayed events are byte for byte the recorded ones");

    // one flipped byte is found
    let victim = &files[0];
    let mut data = std::fs::read(victim).unwrap();
    let n = data.len();
    data[n - 10] ^= 0xff;
    std::fs::write(victim, data).unwrap();
    let inspect = Command::new(EVB)
        .arg("inspect")
        .arg(victim)
        .output()
        .unwrap();
    assert!(!inspect.status.success());
}

#[test]
fn full_disk_holds_events_back_and_loses_nothing() {
    // A 3 MiB tmpfs that fills long before the run's ~16 MB are written; a "consumer" thread
    // moves completed files away (counting their events) so space comes back.
    let d = common::out_dir();
    let mnt = d.path().join("small");
    let Some(_mounted) = common::Tmpfs::mount(&mnt, "3m") else {
        return;
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let consumer = {
        let (mnt, stop) = (mnt.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut events = 0u64;
            let mut rounds = 0u32;
            loop {
                let done = stop.load(std::sync::atomic::Ordering::SeqCst);
                // a slow consumer: every 300 ms it takes the completed files
                std::thread::sleep(Duration::from_millis(300));
                rounds += 1;
                for f in evb_files(&mnt) {
                    let meta = PathBuf::from(format!("{}.json", f.display()));
                    if let Ok(t) = std::fs::read_to_string(&meta) {
                        let m: Value = serde_json::from_str(&t).unwrap();
                        events += m["events"].as_u64().unwrap();
                        std::fs::remove_file(&f).unwrap();
                        std::fs::remove_file(&meta).unwrap();
                    }
                }
                if done {
                    return (events, rounds);
                }
            }
        })
    };
    let toml = format!(
        "[run]\nid = \"full\"\nevents = 400\nduration_s = 0\nstall_timeout_s = 30\n[fragments]\nsize = 20000\n\
         [topology]\nbus = 1\n[builder]\ncredits = 4\n[sink]\nkind = \"file\"\ndir = {:?}\nfile_max_events = 10\n",
        mnt.display().to_string()
    );
    let (out, s) = evb_run_in(d.path(), &toml);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (consumed, _) = consumer.join().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(sum(&s, "bus", "events_built"), 400);
    let stalls = s["nodes"]["bu0"]["sink"]["stalls"].as_u64().unwrap();
    assert!(stalls > 0, "the disk never filled: the test proves nothing");
    assert_eq!(consumed, 400, "every event reached a complete file");
}

#[test]
fn real_cms_data_builds_4685_events() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/cms");
    let a = dir.join("csc_00307511_EmuRUI01_Local_000.raw");
    let b = dir.join("csc_00307511_EmuRUI03_Local_000.raw");
    assert!(
        a.exists() && b.exists(),
        "the recorded CMS data is part of the repository (data/cms, its README): {} lacks it",
        dir.display()
    );
    let d = common::out_dir();
    for bus in [1, 2] {
        let out_dir = d.path().join(format!("out{bus}"));
        let extra = format!(
            "[sink]\nkind = \"file\"\ndir = {:?}\n",
            out_dir.display().to_string()
        );
        let (out, s) = evb_run_in(
            d.path(),
            &playback_toml(
                "fed",
                &[(841, vec![a.clone()]), (843, vec![b.clone()])],
                bus,
                &extra,
            ),
        );
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(s["run"]["evm"]["triggered"], 4685);
        assert_eq!(sum(&s, "bus", "events_built"), 4685);
        assert_eq!(sum(&s, "bus", "trigger_mismatches"), 0);
        assert_eq!(sum(&s, "bus", "crc_errors"), 0);
        let events = read_all(&evb_files(&out_dir));
        assert_eq!(events.len(), 4685);
        for (_, frags) in events {
            assert_eq!(frags.len(), 2);
            for (src, payload) in frags {
                assert!(
                    fed::validate(&payload, 0, Some(src)).is_ok(),
                    "FED CRC of source {src}"
                );
            }
        }
    }
}

/// `sink.compress = "zstd"` on the real CMS data: the files are smaller and hold exactly the
/// events of the uncompressed run, byte for byte (read back through `EventFile`, which
/// checks every checksum).
#[test]
fn real_cms_data_compressed_with_zstd_reads_back_byte_for_byte() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/cms");
    let a = dir.join("csc_00307511_EmuRUI01_Local_000.raw");
    let b = dir.join("csc_00307511_EmuRUI03_Local_000.raw");
    assert!(
        a.exists() && b.exists(),
        "the recorded CMS data is part of the repository (data/cms, its README): {} lacks it",
        dir.display()
    );
    let d = common::out_dir();
    let run = |name: &str, compress: &str| {
        let out = d.path().join(name);
        let extra = format!(
            "[sink]\nkind = \"file\"\ndir = {:?}\nfile_max_events = 1000\n{compress}\n",
            out.display().to_string()
        );
        let (o, s) = evb_run_in(
            d.path(),
            &playback_toml(
                "fed",
                &[(841, vec![a.clone()]), (843, vec![b.clone()])],
                2,
                &extra,
            ),
        );
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(s["run"]["evm"]["triggered"], 4685);
        let files = evb_files(&out);
        let bytes: u64 = files
            .iter()
            .map(|f| std::fs::metadata(f).unwrap().len())
            .sum();
        (read_all(&files), bytes)
    };
    let (plain, plain_bytes) = run("plain", "");
    let (packed, packed_bytes) = run("zstd", "compress = \"zstd\"\ncompress_level = 3");
    assert_eq!(plain.len(), 4685);
    assert!(plain == packed, "the compressed run's events differ");
    assert!(
        packed_bytes * 10 < plain_bytes * 7,
        "zstd saved less than 30 %: {packed_bytes} of {plain_bytes} bytes"
    );
}

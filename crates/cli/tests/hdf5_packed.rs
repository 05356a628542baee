//! The HDF5 sink in the packed layout (`sink.hdf5_layout = "packed"`, docs/formats.md §12)
//! through `evb run`, its files read by `tests/outside/check_packed.py`, a reader written
//! with h5py and numpy from docs/formats.md §12 alone: every index row and invariant, each
//! fragment's CRC32C and bytes against the generator's pattern and against the same data
//! written as `.evb` files by a second run (generated events, stored and deflated, and the
//! recorded CMS files where `data/cms` has them, whole and with a damaged fragment
//! dropped, so that events are partial), and a full disk that holds the events back.
#![cfg(feature = "hdf5")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{evb_run_in, out_dir, text};
use serde_json::Value;

/// check_packed.py's verdict on the packed files in `dir` (`args`: `--against DIR`,
/// `--seed N`, `--deflate`).
fn check(py: &Path, dir: &Path, args: &[&str]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/outside/check_packed.py");
    let o = Command::new(py)
        .arg(&script)
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Runs `toml` (with `{sink}` for the sink's lines) twice in `dir`: into `.evb` files and
/// into packed HDF5 with the extra sink lines `packed`; returns both folders.
fn both(dir: &Path, packed: &str, toml: &dyn Fn(&str) -> String) -> (PathBuf, PathBuf) {
    let mut out = Vec::new();
    let h5 = format!("kind = \"hdf5\"\nhdf5_layout = \"packed\"\n{packed}");
    for (name, sink) in [("evb", "kind = \"file\""), ("packed", h5.as_str())] {
        let folder = dir.join(name);
        let sink = format!("[sink]\n{sink}\ndir = {:?}\n", folder.display().to_string());
        let (o, _) = evb_run_in(dir, &toml(&sink));
        assert!(o.status.success(), "{name}: {}", text(&o));
        out.push(folder);
    }
    let packed = out.pop().unwrap();
    (out.pop().unwrap(), packed)
}

/// Every file's metadata names the packed layout; how many files.
fn metadata_says_packed(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".h5.json") && !name.starts_with('.') {
            let meta: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            assert_eq!(meta["format"], "evb-hdf5-packed", "{name}");
            assert_eq!(meta["version"], 1, "{name}");
            n += 1;
        }
    }
    n
}

/// Generated events of three sources with log-normal sizes, stored and deflated: every byte
/// against the generator's pattern and against the `.evb` run of the same seed; a byte
/// changed in a file is found.
#[test]
fn generated_events_packed_read_by_h5py_byte_for_byte() {
    let Some(py) = common::python_with_h5py() else {
        return;
    };
    for deflate in [0, 3] {
        let d = out_dir();
        let base = common::free_base_port(12);
        let (evb, packed) = both(
            d.path(),
            &format!("file_max_events = 300\nhdf5_deflate = {deflate}\n"),
            &|sink| {
                format!(
                    "[run]\nid = \"packed7\"\nevents = 900\nduration_s = 0\nseed = 5\n\
                     [topology]\nrus = 3\nbus = 2\nbase_port = {base}\n\
                     [control]\nbase_port = {}\n\
                     [fragments]\nsize = 2000\ndistribution = \"lognormal\"\nstddev = 1500\n\
                     {sink}",
                    base + 8
                )
            },
        );
        let flag: &[&str] = if deflate > 0 { &["--deflate"] } else { &[] };
        let evb_arg = evb.display().to_string();
        for args in [vec!["--seed", "5"], vec!["--against", evb_arg.as_str()]] {
            let args: Vec<&str> = args.into_iter().chain(flag.iter().copied()).collect();
            let r = check(&py, &packed, &args);
            assert_eq!(r["problems"], 0, "deflate {deflate} {args:?}: {r}");
            assert_eq!(r["events"], 900, "{r}");
            assert_eq!(r["ids"], 900, "{r}");
            assert_eq!(r["fragments"], 900 * 3, "{r}");
            if deflate == 0 {
                // the index and the last chunk are all it adds to events of ~6 KB
                let ratio = r["bytes_per_payload_byte"].as_f64().unwrap();
                assert!(ratio < 1.1, "{r}");
            }
        }
        assert!(metadata_says_packed(&packed) >= 4);
        if deflate > 0 {
            continue;
        }
        // the checker is no rubber stamp: one byte of the data changed in one file is found
        let tamper = "import glob, sys, h5py\n\
                      p = sorted(glob.glob(sys.argv[1] + '/*.h5'))[0]\n\
                      f = h5py.File(p, 'r+')\n\
                      f['data'][100] ^= 1\n";
        let o = Command::new(&py)
            .args(["-c", tamper])
            .arg(&packed)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let r = check(&py, &packed, &["--against", &evb_arg]);
        assert!(r["problems"].as_u64().unwrap() >= 1, "{r}");
        let said = r["first_problems"][0].as_str().unwrap();
        assert!(said.contains("CRC32C does not match"), "{r}");
    }
}

/// The recorded CMS files (`data/cms`), 4,685 events of two FEDs, byte for byte
/// against the same run written as `.evb` files; then a copy with one fragment damaged
/// (`on_error = "drop"`): its event is partial, the fragment a MISSING placeholder, in both.
#[test]
fn real_cms_data_packed_equals_the_evb_files() {
    let Some(py) = common::python_with_h5py() else {
        return;
    };
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/cms");
    let a = data.join("csc_00307511_EmuRUI01_Local_000.raw");
    let b = data.join("csc_00307511_EmuRUI03_Local_000.raw");
    assert!(
        a.exists() && b.exists(),
        "the recorded CMS data is part of the repository (data/cms, its README): {} lacks it",
        data.display()
    );
    let d = out_dir();
    // a copy of the first file with a byte of its first fragment's payload changed
    let damaged = d.path().join("damaged.raw");
    let mut bytes = std::fs::read(&a).unwrap();
    bytes[40] ^= 0xff;
    std::fs::write(&damaged, bytes).unwrap();
    for (first, events, partial) in [(&a, 4685, 0), (&damaged, 4685, 1)] {
        let run = d.path().join(if partial > 0 { "damaged" } else { "whole" });
        std::fs::create_dir_all(&run).unwrap();
        let (evb, packed) = both(&run, "file_max_events = 1000\n", &|sink| {
            format!(
                "[run]\nid = \"307511\"\nduration_s = 0\n\
                 [source]\nkind = \"fed\"\non_error = \"drop\"\n\
                 [topology]\nbus = 2\n{sink}\
                 [[ru]]\nid = \"ru0\"\nsource_id = 841\nfiles = [{:?}]\n\
                 [[ru]]\nid = \"ru1\"\nsource_id = 843\nfiles = [{:?}]\n",
                first.display().to_string(),
                b.display().to_string()
            )
        });
        let r = check(&py, &packed, &["--against", &evb.display().to_string()]);
        assert_eq!(r["problems"], 0, "{r}");
        assert_eq!(r["events"], events, "{r}");
        assert_eq!(r["fragments"], events * 2, "{r}");
        assert_eq!(r["partial"], partial, "{r}");
        assert_eq!(r["missing"], partial, "{r}");
    }
}

/// A full disk holds the packed sink's events back as for the other layouts: the sink writes
/// only what the disk has room for (its batch and index counted), and a consumer that takes
/// files away lets the run go on. No event is lost and every file is whole.
#[test]
fn a_full_disk_holds_packed_events_back_and_loses_nothing() {
    let Some(py) = common::python_with_h5py() else {
        return;
    };
    let d = out_dir();
    let mnt = d.path().join("small");
    let taken = d.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    let Some(_mounted) = common::Tmpfs::mount(&mnt, "3m") else {
        return;
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // a slow consumer: every 300 ms it moves the published files (data, then metadata) away
    let consumer = {
        let (mnt, taken, stop) = (mnt.clone(), taken.clone(), stop.clone());
        std::thread::spawn(move || loop {
            let done = stop.load(std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(300));
            for e in std::fs::read_dir(&mnt).unwrap() {
                let name = e.unwrap().file_name().to_string_lossy().into_owned();
                if name.ends_with(".h5.json") && !name.starts_with('.') {
                    let data = name.trim_end_matches(".json");
                    std::fs::copy(mnt.join(data), taken.join(data)).unwrap();
                    std::fs::copy(mnt.join(&name), taken.join(&name)).unwrap();
                    std::fs::remove_file(mnt.join(data)).unwrap();
                    std::fs::remove_file(mnt.join(&name)).unwrap();
                }
            }
            if done {
                return;
            }
        })
    };
    let toml = format!(
        "[run]\nid = \"full\"\nevents = 400\nduration_s = 0\nstall_timeout_s = 30\n\
         [fragments]\nsize = 20000\n[topology]\nbus = 1\n[builder]\ncredits = 4\n\
         [sink]\nkind = \"hdf5\"\nhdf5_layout = \"packed\"\ndir = {:?}\nfile_max_events = 10\n",
        mnt.display().to_string()
    );
    let (o, s) = evb_run_in(d.path(), &toml);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    consumer.join().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let stalls = s["nodes"]["bu0"]["sink"]["stalls"].as_u64().unwrap();
    assert!(stalls > 0, "the disk never filled: the test proves nothing");
    let r = check(&py, &taken, &["--seed", "1"]);
    assert_eq!(r["problems"], 0, "{r}");
    assert_eq!(r["events"], 400, "{r}");
    assert_eq!(r["ids"], 400, "{r}");
}

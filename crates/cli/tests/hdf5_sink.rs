//! The HDF5 sink (`sink.kind = "hdf5"`, docs/formats.md §6) through `evb run`, its files read
//! by h5py (a reader no one here wrote) with `tests/outside/check_hdf5.py`: every generated
//! byte against the generator's pattern, and the real CMS files' 4,685 events byte for byte
//! against the same run written as `.evb` files. Without the `hdf5` feature the sink is
//! refused by name.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

#[cfg(feature = "hdf5")]
use common::{evb_run_in, out_dir, text};

/// check_hdf5.py's verdict on the HDF5 files in `dir`.
#[cfg_attr(not(feature = "hdf5"), allow(dead_code))]
fn h5py_check(py: &Path, dir: &Path, args: &[&str]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/outside/check_hdf5.py");
    let o = Command::new(py)
        .arg(&script)
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Every published `.h5` file's size and CRC32C agree with its metadata.
#[cfg_attr(not(feature = "hdf5"), allow(dead_code))]
fn metadata_true(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') || !name.ends_with(".h5") {
            continue;
        }
        let meta: Value =
            serde_json::from_slice(&std::fs::read(format!("{}.json", p.display())).unwrap())
                .unwrap();
        let data = std::fs::read(&p).unwrap();
        assert_eq!(meta["format"], "evb-hdf5", "{name}");
        assert_eq!(meta["bytes"], data.len() as u64, "{name}");
        assert_eq!(meta["crc32c"], crc32c::crc32c(&data), "{name}");
        n += 1;
    }
    n
}

#[cfg(feature = "hdf5")]
#[test]
fn generated_events_in_hdf5_read_by_h5py_byte_for_byte() {
    let Some(py) = common::python_with_h5py() else {
        return;
    };
    // stored, and deflated with log-normal sizes (a chunk per fragment)
    for (fragments, deflate, files) in [
        ("size = 3000", 0, 6),
        (
            "size = 3000\ndistribution = \"lognormal\"\nstddev = 2000",
            6,
            6,
        ),
    ] {
        let d = out_dir();
        let out = d.path().join("out");
        let base = common::free_base_port(12);
        let toml = format!(
            "[run]\nid = \"h5\"\nevents = 1200\nduration_s = 0\nseed = 77\n\
             [topology]\nrus = 3\nbus = 2\nbase_port = {base}\n[control]\nbase_port = {}\n\
             [fragments]\n{fragments}\n[sink]\nkind = \"hdf5\"\ndir = \"{}\"\n\
             file_max_events = 250\nhdf5_deflate = {deflate}\n",
            base + 8,
            out.display()
        );
        let (o, s) = evb_run_in(d.path(), &toml);
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(s["nodes"]["bu0"]["sink"]["kind"], "hdf5", "{s}");
        let r = h5py_check(&py, &out, &["--seed", "77"]);
        assert_eq!(r["problems"], 0, "deflate {deflate}: {r}");
        assert_eq!(r["events"], 1200, "{r}");
        assert_eq!(r["ids"], 1200, "{r}");
        assert!(r["files"].as_u64().unwrap() >= files, "{r}");
        assert_eq!(metadata_true(&out) as u64, r["files"].as_u64().unwrap());
        // the checker is no rubber stamp: the wrong seed fails every fragment
        let wrong = h5py_check(&py, &out, &["--seed", "78"]);
        assert_eq!(wrong["problems"], 1200 * 3, "{wrong}");
    }
}

/// Time slices into HDF5: the files say `record_type = "slice"`, each source's dataset of
/// record k is its window fragment of slice k (docs/formats.md §6, §8), and the record's
/// `Windows` table and each source's `Frames` index say the window and where every frame's
/// payload lies (its frame header just before it), read by h5py.
#[cfg(feature = "hdf5")]
#[test]
fn time_slices_in_hdf5_say_so_and_hold_their_windows() {
    let Some(py) = common::python_with_h5py() else {
        return;
    };
    let d = out_dir();
    let out = d.path().join("out");
    let base = common::free_base_port(12);
    let toml = format!(
        "[run]\nid = \"h5t\"\nevents = 300\nduration_s = 0\n\
         [topology]\nrus = 2\nbus = 2\nbase_port = {base}\n[control]\nbase_port = {}\n\
         [builder]\nby = \"time\"\nslice_ticks = 9000\noverlap_ticks = 1000\n\
         [frames]\nticks = 1000\nsize = 100\n\
         [sink]\nkind = \"hdf5\"\ndir = \"{}\"\nfile_max_events = 100\n",
        base + 6,
        out.display()
    );
    let (o, _) = evb_run_in(d.path(), &toml);
    assert!(o.status.success(), "{}", text(&o));
    let script = r#"
import glob, struct, sys, h5py
records = 0
for path in glob.glob(sys.argv[1] + "/*.h5"):
    with h5py.File(path, "r") as f:
        assert f.attrs["record_type"] == "slice", f.attrs["record_type"]
        for name, g in f.items():
            if not name.startswith("Event"):
                continue
            k = int(g.attrs["event_id"])
            want = (k * 9000, k * 9000 + 10000, k * 9000 + 9000)
            for sid in (0, 1):
                b = bytes(g["Source%05d" % sid][()])
                begin, end, core_end, status = struct.unpack_from("<QQQH", b)
                assert (begin, end, core_end, status) == want + (0,), (k, sid)
            rows = [tuple(int(x) for x in r) for r in g["Windows"][()]]
            assert rows == [(sid, sid, 0) + want + (10,) for sid in (0, 1)], (k, rows)
            for sid in (0, 1):
                b = bytes(g["Source%05d" % sid][()])
                frames = g["Frames%05d" % sid][()]
                assert len(frames) == 10, (k, sid, len(frames))
                for j, (fb, fe, off, n) in enumerate(frames):
                    assert (int(fb), int(fe)) == (k * 9000 + 1000 * j, k * 9000 + 1000 * (j + 1))
                    hb, he, hs = struct.unpack_from("<QQH", b, int(off) - 24)
                    assert (hb, he, hs) == (fb, fe, sid) and int(off) + int(n) <= len(b)
            records += 1
print(records)
"#;
    let r = Command::new(&py)
        .args(["-c", script])
        .arg(&out)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "300");
}

#[cfg(feature = "hdf5")]
#[test]
fn real_cms_data_in_hdf5_equals_the_evb_files_4685_events() {
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
    let run = |kind: &str, extra: &str| -> std::path::PathBuf {
        let out = d.path().join(kind);
        let toml = format!(
            "[run]\nid = \"cms\"\nduration_s = 0\n[source]\nkind = \"fed\"\n\
             [topology]\nbus = 2\n[sink]\nkind = \"{kind}\"\ndir = {:?}\n{extra}\n\
             [[ru]]\nid = \"ru0\"\nsource_id = 841\nfiles = [{:?}]\n\
             [[ru]]\nid = \"ru1\"\nsource_id = 843\nfiles = [{:?}]\n",
            out.display().to_string(),
            a.display().to_string(),
            b.display().to_string()
        );
        let (o, s) = evb_run_in(d.path(), &toml);
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(s["run"]["evm"]["triggered"], 4685);
        out
    };
    let evb = run("file", "");
    let h5 = run("hdf5", "hdf5_deflate = 4\nfile_max_events = 1000");
    let r = h5py_check(&py, &h5, &["--against", &evb.display().to_string()]);
    assert_eq!(r["problems"], 0, "{r}");
    assert_eq!(r["events"], 4685, "{r}");
    assert_eq!(r["ids"], 4685, "{r}");
    assert!(metadata_true(&h5) >= 5);
}

/// A build without HDF5 refuses the sink by its key, before any process starts.
#[cfg(not(feature = "hdf5"))]
#[test]
fn without_the_feature_the_hdf5_sink_is_refused_by_name() {
    let d = common::out_dir();
    let cfg = d.path().join("c.toml");
    std::fs::write(&cfg, "[sink]\nkind = \"hdf5\"\ndir = \"/tmp/x\"\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_evb"))
        .args(["config", "check"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("sink.kind") && err.contains("--features hdf5"),
        "{err}"
    );
}

/// A full disk holds the HDF5 sink's events back, as for `.evb` files: the sink writes only
/// what the disk has room for, and a consumer that takes files away lets the run go on. No
/// event is lost and every file is whole.
#[cfg(feature = "hdf5")]
#[test]
fn a_full_disk_holds_hdf5_events_back_and_loses_nothing() {
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
         [sink]\nkind = \"hdf5\"\ndir = {:?}\nfile_max_events = 10\n",
        mnt.display().to_string()
    );
    let (o, s) = evb_run_in(d.path(), &toml);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    consumer.join().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let stalls = s["nodes"]["bu0"]["sink"]["stalls"].as_u64().unwrap();
    assert!(stalls > 0, "the disk never filled: the test proves nothing");
    let r = h5py_check(&py, &taken, &["--seed", "1"]);
    assert_eq!(r["problems"], 0, "{r}");
    assert_eq!(r["events"], 400, "{r}");
    assert_eq!(r["ids"], 400, "{r}");
}

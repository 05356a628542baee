//! The HDF5 sink in DUNE's layout (`sink.hdf5_layout = "dune"`, docs/formats.md §11)
//! through `evb run`, its files read by `tests/outside/check_dune.py`, a reader written with
//! h5py and struct from DUNE's published layout alone, each fragment compared byte for
//! byte with the same data written as `.evb` files by a second run: triggered events (the
//! generator's, and the recorded CMS files where `data/cms` has them), time
//! slices, and decision windows with EMPTY and MISSING components.
#![cfg(feature = "hdf5")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{evb_run_in, out_dir, text};
use serde_json::Value;

/// check_dune.py's verdict on the DUNE files in `dune` against the `.evb` files in `evb`.
fn check(py: &Path, dune: &Path, evb: &Path) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/outside/check_dune.py");
    let o = Command::new(py)
        .arg(&script)
        .arg(dune)
        .arg("--against")
        .arg(evb)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Runs `toml` (a format string's result with `{sink}` for the sink's lines) twice in
/// `dir`: into `.evb` files and into DUNE's HDF5; returns both folders.
fn both(dir: &Path, toml: &dyn Fn(&str) -> String) -> (PathBuf, PathBuf) {
    let mut out = Vec::new();
    for (name, sink) in [
        ("evb", "kind = \"file\""),
        (
            "dune",
            "kind = \"hdf5\"\nhdf5_layout = \"dune\"\nfile_max_events = 400",
        ),
    ] {
        let folder = dir.join(name);
        let sink = format!("[sink]\n{sink}\ndir = {:?}\n", folder.display().to_string());
        let (o, _) = evb_run_in(dir, &toml(&sink));
        assert!(o.status.success(), "{name}: {}", text(&o));
        out.push(folder);
    }
    let dune = out.pop().unwrap();
    (out.pop().unwrap(), dune)
}

/// Every file's metadata names DUNE's layout.
fn metadata_says_dune(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".h5.json") && !name.starts_with('.') {
            let meta: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            assert_eq!(meta["format"], "dune-hdf5", "{name}");
            assert_eq!(meta["version"], 5, "{name}");
            n += 1;
        }
    }
    n
}

#[test]
fn triggered_events_are_dune_trigger_records_byte_for_byte() {
    let Some(py) = common::python_with_h5py() else {
        return;
    };
    let d = out_dir();
    let base = common::free_base_port(12);
    let (evb, dune) = both(d.path(), &|sink| {
        format!(
            "[run]\nid = \"dune7\"\nevents = 900\nduration_s = 0\nseed = 5\n\
             [topology]\nrus = 3\nbus = 2\nbase_port = {base}\n[control]\nbase_port = {}\n\
             [fragments]\nsize = 2000\ndistribution = \"lognormal\"\nstddev = 1500\n{sink}",
            base + 8
        )
    });
    let r = check(&py, &dune, &evb);
    assert_eq!(r["problems"], 0, "{r}");
    assert_eq!(r["records"], 900, "{r}");
    assert_eq!(r["fragments"], 900 * 3, "{r}");
    assert!(metadata_says_dune(&dune) >= 3);
    // the checker is no rubber stamp: one payload byte changed in one file is found
    let tamper = "import glob, sys, h5py\n\
                  p = sorted(glob.glob(sys.argv[1] + '/*.h5'))[0]\n\
                  f = h5py.File(p, 'r+')\n\
                  g = f[sorted(f.keys())[0]]['RawData']\n\
                  n = [k for k in g.keys() if k.startswith('Detector') and g[k].shape[0] > 72][0]\n\
                  a = g[n][()]\n\
                  a[72, 0] ^= 1\n\
                  g[n][...] = a\n";
    let o = Command::new(&py)
        .args(["-c", tamper])
        .arg(&dune)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = check(&py, &dune, &evb);
    assert_eq!(r["problems"], 1, "{r}");
    let said = r["first_problems"][0].as_str().unwrap();
    assert!(said.contains("payload differs"), "{r}");
}

/// Time slices of two streams with overlap: `TimeSliceNNNNNN` records, each source's window
/// fragment behind its FragmentHeader.
#[test]
fn time_slices_are_dune_time_slices_byte_for_byte() {
    let Some(py) = common::python_with_h5py() else {
        return;
    };
    let d = out_dir();
    let base = common::free_base_port(12);
    let (evb, dune) = both(d.path(), &|sink| {
        format!(
            "[run]\nid = \"slices\"\nevents = 300\nduration_s = 0\n\
             [topology]\nrus = 2\nbus = 2\nbase_port = {base}\n[control]\nbase_port = {}\n\
             [builder]\nby = \"time\"\nslice_ticks = 9000\noverlap_ticks = 1000\n\
             [frames]\nticks = 1000\nsize = 100\n{sink}",
            base + 6
        )
    });
    let r = check(&py, &dune, &evb);
    assert_eq!(r["problems"], 0, "{r}");
    assert_eq!(r["records"], 300, "{r}");
    assert_eq!(r["fragments"], 600, "{r}");
    let script = "import glob, sys, h5py\n\
                  for p in glob.glob(sys.argv[1] + '/*.h5'):\n\
                  \x20   f = h5py.File(p, 'r')\n\
                  \x20   assert f.attrs['record_type'] == 'TimeSlice', p\n\
                  \x20   assert all(k.startswith('TimeSlice') for k in f.keys()), p\n";
    let o = Command::new(&py)
        .args(["-c", script])
        .arg(&dune)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Decision windows from a file: most 300 ms behind their decision, well within the 1 s
/// buffers and far from the nodes' clock skew (complete), every 10th naming
/// source 1 only (source 0's EMPTY: not requested, no dataset), and once the run is 1.3 s
/// old every 10th over the first frame, long evicted (MISSING: kDataNotFound, the record
/// incomplete). The statuses do not depend on timing, so the two runs agree byte for byte.
#[test]
fn decision_windows_are_trigger_records_with_empty_and_missing_components() {
    let Some(py) = common::python_with_h5py() else {
        return;
    };
    let d = out_dir();
    const DECISIONS: i64 = 1500;
    let mut lines = String::new();
    for k in 0..DECISIONS {
        let at = 1000 * k;
        let (begin, end, named) = match k % 10 {
            5 => (at - 300_000, at - 290_000, " 1"),
            3 if k >= 1300 => (0, 1000, ""),
            _ => (at - 300_000, at - 290_000, ""),
        };
        lines += &format!("{} {}{named}\n", begin.max(0), end.max(1));
    }
    let decisions = d.path().join("decisions.txt");
    std::fs::write(&decisions, &lines).unwrap();
    let base = common::free_base_port(12);
    let (evb, dune) = both(d.path(), &|sink| {
        format!(
            "[run]\nid = \"decided\"\nevents = {DECISIONS}\nduration_s = 0\nrate_hz = 1000\n\
             [topology]\nrus = 2\nbus = 2\nbase_port = {base}\n[control]\nbase_port = {}\n\
             [builder]\nby = \"window\"\n[frames]\nticks = 1000\nsize = 64\n\
             [windows]\ntick_hz = 1000000\nbuffer_ms = 1000\nwait_ms = 10\n\
             decisions = {:?}\n{sink}",
            base + 6,
            decisions.display().to_string()
        )
    });
    let r = check(&py, &dune, &evb);
    assert_eq!(r["problems"], 0, "{r}");
    assert_eq!(r["records"], DECISIONS, "{r}");
    let empty = (0..DECISIONS).filter(|k| k % 10 == 5).count() as u64;
    assert_eq!(r["empty"], empty, "{r}");
    assert_eq!(r["fragments"], 2 * DECISIONS as u64 - empty, "{r}");
    let evicted = (1300..DECISIONS).filter(|k| k % 10 == 3).count() as u64 * 2;
    assert_eq!(r["missing"], evicted, "{r}");
}

/// The recorded CMS files (`data/cms`), 4,685 events of two FEDs, as DUNE trigger
/// records, byte for byte against the same run written as `.evb` files.
#[test]
fn real_cms_data_as_dune_trigger_records_equals_the_evb_files() {
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
    let (evb, dune) = both(d.path(), &|sink| {
        format!(
            "[run]\nid = \"307511\"\nduration_s = 0\n[source]\nkind = \"fed\"\n\
             [topology]\nbus = 2\n{sink}\
             [[ru]]\nid = \"ru0\"\nsource_id = 841\nfiles = [{:?}]\n\
             [[ru]]\nid = \"ru1\"\nsource_id = 843\nfiles = [{:?}]\n",
            a.display().to_string(),
            b.display().to_string()
        )
    });
    let r = check(&py, &dune, &evb);
    assert_eq!(r["problems"], 0, "{r}");
    assert_eq!(r["records"], 4685, "{r}");
    assert_eq!(r["fragments"], 4685 * 2, "{r}");
    // the run number is the run id's
    let o = Command::new(&py)
        .args([
            "-c",
            "import glob, sys, h5py\n\
             assert {int(h5py.File(p, 'r').attrs['run_number']) \
             for p in glob.glob(sys.argv[1] + '/*.h5')} == {307511}",
        ])
        .arg(&dune)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

//! A BU killed mid-run with each sink and layout (issue 67, "Faults as before"): `evb run`
//! with 2 RUs and 2 BUs, bu1 killed once the run has triggered 1,500 events; the run ends
//! OK (its events rebuilt at bu0), and `evb inspect --run` judges the folder complete — every
//! triggered event in exactly one intact published file — for the zstd file sink and, built
//! with HDF5, for the three HDF5 layouts (evb, packed, dune). The packed files are also read
//! by the outside reader (`check_packed.py`), which counts each id once.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{free_base_port, out_dir, pids_with, signal, triggered_at_least, wait_node, EVB};

const EVENTS: u64 = 8000;

/// Runs `sink` (its lines after `[sink]`, without `dir`) under `evb run`, kills bu1 mid-run,
/// and returns the output folder once `evb run` said VERDICT OK and `inspect --run` judged
/// the folder complete.
fn kill_a_bu_with(dir: &Path, sink: &str) -> std::path::PathBuf {
    let cfg = dir.join("run.toml");
    let out = dir.join("out");
    let cbase = free_base_port(5);
    std::fs::write(
        &cfg,
        format!(
            "[run]\nid = \"sinkfault\"\nevents = {EVENTS}\nduration_s = 0\nrate_hz = 2000\n\
             records_dir = {:?}\n[fragments]\nsize = 4096\n[topology]\nrus = 2\nbus = 2\n\
             [control]\nbase_port = {cbase}\n\
             [sink]\n{sink}\ndir = {:?}\nfile_max_events = 500\n",
            dir.join("records").display().to_string(),
            out.display().to_string()
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
    // `evb run` tags its nodes' command lines with its own pid
    let marker = format!("evb-run-{}-", l.id());
    wait_node(
        &format!("127.0.0.1:{cbase}"),
        "1,500 events triggered (the EVM's status)",
        60,
        || match l.try_wait() {
            Ok(Some(st)) => Some(format!("evb run ended ({st})")),
            _ => None,
        },
        |line| triggered_at_least(line, 1500),
    );
    let bu1 = pids_with(&marker, "--id bu1 ");
    assert_eq!(bu1.len(), 1, "bu1's process: {bu1:?}");
    signal(bu1[0] as u64, "-9");
    let o = l.wait_with_output().unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{text}");
    assert!(text.contains("VERDICT: OK"), "{text}");
    assert!(
        text.contains("bu1") || text.contains("bu[1]"),
        "no word of the loss: {text}"
    );
    let j = Command::new(EVB)
        .args(["inspect", "--run"])
        .arg(&out)
        .output()
        .unwrap();
    let judged = String::from_utf8_lossy(&j.stdout);
    assert!(
        j.status.success(),
        "{judged}\n{}",
        String::from_utf8_lossy(&j.stderr)
    );
    assert!(
        judged.contains("complete") && judged.contains(&format!("{EVENTS} triggered")),
        "{judged}"
    );
    out
}

#[test]
fn a_bu_killed_mid_run_with_the_zstd_file_sink_leaves_every_event_in_one_file() {
    let d = out_dir();
    kill_a_bu_with(d.path(), "kind = \"file\"\ncompress = \"zstd\"");
}

#[cfg(feature = "hdf5")]
#[test]
fn a_bu_killed_mid_run_with_each_hdf5_layout_leaves_every_event_in_one_file() {
    for layout in ["evb", "packed", "dune"] {
        let d = out_dir();
        let out = kill_a_bu_with(
            d.path(),
            &format!("kind = \"hdf5\"\nhdf5_layout = \"{layout}\""),
        );
        if layout != "packed" {
            continue;
        }
        let Some(py) = common::python_with_h5py() else {
            continue;
        };
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/outside/check_packed.py");
        let o = Command::new(&py).arg(&script).arg(&out).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["problems"], 0, "{r}");
        assert_eq!(r["ids"], EVENTS, "{r}");
    }
}

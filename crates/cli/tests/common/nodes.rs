//! Runs with some nodes as `evb node` processes and the others plugged into the test (or
//! into programs it starts): configuration, processes, the EVM's report, the files written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use evb_formats::events::EventFile;
use evb_plugin::Config;
use serde_json::Value;

use super::{free_base_port, EVB};

/// The payload the producer writes for event `k` (sizes 0 to 3,999 bytes).
pub fn payload(k: u64) -> Vec<u8> {
    let size = (k * 397 % 4000) as usize;
    (0..size)
        .map(|i| (k as usize).wrapping_mul(131).wrapping_add(i * 7) as u8)
        .collect()
}

pub struct Run {
    pub dir: tempfile::TempDir,
    pub cfg: PathBuf,
    pub kids: BTreeMap<String, Child>,
}

impl Run {
    /// Writes the configuration (the topology's ports found free) and starts `procs` as
    /// `evb node` processes.
    pub fn start(toml: &str, procs: &[&str]) -> Run {
        let dir = super::out_dir();
        let cfg = dir.path().join("run.toml");
        let base = free_base_port(8);
        let ports = format!("[topology]\nbase_port = {base}\n");
        let toml = if toml.contains("[topology]\n") {
            toml.replace("[topology]\n", &ports)
        } else {
            format!("{toml}\n{ports}")
        };
        std::fs::write(&cfg, toml).unwrap();
        let mut run = Run {
            dir,
            cfg,
            kids: BTreeMap::new(),
        };
        for id in procs {
            let child = Command::new(EVB)
                .args(["node", "--json", "-", "--id", id, "--config"])
                .arg(&run.cfg)
                .current_dir(run.dir.path())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            run.kids.insert(id.to_string(), child);
        }
        run
    }

    pub fn config(&self) -> Config {
        Config::from_file(&self.cfg).unwrap()
    }

    /// Waits for every process; returns the EVM's report (it must have exited cleanly, and
    /// every other node too).
    pub fn evm_report(&mut self) -> Value {
        self.evm_report_allowing(&[])
    }

    /// Like `evm_report`, where the nodes `may_fail` may exit non-zero (a degraded verdict).
    pub fn evm_report_allowing(&mut self, may_fail: &[&str]) -> Value {
        let mut evm = Value::Null;
        for (id, c) in std::mem::take(&mut self.kids) {
            let out = c.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() || may_fail.contains(&id.as_str()),
                "{id} failed:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            if id == "evm" {
                evm = serde_json::from_str(&stdout).unwrap();
            }
        }
        evm
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        for c in self.kids.values_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Every event in the `.evb` files of `dir`, by id: (trigger number, flags, fragments).
pub fn events_in(dir: &Path) -> BTreeMap<u64, (u32, u16, Vec<Vec<u8>>)> {
    let mut all = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "evb") {
            continue;
        }
        for ev in EventFile::open(&p).unwrap() {
            let ev = ev.unwrap();
            let frags = ev.fragments.into_iter().map(|(_, b)| b).collect();
            assert!(
                all.insert(ev.event_id, (ev.trigger_number, ev.flags, frags))
                    .is_none(),
                "event {} written twice",
                ev.event_id
            );
        }
    }
    all
}

pub fn assert_verdict_ok(report: &Value, events: u64) {
    assert_eq!(report["ok"], true, "{report}");
    let run = &report["run"];
    assert_eq!(run["evm"]["triggered"], events, "{run}");
    assert_eq!(run["evm"]["released"], events);
    // the verdict lists what does not add up: nothing
    assert_eq!(
        report["verdict"],
        serde_json::json!([]),
        "{}",
        report["verdict"]
    );
    for b in run["bus"].as_array().unwrap() {
        assert_eq!(b["crc_errors"], 0);
        assert_eq!(b["duplicate_fragments"], 0);
    }
}

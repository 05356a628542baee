//! Helpers shared by the process tests: run `evb` and read what it reports.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

pub const EVB: &str = env!("CARGO_BIN_EXE_evb");

/// Writes `toml` to `dir/run.toml`, runs `evb run --quiet --json` on it; returns the process
/// output and the JSON summary (`Null` if none was written).
pub fn evb_run_in(dir: &Path, toml: &str) -> (Output, Value) {
    let cfg = dir.join("run.toml");
    std::fs::write(&cfg, toml).unwrap();
    let json = dir.join("summary.json");
    let _ = std::fs::remove_file(&json);
    let out = Command::new(EVB)
        .args(["run", "--quiet", "--config"])
        .arg(&cfg)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let summary = std::fs::read_to_string(&json)
        .map(|s| serde_json::from_str(&s).unwrap())
        .unwrap_or(Value::Null);
    (out, summary)
}

/// Like `evb_run_in`, in a temporary folder of its own.
pub fn evb_run(toml: &str) -> (Output, Value) {
    let dir = tempfile::tempdir().unwrap();
    evb_run_in(dir.path(), toml)
}

/// `n` consecutive free loopback ports (best effort: bound together, then released).
pub fn free_base_port(n: u16) -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = l.local_addr().unwrap().port();
        drop(l);
        if base > 65000 {
            continue;
        }
        let held: Vec<_> = (0..n)
            .filter_map(|k| std::net::TcpListener::bind(("127.0.0.1", base + k)).ok())
            .collect();
        if held.len() == n as usize {
            return base;
        }
    }
}

/// stdout and stderr together, for failure messages.
pub fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

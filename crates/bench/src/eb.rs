//! The event builder itself: a whole `evb run` (EVM, RUs and BUs as processes over tcp),
//! launched as a child of this process (`evb run --json ... --quiet --config ...`).

use std::process::{Command, Stdio};

use serde_json::Value;

use crate::measure::Point;

#[derive(Debug, Clone)]
pub struct BuildSpec {
    pub rus: u32,
    pub bus: u32,
    /// payload bytes per fragment (the mean for lognormal)
    pub fragment: u64,
    pub lognormal: bool,
    /// "headers", "crc" or "full"
    pub verify: &'static str,
    /// generator content: "static" (made once: the builder alone) or "unique"
    pub content: &'static str,
    /// RUs on one CPU, BUs on another (`[affinity]`), the EVM anywhere
    pub pin: Option<(usize, usize)>,
    pub seconds: f64,
}

impl BuildSpec {
    pub fn variant(&self) -> String {
        format!(
            "{} {} verify={}{}",
            if self.lognormal { "lognormal" } else { "fixed" },
            self.content,
            self.verify,
            if self.pin.is_some() { " pinned" } else { "" }
        )
    }

    fn toml(&self, run_id: &str) -> String {
        let mut affinity = String::new();
        if let Some((ru_cpu, bu_cpu)) = self.pin {
            affinity.push_str("\n[affinity]\n");
            for i in 0..self.rus {
                affinity.push_str(&format!("ru{i} = [{ru_cpu}]\n"));
            }
            for i in 0..self.bus {
                affinity.push_str(&format!("bu{i} = [{bu_cpu}]\n"));
            }
        }
        let base = format!(
            r#"[run]
id = "{run_id}"
duration_s = {secs}
stall_timeout_s = 20.0

[fragments]
size = {size}
distribution = "{dist}"
content = "{content}"

[builder]
verify = "{verify}"

[transport]
kind = "tcp"

[topology]
rus = {rus}
bus = {bus}
host = "127.0.0.1"
"#,
            secs = self.seconds,
            size = self.fragment,
            dist = if self.lognormal { "lognormal" } else { "fixed" },
            verify = self.verify,
            content = self.content,
            rus = self.rus,
            bus = self.bus,
        );
        base + &affinity
    }
}

/// Runs one event-building run and reads its JSON summary.
pub fn build(spec: &BuildSpec, scratch: &std::path::Path) -> Result<Point, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find evb itself: {e}"))?;
    let tag = format!("build-{}-{}", std::process::id(), spec.fragment);
    let cfg_path = scratch.join(format!("{tag}.toml"));
    let json_path = scratch.join(format!("{tag}.json"));
    std::fs::write(&cfg_path, spec.toml(&tag)).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&json_path);
    let out = Command::new(&exe)
        .arg("run")
        .arg("--quiet")
        .arg("--json")
        .arg(&json_path)
        .arg("--config")
        .arg(&cfg_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let text = std::fs::read_to_string(&json_path).map_err(|e| {
        format!(
            "evb run wrote no summary ({e}); exit {:?}; stderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        )
    })?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("summary: {e}"))?;
    if v["ok"] != Value::Bool(true) {
        return Err(format!("evb run failed: {}", v["problems"]));
    }
    let run = &v["run"];
    let secs = run["seconds"]
        .as_f64()
        .ok_or("summary has no run.seconds")?;
    let events = run["evm"]["triggered"]
        .as_u64()
        .ok_or("summary has no run.evm.triggered")?;
    let bytes: u64 = run["bus"]
        .as_array()
        .ok_or("summary has no run.bus")?
        .iter()
        .map(|b| b["payload_bytes_built"].as_u64().unwrap_or(0))
        .sum();
    let _ = std::fs::remove_file(&cfg_path);
    let mut p = Point::new("build", "evb", "tcp", &spec.variant(), spec.fragment);
    p.senders = spec.rus;
    p.receivers = spec.bus;
    p.msgs_per_s = events as f64 / secs;
    p.gb_per_s = bytes as f64 / secs / 1e9;
    p.note = format!("{events} events in {secs:.2} s; msgs_per_s is events/s");
    Ok(p)
}

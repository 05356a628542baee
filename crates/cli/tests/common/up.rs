//! `evb up` driven from a test: start, status, commands, `evb ctl`, halt.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use evb_control::client::Api;
use serde_json::{json, Value};

use super::EVB;

/// The configuration with a run id of its own when it sets none: `evb up` refuses a second
/// system of a run id whose control answers, and the tests of one binary run side by side.
fn own_run_id(toml: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let default_id = evb_config::Config::default().run.id;
    let unset = evb_config::Config::parse_unvalidated(toml).is_ok_and(|c| c.run.id == default_id);
    if !unset {
        return toml.to_string();
    }
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let line = format!("id = \"test-{}-{n}\"\n", std::process::id());
    if toml.contains("[run]\n") {
        toml.replacen("[run]\n", &format!("[run]\n{line}"), 1)
    } else {
        format!("[run]\n{line}{toml}")
    }
}

/// The configuration with run records of its own (`run.records_dir` in `dir`) when it sets
/// none: its runs are numbered from 1 whatever ran before, here or in the user's records.
fn own_records(toml: &str, dir: &Path) -> String {
    let set =
        evb_config::Config::parse_unvalidated(toml).is_ok_and(|c| !c.run.records_dir.is_empty());
    if set {
        return toml.to_string();
    }
    let line = format!("records_dir = \"{}\"\n", dir.join("records").display());
    if toml.contains("[run]\n") {
        toml.replacen("[run]\n", &format!("[run]\n{line}"), 1)
    } else {
        format!("[run]\n{line}{toml}")
    }
}

/// An `evb up` of a configuration, taken down when dropped.
pub struct Up {
    pub child: Child,
    /// What `evb up` printed on stdout so far.
    pub lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    pub url: String,
    pub api: Api,
    pub dir: tempfile::TempDir,
    /// The run's secret, when the configuration sets one (the API's token and `evb ctl`'s
    /// EVB_SECRET come from it).
    pub secret: Option<String>,
}

impl Up {
    pub fn start(toml: &str) -> Up {
        Up::start_with(toml, &[])
    }

    /// `evb up` with options of its own (`--standby`).
    pub fn start_with(toml: &str, args: &[&str]) -> Up {
        let dir = super::out_dir();
        // `{dir}` in the configuration: this system's own folder (for a file sink)
        let toml = toml.replace("{dir}", &dir.path().display().to_string());
        let toml = own_run_id(&toml);
        let toml = own_records(&toml, dir.path());
        let cfg = dir.path().join("run.toml");
        std::fs::write(&cfg, &toml).unwrap();
        let mut child = Command::new(EVB)
            .args(["up", "--config"])
            .arg(&cfg)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let said = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("[evb up] {line}");
                said.lock().unwrap().push(line.clone());
                if let Some(url) = line.strip_prefix("evb up: run page and control API: ") {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("evb up printed its control URL");
        let secret = evb_config::Config::parse_unvalidated(&toml)
            .ok()
            .and_then(|c| c.secret());
        let token = secret
            .as_ref()
            .map(|s| evb_control::control_token(s.as_bytes()));
        let api = Api::new(&url, token);
        Up {
            child,
            lines,
            url,
            api,
            dir,
            secret,
        }
    }

    /// `evb up --standby` of `toml`, once it said that a standby EVM follows.
    pub fn with_standby(toml: &str) -> Up {
        let up = Up::start_with(toml, &["--standby"]);
        up.wait_said("the standby's line", |said| {
            said.iter()
                .any(|l| l.contains("a standby EVM (control API"))
        });
        up
    }

    /// `evb up --standby` of a run of its own id (`evb ctl` finds a moved control by it):
    /// `events` of 4 KiB at `rate_hz`, with a secret and the file sink (this system's
    /// folder's `out`).
    pub fn standby_file_run(id: &str, events: u64, rate_hz: u64) -> Up {
        Up::with_standby(&format!(
            "[run]\nid = \"{id}\"\nevents = {events}\nduration_s = 0\nrate_hz = {rate_hz}\n\
             secret = \"up-standby-7d21c9\"\n[fragments]\nsize = 4096\n\
             [sink]\nkind = \"file\"\ndir = \"{{dir}}/out\"\n"
        ))
    }

    /// Starts the next run and waits (at most 30 s) until `n` of its events are triggered.
    pub fn start_until_triggered(&self, n: u64) {
        let (code, body) = self.post("start", json!({}));
        assert_eq!(code, 200, "{body}");
        self.wait_until(&format!("{n} events triggered"), 30, |s| {
            s["evm"]["triggered"].as_u64().unwrap_or(0) >= n
        });
    }

    /// The pid of the process that is the run control now (its node API says).
    pub fn evm_pid(&self) -> u64 {
        self.api.get("/api/v1/node").unwrap().body["pid"]
            .as_u64()
            .unwrap()
    }

    /// The control API of the standby `evb up` started after the latest takeover, where
    /// the lost EVM was (it says so; waited for up to 30 s).
    pub fn new_standby(&self) -> Api {
        let line = "evb up: a new standby EVM (control API ";
        let said = self.wait_said("the new standby's line", |s| {
            s.iter().any(|l| l.starts_with(line))
        });
        let addr = said
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix(line))
            .map(|l| l.trim_end_matches(") follows the new one").to_string())
            .unwrap();
        Api::new(&addr, self.api.token.clone())
    }

    /// Waits (at most 30 s) until the standby at `standby` follows run `run`; false if the
    /// run is over (or its control says it is neither running nor paused) first.
    pub fn standby_follows(&self, standby: &Api, run: u64) -> bool {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let n = standby
                .get("/api/v1/node")
                .map(|r| r.body)
                .unwrap_or_default();
            if n["phase"] == "running" && n["run"] == run {
                return true;
            }
            let s = self.status();
            if !matches!(s["state"].as_str(), Some("running" | "paused")) {
                return false;
            }
            assert!(
                Instant::now() < until,
                "the new standby never followed run {run}: {n}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The lines `evb up` printed so far (as far as the thread that reads them got).
    pub fn said(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits (at most 10 s) until what `evb up` printed satisfies `f`, and returns it; panics
    /// naming `what` with the lines printed.
    pub fn wait_said(&self, what: &str, mut f: impl FnMut(&[String]) -> bool) -> Vec<String> {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let said = self.said();
            if f(&said) {
                return said;
            }
            assert!(
                Instant::now() < until,
                "evb up never printed {what}: {said:#?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// After the EVM was lost under `evb up --standby`: waits (at most `secs`) until `evb up`
    /// says the standby is the run control, then talks to the new URL it printed (which
    /// must not be `old`'s). Returns the lines printed.
    pub fn follow_takeover(&mut self, secs: u64) -> Vec<String> {
        let old = self.url.clone();
        let until = Instant::now() + Duration::from_secs(secs);
        // the new URL is the line after that one (the two may reach the reader apart); the
        // latest takeover's (a run may see two)
        let (said, url) = loop {
            let said = self.said();
            let url = said
                .iter()
                .rposition(|l| l == "evb up: the standby EVM is the run control now")
                .and_then(|at| {
                    said[at..]
                        .iter()
                        .find_map(|l| l.strip_prefix("evb up: run page and control API: "))
                })
                .map(|u| u.trim().to_string())
                .filter(|u| *u != old);
            if let Some(url) = url {
                break (said, url);
            }
            assert!(
                Instant::now() < until,
                "the standby never took over: {said:#?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_ne!(url, old, "the control URL did not change: {said:#?}");
        self.url = url;
        self.api = Api::new(&self.url, self.api.token.clone());
        said
    }

    /// After the EVM was frozen under `evb up --standby` (and woken): either the standby
    /// took the run over (follows it; true), or the run's verdict came from the EVM before
    /// any takeover (false): the run had ended between the test's look and the freeze, and
    /// no node had a run to follow the standby into. A takeover printed in the 3 s after
    /// such a verdict (three heartbeat timeouts) is still followed. `from`: how many lines
    /// `evb up` had printed before the freeze (an earlier takeover is not this loss's).
    pub fn follow_takeover_unless_ended(&mut self, run: u64, from: usize, secs: u64) -> bool {
        const TAKEOVER: &str = "evb up: the standby EVM is the run control now";
        let verdict = [
            format!("evb up: run {run} complete"),
            format!("evb up: run {run} FAILED"),
        ];
        let until = Instant::now() + Duration::from_secs(secs);
        let mut ended_at: Option<Instant> = None;
        loop {
            let said = self.said();
            let new = &said[from.min(said.len())..];
            let took = new.iter().position(|l| l == TAKEOVER);
            // (the verdict may come before the run control leaves "running": it waits
            // for every node to be done)
            let ended = said
                .iter()
                .position(|l| verdict.iter().any(|v| l.starts_with(v.as_str())));
            match (took, ended) {
                (Some(_), _) => {
                    self.follow_takeover(secs);
                    return true;
                }
                (None, Some(_)) => {
                    let at = *ended_at.get_or_insert_with(Instant::now);
                    if at.elapsed() > Duration::from_secs(3) {
                        return false;
                    }
                }
                (None, None) => {}
            }
            assert!(
                Instant::now() < until,
                "the standby never took over, and the run never ended: {said:#?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn status(&self) -> Value {
        let r = self.api.get("/api/v1/status").unwrap();
        assert_eq!(r.status, 200, "{:?}", r.body);
        r.body
    }

    pub fn post(&self, cmd: &str, body: Value) -> (u16, Value) {
        let r = self.api.post(&format!("/api/v1/{cmd}"), &body).unwrap();
        (r.status, r.body)
    }

    /// `evb ctl ARGS` against this system, as an operator types it.
    pub fn ctl(&self, args: &[&str]) -> Output {
        let mut c = Command::new(EVB);
        c.arg("ctl").args(["--url", &self.url]).args(args);
        if let Some(s) = &self.secret {
            c.env("EVB_SECRET", s);
        }
        c.output().unwrap()
    }

    /// Waits for run `n` to be over (through `evb ctl wait`) and returns its record.
    pub fn wait_run(&self, n: u64) -> Value {
        let out = self.ctl(&[
            "wait",
            "--run",
            &n.to_string(),
            "--timeout",
            "120",
            "--json",
        ]);
        let rec: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        assert!(
            rec.is_object(),
            "no record of run {n}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        rec
    }

    pub fn wait_until(&self, what: &str, secs: u64, mut f: impl FnMut(&Value) -> bool) -> Value {
        let until = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.status();
            if f(&s) {
                return s;
            }
            assert!(Instant::now() < until, "gave up waiting for {what}: {s:#}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn node<'a>(s: &'a Value, id: &str) -> &'a Value {
        s["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["node"] == id)
            .unwrap()
    }

    /// Halts the system and returns the exit status of `evb up`.
    pub fn halt(mut self) -> std::process::ExitStatus {
        let (code, body) = self.post("halt", json!({}));
        assert_eq!(code, 200, "{body}");
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < until, "evb up did not exit after halt");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Up {
    /// Waits for `evb up` to exit by itself (halted another way: its page, `evb ctl`).
    pub fn exited(mut self, secs: u64) -> std::process::ExitStatus {
        let until = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < until, "evb up did not exit in {secs} s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.api.post("/api/v1/reset", &json!({}));
            let _ = self.api.post("/api/v1/halt", &json!({}));
            // a halted system takes its nodes down; what is still there after 5 s is killed
            let until = Instant::now() + Duration::from_secs(5);
            while Instant::now() < until && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn alive(pid: u64) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

//! An RU written from docs/protocol.md alone (`tests/outside/ru.py`, Python) in runs of evb's
//! own EVM, RU and BUs: the protocol as documented is enough to take part, and a BU
//! restarted mid-run never gets its predecessor's work from an RU that reads its EVM stream
//! slowly (docs/protocol.md §6 item 11, "Incarnations").

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::nodes::events_in;
use common::{chaos_seed, free_base_port, triggered_at_least, wait_node, Rng, EVB};
use serde_json::Value;

const SECRET: &str = "6f1c0e2d9a8b7c6d5e4f30211203a4b5";
const EVENTS: u64 = 5000;

fn outside_ru() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/outside/ru.py")
}

fn have_python(test: &str) -> bool {
    let ok = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    // where the test script could install it, a missing python3 fails (EVB_REQUIRE_TOOLS)
    assert!(
        ok || std::env::var("EVB_REQUIRE_TOOLS").is_err(),
        "{test}: python3 is required (EVB_REQUIRE_TOOLS) but not installed"
    );
    if !ok {
        evb_buffers::skips::skipped(test, "python3 is not installed");
    }
    ok
}

/// The payload the outside RU writes for event `k` (its docstring says so).
fn outside_payload(k: u64) -> Vec<u8> {
    let size = 64 + (k * 37 % 200) as usize;
    (0..size)
        .map(|i| ((k as usize * 131 + i * 7) & 0xFF) as u8)
        .collect()
}

struct Nodes {
    dir: tempfile::TempDir,
    cfg: PathBuf,
    evm_api: String,
    kids: BTreeMap<String, Child>,
}

impl Nodes {
    /// EVM, ru0, bu0 and bu1 as `evb node`; ru1 is the outside RU, started by `outside`.
    fn start(extra: &str) -> Nodes {
        let dir = common::out_dir();
        let base = free_base_port(10);
        let cfg = dir.path().join("run.toml");
        let out = dir.path().join("out");
        std::fs::write(
            &cfg,
            format!(
                "[run]\nid = \"outside\"\nevents = {EVENTS}\nduration_s = 0\nrate_hz = 1000\n\
                 [topology]\nrus = 2\nbus = 2\nbase_port = {base}\n\
                 [control]\nbase_port = {}\n[fragments]\nsize = 1024\n\
                 [sink]\nkind = \"file\"\ndir = \"{}\"\nfile_max_events = 300\n{extra}",
                base + 5,
                out.display()
            ),
        )
        .unwrap();
        let mut n = Nodes {
            evm_api: format!("127.0.0.1:{}", base + 5),
            dir,
            cfg,
            kids: BTreeMap::new(),
        };
        for id in ["evm", "ru0", "bu0", "bu1"] {
            n.spawn(id);
        }
        n
    }

    fn spawn(&mut self, id: &str) {
        let child = Command::new(EVB)
            .args(["node", "--json", "-", "--id", id, "--config"])
            .arg(&self.cfg)
            .env("EVB_SECRET", SECRET)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        self.kids.insert(id.to_string(), child);
    }

    /// Starts the outside RU as ru1 with these extra arguments.
    fn outside(&mut self, args: &[&str]) {
        let cfg = evb_plugin::Config::from_file(&self.cfg).unwrap();
        let nodes = cfg.nodes();
        let addr = |id: &str| nodes.iter().find(|n| n.id == id).unwrap().addr.clone();
        let ru1 = nodes.iter().find(|n| n.id == "ru1").unwrap();
        let child = Command::new("python3")
            .arg(outside_ru())
            .args([
                "--evm",
                &addr("evm"),
                "--bu",
                &addr("bu0"),
                "--bu",
                &addr("bu1"),
            ])
            .args(["--index", &ru1.index.to_string()])
            .args(["--source-id", &ru1.source_id.to_string()])
            .args(["--run-id", &cfg.run.id, "--node-id", "ru1"])
            .args(["--heartbeat-ms", &cfg.run.heartbeat_ms.to_string()])
            .args(args)
            .env("EVB_SECRET", SECRET)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        self.kids.insert("ru1".into(), child);
    }

    fn wait_triggered(&mut self, n: u64) {
        let kids = &mut self.kids;
        let gone = || {
            kids.iter_mut().find_map(|(id, c)| match c.try_wait() {
                Ok(Some(st)) => Some(format!("{id} exited ({st})")),
                _ => None,
            })
        };
        wait_node(
            &self.evm_api,
            &format!("{n} events triggered"),
            60,
            gone,
            |l| triggered_at_least(l, n),
        );
    }

    fn kill9(&mut self, id: &str) {
        let mut c = self.kids.remove(id).unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// Waits (at most `secs`) for every process: (exit success, stdout, stderr) by id.
    fn wait_all(&mut self, secs: u64) -> BTreeMap<String, (bool, String, String)> {
        let until = Instant::now() + Duration::from_secs(secs);
        let mut out = BTreeMap::new();
        for (id, mut c) in std::mem::take(&mut self.kids) {
            while c.try_wait().unwrap().is_none() {
                if Instant::now() > until {
                    let _ = c.kill();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let o = c.wait_with_output().unwrap();
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            out.insert(id, (o.status.success(), text(&o.stdout), text(&o.stderr)));
        }
        out
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for c in self.kids.values_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The outside RU's count of fragments it held back from a connection of another
/// incarnation (its last line).
fn held_back_from_another_incarnation(stderr: &str) -> u64 {
    stderr
        .lines()
        .rev()
        .find_map(|l| l.split("held back from another incarnation ").nth(1))
        .and_then(|s| s.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// One run: the outside RU reads every EVM message `lag_ms` late; bu1 is killed at a drawn
/// moment and started again after a drawn pause. Returns the outputs, the EVM's report,
/// and the events in the output files.
fn run_with_a_restarted_bu(seed: u64, extra_args: &[&str]) -> Outcome {
    let mut rng = Rng(seed | 1);
    let kill_at = 1200 + rng.below(1600);
    let pause_ms = 100 + rng.below(500);
    eprintln!(
        "seed {seed}: bu1 killed at {kill_at} events triggered, started again {pause_ms} ms later"
    );
    let mut n = Nodes::start("");
    let mut args = vec!["--lag-ms", "2000"];
    args.extend_from_slice(extra_args);
    n.outside(&args);
    n.wait_triggered(kill_at);
    n.kill9("bu1");
    std::thread::sleep(Duration::from_millis(pause_ms));
    n.spawn("bu1");
    let outs = n.wait_all(90);
    let report = serde_json::from_str(&outs["evm"].1).unwrap_or(Value::Null);
    let events = events_in(&n.dir.path().join("out"));
    Outcome {
        outs,
        report,
        events,
    }
}

/// What a run left: each process's (exit success, stdout, stderr) by id, the EVM's report,
/// and the events in the output files by id.
struct Outcome {
    outs: BTreeMap<String, (bool, String, String)>,
    report: Value,
    events: BTreeMap<u64, (u32, u16, Vec<Vec<u8>>)>,
}

#[test]
fn a_slow_outside_ru_sends_a_restarted_bu_none_of_its_predecessors_work() {
    let test = "a_slow_outside_ru_sends_a_restarted_bu_none_of_its_predecessors_work";
    if !have_python(test) {
        return;
    }
    // `EVB_OUTSIDE_TRIALS=N` runs a campaign of N seeded restarts (seed, seed + 1, ...)
    let (seed0, trials) = chaos_seed("EVB_OUTSIDE_TRIALS", 1);
    for seed in seed0..seed0 + trials {
        one_restart_with_a_slow_outside_ru(seed);
    }
}

fn one_restart_with_a_slow_outside_ru(seed: u64) {
    let Outcome {
        outs,
        report,
        events,
    } = run_with_a_restarted_bu(seed, &[]);
    let why = |id: &str| format!("seed {seed}: {id}:\n{}", outs[id].2);
    for id in ["evm", "ru0", "ru1", "bu0", "bu1"] {
        assert!(outs[id].0, "{} failed", why(id));
    }
    let run = &report["run"];
    assert_eq!(report["verdict"], serde_json::json!([]), "{}", why("evm"));
    assert_eq!(run["evm"]["triggered"], EVENTS, "{}", why("evm"));
    assert_eq!(run["evm"]["released"], EVENTS);
    assert!(
        run["evm"]["lost"]
            .as_array()
            .is_some_and(|v| v.iter().any(|e| e["kind"] == "rejoined")),
        "bu1 came back: {}",
        run["evm"]["lost"]
    );
    for b in run["bus"].as_array().unwrap() {
        assert_eq!(b["duplicate_fragments"], 0, "{}", why("bu1"));
        assert_eq!(b["incomplete_at_stop"], 0);
        assert_eq!(b["crc_errors"], 0);
    }
    // the race was run: Assigns for the killed BU were read after the new one answered
    let held = held_back_from_another_incarnation(&outs["ru1"].2);
    assert!(
        held > 0,
        "no Assign met another incarnation: {}",
        why("ru1")
    );
    // every event in the files once, with the outside RU's bytes exact
    assert_eq!(events.len() as u64, EVENTS, "seed {seed}");
    for (k, (trigger, _, frags)) in &events {
        assert_eq!(*trigger as u64, k & 0xFFFF_FFFF);
        assert_eq!(frags.len(), 2, "event {k}");
        assert!(
            frags.iter().any(|f| *f == outside_payload(*k)),
            "event {k}: the outside RU's fragment is not its bytes (seed {seed})"
        );
    }
}

/// The same run with the rule broken on purpose: the test above can fail, and fails for
/// the reason it guards.
#[test]
fn an_outside_ru_that_ignores_incarnations_fails_the_run() {
    let test = "an_outside_ru_that_ignores_incarnations_fails_the_run";
    if !have_python(test) {
        return;
    }
    let (seed, _) = chaos_seed("EVB_OUTSIDE_TRIALS", 1);
    let Outcome { outs, report, .. } = run_with_a_restarted_bu(seed, &["--ignore-incarnation"]);
    let held = held_back_from_another_incarnation(&outs["ru1"].2);
    assert_eq!(held, 0, "it was told to ignore them");
    let dup: u64 = report["run"]["bus"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|b| b["duplicate_fragments"].as_u64())
                .sum()
        })
        .unwrap_or(0);
    let incomplete: u64 = report["run"]["bus"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|b| b["incomplete_at_stop"].as_u64())
                .sum()
        })
        .unwrap_or(0);
    assert!(
        dup + incomplete > 0 || report["ok"] == false,
        "seed {seed}: a stale Assign's fragments reached the new BU and nothing noticed: {report}"
    );
    eprintln!(
        "seed {seed}: duplicate fragments {dup}, incomplete at stop {incomplete}, verdict {}",
        report["verdict"]
    );
    assert_ne!(
        report["ok"], true,
        "seed {seed}: the verdict must not be OK"
    );
}

/// ru0 alone, its EVM and its standby the two EVMs of `tests/outside/stale_evm.py` (written
/// from the docs): the first opens ru0's control connection at epoch 1, starts the run and
/// is lost; the second, at ru0's standby address, speaks at `second_epoch`. Returns what
/// the fakes saw (their JSON line) and what ru0 logged.
fn stale_epoch_trial(second_epoch: i32, second_hold_s: f64) -> (Value, String) {
    let dir = common::out_dir();
    let base = free_base_port(12);
    let (evm, standby) = (
        format!("127.0.0.1:{base}"),
        format!("127.0.0.1:{}", base + 10),
    );
    let cfg = dir.path().join("run.toml");
    std::fs::write(
        &cfg,
        format!(
            "[run]\nid = \"stale\"\nevents = 100\nduration_s = 0\n\
             [topology]\nrus = 1\nbus = 1\nbase_port = {base}\n[control]\nbase_port = {}\n\
             [evm]\nstandby = \"{standby}\"\nstandby_control = \"127.0.0.1:{}\"\n",
            base + 4,
            base + 11
        ),
    )
    .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/outside/stale_evm.py");
    let mut fake = Command::new("python3")
        .arg(&script)
        .args(["--run-id", "stale", "--first", &evm, "--second", &standby])
        .args(["--second-epoch", &second_epoch.to_string()])
        .args(["--second-hold-s", &second_hold_s.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // it listens before the node calls
    let mut out = std::io::BufReader::new(fake.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "listening", "the fake EVMs did not start");
    let mut ru = Command::new(EVB)
        .args(["node", "--id", "ru0", "--config"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while fake.try_wait().unwrap().is_none() {
        assert!(Instant::now() < until, "the fake EVMs never finished");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = ru.kill();
    let said = String::from_utf8_lossy(&ru.wait_with_output().unwrap().stderr).to_string();
    let mut result = String::new();
    std::io::Read::read_to_string(&mut out, &mut result).unwrap();
    let r: Value = serde_json::from_str(result.trim())
        .unwrap_or_else(|e| panic!("fake EVMs' result {result:?}: {e}\nru0 said:\n{said}"));
    (r, said)
}

/// An EVM that speaks at an epoch below the one a node followed is refused with a Fence of
/// the epoch followed, then Bye (docs/protocol.md §6 item 15); one at the epoch followed is
/// followed (its twin: nothing refused, the node's resync sent).
#[test]
fn a_node_refuses_an_evm_of_an_older_epoch_and_tells_it_so() {
    if !have_python("stale epoch") {
        return;
    }
    let (r, said) = stale_epoch_trial(0, 10.0);
    assert_eq!(r["fences_first"], serde_json::json!([]), "{r}\n{said}");
    assert_eq!(r["fences"], serde_json::json!([1]), "{r}\n{said}");
    assert_eq!(
        r["bye"], true,
        "ru0 did not close the stale EVM's connection: {r}\n{said}"
    );
    assert!(
        said.contains("speaks at epoch 0, below the 1 this node followed"),
        "{said}"
    );
    // the twin: the second EVM speaks at the epoch followed
    let (r, said) = stale_epoch_trial(1, 1.5);
    assert_eq!(r["fences"], serde_json::json!([]), "{r}\n{said}");
    assert_eq!(r["bye"], false, "ru0 left an EVM of its epoch: {r}\n{said}");
    // its resync (ResyncRu, 0x001F) went to the EVM it followed
    assert!(
        r["second"]
            .as_array()
            .is_some_and(|k| k.contains(&serde_json::json!(0x001F))),
        "{r}\n{said}"
    );
    assert!(!said.contains("stale epoch"), "{said}");
}

/// Issue 66 defect 4: an EVM that sends no Term (it opens with Start, as an EVM of protocol
/// version 1 may) is not followed: the node refuses it by name and closes with Bye, and
/// heeds nothing it said.
#[test]
fn a_node_refuses_an_evm_that_speaks_before_its_term() {
    if !have_python("no term") {
        return;
    }
    let (r, said) = stale_epoch_trial(-1, 10.0);
    assert_eq!(
        r["bye"], true,
        "ru0 did not close the Term-less EVM's connection: {r}\n{said}"
    );
    assert!(
        said.contains("before its Term; refused"),
        "ru0 did not say why: {said}"
    );
    // only what a node sends as it connects, before it reads anything (Register 0x001A, its
    // Resync 0x001F: docs/protocol.md §6 item 16): nothing in answer to the Start
    let kinds = r["second"].as_array().cloned().unwrap_or_default();
    assert!(
        !kinds.is_empty()
            && kinds
                .iter()
                .all(|k| *k == serde_json::json!(0x001A) || *k == serde_json::json!(0x001F)),
        "ru0 answered an EVM that never said its Term: {r}\n{said}"
    );
}

/// Issue 66 defect 7: a BU whose control Hello says incarnation 0 (none: §3) is refused by the
/// EVM, named in its log; it gets no Term, no Start, nothing of the run.
#[test]
fn the_evm_refuses_a_bu_of_incarnation_zero() {
    if !have_python("incarnation 0") {
        return;
    }
    let dir = common::out_dir();
    let base = free_base_port(8);
    let cfg = dir.path().join("run.toml");
    std::fs::write(
        &cfg,
        format!(
            "[run]\nid = \"zero\"\nevents = 100\nduration_s = 0\nconnect_timeout_s = 30\n\
             records_dir = \"{}\"\n\
             [topology]\nrus = 1\nbus = 1\nbase_port = {base}\n[control]\nbase_port = {}\n",
            dir.path().join("records").display(),
            base + 4
        ),
    )
    .unwrap();
    let mut evm = Command::new(EVB)
        .args(["node", "--id", "evm", "--config"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/outside/zero_incarnation_bu.py");
    let fake = Command::new("python3")
        .arg(&script)
        .args(["--evm", &format!("127.0.0.1:{base}"), "--run-id", "zero"])
        .output()
        .unwrap();
    let _ = evm.kill();
    let said = String::from_utf8_lossy(&evm.wait_with_output().unwrap().stderr).to_string();
    let out = String::from_utf8_lossy(&fake.stdout).to_string();
    let r: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| {
        panic!(
            "the fake BU's result {out:?}: {e}\n{}\nthe EVM said:\n{said}",
            String::from_utf8_lossy(&fake.stderr)
        )
    });
    assert_eq!(
        r["closed"], true,
        "the EVM kept a BU of incarnation 0: {r}\n{said}"
    );
    assert_eq!(
        r["kinds"],
        serde_json::json!([]),
        "the EVM spoke to it: {r}\n{said}"
    );
    assert!(
        said.contains("called with incarnation 0, which is none"),
        "the EVM did not say why: {said}"
    );
}

/// Issue 66 defect 8: an RU of protocol version 1 (the first published docs: frame header and
/// Hello say 1) is refused by the EVM at the handshake with a Reject that names both versions,
/// in a frame header it can read, and both sides say so; it does not stall a run.
#[test]
fn an_ru_of_the_previous_protocol_version_is_refused_by_name() {
    if !have_python("protocol version") {
        return;
    }
    let dir = common::out_dir();
    let base = free_base_port(8);
    let cfg = dir.path().join("run.toml");
    std::fs::write(
        &cfg,
        format!(
            "[run]\nid = \"old\"\nevents = 100\nduration_s = 0\nconnect_timeout_s = 30\n\
             records_dir = \"{}\"\n\
             [topology]\nrus = 1\nbus = 1\nbase_port = {base}\n[control]\nbase_port = {}\n",
            dir.path().join("records").display(),
            base + 4
        ),
    )
    .unwrap();
    let mut evm = Command::new(EVB)
        .args(["node", "--id", "evm", "--config"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let old = Command::new("python3")
        .arg(outside_ru())
        .args(["--evm", &format!("127.0.0.1:{base}"), "--bu", "127.0.0.1:1"])
        .args(["--index", "0", "--source-id", "1", "--run-id", "old"])
        .args(["--node-id", "ru0", "--protocol-version", "1"])
        .output()
        .unwrap();
    let _ = evm.kill();
    let said = String::from_utf8_lossy(&evm.wait_with_output().unwrap().stderr).to_string();
    let told = String::from_utf8_lossy(&old.stderr).to_string();
    let why = format!(
        "protocol version 1 is not spoken here: this node speaks version {}",
        evb_wire::PROTOCOL_VERSION
    );
    assert_eq!(
        old.status.code(),
        Some(3),
        "the old RU was not refused: {told}\nthe EVM said:\n{said}"
    );
    assert!(
        told.contains(&format!("refused by the EVM: {why}")),
        "the old RU was not told both versions: {told}"
    );
    assert!(
        said.contains(&why),
        "the EVM did not log the refusal: {said}"
    );
}

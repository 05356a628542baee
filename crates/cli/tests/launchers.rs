//! The launch with the real engines: `srun -n 5 evb node --config F` on a private one-node
//! Slurm cluster on this host (scripts/slurm-local.sh), the same through `mpirun` (Open
//! MPI), and the sbatch script `evb slurm` writes, submitted with `sbatch --wait`. Each node
//! takes its id from its rank (rank.rs) and prints one summary line on stdout
//! (`evb node ID: verdict=OK key=value ...`); its report goes to the file `--json` names,
//! one per rank (`{id}` in the name). The EVM's report says how the run went.
//!
//! The engines come from Debian (`slurm-wlm munge openmpi-bin`; scripts/test.sh installs
//! them). Without them the tests say they were skipped, unless EVB_REQUIRE_TOOLS=1, which
//! makes a missing one a failure.

mod common;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::EVB;
use serde_json::Value;

/// One launch at a time: five nodes a run on a host of two cores.
static LAUNCHES: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    LAUNCHES.lock().unwrap_or_else(|e| e.into_inner())
}

/// The events every run here builds.
const EVENTS: u64 = 3000;

/// The run's configuration in `dir`: an EVM, 2 RUs and 2 BUs with no address anywhere
/// (the nodes find each other through the EVM, whose address they read from the job's
/// rendezvous file beside the configuration), `run` (TOML keys) added to its [run] table
/// and `tables` (TOML tables) appended. Every launch here runs one written by this function.
fn run_config(dir: &Path, run: &str, tables: &str) -> PathBuf {
    let path = dir.join("run.toml");
    let toml = format!(
        "[run]\nid = \"launched\"\nevents = {EVENTS}\nduration_s = 0\n{run}\
         [fragments]\nsize = 8192\n\
         [topology]\nrus = 2\nbus = 2\n{tables}"
    );
    std::fs::write(&path, toml).unwrap();
    path
}

/// The tools found on PATH (or the reason they cannot run), or a skip (false) saying what is
/// missing; a failure when CI requires the tools.
fn have(tools: &[&str], packages: &str, root: bool) -> bool {
    let mut missing: Vec<String> = tools
        .iter()
        .filter(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t} >/dev/null")])
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|t| format!("{t} is not installed (Debian: {packages})"))
        .collect();
    if root && !is_root() {
        missing.push("the local cluster needs root".into());
    }
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var("EVB_REQUIRE_TOOLS").is_err(),
        "required (EVB_REQUIRE_TOOLS): {}",
        missing.join("; ")
    );
    evb_buffers::skips::skipped(
        "launchers",
        &format!("{} (scripts/test.sh installs them)", missing.join("; ")),
    );
    false
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            == Some("0")
    })
}

fn have_slurm() -> bool {
    have(
        &["slurmctld", "slurmd", "munged", "srun", "sbatch", "sinfo"],
        "slurm-wlm munge",
        true,
    )
}

/// What every Slurm test starts from: the engines (or a skip), the launch slot, a cluster
/// of its own and a folder.
fn slurm_test() -> Option<(MutexGuard<'static, ()>, Cluster, tempfile::TempDir)> {
    if !have_slurm() {
        return None;
    }
    let one = one_at_a_time();
    Some((one, Cluster::start(), common::out_dir()))
}

fn slurm_local() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/slurm-local.sh")
}

/// A one-node Slurm cluster of its own in a temporary folder, stopped when dropped (a
/// failing test's too).
struct Cluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = common::out_dir();
        let out = Command::new(slurm_local())
            .arg("start")
            .arg(dir.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let conf = stdout
            .lines()
            .find_map(|l| l.strip_prefix("export SLURM_CONF="))
            .map(PathBuf::from);
        let cluster = Cluster {
            conf: conf.clone().unwrap_or_default(),
            dir,
        };
        assert!(
            out.status.success() && conf.is_some(),
            "slurm-local.sh start failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        cluster
    }

    /// A Slurm command (srun, sbatch, ...) talking to this cluster, run in `cwd`.
    fn cmd(&self, tool: &str, cwd: &Path) -> Command {
        let mut c = Command::new(tool);
        c.env("SLURM_CONF", &self.conf).current_dir(cwd);
        c
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(slurm_local())
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}

/// What a launcher did: its exit status, and its stdout and stderr.
struct Launched {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `cmd` with its stdout and stderr in files of `dir`; a launcher still running after
/// `limit` (a hang, far beyond any run here) is killed and the test fails.
fn launch(mut cmd: Command, dir: &Path, name: &str, limit: Duration) -> Launched {
    let out = dir.join(format!("{name}.stdout"));
    let err = dir.join(format!("{name}.stderr"));
    let mut child = cmd
        .stdout(File::create(&out).unwrap())
        .stderr(File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let (stdout, stderr) = (read(&out), read(&err));
    let Some(status) = status else {
        panic!("{name} still running after {limit:?}, killed:\n{stdout}\n{stderr}");
    };
    Launched {
        status,
        stdout,
        stderr,
    }
}

/// The nodes of `run_config`'s configuration in rank order.
const NODES: [&str; 5] = ["evm", "ru0", "ru1", "bu0", "bu1"];

/// The `--json` every launch here gives its nodes: one file per node, in `reports/` of
/// the launch's folder.
const JSON: &str = "reports/{id}.json";

/// The report (JSON) node `id` wrote into `dir/reports/`, if it wrote one that parses.
fn report_of(dir: &Path, id: &str) -> Option<Value> {
    let text = std::fs::read_to_string(dir.join(format!("reports/{id}.json"))).ok()?;
    serde_json::from_str(&text).ok()
}

/// The nodes' summary lines in a launcher's output (other lines, stderr's, are skipped):
/// `evb node ID: k=v k=v ... [reason="..."]`, as the node id and its fields.
fn summary_lines(output: &str) -> Vec<(String, BTreeMap<String, String>)> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix("evb node "))
        .filter_map(|l| l.split_once(": "))
        .filter(|(_, rest)| rest.starts_with("verdict="))
        .map(|(id, rest)| {
            let (fields, reason) = match rest.split_once(" reason=") {
                Some((f, r)) => (f, Some(r)),
                None => (rest, None),
            };
            let mut m: BTreeMap<String, String> = fields
                .split_whitespace()
                .map(|kv| {
                    let (k, v) = kv
                        .split_once('=')
                        .unwrap_or_else(|| panic!("{kv} in {rest}"));
                    (k.to_string(), v.to_string())
                })
                .collect();
            if let Some(r) = reason {
                let words: String =
                    serde_json::from_str(r).unwrap_or_else(|e| panic!("{e}: {rest}"));
                m.insert("reason".into(), words);
            }
            (id.to_string(), m)
        })
        .collect()
}

/// Each node's summary line agrees with its report: the verdict with `ok`, and its counts.
fn assert_line_agrees(line: &BTreeMap<String, String>, r: &Value) {
    let ok = if r["ok"] == true { "OK" } else { "FAILED" };
    assert_eq!(line["verdict"], ok, "{line:?} {r}");
    assert_eq!(line["role"], r["role"].as_str().unwrap_or(""), "{r}");
    assert_eq!(line["state"], r["state"].as_str().unwrap_or(""), "{r}");
    let (key, stat) = match r["role"].as_str() {
        Some("evm") => ("triggered", "triggered"),
        Some("ru") => ("fragments", "fragments_sent"),
        _ => ("built", "events_built"),
    };
    assert_eq!(line[key], r["stats"][stat].to_string(), "{line:?} {r}");
}

/// Every rank ran its node of the configuration (the nodes' summary lines in `lines`, one
/// each, agree with their reports in `dir/reports/`), and the EVM (rank 0) reports an exact
/// run: every event triggered, built once by the BUs (ids 0..EVENTS), and released.
fn assert_exact(dir: &Path, lines: &[(String, BTreeMap<String, String>)], context: &str) {
    let ids: Vec<&str> = lines.iter().map(|l| l.0.as_str()).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    let mut nodes = NODES.to_vec();
    nodes.sort_unstable();
    assert_eq!(sorted, nodes, "one summary line per node:\n{context}");
    for (id, line) in lines {
        let rank = NODES.iter().position(|n| n == id).unwrap();
        let Some(r) = report_of(dir, id) else {
            panic!("no report from {id}:\n{context}");
        };
        assert_eq!(r["node"], id.as_str(), "rank {rank}: {r}");
        assert_eq!(r["ok"], true, "rank {rank}: {r}");
        assert_eq!(line["rank"], rank.to_string(), "{line:?}");
        assert_line_agrees(line, &r);
    }
    let evm_line = &lines.iter().find(|l| l.0 == "evm").unwrap().1;
    assert_eq!(evm_line["built"], EVENTS.to_string(), "{evm_line:?}");
    assert_eq!(evm_line["released"], EVENTS.to_string(), "{evm_line:?}");
    let report = report_of(dir, "evm").unwrap_or_default();
    let run = &report["run"];
    assert_eq!(run["evm"]["triggered"], EVENTS, "{report}");
    assert_eq!(run["evm"]["released"], EVENTS, "{report}");
    let bus = run["bus"].as_array().cloned().unwrap_or_default();
    assert_eq!(bus.len(), 2, "{report}");
    let sum = |k: &str| bus.iter().map(|b| b[k].as_u64().unwrap_or(0)).sum::<u64>();
    assert_eq!(sum("events_built"), EVENTS, "{report}");
    assert_eq!(sum("event_id_sum"), (0..EVENTS).sum::<u64>(), "{report}");
    for k in [
        "crc_errors",
        "content_errors",
        "duplicate_fragments",
        "incomplete_at_stop",
    ] {
        assert_eq!(sum(k), 0, "{k}: {report}");
    }
    // no address was written: each node registered the launcher's rank and the address
    // it chose with the EVM
    let reg = report["registered"].as_array().cloned().unwrap_or_default();
    assert_eq!(reg.len(), 4, "{report}");
    for (k, r) in reg.iter().enumerate() {
        assert_eq!(r["rank"], k as u64 + 1, "{r}");
        let a: std::net::SocketAddr = r["data"].as_str().unwrap_or("").parse().unwrap();
        assert_ne!(a.port(), 0, "{r}");
    }
}

/// No rendezvous file is left beside the configuration once the EVM is done.
fn assert_no_rendezvous_left(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".evm"))
        .collect();
    assert!(left.is_empty(), "rendezvous files left: {left:?}");
}

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn srun_starts_an_exact_run() {
    let Some((_one, cluster, dir)) = slurm_test() else {
        return;
    };
    let cfg = run_config(dir.path(), "", "");
    let mut srun = cluster.cmd("srun", dir.path());
    srun.args([
        "-n", "5", "--output", "%t.out", "--error", "%t.err", EVB, "node", "--json", JSON,
    ])
    .arg("--config")
    .arg(&cfg);
    let l = launch(srun, dir.path(), "srun", LIMIT);
    let logs = task_logs(dir.path(), 5);
    assert!(
        l.status.success(),
        "srun: {:?}\n{}\n{}\n{logs}",
        l.status,
        l.stdout,
        l.stderr
    );
    // each task's stdout is its node's one summary line
    let mut lines = Vec::new();
    for (t, id) in NODES.iter().enumerate() {
        let out = std::fs::read_to_string(dir.path().join(format!("{t}.out"))).unwrap_or_default();
        assert_eq!(out.lines().count(), 1, "task {t}:\n{logs}");
        let mut l = summary_lines(&out);
        assert_eq!(l.len(), 1, "task {t}:\n{logs}");
        assert_eq!(l[0].0, *id, "task {t}:\n{logs}");
        lines.append(&mut l);
    }
    assert_exact(dir.path(), &lines, &logs);
    assert_no_rendezvous_left(dir.path());
}

/// A rank that never starts (its task exits before running evb): within
/// run.connect_timeout_s the EVM names it by node and rank, every task that started exits
/// with an error, srun fails, and nothing is left running.
#[test]
fn srun_with_a_rank_that_never_starts_names_it() {
    let Some((_one, cluster, dir)) = slurm_test() else {
        return;
    };
    let cfg = run_config(dir.path(), "connect_timeout_s = 3\n", "");
    let mut srun = cluster.cmd("srun", dir.path());
    let body = format!(
        "[ \"$SLURM_PROCID\" = 4 ] && exit 0; exec {EVB} node --config {}",
        cfg.display()
    );
    srun.args([
        "-n", "5", "--output", "%t.out", "--error", "%t.err", "sh", "-c", &body,
    ]);
    let l = launch(srun, dir.path(), "srun", LIMIT);
    let logs = task_logs(dir.path(), 5);
    assert!(!l.status.success(), "srun succeeded:\n{logs}");
    let err = |t: usize| std::fs::read_to_string(dir.path().join(format!("{t}.err"))).unwrap();
    assert!(
        err(0).contains("not connected: bu1 (rank 4): it never called"),
        "{logs}"
    );
    for t in 1..4 {
        assert!(err(t).contains("bu1 (rank 4)"), "task {t}:\n{logs}");
    }
    let left = processes_with_arg(&cfg);
    assert!(left.is_empty(), "nodes left running: {left:?}");
}

/// Every task's stdout and stderr files (`%t.out`, `%t.err`), for failure messages.
fn task_logs(dir: &Path, tasks: usize) -> String {
    (0..tasks)
        .flat_map(|t| [format!("{t}.out"), format!("{t}.err")])
        .map(|f| {
            let text = std::fs::read_to_string(dir.join(&f)).unwrap_or_default();
            format!("--- {f}\n{text}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_failed_verdict_is_srun_s_exit_code() {
    let Some((_one, cluster, dir)) = slurm_test() else {
        return;
    };
    // every BU takes 3 s to hand its first event to the sink: nothing completes for longer
    // than the stall timeout, so the run is aborted and its verdict fails
    let cfg = run_config(
        dir.path(),
        "stall_timeout_s = 0.5\n",
        "[[bu]]\nid = \"bu0\"\nsink_delay_us = 3000000\nsink_delay_events = 1\n\
         [[bu]]\nid = \"bu1\"\nsink_delay_us = 3000000\nsink_delay_events = 1\n",
    );
    let mut srun = cluster.cmd("srun", dir.path());
    srun.args([
        "-n", "5", "--output", "%t.out", "--error", "%t.err", EVB, "node", "--json", JSON,
    ])
    .arg("--config")
    .arg(&cfg);
    let l = launch(srun, dir.path(), "srun", LIMIT);
    let logs = task_logs(dir.path(), 5);
    assert!(!l.status.success(), "srun succeeded:\n{logs}");
    let Some(report) = report_of(dir.path(), "evm") else {
        panic!("no EVM report:\n{logs}");
    };
    // the EVM's summary line says so, with the reason in words
    let evm = std::fs::read_to_string(dir.path().join("0.out")).unwrap_or_default();
    let lines = summary_lines(&evm);
    assert_eq!(lines.len(), 1, "{logs}");
    assert_eq!(lines[0].1["verdict"], "FAILED", "{logs}");
    assert!(
        lines[0].1["reason"].starts_with("stalled"),
        "{:?}",
        lines[0].1
    );
    assert_line_agrees(&lines[0].1, &report);
    assert_eq!(report["ok"], false, "{report}");
    assert_eq!(report["state"], "aborted", "{report}");
    assert!(
        report["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("stalled")),
        "{report}"
    );
    assert!(
        (report["run"]["evm"]["released"].as_u64().unwrap()) < EVENTS,
        "{report}"
    );
}

#[test]
fn srun_with_a_task_missing_says_so_and_every_task_exits() {
    let Some((_one, cluster, dir)) = slurm_test() else {
        return;
    };
    let cfg = run_config(dir.path(), "", "");
    let mut srun = cluster.cmd("srun", dir.path());
    srun.args(["-n", "4", EVB, "node", "--config"]).arg(&cfg);
    // each task refuses at once: srun returns (a hang here fails the test)
    let l = launch(srun, dir.path(), "srun", LIMIT);
    // every task exited 2, and srun with the highest of its tasks' codes
    assert_eq!(l.status.code(), Some(2), "{}\n{}", l.stdout, l.stderr);
    let said = "the launcher started 4 tasks (SLURM_NTASKS) but the configuration has 5 nodes \
                (evm, ru0, ru1, bu0, bu1)";
    assert!(l.stderr.contains(said), "{}", l.stderr);
    // and no node of it is left running
    let left = processes_with_arg(&cfg);
    assert!(left.is_empty(), "nodes left running: {left:?}");
}

/// The processes with `arg` among their arguments (their pids).
fn processes_with_arg(arg: &Path) -> Vec<u32> {
    let arg = arg.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == arg))
        })
        .collect()
}

#[test]
fn mpirun_starts_an_exact_run() {
    if !have(&["mpirun"], "openmpi-bin", false) {
        return;
    }
    let _one = one_at_a_time();
    let dir = common::out_dir();
    // the nodes listen on this host's address in a network, as on a cluster's data network
    let cfg = run_config(dir.path(), "", "[transport]\ninterface = \"127.0.0.0/8\"\n");
    let mut mpirun = Command::new("mpirun");
    mpirun
        .current_dir(dir.path())
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "5"])
        .args([EVB, "node", "--json", JSON, "--config"])
        .arg(&cfg);
    let l = launch(mpirun, dir.path(), "mpirun", LIMIT);
    let all = format!("--- stdout\n{}\n--- stderr\n{}", l.stdout, l.stderr);
    assert!(l.status.success(), "mpirun: {:?}\n{all}", l.status);
    // mpirun's combined stdout: the five ranks' summary lines, in whatever order they
    // ended, and nothing else
    assert_eq!(l.stdout.lines().count(), 5, "{all}");
    let lines = summary_lines(&l.stdout);
    assert_eq!(lines.len(), 5, "{all}");
    assert_exact(dir.path(), &lines, &all);
    assert_no_rendezvous_left(dir.path());
}

#[test]
fn the_script_evb_slurm_writes_runs_under_sbatch() {
    let Some((_one, cluster, dir)) = slurm_test() else {
        return;
    };
    let cfg = run_config(dir.path(), "", "");
    let logs = dir.path().join("logs");
    let script = dir.path().join("job.sh");
    let made = Command::new(EVB)
        .args(["slurm", "--config"])
        .arg(&cfg)
        .arg("--output")
        .arg(&logs)
        .arg("--script")
        .arg(&script)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", common::text(&made));
    let mut sbatch = cluster.cmd("sbatch", dir.path());
    sbatch.args(["--parsable", "--wait"]).arg(&script);
    let l = launch(sbatch, dir.path(), "sbatch", LIMIT);
    let job = l.stdout.trim().split(';').next().unwrap_or("").to_string();
    let log = |name: String| std::fs::read_to_string(logs.join(name)).unwrap_or_default();
    let all: String = (0..5)
        .map(|r| format!("--- rank {r}\n{}", log(format!("evb-{job}-{r}.out"))))
        .collect();
    assert!(
        l.status.success(),
        "sbatch: {:?}\n{}\n{}\nbatch log:\n{}\n{all}",
        l.status,
        l.stdout,
        l.stderr,
        log(format!("evb-{job}.out"))
    );
    assert!(job.parse::<u64>().is_ok(), "no job id: {}", l.stdout);
    // the batch log, and one log per node where the script says
    let batch = log(format!("evb-{job}.out"));
    assert!(batch.contains("srun exited with 0"), "{batch}");
    for r in 0..5 {
        assert!(
            logs.join(format!("evb-{job}-{r}.out")).exists(),
            "no log for rank {r}:\n{all}"
        );
    }
    // each node's log holds its stdout and stderr: its summary line among them; its
    // report is evb-JOB-RANK.json beside it
    let reports = dir.path().join("reports");
    std::fs::create_dir_all(&reports).unwrap();
    let mut lines = Vec::new();
    for (r, id) in NODES.iter().enumerate() {
        let mut l = summary_lines(&log(format!("evb-{job}-{r}.out")));
        assert_eq!(l.len(), 1, "rank {r}:\n{all}");
        lines.append(&mut l);
        let json = logs.join(format!("evb-{job}-{r}.json"));
        assert!(json.exists(), "no report for rank {r}:\n{all}");
        std::fs::copy(json, reports.join(format!("{id}.json"))).unwrap();
    }
    assert_exact(dir.path(), &lines, &all);
}

#[test]
fn evb_slurm_checks_the_configuration_first() {
    let dir = common::out_dir();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "[fragments]\nsize = 0\n").unwrap();
    let o = Command::new(EVB)
        .args(["slurm", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", common::text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("fragments.size"),
        "{}",
        common::text(&o)
    );
    assert!(o.stdout.is_empty());
}

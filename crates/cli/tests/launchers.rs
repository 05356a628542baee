//! The launch with the real engines: `srun -n 5 evb node --config F` on a private one-node
//! Slurm cluster on this host (scripts/slurm-local.sh), the same through `mpirun` (Open
//! MPI), and the sbatch script `evb slurm` writes, submitted with `sbatch --wait`. Each node
//! takes its id from its rank (rank.rs); the EVM's report (JSON on its stdout) says how
//! the run went.
//!
//! The engines come from Debian (`slurm-wlm munge openmpi-bin`; scripts/test.sh installs
//! them). Without them the tests say they were skipped, unless EVB_REQUIRE_TOOLS=1, which
//! makes a missing one a failure.

mod common;

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
    eprintln!(
        "SKIPPED: {} (scripts/test.sh installs them)",
        missing.join("; ")
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
    Some((one, Cluster::start(), tempfile::tempdir().unwrap()))
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
        let dir = tempfile::tempdir().unwrap();
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

/// A node's report in what its process wrote: the pretty-printed JSON object from a line
/// `{` to a line `}` (its log may hold stderr's lines too).
fn report_in(output: &str) -> Option<Value> {
    let lines: Vec<&str> = output.lines().collect();
    let from = lines.iter().position(|l| *l == "{")?;
    let to = from + lines[from..].iter().position(|l| *l == "}")?;
    serde_json::from_str(&lines[from..=to].join("\n")).ok()
}

/// Every rank ran its node of the configuration, and the EVM (rank 0) reports an exact
/// run: every event triggered, built once by the BUs (ids 0..EVENTS), and released.
/// `outputs[k]` is what rank k wrote.
fn assert_exact(outputs: &[String], context: &str) {
    assert_eq!(outputs.len(), NODES.len());
    for (rank, (out, id)) in outputs.iter().zip(NODES).enumerate() {
        let Some(r) = report_in(out) else {
            panic!("no report from rank {rank}:\n{context}");
        };
        assert_eq!(r["node"], id, "rank {rank}: {r}");
        assert_eq!(r["ok"], true, "rank {rank}: {r}");
    }
    let report = report_in(&outputs[0]).unwrap_or_default();
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
        "-n", "5", "--output", "%t.out", "--error", "%t.err", EVB, "node",
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
    let outs: Vec<String> = (0..5)
        .map(|t| std::fs::read_to_string(dir.path().join(format!("{t}.out"))).unwrap_or_default())
        .collect();
    assert_exact(&outs, &logs);
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
        "-n", "5", "--output", "%t.out", "--error", "%t.err", EVB, "node",
    ])
    .arg("--config")
    .arg(&cfg);
    let l = launch(srun, dir.path(), "srun", LIMIT);
    let logs = task_logs(dir.path(), 5);
    assert!(!l.status.success(), "srun succeeded:\n{logs}");
    let evm = std::fs::read_to_string(dir.path().join("0.out")).unwrap_or_default();
    let Some(report) = report_in(&evm) else {
        panic!("no EVM report:\n{logs}");
    };
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
    let dir = tempfile::tempdir().unwrap();
    // the nodes listen on this host's address in a network, as on a cluster's data network
    let cfg = run_config(dir.path(), "", "[transport]\ninterface = \"127.0.0.0/8\"\n");
    let logs = dir.path().join("mpi");
    let mut mpirun = Command::new("mpirun");
    mpirun
        .current_dir(dir.path())
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "5"])
        .arg("--output-filename")
        .arg(&logs)
        .args([EVB, "node", "--config"])
        .arg(&cfg);
    let l = launch(mpirun, dir.path(), "mpirun", LIMIT);
    // Open MPI 4 writes each rank's output to DIR/1/rank.R/stdout (and stderr)
    let rank = |r: usize, f: &str| {
        std::fs::read_to_string(logs.join(format!("1/rank.{r}/{f}"))).unwrap_or_default()
    };
    let all: String = (0..5)
        .map(|r| format!("--- rank {r}\n{}\n{}", rank(r, "stdout"), rank(r, "stderr")))
        .collect();
    assert!(
        l.status.success(),
        "mpirun: {:?}\n{}\n{}\n{all}",
        l.status,
        l.stdout,
        l.stderr
    );
    let outs: Vec<String> = (0..5).map(|r| rank(r, "stdout")).collect();
    assert_exact(&outs, &all);
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
    // each node's log holds its stdout and stderr: its report among them
    let outs: Vec<String> = (0..5).map(|r| log(format!("evb-{job}-{r}.out"))).collect();
    assert_exact(&outs, &all);
}

#[test]
fn evb_slurm_checks_the_configuration_first() {
    let dir = tempfile::tempdir().unwrap();
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

//! Nodes started without addresses, as a launcher starts them (one command line, a rank in
//! the environment): they find each other through the EVM and build an exact run, whatever
//! order they start in; and what goes wrong at launch is named by node, rank and host, and
//! ends every process.
//! (The real launchers, srun and mpirun, are tested in launchers.rs.)

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{free_base_port, node_status, text, triggered_at_least, wait_node, Rng, EVB};
use evb_builder::{NodeEvent, NodeEventKind};
use serde_json::Value;

/// Every variable a launcher sets that evb reads: the tests set their own.
const LAUNCHER_VARS: [&str; 10] = [
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_MCA_ess_base_jobid",
    "PMIX_RANK",
    "PMIX_NAMESPACE",
    "PMI_RANK",
];

/// A 2 × 2 run with no address anywhere in it.
fn no_addresses(dir: &Path, extra: &str) -> PathBuf {
    let p = dir.join("run.toml");
    std::fs::write(
        &p,
        format!(
            "[run]\nid = \"found\"\nevents = 3000\nduration_s = 0\nconnect_timeout_s = 3\n\
             [fragments]\nsize = 8192\n[transport]\ninterface = \"lo\"\n{extra}"
        ),
    )
    .unwrap();
    p
}

/// `evb node --config cfg` as rank `rank` of `ntasks` under a launcher whose variables are
/// `vars` (`{rank}` and `{n}` in a value are replaced).
fn node(cfg: &Path, args: &[&str], vars: &[(&str, String)]) -> Child {
    let mut c = Command::new(EVB);
    c.args(["node", "--json", "-", "--config"])
        .arg(cfg)
        .args(args);
    for v in LAUNCHER_VARS {
        c.env_remove(v);
    }
    for (k, v) in vars {
        c.env(k, v);
    }
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn slurm(rank: usize, n: usize, job: &str) -> Vec<(&'static str, String)> {
    vec![
        ("SLURM_PROCID", rank.to_string()),
        ("SLURM_NTASKS", n.to_string()),
        ("SLURM_JOB_ID", job.to_string()),
        ("SLURM_STEP_ID", "0".to_string()),
    ]
}

fn ompi(rank: usize, n: usize) -> Vec<(&'static str, String)> {
    vec![
        ("OMPI_COMM_WORLD_RANK", rank.to_string()),
        ("OMPI_COMM_WORLD_SIZE", n.to_string()),
    ]
}

/// Waits for every process, failing the test if one is still running after `limit`.
fn wait_all(kids: Vec<Child>, limit: Duration) -> Vec<Output> {
    let until = Instant::now() + limit;
    let mut kids = kids;
    loop {
        if kids
            .iter_mut()
            .all(|k| k.try_wait().is_ok_and(|s| s.is_some()))
        {
            return kids
                .into_iter()
                .map(|k| k.wait_with_output().unwrap())
                .collect();
        }
        if Instant::now() > until {
            for k in &mut kids {
                let _ = k.kill();
            }
            panic!("processes still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An `[evm]` section that puts the EVM's control API on a free port (the other nodes' stay
/// on ports of their own choosing: two processes may claim one node): its address.
fn control(toml: &mut String) -> String {
    let api = format!("127.0.0.1:{}", free_base_port(1));
    toml.push_str(&format!("[evm]\ncontrol = \"{api}\"\n"));
    api
}

/// The first of `kids` that has exited, named.
fn exited(kids: &mut [Child]) -> Option<String> {
    kids.iter_mut()
        .enumerate()
        .find_map(|(k, c)| match c.try_wait() {
            Ok(Some(st)) => Some(format!("process {k} exited ({st})")),
            _ => None,
        })
}

/// Waits until the EVM at `api` has `n` nodes registered (they read its address and called
/// it); panics if it does not within 20 s or a process exits first.
fn wait_registered(api: &str, n: usize, kids: &mut [Child]) {
    wait_node(
        api,
        &format!("{n} nodes registered with the EVM"),
        20,
        || exited(kids),
        |l| l["registered"].as_array().is_some_and(|r| r.len() == n),
    );
}

/// A Slurm-style launch in a random order with random delays (a seed printed), the default
/// rendezvous file beside the configuration, a stale one from a dead run there at first,
/// and shared memory between the nodes (transport.local): exact, and the EVM's report
/// names every node's rank, host and address.
#[test]
fn nodes_without_addresses_find_each_other_in_any_order() {
    let seed = std::env::var("EVB_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(common::clock_seed);
    eprintln!("seed {seed} (EVB_TEST_SEED={seed} replays this order)");
    let mut rng = Rng(seed | 1);
    let dir = common::out_dir();
    let cfg = no_addresses(dir.path(), "local = \"shm\"\n");
    let job = format!("{}", std::process::id());
    // what a killed EVM of an earlier step leaves behind: an address nobody listens on
    let file = dir.path().join(format!(".evb-found-slurm-{job}.0.evm"));
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std::fs::write(&file, format!("{} vm 1\n", dead.local_addr().unwrap())).unwrap();
    drop(dead);

    let mut order: Vec<usize> = (0..5).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    eprintln!("start order {order:?}");
    let mut kids: Vec<(usize, Child)> = Vec::new();
    for &rank in &order {
        std::thread::sleep(Duration::from_millis(rng.below(400)));
        kids.push((rank, node(&cfg, &[], &slurm(rank, 5, &job))));
    }
    kids.sort_by_key(|k| k.0);
    let outs = wait_all(
        kids.into_iter().map(|k| k.1).collect(),
        Duration::from_secs(60),
    );
    for (rank, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {rank} (seed {seed}): {}", text(o));
    }
    let report: Value = serde_json::from_slice(&outs[0].stdout).unwrap();
    assert_eq!(report["node"], "evm");
    assert_eq!(report["ok"], true, "{report}");
    let run = &report["run"];
    assert_eq!(run["evm"]["triggered"], 3000);
    assert_eq!(run["evm"]["released"], 3000);
    let built: u64 = run["bus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["events_built"].as_u64().unwrap())
        .sum();
    assert_eq!(built, 3000);
    // the RUs' fragments went over shared memory, found at the discovered address
    let by_reference: u64 = outs[1..3]
        .iter()
        .map(|o| {
            let r: Value = serde_json::from_slice(&o.stdout).unwrap();
            r["net"]["bytes_by_reference"].as_u64().unwrap()
        })
        .sum();
    assert!(by_reference >= 3000 * 2 * 8192, "{by_reference}");
    let reg = report["registered"].as_array().unwrap();
    let peers: Vec<&str> = reg.iter().map(|r| r["peer"].as_str().unwrap()).collect();
    assert_eq!(peers, ["ru[0]", "ru[1]", "bu[0]", "bu[1]"]);
    for (k, r) in reg.iter().enumerate() {
        assert_eq!(r["rank"], k as u64 + 1, "{r}");
        assert!(!r["host"].as_str().unwrap().is_empty());
        let data: std::net::SocketAddr = r["data"].as_str().unwrap().parse().unwrap();
        assert!(data.ip().is_loopback() && data.port() != 0, "{r}");
    }
    assert!(!file.exists(), "the EVM removes its rendezvous file");
}

/// A rank that never starts: within run.connect_timeout_s the EVM names it by id and rank,
/// every process that did start exits with an error, and the EVM's reason reaches them.
#[test]
fn a_rank_that_never_starts_is_named_and_everyone_exits() {
    let dir = common::out_dir();
    let cfg = no_addresses(dir.path(), "");
    let f = dir.path().join("r.evm");
    let args = ["--rendezvous", f.to_str().unwrap()];
    let started = Instant::now();
    // bu1 is rank 4; ranks 0 to 3 start
    let kids = (0..4).map(|r| node(&cfg, &args, &ompi(r, 5))).collect();
    let outs = wait_all(kids, Duration::from_secs(30));
    assert!(started.elapsed() < Duration::from_secs(20));
    for (rank, o) in outs.iter().enumerate() {
        assert!(!o.status.success(), "rank {rank}: {}", text(o));
    }
    let evm = text(&outs[0]);
    assert!(
        evm.contains("not connected: bu1 (rank 4): it never called"),
        "{evm}"
    );
    // the RUs wait for bu1's address: they say why, or the EVM's reason reached them
    for o in &outs[1..3] {
        let t = text(o);
        assert!(t.contains("bu1 (rank 4)"), "{t}");
    }
    assert!(!f.exists(), "the EVM removes its rendezvous file");
}

/// The EVM names a rank that never starts even when the RUs' own connect timers fire
/// before the EVM looks at its own: the EVM is stopped (SIGSTOP) across the RUs' timeout and
/// continued within their grace. The RUs wait for the EVM's word instead of exiting, which
/// the EVM would otherwise report as `lost ru[0] before the run started`, hiding the rank
/// that never came (a CI run on a loaded machine hit that race).
#[test]
fn a_late_evm_still_names_the_rank_that_never_starts() {
    let dir = common::out_dir();
    let cfg = dir.path().join("run.toml");
    // heartbeats may not declare the stopped EVM lost first
    let mut toml = "[run]\nid = \"late\"\nevents = 3000\nduration_s = 0\nconnect_timeout_s = 3\n\
         heartbeat_timeout_ms = 30000\n[fragments]\nsize = 8192\n[transport]\n\
         interface = \"lo\"\n"
        .to_string();
    let api = control(&mut toml);
    std::fs::write(&cfg, toml).unwrap();
    let f = dir.path().join("r.evm");
    let args = ["--rendezvous", f.to_str().unwrap()];
    let started = Instant::now();
    let mut kids: Vec<Child> = (0..4).map(|r| node(&cfg, &args, &ompi(r, 5))).collect();
    let evm_pid = kids[0].id().to_string();
    let signal = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &evm_pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {evm_pid}");
    };
    // ranks 1 to 3 have read the rendezvous file and called the EVM: their timers run (and
    // they wait for the EVM's word), and the EVM's own has not fired yet
    wait_registered(&api, 3, &mut kids);
    let registered = started.elapsed();
    assert!(
        registered < Duration::from_millis(1700),
        "the nodes took {registered:?} to register: too late to stop the EVM across the RUs' \
         timeout and continue it within their grace"
    );
    signal("-STOP");
    // the RUs' deadlines (3 s after they read the rendezvous file, before they registered)
    // pass while it is stopped; their grace (2 s more, from at least the test's start) not
    let cont_at = Duration::from_millis(4200).max(registered + Duration::from_millis(3200));
    eprintln!("registered after {registered:?}; the EVM stopped, continued at {cont_at:?}");
    std::thread::sleep(cont_at.saturating_sub(started.elapsed()));
    signal("-CONT");
    let outs = wait_all(kids, Duration::from_secs(30));
    let named = "not connected: bu1 (rank 4): it never called";
    let evm = text(&outs[0]);
    assert!(evm.contains(named), "{evm}");
    for (rank, o) in outs.iter().enumerate() {
        assert!(!o.status.success(), "rank {rank}: {}", text(o));
        let t = text(o);
        assert!(t.contains(named), "rank {rank}: {t}");
    }
}

/// Two processes claiming one node: the run is aborted before it starts, naming the node
/// and the first process; every process exits with an error.
#[test]
fn two_processes_claiming_one_node_abort_the_launch() {
    let dir = common::out_dir();
    let mut extra = String::new();
    let api = control(&mut extra);
    let cfg = no_addresses(dir.path(), &extra);
    let f = dir.path().join("r.evm");
    let args = ["--rendezvous", f.to_str().unwrap()];
    // ranks 0 to 3 and a second ru1; bu1 (rank 4) later, so the run cannot have started
    let mut kids: Vec<Child> = (0..4).map(|r| node(&cfg, &args, &ompi(r, 5))).collect();
    // the first ru1 is known to the EVM before the second comes
    wait_registered(&api, 3, &mut kids);
    let mut with_id = args.to_vec();
    with_id.extend(["--id", "ru1"]);
    kids.push(node(&cfg, &with_id, &[]));
    // the EVM has aborted the launch (or ended) before bu1 could complete it
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if kids[0].try_wait().is_ok_and(|s| s.is_some())
            || node_status(&api)["snapshot"]["state"] == "aborted"
        {
            break;
        }
        assert!(
            Instant::now() < until,
            "the EVM did not abort the launch within 20 s of the second ru1: {}",
            node_status(&api)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    kids.push(node(&cfg, &args, &ompi(4, 5)));
    let outs = wait_all(kids, Duration::from_secs(30));
    let all: String = outs.iter().map(text).collect();
    assert!(all.contains("two processes claim ru1 (rank 2)"), "{all}");
    // each process is either told of the abort or loses the EVM: none succeeds
    for (k, o) in outs.iter().enumerate() {
        assert!(!o.status.success(), "process {k}: {}", text(o));
    }
}

/// A host without the configured interface fails at once, naming the interface, the rank
/// and the host, and what the host has instead; a node that cannot know the EVM's address
/// says how to give it.
#[test]
fn launch_mistakes_fail_at_once_and_say_what_to_do() {
    let dir = common::out_dir();
    let cfg = no_addresses(dir.path(), "");
    let text_of = |c: Child| {
        let o = wait_all(vec![c], Duration::from_secs(5)).remove(0);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        text(&o)
    };
    let bad = dir.path().join("bad.toml");
    let body = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("\"lo\"", "\"ib7\"");
    std::fs::write(&bad, body).unwrap();
    let t = text_of(node(&bad, &["--rendezvous", "/nonexistent/r"], &ompi(3, 5)));
    assert!(
        t.contains("evb node bu0 (OMPI_COMM_WORLD_RANK 3, host ")
            && t.contains("transport.interface = \"ib7\"")
            && t.contains("no such interface (it has lo 127.0.0.1"),
        "{t}"
    );
    // no launcher's job to name a default rendezvous file, none given, no EVM address
    let t = text_of(node(&cfg, &["--id", "ru0"], &[]));
    assert!(
        t.contains("the EVM's address is not known") && t.contains("--evm HOST:PORT"),
        "{t}"
    );
    let t = text_of(node(&cfg, &["--id", "ru0", "--evm", "127.0.0.1:0"], &[]));
    assert!(t.contains("--evm 127.0.0.1:0: give the port"), "{t}");
}

/// `--evm HOST:PORT` instead of a rendezvous file: the EVM listens there, the others call
/// it, and the BUs are still found through the EVM.
#[test]
fn a_known_evm_address_needs_no_rendezvous_file() {
    let dir = common::out_dir();
    let cfg = no_addresses(dir.path(), "");
    let port = common::free_base_port(1);
    let evm = format!("127.0.0.1:{port}");
    let kids = (0..5)
        .map(|r| node(&cfg, &["--evm", &evm], &ompi(r, 5)))
        .collect();
    let outs = wait_all(kids, Duration::from_secs(60));
    for (rank, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {rank}: {}", text(o));
    }
    let report: Value = serde_json::from_slice(&outs[0].stdout).unwrap();
    assert_eq!(report["run"]["evm"]["released"], 3000, "{report}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no file but the configuration"
    );
}

/// A BU started without an address, killed at a random moment (a seed printed) and started
/// again: it listens on a new port, registers again, and the EVM tells the RUs, which call
/// it there; it builds again and the run is exact (what the dead one released plus what the
/// BUs built is every event).
#[test]
fn a_restarted_bu_registers_again_and_the_rus_find_it_on_its_new_port() {
    let seed = std::env::var("EVB_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(common::clock_seed);
    eprintln!("seed {seed} (EVB_TEST_SEED={seed} replays this moment)");
    let mut rng = Rng(seed | 1);
    let dir = common::out_dir();
    let cfg = dir.path().join("run.toml");
    let mut toml = "[run]\nid = \"moved\"\nevents = 8000\nduration_s = 0\nrate_hz = 2000\n\
         [fragments]\nsize = 20000\n[transport]\ninterface = \"lo\"\n"
        .to_string();
    let api = control(&mut toml);
    std::fs::write(&cfg, toml).unwrap();
    let f = dir.path().join("r.evm");
    let args = ["--rendezvous", f.to_str().unwrap()];
    let mut kids: Vec<Child> = (0..5).map(|r| node(&cfg, &args, &ompi(r, 5))).collect();
    // after the start (the EVM says it is running), before the last second
    let kill_at = 800 + rng.below(1000);
    eprintln!("bu1 killed {kill_at} ms after the run was seen running");
    wait_node(
        &api,
        "the run running (the EVM's status)",
        30,
        || exited(&mut kids),
        |l| triggered_at_least(l, 1),
    );
    std::thread::sleep(Duration::from_millis(kill_at));
    assert!(
        kids[4].try_wait().unwrap().is_none(),
        "bu1 ended before it could be killed (seed {seed})"
    );
    kids[4].kill().unwrap();
    let _ = kids[4].wait();
    // down for a moment (the fault's own length), then back
    std::thread::sleep(Duration::from_millis(300));
    let mut with_id = args.to_vec();
    with_id.extend(["--id", "bu1"]);
    kids[4] = node(&cfg, &with_id, &[]);
    let outs = wait_all(kids, Duration::from_secs(60));
    for (k, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "process {k} (seed {seed}): {}", text(o));
    }
    let report: Value = serde_json::from_slice(&outs[0].stdout).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    let run = &report["run"];
    assert_eq!(run["evm"]["released"], 8000, "{report}");
    let events: Vec<NodeEvent> = serde_json::from_value(run["evm"]["lost"].clone()).unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.kind == NodeEventKind::Rejoined && e.node == "bu[1]"),
        "{}",
        run["evm"]["lost"]
    );
    let built: u64 = run["bus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["events_built"].as_u64().unwrap())
        .sum();
    assert_eq!(
        built + run["evm"]["released_by_lost"].as_u64().unwrap(),
        8000,
        "{report}"
    );
    assert!(
        run["bus"][1]["events_built"].as_u64().unwrap() > 0,
        "the restarted BU built again (seed {seed})"
    );
    // it registered twice, the second time from another process on another port
    let reg = report["registered"].as_array().unwrap();
    let bu1 = reg.iter().find(|r| r["peer"] == "bu[1]").unwrap();
    assert_eq!(
        bu1["rank"],
        Value::Null,
        "the restarted one has no launcher rank"
    );
}

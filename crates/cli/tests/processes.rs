//! The event builder as real processes over TCP loopback, launched by `evb run` (and by hand
//! with `evb node`): exact event counts, no duplicates, checksums verified, clean shutdown,
//! no process left behind.

mod common;
use common::{assert_exact, evb_run, evb_run_in, evb_run_in_env, text, EVB};

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn assert_exact_run(rus: u32, bus: u32, events: u64, fragment: &str) {
    let toml = format!(
        r#"
        [run]
        id = "it-{rus}x{bus}"
        events = {events}
        duration_s = 0
        [fragments]
        {fragment}
        [topology]
        rus = {rus}
        bus = {bus}
        "#
    );
    let (out, s) = evb_run(&toml);
    assert_exact(&out, &s, events, rus as usize, bus as usize);
}

#[test]
fn one_by_one() {
    assert_exact_run(1, 1, 2000, "size = 4096");
}

#[test]
fn two_by_two_one_megabyte_events() {
    assert_exact_run(2, 2, 400, "size = 524288");
}

#[test]
fn three_by_two_lognormal() {
    assert_exact_run(3, 2, 3000, "size = 2048\ndistribution = \"lognormal\"");
}

#[test]
fn two_by_three() {
    assert_exact_run(2, 3, 1500, "size = 30000");
}

#[test]
fn barrel_shifted_rus_build_exactly_trapezoidal_both_ways() {
    // slots of 200 µs: each RU sends to one BU at a time, (i + t) mod max(N, M)
    // (log-normal fragment sizes: a slot carries whole fragments, up to its bytes)
    for (rus, bus) in [(2, 3), (3, 2)] {
        assert_exact_run(
            rus,
            bus,
            3000,
            "size = 8192\ndistribution = \"lognormal\"\n[traffic]\nshaping = \"barrel\"\n\
             slot_us = 200\nslot_bytes = 40000",
        );
    }
    // the default run's 512 KiB fragments under the default slot budget (one largest
    // fragment with its prefix a slot), which a fixed 128 KiB budget refused
    assert_exact_run(2, 2, 400, "size = 524288\n[traffic]\nshaping = \"barrel\"");
}

#[test]
fn default_run_is_bounded_and_clean() {
    // the built-in configuration, shortened: what README's first command runs
    let dir = common::out_dir();
    let json = dir.path().join("s.json");
    let out = Command::new(EVB)
        .args(["run", "--quiet", "--duration", "3", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let released = s["run"]["evm"]["released"].as_u64().unwrap();
    assert!(released > 0);
    assert_eq!(s["run"]["n_ru"], 2);
    assert_eq!(s["run"]["n_bu"], 2);
    // the steady-state rate leaves the start out: from the BUs' counts after 1 s of the 3,
    // so it is a rate of the same run, not the whole run's events over its seconds
    let whole = released as f64 / s["run"]["seconds"].as_f64().unwrap();
    let steady = s["steady_events_per_s"]
        .as_f64()
        .unwrap_or_else(|| panic!("no steady rate in {}", s["steady_events_per_s"]));
    assert!(
        steady > whole * 0.3 && steady < whole * 5.0,
        "steady {steady} against the whole run's {whole} events/s"
    );
    assert!(
        stdout.contains("steady state (the BUs' counts from 1 s into the run):"),
        "{stdout}"
    );
    // the latency from the trigger, one clock (the EVM's), every event timed once
    assert!(
        stdout
            .contains("latency from trigger to built (the EVM's clock, to the BU's release): p50 "),
        "{stdout}"
    );
    assert_eq!(s["run"]["evm"]["record_latency"]["count"], released, "{s}");
}

/// A paced run (`run.rate_hz`) the builder cannot keep up with, through `evb run`: every
/// event's latency from the trigger starts at its due time, so the backlog's wait for a
/// BU's credit counts (issue 68 item 3). At 100 kHz of 1 MiB events the events due pile
/// up for the whole run and wait about half of it on average, while each one's own
/// building (its BU's Assign to built) stays short.
#[test]
fn a_paced_run_that_falls_behind_counts_the_wait_for_credit_in_its_latency() {
    let dir = common::out_dir();
    let json = dir.path().join("s.json");
    let cfg = dir.path().join("paced.toml");
    std::fs::write(&cfg, "[run]\nrate_hz = 100000\n").unwrap();
    let out = Command::new(EVB)
        .args(["run", "--quiet", "--duration", "3", "--config"])
        .arg(&cfg)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let released = s["run"]["evm"]["released"].as_u64().unwrap();
    assert!(released > 0, "{s}");
    assert_eq!(s["run"]["evm"]["record_latency"]["count"], released, "{s}");
    let p50 = |h: &Value| -> f64 {
        let h: evb_builder::LatencyHistogram = serde_json::from_value(h.clone()).unwrap();
        h.quantile_us(0.5).unwrap() as f64
    };
    let trigger = p50(&s["run"]["evm"]["record_latency"]);
    let building: f64 = s["run"]["bus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| p50(&b["latency"]))
        .fold(0.0, f64::max);
    assert!(
        trigger > 300_000.0 && trigger > 10.0 * building,
        "from the trigger p50 {trigger} us, the BUs' own p50 at most {building} us"
    );
}

/// `--json -`: stdout is the JSON document alone (it parses whole, and agrees with the
/// verdict), the table and verdict for people on stderr.
#[test]
fn json_dash_puts_the_document_on_stdout_and_the_words_on_stderr() {
    let out = Command::new(EVB)
        .args(["run", "--quiet", "--events", "2000", "--json", "-"])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let s: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}:\n{stdout}"));
    assert_eq!(s["ok"], true, "{s}");
    assert_eq!(s["run"]["evm"]["released"], 2000, "{s}");
    assert!(
        stderr.contains("VERDICT: OK - every triggered event (2000)"),
        "{stderr}"
    );
    assert!(!stdout.contains("VERDICT"), "{stdout}");
}

#[test]
fn inproc_run_from_the_cli() {
    let (out, s) = evb_run("[run]\nid = \"it-inproc\"\nevents = 5000\nduration_s = 0\n[fragments]\nsize = 1000\n[transport]\nkind = \"inproc\"\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(s["run"]["evm"]["released"], 5000);
}

/// Ctrl-C to `evb run` with its nodes as threads (`transport.kind = "inproc"`), at a seeded
/// moment from 100 ms after the start, before or after the run starts: the launcher stops
/// the run through the EVM's run control; it drains, exits 0 and names the operator's stop.
#[test]
fn ctrl_c_stops_an_inproc_run_cleanly() {
    let (seed, trials) = common::chaos_seed("EVB_INPROC_CTRLC_TRIALS", 2);
    eprintln!("inproc ctrl-c: seed {seed} ({trials} trials): EVB_CHAOS_SEED={seed} replays them");
    let mut rng = common::Rng(seed | 1);
    for trial in 0..trials {
        let at = 100 + rng.below(900);
        let dir = common::out_dir();
        let cfg = write(
            dir.path(),
            "run.toml",
            "[run]\nid = \"it-inproc-ctrlc\"\nduration_s = 30\n[fragments]\nsize = 4096\n[transport]\nkind = \"inproc\"\n",
        );
        let l = Command::new(EVB)
            .args(["run", "--quiet", "--config"])
            .arg(&cfg)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(at));
        // SAFETY: kill(2) with the pid of a child of this process and a valid signal.
        unsafe { libc::kill(l.id() as i32, libc::SIGINT) };
        let t0 = std::time::Instant::now();
        let o = l.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        let why = format!("seed {seed} trial {trial} at {at} ms: {}", text(&o));
        assert!(
            t0.elapsed().as_secs() < 15,
            "the stop took {:?}: {why}",
            t0.elapsed()
        );
        assert!(o.status.success(), "{why}");
        assert!(out.contains("VERDICT: OK"), "{why}");
        assert!(out.contains("ended early by the operator"), "{why}");
    }
}

#[test]
fn bad_configurations_are_refused_with_the_key_named() {
    let dir = common::out_dir();
    for (text, needle) in [
        ("[topology]\nbus = 0\n", "topology.bus"),
        ("[run]\nduraton_s = 3\n", "duraton_s"),
        ("[[ru]]\nid = \"a\"\naddr = \"127.0.0.1:7001\"\n[[bu]]\nid = \"a\"\naddr = \"127.0.0.1:7002\"\n", "duplicate node id"),
        ("[[ru]]\nid = \"a\"\naddr = \"127.0.0.1:7001\"\n[[bu]]\nid = \"b\"\naddr = \"127.0.0.1:7001\"\n", "port clash"),
    ] {
        let p = write(dir.path(), "bad.toml", text);
        for args in [vec!["run", "--config"], vec!["config", "check"]] {
            let out = Command::new(EVB).args(&args).arg(&p).output().unwrap();
            assert_eq!(out.status.code(), Some(2), "{text}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(needle), "{args:?} on {text:?}: {err}");
            assert!(!err.contains("panicked"), "{err}");
        }
    }
    let out = Command::new(EVB)
        .args(["run", "--config", "/nonexistent/x.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}

/// `evb config check` checks what the nodes will open (issue 71 item 2): an RU's replay file
/// that is not there and a sink folder under a file are refused with exit 2, each naming its
/// key; with the file present and the folder fine the same configuration is valid.
#[test]
fn config_check_names_a_missing_data_file_and_an_unusable_sink_folder() {
    let dir = common::out_dir();
    let d = dir.path();
    std::fs::write(d.join("present.raw"), b"x").unwrap();
    std::fs::write(d.join("a-file"), b"x").unwrap();
    let text = |files: &str, sink: &str| {
        format!(
            "[source]\nkind = \"fed\"\n[sink]\nkind = \"file\"\ndir = {sink:?}\n\
             [[ru]]\nid = \"ru0\"\naddr = \"127.0.0.1:7101\"\nfiles = [{files}]\n\
             [[bu]]\nid = \"bu0\"\naddr = \"127.0.0.1:7102\"\n"
        )
    };
    let p = write(
        d,
        "missing.toml",
        &text("\"present.raw\", \"gone.raw\"", "a-file/out"),
    );
    let out = Command::new(EVB)
        .args(["config", "check"])
        .arg(&p)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("ru[0].files[1] (ru0)")
            && err.contains("gone.raw")
            && err.contains("No such file"),
        "{err}"
    );
    assert!(!err.contains("files[0]"), "{err}");
    assert!(
        err.contains("sink.dir") && err.contains("is not a folder"),
        "{err}"
    );
    let p = write(d, "fine.toml", &text("\"present.raw\"", "out/{run}"));
    let out = Command::new(EVB)
        .args(["config", "check"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("valid"));
}

/// Every node pinned to one CPU (the last): the run is exact, each node says where it runs;
/// a CPU that does not exist stops the run with the key named. (One BU: on one busy CPU a
/// second BU may be scheduled too late to get any event, which `assert_exact` would flag.)
#[test]
fn nodes_run_on_the_cpus_their_affinity_names() {
    let cpu = *evb_node::affinity::current_cpus().unwrap().last().unwrap();
    let dir = common::out_dir();
    let toml = format!(
        "[run]\nid = \"it-pin\"\nevents = 1000\nduration_s = 0\n[fragments]\nsize = 4096\n\
         [topology]\nrus = 2\nbus = 1\n\
         [affinity]\nevm = [{cpu}]\nru0 = [{cpu}]\nru1 = [{cpu}]\nbu0 = [{cpu}]\n"
    );
    let (out, s) = evb_run_in_env(dir.path(), &toml, &[("EVB_LOG", "evb_node=info")]);
    assert_exact(&out, &s, 1000, 2, 1);
    let said = format!("pinned to CPUs [{cpu}]");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches(&said).count(), 4, "{stderr}");

    let bad = toml.replace(&format!("bu0 = [{cpu}]"), "bu0 = [1000]");
    let (out, _) = evb_run_in(dir.path(), &bad);
    assert!(!out.status.success());
    assert!(text(&out).contains("affinity.bu0"), "{}", text(&out));
}

/// `run.placement = "auto"`: `evb run` pins the RUs and BUs it was not told about, one CPU
/// each when there are enough, else an RU and a BU together on each group of CPUs (on two
/// CPUs: ru0 with bu0, ru1 with bu1); the EVM floats; "none" pins nothing. (Enough events
/// that both BUs get some: the first BU's credits may cover a short run by themselves.)
#[test]
fn evb_run_places_rus_and_bus_by_itself() {
    let cpus = evb_node::affinity::current_cpus().unwrap();
    if cpus.len() < 2 {
        evb_buffers::skips::skipped(
            "evb_run_places_rus_and_bus_by_itself",
            "one CPU, nothing to place",
        );
        return;
    }
    let dir = common::out_dir();
    let toml =
        "[run]\nid = \"it-place\"\nplacement = \"auto\"\nevents = 20000\nduration_s = 0\n[fragments]\nsize = 65536\n";
    let (out, s) = evb_run_in_env(dir.path(), toml, &[("EVB_LOG", "evb_node=info")]);
    assert_exact(&out, &s, 20000, 2, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let pinned: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("pinned to CPUs"))
        .collect();
    assert_eq!(pinned.len(), 4, "{stderr}");
    assert!(
        !pinned.iter().any(|l| l.contains("node=\"evm\"")),
        "{stderr}"
    );
    let cpu_of = |id: &str| -> String {
        let l = pinned
            .iter()
            .find(|l| l.contains(&format!("node=\"{id}\"")))
            .unwrap();
        let from = l.find("pinned to CPUs").unwrap();
        let to = from + l[from..].find(']').unwrap();
        l[from..=to].to_string()
    };
    if cpus.len() >= 4 {
        // a CPU each
        let mut sets: Vec<String> = ["ru0", "ru1", "bu0", "bu1"].map(cpu_of).to_vec();
        sets.sort();
        sets.dedup();
        assert_eq!(sets.len(), 4, "{stderr}");
    } else {
        // pairs: every CPU group carries an RU and a BU
        assert_eq!(cpu_of("ru0"), cpu_of("bu0"), "{stderr}");
        assert_eq!(cpu_of("ru1"), cpu_of("bu1"), "{stderr}");
        assert_ne!(cpu_of("ru0"), cpu_of("ru1"), "{stderr}");
    }
    let none = toml.replace("placement = \"auto\"", "placement = \"none\"");
    let (out, s) = evb_run_in_env(dir.path(), &none, &[("EVB_LOG", "evb_node=info")]);
    assert_exact(&out, &s, 20000, 2, 2);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("pinned to CPUs"));
}

#[test]
fn unknown_node_id_is_an_error() {
    let dir = common::out_dir();
    let p = write(dir.path(), "c.toml", "[topology]\nbase_port = 7700\n");
    let out = Command::new(EVB)
        .args(["node", "--id", "ru9", "--config"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no node \"ru9\""));
}

#[test]
fn shm_two_by_two_moves_fragments_without_copies() {
    let (out, s) = evb_run(
        "[run]\nid = \"it-shm\"\nevents = 500\nduration_s = 0\n[fragments]\nsize = 524288\n[transport]\nkind = \"shm\"\n",
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(s["run"]["evm"]["released"], 500);
    let built: u64 = s["run"]["bus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["events_built"].as_u64().unwrap())
        .sum();
    assert_eq!(built, 500);
    for ru in ["ru0", "ru1"] {
        let r = &s["nodes"][ru];
        let payload = r["stats"]["payload_bytes_sent"].as_u64().unwrap();
        assert_eq!(payload, 500 * 524288);
        assert!(
            r["net"]["bytes_by_reference"].as_u64().unwrap() >= payload,
            "{ru}: {}",
            r["net"]
        );
        assert_eq!(
            r["net"]["bytes_copied"], 0,
            "{ru} copied bytes: {}",
            r["net"]
        );
    }
}

/// Processes whose parent is `pid`, with their command lines (from /proc).
fn children_of(pid: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": the command may hold spaces, so split after ')'
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push((child, cmdline(child)));
        }
    }
    out
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// The memfds a process has open (links in /proc/PID/fd that name one).
fn memfds(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|t| t.to_string_lossy().into_owned())
                .filter(|t| t.starts_with("/memfd:"))
                .collect()
        })
        .unwrap_or_default()
}

/// Over shm, while the run is live, each node holds only the memfds it should: its own pools
/// and at most two per peer (a peer's fragment pool and its bounce pool), so a descriptor that
/// leaks per frame or per packet shows at once. After the run none of its node processes is
/// left: memfds and abstract sockets die with them, so that is what "nothing left behind"
/// means over shm (/dev/shm never holds either).
#[test]
fn shm_run_keeps_no_stray_memfd_and_leaves_no_process() {
    let dir = common::out_dir();
    let cfg = write(
        dir.path(),
        "run.toml",
        "[run]\nid = \"it-shm-live\"\nduration_s = 3\n[fragments]\nsize = 65536\n\
         [transport]\nkind = \"shm\"\n",
    );
    let run = Command::new(EVB)
        .args(["run", "--quiet", "--config"])
        .arg(&cfg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // 2 RUs, 2 BUs and the EVM, looked at half-way through the run
    let t0 = std::time::Instant::now();
    let mut nodes = Vec::new();
    while t0.elapsed() < std::time::Duration::from_millis(1500) || nodes.len() < 5 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "nodes: {nodes:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
        nodes = children_of(run.id());
    }
    assert_eq!(nodes.len(), 5, "{nodes:?}");
    let mut seen = Vec::new();
    for (pid, cmd) in &nodes {
        assert!(cmd.contains(" node "), "{cmd}");
        let fds = memfds(*pid);
        // own pools (a bounce pool; an RU's fragment pool), then two per peer at most
        let bound = 2 + 2 * 4;
        assert!(
            !fds.is_empty() && fds.len() <= bound,
            "{cmd}: {} memfds open (at most {bound} expected): {fds:?}",
            fds.len()
        );
        seen.push(fds.len());
    }
    let out = run.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // every node process is gone (a pid reused meanwhile runs another command line)
    for (pid, cmd) in &nodes {
        assert_ne!(
            cmdline(*pid),
            *cmd,
            "node process {pid} still running after the run"
        );
    }
    assert!(
        seen.iter().any(|n| *n >= 3),
        "a BU maps both RUs' fragment pools: {seen:?}"
    );
}

#[test]
fn nodes_take_their_ids_from_the_launchers_rank() {
    // as srun or mpirun start them: the same command line, a rank in the environment
    let dir = common::out_dir();
    let base = common::free_base_port(5);
    let cfg = write(
        dir.path(),
        "ranked.toml",
        &format!(
            "[run]\nid = \"ranked\"\nevents = 3000\nduration_s = 0\n[fragments]\nsize = 8192\n\
             [topology]\nbase_port = {base}\n"
        ),
    );
    let kids: Vec<_> = (0..5)
        .map(|rank| {
            Command::new(EVB)
                .args(["node", "--json", "-", "--config"])
                .arg(&cfg)
                .env("OMPI_COMM_WORLD_RANK", rank.to_string())
                .env("OMPI_COMM_WORLD_SIZE", "5")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = kids
        .into_iter()
        .map(|k| k.wait_with_output().unwrap())
        .collect();
    for (rank, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {rank}: {}", text(o));
    }
    // rank 0 is the EVM: its report is the run's
    let report: Value = serde_json::from_slice(&outs[0].stdout).unwrap();
    assert_eq!(report["node"], "evm", "{report}");
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["run"]["evm"]["triggered"], 3000);
    assert_eq!(report["run"]["evm"]["released"], 3000);
    // a launcher that started another number of tasks is told so, naming the nodes
    let o = Command::new(EVB)
        .args(["node", "--config"])
        .arg(&cfg)
        .env("SLURM_PROCID", "0")
        .env("SLURM_NTASKS", "4")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("started 4 tasks (SLURM_NTASKS) but the configuration has 5 nodes (evm, ru0, ru1, bu0, bu1)"),
        "{}",
        text(&o)
    );
}

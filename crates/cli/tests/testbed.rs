//! `evb testbed` as a user runs it: a 3 × 3 run on shaped links between network namespaces,
//! exact, with every namespace, link, bridge and qdisc removed afterwards; and a testbed
//! killed midway is cleaned up by the next start.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const EVB: &str = env!("CARGO_BIN_EXE_evb");

fn root() -> bool {
    use std::os::unix::fs::MetadataExt;
    let ok = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
        && Command::new("ip")
            .args(["netns", "list"])
            .status()
            .is_ok_and(|s| s.success());
    if !ok {
        evb_buffers::skips::skipped("testbed", "evb testbed needs root and iproute2");
    }
    ok
}

fn left(name: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("{name}-")))
        .map(String::from)
        .collect()
}

const SMALL: &str = "[fragments]\nsize = 65536\n";

/// A testbed `name` run on configuration `toml` with `args`, at 100 Mb/s, with its JSON
/// summary: it must succeed with VERDICT OK and release every event it triggered.
/// `args` are separated by spaces. Returns its stdout, its stderr and the summary. `why`
/// heads a failure's message (a seed).
fn exact_testbed(
    name: &str,
    toml: &str,
    args: &str,
    why: &str,
) -> (String, String, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.toml");
    std::fs::write(&cfg, toml).unwrap();
    let json = dir.path().join("summary.json");
    let out = Command::new(EVB)
        .arg("testbed")
        .args(args.split_whitespace())
        .args(["--rate", "100mbit", "--quiet", "--name", name, "--config"])
        .arg(&cfg)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    assert!(out.status.success(), "{why}\n{stdout}\n{stderr}");
    assert!(stdout.contains("VERDICT: OK"), "{why}\n{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(v["run"]["evm"]["triggered"].as_u64().unwrap() > 0, "{why}");
    assert_eq!(
        v["run"]["evm"]["released"], v["run"]["evm"]["triggered"],
        "{why}"
    );
    (stdout, stderr, v)
}

#[test]
fn a_three_by_three_testbed_builds_exactly_and_leaves_nothing_behind() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.toml");
    std::fs::write(&cfg, SMALL).unwrap();
    let name = format!("a{}", std::process::id() % 100_000);
    let json = dir.path().join("summary.json");
    let out = Command::new(EVB)
        .args(["testbed", "--rus", "3", "--bus", "3", "--duration", "2"])
        .args(["--rate", "100mbit", "--quiet", "--name", &name, "--config"])
        .arg(&cfg)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("VERDICT: OK"), "{stdout}");
    assert!(
        stdout.contains("BU links (the bottleneck side):"),
        "{stdout}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let triggered = v["run"]["evm"]["triggered"].as_u64().unwrap();
    assert!(triggered > 0);
    assert_eq!(v["run"]["evm"]["released"], triggered);
    // the testbed's figures are in the summary too
    let mean = v["testbed"]["bottleneck"]["mean_fraction"]
        .as_f64()
        .unwrap();
    assert!(mean > 0.0 && mean < 1.01, "{}", v["testbed"]);
    assert_eq!(v["testbed"]["links"].as_array().unwrap().len(), 6);
    // the shaped ports' packets: the switch's towards the BUs carried the run's fragments
    // (a 64 KiB fragment is over 40 packets)
    assert!(
        stdout.contains("drops at the shaped ports (each a chunk"),
        "{stdout}"
    );
    let sent = v["testbed"]["drops"]["switch"]["sent"].as_u64().unwrap();
    assert!(sent > 40 * triggered, "{}", v["testbed"]);
    assert!(v["testbed"]["drops"]["hosts"]["dropped"].is_u64());
    // the hosts' TCP counters: each RU sent every fragment's 46 segments (64 KiB of 1448)
    // over the switch (each BU's 3), so the segments sent are at least 3 RUs x 46 an
    // event; what was sent again is a part of them
    assert!(stdout.contains("TCP in the hosts:"), "{stdout}");
    let tcp = &v["testbed"]["tcp"];
    let segments = tcp["segments_sent"].as_u64().unwrap();
    assert!(segments >= 3 * 46 * triggered, "{tcp}");
    assert!(
        tcp["segments_sent_again"].as_u64().unwrap() < segments,
        "{tcp}"
    );
    assert!(tcp["timeouts"].is_u64(), "{tcp}");
    // the BUs' links carried close to the shaped rate, and no more
    let secs = v["run"]["seconds"].as_f64().unwrap();
    for b in v["run"]["bus"].as_array().unwrap() {
        let mbps = b["payload_bytes_built"].as_f64().unwrap() * 8.0 / secs / 1e6;
        assert!(mbps < 101.0, "a 100 Mb/s link carried {mbps:.1} Mb/s");
    }
    assert_eq!(left(&name), Vec::<String>::new(), "namespaces left behind");
}

/// `--host-queue 8mb`: the hosts' own ports deep, as real NICs are. Three RUs over five BUs
/// at a 96 KB switch queue, where hosts shaped like switch ports drop a fifth of their
/// chunks (docs/scaling.md, "Held out"): the hosts drop nothing and TCP has nothing refused,
/// the switch's queue stays 96 KB, and the run is exact. A value that is no tc size is
/// refused, naming the flag.
#[test]
fn a_deep_host_queue_leaves_the_drops_to_the_switch() {
    if !root() {
        return;
    }
    let name = format!("q{}", std::process::id() % 100_000);
    let (_, _, v) = exact_testbed(
        &name,
        SMALL,
        "--rus 3 --bus 5 --duration 2 --queue 96kb --host-queue 8mb",
        "3 x 5, deep hosts",
    );
    let t = &v["testbed"];
    assert_eq!(t["queue"], "96kb", "{t}");
    assert_eq!(t["host_queue"], "8mb", "{t}");
    assert_eq!(t["drops"]["hosts"]["dropped"], 0, "{t}");
    assert!(t["drops"]["hosts"]["sent"].as_u64().unwrap() > 1000, "{t}");
    assert_eq!(t["tcp"]["retransmits_refused_by_host"], 0, "{t}");
    assert_eq!(left(&name), Vec::<String>::new(), "namespaces left behind");

    let out = Command::new(EVB)
        .args([
            "testbed",
            "--rus",
            "1",
            "--bus",
            "1",
            "--host-queue",
            "8 megs",
        ])
        .args(["--name", &name])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("--host-queue"), "{said}");
    assert_eq!(left(&name), Vec::<String>::new(), "namespaces left behind");
}

#[test]
fn a_testbed_killed_midway_is_cleaned_up_by_the_next_start() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.toml");
    std::fs::write(&cfg, SMALL).unwrap();
    let name = format!("k{}", std::process::id() % 100_000);
    let mut first = Command::new(EVB)
        .args(["testbed", "--rus", "2", "--bus", "2", "--duration", "30"])
        .args(["--rate", "100mbit", "--quiet", "--name", &name, "--config"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while left(&name).len() < 6 {
        assert!(Instant::now() < until, "the testbed was never built");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1500));
    first.kill().unwrap();
    first.wait().unwrap();
    assert_eq!(
        left(&name).len(),
        6,
        "a killed testbed leaves its namespaces"
    );
    let out = Command::new(EVB)
        .args(["testbed", "--rus", "2", "--bus", "2", "--duration", "1"])
        .args(["--rate", "100mbit", "--quiet", "--name", &name, "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("removed a stale testbed"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("VERDICT: OK"));
    assert_eq!(left(&name), Vec::<String>::new());
}

#[test]
fn a_folded_testbed_keeps_each_hosts_own_fragment_off_the_network() {
    if !root() {
        return;
    }
    let name = format!("f{}", std::process::id() % 100_000);
    let (_, stderr, v) = exact_testbed(
        &name,
        &format!("{SMALL}[topology]\nfolded = true\n"),
        "--rus 2 --bus 2 --duration 2",
        "folded 2 x 2",
    );
    // the EVM, then two hosts of an RU and a BU each
    assert!(stderr.contains("3 hosts on one switch (folded"), "{stderr}");
    // half of each BU's data came from its own host's RU: its 100 Mb/s link carried only
    // the other half, so it built more than the link could carry
    let secs = v["run"]["seconds"].as_f64().unwrap();
    let built: f64 = v["run"]["bus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["payload_bytes_built"].as_f64().unwrap() * 8.0 / secs / 1e6)
        .sum::<f64>()
        / 2.0;
    assert!(
        built > 105.0 && built < 202.0,
        "each folded BU built {built:.1} Mb/s over a 100 Mb/s link"
    );
    assert_eq!(left(&name), Vec::<String>::new(), "namespaces left behind");
}

/// Nodes started as a launcher starts them, one per host without an address, with the run
/// secret: they register their testbed addresses (beyond loopback) with the EVM and build
/// an exact run.
#[test]
fn a_discovery_testbed_finds_nodes_beyond_loopback() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.toml");
    std::fs::write(&cfg, SMALL).unwrap();
    let name = format!("d{}", std::process::id() % 100_000);
    let json = dir.path().join("summary.json");
    let out = Command::new(EVB)
        .args(["testbed", "--discover", "--rus", "2", "--bus", "2"])
        .args([
            "--duration",
            "1",
            "--rate",
            "1gbit",
            "--quiet",
            "--name",
            &name,
        ])
        .arg("--config")
        .arg(&cfg)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("VERDICT: OK"), "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let triggered = v["run"]["evm"]["triggered"].as_u64().unwrap();
    assert!(triggered > 0);
    assert_eq!(v["run"]["evm"]["released"], triggered);
    // ranks 1 to 4 on hosts 2 to 5 of the testbed's network, each on a port it chose
    let reg = v["registered"].as_array().unwrap();
    assert_eq!(reg.len(), 4, "{v}");
    for (k, r) in reg.iter().enumerate() {
        assert_eq!(r["rank"], k as u64 + 1);
        let a: std::net::SocketAddr = r["data"].as_str().unwrap().parse().unwrap();
        assert_eq!(a.ip().to_string(), format!("10.250.0.{}", k + 2), "{r}");
        assert_ne!(a.port(), 0);
    }
    assert_eq!(left(&name), Vec::<String>::new(), "namespaces left behind");
}

/// The EVM's RU→BU matrix (`GET /api/v1/links`) asked from inside the EVM's host.
fn links(name: &str, token: &str) -> Option<serde_json::Value> {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &format!("{name}-h0"),
            "curl",
            "-fsS",
            "-m",
            "2",
        ])
        .arg("-H")
        .arg(format!("Authorization: Bearer {token}"))
        .arg("http://10.250.0.1:8000/api/v1/links")
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// A testbed under way, interrupted (and so removed, as on Ctrl-C) if the test fails.
struct Interrupt(std::process::Child);
impl Drop for Interrupt {
    fn drop(&mut self) {
        if self.0.try_wait().is_ok_and(|s| s.is_none()) {
            let _ = Command::new("kill")
                .args(["-INT", &self.0.id().to_string()])
                .status();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn a_slowed_link_stands_out_in_the_ru_to_bu_matrix() {
    if !root()
        || !Command::new("curl")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    {
        evb_buffers::skips::skipped("testbed slow link", "needs root, iproute2 and curl");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.toml");
    let secret = "slow-link-test-4d1";
    std::fs::write(
        &cfg,
        format!("[run]\nsecret = \"{secret}\"\n[fragments]\nsize = 65536\n"),
    )
    .unwrap();
    let token = evb_control::control_token(secret.as_bytes());
    let name = format!("s{}", std::process::id() % 100_000);
    // every link 1 Gbit/s but bu1's, 40 Mbit/s: bu1 gets a trickle of what bu0 gets
    let mut tb = Interrupt(
        Command::new(EVB)
            .args(["testbed", "--rus", "2", "--bus", "2", "--duration", "15"])
            .args(["--rate", "1gbit", "--slow", "bu1=40mbit", "--quiet"])
            .args(["--name", &name, "--config"])
            .arg(&cfg)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let until = Instant::now() + Duration::from_secs(40);
    let mut last = None;
    let seen = loop {
        if let Some(m) = links(&name, &token) {
            let rate = |i: usize, j: usize| m["bytes_per_s"][i][j].as_f64().unwrap_or(0.0);
            // two polls into the run: every link has moved bytes and has a rate
            let moving = (0..2).all(|i| (0..2).all(|j| rate(i, j) > 0.0));
            if m["rus"] == serde_json::json!(["ru0", "ru1"])
                && m["bus"] == serde_json::json!(["bu0", "bu1"])
                && moving
            {
                break m;
            }
            last = Some(m);
        }
        assert!(
            Instant::now() < until && tb.0.try_wait().unwrap().is_none(),
            "the matrix never showed every link moving: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    // at first the RUs fill their send queues to both BUs alike: a few seconds on, what
    // moves is what each link carries
    let first = seen["bytes"].clone();
    std::thread::sleep(Duration::from_secs(5));
    let seen = links(&name, &token).expect("the matrix, 5 s later");
    assert_ne!(seen["bytes"], first, "{seen}");
    eprintln!("RU→BU matrix with bu1 slowed: {seen}");
    for i in 0..2 {
        let fast = seen["bytes_per_s"][i][0].as_f64().unwrap();
        let slow = seen["bytes_per_s"][i][1].as_f64().unwrap();
        assert!(
            slow * 3.0 < fast,
            "ru{i}: the slowed link to bu1 ({slow} B/s) does not stand out against bu0's ({fast} B/s): {seen}"
        );
        // 40 Mbit/s into bu1 from both RUs together: each RU's share stays under it
        assert!(slow < 40e6 / 8.0 * 1.2, "ru{i} → bu1 at {slow} B/s: {seen}");
    }
    let mut child = tb.0.stdout.take().unwrap();
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child, &mut stdout).unwrap();
    let status = tb.0.wait().unwrap();
    let mut stderr = String::new();
    if let Some(mut e) = tb.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("VERDICT: OK"), "{stdout}");
    assert!(left(&name).is_empty(), "{:?}", left(&name));
}

/// A folded 4 × 4 run under two leaf switches joined by two spines, routed by destination:
/// exact, and every uplink carried the cross-leaf traffic both ways, split between the
/// spines by BU (bu0 and bu2 over spine 0, bu1 and bu3 over spine 1).
#[test]
fn a_two_level_fabric_builds_exactly_over_both_spines() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.toml");
    std::fs::write(&cfg, format!("{SMALL}[topology]\nfolded = true\n")).unwrap();
    let name = format!("c{}", std::process::id() % 100_000);
    let too_many = Command::new(EVB)
        .args(["testbed", "--rus", "2", "--bus", "2", "--leaves", "3"])
        .args(["--name", &name, "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&too_many.stderr);
    assert!(!too_many.status.success());
    assert!(stderr.contains("--leaves 3"), "{stderr}");
    let (stdout, stderr, v) = exact_testbed(
        &name,
        &format!("{SMALL}[topology]\nfolded = true\n"),
        "--rus 4 --bus 4 --duration 2 --leaves 2 --routing static",
        "",
    );
    assert!(
        stderr.contains("5 hosts under 2 leaf switches, each joined to 2 spines"),
        "{stderr}"
    );
    // the testbed's own figures in the summary: every uplink's bytes both ways
    let fabric = &v["testbed"]["fabric"];
    assert_eq!(fabric["spines"], 2, "{}", v["testbed"]);
    assert_eq!(fabric["routing"], "static");
    let uplinks: Vec<(f64, f64)> = fabric["uplinks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            let mb = |k: &str| u[k].as_f64().unwrap() / 1e6;
            (mb("bytes_up"), mb("bytes_down"))
        })
        .collect();
    assert!(stdout.contains("leaf1 - spine1:"), "{stdout}");
    let all: Vec<f64> = uplinks.iter().flat_map(|&(u, d)| [u, d]).collect();
    let (lo, hi) = all
        .iter()
        .fold((f64::MAX, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    // 2 s at 100 Mb/s: each uplink carries a few MB; static routing spreads them evenly
    assert!(lo > 2.0, "an uplink carried {lo} MB: {stdout}");
    assert!(lo > hi / 2.0, "uplinks uneven ({lo} .. {hi} MB): {stdout}");
    assert_eq!(left(&name), Vec::<String>::new(), "namespaces left behind");
}

/// Two rails per host over Multipath TCP, one of them cut at a seeded moment mid-run: both
/// carried data before the cut, and the run goes on over the other and builds every event
/// exactly once.
#[test]
fn a_run_on_two_rails_survives_losing_one() {
    if !root() {
        return;
    }
    // EVB_TESTBED_SEED=N repeats a run
    let seed = std::env::var("EVB_TESTBED_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos() as u64
        });
    let (rail, at) = (seed % 2, 1.0 + (seed / 2 % 1000) as f64 / 500.0);
    eprintln!("seed {seed} (EVB_TESTBED_SEED): rail {rail} cut after {at:.2} s");
    let name = format!("m{}", std::process::id() % 100_000);
    let cut = format!("--rus 2 --bus 2 --duration 4 --rails 2 --cut-rail {rail}@{at:.2}");
    let (stdout, stderr, v) = exact_testbed(&name, SMALL, &cut, &format!("seed {seed}"));
    assert!(
        stderr.contains("2 rails per host (Multipath TCP)"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("rail {rail} cut after")),
        "{stderr}"
    );
    assert!(v["run"]["seconds"].as_f64().unwrap() >= 4.0, "{}", v["run"]);
    // each rail carried the run's data before the cut
    let rails = &v["testbed"]["rails"];
    assert_eq!(rails["cut"]["rail"], rail, "{rails}");
    let mb: Vec<f64> = rails["bytes_sent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_f64().unwrap() / 1e6)
        .collect();
    assert!(stdout.contains("rail1:"), "{stdout}");
    assert_eq!(mb.len(), 2, "{stdout}");
    assert!(mb.iter().all(|&m| m > 2.0), "seed {seed}: {mb:?}\n{stdout}");
    assert_eq!(left(&name), Vec::<String>::new(), "namespaces left behind");
}

/// `transport.multipath` on a host whose kernel has MPTCP turned off (a namespace with
/// net.mptcp.enabled = 0): every node refuses at the start, naming the key, and the run
/// fails instead of going on one path.
#[test]
fn multipath_without_kernel_mptcp_fails_at_the_start_naming_the_key() {
    if !root() {
        return;
    }
    let ns = format!("nomp{}", std::process::id() % 100_000);
    let ip = |args: &[&str]| {
        assert!(
            Command::new("ip").args(args).status().unwrap().success(),
            "ip {args:?}"
        );
    };
    ip(&["netns", "add", &ns]);
    ip(&["-n", &ns, "link", "set", "lo", "up"]);
    ip(&[
        "netns",
        "exec",
        &ns,
        "sysctl",
        "-q",
        "-w",
        "net.mptcp.enabled=0",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.toml");
    std::fs::write(&cfg, "[run]\nevents = 500\n[transport]\nmultipath = true\n").unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", &ns, EVB, "run", "--quiet", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    ip(&["netns", "del", &ns]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(!text.contains("VERDICT: OK"), "{text}");
    assert!(
        text.contains("transport.multipath: this kernel makes no MPTCP socket"),
        "{text}"
    );
}

/// `scripts/barrel-sweep.sh` (docs/scaling.md's figures) in its quick mode, as written: a
/// line per assignment and shaping, each with the bottleneck links' use, none "failed".
#[test]
fn the_barrel_sweep_script_runs_as_written_in_its_quick_mode() {
    if !root() {
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/barrel-sweep.sh");
    let out = Command::new("bash")
        .arg(script)
        .args(["1", "2", "2"])
        .env("EVB", EVB)
        .env("SECONDS_PER_RUN", "2")
        .env("NAME", format!("bs{}", std::process::id() % 10000))
        .env("QUEUES", "256kb")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("round 1 ")).collect();
    assert_eq!(rows.len(), 3, "{text}");
    for r in rows {
        assert!(!r.ends_with("failed"), "{text}");
        let pct: f64 = r
            .split("side): ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no figure in {r:?}"));
        assert!(pct > 10.0 && pct <= 101.0, "{r}");
        // under the barrel shifter the RUs' slots are counted, and no others
        assert_eq!(
            r.contains("| RU slots (barrel shifter): "),
            r.contains("shaping barrel:"),
            "{text}"
        );
    }
}

/// A script of docs/scaling.md's figures run as written, in its quick mode: its stdout.
fn run_script(name: &str, args: &[&str], env: &[(&str, String)]) -> String {
    let script = format!("{}/../../scripts/{name}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(script)
        .args(args)
        .env("EVB", EVB)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// `scripts/fabric-sweep.sh` in its quick mode: one switch and two leaves on one spine, a
/// line per assignment and shaping, each with a figure and the run's verdict OK.
#[test]
fn the_fabric_sweep_script_runs_as_written_in_its_quick_mode() {
    if !root() {
        return;
    }
    let text = run_script(
        "fabric-sweep.sh",
        &["1", "4", "2"],
        &[
            ("SECONDS_PER_RUN", "2".into()),
            ("NAME", format!("fs{}", std::process::id() % 10000)),
            ("QUEUES", "256kb".into()),
            ("FABRICS", "one-switch static:1".into()),
        ],
    );
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("round 1 ")).collect();
    assert_eq!(rows.len(), 6, "{text}");
    for r in rows {
        assert!(
            !r.contains("failed") && r.ends_with("VERDICT: OK"),
            "{text}"
        );
    }
}

/// `scripts/rails-sweep.sh` in its quick mode: one and two rails, then each rail cut
/// halfway, every run's verdict OK.
#[test]
fn the_rails_sweep_script_runs_as_written_in_its_quick_mode() {
    if !root() {
        return;
    }
    let text = run_script(
        "rails-sweep.sh",
        &["1", "2", "2"],
        &[
            ("SECONDS_PER_RUN", "3".into()),
            ("NAME", format!("rs{}", std::process::id() % 10000)),
        ],
    );
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("round 1 ") || l.starts_with("rails 2, rail "))
        .collect();
    assert_eq!(rows.len(), 4, "{text}");
    for r in rows {
        assert!(
            !r.contains("failed") && r.ends_with("VERDICT: OK"),
            "{text}"
        );
    }
}

/// `scripts/testbed-tcp.sh` (docs/lab/testbed-tcp.md) on one shape, 1 s runs: a line per
/// assignment with the links' use, each followed by the drops and the hosts' TCP counters.
#[test]
fn the_testbed_tcp_script_runs_as_written_on_one_shape() {
    if !root() {
        return;
    }
    let name = format!("t{}", std::process::id() % 100_000);
    let text = run_script(
        "testbed-tcp.sh",
        &[],
        &[
            ("SHAPES", "2x2:256kb".into()),
            ("SECONDS_PER_RUN", "1".into()),
            ("NAME", name.clone()),
        ],
    );
    for a in ["credits", "random"] {
        let head = format!("2x2:256kb {a}: BU links (the bottleneck side): ");
        assert!(text.contains(&head), "{text}");
    }
    let tcp: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("TCP in the hosts: "))
        .collect();
    assert_eq!(tcp.len(), 2, "{text}");
    // 1 s of two RUs at 100 Mb/s is thousands of segments
    for l in tcp {
        let sent: u64 = l.split_whitespace().nth(4).unwrap().parse().unwrap();
        assert!(sent > 1000, "{l}");
    }
    assert_eq!(left(&name), Vec::<String>::new(), "namespaces left behind");
}

//! `evb testbed`: a small cluster inside this machine. Every node of the run gets a host of
//! its own (a network namespace) with one link (a veth) into a switch (a Linux bridge in a
//! namespace of its own). Both ends of every link are shaped with tbf: a rate, and a small
//! queue like a switch port's output buffer (the host's end may have a deep one instead, as
//! a NIC's: `--host-queue`). The run is the ordinary `evb run` with each node
//! started in its host. Everything is removed at the end, on Ctrl-C and on a failure, and a
//! testbed of the same name left by a crash is removed at the next start.

use std::path::Path;
use std::process::Command;

mod fabric;
mod rails;
mod tcp_counters;

use clap::Args;
use evb_config::{BuSection, Config, Role, RuSection, TransportKind};

/// The heartbeat timeout the testbed gives its nodes (see `testbed`).
const TESTBED_HEARTBEAT_TIMEOUT_MS: u64 = 3000;

#[derive(Args)]
pub struct TestbedArgs {
    /// The run (default: the built-in configuration). Its nodes are placed one per host;
    /// their addresses, ports and the transport are set by the testbed.
    #[arg(long, short)]
    pub config: Option<std::path::PathBuf>,
    /// Override topology.rus.
    #[arg(long)]
    rus: Option<u32>,
    /// Override topology.bus.
    #[arg(long)]
    bus: Option<u32>,
    /// Override run.duration_s. [seconds, or with a unit: 500ms, 2m]
    #[arg(long, value_parser = crate::duration::secs)]
    duration: Option<f64>,
    /// Link rate, as tc writes it (100mbit, 1gbit, 10gbit).
    #[arg(long, default_value = "1gbit")]
    rate: String,
    /// Bytes each shaped port may queue (a switch's output buffer), as tc writes it.
    #[arg(long, default_value = "256kb")]
    queue: String,
    /// Bytes a host's own port may queue (its NIC's ring and qdisc), as tc writes it
    /// (default: --queue, a host port like a switch's). A deep one (8mb) refuses nothing, as a
    /// real host's does: TCP keeps a chunk its full host queue refused and, with nothing in
    /// flight, waits for its probe timer (docs/lab/testbed-tcp.md).
    #[arg(long)]
    host_queue: Option<String>,
    /// One node's host gets a slower link, both ways: `bu1=50mbit` (repeatable). The run
    /// page's RU→BU matrix shows such a link standing out.
    #[arg(long, value_name = "NODE=RATE")]
    slow: Vec<String>,
    /// Leaf switches (default 1: every host on one switch). With 2 or more, the hosts are
    /// spread over the leaves (RU k and BU k by their index) and every leaf is joined to
    /// every spine by a shaped uplink: a two-level fabric, as `evb sim --model clos`.
    #[arg(long, default_value_t = 1)]
    leaves: usize,
    /// Spine switches of a two-level fabric (default: as many as a leaf has RUs or BUs,
    /// whichever is more: full bisection at the host rate).
    #[arg(long)]
    spines: Option<usize>,
    /// Every uplink's rate, both ways (default: --rate).
    #[arg(long)]
    uplink: Option<String>,
    /// How a leaf picks the spine: by destination (static) or per connection (hash: ECMP).
    #[arg(long, value_enum, default_value = "static")]
    routing: fabric::Routing,
    /// Links per host, each into a switch of its own (rails, seed 001's several NICs per
    /// host): the run goes over Multipath TCP (`transport.multipath`), every connection
    /// spread over all of them. One switch (--leaves 1) only.
    #[arg(long, default_value_t = 1)]
    rails: usize,
    /// Cut rail R (0 is the first) SECONDS after the nodes are started, as a switch that
    /// dies: `--cut-rail 1@3`. The run should go on over the other rails.
    #[arg(long, value_name = "R@SECONDS")]
    cut_rail: Option<String>,
    /// Name of the testbed (its namespaces and links start with it); two testbeds with
    /// different names can run side by side.
    #[arg(long, default_value = "evbtb")]
    name: String,
    /// RU k and BU k on one host (topology.folded): each link carries data both ways, and
    /// RU k's fragment for BU k stays in the host.
    #[arg(long)]
    folded: bool,
    /// Start the nodes as a launcher does, without addresses: one `evb node` per host with
    /// its rank in the environment; they find each other through the EVM (a rendezvous
    /// file, `transport.interface` = the testbed's network).
    #[arg(long)]
    discover: bool,
    /// Write the run summary as JSON to FILE (as `evb run --json`), with the testbed's
    /// figures under "testbed" (links, uplinks, rails; not with --discover); `-` (or
    /// `--json` alone): to stdout, the tables then on stderr.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
    /// No progress line.
    #[arg(long, short)]
    quiet: bool,
}

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The namespaces of testbed `name`.
fn namespaces(name: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("{name}-")))
        .map(String::from)
        .collect()
}

/// Removes every namespace of testbed `name` (their links and the bridge go with them).
pub fn remove(name: &str) -> usize {
    let all = namespaces(name);
    for ns in &all {
        // processes left in it (a crashed testbed's nodes) first
        let _ = Command::new("ip")
            .args(["netns", "pids", ns])
            .output()
            .map(|o| {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            });
        let _ = Command::new("ip").args(["netns", "del", ns]).status();
    }
    all.len()
}

/// A tc size or rate: digits and a unit tc knows.
fn tc_value(what: &str, v: &str, units: &[&str]) -> Result<(), String> {
    let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &v[digits.len()..];
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) || !units.contains(&unit) {
        return Err(format!(
            "--{what}: {v:?} is not a number with a unit ({})",
            units.join(", ")
        ));
    }
    Ok(())
}

/// The bits per second of a tc rate.
fn rate_bps(v: &str) -> f64 {
    let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let n: f64 = digits.parse().unwrap_or(0.0);
    n * match &v[digits.len()..] {
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        _ => 1.0,
    }
}

/// Builds the testbed for `cfg` and runs it. True when the verdict is clean.
pub fn run(a: &TestbedArgs, mut cfg: Config) -> Result<bool, String> {
    let uid = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
    };
    if uid != 0 {
        return Err("evb testbed needs root: it makes network namespaces, links and qdiscs".into());
    }
    tc_value("rate", &a.rate, &["kbit", "mbit", "gbit"])?;
    tc_value("queue", &a.queue, &["b", "kb", "mb"])?;
    let host_queue = a.host_queue.as_deref().unwrap_or(&a.queue);
    tc_value("host-queue", host_queue, &["b", "kb", "mb"])?;
    let queues = fabric::Queues {
        switch: &a.queue,
        host: host_queue,
    };
    if a.name.is_empty()
        || a.name.len() > 6
        || !a
            .name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    {
        return Err(
            "--name: 1 to 6 lowercase letters or digits (interface names are short)".into(),
        );
    }
    if let Some(n) = a.rus {
        cfg.topology.rus = n;
        cfg.ru.clear();
    }
    if let Some(n) = a.bus {
        cfg.topology.bus = n;
        cfg.bu.clear();
    }
    if let Some(d) = a.duration {
        cfg.run.duration_s = d;
    }
    let nodes = cfg.nodes();
    if nodes.len() > 250 {
        return Err(format!(
            "{} nodes: the testbed has room for 250",
            nodes.len()
        ));
    }
    let stale = remove(&a.name);
    if stale > 0 {
        eprintln!(
            "evb testbed: removed a stale testbed {:?} ({stale} namespaces)",
            a.name
        );
    }
    if a.folded {
        cfg.topology.folded = true;
    }
    // Every host of the testbed is this machine's CPUs, and shaped links queue for seconds:
    // the default heartbeat timeout took a busy RU for a lost one (2 runs in about 60 of 9
    // nodes with the host at load 10). The testbed measures throughput, not how fast a loss
    // is found: it gives the nodes TESTBED_HEARTBEAT_TIMEOUT_MS unless the configuration
    // sets a timeout of its own.
    if cfg.run.heartbeat_timeout_ms == evb_config::RunSection::default().heartbeat_timeout_ms {
        cfg.run.heartbeat_timeout_ms = TESTBED_HEARTBEAT_TIMEOUT_MS;
    }
    // every node on its host: 10.250.0.(h+1), its data port 7000, its API 8000 (a BU that
    // shares its RU's host: 7001, 8001)
    let placed = hosts_of(&nodes, cfg.topology.folded);
    let n_hosts = placed.iter().map(|p| p.0).max().map_or(0, |h| h + 1);
    let fab = fabric_of(a, &cfg, &nodes, &placed, n_hosts)?;
    if !(1..=4).contains(&a.rails) {
        return Err(format!("--rails {}: 1 to 4", a.rails));
    }
    if a.rails > 1 && fab.two_level() {
        return Err("--rails: with one switch per rail only (--leaves 1)".into());
    }
    let cut = a
        .cut_rail
        .as_deref()
        .map(|v| rails::parse_cut(v, a.rails))
        .transpose()?;
    if a.rails > 1 {
        cfg.transport.multipath = true;
    }
    // every host's link rate: --rate, or a --slow one's
    let mut rates = vec![a.rate.clone(); n_hosts];
    for slow in &a.slow {
        let (id, rate) = slow
            .split_once('=')
            .ok_or_else(|| format!("--slow {slow:?}: NODE=RATE, as bu1=50mbit"))?;
        tc_value("slow rate", rate, &["kbit", "mbit", "gbit"])?;
        let k = nodes
            .iter()
            .position(|n| n.id == id)
            .ok_or_else(|| format!("--slow: no node {id:?} in the configuration"))?;
        rates[placed[k].0] = rate.to_string();
    }
    let ip = |k: usize| fab.addr(placed[k].0);
    let port = |k: usize, base: usize| base + placed[k].1;
    cfg.transport.kind = TransportKind::Tcp;
    cfg.transport.local = None;
    cfg.evm.addr = format!("{}:7000", ip(0));
    cfg.evm.control = format!("{}:8000", ip(0));
    cfg.ru = nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.role == Role::Ru)
        .map(|(k, n)| RuSection {
            id: n.id.clone(),
            addr: format!("{}:{}", ip(k), port(k, 7000)),
            control: format!("{}:{}", ip(k), port(k, 8000)),
            source_id: Some(n.source_id),
            files: n.files.clone(),
            streams: Vec::new(),
            stream_sources: Vec::new(),
            producer_sources: Vec::new(),
        })
        .collect();
    cfg.bu = nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.role == Role::Bu)
        .map(|(k, n)| BuSection {
            id: n.id.clone(),
            addr: format!("{}:{}", ip(k), port(k, 7000)),
            control: format!("{}:{}", ip(k), port(k, 8000)),
            credits: Some(n.credits),
            sink: Some(n.sink),
            sink_delay_us: n.sink_delay.map(|d| d.0),
            sink_delay_events: n.sink_delay.map(|d| d.1),
            serve: String::new(),
            spare: n.spare,
        })
        .collect();
    cfg.topology.spare_bus = 0;
    if cfg.secret().is_none() {
        // a random one: "testbed-NAME-PID" was 15 characters, one short, for a short name
        // and a 4-digit pid, and the run was refused
        cfg.run.secret = evb_transport::random_hex(32)
            .ok_or("no randomness from the system for the run's secret")?;
    }
    let scratch = tempfile::tempdir().map_err(|e| format!("a temporary folder: {e}"))?;
    if a.discover {
        // no address anywhere: each node listens on its host's address in the testbed's
        // network, on a port of its choosing
        cfg.evm.addr.clear();
        cfg.evm.control.clear();
        for r in &mut cfg.ru {
            r.addr.clear();
            r.control.clear();
        }
        for b in &mut cfg.bu {
            b.addr.clear();
            b.control.clear();
        }
        cfg.topology.host = "127.0.0.1".into();
        cfg.topology.base_port = 0;
        cfg.control.host = "127.0.0.1".into();
        cfg.control.base_port = 0;
        cfg.transport.interface = fab.network().into();
        cfg.run.rendezvous = scratch.path().join("evm").to_string_lossy().into_owned();
    }
    cfg.validate()
        .map_err(|e| format!("testbed configuration: {e}"))?;

    let built = if fab.two_level() {
        fabric::build(&a.name, &fab, &rates, queues)
    } else {
        build(&a.name, &rates, queues)
            .and_then(|()| rails::build(&a.name, n_hosts, a.rails, &a.rate, queues))
    };
    let outcome = built.and_then(|()| {
        let hosts: Vec<(String, String)> = nodes
            .iter()
            .enumerate()
            .map(|(k, n)| (n.id.clone(), format!("{}-h{}", a.name, placed[k].0)))
            .collect();
        let _ = crate::launch::PLACEMENT.set(Box::new(move |id: &str| {
            hosts
                .iter()
                .find(|(n, _)| n == id)
                .map(|(_, ns)| vec!["ip".into(), "netns".into(), "exec".into(), ns.clone()])
                .unwrap_or_default()
        }));
        eprintln!(
            "evb testbed: {}{}{}, every host port shaped to {} with {} of queue{}",
            fab.describe(n_hosts),
            if a.rails > 1 {
                format!(", {} rails per host (Multipath TCP)", a.rails)
            } else {
                String::new()
            },
            if cfg.topology.folded {
                " (folded: RU k and BU k share host k)"
            } else {
                ""
            },
            a.rate,
            a.queue,
            if host_queue == a.queue {
                String::new()
            } else {
                format!(" at the switch, {host_queue} at the hosts")
            }
        );
        // the run's summary goes to a file the testbed reads back: --json's, or a temporary
        // one (for `--json -` too, copied to stdout after)
        let to_stdout = a.json.as_deref().is_some_and(crate::json_out::is_stdout);
        let json = match &a.json {
            Some(p) if !to_stdout => p.clone(),
            _ => std::env::temp_dir().join(format!("evb-testbed-{}.json", std::process::id())),
        };
        if let Some((r, secs)) = cut {
            let name = a.name.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_secs_f64(secs));
                match rails::cut(&name, r) {
                    Ok(()) => eprintln!("evb testbed: rail {r} cut after {secs} s"),
                    Err(e) => eprintln!("evb testbed: cutting rail {r}: {e}"),
                }
            });
        }
        if a.discover {
            let hosts: Vec<String> = placed
                .iter()
                .map(|p| format!("{}-h{}", a.name, p.0))
                .collect();
            let ok = run_discovered(&cfg, &hosts, scratch.path(), a.json.as_deref());
            let uplinks = fab.two_level().then(|| fabric::uplink_bytes(&a.name, &fab));
            report_uplinks(uplinks.as_deref());
            return ok;
        }
        let ok = crate::launch::run(&cfg, a.quiet, Some(&json))?;
        let uplinks = fab.two_level().then(|| fabric::uplink_bytes(&a.name, &fab));
        let rail_bytes = (a.rails > 1).then(|| rails::bytes(&a.name, n_hosts, a.rails));
        let mut doc: serde_json::Value = std::fs::read_to_string(&json)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        if a.json.is_none() || to_stdout {
            let _ = std::fs::remove_file(&json);
        }
        let drops = (!fab.two_level() && a.rails == 1).then(|| port_drops(&a.name, n_hosts));
        let tcp = tcp_counters::report(&a.name, n_hosts);
        let mut figures = report(&doc, rate_bps(&a.rate), &a.rate, cfg.topology.folded);
        if let Some(d) = drops {
            figures["drops"] = d;
        }
        figures["tcp"] = tcp;
        figures["rate"] = a.rate.clone().into();
        figures["queue"] = a.queue.clone().into();
        figures["host_queue"] = host_queue.into();
        figures["hosts"] = n_hosts.into();
        report_uplinks(uplinks.as_deref());
        if let Some(list) = &uplinks {
            figures["fabric"] = serde_json::json!({
                "leaves": fab.leaves,
                "spines": fab.spines,
                "uplink_rate": fab.uplink,
                "routing": fab.routing.name(),
                "uplinks": list.iter().map(|&(l, s, up, down)| serde_json::json!({
                    "leaf": l, "spine": s, "bytes_up": up, "bytes_down": down,
                })).collect::<Vec<_>>(),
            });
        }
        if let Some(bytes) = &rail_bytes {
            println!("rails (bytes the hosts sent on each):");
            for (r, b) in bytes.iter().enumerate() {
                println!("  rail{r}: {:>10.1} MB", *b as f64 / 1e6);
            }
            figures["rails"] = serde_json::json!({
                "count": a.rails,
                "bytes_sent": bytes,
                "cut": cut.map(|(r, t)| serde_json::json!({"rail": r, "after_s": t})),
            });
        }
        // the run's summary, with the testbed's own figures beside it
        if doc.is_object() {
            doc["testbed"] = figures;
            if to_stdout {
                crate::json_out::write(std::path::Path::new("-"), &doc)?;
            } else if a.json.is_some() {
                crate::json_out::write(&json, &doc)?;
            }
        }
        Ok(ok)
    });
    let removed = remove(&a.name);
    let left = namespaces(&a.name);
    if !left.is_empty() {
        eprintln!("evb testbed: could not remove {left:?}");
    } else if removed > 0 && !a.quiet {
        eprintln!("evb testbed: removed (namespaces, links, bridge and qdiscs)");
    }
    outcome
}

/// The run as a launcher starts it: node k is rank k, started in its host without an
/// address. Prints the run's table and verdict, and where each node was found.
fn run_discovered(
    cfg: &Config,
    hosts: &[String],
    scratch: &Path,
    json_out: Option<&Path>,
) -> Result<bool, String> {
    let file = scratch.join("run.toml");
    std::fs::write(&file, cfg.to_toml()).map_err(|e| format!("{}: {e}", file.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let nodes = cfg.nodes();
    let mut kids = Vec::new();
    for (k, (n, host)) in nodes.iter().zip(hosts).enumerate() {
        let log = std::fs::File::create(scratch.join(format!("{}.log", n.id)))
            .map_err(|e| format!("a log file: {e}"))?;
        let child = Command::new("ip")
            .args(["netns", "exec", host])
            .arg(&exe)
            .args(["node", "--json", "-", "--config"])
            .arg(&file)
            .env("OMPI_COMM_WORLD_RANK", k.to_string())
            .env("OMPI_COMM_WORLD_SIZE", nodes.len().to_string())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {} in {host}: {e}", n.id))?;
        kids.push(child);
    }
    let budget = cfg.run.connect_timeout_s
        + 2.0 * cfg.run.stall_timeout_s
        + if cfg.run.duration_s > 0.0 {
            cfg.run.duration_s
        } else {
            600.0
        }
        + 30.0;
    let until = std::time::Instant::now() + std::time::Duration::from_secs_f64(budget);
    while kids.iter_mut().any(|c| matches!(c.try_wait(), Ok(None))) {
        if std::time::Instant::now() > until {
            for c in &mut kids {
                let _ = c.kill();
            }
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let mut reports = std::collections::BTreeMap::new();
    let mut problems = Vec::new();
    for (n, c) in nodes.iter().zip(kids) {
        let out = c.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            let log =
                std::fs::read_to_string(scratch.join(format!("{}.log", n.id))).unwrap_or_default();
            let last = log.lines().last().unwrap_or("").trim().to_string();
            problems.push(format!(
                "{} {}: {last}",
                n.id,
                crate::launch::ended_words(out.status)
            ));
        }
        match serde_json::from_slice::<evb_builder::NodeStatus>(&out.stdout) {
            Ok(r) => {
                reports.insert(n.id.clone(), r);
            }
            Err(e) if out.status.success() => {
                problems.push(format!("{}'s report could not be read: {e}", n.id))
            }
            Err(_) => {}
        }
    }
    let evm = reports.get(&nodes[0].id);
    if evm.and_then(|e| e.ok) != Some(true) {
        let why = evm.and_then(|e| e.reason.as_deref()).unwrap_or("no report");
        problems.push(format!("the EVM: {why}"));
    }
    let registered = evm.and_then(|e| e.registered.as_ref());
    if let Some(reg) = registered {
        eprintln!("evb testbed: the nodes registered with the EVM:");
        for r in reg {
            let rank = r.rank.map_or("-".to_string(), |k| k.to_string());
            eprintln!("  {:<7} rank {rank:<3} {}", r.peer, r.data);
        }
    }
    let ids: Vec<String> = nodes.iter().map(|n| n.id.clone()).collect();
    let run = evm.and_then(|e| e.run.as_ref());
    crate::summary::print(cfg, &ids, &reports, run, &problems, None);
    if let Some(path) = json_out {
        let doc = serde_json::json!({
            "ok": problems.is_empty(),
            "problems": problems,
            "run": run,
            "registered": registered,
        });
        crate::json_out::write(path, &doc)?;
    }
    Ok(problems.is_empty())
}

/// The fabric `a` asks for, its hosts placed on leaves: RU k on leaf k·L/N, BU k on leaf
/// k·L/M (so every leaf has RUs and BUs, and folded RU k and BU k share one), the EVM on
/// leaf 0. A host's routing key is the index of the BU it holds, else its number: static
/// routing sends consecutive BUs over different spines, as the barrel shifter's slots need.
fn fabric_of(
    a: &TestbedArgs,
    cfg: &Config,
    nodes: &[evb_config::NodeSpec],
    placed: &[(usize, usize)],
    hosts: usize,
) -> Result<fabric::Fabric, String> {
    let (n, m) = (cfg.topology.rus as usize, cfg.topology.bus as usize);
    if a.leaves <= 1 {
        if a.spines.is_some() || a.uplink.is_some() || a.routing != fabric::Routing::Static {
            return Err("--spines, --uplink and --routing need --leaves 2 or more".into());
        }
        return Ok(fabric::Fabric::single(hosts));
    }
    if a.leaves > n.min(m).min(16) {
        return Err(format!(
            "--leaves {}: at most 16, and no more than the RUs ({n}) or the BUs ({m}): every \
             leaf gets some of each",
            a.leaves
        ));
    }
    let spines = a.spines.unwrap_or_else(|| n.max(m).div_ceil(a.leaves));
    if !(1..=16).contains(&spines) {
        return Err(format!("--spines {spines}: 1 to 16"));
    }
    let uplink = a.uplink.clone().unwrap_or_else(|| a.rate.clone());
    tc_value("uplink", &uplink, &["kbit", "mbit", "gbit"])?;
    let mut leaf = vec![usize::MAX; hosts];
    let mut key: Vec<usize> = (0..hosts).collect();
    for (spec, &(h, _)) in nodes.iter().zip(placed) {
        let i = spec.index as usize;
        let l = match spec.role {
            Role::Ru => i * a.leaves / n,
            Role::Bu => i * a.leaves / m,
            Role::Evm => 0,
        };
        if spec.role == Role::Bu {
            key[h] = i;
        }
        // a folded host is on its RU's leaf
        if leaf[h] == usize::MAX {
            leaf[h] = l;
        }
    }
    Ok(fabric::Fabric {
        leaves: a.leaves,
        spines,
        uplink,
        routing: a.routing,
        leaf,
        key,
    })
}

/// What each uplink of a two-level fabric carried, printed under the run's figures.
fn report_uplinks(bytes: Option<&[(usize, usize, u64, u64)]>) {
    let Some(bytes) = bytes else {
        return;
    };
    println!("uplinks (bytes on the wire, leaf to spine / spine to leaf):");
    for &(l, s, up, down) in bytes {
        println!(
            "  leaf{l} - spine{s}: {:>10.1} MB up  {:>10.1} MB down",
            up as f64 / 1e6,
            down as f64 / 1e6
        );
    }
}

/// Packets the shaped ports sent and dropped in the run, the hosts' own (their NICs) and
/// the switch's (towards each host), printed in a line and returned as JSON: where a run
/// lost its throughput to TCP's recovery, the drops say so. tc counts what it sent in
/// segments but a drop once per packet it was handed, and the hosts hand it segmentation
/// offload chunks of up to 64 KiB: the two counts are in different units, and their ratio
/// is not the share lost (the hosts' TCP counters, printed next, count segments).
fn port_drops(name: &str, hosts: usize) -> serde_json::Value {
    let (mut host, mut switch) = ((0, 0), (0, 0));
    for k in 0..hosts {
        let (s, d) = fabric::qdisc_packets(&format!("{name}-h{k}"), "eth0");
        host = (host.0 + s, host.1 + d);
        let (s, d) = fabric::qdisc_packets(&format!("{name}-sw"), &format!("{name}s{k}"));
        switch = (switch.0 + s, switch.1 + d);
    }
    println!(
        "drops at the shaped ports (each a chunk of up to 64 KiB): the hosts' {}, the switch's {}; \
         segments sent: the hosts' {}, the switch's {}",
        host.1, switch.1, host.0, switch.0
    );
    serde_json::json!({
        "hosts": {"sent": host.0, "dropped": host.1},
        "switch": {"sent": switch.0, "dropped": switch.1},
    })
}

/// Each node's host and port offset: one host per node, or (folded) RU k and BU k on one
/// host, the BU at offset 1.
fn hosts_of(nodes: &[evb_config::NodeSpec], folded: bool) -> Vec<(usize, usize)> {
    let mut next = 0;
    let mut ru_host = Vec::new();
    nodes
        .iter()
        .map(|n| {
            if folded && n.role == Role::Bu {
                if let Some(&h) = ru_host.get(n.index as usize) {
                    return (h, 1);
                }
            }
            let h = next;
            next += 1;
            if n.role == Role::Ru {
                ru_host.push(h);
            }
            (h, 0)
        })
        .collect()
}

/// The switch and one host per entry of `rates`, host k's link shaped to `rates[k]`.
fn build(name: &str, rates: &[String], q: fabric::Queues) -> Result<(), String> {
    let sw = format!("{name}-sw");
    sh(&["ip", "netns", "add", &sw])?;
    sh(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"])?;
    sh(&["ip", "-n", &sw, "link", "set", "br0", "up"])?;
    for (k, rate) in rates.iter().enumerate() {
        let host = format!("{name}-h{k}");
        sh(&["ip", "netns", "add", &host])?;
        sh(&["ip", "-n", &host, "link", "set", "lo", "up"])?;
        let (hd, port) = (format!("{name}h{k}"), format!("{name}s{k}"));
        let addr = format!("10.250.0.{}/24", k + 1);
        fabric::host_link(&host, &hd, "eth0", &addr, &sw, &port, rate, q)?;
    }
    Ok(())
}

/// How well the RUs kept the barrel shifter's slots (their reports' `barrel_*` counters),
/// in a line and as JSON; `None` when no RU sent in a slot.
fn slot_timing(rus: &serde_json::Value) -> Option<(String, serde_json::Value)> {
    let count = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap_or(0);
    let (mut slots, mut waited, mut late, mut mid, mut slip_us, mut max_us) = (0, 0, 0, 0, 0, 0);
    for r in rus.as_array().into_iter().flatten() {
        slots += count(r, "barrel_slots");
        let w = count(r, "barrel_slots_waited");
        waited += w;
        late += count(r, "barrel_slots_late");
        mid += count(r, "barrel_slots_started_mid_slot");
        slip_us += w * count(r, "barrel_slip_mean_us");
        max_us = max_us.max(count(r, "barrel_slip_max_us"));
    }
    if slots == 0 {
        return None;
    }
    let pc = |k: u64| 100.0 * k as f64 / slots as f64;
    let mean_us = slip_us / waited.max(1);
    Some((
        format!(
            "RU slots (barrel shifter): {slots} sent in; {:.1} % started over a tenth of a slot \
             late though their bytes waited (slip {mean_us} µs on average, {max_us} µs at \
             most), {:.1} % started as late because their bytes came then",
            pc(late),
            pc(mid)
        ),
        serde_json::json!({
            "slots": slots,
            "waited": waited,
            "late": late,
            "started_mid_slot": mid,
            "slip_mean_us": mean_us,
            "slip_max_us": max_us,
        }),
    ))
}

/// Per-link figures from the run's summary, printed, and returned for the JSON document:
/// each link's payload rate and fraction of the shaped rate, and the bottleneck side's mean.
/// Folded, what RU k sends its own BU k stays in the host: a paired RU's link carries
/// (M-1)/M of what it sends, a paired BU's (N-1)/N of what it builds (events spread evenly
/// over the BUs).
fn report(v: &serde_json::Value, bps: f64, rate: &str, folded: bool) -> serde_json::Value {
    let mut figures = serde_json::json!({});
    let run = &v["run"];
    let secs = run["seconds"].as_f64().unwrap_or(0.0);
    if secs <= 0.0 || bps <= 0.0 {
        return figures;
    }
    println!(
        "\nlinks (payload bytes{} against the shaped {rate}):",
        if folded {
            " on the link, the part for the host's own BU left out"
        } else {
            ""
        }
    );
    let count = |l: &serde_json::Value| l.as_array().map_or(0, Vec::len);
    let (n_ru, n_bu) = (count(&run["rus"]), count(&run["bus"]));
    let pairs = if folded { n_ru.min(n_bu) } else { 0 };
    // the bottleneck side: the BUs' links, unless there are fewer RUs than BUs (then each
    // RU's link is full while the BUs share the RUs' rate)
    let side = if n_ru < n_bu { "ru" } else { "bu" };
    let mut fractions = Vec::new();
    let mut links = Vec::new();
    for (role, list, field, peers) in [
        ("ru", &run["rus"], "payload_bytes_sent", n_bu),
        ("bu", &run["bus"], "payload_bytes_built", n_ru),
    ] {
        for (i, n) in list.as_array().into_iter().flatten().enumerate() {
            let mut bytes = n[field].as_f64().unwrap_or(0.0);
            if i < pairs && peers > 0 {
                bytes *= (peers - 1) as f64 / peers as f64;
            }
            let f = bytes * 8.0 / secs / bps;
            if role == side {
                fractions.push(f);
            }
            println!(
                "  {role}{i}: {:>8.1} Mb/s  {:>5.1} % of the link",
                bytes * 8.0 / secs / 1e6,
                f * 100.0
            );
            links.push(serde_json::json!({
                "node": format!("{role}{i}"),
                "mbps": bytes * 8.0 / secs / 1e6,
                "fraction": f,
            }));
        }
    }
    figures["links"] = links.into();
    if !fractions.is_empty() {
        let mean = fractions.iter().sum::<f64>() / fractions.len() as f64;
        println!(
            "{} links (the bottleneck side): {:.1} % of the shaped rate on average",
            side.to_uppercase(),
            mean * 100.0
        );
        figures["bottleneck"] = serde_json::json!({"side": side, "mean_fraction": mean});
    }
    if let Some(slots) = slot_timing(&run["rus"]) {
        println!("{}", slots.0);
        figures["slots"] = slots.1;
    }
    let mut lat = evb_builder::LatencyHistogram::default();
    for b in run["bus"].as_array().into_iter().flatten() {
        if let Ok(h) = serde_json::from_value::<evb_builder::LatencyHistogram>(b["latency"].clone())
        {
            lat.merge(&h);
        }
    }
    if let (Some(p50), Some(p99)) = (lat.quantile_us(0.5), lat.quantile_us(0.99)) {
        let ms = |us: u64| format!("{:.2} ms", us as f64 / 1e3);
        println!(
            "event building latency (assigned to built, within 1 %): p50 {}, p99 {}",
            ms(p50),
            ms(p99)
        );
        figures["latency_us"] = serde_json::json!({"p50": p50, "p99": p99});
    }
    figures
}

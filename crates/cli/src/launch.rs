//! `evb run`: start every node, watch them, judge the run.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use evb_builder::{NodeRef, NodeStatus, RoleStats, RunReport, RunState};
use evb_config::{BuSection, Config, Role, RuSection, TransportKind};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::summary;

/// What the watcher hears from the nodes.
pub(crate) enum Note {
    Line(String, Box<NodeStatus>),
    /// A node's process or thread is gone (with its exit code, if it had one).
    Gone(String, Option<i32>),
}

/// Used by supervised nodes: when the launcher goes away, so do they (no orphans). A line
/// `stop` asks the node's EVM to end the run cleanly. Ctrl-C at the terminal reaches every
/// process of the group: supervised nodes leave it to the launcher, which decides.
pub fn exit_when_stdin_closes(control: evb_node::RunControl) {
    let ignored = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let _ = signal_hook::flag::register(signal_hook::consts::SIGINT, ignored);
    std::thread::spawn(move || {
        let mut line = String::new();
        let mut stdin = BufReader::new(std::io::stdin());
        loop {
            line.clear();
            match stdin.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    eprintln!("evb node: launcher gone (stdin closed), exiting");
                    std::process::exit(3);
                }
                Ok(_) if line.trim() == "stop" => control.stop(),
                Ok(_) => {}
            }
        }
    });
}

/// A standalone `evb node`: Ctrl-C (or SIGTERM) at the EVM ends the run cleanly, a second
/// one exits at once; any other node exits at once (the EVM handles it as a lost node).
pub fn stop_on_interrupt(cfg: &Config, id: &str, control: evb_node::RunControl) {
    let is_evm = cfg
        .nodes()
        .iter()
        .any(|n| n.id == id && n.role == Role::Evm);
    on_interrupt(move |n| {
        if n >= 2 || !is_evm {
            eprintln!("evb node: interrupted, exiting");
            std::process::exit(130);
        }
        control.stop();
    });
}

/// A serving node (`evb node --serve`): Ctrl-C or SIGTERM exits at once (`evb ctl halt`
/// is the orderly way down); its EVM, if it runs one, handles it as a lost node.
pub fn exit_on_interrupt() {
    on_interrupt(|_| {
        eprintln!("evb node: interrupted, exiting");
        std::process::exit(130);
    });
}

/// Calls `act` with the running count of SIGINT and SIGTERM received, on a thread of its own.
pub(crate) fn on_interrupt(mut act: impl FnMut(usize) + Send + 'static) {
    match signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ]) {
        Ok(mut signals) => {
            std::thread::spawn(move || {
                for (n, _) in signals.forever().enumerate() {
                    act(n + 1);
                }
            });
        }
        Err(e) => eprintln!("evb: cannot watch for Ctrl-C ({e}): it will end the run at once"),
    }
}

/// Counts SIGINT and SIGTERM: the first asks for a clean stop, the second aborts.
fn count_interrupts() -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = n.clone();
    on_interrupt(move |k| seen.store(k, std::sync::atomic::Ordering::SeqCst));
    n
}

/// Gives every node whose port is 0 a free port on its host, and lists nodes explicitly.
pub(crate) fn resolve_ports(cfg: &Config) -> Result<(Config, Listeners), String> {
    let nodes = cfg.nodes();
    // Ports the configuration names itself (nodes with fixed ports, front-end streams) are
    // free now but taken later by their owners: never hand one of them out.
    let serving: Vec<String> = nodes
        .iter()
        .filter(|n| n.sink == evb_config::SinkKind::Serve)
        .map(|n| cfg.serve_addr(n.index))
        .collect();
    let reserved: std::collections::HashSet<u16> = nodes
        .iter()
        .flat_map(|n| [n.addr.as_str(), n.control.as_str()])
        .chain(
            nodes
                .iter()
                .flat_map(|n| n.streams.iter().map(String::as_str)),
        )
        .chain(serving.iter().map(String::as_str))
        .filter_map(|a| a.parse::<std::net::SocketAddr>().ok())
        .map(|a| a.port())
        .filter(|p| *p != 0)
        .collect();
    let mut held = Vec::new();
    let mut chosen = Listeners::new();
    let mut free = |n: &evb_config::NodeSpec, addr: &str| -> Result<String, String> {
        let sa: std::net::SocketAddr = addr
            .parse()
            .map_err(|_| format!("bad address {addr:?} for {}", n.id))?;
        if sa.port() != 0 {
            return Ok(addr.to_string());
        }
        for _ in 0..1000 {
            let l = std::net::TcpListener::bind(sa)
                .map_err(|e| format!("cannot find a free port on {}: {e}", sa.ip()))?;
            let got = l.local_addr().map_err(|e| e.to_string())?;
            if !reserved.contains(&got.port()) {
                // kept open, for the node to inherit: the port is never free in between
                chosen.insert(got.to_string(), l);
                return Ok(got.to_string());
            }
            // held until the end: a reserved one is not offered again
            held.push(l);
        }
        Err(format!("cannot find a free port on {}", sa.ip()))
    };
    let mut addrs = Vec::new();
    let mut controls = Vec::new();
    for n in &nodes {
        addrs.push(free(n, &n.addr)?);
        controls.push(free(n, &n.control)?);
    }
    drop(held);
    let mut out = cfg.clone();
    out.evm.addr = addrs[0].clone();
    out.evm.control = controls[0].clone();
    let placed = || nodes.iter().zip(addrs.iter().zip(&controls));
    out.ru = placed()
        .filter(|(n, _)| n.role == Role::Ru)
        .map(|(n, (a, c))| RuSection {
            id: n.id.clone(),
            addr: a.clone(),
            control: c.clone(),
            source_id: Some(n.source_id),
            files: n.files.clone(),
            streams: n.streams.clone(),
            // a node's input sources: its streams', or else its producers'
            stream_sources: if n.streams.is_empty() {
                Vec::new()
            } else {
                n.stream_sources.clone()
            },
            producer_sources: if n.streams.is_empty() {
                n.stream_sources.clone()
            } else {
                Vec::new()
            },
        })
        .collect();
    out.bu = placed()
        .filter(|(n, _)| n.role == Role::Bu)
        .map(|(n, (a, c))| BuSection {
            id: n.id.clone(),
            addr: a.clone(),
            control: c.clone(),
            credits: Some(n.credits),
            sink: Some(n.sink),
            sink_delay_us: n.sink_delay.map(|d| d.0),
            sink_delay_events: n.sink_delay.map(|d| d.1),
            // kept as configured (port 0: the BU takes a free one and logs it)
            serve: if n.sink == evb_config::SinkKind::Serve {
                cfg.serve_addr(n.index)
            } else {
                String::new()
            },
        })
        .collect();
    // Every node on this host: with many more nodes than CPUs, a node's event loop can wait
    // its turn for a second or more, and would be declared lost while alive. Give the
    // heartbeat timeout room for that (a real deployment sets it for its own hosts).
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let floor = 200 * nodes.len() as u64 / cpus;
    if floor > out.run.heartbeat_timeout_ms {
        eprintln!(
            "evb: {} nodes on {cpus} CPUs: run.heartbeat_timeout_ms raised from {} to {floor} so that a busy node is not taken for a dead one",
            nodes.len(),
            out.run.heartbeat_timeout_ms
        );
        out.run.heartbeat_timeout_ms = floor;
    }
    out.validate()
        .map_err(|e| format!("resolved configuration: {e}"))?;
    Ok((out, chosen))
}

/// The sockets [`resolve_ports`] bound for the addresses it chose, by address.
pub(crate) type Listeners = BTreeMap<String, std::net::TcpListener>;

/// The sockets node `n` inherits from `listeners`: its control API's, and its data
/// address's where the TCP transport listens there (shared memory and libfabric listen
/// their own way; a socket left unused would only hold their port).
fn inherited_by(
    cfg: &Config,
    n: &evb_config::NodeSpec,
    listeners: &Listeners,
) -> Vec<(String, i32)> {
    use std::os::fd::AsRawFd;
    let data = (cfg.transport.kind == TransportKind::Tcp).then_some(n.addr.as_str());
    data.into_iter()
        .chain([n.control.as_str()])
        .filter_map(|a| listeners.get(a).map(|l| (a.to_string(), l.as_raw_fd())))
        .collect()
}

/// The resolved configuration the node processes read: an unlinked, sealed memfd whose
/// descriptor each child inherits, so that the run's secret never lies in a file that could
/// outlive the run (a SIGKILLed launcher used to leave `/tmp/evb-run-*.toml` behind). It
/// lives while the launcher or a node holds it; `evb up` hands it to restarted nodes too.
pub(crate) struct ConfigFd {
    fd: std::os::fd::OwnedFd,
    /// `evb-run-<launcher pid>-<run id>`, on every node's command line.
    tag: String,
}

impl ConfigFd {
    fn new(text: &str, run_id: &str) -> Result<ConfigFd, String> {
        use std::os::fd::{AsRawFd, FromRawFd};
        let name = c"evb-run-config";
        // SAFETY: memfd_create with a valid NUL-terminated name; the descriptor returned is
        // new and owned by nobody else, so OwnedFd may take it.
        let fd = unsafe {
            let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
            if fd < 0 {
                return Err(format!(
                    "cannot make the nodes' configuration (memfd): {}",
                    std::io::Error::last_os_error()
                ));
            }
            std::os::fd::OwnedFd::from_raw_fd(fd)
        };
        let mut f = std::fs::File::from(fd);
        f.write_all(text.as_bytes())
            .map_err(|e| format!("cannot write the nodes' configuration: {e}"))?;
        let seals =
            libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor this function owns.
        if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, seals) } == -1 {
            return Err(format!(
                "cannot seal the nodes' configuration: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(ConfigFd {
            fd: f.into(),
            tag: format!("evb-run-{}-{run_id}", std::process::id()),
        })
    }

    fn raw(&self) -> i32 {
        std::os::fd::AsRawFd::as_raw_fd(&self.fd)
    }

    /// The path a child opens it by: its inherited descriptor, the same number as here.
    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.raw()))
    }
}

/// The node processes by id, the resolved configuration they read, and its contents.
pub(crate) type Spawned = (Vec<(String, Child)>, ConfigFd, Config);

pub(crate) fn spawn_processes(
    cfg: &Config,
    tx: &mpsc::Sender<Note>,
    serve: bool,
) -> Result<Spawned, String> {
    let (cfg, listeners) = resolve_ports(cfg)?;
    let config = ConfigFd::new(&cfg.to_toml(), &cfg.run.id)?;
    let mut children = Vec::new();
    for n in cfg.nodes() {
        let inherit = inherited_by(&cfg, &n, &listeners);
        let child = spawn_node(&config, &n.id, serve, tx, &inherit)?;
        children.push((n.id.clone(), child));
    }
    // the nodes hold their sockets now (a node started again later binds its own)
    drop(listeners);
    Ok((children, config, cfg))
}

/// Where each node process runs: a command prefix per node id (empty: this host, as is).
pub(crate) type Placement = Box<dyn Fn(&str) -> Vec<String> + Send + Sync>;
pub(crate) static PLACEMENT: std::sync::OnceLock<Placement> = std::sync::OnceLock::new();

/// Starts one supervised node process; its status lines go to `tx`. It inherits the
/// listening sockets `inherit` names (address, descriptor of this process), unless a
/// placement starts it elsewhere (another network namespace), where a socket bound here is
/// no use: it binds its own there.
pub(crate) fn spawn_node(
    config: &ConfigFd,
    id: &str,
    serve: bool,
    tx: &mpsc::Sender<Note>,
    inherit: &[(String, i32)],
) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    {
        let n = id;
        // a node placed somewhere else (`evb testbed`: its host's network namespace) is
        // started through the placement's command
        let (mut cmd, inherit) = match PLACEMENT.get().map(|p| p(n)).filter(|p| !p.is_empty()) {
            Some(prefix) => {
                let mut c = Command::new(&prefix[0]);
                c.args(&prefix[1..]).arg(&exe);
                (c, &[][..])
            }
            None => (Command::new(&exe), inherit),
        };
        let fds: Vec<i32> = inherit
            .iter()
            .map(|(_, fd)| *fd)
            .chain([config.raw()])
            .collect();
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: runs in the forked child before exec and calls only fcntl, which is
            // async-signal-safe; it allocates nothing (`fds` was built before the fork).
            unsafe {
                cmd.pre_exec(move || {
                    for &fd in &fds {
                        // the descriptors are close-on-exec here: only this child keeps them
                        if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd
            .args(["node", "--supervised", "--id", n, "--config"])
            .arg(config.path())
            .arg(format!("--launched-by={}", config.tag))
            .args(serve.then_some("--serve"))
            .args(
                inherit
                    .iter()
                    .map(|(a, fd)| format!("--listen-fd={a}={fd}")),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start {n}: {e}"))?;
        let stdout = child.stdout.take().expect("piped");
        let tx = tx.clone();
        let id = n.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !line.starts_with('{') {
                    continue;
                }
                match NodeStatus::from_json(&line) {
                    Ok(v) => {
                        let _ = tx.send(Note::Line(id.clone(), Box::new(v)));
                    }
                    Err(e) => {
                        eprintln!("evb: {id} wrote a status line that could not be read: {e}")
                    }
                }
            }
        });
        Ok(child)
    }
}

fn spawn_threads(cfg: &Config, tx: &mpsc::Sender<Note>) -> evb_node::RunControl {
    let evm_control = evb_node::RunControl::new();
    for n in cfg.nodes() {
        let cfg = cfg.clone();
        let tx = tx.clone();
        // the EVM's commands stay with the launcher; the others' are their own
        let control = if n.role == Role::Evm {
            evm_control.clone()
        } else {
            evb_node::RunControl::new()
        };
        std::thread::spawn(move || {
            let lines = tx.clone();
            let id = n.id.clone();
            let status: evb_node::StatusOut = Box::new(move |v| {
                let _ = lines.send(Note::Line(id.clone(), Box::new(v)));
            });
            let every = Duration::from_millis(250);
            let code = match evb_node::run_node_controlled(&cfg, &n.id, status, every, control) {
                Ok(o) if o.ok => 0,
                Ok(_) => 1,
                Err(e) => {
                    eprintln!("evb node {}: {e}", n.id);
                    1
                }
            };
            let _ = tx.send(Note::Gone(n.id.clone(), Some(code)));
        });
    }
    evm_control
}

/// Live figures from the latest status lines.
fn progress_line(latest: &BTreeMap<String, Box<NodeStatus>>, rate: &mut RateMeter) -> String {
    let mut built = 0u64;
    let mut bytes = 0u64;
    let mut in_flight = 0u64;
    let mut credits = 0u64;
    let mut triggered = 0u64;
    // RUs fed by front-ends name the streams they wait for
    let mut waiting = Vec::new();
    for v in latest.values() {
        match &v.stats {
            RoleStats::Ru(s) => {
                for w in &s.waiting_for {
                    waiting.push(format!("{} {w}", v.node));
                }
            }
            RoleStats::Bu(s) => {
                built += s.events_built;
                bytes += s.payload_bytes_built;
            }
            RoleStats::Evm(s) => {
                in_flight = s.in_flight;
                credits = s.credits_available;
                triggered = s.triggered;
            }
        }
    }
    let (ev_rate, byte_rate) = rate.update(built, bytes);
    // nodes report at slightly different moments: never show more built than triggered
    let triggered = triggered.max(built);
    let mut line = format!(
        "built {built} of {triggered} events | {ev_rate:.0} ev/s | {:.2} GB/s | in flight {in_flight} | credits free {credits}",
        byte_rate / 1e9
    );
    if !waiting.is_empty() {
        line += &format!(" | waiting for {}", waiting.join("; "));
    }
    line
}

/// Rates over the last second or so.
struct RateMeter {
    last: Option<(Instant, u64, u64)>,
    ev: f64,
    by: f64,
}

impl RateMeter {
    fn update(&mut self, events: u64, bytes: u64) -> (f64, f64) {
        let now = Instant::now();
        match self.last {
            Some((t, e, b)) if now.duration_since(t) >= Duration::from_millis(500) => {
                let dt = now.duration_since(t).as_secs_f64();
                self.ev = events.saturating_sub(e) as f64 / dt;
                self.by = bytes.saturating_sub(b) as f64 / dt;
                self.last = Some((now, events, bytes));
            }
            None => self.last = Some((now, events, bytes)),
            _ => {}
        }
        (self.ev, self.by)
    }
}

/// `run.placement = "auto"`: the RUs and BUs that `[affinity]` leaves free are pinned, one
/// CPU each when there are enough; otherwise the CPUs are cut into groups, each holding as
/// many RUs as BUs (RU i and BU i together, round the groups), so every CPU carries both
/// halves of the work. The EVM, which does little, goes wherever the system puts it.
///
/// Why pairs rather than RUs on some CPUs and BUs on others (the earlier rule): an
/// RU and a BU cost different CPU time per event (the BU more for small events, the RU more
/// with unique content), so splitting by role left one side idle while the other was
/// saturated; a pair per CPU balances by construction, and half the traffic stays within a
/// CPU's cache. Measured in docs/performance.md ("Placement"): pairs build 1.17x the
/// role split at 256 B, up to 1.5x at 128 KiB, never less.
pub(crate) fn auto_place(cfg: &mut Config, quiet: bool) {
    if cfg.run.placement != evb_config::Placement::Auto {
        return;
    }
    let Ok(cpus) = evb_node::affinity::current_cpus() else {
        return;
    };
    let free: Vec<evb_config::NodeSpec> = cfg
        .nodes()
        .into_iter()
        .filter(|n| n.role != Role::Evm && !cfg.affinity.contains_key(&n.id))
        .collect();
    let (rus, bus): (Vec<_>, Vec<_>) = free.iter().partition(|n| n.role == Role::Ru);
    let ids = |ns: &[&evb_config::NodeSpec]| ns.iter().map(|n| n.id.clone()).collect::<Vec<_>>();
    let placed = cpu_groups(&cpus, &ids(&rus), &ids(&bus));
    if placed.is_empty() {
        return;
    }
    let mut said: Vec<(Vec<usize>, Vec<String>)> = Vec::new();
    for (id, set) in placed {
        match said.iter_mut().find(|(s, _)| *s == set) {
            Some((_, ids)) => ids.push(id.clone()),
            None => said.push((set.clone(), vec![id.clone()])),
        }
        cfg.affinity.insert(id, set);
    }
    if !quiet {
        let groups: Vec<String> = said
            .iter()
            .map(|(set, ids)| format!("{} on CPUs {set:?}", ids.join(", ")))
            .collect();
        eprintln!(
            "evb: {} (run.placement = \"auto\"; \"none\" leaves them to the system)",
            groups.join("; ")
        );
    }
}

/// Where `auto` puts RUs `rus` and BUs `bus` on `cpus`: one CPU each when there are enough,
/// else `g` = min(CPUs, most of either role) groups of consecutive CPUs, RU i and BU i in
/// group i mod g. Nothing with fewer than two CPUs.
fn cpu_groups(cpus: &[usize], rus: &[String], bus: &[String]) -> Vec<(String, Vec<usize>)> {
    if cpus.len() < 2 || rus.len() + bus.len() == 0 {
        return Vec::new();
    }
    if rus.len() + bus.len() <= cpus.len() {
        return rus
            .iter()
            .chain(bus)
            .zip(cpus)
            .map(|(id, cpu)| (id.clone(), vec![*cpu]))
            .collect();
    }
    let g = cpus.len().min(rus.len().max(bus.len()));
    // g groups of consecutive CPUs, the first ones one larger when they do not divide evenly
    let group = |k: usize| {
        let (base, extra) = (cpus.len() / g, cpus.len() % g);
        let start = k * base + k.min(extra);
        cpus[start..start + base + usize::from(k < extra)].to_vec()
    };
    let mut out = Vec::new();
    for i in 0..rus.len().max(bus.len()) {
        for id in [rus.get(i), bus.get(i)].into_iter().flatten() {
            out.push((id.clone(), group(i % g)));
        }
    }
    out
}

/// Runs the whole system; true when the verdict is clean.
pub fn run(cfg: &Config, quiet: bool, json_out: Option<&Path>) -> Result<bool, String> {
    // watched from the start: a Ctrl-C while the nodes start is a stop like any other
    let interrupts = count_interrupts();
    let mut placed = cfg.clone();
    auto_place(&mut placed, quiet);
    let cfg = &placed;
    let launched = std::time::SystemTime::now();
    let (tx, rx) = mpsc::channel();
    let inproc = cfg.transport.kind == TransportKind::Inproc;
    // inproc: the EVM thread's commands, for Ctrl-C
    let mut evm_control = None;
    let (mut children, _tmp) = if inproc {
        evm_control = Some(spawn_threads(cfg, &tx));
        (Vec::new(), None)
    } else {
        let (c, t, resolved) = spawn_processes(cfg, &tx, false)?;
        if !quiet {
            if let Some(evm) = resolved.nodes().first() {
                eprintln!("evb: run page and control API: http://{}/", evm.control);
            }
        }
        (c, Some(t))
    };
    drop(tx);
    let ids: Vec<String> = cfg.nodes().into_iter().map(|n| n.id).collect();
    let budget = cfg.run.connect_timeout_s
        + cfg.run.stall_timeout_s * 2.0
        + if cfg.run.duration_s > 0.0 {
            cfg.run.duration_s
        } else {
            3600.0
        }
        + 30.0;
    let deadline = Instant::now() + Duration::from_secs_f64(budget);

    let tty = std::io::stderr().is_terminal();
    let bar = if quiet || !tty {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new_spinner();
        b.set_style(
            ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}").expect("template"),
        );
        b.enable_steady_tick(Duration::from_millis(120));
        b
    };
    let mut latest: BTreeMap<String, Box<NodeStatus>> = BTreeMap::new();
    let mut reports: BTreeMap<String, NodeStatus> = BTreeMap::new();
    let mut exit_codes: BTreeMap<String, Option<i32>> = BTreeMap::new();
    let mut rate = RateMeter {
        last: None,
        ev: 0.0,
        by: 0.0,
    };
    let mut next_plain = Instant::now() + Duration::from_secs(2);
    let mut timed_out = false;
    let mut first_failure: Option<Instant> = None;
    // how each node process that ended on its own ended, in words, and whether the run had
    // started then (for the verdict: a node lost before the start is the cause, not one
    // problem among the others it brought down)
    let mut how_ended: BTreeMap<String, (String, bool)> = BTreeMap::new();
    let mut stop_sent = false;
    let mut user_abort = false;

    while exit_codes.len() < ids.len() {
        // Ctrl-C: the first asks the EVM to end the run cleanly, a second aborts.
        match interrupts.load(std::sync::atomic::Ordering::SeqCst) {
            0 => {}
            1 if !stop_sent => {
                stop_sent = true;
                bar.suspend(|| {
                    eprintln!(
                        "evb: stopping the run: building what is in flight (Ctrl-C again to abort)"
                    )
                });
                if let Some(control) = &evm_control {
                    control.stop();
                } else if let Some(stdin) = children.first_mut().and_then(|(_, c)| c.stdin.as_mut())
                {
                    let _ = stdin.write_all(b"stop\n").and_then(|_| stdin.flush());
                }
            }
            1 => {}
            _ => {
                user_abort = true;
                break;
            }
        }
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Note::Line(id, v)) => {
                if v.is_report() {
                    reports.insert(id.clone(), (*v).clone());
                }
                latest.insert(id, v);
            }
            Ok(Note::Gone(id, code)) => {
                exit_codes.insert(id, code);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                if inproc {
                    break;
                }
            }
        }
        for (id, child) in &mut children {
            if exit_codes.contains_key(id) {
                continue;
            }
            if let Ok(Some(status)) = child.try_wait() {
                exit_codes.insert(id.clone(), status.code());
                note_exit(&mut how_ended, id, status, &latest, &ids[0]);
            }
        }
        let line = progress_line(&latest, &mut rate);
        bar.set_message(line.clone());
        if !quiet && !tty && Instant::now() >= next_plain {
            eprintln!("evb: {line}");
            next_plain = Instant::now() + Duration::from_secs(2);
        }
        if Instant::now() > deadline {
            timed_out = true;
            break;
        }
        // A node that failed before the run started (e.g. a bad input file), or the EVM
        // itself gone, dooms the run: give the EVM a moment to report, then stop the rest
        // rather than wait for time-outs. A node lost mid-run is the EVM's to handle (it
        // rebuilds a lost BU's events, or applies the RU-loss policy): wait for its verdict.
        let evm_running = latest
            .get(&ids[0])
            .is_some_and(|v| !matches!(v.state, RunState::Ready | RunState::Configured));
        let evm_gone = exit_codes.contains_key(&ids[0]);
        let failed = exit_codes.values().any(|c| *c != Some(0));
        if failed && (!evm_running || evm_gone) && !reports.contains_key(&ids[0]) {
            let since = *first_failure.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(3) {
                break;
            }
        }
        // When one process dies early the EVM notices and aborts the run; give the rest a
        // moment, then make sure nobody is left behind.
        if !children.is_empty() && exit_codes.len() < ids.len() && reports.contains_key(&ids[0]) {
            let grace = Instant::now() + Duration::from_secs(5);
            while exit_codes.len() < ids.len() && Instant::now() < grace {
                for (id, child) in &mut children {
                    if !exit_codes.contains_key(id) {
                        if let Ok(Some(status)) = child.try_wait() {
                            exit_codes.insert(id.clone(), status.code());
                            note_exit(&mut how_ended, id, status, &latest, &ids[0]);
                        }
                    }
                }
                while let Ok(n) = rx.try_recv() {
                    if let Note::Line(id, v) = n {
                        if v.is_report() {
                            reports.insert(id.clone(), (*v).clone());
                        }
                        latest.insert(id, v);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            break;
        }
    }
    bar.finish_and_clear();
    // Drain the last lines (final reports race with process exit).
    let drain_until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < drain_until {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(Note::Line(id, v)) => {
                if v.is_report() {
                    reports.insert(id, *v);
                }
            }
            Ok(Note::Gone(id, code)) => {
                exit_codes.insert(id, code);
            }
            Err(_) => {
                if reports.len() == ids.len() {
                    break;
                }
            }
        }
    }
    let mut killed = Vec::new();
    for (id, child) in &mut children {
        if let Ok(None) = child.try_wait() {
            let _ = child.kill();
            let _ = child.wait();
            killed.push(id.clone());
        }
        drop(child.stdin.take());
    }
    let pids: Vec<u32> = children.iter().map(|(_, c)| c.id()).collect();

    let mut problems: Vec<String> = Vec::new();
    // a node process that died before the run started, with no word from the EVM: that is
    // the cause, said first as the EVM would have (`lost bu[1] before the run started`), and
    // what the launcher then did to the others is one line, not two per node
    let lost_early: Vec<&String> = if reports.contains_key(&ids[0]) {
        Vec::new()
    } else {
        how_ended
            .iter()
            .filter(|(id, (_, started))| !started && exit_codes.get(*id) != Some(&Some(0)))
            .map(|(id, _)| id)
            .collect()
    };
    for id in &lost_early {
        problems.push(format!(
            "lost {id} before the run started: {}",
            how_ended[*id].0
        ));
    }
    if !lost_early.is_empty() {
        let others: Vec<&str> = ids
            .iter()
            .filter(|id| !lost_early.contains(id))
            .map(String::as_str)
            .collect();
        problems.push(format!(
            "the run never started; the other nodes were stopped ({})",
            others.join(", ")
        ));
    }
    if user_abort {
        problems.push("aborted by the operator (second Ctrl-C)".into());
    }
    if timed_out {
        problems.push(format!("run did not finish within {budget:.0} s"));
    }
    let evm_report = reports.get(&ids[0]);
    // The EVM's report and the builder's verdict on it (the EVM's own).
    let run = evm_report.and_then(|r| r.run.as_ref());
    let verdict = run.map(RunReport::verdict).unwrap_or_default();
    let evm_ok = evm_report.and_then(|r| r.ok) == Some(true) && verdict.is_empty();
    // Nodes the EVM lost during the run and handled by the documented rule (a BU's events
    // rebuilt elsewhere, an RU's by the partial policy): their exit is not a failure of the
    // run; the EVM's verdict says whether anything was lost.
    let lost_by_evm: Vec<String> = cfg
        .nodes()
        .iter()
        .filter(|n| {
            let node = match n.role {
                Role::Ru => NodeRef::Ru(n.index),
                Role::Bu => NodeRef::Bu(n.index),
                Role::Evm => return false,
            };
            run.is_some_and(|r| r.lost(node))
        })
        .map(|n| n.id.clone())
        .collect();
    let evm_handled = |id: &String| lost_by_evm.contains(id) && evm_ok;
    for id in killed.iter().filter(|_| lost_early.is_empty()) {
        if !evm_handled(id) {
            problems.push(format!("{id} had to be killed"));
        }
    }
    for id in ids.iter().filter(|_| lost_early.is_empty()) {
        if evm_handled(id) {
            continue;
        }
        match exit_codes.get(id) {
            Some(Some(0)) => {}
            Some(code) if !killed.contains(id) => {
                // a node's own reason (not the EVM's, which the verdict says, nor an echo of it)
                let why = reports
                    .get(id)
                    .and_then(|r| r.reason.as_deref())
                    .filter(|w| *id != ids[0] && !w.is_empty() && !w.starts_with("run aborted"));
                let how = how_ended
                    .get(id)
                    .map(|(h, _)| h.clone())
                    .unwrap_or_else(|| exit_words(*code));
                problems.push(match why {
                    Some(w) => format!("{id} {how}: {w}"),
                    None => format!("{id} {how}"),
                })
            }
            _ => {}
        }
        if !reports.contains_key(id) {
            problems.push(format!("{id} sent no final report"));
        }
    }
    problems.extend(verdict);
    if let Some(reason) = evm_report.and_then(|r| r.reason.as_deref()) {
        let failed = evm_report.and_then(|r| r.ok) == Some(false);
        if failed && !problems.iter().any(|p| p.contains(reason)) {
            problems.push(reason.to_string());
        }
    }
    // Output files: no event may be in two of them (a consumer would take it twice).
    if cfg.sink.kind == evb_config::SinkKind::File && !cfg.sink.dir.is_empty() {
        let dir = PathBuf::from(&cfg.sink.dir);
        // this run's files only (an earlier run may have used the same ids)
        let files: Vec<PathBuf> = crate::inspect::event_files(std::slice::from_ref(&dir))
            .into_iter()
            .filter(|f| {
                std::fs::metadata(f)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t >= launched)
            })
            .collect();
        let (lines, n) = crate::inspect::duplicates_across(&files, 3);
        if n > 0 {
            problems.push(format!(
                "{n} event ids are in more than one output file in {}: {}",
                dir.display(),
                lines.join("; ")
            ));
        }
    }
    problems.dedup();
    let ok = problems.is_empty();

    summary::print(cfg, &ids, &reports, run, &problems);
    if let Some(path) = json_out {
        let doc = json!({
            "ok": ok,
            "problems": problems,
            "run": run,
            "nodes": reports,
            "exit_codes": exit_codes,
            "pids": pids,
            "transport": format!("{:?}", cfg.transport.kind).to_lowercase(),
        });
        let mut f = std::fs::File::create(path)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        writeln!(
            f,
            "{}",
            serde_json::to_string_pretty(&doc).unwrap_or_default()
        )
        .map_err(|e| e.to_string())?;
    }
    Ok(ok)
}

/// How a node process ended, in words: its exit status, or the signal that killed it.
fn ended_words(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => {
            let name = match sig {
                libc::SIGKILL => " (SIGKILL)",
                libc::SIGTERM => " (SIGTERM)",
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGBUS => " (SIGBUS)",
                _ => "",
            };
            format!("was killed by signal {sig}{name}")
        }
        (None, None) => "ended without an exit status".into(),
    }
}

/// The same from an exit code alone (a node thread, or a status already taken).
fn exit_words(code: Option<i32>) -> String {
    match code {
        Some(c) => format!("exited with status {c}"),
        None => "was killed by a signal".into(),
    }
}

/// Notes how node `id` ended, and whether the EVM had started the run by then.
fn note_exit(
    how: &mut BTreeMap<String, (String, bool)>,
    id: &str,
    status: std::process::ExitStatus,
    latest: &BTreeMap<String, Box<NodeStatus>>,
    evm: &str,
) {
    let started = latest
        .get(evm)
        .is_some_and(|v| !matches!(v.state, RunState::Ready | RunState::Configured));
    how.entry(id.to_string())
        .or_insert_with(|| (ended_words(status), started));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_placement_pairs_rus_with_bus_on_every_cpu() {
        let ids = |p: &str, n: usize| (0..n).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
        let place = |cpus: &[usize], r: usize, b: usize| {
            cpu_groups(cpus, &ids("ru", r), &ids("bu", b))
                .into_iter()
                .collect::<BTreeMap<String, Vec<usize>>>()
        };
        // 2 x 2 on two CPUs: one RU and one BU on each
        let p = place(&[0, 1], 2, 2);
        assert_eq!(p["ru0"], vec![0]);
        assert_eq!(p["bu0"], vec![0]);
        assert_eq!(p["ru1"], vec![1]);
        assert_eq!(p["bu1"], vec![1]);
        // enough CPUs: one each, none shared
        let p = place(&[2, 3, 4, 5, 6], 2, 2);
        let mut all: Vec<usize> = p.values().flatten().copied().collect();
        all.sort_unstable();
        assert_eq!(all, vec![2, 3, 4, 5]);
        // 4 x 4 on three CPUs: groups [0], [1], [2] hold ru i, bu i for i mod 3
        let p = place(&[0, 1, 2], 4, 4);
        for i in 0..4 {
            assert_eq!(p[&format!("ru{i}")], vec![i % 3]);
            assert_eq!(p[&format!("bu{i}")], vec![i % 3]);
        }
        // 2 x 2 on three CPUs: two groups, [0, 1] and [2]
        let p = place(&[0, 1, 2], 2, 2);
        assert_eq!(p["ru0"], vec![0, 1]);
        assert_eq!(p["bu1"], vec![2]);
        // 3 RUs x 1 BU on two CPUs: every node placed, the BU with ru0
        let p = place(&[0, 1], 3, 1);
        assert_eq!(p.len(), 4);
        assert_eq!(p["bu0"], p["ru0"]);
        assert_eq!(p["ru1"], vec![1]);
        assert_eq!(p["ru2"], vec![0]);
        // nothing to do with one CPU, or nothing free
        assert!(place(&[0], 2, 2).is_empty());
        assert!(place(&[0, 1], 0, 0).is_empty());
    }

    /// The ports `evb run` picks stay bound until the nodes hold them: nothing else on the
    /// host can take one in between (it used to bind, release, and let the node bind again).
    #[test]
    fn chosen_ports_stay_bound_until_the_nodes_inherit_them() {
        for kind in ["tcp", "shm"] {
            let cfg = Config::from_toml(&format!(
                "[transport]\nkind = \"{kind}\"\n[topology]\nrus = 2\nbus = 2\nhost = \"127.0.0.1\"\n"
            ))
            .unwrap();
            let (resolved, listeners) = resolve_ports(&cfg).unwrap();
            let nodes = resolved.nodes();
            assert_eq!(nodes.len(), 5);
            let mut addrs = Vec::new();
            for n in &nodes {
                let inherited = inherited_by(&resolved, n, &listeners);
                for a in [&n.addr, &n.control] {
                    let sa: std::net::SocketAddr = a.parse().unwrap();
                    assert_ne!(sa.port(), 0, "{} {a}", n.id);
                    assert!(listeners.contains_key(a.as_str()), "{} {a} not held", n.id);
                    assert!(
                        std::net::TcpListener::bind(sa).is_err(),
                        "{} {a}: free while it should be held",
                        n.id
                    );
                    addrs.push(sa);
                }
                // the control API always, the data address where TCP listens on it
                let names: Vec<&str> = inherited.iter().map(|(a, _)| a.as_str()).collect();
                let mut want = vec![];
                if kind == "tcp" {
                    want.push(n.addr.as_str());
                }
                want.push(n.control.as_str());
                assert_eq!(names, want, "{kind} {}", n.id);
            }
            addrs.sort();
            addrs.dedup();
            assert_eq!(addrs.len(), 10, "every address its own port");
            drop(listeners);
            // released only now (a few may be taken by other tests meanwhile: most are free)
            let free = addrs
                .iter()
                .filter(|a| std::net::TcpListener::bind(a).is_ok())
                .count();
            assert!(free >= 8, "only {free} of 10 ports free after release");
        }
    }
}

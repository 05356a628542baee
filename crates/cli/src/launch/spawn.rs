//! Starting the nodes: the ports chosen and held until the nodes inherit them, the
//! configuration they read (a sealed memfd), and each node as a supervised process or, under
//! `inproc`, a thread.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use evb_builder::NodeStatus;
use evb_config::{BuSection, Config, Role, RuSection, TransportKind};

use super::Note;

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
    // a standby EVM: its listener and control API (`evb run --standby`)
    let standby = if cfg.evm.standby.is_empty() {
        None
    } else {
        let evm = &nodes[0];
        let ctl = cfg.standby_control();
        Some((free(evm, &cfg.evm.standby)?, free(evm, &ctl)?))
    };
    drop(held);
    let mut out = cfg.clone();
    out.evm.addr = addrs[0].clone();
    out.evm.control = controls[0].clone();
    if let Some((a, c)) = standby {
        out.evm.standby = a;
        out.evm.standby_control = c;
    }
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
            spare: n.spare,
        })
        .collect();
    // the listed BUs carry their spare marks: counts no longer make any
    out.topology.spare_bus = 0;
    // Every node on this host: with many more nodes than CPUs, a node's event loop can wait
    // its turn for a second or more, and would be declared lost while alive. Give the
    // heartbeat timeout room for that (a real deployment sets it for its own hosts): 400 ms
    // per node per CPU, so that the default 5 nodes on 2 CPUs keep the configured 1 s, and
    // 8 on 2 (getting-started's bigger run, where a node of a busy host was seen not to run
    // for 1.23 s) get 1.6 s.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let floor = 400 * nodes.len() as u64 / cpus;
    if floor > out.run.heartbeat_timeout_ms {
        eprintln!(
            "evb: {} nodes on {cpus} CPUs: run.heartbeat_timeout_ms raised from {} to {floor} so that a busy node is not taken for a dead one",
            nodes.len(),
            out.run.heartbeat_timeout_ms
        );
        out.run.heartbeat_timeout_ms = floor;
    }
    // Starting the processes takes its turn on the CPUs too: every node must have started and
    // called before the EVM's connect timeout, which counts from the EVM's own start.
    let connect_floor = (0.5 * nodes.len() as f64 / cpus as f64).ceil();
    if connect_floor > out.run.connect_timeout_s {
        eprintln!(
            "evb: {} nodes on {cpus} CPUs: run.connect_timeout_s raised from {} to {connect_floor} so that every node has started in time",
            nodes.len(),
            out.run.connect_timeout_s
        );
        out.run.connect_timeout_s = connect_floor;
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
    /// `evb run`'s run number, claimed in the run records (`--run-number`).
    run_number: Option<u64>,
}

impl ConfigFd {
    pub(crate) fn new(text: &str, run_id: &str) -> Result<ConfigFd, String> {
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
            run_number: None,
        })
    }

    /// `evb run`'s run number, passed to every node started with this configuration.
    pub(crate) fn set_run_number(&mut self, number: Option<u64>) {
        self.run_number = number;
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
    run_number: Option<u64>,
) -> Result<Spawned, String> {
    let (cfg, listeners) = resolve_ports(cfg)?;
    let mut config = ConfigFd::new(&cfg.to_toml(), &cfg.run.id)?;
    config.run_number = run_number;
    let mut children = Vec::new();
    // spare BUs are started when asked for (`evb ctl add-bu` under `evb up`)
    for n in cfg.nodes().into_iter().filter(|n| !n.spare) {
        let inherit = inherited_by(&cfg, &n, &listeners);
        let child = spawn_node(&config, &n.id, serve, tx, &inherit)?;
        children.push((n.id.clone(), child));
    }
    if !cfg.evm.standby.is_empty() {
        // the standby EVM, told apart from the EVM by its label
        use std::os::fd::AsRawFd;
        let tcp = cfg.transport.kind == TransportKind::Tcp;
        let inherit: Vec<(String, i32)> = [&cfg.evm.standby, &cfg.evm.standby_control]
            .into_iter()
            .enumerate()
            .filter(|(i, _)| *i == 1 || tcp)
            .filter_map(|(_, a)| listeners.get(a).map(|l| (a.clone(), l.as_raw_fd())))
            .collect();
        let id = cfg.evm.id.clone();
        let child = spawn_standby(&config, &id, serve, tx, &inherit)?;
        children.push((standby_label(&id), child));
    }
    // the nodes hold their sockets now (a node started again later binds its own)
    drop(listeners);
    Ok((children, config, cfg))
}

/// Where each node process runs: a command prefix per node id (empty: this host, as is).
pub(crate) type Placement = Box<dyn Fn(&str) -> Vec<String> + Send + Sync>;
pub(crate) static PLACEMENT: std::sync::OnceLock<Placement> = std::sync::OnceLock::new();

/// The threads passing the nodes' stderr on (`evb run`), to be waited for at the end.
static STDERR_PASSERS: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>> =
    std::sync::Mutex::new(Vec::new());

/// Waits (at most `limit`) for the nodes' last stderr lines to be passed on: the node
/// processes are gone, their pipes are closing.
pub(super) fn drain_stderr(limit: Duration) {
    let passers = std::mem::take(&mut *STDERR_PASSERS.lock().unwrap_or_else(|p| p.into_inner()));
    let until = std::time::Instant::now() + limit;
    while passers.iter().any(|p| !p.is_finished()) && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
}

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
    spawn_labelled(config, id, id, &[], serve, tx, inherit)
}

/// How `evb run` names the standby EVM of EVM `id` in its notes and verdict.
pub(crate) fn standby_label(id: &str) -> String {
    format!("{id}-standby")
}

/// Starts the standby EVM process (`evb node --id EVM --standby`, with `--serve` under
/// `evb up`).
pub(crate) fn spawn_standby(
    config: &ConfigFd,
    id: &str,
    serve: bool,
    tx: &mpsc::Sender<Note>,
    inherit: &[(String, i32)],
) -> Result<Child, String> {
    spawn_labelled(
        config,
        id,
        &standby_label(id),
        &["--standby"],
        serve,
        tx,
        inherit,
    )
}

/// A standby EVM process under another label: after a takeover under `evb up`, the new
/// standby takes the label (and the addresses) of the EVM it replaces.
pub(crate) fn spawn_standby_labelled(
    config: &ConfigFd,
    id: &str,
    label: &str,
    serve: bool,
    tx: &mpsc::Sender<Note>,
) -> Result<Child, String> {
    spawn_labelled(config, id, label, &["--standby"], serve, tx, &[])
}

fn spawn_labelled(
    config: &ConfigFd,
    id: &str,
    label: &str,
    extra: &[&str],
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
            .args(config.run_number.map(|n| format!("--run-number={n}")))
            .args(extra)
            .args(
                inherit
                    .iter()
                    .map(|(a, fd)| format!("--listen-fd={a}={fd}")),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // a node of one run (`evb run`): its log passed on as it comes, and its last line
            // kept for the verdict should it fail; a serving node's (`evb up`) goes straight
            // to the terminal, as it must outlive whatever reads it
            .stderr(if serve {
                Stdio::inherit()
            } else {
                Stdio::piped()
            })
            .spawn()
            .map_err(|e| format!("cannot start {n}: {e}"))?;
        if let Some(stderr) = child.stderr.take() {
            let tx = tx.clone();
            let id = label.to_string();
            let passer = std::thread::spawn(move || {
                let mut from = BufReader::new(stderr);
                let mut line = Vec::new();
                loop {
                    line.clear();
                    match from.read_until(b'\n', &mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    let _ = std::io::stderr().write_all(&line);
                    let text = String::from_utf8_lossy(&line).trim().to_string();
                    if !text.is_empty() {
                        let _ = tx.send(Note::Stderr(id.clone(), text));
                    }
                }
            });
            STDERR_PASSERS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(passer);
        }
        let stdout = child.stdout.take().expect("piped");
        let tx = tx.clone();
        let id = label.to_string();
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

pub(super) fn spawn_threads(cfg: &Config, tx: &mpsc::Sender<Note>) -> evb_node::RunControl {
    let evm_control = evb_node::RunControl::new();
    // spare BUs join runs under `evb up` only
    for n in cfg.nodes().into_iter().filter(|n| !n.spare) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The ports `evb run` picks stay bound until the nodes hold them: nothing else on the
    /// host can take one in between.
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

/// Process `pid`'s threads as `name state where` (the kernel function each waits in), from
/// /proc: what a node that would not exit was doing when it was killed. At most 32 threads.
pub(crate) fn threads_of(pid: u32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return "(gone)".into();
    };
    let mut out = Vec::new();
    for t in tasks.flatten().take(32) {
        let path = t.path();
        let read = |f: &str| std::fs::read_to_string(path.join(f)).unwrap_or_default();
        // stat: "tid (comm) S ...": the state follows the last ')' (comm may hold one). A
        // thread that exits while it is read has no stat left: it is not listed.
        let stat = read("stat");
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let Some(state) = rest.split_whitespace().next() else {
            continue;
        };
        let name = head.split_once('(').map_or("", |(_, n)| n).to_string();
        let wchan = read("wchan");
        let wchan = if wchan.is_empty() || wchan == "0" {
            "-".to_string()
        } else {
            wchan
        };
        out.push(format!("{name} {state} {wchan}"));
    }
    out.join("; ")
}

#[cfg(test)]
mod threads {
    /// This test's own process: its main thread and the test's thread are there, each with
    /// a state letter, while the harness's other test threads come and go (CI once caught
    /// one mid-exit: it must be left out, not listed as `?`).
    #[test]
    fn a_processs_threads_are_named_with_their_state() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        // threads that start and exit all the while the listing is read
        let stop = Arc::new(AtomicBool::new(false));
        let churn: Vec<_> = (0..2)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::spawn(|| ()).join().unwrap();
                    }
                })
            })
            .collect();
        for _ in 0..300 {
            let s = super::threads_of(std::process::id());
            let parts: Vec<&str> = s.split("; ").collect();
            assert!(parts.len() >= 2, "{s}");
            for p in parts {
                // `name state wchan`: a name may hold spaces, the other two do not
                let state = p.rsplit(' ').nth(1).unwrap_or("");
                assert!(
                    state.len() == 1 && "RSDTtZXIKWP".contains(state),
                    "{p} in {s}"
                );
                assert!(!p.starts_with(' '), "a thread without a name: {p} in {s}");
            }
        }
        stop.store(true, Ordering::Relaxed);
        for t in churn {
            t.join().unwrap();
        }
        assert_eq!(super::threads_of(u32::MAX), "(gone)");
    }
}

//! A node process with its control API: it runs one run and exits (`evb run`, a plain
//! `evb node`), or stays up and runs the runs it is told to (`evb up`, `evb node --serve`).
//!
//! Every node serves its own status and `/metrics`. The EVM also runs the run controller
//! ([`crate::controller`]): it takes the operator's commands and tells the other nodes, over
//! their APIs, to start each run; the run itself then goes exactly as in `evb run` (the
//! nodes connect, the EVM starts the run when all are ready, drains, collects the reports).

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use evb_builder::{NodeStatus, StatusRole};
use evb_config::{Config, NodeSpec, Role};
use evb_node::{NodeError, NodeOutcome, RunControl};
use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

use crate::controller::Controller;
use crate::fsm::State;

/// Where status lines go besides the API (stdout under a launcher).
pub type Lines = Arc<dyn Fn(NodeStatus) + Send + Sync>;

/// How a node process lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One run, started at once, then exit.
    Once,
    /// Stay up; run the runs the EVM's controller starts, until halted.
    Serve,
}

/// A command to the node's main loop.
pub(crate) enum Cmd {
    Start {
        run: u64,
        cfg: Box<Config>,
    },
    /// A standby EVM is to become the run control (after the run it follows, if any: the
    /// commands are taken in order).
    Promote,
    Halt,
}

/// A node's own phase (the EVM's run state is the controller's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Idle,
    Running,
    Halted,
}

pub(crate) struct NodeState {
    pub cfg: Config,
    pub phase: Phase,
    /// The run this node is in, or was last in (0: none yet).
    pub run: u64,
    pub runs_total: u64,
    /// How this node's last run ended.
    pub last: Option<LastRun>,
}

/// A configured node's role as status lines and metrics name it.
pub(crate) fn status_role(r: Role) -> StatusRole {
    match r {
        Role::Evm => StatusRole::Evm,
        Role::Ru => StatusRole::Ru,
        Role::Bu => StatusRole::Bu,
    }
}

impl Phase {
    /// The phase's name, as `GET /api/v1/node` writes it.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Running => "running",
            Phase::Halted => "halted",
        }
    }
}

/// How a node's last run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastRun {
    pub run: u64,
    pub ok: bool,
    pub reason: String,
}

/// A node's own status, as its API answers `GET /api/v1/node` (docs/control.md): what the
/// EVM's controller polls, and `evb up` waits on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeReply {
    pub node: String,
    pub role: StatusRole,
    pub pid: u32,
    pub phase: Phase,
    pub mode: Mode,
    /// The run it is in, or was last in (0: none yet).
    pub run: u64,
    pub runs_total: u64,
    pub last: Option<LastRun>,
    /// Its latest status line (`None` before its first run published one).
    pub snapshot: Option<NodeStatus>,
    /// A standby EVM under `evb up`: whether it has become the run control (after taking a
    /// run over, or when told the EVM is gone: docs/standby.md). False everywhere else.
    #[serde(default)]
    pub controls: bool,
}

/// What the API handlers and the main loop share.
pub struct Node {
    pub(crate) spec: NodeSpec,
    pub(crate) mode: Mode,
    pub(crate) control: RunControl,
    pub(crate) secret: Option<Vec<u8>>,
    pub(crate) state: Mutex<NodeState>,
    pub(crate) cmds: mpsc::Sender<Cmd>,
    /// The EVM's run controller; empty at other nodes, and at a standby EVM until it takes
    /// over for good.
    pub(crate) controller: std::sync::OnceLock<Controller>,
    /// A standby EVM that runs the runs it is told to as their follower (`evb up --standby`).
    pub(crate) standby: bool,
    /// The standby is to become the run control once the run it follows is over.
    pub(crate) promote_after: std::sync::atomic::AtomicBool,
    pub(crate) lines: Lines,
    pub(crate) status_every: Duration,
    /// This node itself: a standby's run promotes it from a status line.
    me: std::sync::Weak<Node>,
}

impl Node {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn id(&self) -> &str {
        &self.spec.id
    }

    pub fn role(&self) -> Role {
        self.spec.role
    }

    pub(crate) fn role_name(&self) -> &'static str {
        status_role(self.spec.role).name()
    }

    /// The bearer token this node presents to its peers' APIs.
    pub(crate) fn token(&self) -> Option<String> {
        self.secret
            .as_ref()
            .map(|s| evb_transport::control_token(s))
    }

    /// The run controller, at the EVM (or a standby that took over).
    pub(crate) fn controller(&self) -> Option<&Controller> {
        self.controller.get()
    }

    /// The run state as `/metrics` and the node status show it.
    pub(crate) fn run_state(&self) -> State {
        if let Some(c) = self.controller() {
            return c.state();
        }
        match self.lock().phase {
            Phase::Idle => State::Ready,
            Phase::Running => State::Running,
            Phase::Halted => State::Halted,
        }
    }

    /// This node's own status (`GET /api/v1/node`).
    pub(crate) fn status(&self) -> NodeReply {
        let st = self.lock();
        NodeReply {
            node: self.spec.id.clone(),
            role: status_role(self.spec.role),
            pid: std::process::id(),
            phase: st.phase,
            mode: self.mode,
            run: st.run,
            runs_total: st.runs_total,
            last: st.last.clone(),
            snapshot: self.control.snapshot(),
            controls: self.standby && self.controller().is_some(),
        }
    }

    /// Takes a run's configuration from the EVM: it must describe the same system as this
    /// node's own (nodes, addresses, transport); this node's secret is used, never one
    /// sent over the network.
    pub(crate) fn accept_run_config(&self, text: &str) -> Result<Config, String> {
        let mut cfg =
            Config::parse_unvalidated(text).map_err(|e| format!("run configuration: {e}"))?;
        let mut st = self.lock();
        cfg.run.secret = st.cfg.run.secret.clone();
        cfg.validate()
            .map_err(|e| format!("run configuration: {e}"))?;
        if self.standby {
            // the active EVM's configuration, as its follower runs it
            evb_node::make_standby(&mut cfg, &self.spec.id)
                .map_err(|e| format!("run configuration: {e}"))?;
        }
        // a standby took the control over (once, or more: a run may have seen two takeovers)
        // and now starts the runs: from here on this node takes runs from it only, by its
        // control epoch (a lost EVM, should it wake, is refused: its epoch is lower)
        if self.spec.role != Role::Evm {
            if let Some(p) = st.cfg.promoted_to(&cfg) {
                info!(node = %self.spec.id, "the standby EVM at {} is the EVM now (control epoch {})", cfg.evm.addr, p.evm.control_epoch);
                st.cfg = p;
            }
        }
        let keys = st.cfg.restart_needed(&cfg);
        if !keys.is_empty() {
            return Err(format!(
                "the run's configuration changes what this node was started with ({}): restart the nodes to change it",
                keys.join(", ")
            ));
        }
        Ok(cfg)
    }

    /// Runs one run of this node on this thread.
    fn run_one(&self, run: u64, cfg: &Config) -> Result<NodeOutcome, NodeError> {
        // `{run}` in sink.dir: the launcher or the run control put the run's folder in its
        // configuration; a node started alone puts it in itself
        let own;
        let cfg = match cfg.run_folder(&cfg.run.id, run) {
            Some(dir) => {
                let mut c = cfg.clone();
                c.sink.dir = dir;
                own = c;
                &own
            }
            None => cfg,
        };
        {
            let mut st = self.lock();
            st.phase = Phase::Running;
            st.run = run;
            st.runs_total += 1;
        }
        let lines = self.lines.clone();
        let controller = self.controller().cloned();
        let me = self.me.clone();
        let status: evb_node::StatusOut = Box::new(move |mut v: NodeStatus| {
            v.run_number = Some(run);
            match &controller {
                Some(c) => c.on_status(&v),
                // a standby under `evb up` that took the run over is its control from now
                // on: the operator pauses, resumes and stops it there (docs/standby.md)
                None => {
                    if let Some(node) = me.upgrade() {
                        match node.controller() {
                            Some(c) => c.on_status(&v),
                            None if node.mode == Mode::Serve && v.took_over() => {
                                promote(&node, Some(Followed::Running(run, &v)))
                            }
                            None => {}
                        }
                    }
                }
            }
            lines(v);
        });
        let r = evb_node::run_node_controlled(
            cfg,
            &self.spec.id,
            status,
            self.status_every,
            self.control.clone(),
        );
        let mut st = self.lock();
        st.phase = Phase::Idle;
        st.last = Some(match &r {
            Ok(o) => LastRun {
                run,
                ok: o.ok,
                reason: o.reason.clone(),
            },
            Err(e) => LastRun {
                run,
                ok: false,
                reason: e.to_string(),
            },
        });
        r
    }
}

/// The run id of run `n`: the configured id with `#n`, so that a node left over from an
/// earlier run is refused by this one's handshakes.
pub fn numbered_run_id(id: &str, n: u64) -> String {
    let tail = format!("#{n}");
    // 64 bytes: the handshake's limit on names
    let room = 64usize.saturating_sub(tail.len());
    let mut head = id.to_string();
    while head.len() > room {
        head.pop();
    }
    format!("{head}{tail}")
}

/// How a node process ended.
pub struct Ended {
    pub ok: bool,
    /// The last run's outcome (one-shot mode: the run's).
    pub outcome: Option<Result<NodeOutcome, NodeError>>,
}

/// Why a node process could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("no node {0:?} in the configuration")]
    UnknownNode(String),
    #[error("transport.kind = \"inproc\" runs the nodes as threads of `evb run` only")]
    InprocServe,
    /// Its control API could not listen.
    #[error("{0}")]
    Api(String),
    /// The run records could not be kept (`run.records_dir`).
    #[error("run records: {0}")]
    Records(String),
}

/// How long a run control waits, at its process's end, for its run records to be on disk.
/// A launcher waits this long (and a little more) for an EVM to exit after its report: the
/// EVM is not hung while it writes the run's record.
pub const RECORDS_FLUSH_LIMIT: Duration = Duration::from_secs(10);

/// Starts node `id` of `cfg`: its API on its control address, then its run(s), commanded
/// through `control` (and its API). Returns when the one run is over (`Mode::Once`) or
/// when halted (`Mode::Serve`). `once_run`: the number of the one run, claimed in the run
/// records by the launcher (`evb run`); `None`: run 1, and no records kept on disk.
pub fn run_process(
    cfg: &Config,
    id: &str,
    mode: Mode,
    lines: Lines,
    status_every: Duration,
    control: RunControl,
    once_run: Option<u64>,
) -> Result<Ended, ProcessError> {
    let spec = cfg
        .nodes()
        .into_iter()
        .find(|n| n.id == id)
        .ok_or_else(|| ProcessError::UnknownNode(id.to_string()))?;
    if mode == Mode::Serve && cfg.transport.kind == evb_config::TransportKind::Inproc {
        return Err(ProcessError::InprocServe);
    }
    let (tx, rx) = mpsc::channel();
    let secret = cfg.secret().map(String::into_bytes);
    // a serving standby EVM (`evb up --standby`: it follows each run it is told to) has no
    // controller until it takes over for good; a one-run standby (`evb run --standby`, `evb
    // node --standby`) has one for its run's status and page, as any EVM
    let standby = spec.role == Role::Evm && !cfg.evm.follow.is_empty() && mode == Mode::Serve;
    let controller = std::sync::OnceLock::new();
    if spec.role == Role::Evm && !standby {
        let c = Controller::new(cfg, mode);
        // the run control keeps its records on disk: `evb up`'s, and `evb run`'s one run
        if mode == Mode::Serve || once_run.is_some() {
            c.keep_records(mode == Mode::Serve, None)
                .map_err(ProcessError::Records)?;
        }
        let _ = controller.set(c);
    }
    let node = Arc::new_cyclic(|me| Node {
        me: me.clone(),
        spec: spec.clone(),
        mode,
        control,
        secret,
        state: Mutex::new(NodeState {
            cfg: cfg.clone(),
            phase: Phase::Idle,
            run: 0,
            runs_total: 0,
            last: None,
        }),
        cmds: tx.clone(),
        controller,
        standby,
        promote_after: std::sync::atomic::AtomicBool::new(false),
        lines,
        status_every,
    });
    let bound = crate::api::serve(node.clone(), &spec.control).map_err(ProcessError::Api)?;
    info!(node = %spec.id, "control API on http://{bound}");
    node.control.set_api(bound.to_string());
    if let Some(c) = node.controller() {
        c.attach(&node);
    }
    match mode {
        Mode::Once => {
            let run = once_run.unwrap_or(1);
            if let Some(c) = node.controller() {
                c.begin_once(run);
            }
            let r = node.run_one(run, cfg);
            if let Some(c) = node.controller() {
                c.finished(run, &r);
            }
            let ok = matches!(&r, Ok(o) if o.ok);
            if let Some(c) = node.controller() {
                c.flush_records(RECORDS_FLUSH_LIMIT);
            }
            Ok(Ended {
                ok,
                outcome: Some(r),
            })
        }
        Mode::Serve => {
            let mut last = None;
            // the last run this standby followed and did not record: what a promotion after
            // it records (its verdict died with the EVM's control)
            let mut unrecorded: Option<u64> = None;
            for cmd in rx {
                match cmd {
                    Cmd::Start { run, cfg } => {
                        let r = match node.controller() {
                            Some(c) => c.run(&node, run, &cfg, |n, cfg| n.run_one(run, cfg)),
                            None => {
                                let r = node.run_one(run, &cfg);
                                // promoted during the run: the run's record is its own
                                if let Some(c) = node.controller() {
                                    c.finished(run, &r);
                                }
                                r
                            }
                        };
                        if node.standby {
                            let took_over = matches!(&r, Ok(o) if o.report.took_over());
                            let told = node.promote_after.load(std::sync::atomic::Ordering::SeqCst);
                            if took_over || told {
                                promote(&node, Some(Followed::Run(run, &r)));
                                unrecorded = None;
                            } else {
                                unrecorded = Some(run);
                            }
                        }
                        match &r {
                            Ok(o) if o.ok => info!(node = %spec.id, "run {run}: {}", o.reason),
                            Ok(o) => warn!(node = %spec.id, "run {run}: {}", o.reason),
                            Err(e) => error!(node = %spec.id, "run {run}: {e}"),
                        }
                        last = Some(r);
                    }
                    Cmd::Promote => promote(&node, unrecorded.take().map(Followed::EndedThere)),
                    Cmd::Halt => break,
                }
            }
            node.lock().phase = Phase::Halted;
            if let Some(c) = node.controller() {
                c.flush_records(RECORDS_FLUSH_LIMIT);
            }
            info!(node = %spec.id, "halted");
            // let the reply to the halt request go out
            std::thread::sleep(Duration::from_millis(100));
            Ok(Ended {
                ok: true,
                outcome: last,
            })
        }
    }
}

/// The run a standby followed last, as its promotion records it.
pub(crate) enum Followed<'a> {
    /// It ran the run to its end, with this outcome.
    Run(u64, &'a Result<NodeOutcome, NodeError>),
    /// The run ended at the EVM, and the EVM was lost before its control kept the record.
    EndedThere(u64),
    /// It took the run over and runs it now (its status line says whether paused).
    Running(u64, &'a NodeStatus),
}

/// A standby EVM becomes the run control for good (docs/standby.md, "Under evb up"): a
/// controller of its own over the configuration with its addresses as the EVM's, numbering
/// on from the run it followed, and recording that run: with its outcome when the standby
/// took it over, else as a run whose verdict was lost with the EVM.
pub(crate) fn promote(node: &Arc<Node>, followed: Option<Followed<'_>>) {
    if !node.standby || node.controller().is_some() {
        return;
    }
    let (cfg, last) = {
        let mut st = node.lock();
        let Some(cfg) = st.cfg.with_standby_promoted() else {
            return;
        };
        st.cfg = cfg.clone();
        (cfg, st.run)
    };
    let c = Controller::new(&cfg, Mode::Serve);
    let live = match &followed {
        Some(Followed::Run(run, _) | Followed::EndedThere(run) | Followed::Running(run, _)) => {
            Some(*run)
        }
        None => None,
    };
    if let Err(e) = c.keep_records(true, live) {
        warn!(node = %node.spec.id, "the run records are kept in memory only: {e}");
    }
    c.number_from(last);
    let when = match followed {
        Some(Followed::Running(run, _)) => format!("during run {run}"),
        _ => format!("after run {last}"),
    };
    match followed {
        Some(Followed::Run(run, r)) if r.as_ref().map_or(true, |o| o.report.took_over()) => {
            c.begin_once(run);
            c.finished(run, r);
        }
        Some(Followed::Run(run, _) | Followed::EndedThere(run)) => c.verdict_unknown(run),
        Some(Followed::Running(run, line)) => {
            c.adopt_running(run, line.evm().is_some_and(|e| e.paused))
        }
        None => {}
    }
    if node.controller.set(c.clone()).is_ok() {
        c.attach(node);
        warn!(node = %node.spec.id, "the standby EVM is the run control now ({when})");
    }
}

/// The address an API listens on (port 0: any free one).
pub(crate) fn parse_listen(addr: &str) -> Result<SocketAddr, String> {
    addr.parse()
        .map_err(|_| format!("control address {addr:?} is not IP:port"))
}

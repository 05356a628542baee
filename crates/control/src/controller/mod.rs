//! The EVM's run controller: the operator's commands, checked against the run state
//! machine ([`crate::fsm`]); each run's start told to every node over its API; each run's
//! record (number, verdict, counters) kept for `GET /api/v1/runs/N`; and a table of every
//! node's state and rates, refreshed once a second, for `evb ctl status` and the page.
//!
//! The decisions are [`core::Core`]'s, which does no IO; this shell makes the HTTP calls
//! it asks for, applies its effects to the EVM's own node, and passes the time in.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use evb_builder::NodeStatus;
use evb_config::{Config, NodeSpec};
use evb_node::{NodeError, NodeOutcome};
use evb_wire::window::DecisionWindow;
use serde_json::json;
use tracing::{info, warn};

use crate::client::{Api, CallError};
use crate::fsm::State;
use crate::replies::{CommandReply, Request};
use crate::service::{Cmd, Mode, Node, NodeReply, Phase};

mod adopt;
mod core;
mod history;
mod records;
mod store;
#[cfg(test)]
mod tests;

use self::core::{Core, Effect, Rejoin};
pub use self::core::{Refused, ScrapeTarget, MAX_RUN};
use records::Finished;
pub use records::{RunEnd, RunRecord};
pub use store::{check_chain, record_file, ChainCheck, OnceRecord};

/// How long a node may take to answer a poll.
const POLL_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct Controller(Arc<Shell>);

struct Shell {
    core: Mutex<Core>,
    node: Mutex<Weak<Node>>,
    /// Where the run records go on disk (none: memory only, a lone node's one run).
    store: std::sync::OnceLock<store::RecordStore>,
    /// The records to append, in order, for a thread of their own: a write ends in a sync
    /// that can take seconds on a busy disk, and the core is locked on the node's status
    /// path (a standby taking a run over must not wait for the disk).
    writer: std::sync::OnceLock<std::sync::mpsc::Sender<ToDisk>>,
}

/// What the record writer thread is given.
enum ToDisk {
    Record(Box<RunRecord>),
    /// Answered once every record sent before it is written.
    Flush(std::sync::mpsc::SyncSender<()>),
}

/// The core, locked; when let go, the records that changed go to the writer thread.
struct CoreGuard<'a> {
    core: std::sync::MutexGuard<'a, Core>,
    writer: Option<&'a std::sync::mpsc::Sender<ToDisk>>,
}

impl std::ops::Deref for CoreGuard<'_> {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.core
    }
}

impl std::ops::DerefMut for CoreGuard<'_> {
    fn deref_mut(&mut self) -> &mut Core {
        &mut self.core
    }
}

impl Drop for CoreGuard<'_> {
    fn drop(&mut self) {
        let changed = self.core.take_changed();
        if let Some(w) = self.writer {
            for r in changed {
                let _ = w.send(ToDisk::Record(Box::new(r)));
            }
        }
    }
}

/// How long an EVM's report waits for its run's record to be on disk.
const REPORT_FLUSH_LIMIT: Duration = Duration::from_secs(5);

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Controller {
    pub(crate) fn new(cfg: &Config, mode: Mode) -> Controller {
        Controller(Arc::new(Shell {
            core: Mutex::new(Core::new(cfg, mode)),
            node: Mutex::new(Weak::new()),
            store: std::sync::OnceLock::new(),
            writer: std::sync::OnceLock::new(),
        }))
    }

    /// Waits (at most `limit`) until every record changed so far is on disk: before the
    /// process ends.
    pub(crate) fn flush_records(&self, limit: Duration) {
        let Some(w) = self.0.writer.get() else {
            return;
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        if w.send(ToDisk::Flush(tx)).is_ok() && rx.recv_timeout(limit).is_err() {
            warn!("the run records were not all written within {limit:?}");
        }
    }

    /// Keeps `store` from now on, with the thread that appends its records in order.
    fn start_writer(&self, store: store::RecordStore) {
        let (tx, rx) = std::sync::mpsc::channel::<ToDisk>();
        let disk = store.clone();
        let spawned = std::thread::Builder::new()
            .name("evb-run-records".into())
            .spawn(move || {
                for m in rx {
                    match m {
                        ToDisk::Record(r) => {
                            if let Err(e) = disk.write(&r) {
                                warn!("run {}: its record was not written: {e}", r.run);
                            }
                        }
                        ToDisk::Flush(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            });
        if spawned.is_ok() {
            let _ = self.0.writer.set(tx);
        }
        let _ = self.0.store.set(store);
    }

    /// Keeps the run records on disk (`run.records_dir`) from now on. A serving control
    /// (`load`) takes the records found there: runs left open by a control that ended are
    /// closed as interrupted, and the numbering goes on after the last. `evb run`'s EVM
    /// (not `load`) records only its one run, whose number the launcher claimed. `live`: the
    /// run a promoted standby holds, left open for its own record (see `RecordStore::load`).
    pub(crate) fn keep_records(&self, load: bool, live: Option<u64>) -> Result<(), String> {
        let cfg = self.core().cfg().clone();
        let store = store::RecordStore::open(&cfg)?;
        if !load {
            self.start_writer(store);
            return Ok(());
        }
        let found = store.load(unix_now(), live)?;
        info!(
            "run records in {} ({} runs found)",
            store.path().display(),
            found.len()
        );
        self.core().load_records(found);
        self.start_writer(store);
        Ok(())
    }

    fn core(&self) -> CoreGuard<'_> {
        CoreGuard {
            core: self.0.core.lock().unwrap_or_else(|p| p.into_inner()),
            writer: self.0.writer.get(),
        }
    }

    fn node(&self) -> Option<Arc<Node>> {
        self.0
            .node
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .upgrade()
    }

    pub fn state(&self) -> State {
        self.core().state()
    }

    /// Ties the controller to its node and starts refreshing the node table.
    pub(crate) fn attach(&self, node: &Arc<Node>) {
        *self.0.node.lock().unwrap_or_else(|p| p.into_inner()) = Arc::downgrade(node);
        let me = self.clone();
        let _ = std::thread::Builder::new()
            .name("evb-node-table".into())
            .spawn(move || me.poll_nodes());
    }

    /// A standby that took over numbers on from the last run it followed.
    pub(crate) fn number_from(&self, run: u64) {
        self.core().number_from(run);
    }

    /// Where a standby EVM's control API listens, if the configuration has one that is
    /// still a standby (`evb up --standby`).
    fn standby_api(&self) -> Option<String> {
        let c = self.core();
        let cfg = c.cfg();
        (!cfg.evm.standby.is_empty() && cfg.evm.follow.is_empty()).then(|| cfg.standby_control())
    }

    /// The standby EVM as a node to call (its control API), if there is one.
    fn standby_spec(&self, evm: &Node) -> Option<NodeSpec> {
        let control = self.standby_api()?;
        Some(NodeSpec {
            id: format!("{}-standby", evm.id()),
            control,
            ..evm.spec.clone()
        })
    }

    /// `evb run`'s one run: started at once, without a command.
    pub(crate) fn begin_once(&self, run: u64) {
        self.core().begin_once(run, unix_now());
    }

    /// A standby that took a run over becomes its control mid-run (see
    /// `Core::adopt_running`).
    pub(crate) fn adopt_running(&self, run: u64, paused: bool) {
        self.core().adopt_running(run, paused, unix_now());
    }

    /// Every status line of the EVM's run: follows its progress into the run state.
    pub(crate) fn on_status(&self, line: &NodeStatus) {
        let closed = {
            let mut core = self.core();
            core.on_status(line);
            match (line.is_report(), line.run_number, line.evm()) {
                (true, Some(run), Some(_)) => core.reported(
                    run,
                    Finished {
                        ok: line.ok == Some(true),
                        reason: line.reason.clone().unwrap_or_default(),
                        report: Some(line.clone()),
                        fenced: line.fenced,
                    },
                    unix_now(),
                ),
                _ => None,
            }
        };
        // the closed record on disk before the report goes on to its readers (after the
        // lines the guard above handed the writer)
        if let (Some(rec), Some(w)) = (closed, self.0.writer.get()) {
            let _ = w.send(ToDisk::Record(Box::new(rec)));
            self.flush_records(REPORT_FLUSH_LIMIT);
        }
    }

    /// Whether command `cmd` may be given now (see `Core::allowed`).
    pub(crate) fn allowed(&self, cmd: crate::fsm::Command) -> Result<(), Refused> {
        self.core().allowed(cmd).map(|_| ())
    }

    /// Most decisions in one `decide` call.
    pub const MAX_DECISIONS: usize = 4096;

    /// Decisions from outside (`POST /api/v1/decide`, `evb ctl decide`): each window a
    /// record of the run under way, in order. Refused when the run does not take them
    /// (`windows.outside`), when no run is on, and for a window that ends before it begins,
    /// is longer than `windows.longest_ticks` or names a source no RU reads, naming it;
    /// nothing of a refused call is taken.
    pub(crate) fn decide(
        &self,
        windows: &[DecisionWindow],
    ) -> Result<crate::replies::DecideReply, Refused> {
        let node = self.node().ok_or(Refused::new(503, "shutting down"))?;
        let core = self.core();
        let cfg = core.cfg();
        if cfg.builder.by != evb_config::BuildBy::Window || !cfg.windows.outside {
            return Err(Refused::new(
                409,
                "this system's records are not decided from outside (builder.by = \"window\" \
                 with windows.outside = true)",
            ));
        }
        let state = core.state();
        if !matches!(state, State::Starting | State::Running | State::Paused) {
            return Err(Refused::new(
                409,
                format!("no run to decide for: the state is {}", state.name()),
            ));
        }
        if windows.is_empty() || windows.len() > Self::MAX_DECISIONS {
            return Err(Refused::new(
                400,
                format!("1 to {} windows per call", Self::MAX_DECISIONS),
            ));
        }
        let longest = cfg.windows.longest_ticks;
        let sources = cfg.ru_source_ids();
        for (i, w) in windows.iter().enumerate() {
            let (b, e) = (w.begin, w.end);
            if e <= b || e - b > longest {
                return Err(Refused::new(
                    400,
                    format!(
                        "window {i} [{b}, {e}): it must end after it begins and last at most \
                         windows.longest_ticks = {longest} ticks"
                    ),
                ));
            }
            if let Some(why) = w.problem() {
                return Err(Refused::new(400, format!("window {i}: {why}")));
            }
            if let Some(s) = w.components.iter().find(|s| !sources.contains(s)) {
                return Err(Refused::new(
                    400,
                    format!(
                        "window {i} names source {s}, which no RU of the run reads (their \
                         source ids: {sources:?})"
                    ),
                ));
            }
        }
        node.control.decide(windows);
        Ok(crate::replies::DecideReply {
            run: core.run(),
            accepted: windows.len() as u64,
        })
    }

    /// Starts a spare BU (`POST /api/v1/add-bu`, docs/control.md): the launcher starts its
    /// process, and it joins the run under way once it answers (`Core::add_bu`).
    pub(crate) fn add_bu(
        &self,
        req: &crate::replies::AddBuRequest,
    ) -> Result<crate::replies::AddBuReply, Refused> {
        let mut core = self.core();
        let state = core.state();
        if state == State::Halted {
            return Err(Refused::new(409, "the system is halted"));
        }
        let n = core.add_bu(&req.bu)?;
        let run = matches!(state, State::Running | State::Paused).then(|| core.run());
        info!(
            "{} is to start (add-bu){}",
            n.id,
            run.map(|r| format!("; it joins run {r}"))
                .unwrap_or_default()
        );
        Ok(crate::replies::AddBuReply {
            run,
            bu: n.id.clone(),
            node: format!("bu[{}]", n.index),
            start: format!(
                "evb node --config RUN.toml --id {} --serve   (under Slurm: srun -n 1 -w HOST evb node ...)",
                n.id
            ),
        })
    }

    /// Retires a BU from the run under way (`POST /api/v1/retire`, docs/control.md): it is
    /// given no more events and leaves once all it holds is final (`Evm::retire`).
    pub(crate) fn retire(
        &self,
        req: &crate::replies::RetireRequest,
    ) -> Result<crate::replies::RetireReply, Refused> {
        let node = self.node().ok_or(Refused::new(503, "shutting down"))?;
        let core = self.core();
        let state = core.state();
        if !matches!(state, State::Running | State::Paused) {
            return Err(Refused::new(
                409,
                format!("no run to retire a BU from: the state is {}", state.name()),
            ));
        }
        let cfg = core.cfg();
        if !cfg.evm.standby.is_empty() {
            // a standby's copy of the run knows nothing of a retirement: not yet
            return Err(Refused::new(
                409,
                "retiring a BU is not supported with a standby EVM (evm.standby) yet",
            ));
        }
        let bus: Vec<evb_config::NodeSpec> = cfg
            .nodes()
            .into_iter()
            .filter(|n| n.role == evb_config::Role::Bu)
            .collect();
        let Some(me) = bus.iter().find(|n| n.id == req.bu) else {
            return Err(Refused::new(
                404,
                format!(
                    "no BU {:?} in this system (its BUs: {})",
                    req.bu,
                    bus.iter()
                        .map(|n| n.id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        };
        // the BUs still building: not down, not retiring or retired (the EVM's word)
        let evm = node.control.snapshot();
        let e = evm.as_ref().and_then(|s| s.evm());
        let gone = |i: u16| {
            use evb_builder::NodeEventKind::{RetireCalledOff, Retired, Retiring};
            let name = format!("bu[{i}]");
            e.is_some_and(|e| {
                // the last word on its retirement: retiring or retired (not called off)
                let last = e.lost.iter().rev().find(|ev| {
                    ev.node == name && matches!(ev.kind, Retiring | Retired | RetireCalledOff)
                });
                e.down.contains(&name) || last.is_some_and(|ev| ev.kind != RetireCalledOff)
            })
        };
        if gone(me.index) {
            return Err(Refused::new(
                409,
                format!(
                    "{} is not building in this run (lost, or retiring already)",
                    me.id
                ),
            ));
        }
        if !bus.iter().any(|n| n.index != me.index && !gone(n.index)) {
            return Err(Refused::new(
                409,
                format!("{} is the last BU of the run: it cannot retire", me.id),
            ));
        }
        node.control.retire(me.index);
        info!("{} retiring from run {}", me.id, core.run());
        Ok(crate::replies::RetireReply {
            run: core.run(),
            bu: me.id.clone(),
            node: format!("bu[{}]", me.index),
        })
    }

    /// An operator's command (the API's POST /api/v1/<command>).
    pub(crate) fn command(&self, req: Request) -> Result<CommandReply, Refused> {
        let node = self.node().ok_or(Refused::new(503, "shutting down"))?;
        let mut req = req;
        let mut core = self.core();
        if let (Request::Start { run }, Some(store)) = (&mut req, self.0.store.get()) {
            // the number is claimed in the record file, under its lock: no other control
            // of this run id takes it, now or after a restart
            core.allowed(crate::fsm::Command::Start)?;
            // a number out of range, or one this control holds, is refused as without records
            core.next_run(*run)?;
            let unix = unix_now();
            let n = store
                .claim(*run, core.run(), |n| RunRecord::starting(n, unix))
                .map_err(|e| match e {
                    store::ClaimError::Taken { next } => Refused::new(
                        409,
                        format!(
                            "run {} was already taken (the run records in {} hold it); the \
                             next free number is {next}",
                            run.unwrap_or(0),
                            store.path().display()
                        ),
                    ),
                    store::ClaimError::Io(e) => Refused::new(
                        503,
                        format!("the run's record cannot be kept (run.records_dir): {e}"),
                    ),
                })?;
            *run = Some(n);
        }
        let (reply, effects) = core.command(req, unix_now())?;
        drop(core);
        for effect in effects {
            match effect {
                Effect::ResetControl => node.control.reset(),
                Effect::Pause(p) => node.control.set_paused(p),
                Effect::Stop => node.control.stop(),
                Effect::Abort(why) => node.control.abort(why),
                Effect::StartRun { run, cfg } => node
                    .cmds
                    .send(Cmd::Start { run, cfg })
                    .map_err(|_| Refused::new(503, "the node is shutting down"))?,
                Effect::Halt { mut nodes } => {
                    nodes.extend(self.standby_spec(&node));
                    let token = node.token();
                    let node = node.clone();
                    std::thread::spawn(move || {
                        for n in &nodes {
                            let api = Api::new(&n.control, token.clone())
                                .with_timeout(Duration::from_secs(2));
                            if let Err(e) = api.post("/api/v1/node/halt", &json!({})) {
                                warn!("halt: {} did not answer: {e}", n.id);
                            }
                        }
                        let _ = node.cmds.send(Cmd::Halt);
                    });
                }
            }
        }
        Ok(reply)
    }

    /// One run at the EVM: every other node told to start it, then the EVM's own part.
    pub(crate) fn run(
        &self,
        node: &Node,
        run: u64,
        cfg: &Config,
        evm: impl FnOnce(&Node, &Config) -> Result<NodeOutcome, NodeError>,
    ) -> Result<NodeOutcome, NodeError> {
        let plan = self.core().begin_run(run, cfg);
        let token = node.token();
        let answers: Vec<(String, Result<(), String>)> = std::thread::scope(|s| {
            let handles: Vec<_> = plan
                .nodes
                .iter()
                .map(|n| {
                    let (body, token) = (&plan.body, token.clone());
                    s.spawn(move || (n.id.clone(), start_one(n, body, token)))
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        let decision = self.core().started(run, &plan, &answers);
        // the standby follows the run; without it the run goes on, as one without a standby
        // would (a loss of this EVM then ends it)
        if let (Ok(()), Some(standby)) = (&decision, self.standby_spec(node)) {
            match start_one(&standby, &plan.body, token.clone()) {
                Ok(()) => self.core().standby_follows(run),
                Err(e) => warn!("run {run}: the standby EVM did not take the run: {e}"),
            }
        }
        let r = match decision {
            Ok(()) => {
                let r = evm(node, cfg);
                // ready means every node is ready: wait for the others to finish their part
                // (they send their last bytes and close after the EVM halts them), the
                // spares that joined during the run too
                let mut nodes = plan.nodes.clone();
                let joined = self.core().spares_up();
                nodes.extend(joined.into_iter().filter(|n| !plan.nodes.contains(n)));
                await_idle(&nodes, &token, Duration::from_secs(10));
                r
            }
            Err(off) => {
                for (n, why) in &off.abort {
                    let _ = Api::new(&n.control, token.clone())
                        .with_timeout(Duration::from_secs(2))
                        .post("/api/v1/node/abort", &json!({ "reason": why }));
                }
                Err(NodeError::Setup(off.error))
            }
        };
        self.finished(run, &r);
        r
    }

    /// A run is over: its record, and the state it leaves.
    pub(crate) fn finished(&self, run: u64, r: &Result<NodeOutcome, NodeError>) {
        let f = match r {
            Ok(o) => Finished {
                ok: o.ok,
                reason: o.reason.clone(),
                report: Some(o.report.clone()),
                fenced: o.fenced,
            },
            Err(e) => Finished {
                ok: false,
                reason: e.to_string(),
                report: None,
                fenced: None,
            },
        };
        self.core().finished(run, f, unix_now());
    }

    /// A promoted standby's record of a run it followed and did not take over (see
    /// `Core::verdict_unknown`).
    pub(crate) fn verdict_unknown(&self, run: u64) {
        // the run's own EVM may have closed its record before it was lost: that verdict
        // is known, and stands (a later control never replaces it with `unknown`)
        let known = self
            .0
            .store
            .get()
            .and_then(|s| s.get(run))
            .filter(store::known);
        match known {
            Some(rec) => {
                tracing::info!(
                    "run {run}: its record holds the verdict of the EVM that ran it ({})",
                    rec.state
                );
                self.core().load_records(vec![rec]);
            }
            None => self.core().verdict_unknown(run, unix_now()),
        }
    }

    pub(crate) fn run_record(&self, n: u64) -> Option<RunRecord> {
        self.core().run_record(n).cloned()
    }

    /// Every run, without the full reports.
    pub(crate) fn runs(&self) -> Vec<RunRecord> {
        self.core().runs()
    }

    /// The whole system's status (`GET /api/v1/status`).
    pub(crate) fn status(&self, evm: &Node) -> crate::replies::Status {
        let snap = evm.control.snapshot();
        self.core().status(snap.as_ref(), unix_now())
    }

    /// The rate history of the run under way or the last (`GET /api/v1/history`).
    pub(crate) fn history(&self, since: Option<f64>) -> crate::replies::History {
        self.core().history(since)
    }

    /// The RU→BU matrix (`GET /api/v1/links`).
    pub(crate) fn links(&self) -> crate::replies::Links {
        self.core().links()
    }

    /// Every node's metrics address for Prometheus's HTTP service discovery.
    pub(crate) fn scrape_targets(&self, evm: &Node) -> Vec<ScrapeTarget> {
        let snap = evm.control.snapshot();
        self.core()
            .scrape_targets(snap.as_ref(), &evm.control.api())
    }

    /// Refreshes the node table once a second, every node in parallel, until the EVM's node
    /// is gone or halted.
    fn poll_nodes(&self) {
        // one client per node for the controller's life: its connection stays open
        let mut apis: std::collections::HashMap<String, Api> = std::collections::HashMap::new();
        loop {
            let Some(node) = self.node() else { return };
            let (others, evm_id) = {
                let c = self.core();
                if c.state() == State::Halted {
                    return;
                }
                (c.others(), c.cfg().evm.id.clone())
            };
            let token = node.token();
            let evm = node.status();
            drop(node);
            let t0 = Instant::now();
            for n in &others {
                apis.entry(n.id.clone()).or_insert_with(|| {
                    Api::new(&n.control, token.clone()).with_timeout(POLL_TIMEOUT)
                });
            }
            let apis = &apis;
            let answers: Vec<(String, Result<NodeReply, CallError>)> = std::thread::scope(|s| {
                let handles: Vec<_> = others
                    .iter()
                    .map(|n| s.spawn(move || (n.id.clone(), ask(n, &apis[&n.id]))))
                    .collect();
                handles.into_iter().filter_map(|h| h.join().ok()).collect()
            });
            let all = std::iter::once((evm_id, Ok(evm))).chain(answers).collect();
            let (rejoins, period) = {
                let mut c = self.core();
                let rejoins = c.answers(Instant::now(), all);
                c.sample(unix_now());
                (rejoins, c.poll_period())
            };
            for r in rejoins {
                rejoin(r, token.clone());
            }
            self.tell_standby(&token);
            std::thread::sleep(period.saturating_sub(t0.elapsed()));
        }
    }
}

impl Controller {
    /// A standby EVM that is idle while a run is under way (`evb up` started it where the
    /// EVM lost to a takeover was) is told to follow that run.
    fn tell_standby(&self, token: &Option<String>) {
        let Some(control) = self.standby_api() else {
            return;
        };
        let Some(standby) = self.node().and_then(|n| self.standby_spec(&n)) else {
            return;
        };
        let Some((run, body)) = self.core().standby_to_tell() else {
            return;
        };
        let api = Api::new(&control, token.clone()).with_timeout(POLL_TIMEOUT);
        let idle = api
            .get("/api/v1/node")
            .ok()
            .and_then(|r| r.typed::<NodeReply>("node").ok())
            .is_some_and(|n| n.phase == Phase::Idle && n.run != run);
        if !idle {
            return;
        }
        match start_one(&standby, &body, token.clone()) {
            Ok(()) => {
                info!("run {run}: the standby EVM follows it from now on");
                self.core().standby_follows(run);
            }
            Err(e) => warn!("run {run}: the standby EVM did not take the run: {e}"),
        }
    }
}

/// Tells node `n` to start a run; a node that `evb up` started again may take a moment to
/// listen, so a refused connection is tried again for a few seconds.
fn start_one(
    n: &NodeSpec,
    body: &crate::replies::NodeStart,
    token: Option<String>,
) -> Result<(), String> {
    let api = Api::new(&n.control, token).with_timeout(Duration::from_secs(5));
    let until = Instant::now() + Duration::from_secs(3);
    let body = serde_json::to_value(body).map_err(|e| e.to_string())?;
    loop {
        match api.post("/api/v1/node/start", &body) {
            Ok(r) if r.ok() => return Ok(()),
            Ok(r) => return Err(r.error()),
            Err(e) if e.is_refused() && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => return Err(e.detail),
        }
    }
}

/// Asks node `n` how it is.
fn ask(n: &NodeSpec, api: &Api) -> Result<NodeReply, CallError> {
    let unknown = |detail: &str| CallError {
        base: api.base.clone(),
        kind: crate::client::CallErrorKind::Other,
        detail: detail.to_string(),
    };
    if n.control.ends_with(":0") {
        return Err(unknown("its control port is not known (port 0)"));
    }
    let r = api.get("/api/v1/node")?;
    if !r.ok() {
        return Err(unknown(&r.error()));
    }
    serde_json::from_value(r.body)
        .map_err(|e| unknown(&format!("its status could not be read: {e}")))
}

/// Tells a BU started again during a run to rejoin it.
fn rejoin(r: Rejoin, token: Option<String>) {
    std::thread::spawn(move || {
        let Rejoin { node: n, run, body } = r;
        let api = Api::new(&n.control, token).with_timeout(Duration::from_secs(5));
        let body = serde_json::to_value(&body).unwrap_or_default();
        match api.post("/api/v1/node/start", &body) {
            Ok(r) if r.ok() => info!("{} started again: it rejoins run {run}", n.id),
            Ok(r) => warn!("{} could not rejoin run {run}: {}", n.id, r.error()),
            Err(e) => warn!("{} could not rejoin run {run}: {e}", n.id),
        }
    });
}

/// Waits until no node of `nodes` says it is in a run (the unreachable ones do not count),
/// or `limit` has passed.
fn await_idle(nodes: &[NodeSpec], token: &Option<String>, limit: Duration) {
    let until = Instant::now() + limit;
    for n in nodes {
        let api = Api::new(&n.control, token.clone()).with_timeout(POLL_TIMEOUT);
        while Instant::now() < until {
            match api.get("/api/v1/node") {
                Ok(r) if r.ok() && r.body["phase"] == json!(Phase::Running) => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod shell_tests {
    use super::*;

    /// The shell's half of "one verdict": when `on_status` returns for the EVM's report (and
    /// the node's status closure prints the line only then), the run's closed record is on
    /// disk, where a standby promoted after the EVM's loss finds it.
    #[test]
    fn the_run_s_record_is_on_disk_when_the_evm_s_report_is_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::default();
        cfg.run.records_dir = dir.path().display().to_string();
        let c = Controller::new(&cfg, Mode::Once);
        c.keep_records(false, None).unwrap();
        c.begin_once(1);
        let store = store::RecordStore::open(&cfg).unwrap();
        let mut line = super::tests::evm_report_line(7, 7);
        line.kind = evb_builder::StatusKind::Report;
        line.run_number = Some(1);
        line.ok = Some(true);
        line.reason = Some("every triggered event built exactly once".into());
        c.on_status(&line);
        let rec = store.get(1).expect("run 1's record on disk");
        assert_eq!(rec.state, "complete");
        assert_eq!(rec.end.as_ref().map(|e| e.events_built), Some(7));
    }
}

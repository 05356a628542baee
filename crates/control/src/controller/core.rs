//! The run controller's decisions, with no IO and no clock: operator commands, node answers
//! and the run's outcome go in (with the time they happened); replies, effects on the EVM's
//! own node, and calls to make on other nodes come out. The shell ([`super::Controller`])
//! makes the HTTP calls and applies the effects; tests drive this with scripted answers.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use evb_builder::{NodeRef, NodeStatus, StatusRole};
use evb_config::{Config, NodeSpec, Role};
use tracing::info;

use super::adopt::{adopt, changed_sections, restart_keys};
use super::history::History;
use super::records::{Finished, RunRecord};
use crate::client::CallError;
use crate::fsm::{self, Command, State};
use crate::service::{numbered_run_id, status_role, Mode, NodeReply, Phase};

/// The largest run number: 2^53 - 1, exact in every JSON reader (the page's included), and
/// far from wrapping when the next run is numbered one more.
pub const MAX_RUN: u64 = (1 << 53) - 1;

/// A refused or failed command: the HTTP status and why.
pub use crate::replies::Refused;
use crate::replies::{
    CommandReply, ConfigSummary, EvmSummary, Latency, NodeRow, NodeStart, Request, Status, Totals,
};

/// Records of this many runs are kept (the oldest go first).
const KEEP_RUNS: usize = 1000;

/// How often the node table is refreshed, and again sooner while a node does not answer.
pub(super) const POLL_EVERY: Duration = Duration::from_secs(1);

/// What the shell does for a command, in order, on the EVM's own node or the others.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Effect {
    /// Clears the EVM node's run commands: the next run starts unstopped and unpaused.
    ResetControl,
    Pause(bool),
    Stop,
    Abort(String),
    /// The EVM node's main loop runs run `run` with `cfg`.
    StartRun {
        run: u64,
        cfg: Box<Config>,
    },
    /// Every other node is told to halt, then the EVM's own process.
    Halt {
        nodes: Vec<NodeSpec>,
    },
}

/// A node told to start the run under way, after `evb up` started it again.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rejoin {
    pub node: NodeSpec,
    pub run: u64,
    pub body: NodeStart,
}

/// The start of a run at the other nodes: who is told, and with what.
#[derive(Debug, Clone)]
pub(crate) struct StartPlan {
    pub nodes: Vec<NodeSpec>,
    pub body: NodeStart,
}

/// A start that some nodes refused: the ones that did start are told to abort.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CallOff {
    pub abort: Vec<(NodeSpec, String)>,
    pub error: String,
}

/// One target group of Prometheus's HTTP service discovery (`http_sd_configs`): a node's
/// `/metrics` address and its labels.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScrapeTarget {
    pub targets: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

/// What the controller knows of one node.
#[derive(Debug, Clone, Default)]
struct NodeView {
    reply: Option<NodeReply>,
    error: Option<CallError>,
    /// The previous answer's counts, for rates.
    last: Option<Sample>,
    rate_hz: f64,
    bytes_per_s: f64,
    /// Polls in a row that failed: one slow answer on a loaded host is not a lost node.
    failures: u32,
    /// An RU's payload bytes sent to each BU at the previous answer, and the rates since.
    links_last: Vec<u64>,
    link_rates: Vec<f64>,
}

impl NodeView {
    fn snapshot(&self) -> Option<&NodeStatus> {
        self.reply.as_ref().and_then(|r| r.snapshot.as_ref())
    }
}

/// One answer's counts and when they were counted.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// When the answer came (a node without a snapshot's clock is timed by it).
    at: Instant,
    /// The snapshot's own clock: (process, run, seconds since its node was made).
    clock: Option<(u32, u64, f64)>,
    events: u64,
    bytes: u64,
}

impl Sample {
    /// Seconds between two samples' counts: by the node's own clock where both are of one
    /// process and run (a poll round that waited for a silent node, or an EVM snapshot taken
    /// before the round, would otherwise time counts by the round's end and show a burst
    /// that never was), by the answers' arrival otherwise. `None`: the same snapshot again.
    fn seconds_since(&self, before: &Sample) -> Option<f64> {
        match (before.clock, self.clock) {
            (Some((p0, r0, t0)), Some((p, r, t))) if p0 == p && r0 == r => {
                (t > t0).then_some(t - t0)
            }
            _ => Some(
                self.at
                    .saturating_duration_since(before.at)
                    .as_secs_f64()
                    .max(1e-3),
            ),
        }
    }
}

/// The events and bytes a node's snapshot counts, by role.
fn progress(snap: Option<&NodeStatus>) -> (u64, u64) {
    snap.map_or((0, 0), |s| s.stats.progress())
}

/// An RU's payload bytes sent to each BU, by the BU's index (empty for other roles).
fn to_bus(snap: Option<&NodeStatus>) -> Vec<u64> {
    snap.and_then(|s| s.stats.ru())
        .map(|r| r.payload_bytes_to_bu.clone())
        .unwrap_or_default()
}

/// Every error counter a snapshot holds, added up.
fn errors(snap: Option<&NodeStatus>) -> u64 {
    snap.map_or(0, |s| {
        s.stats.errors().iter().map(|(_, n)| n).sum::<u64>() + s.net.protocol_errors
    })
}

/// A run built by time, in words for the node's row: an RU's latency buffer (what it holds
/// now, what it evicted), a BU's degraded windows; `None` in a run by event.
fn by_time(snap: Option<&NodeStatus>) -> Option<String> {
    let snap = snap?;
    if let Some(r) = snap.stats.ru() {
        if r.frame_buffer_bytes_high_water == 0 && r.frame_bytes_in == 0 {
            return None;
        }
        let mut s = format!(
            "latency buffer {:.1} kB ({} frames, {} ticks; at most {:.1} kB)",
            r.frame_buffer_bytes as f64 / 1e3,
            r.frame_buffer_frames,
            r.frame_buffer_ticks,
            r.frame_buffer_bytes_high_water as f64 / 1e3
        );
        if let Some(words) = r.frame_account_words() {
            s += &format!(", {words}");
        }
        return Some(s);
    }
    let b = snap.stats.bu()?;
    (b.late_components + b.missing_components + b.empty_components + b.window_errors > 0).then(
        || {
            format!(
                "windows: {} components LATE, {} MISSING, {} EMPTY, {} window errors",
                b.late_components, b.missing_components, b.empty_components, b.window_errors
            )
        },
    )
}

/// A histogram as the status gives it (`bus`: how many BUs' histograms are in it).
fn latency_of(h: &evb_builder::LatencyHistogram, bus: u64) -> Latency {
    Latency {
        bounds_us: evb_builder::LATENCY_BOUNDS_US.to_vec(),
        p50_us: h.quantile_us(0.5),
        p99_us: h.quantile_us(0.99),
        counts: h.counts.clone(),
        count: h.count,
        sum_us: h.sum_us,
        bus,
    }
}

pub(crate) struct Core {
    mode: Mode,
    state: State,
    /// Why the last run failed (state failed).
    reason: Option<String>,
    /// A reset is aborting the run: it ends in ready, not failed.
    resetting: bool,
    /// The current or last run number (0: none yet).
    run: u64,
    /// The configuration of the next run.
    cfg: Config,
    runs: BTreeMap<u64, RunRecord>,
    nodes: BTreeMap<String, NodeView>,
    /// The run under way: its number and what each node was told to start it with, so
    /// that a BU which `evb up` started again after it died rejoins it.
    under_way: Option<(u64, NodeStart)>,
    /// Nodes whose process changed (another pid) while the run was under way, not yet
    /// told to rejoin it.
    restarted: Vec<String>,
    /// The run the standby EVM was told to follow last (see [`Core::standby_to_tell`]).
    standby_told: Option<u64>,
    /// The rates of the run under way (or the last one), one sample per poll.
    history: History,
    /// Runs whose record changed since the shell last wrote them to disk.
    changed: Vec<u64>,
    /// The record the EVM's report closed and the shell wrote, before the report went out
    /// (see [`Core::reported`]); its `finished` keeps it.
    closed_at_report: Option<RunRecord>,
    /// The most events the EVM's ledger has said it released in the run under way (run,
    /// count): the header's total never goes back, and never comes from the BUs' counters.
    released_seen: (u64, u64),
    /// Spare BUs asked to start (`POST /api/v1/add-bu`) whose process does not answer yet:
    /// the launcher (`evb up`) starts each it finds here.
    adding: BTreeSet<String>,
    /// Spare BUs told to join the run under way: (id, run, pid), each told once (older
    /// runs' entries are dropped).
    told_to_join: BTreeSet<(String, u64, u32)>,
}

impl Core {
    pub(crate) fn new(cfg: &Config, mode: Mode) -> Core {
        Core {
            mode,
            state: State::Ready,
            reason: None,
            resetting: false,
            run: 0,
            cfg: cfg.clone(),
            runs: BTreeMap::new(),
            nodes: BTreeMap::new(),
            under_way: None,
            restarted: Vec::new(),
            standby_told: None,
            history: History::default(),
            changed: Vec::new(),
            closed_at_report: None,
            released_seen: (0, 0),
            adding: BTreeSet::new(),
            told_to_join: BTreeSet::new(),
        }
    }

    /// The records a control finds on disk when it starts: kept (the newest [`KEEP_RUNS`]),
    /// and the numbering goes on after them.
    pub(crate) fn load_records(&mut self, records: Vec<RunRecord>) {
        for r in records {
            self.run = self.run.max(r.run);
            self.runs.insert(r.run, r);
        }
        while self.runs.len() > KEEP_RUNS {
            self.runs.pop_first();
        }
    }

    /// The records changed since the last call (each once), for the shell to write.
    pub(crate) fn take_changed(&mut self) -> Vec<RunRecord> {
        let mut runs = std::mem::take(&mut self.changed);
        runs.sort_unstable();
        runs.dedup();
        runs.iter()
            .filter_map(|n| self.runs.get(n).cloned())
            .collect()
    }

    pub(crate) fn state(&self) -> State {
        self.state
    }

    pub(crate) fn cfg(&self) -> &Config {
        &self.cfg
    }

    /// The current or last run number (0: none yet).
    pub(crate) fn run(&self) -> u64 {
        self.run
    }

    /// Node `id`'s process answered the last poll.
    fn answers_now(&self, id: &str) -> bool {
        self.nodes
            .get(id)
            .is_some_and(|v| v.error.is_none() && v.reply.is_some())
    }

    /// The spare BUs whose process answers now (a spare that joined a run takes part in
    /// the next from its start).
    pub(crate) fn spares_up(&self) -> Vec<NodeSpec> {
        self.cfg
            .nodes()
            .into_iter()
            .filter(|n| n.spare && self.answers_now(&n.id))
            .collect()
    }

    /// A spare BU is asked to start (`POST /api/v1/add-bu`): the launcher starts it, and
    /// it joins the run under way, if any, once its process answers.
    ///
    /// # Errors
    /// Not a spare of this system, or its process answers already.
    pub(crate) fn add_bu(&mut self, bu: &str) -> Result<NodeSpec, Refused> {
        let nodes = self.cfg.nodes();
        let spares: Vec<&NodeSpec> = nodes.iter().filter(|n| n.spare).collect();
        let Some(n) = nodes.iter().find(|n| n.id == bu && n.role == Role::Bu) else {
            return Err(Refused::new(
                404,
                format!(
                    "no BU {bu:?} in this system; its spare BUs: {}",
                    if spares.is_empty() {
                        "none (topology.spare_bus, [[bu]] spare = true)".to_string()
                    } else {
                        spares
                            .iter()
                            .map(|n| n.id.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ),
            ));
        };
        if !n.spare {
            return Err(Refused::new(
                409,
                format!("{bu} is not a spare: it is in every run from its start"),
            ));
        }
        if self.answers_now(bu) {
            return Err(Refused::new(409, format!("{bu} is up already")));
        }
        self.adding.insert(bu.to_string());
        Ok(n.clone())
    }

    /// The nodes the controller asks for their status (every node but the EVM).
    pub(crate) fn others(&self) -> Vec<NodeSpec> {
        self.cfg
            .nodes()
            .into_iter()
            .filter(|n| n.role != Role::Evm)
            .collect()
    }

    fn record(&mut self, run: u64, unix: f64) {
        self.runs.insert(run, RunRecord::starting(run, unix));
        self.changed.push(run);
        while self.runs.len() > KEEP_RUNS {
            self.runs.pop_first();
        }
    }

    /// Run `run`'s configuration: its id numbered, and its files in a folder of its own
    /// (`Config::run_folder`).
    fn run_config(&self, run: u64) -> Config {
        let mut cfg = self.cfg.clone();
        cfg.run.id = numbered_run_id(&self.cfg.run.id, run);
        if let Some(dir) = self.cfg.run_folder(&self.cfg.run.id, run) {
            cfg.sink.dir = dir;
        }
        cfg
    }

    /// The next run is numbered after `run` at the least.
    pub(crate) fn number_from(&mut self, run: u64) {
        self.run = self.run.max(run);
    }

    /// `evb run`'s one run: started at once, without a command.
    pub(crate) fn begin_once(&mut self, run: u64, unix: f64) {
        self.state = State::Starting;
        self.run = run;
        self.record(run, unix);
        self.history.begin(run, unix);
    }

    /// A standby that took run `run` over mid-run becomes its control at once: the run is
    /// under way here, running or paused as the operator left it (its record starts now:
    /// the start is the lost EVM's).
    pub(crate) fn adopt_running(&mut self, run: u64, paused: bool, unix: f64) {
        self.begin_once(run, unix);
        // what a standby of this control is told to follow the run with: its configuration
        // as this control runs it (the promoted one), numbered
        let mut sent = self.run_config(run);
        sent.run.secret.clear();
        self.under_way = Some((
            run,
            NodeStart {
                run,
                config: sent.to_toml(),
            },
        ));
        self.state = if paused {
            State::Paused
        } else {
            State::Running
        };
        let state = self.state.name().to_string();
        if let Some(r) = self.runs.get_mut(&run) {
            r.state = state;
        }
        self.changed.push(run);
    }

    /// A status line of the EVM's run: its progress moves the run state on.
    pub(crate) fn on_status(&mut self, line: &NodeStatus) {
        use evb_builder::RunState;
        if let (Some(run), Some(e)) = (line.run_number, line.evm()) {
            let seen = if self.released_seen.0 == run {
                self.released_seen.1
            } else {
                0
            };
            self.released_seen = (run, seen.max(e.released));
        }
        match (self.state, line.state) {
            (State::Starting, RunState::Running) => self.state = State::Running,
            (State::Running, RunState::Stopping) => self.state = State::Stopping,
            _ => {}
        }
        let (run, state) = (self.run, self.state);
        if let Some(r) = self.runs.get_mut(&run) {
            if r.end.is_none() && r.state != state.name() {
                r.state = state.name().to_string();
                self.changed.push(run);
            }
        }
    }

    /// Whether command `cmd` may be given now (the state, and this EVM's mode), before what
    /// it carries is read: a command the state refuses is refused as such, whatever its body.
    pub(crate) fn allowed(&self, cmd: Command) -> Result<State, Refused> {
        let from = self.state;
        if self.mode == Mode::Once
            && matches!(cmd, Command::Configure | Command::Start | Command::Halt)
        {
            return Err(Refused::new(409,
                format!(
                    "`{}`: this EVM runs one run and exits (evb run); start the nodes with `evb up` (or `evb node --serve`) for run control",
                    cmd.name()
                ),
            ));
        }
        fsm::next(from, cmd).ok_or_else(|| Refused::new(409, fsm::refusal(from, cmd)))
    }

    /// An operator's command: the reply, and what the shell must do for it.
    pub(crate) fn command(
        &mut self,
        req: Request,
        unix: f64,
    ) -> Result<(CommandReply, Vec<Effect>), Refused> {
        let from = self.state;
        let to = self.allowed(req.command())?;
        let mut changed = None;
        let mut effects = Vec::new();
        match req {
            Request::Configure { config } => {
                changed = Some(self.configure(&config)?);
            }
            Request::Start { run } => {
                let run = self.next_run(run)?;
                let cfg = self.run_config(run);
                effects.push(Effect::ResetControl);
                self.run = run;
                self.reason = None;
                self.record(run, unix);
                self.history.begin(run, unix);
                effects.push(Effect::StartRun {
                    run,
                    cfg: Box::new(cfg),
                });
            }
            Request::Pause => effects.push(Effect::Pause(true)),
            Request::Resume => effects.push(Effect::Pause(false)),
            Request::Stop => {
                // before the nodes are ready there is nothing to drain: the start is
                // called off, and the system is ready again
                if from == State::Starting {
                    self.resetting = true;
                }
                effects.push(Effect::Stop);
            }
            Request::Reset if from == State::Failed => self.reason = None,
            Request::Reset => {
                self.resetting = true;
                effects.push(Effect::Abort(crate::fsm::RESET_REASON.into()));
                effects.push(Effect::Pause(false));
            }
            Request::Halt => effects.push(Effect::Halt {
                nodes: self.others(),
            }),
        }
        self.state = to;
        let reply = CommandReply {
            state: to,
            run: self.run,
            changed,
        };
        Ok((reply, effects))
    }

    /// `configure`: the new configuration, adopted if the running nodes can take it; the
    /// sections it changes.
    fn configure(&mut self, text: &str) -> Result<Vec<String>, Refused> {
        // the file may leave the secret out: the running one is kept
        let mut new =
            Config::parse_unvalidated(text).map_err(|e| Refused::new(400, e.to_string()))?;
        if new.run.secret.is_empty() {
            new.run.secret = self.cfg.run.secret.clone();
        }
        let new = adopt(&self.cfg, new);
        let mut keys = restart_keys(&self.cfg, &new);
        if new.nodes().len() != self.cfg.nodes().len() {
            keys.push("topology (the number of nodes)".into());
            keys.dedup();
        }
        if !keys.is_empty() {
            return Err(Refused::new(
                409,
                format!(
                    "configure cannot change {}: these need the nodes restarted (evb up again)",
                    keys.join(", ")
                ),
            ));
        }
        let mut changed = changed_sections(&self.cfg, &new);
        // node lists as written differ from those resolved: name them only when a node's
        // effective settings (credits, sink, files) change
        changed.retain(|k| k != "ru" && k != "bu");
        if self.cfg.nodes() != new.nodes() {
            changed.push("nodes (credits, sinks or files)".into());
        }
        info!(
            "configured: {}",
            if changed.is_empty() {
                "no change".to_string()
            } else {
                changed.join(", ")
            }
        );
        new.validate()
            .map_err(|e| Refused::new(400, e.to_string()))?;
        self.cfg = new;
        Ok(changed)
    }

    /// The number a `start` asks for (or the next one), if it is free.
    pub(crate) fn next_run(&self, asked: Option<u64>) -> Result<u64, Refused> {
        let run = match asked {
            None => self.run + 1,
            Some(n) if (1..=MAX_RUN).contains(&n) => n,
            Some(_) => {
                return Err(Refused::new(
                    400,
                    format!("`run` must be an integer from 1 to {MAX_RUN}"),
                ))
            }
        };
        if run > MAX_RUN {
            return Err(Refused::new(409,
                format!(
                    "run {} was the last number there is: reset the numbering by restarting the EVM",
                    self.run
                ),
            ));
        }
        if self.runs.contains_key(&run) {
            return Err(Refused::new(
                409,
                format!(
                    "run {run} was already taken; the next free number is {}",
                    self.runs.keys().last().map_or(1, |n| n + 1)
                ),
            ));
        }
        Ok(run)
    }

    /// The run under way and its start body, when the standby EVM has not been told to
    /// follow it: a standby that `evb up` started after a takeover (where the lost EVM
    /// was) joins the run mid-way, so that a second loss is taken over too.
    pub(crate) fn standby_to_tell(&self) -> Option<(u64, NodeStart)> {
        if !matches!(self.state, State::Running | State::Paused) {
            return None;
        }
        self.under_way
            .clone()
            .filter(|(run, _)| self.standby_told != Some(*run))
    }

    /// The standby EVM follows run `run`.
    pub(crate) fn standby_follows(&mut self, run: u64) {
        self.standby_told = Some(run);
    }

    /// Run `run` begins at the EVM: every other node is to be told to start it with `cfg`
    /// (without the secret: each node uses its own).
    pub(crate) fn begin_run(&mut self, run: u64, cfg: &Config) -> StartPlan {
        let mut sent = cfg.clone();
        sent.run.secret.clear();
        let body = NodeStart {
            run,
            config: sent.to_toml(),
        };
        self.under_way = Some((run, body.clone()));
        self.restarted.clear();
        StartPlan {
            nodes: cfg
                .nodes()
                .into_iter()
                .filter(|n| n.role != Role::Evm && (!n.spare || self.answers_now(&n.id)))
                .collect(),
            body,
        }
    }

    /// Every node's answer to the start of run `run` (the error with the API it called):
    /// the run goes on only if all started. Answers for another run change nothing.
    pub(crate) fn started(
        &self,
        run: u64,
        plan: &StartPlan,
        answers: &[(String, Result<(), String>)],
    ) -> Result<(), CallOff> {
        if self.under_way.as_ref().map(|(r, _)| *r) != Some(run) {
            return Err(CallOff {
                abort: Vec::new(),
                error: format!("run {run} is no longer the run under way"),
            });
        }
        let failed: Vec<String> = plan
            .nodes
            .iter()
            .filter_map(|n| {
                let answer = answers.iter().find(|(id, _)| *id == n.id);
                match answer {
                    Some((_, Ok(()))) => None,
                    Some((_, Err(e))) => Some(format!("{} ({}): {e}", n.id, n.control)),
                    None => Some(format!("{} ({}): no answer", n.id, n.control)),
                }
            })
            .collect();
        if failed.is_empty() {
            return Ok(());
        }
        let error = format!("run {run} could not start: {}", failed.join("; "));
        // the nodes that did start would wait for the EVM until their connect timeout
        let abort = plan
            .nodes
            .iter()
            .filter(|n| answers.iter().any(|(id, r)| *id == n.id && r.is_ok()))
            .map(|n| (n.clone(), error.clone()))
            .collect();
        Err(CallOff { abort, error })
    }

    /// The EVM's report of run `run`, on its way out: the run's record closed with it, for
    /// the shell to put on disk before any reader (`evb up`'s line, a subscriber) sees the
    /// report, so that an EVM lost right after its report leaves that verdict in the run
    /// records (docs/standby.md, "Limits"). The record served here (`GET /api/v1/runs`,
    /// `evb ctl wait`) closes at [`Core::finished`], once the nodes are idle and the control
    /// can take the next run, as before. `None` for a report of a run that is not this
    /// control's open one.
    pub(crate) fn reported(&mut self, run: u64, f: Finished, unix: f64) -> Option<RunRecord> {
        if self.closed_at_report.as_ref().is_some_and(|r| r.run == run) {
            return None;
        }
        let open = self
            .runs
            .get(&run)
            .filter(|r| r.end.is_none() && self.run == run)?;
        let mut rec = open.clone();
        self.close_into(&mut rec, f, self.resetting, unix);
        self.closed_at_report = Some(rec.clone());
        Some(rec)
    }

    /// Closes `rec` with `f`: its verdict, counts and the run folder's digests.
    fn close_into(
        &self,
        rec: &mut RunRecord,
        f: Finished,
        reset: bool,
        unix: f64,
    ) -> (bool, String) {
        let (ok, reason) = f.close(rec, reset, unix);
        if self.cfg.sink.kind.writes_files() {
            let dir = self
                .cfg
                .run_folder(&self.cfg.run.id, rec.run)
                .unwrap_or_else(|| self.cfg.sink.dir.clone());
            let (m, c) = super::records::folder_digests(&dir, &self.cfg.run.id);
            rec.manifest_sha256 = m;
            rec.config_sha256 = c;
        }
        (ok, reason)
    }

    /// A run is over: its record closed, and the state it leaves. A record its report
    /// closed (and the shell wrote) stands as it was written: not closed again, not written
    /// again, unless a reset since then makes it aborted.
    pub(crate) fn finished(&mut self, run: u64, f: Finished, unix: f64) {
        self.under_way = None;
        let reset = std::mem::take(&mut self.resetting);
        let early = self.closed_at_report.take().filter(|r| r.run == run);
        let (ok, reason) = match early {
            Some(mut rec) => {
                let end = rec.end.as_ref().map(|e| (e.ok, e.reason.clone()));
                if reset && rec.state == "failed" {
                    rec.state = "aborted".into();
                    self.changed.push(run);
                }
                self.runs.insert(run, rec);
                end.unwrap_or_default()
            }
            None => {
                let mut rec = self
                    .runs
                    .remove(&run)
                    .unwrap_or_else(|| RunRecord::starting(run, unix));
                let v = self.close_into(&mut rec, f, reset, unix);
                self.runs.insert(run, rec);
                self.changed.push(run);
                v
            }
        };
        let outcome = self.runs.get(&run).map_or("", |r| r.state.as_str());
        info!("run {run} {outcome}: {reason}");
        if ok || reset {
            self.state = State::Ready;
            self.reason = None;
        } else {
            self.state = State::Failed;
            self.reason = Some(format!("run {run}: {reason}"));
        }
    }

    /// A promoted standby's record of the run it followed and did not take over: over,
    /// with no verdict (`unknown`, not ok, no counts). The run ended at the EVM, whose
    /// control was lost after it (with or without the record: the standby cannot tell), and
    /// the standby's own outcome saw none of the run's events, so it must not stand for the
    /// run's. The control stays ready: the run was not this control's, and nothing of it
    /// waits here.
    pub(crate) fn verdict_unknown(&mut self, run: u64, unix: f64) {
        self.run = self.run.max(run);
        let rec = self
            .runs
            .entry(run)
            .or_insert_with(|| RunRecord::starting(run, unix));
        let f = Finished {
            ok: false,
            reason: format!(
                "run {run} ended at the EVM, which was lost after it; the standby followed \
                 the run without taking it over, so its verdict is not known here (the lost \
                 EVM's record, log and the output files hold what there is)"
            ),
            report: None,
            fenced: None,
        };
        let (_, reason) = f.close(rec, false, unix);
        rec.state = "unknown".into();
        self.changed.push(run);
        info!("run {run} unknown: {reason}");
    }

    pub(crate) fn run_record(&self, n: u64) -> Option<&RunRecord> {
        self.runs.get(&n)
    }

    /// Every run, without the full reports.
    pub(crate) fn runs(&self) -> Vec<RunRecord> {
        self.runs.values().map(RunRecord::summary).collect()
    }

    /// The node table takes one round of answers, the EVM's own first; a BU that `evb up`
    /// started again while the run is on is to be told to rejoin it.
    pub(crate) fn answers(
        &mut self,
        now: Instant,
        answers: Vec<(String, Result<NodeReply, CallError>)>,
    ) -> Vec<Rejoin> {
        let under_way = self.under_way.is_some();
        for (id, r) in answers {
            if r.is_ok() {
                // a spare asked for answers: started
                self.adding.remove(&id);
            }
            let v = self.nodes.entry(id.clone()).or_default();
            match r {
                Ok(reply) => {
                    if under_way && v.reply.as_ref().is_some_and(|old| old.pid != reply.pid) {
                        self.restarted.push(id);
                    }
                    let (events, bytes) = progress(reply.snapshot.as_ref());
                    let links = to_bus(reply.snapshot.as_ref());
                    let sample = Sample {
                        at: now,
                        clock: reply
                            .snapshot
                            .as_ref()
                            .map(|s| (reply.pid, s.run_number.unwrap_or(reply.run), s.t)),
                        events,
                        bytes,
                    };
                    match v.last.map(|l| (sample.seconds_since(&l), l)) {
                        // a new run starts the counters again
                        Some((Some(dt), l)) => {
                            v.rate_hz = events.saturating_sub(l.events) as f64 / dt;
                            v.bytes_per_s = bytes.saturating_sub(l.bytes) as f64 / dt;
                            v.link_rates = links
                                .iter()
                                .enumerate()
                                .map(|(j, b)| {
                                    let b0 = v.links_last.get(j).copied().unwrap_or(0);
                                    b.saturating_sub(b0) as f64 / dt
                                })
                                .collect();
                            v.links_last = links;
                            v.last = Some(sample);
                        }
                        // the snapshot counted before: the rates since the last one stand
                        Some((None, _)) => {}
                        None => {
                            v.links_last = links;
                            v.last = Some(sample);
                        }
                    }
                    if reply.phase != Phase::Running {
                        v.rate_hz = 0.0;
                        v.bytes_per_s = 0.0;
                        v.link_rates.clear();
                    }
                    v.reply = Some(reply);
                    v.error = None;
                    v.failures = 0;
                }
                Err(e) => {
                    v.error = Some(e);
                    v.failures += 1;
                    v.rate_hz = 0.0;
                    v.bytes_per_s = 0.0;
                    v.link_rates.clear();
                }
            }
        }
        self.rejoins()
    }

    /// The BUs started again during the run, idle now: told to start the run under way,
    /// they join it as under `evb run` (the RUs keep calling them, the EVM gives them events
    /// once they are Ready). So is a BU that the EVM lost and whose own run of it ended in
    /// failure while its process lived on (frozen, then woken: it left the run on finding
    /// itself cut off): it joins again as a new incarnation, as a restarted one does. RUs
    /// are not: losing one follows `on_ru_loss`.
    fn rejoins(&mut self) -> Vec<Rejoin> {
        if !matches!(self.state, State::Running | State::Paused) {
            return Vec::new();
        }
        let Some((run, body)) = self.under_way.clone() else {
            return Vec::new();
        };
        // the BUs the EVM counts as down (lost and not back), by index
        let evm_id = self
            .cfg
            .nodes()
            .into_iter()
            .find(|n| n.role == Role::Evm)
            .map(|n| n.id);
        let down: Vec<String> = evm_id
            .and_then(|id| self.nodes.get(&id))
            .and_then(|v| v.snapshot())
            .and_then(|s| s.stats.evm())
            .map(|e| e.down.clone())
            .unwrap_or_default();
        let idle: Vec<NodeSpec> = self
            .others()
            .into_iter()
            .filter(|n| n.role == Role::Bu)
            .filter(|n| {
                let woke = |r: &NodeReply| {
                    r.run == run
                        && r.last.as_ref().is_some_and(|l| l.run == run && !l.ok)
                        && down.contains(&format!("bu[{}]", n.index))
                };
                let restarted = self.restarted.contains(&n.id);
                // a spare started during the run (`evb ctl add-bu`), told once
                let joins = |r: &NodeReply| {
                    n.spare
                        && r.run != run
                        && !self.told_to_join.contains(&(n.id.clone(), run, r.pid))
                };
                self.nodes.get(&n.id).is_some_and(|v| {
                    v.error.is_none()
                        && v.reply.as_ref().is_some_and(|r| {
                            r.phase == Phase::Idle
                                && ((restarted && r.run != run) || woke(r) || joins(r))
                        })
                })
            })
            .collect();
        // only this run's entries are ever asked about: the set holds one run's spares
        self.told_to_join.retain(|(_, r, _)| *r == run);
        for n in idle.iter().filter(|n| n.spare) {
            if let Some(pid) = self
                .nodes
                .get(&n.id)
                .and_then(|v| v.reply.as_ref())
                .map(|r| r.pid)
            {
                self.told_to_join.insert((n.id.clone(), run, pid));
            }
        }
        self.restarted
            .retain(|id| !idle.iter().any(|n| n.id == *id));
        idle.into_iter()
            .map(|node| Rejoin {
                node,
                run,
                body: body.clone(),
            })
            .collect()
    }

    /// Whether a node's answer is of the run under way (or the last), in it.
    fn in_current_run(&self, v: &NodeView) -> bool {
        v.reply
            .as_ref()
            .is_some_and(|r| r.run == self.run && r.phase == Phase::Running)
    }

    /// The system's event rate and throughput in the current run: the EVM's rate of
    /// released events (every event built once, a lost BU's included: the number in the
    /// EVM's row) and the BUs' payload bytes (the EVM counts no bytes).
    fn totals(&self) -> (f64, f64) {
        let nodes = self.cfg.nodes();
        let current = |role: Role| {
            nodes
                .iter()
                .filter(move |n| n.role == role)
                .filter_map(|n| self.nodes.get(&n.id))
                .filter(|v| self.in_current_run(v))
        };
        // (a fold from 0: an empty f64 sum is -0, printed "-0 ev/s")
        let rate = current(Role::Evm).fold(0.0, |r, v| r + v.rate_hz);
        let bytes = current(Role::Bu).fold(0.0, |b, v| b + v.bytes_per_s);
        (rate, bytes)
    }

    /// The build latency of the current (or last) run: every BU's histogram added up.
    fn latency(&self) -> Latency {
        let mut sum = evb_builder::LatencyHistogram::default();
        let mut bus = 0;
        for n in self.cfg.nodes().iter().filter(|n| n.role == Role::Bu) {
            let Some(v) = self.nodes.get(&n.id) else {
                continue;
            };
            if v.reply.as_ref().is_none_or(|r| r.run != self.run) {
                continue;
            }
            if let Some(b) = v.snapshot().and_then(|s| s.stats.bu()) {
                sum.merge(&b.latency);
                bus += 1;
            }
        }
        latency_of(&sum, bus)
    }

    /// The RU→BU matrix (`GET /api/v1/links`): for each RU of the current (or last) run
    /// and each BU, the payload bytes sent, their rate, and the bytes queued to send.
    pub(crate) fn links(&self) -> crate::replies::Links {
        let nodes = self.cfg.nodes();
        let rus: Vec<&NodeSpec> = nodes.iter().filter(|n| n.role == Role::Ru).collect();
        let bus: Vec<&NodeSpec> = nodes.iter().filter(|n| n.role == Role::Bu).collect();
        let (mut bytes, mut rates, mut queued) = (Vec::new(), Vec::new(), Vec::new());
        for ru in &rus {
            let v = self
                .nodes
                .get(&ru.id)
                .filter(|v| v.reply.as_ref().is_some_and(|r| r.run == self.run));
            let snap = v.and_then(|v| v.snapshot());
            let sent = to_bus(snap);
            let cell = |j: u16, of: &[u64]| of.get(usize::from(j)).copied().unwrap_or(0);
            bytes.push(bus.iter().map(|b| cell(b.index, &sent)).collect::<Vec<_>>());
            rates.push(
                bus.iter()
                    .map(|b| {
                        let r = v.and_then(|v| v.link_rates.get(usize::from(b.index)).copied());
                        (r.unwrap_or(0.0) * 10.0).round() / 10.0
                    })
                    .collect::<Vec<_>>(),
            );
            queued.push(
                bus.iter()
                    .map(|b| {
                        let peer = NodeRef::Bu(b.index).to_string();
                        snap.and_then(|s| s.peers.iter().find(|p| p.peer == peer))
                            .map_or(0, |p| p.queued_bytes)
                    })
                    .collect::<Vec<_>>(),
            );
        }
        crate::replies::Links {
            run: self.run,
            rus: rus.iter().map(|n| n.id.clone()).collect(),
            bus: bus.iter().map(|n| n.id.clone()).collect(),
            bytes,
            bytes_per_s: rates,
            queued_bytes: queued,
        }
    }

    /// After a round of answers: the rates at `unix` join the history, while a run is under
    /// way (between runs the last run's history stays as it ended).
    pub(crate) fn sample(&mut self, unix: f64) {
        let under_way = self.runs.get(&self.run).is_some_and(|r| r.end.is_none());
        if !under_way || self.history.run() != self.run {
            return;
        }
        let nodes = self
            .cfg
            .nodes()
            .into_iter()
            .map(|n| {
                let v = self.nodes.get(&n.id);
                let (e, b) = v.map_or((0.0, 0.0), |v| (v.rate_hz, v.bytes_per_s));
                (n.id, e, b)
            })
            .collect();
        let total = self.totals();
        self.history.push(unix, total, nodes);
    }

    /// The rate history (`GET /api/v1/history`): the samples after `since`, or all.
    pub(crate) fn history(&self, since: Option<f64>) -> crate::replies::History {
        self.history.reply(since)
    }

    #[cfg(test)]
    pub(crate) fn history_len(&self) -> usize {
        self.history.len()
    }

    /// When to ask the nodes again: sooner while one does not answer (not up yet, or gone).
    pub(crate) fn poll_period(&self) -> Duration {
        if self.nodes.values().any(|v| v.error.is_some()) {
            POLL_EVERY / 4
        } else {
            POLL_EVERY
        }
    }

    /// Every node's metrics address for Prometheus (`GET /api/v1/sd`): the configured control
    /// address, or, for a node that found its own (port 0, discovery), the one it registered
    /// with the EVM (`evm`'s status line); a node whose address is not known yet is left out.
    /// `evm_api` is where the EVM's own API is bound.
    pub(crate) fn scrape_targets(
        &self,
        evm: Option<&NodeStatus>,
        evm_api: &str,
    ) -> Vec<ScrapeTarget> {
        let registered = evm.and_then(|s| s.registered.as_ref());
        self.cfg
            .nodes()
            .into_iter()
            .filter_map(|n| {
                let role = status_role(n.role).name();
                let node_ref = match n.role {
                    Role::Evm => NodeRef::Evm,
                    Role::Ru => NodeRef::Ru(n.index),
                    Role::Bu => NodeRef::Bu(n.index),
                }
                .to_string();
                let known = |a: &str| !a.is_empty() && !a.ends_with(":0");
                let addr = if known(&n.control) {
                    n.control.clone()
                } else if n.role == Role::Evm && known(evm_api) {
                    evm_api.to_string()
                } else {
                    registered?
                        .iter()
                        .find(|r| r.peer == node_ref && known(&r.control))?
                        .control
                        .clone()
                };
                let labels = [
                    ("node", n.id.clone()),
                    ("role", role.to_string()),
                    ("evb_run_id", self.cfg.run.id.clone()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
                Some(ScrapeTarget {
                    targets: vec![addr],
                    labels,
                })
            })
            .collect()
    }

    /// The whole system's status (`GET /api/v1/status`, docs/control.md); `evm` is the EVM
    /// node's latest status line.
    pub(crate) fn status(&self, evm: Option<&NodeStatus>, unix: f64) -> Status {
        let total = self.totals();
        let es = evm.and_then(|s| s.evm());
        // "Built" in the header: the EVM's ledger count of final events for the run under
        // way (it counts a BU's events once, whether the BU lives on, died or came back),
        // the most it has said so far (a snapshot missing for a moment does not take it
        // back), or the last run's once it is over; never the live BUs' counters, which
        // lose a killed BU's events
        let under_way = self.runs.get(&self.run).is_some_and(|r| r.end.is_none());
        let evm_now = evm
            .filter(|s| s.run_number == Some(self.run))
            .and_then(|s| s.evm())
            .map(|e| e.released);
        let seen = (self.released_seen.0 == self.run).then_some(self.released_seen.1);
        let built = match (under_way, evm_now.max(seen)) {
            (true, Some(released)) => released,
            (true, None) => 0,
            (false, _) => self
                .runs
                .values()
                .next_back()
                .and_then(|r| r.end.as_ref())
                .map_or(0, |e| e.events_built),
        };
        let mut nodes = Vec::new();
        for n in self.cfg.nodes() {
            let v = self.nodes.get(&n.id).cloned().unwrap_or_default();
            let role = status_role(n.role);
            let snap = v.snapshot();
            let refused = v.error.as_ref().is_some_and(|e| e.is_refused());
            let state = match (&v.error, &v.reply) {
                (Some(_), None) => "unreachable".to_string(),
                (Some(_), Some(_)) if v.failures >= 2 || refused => "unreachable".to_string(),
                // the driver's state during a run, the node's phase between runs
                (_, Some(r)) => match (snap, r.phase) {
                    (Some(s), Phase::Running) => s.state.name().to_string(),
                    (_, p) => p.name().to_string(),
                },
                (None, None) => "unknown".to_string(),
            };
            // a spare BU whose process never answered: not started, or asked to start
            let state = match (n.spare, &v.reply) {
                (true, None) if self.adding.contains(&n.id) => "starting".to_string(),
                (true, None) => "spare".to_string(),
                _ => state,
            };
            // the EVM's row: the same snapshot and count as the summary and the header (one
            // number per idea, in one reply)
            let snap = if n.role == Role::Evm {
                evm.or(snap)
            } else {
                snap
            };
            let (events, bytes) = if n.role == Role::Evm {
                (built, 0)
            } else {
                progress(snap)
            };
            let credits = match role {
                StatusRole::Evm => snap.and_then(|s| s.evm()).map(|s| s.credits_available),
                StatusRole::Bu => snap.and_then(|s| s.sink.as_ref()).map(|k| k.queued),
                StatusRole::Ru => snap.and_then(|s| s.ru()).map(|s| s.retained),
            };
            nodes.push(NodeRow {
                node: n.id.clone(),
                role,
                control: n.control.clone(),
                state,
                run: v.reply.as_ref().map(|r| r.run),
                events,
                bytes,
                rate_hz: v.rate_hz,
                bytes_per_s: v.bytes_per_s,
                credits,
                errors: errors(snap),
                error: v.error.as_ref().map(|e| e.in_words()),
                last: v.reply.as_ref().and_then(|r| r.last.clone()),
                by_time: by_time(snap),
            });
        }
        Status {
            state: self.state,
            run: self.run,
            reason: self.reason.clone(),
            mode: self.mode,
            adding: self.adding.iter().cloned().collect(),
            legal: fsm::legal(self.state)
                .iter()
                .map(|c| c.name().to_string())
                .collect(),
            evm: EvmSummary {
                triggered: es.map(|s| s.triggered),
                // the header's count (the ledger's, the most said so far)
                released: es.map(|_| built),
                in_flight: es.map(|s| s.in_flight),
                credits_available: es.map(|s| s.credits_available),
                paused: es.map(|s| s.paused),
                // takeovers by a standby EVM (docs/standby.md), and whether this one follows
                epoch: es.map(|s| s.epoch),
                following: es.map(|s| s.following),
                // a standby that the nodes followed fenced this EVM (the epoch): its word is
                // no longer the run's, and `evb ctl` looks where the control went
                fenced: evm.and_then(|s| s.fenced),
                // what happened to nodes (null before the EVM's first snapshot)
                lost: es.map(|s| s.lost.clone()),
                down: es.map(|s| s.down.clone()),
                stop_stages: es.map(|s| s.stop_stages.clone()),
            },
            totals: Totals {
                events_built: built,
                rate_hz: total.0,
                bytes_per_s: total.1,
            },
            latency: self.latency(),
            trigger_latency: es.map(|s| latency_of(&s.record_latency, 0)),
            nodes,
            runs: self
                .runs
                .values()
                .rev()
                .take(20)
                .map(RunRecord::summary)
                .collect(),
            config: ConfigSummary {
                run_id: self.cfg.run.id.clone(),
                events: self.cfg.run.events,
                duration_s: self.cfg.run.duration_s,
                rate_hz: self.cfg.run.rate_hz,
                fragment_size: self.cfg.fragments.size,
                sink: format!("{:?}", self.cfg.sink.kind).to_lowercase(),
                transport: format!("{:?}", self.cfg.transport.kind).to_lowercase(),
            },
            time_unix: unix,
        }
    }
}

//! The EVM's run controller: the operator's commands, checked against the run state
//! machine ([`crate::fsm`]); each run's start told to every node over its API; each run's
//! record (number, verdict, counters) kept for `GET /api/v1/runs/N`; and a table of every
//! node's state and rates, refreshed once a second, for `evb ctl status` and the page.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use evb_builder::{NodeEvent, RunReport};
use evb_config::{Config, NodeSpec, Role};
use evb_node::{NodeError, NodeOutcome};
use serde_json::{json, Value};
use tracing::{info, warn};

use crate::client::Api;
use crate::fsm::{self, Command, State};
use crate::service::{numbered_run_id, Cmd, Mode, Node};

/// The largest run number: 2^53 - 1, exact in every JSON reader (the page's included), and
/// far from wrapping when the next run is numbered one more.
pub const MAX_RUN: u64 = (1 << 53) - 1;

/// A refused or failed command: the HTTP status and why.
pub type Refused = (u16, String);

/// Records of this many runs are kept (the oldest go first).
const KEEP_RUNS: usize = 1000;

/// How often the node table is refreshed, and how long a node may take to answer.
const POLL_EVERY: Duration = Duration::from_secs(1);
const POLL_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct Controller(Arc<Mutex<Ctl>>);

struct Ctl {
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
    runs: BTreeMap<u64, Value>,
    nodes: BTreeMap<String, NodeView>,
    node: Weak<Node>,
    api: Option<SocketAddr>,
    /// The run under way: its number and what each node was told to start it with, so
    /// that a BU which `evb up` started again after it died rejoins it.
    under_way: Option<(u64, Value)>,
    /// Nodes whose process changed (another pid) while the run was under way, not yet
    /// told to rejoin it.
    restarted: Vec<String>,
}

/// What the controller knows of one node.
#[derive(Debug, Clone, Default)]
struct NodeView {
    status: Value,
    error: Option<String>,
    /// (when, events, bytes) at the previous poll, for rates.
    last: Option<(Instant, u64, u64)>,
    rate_hz: f64,
    bytes_per_s: f64,
    /// Polls in a row that failed: one slow answer on a loaded host is not a lost node.
    failures: u32,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The events and bytes a node's snapshot counts, by role.
fn progress(role: &str, snap: &Value) -> (u64, u64) {
    let s = &snap["stats"];
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    match role {
        "evm" => (n("triggered"), 0),
        "ru" => (n("fragments_sent"), n("payload_bytes_sent")),
        "bu" => (n("events_built"), n("payload_bytes_built")),
        _ => (0, 0),
    }
}

/// Every error counter a snapshot holds, added up.
fn errors(snap: &Value) -> u64 {
    let s = &snap["stats"];
    crate::metrics::ERROR_COUNTERS
        .iter()
        .map(|(field, _)| s[*field].as_u64().unwrap_or(0))
        .sum::<u64>()
        + snap["net"]["protocol_errors"].as_u64().unwrap_or(0)
}

impl Controller {
    pub(crate) fn new(cfg: &Config, mode: Mode) -> Controller {
        Controller(Arc::new(Mutex::new(Ctl {
            mode,
            state: State::Ready,
            reason: None,
            resetting: false,
            run: 0,
            cfg: cfg.clone(),
            runs: BTreeMap::new(),
            under_way: None,
            restarted: Vec::new(),
            nodes: BTreeMap::new(),
            node: Weak::new(),
            api: None,
        })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ctl> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state(&self) -> State {
        self.lock().state
    }

    /// Ties the controller to its node and starts refreshing the node table.
    pub(crate) fn attach(&self, node: &Arc<Node>, api: SocketAddr) {
        {
            let mut c = self.lock();
            c.node = Arc::downgrade(node);
            c.api = Some(api);
        }
        let me = self.clone();
        let _ = std::thread::Builder::new()
            .name("evb-node-table".into())
            .spawn(move || me.poll_nodes());
    }

    /// `evb run`'s one run: started at once, without a command.
    pub(crate) fn begin_once(&self, run: u64) {
        let mut c = self.lock();
        c.state = State::Starting;
        c.run = run;
        c.runs.insert(
            run,
            json!({"run": run, "state": "starting", "started_unix": unix_now()}),
        );
    }

    /// Every status line of the EVM's run: follows its progress into the run state.
    pub(crate) fn on_status(&self, v: &Value) {
        let mut c = self.lock();
        match (c.state, v["state"].as_str()) {
            (State::Starting, Some("running")) => c.state = State::Running,
            (State::Running, Some("stopping")) => c.state = State::Stopping,
            _ => {}
        }
        let (run, state) = (c.run, c.state);
        if let Some(r) = c.runs.get_mut(&run) {
            r["state"] = json!(state);
        }
    }

    /// An operator's command (the API's POST /api/v1/<command>).
    pub(crate) fn command(&self, cmd: Command, body: &Value) -> Result<Value, Refused> {
        let node = self
            .lock()
            .node
            .upgrade()
            .ok_or((503, "shutting down".to_string()))?;
        let mut c = self.lock();
        let from = c.state;
        if c.mode == Mode::Once
            && matches!(cmd, Command::Configure | Command::Start | Command::Halt)
        {
            return Err((
                409,
                format!(
                    "`{}`: this EVM runs one run and exits (evb run); start the nodes with `evb up` (or `evb node --serve`) for run control",
                    cmd.name()
                ),
            ));
        }
        let Some(to) = fsm::next(from, cmd) else {
            return Err((409, fsm::refusal(from, cmd)));
        };
        let mut reply = json!({});
        match cmd {
            Command::Configure => {
                let text = body["config"].as_str().ok_or((
                    400,
                    "configure needs {\"config\": \"<TOML text>\"}".to_string(),
                ))?;
                // the file may leave the secret out: the running one is kept
                let mut new = Config::parse_unvalidated(text).map_err(|e| (400, e.to_string()))?;
                if new.run.secret.is_empty() {
                    new.run.secret = c.cfg.run.secret.clone();
                }
                let new = adopt(&c.cfg, new);
                let mut keys = restart_keys(&c.cfg, &new);
                if new.nodes().len() != c.cfg.nodes().len() {
                    keys.push("topology (the number of nodes)".into());
                    keys.dedup();
                }
                if !keys.is_empty() {
                    return Err((
                        409,
                        format!(
                            "configure cannot change {}: these need the nodes restarted (evb up again)",
                            keys.join(", ")
                        ),
                    ));
                }
                let mut changed = changed_sections(&c.cfg, &new);
                // node lists as written differ from those resolved: name them only when a
                // node's effective settings (credits, sink, files) change
                changed.retain(|k| k != "ru" && k != "bu");
                if c.cfg.nodes() != new.nodes() {
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
                reply["changed"] = json!(changed);
                new.validate().map_err(|e| (400, e.to_string()))?;
                c.cfg = new;
            }
            Command::Start => {
                let run = match body.get("run") {
                    None | Some(Value::Null) => c.run + 1,
                    Some(v) => v
                        .as_u64()
                        .filter(|n| (1..=MAX_RUN).contains(n))
                        .ok_or((400, format!("`run` must be an integer from 1 to {MAX_RUN}")))?,
                };
                if run > MAX_RUN {
                    return Err((
                        409,
                        format!("run {} was the last number there is: reset the numbering by restarting the EVM", c.run),
                    ));
                }
                if c.runs.contains_key(&run) {
                    return Err((
                        409,
                        format!(
                            "run {run} was already taken; the next free number is {}",
                            c.runs.keys().last().map_or(1, |n| n + 1)
                        ),
                    ));
                }
                let mut cfg = c.cfg.clone();
                cfg.run.id = numbered_run_id(&c.cfg.run.id, run);
                node.control.reset();
                c.run = run;
                c.reason = None;
                c.runs.insert(
                    run,
                    json!({"run": run, "state": "starting", "started_unix": unix_now()}),
                );
                while c.runs.len() > KEEP_RUNS {
                    c.runs.pop_first();
                }
                node.cmds
                    .send(Cmd::Start {
                        run,
                        cfg: Box::new(cfg),
                    })
                    .map_err(|_| (503, "the node is shutting down".to_string()))?;
                reply["run"] = json!(run);
            }
            Command::Pause => node.control.set_paused(true),
            Command::Resume => node.control.set_paused(false),
            Command::Stop => {
                // before the nodes are ready there is nothing to drain: the start is
                // called off, and the system is ready again
                if from == State::Starting {
                    c.resetting = true;
                }
                node.control.stop()
            }
            Command::Reset if from == State::Failed => c.reason = None,
            Command::Reset => {
                c.resetting = true;
                node.control.abort("reset by the operator");
                node.control.set_paused(false);
            }
            Command::Halt => {
                let nodes = c.cfg.nodes();
                let token = node.token();
                std::thread::spawn(move || {
                    for n in nodes.iter().filter(|n| n.role != Role::Evm) {
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
        c.state = to;
        reply["state"] = json!(to);
        reply["run"] = json!(c.run);
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
        let others: Vec<NodeSpec> = cfg
            .nodes()
            .into_iter()
            .filter(|n| n.role != Role::Evm)
            .collect();
        let mut sent = cfg.clone();
        sent.run.secret.clear(); // each node uses its own
        let body = json!({"run": run, "config": sent.to_toml()});
        {
            let mut c = self.lock();
            c.under_way = Some((run, body.clone()));
            c.restarted.clear();
        }
        let token = node.token();
        let results: Vec<(String, String, Result<(), String>)> = std::thread::scope(|s| {
            let handles: Vec<_> = others
                .iter()
                .map(|n| {
                    let (body, token) = (&body, token.clone());
                    s.spawn(move || {
                        let api = Api::new(&n.control, token).with_timeout(Duration::from_secs(5));
                        // a node started again by `evb up` may take a moment to listen
                        let until = Instant::now() + Duration::from_secs(3);
                        let r = loop {
                            match api.post("/api/v1/node/start", body) {
                                Ok(r) if r.ok() => break Ok(()),
                                Ok(r) => break Err(r.error()),
                                Err(e) if e.contains("refused") && Instant::now() < until => {
                                    std::thread::sleep(Duration::from_millis(100))
                                }
                                Err(e) => break Err(e),
                            }
                        };
                        (n.id.clone(), api.base.clone(), r)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| ("?".into(), String::new(), Err("panicked".into())))
                })
                .collect()
        });
        let failed: Vec<String> = results
            .iter()
            .filter_map(|(id, base, r)| r.as_ref().err().map(|e| format!("{id} ({base}): {e}")))
            .collect();
        let r = if failed.is_empty() {
            let r = evm(node, cfg);
            // ready means every node is ready: wait for the others to finish their part
            // (they send their last bytes and close after the EVM halts them)
            await_idle(&others, &token, Duration::from_secs(10));
            r
        } else {
            // the nodes that did start would wait for the EVM until their connect timeout
            for (id, _, r) in &results {
                if r.is_ok() {
                    if let Some(n) = others.iter().find(|n| &n.id == id) {
                        let why = format!("run {run} could not start: {}", failed.join("; "));
                        let _ = Api::new(&n.control, token.clone())
                            .with_timeout(Duration::from_secs(2))
                            .post("/api/v1/node/abort", &json!({ "reason": why }));
                    }
                }
            }
            Err(NodeError::Setup(format!(
                "run {run} could not start: {}",
                failed.join("; ")
            )))
        };
        self.finished(run, &r);
        r
    }

    /// A run is over: its record, and the state it leaves.
    pub(crate) fn finished(&self, run: u64, r: &Result<NodeOutcome, NodeError>) {
        let mut c = self.lock();
        c.under_way = None;
        let (ok, mut reason, report) = match r {
            Ok(o) => (o.ok, o.reason.clone(), o.report.clone()),
            Err(e) => (false, e.to_string(), Value::Null),
        };
        // the EVM's report, typed, judged by the builder's verdict (the one the EVM used)
        let (run_report, verdict) = match RunReport::from_line(&report) {
            Ok(Some(rr)) => {
                let v = rr.verdict();
                (Some(rr), v)
            }
            Ok(None) => (None, Vec::new()),
            Err(e) => (None, vec![e]),
        };
        // (the EVM ends its run by the same verdict: this differs only for a report that
        // cannot be read, which is then the reason)
        if ok && !verdict.is_empty() {
            reason = verdict.join("; ");
        }
        let ok = ok && verdict.is_empty();
        // the EVM's ledger: every event built exactly once, by live and lost BUs alike
        let built = run_report.as_ref().map_or(0, |rr| rr.evm.released);
        let bytes: u64 = run_report.as_ref().map_or(0, |rr| {
            rr.bus.iter().flatten().map(|b| b.payload_bytes_built).sum()
        });
        let reset = std::mem::take(&mut c.resetting);
        let outcome = if ok {
            "complete"
        } else if reset {
            "aborted"
        } else {
            "failed"
        };
        let rec = c.runs.entry(run).or_insert_with(|| json!({"run": run}));
        let started = rec["started_unix"].as_f64().unwrap_or_else(unix_now);
        rec["state"] = json!(outcome);
        rec["ok"] = json!(ok);
        rec["reason"] = json!(reason);
        rec["verdict"] = json!(verdict);
        rec["ended_unix"] = json!(unix_now());
        rec["wall_s"] = json!(unix_now() - started);
        rec["events_built"] = json!(built);
        rec["payload_bytes_built"] = json!(bytes);
        rec["triggered"] = json!(run_report.as_ref().map(|rr| rr.evm.triggered));
        rec["lost"] = json!(run_report.as_ref().map(|rr| &rr.evm.lost));
        rec["seconds"] = json!(run_report.as_ref().map(|rr| rr.seconds));
        rec["report"] = report;
        if ok || reset {
            c.state = State::Ready;
            c.reason = None;
        } else {
            c.state = State::Failed;
            c.reason = Some(format!("run {run}: {reason}"));
        }
        info!("run {run} {outcome}: {reason}");
    }

    pub(crate) fn run_record(&self, n: u64) -> Option<Value> {
        self.lock().runs.get(&n).cloned()
    }

    /// Every run, without the full reports.
    pub(crate) fn runs(&self) -> Value {
        let c = self.lock();
        Value::Array(c.runs.values().map(summary).collect())
    }

    /// The whole system's status (`GET /api/v1/status`).
    pub(crate) fn status(&self, evm: &Node) -> Value {
        let c = self.lock();
        let mut nodes = Vec::new();
        let (mut total_rate, mut total_bps, mut built) = (0.0, 0.0, 0u64);
        for n in c.cfg.nodes() {
            let v = c.nodes.get(&n.id).cloned().unwrap_or_default();
            let role = match n.role {
                Role::Evm => "evm",
                Role::Ru => "ru",
                Role::Bu => "bu",
            };
            let snap = &v.status["snapshot"];
            let refused = v.error.as_ref().is_some_and(|e| e.contains("refused"));
            let state = if v.error.is_some() && (v.failures >= 2 || refused || v.status.is_null()) {
                "unreachable".to_string()
            } else {
                // the driver's state during a run, the node's phase between runs
                match (snap["state"].as_str(), v.status["phase"].as_str()) {
                    (Some(s), Some("running")) => s.to_string(),
                    (_, Some(p)) => p.to_string(),
                    _ => "unknown".to_string(),
                }
            };
            let (events, bytes) = progress(role, snap);
            let current = v.status["run"] == json!(c.run) && v.status["phase"] == "running";
            if role == "bu" && current {
                total_rate += v.rate_hz;
                total_bps += v.bytes_per_s;
                built += events;
            }
            let credits = match role {
                "evm" => snap["stats"]["credits_available"].clone(),
                "bu" => json!(snap["sink"]["queued"]),
                _ => snap["stats"]["retained"].clone(),
            };
            nodes.push(json!({
                "node": n.id,
                "role": role,
                "control": n.control,
                "state": state,
                "run": v.status["run"],
                "events": events,
                "bytes": bytes,
                "rate_hz": v.rate_hz,
                "bytes_per_s": v.bytes_per_s,
                "credits": credits,
                "errors": errors(snap),
                "error": v.error,
                "last": v.status["last"],
            }));
        }
        let snap = evm.control.snapshot().unwrap_or(Value::Null);
        let es = &snap["stats"];
        // what happened to nodes, typed (null before the EVM's first snapshot)
        let lost: Option<Vec<NodeEvent>> = serde_json::from_value(es["lost"].clone()).ok();
        json!({
            "state": c.state,
            "run": c.run,
            "reason": c.reason,
            "mode": match c.mode { Mode::Once => "once", Mode::Serve => "serve" },
            "legal": fsm::legal(c.state).iter().map(|c| c.name()).collect::<Vec<_>>(),
            "evm": {
                "triggered": es["triggered"],
                "released": es["released"],
                "in_flight": es["in_flight"],
                "credits_available": es["credits_available"],
                "paused": es["paused"],
                "lost": lost,
                "down": es["down"],
            },
            "totals": {"events_built": built, "rate_hz": total_rate, "bytes_per_s": total_bps},
            "nodes": nodes,
            "runs": c.runs.values().rev().take(20).map(summary).collect::<Vec<_>>(),
            "config": {
                "run_id": c.cfg.run.id,
                "events": c.cfg.run.events,
                "duration_s": c.cfg.run.duration_s,
                "rate_hz": c.cfg.run.rate_hz,
                "fragment_size": c.cfg.fragments.size,
                "sink": format!("{:?}", c.cfg.sink.kind).to_lowercase(),
                "transport": format!("{:?}", c.cfg.transport.kind).to_lowercase(),
            },
            "time_unix": unix_now(),
        })
    }

    /// Refreshes the node table once a second, every node in parallel, until the EVM's node
    /// is gone.
    fn poll_nodes(&self) {
        // one client per node for the controller's life: its connection stays open
        let mut apis: std::collections::HashMap<String, Api> = std::collections::HashMap::new();
        loop {
            let (nodes, evm, token) = {
                let c = self.lock();
                let Some(node) = c.node.upgrade() else { return };
                if c.state == State::Halted {
                    return;
                }
                (c.cfg.nodes(), node.status(), node.token())
            };
            let t0 = Instant::now();
            for n in nodes.iter().filter(|n| n.role != Role::Evm) {
                apis.entry(n.id.clone()).or_insert_with(|| {
                    Api::new(&n.control, token.clone()).with_timeout(POLL_TIMEOUT)
                });
            }
            let apis = &apis;
            let answers: Vec<(String, String, Result<Value, String>)> = std::thread::scope(|s| {
                let handles: Vec<_> = nodes
                    .iter()
                    .filter(|n| n.role != Role::Evm)
                    .map(|n| {
                        s.spawn(move || {
                            let role = format!("{:?}", n.role).to_lowercase();
                            if n.control.ends_with(":0") {
                                return (
                                    n.id.clone(),
                                    role,
                                    Err("its control port is not known (port 0)".to_string()),
                                );
                            }
                            let api = &apis[&n.id];
                            let r = match api.get("/api/v1/node") {
                                Ok(r) if r.ok() => Ok(r.body),
                                Ok(r) => Err(r.error()),
                                Err(e) => Err(e),
                            };
                            (n.id.clone(), role, r)
                        })
                    })
                    .collect();
                handles.into_iter().filter_map(|h| h.join().ok()).collect()
            });
            {
                let now = Instant::now();
                let mut c = self.lock();
                let me = nodes.first().map(|n| n.id.clone()).unwrap_or_default();
                let all = std::iter::once((me, "evm".to_string(), Ok(evm))).chain(answers);
                let under_way = c.under_way.is_some();
                let mut restarted = Vec::new();
                for (id, role, r) in all {
                    let v = c.nodes.entry(id.clone()).or_default();
                    match r {
                        Ok(status) => {
                            let pid = &status["pid"];
                            if under_way && !v.status["pid"].is_null() && v.status["pid"] != *pid {
                                restarted.push(id);
                            }
                            let (e, b) = progress(&role, &status["snapshot"]);
                            if let Some((t, e0, b0)) = v.last {
                                let dt = now.duration_since(t).as_secs_f64().max(1e-3);
                                // a new run starts the counters again
                                v.rate_hz = e.saturating_sub(e0) as f64 / dt;
                                v.bytes_per_s = b.saturating_sub(b0) as f64 / dt;
                            }
                            if status["phase"] != "running" {
                                v.rate_hz = 0.0;
                                v.bytes_per_s = 0.0;
                            }
                            v.last = Some((now, e, b));
                            v.status = status;
                            v.error = None;
                            v.failures = 0;
                        }
                        Err(e) => {
                            v.error = Some(e);
                            v.failures += 1;
                            v.rate_hz = 0.0;
                            v.bytes_per_s = 0.0;
                        }
                    }
                }
                c.restarted.extend(restarted);
            }
            self.rejoin_restarted_bus(&nodes, &token);
            // a node that did not answer (not up yet, or gone) is asked again sooner
            let any_error = self.lock().nodes.values().any(|v| v.error.is_some());
            let period = if any_error {
                POLL_EVERY / 4
            } else {
                POLL_EVERY
            };
            std::thread::sleep(period.saturating_sub(t0.elapsed()));
        }
    }
}

impl Controller {
    /// A BU that died during a run and that `evb up` started again sits idle: it is told to
    /// start the run under way, and joins it as under `evb run` (the RUs keep calling it,
    /// the EVM gives it events again once it is Ready). RUs are not: losing one follows
    /// `on_ru_loss`.
    fn rejoin_restarted_bus(&self, nodes: &[NodeSpec], token: &Option<String>) {
        let mut c = self.lock();
        if !matches!(c.state, State::Running | State::Paused) {
            return;
        }
        let Some((run, body)) = c.under_way.clone() else {
            return;
        };
        let idle: Vec<NodeSpec> = nodes
            .iter()
            .filter(|n| n.role == Role::Bu && c.restarted.contains(&n.id))
            .filter(|n| {
                c.nodes.get(&n.id).is_some_and(|v| {
                    v.error.is_none()
                        && v.status["phase"] == "idle"
                        && v.status["run"] != json!(run)
                })
            })
            .cloned()
            .collect();
        for n in idle {
            c.restarted.retain(|id| *id != n.id);
            let (body, token) = (body.clone(), token.clone());
            std::thread::spawn(move || {
                let api = Api::new(&n.control, token).with_timeout(Duration::from_secs(5));
                match api.post("/api/v1/node/start", &body) {
                    Ok(r) if r.ok() => info!("{} started again: it rejoins run {run}", n.id),
                    Ok(r) => warn!("{} could not rejoin run {run}: {}", n.id, r.error()),
                    Err(e) => warn!("{} could not rejoin run {run}: {e}", n.id),
                }
            });
        }
    }
}

/// Waits until no node of `nodes` says it is in a run (the unreachable ones do not count),
/// or `limit` has passed.
fn await_idle(nodes: &[NodeSpec], token: &Option<String>, limit: Duration) {
    let until = Instant::now() + limit;
    for n in nodes {
        let api = Api::new(&n.control, token.clone()).with_timeout(POLL_TIMEOUT);
        while Instant::now() < until {
            match api.get("/api/v1/node") {
                Ok(r) if r.ok() && r.body["phase"] == "running" => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => break,
            }
        }
    }
}

/// A run's record without its full report.
fn summary(r: &Value) -> Value {
    let mut s = r.clone();
    if let Some(o) = s.as_object_mut() {
        o.remove("report");
    }
    s
}

/// The keys of `new` that the running nodes cannot take without a restart.
fn restart_keys(cur: &Config, new: &Config) -> Vec<String> {
    cur.restart_needed(new)
}

/// The top-level sections that differ.
fn changed_sections(a: &Config, b: &Config) -> Vec<String> {
    let (Ok(Value::Object(x)), Ok(Value::Object(y))) =
        (serde_json::to_value(a), serde_json::to_value(b))
    else {
        return Vec::new();
    };
    let mut keys: Vec<String> = x
        .keys()
        .chain(y.keys())
        .filter(|k| x.get(*k) != y.get(*k))
        .cloned()
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// The new configuration with the running system's nodes: a file that does not list
/// nodes (or lists them without addresses) means the nodes as they run now, with its own
/// per-node defaults (credits, sink).
fn adopt(cur: &Config, new: Config) -> Config {
    let mut out = new;
    out.evm.addr = cur.evm.addr.clone();
    out.evm.control = cur.evm.control.clone();
    if out.evm.id != cur.evm.id {
        return out; // refused as a restart key
    }
    let n_ru = if out.ru.is_empty() {
        out.topology.rus as usize
    } else {
        out.ru.len()
    };
    let n_bu = if out.bu.is_empty() {
        out.topology.bus as usize
    } else {
        out.bu.len()
    };
    if n_ru != cur.ru.len() || n_bu != cur.bu.len() {
        return out; // refused: the number of nodes
    }
    if out.ru.is_empty() {
        out.ru = cur
            .ru
            .iter()
            .map(|r| evb_config::RuSection {
                files: Vec::new(),
                ..r.clone()
            })
            .collect();
    }
    for (x, y) in out.ru.iter_mut().zip(&cur.ru) {
        if x.addr.is_empty() {
            x.addr = y.addr.clone();
        }
        if x.control.is_empty() {
            x.control = y.control.clone();
        }
    }
    if out.bu.is_empty() {
        out.bu = cur
            .bu
            .iter()
            .map(|b| evb_config::BuSection {
                id: b.id.clone(),
                addr: b.addr.clone(),
                control: b.control.clone(),
                credits: None,
                sink: None,
                sink_delay_us: None,
                sink_delay_events: None,
                serve: b.serve.clone(),
            })
            .collect();
    }
    for (x, y) in out.bu.iter_mut().zip(&cur.bu) {
        if x.addr.is_empty() {
            x.addr = y.addr.clone();
        }
        if x.control.is_empty() {
            x.control = y.control.clone();
        }
    }
    out.topology = cur.topology.clone();
    out.control = cur.control.clone();
    // the CPUs the processes run on (given, or placed by evb up): as now unless listed
    if out.affinity.is_empty() {
        out.affinity = cur.affinity.clone();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_run_ids_fit_the_handshake() {
        assert_eq!(numbered_run_id("evb-local", 3), "evb-local#3");
        let long = "x".repeat(64);
        let id = numbered_run_id(&long, 12345);
        assert_eq!(id.len(), 64);
        assert!(id.ends_with("#12345"));
    }

    #[test]
    fn sections_that_changed_are_named() {
        let a = Config::default();
        let mut b = a.clone();
        b.run.events = 5;
        b.fragments.size = 1000;
        assert_eq!(changed_sections(&a, &b), ["fragments", "run"]);
        assert!(changed_sections(&a, &a).is_empty());
    }
}

//! The HTTP/JSON control API (docs/control.md), served by axum on a thread of its own with a
//! one-thread tokio runtime, so that it never competes with the node's event loop for more
//! than that.
//!
//! Every node: `GET /api/v1/node`, `GET /metrics`, and the calls its EVM makes
//! (`POST /api/v1/node/start|abort|halt`). The EVM also: `GET /api/v1/status`,
//! `POST /api/v1/<command>`, `GET /api/v1/runs[/N]`, `GET /api/v1/history`, `GET /api/v1/links`,
//! and the run page at `/`.
//! Who may call is decided in [`crate::guard`] (loopback is not trusted to change anything
//! while a secret is set). The server bounds what a client can hold: connections in all and
//! per source IP, the time to send headers and body, and the body's size.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use evb_config::Role;
use evb_wire::window::DecisionWindow;
use serde_json::{json, Value};
use tracing::{debug, warn};

use evb_transport::log_limit::Tally;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tower::ServiceExt;

use crate::fsm::Command;
use crate::guard;
use crate::metrics::{exposition, Scrape};
use crate::service::{parse_listen, Cmd, Node, Phase};

type Shared = Arc<Node>;

/// Largest request body accepted (a configuration file fits many times over).
const MAX_BODY: usize = 1 << 20;

fn error(status: u16, msg: impl Into<String>) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    (code, Json(json!({ "error": msg.into() }))).into_response()
}

/// A run endpoint asked of a node without run control. A standby EVM that follows one says
/// where the control is (`control`): a client given the address where the control was (the
/// lost EVM's, where `evb up` starts the next standby) can follow it there (`evb ctl`). It
/// tells no more than its configuration already names, and only to a caller the API guard
/// admitted.
fn not_the_control(node: &Node, msg: &str) -> Response {
    let to = node
        .standby
        .then(|| node.lock().cfg.evm.follow_control.clone())
        .filter(|c| !c.is_empty());
    match to {
        Some(c) => (
            StatusCode::NOT_FOUND,
            Json(json!({
                "error": format!("{msg}: this is a standby EVM; the run control it follows is at http://{c}/"),
                "control": format!("http://{c}/"),
            })),
        )
            .into_response(),
        None => error(404, msg),
    }
}

/// A JSON object body (an empty body is `{}`), or a 400 that says what is wrong.
fn parse_body(body: &Bytes) -> Result<Value, Box<Response>> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(Box::new(error(
            400,
            "the request body must be a JSON object",
        ))),
        Err(e) => Err(Box::new(error(400, format!("malformed JSON: {e}")))),
    }
}

/// Longest a client may take to send a request's headers (also the longest a kept-alive
/// connection may sit idle between requests).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bytes of a request's head (request line and headers) the API reads.
const MAX_HEAD: usize = 64 * 1024;
/// Longest a client may take to send a request's body.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once, in all and from one source IP. Beyond them a newcomer takes
/// the place of the connection that has waited longest without a request being served (one
/// that never finished a request first, then one idle between requests), or is closed at
/// once if every connection is serving one: the API never holds many more descriptors than
/// these, a flood of unfinished requests cannot take the ones the data path needs, and it
/// cannot keep the operator out either (loopback addresses are many, so a per-IP cap alone
/// would not): a client that sends its request at once is served before strangers that
/// keep reconnecting could push it out.
pub const MAX_CONNECTIONS: usize = 64;
pub const MAX_CONNECTIONS_PER_IP: usize = 16;

/// Binds the node's API and serves it on a thread of its own. Returns the bound address.
pub fn serve(node: Shared, addr: &str) -> Result<SocketAddr, String> {
    let want = parse_listen(addr)?;
    let std_listener = match evb_transport::inherited::listener(want) {
        Some(inherited) => inherited,
        None => std::net::TcpListener::bind(want),
    }
    .map_err(|e| format!("control API: cannot listen on {want}: {e}"))?;
    std_listener
        .set_nonblocking(true)
        .map_err(|e| e.to_string())?;
    let bound = std_listener.local_addr().map_err(|e| e.to_string())?;
    let app = router(node.clone());
    std::thread::Builder::new()
        .name(format!("{}-api", node.id()))
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    warn!("control API: no runtime: {e}");
                    return;
                }
            };
            rt.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(std_listener) {
                    Ok(l) => l,
                    Err(e) => {
                        warn!("control API: {e}");
                        return;
                    }
                };
                accept_loop(listener, app, node.id().to_string()).await;
            });
        })
        .map_err(|e| e.to_string())?;
    Ok(bound)
}

/// A connection's use: it has not finished a request yet, is serving one, or is idle
/// between requests.
const FRESH: u8 = 0;
const SERVING: u8 = 1;
const IDLE: u8 = 2;

/// One open connection, as the accept loop sees it.
struct Open {
    ip: IpAddr,
    since: std::time::Instant,
    /// FRESH, SERVING or IDLE.
    state: Arc<std::sync::atomic::AtomicU8>,
    /// Closes the connection (it takes a newcomer's place).
    evict: Option<tokio::sync::oneshot::Sender<()>>,
}

/// How many of an IP's connections may be pushed out within [`STRIKE_WINDOW`] before its
/// newcomers may push out no one (they get a free place or are closed at once): a source
/// that keeps connecting without finishing requests churns the API's places, and would
/// otherwise push out a client's connection before the client's request is read.
const STRIKES: u32 = 8;
const STRIKE_WINDOW: Duration = Duration::from_secs(10);
/// Most source IPs whose strikes are remembered.
const STRIKE_IPS: usize = 4096;

/// Connections being served, in all and per source IP.
#[derive(Default)]
struct Slots {
    next: u64,
    open: HashMap<u64, Open>,
    per_ip: HashMap<IpAddr, usize>,
    /// Per source IP: its connections pushed out since the window began.
    strikes: HashMap<IpAddr, (u32, std::time::Instant)>,
}

impl Slots {
    /// Whether a newcomer from `ip` is within the limits.
    fn room(&self, ip: IpAddr) -> bool {
        self.open.len() < MAX_CONNECTIONS
            && self.per_ip.get(&ip).copied().unwrap_or(0) < MAX_CONNECTIONS_PER_IP
    }

    /// The connection a newcomer from `ip` may push out, if any: from the newcomer's own IP
    /// when that IP is at its limit, else from any; one that never finished a request
    /// before one idle between requests, the oldest first; never one serving a request.
    fn victim(&self, ip: IpAddr) -> Option<u64> {
        if self.struck_out(ip) {
            return None;
        }
        let ip_full = self.per_ip.get(&ip).copied().unwrap_or(0) >= MAX_CONNECTIONS_PER_IP;
        self.open
            .iter()
            .filter(|(_, o)| o.evict.is_some() && (!ip_full || o.ip == ip))
            .filter_map(|(id, o)| {
                let st = o.state.load(std::sync::atomic::Ordering::Relaxed);
                (st != SERVING).then_some((st == IDLE, o.since, *id))
            })
            .min()
            .map(|(_, _, id)| id)
    }
}

/// One connection's place in [`Slots`], given back when the connection ends.
struct Slot {
    slots: Arc<std::sync::Mutex<Slots>>,
    id: u64,
}

impl Slot {
    /// A place for a newcomer from `ip`: within the limits, or the place of a connection
    /// pushed out for it (closed by its task; it is no longer counted). `None`: every
    /// connection at the limit is serving a request.
    fn take(
        slots: &Arc<std::sync::Mutex<Slots>>,
        ip: IpAddr,
    ) -> Option<(
        Slot,
        Arc<std::sync::atomic::AtomicU8>,
        tokio::sync::oneshot::Receiver<()>,
        bool,
    )> {
        let mut s = slots.lock().unwrap_or_else(|p| p.into_inner());
        let mut pushed_out = false;
        while !s.room(ip) {
            let victim = s.victim(ip)?;
            if let Some(o) = s.open.remove(&victim) {
                Slots::uncount(&mut s.per_ip, o.ip);
                s.strike(o.ip);
                if let Some(tx) = o.evict {
                    let _ = tx.send(());
                }
                pushed_out = true;
            }
        }
        let id = s.next;
        s.next += 1;
        let state = Arc::new(std::sync::atomic::AtomicU8::new(FRESH));
        let (tx, rx) = tokio::sync::oneshot::channel();
        s.open.insert(
            id,
            Open {
                ip,
                since: std::time::Instant::now(),
                state: state.clone(),
                evict: Some(tx),
            },
        );
        *s.per_ip.entry(ip).or_default() += 1;
        Some((
            Slot {
                slots: slots.clone(),
                id,
            },
            state,
            rx,
            pushed_out,
        ))
    }
}

impl Slots {
    /// Whether `ip`'s connections were pushed out too often lately to push out others.
    fn struck_out(&self, ip: IpAddr) -> bool {
        self.strikes
            .get(&ip)
            .is_some_and(|(n, since)| *n >= STRIKES && since.elapsed() < STRIKE_WINDOW)
    }

    /// One of `ip`'s connections was pushed out.
    fn strike(&mut self, ip: IpAddr) {
        let now = std::time::Instant::now();
        if self.strikes.len() >= STRIKE_IPS && !self.strikes.contains_key(&ip) {
            self.strikes
                .retain(|_, (_, since)| now.duration_since(*since) < STRIKE_WINDOW);
            if self.strikes.len() >= STRIKE_IPS {
                // many addresses at once: forget them all rather than grow
                self.strikes.clear();
            }
        }
        let e = self.strikes.entry(ip).or_insert((0, now));
        if now.duration_since(e.1) >= STRIKE_WINDOW {
            *e = (0, now);
        }
        e.0 += 1;
    }

    fn uncount(per_ip: &mut HashMap<IpAddr, usize>, ip: IpAddr) {
        if let Some(n) = per_ip.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per_ip.remove(&ip);
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        // a connection pushed out was uncounted when it was
        if let Some(o) = s.open.remove(&self.id) {
            Slots::uncount(&mut s.per_ip, o.ip);
        }
    }
}

/// Accepts connections within the limits above and serves each with a header deadline.
async fn accept_loop(listener: tokio::net::TcpListener, app: Router, node: String) {
    let slots = Arc::new(std::sync::Mutex::new(Slots::default()));
    // every connection closed for a reason of its own (limits, malformed or slow requests),
    // one line per 10 s with each reason and its count
    let closed = Arc::new(std::sync::Mutex::new(Tally::new(Duration::from_secs(10))));
    let say = {
        let (closed, node) = (closed.clone(), node.clone());
        move |why: String| {
            let line = closed.lock().unwrap_or_else(|p| p.into_inner()).tick(&why);
            if let Some(line) = line {
                warn!(node, "control API: closed connections, {line}");
            }
        }
    };
    {
        // the last of a burst is said even if nothing follows it
        let (closed, node) = (closed.clone(), node.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let line = closed.lock().unwrap_or_else(|p| p.into_inner()).due();
                if let Some(line) = line {
                    warn!(node, "control API: closed connections, {line}");
                }
            }
        });
    }
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // out of descriptors, most likely: wait rather than spin
                say(format!("accept failed: {e}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some((slot, state, evicted, pushed_out)) = Slot::take(&slots, peer.ip()) else {
            drop(stream);
            say(format!(
                "from {}: closed at once, too many open and each serving a request, or its \
                 address pushed out too often (limits: {MAX_CONNECTIONS_PER_IP} per IP, \
                 {MAX_CONNECTIONS} in all)",
                peer.ip()
            ));
            continue;
        };
        if pushed_out {
            say(format!(
                "one without a request served, for a newer one from {} (limits: \
                 {MAX_CONNECTIONS_PER_IP} per IP, {MAX_CONNECTIONS} in all)",
                peer.ip()
            ));
        }
        let say = say.clone();
        let seen = state.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                let (app, state) = (app.clone(), state.clone());
                async move {
                    // a connection serving a request is never pushed out
                    state.store(SERVING, std::sync::atomic::Ordering::Relaxed);
                    let r = app.oneshot(req.map(Body::new)).await;
                    state.store(IDLE, std::sync::atomic::Ordering::Relaxed);
                    r
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                // no request of this API needs more: larger heads are refused (431)
                .max_buf_size(MAX_HEAD)
                .serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                r = conn => {
                    // a malformed request (400), headers too large (431), a request too
                    // slow: said; a client's kept-alive connection idle past the deadline
                    // after its requests were served is no refusal
                    match r {
                        Err(e) if e.is_timeout() && seen.load(std::sync::atomic::Ordering::Relaxed) == IDLE => {
                            debug!("control API: an idle connection from {peer} closed: {e}");
                        }
                        Err(e) => say(format!("from {}: {e}", peer.ip())),
                        Ok(()) => {}
                    }
                }
                _ = evicted => {}
            }
        });
        // every connection ready to be read is read before the next is accepted: a client
        // that sent its request is serving it (and is not pushed out) before strangers
        // reconnecting in a loop could take its place (the accept loop alone would take a
        // hundred connections in one turn of the runtime)
        tokio::task::yield_now().await;
    }
}

fn router(node: Shared) -> Router {
    let mut r = Router::new()
        .route("/api/v1/node", get(node_status))
        .route("/metrics", get(metrics))
        .route("/api/v1/node/start", post(node_start))
        .route("/api/v1/node/abort", post(node_abort))
        .route("/api/v1/node/halt", post(node_halt))
        .route("/api/v1/node/promote", post(node_promote));
    if node.role() == Role::Evm {
        r = r
            .route("/", get(page))
            .route("/api/v1/logout", post(logout))
            .route("/api/v1/status", get(run_status))
            .route("/api/v1/runs", get(runs))
            .route("/api/v1/history", get(history))
            .route("/api/v1/links", get(links))
            .route("/api/v1/sd", get(scrape_targets))
            .route("/api/v1/runs/{n}", get(run_record))
            .route("/api/v1/decide", post(decide))
            .route("/api/v1/retire", post(retire))
            .route("/api/v1/add-bu", post(add_bu))
            .route("/api/v1/{command}", post(command));
    } else {
        r = r.route("/api/v1/status", get(node_status));
    }
    let sessions = Arc::new(crate::session::Sessions::default());
    let gate = Arc::new(Gate {
        node: node.clone(),
        known_hosts: known_hosts(&node),
        refused: std::sync::Mutex::new(Tally::new(Duration::from_secs(10))),
        sessions: sessions.clone(),
    });
    let r = r.layer(axum::Extension(sessions));
    r.fallback(|| async { error(404, "no such API path (see docs/control.md)") })
        .method_not_allowed_fallback(|| async {
            error(
                405,
                "wrong method for this path: commands are POST, status and records GET",
            )
        })
        .layer(middleware::from_fn_with_state(gate, authorize))
        .with_state(node)
}

/// What the authorization middleware needs besides the request.
struct Gate {
    node: Shared,
    known_hosts: Vec<String>,
    refused: std::sync::Mutex<Tally>,
    /// The run page's sessions (`session.rs`).
    sessions: Arc<crate::session::Sessions>,
}

/// Host names that name this node's machine: this host's own name and every host name the
/// configuration uses (addresses are usually IP literals, which are always accepted).
fn known_hosts(node: &Node) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| vec![h.trim().to_string()])
        .unwrap_or_default();
    let cfg = node.lock().cfg.clone();
    for n in cfg.nodes() {
        for a in [&n.addr, &n.control] {
            let h = guard::host_part(a);
            if !h.is_empty() && h.parse::<IpAddr>().is_err() {
                names.push(h.to_string());
            }
        }
    }
    names.retain(|n| !n.is_empty());
    names.sort();
    names.dedup();
    names
}

/// Applies [`crate::guard::decide`] to every request, then reads its body within
/// [`BODY_TIMEOUT`] and [`MAX_BODY`] (so that a slow body cannot hold a connection, and an
/// oversized one gets the same JSON refusal as every other).
async fn authorize(
    State(gate): State<Arc<Gate>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
    next: Next,
) -> Response {
    let headers = req.headers();
    let text = |name: header::HeaderName| headers.get(name).and_then(|h| h.to_str().ok());
    let declared_len = text(header::CONTENT_LENGTH).and_then(|l| l.trim().parse::<u64>().ok());
    let chunked = headers.contains_key(header::TRANSFER_ENCODING);
    let facts_read_only = matches!(*req.method(), Method::GET | Method::HEAD);
    let facts = guard::Facts {
        peer: Some(peer.ip()),
        read_only: matches!(*req.method(), Method::GET | Method::HEAD),
        host: text(header::HOST),
        origin: text(header::ORIGIN),
        content_type: text(header::CONTENT_TYPE),
        has_body: chunked || declared_len.is_some_and(|n| n > 0),
        bearer: text(header::AUTHORIZATION).and_then(|h| h.strip_prefix("Bearer ")),
        session: headers
            .get(crate::session::HEADER)
            .and_then(|h| h.to_str().ok()),
    };
    let secret = gate.node.secret.as_deref();
    let verdict = guard::decide(
        secret.is_some(),
        &gate.known_hosts,
        &facts,
        |t| secret.is_some_and(|s| evb_transport::control_token_matches(s, t)),
        |id| gate.sessions.valid(id),
    );
    if let Err((status, why)) = verdict {
        let reason = format!(
            "{status} to {} {} from {}: {why}",
            req.method(),
            req.uri().path(),
            peer.ip()
        );
        let line = gate
            .refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .tick(&reason);
        if let Some(line) = line {
            warn!(
                node = gate.node.id(),
                "control API: refused requests, {line}"
            );
        }
        return error(status, why);
    }
    if declared_len.is_some_and(|n| n > MAX_BODY as u64) {
        return error(413, format!("request body over {MAX_BODY} bytes"));
    }
    if facts_read_only && (chunked || declared_len.is_some_and(|n| n > 0)) {
        // a body to read would keep the connection serving (not to be pushed out) for up
        // to BODY_TIMEOUT: reads carry none
        return error(400, "a GET or HEAD request carries no body");
    }
    let (parts, body) = req.into_parts();
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await
    {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            return error(
                413,
                format!("request body refused (over {MAX_BODY} bytes or broken): {e}"),
            )
        }
        Err(_) => {
            return error(
                408,
                format!(
                    "request body not received within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
            )
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

async fn node_status(State(node): State<Shared>) -> Json<crate::service::NodeReply> {
    Json(node.status())
}

async fn metrics(State(node): State<Shared>, headers: HeaderMap) -> Response {
    let (run, runs_total) = {
        let st = node.lock();
        (st.run, st.runs_total)
    };
    let text = exposition(Scrape {
        node: node.id().to_string(),
        role: node.role_name().to_string(),
        run,
        state: node.run_state(),
        snapshot: node.control.snapshot(),
        runs_total,
    });
    // OpenMetrics to those who ask for it (Prometheus does), the classic text format otherwise
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|h| h.to_str().ok())
        .is_some_and(|a| a.contains("application/openmetrics-text"));
    if openmetrics {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            crate::metrics::classic(&text),
        )
            .into_response()
    }
}

async fn node_start(State(node): State<Shared>, body: Bytes) -> Response {
    // a standby EVM that follows is told to follow each run as the other nodes are
    if node.role() == Role::Evm && (!node.standby || node.controller().is_some()) {
        return error(400, "the EVM starts runs with POST /api/v1/start");
    }
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let start = serde_json::from_value::<crate::replies::NodeStart>(v)
        .ok()
        .filter(|s| (1..=crate::controller::MAX_RUN).contains(&s.run));
    let Some(crate::replies::NodeStart { run, config: text }) = start else {
        return error(400, "start needs {\"run\": N, \"config\": \"<TOML text>\"}");
    };
    let cfg = match node.accept_run_config(&text) {
        Ok(c) => c,
        Err(e) => return error(409, e),
    };
    {
        let mut st = node.lock();
        match st.phase {
            Phase::Idle => {}
            // the same run's start again (the run's start and a restarted BU's rejoin can
            // cross): the node is in it already, and says so as the first answer did
            Phase::Running if st.run == run => {
                return Json(crate::replies::NodeStarted {
                    node: node.id().to_string(),
                    run,
                    phase: Phase::Running,
                })
                .into_response();
            }
            Phase::Running => {
                return error(409, format!("{} is still in run {}", node.id(), st.run))
            }
            Phase::Halted => return error(409, format!("{} is halted", node.id())),
        }
        if node.mode == crate::service::Mode::Once {
            return error(
                409,
                format!("{} runs one run and exits (started by evb run)", node.id()),
            );
        }
        // taken now, so that an abort that follows at once is not lost
        node.control.reset();
        st.phase = Phase::Running;
        st.run = run;
    }
    if node
        .cmds
        .send(Cmd::Start {
            run,
            cfg: Box::new(cfg),
        })
        .is_err()
    {
        return error(503, "the node is shutting down");
    }
    Json(json!({"node": node.id(), "run": run, "phase": "running"})).into_response()
}

async fn node_abort(State(node): State<Shared>, body: Bytes) -> Response {
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let why = v["reason"]
        .as_str()
        .unwrap_or("aborted by the EVM")
        .to_string();
    node.control.abort(why);
    Json(json!({"node": node.id(), "aborting": true})).into_response()
}

/// A standby EVM is told that the EVM is gone (by `evb up`, which saw its process end): it
/// becomes the run control now, or once the run it follows is over.
async fn node_promote(State(node): State<Shared>) -> Response {
    if !node.standby {
        return error(400, format!("{} is not a standby EVM", node.id()));
    }
    let controls = node.controller().is_some();
    if !controls
        && !node
            .promote_after
            .swap(true, std::sync::atomic::Ordering::SeqCst)
    {
        // the node's loop takes it after the run it follows, if it is in one
        let _ = node.cmds.send(Cmd::Promote);
    }
    Json(json!({"node": node.id(), "controls": controls})).into_response()
}

async fn node_halt(State(node): State<Shared>) -> Response {
    if node.role() == Role::Evm && node.controller().is_some() {
        return error(400, "halt the system with POST /api/v1/halt");
    }
    if node.lock().phase == Phase::Running {
        node.control.abort("halted by the EVM");
    }
    let _ = node.cmds.send(Cmd::Halt);
    Json(json!({"node": node.id(), "phase": "halted"})).into_response()
}

async fn run_status(State(node): State<Shared>) -> Response {
    match node.controller() {
        Some(c) => Json(c.status(&node)).into_response(),
        None => not_the_control(&node, "only the EVM serves the run status"),
    }
}

#[derive(serde::Deserialize)]
struct HistoryQuery {
    since: Option<String>,
}

/// The rate history of the run under way (or the last): `?since=<unix s>` for the samples
/// after that time only.
async fn history(
    State(node): State<Shared>,
    q: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Some(c) = node.controller() else {
        return not_the_control(&node, "only the EVM keeps the rate history");
    };
    let Ok(Query(q)) = q else {
        return error(400, "`since` must be a time in unix seconds");
    };
    let since = match q.since.as_deref().map(str::parse::<f64>) {
        None => None,
        Some(Ok(t)) if t.is_finite() => Some(t),
        Some(_) => return error(400, "`since` must be a time in unix seconds"),
    };
    Json(c.history(since)).into_response()
}

/// The RU→BU matrix: bytes sent, their rate, and bytes queued, per link.
async fn links(State(node): State<Shared>) -> Response {
    match node.controller() {
        Some(c) => Json(c.links()).into_response(),
        None => not_the_control(&node, "only the EVM keeps the RU→BU matrix"),
    }
}

/// Prometheus's HTTP service discovery: every node's `/metrics` address with its labels.
async fn scrape_targets(State(node): State<Shared>) -> Response {
    match node.controller() {
        Some(c) => Json(c.scrape_targets(&node)).into_response(),
        None => not_the_control(&node, "only the EVM lists the nodes"),
    }
}

async fn runs(State(node): State<Shared>) -> Response {
    match node.controller() {
        Some(c) => Json(c.runs()).into_response(),
        None => not_the_control(&node, "only the EVM keeps runs"),
    }
}

async fn run_record(State(node): State<Shared>, Path(n): Path<String>) -> Response {
    let Some(c) = node.controller() else {
        return not_the_control(&node, "only the EVM keeps runs");
    };
    let Ok(n) = n.parse::<u64>() else {
        return error(400, format!("{n:?} is not a run number"));
    };
    match c.run_record(n) {
        Some(r) => Json(r).into_response(),
        None => error(404, format!("no run {n}")),
    }
}

/// Decisions from outside: `{"windows": [[begin, end], [begin, end, [source, ...]], ...]}`
/// (ticks; a window over some sources lists their ids), each the next record.
async fn decide(State(node): State<Shared>, body: Bytes) -> Response {
    let Some(c) = node.controller() else {
        return not_the_control(&node, "decisions go to the EVM");
    };
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let windows: Option<Vec<Result<DecisionWindow, String>>> =
        v["windows"].as_array().and_then(|a| {
            a.iter()
                .map(|w| {
                    let (b, e, list) = match w.as_array().map(Vec::as_slice) {
                        Some([b, e]) => (b, e, None),
                        Some([b, e, l]) => (b, e, Some(l.as_array()?)),
                        _ => return None,
                    };
                    let components: Option<Vec<u16>> = list.map_or(Some(Vec::new()), |l| {
                        l.iter()
                            .map(|s| s.as_u64().and_then(|s| u16::try_from(s).ok()))
                            .collect()
                    });
                    Some(DecisionWindow::new(b.as_u64()?, e.as_u64()?, components?))
                })
                .collect()
        });
    let Some(windows) = windows else {
        return error(
            400,
            "decide needs {\"windows\": [[begin, end], ...]}: tick numbers, a pair per decision, \
             and for a window over some sources their ids as a third item ([begin, end, [3, 9]])",
        );
    };
    let windows: Vec<DecisionWindow> = match windows
        .into_iter()
        .enumerate()
        .map(|(i, w)| w.map_err(|e| (i, e)))
        .collect()
    {
        Ok(w) => w,
        Err((i, e)) => return error(400, format!("window {i}: {e}")),
    };
    match c.decide(&windows) {
        Ok(reply) => Json(reply).into_response(),
        Err(r) => error(r.status, r.why),
    }
}

async fn add_bu(State(node): State<Shared>, body: Bytes) -> Response {
    let at_evm = "a spare BU is added at the EVM";
    let usage = "add-bu needs {\"bu\": \"<a spare BU's id>\"}";
    bu_request(&node, at_evm, usage, &body, |c, req| c.add_bu(req))
}

async fn retire(State(node): State<Shared>, body: Bytes) -> Response {
    let at_evm = "a BU is retired at the EVM";
    let usage = "retire needs {\"bu\": \"<its id>\"}";
    bu_request(&node, at_evm, usage, &body, |c, req| c.retire(req))
}

/// A request about one BU (add-bu, retire): at the EVM's control only (`at_evm` says so
/// elsewhere), its body a `Q` (`usage` says what one is), answered by `act`.
fn bu_request<Q, A>(
    node: &Shared,
    at_evm: &str,
    usage: &str,
    body: &Bytes,
    act: impl FnOnce(&crate::controller::Controller, &Q) -> Result<A, crate::controller::Refused>,
) -> Response
where
    Q: serde::de::DeserializeOwned,
    A: serde::Serialize,
{
    let Some(c) = node.controller() else {
        return not_the_control(node, at_evm);
    };
    let v = match parse_body(body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let Ok(req) = serde_json::from_value::<Q>(v) else {
        return error(400, usage);
    };
    match act(c, &req) {
        Ok(reply) => Json(reply).into_response(),
        Err(r) => error(r.status, r.why),
    }
}

async fn command(State(node): State<Shared>, Path(name): Path<String>, body: Bytes) -> Response {
    let Some(c) = node.controller() else {
        return not_the_control(&node, "commands go to the EVM");
    };
    let Some(cmd) = Command::parse(&name) else {
        return error(
            404,
            format!(
                "no command {name:?}; commands: configure, start, pause, resume, stop, halt, reset"
            ),
        );
    };
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    // a command the state refuses is refused as such, before its body is read
    if let Err(r) = c.allowed(cmd) {
        return error(r.status, r.why);
    }
    let req = match crate::replies::Request::parse(cmd, &v) {
        Ok(r) => r,
        Err(r) => return error(r.status, r.why),
    };
    // the controller may call other nodes (halt): not on the runtime's only thread
    let c = c.clone();
    match tokio::task::spawn_blocking(move || c.command(req)).await {
        Ok(Ok(reply)) => Json(reply).into_response(),
        Ok(Err(r)) => error(r.status, r.why),
        Err(e) => error(500, format!("command failed: {e}")),
    }
}

#[derive(serde::Deserialize)]
struct PageQuery {
    token: Option<String>,
}

/// The run page. Opened once as `/?token=<token>` (the URL `evb up` prints when a secret is
/// set), it mints a session (`session.rs`) and redirects to `/#session=<id>`: the token
/// leaves the address bar, the fragment never reaches a server, and the page keeps the
/// session for its tab and origin alone. No cookie (a cookie of earlier versions is
/// cleared).
async fn page(
    State(node): State<Shared>,
    axum::Extension(sessions): axum::Extension<Arc<crate::session::Sessions>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Query(q): Query<PageQuery>,
) -> Response {
    let Some(token) = q.token else {
        return Html(crate::page::PAGE).into_response();
    };
    let valid = node
        .secret
        .as_deref()
        .is_some_and(|s| evb_transport::control_token_matches(s, &token));
    if !valid {
        warn!(
            node = node.id(),
            "control API: the page was opened from {peer} with a wrong token"
        );
        return error(401, "wrong token in the page's URL");
    }
    let api = node.control.api();
    let port = api
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .unwrap_or(0);
    let Some(session) = sessions.mint() else {
        return error(503, "no randomness for a session");
    };
    let clear = format!(
        "{}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict",
        guard::cookie_name(port)
    );
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, clear),
            (header::LOCATION, format!("/#session={session}")),
            (header::CACHE_CONTROL, "no-store".to_string()),
        ],
    )
        .into_response()
}

/// `POST /api/v1/logout`: ends the page session it is sent with (`X-Evb-Session`).
async fn logout(
    axum::Extension(sessions): axum::Extension<Arc<crate::session::Sessions>>,
    headers: HeaderMap,
) -> Response {
    let id = headers
        .get(crate::session::HEADER)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if sessions.revoke(id) {
        Json(json!({"session": "ended"})).into_response()
    } else {
        error(400, "no live session in X-Evb-Session")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    /// A full API pushes out the connection that waited longest without a request (never
    /// one serving a request), from the newcomer's own IP when that IP is at its limit;
    /// an IP whose connections keep being pushed out pushes out no one.
    #[test]
    fn a_newcomer_takes_the_place_of_the_longest_waiting_stranger() {
        let slots = Arc::new(std::sync::Mutex::new(Slots::default()));
        let mut held = Vec::new();
        for k in 0..MAX_CONNECTIONS {
            held.push(Slot::take(&slots, ip(2 + (k % 8) as u8)).unwrap());
        }
        // the first one serves a request: it is never the victim
        held[0]
            .1
            .store(SERVING, std::sync::atomic::Ordering::Relaxed);
        let (_op, op_state, _rx, pushed) = Slot::take(&slots, ip(1)).unwrap();
        assert!(pushed);
        assert_eq!(slots.lock().unwrap().open.len(), MAX_CONNECTIONS);
        // the second-oldest was pushed out (the oldest is serving)
        assert!(held[1].2.try_recv().is_ok());
        assert!(held[0].2.try_recv().is_err());
        op_state.store(SERVING, std::sync::atomic::Ordering::Relaxed);
        // a churning IP: after STRIKES of its connections were pushed out, it pushes out no one
        let churner = ip(2);
        let mut kept = Vec::new();
        while let Some(t) = Slot::take(&slots, churner) {
            // it never finishes a request, as a flood's connections do not
            kept.push(t);
            assert!(kept.len() < 1000, "a churning IP kept pushing out others");
        }
        let s = slots.lock().unwrap();
        assert!(s.struck_out(churner));
        assert!(s.open.len() <= MAX_CONNECTIONS);
        // the operator's connection is still there
        assert!(s.open.values().any(|o| o.ip == ip(1)));
    }
}

//! The HTTP/JSON control API (docs/control.md), served by axum on a thread of its own with a
//! one-thread tokio runtime, so that it never competes with the node's event loop for more
//! than that.
//!
//! Every node: `GET /api/v1/node`, `GET /metrics`, and the calls its EVM makes
//! (`POST /api/v1/node/start|abort|halt`). The EVM also: `GET /api/v1/status`,
//! `POST /api/v1/<command>`, `GET /api/v1/runs[/N]`, and the run page at `/`.
//! Requests from beyond loopback must carry `Authorization: Bearer <token>`, the token
//! derived from the run's secret.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use evb_config::Role;
use serde_json::{json, Value};
use tracing::warn;

use crate::fsm::Command;
use crate::metrics::{exposition, Scrape};
use crate::service::{parse_listen, Cmd, Node, Phase};

type Shared = Arc<Node>;

/// Largest request body accepted (a configuration file fits many times over).
const MAX_BODY: usize = 1 << 20;

fn error(status: u16, msg: impl Into<String>) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    (code, Json(json!({ "error": msg.into() }))).into_response()
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
                let svc = app.into_make_service_with_connect_info::<SocketAddr>();
                if let Err(e) = axum::serve(listener, svc).await {
                    warn!("control API stopped: {e}");
                }
            });
        })
        .map_err(|e| e.to_string())?;
    Ok(bound)
}

fn router(node: Shared) -> Router {
    let mut r = Router::new()
        .route("/api/v1/node", get(node_status))
        .route("/metrics", get(metrics))
        .route("/api/v1/node/start", post(node_start))
        .route("/api/v1/node/abort", post(node_abort))
        .route("/api/v1/node/halt", post(node_halt));
    if node.role() == Role::Evm {
        r = r
            .route("/", get(page))
            .route("/api/v1/status", get(run_status))
            .route("/api/v1/runs", get(runs))
            .route("/api/v1/runs/{n}", get(run_record))
            .route("/api/v1/{command}", post(command));
    } else {
        r = r.route("/api/v1/status", get(node_status));
    }
    r.fallback(|| async { error(404, "no such API path (see docs/control.md)") })
        .method_not_allowed_fallback(|| async {
            error(
                405,
                "wrong method for this path: commands are POST, status and records GET",
            )
        })
        .layer(middleware::from_fn_with_state(node.clone(), authorize))
        .with_state(node)
}

/// Loopback callers are trusted like the data ports on loopback; anyone else must show the
/// token derived from the run's secret (and without a secret, nobody else gets in).
async fn authorize(
    State(node): State<Shared>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    if peer.ip().is_loopback() {
        return next.run(req).await;
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "));
    match (&node.secret, presented) {
        (Some(secret), Some(t)) if evb_transport::control_token_matches(secret, t) => {
            next.run(req).await
        }
        (None, _) => error(
            403,
            "this API takes requests from beyond loopback only with run.secret set",
        ),
        _ => {
            warn!(
                node = node.id(),
                "control API: request from {peer} without a valid token refused"
            );
            error(401, "a valid bearer token is required from beyond loopback (derived from run.secret: `evb ctl` computes it)")
        }
    }
}

async fn node_status(State(node): State<Shared>) -> Json<Value> {
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
    if node.role() == Role::Evm {
        return error(400, "the EVM starts runs with POST /api/v1/start");
    }
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let (Some(run), Some(text)) = (v["run"].as_u64(), v["config"].as_str()) else {
        return error(400, "start needs {\"run\": N, \"config\": \"<TOML text>\"}");
    };
    if body.len() > MAX_BODY {
        return error(413, "request body too large");
    }
    let cfg = match node.accept_run_config(text) {
        Ok(c) => c,
        Err(e) => return error(409, e),
    };
    {
        let mut st = node.lock();
        match st.phase {
            Phase::Idle => {}
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

async fn node_halt(State(node): State<Shared>) -> Response {
    if node.role() == Role::Evm {
        return error(400, "halt the system with POST /api/v1/halt");
    }
    if node.lock().phase == Phase::Running {
        node.control.abort("halted by the EVM");
    }
    let _ = node.cmds.send(Cmd::Halt);
    Json(json!({"node": node.id(), "phase": "halted"})).into_response()
}

async fn run_status(State(node): State<Shared>) -> Response {
    match &node.controller {
        Some(c) => Json(c.status(&node)).into_response(),
        None => error(404, "only the EVM serves the run status"),
    }
}

async fn runs(State(node): State<Shared>) -> Response {
    match &node.controller {
        Some(c) => Json(c.runs()).into_response(),
        None => error(404, "only the EVM keeps runs"),
    }
}

async fn run_record(State(node): State<Shared>, Path(n): Path<String>) -> Response {
    let Some(c) = &node.controller else {
        return error(404, "only the EVM keeps runs");
    };
    let Ok(n) = n.parse::<u64>() else {
        return error(400, format!("{n:?} is not a run number"));
    };
    match c.run_record(n) {
        Some(r) => Json(r).into_response(),
        None => error(404, format!("no run {n}")),
    }
}

async fn command(State(node): State<Shared>, Path(name): Path<String>, body: Bytes) -> Response {
    let Some(c) = &node.controller else {
        return error(404, "commands go to the EVM");
    };
    let Some(cmd) = Command::parse(&name) else {
        return error(
            404,
            format!(
                "no command {name:?}; commands: configure, start, pause, resume, stop, halt, reset"
            ),
        );
    };
    if body.len() > MAX_BODY {
        return error(413, "request body too large");
    }
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    // the controller may call other nodes (halt): not on the runtime's only thread
    let c = c.clone();
    match tokio::task::spawn_blocking(move || c.command(cmd, &v)).await {
        Ok(Ok(reply)) => Json(reply).into_response(),
        Ok(Err((status, msg))) => error(status, msg),
        Err(e) => error(500, format!("command failed: {e}")),
    }
}

async fn page() -> Html<&'static str> {
    Html(crate::page::PAGE)
}

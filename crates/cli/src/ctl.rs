//! `evb ctl`: the operator's commands to a running system, over the EVM's control API.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use evb_builder::NodeEvent;
use evb_config::Config;
use evb_control::client::{Api, CallErrorKind, Reply};
use evb_control::fsm::State;
use evb_control::replies::{CommandReply, Status};
use evb_control::RunRecord;
use evb_wire::window::DecisionWindow;
use serde_json::{json, Value};

#[derive(Args)]
pub struct CtlArgs {
    /// The EVM's control API (host:port or http://host:port). Default: EVB_URL, else the
    /// EVM's `control` address in --config, else the URL `evb up` left for this run id.
    #[arg(long, global = true)]
    url: Option<String>,
    /// The run's configuration: where the EVM is, and the secret for the bearer token
    /// (EVB_SECRET also works).
    #[arg(long, short, global = true)]
    config: Option<PathBuf>,
    /// Write the API's JSON to FILE, the table still printed; `-` (or `--json` alone, put
    /// last or before another option): the JSON on stdout instead of the table.
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        num_args = 0..=1,
        default_missing_value = "-"
    )]
    json: Option<PathBuf>,
    #[command(subcommand)]
    cmd: CtlCmd,
}

#[cfg(test)]
impl CtlArgs {
    /// --json.
    pub fn json(&self) -> Option<&Path> {
        self.json.as_deref()
    }
}

#[derive(Subcommand)]
enum CtlCmd {
    /// The run state, run number and every node's state, events, rates, credits, errors.
    Status,
    /// Change run parameters (events, duration, rate, sizes, sink...) for the next run.
    Configure {
        /// A configuration file; keys that need a restart (nodes, transport) are refused.
        file: PathBuf,
    },
    /// Start a run (the next number, or --run N).
    Start {
        /// The run number (default: one more than the last run's).
        #[arg(long)]
        run: Option<u64>,
        #[command(flatten)]
        wait: WaitFlag,
    },
    /// Stop triggering; events in flight are still built.
    Pause,
    /// Trigger again after a pause.
    Resume,
    /// End the run: no new events, every event in flight built and released.
    Stop(WaitFlag),
    /// Every node process exits.
    Halt(WaitFlag),
    /// Abort the run (or clear a failure) and return to ready.
    Reset(WaitFlag),
    /// Trigger decisions from outside (a run with windows.outside = true): each `BEGIN END`
    /// pair of ticks, or each line `begin end [sources]` of --file, is the window of the
    /// run's next record, in order.
    Decide {
        /// Window bounds in ticks: BEGIN END [BEGIN END ...].
        ticks: Vec<u64>,
        /// The windows given as ticks read only these sources (ids separated by commas,
        /// e.g. 3,9); the others send an EMPTY fragment. Default: every source.
        #[arg(long, conflicts_with = "file")]
        components: Option<String>,
        /// A file of decisions, a line `begin end` or `begin end 3,9` each (docs/formats.md
        /// §8).
        #[arg(long, conflicts_with = "ticks")]
        file: Option<PathBuf>,
    },
    /// Start a spare BU (topology.spare_bus, [[bu]] spare): `evb up` starts its process,
    /// and it joins the run under way, given events from then on (docs/control.md).
    AddBu {
        /// The spare BU's id (bu2).
        bu: String,
        /// Return only once it has joined the run under way (between runs: once it is up;
        /// exit 1 if the run ended first).
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this long (exit code 2). [seconds, or with a unit]
        #[arg(long, default_value_t = 60.0, requires = "wait", value_parser = crate::duration::secs)]
        timeout: f64,
    },
    /// Retire a BU from the run under way: it is given no more events and leaves once all
    /// it holds is final, its counts in the run's report (docs/control.md).
    Retire {
        /// The BU's id (bu1).
        bu: String,
        /// Return only once it has left the run (exit 1 if the run ended first or it was
        /// lost instead).
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this long (exit code 2). [seconds, or with a unit]
        #[arg(long, default_value_t = 600.0, requires = "wait", value_parser = crate::duration::secs)]
        timeout: f64,
    },
    /// Every run's record, or run N's with its full report.
    Runs {
        /// A run number: that run's record with its full report.
        run: Option<u64>,
    },
    /// Wait until the run state is STATE (default: ready); with a run number, until that
    /// run is over, then exit 0 only if its verdict is clean.
    Wait {
        /// The run state to wait for (ready, running, paused, failed...; see `evb ctl status`).
        #[arg(long, default_value = "ready")]
        state: String,
        /// Wait instead until run N is over (complete, failed or aborted); exit 0 only if
        /// its verdict is clean.
        #[arg(long)]
        run: Option<u64>,
        /// Give up after this long (exit code 2). [seconds, or with a unit: 500ms, 2m]
        #[arg(long, default_value_t = 600.0, value_parser = crate::duration::secs)]
        timeout: f64,
    },
}

/// `--wait` of the commands that pass through a transient state (starting, stopping).
#[derive(Args, Clone, Copy)]
pub struct WaitFlag {
    /// Return only once the command has taken effect: the run state is a resting one again
    /// (not starting or stopping; for halt: the EVM no longer answers). Exit 1 if it comes
    /// to rest in failed.
    #[arg(long)]
    wait: bool,
    /// With --wait: give up after this long (exit code 2). [seconds, or with a unit: 500ms, 2m]
    #[arg(
        long,
        default_value_t = 600.0,
        requires = "wait",
        value_name = "SECONDS",
        value_parser = crate::duration::secs
    )]
    timeout: f64,
}

/// The configuration a client command was given (`--config`), and the run's secret: from
/// it, or from `EVB_SECRET` without one.
pub(crate) fn config_and_secret(
    path: Option<&std::path::Path>,
) -> Result<(Option<Config>, Option<String>), String> {
    let cfg = match path {
        Some(p) => Some(Config::from_file(p).map_err(|e| e.to_string())?),
        None => None,
    };
    let secret = cfg
        .as_ref()
        .and_then(|c| c.secret())
        .or_else(|| std::env::var("EVB_SECRET").ok().filter(|s| !s.is_empty()));
    Ok((cfg, secret))
}

/// Where `evb up` says the control of this configuration's run id is now, if it says so.
fn moved_to(a: &CtlArgs) -> Option<Api> {
    let (cfg, secret) = config_and_secret(a.config.as_deref()).ok()?;
    let run_id = cfg
        .as_ref()
        .map_or_else(|| Config::default().run.id, |c| c.run.id.clone());
    let url = crate::state_dir::read(&crate::up::url_file(&run_id)).ok()??;
    let token = secret.map(|s| evb_control::control_token(s.as_bytes()));
    Some(Api::new(url.trim(), token))
}

fn resolve(a: &CtlArgs) -> Result<Api, String> {
    let (cfg, secret) = config_and_secret(a.config.as_deref())?;
    let token = secret.map(|s| evb_control::control_token(s.as_bytes()));
    let from_cfg = cfg.as_ref().and_then(|c| {
        let evm = c.nodes().into_iter().next()?;
        (!evm.control.ends_with(":0")).then_some(evm.control)
    });
    let run_id = cfg
        .as_ref()
        .map_or_else(|| Config::default().run.id, |c| c.run.id.clone());
    // read only when the URL is needed: a refused file is an error then, never a silent miss;
    // and trusted only once the control there proves it is this run id's (a file left by an
    // `evb up` that did not end in order may name an address that is now another's)
    let from_up = || -> Result<Option<String>, String> {
        let Some(url) =
            crate::state_dir::read(&crate::up::url_file(&run_id))?.map(|s| s.trim().to_string())
        else {
            return Ok(None);
        };
        let probe = Api::new(&url, token.clone()).with_timeout(std::time::Duration::from_secs(3));
        crate::up::proven(&probe, &run_id).map_err(|why| {
            format!(
                "the URL file of `evb up` for run id {run_id:?} names {url}, but {why}: it is \
                 not this run's control (a file left by an `evb up` that did not end in order); \
                 give --url or --config, or start `evb up` again"
            )
        })?;
        Ok(Some(url))
    };
    let url = match a
        .url
        .clone()
        .or_else(|| std::env::var("EVB_URL").ok().filter(|s| !s.is_empty()))
        .or(from_cfg)
    {
        Some(u) => u,
        None => from_up()?.ok_or_else(|| {
            format!(
                "where is the EVM? give --url, set EVB_URL, or --config with the EVM's control address (no `evb up` of run id {run_id:?} found)"
            )
        })?,
    };
    Ok(Api::new(&url, token))
}

/// The control to talk to: `resolve`'s, unless `evb up` says the control moved (its URL
/// file names another address) and the one resolved does not answer or is an EVM that a
/// standby fenced: a standby that took the run over is the control now, and the old EVM's
/// word is not the run's.
fn follow(a: &CtlArgs, api: Api) -> Api {
    // a standby EVM where the control was says where the control it follows is now (a
    // second takeover may have moved it again: a few hops at most)
    let mut api = api;
    for _ in 0..3 {
        let Some(to) = pointed(&api) else {
            break;
        };
        eprintln!(
            "evb ctl: the control moved to {} ({} is a standby EVM that follows it)",
            to.base, api.base
        );
        api = to;
    }
    let Some(moved) = moved_to(a) else {
        return api;
    };
    if moved.base == api.base {
        return api;
    }
    let why = match api.get("/api/v1/status") {
        Err(e) => format!("{} does not answer: {e}", api.base),
        Ok(r) if !r.ok() => format!("{} has no run control: {}", api.base, r.error()),
        Ok(r) => match r.typed::<Status>("status").map(|s| s.evm.fenced) {
            Ok(Some(epoch)) => format!("the EVM at {} was fenced by epoch {epoch}", api.base),
            Ok(None) => return api,
            Err(e) => format!("{}: {e}", api.base),
        },
    };
    eprintln!("evb ctl: the control moved to {} ({why})", moved.base);
    moved
}

/// Where the node at `api` says the run control is, if it is a standby EVM without it.
fn pointed(api: &Api) -> Option<Api> {
    let r = api.get("/api/v1/status").ok()?;
    if r.ok() || r.status != 404 {
        return None;
    }
    let to = r.body["control"].as_str()?;
    let to = Api::new(to, api.token.clone());
    (to.base != api.base).then_some(to)
}

/// Runs the command; the exit code is 0 on success, 1 when refused or failed.
pub fn run(a: &CtlArgs) -> Result<bool, String> {
    let api = follow(a, resolve(a)?);
    let reply = match &a.cmd {
        CtlCmd::Status => api.get("/api/v1/status")?,
        CtlCmd::Configure { file } => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            api.post("/api/v1/configure", &json!({ "config": text }))?
        }
        CtlCmd::Start { run, .. } => api.post("/api/v1/start", &json!({ "run": run }))?,
        CtlCmd::Pause => api.post("/api/v1/pause", &json!({}))?,
        CtlCmd::Resume => api.post("/api/v1/resume", &json!({}))?,
        CtlCmd::Stop(_) => api.post("/api/v1/stop", &json!({}))?,
        CtlCmd::Halt(_) => api.post("/api/v1/halt", &json!({}))?,
        CtlCmd::Reset(_) => api.post("/api/v1/reset", &json!({}))?,
        CtlCmd::Decide {
            ticks,
            components,
            file,
        } => {
            let windows = decisions(ticks, components.as_deref(), file.as_deref())?;
            let reply = api.post("/api/v1/decide", &json!({ "windows": windows }))?;
            if let Some(p) = &a.json {
                crate::json_out::write(p, &reply.body)?;
            }
            if !reply.ok() {
                eprintln!("evb ctl: refused ({}): {}", reply.status, reply.error());
                return Ok(false);
            }
            let r: evb_control::replies::DecideReply = reply.typed("decide")?;
            if !a.json.as_deref().is_some_and(crate::json_out::is_stdout) {
                println!("decide: {} decisions to run {}", r.accepted, r.run);
            }
            return Ok(true);
        }
        CtlCmd::AddBu { bu, wait, timeout } => {
            let Some((r, words)) =
                bu_request::<evb_control::replies::AddBuReply>(&api, a, "add-bu", bu)?
            else {
                return Ok(false);
            };
            if words {
                match r.run {
                    Some(n) => println!(
                        "add-bu: {} is starting; it joins run {n} once it is up",
                        r.bu
                    ),
                    None => println!(
                        "add-bu: {} is starting; it takes part from the next run",
                        r.bu
                    ),
                }
                println!(
                    "add-bu: `evb up` starts it; started by other means, run on its host: {}",
                    r.start
                );
            }
            return waited(*wait, words, "add-bu", || joined(&api, &r, *timeout));
        }
        CtlCmd::Retire { bu, wait, timeout } => {
            let Some((r, words)) =
                bu_request::<evb_control::replies::RetireReply>(&api, a, "retire", bu)?
            else {
                return Ok(false);
            };
            if words {
                println!("retire: {} is retiring from run {}", r.bu, r.run);
            }
            return waited(*wait, words, "retire", || retired(&api, &r, *timeout));
        }
        CtlCmd::Runs { run: None } => api.get("/api/v1/runs")?,
        CtlCmd::Runs { run: Some(n) } => api.get(&format!("/api/v1/runs/{n}"))?,
        CtlCmd::Wait {
            state,
            run,
            timeout,
        } => {
            // a standby that took the control over: `evb up` rewrites where it is (its
            // file first: the configuration names the EVM's address, not the standby's)
            let again = || moved_to(a).or_else(|| resolve(a).ok().map(|api| follow(a, api)));
            return wait(api, &again, a.json.as_deref(), state, *run, *timeout);
        }
    };
    let wait_flag = match &a.cmd {
        CtlCmd::Start { wait, .. }
        | CtlCmd::Stop(wait)
        | CtlCmd::Halt(wait)
        | CtlCmd::Reset(wait)
            if wait.wait && reply.ok() =>
        {
            Some(*wait)
        }
        _ => None,
    };
    let words = !a.json.as_deref().is_some_and(crate::json_out::is_stdout);
    if let Some(w) = wait_flag {
        if words {
            print_reply(&a.cmd, &reply.typed(command_name(&a.cmd))?);
        }
        let halt = matches!(a.cmd, CtlCmd::Halt(_));
        return settle(&api, a.json.as_deref(), halt, w.timeout);
    }
    if let Some(p) = &a.json {
        crate::json_out::write(p, &reply.body)?;
    }
    if !reply.ok() {
        eprintln!("evb ctl: refused ({}): {}", reply.status, reply.error());
    } else if words {
        match &a.cmd {
            CtlCmd::Status => print_status(&reply.typed("status")?),
            CtlCmd::Runs { run: None } => print_runs(&reply.typed::<Vec<RunRecord>>("runs")?),
            CtlCmd::Runs { run: Some(_) } => print_run(&reply.typed("runs N")?),
            _ => print_reply(&a.cmd, &reply.typed(command_name(&a.cmd))?),
        }
    }
    let ok = reply.ok()
        && match &a.cmd {
            CtlCmd::Runs { run: Some(_) } => {
                reply.typed::<RunRecord>("runs N")?.end.is_none_or(|e| e.ok)
            }
            _ => true,
        };
    Ok(ok)
}

/// `evb ctl decide`'s windows, as the control API takes them (`[begin, end]`, or `[begin,
/// end, [sources]]`): pairs of ticks from the command line over `components`, or a file's
/// lines.
fn decisions(
    ticks: &[u64],
    components: Option<&str>,
    file: Option<&std::path::Path>,
) -> Result<Vec<Value>, String> {
    let entry = |w: &DecisionWindow| {
        if w.components.is_empty() {
            json!([w.begin, w.end])
        } else {
            json!([w.begin, w.end, w.components])
        }
    };
    if let Some(f) = file {
        let list = evb_node::setup::read_decisions(f)?;
        return Ok(list.iter().map(entry).collect());
    }
    if ticks.is_empty() || !ticks.len().is_multiple_of(2) {
        return Err("decide needs pairs of ticks, BEGIN END [BEGIN END ...], or --file".into());
    }
    let components = match components {
        Some(c) => DecisionWindow::parse_components(c).map_err(|e| format!("--components: {e}"))?,
        None => Vec::new(),
    };
    ticks
        .chunks(2)
        .map(|p| {
            DecisionWindow::new(p[0], p[1], components.clone())
                .map(|w| entry(&w))
                .map_err(|e| format!("window [{}, {}): {e}", p[0], p[1]))
        })
        .collect()
}

/// A command's reply, as a line: `stop: state stopping, run 7`.
fn print_reply(c: &CtlCmd, r: &CommandReply) {
    println!(
        "{}: state {}, run {}{}",
        command_name(c),
        r.state.name(),
        r.run,
        r.changed
            .as_ref()
            .map(|c| format!(
                ", changed: {}",
                if c.is_empty() {
                    "nothing".into()
                } else {
                    c.join(", ")
                }
            ))
            .unwrap_or_default()
    );
}

fn command_name(c: &CtlCmd) -> &'static str {
    match c {
        CtlCmd::Configure { .. } => "configure",
        CtlCmd::Start { .. } => "start",
        CtlCmd::Pause => "pause",
        CtlCmd::Resume => "resume",
        CtlCmd::Stop(_) => "stop",
        CtlCmd::Halt(_) => "halt",
        CtlCmd::Reset(_) => "reset",
        _ => "",
    }
}

/// The states a command passes through on its way to a resting one.
fn transient(state: State) -> bool {
    matches!(state, State::Starting | State::Stopping)
}

/// `--wait`: polls the status until the run state is a resting one (or, after `halt`, until
/// the EVM no longer answers), says which, and is true unless it is `failed`.
fn settle(api: &Api, json_out: Option<&Path>, halt: bool, timeout: f64) -> Result<bool, String> {
    let words = !json_out.is_some_and(crate::json_out::is_stdout);
    let until = Instant::now() + Duration::from_secs_f64(timeout.max(0.0));
    loop {
        let r = match api.get("/api/v1/status") {
            Ok(r) => r,
            // the EVM's process has exited (or is closing): what halt was waited for
            Err(e) if halt && e.kind != CallErrorKind::Timeout => {
                if let Some(p) = json_out {
                    crate::json_out::write(p, &json!({ "state": "halted", "answering": false }))?;
                }
                if words {
                    println!("halted: the EVM no longer answers");
                }
                return Ok(true);
            }
            Err(e) if !halt => return Err(e.to_string()),
            Err(_) => {
                if Instant::now() > until {
                    return Err(format!(
                        "gave up after {timeout} s: the EVM still answers (slowly)"
                    ));
                }
                continue;
            }
        };
        let s: Status = r.typed("status")?;
        if !transient(s.state) && !halt {
            if let Some(p) = json_out {
                crate::json_out::write(p, &r.body)?;
            }
            if words {
                println!("state {}, run {}{}", s.state.name(), s.run, because(&s));
            }
            return Ok(s.state != State::Failed);
        }
        if Instant::now() > until {
            return Err(gave_up(timeout, &s));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `: <why the last run failed>`, or nothing.
fn because(s: &Status) -> String {
    s.reason
        .as_deref()
        .map(|r| format!(": {r}"))
        .unwrap_or_default()
}

fn gave_up(timeout: f64, s: &Status) -> String {
    format!(
        "gave up after {timeout} s: state is {}{}",
        s.state.name(),
        s.reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    )
}

/// How long `wait` keeps trying a control that does not answer, for a standby to take it
/// over (the takeover's wait is at most a few heartbeat timeouts).
const FOLLOW_SWITCH_S: u64 = 15;

/// `evb ctl wait`: until the run state is `state`, or run `run` is over (its record's
/// verdict decides the exit code). A control that stops answering, or that a standby
/// fenced, is looked for again where `again` says it is now.
fn wait(
    mut api: Api,
    again: &dyn Fn() -> Option<Api>,
    json_out: Option<&Path>,
    state: &str,
    run: Option<u64>,
    timeout: f64,
) -> Result<bool, String> {
    let until = Instant::now() + Duration::from_secs_f64(timeout.max(0.0));
    let mut silent_since: Option<Instant> = None;
    let moved = |api: &mut Api| match again() {
        Some(a) if a.base != api.base => {
            eprintln!("evb ctl: the control moved to {}", a.base);
            *api = a;
            true
        }
        _ => false,
    };
    loop {
        let r: Reply = match api.get("/api/v1/status") {
            Ok(r) => {
                silent_since = None;
                r
            }
            Err(e) => {
                if moved(&mut api) {
                    continue;
                }
                let since = *silent_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(FOLLOW_SWITCH_S) || Instant::now() > until
                {
                    return Err(e.to_string());
                }
                std::thread::sleep(Duration::from_millis(250));
                continue;
            }
        };
        // a node without run control answers where the control was (a new standby, after
        // a takeover): look where the control went
        let s: Status = match (r.ok(), r.typed::<Status>("status")) {
            (true, Ok(s)) => s,
            (_, read) => {
                if moved(&mut api) {
                    continue;
                }
                return Err(read.err().unwrap_or_else(|| r.error()));
            }
        };
        let done: Option<(Value, Option<RunRecord>)> = match run {
            Some(n) => {
                let rec = api
                    .get(&format!("/api/v1/runs/{n}"))
                    .ok()
                    .filter(|r| r.ok())
                    .map(|r| r.typed::<RunRecord>("runs N").map(|rec| (r.body, rec)))
                    .transpose()?;
                match rec {
                    // a fenced EVM's record is not the run's: look where the control went
                    Some((_, rec)) if rec.state == "fenced" => {
                        moved(&mut api);
                        None
                    }
                    Some((body, rec))
                        if matches!(
                            rec.state.as_str(),
                            "complete" | "failed" | "aborted" | "unknown"
                        ) =>
                    {
                        Some((body, Some(rec)))
                    }
                    _ => None,
                }
            }
            None => (s.state.name() == state).then(|| (r.body.clone(), None)),
        };
        if let Some((body, rec)) = done {
            if let Some(p) = json_out {
                crate::json_out::write(p, &body)?;
            }
            let words = !json_out.is_some_and(crate::json_out::is_stdout);
            match &rec {
                Some(rec) if words => print_run(rec),
                None if words => println!("state {}, run {}", s.state.name(), s.run),
                _ => {}
            }
            return Ok(rec.is_none_or(|r| r.end.as_ref().is_some_and(|e| e.ok)));
        }
        if Instant::now() > until {
            return Err(gave_up(timeout, &s));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A count that may be unknown (`-`).
fn num<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |n| n.to_string())
}

fn print_status(s: &Status) {
    println!(
        "run {}  state {}{}   (allowed: {})",
        s.run,
        s.state.name(),
        because(s),
        s.legal.join(", ")
    );
    if let Some(epoch) = s.evm.fenced {
        println!(
            "this EVM was fenced by epoch {epoch}: the nodes follow a standby, whose control \
             holds the run's verdict"
        );
    }
    let t = &s.totals;
    println!(
        "built {} events | {:.0} ev/s | {:.3} GB/s | in flight {} | credits free {}{}{}",
        t.events_built,
        t.rate_hz,
        t.bytes_per_s / 1e9,
        num(s.evm.in_flight),
        num(s.evm.credits_available),
        if s.evm.paused == Some(true) {
            " | paused"
        } else {
            ""
        },
        ending(s.evm.stop_stages.as_deref().unwrap_or_default())
    );
    if let Some(l) = s.trigger_latency.as_ref().filter(|l| l.count > 0) {
        // every event released, a lost BU's included: the EVM's clock, trigger to release
        println!(
            "latency from trigger to release (the EVM's clock): {} events, p50 {} us, p99 {} us",
            l.count,
            num(l.p50_us),
            num(l.p99_us)
        );
    }
    print_node_events(s.evm.lost.as_deref().unwrap_or_default());
    println!(
        "{:<10} {:<4} {:<12} {:>12} {:>10} {:>8} {:>8} {:>7}  note",
        "node", "role", "state", "events", "ev/s", "GB/s", "credits", "errors"
    );
    for n in &s.nodes {
        let note = n.error.clone().unwrap_or_else(|| match &n.last {
            Some(l) if !l.ok => format!("run {}: {}", l.run, l.reason),
            // a run built by time: the RU's latency buffer, the BU's degraded windows
            _ => n.by_time.clone().unwrap_or_default(),
        });
        println!(
            "{:<10} {:<4} {:<12} {:>12} {:>10.0} {:>8.3} {:>8} {:>7}  {}",
            n.node,
            n.role.name(),
            n.state,
            n.events,
            n.rate_hz,
            n.bytes_per_s / 1e9,
            num(n.credits),
            n.errors,
            note
        );
    }
}

/// Posts request `what` (add-bu, retire: `POST /api/v1/<what>`) about BU `bu` and reads
/// its typed answer, with whether words go to stdout (not when `--json` writes there);
/// `None` when the control refused it (said on stderr). `--json` gets the body either way.
fn bu_request<R: serde::de::DeserializeOwned>(
    api: &Api,
    a: &CtlArgs,
    what: &str,
    bu: &str,
) -> Result<Option<(R, bool)>, String> {
    let reply = api.post(&format!("/api/v1/{what}"), &json!({ "bu": bu }))?;
    if let Some(p) = &a.json {
        crate::json_out::write(p, &reply.body)?;
    }
    if !reply.ok() {
        eprintln!("evb ctl: refused ({}): {}", reply.status, reply.error());
        return Ok(None);
    }
    let words = !a.json.as_deref().is_some_and(crate::json_out::is_stdout);
    Ok(Some((reply.typed(what)?, words)))
}

/// With `--wait`, the outcome `until` waits for (said in words after `what:`); without it,
/// success.
fn waited(
    wait: bool,
    words: bool,
    what: &str,
    until: impl FnOnce() -> Result<(bool, String), String>,
) -> Result<bool, String> {
    if !wait {
        return Ok(true);
    }
    let (ok, said) = until()?;
    if words {
        println!("{what}: {said}");
    }
    Ok(ok)
}

/// Waits until the spare BU of `r` has joined run `r.run` (the EVM's node events say
/// `joined`), or, between runs, until its process answers: (true, words) then; (false, why)
/// if the run ended first. An error after `timeout` seconds.
fn joined(
    api: &Api,
    r: &evb_control::replies::AddBuReply,
    timeout: f64,
) -> Result<(bool, String), String> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs_f64(timeout);
    loop {
        let s: Status = api.get("/api/v1/status")?.typed("status")?;
        match r.run {
            Some(run) => {
                let events = s.evm.lost.clone().unwrap_or_default();
                let joined = events
                    .iter()
                    .find(|e| e.node == r.node && e.kind == evb_builder::NodeEventKind::Joined);
                if let (true, Some(e)) = (s.run == run, joined) {
                    return Ok((true, e.to_string()));
                }
                if s.run != run || !matches!(s.state.name(), "running" | "paused") {
                    return Ok((false, format!("run {run} ended before {} joined it", r.bu)));
                }
            }
            None => {
                let row = s.nodes.iter().find(|n| n.node == r.bu);
                if let Some(n) = row.filter(|n| n.state == "idle") {
                    return Ok((true, format!("{} is up ({})", r.bu, n.state)));
                }
            }
        }
        if std::time::Instant::now() >= until {
            return Err(format!("{} has not joined after {timeout} s", r.bu));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Waits until the retiring BU of `r` has left run `r.run` (the EVM's node events say
/// `retired`): (true, words) then; (false, why) if it was lost instead or the run ended
/// first. An error after `timeout` seconds.
fn retired(
    api: &Api,
    r: &evb_control::replies::RetireReply,
    timeout: f64,
) -> Result<(bool, String), String> {
    let name = &r.node;
    let until = std::time::Instant::now() + std::time::Duration::from_secs_f64(timeout);
    loop {
        let reply = api.get("/api/v1/status")?;
        let s: Status = reply.typed("status")?;
        let events = s.evm.lost.clone().unwrap_or_default();
        let mine =
            |k: evb_builder::NodeEventKind| events.iter().find(|e| e.node == *name && e.kind == k);
        if let Some(e) = mine(evb_builder::NodeEventKind::Retired) {
            return Ok((true, e.to_string()));
        }
        if let Some(e) = mine(evb_builder::NodeEventKind::RetireCalledOff) {
            return Ok((false, e.to_string()));
        }
        if let Some(e) = events.iter().find(|e| e.node == *name && e.kind.is_loss()) {
            return Ok((false, format!("{} was lost instead: {e}", r.bu)));
        }
        if s.run != r.run || !matches!(s.state.name(), "running" | "paused") {
            return Ok((
                false,
                format!("run {} ended before {} left it", r.run, r.bu),
            ));
        }
        if std::time::Instant::now() >= until {
            return Err(format!(
                "{} has not left run {} after {timeout} s",
                r.bu, r.run
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The stages of a run's end reached so far, for the header (` | ending: drained at
/// 10.02 s`), or nothing while it is not ending.
fn ending(stages: &[evb_builder::StopStageAt]) -> String {
    stages
        .last()
        .map(|s| format!(" | ending: {} at {:.2} s", s.stage.name(), s.at_s))
        .unwrap_or_default()
}

/// Each stage of a run's end with when it was reached, in words.
fn stages_line(stages: &[evb_builder::StopStageAt]) -> String {
    stages
        .iter()
        .map(|s| format!("{} at {:.3} s", s.stage.name(), s.at_s))
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_runs(v: &[RunRecord]) {
    println!(
        "{:>5} {:<9} {:>12} {:>8}  reason",
        "run", "state", "events", "wall s"
    );
    for r in v {
        let end = r.end.as_ref();
        println!(
            "{:>5} {:<9} {:>12} {:>8.1}  {}",
            r.run,
            r.state,
            num(end.map(|e| e.events_built)),
            end.map_or(0.0, |e| e.wall_s),
            end.map_or("", |e| e.reason.as_str())
        );
    }
}

fn print_run(r: &RunRecord) {
    let end = r.end.as_ref();
    println!(
        "run {}: {} - {}",
        r.run,
        r.state,
        end.map_or("", |e| e.reason.as_str())
    );
    // a run's bytes are the BUs' own counts: not known without every BU's report
    let bytes = match (end, end.and_then(|e| e.payload_bytes_built)) {
        (_, Some(b)) => format!("{b} payload bytes"),
        (Some(_), None) => "payload bytes not known (a BU's count is missing: lost with it, or the run ended without its report)".into(),
        (None, None) => "payload bytes -".into(),
    };
    println!(
        "triggered {}, built {} events, {bytes}, {} s",
        num(end.and_then(|e| e.triggered)),
        num(end.map(|e| e.events_built)),
        num(end.and_then(|e| e.seconds))
    );
    let stages = end
        .and_then(|e| e.report.as_ref())
        .and_then(|r| r.run.as_ref())
        .map(|r| r.evm.stop_stages.clone())
        .unwrap_or_default();
    if !stages.is_empty() {
        println!("its end: {}", stages_line(&stages));
    }
    for p in end.map(|e| e.verdict.as_slice()).unwrap_or_default() {
        println!("problem: {p}");
    }
    print_node_events(end.and_then(|e| e.lost.as_deref()).unwrap_or_default());
}

/// The EVM's node events (`evm.lost`, a run's `lost`): a loss as `lost: ...`, a rejoin or a
/// refused report (no loss) as `node event: ...`.
fn print_node_events(events: &[NodeEvent]) {
    for e in events {
        if e.kind.is_loss() {
            println!("lost: {e}");
        } else {
            println!("node event: {e}");
        }
    }
}

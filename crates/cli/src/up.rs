//! `evb up`: start every node of the configuration on this host and keep them up, idle,
//! for runs started with `evb ctl` (or the run page). Nodes that die are started again;
//! `evb ctl halt` (or Ctrl-C) takes everything down.

use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use evb_config::{Config, Role, TransportKind};
use evb_control::client::Api;
use evb_control::fsm::State;
use serde_json::json;

use crate::launch::{self, Note};

/// The name of the file, in the user's private state directory (`state_dir`), where `evb
/// up` leaves the control URL of a configuration's run id for `evb ctl`.
pub fn url_file(run_id: &str) -> String {
    crate::state_dir::url_name(run_id)
}

/// The least time an EVM's control API may stay silent before `evb up` has its standby
/// take over (see `up`).
const EVM_SILENT_MIN_MS: u64 = 5000;

/// Whether process `id` has exited with success (halted).
fn halted(children: &mut [(String, Child)], id: &str) -> bool {
    children
        .iter_mut()
        .find(|(i, _)| i == id)
        .and_then(|(_, c)| c.try_wait().ok().flatten())
        .is_some_and(|s| s.success())
}

fn kill_all(children: &mut [(String, Child)]) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// An `evb up` of the same run id whose control still answers: its URL (a second one would
/// take the URL file over and leave the first out of `evb ctl`'s reach). A URL file whose
/// address answers as no control of this run id (a file left by an `evb up` that did not
/// end in order, its address now another's) is not a run that is up.
fn already_up(run_id: &str, secret: Option<&str>) -> Option<String> {
    let url = crate::state_dir::read(&url_file(run_id)).ok()??;
    let url = url.trim().to_string();
    let token = secret.map(|s| evb_control::control_token(s.as_bytes()));
    let api = Api::new(&url, token).with_timeout(Duration::from_millis(1000));
    proven(&api, run_id).ok().map(|_| url)
}

/// Whether the control at `api` proves it is run id `run_id`'s: its status names that run id,
/// or it is a standby EVM that points at the control it follows, or it is evb's door asking
/// for the token (the secret decides then). Anything else — nothing answering, another run
/// id, a server that is not evb's — is said in words.
pub(crate) fn proven(api: &Api, run_id: &str) -> Result<(), String> {
    match api.get("/api/v1/status") {
        Ok(r) if r.status == 200 && r.body["config"]["run_id"] == run_id => Ok(()),
        Ok(r) if r.status == 200 && r.body["config"]["run_id"].is_string() => Err(format!(
            "it is the control of run id {}",
            r.body["config"]["run_id"]
        )),
        Ok(r) if r.status == 404 && r.body["control"].is_string() => Ok(()),
        Ok(r) if r.status == 401 && r.body.to_string().contains("token") => Ok(()),
        Ok(r) => Err(format!(
            "it answers HTTP {} as no evb control does",
            r.status
        )),
        Err(e) => Err(format!("nothing answers there ({e})")),
    }
}

/// How the operator reaches this configuration's run with `evb ctl`: bare for the default
/// run id (the URL file is found by it), else with the configuration given.
fn ctl_hint(cfg: &Config, path: Option<&std::path::Path>) -> String {
    match path {
        Some(p) if cfg.run.id != Config::default().run.id => {
            format!("evb ctl --config {}", p.display())
        }
        _ => "evb ctl".to_string(),
    }
}

/// Runs until halted. True when everything went down in order. `path`: the configuration's
/// file, named in the hints printed.
pub fn up(cfg: &Config, path: Option<&std::path::Path>) -> Result<bool, String> {
    if let Some(url) = already_up(&cfg.run.id, cfg.secret().as_deref()) {
        let ctl = ctl_hint(cfg, path);
        return Err(format!(
            "run id {:?} is up already (its control answers at {url}): `{ctl} halt` takes \
             it down, or give this one another run.id",
            cfg.run.id
        ));
    }
    if cfg.transport.kind == TransportKind::Inproc {
        return Err(
            "transport.kind = \"inproc\" runs inside `evb run` only: use tcp or shm with evb up"
                .into(),
        );
    }
    // where `evb ctl` will find the control: refused before any node starts if it is not
    // this user's alone
    crate::state_dir::dir()
        .map_err(|e| format!("cannot leave the control URL for `evb ctl`: {e}"))?;
    let (tx, rx) = mpsc::channel();
    let mut placed = cfg.clone();
    launch::auto_place(&mut placed, false);
    let (mut children, tmp, resolved) = launch::spawn_processes(&placed, &tx, true, None)?;
    let nodes = resolved.nodes();
    let evm = nodes[0].clone();
    let mut url = format!("http://{}/", evm.control);
    let token = resolved
        .secret()
        .map(|s| evb_control::control_token(s.as_bytes()));
    let mut api = Api::new(&evm.control, token).with_timeout(Duration::from_secs(2));
    let deadline = Instant::now() + Duration::from_secs_f64(resolved.run.connect_timeout_s + 5.0);
    let token = resolved
        .secret()
        .map(|s| evb_control::control_token(s.as_bytes()));
    // a standby EVM (`--standby`): its label among the processes, and its API (the roles
    // swap at each takeover: the standby becomes the active EVM, and a new standby is
    // started where the lost EVM was)
    let mut standby: Option<(String, Api)> = (!resolved.evm.standby.is_empty()).then(|| {
        (
            launch::standby_label(&evm.id),
            Api::new(&resolved.standby_control(), token.clone())
                .with_timeout(Duration::from_secs(2)),
        )
    });
    let apis: Vec<Api> = nodes
        .iter()
        .filter(|n| !n.spare)
        .map(|n| Api::new(&n.control, token.clone()).with_timeout(Duration::from_secs(2)))
        .chain(standby.iter().map(|(_, a)| a.clone()))
        .collect();
    loop {
        // ready when every node answers on its API, and the EVM's table shows them all
        let seen_by_evm = || {
            api.get("/api/v1/status")
                .ok()
                .and_then(|r| r.typed::<evb_control::replies::Status>("status").ok())
                .is_some_and(|s| {
                    s.nodes
                        .iter()
                        .all(|n| n.state == "idle" || n.state == "spare")
                })
        };
        if apis
            .iter()
            .all(|a| a.get("/api/v1/node").is_ok_and(|r| r.ok()))
            && seen_by_evm()
        {
            break;
        }
        if Instant::now() > deadline
            || children
                .iter_mut()
                .any(|(_, c)| matches!(c.try_wait(), Ok(Some(_))))
        {
            kill_all(&mut children);
            return Err(format!(
                "the nodes' control APIs did not all come up (the EVM's: {url})"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let file = url_file(&resolved.run.id);
    if let Err(e) = crate::state_dir::write(&file, &url) {
        kill_all(&mut children);
        return Err(format!("cannot leave the control URL for `evb ctl`: {e}"));
    }
    let spares: Vec<String> = nodes
        .iter()
        .filter(|n| n.spare)
        .map(|n| n.id.clone())
        .collect();
    println!(
        "evb up: {} nodes ready ({} RUs, {} BUs over {})",
        nodes.len() - spares.len(),
        nodes.iter().filter(|n| n.role == Role::Ru).count(),
        nodes
            .iter()
            .filter(|n| n.role == Role::Bu && !n.spare)
            .count(),
        resolved.transport.kind.name()
    );
    if !spares.is_empty() {
        println!(
            "evb up: spare BUs {} start when asked for: {} add-bu BU (each joins the run under way)",
            spares.join(", "),
            ctl_hint(cfg, path)
        );
    }
    println!("evb up: run page and control API: {url}");
    if let Some((_, a)) = &standby {
        println!(
            "evb up: a standby EVM (control API {}) follows every run and takes over if the EVM is lost",
            a.base
        );
    }
    println!(
        "evb up: Prometheus finds every node at {}api/v1/sd (http_sd_configs; docs/control.md)",
        if url.ends_with('/') {
            url.clone()
        } else {
            format!("{url}/")
        }
    );
    if let Some(t) = &token {
        // with a secret, commands need the token, the page's too: opened once with it, the
        // page keeps it in a same-site session cookie (docs/control.md, "Who may call")
        println!(
            "evb up: open the page with the token once (keep this line private): {url}?token={t}"
        );
    }
    println!(
        "evb up: {} start | pause | resume | stop | status | halt   (Ctrl-C: stop and halt)",
        ctl_hint(cfg, path)
    );

    let interrupts = Arc::new(AtomicUsize::new(0));
    let seen = interrupts.clone();
    launch::on_interrupt(move |k| seen.store(k, Ordering::SeqCst));
    let mut halting: Option<Instant> = None;
    let mut exited: Vec<String> = Vec::new();
    let mut restart_at: Vec<(String, Instant)> = Vec::new();
    // the process that is the EVM: the first one, or the standby once it took over
    let mut active = evm.id.clone();
    // the configuration the active EVM's control runs with: the promoted one after each
    // takeover (`Config::with_standby_promoted`), which a new standby is started with
    let mut lineage = resolved.clone();
    // the configurations given to standbys started after a takeover (kept open: a node
    // started again reads its own)
    let mut configs: Vec<launch::ConfigFd> = Vec::new();
    let mut next_look = Instant::now();
    let mut next_spares = Instant::now();
    // With a standby, an EVM whose control API stops answering (frozen between runs, when
    // no follower listens for its heartbeats) is replaced after this long: far above the
    // heartbeat timeout, so that an EVM merely slow to answer is not.
    let evm_silent_limit =
        Duration::from_millis((5 * resolved.run.heartbeat_timeout_ms).max(EVM_SILENT_MIN_MS));
    let mut evm_probe = api.clone().with_timeout(Duration::from_millis(500));
    let mut evm_silent_since: Option<Instant> = None;
    let mut evm_replaced = false;
    // a stale claim of the run control by the standby was said (once)
    let mut stale_said = false;
    let mut next_probe = Instant::now();
    // the EVM's report of a failed run, held while the standby may have taken it over
    let mut held: Option<(Option<u64>, String, Instant)> = None;
    let hold_for =
        Duration::from_millis(3 * resolved.run.heartbeat_timeout_ms).max(Duration::from_secs(3));
    let ok = loop {
        match interrupts.load(Ordering::SeqCst) {
            0 => {}
            1 if halting.is_none() => {
                eprintln!(
                    "evb up: stopping any run, then halting (Ctrl-C again to kill everything)"
                );
                halting = Some(Instant::now());
                let api = api.clone();
                std::thread::spawn(move || {
                    let _ = api.post("/api/v1/stop", &json!({}));
                    let until = Instant::now() + Duration::from_secs(30);
                    while Instant::now() < until {
                        let state = api
                            .get("/api/v1/status")
                            .ok()
                            .and_then(|r| r.typed::<evb_control::replies::Status>("status").ok());
                        match state.map(|s| s.state) {
                            Some(State::Ready | State::Failed) | None => break,
                            _ => std::thread::sleep(Duration::from_millis(100)),
                        }
                    }
                    let _ = api.post("/api/v1/halt", &json!({}));
                });
            }
            1 => {}
            _ => {
                kill_all(&mut children);
                break false;
            }
        }
        while let Ok(note) = rx.try_recv() {
            if let Note::Line(id, v) = note {
                // the standby's report counts where it took the run over
                let took_over = v.took_over();
                let from_standby = standby.as_ref().is_some_and(|(l, _)| *l == id);
                if let (true, Some((run, _, _))) = (from_standby && took_over, &held) {
                    if *run == v.run_number {
                        eprintln!(
                            "evb up: run {}: the lost EVM's own report is not the run's (the standby took the run over)",
                            run.map_or("?".to_string(), |n| n.to_string())
                        );
                        held = None;
                    }
                }
                if (id == active || (took_over && from_standby)) && v.is_report() {
                    if let Some(epoch) = v.fenced {
                        // the nodes followed the standby: this EVM's word is not the run's
                        println!(
                            "evb up: run {}: the old EVM was fenced by epoch {epoch}; its report is not the run's",
                            v.run_number.map_or("?".to_string(), |n| n.to_string())
                        );
                        continue;
                    }
                    let ok = v.ok == Some(true);
                    let reason = v.reason.as_deref().unwrap_or("");
                    // the run records' word: a reset run is aborted, not failed
                    let outcome = if ok {
                        "complete"
                    } else if reason == evb_control::fsm::RESET_REASON {
                        "aborted"
                    } else {
                        "FAILED"
                    };
                    let line = format!(
                        "evb up: run {} {outcome}: {reason}",
                        v.run_number.map_or("?".to_string(), |n| n.to_string()),
                    );
                    // A failure the EVM reports while a standby follows may be the EVM's
                    // own loss, found on waking (frozen): the standby has the run then, and
                    // the woken EVM's verdict must not be shown as the run's. Held until
                    // the standby is seen to have taken that run over, or for long enough
                    // that it has not.
                    if !ok && id == active && standby.is_some() {
                        held = Some((v.run_number, line, Instant::now()));
                    } else {
                        println!("{line}");
                    }
                }
            }
        }
        if held
            .as_ref()
            .is_some_and(|(_, _, at)| at.elapsed() >= hold_for)
        {
            if let Some((_, line, _)) = held.take() {
                println!("{line}");
            }
        }
        for (id, child) in children.iter_mut() {
            if exited.contains(id) {
                continue;
            }
            let Ok(Some(status)) = child.try_wait() else {
                continue;
            };
            exited.push(id.clone());
            if *id == active {
                continue;
            }
            if status.success() {
                continue; // halted
            }

            eprintln!(
                "evb up: {id} {}; starting it again (a BU rejoins the run under way, if any)",
                crate::launch::ended_words(status)
            );
            restart_at.push((id.clone(), Instant::now() + Duration::from_secs(1)));
        }
        // with a standby: the lost EVM's process gone, it is told to take over; once it
        // says it is the run control, the old EVM (if it still lives: frozen) is killed, so
        // that it can never act again, and the control API is the standby's
        if let Some((label, sapi)) = standby.clone() {
            if !evm_replaced && halting.is_none() && Instant::now() >= next_probe {
                next_probe = Instant::now() + Duration::from_secs(1);
                if evm_probe.get("/api/v1/node").is_ok_and(|r| r.ok()) {
                    evm_silent_since = None;
                } else {
                    let since = *evm_silent_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= evm_silent_limit {
                        eprintln!(
                            "evb up: the EVM's control API has not answered for {:.0} s; the standby takes over",
                            since.elapsed().as_secs_f64()
                        );
                        evm_replaced = true;
                    }
                }
            }
            let evm_lost =
                evm_replaced || exited.contains(&active) && !halted(&mut children, &active);
            if Instant::now() >= next_look && halting.is_none() {
                next_look = Instant::now() + Duration::from_millis(250);
                if evm_lost {
                    let _ = sapi.post("/api/v1/node/promote", &json!({}));
                }
                let node = |a: &Api| {
                    a.get("/api/v1/node")
                        .ok()
                        .and_then(|r| r.typed::<evb_control::NodeReply>("node").ok())
                };
                let claim = node(&sapi).filter(|n| n.controls);
                // a claim of a run older than the one the EVM, alive and answering, holds
                // now is stale (a takeover of a run that ended there): it is not followed,
                // and the EVM that holds the run is not killed
                let stale = claim.as_ref().is_some_and(|c| {
                    !evm_lost && stale_claim(c.run, node(&evm_probe).map(|e| e.run))
                });
                if stale && !stale_said {
                    stale_said = true;
                    eprintln!("evb up: the standby says it controls an earlier run than the EVM holds now; not followed");
                }
                if claim.is_some() && !stale {
                    let old = active.clone();
                    if let Some((_, c)) = children.iter_mut().find(|(id, _)| *id == old) {
                        if matches!(c.try_wait(), Ok(None)) {
                            eprintln!("evb up: the standby took over from an EVM that did not answer: killing that EVM");
                            let _ = c.kill();
                            let _ = c.wait();
                        }
                    }
                    active = label.clone();
                    api = sapi.clone();
                    evm_probe = api.clone().with_timeout(Duration::from_millis(500));
                    evm_silent_since = None;
                    evm_replaced = false;
                    url = format!("{}/", sapi.base);
                    if let Err(e) = crate::state_dir::write(&file, &url) {
                        eprintln!("evb up: ERROR: `evb ctl` without --url will not find the new control: {e}");
                    }
                    println!("evb up: the standby EVM is the run control now");
                    println!("evb up: run page and control API: {url}");
                    // the roles swap: a new standby where the lost EVM was, following the
                    // new EVM (its control tells it to follow the run under way)
                    standby = None;
                    if let Some(next) = lineage.with_standby_promoted() {
                        let again =
                            launch::ConfigFd::new(&next.to_toml(), &next.run.id).and_then(|c| {
                                let child =
                                    launch::spawn_standby_labelled(&c, &evm.id, &old, true, &tx)?;
                                configs.push(c);
                                Ok(child)
                            });
                        match again {
                            Ok(child) => {
                                if let Some(slot) = children.iter_mut().find(|(i, _)| *i == old) {
                                    slot.1 = child;
                                }
                                exited.retain(|i| *i != old);
                                let sapi = Api::new(&next.standby_control(), token.clone())
                                    .with_timeout(Duration::from_secs(2));
                                println!(
                                    "evb up: a new standby EVM (control API {}) follows the new one",
                                    sapi.base
                                );
                                standby = Some((old.clone(), sapi));
                            }
                            Err(e) => eprintln!(
                                "evb up: cannot start a new standby EVM: {e}; a loss of this EVM ends everything"
                            ),
                        }
                        lineage = next;
                    }
                }
            }
            // the standby gone too: nothing is left to take over
            if evm_lost && exited.contains(&label) {
                eprintln!("evb up: the EVM and its standby are both gone: everything is stopped");
                kill_all(&mut children);
                break false;
            }
        }
        // the EVM lost and a standby still up, which is to take over: not the end
        let awaiting_standby = standby
            .as_ref()
            .is_some_and(|(label, _)| !exited.contains(label))
            && !halted(&mut children, &active);
        if exited.contains(&active) && !awaiting_standby {
            // the EVM is gone: halted (exit 0) or dead; the others follow or are stopped
            let clean = halted(&mut children, &active);
            let grace = Instant::now() + Duration::from_secs(5);
            while Instant::now() < grace
                && children
                    .iter_mut()
                    .any(|(_, c)| matches!(c.try_wait(), Ok(None)))
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            kill_all(&mut children);
            if !clean {
                eprintln!("evb up: the EVM exited unexpectedly: everything is stopped");
            }
            break clean;
        }
        // spare BUs asked for (`evb ctl add-bu`): the control lists them until they answer
        if !spares.is_empty() && halting.is_none() && Instant::now() >= next_spares {
            next_spares = Instant::now() + Duration::from_millis(250);
            let adding = api
                .get("/api/v1/status")
                .ok()
                .and_then(|r| r.typed::<evb_control::replies::Status>("status").ok())
                .map(|s| s.adding)
                .unwrap_or_default();
            for id in adding.iter().filter(|id| spares.contains(id)) {
                let running = children
                    .iter_mut()
                    .find(|(i, _)| i == id)
                    .is_some_and(|(_, c)| matches!(c.try_wait(), Ok(None)));
                if running || restart_at.iter().any(|(i, _)| i == id) {
                    continue;
                }
                match launch::spawn_node(&tmp, id, true, &tx, &[]) {
                    Ok(c) => {
                        println!("evb up: starting spare {id} (add-bu)");
                        match children.iter_mut().find(|(i, _)| i == id) {
                            Some(slot) => slot.1 = c,
                            None => children.push((id.clone(), c)),
                        }
                        exited.retain(|i| i != id);
                    }
                    Err(e) => eprintln!("evb up: cannot start spare {id}: {e}"),
                }
            }
        }
        let now = Instant::now();
        let due: Vec<String> = restart_at
            .iter()
            .filter(|(_, t)| *t <= now)
            .map(|(id, _)| id.clone())
            .collect();
        restart_at.retain(|(_, t)| *t > now);
        if halting.is_none() {
            for id in due {
                let again = match &standby {
                    Some((label, _)) if *label == id => {
                        let cfg = configs.last().unwrap_or(&tmp);
                        launch::spawn_standby_labelled(cfg, &evm.id, &id, true, &tx)
                    }
                    _ => launch::spawn_node(&tmp, &id, true, &tx, &[]),
                };
                match again {
                    Ok(c) => {
                        if let Some(slot) = children.iter_mut().find(|(i, _)| *i == id) {
                            slot.1 = c;
                        }
                        exited.retain(|i| *i != id);
                    }
                    Err(e) => eprintln!("evb up: cannot start {id} again: {e}"),
                }
            }
        }
        if halting.is_some_and(|t| t.elapsed() > Duration::from_secs(40)) {
            eprintln!("evb up: halting took too long: killing every node");
            kill_all(&mut children);
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if let Some((_, line, _)) = held {
        println!("{line}");
    }
    crate::state_dir::remove(&file);
    drop(tmp);
    println!("evb up: halted");
    Ok(ok)
}

/// Whether the standby's claim of the run control (run `claimed`) is stale, with the EVM
/// alive and answering at run `evm_run` (`None`: it did not answer): a claim of an earlier
/// run than the one the EVM holds now is a takeover of a run that ended there, and is not
/// followed. An EVM that does not answer leaves the claim standing.
fn stale_claim(claimed: u64, evm_run: Option<u64>) -> bool {
    evm_run.is_some_and(|r| r > claimed)
}

#[cfg(test)]
mod claim_tests {
    /// CI's two-fault case: the new standby took run 1 over while the promoted EVM held run
    /// 2; `evb up` followed it and killed the EVM that held run 2. Such a claim is stale; a
    /// claim of the run under way, or with the EVM silent, is followed.
    #[test]
    fn a_claim_of_an_earlier_run_than_the_evm_holds_is_stale() {
        assert!(super::stale_claim(1, Some(2)));
        assert!(!super::stale_claim(2, Some(2)));
        assert!(!super::stale_claim(3, Some(2)));
        assert!(!super::stale_claim(1, None));
    }
}

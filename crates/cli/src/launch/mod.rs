//! `evb run`: start every node, watch them, judge the run.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::Child;
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use evb_builder::{NodeStatus, RunState};
use evb_config::{Config, TransportKind};
use indicatif::{ProgressBar, ProgressStyle};

use crate::summary;
use lineage::Lineage;

mod ending;
mod lineage;
mod placement;
mod progress;
mod signals;
mod spawn;
mod verdict;

pub(crate) use placement::auto_place;
pub(crate) use progress::STEADY_AFTER_S;
use progress::{progress_line, RateMeter, SteadyRate, Target};
pub(crate) use signals::on_interrupt;
pub use signals::{exit_on_interrupt, exit_when_stdin_closes, stop_on_interrupt};
pub(crate) use spawn::{
    spawn_node, spawn_processes, spawn_standby_labelled, standby_label, ConfigFd, PLACEMENT,
};
pub(crate) use verdict::ended_words;
use verdict::note_exit;

/// What the watcher hears from the nodes.
pub(crate) enum Note {
    Line(String, Box<NodeStatus>),
    /// A node's process or thread is gone (with its exit code, if it had one).
    Gone(String, Option<i32>),
    /// A line a node process wrote on stderr (passed on already).
    Stderr(String, String),
}

/// What watching a run saw, for the verdict.
pub(super) struct Watched {
    /// Each node's final report, if it sent one.
    reports: BTreeMap<String, NodeStatus>,
    exit_codes: BTreeMap<String, Option<i32>>,
    /// How each node process that ended on its own ended, in words, and whether the run had
    /// started then (a node lost before the start is the cause, not one problem among the
    /// others it brought down).
    how_ended: BTreeMap<String, (String, bool)>,
    /// Node processes still running at the end, killed.
    killed: Vec<String>,
    /// The last line each node process wrote on stderr (`evb run`'s nodes).
    last_lines: BTreeMap<String, String>,
    timed_out: bool,
    /// A second Ctrl-C.
    user_abort: bool,
    /// The seconds the run was given.
    budget: f64,
    /// Events built per second in steady state, from the BUs' status lines.
    steady_events_per_s: Option<f64>,
}

/// What `evb run --json FILE` writes (docs/operations/running.md): the verdict's problems,
/// the EVM's run report, every node's last report, exit codes and process ids.
#[derive(serde::Serialize)]
struct RunJson<'a> {
    ok: bool,
    problems: &'a [String],
    run: Option<&'a evb_builder::RunReport>,
    steady_events_per_s: Option<f64>,
    nodes: &'a BTreeMap<String, NodeStatus>,
    exit_codes: &'a BTreeMap<String, Option<i32>>,
    pids: Vec<u32>,
    transport: &'static str,
}

/// Runs the whole system; true when the verdict is clean.
pub fn run(cfg: &Config, quiet: bool, json_out: Option<&Path>) -> Result<bool, String> {
    // watched from the start: a Ctrl-C while the nodes start is a stop like any other
    let interrupts = signals::count_interrupts();
    let mut placed = cfg.clone();
    auto_place(&mut placed, quiet);
    // the run's number, claimed in the run records: its files go to a folder of their own
    if placed.run_folder(&placed.run.id, 0).is_none() {
        if let Some(earlier) = verdict::earlier_run_files(&placed) {
            return Err(format!(
                "sink.dir: {earlier}; this run's files would mix with them. Give each run a \
                 folder of its own (dir = \"{}/{{run}}\"), move them away, or set another \
                 run.id",
                placed.sink.dir
            ));
        }
    }
    // the run's number, claimed in the run records (`{run}` in sink.dir is its folder);
    // without records (a home that cannot be written), the run is run 1 and said so; a
    // `{run}` folder then has no safe number and the run is refused
    let record = match evb_control::OnceRecord::claim(&placed) {
        Ok(r) => Some(r),
        Err(e) if placed.run_folder(&placed.run.id, 0).is_some() => {
            return Err(format!(
                "the run's record cannot be kept, so {{run}} in sink.dir has no number: {e} \
                 (set run.records_dir to a folder of yours)"
            ))
        }
        Err(e) => {
            eprintln!("evb: the run's record is not kept (run.records_dir): {e}");
            None
        }
    };
    let number = record.as_ref().map_or(1, |r| r.run());
    let own_folder = placed.run_folder(&placed.run.id, number);
    if let Some(dir) = &own_folder {
        placed.sink.dir = dir.clone();
    }
    if let (false, Some(r)) = (quiet, &record) {
        eprintln!(
            "evb: run {number} of {:?} (its record in {}{})",
            placed.run.id,
            r.path().display(),
            if placed.sink.dir.is_empty() {
                String::new()
            } else {
                format!(", its files in {}", placed.sink.dir)
            }
        );
    }
    let cfg = &placed;
    let launched = std::time::SystemTime::now();
    let (tx, rx) = mpsc::channel();
    let inproc = cfg.transport.kind == TransportKind::Inproc;
    // inproc: the EVM thread's commands, for Ctrl-C
    let mut evm_control = None;
    // spare BUs are not started: they join runs under `evb up` (`evb ctl add-bu`)
    let spares: Vec<String> = cfg
        .nodes()
        .into_iter()
        .filter(|n| n.spare)
        .map(|n| n.id)
        .collect();
    if !spares.is_empty() && !quiet {
        eprintln!(
            "evb: spare BUs {} are not started (they join runs under evb up: evb ctl add-bu)",
            spares.join(", ")
        );
    }
    let ids: Vec<String> = cfg
        .nodes()
        .into_iter()
        .filter(|n| !n.spare)
        .map(|n| n.id)
        .collect();
    // with a standby: the EVMs that hold the run in turn, a new standby after each takeover
    let mut lineage = None;
    let (mut children, _tmp) = if inproc {
        evm_control = Some(spawn::spawn_threads(cfg, &tx));
        (Vec::new(), None)
    } else {
        let (c, t, resolved) = spawn_processes(cfg, &tx, false, record.as_ref().map(|r| r.run()))?;
        if !quiet {
            if let Some(evm) = resolved.nodes().first() {
                eprintln!("evb: run page and control API: http://{}/", evm.control);
            }
        }
        if !resolved.evm.standby.is_empty() {
            let number = record.as_ref().map(|r| r.run());
            lineage = Some(Lineage::new(&resolved, &ids[0], number, tx.clone()));
        }
        (c, Some(t))
    };
    drop(tx);
    // a standby EVM is watched as a node, and judged as the EVM if it took the run over
    let mut watched: Vec<String> = ids.clone();
    if let Some(l) = &lineage {
        watched.extend(l.labels().iter().skip(1).cloned());
    }
    let mut w = watch(
        cfg,
        &mut watched,
        quiet,
        &interrupts,
        evm_control.as_ref(),
        &mut children,
        &rx,
        lineage.as_mut(),
    );
    if let Some(l) = &lineage {
        l.settle(&mut w);
    }
    let pids: Vec<u32> = children.iter().map(|(_, c)| c.id()).collect();
    let mut problems = verdict::problems(cfg, &ids, &w);
    problems.extend(verdict::duplicate_output(cfg, launched));
    problems.dedup();
    let ok = problems.is_empty();
    verdict::amend_manifest(cfg, &problems, launched);
    if let Some(mut r) = record {
        // the record names the manifest and configuration the EVM left in the run's folder
        r.set_folder(&cfg.sink.dir);
        r.close(&problems, w.reports.get(&ids[0]));
    }
    // the run's own folder, left empty (the run never started, or wrote nothing): not left
    // behind as if it held a run (remove_dir takes only an empty folder)
    if let Some(dir) = own_folder.filter(|d| std::fs::remove_dir(d).is_ok()) {
        if !quiet {
            eprintln!("evb: run {number} wrote no file; its empty folder {dir} is removed");
        }
    }
    let run = w.reports.get(&ids[0]).and_then(|r| r.run.as_ref());
    summary::print(cfg, &ids, &w.reports, run, &problems, w.steady_events_per_s);
    if let Some(path) = json_out {
        let doc = RunJson {
            ok,
            problems: &problems,
            run,
            steady_events_per_s: w.steady_events_per_s,
            nodes: &w.reports,
            exit_codes: &w.exit_codes,
            pids,
            transport: cfg.transport.kind.name(),
        };
        let doc = serde_json::to_value(&doc).map_err(|e| format!("cannot write {e}"))?;
        crate::json_out::write(path, &doc).map_err(|e| format!("cannot write {e}"))?;
    }
    Ok(ok)
}

/// Watches the nodes until every one has ended, the run's budget is spent, or a second
/// Ctrl-C: the progress line, Ctrl-C passed on as a clean stop, status lines and exits
/// collected; whatever is still running at the end is killed.
#[allow(clippy::too_many_arguments)]
fn watch(
    cfg: &Config,
    ids: &mut Vec<String>,
    quiet: bool,
    interrupts: &AtomicUsize,
    evm_control: Option<&evb_node::RunControl>,
    children: &mut Vec<(String, Child)>,
    rx: &mpsc::Receiver<Note>,
    mut lineage: Option<&mut Lineage>,
) -> Watched {
    let inproc = cfg.transport.kind == TransportKind::Inproc;
    let budget = cfg.run.connect_timeout_s
        + cfg.run.stall_timeout_s * 2.0
        + if cfg.run.duration_s > 0.0 {
            cfg.run.duration_s
        } else {
            3600.0
        }
        + 30.0;

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
    let mut rate = RateMeter::new();
    let mut steady = SteadyRate::default();
    let mut next_plain = Instant::now() + Duration::from_secs(2);
    let mut timed_out = false;
    // when to stop watching: the rule (ending.rs) over what each pass saw
    let watch_start = Instant::now();
    let mut ending = ending::Ending::new(Duration::from_secs_f64(budget));
    // node processes still running then outlived their bound after the EVM's report
    let mut hung = false;
    // how each node process that ended on its own ended, in words, and whether the run had
    // started then (for the verdict: a node lost before the start is the cause, not one
    // problem among the others it brought down)
    let mut how_ended: BTreeMap<String, (String, bool)> = BTreeMap::new();
    let mut stop_sent = false;
    // a standby that took the run over is told of a Ctrl-C too (the EVM it replaced cannot)
    let mut told: Vec<String> = Vec::new();
    let mut user_abort = false;
    let mut last_lines: BTreeMap<String, String> = BTreeMap::new();

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
                if let Some(control) = evm_control {
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
        if let (true, Some(l)) = (stop_sent, lineage.as_deref()) {
            let active = l.active().to_string();
            if active != ids[0] && !told.contains(&active) {
                told.push(active.clone());
                if let Some(stdin) = children
                    .iter_mut()
                    .find(|(i, _)| *i == active)
                    .and_then(|(_, c)| c.stdin.as_mut())
                {
                    let _ = stdin.write_all(b"stop\n").and_then(|_| stdin.flush());
                }
            }
        }
        // (after the EVM's report, the nodes' exits are watched closely)
        let pass = if ending.after_report() { 10 } else { 100 };
        match rx.recv_timeout(Duration::from_millis(pass)) {
            Ok(Note::Line(id, v)) => {
                if v.is_report() {
                    reports.insert(id.clone(), (*v).clone());
                }
                steady.note(&v);
                latest.insert(id, v);
            }
            Ok(Note::Gone(id, code)) => {
                exit_codes.insert(id, code);
            }
            Ok(Note::Stderr(id, line)) => {
                last_lines.insert(id, line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                if inproc {
                    break;
                }
            }
        }
        for (id, child) in children.iter_mut() {
            if exit_codes.contains_key(id) {
                continue;
            }
            if let Ok(Some(status)) = child.try_wait() {
                exit_codes.insert(id.clone(), status.code());
                note_exit(&mut how_ended, id, status, &latest, &ids[0]);
            }
        }
        // (after the EVM's report no standby is started any more: the run is over)
        if let Some(l) = lineage.as_deref_mut().filter(|_| !ending.after_report()) {
            let say = |line: String| {
                if !quiet {
                    bar.suspend(|| eprintln!("{line}"));
                }
            };
            l.step(&latest, &exit_codes, children, ids, &say);
        }
        let target = Target {
            events: cfg.run.events,
            duration_s: cfg.run.duration_s,
        };
        let line = progress_line(&latest, &mut rate, target);
        bar.set_message(line.clone());
        if !quiet && !tty && Instant::now() >= next_plain {
            eprintln!("evb: {line}");
            next_plain = Instant::now() + Duration::from_secs(2);
        }
        // A node that failed before the run started (e.g. a bad input file), or the EVM
        // itself gone, dooms the run: give the EVM a moment to report, then stop the rest
        // rather than wait for time-outs. A node lost mid-run is the EVM's to handle (it
        // rebuilds a lost BU's events, or applies the RU-loss policy): wait for its verdict.
        // with a standby that is still up, the EVM is gone only once it is gone too
        let evm: String = match lineage.as_deref() {
            Some(l) => match l.standby() {
                Some(s) if exit_codes.contains_key(l.active()) && !exit_codes.contains_key(s) => {
                    s.to_string()
                }
                _ => l.active().to_string(),
            },
            None => ids[0].clone(),
        };
        let evm = &evm;
        let evm_running = latest
            .get(evm)
            .is_some_and(|v| !matches!(v.state, RunState::Ready | RunState::Configured));
        let evm_gone = exit_codes.contains_key(evm);
        // an EVM the run has moved on from (replaced, or lost with its standby still up)
        // does not doom it
        let superseded = |id: &String| lineage.as_deref().is_some_and(|l| l.before(id, evm));
        let failed = exit_codes
            .iter()
            .any(|(id, c)| *c != Some(0) && !superseded(id));
        let reported = reports.contains_key(evm);
        let seen = ending::Seen {
            running: ids
                .iter()
                .filter(|id| !exit_codes.contains_key(*id))
                .count(),
            evm_alive: !evm_gone,
            // (in-process nodes have no process to bound: they end when their threads do)
            reported: reported && !children.is_empty(),
            doomed: failed && (!evm_running || evm_gone) && !reported,
        };
        if let ending::Step::Stop {
            hung: h,
            timed_out: t,
        } = ending.step(watch_start.elapsed(), seen)
        {
            (hung, timed_out) = (h, t);
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
            Ok(Note::Stderr(id, line)) => {
                last_lines.insert(id, line);
            }
            Err(_) => {
                if reports.len() == ids.len() {
                    break;
                }
            }
        }
    }
    let mut killed = Vec::new();
    for (id, child) in children.iter_mut() {
        if let Ok(None) = child.try_wait() {
            if hung {
                // where it was stuck, for whoever reads why the run failed
                eprintln!(
                    "evb run: {id} (pid {}) had not exited; its threads: {}",
                    child.id(),
                    spawn::threads_of(child.id())
                );
            }
            let _ = child.kill();
            let _ = child.wait();
            killed.push(id.clone());
        }
        drop(child.stdin.take());
    }
    // what the nodes said last on stderr, all of it passed on before the verdict
    spawn::drain_stderr(Duration::from_secs(1));
    while let Ok(n) = rx.try_recv() {
        if let Note::Stderr(id, line) = n {
            last_lines.insert(id, line);
        }
    }
    Watched {
        reports,
        exit_codes,
        how_ended,
        killed,
        last_lines,
        timed_out,
        user_abort,
        budget,
        steady_events_per_s: steady.rate(),
    }
}

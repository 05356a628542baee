//! The controller's decisions driven by scripted commands and node answers, with the time
//! passed in: no process, no HTTP.

use std::time::{Duration, Instant};

use evb_builder::{BuStats, EvmStats, NodeStatus, RoleStats, RunState};
use evb_config::Config;
use serde_json::json;

use super::core::{Core, Effect};
use super::records::Finished;
use crate::client::{CallError, CallErrorKind};
use crate::fsm::{Command, State};
use crate::service::{numbered_run_id, Mode, NodeReply, Phase};

/// The controller's typed requests and replies as the HTTP shell maps them to JSON.
trait AsJson {
    fn cmd(
        &mut self,
        cmd: Command,
        body: &serde_json::Value,
        unix: f64,
    ) -> Result<(serde_json::Value, Vec<Effect>), (u16, String)>;
    fn status_json(&self, evm: Option<&NodeStatus>, unix: f64) -> serde_json::Value;
}

impl AsJson for Core {
    fn cmd(
        &mut self,
        cmd: Command,
        body: &serde_json::Value,
        unix: f64,
    ) -> Result<(serde_json::Value, Vec<Effect>), (u16, String)> {
        self.allowed(cmd).map_err(|r| (r.status, r.why))?;
        let req = crate::replies::Request::parse(cmd, body).map_err(|r| (r.status, r.why))?;
        self.command(req, unix)
            .map(|(r, e)| (serde_json::to_value(r).unwrap(), e))
            .map_err(|r| (r.status, r.why))
    }

    fn status_json(&self, evm: Option<&NodeStatus>, unix: f64) -> serde_json::Value {
        let s = self.status(evm, unix);
        // what a reader gets: the same, read back typed
        let v = serde_json::to_value(&s).unwrap();
        let back: crate::replies::Status = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(back, s);
        v
    }
}

/// The EVM's final status line of a run that triggered `triggered` events and released
/// `released` (no RU or BU reports).
pub(super) fn evm_report_line(triggered: u64, released: u64) -> NodeStatus {
    let mut line = NodeStatus::new("evm", RunState::Halted, RoleStats::Evm(Box::default()));
    line.run = Some(evb_builder::RunReport {
        state: RunState::Halted,
        reason: None,
        n_ru: 0,
        n_bu: 0,
        seconds: 1.0,
        down: vec![],
        evm: EvmStats {
            triggered,
            released,
            ..EvmStats::default()
        },
        rus: vec![],
        bus: vec![],
    });
    line
}

/// A run's end without an EVM report.
fn ended(ok: bool, reason: &str) -> Finished {
    Finished {
        ok,
        reason: reason.into(),
        report: None,
        fenced: None,
    }
}

fn core() -> Core {
    Core::new(&Config::default(), Mode::Serve)
}

fn reply(node: &str, pid: u32, phase: Phase, run: u64, built: u64) -> NodeReply {
    let role = if node.starts_with("bu") {
        evb_builder::StatusRole::Bu
    } else if node.starts_with("ru") {
        evb_builder::StatusRole::Ru
    } else {
        evb_builder::StatusRole::Evm
    };
    let stats = match role {
        evb_builder::StatusRole::Bu => RoleStats::Bu(Box::new(BuStats {
            events_built: built,
            payload_bytes_built: built * 100,
            ..Default::default()
        })),
        evb_builder::StatusRole::Ru => RoleStats::Ru(Box::default()),
        evb_builder::StatusRole::Evm => RoleStats::Evm(Box::new(EvmStats {
            triggered: built,
            released: built,
            ..Default::default()
        })),
    };
    NodeReply {
        node: node.into(),
        role,
        pid,
        phase,
        mode: Mode::Serve,
        run,
        runs_total: run,
        last: None,
        snapshot: Some(NodeStatus::new(node, RunState::Running, stats)),
        controls: false,
    }
}

/// The rate history as a reader gets it: JSON, read back typed the same.
fn history_json(c: &Core, since: Option<f64>) -> serde_json::Value {
    let h = c.history(since);
    let v = serde_json::to_value(&h).unwrap();
    let back: crate::replies::History = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(back, h);
    v
}

/// A reply whose snapshot was taken `t` s after its node was made (the node's own clock).
fn at(mut r: NodeReply, t: f64) -> NodeReply {
    if let Some(s) = r.snapshot.as_mut() {
        s.t = t;
    }
    r
}

fn refused(node: &str) -> CallError {
    CallError {
        base: format!("http://{node}"),
        kind: CallErrorKind::Refused,
        detail: "connection refused".into(),
    }
}

fn timeout(node: &str) -> CallError {
    CallError {
        base: format!("http://{node}"),
        kind: CallErrorKind::Timeout,
        detail: "timeout".into(),
    }
}

/// Starts run 1 and has the EVM's run reach `running`; returns the run's configuration.
fn started(c: &mut Core) -> Config {
    let (reply, effects) = c.cmd(Command::Start, &json!({}), 100.0).unwrap();
    assert_eq!(reply["run"], 1);
    assert_eq!(effects[0], Effect::ResetControl);
    let Effect::StartRun { run: 1, cfg } = &effects[1] else {
        panic!("{effects:?}")
    };
    assert_eq!(cfg.run.id, numbered_run_id(&c.cfg().run.id, 1));
    let cfg = (**cfg).clone();
    let plan = c.begin_run(1, &cfg);
    let all_ok: Vec<_> = plan.nodes.iter().map(|n| (n.id.clone(), Ok(()))).collect();
    assert_eq!(c.started(1, &plan, &all_ok), Ok(()));
    c.on_status(&NodeStatus::new(
        "evm",
        RunState::Running,
        RoleStats::Evm(Box::default()),
    ));
    assert_eq!(c.state(), State::Running);
    cfg
}

fn node_row<'a>(status: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == id)
        .unwrap_or_else(|| panic!("no {id} in {status}"))
}

#[test]
fn a_node_that_never_answers_is_unreachable_and_asked_again_sooner() {
    let mut c = core();
    let t0 = Instant::now();
    let ids: Vec<String> = c.others().into_iter().map(|n| n.id).collect();
    assert!(ids.len() >= 2, "{ids:?}");
    let silent = ids[0].clone();
    let round = |c: &mut Core, t| {
        let answers = ids
            .iter()
            .map(|id| {
                let r = if *id == silent {
                    Err(timeout(id))
                } else {
                    Ok(reply(id, 7, Phase::Idle, 0, 0))
                };
                (id.clone(), r)
            })
            .collect();
        c.answers(t, answers)
    };
    round(&mut c, t0);
    assert_eq!(c.poll_period(), super::core::POLL_EVERY / 4);
    // never answered at all: unreachable at once
    let s = c.status_json(None, 0.0);
    assert_eq!(node_row(&s, &silent)["state"], "unreachable");
    assert_eq!(node_row(&s, &ids[1])["state"], "idle");
    // a node that answered once and then times out once is not yet lost...
    let t1 = t0 + Duration::from_secs(1);
    c.answers(
        t1,
        vec![(silent.clone(), Ok(reply(&silent, 7, Phase::Idle, 0, 0)))],
    );
    assert_eq!(c.poll_period(), super::core::POLL_EVERY);
    c.answers(t1, vec![(silent.clone(), Err(timeout(&silent)))]);
    assert_eq!(
        node_row(&c.status_json(None, 0.0), &silent)["state"],
        "idle"
    );
    // ...twice in a row it is; a refused connection is at once
    c.answers(t1, vec![(silent.clone(), Err(timeout(&silent)))]);
    assert_eq!(
        node_row(&c.status_json(None, 0.0), &silent)["state"],
        "unreachable"
    );
    c.answers(t1, vec![(ids[1].clone(), Err(refused(&ids[1])))]);
    let s = c.status_json(None, 0.0);
    assert_eq!(node_row(&s, &ids[1])["state"], "unreachable");
    // in an operator's words, not the HTTP client's
    assert_eq!(
        node_row(&s, &ids[1])["error"],
        "not running: nothing listens at its control API"
    );
}

#[test]
fn a_node_answering_twice_is_counted_once() {
    let mut c = core();
    started(&mut c);
    let t0 = Instant::now();
    let bu = "bu0";
    let answer = |built, t| vec![(bu.into(), Ok(at(reply(bu, 7, Phase::Running, 1, built), t)))];
    c.answers(t0, answer(100, 1.0));
    let t1 = t0 + Duration::from_secs(1);
    c.answers(t1, answer(600, 2.0));
    // the same answer again, at once: no new events, and the totals count the BU once
    c.answers(t1, answer(600, 2.0));
    let s = c.status_json(None, 0.0);
    // the header's total is the EVM's ledger, which has said nothing yet: not the BU's count
    assert_eq!(s["totals"]["events_built"], 0);
    assert_eq!(node_row(&s, bu)["events"], 600);
    assert_eq!(
        node_row(&s, bu)["rate_hz"],
        500.0,
        "the same snapshot again leaves the rate as it was"
    );
    let t2 = t1 + Duration::from_millis(500);
    c.answers(t2, answer(700, 2.5));
    let s = c.status_json(None, 0.0);
    assert_eq!(node_row(&s, bu)["rate_hz"], 200.0);
    // the system's rate is the EVM's (released events), which has not answered
    assert_eq!(s["totals"]["rate_hz"], 0.0);
    assert_eq!(s["totals"]["bytes_per_s"], 20_000.0);
}

/// One idea, one number, in one reply: the header's events built, the EVM's summary and the
/// EVM's row are the same count, and the header's rate is the EVM row's rate; rates are timed
/// by the node's own clock, so a poll round that waited for a silent node (or an EVM snapshot
/// taken before the round) shows no burst that never was (issue 71: `max 801` under a 500 Hz
/// trigger; the header 1429 beside the EVM row's 1228).
#[test]
fn one_reply_says_one_number_per_idea_and_rates_follow_the_node_s_clock() {
    let mut c = core();
    started(&mut c);
    let t0 = Instant::now();
    let evm = |released: u64, t: f64| {
        let mut r = at(reply("evm", 3, Phase::Running, 1, released), t);
        if let Some(s) = r.snapshot.as_mut() {
            s.run_number = Some(1);
            if let RoleStats::Evm(e) = &mut s.stats {
                e.triggered = released + 32;
            }
        }
        r
    };
    // 500 events a second on the EVM's clock; the second round's answers came 0.5 s late
    // (the round waited for a silent BU), the third on time
    let rounds = [(0, 0.0, 0.0), (500, 1.0, 1.5), (1000, 2.0, 2.0)];
    for (released, t, arrived) in rounds {
        c.answers(
            t0 + Duration::from_secs_f64(arrived),
            vec![
                ("evm".into(), Ok(evm(released, t))),
                ("bu0".into(), Err(timeout("bu0"))),
            ],
        );
        c.sample(1000.0 + arrived);
        let line = evm(released, t).snapshot.unwrap();
        c.on_status(&line);
        let s = c.status_json(Some(&line), 0.0);
        let row = node_row(&s, "evm");
        assert_eq!(s["totals"]["events_built"], released, "{s}");
        assert_eq!(row["events"], released, "{s}");
        assert_eq!(s["evm"]["released"], released, "{s}");
        assert_eq!(s["evm"]["triggered"], released + 32, "{s}");
        assert_eq!(s["totals"]["rate_hz"], row["rate_hz"], "{s}");
        if released > 0 {
            assert_eq!(row["rate_hz"], 500.0, "{s}");
        }
    }
    // the page's rate plot: no sample above the trigger's rate
    let h = history_json(&c, None);
    let rates = h["totals"]["rate_hz"].as_array().unwrap();
    assert!(rates.iter().all(|r| r.as_f64() <= Some(500.0)), "{h}");
    // the EVM's status line moves on before the next poll: the reply's summary and row
    // follow that line together
    let line = evm(1200, 2.4).snapshot.unwrap();
    c.on_status(&line);
    let s = c.status_json(Some(&line), 0.0);
    assert_eq!(s["totals"]["events_built"], 1200);
    assert_eq!(node_row(&s, "evm")["events"], 1200);
    assert_eq!(s["evm"]["released"], 1200);
}

#[test]
fn an_answer_from_an_older_run_is_not_this_run_s() {
    let mut c = core();
    started(&mut c);
    c.finished(1, ended(true, "done"), 110.0);
    assert_eq!(c.state(), State::Ready);
    let (reply2, _) = c.cmd(Command::Start, &json!({}), 120.0).unwrap();
    assert_eq!(reply2["run"], 2);
    let t0 = Instant::now();
    // bu0 still says run 1 (its answer was on its way, or it has not started run 2)
    c.answers(
        t0,
        vec![("bu0".into(), Ok(reply("bu0", 7, Phase::Running, 1, 900)))],
    );
    let s = c.status_json(None, 0.0);
    assert_eq!(s["run"], 2);
    assert_eq!(
        s["totals"]["events_built"], 0,
        "run 1's events are not run 2's"
    );
    assert_eq!(node_row(&s, "bu0")["run"], 1);
    // a start answer for a run that is not under way decides nothing
    let cfg = c.cfg().clone();
    let plan = c.begin_run(2, &cfg);
    let ok: Vec<_> = plan.nodes.iter().map(|n| (n.id.clone(), Ok(()))).collect();
    assert!(c.started(1, &plan, &ok).is_err());
    assert_eq!(c.started(2, &plan, &ok), Ok(()));
}

#[test]
fn a_start_that_a_node_refuses_is_called_off_at_the_others() {
    let mut c = core();
    let (_, effects) = c.cmd(Command::Start, &json!({}), 0.0).unwrap();
    let Effect::StartRun { cfg, .. } = &effects[1] else {
        panic!("{effects:?}")
    };
    let plan = c.begin_run(1, cfg);
    let mut answers: Vec<_> = plan.nodes.iter().map(|n| (n.id.clone(), Ok(()))).collect();
    answers[0].1 = Err("busy".to_string());
    answers.pop(); // and one never answered
    let off = c.started(1, &plan, &answers).unwrap_err();
    assert!(
        off.error.contains("busy") && off.error.contains("no answer"),
        "{}",
        off.error
    );
    assert_eq!(
        off.abort.len(),
        plan.nodes.len() - 2,
        "only those that started"
    );
    assert!(off.abort.iter().all(|(n, _)| n.id != plan.nodes[0].id));
    c.finished(
        1,
        Finished {
            ok: false,
            reason: off.error.clone(),
            report: None,
            fenced: None,
        },
        1.0,
    );
    assert_eq!(c.state(), State::Failed);
    let rec = c.run_record(1).unwrap();
    assert_eq!(rec.state, "failed");
    assert_eq!(rec.end.as_ref().unwrap().triggered, None);
}

/// Issue 71 item 4: a BU whose process lived on (frozen, then woken) and whose run of it
/// ended in failure is told to rejoin once the EVM counts it as down; not while the EVM
/// does not, not after a clean end, and never an RU.
#[test]
fn a_woken_bu_that_the_evm_lost_is_told_to_rejoin() {
    let mut c = core();
    started(&mut c);
    let t0 = Instant::now();
    let failed = |node: &str, pid: u32, ok: bool| {
        let mut r = reply(node, pid, Phase::Idle, 1, 10);
        r.last = Some(crate::service::LastRun {
            run: 1,
            ok,
            reason: "lost evm: closed by peer (after this node itself did not run for 2216 ms)"
                .into(),
        });
        r
    };
    let evm = |down: &[&str]| {
        let mut r = reply("evm", 1, Phase::Running, 1, 100);
        if let Some(s) = r.snapshot.as_mut() {
            s.stats = RoleStats::Evm(Box::new(EvmStats {
                triggered: 100,
                down: down.iter().map(|d| d.to_string()).collect(),
                ..Default::default()
            }));
        }
        r
    };
    c.answers(
        t0,
        vec![("bu1".into(), Ok(reply("bu1", 7, Phase::Running, 1, 10)))],
    );
    // its run ended in failure, but the EVM has not counted it as down yet: not yet
    let early = c.answers(
        t0,
        vec![
            ("evm".into(), Ok(evm(&[]))),
            ("bu1".into(), Ok(failed("bu1", 7, false))),
        ],
    );
    assert!(early.is_empty(), "{early:?}");
    let rejoins = c.answers(
        t0,
        vec![
            ("evm".into(), Ok(evm(&["bu[1]"]))),
            ("bu1".into(), Ok(failed("bu1", 7, false))),
        ],
    );
    assert_eq!(rejoins.len(), 1, "{rejoins:?}");
    assert_eq!((rejoins[0].node.id.as_str(), rejoins[0].run), ("bu1", 1));
    // a clean end of its run is no loss, even if the EVM lost it once before
    let clean = c.answers(
        t0,
        vec![
            ("evm".into(), Ok(evm(&["bu[1]"]))),
            ("bu1".into(), Ok(failed("bu1", 7, true))),
        ],
    );
    assert!(clean.is_empty(), "{clean:?}");
    // an RU is never told to rejoin
    let ru = c.answers(
        t0,
        vec![
            ("evm".into(), Ok(evm(&["ru[0]"]))),
            ("ru0".into(), Ok(failed("ru0", 5, false))),
        ],
    );
    assert!(ru.is_empty(), "{ru:?}");
}

#[test]
fn a_restarted_bu_is_told_to_rejoin_once() {
    let mut c = core();
    started(&mut c);
    let t0 = Instant::now();
    c.answers(
        t0,
        vec![("bu0".into(), Ok(reply("bu0", 7, Phase::Running, 1, 10)))],
    );
    // bu0 died and `evb up` started it again: another pid, idle
    let rejoins = c.answers(
        t0,
        vec![("bu0".into(), Ok(reply("bu0", 8, Phase::Idle, 0, 0)))],
    );
    assert_eq!(rejoins.len(), 1, "{rejoins:?}");
    assert_eq!((rejoins[0].node.id.as_str(), rejoins[0].run), ("bu0", 1));
    assert_eq!(rejoins[0].body.run, 1);
    // the same answer again: told once
    let again = c.answers(
        t0,
        vec![("bu0".into(), Ok(reply("bu0", 8, Phase::Idle, 0, 0)))],
    );
    assert!(again.is_empty(), "{again:?}");
    // an RU started again is not (its loss follows on_ru_loss)
    c.answers(
        t0,
        vec![("ru0".into(), Ok(reply("ru0", 3, Phase::Running, 1, 0)))],
    );
    let ru = c.answers(
        t0,
        vec![("ru0".into(), Ok(reply("ru0", 4, Phase::Idle, 0, 0)))],
    );
    assert!(ru.is_empty(), "{ru:?}");
}

#[test]
fn run_numbers_are_refused_when_taken_or_out_of_range() {
    let mut c = core();
    started(&mut c);
    c.finished(1, ended(true, "done"), 0.0);
    let e = c.cmd(Command::Start, &json!({"run": 1}), 0.0).unwrap_err();
    assert_eq!(e.0, 409);
    assert!(e.1.contains("next free number is 2"), "{}", e.1);
    for bad in [json!(0), json!(-1), json!("7"), json!(super::MAX_RUN + 1)] {
        let e = c
            .cmd(Command::Start, &json!({ "run": bad }), 0.0)
            .unwrap_err();
        assert_eq!(e.0, 400, "{bad}");
    }
    assert_eq!(c.state(), State::Ready, "refusals change nothing");
    let (r, _) = c
        .cmd(Command::Start, &json!({"run": super::MAX_RUN}), 0.0)
        .unwrap();
    assert_eq!(r["run"], super::MAX_RUN);
}

#[test]
fn a_reset_aborts_the_run_into_ready_and_a_verdict_fails_an_ok_run() {
    let mut c = core();
    started(&mut c);
    let (_, effects) = c.cmd(Command::Reset, &json!({}), 0.0).unwrap();
    assert_eq!(
        effects,
        [
            Effect::Abort("reset by the operator".into()),
            Effect::Pause(false)
        ]
    );
    c.finished(1, ended(false, "aborted"), 0.0);
    assert_eq!(c.state(), State::Ready);
    assert_eq!(c.run_record(1).unwrap().state, "aborted");
    // run 2 says ok, but its report does not add up: failed, the verdict its reason
    c.cmd(Command::Start, &json!({}), 0.0).unwrap();
    let report = evm_report_line(10, 0);
    c.finished(
        2,
        Finished {
            ok: true,
            reason: "done".into(),
            report: Some(report),
            fenced: None,
        },
        0.0,
    );
    assert_eq!(c.state(), State::Failed);
    let end = c.run_record(2).unwrap().end.clone().unwrap();
    assert!(!end.ok && !end.verdict.is_empty());
    assert_eq!(end.reason, end.verdict.join("; "));
    assert_eq!(end.triggered, Some(10));
    let listed = c.runs();
    assert!(listed
        .iter()
        .all(|r| r.end.as_ref().is_none_or(|e| e.report.is_none())));
}

#[test]
fn an_evm_of_one_run_refuses_run_control() {
    let mut c = Core::new(&Config::default(), Mode::Once);
    c.begin_once(1, 0.0);
    for cmd in [Command::Configure, Command::Start, Command::Halt] {
        let e = c.cmd(cmd, &json!({}), 0.0).unwrap_err();
        assert_eq!(e.0, 409, "{cmd:?}");
    }
    assert_eq!(c.state(), State::Starting);
}

#[test]
fn numbered_run_ids_fit_the_handshake() {
    assert_eq!(numbered_run_id("evb-local", 3), "evb-local#3");
    let long = "x".repeat(64);
    let id = numbered_run_id(&long, 12345);
    assert_eq!(id.len(), 64);
    assert!(id.ends_with("#12345"));
}

#[test]
fn prometheus_finds_every_node_with_a_known_address() {
    // ports found at start (control.base_port = 0): known once the nodes registered
    let cfg = Config::default();
    let c = Core::new(&cfg, Mode::Serve);
    let nodes = cfg.nodes();
    assert!(nodes.iter().all(|n| n.control.ends_with(":0")));
    assert!(c.scrape_targets(None, "").is_empty(), "nothing known yet");
    let mut evm = NodeStatus::new("evm", RunState::Running, RoleStats::Evm(Box::default()));
    let peer = |n: &evb_config::NodeSpec| match n.role {
        evb_config::Role::Ru => format!("ru[{}]", n.index),
        _ => format!("bu[{}]", n.index),
    };
    let others: Vec<_> = nodes
        .iter()
        .filter(|n| n.role != evb_config::Role::Evm)
        .collect();
    evm.registered = Some(
        others
            .iter()
            .enumerate()
            .skip(1) // the first has not registered yet
            .map(|(k, n)| evb_builder::Registered {
                peer: peer(n),
                rank: None,
                host: "h".into(),
                pid: 1,
                data: format!("127.0.0.1:{}", 5000 + k),
                control: format!("127.0.0.1:{}", 6000 + k),
            })
            .collect(),
    );
    let found = c.scrape_targets(Some(&evm), "127.0.0.1:5999");
    assert_eq!(found.len(), nodes.len() - 1, "{found:?}");
    assert!(found.iter().all(|t| t.labels["node"] != others[0].id));
    let evm_target = found.iter().find(|t| t.labels["role"] == "evm").unwrap();
    assert_eq!(evm_target.targets, ["127.0.0.1:5999"]);
    let second = found
        .iter()
        .find(|t| t.labels["node"] == others[1].id)
        .unwrap();
    assert_eq!(second.targets, ["127.0.0.1:6001"]);
    for t in &found {
        assert_eq!(t.labels["evb_run_id"], cfg.run.id);
    }
    // configured ports are used as they are
    let mut fixed = Config::default();
    fixed.control.base_port = 9100;
    let all = Core::new(&fixed, Mode::Serve).scrape_targets(None, "");
    assert_eq!(all.len(), fixed.nodes().len());
    assert!(
        all.iter().any(|t| t.targets == ["127.0.0.1:9100"]),
        "{all:?}"
    );
    // the JSON is Prometheus's http_sd format: a list of {targets, labels}
    let v = serde_json::to_value(&found).unwrap();
    assert!(v[0]["targets"].is_array() && v[0]["labels"]["role"].is_string());
}

/// The header's "built" is the EVM's count of final events while the run is under way: it
/// does not go backwards when a BU is killed and started again (its own counter starts from
/// zero), and once the run is over it is that run's, not 0.
#[test]
fn the_built_total_never_goes_backwards_and_outlives_the_run() {
    let mut c = core();
    started(&mut c);
    let t0 = Instant::now();
    c.answers(
        t0,
        vec![("bu0".into(), Ok(reply("bu0", 7, Phase::Running, 1, 6939)))],
    );
    let evm = |released| {
        let mut s = NodeStatus::new(
            "evm",
            RunState::Running,
            RoleStats::Evm(Box::new(EvmStats {
                triggered: released,
                released,
                ..Default::default()
            })),
        );
        s.run_number = Some(1);
        s
    };
    let s = c.status_json(Some(&evm(7000)), 0.0);
    assert_eq!(s["totals"]["events_built"], 7000);
    // bu0 killed and started again: it says 12; the EVM has 7100 final
    c.answers(
        t0 + Duration::from_secs(1),
        vec![("bu0".into(), Ok(reply("bu0", 8, Phase::Running, 1, 12)))],
    );
    let s = c.status_json(Some(&evm(7100)), 0.0);
    assert_eq!(s["totals"]["events_built"], 7100);
    c.on_status(&evm(7100));
    // an EVM line of another run is not this run's, nor is a missing one: the most the
    // ledger said stands (never the BUs' 12)
    let mut old = evm(99);
    old.run_number = Some(0);
    assert_eq!(
        c.status_json(Some(&old), 0.0)["totals"]["events_built"],
        7100
    );
    assert_eq!(c.status_json(None, 0.0)["totals"]["events_built"], 7100);
    // and a line that says less (an EVM status taken before) does not take it back
    assert_eq!(
        c.status_json(Some(&evm(7050)), 0.0)["totals"]["events_built"],
        7100
    );
    // the run ends: the total is the run's record, between runs too
    let report = evb_builder::RunReport {
        state: RunState::Halted,
        reason: None,
        n_ru: 2,
        n_bu: 2,
        seconds: 3.0,
        down: Vec::new(),
        evm: EvmStats {
            triggered: 8000,
            released: 8000,
            ..Default::default()
        },
        rus: vec![None, None],
        bus: vec![None, None],
    };
    let mut last = NodeStatus::new("evm", RunState::Halted, RoleStats::Evm(Box::default()));
    last.run = Some(report);
    let done = Finished {
        ok: true,
        reason: "done".into(),
        report: Some(last),
        fenced: None,
    };
    c.finished(1, done, 110.0);
    // (the verdict fails it: the report has no BU reports; over all the same)
    assert_ne!(c.state(), State::Running);
    let s = c.status_json(None, 0.0);
    assert_eq!(s["totals"]["events_built"], 8000);
}

#[test]
fn the_rate_history_is_kept_by_the_server_bounded_and_outlives_the_run() {
    use super::history::{MAX_POINTS, WINDOW_S};
    let mut c = core();
    let ids: Vec<String> = c.cfg().nodes().into_iter().map(|n| n.id).collect();
    let bus: Vec<String> = ids
        .iter()
        .filter(|i| i.starts_with("bu"))
        .cloned()
        .collect();
    assert!(!bus.is_empty(), "{ids:?}");
    // before any run: nothing
    c.sample(50.0);
    assert_eq!(history_json(&c, None)["t"].as_array().unwrap().len(), 0);
    started(&mut c);
    let t0 = Instant::now();
    // every BU builds 100 events a second of 100 bytes each, polled once a second
    let round = |c: &mut Core, i: u64| {
        let answers = ids
            .iter()
            .map(|id| {
                let r = at(reply(id, 7, Phase::Running, 1, 100 * i), i as f64);
                (id.clone(), Ok(r))
            })
            .collect();
        c.answers(t0 + Duration::from_secs(i), answers);
        c.sample(1000.0 + i as f64);
    };
    for i in 0..10 {
        round(&mut c, i);
    }
    let h = history_json(&c, None);
    assert_eq!(h["run"], 1);
    let t = h["t"].as_array().unwrap();
    assert_eq!(t.len(), 10, "{h}");
    assert_eq!(t[0], 1000.0);
    assert_eq!(t[9], 1009.0);
    // the first answer has no rate yet; then every BU adds 100 ev/s to the total
    let rate = h["totals"]["rate_hz"].as_array().unwrap();
    assert_eq!(rate[0], 0.0);
    assert_eq!(rate[5], 100.0, "the EVM's released events: {h}");
    assert_eq!(h["totals"]["bytes_per_s"][5], 10_000.0 * bus.len() as f64);
    assert_eq!(h["nodes"][&bus[0]]["rate_hz"][5], 100.0, "{h}");
    assert_eq!(
        h["nodes"].as_object().unwrap().len(),
        ids.len(),
        "a column per node: {h}"
    );
    // `since` gives the samples after a time only
    let after = history_json(&c, Some(1007.0));
    assert_eq!(after["t"], json!([1008.0, 1009.0]));
    assert_eq!(
        after["nodes"][&bus[0]]["rate_hz"].as_array().unwrap().len(),
        2
    );
    // bounded in number: a ring of MAX_POINTS (four polls a second while a node is silent)
    for i in 0..(MAX_POINTS as u64 + 50) {
        c.sample(1010.0 + i as f64 * 0.1);
    }
    assert_eq!(c.history_len(), MAX_POINTS);
    // and in time: samples older than WINDOW_S before the newest go
    c.sample(1010.0 + 10_000.0);
    c.sample(1010.0 + 10_000.0 + WINDOW_S - 1.0);
    assert_eq!(c.history_len(), 2);
    // the run ends: no more samples, but its history stays for the page
    c.finished(1, ended(true, "done"), 2000.0);
    c.sample(30_000.0);
    assert_eq!(c.history_len(), 2);
    assert_eq!(history_json(&c, None)["run"], 1);
    // the next run starts from an empty history
    c.cmd(Command::Start, &json!({}), 40_000.0).unwrap();
    let h = history_json(&c, None);
    assert_eq!(h["run"], 2);
    assert_eq!(h["started_unix"], 40_000.0);
    assert_eq!(h["t"].as_array().unwrap().len(), 0);
}

#[test]
fn the_build_latency_is_every_bu_s_histogram_of_the_run_added_up() {
    let mut c = core();
    started(&mut c);
    let bus: Vec<String> = c
        .cfg()
        .nodes()
        .into_iter()
        .map(|n| n.id)
        .filter(|i| i.starts_with("bu"))
        .collect();
    assert!(bus.len() >= 2, "{bus:?}");
    let with_latency = |id: &str, run: u64, us: &[u64]| {
        let mut r = reply(id, 7, Phase::Running, run, us.len() as u64);
        let mut h = evb_builder::LatencyHistogram::default();
        for u in us {
            h.record(Duration::from_micros(*u));
        }
        let stats = BuStats {
            events_built: us.len() as u64,
            latency: h,
            ..Default::default()
        };
        r.snapshot = Some(NodeStatus::new(
            id,
            RunState::Running,
            RoleStats::Bu(Box::new(stats)),
        ));
        r
    };
    let t0 = Instant::now();
    c.answers(
        t0,
        vec![
            (
                bus[0].clone(),
                Ok(with_latency(&bus[0], 1, &[30, 30, 3000])),
            ),
            (bus[1].clone(), Ok(with_latency(&bus[1], 1, &[30, 20_000]))),
        ],
    );
    let lat = &c.status_json(None, 0.0)["latency"];
    assert_eq!(lat["count"], 5, "{lat}");
    assert_eq!(lat["bus"], 2);
    assert_eq!(lat["counts"][0], 3, "≤ 50 µs: {lat}");
    assert_eq!(lat["counts"][6], 1, "≤ 5 ms: {lat}");
    assert_eq!(lat["counts"][8], 1, "≤ 25 ms: {lat}");
    // the true median (the HDR histogram's, within 1 %), not the bucket bound (50)
    assert_eq!(lat["p50_us"], 30, "{lat}");
    let p99 = lat["p99_us"].as_u64().unwrap();
    assert!((19_800..=20_200).contains(&p99), "{lat}");
    assert_eq!(
        lat["counts"].as_array().unwrap().len(),
        lat["bounds_us"].as_array().unwrap().len() + 1
    );
    // a BU whose snapshot is of another run does not count
    c.answers(
        t0 + Duration::from_secs(1),
        vec![(bus[1].clone(), Ok(with_latency(&bus[1], 0, &[30])))],
    );
    let lat = &c.status_json(None, 0.0)["latency"];
    assert_eq!(lat["count"], 3, "{lat}");
    assert_eq!(lat["bus"], 1);
}

#[test]
fn the_ru_to_bu_matrix_has_every_link_s_bytes_rate_and_queue() {
    let mut c = core();
    started(&mut c);
    let nodes = c.cfg().nodes();
    let rus: Vec<String> = nodes
        .iter()
        .filter(|n| n.id.starts_with("ru"))
        .map(|n| n.id.clone())
        .collect();
    let n_bu = nodes.iter().filter(|n| n.id.starts_with("bu")).count();
    assert!(rus.len() >= 2 && n_bu >= 2, "{nodes:?}");
    // RU i has sent (i + 1) × 1000 × (j + 1) bytes to BU j, and has 7 bytes queued to bu[1]
    let ru_reply = |id: &str, i: usize, scale: u64, run: u64| {
        let mut r = reply(id, 7, Phase::Running, run, 0);
        let stats = evb_builder::RuStats {
            payload_bytes_to_bu: (0..n_bu as u64)
                .map(|j| scale * (i as u64 + 1) * 1000 * (j + 1))
                .collect(),
            ..Default::default()
        };
        let mut s = NodeStatus::new(id, RunState::Running, RoleStats::Ru(Box::new(stats)));
        // the node's clock: the round of scale 1 at 0 s, of scale 3 at 2 s
        s.t = (scale - 1) as f64;
        s.peers = vec![
            evb_builder::PeerQueue {
                peer: "bu[1]".into(),
                queued_bytes: 7,
            },
            evb_builder::PeerQueue {
                peer: "evm".into(),
                queued_bytes: 99,
            },
        ];
        r.snapshot = Some(s);
        r
    };
    let t0 = Instant::now();
    let round = |c: &mut Core, t: Instant, scale: u64| {
        let answers = rus
            .iter()
            .enumerate()
            .map(|(i, id)| (id.clone(), Ok(ru_reply(id, i, scale, 1))))
            .collect();
        c.answers(t, answers);
    };
    round(&mut c, t0, 1);
    round(&mut c, t0 + Duration::from_secs(2), 3);
    let m = serde_json::to_value(c.links()).unwrap();
    assert_eq!(m["rus"].as_array().unwrap().len(), rus.len(), "{m}");
    assert_eq!(m["bus"].as_array().unwrap().len(), n_bu, "{m}");
    for i in 0..rus.len() {
        for j in 0..n_bu {
            let want = 3 * (i as u64 + 1) * 1000 * (j as u64 + 1);
            assert_eq!(m["bytes"][i][j], want, "ru {i} bu {j}: {m}");
            // (3 - 1) × the bytes over 2 s
            assert_eq!(m["bytes_per_s"][i][j], (want / 3) as f64, "{m}");
            assert_eq!(m["queued_bytes"][i][j], if j == 1 { 7 } else { 0 }, "{m}");
        }
    }
    // an RU whose answer is of another run is not in this run's matrix
    c.answers(
        t0 + Duration::from_secs(3),
        vec![(rus[0].clone(), Ok(ru_reply(&rus[0], 0, 5, 0)))],
    );
    let m = serde_json::to_value(c.links()).unwrap();
    assert_eq!(m["bytes"][0][0], 0, "{m}");
    assert_eq!(m["bytes"][1][0], 6000, "{m}");
}

/// A promoted standby records the run it followed last and did not take over as `unknown`:
/// over, not ok, no counts, never "complete" on the standby's word (it saw none of the run's
/// events); and the control stays ready for the next run, which is numbered after it.
#[test]
fn a_promoted_standby_records_a_run_it_did_not_take_over_as_unknown() {
    let mut c = core();
    c.number_from(5);
    c.verdict_unknown(6, 1000.0);
    let rec = c.run_record(6).expect("the run is recorded");
    assert_eq!(rec.state, "unknown");
    let end = rec.end.as_ref().unwrap();
    assert!(!end.ok);
    assert!(
        end.reason.contains("verdict is not known here"),
        "{}",
        end.reason
    );
    assert_eq!((end.triggered, end.events_built), (None, 0));
    assert_eq!(c.state(), State::Ready);
    let (reply, _) = c.cmd(Command::Start, &json!({}), 1001.0).unwrap();
    assert_eq!(reply["run"], 7, "{reply}");
}

/// A reader of the status (`evb ctl`, `evb up`) refuses a reply that lacks a count, naming
/// it, rather than taking it for zero: the shape that once counted a rejoin as a loss.
#[test]
fn a_status_reply_without_a_count_is_refused_naming_it() {
    let c = core();
    let mut v = c.status_json(None, 0.0);
    let whole = crate::client::Reply {
        status: 200,
        body: v.clone(),
    };
    assert!(whole.typed::<crate::replies::Status>("status").is_ok());
    v["totals"].as_object_mut().unwrap().remove("events_built");
    let r = crate::client::Reply {
        status: 200,
        body: v,
    };
    let e = r.typed::<crate::replies::Status>("status").unwrap_err();
    assert!(e.contains("events_built"), "{e}");
}

/// The EVM's report closes its run's record for the disk before the report goes on to its
/// readers, so that an EVM lost right after it leaves that verdict on disk (the shell
/// writes it before the line is printed). What the control serves, and its state, move on
/// only when the run is over at every node; that close keeps the record as it was written,
/// and writes no second closing line.
#[test]
fn the_evm_s_report_closes_its_run_s_record_before_it_goes_out() {
    let mut c = core();
    started(&mut c);
    let _ = c.take_changed();
    let report = evm_report_line(10, 10);
    let said = |ok: bool| Finished {
        ok,
        reason: if ok { "done" } else { "lost" }.into(),
        report: Some(report.clone()),
        fenced: None,
    };
    // another run's report closes nothing
    assert!(c.reported(2, said(true), 150.0).is_none());
    let rec = c
        .reported(1, said(true), 150.0)
        .expect("run 1's record, closed");
    assert_eq!(rec.state, "complete");
    assert_eq!(rec.end.as_ref().unwrap().events_built, 10);
    // what the control serves is still the open run, and the state has not moved on: the
    // nodes are not idle yet, and the next start must wait (`evb ctl wait` waits too)
    assert!(c.take_changed().is_empty());
    assert!(c.run_record(1).unwrap().end.is_none());
    assert_eq!(c.state(), State::Running);
    // a second report of the run closes nothing more
    assert!(c.reported(1, said(false), 151.0).is_none());
    // the run's end: the record stands as the report closed it, not written again
    c.finished(1, said(false), 152.0);
    assert!(c.take_changed().is_empty());
    let served = c.run_record(1).unwrap();
    assert_eq!(served, &rec);
    assert_eq!(c.state(), State::Ready);
    // a run whose report never came is closed at its end, as before
    c.cmd(Command::Start, &json!({}), 200.0).unwrap();
    c.finished(2, ended(false, "the EVM's node failed"), 210.0);
    assert_eq!(c.take_changed().len(), 1);
    assert_eq!(c.run_record(2).unwrap().state, "failed");
    assert_eq!(c.state(), State::Failed);
}

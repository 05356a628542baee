//! The event manager: starts the run when every node is ready, triggers events, assigns each
//! to a BU that has granted a credit, forwards releases to the RUs, keeps the ledger of every
//! event's fate, and ends the run.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use evb_wire::{EventRange, Message};
use serde::{Deserialize, Serialize};

use crate::action::{Action, NodeRef, Path, RunState};
use crate::ledger::Ledger;
use crate::report::{verdict, RunReport};
use crate::{BuStats, RuStats};

#[derive(Debug, Clone)]
pub struct EvmConfig {
    pub n_ru: u16,
    pub n_bu: u16,
    /// Stop triggering after this many events...
    pub max_events: Option<u64>,
    /// ... or after this long, whichever comes first.
    pub duration: Option<Duration>,
    /// Trigger rate limit; `None` means as fast as credits allow.
    pub rate_hz: Option<f64>,
    /// Most consecutive events given to one BU in one assignment.
    pub batch: u32,
    /// Abort when events are in flight and none is released for this long.
    pub stall_timeout: Duration,
    /// Most events triggered per `poll`, so IO keeps flowing.
    pub max_per_poll: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EvmStats {
    pub triggered: u64,
    pub released: u64,
    pub credits_received: u64,
    /// Credits granted by BUs and not yet used.
    pub credits_available: u64,
    /// Events assigned and not yet released.
    pub in_flight: u64,
    pub in_flight_high_water: u64,
    pub duplicate_releases: u64,
    pub unknown_releases: u64,
    pub misrouted_releases: u64,
    pub errors: u64,
}

pub struct Evm {
    cfg: EvmConfig,
    state: RunState,
    ready: HashSet<NodeRef>,
    credits: Vec<u64>,
    rr: usize,
    ledger: Ledger,
    started: Option<Instant>,
    stopped_at: Option<Instant>,
    last_progress: Instant,
    triggering_done: bool,
    ru_reports: HashMap<u16, RuStats>,
    bu_reports: HashMap<u16, BuStats>,
    abort_reason: Option<String>,
    actions: VecDeque<Action>,
    stats: EvmStats,
}

impl Evm {
    pub fn new(cfg: EvmConfig, now: Instant) -> Evm {
        let n_bu = cfg.n_bu as usize;
        Evm {
            cfg,
            state: RunState::Ready,
            ready: HashSet::new(),
            credits: vec![0; n_bu],
            rr: 0,
            ledger: Ledger::default(),
            started: None,
            stopped_at: None,
            last_progress: now,
            triggering_done: false,
            ru_reports: HashMap::new(),
            bu_reports: HashMap::new(),
            abort_reason: None,
            actions: VecDeque::new(),
            stats: EvmStats::default(),
        }
    }

    pub fn state(&self) -> RunState {
        self.state
    }

    pub fn stats(&self) -> EvmStats {
        let mut s = self.stats.clone();
        s.credits_available = self.credits.iter().sum();
        s.in_flight = self.ledger.in_flight();
        s
    }

    /// Events could be triggered right now (the driver should not sleep).
    pub fn has_work(&self) -> bool {
        self.state == RunState::Running
            && !self.triggering_done
            && self.cfg.rate_hz.is_none()
            && self.credits.iter().any(|&c| c > 0)
    }

    pub fn next_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    fn all_nodes(&self) -> impl Iterator<Item = NodeRef> {
        let rus = (0..self.cfg.n_ru).map(NodeRef::Ru);
        let bus = (0..self.cfg.n_bu).map(NodeRef::Bu);
        rus.chain(bus)
    }

    fn broadcast(&mut self, msg: Message, path: Path) {
        for to in self.all_nodes().collect::<Vec<_>>() {
            self.actions.push_back(Action::Send {
                to,
                msg: msg.clone(),
                path,
            });
        }
    }

    pub fn handle(&mut self, now: Instant, from: NodeRef, msg: Message) {
        match (msg, from) {
            (Message::Ready { available }, NodeRef::Ru(_) | NodeRef::Bu(_)) => {
                self.ready.insert(from);
                if available != evb_wire::UNLIMITED {
                    // A recording played once: the run ends with the shortest one.
                    self.cfg.max_events =
                        Some(self.cfg.max_events.map_or(available, |m| m.min(available)));
                }
                if self.state == RunState::Ready
                    && self.ready.len() == (self.cfg.n_ru + self.cfg.n_bu) as usize
                {
                    self.state = RunState::Running;
                    self.started = Some(now);
                    self.last_progress = now;
                    self.broadcast(Message::Start, Path::Now);
                }
            }
            (Message::Credit { bu, count }, NodeRef::Bu(b))
                if b == bu && (bu as usize) < self.credits.len() =>
            {
                if self.state == RunState::Running {
                    self.credits[bu as usize] += count as u64;
                    self.stats.credits_received += count as u64;
                }
            }
            (Message::Release(r), NodeRef::Bu(b)) if b == r.bu => {
                let outcome = self.ledger.release(r);
                self.stats.released += outcome.released;
                self.stats.duplicate_releases += outcome.duplicates;
                self.stats.unknown_releases += outcome.unknown;
                self.stats.misrouted_releases += outcome.misrouted;
                if outcome.released > 0 {
                    self.last_progress = now;
                }
                for valid in outcome.ranges {
                    for ru in 0..self.cfg.n_ru {
                        self.actions.push_back(Action::Send {
                            to: NodeRef::Ru(ru),
                            msg: Message::Release(valid),
                            path: Path::Batched,
                        });
                    }
                }
            }
            (Message::Report(json), NodeRef::Ru(i)) if self.state == RunState::Stopping => {
                match serde_json::from_str(&json) {
                    Ok(s) => {
                        self.ru_reports.insert(i, s);
                    }
                    Err(_) => self.stats.errors += 1,
                }
            }
            (Message::Report(json), NodeRef::Bu(i)) if self.state == RunState::Stopping => {
                match serde_json::from_str(&json) {
                    Ok(s) => {
                        self.bu_reports.insert(i, s);
                    }
                    Err(_) => self.stats.errors += 1,
                }
            }
            (Message::Abort(why), _) => self.abort(format!("{from} aborted: {why}")),
            _ => self.stats.errors += 1,
        }
    }

    /// A node's connection is gone. Before the run ends that is fatal (for now): every
    /// other node is told why and the run stops.
    pub fn peer_lost(&mut self, peer: NodeRef, reason: &str) {
        match self.state {
            RunState::Ready | RunState::Running => self.abort(format!("lost {peer}: {reason}")),
            RunState::Stopping => {
                let reported = match peer {
                    NodeRef::Ru(i) => self.ru_reports.contains_key(&i),
                    NodeRef::Bu(i) => self.bu_reports.contains_key(&i),
                    NodeRef::Evm => true,
                };
                if !reported {
                    self.abort(format!("lost {peer} before its report: {reason}"));
                }
            }
            _ => {}
        }
    }

    /// Stops the run now, telling every node why.
    pub fn abort(&mut self, reason: String) {
        if matches!(self.state, RunState::Halted | RunState::Aborted) {
            return;
        }
        self.state = RunState::Aborted;
        self.broadcast(Message::Abort(reason.clone()), Path::Now);
        self.abort_reason = Some(reason.clone());
        self.actions.push_back(Action::Exit { ok: false, reason });
    }

    pub fn poll(&mut self, now: Instant) {
        match self.state {
            RunState::Running => self.poll_running(now),
            RunState::Stopping => {
                let all = self.ru_reports.len() == self.cfg.n_ru as usize
                    && self.bu_reports.len() == self.cfg.n_bu as usize;
                if all {
                    self.state = RunState::Halted;
                    self.broadcast(Message::Halt, Path::Now);
                    let problems = verdict(&self.report(now));
                    let ok = problems.is_empty();
                    let reason = if ok {
                        "run complete".to_string()
                    } else {
                        problems.join("; ")
                    };
                    self.actions.push_back(Action::Exit { ok, reason });
                } else if now.duration_since(self.last_progress) > self.cfg.stall_timeout {
                    self.abort("nodes did not report after Stop".into());
                }
            }
            _ => {}
        }
    }

    fn poll_running(&mut self, now: Instant) {
        let started = self.started.unwrap_or(now);
        let elapsed = now.duration_since(started);
        if let Some(d) = self.cfg.duration {
            if elapsed >= d {
                self.triggering_done = true;
            }
        }
        if let Some(max) = self.cfg.max_events {
            if self.stats.triggered >= max {
                self.triggering_done = true;
            }
        }
        if !self.triggering_done {
            self.trigger(elapsed);
        }
        let in_flight = self.ledger.in_flight();
        self.stats.in_flight_high_water = self.stats.in_flight_high_water.max(in_flight);
        if self.triggering_done && in_flight == 0 {
            self.state = RunState::Stopping;
            self.stopped_at = Some(now);
            self.last_progress = now;
            self.broadcast(
                Message::Stop {
                    triggered: self.stats.triggered,
                },
                Path::Now,
            );
        } else if in_flight > 0 && now.duration_since(self.last_progress) > self.cfg.stall_timeout {
            self.abort(format!(
                "stalled: {in_flight} events in flight and none released for {:?}",
                self.cfg.stall_timeout
            ));
        }
    }

    fn trigger(&mut self, elapsed: Duration) {
        let mut allowed = self.cfg.max_per_poll;
        if let Some(rate) = self.cfg.rate_hz {
            let due = (rate * elapsed.as_secs_f64()) as u64;
            allowed = allowed.min(due.saturating_sub(self.stats.triggered));
        }
        if let Some(max) = self.cfg.max_events {
            allowed = allowed.min(max - self.stats.triggered);
        }
        let n = self.credits.len();
        while allowed > 0 {
            // next BU, round robin, that has credit
            let Some(bu) = (0..n)
                .map(|k| (self.rr + k) % n)
                .find(|&b| self.credits[b] > 0)
            else {
                break;
            };
            let count = allowed.min(self.credits[bu]).min(self.cfg.batch as u64);
            let range = EventRange {
                bu: bu as u16,
                first: self.ledger.next_id(),
                count: count as u32,
            };
            self.ledger.assign(range);
            self.credits[bu] -= count;
            self.stats.triggered += count;
            allowed -= count;
            self.rr = (bu + 1) % n;
            for ru in 0..self.cfg.n_ru {
                self.actions.push_back(Action::Send {
                    to: NodeRef::Ru(ru),
                    msg: Message::Assign(range),
                    path: Path::Batched,
                });
            }
            self.actions.push_back(Action::Send {
                to: NodeRef::Bu(bu as u16),
                msg: Message::Assign(range),
                path: Path::Batched,
            });
        }
    }

    /// The run as the EVM sees it now (final once halted).
    pub fn report(&self, now: Instant) -> RunReport {
        let end = self.stopped_at.unwrap_or(now);
        RunReport {
            state: self.state,
            reason: self.abort_reason.clone(),
            n_ru: self.cfg.n_ru,
            n_bu: self.cfg.n_bu,
            seconds: self
                .started
                .map_or(0.0, |s| end.duration_since(s).as_secs_f64()),
            evm: self.stats(),
            rus: (0..self.cfg.n_ru)
                .map(|i| self.ru_reports.get(&i).cloned())
                .collect(),
            bus: (0..self.cfg.n_bu)
                .map(|i| self.bu_reports.get(&i).cloned())
                .collect(),
        }
    }
}

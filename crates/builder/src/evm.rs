//! The event manager: starts the run when every node is ready, triggers events, assigns each
//! to a BU that has granted a credit, forwards releases to the RUs, keeps the ledger of every
//! event's fate, survives lost nodes as configured, and ends the run.
//!
//! One idea, one file: the EVM's state machine.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use evb_wire::{EventRange, Message};
use serde::{Deserialize, Serialize};

use crate::action::{Action, NodeRef, Path, RunState};
use crate::ids::FastSet;
use crate::ledger::Ledger;
use crate::report::{verdict, NodeEvent, NodeEventKind, RunReport};
use crate::{BuStats, RuStats};
use tracing::{error, warn};

mod takeover;
pub use takeover::{BuResync, RuResync, Takeover};

/// What the run does when an RU is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuLossPolicy {
    /// Stop the run cleanly, naming the lost RU.
    Stop,
    /// Go on: every event from then on (and every one not yet complete) is built without that
    /// source, flagged partial.
    Partial,
}

/// How long triggering waits at the start for every BU's first credits.
pub const FIRST_CREDITS_GRACE: Duration = Duration::from_millis(200);

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
    pub on_ru_loss: RuLossPolicy,
    pub assignment: Assignment,
    /// How long a BU's report of a lost data link from an RU waits for the RU itself to be
    /// lost (its connection to the EVM closed or silent: the RU-loss policy then applies)
    /// before the BU is dropped instead (the link alone is gone; the RU sends on to others).
    /// About the heartbeat timeout.
    pub link_grace: Duration,
    /// The BUs whose sinks commit their output (a file sink): their releases only make
    /// events accepted, and the events become final, and the RUs forget them, when the BU
    /// commits the part holding them (docs/protocol.md §6 step 7). Empty or shorter than
    /// `n_bu`: the BUs not named do not commit.
    pub commits: Vec<bool>,
    /// The spare BUs (`true`): the run starts without them, and each joins it when it
    /// says Ready while the run is on. Empty or shorter than `n_bu`: the BUs not named
    /// are not spares.
    pub spares: Vec<bool>,
}

impl EvmConfig {
    /// BU `b` is a spare.
    pub fn is_spare(&self, b: u16) -> bool {
        self.spares.get(b as usize).copied().unwrap_or(false)
    }

    /// How many BUs start the run (the spares do not).
    fn starting_bus(&self) -> usize {
        (0..self.n_bu).filter(|b| !self.is_spare(*b)).count()
    }
}

/// How the EVM picks the BU of the next batch of events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Assignment {
    /// The next BU in turn that has credit (a BU without credit is passed over).
    #[default]
    Credits,
    /// A BU drawn at random (uniform, from a fixed seed) for each batch; when it has no
    /// credit, triggering waits for it: the random traffic of the switch studies (seed 003),
    /// with its head-of-line blocking, for comparison.
    Random,
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
    /// Events taken from a lost BU and assigned again to another.
    pub reassigned: u64,
    /// Releases by each BU's current incarnation (a restarted BU starts again from zero).
    pub released_by_bu: Vec<u64>,
    /// Wrapping sum of the ids each BU's current incarnation released.
    pub released_id_sum_by_bu: Vec<u64>,
    /// Releases by BU incarnations that were lost (their reports died with them).
    pub released_by_lost: u64,
    pub released_id_sum_by_lost: u64,
    /// Events accepted from BUs whose sinks commit (each counted once per acceptance: an
    /// event accepted by a BU lost before committing it is accepted again elsewhere).
    #[serde(default)]
    pub accepted: u64,
    /// Parts of output committed (each one Commit answered).
    #[serde(default)]
    pub parts_committed: u64,
    /// Events in parts the EVM committed at a BU that was lost before it said the part was
    /// published, and that the EVM could not publish for it (the sink's directory is not
    /// reachable from the EVM's host): final, but in files under their temporary names.
    /// Judged: must be 0.
    #[serde(default)]
    pub committed_unpublished: u64,
    /// Parts of lost BUs (committed, not said published) that the EVM published for them.
    #[serde(default)]
    pub parts_published_for_lost: u64,
    /// From each trigger decision to its release by the BU that built it (built and handed
    /// to its sink), on the EVM's clock: a record's latency from its trigger, the wait for a
    /// BU's credit included (crate::entered says when each event entered).
    #[serde(default)]
    pub record_latency: crate::LatencyHistogram,
    /// Decisions from outside (`windows.outside`) received, and those still queued (not
    /// triggered: the run stopped first).
    #[serde(default)]
    pub decisions_received: u64,
    #[serde(default)]
    pub decisions_unbuilt: u64,
    /// What happened to nodes during the run, in order: every loss, with when and why, and
    /// every rejoin and refused report (see [`NodeEvent`]).
    pub lost: Vec<NodeEvent>,
    /// Nodes lost and not back.
    pub down: Vec<String>,
    /// Spare BUs that have not joined the run (none of its events are theirs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spares_out: Vec<String>,
    /// Messages from nodes already declared lost, not acted on.
    #[serde(default)]
    pub ignored_from_lost: u64,
    /// The operator ended the run early (Ctrl-C): triggering stopped, the rest drained.
    #[serde(default)]
    pub stopped_by_request: bool,
    /// The stages of the run's end reached so far, in order, each with when it was reached
    /// (docs/protocol.md §6, "The end of a run, in stages").
    #[serde(default)]
    pub stop_stages: Vec<StopStageAt>,
    /// Triggering is paused by the operator (events in flight are still built).
    #[serde(default)]
    pub paused: bool,
    /// How many times a standby took this run over (docs/standby.md): 0 for the first EVM.
    #[serde(default)]
    pub epoch: u16,
    /// This EVM is a standby still following the active one (not the run's EVM yet).
    #[serde(default)]
    pub following: bool,
    /// Time spent paused; it does not count towards `run.duration_s` or the rate.
    #[serde(default)]
    pub paused_s: f64,
    pub errors: u64,
}

/// The stages of a run's end, in order. Each has a time limit (`run.stall_timeout_ms`
/// without progress) whose end aborts the run naming the stage not reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopStage {
    /// No event is triggered any more (the count or duration reached, or a stop asked).
    TriggersStopped,
    /// Every event in flight is built and released: Stop goes to every node, whose
    /// sources stop.
    Drained,
    /// Every live node reported after Stop (its source stopped, its sink finished): the
    /// run ends.
    SourcesStopped,
}

impl StopStage {
    pub fn name(self) -> &'static str {
        match self {
            StopStage::TriggersStopped => "triggers stopped",
            StopStage::Drained => "drained",
            StopStage::SourcesStopped => "sources stopped",
        }
    }
}

/// A stage of the run's end and when it was reached (seconds since the run's Start).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StopStageAt {
    pub stage: StopStage,
    pub at_s: f64,
}

impl EvmStats {
    /// The last stage of the run's end reached (`None`: the run is not ending).
    pub fn stop_stage(&self) -> Option<StopStage> {
        self.stop_stages.last().map(|s| s.stage)
    }

    /// How many times nodes were lost during the run: the entries of `lost` that are losses
    /// (a rejoin or a refused report is none).
    pub fn losses(&self) -> usize {
        self.lost.iter().filter(|e| e.kind.is_loss()).count()
    }
}

pub struct Evm {
    cfg: EvmConfig,
    /// Trigger batches not yet wholly released, with when each event entered: the latency
    /// from the trigger to the release (crate::entered).
    pub(crate) decided: crate::entered::Pending,
    /// Live-fed RUs: when the events every RU holds grew.
    arrivals: crate::entered::Arrivals,
    state: RunState,
    ready: FastSet<NodeRef>,
    /// Data links BUs reported lost (RU, BU, when to judge): see `EvmConfig::link_grace`.
    links_reported_by_bus: Vec<(u16, u16, Instant)>,
    /// Nodes currently part of the run (lost ones are removed, rejoined ones return).
    alive: FastSet<NodeRef>,
    credits: Vec<u64>,
    /// Each BU's incarnation, as its control connection's Hello said (0: none known):
    /// every Assign names it, so that RUs send fragments only to the process that was
    /// assigned them (docs/protocol.md §6 item 11).
    incarnations: Vec<u16>,
    rr: usize,
    /// `Assignment::Random`: the BU drawn for the next batch, and the generator's state.
    drawn: Option<usize>,
    rng: u64,
    ledger: Ledger,
    /// Events of lost BUs waiting for another BU's credit.
    reassign: VecDeque<u64>,
    started: Option<Instant>,
    stopped_at: Option<Instant>,
    paused_since: Option<Instant>,
    paused_total: Duration,
    /// At the start: which BUs have granted their first credits. Triggering waits for all
    /// of them (at most `FIRST_CREDITS_GRACE`), so that the first BU to answer does not take
    /// a short run's events alone. `None` once that is over.
    first_credits: Option<Vec<bool>>,
    last_progress: Instant,
    triggering_done: bool,
    ru_reports: HashMap<u16, RuStats>,
    bu_reports: HashMap<u16, BuStats>,
    abort_reason: Option<String>,
    actions: VecDeque<Action>,
    stats: EvmStats,
    /// Events each live-fed RU has announced (`Available`); `None`: not live-fed.
    available: Vec<Option<u64>>,
    /// Per BU, the parts committed and not yet said published, with their event counts.
    unpublished: Vec<Vec<(u32, u64)>>,
    /// Parts of lost BUs committed and not said published: (bu, part, events), until the
    /// driver says whether it published them (`Evm::published_for`).
    in_doubt: Vec<(u16, u32, u64)>,
    /// Decisions from outside (`windows.outside`): their windows, queued until triggered
    /// (a record each, in arrival order); `None`: the EVM triggers by itself.
    outside: Option<VecDeque<evb_wire::window::DecisionWindow>>,
    /// When each decision queued in `outside` was taken in.
    outside_at: VecDeque<Instant>,
    /// BUs retiring (`Evm::retire`): given no more events; each told Stop once all it
    /// holds is final (true: told), then out of the run at its report.
    retiring: BTreeMap<u16, bool>,
    /// BUs that have been in the run: every BU but a spare from its start, a spare once it
    /// joined.
    joined: FastSet<u16>,
}

impl Evm {
    /// Records are decisions from outside (`windows.outside`): one is triggered per
    /// decision handed in ([`Evm::decide`]), and the RUs are told each record's window
    /// before its Assign.
    pub fn take_decisions_from_outside(&mut self) {
        self.outside.get_or_insert_with(VecDeque::new);
    }

    /// Decisions from outside, in arrival order, taken in at `now` (where their latency
    /// starts): each becomes the next record. Refused (`false`) when this EVM does not take
    /// them.
    pub fn decide(&mut self, now: Instant, windows: &[evb_wire::window::DecisionWindow]) -> bool {
        let Some(q) = &mut self.outside else {
            return false;
        };
        q.extend(windows.iter().cloned());
        self.outside_at.extend(windows.iter().map(|_| now));
        self.stats.decisions_received += windows.len() as u64;
        true
    }

    /// Decisions from outside: every record below this id is final (0 in other runs).
    pub fn decisions_final(&self) -> u64 {
        if self.outside.is_some() {
            self.ledger.final_until()
        } else {
            0
        }
    }

    /// Decisions from outside handed in and not yet triggered: the first one's record id
    /// and their windows, in order (for a standby's copy).
    pub fn queued_decisions(&self) -> (u64, Vec<evb_wire::window::DecisionWindow>) {
        let q = self.outside.as_ref();
        (
            self.ledger.next_id(),
            q.map_or_else(Vec::new, |q| q.iter().cloned().collect()),
        )
    }

    /// Decisions from outside: the record id the next decision handed in will have.
    pub fn next_decision_id(&self) -> u64 {
        self.ledger.next_id() + self.outside.as_ref().map_or(0, |q| q.len() as u64)
    }

    /// A standby taking over at `now`: the decisions the lost EVM had queued and not
    /// triggered, its records from the next id on, in order; they count as received (and
    /// as entered now: when the lost EVM took them in is not known here).
    pub fn carry_decisions(
        &mut self,
        now: Instant,
        windows: Vec<evb_wire::window::DecisionWindow>,
    ) {
        let Some(q) = &mut self.outside else {
            return;
        };
        self.outside_at.extend(windows.iter().map(|_| now));
        q.extend(windows);
        self.stats.decisions_received = self.ledger.next_id() + q.len() as u64;
    }

    pub fn new(cfg: EvmConfig, now: Instant) -> Evm {
        let n_bu = cfg.n_bu as usize;
        let cfg_n_ru = cfg.n_ru as usize;
        let stats = EvmStats {
            released_by_bu: vec![0; n_bu],
            released_id_sum_by_bu: vec![0; n_bu],
            ..EvmStats::default()
        };
        Evm {
            cfg,
            state: RunState::Ready,
            ready: FastSet::default(),
            links_reported_by_bus: Vec::new(),
            alive: FastSet::default(),
            credits: vec![0; n_bu],
            incarnations: vec![0; n_bu],
            rr: 0,
            drawn: None,
            rng: 0x9E37_79B9_7F4A_7C15,
            ledger: Ledger::default(),
            decided: Default::default(),
            arrivals: Default::default(),
            reassign: VecDeque::new(),
            started: None,
            stopped_at: None,
            paused_since: None,
            paused_total: Duration::ZERO,
            first_credits: None,
            last_progress: now,
            triggering_done: false,
            ru_reports: HashMap::new(),
            bu_reports: HashMap::new(),
            abort_reason: None,
            retiring: BTreeMap::new(),
            joined: FastSet::default(),
            actions: VecDeque::new(),
            stats,
            available: vec![None; cfg_n_ru],
            unpublished: vec![Vec::new(); n_bu],
            in_doubt: Vec::new(),
            outside: None,
            outside_at: VecDeque::new(),
        }
    }

    /// BU `bu`'s control connection is from the process of incarnation `inc` (its Hello):
    /// Assigns from now on name it.
    pub fn set_incarnation(&mut self, bu: u16, inc: u16) {
        if let Some(i) = self.incarnations.get_mut(bu as usize) {
            *i = inc;
        }
    }

    /// The incarnation an Assign to BU `bu` names.
    pub(crate) fn incarnation(&self, bu: u16) -> u16 {
        self.incarnations.get(bu as usize).copied().unwrap_or(0)
    }

    /// Whether BU `b`'s sink commits its output.
    fn commits(&self, b: u16) -> bool {
        self.cfg.commits.get(b as usize).copied().unwrap_or(false)
    }

    pub fn state(&self) -> RunState {
        self.state
    }

    /// A standby's EVM, following the active one (see [`EvmStats::following`]).
    pub fn set_following(&mut self, following: bool) {
        self.stats.following = following;
    }

    /// The configuration it runs by (a standby taking over makes its EVM with the same).
    pub fn config(&self) -> &EvmConfig {
        &self.cfg
    }

    /// How long the run has been triggering, pauses left out (zero before the start).
    pub fn elapsed(&self, now: Instant) -> Duration {
        let Some(started) = self.started else {
            return Duration::ZERO;
        };
        let end = self.stopped_at.unwrap_or(now);
        let paused_now = self
            .paused_since
            .map_or(Duration::ZERO, |t| end.saturating_duration_since(t));
        end.saturating_duration_since(started)
            .saturating_sub(self.paused_total + paused_now)
    }

    /// The RUs and BUs this EVM counts as down (none between runs).
    pub fn down_nodes(&self) -> Vec<NodeRef> {
        if self.state == RunState::Ready {
            return Vec::new();
        }
        self.all_nodes()
            .filter(|n| !self.alive.contains(n) && !self.spare_out(*n))
            .collect()
    }

    /// A spare BU that has not joined the run.
    fn spare_out(&self, n: NodeRef) -> bool {
        matches!(n, NodeRef::Bu(b) if self.cfg.is_spare(b) && !self.joined.contains(&b))
    }

    pub fn stats(&self) -> EvmStats {
        let mut s = self.stats.clone();
        s.credits_available = self.credits.iter().sum();
        s.in_flight = self.ledger.in_flight();
        s.down = self.down_nodes().iter().map(|n| n.to_string()).collect();
        s.spares_out = (0..self.cfg.n_bu)
            .map(NodeRef::Bu)
            .filter(|n| self.spare_out(*n))
            .map(|n| n.to_string())
            .collect();
        s.paused = self.paused_since.is_some();
        s.paused_s = self.paused_total.as_secs_f64();
        s.decisions_unbuilt = self.outside.as_ref().map_or(0, |q| q.len() as u64);
        s
    }

    /// Triggering is paused (the operator's `pause`).
    pub fn is_paused(&self) -> bool {
        self.paused_since.is_some()
    }

    /// Pauses or resumes triggering (the operator's `pause` / `resume`). While paused no
    /// event is triggered, events in flight are built and released as usual, and the clock
    /// of `run.duration_s` and of the rate limit stands still.
    pub fn set_paused(&mut self, now: Instant, paused: bool) {
        match (self.paused_since, paused) {
            (None, true) => self.paused_since = Some(now),
            (Some(t), false) => {
                self.paused_total += now.saturating_duration_since(t);
                self.paused_since = None;
                self.last_progress = now;
            }
            _ => {}
        }
    }

    /// Events could be triggered right now (the driver should not sleep).
    pub fn has_work(&self) -> bool {
        self.state == RunState::Running
            && ((!self.triggering_done
                && self.paused_since.is_none()
                && self.first_credits.is_none()
                && self.live_limit().is_none_or(|l| l > self.stats.triggered))
                || !self.reassign.is_empty())
            && self.cfg.rate_hz.is_none()
            && self.credits.iter().any(|&c| c > 0)
    }

    /// Events every live-fed RU still in the run can supply (`None`: no RU is live-fed).
    fn live_limit(&self) -> Option<u64> {
        self.available
            .iter()
            .enumerate()
            .filter(|(i, _)| {
                self.alive.contains(&NodeRef::Ru(*i as u16)) || self.state == RunState::Ready
            })
            .filter_map(|(_, a)| *a)
            .min()
    }

    /// A live-fed RU holds fragments for events `[0, count)`; with `done`, that is all.
    fn on_available(&mut self, now: Instant, ru: u16, count: u64, done: bool) {
        let Some(a) = self.available.get_mut(ru as usize) else {
            self.stats.errors += 1;
            return;
        };
        if a.is_some_and(|before| count < before) {
            // what was announced may already be assigned: it cannot be taken back
            warn!(
                "ru[{ru}] announced {count} events after {}: counted as a protocol error",
                a.unwrap_or(0)
            );
            self.stats.errors += 1;
            return;
        }
        *a = Some(count);
        if let Some(limit) = self.live_limit() {
            self.arrivals.reached(now, limit);
        }
        if done {
            // Its streams ended: the run ends with the events every RU can supply.
            self.cfg.max_events = Some(self.cfg.max_events.map_or(count, |m| m.min(count)));
        }
    }

    pub fn next_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    fn all_nodes(&self) -> impl Iterator<Item = NodeRef> {
        let rus = (0..self.cfg.n_ru).map(NodeRef::Ru);
        let bus = (0..self.cfg.n_bu).map(NodeRef::Bu);
        rus.chain(bus)
    }

    /// Sends to every node still in the run.
    fn broadcast(&mut self, msg: Message, path: Path) {
        let mut to = self.live_rus();
        to.extend(self.live_bus());
        self.send_to(to, msg, path);
    }

    /// RUs still in the run.
    fn live_rus(&self) -> Vec<NodeRef> {
        (0..self.cfg.n_ru)
            .map(NodeRef::Ru)
            .filter(|n| self.alive.contains(n))
            .collect()
    }

    /// BUs still in the run.
    fn live_bus(&self) -> Vec<NodeRef> {
        (0..self.cfg.n_bu)
            .map(NodeRef::Bu)
            .filter(|n| self.alive.contains(n))
            .collect()
    }

    fn send_to(&mut self, to: Vec<NodeRef>, msg: Message, path: Path) {
        for n in to {
            self.actions.push_back(Action::Send {
                to: n,
                msg: msg.clone(),
                path,
            });
        }
    }

    pub fn handle(&mut self, now: Instant, from: NodeRef, msg: Message) {
        // A node out of the run has no say: what it sent before its connection was closed
        // (a release of events already handed to another BU) must not count. Only Ready
        // brings it back (a restarted BU).
        let in_run = matches!(self.state, RunState::Running | RunState::Stopping);
        if in_run && !self.alive.contains(&from) && !matches!(msg, Message::Ready { .. }) {
            self.stats.ignored_from_lost += 1;
            return;
        }
        match (msg, from) {
            (Message::Ready { available }, NodeRef::Ru(_) | NodeRef::Bu(_)) => {
                self.on_ready(now, from, available)
            }
            (Message::Credit { bu, count }, NodeRef::Bu(b))
                if b == bu && (bu as usize) < self.credits.len() =>
            {
                if self.state == RunState::Running && self.alive.contains(&from) {
                    // a retiring BU's credits are kept (not used): its retirement may be
                    // called off, and credits dropped would never come back
                    self.credits[bu as usize] += count as u64;
                    self.stats.credits_received += count as u64;
                    if let Some(seen) = &mut self.first_credits {
                        seen[bu as usize] = true;
                    }
                }
            }
            (Message::Release(r), NodeRef::Bu(b)) if b == r.bu => {
                let commits = self.commits(b);
                let outcome = if commits {
                    self.ledger.accept(r)
                } else {
                    self.ledger.release(r)
                };
                self.stats.duplicate_releases += outcome.duplicates;
                self.stats.unknown_releases += outcome.unknown;
                self.stats.misrouted_releases += outcome.misrouted;
                if outcome.released > 0 {
                    self.last_progress = now;
                }
                if commits {
                    self.stats.accepted += outcome.released;
                }
                for valid in outcome.ranges {
                    self.time_decisions(now, valid);
                    if !commits {
                        self.count_final(b, valid);
                    }
                    // The echo tells the BU these are its output (see `Bu::accepted`).
                    self.send_to(vec![from], Message::Release(valid), Path::Batched);
                }
            }
            (Message::Commit { bu, part, ranges }, NodeRef::Bu(b)) if b == bu => {
                self.commit(now, b, part, &ranges)
            }
            (Message::PartPublished { bu, part }, NodeRef::Bu(b)) if b == bu => {
                let parts = &mut self.unpublished[b as usize];
                match parts.iter().position(|(p, _)| *p == part) {
                    Some(k) => {
                        parts.remove(k);
                    }
                    None => self.stats.errors += 1,
                }
            }
            (Message::Available { count, done }, NodeRef::Ru(r)) => {
                self.on_available(now, r, count, done)
            }
            (Message::LinkLost { peer, inc }, NodeRef::Ru(_)) if peer < self.cfg.n_bu => {
                let current = self.incarnation(peer);
                if inc != 0 && current != 0 && inc != current {
                    // about a process of this BU that was replaced (restarted) since: late
                    // news of a loss already handled, not of the BU in the run now
                    self.stats.ignored_from_lost += 1;
                    tracing::info!(
                        "{from}'s report of a lost link to bu[{peer}] names incarnation {inc}, replaced by {current}: ignored"
                    );
                } else {
                    self.link_lost(now, from, peer)
                }
            }
            (Message::LinkLost { peer, .. }, NodeRef::Bu(b)) if peer < self.cfg.n_ru => {
                if self.state == RunState::Running
                    && self.alive.contains(&from)
                    && self.alive.contains(&NodeRef::Ru(peer))
                {
                    self.links_reported_by_bus
                        .push((peer, b, now + self.cfg.link_grace));
                }
            }
            (Message::Report(json), NodeRef::Ru(i)) if self.state == RunState::Stopping => {
                match serde_json::from_str(&json) {
                    Ok(s) => {
                        self.ru_reports.insert(i, s);
                    }
                    Err(e) => self.bad_report(now, from, e),
                }
            }
            (Message::Report(json), NodeRef::Bu(i))
                if self.state == RunState::Running && self.retiring.get(&i) == Some(&true) =>
            {
                match serde_json::from_str(&json) {
                    Ok(s) => {
                        self.bu_reports.insert(i, s);
                        self.retired(now, i);
                    }
                    Err(e) => self.bad_report(now, from, e),
                }
            }
            (Message::Report(json), NodeRef::Bu(i)) if self.state == RunState::Stopping => {
                match serde_json::from_str(&json) {
                    Ok(s) => {
                        self.bu_reports.insert(i, s);
                    }
                    Err(e) => self.bad_report(now, from, e),
                }
            }
            (Message::Abort(why), _) => self.abort(format!("{from} aborted: {why}")),
            (msg, _) => {
                warn!(
                    "unexpected {:?} from {from} in state {:?}: counted as a protocol error",
                    msg.msg_type(),
                    self.state
                );
                self.stats.errors += 1
            }
        }
    }

    /// Events of BU `b` became final: counted as its output, and the RUs forget them.
    fn count_final(&mut self, b: u16, valid: EventRange) {
        let bi = b as usize;
        self.stats.released += valid.count as u64;
        self.stats.released_by_bu[bi] += valid.count as u64;
        let ids = (valid.first..valid.end()).fold(0u64, |s, id| s.wrapping_add(id));
        self.stats.released_id_sum_by_bu[bi] =
            self.stats.released_id_sum_by_bu[bi].wrapping_add(ids);
        self.send_to(self.live_rus(), Message::Release(valid), Path::Batched);
    }

    /// BU `b` asks to publish part `part` of its output, holding `ranges` of accepted
    /// events. It is in the run (a lost BU's messages never get here), so the answer is yes:
    /// the events become final now, whatever happens to the BU afterwards, and the RUs
    /// forget them. Ids that were not accepted from it are counted as bad releases.
    fn commit(&mut self, now: Instant, b: u16, part: u32, ranges: &[EventRange]) {
        if !self.commits(b) || !matches!(self.state, RunState::Running | RunState::Stopping) {
            self.stats.errors += 1;
            return;
        }
        let mut events = 0;
        for r in ranges {
            let outcome = self.ledger.commit(*r);
            self.stats.duplicate_releases += outcome.duplicates;
            self.stats.unknown_releases += outcome.unknown;
            self.stats.misrouted_releases += outcome.misrouted;
            events += outcome.released;
            for valid in outcome.ranges {
                self.count_final(b, valid);
            }
        }
        self.last_progress = now;
        self.stats.parts_committed += 1;
        self.unpublished[b as usize].push((part, events));
        // at once: a Stop (sent at once) must not overtake the BU's last Committed
        let msg = Message::Committed { bu: b, part };
        self.send_to(vec![NodeRef::Bu(b)], msg, Path::Now);
    }

    /// The driver published (`published`), or could not reach, part `part` of lost BU
    /// `bu` ([`Action::PublishFor`]). A part it could not publish is judged: its events are
    /// final, in files under their temporary names only.
    pub fn published_for(&mut self, bu: u16, part: u32, published: bool) {
        let Some(k) = self
            .in_doubt
            .iter()
            .position(|(b, p, _)| (*b, *p) == (bu, part))
        else {
            return;
        };
        let (_, _, events) = self.in_doubt.remove(k);
        if published {
            self.stats.parts_published_for_lost += 1;
        } else {
            self.stats.committed_unpublished += events;
        }
    }

    /// A Report body that does not hold the counters of docs/protocol.md §4 ("Report body",
    /// under the message bodies): counted, and said why, so that an outside implementation
    /// can see what to fix.
    fn bad_report(&mut self, now: Instant, from: NodeRef, e: serde_json::Error) {
        error!(
            "report from {from} refused: {e} (docs/protocol.md §4, Report body, lists its fields)"
        );
        self.stats.errors += 1;
        let at = self.seconds_since_start(now);
        let event = NodeEvent::new(from, at, NodeEventKind::ReportRefused, e.to_string());
        self.stats.lost.push(event);
    }

    /// An RU's data connection to a BU closed while both are in the run: that BU can no
    /// longer get every fragment, so it leaves the run as a lost BU does (its events are
    /// rebuilt elsewhere) instead of the run stalling on it.
    fn link_lost(&mut self, now: Instant, ru: NodeRef, bu: u16) {
        let b = NodeRef::Bu(bu);
        if self.state != RunState::Running || !self.alive.contains(&b) {
            return;
        }
        warn!("lost {b}: data link from {ru} lost; dropping {b} from the run");
        self.peer_lost(now, b, &format!("data link from {ru} lost"));
        self.actions.push_back(Action::Disconnect(b));
    }

    /// A BU's reports of lost data links, once their grace is over: the RU still in the run
    /// means the link alone is gone, and the BU leaves as for an RU's LinkLost; the RU lost
    /// meanwhile (it died: its links to every BU closed) means the RU-loss policy has
    /// already decided, and the report is moot.
    fn judge_reported_links(&mut self, now: Instant) {
        if self.links_reported_by_bus.is_empty() {
            return;
        }
        let due: Vec<(u16, u16)> = self
            .links_reported_by_bus
            .iter()
            .filter(|(_, _, at)| now >= *at)
            .map(|(r, b, _)| (*r, *b))
            .collect();
        self.links_reported_by_bus.retain(|(_, _, at)| now < *at);
        for (r, b) in due {
            if self.alive.contains(&NodeRef::Ru(r)) {
                self.link_lost(now, NodeRef::Ru(r), b);
            }
        }
    }

    fn on_ready(&mut self, now: Instant, from: NodeRef, available: u64) {
        if available != evb_wire::UNLIMITED {
            // A recording played once: the run ends with the shortest one.
            self.cfg.max_events = Some(self.cfg.max_events.map_or(available, |m| m.min(available)));
        }
        match self.state {
            RunState::Ready => {
                self.ready.insert(from);
                self.alive.insert(from);
                if let NodeRef::Bu(b) = from {
                    self.joined.insert(b);
                }
                // the run starts once every RU and every BU but the spares is ready (a
                // spare ready already starts with them)
                let starting = |n: &NodeRef| !matches!(n, NodeRef::Bu(b) if self.cfg.is_spare(*b));
                let ready = self.ready.iter().filter(|n| starting(n)).count();
                if ready == self.cfg.n_ru as usize + self.cfg.starting_bus() {
                    self.state = RunState::Running;
                    self.started = Some(now);
                    self.first_credits = Some(vec![false; self.cfg.n_bu as usize]);
                    self.last_progress = now;
                    self.broadcast(Message::Start, Path::Now);
                }
            }
            // A BU that retired from this run (its report is in, while the run runs) does
            // not come back to it as a new process (`evb up` restarted it): its report is
            // the run's, and a second incarnation's would stand for both. It is told so.
            RunState::Running if matches!(from, NodeRef::Bu(b) if self.bu_reports.contains_key(&b)) =>
            {
                self.actions.push_back(Action::Send {
                    to: from,
                    msg: Message::Abort(format!(
                        "{from} retired from this run: it does not rejoin it"
                    )),
                    path: Path::Now,
                });
            }
            // A restarted BU rejoins the running system, and a spare joins it: it starts
            // and grants credits.
            RunState::Running if matches!(from, NodeRef::Bu(_)) && !self.alive.contains(&from) => {
                self.alive.insert(from);
                let at = self.seconds_since_start(now);
                // a spare's first Ready is its join; any other BU's (also one this EVM,
                // a standby that took over, never saw Ready) is a rejoin
                let first = matches!(from, NodeRef::Bu(b) if self.joined.insert(b));
                let kind = match from {
                    NodeRef::Bu(b) if first && self.cfg.is_spare(b) => NodeEventKind::Joined,
                    _ => NodeEventKind::Rejoined,
                };
                let event = NodeEvent::new(from, at, kind, "");
                self.stats.lost.push(event);
                self.actions.push_back(Action::Send {
                    to: from,
                    msg: Message::Start,
                    path: Path::Now,
                });
            }
            _ => self.stats.errors += 1,
        }
    }

    /// The run's end reached `stage` at `now` (once: a stage is reached once).
    fn reached(&mut self, now: Instant, stage: StopStage) {
        if !self.stats.stop_stages.iter().any(|s| s.stage == stage) {
            let at_s = self.seconds_since_start(now);
            self.stats.stop_stages.push(StopStageAt { stage, at_s });
        }
    }

    /// Seconds from the run's Start to `now` (0 before it).
    fn seconds_since_start(&self, now: Instant) -> f64 {
        self.started
            .map_or(0.0, |s| now.saturating_duration_since(s).as_secs_f64())
    }

    /// A node's connection is gone (or its heartbeats stopped).
    pub fn peer_lost(&mut self, now: Instant, peer: NodeRef, reason: &str) {
        match self.state {
            RunState::Ready => self.abort(format!("lost {peer} before the run started: {reason}")),
            RunState::Running => {
                if !self.alive.remove(&peer) {
                    return;
                }
                let at = self.seconds_since_start(now);
                let event = NodeEvent::new(peer, at, NodeEventKind::Lost, reason);
                self.stats.lost.push(event);
                match peer {
                    NodeRef::Bu(b) => self.bu_lost(now, b, reason),
                    NodeRef::Ru(r) => match self.cfg.on_ru_loss {
                        RuLossPolicy::Stop => self.abort(format!("lost {peer}: {reason}")),
                        RuLossPolicy::Partial => {
                            // Builders complete every event without it from now on.
                            self.send_to(self.live_bus(), Message::SourceLost { ru: r }, Path::Now);
                            if self.live_rus().is_empty() {
                                self.abort("every RU is lost".into());
                            }
                        }
                    },
                    NodeRef::Evm => {}
                }
            }
            RunState::Stopping => {
                let reported = match peer {
                    NodeRef::Ru(i) => self.ru_reports.contains_key(&i),
                    NodeRef::Bu(i) => self.bu_reports.contains_key(&i),
                    NodeRef::Evm => true,
                };
                if !reported && self.alive.remove(&peer) {
                    let at = self.seconds_since_start(now);
                    let kind = NodeEventKind::LostBeforeReport;
                    self.stats.lost.push(NodeEvent::new(peer, at, kind, reason));
                }
            }
            _ => {}
        }
    }

    /// Takes back everything a lost BU held and had not made final; other BUs build it again
    /// (the RUs still hold the fragments: nothing that is not final was freed).
    fn bu_lost(&mut self, now: Instant, b: u16, _reason: &str) {
        let bi = b as usize;
        self.credits[bi] = 0;
        // killed while retiring: a dead BU like any other
        self.retiring.remove(&b);
        self.stats.released_by_lost += std::mem::take(&mut self.stats.released_by_bu[bi]);
        let sum = std::mem::take(&mut self.stats.released_id_sum_by_bu[bi]);
        self.stats.released_id_sum_by_lost = self.stats.released_id_sum_by_lost.wrapping_add(sum);
        // committed, and the BU died before it said the part was published: its files are
        // durable under their temporary names, and the driver publishes them for it
        for (part, events) in std::mem::take(&mut self.unpublished[bi]) {
            self.in_doubt.push((b, part, events));
            self.actions.push_back(Action::PublishFor { bu: b, part });
        }
        // a BU lost again (restarted, rejoined, lost) before its first loss's events were
        // given to another: those wait in the queue already, and must go out once
        let queued: HashSet<u64> = self.reassign.iter().copied().collect();
        let orphans: Vec<u64> = self
            .ledger
            .unreleased_of(b)
            .into_iter()
            .filter(|id| !queued.contains(id))
            .collect();
        self.stats.reassigned += orphans.len() as u64;
        self.reassign.extend(orphans);
        self.last_progress = now;
        // every BU left is retiring: those not told Stop yet build on (a run with no BU to
        // give events to would only stall), and their retirement is called off
        let building = |e: &Self| {
            e.live_bus()
                .into_iter()
                .any(|n| matches!(n, NodeRef::Bu(x) if !e.retiring.contains_key(&x)))
        };
        if !building(self) {
            let called_off: Vec<u16> = self
                .retiring
                .iter()
                .filter(|(_, told)| !**told)
                .map(|(b, _)| *b)
                .collect();
            for b in called_off {
                self.retiring.remove(&b);
                let at = self.seconds_since_start(now);
                let why = "retirement called off: the last other BU was lost";
                let event = NodeEvent::new(NodeRef::Bu(b), at, NodeEventKind::RetireCalledOff, why);
                self.stats.lost.push(event);
                warn!("bu[{b}]: {why}");
            }
        }
        if self.live_bus().is_empty() {
            self.abort(format!(
                "every BU is lost ({} events in flight)",
                self.ledger.in_flight()
            ));
        }
    }

    /// The operator retires BU `b` from the run under way (docs/protocol.md §6 item 18):
    /// it is given no more events (its credits are kept, unused); once everything it holds
    /// is final (released, and with a
    /// committing sink committed and published) it is told Stop, reports, is told Halt and
    /// leaves, its counts in the run's report. Killed meanwhile, it is a lost BU.
    ///
    /// # Errors
    /// Why it cannot retire: the run is not running, the BU is not in it (or retiring
    /// already), or it is the last BU that would be left.
    pub fn retire(&mut self, now: Instant, b: u16) -> Result<(), String> {
        let bu = NodeRef::Bu(b);
        if self.state != RunState::Running {
            return Err(format!("{bu}: only a running run's BU can retire"));
        }
        if !self.alive.contains(&bu) {
            return Err(format!("{bu} is not in the run"));
        }
        if self.retiring.contains_key(&b) {
            return Err(format!("{bu} is retiring already"));
        }
        let staying = self
            .live_bus()
            .into_iter()
            .filter(|n| *n != bu && !matches!(n, NodeRef::Bu(x) if self.retiring.contains_key(x)))
            .count();
        if staying == 0 {
            return Err(format!("{bu} is the last BU of the run: it cannot retire"));
        }
        self.retiring.insert(b, false);
        let at = self.seconds_since_start(now);
        let event = NodeEvent::new(bu, at, NodeEventKind::Retiring, "asked to retire");
        self.stats.lost.push(event);
        self.last_progress = now;
        Ok(())
    }

    /// Each retiring BU whose events are all final, and whose committed parts are all
    /// published, is told Stop (it answers with its report).
    fn stop_retired(&mut self) {
        let due: Vec<u16> = self
            .retiring
            .iter()
            .filter(|(b, told)| {
                !**told
                    && self.ledger.unreleased_of(**b).is_empty()
                    && self.unpublished[**b as usize].is_empty()
            })
            .map(|(b, _)| *b)
            .collect();
        for b in due {
            self.retiring.insert(b, true);
            let stop = Message::Stop {
                triggered: self.stats.triggered,
            };
            self.send_to(vec![NodeRef::Bu(b)], stop, Path::Now);
        }
    }

    /// A retiring BU reported: out of the run, told Halt.
    fn retired(&mut self, now: Instant, b: u16) {
        let bu = NodeRef::Bu(b);
        self.retiring.remove(&b);
        self.alive.remove(&bu);
        // out of the run: its credits with it
        self.credits[b as usize] = 0;
        let at = self.seconds_since_start(now);
        let event = NodeEvent::new(
            bu,
            at,
            NodeEventKind::Retired,
            "retired: every event it held is final",
        );
        self.stats.lost.push(event);
        self.send_to(vec![bu], Message::Halt, Path::Now);
        self.last_progress = now;
        if self.live_bus().is_empty() {
            self.abort(format!(
                "every BU is lost or retired ({} events in flight)",
                self.ledger.in_flight()
            ));
        }
    }

    /// The operator asks the run to end (Ctrl-C, `stop`): no new events; what is in flight
    /// is built and released, then Stop, reports and the verdict as at a normal end. Before
    /// the run started it is the same run with nothing triggered: when every node is ready
    /// it starts and stops at once, so the nodes end cleanly and the verdict says that
    /// nothing was lost (an abort here used to fail a run that lost nothing). Nodes that
    /// never come still fail it at `connect_timeout_s`.
    pub fn request_stop(&mut self, now: Instant) {
        match self.state {
            RunState::Running | RunState::Ready | RunState::Configured if !self.triggering_done => {
                self.triggering_done = true;
                self.stats.stopped_by_request = true;
                self.last_progress = now;
            }
            _ => {}
        }
    }

    /// Stops the run now, telling every node why.
    pub fn abort(&mut self, reason: String) {
        if self.state.is_over() {
            return;
        }
        self.broadcast(Message::Abort(reason.clone()), Path::Now);
        self.state = RunState::Aborted;
        self.abort_reason = Some(reason.clone());
        self.actions.push_back(Action::Exit { ok: false, reason });
    }

    pub fn poll(&mut self, now: Instant) {
        match self.state {
            RunState::Running => self.poll_running(now),
            RunState::Stopping => {
                let missing = self.all_nodes().any(|n| {
                    self.alive.contains(&n)
                        && match n {
                            NodeRef::Ru(i) => !self.ru_reports.contains_key(&i),
                            NodeRef::Bu(i) => !self.bu_reports.contains_key(&i),
                            NodeRef::Evm => false,
                        }
                });
                if !missing {
                    self.reached(now, StopStage::SourcesStopped);
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
                    let silent: Vec<String> = self
                        .all_nodes()
                        .filter(|n| {
                            self.alive.contains(n)
                                && match n {
                                    NodeRef::Ru(i) => !self.ru_reports.contains_key(i),
                                    NodeRef::Bu(i) => !self.bu_reports.contains_key(i),
                                    NodeRef::Evm => false,
                                }
                        })
                        .map(|n| n.to_string())
                        .collect();
                    self.abort(format!(
                        "the stop's stage \"{}\" not reached: no report after Stop from {} in {:?}",
                        StopStage::SourcesStopped.name(),
                        silent.join(", "),
                        self.cfg.stall_timeout
                    ));
                }
            }
            _ => {}
        }
    }

    fn poll_running(&mut self, now: Instant) {
        let started = self.started.unwrap_or(now);
        let paused_now = self
            .paused_since
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        let elapsed = now
            .duration_since(started)
            .saturating_sub(self.paused_total + paused_now);
        if self.cfg.duration.is_some_and(|d| elapsed >= d)
            || self
                .cfg
                .max_events
                .is_some_and(|m| self.stats.triggered >= m)
        {
            self.triggering_done = true;
        }
        self.judge_reported_links(now);
        self.assign_orphans();
        self.stop_retired();
        if let Some(seen) = &self.first_credits {
            let all = (0..self.cfg.n_bu)
                .all(|b| seen[b as usize] || !self.alive.contains(&NodeRef::Bu(b)));
            if all || now.duration_since(started) >= FIRST_CREDITS_GRACE {
                self.first_credits = None;
            }
        }
        if !self.triggering_done && self.paused_since.is_none() && self.first_credits.is_none() {
            self.trigger(now, elapsed);
        }
        if self.triggering_done {
            self.reached(now, StopStage::TriggersStopped);
        }
        let in_flight = self.ledger.in_flight();
        self.stats.in_flight_high_water = self.stats.in_flight_high_water.max(in_flight);
        if self.triggering_done && in_flight == 0 {
            self.reached(now, StopStage::Drained);
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
            // ending, the stage not reached is said by name
            let stage = if self.triggering_done {
                format!(
                    "the stop's stage \"{}\" not reached: ",
                    StopStage::Drained.name()
                )
            } else {
                String::new()
            };
            self.abort(format!(
                "{stage}stalled: {in_flight} events in flight and none released for {:?}",
                self.cfg.stall_timeout
            ));
        }
    }

    /// The BU of the next batch of new events, as `assignment` says; `None`: wait.
    fn pick_bu(&mut self) -> Option<usize> {
        if self.cfg.assignment == Assignment::Credits {
            return self.next_bu();
        }
        if self.live_bus().is_empty() {
            return None;
        }
        let n = self.credits.len() as u64;
        loop {
            let b = match self.drawn {
                Some(b) => b,
                None => {
                    // xorshift64*: a few lines serve, and the run replays
                    self.rng ^= self.rng >> 12;
                    self.rng ^= self.rng << 25;
                    self.rng ^= self.rng >> 27;
                    let b = (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) % n;
                    *self.drawn.insert(b as usize)
                }
            };
            // a lost or retiring BU is never waited for: draw again
            if !self.alive.contains(&NodeRef::Bu(b as u16))
                || self.retiring.contains_key(&(b as u16))
            {
                self.drawn = None;
                continue;
            }
            return (self.credits[b] > 0).then_some(b);
        }
    }

    /// The next BU, round robin, that has credit.
    fn next_bu(&self) -> Option<usize> {
        let n = self.credits.len();
        (0..n)
            .map(|k| (self.rr + k) % n)
            .find(|&b| self.credits[b] > 0 && !self.retiring.contains_key(&(b as u16)))
    }

    fn send_assign(&mut self, range: EventRange) {
        let mut to = self.live_rus();
        to.push(NodeRef::Bu(range.bu));
        let inc = self.incarnation(range.bu);
        self.send_to(to, Message::Assign(range, inc), Path::Batched);
    }

    /// Events of lost BUs go first, to whichever BU has credit.
    fn assign_orphans(&mut self) {
        while !self.reassign.is_empty() {
            let Some(bu) = self.next_bu() else { break };
            let mut take = self.credits[bu].min(self.cfg.batch as u64);
            while take > 0 {
                let Some(first) = self.reassign.pop_front() else {
                    break;
                };
                // runs of consecutive ids share one Assign
                let mut count = 1u32;
                while (count as u64) < take
                    && self.reassign.front() == Some(&(first + count as u64))
                {
                    self.reassign.pop_front();
                    count += 1;
                }
                let range = EventRange {
                    bu: bu as u16,
                    first,
                    count,
                };
                self.ledger.reassign(range);
                self.credits[bu] -= count as u64;
                take -= count as u64;
                self.send_assign(range);
            }
            self.rr = (bu + 1) % self.credits.len();
        }
    }

    fn trigger(&mut self, now: Instant, elapsed: Duration) {
        let mut allowed = self.cfg.max_per_poll;
        if let Some(rate) = self.cfg.rate_hz {
            let due = (rate * elapsed.as_secs_f64()) as u64;
            allowed = allowed.min(due.saturating_sub(self.stats.triggered));
        }
        if let Some(max) = self.cfg.max_events {
            allowed = allowed.min(max - self.stats.triggered);
        }
        if let Some(limit) = self.live_limit() {
            // live-fed RUs: only events whose fragments have arrived
            allowed = allowed.min(limit.saturating_sub(self.stats.triggered));
        }
        if let Some(q) = &self.outside {
            // decisions from outside: a record per decision handed in
            allowed = allowed.min(q.len() as u64);
        }
        while allowed > 0 {
            let Some(bu) = self.pick_bu() else { break };
            self.drawn = None;
            let count = allowed.min(self.credits[bu]).min(self.cfg.batch as u64);
            let range = EventRange {
                bu: bu as u16,
                first: self.ledger.next_id(),
                count: count as u32,
            };
            self.ledger.assign(range);
            let entered = self.entered(now, elapsed, range.first, count);
            self.decided.insert(range.first, count, entered);
            self.credits[bu] -= count;
            self.stats.triggered += count;
            allowed -= count;
            self.rr = (bu + 1) % self.credits.len();
            self.send_windows(range);
            self.send_assign(range);
        }
    }

    /// Decisions from outside: the RUs hear the windows of `range`'s records before its
    /// Assign, on the same connections (docs/protocol.md §10.4).
    fn send_windows(&mut self, range: EventRange) {
        let Some(q) = &mut self.outside else {
            return;
        };
        let windows: Vec<_> = q.drain(..range.count as usize).collect();
        for msg in Message::windows(range.first, &windows) {
            self.send_to(self.live_rus(), msg, Path::Batched);
        }
    }

    /// The latency from each trigger in `r` (when it entered, crate::entered) to its
    /// release by the BU that built it (built and handed to its sink), into
    /// `record_latency`; batches fully released are forgotten.
    fn time_decisions(&mut self, now: Instant, r: EventRange) {
        self.decided
            .release(now, r.first, r.count as u64, &mut self.stats.record_latency);
    }

    /// When the `count` events from `first` on, triggered now, entered: due (paced), taken in (decisions
    /// from outside), held by every RU (live-fed), or now (the EVM triggers when a BU has
    /// credit). Takes the queued decisions' moments.
    fn entered(
        &mut self,
        now: Instant,
        elapsed: Duration,
        first: u64,
        count: u64,
    ) -> crate::entered::Entered {
        use crate::entered::{paced, Entered};
        if self.outside.is_some() {
            let n = (count as usize).min(self.outside_at.len());
            let each: Vec<Instant> = self.outside_at.drain(..n).collect();
            return match each.first() {
                Some(&t) if each.iter().all(|&e| e == t) && n == count as usize => Entered::At(t),
                _ => Entered::Each(each),
            };
        }
        if self.available.iter().any(Option::is_some) {
            return self.arrivals.take(now, first, count);
        }
        match self.cfg.rate_hz {
            Some(rate) if rate > 0.0 => paced(now, elapsed, rate, self.stats.triggered),
            _ => Entered::At(now),
        }
    }

    /// The run as the EVM sees it now (final once halted).
    pub fn report(&self, now: Instant) -> RunReport {
        let end = self.stopped_at.unwrap_or(now);
        let stats = self.stats();
        RunReport {
            state: self.state,
            reason: self.abort_reason.clone(),
            n_ru: self.cfg.n_ru,
            n_bu: self.cfg.n_bu,
            seconds: self
                .started
                .map_or(0.0, |s| end.duration_since(s).as_secs_f64()),
            down: stats.down.clone(),
            evm: stats,
            rus: (0..self.cfg.n_ru)
                .map(|i| self.ru_reports.get(&i).cloned())
                .collect(),
            bus: (0..self.cfg.n_bu)
                .map(|i| self.bu_reports.get(&i).cloned())
                .collect(),
        }
    }
}

//! A model checker (stateright) over the real roles: the [`Evm`], its standby's
//! [`Evm::take_over`], the [`Ru`]s and the [`Bu`]s, in a small system (1 RU, 2 BUs, a few
//! events), through interleavings of message delivery (in order per connection, as every
//! transport keeps it), the passing of time, a BU killed (`kill -9`: its connections close
//! with what was on them) and restarted (a new process: a new incarnation, which the EVM
//! learns from its Hello and names in its Assigns), and the EVM lost then replaced by its
//! standby, rebuilt from what the live nodes resync (the old EVM's connections gone with
//! what was on them; the session model, crates/node/src/session/model.rs, checks that a
//! fenced EVM's words never become output). The harness plays the node's driver where the
//! roles leave it to it: an RU's fragments go to a BU only over a connection of the
//! incarnation their Assign named (`Links::conn_to_incarnation`), else they wait for a
//! process the RU has not reached yet ([`Awaiting`], the driver's own) or stay held. A BU
//! process started during the run counts its connections (and says Ready) before the RU
//! counts its own to it: that is a step of its own (`RuReaches`), at any moment after.
//!
//! The roles own pools and clocks and are not `Clone`: a state is the list of steps that led
//! to it, replayed from the start to reach it, and two states are the same when what they
//! show is (each machine's counters and resync, every connection's contents, the sinks'
//! output). That may merge states that differ only inside a machine, so the check is
//! exhaustive over what is shown, not over every byte of memory; every state it reports
//! is a real execution.
//!
//! Checked in every state reached:
//! - **no event built twice**: no event reaches the sinks of the BUs still in the run
//!   twice (a BU killed takes its sink's output with it: what it delivered and released
//!   before is counted by the EVM as `released_by_lost`);
//! - **an OK verdict is true**: a run whose EVM halted with a clean verdict has every event
//!   triggered in some sink;
//! - **one verdict per run**: at most one EVM report ends the run;
//! - **no old incarnation's fragments reach a new one**: a restarted BU gets no fragment
//!   of an Assign that named the process before it;
//! - **fragments are withheld only from a process that is gone**: an RU never keeps back
//!   fragments from a BU process running in the run (nothing would reassign them: the run
//!   stalls).
//!
//! And that the model reaches what it is for (`sometimes`): a takeover, a run ended OK after
//! one, a run ended OK after a BU loss, a restarted BU that built events. A test plants a
//! bug (the driver's incarnation check switched off) and asserts the checker finds the
//! counterexample.

use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};

use stateright::{Checker, Chooser, Model, Property};

use super::*;
use crate::Awaiting;

const N_RU: u16 = 1;
const N_BU: u16 = 2;

/// One step of the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Step {
    /// Time passes (50 µs): every live machine polls, and what they send is queued.
    Tick,
    /// Everything queued on the connection from → to arrives, in order.
    Deliver(NodeRef, NodeRef),
    /// A BU is killed.
    KillBu(u16),
    /// A killed BU is started again: a new process, a new incarnation.
    RestartBu(u16),
    /// The EVM is lost: its connections close with what was on them; the nodes go on.
    LoseEvm,
    /// The standby takes over: the live nodes resync, and a new EVM is rebuilt from it.
    TakeOver,
    /// The spare BU (bu1, in a system with one) is started: its first process.
    JoinSpare,
    /// The RUs count their connection to BU `b`'s process now running: its HelloAck has
    /// come (the BU counted it, and may have told the EVM it is ready, before).
    RuReaches(u16),
}

/// What a state shows: enough to tell states apart, to offer the next steps and to check
/// the properties.
#[derive(Debug, Clone, Default)]
struct Shown {
    fingerprint: u64,
    /// Connections with something queued.
    busy: Vec<(NodeRef, NodeRef)>,
    killed: Vec<u16>,
    /// BUs killed so far (a restarted one counts).
    kills: usize,
    evm_lost: bool,
    took_over: bool,
    /// Every node exited, or the EVM halted.
    over: bool,
    /// An event in two live sinks (or twice in one).
    twice: Option<u64>,
    /// The EVM halted with a clean verdict while an event triggered is in no sink.
    ok_with_missing: Option<u64>,
    /// EVM reports that ended the run.
    verdicts: usize,
    ended_ok: bool,
    /// A fragment of an Assign that named an earlier incarnation reached a restarted BU.
    stale_fragment: bool,
    /// A restarted BU's sink holds events.
    restarted_built: bool,
    /// The spare BU has not been started.
    spare_out: bool,
    /// The spare's first process built events.
    spare_built: bool,
    /// BUs running whose connection the RUs have not counted yet.
    unreached: Vec<u16>,
    /// An RU kept fragments from a BU process that is running and in the run: nothing
    /// would reassign their events (the stall CI found).
    withheld_from_live: bool,
}

#[derive(Debug, Clone)]
struct St {
    steps: Vec<Step>,
    shown: Shown,
}

impl Hash for St {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.shown.fingerprint.hash(h)
    }
}

impl PartialEq for St {
    fn eq(&self, other: &St) -> bool {
        self.shown.fingerprint == other.shown.fingerprint
    }
}

impl Eq for St {}

/// What a connection carries: a message, or an RU's run of fragments with the incarnation
/// of the BU its Assign named.
enum Item {
    Msg(Message),
    Frag(u16, Chain),
}

/// The running system, rebuilt from the steps.
struct World {
    evm: Evm,
    rus: Vec<Ru>,
    bus: Vec<Bu>,
    sinks: Vec<CountingSink>,
    /// Each BU's incarnation now (1 for the first process), and the sinks of BU processes
    /// that were killed.
    incarnation: Vec<u16>,
    lost_sinks: Vec<CountingSink>,
    stale_fragment: bool,
    restarted: Vec<u16>,
    queues: BTreeMap<(NodeRef, NodeRef), VecDeque<Item>>,
    killed: Vec<u16>,
    evm_lost: bool,
    took_over: bool,
    start: Instant,
    now: Instant,
    /// EVM reports that ended the run: (ok, verdict clean).
    ended: Vec<(bool, bool)>,
    exits: usize,
    planted: Planted,
    events: u64,
    /// bu1 is a spare (issue 69), not started yet while `spare_out` holds.
    spare: bool,
    spare_out: bool,
    /// Each RU's view of each BU: the incarnation of the connection it counted (`None`:
    /// none, or not yet), and what it keeps for a process not reached yet.
    ru_view: Vec<Vec<Option<u16>>>,
    awaiting: Vec<Awaiting>,
    withheld_from_live: bool,
}

/// A bug planted on purpose, for the checker to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Planted {
    None,
    /// The driver sends an RU's fragments to whatever process of the BU is there.
    IgnoreIncarnation,
    /// The driver's rule before `Awaiting`: fragments for a process this RU has not
    /// reached yet are held as if it were gone.
    HoldUnreached,
}

/// A BU process of incarnation `inc`, as the node starts it.
fn bu_process(i: u16) -> Bu {
    let mut b = Bu::new(bu_cfg(i, N_RU, 2));
    b.set_join(false);
    b.connections_up();
    b.set_standby(true);
    b
}

impl World {
    fn new(planted: Planted, events: u64, spare: bool) -> World {
        let now = Instant::now();
        let cfg = EvmConfig {
            spares: vec![false, spare],
            ..evm_cfg(N_RU, N_BU, events)
        };
        let mut evm = Evm::new(cfg, now);
        for i in 0..N_BU {
            evm.set_incarnation(i, 1);
        }
        let mut w = World {
            evm,
            rus: (0..N_RU).map(|i| ru(i, 16 * 1024, 16)).collect(),
            bus: (0..N_BU).map(bu_process).collect(),
            sinks: (0..N_BU).map(|_| CountingSink::default()).collect(),
            incarnation: vec![1; N_BU as usize],
            lost_sinks: Vec::new(),
            stale_fragment: false,
            restarted: Vec::new(),
            queues: BTreeMap::new(),
            killed: Vec::new(),
            evm_lost: false,
            took_over: false,
            start: now,
            now,
            ended: Vec::new(),
            exits: 0,
            planted,
            events,
            spare,
            spare_out: spare,
            ru_view: vec![
                (0..N_BU)
                    .map(|b| (!(spare && b == 1)).then_some(1))
                    .collect();
                N_RU as usize
            ],
            awaiting: (0..N_RU).map(|_| Awaiting::default()).collect(),
            withheld_from_live: false,
        };
        for r in &mut w.rus {
            r.connections_up();
            r.set_standby(true);
        }
        for (r, view) in w.ru_view.iter().enumerate() {
            for (b, v) in view.iter().enumerate() {
                if let Some(inc) = v {
                    w.awaiting[r].reached(b as u16, *inc);
                }
            }
        }
        w
    }

    /// The driver's send of an RU's fragments for BU `b`'s process `inc`: over the
    /// connection to that process the RU counted, else kept for it if the RU never reached
    /// it, else held (the process is gone: the EVM reassigns).
    fn send_fragments(&mut self, r: u16, b: u16, inc: u16, data: Chain, count: u32) {
        let (ri, bi) = (r as usize, b as usize);
        if self.planted == Planted::IgnoreIncarnation && self.down(b) {
            return;
        }
        if self.ru_view[ri][bi] == Some(inc) || self.planted == Planted::IgnoreIncarnation {
            self.queues
                .entry((NodeRef::Ru(r), NodeRef::Bu(b)))
                .or_default()
                .push_back(Item::Frag(inc, data));
            return;
        }
        let kept = self.planted != Planted::HoldUnreached
            && self.awaiting[ri].keep(self.now, b, inc, data, count);
        if !kept && inc == self.incarnation[bi] && !self.down(b) {
            self.withheld_from_live = true;
        }
    }

    /// Every RU counts its connection to BU `b`'s running process; what waited for it goes.
    fn ru_reaches(&mut self, b: u16) {
        let inc = self.incarnation[b as usize];
        for r in 0..N_RU {
            self.ru_view[r as usize][b as usize] = Some(inc);
            for (data, _) in self.awaiting[r as usize].reached(b, inc) {
                self.queues
                    .entry((NodeRef::Ru(r), NodeRef::Bu(b)))
                    .or_default()
                    .push_back(Item::Frag(inc, data));
            }
        }
    }

    fn dead(&self, n: NodeRef) -> bool {
        match n {
            NodeRef::Evm => self.evm_lost,
            NodeRef::Bu(b) => self.down(b),
            NodeRef::Ru(_) => false,
        }
    }

    /// BU `b`'s process is not running: killed, or a spare not started.
    fn down(&self, b: u16) -> bool {
        self.killed.contains(&b) || (self.spare_out && b == 1)
    }

    fn collect(&mut self) {
        let mut out = Vec::new();
        if !self.evm_lost {
            while let Some(a) = self.evm.next_action() {
                out.push((NodeRef::Evm, a));
            }
        }
        for (i, r) in self.rus.iter_mut().enumerate() {
            while let Some(a) = r.next_action() {
                out.push((NodeRef::Ru(i as u16), a));
            }
        }
        for (i, b) in self.bus.iter_mut().enumerate() {
            while let Some(a) = b.next_action() {
                out.push((NodeRef::Bu(i as u16), a));
            }
        }
        for (from, a) in out {
            if self.dead(from) {
                continue;
            }
            match a {
                Action::Send { to, msg, .. } if !self.dead(to) => self
                    .queues
                    .entry((from, to))
                    .or_default()
                    .push_back(Item::Msg(msg)),
                Action::SendFragments {
                    to: NodeRef::Bu(b),
                    inc,
                    data,
                    count,
                } => {
                    let NodeRef::Ru(r) = from else { continue };
                    self.send_fragments(r, b, inc, data, count);
                }
                Action::Accepted(r) => {
                    let NodeRef::Bu(i) = from else { continue };
                    let _ = self.sinks[i as usize].accepted(r.first, r.count);
                }
                Action::Disconnect(NodeRef::Bu(i)) => self.kill_bu(i),
                Action::Exit { ok, .. } => {
                    self.exits += 1;
                    if from == NodeRef::Evm {
                        let clean = verdict(&self.evm.report(self.now)).is_empty();
                        self.ended.push((ok, clean));
                    }
                }
                _ => {}
            }
        }
        for i in 0..self.bus.len() {
            if self.down(i as u16) {
                continue;
            }
            while let Some(ev) = self.bus[i].next_built() {
                let _ = self.sinks[i].deliver(&ev);
                self.bus[i].delivered(ev.event_id, ev.bytes);
            }
        }
    }

    fn kill_bu(&mut self, i: u16) {
        if self.killed.contains(&i) {
            return;
        }
        self.killed.push(i);
        for view in &mut self.ru_view {
            view[i as usize] = None;
        }
        let n = NodeRef::Bu(i);
        self.queues.retain(|(f, t), _| *f != n && *t != n);
        if !self.evm_lost {
            self.evm.peer_lost(self.now, n, "killed");
        }
        let inc = self.incarnation[i as usize];
        for r in &mut self.rus {
            r.link_lost(i, inc);
        }
    }

    fn step(&mut self, s: Step) {
        match s {
            Step::Tick => {
                self.now += Duration::from_micros(50);
                if !self.evm_lost {
                    self.evm.poll(self.now);
                }
                for r in &mut self.rus {
                    r.poll(self.now);
                }
                let down: Vec<bool> = (0..N_BU).map(|i| self.down(i)).collect();
                for (i, b) in self.bus.iter_mut().enumerate() {
                    if !down[i] {
                        b.poll(self.now);
                    }
                }
            }
            Step::Deliver(from, to) => {
                let q = self.queues.remove(&(from, to)).unwrap_or_default();
                for item in q {
                    self.deliver(from, to, item);
                    self.collect();
                }
            }
            Step::KillBu(i) => self.kill_bu(i),
            Step::RestartBu(i) => {
                self.killed.retain(|&k| k != i);
                self.restarted.push(i);
                let k = i as usize;
                self.incarnation[k] += 1;
                self.bus[k] = bu_process(i);
                let old = std::mem::take(&mut self.sinks[k]);
                self.lost_sinks.push(old);
                // its control Hello names the new incarnation, before its Ready
                self.evm.set_incarnation(i, self.incarnation[k]);
            }
            Step::LoseEvm => {
                self.evm_lost = true;
                self.queues
                    .retain(|(f, t), _| *f != NodeRef::Evm && *t != NodeRef::Evm);
                for r in &mut self.rus {
                    r.peer_lost(NodeRef::Evm, "lost");
                }
                for (i, b) in self.bus.iter_mut().enumerate() {
                    if !self.killed.contains(&(i as u16)) {
                        b.peer_lost(NodeRef::Evm, "lost");
                    }
                }
            }
            Step::TakeOver => self.take_over(),
            Step::JoinSpare => {
                // its first process: connected, it says Ready (the EVM's join)
                self.spare_out = false;
                self.bus[1] = bu_process(1);
            }
            Step::RuReaches(b) => self.ru_reaches(b),
        }
        self.collect();
    }

    fn deliver(&mut self, from: NodeRef, to: NodeRef, item: Item) {
        match item {
            Item::Msg(msg) => match to {
                NodeRef::Evm => self.evm.handle(self.now, from, msg),
                NodeRef::Ru(i) => self.rus[i as usize].handle(self.now, from, msg),
                NodeRef::Bu(i) => self.bus[i as usize].handle(self.now, from, msg),
            },
            Item::Frag(inc, data) => {
                let NodeRef::Bu(i) = to else { return };
                if inc != self.incarnation[i as usize] {
                    // the driver's rule: only over a connection of the Assign's incarnation
                    if self.planted != Planted::IgnoreIncarnation {
                        return;
                    }
                    self.stale_fragment = true;
                }
                let page = decode_fragments(&data);
                self.bus[i as usize].handle_page(self.now, from, page);
            }
        }
    }

    /// The standby takes over from what the live nodes say (the old EVM dropped the BUs
    /// killed before it was lost: it told its standby so).
    fn take_over(&mut self) {
        let rus: Vec<RuResync> = self
            .rus
            .iter_mut()
            .map(|r| over_the_wire_ru(&r.resync()))
            .collect();
        let mut bus = Vec::new();
        for (i, b) in self.bus.iter_mut().enumerate() {
            if !self.killed.contains(&(i as u16)) {
                bus.push(over_the_wire_bu(&b.resync()));
            }
        }
        let t = Takeover {
            epoch: 1,
            elapsed: self.now - self.start,
            dropped: self.killed.iter().map(|&b| NodeRef::Bu(b)).collect(),
            reason: "lost".into(),
            // each BU's Hello to the new EVM names its incarnation
            incarnations: self.incarnation.clone(),
            ..Takeover::default()
        };
        self.evm = Evm::take_over(evm_cfg(N_RU, N_BU, self.events), self.now, t, rus, bus);
        self.evm_lost = false;
        self.took_over = true;
    }

    fn show(&mut self) -> Shown {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let mut busy = Vec::new();
        for (k, q) in &self.queues {
            if q.is_empty() {
                continue;
            }
            busy.push(*k);
            k.hash(&mut h);
            for item in q {
                match item {
                    Item::Msg(m) => format!("{m:?}").hash(&mut h),
                    Item::Frag(inc, d) => {
                        inc.hash(&mut h);
                        for (f, _) in decode_fragments(d) {
                            f.event_id.hash(&mut h);
                        }
                    }
                }
            }
        }
        self.killed.hash(&mut h);
        self.spare_out.hash(&mut h);
        self.incarnation.hash(&mut h);
        self.ru_view.hash(&mut h);
        self.withheld_from_live.hash(&mut h);
        for a in &self.awaiting {
            for b in 0..N_BU {
                for (inc, d) in a.waiting_for(b) {
                    (b, inc).hash(&mut h);
                    for (f, _) in decode_fragments(d) {
                        f.event_id.hash(&mut h);
                    }
                }
            }
        }
        self.stale_fragment.hash(&mut h);
        (self.evm_lost, self.took_over, self.exits, self.ended.len()).hash(&mut h);
        if !self.evm_lost {
            format!("{:?}", self.evm.stats().released).hash(&mut h);
            format!("{:?}", self.evm.state()).hash(&mut h);
            format!("{:?}", self.evm.stats().triggered).hash(&mut h);
            // the credits it holds: a state that has them is not one that awaits them
            self.evm.stats().credits_available.hash(&mut h);
        }
        for r in &mut self.rus {
            format!("{:?}", r.state()).hash(&mut h);
            format!("{:?}", r.resync()).hash(&mut h);
        }
        let down: Vec<bool> = (0..N_BU).map(|i| self.down(i)).collect();
        for (i, b) in self.bus.iter_mut().enumerate() {
            if down[i] {
                continue;
            }
            format!("{:?}", b.state()).hash(&mut h);
            format!("{:?}", b.resync()).hash(&mut h);
        }
        let mut seen: HashSet<u64> = HashSet::new();
        let mut twice = None;
        for (i, s) in self.sinks.iter().enumerate() {
            let mut ids: Vec<u64> = s.ids.iter().copied().collect();
            ids.sort_unstable();
            ids.hash(&mut h);
            if self.killed.contains(&(i as u16)) {
                continue;
            }
            if s.duplicates > 0 && twice.is_none() {
                twice = ids.first().copied();
            }
            for id in ids {
                if !seen.insert(id) && twice.is_none() {
                    twice = Some(id);
                }
            }
        }
        let all: HashSet<u64> = self
            .sinks
            .iter()
            .chain(&self.lost_sinks)
            .flat_map(|s| s.ids.iter().copied())
            .collect();
        let ok_with_missing = self
            .ended
            .iter()
            .any(|&(ok, clean)| ok && clean)
            .then(|| (0..self.events).find(|id| !all.contains(id)))
            .flatten();
        Shown {
            fingerprint: h.finish(),
            busy,
            killed: self.killed.clone(),
            kills: self.killed.len() + self.restarted.len(),
            evm_lost: self.evm_lost,
            took_over: self.took_over,
            over: !self.ended.is_empty() || self.exits > (N_RU + N_BU) as usize,
            twice,
            ok_with_missing,
            verdicts: self.ended.len(),
            ended_ok: self.ended.iter().any(|&(ok, clean)| ok && clean),
            stale_fragment: self.stale_fragment,
            restarted_built: self
                .restarted
                .iter()
                .any(|&i| self.sinks[i as usize].events > 0),
            spare_out: self.spare_out,
            spare_built: self.spare && !self.restarted.contains(&1) && self.sinks[1].events > 0,
            unreached: (0..N_BU)
                .filter(|&b| {
                    !self.down(b)
                        && self
                            .ru_view
                            .iter()
                            .any(|v| v[b as usize] != Some(self.incarnation[b as usize]))
                })
                .collect(),
            withheld_from_live: self.withheld_from_live,
        }
    }
}

/// The system to explore: at most `faults` faults (a BU killed, the EVM lost).
struct System {
    events: u64,
    faults: usize,
    planted: Planted,
    /// Random walks: every step makes a new state (a walk ends where it meets a state it
    /// saw, and a tick that changes nothing shown would end it).
    walks: bool,
    /// bu1 is a spare (issue 69): the run starts without it, and it may join at any step;
    /// no standby (the configuration refuses spares with one).
    spare: bool,
}

impl System {
    fn replay(&self, steps: &[Step]) -> World {
        let mut w = World::new(self.planted, self.events, self.spare);
        w.collect();
        for s in steps {
            w.step(*s);
        }
        w
    }
}

impl Model for System {
    type State = St;
    type Action = Step;

    fn init_states(&self) -> Vec<St> {
        let mut w = self.replay(&[]);
        vec![St {
            steps: Vec::new(),
            shown: w.show(),
        }]
    }

    fn actions(&self, st: &St, acts: &mut Vec<Step>) {
        let sh = &st.shown;
        if sh.over {
            return;
        }
        acts.push(Step::Tick);
        for (f, t) in &sh.busy {
            acts.push(Step::Deliver(*f, *t));
        }
        for &b in &sh.unreached {
            acts.push(Step::RuReaches(b));
        }
        let faults = sh.kills + usize::from(sh.evm_lost || sh.took_over);
        if sh.evm_lost {
            acts.push(Step::TakeOver);
        }
        if sh.spare_out {
            acts.push(Step::JoinSpare);
        }
        if !sh.evm_lost {
            for &b in &sh.killed {
                acts.push(Step::RestartBu(b));
            }
        }
        if faults < self.faults {
            if sh.killed.is_empty() {
                // one BU at a time may die (another must finish the run)
                acts.push(Step::KillBu(0));
            }
            if !sh.evm_lost && !sh.took_over && !self.spare {
                acts.push(Step::LoseEvm);
            }
        }
    }

    fn next_state(&self, last: &St, step: Step) -> Option<St> {
        let mut steps = last.steps.clone();
        steps.push(step);
        let mut w = self.replay(&steps);
        let mut shown = w.show();
        if self.walks {
            shown.fingerprint ^= (steps.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        Some(St { steps, shown })
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no event built twice", |_, st: &St| {
                st.shown.twice.is_none()
            }),
            Property::always("an OK verdict is true", |_, st: &St| {
                st.shown.ok_with_missing.is_none()
            }),
            Property::always("one verdict per run", |_, st: &St| st.shown.verdicts <= 1),
            Property::sometimes("a takeover", |_, st: &St| st.shown.took_over),
            Property::sometimes("a run ends OK", |_, st: &St| st.shown.ended_ok),
            Property::sometimes("OK after a takeover", |_, st: &St| {
                st.shown.took_over && st.shown.ended_ok
            }),
            Property::always(
                "no old incarnation's fragments reach a new one",
                |_, st: &St| !st.shown.stale_fragment,
            ),
            Property::always(
                "fragments are withheld only from a process that is gone",
                |_, st: &St| !st.shown.withheld_from_live,
            ),
            Property::sometimes("OK after a BU loss", |_, st: &St| {
                st.shown.kills > 0 && st.shown.ended_ok
            }),
            Property::sometimes("a restarted BU builds", |_, st: &St| {
                st.shown.restarted_built
            }),
            Property::sometimes("a spare joins and builds", |_, st: &St| {
                st.shown.spare_built
            }),
            Property::sometimes("OK with a spare that joined", |_, st: &St| {
                st.shown.spare_built && st.shown.ended_ok
            }),
            Property::sometimes("OK without the spare", |_, st: &St| {
                st.shown.spare_out && st.shown.ended_ok
            }),
        ]
    }
}

/// Random walks in which faults are rare (each step offers one with a 1 in 40 chance, and a
/// lost EVM is replaced, or a killed BU restarted, with a 1 in 5 chance a step), so that
/// walks reach every part of the run before a fault, not mostly its first steps.
#[derive(Clone)]
struct RareFaults;

impl Chooser<System> for RareFaults {
    type State = u64;

    fn new_state(&self, seed: u64) -> u64 {
        seed | 1
    }

    fn choose_initial_state(&self, _: &mut u64, _: &[St]) -> usize {
        0
    }

    fn choose_action(&self, x: &mut u64, _: &St, actions: &[Step]) -> usize {
        let mut next = || {
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            *x
        };
        let pick = |v: &[usize], r: u64| v[(r % v.len() as u64) as usize];
        let plain: Vec<usize> = (0..actions.len())
            .filter(|&i| {
                matches!(
                    actions[i],
                    Step::Tick | Step::Deliver(..) | Step::RuReaches(_)
                )
            })
            .collect();
        let takeover: Vec<usize> = (0..actions.len())
            .filter(|&i| {
                matches!(
                    actions[i],
                    Step::TakeOver | Step::RestartBu(_) | Step::JoinSpare
                )
            })
            .collect();
        let faults: Vec<usize> = (0..actions.len())
            .filter(|&i| matches!(actions[i], Step::KillBu(_) | Step::LoseEvm))
            .collect();
        let r = next();
        if !takeover.is_empty() && (r % 5 == 0 || plain.is_empty()) {
            return takeover[0];
        }
        if !faults.is_empty() && (r % 40 == 1 || plain.is_empty()) {
            return pick(&faults, next());
        }
        if plain.is_empty() {
            return 0;
        }
        pick(&plain, next())
    }
}

fn env(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Bounded: every interleaving up to `EVB_ROLE_MODEL_DEPTH` steps (CI's default), then
/// seeded random walks to the end of the run (`EVB_ROLE_MODEL_WALKS`).
#[test]
fn every_interleaving_of_a_small_run_builds_each_event_once() {
    let depth = env("EVB_ROLE_MODEL_DEPTH", 30);
    let sys = System {
        events: 3,
        faults: 2,
        planted: Planted::None,
        walks: false,
        spare: false,
    };
    let checker = sys.checker().target_max_depth(depth).spawn_bfs().join();
    eprintln!(
        "role model: 1 RU, 2 BUs, 3 events, depth {depth}: {} states ({} unique), max depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker.assert_no_discovery("no event built twice");
    checker.assert_no_discovery("an OK verdict is true");
    checker.assert_no_discovery("one verdict per run");
    checker.assert_no_discovery("no old incarnation's fragments reach a new one");
    checker.assert_no_discovery("fragments are withheld only from a process that is gone");
    checker.assert_any_discovery("a takeover");
    // deep enough to see runs to their end, with a fault or without
    checker.assert_any_discovery("a run ends OK");
    for p in [
        "OK after a takeover",
        "OK after a BU loss",
        "a restarted BU builds",
    ] {
        eprintln!("role model: {p}: {}", checker.discovery(p).is_some());
    }
}

#[test]
fn random_walks_to_the_end_of_the_run_keep_every_promise() {
    let walks = env("EVB_ROLE_MODEL_WALKS", 300);
    let seed = env_seed("EVB_ROLE_MODEL_SEED", 20_261_128);
    eprintln!(
        "role model walks: seed {seed} ({walks} walks): EVB_ROLE_MODEL_SEED={seed} replays them"
    );
    let sys = System {
        events: 12,
        faults: 2,
        planted: Planted::None,
        walks: true,
        spare: false,
    };
    let checker = sys
        .checker()
        .target_max_depth(400)
        .target_state_count(walks * 120)
        .spawn_simulation(seed, RareFaults)
        .join();
    eprintln!("role model walks: {} states", checker.state_count());
    checker.assert_no_discovery("no event built twice");
    checker.assert_no_discovery("an OK verdict is true");
    checker.assert_no_discovery("one verdict per run");
    checker.assert_no_discovery("no old incarnation's fragments reach a new one");
    checker.assert_no_discovery("fragments are withheld only from a process that is gone");
    checker.assert_any_discovery("OK after a takeover");
    checker.assert_any_discovery("OK after a BU loss");
    checker.assert_any_discovery("a restarted BU builds");
}

/// The planted bug: the driver's incarnation check switched off, so that an RU sends the
/// fragments of an Assign that named a killed BU process to the process started after it;
/// the checker finds it.
#[test]
fn the_role_checker_finds_the_planted_bug_fragments_to_any_incarnation() {
    let seed = env_seed("EVB_ROLE_MODEL_SEED", 20_261_128);
    let sys = System {
        events: 12,
        faults: 1,
        planted: Planted::IgnoreIncarnation,
        walks: true,
        spare: false,
    };
    let checker = sys
        .checker()
        .target_max_depth(400)
        .target_state_count(env("EVB_ROLE_MODEL_WALKS", 300) * 120)
        .spawn_simulation(seed, RareFaults)
        .join();
    let path = checker.assert_any_discovery("no old incarnation's fragments reach a new one");
    eprintln!("counterexample: {:?}", path.into_actions());
}

/// The rule before `Awaiting` (CI found its stall): an RU held the fragments of an Assign
/// naming a BU process whose HelloAck it had not read yet as if that process were gone;
/// nothing reassigned them. The checker finds a restarted BU so starved, in a handful of
/// steps (kill, restart, its Ready and credits, the Assign before the RU reaches it).
#[test]
fn the_role_checker_finds_the_planted_bug_fragments_held_from_a_process_not_reached() {
    let depth = env("EVB_ROLE_MODEL_DEPTH", 30);
    let sys = System {
        events: 3,
        faults: 1,
        planted: Planted::HoldUnreached,
        walks: false,
        spare: false,
    };
    let checker = sys.checker().target_max_depth(depth).spawn_bfs().join();
    let path =
        checker.assert_any_discovery("fragments are withheld only from a process that is gone");
    eprintln!("counterexample: {:?}", path.into_actions());
}

/// Issue 69: bu1 a spare. The run starts without it; it joins at any step (before the
/// start, mid-run, during the run's end, never), bu0 may be killed too: every interleaving
/// to the end of a 3-event run builds each event once, an OK verdict is true, and runs end
/// OK with the spare joined and without it.
#[test]
fn a_spare_bu_joining_at_any_moment_builds_each_event_once() {
    let depth = env("EVB_ROLE_MODEL_DEPTH", 30);
    let sys = System {
        events: 3,
        faults: 1,
        planted: Planted::None,
        walks: false,
        spare: true,
    };
    let checker = sys.checker().target_max_depth(depth).spawn_bfs().join();
    eprintln!(
        "role model, a spare: depth {depth}: {} states ({} unique), max depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker.assert_no_discovery("no event built twice");
    checker.assert_no_discovery("an OK verdict is true");
    checker.assert_no_discovery("one verdict per run");
    checker.assert_no_discovery("no old incarnation's fragments reach a new one");
    checker.assert_no_discovery("fragments are withheld only from a process that is gone");
    checker.assert_any_discovery("a spare joins and builds");
    checker.assert_any_discovery("OK without the spare");
    eprintln!(
        "role model, a spare: OK with a spare that joined: {}",
        checker.discovery("OK with a spare that joined").is_some()
    );
    // walks to the end of longer runs: the spare joins, builds, and the run ends OK
    let seed = env_seed("EVB_ROLE_MODEL_SEED", 20_261_128);
    let walks = System {
        events: 12,
        faults: 1,
        planted: Planted::None,
        walks: true,
        spare: true,
    };
    let checker = walks
        .checker()
        .target_max_depth(400)
        .target_state_count(env("EVB_ROLE_MODEL_WALKS", 300) * 120)
        .spawn_simulation(seed, RareFaults)
        .join();
    checker.assert_no_discovery("no event built twice");
    checker.assert_no_discovery("an OK verdict is true");
    checker.assert_no_discovery("one verdict per run");
    checker.assert_any_discovery("OK with a spare that joined");
}

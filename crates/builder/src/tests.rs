//! The state machines driven by scripted messages, without any network.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use evb_buffers::{Chain, Pool};
use evb_wire::{EventRange, FragmentHeader, Message, FRAGMENT_HEADER_LEN, MESSAGE_HEADER_LEN};

use crate::*;

mod model;

fn generator() -> Generator {
    Generator::new(
        SizeModel::LogNormal {
            mean: 3000.0,
            stddev: 2000.0,
            min: 16,
            max: 20_000,
        },
        42,
    )
}

fn assign(bu: u16, first: u64, count: u32) -> Message {
    Message::Assign(EventRange { bu, first, count }, 0)
}

fn evm_cfg(n_ru: u16, n_bu: u16, events: u64) -> EvmConfig {
    EvmConfig {
        n_ru,
        n_bu,
        max_events: Some(events),
        duration: None,
        rate_hz: None,
        batch: 3,
        stall_timeout: Duration::from_secs(3600),
        max_per_poll: 64,
        on_ru_loss: RuLossPolicy::Partial,
        assignment: crate::Assignment::Credits,
        link_grace: Duration::from_millis(50),
        commits: Vec::new(),
        spares: Vec::new(),
    }
}

fn bu_cfg(index: u16, n_ru: u16, credits: u32) -> BuConfig {
    BuConfig {
        index,
        source_ids: (0..n_ru).map(|i| 100 + i).collect(),
        credits,
        verify: Verify::Full,
        generator: Some(generator()),
        slices: None,
        duplicate_window: 1 << 16,
    }
}

fn ru(index: u16, block: usize, blocks: usize) -> Ru {
    let cfg = RuConfig {
        index,
        source_id: 100 + index,
        source: Source::Generator(generator()),
        max_per_poll: 16,
        // small runs: a run of several fragments and runs cut short both happen
        max_run_bytes: 4 * 1024,
    };
    Ru::new(cfg, Pool::new("ru", block, blocks))
}

/// A message (or fragment) in flight between two state machines.
enum Wire {
    Msg(NodeRef, NodeRef, Message),
    Frag(NodeRef, NodeRef, Chain),
}

/// All the nodes of a run plus an in-memory network that can reorder deliveries.
struct Sim {
    evm: Evm,
    rus: Vec<Ru>,
    bus: Vec<Bu>,
    sinks: Vec<CountingSink>,
    net: VecDeque<Wire>,
    exits: Vec<(NodeRef, bool, String)>,
    /// Deliver the newest message first every `reorder` steps (0: FIFO).
    reorder: usize,
    step: usize,
    now: Instant,
    /// Killed nodes: nothing reaches them, nothing leaves them.
    dead: Vec<NodeRef>,
    /// Cut data links (RU, BU): nothing crosses them, both ends alive.
    cut: Vec<(NodeRef, NodeRef)>,
    /// BUs whose sinks commit: a part is committed once this many accepted events are
    /// staged (`None`: the sinks do not commit).
    commit_every: Option<usize>,
    /// Per BU: accepted events not yet in a part; parts waiting for the EVM; the ids of
    /// published parts (the output).
    staged: Vec<Vec<(u64, u32)>>,
    parts: Vec<HashMap<u32, Vec<(u64, u32)>>>,
    published: Vec<Vec<u64>>,
    passes: usize,
}

impl Sim {
    fn new(n_ru: u16, n_bu: u16, events: u64, credits: u32, reorder: usize) -> Sim {
        let now = Instant::now();
        let mut s = Sim {
            evm: Evm::new(evm_cfg(n_ru, n_bu, events), now),
            rus: (0..n_ru).map(|i| ru(i, 64 * 1024, 64)).collect(),
            bus: (0..n_bu)
                .map(|i| bu_cfg(i, n_ru, credits))
                .map(|cfg| {
                    // as the node sets it up: a counting sink takes spans
                    let mut b = Bu::new(cfg);
                    b.set_join(CountingSink::default().takes_spans());
                    b
                })
                .collect(),
            sinks: (0..n_bu).map(|_| CountingSink::default()).collect(),
            net: VecDeque::new(),
            exits: Vec::new(),
            reorder,
            step: 0,
            now,
            dead: Vec::new(),
            cut: Vec::new(),
            commit_every: None,
            staged: vec![Vec::new(); n_bu as usize],
            parts: vec![HashMap::new(); n_bu as usize],
            published: vec![Vec::new(); n_bu as usize],
            passes: 0,
        };
        for r in &mut s.rus {
            r.connections_up();
        }
        for b in &mut s.bus {
            b.connections_up();
        }
        s
    }

    /// Every BU gives each event a record and hands it on as an event (no join).
    fn records(mut self) -> Sim {
        for b in &mut self.bus {
            b.set_join(false);
        }
        self
    }

    fn collect(&mut self) {
        let mut out = Vec::new();
        while let Some(a) = self.evm.next_action() {
            out.push((NodeRef::Evm, a));
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
            if self.dead.contains(&from) {
                continue;
            }
            match a {
                Action::Send { to, msg, .. } => self.net.push_back(Wire::Msg(from, to, msg)),
                Action::SendFragments { to, data, .. } => {
                    self.net.push_back(Wire::Frag(from, to, data))
                }
                Action::Accepted(r) => {
                    let NodeRef::Bu(i) = from else { panic!() };
                    self.sinks[i as usize].accepted(r.first, r.count).unwrap();
                    if self.commit_every.is_some() {
                        self.staged[i as usize].push((r.first, r.count));
                    }
                }
                Action::Publish(part) => {
                    let NodeRef::Bu(i) = from else { panic!() };
                    let ranges = self.parts[i as usize]
                        .remove(&part)
                        .expect("a part we made");
                    for (first, count) in ranges {
                        self.published[i as usize].extend(first..first + count as u64);
                    }
                    self.bus[i as usize].published(part);
                }
                Action::PublishFor { bu, part } => {
                    // one filesystem: the EVM publishes the lost BU's part for it
                    // (not among its parts: it published it, and died before it said so)
                    let i = bu as usize;
                    for (first, count) in self.parts[i].remove(&part).unwrap_or_default() {
                        self.published[i].extend(first..first + count as u64);
                    }
                    self.evm.published_for(bu, part, true);
                }
                Action::Disconnect(n) => {
                    // the EVM drops a node: it hears its EVM gone, and is out of the run
                    if let NodeRef::Bu(i) = n {
                        self.bus[i as usize].peer_lost(NodeRef::Evm, "dropped by the EVM");
                    }
                    self.dead.push(n);
                }
                Action::Exit { ok, reason } => self.exits.push((from, ok, reason)),
            }
        }
        // the events each BU built, to its sink (a dead BU's are dropped with it)
        for i in 0..self.bus.len() {
            let dead = self.dead.contains(&NodeRef::Bu(i as u16));
            if !dead {
                self.bus[i].deliver_spans(&mut self.sinks[i]).unwrap();
            }
            while let Some(ev) = self.bus[i].next_built() {
                if dead {
                    continue;
                }
                assert!(!ev.corrupt && !ev.trigger_mismatch);
                self.sinks[i].deliver(&ev).unwrap();
                self.bus[i].delivered(ev.event_id, ev.bytes);
            }
        }
    }

    fn deliver(&mut self, w: Wire) {
        let (Wire::Msg(from, to, _) | Wire::Frag(from, to, _)) = &w;
        if self.dead.contains(from)
            || self.dead.contains(to)
            || self.cut.contains(&(*from, *to))
            || self.cut.contains(&(*to, *from))
        {
            return;
        }
        match w {
            Wire::Msg(from, to, msg) => match to {
                NodeRef::Evm => self.evm.handle(self.now, from, msg),
                NodeRef::Ru(i) => self.rus[i as usize].handle(self.now, from, msg),
                NodeRef::Bu(i) => self.bus[i as usize].handle(self.now, from, msg),
            },
            Wire::Frag(from, to, data) => {
                let NodeRef::Bu(i) = to else {
                    panic!("fragment to {to}")
                };
                let run = decode_fragments(&data);
                self.bus[i as usize].handle_page(self.now, from, run);
            }
        }
    }

    /// Kills a node as `kill -9` would: the others see its connections close.
    fn kill(&mut self, node: NodeRef) {
        self.dead.push(node);
        self.evm.peer_lost(self.now, node, "killed");
        for r in &mut self.rus {
            r.peer_lost(node, "killed");
        }
        for b in &mut self.bus {
            b.peer_lost(node, "killed");
        }
    }

    /// Committing sinks: each BU with enough accepted events staged (or, every 16th
    /// step, any) makes them a part and asks the EVM to commit it.
    fn commit_parts(&mut self) {
        let Some(every) = self.commit_every else {
            return;
        };
        self.passes += 1;
        for (i, b) in self.bus.iter_mut().enumerate() {
            let staged: u64 = self.staged[i].iter().map(|(_, n)| *n as u64).sum();
            if staged == 0 || (staged < every as u64 && !self.passes.is_multiple_of(16)) {
                continue;
            }
            let part = self.passes as u32;
            let ranges = std::mem::take(&mut self.staged[i]);
            b.commit(part, &ranges);
            self.parts[i].insert(part, ranges);
        }
    }

    /// Runs `steps` passes (or until every node has exited).
    fn steps(&mut self, steps: usize) {
        for _ in 0..steps {
            self.now += Duration::from_micros(10);
            self.evm.poll(self.now);
            for r in &mut self.rus {
                r.poll(self.now);
            }
            self.commit_parts();
            for b in &mut self.bus {
                b.poll(self.now);
            }
            self.collect();
            let n = self.net.len();
            for _ in 0..n {
                if let Some(w) = self.net.pop_front() {
                    self.deliver(w);
                }
                self.collect();
            }
        }
    }

    /// Runs until every node has exited (or `max_steps`).
    fn run(&mut self, max_steps: usize) {
        for _ in 0..max_steps {
            self.now += Duration::from_micros(10);
            self.evm.poll(self.now);
            for r in &mut self.rus {
                r.poll(self.now);
            }
            self.commit_parts();
            for b in &mut self.bus {
                b.poll(self.now);
            }
            self.collect();
            let n = self.net.len();
            for _ in 0..n {
                self.step += 1;
                let w = if self.reorder > 0 && self.step.is_multiple_of(self.reorder) {
                    // another connection's newest traffic first; each connection stays in
                    // order, as every transport keeps it
                    let ends = |w: &Wire| match w {
                        Wire::Msg(f, t, _) | Wire::Frag(f, t, _) => (*f, *t),
                    };
                    let pair = self.net.back().map(ends);
                    let k = self.net.iter().position(|w| Some(ends(w)) == pair);
                    k.and_then(|k| self.net.remove(k))
                } else {
                    self.net.pop_front()
                };
                if let Some(w) = w {
                    self.deliver(w);
                }
                self.collect();
            }
            if self.exits.len() + self.dead.len() == 1 + self.rus.len() + self.bus.len() {
                return;
            }
        }
        panic!("run did not finish; exits so far: {:?}", self.exits);
    }
}

impl Sim {
    /// One pass whose deliveries stop after `k` (of those queued) when the EVM is killed:
    /// what it had queued for the others is lost with it (an Assign that reached one RU and
    /// not the next, a Release forwarded to some RUs only).
    fn pass_killing_the_evm_after(&mut self, k: usize) {
        self.now += Duration::from_micros(10);
        self.evm.poll(self.now);
        for r in &mut self.rus {
            r.poll(self.now);
        }
        self.commit_parts();
        for b in &mut self.bus {
            b.poll(self.now);
        }
        self.collect();
        let n = self.net.len();
        for i in 0..n {
            if i == k {
                self.kill(NodeRef::Evm);
            }
            if let Some(w) = self.net.pop_front() {
                self.deliver(w);
            }
            self.collect();
        }
        if !self.dead.contains(&NodeRef::Evm) {
            self.kill(NodeRef::Evm);
        }
    }

    /// A standby EVM takes over: the old EVM's connections are gone with whatever was on
    /// them, the live nodes resync, and the new EVM is rebuilt from what they say.
    fn take_over(&mut self, cfg: EvmConfig, elapsed: Duration, dropped: Vec<NodeRef>) {
        let evm_end = |w: &Wire| match w {
            Wire::Msg(f, t, _) | Wire::Frag(f, t, _) => *f == NodeRef::Evm || *t == NodeRef::Evm,
        };
        self.net.retain(|w| !evm_end(w));
        let dead = self.dead.clone();
        let rus: Vec<RuResync> = self
            .rus
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| !dead.contains(&NodeRef::Ru(*i as u16)))
            .map(|(_, r)| r.resync())
            .collect();
        let mut bus: Vec<BuResync> = Vec::new();
        for (i, b) in self.bus.iter_mut().enumerate() {
            if dead.contains(&NodeRef::Bu(i as u16)) {
                continue;
            }
            let mut r = b.resync();
            if self.commit_every.is_some() {
                let bu = i as u16;
                let range = |&(first, count): &(u64, u32)| EventRange { bu, first, count };
                r.accepted = self.staged[i].iter().map(range).collect();
                let mut parts: Vec<_> = self.parts[i]
                    .iter()
                    .map(|(p, rs)| (*p, rs.iter().map(range).collect::<Vec<_>>()))
                    .collect();
                parts.sort_by_key(|(p, _)| *p);
                r.parts = parts;
                let mut ids = self.published[i].clone();
                ids.sort_unstable();
                r.committed = ids.iter().map(|&id| range(&(id, 1))).collect();
            }
            bus.push(r);
        }
        // through the wire, as the nodes send them (split, encoded, decoded, joined)
        let rus = rus
            .into_iter()
            .map(|r: RuResync| over_the_wire_ru(&r))
            .collect();
        let bus = bus
            .into_iter()
            .map(|b: BuResync| over_the_wire_bu(&b))
            .collect();
        self.dead.retain(|n| *n != NodeRef::Evm);
        let t = Takeover {
            epoch: 1,
            elapsed,
            dropped,
            reason: "killed".into(),
            stop_requested: false,
            max_events: None,
            live_fed: false,
            ..Takeover::default()
        };
        self.evm = Evm::take_over(cfg, self.now, t, rus, bus);
    }
}

fn through_bytes(m: Message) -> Message {
    let bytes = m.encode();
    let h = evb_wire::MessageHeader::decode(&bytes[..MESSAGE_HEADER_LEN]).unwrap();
    Message::decode(h.msg_type, &bytes[MESSAGE_HEADER_LEN..]).unwrap()
}

/// A resync split into messages, each through its bytes, and joined again.
fn over_the_wire<T>(
    parts: Vec<(T, bool)>,
    wrap: impl Fn(T, bool) -> Message,
    unwrap: impl Fn(Message) -> Option<T>,
    absorb: impl Fn(&mut T, T),
) -> T {
    let mut out: Option<T> = None;
    for (resync, more) in parts {
        let resync = unwrap(through_bytes(wrap(resync, more))).expect("the same kind back");
        match &mut out {
            Some(o) => absorb(o, resync),
            None => out = Some(resync),
        }
    }
    out.expect("at least one message")
}

fn over_the_wire_ru(r: &RuResync) -> RuResync {
    over_the_wire(
        r.split(),
        |resync, more| Message::ResyncRu { resync, more },
        |m| match m {
            Message::ResyncRu { resync, .. } => Some(resync),
            _ => None,
        },
        RuResync::absorb,
    )
}

fn over_the_wire_bu(b: &BuResync) -> BuResync {
    over_the_wire(
        b.split(),
        |resync, more| Message::ResyncBu {
            resync: Box::new(resync),
            more,
        },
        |m| match m {
            Message::ResyncBu { resync, .. } => Some(*resync),
            _ => None,
        },
        BuResync::absorb,
    )
}

/// xorshift64*: the tests' seeded moments.
/// A test's seed: the environment variable `var` if it is set (to replay a failure), else
/// `default`.
fn env_seed(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// The EVM killed at seeded random moments (mid-pass, so that an Assign reaches some RUs
/// and not others, or a Release is forwarded to some RUs only), the nodes working on for a
/// while, then a standby rebuilt from what they hold: every event is built exactly once,
/// the verdict is clean, and no RU keeps a fragment. With sinks that do not commit and with
/// sinks that do (the parts then hold every event exactly once).
#[test]
fn a_standby_evm_takes_over_at_any_moment_and_every_event_is_built_once() {
    let seed = env_seed("EVB_TAKEOVER_SEED", 20_261_124);
    let trials = 60;
    let mut x = seed | 1;
    for trial in 0..trials {
        let t = Trial {
            commits: trial % 2 == 1,
            before: (next(&mut x) % 300) as usize,
            k: (next(&mut x) % 40) as usize,
            gap: (next(&mut x) % 30) as usize,
            // a third of the trials lose a BU first (the old EVM rebuilds its events)
            bu_lost_before: (trial % 3 == 2).then(|| (next(&mut x) % 150) as usize),
            reorder: if trial % 4 == 3 { 7 } else { 0 },
            // a fifth of the trials with BUs that make a record of every event (no join)
            records: trial % 5 == 4,
        };
        let what = format!("seed {seed} trial {trial}: {t:?}");
        standby_takeover(&t, &what);
    }
}

#[derive(Debug)]
struct Trial {
    commits: bool,
    /// Passes before the EVM is killed, deliveries of the last one, passes without an EVM.
    before: usize,
    k: usize,
    gap: usize,
    /// bu[1] killed this many passes into the run (before the EVM).
    bu_lost_before: Option<usize>,
    reorder: usize,
    records: bool,
}

fn standby_takeover(t: &Trial, what: &str) {
    let events = 1200;
    let (n_ru, n_bu) = (3, 3);
    let commits = t.commits;
    let mut s = Sim::new(n_ru, n_bu, events, 6, t.reorder);
    if t.records {
        s = s.records();
    }
    let mut cfg = evm_cfg(n_ru, n_bu, events);
    if commits {
        s.commit_every = Some(20);
        cfg.commits = vec![true; n_bu as usize];
        s.evm = Evm::new(cfg.clone(), s.now);
    }
    for r in &mut s.rus {
        r.set_standby(true);
    }
    for b in &mut s.bus {
        b.set_standby(true);
    }
    let start = s.now;
    let mut dropped = Vec::new();
    match t.bu_lost_before {
        Some(p) if p < t.before => {
            s.steps(p);
            s.kill(NodeRef::Bu(1));
            dropped.push(NodeRef::Bu(1));
            s.steps(t.before - p);
        }
        _ => s.steps(t.before),
    }
    if !matches!(s.evm.state(), RunState::Running | RunState::Stopping) {
        return;
    }
    s.pass_killing_the_evm_after(t.k);
    if s.exits.iter().any(|(n, _, _)| *n == NodeRef::Evm) {
        // the run had ended (halted) before the EVM died: nothing to take over
        return;
    }
    s.steps(t.gap);
    let elapsed = s.now - start;
    let dropped_any = !dropped.is_empty();
    s.take_over(cfg, elapsed, dropped);
    s.run(400_000);
    for (who, ok, why) in &s.exits {
        assert!(ok, "{what}: {who} exited badly: {why}");
    }
    let r = s.evm.report(s.now);
    assert!(verdict(&r).is_empty(), "{what}: {:?}", verdict(&r));
    assert_eq!(r.evm.triggered, events, "{what}");
    let mut all: Vec<u64> = if commits {
        s.published.iter().flatten().copied().collect()
    } else {
        s.sinks.iter().flat_map(|k| k.ids.iter().copied()).collect()
    };
    all.sort_unstable();
    let bu_lost = dropped_any;
    if commits || !bu_lost {
        let every: Vec<u64> = (0..events).collect();
        assert_eq!(all, every, "{what}: every event exactly once");
    } else {
        // a sink that does not commit: what the lost BU delivered stays delivered (its
        // released part counted as released by it), and nothing else twice
        all.dedup();
        assert_eq!(all, (0..events).collect::<Vec<_>>(), "{what}: every event");
        let alive: u64 = [0usize, 2].iter().map(|&b| s.sinks[b].events).sum();
        assert_eq!(alive + r.evm.released_by_lost, events, "{what}");
    }
    if !commits && !bu_lost {
        let delivered: u64 = s.sinks.iter().map(|k| k.events).sum();
        assert_eq!(delivered, events, "{what}: no event delivered twice");
    }
    for ru in &s.rus {
        assert_eq!(ru.stats().retained, 0, "{what}");
        assert_eq!(ru.stats().errors, 0, "{what}");
        assert_eq!(ru.stats().fragments_sent, events, "{what}");
    }
    assert!(
        r.evm
            .lost
            .iter()
            .any(|e| e.node == "evm" && e.reason.contains("standby took over")),
        "{what}: the takeover is in the report"
    );
}

/// The fragments of an RU's run (encoded fragment messages back to back).
fn decode_fragments(data: &Chain) -> Vec<(FragmentHeader, Chain)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let mut mh = [0u8; MESSAGE_HEADER_LEN];
        data.sub(at, MESSAGE_HEADER_LEN).copy_prefix(&mut mh);
        let body = u32::from_le_bytes(mh[4..8].try_into().unwrap()) as usize;
        let mut hb = [0u8; FRAGMENT_HEADER_LEN];
        data.sub(at + MESSAGE_HEADER_LEN, FRAGMENT_HEADER_LEN)
            .copy_prefix(&mut hb);
        let h = FragmentHeader::decode(&hb).unwrap();
        let payload = body - FRAGMENT_HEADER_LEN;
        out.push((h, data.sub(at + PREFIX_LEN, payload)));
        at += MESSAGE_HEADER_LEN + body;
    }
    assert_eq!(at, data.len(), "a run is whole fragment messages");
    out
}

fn assert_clean_run(s: &Sim, events: u64) {
    for (who, ok, why) in &s.exits {
        assert!(ok, "{who} exited badly: {why}");
    }
    let total: u64 = s.sinks.iter().map(|k| k.events).sum();
    assert_eq!(total, events);
    let mut all: Vec<u64> = s.sinks.iter().flat_map(|k| k.ids.iter().copied()).collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..events).collect::<Vec<_>>(),
        "every event exactly once"
    );
    let report = s.evm.report(s.now);
    assert!(verdict(&report).is_empty(), "{:?}", verdict(&report));
    // every decision timed to its release, once, and none left waiting
    assert_eq!(report.evm.record_latency.count, events);
    assert!(s.evm.decided.is_empty());
    for r in &s.rus {
        assert_eq!(r.stats().retained, 0);
        assert_eq!(r.stats().fragments_sent, events);
    }
}

#[test]
fn two_by_two_builds_every_event_once() {
    let mut s = Sim::new(2, 2, 500, 8, 0);
    s.run(100_000);
    assert_clean_run(&s, 500);
    assert!(s.sinks.iter().all(|k| k.events > 100), "both BUs got work");
}

#[test]
fn topologies_with_reordered_delivery() {
    // reordering makes fragments overtake their Assign and releases arrive out of order
    // (with the BUs' join, and with a record for every event)
    for records in [false, true] {
        for (n_ru, n_bu, reorder) in [(1, 1, 3), (3, 2, 2), (2, 3, 5), (4, 4, 7)] {
            let mut s = Sim::new(n_ru, n_bu, 300, 5, reorder);
            if records {
                s = s.records();
            }
            s.run(100_000);
            assert_clean_run(&s, 300);
        }
    }
}

#[test]
fn credits_bound_what_is_in_flight() {
    let mut s = Sim::new(2, 2, 200, 4, 0);
    s.run(100_000);
    assert_clean_run(&s, 200);
    let r = s.evm.report(s.now);
    assert!(
        r.evm.in_flight_high_water <= 8,
        "{}",
        r.evm.in_flight_high_water
    );
    for b in &s.bus {
        assert!(b.stats().in_flight_high_water <= 4);
    }
}

#[test]
fn no_credit_means_no_trigger() {
    let now = Instant::now();
    let mut evm = Evm::new(evm_cfg(1, 1, 100), now);
    evm.handle(
        now,
        NodeRef::Ru(0),
        Message::Ready {
            available: evb_wire::UNLIMITED,
        },
    );
    evm.handle(
        now,
        NodeRef::Bu(0),
        Message::Ready {
            available: evb_wire::UNLIMITED,
        },
    );
    evm.poll(now);
    assert_eq!(evm.stats().triggered, 0);
    evm.handle(now, NodeRef::Bu(0), Message::Credit { bu: 0, count: 2 });
    evm.poll(now);
    assert_eq!(evm.stats().triggered, 2);
    evm.poll(now);
    assert_eq!(evm.stats().triggered, 2, "triggered without credit");
    // a credit claimed for another BU is refused
    evm.handle(now, NodeRef::Bu(0), Message::Credit { bu: 1, count: 5 });
    assert_eq!(evm.stats().errors, 1);
}

/// Every Assign names the incarnation of its BU that the driver set (its control Hello's),
/// to the RUs and to the BU alike; a restarted BU's Assigns name the new one.
#[test]
fn assigns_name_the_incarnation_of_their_bu() {
    let now = Instant::now();
    let mut evm = Evm::new(evm_cfg(1, 2, 100), now);
    evm.set_incarnation(0, 77);
    evm.set_incarnation(1, 88);
    let ready = || Message::Ready {
        available: evb_wire::UNLIMITED,
    };
    for n in [NodeRef::Ru(0), NodeRef::Bu(0), NodeRef::Bu(1)] {
        evm.handle(now, n, ready());
    }
    let assigns = |evm: &mut Evm| {
        for bu in 0..2 {
            evm.handle(now, NodeRef::Bu(bu), Message::Credit { bu, count: 3 });
        }
        evm.poll(now);
        let mut seen = Vec::new();
        while let Some(a) = evm.next_action() {
            if let Action::Send {
                to,
                msg: Message::Assign(r, inc),
                ..
            } = a
            {
                seen.push((to, r.bu, inc));
            }
        }
        seen
    };
    let first = assigns(&mut evm);
    for bu in [0, 1] {
        assert!(
            first.iter().any(|&(to, ..)| to == NodeRef::Bu(bu)),
            "{first:?}"
        );
    }
    let want = |bu: u16| if bu == 0 { 77 } else { 88 };
    assert!(
        first.iter().all(|&(_, bu, inc)| inc == want(bu)),
        "{first:?}"
    );
    // bu1 restarted: a new process, a new number
    evm.set_incarnation(1, 99);
    let second = assigns(&mut evm);
    assert!(
        second
            .iter()
            .any(|&(to, bu, inc)| to == NodeRef::Ru(0) && bu == 1 && inc == 99),
        "{second:?}"
    );
    assert!(
        second
            .iter()
            .all(|&(_, bu, inc)| inc == if bu == 0 { 77 } else { 99 }),
        "{second:?}"
    );
}

#[test]
fn rate_limit_paces_the_trigger() {
    let t0 = Instant::now();
    let mut cfg = evm_cfg(1, 1, 1_000_000);
    cfg.rate_hz = Some(1000.0);
    let mut evm = Evm::new(cfg, t0);
    evm.handle(
        t0,
        NodeRef::Ru(0),
        Message::Ready {
            available: evb_wire::UNLIMITED,
        },
    );
    evm.handle(
        t0,
        NodeRef::Bu(0),
        Message::Ready {
            available: evb_wire::UNLIMITED,
        },
    );
    evm.handle(
        t0,
        NodeRef::Bu(0),
        Message::Credit {
            bu: 0,
            count: 1_000_000,
        },
    );
    for ms in 1..=50 {
        evm.poll(t0 + Duration::from_millis(ms));
    }
    assert_eq!(evm.stats().triggered, 50);
}

/// bu0 of a 1 × 1 EVM grants `count` credits at `at`, gets events 0.. assigned, and
/// releases them all at `release_at`: the EVM's latency from the trigger, each event once.
fn credit_then_release(
    evm: &mut Evm,
    at: Instant,
    count: u32,
    release_at: Instant,
) -> crate::LatencyHistogram {
    evm.handle(at, NodeRef::Bu(0), Message::Credit { bu: 0, count });
    evm.poll(at);
    assert_eq!(evm.stats().triggered, count as u64);
    let range = EventRange {
        bu: 0,
        first: 0,
        count,
    };
    evm.handle(release_at, NodeRef::Bu(0), Message::Release(range));
    let h = evm.stats().record_latency;
    assert_eq!(h.count, count as u64, "each event timed once");
    h
}

/// The latency from the trigger starts when the event is due, not when a BU's credit lets
/// the EVM assign it: the wait for credit counts (issue 68 item 3). Unpaced, the EVM
/// triggers only with credit, so the clock starts at the assignment.
#[test]
fn the_latency_from_the_trigger_counts_the_wait_for_credit() {
    let ms = Duration::from_millis;
    let released_after = |rate_hz: Option<f64>| {
        let t0 = Instant::now();
        let mut cfg = evm_cfg(1, 1, 5);
        cfg.rate_hz = rate_hz;
        let mut evm = Evm::new(cfg, t0);
        for n in [NodeRef::Ru(0), NodeRef::Bu(0)] {
            let ready = Message::Ready {
                available: evb_wire::UNLIMITED,
            };
            evm.handle(t0, n, ready);
        }
        // at 1 kHz events 0..5 are due at 1..5 ms; the BU's first credits come at 20 ms
        for t in 1..20 {
            evm.poll(t0 + ms(t));
        }
        assert_eq!(evm.stats().triggered, 0, "no credit, no assignment");
        let h = credit_then_release(&mut evm, t0 + ms(20), 5, t0 + ms(30));
        (h.quantile_us(0.0).unwrap(), h.quantile_us(1.0).unwrap())
    };
    let (min, max) = released_after(Some(1000.0));
    // due at 5 ms → released at 30: 25 ms; due at 1 ms: 29 ms (HDR: within 1 %)
    assert!((24_700..=25_300).contains(&min), "{min}");
    assert!((28_700..=29_300).contains(&max), "{max}");
    let (min, max) = released_after(None);
    assert!((9_900..=10_100).contains(&min), "{min}");
    assert!((9_900..=10_100).contains(&max), "{max}");
}

/// Decisions from outside: each one's latency starts when the EVM took it in, however long
/// it then queued for a BU's credit.
#[test]
fn a_decision_from_outside_is_timed_from_when_it_was_taken_in() {
    use evb_wire::window::DecisionWindow;
    let ms = Duration::from_millis;
    let t0 = Instant::now();
    let mut evm = Evm::new(evm_cfg(1, 1, 3), t0);
    evm.take_decisions_from_outside();
    for n in [NodeRef::Ru(0), NodeRef::Bu(0)] {
        let ready = Message::Ready {
            available: evb_wire::UNLIMITED,
        };
        evm.handle(t0, n, ready);
    }
    assert!(evm.decide(t0 + ms(1), &[DecisionWindow::all(0, 10)]));
    assert!(evm.decide(
        t0 + ms(4),
        &[DecisionWindow::all(10, 20), DecisionWindow::all(20, 30)]
    ));
    let h = credit_then_release(&mut evm, t0 + ms(10), 3, t0 + ms(12));
    // 11 ms for the first, 8 ms for the two taken in at 4 ms
    let (min, max) = (h.quantile_us(0.0).unwrap(), h.quantile_us(1.0).unwrap());
    assert!((7_900..=8_100).contains(&min), "{min}");
    assert!((10_900..=11_100).contains(&max), "{max}");
    let p50 = h.quantile_us(0.5).unwrap();
    assert!(
        (7_900..=8_100).contains(&p50),
        "two of three at 8 ms: {p50}"
    );
}

/// A BU alone, fed by hand.
fn lone_bu(n_ru: u16) -> Bu {
    let mut b = Bu::new(bu_cfg(0, n_ru, 4));
    b.handle(Instant::now(), NodeRef::Evm, Message::Start);
    b
}

fn fragment_for(ru_index: u16, event_id: u64) -> (FragmentHeader, Chain) {
    made_by(ru(ru_index, 64 * 1024, 4), event_id)
}

/// The fragment RU `r` makes of `event_id` once the run starts and it is assigned.
fn made_by(mut r: Ru, event_id: u64) -> (FragmentHeader, Chain) {
    r.handle(Instant::now(), NodeRef::Evm, Message::Start);
    r.handle(Instant::now(), NodeRef::Evm, assign(0, event_id, 1));
    r.poll(Instant::now());
    loop {
        match r.next_action() {
            Some(Action::SendFragments { data, .. }) => {
                return decode_fragments(&data).into_iter().next().unwrap()
            }
            Some(_) => continue,
            None => panic!("no fragment"),
        }
    }
}

/// The events `b` built, its other actions dropped.
fn drain_delivered(b: &mut Bu) -> Vec<BuiltEvent> {
    while b.next_action().is_some() {}
    std::iter::from_fn(|| b.next_built()).collect()
}

#[test]
fn bu_waits_for_assignment_and_all_fragments() {
    let now = Instant::now();
    let mut b = lone_bu(2);
    let (h0, p0) = fragment_for(0, 7);
    let (h1, p1) = fragment_for(1, 7);
    b.handle_fragment(now, NodeRef::Ru(1), h1, p1);
    b.handle_fragment(now, NodeRef::Ru(0), h0, p0);
    assert!(
        drain_delivered(&mut b).is_empty(),
        "built before the EVM assigned it"
    );
    b.handle(now, NodeRef::Evm, assign(0, 7, 1));
    let evs = drain_delivered(&mut b);
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].fragments.len(), 2);
    assert_eq!(
        evs[0].fragments[0].0.source_id, 100,
        "fragments in RU order"
    );
    b.delivered(7, evs[0].bytes);
    b.poll(now);
    let mut released = false;
    while let Some(a) = b.next_action() {
        if let Action::Send {
            msg: Message::Release(r),
            ..
        } = a
        {
            assert_eq!((r.first, r.count), (7, 1));
            released = true;
        }
    }
    assert!(released);
}

#[test]
fn bu_counts_duplicates_and_corruption() {
    let now = Instant::now();
    let mut b = lone_bu(1);
    b.handle(now, NodeRef::Evm, assign(0, 1, 3));
    // duplicate after the event is built
    let (h, p) = fragment_for(0, 1);
    b.handle_fragment(now, NodeRef::Ru(0), h, p.clone());
    let e = drain_delivered(&mut b);
    b.delivered(1, e[0].bytes);
    b.handle_fragment(now, NodeRef::Ru(0), h, p);
    assert_eq!(b.stats().duplicate_fragments, 1);
    assert!(drain_delivered(&mut b).is_empty());

    // a payload that fails its CRC: built, but flagged and counted
    let (h, p) = fragment_for(0, 2);
    let mut bad = h;
    bad.payload_crc ^= 1;
    b.handle_fragment(now, NodeRef::Ru(0), bad, p);
    assert_eq!(b.stats().crc_errors, 1);
    assert!(drain_delivered(&mut b)[0].corrupt);

    // right CRC, wrong content (a fragment of another event under this event's id)
    let (h3, _) = fragment_for(0, 3);
    let (_, p_other) = fragment_for(0, 4);
    let forged = FragmentHeader {
        payload_crc: p_other.crc32c(),
        payload_size: p_other.len() as u32,
        ..h3
    };
    b.handle_fragment(now, NodeRef::Ru(0), forged, p_other);
    assert_eq!(b.stats().content_errors, 1);

    // a fragment from a source the configuration does not give that RU: counted, and its
    // event still completes, flagged corrupt (the run must not stall on it)
    drain_delivered(&mut b);
    b.handle(now, NodeRef::Evm, assign(0, 5, 1));
    let (h, p) = fragment_for(1, 5);
    b.handle_fragment(now, NodeRef::Ru(0), h, p);
    assert_eq!(b.stats().source_mismatches, 1);
    let built = drain_delivered(&mut b);
    assert_eq!(built.len(), 1);
    assert!(built[0].corrupt);
    assert!(!b.stats().clean());
}

#[test]
fn bu_flags_trigger_number_mismatch() {
    let now = Instant::now();
    let mut b = lone_bu(2);
    b.handle(now, NodeRef::Evm, assign(0, 5, 1));
    let (h0, p0) = fragment_for(0, 5);
    let (mut h1, p1) = fragment_for(1, 5);
    h1.trigger_number += 1;
    b.handle_fragment(now, NodeRef::Ru(0), h0, p0);
    b.handle_fragment(now, NodeRef::Ru(1), h1, p1);
    let e = drain_delivered(&mut b);
    assert!(e[0].trigger_mismatch);
    assert_eq!(b.stats().trigger_mismatches, 1);
}

#[test]
fn ru_keeps_fragments_until_release_and_waits_for_memory() {
    let now = Instant::now();
    // 4 blocks of 64 KiB; fragments up to 20 kB: the pool fills after a handful of events
    let mut r = ru(0, 64 * 1024, 4);
    r.handle(now, NodeRef::Evm, Message::Start);
    r.handle(now, NodeRef::Evm, assign(0, 0, 1000));
    for _ in 0..200 {
        r.poll(now);
    }
    let s = r.stats();
    assert!(s.fragments_sent > 10 && s.fragments_sent < 1000, "{s:?}");
    assert!(s.pool_waits > 0);
    assert_eq!(s.retained, s.fragments_sent);
    let sent = s.fragments_sent;
    while r.next_action().is_some() {}
    r.handle(
        now,
        NodeRef::Evm,
        Message::Release(EventRange {
            bu: 0,
            first: 0,
            count: sent as u32,
        }),
    );
    assert_eq!(r.stats().retained, 0);
    r.poll(now);
    assert!(
        r.stats().fragments_sent > sent,
        "memory came back, generation resumed"
    );
    // releasing something never held is a protocol error
    r.handle(
        now,
        NodeRef::Evm,
        Message::Release(EventRange {
            bu: 0,
            first: 5000,
            count: 1,
        }),
    );
    assert_eq!(r.stats().errors, 1);
}

/// Found by the role model checker (tests/model.rs): an RU's report of a lost link to a BU
/// process that was since replaced (killed, restarted, admitted again) arrives late; it
/// names the old incarnation and must not drop the new one. A report naming the current
/// incarnation (or none) still does.
#[test]
fn a_late_link_lost_about_a_replaced_bu_process_does_not_drop_its_successor() {
    let mut now = Instant::now();
    let mut evm = Evm::new(evm_cfg(1, 2, 100), now);
    evm.set_incarnation(0, 5);
    evm.set_incarnation(1, 9);
    for n in [NodeRef::Ru(0), NodeRef::Bu(0), NodeRef::Bu(1)] {
        evm.handle(
            now,
            n,
            Message::Ready {
                available: u64::MAX,
            },
        );
    }
    now += Duration::from_millis(1);
    // bu0's process of incarnation 5 was replaced by incarnation 6 (the driver says so)
    evm.set_incarnation(0, 6);
    evm.handle(now, NodeRef::Ru(0), Message::LinkLost { peer: 0, inc: 5 });
    let dropped = |evm: &mut Evm| {
        let mut d = Vec::new();
        while let Some(a) = evm.next_action() {
            if let Action::Disconnect(n) = a {
                d.push(n);
            }
        }
        d
    };
    assert_eq!(dropped(&mut evm), Vec::<NodeRef>::new());
    assert!(evm.down_nodes().is_empty(), "{:?}", evm.down_nodes());
    evm.handle(now, NodeRef::Ru(0), Message::LinkLost { peer: 0, inc: 6 });
    assert_eq!(dropped(&mut evm), vec![NodeRef::Bu(0)]);
    evm.handle(now, NodeRef::Ru(0), Message::LinkLost { peer: 1, inc: 0 });
    assert_eq!(dropped(&mut evm), vec![NodeRef::Bu(1)]);
}

/// Found by the role model checker (tests/model.rs, random walks): a BU lost, restarted and
/// lost again before its first loss's events went to another BU had those events queued
/// twice, and they were assigned (and built) twice. Each orphan is assigned once.
#[test]
fn a_bu_lost_twice_before_its_events_are_reassigned_has_each_assigned_once() {
    let mut now = Instant::now();
    let mut evm = Evm::new(evm_cfg(1, 2, 100), now);
    for n in [NodeRef::Ru(0), NodeRef::Bu(0), NodeRef::Bu(1)] {
        evm.handle(
            now,
            n,
            Message::Ready {
                available: u64::MAX,
            },
        );
    }
    evm.handle(now, NodeRef::Bu(0), Message::Credit { bu: 0, count: 2 });
    for _ in 0..3 {
        now += Duration::from_millis(100);
        evm.poll(now);
    }
    let assigned = |evm: &mut Evm| -> Vec<(u16, u64)> {
        let mut out = Vec::new();
        while let Some(a) = evm.next_action() {
            if let Action::Send {
                to: NodeRef::Ru(0),
                msg: Message::Assign(r, _),
                ..
            } = a
            {
                out.extend((r.first..r.end()).map(|id| (r.bu, id)));
            }
        }
        out
    };
    assert_eq!(assigned(&mut evm), vec![(0, 0), (0, 1)]);
    evm.peer_lost(now, NodeRef::Bu(0), "killed");
    // restarted and back, then lost again, before bu1 had credit for the orphans
    evm.handle(
        now,
        NodeRef::Bu(0),
        Message::Ready {
            available: u64::MAX,
        },
    );
    evm.peer_lost(now, NodeRef::Bu(0), "killed again");
    evm.handle(now, NodeRef::Bu(1), Message::Credit { bu: 1, count: 10 });
    now += Duration::from_millis(1);
    evm.poll(now);
    let again = assigned(&mut evm);
    for id in [0, 1] {
        let n = again.iter().filter(|(_, e)| *e == id).count();
        assert_eq!(n, 1, "event {id} assigned {n} times: {again:?}");
    }
}

/// Issue 66 defect 6: an Assign naming a BU the run does not have is refused by the RU and
/// counted (its Halt then says the run is not clean), never held for a BU that cannot come;
/// an Assign for another BU that reaches a BU is counted there. Both are logged by name.
#[test]
fn an_assign_for_a_bu_the_run_does_not_have_is_refused_and_counted() {
    let now = Instant::now();
    let mut r = ru(0, 64 * 1024, 64).with_bus(2);
    r.handle(now, NodeRef::Evm, Message::Start);
    r.handle(now, NodeRef::Evm, assign(1, 0, 4));
    r.handle(now, NodeRef::Evm, assign(2, 4, 4));
    for _ in 0..4 {
        r.poll(now);
    }
    let mut sent = 0;
    while let Some(a) = r.next_action() {
        if let Action::SendFragments { to, count, .. } = a {
            assert_eq!(to, NodeRef::Bu(1));
            sent += count;
        }
    }
    assert_eq!(sent, 4, "only bu[1]'s events are made");
    assert_eq!(r.stats().errors, 1);
    assert_eq!(r.stats().pending_events, 0, "nothing held for bu[2]");

    let mut b = Bu::new(bu_cfg(0, 1, 4));
    b.handle(now, NodeRef::Evm, Message::Start);
    b.handle(now, NodeRef::Evm, assign(1, 0, 4));
    assert_eq!(b.stats().errors, 1);
}

/// Every fragment action names the BU incarnation of the Assign it answers (the driver sends
/// it only over a connection of that incarnation), a reassignment's the new one's, and an
/// assignment for another incarnation of the same BU never joins a run of the first.
#[test]
fn ru_fragments_carry_the_incarnation_their_assignment_named() {
    let now = Instant::now();
    let mut r = ru(0, 64 * 1024, 64);
    r.handle(now, NodeRef::Evm, Message::Start);
    let range = |bu, first, count| EventRange { bu, first, count };
    r.handle(now, NodeRef::Evm, Message::Assign(range(1, 0, 4), 9));
    r.handle(now, NodeRef::Evm, Message::Assign(range(1, 4, 4), 11));
    // events 0..4 again, for BU 0 (incarnation 5): the held bytes go there
    r.handle(now, NodeRef::Evm, Message::Assign(range(0, 0, 4), 5));
    for _ in 0..4 {
        r.poll(now);
    }
    let mut sent: Vec<(NodeRef, u16, u32)> = Vec::new();
    while let Some(a) = r.next_action() {
        if let Action::SendFragments { to, inc, count, .. } = a {
            sent.push((to, inc, count));
        }
    }
    let by = |to: NodeRef, inc: u16| -> u32 {
        sent.iter()
            .filter(|s| s.0 == to && s.1 == inc)
            .map(|s| s.2)
            .sum()
    };
    assert_eq!(by(NodeRef::Bu(1), 9), 4, "{sent:?}");
    assert_eq!(by(NodeRef::Bu(1), 11), 4, "{sent:?}");
    assert_eq!(by(NodeRef::Bu(0), 5), 4, "{sent:?}");
    assert_eq!(sent.iter().map(|s| s.2).sum::<u32>(), 12, "{sent:?}");
}

#[test]
fn ru_fragments_larger_than_a_block_span_blocks() {
    let now = Instant::now();
    let cfg = RuConfig {
        index: 0,
        source_id: 9,
        source: Source::Generator(Generator::new(SizeModel::Fixed(200_000), 1)),
        max_per_poll: 4,
        max_run_bytes: 256 * 1024,
    };
    let mut r = Ru::new(cfg, Pool::new("ru", 64 * 1024, 16));
    r.handle(now, NodeRef::Evm, assign(0, 0, 2));
    r.poll(now);
    let g = Generator::new(SizeModel::Fixed(200_000), 1);
    let mut n = 0;
    while let Some(a) = r.next_action() {
        if let Action::SendFragments { data, count, .. } = a {
            assert!(data.slices().len() >= 4);
            assert_eq!(count, 1, "two of them are more than a run holds");
            let (h, p) = decode_fragments(&data).pop().unwrap();
            assert_eq!(p.len(), 200_000);
            assert_eq!(p.crc32c(), h.payload_crc);
            assert!(g.verify(h.event_id, 9, p.chunks()));
            n += 1;
        }
    }
    assert_eq!(n, 2);
}

/// Static content is made a block's worth at a time where it can be (`Ru::static_run`) and
/// one by one where it cannot (a run to open, a fresh block, a large payload): whichever
/// path made them, the runs hold the assigned events in order, each fragment whole and
/// checked, within the run's limits, and the counters add up.
#[test]
fn static_fragments_made_in_one_loop_are_those_made_one_by_one() {
    let now = Instant::now();
    let cases = [
        (SizeModel::Fixed(256), 4096, 7, 4096),
        (SizeModel::Fixed(300), 64 * 1024, 4096, 256 * 1024),
        (
            SizeModel::LogNormal {
                mean: 1500.0,
                stddev: 1500.0,
                min: 16,
                max: 6000,
            },
            16 * 1024,
            1000,
            8 * 1024,
        ),
    ];
    for (sizes, block, max_per_poll, max_run_bytes) in cases {
        let g = Generator::new(sizes, 7).with_content(Content::Static);
        let mut r = Ru::new(
            RuConfig {
                index: 0,
                source_id: 100,
                source: Source::Generator(g.clone()),
                max_per_poll,
                max_run_bytes,
            },
            Pool::new("ru", block, 32),
        );
        // assignments of 1 to 300 events alternating between two BUs
        let mut assigned = Vec::new();
        let mut first = 0u64;
        for k in 0..40u64 {
            let count = 1 + (k * 37 % 300) as u32;
            let bu = (k % 2) as u16;
            r.handle(now, NodeRef::Evm, assign(bu, first, count));
            assigned.extend((first..first + count as u64).map(|id| (id, bu)));
            first += count as u64;
        }
        let mut made = Vec::new();
        let mut to_bu = [0u64; 2];
        for _ in 0..100_000 {
            if made.len() == assigned.len() {
                break;
            }
            r.poll(now);
            let mut released = Vec::new();
            while let Some(a) = r.next_action() {
                let Action::SendFragments {
                    to, data, count, ..
                } = a
                else {
                    continue;
                };
                let NodeRef::Bu(bu) = to else {
                    panic!("fragments for {to}")
                };
                let run = decode_fragments(&data);
                assert_eq!(run.len(), count as usize);
                let last = run.last().map_or(0, |(_, p)| PREFIX_LEN + p.len());
                assert!(
                    count == 1 || data.len() - last <= max_run_bytes,
                    "a run of {} bytes passed its limit {max_run_bytes} by more than its last",
                    data.len()
                );
                for (h, p) in &run {
                    assert_eq!(assigned[made.len()], (h.event_id, bu), "in assigned order");
                    assert_eq!(h.trigger_number, h.event_id as u32);
                    assert_eq!((h.source_id, h.flags), (100, evb_wire::FLAG_GENERATED));
                    assert_eq!(p.len(), g.size(h.event_id, 100));
                    assert_eq!(h.payload_size as usize, p.len());
                    assert_eq!(p.crc32c(), h.payload_crc);
                    assert!(
                        g.verify(h.event_id, 100, p.chunks()),
                        "event {}",
                        h.event_id
                    );
                    to_bu[bu as usize] += p.len() as u64;
                    made.push(h.event_id);
                }
                released.push(assign(bu, run[0].0.event_id, count));
            }
            // released at once: the pool (32 blocks) holds a fraction of the run
            for m in released {
                let Message::Assign(range, 0) = m else {
                    unreachable!()
                };
                r.handle(now, NodeRef::Evm, Message::Release(range));
            }
        }
        assert_eq!(made.len(), assigned.len(), "every assigned fragment made");
        let s = r.stats();
        assert_eq!(s.fragments_sent, first);
        assert_eq!(s.payload_bytes_to_bu, to_bu.to_vec());
        assert_eq!(s.payload_bytes_sent, to_bu.iter().sum::<u64>());
        assert_eq!((s.retained, s.pending_events, s.errors), (0, 0, 0));
    }
}

#[test]
fn static_content_is_made_once_and_sent_by_reference() {
    let now = Instant::now();
    let g = generator().with_content(Content::Static);
    let cfg = RuConfig {
        index: 0,
        source_id: 100,
        source: Source::Generator(g.clone()),
        max_per_poll: 1000,
        max_run_bytes: 256 * 1024,
    };
    let pool = Pool::new("ru", 64 * 1024, 64);
    let mut r = Ru::new(cfg, pool.clone());
    r.handle(now, NodeRef::Evm, assign(0, 0, 500));
    r.poll(now);
    let mut b = Bu::new(BuConfig {
        generator: Some(g.clone()),
        slices: None,
        source_ids: vec![100],
        ..bu_cfg(0, 1, 1000)
    });
    b.handle(now, NodeRef::Evm, Message::Start);
    b.handle(now, NodeRef::Evm, assign(0, 0, 500));
    let mut referenced = std::collections::HashSet::new();
    let (mut n, mut inline) = (0, 0);
    while let Some(a) = r.next_action() {
        if let Action::SendFragments { data, count, .. } = a {
            let run = decode_fragments(&data);
            assert_eq!(run.len(), count as usize);
            for (h, p) in run {
                assert_eq!(p.len(), g.size(h.event_id, 100));
                assert_eq!(p.crc32c(), h.payload_crc);
                if p.len() > crate::ru::STATIC_INLINE_MAX {
                    referenced.insert(p.slices()[0].block_address());
                } else {
                    // Small payloads sit right after their prefix: one piece.
                    assert_eq!(p.slices().len(), 1);
                    inline += 1;
                }
                b.handle_fragment(now, NodeRef::Ru(0), h, p);
                n += 1;
            }
        }
    }
    assert_eq!(n, 500);
    assert!(inline > 0 && inline < 500, "{inline} inline");
    assert_eq!(
        referenced.len(),
        1,
        "every large payload is the one template"
    );
    let built = drain_delivered(&mut b);
    assert_eq!(built.len(), 500);
    assert_eq!((b.stats().crc_errors, b.stats().content_errors), (0, 0));
    // Verified byte by byte: unique content would not match.
    let (h, p) = fragment_for(0, 3);
    assert!(!g.verify(h.event_id, h.source_id, p.chunks()));
}

#[test]
fn killed_builder_events_are_rebuilt_elsewhere_exactly_once() {
    let mut s = Sim::new(2, 3, 2000, 6, 0);
    s.steps(40);
    assert!(
        s.evm.stats().released > 0 && s.evm.stats().triggered < 2000,
        "kill it mid-run"
    );
    s.kill(NodeRef::Bu(1));
    s.run(200_000);
    for (who, ok, why) in &s.exits {
        assert!(ok, "{who}: {why}");
    }
    let r = s.evm.report(s.now);
    assert!(verdict(&r).is_empty(), "{:?}", verdict(&r));
    assert!(r.evm.reassigned > 0, "the lost BU held events");
    assert_eq!(r.down, vec!["bu[1]".to_string()]);
    // every event exactly once: the survivors' sinks plus what bu[1] released before it died
    assert_eq!(
        s.sinks[0].events + s.sinks[2].events + r.evm.released_by_lost,
        2000
    );
    let survivors: std::collections::HashSet<u64> = [0usize, 2]
        .iter()
        .flat_map(|&b| s.sinks[b].ids.iter().copied())
        .collect();
    assert_eq!(
        survivors.len() as u64,
        s.sinks[0].events + s.sinks[2].events,
        "no duplicates"
    );
    assert!(s.rus.iter().all(|r| r.stats().retained == 0));
    assert!(s.rus.iter().any(|r| r.stats().fragments_resent > 0));
}

/// Sinks that commit: a BU killed with events accepted and not yet committed loses none of
/// them. The RUs kept their fragments until the commit, so those events are built again
/// elsewhere; what the BU's committed parts hold stays its output; and the published parts
/// of all BUs hold every event exactly once.
#[test]
fn a_killed_committing_builder_loses_nothing_it_had_not_committed() {
    for doubt in [false, true] {
        killed_committing_builder(doubt);
    }
}

fn killed_committing_builder(doubt: bool) {
    let mut s = Sim::new(2, 3, 3000, 6, 0);
    s.commit_every = Some(20);
    let mut commits = EvmConfig {
        commits: vec![true; 3],
        ..evm_cfg(2, 3, 3000)
    };
    commits.n_bu = 3;
    // the nodes' Ready messages are still on the wire: they reach this EVM
    s.evm = Evm::new(commits, s.now);
    // kill bu[1] once it has published something and holds accepted, uncommitted events,
    // and, on the second trial, a part committed and not yet published
    let mut killed = false;
    for _ in 0..5000 {
        s.steps(1);
        let in_doubt = !s.parts[1].is_empty();
        if !s.published[1].is_empty() && !s.staged[1].is_empty() && in_doubt == doubt {
            s.kill(NodeRef::Bu(1));
            killed = true;
            break;
        }
    }
    assert!(killed, "bu[1] never had both published and staged events");
    let lost_staged: u64 = s.staged[1].iter().map(|(_, n)| *n as u64).sum();
    s.run(400_000);
    for (who, ok, why) in &s.exits {
        assert!(ok, "{who}: {why}");
    }
    let r = s.evm.report(s.now);
    assert!(verdict(&r).is_empty(), "{:?}", verdict(&r));
    assert!(
        r.evm.accepted >= 3000 + lost_staged,
        "accepted again elsewhere"
    );
    if doubt {
        assert!(
            r.evm.parts_published_for_lost > 0,
            "the EVM published for it"
        );
    }
    assert_eq!(r.evm.released_by_lost, s.published[1].len() as u64);
    let mut all: Vec<u64> = s.published.iter().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..3000).collect::<Vec<_>>(),
        "every event in exactly one part"
    );
    assert!(s.rus.iter().all(|r| r.stats().retained == 0));
}

/// A data link cut with both ends alive (a reset the RU never reports, the BU closing it):
/// the BU tells the EVM itself, and once the RU is seen alive past the grace, the BU leaves
/// the run and its events are built elsewhere exactly once. The run never waits for
/// `stall_timeout` on the RU's good manners.
#[test]
fn a_link_the_bu_reports_lost_drops_the_bu_when_the_ru_lives_on() {
    let mut s = Sim::new(2, 3, 2000, 6, 0);
    s.steps(40);
    assert!(s.evm.stats().triggered < 2000, "cut it mid-run");
    // the link goes; only the BU's end is told (the RU's end stays silent)
    s.cut.push((NodeRef::Ru(0), NodeRef::Bu(1)));
    s.bus[1].peer_lost(NodeRef::Ru(0), "connection reset");
    s.run(200_000);
    for (who, ok, why) in &s.exits {
        assert!(*ok || *who == NodeRef::Bu(1), "{who}: {why}");
    }
    let r = s.evm.report(s.now);
    assert!(verdict(&r).is_empty(), "{:?}", verdict(&r));
    assert_eq!(r.down, vec!["bu[1]".to_string()]);
    assert_eq!(
        s.sinks[0].events + s.sinks[2].events + r.evm.released_by_lost,
        2000
    );
    assert!(s.rus.iter().all(|r| r.stats().retained == 0));
}

/// An RU that dies closes its links to every BU: each BU reports its link lost, and the RU
/// loss (seen by the EVM within the grace) decides by its policy; no BU is dropped for it.
#[test]
fn links_reported_lost_by_bus_for_a_dead_ru_drop_no_bu() {
    let mut s = Sim::new(3, 2, 1000, 6, 0);
    s.steps(40);
    // the BUs see the RU's data links close first; the EVM hears of the RU itself a little later
    s.dead.push(NodeRef::Ru(2));
    for b in &mut s.bus {
        b.peer_lost(NodeRef::Ru(2), "connection reset");
    }
    s.steps(100);
    s.evm.peer_lost(s.now, NodeRef::Ru(2), "killed");
    s.run(200_000);
    for (who, ok, why) in &s.exits {
        assert!(ok, "{who}: {why}");
    }
    let r = s.evm.report(s.now);
    assert!(verdict(&r).is_empty(), "{:?}", verdict(&r));
    assert_eq!(r.down, vec!["ru[2]".to_string()]);
    assert_eq!(s.sinks.iter().map(|k| k.events).sum::<u64>(), 1000);
}

#[test]
fn lost_readout_unit_gives_partial_events_by_policy() {
    let mut s = Sim::new(3, 2, 1000, 6, 0);
    s.steps(40);
    s.kill(NodeRef::Ru(2));
    s.run(200_000);
    for (who, ok, why) in &s.exits {
        assert!(ok, "{who}: {why}");
    }
    let r = s.evm.report(s.now);
    assert!(verdict(&r).is_empty(), "{:?}", verdict(&r));
    let partial: u64 = s.bus.iter().map(|b| b.stats().partial_events).sum();
    assert!(partial > 0 && partial < 1000, "{partial}");
    assert_eq!(s.sinks.iter().map(|k| k.events).sum::<u64>(), 1000);
}

#[test]
fn lost_readout_unit_stops_the_run_by_policy() {
    let mut s = Sim::new(2, 2, 100_000, 4, 0);
    // the Sim's RUs and BUs have queued their Ready for the EVM replaced here
    s.evm = Evm::new(
        EvmConfig {
            on_ru_loss: RuLossPolicy::Stop,
            ..evm_cfg(2, 2, 100_000)
        },
        s.now,
    );
    s.steps(20);
    assert_eq!(s.evm.state(), RunState::Running);
    s.kill(NodeRef::Ru(1));
    assert_eq!(s.evm.state(), RunState::Aborted);
    let mut told = 0;
    while let Some(a) = s.evm.next_action() {
        if let Action::Send {
            msg: Message::Abort(why),
            ..
        } = a
        {
            assert!(why.contains("ru[1]"));
            told += 1;
        }
    }
    assert_eq!(told, 3, "every live node is told why");
}

#[test]
fn fragments_of_events_never_assigned_here_are_counted_misrouted_and_freed() {
    let now = Instant::now();
    let mut b = lone_bu(1);
    let (h, p) = fragment_for(0, 77);
    b.handle_fragment(now, NodeRef::Ru(0), h, p);
    b.poll(now + Duration::from_secs(1));
    assert_eq!(b.in_flight(), 1, "an Assign may still come");
    assert_eq!(b.stats().misrouted, 0);
    b.poll(now + Duration::from_secs(11));
    assert_eq!(b.in_flight(), 0, "its blocks are freed");
    assert_eq!(b.stats().misrouted, 1);
    assert!(!b.stats().clean());
}

#[test]
fn a_bu_counts_only_events_whose_release_the_evm_echoed() {
    let now = Instant::now();
    let mut b = lone_bu(1);
    b.handle(now, NodeRef::Evm, assign(0, 0, 3));
    for id in 0..3 {
        let (h, p) = fragment_for(0, id);
        b.handle_fragment(now, NodeRef::Ru(0), h, p);
    }
    for e in drain_delivered(&mut b) {
        b.delivered(e.event_id, e.bytes);
    }
    b.poll(now);
    assert_eq!(b.stats().events_built, 0, "released, not yet accepted");
    assert_eq!(b.stats().unacknowledged, 3);
    // the EVM accepts 0 and 2 (it refused 1): the echo skips it
    b.handle(
        now,
        NodeRef::Evm,
        Message::Release(EventRange {
            bu: 0,
            first: 0,
            count: 1,
        }),
    );
    b.handle(
        now,
        NodeRef::Evm,
        Message::Release(EventRange {
            bu: 0,
            first: 2,
            count: 1,
        }),
    );
    let s = b.stats();
    assert_eq!(
        (s.events_built, s.releases_refused, s.unacknowledged),
        (2, 1, 0)
    );
    assert_eq!(s.event_id_sum, 2);
    let accepted: Vec<(u64, u32)> = std::iter::from_fn(|| b.next_action())
        .filter_map(|a| match a {
            Action::Accepted(r) => Some((r.first, r.count)),
            _ => None,
        })
        .collect();
    assert_eq!(accepted, vec![(0, 1), (2, 1)]);
    // a bogus echo with a huge count costs nothing and is counted
    b.handle(
        now,
        NodeRef::Evm,
        Message::Release(EventRange {
            bu: 0,
            first: 100,
            count: u32::MAX,
        }),
    );
    assert_eq!(b.stats().errors, 1);
}

#[test]
fn a_release_from_a_bu_already_dropped_does_not_count() {
    // an RU reported its data link to bu1 lost; bu1's own release of the same events,
    // read in the same pass, must not make them released: they are bu0's now
    let now = Instant::now();
    let mut evm = Evm::new(evm_cfg(1, 2, 100), now);
    let ready = Message::Ready {
        available: evb_wire::UNLIMITED,
    };
    for n in [NodeRef::Ru(0), NodeRef::Bu(0), NodeRef::Bu(1)] {
        evm.handle(now, n, ready.clone());
    }
    evm.handle(now, NodeRef::Bu(1), Message::Credit { bu: 1, count: 3 });
    // bu0 answers the start too, with nothing to give yet (triggering waits for every BU)
    evm.handle(now, NodeRef::Bu(0), Message::Credit { bu: 0, count: 0 });
    evm.poll(now);
    assert_eq!(evm.stats().triggered, 3);
    evm.handle(now, NodeRef::Ru(0), Message::LinkLost { peer: 1, inc: 0 });
    assert!(std::iter::from_fn(|| evm.next_action())
        .any(|a| matches!(a, Action::Disconnect(NodeRef::Bu(1)))));
    let late = EventRange {
        bu: 1,
        first: 0,
        count: 3,
    };
    evm.handle(now, NodeRef::Bu(1), Message::Release(late));
    let s = evm.stats();
    assert_eq!((s.released, s.ignored_from_lost), (0, 1));
    // bu0 builds them instead, exactly once
    evm.handle(now, NodeRef::Bu(0), Message::Credit { bu: 0, count: 3 });
    evm.poll(now);
    evm.handle(
        now,
        NodeRef::Bu(0),
        Message::Release(EventRange { bu: 0, ..late }),
    );
    let s = evm.stats();
    assert_eq!((s.released, s.duplicate_releases, s.reassigned), (3, 0, 3));
}

#[test]
fn pause_stops_triggering_and_its_time_does_not_count() {
    let t0 = Instant::now();
    let mut cfg = evm_cfg(1, 1, 1_000_000);
    cfg.rate_hz = Some(1000.0);
    let mut evm = Evm::new(cfg, t0);
    for from in [NodeRef::Ru(0), NodeRef::Bu(0)] {
        let ready = Message::Ready {
            available: evb_wire::UNLIMITED,
        };
        evm.handle(t0, from, ready);
    }
    let credit = Message::Credit {
        bu: 0,
        count: 1_000_000,
    };
    evm.handle(t0, NodeRef::Bu(0), credit);
    let at = |ms| t0 + Duration::from_millis(ms);
    for ms in 1..=10 {
        evm.poll(at(ms));
    }
    assert_eq!(evm.stats().triggered, 10);
    evm.set_paused(at(10), true);
    assert!(!evm.has_work());
    for ms in 11..=100 {
        evm.poll(at(ms));
    }
    assert_eq!(evm.stats().triggered, 10, "triggered while paused");
    assert!(evm.stats().paused);
    evm.set_paused(at(100), false);
    // 90 ms paused: at 110 ms the rate allows 20 events, not 110
    for ms in 101..=110 {
        evm.poll(at(ms));
    }
    let s = evm.stats();
    assert_eq!(s.triggered, 20);
    assert!(!s.paused);
    assert!((s.paused_s - 0.090).abs() < 1e-9, "{}", s.paused_s);
    // a stop while paused drains and ends the run
    evm.set_paused(at(110), true);
    evm.request_stop(at(111));
    assert!(evm.stats().stopped_by_request);
}

#[test]
fn the_bu_measures_each_events_building_latency() {
    let mut s = Sim::new(2, 2, 200, 8, 0);
    s.run(100_000);
    assert_clean_run(&s, 200);
    let mut all = crate::LatencyHistogram::default();
    for b in &s.bus {
        let st = b.stats();
        assert_eq!(
            st.latency.count, st.events_built,
            "one latency per event built"
        );
        all.merge(&st.latency);
    }
    assert_eq!(all.count, 200);
    assert_eq!(all.counts.iter().sum::<u64>(), 200);
}

/// RUs fed live: the EVM triggers only events whose fragments have arrived at every RU, and
/// the run ends with the streams; one RU's payloads are super-fragments of two streams.
#[test]
fn live_feeds_gate_the_trigger_and_end_the_run() {
    use crate::assembly::*;
    let mut s = Sim::new(2, 2, 1_000_000, 4, 3);
    for (i, r) in s.rus.iter_mut().enumerate() {
        *r = Ru::new(
            RuConfig {
                index: i as u16,
                source_id: 100 + i as u16,
                source: Source::Live(LiveFeed::default()),
                max_per_poll: 16,
                max_run_bytes: 4 * 1024,
            },
            Pool::new("ru", 64 * 1024, 64),
        );
        r.connections_up();
    }
    let names = |k: usize| {
        (0..k)
            .map(|j| StreamName {
                source_id: 800 + j as u16,
                addr: format!("fe{j}"),
            })
            .collect()
    };
    let mut asm: Vec<Assembler> = [1, 2]
        .into_iter()
        .map(|k| {
            Assembler::new(AssemblyConfig {
                streams: names(k),
                on_error: BadFragment::Stop,
                on_sync_loss: SyncLoss::Stop,
                trigger_mask: u32::MAX,
                trigger_name: "trigger number",
            })
        })
        .collect();
    let mut feed = |s: &mut Sim, upto: u32, ru: usize| {
        let a = &mut asm[ru];
        for t in a.assembled() as u32..upto {
            for k in 0..ru + 1 {
                a.push(
                    k,
                    assembly::Piece {
                        trigger_number: t + 1,
                        bytes: vec![t as u8; 100 + k * 10 + t as usize % 7],
                        offset: 0,
                        bad: None,
                    },
                );
            }
        }
        while let Some(e) = a.next_event(std::time::Instant::now()).unwrap() {
            s.rus[ru].live_mut().unwrap().supply(e);
        }
    };
    feed(&mut s, 10, 0);
    feed(&mut s, 25, 1);
    s.steps(200);
    assert_eq!(s.evm.stats().triggered, 10, "only what every RU holds");
    feed(&mut s, 60, 0);
    s.steps(200);
    assert_eq!(s.evm.stats().triggered, 25);
    feed(&mut s, 60, 1);
    for r in &mut s.rus {
        r.live_mut().unwrap().finish();
    }
    s.run(100_000);
    assert_clean_run(&s, 60);
    assert!(s.bus.iter().all(|b| b.stats().super_fragment_errors == 0));
}

#[test]
fn triggering_waits_for_every_bus_first_credits_or_the_grace() {
    let t0 = Instant::now();
    let start = |evm: &mut Evm| {
        let ready = Message::Ready {
            available: evb_wire::UNLIMITED,
        };
        for n in [NodeRef::Ru(0), NodeRef::Bu(0), NodeRef::Bu(1)] {
            evm.handle(t0, n, ready.clone());
        }
        evm.handle(t0, NodeRef::Bu(0), Message::Credit { bu: 0, count: 100 });
        evm.poll(t0);
    };
    // bu1 answers a moment later: both get events from the first assignment on
    let mut evm = Evm::new(evm_cfg(1, 2, 64), t0);
    start(&mut evm);
    assert_eq!(evm.stats().triggered, 0, "bu0 alone took the run");
    assert!(!evm.has_work());
    let t1 = t0 + Duration::from_millis(5);
    evm.handle(t1, NodeRef::Bu(1), Message::Credit { bu: 1, count: 100 });
    evm.poll(t1);
    let s = evm.stats();
    assert_eq!(s.triggered, 64);
    // a BU that never answers holds the start back for the grace only
    let mut evm = Evm::new(evm_cfg(1, 2, 64), t0);
    start(&mut evm);
    evm.poll(t0 + FIRST_CREDITS_GRACE / 2);
    assert_eq!(evm.stats().triggered, 0);
    evm.poll(t0 + FIRST_CREDITS_GRACE);
    assert_eq!(evm.stats().triggered, 64);
}

#[test]
fn random_assignment_waits_for_the_drawn_bu_and_credits_pass_it_over() {
    let t0 = Instant::now();
    // bu0 and bu1 grant 30 credits each, bu2 none: with credits the EVM uses the two that
    // can take events; drawn at random it soon draws bu2 and waits for it (head of line)
    let run = |assignment| {
        let mut evm = Evm::new(
            EvmConfig {
                assignment,
                ..evm_cfg(1, 3, 1000)
            },
            t0,
        );
        let ready = Message::Ready {
            available: evb_wire::UNLIMITED,
        };
        for n in [
            NodeRef::Ru(0),
            NodeRef::Bu(0),
            NodeRef::Bu(1),
            NodeRef::Bu(2),
        ] {
            evm.handle(t0, n, ready.clone());
        }
        for bu in 0..2 {
            evm.handle(t0, NodeRef::Bu(bu), Message::Credit { bu, count: 30 });
        }
        evm.poll(t0 + FIRST_CREDITS_GRACE);
        evm
    };
    assert_eq!(run(crate::Assignment::Credits).stats().triggered, 60);
    let mut evm = run(crate::Assignment::Random);
    let held = evm.stats().triggered;
    assert!(held < 60 && held % 3 == 0, "{held}");
    // bu2's credit lets the drawn batch go
    let t1 = t0 + FIRST_CREDITS_GRACE + Duration::from_millis(1);
    evm.handle(t1, NodeRef::Bu(2), Message::Credit { bu: 2, count: 30 });
    evm.poll(t1);
    assert!(evm.stats().triggered > held);
}

/// The RU holds its fragments in runs (one record per run of consecutive events for one
/// BU): releases in any order and in any pieces, releases of ids it never held or already
/// released, and reassignments of held events must come out exactly as if it held each
/// fragment on its own (a set of ids), with the same bytes sent again.
#[test]
fn ru_runs_release_and_resend_as_fragments_one_by_one() {
    let seed = std::env::var("EVB_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            t.map_or(1, |d| d.as_nanos() as u64)
        });
    println!("seed {seed} (EVB_TEST_SEED replays it)");
    let mut x = seed | 1;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n.max(1)
    };
    let now = Instant::now();
    let cfg = RuConfig {
        index: 0,
        source_id: 100,
        source: Source::Generator(generator()),
        max_per_poll: 16,
        // runs of several fragments (about 3 kB each), cut at pool blocks and passes
        max_run_bytes: 32 * 1024,
    };
    let mut r = Ru::new(cfg, Pool::new("ru", 64 * 1024, 1024));
    r.handle(now, NodeRef::Evm, Message::Start);
    let mut runs = 0;
    let mut held: std::collections::BTreeMap<u64, Vec<u8>> = Default::default();
    let (mut next, mut released, mut errors, mut resent) = (0u64, 0u64, 0u64, 0u64);
    let mut take = |r: &mut Ru| {
        let mut out = Vec::new();
        while let Some(a) = r.next_action() {
            if let Action::SendFragments { data, count, .. } = a {
                let run = decode_fragments(&data);
                assert_eq!(run.len(), count as usize);
                runs += (count > 1) as u32;
                out.extend(run.into_iter().map(|(h, p)| (h.event_id, p.to_vec())));
            }
        }
        out
    };
    for step in 0..400 {
        match rnd(4) {
            // new events, to one of two BUs
            0 | 1 => {
                let count = 1 + rnd(40) as u32;
                r.handle(now, NodeRef::Evm, assign(rnd(2) as u16, next, count));
                next += count as u64;
                while r.has_work() {
                    r.poll(now);
                }
                for (id, bytes) in take(&mut r) {
                    assert!(
                        held.insert(id, bytes).is_none(),
                        "step {step}: {id} made twice"
                    );
                }
                assert_eq!(held.keys().next_back(), Some(&(next - 1)), "step {step}");
            }
            // a release of a random piece, anywhere (held, released or never made)
            2 => {
                let first = rnd(next + 10);
                let count = 1 + rnd(30) as u32;
                let range = EventRange {
                    bu: 0,
                    first,
                    count,
                };
                if count as usize > held.len() {
                    errors += 1; // refused whole
                } else {
                    for id in first..first + count as u64 {
                        if held.remove(&id).is_some() {
                            released += 1;
                        } else {
                            errors += 1;
                        }
                    }
                }
                r.handle(now, NodeRef::Evm, Message::Release(range));
            }
            // a held event reassigned: the same bytes again
            _ => {
                let Some((&id, bytes)) = held.iter().nth(rnd(held.len() as u64) as usize) else {
                    continue;
                };
                let bytes = bytes.clone();
                r.handle(now, NodeRef::Evm, assign(1, id, 1));
                r.poll(now);
                let again = take(&mut r);
                assert!(
                    again.len() == 1 && again[0].0 == id && again[0].1 == bytes,
                    "step {step}: event {id} sent again as {} fragments",
                    again.len()
                );
                resent += 1;
            }
        }
        let st = r.stats();
        assert_eq!(st.retained, held.len() as u64, "step {step}");
        assert_eq!(st.events_released, released, "step {step}");
        assert_eq!(st.errors, errors, "step {step}");
        assert_eq!(st.fragments_resent, resent, "step {step}");
    }
    // the rest released one by one: nothing held, no error more
    for &id in held.keys() {
        let one = EventRange {
            bu: 0,
            first: id,
            count: 1,
        };
        r.handle(now, NodeRef::Evm, Message::Release(one));
    }
    assert_eq!(r.stats().retained, 0);
    assert_eq!(r.stats().errors, errors);
    assert!(runs > 50, "only {runs} runs of several fragments");
}

/// Ctrl-C before every node is ready: the run starts with nothing to trigger and ends as a
/// normal run does (Stop, reports, a clean verdict), not as an abort that fails a run which
/// lost nothing.
#[test]
fn a_stop_before_the_run_starts_ends_it_cleanly_with_nothing_triggered() {
    let mut s = Sim::new(2, 2, 500, 8, 0);
    let now = s.now;
    s.evm.request_stop(now);
    s.run(100_000);
    assert_clean_run(&s, 0);
    let st = s.evm.stats();
    assert!(st.stopped_by_request);
    assert_eq!(st.triggered, 0);
    assert!(s.evm.state().is_over(), "{:?}", s.evm.state());
}

/// What happens to nodes is typed: a loss, a rejoin and a refused report are three kinds of
/// `NodeEvent`, only the first a loss; the JSON names them, and the words are as before.
#[test]
fn node_events_are_typed_and_only_losses_count_as_losses() {
    let t0 = Instant::now();
    let mut evm = Evm::new(evm_cfg(1, 2, 1000), t0);
    for n in [NodeRef::Ru(0), NodeRef::Bu(0), NodeRef::Bu(1)] {
        evm.handle(
            t0,
            n,
            Message::Ready {
                available: evb_wire::UNLIMITED,
            },
        );
    }
    assert_eq!(evm.state(), RunState::Running);
    let t1 = t0 + Duration::from_millis(250);
    evm.peer_lost(t1, NodeRef::Bu(1), "connection reset");
    evm.handle(
        t1,
        NodeRef::Bu(1),
        Message::Ready {
            available: evb_wire::UNLIMITED,
        },
    );
    let st = evm.stats();
    let kinds: Vec<NodeEventKind> = st.lost.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [NodeEventKind::Lost, NodeEventKind::Rejoined]);
    assert_eq!(st.losses(), 1, "a rejoin is no loss: {:?}", st.lost);
    assert_eq!(st.lost[0].at_s, 0.25);
    assert_eq!(
        st.lost[0].to_string(),
        "bu[1] lost at 0.250 s: connection reset"
    );
    assert_eq!(st.lost[1].to_string(), "bu[1] rejoined");
    assert_eq!(
        serde_json::to_value(&st.lost[0]).unwrap(),
        serde_json::json!({"node": "bu[1]", "at_s": 0.25, "kind": "lost",
                           "reason": "connection reset"})
    );
    assert_eq!(
        serde_json::to_value(&st.lost[1]).unwrap()["kind"],
        "rejoined"
    );
    let r = evm.report(t1);
    assert!(r.lost(NodeRef::Bu(1)) && !r.lost(NodeRef::Bu(0)) && !r.lost(NodeRef::Ru(0)));

    // the run ends; a report that is not one is refused, said so, and is no loss either
    evm.request_stop(t1);
    evm.poll(t1);
    assert_eq!(evm.state(), RunState::Stopping);
    evm.handle(t1, NodeRef::Bu(0), Message::Report("not json".into()));
    let refused = evm.stats().lost.pop().unwrap();
    assert_eq!(refused.kind, NodeEventKind::ReportRefused);
    assert!(refused
        .to_string()
        .starts_with("bu[0] sent a report that was refused: "));
    evm.peer_lost(t1, NodeRef::Ru(0), "killed");
    let last = evm.stats().lost.pop().unwrap();
    assert_eq!(last.kind, NodeEventKind::LostBeforeReport);
    assert_eq!(last.to_string(), "ru[0] lost before its report: killed");
    assert_eq!(evm.stats().losses(), 2);

    // the report as the EVM's status line carries it reads back as the same report; a
    // damaged one is refused
    let r = evm.report(t1);
    let text = serde_json::to_string(&r).unwrap();
    assert_eq!(serde_json::from_str::<RunReport>(&text).unwrap(), r);
    assert!(serde_json::from_value::<RunReport>(serde_json::json!({"lost": 1})).is_err());
    assert!(!r.ok() && !r.verdict().is_empty());
}

#[test]
fn an_ru_counts_the_bytes_it_sends_to_each_bu() {
    let now = Instant::now();
    let mut r = ru(0, 64 * 1024, 1024);
    r.handle(now, NodeRef::Evm, Message::Start);
    // 30 events to BU 0, then 10 to BU 2 (BU 1 gets none)
    r.handle(now, NodeRef::Evm, assign(0, 0, 30));
    r.handle(now, NodeRef::Evm, assign(2, 30, 10));
    while r.has_work() {
        r.poll(now);
    }
    let mut sent = [0u64; 3];
    while let Some(a) = r.next_action() {
        if let Action::SendFragments {
            to: NodeRef::Bu(bu),
            data,
            ..
        } = a
        {
            for (_, p) in decode_fragments(&data) {
                sent[usize::from(bu)] += p.len() as u64;
            }
        }
    }
    let s = r.stats();
    assert_eq!(s.fragments_sent, 40);
    assert!(sent[0] > 0 && sent[2] > 0, "{sent:?}");
    assert_eq!(s.payload_bytes_to_bu, sent.to_vec(), "{s:?}");
    assert_eq!(
        s.payload_bytes_to_bu.iter().sum::<u64>(),
        s.payload_bytes_sent
    );
}

/// The farthest event a new EVM assigns over `passes` polls (one past its last id), from
/// its queued actions.
fn assigned_until(evm: &mut Evm, now: Instant, passes: usize) -> u64 {
    let mut until = 0;
    for _ in 0..passes {
        evm.poll(now);
        while let Some(a) = evm.next_action() {
            if let Action::Send {
                msg: Message::Assign(r, _),
                ..
            } = a
            {
                until = until.max(r.end());
            }
        }
    }
    until
}

/// A standby that takes over a run whose RUs are fed live (streams, a producer) assigns
/// nothing past what the old EVM assigned until the RUs announce what they hold again, and
/// then only as far as the lowest announcement; a finished feed's announcement ends the run
/// there. Without the live gate the same takeover assigns on (what the gate prevents).
#[test]
fn a_new_evm_of_a_live_fed_run_waits_for_the_rus_announcements() {
    let now = Instant::now();
    let take_over = |live_fed: bool| {
        let cfg = EvmConfig {
            max_events: None,
            ..evm_cfg(2, 2, 0)
        };
        // events 0..10 were assigned, built and released: the RUs hold none of them
        let rus = (0..2)
            .map(|ru| RuResync {
                ru,
                known_until: 10,
                holds: Vec::new(),
                stopping: false,
            })
            .collect();
        let bus = (0..2)
            .map(|bu| BuResync {
                bu,
                free_credits: 8,
                ..Default::default()
            })
            .collect();
        let t = Takeover {
            epoch: 1,
            live_fed,
            ..Default::default()
        };
        Evm::take_over(cfg, now, t, rus, bus)
    };
    let mut plain = take_over(false);
    assert!(assigned_until(&mut plain, now, 4) > 10);
    let mut evm = take_over(true);
    let announce = |evm: &mut Evm, ru: u16, count: u64, done: bool| {
        evm.handle(now, NodeRef::Ru(ru), Message::Available { count, done });
    };
    assert_eq!(
        assigned_until(&mut evm, now, 4),
        0,
        "before any announcement"
    );
    announce(&mut evm, 0, 30, false);
    assert_eq!(
        assigned_until(&mut evm, now, 4),
        0,
        "before ru[1] announced"
    );
    announce(&mut evm, 1, 25, true);
    assert_eq!(assigned_until(&mut evm, now, 8), 25);
    assert_eq!(evm.stats().triggered, 25);
}

/// One step of a BU's input, for [`joined_and_recorded_bus_give_the_same_output`].
#[derive(Clone, Debug)]
enum Step {
    Assign(u64, u32),
    Fragment(u16, FragmentHeader, usize),
    /// Fragments of one RU as one pass over its connection brings them (`Bu::handle_page`).
    Page(u16, Vec<(FragmentHeader, usize)>),
    /// The sink takes what is built (false: it is busy, and takes nothing).
    Sink(bool),
    /// The clock moves on this many microseconds and the BU polls.
    Poll(u64),
    SourceLost(u16),
    Stop,
}

/// A sink that remembers what it took, events and spans alike, in order.
#[derive(Default)]
struct Taking {
    ids: Vec<u64>,
    bytes: u64,
    refuse: bool,
}

impl Sink for Taking {
    fn deliver(&mut self, e: &BuiltEvent) -> Result<(), SinkError> {
        if self.refuse {
            return Err(SinkError::Busy("test".into()));
        }
        self.ids.push(e.event_id);
        self.bytes += e.bytes;
        Ok(())
    }
    fn takes_spans(&self) -> bool {
        true
    }
    fn deliver_span(&mut self, first: u64, count: u32, bytes: u64) -> Result<(), SinkError> {
        if self.refuse {
            return Err(SinkError::Busy("test".into()));
        }
        self.ids.extend(first..first + count as u64);
        self.bytes += bytes;
        Ok(())
    }
    fn accepted(&mut self, _first: u64, _count: u32) -> Result<(), SinkError> {
        Ok(())
    }
    fn finish(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
    fn name(&self) -> &'static str {
        "taking"
    }
}

/// A seeded script of a BU's input: ranges assigned with other BUs' ids between them,
/// each RU's fragments in id order, some before their Assign, the sink now and then busy;
/// with `odd`, now and then a duplicate, a fragment never sent, a bad CRC, a wrong source
/// id, a trigger number that differs, a fragment its RU flagged MISSING, two fragments
/// swapped, a fragment of an event never assigned here, an Assign sent again, a long wait,
/// a source lost.
fn bu_script(seed: u64, n_ru: u16, odd: bool) -> Vec<Step> {
    let mut x = seed | 1;
    let mut rand = |n: u64| next(&mut x) % n;
    let mut ranges = Vec::new();
    let mut id = rand(5);
    for _ in 0..60 {
        let count = 1 + rand(12) as u32;
        ranges.push((id, count));
        id += count as u64 + rand(4);
    }
    let chance = |r: u64| odd && r == 0;
    // each RU's fragments, as (range index, fragment, size)
    let mut lanes: Vec<VecDeque<(usize, FragmentHeader, usize)>> =
        vec![VecDeque::new(); n_ru as usize];
    for (k, &(first, count)) in ranges.iter().enumerate() {
        for id in first..first + count as u64 {
            for ru in 0..n_ru {
                let size = 8 + (id as usize * 7 + ru as usize * 3) % 40;
                let mut h = FragmentHeader {
                    event_id: id,
                    trigger_number: id as u32,
                    source_id: 100 + ru,
                    flags: 0,
                    payload_size: size as u32,
                    payload_crc: 0,
                };
                let lane = &mut lanes[ru as usize];
                match rand(300) {
                    0 if odd => continue, // never sent
                    1 if odd => h.payload_crc = 1,
                    2 if odd => h.source_id += 50,
                    3 if odd => h.trigger_number += 1,
                    4 if odd => h.flags = evb_wire::FLAG_MISSING,
                    5 if odd => {
                        if let Some(dup) = lane.back().cloned() {
                            lane.push_back(dup);
                        }
                    }
                    6 if odd => {
                        // an event of another BU's (in a gap), never assigned here
                        let mut m = h;
                        m.event_id = first + count as u64 + 1000;
                        lane.push_back((k, m, size));
                    }
                    _ => {}
                }
                lane.push_back((k, h, size));
                if chance(rand(300)) && lane.len() >= 2 {
                    let n = lane.len();
                    lane.swap(n - 1, n - 2);
                }
            }
        }
    }
    let lost = (odd && rand(3) == 0).then(|| (rand(n_ru as u64) as u16, rand(400) as usize));
    let mut steps = Vec::new();
    let mut assigned = 0usize;
    loop {
        if let Some((ru, at)) = lost {
            if steps.len() == at {
                steps.push(Step::SourceLost(ru));
            }
        }
        let live: Vec<usize> = (0..n_ru as usize)
            .filter(|&r| lanes[r].front().is_some_and(|f| f.0 < assigned + 3))
            .collect();
        let r = rand(20);
        if r < 3 && assigned < ranges.len() {
            let (first, count) = ranges[assigned];
            steps.push(Step::Assign(first, count));
            assigned += 1;
            if chance(rand(40)) {
                let (first, count) = ranges[rand(assigned as u64) as usize];
                steps.push(Step::Assign(first, count));
            }
        } else if r < 15 && !live.is_empty() {
            let ru = live[rand(live.len() as u64) as usize];
            let (_, h, size) = lanes[ru].pop_front().unwrap();
            if rand(3) == 0 {
                // a page: this fragment and up to 7 more of the RU's that are due
                let mut page = vec![(h, size)];
                while page.len() < 1 + rand(8) as usize
                    && lanes[ru].front().is_some_and(|f| f.0 < assigned + 3)
                {
                    let (_, h, size) = lanes[ru].pop_front().unwrap();
                    page.push((h, size));
                }
                steps.push(Step::Page(ru as u16, page));
            } else {
                steps.push(Step::Fragment(ru as u16, h, size));
            }
        } else if r < 18 {
            steps.push(Step::Sink(rand(4) != 0));
        } else if r < 20 {
            let wait = if chance(rand(30)) {
                11_000_000
            } else {
                1 + rand(50)
            };
            steps.push(Step::Poll(wait));
        }
        if assigned == ranges.len() && lanes.iter().all(|l| l.is_empty()) {
            break;
        }
        if live.is_empty() && assigned == ranges.len() {
            // fragments of ranges far ahead: let them go
            for (ru, lane) in lanes.iter_mut().enumerate() {
                while let Some((_, h, size)) = lane.pop_front() {
                    steps.push(Step::Fragment(ru as u16, h, size));
                }
            }
        }
    }
    steps.push(Step::Sink(true));
    steps.push(Step::Poll(1));
    steps.push(Step::Stop);
    steps.push(Step::Sink(true));
    steps
}

/// A script's fragment with its payload (its CRC filled in where the script left it 0).
fn script_fragment(pool: &Pool, h: &FragmentHeader, size: usize) -> (FragmentHeader, Chain) {
    let mut w = pool.try_alloc().expect("the pool has room");
    let payload = vec![h.event_id as u8; size];
    let mut h = *h;
    if h.payload_crc == 0 {
        h.payload_crc = crc32c::crc32c(&payload);
    }
    (h, Chain::from_slice(w.append(&payload).unwrap()))
}

/// What a BU did with a script: the events its sink took, in order, their bytes, the ids
/// it released, in order, the credits it granted, and its counters (less the latencies'
/// values and the high-water mark, which the join counts differently).
fn run_bu_script(
    steps: &[Step],
    n_ru: u16,
    join: bool,
) -> (Vec<u64>, u64, Vec<u64>, u64, serde_json::Value) {
    let pool = Pool::new("script", 64, 4096);
    let mut b = Bu::new(BuConfig {
        verify: Verify::Crc,
        generator: None,
        slices: None,
        ..bu_cfg(0, n_ru, 1 << 20)
    });
    b.set_join(join);
    let t0 = Instant::now();
    let mut now = t0;
    b.handle(now, NodeRef::Evm, Message::Start);
    let mut sink = Taking::default();
    let (mut released, mut credits) = (Vec::new(), 0u64);
    let mut queue = VecDeque::new();
    for step in steps {
        now += Duration::from_micros(1);
        match step {
            Step::Assign(first, count) => b.handle(now, NodeRef::Evm, assign(0, *first, *count)),
            Step::Fragment(ru, h, size) => {
                let (h, c) = script_fragment(&pool, h, *size);
                b.handle_fragment(now, NodeRef::Ru(*ru), h, c);
            }
            Step::Page(ru, page) => {
                let page = page
                    .iter()
                    .map(|(h, size)| script_fragment(&pool, h, *size));
                b.handle_page(now, NodeRef::Ru(*ru), page.collect());
            }
            Step::Sink(takes) => {
                sink.refuse = !takes;
                let _ = b.deliver_spans(&mut sink);
                b.move_built(&mut queue);
                while let Some(e) = queue.front() {
                    if sink.deliver(e).is_err() {
                        break;
                    }
                    let e = queue.pop_front().unwrap();
                    b.delivered(e.event_id, e.bytes);
                    b.recycle(e.fragments);
                }
            }
            Step::Poll(us) => {
                now += Duration::from_micros(*us);
                b.poll(now);
            }
            Step::SourceLost(ru) => b.handle(now, NodeRef::Evm, Message::SourceLost { ru: *ru }),
            Step::Stop => b.handle(now, NodeRef::Evm, Message::Stop { triggered: 0 }),
        }
        // the EVM's side: every release echoed, every credit counted
        let mut echoes = Vec::new();
        while let Some(a) = b.next_action() {
            match a {
                Action::Send {
                    msg: Message::Release(r),
                    ..
                } => {
                    released.extend(r.first..r.end());
                    echoes.push(r);
                }
                Action::Send {
                    msg: Message::Credit { count, .. },
                    ..
                } => credits += count as u64,
                _ => {}
            }
        }
        for r in echoes {
            b.handle(now, NodeRef::Evm, Message::Release(r));
        }
    }
    let mut stats = serde_json::to_value(b.stats()).unwrap();
    let latencies = b.stats().latency.count;
    stats["latency"] = latencies.into();
    stats["in_flight_high_water"] = 0.into();
    (sink.ids, sink.bytes, released, credits, stats)
}

/// A BU that joins regular events and hands them on as spans gives exactly the output,
/// releases, credits and counters of one that makes a record of every event, over seeded
/// scripts with and without odd inputs (the join hands over to the records at the first
/// odd one, with events at the sink and fragments waiting).
#[test]
fn joined_and_recorded_bus_give_the_same_output() {
    let seed = env_seed("EVB_JOIN_SEED", 20_261_126);
    for trial in 0..200u64 {
        let n_ru = 1 + (trial % 3) as u16;
        let odd = trial % 4 != 0;
        let steps = bu_script(seed ^ trial.wrapping_mul(0x9e37_79b9), n_ru, odd);
        let joined = run_bu_script(&steps, n_ru, true);
        let recorded = run_bu_script(&steps, n_ru, false);
        let what = format!("seed {seed} trial {trial} ({n_ru} RUs, odd inputs: {odd})");
        assert_eq!(joined.0, recorded.0, "{what}: the events the sink took");
        assert_eq!(joined.1, recorded.1, "{what}: their bytes");
        assert_eq!(joined.2, recorded.2, "{what}: the releases");
        assert_eq!(joined.3, recorded.3, "{what}: the credits");
        assert_eq!(joined.4, recorded.4, "{what}: the counters");
        assert!(!recorded.0.is_empty(), "{what}: something was built");
    }
}

/// Building by time: an RU of the generator's frames makes each slice's window fragment,
/// and the BU builds it; a window fragment of another slice, one with a damaged frame
/// (its fragment CRC made right again), and a plain fragment are each counted as a window
/// error, and their record is flagged corrupt, never built as if it were good.
#[test]
fn bu_checks_every_slice_fragment_against_its_window() {
    use crate::frames::{FrameGenerator, Slicing};
    let frames = FrameGenerator::new(
        Generator::new(SizeModel::Fixed(40), 3),
        10,
        Slicing {
            slice: 100,
            overlap: 20,
            t0: 0,
        },
    );
    let slice_fragment = |id: u64| {
        let r = Ru::new(
            RuConfig {
                index: 0,
                source_id: 100,
                source: Source::Frames(frames.clone()),
                max_per_poll: 16,
                max_run_bytes: 4 * 1024,
            },
            Pool::new("ru", 64 * 1024, 4),
        );
        made_by(r, id)
    };
    let now = Instant::now();
    for verify in [Verify::Crc, Verify::Full] {
        let mut b = Bu::new(BuConfig {
            verify,
            slices: Some(frames.clone()),
            ..bu_cfg(0, 1, 8)
        });
        b.handle(now, NodeRef::Evm, Message::Start);
        b.handle(now, NodeRef::Evm, assign(0, 0, 5));
        let (h, p) = slice_fragment(0);
        assert_eq!(
            p.len(),
            32 + 12 * 8 + 12 * (24 + 40),
            "12 frames begin in [0, 120)"
        );
        b.handle_fragment(now, NodeRef::Ru(0), h, p);
        let built = drain_delivered(&mut b);
        assert_eq!((built.len(), built[0].corrupt), (1, false));
        assert!(b.stats().clean(), "{}", b.stats().errors_in_words());

        // slice 2's fragment sent as slice 1's
        let (h2, p2) = slice_fragment(2);
        b.handle_fragment(
            now,
            NodeRef::Ru(0),
            FragmentHeader { event_id: 1, ..h2 },
            p2,
        );
        // slice 2 with a frame's byte changed, the fragment CRC made to match
        let (h2, p2) = slice_fragment(2);
        let mut bytes = p2.to_vec();
        *bytes.last_mut().unwrap() ^= 1;
        let damaged = Chain::from_slice(
            Pool::new("x", 64 * 1024, 1)
                .try_alloc()
                .unwrap()
                .append(&bytes)
                .unwrap(),
        );
        let h2 = FragmentHeader {
            payload_crc: damaged.crc32c(),
            ..h2
        };
        b.handle_fragment(now, NodeRef::Ru(0), h2, damaged);
        // slice 3 as a plain fragment
        let (h3, p3) = slice_fragment(3);
        let plain = FragmentHeader {
            flags: evb_wire::FLAG_GENERATED,
            ..h3
        };
        b.handle_fragment(now, NodeRef::Ru(0), plain, p3);
        let built = drain_delivered(&mut b);
        assert_eq!(built.len(), 3);
        assert!(built.iter().all(|e| e.corrupt), "all three flagged");
        let s = b.stats();
        match verify {
            // the bytes are checked first: two are other bytes than their slice's, and the
            // plain one has the right bytes but is no window fragment
            Verify::Full => assert_eq!((s.content_errors, s.window_errors), (2, 1)),
            _ => assert_eq!((s.content_errors, s.window_errors), (0, 3)),
        }
        assert!(!s.clean());
    }
}

/// Static frames of one size go out by reference to the template: the fragment the RU sends
/// is, byte for byte, the window fragment the generator describes, its CRC the composed one,
/// and its payloads pieces of the template (not copies).
#[test]
fn static_frames_are_sent_by_reference_and_are_the_window_fragment() {
    use crate::frames::{FrameGenerator, Slicing};
    let frames = FrameGenerator::new(
        Generator::new(SizeModel::Fixed(5000), 3).with_content(Content::Static),
        10,
        Slicing {
            slice: 100,
            overlap: 20,
            t0: 0,
        },
    );
    let mut r = Ru::new(
        RuConfig {
            index: 0,
            source_id: 100,
            source: Source::Frames(frames.clone()),
            max_per_poll: 16,
            max_run_bytes: 1 << 20,
        },
        Pool::new("ru", 64 * 1024, 16),
    );
    r.handle(Instant::now(), NodeRef::Evm, Message::Start);
    r.handle(Instant::now(), NodeRef::Evm, assign(0, 0, 2));
    r.poll(Instant::now());
    let mut got = Vec::new();
    while let Some(a) = r.next_action() {
        if let Action::SendFragments { data, .. } = a {
            assert!(data.slices().len() > 12, "payloads referenced, not copied");
            got.extend(decode_fragments(&data));
        }
    }
    assert_eq!(got.len(), 2);
    for (k, (h, p)) in got.iter().enumerate() {
        let mut want = vec![0; frames.spec(k as u64, 100).size];
        frames.fill(k as u64, 100, 0, &mut want);
        assert!(p.eq_bytes(&want), "record {k}");
        assert_eq!(h.payload_crc, crc32c::crc32c(&want));
        assert!(evb_wire::window::decode_window(&want).is_ok());
    }
}

/// Issue 69 item 4: a run ends in stages, each said with when it was reached, in order:
/// triggers stopped, drained (Stop goes out), sources stopped (every report in).
#[test]
fn a_run_ends_in_stages_each_with_its_time() {
    let mut s = Sim::new(2, 2, 500, 8, 0);
    s.run(100_000);
    assert_clean_run(&s, 500);
    let st = s.evm.stats();
    let stages: Vec<StopStage> = st.stop_stages.iter().map(|s| s.stage).collect();
    assert_eq!(
        stages,
        [
            StopStage::TriggersStopped,
            StopStage::Drained,
            StopStage::SourcesStopped
        ]
    );
    assert!(
        st.stop_stages.windows(2).all(|w| w[0].at_s <= w[1].at_s),
        "{:?}",
        st.stop_stages
    );
    assert_eq!(st.stop_stage(), Some(StopStage::SourcesStopped));
    // the report carries them: the run record shows each stage
    let json = serde_json::to_value(st).unwrap();
    assert_eq!(json["stop_stages"][1]["stage"], "drained");
}

/// Each stage has a limit (`run.stall_timeout_ms` without progress): a drain that makes no
/// progress, and a node silent after Stop, abort the run naming the stage not reached (and
/// the silent nodes).
#[test]
fn a_stop_stage_not_reached_in_time_is_named() {
    let t0 = Instant::now();
    let mut cfg = evm_cfg(1, 1, 5);
    cfg.stall_timeout = Duration::from_millis(100);
    let start = |cfg: EvmConfig| {
        let mut evm = Evm::new(cfg, t0);
        for from in [NodeRef::Ru(0), NodeRef::Bu(0)] {
            let ready = Message::Ready {
                available: evb_wire::UNLIMITED,
            };
            evm.handle(t0, from, ready);
        }
        evm.handle(t0, NodeRef::Bu(0), Message::Credit { bu: 0, count: 10 });
        // the count is reached at the first poll, and said at the next
        evm.poll(t0);
        evm.poll(t0);
        evm
    };
    let at = |ms| t0 + Duration::from_millis(ms);
    // five events triggered, none ever released
    let mut evm = start(cfg.clone());
    assert_eq!(evm.stats().triggered, 5);
    assert_eq!(evm.stats().stop_stage(), Some(StopStage::TriggersStopped));
    evm.poll(at(150));
    assert_eq!(evm.state(), RunState::Aborted);
    let why = evm.report(at(150)).reason.unwrap_or_default();
    assert!(
        why.starts_with("the stop's stage \"drained\" not reached: stalled: 5 events in flight"),
        "{why}"
    );
    // released, then no report comes after Stop
    let mut evm = start(cfg);
    let release = Message::Release(EventRange {
        bu: 0,
        first: 0,
        count: 5,
    });
    evm.handle(at(10), NodeRef::Bu(0), release);
    evm.poll(at(10));
    assert_eq!(evm.state(), RunState::Stopping);
    assert_eq!(evm.stats().stop_stage(), Some(StopStage::Drained));
    evm.poll(at(200));
    assert_eq!(evm.state(), RunState::Aborted);
    let why = evm.report(at(200)).reason.unwrap_or_default();
    assert!(
        why.starts_with(
            "the stop's stage \"sources stopped\" not reached: no report after Stop from ru[0], bu[0]"
        ),
        "{why}"
    );
}

/// Issue 69 item 2: a BU retired mid-run is given no more events; once all it holds is
/// final it is told Stop, reports, is told Halt and leaves; every event is built exactly
/// once, its share in the run's report. With sinks that commit, it leaves only once its
/// parts are committed and published. Killed while retiring, it is a lost BU like any.
#[test]
fn a_retired_bu_leaves_with_its_share_and_every_event_is_built_once() {
    // discard-like sinks
    let mut s = Sim::new(2, 3, 3000, 6, 0);
    s.steps(60);
    assert!(
        s.evm.stats().released > 0 && s.evm.stats().triggered < 3000,
        "mid-run"
    );
    s.evm.retire(s.now, 1).unwrap();
    assert!(s
        .evm
        .retire(s.now, 1)
        .unwrap_err()
        .contains("retiring already"));
    let share_then = s.sinks[1].events;
    // once it has left, the same BU started again (a new process) is told it retired from
    // this run, not taken back: its report stands for the run
    let left = |s: &Sim| {
        s.evm
            .stats()
            .lost
            .iter()
            .any(|e| e.kind == NodeEventKind::Retired)
    };
    for _ in 0..100_000 {
        if left(&s) {
            break;
        }
        s.steps(1);
    }
    assert!(left(&s), "bu[1] never left");
    while s.evm.next_action().is_some() {}
    let ready = Message::Ready {
        available: evb_wire::UNLIMITED,
    };
    s.evm.handle(s.now, NodeRef::Bu(1), ready);
    match s.evm.next_action() {
        Some(Action::Send {
            to: NodeRef::Bu(1),
            msg: Message::Abort(why),
            ..
        }) => assert!(why.contains("retired from this run"), "{why}"),
        other => panic!("{other:?}"),
    }
    s.run(400_000);
    assert_clean_run(&s, 3000);
    let st = s.evm.stats();
    let kinds: Vec<(String, NodeEventKind)> =
        st.lost.iter().map(|e| (e.node.clone(), e.kind)).collect();
    assert_eq!(
        kinds,
        [
            ("bu[1]".to_string(), NodeEventKind::Retiring),
            ("bu[1]".to_string(), NodeEventKind::Retired)
        ]
    );
    assert_eq!(st.losses(), 0, "a retirement is no loss");
    // what it built after the word was only what it held then
    let r = s.evm.report(s.now);
    let bu1 = r.bus[1].as_ref().expect("its report is the run's");
    assert_eq!(bu1.events_built, s.sinks[1].events);
    assert!(s.sinks[1].events >= share_then);
    assert!(
        s.sinks[1].events < 1500,
        "bu[1] took {} of 3000 after it retired",
        s.sinks[1].events
    );
    assert_eq!(st.released_by_bu[1], s.sinks[1].events);

    // the last BU left cannot retire, nor one that is not running
    let mut s = Sim::new(1, 2, 500, 6, 0);
    s.steps(20);
    s.evm.retire(s.now, 0).unwrap();
    assert!(s.evm.retire(s.now, 1).unwrap_err().contains("last BU"));
    s.run(200_000);
    assert_clean_run(&s, 500);
    assert!(s.evm.retire(s.now, 1).unwrap_err().contains("running"));
}

#[test]
fn a_retiring_committing_bu_leaves_once_its_parts_are_published() {
    let mut s = Sim::new(2, 3, 3000, 6, 0);
    s.commit_every = Some(20);
    let commits = EvmConfig {
        commits: vec![true; 3],
        ..evm_cfg(2, 3, 3000)
    };
    s.evm = Evm::new(commits, s.now);
    s.steps(80);
    s.evm.retire(s.now, 2).unwrap();
    s.run(400_000);
    for (who, ok, why) in &s.exits {
        assert!(ok, "{who}: {why}");
    }
    let r = s.evm.report(s.now);
    assert!(verdict(&r).is_empty(), "{:?}", verdict(&r));
    let mut all: Vec<u64> = s.published.iter().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..3000).collect::<Vec<_>>(),
        "every event in one part"
    );
    assert!(s
        .evm
        .stats()
        .lost
        .iter()
        .any(|e| e.kind == NodeEventKind::Retired && e.node == "bu[2]"));
}

#[test]
fn a_bu_killed_while_retiring_is_a_lost_bu() {
    let mut s = Sim::new(2, 3, 3000, 6, 0);
    s.steps(60);
    s.evm.retire(s.now, 0).unwrap();
    s.steps(1);
    s.kill(NodeRef::Bu(0));
    s.run(400_000);
    for (who, ok, why) in &s.exits {
        assert!(ok, "{who}: {why}");
    }
    let r = s.evm.report(s.now);
    assert!(verdict(&r).is_empty(), "{:?}", verdict(&r));
    let st = s.evm.stats();
    assert_eq!(st.losses(), 1);
    assert!(!st.lost.iter().any(|e| e.kind == NodeEventKind::Retired));
    let mut all: Vec<u64> = s.sinks.iter().flat_map(|k| k.ids.iter().copied()).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 3000, "every event built");
}

/// Two faults at once: a BU retiring, and every other BU lost before it is told Stop. It
/// builds on (its retirement called off; its credits were kept, not dropped), and the run
/// ends clean, every event once.
#[test]
fn a_retirement_is_called_off_when_every_other_bu_is_lost() {
    let mut s = Sim::new(2, 2, 2000, 6, 0);
    s.steps(40);
    s.evm.retire(s.now, 0).unwrap();
    s.kill(NodeRef::Bu(1));
    s.run(400_000);
    for (who, ok, why) in &s.exits {
        assert!(ok, "{who}: {why}");
    }
    let r = s.evm.report(s.now);
    assert!(verdict(&r).is_empty(), "{:?}", verdict(&r));
    let kinds: Vec<NodeEventKind> = s.evm.stats().lost.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            NodeEventKind::Retiring,
            NodeEventKind::Lost,
            NodeEventKind::RetireCalledOff
        ]
    );
    let mut all: Vec<u64> = s.sinks.iter().flat_map(|k| k.ids.iter().copied()).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 2000, "every event built");
}

/// Issue 69 item 1: the run starts without its spare BUs; a spare that says Ready while the
/// run is on joins it (a node event `joined`), is given events from then on, and every
/// event is built exactly once. A spare that never joins takes no part: not down, not
/// waited for, no report expected, and the verdict is clean.
#[test]
fn a_spare_bu_joins_the_run_under_way_and_every_event_is_built_once() {
    let mut s = Sim::new(2, 4, 3000, 6, 0);
    let cfg = EvmConfig {
        spares: vec![false, false, true, true],
        ..evm_cfg(2, 4, 3000)
    };
    s.evm = Evm::new(cfg, s.now);
    // the spares' processes are not started: nothing leaves them
    s.dead.extend([NodeRef::Bu(2), NodeRef::Bu(3)]);
    s.steps(60);
    let st = s.evm.stats();
    assert!(
        st.released > 0 && st.triggered < 3000,
        "the run started without its spares: {st:?}"
    );
    assert_eq!(st.spares_out, ["bu[2]", "bu[3]"]);
    assert!(st.down.is_empty(), "a spare out is not down: {:?}", st.down);
    // bu2's process starts: a new BU, connected, says Ready
    let mut b = Bu::new(bu_cfg(2, 2, 6));
    b.set_join(CountingSink::default().takes_spans());
    b.connections_up();
    s.bus[2] = b;
    s.dead.retain(|n| *n != NodeRef::Bu(2));
    s.run(400_000);
    assert_clean_run(&s, 3000);
    let r = s.evm.report(s.now);
    assert!(r.verdict().is_empty(), "{:?}", r.verdict());
    assert!(r.every_bu_reported());
    assert_eq!(r.evm.spares_out, ["bu[3]"]);
    assert!(r.down.is_empty(), "{:?}", r.down);
    let kinds: Vec<(String, NodeEventKind)> = r
        .evm
        .lost
        .iter()
        .map(|e| (e.node.clone(), e.kind))
        .collect();
    assert_eq!(kinds, [("bu[2]".to_string(), NodeEventKind::Joined)]);
    assert_eq!(r.evm.losses(), 0, "a join is no loss");
    assert!(r.evm.lost[0].at_s > 0.0);
    assert_eq!(
        r.evm.lost[0].to_string()[..15].to_string(),
        "bu[2] joined at"
    );
    // the spare built its share, counted once: its sink, its report and the ledger agree
    let bu2 = r.bus[2].as_ref().expect("the joined spare reports");
    assert!(bu2.events_built > 0, "bu[2] was given no events");
    assert_eq!(bu2.events_built, s.sinks[2].events);
    assert_eq!(r.evm.released_by_bu[2], s.sinks[2].events);
    assert!(r.bus[3].is_none());
    let ids: std::collections::HashSet<u64> = (0..3)
        .flat_map(|b| s.sinks[b].ids.iter().copied())
        .collect();
    assert_eq!(ids.len(), 3000, "every event once");
}

/// After a takeover, a BU lost and started again is `rejoined`, never `joined`: the
/// standby's EVM saw no BU's Ready before it took over, and only a spare's first Ready is a
/// join (found by `chaos::a_bu_restarted_after_a_takeover_rejoins_at_the_standby`).
#[test]
fn after_a_takeover_a_restarted_bu_rejoins_and_does_not_join() {
    let mut s = Sim::new(1, 2, 1000, 6, 0);
    for r in &mut s.rus {
        r.set_standby(true);
    }
    for b in &mut s.bus {
        b.set_standby(true);
    }
    let start = s.now;
    s.steps(40);
    assert_eq!(s.evm.state(), RunState::Running);
    s.pass_killing_the_evm_after(0);
    let elapsed = s.now - start;
    s.take_over(evm_cfg(1, 2, 1000), elapsed, Vec::new());
    s.kill(NodeRef::Bu(1));
    let ready = Message::Ready {
        available: evb_wire::UNLIMITED,
    };
    s.evm.handle(s.now, NodeRef::Bu(1), ready);
    let st = s.evm.stats();
    let last = st.lost.last().expect("node events");
    assert_eq!(
        (last.node.as_str(), last.kind),
        ("bu[1]", NodeEventKind::Rejoined),
        "{:?}",
        st.lost
    );
    assert!(st.spares_out.is_empty(), "{:?}", st.spares_out);
}

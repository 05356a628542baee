//! A standby EVM taking a run over (docs/standby.md): the run's state is rebuilt from what
//! the nodes hold, not from a copy of the old EVM's ledger.
//!
//! The rules, each from how the protocol moves an event along:
//! - an event is *final* when a BU says so (it released it to a sink that does not commit,
//!   or its part was committed), or when an RU that was assigned it no longer holds it (the
//!   EVM forwards a Release to the RUs only for final events), or when no node mentions it;
//! - an event not final belongs to the live BU that claims it (the most advanced claim wins:
//!   released or accepted, then building, then fragments only); with no claim, to the BU
//!   the RUs' fragments went to, if it is live; otherwise it is an orphan, built again
//!   elsewhere as a lost BU's events are;
//! - every RU gets, in id order, the assignments it missed; a BU the assignment of an event
//!   it owns and did not get; the RUs that still hold a final event, its Release.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use evb_wire::{EventRange, Message};

use super::{Evm, EvmConfig};
use crate::action::{Action, NodeRef, Path, RunState};
use crate::ledger::Ledger;
use crate::report::{id_sum, NodeEvent, NodeEventKind};

pub use evb_wire::resync::{BuResync, RuResync};

/// What the standby knew before it took over.
#[derive(Debug, Clone, Default)]
pub struct Takeover {
    /// The new EVM's epoch (the old one's plus one).
    pub epoch: u16,
    /// How long the run had been triggering (pauses left out): `run.duration_s` goes on.
    pub elapsed: Duration,
    /// Nodes the old EVM had dropped from the run (it tells the standby before it acts):
    /// whatever they say is not heard.
    pub dropped: Vec<NodeRef>,
    /// Why the old EVM is gone, in words.
    pub reason: String,
    /// The operator had asked the run to stop.
    pub stop_requested: bool,
    /// The most events the old EVM would have triggered (it learns a recording's length
    /// from the RUs' Ready); `None`: no such limit.
    pub max_events: Option<u64>,
    /// The RUs are fed live (front-end streams, a producer): the new EVM assigns no event
    /// past those already assigned until each RU announces what it holds again (`Available`,
    /// which the RUs send after their resync).
    pub live_fed: bool,
    /// The incarnation of each BU that called the new EVM (its Hello), by BU index;
    /// shorter, or 0: none known.
    pub incarnations: Vec<u16>,
}

/// How far a BU's claim on an event went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Claim {
    Fragments,
    Building,
    /// Released, echo not heard.
    Unacked,
    /// A committing sink: accepted, not in a part.
    Accepted,
    /// A committing sink: in a part sent as Commit.
    Part(u32),
}

impl Claim {
    fn rank(self) -> u8 {
        match self {
            Claim::Fragments => 0,
            Claim::Building => 1,
            _ => 2,
        }
    }
}

#[derive(Debug, Default)]
struct Seen {
    /// A BU said it is output.
    said_final: bool,
    claims: Vec<(u16, Claim)>,
    /// RUs that hold it (or have it to make), with the BU they send it to.
    holders: Vec<(u16, u16)>,
}

fn ids(ranges: &[EventRange]) -> impl Iterator<Item = u64> + '_ {
    ranges.iter().flat_map(|r| r.first..r.end())
}

/// Appends `id` to `ranges` for BU `bu`, growing the last range when it follows.
fn push(ranges: &mut Vec<EventRange>, bu: u16, id: u64) {
    match ranges.last_mut() {
        Some(l) if l.bu == bu && l.end() == id && l.count < u32::MAX => l.count += 1,
        _ => ranges.push(EventRange {
            bu,
            first: id,
            count: 1,
        }),
    }
}

impl Evm {
    /// A new EVM for a run already going: its state rebuilt from the nodes' resyncs (a node
    /// that sent none is lost, as at a heartbeat timeout), and the messages that put every
    /// node back in step queued as actions. See the module's rules.
    pub fn take_over(
        cfg: EvmConfig,
        now: Instant,
        t: Takeover,
        rus: Vec<RuResync>,
        bus: Vec<BuResync>,
    ) -> Evm {
        let mut cfg = cfg;
        if let Some(m) = t.max_events {
            cfg.max_events = Some(cfg.max_events.map_or(m, |c| c.min(m)));
        }
        let mut evm = Evm::new(cfg, now);
        for (bu, &inc) in t.incarnations.iter().enumerate() {
            evm.set_incarnation(bu as u16, inc);
        }
        let dropped: HashSet<NodeRef> = t.dropped.iter().copied().collect();
        let n_ru = evm.cfg.n_ru;
        let n_bu = evm.cfg.n_bu;
        let mut rus_in: BTreeMap<u16, RuResync> = BTreeMap::new();
        for r in rus {
            if r.ru < n_ru && !dropped.contains(&NodeRef::Ru(r.ru)) {
                rus_in.entry(r.ru).or_insert(r);
            }
        }
        let mut bus_in: BTreeMap<u16, BuResync> = BTreeMap::new();
        for b in bus {
            if b.bu < n_bu && !dropped.contains(&NodeRef::Bu(b.bu)) {
                bus_in.entry(b.bu).or_insert(b);
            }
        }
        evm.state = RunState::Running;
        evm.started = Some(now.checked_sub(t.elapsed).unwrap_or(now));
        evm.last_progress = now;
        evm.first_credits = None;
        // the old EVM had stopped triggering (the run's end, or the operator's stop)
        evm.triggering_done = t.stop_requested
            || rus_in.values().any(|r| r.stopping)
            || bus_in.values().any(|b| b.stopping);
        evm.stats.stopped_by_request = t.stop_requested;
        evm.stats.epoch = t.epoch;
        evm.stats.lost.push(NodeEvent::new(
            NodeRef::Evm,
            t.elapsed.as_secs_f64(),
            NodeEventKind::Lost,
            format!("{}; standby took over, epoch {}", t.reason, t.epoch),
        ));
        // the ledger carries what the EVM before saw: a node it lost (and handled by its
        // rule) is lost in this run's report too, so that no reader charges its exit
        let mut carried: Vec<NodeRef> = t.dropped.clone();
        carried.sort();
        carried.dedup();
        for n in carried.into_iter().filter(|n| *n != NodeRef::Evm) {
            evm.stats.lost.push(NodeEvent::new(
                n,
                t.elapsed.as_secs_f64(),
                NodeEventKind::Lost,
                format!(
                    "lost under the EVM of epoch {} (carried over by the takeover)",
                    t.epoch.saturating_sub(1)
                ),
            ));
        }

        // What every node says of every event it knows.
        let mut seen: BTreeMap<u64, Seen> = BTreeMap::new();
        let mut end = 0u64;
        for r in rus_in.values() {
            end = end.max(r.known_until);
            for h in &r.holds {
                end = end.max(h.end());
                for id in h.first..h.end() {
                    seen.entry(id).or_default().holders.push((r.ru, h.bu));
                }
            }
        }
        for b in bus_in.values() {
            let commits = evm.commits(b.bu);
            let mut claim = |ranges: &[EventRange], c: Claim, end: &mut u64| {
                for r in ranges {
                    *end = (*end).max(r.end());
                }
                for id in ids(ranges) {
                    seen.entry(id).or_default().claims.push((b.bu, c));
                }
            };
            claim(&b.unassigned, Claim::Fragments, &mut end);
            claim(&b.building, Claim::Building, &mut end);
            if commits {
                claim(&b.unacked, Claim::Unacked, &mut end);
                claim(&b.accepted, Claim::Accepted, &mut end);
                for (part, ranges) in &b.parts {
                    claim(ranges, Claim::Part(*part), &mut end);
                }
            }
            let finals = if commits { &b.committed } else { &b.recent };
            for id in ids(finals) {
                end = end.max(id + 1);
                seen.entry(id).or_default().said_final = true;
            }
        }
        // An RU assigned an event (below its known_until) that holds it no more was told
        // to forget it: the event is final.
        let released_by_an_ru = |id: u64, s: &Seen| {
            rus_in
                .values()
                .any(|r| id < r.known_until && !s.holders.iter().any(|(h, _)| *h == r.ru))
        };
        let is_final = |id: u64, s: &Seen| s.said_final || released_by_an_ru(id, s);

        // Two live BUs claiming one event: one has a stale view (the old EVM dropped it and
        // died before the standby heard). The most advanced claim keeps the event (the
        // lower index on a tie); the other BU leaves the run.
        let mut conflicted: HashSet<u16> = HashSet::new();
        for (&id, s) in &seen {
            if s.claims.len() < 2
                && !(is_final(id, s) && s.claims.iter().any(|c| c.1 < Claim::Unacked))
            {
                continue;
            }
            if is_final(id, s) {
                // a BU still building a final event was given it again by the old EVM after
                // it dropped the BU that made it output: keep the output, drop the builder
                for (b, c) in &s.claims {
                    if *c < Claim::Unacked {
                        conflicted.insert(*b);
                    }
                }
                continue;
            }
            let best = s
                .claims
                .iter()
                .max_by_key(|(b, c)| (c.rank(), std::cmp::Reverse(*b)))
                .map(|(b, _)| *b);
            for (b, _) in &s.claims {
                if Some(*b) != best {
                    conflicted.insert(*b);
                }
            }
        }
        for b in &conflicted {
            bus_in.remove(b);
        }
        for s in seen.values_mut() {
            s.claims.retain(|(b, _)| !conflicted.contains(b));
        }
        for r in rus_in.values() {
            evm.alive.insert(NodeRef::Ru(r.ru));
            if t.live_fed {
                // every event assigned so far was announced by every RU: a floor it raises
                if let Some(a) = evm.available.get_mut(r.ru as usize) {
                    *a = Some(end);
                }
            }
        }
        for b in bus_in.values() {
            evm.alive.insert(NodeRef::Bu(b.bu));
        }

        // Each event's fate.
        let live_bu = |b: u16| bus_in.contains_key(&b);
        let mut owner: BTreeMap<u64, (u16, Option<Claim>)> = BTreeMap::new();
        let mut orphans: Vec<u64> = Vec::new();
        let mut fallback = 0usize;
        let live: Vec<u16> = bus_in.keys().copied().collect();
        for (&id, s) in &seen {
            if id >= end || is_final(id, s) {
                continue;
            }
            let claim = s
                .claims
                .iter()
                .max_by_key(|(b, c)| (c.rank(), std::cmp::Reverse(*b)))
                .copied();
            let (bu, c) = match claim {
                Some((b, c)) => (b, Some(c)),
                None => match s.holders.first() {
                    Some(&(_, dest)) => (dest, None),
                    None => {
                        // no node holds or claims it and none released it: only an
                        // assignment no one received can leave this; give it to a live BU
                        let Some(&b) = live.get(fallback % live.len().max(1)) else {
                            continue;
                        };
                        fallback += 1;
                        (b, None)
                    }
                },
            };
            if !live_bu(bu) {
                orphans.push(id);
            }
            owner.insert(id, (bu, c));
        }

        // The ledger: a window from the oldest event not final.
        let base = owner.keys().next().copied().unwrap_or(end);
        let mut window: Vec<Option<(u16, bool)>> = Vec::new();
        for id in base..end {
            match owner.get(&id) {
                Some(&(bu, c)) => {
                    let accepted =
                        matches!(c, Some(Claim::Accepted | Claim::Part(_) | Claim::Unacked))
                            && live_bu(bu)
                            && evm.commits(bu);
                    // a committing BU's unacked events are accepted once echoed, below
                    window.push(Some((bu, accepted && c != Some(Claim::Unacked))));
                }
                None => window.push(None),
            }
        }
        evm.ledger = Ledger::rebuilt(base, &window);
        let in_flight = owner.len() as u64;
        evm.stats.triggered = end;
        evm.stats.released = end - in_flight;
        let open_sum = owner.keys().fold(0u64, |a, id| a.wrapping_add(*id));
        let final_sum = id_sum(end).wrapping_sub(open_sum);
        let (mut live_n, mut live_sum) = (0u64, 0u64);
        for b in bus_in.values() {
            let (mut n, mut sum) = (b.built, b.built_id_sum);
            if evm.commits(b.bu) {
                // echoed and not final: counted when committed (ids of a part the old EVM
                // committed and forwarded are final, and stay counted)
                let parts = b.parts.iter().flat_map(|(_, r)| ids(r));
                for id in ids(&b.accepted)
                    .chain(parts)
                    .filter(|id| owner.contains_key(id))
                {
                    n = n.saturating_sub(1);
                    sum = sum.wrapping_sub(id);
                }
            } else {
                // released, echo not heard: final, and echoed below
                for id in ids(&b.unacked) {
                    n += 1;
                    sum = sum.wrapping_add(id);
                }
            }
            evm.stats.released_by_bu[b.bu as usize] = n;
            evm.stats.released_id_sum_by_bu[b.bu as usize] = sum;
            live_n += n;
            live_sum = live_sum.wrapping_add(sum);
        }
        evm.stats.released_by_lost = evm.stats.released.saturating_sub(live_n);
        evm.stats.released_id_sum_by_lost = final_sum.wrapping_sub(live_sum);

        // Put the nodes back in step. RUs first: what they missed, in id order.
        for r in rus_in.values() {
            let mut assigns: Vec<EventRange> = Vec::new();
            for (&id, &(bu, _)) in owner.range(r.known_until..) {
                push(&mut assigns, bu, id);
            }
            // held for a BU that is not the owner (a reassignment it missed): send again
            for h in &r.holds {
                for id in h.first..h.end() {
                    if let Some(&(bu, _)) = owner.get(&id) {
                        if bu != h.bu && live_bu(bu) {
                            push(&mut assigns, bu, id);
                        }
                    }
                }
            }
            let mut releases: Vec<EventRange> = Vec::new();
            for h in &r.holds {
                for id in h.first..h.end() {
                    if !owner.contains_key(&id) {
                        push(&mut releases, 0, id);
                    }
                }
            }
            let to = NodeRef::Ru(r.ru);
            for a in assigns {
                // an orphan's Assign names its lost BU: no incarnation, so the RU makes
                // and holds the fragments for the reassignment that follows
                let inc = if live_bu(a.bu) {
                    evm.incarnation(a.bu)
                } else {
                    0
                };
                evm.send_to(vec![to], Message::Assign(a, inc), Path::Batched);
            }
            for rel in releases {
                evm.send_to(vec![to], Message::Release(rel), Path::Batched);
            }
        }
        // BUs: the assignments of events they own and did not get, their credits, the
        // echoes they wait for, and the parts they asked to commit.
        for b in bus_in.values() {
            let to = NodeRef::Bu(b.bu);
            let mut assigns: Vec<EventRange> = Vec::new();
            for (&id, &(bu, c)) in &owner {
                if bu == b.bu && matches!(c, None | Some(Claim::Fragments)) {
                    push(&mut assigns, bu, id);
                }
            }
            let given: u64 = assigns.iter().map(|a| a.count as u64).sum();
            evm.credits[b.bu as usize] = (b.free_credits as u64).saturating_sub(given);
            for a in assigns {
                let inc = evm.incarnation(a.bu);
                evm.send_to(vec![to], Message::Assign(a, inc), Path::Batched);
            }
            if evm.commits(b.bu) {
                let mut accepted = 0;
                for r in &b.unacked {
                    evm.ledger.accept(*r);
                    accepted += r.count as u64;
                    evm.send_to(vec![to], Message::Release(*r), Path::Batched);
                }
                evm.stats.accepted += accepted;
                for (part, ranges) in &b.parts {
                    // a commit is one step at the EVM: one event of the part final means
                    // the old EVM committed all of it (its Releases reached some RUs, its
                    // answer not the BU); the rest is committed now, and answered
                    let mut open: Vec<EventRange> = Vec::new();
                    for id in ids(ranges) {
                        if owner.contains_key(&id) {
                            push(&mut open, b.bu, id);
                        }
                    }
                    let events: u64 = ranges.iter().map(|r| r.count as u64).sum();
                    evm.commit(now, b.bu, *part, &open);
                    if let Some(last) = evm.unpublished[b.bu as usize].last_mut() {
                        last.1 = events;
                    }
                }
            } else {
                for r in &b.unacked {
                    evm.send_to(vec![to], Message::Release(*r), Path::Batched);
                }
            }
        }
        evm.stats.reassigned += orphans.len() as u64;
        evm.reassign.extend(orphans);
        let at = t.elapsed.as_secs_f64();
        for b in conflicted {
            let node = NodeRef::Bu(b);
            let why = "its view of the run disagreed with the other BUs' at the takeover";
            evm.stats
                .lost
                .push(NodeEvent::new(node, at, NodeEventKind::Lost, why));
            evm.actions.push_back(Action::Disconnect(node));
        }
        // Nodes that did not answer the new EVM are lost, by the usual rules.
        for i in 0..n_ru {
            let n = NodeRef::Ru(i);
            if !rus_in.contains_key(&i) && !dropped.contains(&n) {
                evm.alive.insert(n);
                evm.peer_lost(now, n, "no answer to the new EVM");
            }
        }
        for i in 0..n_bu {
            let n = NodeRef::Bu(i);
            if !bus_in.contains_key(&i)
                && !dropped.contains(&n)
                && !evm
                    .stats
                    .lost
                    .iter()
                    .any(|e| e.is_about(n) && e.kind.is_loss())
            {
                evm.stats.lost.push(NodeEvent::new(
                    n,
                    at,
                    NodeEventKind::Lost,
                    "no answer to the new EVM",
                ));
            }
        }
        if evm.live_bus().is_empty() {
            evm.abort("no BU answered the new EVM".into());
        }
        evm
    }
}

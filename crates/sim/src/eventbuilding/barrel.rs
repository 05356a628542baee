//! The barrel shifter on one lossless switch, a fragment at a time.
//!
//! In slot t RU i sends to BU (i + t) mod the cycle, so no two cells meet at a port and
//! every cell is delivered in the slot it is sent: the pair (RU i, BU b) owns one phase of
//! the cycle and sends one cell in each of its slots while it has data for b. A fragment of
//! c cells that the pair may start at slot s therefore takes the pair's first slot at or
//! after s and its next c − 1 slots, one cycle apart. Nothing waits on anything else but
//! the pair's previous fragment and the event's assignment, so an event's completion is
//! known when it is assigned: the run steps from one completion to the next, at a cost per
//! fragment and not per cell or slot. [`EbModel::run_slotted`] is its oracle: with fixed
//! sizes both give the same slots, figures and latencies.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::*;

/// `events: 0`'s most events measured here, in events in flight: the barrel's p99 latency
/// is up to three times its median, so ten batches of twice it need up to about 50 times
/// the events in flight (Little's law), and a fragment costs a few steps, not its cells.
pub const AUTO_SPANS_BARREL: u64 = 64;

/// Which slots of the cycle a pair owns: the `phase`-th of every `cycle`.
#[derive(Clone, Copy)]
struct Phase {
    phase: u64,
    cycle: u64,
}

impl Phase {
    /// The pair's slots before slot `x`.
    fn before(self, x: u64) -> u64 {
        (x + self.cycle - 1 - self.phase) / self.cycle
    }

    /// The pair's first slot at or after `x`.
    fn first_from(self, x: u64) -> u64 {
        self.phase + self.before(x) * self.cycle
    }
}

impl EbModel {
    /// [`Shaping::Barrel`] on one lossless switch ([`EbModel::run`] takes it there): an
    /// event's fragments are placed in their pairs' slots when it is assigned, and the run
    /// jumps to the next slot an event completes in.
    pub fn run_barrel(&self) -> EbOutcome {
        let (n, m) = (self.rus.max(1), self.bus.max(1));
        let mut rng = SmallRng::seed_from_u64(self.seed);
        let law = SizeLaw::new(self.mean_cells, self.sd_cells);
        let folded = self.folded && n == m && n >= 2;
        // folded, host k's own BU is skipped: RU i serves BU (i + p + 1) mod N in phase p
        let cycle = if folded { n - 1 } else { n.max(m) };
        let phase = |i: usize, b: usize| Phase {
            phase: if folded {
                (b + n - i - 1) % n
            } else {
                (b + cycle - i) % cycle
            } as u64,
            cycle: cycle as u64,
        };
        let mut tally = Tally::new(self, m, self.in_flight(m) * AUTO_SPANS_BARREL);
        let mut evm = Evm::new(self.assignment, m, self.credits);
        // per BU and RU: the slot after the pair's last cell given
        let mut free = vec![0u64; m * n];
        // per BU: the cells given to its pairs
        let mut given = vec![0u64; m];
        // the cells sent per slot, as differences a cycle apart: a fragment adds one from
        // its first slot to the slot after its last, a cycle apart
        let mut diff: Vec<i32> = Vec::new();
        // the events in flight: (slot of their last cell, BU, slot assigned), earliest first
        let mut done: BinaryHeap<Reverse<(u64, usize, u64)>> = BinaryHeap::new();
        // per BU, its cells delivered before the measured slots
        let mut at_start: Option<Vec<u64>> = None;
        // per BU, its cells delivered before slot `x`, once every event assigned before `x`
        // is placed and none is yet at `x`: a pair's slots from `x` to its last are all
        // taken (any gap in them is before `x`, before its event was assigned)
        let delivered_before = |x: u64, free: &[u64], given: &[u64]| -> Vec<u64> {
            (0..m)
                .map(|b| {
                    let ahead: u64 = (0..n)
                        .filter(|&i| !(folded && i == b))
                        .map(|i| {
                            let (f, p) = (free[b * n + i], phase(i, b));
                            p.before(f).saturating_sub(p.before(x))
                        })
                        .sum();
                    given[b] - ahead
                })
                .collect()
        };
        let mut t = 0u64;
        while tally.go_on(t) {
            if tally.start.is_some() && at_start.is_none() {
                at_start = Some(delivered_before(t, &free, &given));
            }
            // the EVM assigns while BUs have credits: each fragment takes its pair's slots
            while let Some(b) = evm.assign(&mut rng) {
                let mut last_of_event = t;
                for i in 0..n {
                    if folded && i == b {
                        continue;
                    }
                    let c = u64::from(law.draw(&mut rng));
                    let p = phase(i, b);
                    let pair = &mut free[b * n + i];
                    let first = p.first_from(t.max(*pair));
                    let last = first + (c - 1) * p.cycle;
                    *pair = last + 1;
                    given[b] += c;
                    let end = (last + p.cycle) as usize;
                    if diff.len() <= end {
                        diff.resize(end + 1, 0);
                    }
                    diff[first as usize] += 1;
                    diff[end] -= 1;
                    last_of_event = last_of_event.max(last);
                }
                tally.steps += n as u64;
                done.push(Reverse((last_of_event, b, t)));
            }
            // on to the slot after the next completion: its events are built, their
            // credits back for the EVM at that slot's top
            let Some(&Reverse((last, ..))) = done.peek() else {
                // nothing in flight and no credit to assign: nothing will ever move
                break;
            };
            if last + 1 > tally.limit {
                t = tally.limit;
                continue;
            }
            while let Some(&Reverse((l, b, at))) = done.peek() {
                if l != last {
                    break;
                }
                done.pop();
                tally.steps += 1;
                tally.built(last + 1 - at);
                evm.credit_back(b);
            }
            t = last + 1;
        }
        // the cells sent in each slot, from the differences a cycle apart
        if diff.len() < t as usize {
            diff.resize(t as usize, 0);
        }
        for x in cycle..t as usize {
            diff[x] += diff[x - cycle];
        }
        let t0 = tally.start.map_or(t, |(t0, _)| t0);
        tally.per_slot = diff[t0 as usize..t as usize]
            .iter()
            .map(|&c| c as u32)
            .collect();
        tally.delivered = tally.per_slot.iter().map(|&c| u64::from(c)).sum();
        tally.start = Some((t0, 0));
        let at_end = delivered_before(t, &free, &given);
        let at_start = at_start.unwrap_or_else(|| at_end.clone());
        tally.busy = at_end.iter().zip(&at_start).map(|(e, s)| e - s).collect();
        debug_assert_eq!(tally.busy.iter().sum::<u64>(), tally.delivered);
        tally.finish(self, t, n.min(m))
    }
}

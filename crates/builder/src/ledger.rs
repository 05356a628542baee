//! The EVM's ledger: for every event id ever triggered, which BU has it and whether it is
//! final. Ids are consecutive, so a window (a ring from the oldest id not final) holds
//! everything in flight.
//!
//! An event is final once released by a BU whose sink does not commit (its release is the
//! end of it), or once committed by a BU whose sink does (docs/protocol.md §6 step 7): its
//! release then only marks it accepted, and it stays in flight, and the RUs keep its
//! fragments, until the BU's part holding it is committed.

use std::collections::VecDeque;

use evb_wire::EventRange;

/// Final: released (a sink that does not commit) or committed.
const RELEASED: u16 = 0x8000;
/// Accepted from a BU whose sink commits, and not committed yet.
const ACCEPTED: u16 = 0x4000;
/// The BU index under the flags (at most `MAX_NODES` = 4096 BUs).
const BU: u16 = 0x3FFF;

#[derive(Debug, Default)]
pub struct Ledger {
    /// Id of `window[0]`; every id below it is released.
    base: u64,
    /// BU index of each id in flight, with `ACCEPTED` and `RELEASED` as they become so.
    window: VecDeque<u16>,
    in_flight: u64,
}

/// What a release did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReleaseOutcome {
    pub released: u64,
    pub duplicates: u64,
    pub unknown: u64,
    pub misrouted: u64,
    /// The ids actually released, as ranges (to forward to the RUs).
    pub ranges: Vec<EventRange>,
}

impl Ledger {
    pub fn next_id(&self) -> u64 {
        self.base + self.window.len() as u64
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Every id below this is final.
    pub fn final_until(&self) -> u64 {
        self.base
    }

    /// A ledger rebuilt at a takeover: every id below `base` final, and `window[k]` the
    /// fate of id `base + k`: `None` final, else its BU and whether it is accepted.
    pub fn rebuilt(base: u64, window: &[Option<(u16, bool)>]) -> Ledger {
        let mut l = Ledger {
            base,
            window: window
                .iter()
                .map(|w| match *w {
                    None => RELEASED,
                    Some((bu, accepted)) => (bu & BU) | if accepted { ACCEPTED } else { 0 },
                })
                .collect(),
            in_flight: window.iter().filter(|w| w.is_some()).count() as u64,
        };
        l.settle(0);
        l
    }

    /// Records that `r` (which must start at `next_id`) went to BU `r.bu`.
    pub fn assign(&mut self, r: EventRange) {
        debug_assert_eq!(r.first, self.next_id());
        self.window
            .extend(std::iter::repeat_n(r.bu, r.count as usize));
        self.in_flight += r.count as u64;
    }

    /// Ids assigned to `bu` and not final (accepted ones included), oldest first.
    pub fn unreleased_of(&self, bu: u16) -> Vec<u64> {
        self.window
            .iter()
            .enumerate()
            .filter(|(_, s)| **s & RELEASED == 0 && **s & BU == bu)
            .map(|(i, _)| self.base + i as u64)
            .collect()
    }

    /// Gives ids already in flight (taken from a lost BU) to `r.bu`.
    pub fn reassign(&mut self, r: EventRange) {
        for id in r.first..r.end() {
            if let Some(slot) = id
                .checked_sub(self.base)
                .and_then(|k| self.window.get_mut(k as usize))
            {
                if *slot & RELEASED == 0 {
                    // accepted from the lost BU is not final: the new one starts afresh
                    *slot = r.bu;
                }
            }
        }
    }

    /// A release from a BU whose sink does not commit: its events are final.
    pub fn release(&mut self, r: EventRange) -> ReleaseOutcome {
        self.mark(r, RELEASED)
    }

    /// A release from a BU whose sink commits: its events are accepted, and stay in flight
    /// until [`Ledger::commit`].
    pub fn accept(&mut self, r: EventRange) -> ReleaseOutcome {
        self.mark(r, ACCEPTED)
    }

    /// A committed part's range: each id must be accepted from `r.bu`, and becomes final.
    /// Ids that are not (never accepted, another BU's, already final) are counted `unknown`,
    /// `misrouted` or `duplicates` and left as they are.
    pub fn commit(&mut self, r: EventRange) -> ReleaseOutcome {
        let mut out = ReleaseOutcome::default();
        let (lo, hi) = (r.first.max(self.base), r.end().min(self.next_id()));
        out.duplicates += r.end().min(self.base).saturating_sub(r.first);
        out.unknown += r.end().saturating_sub(r.first.max(self.next_id()));
        for id in lo..hi.max(lo) {
            let slot = &mut self.window[(id - self.base) as usize];
            if *slot & RELEASED != 0 {
                out.duplicates += 1;
            } else if *slot & BU != r.bu {
                out.misrouted += 1;
            } else if *slot & ACCEPTED == 0 {
                out.unknown += 1;
            } else {
                *slot = r.bu | RELEASED;
                out.released += 1;
                push_id(&mut out.ranges, r.bu, id);
            }
        }
        self.settle(out.released);
        out
    }

    fn mark(&mut self, r: EventRange, flag: u16) -> ReleaseOutcome {
        let mut out = ReleaseOutcome::default();
        // Ids below the window were released long ago, ids past it never triggered: count
        // those without visiting them, so a huge `count` costs no more than the window.
        let (lo, hi) = (r.first.max(self.base), r.end().min(self.next_id()));
        out.duplicates += r.end().min(self.base).saturating_sub(r.first);
        out.unknown += r.end().saturating_sub(r.first.max(self.next_id()));
        for id in lo..hi.max(lo) {
            let Some(slot) = self.window.get_mut((id - self.base) as usize) else {
                out.unknown += 1;
                continue;
            };
            if *slot & (RELEASED | ACCEPTED) != 0 {
                out.duplicates += 1;
            } else if *slot != r.bu {
                out.misrouted += 1;
            } else {
                *slot |= flag;
                out.released += 1;
                push_id(&mut out.ranges, r.bu, id);
            }
        }
        if flag == RELEASED {
            self.settle(out.released);
        }
        out
    }

    /// `n` more ids became final: the window moves past the final ones at its front.
    fn settle(&mut self, n: u64) {
        self.in_flight -= n;
        while self.window.front().is_some_and(|s| s & RELEASED != 0) {
            self.window.pop_front();
            self.base += 1;
        }
    }
}

/// Adds `id` to `ranges`, growing the last range when it is the next id.
fn push_id(ranges: &mut Vec<EventRange>, bu: u16, id: u64) {
    match ranges.last_mut() {
        Some(last) if last.end() == id => last.count += 1,
        _ => ranges.push(EventRange {
            bu,
            first: id,
            count: 1,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(bu: u16, first: u64, count: u32) -> EventRange {
        EventRange { bu, first, count }
    }

    #[test]
    fn accepted_events_stay_in_flight_until_committed_and_go_back_with_a_lost_bu() {
        let mut l = Ledger::default();
        l.assign(range(0, 0, 4));
        l.assign(range(1, 4, 2));
        assert_eq!(l.accept(range(0, 0, 3)).released, 3);
        assert_eq!(l.in_flight(), 6, "accepted is not final");
        assert_eq!(l.accept(range(0, 1, 1)).duplicates, 1);
        // committing what was never accepted, or another BU's, does nothing
        assert_eq!(l.commit(range(0, 3, 1)).unknown, 1);
        assert_eq!(l.commit(range(0, 4, 1)).misrouted, 1);
        let c = l.commit(range(0, 0, 2));
        assert_eq!((c.released, c.ranges), (2, vec![range(0, 0, 2)]));
        assert_eq!(l.in_flight(), 4);
        assert_eq!(l.commit(range(0, 1, 1)).duplicates, 1);
        // bu 0 is lost: its accepted event 2 and assigned 3 go back, to bu 1
        assert_eq!(l.unreleased_of(0), vec![2, 3]);
        l.reassign(range(1, 2, 2));
        assert_eq!(l.unreleased_of(0), Vec::<u64>::new());
        assert_eq!(l.commit(range(1, 2, 1)).unknown, 1, "accepted by bu 0 only");
        assert_eq!(l.accept(range(1, 2, 4)).released, 4);
        assert_eq!(l.commit(range(1, 2, 4)).released, 4);
        assert_eq!((l.in_flight(), l.next_id()), (0, 6));
    }

    #[test]
    fn ledger_catches_duplicates_unknown_and_misrouted() {
        let mut l = Ledger::default();
        l.assign(EventRange {
            bu: 0,
            first: 0,
            count: 3,
        });
        l.assign(EventRange {
            bu: 1,
            first: 3,
            count: 2,
        });
        assert_eq!(l.in_flight(), 5);
        // out of order release of 1 then 0
        let o = l.release(EventRange {
            bu: 0,
            first: 1,
            count: 1,
        });
        assert_eq!(o.released, 1);
        assert_eq!(
            l.release(EventRange {
                bu: 0,
                first: 0,
                count: 1
            })
            .released,
            1
        );
        assert_eq!(
            l.release(EventRange {
                bu: 0,
                first: 0,
                count: 2
            })
            .duplicates,
            2,
            "below base and inside window"
        );
        assert_eq!(
            l.release(EventRange {
                bu: 0,
                first: 3,
                count: 1
            })
            .misrouted,
            1
        );
        assert_eq!(
            l.release(EventRange {
                bu: 1,
                first: 4,
                count: 5
            })
            .unknown,
            4
        );
        let o = l.release(EventRange {
            bu: 0,
            first: 2,
            count: 1,
        });
        assert_eq!(
            o.ranges,
            vec![EventRange {
                bu: 0,
                first: 2,
                count: 1
            }]
        );
        assert_eq!(
            l.release(EventRange {
                bu: 1,
                first: 3,
                count: 1
            })
            .released,
            1
        );
        assert_eq!(l.in_flight(), 0);
        assert_eq!(l.next_id(), 5);
    }
}

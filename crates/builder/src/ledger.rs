//! The EVM's ledger: for every event id ever triggered, which BU has it and whether it has
//! been released. Ids are consecutive, so a window (a ring from the oldest unreleased id)
//! holds everything in flight.

use std::collections::VecDeque;

use evb_wire::EventRange;

const RELEASED: u16 = 0x8000;

#[derive(Debug, Default)]
pub struct Ledger {
    /// Id of `window[0]`; every id below it is released.
    base: u64,
    /// BU index of each id in flight, with `RELEASED` set once released.
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

    /// Records that `r` (which must start at `next_id`) went to BU `r.bu`.
    pub fn assign(&mut self, r: EventRange) {
        debug_assert_eq!(r.first, self.next_id());
        self.window
            .extend(std::iter::repeat_n(r.bu, r.count as usize));
        self.in_flight += r.count as u64;
    }

    /// Ids assigned to `bu` and not released, oldest first.
    pub fn unreleased_of(&self, bu: u16) -> Vec<u64> {
        self.window
            .iter()
            .enumerate()
            .filter(|(_, s)| **s == bu)
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
                    *slot = r.bu;
                }
            }
        }
    }

    pub fn release(&mut self, r: EventRange) -> ReleaseOutcome {
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
            if *slot & RELEASED != 0 {
                out.duplicates += 1;
            } else if *slot != r.bu {
                out.misrouted += 1;
            } else {
                *slot |= RELEASED;
                out.released += 1;
                match out.ranges.last_mut() {
                    Some(last) if last.end() == id => last.count += 1,
                    _ => out.ranges.push(EventRange {
                        bu: r.bu,
                        first: id,
                        count: 1,
                    }),
                }
            }
        }
        self.in_flight -= out.released;
        while self.window.front().is_some_and(|s| s & RELEASED != 0) {
            self.window.pop_front();
            self.base += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

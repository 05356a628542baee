//! When each event entered the EVM: the start of its latency from the trigger to the BU's
//! release (`EvmStats::record_latency`). An event enters when it is due, not when a BU has
//! credit for it, so the wait for a BU's credit is counted:
//!
//! - paced (`run.rate_hz`): event k of the run is due (k + 1) / rate after the start, pauses
//!   left out; one the EVM could not assign then waits, and its wait counts;
//! - decisions from outside: when the EVM took the decision in;
//! - live-fed RUs: when every RU had announced the event's fragments;
//! - otherwise the EVM triggers only when a BU has credit (the trigger is throttled, no
//!   event exists before it): the moment of its assignment.
//!
//! No IO; the EVM gives every moment.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::LatencyHistogram;

/// When the events of one batch (consecutive ids) entered.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Entered {
    /// All at one moment.
    At(Instant),
    /// The i-th at `first + i × step` (paced triggers).
    Paced { first: Instant, step: Duration },
    /// Each at its own moment (decisions from outside, live-fed RUs).
    Each(Vec<Instant>),
}

impl Entered {
    /// When the i-th event of the batch entered (`None`: not known, never for a batch the
    /// EVM made).
    fn at(&self, i: u64) -> Option<Instant> {
        match self {
            Entered::At(t) => Some(*t),
            Entered::Paced { first, step } => {
                Some(*first + step.saturating_mul(u32::try_from(i).unwrap_or(u32::MAX)))
            }
            Entered::Each(v) => v.get(i as usize).copied(),
        }
    }
}

/// Paced triggers: when event `k` of the run became due, given that `elapsed` of triggering
/// (pauses left out) has passed at `now`. Never after `now`.
pub(crate) fn paced(now: Instant, elapsed: Duration, rate_hz: f64, k: u64) -> Entered {
    let due = |k: u64| Duration::from_secs_f64((k + 1) as f64 / rate_hz);
    let first = now
        .checked_sub(elapsed.saturating_sub(due(k)))
        .unwrap_or(now);
    Entered::Paced {
        first,
        step: Duration::from_secs_f64(1.0 / rate_hz),
    }
}

/// The most steps [`Arrivals`] keeps before it merges them in pairs.
const MAX_STEPS: usize = 1 << 16;

/// Live-fed RUs: the moments at which the events every RU holds grew, to tell when each
/// event entered. Kept from the first event not yet triggered on.
#[derive(Debug, Default)]
pub(crate) struct Arrivals {
    /// (events held by every RU from then on, since when), rising.
    steps: VecDeque<(u64, Instant)>,
}

impl Arrivals {
    /// Every RU now holds events `[0, limit)`.
    pub(crate) fn reached(&mut self, now: Instant, limit: u64) {
        if self.steps.back().is_none_or(|&(l, _)| limit > l) {
            self.steps.push_back((limit, now));
        }
        if self.steps.len() > MAX_STEPS {
            // nothing triggered for long (a pause): pairs of steps become one, its events
            // taken as entered at the earlier moment (their latency counted long, never
            // short), so that memory stays bounded
            let merged: VecDeque<_> = self
                .steps
                .iter()
                .collect::<Vec<_>>()
                .chunks(2)
                .map(|p| (p[p.len() - 1].0, p[0].1))
                .collect();
            self.steps = merged;
        }
    }

    /// When events `[first, first + count)` entered; those before `first` are forgotten.
    pub(crate) fn take(&mut self, now: Instant, first: u64, count: u64) -> Entered {
        while self.steps.front().is_some_and(|&(l, _)| l <= first) {
            self.steps.pop_front();
        }
        let mut each = Vec::with_capacity(count as usize);
        let mut k = 0;
        for id in first..first + count {
            while self.steps.get(k).is_some_and(|&(l, _)| l <= id) {
                k += 1;
            }
            each.push(self.steps.get(k).map_or(now, |&(_, t)| t));
        }
        match each.first() {
            Some(&t) if each.iter().all(|&e| e == t) => Entered::At(t),
            _ => Entered::Each(each),
        }
    }
}

/// Batches triggered and not yet wholly released: first id → (one past the last, ids left,
/// when they entered).
#[derive(Debug, Default)]
pub(crate) struct Pending(BTreeMap<u64, (u64, u64, Entered)>);

impl Pending {
    pub(crate) fn insert(&mut self, first: u64, count: u64, entered: Entered) {
        self.0.insert(first, (first + count, count, entered));
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Events `[first, first + count)` released at `now`: each one's latency from its entry
    /// into `into`. Ids not triggered here (before a standby's takeover) are passed over.
    pub(crate) fn release(
        &mut self,
        now: Instant,
        first: u64,
        count: u64,
        into: &mut LatencyHistogram,
    ) {
        let mut id = first;
        let end = first + count;
        while id < end {
            let within = self
                .0
                .range(..=id)
                .next_back()
                .filter(|(_, (batch_end, _, _))| *batch_end > id)
                .map(|(&f, _)| f);
            let Some(batch) = within else {
                match self.0.range(id..end).next() {
                    Some((&next, _)) => {
                        id = next;
                        continue;
                    }
                    None => return,
                }
            };
            let Some((batch_end, left, entered)) = self.0.get_mut(&batch) else {
                return;
            };
            let n = (*batch_end).min(end) - id;
            if let Entered::At(t) = entered {
                into.record_n(now.saturating_duration_since(*t), n);
            } else {
                for i in id - batch..id - batch + n {
                    let at = entered.at(i).unwrap_or(now);
                    into.record_n(now.saturating_duration_since(at), 1);
                }
            }
            if *left <= n {
                self.0.remove(&batch);
            } else {
                *left -= n;
            }
            id += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_paced_event_enters_when_due_and_its_wait_for_credit_counts() {
        let t0 = Instant::now();
        // 1 kHz: event 0 due at 1 ms, event 9 at 10 ms; assigned at 50 ms of triggering
        let now = t0 + ms(50);
        let e = paced(now, ms(50), 1000.0, 0);
        let mut h = LatencyHistogram::default();
        let mut p = Pending::default();
        p.insert(0, 10, e);
        p.release(now + ms(5), 0, 10, &mut h);
        assert!(p.is_empty());
        assert_eq!(h.count, 10);
        // from 54 ms (event 0: 55 - 1) down to 45 ms (event 9: 55 - 10)
        let max = h.quantile_us(1.0).unwrap();
        let min = h.quantile_us(0.0).unwrap();
        assert!((53_000..=55_000).contains(&max), "{max}");
        assert!((44_000..=46_000).contains(&min), "{min}");
    }

    #[test]
    fn an_event_due_is_never_entered_after_now() {
        let now = Instant::now() + ms(10);
        // rounding: event 0 at 1 kHz is due at 1 ms, asked at 0.9 ms
        let e = paced(now, Duration::from_micros(900), 1000.0, 0);
        assert_eq!(e.at(0), Some(now));
    }

    #[test]
    fn live_events_enter_when_every_ru_holds_them() {
        let t0 = Instant::now();
        let mut a = Arrivals::default();
        a.reached(t0, 4);
        a.reached(t0 + ms(1), 4); // no growth: no step
        a.reached(t0 + ms(2), 6);
        a.reached(t0 + ms(3), 10);
        let e = a.take(t0 + ms(9), 2, 6);
        let want: Vec<_> = [0, 0, 2, 2, 3, 3].iter().map(|&m| t0 + ms(m)).collect();
        assert_eq!(e, Entered::Each(want));
        // the steps below 8 are gone; 8 and 9 entered together
        assert_eq!(a.take(t0 + ms(9), 8, 2), Entered::At(t0 + ms(3)));
        // beyond what was announced (not expected): the moment of the assignment
        assert_eq!(a.take(t0 + ms(9), 10, 1), Entered::At(t0 + ms(9)));
    }

    #[test]
    fn arrivals_stay_bounded_and_never_make_a_wait_shorter() {
        let t0 = Instant::now();
        let mut a = Arrivals::default();
        for k in 1..=(MAX_STEPS as u64 + 1) {
            a.reached(t0 + Duration::from_micros(k), 10 * k);
        }
        assert!(a.steps.len() <= MAX_STEPS / 2 + 1, "{}", a.steps.len());
        // event 15 entered at 2 µs (the step to 20); merged, it is taken as at 1 µs
        match a.take(t0 + ms(1), 15, 1) {
            Entered::At(t) => assert!(t <= t0 + Duration::from_micros(2)),
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn releases_in_pieces_and_across_batches_count_each_event_once() {
        let t0 = Instant::now();
        let mut p = Pending::default();
        p.insert(0, 4, Entered::At(t0));
        p.insert(4, 4, Entered::Each((0..4).map(|i| t0 + ms(i)).collect()));
        // 8..12 were decided by an EVM before a takeover: not here
        p.insert(12, 2, Entered::At(t0 + ms(5)));
        let mut h = LatencyHistogram::default();
        p.release(t0 + ms(10), 2, 4, &mut h); // 2..6
        assert_eq!(h.count, 4);
        p.release(t0 + ms(10), 0, 2, &mut h);
        p.release(t0 + ms(10), 6, 8, &mut h); // 6..14: 8..12 unknown
        assert_eq!(h.count, 10);
        assert!(p.is_empty());
        // the latest entered (event 7 at 3 ms, 12 and 13 at 5 ms) waited least: 5 ms
        let min = h.quantile_us(0.0).unwrap();
        assert!((4_900..=5_100).contains(&min), "{min}");
    }
}

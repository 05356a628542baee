//! An RU's fragments for a BU process it has not reached yet (docs/protocol.md §6 item 11).
//!
//! A BU that comes into a run under way (restarted, or a spare) accepts each RU's call and
//! tells the EVM it is ready as soon as it has read their Hellos; the RU counts the
//! connection only when the BU's HelloAck arrives. Under load the EVM's Start, the BU's
//! credits and the EVM's Assign naming the new process can reach the RU first. Such fragments
//! are not a dead process's work (that is held for the EVM's reassignment): they wait here
//! for the connection of the incarnation the Assign named and leave when it comes up. Before
//! this, they were held like a dead process's, nothing reassigned them, and the run stalled
//! on them (CI, `faults::restarted_bu_with_the_file_sink…`: one event in flight).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::FastSet;
use evb_buffers::Chain;

/// How long fragments wait for a process that accepted this RU's call. Its HelloAck was on
/// its way; past this the call failed, and the EVM judges the process as it would any BU
/// (the RU still holds the fragments for a reassignment).
pub const AWAIT_LIMIT: Duration = Duration::from_secs(30);

struct Waiting {
    bu: u16,
    inc: u16,
    data: Chain,
    count: u32,
    since: Instant,
}

/// Fragments waiting for a BU process's connection, and the processes this node reached.
/// The driver calls it where the RU's Assign names a process no connection of its carries
/// (`keep`), and when a connection to a BU comes up (`reached`); the role model plays the
/// same calls.
#[derive(Default)]
pub struct Awaiting {
    /// Every (BU, incarnation) this node has been connected to.
    reached: FastSet<(u16, u16)>,
    waiting: VecDeque<Waiting>,
}

impl Awaiting {
    /// Fragments for BU `bu`'s process `inc` that no connection carries now. Kept for that
    /// process when this node never reached it (returns `true`); a process reached before is
    /// gone or replaced, and its fragments stay only in the RU's hold (returns `false`).
    pub fn keep(&mut self, now: Instant, bu: u16, inc: u16, data: Chain, count: u32) -> bool {
        if inc == 0 || self.reached.contains(&(bu, inc)) {
            return false;
        }
        self.waiting.push_back(Waiting {
            bu,
            inc,
            data,
            count,
            since: now,
        });
        true
    }

    /// This node is connected to BU `bu`'s process `inc`: the fragments that waited for it,
    /// in the order they came. Those that waited for another process of `bu` are dropped:
    /// only one process of a BU is in the run at a time, so that one is gone.
    pub fn reached(&mut self, bu: u16, inc: u16) -> Vec<(Chain, u32)> {
        self.reached.insert((bu, inc));
        let mut due = Vec::new();
        self.waiting.retain_mut(|w| {
            if w.bu != bu {
                return true;
            }
            if w.inc == inc {
                due.push((std::mem::take(&mut w.data), w.count));
            }
            false
        });
        due
    }

    /// Drops what waited longer than [`AWAIT_LIMIT`]; returns how many sends were dropped.
    pub fn expire(&mut self, now: Instant) -> usize {
        let before = self.waiting.len();
        self.waiting
            .retain(|w| now.saturating_duration_since(w.since) < AWAIT_LIMIT);
        before - self.waiting.len()
    }

    /// Sends waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Nothing waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// What waits for `bu`, in order: each send's incarnation and fragments.
    pub fn waiting_for(&self, bu: u16) -> impl Iterator<Item = (u16, &Chain)> + '_ {
        self.waiting
            .iter()
            .filter(move |w| w.bu == bu)
            .map(|w| (w.inc, &w.data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: usize) -> Chain {
        let pool = evb_buffers::Pool::new("t", 4096, 4);
        let mut w = pool.try_alloc().unwrap();
        Chain::from_slice(w.append(&vec![7u8; n]).unwrap())
    }

    /// The race CI found: the Assign for a process that joined comes before this RU counts
    /// its connection. Its fragments wait and leave, in order, once the connection is up.
    #[test]
    fn fragments_for_a_process_not_reached_yet_wait_for_its_connection() {
        let now = Instant::now();
        let mut a = Awaiting::default();
        assert!(a.keep(now, 1, 42, chain(10), 1));
        assert!(a.keep(now, 1, 42, chain(20), 2));
        assert!(a.keep(now, 0, 9, chain(30), 1));
        assert_eq!(a.len(), 3);
        let due = a.reached(1, 42);
        let lens: Vec<(usize, u32)> = due.iter().map(|(c, n)| (c.len(), *n)).collect();
        assert_eq!(lens, [(10, 1), (20, 2)], "bu1's, in the order they came");
        assert_eq!(a.len(), 1, "bu0's still wait");
    }

    /// A process reached before and gone (or replaced) gets nothing kept: its fragments are
    /// the EVM's to reassign; and a newer process never gets an older one's.
    #[test]
    fn a_process_reached_before_or_replaced_gets_nothing() {
        let now = Instant::now();
        let mut a = Awaiting::default();
        assert!(a.reached(1, 42).is_empty());
        assert!(
            !a.keep(now, 1, 42, chain(10), 1),
            "reached once: held by the RU"
        );
        assert!(
            !a.keep(now, 1, 0, chain(10), 1),
            "incarnation 0 names no process"
        );
        assert!(
            a.keep(now, 1, 43, chain(10), 1),
            "a process not reached yet"
        );
        assert!(
            a.reached(1, 44).is_empty(),
            "43 never came; 44 does not get its work"
        );
        assert_eq!(a.len(), 0);
    }

    #[test]
    fn waiting_ends_at_the_limit() {
        let now = Instant::now();
        let mut a = Awaiting::default();
        a.keep(now, 1, 42, chain(10), 1);
        assert_eq!(a.expire(now + AWAIT_LIMIT - Duration::from_millis(1)), 0);
        assert_eq!(a.expire(now + AWAIT_LIMIT), 1);
        assert!(a.reached(1, 42).is_empty());
    }
}

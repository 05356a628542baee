//! When `evb run` stops watching its nodes, and why: a rule over what it has seen and the
//! time, with no IO (the watch loop feeds it each pass and acts on its answer; the tests
//! below run it in virtual time, at both edges of every bound).
//!
//! - Every node exited: done.
//! - The EVM reported: each node still running gets its bound from that moment — the EVM
//!   `RECORDS_FLUSH_LIMIT + EXIT_GRACE` (its run record's flush may take that long on a busy
//!   disk), every other node `EXIT_GRACE` — and those still running past theirs are hung
//!   (killed, and named with their threads).
//! - Before a report: past the run's time budget, the run timed out; a failure that dooms
//!   the run (a node failed while the EVM is not running, or the EVM itself gone) gives
//!   the EVM `DOOMED_GRACE` to report before the rest are stopped.

use std::time::Duration;

/// How long a node may take to exit after the EVM's report (the EVM: more, see
/// `RECORDS_FLUSH_LIMIT`); a node still there then is killed.
pub(super) const EXIT_GRACE: Duration = Duration::from_secs(5);

/// How long a doomed run waits for the EVM's report before the rest are stopped.
pub(super) const DOOMED_GRACE: Duration = Duration::from_secs(3);

/// What the watch loop saw on this pass.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seen {
    /// Node processes still running, and whether the EVM (the run's, now) is one of them.
    pub running: usize,
    pub evm_alive: bool,
    /// The run's EVM reported.
    pub reported: bool,
    /// A failure dooms the run (see the module's text); meaningful only before a report.
    pub doomed: bool,
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    Watch,
    /// Stop watching: every node still running is stopped. `hung`: they outlived their
    /// bound after the EVM's report; `timed_out`: the run's time budget ran out first.
    Stop {
        hung: bool,
        timed_out: bool,
    },
}

/// The rule's memory: when the report came, when the run was first doomed.
#[derive(Debug, Clone)]
pub(super) struct Ending {
    budget: Duration,
    reported_at: Option<Duration>,
    doomed_since: Option<Duration>,
}

impl Ending {
    /// `budget`: the run's time budget from the start of watching.
    pub(super) fn new(budget: Duration) -> Ending {
        Ending {
            budget,
            reported_at: None,
            doomed_since: None,
        }
    }

    /// Whether the EVM's report was seen (the nodes' exits are then bounded).
    pub(super) fn after_report(&self) -> bool {
        self.reported_at.is_some()
    }

    /// `now`: time since watching began.
    pub(super) fn step(&mut self, now: Duration, seen: Seen) -> Step {
        let stop = Step::Stop {
            hung: false,
            timed_out: false,
        };
        if seen.running == 0 {
            return stop;
        }
        if seen.reported || self.reported_at.is_some() {
            let waited = now.saturating_sub(*self.reported_at.get_or_insert(now));
            let nodes_left = seen.running - usize::from(seen.evm_alive);
            let evm_bound = evb_control::RECORDS_FLUSH_LIMIT + EXIT_GRACE;
            let within =
                (seen.evm_alive && waited < evm_bound) || (nodes_left > 0 && waited < EXIT_GRACE);
            return if within {
                Step::Watch
            } else {
                Step::Stop {
                    hung: true,
                    timed_out: false,
                }
            };
        }
        if now > self.budget {
            return Step::Stop {
                hung: false,
                timed_out: true,
            };
        }
        if seen.doomed {
            let since = *self.doomed_since.get_or_insert(now);
            if now.saturating_sub(since) > DOOMED_GRACE {
                return stop;
            }
        }
        Step::Watch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: f64) -> Duration {
        Duration::from_secs_f64(n)
    }

    fn seen(running: usize, evm_alive: bool, reported: bool, doomed: bool) -> Seen {
        Seen {
            running,
            evm_alive,
            reported,
            doomed,
        }
    }

    const HUNG: Step = Step::Stop {
        hung: true,
        timed_out: false,
    };
    const DONE: Step = Step::Stop {
        hung: false,
        timed_out: false,
    };

    /// The EVM reported at 100 s and has not exited: waited for up to its record's flush
    /// bound plus the grace (15 s), at 0.98 × and not at 1.02 ×; a node alone gets 5 s.
    #[test]
    fn after_the_report_each_node_gets_its_bound_and_the_evm_its_longer_one() {
        let evm_bound = evb_control::RECORDS_FLUSH_LIMIT + EXIT_GRACE;
        assert_eq!(evm_bound, s(15.0));
        let mut e = Ending::new(s(1000.0));
        assert_eq!(e.step(s(100.0), seen(3, true, true, false)), Step::Watch);
        assert!(e.after_report());
        let at = |x: f64| s(100.0) + evm_bound.mul_f64(x);
        assert_eq!(e.step(at(0.98), seen(1, true, true, false)), Step::Watch);
        assert_eq!(e.step(at(1.02), seen(1, true, true, false)), HUNG);
        // a node other than the EVM: 5 s
        let mut e = Ending::new(s(1000.0));
        e.step(s(100.0), seen(2, false, true, false));
        let at = |x: f64| s(100.0) + EXIT_GRACE.mul_f64(x);
        assert_eq!(e.step(at(0.98), seen(1, false, true, false)), Step::Watch);
        assert_eq!(e.step(at(1.02), seen(1, false, true, false)), HUNG);
        // every node gone: done at once, however early
        assert_eq!(e.step(at(0.1), seen(0, false, true, false)), DONE);
    }

    /// Two faults: the run doomed first (a node failed), then the EVM reports anyway: its
    /// report bounds the exits (the EVM's 15 s), not the doomed run's 3 s.
    #[test]
    fn a_report_after_the_run_was_doomed_bounds_the_exits_by_the_report() {
        let mut e = Ending::new(s(1000.0));
        assert_eq!(e.step(s(10.0), seen(4, true, false, true)), Step::Watch);
        assert_eq!(e.step(s(12.0), seen(4, true, true, true)), Step::Watch);
        assert_eq!(
            e.step(s(12.0 + 14.7), seen(1, true, false, true)),
            Step::Watch
        );
        assert_eq!(e.step(s(12.0 + 15.3), seen(1, true, false, true)), HUNG);
    }

    /// A doomed run waits up to 3 s for the EVM's report, and the time budget is the budget:
    /// each at 0.98 × and 1.02 ×.
    #[test]
    fn a_doomed_run_waits_its_grace_and_a_run_its_budget() {
        let mut e = Ending::new(s(1000.0));
        e.step(s(50.0), seen(4, false, false, true));
        let at = |x: f64| s(50.0) + DOOMED_GRACE.mul_f64(x);
        assert_eq!(e.step(at(0.98), seen(4, false, false, true)), Step::Watch);
        assert_eq!(e.step(at(1.02), seen(4, false, false, true)), DONE);
        let mut e = Ending::new(s(60.0));
        assert_eq!(
            e.step(s(60.0 * 0.98), seen(4, true, false, false)),
            Step::Watch
        );
        assert_eq!(
            e.step(s(60.0 * 1.02), seen(4, true, false, false)),
            Step::Stop {
                hung: false,
                timed_out: true
            }
        );
        // once reported, the budget no longer ends the watch: the exits' bounds do
        let mut e = Ending::new(s(60.0));
        e.step(s(59.0), seen(4, true, true, false));
        assert_eq!(e.step(s(61.0), seen(1, true, false, false)), Step::Watch);
    }
}

//! Who is alive, with the time passed in and no IO: when each connected peer was last heard,
//! when heartbeats are due, which peers are silent too long, and when this node's own pause
//! (the process stopped, or starved of CPU) or a dry receive pool (the transport stopped
//! reading) makes their silence its own. The driver feeds it what it hears and does what a
//! [`Due`] says (send heartbeats, close and lose the silent peers); [`Liveness::poll_at`]
//! says when it next has something to decide. (Bounding the loop's wait by it cost the
//! folded shm row 6–9 % in the same minutes, so the loop only asks it each pass.)

use std::time::{Duration, Instant};

use evb_builder::{FastMap, NodeRef};

pub(super) struct Liveness {
    heartbeat: Duration,
    timeout: Duration,
    /// How often silence is judged: a few times per heartbeat period.
    check_every: Duration,
    /// When each connected peer was last heard (any message, control and data).
    last_heard: FastMap<NodeRef, Instant>,
    next_heartbeat: Instant,
    next_check: Instant,
    /// When this node found that it had not run for a while, and for how long.
    suspended: Option<(Instant, Duration)>,
}

/// What one pass asks of the driver.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Due {
    /// A heartbeat on every connection (and a word to the standby that follows).
    pub heartbeat: bool,
    /// This node did not run for this long: every peer got a fresh period (say so).
    pub paused_for: Option<Duration>,
    /// Peers silent for longer than the timeout, in order: to be closed and lost.
    pub silent: Vec<NodeRef>,
}

impl Liveness {
    /// Heartbeats every `heartbeat`; a peer silent for `timeout` is lost.
    pub(super) fn new(heartbeat: Duration, timeout: Duration, now: Instant) -> Liveness {
        Liveness {
            heartbeat,
            timeout,
            check_every: Duration::from_nanos((heartbeat.as_nanos() as u64).div_ceil(4)),
            last_heard: FastMap::default(),
            next_heartbeat: now,
            next_check: now,
            suspended: None,
        }
    }

    /// Peer `p` was heard (it connected, or sent anything).
    #[inline]
    pub(super) fn heard(&mut self, p: NodeRef, now: Instant) {
        self.last_heard.insert(p, now);
    }

    /// Peer `p` is no longer connected.
    pub(super) fn forget(&mut self, p: NodeRef) {
        self.last_heard.remove(&p);
    }

    /// One pass at `now`. `up`: every connection was up once (before, nobody is judged
    /// and a pause is not news); `judge`: silence loses peers now (the run is ready or
    /// on); `starved` is asked once per check: the receive pool ran dry since the last one.
    pub(super) fn poll(
        &mut self,
        now: Instant,
        up: bool,
        judge: bool,
        starved: impl FnOnce() -> bool,
    ) -> Due {
        let mut due = Due::default();
        if now < self.next_check {
            return due;
        }
        // This loop itself did not run for a long while (the process was stopped, or
        // starved of CPU): peers' silence is ours, not theirs. A fresh period for each.
        let gap = now.duration_since(self.next_check) + self.check_every;
        if gap > self.timeout / 2 && up {
            self.refresh(now);
            self.suspended = Some((now, gap));
            due.paused_for = Some(gap);
        }
        // The receive pool ran dry (back-pressure): the transport stopped reading, so no
        // peer could be heard meanwhile; that is not their silence either.
        if starved() {
            self.refresh(now);
        }
        self.next_check = now + self.check_every;
        if now >= self.next_heartbeat {
            self.next_heartbeat = now + self.heartbeat;
            due.heartbeat = true;
        }
        if judge && up {
            due.silent = self
                .last_heard
                .iter()
                .filter(|(_, t)| now.duration_since(**t) > self.timeout)
                .map(|(p, _)| *p)
                .collect();
            due.silent.sort();
        }
        due
    }

    /// When the next pass has something to decide (a check or a heartbeat).
    #[inline]
    pub(super) fn poll_at(&self) -> Instant {
        self.next_check.min(self.next_heartbeat)
    }

    /// This node's own pause, if it ended less than two timeouts before `now`: a loss
    /// reported so soon after it names it.
    pub(super) fn own_pause(&self, now: Instant) -> Option<Duration> {
        self.suspended
            .filter(|(at, _)| now.duration_since(*at) < self.timeout * 2)
            .map(|(_, gap)| gap)
    }

    fn refresh(&mut self, now: Instant) {
        for t in self.last_heard.values_mut() {
            *t = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HB: Duration = Duration::from_millis(200);
    const TIMEOUT: Duration = Duration::from_millis(1000);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A node whose loop runs every 10 ms from `from` to `to` (inclusive), peers heard as
    /// `hear` says: what it found silent, and how many heartbeats it sent.
    fn run(
        l: &mut Liveness,
        t0: Instant,
        from: u64,
        to: u64,
        hear: impl Fn(u64) -> Vec<NodeRef>,
    ) -> (Vec<(u64, NodeRef)>, usize) {
        let mut lost = Vec::new();
        let mut beats = 0;
        let mut t = from;
        while t <= to {
            let now = t0 + ms(t);
            for p in hear(t) {
                l.heard(p, now);
            }
            let due = l.poll(now, true, true, || false);
            beats += usize::from(due.heartbeat);
            for p in due.silent {
                l.forget(p);
                lost.push((t, p));
            }
            t += 10;
        }
        (lost, beats)
    }

    #[test]
    fn a_silent_peer_is_lost_just_over_the_timeout_and_not_just_under() {
        let t0 = Instant::now();
        let mut l = Liveness::new(HB, TIMEOUT, t0);
        let (bu, ru) = (NodeRef::Bu(1), NodeRef::Ru(0));
        l.heard(bu, t0);
        l.heard(ru, t0);
        // the RU speaks every 100 ms; the BU's last word was at 0
        let (lost, beats) = run(&mut l, t0, 0, 990, |t| {
            if t % 100 == 0 {
                vec![ru]
            } else {
                vec![]
            }
        });
        assert!(lost.is_empty(), "{lost:?}");
        // heartbeats at 0, 200, ..., 800
        assert_eq!(beats, 5);
        // at exactly the timeout still not (silence must pass it); the next check does
        let (lost, _) = run(&mut l, t0, 1000, 1100, |_| vec![ru]);
        assert_eq!(lost.len(), 1, "{lost:?}");
        let (at, who) = lost[0];
        assert_eq!(who, bu);
        assert!((1000..=1060).contains(&at), "lost at {at} ms");
    }

    #[test]
    fn a_node_that_did_not_run_gives_its_peers_a_fresh_period() {
        let t0 = Instant::now();
        let mut l = Liveness::new(HB, TIMEOUT, t0);
        let bu = NodeRef::Bu(0);
        l.heard(bu, t0);
        run(&mut l, t0, 0, 300, |_| vec![]);
        // the process stopped from 300 ms to 1,500 ms: the BU was not heard for 1.5 s, but
        // this node could not have heard it
        let due = l.poll(t0 + ms(1500), true, true, || false);
        assert!(due.silent.is_empty(), "{due:?}");
        assert!(due.paused_for.is_some_and(|g| g >= ms(1190)), "{due:?}");
        assert_eq!(l.own_pause(t0 + ms(1600)), due.paused_for);
        // a full, fresh timeout from the pause's end
        let (lost, _) = run(&mut l, t0, 1510, 2490, |_| vec![]);
        assert!(lost.is_empty(), "{lost:?}");
        let (lost, _) = run(&mut l, t0, 2500, 2600, |_| vec![]);
        assert_eq!(lost.iter().map(|l| l.1).collect::<Vec<_>>(), [bu]);
        // two timeouts after the pause, a loss no longer names it
        assert_eq!(l.own_pause(t0 + ms(3600)), None);
    }

    #[test]
    fn a_pause_under_half_the_timeout_changes_nothing() {
        let t0 = Instant::now();
        let mut l = Liveness::new(HB, TIMEOUT, t0);
        l.heard(NodeRef::Bu(0), t0);
        run(&mut l, t0, 0, 100, |_| vec![]);
        let due = l.poll(t0 + ms(500), true, true, || false);
        assert_eq!(due.paused_for, None);
        let (lost, _) = run(&mut l, t0, 510, 1100, |_| vec![]);
        assert_eq!(lost.len(), 1);
    }

    #[test]
    fn a_starved_node_judges_no_one() {
        let t0 = Instant::now();
        let mut l = Liveness::new(HB, TIMEOUT, t0);
        l.heard(NodeRef::Ru(3), t0);
        let mut t = 0;
        while t <= 3000 {
            let due = l.poll(t0 + ms(t), true, true, || true);
            assert!(
                due.silent.is_empty(),
                "lost at {t} ms while the pool was dry"
            );
            t += 10;
        }
        // the pool back: a full timeout later the peer is judged again
        let (lost, _) = run(&mut l, t0, 3010, 4100, |_| vec![]);
        assert_eq!(lost.len(), 1);
    }

    #[test]
    fn before_the_run_is_up_nobody_is_judged() {
        let t0 = Instant::now();
        let mut l = Liveness::new(HB, TIMEOUT, t0);
        l.heard(NodeRef::Evm, t0);
        for (at, up, judge) in [(5000, false, true), (10_000, true, false)] {
            let due = l.poll(t0 + ms(at), up, judge, || false);
            assert!(due.silent.is_empty());
            // a node not yet up does not call its waiting a pause
            assert_eq!(due.paused_for.is_some(), up);
        }
    }

    #[test]
    fn the_next_pass_is_due_at_the_earlier_of_a_check_and_a_heartbeat() {
        let t0 = Instant::now();
        let mut l = Liveness::new(HB, TIMEOUT, t0);
        assert_eq!(l.poll_at(), t0);
        let due = l.poll(t0, true, true, || false);
        assert!(due.heartbeat);
        assert_eq!(l.poll_at(), t0 + ms(50));
        // nothing to do before then
        assert_eq!(l.poll(t0 + ms(49), true, true, || false), Due::default());
    }
}

//! The session's machines in virtual time: an active EVM (its [`Active`] slot and a word
//! every heartbeat while it runs), the standby's [`Follower`], and nodes that lose the
//! active EVM and send their resync, with time jumped to the earliest timeout. Each case of
//! the takeover at the edge of its timeout (0.98 × and 1.02 ×), with no socket.

use std::time::Duration;

use evb_builder::NodeRef;
use evb_transport::ConnId;
use evb_wire::resync::Follow;

use super::active::{Call, Fenced};
use super::follower::{Event, Input, Stage, Timers, Transmit};
use super::*;

const HB: Duration = Duration::from_millis(200);
const TIMEOUT: Duration = Duration::from_millis(1000);
const WAIT: Duration = Duration::from_millis(3000);
const CONNECT: Duration = Duration::from_secs(10);
const FOLLOW_CONN: ConnId = ConnId(7);

fn timers() -> Timers {
    Timers {
        heartbeat: HB,
        timeout: TIMEOUT,
        wait: WAIT,
        connect: CONNECT,
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn nodes() -> Vec<NodeRef> {
    vec![NodeRef::Ru(0), NodeRef::Ru(1), NodeRef::Bu(0)]
}

/// The standby and a scripted active EVM on one connection, in virtual time.
struct Pair {
    now: Time,
    standby: Follower,
    active: Active,
    /// The active EVM runs (speaks every heartbeat) until this time, if any.
    awake_until: Option<Time>,
    next_word: Time,
    /// The words' epoch and whether the run is over.
    word: Follow,
    /// What the standby sent and did, with when.
    sent: Vec<(Time, Transmit)>,
    events: Vec<(Time, Event)>,
}

impl Pair {
    /// Connected and following at time 0.
    fn new() -> Pair {
        let mut p = Pair {
            now: Duration::ZERO,
            standby: Follower::new(timers(), nodes(), Duration::ZERO),
            active: Active::new(Epoch::FIRST, Duration::ZERO),
            awake_until: None,
            next_word: Duration::ZERO,
            word: Follow::default(),
            sent: Vec::new(),
            events: Vec::new(),
        };
        p.standby.handle_timeout(p.now);
        assert_eq!(p.standby.poll_transmit(), Some(Transmit::Dial));
        p.standby.handle(p.now, Input::Dialed(FOLLOW_CONN));
        p.standby.handle(p.now, Input::Connected(FOLLOW_CONN));
        assert_eq!(
            p.active.call(p.now, FOLLOW_CONN, TIMEOUT),
            Call::Taken { replaced: None }
        );
        assert_eq!(p.standby.poll_event(), Some(Event::Reached));
        p
    }

    /// The active EVM speaks every heartbeat until `t` (then it freezes or dies).
    fn active_until(&mut self, t: u64) {
        self.awake_until = Some(ms(t));
    }

    /// Runs to `t`, waking the standby at each of its timeouts and the active EVM at each
    /// of its words.
    fn run_to(&mut self, t: u64) {
        let end = ms(t);
        loop {
            let word_at = self
                .awake_until
                .filter(|u| self.next_word <= *u)
                .map(|_| self.next_word);
            let next = [self.standby.poll_timeout(), word_at]
                .into_iter()
                .flatten()
                .min();
            let Some(next) = next.filter(|n| *n <= end) else {
                break;
            };
            self.now = next.max(self.now);
            if word_at == Some(next) {
                self.next_word = next + HB;
                if self.active.follower().is_some() {
                    self.standby
                        .handle(self.now, Input::Word(FOLLOW_CONN, self.word.clone()));
                }
            }
            self.standby.handle_timeout(self.now);
            self.drain();
        }
        self.now = end.max(self.now);
    }

    fn input(&mut self, i: Input) {
        self.standby.handle(self.now, i);
        self.drain();
    }

    fn drain(&mut self) {
        while let Some(t) = self.standby.poll_transmit() {
            if let Transmit::Fence(c, e) = &t {
                assert_eq!(*c, FOLLOW_CONN);
                // the active EVM hears it if its connection is up
                let _ = self.active.fence(*e);
            }
            self.sent.push((self.now, t));
        }
        while let Some(e) = self.standby.poll_event() {
            self.events.push((self.now, e));
        }
    }

    fn fences(&self) -> usize {
        self.sent
            .iter()
            .filter(|(_, t)| matches!(t, Transmit::Fence(..)))
            .count()
    }

    fn took_over(&self) -> Option<(Time, usize)> {
        self.events.iter().find_map(|(t, e)| match e {
            Event::TakeOver { answered, .. } => Some((*t, *answered)),
            _ => None,
        })
    }

    fn suspected_at(&self) -> Option<Time> {
        self.events.iter().find_map(|(t, e)| match e {
            Event::Suspected { .. } => Some(*t),
            _ => None,
        })
    }
}

fn resync(node: NodeRef) -> Input {
    Input::Resync {
        node,
        complete: true,
    }
}

#[test]
fn a_silent_active_evm_is_suspected_just_over_the_timeout_and_not_just_under() {
    let mut p = Pair::new();
    p.active_until(1000);
    // last word at 1,000 ms: at 0.98 × the timeout after it, still followed
    p.run_to(1000 + 980);
    assert_eq!(p.suspected_at(), None, "{:?}", p.events);
    assert!(matches!(p.standby.stage(), Stage::Following { .. }));
    // heartbeats to the active EVM all along
    let beats = p
        .sent
        .iter()
        .filter(|(_, t)| matches!(t, Transmit::Heartbeat(_)))
        .count();
    assert!(beats >= 9, "{beats} heartbeats");
    p.run_to(1000 + 1020);
    let at = p.suspected_at().expect("suspected by 1.02 × the timeout");
    assert!(at > ms(2000) && at <= ms(2020), "at {at:?}");
    // a suspicion only: no fence, no takeover
    assert_eq!(p.fences(), 0);
    assert_eq!(p.took_over(), None);
}

#[test]
fn a_suspected_evm_that_speaks_again_before_any_node_left_keeps_the_run() {
    let mut p = Pair::new();
    p.active_until(500);
    p.run_to(1600);
    assert!(p.suspected_at().is_some());
    // it wakes at 2,000 ms: its next word makes the standby stand down
    p.awake_until = Some(ms(60_000));
    p.next_word = ms(2000);
    p.run_to(2000);
    assert!(p
        .events
        .iter()
        .any(|(_, e)| *e == Event::StoodDown { spoke: true }));
    assert!(matches!(p.standby.stage(), Stage::Following { .. }));
    p.run_to(20_000);
    assert_eq!(p.took_over(), None);
    assert_eq!(p.fences(), 0);
    assert_eq!(p.active.fenced(), None);
}

#[test]
fn a_silent_evm_whose_connection_stays_open_keeps_the_run_after_the_wait() {
    let mut p = Pair::new();
    p.active_until(0);
    p.run_to(1010);
    let since = p.suspected_at().unwrap();
    p.run_to((since + WAIT.mul_f64(0.98)).as_millis() as u64);
    assert!(matches!(p.standby.stage(), Stage::Suspected { .. }));
    p.run_to((since + WAIT.mul_f64(1.02)).as_millis() as u64);
    assert!(p
        .events
        .iter()
        .any(|(_, e)| *e == Event::StoodDown { spoke: false }));
    assert_eq!(p.took_over(), None);
}

#[test]
fn the_first_node_that_follows_decides_the_takeover_with_exactly_one_fence() {
    let mut p = Pair::new();
    p.active_until(300);
    p.run_to(1400);
    assert!(p.suspected_at().is_some());
    p.input(resync(NodeRef::Ru(0)));
    assert_eq!(p.fences(), 1);
    assert_eq!(p.active.fenced(), Some(Epoch::new(1)));
    assert!(p.standby.decided());
    // the old EVM wakes: its word no longer counts
    p.input(Input::Word(FOLLOW_CONN, Follow::default()));
    p.input(resync(NodeRef::Ru(1)));
    assert_eq!(p.fences(), 1, "a second follower fences nothing more");
    assert_eq!(p.took_over(), None, "bu0 has not answered");
    p.input(resync(NodeRef::Bu(0)));
    let (_, answered) = p.took_over().expect("every node answered");
    assert_eq!(answered, 3);
    assert_eq!(p.standby.stage(), &Stage::TookOver);
}

#[test]
fn the_takeover_waits_for_every_resync_until_its_deadline() {
    let mut p = Pair::new();
    p.active_until(0);
    p.run_to(500);
    // the active EVM's connection closes (killed): suspected at once
    p.input(Input::Closed(FOLLOW_CONN));
    let since = p.suspected_at().unwrap();
    assert_eq!(since, ms(500));
    p.input(resync(NodeRef::Ru(0)));
    assert_eq!(p.fences(), 0, "no connection to fence on");
    // a resync in parts: incomplete until its last part
    p.input(Input::Resync {
        node: NodeRef::Bu(0),
        complete: false,
    });
    p.run_to((since + WAIT.mul_f64(0.98)).as_millis() as u64);
    assert_eq!(p.took_over(), None, "ru1 is still awaited");
    p.run_to((since + WAIT.mul_f64(1.02)).as_millis() as u64);
    let (at, answered) = p.took_over().expect("the wait is over");
    assert_eq!(at, since + WAIT);
    assert_eq!(answered, 1, "ru0 only: bu0's resync never completed");
}

#[test]
fn a_node_the_active_evm_dropped_is_not_waited_for() {
    let mut p = Pair::new();
    p.word.dropped = vec![(evb_wire::Role::Bu, 0)];
    p.active_until(200);
    p.run_to(400);
    p.input(Input::Closed(FOLLOW_CONN));
    p.input(resync(NodeRef::Ru(1)));
    p.input(resync(NodeRef::Ru(0)));
    let (at, _) = p.took_over().expect("bu0 was dropped");
    assert_eq!(at, ms(400));
}

#[test]
fn a_run_over_at_the_active_evm_is_never_taken_over() {
    let mut p = Pair::new();
    p.word.over = true;
    p.active_until(200);
    p.run_to(200);
    assert!(p
        .events
        .iter()
        .any(|(_, e)| *e == Event::Over { elsewhere: false }));
    p.input(Input::Closed(FOLLOW_CONN));
    p.input(resync(NodeRef::Ru(0)));
    p.run_to(60_000);
    assert_eq!(p.took_over(), None);
    assert_eq!(p.standby.poll_timeout(), None);
}

#[test]
fn an_active_evm_never_reached_ends_the_standby_just_after_the_connect_timeout() {
    let mut f = Follower::new(timers(), nodes(), Duration::ZERO);
    let mut t = Duration::ZERO;
    let mut ended = None;
    // every call refused at once: called again every 200 ms
    let mut dials = 0;
    while ended.is_none() && t < ms(20_000) {
        t = f.poll_timeout().expect("calling");
        f.handle_timeout(t);
        while let Some(x) = f.poll_transmit() {
            assert_eq!(x, Transmit::Dial);
            dials += 1;
            f.handle(t, Input::Dialed(ConnId(dials)));
            f.handle(t, Input::Closed(ConnId(dials)));
        }
        if let Some(Event::NeverReached) = f.poll_event() {
            ended = Some(t);
        }
    }
    let at = ended.expect("ended");
    assert!(at > CONNECT && at < CONNECT + ms(1), "{at:?}");
    assert!((49..=51).contains(&dials), "{dials} calls in 10 s");
}

#[test]
fn a_resync_while_the_evm_is_heard_decides_only_once_it_is_suspected() {
    // bu0 was dropped by the active EVM and calls here on finding itself cut off: it never
    // decides; ru0 lost the EVM first: its resync decides once the standby suspects it
    let mut p = Pair::new();
    p.word.dropped = vec![(evb_wire::Role::Bu, 0)];
    p.active_until(1000);
    p.run_to(700);
    p.input(resync(NodeRef::Bu(0)));
    p.input(resync(NodeRef::Ru(0)));
    p.run_to(1000);
    assert_eq!(p.fences(), 0, "the active EVM is still heard");
    assert!(matches!(p.standby.stage(), Stage::Following { .. }));
    p.run_to(2100);
    assert_eq!(p.fences(), 1, "suspected, and ru0 had followed");
    assert!(p.standby.decided());
    p.input(resync(NodeRef::Ru(1)));
    assert!(p.took_over().is_some(), "every node not dropped answered");
}

#[test]
fn a_dropped_node_alone_never_makes_a_takeover() {
    let mut p = Pair::new();
    p.word.dropped = vec![(evb_wire::Role::Bu, 0)];
    p.active_until(60_000);
    p.run_to(500);
    p.input(resync(NodeRef::Bu(0)));
    p.run_to(20_000);
    assert_eq!(p.fences(), 0);
    assert_eq!(p.took_over(), None);
    assert_eq!(p.active.fenced(), None);
}

#[test]
fn a_stop_ends_a_following_standby_and_not_a_decided_one() {
    let mut p = Pair::new();
    p.input(Input::Stop);
    assert!(p.events.iter().any(|(_, e)| *e == Event::Stopped));
    let mut p = Pair::new();
    p.input(Input::Closed(FOLLOW_CONN));
    p.input(resync(NodeRef::Ru(0)));
    p.input(Input::Stop);
    assert!(!p.events.iter().any(|(_, e)| *e == Event::Stopped));
    assert!(p.standby.decided());
}

#[test]
fn the_follower_slot_is_held_while_its_standby_is_heard() {
    let mut a = Active::new(Epoch::FIRST, Duration::ZERO);
    assert_eq!(
        a.call(ms(0), ConnId(1), TIMEOUT),
        Call::Taken { replaced: None }
    );
    a.heard(ms(100));
    // a second standby at 0.98 × the timeout after the first was heard: refused
    assert_eq!(a.call(ms(100 + 980), ConnId(2), TIMEOUT), Call::Held);
    // at 1.02 ×: the silent one is replaced
    assert_eq!(
        a.call(ms(100 + 1020), ConnId(2), TIMEOUT),
        Call::Taken {
            replaced: Some(ConnId(1))
        }
    );
    assert!(a.is_follower(ConnId(2)));
    assert!(a.closed(ConnId(2)));
    assert_eq!(a.follower(), None);
}

#[test]
fn only_a_fence_above_the_own_epoch_fences() {
    let mut a = Active::new(Epoch::new(2), Duration::ZERO);
    assert_eq!(
        a.fence(Epoch::new(2)),
        Fenced::NotAbove { own: Epoch::new(2) }
    );
    assert_eq!(
        a.fence(Epoch::new(1)),
        Fenced::NotAbove { own: Epoch::new(2) }
    );
    assert_eq!(a.fenced(), None);
    assert_eq!(
        a.call(ms(0), ConnId(1), TIMEOUT),
        Call::Taken { replaced: None }
    );
    assert_eq!(a.fence(Epoch::new(3)), Fenced::Now(Epoch::new(3)));
    assert_eq!(a.fence(Epoch::new(4)), Fenced::Already);
    // a fenced EVM's word goes nowhere, and it takes no standby
    assert_eq!(a.follower(), None);
    assert_eq!(
        a.call(ms(5000), ConnId(2), TIMEOUT),
        Call::Fenced(Epoch::new(3))
    );
}

#[test]
fn an_evm_that_lost_a_node_after_its_own_pause_yields_to_its_standby() {
    let mut a = Active::new(Epoch::new(1), Duration::ZERO);
    // no follower: nothing to yield to, whatever the pause
    assert_eq!(a.node_lost(true), None);
    assert_eq!(
        a.call(ms(0), ConnId(1), TIMEOUT),
        Call::Taken { replaced: None }
    );
    // a loss with no pause of its own: the EVM's rules decide (not the slot)
    assert_eq!(a.node_lost(false), None);
    assert_eq!(a.fenced(), None);
    // after its own pause: fenced at the standby's epoch, the follower no longer told
    assert_eq!(a.node_lost(true), Some(Epoch::new(2)));
    assert_eq!(a.fenced(), Some(Epoch::new(2)));
    assert_eq!(a.follower(), None);
    assert_eq!(a.fence(Epoch::new(3)), Fenced::Already);
}

/// A node that calls the standby with anything but a resync (one that started before its
/// EVM listened, a BU restarted after a takeover) is closed without a Term at every stage
/// before the takeover — following, suspecting (just under and just over the timeout), and
/// deciding — and never decides one: only a node that left its EVM hears the standby's Term.
#[test]
fn a_standby_says_its_term_only_to_a_node_that_resyncs_at_every_stage() {
    use super::follower::{Answer, FirstWord};
    let mut p = Pair::new();
    p.active_until(500);
    let mut seen = Vec::new();
    for t in [400, 500 + 980, 500 + 1020, 1600] {
        p.run_to(t);
        assert_eq!(
            p.standby.answer(NodeRef::Bu(0), FirstWord::Other),
            Answer::Close,
            "at {t} ms"
        );
        assert_eq!(
            p.standby.answer(NodeRef::Bu(0), FirstWord::Resync),
            Answer::Term(Epoch::new(1)),
            "at {t} ms"
        );
        seen.push(p.standby.stage().clone());
    }
    assert!(matches!(seen[0], Stage::Following { .. }), "{seen:?}");
    assert!(matches!(seen[3], Stage::Suspected { .. }), "{seen:?}");
    // closed nodes tell the machine nothing: the suspicion ends as it would without them
    assert_eq!(p.took_over(), None);
    assert_eq!(p.fences(), 0);
    // a node that left the EVM decides; then a late caller with Register is still closed
    p.input(resync(NodeRef::Ru(0)));
    assert!(p.standby.decided());
    assert_eq!(
        p.standby.answer(NodeRef::Bu(0), FirstWord::Other),
        Answer::Close
    );
    p.input(resync(NodeRef::Ru(1)));
    p.input(resync(NodeRef::Bu(0)));
    assert_eq!(p.standby.stage(), &Stage::TookOver);
}

/// A node the active EVM dropped (its last word says so) is closed without a Term even when
/// its first word is a resync; another node's resync still hears the Term.
#[test]
fn a_node_the_evm_dropped_is_closed_by_the_standby_without_a_term() {
    use super::follower::{Answer, FirstWord};
    let mut p = Pair::new();
    p.word.dropped = vec![(evb_wire::Role::Bu, 0)];
    p.active_until(1000);
    p.run_to(800);
    assert_eq!(
        p.standby.answer(NodeRef::Bu(0), FirstWord::Resync),
        Answer::Close
    );
    assert_eq!(
        p.standby.answer(NodeRef::Ru(0), FirstWord::Resync),
        Answer::Term(Epoch::new(1))
    );
}

/// A follower driven by hand in virtual time: woken at each of its timeouts up to `to`,
/// each call it asks for answered by `dial` (the connection, and whether it connects).
fn wake_until(
    f: &mut Follower,
    to: Time,
    events: &mut Vec<(Time, Event)>,
    mut dial: impl FnMut(Time) -> Option<ConnId>,
) -> Time {
    let mut now = Duration::ZERO;
    while let Some(t) = f.poll_timeout().filter(|t| *t <= to) {
        now = t;
        f.handle_timeout(t);
        while let Some(x) = f.poll_transmit() {
            if x == Transmit::Dial {
                match dial(t) {
                    Some(c) => {
                        f.handle(t, Input::Dialed(c));
                        f.handle(t, Input::Connected(c));
                    }
                    None => f.handle(t, Input::DialFailed),
                }
            }
        }
        while let Some(e) = f.poll_event() {
            events.push((t, e));
        }
    }
    now.max(to)
}

fn word_of_run(since_ms: u64) -> Follow {
    Follow {
        since_ms,
        ..Follow::default()
    }
}

/// Following run `since_ms` on FOLLOW_CONN at time 0, its first word heard.
fn following(since_ms: u64) -> Follower {
    let mut f = Follower::new(timers(), nodes(), Duration::ZERO);
    f.handle_timeout(Duration::ZERO);
    assert_eq!(f.poll_transmit(), Some(Transmit::Dial));
    f.handle(Duration::ZERO, Input::Dialed(FOLLOW_CONN));
    f.handle(Duration::ZERO, Input::Connected(FOLLOW_CONN));
    f.handle(
        Duration::ZERO,
        Input::Word(FOLLOW_CONN, word_of_run(since_ms)),
    );
    while f.poll_event().is_some() {}
    f
}

/// Following run 111, its connection closed at 500 ms with no node gone.
fn lost_at_500() -> Follower {
    let mut f = following(111);
    f.handle(ms(500), Input::Closed(FOLLOW_CONN));
    f
}

fn took_over(events: &[(Time, Event)]) -> bool {
    events
        .iter()
        .any(|(_, e)| matches!(e, Event::TakeOver { .. }))
}

/// CI's two-fault case (issue 66's kind): the EVM killed, the standby took over, and the
/// new standby `evb up` started called it just as run 1 ended there — its connection
/// closed and no node left the EVM (they had finished run 1 with it). The old rule took
/// the run over at the end of the wait with no node, and its "lost every node" FAILED
/// replaced the run's complete verdict. Now it calls the EVM again at the edge of the wait,
/// follows on when the EVM speaks for the same run, and never takes over.
#[test]
fn a_lost_follow_connection_that_no_node_left_is_called_again_not_taken_over() {
    let mut f = lost_at_500();
    let mut ev = Vec::new();
    let mut dials = 0;
    let end = ms(500) + WAIT.mul_f64(0.98);
    wake_until(&mut f, end, &mut ev, |_| None);
    assert!(matches!(f.stage(), Stage::Suspected { .. }), "{ev:?}");
    wake_until(&mut f, ms(500) + WAIT.mul_f64(1.02), &mut ev, |_| {
        dials += 1;
        Some(ConnId(8))
    });
    assert!(ev
        .iter()
        .any(|(t, e)| *e == Event::Recalling && *t == ms(500) + WAIT));
    assert_eq!(dials, 1, "called again once the wait passed");
    assert!(matches!(f.stage(), Stage::Following { conn, .. } if *conn == ConnId(8)));
    // the same run's word: followed on, nothing taken over
    f.handle(ms(3600), Input::Word(ConnId(8), word_of_run(111)));
    let mut ev2 = Vec::new();
    let t = ms(3600);
    for k in 1..100 {
        f.handle(t + HB * k, Input::Heard(ConnId(8)));
        wake_until(&mut f, t + HB * k, &mut ev2, |_| None);
    }
    ev.extend(ev2);
    assert!(!took_over(&ev), "{ev:?}");
    assert!(matches!(f.stage(), Stage::Following { .. }));
}

/// Called again, the active EVM speaks for another run (`evb up`'s next one): the run
/// followed ended there, and the standby ends with it.
#[test]
fn an_evm_called_again_that_is_in_another_run_ended_the_one_followed() {
    let mut f = lost_at_500();
    let mut ev = Vec::new();
    wake_until(&mut f, ms(500) + WAIT, &mut ev, |_| Some(ConnId(9)));
    f.handle(ms(3600), Input::Word(ConnId(9), word_of_run(222)));
    ev.extend(std::iter::from_fn(|| f.poll_event()).map(|e| (ms(3600), e)));
    assert!(ev
        .iter()
        .any(|(_, e)| *e == Event::Over { elsewhere: true }));
    assert_eq!(f.stage(), &Stage::Over);
    assert_eq!(f.poll_timeout(), None);
    // a node that calls afterwards decides nothing
    f.handle(ms(4000), resync(NodeRef::Ru(0)));
    assert!(!f.decided());
}

/// The active EVM out of reach after its connection closed, and no node ever left it: the
/// standby ends (its run never was its own) just after the connect timeout since the
/// loss, not just before, and never takes over.
#[test]
fn an_evm_out_of_reach_that_no_node_left_is_abandoned_just_after_the_connect_timeout() {
    let mut f = lost_at_500();
    let mut ev = Vec::new();
    let mut dials = 0;
    wake_until(&mut f, ms(500) + CONNECT.mul_f64(0.98), &mut ev, |_| {
        dials += 1;
        None
    });
    assert!(!ev.iter().any(|(_, e)| *e == Event::Abandoned), "{ev:?}");
    assert!(dials > 20, "{dials} calls");
    wake_until(&mut f, ms(500) + CONNECT.mul_f64(1.02), &mut ev, |_| None);
    let at = ev
        .iter()
        .find(|(_, e)| *e == Event::Abandoned)
        .map(|(t, _)| *t)
        .expect("abandoned by 1.02 × the connect timeout");
    assert!(
        at > ms(500) + CONNECT && at < ms(500) + CONNECT + ms(201),
        "{at:?}"
    );
    assert!(!took_over(&ev));
    assert_eq!(f.stage(), &Stage::Ended);
}

/// While the standby calls the lost EVM again, a node that left it (one starved past the
/// wait) calls: that decides the takeover, which waits for the others until its own wait.
#[test]
fn a_node_that_leaves_while_the_evm_is_called_again_decides_the_takeover() {
    let mut f = lost_at_500();
    let mut ev = Vec::new();
    wake_until(&mut f, ms(5000), &mut ev, |_| None);
    assert!(ev.iter().any(|(_, e)| *e == Event::Recalling));
    assert!(!f.decided());
    f.handle(ms(5000), resync(NodeRef::Ru(0)));
    assert!(f.decided(), "{:?}", f.stage());
    f.handle(ms(5100), resync(NodeRef::Ru(1)));
    wake_until(&mut f, ms(5000) + WAIT.mul_f64(0.98), &mut ev, |_| None);
    assert!(!took_over(&ev), "bu0 is awaited");
    wake_until(&mut f, ms(5000) + WAIT.mul_f64(1.02), &mut ev, |_| None);
    let answered = ev.iter().find_map(|(_, e)| match e {
        Event::TakeOver { answered, .. } => Some(*answered),
        _ => None,
    });
    assert_eq!(answered, Some(2));
}

//! The BU's sink queue: events offered to the sink for a share of each pass; a busy sink
//! keeps them, and their credits (back-pressure). It also holds a Stop until the sink's
//! output is complete.

use evb_builder::{Bu, Sink};

use super::*;

/// Events offered to the sink at once ([`evb_builder::Sink::deliver_run`]), between two
/// looks at the clock.
const SINK_RUN: usize = 16;

/// Most of one loop pass spent handing events to the sink.
const SINK_SHARE_OF_PASS: Duration = Duration::from_millis(20);

/// Built events on their way to a BU's sink, and what the driver knows of the sink's state.
pub(super) struct SinkQueue {
    /// Built events waiting for the sink (it was busy).
    queue: VecDeque<BuiltEvent>,
    /// Events a joined BU built and holds as spans for the sink (`Bu::deliver_spans`), as
    /// of the last look.
    spans_queued: u64,
    retry_at: Option<Instant>,
    blocked: Option<String>,
    stalls: u64,
    /// Until when this pass may hand events to the sink.
    pass_until: Instant,
    /// A BU's Stop, held while its sink still has output to complete (a serve sink's
    /// consumers acknowledging), until `sink.drain_timeout()` after it came.
    deferred_stop: Option<(NodeRef, Message)>,
    stop_waits_from: Option<Instant>,
    /// A committing sink in a run with a standby EVM: what a resync must say of it.
    track: Option<CommitTrack>,
}

/// A committing sink's state as a standby EVM needs it (docs/standby.md): accepted events
/// in no part yet, parts sent as Commit and not published, recently committed parts.
#[derive(Default)]
struct CommitTrack {
    accepted: IdRanges,
    parts: std::collections::BTreeMap<u32, Vec<(u64, u32)>>,
    committed: VecDeque<(u64, u32)>,
}

/// Sets of event ids kept as disjoint, non-touching ranges (start → end, exclusive): a BU
/// accepts and commits events in runs, so a set of a million ids is a handful of entries.
#[derive(Default)]
struct IdRanges(std::collections::BTreeMap<u64, u64>);

impl IdRanges {
    fn insert(&mut self, mut first: u64, mut end: u64) {
        if first >= end {
            return;
        }
        if let Some((&s, &e)) = self.0.range(..=first).next_back() {
            if e >= first {
                first = s;
                end = end.max(e);
            }
        }
        let touched: Vec<u64> = self.0.range(first..=end).map(|(&s, _)| s).collect();
        for s in touched {
            if let Some(e) = self.0.remove(&s) {
                end = end.max(e);
            }
        }
        self.0.insert(first, end);
    }

    fn remove(&mut self, first: u64, end: u64) {
        if first >= end {
            return;
        }
        if let Some((&s, &e)) = self.0.range(..first).next_back() {
            if e > first {
                self.0.insert(s, first);
                if e > end {
                    self.0.insert(end, e);
                    return;
                }
            }
        }
        let inside: Vec<u64> = self.0.range(first..end).map(|(&s, _)| s).collect();
        for s in inside {
            if let Some(e) = self.0.remove(&s) {
                if e > end {
                    self.0.insert(end, e);
                }
            }
        }
    }

    /// The ranges, as (first, count) with counts that fit the wire's u32.
    fn ranges(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.0.iter().flat_map(|(&s, &e)| {
            let step = u32::MAX as u64;
            (s..e)
                .step_by(step as usize)
                .map(move |f| (f, (e - f).min(step) as u32))
        })
    }
}

/// Committed ranges remembered for a resync (the newest; older ones the RUs have released).
const COMMITTED_KEPT: usize = 4096;

impl SinkQueue {
    pub(super) fn new(now: Instant) -> SinkQueue {
        SinkQueue {
            queue: VecDeque::new(),
            spans_queued: 0,
            retry_at: None,
            blocked: None,
            stalls: 0,
            pass_until: now,
            deferred_stop: None,
            stop_waits_from: None,
            track: None,
        }
    }

    /// Keeps what a resync needs of a committing sink (a run with a standby EVM).
    pub(super) fn track_commits(&mut self) {
        self.track = Some(CommitTrack::default());
    }

    /// The EVM accepted `r` (see [`CommitTrack`]).
    pub(super) fn tracked_accept(&mut self, first: u64, count: u32) {
        if let Some(t) = &mut self.track {
            t.accepted.insert(first, first + count as u64);
        }
    }

    /// A committing sink's state, into a BU's resync.
    pub(super) fn fill_resync(&self, r: &mut evb_builder::BuResync) {
        let Some(t) = &self.track else {
            return;
        };
        let bu = r.bu;
        let range = |&(first, count): &(u64, u32)| evb_wire::EventRange { bu, first, count };
        r.accepted = t.accepted.ranges().map(|r| range(&r)).collect();
        r.parts = t
            .parts
            .iter()
            .map(|(p, rs)| (*p, rs.iter().map(range).collect()))
            .collect();
        r.committed = t.committed.iter().map(range).collect();
    }

    /// A loop pass begins: the sink may take events for a share of it.
    #[inline]
    pub(super) fn begin_pass(&mut self, now: Instant) {
        self.pass_until = now + SINK_SHARE_OF_PASS;
    }

    /// The events `b` built since the last call, for the sink; whether there were any (a
    /// joined BU's new spans count, those a busy sink left do not).
    #[inline]
    pub(super) fn take_built(&mut self, b: &mut Bu) -> bool {
        let queued = b.spans_queued();
        let fresh = queued > self.spans_queued;
        self.spans_queued = queued;
        b.move_built(&mut self.queue) || fresh
    }

    /// Events are waiting and the sink may be offered them now.
    #[inline]
    pub(super) fn has_work(&self) -> bool {
        (self.spans_queued > 0 || !self.queue.is_empty()) && self.retry_at.is_none()
    }

    /// When a busy sink is to be offered its events again.
    pub(super) fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// The sink could not complete output the builder accepted (it tries again later).
    pub(super) fn accept_failed(&mut self, me: &str, why: &str) {
        if self.blocked.is_none() {
            warn!(node = %me, "sink cannot complete a file yet: {why}");
        }
        self.stalls += 1;
    }

    /// Holds the BU's Stop until the sink's output is complete (see [`SinkQueue::try_stop`]).
    pub(super) fn hold_stop(&mut self, now: Instant, from: NodeRef, stop: Message) {
        self.deferred_stop = Some((from, stop));
        self.stop_waits_from = Some(now);
    }

    /// Offers queued events to the sink. A busy sink keeps them (and so the BU's credits)
    /// until a retry succeeds: back-pressure instead of loss.
    pub(super) fn drain(&mut self, now: Instant, me: &str, b: &mut Bu, sink: &mut dyn Sink) {
        if self.retry_at.is_some_and(|t| now < t) {
            return;
        }
        self.retry_at = None;
        // the join's spans first: events built as spans come before any built as events (a
        // BU's join ends once, making what it holds into events behind them)
        let held = b.spans_queued();
        let spans = b.deliver_spans(sink);
        self.spans_queued = b.spans_queued();
        if self.spans_queued < held {
            if let Some(why) = self.blocked.take() {
                info!(node = %me, "sink accepts events again (was: {why})");
            }
        }
        if let Err(e) = spans {
            self.refused(now, me, b, sink, e);
            return;
        }
        while !self.queue.is_empty() {
            // A slow sink gets a share of each pass, not all of it: the loop must go on
            // reading its sockets and sending heartbeats, or a slow node is taken for dead.
            // The clock is read once per run of events (a read per event was a visible
            // share of a small-event run, where the discard sink takes millions a second).
            if Instant::now() >= self.pass_until {
                break;
            }
            let news = sink.busy_is_news();
            let (front, _) = self.queue.as_slices();
            let (taken, result) = sink.deliver_run(&front[..front.len().min(SINK_RUN)]);
            if taken > 0 {
                if let Some(why) = self.blocked.take().filter(|_| news) {
                    info!(node = %me, "sink accepts events again (was: {why})");
                }
                for ev in self.queue.drain(..taken) {
                    b.delivered(ev.event_id, ev.bytes);
                    b.recycle(ev.fragments);
                }
            }
            match result {
                Ok(()) if taken == 0 => break,
                Ok(()) => {}
                Err(e) => {
                    self.refused(now, me, b, sink, e);
                    break;
                }
            }
        }
    }

    /// The sink refused what it was offered: busy (offered again after its retry time, the
    /// events and their credits held meanwhile), or failed (the BU leaves the run).
    fn refused(&mut self, now: Instant, me: &str, b: &mut Bu, sink: &mut dyn Sink, e: SinkError) {
        match e {
            SinkError::Busy(why) => {
                // asked after the call: the sink says whether this refusal is news
                if self.blocked.is_none() && sink.busy_is_news() {
                    warn!(
                        node = %me,
                        "sink blocked, holding {} events and their credits: {why}",
                        self.queue.len() as u64 + self.spans_queued
                    );
                }
                self.stalls += 1;
                self.blocked = Some(why);
                self.retry_at = Some(now + sink.retry_after());
            }
            SinkError::Fatal(why) => {
                error!(node = %me, "sink failed: {why}");
                b.fail(format!("sink failed: {why}"));
                self.queue.clear();
            }
        }
    }

    /// A sink that commits its output: parts it made durable go to the EVM as Commits.
    /// A part that cannot be made durable yet (a full disk) is tried again next pass; its
    /// events stay with the RUs meanwhile.
    pub(super) fn commit(&mut self, now: Instant, me: &str, b: &mut Bu, sink: &mut dyn Sink) {
        if !sink.commits() {
            return;
        }
        for part in sink.published() {
            self.part_out(part, b);
        }
        match sink.prepare(now) {
            Ok(parts) => {
                for p in parts {
                    if let Some(t) = &mut self.track {
                        for &(first, count) in &p.ranges {
                            t.accepted.remove(first, first + count as u64);
                        }
                        t.parts.insert(p.part, p.ranges.clone());
                    }
                    b.commit(p.part, &p.ranges);
                }
            }
            Err(SinkError::Busy(why)) => self.accept_failed(me, &why),
            Err(SinkError::Fatal(why)) => {
                error!(node = %me, "sink failed: {why}");
                b.fail(format!("sink failed: {why}"));
            }
        }
    }

    /// The EVM committed `part`: the sink publishes it. A rename that fails is the sink's to
    /// try again (at the latest when the run ends); the part's events are final already.
    pub(super) fn publish(&mut self, me: &str, part: u32, b: &mut Bu, sink: &mut dyn Sink) {
        match sink.publish(part) {
            // a sink that publishes on a thread says when, through `Sink::published`
            Ok(()) if sink.publishes_later() => {}
            Ok(()) => self.part_out(part, b),
            Err(SinkError::Busy(why)) => self.accept_failed(me, &why),
            Err(SinkError::Fatal(why)) => {
                error!(node = %me, "sink failed: {why}");
                b.fail(format!("sink failed: {why}"));
            }
        }
    }

    /// `part` is published: the EVM hears it, and the resync record moves its ranges.
    fn part_out(&mut self, part: u32, b: &mut Bu) {
        if let Some(t) = &mut self.track {
            if let Some(ranges) = t.parts.remove(&part) {
                t.committed.extend(ranges);
                while t.committed.len() > COMMITTED_KEPT {
                    t.committed.pop_front();
                }
            }
        }
        b.published(part)
    }

    /// Hands a held Stop to the BU once its sink's output is complete or the drain time is
    /// up; what the sink could not output by then is counted lost in the BU's report.
    pub(super) fn try_stop(&mut self, now: Instant, b: &mut Bu, sink: &mut dyn Sink) {
        let Some(since) = self.stop_waits_from else {
            return;
        };
        let left = sink.outstanding();
        if left > 0 && now.duration_since(since) < sink.drain_timeout() {
            if self.blocked.is_none() {
                self.blocked = Some(format!(
                    "run stopping: waiting for the sink to output {left} events"
                ));
            }
            return;
        }
        let Some((from, stop)) = self.deferred_stop.take() else {
            return;
        };
        self.stop_waits_from = None;
        let lost = sink.close_output();
        if lost > 0 {
            b.set_output_lost(lost);
        }
        self.blocked = None;
        b.handle(now, from, stop);
    }

    /// The sink's part of the BU's status line.
    pub(super) fn status(&self, sink: &dyn Sink) -> evb_builder::SinkStatus {
        evb_builder::SinkStatus {
            kind: sink.name().to_string(),
            report: sink.report(),
            blocked: self.blocked.clone(),
            queued: self.queue.len() as u64 + self.spans_queued,
            stalls: self.stalls,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::IdRanges;
    use super::SinkQueue;
    use evb_buffers::Chain;
    use evb_builder::{Bu, BuConfig, BuiltEvent, NodeRef, Sink, SinkError, Verify};
    use evb_wire::{EventRange, FragmentHeader, Message};
    use std::time::{Duration, Instant};

    /// Takes spans, or is busy.
    #[derive(Default)]
    struct Spans {
        busy: bool,
        ids: Vec<u64>,
    }

    impl Sink for Spans {
        fn deliver(&mut self, e: &BuiltEvent) -> Result<(), SinkError> {
            self.deliver_span(e.event_id, 1, e.bytes)
        }
        fn takes_spans(&self) -> bool {
            true
        }
        fn deliver_span(&mut self, first: u64, count: u32, _bytes: u64) -> Result<(), SinkError> {
            if self.busy {
                return Err(SinkError::Busy("full".into()));
            }
            self.ids.extend(first..first + count as u64);
            Ok(())
        }
        fn accepted(&mut self, _first: u64, _count: u32) -> Result<(), SinkError> {
            Ok(())
        }
        fn finish(&mut self) -> Result<(), SinkError> {
            Ok(())
        }
        fn name(&self) -> &'static str {
            "spans"
        }
    }

    /// A joined BU's spans go to the sink; a busy sink keeps them (and counts them queued)
    /// without the driver's loop taking them for new work again, and gets them after its
    /// retry time, in order.
    #[test]
    fn spans_wait_for_a_busy_sink_and_go_in_order() {
        let t0 = Instant::now();
        let mut b = Bu::new(BuConfig {
            index: 0,
            source_ids: vec![7],
            credits: 64,
            verify: Verify::Headers,
            generator: None,
            slices: None,
            duplicate_window: 1024,
        });
        b.set_join(true);
        b.handle(t0, NodeRef::Evm, Message::Start);
        let build = |b: &mut Bu, first: u64, count: u32| {
            let r = EventRange {
                bu: 0,
                first,
                count,
            };
            b.handle(t0, NodeRef::Evm, Message::Assign(r, 0));
            let fragment = |id: u64| {
                let h = FragmentHeader {
                    event_id: id,
                    trigger_number: id as u32,
                    source_id: 7,
                    flags: 0,
                    payload_size: 0,
                    payload_crc: 0,
                };
                (h, Chain::new())
            };
            b.handle_fragments(
                t0,
                NodeRef::Ru(0),
                (first..first + count as u64).map(fragment),
            );
        };
        let mut q = SinkQueue::new(t0);
        let mut sink = Spans {
            busy: true,
            ..Spans::default()
        };
        build(&mut b, 0, 3);
        assert!(q.take_built(&mut b), "three events built");
        q.begin_pass(t0);
        q.drain(t0, "bu0", &mut b, &mut sink);
        assert!(sink.ids.is_empty(), "the sink was busy");
        assert_eq!(q.status(&sink).queued, 3);
        assert!(q.blocked.is_some() && q.retry_at().is_some());
        assert!(!q.take_built(&mut b), "nothing new: the driver's loop ends");
        assert!(!q.has_work(), "waiting for the retry");
        build(&mut b, 5, 2);
        assert!(q.take_built(&mut b), "two more built");
        let later = q.retry_at().unwrap() + Duration::from_millis(1);
        sink.busy = false;
        q.begin_pass(later);
        q.drain(later, "bu0", &mut b, &mut sink);
        assert_eq!(sink.ids, [0, 1, 2, 5, 6]);
        assert_eq!((q.status(&sink).queued, q.has_work()), (0, false));
        assert!(q.blocked.is_none(), "the sink took them: no longer blocked");
        assert_eq!(b.stats().errors, 0);
    }

    fn all(r: &IdRanges) -> Vec<(u64, u32)> {
        r.ranges().collect()
    }

    #[test]
    fn id_ranges_merge_split_and_match_a_plain_set() {
        let mut r = IdRanges::default();
        r.insert(10, 20);
        r.insert(20, 25); // touching: one range
        r.insert(5, 8);
        assert_eq!(all(&r), vec![(5, 3), (10, 15)]);
        r.remove(12, 14); // a hole
        assert_eq!(all(&r), vec![(5, 3), (10, 2), (14, 11)]);
        r.insert(7, 11); // bridges two
        assert_eq!(all(&r), vec![(5, 7), (14, 11)]);
        r.remove(0, 100);
        assert!(all(&r).is_empty());

        // against a BTreeSet, over a seeded random sequence of inserts and removes
        let mut set = std::collections::BTreeSet::new();
        let mut x: u64 = 20261124;
        for _ in 0..5000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let a = (x >> 33) % 300;
            let n = (x >> 20) % 12;
            if (x >> 11).is_multiple_of(3) {
                r.remove(a, a + n);
                (a..a + n).for_each(|i| {
                    set.remove(&i);
                });
            } else {
                r.insert(a, a + n);
                set.extend(a..a + n);
            }
        }
        let ids: Vec<u64> = r.ranges().flat_map(|(f, c)| f..f + c as u64).collect();
        assert_eq!(ids, set.into_iter().collect::<Vec<_>>());
        // kept disjoint and not touching
        let v: Vec<_> = r.0.iter().collect();
        assert!(v.windows(2).all(|w| w[0].1 < w[1].0));
    }
}

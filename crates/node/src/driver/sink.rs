//! The BU's sink queue: events offered to the sink for a share of each pass; a busy sink
//! keeps them, and their credits (back-pressure). It also holds a Stop until the sink's
//! output is complete.

use evb_builder::{Bu, Sink};

use super::*;

/// Events offered to the sink between two looks at the clock.
const SINK_CLOCK_EVERY: u32 = 16;

/// Most of one loop pass spent handing events to the sink.
const SINK_SHARE_OF_PASS: Duration = Duration::from_millis(20);

/// Built events on their way to a BU's sink, and what the driver knows of the sink's state.
pub(super) struct SinkQueue {
    /// Built events waiting for the sink (it was busy).
    queue: VecDeque<BuiltEvent>,
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
    accepted: std::collections::BTreeSet<u64>,
    parts: std::collections::BTreeMap<u32, Vec<(u64, u32)>>,
    committed: VecDeque<(u64, u32)>,
}

/// Committed ranges remembered for a resync (the newest; older ones the RUs have released).
const COMMITTED_KEPT: usize = 4096;

impl SinkQueue {
    pub(super) fn new(now: Instant) -> SinkQueue {
        SinkQueue {
            queue: VecDeque::new(),
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
            t.accepted.extend(first..first + count as u64);
        }
    }

    /// A committing sink's state, into a BU's resync.
    pub(super) fn fill_resync(&self, r: &mut evb_builder::BuResync) {
        let Some(t) = &self.track else {
            return;
        };
        let bu = r.bu;
        let range = |&(first, count): &(u64, u32)| evb_wire::EventRange { bu, first, count };
        r.accepted.clear();
        for &id in &t.accepted {
            match r.accepted.last_mut() {
                Some(l) if l.end() == id && l.count < u32::MAX => l.count += 1,
                _ => r.accepted.push(evb_wire::EventRange {
                    bu,
                    first: id,
                    count: 1,
                }),
            }
        }
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

    /// A built event, for the sink.
    #[inline]
    pub(super) fn push(&mut self, ev: BuiltEvent) {
        self.queue.push_back(ev);
    }

    /// Events are waiting and the sink may be offered them now.
    #[inline]
    pub(super) fn has_work(&self) -> bool {
        !self.queue.is_empty() && self.retry_at.is_none()
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
        let mut offered = 0u32;
        while let Some(ev) = self.queue.front() {
            // A slow sink gets a share of each pass, not all of it: the loop must go on
            // reading its sockets and sending heartbeats, or a slow node is taken for dead.
            // The clock is read every few events (a read per event was a visible share of a
            // small-event run, where the discard sink takes millions a second).
            if offered.is_multiple_of(SINK_CLOCK_EVERY) && Instant::now() >= self.pass_until {
                break;
            }
            offered = offered.wrapping_add(1);
            let news = sink.busy_is_news();
            match sink.deliver(ev) {
                Ok(()) => {
                    if let Some(why) = self.blocked.take().filter(|_| news) {
                        info!(node = %me, "sink accepts events again (was: {why})");
                    }
                    let ev = self.queue.pop_front().expect("front exists");
                    b.delivered(ev.event_id, ev.bytes);
                    b.recycle(ev.fragments);
                }
                Err(SinkError::Busy(why)) => {
                    if self.blocked.is_none() && news {
                        warn!(
                            node = %me,
                            "sink blocked, holding {} events and their credits: {why}",
                            self.queue.len()
                        );
                    }
                    self.stalls += 1;
                    self.blocked = Some(why);
                    self.retry_at = Some(now + sink.retry_after());
                    break;
                }
                Err(SinkError::Fatal(why)) => {
                    error!(node = %me, "sink failed: {why}");
                    b.fail(format!("sink failed: {why}"));
                    self.queue.clear();
                    break;
                }
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
        match sink.prepare(now) {
            Ok(parts) => {
                for p in parts {
                    if let Some(t) = &mut self.track {
                        for &(first, count) in &p.ranges {
                            for id in first..first + count as u64 {
                                t.accepted.remove(&id);
                            }
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
            Ok(()) => {
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
            Err(SinkError::Busy(why)) => self.accept_failed(me, &why),
            Err(SinkError::Fatal(why)) => {
                error!(node = %me, "sink failed: {why}");
                b.fail(format!("sink failed: {why}"));
            }
        }
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
                    "run stopping: waiting for consumers to acknowledge {left} events"
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
            queued: self.queue.len() as u64,
            stalls: self.stalls,
        }
    }
}

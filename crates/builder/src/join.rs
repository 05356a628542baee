//! The BU's join: while events come regularly, an event needs no record and no object of its
//! own. Each RU sends a BU the fragments of the events assigned to it in id order, and the
//! EVM assigns a BU its events in ascending ranges; so an RU's fragments queue up in a lane
//! of their own (the pages its connection brought them in, moved in whole: `pages.rs`), the
//! assignments in a queue of ranges, and the oldest assigned event is complete when every
//! lane's next fragment is its fragment. Building it moves nothing: the event is the next
//! place of every lane, counted as built (the lane's split moves past it), and a sink that
//! takes spans ([`crate::Sink::deliver_span`]) takes runs of built events as id ranges; then
//! the lanes drop their fronts. Every touch of memory is at a queue's head, its tail or its
//! split.
//!
//! Anything irregular (a fragment behind its lane's last, one that failed a check, a place
//! that is another event's, flags or trigger numbers that differ, an Assign behind the last
//! one, a source lost, a standby EVM's resync, the stop, a fragment waiting 10 s) ends the
//! join for the rest of the run: the BU makes what the lanes hold into records as it would
//! have filed it (built events into events for the sink), and the records take every case as
//! they always did. The join only knows its queues; the BU does the rest.
//!
//! One idea, one file: the lanes and the assignments of the regular case.

use std::collections::VecDeque;
use std::time::Instant;

use evb_buffers::Chain;
use evb_wire::{FragmentHeader, FLAG_MISSING, FLAG_SYNC_LOSS};

use crate::pages::Pages;

/// A fragment checked and found good, in its RU's lane.
pub(crate) type Filed = (FragmentHeader, Chain);

/// One RU's fragments for this BU, in id order: first those of built events (at the sink,
/// before the split), then those waiting for their event's other fragments or its Assign.
#[derive(Default)]
pub(crate) struct Lane {
    pub places: Pages<Filed>,
    /// When the lane's fragments came: (the first id that came at that moment, the
    /// moment), one entry per pass rather than one per fragment.
    pub times: VecDeque<(u64, Instant)>,
    /// The newest id this lane took: the next must be higher.
    pub last: Option<u64>,
    /// Fragments at the back of the queue whose events are not assigned yet.
    pub unassigned: usize,
}

impl Lane {
    /// When fragment `id` came (it is in the lane, at or after its first unbuilt place);
    /// forgets the moments before it.
    #[inline(always)]
    pub fn time_of(&mut self, id: u64) -> Instant {
        while self.times.len() > 1 && self.times[1].0 <= id {
            self.times.pop_front();
        }
        self.times
            .front()
            .expect("a fragment came at some moment")
            .1
    }

    /// When fragment `id` came, without forgetting anything.
    fn peek_time_of(&self, id: u64) -> Option<Instant> {
        self.times
            .iter()
            .rev()
            .find(|&&(first, _)| first <= id)
            .map(|&(_, at)| at)
    }
}

/// Assigned events not built yet: `first..end`, assigned at `at`.
pub(crate) struct Pending {
    pub first: u64,
    pub end: u64,
    pub at: Instant,
}

/// Built events at the sink: ids `first..first + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub first: u64,
    pub count: u32,
    pub bytes: u64,
}

/// What the lanes say about the oldest assigned event.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Every lane's next place is its fragment, and they agree: built (`bytes` of payload,
    /// its first piece at `since`).
    Built { id: u64, bytes: u64, since: Instant },
    /// Nothing assigned, or a lane has nothing yet: wait.
    Waiting,
    /// A lane's next place is another event's, or the fragments disagree: not the regular
    /// case.
    Irregular,
}

pub(crate) struct Join {
    pub lanes: Vec<Lane>,
    pub assigned: VecDeque<Pending>,
    /// One past the newest event assigned (`None`: none yet).
    pub assigned_end: Option<u64>,
    /// Events assigned and not built.
    pub pending: u64,
    /// Events built and at the sink: the first `built` places of every lane.
    pub built: usize,
    /// The built events as runs of consecutive ids, oldest first.
    pub spans: VecDeque<Span>,
    /// Each built event's payload bytes, oldest first (they count when the EVM echoes it).
    pub bytes: VecDeque<u64>,
    /// The newest time any piece came with (for completions when the join ends).
    pub latest: Option<Instant>,
    /// The most unassigned fragments any lane holds (kept as they come, found again at
    /// each Assign: not a pass over every lane at every fragment).
    most_unassigned: usize,
}

impl Join {
    pub fn new(rus: usize) -> Join {
        Join {
            lanes: (0..rus).map(|_| Lane::default()).collect(),
            assigned: VecDeque::new(),
            assigned_end: None,
            pending: 0,
            built: 0,
            spans: VecDeque::new(),
            bytes: VecDeque::new(),
            latest: None,
            most_unassigned: 0,
        }
    }

    /// Whether RU `ru`'s fragment for `id` is the regular next one of its lane.
    #[inline(always)]
    pub fn takes(&self, ru: usize, id: u64) -> bool {
        rises(self.lanes[ru].last, id)
    }

    /// Queues a fragment [`Join::takes`] accepted, arrived at `at`; returns whether its event
    /// is unassigned.
    #[inline(always)]
    pub fn push(&mut self, ru: usize, f: Filed, at: Instant) -> bool {
        let id = f.0.event_id;
        let unassigned = self.assigned_end.is_none_or(|end| id >= end);
        self.came(ru, id, id, unassigned as usize, at);
        self.lanes[ru].places.push(f);
        unassigned
    }

    /// Queues a page of fragments from RU `ru`, arrived at `at`, moved in whole: their ids
    /// rise, and [`Join::takes`] accepts the first (see [`Join::takes_page`]). Returns
    /// whether any of their events is unassigned.
    pub fn push_page(&mut self, ru: usize, page: Vec<Filed>, at: Instant) -> bool {
        let (Some(first), Some(last)) = (page.first(), page.last()) else {
            return false;
        };
        let (first, last) = (first.0.event_id, last.0.event_id);
        let unassigned = match self.assigned_end {
            None => page.len(),
            Some(end) => page.len() - page.partition_point(|f| f.0.event_id < end),
        };
        self.came(ru, first, last, unassigned, at);
        self.lanes[ru].places.push_page(page);
        unassigned > 0
    }

    /// Whether a page of fragments from RU `ru` can go in whole: each id above the one
    /// before it, the first above the lane's last, and `ok` for each (one pass over it).
    #[inline(always)]
    pub fn takes_page(
        &self,
        ru: usize,
        page: &[Filed],
        mut ok: impl FnMut(&Filed) -> bool,
    ) -> bool {
        let mut last = self.lanes[ru].last;
        page.iter().all(|f| {
            let id = f.0.event_id;
            let up = rises(last, id);
            last = Some(id);
            up && ok(f)
        })
    }

    /// Fragments `first..=last` of RU `ru` came at `at`, `unassigned` of them for events
    /// not assigned yet: the lane's times, last id and counts.
    #[inline(always)]
    fn came(&mut self, ru: usize, first: u64, last: u64, unassigned: usize, at: Instant) {
        let lane = &mut self.lanes[ru];
        if lane.times.back().is_none_or(|&(_, t)| t != at) {
            lane.times.push_back((first, at));
        }
        lane.last = Some(last);
        lane.unassigned += unassigned;
        self.most_unassigned = self.most_unassigned.max(lane.unassigned);
    }

    /// Whether an Assign from `first` is the regular next one (not behind the last).
    pub fn takes_assign(&self, first: u64) -> bool {
        self.assigned_end.is_none_or(|end| first >= end)
    }

    /// Queues an Assign [`Join::takes_assign`] accepted.
    pub fn assign(&mut self, first: u64, end: u64, at: Instant) {
        if end <= first {
            return;
        }
        self.assigned.push_back(Pending { first, end, at });
        self.assigned_end = Some(end);
        self.pending += end - first;
        self.latest = Some(self.latest.map_or(at, |l| l.max(at)));
        self.most_unassigned = 0;
        for lane in &mut self.lanes {
            // the lane's unassigned fragments are its last ones, in id order
            while lane.unassigned > 0
                && lane
                    .places
                    .nth_back(lane.unassigned - 1)
                    .is_some_and(|f| f.0.event_id < end)
            {
                lane.unassigned -= 1;
            }
            self.most_unassigned = self.most_unassigned.max(lane.unassigned);
        }
    }

    /// Events held: built and at the sink, assigned and not built, and the most any lane
    /// holds unassigned.
    pub fn held(&self) -> u64 {
        self.built as u64 + self.pending + self.most_unassigned as u64
    }

    /// Builds the oldest assigned event if every lane's next place is its fragment and the
    /// fragments agree (trigger numbers, no MISSING or sync-loss flag).
    #[inline(always)]
    pub fn build_next(&mut self) -> Next {
        let Some(p) = self.assigned.front() else {
            return Next::Waiting;
        };
        let (id, mut since) = (p.first, p.at);
        let mut bytes = 0u64;
        let mut trigger = None;
        for lane in &self.lanes {
            match lane.places.after_split() {
                None => return Next::Waiting,
                Some((h, payload)) => {
                    let odd = h.flags & (FLAG_MISSING | FLAG_SYNC_LOSS) != 0;
                    if h.event_id != id
                        || odd
                        || *trigger.get_or_insert(h.trigger_number) != h.trigger_number
                    {
                        return Next::Irregular;
                    }
                    bytes += payload.len() as u64;
                }
            }
        }
        for lane in &mut self.lanes {
            since = since.min(lane.time_of(id));
            lane.places.advance_split();
        }
        let p = self.assigned.front_mut().expect("looked at above");
        p.first += 1;
        if p.first == p.end {
            self.assigned.pop_front();
        }
        self.pending -= 1;
        self.built += 1;
        self.bytes.push_back(bytes);
        match self.spans.back_mut() {
            Some(s) if s.first + s.count as u64 == id && s.count < u32::MAX => {
                s.count += 1;
                s.bytes += bytes;
            }
            _ => self.spans.push_back(Span {
                first: id,
                count: 1,
                bytes,
            }),
        }
        Next::Built { id, bytes, since }
    }

    /// The oldest span went to the sink: its events leave the lanes (their blocks go back
    /// to the pool), each given to `each` with its bytes, oldest first. Returns the span.
    pub fn delivered_span(&mut self, mut each: impl FnMut(u64, u64)) -> Option<Span> {
        let s = self.spans.pop_front()?;
        let n = s.count as usize;
        for lane in &mut self.lanes {
            lane.places.drop_front(n);
        }
        self.built -= n;
        for (id, bytes) in (s.first..).zip(self.bytes.drain(..n)) {
            each(id, bytes);
        }
        Some(s)
    }

    /// A fragment not yet built came before `t` (nothing regular waits that long).
    pub fn holds_older_than(&self, t: Instant) -> bool {
        self.lanes.iter().any(|l| {
            l.places
                .after_split()
                .and_then(|f| l.peek_time_of(f.0.event_id))
                .is_some_and(|at| at < t)
        })
    }
}

/// The join's one rule for a lane: an RU's fragments come with rising event ids, so a
/// fragment is regular when its id is above the last one its lane took (`None`: none yet).
#[inline(always)]
fn rises(last: Option<u64>, id: u64) -> bool {
    last.is_none_or(|l| id > l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn filed(id: u64, len: usize) -> Filed {
        let h = FragmentHeader {
            event_id: id,
            trigger_number: id as u32,
            source_id: 1,
            flags: 0,
            payload_size: len as u32,
            payload_crc: 0,
        };
        let pool = evb_buffers::Pool::new("join-test", 64, 1);
        let mut w = pool.try_alloc().expect("a fresh pool has a block");
        let mut c = Chain::new();
        if len > 0 {
            c.push(w.append(&vec![7; len]).expect("fits the block"));
        }
        (h, c)
    }

    /// Fragments before and after their Assign, over two lanes and ranges with another BU's
    /// events between them: the events are built in order, from their first piece, as spans
    /// of consecutive ids, and leave the lanes only when their span is delivered.
    #[test]
    fn lanes_join_assigned_events_in_order() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_micros(10);
        let mut j = Join::new(2);
        assert_eq!(j.build_next(), Next::Waiting, "nothing assigned");
        assert!(j.push(0, filed(4, 3), t1), "event 4 is not assigned yet");
        assert_eq!(j.held(), 1);
        j.assign(4, 6, t1);
        assert_eq!((j.lanes[0].unassigned, j.held()), (0, 2));
        assert_eq!(j.build_next(), Next::Waiting, "lane 1 has nothing");
        assert!(!j.push(1, filed(4, 5), t0));
        assert!(!j.push(0, filed(5, 1), t1) && !j.push(1, filed(5, 1), t1));
        assert!(j.takes(0, 6) && !j.takes(0, 5) && !j.takes(1, 2));
        let built = |id, bytes, since| Next::Built { id, bytes, since };
        assert_eq!(j.build_next(), built(4, 8, t0), "since its first piece");
        assert_eq!(j.build_next(), built(5, 2, t1));
        assert_eq!(
            (j.build_next(), j.pending, j.built, j.held()),
            (Next::Waiting, 0, 2, 2)
        );
        // event 8 (6, 7 went to another BU) before its Assign
        assert!(j.takes_assign(8) && !j.takes_assign(5));
        j.push(0, filed(8, 0), t1);
        j.push(1, filed(8, 0), t1);
        j.assign(8, 9, t1);
        assert_eq!(j.build_next(), built(8, 0, t1));
        let spans: Vec<Span> = j.spans.iter().copied().collect();
        let span = |first, count, bytes| Span {
            first,
            count,
            bytes,
        };
        assert_eq!(spans, [span(4, 2, 10), span(8, 1, 0)]);
        assert_eq!(
            j.lanes[0].places.len(),
            3,
            "built events stay until delivered"
        );
        let mut each = Vec::new();
        let s = j.delivered_span(|id, bytes| each.push((id, bytes)));
        assert_eq!((s, each), (Some(span(4, 2, 10)), vec![(4, 8), (5, 2)]));
        assert_eq!((j.built, j.lanes[1].places.len()), (1, 1));
        // lane 1 skips event 9
        j.push(0, filed(9, 0), t1);
        j.push(1, filed(10, 0), t1);
        j.assign(9, 11, t1);
        assert_eq!(j.build_next(), Next::Irregular, "lane 1 skipped event 9");
        assert!(j.holds_older_than(t1 + Duration::from_micros(1)));
        assert!(!j.holds_older_than(t1));
    }

    /// Fragments whose trigger numbers differ, or that their RU flagged, are not joined.
    #[test]
    fn disagreeing_or_flagged_fragments_are_irregular() {
        let t = Instant::now();
        for (k, flags, trigger) in [(0, FLAG_MISSING, 7), (1, FLAG_SYNC_LOSS, 7), (2, 0, 99)] {
            let mut j = Join::new(2);
            j.assign(7, 8, t);
            j.push(0, filed(7, 1), t);
            let (mut h, c) = filed(7, 1);
            (h.flags, h.trigger_number) = (flags, trigger);
            j.push(1, (h, c), t);
            assert_eq!(j.build_next(), Next::Irregular, "case {k}");
            assert_eq!((j.built, j.pending), (0, 1), "case {k}: nothing built");
        }
    }
}

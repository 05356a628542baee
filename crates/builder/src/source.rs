//! Data sources: where an RU's fragments come from. The generator (content derived from
//! event and source id), a recording replayed from files (loaded and validated by the node
//! before the run; this module only hands the bytes out), or a live feed (front-end streams
//! assembled as they arrive, see [`crate::assembly`]).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use evb_wire::{FragmentHeader, FLAG_GENERATED, FLAG_MISSING};

use crate::assembly::Assembled;
use crate::frames::FrameGenerator;
use crate::generator::Generator;

/// One recorded fragment: its bytes in the recording, or `None` when it was dropped as
/// invalid (it then travels as an empty fragment flagged MISSING).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub trigger_number: u32,
    pub bytes: Option<Range<usize>>,
}

/// A validated recording: fragment k is this RU's fragment of event k.
#[derive(Debug, Clone)]
pub struct Recording {
    pub data: Arc<Vec<u8>>,
    pub fragments: Vec<Recorded>,
    /// Replay from the start when the end is reached (otherwise the run ends there).
    pub looped: bool,
    /// Fragments dropped as invalid while loading.
    pub dropped: u64,
}

/// Events a live feed holds past its last announcement before it announces again while the
/// EVM still has announced events to assign (see [`LiveFeed::announcement`]).
pub const ANNOUNCE_EVERY: u64 = 64;
/// The longest an event waits to be announced while the EVM has others to assign.
pub const ANNOUNCE_AFTER: std::time::Duration = std::time::Duration::from_micros(500);

/// Events supplied as they arrive: the k-th one supplied is event k. The RU tells the EVM
/// how many it holds (`Available`), and the EVM assigns no event before it is here.
#[derive(Debug, Clone, Default)]
pub struct LiveFeed {
    queue: VecDeque<Assembled>,
    /// Event id of the front of the queue.
    next_id: u64,
    /// No more events will be supplied.
    done: bool,
    /// What the EVM was last told (count, done).
    announced: Option<(u64, bool)>,
    /// Since when the feed holds events the EVM was not told of.
    untold_since: Option<Instant>,
    /// Counters the driver keeps for the report.
    pub stats: LiveStats,
    /// Decision windows over a stream of frames (`builder.by = "window"`): the latency
    /// buffer the driver fills and the RU cuts each assigned window from. The feed then
    /// announces nothing: the EVM's decisions do not wait for data, the RU does.
    pub windows: Option<crate::window_buffer::WindowBuffer>,
}

/// What a live feed's driver reports about its streams.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LiveStats {
    pub fragments_received: u64,
    pub dropped: u64,
    pub sync_losses: u64,
    /// Streams the RU waits for, with since when (empty: none).
    pub waiting_for: Vec<String>,
    /// Fragments received and not in any event supplied (at the end: they belong to no event).
    pub unbuilt: u64,
    /// Streams that have delivered no fragment yet, named (empty: every one has).
    pub silent: Vec<String>,
    /// A stream of frames built into time slices: its latency buffer and byte account.
    pub slices: Option<crate::slice_buffer::SliceBufferStats>,
}

impl LiveFeed {
    /// The id of the next event to be made into a fragment (every one before it was).
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Events supplied so far (built or queued).
    pub fn supplied(&self) -> u64 {
        self.next_id + self.queue.len() as u64
    }

    /// Events supplied and not yet made into fragments.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Stream fragments received and not (yet) sent in an event: in the driver's hands, and
    /// in the events supplied but never assigned (the run ended first).
    pub fn unbuilt(&self) -> u64 {
        self.stats.unbuilt + self.queue.iter().map(|a| a.fragments as u64).sum::<u64>()
    }

    pub fn supply(&mut self, event: Assembled) {
        if !self.done {
            self.queue.push_back(event);
        }
    }

    /// No more events: the run ends after the ones supplied.
    pub fn finish(&mut self) {
        self.done = true;
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// `Available` for the EVM, if it changed since last told.
    /// The next [`announcement`](Self::announcement) is made even if nothing changed: a new
    /// EVM (a standby that took over) has heard none.
    pub(crate) fn announce_again(&mut self) {
        self.announced = None;
    }

    /// `Available` for the EVM, if it is due: at once when the EVM has been told nothing,
    /// the feed is done, or every event it was told of is assigned (it may be waiting);
    /// otherwise once [`ANNOUNCE_EVERY`] more events arrived or the oldest untold one is
    /// [`ANNOUNCE_AFTER`] old. An announcement per driver pass, each letting the EVM assign
    /// a few events, made the EVM's cost per event 30 times a generator run's.
    /// `assigned`: events `[0, assigned)` are assigned to this RU so far.
    pub(crate) fn announcement(&mut self, now: Instant, assigned: u64) -> Option<(u64, bool)> {
        let current = (self.supplied(), self.done);
        if self.announced == Some(current) {
            self.untold_since = None;
            return None;
        }
        let since = *self.untold_since.get_or_insert(now);
        let told = self.announced.map_or(0, |(n, _)| n);
        let due = self.announced.is_none()
            || current.1
            || assigned >= told
            || current.0.saturating_sub(told) >= ANNOUNCE_EVERY
            || now.saturating_duration_since(since) >= ANNOUNCE_AFTER;
        if !due {
            return None;
        }
        self.announced = Some(current);
        self.untold_since = None;
        Some(current)
    }

    fn front(&self, event_id: u64) -> Option<&Assembled> {
        (event_id == self.next_id)
            .then(|| self.queue.front())
            .flatten()
    }

    /// Event `event_id`'s fragment as a plug-in producer wrote it into the pool, if it did.
    pub(crate) fn written(&self, event_id: u64) -> Option<&evb_buffers::Chain> {
        self.front(event_id).and_then(|a| a.written.as_ref())
    }

    /// The front event became a fragment.
    pub(crate) fn consumed(&mut self, event_id: u64) {
        if event_id == self.next_id && self.queue.pop_front().is_some() {
            self.next_id += 1;
        }
    }
}

// One per RU, made once and never moved on the data path: a box would only add a hop.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Source {
    Generator(Generator),
    /// The generator's continuous time frames, a record being a time slice
    /// (`builder.by = "time"`).
    Frames(FrameGenerator),
    Playback(Recording),
    Live(LiveFeed),
}

/// What a source says about one fragment before it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragmentSpec {
    pub size: usize,
    pub trigger_number: u32,
    pub flags: u16,
}

impl FragmentSpec {
    /// The fragment header of this fragment of `event_id`, once its payload CRC is known.
    pub fn header(&self, event_id: u64, source_id: u16, payload_crc: u32) -> FragmentHeader {
        FragmentHeader {
            event_id,
            trigger_number: self.trigger_number,
            source_id,
            flags: self.flags,
            payload_size: self.size as u32,
            payload_crc,
        }
    }
}

impl Source {
    /// How many events this source can supply (`None`: no end).
    pub fn available(&self) -> Option<u64> {
        match self {
            Source::Generator(_) | Source::Frames(_) => None,
            Source::Playback(r) if r.looped && !r.fragments.is_empty() => None,
            Source::Playback(r) => Some(r.fragments.len() as u64),
            // announced as it arrives (`Available`)
            Source::Live(_) => None,
        }
    }

    fn recorded(r: &Recording, event_id: u64) -> Option<&Recorded> {
        let n = r.fragments.len() as u64;
        if n == 0 || (!r.looped && event_id >= n) {
            return None;
        }
        r.fragments.get((event_id % n) as usize)
    }

    pub fn spec(&self, event_id: u64, source_id: u16) -> FragmentSpec {
        match self {
            Source::Generator(g) => FragmentSpec {
                size: g.size(event_id, source_id),
                trigger_number: event_id as u32,
                flags: FLAG_GENERATED,
            },
            Source::Frames(f) => f.spec(event_id, source_id),
            Source::Playback(r) => match Self::recorded(r, event_id) {
                Some(Recorded {
                    trigger_number,
                    bytes: Some(b),
                }) => FragmentSpec {
                    size: b.len(),
                    trigger_number: *trigger_number,
                    flags: 0,
                },
                Some(Recorded {
                    trigger_number,
                    bytes: None,
                }) => FragmentSpec {
                    size: 0,
                    trigger_number: *trigger_number,
                    flags: FLAG_MISSING,
                },
                // Past the end of a recording played once: nothing to give.
                None => FragmentSpec {
                    size: 0,
                    trigger_number: event_id as u32,
                    flags: FLAG_MISSING,
                },
            },
            Source::Live(f) => match f.front(event_id) {
                Some(a) => FragmentSpec {
                    size: a.payload.len(),
                    trigger_number: a.trigger_number,
                    flags: a.flags,
                },
                // The RU checks `has_event` first; this is never sent.
                None => FragmentSpec {
                    size: 0,
                    trigger_number: event_id as u32,
                    flags: FLAG_MISSING,
                },
            },
        }
    }

    /// Writes bytes `[offset, offset + buf.len())` of the fragment into `buf`.
    pub fn fill(&self, event_id: u64, source_id: u16, offset: usize, buf: &mut [u8]) {
        match self {
            Source::Generator(g) => g.fill(event_id, source_id, offset, buf),
            Source::Frames(f) => f.fill(event_id, source_id, offset, buf),
            Source::Playback(r) => {
                if let Some(Recorded { bytes: Some(b), .. }) = Self::recorded(r, event_id) {
                    let start = b.start + offset;
                    buf.copy_from_slice(&r.data[start..start + buf.len()]);
                }
            }
            Source::Live(f) => {
                if let Some(a) = f.front(event_id) {
                    buf.copy_from_slice(&a.payload[offset..offset + buf.len()]);
                }
            }
        }
    }

    pub fn generator(&self) -> Option<&Generator> {
        match self {
            Source::Generator(g) => Some(g),
            Source::Frames(_) | Source::Playback(_) | Source::Live(_) => None,
        }
    }

    /// Whether event `event_id`'s data is here (always, except for a live feed).
    pub fn has_event(&self, event_id: u64) -> bool {
        match self {
            Source::Live(f) => f.front(event_id).is_some(),
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn supply(f: &mut LiveFeed, n: u64) {
        for _ in 0..n {
            f.supply(Assembled::default());
        }
    }

    /// A live feed tells the EVM at once what the EVM waits for (the first count, every
    /// event it was told of assigned, the end), and otherwise gathers arrivals into one
    /// announcement per ANNOUNCE_EVERY events or ANNOUNCE_AFTER.
    #[test]
    fn announcements_gather_arrivals_unless_the_evm_waits() {
        let t0 = Instant::now();
        let mut f = LiveFeed::default();
        assert_eq!(
            f.announcement(t0, 0),
            Some((0, false)),
            "the first, at once"
        );
        supply(&mut f, 1);
        assert_eq!(
            f.announcement(t0, 0),
            Some((1, false)),
            "all told is assigned"
        );
        supply(&mut f, 10);
        assert_eq!(f.announcement(t0, 0), None, "the EVM has one to assign");
        let later = t0 + ANNOUNCE_AFTER / 2;
        assert_eq!(f.announcement(later, 0), None);
        let due = t0 + ANNOUNCE_AFTER;
        assert_eq!(
            f.announcement(due, 0),
            Some((11, false)),
            "the oldest is old enough"
        );
        assert_eq!(f.announcement(due, 0), None, "nothing new");
        supply(&mut f, ANNOUNCE_EVERY - 1);
        assert_eq!(f.announcement(due, 5), None);
        supply(&mut f, 1);
        assert_eq!(
            f.announcement(due, 5),
            Some((11 + ANNOUNCE_EVERY, false)),
            "enough gathered"
        );
        supply(&mut f, 3);
        assert_eq!(
            f.announcement(due, 11 + ANNOUNCE_EVERY),
            Some((14 + ANNOUNCE_EVERY, false)),
            "the EVM assigned all it was told: it waits"
        );
        supply(&mut f, 2);
        f.finish();
        assert_eq!(
            f.announcement(due + Duration::from_nanos(1), 0),
            Some((16 + ANNOUNCE_EVERY, true)),
            "the end, at once"
        );
        f.announce_again();
        assert_eq!(f.announcement(due, 0), Some((16 + ANNOUNCE_EVERY, true)));
    }
}

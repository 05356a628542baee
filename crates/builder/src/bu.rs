//! The builder unit: asks the EVM for events with credits, collects each event's fragments
//! from every RU, checks them, hands the complete event to its sink, and releases it.
//!
//! One idea, one file: the BU's state machine (and its per-event records, which only it uses).

use std::cell::Cell;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use evb_buffers::Chain;
use evb_wire::super_fragment::{ENTRY_MISSING, ENTRY_SYNC_LOSS};
use evb_wire::{
    EventRange, FragmentHeader, Message, FLAG_GENERATED, FLAG_MISSING, FLAG_SUPER, FLAG_SYNC_LOSS,
};
use serde::{Deserialize, Serialize};

use crate::action::{
    abort, halt, resync_with_new_evm, waits_for_standby, Action, NodeRef, Path, RunState,
};
use crate::event::BuiltEvent;
use crate::evm::BuResync;
use crate::frames::{super_directory, super_entries, FrameGenerator, WindowCounts};
use crate::generator::Generator;
use crate::ids::{Bits, FastSet, IdMap, RecentIds};
use crate::join::{Join, Next};
use crate::sink::{Sink, SinkError};
use evb_wire::window::{WindowHeader, WINDOW_HEADER_LEN};

/// How much of each fragment the BU checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Header checks only (ids, sizes, trigger numbers).
    Headers,
    /// Plus the payload CRC32C.
    Crc,
    /// Plus every payload byte against the generator (generated data only).
    Full,
}

#[derive(Debug, Clone)]
pub struct BuConfig {
    pub index: u16,
    /// Source id expected from each RU, by RU index.
    pub source_ids: Vec<u16>,
    /// Events this BU may hold at once: the credits it grants the EVM.
    pub credits: u32,
    pub verify: Verify,
    pub generator: Option<Generator>,
    /// Building by time: how records are cut (every fragment is then a window fragment of
    /// that record's slice, checked by [`check_slice`]) and the frames the generator makes
    /// (checked byte by byte under [`Verify::Full`]).
    pub slices: Option<FrameGenerator>,
    /// Span of event ids behind the newest built one within which a late duplicate is
    /// recognised (see `RecentIds`).
    pub duplicate_window: usize,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
// A field left out of a node's Report counts as 0 (docs/protocol.md §4: an implementation
// sends the counters it keeps; the verdict then names what does not add up).
#[serde(default)]
pub struct BuStats {
    pub events_built: u64,
    pub payload_bytes_built: u64,
    pub fragments_received: u64,
    /// Sum of built event ids (wrapping): with the count, proves which events arrived.
    pub event_id_sum: u64,
    pub crc_errors: u64,
    pub content_errors: u64,
    pub trigger_mismatches: u64,
    pub duplicate_fragments: u64,
    pub source_mismatches: u64,
    /// Fragments for events the EVM did not assign here.
    pub misrouted: u64,
    /// Events built with at least one source flagged missing (by the RUs' error policy).
    pub partial_events: u64,
    /// Events still partly built at the end of the run.
    pub incomplete_at_stop: u64,
    pub in_flight_high_water: u64,
    /// Fragments that arrived from an RU after the EVM declared it lost: dropped, not used.
    #[serde(default)]
    pub from_lost_sources: u64,
    /// Events this BU released that the EVM did not accept (its ledger counted them as
    /// duplicate or misrouted): they are not this BU's output.
    #[serde(default)]
    pub releases_refused: u64,
    /// Events handed to the sink whose release the EVM has not (yet) accepted. At the end of
    /// a run that this BU left early (lost, aborted), these are left out of its output.
    #[serde(default)]
    pub unacknowledged: u64,
    /// Super-fragments whose directory is damaged or disagrees with their header.
    #[serde(default)]
    pub super_fragment_errors: u64,
    /// Window fragments (building by time) that are damaged or hold another window than
    /// their record's.
    #[serde(default)]
    pub window_errors: u64,
    /// Decision windows an RU sent LATE (their end had not arrived by `windows.wait_ms`)
    /// or MISSING (part evicted from its latency buffer): each makes its record partial.
    #[serde(default)]
    pub late_components: u64,
    #[serde(default)]
    pub missing_components: u64,
    /// Decision windows an RU sent EMPTY: the decision named other components. Not a
    /// loss: the record holds what its decision asked for.
    #[serde(default)]
    pub empty_components: u64,
    /// Events built with a stream flagged for sync loss (`source.on_sync_loss = "flag"`).
    #[serde(default)]
    pub sync_loss_events: u64,
    /// Events the EVM accepted that the sink could not output by the end of the run (a
    /// `serve` sink: never acknowledged by a consumer). Judged: must be 0.
    #[serde(default)]
    pub output_lost: u64,
    /// Other protocol errors.
    pub errors: u64,
    /// Event building latency: from the Assign or the first fragment (whichever came
    /// first) to the event complete.
    #[serde(default)]
    pub latency: crate::LatencyHistogram,
}

impl BuStats {
    /// True when nothing at all went wrong.
    pub fn clean(&self) -> bool {
        self.crc_errors
            + self.content_errors
            + self.trigger_mismatches
            + self.duplicate_fragments
            + self.source_mismatches
            + self.misrouted
            + self.incomplete_at_stop
            + self.releases_refused
            + self.super_fragment_errors
            + self.window_errors
            + self.output_lost
            + self.errors
            == 0
    }

    /// What went wrong, in words: each non-zero error counter by name (for the verdict,
    /// which used to print the whole struct, histogram included).
    pub fn errors_in_words(&self) -> String {
        [
            ("CRC errors", self.crc_errors),
            ("content errors", self.content_errors),
            ("trigger mismatches", self.trigger_mismatches),
            ("duplicate fragments", self.duplicate_fragments),
            ("source mismatches", self.source_mismatches),
            ("misrouted fragments", self.misrouted),
            ("events incomplete at stop", self.incomplete_at_stop),
            ("releases refused", self.releases_refused),
            ("super-fragment errors", self.super_fragment_errors),
            ("window fragment errors", self.window_errors),
            ("events lost at the output", self.output_lost),
            ("other errors", self.errors),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(what, n)| format!("{n} {what}"))
        .collect::<Vec<_>>()
        .join(", ")
    }
}

/// A fragment whose event is not assigned here this long after it arrived will never be:
/// the EVM sends the Assign to the BU when it tells the RUs, so it trails them by far less.
const MISROUTED_AFTER: Duration = Duration::from_secs(10);

/// What a fragment's checks found ([`Bu::check_fragment`]), before anything is counted.
/// (Plain flags: with the reason for a bad super-fragment in it, the BU built and read it
/// back through memory at every fragment.)
#[derive(Debug, Clone, Copy, Default)]
struct Checked {
    duplicate: bool,
    source_mismatch: bool,
    crc_error: bool,
    content_error: bool,
    /// A super-fragment whose structure is wrong.
    super_error: bool,
    /// A window fragment that is damaged or not this record's slice or window.
    window_error: bool,
    /// What an RU could give of the record's window (building by time).
    window: WindowCounts,
    /// A super-fragment that says a stream left it out.
    partial: bool,
}

impl Checked {
    /// Nothing found: the fragment can join.
    #[inline(always)]
    fn regular(self) -> bool {
        !(self.duplicate
            || self.source_mismatch
            || self.crc_error
            || self.content_error
            || self.super_error
            || self.window_error
            || self.partial
            // counted one by one ([`Bu::handle_fragments`]), EMPTY too
            || !self.window.complete())
    }
}

/// Checks a super-fragment's directory against its fragment header: the layout adds up, and
/// every stream agrees on the trigger number unless its entry is flagged (sync loss under
/// `"flag"`, or left out). Returns whether a stream was left out (a partial event).
fn check_super(header: &FragmentHeader, payload: &Chain) -> Result<bool, String> {
    let entries = super_directory(payload)?;
    let mut flagged = false;
    for e in &entries {
        flagged |= e.flags & ENTRY_SYNC_LOSS != 0;
        if e.flags == 0 && e.trigger_number != header.trigger_number {
            return Err(format!(
                "source {} has trigger number {} in an event with {}, not flagged",
                e.source_id, e.trigger_number, header.trigger_number
            ));
        }
    }
    if flagged != (header.flags & FLAG_SYNC_LOSS != 0) {
        return Err("sync-loss flag of the fragment and of its entries disagree".into());
    }
    Ok(entries.iter().any(|e| e.flags & ENTRY_MISSING != 0))
}

/// A fragment's checks in a run built by time: every check of [`FrameGenerator::check`]
/// under `crc` and `full` (the bytes were checked before, under `full`), only the window
/// fragment's header under `headers` (each entry's, for a super-fragment of several
/// streams); returns (an error, its components' statuses).
fn window_checks(
    f: &FrameGenerator,
    verify: Verify,
    header: &FragmentHeader,
    payload: &Chain,
) -> (bool, WindowCounts) {
    if verify != Verify::Headers {
        return match f.check_all(header, payload) {
            Ok(counts) => (false, counts),
            Err(_) => (true, WindowCounts::default()),
        };
    }
    if header.flags & FLAG_MISSING != 0 {
        return (false, WindowCounts::default());
    }
    let status = |payload: &Chain| {
        let mut head = [0u8; WINDOW_HEADER_LEN];
        if !payload.copy_prefix(&mut head) {
            return None;
        }
        WindowHeader::decode(&head).ok().map(|h| h.status)
    };
    if header.flags & FLAG_SUPER == 0 {
        return status(payload).map_or((true, WindowCounts::default()), |s| {
            (false, WindowCounts::of(s))
        });
    }
    let Ok(parts) = super_entries(header, payload) else {
        return (true, WindowCounts::default());
    };
    let mut counts = WindowCounts::default();
    for (_, part) in parts {
        match status(&part) {
            Some(s) => counts.add(s),
            None => return (true, WindowCounts::default()),
        }
    }
    (false, counts)
}

/// An event from its first fragment (or its Assign) until the sink is done with it.
struct Building {
    assigned: bool,
    /// Handed to the sink, which has not said `delivered` yet: a fragment for it now is a
    /// duplicate.
    at_sink: bool,
    /// When the first fragment (or the Assign) arrived.
    since: Instant,
    /// One entry per RU: a MISSING placeholder until that RU's fragment arrives.
    fragments: Vec<(FragmentHeader, Chain)>,
    /// Which RUs' fragments arrived (the first 64 inline: no cache miss of its own).
    have: Bits,
    received: usize,
    corrupt: bool,
    /// A super-fragment left out a stream's fragment (a partial event).
    partial: bool,
}

/// The BU's event records: a slab of `Building`s, reused in place, and a map from groups of
/// 64 consecutive event ids to their slots. Events come to a BU in runs of consecutive ids,
/// so the map stays a few hundred entries, hot in the cache, where one entry per event (or a
/// record moved in and out of the map at every event) was a visible share of a small-event
/// run. The groups live in a slab of their own and the last one looked up is remembered: a
/// page's fragments, an event's completion and its release mostly fall in the group just
/// used, and then skip the map (five lookups an event, each a hash and a probe of 272-byte
/// entries, were a tenth of the BU's time at 256 B).
struct Records {
    /// Group key (`id / GROUP`) to its index in `group_slab`.
    groups: IdMap<u32>,
    group_slab: Vec<Group>,
    free_groups: Vec<u32>,
    /// The group looked up last: (key, index), or `NO_GROUP`.
    last: Cell<(u64, u32)>,
    len: usize,
    slab: Vec<Building>,
    free: Vec<u32>,
    /// Fragment vectors given back by the sink (`Bu::recycle`), for new records.
    spare_fragments: Vec<Vec<(FragmentHeader, Chain)>>,
}

/// Ids per group: a group is keyed by `id / GROUP`.
const GROUP: u64 = 64;
/// No record for this id.
const NO_SLOT: u32 = u32::MAX;
/// No group remembered (no event id reaches this key).
const NO_GROUP: (u64, u32) = (u64::MAX, u32::MAX);

/// The slots of 64 consecutive event ids.
struct Group {
    slots: [u32; GROUP as usize],
    live: u32,
}

impl Default for Records {
    fn default() -> Self {
        Records {
            groups: IdMap::default(),
            group_slab: Vec::new(),
            free_groups: Vec::new(),
            last: Cell::new(NO_GROUP),
            len: 0,
            slab: Vec::new(),
            free: Vec::new(),
            spare_fragments: Vec::new(),
        }
    }
}

impl Records {
    fn len(&self) -> usize {
        self.len
    }

    /// The index of group `key` in `group_slab`, if it has one.
    #[inline]
    fn group(&self, key: u64) -> Option<u32> {
        let (k, at) = self.last.get();
        if k == key {
            return Some(at);
        }
        let at = *self.groups.get(&key)?;
        self.last.set((key, at));
        Some(at)
    }

    fn slot(&self, id: u64) -> Option<u32> {
        let g = self.group(id / GROUP)?;
        let slot = self.group_slab[g as usize].slots[(id % GROUP) as usize];
        (slot != NO_SLOT).then_some(slot)
    }

    fn iter(&self) -> impl Iterator<Item = (u64, &Building)> {
        self.groups.iter().flat_map(move |(key, &g)| {
            self.group_slab[g as usize]
                .slots
                .iter()
                .enumerate()
                .filter(|(_, slot)| **slot != NO_SLOT)
                .map(move |(i, slot)| (key * GROUP + i as u64, &self.slab[*slot as usize]))
        })
    }

    /// Event `id`'s record (and its slot), made (no fragment filed yet) if it has none; true
    /// when it was made now. Inlined: a fragment of an event already recorded (most of them)
    /// costs a remembered group's slot and no call.
    #[inline(always)]
    fn entry(&mut self, id: u64, now: Instant, source_ids: &[u16]) -> (u32, &mut Building, bool) {
        let g = match self.group(id / GROUP) {
            Some(g) => g,
            None => self.new_group(id / GROUP),
        };
        let at = self.group_slab[g as usize].slots[(id % GROUP) as usize];
        if at != NO_SLOT {
            return (at, &mut self.slab[at as usize], false);
        }
        let slot = self.make(g, id, now, source_ids);
        (slot, &mut self.slab[slot as usize], true)
    }

    /// A fresh group for ids `key * GROUP ..`, remembered as the last one looked up.
    fn new_group(&mut self, key: u64) -> u32 {
        let fresh = Group {
            slots: [NO_SLOT; GROUP as usize],
            live: 0,
        };
        let g = match self.free_groups.pop() {
            Some(g) => {
                self.group_slab[g as usize] = fresh;
                g
            }
            None => {
                self.group_slab.push(fresh);
                (self.group_slab.len() - 1) as u32
            }
        };
        self.groups.insert(key, g);
        self.last.set((key, g));
        g
    }

    /// A record for event `id` (none yet) in group `g`: a slot reused or added, reset.
    #[inline(never)]
    fn make(&mut self, g: u32, id: u64, now: Instant, source_ids: &[u16]) -> u32 {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slab.push(Building::new(now));
                (self.slab.len() - 1) as u32
            }
        };
        let group = &mut self.group_slab[g as usize];
        group.slots[(id % GROUP) as usize] = slot;
        group.live += 1;
        self.len += 1;
        let b = &mut self.slab[slot as usize];
        if b.fragments.capacity() == 0 {
            b.fragments = self.spare_fragments.pop().unwrap_or_default();
        }
        b.reset(now, source_ids);
        slot
    }

    /// Forgets event `id` (its fragments are dropped, their blocks go back to the pool); its
    /// slot and vectors serve the next event. Returns how many fragments it had.
    fn remove(&mut self, id: u64) -> Option<usize> {
        self.remove_if(id, |_| true)
    }

    /// [`Records::remove`] when `id`'s record passes `keep_out` (one lookup where a check
    /// and a removal were two: the sink's `delivered` does this for every event).
    #[inline]
    fn remove_if(&mut self, id: u64, keep_out: impl Fn(&Building) -> bool) -> Option<usize> {
        let key = id / GROUP;
        let g = self.group(key)?;
        let group = &mut self.group_slab[g as usize];
        let at = &mut group.slots[(id % GROUP) as usize];
        if *at == NO_SLOT || !keep_out(&self.slab[*at as usize]) {
            return None;
        }
        let slot = std::mem::replace(at, NO_SLOT);
        group.live -= 1;
        if group.live == 0 {
            self.groups.remove(&key);
            self.free_groups.push(g);
            self.last.set(NO_GROUP);
        }
        self.len -= 1;
        self.free.push(slot);
        let b = &mut self.slab[slot as usize];
        b.fragments.clear();
        Some(b.received)
    }
}

impl Building {
    fn reset(&mut self, now: Instant, source_ids: &[u16]) {
        self.fragments.clear();
        self.have.reset(source_ids.len());
        self.assigned = false;
        self.at_sink = false;
        self.since = now;
        self.received = 0;
        self.corrupt = false;
        self.partial = false;
    }

    /// Files RU `ru`'s fragment at its place. The vector grows as fragments come: an RU's
    /// place is taken by a MISSING placeholder only when a later RU's fragment came first
    /// (or, at completion, when its RU was lost), not at every event's start.
    #[inline(always)]
    fn put(&mut self, id: u64, source_ids: &[u16], ru: usize, fragment: (FragmentHeader, Chain)) {
        let len = self.fragments.len();
        if ru < len {
            self.fragments[ru] = fragment;
            return;
        }
        if ru > len {
            self.pad(id, source_ids, ru);
        }
        self.fragments.push(fragment);
    }

    /// Placeholders (MISSING, empty) for every place below `upto` not filed yet.
    #[inline(never)]
    fn pad(&mut self, id: u64, source_ids: &[u16], upto: usize) {
        let from = self.fragments.len();
        self.fragments
            .extend(source_ids[from.min(upto)..upto].iter().map(|&source_id| {
                let h = FragmentHeader {
                    event_id: id,
                    trigger_number: 0,
                    source_id,
                    flags: FLAG_MISSING,
                    payload_size: 0,
                    payload_crc: 0,
                };
                (h, Chain::new())
            }));
    }
}

impl Building {
    /// An empty record made at `now` (the BU has no clock: time comes from its caller).
    fn new(now: Instant) -> Building {
        Building {
            assigned: false,
            at_sink: false,
            since: now,
            fragments: Vec::new(),
            have: Bits::default(),
            received: 0,
            corrupt: false,
            partial: false,
        }
    }
}

/// Events of equal building latency, counted before they go into the histogram.
struct LatencyRun {
    since: Instant,
    at: Instant,
    count: u64,
}

impl LatencyRun {
    fn record_into(&self, h: &mut crate::LatencyHistogram) {
        h.record_n(self.at.saturating_duration_since(self.since), self.count);
    }
}

/// Vectors of finished events kept for the next ones (at most this many, or the BU's
/// credits): a small-event run builds millions of events a second, and an allocation and a
/// free each is a visible share of that.
const SPARE_VECTORS: usize = 1024;

pub struct Bu {
    cfg: BuConfig,
    state: RunState,
    /// Events being built and events at the sink (`Building::at_sink`), by id.
    events: Records,
    /// Events the sink took and this BU released, in release order, with their payload
    /// bytes, until the EVM echoes the release: only then are they this BU's output.
    unacked: VecDeque<(u64, u64)>,
    recent: RecentIds,
    /// Release range being coalesced.
    release: Option<EventRange>,
    credits_to_send: u32,
    /// RUs the EVM declared lost: their fragments are no longer awaited.
    lost_sources: FastSet<usize>,
    /// When `poll` next gives up on misrouted fragments; `None` until the first `poll`,
    /// which checks (the BU has no clock: time comes in with `handle` and `poll`).
    next_misroute_check: Option<Instant>,
    actions: VecDeque<Action>,
    /// Events built and not yet taken for the sink ([`Bu::move_built`]): apart from the
    /// actions, so that a pass's events go to the sink's queue in one move rather than each
    /// through the action queue and a match.
    built: VecDeque<BuiltEvent>,
    stats: BuStats,
    /// Events completed at one moment whose records were made at one moment (a page's
    /// events, filed and completed in one pass), not yet in `stats.latency`: one histogram
    /// update for the run instead of one per event.
    latency_run: Option<LatencyRun>,
    /// The run has a standby EVM: losing the EVM waits for it instead of ending the run.
    standby: bool,
    /// Events built without records or objects while they come regularly, for a sink that
    /// takes spans (`crate::join`); `None` when off, or once something irregular handed
    /// everything to the records.
    join: Option<Join>,
}

impl Bu {
    pub fn new(cfg: BuConfig) -> Bu {
        Bu {
            recent: RecentIds::new(cfg.duplicate_window),
            cfg,
            state: RunState::Configured,
            events: Records::default(),
            unacked: VecDeque::new(),
            release: None,
            credits_to_send: 0,
            lost_sources: FastSet::default(),
            next_misroute_check: None,
            actions: VecDeque::new(),
            built: VecDeque::new(),
            stats: BuStats::default(),
            latency_run: None,
            standby: false,
            join: None,
        }
    }

    /// Whether events that come regularly are joined without records, and handed to the
    /// sink as spans ([`Bu::deliver_spans`]): for a sink that takes spans, set before the
    /// run begins. Off (the default), or once turned off, every event gets a record and is
    /// handed on as a [`BuiltEvent`]; both give the same output.
    pub fn set_join(&mut self, on: bool) {
        if !on {
            self.spill(None);
        } else if self.join.is_none() && self.events.len() == 0 && self.built.is_empty() {
            self.join = Some(Join::new(self.cfg.source_ids.len()));
        }
    }

    /// Events the join built, not yet taken by the sink.
    pub fn spans_queued(&self) -> u64 {
        self.join.as_ref().map_or(0, |j| j.built as u64)
    }

    /// Hands the join's built events to `sink` as spans, oldest first, and releases those it
    /// takes as [`Bu::delivered`] would; stops at the sink's first error (the rest are
    /// offered again later).
    pub fn deliver_spans(&mut self, sink: &mut dyn Sink) -> Result<(), SinkError> {
        while let Some(j) = &mut self.join {
            let Some(&s) = j.spans.front() else {
                return Ok(());
            };
            sink.deliver_span(s.first, s.count, s.bytes)?;
            let (unacked, recent) = (&mut self.unacked, &mut self.recent);
            // each event released as `delivered` releases it (its bytes count at the echo)
            j.delivered_span(|id, bytes| {
                unacked.push_back((id, bytes));
                recent.insert(id);
            });
            match &mut self.release {
                Some(r) if r.end() == s.first && r.count.checked_add(s.count).is_some() => {
                    r.count += s.count
                }
                _ => {
                    self.flush_release();
                    self.release = Some(EventRange {
                        bu: self.me(),
                        first: s.first,
                        count: s.count,
                    });
                }
            }
            if matches!(self.state, RunState::Running) {
                self.credits_to_send += s.count;
            }
        }
        Ok(())
    }

    /// Builds the assigned events the lanes hold whole, oldest first; hands everything to
    /// the records when a lane's next place is not the oldest assigned event's.
    fn join_build(&mut self, now: Instant) {
        while let Some(j) = &mut self.join {
            match j.build_next() {
                Next::Waiting => return,
                Next::Irregular => {
                    self.spill(Some(now));
                    return;
                }
                Next::Built { since, .. } => self.note_latency(now, since),
            }
        }
    }

    /// Ends the join: what it holds becomes what the records would hold had they taken
    /// every piece. Its built events go to the built queue (with records at the sink), the
    /// fragments of the others into records, its assignments too; those now complete are
    /// built, at `now` or the newest piece's time.
    fn spill(&mut self, now: Option<Instant>) {
        let Some(mut j) = self.join.take() else {
            return;
        };
        let Some(now) = now.or(j.latest) else {
            // nothing ever came: nothing to hand over
            return;
        };
        let src = &self.cfg.source_ids;
        while let Some(s) = j.spans.pop_front() {
            for id in s.first..s.first + s.count as u64 {
                let mut fragments = self.events.spare_fragments.pop().unwrap_or_default();
                for lane in &mut j.lanes {
                    fragments.push(lane.places.pop_front().expect("a built event's place"));
                }
                let trigger_number = fragments
                    .first()
                    .map_or(id as u32, |(h, _)| h.trigger_number);
                self.built.push_back(BuiltEvent {
                    event_id: id,
                    trigger_number,
                    fragments,
                    bytes: j.bytes.pop_front().expect("a built event's bytes"),
                    trigger_mismatch: false,
                    corrupt: false,
                    missing_sources: Vec::new(),
                    partial: false,
                });
                let (_, b, _) = self.events.entry(id, now, src);
                (b.assigned, b.at_sink) = (true, true);
            }
        }
        for (ru, mut lane) in j.lanes.into_iter().enumerate() {
            for f in std::mem::take(&mut lane.places).into_items() {
                let id = f.0.event_id;
                let at = lane.time_of(id);
                let (_, b, _) = self.events.entry(id, at, src);
                b.since = b.since.min(at);
                b.put(id, src, ru, f);
                b.have.set(ru);
                b.received += 1;
            }
        }
        for p in j.assigned {
            for id in p.first..p.end {
                let (slot, b, _) = self.events.entry(id, p.at, &self.cfg.source_ids);
                b.since = b.since.min(p.at);
                b.assigned = true;
                self.complete_at(now, id, slot);
            }
        }
    }

    /// The run has a standby EVM (docs/standby.md): losing the EVM while running is not the
    /// end of the run.
    pub fn set_standby(&mut self, standby: bool) {
        self.standby = standby;
    }

    /// What this BU tells a new EVM that takes the run over (docs/standby.md): its free
    /// credits, the events it builds, those it released without hearing the echo, the
    /// recent ones it released, and its counters. From here on the credits and the release
    /// it had not sent yet are the new EVM's to know from this, so they are not sent again.
    /// A committing sink's state (accepted, parts, committed) is the caller's to add.
    pub fn resync(&mut self) -> BuResync {
        self.spill(None);
        let me = self.me();
        let mut building = Vec::new();
        let mut unassigned = Vec::new();
        let mut ids: Vec<(u64, bool)> =
            self.events.iter().map(|(id, b)| (id, b.assigned)).collect();
        ids.sort_unstable();
        for (id, assigned) in ids {
            push_run(
                if assigned {
                    &mut building
                } else {
                    &mut unassigned
                },
                me,
                id,
            );
        }
        let held: u64 = building.iter().map(|r: &EventRange| r.count as u64).sum();
        let mut unacked = Vec::new();
        for &(id, _) in &self.unacked {
            push_run(&mut unacked, me, id);
        }
        let mut recent = Vec::new();
        for id in self.recent.iter() {
            push_run(&mut recent, me, id);
        }
        self.release = None;
        self.credits_to_send = 0;
        resync_with_new_evm(&mut self.state, &mut self.actions);
        BuResync {
            bu: me,
            free_credits: (self.cfg.credits as u64).saturating_sub(held) as u32,
            building,
            unassigned,
            unacked,
            recent,
            built: self.stats.events_built,
            built_id_sum: self.stats.event_id_sum,
            stopping: self.state == RunState::Stopping,
            ..BuResync::default()
        }
    }

    pub fn state(&self) -> RunState {
        self.state
    }

    pub fn stats(&self) -> BuStats {
        let mut s = self.stats.clone();
        s.unacknowledged = self.unacked.len() as u64;
        if let Some(r) = &self.latency_run {
            r.record_into(&mut s.latency);
        }
        s
    }

    /// Events partly built or at the sink.
    pub fn in_flight(&self) -> usize {
        self.events.len() + self.join.as_ref().map_or(0, |j| j.held() as usize)
    }

    fn spare_limit(&self) -> usize {
        (self.cfg.credits as usize).max(SPARE_VECTORS)
    }

    /// Gives back a delivered event's fragment vector (its payloads are dropped here) for
    /// the next events.
    pub fn recycle(&mut self, mut fragments: Vec<(FragmentHeader, Chain)>) {
        if self.events.spare_fragments.len() < self.spare_limit() {
            fragments.clear();
            self.events.spare_fragments.push(fragments);
        }
    }

    pub fn next_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Moves the events built since the last call to the end of `queue`, in the order they
    /// were built (for the sink; each is then [`Bu::delivered`], or stays queued while the
    /// sink is busy). Returns whether there were any.
    pub fn move_built(&mut self, queue: &mut VecDeque<BuiltEvent>) -> bool {
        if self.built.is_empty() {
            return false;
        }
        if queue.is_empty() {
            // the common case: the sink took the last pass's events; no element moves
            std::mem::swap(queue, &mut self.built);
        } else {
            queue.append(&mut self.built);
        }
        true
    }

    /// The oldest event built and not yet taken (one at a time: for tests and tools).
    pub fn next_built(&mut self) -> Option<BuiltEvent> {
        self.built.pop_front()
    }

    /// Every connection is up: tell the EVM (again, where the run has not started: the
    /// first EVM connection was not the run's EVM's).
    pub fn connections_up(&mut self) {
        if matches!(self.state, RunState::Configured | RunState::Ready) {
            self.state = RunState::Ready;
            self.actions.push_back(Action::Send {
                to: NodeRef::Evm,
                msg: Message::Ready {
                    available: evb_wire::UNLIMITED,
                },
                path: Path::Now,
            });
        }
    }

    fn me(&self) -> u16 {
        self.cfg.index
    }

    pub fn handle(&mut self, now: Instant, from: NodeRef, msg: Message) {
        if from != NodeRef::Evm {
            self.stats.errors += 1;
            return;
        }
        match msg {
            Message::Start => {
                self.state = RunState::Running;
                self.credits_to_send += self.cfg.credits;
            }
            Message::Assign(r, _) if r.bu == self.me() => {
                if let Some(j) = &mut self.join {
                    if j.takes_assign(r.first) {
                        j.assign(r.first, r.end(), now);
                        self.stats.in_flight_high_water =
                            self.stats.in_flight_high_water.max(j.held());
                        self.join_build(now);
                        return;
                    }
                    self.spill(Some(now));
                }
                // A record made now has no fragment: it completes only when every source
                // is lost (or there is none), so the common case skips the check.
                let may_complete = !self.lost_sources.is_empty() || self.cfg.source_ids.is_empty();
                for id in r.first..r.end() {
                    let (slot, b, new) = self.events.entry(id, now, &self.cfg.source_ids);
                    if b.assigned {
                        self.stats.errors += 1;
                    }
                    b.assigned = true;
                    if !new || may_complete {
                        self.complete_at(now, id, slot);
                    }
                }
            }
            Message::SourceLost { ru } if (ru as usize) < self.cfg.source_ids.len() => {
                self.spill(Some(now));
                self.lost_sources.insert(ru as usize);
                let waiting: Vec<u64> = self
                    .events
                    .iter()
                    .filter(|(_, b)| !b.at_sink)
                    .map(|(id, _)| id)
                    .collect();
                for id in waiting {
                    self.try_complete(now, id);
                }
            }
            Message::Assign(r, _) => {
                // an Assign reaches a BU only for itself (§6): another's is the EVM's error
                tracing::warn!(
                    "the EVM sent bu[{}] an Assign of events {}..{} for bu[{}]: refused",
                    self.me(),
                    r.first,
                    r.end(),
                    r.bu
                );
                self.stats.errors += 1;
            }
            Message::Release(r) if r.bu == self.me() => self.accepted(r),
            Message::Committed { bu, part } if bu == self.me() => {
                self.actions.push_back(Action::Publish(part))
            }
            Message::Stop { .. } => {
                self.spill(Some(now));
                self.state = RunState::Stopping;
                self.stats.incomplete_at_stop =
                    self.events.iter().filter(|(_, b)| !b.at_sink).count() as u64;
                let report = serde_json::to_string(&self.stats()).unwrap_or_default();
                self.actions.push_back(Action::Send {
                    to: NodeRef::Evm,
                    msg: Message::Report(report),
                    path: Path::Now,
                });
            }
            Message::Halt => {
                let ok = self.stats.clean();
                halt(&mut self.state, &mut self.actions, ok);
            }
            Message::Abort(why) => {
                let reason = format!("run aborted: {why}");
                abort(&mut self.state, &mut self.actions, reason);
            }
            _ => self.stats.errors += 1,
        }
    }

    /// A fragment from RU `from`. Checks it, files it, and builds the event once complete.
    pub fn handle_fragment(
        &mut self,
        now: Instant,
        from: NodeRef,
        header: FragmentHeader,
        payload: Chain,
    ) {
        self.handle_fragments(now, from, [(header, payload)]);
    }

    /// Fragments from RU `from` (a run of them, as one page brought them), each as
    /// [`Bu::handle_fragment`]: what depends only on the sender is looked up once.
    pub fn handle_fragments(
        &mut self,
        now: Instant,
        from: NodeRef,
        fragments: impl IntoIterator<Item = (FragmentHeader, Chain)>,
    ) {
        let fragments = fragments.into_iter();
        let NodeRef::Ru(ru) = from else {
            self.stats.errors += fragments.count() as u64;
            return;
        };
        let ru = ru as usize;
        if self.lost_sources.contains(&ru) {
            // The EVM declared this RU lost: its events are built without it, whatever it
            // still sends (it may have been only frozen) is not used.
            let n = fragments.count() as u64;
            self.stats.fragments_received += n;
            self.stats.from_lost_sources += n;
            return;
        }
        let Some(&expected_source) = self.cfg.source_ids.get(ru) else {
            let n = fragments.count() as u64;
            self.stats.fragments_received += n;
            self.stats.errors += n;
            return;
        };
        for (header, payload) in fragments {
            self.file_fragment(now, ru, expected_source, header, payload);
        }
        if let Some(j) = &mut self.join {
            j.latest = Some(j.latest.map_or(now, |l| l.max(now)));
            self.join_build(now);
        }
    }

    /// Fragments from RU `from` as one pass over its connection brought them: while the
    /// join runs and every one is regular (its id above the one before, not seen before,
    /// every check passed), the page goes into the RU's lane whole, its fragments not moved
    /// one by one; otherwise each is filed as [`Bu::handle_fragments`] files it.
    pub fn handle_page(&mut self, now: Instant, from: NodeRef, page: Vec<(FragmentHeader, Chain)>) {
        let NodeRef::Ru(ru) = from else {
            return self.handle_fragments(now, from, page);
        };
        let ru = ru as usize;
        let regular = |b: &Bu, j: &Join, expected: u16| {
            j.takes_page(ru, &page, |(h, p)| {
                b.check_fragment(expected, h, p).regular()
            })
        };
        let takes = match (&self.join, self.cfg.source_ids.get(ru)) {
            (Some(j), Some(&expected)) => {
                !self.lost_sources.contains(&ru) && regular(self, j, expected)
            }
            _ => false,
        };
        if !takes {
            return self.handle_fragments(now, from, page);
        }
        let j = self.join.as_mut().expect("looked at above");
        self.stats.fragments_received += page.len() as u64;
        if j.push_page(ru, page, now) {
            self.stats.in_flight_high_water = self.stats.in_flight_high_water.max(j.held());
        }
        j.latest = Some(j.latest.map_or(now, |l| l.max(now)));
        self.join_build(now);
    }

    /// A fragment's checks, in the order they are counted (nothing is counted here): seen
    /// before; else its source, its payload CRC, its content, a super-fragment's structure
    /// (each of the last two only when nothing before failed).
    #[inline(always)]
    fn check_fragment(
        &self,
        expected_source: u16,
        header: &FragmentHeader,
        payload: &Chain,
    ) -> Checked {
        if self.recent.contains(header.event_id) {
            return Checked {
                duplicate: true,
                ..Checked::default()
            };
        }
        let source_mismatch = header.source_id != expected_source;
        let crc_error =
            self.cfg.verify != Verify::Headers && payload.crc32c() != header.payload_crc;
        let mut corrupt = source_mismatch || crc_error;
        let content_error = !corrupt
            && self.cfg.verify == Verify::Full
            && header.flags & FLAG_GENERATED != 0
            && match &self.cfg.slices {
                Some(f) => !f.verify(header.event_id, header.source_id, payload.chunks()),
                None => self.cfg.generator.as_ref().is_some_and(|g| {
                    !g.verify(header.event_id, header.source_id, payload.chunks())
                }),
            };
        corrupt |= content_error;
        let (window_error, window) = match &self.cfg.slices {
            Some(f) if !corrupt => window_checks(f, self.cfg.verify, header, payload),
            _ => (false, WindowCounts::default()),
        };
        corrupt |= window_error;
        let (super_error, mut partial) = if !corrupt && header.flags & FLAG_SUPER != 0 {
            check_super(header, payload).map_or((true, false), |p| (false, p))
        } else {
            (false, false)
        };
        // a window the RU could not give whole (LATE, MISSING): a partial record; EMPTY (the
        // decision did not ask for this source) leaves nothing out
        partial |= window.partial();
        Checked {
            duplicate: false,
            source_mismatch,
            crc_error,
            content_error,
            super_error,
            window_error,
            window,
            partial,
        }
    }

    /// Inlined into the loop of [`Bu::handle_fragments`]: a call per fragment, with the
    /// fragment moved onto its stack, was a tenth of the BU's instructions at 256 B.
    #[inline(always)]
    fn file_fragment(
        &mut self,
        now: Instant,
        ru: usize,
        expected_source: u16,
        header: FragmentHeader,
        payload: Chain,
    ) {
        self.stats.fragments_received += 1;
        let id = header.event_id;
        let checked = self.check_fragment(expected_source, &header, &payload);
        if checked.duplicate {
            self.stats.duplicate_fragments += 1;
            return;
        }
        // A wrong source id is counted and the fragment still stands for its RU, flagged
        // corrupt: the event completes (and is marked), the run does not stall on it.
        self.stats.source_mismatches += checked.source_mismatch as u64;
        self.stats.crc_errors += checked.crc_error as u64;
        self.stats.content_errors += checked.content_error as u64;
        let partial = checked.partial;
        if checked.super_error {
            let why = check_super(&header, &payload).err().unwrap_or_default();
            tracing::warn!("event {id}: super-fragment from ru[{ru}]: {why}");
            self.stats.super_fragment_errors += 1;
        }
        if checked.window_error {
            let why = self
                .cfg
                .slices
                .as_ref()
                .and_then(|f| f.check(&header, &payload).err())
                .unwrap_or_else(|| "its bytes are not the generator's".into());
            tracing::warn!("record {id}: window fragment from ru[{ru}]: {why}");
            self.stats.window_errors += 1;
        }
        self.stats.late_components += checked.window.late as u64;
        self.stats.missing_components += checked.window.missing as u64;
        self.stats.empty_components += checked.window.empty as u64;
        let corrupt = checked.source_mismatch
            || checked.crc_error
            || checked.content_error
            || checked.super_error
            || checked.window_error;
        if let Some(j) = &mut self.join {
            // a fragment that failed a check, or left a stream out, is not the regular case
            if j.takes(ru, id) && !corrupt && !partial {
                if j.push(ru, (header, payload), now) {
                    self.stats.in_flight_high_water = self.stats.in_flight_high_water.max(j.held());
                }
                return;
            }
            self.spill(Some(now));
        }
        let held = self.events.len() as u64 + 1;
        let (slot, b, new) = self.events.entry(id, now, &self.cfg.source_ids);
        if new {
            self.stats.in_flight_high_water = self.stats.in_flight_high_water.max(held);
        }
        if b.at_sink || b.have.get(ru) {
            self.stats.duplicate_fragments += 1;
            return;
        }
        b.put(id, &self.cfg.source_ids, ru, (header, payload));
        b.have.set(ru);
        b.received += 1;
        b.corrupt |= corrupt;
        b.partial |= partial;
        if b.assigned && (b.received == self.cfg.source_ids.len() || !self.lost_sources.is_empty())
        {
            self.complete_at(now, id, slot);
        }
    }

    fn try_complete(&mut self, now: Instant, id: u64) {
        if let Some(slot) = self.events.slot(id) {
            self.complete_at(now, id, slot);
        }
    }

    /// Builds event `id`, whose record is at `slot`, if it is complete (the check inlined
    /// where it is asked, the building not).
    #[inline(always)]
    fn complete_at(&mut self, now: Instant, id: u64, slot: u32) {
        let n = self.cfg.source_ids.len();
        let lost = &self.lost_sources;
        let b = &self.events.slab[slot as usize];
        let complete = b.assigned
            && !b.at_sink
            && (b.received == n
                || (!lost.is_empty() && (0..n).all(|r| b.have.get(r) || lost.contains(&r))));
        if complete {
            self.build(now, id, slot);
        }
    }

    /// Builds event `id`, complete, whose record is at `slot`: the event goes to the built
    /// queue, its record stays (at the sink) until `delivered`.
    #[inline(never)]
    fn build(&mut self, now: Instant, id: u64, slot: u32) {
        let n = self.cfg.source_ids.len();
        let b = &mut self.events.slab[slot as usize];
        b.at_sink = true;
        if b.fragments.len() < n {
            b.pad(id, &self.cfg.source_ids, n);
        }
        let mut fragments = std::mem::take(&mut b.fragments);
        let (corrupt, partial) = (b.corrupt, b.partial);
        let since = b.since;
        self.note_latency(now, since);
        let b = &self.events.slab[slot as usize];
        let missing = |h: &FragmentHeader| h.flags & FLAG_MISSING != 0;
        let mut trigger_mismatch = false;
        let mut sync_loss = false;
        let mut missing_sources = Vec::new();
        let mut bytes = 0u64;
        let mut trigger_number = fragments
            .first()
            .map_or(id as u32, |(h, _)| h.trigger_number);
        // every RU's fragment came, none of them flagged MISSING by its RU (the common
        // case): one pass, no placeholders to name
        let mut whole = b.received == n;
        if whole {
            for (h, p) in &fragments {
                whole &= !missing(h);
                trigger_mismatch |= h.trigger_number != trigger_number;
                sync_loss |= h.flags & FLAG_SYNC_LOSS != 0;
                bytes += p.len() as u64;
            }
        }
        if !whole {
            (trigger_mismatch, sync_loss, bytes) = (false, false, 0);
            let guess = (0..n)
                .find(|&i| b.have.get(i))
                .map_or(id as u32, |i| fragments[i].0.trigger_number);
            for (i, (h, _)) in fragments.iter_mut().enumerate() {
                if !b.have.get(i) {
                    // a lost source: an empty placeholder flagged MISSING
                    h.trigger_number = guess;
                }
            }
            trigger_number = fragments
                .iter()
                .find(|(h, _)| !missing(h))
                .map_or(guess, |(h, _)| h.trigger_number);
            for (h, p) in &fragments {
                if missing(h) {
                    missing_sources.push(h.source_id);
                } else {
                    trigger_mismatch |= h.trigger_number != trigger_number;
                }
                sync_loss |= h.flags & FLAG_SYNC_LOSS != 0;
                bytes += p.len() as u64;
            }
        }
        if !missing_sources.is_empty() || partial {
            self.stats.partial_events += 1;
        }
        if sync_loss {
            self.stats.sync_loss_events += 1;
        }
        if trigger_mismatch {
            self.stats.trigger_mismatches += 1;
        }
        self.built.push_back(BuiltEvent {
            event_id: id,
            trigger_number,
            fragments,
            bytes,
            trigger_mismatch,
            corrupt,
            missing_sources,
            partial,
        });
    }

    /// An event first seen at `since` was built at `now`: into the run of equal latencies,
    /// or the run so far into the histogram and a new one begun.
    #[inline(always)]
    fn note_latency(&mut self, now: Instant, since: Instant) {
        match &mut self.latency_run {
            Some(r) if r.since == since && r.at == now => r.count += 1,
            run => {
                if let Some(r) = run.replace(LatencyRun {
                    since,
                    at: now,
                    count: 1,
                }) {
                    r.record_into(&mut self.stats.latency);
                }
            }
        }
    }

    /// The sink is done with event `id`: release it and grant its credit back.
    pub fn delivered(&mut self, id: u64, bytes: u64) {
        if self.events.remove_if(id, |b| b.at_sink).is_none() {
            // no record, or still being built: not the sink's to give back
            self.stats.errors += 1;
            return;
        }
        self.unacked.push_back((id, bytes));
        self.recent.insert(id);
        match &mut self.release {
            Some(r) if r.end() == id && r.count < u32::MAX => r.count += 1,
            _ => {
                self.flush_release();
                self.release = Some(EventRange {
                    bu: self.me(),
                    first: id,
                    count: 1,
                });
            }
        }
        if matches!(self.state, RunState::Running) {
            self.credits_to_send += 1;
        }
    }

    /// The EVM's echo of a release: its ledger took these events as built by this BU. Only
    /// now do they count, and only now may the sink make them output (a BU the EVM dropped
    /// never hears this for what it builds afterwards). Echoes come in release order; an
    /// event skipped over was refused by the ledger.
    fn accepted(&mut self, r: EventRange) {
        let mut run: Option<EventRange> = None;
        // bounded by what this BU released, whatever `count` says
        for id in r.first..r.end() {
            let found = loop {
                let Some((front, bytes)) = self.unacked.pop_front() else {
                    break None;
                };
                if front == id {
                    break Some(bytes);
                }
                self.stats.releases_refused += 1;
            };
            let Some(bytes) = found else {
                self.stats.errors += 1;
                break;
            };
            self.stats.events_built += 1;
            self.stats.payload_bytes_built += bytes;
            self.stats.event_id_sum = self.stats.event_id_sum.wrapping_add(id);
            match &mut run {
                Some(a) if a.end() == id => a.count += 1,
                _ => {
                    if let Some(a) = run.take() {
                        self.actions.push_back(Action::Accepted(a));
                    }
                    run = Some(EventRange {
                        bu: self.me(),
                        first: id,
                        count: 1,
                    });
                }
            }
        }
        if let Some(a) = run {
            self.actions.push_back(Action::Accepted(a));
        }
    }

    /// The sink made part `part` of its output durable under a temporary name, holding
    /// these accepted events (at most `MAX_COMMIT_RANGES` ranges): ask the EVM to commit it.
    /// Its answer (`Committed`) comes as [`Action::Publish`].
    pub fn commit(&mut self, part: u32, ranges: &[(u64, u32)]) {
        self.flush_release();
        let bu = self.me();
        let ranges = ranges
            .iter()
            .map(|&(first, count)| EventRange { bu, first, count })
            .collect();
        self.actions.push_back(Action::Send {
            to: NodeRef::Evm,
            msg: Message::Commit {
                bu: self.me(),
                part,
                ranges,
            },
            path: Path::Batched,
        });
    }

    /// The sink published part `part`: tell the EVM.
    pub fn published(&mut self, part: u32) {
        self.actions.push_back(Action::Send {
            to: NodeRef::Evm,
            msg: Message::PartPublished {
                bu: self.me(),
                part,
            },
            path: Path::Batched,
        });
    }

    fn flush_release(&mut self) {
        if let Some(r) = self.release.take() {
            self.actions.push_back(Action::Send {
                to: NodeRef::Evm,
                msg: Message::Release(r),
                path: Path::Batched,
            });
        }
    }

    /// End of a pass: send coalesced releases and credits; now and then, give up on
    /// fragments of events that were never assigned here (misrouted), freeing their blocks.
    pub fn poll(&mut self, now: Instant) {
        if let Some(r) = self.latency_run.take() {
            r.record_into(&mut self.stats.latency);
        }
        if self.next_misroute_check.is_none_or(|next| now >= next) {
            self.next_misroute_check = Some(now + MISROUTED_AFTER / 4);
            // a fragment waiting this long is not regular: the records judge it
            let old = now.checked_sub(MISROUTED_AFTER);
            if self
                .join
                .as_ref()
                .zip(old)
                .is_some_and(|(j, t)| j.holds_older_than(t))
            {
                self.spill(Some(now));
            }
            let stale: Vec<u64> = self
                .events
                .iter()
                .filter(|(_, b)| {
                    !b.assigned && !b.at_sink && now.duration_since(b.since) > MISROUTED_AFTER
                })
                .map(|(id, _)| id)
                .collect();
            for id in stale {
                if let Some(received) = self.events.remove(id) {
                    self.stats.misrouted += received as u64;
                }
            }
        }
        self.flush_release();
        if self.credits_to_send > 0 {
            let count = std::mem::take(&mut self.credits_to_send);
            self.actions.push_back(Action::Send {
                to: NodeRef::Evm,
                msg: Message::Credit {
                    bu: self.me(),
                    count,
                },
                path: Path::Batched,
            });
        }
    }

    /// The sink's count of accepted events it could not output (set before Stop is handled,
    /// so that the Report carries it).
    pub fn set_output_lost(&mut self, n: u64) {
        self.stats.output_lost = n;
    }

    /// This BU cannot go on (its sink failed): tell the EVM and leave.
    pub fn fail(&mut self, reason: String) {
        if self.state.is_over() {
            return;
        }
        self.actions.push_back(Action::Send {
            to: NodeRef::Evm,
            msg: Message::Abort(reason.clone()),
            path: Path::Now,
        });
        abort(&mut self.state, &mut self.actions, reason);
    }

    /// A lost RU is the EVM's decision (stop, or go on without it); losing the EVM ends
    /// the run. A data link from an RU that closes mid-run is told to the EVM at once
    /// (LinkLost), whatever the RU does: the EVM decides whether the RU or this BU leaves.
    pub fn peer_lost(&mut self, peer: NodeRef, reason: &str) {
        if self.state.is_over() {
            return;
        }
        if let NodeRef::Ru(ru) = peer {
            if self.state == RunState::Running {
                self.actions.push_back(Action::Send {
                    to: NodeRef::Evm,
                    msg: Message::LinkLost { peer: ru, inc: 0 },
                    path: Path::Now,
                });
            }
            return;
        }
        if peer != NodeRef::Evm {
            return;
        }
        if waits_for_standby(self.standby, self.state) {
            // a standby EVM takes over: go on building, and wait for it
            return;
        }
        let reason = format!("lost {peer}: {reason}");
        abort(&mut self.state, &mut self.actions, reason);
    }
}

/// Adds `id` to `ranges`, growing the last one when `id` follows it.
fn push_run(ranges: &mut Vec<EventRange>, bu: u16, id: u64) {
    match ranges.last_mut() {
        Some(l) if l.end() == id && l.count < u32::MAX => l.count += 1,
        _ => ranges.push(EventRange {
            bu,
            first: id,
            count: 1,
        }),
    }
}

#[cfg(test)]
mod records_tests {
    use super::*;
    use std::collections::BTreeMap;

    fn header(id: u64, source_id: u16) -> FragmentHeader {
        FragmentHeader {
            event_id: id,
            trigger_number: id as u32,
            source_id,
            flags: 0,
            payload_size: 0,
            payload_crc: 0,
        }
    }

    /// Fragments filed as they come, in every order and with any RUs never heard from,
    /// end up at their RUs' places with MISSING placeholders where none came: what the
    /// placeholders made up front at every event's start gave.
    #[test]
    fn fragments_land_at_their_places_in_any_order() {
        let sources = [11u16, 12, 13, 14];
        let now = Instant::now();
        let mut b = Building::new(now);
        // every subset of RUs that sends, in every order of arrival
        for subset in 0u32..16 {
            let sending: Vec<usize> = (0..4).filter(|r| subset & (1 << r) != 0).collect();
            let mut orders = vec![sending.clone()];
            permutations(&sending, &mut Vec::new(), &mut orders);
            for order in orders {
                b.reset(now, &sources);
                for &ru in &order {
                    b.put(7, &sources, ru, (header(7, sources[ru]), Chain::new()));
                }
                b.pad(7, &sources, sources.len());
                let expected: Vec<FragmentHeader> = (0..4)
                    .map(|ru| {
                        let mut h = header(7, sources[ru]);
                        if !sending.contains(&ru) {
                            (h.trigger_number, h.flags) = (0, FLAG_MISSING);
                        }
                        h
                    })
                    .collect();
                let got: Vec<FragmentHeader> = b.fragments.iter().map(|(h, _)| *h).collect();
                assert_eq!(got, expected, "RUs {sending:?} arriving as {order:?}");
            }
        }
    }

    fn permutations(left: &[usize], prefix: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if left.is_empty() {
            out.push(prefix.clone());
            return;
        }
        for i in 0..left.len() {
            let mut rest = left.to_vec();
            prefix.push(rest.remove(i));
            permutations(&rest, prefix, out);
            prefix.pop();
        }
    }

    /// The grouped records agree with a map of ids: made, found, forgotten, listed.
    #[test]
    fn records_agree_with_a_map_of_ids() {
        let now = Instant::now();
        let mut r = Records::default();
        let mut model: BTreeMap<u64, usize> = BTreeMap::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for step in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // ids over a few groups, with a far one now and then
            let id = if x.is_multiple_of(97) {
                x % 1_000_000
            } else {
                x % 300
            };
            if x.is_multiple_of(3) {
                assert_eq!(r.remove(id), model.remove(&id), "step {step} remove {id}");
            } else {
                let (slot, b, new) = r.entry(id, now, &[1, 2]);
                assert_eq!(new, !model.contains_key(&id), "step {step} entry {id}");
                let b_at: *const Building = b;
                assert_eq!(r.slot(id), Some(slot), "step {step}: the slot entry gave");
                assert!(std::ptr::eq(&r.slab[slot as usize], b_at));
                let b = &mut r.slab[slot as usize];
                if new {
                    assert!(b.fragments.is_empty(), "step {step}: a new record is empty");
                    b.received = (id % 2) as usize;
                    model.insert(id, b.received);
                    b.put(id, &[1, 2], 1, (header(id, 2), Chain::new()));
                }
                // the second RU's fragment, and a placeholder for the first (the record's own)
                assert_eq!(b.fragments.len(), 2);
                assert_eq!(b.fragments[0].0.event_id, id);
                assert_eq!(b.fragments[0].0.flags, FLAG_MISSING);
                assert_eq!(b.fragments[1].0, header(id, 2));
            }
            assert_eq!(r.len(), model.len(), "step {step}");
            // the remembered group answers as the map does, for this id and a far one
            for probe in [id, id ^ 64, x % 1_000_000] {
                assert_eq!(
                    r.slot(probe).is_some(),
                    model.contains_key(&probe),
                    "step {step} lookup {probe}"
                );
            }
        }
        let mut listed: Vec<(u64, usize)> = r.iter().map(|(id, b)| (id, b.received)).collect();
        listed.sort_unstable();
        assert_eq!(listed, model.into_iter().collect::<Vec<_>>());
        // every slot is reused: the slab never grew past the most records held at once
        assert!(r.slab.len() <= 300 + 20_000 / 97);
    }

    /// BU 0 of a run whose RUs send `source_ids`, checking headers only.
    fn bu_of(source_ids: Vec<u16>) -> Bu {
        Bu::new(BuConfig {
            index: 0,
            source_ids,
            credits: 64,
            verify: Verify::Headers,
            generator: None,
            slices: None,
            duplicate_window: 1024,
        })
    }

    /// Built events reach the sink's queue in the order they were built, whether the queue
    /// was empty (the buffers are swapped) or still held events (they are appended behind).
    #[test]
    fn built_events_move_to_the_queue_in_order() {
        let now = Instant::now();
        let mut b = bu_of(vec![1]);
        b.handle(now, NodeRef::Evm, Message::Start);
        let build = |b: &mut Bu, ids: std::ops::Range<u64>| {
            let r = EventRange {
                bu: 0,
                first: ids.start,
                count: (ids.end - ids.start) as u32,
            };
            b.handle(now, NodeRef::Evm, Message::Assign(r, 0));
            b.handle_fragments(
                now,
                NodeRef::Ru(0),
                ids.map(|id| (header(id, 1), Chain::new())),
            );
        };
        let ids = |q: &VecDeque<BuiltEvent>| q.iter().map(|e| e.event_id).collect::<Vec<_>>();
        let mut queue = VecDeque::new();
        assert!(!b.move_built(&mut queue), "nothing built yet");
        build(&mut b, 0..3);
        assert!(b.move_built(&mut queue));
        assert_eq!(ids(&queue), [0, 1, 2]);
        build(&mut b, 3..5);
        build(&mut b, 5..6);
        assert!(
            b.move_built(&mut queue),
            "appended behind the events still queued"
        );
        assert_eq!(ids(&queue), [0, 1, 2, 3, 4, 5]);
        assert!(!b.move_built(&mut queue) && b.next_built().is_none());
        for e in queue.drain(..) {
            b.delivered(e.event_id, e.bytes);
        }
        build(&mut b, 6..8);
        assert!(b.move_built(&mut queue));
        assert_eq!(ids(&queue), [6, 7]);
        assert_eq!(b.stats().errors, 0);
    }

    /// The sink gives back only what it was given: `delivered` for an event still being
    /// built, or for one the BU never heard of, is an error and changes nothing (the event
    /// still builds, and is delivered once); for a built one it frees the record.
    #[test]
    fn delivered_frees_only_events_at_the_sink() {
        let now = Instant::now();
        let mut b = bu_of(vec![1, 2]);
        b.handle(now, NodeRef::Evm, Message::Start);
        let r = EventRange {
            bu: 0,
            first: 10,
            count: 1,
        };
        b.handle(now, NodeRef::Evm, Message::Assign(r, 0));
        b.handle_fragment(now, NodeRef::Ru(0), header(10, 1), Chain::new());
        b.delivered(10, 0);
        b.delivered(99, 0);
        assert_eq!(b.stats().errors, 2, "neither was at the sink");
        assert_eq!(b.in_flight(), 1, "the event being built keeps its record");
        b.handle_fragment(now, NodeRef::Ru(1), header(10, 2), Chain::new());
        let e = b.next_built().expect("built once its last fragment came");
        assert_eq!((e.event_id, e.fragments.len()), (10, 2));
        b.delivered(e.event_id, e.bytes);
        assert_eq!(b.in_flight(), 0, "delivered: the record is freed");
        b.delivered(10, 0);
        assert_eq!(b.stats().errors, 3, "a second delivery is an error");
        assert!(b.next_built().is_none());
    }

    /// Events completed together are recorded as one run of equal latency, events of other
    /// latencies apart, and a report taken between passes counts the run not yet recorded.
    #[test]
    fn latencies_recorded_per_run_are_those_of_each_event() {
        let mut bu = bu_of(vec![1]);
        bu.handle(Instant::now(), NodeRef::Evm, Message::Start);
        let t0 = Instant::now();
        let us = Duration::from_micros;
        // (event, filed at, completed at): 3 events of 100 us, one completed at the same
        // moment but filed later (50 us), one of 900 us, 2 of 100 us again (another moment),
        // one of 5 ms
        let plan = [
            (0, 0, 100),
            (1, 0, 100),
            (2, 0, 100),
            (3, 50, 100),
            (4, 100, 1000),
            (5, 1000, 1100),
            (6, 1000, 1100),
            (7, 1100, 6100),
        ];
        for (i, &(id, filed, done)) in plan.iter().enumerate() {
            bu.handle_fragment(t0 + us(filed), NodeRef::Ru(0), header(id, 1), Chain::new());
            let r = EventRange {
                bu: 0,
                first: id,
                count: 1,
            };
            bu.handle(t0 + us(done), NodeRef::Evm, Message::Assign(r, 0));
            if i == 4 {
                // a report between passes sees every completed event
                assert_eq!(bu.stats().latency.count, 5);
            }
        }
        assert_eq!(bu.stats().latency.count, 8, "before the pass ends");
        bu.poll(t0 + us(7000));
        let l = bu.stats().latency;
        assert_eq!(l.count, 8);
        assert_eq!(l.sum_us, 50 + 5 * 100 + 900 + 5000);
        let cells: Vec<(u64, u64)> = l
            .fine
            .iter_recorded()
            .map(|v| (v.value_iterated_to(), v.count_at_value()))
            .collect();
        assert_eq!(cells, [(50, 1), (100, 5), (903, 1), (5023, 1)]);
        assert_eq!(l.counts.iter().sum::<u64>(), 8);
    }

    /// A fragment its RU flagged MISSING (a recording's dropped fragment, a producer's
    /// refused one) names its source in the built event, though every RU sent something.
    #[test]
    fn a_fragment_its_ru_flagged_missing_makes_the_event_partial() {
        let mut bu = bu_of(vec![1, 2]);
        let now = Instant::now();
        bu.handle(now, NodeRef::Evm, Message::Start);
        for id in 0..2u64 {
            let mut dropped = header(id, 2);
            if id == 1 {
                dropped.flags = FLAG_MISSING;
            }
            bu.handle_fragment(now, NodeRef::Ru(0), header(id, 1), Chain::new());
            bu.handle_fragment(now, NodeRef::Ru(1), dropped, Chain::new());
            let r = EventRange {
                bu: 0,
                first: id,
                count: 1,
            };
            bu.handle(now, NodeRef::Evm, Message::Assign(r, 0));
        }
        let mut built = Vec::new();
        while let Some(e) = bu.next_built() {
            built.push((e.event_id, e.missing_sources, e.trigger_mismatch));
        }
        assert_eq!(built, [(0, vec![], false), (1, vec![2], false)]);
        assert_eq!(bu.stats().partial_events, 1);
    }
}

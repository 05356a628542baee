//! The readout unit: makes its fragment of every event the EVM assigns, sends it to that
//! event's BU, and keeps it until the EVM says the event is released.
//!
//! One idea, one file: the RU's state machine.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

use evb_buffers::{BlockWriter, Chain, Pool};
use evb_wire::window::TIME_FRAME_HEADER_LEN;
use evb_wire::{write_fragment_prefix, EventRange, Message, FLAG_GENERATED, FRAGMENT_PREFIX_LEN};
use serde::{Deserialize, Serialize};

use crate::action::{
    abort, halt, resync_with_new_evm, waits_for_standby, Action, NodeRef, Path, RunState,
};
use crate::evm::RuResync;
use crate::generator::{Content, Generator};
use crate::ids::Bits;
use crate::source::{FragmentSpec, LiveFeed, Source};

/// Message and fragment headers in front of each payload.
pub const PREFIX_LEN: usize = FRAGMENT_PREFIX_LEN;

#[derive(Debug, Clone)]
pub struct RuConfig {
    pub index: u16,
    pub source_id: u16,
    pub source: Source,
    /// Fragments made per `poll`, so the driver gets back to IO regularly.
    pub max_per_poll: usize,
    /// Most bytes in one run of fragments (consecutive events for one BU sent and held as
    /// one piece): at most a page, and a barrel-shifter slot when shaping.
    pub max_run_bytes: usize,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
// A field left out of a node's Report counts as 0 (docs/protocol.md §4: an implementation
// sends the counters it keeps; the verdict then names what does not add up).
#[serde(default)]
pub struct RuStats {
    pub fragments_sent: u64,
    pub payload_bytes_sent: u64,
    /// Fragment payload bytes sent to each BU (index: the BU's), fragments sent again to
    /// the BU a lost one's events went to included: the RU→BU matrix of the run page.
    pub payload_bytes_to_bu: Vec<u64>,
    pub events_released: u64,
    /// Fragments still held (should be zero at the end of a clean run).
    pub retained: u64,
    pub retained_high_water: u64,
    /// Times generation waited for pool memory (back-pressure).
    pub pool_waits: u64,
    /// Assignments still waiting to be generated.
    pub pending_events: u64,
    /// Protocol errors seen (unknown releases, misaddressed messages).
    pub errors: u64,
    /// Recorded fragments dropped as invalid at load (sent as MISSING).
    pub dropped_at_source: u64,
    /// Fragments sent again because their event was reassigned from a lost BU.
    pub fragments_resent: u64,
    /// Live feed (front-end streams): fragments received over all streams.
    pub stream_fragments_received: u64,
    /// Live feed: events built with a stream flagged for sync loss (`on_sync_loss = "flag"`).
    pub sync_losses: u64,
    /// Live feed: the streams this RU is waiting for, and since when.
    pub waiting_for: Vec<String>,
    /// Live feed: fragments received and not sent in any event (at the end of a run: streams
    /// that sent more than another stream, of this RU or another, before the run ended).
    pub stream_fragments_unbuilt: u64,
    /// Live feed: the streams that had delivered no fragment when the run stopped. Not
    /// empty, the run built nothing of theirs: the verdict names them, whoever judges it
    /// (`evb run`, or a standalone EVM whose RUs run elsewhere).
    pub silent_streams: Vec<String>,
    /// Live frames built by time: the latency buffer's frames, bytes (headers included) and
    /// ticks held now (frames waiting for their slice, and the overlap kept for the next).
    pub frame_buffer_frames: u64,
    pub frame_buffer_bytes: u64,
    pub frame_buffer_ticks: u64,
    /// Live frames built by time: the most bytes the latency buffer held.
    pub frame_buffer_bytes_high_water: u64,
    /// Live frames built by time: the byte account of the latency buffer. Bytes in
    /// (frames, headers included) = bytes some window took + bytes evicted that no window
    /// took + bytes still held that no window took (decision windows), or = bytes in the
    /// slices' cores + bytes held in no core (time slices).
    pub frame_bytes_in: u64,
    pub frame_bytes_in_windows: u64,
    pub frame_bytes_in_slice_cores: u64,
    pub frames_evicted: u64,
    pub frame_bytes_evicted: u64,
    pub frame_bytes_evicted_unused: u64,
    pub frame_bytes_held_unused: u64,
    /// Barrel shifter (`traffic.shaping = "barrel"`, see `shaping::SlotTiming`): the slots
    /// in which this RU sent to a BU over the link; of those, the ones whose bytes waited
    /// for the slot, the ones among them whose first send came more than a tenth of a slot
    /// late (the RU woke late), and the ones started more than a tenth in because their
    /// bytes came then; how far into its slot the first send came where the bytes waited,
    /// on average and at most, in µs.
    pub barrel_slots: u64,
    pub barrel_slots_waited: u64,
    pub barrel_slots_late: u64,
    pub barrel_slots_started_mid_slot: u64,
    pub barrel_slip_mean_us: u64,
    pub barrel_slip_max_us: u64,
}

impl RuStats {
    /// A live stream's latency buffer's byte account in words, one way for every reader
    /// (`evb run`'s line, `evb ctl status`, the page): slices' `… kB in = … kB in slice
    /// cores + … kB held`, windows' `evicted N frames (… kB no window took)`; `None` without
    /// such a buffer.
    pub fn frame_account_words(&self) -> Option<String> {
        let kb = |b: u64| b as f64 / 1e3;
        if self.frame_bytes_in_slice_cores > 0 {
            Some(format!(
                "{:.1} kB in = {:.1} kB in slice cores + {:.1} kB held",
                kb(self.frame_bytes_in),
                kb(self.frame_bytes_in_slice_cores),
                kb(self.frame_bytes_held_unused)
            ))
        } else if self.frame_bytes_in > 0 {
            Some(format!(
                "evicted {} frames ({:.1} kB no window took)",
                self.frames_evicted,
                kb(self.frame_bytes_evicted_unused)
            ))
        } else {
            None
        }
    }

    /// A live stream's latency buffer whose bytes do not add up (a frame taken twice, or
    /// lost inside the RU), in words; `None` when they do, or there is no such buffer.
    pub fn frame_account_gap(&self) -> Option<String> {
        let inside = if self.frame_bytes_in_slice_cores > 0 {
            self.frame_bytes_in_slice_cores + self.frame_bytes_held_unused
        } else {
            self.frame_bytes_in_windows
                + self.frame_bytes_evicted_unused
                + self.frame_bytes_held_unused
        };
        (self.frame_bytes_in != inside).then(|| {
            format!(
                "its latency buffer's bytes do not add up: {} B of frames in, {inside} B in \
                 records' windows or slice cores, evicted or held",
                self.frame_bytes_in
            )
        })
    }
}

/// Most fragment bytes one `poll` makes (a few milliseconds of work).
const MAX_BYTES_PER_POLL: usize = 8 << 20;

/// Most separate pieces (pool slices) in one run: a run of fragments that do not sit next
/// to each other (plug-in producers' blocks, a live feed) still makes a short `writev`.
const MAX_RUN_PIECES: usize = 32;

/// Fragments of consecutive events for one BU, made in one pass: one action, one piece of
/// a page, one record held until every event in it is released. A small-event run costs
/// its bookkeeping once per run instead of once per event.
struct Run {
    /// The BU the run was sent to (a fragment sent again elsewhere: `Ru::resent_to`).
    bu: u16,
    count: u32,
    /// Events of the run still held.
    held: u32,
    /// Bit `i` set: event `first + i` is still held.
    bits: Bits,
    /// Where fragment `i` ends in `data` (it starts where fragment `i - 1` ends).
    ends: Vec<u32>,
    data: Chain,
}

impl Run {
    fn fragment(&self, i: usize) -> Chain {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.data.sub(start, self.ends[i] as usize - start)
    }

    fn is_held(&self, i: usize) -> bool {
        self.bits.get(i)
    }
}

/// The run being made in this pass.
struct OpenRun {
    bu: u16,
    /// The incarnation of `bu` its assignment named.
    inc: u16,
    first: u64,
    ends: Vec<u32>,
    data: Chain,
}

impl OpenRun {
    /// The length of its last fragment (0 while it has none).
    fn last_len(&self) -> usize {
        match self.ends[..] {
            [] => 0,
            [end] => end as usize,
            [.., before, end] => (end - before) as usize,
        }
    }

    /// Event `id` for `bu` may go at its end: the same BU, the next event, room for another
    /// piece.
    fn continues(&self, bu: u16, inc: u16, id: u64) -> bool {
        self.bu == bu
            && self.inc == inc
            && self.first + self.ends.len() as u64 == id
            && self.data.slices().len() < MAX_RUN_PIECES
    }

    /// One more fragment keeps the run within `max_bytes`: as long as its last would not
    /// pass it (a run of varied sizes passes its limit by less than one fragment).
    fn has_room(&self, data_len: usize, last: usize, max_bytes: usize) -> bool {
        data_len + last <= max_bytes
    }
}

pub struct Ru {
    cfg: RuConfig,
    /// How many BUs the run has, where known ([`Ru::with_bus`]).
    bus: Option<u16>,
    /// The barrel shifter's slots as kept so far ([`Ru::note_slot_timing`]).
    slots: crate::shaping::SlotTiming,
    pool: Pool,
    state: RunState,
    /// Assignments not made yet, each with the incarnation of its BU that it names.
    pending: VecDeque<(EventRange, u16)>,
    /// Runs of fragments still held, by their first event id.
    retained: BTreeMap<u64, Run>,
    /// Fragments held over all runs.
    retained_count: u64,
    /// One past the newest event made: an assignment below it is a reassignment.
    made_until: u64,
    block: Option<BlockWriter>,
    actions: VecDeque<Action>,
    stats: RuStats,
    /// The last poll stopped for want of pool memory.
    blocked: bool,
    /// Static generator content: made once, sent from memory (see `Content::Static`).
    template: Option<Template>,
    /// When the run started here: decision windows read the frames' arrival from it.
    started: Option<Instant>,
    /// The decision window at the front waits for its data (its record).
    waiting: Option<u64>,
    /// Decision windows: when each assignment came (one past its last record, the time).
    assigned_at: VecDeque<(u64, Instant)>,
    /// Held fragments sent again to another BU than their run's (reassigned), by id.
    resent_to: HashMap<u64, u16>,
    /// The run has a standby EVM: losing the EVM waits for it instead of ending the run.
    standby: bool,
    /// Offset vectors of released runs, emptied, for the next runs: a run's vector grew
    /// from nothing to its hundreds of fragments, reallocating as it went (a few percent
    /// of a small-event RU went to the allocator).
    spare_ends: Vec<Vec<u32>>,
}

/// Offset vectors kept for new runs (a few more than the runs a page of credits holds).
const SPARE_ENDS: usize = 64;

/// Static payloads up to this size are copied after their prefix instead of referenced.
pub(crate) const STATIC_INLINE_MAX: usize = 4096;

/// A source's static payload, as long as the largest fragment, in pool blocks (so shared
/// memory transports can pass it by reference), with the CRC32C of every multiple of
/// `CRC_STEP` bytes of it: a fragment's CRC is then one of those plus under `CRC_STEP` bytes.
struct Template {
    payload: Chain,
    marks: Vec<u32>,
    /// The last length asked for and its CRC (fixed sizes ask for one length only); a cell,
    /// so that the payload can be read while CRCs are asked for.
    last: Cell<(usize, u32)>,
}

const CRC_STEP: usize = 4096;

impl Template {
    /// Source `src`'s payload as long as the largest fragment, written into blocks of `pool`;
    /// `None` if the pool cannot hold it now.
    fn make(pool: &Pool, g: &Generator, src: u16) -> Option<Template> {
        let max = g.sizes.max();
        let mut writers = Vec::new();
        let mut room = 0;
        while room < max {
            let w = pool.try_alloc()?;
            room += w.remaining();
            writers.push(w);
        }
        let mut payload = Chain::new();
        for mut w in writers {
            let (offset, n) = (payload.len(), (max - payload.len()).min(w.remaining()));
            g.fill(0, src, offset, &mut w.spare_mut()[..n]);
            w.advance(n);
            payload.push(w.slice(0, n));
        }
        Some(Template::new(payload))
    }

    fn new(payload: Chain) -> Template {
        let mut marks = vec![0];
        let mut crc = 0;
        let mut at = 0;
        while at + CRC_STEP <= payload.len() {
            for c in payload.sub(at, CRC_STEP).chunks() {
                crc = crc32c::crc32c_append(crc, c);
            }
            marks.push(crc);
            at += CRC_STEP;
        }
        let t = Template {
            payload,
            marks,
            last: Cell::new((0, 0)),
        };
        t.last.set((0, t.crc_of(0)));
        t
    }

    /// The CRC32C of the first `size` bytes.
    fn crc(&self, size: usize) -> u32 {
        let (last, crc) = self.last.get();
        if last == size {
            return crc;
        }
        let crc = self.crc_of(size);
        self.last.set((size, crc));
        crc
    }

    fn crc_of(&self, size: usize) -> u32 {
        let k = size / CRC_STEP;
        let mut crc = self.marks[k];
        for c in self.payload.sub(k * CRC_STEP, size - k * CRC_STEP).chunks() {
            crc = crc32c::crc32c_append(crc, c);
        }
        crc
    }
}

impl Ru {
    pub fn new(cfg: RuConfig, pool: Pool) -> Ru {
        Ru {
            cfg,
            pool,
            state: RunState::Configured,
            pending: VecDeque::new(),
            retained: BTreeMap::new(),
            spare_ends: Vec::new(),
            retained_count: 0,
            made_until: 0,
            block: None,
            actions: VecDeque::new(),
            stats: RuStats::default(),
            blocked: false,
            resent_to: HashMap::new(),
            standby: false,
            template: None,
            started: None,
            waiting: None,
            assigned_at: VecDeque::new(),
            bus: None,
            slots: crate::shaping::SlotTiming::default(),
        }
    }

    /// The run has `bus` BUs (indices 0…bus-1): an Assign naming another is refused by
    /// name instead of being held for a BU that cannot connect.
    pub fn with_bus(mut self, bus: u16) -> Ru {
        self.bus = Some(bus);
        self
    }

    pub fn state(&self) -> RunState {
        self.state
    }

    /// The barrel shifter's slots as kept so far (the driver's shaper keeps the time).
    pub fn note_slot_timing(&mut self, t: crate::shaping::SlotTiming) {
        self.slots = t;
    }

    pub fn stats(&self) -> RuStats {
        let mut s = self.stats.clone();
        let t = &self.slots;
        s.barrel_slots = t.slots;
        s.barrel_slots_waited = t.waited;
        s.barrel_slots_late = t.late;
        s.barrel_slots_started_mid_slot = t.started_mid_slot;
        s.barrel_slip_mean_us = (t.slip_ns_total / t.waited.max(1)) / 1000;
        s.barrel_slip_max_us = t.slip_ns_max / 1000;
        match &self.cfg.source {
            Source::Playback(r) => s.dropped_at_source = r.dropped,
            Source::Live(f) => {
                s.dropped_at_source = f.stats.dropped;
                s.stream_fragments_received = f.stats.fragments_received;
                s.sync_losses = f.stats.sync_losses;
                s.waiting_for = f.stats.waiting_for.clone();
                s.stream_fragments_unbuilt = f.unbuilt();
                s.silent_streams = f.stats.silent.clone();
                if let Some(b) = f.stats.slices {
                    s.frame_buffer_frames = b.held_frames;
                    s.frame_buffer_bytes = b.held_bytes;
                    s.frame_buffer_ticks = b.held_ticks;
                    s.frame_buffer_bytes_high_water = b.held_bytes_high_water;
                    s.frame_bytes_in = b.bytes_in;
                    s.frame_bytes_in_slice_cores = b.core_bytes;
                    s.frame_bytes_held_unused = b.held_bytes;
                }
                if let Some(b) = &f.windows {
                    let w = b.stats();
                    s.stream_fragments_received = w.frames_in;
                    s.frame_buffer_frames = w.held_frames;
                    s.frame_buffer_bytes = w.held_bytes;
                    s.frame_buffer_ticks = w.held_ticks;
                    s.frame_buffer_bytes_high_water = w.held_bytes_high_water;
                    s.frame_bytes_in = w.bytes_in;
                    s.frame_bytes_in_windows = w.used_bytes;
                    s.frames_evicted = w.evicted_frames;
                    s.frame_bytes_evicted = w.evicted_bytes;
                    s.frame_bytes_evicted_unused = w.evicted_unused_bytes;
                    s.frame_bytes_held_unused = w.held_unused_bytes;
                }
            }
            Source::Generator(_) | Source::Frames(_) => {}
        }
        s.retained = self.retained_count;
        s.pending_events = self.pending.iter().map(|(r, _)| r.count as u64).sum();
        s
    }

    /// More fragments could be made right now (the driver should not sleep).
    /// (A decision window waiting for its data is not work: the driver polls again within a
    /// millisecond, `run.rate_hz` being set in a run by windows.)
    pub fn has_work(&self) -> bool {
        !self.pending.is_empty() && !self.blocked && self.waiting.is_none()
    }

    /// The live feed this RU's front-end streams supply, if that is its source.
    pub fn live_mut(&mut self) -> Option<&mut LiveFeed> {
        match &mut self.cfg.source {
            Source::Live(f) => Some(f),
            _ => None,
        }
    }

    /// The data source cannot go on (a bad fragment under `on_error = "stop"`, a sync loss,
    /// an unreadable stream): the EVM is told why, and this RU leaves the run.
    pub fn source_failed(&mut self, reason: String) {
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

    /// The decisions' windows, in a run by decision windows.
    fn windows_mut(&mut self) -> Option<&mut crate::frames::Windows> {
        match &mut self.cfg.source {
            Source::Frames(f) => f.windows.as_mut(),
            Source::Live(f) => f.windows.as_mut().map(|b| b.windows_mut()),
            _ => None,
        }
    }

    /// Records are decision windows, each waited for from its Assign.
    fn by_windows(&self) -> bool {
        match &self.cfg.source {
            Source::Frames(f) => f.windows.is_some(),
            Source::Live(f) => f.windows.is_some(),
            _ => false,
        }
    }

    /// Tells the EVM how many events the live feed holds, when that changed.
    fn announce(&mut self, now: Instant) {
        let Source::Live(f) = &mut self.cfg.source else {
            return;
        };
        if f.windows.is_some() {
            return;
        }
        // events [0, assigned) are assigned to this RU: made, or waiting to be
        let assigned = self
            .pending
            .iter()
            .map(|(r, _)| r.first + r.count as u64)
            .fold(f.next_id(), u64::max);
        if let Some((count, done)) = f.announcement(now, assigned) {
            self.actions.push_back(Action::Send {
                to: NodeRef::Evm,
                msg: Message::Available { count, done },
                path: Path::Now,
            });
        }
    }

    pub fn next_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Every connection is up: tell the EVM (again, where the run has not started: the
    /// first EVM connection was not the run's EVM's).
    pub fn connections_up(&mut self) {
        if matches!(self.state, RunState::Configured | RunState::Ready) {
            self.state = RunState::Ready;
            // A live feed says what it holds before Ready: the EVM gates on it from the start.
            self.announce(Instant::now());
            let available = self.cfg.source.available().unwrap_or(evb_wire::UNLIMITED);
            self.actions.push_back(Action::Send {
                to: NodeRef::Evm,
                msg: Message::Ready { available },
                path: Path::Now,
            });
        }
    }

    pub fn handle(&mut self, now: Instant, from: NodeRef, msg: Message) {
        if from != NodeRef::Evm {
            self.stats.errors += 1;
            return;
        }
        match msg {
            Message::Start => {
                self.state = RunState::Running;
                // the streams' clock (decision windows) starts with the RU's first Start; a
                // standby's Start after a takeover does not move it
                self.started.get_or_insert(now);
            }
            Message::Window { first, windows } => match self.windows_mut() {
                Some(w) if w.outside => w.decide(first, &windows),
                _ => {
                    tracing::warn!("a Window message in a run not decided from outside");
                    self.stats.errors += 1;
                }
            },
            Message::Assign(r, _) if self.bus.is_some_and(|n| r.bu >= n) => {
                tracing::warn!(
                    "the EVM assigned events {}..{} to bu[{}], which this run does not have \
                     ({} BUs): refused",
                    r.first,
                    r.end(),
                    r.bu,
                    self.bus.unwrap_or(0)
                );
                self.stats.errors += 1;
            }
            Message::Assign(r, inc) if r.count > 0 => {
                if self.by_windows() {
                    // a window's wait for its data runs from its Assign
                    self.assigned_at.push_back((r.first + r.count as u64, now));
                }
                self.pending.push_back((r, inc));
            }
            // A valid release never names more events than this RU holds: a bigger one is
            // refused whole rather than walked id by id.
            Message::Release(r) if r.count as u64 > self.retained_count => {
                self.stats.errors += 1;
            }
            Message::Release(r) => self.release(r),
            Message::Stop { .. } => {
                self.state = RunState::Stopping;
                let report = serde_json::to_string(&self.stats()).unwrap_or_default();
                self.actions.push_back(Action::Send {
                    to: NodeRef::Evm,
                    msg: Message::Report(report),
                    path: Path::Now,
                });
            }
            Message::Halt => {
                let ok =
                    self.retained_count == 0 && self.pending.is_empty() && self.stats.errors == 0;
                halt(&mut self.state, &mut self.actions, ok);
            }
            Message::Abort(why) => {
                let reason = format!("run aborted: {why}");
                abort(&mut self.state, &mut self.actions, reason);
            }
            _ => self.stats.errors += 1,
        }
    }

    /// A lost BU is the EVM's business (it reassigns the BU's events, which come back here
    /// as new assignments); losing the EVM ends the run.
    pub fn peer_lost(&mut self, peer: NodeRef, reason: &str) {
        if let NodeRef::Bu(bu) = peer {
            return self.link_lost(bu, 0);
        }
        if self.state.is_over() {
            return;
        }
        if peer != NodeRef::Evm {
            return;
        }
        if waits_for_standby(self.standby, self.state) {
            // a standby EVM takes over: go on making what was assigned, and wait for it
            // (the driver ends the wait, and the run, if none comes in time)
            return;
        }
        let reason = format!("lost {peer}: {reason}");
        abort(&mut self.state, &mut self.actions, reason);
    }

    /// The data connection to BU `bu`'s process of incarnation `inc` (0: not known) closed.
    /// The EVM cannot see a data link: tell it, or the BU's events would wait on fragments
    /// that cannot arrive until the run stalls. The incarnation lets the EVM tell a report
    /// about a process already replaced (late) from one about the BU in the run.
    pub fn link_lost(&mut self, bu: u16, inc: u16) {
        if self.state == RunState::Running {
            self.actions.push_back(Action::Send {
                to: NodeRef::Evm,
                msg: Message::LinkLost { peer: bu, inc },
                path: Path::Now,
            });
        }
    }

    /// The run has a standby EVM (docs/standby.md): losing the EVM while running is not the
    /// end of the run.
    pub fn set_standby(&mut self, standby: bool) {
        self.standby = standby;
    }

    /// What this RU tells a new EVM that takes the run over: how far its assignments go,
    /// and every event it holds or has yet to make, with the BU its fragment goes to
    /// (the latest assignment of each: a reassignment not made yet counts).
    pub fn resync(&mut self) -> RuResync {
        resync_with_new_evm(&mut self.state, &mut self.actions);
        // a live feed tells the new EVM what it holds (after the resync: the driver sends
        // that first), or the new EVM would assign no event past the ones already assigned
        if let Source::Live(f) = &mut self.cfg.source {
            f.announce_again();
        }
        self.announce(Instant::now());
        let mut dest: BTreeMap<u64, u16> = BTreeMap::new();
        for (&first, run) in &self.retained {
            for i in 0..run.count as usize {
                if run.is_held(i) {
                    let id = first + i as u64;
                    let bu = self.resent_to.get(&id).copied().unwrap_or(run.bu);
                    dest.insert(id, bu);
                }
            }
        }
        let mut known_until = self.made_until;
        for (r, _) in &self.pending {
            for id in r.first..r.end() {
                dest.insert(id, r.bu);
            }
            known_until = known_until.max(r.end());
        }
        let mut holds: Vec<EventRange> = Vec::new();
        for (id, bu) in dest {
            match holds.last_mut() {
                Some(l) if l.bu == bu && l.end() == id => l.count += 1,
                _ => holds.push(EventRange {
                    bu,
                    first: id,
                    count: 1,
                }),
            }
        }
        RuResync {
            ru: self.cfg.index,
            known_until,
            holds,
            stopping: self.state == RunState::Stopping,
        }
    }

    /// Generates assigned fragments while pool memory lasts.
    pub fn poll(&mut self, now: Instant) {
        // The run being made: a local of this pass, which closes it at the end.
        let mut open: Option<OpenRun> = None;
        let mut made = 0;
        let mut bytes = 0usize;
        self.blocked = false;
        if !self.state.is_over() && self.state != RunState::Configured {
            self.announce(now);
        }
        // Bounded by count and by bytes: a pass that writes hundreds of MB (large fragments,
        // a large pool) keeps the node from reading its sockets and sending heartbeats.
        while made < self.cfg.max_per_poll && bytes < MAX_BYTES_PER_POLL {
            let Some(&(r, inc)) = self.pending.front() else {
                break;
            };
            let (event_id, bu) = (r.first, r.bu);
            if event_id < self.made_until {
                // Reassigned from a lost BU: the same bytes go to the new one.
                self.close_run(&mut open);
                match self.held_fragment(event_id) {
                    Some(data) => {
                        self.resent_to.insert(event_id, bu);
                        self.count_to_bu(bu, data.len().saturating_sub(PREFIX_LEN));
                        self.actions.push_back(Action::SendFragments {
                            to: NodeRef::Bu(bu),
                            inc,
                            data,
                            count: 1,
                        });
                        self.stats.fragments_resent += 1;
                    }
                    None => {
                        // released already, or never made: the EVM does neither
                        tracing::warn!("assigned event {event_id}, which this RU no longer holds");
                        self.stats.errors += 1;
                    }
                }
                self.advance_pending(1);
                made += 1;
                continue;
            }
            let (n, size) = self.static_run(&mut open, self.cfg.max_per_poll - made);
            if n > 0 {
                made += n;
                bytes += size;
                continue;
            }
            if self.by_windows() {
                while self
                    .assigned_at
                    .front()
                    .is_some_and(|&(end, _)| end <= event_id)
                {
                    self.assigned_at.pop_front();
                }
                if self.windows_mut().is_some_and(|w| !w.knows(event_id)) {
                    // a decision from outside whose Window has not come: it precedes the
                    // Assign on the EVM's connection, so this is a protocol error
                    let reason =
                        format!("assigned record {event_id}, whose window the EVM never sent");
                    self.close_run(&mut open);
                    self.source_failed(reason);
                    return;
                }
                let since = self.assigned_at.front().map_or(now, |&(_, t)| t);
                let waited = now.saturating_duration_since(since);
                let started = *self.started.get_or_insert(now);
                let source = self.cfg.source_id;
                let cut = match &mut self.cfg.source {
                    Source::Frames(f) => f
                        .cut_now(
                            event_id,
                            source,
                            now.saturating_duration_since(started),
                            waited,
                        )
                        .map(|c| f.set_cut(event_id, c)),
                    // a live stream: the window cut from the latency buffer, into the feed
                    Source::Live(feed) if feed.next_id() == event_id && feed.queued() == 0 => {
                        match feed.windows.as_mut().map(|b| b.cut(event_id, waited)) {
                            Some(None) => None,
                            Some(Some(a)) => {
                                feed.supply(a);
                                Some(())
                            }
                            None => Some(()),
                        }
                    }
                    // cut already, waiting for pool memory
                    _ => Some(()),
                };
                if cut.is_none() {
                    self.waiting = Some(event_id);
                    break;
                }
                self.waiting = None;
                if let Some(w) = self.windows_mut() {
                    w.forget_before(event_id);
                }
            }
            if !self.cfg.source.has_event(event_id) {
                // The EVM assigns only what `Available` announced, in order.
                let reason = format!(
                    "assigned event {event_id}, which the front-end streams have not supplied"
                );
                self.close_run(&mut open);
                self.source_failed(reason);
                return;
            }
            let Some(size) = self.make_into_run(&mut open, bu, inc, event_id) else {
                self.stats.pool_waits += 1;
                self.blocked = true;
                break;
            };
            self.count_made(bu, event_id, 1, size - PREFIX_LEN);
            if let Source::Live(f) = &mut self.cfg.source {
                f.consumed(event_id);
            }
            bytes += size;
            made += 1;
        }
        self.close_run(&mut open);
    }

    /// Static content with small payloads, the open run continuing the front assignment in
    /// the current block: as many of its fragments as the block and the run hold, made in
    /// one loop and counted once (made one by one through [`Ru::make_into_run`], the RU's
    /// own bookkeeping cost more than writing a 256 B fragment). The run's limits are
    /// `make_into_run`'s. Returns the fragments made and their bytes; `(0, 0)` leaves the
    /// next fragment to the general path (a run to open or close, a fresh block, a large
    /// payload, a reassignment).
    fn static_run(&mut self, open: &mut Option<OpenRun>, max_count: usize) -> (usize, usize) {
        let Source::Generator(g) = &self.cfg.source else {
            return (0, 0);
        };
        let (Some((r, inc)), Some(o), Some(t), Some(block)) = (
            self.pending.front().copied(),
            open.as_mut(),
            self.template.as_mut(),
            self.block.as_mut(),
        ) else {
            return (0, 0);
        };
        let joins = g.content == Content::Static
            && r.first >= self.made_until
            && o.continues(r.bu, inc, r.first);
        if !joins {
            return (0, 0);
        }
        let src = self.cfg.source_id;
        let mut data_len = o.data.len();
        let mut last = o.last_len();
        let start = block.filled();
        let max = (r.count as usize).min(max_count);
        // The block's free tail and the template's first slice, found once for the loop: at
        // each fragment, each was a chain of dependent loads (writer, block, pool, region).
        let spare = block.spare_mut();
        let template: &[u8] = t.payload.slices().first().map_or(&[], |s| s);
        let mut at = 0;
        let mut n = 0;
        while n < max {
            let id = r.first + n as u64;
            let size = g.size(id, src);
            let need = PREFIX_LEN + size;
            if size > STATIC_INLINE_MAX
                || spare.len() - at < need
                || !o.has_room(data_len, last, self.cfg.max_run_bytes)
            {
                break;
            }
            let spec = FragmentSpec {
                size,
                trigger_number: id as u32,
                flags: FLAG_GENERATED,
            };
            let dst = &mut spare[at..at + need];
            write_fragment_prefix(&spec.header(id, src, t.crc(size)), dst);
            match template.get(..size) {
                Some(bytes) => dst[PREFIX_LEN..].copy_from_slice(bytes),
                None => {
                    t.payload.copy_prefix(&mut dst[PREFIX_LEN..]);
                }
            }
            at += need;
            data_len += need;
            last = need;
            o.ends.push(data_len as u32);
            n += 1;
        }
        if n == 0 {
            return (0, 0);
        }
        block.advance(at);
        let written = at;
        o.data.push_from(block, start, written);
        if block.remaining() < PREFIX_LEN {
            self.block = None;
        }
        self.count_made(r.bu, r.first, n, written - n * PREFIX_LEN);
        (n, written)
    }

    /// `n` fragments of the front assignment's events `first..` were made for `bu`, with
    /// `payload` bytes in all: counted, and the assignment moves past them.
    fn count_made(&mut self, bu: u16, first: u64, n: usize, payload: usize) {
        self.advance_pending(n as u32);
        self.stats.fragments_sent += n as u64;
        self.stats.payload_bytes_sent += payload as u64;
        self.count_to_bu(bu, payload);
        self.made_until = first + n as u64;
    }

    /// Makes event `id`'s fragment at the end of the open run for `bu` (a new run when the
    /// open one is for another BU, not followed by `id`, or full: one more fragment as long
    /// as its last would pass the byte limit, or the piece limit is reached; with sizes that
    /// vary a run passes its byte limit by less than one fragment, which a frame's limit
    /// allows for). Returns the fragment's length, `None` when the pool cannot hold it now
    /// (the run is left as it was).
    fn make_into_run(
        &mut self,
        open: &mut Option<OpenRun>,
        bu: u16,
        inc: u16,
        id: u64,
    ) -> Option<usize> {
        let joins = open.as_ref().is_some_and(|o| {
            o.continues(bu, inc, id)
                && o.has_room(o.data.len(), o.last_len(), self.cfg.max_run_bytes)
        });
        if !joins {
            self.close_run(open);
        }
        let o = open.get_or_insert_with(|| OpenRun {
            bu,
            inc,
            first: id,
            ends: self.spare_ends.pop().unwrap_or_default(),
            data: Chain::new(),
        });
        let before = o.data.len();
        let made = self.make_fragment(id, &mut o.data).map(|()| {
            o.ends.push(o.data.len() as u32);
            o.data.len() - before
        });
        if o.ends.is_empty() {
            // nothing made into a run just begun
            *open = None;
        }
        made
    }

    /// The held fragment of event `id`, if any.
    fn held_fragment(&self, id: u64) -> Option<Chain> {
        let (&first, run) = self.retained.range(..=id).next_back()?;
        let i = (id - first) as usize;
        (i < run.count as usize && run.is_held(i)).then(|| run.fragment(i))
    }

    /// `bytes` of fragment payload go to BU `bu`.
    fn count_to_bu(&mut self, bu: u16, bytes: usize) {
        let to = &mut self.stats.payload_bytes_to_bu;
        let i = usize::from(bu);
        if to.len() <= i {
            to.resize(i + 1, 0);
        }
        to[i] += bytes as u64;
    }

    /// Sends the open run and holds it until its events are released.
    fn close_run(&mut self, open: &mut Option<OpenRun>) {
        let Some(o) = open.take() else { return };
        let count = o.ends.len() as u32;
        self.actions.push_back(Action::SendFragments {
            to: NodeRef::Bu(o.bu),
            inc: o.inc,
            data: o.data.clone(),
            count,
        });
        self.retained.insert(
            o.first,
            Run {
                bu: o.bu,
                count,
                held: count,
                bits: Bits::full(count as usize),
                ends: o.ends,
                data: o.data,
            },
        );
        self.retained_count += count as u64;
        self.stats.retained_high_water = self.stats.retained_high_water.max(self.retained_count);
    }

    /// The EVM released `r`: the runs' fragments it names are dropped (a run's blocks return
    /// once all its events are released). Ids this RU does not hold are errors.
    fn release(&mut self, r: EventRange) {
        let (a, b) = (r.first, r.end());
        let from = self
            .retained
            .range(..=a)
            .next_back()
            .map_or(a, |(&first, _)| first);
        let mut found = 0u64;
        let mut emptied = Vec::new();
        for (&first, run) in self.retained.range_mut(from..b) {
            let lo = a.max(first);
            let hi = b.min(first + run.count as u64);
            for id in lo..hi {
                if run.bits.clear((id - first) as usize) {
                    run.held -= 1;
                    found += 1;
                }
            }
            if run.held == 0 {
                emptied.push(first);
            }
        }
        for first in emptied {
            if let Some(mut run) = self.retained.remove(&first) {
                if self.spare_ends.len() < SPARE_ENDS {
                    run.ends.clear();
                    self.spare_ends.push(run.ends);
                }
            }
        }
        if !self.resent_to.is_empty() {
            self.resent_to.retain(|id, _| !(a..b).contains(id));
        }
        self.retained_count -= found;
        self.stats.events_released += found;
        self.stats.errors += r.count as u64 - found;
    }

    /// The front assignment moves past `n` of its events (made or sent again).
    fn advance_pending(&mut self, n: u32) {
        let (r, _) = self.pending.front_mut().expect("a pending range");
        r.first += n as u64;
        r.count -= n;
        if r.count == 0 {
            self.pending.pop_front();
        }
    }

    /// Writes one fragment (prefix then payload) into pool blocks and appends it to `run`.
    /// Small fragments share a block; large ones span several. `None` (and `run` as it was)
    /// if the pool cannot hold it now.
    fn make_fragment(&mut self, event_id: u64, run: &mut Chain) -> Option<()> {
        if let Source::Live(f) = &self.cfg.source {
            // a plug-in producer wrote it into the pool already: zero copy
            if let Some(written) = f.written(event_id) {
                run.append(written.clone());
                return Some(());
            }
        }
        if matches!(&self.cfg.source, Source::Generator(g) if g.content == Content::Static) {
            return self.static_fragment(event_id, run);
        }
        if let Source::Frames(f) = &self.cfg.source {
            if let Some(p) = f.static_pieces(event_id, self.cfg.source_id) {
                return self.static_frames_fragment(event_id, p, run);
            }
        }
        let g = &self.cfg.source;
        let src = self.cfg.source_id;
        let spec = g.spec(event_id, src);
        let size = spec.size;
        let total = PREFIX_LEN + size;
        let block_size = self.pool.block_size();

        // The common case for small fragments: all of it in the current block.
        if let Some(w) = self.block.as_mut().filter(|b| b.remaining() >= total) {
            let spare = &mut w.spare_mut()[..total];
            g.fill(event_id, src, 0, &mut spare[PREFIX_LEN..]);
            let crc = crc32c::crc32c(&spare[PREFIX_LEN..]);
            write_fragment_prefix(&spec.header(event_id, src, crc), spare);
            let start = w.filled();
            w.advance(total);
            run.push_from(w, start, total);
            if w.remaining() <= PREFIX_LEN {
                self.block = None;
            }
            return Some(());
        }

        // Writers that will hold the fragment: the current block if it fits, else fresh ones.
        let mut writers: Vec<BlockWriter> = Vec::new();
        match self.block.take() {
            Some(b) if b.remaining() >= total => writers.push(b),
            Some(b) if b.remaining() >= PREFIX_LEN && total > block_size => writers.push(b),
            _ => {}
        }
        let mut room: usize = writers.iter().map(BlockWriter::remaining).sum();
        while room < total {
            match self.pool.try_alloc() {
                Some(w) => {
                    room += w.remaining();
                    writers.push(w);
                }
                None => {
                    // Give back what was taken (the partly used block stays current).
                    if let Some(first) = writers.into_iter().next() {
                        if first.filled() > 0 {
                            self.block = Some(first);
                        }
                    }
                    return None;
                }
            }
        }

        // Payload first (after room for the prefix), CRC as it goes, prefix last.
        let mut crc = 0u32;
        let mut offset = 0usize;
        let mut lens = Vec::with_capacity(writers.len());
        for (i, w) in writers.iter_mut().enumerate() {
            let skip = if i == 0 { PREFIX_LEN } else { 0 };
            let want = (size - offset).min(w.remaining() - skip);
            let spare = &mut w.spare_mut()[skip..skip + want];
            g.fill(event_id, src, offset, spare);
            crc = crc32c::crc32c_append(crc, spare);
            offset += want;
            lens.push(skip + want);
            if offset == size {
                break;
            }
        }
        let header = spec.header(event_id, src, crc);
        write_fragment_prefix(&header, writers[0].spare_mut());
        let used = lens.len();
        for (w, len) in writers.iter_mut().zip(lens) {
            let start = w.filled();
            w.advance(len);
            run.push_from(w, start, len);
        }
        // Keep the last block as current if it has room for more fragments.
        if let Some(last) = writers.into_iter().nth(used - 1) {
            if last.remaining() > PREFIX_LEN {
                self.block = Some(last);
            }
        }
        Some(())
    }

    /// A window fragment of static frames: its prefix, head and frame headers written into
    /// the current block, each frame's payload a reference to the template (made on first
    /// use), as a readout that DMAs its frames into memory sends them. `None` if the pool
    /// cannot hold it now.
    fn static_frames_fragment(
        &mut self,
        event_id: u64,
        p: crate::frames::StaticPieces,
        run: &mut Chain,
    ) -> Option<()> {
        let Source::Frames(f) = &self.cfg.source else {
            unreachable!("static frames come from the frame generator")
        };
        let src = self.cfg.source_id;
        if self.template.is_none() {
            self.template = Some(Template::make(&self.pool, &f.frames, src)?);
        }
        let spec = f.spec(event_id, src);
        let headers = p.frames().count() * TIME_FRAME_HEADER_LEN;
        let need = PREFIX_LEN + p.head().len() + headers;
        let mut block = match self.block.take() {
            Some(b) if b.remaining() >= need => b,
            _ => self.pool.try_alloc().filter(|b| b.remaining() >= need)?,
        };
        let t = self.template.as_ref().expect("made above");
        let start = block.filled();
        let spare = block.spare_mut();
        write_fragment_prefix(&spec.header(event_id, src, p.crc), spare);
        let head = p.head();
        spare[PREFIX_LEN..PREFIX_LEN + head.len()].copy_from_slice(head);
        let mut at = PREFIX_LEN + head.len();
        for (h, _) in p.frames() {
            spare[at..at + TIME_FRAME_HEADER_LEN].copy_from_slice(h);
            at += TIME_FRAME_HEADER_LEN;
        }
        block.advance(need);
        run.push_from(&block, start, PREFIX_LEN + head.len());
        let mut at = start + PREFIX_LEN + head.len();
        for (_, size) in p.frames() {
            run.push_from(&block, at, TIME_FRAME_HEADER_LEN);
            at += TIME_FRAME_HEADER_LEN;
            run.append(t.payload.sub(0, size));
        }
        if block.remaining() >= PREFIX_LEN {
            self.block = Some(block);
        }
        Some(())
    }

    /// A fragment of static content: its prefix written into the current block, its payload
    /// a reference to the template (made on first use). `None` if the pool cannot hold it now.
    fn static_fragment(&mut self, event_id: u64, run: &mut Chain) -> Option<()> {
        let Source::Generator(g) = &self.cfg.source else {
            unreachable!("static content comes from the generator")
        };
        let src = self.cfg.source_id;
        if self.template.is_none() {
            self.template = Some(Template::make(&self.pool, g, src)?);
        }
        let spec = self.cfg.source.spec(event_id, src);
        let size = spec.size;
        // Small payloads are copied next to their prefix: a copy of a few KiB costs less than
        // a separate piece for the kernel to gather, and consecutive fragments then form one.
        let inline = size <= STATIC_INLINE_MAX && PREFIX_LEN + size <= self.pool.block_size();
        let need = PREFIX_LEN + if inline { size } else { 0 };
        let mut block = match self.block.take() {
            Some(b) if b.remaining() >= need => b,
            _ => self.pool.try_alloc()?,
        };
        let t = self.template.as_mut().expect("made above");
        let header = spec.header(event_id, src, t.crc(size));
        let start = block.filled();
        write_fragment_prefix(&header, block.spare_mut());
        if inline {
            t.payload
                .copy_prefix(&mut block.spare_mut()[PREFIX_LEN..need]);
        }
        block.advance(need);
        run.push_from(&block, start, need);
        if !inline {
            run.append(t.payload.sub(0, size));
        }
        if block.remaining() >= PREFIX_LEN {
            self.block = Some(block);
        }
        Some(())
    }
}

#[cfg(test)]
mod template_tests {
    use super::*;

    #[test]
    fn template_crcs_match_the_bytes_at_every_length() {
        let pool = Pool::new("t", 5000, 8);
        let mut payload = Chain::new();
        let mut all = Vec::new();
        for i in 0..4 {
            let mut w = pool.try_alloc().unwrap();
            let bytes: Vec<u8> = (0..5000).map(|j| (i * 31 + j * 7) as u8).collect();
            w.spare_mut()[..5000].copy_from_slice(&bytes);
            w.advance(5000);
            payload.push(w.slice(0, 5000));
            all.extend(bytes);
        }
        let t = Template::new(payload);
        for size in [0, 1, 4095, 4096, 4097, 5000, 8192, 12_345, 16_384, 20_000] {
            assert_eq!(t.crc(size), crc32c::crc32c(&all[..size]), "size {size}");
        }
    }
}

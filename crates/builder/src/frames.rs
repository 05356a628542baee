//! Building by time (docs/architecture.md, "Building by time"): how records are cut from
//! the streams' ticks, the generator's continuous time frames, and the BU's checks of a
//! window fragment.
//!
//! Under `builder.by = "time"` record k is time slice k: its *core* is ticks
//! `[k·S, (k+1)·S)` and it carries every frame that *begins* in `[k·S, (k+1)·S + O)`, so a
//! frame belongs to exactly one core (the one holding its first tick) and the frames that
//! begin in the first `O` ticks of a core are carried again by the slice before it, as its
//! overlap (CBM's convention for microslices in timeslices).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use evb_buffers::Chain;
use evb_wire::super_fragment::SuperEntry;
use evb_wire::window::{
    decode_window, window_directory_len, DecisionWindow, TimeFrameHeader, WindowFragment,
    WindowHeader, WindowStatus, TIME_FRAME_GENERATED, TIME_FRAME_HEADER_LEN, WINDOW_HEADER_LEN,
};
use evb_wire::{FragmentHeader, FLAG_GENERATED, FLAG_MISSING, FLAG_SUPER, FLAG_WINDOW};

use crate::generator::{mix, Content, Generator};
use crate::source::FragmentSpec;

/// How records are cut from time: slice length and overlap, in ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slicing {
    pub slice: u64,
    pub overlap: u64,
    /// The run's first tick (`frames.first_tick`): slice 0's core begins here.
    pub t0: u64,
}

/// A record's window: `[begin, end)`, its core ending at `core_end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub begin: u64,
    pub core_end: u64,
    pub end: u64,
}

impl Slicing {
    /// Slice `record`'s window (saturating: a run never reaches 2^64 ticks).
    pub fn window(&self, record: u64) -> Window {
        let begin = record.saturating_mul(self.slice).saturating_add(self.t0);
        let core_end = begin.saturating_add(self.slice);
        Window {
            begin,
            core_end,
            end: core_end.saturating_add(self.overlap),
        }
    }
}

/// Triggered readout windows (`builder.by = "window"`): decision k's window, drawn from the
/// run's seed so that every node (and an outside reader) computes the same, and what of it
/// an RU holds at a moment of the run (its latency buffer, docs/formats.md §8).
#[derive(Debug, Clone, PartialEq)]
pub struct Windows {
    /// Decisions from a file (`windows.decisions`): decision k's window is entry k, and the
    /// delays and extents below are not used.
    pub listed: Option<std::sync::Arc<[DecisionWindow]>>,
    pub seed: u64,
    /// Decisions per second (the EVM's trigger rate).
    pub rate_hz: f64,
    pub tick_hz: u64,
    pub before: u64,
    pub after: u64,
    pub delay_min: i64,
    pub delay_max: i64,
    /// Ticks of data the latency buffer keeps.
    pub buffer_ticks: u64,
    /// How long an RU waits for a window's data before sending it LATE.
    pub wait: Duration,
    /// Decisions from outside (`windows.outside`): each record's window as the EVM's Window
    /// message gave it (RUs; a BU takes the window each fragment carries), not computed.
    pub outside: bool,
    /// The run's first tick (`frames.first_tick`): the streams begin here, and decision
    /// k's tick is `t0 + k·tick_hz/rate_hz`.
    pub t0: u64,
    pub decided: std::collections::BTreeMap<u64, DecisionWindow>,
}

/// A fragment's components by what their windows leave out: one for a stream's window
/// fragment, one per entry of a super-fragment of them (an RU of several streams).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowCounts {
    pub late: u32,
    pub missing: u32,
    pub empty: u32,
}

impl WindowCounts {
    pub fn of(status: WindowStatus) -> WindowCounts {
        let mut c = WindowCounts::default();
        c.add(status);
        c
    }

    pub fn add(&mut self, status: WindowStatus) {
        match status {
            WindowStatus::Late => self.late += 1,
            WindowStatus::Missing => self.missing += 1,
            WindowStatus::Empty => self.empty += 1,
            WindowStatus::Complete => {}
        }
    }

    /// Some component came LATE or MISSING: the record is partial.
    pub fn partial(&self) -> bool {
        self.late + self.missing > 0
    }

    /// Every component complete.
    pub fn complete(&self) -> bool {
        *self == WindowCounts::default()
    }
}

/// A super-fragment's directory, read from its payload in pieces and checked
/// ([`evb_wire::super_fragment::decode_directory`]).
pub fn super_directory(payload: &Chain) -> Result<Vec<SuperEntry>, String> {
    use evb_wire::super_fragment::{decode_directory, directory_len_of, SUPER_HEADER_LEN};
    let mut head = [0u8; SUPER_HEADER_LEN];
    if !payload.copy_prefix(&mut head) {
        return Err(format!(
            "{} bytes is shorter than its header",
            payload.len()
        ));
    }
    let dir_len = directory_len_of(&head).map_err(|e| e.to_string())?;
    let mut dir = vec![0u8; dir_len];
    if !payload.copy_prefix(&mut dir) {
        return Err(format!(
            "{} bytes is shorter than its directory",
            payload.len()
        ));
    }
    decode_directory(&dir, payload.len()).map_err(|e| e.to_string())
}

/// A super-fragment's entries as window fragments of their own: each entry's header (its
/// source, the record's id and trigger number) and bytes.
pub fn super_entries(
    header: &FragmentHeader,
    payload: &Chain,
) -> Result<Vec<(FragmentHeader, Chain)>, String> {
    use evb_wire::super_fragment::{directory_len, ENTRY_MISSING};
    let entries = super_directory(payload)?;
    let mut at = directory_len(entries.len());
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let len = e.length as usize;
        let part = payload.sub(at, len);
        at += len;
        out.push((
            FragmentHeader {
                source_id: e.source_id,
                flags: FLAG_WINDOW
                    | if e.flags & ENTRY_MISSING != 0 {
                        FLAG_MISSING
                    } else {
                        0
                    },
                payload_size: len as u32,
                payload_crc: 0,
                ..*header
            },
            part,
        ));
    }
    Ok(out)
}

/// What an RU sends of a window: frames `[first, end)` (indices), and why not more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    pub first: u64,
    pub end: u64,
    pub status: WindowStatus,
}

impl Cut {
    /// Nothing: the record's decision does not name this source.
    pub const EMPTY: Cut = Cut {
        first: 0,
        end: 0,
        status: WindowStatus::Empty,
    };
}

/// Mixed into the seed of the decisions' delays (b"WINDOW" as a number).
const DELAY_TAG: u64 = 0x5749_4e44_4f57;

impl Windows {
    /// Decision k's tick before its delay: k / rate_hz seconds into the run.
    pub fn trigger_tick(&self, k: u64) -> u64 {
        self.t0 + (k as f64 * self.tick_hz as f64 / self.rate_hz) as u64
    }

    /// Decision k's delay in ticks, in [delay_min, delay_max].
    pub fn delay(&self, k: u64) -> i64 {
        let span = (self.delay_max - self.delay_min) as u64;
        let draw = mix(self.seed ^ mix(k ^ DELAY_TAG));
        self.delay_min + (draw % span.saturating_add(1)) as i64
    }

    /// Records `first ..` are decisions from outside with these windows (the EVM's Window
    /// message); the windows of records before `first` are forgotten (cut already).
    pub fn decide(&mut self, first: u64, windows: &[DecisionWindow]) {
        for (i, w) in windows.iter().enumerate() {
            self.decided.insert(first + i as u64, w.clone());
        }
    }

    /// Whether decision k asks for source `source`'s data (a file's line or a decision
    /// from outside may name its components; a seeded decision covers every source).
    pub fn covers(&self, k: u64, source: u16) -> bool {
        let named = if self.outside {
            self.decided.get(&k)
        } else {
            self.listed.as_ref().and_then(|l| l.get(k as usize))
        };
        named.is_none_or(|d| d.covers(source))
    }

    /// Whether record k's window is known (always, but for decisions from outside whose
    /// Window message has not come).
    pub fn knows(&self, k: u64) -> bool {
        !self.outside || self.decided.contains_key(&k)
    }

    /// Forgets the windows of decisions from outside before record `k` (cut already).
    pub fn forget_before(&mut self, k: u64) {
        if self.outside && self.decided.first_key_value().is_some_and(|(&f, _)| f < k) {
            self.decided = self.decided.split_off(&k);
        }
    }

    /// Decision k's window: the file's entry k, or `[t − d − before, t − d + after)`,
    /// clamped to the run's first tick, or the one the EVM gave for a decision from outside.
    pub fn window(&self, k: u64) -> Window {
        if self.outside {
            // asked only once known ([`Windows::knows`]); an unknown one holds nothing
            return self.decided.get(&k).map_or(
                Window {
                    begin: 0,
                    core_end: 1,
                    end: 1,
                },
                |d| Window {
                    begin: d.begin,
                    core_end: d.end,
                    end: d.end,
                },
            );
        }
        if let Some(list) = &self.listed {
            // a run takes at most as many decisions as the file lists (checked at setup)
            let (begin, end) = list
                .get(k as usize)
                .or(list.last())
                .map_or((0, 1), |d| (d.begin, d.end));
            return Window {
                begin,
                core_end: end,
                end,
            };
        }
        let at = self.trigger_tick(k) as i128 - self.delay(k) as i128;
        let t0 = self.t0 as i128;
        let begin = (at - self.before as i128).max(t0) as u64;
        let end = ((at + self.after as i128).max(t0) as u64).max(begin + 1);
        Window {
            begin,
            core_end: end,
            end,
        }
    }

    /// What an RU holds of window `w` (frames of `frame_ticks`) `since_start` after its
    /// stream began, having waited `waited` for it: `None` while the window's end has not
    /// arrived and the wait is not over. A frame arrives when its end tick does; it is
    /// evicted once its end is older than the buffer's depth.
    pub fn cut(
        &self,
        w: Window,
        frame_ticks: u64,
        since_start: Duration,
        waited: Duration,
    ) -> Option<Cut> {
        let now = self.t0 + (since_start.as_nanos() * self.tick_hz as u128 / 1_000_000_000) as u64;
        let arrived = now / frame_ticks;
        let kept_from = now.saturating_sub(self.buffer_ticks) / frame_ticks;
        let (first, end) = (w.begin / frame_ticks, w.end.div_ceil(frame_ticks));
        if end > arrived && waited < self.wait {
            return None;
        }
        let lo = first.max(kept_from).min(end);
        let hi = end.min(arrived).max(lo);
        let status = if lo > first {
            WindowStatus::Missing
        } else if hi < end {
            WindowStatus::Late
        } else {
            WindowStatus::Complete
        };
        Some(Cut {
            first: lo,
            end: hi,
            status,
        })
    }
}

/// The generator's continuous data: source s's frame j covers ticks `[j·F, (j+1)·F)`, its
/// payload made by [`Generator`] as if it were fragment j of source s (sizes and content
/// from (j, s), so any frame can be made or checked on its own). An RU's fragment of slice
/// k is the window fragment of the frames that begin in slice k's window.
#[derive(Debug, Clone)]
pub struct FrameGenerator {
    pub frames: Generator,
    pub frame_ticks: u64,
    pub slicing: Slicing,
    /// Triggered windows instead of slices (`builder.by = "window"`).
    pub windows: Option<Windows>,
    /// The fragment last asked for, made whole: an RU asks for a fragment's spec, then
    /// fills it in pieces, and a frame's CRC, in its header, needs its payload first.
    last: RefCell<Option<Rc<Made>>>,
    /// Windows: what the RU decided to send of a record ([`FrameGenerator::set_cut`]).
    cut: Cell<Option<(u64, Cut)>>,
    /// Static content: each source's largest frame payload, made once.
    template: RefCell<Option<Rc<StaticPayload>>>,
}

/// One record's window fragment from one source: every byte (content made per frame), or
/// (static content) its header, directory and frame headers, the payloads being prefixes
/// of the source's one static payload, and the CRC of the whole.
#[derive(Debug)]
struct Made {
    record: u64,
    source: u16,
    cut: Cut,
    bytes: Vec<u8>,
    /// Static content: per frame its header, where it starts in the fragment and its payload
    /// size (`bytes` is then the header and directory only).
    frames: Vec<([u8; TIME_FRAME_HEADER_LEN], usize, usize)>,
    len: usize,
    /// The fragment's CRC when it is known without reading its bytes (static frames of one
    /// size: composed from the payload's); the RU then sends it by reference.
    crc: Option<u32>,
}

/// A static fragment's pieces ([`FrameGenerator::static_pieces`]).
#[derive(Debug)]
pub struct StaticPieces {
    made: Rc<Made>,
    pub crc: u32,
}

impl StaticPieces {
    /// The window header and directory.
    pub fn head(&self) -> &[u8] {
        &self.made.bytes
    }

    /// Per frame: its header and its payload's length.
    pub fn frames(&self) -> impl Iterator<Item = (&[u8; TIME_FRAME_HEADER_LEN], usize)> {
        self.made.frames.iter().map(|(h, _, size)| (h, *size))
    }

    pub fn len(&self) -> usize {
        self.made.len
    }

    pub fn is_empty(&self) -> bool {
        self.made.len == 0
    }
}

/// A source's static frame payload, as long as the largest frame; and for the last payload
/// length asked, the CRC of that much of it and the table that shifts a CRC past that many
/// bytes (see [`Shift`]).
#[derive(Debug)]
struct StaticPayload {
    source: u16,
    bytes: Vec<u8>,
    shift: RefCell<Option<(usize, u32, Rc<Shift>)>>,
}

/// The CRC32C of `A ‖ B` is `M·crc(A) ⊕ crc(B)`, `M` a linear map that depends only on the
/// length of B (what `crc32c_combine` computes, a matrix power per call: microseconds). For
/// one length, `M` is four tables of 256 entries, one per byte of the CRC: a frame's CRC and
/// the fragment's then come from the payload's CRC without reading the payload again.
#[derive(Debug)]
struct Shift([[u32; 256]; 4]);

impl Shift {
    fn new(len: usize) -> Shift {
        let mut t = [[0u32; 256]; 4];
        for (i, row) in t.iter_mut().enumerate() {
            for (b, e) in row.iter_mut().enumerate() {
                *e = crc32c::crc32c_combine((b as u32) << (8 * i), 0, len);
            }
        }
        Shift(t)
    }

    /// The CRC of `A ‖ B` from `crc(A)` and `crc(B)`, B being this table's length.
    fn combine(&self, a: u32, b: u32) -> u32 {
        let t = &self.0;
        t[0][(a & 0xff) as usize]
            ^ t[1][((a >> 8) & 0xff) as usize]
            ^ t[2][((a >> 16) & 0xff) as usize]
            ^ t[3][(a >> 24) as usize]
            ^ b
    }
}

impl StaticPayload {
    /// The CRC of the first `len` bytes and the shift past them (made for the first length
    /// asked and kept while the lengths stay the same: fixed sizes).
    fn crc_and_shift(&self, len: usize) -> (u32, Option<Rc<Shift>>) {
        if let Some((l, crc, shift)) = self.shift.borrow().as_ref() {
            if *l == len {
                return (*crc, Some(shift.clone()));
            }
        }
        let crc = crc32c::crc32c(&self.bytes[..len]);
        if self.shift.borrow().is_none() {
            let shift = Rc::new(Shift::new(len));
            *self.shift.borrow_mut() = Some((len, crc, shift.clone()));
            return (crc, Some(shift));
        }
        (crc, None)
    }
}

/// Bytes compared at a time when a static fragment is verified.
const VERIFY_STEP: usize = 4096;

impl FrameGenerator {
    pub fn new(frames: Generator, frame_ticks: u64, slicing: Slicing) -> FrameGenerator {
        FrameGenerator {
            frames,
            frame_ticks: frame_ticks.max(1),
            slicing,
            windows: None,
            last: RefCell::new(None),
            cut: Cell::new(None),
            template: RefCell::new(None),
        }
    }

    /// Records are decision windows (`builder.by = "window"`).
    pub fn with_windows(mut self, w: Windows) -> FrameGenerator {
        self.windows = Some(w);
        self
    }

    /// Record `record`'s window.
    pub fn window(&self, record: u64) -> Window {
        match &self.windows {
            Some(w) => w.window(record),
            None => self.slicing.window(record),
        }
    }

    /// The frames of a record's window: those beginning in a slice's window, or those
    /// overlapping a decision's.
    pub fn frames_of(&self, w: Window) -> (u64, u64) {
        let f = self.frame_ticks;
        match &self.windows {
            Some(_) => (w.begin / f, w.end.div_ceil(f)),
            None => (w.begin.div_ceil(f), w.end.div_ceil(f)),
        }
    }

    /// Windows: what source `source`'s RU holds of `record` now (see [`Windows::cut`]);
    /// `None`: wait. EMPTY at once when the decision does not name the source.
    pub fn cut_now(
        &self,
        record: u64,
        source: u16,
        since_start: Duration,
        waited: Duration,
    ) -> Option<Cut> {
        let w = self.windows.as_ref()?;
        if !w.covers(record, source) {
            return Some(Cut::EMPTY);
        }
        w.cut(self.window(record), self.frame_ticks, since_start, waited)
    }

    /// Windows: the RU sends `cut` of `record` (the next `spec` and `fill` of it make that).
    pub fn set_cut(&self, record: u64, cut: Cut) {
        self.cut.set(Some((record, cut)));
    }

    /// The frames and status of `record`'s fragment: the RU's cut, or the whole window.
    fn cut_of(&self, record: u64, w: Window) -> Cut {
        match self.cut.get() {
            Some((r, c)) if r == record && self.windows.is_some() => c,
            _ => {
                let (first, end) = self.frames_of(w);
                Cut {
                    first,
                    end,
                    status: WindowStatus::Complete,
                }
            }
        }
    }

    /// Appends source `source`'s frame `j`'s payload to `out` (unique content).
    fn payload(&self, source: u16, j: u64, out: &mut Vec<u8>) {
        let size = self.frames.size(j, source);
        let at = out.len();
        out.resize(at + size, 0);
        self.frames.fill(j, source, 0, &mut out[at..]);
    }

    /// Source `source`'s frame `j`'s header, its CRC still 0.
    fn frame_header(&self, source: u16, j: u64) -> TimeFrameHeader {
        TimeFrameHeader {
            begin: j * self.frame_ticks,
            end: (j + 1) * self.frame_ticks,
            source_id: source,
            flags: TIME_FRAME_GENERATED,
            crc: 0,
        }
    }

    /// Appends source `source`'s frame `j`, its header and payload, to `out`: what a
    /// front-end emulator streams (`evb feed --frames`), byte for byte the frame an RU
    /// makes of the generator.
    pub fn frame(&self, source: u16, j: u64, out: &mut Vec<u8>) {
        let at = out.len();
        let mut h = self.frame_header(source, j);
        out.extend_from_slice(&h.encode());
        if self.frames.content == Content::Static {
            let t = self.template_of(source);
            out.extend_from_slice(&t.bytes[..self.frames.size(j, source)]);
        } else {
            self.payload(source, j, out);
        }
        h.crc = h.crc_of([&out[at + TIME_FRAME_HEADER_LEN..]]);
        out[at..at + TIME_FRAME_HEADER_LEN].copy_from_slice(&h.encode());
    }

    fn template_of(&self, source: u16) -> Rc<StaticPayload> {
        if let Some(t) = self.template.borrow().as_ref() {
            if t.source == source {
                return t.clone();
            }
        }
        let mut bytes = vec![0; self.frames.sizes.max()];
        self.frames.fill(0, source, 0, &mut bytes);
        let t = Rc::new(StaticPayload {
            source,
            bytes,
            shift: RefCell::new(None),
        });
        *self.template.borrow_mut() = Some(t.clone());
        t
    }

    fn made(&self, record: u64, source: u16) -> Rc<Made> {
        let w = self.window(record);
        let cut = self.cut_of(record, w);
        let old = self.last.borrow_mut().take();
        if let Some(m) = &old {
            if m.record == record && m.source == source && m.cut == cut {
                *self.last.borrow_mut() = old.clone();
                return m.clone();
            }
        }
        // the last fragment's buffer again, if nobody holds it (no allocation per record)
        let mut bytes = old
            .and_then(|m| Rc::try_unwrap(m).ok())
            .map(|m| m.bytes)
            .unwrap_or_default();
        bytes.clear();
        let (first, end) = (cut.first, cut.end);
        let n = (end - first) as usize;
        let dir = window_directory_len(n);
        bytes.extend_from_slice(
            &WindowHeader {
                begin: w.begin,
                end: w.end,
                core_end: w.core_end,
                status: cut.status,
                frames: n as u32,
            }
            .encode(),
        );
        bytes.resize(dir, 0);
        if self.frames.content == Content::Static {
            return self.made_static(record, source, cut, bytes);
        }
        for (i, j) in (first..end).enumerate() {
            let at = bytes.len();
            self.frame(source, j, &mut bytes);
            let entry = WINDOW_HEADER_LEN + i * 8;
            let (off, len) = ((at - dir) as u32, (bytes.len() - at) as u32);
            bytes[entry..entry + 4].copy_from_slice(&off.to_le_bytes());
            bytes[entry + 4..entry + 8].copy_from_slice(&len.to_le_bytes());
        }
        let len = bytes.len();
        self.keep(Made {
            record,
            source,
            cut,
            bytes,
            frames: Vec::new(),
            len,
            crc: None,
        })
    }

    fn keep(&self, m: Made) -> Rc<Made> {
        let m = Rc::new(m);
        *self.last.borrow_mut() = Some(m.clone());
        m
    }

    /// Static content: the header, directory and frame headers written into `head`
    /// (holding the window header already), each frame's CRC from the static payload (hot
    /// in the cache: one payload for every frame), nothing of the payloads copied.
    fn made_static(&self, record: u64, source: u16, cut: Cut, mut head: Vec<u8>) -> Rc<Made> {
        let (first, end) = (cut.first, cut.end);
        let t = self.template_of(source);
        let dir = head.len();
        let mut frames = Vec::with_capacity((end - first) as usize);
        let mut at = dir;
        for (i, j) in (first..end).enumerate() {
            let size = self.frames.size(j, source);
            let mut h = self.frame_header(source, j);
            h.crc = match t.crc_and_shift(size) {
                (payload_crc, Some(m)) => m.combine(crc32c::crc32c(&h.covered()), payload_crc),
                (_, None) => h.crc_of([&t.bytes[..size]]),
            };
            let entry = WINDOW_HEADER_LEN + i * 8;
            let len = TIME_FRAME_HEADER_LEN + size;
            head[entry..entry + 4].copy_from_slice(&((at - dir) as u32).to_le_bytes());
            head[entry + 4..entry + 8].copy_from_slice(&(len as u32).to_le_bytes());
            frames.push((h.encode(), at, size));
            at += len;
        }
        // the fragment's CRC, composed from the head's, each frame header's and the
        // payload's, while every payload length has its shift table (sizes that vary leave
        // it to the RU)
        let mut crc = Some(crc32c::crc32c(&head));
        for (encoded, _, size) in &frames {
            crc = match (crc, t.crc_and_shift(*size)) {
                (Some(c), (payload_crc, Some(m))) => {
                    Some(m.combine(crc32c::crc32c_append(c, encoded), payload_crc))
                }
                _ => None,
            };
        }
        self.keep(Made {
            record,
            source,
            cut,
            bytes: head,
            frames,
            len: at,
            crc,
        })
    }

    /// Static frames of one size: the fragment as pieces for the RU to send without copying
    /// the payloads: the head (window header and directory) and per frame its header and its
    /// payload's length (a prefix of the source's one static payload), with the fragment's
    /// CRC. `None` for other content.
    pub fn static_pieces(&self, record: u64, source: u16) -> Option<StaticPieces> {
        let m = self.made(record, source);
        let crc = m.crc?;
        (self.frames.content == Content::Static).then_some(StaticPieces { made: m, crc })
    }

    /// What the RU sends for this record.
    pub fn spec(&self, record: u64, source: u16) -> FragmentSpec {
        FragmentSpec {
            size: self.made(record, source).len,
            trigger_number: self.window(record).begin as u32,
            flags: FLAG_GENERATED | FLAG_WINDOW,
        }
    }

    /// Writes bytes `[offset, offset + buf.len())` of the record's window fragment.
    pub fn fill(&self, record: u64, source: u16, offset: usize, buf: &mut [u8]) {
        let m = self.made(record, source);
        let t = match self.frames.content {
            Content::Static => Some(self.template_of(source)),
            Content::Unique => None,
        };
        let mut pos = offset;
        let mut out = buf;
        while !out.is_empty() && pos < m.len {
            let n;
            if pos < m.bytes.len() {
                n = out.len().min(m.bytes.len() - pos);
                out[..n].copy_from_slice(&m.bytes[pos..pos + n]);
            } else {
                // static content: the frame holding `pos`, the last starting at or before it
                let t = t.as_ref().expect("only static fragments have frames apart");
                let i = m.frames.partition_point(|f| f.1 <= pos) - 1;
                let (h, start, size) = &m.frames[i];
                let inside = pos - start;
                if inside < TIME_FRAME_HEADER_LEN {
                    n = out.len().min(TIME_FRAME_HEADER_LEN - inside);
                    out[..n].copy_from_slice(&h[inside..inside + n]);
                } else {
                    let p = inside - TIME_FRAME_HEADER_LEN;
                    n = out.len().min(size - p);
                    out[..n].copy_from_slice(&t.bytes[p..p + n]);
                }
            }
            pos += n;
            out = &mut out[n..];
        }
    }

    /// The BU's checks of a fragment ([`FrameGenerator::check`]), a super-fragment's
    /// entries each as a stream's window fragment: its components' statuses counted.
    pub fn check_all(
        &self,
        header: &FragmentHeader,
        payload: &Chain,
    ) -> Result<WindowCounts, String> {
        if header.flags & FLAG_SUPER == 0 || header.flags & FLAG_MISSING != 0 {
            return self.check(header, payload).map(WindowCounts::of);
        }
        let mut counts = WindowCounts::default();
        for (h, part) in super_entries(header, payload)? {
            let status = self
                .check(&h, &part)
                .map_err(|e| format!("source {}: {e}", h.source_id))?;
            counts.add(status);
        }
        Ok(counts)
    }

    /// The BU's checks of a fragment of `record` ([`check_slice`], or [`check_window`]
    /// for decision windows): `Ok` with the fragment's status, `Err` saying what is wrong.
    pub fn check(&self, header: &FragmentHeader, payload: &Chain) -> Result<WindowStatus, String> {
        match &self.windows {
            None => check_slice(&self.slicing, header, payload).map(|()| WindowStatus::Complete),
            Some(w) => check_window(w, self.frame_ticks, header, payload),
        }
    }

    /// True when `pieces` are exactly the window fragment this source sends for `record`
    /// (for a decision window: whichever frames it holds, each exactly the generator's).
    pub fn verify<'a>(
        &self,
        record: u64,
        source: u16,
        pieces: impl Iterator<Item = &'a [u8]>,
    ) -> bool {
        if self.windows.is_some() {
            return self.verify_frames(source, pieces);
        }
        let m = self.made(record, source);
        if !m.frames.is_empty() {
            // static content: compared a piece at a time against what fill makes
            let mut expected = vec![0u8; VERIFY_STEP];
            let mut offset = 0;
            for piece in pieces {
                for chunk in piece.chunks(VERIFY_STEP) {
                    if offset + chunk.len() > m.len {
                        return false;
                    }
                    let want = &mut expected[..chunk.len()];
                    self.fill(record, source, offset, want);
                    if *want != *chunk {
                        return false;
                    }
                    offset += chunk.len();
                }
            }
            return offset == m.len;
        }
        let mut rest = &m.bytes[..];
        for piece in pieces {
            match rest.split_at_checked(piece.len()) {
                Some((want, after)) if want == piece => rest = after,
                _ => return false,
            }
        }
        rest.is_empty()
    }
}

impl FrameGenerator {
    /// Every frame of a window fragment is the generator's frame of its begin tick, byte for
    /// byte (which frames it holds is [`check_window`]'s to judge).
    fn verify_frames<'a>(&self, source: u16, pieces: impl Iterator<Item = &'a [u8]>) -> bool {
        let bytes = pieces.fold(Vec::new(), |mut v, p| {
            v.extend_from_slice(p);
            v
        });
        let Ok(w) = decode_window(&bytes) else {
            return false;
        };
        let mut want = Vec::new();
        w.frames.iter().all(|(h, payload)| {
            let j = h.begin / self.frame_ticks;
            want.clear();
            if self.frames.content == Content::Static {
                let t = self.template_of(source);
                want.extend_from_slice(&t.bytes[..self.frames.size(j, source)]);
            } else {
                self.payload(source, j, &mut want);
            }
            h.source_id == source
                && h.begin == j * self.frame_ticks
                && h.end == h.begin + self.frame_ticks
                && h.flags == TIME_FRAME_GENERATED
                && *payload == &want[..]
        })
    }
}

/// The BU's checks of an RU's fragment of a decision window: a window fragment whose window
/// is decision `header.event_id`'s, frames of the fragment's source, back to back, each
/// overlapping the window, and a status that says what is left out: COMPLETE holds every
/// frame overlapping the window, LATE all from the first (the rest had not arrived), MISSING
/// none of the first (evicted). Returns the status.
pub fn check_window(
    windows: &Windows,
    frame_ticks: u64,
    header: &FragmentHeader,
    payload: &Chain,
) -> Result<WindowStatus, String> {
    // decisions from outside: the window each fragment carries (the BU is not told them)
    let want = (!windows.outside).then(|| windows.window(header.event_id));
    let mut buf = Vec::new();
    let Some(w) = read_window(header, payload, &mut buf, want)? else {
        return Ok(WindowStatus::Complete);
    };
    let want = want.unwrap_or(Window {
        begin: w.header.begin,
        core_end: w.header.core_end,
        end: w.header.end,
    });
    let h = w.header;
    let (first, end) = (want.begin / frame_ticks, want.end.div_ceil(frame_ticks));
    let mut next: Option<u64> = None;
    for (f, _) in &w.frames {
        if f.source_id != header.source_id {
            return Err(format!(
                "a frame of source {} in source {}'s fragment",
                f.source_id, header.source_id
            ));
        }
        if f.begin % frame_ticks != 0 || f.end != f.begin + frame_ticks {
            return Err(format!(
                "a frame [{}, {}) off the stream's frames",
                f.begin, f.end
            ));
        }
        if next.is_some_and(|n| n != f.begin) {
            return Err(format!("a gap in the stream before tick {}", f.begin));
        }
        next = Some(f.end);
    }
    let held = w.frames.first().map(|(f, _)| {
        (
            f.begin / frame_ticks,
            w.frames.last().map_or(0, |(l, _)| l.end / frame_ticks),
        )
    });
    let fits = match (h.status, held) {
        // the decision does not name this source: the BU knows it unless the decision came
        // from outside (its components travel to the RUs alone)
        (WindowStatus::Empty, None) => {
            windows.outside || !windows.covers(header.event_id, header.source_id)
        }
        (WindowStatus::Complete, Some(r)) => r == (first, end),
        (WindowStatus::Late, Some((lo, hi))) => lo == first && hi < end,
        (WindowStatus::Late, None) => true,
        (WindowStatus::Missing, Some((lo, hi))) => lo > first && hi <= end,
        (WindowStatus::Missing, None) => true,
        _ => false,
    };
    if !fits {
        return Err(format!(
            "status {:?} with frames {held:?} of the window's {first}..{end}",
            h.status
        ));
    }
    Ok(h.status)
}

/// A fragment's window fragment, read (into `buf` when its payload is in pieces) and
/// checked against the record's window `want` and trigger number; `None` for a MISSING
/// placeholder, which holds nothing.
fn read_window<'a>(
    header: &FragmentHeader,
    payload: &'a Chain,
    buf: &'a mut Vec<u8>,
    want: Option<Window>,
) -> Result<Option<WindowFragment<'a>>, String> {
    if header.flags & FLAG_MISSING != 0 {
        return Ok(None);
    }
    if header.flags & FLAG_WINDOW == 0 {
        return Err("not a window fragment (flag WINDOW unset) in a run built by time".into());
    }
    let bytes: &[u8] = match payload.chunks().nth(1) {
        None => payload.chunks().next().unwrap_or(&[]),
        Some(_) => {
            *buf = payload.to_vec();
            buf
        }
    };
    let w = decode_window(bytes).map_err(|e| e.to_string())?;
    let h = w.header;
    let want = want.unwrap_or(Window {
        begin: h.begin,
        core_end: h.core_end,
        end: h.end,
    });
    if (h.begin, h.core_end, h.end) != (want.begin, want.core_end, want.end) {
        return Err(format!(
            "window [{}, {}) core end {}, where record {} is [{}, {}) core end {}",
            h.begin, h.end, h.core_end, header.event_id, want.begin, want.end, want.core_end
        ));
    }
    if header.trigger_number != want.begin as u32 {
        return Err(format!(
            "trigger number {} is not the window's first tick's low word {}",
            header.trigger_number, want.begin as u32
        ));
    }
    Ok(Some(w))
}

/// The BU's checks of an RU's fragment of a time slice, whoever made it: a window fragment
/// (flagged so) whose window is this record's, frames all from the fragment's source, each
/// beginning in the window, each with its CRC, and back to back in time (a gap or an overlap
/// between two frames is an error, not built over). A MISSING placeholder has nothing to
/// check. `Err` says what was wrong.
pub fn check_slice(
    slicing: &Slicing,
    header: &FragmentHeader,
    payload: &Chain,
) -> Result<(), String> {
    let want = slicing.window(header.event_id);
    let mut buf = Vec::new();
    let Some(w) = read_window(header, payload, &mut buf, Some(want))? else {
        return Ok(());
    };
    let mut prev: Option<u64> = None;
    for (f, _) in &w.frames {
        if f.source_id != header.source_id {
            return Err(format!(
                "a frame of source {} in source {}'s fragment",
                f.source_id, header.source_id
            ));
        }
        if f.begin < want.begin {
            return Err(format!(
                "a frame begins at {}, before the slice at {}",
                f.begin, want.begin
            ));
        }
        if let Some(end) = prev {
            if f.begin != end {
                return Err(format!("a gap in the stream: ticks [{end}, {})", f.begin));
            }
        }
        prev = Some(f.end);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::SizeModel;

    fn gen() -> FrameGenerator {
        let g = Generator::new(
            SizeModel::LogNormal {
                mean: 300.0,
                stddev: 200.0,
                min: 0,
                max: 2000,
            },
            9,
        );
        FrameGenerator::new(
            g,
            7,
            Slicing {
                slice: 50,
                overlap: 12,
                t0: 0,
            },
        )
    }

    fn whole(g: &FrameGenerator, record: u64, source: u16) -> Vec<u8> {
        let mut b = vec![0; g.spec(record, source).size];
        g.fill(record, source, 0, &mut b);
        b
    }

    /// Made in any pieces, a slice's fragment is the same bytes, reads back as a window
    /// fragment of the frames beginning in its window, and every frame is in exactly one
    /// core: the cores of consecutive slices tile the stream without gap or repeat.
    #[test]
    fn slices_tile_the_stream_and_read_back() {
        let g = gen();
        let mut next_tick = 0u64;
        for k in 0..20u64 {
            let b = whole(&g, k, 4);
            for split in [1, 7, 33, b.len() / 2] {
                let mut a = vec![0; split.min(b.len())];
                let mut c = vec![0; b.len() - a.len()];
                g.fill(k, 4, 0, &mut a);
                g.fill(k, 4, a.len(), &mut c);
                assert_eq!([a, c].concat(), b, "record {k} split {split}");
            }
            assert!(g.verify(k, 4, [&b[..5], &b[5..]].into_iter()));
            let w = decode_window(&b).expect("a window fragment");
            for (f, _) in w.frames.iter().filter(|(f, _)| f.begin < w.header.core_end) {
                assert_eq!(
                    f.begin, next_tick,
                    "record {k}: the core continues the stream"
                );
                next_tick = f.end;
            }
            let mut chain_h = FragmentHeader {
                event_id: k,
                trigger_number: (k * 50) as u32,
                source_id: 4,
                flags: FLAG_GENERATED | FLAG_WINDOW,
                payload_size: b.len() as u32,
                payload_crc: 0,
            };
            let pool = evb_buffers::Pool::new("t", 1 << 16, 2);
            let ch = Chain::from_slice(pool.try_alloc().unwrap().append(&b).unwrap());
            assert_eq!(check_slice(&g.slicing, &chain_h, &ch), Ok(()));
            chain_h.event_id += 1;
            assert!(
                check_slice(&g.slicing, &chain_h, &ch).is_err(),
                "another record's window"
            );
        }
        assert!(next_tick >= 20 * 50);
        let mut bad = whole(&g, 3, 4);
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(!g.verify(3, 4, std::iter::once(&bad[..])));
        assert!(
            !g.verify(3, 5, std::iter::once(&whole(&g, 3, 4)[..])),
            "other source"
        );
    }

    /// A decision window's cut at the edges of the wait and of the buffer's depth, a tick
    /// or a microsecond either side: waiting just under `wait`, LATE at it; whole while its
    /// first frame's end is one tick inside the buffer, MISSING that frame at the depth.
    #[test]
    fn a_window_is_cut_at_the_edges_of_the_wait_and_the_buffer() {
        let w = Windows {
            listed: None,
            seed: 1,
            rate_hz: 1000.0,
            tick_hz: 1_000_000, // a tick is a microsecond
            before: 0,
            after: 1,
            delay_min: 0,
            delay_max: 0,
            buffer_ticks: 5000,
            wait: Duration::from_millis(10),
            outside: false,
            t0: 0,
            decided: Default::default(),
        };
        let win = Window {
            begin: 1000,
            core_end: 2000,
            end: 2000,
        };
        let us = Duration::from_micros;
        let cut = |now_us, waited| w.cut(win, 100, us(now_us), waited);
        let c = |first, end, status| Some(Cut { first, end, status });
        assert_eq!(
            cut(1999, us(9_999)),
            None,
            "its end not arrived, the wait not over"
        );
        assert_eq!(cut(1999, us(10_000)), c(10, 19, WindowStatus::Late));
        assert_eq!(cut(2000, us(0)), c(10, 20, WindowStatus::Complete));
        assert_eq!(cut(6099, us(0)), c(10, 20, WindowStatus::Complete));
        assert_eq!(cut(6100, us(0)), c(11, 20, WindowStatus::Missing));
        assert_eq!(
            cut(7000, us(0)),
            c(20, 20, WindowStatus::Missing),
            "all gone"
        );
        // decision windows from the seed: the same for every node, in [delay_min, delay_max]
        let d = Windows {
            delay_min: -50,
            delay_max: 70,
            ..w.clone()
        };
        let delays: Vec<i64> = (0..1000).map(|k| d.delay(k)).collect();
        assert!(delays.iter().all(|x| (-50..=70).contains(x)));
        assert!(
            delays.contains(&-50) && delays.contains(&70),
            "both ends drawn"
        );
        assert_eq!(d.window(7), d.window(7));
        assert_eq!(d.window(7).begin, (7000 - d.delay(7)) as u64);
        // on an absolute clock (frames.first_tick): every window and cut moves by t0, and a
        // window reaching before the run's first tick is clamped to it, not to 0
        let t0 = 1_000_000_000_000;
        let a = Windows { t0, ..d.clone() };
        for k in [0u64, 7, 500] {
            let (x, y) = (d.window(k), a.window(k));
            if x.begin > 0 {
                assert_eq!((y.begin, y.end), (x.begin + t0, x.end + t0), "decision {k}");
            } else {
                assert_eq!(y.begin, t0, "decision {k}");
            }
        }
        let shifted = Window {
            begin: win.begin + t0,
            core_end: win.end + t0,
            end: win.end + t0,
        };
        assert_eq!(
            a.cut(shifted, 100, us(6100), us(0)),
            Some(Cut {
                first: 11 + t0 / 100,
                end: 20 + t0 / 100,
                status: WindowStatus::Missing
            })
        );
    }

    /// The BU's window checks take a fragment whose status says what it leaves out, and
    /// refuse one whose status hides a cut (LATE or MISSING frames sent as COMPLETE), or
    /// another decision's window.
    #[test]
    fn a_window_fragment_status_must_match_its_frames() {
        let u = gen();
        let w = Windows {
            listed: None,
            seed: 5,
            rate_hz: 100.0,
            tick_hz: 1000,
            before: 20,
            after: 30,
            delay_min: 0,
            delay_max: 15,
            buffer_ticks: 1000,
            wait: Duration::ZERO,
            outside: false,
            t0: 0,
            decided: Default::default(),
        };
        let g = FrameGenerator::new(u.frames.clone(), 7, u.slicing).with_windows(w);
        let pool = evb_buffers::Pool::new("t", 1 << 16, 8);
        let k = 12;
        let (first, end) = g.frames_of(g.window(k));
        let fragment = |cut: Cut, status_byte: Option<u16>| {
            g.set_cut(k, cut);
            let spec = g.spec(k, 4);
            let mut b = vec![0; spec.size];
            g.fill(k, 4, 0, &mut b);
            if let Some(s) = status_byte {
                b[24..26].copy_from_slice(&s.to_le_bytes());
            }
            let h = spec.header(k, 4, crc32c::crc32c(&b));
            let ch = Chain::from_slice(pool.try_alloc().unwrap().append(&b).unwrap());
            (h, ch)
        };
        let check = |(h, ch): (FragmentHeader, Chain)| g.check(&h, &ch);
        let whole = Cut {
            first,
            end,
            status: WindowStatus::Complete,
        };
        assert_eq!(check(fragment(whole, None)), Ok(WindowStatus::Complete));
        let late = Cut {
            end: end - 2,
            status: WindowStatus::Late,
            ..whole
        };
        assert_eq!(check(fragment(late, None)), Ok(WindowStatus::Late));
        let missing = Cut {
            first: first + 1,
            status: WindowStatus::Missing,
            ..whole
        };
        assert_eq!(check(fragment(missing, None)), Ok(WindowStatus::Missing));
        assert!(
            check(fragment(late, Some(0))).is_err(),
            "late sent as complete"
        );
        assert!(
            check(fragment(missing, Some(0))).is_err(),
            "missing sent as complete"
        );
        assert!(
            check(fragment(whole, Some(1))).is_err(),
            "whole sent as late"
        );
        let (h, ch) = fragment(whole, None);
        let other = FragmentHeader {
            event_id: k + 1,
            ..h
        };
        assert!(g.check(&other, &ch).is_err(), "another decision's window");
        assert!(g.verify(k, 4, ch.chunks()));
    }

    /// A decision over some components: the RU of a source it does not name cuts EMPTY at
    /// once (no frames, not waiting); the BU takes EMPTY from exactly those sources, and
    /// refuses it from a source the decision names. Decisions from outside: the BU is not
    /// told their components and takes an EMPTY fragment as its RU sends it.
    #[test]
    fn a_decision_over_some_components_is_empty_for_the_others() {
        let u = gen();
        let listed = [
            DecisionWindow::new(100, 150, vec![4]).unwrap(),
            DecisionWindow::new(100, 150, vec![9, 2]).unwrap(),
        ];
        let w = Windows {
            listed: Some(listed.to_vec().into()),
            seed: 5,
            rate_hz: 100.0,
            tick_hz: 1000,
            before: 0,
            after: 0,
            delay_min: 0,
            delay_max: 0,
            buffer_ticks: 1000,
            wait: Duration::from_secs(3600),
            outside: false,
            t0: 0,
            decided: Default::default(),
        };
        assert!(w.covers(0, 4) && !w.covers(1, 4) && w.covers(1, 2));
        let g = FrameGenerator::new(u.frames.clone(), 7, u.slicing).with_windows(w.clone());
        let ms = Duration::from_millis;
        // record 1 does not name source 4: EMPTY at once, though its data has not come
        assert_eq!(g.cut_now(1, 4, ms(0), ms(0)), Some(Cut::EMPTY));
        assert_eq!(g.cut_now(0, 4, ms(0), ms(0)), None, "named: it waits");
        let pool = evb_buffers::Pool::new("t", 1 << 16, 8);
        let fragment = |g: &FrameGenerator, k: u64| {
            g.set_cut(k, Cut::EMPTY);
            let spec = g.spec(k, 4);
            let mut b = vec![0; spec.size];
            g.fill(k, 4, 0, &mut b);
            let h = spec.header(k, 4, crc32c::crc32c(&b));
            let ch = Chain::from_slice(pool.try_alloc().unwrap().append(&b).unwrap());
            (h, ch)
        };
        let (h, ch) = fragment(&g, 1);
        assert_eq!(decode_window(&ch.to_vec()).unwrap().frames.len(), 0);
        assert_eq!(g.check(&h, &ch), Ok(WindowStatus::Empty));
        let (h, ch) = fragment(&g, 0);
        assert!(g.check(&h, &ch).is_err(), "EMPTY from a source it names");
        // from outside: the BU takes the EMPTY its RU sent
        let mut out = w;
        out.listed = None;
        out.outside = true;
        out.decide(0, &listed);
        let g = FrameGenerator::new(u.frames.clone(), 7, u.slicing).with_windows(out);
        assert_eq!(g.cut_now(1, 4, ms(0), ms(0)), Some(Cut::EMPTY));
        let (h, ch) = fragment(&g, 1);
        assert_eq!(g.check(&h, &ch), Ok(WindowStatus::Empty));
    }

    /// Static content: the fragment made from headers and the one static payload is a
    /// window fragment (every frame's CRC right), whose payloads are all prefixes of the
    /// same bytes.
    #[test]
    fn static_frames_are_prefixes_of_one_payload() {
        let u = gen();
        let g = FrameGenerator::new(
            u.frames.clone().with_content(Content::Static),
            u.frame_ticks,
            u.slicing,
        );
        for k in [0u64, 1, 7] {
            let b = whole(&g, k, 2);
            let w = decode_window(&b).expect("a window fragment");
            let longest = w.frames.iter().map(|(_, p)| p.len()).max().unwrap();
            let longest = w.frames.iter().find(|(_, p)| p.len() == longest).unwrap().1;
            for (_, p) in &w.frames {
                assert_eq!(*p, &longest[..p.len()]);
            }
            assert!(g.verify(k, 2, b.chunks(100)));
            // fixed sizes: the fragment's CRC composed without reading it, and right
            let fixed = FrameGenerator::new(
                Generator::new(SizeModel::Fixed(300), 9).with_content(Content::Static),
                u.frame_ticks,
                u.slicing,
            );
            let fb = whole(&fixed, k, 2);
            assert!(decode_window(&fb).is_ok());
            assert_eq!(
                fixed.static_pieces(k, 2).map(|p| p.crc),
                Some(crc32c::crc32c(&fb)),
                "record {k}"
            );
            let mut bad = b.clone();
            bad[b.len() / 2] ^= 4;
            assert!(!g.verify(k, 2, std::iter::once(&bad[..])));
        }
    }
}

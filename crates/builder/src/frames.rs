//! Building by time (docs/architecture.md, "Building by time"): how records are cut from
//! the streams' ticks, the generator's continuous time frames, and the BU's checks of a
//! window fragment.
//!
//! Under `builder.by = "time"` record k is time slice k: its *core* is ticks
//! `[k·S, (k+1)·S)` and it carries every frame that *begins* in `[k·S, (k+1)·S + O)`, so a
//! frame belongs to exactly one core (the one holding its first tick) and the frames that
//! begin in the first `O` ticks of a core are carried again by the slice before it, as its
//! overlap (CBM's convention for microslices in timeslices).

use std::cell::RefCell;
use std::rc::Rc;

use evb_buffers::Chain;
use evb_wire::window::{
    decode_window, window_directory_len, TimeFrameHeader, WindowHeader, WindowStatus,
    TIME_FRAME_GENERATED, TIME_FRAME_HEADER_LEN, WINDOW_HEADER_LEN,
};
use evb_wire::{FragmentHeader, FLAG_GENERATED, FLAG_MISSING, FLAG_WINDOW};

use crate::generator::{Content, Generator};
use crate::source::FragmentSpec;

/// How records are cut from time: slice length and overlap, in ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slicing {
    pub slice: u64,
    pub overlap: u64,
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
        let begin = record.saturating_mul(self.slice);
        let core_end = begin.saturating_add(self.slice);
        Window {
            begin,
            core_end,
            end: core_end.saturating_add(self.overlap),
        }
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
    /// The fragment last asked for, made whole: an RU asks for a fragment's spec, then
    /// fills it in pieces, and a frame's CRC, in its header, needs its payload first.
    last: RefCell<Option<Rc<Made>>>,
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
    bytes: Vec<u8>,
    /// Static content: per frame its header, where it starts in the fragment and its payload
    /// size (`bytes` is then the header and directory only).
    frames: Vec<([u8; TIME_FRAME_HEADER_LEN], usize, usize)>,
    len: usize,
}

/// A source's static frame payload, as long as the largest frame.
#[derive(Debug)]
struct StaticPayload {
    source: u16,
    bytes: Vec<u8>,
}

/// Bytes compared at a time when a static fragment is verified.
const VERIFY_STEP: usize = 4096;

impl FrameGenerator {
    pub fn new(frames: Generator, frame_ticks: u64, slicing: Slicing) -> FrameGenerator {
        FrameGenerator {
            frames,
            frame_ticks: frame_ticks.max(1),
            slicing,
            last: RefCell::new(None),
            template: RefCell::new(None),
        }
    }

    /// Frames `[first, end)` are the ones beginning in `[begin, end)` ticks.
    fn frames_in(&self, w: Window) -> (u64, u64) {
        (
            w.begin.div_ceil(self.frame_ticks),
            w.end.div_ceil(self.frame_ticks),
        )
    }

    /// Appends source `source`'s frame `j`'s payload to `out` (unique content).
    fn payload(&self, source: u16, j: u64, out: &mut Vec<u8>) {
        let size = self.frames.size(j, source);
        let at = out.len();
        out.resize(at + size, 0);
        self.frames.fill(j, source, 0, &mut out[at..]);
    }

    fn template_of(&self, source: u16) -> Rc<StaticPayload> {
        if let Some(t) = self.template.borrow().as_ref() {
            if t.source == source {
                return t.clone();
            }
        }
        let mut bytes = vec![0; self.frames.sizes.max()];
        self.frames.fill(0, source, 0, &mut bytes);
        let t = Rc::new(StaticPayload { source, bytes });
        *self.template.borrow_mut() = Some(t.clone());
        t
    }

    fn made(&self, record: u64, source: u16) -> Rc<Made> {
        let old = self.last.borrow_mut().take();
        if let Some(m) = &old {
            if m.record == record && m.source == source {
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
        let w = self.slicing.window(record);
        let (first, end) = self.frames_in(w);
        let n = (end - first) as usize;
        let dir = window_directory_len(n);
        bytes.extend_from_slice(
            &WindowHeader {
                begin: w.begin,
                end: w.end,
                core_end: w.core_end,
                status: WindowStatus::Complete,
                frames: n as u32,
            }
            .encode(),
        );
        bytes.resize(dir, 0);
        if self.frames.content == Content::Static {
            return self.made_static(record, source, (first, end), bytes);
        }
        for (i, j) in (first..end).enumerate() {
            let at = bytes.len();
            let h = TimeFrameHeader {
                begin: j * self.frame_ticks,
                end: (j + 1) * self.frame_ticks,
                source_id: source,
                flags: TIME_FRAME_GENERATED,
                crc: 0,
            };
            bytes.extend_from_slice(&h.encode());
            self.payload(source, j, &mut bytes);
            let crc = h.crc_of([&bytes[at + TIME_FRAME_HEADER_LEN..]]);
            bytes[at + 20..at + 24].copy_from_slice(&crc.to_le_bytes());
            let entry = WINDOW_HEADER_LEN + i * 8;
            let (off, len) = ((at - dir) as u32, (bytes.len() - at) as u32);
            bytes[entry..entry + 4].copy_from_slice(&off.to_le_bytes());
            bytes[entry + 4..entry + 8].copy_from_slice(&len.to_le_bytes());
        }
        let len = bytes.len();
        self.keep(Made {
            record,
            source,
            bytes,
            frames: Vec::new(),
            len,
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
    fn made_static(
        &self,
        record: u64,
        source: u16,
        (first, end): (u64, u64),
        mut head: Vec<u8>,
    ) -> Rc<Made> {
        let t = self.template_of(source);
        let dir = head.len();
        let mut frames = Vec::with_capacity((end - first) as usize);
        let mut at = dir;
        for (i, j) in (first..end).enumerate() {
            let size = self.frames.size(j, source);
            let mut h = TimeFrameHeader {
                begin: j * self.frame_ticks,
                end: (j + 1) * self.frame_ticks,
                source_id: source,
                flags: TIME_FRAME_GENERATED,
                crc: 0,
            };
            h.crc = h.crc_of([&t.bytes[..size]]);
            let entry = WINDOW_HEADER_LEN + i * 8;
            let len = TIME_FRAME_HEADER_LEN + size;
            head[entry..entry + 4].copy_from_slice(&((at - dir) as u32).to_le_bytes());
            head[entry + 4..entry + 8].copy_from_slice(&(len as u32).to_le_bytes());
            frames.push((h.encode(), at, size));
            at += len;
        }
        self.keep(Made {
            record,
            source,
            bytes: head,
            frames,
            len: at,
        })
    }

    /// What the RU sends for this record.
    pub fn spec(&self, record: u64, source: u16) -> FragmentSpec {
        FragmentSpec {
            size: self.made(record, source).len,
            trigger_number: self.slicing.window(record).begin as u32,
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

    /// True when `pieces` are exactly the window fragment this source sends for `record`.
    pub fn verify<'a>(
        &self,
        record: u64,
        source: u16,
        pieces: impl Iterator<Item = &'a [u8]>,
    ) -> bool {
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
    if header.flags & FLAG_MISSING != 0 {
        return Ok(());
    }
    if header.flags & FLAG_WINDOW == 0 {
        return Err("not a window fragment (flag WINDOW unset) in a run built by time".into());
    }
    let whole;
    let bytes: &[u8] = match payload.chunks().nth(1) {
        None => payload.chunks().next().unwrap_or(&[]),
        Some(_) => {
            whole = payload.to_vec();
            &whole
        }
    };
    let w = decode_window(bytes).map_err(|e| e.to_string())?;
    let want = slicing.window(header.event_id);
    let h = w.header;
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
            let mut bad = b.clone();
            bad[b.len() / 2] ^= 4;
            assert!(!g.verify(k, 2, std::iter::once(&bad[..])));
        }
    }
}

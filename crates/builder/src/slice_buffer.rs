//! The RU's latency buffer for a live stream of timestamped frames (`source.format =
//! "frames"`, `builder.by = "time"`): frames go in as the front-end sends them, and each
//! time slice comes out as a window fragment as soon as every frame that begins in its
//! window has arrived (docs/architecture.md, "Building by time"). No IO here: the node's
//! stream reader pushes frames and takes slices.
//!
//! Memory: a frame stays until the slice whose *core* holds it is cut (a frame of the
//! overlap is held past its first slice, for the next one), so the buffer holds at most one
//! slice and its overlap of frames beyond what the reader has read ahead; the slices cut
//! wait in the RU's live feed, which the reader fills only while it has room. A full pool
//! stops the reading, and TCP flow control holds the front-end: nothing is dropped.
//!
//! A stream by time begins at tick 0 (slice 0: a Start body carrying another first tick is
//! not built) and has no gap: every frame lasts `frames.ticks` and begins where the one
//! before it ended. A frame that breaks this, is another source's, or failed its CRC stops
//! the run naming the stream and the frame: a slice is never built over a hole.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use evb_wire::super_fragment::{directory_len, encode_directory, SuperEntry};
use evb_wire::window::{window_directory_len, TimeFrameHeader, WindowHeader, WindowStatus};
use evb_wire::{FLAG_SUPER, FLAG_WINDOW};

use crate::assembly::{Assembled, Piece, StreamName};
use crate::frames::{Slicing, Window};

/// What a slice buffer holds and counted: its byte account is bytes in = bytes in the
/// slices' cores + bytes held (in no core cut yet; at the end of a run, in none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SliceBufferStats {
    pub held_frames: u64,
    pub held_bytes: u64,
    pub held_ticks: u64,
    pub held_bytes_high_water: u64,
    /// Frames' bytes received, headers included.
    pub bytes_in: u64,
    /// Bytes of the frames cut into a slice's core (each frame in exactly one).
    pub core_bytes: u64,
}

impl SliceBufferStats {
    /// Two streams' together (the ticks held: the larger; the peak: the sum of the
    /// streams' peaks, an upper bound of the RU's, as they may come at different moments).
    pub fn with(self, o: SliceBufferStats) -> SliceBufferStats {
        SliceBufferStats {
            held_frames: self.held_frames + o.held_frames,
            held_bytes: self.held_bytes + o.held_bytes,
            held_ticks: self.held_ticks.max(o.held_ticks),
            held_bytes_high_water: self.held_bytes_high_water + o.held_bytes_high_water,
            bytes_in: self.bytes_in + o.bytes_in,
            core_bytes: self.core_bytes + o.core_bytes,
        }
    }
}

/// One stream's frames, cut into time slices.
pub struct SliceBuffer {
    slicing: Slicing,
    frame_ticks: u64,
    name: StreamName,
    /// The stream's place among the RU's streams (for messages).
    index: usize,
    /// Frames held, in stream order: every one begins at or after the next slice's begin.
    frames: VecDeque<(TimeFrameHeader, Bytes)>,
    /// Bytes of the frames held (headers included), and the most held.
    held_bytes: u64,
    held_high: u64,
    /// The next slice to cut.
    next: u64,
    /// The end of the newest frame: where the next one must begin.
    high: u64,
    closed: bool,
    received: u64,
    received_bytes: u64,
    core_bytes: u64,
}

impl SliceBuffer {
    pub fn new(slicing: Slicing, frame_ticks: u64, name: StreamName, index: usize) -> Self {
        SliceBuffer {
            slicing,
            frame_ticks,
            name,
            index,
            frames: VecDeque::new(),
            held_bytes: 0,
            held_high: 0,
            next: 0,
            // a stream begins at the run's first tick
            high: slicing.t0,
            closed: false,
            received: 0,
            received_bytes: 0,
            core_bytes: 0,
        }
    }

    /// How the stream is named in messages: `stream 0 (source 3, 127.0.0.1:7301)`.
    pub fn describe(&self) -> String {
        if self.name.addr.is_empty() {
            return format!("producer (source {})", self.name.source_id);
        }
        format!(
            "stream {} (source {}, {})",
            self.index, self.name.source_id, self.name.addr
        )
    }

    /// Takes the next frame of the stream (its header and payload); `Err` says why the
    /// stream cannot be built on.
    pub fn push(&mut self, piece: Piece<Bytes>) -> Result<(), String> {
        let h = check_frame(
            &piece,
            self.name.source_id,
            self.frame_ticks,
            self.high,
            self.received == 0,
        )?;
        self.high = h.end;
        self.received += 1;
        self.received_bytes += piece.bytes.len() as u64;
        self.held_bytes += piece.bytes.len() as u64;
        self.held_high = self.held_high.max(self.held_bytes);
        self.frames.push_back((h, piece.bytes));
        Ok(())
    }

    /// The front-end closed the stream: the slices its last frames begin in are cut with
    /// what there is.
    pub fn close(&mut self) {
        self.closed = true;
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The source id its frames carry.
    pub fn source_id(&self) -> u16 {
        self.name.source_id
    }

    /// Whether the next slice can be cut now: every frame beginning in its window is here
    /// (or the stream ended with frames still held).
    pub fn ready(&self) -> bool {
        self.next_is_whole()
    }

    /// Whether every frame beginning in the next slice's window is here.
    fn next_is_whole(&self) -> bool {
        let w = self.slicing.window(self.next);
        self.high >= w.end || (self.closed && !self.frames.is_empty())
    }

    /// Frames read ahead of what the next slice needs (0 while it still needs frames, so
    /// that a slice longer than `source.read_ahead` frames is still read whole).
    pub fn queued(&self) -> usize {
        if self.next_is_whole() {
            self.frames.len()
        } else {
            0
        }
    }

    /// The stream ended and every frame it sent is in a slice cut.
    pub fn exhausted(&self) -> bool {
        self.closed && self.frames.is_empty()
    }

    /// Frames held and in no slice's core cut yet.
    pub fn unbuilt(&self) -> u64 {
        self.frames.len() as u64
    }

    /// Frames received (and their bytes, headers included).
    pub fn received(&self) -> (u64, u64) {
        (self.received, self.received_bytes)
    }

    /// What the buffer holds now: frames, bytes and ticks (newest end less oldest begin).
    pub fn occupancy(&self) -> (u64, u64, u64) {
        let ticks = self.frames.front().map_or(0, |(h, _)| self.high - h.begin);
        (self.frames.len() as u64, self.held_bytes, ticks)
    }

    /// The most bytes the buffer held at once.
    pub fn high_water(&self) -> u64 {
        self.held_high
    }

    /// What it holds now, and its byte account.
    pub fn stats(&self) -> SliceBufferStats {
        let (held_frames, held_bytes, held_ticks) = self.occupancy();
        SliceBufferStats {
            held_frames,
            held_bytes,
            held_ticks,
            held_bytes_high_water: self.held_high,
            bytes_in: self.received_bytes,
            core_bytes: self.core_bytes,
        }
    }

    /// The next slice's window fragment, once every frame beginning in its window is here:
    /// the frames that begin in it, whole (those of its overlap stay for the next slice).
    pub fn next_slice(&mut self) -> Option<Assembled> {
        if !self.next_is_whole() {
            return None;
        }
        let w = self.slicing.window(self.next);
        let n = self
            .frames
            .iter()
            .take_while(|(h, _)| h.begin < w.end)
            .count();
        let core = self
            .frames
            .iter()
            .take_while(|(h, _)| h.begin < w.core_end)
            .count();
        let payload = window_fragment(
            w,
            WindowStatus::Complete,
            self.frames.iter().take(n).map(|(_, b)| b),
        );
        for (_, b) in self.frames.drain(..core) {
            self.held_bytes -= b.len() as u64;
            self.core_bytes += b.len() as u64;
        }
        self.next += 1;
        Some(Assembled {
            trigger_number: w.begin as u32,
            fragments: core as u32,
            payload,
            flags: FLAG_WINDOW,
            written: None,
        })
    }
}

/// An RU's fragment of a record over several streams (docs/formats.md §4 with §10.2): a
/// super-fragment whose entries are the streams' window fragments, in the RU's stream
/// order, each entry's source id the stream's and its trigger number the record's; one
/// stream's part goes as it is.
pub fn super_window(mut parts: Vec<(u16, Assembled)>) -> Assembled {
    if parts.len() == 1 {
        return parts.pop().expect("one part").1;
    }
    let trigger_number = parts.first().map_or(0, |(_, a)| a.trigger_number);
    let entries: Vec<SuperEntry> = parts
        .iter()
        .map(|(source, a)| SuperEntry {
            source_id: *source,
            flags: 0,
            trigger_number,
            length: a.payload.len() as u32,
        })
        .collect();
    let body: usize = parts.iter().map(|(_, a)| a.payload.len()).sum();
    let mut head = Vec::with_capacity(directory_len(entries.len()));
    encode_directory(&entries, &mut head);
    let mut out = BytesMut::with_capacity(head.len() + body);
    out.extend_from_slice(&head);
    for (_, a) in &parts {
        out.extend_from_slice(&a.payload);
    }
    Assembled {
        trigger_number,
        fragments: parts.iter().map(|(_, a)| a.fragments).sum(),
        payload: out.freeze(),
        flags: FLAG_WINDOW | FLAG_SUPER,
        written: None,
    }
}

/// A window fragment (docs/protocol.md §10.2) of `frames` (each a frame header and its
/// payload, in tick order) for window `w` with `status`: one copy of each frame.
pub(crate) fn window_fragment<'a>(
    w: Window,
    status: WindowStatus,
    frames: impl Iterator<Item = &'a Bytes> + Clone,
) -> Bytes {
    let n = frames.clone().count();
    let body: usize = frames.clone().map(Bytes::len).sum();
    let mut out = BytesMut::with_capacity(window_directory_len(n) + body);
    out.extend_from_slice(
        &WindowHeader {
            begin: w.begin,
            end: w.end,
            core_end: w.core_end,
            status,
            frames: n as u32,
        }
        .encode(),
    );
    let mut offset = 0u32;
    for b in frames.clone() {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        offset += b.len() as u32;
    }
    for b in frames {
        out.extend_from_slice(b);
    }
    out.freeze()
}

/// Checks a frame pushed into a latency buffer against the stream's rules: its own checks
/// passed, the stream's source, `frame_ticks` long, beginning where the last one ended
/// (`high`; tick 0 for the first, `first`). `Err` names the frame and what is wrong.
pub(crate) fn check_frame(
    piece: &Piece<Bytes>,
    source_id: u16,
    frame_ticks: u64,
    high: u64,
    first: bool,
) -> Result<TimeFrameHeader, String> {
    let at = piece.offset;
    if let Some(why) = &piece.bad {
        return Err(format!("frame at byte {at}: {why}"));
    }
    let h =
        TimeFrameHeader::decode(&piece.bytes).map_err(|e| format!("frame at byte {at}: {e}"))?;
    if h.source_id != source_id {
        return Err(format!(
            "frame [{}, {}) at byte {at} is source {}'s, not this stream's",
            h.begin, h.end, h.source_id
        ));
    }
    if h.end - h.begin != frame_ticks {
        return Err(format!(
            "frame [{}, {}) at byte {at} lasts {} ticks, not frames.ticks = {frame_ticks}",
            h.begin,
            h.end,
            h.end - h.begin
        ));
    }
    if h.begin != high {
        let what = if first {
            format!("a stream by time begins at the run's first tick, {high} (frames.first_tick)")
        } else {
            format!("the frame before it ended at tick {high}")
        };
        return Err(format!(
            "frame [{}, {}) at byte {at} leaves a gap or an overlap: {what}",
            h.begin, h.end
        ));
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use evb_wire::window::decode_window;

    fn frame(begin: u64, ticks: u64, source: u16, len: usize) -> Bytes {
        let payload: Vec<u8> = (0..len).map(|i| (begin as usize + i) as u8).collect();
        let mut h = TimeFrameHeader {
            begin,
            end: begin + ticks,
            source_id: source,
            flags: 0,
            crc: 0,
        };
        h.crc = h.crc_of([&payload[..]]);
        let mut v = h.encode().to_vec();
        v.extend_from_slice(&payload);
        Bytes::from(v)
    }

    fn piece(bytes: Bytes, offset: u64) -> Piece<Bytes> {
        Piece {
            trigger_number: 0,
            bytes,
            offset,
            bad: None,
        }
    }

    fn buffer(slice: u64, overlap: u64, ticks: u64) -> SliceBuffer {
        let name = StreamName {
            source_id: 4,
            addr: "127.0.0.1:1".into(),
        };
        SliceBuffer::new(
            Slicing {
                slice,
                overlap,
                t0: 0,
            },
            ticks,
            name,
            0,
        )
    }

    /// Frames in, slices out as soon as each is whole: every frame in exactly one core, the
    /// overlap's frames again in the slice before, each slice a valid window fragment; the
    /// last slices cut at the stream's end; nothing held after.
    #[test]
    fn frames_become_slices_each_in_one_core() {
        for (slice, overlap, ticks) in [(100, 10, 10), (100, 0, 7), (30, 30, 40), (50, 12, 50)] {
            let mut b = buffer(slice, overlap, ticks);
            let mut slices = Vec::new();
            let frames = 57u64;
            for j in 0..frames {
                b.push(piece(frame(j * ticks, ticks, 4, (j % 5) as usize * 3), j))
                    .unwrap();
                while let Some(s) = b.next_slice() {
                    slices.push(s);
                }
                // a slice is cut only once a frame at or past its window's end is here
                let w = b.slicing.window(slices.len() as u64);
                assert!(b.high < w.end || b.closed, "{slice}/{overlap}/{ticks}");
            }
            b.close();
            while let Some(s) = b.next_slice() {
                slices.push(s);
            }
            assert!(b.exhausted() && b.unbuilt() == 0 && b.occupancy() == (0, 0, 0));
            let mut in_cores = Vec::new();
            for (k, s) in slices.iter().enumerate() {
                let w = b.slicing.window(k as u64);
                let d = decode_window(&s.payload).unwrap();
                assert_eq!((d.header.begin, d.header.end), (w.begin, w.end));
                assert_eq!(s.trigger_number, w.begin as u32);
                let core: Vec<u64> = d
                    .frames
                    .iter()
                    .map(|(h, _)| h.begin)
                    .filter(|&t| t < w.core_end)
                    .collect();
                assert_eq!(core.len() as u32, s.fragments);
                assert!(d
                    .frames
                    .iter()
                    .all(|(h, _)| h.begin >= w.begin && h.begin < w.end));
                in_cores.extend(core);
                // the overlap's frames are the next slice's first ones
                let over: Vec<u64> = d
                    .frames
                    .iter()
                    .map(|(h, _)| h.begin)
                    .filter(|&t| t >= w.core_end)
                    .collect();
                if let Some(next) = slices.get(k + 1) {
                    let nd = decode_window(&next.payload).unwrap();
                    let firsts: Vec<u64> = nd
                        .frames
                        .iter()
                        .take(over.len())
                        .map(|(h, _)| h.begin)
                        .collect();
                    assert_eq!(firsts, over);
                }
            }
            let all: Vec<u64> = (0..frames).map(|j| j * ticks).collect();
            assert_eq!(in_cores, all, "{slice}/{overlap}/{ticks}");
            assert_eq!(
                slices.iter().map(|s| s.fragments as u64).sum::<u64>(),
                frames
            );
        }
    }

    /// A gap, an overlap, a late first frame, another source's frame, a frame of another
    /// length and a damaged one: each refused, naming the frame.
    #[test]
    fn a_frame_out_of_place_is_refused_by_name() {
        let mut b = buffer(100, 10, 10);
        let e = b.push(piece(frame(10, 10, 4, 3), 0)).unwrap_err();
        assert!(e.contains("begins at the run's first tick, 0"), "{e}");
        b.push(piece(frame(0, 10, 4, 3), 0)).unwrap();
        for (f, want) in [
            (frame(20, 10, 4, 3), "ended at tick 10"),
            (frame(0, 10, 4, 3), "ended at tick 10"),
            (frame(10, 10, 5, 3), "source 5"),
            (frame(10, 11, 4, 3), "not frames.ticks = 10"),
        ] {
            let e = b.push(piece(f, 35)).unwrap_err();
            assert!(e.contains(want) && e.contains("byte 35"), "{e}");
        }
        let mut bad = piece(frame(10, 10, 4, 3), 35);
        bad.bad = Some("CRC32C mismatch".into());
        assert!(b.push(bad).unwrap_err().contains("CRC32C"));
        assert_eq!(b.received(), (1, 27));
    }

    /// The reader may read ahead only once the next slice is whole: a slice of more frames
    /// than the read-ahead still fills.
    #[test]
    fn a_slice_longer_than_the_read_ahead_is_read_whole() {
        let mut b = buffer(1000, 0, 10);
        for j in 0..99 {
            b.push(piece(frame(j * 10, 10, 4, 1), j)).unwrap();
            assert_eq!(b.queued(), 0);
            assert!(b.next_slice().is_none());
        }
        // the last frame beginning in the slice ends at its end: the slice is whole
        b.push(piece(frame(990, 10, 4, 1), 99)).unwrap();
        b.push(piece(frame(1000, 10, 4, 1), 100)).unwrap();
        assert_eq!(b.queued(), 101);
        assert_eq!(b.occupancy(), (101, 101 * 25, 1010));
        assert_eq!(b.next_slice().unwrap().fragments, 100);
        assert_eq!(b.queued(), 0);
    }
}

//! The RU's latency buffer for decision windows over a live stream of frames
//! (`builder.by = "window"`, `source.format = "frames"`, DUNE-like): frames go in as the
//! front-end sends them and leave once they are `windows.buffer_ms` older than the newest
//! (evicted, counted, and counted apart if no window ever took them); an RU assigned
//! decision k cuts window k from what it holds (docs/formats.md §8, §9). No IO here.
//!
//! The cut: the frames overlapping the window, whole. COMPLETE once every one of them has
//! arrived; MISSING at once if the first of them was evicted (with the frames still held);
//! LATE, with the frames that arrived, once `windows.wait_ms` has passed since the Assign
//! without the window's end arriving, or at once when the stream has ended. The stream
//! obeys the slice buffer's rules (tick 0, no gap, `frames.ticks` each, its own source).
//!
//! Memory: the buffer holds `buffer_ms` of the stream (in ticks: `buffer_ms × tick_hz /
//! 1000`), and at most `windows.buffer_bytes` when that is set: past it the oldest frames
//! are evicted as if aged out (counted the same; the newest frame always stays), as a
//! readout card's ring overwrites its oldest data. A window cut is one copy of its frames,
//! held in the RU's pool until its record is released, so overlapping windows copy shared
//! frames.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use evb_wire::window::{TimeFrameHeader, WindowStatus};
use evb_wire::FLAG_WINDOW;

use crate::assembly::{Assembled, Piece};
use crate::frames::Windows;
use crate::slice_buffer::{check_frame, super_window, window_fragment};

#[derive(Debug, Clone)]
struct Held {
    header: TimeFrameHeader,
    bytes: Bytes,
    /// A window took it (an evicted frame no window took is data lost to every trigger).
    used: bool,
}

/// What a latency buffer of windows counted, for the RU's report and the byte account.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowBufferStats {
    pub frames_in: u64,
    pub bytes_in: u64,
    pub evicted_frames: u64,
    pub evicted_bytes: u64,
    /// Evicted with no window over them.
    pub evicted_unused_bytes: u64,
    /// Bytes of distinct frames some window took.
    pub used_bytes: u64,
    /// Bytes held now that no window took (at the end: taken by no decision of the run).
    pub held_unused_bytes: u64,
    pub held_frames: u64,
    pub held_bytes: u64,
    pub held_ticks: u64,
    pub held_bytes_high_water: u64,
}

impl WindowBufferStats {
    /// Two streams' counts together (the ticks held: the larger; the peak: the sum of the
    /// streams' peaks, an upper bound of the RU's, as they may come at different moments).
    fn with(self, o: WindowBufferStats) -> WindowBufferStats {
        WindowBufferStats {
            frames_in: self.frames_in + o.frames_in,
            bytes_in: self.bytes_in + o.bytes_in,
            evicted_frames: self.evicted_frames + o.evicted_frames,
            evicted_bytes: self.evicted_bytes + o.evicted_bytes,
            evicted_unused_bytes: self.evicted_unused_bytes + o.evicted_unused_bytes,
            used_bytes: self.used_bytes + o.used_bytes,
            held_unused_bytes: self.held_unused_bytes + o.held_unused_bytes,
            held_frames: self.held_frames + o.held_frames,
            held_bytes: self.held_bytes + o.held_bytes,
            held_ticks: self.held_ticks.max(o.held_ticks),
            held_bytes_high_water: self.held_bytes_high_water + o.held_bytes_high_water,
        }
    }
}

/// One stream's frames in the buffer.
#[derive(Debug, Clone)]
struct Stream {
    source_id: u16,
    frames: VecDeque<Held>,
    /// The end of the newest frame: where the next must begin.
    high: u64,
    /// Frames ending at or before this were evicted.
    evicted_until: u64,
    closed: bool,
    stats: WindowBufferStats,
}

/// An RU's streams' frames (one, or several: `[[ru]] streams`), cut into decision windows
/// on demand: one window fragment per stream, several going as one super-fragment.
#[derive(Debug, Clone)]
pub struct WindowBuffer {
    windows: Windows,
    frame_ticks: u64,
    /// Most bytes held per stream (frames, headers included); 0: bounded by time only.
    max_bytes: u64,
    streams: Vec<Stream>,
}

impl WindowBuffer {
    /// The buffer of streams whose frames carry `sources` (in the RU's stream order);
    /// `max_bytes`: the bound in bytes per stream (`windows.buffer_bytes`, 0 for none).
    pub fn new(windows: Windows, frame_ticks: u64, sources: &[u16], max_bytes: u64) -> Self {
        let t0 = windows.t0;
        WindowBuffer {
            windows,
            frame_ticks,
            max_bytes,
            streams: sources
                .iter()
                .map(|&source_id| Stream {
                    source_id,
                    frames: VecDeque::new(),
                    // a stream begins at the run's first tick
                    high: t0,
                    evicted_until: t0,
                    closed: false,
                    stats: WindowBufferStats::default(),
                })
                .collect(),
        }
    }

    /// Takes the next frame of stream `stream`, and evicts what is now older than the
    /// depth (or past the bound in bytes).
    pub fn push(&mut self, stream: usize, piece: Piece<Bytes>) -> Result<(), String> {
        let (frame_ticks, buffer_ticks, max_bytes) =
            (self.frame_ticks, self.windows.buffer_ticks, self.max_bytes);
        let s = self
            .streams
            .get_mut(stream)
            .ok_or_else(|| format!("no stream {stream} in this RU"))?;
        let first = s.stats.frames_in == 0;
        let header = check_frame(&piece, s.source_id, frame_ticks, s.high, first)?;
        let len = piece.bytes.len() as u64;
        s.high = header.end;
        s.stats.frames_in += 1;
        s.stats.bytes_in += len;
        s.stats.held_bytes += len;
        s.frames.push_back(Held {
            header,
            bytes: piece.bytes,
            used: false,
        });
        s.evict(buffer_ticks, max_bytes);
        s.stats.held_bytes_high_water = s.stats.held_bytes_high_water.max(s.stats.held_bytes);
        Ok(())
    }

    /// The front-end closed stream `stream`: no frame of it will come, a window past its
    /// end is LATE at once.
    pub fn close(&mut self, stream: usize) {
        if let Some(s) = self.streams.get_mut(stream) {
            s.closed = true;
        }
    }

    /// Every stream has ended.
    pub fn is_closed(&self) -> bool {
        self.streams.iter().all(|s| s.closed)
    }

    /// Whether stream `stream` has ended.
    pub fn is_stream_closed(&self, stream: usize) -> bool {
        self.streams.get(stream).is_none_or(|s| s.closed)
    }

    /// The decisions' windows (to be told those of decisions from outside).
    pub fn windows_mut(&mut self) -> &mut Windows {
        &mut self.windows
    }

    pub fn windows(&self) -> &Windows {
        &self.windows
    }

    /// Every stream's counts together.
    pub fn stats(&self) -> WindowBufferStats {
        self.streams
            .iter()
            .map(Stream::stats)
            .fold(WindowBufferStats::default(), WindowBufferStats::with)
    }

    /// Decision `record`'s fragment from what the buffer holds, having waited `waited`
    /// since its Assign: each stream's window fragment (one super-fragment of them for
    /// several); `None` while some stream the decision names has not reached the window's
    /// end, had nothing of it evicted and has not ended, and the wait is not over.
    pub fn cut(&mut self, record: u64, waited: Duration) -> Option<Assembled> {
        let w = self.windows.window(record);
        let (f, wait) = (self.frame_ticks, self.windows.wait);
        let windows = &self.windows;
        if self
            .streams
            .iter()
            .any(|s| windows.covers(record, s.source_id) && !s.due(w, f, waited, wait))
        {
            return None;
        }
        let parts = self
            .streams
            .iter_mut()
            .map(|s| {
                let named = windows.covers(record, s.source_id);
                (s.source_id, s.cut(w, f, named))
            })
            .collect();
        Some(super_window(parts))
    }
}

impl Stream {
    fn evict(&mut self, buffer_ticks: u64, max_bytes: u64) {
        let keep_from = self.high.saturating_sub(buffer_ticks);
        while let Some(f) = self.frames.front() {
            let over = max_bytes > 0 && self.stats.held_bytes > max_bytes && self.frames.len() > 1;
            if f.header.end > keep_from && !over {
                break;
            }
            let f = self.frames.pop_front().expect("a front frame");
            let len = f.bytes.len() as u64;
            self.evicted_until = f.header.end;
            self.stats.held_bytes -= len;
            self.stats.evicted_frames += 1;
            self.stats.evicted_bytes += len;
            if !f.used {
                self.stats.evicted_unused_bytes += len;
            }
        }
    }

    fn stats(&self) -> WindowBufferStats {
        let mut s = self.stats;
        s.held_frames = self.frames.len() as u64;
        s.held_unused_bytes = self
            .frames
            .iter()
            .filter(|h| !h.used)
            .map(|h| h.bytes.len() as u64)
            .sum();
        s.held_ticks = self
            .frames
            .front()
            .map_or(0, |f| self.high - f.header.begin);
        s
    }

    /// Whether window `w` can be cut from this stream now: its end has arrived, some of it
    /// was evicted, the stream ended, or the wait is over.
    fn due(&self, w: crate::frames::Window, f: u64, waited: Duration, wait: Duration) -> bool {
        let (first, end) = (w.begin / f, w.end.div_ceil(f));
        let missing = self.evicted_until > first * f;
        end <= self.high / f || missing || self.closed || waited >= wait
    }

    /// This stream's window fragment of `w`: EMPTY when the decision does not name it
    /// (`named` false), else the frames overlapping the window, whole, with the status
    /// that says what they leave out.
    fn cut(&mut self, w: crate::frames::Window, f: u64, named: bool) -> Assembled {
        let fragment = |status, taken: &[Bytes]| Assembled {
            trigger_number: w.begin as u32,
            fragments: taken.len() as u32,
            payload: window_fragment(w, status, taken.iter()),
            flags: FLAG_WINDOW,
            written: None,
        };
        if !named {
            return fragment(WindowStatus::Empty, &[]);
        }
        let (first, end) = (w.begin / f, w.end.div_ceil(f));
        let arrived = self.high / f;
        let status = if self.evicted_until > first * f {
            WindowStatus::Missing
        } else if end > arrived {
            WindowStatus::Late
        } else {
            WindowStatus::Complete
        };
        let mut taken = Vec::new();
        for h in self
            .frames
            .iter_mut()
            .filter(|h| h.header.end > w.begin && h.header.begin < w.end)
        {
            if !h.used {
                h.used = true;
                self.stats.used_bytes += h.bytes.len() as u64;
            }
            taken.push(h.bytes.clone());
        }
        fragment(status, &taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::check_window;
    use evb_buffers::Chain;
    use evb_wire::window::decode_window;
    use evb_wire::FragmentHeader;

    const F: u64 = 100;

    fn frame(j: u64, len: usize) -> Piece<Bytes> {
        frame_of(2, j, len)
    }

    fn frame_of(source_id: u16, j: u64, len: usize) -> Piece<Bytes> {
        let payload = vec![j as u8; len];
        let mut h = TimeFrameHeader {
            begin: j * F,
            end: (j + 1) * F,
            source_id,
            flags: 0,
            crc: 0,
        };
        h.crc = h.crc_of([&payload[..]]);
        let mut v = h.encode().to_vec();
        v.extend_from_slice(&payload);
        Piece {
            trigger_number: 0,
            bytes: Bytes::from(v),
            offset: j,
            bad: None,
        }
    }

    fn listed(list: &[(u64, u64)], buffer_ticks: u64) -> WindowBuffer {
        let windows = Windows {
            listed: Some(
                list.iter()
                    .map(|&(b, e)| evb_wire::window::DecisionWindow::all(b, e))
                    .collect(),
            ),
            seed: 1,
            rate_hz: 100.0,
            tick_hz: 1_000_000,
            before: 0,
            after: 0,
            delay_min: 0,
            delay_max: 0,
            buffer_ticks,
            wait: Duration::from_millis(10),
            outside: false,
            t0: 0,
            decided: Default::default(),
        };
        WindowBuffer::new(windows, F, &[2], 0)
    }

    /// The BU's check of the cut, as it will judge it; the frames' first ticks.
    fn judged(b: &WindowBuffer, record: u64, a: &Assembled) -> (WindowStatus, Vec<u64>) {
        let header = FragmentHeader {
            event_id: record,
            trigger_number: a.trigger_number,
            source_id: 2,
            flags: a.flags,
            payload_size: a.payload.len() as u32,
            payload_crc: 0,
        };
        let pool = evb_buffers::Pool::new("t", 1 << 16, 2);
        let chain = Chain::from_slice(pool.try_alloc().unwrap().append(&a.payload).unwrap());
        let status = check_window(&b.windows, F, &header, &chain)
            .unwrap_or_else(|e| panic!("record {record}: {e}"));
        let d = decode_window(&a.payload).unwrap();
        (status, d.frames.iter().map(|(h, _)| h.begin).collect())
    }

    /// Complete, LATE at the edge of the wait (just under: wait; at it: LATE), MISSING at
    /// the edge of the depth (one tick inside: complete; at it: MISSING), overlapping windows
    /// sharing frames, and the byte account: in = used + evicted unused + held unused.
    #[test]
    fn windows_cut_from_live_frames_at_the_edges() {
        let list = [
            (150, 420),   // 0: frames 1..5
            (300, 350),   // 1: frame 3, overlapping 0
            (900, 1200),  // 2: frames 9..12: not there yet
            (0, 100),     // 3: frame 0: evicted by then
            (1101, 1150), // 4: frame 11, ahead
        ];
        let mut b = listed(&list, 800);
        for j in 0..5 {
            b.push(0, frame(j, 10 + j as usize)).unwrap();
        }
        let a = b.cut(0, Duration::ZERO).unwrap();
        assert_eq!(
            judged(&b, 0, &a),
            (WindowStatus::Complete, vec![100, 200, 300, 400])
        );
        let a = b.cut(1, Duration::ZERO).unwrap();
        assert_eq!(judged(&b, 1, &a), (WindowStatus::Complete, vec![300]));
        for j in 5..10 {
            b.push(0, frame(j, 10 + j as usize)).unwrap();
        }
        // frames end at 1000: window 2 needs up to 1200
        assert!(b.cut(2, Duration::from_micros(9_999)).is_none());
        let a = b.cut(2, Duration::from_millis(10)).unwrap();
        assert_eq!(judged(&b, 2, &a), (WindowStatus::Late, vec![900]));
        // depth 800 ticks: at high 1000 frames ending at or before 200 are gone (frame 0, 1)
        let a = b.cut(3, Duration::ZERO).unwrap();
        assert_eq!(judged(&b, 3, &a), (WindowStatus::Missing, vec![]));
        assert_eq!(b.stats().evicted_frames, 2);
        // frame 0 never taken, frame 1 taken by window 0
        assert_eq!(b.stats().evicted_unused_bytes, 24 + 10);
        // one tick inside the depth: frame 2 ([200, 300)) is held at high 1000
        let mut edge = listed(&[(200, 300)], 799);
        for j in 0..10 {
            edge.push(0, frame(j, 1)).unwrap();
        }
        let a = edge.cut(0, Duration::ZERO).unwrap();
        assert_eq!(judged(&edge, 0, &a).0, WindowStatus::Complete);
        let mut edge = listed(&[(200, 300)], 700);
        for j in 0..10 {
            edge.push(0, frame(j, 1)).unwrap();
        }
        let a = edge.cut(0, Duration::ZERO).unwrap();
        assert_eq!(judged(&edge, 0, &a).0, WindowStatus::Missing);
        // the stream ends: a window ahead of it is LATE at once, with nothing
        b.close(0);
        let a = b.cut(4, Duration::ZERO).unwrap();
        assert_eq!(judged(&b, 4, &a), (WindowStatus::Late, vec![]));
        let s = b.stats();
        assert_eq!(
            s.bytes_in,
            s.used_bytes + s.evicted_unused_bytes + s.held_unused_bytes
        );
        assert_eq!(s.held_bytes + s.evicted_bytes, s.bytes_in);
    }

    /// A bound in bytes evicts the oldest frames as the depth in time does: at the bound
    /// (just under: kept; one byte over: the oldest goes), counted in the byte account, and
    /// a window over them is MISSING. The newest frame stays whatever its size.
    #[test]
    fn a_bound_in_bytes_evicts_the_oldest_frames_and_counts_them() {
        // frames of 24 + 10 bytes; a depth in time that never evicts
        let bounded = |max_bytes| {
            let mut b = WindowBuffer::new(
                listed(&[(0, 100), (900, 1000)], 1 << 30).windows,
                F,
                &[2],
                max_bytes,
            );
            for j in 0..10 {
                b.push(0, frame(j, 10)).unwrap();
            }
            b
        };
        let mut at = bounded(10 * 34);
        assert_eq!((at.stats().evicted_frames, at.stats().held_bytes), (0, 340));
        let a = at.cut(0, Duration::ZERO).unwrap();
        assert_eq!(judged(&at, 0, &a), (WindowStatus::Complete, vec![0]));
        let mut under = bounded(10 * 34 - 1);
        let s = under.stats();
        assert_eq!((s.evicted_frames, s.held_bytes, s.held_frames), (1, 306, 9));
        assert_eq!(s.held_bytes_high_water, 306);
        let a = under.cut(0, Duration::ZERO).unwrap();
        assert_eq!(judged(&under, 0, &a), (WindowStatus::Missing, vec![]));
        let a = under.cut(1, Duration::ZERO).unwrap();
        assert_eq!(judged(&under, 1, &a), (WindowStatus::Complete, vec![900]));
        let s = under.stats();
        assert_eq!(s.evicted_unused_bytes, 34);
        assert_eq!(
            s.bytes_in,
            s.used_bytes + s.evicted_unused_bytes + s.held_unused_bytes
        );
        // a bound below one frame keeps the newest frame only
        let tiny = bounded(1);
        assert_eq!(
            (tiny.stats().held_frames, tiny.stats().evicted_frames),
            (1, 9)
        );
    }

    /// A decision that does not name the stream's source is cut EMPTY at once, holding no
    /// frame, and takes nothing from the byte account.
    #[test]
    fn a_decision_naming_other_sources_is_cut_empty() {
        let mut b = listed(&[(0, 100)], 1 << 30);
        b.windows.listed =
            Some(vec![evb_wire::window::DecisionWindow::new(0, 100, vec![7]).unwrap()].into());
        b.push(0, frame(0, 10)).unwrap();
        let a = b.cut(0, Duration::ZERO).unwrap();
        assert_eq!(judged(&b, 0, &a), (WindowStatus::Empty, vec![]));
        assert_eq!(b.stats().used_bytes, 0);
    }

    /// An RU of two streams: a window is cut once both streams are due (one ahead, the
    /// other waiting: nothing yet), as a super-fragment of the two window fragments, each
    /// judged by the BU's checks as its stream's; a decision naming one stream has the other
    /// EMPTY. The byte account adds the streams up.
    #[test]
    fn two_streams_cut_one_super_fragment_of_their_windows() {
        let list = [
            evb_wire::window::DecisionWindow::all(150, 420),
            evb_wire::window::DecisionWindow::new(150, 420, vec![5]).unwrap(),
        ];
        let mut windows = listed(&[], 1 << 30).windows;
        windows.listed = Some(list.to_vec().into());
        let mut b = WindowBuffer::new(windows.clone(), F, &[2, 5], 0);
        for j in 0..5 {
            b.push(0, frame_of(2, j, 10)).unwrap();
        }
        assert!(b.cut(0, Duration::ZERO).is_none(), "stream 1 not there yet");
        for j in 0..5 {
            b.push(1, frame_of(5, j, 20)).unwrap();
        }
        let pool = evb_buffers::Pool::new("t", 1 << 16, 4);
        let g = crate::frames::FrameGenerator::new(
            crate::generator::Generator::new(crate::generator::SizeModel::Fixed(10), 1),
            F,
            crate::frames::Slicing {
                slice: F,
                overlap: 0,
                t0: 0,
            },
        )
        .with_windows(windows);
        for (record, want) in [(0, (0, 0, 0)), (1, (0, 0, 1))] {
            let a = b.cut(record, Duration::ZERO).unwrap();
            assert_eq!(a.flags, FLAG_WINDOW | evb_wire::FLAG_SUPER);
            let header = FragmentHeader {
                event_id: record,
                trigger_number: a.trigger_number,
                source_id: 0,
                flags: a.flags,
                payload_size: a.payload.len() as u32,
                payload_crc: 0,
            };
            let chain = Chain::from_slice(pool.try_alloc().unwrap().append(&a.payload).unwrap());
            let parts = crate::frames::super_entries(&header, &chain).unwrap();
            let sources: Vec<u16> = parts.iter().map(|(h, _)| h.source_id).collect();
            assert_eq!(sources, [2, 5]);
            let c = g.check_all(&header, &chain).unwrap();
            assert_eq!((c.late, c.missing, c.empty), want, "record {record}");
        }
        let s = b.stats();
        assert_eq!(s.bytes_in, 5 * 34 + 5 * 44);
        assert_eq!(
            s.bytes_in,
            s.used_bytes + s.evicted_unused_bytes + s.held_unused_bytes
        );
        assert!(!b.is_closed());
        b.close(0);
        b.close(1);
        assert!(b.is_closed());
    }
}

//! Timestamped data (docs/protocol.md §10): the header in front of every *time frame* (one
//! source's data for a tick range), and the *window fragment*, the payload of a fragment
//! flagged [`crate::FLAG_WINDOW`]: one RU's frames for one record's window.
//!
//! Time frame header, 24 bytes, little-endian:
//! begin tick u64 | end tick u64 | source id u16 | flags u16 | CRC32C u32 (of header bytes
//! 0..20, then the frame's payload).
//!
//! Window fragment: window begin u64 | window end u64 | core end u64 | status u16 |
//! reserved u16 | frame count n u32 | n × (offset u32, length u32) | the n frames.

use crate::bytes::{need, u16_at, u32_at, u64_at};
use crate::error::{Result, WireError};

pub const TIME_FRAME_HEADER_LEN: usize = 24;
pub const WINDOW_HEADER_LEN: usize = 32;
pub const WINDOW_ENTRY_LEN: usize = 8;
/// Most frames one window fragment may hold (a bound for a reader's allocation).
pub const MAX_WINDOW_FRAMES: u32 = 1 << 20;
/// Time frame flag: made by the built-in generator (its payload can be recomputed).
pub const TIME_FRAME_GENERATED: u16 = 0x0001;
const KNOWN_TIME_FRAME_FLAGS: u16 = TIME_FRAME_GENERATED;

/// Most components one decision may name (docs/protocol.md §10.4).
pub const MAX_WINDOW_COMPONENTS: usize = 1024;

/// A trigger decision's readout window: ticks `[begin, end)` over the sources in
/// `components` (source ids, strictly ascending), or over every source when it is empty.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DecisionWindow {
    pub begin: u64,
    pub end: u64,
    pub components: Vec<u16>,
}

impl DecisionWindow {
    /// A window over every source.
    pub fn all(begin: u64, end: u64) -> DecisionWindow {
        DecisionWindow {
            begin,
            end,
            components: Vec::new(),
        }
    }

    /// A window over `components` as a person lists them (any order; empty: every
    /// source), sorted; refused with the reason ([`DecisionWindow::problem`]).
    pub fn new(
        begin: u64,
        end: u64,
        mut components: Vec<u16>,
    ) -> std::result::Result<DecisionWindow, String> {
        components.sort_unstable();
        let w = DecisionWindow {
            begin,
            end,
            components,
        };
        match w.problem() {
            Some(p) => Err(p),
            None => Ok(w),
        }
    }

    /// Components as text: source ids separated by commas (`"3,9,12"`).
    pub fn parse_components(text: &str) -> std::result::Result<Vec<u16>, String> {
        text.split(',')
            .map(|s| {
                s.trim()
                    .parse::<u16>()
                    .map_err(|_| format!("{s:?} is not a source id (0 to 65535)"))
            })
            .collect()
    }

    /// Whether the decision asks for source `source`'s data.
    pub fn covers(&self, source: u16) -> bool {
        self.components.is_empty() || self.components.binary_search(&source).is_ok()
    }

    /// Bytes of this window's entry in a Window message: 20 + 2·c, padded to 8.
    pub fn entry_len(&self) -> usize {
        (20 + 2 * self.components.len()).next_multiple_of(8)
    }

    /// What is wrong with this window, if anything: an end not after its begin, too many
    /// components, or components not strictly ascending (out of order or twice).
    pub fn problem(&self) -> Option<String> {
        if self.end <= self.begin {
            return Some(format!(
                "window [{}, {}) does not end after it begins",
                self.begin, self.end
            ));
        }
        if self.components.len() > MAX_WINDOW_COMPONENTS {
            return Some(format!(
                "{} components (at most {MAX_WINDOW_COMPONENTS})",
                self.components.len()
            ));
        }
        if self.components.windows(2).any(|p| p[0] >= p[1]) {
            return Some("components not in ascending order, or one named twice".into());
        }
        None
    }
}

/// One source's data for ticks `[begin, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeFrameHeader {
    pub begin: u64,
    pub end: u64,
    pub source_id: u16,
    pub flags: u16,
    pub crc: u32,
}

impl TimeFrameHeader {
    /// The first 20 bytes (everything the CRC covers before the payload).
    pub fn covered(&self) -> [u8; 20] {
        let mut b = [0u8; 20];
        b[0..8].copy_from_slice(&self.begin.to_le_bytes());
        b[8..16].copy_from_slice(&self.end.to_le_bytes());
        b[16..18].copy_from_slice(&self.source_id.to_le_bytes());
        b[18..20].copy_from_slice(&self.flags.to_le_bytes());
        b
    }

    /// The CRC this header must carry for `payload` (in pieces).
    pub fn crc_of<'a>(&self, payload: impl IntoIterator<Item = &'a [u8]>) -> u32 {
        payload
            .into_iter()
            .fold(crc32c::crc32c(&self.covered()), |c, p| {
                crc32c::crc32c_append(c, p)
            })
    }

    pub fn encode(&self) -> [u8; TIME_FRAME_HEADER_LEN] {
        let mut b = [0u8; TIME_FRAME_HEADER_LEN];
        b[..20].copy_from_slice(&self.covered());
        b[20..24].copy_from_slice(&self.crc.to_le_bytes());
        b
    }

    /// Reads and checks a header (range, flags); the CRC is checked against the payload by
    /// [`decode_window`].
    pub fn decode(b: &[u8]) -> Result<TimeFrameHeader> {
        need("time frame header", b, TIME_FRAME_HEADER_LEN)?;
        let h = TimeFrameHeader {
            begin: u64_at(b, 0),
            end: u64_at(b, 8),
            source_id: u16_at(b, 16),
            flags: u16_at(b, 18),
            crc: u32_at(b, 20),
        };
        if h.end <= h.begin {
            return Err(WireError::OutOfRange {
                what: "time frame end (not after its begin)",
                value: h.end,
            });
        }
        if h.flags & !KNOWN_TIME_FRAME_FLAGS != 0 {
            return Err(WireError::OutOfRange {
                what: "time frame flags",
                value: h.flags as u64,
            });
        }
        Ok(h)
    }
}

/// What an RU could give of a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(u16)]
pub enum WindowStatus {
    #[default]
    Complete = 0,
    /// The window's end had not arrived by the deadline.
    Late = 1,
    /// Part of the window was evicted before it was asked for.
    Missing = 2,
    /// The record's decision names other sources: nothing was asked of this one.
    Empty = 3,
}

impl WindowStatus {
    fn from_u16(v: u16) -> Result<WindowStatus> {
        Ok(match v {
            0 => WindowStatus::Complete,
            1 => WindowStatus::Late,
            2 => WindowStatus::Missing,
            3 => WindowStatus::Empty,
            _ => {
                return Err(WireError::OutOfRange {
                    what: "window status",
                    value: v as u64,
                })
            }
        })
    }
}

/// The fixed part of a window fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowHeader {
    pub begin: u64,
    pub end: u64,
    /// End of the core: a time slice's frames that begin at or after it are its overlap
    /// (carried again as the next slice's core). Equal to `end` for a triggered window.
    pub core_end: u64,
    pub status: WindowStatus,
    pub frames: u32,
}

impl WindowHeader {
    pub fn encode(&self) -> [u8; WINDOW_HEADER_LEN] {
        let mut b = [0u8; WINDOW_HEADER_LEN];
        b[0..8].copy_from_slice(&self.begin.to_le_bytes());
        b[8..16].copy_from_slice(&self.end.to_le_bytes());
        b[16..24].copy_from_slice(&self.core_end.to_le_bytes());
        b[24..26].copy_from_slice(&(self.status as u16).to_le_bytes());
        b[28..32].copy_from_slice(&self.frames.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<WindowHeader> {
        need("window fragment header", b, WINDOW_HEADER_LEN)?;
        let h = WindowHeader {
            begin: u64_at(b, 0),
            end: u64_at(b, 8),
            core_end: u64_at(b, 16),
            status: WindowStatus::from_u16(u16_at(b, 24))?,
            frames: u32_at(b, 28),
        };
        if u16_at(b, 26) != 0 {
            return Err(WireError::ReservedNonZero {
                what: "window fragment header",
            });
        }
        if h.end <= h.begin {
            return Err(WireError::OutOfRange {
                what: "window end (not after its begin)",
                value: h.end,
            });
        }
        if h.core_end <= h.begin || h.core_end > h.end {
            return Err(WireError::OutOfRange {
                what: "window core end (outside the window)",
                value: h.core_end,
            });
        }
        if h.frames > MAX_WINDOW_FRAMES {
            return Err(WireError::OutOfRange {
                what: "window frame count",
                value: h.frames as u64,
            });
        }
        Ok(h)
    }
}

/// Bytes of the header and directory of a window fragment of `n` frames.
pub fn window_directory_len(n: usize) -> usize {
    WINDOW_HEADER_LEN + n * WINDOW_ENTRY_LEN
}

/// A window fragment read and checked by [`decode_window`]: its frames borrow the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowFragment<'a> {
    pub header: WindowHeader,
    pub frames: Vec<(TimeFrameHeader, &'a [u8])>,
}

/// Reads a window fragment (the whole payload, contiguous) and checks everything it can
/// alone: the header, the directory (frames back to back in order, lengths adding up to the
/// payload), every frame's header and CRC, frames in begin order without overlapping one
/// another, each beginning inside the window (a time slice: its frames are those that begin
/// in it) or overlapping it.
pub fn decode_window(payload: &[u8]) -> Result<WindowFragment<'_>> {
    let header = WindowHeader::decode(payload)?;
    let n = header.frames as usize;
    if header.status == WindowStatus::Empty && n > 0 {
        return Err(WireError::OutOfRange {
            what: "window frame count (an EMPTY window holds no frame)",
            value: n as u64,
        });
    }
    let dir = window_directory_len(n);
    need("window fragment directory", payload, dir)?;
    let body = &payload[dir..];
    let mut frames = Vec::with_capacity(n);
    let mut next = 0usize;
    let mut last_end = 0u64;
    for i in 0..n {
        let at = WINDOW_HEADER_LEN + i * WINDOW_ENTRY_LEN;
        let offset = u32_at(payload, at) as usize;
        let len = u32_at(payload, at + 4) as usize;
        if offset != next {
            return Err(WireError::BadLength {
                what: "window frame offset (frames lie back to back)",
                expected: next,
                got: offset,
            });
        }
        if len < TIME_FRAME_HEADER_LEN || body.len() - offset < len {
            return Err(WireError::BadLength {
                what: "window frame length",
                expected: body.len() - offset,
                got: len,
            });
        }
        let bytes = &body[offset..offset + len];
        let h = TimeFrameHeader::decode(bytes)?;
        let data = &bytes[TIME_FRAME_HEADER_LEN..];
        let computed = h.crc_of([data]);
        if computed != h.crc {
            return Err(WireError::HeaderChecksum {
                got: h.crc,
                computed,
            });
        }
        if i > 0 && h.begin < last_end {
            return Err(WireError::OutOfRange {
                what: "time frame begin (before the previous frame's end)",
                value: h.begin,
            });
        }
        if h.end <= header.begin || h.begin >= header.end {
            return Err(WireError::OutOfRange {
                what: "time frame begin (outside its window)",
                value: h.begin,
            });
        }
        last_end = h.end;
        next = offset + len;
        frames.push((h, data));
    }
    if next != body.len() {
        return Err(WireError::BadLength {
            what: "window fragment (directory and frame lengths)",
            expected: payload.len(),
            got: dir + next,
        });
    }
    Ok(WindowFragment { header, frames })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(begin: u64, end: u64, data: &[u8]) -> Vec<u8> {
        let mut h = TimeFrameHeader {
            begin,
            end,
            source_id: 3,
            flags: TIME_FRAME_GENERATED,
            crc: 0,
        };
        h.crc = h.crc_of([data]);
        [&h.encode()[..], data].concat()
    }

    fn window(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut out = WindowHeader {
            begin: 100,
            end: 250,
            core_end: 200,
            status: WindowStatus::Complete,
            frames: frames.len() as u32,
        }
        .encode()
        .to_vec();
        let mut off = 0u32;
        for f in frames {
            out.extend_from_slice(&off.to_le_bytes());
            out.extend_from_slice(&(f.len() as u32).to_le_bytes());
            off += f.len() as u32;
        }
        for f in frames {
            out.extend_from_slice(f);
        }
        out
    }

    #[test]
    fn a_window_reads_back_and_every_damage_is_refused() {
        let frames = [
            frame(100, 150, b"abc"),
            frame(150, 200, b""),
            frame(200, 260, b"xy"),
        ];
        let w = window(&frames);
        let got = decode_window(&w).expect("good");
        assert_eq!(got.frames.len(), 3);
        assert_eq!(got.frames[2].1, b"xy");
        assert_eq!(got.header.core_end, 200);
        // every single-bit flip past the window's range and status is caught (those the BU
        // checks against the record: the fragment alone cannot tell)
        for i in 26 * 8..w.len() * 8 {
            let mut bad = w.clone();
            bad[i / 8] ^= 1 << (i % 8);
            assert!(decode_window(&bad).is_err(), "bit {i} flipped, accepted");
        }
        for cut in 0..w.len() {
            assert!(decode_window(&w[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = w.clone();
        longer.push(0);
        assert!(decode_window(&longer).is_err());
        // frames out of order or overlapping one another
        let swapped = window(&[frames[1].clone(), frames[0].clone()]);
        assert!(decode_window(&swapped).is_err());
        let outside = window(&[frame(250, 300, b"z")]);
        assert!(decode_window(&outside).is_err());
        let empty = window(&[]);
        assert_eq!(decode_window(&empty).unwrap().frames.len(), 0);
        // EMPTY (a source the decision does not name) holds no frame
        let mut not_named = empty.clone();
        not_named[24..26].copy_from_slice(&3u16.to_le_bytes());
        assert_eq!(
            decode_window(&not_named).unwrap().header.status,
            WindowStatus::Empty
        );
        let mut with_frames = w.clone();
        with_frames[24..26].copy_from_slice(&3u16.to_le_bytes());
        assert!(decode_window(&with_frames).is_err());
    }
}

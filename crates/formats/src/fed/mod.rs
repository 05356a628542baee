//! The CMS common FED data format: a fragment is a run of 64-bit little-endian words, a
//! header word first and a trailer word last.
//!
//! Header: bits 63–60 = 0x5, 59–56 event type, 55–32 LV1 id, 31–20 bunch crossing,
//! 19–8 source (FED) id, 7–4 format version, bit 3 = another header word follows.
//! Trailer: bits 63–60 = 0xa, 55–32 length in words (header and trailer included),
//! 31–16 CRC-16, low bits status.
//! CRC-16: polynomial 0x8005, initial 0xFFFF, not reflected, over every word in big-endian
//! byte order with the trailer's CRC field zeroed.

use thiserror::Error;

mod crc16;

pub use crc16::crc16;
#[cfg(test)]
pub(crate) use crc16::{crc16_bytewise, crc16_portable};

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FedError {
    #[error("fragment at byte {offset}: {reason}")]
    Framing { offset: usize, reason: String },
    #[error("fragment at byte {offset}: header marker {marker:#x}, expected 0x5")]
    HeaderMarker { offset: usize, marker: u8 },
    #[error(
        "fragment at byte {offset}: CRC {stored:#06x} in the trailer, computed {computed:#06x}"
    )]
    Crc {
        offset: usize,
        stored: u16,
        computed: u16,
    },
    #[error("fragment at byte {offset}: source id {got}, expected {expected}")]
    Source {
        offset: usize,
        got: u16,
        expected: u16,
    },
}

/// What the header and trailer say about one fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FedInfo {
    pub lv1_id: u32,
    pub bx_id: u16,
    pub source_id: u16,
    pub event_type: u8,
    pub words: usize,
}

fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
}

fn is_trailer_for(w: u64, words_so_far: usize) -> bool {
    w >> 60 == 0xa && ((w >> 32) & 0xff_ffff) as usize == words_so_far
}

/// Finds the fragments in a file's bytes: each ends at the first trailer whose length field
/// matches its position, so a damaged header does not lose the next fragment's boundary.
/// Returns byte ranges; a tail that does not end in a trailer is an error.
pub fn split(data: &[u8]) -> Result<Vec<std::ops::Range<usize>>, FedError> {
    if !data.len().is_multiple_of(8) {
        return Err(FedError::Framing {
            offset: 0,
            reason: format!("{} bytes is not a whole number of 64-bit words", data.len()),
        });
    }
    let total = data.len() / 8;
    let mut out = Vec::new();
    let mut start = 0;
    while start < total {
        let end = (start + 1..total).find(|&j| is_trailer_for(word(data, j), j - start + 1));
        match end {
            Some(j) => {
                out.push(start * 8..(j + 1) * 8);
                start = j + 1;
            }
            None => {
                return Err(FedError::Framing {
                    offset: start * 8,
                    reason: "no trailer matching its length before the end of the file".into(),
                })
            }
        }
    }
    Ok(out)
}

/// Checks one fragment (markers, length, CRC, and the source id if one is expected).
pub fn validate(
    fragment: &[u8],
    offset: usize,
    expected_source: Option<u16>,
) -> Result<FedInfo, FedError> {
    let words = fragment.len() / 8;
    if !fragment.len().is_multiple_of(8) || words < 2 {
        return Err(FedError::Framing {
            offset,
            reason: format!("{} bytes is too short or not whole words", fragment.len()),
        });
    }
    let h = word(fragment, 0);
    let t = word(fragment, words - 1);
    let marker = (h >> 60) as u8;
    if marker != 0x5 {
        return Err(FedError::HeaderMarker { offset, marker });
    }
    if !is_trailer_for(t, words) {
        return Err(FedError::Framing {
            offset,
            reason: "trailer marker or length does not match".into(),
        });
    }
    let stored = ((t >> 16) & 0xffff) as u16;
    let computed = crc16(fragment);
    if stored != computed {
        return Err(FedError::Crc {
            offset,
            stored,
            computed,
        });
    }
    let info = FedInfo {
        lv1_id: ((h >> 32) & 0xff_ffff) as u32,
        bx_id: ((h >> 20) & 0xfff) as u16,
        source_id: ((h >> 8) & 0xfff) as u16,
        event_type: ((h >> 56) & 0xf) as u8,
        words,
    };
    if let Some(expected) = expected_source {
        if info.source_id != expected {
            return Err(FedError::Source {
                offset,
                got: info.source_id,
                expected,
            });
        }
    }
    Ok(info)
}

/// Makes a valid fragment (for tests and examples): header, `payload_words` words, trailer.
pub fn build(lv1_id: u32, source_id: u16, payload: &[u64]) -> Vec<u8> {
    let words = payload.len() + 2;
    let header = (0x5u64 << 60)
        | (1u64 << 56)
        | (((lv1_id as u64) & 0xff_ffff) << 32)
        | (0x123 << 20)
        | (((source_id as u64) & 0xfff) << 8);
    let trailer_no_crc = (0xau64 << 60) | ((words as u64 & 0xff_ffff) << 32);
    let mut v = Vec::with_capacity(words * 8);
    v.extend_from_slice(&header.to_le_bytes());
    for w in payload {
        v.extend_from_slice(&w.to_le_bytes());
    }
    v.extend_from_slice(&trailer_no_crc.to_le_bytes());
    let crc = crc16(&v) as u64;
    let trailer = trailer_no_crc | (crc << 16);
    let n = v.len();
    v[n - 8..].copy_from_slice(&trailer.to_le_bytes());
    v
}

/// The LV1 id the header word of `fragment` gives, checked or not (for the record of a bad
/// fragment); `None` if there is no whole first word.
pub fn header_lv1(fragment: &[u8]) -> Option<u32> {
    let h = u64::from_le_bytes(fragment.get(..8)?.try_into().ok()?);
    Some(((h >> 32) & 0xff_ffff) as u32)
}

/// Whether word `w` (0-based) of a fragment is its trailer: marker 0xa and a length field
/// equal to `w + 1` words (how [`split`] finds boundaries; a stream reader uses it as words arrive).
pub fn is_trailer_at(word_le: [u8; 8], w: usize) -> bool {
    is_trailer_for(u64::from_le_bytes(word_le), w + 1)
}

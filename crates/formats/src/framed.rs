//! evb's generic fragment file framing, for any experiment: records of a 24-byte header and
//! a payload, back to back.
//!
//! Record header, little-endian: magic "EVFR" | version u16 (1) | flags u16 (0) |
//! payload length u32 | trigger number u32 | payload CRC32C u32 | header CRC32C u32 (bytes 0..20).

use thiserror::Error;

pub const RECORD_MAGIC: [u8; 4] = *b"EVFR";
pub const RECORD_HEADER_LEN: usize = 24;
/// Largest payload accepted in one record.
pub const MAX_RECORD: usize = 256 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FramedError {
    #[error("record at byte {offset}: {reason}")]
    Bad { offset: usize, reason: String },
    #[error("record at byte {offset}: payload CRC32C {stored:#010x}, computed {computed:#010x}")]
    Crc {
        offset: usize,
        stored: u32,
        computed: u32,
    },
}

/// One record's place and meaning in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub trigger_number: u32,
    /// Byte range of the payload in the file.
    pub payload: std::ops::Range<usize>,
    /// Byte offset of the record header.
    pub offset: usize,
}

pub fn encode(trigger_number: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(RECORD_HEADER_LEN + payload.len());
    v.extend_from_slice(&RECORD_MAGIC);
    v.extend_from_slice(&1u16.to_le_bytes());
    v.extend_from_slice(&0u16.to_le_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(&trigger_number.to_le_bytes());
    v.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    let h = crc32c::crc32c(&v[..20]);
    v.extend_from_slice(&h.to_le_bytes());
    v.extend_from_slice(payload);
    v
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Reads the record at `offset`. A record whose header is damaged cannot be skipped (its
/// length is not trusted): that is an error for the rest of the file. A payload CRC error is
/// reported separately (`Ok((record, Some(error)))`), so the caller can drop just that record.
pub fn read_at(data: &[u8], offset: usize) -> Result<(Record, Option<FramedError>), FramedError> {
    let bad = |reason: &str| FramedError::Bad {
        offset,
        reason: reason.to_string(),
    };
    let h = data
        .get(offset..offset + RECORD_HEADER_LEN)
        .ok_or_else(|| bad("truncated header"))?;
    if h[0..4] != RECORD_MAGIC {
        return Err(bad("bad magic (expected \"EVFR\")"));
    }
    if u32_at(h, 20) != crc32c::crc32c(&h[..20]) {
        return Err(bad("header checksum mismatch"));
    }
    if h[4..6] != 1u16.to_le_bytes() {
        return Err(bad("unsupported version"));
    }
    if h[6..8] != [0, 0] {
        return Err(bad("non-zero flags"));
    }
    let len = u32_at(h, 8) as usize;
    if len > MAX_RECORD {
        return Err(bad("payload larger than 256 MiB"));
    }
    let start = offset + RECORD_HEADER_LEN;
    let payload = data
        .get(start..start + len)
        .ok_or_else(|| bad("truncated payload"))?;
    let stored = u32_at(h, 16);
    let computed = crc32c::crc32c(payload);
    let crc = (stored != computed).then_some(FramedError::Crc {
        offset,
        stored,
        computed,
    });
    Ok((
        Record {
            trigger_number: u32_at(h, 12),
            payload: start..start + len,
            offset,
        },
        crc,
    ))
}

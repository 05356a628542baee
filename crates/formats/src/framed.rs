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

/// What a record header says, once every field of it is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub payload_len: usize,
    pub trigger_number: u32,
    pub payload_crc: u32,
}

/// Checks a record header (magic, header checksum, version, flags, length); `offset` is where
/// it lies, for the error. Its length can be trusted only after this.
pub fn read_header(h: &[u8], offset: usize) -> Result<RecordHeader, FramedError> {
    let bad = |reason: &str| FramedError::Bad {
        offset,
        reason: reason.to_string(),
    };
    let h = h
        .get(..RECORD_HEADER_LEN)
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
    let payload_len = u32_at(h, 8) as usize;
    if payload_len > MAX_RECORD {
        return Err(bad("payload larger than 256 MiB"));
    }
    Ok(RecordHeader {
        payload_len,
        trigger_number: u32_at(h, 12),
        payload_crc: u32_at(h, 16),
    })
}

/// The payload CRC error of a record, if its payload does not match its header.
pub fn check_payload(h: &RecordHeader, payload: &[u8], offset: usize) -> Option<FramedError> {
    let computed = crc32c::crc32c(payload);
    (h.payload_crc != computed).then_some(FramedError::Crc {
        offset,
        stored: h.payload_crc,
        computed,
    })
}

/// Reads the record at `offset`. A record whose header is damaged cannot be skipped (its
/// length is not trusted): that is an error for the rest of the file. A payload CRC error is
/// reported separately (`Ok((record, Some(error)))`), so the caller can drop just that record.
pub fn read_at(data: &[u8], offset: usize) -> Result<(Record, Option<FramedError>), FramedError> {
    let h = read_header(data.get(offset..).unwrap_or(&[]), offset)?;
    let start = offset + RECORD_HEADER_LEN;
    let payload = data
        .get(start..start + h.payload_len)
        .ok_or_else(|| FramedError::Bad {
            offset,
            reason: "truncated payload".into(),
        })?;
    let crc = check_payload(&h, payload, offset);
    Ok((
        Record {
            trigger_number: h.trigger_number,
            payload: start..start + h.payload_len,
            offset,
        },
        crc,
    ))
}

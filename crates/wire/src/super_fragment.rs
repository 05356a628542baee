//! The super-fragment: one RU's fragment of an event made from the fragments of its k
//! front-end streams (CMS: the FEDs read by one RU). It travels as the payload of a fragment
//! flagged [`crate::FLAG_SUPER`]: a directory, then the stream fragments back to back.
//!
//! Layout, little-endian (docs/formats.md §4):
//! magic "EVSF" | version u16 (1) | entries k u16 | k × entry | k fragments in entry order.
//! Entry, 16 bytes: source id u16 | flags u16 | trigger number u32 | length u32 | reserved u32.

use crate::bytes::{need, u16_at, u32_at};
use crate::error::{Result, WireError};

pub const SUPER_MAGIC: [u8; 4] = *b"EVSF";
pub const SUPER_VERSION: u16 = 1;
pub const SUPER_HEADER_LEN: usize = 8;
pub const SUPER_ENTRY_LEN: usize = 16;
/// Most streams in one super-fragment.
pub const MAX_SUPER_ENTRIES: usize = 1024;
/// Entry flag: this stream's fragment was bad and is left out (length 0), under
/// `source.on_error = "drop"`.
pub const ENTRY_MISSING: u16 = 0x0001;
/// Entry flag: this stream's trigger number differs from the first stream's (sync loss),
/// kept under `source.on_sync_loss = "flag"`.
pub const ENTRY_SYNC_LOSS: u16 = 0x0002;
const KNOWN_ENTRY_FLAGS: u16 = ENTRY_MISSING | ENTRY_SYNC_LOSS;

/// What the directory says about one stream's fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SuperEntry {
    pub source_id: u16,
    pub flags: u16,
    pub trigger_number: u32,
    pub length: u32,
}

/// Bytes of the magic, version, count and a directory of `k` entries.
pub fn directory_len(k: usize) -> usize {
    SUPER_HEADER_LEN + k * SUPER_ENTRY_LEN
}

/// Appends the header and directory for `entries` (the fragments follow, in this order).
pub fn encode_directory(entries: &[SuperEntry], out: &mut Vec<u8>) {
    out.extend_from_slice(&SUPER_MAGIC);
    out.extend_from_slice(&SUPER_VERSION.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    for e in entries {
        out.extend_from_slice(&e.source_id.to_le_bytes());
        out.extend_from_slice(&e.flags.to_le_bytes());
        out.extend_from_slice(&e.trigger_number.to_le_bytes());
        out.extend_from_slice(&e.length.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
    }
}

/// How many bytes the directory of the super-fragment starting with `head` takes (read from
/// its first 8 bytes), so a reader knows how much to gather before [`decode_directory`].
pub fn directory_len_of(head: &[u8]) -> Result<usize> {
    need("super-fragment header", head, SUPER_HEADER_LEN)?;
    if head[0..4] != SUPER_MAGIC {
        return Err(WireError::OutOfRange {
            what: "super-fragment magic",
            value: u32_at(head, 0) as u64,
        });
    }
    let version = u16_at(head, 4);
    if version != SUPER_VERSION {
        return Err(WireError::UnsupportedVersion {
            got: version,
            supported: SUPER_VERSION,
        });
    }
    let k = u16_at(head, 6) as usize;
    if k == 0 || k > MAX_SUPER_ENTRIES {
        return Err(WireError::OutOfRange {
            what: "super-fragment entries",
            value: k as u64,
        });
    }
    Ok(directory_len(k))
}

/// Reads and checks the directory of a super-fragment whose payload is `payload_len` bytes
/// and starts with `head` (at least the directory): magic, version, entry count, flags,
/// reserved words, and that the lengths add up to exactly the payload.
pub fn decode_directory(head: &[u8], payload_len: usize) -> Result<Vec<SuperEntry>> {
    let dir = directory_len_of(head)?;
    need("super-fragment directory", head, dir)?;
    let k = (dir - SUPER_HEADER_LEN) / SUPER_ENTRY_LEN;
    let mut entries = Vec::with_capacity(k);
    let mut total = dir as u64;
    for i in 0..k {
        let at = SUPER_HEADER_LEN + i * SUPER_ENTRY_LEN;
        let e = SuperEntry {
            source_id: u16_at(head, at),
            flags: u16_at(head, at + 2),
            trigger_number: u32_at(head, at + 4),
            length: u32_at(head, at + 8),
        };
        if e.flags & !KNOWN_ENTRY_FLAGS != 0 {
            return Err(WireError::OutOfRange {
                what: "super-fragment entry flags",
                value: e.flags as u64,
            });
        }
        if u32_at(head, at + 12) != 0 {
            return Err(WireError::ReservedNonZero {
                what: "super-fragment entry",
            });
        }
        total += e.length as u64;
        entries.push(e);
    }
    if total != payload_len as u64 {
        return Err(WireError::BadLength {
            what: "super-fragment (directory and entry lengths)",
            expected: payload_len,
            got: total.min(usize::MAX as u64) as usize,
        });
    }
    Ok(entries)
}

/// A whole super-fragment's entries, each with its fragment's bytes (the directory checked
/// as [`decode_directory`] does).
pub fn split(payload: &[u8]) -> Result<Vec<(SuperEntry, &[u8])>> {
    let entries = decode_directory(payload, payload.len())?;
    let mut at = directory_len(entries.len());
    Ok(entries
        .into_iter()
        .map(|e| {
            let part = &payload[at..at + e.length as usize];
            at += e.length as usize;
            (e, part)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Vec<SuperEntry>, Vec<u8>) {
        let entries = vec![
            SuperEntry {
                source_id: 841,
                flags: 0,
                trigger_number: 7,
                length: 16,
            },
            SuperEntry {
                source_id: 843,
                flags: ENTRY_SYNC_LOSS,
                trigger_number: 9,
                length: 24,
            },
        ];
        let mut b = Vec::new();
        encode_directory(&entries, &mut b);
        b.extend_from_slice(&[0xab; 40]);
        (entries, b)
    }

    #[test]
    fn a_directory_reads_back() {
        let (entries, b) = sample();
        assert_eq!(directory_len_of(&b).unwrap(), 40);
        assert_eq!(decode_directory(&b, b.len()).unwrap(), entries);
    }

    #[test]
    fn damaged_directories_are_refused() {
        let (_, b) = sample();
        assert!(
            decode_directory(&b, b.len() + 1).is_err(),
            "lengths must add up"
        );
        assert!(decode_directory(&b[..20], b.len()).is_err(), "truncated");
        for (at, v) in [(0, b'X'), (4, 2), (6, 0), (10, 0x80), (20, 1)] {
            let mut d = b.clone();
            d[at] = v;
            assert!(decode_directory(&d, d.len()).is_err(), "byte {at} = {v}");
        }
        // any bytes: an error or a directory, never a panic
        for n in 0..64 {
            let junk: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            let _ = decode_directory(&junk, n);
        }
    }
}

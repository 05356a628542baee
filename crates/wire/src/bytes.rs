//! Little-endian field access with bounds checks that turn into `WireError::Truncated`.

use crate::error::{Result, WireError};

pub(crate) fn need(what: &'static str, buf: &[u8], n: usize) -> Result<()> {
    if buf.len() < n {
        Err(WireError::Truncated {
            what,
            need: n,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

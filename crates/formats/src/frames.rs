//! Timestamped frames on a front-end's stream (`source.format = "frames"`, docs/formats.md
//! §9): each frame is an 8-byte prefix (magic "EVTF", the frame's length u32) and the frame
//! itself, a 24-byte time frame header (docs/protocol.md §10.1) and its payload. The length
//! is the prefix's because the frame header has none: inside a window fragment the
//! directory gives it.

use evb_wire::window::{TimeFrameHeader, TIME_FRAME_HEADER_LEN};

pub const FRAME_MAGIC: [u8; 4] = *b"EVTF";
pub const FRAME_PREFIX_LEN: usize = 8;

/// One frame as a front-end sends it: prefix, header (its CRC computed here) and payload.
pub fn encode(begin: u64, end: u64, source_id: u16, flags: u16, payload: &[u8]) -> Vec<u8> {
    let mut h = TimeFrameHeader {
        begin,
        end,
        source_id,
        flags,
        crc: 0,
    };
    h.crc = h.crc_of([payload]);
    let len = (TIME_FRAME_HEADER_LEN + payload.len()) as u32;
    let mut v = Vec::with_capacity(FRAME_PREFIX_LEN + len as usize);
    v.extend_from_slice(&FRAME_MAGIC);
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(&h.encode());
    v.extend_from_slice(payload);
    v
}

/// The frame's length from its prefix, or why the prefix is not one.
pub fn read_prefix(b: &[u8; FRAME_PREFIX_LEN]) -> Result<usize, String> {
    if b[..4] != FRAME_MAGIC {
        return Err(format!(
            "no frame prefix (magic {:02x?}, not \"EVTF\")",
            &b[..4]
        ));
    }
    let len = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) as usize;
    if len < TIME_FRAME_HEADER_LEN {
        return Err(format!(
            "frame length {len}, shorter than its {TIME_FRAME_HEADER_LEN}-byte header"
        ));
    }
    Ok(len)
}

/// Checks a whole frame (header and payload): its range, flags and CRC.
pub fn check(frame: &[u8]) -> Result<TimeFrameHeader, String> {
    let h = TimeFrameHeader::decode(frame).map_err(|e| e.to_string())?;
    let crc = h.crc_of([&frame[TIME_FRAME_HEADER_LEN..]]);
    if crc != h.crc {
        return Err(format!(
            "frame [{}, {}) CRC32C {:#010x}, computed {crc:#010x}",
            h.begin, h.end, h.crc
        ));
    }
    Ok(h)
}

/// Splits a file of frames (prefixed, back to back) into whole frames with their prefixes;
/// the reason at the first byte that is not one.
pub fn split(data: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let Some(p) = data.get(at..at + FRAME_PREFIX_LEN) else {
            return Err(format!("at byte {at}: a frame prefix cut short"));
        };
        let len = read_prefix(p.try_into().expect("8 bytes"))
            .map_err(|e| format!("at byte {at}: {e}"))?;
        let total = FRAME_PREFIX_LEN + len;
        let Some(f) = data.get(at..at + total) else {
            return Err(format!("at byte {at}: a frame of {len} bytes cut short"));
        };
        check(&f[FRAME_PREFIX_LEN..]).map_err(|e| format!("at byte {at}: {e}"))?;
        out.push(f);
        at += total;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_reads_back_and_any_damage_is_named() {
        let f = encode(1000, 2000, 7, 0, b"payload bytes");
        let frames = split(&f).unwrap();
        assert_eq!(frames, vec![&f[..]]);
        let h = check(&f[FRAME_PREFIX_LEN..]).unwrap();
        assert_eq!((h.begin, h.end, h.source_id), (1000, 2000, 7));
        for i in 0..f.len() {
            for bit in 0..8 {
                let mut bad = f.clone();
                bad[i] ^= 1 << bit;
                assert!(split(&bad).is_err(), "byte {i} bit {bit} went unnoticed");
            }
        }
        for cut in 1..f.len() {
            assert!(split(&f[..cut]).is_err(), "cut at {cut}");
        }
    }
}

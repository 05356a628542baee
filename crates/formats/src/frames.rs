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

/// Why bytes on a stream, or in a file, are not a frame (docs/formats.md §9).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("no frame prefix (magic {0:02x?}, not \"EVTF\")")]
    Magic([u8; 4]),
    #[error("frame length {0}, shorter than its {TIME_FRAME_HEADER_LEN}-byte header")]
    Short(usize),
    #[error(transparent)]
    Header(#[from] evb_wire::WireError),
    #[error("frame [{begin}, {end}) CRC32C {stored:#010x}, computed {computed:#010x}")]
    Crc {
        begin: u64,
        end: u64,
        stored: u32,
        computed: u32,
    },
    #[error("a frame prefix cut short")]
    PrefixCut,
    #[error("a frame of {0} bytes cut short")]
    Cut(usize),
    /// Any of the others, at a byte of a file of frames.
    #[error("at byte {at}: {error}")]
    At { at: usize, error: Box<FrameError> },
}

/// The frame's length from its prefix, or why the prefix is not one.
pub fn read_prefix(b: &[u8; FRAME_PREFIX_LEN]) -> Result<usize, FrameError> {
    let magic: [u8; 4] = b[..4].try_into().expect("4 bytes");
    if magic != FRAME_MAGIC {
        return Err(FrameError::Magic(magic));
    }
    let len = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) as usize;
    if len < TIME_FRAME_HEADER_LEN {
        return Err(FrameError::Short(len));
    }
    Ok(len)
}

/// Checks a whole frame (header and payload): its range, flags and CRC.
pub fn check(frame: &[u8]) -> Result<TimeFrameHeader, FrameError> {
    let h = TimeFrameHeader::decode(frame)?;
    let computed = h.crc_of([&frame[TIME_FRAME_HEADER_LEN..]]);
    if computed != h.crc {
        return Err(FrameError::Crc {
            begin: h.begin,
            end: h.end,
            stored: h.crc,
            computed,
        });
    }
    Ok(h)
}

/// Splits a file of frames (prefixed, back to back) into whole frames with their prefixes;
/// the reason at the first byte that is not one.
pub fn split(data: &[u8]) -> Result<Vec<&[u8]>, FrameError> {
    let at_byte = |at: usize| {
        move |e: FrameError| FrameError::At {
            at,
            error: Box::new(e),
        }
    };
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let Some(p) = data.get(at..at + FRAME_PREFIX_LEN) else {
            return Err(at_byte(at)(FrameError::PrefixCut));
        };
        let len = read_prefix(p.try_into().expect("8 bytes")).map_err(at_byte(at))?;
        let total = FRAME_PREFIX_LEN + len;
        let Some(f) = data.get(at..at + total) else {
            return Err(at_byte(at)(FrameError::Cut(len)));
        };
        check(&f[FRAME_PREFIX_LEN..]).map_err(at_byte(at))?;
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
        // typed: the caller can tell a damaged frame from a stream that is not frames
        let mut bad = f.clone();
        bad[FRAME_PREFIX_LEN + 30] ^= 1;
        match check(&bad[FRAME_PREFIX_LEN..]) {
            Err(FrameError::Crc {
                begin: 1000,
                end: 2000,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let mut twice = f.clone();
        twice.extend_from_slice(b"EVTX\0\0\0\0");
        let e = split(&twice).unwrap_err();
        assert!(
            matches!(&e, FrameError::At { at, error } if *at == f.len() && matches!(**error, FrameError::Magic(_))),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with(&format!("at byte {}: no frame prefix", f.len())),
            "{e}"
        );
    }
}

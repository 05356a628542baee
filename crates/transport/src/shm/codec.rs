//! The `shm` transport's packets as bytes: how they are written, and how what a peer sends
//! (hostile input) is read into typed values or a typed [`PacketError`], never a panic.
//! No sockets, no shared memory: public so that the fuzz target can feed it anything.
//!
//! Packets (at most [`MAX_PACKET`] bytes), little-endian: FRAME = tag 1 · frame type u8 ·
//! flags u16 (bit 0, [`MORE`]: more packets of this frame follow) · count u32 · sequence u64
//! · segments u32, then per segment either 0 · length u32 · bytes (inline) or 1 · pool u64 ·
//! offset u64 · length u32 · token u32 (descriptor). POOL = tag 2 · 0×7 · pool u64 · bytes
//! u64. RETURN = tag 3 · 0×3 · n u32 · n tokens u32. RING = tag 4 · 0×7 · capacity u64.
//! DOORBELL = tag 5 · 0×7.

use evb_wire::{FrameType, WireError};
use thiserror::Error;

use crate::tcp::HANDSHAKE_FRAME_MAX;

/// Largest packet, on the socket or in a ring.
pub const MAX_PACKET: usize = 64 * 1024;
/// Bytes of a FRAME packet before its segments.
pub const FRAME_HEAD: usize = 20;
/// FRAME flag: the frame continues in the next packet.
pub const MORE: u16 = 1;
pub const TAG_FRAME: u8 = 1;
pub const TAG_POOL: u8 = 2;
pub const TAG_RETURN: u8 = 3;
pub const TAG_RING: u8 = 4;
pub const TAG_DOORBELL: u8 = 5;
/// Bytes of an inline segment before its data.
pub const INLINE_HEAD: usize = 5;
/// Bytes of a descriptor segment.
pub const DESC_LEN: usize = 25;
/// Tokens that fit one RETURN packet.
pub const RETURN_MAX: usize = (MAX_PACKET - 8) / 4;
/// A DOORBELL packet.
pub const DOORBELL: [u8; 8] = [TAG_DOORBELL, 0, 0, 0, 0, 0, 0, 0];

/// Why a packet is not one this transport accepts. The text is what the connection's close
/// reason says.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PacketError {
    #[error("empty packet")]
    Empty,
    #[error("unknown packet tag {0}")]
    UnknownTag(u8),
    #[error("short frame packet")]
    ShortFrame,
    #[error("frame packet: {0}")]
    FrameType(WireError),
    #[error("unknown frame packet flags {0:#x}")]
    FrameFlags(u16),
    #[error("short segment")]
    ShortSegment,
    #[error("short descriptor")]
    ShortDescriptor,
    #[error("bad segment tag {0}")]
    SegmentTag(u8),
    #[error("frame packet shorter than its segments")]
    FewerSegments,
    #[error("frame packet longer than its segments")]
    MoreBytes,
    #[error("handshake frame split over packets")]
    HandshakeSplit,
    #[error("handshake frame with a descriptor")]
    HandshakeDescriptor,
    #[error("handshake frame larger than {0} bytes")]
    HandshakeTooLarge(u32),
    #[error("handshake packet longer than its segments")]
    HandshakeMoreBytes,
    #[error("short pool packet")]
    ShortPool,
    #[error("short return packet")]
    ShortReturn,
    #[error("malformed ring packet")]
    MalformedRing,
}

/// Little-endian u32 at `at` in a packet, if the packet holds it.
fn le_u32(p: &[u8], at: usize) -> Option<u32> {
    let b = p.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Little-endian u64 at `at` in a packet, if the packet holds it.
fn le_u64(p: &[u8], at: usize) -> Option<u64> {
    let b = p.get(at..at.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Some(u64::from_le_bytes(a))
}

/// A FRAME packet's fixed part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    pub frame_type: FrameType,
    /// More packets of this frame follow.
    pub more: bool,
    pub count: u32,
    pub sequence: u64,
    /// Segments in this packet.
    pub segments: u32,
}

impl FrameHead {
    /// Reads the fixed part of a FRAME packet (its tag is not looked at).
    pub fn decode(p: &[u8]) -> Result<FrameHead, PacketError> {
        let head = p.get(..FRAME_HEAD).ok_or(PacketError::ShortFrame)?;
        let frame_type = FrameType::from_u8(head[1]).map_err(PacketError::FrameType)?;
        let flags = u16::from_le_bytes([head[2], head[3]]);
        let count = le_u32(head, 4).ok_or(PacketError::ShortFrame)?;
        let sequence = le_u64(head, 8).ok_or(PacketError::ShortFrame)?;
        let segments = le_u32(head, 16).ok_or(PacketError::ShortFrame)?;
        if flags & !MORE != 0 {
            return Err(PacketError::FrameFlags(flags));
        }
        Ok(FrameHead {
            frame_type,
            more: flags & MORE != 0,
            count,
            sequence,
            segments,
        })
    }

    /// Appends the fixed part of a FRAME packet to `pkt`.
    pub fn encode_into(&self, pkt: &mut Vec<u8>) {
        let flags = if self.more { MORE } else { 0 };
        pkt.push(TAG_FRAME);
        pkt.push(self.frame_type as u8);
        pkt.extend_from_slice(&flags.to_le_bytes());
        pkt.extend_from_slice(&self.count.to_le_bytes());
        pkt.extend_from_slice(&self.sequence.to_le_bytes());
        pkt.extend_from_slice(&self.segments.to_le_bytes());
    }
}

/// Rewrites the segment count of the FRAME packet `pkt` (its head already written).
pub fn set_segments(pkt: &mut [u8], segments: u32) {
    pkt[FRAME_HEAD - 4..FRAME_HEAD].copy_from_slice(&segments.to_le_bytes());
}

/// Marks the FRAME packet `pkt` (its head already written) as followed by more of its frame.
pub fn set_more(pkt: &mut [u8]) {
    pkt[2..4].copy_from_slice(&MORE.to_le_bytes());
}

/// A slice of the sender's shared pool, named by a descriptor segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desc {
    pub pool: u64,
    pub offset: u64,
    pub len: u32,
    /// Sent back in a RETURN packet when the receiver is done with the slice.
    pub token: u32,
}

/// One segment of a FRAME packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seg<'a> {
    Inline(&'a [u8]),
    Desc(Desc),
}

impl<'a> Seg<'a> {
    /// The segment that starts at byte `at` of the FRAME packet `p`.
    pub fn decode(p: &'a [u8], at: usize) -> Result<Seg<'a>, PacketError> {
        match p.get(at) {
            Some(0) => {
                let len = le_u32(p, at + 1).ok_or(PacketError::ShortSegment)? as usize;
                let start = at + INLINE_HEAD;
                let bytes = start
                    .checked_add(len)
                    .and_then(|end| p.get(start..end))
                    .ok_or(PacketError::ShortSegment)?;
                Ok(Seg::Inline(bytes))
            }
            Some(1) => {
                let short = PacketError::ShortDescriptor;
                Ok(Seg::Desc(Desc {
                    pool: le_u64(p, at + 1).ok_or(short.clone())?,
                    offset: le_u64(p, at + 9).ok_or(short.clone())?,
                    len: le_u32(p, at + 17).ok_or(short.clone())?,
                    token: le_u32(p, at + 21).ok_or(short)?,
                }))
            }
            Some(&t) => Err(PacketError::SegmentTag(t)),
            None => Err(PacketError::FewerSegments),
        }
    }

    /// Its size in the packet.
    pub fn wire_len(&self) -> usize {
        match self {
            Seg::Inline(b) => INLINE_HEAD + b.len(),
            Seg::Desc(_) => DESC_LEN,
        }
    }

    /// Appends it to a FRAME packet.
    pub fn encode_into(&self, pkt: &mut Vec<u8>) {
        match self {
            Seg::Inline(bytes) => {
                pkt.push(0);
                pkt.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                pkt.extend_from_slice(bytes);
            }
            Seg::Desc(d) => {
                pkt.push(1);
                pkt.extend_from_slice(&d.pool.to_le_bytes());
                pkt.extend_from_slice(&d.offset.to_le_bytes());
                pkt.extend_from_slice(&d.len.to_le_bytes());
                pkt.extend_from_slice(&d.token.to_le_bytes());
            }
        }
    }
}

/// The payload of a handshake frame's packet `p` (head `head`): inline segments only, in
/// one packet, at most `HANDSHAKE_FRAME_MAX` bytes.
pub fn handshake_payload(p: &[u8], head: &FrameHead) -> Result<Vec<u8>, PacketError> {
    if head.more {
        return Err(PacketError::HandshakeSplit);
    }
    let mut payload = Vec::new();
    let mut at = FRAME_HEAD;
    for _ in 0..head.segments {
        if p.get(at) != Some(&0) {
            return Err(PacketError::HandshakeDescriptor);
        }
        let len = le_u32(p, at + 1).ok_or(PacketError::ShortSegment)? as usize;
        if payload.len() + len > HANDSHAKE_FRAME_MAX as usize {
            return Err(PacketError::HandshakeTooLarge(HANDSHAKE_FRAME_MAX));
        }
        let start = at + INLINE_HEAD;
        let bytes = p.get(start..start + len).ok_or(PacketError::ShortSegment)?;
        payload.extend_from_slice(bytes);
        at = start + len;
    }
    if at != p.len() {
        return Err(PacketError::HandshakeMoreBytes);
    }
    Ok(payload)
}

/// The tokens of a RETURN packet.
#[derive(Debug, Clone)]
pub struct Tokens<'a>(std::slice::ChunksExact<'a, u8>);

impl Iterator for Tokens<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        self.0
            .next()
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// A packet other than FRAME (those travel on the socket only; the memfds of POOL and RING
/// come beside them).
#[derive(Debug, Clone)]
pub enum Control<'a> {
    /// A shared pool of ours, `len` bytes, named `id` in descriptors.
    Pool { id: u64, len: u64 },
    /// Slices the peer is done with.
    Return(Tokens<'a>),
    /// The ring the peer writes its FRAME packets to, of `capacity` data bytes.
    Ring { capacity: u64 },
    /// The peer's ring has data, or room.
    Doorbell,
}

impl<'a> Control<'a> {
    /// Reads a control packet; a FRAME packet is an unknown tag here.
    pub fn decode(p: &'a [u8]) -> Result<Control<'a>, PacketError> {
        match p.first() {
            Some(&TAG_POOL) => {
                let id = le_u64(p, 8).ok_or(PacketError::ShortPool)?;
                let len = le_u64(p, 16).ok_or(PacketError::ShortPool)?;
                Ok(Control::Pool { id, len })
            }
            Some(&TAG_RING) => {
                if p.len() != 16 || p[1..8].iter().any(|&b| b != 0) {
                    return Err(PacketError::MalformedRing);
                }
                let capacity = le_u64(p, 8).ok_or(PacketError::MalformedRing)?;
                Ok(Control::Ring { capacity })
            }
            Some(&TAG_DOORBELL) => Ok(Control::Doorbell),
            Some(&TAG_RETURN) => {
                let n = le_u32(p, 4).ok_or(PacketError::ShortReturn)? as usize;
                let tokens = n
                    .checked_mul(4)
                    .and_then(|b| p.get(8..8usize.checked_add(b)?))
                    .ok_or(PacketError::ShortReturn)?;
                Ok(Control::Return(Tokens(tokens.chunks_exact(4))))
            }
            Some(&t) => Err(PacketError::UnknownTag(t)),
            None => Err(PacketError::Empty),
        }
    }
}

/// A POOL packet (the pool's memfd goes beside it).
pub fn pool_packet(id: u64, len: u64) -> Vec<u8> {
    let mut p = vec![TAG_POOL, 0, 0, 0, 0, 0, 0, 0];
    p.extend_from_slice(&id.to_le_bytes());
    p.extend_from_slice(&len.to_le_bytes());
    p
}

/// A RING packet (the ring's memfd goes beside it).
pub fn ring_packet(capacity: u64) -> Vec<u8> {
    let mut p = vec![TAG_RING, 0, 0, 0, 0, 0, 0, 0];
    p.extend_from_slice(&capacity.to_le_bytes());
    p
}

/// A RETURN packet of at most [`RETURN_MAX`] tokens.
pub fn return_packet(tokens: &[u32]) -> Vec<u8> {
    let mut p = vec![TAG_RETURN, 0, 0, 0];
    p.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    for t in tokens {
        p.extend_from_slice(&t.to_le_bytes());
    }
    p
}

/// A whole packet, read as the transport reads it (for tests and the fuzz target).
#[derive(Debug, Clone)]
pub enum Packet<'a> {
    Frame {
        head: FrameHead,
        segments: Vec<Seg<'a>>,
    },
    Control(Control<'a>),
}

impl<'a> Packet<'a> {
    /// Reads a packet: for a FRAME, its head and every segment, which must end exactly at
    /// the packet's end.
    pub fn decode(p: &'a [u8]) -> Result<Packet<'a>, PacketError> {
        if p.first() != Some(&TAG_FRAME) {
            return Control::decode(p).map(Packet::Control);
        }
        let head = FrameHead::decode(p)?;
        let mut segments = Vec::new();
        let mut at = FRAME_HEAD;
        for _ in 0..head.segments {
            let seg = Seg::decode(p, at)?;
            at += seg.wire_len();
            segments.push(seg);
        }
        if at != p.len() {
            return Err(PacketError::MoreBytes);
        }
        Ok(Packet::Frame { head, segments })
    }

    /// Writes it again: the bytes it was read from (a RING packet's or POOL packet's padding
    /// as zeros, RETURN's too).
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Packet::Frame { head, segments } => {
                let mut p = Vec::new();
                head.encode_into(&mut p);
                for s in segments {
                    s.encode_into(&mut p);
                }
                p
            }
            Packet::Control(Control::Pool { id, len }) => pool_packet(*id, *len),
            Packet::Control(Control::Ring { capacity }) => ring_packet(*capacity),
            Packet::Control(Control::Return(tokens)) => {
                return_packet(&tokens.clone().collect::<Vec<_>>())
            }
            Packet::Control(Control::Doorbell) => DOORBELL.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(segments: &[Seg<'_>], more: bool) -> Vec<u8> {
        let mut p = Vec::new();
        FrameHead {
            frame_type: FrameType::Messages,
            more,
            count: 2,
            sequence: 9,
            segments: segments.len() as u32,
        }
        .encode_into(&mut p);
        for s in segments {
            s.encode_into(&mut p);
        }
        p
    }

    #[test]
    fn frame_packets_read_back_as_written() {
        let d = Desc {
            pool: 3,
            offset: 4096,
            len: 100,
            token: 7,
        };
        let p = frame(&[Seg::Inline(b"abc"), Seg::Desc(d), Seg::Inline(b"")], true);
        let Packet::Frame { head, segments } = Packet::decode(&p).unwrap() else {
            panic!("not a frame")
        };
        assert!(head.more);
        assert_eq!((head.count, head.sequence, head.segments), (2, 9, 3));
        assert_eq!(
            segments,
            vec![Seg::Inline(b"abc"), Seg::Desc(d), Seg::Inline(b"")]
        );
        assert_eq!(Packet::decode(&p).unwrap().encode(), p);
    }

    #[test]
    fn every_cut_of_a_packet_is_an_error() {
        let d = Desc {
            pool: 1,
            offset: 0,
            len: 1,
            token: 0,
        };
        let p = frame(&[Seg::Inline(b"xyz"), Seg::Desc(d)], false);
        for n in 0..p.len() {
            assert!(Packet::decode(&p[..n]).is_err(), "cut at {n}");
        }
        let mut long = p.clone();
        long.push(0);
        assert_eq!(Packet::decode(&long).unwrap_err(), PacketError::MoreBytes);
        for c in [
            pool_packet(5, 1 << 20),
            ring_packet(1 << 19),
            return_packet(&[1, 2, 3]),
        ] {
            for n in 1..c.len() {
                assert!(Packet::decode(&c[..n]).is_err(), "{c:?} cut at {n}");
            }
            assert_eq!(Packet::decode(&c).unwrap().encode(), c);
        }
    }

    #[test]
    fn hostile_fields_are_typed_errors() {
        let mut p = frame(&[], false);
        p[2] = 2;
        assert_eq!(Packet::decode(&p).unwrap_err(), PacketError::FrameFlags(2));
        let mut p = frame(&[], false);
        p[1] = 0xee;
        assert!(matches!(
            Packet::decode(&p).unwrap_err(),
            PacketError::FrameType(_)
        ));
        let mut p = frame(&[Seg::Inline(b"a")], false);
        p[FRAME_HEAD] = 9;
        assert_eq!(Packet::decode(&p).unwrap_err(), PacketError::SegmentTag(9));
        // an inline length near u32::MAX
        let mut p = frame(&[Seg::Inline(b"a")], false);
        p[FRAME_HEAD + 1..FRAME_HEAD + 5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Packet::decode(&p).unwrap_err(), PacketError::ShortSegment);
        // more segments announced than there are
        let mut p = frame(&[], false);
        set_segments(&mut p, u32::MAX);
        assert_eq!(Packet::decode(&p).unwrap_err(), PacketError::FewerSegments);
        // a RETURN count whose bytes would overflow
        let mut r = return_packet(&[1]);
        r[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Packet::decode(&r).unwrap_err(), PacketError::ShortReturn);
        let mut ring = ring_packet(8);
        ring[3] = 1;
        assert_eq!(
            Packet::decode(&ring).unwrap_err(),
            PacketError::MalformedRing
        );
        assert_eq!(Packet::decode(&[]).unwrap_err(), PacketError::Empty);
        assert_eq!(
            Packet::decode(&[77]).unwrap_err(),
            PacketError::UnknownTag(77)
        );
    }

    #[test]
    fn handshake_payloads_are_small_inline_and_whole() {
        let p = frame(&[Seg::Inline(b"he"), Seg::Inline(b"llo")], false);
        let head = FrameHead::decode(&p).unwrap();
        assert_eq!(handshake_payload(&p, &head).unwrap(), b"hello");
        let split = frame(&[Seg::Inline(b"x")], true);
        let head = FrameHead::decode(&split).unwrap();
        assert_eq!(
            handshake_payload(&split, &head),
            Err(PacketError::HandshakeSplit)
        );
        let d = Desc {
            pool: 1,
            offset: 0,
            len: 1,
            token: 0,
        };
        let p = frame(&[Seg::Desc(d)], false);
        let head = FrameHead::decode(&p).unwrap();
        assert_eq!(
            handshake_payload(&p, &head),
            Err(PacketError::HandshakeDescriptor)
        );
        let big = vec![0u8; HANDSHAKE_FRAME_MAX as usize + 1];
        let p = frame(&[Seg::Inline(&big)], false);
        let head = FrameHead::decode(&p).unwrap();
        assert_eq!(
            handshake_payload(&p, &head),
            Err(PacketError::HandshakeTooLarge(HANDSHAKE_FRAME_MAX))
        );
        let mut p = frame(&[Seg::Inline(b"x")], false);
        p.push(1);
        let head = FrameHead::decode(&p).unwrap();
        assert_eq!(
            handshake_payload(&p, &head),
            Err(PacketError::HandshakeMoreBytes)
        );
    }
}

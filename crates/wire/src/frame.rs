//! The frame: the unit every transport moves. A fixed 24-byte header, then `length` bytes.

use crate::bytes::{need, u16_at, u32_at, u64_at};
use crate::error::{Result, WireError};

/// "EVBF" read as a little-endian u32.
pub const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"EVBF");
/// The protocol version this build speaks (frame header and handshake). Version 2 (issue 66):
/// the Assign carries the BU's incarnation, Term and Fence exist and the Term is required;
/// docs/protocol.md, "Compatibility", says what changed in each version.
pub const PROTOCOL_VERSION: u16 = 2;

/// The oldest version whose frame header this build can still write, so that a peer of that
/// version is told why it is refused in frames it can read (the header layout is unchanged
/// since version 1).
pub const OLDEST_KNOWN_VERSION: u16 = 1;

/// Why a node refuses a peer of protocol version `got`: names both versions.
pub fn version_refusal(got: u16) -> String {
    format!(
        "protocol version {got} is not spoken here: this node speaks version {PROTOCOL_VERSION} \
         (docs/protocol.md, Compatibility)"
    )
}
pub const FRAME_HEADER_LEN: usize = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameType {
    /// First frame of a connection, from the connecting side: a [`crate::Hello`].
    Hello = 1,
    /// The accepting side's answer: a [`crate::Hello`] naming itself.
    HelloAck = 2,
    /// The accepting side refuses the connection: u16 code then a UTF-8 reason.
    Reject = 3,
    /// A page of `count` messages, each a [`crate::MessageHeader`] and its body.
    Messages = 4,
    /// Orderly close: no more frames follow.
    Bye = 5,
    /// Handshake authentication: a 32-byte HMAC-SHA256 proving knowledge of the run's secret.
    Auth = 6,
}

impl FrameType {
    pub fn from_u8(v: u8) -> Result<FrameType> {
        Ok(match v {
            1 => FrameType::Hello,
            2 => FrameType::HelloAck,
            3 => FrameType::Reject,
            4 => FrameType::Messages,
            5 => FrameType::Bye,
            6 => FrameType::Auth,
            other => return Err(WireError::UnknownFrameType(other)),
        })
    }
}

/// Frame header, 24 bytes, little-endian:
/// magic u32 | version u16 | type u8 | flags u8 | length u32 | count u32 | sequence u64
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub frame_type: FrameType,
    /// Payload bytes following the header.
    pub length: u32,
    /// Messages in a `Messages` frame; zero otherwise.
    pub count: u32,
    /// Per connection and direction, starting at 0 and incrementing by one per frame.
    pub sequence: u64,
}

impl FrameHeader {
    pub fn new(frame_type: FrameType, length: u32, count: u32, sequence: u64) -> Self {
        FrameHeader {
            frame_type,
            length,
            count,
            sequence,
        }
    }

    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        self.encode_as(PROTOCOL_VERSION)
    }

    /// The header as a peer of protocol `version` writes it: only for telling a peer of an
    /// older version why it is refused ([`version_refusal`]).
    pub fn encode_as(&self, version: u16) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&version.to_le_bytes());
        b[6] = self.frame_type as u8;
        b[7] = 0;
        b[8..12].copy_from_slice(&self.length.to_le_bytes());
        b[12..16].copy_from_slice(&self.count.to_le_bytes());
        b[16..24].copy_from_slice(&self.sequence.to_le_bytes());
        b
    }

    /// Decodes and checks a header; `max_payload` is the receiver's limit on `length`.
    pub fn decode(b: &[u8], max_payload: u32) -> Result<FrameHeader> {
        need("frame header", b, FRAME_HEADER_LEN)?;
        let magic = u32_at(b, 0);
        if magic != FRAME_MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        let version = u16_at(b, 4);
        if version != PROTOCOL_VERSION {
            return Err(WireError::UnsupportedVersion {
                got: version,
                supported: PROTOCOL_VERSION,
            });
        }
        let frame_type = FrameType::from_u8(b[6])?;
        if b[7] != 0 {
            return Err(WireError::ReservedNonZero {
                what: "frame flags",
            });
        }
        let length = u32_at(b, 8);
        if length > max_payload {
            return Err(WireError::FrameTooLarge {
                len: length as u64,
                max: max_payload as u64,
            });
        }
        let count = u32_at(b, 12);
        if frame_type != FrameType::Messages && count != 0 {
            return Err(WireError::ReservedNonZero {
                what: "frame count outside a Messages frame",
            });
        }
        Ok(FrameHeader {
            frame_type,
            length,
            count,
            sequence: u64_at(b, 16),
        })
    }
}

/// A Reject frame's payload: why the accepting side refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub code: RejectCode,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum RejectCode {
    BadHandshake = 1,
    WrongRun = 2,
    UnknownNode = 3,
    Duplicate = 4,
    Other = 99,
}

pub const MAX_REJECT_REASON: usize = 1024;

impl Reject {
    pub fn encode(&self) -> Vec<u8> {
        let reason = truncate_utf8(&self.reason, MAX_REJECT_REASON);
        let mut v = Vec::with_capacity(2 + reason.len());
        v.extend_from_slice(&(self.code as u16).to_le_bytes());
        v.extend_from_slice(reason.as_bytes());
        v
    }

    pub fn decode(b: &[u8]) -> Result<Reject> {
        need("reject", b, 2)?;
        let code = match u16_at(b, 0) {
            1 => RejectCode::BadHandshake,
            2 => RejectCode::WrongRun,
            3 => RejectCode::UnknownNode,
            4 => RejectCode::Duplicate,
            99 => RejectCode::Other,
            v => {
                return Err(WireError::OutOfRange {
                    what: "reject code",
                    value: v as u64,
                })
            }
        };
        let rest = &b[2..];
        if rest.len() > MAX_REJECT_REASON {
            return Err(WireError::TooLong {
                what: "reject reason",
                len: rest.len(),
                max: MAX_REJECT_REASON,
            });
        }
        let reason = std::str::from_utf8(rest).map_err(|_| WireError::BadUtf8 {
            what: "reject reason",
        })?;
        Ok(Reject {
            code,
            reason: reason.to_string(),
        })
    }
}

pub(crate) fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

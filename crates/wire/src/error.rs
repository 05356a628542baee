//! The one error type every decoder returns: it says exactly what was wrong with the bytes.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("{what}: truncated, need {need} bytes, have {have}")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("bad frame magic {0:#010x} (expected \"EVBF\")")]
    BadMagic(u32),
    #[error("bad consumer frame magic {0:#010x} (expected \"EVBC\")")]
    BadConsumerMagic(u32),
    #[error("unsupported protocol version {got} (this build speaks {supported})")]
    UnsupportedVersion { got: u16, supported: u16 },
    #[error("unknown frame type {0}")]
    UnknownFrameType(u8),
    #[error("unknown message type {0:#06x}")]
    UnknownMessageType(u16),
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    FrameTooLarge { len: u64, max: u64 },
    #[error("{what}: length {got} where {expected} was required")]
    BadLength {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("{what}: non-zero reserved field")]
    ReservedNonZero { what: &'static str },
    #[error("{what}: value {value} out of range")]
    OutOfRange { what: &'static str, value: u64 },
    #[error("{what}: not valid UTF-8")]
    BadUtf8 { what: &'static str },
    #[error("{what}: {len} bytes is longer than the limit of {max}")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("fragment header checksum {got:#010x}, computed {computed:#010x}")]
    HeaderChecksum { got: u32, computed: u32 },
    #[error("frame declares {declared} messages but holds {found}")]
    MessageCount { declared: u32, found: u32 },
    #[error("frame sequence {got}, expected {expected}")]
    Sequence { got: u64, expected: u64 },
}

pub type Result<T> = std::result::Result<T, WireError>;

//! Why a peer's packet is refused: the codec's [`PacketError`] for bytes that are not a
//! packet, and the rules of the connection's state for packets that are. The text is the
//! connection's close reason (`CloseReason::Violation`).

use std::io;

use thiserror::Error;

use super::codec::PacketError;
use super::ring::RingError;
use super::sys::MemfdError;

#[derive(Debug, Error)]
pub(crate) enum ShmError {
    #[error(transparent)]
    Packet(#[from] PacketError),
    #[error(transparent)]
    Ring(#[from] RingError),
    #[error("gone")]
    Gone,
    #[error("shared pool offered before the handshake completed")]
    PoolBeforeHandshake,
    #[error("pool packet without a memfd")]
    PoolWithoutFd,
    #[error("too many shared pools from one peer")]
    TooManyPools,
    #[error("pool length out of range")]
    PoolLength,
    #[error("refusing the peer's shared pool: {0}")]
    PoolRefused(MemfdError),
    #[error("cannot map the peer's pool of {len} bytes: {source}")]
    PoolMap { len: usize, source: io::Error },
    #[error("a ring offered before the handshake completed")]
    RingBeforeHandshake,
    #[error("a second RING packet")]
    SecondRing,
    #[error("ring packet without a memfd")]
    RingWithoutFd,
    #[error("frame sequence {got}, expected {expected}")]
    Sequence { got: u64, expected: u64 },
    #[error("a frame's continuation packet names another frame")]
    Continuation,
    #[error("frame larger than the limit of {0} bytes")]
    FrameTooLarge(usize),
    #[error("descriptor of an unknown pool")]
    UnknownPool,
    #[error("descriptor outside the peer's pool")]
    OutsidePool,
}

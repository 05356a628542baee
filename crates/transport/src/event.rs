//! What a transport reports.

use evb_buffers::{Chain, Slice};
use evb_wire::{FrameType, Hello, WireError};

/// A connection, unique within one transport instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// A piece of an outgoing frame: small bytes of our own, or a shared slice of a pool block
/// written straight from the pool (no copy).
#[derive(Debug, Clone)]
pub enum Segment {
    Owned(Vec<u8>),
    Shared(Slice),
}

impl Segment {
    pub fn len(&self) -> usize {
        match self {
            Segment::Owned(v) => v.len(),
            Segment::Shared(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            Segment::Owned(v) => v,
            Segment::Shared(s) => s,
        }
    }
}

/// A received frame: its payload sits in receive-pool blocks.
#[derive(Debug)]
pub struct InFrame {
    pub frame_type: FrameType,
    pub count: u32,
    pub sequence: u64,
    pub payload: Chain,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CloseReason {
    /// The peer said Bye.
    PeerClosed,
    /// We closed it.
    Local,
    /// The stream ended without a Bye (the peer process died or reset).
    Lost(String),
    /// The connection attempt failed.
    ConnectFailed(String),
    /// The peer broke the protocol; it has been disconnected.
    Protocol(WireError),
    /// The peer broke the transport's own rules (shm packets, shared memory); disconnected.
    Violation(String),
    /// The handshake was refused (by the peer or by us).
    Rejected(String),
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloseReason::PeerClosed => write!(f, "closed by peer"),
            CloseReason::Local => write!(f, "closed locally"),
            CloseReason::Lost(e) => write!(f, "connection lost: {e}"),
            CloseReason::ConnectFailed(e) => write!(f, "connect failed: {e}"),
            CloseReason::Protocol(e) => write!(f, "protocol violation: {e}"),
            CloseReason::Violation(e) => write!(f, "protocol violation: {e}"),
            CloseReason::Rejected(e) => write!(f, "handshake rejected: {e}"),
        }
    }
}

#[derive(Debug)]
pub enum Event {
    /// Our outgoing connection is open; `peer` is the acceptor's handshake.
    Connected { conn: ConnId, peer: Hello },
    /// A peer connected to us and its handshake was accepted.
    Accepted { conn: ConnId, peer: Hello },
    /// A frame arrived on an open connection.
    Frame { conn: ConnId, frame: InFrame },
    /// The connection is gone (or never opened); no more events for it.
    Closed { conn: ConnId, reason: CloseReason },
}

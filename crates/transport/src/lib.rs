//! Transports: one trait, several ways to move frames between nodes.
//!
//! A transport is connection-oriented and message-based. It moves whole frames
//! (`evb-wire`'s header plus payload), opens every connection with the handshake, hands
//! received payloads over as chains of receive-pool blocks, and reports everything that
//! happens as [`Event`]s from one `poll` call — the completion-queue shape that TCP (epoll),
//! shared memory (rings) and libfabric (CQs) can all implement. It never blocks on a send:
//! frames queue per connection, so a slow peer holds up only its own queue.

mod auth;
mod event;
mod framing;
mod handshake;
pub mod inherited;
pub mod inproc;
pub mod log_limit;
pub mod mux;
pub mod ofi;
mod readiness;
pub mod shm;
pub mod tcp;

pub use auth::{control_token, control_token_matches, random_hex};
pub use event::{CloseReason, ConnId, Event, InFrame, Segment};

use std::time::Duration;

use evb_buffers::Pool;
use evb_wire::{FrameType, Hello};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TransportError {
    #[error("io error on {addr}: {source}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    #[error("bad address {0:?}")]
    BadAddress(String),
    #[error("unknown or closed connection {0:?}")]
    NoConnection(ConnId),
    #[error("connection {0:?} is not open yet")]
    NotOpen(ConnId),
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("{0}")]
    Unavailable(String),
    #[error("handshake: {0}")]
    Handshake(#[from] evb_wire::WireError),
}

/// What every transport needs to know about its node.
#[derive(Clone, Debug)]
pub struct TransportConfig {
    /// Connections whose handshake names another run are refused.
    pub run_id: String,
    /// This node's own handshake, sent as the answer to an incoming Hello.
    pub local: Hello,
    /// Largest frame payload accepted from a peer; larger ones close the connection.
    pub max_frame: u32,
    /// Received frames land in blocks of this pool.
    pub rx_pool: Pool,
    /// Shared secret: when set, every connection must prove it (HMAC over both Hellos).
    pub secret: Option<Vec<u8>>,
}

/// Moves frames between this node and its peers. See the crate docs.
pub trait Transport: Send {
    /// Starts accepting connections on `addr`; returns the address actually bound.
    fn listen(&mut self, addr: &str) -> Result<String, TransportError>;

    /// Opens a connection to `addr` announcing `hello`. Completes later with
    /// `Event::Connected`, or `Event::Closed` if it fails.
    fn connect(&mut self, addr: &str, hello: Hello) -> Result<ConnId, TransportError>;

    /// Queues one frame made of `segments`; never blocks. Slices in the segments stay
    /// shared (no copy) until written.
    fn send(
        &mut self,
        conn: ConnId,
        frame_type: FrameType,
        count: u32,
        segments: Vec<Segment>,
    ) -> Result<(), TransportError>;

    /// Bytes queued for `conn` and not yet handed to the network.
    fn queued_bytes(&self, conn: ConnId) -> usize;

    /// Memory of this node the peer of `conn` holds: bytes sent and read in place by the
    /// peer, not yet given back (shared memory, where a slow reader pins the sender's
    /// buffers). Zero for transports that copy (their kernel buffers hold the rest).
    fn held_bytes(&self, _conn: ConnId) -> usize {
        0
    }

    /// Closes `conn` after its queued frames are written, telling the peer (`Bye`).
    fn close(&mut self, conn: ConnId);

    /// Makes progress and appends what happened to `events`; waits at most `timeout` when
    /// there is nothing to report.
    fn poll(&mut self, events: &mut Vec<Event>, timeout: Option<Duration>) -> std::io::Result<()>;

    /// How payload bytes left this node: copied, or handed over by reference (shared memory).
    fn counters(&self) -> TransportCounters {
        TransportCounters::default()
    }

    /// Writes open connections from `n` threads beside the caller's (0: none, the default):
    /// for transports that copy every byte into the kernel (tcp), where one thread's copy
    /// limits a node sending large frames to several peers. Others keep their single
    /// thread (shared memory moves descriptors, libfabric posts to the NIC) and accept any
    /// `n`. Set before connections open.
    fn set_send_threads(&mut self, _n: usize) -> Result<(), TransportError> {
        Ok(())
    }

    /// Tells the transport how many other nodes may connect to it at once, so that its
    /// limits on unfinished handshakes (tcp: [`tcp::Admission`]) never close a legitimate
    /// peer of a large topology on one host. Transports without such limits ignore it.
    fn expect_peers(&mut self, _peers: usize) {}

    /// A descriptor that becomes readable when `poll` has something to do, so that several
    /// transports can wait together (see `mux`); `None` if there is no such descriptor.
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// Called by whoever is about to block on [`Transport::wait_fd`] itself (instead of in
    /// `poll`), after a `poll` that found nothing: arms what must wake that descriptor (the
    /// shm transport's rings ask their writers for a doorbell). `false` means there is work
    /// already: poll again rather than block. The next `poll` disarms it.
    fn prepare_wait(&mut self) -> bool {
        true
    }
}

/// Payload accounting, to show where bytes are (not) copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportCounters {
    /// Bytes copied in user space to send them (into a bounce buffer).
    pub bytes_copied: u64,
    /// Bytes the peer read in place, without a copy.
    pub bytes_by_reference: u64,
}

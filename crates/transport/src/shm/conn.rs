//! One `shm` connection's state: its socket and rings, the packets waiting for them, the
//! slices lent to the peer and the peer's pools, and the frame being received.

use super::*;

/// A packet waiting for room in the socket.
pub(super) struct Out {
    pub(super) bytes: Vec<u8>,
    /// For a POOL packet: a slice of the pool, whose memfd goes with it.
    pub(super) pass: Option<Slice>,
    /// A RING packet: the memfd of our FRAME ring goes with it.
    pub(super) ring: bool,
    pub(super) payload: usize,
}

impl Out {
    pub(super) fn plain(bytes: Vec<u8>) -> Out {
        Out {
            bytes,
            pass: None,
            ring: false,
            payload: 0,
        }
    }
}

/// A FRAME packet waiting for room in our ring.
pub(super) struct RingOut {
    pub(super) bytes: Vec<u8>,
    pub(super) payload: usize,
    /// Socket packets that must be sent before it (its POOL announcements, and everything
    /// queued for the socket before it): the value of `sock_pushed` when it was queued.
    pub(super) after: u64,
}

/// A frame waiting for room in the bounce pool (and every frame after it, to keep order).
pub(super) struct Deferred {
    pub(super) frame_type: FrameType,
    pub(super) count: u32,
    pub(super) segments: Vec<Segment>,
}

pub(super) struct Conn {
    pub(super) hs: Handshake,
    /// Frames that need bounce blocks the receiver still holds.
    pub(super) deferred: VecDeque<Deferred>,
    pub(super) fd: OwnedFd,
    pub(super) name: String,
    pub(super) state: State,
    /// Packets for the socket, in order.
    pub(super) queue: VecDeque<Out>,
    /// Packets ever put in `queue`, and ever sent from it (for `RingOut::after`).
    pub(super) sock_pushed: u64,
    pub(super) sock_sent: u64,
    /// The ring we write FRAME packets to (from when the connection opens), and those
    /// waiting for room in it.
    pub(super) tx_ring: Option<ring::TxRing>,
    pub(super) ring_queue: VecDeque<RingOut>,
    /// The ring the peer writes its FRAME packets to (from its RING packet on).
    pub(super) rx_ring: Option<ring::RxRing>,
    pub(super) queued: usize,
    pub(super) writable: bool,
    pub(super) seq_out: u64,
    pub(super) seq_in: u64,
    pub(super) announced: HashSet<u64>,
    /// Slices the peer reads in place, by token, with the bytes of shared memory each holds.
    pub(super) lent: HashMap<u32, (Slice, usize)>,
    /// The sum of those bytes: shared memory this peer holds (`held_bytes`).
    pub(super) held: usize,
    pub(super) next_token: u32,
    pub(super) remotes: HashMap<u64, RemotePool>,
    pub(super) close_reason: Option<CloseReason>,
    /// FRAME packets received and not yet consumed (only while the receive pool is empty).
    pub(super) backlog: VecDeque<Vec<u8>>,
    /// The FRAME packet being consumed, and the frame it belongs to.
    pub(super) rx_pkt: Option<RxPacket>,
    pub(super) rx_frame: Option<InFrame>,
    /// The receive block inline bytes are packed into.
    pub(super) rx_block: Option<BlockWriter>,
    /// The end of the peer's stream, reported once everything before it is consumed.
    pub(super) eof: Option<CloseReason>,
    /// On the control channel: may take the receive pool's reserve.
    pub(super) control: bool,
    /// The handshake succeeded: only then may the peer's frames take receive blocks.
    pub(super) admitted: bool,
    /// An incoming connection: when it was accepted (for the handshake deadline).
    pub(super) accepted: Option<std::time::Instant>,
}

impl Conn {
    pub(super) fn push_socket(&mut self, out: Out) {
        self.queue.push_back(out);
        self.sock_pushed += 1;
    }

    /// Opens our FRAME ring: from now on FRAME packets go there, after the RING packet
    /// that tells the peer where it is. Without a ring (it could not be made), everything
    /// keeps going over the socket.
    pub(super) fn open_ring(&mut self) {
        match ring::TxRing::create() {
            Ok(r) => {
                let p = codec::ring_packet(r.capacity() as u64);
                self.tx_ring = Some(r);
                self.push_socket(Out {
                    bytes: p,
                    pass: None,
                    ring: true,
                    payload: 0,
                });
            }
            Err(e) => {
                warn!(peer = %self.name, "shm: no FRAME ring, frames go over the socket: {e}")
            }
        }
    }
}

/// A FRAME packet partly consumed: where the next segment starts, how many are left, and how
/// much of the current inline segment is already copied.
pub(super) struct RxPacket {
    pub(super) bytes: Vec<u8>,
    pub(super) at: usize,
    pub(super) left: u32,
    pub(super) more: bool,
    pub(super) copied: usize,
}

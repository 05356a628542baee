//! The `shm` transport: processes on one host. Payloads stay where they are, in shared
//! memory; only descriptors (pool, offset, length, return token) cross between processes.
//!
//! - Connections are Unix-domain SOCK_SEQPACKET sockets in the abstract namespace, named
//!   after the run and the node's configured address: nothing in the file system, nothing
//!   left in /dev/shm after a crash, and a dead peer is seen at once (end of stream).
//! - A sender's pools are memfds (`Pool::new_shared`). The first time a pool appears on a
//!   connection its memfd is passed with SCM_RIGHTS and the peer maps it read-only; from then
//!   on a slice travels as a 25-byte descriptor. The sender keeps the slice ("lent") until the
//!   receiver's last user drops it and its token comes back, so the block is reused only then.
//! - Bytes not already in shared memory (control messages, headers) travel inline when small,
//!   or are copied once into a shared bounce pool; `bytes_copied` counts them.
//! - Same-host peers are authenticated by their user id (SO_PEERCRED) instead of the HMAC
//!   handshake of the network transports.
//!
//! - Receive-pool blocks are taken only for inline bytes, packed one after the other; when the
//!   pool has no block the connection stops reading (the packets wait in the socket, the
//!   sender's queue grows) and resumes when blocks come back: back-pressure, never a close.
//!   Connections on the control channel may take the last blocks of the pool (a reserve of
//!   1/8 of it), so bulk data cannot starve control messages.
//! - A peer's memfd is mapped only if it is sealed against shrinking and growing
//!   (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL) and at least as long as announced.
//!
//! - FRAME packets go through a ring once the connection is open (`ring.rs`): each side
//!   creates a ring for the direction it sends (a sealed memfd, 512 KiB of data), passes it
//!   in a RING packet right after the handshake, and from then on writes every FRAME packet
//!   into it instead of the socket; the socket keeps POOL, RETURN, RING and DOORBELL packets
//!   and the end of stream. Busy-polling (`poll` with a zero timeout) reads the rings without
//!   a system call and looks at the sockets on one call in `EPOLL_EVERY`, so a round trip of
//!   small messages makes no system call at all. Before `poll` blocks it sets each ring's
//!   sleeping flag and looks again; a writer that finds the flag set sends a DOORBELL. A
//!   full ring is back-pressure: frames wait in order in the sender's queue (waiting flag,
//!   DOORBELL when the reader makes room). Ring entries are hostile input: copied out,
//!   every index and length checked, a bad one closes that connection.
//!
//! Packets (at most 64 KiB) and their byte layout: `codec.rs`, which also reads what a peer
//! sends. A frame whose segments do not fit one packet continues in further FRAME packets
//! with the same type, count and sequence. POOL packets carry the pool's memfd, RING packets
//! the ring's. The ring's layout and the wake-up rule byte by byte: docs/protocol.md §9.

pub mod codec;
mod error;
mod ring;
mod sys;

use std::collections::{HashMap, HashSet, VecDeque};

use evb_buffers::small_keys::{SmallKeyMap, SmallKeySet};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use evb_buffers::{BlockWriter, Chain, Pool, RemotePool, Slice};
use evb_wire::{FrameType, Hello};
use mio::unix::SourceFd;
use mio::{Interest, Token};
use tracing::{debug, warn};

use crate::handshake::{Handshake, Outcome};
use crate::tcp::Admission;
use crate::{
    CloseReason, ConnId, Event, InFrame, Segment, Transport, TransportConfig, TransportError,
};
use codec::{
    Control, Desc, FrameHead, PacketError, Seg, DESC_LEN, FRAME_HEAD, INLINE_HEAD, MAX_PACKET,
    TAG_FRAME,
};
use error::ShmError;

/// Owned bytes up to this size travel inside the packet; larger ones go through the bounce pool.
const INLINE_MAX: usize = 4096;
/// Peer pools one connection may map (each costs a mapping and a descriptor).
const MAX_REMOTE_POOLS: usize = 64;
/// FRAME packets read ahead while the receive pool is empty (so that RETURN packets behind
/// them are still seen); beyond this the connection stops reading.
const BACKLOG_MAX: usize = 32;
/// While busy-polling (`poll` with a zero timeout) with every connection on rings, the
/// sockets are looked at (epoll, a system call) on one call in this many: often enough to
/// see RETURNs, accepts and a peer's end within tens of microseconds of spinning, rarely
/// enough that a round trip over the rings makes no system call.
const EPOLL_EVERY: u32 = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Exchanging Hellos: where it stands is the connection's `Handshake`.
    Handshaking,
    Open,
    Closing,
}

/// A packet waiting for room in the socket.
struct Out {
    bytes: Vec<u8>,
    /// For a POOL packet: a slice of the pool, whose memfd goes with it.
    pass: Option<Slice>,
    /// A RING packet: the memfd of our FRAME ring goes with it.
    ring: bool,
    payload: usize,
}

impl Out {
    fn plain(bytes: Vec<u8>) -> Out {
        Out {
            bytes,
            pass: None,
            ring: false,
            payload: 0,
        }
    }
}

/// A FRAME packet waiting for room in our ring.
struct RingOut {
    bytes: Vec<u8>,
    payload: usize,
    /// Socket packets that must be sent before it (its POOL announcements, and everything
    /// queued for the socket before it): the value of `sock_pushed` when it was queued.
    after: u64,
}

/// Why `consume` stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The backlog is consumed.
    Done,
    /// No receive-pool block for the next inline bytes.
    Starved,
    /// A ring frame names a pool whose POOL packet is still in the socket.
    NeedPool,
}

/// A frame waiting for room in the bounce pool (and every frame after it, to keep order).
struct Deferred {
    frame_type: FrameType,
    count: u32,
    segments: Vec<Segment>,
}

struct Conn {
    hs: Handshake,
    /// Frames that need bounce blocks the receiver still holds.
    deferred: VecDeque<Deferred>,
    fd: OwnedFd,
    name: String,
    state: State,
    /// Packets for the socket, in order.
    queue: VecDeque<Out>,
    /// Packets ever put in `queue`, and ever sent from it (for `RingOut::after`).
    sock_pushed: u64,
    sock_sent: u64,
    /// The ring we write FRAME packets to (from when the connection opens), and those
    /// waiting for room in it.
    tx_ring: Option<ring::TxRing>,
    ring_queue: VecDeque<RingOut>,
    /// The ring the peer writes its FRAME packets to (from its RING packet on).
    rx_ring: Option<ring::RxRing>,
    queued: usize,
    writable: bool,
    seq_out: u64,
    seq_in: u64,
    announced: HashSet<u64>,
    /// Slices the peer reads in place, by token, with the bytes of shared memory each holds.
    lent: HashMap<u32, (Slice, usize)>,
    /// The sum of those bytes: shared memory this peer holds (`held_bytes`).
    held: usize,
    next_token: u32,
    remotes: HashMap<u64, RemotePool>,
    close_reason: Option<CloseReason>,
    /// FRAME packets received and not yet consumed (only while the receive pool is empty).
    backlog: VecDeque<Vec<u8>>,
    /// The FRAME packet being consumed, and the frame it belongs to.
    rx_pkt: Option<RxPacket>,
    rx_frame: Option<InFrame>,
    /// The receive block inline bytes are packed into.
    rx_block: Option<BlockWriter>,
    /// The end of the peer's stream, reported once everything before it is consumed.
    eof: Option<CloseReason>,
    /// On the control channel: may take the receive pool's reserve.
    control: bool,
    /// The handshake succeeded: only then may the peer's frames take receive blocks.
    admitted: bool,
    /// An incoming connection: when it was accepted (for the handshake deadline).
    accepted: Option<std::time::Instant>,
}

impl Conn {
    fn push_socket(&mut self, out: Out) {
        self.queue.push_back(out);
        self.sock_pushed += 1;
    }

    /// Opens our FRAME ring: from now on FRAME packets go there, after the RING packet
    /// that tells the peer where it is. Without a ring (it could not be made), everything
    /// keeps going over the socket.
    fn open_ring(&mut self) {
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
struct RxPacket {
    bytes: Vec<u8>,
    at: usize,
    left: u32,
    more: bool,
    copied: usize,
}

/// See the module docs.
pub struct ShmTransport {
    poll: mio::Poll,
    events: mio::Events,
    cfg: TransportConfig,
    listeners: SmallKeyMap<Token, OwnedFd>,
    conns: SmallKeyMap<Token, Conn>,
    next_token: usize,
    bounce: Pool,
    pending: Vec<Event>,
    more_to_read: VecDeque<Token>,
    /// Connections waiting for receive-pool blocks.
    starved: SmallKeySet<Token>,
    /// Connections we closed whose queue is written but whose peer still holds slices of
    /// ours: dropped when it gives them back or its stream ends, not before (it may still
    /// be reading them in place).
    draining: SmallKeySet<Token>,
    /// Blocks of the receive pool only control-channel connections may take.
    rx_reserve: usize,
    /// `poll` calls with a zero timeout since the sockets were last looked at.
    zero_polls: u32,
    buf: Vec<u8>,
    /// Bytes copied into shared memory because they were not there already.
    pub bytes_copied: u64,
    /// Bytes that crossed as descriptors, without a copy.
    pub bytes_by_reference: u64,
}

fn err(e: io::Error) -> TransportError {
    TransportError::Io {
        addr: "shm".into(),
        source: e,
    }
}

/// Bounce blocks needed for the segments that are not in shared memory already (they are
/// packed one after the other).
fn bounce_blocks(segments: &[Segment], block: usize) -> usize {
    segments
        .iter()
        .map(|s| match s {
            Segment::Shared(s) if s.shared_region().is_some() => 0,
            Segment::Owned(v) if v.len() <= INLINE_MAX => 0,
            other => other.len(),
        })
        .sum::<usize>()
        .div_ceil(block)
}

fn socket_name(run: &str, addr: &str) -> String {
    format!("evb-shm/{run}/{addr}")
}

impl ShmTransport {
    #[allow(clippy::new_ret_no_self)]
    pub fn new(cfg: TransportConfig) -> Result<Box<dyn Transport>, TransportError> {
        Ok(Box::new(Self::create(cfg)?))
    }

    pub fn create(cfg: TransportConfig) -> Result<ShmTransport, TransportError> {
        let block = 256 * 1024;
        let bytes = (cfg.max_frame as usize * 2).max(16 << 20);
        let bounce =
            Pool::new_shared_untouched("bounce", block, bytes.div_ceil(block)).map_err(err)?;
        let rx_reserve = cfg.rx_pool.stats().blocks / 8;
        Ok(ShmTransport {
            poll: mio::Poll::new().map_err(err)?,
            events: mio::Events::with_capacity(256),
            cfg,
            listeners: SmallKeyMap::default(),
            conns: SmallKeyMap::default(),
            next_token: 1,
            bounce,
            pending: Vec::new(),
            more_to_read: VecDeque::new(),
            starved: SmallKeySet::default(),
            draining: SmallKeySet::default(),
            rx_reserve,
            zero_polls: 0,
            buf: vec![0; MAX_PACKET],
            bytes_copied: 0,
            bytes_by_reference: 0,
        })
    }

    fn token(&mut self) -> Token {
        self.next_token += 1;
        Token(self.next_token)
    }

    fn add_conn(
        &mut self,
        fd: OwnedFd,
        name: String,
        state: State,
        inbound: bool,
    ) -> io::Result<Token> {
        let token = self.token();
        self.poll.registry().register(
            &mut SourceFd(&fd.as_raw_fd()),
            token,
            Interest::READABLE | Interest::WRITABLE,
        )?;
        self.conns.insert(
            token,
            Conn {
                hs: Handshake::accept(),
                deferred: VecDeque::new(),
                fd,
                name,
                state,
                queue: VecDeque::new(),
                sock_pushed: 0,
                sock_sent: 0,
                tx_ring: None,
                ring_queue: VecDeque::new(),
                rx_ring: None,
                queued: 0,
                writable: true,
                seq_out: 0,
                seq_in: 0,
                announced: HashSet::new(),
                lent: HashMap::new(),
                held: 0,
                next_token: 0,
                remotes: HashMap::new(),
                close_reason: None,
                backlog: VecDeque::new(),
                rx_pkt: None,
                rx_frame: None,
                rx_block: None,
                eof: None,
                control: false,
                admitted: false,
                accepted: inbound.then(std::time::Instant::now),
            },
        );
        Ok(token)
    }

    /// Encodes one frame as a packet (announcing pools first as needed) and queues it.
    fn queue_frame(
        &mut self,
        token: Token,
        frame_type: FrameType,
        count: u32,
        segments: Vec<Segment>,
    ) -> Result<(), TransportError> {
        let bounce = self.bounce.clone();
        let max_frame = self.cfg.max_frame as usize;
        let c = self
            .conns
            .get_mut(&token)
            .ok_or(TransportError::NoConnection(ConnId(token.0 as u64)))?;
        let payload: usize = segments.iter().map(Segment::len).sum();
        if payload > max_frame {
            return Err(TransportError::TooLarge {
                len: payload,
                max: max_frame,
            });
        }
        // Bytes not in shared memory need bounce blocks; without enough free ones (the
        // receiver holds them) the frame waits, and so does every frame after it. A frame
        // that needs more than the whole pool could never go: refused now, before any effect.
        let need = bounce_blocks(&segments, bounce.block_size());
        let total = bounce.stats().blocks;
        if need > total {
            return Err(TransportError::TooLarge {
                len: need * bounce.block_size(),
                max: total * bounce.block_size(),
            });
        }
        if !c.deferred.is_empty() || need > bounce.free_blocks() {
            c.queued += payload;
            c.deferred.push_back(Deferred {
                frame_type,
                count,
                segments,
            });
            return Ok(());
        }
        c.queued += payload;
        Self::encode(
            c,
            &bounce,
            frame_type,
            count,
            segments,
            &mut self.bytes_copied,
            &mut self.bytes_by_reference,
        )
    }

    /// Encodes frames that were waiting for bounce blocks, as far as blocks allow.
    fn pump_deferred(&mut self, token: Token) {
        let bounce = self.bounce.clone();
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        while let Some(d) = c.deferred.front() {
            if bounce_blocks(&d.segments, bounce.block_size()) > bounce.free_blocks() {
                break;
            }
            let d = c.deferred.pop_front().expect("front");
            let r = Self::encode(
                c,
                &bounce,
                d.frame_type,
                d.count,
                d.segments,
                &mut self.bytes_copied,
                &mut self.bytes_by_reference,
            );
            if let Err(e) = r {
                // cannot happen (the blocks were counted just above), but a frame that was
                // accepted by `send` is never dropped silently: the connection goes instead
                let reason = CloseReason::Lost(format!("cannot send a queued frame: {e}"));
                return self.drop_conn(token, reason);
            }
        }
    }

    /// Turns one frame into packets at the back of the queue (its payload is already counted
    /// in `queued`). Everything that can fail (taking bounce blocks) happens before anything
    /// is lent, announced or queued.
    fn encode(
        c: &mut Conn,
        bounce: &Pool,
        frame_type: FrameType,
        count: u32,
        segments: Vec<Segment>,
        bytes_copied: &mut u64,
        bytes_by_reference: &mut u64,
    ) -> Result<(), TransportError> {
        enum Part {
            Inline(Vec<u8>),
            /// A descriptor, and the bytes of shared memory it holds until returned (a
            /// bounce block counts whole, on its first descriptor).
            Desc(Slice, usize),
        }
        let mut payload = 0usize;
        let mut copied = 0u64;
        let mut by_ref = 0u64;
        let mut parts: Vec<Part> = Vec::with_capacity(segments.len());
        // bytes not in shared memory are packed into bounce blocks
        let mut block: Option<evb_buffers::BlockWriter> = None;
        let mut copy_in = |mut rest: &[u8], parts: &mut Vec<Part>| {
            while !rest.is_empty() {
                let mut charge = 0;
                if block.as_ref().is_none_or(|b| b.remaining() == 0) {
                    block = Some(bounce.try_alloc().ok_or_else(|| {
                        TransportError::Unavailable(
                            "shm: bounce pool exhausted (the peer is not returning buffers)".into(),
                        )
                    })?);
                    charge = bounce.block_size();
                }
                let w = block.as_mut().expect("just ensured");
                let n = rest.len().min(w.remaining());
                parts.push(Part::Desc(w.append(&rest[..n]).expect("fits"), charge));
                rest = &rest[n..];
            }
            Ok::<(), TransportError>(())
        };
        for seg in segments {
            payload += seg.len();
            match seg {
                s if s.is_empty() => {}
                Segment::Shared(s) if s.shared_region().is_some() => {
                    by_ref += s.len() as u64;
                    let n = s.len();
                    parts.push(Part::Desc(s, n));
                }
                Segment::Shared(s) => {
                    copied += s.len() as u64;
                    copy_in(&s, &mut parts)?;
                }
                Segment::Owned(v) if v.len() <= INLINE_MAX => parts.push(Part::Inline(v)),
                Segment::Owned(v) => {
                    copied += v.len() as u64;
                    copy_in(&v, &mut parts)?;
                }
            }
        }
        // announce pools the peer has not mapped yet
        for part in &parts {
            let Part::Desc(s, _) = part else { continue };
            if c.announced.insert(s.pool_id()) {
                let (_, len) = s.shared_region().expect("shared");
                let p = codec::pool_packet(s.pool_id(), len as u64);
                c.push_socket(Out {
                    bytes: p,
                    pass: Some(s.clone()),
                    ring: false,
                    payload: 0,
                });
            }
        }
        // packets of at most MAX_PACKET bytes; every part fits an empty one
        let frame_head = FrameHead {
            frame_type,
            more: false,
            count,
            sequence: c.seq_out,
            segments: 0,
        };
        let head = || {
            let mut pkt = Vec::with_capacity(256);
            frame_head.encode_into(&mut pkt);
            pkt
        };
        let mut packets = vec![head()];
        let mut nseg = 0u32;
        for part in parts {
            let size = match &part {
                Part::Inline(b) => INLINE_HEAD + b.len(),
                Part::Desc(..) => DESC_LEN,
            };
            let pkt = packets.last_mut().expect("one at least");
            if pkt.len() + size > MAX_PACKET && nseg > 0 {
                codec::set_segments(pkt, nseg);
                codec::set_more(pkt);
                packets.push(head());
                nseg = 0;
            }
            let pkt = packets.last_mut().expect("one at least");
            match part {
                Part::Inline(bytes) => Seg::Inline(&bytes).encode_into(pkt),
                Part::Desc(s, charge) => {
                    let t = c.next_token;
                    c.next_token = c.next_token.wrapping_add(1);
                    Seg::Desc(Desc {
                        pool: s.pool_id(),
                        offset: s.region_offset() as u64,
                        len: s.len() as u32,
                        token: t,
                    })
                    .encode_into(pkt);
                    c.held += charge;
                    c.lent.insert(t, (s, charge));
                }
            }
            nseg += 1;
        }
        codec::set_segments(packets.last_mut().expect("one at least"), nseg);
        c.seq_out += 1;
        let last = packets.len() - 1;
        for (i, bytes) in packets.into_iter().enumerate() {
            debug_assert!(bytes.len() <= MAX_PACKET);
            // the frame leaves the queue's count when its last packet is sent
            let payload = if i == last { payload } else { 0 };
            if c.tx_ring.is_some() {
                c.ring_queue.push_back(RingOut {
                    bytes,
                    payload,
                    after: c.sock_pushed,
                });
            } else {
                c.push_socket(Out {
                    bytes,
                    pass: None,
                    ring: false,
                    payload,
                });
            }
        }
        *bytes_copied += copied;
        *bytes_by_reference += by_ref;
        Ok(())
    }

    fn flush(&mut self, token: Token) {
        self.pump_deferred(token);
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        loop {
            while c.writable {
                let Some(front) = c.queue.front() else { break };
                let pass = if front.ring {
                    c.tx_ring.as_ref().and_then(|r| r.fd())
                } else {
                    front
                        .pass
                        .as_ref()
                        .and_then(|s| s.shared_region())
                        .map(|(fd, _)| fd)
                };
                match sys::send(c.fd.as_raw_fd(), &front.bytes, pass) {
                    Ok(true) => {
                        let done = c.queue.pop_front().expect("front");
                        c.queued -= done.payload;
                        c.sock_sent += 1;
                        if done.ring {
                            if let Some(r) = c.tx_ring.as_mut() {
                                r.passed();
                            }
                        }
                    }
                    Ok(false) => c.writable = false,
                    Err(e) if c.state == State::Closing => {
                        return self.drop_conn(token, CloseReason::Lost(e.to_string()));
                    }
                    Err(_) => {
                        // The peer is gone or going: what it sent before (a Bye, perhaps) is
                        // still to be read, and the end of its stream says how it left.
                        c.queue.clear();
                        c.ring_queue.clear();
                        c.queued = 0;
                        c.writable = false;
                        self.more_to_read.push_back(token);
                        return;
                    }
                }
            }
            // FRAME packets into the ring, in order, each once the socket packets queued
            // before it (the POOLs it names) are sent
            let Some(tx) = c.tx_ring.as_mut() else { break };
            let mut pushed = false;
            while let Some(front) = c.ring_queue.front() {
                if front.after > c.sock_sent {
                    break;
                }
                let r = match tx.push(&front.bytes) {
                    Ok(false) => tx
                        .wait_for_room(front.bytes.len())
                        .map(|room| (false, room)),
                    other => other.map(|done| (done, false)),
                };
                match r {
                    Ok((true, _)) => {
                        let done = c.ring_queue.pop_front().expect("front");
                        c.queued -= done.payload;
                        pushed = true;
                    }
                    // room appeared while we asked for a DOORBELL: try again
                    Ok((false, true)) => {}
                    // full: the peer sends a DOORBELL when it makes room
                    Ok((false, false)) => break,
                    Err(what) => return self.protocol(token, what),
                }
            }
            if pushed && tx.wake_needed() {
                c.push_socket(Out::plain(codec::DOORBELL.to_vec()));
                continue;
            }
            break;
        }
        if let Some(c) = self.conns.get(&token) {
            if c.state == State::Closing && c.queue.is_empty() && c.ring_queue.is_empty() {
                if c.lent.is_empty() {
                    let reason = c.close_reason.clone().unwrap_or(CloseReason::Local);
                    self.drop_conn(token, reason);
                } else {
                    self.draining.insert(token);
                }
            }
        }
    }

    fn drop_conn(&mut self, token: Token, reason: CloseReason) {
        if let Some(c) = self.conns.remove(&token) {
            let _ = self
                .poll
                .registry()
                .deregister(&mut SourceFd(&c.fd.as_raw_fd()));
            match &reason {
                CloseReason::Protocol(_) | CloseReason::Violation(_) | CloseReason::Rejected(_) => {
                    warn!(peer = %c.name, "closed: {reason}")
                }
                _ => debug!(peer = %c.name, "closed: {reason}"),
            }
            self.starved.remove(&token);
            self.draining.remove(&token);
            // what the peer still held of ours comes back to our pools now
            self.pending.push(Event::Closed {
                conn: ConnId(token.0 as u64),
                reason,
            });
        }
    }

    fn protocol(&mut self, token: Token, what: impl std::fmt::Display) {
        self.drop_conn(token, CloseReason::Violation(what.to_string()));
    }

    fn accept_all(&mut self, lt: Token) {
        loop {
            let Some(l) = self.listeners.get(&lt) else {
                return;
            };
            match sys::accept(l.as_raw_fd()) {
                Ok(Some(fd)) => {
                    if sys::peer_uid(fd.as_raw_fd()) != Some(sys::my_uid()) {
                        warn!("shm: refusing a connection from another user");
                        continue;
                    }
                    if let Err(e) = self.add_conn(fd, "shm peer".into(), State::Handshaking, true) {
                        warn!("shm: cannot register a connection: {e}");
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    warn!("shm: accept failed: {e}");
                    return;
                }
            }
        }
    }

    /// Reads packets until the socket and the ring are empty or the budget is spent. FRAME
    /// packets are consumed in order; when the receive pool has no block for one, reading
    /// stops (at most BACKLOG_MAX packets are read ahead from the socket, so RETURNs behind
    /// them are still seen; the ring is left alone) and resumes from `poll` when blocks come
    /// back. With `socket` false only the ring is read (busy-polling), unless a ring frame
    /// names a pool not known yet: its POOL packet is then in the socket, read now.
    fn read(&mut self, token: Token, out: &mut Vec<Event>, socket: bool) {
        self.read_inner(token, out, socket);
        // consumed ring entries may have made the room a waiting producer asked for
        if let Some(c) = self.conns.get_mut(&token) {
            if c.rx_ring.as_mut().is_some_and(|r| r.room_wanted()) {
                c.push_socket(Out::plain(codec::DOORBELL.to_vec()));
                self.flush(token);
            }
        }
    }

    fn read_inner(&mut self, token: Token, out: &mut Vec<Event>, mut socket: bool) {
        self.starved.remove(&token);
        // the socket was found empty since a frame asked for a pool
        let mut socket_empty = false;
        for _ in 0..64 {
            let stop = match self.consume(token, out) {
                Ok(stop) => stop,
                Err(what) => return self.protocol(token, what),
            };
            let starved = stop == Stop::Starved;
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            if stop == Stop::NeedPool {
                if socket_empty || c.eof.is_some() {
                    return self.protocol(token, ShmError::UnknownPool);
                }
                socket = true;
            }
            if stop == Stop::Done && c.rx_pkt.is_none() && c.backlog.is_empty() {
                // the ring after the socket's backlog: its frames come after those
                if let Some(r) = c.rx_ring.as_mut() {
                    match r.pop() {
                        Ok(Some(bytes)) => {
                            if bytes[0] != TAG_FRAME {
                                return self.protocol(token, "a ring entry that is not a FRAME");
                            }
                            c.backlog.push_back(bytes);
                            continue;
                        }
                        Ok(None) => {}
                        Err(what) => return self.protocol(token, what),
                    }
                }
            }
            if c.eof.is_some() {
                if stop != Stop::Done || c.rx_pkt.is_some() || !c.backlog.is_empty() {
                    self.starved.insert(token);
                    return;
                }
                let reason = c.eof.take().expect("checked");
                return self.drop_conn(token, reason);
            }
            if !socket {
                if starved {
                    self.starved.insert(token);
                }
                return;
            }
            if starved && c.backlog.len() >= BACKLOG_MAX {
                self.starved.insert(token);
                return;
            }
            let fd = c.fd.as_raw_fd();
            match sys::recv(fd, &mut self.buf) {
                Ok(sys::Recv::Empty) => {
                    if stop == Stop::NeedPool {
                        socket_empty = true;
                        continue;
                    }
                    if starved {
                        self.starved.insert(token);
                    }
                    return;
                }
                Ok(sys::Recv::Eof) => {
                    c.eof = Some(if c.state == State::Closing {
                        CloseReason::Local
                    } else {
                        CloseReason::Lost("peer closed the stream without Bye".into())
                    });
                }
                Err(e) => return self.drop_conn(token, CloseReason::Lost(e.to_string())),
                Ok(sys::Recv::Packet {
                    len,
                    fd: passed,
                    truncated,
                }) => {
                    if truncated {
                        return self.protocol(token, "shm packet larger than 64 KiB");
                    }
                    if self.buf[0] == TAG_FRAME {
                        if c.rx_ring.is_some() {
                            return self.protocol(token, "a FRAME packet on the socket after RING");
                        }
                        // any descriptor that came with it is closed here
                        drop(passed);
                        c.backlog.push_back(self.buf[..len].to_vec());
                        continue;
                    }
                    let pkt = self.buf[..len].to_vec();
                    if let Err(what) = self.on_packet(token, &pkt, passed) {
                        return self.protocol(token, what);
                    }
                }
            }
        }
        self.more_to_read.push_back(token);
    }

    /// A POOL, RETURN, RING or DOORBELL packet.
    fn on_packet(
        &mut self,
        token: Token,
        p: &[u8],
        passed: Option<OwnedFd>,
    ) -> Result<(), ShmError> {
        let c = self.conns.get_mut(&token).ok_or(ShmError::Gone)?;
        // what the connection's state forbids is refused before the packet is read
        match p.first().copied() {
            Some(codec::TAG_POOL) if c.state != State::Open => {
                return Err(ShmError::PoolBeforeHandshake)
            }
            Some(codec::TAG_RING) if c.state != State::Open => {
                return Err(ShmError::RingBeforeHandshake)
            }
            Some(codec::TAG_RING) if c.rx_ring.is_some() => return Err(ShmError::SecondRing),
            _ => {}
        }
        match Control::decode(p)? {
            Control::Pool { id, len } => {
                let fd = passed.ok_or(ShmError::PoolWithoutFd)?;
                if c.remotes.len() >= MAX_REMOTE_POOLS {
                    return Err(ShmError::TooManyPools);
                }
                let len = usize::try_from(len).map_err(|_| ShmError::PoolLength)?;
                sys::check_peer_memfd(fd.as_raw_fd(), len).map_err(ShmError::PoolRefused)?;
                let r = RemotePool::map(&c.name, fd, len)
                    .map_err(|source| ShmError::PoolMap { len, source })?;
                c.remotes.insert(id, r);
            }
            Control::Ring { capacity } => {
                let fd = passed.ok_or(ShmError::RingWithoutFd)?;
                c.rx_ring = Some(ring::RxRing::map(fd, capacity)?);
            }
            // the ring is read after every socket read: nothing more to do
            Control::Doorbell => {}
            Control::Return(tokens) => {
                for t in tokens {
                    if let Some((_, charge)) = c.lent.remove(&t) {
                        c.held -= charge;
                    }
                }
            }
        }
        Ok(())
    }

    /// Consumes FRAME packets of the backlog in order, until it is empty (`Stop::Done`), a
    /// receive-pool block is wanted (`Starved`) or a ring frame names a pool not known yet
    /// (`NeedPool`); what is consumed so far is kept: it resumes where it stopped.
    fn consume(&mut self, token: Token, out: &mut Vec<Event>) -> Result<Stop, ShmError> {
        let max_frame = self.cfg.max_frame as usize;
        loop {
            let Some(c) = self.conns.get_mut(&token) else {
                return Ok(Stop::Done);
            };
            if c.rx_pkt.is_none() {
                let Some(bytes) = c.backlog.pop_front() else {
                    return Ok(Stop::Done);
                };
                let head = FrameHead::decode(&bytes)?;
                let FrameHead {
                    frame_type,
                    count,
                    sequence,
                    ..
                } = head;
                match &c.rx_frame {
                    None if sequence != c.seq_in => {
                        return Err(ShmError::Sequence {
                            got: sequence,
                            expected: c.seq_in,
                        })
                    }
                    Some(f)
                        if (f.frame_type, f.count, f.sequence) != (frame_type, count, sequence) =>
                    {
                        return Err(ShmError::Continuation);
                    }
                    None | Some(_) => {}
                }
                if c.state == State::Handshaking {
                    // before the handshake: small inline frames only, never from the pool
                    let payload = codec::handshake_payload(&bytes, &head)?;
                    c.seq_in += 1;
                    self.on_handshake(token, frame_type, &payload, out);
                    continue;
                }
                if !c.admitted {
                    // refused, its Reject on the way out: what it sends is dropped unread
                    c.backlog.clear();
                    return Ok(Stop::Done);
                }
                c.rx_frame.get_or_insert(InFrame {
                    frame_type,
                    count,
                    sequence,
                    payload: Chain::new(),
                });
                c.rx_pkt = Some(RxPacket {
                    bytes,
                    at: FRAME_HEAD,
                    left: head.segments,
                    more: head.more,
                    copied: 0,
                });
            }
            let pool = &self.cfg.rx_pool;
            let reserve = if c.control { 0 } else { self.rx_reserve };
            let pkt = c.rx_pkt.as_mut().expect("set above");
            let frame = c.rx_frame.as_mut().expect("set with the packet");
            let p = &pkt.bytes;
            while pkt.left > 0 {
                match Seg::decode(p, pkt.at)? {
                    Seg::Inline(bytes) => {
                        let len = bytes.len();
                        if pkt.copied == 0 && frame.payload.len() + len > max_frame {
                            return Err(ShmError::FrameTooLarge(max_frame));
                        }
                        while pkt.copied < len {
                            if c.rx_block.as_ref().is_none_or(|b| b.remaining() == 0) {
                                c.rx_block = None;
                                if pool.free_blocks() <= reserve {
                                    return Ok(Stop::Starved);
                                }
                                match pool.try_alloc() {
                                    Some(b) => c.rx_block = Some(b),
                                    None => return Ok(Stop::Starved),
                                }
                            }
                            let w = c.rx_block.as_mut().expect("just ensured");
                            let n = (len - pkt.copied).min(w.remaining());
                            let chunk = &bytes[pkt.copied..pkt.copied + n];
                            frame.payload.push(w.append(chunk).expect("fits"));
                            pkt.copied += n;
                        }
                        pkt.copied = 0;
                        pkt.at += INLINE_HEAD + len;
                    }
                    Seg::Desc(d) => {
                        let (offset, len) = (d.offset as usize, d.len as usize);
                        if frame.payload.len() + len > max_frame {
                            return Err(ShmError::FrameTooLarge(max_frame));
                        }
                        let Some(r) = c.remotes.get(&d.pool) else {
                            // a ring frame may overtake the POOL packet, which the sender
                            // wrote to the socket before it: the caller reads the socket
                            if c.rx_ring.is_some() {
                                return Ok(Stop::NeedPool);
                            }
                            return Err(ShmError::UnknownPool);
                        };
                        frame
                            .payload
                            .push(r.slice(offset, len, d.token).ok_or(ShmError::OutsidePool)?);
                        pkt.at += DESC_LEN;
                    }
                }
                pkt.left -= 1;
            }
            if pkt.at != p.len() {
                return Err(PacketError::MoreBytes.into());
            }
            let more = pkt.more;
            c.rx_pkt = None;
            if !more {
                let frame = c.rx_frame.take().expect("present");
                c.seq_in += 1;
                self.on_frame(token, frame, out);
            }
        }
    }

    fn on_frame(&mut self, token: Token, frame: InFrame, out: &mut Vec<Event>) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let conn = ConnId(token.0 as u64);
        match (c.state, frame.frame_type) {
            (State::Open, FrameType::Messages) => out.push(Event::Frame { conn, frame }),
            (State::Open, FrameType::Bye) => self.drop_conn(token, CloseReason::PeerClosed),
            (State::Closing, _) => {}
            (_, t) => self.protocol(token, format!("frame type {t:?} on an open connection")),
        }
    }

    /// One handshake frame (its payload read without the receive pool).
    fn on_handshake(
        &mut self,
        token: Token,
        frame_type: FrameType,
        payload: &[u8],
        out: &mut Vec<Event>,
    ) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let conn = ConnId(token.0 as u64);
        let mut send = Vec::new();
        // same-host peers are checked by uid at accept: no secret on this transport
        let outcome =
            c.hs.step(&self.cfg, None, frame_type, payload, &c.name, &mut send);
        for (ft, bytes) in send {
            let _ = self.queue_frame(token, ft, 0, vec![Segment::Owned(bytes)]);
        }
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        match outcome {
            Outcome::Continue => self.flush(token),
            Outcome::Open(peer) => {
                c.name = peer.node_id.clone();
                if c.accepted.is_some() {
                    c.control = peer.channel == evb_wire::Channel::Control;
                }
                c.state = State::Open;
                c.admitted = true;
                c.open_ring();
                out.push(c.hs.opened(conn, peer));
                self.flush(token);
            }
            Outcome::Refuse(reason) => {
                c.state = State::Closing;
                c.close_reason = Some(reason);
                self.flush(token);
            }
            Outcome::Drop(reason) => self.drop_conn(token, reason),
        }
    }

    /// Closes incoming connections whose handshake has taken too long.
    fn expire_handshakes(&mut self) {
        let limit = Admission::default().handshake_deadline;
        let late: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| c.state == State::Handshaking)
            .filter(|(_, c)| c.accepted.is_some_and(|t| t.elapsed() >= limit))
            .map(|(t, _)| *t)
            .collect();
        for t in late {
            let why = format!("handshake not completed within {} ms", limit.as_millis());
            self.drop_conn(t, CloseReason::Rejected(why));
        }
    }

    /// Before blocking: sets the sleeping flag of every ring we read (the writer then owes
    /// us a DOORBELL on the socket); `true` if one has data already (then do not block).
    fn arm_rings(&mut self) -> bool {
        let mut ready = false;
        for c in self.conns.values_mut() {
            if let Some(r) = c.rx_ring.as_mut() {
                ready |= r.arm();
            }
        }
        ready
    }

    /// Sends back the tokens of the peers' slices we have finished with.
    fn return_tokens(&mut self) {
        let mut tokens = Vec::new();
        let ids: Vec<Token> = self.conns.keys().copied().collect();
        for t in ids {
            tokens.clear();
            let Some(c) = self.conns.get_mut(&t) else {
                continue;
            };
            for r in c.remotes.values() {
                r.take_returns(&mut tokens);
            }
            for chunk in tokens.chunks(codec::RETURN_MAX) {
                c.push_socket(Out::plain(codec::return_packet(chunk)));
            }
            if !tokens.is_empty() {
                self.flush(t);
            }
        }
    }
}

impl Transport for ShmTransport {
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        Some(self.poll.as_raw_fd())
    }

    fn prepare_wait(&mut self) -> bool {
        // the sweep after the wait looks at the sockets
        self.zero_polls = EPOLL_EVERY;
        !self.arm_rings() && self.pending.is_empty() && self.more_to_read.is_empty()
    }

    fn listen(&mut self, addr: &str) -> Result<String, TransportError> {
        // Port 0 asks for any free name, as with TCP.
        static UNIQUE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let addr = match addr.strip_suffix(":0") {
            Some(host) => {
                let n = UNIQUE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                format!("{host}:shm{}-{n}", std::process::id())
            }
            None => addr.to_string(),
        };
        let fd = sys::listen(&socket_name(&self.cfg.run_id, &addr)).map_err(|source| {
            TransportError::Io {
                addr: addr.clone(),
                source,
            }
        })?;
        let token = self.token();
        self.poll
            .registry()
            .register(&mut SourceFd(&fd.as_raw_fd()), token, Interest::READABLE)
            .map_err(err)?;
        self.listeners.insert(token, fd);
        Ok(addr)
    }

    fn connect(&mut self, addr: &str, hello: Hello) -> Result<ConnId, TransportError> {
        match sys::connect(&socket_name(&self.cfg.run_id, addr)) {
            Ok(fd) => {
                let token = self
                    .add_conn(fd, addr.to_string(), State::Handshaking, false)
                    .map_err(err)?;
                let control = hello.channel == evb_wire::Channel::Control;
                let (hs, bytes) = Handshake::connect(hello, None)?;
                if let Some(c) = self.conns.get_mut(&token) {
                    c.hs = hs;
                    c.control = control;
                }
                self.queue_frame(token, FrameType::Hello, 0, vec![Segment::Owned(bytes)])?;
                self.flush(token);
                Ok(ConnId(token.0 as u64))
            }
            Err(e) => {
                // reported like a refused TCP connect: on the next poll
                let token = self.token();
                let conn = ConnId(token.0 as u64);
                self.pending.push(Event::Closed {
                    conn,
                    reason: CloseReason::ConnectFailed(e.to_string()),
                });
                Ok(conn)
            }
        }
    }

    fn send(
        &mut self,
        conn: ConnId,
        frame_type: FrameType,
        count: u32,
        segments: Vec<Segment>,
    ) -> Result<(), TransportError> {
        let token = Token(conn.0 as usize);
        match self.conns.get(&token).map(|c| c.state) {
            None => return Err(TransportError::NoConnection(conn)),
            Some(State::Open) => {}
            Some(_) => return Err(TransportError::NotOpen(conn)),
        }
        self.queue_frame(token, frame_type, count, segments)?;
        self.flush(token);
        Ok(())
    }

    fn queued_bytes(&self, conn: ConnId) -> usize {
        self.conns
            .get(&Token(conn.0 as usize))
            .map_or(0, |c| c.queued)
    }

    fn held_bytes(&self, conn: ConnId) -> usize {
        self.conns
            .get(&Token(conn.0 as usize))
            .map_or(0, |c| c.held)
    }

    fn close(&mut self, conn: ConnId) {
        let token = Token(conn.0 as usize);
        let Some(state) = self.conns.get(&token).map(|c| c.state) else {
            return;
        };
        match state {
            State::Open => {
                let _ = self.queue_frame(token, FrameType::Bye, 0, Vec::new());
                if let Some(c) = self.conns.get_mut(&token) {
                    c.state = State::Closing;
                    c.close_reason = Some(CloseReason::Local);
                }
                self.flush(token);
            }
            State::Closing => {}
            _ => self.drop_conn(token, CloseReason::Local),
        }
    }

    fn counters(&self) -> crate::TransportCounters {
        crate::TransportCounters {
            bytes_copied: self.bytes_copied,
            bytes_by_reference: self.bytes_by_reference,
        }
    }

    fn poll(&mut self, out: &mut Vec<Event>, timeout: Option<Duration>) -> io::Result<()> {
        self.return_tokens();
        if !self.draining.is_empty() {
            let drained: Vec<Token> = self
                .draining
                .iter()
                .copied()
                .filter(|t| self.conns.get(t).is_none_or(|c| c.lent.is_empty()))
                .collect();
            for t in drained {
                self.draining.remove(&t);
                let reason = self
                    .conns
                    .get(&t)
                    .and_then(|c| c.close_reason.clone())
                    .unwrap_or(CloseReason::Local);
                self.drop_conn(t, reason);
            }
        }
        out.append(&mut self.pending);
        // the rings first: while busy-polling, a round trip makes no system call
        let mut sockets_only = false;
        let mut ring_data = Vec::new();
        for (t, c) in self.conns.iter_mut() {
            match c.rx_ring.as_mut() {
                Some(r) => {
                    r.disarm();
                    if r.has_data() {
                        ring_data.push(*t);
                    }
                }
                None => sockets_only = true,
            }
        }
        for t in ring_data {
            if !self.starved.contains(&t) {
                self.read(t, out, false);
            }
        }
        let full: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.ring_queue.is_empty())
            .map(|(t, _)| *t)
            .collect();
        for t in full {
            self.flush(t);
        }
        if timeout == Some(Duration::ZERO) {
            self.zero_polls += 1;
            if !sockets_only
                && self.zero_polls < EPOLL_EVERY
                && self.more_to_read.is_empty()
                && self.starved.is_empty()
                && self.draining.is_empty()
            {
                self.return_tokens();
                out.append(&mut self.pending);
                return Ok(());
            }
        }
        self.zero_polls = 0;
        let mut timeout = if !out.is_empty() || !self.more_to_read.is_empty() {
            Some(Duration::ZERO)
        } else if !self.starved.is_empty() {
            // waiting for receive blocks, which come back without a wake-up: look again soon
            Some(timeout.map_or(Duration::from_millis(1), |t| {
                t.min(Duration::from_millis(1))
            }))
        } else if self.conns.values().any(|c| c.state == State::Handshaking) {
            Some(timeout.map_or(Duration::from_millis(100), |t| {
                t.min(Duration::from_millis(100))
            }))
        } else {
            timeout
        };
        if timeout != Some(Duration::ZERO) && self.arm_rings() {
            timeout = Some(Duration::ZERO);
        }
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        let ready: Vec<(Token, bool, bool)> = self
            .events
            .iter()
            .map(|e| {
                (
                    e.token(),
                    e.is_readable() || e.is_read_closed(),
                    e.is_writable(),
                )
            })
            .collect();
        for (token, readable, writable) in ready {
            if self.listeners.contains_key(&token) {
                self.accept_all(token);
                continue;
            }
            if writable {
                if let Some(c) = self.conns.get_mut(&token) {
                    c.writable = true;
                }
                self.flush(token);
            }
            if readable {
                self.read(token, out, true);
            }
        }
        for token in std::mem::take(&mut self.more_to_read) {
            self.read(token, out, true);
        }
        for token in self.starved.iter().copied().collect::<Vec<_>>() {
            self.read(token, out, true);
        }
        // rings written while we slept, or while we read the sockets
        let ring_data: Vec<Token> = self
            .conns
            .iter_mut()
            .filter_map(|(t, c)| {
                let r = c.rx_ring.as_mut()?;
                r.disarm();
                r.has_data().then_some(*t)
            })
            .collect();
        for t in ring_data {
            if !self.starved.contains(&t) {
                self.read(t, out, false);
            }
        }
        self.expire_handshakes();
        // returned tokens may have freed bounce blocks that waiting frames need
        let waiting: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.deferred.is_empty())
            .map(|(t, _)| *t)
            .collect();
        for t in waiting {
            self.flush(t);
        }
        self.return_tokens();
        out.append(&mut self.pending);
        Ok(())
    }
}

#[cfg(test)]
mod ring_tests;

#[cfg(test)]
mod tests {
    use super::codec::TAG_POOL;
    use super::*;
    use evb_wire::{Channel, Role};
    use std::os::fd::{AsFd, FromRawFd};

    fn cfg(node: &str) -> TransportConfig {
        TransportConfig {
            run_id: "seal-run".into(),
            local: Hello::new(Channel::Data, Role::Bu, 0, "seal-run", node),
            max_frame: 8 << 20,
            rx_pool: Pool::new(node, 64 * 1024, 16),
            secret: None,
        }
    }

    /// A FRAME packet of inline segments (also for the ring tests).
    pub(super) fn frame_packet(ft: FrameType, seq: u64, segs: &[&[u8]]) -> Vec<u8> {
        let mut p = vec![TAG_FRAME, ft as u8, 0, 0, 0, 0, 0, 0];
        p.extend_from_slice(&seq.to_le_bytes());
        p.extend_from_slice(&(segs.len() as u32).to_le_bytes());
        for s in segs {
            p.push(0);
            p.extend_from_slice(&(s.len() as u32).to_le_bytes());
            p.extend_from_slice(s);
        }
        p
    }

    /// A memfd of `size` bytes with `seals` (none if 0).
    fn memfd(size: usize, seals: libc::c_int) -> OwnedFd {
        let name = c"evb-test";
        // SAFETY: plain system call on a valid C string; the result is checked.
        let raw = unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        assert!(raw >= 0);
        // SAFETY: a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        std::fs::File::from(fd.try_clone().unwrap())
            .set_len(size as u64)
            .unwrap();
        if seals != 0 {
            // SAFETY: F_ADD_SEALS on our own memfd with an integer argument.
            let sealed = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) };
            assert_eq!(sealed, 0);
        }
        fd
    }

    /// A hand-made peer: handshakes, offers `fd` as a pool of `claimed` bytes, then sends a
    /// frame with a descriptor 512 KiB into it. Returns how the transport closed it.
    fn offer(fd: OwnedFd, claimed: u64) -> CloseReason {
        let mut t = ShmTransport::create(cfg("bu0")).unwrap();
        let addr = t.listen("127.0.0.1:0").unwrap();
        let raw = sys::connect(&socket_name("seal-run", &addr)).unwrap();
        let hello = Hello::new(Channel::Data, Role::Ru, 0, "seal-run", "ru0")
            .encode()
            .unwrap();
        assert!(sys::send(
            raw.as_raw_fd(),
            &frame_packet(FrameType::Hello, 0, &[&hello]),
            None
        )
        .unwrap());
        let mut evs = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !evs.iter().any(|e| matches!(e, Event::Accepted { .. })) {
            assert!(std::time::Instant::now() < deadline, "{evs:?}");
            t.poll(&mut evs, Some(Duration::from_millis(1))).unwrap();
        }
        let mut p = vec![TAG_POOL, 0, 0, 0, 0, 0, 0, 0];
        p.extend_from_slice(&77u64.to_le_bytes());
        p.extend_from_slice(&claimed.to_le_bytes());
        assert!(sys::send(raw.as_raw_fd(), &p, Some(fd.as_fd())).unwrap());
        let mut f = frame_packet(FrameType::Messages, 1, &[]);
        f[16..20].copy_from_slice(&1u32.to_le_bytes());
        f.push(1);
        f.extend_from_slice(&77u64.to_le_bytes());
        f.extend_from_slice(&(512u64 << 10).to_le_bytes());
        f.extend_from_slice(&4096u32.to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        assert!(sys::send(raw.as_raw_fd(), &f, None).unwrap());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            assert!(std::time::Instant::now() < deadline, "{evs:?}");
            t.poll(&mut evs, Some(Duration::from_millis(1))).unwrap();
            for e in evs.drain(..) {
                match e {
                    // reading a page the file does not have would be SIGBUS here
                    Event::Frame { frame, .. } => panic!("mapped: {}", frame.payload.crc32c()),
                    Event::Closed { reason, .. } => return reason,
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn unsealed_or_short_peer_memory_is_refused_before_it_is_mapped() {
        let all = sys::REQUIRED_SEALS;
        let r = offer(memfd(1 << 20, 0), 1 << 20);
        assert!(
            matches!(&r, CloseReason::Violation(w) if w.contains("not sealed")),
            "{r}"
        );
        let r = offer(memfd(1 << 20, libc::F_SEAL_SHRINK), 1 << 20);
        assert!(
            matches!(&r, CloseReason::Violation(w) if w.contains("not sealed")),
            "{r}"
        );
        // sealed, but shorter than it claims: mapping 1 MiB would fault at 4 KiB
        let r = offer(memfd(4096, all), 1 << 20);
        assert!(
            matches!(&r, CloseReason::Violation(w) if w.contains("holds 4096 bytes")),
            "{r}"
        );
        // not a memfd at all
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let r = offer(OwnedFd::from(a), 1 << 20);
        assert!(
            matches!(&r, CloseReason::Violation(w) if w.contains("not a memfd")),
            "{r}"
        );
        assert!(
            r.to_string()
                .starts_with("protocol violation: refusing the peer's shared pool"),
            "{r}"
        );
    }

    #[test]
    fn our_shared_pools_carry_the_seals_peers_require() {
        let pool = Pool::new_shared("sealed", 4096, 4).unwrap();
        let fd = pool.shared_fd().unwrap();
        sys::check_peer_memfd(fd.as_raw_fd(), pool.region_len()).unwrap();
        // and cannot be shrunk under a reader
        // SAFETY: ftruncate on a descriptor we hold; expected to fail with EPERM.
        let r = unsafe { libc::ftruncate(fd.as_raw_fd(), 0) };
        assert_eq!(r, -1);
        let bounce = Pool::new_shared_untouched("bounce", 256 * 1024, 64).unwrap();
        sys::check_peer_memfd(bounce.shared_fd().unwrap().as_raw_fd(), bounce.region_len())
            .unwrap();
    }
}

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
//!
//! Here: the transport and its `poll`. A connection's state is in `conn.rs`, the send side
//! in `tx.rs`, the receive side in `rx.rs`, packet bytes in `codec.rs`, the rings in
//! `ring.rs`, system calls in `sys.rs`.
//!
//! One idea: the shm transport's connection set-up and poll loop; its codec, rings, sending and
//! receiving are the files beside it.

pub mod codec;
mod conn;
mod error;
mod ring;
mod rx;
mod sys;
mod tx;

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
use conn::{Conn, Deferred, Out, RingOut, RxPacket};
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
        let ready = crate::readiness::ready(&self.events);
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
mod tests;

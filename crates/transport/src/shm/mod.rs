//! The `shm` transport: processes on one host. Payloads stay where they are, in shared
//! memory; only descriptors (pool, offset, length, return token) cross between processes.
//!
//! - Connections are Unix-domain SOCK_SEQPACKET sockets in the abstract namespace, named
//!   after the run and the node's configured address: nothing in the file system, nothing
//!   left in /dev/shm after a crash, and a dead peer is seen at once (end of stream).
//! - A sender's pools are memfds (`Pool::new_shared`). The first time a pool appears on a
//!   connection its memfd is passed with SCM_RIGHTS and the peer maps it read-only; from then
//!   on a slice travels as a 24-byte descriptor. The sender keeps the slice ("lent") until the
//!   receiver's last user drops it and its token comes back, so the block is reused only then.
//! - Bytes not already in shared memory (control messages, headers) travel inline when small,
//!   or are copied once into a shared bounce pool; `bytes_copied` counts them.
//! - Same-host peers are authenticated by their user id (SO_PEERCRED) instead of the HMAC
//!   handshake of the network transports.
//!
//! Packets, little-endian: FRAME = tag 1 · frame type u8 · 0 u16 · count u32 · sequence u64 ·
//! segments u32, then per segment either 0 · length u32 · bytes (inline) or 1 · pool u64 ·
//! offset u64 · length u32 · token u32 (descriptor). POOL = tag 2 · 0×7 · pool u64 · bytes
//! u64, with the memfd attached. RETURN = tag 3 · 0×3 · n u32 · n tokens u32.

mod sys;

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use evb_buffers::{Chain, Pool, RemotePool, Slice};
use evb_wire::{FrameType, Hello, WireError};
use mio::unix::SourceFd;
use mio::{Interest, Token};
use tracing::{debug, warn};

use crate::handshake::{Handshake, Outcome};
use crate::{
    CloseReason, ConnId, Event, InFrame, Segment, Transport, TransportConfig, TransportError,
};

const MAX_PACKET: usize = 64 * 1024;
/// Owned bytes up to this size travel inside the packet; larger ones go through the bounce pool.
const INLINE_MAX: usize = 4096;
/// Peer pools one connection may map (each costs a mapping and a descriptor).
const MAX_REMOTE_POOLS: usize = 64;
const TAG_FRAME: u8 = 1;
const TAG_POOL: u8 = 2;
const TAG_RETURN: u8 = 3;

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
    payload: usize,
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
    queue: VecDeque<Out>,
    queued: usize,
    writable: bool,
    seq_out: u64,
    seq_in: u64,
    announced: HashSet<u64>,
    lent: HashMap<u32, Slice>,
    next_token: u32,
    remotes: HashMap<u64, RemotePool>,
    close_reason: Option<CloseReason>,
}

/// See the module docs.
pub struct ShmTransport {
    poll: mio::Poll,
    events: mio::Events,
    cfg: TransportConfig,
    listeners: HashMap<Token, OwnedFd>,
    conns: HashMap<Token, Conn>,
    next_token: usize,
    bounce: Pool,
    pending: Vec<Event>,
    more_to_read: VecDeque<Token>,
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

/// Bounce blocks needed for the segments that are not in shared memory already.
fn bounce_blocks(segments: &[Segment], block: usize) -> usize {
    segments
        .iter()
        .map(|s| match s {
            Segment::Shared(s) if s.shared_region().is_some() => 0,
            Segment::Owned(v) if v.len() <= INLINE_MAX => 0,
            other => other.len().div_ceil(block),
        })
        .sum()
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
        Ok(ShmTransport {
            poll: mio::Poll::new().map_err(err)?,
            events: mio::Events::with_capacity(256),
            cfg,
            listeners: HashMap::new(),
            conns: HashMap::new(),
            next_token: 1,
            bounce,
            pending: Vec::new(),
            more_to_read: VecDeque::new(),
            buf: vec![0; MAX_PACKET],
            bytes_copied: 0,
            bytes_by_reference: 0,
        })
    }

    fn token(&mut self) -> Token {
        self.next_token += 1;
        Token(self.next_token)
    }

    fn add_conn(&mut self, fd: OwnedFd, name: String, state: State) -> io::Result<Token> {
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
                queued: 0,
                writable: true,
                seq_out: 0,
                seq_in: 0,
                announced: HashSet::new(),
                lent: HashMap::new(),
                next_token: 0,
                remotes: HashMap::new(),
                close_reason: None,
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
        // receiver holds them) the frame waits, and so does every frame after it.
        if !c.deferred.is_empty()
            || bounce_blocks(&segments, bounce.block_size()) > bounce.free_blocks()
        {
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
            if r.is_err() {
                break;
            }
        }
    }

    /// Turns one frame into packets at the back of the queue (its payload is already counted
    /// in `queued`).
    fn encode(
        c: &mut Conn,
        bounce: &Pool,
        frame_type: FrameType,
        count: u32,
        segments: Vec<Segment>,
        bytes_copied: &mut u64,
        bytes_by_reference: &mut u64,
    ) -> Result<(), TransportError> {
        let mut pkt = Vec::with_capacity(64);
        pkt.push(TAG_FRAME);
        pkt.push(frame_type as u8);
        pkt.extend_from_slice(&[0, 0]);
        pkt.extend_from_slice(&count.to_le_bytes());
        pkt.extend_from_slice(&c.seq_out.to_le_bytes());
        let nseg_at = pkt.len();
        pkt.extend_from_slice(&0u32.to_le_bytes());
        let mut nseg = 0u32;
        let mut payload = 0usize;
        let mut copied = 0u64;
        let mut by_ref = 0u64;
        // Slices to describe: the caller's shared ones as they are, the rest copied to bounce.
        let mut descs: Vec<Slice> = Vec::new();
        let mut parts: Vec<Result<Vec<u8>, usize>> = Vec::new(); // inline bytes, or index in descs
        let copy_in =
            |bytes: &[u8], descs: &mut Vec<Slice>, parts: &mut Vec<Result<Vec<u8>, usize>>| {
                let mut rest = bytes;
                while !rest.is_empty() {
                    let mut w = bounce.try_alloc().ok_or_else(|| {
                        TransportError::Unavailable(
                            "shm: bounce pool exhausted (the peer is not returning buffers)".into(),
                        )
                    })?;
                    let n = rest.len().min(w.capacity());
                    descs.push(w.append(&rest[..n]).expect("fits"));
                    parts.push(Err(descs.len() - 1));
                    rest = &rest[n..];
                }
                Ok::<(), TransportError>(())
            };
        for seg in segments {
            payload += seg.len();
            match seg {
                Segment::Shared(s) if s.shared_region().is_some() => {
                    by_ref += s.len() as u64;
                    descs.push(s);
                    parts.push(Err(descs.len() - 1));
                }
                Segment::Shared(s) => {
                    copied += s.len() as u64;
                    copy_in(&s, &mut descs, &mut parts)?;
                }
                Segment::Owned(v) if v.len() <= INLINE_MAX => parts.push(Ok(v)),
                Segment::Owned(v) => {
                    copied += v.len() as u64;
                    copy_in(&v, &mut descs, &mut parts)?;
                }
            }
        }
        // announce pools the peer has not mapped yet
        for s in &descs {
            if c.announced.insert(s.pool_id()) {
                let (_, len) = s.shared_region().expect("shared");
                let mut p = vec![TAG_POOL, 0, 0, 0, 0, 0, 0, 0];
                p.extend_from_slice(&s.pool_id().to_le_bytes());
                p.extend_from_slice(&(len as u64).to_le_bytes());
                c.queue.push_back(Out {
                    bytes: p,
                    pass: Some(s.clone()),
                    payload: 0,
                });
            }
        }
        for part in parts {
            match part {
                Ok(bytes) => {
                    pkt.push(0);
                    pkt.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                    pkt.extend_from_slice(&bytes);
                }
                Err(i) => {
                    let s = &descs[i];
                    let t = c.next_token;
                    c.next_token = c.next_token.wrapping_add(1);
                    pkt.push(1);
                    pkt.extend_from_slice(&s.pool_id().to_le_bytes());
                    pkt.extend_from_slice(&(s.region_offset() as u64).to_le_bytes());
                    pkt.extend_from_slice(&(s.len() as u32).to_le_bytes());
                    pkt.extend_from_slice(&t.to_le_bytes());
                    c.lent.insert(t, s.clone());
                }
            }
            nseg += 1;
        }
        if pkt.len() > MAX_PACKET {
            return Err(TransportError::TooLarge {
                len: pkt.len(),
                max: MAX_PACKET,
            });
        }
        pkt[nseg_at..nseg_at + 4].copy_from_slice(&nseg.to_le_bytes());
        c.seq_out += 1;
        c.queue.push_back(Out {
            bytes: pkt,
            pass: None,
            payload,
        });
        *bytes_copied += copied;
        *bytes_by_reference += by_ref;
        Ok(())
    }

    fn flush(&mut self, token: Token) {
        self.pump_deferred(token);
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        while c.writable {
            let Some(front) = c.queue.front() else { break };
            let pass = front
                .pass
                .as_ref()
                .and_then(|s| s.shared_region())
                .map(|(fd, _)| fd);
            match sys::send(c.fd.as_raw_fd(), &front.bytes, pass) {
                Ok(true) => {
                    let done = c.queue.pop_front().expect("front");
                    c.queued -= done.payload;
                }
                Ok(false) => c.writable = false,
                Err(e) if c.state == State::Closing => {
                    return self.drop_conn(token, CloseReason::Lost(e.to_string()));
                }
                Err(_) => {
                    // The peer is gone or going: what it sent before (a Bye, perhaps) is still
                    // to be read, and the end of its stream says how it left.
                    c.queue.clear();
                    c.queued = 0;
                    c.writable = false;
                    self.more_to_read.push_back(token);
                    return;
                }
            }
        }
        if let Some(c) = self.conns.get(&token) {
            if c.state == State::Closing && c.queue.is_empty() {
                let reason = c.close_reason.clone().unwrap_or(CloseReason::Local);
                self.drop_conn(token, reason);
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
                CloseReason::Protocol(_) | CloseReason::Rejected(_) => {
                    warn!(peer = %c.name, "closed: {reason}")
                }
                _ => debug!(peer = %c.name, "closed: {reason}"),
            }
            // what the peer still held of ours comes back to our pools now
            self.pending.push(Event::Closed {
                conn: ConnId(token.0 as u64),
                reason,
            });
        }
    }

    fn protocol(&mut self, token: Token, what: &'static str) {
        self.drop_conn(
            token,
            CloseReason::Protocol(WireError::OutOfRange { what, value: 0 }),
        );
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
                    if let Err(e) = self.add_conn(fd, "shm peer".into(), State::Handshaking) {
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

    /// Reads packets until the socket is empty or the budget is spent.
    fn read(&mut self, token: Token, out: &mut Vec<Event>) {
        for _ in 0..64 {
            let Some(c) = self.conns.get(&token) else {
                return;
            };
            let fd = c.fd.as_raw_fd();
            match sys::recv(fd, &mut self.buf) {
                Ok(sys::Recv::Empty) => return,
                Ok(sys::Recv::Eof) => {
                    let reason = if c.state == State::Closing {
                        CloseReason::Local
                    } else {
                        CloseReason::Lost("peer closed the stream without Bye".into())
                    };
                    return self.drop_conn(token, reason);
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
                    let pkt = self.buf[..len].to_vec();
                    if let Err(what) = self.on_packet(token, &pkt, passed, out) {
                        return self.protocol(token, what);
                    }
                }
            }
        }
        self.more_to_read.push_back(token);
    }

    fn on_packet(
        &mut self,
        token: Token,
        p: &[u8],
        passed: Option<OwnedFd>,
        out: &mut Vec<Event>,
    ) -> Result<(), &'static str> {
        let u32_at = |at: usize| {
            p.get(at..at + 4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4")))
        };
        let u64_at = |at: usize| {
            p.get(at..at + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8")))
        };
        match p.first() {
            Some(&TAG_POOL) => {
                let (id, len) = (
                    u64_at(8).ok_or("short pool packet")?,
                    u64_at(16).ok_or("short pool packet")?,
                );
                let fd = passed.ok_or("pool packet without a memfd")?;
                let c = self.conns.get_mut(&token).ok_or("gone")?;
                if c.remotes.len() >= MAX_REMOTE_POOLS {
                    return Err("too many shared pools from one peer");
                }
                let r = RemotePool::map(&c.name, fd, len as usize)
                    .map_err(|_| "cannot map the peer's pool")?;
                c.remotes.insert(id, r);
                Ok(())
            }
            Some(&TAG_RETURN) => {
                let n = u32_at(4).ok_or("short return packet")? as usize;
                let c = self.conns.get_mut(&token).ok_or("gone")?;
                for k in 0..n {
                    let t = u32_at(8 + 4 * k).ok_or("short return packet")?;
                    c.lent.remove(&t);
                }
                Ok(())
            }
            Some(&TAG_FRAME) => {
                let frame_type = FrameType::from_u8(*p.get(1).ok_or("short frame")?)
                    .map_err(|_| "unknown frame type")?;
                let count = u32_at(4).ok_or("short frame")?;
                let sequence = u64_at(8).ok_or("short frame")?;
                let nseg = u32_at(16).ok_or("short frame")?;
                let c = self.conns.get_mut(&token).ok_or("gone")?;
                if sequence != c.seq_in {
                    return Err("frame out of sequence");
                }
                c.seq_in += 1;
                let mut chain = Chain::new();
                let mut at = 20;
                for _ in 0..nseg {
                    match p.get(at) {
                        Some(0) => {
                            let len = u32_at(at + 1).ok_or("short segment")? as usize;
                            let bytes = p.get(at + 5..at + 5 + len).ok_or("short segment")?;
                            let mut rest = bytes;
                            while !rest.is_empty() {
                                let mut w = self
                                    .cfg
                                    .rx_pool
                                    .try_alloc()
                                    .ok_or("receive pool exhausted")?;
                                let n = rest.len().min(w.capacity());
                                chain.push(w.append(&rest[..n]).expect("fits"));
                                rest = &rest[n..];
                            }
                            at += 5 + len;
                        }
                        Some(1) => {
                            let pool = u64_at(at + 1).ok_or("short descriptor")?;
                            let offset = u64_at(at + 9).ok_or("short descriptor")? as usize;
                            let len = u32_at(at + 17).ok_or("short descriptor")? as usize;
                            let t = u32_at(at + 21).ok_or("short descriptor")?;
                            let r = c
                                .remotes
                                .get(&pool)
                                .ok_or("descriptor of an unknown pool")?;
                            chain.push(
                                r.slice(offset, len, t)
                                    .ok_or("descriptor outside the peer's pool")?,
                            );
                            at += 25;
                        }
                        _ => return Err("bad segment tag"),
                    }
                }
                if at != p.len() {
                    return Err("frame length disagrees with its segments");
                }
                if chain.len() > self.cfg.max_frame as usize {
                    return Err("frame larger than the limit");
                }
                self.on_frame(
                    token,
                    InFrame {
                        frame_type,
                        count,
                        sequence,
                        payload: chain,
                    },
                    out,
                );
                Ok(())
            }
            _ => Err("unknown packet"),
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
            (State::Handshaking, t) => {
                let mut send = Vec::new();
                let payload = frame.payload.to_vec();
                // same-host peers are checked by uid at accept: no secret on this transport
                let outcome = c.hs.step(&self.cfg, None, t, &payload, &c.name, &mut send);
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
                        c.state = State::Open;
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
            _ => self.protocol(token, "frame type in this connection state"),
        }
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
            for chunk in tokens.chunks((MAX_PACKET - 8) / 4) {
                let mut p = vec![TAG_RETURN, 0, 0, 0];
                p.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
                for t in chunk {
                    p.extend_from_slice(&t.to_le_bytes());
                }
                c.queue.push_back(Out {
                    bytes: p,
                    pass: None,
                    payload: 0,
                });
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
                    .add_conn(fd, addr.to_string(), State::Handshaking)
                    .map_err(err)?;
                let (hs, bytes) = Handshake::connect(hello, None)?;
                if let Some(c) = self.conns.get_mut(&token) {
                    c.hs = hs;
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
        out.append(&mut self.pending);
        let timeout = if !out.is_empty() || !self.more_to_read.is_empty() {
            Some(Duration::ZERO)
        } else {
            // returned tokens are noticed on the next pass: do not sleep long while any is lent
            timeout
        };
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
                self.read(token, out);
            }
        }
        for token in std::mem::take(&mut self.more_to_read) {
            self.read(token, out);
        }
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

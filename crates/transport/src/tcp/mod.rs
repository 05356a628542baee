//! The `tcp` transport: non-blocking sockets on one mio (epoll) loop, a send queue per
//! connection written with writev, reads straight into receive-pool blocks.
//!
//! Here: the transport, its connections and `poll`. Reading and writing one connection is in
//! `conn_io.rs`, the limits on unfinished handshakes in `admission.rs`, the byte stream in
//! `rx.rs` and `tx.rs` (frames cut and numbered by `crate::framing`), send threads in
//! `writer.rs`.

mod admission;
mod conn_io;
mod multipath;
mod rx;
mod tx;
mod writer;

pub use admission::Admission;
pub use writer::MAX_SEND_THREADS;

use std::collections::VecDeque;
use std::sync::Arc;

use evb_buffers::small_keys::{SmallKeyMap, SmallKeySet};
use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Poll, Token};
use tracing::{debug, warn};

use evb_wire::{version_refusal, FrameType, Hello, WireError};

use crate::handshake::{Handshake, Outcome};
use crate::log_limit::Tally;
use crate::{
    CloseReason, ConnId, Event, InFrame, Segment, Transport, TransportConfig, TransportError,
};
use rx::{HandshakeRead, ReadOutcome, RxAssembler, RxError};
use tx::TxQueue;
use writer::{Outbox, SendThreads, WAKE};

/// Reads per connection per poll pass, so one busy peer cannot starve the others.
const READ_BUDGET: usize = 16;

/// Connections accepted per listener per poll pass, so that a connect flood cannot keep the
/// loop from its open connections (heartbeats, data).
const ACCEPT_BUDGET: usize = 32;

/// Largest handshake frame (Hello, HelloAck, Reject, Auth) accepted. The real ones are under
/// 1.1 KiB (two names of at most 64 bytes; a reason of at most 1 KiB; a 32-byte proof). They
/// are read into a small buffer of the connection's own: a peer gets receive-pool blocks
/// only once its handshake has succeeded.
pub const HANDSHAKE_FRAME_MAX: u32 = 2048;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// TCP connect in progress (outbound).
    Connecting,
    /// Exchanging Hellos (and proofs): where it stands is the connection's `Handshake`.
    Handshaking,
    Open,
    /// Flushing what is queued, then shutting down our side.
    Closing,
    /// Our side is shut; discarding input until the peer closes (avoids a reset that could
    /// destroy data the peer has not read yet).
    Draining,
}

/// How long a connection we close may take to hand its queue to a peer that does not read.
const CLOSE_LINGER: Duration = Duration::from_secs(10);

struct Conn {
    stream: TcpStream,
    addr: String,
    state: State,
    rx: RxAssembler,
    tx: TxQueue,
    writable: bool,
    /// Why we are closing, reported once the socket is gone.
    close_reason: Option<CloseReason>,
    /// While closing: since when the queue has not shrunk, and its size then. A peer that
    /// reads nothing for `CLOSE_LINGER` is dropped.
    closing_since: Option<Instant>,
    closing_left: usize,
    hs: Handshake,
    /// The handshake succeeded: from then on reads go into receive-pool blocks.
    admitted: bool,
    /// For an incoming connection: the peer's IP and when it was accepted (until admitted).
    inbound: Option<(IpAddr, Instant)>,
    /// Once open, with send threads: which thread writes the socket, and the frames for it
    /// (`tx` is then unused).
    sender: Option<(usize, Arc<Outbox>)>,
}

impl Conn {
    /// Bytes queued and not yet taken by the kernel.
    fn queued(&self) -> usize {
        match &self.sender {
            Some((_, o)) => o.queued(),
            None => self.tx.bytes(),
        }
    }
}

/// See the module docs.
pub struct TcpTransport {
    poll: Poll,
    events: mio::Events,
    cfg: TransportConfig,
    listeners: SmallKeyMap<Token, TcpListener>,
    conns: SmallKeyMap<Token, Conn>,
    next_token: usize,
    /// Connections that may have more to read without a new readiness event.
    more_to_read: VecDeque<Token>,
    /// Listeners that may have more connections waiting (the accept budget ran out).
    more_to_accept: Vec<Token>,
    /// Connections waiting for receive-pool blocks.
    starved: SmallKeySet<Token>,
    frames: Vec<InFrame>,
    /// Events produced outside `poll` (a failed write inside `send`), reported by the next poll.
    pending_events: Vec<Event>,
    admission: Admission,
    /// One warning per few seconds about refused or failed handshakes, with a count.
    /// Refused strangers, every reason kept (one line per few seconds).
    refusals: Tally,
    /// Send threads, when asked for (`Transport::set_send_threads`).
    senders: Option<SendThreads>,
    /// Sockets are MPTCP (`TcpTransport::multipath`): the kernel spreads each connection
    /// over the host's rails.
    multipath: bool,
}

impl TcpTransport {
    pub fn new(cfg: TransportConfig) -> io::Result<Self> {
        Ok(TcpTransport {
            poll: Poll::new()?,
            events: mio::Events::with_capacity(256),
            cfg,
            listeners: SmallKeyMap::default(),
            conns: SmallKeyMap::default(),
            next_token: 1,
            more_to_read: VecDeque::new(),
            more_to_accept: Vec::new(),
            starved: SmallKeySet::default(),
            frames: Vec::new(),
            pending_events: Vec::new(),
            admission: Admission::default(),
            refusals: Tally::new(Duration::from_secs(5)),
            senders: None,
            multipath: false,
        })
    }

    /// A transport whose connections are Multipath TCP: each one spread by the kernel over
    /// every rail (network) the two hosts share, and kept up on the others when a rail is
    /// lost. The rails are the hosts' MPTCP endpoints (`ip mptcp endpoint`; docs/scaling.md,
    /// "Several rails"). A peer without MPTCP is spoken to over plain TCP.
    ///
    /// # Errors
    /// This kernel has no MPTCP, or it is turned off (`net.mptcp.enabled`): a run asked for
    /// rails fails here, at the start, rather than running on one.
    pub fn multipath(cfg: TransportConfig) -> io::Result<Self> {
        multipath::available()?;
        let mut t = Self::new(cfg)?;
        t.multipath = true;
        Ok(t)
    }

    /// A connection just opened: with send threads, one of them writes it from now on.
    fn hand_over(&mut self, token: Token, out: &mut Vec<Event>) {
        let (Some(senders), Some(c)) = (self.senders.as_mut(), self.conns.get_mut(&token)) else {
            return;
        };
        match senders.adopt(token, &c.stream, &mut c.tx) {
            Ok(None) => {}
            Ok(Some(s)) => {
                // the thread watches writability; this loop only reads
                let _ = self
                    .poll
                    .registry()
                    .reregister(&mut c.stream, token, Interest::READABLE);
                c.sender = Some(s);
            }
            Err(e) => self.drop_conn(token, CloseReason::Lost(format!("send thread: {e}")), out),
        }
    }

    /// Connections whose send thread failed to write are lost. (Closing ones whose queue the
    /// thread emptied are shut down by the end of `poll`, as those written here.)
    fn check_senders(&mut self, out: &mut Vec<Event>) {
        let mut failed = Vec::new();
        for (t, c) in &self.conns {
            if let Some(why) = c.sender.as_ref().and_then(|(_, o)| o.failure()) {
                failed.push((*t, why));
            }
        }
        for (t, why) in failed {
            self.write_failed(t, why, out);
        }
    }

    /// Changes what unauthenticated incoming connections may cost (see [`Admission`]).
    pub fn set_admission(&mut self, admission: Admission) {
        self.admission = admission;
    }

    fn token(&mut self) -> Token {
        let t = Token(self.next_token);
        self.next_token += 1;
        t
    }

    fn add_conn(
        &mut self,
        mut stream: TcpStream,
        addr: String,
        state: State,
        inbound: Option<IpAddr>,
    ) -> io::Result<Token> {
        let token = self.token();
        self.poll.registry().register(
            &mut stream,
            token,
            Interest::READABLE | Interest::WRITABLE,
        )?;
        let rx = RxAssembler::new(self.cfg.rx_pool.clone(), self.cfg.max_frame);
        self.conns.insert(
            token,
            Conn {
                stream,
                addr,
                hs: Handshake::accept(),
                state,
                rx,
                tx: TxQueue::default(),
                writable: false,
                close_reason: None,
                closing_since: None,
                closing_left: 0,
                admitted: false,
                inbound: inbound.map(|ip| (ip, Instant::now())),
                sender: None,
            },
        );
        Ok(token)
    }

    fn accept_all(&mut self, lt: Token) {
        for _ in 0..ACCEPT_BUDGET {
            let accepted = match self.listeners.get(&lt) {
                Some(l) => l.accept(),
                None => return,
            };
            match accepted {
                Ok((stream, peer)) => {
                    if !self.make_room(peer.ip()) {
                        let why = format!(
                            "closed at once: too many connections still handshaking, each with \
                             its Hello sent less than {} ms ago (limits: {} per IP, {} in all)",
                            self.admission.shed_after.as_millis(),
                            self.admission.per_ip,
                            self.admission.total
                        );
                        if let Some(line) = self.refusals.tick(&why) {
                            warn!(%peer, "refused incoming connections before their handshake, {line}");
                        }
                        drop(stream);
                        continue;
                    }
                    // Control and data both want their bytes out now: evb batches in
                    // messaging, so Nagle would only add delay.
                    let _ = stream.set_nodelay(true);
                    let ip = Some(peer.ip());
                    match self.add_conn(stream, peer.to_string(), State::Handshaking, ip) {
                        // its Hello, if it came with the connection, is read at once: a
                        // peer that sent one is not shed for the next newcomer
                        Ok(token) => {
                            let mut out = Vec::new();
                            self.on_readable(token, &mut out);
                            self.pending_events.extend(out);
                        }
                        Err(e) => warn!(%peer, "cannot register accepted connection: {e}"),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    warn!("accept failed: {e}");
                    return;
                }
            }
        }
        // budget spent: more may be waiting, and no new readiness event will say so
        self.more_to_accept.push(lt);
    }

    /// Starts an orderly close: flush, then shut down and drain.
    fn begin_close(&mut self, token: Token, reason: CloseReason) {
        if let Some(c) = self.conns.get_mut(&token) {
            if matches!(c.state, State::Closing | State::Draining) {
                return;
            }
            c.state = State::Closing;
            c.close_reason = Some(reason);
            c.closing_since = Some(Instant::now());
        }
    }

    /// Drops the socket now and reports why.
    fn drop_conn(&mut self, token: Token, reason: CloseReason, out: &mut Vec<Event>) {
        if let Some(mut c) = self.conns.remove(&token) {
            let _ = self.poll.registry().deregister(&mut c.stream);
            if let Some(s) = self.senders.as_mut() {
                s.forget(c.sender.as_ref().map(|(thread, _)| *thread), token);
            }
            let reason = c.close_reason.take().unwrap_or(reason);
            let loud = matches!(reason, CloseReason::Protocol(_) | CloseReason::Rejected(_));
            if loud && !c.admitted && c.inbound.is_some() {
                // a stranger's failed handshake: a flood of them is one line now and then
                if let Some(line) = self.refusals.tick(&reason.to_string()) {
                    warn!(peer = %c.addr, "refused incoming connections before their handshake, {line}");
                }
            } else if loud {
                warn!(peer = %c.addr, "closed: {reason}")
            } else {
                debug!(peer = %c.addr, "closed: {reason}")
            }
            out.push(Event::Closed {
                conn: ConnId(token.0 as u64),
                reason,
            });
        }
        self.starved.remove(&token);
    }
}

fn resolve(addr: &str) -> Result<SocketAddr, TransportError> {
    addr.to_socket_addrs()
        .map_err(|_| TransportError::BadAddress(addr.to_string()))?
        .next()
        .ok_or_else(|| TransportError::BadAddress(addr.to_string()))
}

impl Transport for TcpTransport {
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        Some(self.poll.as_raw_fd())
    }

    fn listen(&mut self, addr: &str) -> Result<String, TransportError> {
        let sa = resolve(addr)?;
        let io_err = |source| TransportError::Io {
            addr: addr.to_string(),
            source,
        };
        // a socket the launcher bound for this address and handed over: never released
        let mut l = match crate::inherited::listener(sa) {
            Some(inherited) => {
                if self.multipath {
                    warn!(%addr, "a listening socket from the launcher is plain TCP: connections to it take one rail");
                }
                let l = inherited.map_err(io_err)?;
                l.set_nonblocking(true).map_err(io_err)?;
                TcpListener::from_std(l)
            }
            None if self.multipath => multipath::listen(sa).map_err(io_err)?,
            None => TcpListener::bind(sa).map_err(io_err)?,
        };
        let local = l.local_addr().map_err(io_err)?;
        let token = self.token();
        self.poll
            .registry()
            .register(&mut l, token, Interest::READABLE)
            .map_err(io_err)?;
        self.listeners.insert(token, l);
        Ok(local.to_string())
    }

    fn connect(&mut self, addr: &str, hello: Hello) -> Result<ConnId, TransportError> {
        let sa = resolve(addr)?;
        let io_err = |source| TransportError::Io {
            addr: addr.to_string(),
            source,
        };
        let stream = if self.multipath {
            multipath::connect(sa).map_err(io_err)?
        } else {
            TcpStream::connect(sa).map_err(io_err)?
        };
        let token = self
            .add_conn(stream, addr.to_string(), State::Connecting, None)
            .map_err(io_err)?;
        let c = self.conns.get_mut(&token).expect("just added");
        let (hs, bytes) = Handshake::connect(hello, self.cfg.secret.as_deref())?;
        c.hs = hs;
        c.tx.push(FrameType::Hello, 0, vec![Segment::Owned(bytes)]);
        Ok(ConnId(token.0 as u64))
    }

    fn send(
        &mut self,
        conn: ConnId,
        frame_type: FrameType,
        count: u32,
        segments: Vec<Segment>,
    ) -> Result<(), TransportError> {
        let token = Token(conn.0 as usize);
        let max = self.cfg.max_frame as usize;
        let c = self
            .conns
            .get_mut(&token)
            .ok_or(TransportError::NoConnection(conn))?;
        if c.state != State::Open {
            return Err(TransportError::NotOpen(conn));
        }
        let len: usize = segments.iter().map(Segment::len).sum();
        if len > max {
            return Err(TransportError::TooLarge { len, max });
        }
        if let Some((thread, outbox)) = &c.sender {
            if outbox.push(frame_type, count, segments) {
                if let Some(s) = &self.senders {
                    s.kick(*thread, token);
                }
            }
            return Ok(());
        }
        let was_empty = c.tx.is_empty();
        c.tx.push(frame_type, count, segments);
        if was_empty {
            // Low latency: try now rather than on the next poll.
            // A failed write is reported by the next poll.
            let mut evs = Vec::new();
            self.flush(token, &mut evs);
            self.pending_events.extend(evs);
        }
        Ok(())
    }

    /// At most [`MAX_SEND_THREADS`]; they start with the first connection that opens.
    fn expect_peers(&mut self, peers: usize) {
        let deadline = self.admission.handshake_deadline;
        self.admission = Admission {
            handshake_deadline: deadline,
            ..Admission::for_peers(peers)
        };
    }

    fn set_send_threads(&mut self, n: usize) -> Result<(), TransportError> {
        if n > MAX_SEND_THREADS {
            return Err(TransportError::Unavailable(format!(
                "send threads {n}: at most {MAX_SEND_THREADS}"
            )));
        }
        if self.senders.as_ref().map_or(0, SendThreads::wanted) == n {
            return Ok(());
        }
        if self.senders.is_some() {
            return Err(TransportError::Unavailable(
                "send threads are set once, before connections open".into(),
            ));
        }
        if n > 0 {
            let waker =
                mio::Waker::new(self.poll.registry(), WAKE).map_err(|e| TransportError::Io {
                    addr: "send threads".into(),
                    source: e,
                })?;
            self.senders = Some(SendThreads::new(n, Arc::new(waker)));
        }
        Ok(())
    }

    fn queued_bytes(&self, conn: ConnId) -> usize {
        self.conns
            .get(&Token(conn.0 as usize))
            .map_or(0, Conn::queued)
    }

    fn close(&mut self, conn: ConnId) {
        let token = Token(conn.0 as usize);
        let mut evs = Vec::new();
        match self.conns.get(&token).map(|c| c.state) {
            Some(State::Open) => {
                let c = self.conns.get_mut(&token).expect("present");
                match &c.sender {
                    Some((thread, outbox)) => {
                        if outbox.push(FrameType::Bye, 0, Vec::new()) {
                            if let Some(s) = &self.senders {
                                s.kick(*thread, token);
                            }
                        }
                    }
                    None => c.tx.push(FrameType::Bye, 0, Vec::new()),
                }
                self.begin_close(token, CloseReason::Local);
                self.flush(token, &mut evs);
            }
            Some(State::Closing | State::Draining) | None => {}
            Some(_) => self.drop_conn(token, CloseReason::Local, &mut evs),
        }
        self.pending_events.extend(evs);
    }

    fn poll(&mut self, out: &mut Vec<Event>, timeout: Option<Duration>) -> io::Result<()> {
        out.append(&mut self.pending_events);
        // the last refusals of a flood are said once its period is over, even if none follows
        if let Some(line) = self.refusals.due() {
            warn!("refused incoming connections before their handshake, {line}");
        }
        let timeout = if !out.is_empty()
            || !self.more_to_read.is_empty()
            || !self.more_to_accept.is_empty()
        {
            Some(Duration::ZERO)
        } else if !self.starved.is_empty() {
            Some(timeout.map_or(Duration::from_millis(1), |t| {
                t.min(Duration::from_millis(1))
            }))
        } else {
            timeout
        };
        // wake up in time to close a handshake that is overdue
        let timeout = match self.next_deadline() {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                Some(timeout.map_or(left, |t| t.min(left)))
            }
            None => timeout,
        };
        // send threads wake this poll when they made progress (see tcp/writer.rs)
        let polled = self.poll.poll(&mut self.events, timeout);
        if self.senders.as_mut().is_some_and(SendThreads::woke) {
            self.check_senders(out);
        }
        match polled {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        let ready = crate::readiness::ready(&self.events);
        for (token, readable, writable) in ready {
            if token == WAKE {
                continue;
            }
            if self.listeners.contains_key(&token) {
                self.accept_all(token);
                continue;
            }
            if writable {
                self.on_writable(token, out);
            }
            if readable {
                self.on_readable(token, out);
            }
        }
        for token in std::mem::take(&mut self.more_to_read) {
            self.on_readable(token, out);
        }
        for token in std::mem::take(&mut self.more_to_accept) {
            self.accept_all(token);
        }
        for token in self.starved.iter().copied().collect::<Vec<_>>() {
            self.on_readable(token, out);
        }
        self.expire_handshakes(out);
        // A peer that stopped reading cannot keep a closing connection (and its queue) forever.
        let mut clock = None;
        let mut stuck = Vec::new();
        for (t, c) in self.conns.iter_mut() {
            let Some(since) = c.closing_since else {
                continue;
            };
            let now = *clock.get_or_insert_with(Instant::now);
            let left = c.queued();
            if left != c.closing_left {
                c.closing_left = left;
                c.closing_since = Some(now);
            } else if now.duration_since(since) >= CLOSE_LINGER {
                stuck.push(*t);
            }
        }
        for t in stuck {
            let queued = self.conns.get(&t).map_or(0, Conn::queued);
            warn!(
                "closing connection dropped after {} s: the peer read nothing more ({queued} bytes unsent)",
                CLOSE_LINGER.as_secs()
            );
            self.drop_conn(t, CloseReason::Local, out);
        }
        // Connections closing with an empty queue still need their shutdown step.
        let closing: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| c.state == State::Closing && c.queued() == 0)
            .map(|(t, _)| *t)
            .collect();
        for t in closing {
            if let Some(c) = self.conns.get_mut(&t) {
                c.writable = true;
            }
            self.flush(t, out);
        }
        Ok(())
    }
}

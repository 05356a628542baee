//! The `tcp` transport: non-blocking sockets on one mio (epoll) loop, a send queue per
//! connection written with writev, reads straight into receive-pool blocks.

mod rx;
mod tx;

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Poll, Token};
use tracing::{debug, warn};

use evb_wire::{FrameType, Hello, Reject, RejectCode, WireError};

use crate::{
    auth, CloseReason, ConnId, Event, InFrame, Segment, Transport, TransportConfig, TransportError,
};
use rx::{ReadOutcome, RxAssembler, RxError};
use tx::TxQueue;

/// Reads per connection per poll pass, so one busy peer cannot starve the others.
const READ_BUDGET: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// TCP connect in progress (outbound).
    Connecting,
    /// Our Hello is queued; waiting for HelloAck or Reject (outbound).
    AwaitAck,
    /// Accepted; waiting for the peer's Hello (inbound).
    AwaitHello,
    /// Secret in use: waiting for the peer's Auth proof (either side).
    AwaitAuth,
    Open,
    /// Flushing what is queued, then shutting down our side.
    Closing,
    /// Our side is shut; discarding input until the peer closes (avoids a reset that could
    /// destroy data the peer has not read yet).
    Draining,
}

struct Conn {
    stream: TcpStream,
    addr: String,
    state: State,
    rx: RxAssembler,
    tx: TxQueue,
    writable: bool,
    /// Why we are closing, reported once the socket is gone.
    close_reason: Option<CloseReason>,
    /// The connector's Hello and the acceptor's HelloAck, as sent: what Auth proofs cover.
    hello: Vec<u8>,
    ack: Vec<u8>,
    /// The peer's handshake, held until its Auth proof checks out.
    peer: Option<Hello>,
    outbound: bool,
}

/// See the module docs.
pub struct TcpTransport {
    poll: Poll,
    events: mio::Events,
    cfg: TransportConfig,
    listeners: HashMap<Token, TcpListener>,
    conns: HashMap<Token, Conn>,
    next_token: usize,
    /// Connections that may have more to read without a new readiness event.
    more_to_read: VecDeque<Token>,
    /// Connections waiting for receive-pool blocks.
    starved: HashSet<Token>,
    frames: Vec<InFrame>,
    /// Events produced outside `poll` (a failed write inside `send`), reported by the next poll.
    pending_events: Vec<Event>,
}

impl TcpTransport {
    pub fn new(cfg: TransportConfig) -> io::Result<Self> {
        Ok(TcpTransport {
            poll: Poll::new()?,
            events: mio::Events::with_capacity(256),
            cfg,
            listeners: HashMap::new(),
            conns: HashMap::new(),
            next_token: 1,
            more_to_read: VecDeque::new(),
            starved: HashSet::new(),
            frames: Vec::new(),
            pending_events: Vec::new(),
        })
    }

    fn token(&mut self) -> Token {
        let t = Token(self.next_token);
        self.next_token += 1;
        t
    }

    fn add_conn(&mut self, mut stream: TcpStream, addr: String, state: State) -> io::Result<Token> {
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
                outbound: state == State::Connecting,
                state,
                rx,
                tx: TxQueue::default(),
                writable: false,
                close_reason: None,
                hello: Vec::new(),
                ack: Vec::new(),
                peer: None,
            },
        );
        Ok(token)
    }

    fn accept_all(&mut self, lt: Token) {
        loop {
            let accepted = match self.listeners.get(&lt) {
                Some(l) => l.accept(),
                None => return,
            };
            match accepted {
                Ok((stream, peer)) => {
                    // Control and data both want their bytes out now: evb batches in
                    // messaging, so Nagle would only add delay.
                    let _ = stream.set_nodelay(true);
                    if let Err(e) = self.add_conn(stream, peer.to_string(), State::AwaitHello) {
                        warn!(%peer, "cannot register accepted connection: {e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    warn!("accept failed: {e}");
                    return;
                }
            }
        }
    }

    /// Starts an orderly close: flush, then shut down and drain.
    fn begin_close(&mut self, token: Token, reason: CloseReason) {
        if let Some(c) = self.conns.get_mut(&token) {
            if matches!(c.state, State::Closing | State::Draining) {
                return;
            }
            c.state = State::Closing;
            c.close_reason = Some(reason);
        }
    }

    /// Drops the socket now and reports why.
    fn drop_conn(&mut self, token: Token, reason: CloseReason, out: &mut Vec<Event>) {
        if let Some(mut c) = self.conns.remove(&token) {
            let _ = self.poll.registry().deregister(&mut c.stream);
            let reason = c.close_reason.take().unwrap_or(reason);
            match &reason {
                CloseReason::Protocol(_) | CloseReason::Rejected(_) => {
                    warn!(peer = %c.addr, "closed: {reason}")
                }
                _ => debug!(peer = %c.addr, "closed: {reason}"),
            }
            out.push(Event::Closed {
                conn: ConnId(token.0 as u64),
                reason,
            });
        }
        self.starved.remove(&token);
    }

    fn on_writable(&mut self, token: Token, out: &mut Vec<Event>) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if c.state == State::Connecting {
            match c.stream.take_error() {
                Ok(Some(e)) | Err(e) => {
                    return self.drop_conn(token, CloseReason::ConnectFailed(e.to_string()), out);
                }
                Ok(None) => {}
            }
            match c.stream.peer_addr() {
                Ok(_) => {
                    let _ = c.stream.set_nodelay(true);
                    c.state = State::AwaitAck;
                }
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return,
                Err(e) => {
                    return self.drop_conn(token, CloseReason::ConnectFailed(e.to_string()), out)
                }
            }
        }
        c.writable = true;
        self.flush(token, out);
    }

    fn flush(&mut self, token: Token, out: &mut Vec<Event>) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if !c.writable || c.state == State::Connecting || c.state == State::Draining {
            return;
        }
        match c.tx.write_to(&mut c.stream) {
            Ok(true) => {
                if c.state == State::Closing {
                    let _ = c.stream.shutdown(Shutdown::Write);
                    c.state = State::Draining;
                    // Input may already be at EOF with no new readiness event to come.
                    self.more_to_read.push_back(token);
                }
            }
            Ok(false) => c.writable = false,
            Err(e) => self.drop_conn(token, CloseReason::Lost(e.to_string()), out),
        }
    }

    fn on_readable(&mut self, token: Token, out: &mut Vec<Event>) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if c.state == State::Connecting {
            return self.on_writable(token, out);
        }
        if c.state == State::Draining {
            let mut sink = [0u8; 4096];
            loop {
                match io::Read::read(&mut c.stream, &mut sink) {
                    Ok(0) => return self.drop_conn(token, CloseReason::Local, out),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(_) => return self.drop_conn(token, CloseReason::Local, out),
                }
            }
        }
        let mut frames = std::mem::take(&mut self.frames);
        let outcome = c.rx.read_from(&mut c.stream, &mut frames, READ_BUDGET);
        self.starved.remove(&token);
        for f in frames.drain(..) {
            self.on_frame(token, f, out);
        }
        self.frames = frames;
        if !self.conns.contains_key(&token) {
            return;
        }
        match outcome {
            Ok(ReadOutcome::WouldBlock) => {}
            Ok(ReadOutcome::Budget) => self.more_to_read.push_back(token),
            Ok(ReadOutcome::Starved) => {
                self.starved.insert(token);
            }
            Ok(ReadOutcome::Eof) => {
                let state = self.conns[&token].state;
                let reason = if state == State::Closing {
                    CloseReason::Local
                } else {
                    CloseReason::Lost("peer closed the stream without Bye".into())
                };
                self.drop_conn(token, reason, out)
            }
            Err(RxError::Io(e)) => self.drop_conn(token, CloseReason::Lost(e.to_string()), out),
            Err(RxError::Wire(e)) => self.drop_conn(token, CloseReason::Protocol(e), out),
        }
    }

    /// Answers a Hello with a Reject, logs why, and closes.
    fn refuse(
        &mut self,
        token: Token,
        code: RejectCode,
        peer: &Hello,
        reason: String,
        out: &mut Vec<Event>,
    ) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        warn!(peer = %c.addr, node = %peer.node_id, "refusing connection: {reason}");
        let reject = Reject {
            code,
            reason: reason.clone(),
        };
        c.tx.push(FrameType::Reject, 0, vec![Segment::Owned(reject.encode())]);
        self.begin_close(token, CloseReason::Rejected(reason));
        self.flush(token, out);
    }

    fn on_frame(&mut self, token: Token, frame: InFrame, out: &mut Vec<Event>) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let conn = ConnId(token.0 as u64);
        match (c.state, frame.frame_type) {
            (State::Open, FrameType::Messages) => out.push(Event::Frame { conn, frame }),
            (State::Open, FrameType::Bye) => self.drop_conn(token, CloseReason::PeerClosed, out),
            (State::Closing, _) => {} // we are leaving; late input is dropped
            (State::AwaitHello, FrameType::Hello) => {
                let bytes = frame.payload.to_vec();
                match Hello::decode(&bytes) {
                    Ok(peer) if peer.run_id != self.cfg.run_id => {
                        let reason = format!(
                            "run id {:?} is not this run ({:?})",
                            peer.run_id, self.cfg.run_id
                        );
                        self.refuse(token, RejectCode::WrongRun, &peer, reason, out);
                    }
                    Ok(peer) if self.cfg.secret.is_some() && peer.nonce == 0 => {
                        let reason =
                            "this run requires authentication (set run.secret or EVB_SECRET)"
                                .to_string();
                        self.refuse(token, RejectCode::BadHandshake, &peer, reason, out);
                    }
                    Ok(peer) => {
                        let mut local = self.cfg.local.clone();
                        local.nonce = if self.cfg.secret.is_some() {
                            auth::nonce()
                        } else {
                            0
                        };
                        let ack = local.encode().unwrap_or_default();
                        c.tx.push(FrameType::HelloAck, 0, vec![Segment::Owned(ack.clone())]);
                        if let Some(secret) = &self.cfg.secret {
                            let proof = auth::acceptor_proof(secret, &bytes, &ack);
                            c.tx.push(FrameType::Auth, 0, vec![Segment::Owned(proof)]);
                            c.hello = bytes;
                            c.ack = ack;
                            c.peer = Some(peer);
                            c.state = State::AwaitAuth;
                        } else {
                            c.state = State::Open;
                            debug!(peer = %c.addr, node = %peer.node_id, "accepted");
                            out.push(Event::Accepted { conn, peer });
                        }
                        self.flush(token, out);
                    }
                    Err(e) => self.drop_conn(token, CloseReason::Protocol(e), out),
                }
            }
            (State::AwaitAck, FrameType::HelloAck) => {
                let bytes = frame.payload.to_vec();
                match Hello::decode(&bytes) {
                    Ok(peer) => match (&self.cfg.secret, peer.nonce) {
                        (None, 0) => {
                            c.state = State::Open;
                            out.push(Event::Connected { conn, peer });
                        }
                        (None, _) => {
                            let why =
                                "the peer requires a shared secret and none is configured".into();
                            self.drop_conn(token, CloseReason::Rejected(why), out)
                        }
                        (Some(_), 0) => {
                            let why =
                                "the peer does not authenticate; refusing to talk to it".into();
                            self.drop_conn(token, CloseReason::Rejected(why), out)
                        }
                        (Some(_), _) => {
                            c.ack = bytes;
                            c.peer = Some(peer);
                            c.state = State::AwaitAuth;
                        }
                    },
                    Err(e) => self.drop_conn(token, CloseReason::Protocol(e), out),
                }
            }
            (State::AwaitAuth, FrameType::Auth) => {
                let proof = frame.payload.to_vec();
                let secret = self.cfg.secret.clone().unwrap_or_default();
                // Each side checks the other's proof: an outbound connection checks the acceptor's.
                if !auth::check(&secret, c.outbound, &c.hello, &c.ack, &proof) {
                    warn!(peer = %c.addr, "authentication failed: wrong shared secret");
                    let why = "authentication failed: wrong shared secret".into();
                    return self.drop_conn(token, CloseReason::Rejected(why), out);
                }
                let peer = c.peer.take().expect("held while awaiting auth");
                c.state = State::Open;
                if c.outbound {
                    let mine = auth::connector_proof(&secret, &c.hello, &c.ack);
                    c.tx.push(FrameType::Auth, 0, vec![Segment::Owned(mine)]);
                    out.push(Event::Connected { conn, peer });
                    self.flush(token, out);
                } else {
                    debug!(peer = %c.addr, node = %peer.node_id, "accepted (authenticated)");
                    out.push(Event::Accepted { conn, peer });
                }
            }
            (State::AwaitAck | State::AwaitAuth, FrameType::Reject) => {
                let why = match Reject::decode(&frame.payload.to_vec()) {
                    Ok(r) => r.reason,
                    Err(e) => format!("undecodable reject: {e}"),
                };
                self.drop_conn(token, CloseReason::Rejected(why), out)
            }
            (_, t) => {
                let e = WireError::OutOfRange {
                    what: "frame type in this connection state",
                    value: t as u64,
                };
                self.drop_conn(token, CloseReason::Protocol(e), out)
            }
        }
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
        let mut l = TcpListener::bind(sa).map_err(io_err)?;
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
        let stream = TcpStream::connect(sa).map_err(io_err)?;
        let token = self
            .add_conn(stream, addr.to_string(), State::Connecting)
            .map_err(io_err)?;
        let c = self.conns.get_mut(&token).expect("just added");
        let mut hello = hello;
        hello.nonce = if self.cfg.secret.is_some() {
            auth::nonce()
        } else {
            0
        };
        let bytes = hello.encode()?;
        c.hello = bytes.clone();
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

    fn queued_bytes(&self, conn: ConnId) -> usize {
        self.conns
            .get(&Token(conn.0 as usize))
            .map_or(0, |c| c.tx.bytes())
    }

    fn close(&mut self, conn: ConnId) {
        let token = Token(conn.0 as usize);
        let mut evs = Vec::new();
        match self.conns.get(&token).map(|c| c.state) {
            Some(State::Open) => {
                let c = self.conns.get_mut(&token).expect("present");
                c.tx.push(FrameType::Bye, 0, Vec::new());
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
        let timeout = if !out.is_empty() || !self.more_to_read.is_empty() {
            Some(Duration::ZERO)
        } else if !self.starved.is_empty() {
            Some(timeout.map_or(Duration::from_millis(1), |t| {
                t.min(Duration::from_millis(1))
            }))
        } else {
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
                    e.is_readable() || e.is_read_closed() || e.is_error(),
                    e.is_writable() || e.is_error(),
                )
            })
            .collect();
        for (token, readable, writable) in ready {
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
        for token in self.starved.iter().copied().collect::<Vec<_>>() {
            self.on_readable(token, out);
        }
        // Connections closing with an empty queue still need their shutdown step.
        let closing: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| c.state == State::Closing && c.tx.is_empty())
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

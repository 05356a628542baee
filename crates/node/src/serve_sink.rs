//! The serve sink (`sink.kind = "serve"`): built events served over TCP to consumer
//! processes (`evb consume`, or any program speaking docs/protocol.md §7).
//!
//! - An event is served only once the EVM accepted the BU's release of it (`Sink::accepted`):
//!   a BU the EVM dropped never hands out an event that is built elsewhere as well.
//! - Each event goes to one consumer at a time, and is held (its receive-pool blocks) until
//!   that consumer acknowledges it. A consumer whose connection closes, that breaks the
//!   protocol, or that holds events without acknowledging any for `sink.serve_ack_timeout_s`
//!   is dropped; its unacknowledged events go back to the front of the queue for another.
//! - The sink holds at most `sink.serve_hold` events; beyond that (or with no consumer at
//!   all) it is busy and the BU keeps its events and their credits: back-pressure to the
//!   trigger, never a drop.
//! - At the end of the run the BU waits up to `sink.serve_drain_timeout_s` for every event
//!   to be acknowledged; what is not is counted lost (`output_lost`, judged by the verdict).
//!
//! - A connection earns events by its handshake: a Hello naming the run and, when the run
//!   has a secret, an Auth proving it (docs/protocol.md §7.3). The handshake must finish
//!   within 5 s of the accept; unfinished handshakes are bounded per source IP and, when
//!   every slot is taken, the oldest is shed, so stalled sockets cannot keep a consumer out.
//!
//! Threads: one acceptor, which also runs every handshake (non-blocking sockets, poll(2))
//! and the ack-timeout check, and per served consumer one reader (its acks) and one writer.
//! They share one mutex-guarded state with the sink, which the BU's event loop calls.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use evb_buffers::Chain;
use evb_builder::{BuiltEvent, Sink, SinkError};
use evb_formats::events::{
    event_header, EVENT_CORRUPT, EVENT_HEADER_LEN, EVENT_PARTIAL, EVENT_TRIGGER_MISMATCH,
};
use evb_wire::consumer::{
    proof_key, ConsumerFrame, ConsumerHeader, ConsumerHello, ConsumerMsg, ProofRole, RefuseCode,
    Welcome, CONSUMER_HEADER_LEN, CONSUMER_MAX_HANDSHAKE, PROOF_LEN,
};
use evb_wire::{FragmentHeader, FRAGMENT_HEADER_LEN};
use serde_json::{json, Value};
use tracing::{error, info, warn};

/// Connections at once (handshaking or serving). A new one beyond sheds the oldest
/// unfinished handshake; it is refused only when every slot is a consumer being served.
const MAX_CONNECTIONS: usize = 64;
/// Connections from one source IP still handshaking at once; a new one beyond sheds that
/// address's oldest.
const MAX_HANDSHAKES_PER_IP: usize = 8;
/// A connection must finish its handshake (Hello, and Auth with a secret) within this of
/// being accepted: a whole deadline, however its bytes trickle.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);

pub struct ServeOptions {
    pub listen: String,
    pub run_id: String,
    pub bu_id: String,
    pub bu_index: u16,
    pub max_held: u32,
    pub hold: usize,
    pub ack_timeout: Duration,
    pub drain_timeout: Duration,
    /// The run's secret: every consumer must prove it (Challenge / Auth) before it is served.
    pub secret: Option<Vec<u8>>,
}

/// One event, ready to send: the frame header and event header, and the fragments in place.
struct Item {
    id: u64,
    head: Vec<u8>,
    frags: Vec<(FragmentHeader, Chain)>,
    bytes: u64,
}

struct Consumer {
    name: String,
    peer: String,
    max_held: usize,
    /// Sent, not acknowledged: the event and when it was sent.
    in_flight: BTreeMap<u64, (Arc<Item>, Instant)>,
    acked: u64,
    /// Its last acknowledgement (or when it last started holding events after holding
    /// none): a consumer holding events with no progress for the ack timeout is dropped.
    progress: Instant,
    stream: TcpStream,
}

#[derive(Default)]
struct State {
    /// Accepted by the EVM, waiting for a consumer (re-served ones first).
    ready: VecDeque<Arc<Item>>,
    consumers: BTreeMap<u64, Consumer>,
    next_consumer: u64,
    /// Connections being served (welcomed, their threads running).
    connections: usize,
    sent: u64,
    acked: u64,
    acked_bytes: u64,
    re_served: u64,
    consumers_dropped: u64,
    /// Connections closed without being served, for any reason (the next three included).
    connections_refused: u64,
    /// Handshakes not finished within the deadline.
    handshakes_timed_out: u64,
    /// Unfinished handshakes closed to make room for a newer connection.
    handshakes_shed: u64,
    /// Consumers without the secret, or with a wrong one.
    auth_failed: u64,
    /// The output is closed (end of run): writers send End; nothing more is served.
    over: bool,
    lost: u64,
}

impl State {
    fn held(&self) -> usize {
        self.ready.len()
            + self
                .consumers
                .values()
                .map(|c| c.in_flight.len())
                .sum::<usize>()
    }

    /// Drops a consumer: its unacknowledged events go back to the front of the queue.
    fn drop_consumer(&mut self, id: u64, why: &str, bu: &str) {
        let Some(c) = self.consumers.remove(&id) else {
            return;
        };
        let n = c.in_flight.len();
        for (_, (item, _)) in c.in_flight.into_iter().rev() {
            self.ready.push_front(item);
        }
        self.re_served += n as u64;
        self.consumers_dropped += 1;
        let _ = c.stream.shutdown(Shutdown::Both);
        if !self.over {
            warn!(node = %bu, "consumer {} ({}) dropped: {why}; its {n} unacknowledged events go to another consumer", c.name, c.peer);
        }
    }
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    stop: AtomicBool,
    opts: ServeOptions,
    /// Lines about refused, shed and timed-out connections: at most [`LOG_BURST`] a second
    /// (a flood of connections must not flood the log); the second that started, lines
    /// written in it, lines left out.
    log: Mutex<(Instant, u32, u64)>,
}

/// Lines about unserved connections logged per second at most; the rest are counted and
/// summed up in one line.
const LOG_BURST: u32 = 10;

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // a panicking thread of this sink leaves the state as it was: carry on with it
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a line about an unserved connection may be written now (see `log`).
    fn may_log(&self) -> bool {
        let mut l = self.next_log_second();
        if l.1 < LOG_BURST {
            l.1 += 1;
            true
        } else {
            l.2 += 1;
            false
        }
    }

    /// Starts a new second of `log` once the last one is over, saying how many lines it left
    /// out.
    fn next_log_second(&self) -> MutexGuard<'_, (Instant, u32, u64)> {
        let mut l = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if now.duration_since(l.0) >= Duration::from_secs(1) {
            if l.2 > 0 {
                warn!(node = %self.opts.bu_id, "{} more consumer connections refused, shed or timed out in {:.1} s (not logged one by one; counted in sink.report)", l.2, now.duration_since(l.0).as_secs_f64());
            }
            *l = (now, 0, 0);
        }
        l
    }
}

pub struct ServeSink {
    shared: Arc<Shared>,
    /// Delivered, awaiting the EVM's acceptance, in delivery order.
    pending: VecDeque<Arc<Item>>,
    listen: String,
    acceptor: Option<JoinHandle<()>>,
    delivered: u64,
    busy: u64,
    left_out: u64,
    refused: u64,
    closed: bool,
}

impl ServeSink {
    /// Binds the listener (the bound address is logged and in the status) and starts serving.
    pub fn start(opts: ServeOptions) -> Result<ServeSink, String> {
        let listener = TcpListener::bind(&opts.listen)
            .map_err(|e| format!("sink: cannot listen on {} for consumers: {e}", opts.listen))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("sink: {e}"))?;
        let listen = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| opts.listen.clone());
        info!(node = %opts.bu_id, addr = %listen, authenticated = opts.secret.is_some(), "serving built events to consumers");
        let beyond_loopback = listener.local_addr().is_ok_and(|a| !a.ip().is_loopback());
        if beyond_loopback && opts.secret.is_none() {
            warn!(node = %opts.bu_id, addr = %listen, "serving built events beyond loopback without run.secret: anyone who can reach this port and knows the run id can take events");
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            opts,
            log: Mutex::new((Instant::now(), 0, 0)),
        });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name(format!("{}-serve", s.opts.bu_id))
            .spawn(move || accept_loop(listener, s))
            .map_err(|e| format!("sink: {e}"))?;
        Ok(ServeSink {
            shared,
            pending: VecDeque::new(),
            listen,
            acceptor: Some(acceptor),
            delivered: 0,
            busy: 0,
            left_out: 0,
            refused: 0,
            closed: false,
        })
    }

    /// The address consumers connect to.
    pub fn listen_addr(&self) -> &str {
        &self.listen
    }
}

fn item(ev: &BuiltEvent) -> Item {
    let mut flags = 0;
    if !ev.missing_sources.is_empty() {
        flags |= EVENT_PARTIAL;
    }
    if ev.trigger_mismatch {
        flags |= EVENT_TRIGGER_MISMATCH;
    }
    if ev.corrupt {
        flags |= EVENT_CORRUPT;
    }
    let refs: Vec<(FragmentHeader, &Chain)> = ev.fragments.iter().map(|(h, c)| (*h, c)).collect();
    let eh = event_header(ev.event_id, ev.trigger_number, flags, &refs);
    let body: usize = ev
        .fragments
        .iter()
        .map(|(_, c)| FRAGMENT_HEADER_LEN + c.len())
        .sum();
    let mut head = ConsumerHeader::new(ConsumerFrame::Event, (EVENT_HEADER_LEN + body) as u32)
        .encode()
        .to_vec();
    head.extend_from_slice(&eh);
    Item {
        id: ev.event_id,
        head,
        // references to the received blocks: held until the event is acknowledged
        frags: ev.fragments.clone(),
        bytes: ev.bytes,
    }
}

impl Sink for ServeSink {
    fn deliver(&mut self, ev: &BuiltEvent) -> Result<(), SinkError> {
        if self.closed {
            return Err(SinkError::Fatal("the output is closed".into()));
        }
        let (held, consumers) = {
            let st = self.shared.lock();
            (st.held() + self.pending.len(), st.consumers.len())
        };
        if held >= self.shared.opts.hold {
            self.busy += 1;
            return Err(SinkError::Busy(if consumers == 0 {
                format!(
                    "waiting for a consumer: none connected to {} ({held} events held)",
                    self.listen
                )
            } else {
                format!("{consumers} consumers hold {held} events (sink.serve_hold)")
            }));
        }
        self.pending.push_back(Arc::new(item(ev)));
        self.delivered += 1;
        Ok(())
    }

    fn accepted(&mut self, first: u64, count: u32) -> Result<(), SinkError> {
        let mut st = self.shared.lock();
        'ids: for id in first..first.saturating_add(count as u64) {
            // acceptances come in delivery order: the oldest pending event is next
            while let Some(it) = self.pending.pop_front() {
                if it.id == id {
                    if st.over {
                        st.lost += 1;
                    } else {
                        st.ready.push_back(it);
                    }
                    continue 'ids;
                }
                self.refused += 1;
            }
            break;
        }
        drop(st);
        self.shared.cv.notify_all();
        Ok(())
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.close_output();
        // delivered, never accepted: not this BU's output
        self.left_out += self.pending.len() as u64;
        self.pending.clear();
        // let the writers send End (bounded)
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until && !self.shared.lock().consumers.is_empty() {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "serve"
    }

    fn retry_after(&self) -> Duration {
        if self.shared.lock().consumers.is_empty() {
            // waiting for a consumer to connect
            Duration::from_millis(20)
        } else {
            // a consumer frees room with each acknowledgement
            Duration::from_micros(500)
        }
    }

    fn busy_is_news(&self) -> bool {
        // a slow consumer is routine back-pressure; no consumer at all is worth a line
        self.shared.lock().consumers.is_empty()
    }

    fn outstanding(&self) -> u64 {
        // delivered and not yet echoed too: at Stop every event of this BU was released,
        // so its echo is on its way (or queued among this pass's actions)
        (self.shared.lock().held() + self.pending.len()) as u64
    }

    fn drain_timeout(&self) -> Duration {
        self.shared.opts.drain_timeout
    }

    fn close_output(&mut self) -> u64 {
        if self.closed {
            return 0;
        }
        self.closed = true;
        let mut st = self.shared.lock();
        st.over = true;
        let mut lost = st.ready.len() as u64;
        st.ready.clear();
        for c in st.consumers.values_mut() {
            lost += c.in_flight.len() as u64;
            c.in_flight.clear();
        }
        st.lost += lost;
        if lost > 0 {
            error!(node = %self.shared.opts.bu_id, "{lost} accepted events were never acknowledged by a consumer: lost");
        }
        drop(st);
        self.shared.cv.notify_all();
        lost
    }

    fn report(&self) -> Value {
        let st = self.shared.lock();
        json!({
            "listen": self.listen,
            "consumers": st.consumers.values().map(|c| json!({
                "name": c.name, "peer": c.peer, "held": c.in_flight.len(),
                "max_held": c.max_held, "acked": c.acked,
            })).collect::<Vec<_>>(),
            "delivered": self.delivered,
            "awaiting_acceptance": self.pending.len(),
            "waiting": st.ready.len(),
            "sent": st.sent,
            "acked": st.acked,
            "acked_bytes": st.acked_bytes,
            "re_served": st.re_served,
            "consumers_dropped": st.consumers_dropped,
            "connections_refused": st.connections_refused,
            "handshakes_timed_out": st.handshakes_timed_out,
            "handshakes_shed": st.handshakes_shed,
            "auth_failed": st.auth_failed,
            "authenticated": self.shared.opts.secret.is_some(),
            "lost": st.lost,
            "busy": self.busy,
            "left_out_unaccepted": self.left_out,
            "refused": self.refused,
        })
    }
}

impl Drop for ServeSink {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.cv.notify_all();
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

/// A connection still handshaking, owned by the acceptor (non-blocking; no thread of its
/// own). Its frames are read into `buf`, never more than [`CONSUMER_MAX_HANDSHAKE`] bytes.
struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    since: Instant,
    buf: Vec<u8>,
    header: Option<ConsumerHeader>,
    phase: Phase,
}

enum Phase {
    /// Waiting for the Hello.
    Hello,
    /// The Hello came and the BU sent its Challenge: waiting for the consumer's Auth.
    Auth {
        hello: ConsumerHello,
        payload: Vec<u8>,
        challenge: u64,
    },
}

/// What became of a handshake after some of its bytes.
enum Step {
    /// More bytes are needed.
    Wait,
    /// Refused (or gone): close it.
    Close,
    /// Finished: serve this consumer.
    Serve(ConsumerHello),
}

fn accept_loop(listener: TcpListener, s: Arc<Shared>) {
    let mut next_check = Instant::now();
    let mut pending: Vec<Pending> = Vec::new();
    while !s.stop.load(Ordering::Acquire) {
        // wait for a new connection or handshake bytes: 50 ms at most (the stop flag and
        // the ack timeouts), less when a handshake's deadline comes first
        let now = Instant::now();
        let mut wait = Duration::from_millis(50);
        for p in &pending {
            wait = wait.min((p.since + HANDSHAKE_DEADLINE).saturating_duration_since(now));
        }
        let mut fds = Vec::with_capacity(1 + pending.len());
        fds.push(libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for p in &pending {
            fds.push(libc::pollfd {
                fd: p.stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let ms = wait.as_millis().clamp(1, 50) as libc::c_int;
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            fds.iter_mut().for_each(|f| f.revents = 0);
        }
        // handshakes that have bytes (or closed): newest first, so that removing keeps the
        // indices of the ones still to look at
        for i in (0..pending.len()).rev() {
            if fds[i + 1].revents == 0 {
                continue;
            }
            match handshake_step(&mut pending[i], &s) {
                Step::Wait => {}
                Step::Close => {
                    pending.remove(i);
                }
                Step::Serve(hello) => {
                    let p = pending.remove(i);
                    start_consumer(p.stream, p.peer, hello, &s);
                }
            }
        }
        // the deadline: a whole one from accept, however the bytes trickle
        let now = Instant::now();
        pending.retain_mut(|p| {
            if now.duration_since(p.since) < HANDSHAKE_DEADLINE {
                return true;
            }
            let why = format!(
                "handshake not completed within {} ms",
                HANDSHAKE_DEADLINE.as_millis()
            );
            {
                let mut st = s.lock();
                st.connections_refused += 1;
                st.handshakes_timed_out += 1;
            }
            if s.may_log() {
                warn!(node = %s.opts.bu_id, "consumer connection from {} closed: {why}", p.peer);
            }
            refuse(&mut p.stream, RefuseCode::Busy, &why);
            false
        });
        if fds[0].revents != 0 {
            loop {
                match listener.accept() {
                    Ok((stream, peer)) => admit(&mut pending, stream, peer, &s),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        warn!(node = %s.opts.bu_id, "accepting a consumer: {e}");
                        std::thread::sleep(Duration::from_millis(50));
                        break;
                    }
                }
            }
        }
        let now = Instant::now();
        if now >= next_check {
            next_check = now + Duration::from_millis(50);
            drop(s.next_log_second());
            let mut st = s.lock();
            let late: Vec<(u64, f64)> = st
                .consumers
                .iter()
                .filter(|(_, c)| !c.in_flight.is_empty())
                .filter_map(|(id, c)| {
                    let waited = now.duration_since(c.progress);
                    (waited > s.opts.ack_timeout).then_some((*id, waited.as_secs_f64()))
                })
                .collect();
            for (id, waited) in late {
                st.drop_consumer(
                    id,
                    &format!(
                        "no acknowledgement for {waited:.1} s (sink.serve_ack_timeout_s = {})",
                        s.opts.ack_timeout.as_secs_f64()
                    ),
                    &s.opts.bu_id,
                );
            }
            drop(st);
            s.cv.notify_all();
        }
    }
    // the end: close every connection
    drop(pending);
    let mut st = s.lock();
    for c in st.consumers.values() {
        let _ = c.stream.shutdown(Shutdown::Both);
    }
    st.consumers.clear();
}

/// A new connection. Unfinished handshakes must not keep a consumer out: when its address
/// already has [`MAX_HANDSHAKES_PER_IP`] handshaking, or every slot is taken, the OLDEST
/// unfinished handshake (of that address, or of all) is shed to make room. Only when every
/// slot is a consumer being served is the new connection refused (`Busy`: try again).
fn admit(pending: &mut Vec<Pending>, mut stream: TcpStream, peer: SocketAddr, s: &Arc<Shared>) {
    let bu = &s.opts.bu_id;
    if let Some(i) = (pending.iter().filter(|p| p.peer.ip() == peer.ip()).count()
        >= MAX_HANDSHAKES_PER_IP)
        .then(|| pending.iter().position(|p| p.peer.ip() == peer.ip()))
        .flatten()
    {
        shed(
            pending.remove(i),
            "its address has too many unfinished handshakes",
            s,
        );
    }
    let serving = s.lock().connections;
    if pending.len() + serving >= MAX_CONNECTIONS {
        if pending.is_empty() {
            s.lock().connections_refused += 1;
            let why = format!(
                "too many connections: {serving} consumers already served (at most {MAX_CONNECTIONS}); try again later"
            );
            if s.may_log() {
                warn!(node = %bu, "consumer connection from {peer} refused: {why}");
            }
            let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
            refuse(&mut stream, RefuseCode::Busy, &why);
            return;
        }
        shed(pending.remove(0), "every connection slot is taken", s);
    }
    let _ = stream.set_nonblocking(true);
    let _ = stream.set_nodelay(true);
    let mut p = Pending {
        stream,
        peer,
        since: Instant::now(),
        buf: Vec::new(),
        header: None,
        phase: Phase::Hello,
    };
    // a consumer writes its Hello as soon as it is connected: often it is here already, and
    // a handshake finished now cannot be shed by a burst of connections behind it
    match handshake_step(&mut p, s) {
        Step::Wait => pending.push(p),
        Step::Close => {}
        Step::Serve(hello) => start_consumer(p.stream, p.peer, hello, s),
    }
}

fn shed(mut p: Pending, why: &str, s: &Shared) {
    let ms = p.since.elapsed().as_millis();
    {
        let mut st = s.lock();
        st.connections_refused += 1;
        st.handshakes_shed += 1;
    }
    if s.may_log() {
        warn!(node = %s.opts.bu_id, "consumer connection from {} shed after {ms} ms without a finished handshake: {why} (limits: {MAX_HANDSHAKES_PER_IP} handshaking per IP, {MAX_CONNECTIONS} connections in all)", p.peer);
    }
    refuse(
        &mut p.stream,
        RefuseCode::Busy,
        &format!("handshake shed after {ms} ms unfinished: {why}; try again"),
    );
}

/// Reads what a handshaking connection has sent (never blocking, never past the frame it
/// waits for) and answers a finished frame.
fn handshake_step(p: &mut Pending, s: &Shared) -> Step {
    let bu = &s.opts.bu_id;
    let peer = p.peer;
    let refused = |p: &mut Pending, code: RefuseCode, why: String, name: Option<&str>| {
        {
            let mut st = s.lock();
            st.connections_refused += 1;
            if code == RefuseCode::Unauthenticated {
                st.auth_failed += 1;
            }
        }
        match name {
            _ if !s.may_log() => {}
            Some(n) => error!(node = %bu, "consumer {n} from {peer} refused: {why}"),
            None => error!(node = %bu, "consumer connection from {peer} refused: {why}"),
        }
        refuse(&mut p.stream, code, &why);
        Step::Close
    };
    loop {
        let want = match p.header {
            None => CONSUMER_HEADER_LEN - p.buf.len(),
            Some(h) => CONSUMER_HEADER_LEN + h.length as usize - p.buf.len(),
        };
        if want > 0 {
            let mut tmp = [0u8; CONSUMER_HEADER_LEN + CONSUMER_MAX_HANDSHAKE as usize];
            match p.stream.read(&mut tmp[..want]) {
                Ok(0) => {
                    let what = match p.phase {
                        Phase::Hello => "its Hello",
                        Phase::Auth { .. } => "its Auth",
                    };
                    return refused(
                        p,
                        RefuseCode::BadHello,
                        format!("bad hello: the connection closed before {what}"),
                        None,
                    );
                }
                Ok(n) => p.buf.extend_from_slice(&tmp[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Step::Wait,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return refused(p, RefuseCode::BadHello, format!("bad hello: {e}"), None),
            }
            continue;
        }
        let Some(h) = p.header else {
            let expect = match p.phase {
                Phase::Hello => ConsumerFrame::Hello,
                Phase::Auth { .. } => ConsumerFrame::Auth,
            };
            let h = match ConsumerHeader::decode(&p.buf, 0) {
                Ok(h) => h,
                Err(e) => return refused(p, RefuseCode::BadHello, format!("bad hello: {e}"), None),
            };
            if h.kind != expect {
                let why = match p.phase {
                    Phase::Hello => format!("first frame is {:?}, not Hello", h.kind),
                    Phase::Auth { .. } => format!("sent {:?} where its Auth was due", h.kind),
                };
                return refused(p, RefuseCode::BadHello, why, None);
            }
            if h.length > CONSUMER_MAX_HANDSHAKE {
                let why = format!(
                    "bad hello: a {:?} of {} bytes exceeds the limit of {CONSUMER_MAX_HANDSHAKE}",
                    h.kind, h.length
                );
                return refused(p, RefuseCode::BadHello, why, None);
            }
            p.header = Some(h);
            continue;
        };
        let payload = p.buf.split_off(CONSUMER_HEADER_LEN);
        p.buf.clear();
        p.header = None;
        match std::mem::replace(&mut p.phase, Phase::Hello) {
            Phase::Hello => {
                let hello = match ConsumerMsg::decode(h.kind, &payload) {
                    Ok(ConsumerMsg::Hello(hello)) => hello,
                    Ok(other) => {
                        let why = format!("first frame is {:?}, not Hello", other.kind());
                        return refused(p, RefuseCode::BadHello, why, None);
                    }
                    Err(e) => {
                        return refused(p, RefuseCode::BadHello, format!("bad hello: {e}"), None)
                    }
                };
                if hello.run_id != s.opts.run_id {
                    let why = format!(
                        "the consumer names run {:?}; this is run {:?}",
                        hello.run_id, s.opts.run_id
                    );
                    return refused(p, RefuseCode::WrongRun, why, Some(&hello.name));
                }
                if s.lock().over {
                    refuse(&mut p.stream, RefuseCode::Over, "the run is over");
                    return Step::Close;
                }
                let Some(secret) = &s.opts.secret else {
                    return Step::Serve(hello);
                };
                if hello.nonce == 0 {
                    let why = "this BU requires the run's secret (run.secret or EVB_SECRET) \
                               and the consumer proves none"
                        .to_string();
                    return refused(p, RefuseCode::Unauthenticated, why, Some(&hello.name));
                }
                let challenge = match nonce() {
                    Ok(n) => n,
                    Err(e) => {
                        return refused(p, RefuseCode::Other, e, Some(&hello.name));
                    }
                };
                let proof = prove(&proof_key(ProofRole::Bu, secret, &payload, challenge));
                let frame = ConsumerMsg::Challenge {
                    nonce: challenge,
                    proof,
                }
                .encode();
                // 52 bytes to a connection that has sent and not yet read anything: a
                // short write would mean a broken connection
                if p.stream.write_all(&frame).is_err() {
                    return Step::Close;
                }
                p.phase = Phase::Auth {
                    hello,
                    payload,
                    challenge,
                };
            }
            Phase::Auth {
                hello,
                payload: hello_payload,
                challenge,
            } => {
                let proof = match ConsumerMsg::decode(h.kind, &payload) {
                    Ok(ConsumerMsg::Auth(proof)) => proof,
                    Ok(other) => {
                        let why = format!("sent {:?} where its Auth was due", other.kind());
                        return refused(p, RefuseCode::BadHello, why, Some(&hello.name));
                    }
                    Err(e) => {
                        let why = format!("bad auth: {e}");
                        return refused(p, RefuseCode::BadHello, why, Some(&hello.name));
                    }
                };
                let secret = s.opts.secret.as_deref().unwrap_or_default();
                let key = proof_key(ProofRole::Consumer, secret, &hello_payload, challenge);
                if !evb_transport::control_token_matches(&key, &hex(&proof)) {
                    let why = "authentication failed: wrong secret".to_string();
                    return refused(p, RefuseCode::Unauthenticated, why, Some(&hello.name));
                }
                return Step::Serve(hello);
            }
        }
    }
}

/// A proof: HMAC-SHA256 keyed by a [`proof_key`] (docs/protocol.md §7.2).
fn prove(key: &[u8]) -> [u8; PROOF_LEN] {
    let t = evb_transport::control_token(key);
    let mut out = [0u8; PROOF_LEN];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).unwrap_or(0);
    }
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A random, non-zero challenge nonce from the system; without randomness the handshake
/// fails rather than use a guessable one.
fn nonce() -> Result<u64, String> {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| format!("no randomness for the challenge nonce: {e}"))?;
    match u64::from_le_bytes(b) {
        0 => Err("the random source gave an all-zero nonce".into()),
        n => Ok(n),
    }
}

/// Reads one frame (header and payload); `max_event` 0 refuses Event frames by size.
fn read_frame(r: &mut impl Read) -> Result<ConsumerMsg, String> {
    let mut h = [0u8; CONSUMER_HEADER_LEN];
    r.read_exact(&mut h).map_err(|e| e.to_string())?;
    let h = ConsumerHeader::decode(&h, 0).map_err(|e| e.to_string())?;
    let mut p = vec![0u8; h.length as usize];
    r.read_exact(&mut p).map_err(|e| e.to_string())?;
    ConsumerMsg::decode(h.kind, &p).map_err(|e| e.to_string())
}

/// Best effort: the Refuse frame, then the connection is closed.
fn refuse(stream: &mut TcpStream, code: RefuseCode, reason: &str) {
    let _ = stream.write_all(
        &ConsumerMsg::Refuse {
            code,
            reason: reason.to_string(),
        }
        .encode(),
    );
    let _ = stream.shutdown(Shutdown::Both);
}

/// A finished handshake: the consumer is registered (only now can it be sent events), is
/// welcomed, and gets its threads (its acks here, its events on a writer).
fn start_consumer(mut stream: TcpStream, peer: SocketAddr, hello: ConsumerHello, s: &Arc<Shared>) {
    let bu = &s.opts.bu_id;
    let peer = peer.to_string();
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let max_held = hello.max_held.min(s.opts.max_held);
    let welcome = ConsumerMsg::Welcome(Welcome {
        bu_index: s.opts.bu_index,
        max_held,
        bu_id: bu.clone(),
    })
    .encode();
    let (Ok(rstream), Ok(wstream), Ok(handle)) =
        (stream.try_clone(), stream.try_clone(), stream.try_clone())
    else {
        return;
    };
    let id = {
        let mut st = s.lock();
        if st.over {
            drop(st);
            refuse(&mut stream, RefuseCode::Over, "the run is over");
            return;
        }
        if stream.write_all(&welcome).is_err() {
            return;
        }
        let _ = stream.set_write_timeout(None);
        let id = st.next_consumer;
        st.next_consumer += 1;
        st.connections += 1;
        st.consumers.insert(
            id,
            Consumer {
                name: hello.name.clone(),
                peer: peer.clone(),
                max_held: max_held as usize,
                in_flight: BTreeMap::new(),
                acked: 0,
                progress: Instant::now(),
                stream: handle,
            },
        );
        id
    };
    let auth = if s.opts.secret.is_some() {
        ", authenticated"
    } else {
        ""
    };
    info!(node = %bu, "consumer {} connected from {peer} (holds at most {max_held}{auth})", hello.name);
    s.cv.notify_all();
    let s2 = s.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("{bu}-consumer"))
        .spawn(move || {
            serve_consumer(rstream, wstream, &peer, &hello.name, id, &s2);
            s2.lock().connections -= 1;
        });
    if spawned.is_err() {
        let mut st = s.lock();
        st.connections -= 1;
        st.drop_consumer(id, "no thread for it", bu);
    }
}

/// A consumer's acks, until the connection closes or breaks the protocol (its writer on
/// another thread).
fn serve_consumer(
    mut stream: TcpStream,
    wstream: TcpStream,
    peer: &str,
    name: &str,
    id: u64,
    s: &Arc<Shared>,
) {
    let bu = &s.opts.bu_id;
    let s2 = s.clone();
    let writer = std::thread::Builder::new()
        .name(format!("{bu}-serve-w"))
        .spawn(move || writer_loop(wstream, id, s2));
    let why = loop {
        match read_frame(&mut stream) {
            Ok(ConsumerMsg::Ack(ids)) => {
                let mut st = s.lock();
                let st = &mut *st;
                let Some(c) = st.consumers.get_mut(&id) else {
                    break None; // dropped meanwhile
                };
                let mut bad = None;
                c.progress = Instant::now();
                for e in ids {
                    match c.in_flight.remove(&e) {
                        Some((it, _)) => {
                            c.acked += 1;
                            st.acked += 1;
                            st.acked_bytes += it.bytes;
                        }
                        None => {
                            bad = Some(format!("acknowledged event {e}, which it does not hold"));
                            break;
                        }
                    }
                }
                s.cv.notify_all();
                if let Some(b) = bad {
                    break Some(b);
                }
            }
            Ok(other) => break Some(format!("sent {:?} after its Hello", other.kind())),
            Err(e) => break Some(format!("connection closed ({e})")),
        }
    };
    {
        let mut st = s.lock();
        let protocol = why
            .as_ref()
            .is_some_and(|w| !w.starts_with("connection closed"));
        if protocol {
            error!(node = %bu, "consumer {name} ({peer}): {}", why.as_deref().unwrap_or(""));
        }
        if let Some(w) = why {
            st.drop_consumer(id, &w, bu);
        }
    }
    s.cv.notify_all();
    if let Ok(w) = writer {
        let _ = w.join();
    }
}

fn writer_loop(stream: TcpStream, id: u64, s: Arc<Shared>) {
    let mut w = BufWriter::with_capacity(256 << 10, stream);
    let mut unflushed = false;
    loop {
        let next = {
            let mut st = s.lock();
            loop {
                if s.stop.load(Ordering::Acquire) {
                    return;
                }
                let over = st.over;
                let (acked, lost) = (st.acked, st.lost);
                let st_ref = &mut *st;
                let Some(c) = st_ref.consumers.get_mut(&id) else {
                    return; // dropped
                };
                if over {
                    drop(st);
                    let _ = w.write_all(&ConsumerMsg::End { acked, lost }.encode());
                    let _ = w.flush();
                    let mut st = s.lock();
                    if let Some(c) = st.consumers.remove(&id) {
                        let _ = c.stream.shutdown(Shutdown::Both);
                    }
                    return;
                }
                if c.in_flight.len() < c.max_held {
                    if let Some(it) = st_ref.ready.pop_front() {
                        let now = Instant::now();
                        if c.in_flight.is_empty() {
                            c.progress = now;
                        }
                        c.in_flight.insert(it.id, (it.clone(), now));
                        st_ref.sent += 1;
                        break Some(it);
                    }
                }
                if unflushed {
                    break None;
                }
                st =
                    s.cv.wait_timeout(st, Duration::from_millis(100))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
            }
        };
        let r = match next {
            None => {
                unflushed = false;
                w.flush()
            }
            Some(it) => {
                unflushed = true;
                (|| {
                    w.write_all(&it.head)?;
                    for (h, c) in &it.frags {
                        w.write_all(&h.encode())?;
                        for chunk in c.chunks() {
                            w.write_all(chunk)?;
                        }
                    }
                    Ok(())
                })()
            }
        };
        if let Err(e) = r {
            let mut st = s.lock();
            st.drop_consumer(id, &format!("sending failed ({e})"), &s.opts.bu_id);
            drop(st);
            s.cv.notify_all();
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evb_buffers::Pool;
    use evb_formats::events::parse_event;

    fn event(pool: &Pool, id: u64) -> BuiltEvent {
        let mut w = pool.try_alloc().unwrap();
        let payload = Chain::from_slice(w.append(&id.to_le_bytes()).unwrap());
        BuiltEvent::of_one_fragment(id, 3, payload)
    }

    fn sink(hold: usize) -> ServeSink {
        sink_of(hold, None)
    }

    fn sink_of(hold: usize, secret: Option<&str>) -> ServeSink {
        ServeSink::start(ServeOptions {
            listen: "127.0.0.1:0".into(),
            run_id: "r".into(),
            bu_id: "bu0".into(),
            bu_index: 0,
            max_held: 8,
            hold,
            ack_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(1),
            secret: secret.map(|s| s.as_bytes().to_vec()),
        })
        .unwrap()
    }

    fn connect(s: &ServeSink, run: &str) -> (TcpStream, Result<ConsumerMsg, String>) {
        let mut c = TcpStream::connect(s.listen_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let hello = ConsumerMsg::Hello(ConsumerHello {
            max_held: 4,
            nonce: 0,
            run_id: run.into(),
            name: "t".into(),
        });
        c.write_all(&hello.encode()).unwrap();
        let first = read_any(&mut c);
        (c, first)
    }

    fn read_any(c: &mut TcpStream) -> Result<ConsumerMsg, String> {
        let mut h = [0u8; CONSUMER_HEADER_LEN];
        c.read_exact(&mut h).map_err(|e| e.to_string())?;
        let h = ConsumerHeader::decode(&h, 1 << 20).map_err(|e| e.to_string())?;
        let mut p = vec![0u8; h.length as usize];
        c.read_exact(&mut p).map_err(|e| e.to_string())?;
        ConsumerMsg::decode(h.kind, &p).map_err(|e| e.to_string())
    }

    /// The connection is open and has nothing to read: the read times out (not an end of
    /// stream or a reset, which would pass a plain `is_err()` too).
    fn assert_nothing_to_read(c: &mut TcpStream, why: &str) {
        let mut b = [0u8; 1];
        match c.read(&mut b) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            other => panic!("{why}: expected nothing to read, got {other:?}"),
        }
    }

    fn wait_for(mut f: impl FnMut() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(5), "timed out");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Nothing is served before the EVM accepts it; an accepted event goes out, is held
    /// until acknowledged, and one never accepted is left out.
    #[test]
    fn served_only_once_accepted_and_held_until_acknowledged() {
        let pool = Pool::new("t", 4096, 16);
        let mut s = sink(8);
        let (mut c, welcome) = connect(&s, "r");
        assert!(matches!(welcome, Ok(ConsumerMsg::Welcome(ref w)) if w.max_held == 4));
        for id in [5, 6, 7] {
            s.deliver(&event(&pool, id)).unwrap();
        }
        assert_nothing_to_read(&mut c, "nothing before the EVM's echo");
        s.accepted(5, 2).unwrap();
        let mut got = Vec::new();
        for _ in 0..2 {
            match read_any(&mut c).unwrap() {
                ConsumerMsg::Event(r) => {
                    let ev = parse_event(&r).unwrap();
                    assert_eq!(ev.fragments[0].1, ev.event_id.to_le_bytes());
                    got.push(ev.event_id);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(got, vec![5, 6]);
        assert_nothing_to_read(&mut c, "7 was never accepted");
        // 5 and 6 held until acknowledged, 7 awaiting the echo: the BU's Stop waits for all
        assert_eq!(s.outstanding(), 3);
        c.write_all(&ConsumerMsg::Ack(vec![5, 6]).encode()).unwrap();
        wait_for(|| s.outstanding() == 1);
        assert_eq!(s.close_output(), 0);
        assert!(matches!(
            read_any(&mut c),
            Ok(ConsumerMsg::End { acked: 2, lost: 0 })
        ));
        s.finish().unwrap();
        assert_eq!(s.report()["left_out_unaccepted"], 1);
        assert_eq!(s.report()["acked"], 2);
    }

    /// A consumer that goes away: its events go to the next; at the end what nobody
    /// acknowledged is counted lost. With no consumer the sink is busy beyond `hold`.
    #[test]
    fn a_dropped_consumers_events_go_to_another_and_the_rest_is_counted_lost() {
        let pool = Pool::new("t", 4096, 16);
        let mut s = sink(3);
        for id in 0..3 {
            s.deliver(&event(&pool, id)).unwrap();
        }
        match s.deliver(&event(&pool, 3)) {
            Err(SinkError::Busy(why)) => assert!(why.contains("waiting for a consumer"), "{why}"),
            other => panic!("{other:?}"),
        }
        s.accepted(0, 3).unwrap();
        let (mut a, _) = connect(&s, "r");
        for _ in 0..3 {
            assert!(matches!(read_any(&mut a), Ok(ConsumerMsg::Event(_))));
        }
        drop(a); // dies holding 3
        let (mut b, _) = connect(&s, "r");
        let ev = match read_any(&mut b).unwrap() {
            ConsumerMsg::Event(r) => parse_event(&r).unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(ev.event_id, 0, "re-served, oldest first");
        b.write_all(&ConsumerMsg::Ack(vec![0]).encode()).unwrap();
        wait_for(|| s.report()["acked"] == 1);
        assert_eq!(s.report()["re_served"], 3);
        // 1 and 2 are held by b, never acknowledged: lost at the end, and said so
        assert_eq!(s.close_output(), 2);
        s.finish().unwrap();
        assert_eq!(s.report()["lost"], 2);
    }

    #[test]
    fn wrong_run_and_garbage_are_refused() {
        let s = sink(4);
        let (_, r) = connect(&s, "other");
        assert!(
            matches!(
                r,
                Ok(ConsumerMsg::Refuse {
                    code: RefuseCode::WrongRun,
                    ..
                })
            ),
            "{r:?}"
        );
        let mut g = TcpStream::connect(s.listen_addr()).unwrap();
        g.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        g.write_all(b"\x00\x01garbage garbage garbage").unwrap();
        assert!(matches!(
            read_any(&mut g),
            Ok(ConsumerMsg::Refuse {
                code: RefuseCode::BadHello,
                ..
            })
        ));
        wait_for(|| s.report()["connections_refused"] == 2);
    }

    fn sink_with(secret: Option<&str>) -> ServeSink {
        sink_of(8, secret)
    }

    fn hello(nonce: u64) -> ConsumerMsg {
        ConsumerMsg::Hello(ConsumerHello {
            max_held: 4,
            nonce,
            run_id: "r".into(),
            name: "t".into(),
        })
    }

    /// The handshake with a secret: a Hello with a nonce, then the Auth answering the
    /// Challenge (the BU's own proof is checked in the test below); `secret` None sends a
    /// Hello without a nonce.
    fn connect_with(
        s: &ServeSink,
        secret: Option<&[u8]>,
    ) -> (TcpStream, Result<ConsumerMsg, String>) {
        let mut c = TcpStream::connect(s.listen_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let h = hello(if secret.is_some() { 0x5eed } else { 0 });
        c.write_all(&h.encode()).unwrap();
        let first = read_any(&mut c);
        let (Some(secret), Ok(ConsumerMsg::Challenge { nonce, .. })) = (secret, &first) else {
            return (c, first);
        };
        let payload = h.encode_payload();
        let mine = prove(&proof_key(ProofRole::Consumer, secret, &payload, *nonce));
        c.write_all(&ConsumerMsg::Auth(mine).encode()).unwrap();
        let r = read_any(&mut c);
        (c, r)
    }

    fn refused_with(r: &Result<ConsumerMsg, String>, want: RefuseCode) -> String {
        match r {
            Ok(ConsumerMsg::Refuse { code, reason }) if *code == want => reason.clone(),
            other => panic!("expected Refuse {want:?}, got {other:?}"),
        }
    }

    /// With a secret: no proof and a wrong proof are refused (Unauthenticated) and get no
    /// event; the right one is welcomed after the BU proved the secret too.
    #[test]
    fn with_a_secret_only_a_consumer_that_proves_it_is_served() {
        let pool = Pool::new("t", 4096, 16);
        let mut s = sink_with(Some("s3cret"));
        s.deliver(&event(&pool, 1)).unwrap();
        s.accepted(1, 1).unwrap();
        let (_, r) = connect_with(&s, None);
        let why = refused_with(&r, RefuseCode::Unauthenticated);
        assert!(why.contains("requires the run's secret"), "{why}");
        let (_, r) = connect_with(&s, Some(b"guess"));
        let why = refused_with(&r, RefuseCode::Unauthenticated);
        assert!(why.contains("wrong secret"), "{why}");
        // an Auth that is not 32 bytes, or another frame where the Auth is due
        let mut c = TcpStream::connect(s.listen_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        c.write_all(&hello(7).encode()).unwrap();
        assert!(matches!(
            read_any(&mut c),
            Ok(ConsumerMsg::Challenge { .. })
        ));
        c.write_all(&ConsumerMsg::Ack(vec![1]).encode()).unwrap();
        refused_with(&read_any(&mut c), RefuseCode::BadHello);
        assert_eq!(s.report()["sent"], 0, "nothing to the unauthenticated");
        let (mut c, r) = connect_with(&s, Some(b"s3cret"));
        assert!(matches!(r, Ok(ConsumerMsg::Welcome(_))), "{r:?}");
        assert!(matches!(read_any(&mut c), Ok(ConsumerMsg::Event(_))));
        let rep = s.report();
        assert_eq!(rep["auth_failed"], 2, "{rep}");
        assert_eq!(rep["connections_refused"], 3, "{rep}");
        // the BU's own proof is checked by the consumer: a wrong secret on the BU's side
        // shows in the Challenge
        let mut c = TcpStream::connect(s.listen_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let h = hello(9);
        c.write_all(&h.encode()).unwrap();
        let Ok(ConsumerMsg::Challenge { nonce, proof }) = read_any(&mut c) else {
            panic!("no challenge")
        };
        let p = h.encode_payload();
        assert_eq!(
            proof,
            prove(&proof_key(ProofRole::Bu, b"s3cret", &p, nonce))
        );
        assert_ne!(proof, prove(&proof_key(ProofRole::Bu, b"other", &p, nonce)));
    }

    /// The deadline is a whole one from the accept: a byte every 600 ms does not keep the
    /// connection (it is refused, `Busy`, at 5 s), and a Hello declaring more than 1 KiB is
    /// refused before any of it is read.
    #[test]
    fn a_trickling_hello_is_closed_at_the_deadline() {
        let s = sink_with(None);
        let mut big = TcpStream::connect(s.listen_addr()).unwrap();
        big.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        big.write_all(&ConsumerHeader::new(ConsumerFrame::Hello, 65_535).encode())
            .unwrap();
        let why = refused_with(&read_any(&mut big), RefuseCode::BadHello);
        assert!(why.contains("exceeds the limit of 1024"), "{why}");
        let mut c = TcpStream::connect(s.listen_addr()).unwrap();
        let t0 = Instant::now();
        c.write_all(&ConsumerHeader::new(ConsumerFrame::Hello, 1000).encode())
            .unwrap();
        c.set_read_timeout(Some(Duration::from_millis(600)))
            .unwrap();
        let mut got = Vec::new();
        while t0.elapsed() < Duration::from_secs(8) {
            let _ = c.write_all(&[0]); // fails once closed
            let mut b = [0u8; 256];
            match c.read(&mut b) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&b[..n]),
                Err(_) => {}
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        assert!((4.5..7.0).contains(&secs), "closed after {secs} s");
        let h = ConsumerHeader::decode(&got, 0).unwrap();
        let r = ConsumerMsg::decode(h.kind, &got[CONSUMER_HEADER_LEN..]);
        let why = refused_with(&r.map_err(|e| e.to_string()), RefuseCode::Busy);
        assert!(why.contains("not completed within 5000 ms"), "{why}");
        assert_eq!(s.report()["handshakes_timed_out"], 1);
    }

    /// Stalled handshakes never keep a consumer out: the newest connection sheds the oldest
    /// unfinished one (8 per address). Only consumers being served fill the slots for good:
    /// then a new connection is refused `Busy`, and gets in once one leaves.
    #[test]
    fn stalled_handshakes_are_shed_and_only_served_consumers_fill_the_slots() {
        let s = sink_with(None);
        let stalled: Vec<TcpStream> = (0..40)
            .map(|_| {
                let mut c = TcpStream::connect(s.listen_addr()).unwrap();
                c.write_all(&ConsumerHeader::new(ConsumerFrame::Hello, 1000).encode()[..7])
                    .unwrap();
                c
            })
            .collect();
        let (_c, r) = connect(&s, "r");
        assert!(matches!(r, Ok(ConsumerMsg::Welcome(_))), "{r:?}");
        wait_for(|| s.report()["handshakes_shed"].as_u64().unwrap() >= 32);
        drop(stalled);
        let mut served = vec![_c];
        while served.len() < MAX_CONNECTIONS {
            let (c, r) = connect(&s, "r");
            assert!(matches!(r, Ok(ConsumerMsg::Welcome(_))), "{r:?}");
            served.push(c);
        }
        let (_, r) = connect(&s, "r");
        let why = refused_with(&r, RefuseCode::Busy);
        assert!(why.contains("too many connections"), "{why}");
        drop(served.pop());
        wait_for(|| s.shared.lock().connections < MAX_CONNECTIONS);
        let (_c, r) = connect(&s, "r");
        assert!(matches!(r, Ok(ConsumerMsg::Welcome(_))), "{r:?}");
    }
}

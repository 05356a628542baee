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
//! Threads: one acceptor (also the ack-timeout check), and per consumer one reader (the
//! handshake, then acks) and one writer. They share one mutex-guarded state with the sink,
//! which the BU's event loop calls.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufWriter, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
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
    ConsumerFrame, ConsumerHeader, ConsumerMsg, RefuseCode, Welcome, CONSUMER_HEADER_LEN,
};
use evb_wire::{FragmentHeader, FRAGMENT_HEADER_LEN};
use serde_json::{json, Value};
use tracing::{error, info, warn};

/// Connections at once (handshaking or serving); more are refused.
const MAX_CONNECTIONS: usize = 64;
/// A connection must send its Hello within this.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

pub struct ServeOptions {
    pub listen: String,
    pub run_id: String,
    pub bu_id: String,
    pub bu_index: u16,
    pub max_held: u32,
    pub hold: usize,
    pub ack_timeout: Duration,
    pub drain_timeout: Duration,
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
    connections: usize,
    sent: u64,
    acked: u64,
    acked_bytes: u64,
    re_served: u64,
    consumers_dropped: u64,
    connections_refused: u64,
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
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // a panicking thread of this sink leaves the state as it was: carry on with it
        self.state.lock().unwrap_or_else(|e| e.into_inner())
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
        info!(node = %opts.bu_id, addr = %listen, "serving built events to consumers");
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            opts,
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

fn accept_loop(listener: TcpListener, s: Arc<Shared>) {
    let mut next_check = Instant::now();
    while !s.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let s2 = s.clone();
                let peer = peer.to_string();
                let _ = std::thread::Builder::new()
                    .name(format!("{}-consumer", s.opts.bu_id))
                    .spawn(move || connection(stream, peer, s2));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                warn!(node = %s.opts.bu_id, "accepting a consumer: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let now = Instant::now();
        if now >= next_check {
            next_check = now + Duration::from_millis(50);
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
    let mut st = s.lock();
    for c in st.consumers.values() {
        let _ = c.stream.shutdown(Shutdown::Both);
    }
    st.consumers.clear();
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

/// One consumer connection: the handshake, then its acks (its writer on another thread).
fn connection(mut stream: TcpStream, peer: String, s: Arc<Shared>) {
    let bu = s.opts.bu_id.clone();
    {
        let mut st = s.lock();
        if st.connections >= MAX_CONNECTIONS {
            st.connections_refused += 1;
            drop(st);
            warn!(node = %bu, "consumer connection from {peer} refused: {MAX_CONNECTIONS} connections already");
            refuse(&mut stream, RefuseCode::Other, "too many connections");
            return;
        }
        st.connections += 1;
    }
    serve_connection(&mut stream, &peer, &s);
    s.lock().connections -= 1;
}

fn serve_connection(stream: &mut TcpStream, peer: &str, s: &Arc<Shared>) {
    let bu = &s.opts.bu_id;
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
    let _ = stream.set_nodelay(true);
    // A connection earns events by naming the run: anything else is refused and closed.
    let hello = match read_frame(stream) {
        Ok(ConsumerMsg::Hello(h)) => h,
        Ok(other) => {
            s.lock().connections_refused += 1;
            let why = format!("first frame is {:?}, not Hello", other.kind());
            error!(node = %bu, "consumer connection from {peer} refused: {why}");
            refuse(stream, RefuseCode::BadHello, &why);
            return;
        }
        Err(why) => {
            s.lock().connections_refused += 1;
            error!(node = %bu, "consumer connection from {peer} refused: bad hello: {why}");
            refuse(stream, RefuseCode::BadHello, &format!("bad hello: {why}"));
            return;
        }
    };
    if hello.run_id != s.opts.run_id {
        s.lock().connections_refused += 1;
        let why = format!(
            "the consumer names run {:?}; this is run {:?}",
            hello.run_id, s.opts.run_id
        );
        error!(node = %bu, "consumer {} from {peer} refused: {why}", hello.name);
        refuse(stream, RefuseCode::WrongRun, &why);
        return;
    }
    let max_held = hello.max_held.min(s.opts.max_held);
    let welcome = ConsumerMsg::Welcome(Welcome {
        bu_index: s.opts.bu_index,
        max_held,
        bu_id: bu.clone(),
    })
    .encode();
    let (Ok(wstream), Ok(handle)) = (stream.try_clone(), stream.try_clone()) else {
        return;
    };
    let id = {
        let mut st = s.lock();
        if st.over {
            drop(st);
            refuse(stream, RefuseCode::Over, "the run is over");
            return;
        }
        if stream.write_all(&welcome).is_err() {
            return;
        }
        let id = st.next_consumer;
        st.next_consumer += 1;
        st.consumers.insert(
            id,
            Consumer {
                name: hello.name.clone(),
                peer: peer.to_string(),
                max_held: max_held as usize,
                in_flight: BTreeMap::new(),
                acked: 0,
                progress: Instant::now(),
                stream: handle,
            },
        );
        id
    };
    info!(node = %bu, "consumer {} connected from {peer} (holds at most {max_held})", hello.name);
    s.cv.notify_all();
    let s2 = s.clone();
    let writer = std::thread::Builder::new()
        .name(format!("{bu}-serve-w"))
        .spawn(move || writer_loop(wstream, id, s2));
    let _ = stream.set_read_timeout(None);
    // acks, until the connection closes or breaks the protocol
    let why = loop {
        match read_frame(stream) {
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
            error!(node = %bu, "consumer {} ({peer}): {}", hello.name, why.as_deref().unwrap_or(""));
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
    use evb_wire::consumer::ConsumerHello;

    fn event(pool: &Pool, id: u64) -> BuiltEvent {
        let mut w = pool.try_alloc().unwrap();
        let payload = Chain::from_slice(w.append(&id.to_le_bytes()).unwrap());
        BuiltEvent::of_one_fragment(id, 3, payload)
    }

    fn sink(hold: usize) -> ServeSink {
        ServeSink::start(ServeOptions {
            listen: "127.0.0.1:0".into(),
            run_id: "r".into(),
            bu_id: "bu0".into(),
            bu_index: 0,
            max_held: 8,
            hold,
            ack_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(1),
        })
        .unwrap()
    }

    fn connect(s: &ServeSink, run: &str) -> (TcpStream, Result<ConsumerMsg, String>) {
        let mut c = TcpStream::connect(s.listen_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let hello = ConsumerMsg::Hello(ConsumerHello {
            max_held: 4,
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
        assert!(read_any(&mut c).is_err(), "nothing before the EVM's echo");
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
        assert!(read_any(&mut c).is_err(), "7 was never accepted");
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
}

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
//!
//! The parts, the first two free of IO: `book` (who holds which events, acks, ack
//! deadlines, counters), `admission` (which connection gets a slot, the handshake deadline);
//! `accept` (the acceptor's sockets: admission and handshakes), `consumer` (a served
//! consumer's reader and writer). This file holds the sink the BU calls.

use std::collections::VecDeque;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use evb_buffers::Chain;
use evb_builder::{BuiltEvent, PreparedPart, Sink, SinkError};
use evb_formats::events::{event_header, EVENT_HEADER_LEN};
use evb_wire::consumer::{ConsumerFrame, ConsumerHeader};
use evb_wire::{FragmentHeader, FRAGMENT_HEADER_LEN, MAX_COMMIT_RANGES};
use serde_json::Value;
use tracing::{error, info, warn};

use book::{Book, Item};

mod accept;
mod admission;
mod book;
mod consumer;
#[cfg(test)]
mod tests;

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

/// The bookkeeping with each served consumer's socket (to close it when it is dropped).
type State = Book<TcpStream>;

/// Drops consumer `id` (see [`Book::drop_consumer`]): closes its connection and says so.
fn drop_consumer(st: &mut State, id: u64, why: &str, bu: &str) {
    let Some(c) = st.drop_consumer(id) else {
        return;
    };
    let _ = c.handle.shutdown(Shutdown::Both);
    if !st.over {
        let (name, peer, n) = (c.name, c.peer, c.re_served);
        warn!(node = %bu, "consumer {name} ({peer}) dropped: {why}; its {n} unacknowledged events go to another consumer");
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
    /// The last part number handed to the EVM (a part: events acknowledged together).
    next_part: u32,
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
            .spawn(move || accept::accept_loop(listener, s))
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
            next_part: 0,
        })
    }

    /// The address consumers connect to.
    pub fn listen_addr(&self) -> &str {
        &self.listen
    }
}

fn item(ev: &BuiltEvent) -> Item {
    let flags = crate::file_sink::event_flags(ev);
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
        self.refused += st.accepted(&mut self.pending, first, count);
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

    fn commits(&self) -> bool {
        true
    }

    /// The events consumers acknowledged since the last call, as parts for the EVM: an
    /// acknowledged event is output (the consumer has it), and the EVM makes it final.
    fn prepare(&mut self, _now: Instant) -> Result<Vec<PreparedPart>, SinkError> {
        let mut ids = {
            let mut st = self.shared.lock();
            if st.to_commit.is_empty() {
                return Ok(Vec::new());
            }
            std::mem::take(&mut st.to_commit)
        };
        ids.sort_unstable();
        let mut parts: Vec<PreparedPart> = Vec::new();
        for id in ids {
            let part = match parts.last_mut() {
                Some(p)
                    if p.ranges.len() < MAX_COMMIT_RANGES
                        || p.ranges.last().is_some_and(|(f, n)| f + *n as u64 == id) =>
                {
                    p
                }
                _ => {
                    self.next_part = self.next_part.wrapping_add(1);
                    parts.push(PreparedPart {
                        part: self.next_part,
                        ranges: Vec::new(),
                    });
                    parts.last_mut().expect("pushed")
                }
            };
            match part.ranges.last_mut() {
                Some((f, n)) if *f + *n as u64 == id && *n < u32::MAX => *n += 1,
                _ => part.ranges.push((id, 1)),
            }
        }
        Ok(parts)
    }

    /// Nothing to rename: the consumer has the events.
    fn publish(&mut self, _part: u32) -> Result<(), SinkError> {
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
        let lost = st.close();
        if lost > 0 {
            error!(node = %self.shared.opts.bu_id, "{lost} accepted events were never acknowledged by a consumer: lost");
        }
        drop(st);
        self.shared.cv.notify_all();
        lost
    }

    fn report(&self) -> Value {
        let st = self.shared.lock();
        let r = ServeSinkReport {
            listen: self.listen.clone(),
            consumers: st
                .consumers
                .values()
                .map(|c| ConsumerReport {
                    name: c.name.clone(),
                    peer: c.peer.clone(),
                    held: c.in_flight.len(),
                    max_held: c.max_held,
                    acked: c.acked,
                })
                .collect(),
            delivered: self.delivered,
            awaiting_acceptance: self.pending.len(),
            waiting: st.ready.len(),
            sent: st.sent,
            acked: st.acked,
            acked_bytes: st.acked_bytes,
            re_served: st.re_served,
            consumers_dropped: st.consumers_dropped,
            connections_refused: st.connections_refused,
            handshakes_timed_out: st.handshakes_timed_out,
            handshakes_shed: st.handshakes_shed,
            auth_failed: st.auth_failed,
            authenticated: self.shared.opts.secret.is_some(),
            lost: st.lost,
            busy: self.busy,
            left_out_unaccepted: self.left_out,
            refused: self.refused,
        };
        serde_json::to_value(r).unwrap_or_default()
    }
}

/// The serve sink's report (`sink.report` in a BU's status and report, docs/protocol.md §7).
#[derive(Debug, serde::Serialize)]
struct ServeSinkReport {
    listen: String,
    consumers: Vec<ConsumerReport>,
    delivered: u64,
    /// Events delivered to the sink and not yet accepted by the EVM.
    awaiting_acceptance: usize,
    /// Events accepted, waiting for a consumer.
    waiting: usize,
    sent: u64,
    acked: u64,
    acked_bytes: u64,
    re_served: u64,
    consumers_dropped: u64,
    connections_refused: u64,
    handshakes_timed_out: u64,
    handshakes_shed: u64,
    auth_failed: u64,
    authenticated: bool,
    lost: u64,
    busy: u64,
    left_out_unaccepted: u64,
    refused: u64,
}

/// One consumer connection of the serve sink.
#[derive(Debug, serde::Serialize)]
struct ConsumerReport {
    name: String,
    peer: String,
    held: usize,
    max_held: usize,
    acked: u64,
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

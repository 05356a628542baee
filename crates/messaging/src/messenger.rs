//! The message socket: one per node, over one transport.

use std::time::{Duration, Instant};

use evb_buffers::Chain;
use evb_transport::{CloseReason, ConnId, Event, Segment, Transport, TransportError};
use evb_wire::{FrameType, Hello, Message};
use tracing::warn;

use crate::reader::{split_messages_into, Received};

// looked up for every batched message: one multiplication, not SipHash
type ConnMap<V> = evb_buffers::small_keys::SmallKeyMap<ConnId, V>;
type ConnSet = evb_buffers::small_keys::SmallKeySet<ConnId>;

/// When a partly filled page goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushPolicy {
    /// At the end of every pass of the event loop: whatever one pass produced shares frames.
    EndOfPass,
    /// When the page's first message has waited this long (or the page is full).
    After(Duration),
}

#[derive(Debug, Clone, Copy)]
pub struct MessengerConfig {
    /// A page is sent as soon as it holds this many bytes.
    pub page_size: usize,
    /// ... or this many separate pieces (each a writev entry).
    pub max_pieces: usize,
    pub flush: FlushPolicy,
}

impl Default for MessengerConfig {
    fn default() -> Self {
        MessengerConfig {
            page_size: 256 * 1024,
            max_pieces: 64,
            flush: FlushPolicy::EndOfPass,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MessengerStats {
    pub messages_sent: u64,
    pub frames_sent: u64,
    pub payload_bytes_sent: u64,
    pub messages_received: u64,
    pub frames_received: u64,
    pub payload_bytes_received: u64,
    pub protocol_errors: u64,
}

/// What the node's logic is told.
#[derive(Debug)]
pub enum Incoming {
    Connected { conn: ConnId, peer: Hello },
    Accepted { conn: ConnId, peer: Hello },
    Received { conn: ConnId, msg: Received },
    Closed { conn: ConnId, reason: CloseReason },
}

#[derive(Default)]
struct Page {
    segments: Vec<Segment>,
    small: Vec<u8>,
    count: u32,
    bytes: usize,
    since: Option<Instant>,
}

impl Page {
    fn seal_small(&mut self) {
        if !self.small.is_empty() {
            self.segments
                .push(Segment::Owned(std::mem::take(&mut self.small)));
        }
    }

    fn note(&mut self, bytes: usize) {
        self.count += 1;
        self.bytes += bytes;
        self.since.get_or_insert_with(Instant::now);
    }
}

pub struct Messenger {
    transport: Box<dyn Transport>,
    cfg: MessengerConfig,
    pages: ConnMap<Page>,
    dead: ConnSet,
    events: Vec<Event>,
    stats: MessengerStats,
    /// How long `poll` spins (polling without sleeping) before it blocks.
    busy_poll: Duration,
    /// Hand consecutive fragments over as one `Received::Fragments`.
    coalesce_fragments: bool,
}

impl Messenger {
    pub fn new(transport: Box<dyn Transport>, cfg: MessengerConfig) -> Self {
        Messenger {
            transport,
            cfg,
            pages: ConnMap::default(),
            dead: ConnSet::default(),
            events: Vec::new(),
            stats: MessengerStats::default(),
            busy_poll: Duration::ZERO,
            coalesce_fragments: false,
        }
    }

    /// Consecutive fragment messages of a frame are handed over as one
    /// [`Received::Fragments`] instead of one [`Received::Fragment`] each.
    pub fn set_coalesce_fragments(&mut self, on: bool) {
        self.coalesce_fragments = on;
    }

    /// Busy-polling: `poll` keeps polling the transport without sleeping for up to `spin`
    /// before it blocks for the rest of its timeout. Waking a thread blocked in epoll costs
    /// tens of microseconds; a spinning one sees a message within a fraction of one. Spin
    /// only where a core is free for it: several spinning processes on few cores starve
    /// each other. Zero (the default) never spins.
    pub fn set_busy_poll(&mut self, spin: Duration) {
        self.busy_poll = spin;
    }

    /// The busy-poll time set with [`Messenger::set_busy_poll`].
    pub fn busy_poll(&self) -> Duration {
        self.busy_poll
    }

    pub fn stats(&self) -> MessengerStats {
        self.stats
    }

    /// The transport's payload accounting (copies versus references).
    pub fn transport_counters(&self) -> evb_transport::TransportCounters {
        self.transport.counters()
    }

    pub fn listen(&mut self, addr: &str) -> Result<String, TransportError> {
        self.transport.listen(addr)
    }

    pub fn connect(&mut self, addr: &str, hello: Hello) -> Result<ConnId, TransportError> {
        self.transport.connect(addr, hello)
    }

    /// Sends what is queued for `conn`, then closes it (the peer sees an orderly Bye).
    pub fn close(&mut self, conn: ConnId) {
        let _ = self.flush(conn);
        self.pages.remove(&conn);
        self.transport.close(conn);
    }

    /// Bytes waiting for `conn`, in the page and in the transport's queue.
    pub fn queued_bytes(&self, conn: ConnId) -> usize {
        self.pages.get(&conn).map_or(0, |p| p.bytes) + self.transport.queued_bytes(conn)
    }

    /// Memory the peer of `conn` holds (see `Transport::held_bytes`).
    pub fn held_bytes(&self, conn: ConnId) -> usize {
        self.transport.held_bytes(conn)
    }

    /// Low-latency path: whatever is batched for `conn` goes first, then this message, now.
    pub fn send_now(&mut self, conn: ConnId, msg: &Message) -> Result<(), TransportError> {
        self.flush(conn)?;
        let bytes = msg.encode();
        self.stats.messages_sent += 1;
        self.stats.frames_sent += 1;
        self.stats.payload_bytes_sent += bytes.len() as u64;
        self.transport
            .send(conn, FrameType::Messages, 1, vec![Segment::Owned(bytes)])
    }

    /// Low-latency path for a message already encoded (message header and body, e.g. a
    /// pub/sub message): whatever is batched for `conn` goes first, then this, now.
    pub fn send_encoded_now(&mut self, conn: ConnId, bytes: Vec<u8>) -> Result<(), TransportError> {
        self.flush(conn)?;
        self.stats.messages_sent += 1;
        self.stats.frames_sent += 1;
        self.stats.payload_bytes_sent += bytes.len() as u64;
        self.transport
            .send(conn, FrameType::Messages, 1, vec![Segment::Owned(bytes)])
    }

    /// Low-latency path for a message already encoded in pool blocks (header and body): its
    /// slices go out as they are, shared (no copy), after whatever is batched for `conn`.
    pub fn send_chain_now(&mut self, conn: ConnId, encoded: &Chain) -> Result<(), TransportError> {
        self.flush(conn)?;
        self.stats.messages_sent += 1;
        self.stats.frames_sent += 1;
        self.stats.payload_bytes_sent += encoded.len() as u64;
        let segments = encoded
            .slices()
            .iter()
            .cloned()
            .map(Segment::Shared)
            .collect();
        self.transport.send(conn, FrameType::Messages, 1, segments)
    }

    /// High-throughput path for a message already encoded, as its pieces back to back
    /// (e.g. a header then a payload): appended to `conn`'s page.
    pub fn send_encoded_batched(
        &mut self,
        conn: ConnId,
        pieces: &[&[u8]],
    ) -> Result<(), TransportError> {
        let page = self.pages.entry(conn).or_default();
        let mut n = 0;
        for p in pieces {
            page.small.extend_from_slice(p);
            n += p.len();
        }
        page.note(n);
        self.flush_if_full(conn)
    }

    /// High-throughput path: appends the message to `conn`'s page.
    pub fn send_batched(&mut self, conn: ConnId, msg: &Message) -> Result<(), TransportError> {
        let page = self.pages.entry(conn).or_default();
        let before = page.small.len();
        msg.encode_into(&mut page.small);
        let n = page.small.len() - before;
        page.note(n);
        self.flush_if_full(conn)
    }

    /// High-throughput path for fragments: `encoded` holds message header, fragment header
    /// and payload (see [`crate::fragment_prefix`]) in pool blocks; it joins the page as
    /// shared slices.
    pub fn send_fragment(&mut self, conn: ConnId, encoded: &Chain) -> Result<(), TransportError> {
        self.send_fragments(conn, encoded, 1)
    }

    /// [`Messenger::send_fragment`] for `count` encoded fragments back to back. A run that
    /// would take the page past its size goes into the next page, so a frame stays within
    /// a page plus one fragment (the receivers' `max_frame`).
    pub fn send_fragments(
        &mut self,
        conn: ConnId,
        encoded: &Chain,
        count: u32,
    ) -> Result<(), TransportError> {
        let page = self.pages.entry(conn).or_default();
        if page.count > 0 && page.bytes + encoded.len() > self.cfg.page_size {
            self.flush(conn)?;
        }
        let page = self.pages.entry(conn).or_default();
        page.seal_small();
        for s in encoded.slices() {
            if let Some(Segment::Shared(last)) = page.segments.last_mut() {
                if last.extend_with(s) {
                    continue;
                }
            }
            page.segments.push(Segment::Shared(s.clone()));
        }
        page.note(encoded.len());
        debug_assert!(count >= 1, "a run holds at least one fragment");
        page.count += count.saturating_sub(1);
        self.flush_if_full(conn)
    }

    fn flush_if_full(&mut self, conn: ConnId) -> Result<(), TransportError> {
        let p = &self.pages[&conn];
        if p.bytes >= self.cfg.page_size || p.segments.len() >= self.cfg.max_pieces {
            self.flush(conn)
        } else {
            Ok(())
        }
    }

    /// Sends `conn`'s page now, if it holds anything.
    pub fn flush(&mut self, conn: ConnId) -> Result<(), TransportError> {
        let Some(page) = self.pages.get_mut(&conn) else {
            return Ok(());
        };
        if page.count == 0 {
            return Ok(());
        }
        page.seal_small();
        let segments = std::mem::take(&mut page.segments);
        let count = std::mem::take(&mut page.count);
        let bytes = std::mem::take(&mut page.bytes);
        page.since = None;
        self.stats.messages_sent += count as u64;
        self.stats.frames_sent += 1;
        self.stats.payload_bytes_sent += bytes as u64;
        self.transport
            .send(conn, FrameType::Messages, count, segments)
    }

    /// Sends every page that is due under the flush policy (all of them for `EndOfPass`).
    pub fn flush_due(&mut self, now: Instant) {
        let due: Vec<ConnId> = self
            .pages
            .iter()
            .filter(|(_, p)| {
                p.count > 0
                    && match self.cfg.flush {
                        FlushPolicy::EndOfPass => true,
                        FlushPolicy::After(t) => {
                            p.since.is_some_and(|s| now.duration_since(s) >= t)
                        }
                    }
            })
            .map(|(c, _)| *c)
            .collect();
        for c in due {
            // A closed connection's page is discarded; its Closed event reports why.
            let _ = self.flush(c);
        }
    }

    /// How long the event loop may sleep before a page falls due.
    pub fn next_flush_in(&self, now: Instant) -> Option<Duration> {
        match self.cfg.flush {
            FlushPolicy::EndOfPass => None,
            FlushPolicy::After(t) => self
                .pages
                .values()
                .filter_map(|p| p.since)
                .map(|s| t.saturating_sub(now.duration_since(s)))
                .min(),
        }
    }

    /// Makes progress on the transport and appends what arrived, message by message.
    pub fn poll(
        &mut self,
        out: &mut Vec<Incoming>,
        timeout: Option<Duration>,
    ) -> std::io::Result<()> {
        let mut events = std::mem::take(&mut self.events);
        if self.busy_poll.is_zero() || timeout == Some(Duration::ZERO) {
            self.transport.poll(&mut events, timeout)?;
        } else {
            let start = Instant::now();
            loop {
                self.transport.poll(&mut events, Some(Duration::ZERO))?;
                if !events.is_empty() {
                    break;
                }
                let spent = start.elapsed();
                if timeout.is_some_and(|t| spent >= t) {
                    break;
                }
                if spent >= self.busy_poll {
                    let rest = timeout.map(|t| t.saturating_sub(spent));
                    self.transport.poll(&mut events, rest)?;
                    break;
                }
                // Yield rather than spin on the CPU: on a busy core the kernel's deferred
                // network work (ksoftirqd) must get to run, or the message we wait for
                // stays in the kernel until we block.
                std::thread::yield_now();
            }
        }
        let mut msgs = Vec::new();
        for ev in events.drain(..) {
            match ev {
                Event::Connected { conn, peer } => out.push(Incoming::Connected { conn, peer }),
                Event::Accepted { conn, peer } => out.push(Incoming::Accepted { conn, peer }),
                Event::Closed { conn, reason } => {
                    self.pages.remove(&conn);
                    if !self.dead.remove(&conn) {
                        out.push(Incoming::Closed { conn, reason });
                    }
                }
                Event::Frame { conn, frame } => {
                    if self.dead.contains(&conn) {
                        continue;
                    }
                    self.stats.frames_received += 1;
                    self.stats.payload_bytes_received += frame.payload.len() as u64;
                    msgs.clear();
                    let coalesce = self.coalesce_fragments;
                    match split_messages_into(&frame.payload, frame.count, &mut msgs, coalesce) {
                        Ok(()) => {
                            self.stats.messages_received += frame.count as u64;
                            out.extend(msgs.drain(..).map(|msg| Incoming::Received { conn, msg }));
                        }
                        Err(e) => {
                            // Nothing from a broken frame is delivered; the peer is dropped.
                            self.stats.protocol_errors += 1;
                            warn!(?conn, "bad frame from peer, disconnecting: {e}");
                            self.dead.insert(conn);
                            self.pages.remove(&conn);
                            self.transport.close(conn);
                            out.push(Incoming::Closed {
                                conn,
                                reason: CloseReason::Protocol(e),
                            });
                        }
                    }
                }
            }
        }
        self.events = events;
        Ok(())
    }
}

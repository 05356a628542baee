//! Publish/subscribe over any transport (NetIO's pub/sub sockets, docs/messaging.md).
//!
//! A [`Publisher`] listens; [`Subscriber`]s connect (through the transport's handshake, so
//! with the run's secret when one is set) and subscribe to tags (u64) or tag ranges, each
//! subscription delivered on the low-latency or the high-throughput path. Every message
//! published under a tag goes to every subscriber of that tag, and to nobody else; a tag
//! nobody subscribes to costs nothing on the wire. Subscriptions change at any time: the
//! publisher applies them in the pass of its event loop that receives them.
//!
//! A subscriber that does not keep up is handled by the publisher's [`SlowPolicy`], and never
//! silently: `Block` makes `publish` answer [`Publish::WouldBlock`], `Drop` counts every
//! dropped message and tells the subscriber with a `Gap { tag, missed }` before the next
//! message of that tag, `Disconnect` sends a `Goodbye` saying why and closes the connection.
//!
//! ```
//! use std::time::Duration;
//! use evb_buffers::Pool;
//! use evb_messaging::pubsub::*;
//! use evb_messaging::MessengerConfig;
//! use evb_transport::inproc::InprocTransport;
//! use evb_transport::TransportConfig;
//! use evb_wire::pubsub::{Delivery, TagRange};
//! use evb_wire::{Channel, Hello, Role};
//!
//! let cfg = |node: &str| TransportConfig {
//!     run_id: "demo".into(),
//!     local: Hello::new(Channel::Data, Role::Ru, 0, "demo", node),
//!     max_frame: 1 << 20,
//!     rx_pool: Pool::new(node, 64 * 1024, 64),
//!     secret: None,
//! };
//! let mut publisher = Publisher::new(
//!     Box::new(InprocTransport::new(cfg("pub"))),
//!     PublisherConfig::default(),
//! ).unwrap();
//! let addr = publisher.listen("doc-pubsub").unwrap();
//! let mut subscriber = Subscriber::new(
//!     Box::new(InprocTransport::new(cfg("sub"))),
//!     MessengerConfig::default(),
//! );
//! let hello = Hello::new(Channel::Data, Role::Bu, 0, "demo", "sub");
//! let p = subscriber.connect(&addr, hello).unwrap();
//! subscriber.subscribe(p, &[TagRange { first: 10, last: 19 }], Delivery::Latency).unwrap();
//!
//! let mut got = Vec::new();
//! let mut events = Vec::new();
//! while got.is_empty() {
//!     publisher.poll(Some(Duration::from_millis(1))).unwrap();
//!     if publisher.subscribers_of(12) > 0 {
//!         publisher.publish(20, b"not for us").unwrap(); // nobody: nothing sent
//!         publisher.publish(12, b"hello").unwrap();
//!         publisher.flush();
//!     }
//!     subscriber.poll(&mut events, Some(Duration::from_millis(1))).unwrap();
//!     for e in events.drain(..) {
//!         if let SubEvent::Message { tag, payload, .. } = e {
//!             got.push((tag, payload.to_vec()));
//!         }
//!     }
//! }
//! assert_eq!(got, vec![(12, b"hello".to_vec())]);
//! ```

use evb_buffers::small_keys::SmallKeyMap;
use std::time::Duration;

use evb_buffers::{BlockWriter, Chain, Pool};
use evb_transport::{CloseReason, ConnId, Transport, TransportError};
use evb_wire::pubsub::{
    Delivery, GoodbyeCode, PubSubMessage, PublishedHeader, TagRange, MAX_TAG_RANGES,
};
use evb_wire::{Hello, WireError};
use tracing::{debug, warn};

use crate::{Incoming, Messenger, MessengerConfig, Received};

/// Most tag ranges a publisher holds for one subscriber (after merging adjacent ones); a
/// subscriber asking for more is cut off with `Goodbye(BadRequest)`.
pub const MAX_SUBSCRIBER_RANGES: usize = 65_536;

/// What a publisher does with a subscriber that does not keep up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlowPolicy {
    /// Back-pressure: `publish` answers [`Publish::WouldBlock`] and sends nothing.
    Block,
    /// Drop the subscriber's copy, count it, and send it a Gap before its next message of
    /// that tag.
    Drop,
    /// Send the subscriber a Goodbye saying why, and close its connection.
    Disconnect,
}

impl std::str::FromStr for SlowPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "block" => Ok(SlowPolicy::Block),
            "drop" => Ok(SlowPolicy::Drop),
            "disconnect" => Ok(SlowPolicy::Disconnect),
            other => Err(format!(
                "policy {other:?}: expected block, drop or disconnect"
            )),
        }
    }
}

/// Payloads of at least this many bytes are written once into the publisher's pool and
/// shared by every subscriber's page (no copy per subscriber; by reference over shm).
pub const SHARE_MIN: usize = 4096;
const TX_BLOCK: usize = 256 * 1024;
const TX_BLOCKS: usize = 128;

/// Smallest and largest `PublisherConfig::max_queued`.
pub const MAX_QUEUED_RANGE: (usize, usize) = (4 * 1024, 1 << 30);

#[derive(Debug, Clone, Copy)]
pub struct PublisherConfig {
    pub policy: SlowPolicy,
    /// A subscriber is slow while this many bytes wait for it (its page and its transport
    /// queue, and over shared memory the publisher's memory it holds unread). Range
    /// [`MAX_QUEUED_RANGE`].
    pub max_queued: usize,
    /// Threads that write subscribers' sockets beside the publishing one, which writes its
    /// share (0, the default: the publishing thread writes them all; at most
    /// [`MAX_SEND_THREADS`]). Over tcp one thread's copy into the kernel limits a fan-out of
    /// large messages; transports that do not copy (shm) ignore it. Bytes waiting for a send
    /// thread count toward `max_queued`: give it room (MiBs). See docs/messaging.md.
    pub send_threads: usize,
    pub messenger: MessengerConfig,
}

/// Most `PublisherConfig::send_threads`.
pub const MAX_SEND_THREADS: usize = evb_transport::tcp::MAX_SEND_THREADS;

impl Default for PublisherConfig {
    fn default() -> Self {
        PublisherConfig {
            policy: SlowPolicy::Drop,
            max_queued: 4 << 20,
            send_threads: 0,
            messenger: MessengerConfig::default(),
        }
    }
}

impl PublisherConfig {
    /// # Errors
    /// A number out of its range, named.
    pub fn validate(&self) -> Result<(), PubSubError> {
        let (lo, hi) = MAX_QUEUED_RANGE;
        if !(lo..=hi).contains(&self.max_queued) {
            return Err(PubSubError::Config(format!(
                "max_queued {} is outside {lo}..={hi}",
                self.max_queued
            )));
        }
        if self.send_threads > MAX_SEND_THREADS {
            return Err(PubSubError::Config(format!(
                "send_threads {} is outside 0..={MAX_SEND_THREADS}",
                self.send_threads
            )));
        }
        if !(4096..=(64 << 20)).contains(&self.messenger.page_size) {
            return Err(PubSubError::Config(format!(
                "page_size {} is outside 4096..=67108864",
                self.messenger.page_size
            )));
        }
        if !(1..=1024).contains(&self.messenger.max_pieces) {
            return Err(PubSubError::Config(format!(
                "max_pieces {} is outside 1..=1024",
                self.messenger.max_pieces
            )));
        }
        Ok(())
    }
}

#[derive(Debug)]
pub enum PubSubError {
    Config(String),
    Transport(TransportError),
    /// The payload does not fit a message (more than 4 GiB).
    TooLarge(usize),
    /// No such publisher connection (never made, or closed).
    NoPublisher(ConnId),
}

impl std::error::Error for PubSubError {}

impl std::fmt::Display for PubSubError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PubSubError::Config(e) => write!(f, "pub/sub configuration: {e}"),
            PubSubError::Transport(e) => write!(f, "{e}"),
            PubSubError::TooLarge(n) => write!(f, "payload of {n} bytes is too large"),
            PubSubError::NoPublisher(c) => write!(f, "no publisher connection {c:?}"),
        }
    }
}

impl From<TransportError> for PubSubError {
    fn from(e: TransportError) -> Self {
        PubSubError::Transport(e)
    }
}

/// What `publish` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publish {
    /// Sent to this many subscribers (0: nobody subscribes to the tag; nothing was sent).
    /// With policy `Drop` or `Disconnect`, slow subscribers' copies are not in this count
    /// (see [`PublisherStats`]).
    Sent(usize),
    /// Policy `Block`: a subscriber of the tag is slow; nothing was sent, nothing consumed.
    /// Poll, then publish again.
    WouldBlock,
}

/// A publisher's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// `publish` calls that were not refused (WouldBlock).
    pub published: u64,
    /// Copies sent (one per subscriber per message).
    pub delivered: u64,
    /// Copies dropped for slow subscribers (policy `Drop`).
    pub dropped: u64,
    /// Gap messages sent.
    pub gaps_sent: u64,
    /// `publish` calls answered WouldBlock (policy `Block`).
    pub would_block: u64,
    /// Subscribers cut off for being slow (policy `Disconnect`).
    pub disconnected_slow: u64,
    /// Subscribers cut off for a bad request.
    pub disconnected_bad: u64,
    /// Sends the transport refused (the subscriber was cut off, told why).
    pub send_failures: u64,
    pub subscribers_joined: u64,
    pub subscribers_left: u64,
}

struct Sub {
    peer: Hello,
    /// Sorted, disjoint, non-adjacent.
    ranges: Vec<TagRange>,
    delivery: Delivery,
    /// Tag → copies dropped since this subscriber's last message of that tag.
    gaps: SmallKeyMap<u64, u64>,
}

impl Sub {
    fn wants(&self, tag: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.last < tag);
        self.ranges.get(i).is_some_and(|r| r.first <= tag)
    }
}

/// Sorts and merges overlapping or adjacent ranges.
fn normalize(ranges: &mut Vec<TagRange>) {
    ranges.sort_unstable();
    let mut out: Vec<TagRange> = Vec::with_capacity(ranges.len());
    for r in ranges.drain(..) {
        match out.last_mut() {
            Some(l) if r.first <= l.last.saturating_add(1) => l.last = l.last.max(r.last),
            _ => out.push(r),
        }
    }
    *ranges = out;
}

/// `set` minus `cut`, both normalized or not; the result is normalized.
fn subtract(set: &mut Vec<TagRange>, cut: &[TagRange]) {
    for c in cut {
        let mut out = Vec::with_capacity(set.len() + 1);
        for r in set.drain(..) {
            if r.last < c.first || r.first > c.last {
                out.push(r);
                continue;
            }
            if r.first < c.first {
                out.push(TagRange {
                    first: r.first,
                    last: c.first - 1,
                });
            }
            if r.last > c.last {
                out.push(TagRange {
                    first: c.last + 1,
                    last: r.last,
                });
            }
        }
        *set = out;
    }
    normalize(set);
}

/// What [`Publisher::publish_body`] sends: bytes to copy, or slices to send as they are.
#[derive(Clone, Copy)]
enum Body<'a> {
    Bytes(&'a [u8]),
    Chain(&'a Chain),
}

/// Events a [`Publisher`]'s poll reports (also kept in its counters).
#[derive(Debug)]
pub enum PubEvent {
    Joined { conn: ConnId, peer: Hello },
    Left { conn: ConnId, reason: String },
}

/// The publishing socket. One thread drives it: `poll` (take subscriptions, send pending
/// gaps, flush pages), `publish`, `flush`.
pub struct Publisher {
    messenger: Messenger,
    cfg: PublisherConfig,
    subs: SmallKeyMap<ConnId, Sub>,
    seqs: SmallKeyMap<u64, u64>,
    stats: PublisherStats,
    incoming: Vec<Incoming>,
    scratch: Vec<ConnId>,
    events: Vec<PubEvent>,
    /// Large payloads are written here once and shared (None: the memfd could not be made;
    /// every payload is then copied per subscriber).
    tx_pool: Option<Pool>,
    tx_block: Option<BlockWriter>,
}

impl Publisher {
    /// # Errors
    /// The configuration is out of range.
    pub fn new(
        mut transport: Box<dyn Transport>,
        cfg: PublisherConfig,
    ) -> Result<Self, PubSubError> {
        cfg.validate()?;
        transport.set_send_threads(cfg.send_threads)?;
        Ok(Publisher {
            messenger: Messenger::new(transport, cfg.messenger),
            cfg,
            subs: SmallKeyMap::default(),
            seqs: SmallKeyMap::default(),
            stats: PublisherStats::default(),
            incoming: Vec::new(),
            scratch: Vec::new(),
            events: Vec::new(),
            tx_pool: Pool::new_shared_untouched("pubsub-tx", TX_BLOCK, TX_BLOCKS).ok(),
            tx_block: None,
        })
    }

    /// `prefix` and `payload` written into the publisher's pool, or None when it has no room
    /// (subscribers' queues hold it): the caller then copies.
    fn shared_chain(&mut self, prefix: &[u8], payload: &[u8]) -> Option<Chain> {
        let pool = self.tx_pool.as_ref()?;
        let mut chain = Chain::new();
        for part in [prefix, payload] {
            let mut rest = part;
            while !rest.is_empty() {
                if self.tx_block.as_ref().is_none_or(|b| b.remaining() == 0) {
                    self.tx_block = None;
                    self.tx_block = Some(pool.try_alloc()?);
                }
                let w = self.tx_block.as_mut()?;
                let n = rest.len().min(w.remaining());
                chain.push(w.append(&rest[..n])?);
                rest = &rest[n..];
            }
        }
        Some(chain)
    }

    pub fn listen(&mut self, addr: &str) -> Result<String, PubSubError> {
        Ok(self.messenger.listen(addr)?)
    }

    pub fn stats(&self) -> PublisherStats {
        self.stats
    }

    /// Connected subscribers (whether or not they subscribe to anything).
    pub fn subscribers(&self) -> usize {
        self.subs.len()
    }

    /// Subscribers that subscribe to at least one tag.
    pub fn subscribed(&self) -> usize {
        self.subs.values().filter(|s| !s.ranges.is_empty()).count()
    }

    /// Subscribers of `tag`.
    pub fn subscribers_of(&self, tag: u64) -> usize {
        self.subs.values().filter(|s| s.wants(tag)).count()
    }

    /// Joins and departures since the last call.
    pub fn take_events(&mut self) -> Vec<PubEvent> {
        std::mem::take(&mut self.events)
    }

    /// Bytes waiting for `conn`, plus (shared memory) those it holds unread.
    fn backlog(&self, conn: ConnId) -> usize {
        self.messenger.queued_bytes(conn) + self.messenger.held_bytes(conn)
    }

    fn slow(&self, conn: ConnId) -> bool {
        self.backlog(conn) >= self.cfg.max_queued
    }

    /// Publishes `payload` under `tag` to every subscriber of `tag`.
    ///
    /// # Errors
    /// Only a payload too large for one message; a subscriber's connection failing is that
    /// subscriber's end (reported by `poll`), never the publisher's.
    pub fn publish(&mut self, tag: u64, payload: &[u8]) -> Result<Publish, PubSubError> {
        self.publish_body(tag, Body::Bytes(payload))
    }

    /// Publishes `payload`, slices of pool blocks, without copying it: every subscriber's
    /// page refers to the same bytes, which stay in their blocks until the last subscriber's
    /// copy is sent. Write the message into blocks of [`Publisher::pool`] to have it travel
    /// by reference over shm as well (other pools' slices are copied there).
    ///
    /// # Errors
    /// As [`Publisher::publish`].
    pub fn publish_chain(&mut self, tag: u64, payload: &Chain) -> Result<Publish, PubSubError> {
        self.publish_body(tag, Body::Chain(payload))
    }

    /// The shared-memory pool the publisher writes large payloads into (None where the
    /// system could not make one): blocks a program may fill and hand to
    /// [`Publisher::publish_chain`].
    pub fn pool(&self) -> Option<&Pool> {
        self.tx_pool.as_ref()
    }

    fn publish_body(&mut self, tag: u64, body: Body) -> Result<Publish, PubSubError> {
        let len = match body {
            Body::Bytes(b) => b.len(),
            Body::Chain(c) => c.len(),
        };
        let seq = self.seqs.get(&tag).copied().unwrap_or(0);
        let prefix = PublishedHeader { tag, seq }
            .prefix(len)
            .ok_or(PubSubError::TooLarge(len))?;
        let mut targets = std::mem::take(&mut self.scratch);
        targets.clear();
        targets.extend(
            self.subs
                .iter()
                .filter(|(_, s)| s.wants(tag))
                .map(|(c, _)| *c),
        );
        if self.cfg.policy == SlowPolicy::Block && targets.iter().any(|&c| self.slow(c)) {
            self.stats.would_block += 1;
            self.scratch = targets;
            return Ok(Publish::WouldBlock);
        }
        self.seqs.insert(tag, seq.wrapping_add(1));
        self.stats.published += 1;
        let shared = match body {
            _ if targets.is_empty() => None,
            Body::Bytes(b) if b.len() >= SHARE_MIN => self.shared_chain(&prefix, b),
            Body::Bytes(_) => None,
            // the prefix in the publisher's pool, then the caller's slices as they are
            Body::Chain(c) => self.shared_chain(&prefix, &[]).map(|mut ch| {
                for sl in c.slices() {
                    ch.push(sl.clone());
                }
                ch
            }),
        };
        // bytes for the paths that copy (small payloads, or no room to share)
        let flat;
        let payload: &[u8] = match body {
            Body::Bytes(b) => b,
            Body::Chain(_) if shared.is_some() => &[],
            Body::Chain(c) => {
                flat = c.to_vec();
                &flat
            }
        };
        let mut sent = 0;
        for &conn in &targets {
            if self.cfg.policy != SlowPolicy::Block && self.slow(conn) {
                if self.cfg.policy == SlowPolicy::Drop {
                    if let Some(s) = self.subs.get_mut(&conn) {
                        *s.gaps.entry(tag).or_insert(0) += 1;
                    }
                    self.stats.dropped += 1;
                } else {
                    let q = self.backlog(conn);
                    self.stats.disconnected_slow += 1;
                    self.goodbye(
                        conn,
                        GoodbyeCode::SlowSubscriber,
                        format!(
                            "slow subscriber: {q} bytes waiting (limit {}); first message not sent: tag {tag} seq {seq}",
                            self.cfg.max_queued
                        ),
                    );
                }
                continue;
            }
            let Some(s) = self.subs.get_mut(&conn) else {
                continue;
            };
            let delivery = s.delivery;
            // no hashing per message unless something was dropped for this subscriber
            let gap = if s.gaps.is_empty() {
                None
            } else {
                s.gaps.remove(&tag)
            };
            let mut ok = true;
            if let Some(missed) = gap {
                ok = self.send_gap(conn, delivery, tag, missed);
                if !ok {
                    self.stats.send_failures += 1;
                    self.goodbye(
                        conn,
                        GoodbyeCode::SendFailed,
                        format!("cannot send a gap of {missed} for tag {tag}"),
                    );
                }
            }
            if ok {
                let r = match (delivery, &shared) {
                    (Delivery::Latency, Some(chain)) => self.messenger.send_chain_now(conn, chain),
                    (Delivery::Throughput, Some(chain)) => {
                        self.messenger.send_fragment(conn, chain)
                    }
                    (Delivery::Latency, None) => {
                        let mut v = Vec::with_capacity(prefix.len() + payload.len());
                        v.extend_from_slice(&prefix);
                        v.extend_from_slice(payload);
                        self.messenger.send_encoded_now(conn, v)
                    }
                    (Delivery::Throughput, None) => self
                        .messenger
                        .send_encoded_batched(conn, &[&prefix, payload]),
                };
                match r {
                    Ok(()) => {
                        self.stats.delivered += 1;
                        sent += 1;
                    }
                    Err(e) => {
                        // never silent: the subscriber is cut off and told why (a closed
                        // connection is reported by poll as well)
                        self.stats.send_failures += 1;
                        self.goodbye(
                            conn,
                            GoodbyeCode::SendFailed,
                            format!("cannot send tag {tag} seq {seq}: {e}"),
                        );
                    }
                }
            }
        }
        self.scratch = targets;
        Ok(Publish::Sent(sent))
    }

    /// Publishes, polling while a slow subscriber holds it back (policy `Block`), for at
    /// most `timeout`; answers `WouldBlock` if it could not.
    pub fn publish_blocking(
        &mut self,
        tag: u64,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<Publish, PubSubError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match self.publish(tag, payload)? {
                Publish::WouldBlock if std::time::Instant::now() < deadline => {
                    self.flush();
                    self.poll(Some(Duration::from_millis(1)))
                        .map_err(|e| PubSubError::Config(format!("poll: {e}")))?;
                }
                r => return Ok(r),
            }
        }
    }

    fn send_gap(&mut self, conn: ConnId, delivery: Delivery, tag: u64, missed: u64) -> bool {
        let m = PubSubMessage::Gap { tag, missed }.encode();
        let r = match delivery {
            Delivery::Latency => self.messenger.send_encoded_now(conn, m),
            Delivery::Throughput => self.messenger.send_encoded_batched(conn, &[&m]),
        };
        if r.is_ok() {
            self.stats.gaps_sent += 1;
        }
        r.is_ok()
    }

    fn goodbye(&mut self, conn: ConnId, code: GoodbyeCode, reason: String) {
        if code == GoodbyeCode::Shutdown {
            debug!(?conn, "goodbye: {reason}");
        } else {
            warn!(?conn, "cutting off subscriber: {reason}");
        }
        if let Some(s) = self.subs.remove(&conn) {
            // what it missed first, so that it can account for everything
            let mut gaps: Vec<_> = s.gaps.into_iter().collect();
            gaps.sort_unstable();
            for (tag, missed) in gaps {
                let m = PubSubMessage::Gap { tag, missed }.encode();
                if self.messenger.send_encoded_batched(conn, &[&m]).is_ok() {
                    self.stats.gaps_sent += 1;
                }
            }
            self.stats.subscribers_left += 1;
            self.events.push(PubEvent::Left {
                conn,
                reason: reason.clone(),
            });
        }
        let _ = self
            .messenger
            .send_encoded_now(conn, PubSubMessage::Goodbye { code, reason }.encode());
        self.messenger.close(conn);
    }

    /// Sends every batched page now (the end of a pass of the event loop).
    pub fn flush(&mut self) {
        self.messenger.flush_due(std::time::Instant::now());
    }

    /// Makes progress: applies subscriptions, notes joins and departures, sends the gaps of
    /// subscribers that caught up, flushes pages. Waits at most `timeout` for something to
    /// happen.
    pub fn poll(&mut self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.flush();
        let mut incoming = std::mem::take(&mut self.incoming);
        self.messenger.poll(&mut incoming, timeout)?;
        for ev in incoming.drain(..) {
            match ev {
                Incoming::Accepted { conn, peer } => {
                    debug!(?conn, node = %peer.node_id, "subscriber joined");
                    self.stats.subscribers_joined += 1;
                    self.events.push(PubEvent::Joined {
                        conn,
                        peer: peer.clone(),
                    });
                    self.subs.insert(
                        conn,
                        Sub {
                            peer,
                            ranges: Vec::new(),
                            delivery: Delivery::Throughput,
                            gaps: SmallKeyMap::default(),
                        },
                    );
                }
                Incoming::Connected { conn, .. } => {
                    // a publisher connects to nobody
                    self.messenger.close(conn);
                }
                Incoming::Closed { conn, reason } => {
                    if self.subs.remove(&conn).is_some() {
                        self.stats.subscribers_left += 1;
                        self.events.push(PubEvent::Left {
                            conn,
                            reason: reason.to_string(),
                        });
                    }
                }
                Incoming::Received { conn, msg } => self.handle(conn, msg),
            }
        }
        self.incoming = incoming;
        self.send_caught_up_gaps();
        self.flush();
        Ok(())
    }

    fn handle(&mut self, conn: ConnId, msg: Received) {
        let Some(sub) = self.subs.get_mut(&conn) else {
            return;
        };
        match msg {
            Received::PubSub(PubSubMessage::Subscribe { delivery, ranges }) => {
                sub.delivery = delivery;
                sub.ranges.extend(ranges);
                normalize(&mut sub.ranges);
                if sub.ranges.len() > MAX_SUBSCRIBER_RANGES {
                    let n = sub.ranges.len();
                    self.stats.disconnected_bad += 1;
                    self.goodbye(
                        conn,
                        GoodbyeCode::BadRequest,
                        format!("{n} tag ranges subscribed, more than {MAX_SUBSCRIBER_RANGES}"),
                    );
                }
            }
            Received::PubSub(PubSubMessage::Unsubscribe { ranges }) => {
                subtract(&mut sub.ranges, &ranges);
            }
            other => {
                let what = match other {
                    Received::Message(m) => format!("{:?}", m.msg_type()),
                    Received::Fragment { .. } | Received::Fragments(_) => "Fragment".into(),
                    Received::Published { .. } => "Published".into(),
                    Received::PubSub(m) => format!("{:?}", m.msg_type()),
                };
                self.stats.disconnected_bad += 1;
                self.goodbye(
                    conn,
                    GoodbyeCode::BadRequest,
                    format!("a subscriber may send Subscribe and Unsubscribe only, not {what}"),
                );
            }
        }
    }

    fn send_caught_up_gaps(&mut self) {
        let ready: Vec<ConnId> = self
            .subs
            .iter()
            .filter(|(_, s)| !s.gaps.is_empty())
            .map(|(c, _)| *c)
            .filter(|&c| !self.slow(c))
            .collect();
        for conn in ready {
            let Some(s) = self.subs.get_mut(&conn) else {
                continue;
            };
            let delivery = s.delivery;
            let mut gaps: Vec<_> = s.gaps.drain().collect();
            gaps.sort_unstable();
            for (tag, missed) in gaps {
                if !self.send_gap(conn, delivery, tag, missed) {
                    self.stats.send_failures += 1;
                    self.goodbye(
                        conn,
                        GoodbyeCode::SendFailed,
                        format!("cannot send a gap of {missed} for tag {tag}"),
                    );
                    break;
                }
            }
        }
    }

    /// Sends every subscriber its pending gaps and a Goodbye(Shutdown), and closes them.
    pub fn shutdown(&mut self, reason: &str) {
        let conns: Vec<ConnId> = self.subs.keys().copied().collect();
        for c in conns {
            self.goodbye(c, GoodbyeCode::Shutdown, reason.to_string());
        }
    }

    /// Bytes waiting for subscriber `conn` (and, over shared memory, held by it unread).
    pub fn queued_bytes(&self, conn: ConnId) -> usize {
        self.backlog(conn)
    }

    /// Bytes waiting for all subscribers together (see [`Publisher::queued_bytes`]).
    pub fn backlog_total(&self) -> usize {
        self.subs.keys().map(|&c| self.backlog(c)).sum()
    }

    /// The peer handshake of subscriber `conn`.
    pub fn peer(&self, conn: ConnId) -> Option<&Hello> {
        self.subs.get(&conn).map(|s| &s.peer)
    }
}

/// What a [`Subscriber`]'s poll hands over.
#[derive(Debug)]
pub enum SubEvent {
    /// The connection to `publisher` is open (subscriptions made before now have been sent).
    Connected { publisher: ConnId, peer: Hello },
    /// A message; its payload is still in the receive pool's blocks (dropping it frees them).
    Message {
        publisher: ConnId,
        tag: u64,
        seq: u64,
        payload: Chain,
    },
    /// `missed` messages of `tag` were dropped for us by `publisher` (its policy `drop`).
    Gap {
        publisher: ConnId,
        tag: u64,
        missed: u64,
    },
    /// The publisher cut us off, and why (then `Closed` follows).
    Goodbye {
        publisher: ConnId,
        code: GoodbyeCode,
        reason: String,
    },
    /// The connection is gone.
    Closed {
        publisher: ConnId,
        reason: CloseReason,
    },
}

/// A subscriber's counters, over all its publishers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubscriberStats {
    pub received: u64,
    pub payload_bytes: u64,
    /// Sum of every Gap's `missed`.
    pub missed: u64,
    pub gaps: u64,
    pub goodbyes: u64,
    /// Publishers that broke the protocol (and were disconnected).
    pub protocol_errors: u64,
}

struct PubLink {
    open: bool,
    /// Requests made before the connection opened.
    pending: Vec<PubSubMessage>,
}

/// The subscribing socket: connects to any number of publishers.
pub struct Subscriber {
    messenger: Messenger,
    pubs: SmallKeyMap<ConnId, PubLink>,
    stats: SubscriberStats,
    incoming: Vec<Incoming>,
}

impl Subscriber {
    pub fn new(transport: Box<dyn Transport>, cfg: MessengerConfig) -> Self {
        Subscriber {
            messenger: Messenger::new(transport, cfg),
            pubs: SmallKeyMap::default(),
            stats: SubscriberStats::default(),
            incoming: Vec::new(),
        }
    }

    pub fn stats(&self) -> SubscriberStats {
        self.stats
    }

    /// Connects to a publisher; subscriptions may be made at once (they are sent when the
    /// connection opens).
    pub fn connect(&mut self, addr: &str, hello: Hello) -> Result<ConnId, PubSubError> {
        let c = self.messenger.connect(addr, hello)?;
        self.pubs.insert(
            c,
            PubLink {
                open: false,
                pending: Vec::new(),
            },
        );
        Ok(c)
    }

    fn request(&mut self, publisher: ConnId, m: PubSubMessage) -> Result<(), PubSubError> {
        let link = self
            .pubs
            .get_mut(&publisher)
            .ok_or(PubSubError::NoPublisher(publisher))?;
        if link.open {
            self.messenger.send_encoded_now(publisher, m.encode())?;
        } else {
            link.pending.push(m);
        }
        Ok(())
    }

    /// Subscribes to `ranges` at `publisher` (sent in pieces of at most
    /// [`MAX_TAG_RANGES`]). The delivery applies to all of this subscriber's tags at that
    /// publisher.
    pub fn subscribe(
        &mut self,
        publisher: ConnId,
        ranges: &[TagRange],
        delivery: Delivery,
    ) -> Result<(), PubSubError> {
        for chunk in ranges.chunks(MAX_TAG_RANGES) {
            self.request(
                publisher,
                PubSubMessage::Subscribe {
                    delivery,
                    ranges: chunk.to_vec(),
                },
            )?;
        }
        Ok(())
    }

    /// Unsubscribes from `ranges` at `publisher`. Messages the publisher sent before it
    /// received this still arrive.
    pub fn unsubscribe(
        &mut self,
        publisher: ConnId,
        ranges: &[TagRange],
    ) -> Result<(), PubSubError> {
        for chunk in ranges.chunks(MAX_TAG_RANGES) {
            self.request(
                publisher,
                PubSubMessage::Unsubscribe {
                    ranges: chunk.to_vec(),
                },
            )?;
        }
        Ok(())
    }

    /// Closes the connection to `publisher`.
    pub fn disconnect(&mut self, publisher: ConnId) {
        self.messenger.close(publisher);
    }

    /// Makes progress and appends what arrived; waits at most `timeout`.
    pub fn poll(
        &mut self,
        out: &mut Vec<SubEvent>,
        timeout: Option<Duration>,
    ) -> std::io::Result<()> {
        let mut incoming = std::mem::take(&mut self.incoming);
        self.messenger.poll(&mut incoming, timeout)?;
        for ev in incoming.drain(..) {
            match ev {
                Incoming::Connected { conn, peer } => {
                    let Some(link) = self.pubs.get_mut(&conn) else {
                        continue;
                    };
                    link.open = true;
                    let pending = std::mem::take(&mut link.pending);
                    for m in pending {
                        let _ = self.messenger.send_encoded_now(conn, m.encode());
                    }
                    out.push(SubEvent::Connected {
                        publisher: conn,
                        peer,
                    });
                }
                Incoming::Accepted { conn, .. } => {
                    // a subscriber accepts nothing
                    self.messenger.close(conn);
                }
                Incoming::Closed { conn, reason } => {
                    if self.pubs.remove(&conn).is_some() {
                        out.push(SubEvent::Closed {
                            publisher: conn,
                            reason,
                        });
                    }
                }
                Incoming::Received { conn, msg } => {
                    match msg {
                        Received::Published { header, payload } => {
                            self.stats.received += 1;
                            self.stats.payload_bytes += payload.len() as u64;
                            out.push(SubEvent::Message {
                                publisher: conn,
                                tag: header.tag,
                                seq: header.seq,
                                payload,
                            });
                        }
                        Received::PubSub(PubSubMessage::Gap { tag, missed }) => {
                            self.stats.gaps += 1;
                            self.stats.missed += missed;
                            out.push(SubEvent::Gap {
                                publisher: conn,
                                tag,
                                missed,
                            });
                        }
                        Received::PubSub(PubSubMessage::Goodbye { code, reason }) => {
                            self.stats.goodbyes += 1;
                            out.push(SubEvent::Goodbye {
                                publisher: conn,
                                code,
                                reason,
                            });
                        }
                        _ => {
                            self.stats.protocol_errors += 1;
                            warn!(?conn, "publisher sent a message a subscriber does not take; disconnecting");
                            self.messenger.close(conn);
                            if self.pubs.remove(&conn).is_some() {
                                out.push(SubEvent::Closed {
                                    publisher: conn,
                                    reason: CloseReason::Protocol(WireError::OutOfRange {
                                        what: "message type from a publisher",
                                        value: 0,
                                    }),
                                });
                            }
                        }
                    }
                }
            }
        }
        self.incoming = incoming;
        Ok(())
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    fn r(first: u64, last: u64) -> TagRange {
        TagRange { first, last }
    }

    #[test]
    fn range_sets() {
        let mut s = vec![r(5, 9), r(1, 2), r(3, 4), r(20, 20)];
        normalize(&mut s);
        assert_eq!(s, vec![r(1, 9), r(20, 20)]);
        subtract(&mut s, &[r(4, 6)]);
        assert_eq!(s, vec![r(1, 3), r(7, 9), r(20, 20)]);
        subtract(&mut s, &[r(0, u64::MAX)]);
        assert!(s.is_empty());
        let mut s = vec![r(0, u64::MAX)];
        subtract(&mut s, &[r(0, 0), r(u64::MAX, u64::MAX)]);
        assert_eq!(s, vec![r(1, u64::MAX - 1)]);
        let sub = Sub {
            peer: Hello::new(evb_wire::Channel::Data, evb_wire::Role::Bu, 0, "r", "n"),
            ranges: vec![r(1, 3), r(7, 9)],
            delivery: Delivery::Latency,
            gaps: SmallKeyMap::default(),
        };
        let wanted: Vec<u64> = (0..12).filter(|&t| sub.wants(t)).collect();
        assert_eq!(wanted, vec![1, 2, 3, 7, 8, 9]);
    }

    #[test]
    fn config_ranges_are_checked() {
        let mut c = PublisherConfig::default();
        assert!(c.validate().is_ok());
        c.max_queued = 10;
        assert!(c.validate().is_err());
        c.max_queued = 2 << 30;
        assert!(c.validate().is_err());
        let mut c = PublisherConfig::default();
        c.messenger.page_size = 0;
        assert!(c.validate().is_err());
    }
}

//! The publishing socket: subscriptions per subscriber, fan-out of each message to the
//! subscribers of its tag, and the slow-subscriber policies (see `evb_messaging::pubsub`).

use std::time::Duration;

use evb_buffers::small_keys::SmallKeyMap;
use evb_buffers::{BlockWriter, Chain, Pool};
use evb_transport::{ConnId, Transport};
use evb_wire::pubsub::{Delivery, GoodbyeCode, PubSubMessage, PublishedHeader, TagRange};
use evb_wire::Hello;
use tracing::{debug, warn};

use super::ranges::{normalize, subtract};
use super::{
    PubSubError, Publish, PublisherConfig, PublisherStats, SlowPolicy, MAX_SUBSCRIBER_RANGES,
    SHARE_MIN, TX_BLOCK, TX_BLOCKS,
};
use crate::{Incoming, Messenger, Received};

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

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn a_subscriber_wants_the_tags_of_its_ranges() {
        let r = |first, last| TagRange { first, last };
        let sub = Sub {
            peer: Hello::new(evb_wire::Channel::Data, evb_wire::Role::Bu, 0, "r", "n"),
            ranges: vec![r(1, 3), r(7, 9)],
            delivery: Delivery::Latency,
            gaps: SmallKeyMap::default(),
        };
        let wanted: Vec<u64> = (0..12).filter(|&t| sub.wants(t)).collect();
        assert_eq!(wanted, vec![1, 2, 3, 7, 8, 9]);
    }
}

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
//! The handshake's roles are the event builder's: a publisher's transport says `Role::Ru`
//! (the sending side) and subscribers connect as `Role::Bu` (the receiving side), as below.
//! Nothing here acts on the role; a pub/sub role of its own would change the byte every
//! peer's handshake decoder checks.
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
//!
//! The parts: `publisher` (the publishing socket and its slow-subscriber policies),
//! `subscriber` (the subscribing socket), `ranges` (the tag-range sets a publisher keeps
//! per subscriber); this file holds what both sides share: the configuration, errors and
//! counters.

use evb_transport::{ConnId, TransportError};

use crate::MessengerConfig;

mod publisher;
mod ranges;
mod subscriber;

pub use publisher::{PubEvent, Publisher};
pub use subscriber::{SubEvent, Subscriber, SubscriberStats};

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

#[cfg(test)]
mod unit {
    use super::*;

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

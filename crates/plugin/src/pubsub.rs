//! Publish/subscribe by tag for programs that want a socket, not an event loop: a
//! [`PubSocket`] and a [`SubSocket`] over tcp or shm, each a thin blocking shell around
//! evb-messaging's [`Publisher`] and [`Subscriber`] (docs/messaging.md) that builds the
//! transport (handshake, receive pool, the secret from `EVB_SECRET`) and drives its poll.
//! No thread is started: a socket makes progress while one of its calls runs, so a
//! publisher that has nothing to publish for a while calls [`PubSocket::poll`] now and then
//! (to take new subscribers and their subscriptions, and to let queued messages out).
//!
//! ```no_run
//! use std::time::Duration;
//! use evb_plugin::pubsub::{parse_tags, PubOptions, PubSocket, Received, SubOptions, SubSocket};
//! # fn main() -> Result<(), evb_plugin::Error> {
//! let mut publisher = PubSocket::bind("127.0.0.1:0", PubOptions::default())?;
//! let addr = publisher.local_addr().to_string();
//!
//! // (usually another process) tags 10..=19 and 42
//! let mut sub = SubSocket::connect(&[addr.as_str()], &parse_tags("10-19,42")?, SubOptions::default())?;
//! publisher.wait_subscribers(1, Some(Duration::from_secs(10)))?;
//! publisher.publish(12, b"twelve")?;          // to the subscriber
//! publisher.publish(7, b"seven")?;            // nobody subscribes: nothing sent
//! publisher.flush()?;
//! match sub.recv(Some(Duration::from_secs(10)))? {
//!     Some(Received::Message { tag, seq, payload, .. }) => {
//!         assert_eq!((tag, seq, payload.to_vec()), (12, 0, b"twelve".to_vec()));
//!     }
//!     other => panic!("{other:?}"),
//! }
//! publisher.close("done")?; // the subscriber gets Goodbye, then Closed
//! # Ok(()) }
//! ```

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use evb_buffers::Pool;
use evb_messaging::pubsub::{
    PubSubError, Publish, Publisher, PublisherConfig, SubEvent, Subscriber,
};
use evb_messaging::MessengerConfig;
use evb_transport::{ConnId, Transport, TransportConfig};
use evb_wire::{Channel, Hello, Role};

pub use evb_buffers::Chain;
pub use evb_messaging::pubsub::{PublisherStats, SlowPolicy, SubscriberStats};
pub use evb_wire::pubsub::{Delivery, GoodbyeCode, TagRange};

use crate::Error;

/// Largest `max_message` (the messaging layer's frame limit is 4 GiB; a pub/sub socket
/// keeps to 256 MiB so that its receive pool stays reasonable).
pub const MAX_MESSAGE_LIMIT: usize = 256 << 20;
/// Receive-pool block size.
const RX_BLOCK: usize = 64 * 1024;
/// Room in a frame besides the payload (message and Published headers, a page's framing).
const FRAME_SLACK: usize = 4096;

/// The transports a pub/sub socket can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportKind {
    /// TCP (`HOST:PORT`; port 0 for any free one).
    #[default]
    Tcp,
    /// Shared memory between processes of one host (a name; `NAME:0` for any free one).
    Shm,
}

impl std::str::FromStr for TransportKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "tcp" => Ok(TransportKind::Tcp),
            "shm" => Ok(TransportKind::Shm),
            other => Err(Error::Setup(format!(
                "transport {other:?}: expected tcp or shm"
            ))),
        }
    }
}

/// How a [`PubSocket`] is made.
#[derive(Debug, Clone)]
pub struct PubOptions {
    pub transport: TransportKind,
    /// Handshake run id: publisher and subscribers must agree.
    pub run_id: String,
    /// What to do with a subscriber that does not keep up.
    pub policy: SlowPolicy,
    /// A subscriber is slow while this many bytes wait for it
    /// ([`evb_messaging::pubsub::MAX_QUEUED_RANGE`]).
    pub max_queued: usize,
    /// Threads writing subscribers' sockets beside the publishing one (0..=16, default 0;
    /// see `PublisherConfig::send_threads`).
    pub send_threads: usize,
    /// Largest payload `publish` takes (1..=[`MAX_MESSAGE_LIMIT`]).
    pub max_message: usize,
    /// Policy `block`: how long `publish` waits for a slow subscriber before answering
    /// [`Error::Timeout`] (nothing sent). `None`: as long as it takes.
    pub block_timeout: Option<Duration>,
    /// `close`: how long to let subscribers take what is queued for them before the
    /// Goodbye.
    pub linger: Duration,
    /// Shared secret of the handshake; `None`: `EVB_SECRET` from the environment, if set.
    pub secret: Option<Vec<u8>>,
}

impl Default for PubOptions {
    fn default() -> Self {
        PubOptions {
            transport: TransportKind::Tcp,
            run_id: "pubsub".into(),
            policy: SlowPolicy::Block,
            max_queued: 4 << 20,
            send_threads: 0,
            max_message: 1 << 20,
            block_timeout: None,
            linger: Duration::from_secs(5),
            secret: None,
        }
    }
}

/// How a [`SubSocket`] is made.
#[derive(Debug, Clone)]
pub struct SubOptions {
    pub transport: TransportKind,
    /// Handshake run id: publishers and subscriber must agree.
    pub run_id: String,
    /// Each message on the wire at once (`Latency`) or packed into pages (`Throughput`).
    pub delivery: Delivery,
    /// Largest payload accepted (1..=[`MAX_MESSAGE_LIMIT`]); larger ones close the
    /// connection. Must be at least the publishers' `max_message`.
    pub max_message: usize,
    /// Shared secret of the handshake; `None`: `EVB_SECRET` from the environment, if set.
    pub secret: Option<Vec<u8>>,
}

impl Default for SubOptions {
    fn default() -> Self {
        SubOptions {
            transport: TransportKind::Tcp,
            run_id: "pubsub".into(),
            delivery: Delivery::Throughput,
            max_message: 1 << 20,
            secret: None,
        }
    }
}

/// `key=value` pairs separated by commas, semicolons or white space (empty: none).
fn pairs(text: &str) -> Result<Vec<(&str, &str)>, Error> {
    text.split(|c: char| c == ',' || c == ';' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|item| {
            item.split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| Error::Setup(format!("option {item:?}: expected key=value")))
        })
        .collect()
}

fn number(key: &str, v: &str) -> Result<u64, Error> {
    v.parse::<u64>()
        .map_err(|_| Error::Setup(format!("option {key}={v:?}: not a whole number")))
}

fn check_max_message(n: usize) -> Result<(), Error> {
    if !(1..=MAX_MESSAGE_LIMIT).contains(&n) {
        return Err(Error::Setup(format!(
            "max_message {n} is outside 1..={MAX_MESSAGE_LIMIT}"
        )));
    }
    Ok(())
}

fn check_run_id(run_id: &str) -> Result<(), Error> {
    if run_id.is_empty() || run_id.len() > 64 {
        return Err(Error::Setup(format!(
            "run_id {run_id:?}: 1 to 64 characters"
        )));
    }
    Ok(())
}

fn millis(key: &str, v: &str) -> Result<Option<Duration>, Error> {
    if v == "-1" || v == "none" {
        return Ok(None);
    }
    let n = number(key, v)?;
    if n > 86_400_000 {
        return Err(Error::Setup(format!(
            "option {key}={n}: more than a day (86400000 ms)"
        )));
    }
    Ok(Some(Duration::from_millis(n)))
}

impl PubOptions {
    /// Options from `key=value` text (the C ABI's form): `transport` (tcp, shm), `run_id`,
    /// `policy` (block, drop, disconnect), `max_queued`, `send_threads`, `max_message`
    /// (bytes), `block_timeout_ms` (-1: none), `linger_ms`, `secret`. Keys not given keep
    /// their defaults.
    ///
    /// # Errors
    /// [`Error::Setup`] naming the key and the value at fault.
    pub fn parse(text: &str) -> Result<PubOptions, Error> {
        let mut o = PubOptions::default();
        for (k, v) in pairs(text)? {
            match k {
                "transport" => o.transport = v.parse()?,
                "run_id" => o.run_id = v.to_string(),
                "policy" => o.policy = v.parse().map_err(Error::Setup)?,
                "max_queued" => o.max_queued = number(k, v)? as usize,
                "send_threads" => o.send_threads = number(k, v)? as usize,
                "max_message" => o.max_message = number(k, v)? as usize,
                "block_timeout_ms" => o.block_timeout = millis(k, v)?,
                "linger_ms" => o.linger = millis(k, v)?.unwrap_or(Duration::ZERO),
                "secret" => o.secret = Some(v.as_bytes().to_vec()),
                other => {
                    return Err(Error::Setup(format!(
                        "unknown publisher option {other:?} (transport, run_id, policy, max_queued, send_threads, max_message, block_timeout_ms, linger_ms, secret)"
                    )))
                }
            }
        }
        o.validate()?;
        Ok(o)
    }

    /// # Errors
    /// [`Error::Setup`] naming the option out of range.
    pub fn validate(&self) -> Result<(), Error> {
        check_run_id(&self.run_id)?;
        check_max_message(self.max_message)?;
        // the publisher's own ranges, checked where they are defined
        PublisherConfig {
            max_queued: self.max_queued,
            send_threads: self.send_threads,
            ..PublisherConfig::default()
        }
        .validate()
        .map_err(|e| match e {
            PubSubError::Config(why) => Error::Setup(why),
            other => Error::Setup(other.to_string()),
        })
    }
}

impl SubOptions {
    /// Options from `key=value` text (the C ABI's form): `transport` (tcp, shm), `run_id`,
    /// `delivery` (latency, throughput), `max_message` (bytes), `secret`.
    ///
    /// # Errors
    /// [`Error::Setup`] naming the key and the value at fault.
    pub fn parse(text: &str) -> Result<SubOptions, Error> {
        let mut o = SubOptions::default();
        for (k, v) in pairs(text)? {
            match k {
                "transport" => o.transport = v.parse()?,
                "run_id" => o.run_id = v.to_string(),
                "delivery" => o.delivery = parse_delivery(v)?,
                "max_message" => o.max_message = number(k, v)? as usize,
                "secret" => o.secret = Some(v.as_bytes().to_vec()),
                other => {
                    return Err(Error::Setup(format!(
                        "unknown subscriber option {other:?} (transport, run_id, delivery, max_message, secret)"
                    )))
                }
            }
        }
        o.validate()?;
        Ok(o)
    }

    /// # Errors
    /// [`Error::Setup`] naming the option out of range.
    pub fn validate(&self) -> Result<(), Error> {
        check_run_id(&self.run_id)?;
        check_max_message(self.max_message)
    }
}

/// `latency` or `throughput`.
///
/// # Errors
/// [`Error::Setup`] for anything else.
pub fn parse_delivery(s: &str) -> Result<Delivery, Error> {
    match s {
        "latency" => Ok(Delivery::Latency),
        "throughput" => Ok(Delivery::Throughput),
        other => Err(Error::Setup(format!(
            "delivery {other:?}: expected latency or throughput"
        ))),
    }
}

/// Most items [`parse_tags`] takes.
pub const MAX_TAG_ITEMS: usize = 65_536;

/// Tags as text: a list of tags and ranges, `0,5,10-19` (white space allowed).
///
/// # Errors
/// [`Error::Setup`] naming the item at fault (not a u64, an empty range, no tags at all,
/// more than [`MAX_TAG_ITEMS`]).
pub fn parse_tags(s: &str) -> Result<Vec<TagRange>, Error> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        if out.len() >= MAX_TAG_ITEMS {
            return Err(Error::Setup(format!(
                "tags: more than {MAX_TAG_ITEMS} items"
            )));
        }
        let num = |x: &str| {
            x.trim()
                .parse::<u64>()
                .map_err(|_| Error::Setup(format!("tags: {x:?} is not a tag (0..2^64)")))
        };
        let r = match item.split_once('-') {
            Some((a, b)) => TagRange {
                first: num(a)?,
                last: num(b)?,
            },
            None => TagRange::one(num(item)?),
        };
        if r.first > r.last {
            return Err(Error::Setup(format!("tags: range {item:?} is empty")));
        }
        out.push(r);
    }
    if out.is_empty() {
        return Err(Error::Setup(format!("tags {s:?}: no tags")));
    }
    Ok(out)
}

fn secret(given: &Option<Vec<u8>>) -> Option<Vec<u8>> {
    given
        .clone()
        .or_else(|| std::env::var("EVB_SECRET").ok().map(String::into_bytes))
}

fn transport(
    kind: TransportKind,
    run_id: &str,
    node: &str,
    max_message: usize,
    secret: Option<Vec<u8>>,
) -> Result<Box<dyn Transport>, Error> {
    let max_frame = max_message + FRAME_SLACK;
    // room for two of the largest messages, and at least 4 MiB
    let blocks = (2 * max_frame.div_ceil(RX_BLOCK) + 8).max(64);
    let cfg = TransportConfig {
        run_id: run_id.to_string(),
        local: Hello::new(Channel::Data, Role::Ru, 0, run_id, node),
        max_frame: u32::try_from(max_frame).unwrap_or(u32::MAX),
        rx_pool: Pool::new(node, RX_BLOCK, blocks),
        secret,
    };
    match kind {
        TransportKind::Tcp => Ok(Box::new(
            evb_transport::tcp::TcpTransport::new(cfg)
                .map_err(|e| Error::Setup(format!("tcp transport: {e}")))?,
        )),
        TransportKind::Shm => evb_transport::shm::ShmTransport::new(cfg)
            .map_err(|e| Error::Setup(format!("shm transport: {e}"))),
    }
}

/// The instant `t` from now; None (no limit) when that is past what an `Instant` holds.
fn after(t: Duration) -> Option<Instant> {
    Instant::now().checked_add(t)
}

fn io(what: &str, e: std::io::Error) -> Error {
    Error::Io(format!("{what}: {e}"))
}

fn messaging(e: PubSubError) -> Error {
    match e {
        PubSubError::Config(m) => Error::Setup(m),
        PubSubError::TooLarge(n) => Error::Size {
            size: n,
            why: "too large for one message".into(),
        },
        other => Error::Io(other.to_string()),
    }
}

/// What one [`PubSocket::publish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sent {
    /// Subscribers the message went to (0: nobody subscribes to its tag).
    pub delivered: usize,
    /// Subscribers whose copy was dropped (policy `drop`: they are told by a Gap) or who
    /// were cut off for being slow (policy `disconnect`).
    pub dropped: usize,
}

/// A publishing socket: binds, takes subscribers, publishes tagged messages to those that
/// subscribe to the tag. Not shared between threads (it may move to another one).
pub struct PubSocket {
    publisher: Publisher,
    addr: String,
    opts: PubOptions,
    /// `publish` calls since the last poll.
    since_poll: u32,
    closed: bool,
}

/// Publishes between two polls of the socket (joins, subscriptions, pages going out).
const POLL_EVERY: u32 = 64;

impl PubSocket {
    /// Listens on `addr` (tcp: `HOST:PORT`, port 0 for any; shm: a name, `NAME:0` for any).
    ///
    /// # Errors
    /// [`Error::Setup`]: an option out of range, or the address cannot be bound (named).
    pub fn bind(addr: &str, opts: PubOptions) -> Result<PubSocket, Error> {
        opts.validate()?;
        let node = format!("pub-{}", std::process::id());
        let t = transport(
            opts.transport,
            &opts.run_id,
            &node,
            opts.max_message,
            secret(&opts.secret),
        )?;
        let cfg = PublisherConfig {
            policy: opts.policy,
            max_queued: opts.max_queued,
            send_threads: opts.send_threads,
            messenger: MessengerConfig::default(),
        };
        let mut publisher = Publisher::new(t, cfg).map_err(messaging)?;
        let addr = publisher
            .listen(addr)
            .map_err(|e| Error::Setup(format!("cannot listen on {addr:?}: {e}")))?;
        Ok(PubSocket {
            publisher,
            addr,
            opts,
            since_poll: 0,
            closed: false,
        })
    }

    /// The address bound (what subscribers connect to).
    pub fn local_addr(&self) -> &str {
        &self.addr
    }

    fn open(&self) -> Result<(), Error> {
        if self.closed {
            return Err(Error::State("the publisher is closed".into()));
        }
        Ok(())
    }

    /// Makes progress (new subscribers, subscriptions, queued messages out), waiting at most
    /// `timeout` for something to happen.
    ///
    /// # Errors
    /// [`Error::State`] after `close`; [`Error::Io`] if the socket's poll fails.
    pub fn poll(&mut self, timeout: Duration) -> Result<(), Error> {
        self.open()?;
        self.since_poll = 0;
        self.publisher
            .poll(Some(timeout))
            .map_err(|e| io("publisher poll", e))
    }

    /// Publishes `payload` under `tag` to every subscriber of `tag` (one copy each under
    /// 4 KiB; larger payloads are written once and shared). Under policy `block` it waits
    /// (polling) while a subscriber of the tag is slow, at most `block_timeout`.
    /// Messages may wait in a subscriber's page (delivery `throughput`) until the next poll
    /// or [`flush`](Self::flush).
    ///
    /// # Errors
    /// [`Error::Size`] for a payload over `max_message` (nothing sent); [`Error::Timeout`]
    /// when `block_timeout` passed (nothing sent); [`Error::State`] after `close`.
    pub fn publish(&mut self, tag: u64, payload: &[u8]) -> Result<Sent, Error> {
        self.open()?;
        if payload.len() > self.opts.max_message {
            return Err(Error::Size {
                size: payload.len(),
                why: format!("larger than max_message {}", self.opts.max_message),
            });
        }
        if self.since_poll >= POLL_EVERY {
            self.poll(Duration::ZERO)?;
        }
        self.since_poll += 1;
        let deadline = self.opts.block_timeout.and_then(after);
        loop {
            let before = self.publisher.stats();
            match self.publisher.publish(tag, payload).map_err(messaging)? {
                Publish::Sent(n) => {
                    let after = self.publisher.stats();
                    let dropped = (after.dropped - before.dropped)
                        + (after.disconnected_slow - before.disconnected_slow);
                    return Ok(Sent {
                        delivered: n,
                        dropped: dropped as usize,
                    });
                }
                Publish::WouldBlock => {
                    let wait = match deadline {
                        Some(d) => {
                            let now = Instant::now();
                            if now >= d {
                                return Err(Error::Timeout(format!(
                                    "a subscriber of tag {tag} is slow (policy block): nothing sent within block_timeout {:?}",
                                    self.opts.block_timeout.unwrap_or_default()
                                )));
                            }
                            (d - now).min(Duration::from_millis(1))
                        }
                        None => Duration::from_millis(1),
                    };
                    self.poll(wait)?;
                }
            }
        }
    }

    /// Sends every page now and writes what the transport can take.
    ///
    /// # Errors
    /// As [`poll`](Self::poll).
    pub fn flush(&mut self) -> Result<(), Error> {
        self.open()?;
        self.publisher.flush();
        self.poll(Duration::ZERO)
    }

    /// Polls until at least `n` subscribers have subscribed to something, or `timeout`
    /// passed (`None`: no limit). Returns how many have.
    ///
    /// # Errors
    /// [`Error::Timeout`] naming how many came; as [`poll`](Self::poll).
    pub fn wait_subscribers(
        &mut self,
        n: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, Error> {
        self.open()?;
        let deadline = timeout.and_then(after);
        loop {
            self.poll(Duration::from_millis(5))?;
            let have = self.publisher.subscribed();
            if have >= n {
                // a few more passes: every Subscribe that is on its way lands
                for _ in 0..3 {
                    self.poll(Duration::from_millis(2))?;
                }
                return Ok(self.publisher.subscribed());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::Timeout(format!(
                    "{have} of {n} subscribers subscribed within {:?}",
                    timeout.unwrap_or_default()
                )));
            }
        }
    }

    /// Polls until every subscriber has taken what is queued for it, or `timeout` passed.
    /// Returns whether everything went.
    ///
    /// # Errors
    /// As [`poll`](Self::poll).
    pub fn drain(&mut self, timeout: Duration) -> Result<bool, Error> {
        self.flush()?;
        let deadline = after(timeout);
        while self.publisher.backlog_total() > 0 {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
            self.poll(Duration::from_millis(2))?;
        }
        Ok(true)
    }

    /// Connected subscribers (whether they subscribe to anything or not).
    pub fn subscribers(&self) -> usize {
        self.publisher.subscribers()
    }

    /// Subscribers that subscribe to at least one tag.
    pub fn subscribed(&self) -> usize {
        self.publisher.subscribed()
    }

    /// Subscribers of `tag`.
    pub fn subscribers_of(&self, tag: u64) -> usize {
        self.publisher.subscribers_of(tag)
    }

    /// The publisher's counters (published, delivered, dropped, gaps sent, ...).
    pub fn stats(&self) -> PublisherStats {
        self.publisher.stats()
    }

    /// Lets subscribers take what is queued for them (at most `linger`), sends each a
    /// Goodbye with `reason` and closes their connections. Later calls answer
    /// [`Error::State`]; a second `close` does nothing. Dropping the socket closes the
    /// connections without the linger.
    ///
    /// # Errors
    /// [`Error::Io`] if the socket's poll fails (the socket is closed all the same).
    pub fn close(&mut self, reason: &str) -> Result<PublisherStats, Error> {
        if self.closed {
            return Ok(self.publisher.stats());
        }
        let result = self.close_inner(reason);
        self.closed = true;
        result.map(|()| self.publisher.stats())
    }

    fn close_inner(&mut self, reason: &str) -> Result<(), Error> {
        let linger = self.opts.linger;
        self.drain(linger)?;
        self.publisher.shutdown(reason);
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until && self.publisher.subscribers() > 0 {
            self.poll(Duration::from_millis(2))?;
        }
        // the Goodbyes on their way out
        for _ in 0..5 {
            self.poll(Duration::from_millis(2))?;
        }
        Ok(())
    }
}

/// What a [`SubSocket`] receives.
#[derive(Debug)]
pub enum Received {
    /// A message: from the `publisher`-th address given to `connect`, its `tag`, the
    /// publisher's sequence number for that tag (0, 1, ...; a gap is announced), and the
    /// payload, in place in the receive pool (dropping it gives the blocks back).
    Message {
        publisher: usize,
        tag: u64,
        seq: u64,
        payload: Chain,
    },
    /// `missed` messages of `tag` were dropped for us (the publisher's policy `drop`).
    Gap {
        publisher: usize,
        tag: u64,
        missed: u64,
    },
    /// The publisher cut us off (shutting down, we were slow, ...): why. `Closed` follows.
    Goodbye {
        publisher: usize,
        code: GoodbyeCode,
        reason: String,
    },
    /// The connection to that publisher is gone (or could not be made): why.
    Closed { publisher: usize, reason: String },
}

/// A subscribing socket: connected to one or more publishers, subscribed to tag ranges at
/// all of them. Not shared between threads (it may move to another one).
pub struct SubSocket {
    subscriber: Subscriber,
    /// Connection per address index; None once closed.
    conns: Vec<Option<ConnId>>,
    index: HashMap<ConnId, usize>,
    delivery: Delivery,
    queue: VecDeque<Received>,
    events: Vec<SubEvent>,
}

impl SubSocket {
    /// Connects to each publisher of `addrs` and subscribes to `tags` at all of them
    /// (the subscriptions go out as each connection opens). A connection that fails is a
    /// `Closed` from `recv`, naming why.
    ///
    /// # Errors
    /// [`Error::Setup`]: no address, no tags, an option out of range, an address the
    /// transport cannot parse (named).
    pub fn connect(
        addrs: &[&str],
        tags: &[TagRange],
        opts: SubOptions,
    ) -> Result<SubSocket, Error> {
        opts.validate()?;
        if addrs.is_empty() {
            return Err(Error::Setup("no publisher address".into()));
        }
        if tags.is_empty() {
            return Err(Error::Setup("no tags to subscribe to".into()));
        }
        let node = format!("sub-{}", std::process::id());
        let t = transport(
            opts.transport,
            &opts.run_id,
            &node,
            opts.max_message,
            secret(&opts.secret),
        )?;
        let mut subscriber = Subscriber::new(t, MessengerConfig::default());
        let mut conns = Vec::with_capacity(addrs.len());
        let mut index = HashMap::new();
        for (i, addr) in addrs.iter().enumerate() {
            let hello = Hello::new(Channel::Data, Role::Bu, 0, &opts.run_id, &node);
            let c = subscriber
                .connect(addr, hello)
                .map_err(|e| Error::Setup(format!("publisher {addr:?}: {e}")))?;
            subscriber
                .subscribe(c, tags, opts.delivery)
                .map_err(messaging)?;
            conns.push(Some(c));
            index.insert(c, i);
        }
        Ok(SubSocket {
            subscriber,
            conns,
            index,
            delivery: opts.delivery,
            queue: VecDeque::new(),
            events: Vec::new(),
        })
    }

    /// Subscribes to more tags at every publisher still connected.
    ///
    /// # Errors
    /// [`Error::Io`] if a request cannot be sent.
    pub fn subscribe(&mut self, tags: &[TagRange]) -> Result<(), Error> {
        for c in self.conns.iter().flatten() {
            self.subscriber
                .subscribe(*c, tags, self.delivery)
                .map_err(messaging)?;
        }
        Ok(())
    }

    /// Unsubscribes from tags at every publisher still connected. Messages a publisher
    /// sent before it read this still arrive.
    ///
    /// # Errors
    /// [`Error::Io`] if a request cannot be sent.
    pub fn unsubscribe(&mut self, tags: &[TagRange]) -> Result<(), Error> {
        for c in self.conns.iter().flatten() {
            self.subscriber.unsubscribe(*c, tags).map_err(messaging)?;
        }
        Ok(())
    }

    /// Publishers still connected (or connecting).
    pub fn open_publishers(&self) -> usize {
        self.conns.iter().flatten().count()
    }

    /// The subscriber's counters over all its publishers.
    pub fn stats(&self) -> SubscriberStats {
        self.subscriber.stats()
    }

    fn take(&mut self) {
        for e in self.events.drain(..) {
            let at = |c: &ConnId| self.index.get(c).copied().unwrap_or(usize::MAX);
            let r = match e {
                SubEvent::Connected { .. } => continue,
                SubEvent::Message {
                    publisher,
                    tag,
                    seq,
                    payload,
                } => Received::Message {
                    publisher: at(&publisher),
                    tag,
                    seq,
                    payload,
                },
                SubEvent::Gap {
                    publisher,
                    tag,
                    missed,
                } => Received::Gap {
                    publisher: at(&publisher),
                    tag,
                    missed,
                },
                SubEvent::Goodbye {
                    publisher,
                    code,
                    reason,
                } => Received::Goodbye {
                    publisher: at(&publisher),
                    code,
                    reason,
                },
                SubEvent::Closed { publisher, reason } => {
                    let i = at(&publisher);
                    if let Some(slot) = self.conns.get_mut(i) {
                        *slot = None;
                    }
                    Received::Closed {
                        publisher: i,
                        reason: reason.to_string(),
                    }
                }
            };
            self.queue.push_back(r);
        }
    }

    /// The next thing that arrived, waiting at most `timeout` (`None`: no limit). `None`
    /// when nothing came in time, or at once when every publisher's connection is closed
    /// and everything was taken ([`open_publishers`](Self::open_publishers) is then 0).
    ///
    /// # Errors
    /// [`Error::Io`] if the socket's poll fails.
    pub fn recv(&mut self, timeout: Option<Duration>) -> Result<Option<Received>, Error> {
        let deadline = timeout.and_then(after);
        loop {
            if let Some(r) = self.queue.pop_front() {
                return Ok(Some(r));
            }
            if self.open_publishers() == 0 {
                return Ok(None);
            }
            let wait = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_millis(100),
            };
            self.subscriber
                .poll(&mut self.events, Some(wait))
                .map_err(|e| io("subscriber poll", e))?;
            self.take();
            if self.queue.is_empty() && deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    /// Closes every connection (the publishers see the subscriber leave).
    pub fn close(&mut self) {
        for c in self.conns.iter_mut() {
            if let Some(c) = c.take() {
                self.subscriber.disconnect(c);
            }
        }
        // one pass: the Byes go out
        let _ = self.subscriber.poll(&mut self.events, Some(Duration::ZERO));
        self.events.clear();
        self.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_tags_parse_and_name_what_is_wrong() {
        let o = PubOptions::parse(
            "transport=shm, policy=drop max_queued=8192;block_timeout_ms=50 send_threads=2",
        )
        .unwrap();
        assert_eq!(o.send_threads, 2);
        assert_eq!(o.transport, TransportKind::Shm);
        assert_eq!(o.policy, SlowPolicy::Drop);
        assert_eq!(o.max_queued, 8192);
        assert_eq!(o.block_timeout, Some(Duration::from_millis(50)));
        assert!(PubOptions::parse("").is_ok());
        let e = PubOptions::parse("policy=sometimes")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"sometimes\"") && e.contains("block, drop or disconnect"),
            "{e}"
        );
        let e = PubOptions::parse("max_queued=10").unwrap_err().to_string();
        assert!(e.contains("max_queued 10 is outside"), "{e}");
        let e = PubOptions::parse("send_threads=17")
            .unwrap_err()
            .to_string();
        assert!(e.contains("send_threads 17 is outside 0..=16"), "{e}");
        let e = PubOptions::parse("colour=blue").unwrap_err().to_string();
        assert!(e.contains("\"colour\""), "{e}");
        let e = PubOptions::parse("policy").unwrap_err().to_string();
        assert!(e.contains("key=value"), "{e}");
        let e = PubOptions::parse("max_message=x").unwrap_err().to_string();
        assert!(e.contains("max_message=\"x\""), "{e}");
        let s = SubOptions::parse("delivery=latency run_id=abc").unwrap();
        assert_eq!((s.delivery, s.run_id.as_str()), (Delivery::Latency, "abc"));
        let e = SubOptions::parse("transport=udp").unwrap_err().to_string();
        assert!(e.contains("\"udp\""), "{e}");
        assert_eq!(
            parse_tags(" 1, 5-7 ,18446744073709551615").unwrap(),
            vec![
                TagRange::one(1),
                TagRange { first: 5, last: 7 },
                TagRange::one(u64::MAX)
            ]
        );
        for (bad, says) in [
            ("", "no tags"),
            ("7-3", "empty"),
            ("x", "\"x\""),
            ("-1", "\"\""),
        ] {
            let e = parse_tags(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}

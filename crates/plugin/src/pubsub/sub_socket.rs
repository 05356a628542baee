//! The subscribing socket: a blocking shell around evb-messaging's `Subscriber`, connected
//! to one or more publishers.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use evb_messaging::pubsub::{SubEvent, Subscriber};
use evb_messaging::MessengerConfig;
use evb_transport::ConnId;
use evb_wire::{Channel, Hello, Role};

use super::{
    after, io, messaging, secret, transport, Chain, Delivery, GoodbyeCode, SubOptions,
    SubscriberStats, TagRange,
};
use crate::Error;

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

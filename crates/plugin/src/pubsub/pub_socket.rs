//! The publishing socket: a blocking shell around evb-messaging's `Publisher`.

use std::time::{Duration, Instant};

use evb_messaging::pubsub::{Publish, Publisher, PublisherConfig};
use evb_messaging::MessengerConfig;

use super::{after, io, messaging, secret, transport, PubOptions, PublisherStats};
use crate::Error;

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

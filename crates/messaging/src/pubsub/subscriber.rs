//! The subscribing socket: connects to publishers, sends its subscriptions (held until the
//! connection opens), and hands over messages, gaps and goodbyes.

use std::time::Duration;

use evb_buffers::small_keys::SmallKeyMap;
use evb_buffers::Chain;
use evb_transport::{CloseReason, ConnId, Transport};
use evb_wire::pubsub::{Delivery, GoodbyeCode, PubSubMessage, TagRange, MAX_TAG_RANGES};
use evb_wire::{Hello, WireError};
use tracing::warn;

use super::PubSubError;
use crate::{Incoming, Messenger, MessengerConfig, Received};

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

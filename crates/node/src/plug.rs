//! Plug-in hooks: what a program in the node's process hands the driver so that its own code
//! feeds an RU (`source.kind = "api"`) or takes a BU's built events (`sink = "api"`). The
//! public API on top of these is the `evb-plugin` crate; this module is only the driver's
//! side: a channel of fragments already written into the RU's pool, and a sink.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use evb_buffers::Pool;
use evb_builder::assembly::Assembled;
use evb_builder::{Ru, RunState, Sink};
use evb_wire::FLAG_MISSING;
use tracing::{error, info, warn};

/// What a producer sends the RU's driver, in submission order.
pub enum FeedItem {
    /// The next event's fragment (its k-th item is event k).
    Event(Assembled),
    /// The producer's input failed a check under `on_error = "stop"`: the run stops, why.
    Failed(String),
    /// No more fragments: the run ends after the ones sent.
    End,
}

/// The RU side of a producer: fragments in, and the RU's fragment pool out (sent once the
/// driver has made it, for the producer to write fragments into).
pub struct ApiFeed {
    pub items: Receiver<FeedItem>,
    pub pool: Sender<Pool>,
}

/// What a program plugs into a node; the node's configuration must ask for each.
#[derive(Default)]
pub struct Plugs {
    /// For an RU with `source.kind = "api"`.
    pub feed: Option<ApiFeed>,
    /// For a BU with `sink = "api"`.
    pub sink: Option<Box<dyn Sink>>,
}

/// The driver's pump from a producer's channel into the RU's live feed.
pub(crate) struct ApiSource {
    node: String,
    items: Receiver<FeedItem>,
    received: u64,
    dropped: u64,
    over: bool,
    started: Instant,
    /// Since when the producer has submitted nothing (while the run is on).
    idle_since: Instant,
    stall_warn: Duration,
    warned: bool,
}

impl ApiSource {
    pub(crate) fn new(
        node: &str,
        items: Receiver<FeedItem>,
        stall_warn: Duration,
        now: Instant,
    ) -> ApiSource {
        ApiSource {
            node: node.to_string(),
            items,
            received: 0,
            dropped: 0,
            over: false,
            started: now,
            idle_since: now,
            stall_warn,
            warned: false,
        }
    }

    /// Moves what the producer submitted into the live feed. No limit is needed here: every
    /// fragment sent holds blocks of the RU's pool, which is what bounds the producer.
    pub(crate) fn pump(&mut self, now: Instant, ru: &mut Ru) {
        // Not before the RU is connected: a failure must reach the EVM, naming its reason.
        if self.over || ru.state().is_over() || ru.state() == RunState::Configured {
            return;
        }
        let running = ru.state() == RunState::Running;
        let Some(feed) = ru.live_mut() else { return };
        let before = self.received;
        loop {
            match self.items.try_recv() {
                Ok(FeedItem::Event(a)) => {
                    self.received += 1;
                    if a.flags & FLAG_MISSING != 0 {
                        self.dropped += 1;
                    }
                    feed.supply(a);
                }
                Ok(FeedItem::Failed(why)) => {
                    self.over = true;
                    error!(node = %self.node, "producer: {why}");
                    ru.source_failed(format!("{}: producer: {why}", self.node));
                    return;
                }
                // a producer dropped without finishing ends its feed the same way
                Ok(FeedItem::End) | Err(TryRecvError::Disconnected) => {
                    self.over = true;
                    info!(node = %self.node, "producer finished after {} events", self.received);
                    feed.finish();
                    break;
                }
                Err(TryRecvError::Empty) => break,
            }
        }
        feed.stats.fragments_received = self.received;
        feed.stats.dropped = self.dropped;
        // a producer that stalls shows as the RU waiting for it (status, report, log)
        if self.received > before || !running || self.over {
            self.idle_since = now;
            self.warned = false;
            feed.stats.waiting_for.clear();
            return;
        }
        let waited = now.duration_since(self.idle_since);
        if waited >= self.stall_warn {
            let at = self.idle_since.duration_since(self.started).as_secs_f64();
            let line = format!(
                "producer since {at:.1} s ({:.1} s): no fragment submitted after {}",
                waited.as_secs_f64(),
                self.received
            );
            if !self.warned {
                self.warned = true;
                warn!(node = %self.node, "waiting for {line}");
            }
            feed.stats.waiting_for = vec![line];
        }
    }
}

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
//!
//! The parts: `options` (the sockets' options and the tag-list parser), `pub_socket` and
//! `sub_socket` (the two sockets); this file holds what both use: the transport they are
//! built on and the mapping of errors.

use std::time::{Duration, Instant};

use evb_buffers::Pool;
use evb_messaging::pubsub::PubSubError;
use evb_transport::{Transport, TransportConfig};
use evb_wire::{Channel, Hello, Role};

pub use evb_buffers::Chain;
pub use evb_messaging::pubsub::{PublisherStats, SlowPolicy, SubscriberStats};
pub use evb_wire::pubsub::{Delivery, GoodbyeCode, TagRange};

use crate::Error;

mod options;
mod pub_socket;
mod sub_socket;

pub use options::{parse_delivery, parse_tags, PubOptions, SubOptions, MAX_TAG_ITEMS};
pub use pub_socket::{PubSocket, Sent};
pub use sub_socket::{Received, SubSocket};

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
        // The handshake's roles are the event builder's (EVM, RU, BU: one byte that every
        // peer's decoder checks, so a pub/sub role would change the protocol). A publisher
        // answers as the sending side, Ru; a subscriber connects as the receiving side, Bu
        // (`SubSocket::connect`). Nothing on a pub/sub connection acts on the role.
        local: Hello::new(Channel::Data, Role::Ru, 0, run_id, node),
        max_frame: u32::try_from(max_frame).unwrap_or(u32::MAX),
        rx_pool: Pool::new(node, RX_BLOCK, blocks),
        secret,
    };
    let name = match kind {
        TransportKind::Tcp => "tcp",
        TransportKind::Shm => "shm",
    };
    evb_messaging::open_transport(name, cfg, "")
        .map_err(|e| Error::Setup(format!("{name} transport: {e}")))
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

//! Messaging: point-to-point message sockets over any transport.
//!
//! Two paths, as in NetIO: the low-latency path ([`Messenger::send_now`]) puts one message
//! on the wire at once; the high-throughput path ([`Messenger::send_batched`],
//! [`Messenger::send_fragment`]) packs messages into a page per destination that goes out
//! when it is full or when the flush policy says so. Fragments join a page as shared pool
//! slices, so batching them copies nothing. Both paths keep per-connection order.
//!
//! [`pubsub`]: publish/subscribe by tag over the same paths, with slow-subscriber policies
//! that never lose a message silently. See [`guide`].

mod messenger;
mod ports;
pub mod pubsub;
mod reader;
mod transports;

/// The guide, docs/messaging.md (its examples run as doctests).
#[doc = include_str!("../../../docs/messaging.md")]
pub mod guide {}

pub use messenger::{FlushPolicy, Incoming, Messenger, MessengerConfig, MessengerStats};
pub use ports::free_ports;
pub use reader::{split_messages, split_messages_into, Received};
pub use transports::{open_transport, TRANSPORT_KINDS};

pub use evb_wire::fragment_prefix;

#[cfg(test)]
mod tests;

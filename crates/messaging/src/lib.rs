//! Messaging: point-to-point message sockets over any transport.
//!
//! Two paths, as in NetIO: the low-latency path ([`Messenger::send_now`]) puts one message
//! on the wire at once; the high-throughput path ([`Messenger::send_batched`],
//! [`Messenger::send_fragment`]) packs messages into a page per destination that goes out
//! when it is full or when the flush policy says so. Fragments join a page as shared pool
//! slices, so batching them copies nothing. Both paths keep per-connection order.

mod messenger;
mod reader;

pub use messenger::{FlushPolicy, Incoming, Messenger, MessengerConfig, MessengerStats};
pub use reader::{split_messages, Received};

/// Encodes the message and fragment headers that precede a fragment payload, so a data
/// source can write them into a pool block right in front of the payload.
pub fn fragment_prefix(h: &evb_wire::FragmentHeader) -> [u8; evb_wire::MESSAGE_HEADER_LEN + evb_wire::FRAGMENT_HEADER_LEN] {
    use evb_wire::{MessageHeader, MessageType, FRAGMENT_HEADER_LEN, MESSAGE_HEADER_LEN};
    let mut b = [0u8; MESSAGE_HEADER_LEN + FRAGMENT_HEADER_LEN];
    let mh = MessageHeader { msg_type: MessageType::Fragment, length: (FRAGMENT_HEADER_LEN as u32) + h.payload_size };
    b[..MESSAGE_HEADER_LEN].copy_from_slice(&mh.encode());
    b[MESSAGE_HEADER_LEN..].copy_from_slice(&h.encode());
    b
}

#[cfg(test)]
mod tests;

//! evb wire formats, without IO: the frame header, the connection handshake, the
//! event-building messages, the fragment header, the super-fragment directory and the window fragment of timestamped data. Every `decode` checks every field and
//! returns a [`WireError`] naming what was wrong; nothing here panics on input.
//! docs/protocol.md describes the same layouts byte by byte.

mod bytes;
pub mod consumer;
pub mod discovery;
mod error;
mod fragment;
mod frame;
mod handshake;
mod header_crc;
mod message;
pub mod pubsub;
pub mod resync;
pub mod super_fragment;
pub mod window;

pub use error::{Result, WireError};
pub use fragment::{
    fragment_prefix, write_fragment_prefix, FragmentHeader, FLAG_GENERATED, FLAG_MISSING,
    FLAG_SUPER, FLAG_SYNC_LOSS, FLAG_WINDOW, FRAGMENT_HEADER_LEN, FRAGMENT_PREFIX_LEN,
};
pub use frame::{
    version_refusal, FrameHeader, FrameType, Reject, RejectCode, FRAME_HEADER_LEN, FRAME_MAGIC,
    OLDEST_KNOWN_VERSION, PROTOCOL_VERSION,
};
pub use handshake::{Channel, Hello, Role, MAX_NAME_LEN};
pub use message::{
    EventRange, Message, MessageHeader, MessageType, MAX_COMMIT_RANGES, MAX_TEXT_LEN, MAX_WINDOWS,
    MAX_WINDOW_BODY, MESSAGE_HEADER_LEN, UNLIMITED,
};

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;

//! The fragment header: what one RU contributes to one event.

use crate::bytes::{need, u64_at};
use crate::error::{Result, WireError};
use crate::header_crc;

pub const FRAGMENT_HEADER_LEN: usize = 32;

/// Flag: the fragment is a placeholder for a source that could not contribute.
pub const FLAG_MISSING: u16 = 0x0001;
/// Flag: payload content was made by the built-in generator (and can be verified byte by byte).
pub const FLAG_GENERATED: u16 = 0x0002;
/// Flag: the payload is a super-fragment, the fragments of several front-end streams of one
/// RU for this event (layout in [`crate::super_fragment`] and docs/formats.md).
pub const FLAG_SUPER: u16 = 0x0004;
/// Flag: a stream of this super-fragment disagreed on the trigger number (sync loss) and the
/// event was built anyway (`source.on_sync_loss = "flag"`); its entry says which.
pub const FLAG_SYNC_LOSS: u16 = 0x0008;
/// Flag: the payload is a window fragment, one RU's time frames for one record's window
/// (building by time; layout in [`crate::window`] and docs/protocol.md §10.2).
pub const FLAG_WINDOW: u16 = 0x0010;
pub(crate) const KNOWN_FLAGS: u16 =
    FLAG_MISSING | FLAG_GENERATED | FLAG_SUPER | FLAG_SYNC_LOSS | FLAG_WINDOW;

/// Fragment header, 32 bytes, little-endian:
/// event id u64 | trigger number u32 | source id u16 | flags u16 | payload size u32 |
/// payload CRC32C u32 | reserved u32 (zero) | header CRC32C u32 (over bytes 0..28)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragmentHeader {
    pub event_id: u64,
    pub trigger_number: u32,
    pub source_id: u16,
    pub flags: u16,
    pub payload_size: u32,
    pub payload_crc: u32,
}

impl FragmentHeader {
    pub fn encode(&self) -> [u8; FRAGMENT_HEADER_LEN] {
        let mut b = [0u8; FRAGMENT_HEADER_LEN];
        self.encode_into(&mut b);
        b
    }

    /// [`FragmentHeader::encode`] straight into `b` (an RU writes millions a second into
    /// its blocks; no copy through the stack).
    #[inline(always)]
    pub fn encode_into(&self, b: &mut [u8; FRAGMENT_HEADER_LEN]) {
        // The words as they lie in the header (little-endian), the CRC computed from them in
        // registers rather than read back from `b` (see `header_crc::crc32c_words`).
        let w0 = self.event_id;
        let w1 = u64::from(self.trigger_number)
            | u64::from(self.source_id) << 32
            | u64::from(self.flags) << 48;
        let w2 = u64::from(self.payload_size) | u64::from(self.payload_crc) << 32;
        let crc = header_crc::crc32c_words([w0, w1, w2], 0);
        let w3 = u64::from(crc) << 32; // reserved (zero), then the CRC
        for (i, w) in [w0, w1, w2, w3].into_iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
    }

    /// Read as four little-endian words, each loaded once: the fields and the CRC's input
    /// come from the same registers (field by field, the decoder's loads of 2 to 8 bytes
    /// and its stack copy of the result were a visible share of a BU's time per fragment).
    #[inline(always)]
    pub fn decode(b: &[u8]) -> Result<FragmentHeader> {
        need("fragment header", b, FRAGMENT_HEADER_LEN)?;
        let (w0, w1, w2, w3) = (u64_at(b, 0), u64_at(b, 8), u64_at(b, 16), u64_at(b, 24));
        // bytes 24..28 are reserved (zero), 28..32 the CRC of bytes 0..28
        let (reserved, got) = (w3 as u32, (w3 >> 32) as u32);
        let computed = header_crc::crc32c_words([w0, w1, w2], reserved);
        if got != computed {
            return Err(WireError::HeaderChecksum { got, computed });
        }
        if reserved != 0 {
            return Err(WireError::ReservedNonZero {
                what: "fragment header",
            });
        }
        let flags = (w1 >> 48) as u16;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(WireError::OutOfRange {
                what: "fragment flags",
                value: flags as u64,
            });
        }
        Ok(FragmentHeader {
            event_id: w0,
            trigger_number: w1 as u32,
            source_id: (w1 >> 32) as u16,
            flags,
            payload_size: w2 as u32,
            payload_crc: (w2 >> 32) as u32,
        })
    }
}

/// Bytes of message header plus fragment header in front of every fragment payload.
pub const FRAGMENT_PREFIX_LEN: usize = crate::MESSAGE_HEADER_LEN + FRAGMENT_HEADER_LEN;

/// The message header and fragment header that precede a fragment's payload on the wire,
/// so a data source can write them into a pool block right in front of the payload.
pub fn fragment_prefix(h: &FragmentHeader) -> [u8; FRAGMENT_PREFIX_LEN] {
    let mut b = [0u8; FRAGMENT_PREFIX_LEN];
    write_fragment_prefix(h, &mut b);
    b
}

/// [`fragment_prefix`] straight into the first [`FRAGMENT_PREFIX_LEN`] bytes of `dst` (the
/// spare room of a pool block, where the payload follows).
///
/// # Panics
/// If `dst` is shorter than the prefix: the caller has made room for it.
#[inline(always)]
pub fn write_fragment_prefix(h: &FragmentHeader, dst: &mut [u8]) {
    use crate::{MessageHeader, MessageType, MESSAGE_HEADER_LEN};
    let mh = MessageHeader {
        msg_type: MessageType::Fragment,
        length: (FRAGMENT_HEADER_LEN as u32) + h.payload_size,
    };
    let (m, f) = dst[..FRAGMENT_PREFIX_LEN].split_at_mut(MESSAGE_HEADER_LEN);
    m.copy_from_slice(&mh.encode());
    h.encode_into(f.try_into().expect("the fragment header's length"));
}

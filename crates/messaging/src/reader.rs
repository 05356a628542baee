//! Cuts a received frame's payload into messages without copying bodies.

use evb_buffers::Chain;
use evb_wire::{
    FragmentHeader, Message, MessageHeader, MessageType, WireError, FRAGMENT_HEADER_LEN,
    MESSAGE_HEADER_LEN,
};

/// One message taken out of a frame.
#[derive(Debug)]
pub enum Received {
    Message(Message),
    /// A fragment: its header, and its payload still in the receive-pool blocks.
    Fragment {
        header: FragmentHeader,
        payload: Chain,
    },
}

/// Walks a chain front to back, handing out sub-chains (shared, no copy).
struct Cursor<'a> {
    chain: &'a Chain,
    slice: usize,
    offset: usize,
    left: usize,
}

impl<'a> Cursor<'a> {
    fn new(chain: &'a Chain) -> Self {
        Cursor {
            chain,
            slice: 0,
            offset: 0,
            left: chain.len(),
        }
    }

    fn take(&mut self, mut n: usize) -> Chain {
        debug_assert!(n <= self.left);
        self.left -= n;
        let mut out = Chain::new();
        let slices = self.chain.slices();
        while n > 0 {
            let s = &slices[self.slice];
            let take = (s.len() - self.offset).min(n);
            out.push(s.sub(self.offset, take));
            n -= take;
            self.offset += take;
            if self.offset == s.len() {
                self.slice += 1;
                self.offset = 0;
            }
        }
        out
    }
}

/// Decodes every message in a `Messages` frame of `count` messages.
pub fn split_messages(
    payload: &Chain,
    count: u32,
    out: &mut Vec<Received>,
) -> Result<(), WireError> {
    let mut cur = Cursor::new(payload);
    let mut found = 0u32;
    while cur.left > 0 {
        if found == count {
            return Err(WireError::MessageCount {
                declared: count,
                found: found + 1,
            });
        }
        if cur.left < MESSAGE_HEADER_LEN {
            return Err(WireError::Truncated {
                what: "message header",
                need: MESSAGE_HEADER_LEN,
                have: cur.left,
            });
        }
        let mut hb = [0u8; MESSAGE_HEADER_LEN];
        cur.take(MESSAGE_HEADER_LEN).copy_prefix(&mut hb);
        let h = MessageHeader::decode(&hb)?;
        let len = h.length as usize;
        if len > cur.left {
            return Err(WireError::Truncated {
                what: "message body",
                need: len,
                have: cur.left,
            });
        }
        let body = cur.take(len);
        found += 1;
        if h.msg_type == MessageType::Fragment {
            if len < FRAGMENT_HEADER_LEN {
                return Err(WireError::Truncated {
                    what: "fragment",
                    need: FRAGMENT_HEADER_LEN,
                    have: len,
                });
            }
            let mut fb = [0u8; FRAGMENT_HEADER_LEN];
            body.copy_prefix(&mut fb);
            let header = FragmentHeader::decode(&fb)?;
            let payload_len = len - FRAGMENT_HEADER_LEN;
            if header.payload_size as usize != payload_len {
                return Err(WireError::BadLength {
                    what: "fragment payload",
                    expected: header.payload_size as usize,
                    got: payload_len,
                });
            }
            out.push(Received::Fragment {
                header,
                payload: body.sub(FRAGMENT_HEADER_LEN, payload_len),
            });
        } else {
            // Control messages are small; decoding them from a flat copy keeps decoders simple.
            let flat = body.to_vec();
            out.push(Received::Message(Message::decode(h.msg_type, &flat)?));
        }
    }
    if found != count {
        return Err(WireError::MessageCount {
            declared: count,
            found,
        });
    }
    Ok(())
}

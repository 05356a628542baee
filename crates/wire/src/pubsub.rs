//! Publish/subscribe messages (docs/protocol.md §8). They travel in `Messages` frames like
//! every other message, after the connection's handshake: a subscriber's Subscribe and
//! Unsubscribe, a publisher's Published (a header, then the payload, which stays in pool
//! blocks), Gap (messages of a tag this subscriber missed) and Goodbye (why it is cut off).

use crate::bytes::{need, u16_at, u32_at, u64_at};
use crate::error::{Result, WireError};
use crate::frame::truncate_utf8;
use crate::message::{MessageHeader, MessageType, MESSAGE_HEADER_LEN};

/// Most tag ranges one Subscribe or Unsubscribe may carry.
pub const MAX_TAG_RANGES: usize = 4096;
/// Longest Goodbye reason accepted.
pub const MAX_REASON_LEN: usize = 1024;
/// Length of the header in front of a Published payload: tag u64 · sequence u64.
pub const PUBLISHED_HEADER_LEN: usize = 16;

/// The tags `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TagRange {
    pub first: u64,
    pub last: u64,
}

impl TagRange {
    pub fn one(tag: u64) -> TagRange {
        TagRange {
            first: tag,
            last: tag,
        }
    }

    pub fn contains(&self, tag: u64) -> bool {
        self.first <= tag && tag <= self.last
    }
}

/// How a publisher sends a subscription's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Delivery {
    /// Each message on the wire at once (the low-latency path).
    Latency = 0,
    /// Messages packed into pages (the high-throughput path).
    Throughput = 1,
}

/// Why a publisher cut a subscriber off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum GoodbyeCode {
    /// The subscriber read too slowly (policy `disconnect`).
    SlowSubscriber = 1,
    /// The subscriber's requests broke the rules (too many ranges, malformed).
    BadRequest = 2,
    /// The publisher is shutting down.
    Shutdown = 3,
    /// The publisher's transport refused a message for this subscriber (e.g. larger than
    /// the connection's frame limit).
    SendFailed = 4,
}

/// A pub/sub control message (everything but the Published payload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PubSubMessage {
    /// Subscriber → publisher: add these tags, delivered this way.
    Subscribe {
        delivery: Delivery,
        ranges: Vec<TagRange>,
    },
    /// Subscriber → publisher: remove these tags.
    Unsubscribe { ranges: Vec<TagRange> },
    /// Publisher → subscriber: `missed` messages of `tag` were dropped for this subscriber
    /// (policy `drop`); sent before the next message of that tag.
    Gap { tag: u64, missed: u64 },
    /// Publisher → subscriber: you are being disconnected, and why.
    Goodbye { code: GoodbyeCode, reason: String },
}

fn put_ranges(out: &mut Vec<u8>, ranges: &[TagRange]) {
    for r in ranges {
        out.extend_from_slice(&r.first.to_le_bytes());
        out.extend_from_slice(&r.last.to_le_bytes());
    }
}

fn get_ranges(what: &'static str, b: &[u8]) -> Result<Vec<TagRange>> {
    need(what, b, 8)?;
    let count = u32_at(b, 4) as usize;
    if count == 0 {
        return Err(WireError::OutOfRange {
            what: "tag range count",
            value: 0,
        });
    }
    if count > MAX_TAG_RANGES {
        return Err(WireError::TooLong {
            what: "tag range list",
            len: count,
            max: MAX_TAG_RANGES,
        });
    }
    let expected = 8 + 16 * count;
    if b.len() != expected {
        return Err(WireError::BadLength {
            what,
            expected,
            got: b.len(),
        });
    }
    let mut ranges = Vec::with_capacity(count);
    for i in 0..count {
        let at = 8 + 16 * i;
        let r = TagRange {
            first: u64_at(b, at),
            last: u64_at(b, at + 8),
        };
        if r.first > r.last {
            return Err(WireError::OutOfRange {
                what: "tag range (first > last)",
                value: r.first,
            });
        }
        ranges.push(r);
    }
    Ok(ranges)
}

impl PubSubMessage {
    pub fn msg_type(&self) -> MessageType {
        match self {
            PubSubMessage::Subscribe { .. } => MessageType::Subscribe,
            PubSubMessage::Unsubscribe { .. } => MessageType::Unsubscribe,
            PubSubMessage::Gap { .. } => MessageType::Gap,
            PubSubMessage::Goodbye { .. } => MessageType::Goodbye,
        }
    }

    /// Appends header and body to `out`. At most [`MAX_TAG_RANGES`] ranges are written (a
    /// longer list is cut: send it in several messages) and at most [`MAX_REASON_LEN`]
    /// bytes of a reason.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0u8; MESSAGE_HEADER_LEN]);
        match self {
            PubSubMessage::Subscribe { delivery, ranges } => {
                let ranges = &ranges[..ranges.len().min(MAX_TAG_RANGES)];
                out.extend_from_slice(&[*delivery as u8, 0, 0, 0]);
                out.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
                put_ranges(out, ranges);
            }
            PubSubMessage::Unsubscribe { ranges } => {
                let ranges = &ranges[..ranges.len().min(MAX_TAG_RANGES)];
                out.extend_from_slice(&0u32.to_le_bytes());
                out.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
                put_ranges(out, ranges);
            }
            PubSubMessage::Gap { tag, missed } => {
                out.extend_from_slice(&tag.to_le_bytes());
                out.extend_from_slice(&missed.to_le_bytes());
            }
            PubSubMessage::Goodbye { code, reason } => {
                out.extend_from_slice(&(*code as u16).to_le_bytes());
                out.extend_from_slice(&0u16.to_le_bytes());
                out.extend_from_slice(truncate_utf8(reason, MAX_REASON_LEN).as_bytes());
            }
        }
        let h = MessageHeader {
            msg_type: self.msg_type(),
            length: (out.len() - start - MESSAGE_HEADER_LEN) as u32,
        };
        out[start..start + MESSAGE_HEADER_LEN].copy_from_slice(&h.encode());
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(32);
        self.encode_into(&mut v);
        v
    }

    /// Decodes the body of a pub/sub control message whose header said `msg_type`.
    ///
    /// # Errors
    /// Any other type, a body of the wrong length, an empty or oversized range list, a range
    /// with first > last, a non-zero reserved field, an unknown delivery or goodbye code,
    /// a zero gap, or a reason that is too long or not UTF-8.
    pub fn decode(msg_type: MessageType, b: &[u8]) -> Result<PubSubMessage> {
        Ok(match msg_type {
            MessageType::Subscribe => {
                need("subscribe", b, 8)?;
                let delivery = match b[0] {
                    0 => Delivery::Latency,
                    1 => Delivery::Throughput,
                    v => {
                        return Err(WireError::OutOfRange {
                            what: "subscribe delivery",
                            value: v as u64,
                        })
                    }
                };
                if b[1..4] != [0; 3] {
                    return Err(WireError::ReservedNonZero { what: "subscribe" });
                }
                PubSubMessage::Subscribe {
                    delivery,
                    ranges: get_ranges("subscribe", b)?,
                }
            }
            MessageType::Unsubscribe => {
                need("unsubscribe", b, 8)?;
                if u32_at(b, 0) != 0 {
                    return Err(WireError::ReservedNonZero {
                        what: "unsubscribe",
                    });
                }
                PubSubMessage::Unsubscribe {
                    ranges: get_ranges("unsubscribe", b)?,
                }
            }
            MessageType::Gap => {
                if b.len() != 16 {
                    return Err(WireError::BadLength {
                        what: "gap",
                        expected: 16,
                        got: b.len(),
                    });
                }
                let missed = u64_at(b, 8);
                if missed == 0 {
                    return Err(WireError::OutOfRange {
                        what: "gap missed count",
                        value: 0,
                    });
                }
                PubSubMessage::Gap {
                    tag: u64_at(b, 0),
                    missed,
                }
            }
            MessageType::Goodbye => {
                need("goodbye", b, 4)?;
                let code = match u16_at(b, 0) {
                    1 => GoodbyeCode::SlowSubscriber,
                    2 => GoodbyeCode::BadRequest,
                    3 => GoodbyeCode::Shutdown,
                    4 => GoodbyeCode::SendFailed,
                    v => {
                        return Err(WireError::OutOfRange {
                            what: "goodbye code",
                            value: v as u64,
                        })
                    }
                };
                if u16_at(b, 2) != 0 {
                    return Err(WireError::ReservedNonZero { what: "goodbye" });
                }
                let text = &b[4..];
                if text.len() > MAX_REASON_LEN {
                    return Err(WireError::TooLong {
                        what: "goodbye reason",
                        len: text.len(),
                        max: MAX_REASON_LEN,
                    });
                }
                let reason = std::str::from_utf8(text)
                    .map_err(|_| WireError::BadUtf8 {
                        what: "goodbye reason",
                    })?
                    .to_string();
                PubSubMessage::Goodbye { code, reason }
            }
            other => {
                return Err(WireError::OutOfRange {
                    what: "message type on the pub/sub path",
                    value: other as u16 as u64,
                })
            }
        })
    }
}

/// The header of a Published message: its tag and the publisher's sequence number for that
/// tag (0 for the tag's first message, one more for each message published under it, sent
/// or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishedHeader {
    pub tag: u64,
    pub seq: u64,
}

impl PublishedHeader {
    /// Message header and Published header for a payload of `payload_len` bytes, ready to be
    /// followed by the payload. `None` if the body would not fit a u32 length.
    pub fn prefix(
        &self,
        payload_len: usize,
    ) -> Option<[u8; MESSAGE_HEADER_LEN + PUBLISHED_HEADER_LEN]> {
        let len = u32::try_from(payload_len.checked_add(PUBLISHED_HEADER_LEN)?).ok()?;
        let mut b = [0u8; MESSAGE_HEADER_LEN + PUBLISHED_HEADER_LEN];
        b[..MESSAGE_HEADER_LEN].copy_from_slice(
            &MessageHeader {
                msg_type: MessageType::Published,
                length: len,
            }
            .encode(),
        );
        b[8..16].copy_from_slice(&self.tag.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        Some(b)
    }

    /// Decodes the first [`PUBLISHED_HEADER_LEN`] bytes of a Published body.
    pub fn decode(b: &[u8]) -> Result<PublishedHeader> {
        need("published header", b, PUBLISHED_HEADER_LEN)?;
        Ok(PublishedHeader {
            tag: u64_at(b, 0),
            seq: u64_at(b, 8),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(m: &PubSubMessage) -> (MessageType, Vec<u8>) {
        let v = m.encode();
        let h = MessageHeader::decode(&v).unwrap();
        assert_eq!(h.length as usize, v.len() - MESSAGE_HEADER_LEN);
        (h.msg_type, v[MESSAGE_HEADER_LEN..].to_vec())
    }

    fn samples() -> Vec<PubSubMessage> {
        vec![
            PubSubMessage::Subscribe {
                delivery: Delivery::Throughput,
                ranges: vec![
                    TagRange::one(7),
                    TagRange {
                        first: 10,
                        last: 20,
                    },
                ],
            },
            PubSubMessage::Subscribe {
                delivery: Delivery::Latency,
                ranges: vec![TagRange {
                    first: 0,
                    last: u64::MAX,
                }],
            },
            PubSubMessage::Unsubscribe {
                ranges: vec![TagRange::one(u64::MAX)],
            },
            PubSubMessage::Gap { tag: 3, missed: 99 },
            PubSubMessage::Goodbye {
                code: GoodbyeCode::SlowSubscriber,
                reason: "too slow: 4096 bytes queued".into(),
            },
        ]
    }

    #[test]
    fn round_trip() {
        for m in samples() {
            let (t, b) = body(&m);
            assert_eq!(PubSubMessage::decode(t, &b).unwrap(), m);
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        for m in samples() {
            let (t, b) = body(&m);
            for n in 0..b.len() {
                // a Goodbye's reason may be cut anywhere and still decode (shorter text);
                // everything else must be refused
                let r = PubSubMessage::decode(t, &b[..n]);
                if matches!(m, PubSubMessage::Goodbye { .. }) && n >= 4 {
                    continue;
                }
                assert!(r.is_err(), "{m:?} cut to {n} bytes decoded: {r:?}");
            }
            let mut longer = b.clone();
            longer.push(0);
            if !matches!(m, PubSubMessage::Goodbye { .. }) {
                assert!(PubSubMessage::decode(t, &longer).is_err());
            }
        }
    }

    #[test]
    fn malformed_fields_are_refused() {
        let (t, mut b) = body(&samples()[0]);
        b[0] = 2; // unknown delivery
        assert!(matches!(
            PubSubMessage::decode(t, &b),
            Err(WireError::OutOfRange { .. })
        ));
        let (t, mut b) = body(&samples()[0]);
        b[2] = 1; // reserved
        assert!(matches!(
            PubSubMessage::decode(t, &b),
            Err(WireError::ReservedNonZero { .. })
        ));
        // first > last
        let (t, mut b) = body(&samples()[2]);
        b[8..16].copy_from_slice(&5u64.to_le_bytes());
        b[16..24].copy_from_slice(&4u64.to_le_bytes());
        assert!(matches!(
            PubSubMessage::decode(t, &b),
            Err(WireError::OutOfRange { .. })
        ));
        // empty range list
        let empty = [0u8; 8];
        assert!(PubSubMessage::decode(MessageType::Unsubscribe, &empty).is_err());
        // zero gap
        let mut g = [0u8; 16];
        g[0] = 1;
        assert!(PubSubMessage::decode(MessageType::Gap, &g).is_err());
        // goodbye: unknown code, bad UTF-8, too long
        assert!(PubSubMessage::decode(MessageType::Goodbye, &[9, 0, 0, 0]).is_err());
        assert!(matches!(
            PubSubMessage::decode(MessageType::Goodbye, &[1, 0, 0, 0, 0xff, 0xfe]),
            Err(WireError::BadUtf8 { .. })
        ));
        let mut long = vec![1u8, 0, 0, 0];
        long.extend(std::iter::repeat_n(b'a', MAX_REASON_LEN + 1));
        assert!(matches!(
            PubSubMessage::decode(MessageType::Goodbye, &long),
            Err(WireError::TooLong { .. })
        ));
        // a type that is not pub/sub
        assert!(PubSubMessage::decode(MessageType::Credit, &[0; 8]).is_err());
    }

    #[test]
    fn huge_tag_sets_are_bounded() {
        // a count far beyond the limit is refused before anything is allocated
        let mut b = vec![0u8; 8];
        b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            PubSubMessage::decode(MessageType::Subscribe, &b),
            Err(WireError::TooLong { .. })
        ));
        // the limit itself is fine; one more is not
        let ranges: Vec<TagRange> = (0..MAX_TAG_RANGES as u64 + 1).map(TagRange::one).collect();
        let m = PubSubMessage::Subscribe {
            delivery: Delivery::Latency,
            ranges: ranges.clone(),
        };
        let (t, b) = body(&m);
        match PubSubMessage::decode(t, &b).unwrap() {
            PubSubMessage::Subscribe { ranges: got, .. } => {
                assert_eq!(got.len(), MAX_TAG_RANGES, "the encoder cuts at the limit")
            }
            other => panic!("{other:?}"),
        }
        let mut over = b.clone();
        over[4..8].copy_from_slice(&(MAX_TAG_RANGES as u32 + 1).to_le_bytes());
        over.extend_from_slice(&[0u8; 16]);
        assert!(PubSubMessage::decode(t, &over).is_err());
    }

    #[test]
    fn garbage_never_panics() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 80) as usize;
            let bytes: Vec<u8> = (0..len).map(|i| (x >> (i % 8 * 8)) as u8).collect();
            for t in [
                MessageType::Subscribe,
                MessageType::Unsubscribe,
                MessageType::Gap,
                MessageType::Goodbye,
            ] {
                let _ = PubSubMessage::decode(t, &bytes);
            }
            let _ = PublishedHeader::decode(&bytes);
        }
    }

    #[test]
    fn published_prefix() {
        let h = PublishedHeader { tag: 42, seq: 7 };
        let p = h.prefix(100).unwrap();
        let mh = MessageHeader::decode(&p).unwrap();
        assert_eq!(mh.msg_type, MessageType::Published);
        assert_eq!(mh.length, 116);
        assert_eq!(PublishedHeader::decode(&p[8..]).unwrap(), h);
        assert!(PublishedHeader::decode(&p[8..20]).is_err());
        assert!(h.prefix(u32::MAX as usize).is_none());
    }
}

//! The consumer protocol (docs/protocol.md §7): a BU with `sink.kind = "serve"` serves built
//! events over TCP to consumer processes (`evb consume`). A frame is a 12-byte header and
//! its payload; the first frame of a connection is the consumer's [`ConsumerHello`].
//!
//! An `Event` frame's payload is one event exactly as a built-event file stores it (event
//! header, then each fragment's header and payload: docs/formats.md); it is checked by
//! `evb_formats::events::parse_event`, not here.
//!
//! Version 2 adds the run's secret: a Hello carries a nonce, and a BU with a secret answers
//! it with a [`ConsumerMsg::Challenge`] (its nonce and its own proof), which the consumer
//! answers with [`ConsumerMsg::Auth`] (its proof) before it is welcomed. The proofs are
//! HMAC-SHA256 values over [`proof_key`]'s bytes (computed by the BU and the consumer with
//! `evb_transport::control_token`).
//!
//! One idea, one file: the consumer protocol's frames, encoded and decoded.

use crate::bytes::{need, u16_at, u32_at, u64_at};
use crate::error::{Result, WireError};

/// "EVBC": the first four bytes of every consumer-protocol frame.
pub const CONSUMER_MAGIC: [u8; 4] = *b"EVBC";
/// The consumer protocol version this build speaks (2: the Hello has a nonce; Challenge and
/// Auth prove the run's secret). A frame or Hello of another version is refused.
pub const CONSUMER_VERSION: u16 = 2;
pub const CONSUMER_HEADER_LEN: usize = 12;
/// Largest payload of any frame but `Event` (Hello, Welcome, Refuse, Ack, End).
pub const CONSUMER_MAX_CONTROL: u32 = 64 * 1024;
/// Most event ids in one Ack.
pub const MAX_ACK_IDS: usize = 4096;
/// Longest run id, consumer name or BU id.
pub const MAX_CONSUMER_NAME: usize = 64;
/// Longest Refuse reason.
pub const MAX_REFUSE_REASON: usize = 1024;
/// Largest Hello or Auth payload a BU reads (a Hello is at most 146 bytes, an Auth 32): a
/// connection declaring more is refused at once, before any of it is read.
pub const CONSUMER_MAX_HANDSHAKE: u32 = 1024;
/// Length of a proof (HMAC-SHA256) in Challenge and Auth.
pub const PROOF_LEN: usize = 32;
/// The first bytes of every [`proof_key`].
pub const PROOF_LABEL: &[u8; 16] = b"evb-consumer-v2 ";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ConsumerFrame {
    /// consumer → BU, first frame: run id, name, how many events it holds at most.
    Hello = 1,
    /// BU → consumer: the Hello is accepted; events follow.
    Welcome = 2,
    /// BU → consumer: the Hello is refused (code, reason); the BU closes.
    Refuse = 3,
    /// BU → consumer: one built event (a built-event file record).
    Event = 4,
    /// consumer → BU: these events are done with.
    Ack = 5,
    /// BU → consumer: the run is over, no more events; the BU closes.
    End = 6,
    /// BU → consumer, only from a BU with a secret to a Hello with a nonce: the BU's nonce
    /// and its proof of the secret; the consumer answers with Auth.
    Challenge = 7,
    /// consumer → BU: the consumer's proof of the secret.
    Auth = 8,
}

impl ConsumerFrame {
    pub fn from_u8(v: u8) -> Result<ConsumerFrame> {
        Ok(match v {
            1 => ConsumerFrame::Hello,
            2 => ConsumerFrame::Welcome,
            3 => ConsumerFrame::Refuse,
            4 => ConsumerFrame::Event,
            5 => ConsumerFrame::Ack,
            6 => ConsumerFrame::End,
            7 => ConsumerFrame::Challenge,
            8 => ConsumerFrame::Auth,
            other => return Err(WireError::UnknownFrameType(other)),
        })
    }
}

/// magic "EVBC" | version u16 | type u8 | flags u8 (0) | length u32
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerHeader {
    pub kind: ConsumerFrame,
    pub length: u32,
}

impl ConsumerHeader {
    pub fn new(kind: ConsumerFrame, length: u32) -> ConsumerHeader {
        ConsumerHeader { kind, length }
    }

    pub fn encode(&self) -> [u8; CONSUMER_HEADER_LEN] {
        let mut b = [0u8; CONSUMER_HEADER_LEN];
        b[0..4].copy_from_slice(&CONSUMER_MAGIC);
        b[4..6].copy_from_slice(&CONSUMER_VERSION.to_le_bytes());
        b[6] = self.kind as u8;
        b[7] = 0;
        b[8..12].copy_from_slice(&self.length.to_le_bytes());
        b
    }

    /// Decodes and checks a header. `max_event` bounds an Event's length; every other
    /// frame is bounded by [`CONSUMER_MAX_CONTROL`].
    pub fn decode(b: &[u8], max_event: u32) -> Result<ConsumerHeader> {
        need("consumer frame header", b, CONSUMER_HEADER_LEN)?;
        if b[0..4] != CONSUMER_MAGIC {
            return Err(WireError::BadConsumerMagic(u32_at(b, 0)));
        }
        let version = u16_at(b, 4);
        if version != CONSUMER_VERSION {
            return Err(WireError::UnsupportedVersion {
                got: version,
                supported: CONSUMER_VERSION,
            });
        }
        let kind = ConsumerFrame::from_u8(b[6])?;
        if b[7] != 0 {
            return Err(WireError::ReservedNonZero {
                what: "consumer frame flags",
            });
        }
        let length = u32_at(b, 8);
        let max = if kind == ConsumerFrame::Event {
            max_event
        } else {
            CONSUMER_MAX_CONTROL
        };
        if length > max {
            return Err(WireError::FrameTooLarge {
                len: length as u64,
                max: max as u64,
            });
        }
        Ok(ConsumerHeader { kind, length })
    }
}

/// The consumer's first frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerHello {
    /// Most events the consumer holds unacknowledged (≥ 1); the BU may grant fewer.
    pub max_held: u32,
    /// 0: the consumer has no secret; otherwise random (and never reused): the BU's proof
    /// covers it, so that a recorded proof cannot be replayed to the consumer.
    pub nonce: u64,
    pub run_id: String,
    /// For logs and the BU's status (its host and pid, say).
    pub name: String,
}

/// The BU's answer to an accepted Hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    pub bu_index: u16,
    /// Most events this consumer will be sent unacknowledged.
    pub max_held: u32,
    pub bu_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum RefuseCode {
    /// The first frame was not a valid Hello.
    BadHello = 1,
    /// The Hello names another run.
    WrongRun = 2,
    /// The BU is not serving (the run is over).
    Over = 3,
    /// The BU requires the run's secret: the Hello had no nonce, or the Auth's proof was
    /// wrong. Do not try again without the right secret.
    Unauthenticated = 4,
    /// No room or no time: every connection slot is taken by consumers, or this handshake
    /// was not finished within the deadline, or it was shed to make room for a newer one.
    /// Try again later.
    Busy = 5,
    Other = 99,
}

impl RefuseCode {
    pub fn from_u16(v: u16) -> Result<RefuseCode> {
        Ok(match v {
            1 => RefuseCode::BadHello,
            2 => RefuseCode::WrongRun,
            3 => RefuseCode::Over,
            4 => RefuseCode::Unauthenticated,
            5 => RefuseCode::Busy,
            99 => RefuseCode::Other,
            v => {
                return Err(WireError::OutOfRange {
                    what: "refuse code",
                    value: v as u64,
                })
            }
        })
    }
}

/// Whose proof a [`proof_key`] is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ProofRole {
    /// The BU's proof, in Challenge.
    Bu = 1,
    /// The consumer's proof, in Auth.
    Consumer = 2,
}

/// The key of a proof: a proof is HMAC-SHA256 with this key over the 18 ASCII bytes
/// `evb-control-api-v1` (`evb_transport::control_token` of these bytes, hex-decoded). It
/// binds the secret, the role, the BU's challenge nonce and the consumer's exact Hello
/// payload (with its own nonce), so a proof is good for one connection only:
///
/// `"evb-consumer-v2 "` (16 bytes) · role u8 (1 BU, 2 consumer) · challenge nonce u64 ·
/// Hello payload length u32 · Hello payload · secret length u32 · secret.
pub fn proof_key(role: ProofRole, secret: &[u8], hello_payload: &[u8], challenge: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(16 + 1 + 8 + 8 + hello_payload.len() + secret.len());
    k.extend_from_slice(PROOF_LABEL);
    k.push(role as u8);
    k.extend_from_slice(&challenge.to_le_bytes());
    k.extend_from_slice(&(hello_payload.len() as u32).to_le_bytes());
    k.extend_from_slice(hello_payload);
    k.extend_from_slice(&(secret.len() as u32).to_le_bytes());
    k.extend_from_slice(secret);
    k
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumerMsg {
    Hello(ConsumerHello),
    Welcome(Welcome),
    Refuse {
        code: RefuseCode,
        reason: String,
    },
    /// The payload: one event record (checked by the formats crate).
    Event(Vec<u8>),
    Ack(Vec<u64>),
    End {
        /// Events this BU's consumers acknowledged in the run.
        acked: u64,
        /// Events accepted by the EVM that no consumer acknowledged (lost at the output).
        lost: u64,
    },
    Challenge {
        /// The BU's nonce (≠ 0).
        nonce: u64,
        /// The BU's proof ([`ProofRole::Bu`]).
        proof: [u8; PROOF_LEN],
    },
    /// The consumer's proof ([`ProofRole::Consumer`]).
    Auth([u8; PROOF_LEN]),
}

fn put_name(v: &mut Vec<u8>, s: &str) {
    let s = crate::frame::truncate_utf8(s, MAX_CONSUMER_NAME);
    v.push(s.len() as u8);
    v.extend_from_slice(s.as_bytes());
}

/// Reads a length-prefixed name at `at`; returns it and the offset after it.
fn name_at(b: &[u8], at: usize, what: &'static str) -> Result<(String, usize)> {
    need(what, b, at + 1)?;
    let len = b[at] as usize;
    if len > MAX_CONSUMER_NAME {
        return Err(WireError::TooLong {
            what,
            len,
            max: MAX_CONSUMER_NAME,
        });
    }
    need(what, b, at + 1 + len)?;
    let s =
        std::str::from_utf8(&b[at + 1..at + 1 + len]).map_err(|_| WireError::BadUtf8 { what })?;
    Ok((s.to_string(), at + 1 + len))
}

fn exact(what: &'static str, b: &[u8], len: usize) -> Result<()> {
    if b.len() != len {
        return Err(WireError::BadLength {
            what,
            expected: len,
            got: b.len(),
        });
    }
    Ok(())
}

impl ConsumerMsg {
    pub fn kind(&self) -> ConsumerFrame {
        match self {
            ConsumerMsg::Hello(_) => ConsumerFrame::Hello,
            ConsumerMsg::Welcome(_) => ConsumerFrame::Welcome,
            ConsumerMsg::Refuse { .. } => ConsumerFrame::Refuse,
            ConsumerMsg::Event(_) => ConsumerFrame::Event,
            ConsumerMsg::Ack(_) => ConsumerFrame::Ack,
            ConsumerMsg::End { .. } => ConsumerFrame::End,
            ConsumerMsg::Challenge { .. } => ConsumerFrame::Challenge,
            ConsumerMsg::Auth(_) => ConsumerFrame::Auth,
        }
    }

    /// The payload alone.
    pub fn encode_payload(&self) -> Vec<u8> {
        let mut v = Vec::new();
        match self {
            ConsumerMsg::Hello(h) => {
                v.extend_from_slice(&CONSUMER_VERSION.to_le_bytes());
                v.extend_from_slice(&0u16.to_le_bytes());
                v.extend_from_slice(&h.max_held.to_le_bytes());
                v.extend_from_slice(&h.nonce.to_le_bytes());
                put_name(&mut v, &h.run_id);
                put_name(&mut v, &h.name);
            }
            ConsumerMsg::Welcome(w) => {
                v.extend_from_slice(&w.bu_index.to_le_bytes());
                v.extend_from_slice(&0u16.to_le_bytes());
                v.extend_from_slice(&w.max_held.to_le_bytes());
                put_name(&mut v, &w.bu_id);
            }
            ConsumerMsg::Refuse { code, reason } => {
                v.extend_from_slice(&(*code as u16).to_le_bytes());
                v.extend_from_slice(
                    crate::frame::truncate_utf8(reason, MAX_REFUSE_REASON).as_bytes(),
                );
            }
            ConsumerMsg::Event(record) => v.extend_from_slice(record),
            ConsumerMsg::Ack(ids) => {
                v.extend_from_slice(&(ids.len() as u32).to_le_bytes());
                v.extend_from_slice(&0u32.to_le_bytes());
                for id in ids {
                    v.extend_from_slice(&id.to_le_bytes());
                }
            }
            ConsumerMsg::End { acked, lost } => {
                v.extend_from_slice(&acked.to_le_bytes());
                v.extend_from_slice(&lost.to_le_bytes());
            }
            ConsumerMsg::Challenge { nonce, proof } => {
                v.extend_from_slice(&nonce.to_le_bytes());
                v.extend_from_slice(proof);
            }
            ConsumerMsg::Auth(proof) => v.extend_from_slice(proof),
        }
        v
    }

    /// Header and payload, ready to write.
    pub fn encode(&self) -> Vec<u8> {
        let p = self.encode_payload();
        let mut v = ConsumerHeader::new(self.kind(), p.len() as u32)
            .encode()
            .to_vec();
        v.extend_from_slice(&p);
        v
    }

    /// Decodes a frame's payload. Every field is checked; nothing panics on any input.
    pub fn decode(kind: ConsumerFrame, b: &[u8]) -> Result<ConsumerMsg> {
        Ok(match kind {
            ConsumerFrame::Hello => {
                // the version first: a peer of another version is told so, whatever its size
                need("consumer hello", b, 2)?;
                let version = u16_at(b, 0);
                if version != CONSUMER_VERSION {
                    return Err(WireError::UnsupportedVersion {
                        got: version,
                        supported: CONSUMER_VERSION,
                    });
                }
                need("consumer hello", b, 16)?;
                if u16_at(b, 2) != 0 {
                    return Err(WireError::ReservedNonZero {
                        what: "consumer hello",
                    });
                }
                let max_held = u32_at(b, 4);
                if max_held == 0 {
                    return Err(WireError::OutOfRange {
                        what: "consumer hello max_held",
                        value: 0,
                    });
                }
                let nonce = u64_at(b, 8);
                let (run_id, at) = name_at(b, 16, "consumer hello run id")?;
                let (name, at) = name_at(b, at, "consumer hello name")?;
                exact("consumer hello", b, at)?;
                ConsumerMsg::Hello(ConsumerHello {
                    max_held,
                    nonce,
                    run_id,
                    name,
                })
            }
            ConsumerFrame::Welcome => {
                need("welcome", b, 8)?;
                if u16_at(b, 2) != 0 {
                    return Err(WireError::ReservedNonZero { what: "welcome" });
                }
                let max_held = u32_at(b, 4);
                if max_held == 0 {
                    return Err(WireError::OutOfRange {
                        what: "welcome max_held",
                        value: 0,
                    });
                }
                let (bu_id, at) = name_at(b, 8, "welcome bu id")?;
                exact("welcome", b, at)?;
                ConsumerMsg::Welcome(Welcome {
                    bu_index: u16_at(b, 0),
                    max_held,
                    bu_id,
                })
            }
            ConsumerFrame::Refuse => {
                need("refuse", b, 2)?;
                let code = RefuseCode::from_u16(u16_at(b, 0))?;
                let rest = &b[2..];
                if rest.len() > MAX_REFUSE_REASON {
                    return Err(WireError::TooLong {
                        what: "refuse reason",
                        len: rest.len(),
                        max: MAX_REFUSE_REASON,
                    });
                }
                let reason = std::str::from_utf8(rest).map_err(|_| WireError::BadUtf8 {
                    what: "refuse reason",
                })?;
                ConsumerMsg::Refuse {
                    code,
                    reason: reason.to_string(),
                }
            }
            ConsumerFrame::Event => ConsumerMsg::Event(b.to_vec()),
            ConsumerFrame::Ack => {
                need("ack", b, 8)?;
                let n = u32_at(b, 0) as usize;
                if n == 0 || n > MAX_ACK_IDS {
                    return Err(WireError::OutOfRange {
                        what: "ack count",
                        value: n as u64,
                    });
                }
                if u32_at(b, 4) != 0 {
                    return Err(WireError::ReservedNonZero { what: "ack" });
                }
                exact("ack", b, 8 + 8 * n)?;
                ConsumerMsg::Ack((0..n).map(|i| u64_at(b, 8 + 8 * i)).collect())
            }
            ConsumerFrame::End => {
                exact("end", b, 16)?;
                ConsumerMsg::End {
                    acked: u64_at(b, 0),
                    lost: u64_at(b, 8),
                }
            }
            ConsumerFrame::Challenge => {
                exact("challenge", b, 8 + PROOF_LEN)?;
                let nonce = u64_at(b, 0);
                if nonce == 0 {
                    return Err(WireError::OutOfRange {
                        what: "challenge nonce",
                        value: 0,
                    });
                }
                let mut proof = [0u8; PROOF_LEN];
                proof.copy_from_slice(&b[8..]);
                ConsumerMsg::Challenge { nonce, proof }
            }
            ConsumerFrame::Auth => {
                exact("auth", b, PROOF_LEN)?;
                let mut proof = [0u8; PROOF_LEN];
                proof.copy_from_slice(b);
                ConsumerMsg::Auth(proof)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<ConsumerMsg> {
        vec![
            ConsumerMsg::Hello(ConsumerHello {
                max_held: 16,
                nonce: 0,
                run_id: "daq#3".into(),
                name: "host:123".into(),
            }),
            ConsumerMsg::Hello(ConsumerHello {
                max_held: 1,
                nonce: 0x0123_4567_89ab_cdef,
                run_id: String::new(),
                name: "x".repeat(MAX_CONSUMER_NAME),
            }),
            ConsumerMsg::Welcome(Welcome {
                bu_index: 1,
                max_held: 8,
                bu_id: "bu1".into(),
            }),
            ConsumerMsg::Refuse {
                code: RefuseCode::WrongRun,
                reason: "run is daq".into(),
            },
            ConsumerMsg::Event(vec![1, 2, 3]),
            ConsumerMsg::Ack(vec![5, 7, u64::MAX]),
            ConsumerMsg::End { acked: 10, lost: 0 },
            ConsumerMsg::Refuse {
                code: RefuseCode::Busy,
                reason: String::new(),
            },
            ConsumerMsg::Refuse {
                code: RefuseCode::Unauthenticated,
                reason: "wrong secret".into(),
            },
            ConsumerMsg::Challenge {
                nonce: u64::MAX,
                proof: [7; PROOF_LEN],
            },
            ConsumerMsg::Auth([0xa5; PROOF_LEN]),
        ]
    }

    fn decode_frame(b: &[u8]) -> Result<ConsumerMsg> {
        let h = ConsumerHeader::decode(b, 1 << 20)?;
        let p = &b[CONSUMER_HEADER_LEN..];
        exact("frame", p, h.length as usize)?;
        ConsumerMsg::decode(h.kind, p)
    }

    #[test]
    fn every_message_round_trips() {
        for m in all() {
            assert_eq!(decode_frame(&m.encode()).unwrap(), m);
        }
    }

    #[test]
    fn truncated_frames_are_errors_not_panics() {
        for m in all() {
            let b = m.encode();
            for cut in 0..b.len() {
                if matches!(m, ConsumerMsg::Event(_)) && cut >= CONSUMER_HEADER_LEN {
                    continue; // an Event's payload is checked by the formats crate
                }
                assert!(decode_frame(&b[..cut]).is_err(), "{m:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn garbage_is_refused_with_a_typed_error() {
        let e = ConsumerHeader::decode(b"GET / HTTP/1.1\r\n", 1 << 20).unwrap_err();
        assert!(matches!(e, WireError::BadConsumerMagic(_)));
        assert!(e.to_string().contains("expected \"EVBC\""), "{e}");
        // the data port's frames are not the consumer port's
        let mut h = ConsumerHeader::new(ConsumerFrame::Ack, 16).encode();
        h[3] = b'F';
        assert!(matches!(
            ConsumerHeader::decode(&h, 1 << 20),
            Err(WireError::BadConsumerMagic(_))
        ));
        let mut h = ConsumerHeader::new(ConsumerFrame::Ack, 16).encode();
        h[4] = 9;
        assert!(matches!(
            ConsumerHeader::decode(&h, 1 << 20),
            Err(WireError::UnsupportedVersion { got: 9, .. })
        ));
        let mut h = ConsumerHeader::new(ConsumerFrame::Ack, 16).encode();
        h[6] = 77;
        assert_eq!(
            ConsumerHeader::decode(&h, 1 << 20),
            Err(WireError::UnknownFrameType(77))
        );
        h[6] = 5;
        h[7] = 1;
        assert!(ConsumerHeader::decode(&h, 1 << 20).is_err());
        // a control frame larger than 64 KiB, an event larger than the limit
        let h = ConsumerHeader::new(ConsumerFrame::Hello, 1 << 20).encode();
        assert!(matches!(
            ConsumerHeader::decode(&h, u32::MAX),
            Err(WireError::FrameTooLarge { .. })
        ));
        let h = ConsumerHeader::new(ConsumerFrame::Event, 2 << 20).encode();
        assert!(ConsumerHeader::decode(&h, 1 << 20).is_err());
        // an Ack of 0 ids, or one whose count disagrees with its length
        assert!(ConsumerMsg::decode(ConsumerFrame::Ack, &[0; 8]).is_err());
        let mut a = ConsumerMsg::Ack(vec![1, 2]).encode_payload();
        a.truncate(16);
        assert!(ConsumerMsg::decode(ConsumerFrame::Ack, &a).is_err());
        // a Hello asking for no events, naming a run in bad UTF-8, with bytes after it
        let mut hello = ConsumerMsg::Hello(ConsumerHello {
            max_held: 0,
            nonce: 9,
            run_id: "r".into(),
            name: "n".into(),
        })
        .encode_payload();
        assert!(ConsumerMsg::decode(ConsumerFrame::Hello, &hello).is_err());
        hello[4] = 1;
        assert!(ConsumerMsg::decode(ConsumerFrame::Hello, &hello).is_ok());
        let mut bad = hello.clone();
        bad[17] = 0xff;
        assert!(matches!(
            ConsumerMsg::decode(ConsumerFrame::Hello, &bad),
            Err(WireError::BadUtf8 { .. })
        ));
        hello.push(0);
        assert!(matches!(
            ConsumerMsg::decode(ConsumerFrame::Hello, &hello),
            Err(WireError::BadLength { .. })
        ));
        // a Hello whose name length runs past the end
        let mut short = vec![2, 0, 0, 0, 1, 0, 0, 0];
        short.extend_from_slice(&[0; 8]);
        short.push(50);
        assert!(matches!(
            ConsumerMsg::decode(ConsumerFrame::Hello, &short),
            Err(WireError::Truncated { .. })
        ));
    }

    /// Version 1 (a Hello without a nonce) is refused with a typed error, in the header and
    /// in the Hello.
    #[test]
    fn version_1_is_refused() {
        let mut h = ConsumerHeader::new(ConsumerFrame::Hello, 30).encode();
        h[4] = 1;
        assert_eq!(
            ConsumerHeader::decode(&h, 0),
            Err(WireError::UnsupportedVersion {
                got: 1,
                supported: 2
            })
        );
        // a v1 Hello payload: version 1, reserved, max_held, run id "r", name "n"
        let v1 = [1, 0, 0, 0, 4, 0, 0, 0, 1, b'r', 1, b'n'];
        assert!(matches!(
            ConsumerMsg::decode(ConsumerFrame::Hello, &v1),
            Err(WireError::UnsupportedVersion { got: 1, .. })
        ));
    }

    #[test]
    fn challenge_and_auth_are_exact() {
        let c = ConsumerMsg::Challenge {
            nonce: 5,
            proof: [1; PROOF_LEN],
        }
        .encode_payload();
        assert_eq!(c.len(), 40);
        assert!(ConsumerMsg::decode(ConsumerFrame::Challenge, &c[..39]).is_err());
        let mut longer = c.clone();
        longer.push(0);
        assert!(matches!(
            ConsumerMsg::decode(ConsumerFrame::Challenge, &longer),
            Err(WireError::BadLength { .. })
        ));
        let mut zero = c.clone();
        zero[..8].fill(0);
        assert!(matches!(
            ConsumerMsg::decode(ConsumerFrame::Challenge, &zero),
            Err(WireError::OutOfRange { .. })
        ));
        assert!(ConsumerMsg::decode(ConsumerFrame::Auth, &[0; 31]).is_err());
        assert!(ConsumerMsg::decode(ConsumerFrame::Auth, &[0; 33]).is_err());
        assert!(ConsumerMsg::decode(ConsumerFrame::Auth, &[0; 32]).is_ok());
        assert!(matches!(
            ConsumerMsg::decode(ConsumerFrame::Refuse, &[6, 0]),
            Err(WireError::OutOfRange { .. })
        ));
    }

    /// The proof key tells apart every field: role, nonce, Hello, secret (no two different
    /// inputs give the same key, even where a field's bytes could slide into the next).
    #[test]
    fn proof_keys_bind_every_input() {
        let k = proof_key(ProofRole::Bu, b"s", b"hello", 7);
        assert_eq!(&k[..16], PROOF_LABEL);
        assert_eq!(k.len(), 16 + 1 + 8 + 4 + 5 + 4 + 1);
        let others = [
            proof_key(ProofRole::Consumer, b"s", b"hello", 7),
            proof_key(ProofRole::Bu, b"t", b"hello", 7),
            proof_key(ProofRole::Bu, b"s", b"hellO", 7),
            proof_key(ProofRole::Bu, b"s", b"hello", 8),
            proof_key(ProofRole::Bu, b"os", b"hell", 7),
            proof_key(ProofRole::Bu, b"", b"hello", 7),
            proof_key(ProofRole::Bu, b"s\0", b"hello", 7),
        ];
        for o in &others {
            assert_ne!(&k, o);
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for len in 0..300 {
            let b: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = decode_frame(&b);
            for k in 1..=8 {
                let _ = ConsumerMsg::decode(ConsumerFrame::from_u8(k).unwrap(), &b);
            }
        }
    }
}

//! The handshake that opens every connection: who is calling, for which run, on which channel.

use crate::bytes::{need, u16_at, u64_at};
use crate::error::{Result, WireError};
use crate::frame::PROTOCOL_VERSION;

pub const MAX_NAME_LEN: usize = 64;
const FIXED_LEN: usize = 16;

/// What a connection carries: control messages (latency first) or fragments (throughput first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Channel {
    Control = 0,
    Data = 1,
}

/// A node's role in the event builder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Role {
    Evm = 0,
    Ru = 1,
    Bu = 2,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Evm => "evm",
            Role::Ru => "ru",
            Role::Bu => "bu",
        }
    }
}

/// Hello payload, little-endian:
/// version u16 | channel u8 | role u8 | index u16 | incarnation u16 | nonce u64 |
/// run-id length u8 | run id | node-id length u8 | node id
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
    pub channel: Channel,
    pub role: Role,
    /// Index of the node among those of its role (RU 0..N, BU 0..M; 0 for the EVM).
    pub index: u16,
    /// A BU's incarnation: drawn at random (1…65535) when its part of a run starts, the same
    /// on every connection it makes or accepts in that run, so that an RU sends an Assign's fragments only
    /// to the process the EVM assigned them to (docs/protocol.md §6 item 11). 0 for an EVM
    /// or RU, and for a BU that does not say (pub/sub subscribers); a decoder refuses any
    /// other value from them.
    pub incarnation: u16,
    /// The handshake nonce: 0 without a shared secret, random and non-zero with one.
    pub nonce: u64,
    pub run_id: String,
    pub node_id: String,
}

impl Hello {
    pub fn new(channel: Channel, role: Role, index: u16, run_id: &str, node_id: &str) -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            channel,
            role,
            index,
            incarnation: 0,
            nonce: 0,
            run_id: run_id.to_string(),
            node_id: node_id.to_string(),
        }
    }

    /// The same Hello for a BU process of incarnation `incarnation`.
    pub fn with_incarnation(mut self, incarnation: u16) -> Hello {
        self.incarnation = incarnation;
        self
    }

    /// # Errors
    /// If a name is longer than [`MAX_NAME_LEN`] bytes.
    pub fn encode(&self) -> Result<Vec<u8>> {
        for (what, s) in [("run id", &self.run_id), ("node id", &self.node_id)] {
            if s.len() > MAX_NAME_LEN {
                return Err(WireError::TooLong {
                    what,
                    len: s.len(),
                    max: MAX_NAME_LEN,
                });
            }
        }
        let mut v = Vec::with_capacity(FIXED_LEN + 2 + self.run_id.len() + self.node_id.len());
        v.extend_from_slice(&self.version.to_le_bytes());
        v.push(self.channel as u8);
        v.push(self.role as u8);
        v.extend_from_slice(&self.index.to_le_bytes());
        v.extend_from_slice(&self.incarnation.to_le_bytes());
        v.extend_from_slice(&self.nonce.to_le_bytes());
        v.push(self.run_id.len() as u8);
        v.extend_from_slice(self.run_id.as_bytes());
        v.push(self.node_id.len() as u8);
        v.extend_from_slice(self.node_id.as_bytes());
        Ok(v)
    }

    pub fn decode(b: &[u8]) -> Result<Hello> {
        need("hello", b, FIXED_LEN + 1)?;
        let version = u16_at(b, 0);
        if version != PROTOCOL_VERSION {
            return Err(WireError::UnsupportedVersion {
                got: version,
                supported: PROTOCOL_VERSION,
            });
        }
        let channel = match b[2] {
            0 => Channel::Control,
            1 => Channel::Data,
            v => {
                return Err(WireError::OutOfRange {
                    what: "hello channel",
                    value: v as u64,
                })
            }
        };
        let role = match b[3] {
            0 => Role::Evm,
            1 => Role::Ru,
            2 => Role::Bu,
            v => {
                return Err(WireError::OutOfRange {
                    what: "hello role",
                    value: v as u64,
                })
            }
        };
        let index = u16_at(b, 4);
        let incarnation = u16_at(b, 6);
        if incarnation != 0 && role != Role::Bu {
            return Err(WireError::ReservedNonZero { what: "hello" });
        }
        let nonce = u64_at(b, 8);
        let (run_id, rest) = name("run id", &b[FIXED_LEN..])?;
        need("hello node id", rest, 1)?;
        let (node_id, rest) = name("node id", rest)?;
        if !rest.is_empty() {
            return Err(WireError::BadLength {
                what: "hello",
                expected: b.len() - rest.len(),
                got: b.len(),
            });
        }
        Ok(Hello {
            version,
            channel,
            role,
            index,
            incarnation,
            nonce,
            run_id,
            node_id,
        })
    }
}

fn name<'a>(what: &'static str, b: &'a [u8]) -> Result<(String, &'a [u8])> {
    let len = b[0] as usize;
    if len > MAX_NAME_LEN {
        return Err(WireError::TooLong {
            what,
            len,
            max: MAX_NAME_LEN,
        });
    }
    need(what, &b[1..], len)?;
    let s = std::str::from_utf8(&b[1..1 + len]).map_err(|_| WireError::BadUtf8 { what })?;
    Ok((s.to_string(), &b[1 + len..]))
}

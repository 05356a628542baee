//! Discovery: nodes started without addresses (docs/protocol.md §1.1). Each node tells the
//! EVM who and where it is ([`Registration`], message Register); the EVM tells each RU where
//! the BUs it must call listen ([`PeerAddr`] list, message Peers).

use crate::bytes::{need, u16_at, u32_at};
use crate::error::{Result, WireError};
use crate::handshake::Role;

/// Longest host name or address in a Register or Peers body.
pub const MAX_ADDR_LEN: usize = 255;
/// Most entries in one Peers body (the configuration's limit on nodes of a role).
pub const MAX_PEERS: usize = 4096;
/// `Registration::rank` of a process no launcher gave a rank.
pub const NO_RANK: u32 = u32::MAX;

/// Node → EVM: the process behind a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The launcher's rank of the process ([`NO_RANK`]: none).
    pub rank: u32,
    pub pid: u32,
    /// The host's name.
    pub host: String,
    /// Where the node's data listener is bound (what a caller dials).
    pub data: String,
    /// Where its control API is bound (empty: not known to the node's event loop).
    pub control: String,
}

/// EVM → RU: where node `(role, index)` listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAddr {
    pub role: Role,
    pub index: u16,
    pub addr: String,
}

fn put_text(out: &mut Vec<u8>, s: &str) {
    let s = crate::frame::truncate_utf8(s, MAX_ADDR_LEN);
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A length-prefixed text at `*at`, advancing past it.
fn take_text(b: &[u8], at: &mut usize, what: &'static str) -> Result<String> {
    need(what, &b[*at..], 2)?;
    let len = u16_at(b, *at) as usize;
    if len > MAX_ADDR_LEN {
        return Err(WireError::TooLong {
            what,
            len,
            max: MAX_ADDR_LEN,
        });
    }
    *at += 2;
    need(what, &b[*at..], len)?;
    let s = std::str::from_utf8(&b[*at..*at + len]).map_err(|_| WireError::BadUtf8 { what })?;
    *at += len;
    Ok(s.to_string())
}

fn no_trailing(b: &[u8], at: usize, what: &'static str) -> Result<()> {
    if at == b.len() {
        Ok(())
    } else {
        Err(WireError::BadLength {
            what,
            expected: at,
            got: b.len(),
        })
    }
}

impl Registration {
    /// rank u32 · pid u32 · host, data, control: each a u16 length and UTF-8 bytes.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.rank.to_le_bytes());
        out.extend_from_slice(&self.pid.to_le_bytes());
        put_text(out, &self.host);
        put_text(out, &self.data);
        put_text(out, &self.control);
    }

    pub fn decode(b: &[u8]) -> Result<Registration> {
        need("register", b, 8)?;
        let mut at = 8;
        let host = take_text(b, &mut at, "register host")?;
        let data = take_text(b, &mut at, "register data address")?;
        let control = take_text(b, &mut at, "register control address")?;
        no_trailing(b, at, "register")?;
        if data.is_empty() {
            return Err(WireError::OutOfRange {
                what: "register data address length",
                value: 0,
            });
        }
        Ok(Registration {
            rank: u32_at(b, 0),
            pid: u32_at(b, 4),
            host,
            data,
            control,
        })
    }

    /// "rank 3 on host n12 (pid 4711)", for messages.
    pub fn describe(&self) -> String {
        let rank = if self.rank == NO_RANK {
            "a process without a launcher's rank".to_string()
        } else {
            format!("rank {}", self.rank)
        };
        format!("{rank} on host {} (pid {})", self.host, self.pid)
    }
}

/// count u16 · reserved u16 · entries: role u8 · reserved u8 · index u16 · address (u16
/// length and UTF-8 bytes).
pub fn encode_peers(peers: &[PeerAddr], out: &mut Vec<u8>) {
    let n = peers.len().min(MAX_PEERS);
    out.extend_from_slice(&(n as u16).to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    for p in &peers[..n] {
        out.push(p.role as u8);
        out.push(0);
        out.extend_from_slice(&p.index.to_le_bytes());
        put_text(out, &p.addr);
    }
}

pub fn decode_peers(b: &[u8]) -> Result<Vec<PeerAddr>> {
    need("peers", b, 4)?;
    let n = u16_at(b, 0) as usize;
    if n > MAX_PEERS {
        return Err(WireError::OutOfRange {
            what: "peers count",
            value: n as u64,
        });
    }
    if u16_at(b, 2) != 0 {
        return Err(WireError::ReservedNonZero { what: "peers" });
    }
    let mut at = 4;
    let mut v = Vec::with_capacity(n.min(b.len() / 6));
    for _ in 0..n {
        need("peers entry", &b[at..], 4)?;
        let role = match b[at] {
            0 => Role::Evm,
            1 => Role::Ru,
            2 => Role::Bu,
            r => {
                return Err(WireError::OutOfRange {
                    what: "peers role",
                    value: r as u64,
                })
            }
        };
        if b[at + 1] != 0 {
            return Err(WireError::ReservedNonZero {
                what: "peers entry",
            });
        }
        let index = u16_at(b, at + 2);
        at += 4;
        let addr = take_text(b, &mut at, "peers address")?;
        if addr.is_empty() {
            return Err(WireError::OutOfRange {
                what: "peers address length",
                value: 0,
            });
        }
        v.push(PeerAddr { role, index, addr });
    }
    no_trailing(b, at, "peers")?;
    Ok(v)
}

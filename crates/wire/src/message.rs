//! Event-building and control messages. Each travels inside a `Messages` frame as an 8-byte
//! [`MessageHeader`] followed by its body.

use crate::bytes::{need, u16_at, u32_at, u64_at};
use crate::discovery::{decode_peers, encode_peers, PeerAddr, Registration};
use crate::error::{Result, WireError};
use crate::frame::truncate_utf8;
use crate::window::{DecisionWindow, MAX_WINDOW_COMPONENTS};

pub const MESSAGE_HEADER_LEN: usize = 8;
/// `Ready::available` of a source that never runs out.
pub const UNLIMITED: u64 = u64::MAX;
/// Longest report or abort text accepted.
pub const MAX_TEXT_LEN: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum MessageType {
    Credit = 0x0001,
    Assign = 0x0002,
    Release = 0x0003,
    Fragment = 0x0004,
    Ready = 0x0010,
    Start = 0x0011,
    Stop = 0x0012,
    Halt = 0x0013,
    Report = 0x0014,
    Abort = 0x0015,
    Heartbeat = 0x0016,
    SourceLost = 0x0017,
    LinkLost = 0x0018,
    Available = 0x0019,
    /// Node → EVM: who and where the process is (discovery, [`crate::discovery`]).
    Register = 0x001A,
    /// EVM → RU: where the BUs it calls listen.
    Peers = 0x001B,
    /// BU → EVM: a part of the output is durable under a temporary name; may it be published?
    Commit = 0x001C,
    /// EVM → BU: yes: the part's events are final (the RUs forget them); publish it.
    Committed = 0x001D,
    /// BU → EVM: the part is published under its final name.
    PartPublished = 0x001E,
    /// RU → a standby EVM taking the run over: what it holds (see [`crate::resync`]).
    ResyncRu = 0x001F,
    /// BU → a standby EVM taking the run over: the events it has and how far each got.
    ResyncBu = 0x0020,
    /// Active EVM → its standby: the run's elapsed time, a stop, the nodes it dropped.
    Follow = 0x0021,
    /// A standby EVM that the nodes followed → the EVM it replaced: you are fenced; the run
    /// is the standby's at this epoch.
    Fence = 0x0022,
    /// EVM → a node, first on every control connection: the EVM's epoch (its term).
    Term = 0x0023,
    /// EVM → RUs: the windows of records decided from outside (docs/protocol.md §10.4).
    Window = 0x0024,
    /// Pub/sub (see [`crate::pubsub`]): subscriber → publisher.
    Subscribe = 0x0030,
    Unsubscribe = 0x0031,
    /// Publisher → subscriber: a tagged message; its payload stays in pool blocks.
    Published = 0x0032,
    Gap = 0x0033,
    Goodbye = 0x0034,
}

impl MessageType {
    pub fn from_u16(v: u16) -> Result<MessageType> {
        Ok(match v {
            0x0001 => MessageType::Credit,
            0x0002 => MessageType::Assign,
            0x0003 => MessageType::Release,
            0x0004 => MessageType::Fragment,
            0x0010 => MessageType::Ready,
            0x0011 => MessageType::Start,
            0x0012 => MessageType::Stop,
            0x0013 => MessageType::Halt,
            0x0014 => MessageType::Report,
            0x0015 => MessageType::Abort,
            0x0016 => MessageType::Heartbeat,
            0x0017 => MessageType::SourceLost,
            0x0018 => MessageType::LinkLost,
            0x0019 => MessageType::Available,
            0x001A => MessageType::Register,
            0x001B => MessageType::Peers,
            0x001C => MessageType::Commit,
            0x001D => MessageType::Committed,
            0x001E => MessageType::PartPublished,
            0x001F => MessageType::ResyncRu,
            0x0020 => MessageType::ResyncBu,
            0x0021 => MessageType::Follow,
            0x0022 => MessageType::Fence,
            0x0023 => MessageType::Term,
            0x0024 => MessageType::Window,
            0x0030 => MessageType::Subscribe,
            0x0031 => MessageType::Unsubscribe,
            0x0032 => MessageType::Published,
            0x0033 => MessageType::Gap,
            0x0034 => MessageType::Goodbye,
            other => return Err(WireError::UnknownMessageType(other)),
        })
    }
}

/// Message header, 8 bytes, little-endian: type u16 | flags u16 (zero) | body length u32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageHeader {
    pub msg_type: MessageType,
    pub length: u32,
}

impl MessageHeader {
    pub fn encode(&self) -> [u8; MESSAGE_HEADER_LEN] {
        let mut b = [0u8; MESSAGE_HEADER_LEN];
        b[0..2].copy_from_slice(&(self.msg_type as u16).to_le_bytes());
        b[4..8].copy_from_slice(&self.length.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<MessageHeader> {
        need("message header", b, MESSAGE_HEADER_LEN)?;
        let msg_type = MessageType::from_u16(u16_at(b, 0))?;
        if u16_at(b, 2) != 0 {
            return Err(WireError::ReservedNonZero {
                what: "message flags",
            });
        }
        Ok(MessageHeader {
            msg_type,
            length: u32_at(b, 4),
        })
    }
}

/// A range of consecutive event ids `[first, first + count)` and the BU it concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRange {
    pub bu: u16,
    pub first: u64,
    pub count: u32,
}

impl EventRange {
    pub fn end(&self) -> u64 {
        self.first + self.count as u64
    }
}

/// Most ranges in one Commit: a sink seals a part before it spans more (4 KiB of body).
pub const MAX_COMMIT_RANGES: usize = 256;

/// Every message except `Fragment`, whose payload stays in pool buffers (see [`crate::FragmentHeader`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// BU → EVM: room for `count` more events (at least 1: the decoder refuses 0).
    Credit { bu: u16, count: u32 },
    /// EVM → RUs and BU: these events go to `range.bu`, the incarnation of it named by the
    /// `u16` (the BU's Hello bytes 6–7 as the EVM read them; 0: none known, so an RU makes
    /// and holds the fragments and sends them nowhere). `count` ≥ 1: the decoder refuses an
    /// empty range.
    Assign(EventRange, u16),
    /// BU → EVM: these events are built and handed on; EVM → RUs: free their fragments
    /// (`count` ≥ 1, as for `Assign`).
    Release(EventRange),
    /// Node → EVM: configured and connected, ready to start. `available` is how many events
    /// the node's data source can supply ([`UNLIMITED`] for a generator or a looping source).
    Ready { available: u64 },
    /// EVM → nodes: the run starts.
    Start,
    /// EVM → nodes: the run is over; `triggered` events were assigned in all.
    Stop { triggered: u64 },
    /// EVM → nodes: exit.
    Halt,
    /// Node → EVM after Stop: the node's end-of-run counters as a UTF-8 JSON object.
    Report(String),
    /// Either way: the run cannot go on, for this reason.
    Abort(String),
    /// Either way, when nothing else was sent for a while: I am alive.
    Heartbeat,
    /// EVM → BUs: RU `ru` is gone; build events without it, flagged partial.
    SourceLost { ru: u16 },
    /// RU → EVM: this RU's data connection to BU `peer` closed while both were in the run;
    /// BU → EVM: this BU's data connection from RU `peer` closed so (the end that closed a
    /// link knows it first, and the run must not depend on the other end's good manners).
    /// `inc`: from an RU, the incarnation of the BU process whose connection closed (0: not
    /// known), so that a report about a process already replaced does not drop the new one;
    /// 0 from a BU.
    LinkLost { peer: u16, inc: u16 },
    /// RU → EVM, from an RU fed live (front-end streams): its source holds fragments for
    /// events `[0, count)`; with `done`, no more will come. Such an RU announces
    /// `Available { count: 0, done: false }` before its Ready, and the EVM triggers no event
    /// that an RU so announced cannot supply yet.
    Available { count: u64, done: bool },
    /// Node → EVM, first on its control connection: its rank, host and bound addresses.
    Register(Registration),
    /// EVM → RU: where BUs started without a configured address listen.
    Peers(Vec<PeerAddr>),
    /// BU → EVM (sinks that commit, docs/protocol.md §6 step 7): part `part` of this BU's
    /// output holds these accepted events (1 to [`MAX_COMMIT_RANGES`] ranges, each of this
    /// BU) and is durable under a temporary name. The EVM answers `Committed` only while the
    /// BU is in the run: that answer, not the BU, makes the events final.
    Commit {
        bu: u16,
        part: u32,
        ranges: Vec<EventRange>,
    },
    /// EVM → BU: part `part` is committed: its events are final and the RUs forget them;
    /// the BU publishes it (renames it into place).
    Committed { bu: u16, part: u32 },
    /// BU → EVM: part `part` is published. A BU lost between Committed and this leaves a
    /// committed part unpublished, and the EVM's report counts its events.
    PartPublished { bu: u16, part: u32 },
    /// RU → new EVM (a standby taking over): what it holds; `more`: another message of
    /// this resync follows.
    ResyncRu {
        resync: crate::resync::RuResync,
        more: bool,
    },
    /// BU → new EVM: its events and how far each got; `more` as for `ResyncRu`.
    ResyncBu {
        /// Boxed: it is the largest of the messages, and every message (most of them a few
        /// words, made per event batch) would otherwise be as big.
        resync: Box<crate::resync::BuResync>,
        more: bool,
    },
    /// Active EVM → its standby: what the standby needs to take over.
    Follow(crate::resync::Follow),
    /// Standby → the EVM it replaced: the nodes follow the standby at `epoch`; the old
    /// EVM's word is no longer the run's.
    Fence { epoch: u16 },
    /// EVM → node, the first message on a control connection: this EVM speaks for the run
    /// at `epoch` (0 for the EVM that started it). A node that followed a higher epoch
    /// refuses it (docs/protocol.md §6 item 15).
    Term { epoch: u16 },
    /// EVM → RUs (docs/protocol.md §10.4): records `first ..` are decisions from outside,
    /// these windows `[begin, end)` in ticks, each over the sources it names (none: every
    /// source); sent before their Assign on the same connection. 1 to [`MAX_WINDOWS`]
    /// windows, each ending after it begins, the body at most [`MAX_WINDOW_BODY`] bytes
    /// ([`Message::windows`] splits a longer list).
    Window {
        first: u64,
        windows: Vec<DecisionWindow>,
    },
}

/// Most windows in one Window message.
pub const MAX_WINDOWS: usize = 4096;
/// Most bytes in a Window message's body (within every peer's frame limit).
pub const MAX_WINDOW_BODY: usize = 60 * 1024;

impl Message {
    /// Window messages for records `first ..` with `windows`, split so that each holds at
    /// most [`MAX_WINDOWS`] windows and [`MAX_WINDOW_BODY`] bytes.
    pub fn windows(first: u64, windows: &[DecisionWindow]) -> Vec<Message> {
        let mut out = Vec::new();
        let (mut from, mut bytes) = (0usize, 16usize);
        for (i, w) in windows.iter().enumerate() {
            let len = w.entry_len();
            if i > from && (i - from == MAX_WINDOWS || bytes + len > MAX_WINDOW_BODY) {
                out.push(Message::Window {
                    first: first + from as u64,
                    windows: windows[from..i].to_vec(),
                });
                (from, bytes) = (i, 16);
            }
            bytes += len;
        }
        if from < windows.len() {
            out.push(Message::Window {
                first: first + from as u64,
                windows: windows[from..].to_vec(),
            });
        }
        out
    }
}

/// A range's 16 bytes: first u64 · count u32 · bu u16 · reserved u16.
pub(crate) fn encode_range(r: &EventRange, out: &mut Vec<u8>) {
    out.extend_from_slice(&r.first.to_le_bytes());
    out.extend_from_slice(&r.count.to_le_bytes());
    out.extend_from_slice(&r.bu.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
}

/// A range from the first 16 bytes of `b` (which holds at least that many): count ≥ 1, no
/// overflow, reserved zero.
pub(crate) fn decode_range(
    b: &[u8],
    what: &'static str,
    count_what: &'static str,
) -> Result<EventRange> {
    if u16_at(b, 14) != 0 {
        return Err(WireError::ReservedNonZero { what });
    }
    let r = EventRange {
        first: u64_at(b, 0),
        count: u32_at(b, 8),
        bu: u16_at(b, 12),
    };
    // an empty range means nothing, and the RU counts a range down to 0 from its first
    // event: refuse it here rather than underflow there
    if r.count == 0 {
        return Err(WireError::OutOfRange {
            what: count_what,
            value: 0,
        });
    }
    if r.first.checked_add(r.count as u64).is_none() {
        return Err(WireError::OutOfRange {
            what,
            value: r.first,
        });
    }
    Ok(r)
}

impl Message {
    pub fn msg_type(&self) -> MessageType {
        match self {
            Message::Credit { .. } => MessageType::Credit,
            Message::Assign(..) => MessageType::Assign,
            Message::Release(_) => MessageType::Release,
            Message::Ready { .. } => MessageType::Ready,
            Message::Start => MessageType::Start,
            Message::Stop { .. } => MessageType::Stop,
            Message::Halt => MessageType::Halt,
            Message::Report(_) => MessageType::Report,
            Message::Abort(_) => MessageType::Abort,
            Message::Heartbeat => MessageType::Heartbeat,
            Message::SourceLost { .. } => MessageType::SourceLost,
            Message::LinkLost { .. } => MessageType::LinkLost,
            Message::Available { .. } => MessageType::Available,
            Message::Register(_) => MessageType::Register,
            Message::Peers(_) => MessageType::Peers,
            Message::Commit { .. } => MessageType::Commit,
            Message::Committed { .. } => MessageType::Committed,
            Message::PartPublished { .. } => MessageType::PartPublished,
            Message::ResyncRu { .. } => MessageType::ResyncRu,
            Message::ResyncBu { .. } => MessageType::ResyncBu,
            Message::Follow(_) => MessageType::Follow,
            Message::Fence { .. } => MessageType::Fence,
            Message::Term { .. } => MessageType::Term,
            Message::Window { .. } => MessageType::Window,
        }
    }

    /// Appends header and body to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0u8; MESSAGE_HEADER_LEN]);
        match self {
            Message::Credit { bu, count } => {
                out.extend_from_slice(&bu.to_le_bytes());
                out.extend_from_slice(&0u16.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
            }
            Message::Assign(r, inc) => {
                encode_range(r, out);
                let n = out.len();
                out[n - 2..].copy_from_slice(&inc.to_le_bytes());
            }
            Message::Release(r) => encode_range(r, out),
            Message::Commit { bu, part, ranges } => {
                let n = ranges.len().min(MAX_COMMIT_RANGES);
                out.extend_from_slice(&bu.to_le_bytes());
                out.extend_from_slice(&(n as u16).to_le_bytes());
                out.extend_from_slice(&part.to_le_bytes());
                for r in &ranges[..n] {
                    encode_range(r, out);
                }
            }
            Message::Committed { bu, part } | Message::PartPublished { bu, part } => {
                out.extend_from_slice(&bu.to_le_bytes());
                out.extend_from_slice(&0u16.to_le_bytes());
                out.extend_from_slice(&part.to_le_bytes());
            }
            Message::Start | Message::Halt | Message::Heartbeat => {}
            Message::SourceLost { ru: node } => {
                out.extend_from_slice(&node.to_le_bytes());
                out.extend_from_slice(&[0u8; 6]);
            }
            Message::LinkLost { peer, inc } => {
                out.extend_from_slice(&peer.to_le_bytes());
                out.extend_from_slice(&inc.to_le_bytes());
                out.extend_from_slice(&[0u8; 4]);
            }
            Message::Ready { available } => out.extend_from_slice(&available.to_le_bytes()),
            Message::Available { count, done } => {
                out.extend_from_slice(&count.to_le_bytes());
                out.extend_from_slice(&u32::from(*done).to_le_bytes());
                out.extend_from_slice(&0u32.to_le_bytes());
            }
            Message::Stop { triggered } => out.extend_from_slice(&triggered.to_le_bytes()),
            Message::Report(s) | Message::Abort(s) => {
                out.extend_from_slice(truncate_utf8(s, MAX_TEXT_LEN).as_bytes())
            }
            Message::Register(r) => r.encode_into(out),
            Message::Peers(p) => encode_peers(p, out),
            Message::ResyncRu { resync, more } => resync.encode_into(*more, out),
            Message::ResyncBu { resync, more } => resync.encode_into(*more, out),
            Message::Follow(f) => f.encode_into(out),
            Message::Fence { epoch } | Message::Term { epoch } => {
                out.extend_from_slice(&epoch.to_le_bytes());
                out.extend_from_slice(&[0u8; 6]);
            }
            Message::Window { first, windows } => {
                let n = windows.len().min(MAX_WINDOWS);
                out.extend_from_slice(&first.to_le_bytes());
                out.extend_from_slice(&(n as u32).to_le_bytes());
                out.extend_from_slice(&0u32.to_le_bytes());
                for w in &windows[..n] {
                    let at = out.len();
                    out.extend_from_slice(&w.begin.to_le_bytes());
                    out.extend_from_slice(&w.end.to_le_bytes());
                    let c = w.components.len().min(u16::MAX as usize);
                    out.extend_from_slice(&(c as u16).to_le_bytes());
                    out.extend_from_slice(&0u16.to_le_bytes());
                    for s in &w.components[..c] {
                        out.extend_from_slice(&s.to_le_bytes());
                    }
                    // padding to a multiple of 8
                    out.resize(at + (20 + 2 * c).next_multiple_of(8), 0);
                }
            }
        }
        let len = (out.len() - start - MESSAGE_HEADER_LEN) as u32;
        let h = MessageHeader {
            msg_type: self.msg_type(),
            length: len,
        };
        out[start..start + MESSAGE_HEADER_LEN].copy_from_slice(&h.encode());
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(32);
        self.encode_into(&mut v);
        v
    }

    /// Decodes the body of a message whose header said `msg_type`.
    ///
    /// # Errors
    /// `Fragment` is not decoded here; any body of the wrong length or content is rejected.
    pub fn decode(msg_type: MessageType, b: &[u8]) -> Result<Message> {
        let exact = |what, n: usize| {
            if b.len() == n {
                Ok(())
            } else {
                Err(WireError::BadLength {
                    what,
                    expected: n,
                    got: b.len(),
                })
            }
        };
        Ok(match msg_type {
            MessageType::Credit => {
                exact("credit", 8)?;
                if u16_at(b, 2) != 0 {
                    return Err(WireError::ReservedNonZero { what: "credit" });
                }
                let count = u32_at(b, 4);
                if count == 0 {
                    return Err(WireError::OutOfRange {
                        what: "credit count",
                        value: 0,
                    });
                }
                Message::Credit {
                    bu: u16_at(b, 0),
                    count,
                }
            }
            MessageType::Assign | MessageType::Release => {
                let (what, count_what) = if msg_type == MessageType::Assign {
                    ("assign", "assign count")
                } else {
                    ("release", "release count")
                };
                exact(what, 16)?;
                if msg_type == MessageType::Assign {
                    // bytes 14–15: the BU's incarnation, not reserved
                    let mut body = [0u8; 16];
                    body[..14].copy_from_slice(&b[..14]);
                    Message::Assign(decode_range(&body, what, count_what)?, u16_at(b, 14))
                } else {
                    Message::Release(decode_range(b, what, count_what)?)
                }
            }
            MessageType::Commit => {
                need("commit", b, 8)?;
                let bu = u16_at(b, 0);
                let n = u16_at(b, 2) as usize;
                if n == 0 || n > MAX_COMMIT_RANGES {
                    return Err(WireError::OutOfRange {
                        what: "commit range count",
                        value: n as u64,
                    });
                }
                exact("commit", 8 + 16 * n)?;
                let mut ranges = Vec::with_capacity(n);
                for k in 0..n {
                    let r = decode_range(&b[8 + 16 * k..], "commit", "commit count")?;
                    if r.bu != bu {
                        return Err(WireError::OutOfRange {
                            what: "commit range of another BU",
                            value: r.bu as u64,
                        });
                    }
                    ranges.push(r);
                }
                Message::Commit {
                    bu,
                    part: u32_at(b, 4),
                    ranges,
                }
            }
            MessageType::Committed | MessageType::PartPublished => {
                let what = if msg_type == MessageType::Committed {
                    "committed"
                } else {
                    "part published"
                };
                exact(what, 8)?;
                if u16_at(b, 2) != 0 {
                    return Err(WireError::ReservedNonZero { what });
                }
                let (bu, part) = (u16_at(b, 0), u32_at(b, 4));
                if msg_type == MessageType::Committed {
                    Message::Committed { bu, part }
                } else {
                    Message::PartPublished { bu, part }
                }
            }
            MessageType::ResyncRu => {
                let (resync, more) = crate::resync::RuResync::decode(b)?;
                Message::ResyncRu { resync, more }
            }
            MessageType::ResyncBu => {
                let (resync, more) = crate::resync::BuResync::decode(b)?;
                Message::ResyncBu {
                    resync: Box::new(resync),
                    more,
                }
            }
            MessageType::Follow => Message::Follow(crate::resync::Follow::decode(b)?),
            MessageType::Fence => {
                exact("fence", 8)?;
                if b[2..8].iter().any(|&x| x != 0) {
                    return Err(WireError::ReservedNonZero { what: "fence" });
                }
                let epoch = u16_at(b, 0);
                if epoch == 0 {
                    return Err(WireError::OutOfRange {
                        what: "fence epoch",
                        value: 0,
                    });
                }
                Message::Fence { epoch }
            }
            MessageType::Window => {
                need("window", b, 16)?;
                let n = u32_at(b, 8) as usize;
                if n == 0 || n > MAX_WINDOWS {
                    return Err(WireError::OutOfRange {
                        what: "window count",
                        value: n as u64,
                    });
                }
                if u32_at(b, 12) != 0 {
                    return Err(WireError::ReservedNonZero { what: "window" });
                }
                let mut windows = Vec::with_capacity(n);
                let mut at = 16;
                for _ in 0..n {
                    need("window entry", &b[at..], 24)?;
                    let e = &b[at..];
                    let c = u16_at(e, 16) as usize;
                    if c > MAX_WINDOW_COMPONENTS {
                        return Err(WireError::OutOfRange {
                            what: "window component count",
                            value: c as u64,
                        });
                    }
                    if u16_at(e, 18) != 0 {
                        return Err(WireError::ReservedNonZero {
                            what: "window entry",
                        });
                    }
                    let len = (20 + 2 * c).next_multiple_of(8);
                    need("window entry", e, len)?;
                    if e[20 + 2 * c..len].iter().any(|&x| x != 0) {
                        return Err(WireError::ReservedNonZero {
                            what: "window entry padding",
                        });
                    }
                    let w = DecisionWindow {
                        begin: u64_at(e, 0),
                        end: u64_at(e, 8),
                        components: (0..c).map(|i| u16_at(e, 20 + 2 * i)).collect(),
                    };
                    if w.end <= w.begin {
                        return Err(WireError::OutOfRange {
                            what: "window end (not after its begin)",
                            value: w.end,
                        });
                    }
                    if w.components.windows(2).any(|p| p[0] >= p[1]) {
                        return Err(WireError::OutOfRange {
                            what: "window component (not above the one before it)",
                            value: w.components.len() as u64,
                        });
                    }
                    windows.push(w);
                    at += len;
                }
                exact("window", at)?;
                Message::Window {
                    first: u64_at(b, 0),
                    windows,
                }
            }
            MessageType::Term => {
                exact("term", 8)?;
                if b[2..8].iter().any(|&x| x != 0) {
                    return Err(WireError::ReservedNonZero { what: "term" });
                }
                Message::Term {
                    epoch: u16_at(b, 0),
                }
            }
            MessageType::Ready => {
                exact("ready", 8)?;
                Message::Ready {
                    available: u64_at(b, 0),
                }
            }
            MessageType::Available => {
                exact("available", 16)?;
                let done = match u32_at(b, 8) {
                    0 => false,
                    1 => true,
                    v => {
                        return Err(WireError::OutOfRange {
                            what: "available done flag",
                            value: v as u64,
                        })
                    }
                };
                if u32_at(b, 12) != 0 {
                    return Err(WireError::ReservedNonZero { what: "available" });
                }
                Message::Available {
                    count: u64_at(b, 0),
                    done,
                }
            }
            MessageType::Start => {
                exact("start", 0)?;
                Message::Start
            }
            MessageType::Halt => {
                exact("halt", 0)?;
                Message::Halt
            }
            MessageType::Heartbeat => {
                exact("heartbeat", 0)?;
                Message::Heartbeat
            }
            MessageType::SourceLost => {
                exact("source lost", 8)?;
                if b[2..8] != [0; 6] {
                    return Err(WireError::ReservedNonZero {
                        what: "source lost",
                    });
                }
                Message::SourceLost { ru: u16_at(b, 0) }
            }
            MessageType::LinkLost => {
                exact("link lost", 8)?;
                if b[4..8] != [0; 4] {
                    return Err(WireError::ReservedNonZero { what: "link lost" });
                }
                Message::LinkLost {
                    peer: u16_at(b, 0),
                    inc: u16_at(b, 2),
                }
            }
            MessageType::Stop => {
                exact("stop", 8)?;
                Message::Stop {
                    triggered: u64_at(b, 0),
                }
            }
            MessageType::Report | MessageType::Abort => {
                let what = if msg_type == MessageType::Report {
                    "report"
                } else {
                    "abort"
                };
                if b.len() > MAX_TEXT_LEN {
                    return Err(WireError::TooLong {
                        what,
                        len: b.len(),
                        max: MAX_TEXT_LEN,
                    });
                }
                let s = std::str::from_utf8(b)
                    .map_err(|_| WireError::BadUtf8 { what })?
                    .to_string();
                if msg_type == MessageType::Report {
                    Message::Report(s)
                } else {
                    Message::Abort(s)
                }
            }
            MessageType::Register => Message::Register(Registration::decode(b)?),
            MessageType::Peers => Message::Peers(decode_peers(b)?),
            MessageType::Fragment => {
                return Err(WireError::OutOfRange {
                    what: "fragment outside the fragment path",
                    value: 4,
                })
            }
            MessageType::Subscribe
            | MessageType::Unsubscribe
            | MessageType::Published
            | MessageType::Gap
            | MessageType::Goodbye => {
                return Err(WireError::OutOfRange {
                    what: "pub/sub message outside the pub/sub path",
                    value: msg_type as u16 as u64,
                })
            }
        })
    }
}

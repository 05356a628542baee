//! What each node tells a standby EVM that takes a run over (docs/standby.md,
//! docs/protocol.md §4 "ResyncRu" and "ResyncBu"): the events it holds and how far each
//! got. A node's resync may span several messages (at most [`MAX_RESYNC_RANGES`] ranges
//! each); all but the last carry the *more* flag, and the new EVM joins them.

use crate::bytes::{u16_at, u32_at, u64_at};
use crate::message::{decode_range, encode_range};
use crate::{EventRange, Result, WireError};

/// Most ranges in one resync message (64 KiB of ranges).
pub const MAX_RESYNC_RANGES: usize = 4096;

const STOPPING: u16 = 1;
const MORE: u16 = 2;

/// What an RU tells a new EVM.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuResync {
    pub ru: u16,
    /// One past the highest event id ever assigned to it.
    pub known_until: u64,
    /// Every event it holds or has yet to make (not released), ascending, each range with
    /// the BU its fragments go to.
    pub holds: Vec<EventRange>,
    /// It had heard the old EVM's Stop: triggering was over.
    pub stopping: bool,
}

/// What a BU tells a new EVM (with its sink's state when the sink commits). Every range's
/// `bu` is the BU's own index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuResync {
    pub bu: u16,
    /// Credits granted and not used by an assignment.
    pub free_credits: u32,
    /// Events assigned to it and not delivered to its sink.
    pub building: Vec<EventRange>,
    /// Events it has fragments of and no assignment for.
    pub unassigned: Vec<EventRange>,
    /// Events it released and whose echo it has not heard, in release order.
    pub unacked: Vec<EventRange>,
    /// Events it released lately (a sink that does not commit: these are output).
    pub recent: Vec<EventRange>,
    /// A committing sink: events accepted (echoed) and in no part yet.
    pub accepted: Vec<EventRange>,
    /// A committing sink: events in parts the EVM committed, lately.
    pub committed: Vec<EventRange>,
    /// A committing sink: parts sent as Commit and not answered.
    pub parts: Vec<(u32, Vec<EventRange>)>,
    /// Its counters: events whose release was echoed, and the wrapping sum of their ids.
    pub built: u64,
    pub built_id_sum: u64,
    /// It had heard the old EVM's Stop: triggering was over.
    pub stopping: bool,
}

fn flags(stopping: bool, more: bool) -> u16 {
    (if stopping { STOPPING } else { 0 }) | if more { MORE } else { 0 }
}

fn read_flags(f: u16, what: &'static str) -> Result<(bool, bool)> {
    if f & !(STOPPING | MORE) != 0 {
        return Err(WireError::ReservedNonZero { what });
    }
    Ok((f & STOPPING != 0, f & MORE != 0))
}

impl RuResync {
    /// The message bodies' contents: one per [`MAX_RESYNC_RANGES`] ranges (at least one).
    pub fn split(&self) -> Vec<(RuResync, bool)> {
        let chunks: Vec<&[EventRange]> = if self.holds.is_empty() {
            vec![&[]]
        } else {
            self.holds.chunks(MAX_RESYNC_RANGES).collect()
        };
        let n = chunks.len();
        chunks
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                let part = RuResync {
                    holds: c.to_vec(),
                    ..self.clone()
                };
                (part, i + 1 < n)
            })
            .collect()
    }

    /// Joins the next message of the same RU's resync.
    pub fn absorb(&mut self, next: RuResync) {
        self.holds.extend(next.holds);
        self.known_until = self.known_until.max(next.known_until);
        self.stopping |= next.stopping;
    }

    pub(crate) fn encode_into(&self, more: bool, out: &mut Vec<u8>) {
        let n = self.holds.len().min(MAX_RESYNC_RANGES);
        out.extend_from_slice(&self.ru.to_le_bytes());
        out.extend_from_slice(&flags(self.stopping, more).to_le_bytes());
        out.extend_from_slice(&(n as u32).to_le_bytes());
        out.extend_from_slice(&self.known_until.to_le_bytes());
        for r in &self.holds[..n] {
            encode_range(r, out);
        }
    }

    pub(crate) fn decode(b: &[u8]) -> Result<(RuResync, bool)> {
        let what = "resync ru";
        if b.len() < 16 {
            return Err(WireError::Truncated {
                what,
                need: 16,
                have: b.len(),
            });
        }
        let (stopping, more) = read_flags(u16_at(b, 2), what)?;
        let n = u32_at(b, 4) as usize;
        if n > MAX_RESYNC_RANGES {
            return Err(WireError::OutOfRange {
                what: "resync ru range count",
                value: n as u64,
            });
        }
        if b.len() != 16 + 16 * n {
            return Err(WireError::BadLength {
                what,
                expected: 16 + 16 * n,
                got: b.len(),
            });
        }
        let known_until = u64_at(b, 8);
        let mut holds = Vec::with_capacity(n);
        for k in 0..n {
            let r = decode_range(&b[16 + 16 * k..], what, "resync ru count")?;
            if r.end() > known_until {
                return Err(WireError::OutOfRange {
                    what: "resync ru range past known_until",
                    value: r.end(),
                });
            }
            holds.push(r);
        }
        let r = RuResync {
            ru: u16_at(b, 0),
            known_until,
            holds,
            stopping,
        };
        Ok((r, more))
    }
}

/// The fixed part of a ResyncBu body: bu, flags, free credits, built, id sum, and the
/// counts of its six lists and of its parts.
const BU_FIXED: usize = 24 + 7 * 4;

impl BuResync {
    fn lists(&self) -> [&Vec<EventRange>; 6] {
        [
            &self.building,
            &self.unassigned,
            &self.unacked,
            &self.recent,
            &self.accepted,
            &self.committed,
        ]
    }

    fn lists_mut(&mut self) -> [&mut Vec<EventRange>; 6] {
        [
            &mut self.building,
            &mut self.unassigned,
            &mut self.unacked,
            &mut self.recent,
            &mut self.accepted,
            &mut self.committed,
        ]
    }

    /// The message bodies' contents: at most [`MAX_RESYNC_RANGES`] ranges each (at least
    /// one message; a part's ranges may be spread over several).
    pub fn split(&self) -> Vec<(BuResync, bool)> {
        let empty = BuResync {
            building: Vec::new(),
            unassigned: Vec::new(),
            unacked: Vec::new(),
            recent: Vec::new(),
            accepted: Vec::new(),
            committed: Vec::new(),
            parts: Vec::new(),
            ..self.clone()
        };
        let mut out = vec![empty.clone()];
        let mut room = MAX_RESYNC_RANGES;
        for (i, list) in self.lists().into_iter().enumerate() {
            for r in list {
                if room == 0 {
                    out.push(empty.clone());
                    room = MAX_RESYNC_RANGES;
                }
                if let Some(m) = out.last_mut() {
                    m.lists_mut()[i].push(*r);
                }
                room -= 1;
            }
        }
        for (part, ranges) in &self.parts {
            for r in ranges {
                if room == 0 {
                    out.push(empty.clone());
                    room = MAX_RESYNC_RANGES;
                }
                if let Some(m) = out.last_mut() {
                    match m.parts.last_mut() {
                        Some((p, rs)) if p == part => rs.push(*r),
                        _ => m.parts.push((*part, vec![*r])),
                    }
                }
                room -= 1;
            }
        }
        let n = out.len();
        out.into_iter()
            .enumerate()
            .map(|(i, m)| (m, i + 1 < n))
            .collect()
    }

    /// Joins the next message of the same BU's resync.
    pub fn absorb(&mut self, next: BuResync) {
        let mut next = next;
        for (mine, theirs) in self.lists_mut().into_iter().zip(next.lists_mut()) {
            mine.append(theirs);
        }
        for (part, ranges) in next.parts {
            match self.parts.iter_mut().find(|(p, _)| *p == part) {
                Some((_, rs)) => rs.extend(ranges),
                None => self.parts.push((part, ranges)),
            }
        }
        self.stopping |= next.stopping;
    }

    pub(crate) fn encode_into(&self, more: bool, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.bu.to_le_bytes());
        out.extend_from_slice(&flags(self.stopping, more).to_le_bytes());
        out.extend_from_slice(&self.free_credits.to_le_bytes());
        out.extend_from_slice(&self.built.to_le_bytes());
        out.extend_from_slice(&self.built_id_sum.to_le_bytes());
        // past the limit, the rest is left out (`split` never makes such a message)
        let mut room = MAX_RESYNC_RANGES;
        let mut take = |n: usize| {
            let t = n.min(room);
            room -= t;
            t
        };
        let counts: Vec<usize> = self.lists().iter().map(|l| take(l.len())).collect();
        let parts: Vec<usize> = self.parts.iter().map(|(_, r)| take(r.len())).collect();
        for c in &counts {
            out.extend_from_slice(&(*c as u32).to_le_bytes());
        }
        out.extend_from_slice(&(self.parts.len() as u32).to_le_bytes());
        for (list, &c) in self.lists().iter().zip(&counts) {
            for r in &list[..c] {
                encode_range(r, out);
            }
        }
        for ((part, ranges), &c) in self.parts.iter().zip(&parts) {
            out.extend_from_slice(&part.to_le_bytes());
            out.extend_from_slice(&(c as u32).to_le_bytes());
            for r in &ranges[..c] {
                encode_range(r, out);
            }
        }
    }

    pub(crate) fn decode(b: &[u8]) -> Result<(BuResync, bool)> {
        let what = "resync bu";
        let truncated = |need: usize| WireError::Truncated {
            what,
            need,
            have: b.len(),
        };
        if b.len() < BU_FIXED {
            return Err(truncated(BU_FIXED));
        }
        let bu = u16_at(b, 0);
        let (stopping, more) = read_flags(u16_at(b, 2), what)?;
        let mut r = BuResync {
            bu,
            free_credits: u32_at(b, 4),
            built: u64_at(b, 8),
            built_id_sum: u64_at(b, 16),
            stopping,
            ..BuResync::default()
        };
        let counts: Vec<usize> = (0..6).map(|i| u32_at(b, 24 + 4 * i) as usize).collect();
        let n_parts = u32_at(b, 48) as usize;
        let too_many = |n: usize| WireError::OutOfRange {
            what: "resync bu range count",
            value: n as u64,
        };
        let listed: usize = counts.iter().sum();
        if listed > MAX_RESYNC_RANGES || n_parts > MAX_RESYNC_RANGES {
            return Err(too_many(listed.max(n_parts)));
        }
        let range_at = |at: usize| -> Result<EventRange> {
            if b.len() < at + 16 {
                return Err(truncated(at + 16));
            }
            let r = decode_range(&b[at..], what, "resync bu count")?;
            if r.bu != bu {
                return Err(WireError::OutOfRange {
                    what: "resync bu range of another BU",
                    value: r.bu as u64,
                });
            }
            Ok(r)
        };
        let mut at = BU_FIXED;
        for (list, &c) in r.lists_mut().into_iter().zip(&counts) {
            for _ in 0..c {
                list.push(range_at(at)?);
                at += 16;
            }
        }
        let mut total = listed;
        for _ in 0..n_parts {
            if b.len() < at + 8 {
                return Err(truncated(at + 8));
            }
            let (part, n) = (u32_at(b, at), u32_at(b, at + 4) as usize);
            at += 8;
            total += n;
            if total > MAX_RESYNC_RANGES {
                return Err(too_many(total));
            }
            let mut ranges = Vec::with_capacity(n);
            for _ in 0..n {
                ranges.push(range_at(at)?);
                at += 16;
            }
            r.parts.push((part, ranges));
        }
        if at != b.len() {
            return Err(WireError::BadLength {
                what,
                expected: at,
                got: b.len(),
            });
        }
        Ok((r, more))
    }
}

/// What the active EVM tells its standby, at every heartbeat and before it acts on a drop:
/// enough for the standby to take over (docs/standby.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Follow {
    /// Time the run has been triggering (pauses left out), in milliseconds.
    pub elapsed_ms: u64,
    /// The operator asked the run to stop.
    pub stop_requested: bool,
    /// The run is over (halted or aborted): nothing to take over.
    pub over: bool,
    /// The operator paused the run (no event is triggered until resumed): a standby that
    /// takes it over keeps it paused.
    pub paused: bool,
    /// The active EVM's epoch in the run (0: it started the run; each takeover adds 1): a
    /// standby that takes over is the next one, and fences this EVM with it.
    pub epoch: u16,
    /// Nodes the EVM dropped from the run and that are not back: never heard again.
    pub dropped: Vec<(crate::Role, u16)>,
    /// The most events the run will trigger, as the EVM knows it now (run.events, or what
    /// the RUs' recordings hold); [`crate::UNLIMITED`] for none.
    pub max_events: u64,
    /// Decisions from outside: every record (decision) below this id is final, so the
    /// standby needs no copy of its window any more (the rest it is sent in Window
    /// messages); 0 in other runs.
    pub decisions_final: u64,
    /// When the run's output began, as Unix time in milliseconds (the first EVM's start,
    /// handed down through every takeover): a standby started mid-run counts the run's files
    /// from it, not from its own start. 0: not known.
    pub since_ms: u64,
}

/// Follow's fixed part, before its dropped nodes.
const FOLLOW_FIXED: usize = 40;

const FOLLOW_STOP: u32 = 1;
const FOLLOW_OVER: u32 = 2;
const FOLLOW_PAUSED: u32 = 4;

impl Follow {
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        let n = self.dropped.len().min(u16::MAX as usize);
        out.extend_from_slice(&self.elapsed_ms.to_le_bytes());
        let flags = (if self.stop_requested { FOLLOW_STOP } else { 0 })
            | if self.over { FOLLOW_OVER } else { 0 }
            | if self.paused { FOLLOW_PAUSED } else { 0 };
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&(n as u16).to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.max_events.to_le_bytes());
        out.extend_from_slice(&self.decisions_final.to_le_bytes());
        out.extend_from_slice(&self.since_ms.to_le_bytes());
        for (role, index) in &self.dropped[..n] {
            out.extend_from_slice(&(*role as u16).to_le_bytes());
            out.extend_from_slice(&index.to_le_bytes());
        }
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Follow> {
        let what = "follow";
        if b.len() < FOLLOW_FIXED {
            return Err(WireError::Truncated {
                what,
                need: FOLLOW_FIXED,
                have: b.len(),
            });
        }
        let flags = u32_at(b, 8);
        if flags & !(FOLLOW_STOP | FOLLOW_OVER | FOLLOW_PAUSED) != 0 {
            return Err(WireError::ReservedNonZero { what });
        }
        let n = u16_at(b, 12) as usize;
        if b.len() != FOLLOW_FIXED + 4 * n {
            return Err(WireError::BadLength {
                what,
                expected: FOLLOW_FIXED + 4 * n,
                got: b.len(),
            });
        }
        let mut dropped = Vec::with_capacity(n);
        for k in 0..n {
            let at = FOLLOW_FIXED + 4 * k;
            let role = match u16_at(b, at) {
                1 => crate::Role::Ru,
                2 => crate::Role::Bu,
                v => {
                    return Err(WireError::OutOfRange {
                        what: "follow dropped node role",
                        value: v as u64,
                    })
                }
            };
            dropped.push((role, u16_at(b, at + 2)));
        }
        Ok(Follow {
            elapsed_ms: u64_at(b, 0),
            stop_requested: flags & FOLLOW_STOP != 0,
            over: flags & FOLLOW_OVER != 0,
            paused: flags & FOLLOW_PAUSED != 0,
            epoch: u16_at(b, 14),
            dropped,
            max_events: u64_at(b, 16),
            decisions_final: u64_at(b, 24),
            since_ms: u64_at(b, 32),
        })
    }
}

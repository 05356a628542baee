//! Super-fragment assembly: an RU fed by k front-end streams takes the k-th fragment of every
//! stream for its k-th event, checks them (the `on_error` policy for bad ones, trigger
//! numbers moving forward, every stream agreeing with the first: CMS's "sync loss"), and
//! makes one payload: the fragment itself for one stream, a super-fragment
//! ([`evb_wire::super_fragment`]) for several. No IO: the driver pushes what it read.
//!
//! One idea, one file: assembling one event from k streams, with its checks.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use evb_buffers::Chain;
use smallvec::SmallVec;

use evb_wire::super_fragment::{
    directory_len, encode_directory, SuperEntry, ENTRY_MISSING, ENTRY_SYNC_LOSS,
};
use evb_wire::{FLAG_MISSING, FLAG_SUPER, FLAG_SYNC_LOSS};

/// What to do with a fragment that fails its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadFragment {
    /// Stop the run, naming the stream and the reason.
    Stop,
    /// Count it and leave it out: its event is built with that source flagged MISSING.
    Drop,
}

/// What to do when a stream's trigger number differs from the first stream's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncLoss {
    /// Stop the run, naming the source and both numbers.
    Stop,
    /// Build the event with that stream's entry (and the fragment) flagged.
    Flag,
}

/// What a piece's bytes are held in: [`Bytes`] cut from a stream (a share of the buffer it
/// was read into), a `Vec`, or a [`Chain`] of pool blocks that a plug-in producer wrote in
/// place (assembled without a copy).
pub trait Body {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Body for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

impl Body for Bytes {
    fn len(&self) -> usize {
        Bytes::len(self)
    }
}

impl Body for Chain {
    fn len(&self) -> usize {
        Chain::len(self)
    }
}

/// One fragment as a stream (or a producer) delivered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece<B = Vec<u8>> {
    pub trigger_number: u32,
    pub bytes: B,
    /// Byte offset in its stream (for messages).
    pub offset: u64,
    /// Why it failed its checks, if it did.
    pub bad: Option<String>,
}

/// One event's payload from this RU's streams, ready to become its fragment.
#[derive(Debug, Clone, Default)]
pub struct Assembled {
    pub trigger_number: u32,
    /// Stream fragments it holds (one per stream, left-out ones included).
    pub fragments: u32,
    /// One stream's piece as it came (no copy), or a super-fragment made of several.
    pub payload: Bytes,
    /// Fragment header flags: MISSING, SUPER, SYNC_LOSS.
    pub flags: u16,
    /// The whole fragment (headers and payload) already in the RU's pool, as a plug-in
    /// producer wrote it: sent as it is, never copied (`payload` is then empty).
    pub written: Option<Chain>,
}

impl PartialEq for Assembled {
    fn eq(&self, o: &Assembled) -> bool {
        let bytes = |a: &Assembled| a.written.as_ref().map(Chain::to_vec);
        (
            self.trigger_number,
            self.fragments,
            &self.payload,
            self.flags,
        ) == (o.trigger_number, o.fragments, &o.payload, o.flags)
            && bytes(self) == bytes(o)
    }
}
impl Eq for Assembled {}

/// One stream's identity (for the super-fragment directory and for messages).
#[derive(Debug, Clone)]
pub struct StreamName {
    pub source_id: u16,
    /// Where it comes from, e.g. `127.0.0.1:7301`; empty for a plug-in producer.
    pub addr: String,
}

#[derive(Debug, Clone)]
pub struct AssemblyConfig {
    pub streams: Vec<StreamName>,
    pub on_error: BadFragment,
    pub on_sync_loss: SyncLoss,
    /// Trigger numbers wrap at this mask (0xff_ffff: the FED LV1 id's 24 bits).
    pub trigger_mask: u32,
    /// What the trigger number is called in messages ("LV1 id" for FED).
    pub trigger_name: &'static str,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AssemblyStats {
    /// Fragments pushed, all streams.
    pub received: u64,
    /// Bad fragments left out under `Drop`.
    pub dropped: u64,
    /// Events built with a stream flagged for sync loss (under `Flag`).
    pub sync_losses: u64,
}

struct Stream<B> {
    name: StreamName,
    queue: VecDeque<Piece<B>>,
    /// The stream ended after this many fragments.
    closed_after: Option<u64>,
    received: u64,
}

/// Streams an event's parts hold without a heap allocation: an RU reads one or two streams
/// in most set-ups, and three allocations per event were a tenth of a stream-fed RU's loop.
const INLINE_STREAMS: usize = 2;

/// One event's checked pieces, before they become one payload: the directory entries and
/// each stream's piece (`None`: left out).
pub struct Parts<B> {
    pub trigger_number: u32,
    pub entries: SmallVec<[SuperEntry; INLINE_STREAMS]>,
    pub pieces: SmallVec<[Option<B>; INLINE_STREAMS]>,
    /// Fragment header flags: MISSING (one stream, left out), SUPER, SYNC_LOSS.
    pub flags: u16,
}

/// One stream's event: its trigger number, its piece (`None`: left out) and the fragment
/// flags.
struct Single<B> {
    trigger_number: u32,
    piece: Option<B>,
    flags: u16,
}

/// Sync losses flagged and not yet in a warning: the first is logged at once, the next at
/// most every [`SYNC_WARN_EVERY`], with their count.
#[derive(Default)]
struct SyncWarnings {
    last: Option<Instant>,
    unreported: u64,
    latest: String,
}

/// Least time between two warnings about flagged sync losses.
pub const SYNC_WARN_EVERY: Duration = Duration::from_secs(5);

pub struct Assembler<B = Vec<u8>> {
    cfg: AssemblyConfig,
    streams: Vec<Stream<B>>,
    assembled: u64,
    /// The previous event's trigger number, if its streams agreed (the order check).
    last: Option<u32>,
    stats: AssemblyStats,
    sync_warnings: SyncWarnings,
    /// Bad fragments dropped (`on_error = "drop"`) not yet in a warning: the same rhythm as
    /// the sync losses' (one line per few seconds with a count, not one per fragment).
    drop_warnings: SyncWarnings,
}

impl<B: Body> Assembler<B> {
    pub fn new(cfg: AssemblyConfig) -> Assembler<B> {
        let streams = cfg
            .streams
            .iter()
            .map(|name| Stream {
                name: name.clone(),
                queue: VecDeque::new(),
                closed_after: None,
                received: 0,
            })
            .collect();
        Assembler {
            cfg,
            streams,
            assembled: 0,
            last: None,
            stats: AssemblyStats::default(),
            sync_warnings: SyncWarnings::default(),
            drop_warnings: SyncWarnings::default(),
        }
    }

    /// Fragments `stream` delivered so far (pushed), built or not.
    pub fn received(&self, stream: usize) -> u64 {
        self.streams[stream].received
    }

    /// Logs the flagged sync losses and dropped fragments not yet in a warning (at the end
    /// of a run: none goes unsaid).
    pub fn flush_sync_warnings(&mut self, now: Instant) {
        self.flush_drop_warnings(now);
        let w = &mut self.sync_warnings;
        if w.unreported == 0 {
            return;
        }
        let all = self.stats.sync_losses;
        if w.last.is_none() {
            tracing::warn!(
                "{}: event built with that stream flagged (on_sync_loss = \"flag\")",
                w.latest
            );
        } else {
            tracing::warn!(
                "sync loss: {} more events flagged since the last warning ({all} in all, \
                 on_sync_loss = \"flag\"); the latest: {}",
                w.unreported,
                w.latest
            );
        }
        w.unreported = 0;
        w.last = Some(now);
    }

    /// A flagged sync loss: warned at once if none was for [`SYNC_WARN_EVERY`].
    fn note_sync_loss(&mut self, what: String, now: Instant) {
        let w = &mut self.sync_warnings;
        w.unreported += 1;
        w.latest = what;
        if w.last
            .is_none_or(|t| now.saturating_duration_since(t) >= SYNC_WARN_EVERY)
        {
            self.flush_sync_warnings(now);
        }
    }

    pub fn stats(&self) -> &AssemblyStats {
        &self.stats
    }

    /// Events assembled so far.
    pub fn assembled(&self) -> u64 {
        self.assembled
    }

    /// How a stream is named in messages: `stream 1 (source 843, 127.0.0.1:7302)`.
    pub fn describe(&self, stream: usize) -> String {
        let s = &self.streams[stream].name;
        if s.addr.is_empty() {
            // a plug-in producer: nothing to name but its place and source
            return format!("producer {stream} (source {})", s.source_id);
        }
        format!("stream {stream} (source {}, {})", s.source_id, s.addr)
    }

    pub fn push(&mut self, stream: usize, piece: Piece<B>) {
        let s = &mut self.streams[stream];
        s.received += 1;
        s.queue.push_back(piece);
        self.stats.received += 1;
    }

    /// The stream ended: no fragment will follow the ones pushed.
    pub fn close(&mut self, stream: usize) {
        let s = &mut self.streams[stream];
        s.closed_after.get_or_insert(s.received);
    }

    /// Fragments of `stream` waiting for the other streams' fragments of their events.
    pub fn queued(&self, stream: usize) -> usize {
        self.streams[stream].queue.len()
    }

    /// A stream ended and everything it sent is assembled: no event can be completed again.
    pub fn exhausted(&self) -> bool {
        self.streams
            .iter()
            .any(|s| s.closed_after.is_some() && s.queue.is_empty())
    }

    /// Fragments received and waiting for other streams' (once [`Assembler::exhausted`]:
    /// they will never be part of an event, their streams sent more than the shortest one).
    pub fn unbuilt(&self) -> u64 {
        self.streams.iter().map(|s| s.queue.len() as u64).sum()
    }

    /// The next event's checked pieces, `Ok(None)` while a stream's fragment is still to
    /// come; `Err` names why the run must stop (a bad fragment under `Stop`, a sync loss
    /// under `Stop`).
    pub fn next_parts(&mut self, now: Instant) -> Result<Option<Parts<B>>, String> {
        if self.streams.len() == 1 {
            let Some(one) = self.next_single(now)? else {
                return Ok(None);
            };
            let entry = SuperEntry {
                source_id: self.streams[0].name.source_id,
                flags: if one.piece.is_none() {
                    ENTRY_MISSING
                } else {
                    0
                },
                trigger_number: one.trigger_number,
                length: one.piece.as_ref().map_or(0, |b| b.len() as u32),
            };
            return Ok(Some(Parts {
                trigger_number: one.trigger_number,
                entries: smallvec::smallvec![entry],
                pieces: smallvec::smallvec![one.piece],
                flags: one.flags,
            }));
        }
        self.next_parts_of_many(now)
    }

    /// What [`Assembler::next_parts`] is for one stream, without the vectors of pieces and
    /// entries (moving them was a tenth of a stream-fed RU's loop).
    fn next_single(&mut self, now: Instant) -> Result<Option<Single<B>>, String> {
        let Some(mut p) = self.streams[0].queue.pop_front() else {
            return Ok(None);
        };
        self.assembled += 1;
        if let Some(why) = p.bad.take() {
            let why = format!("{}: {why}", self.describe(0));
            self.bad(&why, now)?;
            // left out: no reference for the next event's order
            self.last = None;
            return Ok(Some(Single {
                trigger_number: p.trigger_number,
                piece: None,
                flags: FLAG_MISSING,
            }));
        }
        self.check_order(0, p.trigger_number, p.offset, now)?;
        self.last = Some(p.trigger_number);
        Ok(Some(Single {
            trigger_number: p.trigger_number,
            piece: Some(p.bytes),
            flags: 0,
        }))
    }

    /// Counts (or stops the run on) an event whose trigger number, `trigger` from stream
    /// `stream`'s fragment at byte `offset`, does not move forward from the last event's.
    fn check_order(
        &mut self,
        stream: usize,
        trigger: u32,
        offset: u64,
        now: Instant,
    ) -> Result<(), String> {
        let Some(last) = self.last else {
            return Ok(());
        };
        let step = trigger.wrapping_sub(last) & self.cfg.trigger_mask;
        if step == 0 || step > self.cfg.trigger_mask / 2 {
            let why = format!(
                "{}: fragment at byte {offset}: {} {trigger} after {last}: out of order",
                self.describe(stream),
                self.cfg.trigger_name
            );
            self.bad(&why, now)?;
        }
        Ok(())
    }

    /// [`Assembler::next_parts`] for any number of streams.
    fn next_parts_of_many(&mut self, now: Instant) -> Result<Option<Parts<B>>, String> {
        if self.streams.iter().any(|s| s.queue.is_empty()) {
            return Ok(None);
        }
        let event = self.assembled;
        let mut pieces: SmallVec<[Piece<B>; INLINE_STREAMS]> = self
            .streams
            .iter_mut()
            .map(|s| s.queue.pop_front().expect("checked non-empty"))
            .collect();
        self.assembled += 1;
        let name = self.cfg.trigger_name;
        for (i, p) in pieces.iter_mut().enumerate() {
            if let Some(why) = p.bad.take() {
                let why = format!("{}: {why}", self.describe(i));
                self.bad(&why, now)?;
                p.bad = Some(why);
            }
        }
        // The first good stream sets the event's trigger number; it must move forward.
        let reference = pieces.iter().position(|p| p.bad.is_none());
        let trigger = match reference {
            Some(r) => pieces[r].trigger_number,
            // every fragment is bad: the number the first one's header gives, for the record
            None => pieces[0].trigger_number,
        };
        if let Some(r) = reference {
            self.check_order(r, trigger, pieces[r].offset, now)?;
        }
        let mut in_sync = true;
        let mut first_loss = None;
        let mut entries = SmallVec::with_capacity(pieces.len());
        for (i, p) in pieces.iter().enumerate() {
            let mut flags = 0;
            if p.bad.is_some() {
                flags |= ENTRY_MISSING;
            } else if p.trigger_number != trigger {
                let r = reference.expect("a good piece implies a reference");
                let why = || {
                    format!(
                        "sync loss at event {event}: {} sent {name} {} where {} sent \
                         {name} {trigger}",
                        self.describe(i),
                        p.trigger_number,
                        self.describe(r),
                    )
                };
                match self.cfg.on_sync_loss {
                    SyncLoss::Stop => return Err(why()),
                    SyncLoss::Flag => {
                        in_sync = false;
                        flags |= ENTRY_SYNC_LOSS;
                        first_loss.get_or_insert_with(why);
                    }
                }
            }
            entries.push(SuperEntry {
                source_id: self.streams[i].name.source_id,
                flags,
                trigger_number: p.trigger_number,
                length: if p.bad.is_some() {
                    0
                } else {
                    p.bytes.len() as u32
                },
            });
        }
        if !in_sync {
            self.stats.sync_losses += 1;
        }
        if let Some(what) = first_loss {
            self.note_sync_loss(what, now);
        }
        self.last = (reference.is_some() && in_sync).then_some(trigger);
        let k = pieces.len();
        let mut flags = 0;
        if k > 1 {
            flags |= FLAG_SUPER;
            if !in_sync {
                flags |= FLAG_SYNC_LOSS;
            }
        } else if pieces[0].bad.is_some() {
            flags |= FLAG_MISSING;
        }
        Ok(Some(Parts {
            trigger_number: trigger,
            entries,
            pieces: pieces
                .into_iter()
                .map(|p| p.bad.is_none().then_some(p.bytes))
                .collect(),
            flags,
        }))
    }

    fn bad(&mut self, why: &str, now: Instant) -> Result<(), String> {
        match self.cfg.on_error {
            BadFragment::Stop => Err(why.to_string()),
            BadFragment::Drop => {
                self.stats.dropped += 1;
                let w = &mut self.drop_warnings;
                w.unreported += 1;
                w.latest = why.to_string();
                if w.last
                    .is_none_or(|t| now.saturating_duration_since(t) >= SYNC_WARN_EVERY)
                {
                    self.flush_drop_warnings(now);
                }
                Ok(())
            }
        }
    }

    /// Logs the dropped fragments not yet in a warning.
    fn flush_drop_warnings(&mut self, now: Instant) {
        let w = &mut self.drop_warnings;
        if w.unreported == 0 {
            return;
        }
        if w.last.is_none() && w.unreported == 1 {
            tracing::warn!("{}: dropped, its event will be partial", w.latest);
        } else {
            tracing::warn!(
                "{} more bad fragments dropped since the last warning ({} in all; their events \
                 are partial); the latest: {}",
                w.unreported,
                self.stats.dropped,
                w.latest
            );
        }
        w.unreported = 0;
        w.last = Some(now);
    }
}

impl<B: Body + AsRef<[u8]> + Into<Bytes>> Assembler<B> {
    /// The next event's payload (the fragment itself for one stream, a super-fragment for
    /// several), as [`Assembler::next_parts`] says.
    pub fn next_event(&mut self, now: Instant) -> Result<Option<Assembled>, String> {
        if self.streams.len() == 1 {
            let Some(one) = self.next_single(now)? else {
                return Ok(None);
            };
            return Ok(Some(Assembled {
                trigger_number: one.trigger_number,
                fragments: 1,
                payload: one.piece.map_or_else(Bytes::new, Into::into),
                flags: one.flags,
                written: None,
            }));
        }
        let Some(parts) = self.next_parts(now)? else {
            return Ok(None);
        };
        let fragments = parts.pieces.len() as u32;
        let payload = if parts.pieces.len() == 1 {
            parts
                .pieces
                .into_iter()
                .next()
                .flatten()
                .map_or_else(Bytes::new, Into::into)
        } else {
            let size: usize = parts.entries.iter().map(|e| e.length as usize).sum();
            let mut payload = Vec::with_capacity(directory_len(parts.entries.len()) + size);
            encode_directory(&parts.entries, &mut payload);
            for p in parts.pieces.iter().flatten() {
                payload.extend_from_slice(p.as_ref());
            }
            payload.into()
        };
        Ok(Some(Assembled {
            trigger_number: parts.trigger_number,
            fragments,
            payload,
            flags: parts.flags,
            written: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evb_wire::super_fragment::decode_directory;

    fn assembler(k: usize, on_error: BadFragment, on_sync_loss: SyncLoss) -> Assembler {
        Assembler::new(AssemblyConfig {
            streams: (0..k)
                .map(|i| StreamName {
                    source_id: 841 + 2 * i as u16,
                    addr: format!("127.0.0.1:{}", 7301 + i),
                })
                .collect(),
            on_error,
            on_sync_loss,
            trigger_mask: 0xff_ffff,
            trigger_name: "LV1 id",
        })
    }

    fn piece(trigger: u32, len: usize) -> Piece {
        Piece {
            trigger_number: trigger,
            bytes: vec![trigger as u8; len],
            offset: 0,
            bad: None,
        }
    }

    #[test]
    fn one_stream_passes_its_fragments_through() {
        let mut a = assembler(1, BadFragment::Stop, SyncLoss::Stop);
        assert_eq!(a.next_event(Instant::now()), Ok(None));
        a.push(0, piece(1, 16));
        a.push(0, piece(2, 24));
        let e = a.next_event(Instant::now()).unwrap().unwrap();
        assert_eq!((e.trigger_number, e.payload.len(), e.flags), (1, 16, 0));
        assert_eq!(
            a.next_event(Instant::now())
                .unwrap()
                .unwrap()
                .trigger_number,
            2
        );
        assert_eq!(a.next_event(Instant::now()), Ok(None));
    }

    #[test]
    fn two_streams_make_a_super_fragment_once_both_arrived() {
        let mut a = assembler(2, BadFragment::Stop, SyncLoss::Stop);
        a.push(0, piece(1, 16));
        assert_eq!(
            a.next_event(Instant::now()),
            Ok(None),
            "stream 1 has not sent event 0 yet"
        );
        a.push(1, piece(1, 40));
        let e = a.next_event(Instant::now()).unwrap().unwrap();
        assert_eq!(e.flags, FLAG_SUPER);
        let dir = decode_directory(&e.payload, e.payload.len()).unwrap();
        assert_eq!(dir.len(), 2);
        assert_eq!((dir[0].source_id, dir[0].length), (841, 16));
        assert_eq!((dir[1].source_id, dir[1].length), (843, 40));
        assert_eq!(e.payload.len(), 8 + 32 + 56);
    }

    #[test]
    fn sync_loss_stops_naming_the_source_and_both_numbers() {
        let mut a = assembler(2, BadFragment::Stop, SyncLoss::Stop);
        a.push(0, piece(100, 8));
        a.push(1, piece(999, 8));
        let e = a.next_event(Instant::now()).unwrap_err();
        assert!(e.contains("source 843"), "{e}");
        assert!(e.contains("LV1 id 999") && e.contains("LV1 id 100"), "{e}");
    }

    #[test]
    fn sync_loss_flagged_builds_the_event_and_goes_on() {
        let mut a = assembler(2, BadFragment::Stop, SyncLoss::Flag);
        for (t0, t1) in [(1, 1), (2, 999), (3, 3)] {
            a.push(0, piece(t0, 8));
            a.push(1, piece(t1, 8));
        }
        assert_eq!(
            a.next_event(Instant::now()).unwrap().unwrap().flags,
            FLAG_SUPER
        );
        let e = a.next_event(Instant::now()).unwrap().unwrap();
        assert_eq!(e.flags, FLAG_SUPER | FLAG_SYNC_LOSS);
        let dir = decode_directory(&e.payload, e.payload.len()).unwrap();
        assert_eq!(dir[1].flags, ENTRY_SYNC_LOSS);
        assert_eq!(dir[1].trigger_number, 999);
        assert_eq!(
            a.next_event(Instant::now()).unwrap().unwrap().flags,
            FLAG_SUPER
        );
        assert_eq!(a.stats().sync_losses, 1);
    }

    #[test]
    fn bad_fragments_stop_or_are_left_out() {
        let mut bad = piece(2, 8);
        bad.bad = Some("CRC".into());
        let mut a = assembler(2, BadFragment::Stop, SyncLoss::Stop);
        a.push(0, piece(2, 8));
        a.push(1, bad.clone());
        assert!(a
            .next_event(Instant::now())
            .unwrap_err()
            .contains("stream 1 (source 843"));

        let mut a = assembler(2, BadFragment::Drop, SyncLoss::Stop);
        a.push(0, piece(2, 8));
        a.push(1, bad.clone());
        let e = a.next_event(Instant::now()).unwrap().unwrap();
        let dir = decode_directory(&e.payload, e.payload.len()).unwrap();
        assert_eq!((dir[1].flags, dir[1].length), (ENTRY_MISSING, 0));
        assert_eq!(a.stats().dropped, 1);

        let mut a = assembler(1, BadFragment::Drop, SyncLoss::Stop);
        a.push(0, bad);
        let e = a.next_event(Instant::now()).unwrap().unwrap();
        assert_eq!(
            (e.flags, e.payload.len(), e.trigger_number),
            (FLAG_MISSING, 0, 2)
        );
    }

    #[test]
    fn trigger_numbers_must_move_forward_and_may_wrap() {
        let mut a = assembler(1, BadFragment::Stop, SyncLoss::Stop);
        for t in [0xff_fffe, 0xff_ffff, 0, 1] {
            a.push(0, piece(t, 8));
            assert!(a.next_event(Instant::now()).unwrap().is_some(), "{t}");
        }
        a.push(0, piece(1, 8));
        let e = a.next_event(Instant::now()).unwrap_err();
        assert!(e.contains("LV1 id 1 after 1: out of order"), "{e}");
    }

    /// One stream's events taken the short way (`next_single`) and through the path that
    /// serves several streams (`next_parts_of_many`): the same events, flags, counts and
    /// errors, over random runs of good, bad, repeated, backward and wrapping fragments.
    #[test]
    fn one_stream_takes_the_short_way_to_the_same_events() {
        use rand::{Rng, SeedableRng};
        for seed in 0..200u64 {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            let on_error = if seed % 2 == 0 {
                BadFragment::Drop
            } else {
                BadFragment::Stop
            };
            let mut short = assembler(1, on_error, SyncLoss::Stop);
            let mut long = assembler(1, on_error, SyncLoss::Stop);
            let mut trigger: u32 = rng.gen_range(0xff_fff0..=0xff_ffff);
            for i in 0..40u64 {
                trigger = match rng.gen_range(0..10) {
                    0 => trigger,                 // repeated
                    1 => trigger.wrapping_sub(3), // backward
                    _ => trigger.wrapping_add(rng.gen_range(1..3)) & 0xff_ffff,
                };
                let mut p = piece(trigger, rng.gen_range(0..64));
                p.offset = i * 100;
                if rng.gen_range(0..8) == 0 {
                    p.bad = Some("CRC".into());
                }
                short.push(0, p.clone());
                long.push(0, p);
                let now = Instant::now();
                let a = short.next_event(now);
                let b = long.next_parts_of_many(now).map(|parts| {
                    parts.map(|parts| Assembled {
                        trigger_number: parts.trigger_number,
                        fragments: 1,
                        payload: parts
                            .pieces
                            .into_iter()
                            .next()
                            .flatten()
                            .map_or_else(Bytes::new, Into::into),
                        flags: parts.flags,
                        written: None,
                    })
                });
                assert_eq!(a, b, "seed {seed}, fragment {i}");
                assert_eq!(short.stats().dropped, long.stats().dropped, "seed {seed}");
                assert_eq!(short.last, long.last, "seed {seed}, fragment {i}");
                if a.is_err() {
                    break;
                }
            }
        }
    }

    #[test]
    fn a_closed_stream_ends_the_events() {
        let mut a = assembler(2, BadFragment::Stop, SyncLoss::Stop);
        a.push(0, piece(1, 8));
        a.push(0, piece(2, 8));
        a.push(1, piece(1, 8));
        a.close(1);
        assert!(!a.exhausted());
        assert!(a.next_event(Instant::now()).unwrap().is_some());
        assert!(a.exhausted());
        assert_eq!(a.unbuilt(), 1);
        assert_eq!((a.received(0), a.received(1)), (2, 1));
    }

    #[test]
    fn many_flagged_sync_losses_are_counted_and_the_warnings_flushed() {
        let mut a = assembler(2, BadFragment::Stop, SyncLoss::Flag);
        for t in 1..=50 {
            a.push(0, piece(t, 8));
            a.push(1, piece(t + 1, 8));
            assert!(a.next_event(Instant::now()).unwrap().is_some());
        }
        assert_eq!(a.stats().sync_losses, 50);
        // the first warned at once, the other 49 wait for the next warning (or the end)
        assert_eq!(a.sync_warnings.unreported, 49);
        assert!(a.sync_warnings.latest.contains("sync loss at event 49"));
        a.flush_sync_warnings(Instant::now());
        assert_eq!(a.sync_warnings.unreported, 0);
    }
}

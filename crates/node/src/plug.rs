//! Plug-in hooks: what a program in the node's process hands the driver so that its own code
//! feeds an RU (`source.kind = "api"`) or takes a BU's built events (`sink = "api"`). The
//! public API on top of these is the `evb-plugin` crate; this module is only the driver's
//! side: a channel of fragments already written into the RU's pool, and a sink.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use evb_buffers::{BlockWriter, Chain, Pool};
use evb_builder::assembly::{
    Assembled, Assembler, AssemblyConfig, BadFragment, Body, Parts, Piece, StreamName, SyncLoss,
};
use evb_builder::frames::Slicing;
use evb_builder::slice_buffer::{super_window, SliceBuffer, SliceBufferStats};
use evb_builder::{Ru, RunState, Sink};
use evb_config::{BuildBy, Config, NodeSpec, OnError, OnSyncLoss};
use evb_wire::super_fragment::{directory_len, encode_directory};
use evb_wire::{write_fragment_prefix, FragmentHeader, FLAG_MISSING, FRAGMENT_PREFIX_LEN};
use tracing::{error, info, warn};

/// What a producer sends the RU's driver, in submission order.
pub enum FeedItem {
    /// The next event's fragment (its k-th item is event k).
    Event(Assembled),
    /// One of several producers' part of the next event's super-fragment.
    Part(Part),
    /// The producer's input failed a check under `on_error = "stop"`: the run stops, why.
    Failed(String),
    /// A run built by time: the next frame of the producer's stream, its time frame header
    /// and payload (docs/protocol.md §10.1), as a front-end's stream carries it.
    Frame(bytes::Bytes),
    /// No more fragments: the run ends after the ones sent.
    End,
}

/// A producer's payload for one event, written in place in the RU's pool, when the RU has
/// several producers (`[[ru]] producer_sources`); the RU puts the header and directory in
/// front.
pub struct Part {
    pub trigger_number: u32,
    /// `None`: refused by the producer under `on_error = "drop"` (left out, flagged).
    pub payload: Option<Chain>,
    /// CRC32C of the payload.
    pub crc: u32,
}

/// A part as the assembler holds it.
pub(crate) struct Written {
    chain: Chain,
    crc: u32,
}

impl Body for Written {
    fn len(&self) -> usize {
        self.chain.len()
    }
}

/// The RU side of its producers: fragments in, one channel per producer (in the order of
/// `producer_sources`), and the RU's fragment pool out (sent once the driver has made it,
/// for the producers to write fragments into).
pub struct ApiFeed {
    pub inputs: Vec<Receiver<FeedItem>>,
    pub pool: Sender<Pool>,
}

/// What a program plugs into a node; the node's configuration must ask for each.
#[derive(Default)]
pub struct Plugs {
    /// For an RU with `source.kind = "api"`.
    pub feed: Option<ApiFeed>,
    /// For a BU with `sink = "api"`.
    pub sink: Option<Box<dyn Sink>>,
}

/// The driver's pump from the producers' channels into the RU's live feed.
pub(crate) struct ApiSource {
    node: String,
    inputs: Vec<Receiver<FeedItem>>,
    /// With several producers: their parts, checked and joined into super-fragments.
    joint: Option<Joint>,
    received: u64,
    dropped: u64,
    over: bool,
    started: Instant,
    /// Since when the producers have submitted nothing (while the run is on).
    idle_since: Instant,
    stall_warn: Duration,
    warned: bool,
    /// A run built by time: each producer's frames (one stream each), and which producers
    /// have finished.
    frames: Option<FrameInputs>,
    read_ahead: usize,
}

/// The producers' streams of frames in a run built by time: cut into slices here, a
/// latency buffer per producer (`slices`, empty under decision windows, which the RU cuts
/// from its feed's window buffer).
struct FrameInputs {
    slices: Vec<SliceBuffer>,
    ended: Vec<bool>,
}

/// Several producers of one RU: the assembler (trigger numbers agree, `on_sync_loss`), and
/// where the super-fragments' headers are written.
struct Joint {
    assembler: Assembler<Written>,
    ended: Vec<bool>,
    pool: Pool,
    source_id: u16,
    /// The block the next header goes into (headers share blocks).
    current: Option<BlockWriter>,
    /// Checked parts waiting for room for their header (back-pressure).
    waiting: Option<Box<Parts<Written>>>,
    next_event: u64,
}

impl ApiSource {
    pub(crate) fn new(
        cfg: &Config,
        me: &NodeSpec,
        inputs: Vec<Receiver<FeedItem>>,
        pool: Option<Pool>,
        now: Instant,
    ) -> ApiSource {
        let joint = match pool {
            Some(pool) if inputs.len() > 1 && !cfg.by_time() => Some(Joint {
                assembler: Assembler::new(AssemblyConfig {
                    streams: (0..inputs.len())
                        .map(|i| StreamName {
                            source_id: me.stream_sources.get(i).copied().unwrap_or(me.source_id),
                            addr: String::new(),
                        })
                        .collect(),
                    on_error: match cfg.source.on_error {
                        OnError::Stop => BadFragment::Stop,
                        OnError::Drop => BadFragment::Drop,
                    },
                    on_sync_loss: match cfg.source.on_sync_loss {
                        OnSyncLoss::Stop => SyncLoss::Stop,
                        OnSyncLoss::Flag => SyncLoss::Flag,
                    },
                    trigger_mask: u32::MAX,
                    trigger_name: "trigger number",
                }),
                ended: vec![false; inputs.len()],
                pool,
                source_id: me.source_id,
                current: None,
                waiting: None,
                next_event: 0,
            }),
            _ => None,
        };
        ApiSource {
            node: me.id.clone(),
            inputs,
            joint,
            received: 0,
            dropped: 0,
            over: false,
            started: now,
            idle_since: now,
            stall_warn: Duration::from_secs_f64(cfg.source.stall_warn_s),
            warned: false,
            frames: cfg.by_time().then(|| {
                let slicing = Slicing {
                    slice: cfg.builder.slice_ticks,
                    overlap: cfg.builder.overlap_ticks,
                    t0: cfg.frames.first_tick,
                };
                let sources = me.time_sources();
                let slices = match cfg.builder.by {
                    BuildBy::Time => sources
                        .iter()
                        .enumerate()
                        .map(|(i, &source_id)| {
                            let name = StreamName {
                                source_id,
                                addr: String::new(),
                            };
                            SliceBuffer::new(slicing, cfg.frames.ticks, name, i)
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                FrameInputs {
                    slices,
                    ended: vec![false; sources.len()],
                }
            }),
            read_ahead: cfg.source.read_ahead as usize,
        }
    }

    fn fail(&mut self, ru: &mut Ru, why: String) {
        self.over = true;
        error!(node = %self.node, "producer: {why}");
        ru.source_failed(format!("{}: producer: {why}", self.node));
    }

    /// Moves what the producers submitted into the live feed. No limit is needed here: every
    /// fragment sent holds blocks of the RU's pool, which is what bounds the producers.
    pub(crate) fn pump(&mut self, now: Instant, ru: &mut Ru) {
        // Not before the RU is connected: a failure must reach the EVM, naming its reason.
        if self.over || ru.state().is_over() || ru.state() == RunState::Configured {
            return;
        }
        let running = ru.state() == RunState::Running;
        let before = self.received;
        let taken = if self.frames.is_some() {
            self.take_frames(ru)
        } else if self.joint.is_some() {
            self.take_parts(now, ru)
        } else {
            self.take_events(ru)
        };
        if let Err(why) = taken {
            return self.fail(ru, why);
        }
        let Some(feed) = ru.live_mut() else { return };
        feed.stats.fragments_received = self.received;
        feed.stats.dropped = self.dropped;
        if let Some(j) = &self.joint {
            feed.stats.sync_losses = j.assembler.stats().sync_losses;
            feed.stats.unbuilt = j.assembler.unbuilt();
        }
        // a producer that stalls shows as the RU waiting for it (status, report, log)
        if self.received > before || !running || self.over {
            self.idle_since = now;
            self.warned = false;
            feed.stats.waiting_for.clear();
            return;
        }
        let waited = now.duration_since(self.idle_since);
        if waited >= self.stall_warn {
            let at = self.idle_since.duration_since(self.started).as_secs_f64();
            let who = match &self.joint {
                None => "producer".to_string(),
                Some(j) => {
                    let idle: Vec<String> = (0..self.inputs.len())
                        .filter(|&i| j.assembler.queued(i) == 0 && !j.ended[i])
                        .map(|i| j.assembler.describe(i))
                        .collect();
                    idle.join(", ")
                }
            };
            let line = format!(
                "{who} since {at:.1} s ({:.1} s): no fragment submitted after {}",
                waited.as_secs_f64(),
                self.received
            );
            if !self.warned {
                self.warned = true;
                warn!(node = %self.node, "waiting for {line}");
            }
            feed.stats.waiting_for = vec![line];
        }
    }

    /// One producer: its fragments are the RU's, headers written by the producer.
    fn take_events(&mut self, ru: &mut Ru) -> Result<(), String> {
        let Some(feed) = ru.live_mut() else {
            return Ok(());
        };
        loop {
            match self.inputs[0].try_recv() {
                Ok(FeedItem::Frame(_)) => return Err("a frame in a run built by event".into()),
                Ok(FeedItem::Event(a)) => {
                    self.received += 1;
                    if a.flags & FLAG_MISSING != 0 {
                        self.dropped += 1;
                    }
                    feed.supply(a);
                }
                Ok(FeedItem::Part(_)) => return Err("a part from the RU's only producer".into()),
                Ok(FeedItem::Failed(why)) => return Err(why),
                // a producer dropped without finishing ends its feed the same way
                Ok(FeedItem::End) | Err(TryRecvError::Disconnected) => {
                    self.over = true;
                    info!(node = %self.node, "producer finished after {} events", self.received);
                    feed.finish();
                    return Ok(());
                }
                Err(TryRecvError::Empty) => return Ok(()),
            }
        }
    }

    /// A run built by time: each producer's frames into its latency buffer (slices cut
    /// here once every producer's is whole, several producers' as one super-fragment of
    /// their window fragments), or into the feed's window buffer (decision windows).
    /// Within `source.read_ahead` slices waiting, the producers' bounded channels holding
    /// them back beyond it.
    fn take_frames(&mut self, ru: &mut Ru) -> Result<(), String> {
        let Some(feed) = ru.live_mut() else {
            return Ok(());
        };
        let f = self.frames.as_mut().expect("a run by time");
        for (i, input) in self.inputs.iter().enumerate() {
            while !f.ended[i] {
                let waiting = f
                    .slices
                    .get(i)
                    .is_some_and(|b| b.queued() >= self.read_ahead);
                if waiting || feed.queued() >= self.read_ahead {
                    break;
                }
                match input.try_recv() {
                    Ok(FeedItem::Frame(bytes)) => {
                        self.received += 1;
                        let piece = Piece {
                            trigger_number: 0,
                            bytes,
                            offset: self.received - 1,
                            bad: None,
                        };
                        let taken = match (f.slices.get_mut(i), feed.windows.as_mut()) {
                            (Some(b), _) => b.push(piece),
                            (None, Some(w)) => w.push(i, piece),
                            (None, None) => Err("no latency buffer for its frames".into()),
                        };
                        taken.map_err(|e| {
                            let who = if self.inputs.len() > 1 {
                                format!("producer {i}: ")
                            } else {
                                String::new()
                            };
                            format!("{who}frame {} (counted from 0): {e}", self.received - 1)
                        })?;
                    }
                    Ok(FeedItem::Event(_) | FeedItem::Part(_)) => {
                        return Err("a fragment in a run built by time (frames only)".into());
                    }
                    Ok(FeedItem::Failed(why)) => return Err(why),
                    // a producer dropped without finishing ends its stream the same way
                    Ok(FeedItem::End) | Err(TryRecvError::Disconnected) => {
                        f.ended[i] = true;
                        match f.slices.get_mut(i) {
                            // the last slices are cut with the frames there are
                            Some(b) => b.close(),
                            // decisions go on; windows past the stream's end are LATE
                            None => {
                                if let Some(w) = feed.windows.as_mut() {
                                    w.close(i);
                                }
                            }
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                }
            }
        }
        if !f.slices.is_empty() {
            while f.slices.iter().all(SliceBuffer::ready) {
                let parts = f
                    .slices
                    .iter_mut()
                    .filter_map(|b| Some((b.source_id(), b.next_slice()?)))
                    .collect::<Vec<_>>();
                if parts.is_empty() {
                    break;
                }
                feed.supply(super_window(parts));
            }
            feed.stats.slices = f
                .slices
                .iter()
                .map(SliceBuffer::stats)
                .reduce(SliceBufferStats::with);
        }
        if f.ended.iter().all(|&e| e) && !self.over {
            self.over = true;
            info!(node = %self.node, "producers finished after {} frames", self.received);
            if !f.slices.is_empty() {
                // what a producer still holds past the others' end belongs to no slice
                feed.stats.unbuilt = f.slices.iter().map(SliceBuffer::unbuilt).sum();
                feed.finish();
            }
        }
        Ok(())
    }

    /// Several producers: their k-th parts checked and joined into event k's super-fragment,
    /// its header and directory written into the RU's pool in front of them (no copy).
    fn take_parts(&mut self, now: Instant, ru: &mut Ru) -> Result<(), String> {
        let j = self.joint.as_mut().expect("several producers");
        for (i, input) in self.inputs.iter().enumerate() {
            while !j.ended[i] {
                match input.try_recv() {
                    Ok(FeedItem::Part(p)) => {
                        self.received += 1;
                        let bad = p
                            .payload
                            .is_none()
                            .then(|| "refused by its producer".into());
                        let offset = j.assembler.queued(i) as u64;
                        j.assembler.push(
                            i,
                            Piece {
                                trigger_number: p.trigger_number,
                                bytes: Written {
                                    chain: p.payload.unwrap_or_default(),
                                    crc: p.crc,
                                },
                                offset,
                                bad,
                            },
                        );
                    }
                    Ok(FeedItem::Event(_) | FeedItem::Frame(_)) => {
                        return Err(format!(
                            "producer {i}: a whole fragment where a part was due"
                        ))
                    }
                    Ok(FeedItem::Failed(why)) => return Err(format!("producer {i}: {why}")),
                    Ok(FeedItem::End) | Err(TryRecvError::Disconnected) => {
                        j.ended[i] = true;
                        j.assembler.close(i);
                    }
                    Err(TryRecvError::Empty) => break,
                }
            }
        }
        let Some(feed) = ru.live_mut() else {
            return Ok(());
        };
        loop {
            let parts = match j.waiting.take() {
                Some(p) => *p,
                None => match j.assembler.next_parts(now)? {
                    Some(p) => p,
                    None => break,
                },
            };
            match j.write(parts) {
                Ok(a) => feed.supply(a),
                Err(parts) => {
                    // no room for the header now: the pool is full (back-pressure)
                    j.waiting = Some(parts);
                    return Ok(());
                }
            }
        }
        self.dropped = j.assembler.stats().dropped;
        if j.assembler.exhausted() && !feed.is_done() {
            if j.assembler.unbuilt() > 0 {
                warn!(node = %self.node, "a producer finished: {} fragments of the other producers belong to no event and are not built", j.assembler.unbuilt());
            }
            info!(node = %self.node, "producers finished after {} events", feed.supplied());
            self.over = true;
            feed.finish();
        }
        Ok(())
    }
}

impl Joint {
    /// Event `next_event`'s fragment: header and directory in a pool block, then the parts
    /// in place. Gives the parts back when the pool has no room for the header.
    fn write(&mut self, parts: Parts<Written>) -> Result<Assembled, Box<Parts<Written>>> {
        let dir = directory_len(parts.entries.len());
        let need = FRAGMENT_PREFIX_LEN + dir;
        let mut w = match self.current.take() {
            Some(w) if w.remaining() >= need => w,
            _ => match self.pool.try_alloc() {
                Some(w) => w,
                None => return Err(Box::new(parts)),
            },
        };
        let mut directory = Vec::with_capacity(dir);
        encode_directory(&parts.entries, &mut directory);
        let mut crc = crc32c::crc32c(&directory);
        let mut size = directory.len();
        for p in parts.pieces.iter().flatten() {
            crc = crc32c::crc32c_combine(crc, p.crc, p.chain.len());
            size += p.chain.len();
        }
        let header = FragmentHeader {
            event_id: self.next_event,
            trigger_number: parts.trigger_number,
            source_id: self.source_id,
            flags: parts.flags,
            payload_size: size as u32,
            payload_crc: crc,
        };
        let start = w.filled();
        write_fragment_prefix(&header, w.spare_mut());
        w.spare_mut()[FRAGMENT_PREFIX_LEN..need].copy_from_slice(&directory);
        w.advance(need);
        let mut chain = Chain::from_slice(w.slice(start, need));
        for p in parts.pieces.iter().flatten() {
            for s in p.chain.slices() {
                chain.push(s.clone());
            }
        }
        if w.remaining() > FRAGMENT_PREFIX_LEN {
            self.current = Some(w);
        }
        self.next_event += 1;
        Ok(Assembled {
            trigger_number: parts.trigger_number,
            fragments: parts.pieces.len() as u32,
            payload: bytes::Bytes::new(),
            flags: parts.flags,
            written: Some(chain),
        })
    }
}

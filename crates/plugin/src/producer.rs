//! The producer: a readout program feeding one RU (`source.kind = "api"`) from its own
//! process. It takes a [`Buffer`] in the RU's fragment pool, writes the payload into it, and
//! submits it as the fragment of the next event; that block is what the RU sends to the BU,
//! headers written in front of the payload, never copied.
//!
//! Back-pressure: the pool is the only queue. Blocks come back when the EVM releases the
//! events holding them; until then [`Producer::buffer`] waits ([`WhenFull::Block`]) or says
//! [`Error::Full`] ([`WhenFull::ReturnFull`]). Nothing is ever dropped.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crossbeam_channel::{bounded, unbounded, RecvTimeoutError, Sender};
use evb_buffers::{BlockWriter, Chain, Pool};
use evb_builder::assembly::Assembled;
use evb_config::{Config, NodeSpec, OnError, Role, SourceKind};
use evb_node::plug::{ApiFeed, FeedItem, Part, Plugs};
use evb_node::NodeOutcome;
use evb_wire::window::{TimeFrameHeader, TIME_FRAME_HEADER_LEN};
use evb_wire::{write_fragment_prefix, FragmentHeader, FLAG_MISSING, FRAGMENT_PREFIX_LEN};

use crate::node_thread::NodeThread;
use crate::Error;

/// What [`Producer::buffer`] does when the RU's pool has no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Wait until the RU frees room (or the run ends).
    Block,
    /// Answer [`Error::Full`] at once.
    ReturnFull,
}

/// Room for one fragment in the RU's pool. Write the payload through [`Buffer::payload_mut`],
/// then give it to [`Producer::submit`], which consumes it: a buffer is submitted once.
/// Dropped unsubmitted, its room goes back to the pool.
pub struct Buffer {
    writer: BlockWriter,
    /// Where its headers go in the block; the payload follows them.
    start: usize,
    /// Room for headers in front of the payload (none for one of several producers of an
    /// RU: the RU writes one header in front of their super-fragment).
    prefix: usize,
    len: usize,
    capacity: usize,
    pool_id: u64,
}

impl Buffer {
    /// The payload bytes, `len()` long (initially the size asked for).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (prefix, len) = (self.prefix, self.len);
        &mut self.writer.spare_mut()[prefix..prefix + len]
    }

    /// The payload written so far (read back).
    pub fn payload(&mut self) -> &[u8] {
        self.payload_mut()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most payload this buffer can hold (the size asked for).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Makes the fragment `len` bytes long (a readout that learns its size while writing).
    pub fn set_len(&mut self, len: usize) -> Result<(), Error> {
        if len > self.capacity {
            return Err(Error::Size {
                size: len,
                why: format!("larger than this buffer's {} bytes", self.capacity),
            });
        }
        self.len = len;
        Ok(())
    }
}

/// A readout program's handle on its RU. One producer per RU; its k-th submitted fragment
/// is the RU's fragment of event k.
pub struct Producer {
    /// Shared by the producers of one RU ([`Producer::start_many`]).
    node: Arc<Mutex<NodeThread>>,
    /// Which of its RU's producers this is (`None`: the only one).
    part: Option<usize>,
    items: Option<Sender<FeedItem>>,
    pool: Pool,
    source_id: u16,
    max_fragment: usize,
    on_error: OnError,
    next_event: u64,
    last_trigger: Option<u32>,
    /// A run built by time (`builder.by = "time"` or `"window"`): frames, not fragments.
    by_time: bool,
    /// The producer's frames so far.
    frames: u64,
    /// The block the next small fragment goes into (fragments share blocks).
    current: Option<BlockWriter>,
    stopped: Option<String>,
}

impl Producer {
    /// Starts RU `ru_id` of `cfg` in this process (its driver on a thread), fed by the
    /// returned producer. The configuration must say `source.kind = "api"`; the EVM and BUs
    /// are started elsewhere (`evb node`) from the same configuration.
    pub fn start(cfg: &Config, ru_id: &str) -> Result<Producer, Error> {
        let me = Self::ru(cfg, ru_id)?;
        if me.stream_sources.len() > 1 {
            return Err(Error::Setup(format!(
                "{ru_id} takes {} producers (producer_sources): start them with Producer::start_many",
                me.stream_sources.len()
            )));
        }
        let mut v = Self::spawn(cfg, me, 1)?;
        Ok(v.pop().expect("one producer"))
    }

    /// Starts RU `ru_id` of `cfg` in this process, fed by one producer per entry of its
    /// `[[ru]] producer_sources` (2 or more), in that order. Each producer may move to a
    /// thread of its own (one per front-end board, say); the RU takes the k-th fragment of
    /// every producer for its event k and sends them as one super-fragment (docs/formats.md
    /// §4), checking that their trigger numbers agree (`source.on_sync_loss`).
    pub fn start_many(cfg: &Config, ru_id: &str) -> Result<Vec<Producer>, Error> {
        let me = Self::ru(cfg, ru_id)?;
        let k = me.stream_sources.len();
        if k < 2 {
            return Err(Error::Setup(format!(
                "{ru_id} has no [[ru]] producer_sources (2 or more): start its one producer with \
                 Producer::start"
            )));
        }
        Self::spawn(cfg, me, k)
    }

    /// RU `ru_id` of a valid configuration whose source is the plug-in API.
    fn ru(cfg: &Config, ru_id: &str) -> Result<NodeSpec, Error> {
        cfg.validate().map_err(|e| Error::Setup(e.to_string()))?;
        if cfg.source.kind != SourceKind::Api {
            return Err(Error::Setup(
                "source.kind must be \"api\" for a producer to feed an RU".into(),
            ));
        }
        cfg.nodes()
            .into_iter()
            .find(|n| n.id == ru_id && n.role == Role::Ru)
            .ok_or_else(|| Error::Setup(format!("no RU {ru_id:?} in the configuration")))
    }

    fn spawn(cfg: &Config, me: NodeSpec, k: usize) -> Result<Vec<Producer>, Error> {
        let ru_id = me.id.as_str();
        // frames are not in the RU's pool until cut into records: the channel, bounded at
        // `source.read_ahead`, is what holds a producer of frames back
        let by_time = cfg.by_time();
        let read_ahead = (cfg.source.read_ahead as usize).max(1);
        let (txs, inputs): (Vec<_>, Vec<_>) = (0..k)
            .map(|_| {
                if by_time {
                    bounded(read_ahead)
                } else {
                    unbounded()
                }
            })
            .unzip();
        let (pool_tx, pool_rx) = bounded(1);
        let plugs = Plugs {
            feed: Some(ApiFeed {
                inputs,
                pool: pool_tx,
            }),
            sink: None,
        };
        let mut node = NodeThread::spawn(cfg, ru_id, plugs)?;
        let pool = loop {
            match pool_rx.recv_timeout(Duration::from_millis(20)) {
                Ok(p) => break p,
                Err(RecvTimeoutError::Timeout) if !node.is_over() => {}
                Err(_) => {
                    return Err(match node.join() {
                        Err(e) => e,
                        Ok(o) => Error::Setup(format!("{ru_id} ended at once: {}", o.reason)),
                    })
                }
            }
        };
        let node = Arc::new(Mutex::new(node));
        Ok(txs
            .into_iter()
            .enumerate()
            .map(|(i, tx)| Producer {
                node: node.clone(),
                part: (k > 1).then_some(i),
                items: Some(tx),
                pool: pool.clone(),
                source_id: me.stream_sources.get(i).copied().unwrap_or(me.source_id),
                max_fragment: cfg.source.max_fragment as usize,
                on_error: cfg.source.on_error,
                next_event: 0,
                last_trigger: None,
                by_time,
                frames: 0,
                current: None,
                stopped: None,
            })
            .collect())
    }

    fn node(&self) -> MutexGuard<'_, NodeThread> {
        self.node.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The source id this producer's fragments carry (its entry of `producer_sources`, or
    /// the RU's `source_id`).
    pub fn source_id(&self) -> u16 {
        self.source_id
    }

    /// Room in front of each payload: the fragment's headers, or none for a part of a
    /// super-fragment.
    fn prefix(&self) -> usize {
        if self.part.is_some() {
            0
        } else {
            FRAGMENT_PREFIX_LEN
        }
    }

    /// Waits until the RU is connected to the EVM, or fails: [`Producer::start`] returns once
    /// the RU's pool is made, before it reaches the EVM, and an EVM that cannot be reached
    /// would otherwise show only as the run being over `run.connect_timeout_s` later. The
    /// error says why ([`Error::Setup`]: the peers not connected and their addresses). With
    /// several producers of one RU, once for any of them is enough. Returns within a status
    /// period (0.2 s) of the connection.
    pub fn wait_connected(&self) -> Result<(), Error> {
        // the node's lock is not held between looks (other producers of the RU go on)
        while !self.connected()? {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Whether the RU is connected to the EVM yet, without waiting: `Ok(false)` while it
    /// still tries, the error of [`Producer::wait_connected`] once it cannot be (for a
    /// caller that waits in its own way, between other work or signal checks).
    pub fn connected(&self) -> Result<bool, Error> {
        self.node().connected()
    }

    /// The RU's latest status, refreshed 5 times a second: the status line `evb node`
    /// prints (docs/control.md; `None` before the first), its RU stats' `waiting_for` naming a
    /// stalled producer.
    pub fn status(&self) -> Option<evb_builder::NodeStatus> {
        self.node().status()
    }

    /// Events submitted so far (the next one submitted is this event id).
    pub fn events_submitted(&self) -> u64 {
        self.next_event
    }

    /// The largest payload this RU accepts (`source.max_fragment`).
    pub fn max_fragment(&self) -> usize {
        self.max_fragment
    }

    fn check_running(&mut self) -> Result<(), Error> {
        if let Some(why) = &self.stopped {
            return Err(Error::RunOver(why.clone()));
        }
        let mut node = self.node();
        if node.is_over() {
            return Err(Error::RunOver(node.why_over()));
        }
        Ok(())
    }

    /// Room for a payload of `size` bytes in the RU's pool: waits for it or answers
    /// [`Error::Full`], as `when_full` says.
    pub fn buffer(&mut self, size: usize, when_full: WhenFull) -> Result<Buffer, Error> {
        self.check_running()?;
        if self.by_time {
            return Err(Error::State(
                "a run built by time takes frames (submit_frame), not fragments".into(),
            ));
        }
        if size > self.max_fragment {
            return Err(Error::Size {
                size,
                why: format!(
                    "larger than source.max_fragment ({} bytes)",
                    self.max_fragment
                ),
            });
        }
        let prefix = self.prefix();
        let need = prefix + size;
        let mut pause = Duration::from_micros(20);
        let writer = loop {
            match self.current.take() {
                Some(w) if w.remaining() >= need => break w,
                _ => {}
            }
            if let Some(w) = self.pool.try_alloc() {
                break w;
            }
            if when_full == WhenFull::ReturnFull {
                return Err(Error::Full);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
            self.check_running()?;
        };
        Ok(Buffer {
            start: writer.filled(),
            prefix,
            writer,
            len: size,
            capacity: size,
            pool_id: self.pool.id(),
        })
    }

    /// Submits `buf` as the fragment of the next event, with `trigger_number` (which must
    /// move forward, wrapping at 2^32). Returns the event id. A fragment that fails the
    /// check is answered [`Error::Refused`] and handled as `source.on_error` says.
    pub fn submit(&mut self, mut buf: Buffer, trigger_number: u32) -> Result<u64, Error> {
        self.check_running()?;
        if self.by_time {
            return Err(Error::State(
                "a run built by time takes frames (submit_frame), not fragments".into(),
            ));
        }
        if buf.pool_id != self.pool.id() {
            return Err(Error::UnknownBuffer);
        }
        if let Some(last) = self.last_trigger {
            let step = trigger_number.wrapping_sub(last);
            if step == 0 || step > u32::MAX / 2 {
                let why = format!("trigger number {trigger_number} after {last}: out of order");
                return Err(self.refuse(why, trigger_number));
            }
        }
        let event_id = self.next_event;
        let len = buf.len;
        if self.part.is_some() {
            // a part of the RU's super-fragment: the payload alone, its CRC for the RU to
            // combine
            let payload = &buf.writer.spare_mut()[..len];
            let crc = crc32c::crc32c(payload);
            buf.writer.advance(len);
            let payload = Chain::from_slice(buf.writer.slice(buf.start, len));
            self.keep_for_next(buf.writer);
            self.send(FeedItem::Part(Part {
                trigger_number,
                payload: Some(payload),
                crc,
            }))?;
            self.last_trigger = Some(trigger_number);
            self.next_event += 1;
            return Ok(event_id);
        }
        let payload = &buf.writer.spare_mut()[FRAGMENT_PREFIX_LEN..FRAGMENT_PREFIX_LEN + len];
        let header = FragmentHeader {
            event_id,
            trigger_number,
            source_id: self.source_id,
            flags: 0,
            payload_size: len as u32,
            payload_crc: crc32c::crc32c(payload),
        };
        write_fragment_prefix(&header, buf.writer.spare_mut());
        buf.writer.advance(FRAGMENT_PREFIX_LEN + len);
        let fragment = Chain::from_slice(buf.writer.slice(buf.start, FRAGMENT_PREFIX_LEN + len));
        self.keep_for_next(buf.writer);
        self.send(FeedItem::Event(Assembled {
            trigger_number,
            fragments: 1,
            payload: Default::default(),
            flags: 0,
            written: Some(fragment),
        }))?;
        self.last_trigger = Some(trigger_number);
        self.next_event += 1;
        Ok(event_id)
    }

    /// A run built by time (`builder.by = "time"` or `"window"`): submits the next frame of
    /// this producer's stream, its data for ticks `[begin, end)`. The stream begins at tick
    /// 0, each frame lasts `frames.ticks` and begins where the one before it ended
    /// (docs/formats.md §9); a frame that does not stops the run, named. The frame is copied
    /// once (its header in front); when the RU has `source.read_ahead` frames it has not cut
    /// yet, this waits ([`WhenFull::Block`]) or answers [`Error::Full`]. Returns the
    /// frame's number, from 0.
    pub fn submit_frame(
        &mut self,
        begin: u64,
        end: u64,
        payload: &[u8],
        when_full: WhenFull,
    ) -> Result<u64, Error> {
        self.check_running()?;
        if !self.by_time {
            return Err(Error::State(
                "frames are for a run built by time (builder.by = \"time\" or \"window\"): \
                 submit fragments"
                    .into(),
            ));
        }
        let len = TIME_FRAME_HEADER_LEN + payload.len();
        if len > self.max_fragment {
            return Err(Error::Size {
                size: payload.len(),
                why: format!(
                    "a frame with its {TIME_FRAME_HEADER_LEN}-byte header over source.max_fragment ({})",
                    self.max_fragment
                ),
            });
        }
        if end <= begin {
            return Err(Error::Size {
                size: payload.len(),
                why: format!("a frame [{begin}, {end}) whose end is not after its begin"),
            });
        }
        let mut h = TimeFrameHeader {
            begin,
            end,
            source_id: self.source_id,
            flags: 0,
            crc: 0,
        };
        h.crc = h.crc_of([payload]);
        let mut v = Vec::with_capacity(len);
        v.extend_from_slice(&h.encode());
        v.extend_from_slice(payload);
        let item = FeedItem::Frame(v.into());
        let Some(tx) = self.items.clone() else {
            return Err(Error::RunOver(self.node().why_over()));
        };
        match when_full {
            WhenFull::Block => self.block_send(tx, item),
            WhenFull::ReturnFull => match tx.try_send(item) {
                Ok(()) => {
                    self.frames += 1;
                    Ok(self.frames - 1)
                }
                Err(crossbeam_channel::TrySendError::Full(_)) => Err(Error::Full),
                Err(crossbeam_channel::TrySendError::Disconnected(_)) => {
                    Err(Error::RunOver(self.node().why_over()))
                }
            },
        }
    }

    /// Waits until the RU takes `item` (checking every 100 ms that the run is on).
    fn block_send(&mut self, tx: Sender<FeedItem>, mut item: FeedItem) -> Result<u64, Error> {
        loop {
            match tx.send_timeout(item, Duration::from_millis(100)) {
                Ok(()) => {
                    self.frames += 1;
                    return Ok(self.frames - 1);
                }
                Err(crossbeam_channel::SendTimeoutError::Timeout(back)) => {
                    self.check_running()?;
                    item = back;
                }
                Err(crossbeam_channel::SendTimeoutError::Disconnected(_)) => {
                    return Err(Error::RunOver(self.node().why_over()));
                }
            }
        }
    }

    /// Copies `payload` into a buffer and submits it (for a readout whose data is elsewhere
    /// already; [`Producer::buffer`] and [`Producer::submit`] avoid the copy).
    pub fn submit_copy(
        &mut self,
        payload: &[u8],
        trigger_number: u32,
        when_full: WhenFull,
    ) -> Result<u64, Error> {
        let mut b = self.buffer(payload.len(), when_full)?;
        b.payload_mut().copy_from_slice(payload);
        self.submit(b, trigger_number)
    }

    /// Ends the feed: the run ends after the events submitted. Waits for the RU's run to end
    /// and returns its outcome (its report).
    pub fn finish(mut self) -> Result<NodeOutcome, Error> {
        self.end();
        // Not joined under the lock while the RU runs: its other producers must go on
        // (the run ends only when every one of them has finished).
        loop {
            {
                let mut node = self.node();
                if node.is_over() {
                    return node.join();
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn end(&mut self) {
        self.current = None;
        if let Some(tx) = self.items.take() {
            let _ = tx.send(FeedItem::End);
        }
    }

    fn keep_for_next(&mut self, w: BlockWriter) {
        let room = |w: &Option<BlockWriter>| w.as_ref().map_or(0, BlockWriter::remaining);
        if w.remaining() > FRAGMENT_PREFIX_LEN && w.remaining() > room(&self.current) {
            self.current = Some(w);
        }
    }

    fn send(&mut self, item: FeedItem) -> Result<(), Error> {
        let sent = self.items.as_ref().is_some_and(|tx| tx.send(item).is_ok());
        if sent {
            Ok(())
        } else {
            Err(Error::RunOver(self.node().why_over()))
        }
    }

    /// A fragment failed its check: `on_error` says whether the run stops or the event is
    /// built without it.
    fn refuse(&mut self, why: String, trigger_number: u32) -> Error {
        match self.on_error {
            OnError::Stop => {
                let _ = self.send(FeedItem::Failed(why.clone()));
                self.stopped = Some(why.clone());
                Error::Refused {
                    why,
                    run_stopped: true,
                }
            }
            OnError::Drop => {
                tracing::warn!("producer: {why}: dropped, its event is built without it");
                let missing = match self.part {
                    Some(_) => FeedItem::Part(Part {
                        trigger_number,
                        payload: None,
                        crc: 0,
                    }),
                    None => FeedItem::Event(Assembled {
                        trigger_number,
                        fragments: 1,
                        payload: Default::default(),
                        flags: FLAG_MISSING,
                        written: None,
                    }),
                };
                if let Err(e) = self.send(missing) {
                    return e;
                }
                self.next_event += 1;
                Error::Refused {
                    why,
                    run_stopped: false,
                }
            }
        }
    }
}

impl Drop for Producer {
    /// A producer dropped without `finish` ends its feed the same way (the RU's run ends
    /// after the events submitted); it does not wait for the run.
    fn drop(&mut self) {
        self.end();
    }
}

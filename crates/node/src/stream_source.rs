//! Front-ends over TCP (`source.kind = "stream"`): an RU listens on one address per stream,
//! takes one front-end connection on each, and cuts what arrives into fragments
//! (`evb_formats::stream`) on a thread per stream. The driver pumps those fragments through
//! the assembler (`evb_builder::assembly`: checks, super-fragments, sync loss) into the RU's
//! live feed.
//!
//! Who gets a stream: only peers in `source.allow_from` (loopback when unset); any other
//! connection is closed at once, with a warning, and the listener goes on waiting. An allowed
//! connection becomes the stream's front-end with its first byte: one that closes having sent
//! nothing (a port check, a probe) is warned about and forgotten, and the real front-end
//! still gets in after it.
//!
//! Back-pressure: each stream's thread hands fragments over a channel that holds
//! `source.read_ahead` of them, in batches (the fragments cut from one read, [`BATCH`] at
//! most: one channel operation per batch, where one per fragment was an eighth of a
//! stream-fed RU's loop), and the driver takes them only while the assembler and the feed
//! have room, so when the RU's pool is full (nothing leaves the feed) the channel fills,
//! the thread stops reading, and TCP flow control holds the front-end. Nothing is dropped.
//!
//! Run end: once the EVM stops the run, every stream's thread reads what its front-end
//! still sends (to its end, until it is idle for [`DRAIN_IDLE`], or for [`DRAIN_LIMIT`] at
//! most) and cuts it into fragments that are counted, not built: every fragment a front-end
//! sent is built or counted (`unbuilt`). A stream that delivered no fragment in the whole
//! run fails the RU, naming it.
//!
//! One idea, one file: front-end streams into the RU's live feed.

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, SendTimeoutError, Sender, TryRecvError, TrySendError};
use evb_builder::assembly::{
    Assembled, Assembler, AssemblyConfig, BadFragment, Piece, StreamName, SyncLoss,
};
use evb_builder::frames::Slicing;
use evb_builder::slice_buffer::{super_window, SliceBuffer, SliceBufferStats};
use evb_builder::{Ru, RunState};
use evb_config::{AllowedNet, BuildBy, Config, NodeSpec, OnError, OnSyncLoss, StreamFormat};
use evb_formats::stream::{self as fstream, StreamDecoder, StreamFragment};
use evb_transport::log_limit::LogLimit;
use tracing::{error, info, warn};

/// How often a blocked stream thread looks at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(100);
/// How long an RU reads what its front-ends still send after the run stopped, at most.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(2);
/// A stream that brought no byte for this long after the run stopped is drained.
pub const DRAIN_IDLE: Duration = Duration::from_millis(250);
/// Least time between two warnings of one stream about refused or empty connections.
const WARN_EVERY: Duration = Duration::from_secs(10);
/// Allowed connections that have sent nothing yet, held per stream while it waits for its
/// front-end (beyond it the oldest is closed).
const MAX_CANDIDATES: usize = 8;

/// Fragments handed to the driver at once, at most (fewer when `source.read_ahead` is less).
const BATCH: usize = 64;

/// The fragments per batch and the batches a stream's channel holds for `read_ahead`
/// fragments: never more than `read_ahead` fragments in all (one when it is 0).
fn channel_shape(read_ahead: usize) -> (usize, usize) {
    let batch = BATCH.min(read_ahead.max(1));
    (batch, (read_ahead / batch).max(1))
}

/// What a stream's thread tells the driver, in stream order.
enum StreamEvent {
    Connected(SocketAddr),
    /// Fragments in stream order, at least one.
    Fragments(Vec<StreamFragment>),
    /// The front-end closed the stream cleanly (between fragments).
    Closed,
    /// The stream cannot be read on: why.
    Failed(String),
}

/// The RU's orders to every stream thread.
#[derive(Default)]
struct Orders {
    /// The RU is done with the streams: close them now.
    stop: AtomicBool,
    /// The run stopped: read what the front-end still sends, count it, hand nothing over.
    drain: AtomicBool,
}

/// What one stream's thread tells the driver besides its channel.
#[derive(Default)]
struct Shared {
    /// Fragments read after the run stopped (counted, never built).
    drained: AtomicU64,
    /// The thread has ended.
    finished: AtomicBool,
    /// Allowed connections that closed without sending a byte (probes), and the last one.
    probes: AtomicU64,
    last_probe: Mutex<Option<SocketAddr>>,
    /// Connections refused (not in `source.allow_from`), and the last one.
    refused: AtomicU64,
    last_refused: Mutex<Option<SocketAddr>>,
    /// Allowed connections open and silent so far (a front-end may connect long before its
    /// first fragment), and the first of them.
    silent: AtomicU64,
    first_silent: Mutex<Option<SocketAddr>>,
}

impl Shared {
    /// `; 2 connections closed without sending anything (the last from ...)`, or empty.
    fn notes(&self) -> String {
        let last = |m: &Mutex<Option<SocketAddr>>| {
            m.lock()
                .ok()
                .and_then(|g| *g)
                .map_or(String::new(), |a| format!(", the last from {a}"))
        };
        let mut s = String::new();
        let probes = self.probes.load(Ordering::Relaxed);
        if probes > 0 {
            s += &format!(
                "; {probes} connection(s) closed without sending anything{}",
                last(&self.last_probe)
            );
        }
        let refused = self.refused.load(Ordering::Relaxed);
        if refused > 0 {
            s += &format!(
                "; {refused} connection(s) refused, not in source.allow_from{}",
                last(&self.last_refused)
            );
        }
        s
    }
}

/// Sets `finished` when the thread ends, however it ends.
struct Finished(Arc<Shared>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.finished.store(true, Ordering::Release);
    }
}

struct Link {
    rx: Receiver<StreamEvent>,
    shared: Arc<Shared>,
    peer: Option<SocketAddr>,
    closed: bool,
    /// Since when the assembler has had nothing of this stream (None: it has something).
    empty_since: Option<Instant>,
    warned: bool,
}

/// What an RU cuts its streams' fragments into: events (the assembler, `builder.by =
/// "event"`), or time slices (a latency buffer of frames per stream, `builder.by =
/// "time"`: slice k is cut once every stream's is whole, several streams' going as one
/// super-fragment).
enum Cutter {
    Events(Assembler<bytes::Bytes>),
    Slices(Vec<SliceBuffer>),
    /// Decision windows: frames pass to the RU's latency buffer (in its live feed, which
    /// cuts each window when it is assigned); here they only wait for the next pump.
    Windows(Staged),
}

/// Frames read and not yet in the RU's latency buffer, with the stream each came on.
struct Staged {
    names: Vec<String>,
    frames: std::collections::VecDeque<(usize, Piece<bytes::Bytes>)>,
    received: Vec<u64>,
    closed: Vec<bool>,
}

impl Cutter {
    fn describe(&self, stream: usize) -> String {
        match self {
            Cutter::Events(a) => a.describe(stream),
            Cutter::Slices(b) => b
                .get(stream)
                .map_or_else(String::new, SliceBuffer::describe),
            Cutter::Windows(w) => w.names.get(stream).cloned().unwrap_or_default(),
        }
    }

    fn push(&mut self, stream: usize, piece: Piece<bytes::Bytes>) -> Result<(), String> {
        match self {
            Cutter::Events(a) => {
                a.push(stream, piece);
                Ok(())
            }
            Cutter::Slices(b) => match b.get_mut(stream) {
                Some(b) => b.push(piece).map_err(|e| format!("{}: {e}", b.describe())),
                None => Err(format!("no stream {stream}")),
            },
            Cutter::Windows(w) => {
                if let Some(n) = w.received.get_mut(stream) {
                    *n += 1;
                }
                w.frames.push_back((stream, piece));
                Ok(())
            }
        }
    }

    fn close(&mut self, stream: usize) {
        match self {
            Cutter::Events(a) => a.close(stream),
            Cutter::Slices(b) => {
                if let Some(b) = b.get_mut(stream) {
                    b.close()
                }
            }
            Cutter::Windows(w) => {
                if let Some(c) = w.closed.get_mut(stream) {
                    *c = true;
                }
            }
        }
    }

    fn queued(&self, stream: usize) -> usize {
        match self {
            Cutter::Events(a) => a.queued(stream),
            Cutter::Slices(b) => b.get(stream).map_or(0, SliceBuffer::queued),
            Cutter::Windows(w) => w.frames.iter().filter(|(s, _)| *s == stream).count(),
        }
    }

    fn exhausted(&self) -> bool {
        match self {
            Cutter::Events(a) => a.exhausted(),
            // no slice can be cut any more: every stream ended and one has nothing left
            // (what the others still hold belongs to no slice: unbuilt)
            Cutter::Slices(b) => {
                b.iter().all(SliceBuffer::is_closed) && b.iter().any(SliceBuffer::exhausted)
            }
            // the decisions go on when a stream ends: windows past its end are LATE
            Cutter::Windows(_) => false,
        }
    }

    fn unbuilt(&self) -> u64 {
        match self {
            Cutter::Events(a) => a.unbuilt(),
            Cutter::Slices(b) => b.iter().map(SliceBuffer::unbuilt).sum(),
            Cutter::Windows(w) => w.frames.len() as u64,
        }
    }

    fn next_event(&mut self, now: Instant) -> Result<Option<Assembled>, String> {
        match self {
            Cutter::Events(a) => a.next_event(now),
            Cutter::Slices(b) if b.len() == 1 => Ok(b[0].next_slice()),
            Cutter::Slices(b) => {
                if !b.iter().all(SliceBuffer::ready) {
                    return Ok(None);
                }
                let parts = b
                    .iter_mut()
                    .filter_map(|b| Some((b.source_id(), b.next_slice()?)))
                    .collect();
                Ok(Some(super_window(parts)))
            }
            Cutter::Windows(_) => Ok(None),
        }
    }

    /// Fragments (frames) received, dropped, and events built with a sync loss.
    fn stats(&self) -> (u64, u64, u64) {
        match self {
            Cutter::Events(a) => {
                let st = a.stats();
                (st.received, st.dropped, st.sync_losses)
            }
            Cutter::Slices(b) => (b.iter().map(|b| b.received().0).sum(), 0, 0),
            Cutter::Windows(w) => (w.received.iter().sum(), 0, 0),
        }
    }

    fn received(&self, stream: usize) -> u64 {
        match self {
            Cutter::Events(a) => a.received(stream),
            Cutter::Slices(b) => b.get(stream).map_or(0, |b| b.received().0),
            Cutter::Windows(w) => w.received.get(stream).copied().unwrap_or(0),
        }
    }

    fn flush_sync_warnings(&mut self, now: Instant) {
        if let Cutter::Events(a) = self {
            a.flush_sync_warnings(now);
        }
    }
}

/// The stream side of one RU: its listeners' threads and the assembler.
pub struct StreamSource {
    node: String,
    assembler: Cutter,
    links: Vec<Link>,
    read_ahead: usize,
    stall_warn: Duration,
    /// How long a stream may go without a front-end while the run is on (`run.connect_timeout_s`).
    connect_timeout: Duration,
    started: Instant,
    orders: Arc<Orders>,
    over: bool,
    /// A warning counted the unbuilt fragments when a stream ended.
    said_unbuilt: bool,
}

impl StreamSource {
    /// Binds every stream address of RU `me` and starts a thread per stream.
    pub fn start(cfg: &Config, me: &NodeSpec, now: Instant) -> Result<StreamSource, String> {
        let s = &cfg.source;
        let (format, trigger_mask, trigger_name) = match s.format {
            StreamFormat::Fed => (fstream::StreamFormat::Fed, 0xff_ffff, "LV1 id"),
            StreamFormat::Framed => (fstream::StreamFormat::Framed, u32::MAX, "trigger number"),
            StreamFormat::Frames => (fstream::StreamFormat::Frames, u32::MAX, "first tick"),
        };
        let read_ahead = s.read_ahead as usize;
        let orders = Arc::new(Orders::default());
        let allow = Arc::new(s.stream_allow());
        let allow_text = match &s.allow_from {
            Some(_) => allow
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            None => "unset: loopback only".to_string(),
        };
        let mut links = Vec::new();
        let mut names = Vec::new();
        for (i, addr) in me.streams.iter().enumerate() {
            let source_id = me.stream_sources.get(i).copied().unwrap_or(me.source_id);
            let listener = TcpListener::bind(addr.as_str())
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .map_err(|e| format!("{}: cannot listen on {addr} for stream {i}: {e}", me.id))?;
            info!(node = %me.id, "stream {i} (source {source_id}) listening on {addr}, taking front-ends from {allow_text}");
            let (batch, places) = channel_shape(read_ahead);
            let (tx, rx) = bounded(places);
            let expected =
                (s.check_source_id && format == fstream::StreamFormat::Fed).then_some(source_id);
            let decoder = StreamDecoder::new(format, s.max_fragment as usize, expected);
            let shared = Arc::new(Shared::default());
            let reader = Reader {
                node: me.id.clone(),
                name: format!("stream {i} (source {source_id}, {addr})"),
                allow: allow.clone(),
                allow_text: allow_text.clone(),
                orders: orders.clone(),
                shared: shared.clone(),
                tx,
                batch,
            };
            std::thread::Builder::new()
                .name(format!("{}-stream{i}", me.id))
                .spawn(move || reader.run(listener, decoder))
                .map_err(|e| format!("{}: cannot start the thread of stream {i}: {e}", me.id))?;
            links.push(Link {
                rx,
                shared,
                peer: None,
                closed: false,
                empty_since: Some(now),
                warned: false,
            });
            names.push(StreamName {
                source_id,
                addr: addr.clone(),
            });
        }
        let slicing = (cfg.builder.by == BuildBy::Time).then_some(Slicing {
            slice: cfg.builder.slice_ticks,
            overlap: cfg.builder.overlap_ticks,
            t0: cfg.frames.first_tick,
        });
        let assembler = match slicing {
            None if cfg.builder.by == BuildBy::Window => Cutter::Windows(Staged {
                names: names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| format!("stream {i} (source {}, {})", n.source_id, n.addr))
                    .collect(),
                frames: Default::default(),
                received: vec![0; names.len()],
                closed: vec![false; names.len()],
            }),
            Some(slicing) => Cutter::Slices(
                names
                    .iter()
                    .enumerate()
                    .map(|(i, name)| SliceBuffer::new(slicing, cfg.frames.ticks, name.clone(), i))
                    .collect(),
            ),
            None => Cutter::Events(Assembler::new(AssemblyConfig {
                streams: names,
                on_error: match s.on_error {
                    OnError::Stop => BadFragment::Stop,
                    OnError::Drop => BadFragment::Drop,
                },
                on_sync_loss: match s.on_sync_loss {
                    OnSyncLoss::Stop => SyncLoss::Stop,
                    OnSyncLoss::Flag => SyncLoss::Flag,
                },
                trigger_mask,
                trigger_name,
            })),
        };
        Ok(StreamSource {
            node: me.id.clone(),
            assembler,
            links,
            read_ahead,
            stall_warn: Duration::from_secs_f64(s.stall_warn_s),
            connect_timeout: Duration::from_secs_f64(cfg.run.connect_timeout_s),
            started: now,
            orders,
            over: false,
            said_unbuilt: false,
        })
    }

    /// Moves what the streams delivered into the RU's live feed, as far as there is room;
    /// stops the RU if a stream failed or the assembler refused an event. Once the EVM
    /// stopped the run: drains the streams and counts what they still held (see
    /// [`StreamSource::end_of_run`]).
    pub fn pump(&mut self, now: Instant, ru: &mut Ru) {
        if self.over || ru.state().is_over() {
            return;
        }
        if ru.state() == RunState::Stopping {
            return self.end_of_run(now, ru);
        }
        if let Err(why) = self.take_from_streams(now) {
            return self.fail(ru, why);
        }
        let Some(feed) = ru.live_mut() else { return };
        if let (Cutter::Windows(w), Some(buffer)) = (&mut self.assembler, feed.windows.as_mut()) {
            while let Some((stream, piece)) = w.frames.pop_front() {
                if let Err(why) = buffer.push(stream, piece) {
                    let why = format!("{}: {why}", w.names[stream]);
                    return self.fail(ru, why);
                }
            }
            for (i, &closed) in w.closed.iter().enumerate() {
                if closed && !buffer.is_stream_closed(i) {
                    buffer.close(i);
                }
            }
        }
        while feed.queued() < self.read_ahead {
            match self.assembler.next_event(now) {
                Ok(Some(event)) => feed.supply(event),
                Ok(None) => break,
                Err(why) => return self.fail(ru, why),
            }
        }
        let in_channels: u64 = self.links.iter().map(|l| l.rx.len() as u64).sum();
        feed.stats.unbuilt = self.assembler.unbuilt() + in_channels;
        if self.assembler.exhausted() && !feed.is_done() {
            if feed.stats.unbuilt > 0 {
                self.said_unbuilt = true;
                warn!(node = %self.node, "a stream ended: {} fragments of the other streams belong to no event and are not built", feed.stats.unbuilt);
            }
            info!(node = %self.node, "streams ended after {} events", feed.supplied());
            feed.finish();
        }
        if let Cutter::Slices(b) = &self.assembler {
            feed.stats.slices = b
                .iter()
                .map(SliceBuffer::stats)
                .reduce(SliceBufferStats::with);
        }
        let (received, dropped, sync_losses) = self.assembler.stats();
        feed.stats.fragments_received = received;
        feed.stats.dropped = dropped;
        feed.stats.sync_losses = sync_losses;
        let running = ru.state() == RunState::Running;
        if running {
            if let Some(why) = self.front_end_missing(now) {
                return self.fail(ru, why);
            }
        }
        self.watch_stalls(now, running, ru);
    }

    /// The run stopped (the EVM's Stop; the RU's report to the EVM is already sent, with the
    /// counts at that moment): every stream reads what its front-end still sends, for
    /// [`DRAIN_LIMIT`] at most, and cuts it into fragments that are counted as unbuilt, so
    /// that the RU's own final report accounts for every fragment the front-ends sent. A
    /// stream that delivered no fragment in the whole run fails the RU, naming it. Blocks
    /// the driver for that time at most: nothing else is due once the run stopped (the
    /// liveness checks end with Running).
    fn end_of_run(&mut self, now: Instant, ru: &mut Ru) {
        self.over = true;
        self.assembler.flush_sync_warnings(now);
        self.orders.drain.store(true, Ordering::Relaxed);
        let began = Instant::now();
        let deadline = began + DRAIN_LIMIT + Duration::from_millis(500);
        while Instant::now() < deadline
            && !self
                .links
                .iter()
                .all(|l| l.shared.finished.load(Ordering::Acquire))
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.orders.stop.store(true, Ordering::Relaxed);
        let n = self.links.len();
        let mut late = vec![0u64; n];
        for (i, link) in self.links.iter_mut().enumerate() {
            while let Ok(ev) = link.rx.try_recv() {
                match ev {
                    StreamEvent::Fragments(f) => late[i] += f.len() as u64,
                    StreamEvent::Connected(peer) => link.peer = Some(peer),
                    StreamEvent::Closed => link.closed = true,
                    StreamEvent::Failed(why) => {
                        warn!(node = %self.node, "{}: after the run stopped: {why}", self.assembler.describe(i))
                    }
                }
            }
            late[i] += link.shared.drained.load(Ordering::Relaxed);
        }
        let late_all: u64 = late.iter().sum();
        if late_all > 0 {
            info!(node = %self.node, "the run stopped with {late_all} fragments read ahead or still coming from the front-ends: read in {:.2} s and counted as unbuilt", began.elapsed().as_secs_f64());
        }
        let silent: Vec<String> = (0..n)
            .filter(|&i| self.assembler.received(i) + late[i] == 0)
            .map(|i| {
                let link = &self.links[i];
                let silent = link.shared.first_silent.lock().ok().and_then(|g| *g);
                let what = match (link.peer, silent) {
                    (Some(peer), _) => format!("its front-end {peer} sent no whole fragment"),
                    (None, Some(first)) => format!("{first} connected and sent nothing"),
                    _ => "no front-end connected".to_string(),
                };
                format!(
                    "{}: no fragment in the whole run ({what}{})",
                    self.assembler.describe(i),
                    link.shared.notes()
                )
            })
            .collect();
        if let Some(feed) = ru.live_mut() {
            let (received, dropped, sync_losses) = self.assembler.stats();
            feed.stats.unbuilt = self.assembler.unbuilt() + late_all;
            feed.stats.fragments_received = received + late_all;
            feed.stats.dropped = dropped;
            feed.stats.sync_losses = sync_losses;
            feed.stats.waiting_for.clear();
            let unbuilt = feed.unbuilt();
            // (said already when a stream ended, unless more came since)
            if unbuilt > 0 && (late_all > 0 || !self.said_unbuilt) {
                warn!(node = %self.node, "{unbuilt} of the {} fragments the front-ends sent are in no event built (the run stopped first, or another stream sent fewer): counted as unbuilt", feed.stats.fragments_received);
            }
        }
        if !silent.is_empty() {
            self.fail(ru, silent.join("; "));
        }
    }

    /// A stream whose front-end has not connected within `run.connect_timeout_s` of the RU's
    /// start: an error that waiting will not mend (a wrong address, a front-end that is not
    /// there), so the run stops naming the stream instead of waiting for ever.
    fn front_end_missing(&self, now: Instant) -> Option<String> {
        if now.duration_since(self.started) < self.connect_timeout {
            return None;
        }
        // a connection open and silent may be the front-end, waiting for its first trigger
        let i = self.links.iter().position(|l| {
            l.peer.is_none() && !l.closed && l.shared.silent.load(Ordering::Relaxed) == 0
        })?;
        Some(format!(
            "{}: no front-end connected within {:.1} s (run.connect_timeout_s){}",
            self.assembler.describe(i),
            self.connect_timeout.as_secs_f64(),
            self.links[i].shared.notes()
        ))
    }

    fn take_from_streams(&mut self, now: Instant) -> Result<(), String> {
        for i in 0..self.links.len() {
            while self.assembler.queued(i) < self.read_ahead {
                let link = &mut self.links[i];
                match link.rx.try_recv() {
                    Ok(StreamEvent::Connected(peer)) => {
                        info!(node = %self.node, "{}: front-end {peer} connected", self.assembler.describe(i));
                        link.peer = Some(peer);
                    }
                    Ok(StreamEvent::Fragments(batch)) => {
                        link.empty_since = None;
                        link.warned = false;
                        for f in batch {
                            self.assembler.push(
                                i,
                                Piece {
                                    trigger_number: f.trigger_number,
                                    bytes: f.bytes,
                                    offset: f.offset,
                                    bad: f.bad,
                                },
                            )?;
                        }
                    }
                    Ok(StreamEvent::Closed) => {
                        info!(node = %self.node, "{}: the front-end closed the stream", self.assembler.describe(i));
                        link.closed = true;
                        self.assembler.close(i);
                        break;
                    }
                    Ok(StreamEvent::Failed(why)) => {
                        return Err(format!("{}: {why}", self.assembler.describe(i)));
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        if !link.closed {
                            return Err(format!(
                                "{}: its reader stopped",
                                self.assembler.describe(i)
                            ));
                        }
                        break;
                    }
                }
            }
            let link = &mut self.links[i];
            if self.assembler.queued(i) == 0 && link.empty_since.is_none() {
                link.empty_since = Some(now);
            }
        }
        Ok(())
    }

    /// Names the streams the RU is waiting for (status and report) and warns once per stall.
    fn watch_stalls(&mut self, now: Instant, running: bool, ru: &mut Ru) {
        let mut waiting = Vec::new();
        for (i, link) in self.links.iter_mut().enumerate() {
            let Some(since) = link.empty_since.filter(|_| !link.closed && running) else {
                continue;
            };
            let waited = now.duration_since(since);
            if waited < self.stall_warn {
                continue;
            }
            let at = since.duration_since(self.started).as_secs_f64();
            let silent = link.shared.silent.load(Ordering::Relaxed);
            let first_silent = link.shared.first_silent.lock().ok().and_then(|g| *g);
            let what = match (link.peer, first_silent) {
                (Some(peer), _) => format!("no fragment from {peer}"),
                (None, Some(first)) if silent > 0 => {
                    format!("{first} connected ({silent} in all) and sent nothing yet")
                }
                _ => format!("no front-end connected{}", link.shared.notes()),
            };
            let line = format!(
                "{} since {at:.1} s ({:.1} s): {what}",
                self.assembler.describe(i),
                waited.as_secs_f64()
            );
            if !link.warned {
                link.warned = true;
                warn!(node = %self.node, "waiting for {line}");
            }
            waiting.push(line);
        }
        // named again only when a stream's first fragment changed how many are silent (a
        // stream never falls silent again): no formatting on every pass
        let silent = (0..self.links.len())
            .filter(|&i| self.assembler.received(i) == 0)
            .count();
        if let Some(feed) = ru.live_mut() {
            feed.stats.waiting_for = waiting;
            if feed.stats.silent.len() != silent {
                feed.stats.silent = (0..self.links.len())
                    .filter(|&i| self.assembler.received(i) == 0)
                    .map(|i| self.assembler.describe(i))
                    .collect();
            }
        }
    }

    fn fail(&mut self, ru: &mut Ru, why: String) {
        self.over = true;
        self.orders.stop.store(true, Ordering::Relaxed);
        let reason = format!("{}: {why}", self.node);
        error!(node = %self.node, "{why}");
        ru.source_failed(reason);
    }
}

impl Drop for StreamSource {
    fn drop(&mut self) {
        self.orders.stop.store(true, Ordering::Relaxed);
    }
}

/// What became of an event a stream's thread handed over.
enum Handed {
    Sent,
    /// The RU is done with the stream.
    Stopped,
    /// The run stopped: the event was not sent (a fragment is the thread's to count).
    Draining,
}

/// What a rate-limited warning standing for `n` occurrences adds: the ones held back.
fn more(n: u64) -> String {
    let held = n.saturating_sub(1);
    if held == 0 {
        String::new()
    } else {
        format!(" ({held} more since the last warning)")
    }
}

/// One stream's thread.
struct Reader {
    node: String,
    /// `stream 1 (source 843, 127.0.0.1:7302)`
    name: String,
    allow: Arc<Vec<AllowedNet>>,
    allow_text: String,
    orders: Arc<Orders>,
    shared: Arc<Shared>,
    tx: Sender<StreamEvent>,
    /// Fragments per batch handed over, at most.
    batch: usize,
}

impl Reader {
    fn stopped(&self) -> bool {
        self.orders.stop.load(Ordering::Relaxed)
    }

    fn draining(&self) -> bool {
        self.orders.drain.load(Ordering::Relaxed)
    }

    fn allowed(&self, ip: IpAddr) -> bool {
        self.allow.iter().any(|n| n.contains(ip))
    }

    /// Hands `ev` to the driver, waiting while the channel is full (back-pressure).
    fn hand_over(&self, mut ev: StreamEvent) -> Handed {
        // Room at once is the common case: no deadline to compute (a clock read per
        // fragment was a visible share of a stream-fed RU).
        if self.draining() {
            return Handed::Draining;
        }
        match self.tx.try_send(ev) {
            Ok(()) => return Handed::Sent,
            Err(TrySendError::Full(back)) => ev = back,
            Err(TrySendError::Disconnected(_)) => return Handed::Stopped,
        }
        loop {
            if self.draining() {
                return Handed::Draining;
            }
            match self.tx.send_timeout(ev, STOP_CHECK) {
                Ok(()) => return Handed::Sent,
                Err(SendTimeoutError::Timeout(back)) if !self.stopped() => ev = back,
                Err(_) => return Handed::Stopped,
            }
        }
    }

    /// Hands the fragments in `batch` (if any) to the driver, leaving it empty; after the
    /// run stopped, counts them instead.
    fn hand_over_batch(&self, batch: &mut Vec<StreamFragment>) -> Handed {
        if batch.is_empty() {
            return Handed::Sent;
        }
        let n = batch.len() as u64;
        let handed = self.hand_over(StreamEvent::Fragments(std::mem::take(batch)));
        if let Handed::Draining = handed {
            self.shared.drained.fetch_add(n, Ordering::Relaxed);
        }
        handed
    }

    /// Says why the stream cannot be read on (unless the run is over anyway).
    fn failed(&self, why: String) {
        if self.draining() {
            warn!(node = %self.node, "{}: after the run stopped: {why}", self.name);
        } else {
            let _ = self.hand_over(StreamEvent::Failed(why));
        }
    }

    /// Waits for the front-end, then reads and cuts fragments until the stream ends, fails,
    /// or the RU is done with it.
    fn run(self, listener: TcpListener, mut decoder: StreamDecoder) {
        let _finished = Finished(self.shared.clone());
        let (mut stream, peer) = match self.wait_for_front_end(&listener) {
            Ok(Some(c)) => c,
            Ok(None) => return,
            Err(why) => return self.failed(why),
        };
        // One front-end per stream: a second connection is refused from now on.
        drop(listener);
        if let Err(e) = prepare(&stream) {
            return self.failed(format!("socket set-up: {e}"));
        }
        info!(node = %self.node, "{}: {peer} sent its first bytes: it is the front-end", self.name);
        if let Handed::Stopped = self.hand_over(StreamEvent::Connected(peer)) {
            return;
        }
        let mut drain_began: Option<Instant> = None;
        let mut last_bytes = Instant::now();
        loop {
            if self.stopped() {
                return;
            }
            if drain_began.is_none() && self.draining() {
                drain_began = Some(Instant::now());
                last_bytes = Instant::now();
            }
            if let Some(began) = drain_began {
                let drained = self.shared.drained.load(Ordering::Relaxed);
                if began.elapsed() >= DRAIN_LIMIT {
                    warn!(node = %self.node, "{}: {peer} still sends {:.1} s after the run stopped: {drained} fragments read since; what it sends from now on is not read", self.name, DRAIN_LIMIT.as_secs_f64());
                    return;
                }
                if last_bytes.elapsed() >= DRAIN_IDLE {
                    if decoder.pending() > 0 {
                        warn!(node = %self.node, "{}: {peer} stopped sending inside a fragment after the run stopped ({} bytes of it read, not counted)", self.name, decoder.pending());
                    }
                    return;
                }
            }
            match decoder.read_from(&mut stream) {
                Ok(0) => {
                    match decoder.finish() {
                        Ok(()) if drain_began.is_some() => {}
                        Ok(()) => {
                            let _ = self.hand_over(StreamEvent::Closed);
                        }
                        Err(e) => self.failed(e.to_string()),
                    }
                    return;
                }
                Ok(_) => {
                    last_bytes = Instant::now();
                    // the fragments this read completed, in batches; those before a bad
                    // stretch of the stream are handed over before its error
                    let mut batch = Vec::new();
                    let end = loop {
                        match decoder.next_fragment() {
                            Ok(Some(f)) => {
                                if batch.capacity() == 0 {
                                    batch.reserve_exact(self.batch);
                                }
                                batch.push(f);
                                if batch.len() == self.batch
                                    && matches!(self.hand_over_batch(&mut batch), Handed::Stopped)
                                {
                                    return;
                                }
                            }
                            other => break other,
                        }
                    };
                    if let Handed::Stopped = self.hand_over_batch(&mut batch) {
                        return;
                    }
                    if let Err(e) = end {
                        return self.failed(e.to_string());
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => {
                    return self.failed(format!("read failed at byte {}: {e}", decoder.position()))
                }
            }
        }
    }

    /// Accepts connections until an allowed one sends its first byte: that one is the
    /// front-end. Connections from elsewhere are closed at once; allowed ones that close
    /// having sent nothing are probes. `None`: the RU is done with the stream first.
    fn wait_for_front_end(
        &self,
        listener: &TcpListener,
    ) -> Result<Option<(TcpStream, SocketAddr)>, String> {
        let mut candidates: Vec<(TcpStream, SocketAddr)> = Vec::new();
        let mut refused_warn = LogLimit::new(WARN_EVERY);
        let mut probe_warn = LogLimit::new(WARN_EVERY);
        loop {
            if self.stopped() || self.draining() {
                return Ok(None);
            }
            let mut busy = false;
            match listener.accept() {
                Ok((s, peer)) => {
                    busy = true;
                    if !self.allowed(peer.ip()) {
                        reset(s);
                        self.shared.refused.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut g) = self.shared.last_refused.lock() {
                            *g = Some(peer);
                        }
                        if let Some(n) = refused_warn.tick() {
                            warn!(node = %self.node, "{}: connection from {peer} refused and closed: not in source.allow_from ({}){}", self.name, self.allow_text, more(n));
                        }
                    } else if s.set_nonblocking(true).is_ok() {
                        info!(node = %self.node, "{}: connection from {peer}: the front-end once it sends", self.name);
                        candidates.push((s, peer));
                        if candidates.len() > MAX_CANDIDATES {
                            let (s, old) = candidates.remove(0);
                            reset(s);
                            warn!(node = %self.node, "{}: {old} connected and sent nothing while {MAX_CANDIDATES} newer connections came: closed", self.name);
                        }
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock
                            | ErrorKind::Interrupted
                            | ErrorKind::ConnectionAborted
                            | ErrorKind::ConnectionReset
                    ) => {}
                Err(e) => return Err(format!("accept failed: {e}")),
            }
            let mut i = 0;
            while i < candidates.len() {
                let mut byte = [0u8; 1];
                match candidates[i].0.peek(&mut byte) {
                    Ok(0) => {
                        let (_, peer) = candidates.remove(i);
                        self.probe(peer, &mut probe_warn, "closed without sending anything");
                    }
                    Ok(_) => {
                        let (s, peer) = candidates.remove(i);
                        for (s, other) in candidates.drain(..) {
                            reset(s);
                            warn!(node = %self.node, "{}: {other} connected and sent nothing; {peer} sent first and is the front-end: {other} closed", self.name);
                        }
                        self.shared.silent.store(0, Ordering::Relaxed);
                        return Ok(Some((s, peer)));
                    }
                    Err(e)
                        if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) =>
                    {
                        i += 1
                    }
                    Err(e) => {
                        let (_, peer) = candidates.remove(i);
                        let why = format!("failed before sending anything ({e})");
                        self.probe(peer, &mut probe_warn, &why);
                    }
                }
            }
            self.shared
                .silent
                .store(candidates.len() as u64, Ordering::Relaxed);
            if let Ok(mut g) = self.shared.first_silent.lock() {
                *g = candidates.first().map(|c| c.1);
            }
            if !busy {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// An allowed connection that ended without a byte: not the front-end (a port check, a
    /// load balancer's probe); the stream goes on waiting for it.
    fn probe(&self, peer: SocketAddr, every: &mut LogLimit, what: &str) {
        self.shared.probes.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut g) = self.shared.last_probe.lock() {
            *g = Some(peer);
        }
        if let Some(n) = every.tick() {
            warn!(node = %self.node, "{}: {peer} connected and {what}: taken for a probe, not the front-end; still waiting for it{}", self.name, more(n));
        }
    }
}

/// Closes `s` with a reset (SO_LINGER 0): its peer's next read or write fails at once,
/// rather than reading an orderly end of stream, so a refused front-end knows.
fn reset(s: TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a descriptor `s` owns, with a linger struct of the size given.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(s);
}

/// Blocking reads that wake up to look at the stop flag.
fn prepare(s: &TcpStream) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(STOP_CHECK))?;
    s.set_nodelay(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_channel_holds_read_ahead_fragments_at_most() {
        for read_ahead in [0, 1, 2, 63, 64, 65, 100, 1024, 65536] {
            let (batch, places) = channel_shape(read_ahead);
            assert!((1..=BATCH).contains(&batch), "{read_ahead}");
            assert!(places >= 1, "{read_ahead}");
            assert!(
                batch * places <= read_ahead.max(1),
                "{read_ahead}: {batch} x {places}"
            );
        }
        // the default keeps its 1024 fragments, in 16 batches
        assert_eq!(channel_shape(1024), (64, 16));
        assert_eq!(channel_shape(1), (1, 1));
    }
}

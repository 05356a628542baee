//! Front-ends over TCP (`source.kind = "stream"`): an RU listens on one address per stream,
//! takes one front-end connection on each, and cuts what arrives into fragments
//! (`evb_formats::stream`) on a thread per stream. The driver pumps those fragments through
//! the assembler (`evb_builder::assembly`: checks, super-fragments, sync loss) into the RU's
//! live feed.
//!
//! Back-pressure: each stream's thread hands fragments over a channel of `source.read_ahead`
//! places and the driver takes them only while the assembler and the feed have room, so
//! when the RU's pool is full (nothing leaves the feed) the channel fills, the thread stops
//! reading, and TCP flow control holds the front-end. Nothing is dropped.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, SendTimeoutError, Sender, TryRecvError};
use evb_builder::assembly::{Assembler, AssemblyConfig, BadFragment, Piece, StreamName, SyncLoss};
use evb_builder::{Ru, RunState};
use evb_config::{Config, NodeSpec, OnError, OnSyncLoss, StreamFormat};
use evb_formats::stream::{self as fstream, StreamDecoder, StreamFragment};
use tracing::{error, info, warn};

/// How often a blocked stream thread looks at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// What a stream's thread tells the driver, in stream order.
enum StreamEvent {
    Connected(SocketAddr),
    Fragment(StreamFragment),
    /// The front-end closed the stream cleanly (between fragments).
    Closed,
    /// The stream cannot be read on: why.
    Failed(String),
}

struct Link {
    rx: Receiver<StreamEvent>,
    peer: Option<SocketAddr>,
    closed: bool,
    /// Since when the assembler has had nothing of this stream (None: it has something).
    empty_since: Option<Instant>,
    warned: bool,
}

/// The stream side of one RU: its listeners' threads and the assembler.
pub struct StreamSource {
    node: String,
    assembler: Assembler,
    links: Vec<Link>,
    read_ahead: usize,
    stall_warn: Duration,
    /// How long a stream may go without a front-end while the run is on (`run.connect_timeout_s`).
    connect_timeout: Duration,
    started: Instant,
    stop: Arc<AtomicBool>,
    over: bool,
}

impl StreamSource {
    /// Binds every stream address of RU `me` and starts a thread per stream.
    pub fn start(cfg: &Config, me: &NodeSpec, now: Instant) -> Result<StreamSource, String> {
        let s = &cfg.source;
        let (format, trigger_mask, trigger_name) = match s.format {
            StreamFormat::Fed => (fstream::StreamFormat::Fed, 0xff_ffff, "LV1 id"),
            StreamFormat::Framed => (fstream::StreamFormat::Framed, u32::MAX, "trigger number"),
        };
        let read_ahead = s.read_ahead as usize;
        let stop = Arc::new(AtomicBool::new(false));
        let mut links = Vec::new();
        let mut names = Vec::new();
        for (i, addr) in me.streams.iter().enumerate() {
            let source_id = me.stream_sources.get(i).copied().unwrap_or(me.source_id);
            let listener = TcpListener::bind(addr.as_str())
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .map_err(|e| format!("{}: cannot listen on {addr} for stream {i}: {e}", me.id))?;
            info!(node = %me.id, "stream {i} (source {source_id}) listening on {addr}");
            let (tx, rx) = bounded(read_ahead);
            let expected =
                (s.check_source_id && format == fstream::StreamFormat::Fed).then_some(source_id);
            let decoder = StreamDecoder::new(format, s.max_fragment as usize, expected);
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("{}-stream{i}", me.id))
                .spawn(move || read_stream(listener, decoder, tx, &stop))
                .map_err(|e| format!("{}: cannot start the thread of stream {i}: {e}", me.id))?;
            links.push(Link {
                rx,
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
        let assembler = Assembler::new(AssemblyConfig {
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
        });
        Ok(StreamSource {
            node: me.id.clone(),
            assembler,
            links,
            read_ahead,
            stall_warn: Duration::from_secs_f64(s.stall_warn_s),
            connect_timeout: Duration::from_secs_f64(cfg.run.connect_timeout_s),
            started: now,
            stop,
            over: false,
        })
    }

    /// Moves what the streams delivered into the RU's live feed, as far as there is room;
    /// stops the RU if a stream failed or the assembler refused an event.
    pub fn pump(&mut self, now: Instant, ru: &mut Ru) {
        if self.over || ru.state().is_over() {
            return;
        }
        if let Err(why) = self.take_from_streams(now) {
            return self.fail(ru, why);
        }
        let Some(feed) = ru.live_mut() else { return };
        while feed.queued() < self.read_ahead {
            match self.assembler.next_event() {
                Ok(Some(event)) => feed.supply(event),
                Ok(None) => break,
                Err(why) => return self.fail(ru, why),
            }
        }
        let in_channels: u64 = self.links.iter().map(|l| l.rx.len() as u64).sum();
        feed.stats.unbuilt = self.assembler.unbuilt() + in_channels;
        if self.assembler.exhausted() && !feed.is_done() {
            if feed.stats.unbuilt > 0 {
                warn!(node = %self.node, "a stream ended: {} fragments of the other streams belong to no event and are not built", feed.stats.unbuilt);
            }
            info!(node = %self.node, "streams ended after {} events", feed.supplied());
            feed.finish();
        }
        let st = self.assembler.stats();
        feed.stats.fragments_received = st.received;
        feed.stats.dropped = st.dropped;
        feed.stats.sync_losses = st.sync_losses;
        let running = ru.state() == RunState::Running;
        if running {
            if let Some(why) = self.front_end_missing(now) {
                return self.fail(ru, why);
            }
        }
        self.watch_stalls(now, running, ru);
    }

    /// A stream whose front-end has not connected within `run.connect_timeout_s` of the RU's
    /// start: an error that waiting will not mend (a wrong address, a front-end that is not
    /// there), so the run stops naming the stream instead of waiting for ever.
    fn front_end_missing(&self, now: Instant) -> Option<String> {
        if now.duration_since(self.started) < self.connect_timeout {
            return None;
        }
        let i = self
            .links
            .iter()
            .position(|l| l.peer.is_none() && !l.closed)?;
        Some(format!(
            "{}: no front-end connected within {:.1} s (run.connect_timeout_s)",
            self.assembler.describe(i),
            self.connect_timeout.as_secs_f64()
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
                    Ok(StreamEvent::Fragment(f)) => {
                        link.empty_since = None;
                        link.warned = false;
                        self.assembler.push(
                            i,
                            Piece {
                                trigger_number: f.trigger_number,
                                bytes: f.bytes,
                                offset: f.offset,
                                bad: f.bad,
                            },
                        );
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
            let what = match link.peer {
                Some(peer) => format!("no fragment from {peer}"),
                None => "no front-end connected".to_string(),
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
        if let Some(feed) = ru.live_mut() {
            feed.stats.waiting_for = waiting;
        }
    }

    fn fail(&mut self, ru: &mut Ru, why: String) {
        self.over = true;
        self.stop.store(true, Ordering::Relaxed);
        let reason = format!("{}: {why}", self.node);
        error!(node = %self.node, "{why}");
        ru.source_failed(reason);
    }
}

impl Drop for StreamSource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Hands `ev` to the driver, waiting while the channel is full (back-pressure); false when
/// the RU is done with this stream.
fn hand_over(tx: &Sender<StreamEvent>, mut ev: StreamEvent, stop: &AtomicBool) -> bool {
    loop {
        match tx.send_timeout(ev, STOP_CHECK) {
            Ok(()) => return true,
            Err(SendTimeoutError::Timeout(back)) if !stop.load(Ordering::Relaxed) => ev = back,
            Err(_) => return false,
        }
    }
}

/// One stream's thread: waits for its front-end, then reads and cuts fragments until the
/// stream ends, fails, or the RU stops.
fn read_stream(
    listener: TcpListener,
    mut decoder: StreamDecoder,
    tx: Sender<StreamEvent>,
    stop: &AtomicBool,
) {
    let (mut stream, peer) = loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        match listener.accept() {
            Ok(c) => break c,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => {
                hand_over(
                    &tx,
                    StreamEvent::Failed(format!("accept failed: {e}")),
                    stop,
                );
                return;
            }
        }
    };
    // One front-end per stream: a second connection is refused from now on.
    drop(listener);
    if let Err(e) = prepare(&stream) {
        hand_over(
            &tx,
            StreamEvent::Failed(format!("socket set-up: {e}")),
            stop,
        );
        return;
    }
    if !hand_over(&tx, StreamEvent::Connected(peer), stop) {
        return;
    }
    loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        match decoder.read_from(&mut stream) {
            Ok(0) => {
                let ev = match decoder.finish() {
                    Ok(()) => StreamEvent::Closed,
                    Err(e) => StreamEvent::Failed(e.to_string()),
                };
                hand_over(&tx, ev, stop);
                return;
            }
            Ok(_) => loop {
                match decoder.next_fragment() {
                    Ok(Some(f)) => {
                        if !hand_over(&tx, StreamEvent::Fragment(f), stop) {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        hand_over(&tx, StreamEvent::Failed(e.to_string()), stop);
                        return;
                    }
                }
            },
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e) => {
                let why = format!("read failed at byte {}: {e}", decoder.position());
                hand_over(&tx, StreamEvent::Failed(why), stop);
                return;
            }
        }
    }
}

/// Blocking reads that wake up to look at the stop flag.
fn prepare(s: &TcpStream) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(STOP_CHECK))?;
    s.set_nodelay(true)
}

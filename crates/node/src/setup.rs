//! From a validated configuration to one node's parts: its state machine, pools, sink and
//! transport settings.

use std::time::{Duration, Instant};

use evb_buffers::Pool;
use evb_builder::frames::{FrameGenerator, Slicing, Windows};
use evb_builder::{
    Bu, BuConfig, Content, CountingSink, DiscardSink, Evm, EvmConfig, Generator, Ru, RuConfig,
    Sink, SizeModel, Source, Verify,
};
use evb_config::{
    Config, Distribution, NodeSpec, Role, SinkKind, SourceKind, TransportKind, VerifyLevel,
};
use evb_messaging::{FlushPolicy, MessengerConfig};
use evb_wire::window::DecisionWindow;
use evb_wire::{Channel, Hello, FRAGMENT_PREFIX_LEN};

/// The state machine a node runs.
#[allow(clippy::large_enum_variant)] // one per node, made once: its size costs nothing
pub enum Logic {
    Evm(Evm),
    Ru(Ru),
    Bu(Bu, Box<dyn Sink>),
}

pub fn generator(cfg: &Config) -> Generator {
    generator_of(&cfg.fragments, cfg.run.seed)
}

fn generator_of(f: &evb_config::FragmentSection, seed: u64) -> Generator {
    let sizes = match f.distribution {
        Distribution::Fixed => SizeModel::Fixed(f.size as usize),
        Distribution::Lognormal => SizeModel::LogNormal {
            mean: f.size as f64,
            stddev: if f.stddev == 0 {
                f.size as f64
            } else {
                f.stddev as f64
            },
            min: f.min.max(1) as usize,
            max: f.max_size() as usize,
        },
    };
    let content = match f.content {
        evb_config::Content::Unique => Content::Unique,
        evb_config::Content::Static => Content::Static,
    };
    Generator::new(sizes, seed).with_content(content)
}

/// The generator's time frames and the slicing or the windows, when the run builds by time
/// (`Err`: the file of decisions cannot be read, or lists too few).
pub fn frame_generator(cfg: &Config) -> Result<Option<FrameGenerator>, String> {
    if !cfg.by_time() {
        return Ok(None);
    }
    let mut sizes = generator_of(&cfg.frames.as_fragments(), cfg.run.seed);
    if let SizeModel::LogNormal { min, .. } = &mut sizes.sizes {
        *min = cfg.frames.min as usize; // a frame may be empty
    }
    let f = FrameGenerator::new(
        sizes,
        cfg.frames.ticks,
        Slicing {
            slice: cfg.builder.slice_ticks,
            overlap: cfg.builder.overlap_ticks,
            t0: cfg.frames.first_tick,
        },
    );
    if cfg.builder.by != evb_config::BuildBy::Window {
        return Ok(Some(f));
    }
    let w = &cfg.windows;
    let listed = if w.decisions.is_empty() {
        None
    } else {
        let list = read_decisions(std::path::Path::new(&w.decisions))?;
        if (list.len() as u64) < cfg.run.events {
            return Err(format!(
                "windows.decisions: {} lists {} decisions, and run.events asks for {}",
                w.decisions,
                list.len(),
                cfg.run.events
            ));
        }
        let sources = cfg.ru_source_ids();
        if let Some((k, s)) = list.iter().enumerate().find_map(|(k, d)| {
            d.components
                .iter()
                .find(|s| !sources.contains(s))
                .map(|&s| (k, s))
        }) {
            return Err(format!(
                "windows.decisions: decision {k} of {} names source {s}, which no RU of the \
                 run reads (their source ids: {sources:?})",
                w.decisions
            ));
        }
        Some(list.into())
    };
    Ok(Some(f.with_windows(Windows {
        listed,
        seed: cfg.run.seed,
        rate_hz: cfg.run.rate_hz,
        tick_hz: w.tick_hz,
        before: w.before_ticks,
        after: w.after_ticks,
        delay_min: w.delay_min_ticks,
        delay_max: w.delay_max_ticks,
        buffer_ticks: (w.buffer_ms as u128 * w.tick_hz as u128 / 1000) as u64,
        wait: Duration::from_millis(w.wait_ms),
        outside: w.outside,
        t0: cfg.frames.first_tick,
        decided: Default::default(),
    })))
}

/// A file of trigger decisions (docs/formats.md §8): a line `begin end` in ticks each
/// (`end` after `begin`), over every source, or `begin end 3,9` over the sources listed;
/// blank lines and lines from `#` on ignored. An error names the file and line.
pub fn read_decisions(path: &std::path::Path) -> Result<Vec<DecisionWindow>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("windows.decisions: cannot read {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |why: &str| format!("{}:{}: {why}: {line:?}", path.display(), n + 1);
        let mut words = line.split_whitespace();
        let mut tick = || -> Result<u64, String> {
            words
                .next()
                .ok_or_else(|| bad("a decision is `begin end` in ticks"))?
                .parse::<u64>()
                .map_err(|_| bad("not a tick (an unsigned integer)"))
        };
        let (begin, end) = (tick()?, tick()?);
        let components = match words.next() {
            Some(list) => DecisionWindow::parse_components(list).map_err(|e| bad(&e))?,
            None => Vec::new(),
        };
        if words.next().is_some() {
            return Err(bad(
                "a decision is `begin end` in ticks and, for some sources only, their ids \
                 separated by commas; nothing more",
            ));
        }
        if end <= begin || end > 1 << 62 {
            return Err(bad(
                "the window's end must come after its begin (and below 2^62)",
            ));
        }
        out.push(DecisionWindow::new(begin, end, components).map_err(|e| bad(&e))?);
    }
    if out.is_empty() {
        return Err(format!(
            "windows.decisions: {} lists no decision",
            path.display()
        ));
    }
    Ok(out)
}

/// What a run's records are, as its files name them.
fn record_type(cfg: &Config) -> &'static str {
    match cfg.builder.by {
        evb_config::BuildBy::Event => "event",
        evb_config::BuildBy::Time => "slice",
        evb_config::BuildBy::Window => "window",
    }
}

/// Where a node listens: its configured address, or a name in the process for `inproc`.
pub fn address(cfg: &Config, n: &NodeSpec) -> String {
    match cfg.transport.kind {
        TransportKind::Tcp | TransportKind::Ofi | TransportKind::Shm => n.addr.clone(),
        TransportKind::Inproc => format!("inproc:{}/{}", cfg.run.id, n.id),
    }
}

pub fn wire_role(r: Role) -> evb_wire::Role {
    match r {
        Role::Evm => evb_wire::Role::Evm,
        Role::Ru => evb_wire::Role::Ru,
        Role::Bu => evb_wire::Role::Bu,
    }
}

/// The Hello this node sends on every connection it makes or accepts; a BU's names its
/// incarnation (`incarnation`, see [`incarnation`]; 0 for the others).
pub fn hello(cfg: &Config, me: &NodeSpec, channel: Channel, incarnation: u16) -> Hello {
    Hello::new(channel, wire_role(me.role), me.index, &cfg.run.id, &me.id)
        .with_incarnation(incarnation)
}

/// A BU's incarnation (docs/protocol.md §3): 1…65535, drawn at random when its part of a
/// run starts, so that a restarted BU is told from the process it replaces. Without OS
/// randomness, the process id and the clock's nanoseconds make it.
pub fn incarnation() -> u16 {
    let drawn = evb_transport::random_hex(2).and_then(|h| u16::from_str_radix(&h, 16).ok());
    let n = drawn.unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        (std::process::id() ^ nanos ^ (nanos >> 16)) as u16
    });
    n.max(1)
}

/// Consecutive events per assignment. Generated events: enough to fill a page with small
/// events, one for large. Recorded, streamed or produced fragments: their sizes are not known
/// before they come, only their limit (`source.max_fragment`), which sizes the default
/// credits; a quarter of those. (Sizing by `fragments.size`, the generator's, made every
/// assignment of a stream-fed run one event: four messages from the EVM per event.)
pub fn assign_batch(cfg: &Config, n_ru: u64) -> u32 {
    if cfg.builder.batch > 0 {
        return cfg.builder.batch;
    }
    if cfg.source.kind != SourceKind::Generator {
        return (cfg.default_credits() / 4).clamp(1, 1024);
    }
    let fragment = if cfg.by_time() {
        // a record's window holds about its length / frame ticks frames
        let b = &cfg.builder;
        let ticks = match b.by {
            evb_config::BuildBy::Window => cfg.windows.before_ticks + cfg.windows.after_ticks,
            _ => b.slice_ticks + b.overlap_ticks,
        };
        let frames = ticks / cfg.frames.ticks.max(1);
        frames.max(1) * (cfg.frames.size + 32) + 32
    } else {
        cfg.fragments.size
    };
    let event = (fragment + FRAGMENT_PREFIX_LEN as u64) * n_ru.max(1);
    (cfg.messaging.page_size / event).clamp(1, 1024) as u32
}

// the configuration sizes slots and blocks with the wire's prefix
const _: () = assert!(evb_config::FRAGMENT_PREFIX_BYTES as usize == FRAGMENT_PREFIX_LEN);

/// Most bytes in one run of fragments an RU sends as one piece: a page, and no more than a
/// barrel-shifter slot carries.
pub fn max_run_bytes(cfg: &Config) -> usize {
    let mut max = cfg.messaging.page_size;
    if cfg.traffic.shaping == evb_config::Shaping::Barrel {
        max = max.min(cfg.slot_bytes());
    }
    max as usize
}

/// Largest frame a peer may send: a full page plus one maximal fragment, as large as the
/// configured source can make (the generator's largest size, or `source.max_fragment` for
/// recorded data: playback refuses anything larger).
pub fn max_frame(cfg: &Config) -> u32 {
    let f = cfg
        .max_fragment()
        .saturating_add(FRAGMENT_PREFIX_LEN as u64);
    cfg.messaging
        .page_size
        .saturating_add(f)
        .saturating_add(65_536)
        .min(u32::MAX as u64) as u32
}

pub fn messenger_config(cfg: &Config) -> MessengerConfig {
    MessengerConfig {
        page_size: cfg.messaging.page_size as usize,
        max_pieces: 64,
        flush: if cfg.messaging.flush_us == 0 {
            FlushPolicy::EndOfPass
        } else {
            FlushPolicy::After(Duration::from_micros(cfg.messaging.flush_us))
        },
    }
}

/// The receive pool (every node has one) and the RU's fragment pool, as
/// [`Config::pool_plan`] sizes them (what the memory check adds up).
pub fn pools(cfg: &Config, me: &NodeSpec) -> Result<(Pool, Option<Pool>), String> {
    let plan = cfg.pool_plan(me.role).map_err(|e| e.to_string())?;
    let size = |n: u64, what: &str| {
        usize::try_from(n).map_err(|_| format!("{}: {what} of {n} is too large", me.id))
    };
    let block = size(plan.block_size, "a block")?;
    let rx_blocks = size(plan.rx_blocks, "a receive pool")?;
    let rx = Pool::new(&format!("{}-rx", me.id), block, rx_blocks);
    if me.role != Role::Ru {
        return Ok((rx, None));
    }
    let name = format!("{}-frag", me.id);
    let n = size(plan.fragment_blocks, "a fragment pool")?;
    // Over shm the fragments live where the BUs can read them in place.
    let shm =
        cfg.transport.kind == TransportKind::Shm || cfg.transport.local == Some(TransportKind::Shm);
    let pool = if shm {
        Pool::new_shared(&name, block, n)
            .map_err(|e| format!("cannot make a shared pool of {n} blocks: {e}"))?
    } else {
        Pool::new(&name, block, n)
    };
    Ok((rx, Some(pool)))
}

/// Builds the node's state machine, loading and checking its data source or opening its sink.
pub fn logic(
    cfg: &Config,
    me: &NodeSpec,
    ru_pool: Option<Pool>,
    now: Instant,
    plugged_sink: Option<Box<dyn Sink>>,
) -> Result<Logic, String> {
    let nodes = cfg.nodes();
    let rus: Vec<&NodeSpec> = nodes.iter().filter(|n| n.role == Role::Ru).collect();
    let n_bu = nodes.iter().filter(|n| n.role == Role::Bu).count() as u16;
    Ok(match me.role {
        Role::Evm => {
            let r = &cfg.run;
            let mut evm = Evm::new(
                EvmConfig {
                    n_ru: rus.len() as u16,
                    n_bu,
                    max_events: (r.events > 0).then_some(r.events),
                    duration: (r.duration_s > 0.0).then(|| Duration::from_secs_f64(r.duration_s)),
                    rate_hz: (r.rate_hz > 0.0).then_some(r.rate_hz),
                    batch: assign_batch(cfg, rus.len() as u64),
                    stall_timeout: Duration::from_secs_f64(r.stall_timeout_s),
                    max_per_poll: 4096,
                    on_ru_loss: match cfg.builder.on_ru_loss {
                        evb_config::RuLossPolicy::Stop => evb_builder::RuLossPolicy::Stop,
                        evb_config::RuLossPolicy::Partial => evb_builder::RuLossPolicy::Partial,
                    },
                    assignment: match cfg.builder.assignment {
                        evb_config::Assignment::Credits => evb_builder::Assignment::Credits,
                        evb_config::Assignment::Random => evb_builder::Assignment::Random,
                    },
                    link_grace: Duration::from_millis(r.heartbeat_timeout_ms),
                    commits: nodes
                        .iter()
                        .filter(|n| n.role == Role::Bu)
                        .map(|n| n.sink.commits())
                        .collect(),
                    spares: nodes
                        .iter()
                        .filter(|n| n.role == Role::Bu)
                        .map(|n| n.spare)
                        .collect(),
                },
                now,
            );
            if cfg.builder.by == evb_config::BuildBy::Window && cfg.windows.outside {
                // a record per decision from outside (`evb ctl decide`)
                evm.take_decisions_from_outside();
            }
            Logic::Evm(evm)
        }
        Role::Ru => Logic::Ru(
            Ru::new(
                RuConfig {
                    index: me.index,
                    source_id: me.source_id,
                    source: match cfg.source.kind {
                        SourceKind::Generator => match frame_generator(cfg)? {
                            Some(f) => Source::Frames(f),
                            None => Source::Generator(generator(cfg)),
                        },
                        SourceKind::Stream | SourceKind::Api => {
                            let mut feed = evb_builder::LiveFeed::default();
                            if cfg.by_time() {
                                // decision windows over the stream: its latency buffer
                                let windows = frame_generator(cfg)?.and_then(|f| f.windows);
                                feed.windows = windows.map(|w| {
                                    evb_builder::window_buffer::WindowBuffer::new(
                                        w,
                                        cfg.frames.ticks,
                                        &me.time_sources(),
                                        cfg.windows.buffer_bytes,
                                    )
                                });
                            }
                            Source::Live(feed)
                        }
                        _ => Source::Playback(crate::playback::load(cfg, me)?),
                    },
                    max_per_poll: 256,
                    max_run_bytes: max_run_bytes(cfg),
                },
                ru_pool.expect("an RU has a fragment pool"),
            )
            .with_bus(n_bu),
        ),
        Role::Bu => {
            let verify = match cfg.builder.verify {
                VerifyLevel::Headers => Verify::Headers,
                VerifyLevel::Crc => Verify::Crc,
                VerifyLevel::Full => Verify::Full,
            };
            if plugged_sink.is_some() && me.sink != SinkKind::Api {
                return Err(format!(
                    "{}: a consumer is plugged in, but its sink is not \"api\"",
                    me.id
                ));
            }
            let sink: Box<dyn Sink> = match me.sink {
                SinkKind::Api => plugged_sink.ok_or_else(|| {
                    format!(
                        "{}: sink \"api\": this BU hands its events to a consumer program \
                         through the plug-in API (evb_plugin::Consumer or libevb), not as `evb node`",
                        me.id
                    )
                })?,
                SinkKind::Serve => {
                    let s = &cfg.sink;
                    Box::new(crate::serve_sink::ServeSink::start(
                        crate::serve_sink::ServeOptions {
                            listen: cfg.serve_addr(me.index),
                            run_id: cfg.run.id.clone(),
                            bu_id: me.id.clone(),
                            bu_index: me.index,
                            max_held: s.serve_max_held,
                            hold: if s.serve_hold == 0 {
                                (me.credits / 2).max(1) as usize
                            } else {
                                s.serve_hold as usize
                            },
                            ack_timeout: Duration::from_secs_f64(s.serve_ack_timeout_s),
                            drain_timeout: Duration::from_secs_f64(s.serve_drain_timeout_s),
                            secret: cfg.secret().map(String::into_bytes),
                        },
                    )?)
                }
                SinkKind::Discard => Box::new(DiscardSink),
                SinkKind::Count => Box::new(CountingSink::default()),
                SinkKind::File | SinkKind::Hdf5 => Box::new(crate::file_sink::FileSink::new(
                    std::path::PathBuf::from(&cfg.sink.dir),
                    file_format(me.sink, &cfg.sink, record_type(cfg))?,
                    &cfg.run.id,
                    me.index,
                    cfg.sink.file_max_events,
                    cfg.sink.file_max_mib << 20,
                    crate::file_sink::CommitInterval {
                        events: cfg.commit_events(me),
                        time: Duration::from_millis(cfg.sink.commit_ms),
                    },
                    cfg.output_file_mode(),
                )?
                .payload_crcs_checked(cfg.builder.verify != VerifyLevel::Headers)
                .dropping_pages(!cfg.sink.keep_in_page_cache)),
            };
            let sink: Box<dyn Sink> = match me.sink_delay {
                Some((us, events)) => Box::new(SlowSink {
                    inner: sink,
                    delay: Duration::from_micros(us),
                    left: (events > 0).then_some(events),
                }),
                None => sink,
            };
            let mut b = Bu::new(BuConfig {
                index: me.index,
                source_ids: rus.iter().map(|r| r.source_id).collect(),
                credits: me.credits,
                verify,
                generator: Some(generator(cfg)),
                slices: frame_generator(cfg)?,
                // about the last 65 536 events this BU built, with events spread over
                // every BU
                duplicate_window: (1 << 16) * n_bu.max(1) as usize,
            });
            // a sink that drops or counts events takes them as spans: the BU joins the
            // regular ones without a record each (evb_builder's join)
            b.set_join(sink.takes_spans());
            Logic::Bu(b, sink)
        }
    })
}

/// Testing back-pressure: a sink that takes `delay` per event, for the first events.
struct SlowSink {
    inner: Box<dyn Sink>,
    delay: Duration,
    /// Events still to slow down (`None`: all).
    left: Option<u64>,
}

impl Sink for SlowSink {
    fn deliver(&mut self, event: &evb_builder::BuiltEvent) -> Result<(), evb_builder::SinkError> {
        if self.left != Some(0) {
            std::thread::sleep(self.delay);
            self.left = self.left.map(|k| k - 1);
        }
        self.inner.deliver(event)
    }
    fn accepted(&mut self, first: u64, count: u32) -> Result<(), evb_builder::SinkError> {
        self.inner.accepted(first, count)
    }
    fn finish(&mut self) -> Result<(), evb_builder::SinkError> {
        self.inner.finish()
    }
    fn commits(&self) -> bool {
        self.inner.commits()
    }
    fn prepare(
        &mut self,
        now: Instant,
    ) -> Result<Vec<evb_builder::PreparedPart>, evb_builder::SinkError> {
        self.inner.prepare(now)
    }
    fn publish(&mut self, part: u32) -> Result<(), evb_builder::SinkError> {
        self.inner.publish(part)
    }
    fn publishes_later(&self) -> bool {
        self.inner.publishes_later()
    }
    fn published(&mut self) -> Vec<u32> {
        self.inner.published()
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn retry_after(&self) -> Duration {
        self.inner.retry_after()
    }
    fn busy_is_news(&self) -> bool {
        self.inner.busy_is_news()
    }
    fn report(&self) -> serde_json::Value {
        self.inner.report()
    }
    fn outstanding(&self) -> u64 {
        self.inner.outstanding()
    }
    fn drain_timeout(&self) -> Duration {
        self.inner.drain_timeout()
    }
    fn close_output(&mut self) -> u64 {
        self.inner.close_output()
    }
}

/// The layout a BU's file sink writes (`sink.kind` "file" or "hdf5").
fn file_format(
    kind: SinkKind,
    s: &evb_config::SinkSection,
    record_type: &'static str,
) -> Result<crate::file_sink::FileFormat, String> {
    use crate::file_sink::FileFormat;
    let deflate = s.hdf5_deflate;
    match kind {
        #[cfg(feature = "hdf5")]
        SinkKind::Hdf5 => {
            if deflate > 0 && !evb_formats::hdf5_events::deflate_available() {
                return Err("sink.hdf5_deflate: this HDF5 library has no deflate filter".into());
            }
            Ok(FileFormat::Hdf5 {
                deflate: (deflate > 0).then_some(deflate),
                record_type,
                layout: match s.hdf5_layout {
                    evb_config::Hdf5Layout::Evb => evb_formats::hdf5_events::Hdf5Layout::Evb,
                    evb_config::Hdf5Layout::Dune => evb_formats::hdf5_events::Hdf5Layout::Dune,
                    evb_config::Hdf5Layout::Packed => evb_formats::hdf5_events::Hdf5Layout::Packed,
                },
            })
        }
        #[cfg(not(feature = "hdf5"))]
        SinkKind::Hdf5 => {
            let _ = (deflate, record_type);
            Err("sink.kind = \"hdf5\": this evb was built without HDF5 (--features hdf5)".into())
        }
        _ if s.compress == evb_config::Compress::Zstd => {
            Ok(FileFormat::EvbZstd(s.compress_level.unwrap_or(3)))
        }
        _ => Ok(FileFormat::Evb),
    }
}

#[cfg(test)]
mod tests {
    use evb_config::{Config, Role, SourceKind};

    use super::*;

    /// The frame limit follows the largest fragment the source can make: for recorded data
    /// `source.max_fragment`, however small the generator's `fragments.size` (issue #16).
    #[test]
    fn max_frame_holds_the_largest_recorded_fragment() {
        let mut cfg = Config::default();
        cfg.fragments.size = 1024;
        cfg.source.kind = SourceKind::Framed;
        cfg.source.max_fragment = 4 << 20;
        let one_fragment = cfg.source.max_fragment + FRAGMENT_PREFIX_LEN as u64;
        assert!(max_frame(&cfg) as u64 >= cfg.messaging.page_size + one_fragment);
        cfg.source.kind = SourceKind::Generator;
        assert!(
            (max_frame(&cfg) as u64) < 1 << 20,
            "the generator's 1 KiB fragments"
        );
    }

    /// A stream-fed (or recorded, or produced) run's assignments are not sized by the
    /// generator's `fragments.size`, which its fragments do not have: the default 512 KiB
    /// made every assignment one event. They take a quarter of the default credits; the
    /// generator's still fill a page; `builder.batch` still wins.
    #[test]
    fn assignments_of_fragments_not_generated_are_not_sized_by_the_generator() {
        let mut cfg = Config::default();
        let rus = 2;
        assert_eq!(
            cfg.fragments.size,
            512 << 10,
            "the default this guards against"
        );
        for kind in [SourceKind::Stream, SourceKind::Fed, SourceKind::Api] {
            cfg.source.kind = kind;
            // credits: 16 MiB over two fragments of max_fragment + 64, within 16 ..= 4096
            for (max_fragment, batch) in [(1024, 1024), (65536, 31), (1 << 20, 4)] {
                cfg.source.max_fragment = max_fragment;
                assert_eq!(
                    assign_batch(&cfg, rus),
                    batch,
                    "{kind:?}, max_fragment {max_fragment}: credits {}",
                    cfg.default_credits()
                );
            }
        }
        cfg.source.kind = SourceKind::Generator;
        assert_eq!(
            assign_batch(&cfg, rus),
            1,
            "two 512 KiB fragments: one per page"
        );
        cfg.fragments.size = 256;
        assert_eq!(
            assign_batch(&cfg, rus),
            (cfg.messaging.page_size / (2 * (256 + FRAGMENT_PREFIX_LEN as u64))) as u32
        );
        cfg.builder.batch = 7;
        cfg.source.kind = SourceKind::Stream;
        assert_eq!(assign_batch(&cfg, rus), 7);
    }

    /// Pool sizes that overflow are an error naming the key, not a panic (a configuration
    /// made in code need not have been validated).
    #[test]
    fn overflowing_pools_are_an_error() {
        let mut cfg = Config::default();
        cfg.builder.credits = u32::MAX;
        cfg.topology.bus = 4096;
        cfg.fragments.size = 256 << 20;
        let ru = cfg
            .nodes()
            .into_iter()
            .find(|n| n.role == Role::Ru)
            .unwrap();
        match pools(&cfg, &ru) {
            Err(e) => assert!(e.contains("builder.credits"), "{e}"),
            Ok(_) => panic!("pools of 2^32 credits x 4096 BUs x 256 MiB made"),
        }
    }
}

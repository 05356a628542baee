//! Building by time (`builder.by = "time"` or `"window"`): the checks of the slicing, the
//! windows and the generator's frames, and the size of the largest window fragment they make.

use crate::limits::MAX_FRAGMENT;
use crate::{
    int_in, invalid, BuildBy, BuilderSection, Config, ConfigError, Distribution, FragmentSection,
    FramesSection, OnError, OnSyncLoss, SourceKind, StreamFormat, WindowsSection,
};

/// Most ticks in a frame, a slice or an overlap (2^40: 18 minutes of nanoseconds, 5 hours
/// of DUNE's 62.5 MHz clock), which keeps every tick of a long run clear of overflow.
pub const MAX_TICKS: u64 = 1 << 40;
/// Most frames one window may hold (docs/protocol.md §10.2).
pub const MAX_WINDOW_FRAMES: u64 = 1 << 20;
/// Window fragment header, directory entry and time frame header (docs/protocol.md §10).
const WINDOW_HEADER: u64 = 32;
const PER_FRAME: u64 = 8 + 24;

impl FramesSection {
    /// The frames' sizes as the generator reads fragment sizes (its content unique).
    pub fn as_fragments(&self) -> FragmentSection {
        FragmentSection {
            size: self.size,
            distribution: self.distribution,
            stddev: self.stddev,
            min: self.min,
            max: self.max,
            content: self.content,
        }
    }
}

impl Config {
    /// Records are cut from the frames' time: slices (`"time"`) or windows (`"window"`).
    pub fn by_time(&self) -> bool {
        matches!(self.builder.by, BuildBy::Time | BuildBy::Window)
    }

    /// Most frames in one record's window fragment: those beginning in a slice and its
    /// overlap, or those overlapping a triggered window.
    pub fn max_window_frames(&self) -> u64 {
        let f = self.frames.ticks.max(1);
        match self.builder.by {
            BuildBy::Window => {
                let w = &self.windows;
                let longest = if w.outside {
                    w.longest_ticks
                } else {
                    w.before_ticks.saturating_add(w.after_ticks)
                };
                longest.div_ceil(f) + 2
            }
            _ => {
                let b = &self.builder;
                (b.slice_ticks.saturating_add(b.overlap_ticks)).div_ceil(f) + 1
            }
        }
    }

    /// The largest window fragment an RU makes of one record: of the generator's frames,
    /// or of a live stream's (each at most `source.max_fragment`, its header included);
    /// an RU of k streams sends a super-fragment of k of them.
    pub fn max_window_fragment(&self) -> u64 {
        self.window_fragment_of_frames(self.max_window_frames())
    }

    /// The largest window fragment of a window `ticks` long (a file of decisions gives its
    /// own windows, which the extents in `[windows]` do not bound: `evb config check` reads
    /// the file and says this of its longest).
    pub fn window_fragment_of(&self, ticks: u64) -> u64 {
        self.window_fragment_of_frames(ticks.div_ceil(self.frames.ticks.max(1)) + 2)
    }

    fn window_fragment_of_frames(&self, frames: u64) -> u64 {
        let per_frame = match self.source.kind {
            SourceKind::Stream | SourceKind::Api => 8u64.saturating_add(self.source.max_fragment),
            _ => PER_FRAME.saturating_add(self.frames.as_fragments().max_size()),
        };
        let one = frames
            .saturating_mul(per_frame)
            .saturating_add(WINDOW_HEADER);
        let k = self
            .ru
            .iter()
            .map(|r| r.streams.len().max(r.producer_sources.len()))
            .max()
            .unwrap_or(1) as u64;
        if k < 2 {
            return one;
        }
        // the super-fragment's header and directory (docs/formats.md §4)
        one.saturating_mul(k).saturating_add(8 + 16 * k)
    }
}

/// A front-end stream of frames, built into time slices or decision windows: one stream per
/// RU, frames that stop the run when bad (no record is built over a hole), and nothing else
/// that would be ignored.
fn validate_live(c: &Config) -> Result<(), ConfigError> {
    let s = &c.source;
    if s.kind == SourceKind::Stream && s.format != StreamFormat::Frames {
        return Err(invalid(
            "source.format",
            "a stream built by time carries timestamped frames: set it to \"frames\"",
        ));
    }
    if s.on_error != OnError::Stop {
        return Err(invalid(
            "source.on_error",
            "by time a bad frame stops the run (a slice is never built over a hole): \
             only \"stop\"",
        ));
    }
    if s.on_sync_loss != OnSyncLoss::Stop {
        return Err(invalid(
            "source.on_sync_loss",
            "by time there are no trigger numbers to lose sync on: only \"stop\"",
        ));
    }
    for (i, ru) in c.ru.iter().enumerate() {
        let source_id = ru.source_id.unwrap_or(i as u16);
        // several streams: each its own source (`stream_sources`, checked with the streams)
        if ru.streams.len() < 2 && ru.stream_sources.iter().any(|&s| s != source_id) {
            return Err(invalid(
                format!("ru[{i}].stream_sources"),
                "by time the stream's frames carry the RU's source_id: set that instead",
            ));
        }
    }
    Ok(())
}

pub(crate) fn validate(c: &Config) -> Result<(), ConfigError> {
    if c.source.kind == SourceKind::Stream
        && c.source.format == StreamFormat::Frames
        && !c.by_time()
    {
        return Err(invalid(
            "source.format",
            "\"frames\" are built by time: set builder.by = \"time\"",
        ));
    }
    let b = &c.builder;
    let d = BuilderSection::default();
    for (key, set, applies) in [
        (
            "builder.slice_ticks",
            b.slice_ticks != d.slice_ticks,
            b.by == BuildBy::Time,
        ),
        (
            "builder.overlap_ticks",
            b.overlap_ticks != d.overlap_ticks,
            b.by == BuildBy::Time,
        ),
        (
            "windows",
            c.windows != WindowsSection::default(),
            b.by == BuildBy::Window,
        ),
        ("frames", c.frames != FramesSection::default(), c.by_time()),
    ] {
        if set && !applies {
            let to = match key {
                "windows" => "builder.by = \"window\"",
                "frames" => "builder.by = \"time\" or \"window\"",
                _ => "builder.by = \"time\"",
            };
            return Err(invalid(key, format!("applies only to {to}")));
        }
    }
    if !c.by_time() {
        return Ok(());
    }
    let live = matches!(c.source.kind, SourceKind::Stream | SourceKind::Api);
    if !live && c.source.kind != SourceKind::Generator {
        return Err(invalid(
            "builder.by",
            "building by time reads the generator's frames, front-end streams of frames or a \
             plug-in producer's frames (source.kind = \"generator\", \"stream\" or \"api\"); \
             recordings build by \"event\"",
        ));
    }
    if live {
        validate_live(c)?;
    }
    if c.fragments != FragmentSection::default() {
        return Err(invalid(
            "fragments",
            "sizes a record's fragments under builder.by = \"event\"; by time the \
             generator makes [frames] (frames.size, frames.ticks)",
        ));
    }
    int_in("frames.ticks", c.frames.ticks, 1, MAX_TICKS, " ticks")?;
    int_in(
        "frames.first_tick",
        c.frames.first_tick,
        0,
        1 << 62,
        " ticks",
    )?;
    if !c.frames.first_tick.is_multiple_of(c.frames.ticks) {
        return Err(invalid(
            "frames.first_tick",
            format!(
                "{} is not a multiple of frames.ticks = {}: frames begin on the run's frame \
                 grid",
                c.frames.first_tick, c.frames.ticks
            ),
        ));
    }
    if b.by == BuildBy::Window {
        validate_windows(c)?;
        validate_buffer_bytes(c, live)?;
    } else {
        int_in("builder.slice_ticks", b.slice_ticks, 1, MAX_TICKS, " ticks")?;
        int_in(
            "builder.overlap_ticks",
            b.overlap_ticks,
            0,
            b.slice_ticks,
            " ticks: at most builder.slice_ticks",
        )?;
    }
    let f = &c.frames;
    int_in("frames.size", f.size, 1, MAX_FRAGMENT, " bytes")?;
    for (key, v) in [
        ("frames.stddev", f.stddev),
        ("frames.min", f.min),
        ("frames.max", f.max),
    ] {
        int_in(key, v, 0, MAX_FRAGMENT, " bytes")?;
    }
    if f.distribution == Distribution::Lognormal {
        if f.max != 0 && f.max < f.size {
            return Err(invalid("frames.max", "must be at least frames.size"));
        }
        if f.min > f.size {
            return Err(invalid("frames.min", "must not exceed frames.size"));
        }
    } else {
        for (k, v) in [
            ("frames.stddev", f.stddev),
            ("frames.min", f.min),
            ("frames.max", f.max),
        ] {
            if v != 0 {
                return Err(invalid(k, "only applies to distribution = \"lognormal\""));
            }
        }
    }
    let n = c.max_window_frames();
    if n > MAX_WINDOW_FRAMES {
        return Err(invalid(
            if b.by == BuildBy::Window {
                "windows.after_ticks"
            } else {
                "builder.slice_ticks"
            },
            format!(
                "a record's window holds up to {n} frames of frames.ticks = {}; at most \
                 {MAX_WINDOW_FRAMES}",
                f.ticks
            ),
        ));
    }
    let bytes = c.max_window_fragment();
    if bytes > MAX_FRAGMENT {
        return Err(invalid(
            if live {
                "source.max_fragment"
            } else {
                "frames.size"
            },
            format!(
                "a record's fragment can reach {bytes} bytes ({n} frames); at most \
                 {MAX_FRAGMENT}: shorten the slices or windows, or the frames"
            ),
        ));
    }
    Ok(())
}

fn validate_windows(c: &Config) -> Result<(), ConfigError> {
    let w = &c.windows;
    if w.outside {
        return validate_outside(c);
    }
    if w.longest_ticks != 0 {
        return Err(invalid(
            "windows.longest_ticks",
            "bounds the windows of decisions from outside: only with windows.outside = true",
        ));
    }
    if c.run.rate_hz <= 0.0 {
        return Err(invalid(
            "run.rate_hz",
            "must be set under builder.by = \"window\": the trigger decisions come at this rate",
        ));
    }
    int_in("windows.tick_hz", w.tick_hz, 1, 1_000_000_000_000, " Hz")?;
    int_in(
        "windows.before_ticks",
        w.before_ticks,
        0,
        MAX_TICKS,
        " ticks",
    )?;
    int_in("windows.after_ticks", w.after_ticks, 0, MAX_TICKS, " ticks")?;
    if w.before_ticks + w.after_ticks == 0 {
        return Err(invalid(
            "windows.after_ticks",
            "a window must be at least one tick long (before_ticks + after_ticks > 0)",
        ));
    }
    for (key, v) in [
        ("windows.delay_min_ticks", w.delay_min_ticks),
        ("windows.delay_max_ticks", w.delay_max_ticks),
    ] {
        if v.unsigned_abs() > MAX_TICKS {
            return Err(invalid(
                key,
                format!("{v} is out of range (-2^40 ..= 2^40 ticks)"),
            ));
        }
    }
    if w.delay_min_ticks > w.delay_max_ticks {
        return Err(invalid(
            "windows.delay_max_ticks",
            "must be at least windows.delay_min_ticks",
        ));
    }
    if !w.decisions.is_empty() {
        if let Some(key) = seeded_key_set(w) {
            return Err(invalid(
                key,
                "does nothing with windows.decisions: the file gives every window",
            ));
        }
        if c.run.events == 0 {
            return Err(invalid(
                "run.events",
                "must say how many of windows.decisions' decisions the run builds",
            ));
        }
    }
    int_in("windows.buffer_ms", w.buffer_ms, 1, 3_600_000, " ms")?;
    int_in("windows.wait_ms", w.wait_ms, 0, 10_000, " ms")?;
    Ok(())
}

/// A bound in bytes holds what a live stream's frames fill; the generator's frames are
/// made again when asked for, so its latency buffer is a rule in time and holds no bytes.
fn validate_buffer_bytes(c: &Config, live: bool) -> Result<(), ConfigError> {
    let bytes = c.windows.buffer_bytes;
    if bytes == 0 {
        return Ok(());
    }
    if !live {
        return Err(invalid(
            "windows.buffer_bytes",
            "bounds the latency buffer of a live stream or producer of frames (source.kind = \
             \"stream\" or \"api\"); the generator's frames are made when a window asks, so \
             only windows.buffer_ms applies",
        ));
    }
    let frame = c.source.max_fragment.saturating_add(24);
    int_in(
        "windows.buffer_bytes",
        bytes,
        frame,
        1 << 40,
        " bytes: at least one frame, source.max_fragment and its 24-byte header",
    )
}

/// The first key of the seeded windows (extents, delays) set to other than its default.
fn seeded_key_set(w: &WindowsSection) -> Option<&'static str> {
    let d = WindowsSection::default();
    [
        ("windows.before_ticks", w.before_ticks != d.before_ticks),
        ("windows.after_ticks", w.after_ticks != d.after_ticks),
        (
            "windows.delay_min_ticks",
            w.delay_min_ticks != d.delay_min_ticks,
        ),
        (
            "windows.delay_max_ticks",
            w.delay_max_ticks != d.delay_max_ticks,
        ),
    ]
    .into_iter()
    .find_map(|(key, set)| set.then_some(key))
}

/// Decisions from outside at run time: each carries its window, so the seeded windows'
/// keys and a file of decisions would do nothing; the longest window is said instead, and
/// the decisions pace the run (`run.rate_hz` may be 0).
fn validate_outside(c: &Config) -> Result<(), ConfigError> {
    let w = &c.windows;
    let set = (!w.decisions.is_empty())
        .then_some("windows.decisions")
        .or_else(|| seeded_key_set(w));
    if let Some(key) = set {
        return Err(invalid(
            key,
            "does nothing with windows.outside: each decision carries its window",
        ));
    }
    int_in("windows.tick_hz", w.tick_hz, 1, 1_000_000_000_000, " Hz")?;
    int_in(
        "windows.longest_ticks",
        w.longest_ticks,
        1,
        MAX_TICKS,
        " ticks: the longest window a decision from outside may ask for",
    )?;
    int_in("windows.buffer_ms", w.buffer_ms, 1, 3_600_000, " ms")?;
    int_in("windows.wait_ms", w.wait_ms, 0, 10_000, " ms")?;
    Ok(())
}

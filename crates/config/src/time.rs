//! Building by time (`builder.by = "time"`): the checks of the slicing and of the
//! generator's frames, and the size of the largest window fragment they make.

use crate::limits::MAX_FRAGMENT;
use crate::{
    int_in, invalid, BuildBy, BuilderSection, Config, ConfigError, Distribution, FragmentSection,
    FramesSection, SourceKind,
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
    pub fn by_time(&self) -> bool {
        self.builder.by == BuildBy::Time
    }

    /// Most frames that begin in one slice's window (core and overlap).
    pub fn max_window_frames(&self) -> u64 {
        let b = &self.builder;
        (b.slice_ticks.saturating_add(b.overlap_ticks)).div_ceil(self.frames.ticks.max(1)) + 1
    }

    /// The largest window fragment an RU makes of one slice.
    pub fn max_window_fragment(&self) -> u64 {
        let frame = self.frames.as_fragments().max_size();
        self.max_window_frames()
            .saturating_mul(PER_FRAME.saturating_add(frame))
            .saturating_add(WINDOW_HEADER)
    }
}

pub(crate) fn validate(c: &Config) -> Result<(), ConfigError> {
    let b = &c.builder;
    if !c.by_time() {
        let d = BuilderSection::default();
        for (key, set) in [
            ("builder.slice_ticks", b.slice_ticks != d.slice_ticks),
            ("builder.overlap_ticks", b.overlap_ticks != d.overlap_ticks),
            ("frames", c.frames != FramesSection::default()),
        ] {
            if set {
                return Err(invalid(key, "applies only to builder.by = \"time\""));
            }
        }
        return Ok(());
    }
    if c.source.kind != SourceKind::Generator {
        return Err(invalid(
            "builder.by",
            "\"time\" is built for the generator's frames so far (source.kind = \
             \"generator\"); recordings, streams and producers build by \"event\"",
        ));
    }
    if c.fragments != FragmentSection::default() {
        return Err(invalid(
            "fragments",
            "sizes a record's fragments under builder.by = \"event\"; under \"time\" the \
             generator makes [frames] (frames.size, frames.ticks)",
        ));
    }
    int_in("frames.ticks", c.frames.ticks, 1, MAX_TICKS, " ticks")?;
    int_in("builder.slice_ticks", b.slice_ticks, 1, MAX_TICKS, " ticks")?;
    int_in(
        "builder.overlap_ticks",
        b.overlap_ticks,
        0,
        b.slice_ticks,
        " ticks: at most builder.slice_ticks",
    )?;
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
            "builder.slice_ticks",
            format!(
                "a slice and its overlap hold up to {n} frames of frames.ticks = {}; at most \
                 {MAX_WINDOW_FRAMES}",
                f.ticks
            ),
        ));
    }
    let bytes = c.max_window_fragment();
    if bytes > MAX_FRAGMENT {
        return Err(invalid(
            "frames.size",
            format!(
                "a slice's fragment can reach {bytes} bytes ({n} frames); at most \
                 {MAX_FRAGMENT}: shorten builder.slice_ticks or the frames"
            ),
        ));
    }
    Ok(())
}

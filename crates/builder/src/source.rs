//! Data sources: where an RU's fragments come from. Either the generator (content derived
//! from event and source id) or a recording replayed from files (loaded and validated by the
//! node before the run; this module only hands the bytes out).

use std::ops::Range;
use std::sync::Arc;

use evb_wire::{FragmentHeader, FLAG_GENERATED, FLAG_MISSING};

use crate::generator::Generator;

/// One recorded fragment: its bytes in the recording, or `None` when it was dropped as
/// invalid (it then travels as an empty fragment flagged MISSING).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub trigger_number: u32,
    pub bytes: Option<Range<usize>>,
}

/// A validated recording: fragment k is this RU's fragment of event k.
#[derive(Debug, Clone)]
pub struct Recording {
    pub data: Arc<Vec<u8>>,
    pub fragments: Vec<Recorded>,
    /// Replay from the start when the end is reached (otherwise the run ends there).
    pub looped: bool,
    /// Fragments dropped as invalid while loading.
    pub dropped: u64,
}

#[derive(Debug, Clone)]
pub enum Source {
    Generator(Generator),
    Playback(Recording),
}

/// What a source says about one fragment before it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragmentSpec {
    pub size: usize,
    pub trigger_number: u32,
    pub flags: u16,
}

impl FragmentSpec {
    /// The fragment header of this fragment of `event_id`, once its payload CRC is known.
    pub fn header(&self, event_id: u64, source_id: u16, payload_crc: u32) -> FragmentHeader {
        FragmentHeader {
            event_id,
            trigger_number: self.trigger_number,
            source_id,
            flags: self.flags,
            payload_size: self.size as u32,
            payload_crc,
        }
    }
}

impl Source {
    /// How many events this source can supply (`None`: no end).
    pub fn available(&self) -> Option<u64> {
        match self {
            Source::Generator(_) => None,
            Source::Playback(r) if r.looped && !r.fragments.is_empty() => None,
            Source::Playback(r) => Some(r.fragments.len() as u64),
        }
    }

    fn recorded(r: &Recording, event_id: u64) -> Option<&Recorded> {
        let n = r.fragments.len() as u64;
        if n == 0 || (!r.looped && event_id >= n) {
            return None;
        }
        r.fragments.get((event_id % n) as usize)
    }

    pub fn spec(&self, event_id: u64, source_id: u16) -> FragmentSpec {
        match self {
            Source::Generator(g) => FragmentSpec {
                size: g.size(event_id, source_id),
                trigger_number: event_id as u32,
                flags: FLAG_GENERATED,
            },
            Source::Playback(r) => match Self::recorded(r, event_id) {
                Some(Recorded {
                    trigger_number,
                    bytes: Some(b),
                }) => FragmentSpec {
                    size: b.len(),
                    trigger_number: *trigger_number,
                    flags: 0,
                },
                Some(Recorded {
                    trigger_number,
                    bytes: None,
                }) => FragmentSpec {
                    size: 0,
                    trigger_number: *trigger_number,
                    flags: FLAG_MISSING,
                },
                // Past the end of a recording played once: nothing to give.
                None => FragmentSpec {
                    size: 0,
                    trigger_number: event_id as u32,
                    flags: FLAG_MISSING,
                },
            },
        }
    }

    /// Writes bytes `[offset, offset + buf.len())` of the fragment into `buf`.
    pub fn fill(&self, event_id: u64, source_id: u16, offset: usize, buf: &mut [u8]) {
        match self {
            Source::Generator(g) => g.fill(event_id, source_id, offset, buf),
            Source::Playback(r) => {
                if let Some(Recorded { bytes: Some(b), .. }) = Self::recorded(r, event_id) {
                    let start = b.start + offset;
                    buf.copy_from_slice(&r.data[start..start + buf.len()]);
                }
            }
        }
    }

    pub fn generator(&self) -> Option<&Generator> {
        match self {
            Source::Generator(g) => Some(g),
            Source::Playback(_) => None,
        }
    }
}

//! Loads and validates the files an RU replays, before the run, under the configured error
//! policy: a bad fragment either stops the node with the file and offset named, or is
//! counted and replaced by a MISSING placeholder so its event is built as partial.

use std::sync::Arc;

use evb_builder::{Recorded, Recording};
use evb_config::{Config, NodeSpec, OnError, SourceKind};
use evb_formats::events::EventFile;
use evb_formats::{fed, framed};
use tracing::warn;

struct Loader<'a> {
    cfg: &'a Config,
    me: &'a NodeSpec,
    data: Vec<u8>,
    fragments: Vec<Recorded>,
    dropped: u64,
}

impl Loader<'_> {
    /// A bad fragment: stop, or count it and keep its place as a MISSING fragment.
    fn bad(&mut self, file: &str, trigger: u32, why: String) -> Result<(), String> {
        match self.cfg.source.on_error {
            OnError::Stop => Err(format!("{}: {file}: {why}", self.me.id)),
            OnError::Drop => {
                // the first few each, the rest in one line at the end of the load
                if self.dropped < WARN_EACH {
                    warn!(node = %self.me.id, "{file}: {why}: dropped, its event will be partial");
                }
                self.dropped += 1;
                self.fragments.push(Recorded {
                    trigger_number: trigger,
                    bytes: None,
                });
                Ok(())
            }
        }
    }

    fn keep(&mut self, file: &str, trigger: u32, bytes: &[u8]) -> Result<(), String> {
        if bytes.len() as u64 > self.cfg.source.max_fragment {
            let why = format!(
                "fragment of {} bytes exceeds source.max_fragment",
                bytes.len()
            );
            return self.bad(file, trigger, why);
        }
        let start = self.data.len();
        self.data.extend_from_slice(bytes);
        self.fragments.push(Recorded {
            trigger_number: trigger,
            bytes: Some(start..self.data.len()),
        });
        Ok(())
    }

    fn fed(&mut self, file: &str, bytes: &[u8]) -> Result<(), String> {
        let ranges = fed::split(bytes).map_err(|e| format!("{}: {file}: {e}", self.me.id))?;
        let expected = self.cfg.source.check_source_id.then_some(self.me.source_id);
        for r in ranges {
            let frag = &bytes[r.clone()];
            match fed::validate(frag, r.start, expected) {
                Ok(info) => self.keep(file, info.lv1_id, frag)?,
                Err(e) => {
                    // the LV1 id as the header gives it, for the partial event's record
                    let h =
                        u64::from_le_bytes(frag[..8].try_into().expect("a fragment has 2 words"));
                    self.bad(file, ((h >> 32) & 0xff_ffff) as u32, e.to_string())?
                }
            }
        }
        Ok(())
    }

    fn framed(&mut self, file: &str, bytes: &[u8]) -> Result<(), String> {
        let mut at = 0;
        while at < bytes.len() {
            let (rec, crc) =
                framed::read_at(bytes, at).map_err(|e| format!("{}: {file}: {e}", self.me.id))?;
            at = rec.payload.end;
            match crc {
                None => self.keep(file, rec.trigger_number, &bytes[rec.payload])?,
                Some(e) => self.bad(file, rec.trigger_number, e.to_string())?,
            }
        }
        Ok(())
    }
}

/// Bad fragments of a recording warned about one by one; the rest are summed up in a line.
const WARN_EACH: u64 = 10;

/// Reads and checks every file of RU `me`.
pub fn load(cfg: &Config, me: &NodeSpec) -> Result<Recording, String> {
    let mut l = Loader {
        cfg,
        me,
        data: Vec::new(),
        fragments: Vec::new(),
        dropped: 0,
    };
    match cfg.source.kind {
        SourceKind::Generator | SourceKind::Stream | SourceKind::Api => {
            return Err("only file sources are loaded before the run".into())
        }
        SourceKind::Fed | SourceKind::Framed => {
            for file in &me.files {
                let bytes = std::fs::read(file)
                    .map_err(|e| format!("{}: cannot read {file}: {e}", me.id))?;
                if cfg.source.kind == SourceKind::Fed {
                    l.fed(file, &bytes)?;
                } else {
                    l.framed(file, &bytes)?;
                }
            }
        }
        SourceKind::Evb => {
            // Events of a recorded run are spread over the BUs' files: gather, then order by id.
            let mut events = Vec::new();
            for file in &me.files {
                let f = EventFile::open(std::path::Path::new(file))
                    .map_err(|e| format!("{}: {e}", me.id))?;
                for ev in f {
                    match ev {
                        Ok(ev) => events.push(ev),
                        Err(e) => l.bad(file, 0, e.to_string())?,
                    }
                }
            }
            events.sort_by_key(|e| e.event_id);
            for ev in events {
                let mine = ev
                    .fragments
                    .iter()
                    .find(|(h, _)| h.source_id == me.source_id);
                match mine {
                    Some((h, payload)) if h.flags & evb_wire::FLAG_MISSING == 0 => {
                        l.keep(&format!("event {}", ev.event_id), h.trigger_number, payload)?
                    }
                    _ => {
                        let why = format!("no fragment from source {}", me.source_id);
                        l.bad(&format!("event {}", ev.event_id), ev.trigger_number, why)?
                    }
                }
            }
        }
    }
    if l.dropped > WARN_EACH {
        warn!(
            node = %me.id,
            "{} more bad fragments dropped ({} in all): their events will be partial",
            l.dropped - WARN_EACH,
            l.dropped
        );
    }
    if l.fragments.is_empty() {
        return Err(format!("{}: no fragments in {:?}", me.id, me.files));
    }
    Ok(Recording {
        data: Arc::new(l.data),
        fragments: l.fragments,
        looped: cfg.source.looped,
        dropped: l.dropped,
    })
}

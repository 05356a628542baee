//! The file sink: built events into rolling files, each completed under its final name with a
//! metadata file beside it. A write that fails (a full disk) leaves the file cut back to
//! whole events and makes the sink busy: the BU keeps the event and its credit until a retry
//! succeeds, so the EVM stops sending it events instead of anything being lost.

use std::path::PathBuf;

use evb_buffers::Chain;
use evb_builder::{BuiltEvent, Sink, SinkError};
use evb_formats::events::{EventFileWriter, EVENT_CORRUPT, EVENT_PARTIAL, EVENT_TRIGGER_MISMATCH};
use evb_wire::FragmentHeader;
use serde_json::{json, Value};

pub struct FileSink {
    dir: PathBuf,
    run: String,
    bu: u16,
    max_events: u64,
    max_bytes: u64,
    next_seq: u32,
    current: Option<EventFileWriter>,
    files: Vec<String>,
    events: u64,
    bytes: u64,
    busy: u64,
}

impl FileSink {
    pub fn new(
        dir: PathBuf,
        run: &str,
        bu: u16,
        max_events: u64,
        max_bytes: u64,
    ) -> Result<FileSink, String> {
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(FileSink {
            dir,
            run: run.to_string(),
            bu,
            max_events,
            max_bytes,
            next_seq: 0,
            current: None,
            files: Vec::new(),
            events: 0,
            bytes: 0,
            busy: 0,
        })
    }

    fn full(&self, w: &EventFileWriter) -> bool {
        (self.max_events > 0 && w.events() >= self.max_events)
            || (self.max_bytes > 0 && w.bytes() >= self.max_bytes)
    }

    fn close_current(&mut self) -> Result<(), SinkError> {
        if let Some(w) = self.current.take() {
            if w.events() == 0 {
                w.discard();
                return Ok(());
            }
            let meta = w.finish().map_err(|e| SinkError::Busy(e.to_string()))?;
            self.files.push(meta.file);
        }
        Ok(())
    }
}

impl Sink for FileSink {
    fn deliver(&mut self, ev: &BuiltEvent) -> Result<(), SinkError> {
        if self.current.as_ref().is_some_and(|w| self.full(w)) {
            self.close_current().inspect_err(|_| self.busy += 1)?;
        }
        if self.current.is_none() {
            let w = EventFileWriter::create(&self.dir, &self.run, self.bu, self.next_seq).map_err(
                |e| {
                    self.busy += 1;
                    SinkError::Busy(e.to_string())
                },
            )?;
            self.next_seq += 1;
            self.current = Some(w);
        }
        let mut flags = 0;
        if !ev.missing_sources.is_empty() {
            flags |= EVENT_PARTIAL;
        }
        if ev.trigger_mismatch {
            flags |= EVENT_TRIGGER_MISMATCH;
        }
        if ev.corrupt {
            flags |= EVENT_CORRUPT;
        }
        let frags: Vec<(FragmentHeader, &Chain)> =
            ev.fragments.iter().map(|(h, c)| (*h, c)).collect();
        let w = self.current.as_mut().expect("opened above");
        match w.write_event(ev.event_id, ev.trigger_number, flags, &frags) {
            Ok(()) => {
                self.events += 1;
                self.bytes += ev.bytes;
                Ok(())
            }
            Err(e) => {
                self.busy += 1;
                Err(SinkError::Busy(e.to_string()))
            }
        }
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.close_current()
    }

    fn name(&self) -> &'static str {
        "file"
    }

    fn report(&self) -> Value {
        json!({
            "dir": self.dir.display().to_string(),
            "files": self.files,
            "events": self.events,
            "payload_bytes": self.bytes,
            "busy": self.busy,
        })
    }
}

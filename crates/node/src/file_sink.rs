//! The file sink: built events into rolling files, each completed under its final name with a
//! metadata file beside it.
//!
//! A file is completed only with events whose release the EVM accepted (`Sink::accepted`):
//! the EVM's ledger, not the BU, decides what is this BU's output. A BU that the EVM dropped
//! (frozen, cut off) and that wakes up with events still queued writes them, but never hears
//! them accepted; when it stops, its open files are cut back to the last accepted event
//! before they are completed, so nothing built elsewhere appears twice.
//!
//! A write that fails (a full disk) leaves the file cut back to whole events and makes the
//! sink busy: the BU keeps the event and its credit until a retry succeeds, so the EVM stops
//! sending it events instead of anything being lost. Completing a file that fails is tried
//! again on the next call.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use evb_buffers::Chain;
use evb_builder::{BuiltEvent, Sink, SinkError};
use evb_formats::events::{
    EventFileWriter, WriteMark, EVENT_CORRUPT, EVENT_PARTIAL, EVENT_TRIGGER_MISMATCH,
};
use evb_wire::FragmentHeader;
use serde_json::{json, Value};

/// A data file being written or waiting to be completed.
struct OpenFile {
    w: EventFileWriter,
    /// Events written and not yet accepted by the EVM, each with the mark just after it.
    pending: VecDeque<(u64, WriteMark)>,
    /// The mark just after the newest accepted event (`None`: none yet).
    accepted: Option<WriteMark>,
    /// No more events go into it (full, or the run is over).
    sealed: bool,
}

pub struct FileSink {
    dir: PathBuf,
    run: String,
    bu: u16,
    max_events: u64,
    max_bytes: u64,
    next_seq: u32,
    /// Oldest first; only the last one may be unsealed.
    open: VecDeque<OpenFile>,
    files: Vec<String>,
    events: u64,
    bytes: u64,
    busy: u64,
    /// Events written but left out of the output: never accepted by the EVM.
    left_out: u64,
    /// Events skipped over by the EVM's acceptances (refused by its ledger).
    refused: u64,
}

/// The highest sequence number among this BU's files of this run in `dir` (completed or
/// temporary), so that a restarted BU carries on after its earlier incarnation's files.
fn last_sequence(dir: &Path, run: &str, bu: u16) -> Option<u32> {
    let prefix = format!("{run}_bu{bu}_");
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let name = name.strip_prefix('.').unwrap_or(&name).to_string();
            let rest = name.strip_prefix(&prefix)?;
            let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
            rest[digits.len()..]
                .starts_with(".evb")
                .then(|| digits.parse::<u32>().ok())
                .flatten()
        })
        .max()
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
        let next_seq = last_sequence(&dir, run, bu).map_or(0, |s| s.saturating_add(1));
        Ok(FileSink {
            dir,
            run: run.to_string(),
            bu,
            max_events,
            max_bytes,
            next_seq,
            open: VecDeque::new(),
            files: Vec::new(),
            events: 0,
            bytes: 0,
            busy: 0,
            left_out: 0,
            refused: 0,
        })
    }

    fn full(&self, w: &EventFileWriter) -> bool {
        (self.max_events > 0 && w.events() >= self.max_events)
            || (self.max_bytes > 0 && w.bytes() >= self.max_bytes)
    }

    /// Completes sealed files, oldest first, once every event in them was accepted.
    fn complete_ready(&mut self) -> Result<(), SinkError> {
        while let Some(f) = self.open.front_mut() {
            if !f.sealed || !f.pending.is_empty() {
                break;
            }
            if f.accepted.is_none() {
                // nothing of it is output
                let f = self.open.pop_front().expect("front exists");
                f.w.discard();
                continue;
            }
            let meta = f.w.finish().map_err(|e| {
                self.busy += 1;
                SinkError::Busy(e.to_string())
            })?;
            self.files.push(meta.file);
            self.open.pop_front();
        }
        Ok(())
    }
}

impl Sink for FileSink {
    fn deliver(&mut self, ev: &BuiltEvent) -> Result<(), SinkError> {
        let full = self.open.back().is_some_and(|f| self.full(&f.w));
        if let Some(f) = self.open.back_mut().filter(|_| full) {
            f.sealed = true;
        }
        // a file that could not be completed before is tried again (its error is not news)
        let _ = self.complete_ready();
        if self.open.back().is_none_or(|f| f.sealed) {
            let w = EventFileWriter::create(&self.dir, &self.run, self.bu, self.next_seq).map_err(
                |e| {
                    self.busy += 1;
                    SinkError::Busy(e.to_string())
                },
            )?;
            self.next_seq += 1;
            self.open.push_back(OpenFile {
                w,
                pending: VecDeque::new(),
                accepted: None,
                sealed: false,
            });
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
        let f = self.open.back_mut().expect("opened above");
        match f
            .w
            .write_event(ev.event_id, ev.trigger_number, flags, &frags)
        {
            Ok(()) => {
                f.pending.push_back((ev.event_id, f.w.mark()));
                Ok(())
            }
            // a write that could not be undone will not mend by retrying: fail loudly
            Err(e @ evb_formats::events::EventFileError::Damaged { .. }) => {
                Err(SinkError::Fatal(e.to_string()))
            }
            Err(e) => {
                self.busy += 1;
                Err(SinkError::Busy(e.to_string()))
            }
        }
    }

    fn accepted(&mut self, first: u64, count: u32) -> Result<(), SinkError> {
        'ids: for id in first..first.saturating_add(count as u64) {
            loop {
                // acceptances come in delivery order: the oldest pending event is next
                let Some(f) = self.open.iter_mut().find(|f| !f.pending.is_empty()) else {
                    break 'ids;
                };
                let (written, mark) = f.pending.pop_front().expect("not empty");
                if written == id {
                    self.events += 1;
                    self.bytes += mark.payload_bytes_since(f.accepted.as_ref());
                    f.accepted = Some(mark);
                    break;
                }
                self.refused += 1;
            }
        }
        self.complete_ready()
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        for f in self.open.iter_mut() {
            f.sealed = true;
            if !f.pending.is_empty() {
                // written but never accepted: not this BU's output
                if let Some(mark) = &f.accepted {
                    f.w.truncate_to(mark).map_err(|e| {
                        self.busy += 1;
                        SinkError::Busy(e.to_string())
                    })?;
                }
                self.left_out += f.pending.len() as u64;
                f.pending.clear();
            }
        }
        self.complete_ready()
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
            "left_out_unaccepted": self.left_out,
            "refused": self.refused,
            "open_files": self.open.iter().map(|f| f.w.name().to_string()).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evb_buffers::Pool;
    use evb_formats::events::EventFile;

    fn event(pool: &Pool, id: u64) -> BuiltEvent {
        let mut w = pool.try_alloc().unwrap();
        let payload = Chain::from_slice(w.append(&id.to_le_bytes()).unwrap());
        BuiltEvent::of_one_fragment(id, 1, payload)
    }

    fn ids_in(dir: &Path) -> Vec<(String, Vec<u64>)> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "evb") {
                let ids = EventFile::open(&p)
                    .unwrap()
                    .map(|e| e.unwrap().event_id)
                    .collect();
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                assert!(
                    dir.join(format!("{name}.json")).exists(),
                    "{name} has no metadata"
                );
                out.push((name, ids));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn only_events_the_evm_accepted_become_output() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::new("t", 4096, 64);
        let mut s = FileSink::new(dir.path().into(), "r", 0, 4, 0).unwrap();
        for id in [10, 11, 12, 13, 14, 15, 16] {
            s.deliver(&event(&pool, id)).unwrap();
        }
        // the first file (10..13) is full but waits for the EVM: nothing is visible yet
        assert!(ids_in(dir.path()).is_empty());
        s.accepted(10, 4).unwrap();
        assert_eq!(
            ids_in(dir.path()),
            vec![("r_bu0_000000.evb".into(), vec![10, 11, 12, 13])]
        );
        // 14 accepted; 15 and 16 never are (the EVM dropped this BU): left out at the end
        s.accepted(14, 1).unwrap();
        s.finish().unwrap();
        assert_eq!(
            ids_in(dir.path()),
            vec![
                ("r_bu0_000000.evb".into(), vec![10, 11, 12, 13]),
                ("r_bu0_000001.evb".into(), vec![14]),
            ]
        );
        assert_eq!(s.report()["left_out_unaccepted"], 2);
        assert_eq!(s.report()["events"], 5);
        // no temporary file is left
        let hidden = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .count();
        assert_eq!(hidden, 0);
    }

    #[test]
    fn a_file_with_no_accepted_event_is_not_output() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::new("t", 4096, 64);
        let mut s = FileSink::new(dir.path().into(), "r", 0, 0, 0).unwrap();
        s.deliver(&event(&pool, 1)).unwrap();
        s.finish().unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_file_that_cannot_be_completed_is_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::new("t", 4096, 64);
        let mut s = FileSink::new(dir.path().into(), "r", 0, 0, 0).unwrap();
        s.deliver(&event(&pool, 1)).unwrap();
        s.accepted(1, 1).unwrap();
        // something occupies the final name: completing must fail, keep the data, not replace
        let blocker = dir.path().join("r_bu0_000000.evb");
        std::fs::write(&blocker, b"not ours").unwrap();
        assert!(matches!(s.finish(), Err(SinkError::Busy(_))));
        assert_eq!(std::fs::read(&blocker).unwrap(), b"not ours");
        std::fs::remove_file(&blocker).unwrap();
        s.finish().unwrap();
        assert_eq!(
            ids_in(dir.path()),
            vec![("r_bu0_000000.evb".into(), vec![1])]
        );
        assert_eq!(s.report()["files"][0], "r_bu0_000000.evb");
    }

    #[test]
    fn a_restarted_bu_never_replaces_its_earlier_files() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::new("t", 4096, 64);
        let mut first = FileSink::new(dir.path().into(), "r", 3, 0, 0).unwrap();
        first.deliver(&event(&pool, 1)).unwrap();
        first.accepted(1, 1).unwrap();
        first.finish().unwrap();
        // an incarnation killed with a file open leaves its temporary file behind
        let mut killed = FileSink::new(dir.path().into(), "r", 3, 0, 0).unwrap();
        killed.deliver(&event(&pool, 2)).unwrap();
        std::mem::forget(killed);
        let mut again = FileSink::new(dir.path().into(), "r", 3, 0, 0).unwrap();
        again.deliver(&event(&pool, 3)).unwrap();
        again.accepted(3, 1).unwrap();
        again.finish().unwrap();
        assert_eq!(
            ids_in(dir.path()),
            vec![
                ("r_bu3_000000.evb".into(), vec![1]),
                ("r_bu3_000002.evb".into(), vec![3]),
            ]
        );
    }
}

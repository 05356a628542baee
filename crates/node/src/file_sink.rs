//! The file sink: built events into rolling files, each completed under its final name with a
//! metadata file beside it.
//!
//! The sink commits its output (docs/protocol.md §6 step 7). A file holds only events whose
//! release the EVM accepted (`Sink::accepted`); it is closed when full or when its commit
//! interval is up (`sink.commit_events`, `sink.commit_ms`), made durable under its
//! temporary name (data synced, metadata written beside it: `Sink::prepare`), and renamed
//! into place only once the EVM has committed it (`Sink::publish`). Until then the RUs keep
//! its events' fragments, so a BU that dies (`kill -9`, a crashed host) loses nothing: what
//! it had not published is built again elsewhere. A BU that the EVM dropped (frozen, cut
//! off) and that wakes up never hears its parts committed, and at its end discards them.
//!
//! A write that fails (a full disk) leaves the file cut back to whole events and makes the
//! sink busy: the BU keeps the event and its credit until a retry succeeds, so the EVM stops
//! sending it events instead of anything being lost. Preparing or publishing a file that
//! fails is tried again on the next call.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use evb_buffers::Chain;
use evb_builder::{BuiltEvent, PreparedPart, Sink, SinkError};
use evb_formats::events::{
    EventFileError, EventFileWriter, PartWriter, EVENT_CORRUPT, EVENT_PARTIAL,
    EVENT_TRIGGER_MISMATCH,
};
use evb_wire::{FragmentHeader, MAX_COMMIT_RANGES};

use crate::file_syncer::Syncer;
use serde_json::{json, Value};

/// Where a file is on its way to being output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Taking events.
    Open,
    /// No more events go into it (full, due, or the run is over); waiting for acceptances.
    Sealed,
    /// Its events all accepted; being made durable by the syncer.
    Syncing,
    /// Durable under its temporary name; its Commit is with the EVM.
    Prepared,
    /// The EVM committed it; renaming it into place failed and is tried again.
    Committed,
}

/// A data file being written or on its way to being output.
struct OpenFile {
    w: Box<dyn PartWriter>,
    seq: u32,
    stage: Stage,
    /// Events written and not yet accepted by the EVM, in file order.
    pending: VecDeque<u64>,
    /// An event of it was accepted.
    accepted: bool,
    /// The accepted ids, as (first, count) ranges in acceptance order.
    ranges: Vec<(u64, u32)>,
    /// Runs of consecutive ids written into it (a part's Commit holds at most
    /// `MAX_COMMIT_RANGES`).
    runs: usize,
    last_id: Option<u64>,
    /// When its first event was written.
    since: Instant,
}

impl OpenFile {
    fn accept(&mut self, id: u64) {
        self.accepted = true;
        match self.ranges.last_mut() {
            Some((first, count)) if *first + *count as u64 == id && *count < u32::MAX => {
                *count += 1
            }
            _ => self.ranges.push((id, 1)),
        }
    }
}

/// Files with the syncer before the sink stops taking events (a disk slower than the
/// builder). A bound of 2 cost the pipeline bench's files row a third
/// (89 k against 132 k events/s unbounded); with 4, no slower than unbounded.
const MAX_UNSYNCED: usize = 4;

/// Whether `f` takes no more events under the limits (max events, max bytes, commit
/// events; 0: no limit): full, or its commit is due by count.
fn file_full(f: &OpenFile, (max_events, max_bytes, commit_events): (u64, u64, u64)) -> bool {
    let w = &f.w;
    (max_events > 0 && w.events() >= max_events)
        || (max_bytes > 0 && w.bytes() >= max_bytes)
        || (commit_events > 0 && w.events() >= commit_events)
        || f.runs >= MAX_COMMIT_RANGES
}

/// When a file is closed and committed, besides when it is full.
#[derive(Debug, Clone, Copy)]
pub struct CommitInterval {
    /// After this many events (0: no limit).
    pub events: u64,
    /// After its first event is this old.
    pub time: Duration,
}

/// The layout of the files a [`FileSink`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// evb's own `.evb` files (docs/formats.md §3).
    Evb,
    /// `.evb` files with each event's body compressed with zstd at this level.
    EvbZstd(i32),
    /// HDF5 files (docs/formats.md §6), payloads deflated at this level (None: stored).
    #[cfg(feature = "hdf5")]
    /// HDF5, its records events, time slices or decision windows (its `record_type`).
    Hdf5 {
        deflate: Option<u8>,
        record_type: &'static str,
        /// evb's own layout, DUNE's or the packed one (`sink.hdf5_layout`).
        layout: evb_formats::hdf5_events::Hdf5Layout,
    },
}

pub struct FileSink {
    dir: PathBuf,
    format: FileFormat,
    /// Permission bits of the files it writes (less the umask).
    mode: u32,
    run: String,
    bu: u16,
    max_events: u64,
    max_bytes: u64,
    commit: CommitInterval,
    next_seq: u32,
    /// Oldest first; only the last one may be open.
    open: VecDeque<OpenFile>,
    files: Vec<String>,
    events: u64,
    bytes: u64,
    busy: u64,
    /// The last `Busy` was the syncer being behind (routine back-pressure, soon over), not
    /// a failed write.
    behind_sync: bool,
    /// Events written but left out of the output: never accepted by the EVM, or in parts
    /// it never committed (this BU was dropped, or the run aborted).
    left_out: u64,
    /// Events skipped over by the EVM's acceptances (refused by its ledger).
    refused: u64,
    parts_prepared: u64,
    syncer: Syncer,
    /// The longest a file waited for the disk to make it durable.
    slowest_sync: Duration,
    /// A sync slower than [`SLOW_SYNC`] was said (until it ends).
    slow_said: bool,
}

/// A file that waits this long for the disk to make it durable is worth a warning: its
/// events stay with the RUs meanwhile, and a run that releases nothing for
/// `stall_timeout_s` is aborted as stalled. The operator must see that the disk is why.
const SLOW_SYNC: Duration = Duration::from_secs(2);

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
                .strip_prefix('.')
                .is_some_and(|ext| ext.starts_with("evb") || ext.starts_with("h5"))
                .then(|| digits.parse::<u32>().ok())
                .flatten()
        })
        .max()
}

impl FileSink {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dir: PathBuf,
        format: FileFormat,
        run: &str,
        bu: u16,
        max_events: u64,
        max_bytes: u64,
        commit: CommitInterval,
        mode: u32,
    ) -> Result<FileSink, String> {
        // the folders it makes let in whoever may read the files (0o600 files: 0o700)
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode | ((mode & 0o444) >> 2))
            .create(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let next_seq = last_sequence(&dir, run, bu).map_or(0, |s| s.saturating_add(1));
        Ok(FileSink {
            dir,
            format,
            mode,
            run: run.to_string(),
            bu,
            max_events,
            max_bytes,
            commit,
            next_seq,
            open: VecDeque::new(),
            files: Vec::new(),
            events: 0,
            bytes: 0,
            busy: 0,
            behind_sync: false,
            left_out: 0,
            refused: 0,
            parts_prepared: 0,
            syncer: Syncer::new(format!("bu{bu}-sync")),
            slowest_sync: Duration::ZERO,
            slow_said: false,
        })
    }

    /// A new file for the next sequence number, in the sink's format.
    fn create_writer(&self) -> Result<Box<dyn PartWriter>, EventFileError> {
        let (dir, run, bu, seq, mode) = (&self.dir, &self.run, self.bu, self.next_seq, self.mode);
        Ok(match self.format {
            FileFormat::Evb => {
                Box::new(EventFileWriter::create_with_mode(dir, run, bu, seq, mode)?)
            }
            FileFormat::EvbZstd(level) => Box::new(EventFileWriter::create_compressed(
                dir, run, bu, seq, mode, level,
            )?),
            #[cfg(feature = "hdf5")]
            FileFormat::Hdf5 {
                deflate,
                record_type,
                layout,
            } => Box::new(evb_formats::hdf5_events::Hdf5EventWriter::create(
                dir,
                run,
                bu,
                seq,
                mode,
                deflate,
                record_type,
                layout,
            )?),
        })
    }

    /// The file takes no more events: full, or its commit is due by count.
    fn full(&self, f: &OpenFile) -> bool {
        file_full(f, (self.max_events, self.max_bytes, self.commit.events))
    }

    /// Hands sealed files whose events were all accepted to the syncer, oldest first, and
    /// returns the files it made durable since, as parts for the EVM. A file with no
    /// accepted event is dropped (nothing of it is output).
    fn prepare_sealed(&mut self) -> Result<Vec<PreparedPart>, SinkError> {
        let mut ready = Vec::new();
        let mut failed = None;
        let mut k = 0;
        while k < self.open.len() {
            let f = &mut self.open[k];
            if f.stage != Stage::Sealed || !f.pending.is_empty() {
                if f.stage == Stage::Open || f.stage == Stage::Sealed {
                    // acceptances come in delivery order: later files wait for this one
                    break;
                }
                k += 1;
                continue;
            }
            if !f.accepted {
                let f = self.open.remove(k).expect("index in range");
                f.w.discard();
                continue;
            }
            if let Err(SinkError::Busy(why) | SinkError::Fatal(why)) = self.room_for(&[]) {
                failed = Some(why);
                break;
            }
            let f = &mut self.open[k];
            f.w.set_ranges(&f.ranges);
            match f.w.begin_prepare() {
                Ok(Some(job)) => {
                    self.syncer.start(f.seq, job);
                    f.stage = Stage::Syncing;
                }
                // durable already (a sealed file never is: kept for the writer's contract)
                Ok(None) => {
                    f.stage = Stage::Prepared;
                    self.parts_prepared += 1;
                    ready.push(PreparedPart {
                        part: f.seq,
                        ranges: f.ranges.clone(),
                    });
                }
                // a file that cannot be completed (HDF5's after a failed write) holds
                // accepted events this BU can no longer output: fail loudly
                Err(e @ EventFileError::Damaged { .. }) => {
                    return Err(SinkError::Fatal(e.to_string()))
                }
                Err(e) => {
                    self.busy += 1;
                    failed = Some(e.to_string());
                    break;
                }
            }
            k += 1;
        }
        match self.synced(false) {
            Ok(mut parts) => ready.append(&mut parts),
            Err(SinkError::Busy(why)) => {
                failed.get_or_insert(why);
            }
            Err(fatal) => return Err(fatal),
        }
        // parts made durable go to the EVM even when another file failed now
        match failed {
            Some(why) if ready.is_empty() => Err(SinkError::Busy(why)),
            _ => Ok(ready),
        }
    }

    /// Files the syncer made durable (all of those in flight, with `wait`), as parts for the
    /// EVM. A file whose sync failed is sealed again, to be tried again on the next call;
    /// the failure is the error when no part is ready.
    fn synced(&mut self, wait: bool) -> Result<Vec<PreparedPart>, SinkError> {
        let mut parts = Vec::new();
        let mut failed = None;
        loop {
            let began = self.syncer.oldest_started();
            let Some((seq, r)) = self.syncer.next(wait) else {
                break;
            };
            if let Some(t) = began {
                let took = t.elapsed();
                self.slowest_sync = self.slowest_sync.max(took);
                if self.slow_said
                    && self
                        .syncer
                        .oldest_started()
                        .is_none_or(|t| t.elapsed() < SLOW_SYNC)
                {
                    self.slow_said = false;
                    tracing::info!(
                        bu = self.bu,
                        "the disk made a file durable after {:.1} s; the sink goes on",
                        took.as_secs_f64()
                    );
                }
            }
            let Some(f) = self
                .open
                .iter_mut()
                .find(|f| f.seq == seq && f.stage == Stage::Syncing)
            else {
                continue;
            };
            match r {
                Ok(()) => {
                    f.w.prepared();
                    f.stage = Stage::Prepared;
                    self.parts_prepared += 1;
                    parts.push(PreparedPart {
                        part: f.seq,
                        ranges: f.ranges.clone(),
                    });
                }
                Err(e) => {
                    f.stage = Stage::Sealed;
                    self.busy += 1;
                    failed.get_or_insert(e.to_string());
                }
            }
        }
        match failed {
            Some(why) if parts.is_empty() => Err(SinkError::Busy(why)),
            _ => Ok(parts),
        }
    }

    /// Renames committed files into place.
    fn publish_committed(&mut self) -> Result<(), SinkError> {
        let mut k = 0;
        while k < self.open.len() {
            if self.open[k].stage != Stage::Committed {
                k += 1;
                continue;
            }
            let meta = self.open[k].w.publish().map_err(|e| {
                self.busy += 1;
                SinkError::Busy(e.to_string())
            })?;
            self.events += meta.events;
            self.bytes += meta.payload_bytes;
            self.files.push(meta.file);
            self.open.remove(k);
        }
        Ok(())
    }
}

/// Bytes an unprivileged writer may still put on the file system of `dir` (`None`: unknown).
#[cfg(feature = "hdf5")]
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is NUL-terminated and outlives the call; statvfs writes only into `st`,
    // which is large enough for a `statvfs`.
    if unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Room kept free beyond what a write needs (the library's caches, the metadata file).
#[cfg(feature = "hdf5")]
const HDF5_MARGIN: u64 = 1 << 20;

impl FileSink {
    /// An HDF5 file cannot be cut back after a failed write (it is then lost, and the sink
    /// with it), so the sink writes only what the disk has room for, and otherwise holds
    /// the events as for a full disk: room for `run` (none: for closing the open files),
    /// besides the open files' metadata that the library has yet to write. Other formats
    /// pass at once (nothing is computed on their path).
    fn room_for(&mut self, run: &[BuiltEvent]) -> Result<(), SinkError> {
        #[cfg(feature = "hdf5")]
        if let FileFormat::Hdf5 { layout, .. } = self.format {
            let need: u64 = run
                .iter()
                .map(|ev| {
                    let payload: u64 = ev.fragments.iter().map(|(_, c)| c.len() as u64).sum();
                    payload + layout.overhead_bytes(ev.fragments.len())
                })
                .sum();
            let unwritten: u64 = self.open.iter().map(|f| f.w.unwritten_bytes()).sum();
            let need = need + unwritten + HDF5_MARGIN;
            if let Some(free) = free_bytes(&self.dir).filter(|&free| free < need) {
                self.busy += 1;
                return Err(SinkError::Busy(format!(
                    "{}: {free} bytes free, the HDF5 files need {need}: No space left on device",
                    self.dir.display()
                )));
            }
        }
        let _ = run;
        Ok(())
    }

    /// Seals the open file if it is full and opens the next one if none is open.
    fn open_for_writing(&mut self) -> Result<(), SinkError> {
        let full = self
            .open
            .back()
            .is_some_and(|f| f.stage == Stage::Open && self.full(f));
        if let Some(f) = self.open.back_mut().filter(|_| full) {
            f.stage = Stage::Sealed;
        }
        if self.open.back().is_none_or(|f| f.stage != Stage::Open) {
            // the events of files not yet durable stay with the RUs: while two wait for the
            // syncer (a disk slower than the builder), the BU holds its events instead
            let unsynced = self.syncer.in_flight();
            if unsynced >= MAX_UNSYNCED {
                self.behind_sync = true;
                return Err(SinkError::Busy(format!(
                    "{unsynced} files waiting to be synced to disk"
                )));
            }
            let w = self.create_writer().map_err(|e| {
                self.busy += 1;
                SinkError::Busy(e.to_string())
            })?;
            self.open.push_back(OpenFile {
                w,
                seq: self.next_seq,
                stage: Stage::Open,
                pending: VecDeque::new(),
                accepted: false,
                ranges: Vec::new(),
                runs: 0,
                last_id: None,
                since: Instant::now(),
            });
            self.next_seq += 1;
        }
        Ok(())
    }

    fn write_failed(&mut self, e: EventFileError) -> SinkError {
        match e {
            // a write that could not be undone will not mend by retrying: fail loudly
            e @ EventFileError::Damaged { .. } => SinkError::Fatal(e.to_string()),
            e => {
                self.busy += 1;
                SinkError::Busy(e.to_string())
            }
        }
    }
}

/// The event record's flags for a built event (docs/formats.md), as the file and serve sinks
/// write them.
pub(crate) fn event_flags(ev: &BuiltEvent) -> u16 {
    let mut flags = 0;
    if !ev.missing_sources.is_empty() || ev.partial {
        flags |= EVENT_PARTIAL;
    }
    if ev.trigger_mismatch {
        flags |= EVENT_TRIGGER_MISMATCH;
    }
    if ev.corrupt {
        flags |= EVENT_CORRUPT;
    }
    flags
}

impl Sink for FileSink {
    fn deliver(&mut self, ev: &BuiltEvent) -> Result<(), SinkError> {
        self.deliver_run(std::slice::from_ref(ev)).1
    }

    fn retry_after(&self) -> Duration {
        if self.behind_sync {
            Duration::from_millis(1)
        } else {
            Duration::from_millis(100)
        }
    }

    fn busy_is_news(&self) -> bool {
        !self.behind_sync
    }

    /// Writes the run's events into the open file with one flush (one system call, not one
    /// per event), as far as the file takes them; a failed write takes none of them (the
    /// file is cut back to where the run began).
    fn deliver_run(&mut self, run: &[BuiltEvent]) -> (usize, Result<(), SinkError>) {
        if run.is_empty() {
            return (0, Ok(()));
        }
        if let Err(e) = self.room_for(run).and_then(|()| self.open_for_writing()) {
            return (0, Err(e));
        }
        self.behind_sync = false;
        let limits = (self.max_events, self.max_bytes, self.commit.events);
        let f = self.open.back_mut().expect("opened above");
        let before = (f.pending.len(), f.runs, f.last_id);
        let mut frags: Vec<(FragmentHeader, &Chain)> = Vec::new();
        let mut taken = 0;
        let mut written = Ok(());
        for ev in run {
            if taken > 0 && file_full(f, limits) {
                break;
            }
            frags.clear();
            frags.extend(ev.fragments.iter().map(|(h, c)| (*h, c)));
            written =
                f.w.append_event(ev.event_id, ev.trigger_number, event_flags(ev), &frags);
            if written.is_err() {
                break;
            }
            f.pending.push_back(ev.event_id);
            if f.last_id.is_none_or(|l| l + 1 != ev.event_id) {
                f.runs += 1;
            }
            f.last_id = Some(ev.event_id);
            taken += 1;
        }
        match written.and_then(|()| f.w.flush_events()) {
            Ok(()) => (taken, Ok(())),
            Err(e) => {
                // the writer cut the file back to where the run began: so does the record
                f.pending.truncate(before.0);
                (f.runs, f.last_id) = (before.1, before.2);
                (0, Err(self.write_failed(e)))
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
                let written = f.pending.pop_front().expect("not empty");
                if written == id {
                    f.accept(id);
                    break;
                }
                self.refused += 1;
            }
        }
        Ok(())
    }

    fn commits(&self) -> bool {
        true
    }

    fn prepare(&mut self, now: Instant) -> Result<Vec<PreparedPart>, SinkError> {
        if let Some(t) = self.syncer.oldest_started() {
            let waited = now.saturating_duration_since(t);
            if waited >= SLOW_SYNC && !self.slow_said {
                self.slow_said = true;
                tracing::warn!(
                    bu = self.bu,
                    "a file has waited {:.1} s for the disk to make it durable (fdatasync in {}); \
                     its events stay with the RUs until it is",
                    waited.as_secs_f64(),
                    self.dir.display()
                );
            }
        }
        let due = self.open.back().is_some_and(|f| {
            f.stage == Stage::Open
                && (self.full(f) || now.saturating_duration_since(f.since) >= self.commit.time)
        });
        if let Some(f) = self.open.back_mut().filter(|_| due) {
            f.stage = Stage::Sealed;
        }
        if self.syncer.in_flight() == 0
            && !self
                .open
                .iter()
                .any(|f| f.stage == Stage::Sealed && f.pending.is_empty())
        {
            return Ok(Vec::new());
        }
        self.prepare_sealed()
    }

    fn publish(&mut self, part: u32) -> Result<(), SinkError> {
        match self.open.iter_mut().find(|f| f.seq == part) {
            Some(f) if f.stage == Stage::Prepared => f.stage = Stage::Committed,
            // not a part of ours waiting for its word: nothing to publish
            _ => {
                return Err(SinkError::Fatal(format!(
                    "no prepared part {part} to publish"
                )))
            }
        }
        self.publish_committed()
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        // no sync may still be writing beside a file that is discarded now; what it made
        // durable is not committed, and so is not output
        let _ = self.synced(true);
        // committed parts are output whatever else happened; the rest never is, and goes
        // even when a committed part cannot be placed (that one keeps its temporary: it is
        // committed output, for the operator to see in the error)
        let published = self.publish_committed();
        let (committed, rest): (VecDeque<OpenFile>, VecDeque<OpenFile>) = self
            .open
            .drain(..)
            .partition(|f| f.stage == Stage::Committed);
        for f in rest {
            self.left_out +=
                f.pending.len() as u64 + f.ranges.iter().map(|(_, n)| *n as u64).sum::<u64>();
            f.w.discard();
        }
        self.open = committed;
        published
    }

    fn name(&self) -> &'static str {
        match self.format {
            FileFormat::Evb | FileFormat::EvbZstd(_) => "file",
            #[cfg(feature = "hdf5")]
            FileFormat::Hdf5 { .. } => "hdf5",
        }
    }

    fn report(&self) -> Value {
        json!({
            "dir": self.dir.display().to_string(),
            "files": self.files,
            "events": self.events,
            "payload_bytes": self.bytes,
            "busy": self.busy,
            "parts_prepared": self.parts_prepared,
            "slowest_sync_s": self.slowest_sync.as_secs_f64(),
            "syncing_for_s": self.syncer.oldest_started().map(|t| t.elapsed().as_secs_f64()),
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
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if p.extension().is_some_and(|x| x == "evb") && !name.starts_with('.') {
                let ids = EventFile::open(&p)
                    .unwrap()
                    .map(|e| e.unwrap().event_id)
                    .collect();
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

    fn hidden(dir: &Path) -> usize {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .count()
    }

    const EVERY_4: CommitInterval = CommitInterval {
        events: 4,
        time: Duration::from_secs(3600),
    };

    /// `prepare`, and the parts the syncer then makes durable of what it was given (the
    /// syncs run on a thread of their own).
    fn prepare_synced(s: &mut FileSink, now: Instant) -> Result<Vec<PreparedPart>, SinkError> {
        let mut parts = s.prepare(now)?;
        parts.extend(s.synced(true)?);
        Ok(parts)
    }

    fn sink(dir: &Path, bu: u16, commit: CommitInterval) -> FileSink {
        FileSink::new(dir.into(), FileFormat::Evb, "r", bu, 0, 0, commit, 0o666).unwrap()
    }

    #[test]
    fn a_file_is_output_only_once_the_evm_committed_it() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::new("t", 4096, 64);
        let mut s = sink(dir.path(), 0, EVERY_4);
        for id in [10, 11, 12, 13, 14, 15, 16] {
            s.deliver(&event(&pool, id)).unwrap();
        }
        let now = Instant::now();
        // the first file (10..13) is closed but waits for the EVM's acceptance
        assert!(prepare_synced(&mut s, now).unwrap().is_empty());
        s.accepted(10, 4).unwrap();
        let parts = prepare_synced(&mut s, now).unwrap();
        assert_eq!(
            parts,
            vec![PreparedPart {
                part: 0,
                ranges: vec![(10, 4)]
            }]
        );
        // durable, not yet visible
        assert!(ids_in(dir.path()).is_empty());
        assert!(
            prepare_synced(&mut s, now).unwrap().is_empty(),
            "prepared once"
        );
        s.publish(0).unwrap();
        assert_eq!(
            ids_in(dir.path()),
            vec![("r_bu0_000000.evb".into(), vec![10, 11, 12, 13])]
        );
        // 14 accepted; 15 and 16 never are (the EVM dropped this BU): nothing of the
        // second file is output, and no temporary file is left
        s.accepted(14, 1).unwrap();
        s.finish().unwrap();
        assert_eq!(ids_in(dir.path()).len(), 1);
        assert_eq!(s.report()["left_out_unaccepted"], 3);
        assert_eq!(s.report()["events"], 4);
        assert_eq!(hidden(dir.path()), 0);
    }

    /// A run of events is written as far as the open file takes it; the rest goes to the
    /// next file on the next offer, and every file holds exactly its events, in order.
    #[test]
    fn a_run_fills_the_open_file_and_the_rest_starts_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::new("t", 4096, 64);
        let mut s = sink(dir.path(), 0, EVERY_4);
        s.deliver(&event(&pool, 0)).unwrap();
        let run: Vec<BuiltEvent> = (1..10).map(|id| event(&pool, id)).collect();
        let mut offered = &run[..];
        let mut takes = Vec::new();
        while !offered.is_empty() {
            let (taken, result) = s.deliver_run(offered);
            result.unwrap();
            takes.push(taken);
            offered = &offered[taken..];
        }
        assert_eq!(takes, vec![3, 4, 2], "each file takes what it has room for");
        s.accepted(0, 10).unwrap();
        let parts = prepare_synced(&mut s, Instant::now()).unwrap();
        assert_eq!(parts.len(), 2);
        for p in &parts {
            s.publish(p.part).unwrap();
        }
        assert_eq!(
            ids_in(dir.path()),
            vec![
                ("r_bu0_000000.evb".into(), vec![0, 1, 2, 3]),
                ("r_bu0_000001.evb".into(), vec![4, 5, 6, 7]),
            ]
        );
        s.finish().unwrap();
        assert_eq!(
            s.report()["left_out_unaccepted"],
            2,
            "8 and 9: their file was open"
        );
    }

    /// A closed file is synced on the syncer's thread: the sink takes events meanwhile, the
    /// part comes back once, and a run that ends with a sync in flight waits for it and
    /// leaves no temporary file behind.
    #[test]
    fn events_keep_coming_while_a_part_is_synced() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::new("t", 4096, 64);
        let mut s = sink(dir.path(), 0, EVERY_4);
        for id in 0..5 {
            s.deliver(&event(&pool, id)).unwrap();
        }
        s.accepted(0, 4).unwrap();
        let now = Instant::now();
        let mut parts = s.prepare(now).unwrap();
        for id in 5..8 {
            s.deliver(&event(&pool, id)).unwrap();
        }
        parts.extend(prepare_synced(&mut s, now).unwrap());
        assert_eq!(
            parts,
            vec![PreparedPart {
                part: 0,
                ranges: vec![(0, 4)]
            }]
        );
        s.publish(0).unwrap();
        // the second file: sealed, accepted, its sync started, and the run ends at once
        s.deliver(&event(&pool, 8)).unwrap();
        s.accepted(4, 4).unwrap();
        let started = s.prepare(now).unwrap();
        assert!(started.len() <= 1);
        s.finish().unwrap();
        assert_eq!(
            ids_in(dir.path()),
            vec![("r_bu0_000000.evb".into(), vec![0, 1, 2, 3])]
        );
        assert_eq!(hidden(dir.path()), 0, "no temporary file is left");
    }

    /// With two files waiting for the syncer (a disk slower than the builder), the sink
    /// takes no event into a new file: the BU holds them (back-pressure), is told to offer
    /// them again soon, and no warning is due; once the syncer catches up it takes them.
    #[test]
    fn a_syncer_behind_holds_the_events_back() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::new("t", 4096, 64);
        let mut s = sink(dir.path(), 0, EVERY_4);
        let other = tempfile::tempdir().unwrap();
        for seq in 100..100 + MAX_UNSYNCED as u32 {
            let mut w = EventFileWriter::create(other.path(), "x", 0, seq).unwrap();
            s.syncer.start(seq, w.begin_prepare().unwrap().unwrap());
        }
        match s.deliver(&event(&pool, 0)) {
            Err(SinkError::Busy(why)) => assert!(why.contains("synced"), "{why}"),
            other => panic!("taken while the syncer is behind: {other:?}"),
        }
        assert!(!s.busy_is_news());
        assert_eq!(s.retry_after(), Duration::from_millis(1));
        while s.syncer.next(true).is_some() {}
        s.deliver(&event(&pool, 0)).unwrap();
        assert!(s.busy_is_news(), "a failed write is news again");
    }

    #[test]
    fn a_part_prepared_and_never_committed_is_not_output() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::new("t", 4096, 64);
        let mut s = sink(dir.path(), 0, EVERY_4);
        for id in 0..4 {
            s.deliver(&event(&pool, id)).unwrap();
        }
        s.accepted(0, 4).unwrap();
        assert_eq!(prepare_synced(&mut s, Instant::now()).unwrap().len(), 1);
        // the EVM dropped this BU before it committed the part: it never says Committed
        s.finish().unwrap();
        assert!(ids_in(dir.path()).is_empty());
        assert_eq!(hidden(dir.path()), 0);
        assert!(matches!(s.publish(0), Err(SinkError::Fatal(_))));
    }

    #[test]
    fn a_file_is_committed_when_its_time_is_up() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::new("t", 4096, 64);
        let every_50ms = CommitInterval {
            events: 0,
            time: Duration::from_millis(50),
        };
        let mut s = sink(dir.path(), 0, every_50ms);
        let t0 = Instant::now();
        s.deliver(&event(&pool, 0)).unwrap();
        s.deliver(&event(&pool, 2)).unwrap();
        s.accepted(0, 1).unwrap();
        s.accepted(2, 1).unwrap();
        assert!(
            prepare_synced(&mut s, t0).unwrap().is_empty(),
            "not due yet"
        );
        let parts = prepare_synced(&mut s, t0 + Duration::from_millis(60)).unwrap();
        assert_eq!(parts[0].ranges, vec![(0, 1), (2, 1)]);
        s.publish(parts[0].part).unwrap();
        assert_eq!(
            ids_in(dir.path()),
            vec![("r_bu0_000000.evb".into(), vec![0, 2])]
        );
    }

    #[test]
    fn a_file_that_cannot_be_published_is_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::new("t", 4096, 64);
        let mut s = sink(dir.path(), 0, EVERY_4);
        for id in 0..4 {
            s.deliver(&event(&pool, id)).unwrap();
        }
        s.accepted(0, 4).unwrap();
        let parts = prepare_synced(&mut s, Instant::now()).unwrap();
        // something occupies the final name: publishing must fail, keep the data, not replace
        let blocker = dir.path().join("r_bu0_000000.evb");
        std::fs::write(&blocker, b"not ours").unwrap();
        assert!(matches!(s.publish(parts[0].part), Err(SinkError::Busy(_))));
        assert_eq!(std::fs::read(&blocker).unwrap(), b"not ours");
        std::fs::remove_file(&blocker).unwrap();
        // committed output is published at the end at the latest
        s.finish().unwrap();
        assert_eq!(
            ids_in(dir.path()),
            vec![("r_bu0_000000.evb".into(), vec![0, 1, 2, 3])]
        );
        assert_eq!(s.report()["files"][0], "r_bu0_000000.evb");
    }

    #[test]
    fn a_restarted_bu_never_replaces_its_earlier_files() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::new("t", 4096, 64);
        let one = CommitInterval {
            events: 1,
            ..EVERY_4
        };
        let mut first = sink(dir.path(), 3, one);
        first.deliver(&event(&pool, 1)).unwrap();
        first.accepted(1, 1).unwrap();
        first.deliver(&event(&pool, 2)).unwrap(); // closes the first file
        let p = prepare_synced(&mut first, Instant::now()).unwrap();
        first.publish(p[0].part).unwrap();
        // killed with a file open: its temporary file stays behind
        std::mem::forget(first);
        let mut again = sink(dir.path(), 3, one);
        again.deliver(&event(&pool, 3)).unwrap();
        again.accepted(3, 1).unwrap();
        again.deliver(&event(&pool, 4)).unwrap();
        let p = prepare_synced(&mut again, Instant::now()).unwrap();
        again.publish(p[0].part).unwrap();
        assert_eq!(
            ids_in(dir.path()),
            vec![
                ("r_bu3_000000.evb".into(), vec![1]),
                ("r_bu3_000002.evb".into(), vec![3]),
            ]
        );
    }

    /// A writer whose file can no longer be completed (HDF5's after a failed write).
    struct Broken;

    impl PartWriter for Broken {
        fn append_event(
            &mut self,
            _: u64,
            _: u32,
            _: u16,
            _: &[(FragmentHeader, &Chain)],
        ) -> Result<(), EventFileError> {
            Ok(())
        }
        fn flush_events(&mut self) -> Result<(), EventFileError> {
            Ok(())
        }
        fn events(&self) -> u64 {
            1
        }
        fn bytes(&self) -> u64 {
            1
        }
        fn begin_prepare(
            &mut self,
        ) -> Result<Option<evb_formats::events::PrepareJob>, EventFileError> {
            Err(EventFileError::Damaged {
                path: "broken".into(),
                reason: "No space left on device".into(),
            })
        }
        fn prepared(&mut self) {}
        fn publish(&mut self) -> Result<evb_formats::events::FileMeta, EventFileError> {
            unreachable!("never prepared")
        }
        fn discard(self: Box<Self>) {}
        fn name(&self) -> &str {
            "broken"
        }
        fn set_ranges(&mut self, _: &[(u64, u32)]) {}
    }

    /// Accepted events in a file that cannot be completed are lost to this BU: the sink
    /// fails loudly instead of retrying for ever (the run would stall in silence).
    #[test]
    fn a_file_that_cannot_be_completed_fails_the_sink() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = sink(dir.path(), 0, EVERY_4);
        s.open.push_back(OpenFile {
            w: Box::new(Broken),
            seq: 0,
            stage: Stage::Sealed,
            pending: VecDeque::new(),
            accepted: true,
            ranges: vec![(0, 1)],
            runs: 1,
            last_id: Some(0),
            since: Instant::now(),
        });
        match s.prepare(Instant::now()) {
            Err(SinkError::Fatal(why)) => assert!(why.contains("No space"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    /// The HDF5 layout goes through the same stages, and a restarted BU carries on after its
    /// earlier incarnation's `.h5` files.
    #[cfg(feature = "hdf5")]
    #[test]
    fn hdf5_files_are_committed_and_numbered_like_evb_files() {
        use evb_formats::hdf5_events::Hdf5Layout;
        for (layout, format) in [
            (Hdf5Layout::Evb, "evb-hdf5"),
            (Hdf5Layout::Packed, "evb-hdf5-packed"),
        ] {
            hdf5_files_committed(layout, format);
        }
    }

    #[cfg(feature = "hdf5")]
    fn hdf5_files_committed(layout: evb_formats::hdf5_events::Hdf5Layout, format: &str) {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::new("t", 4096, 64);
        let h5 = FileFormat::Hdf5 {
            deflate: Some(1),
            record_type: "event",
            layout,
        };
        let mut s = FileSink::new(dir.path().into(), h5, "r", 2, 0, 0, EVERY_4, 0o600).unwrap();
        for id in 0..4 {
            s.deliver(&event(&pool, id)).unwrap();
        }
        s.accepted(0, 4).unwrap();
        let parts = prepare_synced(&mut s, Instant::now()).unwrap();
        assert_eq!(parts.len(), 1);
        assert!(
            !dir.path().join("r_bu2_000000.h5").exists(),
            "published early"
        );
        s.publish(0).unwrap();
        s.finish().unwrap();
        let meta: Value = serde_json::from_slice(
            &std::fs::read(dir.path().join("r_bu2_000000.h5.json")).unwrap(),
        )
        .unwrap();
        let data = std::fs::read(dir.path().join("r_bu2_000000.h5")).unwrap();
        assert_eq!(meta["format"], format);
        assert_eq!(meta["events"], 4);
        assert_eq!(meta["bytes"], data.len() as u64);
        assert_eq!(meta["crc32c"], crc32c::crc32c(&data));
        assert_eq!(&data[..8], b"\x89HDF\r\n\x1a\n", "an HDF5 signature");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("r_bu2_000000.h5"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "readable by others: {mode:o}");
        assert_eq!(s.report()["events"], 4);
        assert_eq!(hidden(dir.path()), 0);
        let again = FileSink::new(dir.path().into(), h5, "r", 2, 0, 0, EVERY_4, 0o600).unwrap();
        assert_eq!(again.next_seq, 1);
    }
}

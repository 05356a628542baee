//! The file sink: built events into rolling files, each completed under its final name with a
//! metadata file beside it.
//!
//! The sink commits its output (docs/protocol.md §6 step 7). A file holds only events whose
//! release the EVM accepted (`Sink::accepted`); it is closed when full or when its commit
//! interval is up (`sink.commit_events`, `sink.commit_ms`), made durable under its
//! temporary name (data synced, metadata written beside it: `Sink::prepare`), and renamed
//! into place only once the EVM has committed it (`Sink::publish`). Until then the RUs keep
//! its events' fragments, so a BU that dies (`kill -9`, a crashed host) loses nothing: what
//! it had not published is built again elsewhere. Syncs and publications (renames, the
//! directory synced) run on a thread of the sink's own (`file_syncer.rs`): the BU tells the
//! EVM a part is published once it is (`Sink::published`), and builds on meanwhile. A BU
//! that the EVM dropped (frozen, cut off) and that wakes up never hears its parts
//! committed, and at its end discards them.
//!
//! A write that fails (a full disk) leaves the file cut back to whole events and makes the
//! sink busy: the BU keeps the event and its credit until a retry succeeds, so the EVM stops
//! sending it events instead of anything being lost. With `compress = "zstd"` on a host of 4
//! cores or more the bodies are compressed on a thread of the writer's own and written as
//! they come back: a run's events,
//! once taken, stay with the writer (their records kept until written, the file cut back to
//! whole records meanwhile), and the next run is refused until they are written. Preparing or publishing a file that
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

use crate::file_syncer::{Job, Outcome, Syncer};
use serde_json::Value;

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
    /// The EVM committed it: to be renamed into place (again, after a failure).
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
    /// A committed file back from the syncer, whose publication failed.
    fn committed(w: Box<dyn PartWriter>, seq: u32) -> OpenFile {
        OpenFile {
            w,
            seq,
            stage: Stage::Committed,
            pending: VecDeque::new(),
            accepted: true,
            ranges: Vec::new(),
            runs: 0,
            last_id: None,
            since: Instant::now(),
        }
    }

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
    /// The BU checked every fragment's payload CRC32C (see [`FileSink::payload_crcs_checked`]).
    crcs_checked: bool,
    /// Committed files' pages leave the page cache once synced (`sink.keep_in_page_cache`
    /// false).
    drop_pages: bool,
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
    /// Parts the syncer made durable, for the EVM (returned by the next `prepare`).
    ready: Vec<PreparedPart>,
    /// Why the syncer last failed to make a part durable (returned by the next `prepare`).
    sync_failed: Option<String>,
    /// Parts with the syncer to be published, and their events.
    publishing: Vec<(u32, u64)>,
    /// Parts published since the last `Sink::published`.
    published: Vec<u32>,
    /// Every part this sink published (a standby EVM that takes over may commit one again).
    published_ever: std::collections::BTreeSet<u32>,
    /// The longest a file waited for the disk to make it durable.
    slowest_sync: Duration,
    /// A sync slower than [`SLOW_SYNC`] was said (until it ends).
    slow_said: bool,
}

/// A file that waits this long for the disk to make it durable is worth a warning: its
/// events stay with the RUs meanwhile, and a run that releases nothing for
/// `stall_timeout_s` is aborted as stalled. The operator must see that the disk is why.
const SLOW_SYNC: Duration = Duration::from_secs(2);

/// At the run's end, the longest the BU waits for the syncer to publish committed parts
/// before it reports (`Sink::finish` then publishes what is left itself).
const PUBLISH_DRAIN: Duration = Duration::from_secs(10);

/// The highest sequence number among this BU's files of this run in `dir` (completed or
/// temporary), so that a restarted BU carries on after its earlier incarnation's files.
fn last_sequence(dir: &Path, run: &str, bu: u16) -> Option<u32> {
    let prefix = format!("{}_bu{bu}_", evb_formats::run_stem(run));
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
            crcs_checked: false,
            drop_pages: false,
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
            ready: Vec::new(),
            sync_failed: None,
            publishing: Vec::new(),
            published: Vec::new(),
            published_ever: Default::default(),
            slowest_sync: Duration::ZERO,
            slow_said: false,
        })
    }

    /// The BU checks every fragment's payload CRC32C against its bytes (`builder.verify` is
    /// `crc` or `full`): `.evb` files then join each body's CRC32C from its fragments'
    /// instead of reading the payloads again (an event found corrupt is read all the same).
    pub fn payload_crcs_checked(mut self, checked: bool) -> FileSink {
        self.crcs_checked = checked;
        self
    }

    /// A committed file's pages leave the page cache once it is synced
    /// ([`evb_formats::events::PrepareJob::dropping_pages`]).
    pub fn dropping_pages(mut self, drop: bool) -> FileSink {
        self.drop_pages = drop;
        self
    }

    /// A new file for the next sequence number, in the sink's format.
    fn create_writer(&self) -> Result<Box<dyn PartWriter>, EventFileError> {
        let (dir, run, bu, seq, mode) = (&self.dir, &self.run, self.bu, self.next_seq, self.mode);
        Ok(match self.format {
            FileFormat::Evb => {
                let mut w = EventFileWriter::create_with_mode(dir, run, bu, seq, mode)?;
                w.payload_crcs_checked(self.crcs_checked);
                Box::new(w)
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
                    let job = job.dropping_pages(self.drop_pages);
                    self.syncer.start(f.seq, Job::Prepare(Box::new(job)));
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
        self.collect(wait);
        let parts = std::mem::take(&mut self.ready);
        match self.sync_failed.take() {
            Some(why) if parts.is_empty() => Err(SinkError::Busy(why)),
            _ => Ok(parts),
        }
    }

    /// Takes in what the syncer finished (all it was given, with `wait`): durable parts into
    /// `ready`, published ones into `published`.
    fn collect(&mut self, wait: bool) {
        loop {
            let began = self.syncer.oldest_started();
            let Some((seq, outcome)) = self.syncer.next(wait) else {
                break;
            };
            if let Some(t) = began {
                self.took(t.elapsed());
            }
            match outcome {
                Outcome::Prepared(r) => self.prepared_part(seq, r),
                Outcome::Published(w, r) => self.published_part(seq, w, r),
            }
        }
    }

    /// A job of the syncer took `took`: the slowest so far, and the end of a slow spell.
    fn took(&mut self, took: Duration) {
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

    /// The syncer made part `seq` durable, or failed to (it is then sealed again).
    fn prepared_part(&mut self, seq: u32, r: Result<(), EventFileError>) {
        let Some(f) = self
            .open
            .iter_mut()
            .find(|f| f.seq == seq && f.stage == Stage::Syncing)
        else {
            return;
        };
        match r {
            Ok(()) => {
                f.w.prepared();
                f.stage = Stage::Prepared;
                self.parts_prepared += 1;
                self.ready.push(PreparedPart {
                    part: f.seq,
                    ranges: f.ranges.clone(),
                });
            }
            Err(e) => {
                f.stage = Stage::Sealed;
                self.busy += 1;
                self.sync_failed.get_or_insert(e.to_string());
            }
        }
    }

    /// The syncer published part `seq`, or failed to (it is then committed again, for the
    /// next `publish` or `finish`).
    fn published_part(
        &mut self,
        seq: u32,
        w: Box<dyn PartWriter>,
        r: Result<evb_formats::events::FileMeta, EventFileError>,
    ) {
        self.publishing.retain(|(p, _)| *p != seq);
        match r {
            Ok(meta) => {
                self.count_published(meta);
                self.published.push(seq);
                self.published_ever.insert(seq);
            }
            Err(e) => {
                self.busy += 1;
                tracing::warn!(
                    bu = self.bu,
                    "publishing part {seq} failed: {e}; tried again"
                );
                self.open.push_front(OpenFile::committed(w, seq));
            }
        }
    }

    fn count_published(&mut self, meta: evb_formats::events::FileMeta) {
        self.events += meta.events;
        self.bytes += meta.payload_bytes;
        self.files.push(meta.file);
    }

    /// Hands committed files to the syncer to be renamed into place; `Sink::published` says
    /// when each is.
    fn publish_later(&mut self) {
        let mut k = 0;
        while k < self.open.len() {
            if self.open[k].stage != Stage::Committed {
                k += 1;
                continue;
            }
            let f = self.open.remove(k).expect("index in range");
            self.publishing.push((f.seq, f.w.events()));
            self.syncer.start(f.seq, Job::Publish(f.w));
        }
    }

    /// Renames committed files into place now (the run's end: nothing is waited for after).
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
            self.count_published(meta);
            self.published_ever.insert(self.open[k].seq);
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
            let unsynced = self.syncer.in_flight() - self.publishing.len();
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
            && self.ready.is_empty()
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
            // committed again (an EVM that took over, from a resync sent while the part was
            // being published): under way, it is said published once it is; published, it
            // is said so again, to the EVM that asks
            _ if self.publishing.iter().any(|(p, _)| *p == part) => return Ok(()),
            _ if self.published_ever.contains(&part) => {
                self.published.push(part);
                return Ok(());
            }
            // not a part of ours waiting for its word: nothing to publish
            _ => {
                return Err(SinkError::Fatal(format!(
                    "no prepared part {part} to publish"
                )))
            }
        }
        self.publish_later();
        Ok(())
    }

    fn publishes_later(&self) -> bool {
        true
    }

    fn published(&mut self) -> Vec<u32> {
        if !self.publishing.is_empty() {
            self.collect(false);
        }
        std::mem::take(&mut self.published)
    }

    /// Events of parts committed and not yet published: the BU reports once they are.
    fn outstanding(&self) -> u64 {
        self.publishing.iter().map(|(_, n)| n).sum()
    }

    fn drain_timeout(&self) -> Duration {
        PUBLISH_DRAIN
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
        let r = FileSinkReport {
            dir: self.dir.display().to_string(),
            files: self.files.clone(),
            events: self.events,
            payload_bytes: self.bytes,
            busy: self.busy,
            parts_prepared: self.parts_prepared,
            slowest_sync_s: self.slowest_sync.as_secs_f64(),
            publishing: self.publishing.len(),
            syncing_for_s: self
                .syncer
                .oldest_started()
                .map(|t| t.elapsed().as_secs_f64()),
            left_out_unaccepted: self.left_out,
            refused: self.refused,
            open_files: self.open.iter().map(|f| f.w.name().to_string()).collect(),
        };
        serde_json::to_value(r).unwrap_or_default()
    }
}

/// The file sink's report (`sink.report` in a BU's status and report, docs/operations/data.md).
#[derive(Debug, serde::Serialize)]
struct FileSinkReport {
    dir: String,
    /// The files published, by name.
    files: Vec<String>,
    events: u64,
    payload_bytes: u64,
    /// Times the sink was busy (a disk that did not keep up).
    busy: u64,
    parts_prepared: u64,
    slowest_sync_s: f64,
    /// Parts on their way to their final names.
    publishing: usize,
    /// How long the oldest sync under way has taken (none: no sync under way).
    syncing_for_s: Option<f64>,
    left_out_unaccepted: u64,
    refused: u64,
    open_files: Vec<String>,
}

#[cfg(test)]
mod tests;

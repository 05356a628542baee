//! Built-event files, as a BU writes them and `evb inspect` / playback read them.
//!
//! File header: magic "EVBE" | version u16 (1) | BU index u16 | sequence u32 |
//! run id length u16 | reserved u16 (0) | run id (UTF-8).
//! Then events, each a 32-byte event header and its fragments:
//! magic "EVEV" | body length u32 | event id u64 | trigger number u32 | fragment count u16 |
//! flags u16 | body CRC32C u32 | header CRC32C u32 (bytes 0..28);
//! body = for each fragment its 32-byte wire fragment header, then its payload.
//! Every data file has a metadata file beside it (same name + ".json"): see [`FileMeta`].
//!
//! One idea, one file: the built-event file format, its writer and its reader.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use evb_buffers::Chain;
use evb_wire::{FragmentHeader, FRAGMENT_HEADER_LEN};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::crc_join::crc32c_join;
use crate::gather_writer::GatherWriter;

pub const FILE_MAGIC: [u8; 4] = *b"EVBE";
pub const EVENT_MAGIC: [u8; 4] = *b"EVEV";
pub const EVENT_HEADER_LEN: usize = 32;
pub const FORMAT_VERSION: u16 = 1;
/// The version of files whose event bodies may be compressed (header bytes 14–15: codec).
pub const FORMAT_VERSION_COMPRESSED: u16 = 2;
/// Codec of a version-2 file: each event body compressed alone as one zstd frame.
pub const CODEC_ZSTD: u16 = 1;
/// Event flag (version 2 only): the body is stored as one zstd frame of the body.
pub const EVENT_ZSTD: u16 = 0x0008;
/// The most bytes a compressed body may unpack to (a bad frame must not exhaust memory).
const MAX_BODY: usize = 1 << 30;

/// Event flag: at least one source is missing (a MISSING placeholder fragment).
pub const EVENT_PARTIAL: u16 = 0x0001;
/// Event flag: the fragments' trigger numbers disagree.
pub const EVENT_TRIGGER_MISMATCH: u16 = 0x0002;
/// Event flag: a fragment failed its CRC or content check at the BU.
pub const EVENT_CORRUPT: u16 = 0x0004;

#[derive(Debug, Error)]
pub enum EventFileError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} at byte {offset}: {reason}")]
    Bad {
        path: String,
        offset: u64,
        reason: String,
    },
    /// A failed write could not be undone (the file could not be cut back to its last whole
    /// event): nothing more may be written to it, and retrying will not mend it.
    #[error("{path}: {reason}")]
    Damaged { path: String, reason: String },
}

/// What is wrong with one event record ([`parse_event`]).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EventRecordError {
    #[error("truncated event header")]
    TruncatedHeader,
    #[error("bad event header (magic or checksum)")]
    BadHeader,
    #[error("truncated event body")]
    TruncatedBody,
    #[error("event {event_id}: body checksum mismatch")]
    BodyChecksum { event_id: u64 },
    #[error("event {event_id}: bad fragment header")]
    BadFragmentHeader { event_id: u64 },
    #[error("event {event_id}: fragment overruns the event")]
    FragmentOverrun { event_id: u64 },
    #[error("event {event_id}: fragments do not fill the event")]
    Unfilled { event_id: u64 },
    #[error("event {event_id}: {bytes} bytes after the event")]
    Trailing { event_id: u64, bytes: usize },
}

/// The metadata file written beside each data file once it is complete.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileMeta {
    pub format: String,
    pub version: u16,
    pub run: String,
    pub bu: u16,
    pub sequence: u32,
    pub file: String,
    pub events: u64,
    /// Size of the data file.
    pub bytes: u64,
    pub payload_bytes: u64,
    pub first_event: Option<u64>,
    pub last_event: Option<u64>,
    /// CRC32C of the whole data file.
    pub crc32c: u32,
    /// The event ids the EVM committed in this file, as `[first, count]` runs in file
    /// order (the run manifest and `evb inspect --run` judge completeness from them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranges: Vec<(u64, u32)>,
}

impl FileMeta {
    /// The metadata of a file with no event yet.
    pub fn new(
        format: &str,
        version: u16,
        run: &str,
        bu: u16,
        sequence: u32,
        file: String,
    ) -> FileMeta {
        FileMeta {
            format: format.into(),
            version,
            run: run.into(),
            bu,
            sequence,
            file,
            events: 0,
            bytes: 0,
            payload_bytes: 0,
            first_event: None,
            last_event: None,
            crc32c: 0,
            ranges: Vec::new(),
        }
    }
}

fn file_header(run: &str, bu: u16, sequence: u32, codec: u16) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + run.len());
    let version = if codec == 0 {
        FORMAT_VERSION
    } else {
        FORMAT_VERSION_COMPRESSED
    };
    v.extend_from_slice(&FILE_MAGIC);
    v.extend_from_slice(&version.to_le_bytes());
    v.extend_from_slice(&bu.to_le_bytes());
    v.extend_from_slice(&sequence.to_le_bytes());
    v.extend_from_slice(&(run.len() as u16).to_le_bytes());
    v.extend_from_slice(&codec.to_le_bytes());
    v.extend_from_slice(run.as_bytes());
    v
}

/// Encodes one event's header for a body stored as `body`.
fn record_header(
    event_id: u64,
    trigger: u32,
    count: u16,
    flags: u16,
    body: &[u8],
) -> [u8; EVENT_HEADER_LEN] {
    let body_crc = crc32c::crc32c(body);
    header_of(event_id, trigger, count, flags, body.len(), body_crc)
}

/// An event header's bytes, its own CRC32C included.
fn header_of(
    event_id: u64,
    trigger: u32,
    count: u16,
    flags: u16,
    body_len: usize,
    body_crc: u32,
) -> [u8; EVENT_HEADER_LEN] {
    let mut b = [0u8; EVENT_HEADER_LEN];
    b[0..4].copy_from_slice(&EVENT_MAGIC);
    b[4..8].copy_from_slice(&(body_len as u32).to_le_bytes());
    b[8..16].copy_from_slice(&event_id.to_le_bytes());
    b[16..20].copy_from_slice(&trigger.to_le_bytes());
    b[20..22].copy_from_slice(&count.to_le_bytes());
    b[22..24].copy_from_slice(&flags.to_le_bytes());
    b[24..28].copy_from_slice(&body_crc.to_le_bytes());
    let h = crc32c::crc32c(&b[..28]);
    b[28..32].copy_from_slice(&h.to_le_bytes());
    b
}

/// The body of `fragments` (each fragment's header as encoded in `heads`, then its payload):
/// its length and CRC32C, read once.
fn body_len_crc(
    fragments: &[(FragmentHeader, &Chain)],
    heads: &[[u8; FRAGMENT_HEADER_LEN]],
) -> (usize, u32) {
    let len = fragments
        .iter()
        .map(|(_, p)| FRAGMENT_HEADER_LEN + p.len())
        .sum();
    (len, body_crc_after(0, fragments, heads))
}

/// `crc` carried on over the body of `fragments` (its fragment headers encoded in `heads`),
/// read byte by byte: quicker than [`crc32c_join`] for a small body.
fn body_crc_after(
    mut crc: u32,
    fragments: &[(FragmentHeader, &Chain)],
    heads: &[[u8; FRAGMENT_HEADER_LEN]],
) -> u32 {
    for ((_, p), h) in fragments.iter().zip(heads) {
        crc = crc32c::crc32c_append(crc, h);
        for c in p.chunks() {
            crc = crc32c::crc32c_append(crc, c);
        }
    }
    crc
}

/// As [`body_len_crc`], the payloads' CRC32Cs taken from their fragment headers (checked
/// against the bytes already) and joined: no byte of a payload of [`JOIN_BODY`] or more is
/// read (a shorter one is, which costs less than the join).
fn body_len_crc_checked(
    fragments: &[(FragmentHeader, &Chain)],
    heads: &[[u8; FRAGMENT_HEADER_LEN]],
) -> (usize, u32) {
    let mut crc = 0u32;
    let mut len = 0;
    for ((h, p), head) in fragments.iter().zip(heads) {
        crc = crc32c::crc32c_append(crc, head);
        crc = if p.len() >= JOIN_BODY {
            crc32c_join(crc, h.payload_crc, p.len() as u64)
        } else {
            p.chunks().fold(crc, crc32c::crc32c_append)
        };
        len += FRAGMENT_HEADER_LEN + p.len();
    }
    (len, crc)
}

/// Encodes one event's header for a body of `fragments`.
pub fn event_header(
    event_id: u64,
    trigger: u32,
    flags: u16,
    fragments: &[(FragmentHeader, &Chain)],
) -> [u8; EVENT_HEADER_LEN] {
    let heads: Vec<_> = fragments.iter().map(|(h, _)| h.encode()).collect();
    let (len, crc) = body_len_crc(fragments, &heads);
    header_of(event_id, trigger, fragments.len() as u16, flags, len, crc)
}

/// A body at least this long is written from its pages (one vectored write per event);
/// shorter ones are copied into the staged bytes and written with their neighbours.
const DIRECT_BODY: usize = 32 << 10;

/// From this body length on, the file's CRC32C is joined from the body's ([`crc32c_join`],
/// 45–220 ns whatever the length); a shorter body is read again, which costs less than the
/// join (90 ns for 461 bytes, 200 ns for 2 KiB; its bytes are still in the cache).
const JOIN_BODY: usize = 2 << 10;

/// A point in a data file between two events, to cut the file back to (see
/// [`EventFileWriter::truncate_to`]).
#[derive(Debug, Clone, PartialEq)]
pub struct WriteMark {
    bytes: u64,
    crc: u32,
    events: u64,
    payload_bytes: u64,
    first_event: Option<u64>,
    last_event: Option<u64>,
}

impl WriteMark {
    /// Events in the file up to this mark.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Payload bytes between `earlier` (the file's start when `None`) and this mark.
    pub fn payload_bytes_since(&self, earlier: Option<&WriteMark>) -> u64 {
        self.payload_bytes - earlier.map_or(0, |m| m.payload_bytes)
    }
}

/// The slow half of making a data file durable ([`PartWriter::begin_prepare`]): syncs
/// the data, then writes and syncs the metadata under its temporary name. It blocks for the
/// disk (a millisecond or more each sync), so a sink may run it on a thread of its own.
#[derive(Debug)]
pub struct PrepareJob {
    data: File,
    tmp: PathBuf,
    meta: FileMeta,
    mode: u32,
    /// The file's size and CRC32C are read from the file (a writer that did not see its
    /// bytes go by: HDF5).
    measure: bool,
    /// Stretches of the file whose CRC32C the writer knows: not read back.
    known: Vec<crate::file_crc::Known>,
    /// Once synced, the data's pages are given back to the kernel ([`PrepareJob::dropping_pages`]).
    drop_pages: bool,
}

impl PrepareJob {
    pub(crate) fn new(
        data: File,
        tmp: PathBuf,
        meta: FileMeta,
        mode: u32,
        measure: bool,
    ) -> PrepareJob {
        PrepareJob {
            data,
            tmp,
            meta,
            mode,
            measure,
            known: Vec::new(),
            drop_pages: false,
        }
    }

    /// Once the data is on disk, its pages leave the page cache (`sink.keep_in_page_cache =
    /// false`): the writer never reads them again, and pages given back at once are the
    /// ones its next files take, where a cache that only grows takes memory the host may
    /// not hold ready (on this project's VMs, 3-4 times the CPU per GB written). On tmpfs
    /// (/dev/shm) a file's pages are its storage and stay.
    pub fn dropping_pages(mut self, drop: bool) -> PrepareJob {
        self.drop_pages = drop;
        self
    }

    /// Stretches of the file whose CRC32C the writer knows (where HDF5 put the chunks it was
    /// handed whole): only the rest is read back to measure the file.
    #[cfg(feature = "hdf5")]
    pub(crate) fn knowing(mut self, known: Vec<crate::file_crc::Known>) -> PrepareJob {
        self.known = known;
        self
    }

    pub fn run(mut self) -> Result<(), EventFileError> {
        if self.measure {
            (self.meta.bytes, self.meta.crc32c) =
                crate::file_crc::size_and_crc(&self.data, &self.known).map_err(io_at(&self.tmp))?;
        }
        self.data.sync_data().map_err(io_at(&self.tmp))?;
        if self.drop_pages {
            drop_cached_pages(&self.data);
        }
        let meta_tmp = meta_tmp_of(&self.tmp);
        let text = serde_json::to_string_pretty(&self.meta).unwrap_or_default() + "\n";
        let mut f = create_file(&meta_tmp, self.mode).map_err(io_at(&meta_tmp))?;
        f.write_all(text.as_bytes()).map_err(io_at(&meta_tmp))?;
        f.sync_data().map_err(io_at(&meta_tmp))
    }
}

/// Drops `f`'s clean pages from the page cache (POSIX_FADV_DONTNEED after the sync): what a
/// committed part's sync does unless `sink.keep_in_page_cache` (and `evb bench sinks`' plain
/// writer, so that its syncs are the sink's).
#[allow(unsafe_code)] // the one posix_fadvise call
pub fn drop_cached_pages(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise only advises the kernel about an open descriptor we hold; a
    // failure (a file system without the advice) changes nothing.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// The metadata's temporary name beside a data file's temporary `.<name>.tmp` (hidden, like
/// the data's).
fn meta_tmp_of(tmp: &Path) -> PathBuf {
    tmp.with_extension("json.tmp")
}

/// Renames a prepared data file (`tmp`) and its metadata into place (`path`, `path.json`)
/// and syncs the directory so the names last. May be called again after an error;
/// `renamed` records that the data file got there.
pub(crate) fn rename_into_place(
    tmp: &Path,
    path: &Path,
    renamed: &mut bool,
) -> Result<(), EventFileError> {
    // The EVM publishes a committed part of a BU it dropped for it ([`publish_prepared`]),
    // and the dropped BU, still alive, may try the same part: a name in place whose
    // temporary is gone is that very file, published already.
    if !*renamed {
        if path.exists() {
            if tmp.exists() {
                return Err(io_at(path)(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "a completed file of that name exists",
                )));
            }
        } else {
            std::fs::rename(tmp, path).map_err(io_at(path))?;
        }
        *renamed = true;
    }
    let meta_path = PathBuf::from(format!("{}.json", path.display()));
    let meta_tmp = meta_tmp_of(tmp);
    if meta_tmp.exists() || !meta_path.exists() {
        std::fs::rename(&meta_tmp, &meta_path).map_err(io_at(&meta_path))?;
    }
    if let Some(dir) = path.parent() {
        // the renames are in the directory: sync it, or a crash may forget them
        let d = File::open(dir).map_err(io_at(dir))?;
        d.sync_all().map_err(io_at(dir))?;
    }
    Ok(())
}

/// A data file being written as one part of a BU's output, in whichever format: events go
/// in, it is made durable under its temporary name, then renamed into place.
pub trait PartWriter: Send {
    /// Appends one event (see [`EventFileWriter::append_event`]).
    fn append_event(
        &mut self,
        event_id: u64,
        trigger: u32,
        flags: u16,
        fragments: &[(FragmentHeader, &Chain)],
    ) -> Result<(), EventFileError>;
    /// Completes the events appended since the last call.
    fn flush_events(&mut self) -> Result<(), EventFileError>;
    fn events(&self) -> u64;
    /// Bytes in the file (near enough for its size limit).
    fn bytes(&self) -> u64;
    /// No more events; the quick half of making it durable, and the slow half as a job
    /// (`None`: prepared already).
    fn begin_prepare(&mut self) -> Result<Option<PrepareJob>, EventFileError>;
    /// The job from [`PartWriter::begin_prepare`] succeeded.
    fn prepared(&mut self);
    /// Renames the prepared file and its metadata into place; its metadata.
    fn publish(&mut self) -> Result<FileMeta, EventFileError>;
    /// Gives up on the file: removes its temporary files.
    fn discard(self: Box<Self>);
    /// The data file's final name.
    fn name(&self) -> &str;
    /// The ids the EVM is asked to commit in it, for its metadata: set before
    /// [`PartWriter::begin_prepare`].
    fn set_ranges(&mut self, ranges: &[(u64, u32)]);
    /// Bytes the writer holds for the file and has yet to write (at most).
    fn unwritten_bytes(&self) -> u64 {
        0
    }
}

/// A new file (replacing any) with permission bits `mode`, less the umask: created so, not
/// changed after, so that no other user can open it meanwhile.
pub(crate) fn create_file(p: &Path, mode: u32) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(p)
}

/// An IO error at `p`, for `map_err`.
pub(crate) fn io_at(p: &Path) -> impl FnOnce(std::io::Error) -> EventFileError {
    let path = p.display().to_string();
    move |source| EventFileError::Io { path, source }
}

/// Writes one data file under a temporary name; `finish` renames it into place and writes
/// its metadata, so a reader never sees half a file.
pub struct EventFileWriter {
    out: GatherWriter,
    /// Each fragment header of the event being appended, encoded (kept for its capacity).
    heads: Vec<[u8; FRAGMENT_HEADER_LEN]>,
    tmp: PathBuf,
    path: PathBuf,
    meta: FileMeta,
    /// Bytes known to be complete events on file (flushed).
    good: u64,
    /// Where the batch of events appended and not yet flushed began (`append_event`).
    batch: Option<WriteMark>,
    crc: u32,
    /// `prepare` synced the data and wrote the metadata under its temporary name.
    prepared: bool,
    /// `finish` got as far as renaming the data file (it may be called again after an error).
    renamed: bool,
    /// Why the file can no longer be written (a failed write that could not be cut back).
    damaged: Option<String>,
    /// Permission bits of the data and metadata files (less the umask).
    mode: u32,
    /// Event bodies compressed with zstd (`sink.compress`), in the writer's own time.
    zstd: Option<Zstd>,
    /// Event bodies compressed with zstd on a thread of their own (`sink.compress`).
    pipe: Option<crate::zstd_pipe::Pipe>,
    /// The file's CRC32C at `good` (where a failed write of the pipe's records cuts back to).
    good_crc: u32,
    /// The fragments' payload CRC32Cs in their headers were checked against their bytes (see
    /// [`EventFileWriter::payload_crcs_checked`]).
    crcs_checked: bool,
}

/// Whether event bodies are compressed on a thread of their own: where the host has 4 cores
/// or more. On 2 cores the builder fills both, the thread adds none, and its copy of each
/// body cost more than it saved: 0.82 against 0.98 GB/s compressing inline, 1.32 against
/// 1.23 BU CPU s per GB (2 × 2, 1 MiB events, /dev/shm, medians of 5 alternated rounds).
fn zstd_thread_pays() -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() >= 4)
}

/// Plain bytes on their way to the compressing thread past which a run waits for them all
/// to be written before it is taken (the memory a fast builder may hold ahead of zstd).
const PIPE_AHEAD: u64 = 64 << 20;

/// A compressor and its scratch space, kept for the file's life.
struct Zstd {
    c: zstd::bulk::Compressor<'static>,
    plain: Vec<u8>,
    packed: Vec<u8>,
}

impl EventFileWriter {
    pub fn create(
        dir: &Path,
        run: &str,
        bu: u16,
        sequence: u32,
    ) -> Result<EventFileWriter, EventFileError> {
        EventFileWriter::create_with_mode(dir, run, bu, sequence, 0o666)
    }

    /// As [`EventFileWriter::create`], the data and metadata files with permission bits
    /// `mode` (less the umask): 0o600 keeps a run's data from other users.
    pub fn create_with_mode(
        dir: &Path,
        run: &str,
        bu: u16,
        sequence: u32,
        mode: u32,
    ) -> Result<EventFileWriter, EventFileError> {
        EventFileWriter::create_as(dir, run, bu, sequence, mode, None, false)
    }

    /// As [`EventFileWriter::create_with_mode`], each event's body compressed with zstd at
    /// `level` (a version-2 file, docs/formats.md §3) when that makes it smaller.
    pub fn create_compressed(
        dir: &Path,
        run: &str,
        bu: u16,
        sequence: u32,
        mode: u32,
        level: i32,
    ) -> Result<EventFileWriter, EventFileError> {
        let threaded = zstd_thread_pays();
        EventFileWriter::create_as(dir, run, bu, sequence, mode, Some(level), threaded)
    }

    /// As [`EventFileWriter::create_compressed`], compressing on a thread of its own or in
    /// the caller's time as `threaded` says, whatever the host's cores.
    #[cfg(test)]
    pub(crate) fn create_compressed_as(
        dir: &Path,
        run: &str,
        bu: u16,
        sequence: u32,
        level: i32,
        threaded: bool,
    ) -> Result<EventFileWriter, EventFileError> {
        EventFileWriter::create_as(dir, run, bu, sequence, 0o600, Some(level), threaded)
    }

    fn create_as(
        dir: &Path,
        run: &str,
        bu: u16,
        sequence: u32,
        mode: u32,
        zstd_level: Option<i32>,
        threaded: bool,
    ) -> Result<EventFileWriter, EventFileError> {
        let name = format!("{}_bu{bu}_{sequence:06}.evb", crate::run_stem(run));
        let path = dir.join(&name);
        let tmp = dir.join(format!(".{name}.tmp"));
        let io = |source| EventFileError::Io {
            path: tmp.display().to_string(),
            source,
        };
        if path.exists() {
            // never replace a completed file (of an earlier incarnation of this BU)
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists", path.display()),
            )));
        }
        let file = create_file(&tmp, mode).map_err(io)?;
        let mut w = EventFileWriter {
            out: GatherWriter::new(file),
            heads: Vec::new(),
            tmp: tmp.clone(),
            path,
            meta: FileMeta::new("evb-events", FORMAT_VERSION, run, bu, sequence, name),
            good: 0,
            batch: None,
            crc: 0,
            prepared: false,
            renamed: false,
            damaged: None,
            mode,
            zstd: None,
            pipe: None,
            good_crc: 0,
            crcs_checked: false,
        };
        if let Some(level) = zstd_level {
            let c = zstd::bulk::Compressor::new(level).map_err(io)?;
            w.zstd = Some(Zstd {
                c,
                plain: Vec::new(),
                packed: Vec::new(),
            });
            if threaded {
                w.pipe = crate::zstd_pipe::Pipe::start(level, format!("zstd-{sequence}"));
            }
        }
        let codec = if zstd_level.is_some() { CODEC_ZSTD } else { 0 };
        let h = file_header(run, bu, sequence, codec);
        if let Err(e) = w.put(&h).and_then(|_| w.out.flush()) {
            // no temporary file is left behind by a failed start
            let _ = std::fs::remove_file(&tmp);
            return Err(io(e));
        }
        w.good = w.meta.bytes;
        w.good_crc = w.crc;
        Ok(w)
    }

    /// Says that the events appended from now on come with each fragment's payload CRC32C
    /// checked against its bytes (a BU that verifies CRCs): a body's CRC32C is then joined
    /// from its fragments' headers and their CRCs, and the writer reads none of its payload
    /// bytes. An event flagged [`EVENT_CORRUPT`] has its body read all the same.
    pub fn payload_crcs_checked(&mut self, checked: bool) {
        self.crcs_checked = checked;
    }

    /// Where the file stands now: just after the last event written or appended.
    pub fn mark(&self) -> WriteMark {
        WriteMark {
            bytes: self.meta.bytes,
            crc: self.crc,
            events: self.meta.events,
            payload_bytes: self.meta.payload_bytes,
            first_event: self.meta.first_event,
            last_event: self.meta.last_event,
        }
    }

    /// Cuts the file back to `mark`: the events written after it are no longer in it.
    pub fn truncate_to(&mut self, mark: &WriteMark) -> Result<(), EventFileError> {
        self.flush_events()?;
        self.drain_pipe(true)?;
        let io = |source| EventFileError::Io {
            path: self.tmp.display().to_string(),
            source,
        };
        if self.renamed || mark.bytes > self.good {
            return Err(io(std::io::Error::other(
                "cannot cut back a completed file",
            )));
        }
        self.out.cut_back(mark.bytes).map_err(io)?;
        self.restore(mark);
        Ok(())
    }

    /// The CRC, counts and complete bytes as they were at `mark`.
    fn restore(&mut self, mark: &WriteMark) {
        self.good = mark.bytes;
        self.crc = mark.crc;
        self.meta.bytes = mark.bytes;
        self.meta.events = mark.events;
        self.meta.payload_bytes = mark.payload_bytes;
        self.meta.first_event = mark.first_event;
        self.meta.last_event = mark.last_event;
    }

    /// Appends bytes (staged: they reach the file at the next flush or gathered write).
    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.out.stage(b)?;
        self.crc = crc32c::crc32c_append(self.crc, b);
        self.meta.bytes += b.len() as u64;
        Ok(())
    }

    pub fn events(&self) -> u64 {
        self.meta.events
    }

    /// Bytes in the file, and (compressing on a thread) at most what the events on their way
    /// to it add.
    pub fn bytes(&self) -> u64 {
        self.meta.bytes + self.pipe.as_ref().map_or(0, |p| p.ahead_bytes)
    }

    /// An error if the file is damaged (see [`EventFileError::Damaged`]).
    fn check_whole(&self) -> Result<(), EventFileError> {
        match &self.damaged {
            Some(reason) => Err(EventFileError::Damaged {
                path: self.tmp.display().to_string(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Appends one event and flushes it to the file. On failure (a full disk) the file is
    /// cut back to the last complete event, so the call can simply be repeated later.
    pub fn write_event(
        &mut self,
        event_id: u64,
        trigger: u32,
        flags: u16,
        fragments: &[(FragmentHeader, &Chain)],
    ) -> Result<(), EventFileError> {
        self.append_event(event_id, trigger, flags, fragments)?;
        self.flush_events()
    }

    /// Appends one event to the write buffer without flushing it: one of a batch that
    /// [`EventFileWriter::flush_events`] completes. A batch is written, or cut back, as a
    /// whole: on a failure (here or at the flush) the file is cut back to where the batch
    /// began, so the batch can simply be written again later. A sink that hands the disk
    /// runs of small events makes one system call per run instead of one per event.
    pub fn append_event(
        &mut self,
        event_id: u64,
        trigger: u32,
        flags: u16,
        fragments: &[(FragmentHeader, &Chain)],
    ) -> Result<(), EventFileError> {
        self.check_whole()?;
        if self.pipe.is_some() {
            return self.append_piped(event_id, trigger, flags, fragments);
        }
        if self.batch.is_none() {
            self.batch = Some(self.mark());
        }
        let r = match self.zstd.take() {
            Some(mut z) => {
                let r = self.put_compressed(&mut z, event_id, trigger, flags, fragments);
                self.zstd = Some(z);
                r
            }
            None => self.put_event(event_id, trigger, flags, fragments),
        };
        match r {
            Ok(()) => {
                let payload = fragments.iter().map(|(_, p)| p.len() as u64).sum::<u64>();
                self.counted(event_id, payload);
                Ok(())
            }
            Err(source) => Err(self.cut_back_batch(source)),
        }
    }

    /// One event as it is. The body's CRC32C is read from its bytes once, for its header; the
    /// file's running CRC32C is joined from it rather than read again. A small body is staged
    /// with its neighbours; a large one goes from its pages in one vectored write.
    fn put_event(
        &mut self,
        event_id: u64,
        trigger: u32,
        flags: u16,
        fragments: &[(FragmentHeader, &Chain)],
    ) -> std::io::Result<()> {
        let mut heads = std::mem::take(&mut self.heads);
        heads.clear();
        heads.extend(fragments.iter().map(|(h, _)| h.encode()));
        let (body_len, body_crc) = if self.crcs_checked && flags & EVENT_CORRUPT == 0 {
            body_len_crc_checked(fragments, &heads)
        } else {
            body_len_crc(fragments, &heads)
        };
        let count = fragments.len() as u16;
        let header = header_of(event_id, trigger, count, flags, body_len, body_crc);
        let r = if body_len < DIRECT_BODY {
            self.stage_event(&header, fragments, &heads)
        } else {
            let mut parts: Vec<&[u8]> = Vec::with_capacity(1 + 2 * fragments.len());
            parts.push(&header);
            for ((_, p), h) in fragments.iter().zip(&heads) {
                parts.push(h);
                parts.extend(p.chunks());
            }
            self.out.write_gathered(&parts)
        };
        r?;
        self.crc = crc32c::crc32c_append(self.crc, &header);
        self.crc = if body_len >= JOIN_BODY {
            crc32c_join(self.crc, body_crc, body_len as u64)
        } else {
            body_crc_after(self.crc, fragments, &heads)
        };
        self.heads = heads;
        self.meta.bytes += (EVENT_HEADER_LEN + body_len) as u64;
        Ok(())
    }

    /// One event for the compressing thread: its plain body is copied and handed over (a
    /// run's first event first writes what came back and waits while too much is on its
    /// way; an error there takes no event). Once one event of a run is taken, no later
    /// failure gives it back: the records are kept until they are written.
    fn append_piped(
        &mut self,
        event_id: u64,
        trigger: u32,
        flags: u16,
        fragments: &[(FragmentHeader, &Chain)],
    ) -> Result<(), EventFileError> {
        if self.batch.is_none() {
            let ahead = self.pipe.as_ref().map_or(0, |p| p.ahead_bytes);
            self.drain_pipe(ahead >= PIPE_AHEAD)?;
            self.batch = Some(self.mark());
        }
        let payload = fragments.iter().map(|(_, p)| p.len() as u64).sum::<u64>();
        let mut plain =
            Vec::with_capacity(payload as usize + FRAGMENT_HEADER_LEN * fragments.len());
        for (h, p) in fragments {
            plain.extend_from_slice(&h.encode());
            for c in p.chunks() {
                plain.extend_from_slice(c);
            }
        }
        let job = crate::zstd_pipe::Job {
            event_id,
            trigger,
            count: fragments.len() as u16,
            flags,
            plain,
        };
        if let Some(p) = self.pipe.as_mut() {
            if let Err(job) = p.give(job) {
                // the thread is gone: compressed here, in its turn
                let d = self.compress_here(job);
                if let Some(p) = self.pipe.as_mut() {
                    p.ahead_bytes += d.plain_len;
                    p.queued.push_back(d);
                }
            }
        }
        self.counted(event_id, payload);
        Ok(())
    }

    /// What the thread would have made of `job`, made here.
    fn compress_here(&mut self, job: crate::zstd_pipe::Job) -> crate::zstd_pipe::Done {
        let plain_len = job.plain.len() as u64;
        let packed = self.zstd.as_mut().and_then(|z| {
            let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(job.plain.len()));
            z.c.compress_to_buffer(&job.plain, &mut out).ok()?;
            (out.len() < job.plain.len()).then_some(out)
        });
        let (body, flags) = match packed {
            Some(b) => (b, job.flags | EVENT_ZSTD),
            None => (job.plain, job.flags),
        };
        crate::zstd_pipe::Done {
            event_id: job.event_id,
            trigger: job.trigger,
            count: job.count,
            flags,
            body_crc: crc32c::crc32c(&body),
            body,
            plain_len,
        }
    }

    /// Writes the records back from the compressing thread (with `wait`, every one on its
    /// way), in order, and flushes them. A failed write cuts the file back to its last
    /// whole record and keeps the records for the next try.
    fn drain_pipe(&mut self, wait: bool) -> Result<(), EventFileError> {
        let Some(mut p) = self.pipe.take() else {
            return Ok(());
        };
        let r = self.write_piped(&mut p, wait);
        self.pipe = Some(p);
        r
    }

    fn write_piped(
        &mut self,
        p: &mut crate::zstd_pipe::Pipe,
        wait: bool,
    ) -> Result<(), EventFileError> {
        if !p.collect(wait) {
            return Err(self.damage_piped("the compressing thread ended with events on its way"));
        }
        if p.queued.is_empty() && p.unflushed.is_empty() {
            return Ok(());
        }
        while let Some(d) = p.queued.pop_front() {
            p.ahead_bytes -= d.plain_len;
            let r = self.stage_record(&d);
            p.unflushed.push(d);
            if let Err(e) = r {
                return Err(self.piped_write_failed(p, e));
            }
        }
        if let Err(e) = self.out.flush() {
            return Err(self.piped_write_failed(p, e));
        }
        self.good = self.meta.bytes;
        self.good_crc = self.crc;
        p.unflushed.clear();
        Ok(())
    }

    /// Stages one compressed record: its header, then its body; the file's CRC32C joined
    /// from the body's.
    fn stage_record(&mut self, d: &crate::zstd_pipe::Done) -> std::io::Result<()> {
        let header = header_of(
            d.event_id,
            d.trigger,
            d.count,
            d.flags,
            d.body.len(),
            d.body_crc,
        );
        self.out.stage(&header)?;
        self.crc = crc32c::crc32c_append(self.crc, &header);
        self.meta.bytes += header.len() as u64;
        self.out.stage(&d.body)?;
        self.crc = crc32c_join(self.crc, d.body_crc, d.body.len() as u64);
        self.meta.bytes += d.body.len() as u64;
        Ok(())
    }

    /// After a failed write of the thread's records: the file cut back to its last whole
    /// record, the records staged since put back in front of the queue.
    fn piped_write_failed(
        &mut self,
        p: &mut crate::zstd_pipe::Pipe,
        source: std::io::Error,
    ) -> EventFileError {
        self.crc = self.good_crc;
        self.meta.bytes = self.good;
        p.requeue();
        if let Err(e) = self.out.cut_back(self.good) {
            self.damaged = Some(format!(
                "after a failed write ({source}) the file could not be cut back to byte {}: {e}",
                self.good
            ));
        }
        EventFileError::Io {
            path: self.tmp.display().to_string(),
            source,
        }
    }

    fn damage_piped(&mut self, why: &str) -> EventFileError {
        self.damaged = Some(why.to_string());
        EventFileError::Damaged {
            path: self.tmp.display().to_string(),
            reason: why.to_string(),
        }
    }

    /// Copies a small event into the staged bytes (the caller keeps the CRC and the count).
    fn stage_event(
        &mut self,
        header: &[u8],
        fragments: &[(FragmentHeader, &Chain)],
        heads: &[[u8; FRAGMENT_HEADER_LEN]],
    ) -> std::io::Result<()> {
        self.out.stage(header)?;
        for ((_, p), h) in fragments.iter().zip(heads) {
            self.out.stage(h)?;
            for c in p.chunks() {
                self.out.stage(c)?;
            }
        }
        Ok(())
    }

    /// One event with its body compressed, or as it is when compressing does not make it
    /// smaller (incompressible payloads cost nothing to read back).
    fn put_compressed(
        &mut self,
        z: &mut Zstd,
        event_id: u64,
        trigger: u32,
        flags: u16,
        fragments: &[(FragmentHeader, &Chain)],
    ) -> std::io::Result<()> {
        z.plain.clear();
        for (h, p) in fragments {
            z.plain.extend_from_slice(&h.encode());
            for c in p.chunks() {
                z.plain.extend_from_slice(c);
            }
        }
        z.packed.clear();
        z.packed
            .reserve(zstd::zstd_safe::compress_bound(z.plain.len()));
        z.c.compress_to_buffer(&z.plain, &mut z.packed)?;
        let (body, flags) = if z.packed.len() < z.plain.len() {
            (&z.packed, flags | EVENT_ZSTD)
        } else {
            (&z.plain, flags)
        };
        self.put(&record_header(
            event_id,
            trigger,
            fragments.len() as u16,
            flags,
            body,
        ))?;
        self.put(body)
    }

    /// Flushes the events appended since the last flush (nothing to do if none were).
    pub fn flush_events(&mut self) -> Result<(), EventFileError> {
        if self.batch.is_none() {
            return Ok(());
        }
        if self.pipe.is_some() {
            // the run's events are taken: what has come back from the thread is written; a
            // failed write keeps the records, tried again before the next run is taken and
            // at the prepare (the file is cut back to whole records meanwhile)
            self.batch = None;
            return match self.drain_pipe(false) {
                Err(e @ EventFileError::Damaged { .. }) => Err(e),
                _ => Ok(()),
            };
        }
        match self.out.flush() {
            Ok(()) => {
                self.batch = None;
                self.good = self.meta.bytes;
                Ok(())
            }
            Err(source) => Err(self.cut_back_batch(source)),
        }
    }

    /// One more event in the file's counts.
    fn counted(&mut self, event_id: u64, payload_bytes: u64) {
        self.meta.events += 1;
        self.meta.payload_bytes += payload_bytes;
        self.meta.first_event.get_or_insert(event_id);
        self.meta.last_event = Some(event_id);
    }

    /// After a write of the open batch failed: restores the CRC and counts to where the batch
    /// began and cuts the file back to that byte (whole events).
    fn cut_back_batch(&mut self, source: std::io::Error) -> EventFileError {
        let start = self.batch.take().unwrap_or_else(|| self.mark());
        self.restore(&start);
        // Drop what the writer still holds and cut the file back to whole events.
        if let Err(e) = self.out.cut_back(self.good) {
            // the next event would land at an unknown offset: refuse every later write
            self.damaged = Some(format!(
                "after a failed write ({source}) the file could not be cut back to byte {}: {e}",
                self.good
            ));
        }
        EventFileError::Io {
            path: self.tmp.display().to_string(),
            source,
        }
    }

    /// Appends one event record as it is (checked by [`parse_event`] first: a record that
    /// fails is refused and nothing is written). For a consumer that received events in this
    /// layout (the consumer protocol's Event frame) and writes them as they came.
    pub fn write_record(&mut self, record: &[u8]) -> Result<(), EventFileError> {
        self.check_whole()?;
        let ev = parse_event(record).map_err(|e| EventFileError::Bad {
            path: self.tmp.display().to_string(),
            offset: self.meta.bytes,
            reason: e.to_string(),
        })?;
        self.flush_events()?;
        self.drain_pipe(true)?;
        self.batch = Some(self.mark());
        if let Err(source) = self.put(record) {
            return Err(self.cut_back_batch(source));
        }
        let payload = ev
            .fragments
            .iter()
            .map(|(_, p)| p.len() as u64)
            .sum::<u64>();
        self.counted(ev.event_id, payload);
        self.flush_events()
    }

    /// Completes the file: [`EventFileWriter::prepare`], then [`EventFileWriter::publish`].
    /// After an error (a full disk) it may be called again and goes on from the step that
    /// failed; the data file is never renamed over an existing one.
    pub fn finish(&mut self) -> Result<FileMeta, EventFileError> {
        self.prepare()?;
        self.publish()
    }

    /// Makes the file durable under its temporary names: the data synced, the metadata
    /// written and synced beside it. Nothing is visible under the final names yet. May be
    /// called again after an error, and after it succeeded (it then does nothing).
    pub fn prepare(&mut self) -> Result<(), EventFileError> {
        if let Some(job) = self.begin_prepare()? {
            job.run()?;
            self.prepared();
        }
        Ok(())
    }

    /// The quick half of [`EventFileWriter::prepare`]: flushes the data and fixes the
    /// metadata, and returns the slow half (the syncs) as a job that may run on another
    /// thread; [`EventFileWriter::prepared`] records that it succeeded. `None`: prepared
    /// already. Nothing may be written to the file after this.
    pub fn begin_prepare(&mut self) -> Result<Option<PrepareJob>, EventFileError> {
        if self.prepared || self.renamed {
            return Ok(None);
        }
        // a damaged file holds bytes at unknown offsets: it is never completed
        self.check_whole()?;
        self.flush_events()?;
        self.drain_pipe(true)?;
        let data = self.out.file().try_clone().map_err(io_at(&self.tmp))?;
        self.meta.crc32c = self.crc;
        Ok(Some(PrepareJob::new(
            data,
            self.tmp.clone(),
            self.meta.clone(),
            self.mode,
            false,
        )))
    }

    /// The [`PrepareJob`] from [`EventFileWriter::begin_prepare`] succeeded.
    pub fn prepared(&mut self) {
        self.prepared = true;
    }

    /// Renames a prepared file and its metadata into place, and syncs the directory so the
    /// names last. Returns the metadata. May be called again after an error.
    pub fn publish(&mut self) -> Result<FileMeta, EventFileError> {
        self.prepare()?;
        rename_into_place(&self.tmp, &self.path, &mut self.renamed)?;
        Ok(self.meta.clone())
    }

    /// Gives up on the file (no event of it is output): removes the temporary files.
    pub fn discard(self) {
        let _ = std::fs::remove_file(&self.tmp);
        let _ = std::fs::remove_file(meta_tmp_of(&self.tmp));
    }

    /// The data file's final name.
    pub fn name(&self) -> &str {
        &self.meta.file
    }
}

/// Publishes a prepared file of another process (a BU lost after its part was committed):
/// renames `.<name>.tmp` and its metadata into place and syncs the directory. `Ok(true)`:
/// published now, or found published already; `Ok(false)`: neither the temporary nor the
/// final file is in `dir` (it is on another host).
pub fn publish_prepared(
    dir: &Path,
    run: &str,
    bu: u16,
    sequence: u32,
) -> Result<bool, EventFileError> {
    // a BU writes one format: whichever of its names is there
    let mut found = false;
    for ext in ["evb", "h5"] {
        let name = format!("{}_bu{bu}_{sequence:06}.{ext}", crate::run_stem(run));
        let path = dir.join(&name);
        let tmp = dir.join(format!(".{name}.tmp"));
        let meta = PathBuf::from(format!("{}.json", path.display()));
        let mut renamed = false;
        for (from, to) in [(&tmp, &path), (&meta_tmp_of(&tmp), &meta)] {
            if from.exists() && !to.exists() {
                std::fs::rename(from, to).map_err(io_at(to))?;
                renamed = true;
            }
        }
        if renamed {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io_at(dir))?;
        }
        found |= path.exists() && meta.exists();
    }
    Ok(found)
}

impl PartWriter for EventFileWriter {
    fn append_event(
        &mut self,
        event_id: u64,
        trigger: u32,
        flags: u16,
        fragments: &[(FragmentHeader, &Chain)],
    ) -> Result<(), EventFileError> {
        EventFileWriter::append_event(self, event_id, trigger, flags, fragments)
    }

    fn flush_events(&mut self) -> Result<(), EventFileError> {
        EventFileWriter::flush_events(self)
    }

    fn events(&self) -> u64 {
        EventFileWriter::events(self)
    }

    fn bytes(&self) -> u64 {
        EventFileWriter::bytes(self)
    }

    fn begin_prepare(&mut self) -> Result<Option<PrepareJob>, EventFileError> {
        EventFileWriter::begin_prepare(self)
    }

    fn prepared(&mut self) {
        EventFileWriter::prepared(self)
    }

    fn publish(&mut self) -> Result<FileMeta, EventFileError> {
        EventFileWriter::publish(self)
    }

    fn discard(self: Box<Self>) {
        EventFileWriter::discard(*self)
    }

    fn name(&self) -> &str {
        EventFileWriter::name(self)
    }

    fn set_ranges(&mut self, ranges: &[(u64, u32)]) {
        self.meta.ranges = ranges.to_vec();
    }
}

/// A data file's header (docs/formats.md §3).
#[derive(Debug, Clone, PartialEq)]
pub struct FileHeader {
    /// 0: bodies as they are; [`CODEC_ZSTD`]: compressed where flagged.
    pub codec: u16,
    pub run: String,
    pub bu: u16,
    pub sequence: u32,
    /// Its length: where the first event begins.
    pub len: usize,
}

/// The header at the start of `data`, a file at `path` (for the errors).
pub fn parse_file_header(data: &[u8], path: &str) -> Result<FileHeader, EventFileError> {
    let bad = |reason: &str| EventFileError::Bad {
        path: path.to_string(),
        offset: 0,
        reason: reason.into(),
    };
    if data.len() < 16 || data[0..4] != FILE_MAGIC {
        return Err(bad("not an evb event file (magic \"EVBE\" missing)"));
    }
    let version = u16::from_le_bytes([data[4], data[5]]);
    let codec = u16::from_le_bytes([data[14], data[15]]);
    match (version, codec) {
        (FORMAT_VERSION, 0) | (FORMAT_VERSION_COMPRESSED, 0 | CODEC_ZSTD) => {}
        (FORMAT_VERSION | FORMAT_VERSION_COMPRESSED, _) => {
            return Err(bad(&format!("unknown codec {codec}")))
        }
        _ => return Err(bad("unsupported version")),
    }
    let run_len = u16::from_le_bytes([data[12], data[13]]) as usize;
    let run = data
        .get(16..16 + run_len)
        .and_then(|b| std::str::from_utf8(b).ok())
        .ok_or_else(|| bad("bad run id"))?
        .to_string();
    Ok(FileHeader {
        codec,
        run,
        bu: u16::from_le_bytes([data[6], data[7]]),
        sequence: u32::from_le_bytes(data[8..12].try_into().expect("4")),
        len: 16 + run_len,
    })
}

/// A compressed file (`h.codec` not 0) as the same file uncompressed: version 1, every
/// event's body unpacked, its header's length, CRC and flags made those of the plain body.
/// Each compressed body's CRC32C is checked before it is unpacked. `None`: not compressed.
pub fn unpacked(
    data: &[u8],
    h: &FileHeader,
    path: &str,
) -> Result<Option<Vec<u8>>, EventFileError> {
    if h.codec == 0 {
        return Ok(None);
    }
    let bad = |offset: usize, reason: String| EventFileError::Bad {
        path: path.to_string(),
        offset: offset as u64,
        reason,
    };
    let mut out = Vec::with_capacity(data.len() * 3);
    out.extend_from_slice(&data[..h.len]);
    out[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    out[14..16].copy_from_slice(&0u16.to_le_bytes());
    let mut at = h.len;
    let mut unpack =
        zstd::bulk::Decompressor::new().map_err(|e| bad(0, format!("cannot start zstd: {e}")))?;
    while at < data.len() {
        let head = data
            .get(at..at + EVENT_HEADER_LEN)
            .filter(|h| header_intact(h))
            .ok_or_else(|| bad(at, EventRecordError::BadHeader.to_string()))?;
        let len = u32_le(head, 4) as usize;
        let body = data
            .get(at + EVENT_HEADER_LEN..at + EVENT_HEADER_LEN + len)
            .ok_or_else(|| bad(at, EventRecordError::TruncatedBody.to_string()))?;
        let flags = u16::from_le_bytes([head[22], head[23]]);
        if flags & EVENT_ZSTD == 0 {
            out.extend_from_slice(&data[at..at + EVENT_HEADER_LEN + len]);
        } else {
            if crc32c::crc32c(body) != u32_le(head, 24) {
                return Err(bad(at, "compressed body checksum mismatch".into()));
            }
            let size = zstd::zstd_safe::get_frame_content_size(body)
                .ok()
                .flatten()
                .filter(|&n| n <= MAX_BODY as u64)
                .ok_or_else(|| bad(at, "compressed body of no or too large a size".into()))?;
            let plain = unpack
                .decompress(body, size as usize)
                .map_err(|e| bad(at, format!("compressed body: {e}")))?;
            let id = u64::from_le_bytes(head[8..16].try_into().expect("8"));
            let count = u16::from_le_bytes([head[20], head[21]]);
            out.extend_from_slice(&record_header(
                id,
                u32_le(head, 16),
                count,
                flags & !EVENT_ZSTD,
                &plain,
            ));
            out.extend_from_slice(&plain);
        }
        at += EVENT_HEADER_LEN + len;
    }
    Ok(Some(out))
}

/// Whether the `EVENT_HEADER_LEN` bytes of `h` are an event header: its magic, and the CRC32C
/// of its first 28 bytes in its last 4.
fn header_intact(h: &[u8]) -> bool {
    h[0..4] == EVENT_MAGIC && crc32c::crc32c(&h[..28]) == u32_le(h, 28)
}

fn u32_le(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4"))
}

/// One event read back from a file.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub event_id: u64,
    pub trigger_number: u32,
    pub flags: u16,
    pub fragments: Vec<(FragmentHeader, Vec<u8>)>,
    /// Byte offset of the event header in the file.
    pub offset: u64,
}

/// A data file read into memory and checked as it is walked.
pub struct EventFile {
    pub run: String,
    pub bu: u16,
    pub sequence: u32,
    data: Vec<u8>,
    at: usize,
    path: String,
}

impl EventFile {
    pub fn open(path: &Path) -> Result<EventFile, EventFileError> {
        let p = path.display().to_string();
        let data = std::fs::read(path).map_err(|source| EventFileError::Io {
            path: p.clone(),
            source,
        })?;
        Self::parse(data, p)
    }

    pub fn parse(data: Vec<u8>, path: String) -> Result<EventFile, EventFileError> {
        let h = parse_file_header(&data, &path)?;
        let data = match unpacked(&data, &h, &path)? {
            Some(image) => image,
            None => data,
        };
        Ok(EventFile {
            run: h.run,
            bu: h.bu,
            sequence: h.sequence,
            at: h.len,
            data,
            path,
        })
    }

    pub fn data(&self) -> &[u8] {
        &self.data
    }
}

/// The event ids in the data file at `path`, from its event headers alone: each header's
/// magic and CRC are checked and its body is skipped, not read (a run's files may hold many
/// GB, and a check that no event is in two files needs only the ids). Compressed files are
/// walked as they are (their event headers are the same). The walk ends at the first header
/// that is not intact or whose body the file does not hold, as [`EventFile`]'s does.
pub fn event_ids(path: &Path) -> Result<Vec<u64>, EventFileError> {
    use std::io::{BufReader, Read};
    let p = path.display().to_string();
    let io = |source| EventFileError::Io {
        path: p.clone(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    // (small events are read through the buffer; a long body is skipped with a seek)
    let mut r = BufReader::with_capacity(64 << 10, file);
    let mut head = vec![0u8; (16 + u16::MAX as usize).min(size as usize)];
    r.read_exact(&mut head).map_err(io)?;
    let h = parse_file_header(&head, &p)?;
    let mut at = h.len as u64;
    r.seek_relative(h.len as i64 - head.len() as i64)
        .map_err(io)?;
    let mut ids = Vec::new();
    let mut b = [0u8; EVENT_HEADER_LEN];
    while at + EVENT_HEADER_LEN as u64 <= size {
        r.read_exact(&mut b).map_err(io)?;
        if !header_intact(&b) {
            break;
        }
        let body = u64::from(u32_le(&b, 4));
        at += EVENT_HEADER_LEN as u64 + body;
        if at > size {
            break;
        }
        ids.push(u64::from_le_bytes(b[8..16].try_into().expect("8")));
        r.seek_relative(body as i64).map_err(io)?;
    }
    Ok(ids)
}

/// Checks one event record (event header, then each fragment's header and payload: what a
/// data file holds per event, and what the consumer protocol's Event frame carries) and
/// returns it; the error names what is wrong. Payload CRCs are the caller's to check.
/// `record` must be exactly one event.
pub fn parse_event(record: &[u8]) -> Result<StoredEvent, EventRecordError> {
    let (ev, used) = parse_event_at(record, 0)?;
    if used != record.len() {
        return Err(EventRecordError::Trailing {
            event_id: ev.event_id,
            bytes: record.len() - used,
        });
    }
    Ok(ev)
}

/// Parses the event at `offset` of `data`; returns it and where the next one starts. On a
/// bad body the error says so and the caller may skip `EVENT_HEADER_LEN + body_len`.
/// Where one event record's parts lie in a file's bytes, every checksum checked (for a
/// reader that keeps the bytes where they are: a memory-mapped file).
#[derive(Debug, Clone, PartialEq)]
pub struct EventLayout {
    pub event_id: u64,
    pub trigger_number: u32,
    pub flags: u16,
    /// Each fragment's header and the byte range of its payload in the data.
    pub fragments: Vec<(FragmentHeader, std::ops::Range<usize>)>,
    /// Byte offset of the event header.
    pub offset: usize,
}

/// The event record at `offset` of `data` and where the next one begins.
pub fn event_layout_at(
    data: &[u8],
    offset: usize,
) -> Result<(EventLayout, usize), EventRecordError> {
    let h = data
        .get(offset..offset.saturating_add(EVENT_HEADER_LEN))
        .ok_or(EventRecordError::TruncatedHeader)?;
    let u32_at = |at: usize| u32_le(h, at);
    if !header_intact(h) {
        return Err(EventRecordError::BadHeader);
    }
    let body_len = u32_at(4) as usize;
    let event_id = u64::from_le_bytes(h[8..16].try_into().expect("8"));
    let trigger_number = u32_at(16);
    let count = u16::from_le_bytes([h[20], h[21]]) as usize;
    let flags = u16::from_le_bytes([h[22], h[23]]);
    let body_start = offset + EVENT_HEADER_LEN;
    let body = data
        .get(body_start..body_start.saturating_add(body_len))
        .ok_or(EventRecordError::TruncatedBody)?;
    if crc32c::crc32c(body) != u32_at(24) {
        return Err(EventRecordError::BodyChecksum { event_id });
    }
    let mut fragments = Vec::with_capacity(count);
    let mut at = 0;
    for _ in 0..count {
        let fh = match body
            .get(at..at + FRAGMENT_HEADER_LEN)
            .map(FragmentHeader::decode)
        {
            Some(Ok(fh)) => fh,
            _ => return Err(EventRecordError::BadFragmentHeader { event_id }),
        };
        at += FRAGMENT_HEADER_LEN;
        let end = at + fh.payload_size as usize;
        if end > body_len {
            return Err(EventRecordError::FragmentOverrun { event_id });
        }
        fragments.push((fh, body_start + at..body_start + end));
        at = end;
    }
    if at != body_len {
        return Err(EventRecordError::Unfilled { event_id });
    }
    let layout = EventLayout {
        event_id,
        trigger_number,
        flags,
        fragments,
        offset,
    };
    Ok((layout, body_start + body_len))
}

fn parse_event_at(data: &[u8], offset: usize) -> Result<(StoredEvent, usize), EventRecordError> {
    let (l, next) = event_layout_at(data, offset)?;
    let fragments = l
        .fragments
        .into_iter()
        .map(|(h, r)| (h, data[r].to_vec()))
        .collect();
    let ev = StoredEvent {
        event_id: l.event_id,
        trigger_number: l.trigger_number,
        flags: l.flags,
        fragments,
        offset: offset as u64,
    };
    Ok((ev, next))
}

impl Iterator for EventFile {
    type Item = Result<StoredEvent, EventFileError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at == self.data.len() {
            return None;
        }
        let offset = self.at;
        match parse_event_at(&self.data, offset) {
            Ok((ev, next)) => {
                self.at = next;
                Some(Ok(ev))
            }
            Err(reason) => {
                // a bad body is skipped (its length is known); anything else ends the walk
                let body_len = self
                    .data
                    .get(offset..offset + EVENT_HEADER_LEN)
                    .filter(|h| header_intact(h))
                    .map(|h| u32_le(h, 4) as usize);
                self.at = match body_len {
                    Some(n) if offset + EVENT_HEADER_LEN + n <= self.data.len() => {
                        offset + EVENT_HEADER_LEN + n
                    }
                    _ => self.data.len(),
                };
                Some(Err(EventFileError::Bad {
                    path: self.path.clone(),
                    offset: offset as u64,
                    reason: reason.to_string(),
                }))
            }
        }
    }
}

#[cfg(test)]
mod damaged_tests {
    use super::*;

    /// A file whose failed write could not be cut back takes no more events and is never
    /// completed: every later call says why, instead of writing at an unknown offset.
    #[test]
    fn a_damaged_file_refuses_every_later_write_and_its_completion() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventFileWriter::create(dir.path(), "r", 0, 1).unwrap();
        let pool = evb_buffers::Pool::new("t", 4096, 2);
        let mut block = pool.try_alloc().unwrap();
        let payload = Chain::from_slice(block.append(&[1u8; 16]).unwrap());
        let h = FragmentHeader {
            event_id: 0,
            trigger_number: 0,
            source_id: 1,
            flags: 0,
            payload_size: 16,
            payload_crc: crc32c::crc32c(&[1u8; 16]),
        };
        w.write_event(0, 0, 0, &[(h, &payload)]).unwrap();
        w.damaged = Some("cut back failed".into());
        let damaged = |e: EventFileError| matches!(e, EventFileError::Damaged { .. });
        assert!(damaged(
            w.write_event(1, 1, 0, &[(h, &payload)]).unwrap_err()
        ));
        assert!(damaged(w.finish().unwrap_err()));
        assert!(
            !dir.path().join(w.name()).exists(),
            "a damaged file was completed"
        );
    }
}

//! The `hdf5` sink's files in the packed layout (`sink.hdf5_layout = "packed"`,
//! docs/formats.md §12): every event's payload bytes back to back in one extensible dataset,
//! and an index of one row per event and one per fragment. What an event costs the file is
//! its index rows, not an HDF5 group with datasets and attributes: small events can afford
//! HDF5. Events are gathered into a batch and written by one write per [`BATCH_BYTES`], in
//! whole chunks (the library then writes them from the batch, with no chunk cache or fill
//! value to copy through and no chunk read back to complete it); the rest of a chunk waits
//! for the next batch or the close. A large event's blocks are written from where they lie,
//! whole chunks at a time, and the dataset's extent grows a batch ahead of the bytes. The
//! index is kept in memory and written when the file is closed. Each chunk's CRC32C is taken
//! as the chunk is handed over, and where the library put it asked at the close, so that the
//! file's CRC32C (its metadata's) is joined from them and only the rest of the file is read
//! back to measure it. The file's life (temporary name, durability, publication) is
//! [`crate::hdf5_events::Hdf5EventWriter`]'s, as for the other layouts.

use evb_buffers::Chain;
use evb_wire::FragmentHeader;
use hdf5_metno as hdf5;

use crate::hdf5_events::put_str;

/// The `format` attribute and metadata key of these files.
pub const PACKED_FORMAT: &str = "evb-hdf5-packed";
/// Version of the layout (the `format_version` attribute).
pub const PACKED_VERSION: u16 = 1;
/// The dataset of every event's bytes.
pub const DATA: &str = "data";
/// The group of the per-event index, one dataset per column.
pub const EVENTS: &str = "events";
/// The group of the per-fragment index, one dataset per column.
pub const FRAGMENTS: &str = "fragments";
/// Bytes per chunk of [`DATA`] in a file of more than one batch: its last chunk is stored
/// whole (unless deflated), so this is at most what such a file wastes. A file whose events
/// all fit in one batch has one chunk of exactly their size, and wastes nothing.
pub const CHUNK_BYTES: usize = 64 << 10;
/// Events are written to [`DATA`] once this many bytes have gathered (and at the close).
pub const BATCH_BYTES: usize = 4 << 20;
/// A piece of an event's bytes this large (a block of the BU's holding a large fragment: 256
/// KiB by default, less what heads it) is written from where it lies, in whole chunks,
/// rather than copied into the batch: at most the ends of its first and last chunks are.
pub const DIRECT_BYTES: usize = 2 * CHUNK_BYTES;
/// Bytes of a row of the event index: event id, offset (u64), length, trigger number (u32),
/// flags, sources (u16).
pub const EVENT_ROW_BYTES: u64 = 28;
/// Bytes of a row of the fragment index: offset (u64), event row, length, payload CRC32C
/// (u32), source id, flags (u16).
pub const FRAGMENT_ROW_BYTES: u64 = 24;

/// What an event of `fragments` fragments adds to a file besides its payload: its index rows.
pub const fn overhead_bytes(fragments: usize) -> u64 {
    EVENT_ROW_BYTES + FRAGMENT_ROW_BYTES * fragments as u64
}

/// The per-event index, one row per event in file order.
#[derive(Default)]
struct EventRows {
    event_id: Vec<u64>,
    offset: Vec<u64>,
    length: Vec<u32>,
    trigger_number: Vec<u32>,
    flags: Vec<u16>,
    sources: Vec<u16>,
}

/// The per-fragment index, one row per fragment, an event's in RU order.
#[derive(Default)]
struct FragmentRows {
    offset: Vec<u64>,
    event: Vec<u32>,
    length: Vec<u32>,
    crc32c: Vec<u32>,
    source_id: Vec<u16>,
    flags: Vec<u16>,
}

/// One file in the packed layout, open: its data dataset, the batch not yet written and the
/// index rows, written at the close.
pub struct PackedFile {
    /// The file's root, where [`DATA`] is made.
    root: hdf5::Group,
    /// [`DATA`], made by the first write (its chunk size depends on whether that write is
    /// the file's only one).
    data: Option<hdf5::Dataset>,
    deflate: Option<u8>,
    /// Bytes written to [`DATA`] so far.
    written: u64,
    /// [`DATA`]'s extent (at least `written`; `written` once the file is finished).
    extent: u64,
    /// The CRC32C of each chunk of [`DATA`] written whole, in order (`None`: a last chunk
    /// written in part, whose rest the file holds); no list for deflated chunks, which the
    /// library makes itself.
    chunk_crcs: Option<Vec<Option<u32>>>,
    /// Bytes per chunk of [`DATA`] (once it is made).
    chunk: usize,
    /// Events' bytes gathered and not yet written; they follow `written`.
    batch: Vec<u8>,
    events: EventRows,
    fragments: FragmentRows,
}

/// What a batch holds at most before it is written, besides the rest of a chunk.
const BATCH_CAPACITY: usize = BATCH_BYTES + CHUNK_BYTES;

thread_local! {
    /// The batch of this thread's last closed file, empty, for its next file: a BU's files
    /// follow each other on its thread, and a fresh 4 MiB for each cost its pages' faults.
    static SPARE: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// An empty batch: this thread's spare, or a new one.
fn spare_batch() -> Vec<u8> {
    let mut b = SPARE.with(|s| s.take());
    b.clear();
    if b.capacity() < BATCH_CAPACITY {
        b = Vec::with_capacity(BATCH_CAPACITY);
    }
    b
}

impl Drop for PackedFile {
    fn drop(&mut self) {
        let b = std::mem::take(&mut self.batch);
        if b.capacity() >= BATCH_CAPACITY && b.capacity() <= 2 * BATCH_BYTES {
            SPARE.with(|s| s.set(b));
        }
    }
}

/// Writes `bytes` to `data` after its first `written` bytes; its new length. Its extent,
/// `extent` long, grows a batch ahead of the bytes (`last`: set to their end), so that a
/// file of large events, written a block at a time, is not extended at every write.
fn extend(
    data: &hdf5::Dataset,
    extent: &mut u64,
    written: u64,
    bytes: &[u8],
    last: bool,
    direct: Option<usize>,
) -> hdf5::Result<u64> {
    let start = usize::try_from(written).map_err(|_| refused("file too big".into()))?;
    let end = start + bytes.len();
    let want = match last {
        true => end as u64,
        false if end as u64 > *extent => (end + BATCH_BYTES) as u64,
        false => *extent,
    };
    if want != *extent {
        // (shrunk only past the bytes written: no chunk there was allocated)
        data.resize([want as usize])?;
        *extent = want;
    }
    match direct {
        Some(chunk) if chunk > 0 && start % chunk == 0 && bytes.len() >= chunk => {
            let whole = bytes.len() / chunk * chunk;
            for (i, c) in bytes[..whole].chunks_exact(chunk).enumerate() {
                write_chunk(data, (start + i * chunk) as u64, c)?;
            }
            if whole < bytes.len() {
                data.write_slice(&bytes[whole..], start + whole..end)?;
            }
        }
        _ => data.write_slice(bytes, start..end)?,
    }
    Ok(end as u64)
}

/// Writes `chunk`, one whole chunk of stored (unfiltered) `data` beginning at byte
/// `offset`, as it is: the library's direct chunk write, which skips the selection,
/// conversion and chunk-map machinery that a write of the dataset goes through for each
/// chunk.
#[allow(unsafe_code)] // a call the binding does not wrap
fn write_chunk(data: &hdf5::Dataset, offset: u64, chunk: &[u8]) -> hdf5::Result<()> {
    use hdf5_metno_sys::h5d::H5Dwrite_chunk;
    let coord: [hdf5_metno_sys::h5::hsize_t; 1] = [offset];
    let id = data.id();
    // SAFETY: `id` is an open dataset's (`data` holds it open for the call), of rank 1 and
    // unfiltered, with chunks of `chunk.len()` bytes, so the library reads one coordinate
    // from `coord` and `chunk.len()` bytes from `chunk`, both borrowed for the call. The
    // binding's lock is held, as for every call into the library.
    let r = hdf5::sync::sync(|| unsafe {
        H5Dwrite_chunk(
            id,
            hdf5_metno_sys::h5p::H5P_DEFAULT,
            0,
            coord.as_ptr(),
            chunk.len(),
            chunk.as_ptr().cast(),
        )
    });
    match r >= 0 {
        true => Ok(()),
        false => Err(refused(format!(
            "a direct chunk write at byte {offset} failed"
        ))),
    }
}

/// Where in the file the library put the chunk of `data` that begins at byte `offset`, and
/// its size there (`None`: not said, not allocated or filtered).
#[allow(unsafe_code)] // the one call the binding does not wrap
fn chunk_at(data: &hdf5::Dataset, offset: u64) -> Option<(u64, u64)> {
    use hdf5_metno_sys::h5d::H5Dget_chunk_info_by_coord;
    let coord: [hdf5_metno_sys::h5::hsize_t; 1] = [offset];
    let (mut mask, mut addr, mut size) = (0, 0, 0);
    let id = data.id();
    // SAFETY: `id` is an open dataset's (`data` holds it open for the call), of rank 1, so
    // the library reads one coordinate from `coord`; it writes only into the three locals.
    // The binding's lock is held, as for every call into the library.
    let r = hdf5::sync::sync(|| unsafe {
        H5Dget_chunk_info_by_coord(id, coord.as_ptr(), &mut mask, &mut addr, &mut size)
    });
    (r >= 0 && mask == 0 && addr != hdf5_metno_sys::h5::HADDR_UNDEF).then_some((addr, size))
}

/// Chunks up to which a file's are looked up at its close. HDF5 1.10 finds a chunk's place
/// by walking the whole index, so the lookups cost the square of the chunks: 0.5 ms for 256
/// (16 MiB), 37 ms for 2,048, measured. Past this many, reading the file back for its
/// CRC32C costs less.
const KNOWN_CHUNKS_MAX: usize = 512;

/// Bytes of an index column up to which it is stored in its dataset's header (HDF5's
/// compact layout), where a file of few events' columns cost no block and no write each.
const COMPACT_COLUMN_BYTES: usize = 8 << 10;

/// An index column as the dataset `name` of `g`: compact when small, else contiguous.
fn put_column<T: hdf5::H5Type>(g: &hdf5::Group, name: &str, values: &[T]) -> hdf5::Result<()> {
    let b = g.new_dataset_builder().with_data(values);
    match std::mem::size_of_val(values) <= COMPACT_COLUMN_BYTES {
        true => b.layout(hdf5::dataset::Layout::Compact).create(name)?,
        false => b.create(name)?,
    };
    Ok(())
}

/// Why an event cannot be indexed, before anything of it was taken.
fn refused(why: String) -> hdf5::Error {
    hdf5::Error::from(why)
}

impl PackedFile {
    /// Writes the file attributes; the data dataset is made by the first write (chunks of
    /// [`CHUNK_BYTES`], or one chunk of the file's bytes, deflated at `deflate` when asked).
    pub fn start(
        f: &hdf5::File,
        record_type: &str,
        run: &str,
        bu: u16,
        sequence: u32,
        deflate: Option<u8>,
    ) -> hdf5::Result<PackedFile> {
        put_str(f, "format", PACKED_FORMAT)?;
        f.new_attr::<u16>()
            .create("format_version")?
            .write_scalar(&PACKED_VERSION)?;
        put_str(f, "layout", "packed")?;
        put_str(f, "record_type", record_type)?;
        put_str(f, "run", run)?;
        f.new_attr::<u16>().create("bu")?.write_scalar(&bu)?;
        f.new_attr::<u32>()
            .create("sequence")?
            .write_scalar(&sequence)?;
        Ok(PackedFile {
            root: f.group("/")?,
            data: None,
            deflate,
            written: 0,
            extent: 0,
            chunk_crcs: deflate.is_none().then(Vec::new),
            chunk: 0,
            batch: spare_batch(),
            events: EventRows::default(),
            fragments: FragmentRows::default(),
        })
    }

    /// Events in the file.
    pub fn events(&self) -> u64 {
        self.events.event_id.len() as u64
    }

    /// Takes one event: its payloads after the last event's, its index rows; writes the batch
    /// once it holds [`BATCH_BYTES`]. An event that the index cannot describe (4 GiB or more,
    /// 65,536 fragments or more, the 2^32-th event of a file) is refused before anything of
    /// it is taken.
    pub fn append(
        &mut self,
        event_id: u64,
        trigger: u32,
        flags: u16,
        fragments: &[(FragmentHeader, &Chain)],
    ) -> hdf5::Result<()> {
        let row = u32::try_from(self.events.event_id.len())
            .map_err(|_| refused("a file holds fewer than 2^32 events".into()))?;
        let sources = u16::try_from(fragments.len()).map_err(|_| {
            refused(format!(
                "event {event_id}: {} fragments (at most 65,535)",
                fragments.len()
            ))
        })?;
        let total: u64 = fragments.iter().map(|(_, p)| p.len() as u64).sum();
        let length = u32::try_from(total)
            .map_err(|_| refused(format!("event {event_id}: {total} bytes (under 4 GiB)")))?;
        let offset = self.written + self.batch.len() as u64;
        let mut at = offset;
        for (h, p) in fragments {
            let f = &mut self.fragments;
            f.offset.push(at);
            f.event.push(row);
            // fits: the sum fits
            f.length.push(p.len() as u32);
            f.crc32c.push(h.payload_crc);
            f.source_id.push(h.source_id);
            f.flags.push(h.flags);
            for c in p.chunks() {
                self.take(c)?;
            }
            at += p.len() as u64;
        }
        let e = &mut self.events;
        e.event_id.push(event_id);
        e.offset.push(offset);
        e.length.push(length);
        e.trigger_number.push(trigger);
        e.flags.push(flags);
        e.sources.push(sources);
        if self.batch.len() >= BATCH_BYTES {
            self.write_batch(false)?;
        }
        Ok(())
    }

    /// Takes `s`, the next bytes of the file: into the batch, or, where the batch is empty
    /// (the file's bytes so far are whole chunks on disk) and `s` holds [`DIRECT_BYTES`],
    /// its whole chunks written from where they lie; a large piece that comes after a batch
    /// fills the batch to a chunk's end, the batch is written and the rest goes straight.
    fn take(&mut self, mut s: &[u8]) -> hdf5::Result<()> {
        while !s.is_empty() {
            if self.batch.is_empty() && s.len() >= DIRECT_BYTES {
                let n = s.len() / CHUNK_BYTES * CHUNK_BYTES;
                let data = self.take_data(CHUNK_BYTES)?;
                self.note_chunks(&s[..n]);
                let direct = self.direct();
                let wrote = extend(
                    &data,
                    &mut self.extent,
                    self.written,
                    &s[..n],
                    false,
                    direct,
                );
                self.data = Some(data);
                self.written = wrote?;
                s = &s[n..];
                continue;
            }
            let fill = (CHUNK_BYTES - self.batch.len() % CHUNK_BYTES) % CHUNK_BYTES;
            if s.len() >= fill + DIRECT_BYTES {
                self.batch.extend_from_slice(&s[..fill]);
                s = &s[fill..];
                // whole chunks: written whole, the batch left empty
                self.write_batch(false)?;
                continue;
            }
            self.batch.extend_from_slice(s);
            s = &[];
        }
        Ok(())
    }

    /// The chunk size, where whole chunks may be written directly: stored as they are, in
    /// chunks of more than one batch's making (a file of one chunk is written as a dataset).
    fn direct(&self) -> Option<usize> {
        (self.deflate.is_none() && self.chunk == CHUNK_BYTES).then_some(self.chunk)
    }

    /// [`DATA`], taken out to be written (the caller puts it back); made with chunks of
    /// `chunk` bytes if there is none yet.
    fn take_data(&mut self, chunk: usize) -> hdf5::Result<hdf5::Dataset> {
        match self.data.take() {
            Some(d) => Ok(d),
            None => {
                self.chunk = chunk;
                self.create_data(chunk)
            }
        }
    }

    /// The CRC32Cs of `bytes`' chunks, about to be written after the `written` bytes (a
    /// multiple of the chunk size until the last write): one pass over bytes the file
    /// needs, rather than reading the file back once it is closed.
    fn note_chunks(&mut self, bytes: &[u8]) {
        let chunk = self.chunk.max(1);
        if let Some(crcs) = self.chunk_crcs.as_mut() {
            if self.written != (crcs.len() * chunk) as u64 {
                // (never: a write begins a chunk) the chunks' CRCs are not known
                self.chunk_crcs = None;
                return;
            }
            if crcs.len() + bytes.len().div_ceil(chunk) > KNOWN_CHUNKS_MAX {
                // too many to look up at the close: the file is read back then
                self.chunk_crcs = None;
                return;
            }
            crcs.extend(
                bytes
                    .chunks(chunk)
                    .map(|c| (c.len() == chunk).then(|| crc32c::crc32c(c))),
            );
        }
    }

    /// Where the library put each chunk whose CRC32C is known: none if it cannot say for
    /// one of them (the file is then read whole to measure it).
    fn known_chunks(&self) -> Vec<crate::file_crc::Known> {
        let (Some(crcs), Some(data)) = (&self.chunk_crcs, &self.data) else {
            return Vec::new();
        };
        let mut known = Vec::with_capacity(crcs.len());
        for (i, crc) in crcs.iter().enumerate() {
            let Some(crc) = *crc else { continue };
            match chunk_at(data, (i * self.chunk) as u64) {
                Some((at, len)) if len == self.chunk as u64 => {
                    known.push(crate::file_crc::Known { at, len, crc })
                }
                _ => return Vec::new(),
            }
        }
        known
    }

    /// Writes the gathered events' whole chunks (`last`: all of them): one write of the data
    /// dataset (and an extend where its extent is short, or at the last write). `written` stays a multiple of [`CHUNK_BYTES`] until the
    /// close, so each write begins a chunk.
    fn write_batch(&mut self, last: bool) -> hdf5::Result<()> {
        let n = match last {
            true => self.batch.len(),
            false => self.batch.len() / CHUNK_BYTES * CHUNK_BYTES,
        };
        if n == 0 && (!last || self.data.is_some()) {
            return Ok(());
        }
        // the file's only write: one chunk of its bytes (unless an event far larger than a
        // batch came last)
        let single = last && self.data.is_none() && n <= 2 * BATCH_BYTES;
        let data = self.take_data(if single { n.max(1) } else { CHUNK_BYTES })?;
        let batch = std::mem::take(&mut self.batch);
        self.note_chunks(&batch[..n]);
        self.batch = batch;
        let direct = self.direct();
        let wrote = extend(
            &data,
            &mut self.extent,
            self.written,
            &self.batch[..n],
            last,
            direct,
        );
        self.data = Some(data);
        self.written = wrote?;
        // the rest of a chunk, at most CHUNK_BYTES - 1, to the front
        self.batch.drain(..n);
        if self.batch.capacity() > 2 * BATCH_BYTES {
            // an event bigger than a batch grew it: give that back
            self.batch.shrink_to(BATCH_CAPACITY);
        }
        Ok(())
    }

    /// The empty, extensible data dataset in chunks of `chunk` bytes, deflated when asked.
    fn create_data(&self, chunk: usize) -> hdf5::Result<hdf5::Dataset> {
        // whole chunks are written at once: no cache to copy them through
        let mut b = self
            .root
            .new_dataset::<u8>()
            .shape(hdf5::SimpleExtents::resizable([0usize]))
            .chunk([chunk])
            .chunk_cache(1, 0, 1.0);
        match self.deflate {
            Some(level) => b = b.deflate(level),
            // and, stored as they are, with no fill value: else the library fills each new
            // chunk in a buffer of its own and copies the bytes into it to write it (a memset
            // and a memcpy of every byte); without, they go from the caller's buffer. (A
            // deflated chunk is built in the library's buffer all the same, and its fill
            // value keeps the rest of a last chunk from being whatever that memory held.)
            None => b = b.fill_time(hdf5::dataset::FillTime::Never),
        }
        b.create(DATA)
    }

    /// Writes what is left of the events, the index and the `events` and `payload_bytes`
    /// attributes (the file is closed after); where in the file its chunks written whole lie,
    /// with their CRC32Cs.
    pub(crate) fn finish(&mut self, f: &hdf5::File) -> hdf5::Result<Vec<crate::file_crc::Known>> {
        self.write_batch(true)?;
        if let Some(d) = self.data.as_ref().filter(|_| self.extent != self.written) {
            // the last write was a block's: the extent a batch ahead of it comes back
            let end = usize::try_from(self.written).map_err(|_| refused("file too big".into()))?;
            d.resize([end])?;
            self.extent = self.written;
        }
        let e = &self.events;
        let g = f.create_group(EVENTS)?;
        put_column(&g, "event_id", &e.event_id)?;
        put_column(&g, "offset", &e.offset)?;
        put_column(&g, "length", &e.length)?;
        put_column(&g, "trigger_number", &e.trigger_number)?;
        put_column(&g, "flags", &e.flags)?;
        put_column(&g, "sources", &e.sources)?;
        let r = &self.fragments;
        let g = f.create_group(FRAGMENTS)?;
        put_column(&g, "offset", &r.offset)?;
        put_column(&g, "event", &r.event)?;
        put_column(&g, "length", &r.length)?;
        put_column(&g, "crc32c", &r.crc32c)?;
        put_column(&g, "source_id", &r.source_id)?;
        put_column(&g, "flags", &r.flags)?;
        f.new_attr::<u64>()
            .create("events")?
            .write_scalar(&self.events())?;
        f.new_attr::<u64>()
            .create("payload_bytes")?
            .write_scalar(&self.written)?;
        Ok(self.known_chunks())
    }

    /// Bytes held for the file and not yet written: the batch and the index.
    pub fn unwritten_bytes(&self) -> u64 {
        self.batch.len() as u64
            + self.events.event_id.len() as u64 * EVENT_ROW_BYTES
            + self.fragments.offset.len() as u64 * FRAGMENT_ROW_BYTES
    }
}

#[cfg(test)]
mod tests {
    use evb_buffers::Pool;
    use evb_wire::FLAG_MISSING;
    use hdf5::types::VarLenUnicode;

    use super::*;
    use crate::events::{PartWriter, EVENT_PARTIAL};
    use crate::hdf5_events::{Hdf5EventWriter, Hdf5Layout};

    /// A fragment: its source, flags and payload.
    type Fragment = (u16, u16, Vec<u8>);
    /// An event: its id, flags and fragments.
    type Event = (u64, u16, Vec<Fragment>);

    fn header(event_id: u64, source_id: u16, flags: u16, payload: &[u8]) -> FragmentHeader {
        FragmentHeader {
            event_id,
            trigger_number: event_id as u32 + 100,
            source_id,
            flags,
            payload_size: payload.len() as u32,
            payload_crc: crc32c::crc32c(payload),
        }
    }

    /// A chain of `bytes` in pieces of at most 256 KiB less 100 bytes (a payload of several
    /// blocks, as a BU holds a large fragment behind its headers: each written from where it
    /// lies but for the ends of its first and last chunks, after a batch or not).
    fn chain(pool: &Pool, bytes: &[u8]) -> Chain {
        let mut c = Chain::new();
        for part in bytes.chunks((1 << 18) - 100) {
            let mut w = pool.try_alloc().unwrap();
            c.push(w.append(part).unwrap());
        }
        c
    }

    /// Writes `events` through the sink's writer in the packed layout, publishes the file and
    /// opens it.
    fn write(dir: &std::path::Path, events: &[Event], deflate: Option<u8>) -> hdf5::File {
        let pool = Pool::new("t", 1 << 19, 64);
        let mut w = Hdf5EventWriter::create(
            dir,
            "cosmics#12",
            3,
            7,
            0o600,
            deflate,
            "event",
            Hdf5Layout::Packed,
        )
        .unwrap();
        for (id, flags, frags) in events {
            let chains: Vec<(FragmentHeader, Chain)> = frags
                .iter()
                .map(|(s, fl, p)| (header(*id, *s, *fl, p), chain(&pool, p)))
                .collect();
            let refs: Vec<(FragmentHeader, &Chain)> = chains.iter().map(|(h, c)| (*h, c)).collect();
            w.append_event(*id, *id as u32 + 100, *flags, &refs)
                .unwrap();
            w.flush_events().unwrap();
        }
        let meta = w.publish().unwrap();
        // the chunks written whole are not read back to measure the file: where they lie is
        // known, and their CRC32Cs (deflated ones are the library's, read back)
        let whole: u64 = w.known.iter().map(|k| k.len).sum();
        let lookups = (meta.payload_bytes as usize).div_ceil(CHUNK_BYTES) <= KNOWN_CHUNKS_MAX;
        match deflate {
            None if !lookups => assert_eq!(whole, 0, "too many chunks to look up: read back"),
            None => assert!(
                whole + CHUNK_BYTES as u64 > meta.payload_bytes && whole <= meta.payload_bytes,
                "{whole} of {} bytes known",
                meta.payload_bytes
            ),
            Some(_) => assert_eq!(whole, 0),
        }
        assert_eq!(meta.format, PACKED_FORMAT);
        assert_eq!(meta.version, PACKED_VERSION);
        assert_eq!(meta.events, events.len() as u64);
        let payload: usize = events
            .iter()
            .flat_map(|e| e.2.iter().map(|f| f.2.len()))
            .sum();
        assert_eq!(meta.payload_bytes, payload as u64);
        // the metadata's size and CRC32C (measured through the file's mapped pages) are the
        // file's as it lies on disk
        let path = dir.join("cosmics_12_bu3_000007.h5");
        let on_disk = std::fs::read(&path).unwrap();
        let json = std::fs::read_to_string(dir.join("cosmics_12_bu3_000007.h5.json")).unwrap();
        let said: crate::events::FileMeta = serde_json::from_str(&json).unwrap();
        assert_eq!(
            (said.bytes, said.crc32c),
            (on_disk.len() as u64, crc32c::crc32c(&on_disk))
        );
        hdf5::File::open(path).unwrap()
    }

    fn text(f: &hdf5::File, name: &str) -> String {
        f.attr(name)
            .unwrap()
            .read_scalar::<VarLenUnicode>()
            .unwrap()
            .to_string()
    }

    fn column<T: hdf5::H5Type>(f: &hdf5::File, path: &str) -> Vec<T> {
        f.dataset(path).unwrap().read_raw::<T>().unwrap()
    }

    /// Checks every index row and every byte of `events` in the file, as a reader who knows
    /// only docs/formats.md §12 would.
    fn check(f: &hdf5::File, events: &[Event]) {
        let data: Vec<u8> = column(f, DATA);
        let (ids, offsets, lengths): (Vec<u64>, Vec<u64>, Vec<u32>) = (
            column(f, "events/event_id"),
            column(f, "events/offset"),
            column(f, "events/length"),
        );
        let (triggers, flags, sources): (Vec<u32>, Vec<u16>, Vec<u16>) = (
            column(f, "events/trigger_number"),
            column(f, "events/flags"),
            column(f, "events/sources"),
        );
        let (f_off, f_event, f_len): (Vec<u64>, Vec<u32>, Vec<u32>) = (
            column(f, "fragments/offset"),
            column(f, "fragments/event"),
            column(f, "fragments/length"),
        );
        let (f_crc, f_src, f_flags): (Vec<u32>, Vec<u16>, Vec<u16>) = (
            column(f, "fragments/crc32c"),
            column(f, "fragments/source_id"),
            column(f, "fragments/flags"),
        );
        assert_eq!(ids.len(), events.len());
        let n_frags: usize = events.iter().map(|e| e.2.len()).sum();
        assert_eq!(f_off.len(), n_frags);
        let mut row = 0;
        let mut at = 0u64;
        for (i, (id, fl, frags)) in events.iter().enumerate() {
            assert_eq!(ids[i], *id);
            assert_eq!(triggers[i], *id as u32 + 100);
            assert_eq!(flags[i], *fl);
            assert_eq!(sources[i] as usize, frags.len());
            assert_eq!(offsets[i], at, "events back to back");
            let joined: Vec<u8> = frags.iter().flat_map(|f| f.2.clone()).collect();
            let (o, n) = (offsets[i] as usize, lengths[i] as usize);
            assert_eq!(&data[o..o + n], &joined[..], "event {id}'s bytes");
            for (s, ffl, p) in frags {
                assert_eq!(f_event[row] as usize, i);
                assert_eq!((f_src[row], f_flags[row]), (*s, *ffl));
                assert_eq!(f_crc[row], crc32c::crc32c(p));
                let (o, n) = (f_off[row] as usize, f_len[row] as usize);
                assert_eq!(&data[o..o + n], &p[..], "event {id} source {s}");
                row += 1;
            }
            at += joined.len() as u64;
        }
        assert_eq!(data.len() as u64, at, "nothing after the last event");
        assert_eq!(
            f.attr("events").unwrap().read_scalar::<u64>().unwrap(),
            events.len() as u64
        );
        assert_eq!(
            f.attr("payload_bytes")
                .unwrap()
                .read_scalar::<u64>()
                .unwrap(),
            at
        );
    }

    /// Events of several sizes, one partial with a MISSING placeholder, and events larger
    /// than a batch: the attributes, every index row and every byte read back.
    #[test]
    fn every_event_and_index_row_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut events: Vec<Event> = vec![
            (
                5,
                0,
                vec![(3, 0, b"three".to_vec()), (841, 0, vec![0xff; 300])],
            ),
            (
                6,
                EVENT_PARTIAL,
                vec![(3, 0, b"again".to_vec()), (841, FLAG_MISSING, vec![])],
            ),
            (9, 0, vec![]),
        ];
        // two batches and more, in events of 1.5 MiB of counted bytes
        for id in 10..14u64 {
            let big: Vec<u8> = (0..(3 << 19) + 777)
                .map(|i| (i as u64 * 7 + id) as u8)
                .collect();
            events.push((
                id,
                0,
                vec![(3, 0, big.clone()), (841, 0, big[..1000].to_vec())],
            ));
        }
        events.push((20, 0, vec![(3, 0, vec![1, 2, 3])]));
        let f = write(dir.path(), &events, None);
        assert_eq!(text(&f, "format"), PACKED_FORMAT);
        assert_eq!(text(&f, "layout"), "packed");
        assert_eq!(text(&f, "record_type"), "event");
        assert_eq!(text(&f, "run"), "cosmics#12");
        assert_eq!(
            f.attr("format_version")
                .unwrap()
                .read_scalar::<u16>()
                .unwrap(),
            1
        );
        assert_eq!(f.attr("bu").unwrap().read_scalar::<u16>().unwrap(), 3);
        assert_eq!(f.attr("sequence").unwrap().read_scalar::<u32>().unwrap(), 7);
        let data = f.dataset(DATA).unwrap();
        assert!(data.is_resizable(), "extensible");
        assert_eq!(data.chunk(), Some(vec![CHUNK_BYTES]));
        assert!(data.filters().is_empty(), "stored as it is");
        check(&f, &events);
        assert_eq!(column::<u16>(&f, "fragments/flags")[3], FLAG_MISSING);
        assert_eq!(column::<u32>(&f, "fragments/length")[3], 0);
        // no group or dataset per event
        assert_eq!(f.member_names().unwrap(), [DATA, EVENTS, FRAGMENTS]);
    }

    /// A file of more chunks than are looked up at its close is read back for its CRC32C:
    /// its metadata's size and CRC are still the file's, and every byte reads back.
    #[test]
    fn a_file_of_many_chunks_is_measured_by_reading_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let events: Vec<Event> = (0..(KNOWN_CHUNKS_MAX as u64 / 16 + 2))
            .map(|id| {
                let p: Vec<u8> = (0..(1 << 20) + 13)
                    .map(|i| (i * 3 + id as usize) as u8)
                    .collect();
                (id, 0, vec![(3, 0, p)])
            })
            .collect();
        let f = write(dir.path(), &events, None);
        check(&f, &events);
    }

    /// With deflate the data's chunks are compressed (the file far smaller than the
    /// repetitive payload) and read back the same.
    #[test]
    fn deflated_data_reads_back_the_same() {
        if !crate::hdf5_events::deflate_available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let events: Vec<Event> = (0..2000u64)
            .map(|id| {
                (
                    id,
                    0,
                    vec![(1, 0, vec![id as u8; 400]), (2, 0, vec![7; 600])],
                )
            })
            .collect();
        let f = write(dir.path(), &events, Some(6));
        let data = f.dataset(DATA).unwrap();
        assert_eq!(data.filters().len(), 1);
        assert_eq!(
            data.chunk(),
            Some(vec![2000 * 1000]),
            "one batch: one chunk"
        );
        check(&f, &events);
        drop(f);
        let size = std::fs::metadata(dir.path().join("cosmics_12_bu3_000007.h5"))
            .unwrap()
            .len();
        assert!(size < 2000 * 1000 / 4, "{size} bytes");
    }

    /// Small events cost their index rows: a file of 2,048 events of 1 KiB is within 1.1 of
    /// its payload.
    #[test]
    fn small_events_cost_little_more_than_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let events: Vec<Event> = (0..2048u64)
            .map(|id| {
                let p: Vec<u8> = (0..512).map(|i| (i as u64 ^ id) as u8).collect();
                (id, 0, vec![(1, 0, p.clone()), (2, 0, p)])
            })
            .collect();
        drop(write(dir.path(), &events, None));
        let size = std::fs::metadata(dir.path().join("cosmics_12_bu3_000007.h5"))
            .unwrap()
            .len();
        let payload = 2048.0 * 1024.0;
        assert!(size as f64 <= 1.1 * payload, "{size} bytes for {payload}");
    }

    /// A file of no event (one the sink would discard) still has every dataset, empty.
    #[test]
    fn a_file_of_no_event_has_every_dataset_empty() {
        let dir = tempfile::tempdir().unwrap();
        let f = write(dir.path(), &[], None);
        check(&f, &[]);
        assert_eq!(f.dataset(DATA).unwrap().shape(), vec![0]);
    }

    /// An event the index cannot describe is refused before anything of it is taken.
    #[test]
    fn an_event_of_too_many_fragments_is_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let f = hdf5::File::create(dir.path().join("x.h5")).unwrap();
        let mut p = PackedFile::start(&f, "event", "r", 0, 0, None).unwrap();
        let empty = Chain::new();
        let frags: Vec<(FragmentHeader, &Chain)> = (0..70_000)
            .map(|_| (header(1, 1, 0, &[]), &empty))
            .collect();
        assert!(p.append(1, 1, 0, &frags).is_err());
        assert_eq!(p.events(), 0);
        assert_eq!(p.unwritten_bytes(), 0);
    }
}

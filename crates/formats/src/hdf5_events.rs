//! Built-event files in HDF5 (the `hdf5` sink), for the readers the field already has (h5py,
//! ROOT, Julia, every notebook). The layout (docs/formats.md §6) follows DUNE's trigger
//! records where it fits: one group per built event, one dataset per source's fragment, a
//! header beside them, an index of the file's events and file attributes. With
//! [`Hdf5Layout::Dune`] the records are DUNE's instead (docs/formats.md §11,
//! [`crate::hdf5_dune`]), and with [`Hdf5Layout::Packed`] every event's bytes lie back to
//! back in one dataset with an index beside it (docs/formats.md §12,
//! [`crate::hdf5_packed`]), in files that live the same way.
//!
//! The file goes through the same stages as an `.evb` file ([`crate::events::PartWriter`]):
//! written under `.<name>.tmp`, made durable with its metadata beside it, renamed into place
//! once committed. Unlike an `.evb` file it cannot be cut back to its last whole event after
//! a failed write (the library owns the layout), so any failed write leaves it
//! [`EventFileError::Damaged`]: the sink then fails loudly and the BU's uncommitted events
//! are built again elsewhere, as after a crash.

use std::path::{Path, PathBuf};

use evb_buffers::Chain;
use evb_wire::{FragmentHeader, FRAGMENT_HEADER_LEN};
use hdf5::types::VarLenUnicode;
use hdf5_metno as hdf5;

use crate::events::{
    create_file, io_at, rename_into_place, EventFileError, FileMeta, PartWriter, PrepareJob,
};

/// The `format` attribute and metadata key of these files.
pub const HDF5_FORMAT: &str = "evb-hdf5";
/// Version of the layout.
pub const HDF5_FORMAT_VERSION: u16 = 1;

/// The group of event `id`: `Event` and the id in at least 12 digits, so that names sort as
/// ids do up to 10^12.
pub fn event_group_name(id: u64) -> String {
    format!("Event{id:012}")
}

/// The dataset of source `id`'s fragment in an event's group.
pub fn source_dataset_name(id: u16) -> String {
    format!("Source{id:05}")
}

/// Whether this build's HDF5 library can compress with deflate (gzip), which every HDF5
/// reader can read without plug-ins.
pub fn deflate_available() -> bool {
    hdf5::filters::deflate_available()
}

/// What an event of `fragments` fragments adds to a file besides its payload, a little more
/// than measured (about 1.1 KiB per event of 2 fragments): its group, attributes, datasets
/// and their headers. The sink keeps this much room free on the disk for the library's
/// metadata, which it writes when the file is closed.
pub const fn overhead_bytes(fragments: usize) -> u64 {
    1024 + 1024 * fragments as u64
}

/// The layout of a file's records (`sink.hdf5_layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Hdf5Layout {
    /// evb's own (docs/formats.md §6).
    #[default]
    Evb,
    /// DUNE's hdf5libs trigger records or time slices, file layout 5 (docs/formats.md §11;
    /// [`crate::hdf5_dune`]).
    Dune,
    /// Every event's bytes back to back in one dataset, an index row per event and per
    /// fragment (docs/formats.md §12; [`crate::hdf5_packed`]).
    Packed,
}

impl Hdf5Layout {
    /// What an event of `fragments` fragments adds to a file of this layout besides its
    /// payload, at most (the sink keeps this much room free on the disk).
    pub const fn overhead_bytes(self, fragments: usize) -> u64 {
        match self {
            Hdf5Layout::Evb | Hdf5Layout::Dune => overhead_bytes(fragments),
            Hdf5Layout::Packed => crate::hdf5_packed::overhead_bytes(fragments),
        }
    }
}

/// Rows of the file's `Index` group, one per event in file order.
#[derive(Default)]
struct Index {
    event_id: Vec<u64>,
    trigger_number: Vec<u32>,
    flags: Vec<u16>,
    fragments: Vec<u16>,
    payload_bytes: Vec<u64>,
}

/// Writes one HDF5 file of built events under a temporary name.
pub struct Hdf5EventWriter {
    file: Option<hdf5::File>,
    tmp: PathBuf,
    path: PathBuf,
    meta: FileMeta,
    index: Index,
    /// [`overhead_bytes`] of the events written.
    metadata: u64,
    /// deflate level of the payload datasets (None: stored as they are).
    deflate: Option<u8>,
    prepared: bool,
    renamed: bool,
    damaged: Option<String>,
    mode: u32,
    /// Records built by time: each gets its windows' table and frame indexes.
    by_time: bool,
    /// In DUNE's layout: what its records need (None: another layout).
    dune: Option<crate::hdf5_dune::DuneFile>,
    /// In the packed layout: its data dataset, batch and index (None: another layout).
    packed: Option<crate::hdf5_packed::PackedFile>,
    layout: Hdf5Layout,
    /// Where the packed layout's chunks lie and their CRC32Cs, once the file is closed.
    pub(crate) known: Vec<crate::file_crc::Known>,
}

/// One component's window in a record built by time (a row of `Windows`), and its frames
/// (rows of `Frames<sid>`: begin, end, payload offset in the `Source` dataset, length).
struct Component {
    row: [u64; 7],
    frames: Vec<[u64; 4]>,
}

/// The components of a fragment's payload `bytes` from source `ru_source`: its window
/// fragment, or each entry of a super-fragment of them (an RU of several streams); none for
/// a payload that is not one (the BU checked it: it is).
fn components(ru_source: u16, flags: u16, bytes: &[u8]) -> Vec<Component> {
    use evb_wire::window::decode_window;
    let parts: Vec<(u16, &[u8])> = if flags & evb_wire::FLAG_SUPER != 0 {
        let Ok(parts) = evb_wire::super_fragment::split(bytes) else {
            return Vec::new();
        };
        parts.into_iter().map(|(e, p)| (e.source_id, p)).collect()
    } else {
        vec![(ru_source, bytes)]
    };
    parts
        .into_iter()
        .filter_map(|(source, part)| {
            let w = decode_window(part).ok()?;
            let base = bytes.as_ptr() as usize;
            let frames: Vec<[u64; 4]> = w
                .frames
                .iter()
                .map(|(h, payload)| {
                    let offset = payload.as_ptr() as usize - base;
                    [h.begin, h.end, offset as u64, payload.len() as u64]
                })
                .collect();
            let h = w.header;
            Some(Component {
                row: [
                    source as u64,
                    ru_source as u64,
                    h.status as u64,
                    h.begin,
                    h.end,
                    h.core_end,
                    frames.len() as u64,
                ],
                frames,
            })
        })
        .collect()
}

/// The library's error on one line: its message up to the system's reason (the library
/// adds the time, buffer addresses and offsets of the failed write).
fn said(e: &hdf5::Error) -> String {
    let s = e.to_string();
    let first = s.lines().next().unwrap_or_default();
    let head = first.split(": time = ").next().unwrap_or(first);
    match s
        .split("error message = '")
        .nth(1)
        .and_then(|r| r.split('\'').next())
    {
        Some(why) => format!("{head}: {why}"),
        None => head.to_string(),
    }
}

impl Hdf5EventWriter {
    /// A new file `<run>_bu<bu>_<sequence>.h5` in `dir`, under its temporary name, with
    /// permission bits `mode` (less the umask) from its creation on; `record_type` says what
    /// its records are (`"event"`, or built by time `"slice"` or `"window"`), `layout` how
    /// they are laid out.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        dir: &Path,
        run: &str,
        bu: u16,
        sequence: u32,
        mode: u32,
        deflate: Option<u8>,
        record_type: &str,
        layout: Hdf5Layout,
    ) -> Result<Hdf5EventWriter, EventFileError> {
        let name = format!("{}_bu{bu}_{sequence:06}.h5", crate::run_stem(run));
        let path = dir.join(&name);
        let tmp = dir.join(format!(".{name}.tmp"));
        if path.exists() {
            return Err(io_at(&tmp)(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists", path.display()),
            )));
        }
        // made with its mode first: the library truncates it and keeps the mode, so no other
        // user can open it meanwhile
        create_file(&tmp, mode).map_err(io_at(&tmp))?;
        type Opened = (
            hdf5::File,
            Option<crate::hdf5_dune::DuneFile>,
            Option<crate::hdf5_packed::PackedFile>,
        );
        let opened = (|| -> hdf5::Result<Opened> {
            let f = hdf5::File::create(&tmp)?;
            match layout {
                Hdf5Layout::Dune => {
                    let d = crate::hdf5_dune::DuneFile::start(&f, record_type, run, bu, sequence)?;
                    return Ok((f, Some(d), None));
                }
                Hdf5Layout::Packed => {
                    let p = crate::hdf5_packed::PackedFile::start(
                        &f,
                        record_type,
                        run,
                        bu,
                        sequence,
                        deflate,
                    )?;
                    return Ok((f, None, Some(p)));
                }
                Hdf5Layout::Evb => {}
            }
            put_str(&f, "format", HDF5_FORMAT)?;
            f.new_attr::<u16>()
                .create("format_version")?
                .write_scalar(&HDF5_FORMAT_VERSION)?;
            put_str(&f, "record_type", record_type)?;
            put_str(&f, "run", run)?;
            f.new_attr::<u16>().create("bu")?.write_scalar(&bu)?;
            f.new_attr::<u32>()
                .create("sequence")?
                .write_scalar(&sequence)?;
            Ok((f, None, None))
        })();
        let (file, dune, packed) = match opened {
            Ok(f) => f,
            Err(e) => {
                // nothing of it is left: the sink may try again (a full disk)
                let _ = std::fs::remove_file(&tmp);
                return Err(io_at(&tmp)(std::io::Error::other(said(&e))));
            }
        };
        Ok(Hdf5EventWriter {
            file: Some(file),
            tmp,
            path,
            meta: match layout {
                Hdf5Layout::Evb => {
                    FileMeta::new(HDF5_FORMAT, HDF5_FORMAT_VERSION, run, bu, sequence, name)
                }
                Hdf5Layout::Dune => FileMeta::new(
                    crate::hdf5_dune::DUNE_FORMAT,
                    crate::dune::FILE_LAYOUT_VERSION as u16,
                    run,
                    bu,
                    sequence,
                    name,
                ),
                Hdf5Layout::Packed => FileMeta::new(
                    crate::hdf5_packed::PACKED_FORMAT,
                    crate::hdf5_packed::PACKED_VERSION,
                    run,
                    bu,
                    sequence,
                    name,
                ),
            },
            index: Index::default(),
            metadata: 0,
            deflate,
            prepared: false,
            renamed: false,
            damaged: None,
            mode,
            by_time: record_type != "event",
            dune,
            packed,
            layout,
            known: Vec::new(),
        })
    }

    fn check_whole(&self) -> Result<(), EventFileError> {
        match &self.damaged {
            Some(reason) => Err(EventFileError::Damaged {
                path: self.tmp.display().to_string(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    fn damage(&mut self, reason: String) -> EventFileError {
        self.damaged = Some(reason.clone());
        EventFileError::Damaged {
            path: self.tmp.display().to_string(),
            reason,
        }
    }

    fn write_event(
        &self,
        f: &hdf5::File,
        event_id: u64,
        trigger: u32,
        flags: u16,
        fragments: &[(FragmentHeader, &Chain)],
    ) -> hdf5::Result<()> {
        let g = f.create_group(&event_group_name(event_id))?;
        g.new_attr::<u64>()
            .create("event_id")?
            .write_scalar(&event_id)?;
        g.new_attr::<u32>()
            .create("trigger_number")?
            .write_scalar(&trigger)?;
        g.new_attr::<u16>().create("flags")?.write_scalar(&flags)?;
        let mut headers = Vec::with_capacity(fragments.len() * FRAGMENT_HEADER_LEN);
        for (h, _) in fragments {
            headers.extend_from_slice(&h.encode());
        }
        g.new_dataset::<u8>()
            .shape([fragments.len(), FRAGMENT_HEADER_LEN])
            .create("FragmentHeaders")?
            .write_raw(&headers)?;
        let mut joined = Vec::new();
        let mut windows: Vec<Component> = Vec::new();
        for (h, p) in fragments {
            let len = p.len();
            let mut b = g.new_dataset::<u8>().shape([len]);
            if let (Some(level), true) = (self.deflate, len > 0) {
                // one chunk per fragment up to 1 MiB: a reader inflates only what it reads
                b = b.chunk([len.min(1 << 20)]).deflate(level);
            }
            let ds = b.create(source_dataset_name(h.source_id).as_str())?;
            let mut chunks = p.chunks();
            let first = chunks.next().unwrap_or(&[]);
            let bytes: &[u8] = if first.len() == len {
                first
            } else {
                joined.clear();
                joined.extend_from_slice(first);
                for c in chunks {
                    joined.extend_from_slice(c);
                }
                &joined
            };
            if len > 0 {
                ds.write_raw(bytes)?;
            }
            if self.by_time && h.flags & evb_wire::FLAG_MISSING == 0 {
                windows.extend(components(h.source_id, h.flags, bytes));
            }
        }
        if self.by_time && !windows.is_empty() {
            let rows: Vec<u64> = windows.iter().flat_map(|c| c.row).collect();
            g.new_dataset::<u64>()
                .shape([windows.len(), 7])
                .create("Windows")?
                .write_raw(&rows)?;
            for c in &windows {
                let rows: Vec<u64> = c.frames.iter().flatten().copied().collect();
                let ds = g
                    .new_dataset::<u64>()
                    .shape([c.frames.len(), 4])
                    .create(format!("Frames{:05}", c.row[0]).as_str())?;
                if !rows.is_empty() {
                    ds.write_raw(&rows)?;
                }
            }
        }
        Ok(())
    }

    /// Writes the file's index and closes it (every handle: the library writes its last
    /// metadata then).
    fn close(&mut self) -> Result<(), String> {
        let Some(f) = self.file.take() else {
            return Ok(());
        };
        if let Some(d) = &self.dune {
            return d.finish(&f).and_then(|()| f.close()).map_err(|e| said(&e));
        }
        if let Some(p) = self.packed.as_mut() {
            let r = p.finish(&f).map(|known| self.known = known);
            // the data dataset's handle goes before the file's: the library writes its last
            // metadata when the file's last handle closes
            self.packed = None;
            return r.and_then(|()| f.close()).map_err(|e| said(&e));
        }
        let ix = &self.index;
        let r = (|| -> hdf5::Result<()> {
            let g = f.create_group("Index")?;
            g.new_dataset_builder()
                .with_data(&ix.event_id)
                .create("event_id")?;
            g.new_dataset_builder()
                .with_data(&ix.trigger_number)
                .create("trigger_number")?;
            g.new_dataset_builder()
                .with_data(&ix.flags)
                .create("flags")?;
            g.new_dataset_builder()
                .with_data(&ix.fragments)
                .create("fragments")?;
            g.new_dataset_builder()
                .with_data(&ix.payload_bytes)
                .create("payload_bytes")?;
            f.new_attr::<u64>()
                .create("events")?
                .write_scalar(&self.meta.events)?;
            drop(g);
            f.close()
        })();
        r.map_err(|e| said(&e))
    }
}

pub(crate) fn put_str(f: &hdf5::File, name: &str, value: &str) -> hdf5::Result<()> {
    let v: VarLenUnicode = value
        .parse()
        .map_err(|e| hdf5::Error::from(format!("{name}: {e}")))?;
    f.new_attr::<VarLenUnicode>().create(name)?.write_scalar(&v)
}

impl PartWriter for Hdf5EventWriter {
    fn append_event(
        &mut self,
        event_id: u64,
        trigger: u32,
        flags: u16,
        fragments: &[(FragmentHeader, &Chain)],
    ) -> Result<(), EventFileError> {
        self.check_whole()?;
        let Some(f) = self.file.as_ref() else {
            return Err(self.damage("written after it was closed".into()));
        };
        let written = match (self.dune.as_mut(), self.packed.as_mut()) {
            (Some(d), _) => d.write_record(f, event_id, trigger, flags, fragments, self.deflate),
            (None, Some(p)) => p.append(event_id, trigger, flags, fragments),
            (None, None) => self.write_event(f, event_id, trigger, flags, fragments),
        };
        if let Err(e) = written {
            return Err(self.damage(format!("event {event_id}: {}", said(&e))));
        }
        let payload = fragments.iter().map(|(_, p)| p.len() as u64).sum::<u64>();
        let m = &mut self.meta;
        m.events += 1;
        m.payload_bytes += payload;
        // what the file grows by, near enough for its size limit (the true size is in the
        // metadata once it is closed)
        let overhead = self.layout.overhead_bytes(fragments.len());
        m.bytes += payload + overhead;
        self.metadata += overhead;
        m.first_event.get_or_insert(event_id);
        m.last_event = Some(event_id);
        if self.packed.is_some() {
            // its own index holds the rows
            return Ok(());
        }
        let ix = &mut self.index;
        ix.event_id.push(event_id);
        ix.trigger_number.push(trigger);
        ix.flags.push(flags);
        ix.fragments.push(fragments.len() as u16);
        ix.payload_bytes.push(payload);
        Ok(())
    }

    fn flush_events(&mut self) -> Result<(), EventFileError> {
        // the library keeps what it wrote in its cache until the file is closed and synced
        // ([`PartWriter::begin_prepare`]); an event is durable only then, as in `.evb` files
        self.check_whole()
    }

    fn events(&self) -> u64 {
        self.meta.events
    }

    fn bytes(&self) -> u64 {
        self.meta.bytes
    }

    fn begin_prepare(&mut self) -> Result<Option<PrepareJob>, EventFileError> {
        if self.prepared || self.renamed {
            return Ok(None);
        }
        self.check_whole()?;
        if let Err(e) = self.close() {
            return Err(self.damage(e));
        }
        let data = std::fs::File::open(&self.tmp).map_err(io_at(&self.tmp))?;
        Ok(Some(
            PrepareJob::new(data, self.tmp.clone(), self.meta.clone(), self.mode, true)
                .knowing(self.known.clone()),
        ))
    }

    fn prepared(&mut self) {
        self.prepared = true;
    }

    fn publish(&mut self) -> Result<FileMeta, EventFileError> {
        if !self.prepared {
            if let Some(job) = self.begin_prepare()? {
                job.run()?;
            }
            self.prepared = true;
        }
        rename_into_place(&self.tmp, &self.path, &mut self.renamed)?;
        // (its true size and checksum are in its metadata file, measured by the prepare job)
        Ok(self.meta.clone())
    }

    fn discard(self: Box<Self>) {
        let mut me = self;
        drop(me.packed.take());
        drop(me.file.take());
        let _ = std::fs::remove_file(&me.tmp);
        let _ = std::fs::remove_file(me.tmp.with_extension("json.tmp"));
    }

    fn name(&self) -> &str {
        &self.meta.file
    }

    fn set_ranges(&mut self, ranges: &[(u64, u32)]) {
        self.meta.ranges = ranges.to_vec();
    }

    fn unwritten_bytes(&self) -> u64 {
        // the library's metadata of an open file, and its index (written at the close)
        match (&self.file, &self.packed) {
            (Some(_), Some(p)) => p.unwritten_bytes(),
            (Some(_), None) => self.metadata + self.meta.events * 26,
            (None, _) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evb_wire::super_fragment::{encode_directory, SuperEntry};
    use evb_wire::window::{TimeFrameHeader, WindowHeader, WindowStatus};

    /// A window fragment of source `source` over `[100, 300)` with a frame per payload, each
    /// 100 ticks from 100 on.
    fn window(source: u16, status: WindowStatus, payloads: &[&[u8]]) -> Vec<u8> {
        let mut frames = Vec::new();
        for (i, p) in payloads.iter().enumerate() {
            let mut h = TimeFrameHeader {
                begin: 100 + 100 * i as u64,
                end: 200 + 100 * i as u64,
                source_id: source,
                flags: 0,
                crc: 0,
            };
            h.crc = h.crc_of([*p]);
            frames.push([&h.encode()[..], p].concat());
        }
        let mut out = WindowHeader {
            begin: 100,
            end: 300,
            core_end: 300,
            status,
            frames: frames.len() as u32,
        }
        .encode()
        .to_vec();
        let mut off = 0u32;
        for f in &frames {
            out.extend_from_slice(&off.to_le_bytes());
            out.extend_from_slice(&(f.len() as u32).to_le_bytes());
            off += f.len() as u32;
        }
        for f in &frames {
            out.extend_from_slice(f);
        }
        out
    }

    /// The `Windows` rows and `Frames` indexes of a super-fragment of two streams' windows
    /// (an RU of several streams): one component per entry, each frame's offset pointing at
    /// its payload in the RU's `Source` dataset, an EMPTY entry with no frame.
    #[test]
    fn a_super_fragment_of_windows_is_one_component_per_stream() {
        let a = window(7, WindowStatus::Complete, &[b"abc", b"de"]);
        let b = window(9, WindowStatus::Empty, &[]);
        let entries = [(7u16, &a), (9, &b)].map(|(s, w)| SuperEntry {
            source_id: s,
            flags: 0,
            trigger_number: 100,
            length: w.len() as u32,
        });
        let mut bytes = Vec::new();
        encode_directory(&entries, &mut bytes);
        bytes.extend_from_slice(&a);
        bytes.extend_from_slice(&b);
        let c = components(3, evb_wire::FLAG_SUPER | evb_wire::FLAG_WINDOW, &bytes);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].row, [7, 3, 0, 100, 300, 300, 2]);
        assert_eq!(c[1].row, [9, 3, 3, 100, 300, 300, 0]);
        for (f, want) in c[0].frames.iter().zip([&b"abc"[..], b"de"]) {
            let (off, len) = (f[2] as usize, f[3] as usize);
            assert_eq!(&bytes[off..off + len], want);
        }
        assert_eq!(c[0].frames[1][..2], [200, 300]);
        // one stream's window as it is
        let one = components(7, evb_wire::FLAG_WINDOW, &a);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].row[..2], [7, 7]);
    }
}

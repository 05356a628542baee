//! The run manifest (docs/formats.md §7): what a run triggered and built, its verdict, and
//! every output file it published with the event ids in it, so that completeness can be
//! judged from the output folder alone ([`judge`]).
//!
//! The EVM writes `<run>.manifest.json` into the sink's folder when the run ends (from its
//! ledger and the published files' metadata); `evb inspect --run DIR` and outside readers
//! judge it.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::events::FileMeta;

pub const MANIFEST_FORMAT: &str = "evb-run-manifest";
pub const MANIFEST_VERSION: u16 = 1;

/// One published output file of the run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ManifestPart {
    pub file: String,
    pub format: String,
    pub bu: u16,
    pub sequence: u32,
    pub events: u64,
    pub bytes: u64,
    pub crc32c: u32,
    /// `[first, count]` runs of the event ids in the file.
    pub ranges: Vec<(u64, u32)>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunManifest {
    pub format: String,
    pub version: u16,
    pub run: String,
    /// `"OK"` or `"FAILED"`, as the run's verdict line says.
    pub verdict: String,
    /// What is wrong with the run (empty when OK), as the verdict lists it.
    pub problems: Vec<String>,
    /// Events triggered: the ids `0 .. triggered`.
    pub triggered: u64,
    /// Of those, final (built and committed) by the ledger.
    pub released: u64,
    /// Built with a source missing (flagged in their files).
    pub partial: u64,
    /// Every published file of the run, by name.
    pub parts: Vec<ManifestPart>,
    /// Temporary files of the run's BUs left in the folder (`.<name>.tmp`, a BU that died
    /// or was dropped): never output; `evb inspect --run DIR --clean` removes them.
    pub temporaries: Vec<String>,
    /// The configuration the run ran (without its secret), written beside its files as
    /// `<run>.config.toml`, with its size and SHA-256 (§7.3). Absent in manifests written
    /// before 2026-11-28.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<crate::evidence::ManifestFile>,
    /// Which nodes came and went during the run, and when (the EVM's node events: BUs
    /// lost, rejoined, joined, retired), in order. Absent where none, and in manifests
    /// written before 2026-11-28's fifth stop.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_events: Vec<ManifestNodeEvent>,
    /// Spare BUs that never joined the run (they wrote nothing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spares_out: Vec<String>,
}

/// Something that happened to a node during the run (docs/protocol.md §4, the EVM's
/// report: `evm.lost`), as the manifest keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ManifestNodeEvent {
    /// `"bu[2]"`, `"ru[0]"`.
    pub node: String,
    /// Seconds from the run's start.
    pub at_s: f64,
    /// `"joined"`, `"lost"`, `"rejoined"`, `"retiring"`, `"retired"`, ...
    pub kind: String,
}

/// The manifest's file name for run `run`.
pub fn manifest_name(run: &str) -> String {
    format!("{}.manifest.json", crate::run_stem(run))
}

/// The run's published files (`<run>_bu<i>_<seq>.evb|.h5` with their `.json`) in `dir`
/// whose metadata was written at or after `since`, and its temporary files, by name.
pub fn scan(dir: &Path, run: &str, since: Option<SystemTime>) -> (Vec<ManifestPart>, Vec<String>) {
    let (mut parts, mut temporaries) = (Vec::new(), Vec::new());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (parts, temporaries);
    };
    let prefix = format!("{}_bu", crate::run_stem(run));
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(hidden) = name.strip_prefix('.') {
            if hidden.starts_with(&prefix) && hidden.ends_with(".tmp") {
                temporaries.push(name);
            }
            continue;
        }
        if !name.starts_with(&prefix)
            || !(name.ends_with(".evb.json") || name.ends_with(".h5.json"))
        {
            continue;
        }
        let fresh = since.is_none_or(|t| {
            e.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|m| m >= t)
        });
        let meta = std::fs::read(e.path())
            .ok()
            .and_then(|b| serde_json::from_slice::<FileMeta>(&b).ok());
        if let Some(m) = meta.filter(|m| fresh && m.run == run) {
            parts.push(ManifestPart {
                file: m.file,
                format: m.format,
                bu: m.bu,
                sequence: m.sequence,
                events: m.events,
                bytes: m.bytes,
                crc32c: m.crc32c,
                ranges: m.ranges,
            });
        }
    }
    parts.sort_by_key(|p| (p.bu, p.sequence));
    temporaries.sort();
    (parts, temporaries)
}

/// Writes `m` into `dir` as [`manifest_name`], whole or not at all (a temporary renamed
/// into place, synced), with permission bits `mode` (less the umask) as the run's files.
pub fn write(dir: &Path, m: &RunManifest, mode: u32) -> std::io::Result<PathBuf> {
    let path = dir.join(manifest_name(&m.run));
    let tmp = dir.join(format!(".{}.tmp", manifest_name(&m.run)));
    let text = serde_json::to_string_pretty(m).map_err(std::io::Error::other)? + "\n";
    let mut f = crate::events::create_file(&tmp, mode)?;
    f.write_all(text.as_bytes())?;
    f.sync_data()?;
    std::fs::rename(&tmp, &path)?;
    File::open(dir)?.sync_all()?;
    Ok(path)
}

/// What the files say of a run ([`judge`]).
#[derive(Debug, Default, PartialEq)]
pub struct Judgement {
    /// Every triggered id is in exactly one intact file, or the manifest accounts for it.
    pub complete: bool,
    /// Ids in `0 .. triggered` in no file, as `(first, last)` runs.
    pub missing: Vec<(u64, u64)>,
    /// Ids in more than one file, as `(first, last)` runs.
    pub twice: Vec<(u64, u64)>,
    /// Ids the manifest says were never made final (triggered − released).
    pub unreleased: u64,
    /// Events found in intact files.
    pub events: u64,
    /// Files the manifest lists that are absent or whose size or CRC32C differs.
    pub bad_files: Vec<String>,
    /// What is wrong with each listed file that is not as the manifest lists it: the data
    /// files of `bad_files` (in the manifest's order), and each listed file's metadata
    /// (`<file>.json`) that is absent or says otherwise than the manifest. A fault of the
    /// metadata alone leaves the file's events counted.
    pub faults: Vec<PartFault>,
    /// Temporary files of the run still in the folder.
    pub temporaries: Vec<String>,
}

impl Judgement {
    /// Complete, and every listed data file and its metadata as the manifest lists them.
    pub fn as_published(&self) -> bool {
        self.complete && self.faults.is_empty()
    }
}

/// A listed file (a data file, or its metadata `<file>.json`) that is not as listed.
#[derive(Debug, Clone, PartialEq)]
pub struct PartFault {
    pub file: String,
    /// `file` is a listed file's metadata (`<file>.json`), not the data file.
    pub metadata: bool,
    pub fault: Fault,
}

/// How a listed file differs from the manifest ([`PartFault`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Not in the folder.
    Absent,
    /// There, but it cannot be read (or the manifest's name is not a name in the folder).
    Unreadable(String),
    /// Its size is not the listed one (and so, as a rule, its CRC32C neither).
    Size {
        listed: u64,
        found: u64,
        listed_crc32c: u32,
        found_crc32c: u32,
        content: Option<Content>,
    },
    /// Its size is the listed one, its CRC32C not.
    Crc32c {
        listed: u32,
        found: u32,
        bytes: u64,
        content: Option<Content>,
    },
    /// Size and CRC32C as listed, but its event ids are not the listed ones (the manifest
    /// disagrees with itself).
    Ids,
    /// A metadata file that does not read as evb metadata.
    NotMetadata(String),
    /// A metadata file whose `key` says `found` where the manifest says `listed`.
    Metadata {
        key: &'static str,
        listed: String,
        found: String,
    },
}

/// What a changed `.evb` file holds, as far as it reads ([`Fault`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    /// It does not begin with an evb file header: why.
    NotEvb(String),
    /// An evb file.
    Events {
        /// The run id in its header.
        run: String,
        /// That run id is the manifest's.
        same_run: bool,
        /// Whole events read before the first that does not read (all, when none fails);
        /// `None`: a compressed file that does not unpack.
        whole: Option<u64>,
        /// The first event that does not read: where and why.
        bad: Option<String>,
        /// Every event read, and their ids are exactly the listed ones in order.
        ids_as_listed: bool,
    },
}

impl std::fmt::Display for Content {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Content::NotEvb(why) => write!(f, "not an evb file ({why})"),
            Content::Events {
                run,
                same_run,
                whole,
                bad,
                ids_as_listed,
            } => {
                if !same_run {
                    write!(f, "an evb file of run \"{run}\" by its header, ")?;
                }
                match (whole, bad) {
                    (Some(n), Some(bad)) => write!(f, "{n} whole events, then {bad}"),
                    (None, Some(bad)) => write!(f, "its events do not unpack: {bad}"),
                    (_, None) if *ids_as_listed => {
                        write!(f, "every event reads, with the listed ids, but other bytes")
                    }
                    (n, None) => {
                        let n = n.unwrap_or(0);
                        write!(f, "every event reads ({n}), but not with the listed ids")?;
                        if *same_run {
                            write!(
                                f,
                                ": a file of run id \"{run}\" that the run did not publish \
                                 (another run of the same id, or a copy)"
                            )?;
                        }
                        Ok(())
                    }
                }
            }
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let content = |f: &mut std::fmt::Formatter<'_>, c: &Option<Content>| match c {
            Some(c) => write!(f, "; {c}"),
            None => Ok(()),
        };
        match self {
            Fault::Absent => write!(f, "absent"),
            Fault::Unreadable(why) => write!(f, "cannot be read: {why}"),
            Fault::Size {
                listed,
                found,
                listed_crc32c,
                found_crc32c,
                content: c,
            } => {
                write!(
                    f,
                    "changed: size {found} bytes where the manifest lists {listed} \
                     (CRC32C {found_crc32c:#010x}, listed {listed_crc32c:#010x})"
                )?;
                content(f, c)
            }
            Fault::Crc32c {
                listed,
                found,
                bytes,
                content: c,
            } => {
                write!(
                    f,
                    "changed: CRC32C {found:#010x} where the manifest lists {listed:#010x} \
                     (size {bytes} bytes, as listed)"
                )?;
                content(f, c)
            }
            Fault::Ids => write!(
                f,
                "size and CRC32C as listed, but its event ids are not the ones the manifest lists"
            ),
            Fault::NotMetadata(why) => write!(f, "changed: not evb metadata ({why})"),
            Fault::Metadata { key, listed, found } => write!(
                f,
                "changed: its \"{key}\" is {found} where the manifest lists {listed}"
            ),
        }
    }
}

/// Whether `ids` are exactly the ids `p.ranges` lists, in order.
fn ids_as_listed(ids: &[u64], p: &ManifestPart) -> bool {
    ids.iter().copied().eq(p
        .ranges
        .iter()
        .flat_map(|&(a, n)| a..a.saturating_add(n as u64)))
}

/// The event ids of the `.evb` file `data` in file order (`None`: bad).
fn evb_ids(data: Vec<u8>, name: &str) -> Option<Vec<u64>> {
    crate::events::EventFile::parse(data, name.to_string())
        .ok()?
        .map(|e| e.ok().map(|e| e.event_id))
        .collect()
}

/// What the `.evb` file `data` holds, against the part `p` of run `run`.
fn content(data: Vec<u8>, p: &ManifestPart, run: &str) -> Content {
    use crate::events::{parse_file_header, EventFile, EventFileError};
    let why = |e: EventFileError| match e {
        EventFileError::Bad { offset, reason, .. } => format!("at byte {offset}: {reason}"),
        e => e.to_string(),
    };
    let h = match parse_file_header(&data, &p.file) {
        Ok(h) => h,
        Err(EventFileError::Bad { reason, .. }) => return Content::NotEvb(reason),
        Err(e) => return Content::NotEvb(e.to_string()),
    };
    let same_run = h.run == run;
    let compressed = h.codec != 0;
    let f = match EventFile::parse(data, p.file.clone()) {
        Ok(f) => f,
        Err(e) => {
            return Content::Events {
                run: h.run,
                same_run,
                whole: None,
                bad: Some(why(e)),
                ids_as_listed: false,
            }
        }
    };
    let (mut ids, mut bad) = (Vec::new(), None);
    for e in f {
        match e {
            Ok(e) => ids.push(e.event_id),
            Err(EventFileError::Bad { reason, .. }) if compressed => {
                // its offsets are those of the unpacked image, not of the file
                bad = Some(format!("event {} of the file: {reason}", ids.len() + 1));
                break;
            }
            Err(e) => {
                bad = Some(why(e));
                break;
            }
        }
    }
    Content::Events {
        run: h.run,
        same_run,
        whole: Some(ids.len() as u64),
        ids_as_listed: bad.is_none() && ids_as_listed(&ids, p),
        bad,
    }
}

/// The size and CRC32C of the file at `path`, read through once.
fn size_and_crc(path: &Path) -> std::io::Result<(u64, u32)> {
    use std::io::Read;
    let mut f = File::open(path)?;
    let (mut size, mut crc, mut buf) = (0u64, 0u32, vec![0u8; 1 << 20]);
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok((size, crc));
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        size += n as u64;
    }
}

/// At most `limit` bytes from the start of the file at `path`.
fn read_prefix(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut v = Vec::new();
    File::open(path)?.take(limit).read_to_end(&mut v)?;
    Ok(v)
}

/// The most bytes read of a metadata file: evb's are a few KiB (its `ranges` grow with a
/// file's events, a few bytes each).
const METADATA_LIMIT: u64 = 64 << 20;

/// The metadata file at `path` ([`FileMeta`]), or why not.
fn read_meta(path: &Path) -> Result<FileMeta, Fault> {
    let data = read_prefix(path, METADATA_LIMIT + 1).map_err(io_fault)?;
    if data.len() as u64 > METADATA_LIMIT {
        return Err(Fault::NotMetadata(format!(
            "more than {METADATA_LIMIT} bytes"
        )));
    }
    serde_json::from_slice(&data).map_err(|e| Fault::NotMetadata(e.to_string()))
}

fn io_fault(e: std::io::Error) -> Fault {
    if e.kind() == std::io::ErrorKind::NotFound {
        Fault::Absent
    } else {
        Fault::Unreadable(e.to_string())
    }
}

/// A name of a file directly in the folder (no path, not `.` or `..`).
fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// What is wrong with the data file of `p` in `dir` (`None`: as listed, with the listed ids
/// for an `.evb` file).
fn data_fault(dir: &Path, p: &ManifestPart, run: &str) -> Option<Fault> {
    if !plain_name(&p.file) {
        return Some(Fault::Unreadable(
            "not the name of a file in the folder".into(),
        ));
    }
    let path = dir.join(&p.file);
    let changed = |found: (u64, u32), content: Option<Content>| {
        if found.0 != p.bytes {
            Fault::Size {
                listed: p.bytes,
                found: found.0,
                listed_crc32c: p.crc32c,
                found_crc32c: found.1,
                content,
            }
        } else {
            Fault::Crc32c {
                listed: p.crc32c,
                found: found.1,
                bytes: found.0,
                content,
            }
        }
    };
    if p.file.ends_with(".evb") {
        // read once: its size and CRC32C, then its events from the same bytes
        let data = match std::fs::read(&path) {
            Ok(d) => d,
            Err(e) => return Some(io_fault(e)),
        };
        let found = (data.len() as u64, crc32c::crc32c(&data));
        if found != (p.bytes, p.crc32c) {
            return Some(changed(found, Some(content(data, p, run))));
        }
        match evb_ids(data, &p.file) {
            Some(ids) if ids_as_listed(&ids, p) => None,
            _ => Some(Fault::Ids),
        }
    } else {
        match size_and_crc(&path) {
            Err(e) => Some(io_fault(e)),
            Ok(found) if found == (p.bytes, p.crc32c) => None,
            Ok(found) => Some(changed(found, None)),
        }
    }
}

/// What is wrong with the metadata file `<file>.json` of `p` in `dir` (`None`: it says what
/// the manifest lists).
fn metadata_fault(dir: &Path, p: &ManifestPart, run: &str) -> Option<Fault> {
    if !plain_name(&p.file) {
        return None; // said of the data file
    }
    let meta = match read_meta(&dir.join(format!("{}.json", p.file))) {
        Ok(m) => m,
        Err(f) => return Some(f),
    };
    let differs = |key: &'static str, listed: String, found: String| {
        (listed != found).then_some(Fault::Metadata { key, listed, found })
    };
    let q = |s: &str| format!("\"{s}\"");
    differs("run", q(run), q(&meta.run))
        .or_else(|| differs("file", q(&p.file), q(&meta.file)))
        .or_else(|| differs("format", q(&p.format), q(&meta.format)))
        .or_else(|| differs("bu", p.bu.to_string(), meta.bu.to_string()))
        .or_else(|| {
            differs(
                "sequence",
                p.sequence.to_string(),
                meta.sequence.to_string(),
            )
        })
        .or_else(|| differs("events", p.events.to_string(), meta.events.to_string()))
        .or_else(|| differs("bytes", p.bytes.to_string(), meta.bytes.to_string()))
        .or_else(|| {
            differs(
                "crc32c",
                format!("{:#010x}", p.crc32c),
                format!("{:#010x}", meta.crc32c),
            )
        })
        .or_else(|| {
            (p.ranges != meta.ranges).then(|| Fault::Metadata {
                key: "ranges",
                listed: format!("{} runs of ids", p.ranges.len()),
                found: format!("{} runs, not the same", meta.ranges.len()),
            })
        })
}

/// Judges the run of manifest `m` from the files in `dir`: each listed file must be there
/// with its size and CRC32C (an `.evb` file holding exactly the ids listed for it), and the ids of the intact ones must cover `0 .. triggered`
/// exactly once. A run whose manifest says some events were never released is complete
/// when no id is in two files and the ids in none are exactly as many as it says. Each
/// listed file's metadata (`<file>.json`) must say what the manifest lists
/// ([`Judgement::faults`]; not part of [`Judgement::complete`]).
pub fn judge(dir: &Path, m: &RunManifest) -> Judgement {
    let mut j = Judgement::default();
    // every id run of every intact file, as (first, last), swept in order
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for p in &m.parts {
        let data = data_fault(dir, p, &m.run);
        let meta = metadata_fault(dir, p, &m.run);
        let intact = data.is_none();
        if let Some(fault) = data {
            j.bad_files.push(p.file.clone());
            j.faults.push(PartFault {
                file: p.file.clone(),
                metadata: false,
                fault,
            });
        }
        if let Some(fault) = meta {
            j.faults.push(PartFault {
                file: format!("{}.json", p.file),
                metadata: true,
                fault,
            });
        }
        if !intact {
            continue;
        }
        spans.extend(
            p.ranges
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|&(first, n)| (first, first.saturating_add(n as u64 - 1))),
        );
        j.events += p.events;
    }
    spans.sort_unstable();
    let mut next = 0u64; // the lowest id no span has covered yet
    for (a, b) in spans {
        if a > next {
            j.missing.push((next, a - 1));
        }
        if a < next {
            let overlap = (a, b.min(next - 1));
            match j.twice.last_mut() {
                Some(last) if last.1 + 1 >= overlap.0 => last.1 = last.1.max(overlap.1),
                _ => j.twice.push(overlap),
            }
        }
        next = next.max(b.saturating_add(1));
    }
    let beyond = next > m.triggered;
    if next < m.triggered {
        j.missing.push((next, m.triggered - 1));
    }
    j.unreleased = m.triggered.saturating_sub(m.released);
    let missing: u64 = j.missing.iter().fold(0u64, |sum, (a, b)| {
        sum.saturating_add((b - a).saturating_add(1))
    });
    j.temporaries = scan(dir, &m.run, None).1;
    j.complete = j.bad_files.is_empty() && j.twice.is_empty() && !beyond && missing == j.unreleased;
    j
}

/// Whether a file named `name` looks like data or its metadata, by its name: it ends in
/// `.evb`, `.h5` or `.hdf5`, then optionally `.json`, then optionally a compressor's
/// suffix (`.zst`, `.zstd`, `.gz`, `.xz`, `.bz2`, `.lz4`), then optionally `.tmp`
/// (case aside).
pub fn looks_like_data(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    let mut n = n.as_str();
    n = n.strip_suffix(".tmp").unwrap_or(n);
    for c in COMPRESSED {
        if let Some(rest) = n.strip_suffix(c) {
            n = rest;
            break;
        }
    }
    n = n.strip_suffix(".json").unwrap_or(n);
    [".evb", ".h5", ".hdf5"].iter().any(|s| n.ends_with(s))
}

const COMPRESSED: [&str; 6] = [".zst", ".zstd", ".gz", ".xz", ".bz2", ".lz4"];

/// A file in a run folder that looks like data ([`looks_like_data`]) and that no manifest
/// there lists ([`folder`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Stray {
    pub file: String,
    pub kind: StrayKind,
}

/// What a [`Stray`] is, as far as its bytes say.
#[derive(Debug, Clone, PartialEq)]
pub enum StrayKind {
    /// Not what its name says: no evb file header (`.evb`), not evb metadata (`.json`),
    /// no HDF5 signature (`.h5`, `.hdf5`).
    Junk(String),
    /// Of a run id that no manifest in the folder has, by its header or metadata (`by`).
    OtherRun { run: String, by: &'static str },
    /// Of a run id that a manifest here has (by its header or metadata), which does not
    /// list it. Nothing in an evb file tells two runs of the same id apart: another run of
    /// the same id, or a copy. `copy_of`: a listed file whose size and CRC32C it has (for
    /// metadata: whose size and CRC32C it gives).
    SameRunId {
        run: String,
        by: &'static str,
        copy_of: Option<String>,
    },
    /// Not read (compressed, an HDF5 file with no metadata beside it, or unreadable): why.
    NotListed(String),
}

impl std::fmt::Display for StrayKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StrayKind::Junk(why) => write!(f, "junk: {why}"),
            StrayKind::OtherRun { run, by } => {
                write!(f, "another run id's: {by} names run id \"{run}\"")
            }
            StrayKind::SameRunId {
                run,
                copy_of: Some(of),
                ..
            } => write!(
                f,
                "not this run's: a copy of {of} of run \"{run}\" (the same size and CRC32C), \
                 which the manifest lists under that name"
            ),
            StrayKind::SameRunId { run, by, .. } => write!(
                f,
                "not this run's: {by} names run id \"{run}\", the run's own, but the \
                 manifest does not list it: another run of the same id, or a copy"
            ),
            StrayKind::NotListed(why) => write!(f, "not the manifest's: {why}"),
        }
    }
}

/// A run folder beyond its runs' listed files ([`folder`]).
#[derive(Debug, Default, PartialEq)]
pub struct FolderCheck {
    /// Every file that looks like data and that no manifest lists, by name.
    pub strays: Vec<Stray>,
    /// Every other entry that is not judged (its name is not that of data, a manifest or a
    /// listed run's temporary, and does not begin with `.`), by name; folders end in `/`.
    pub others: Vec<String>,
}

/// The files of `dir` that no manifest of `manifests` accounts for: every file whose name
/// looks like data ([`looks_like_data`], hidden ones too) and that is neither a listed
/// file, nor a listed file's metadata, nor a temporary of one of the runs (as [`scan`] finds
/// them), each read as far as it takes to say what it is ([`StrayKind`]); and the other
/// entries, by name (run manifests, `*.manifest.json`, are neither).
pub fn folder(dir: &Path, manifests: &[RunManifest]) -> FolderCheck {
    use std::collections::{BTreeSet, HashMap};
    let mut known: BTreeSet<String> = BTreeSet::new();
    // (size, CRC32C) of each listed data file -> its name and run
    let mut by_content: HashMap<(u64, u32), (&str, &str)> = HashMap::new();
    for m in manifests {
        for p in &m.parts {
            known.insert(p.file.clone());
            known.insert(format!("{}.json", p.file));
            by_content
                .entry((p.bytes, p.crc32c))
                .or_insert((p.file.as_str(), m.run.as_str()));
        }
        known.extend(scan(dir, &m.run, None).1);
        if let Some(c) = &m.config {
            known.insert(c.file.clone());
        }
    }
    let runs: BTreeSet<&str> = manifests.iter().map(|m| m.run.as_str()).collect();
    let mut check = FolderCheck::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return check;
    };
    let mut names: Vec<(String, bool)> = entries
        .filter_map(|e| e.ok())
        .map(|e| {
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            (e.file_name().to_string_lossy().into_owned(), is_dir)
        })
        .collect();
    names.sort();
    for (name, is_dir) in names {
        if known.contains(&name) || (name.ends_with(".manifest.json") && !name.starts_with('.')) {
            continue;
        }
        if is_dir || !looks_like_data(&name) {
            if !name.starts_with('.') {
                check
                    .others
                    .push(if is_dir { format!("{name}/") } else { name });
            }
            continue;
        }
        let kind = stray_kind(&dir.join(&name), &name, &runs, &by_content);
        check.strays.push(Stray { file: name, kind });
    }
    check
}

/// What the unlisted data-like file at `path` (named `name`) is.
fn stray_kind(
    path: &Path,
    name: &str,
    runs: &std::collections::BTreeSet<&str>,
    by_content: &std::collections::HashMap<(u64, u32), (&str, &str)>,
) -> StrayKind {
    let of_run = |run: String, by: &'static str, copy_of: Option<String>| {
        if runs.contains(run.as_str()) {
            StrayKind::SameRunId { run, by, copy_of }
        } else {
            StrayKind::OtherRun { run, by }
        }
    };
    let lower = name.to_ascii_lowercase();
    let inner = lower.strip_suffix(".tmp").unwrap_or(&lower);
    if inner.ends_with(".json") {
        let meta = match read_meta(path) {
            Ok(m) => m,
            Err(Fault::NotMetadata(why)) => {
                return StrayKind::Junk(format!("not evb metadata ({why})"))
            }
            Err(f) => return StrayKind::NotListed(f.to_string()),
        };
        let copy_of = by_content
            .get(&(meta.bytes, meta.crc32c))
            .filter(|(_, run)| *run == meta.run)
            .map(|(file, _)| format!("{file}.json"));
        return of_run(meta.run, "its metadata", copy_of);
    }
    let found = match size_and_crc(path) {
        Ok(sc) => sc,
        Err(e) => return StrayKind::NotListed(format!("cannot be read: {e}")),
    };
    let copy = by_content.get(&found).copied();
    if COMPRESSED.iter().any(|c| inner.ends_with(c)) {
        return match copy {
            Some((file, run)) => of_run(run.to_string(), "its bytes", Some(file.to_string())),
            None => StrayKind::NotListed("compressed as a whole; not read".into()),
        };
    }
    if inner.ends_with(".evb") {
        let head = match read_prefix(path, 16 + u16::MAX as u64) {
            Ok(h) => h,
            Err(e) => return StrayKind::NotListed(format!("cannot be read: {e}")),
        };
        return match crate::events::parse_file_header(&head, name) {
            Ok(h) => of_run(h.run, "its header", copy.map(|(f, _)| f.to_string())),
            Err(crate::events::EventFileError::Bad { reason, .. }) => StrayKind::Junk(reason),
            Err(e) => StrayKind::Junk(e.to_string()),
        };
    }
    // .h5 / .hdf5
    if !hdf5_signature(path, found.0) {
        return StrayKind::Junk("no HDF5 signature".into());
    }
    let mut beside = path.as_os_str().to_owned();
    beside.push(".json");
    match read_meta(Path::new(&beside)) {
        Ok(meta) => of_run(meta.run, "its metadata", copy.map(|(f, _)| f.to_string())),
        Err(_) => match copy {
            Some((file, run)) => of_run(run.to_string(), "its bytes", Some(file.to_string())),
            None => StrayKind::NotListed(
                "an HDF5 file with no evb metadata beside it; its run id is not read".into(),
            ),
        },
    }
}

/// Whether the file at `path`, of `size` bytes, has the HDF5 signature where the format
/// puts it (byte 0, 512, 1024, 2048 ...).
fn hdf5_signature(path: &Path, size: u64) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    const SIGNATURE: [u8; 8] = [0x89, b'H', b'D', b'F', b'\r', b'\n', 0x1a, b'\n'];
    let Ok(mut f) = File::open(path) else {
        return false;
    };
    let mut at = 0u64;
    while at + 8 <= size {
        let mut b = [0u8; 8];
        if f.seek(SeekFrom::Start(at)).is_ok() && f.read_exact(&mut b).is_ok() && b == SIGNATURE {
            return true;
        }
        at = if at == 0 { 512 } else { at * 2 };
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventFileWriter, PartWriter};
    use evb_buffers::{Chain, Pool};
    use evb_wire::FragmentHeader;

    /// Publishes `<run>_bu<bu>_<sequence>.evb` in `dir` holding the events `ids`, each one
    /// fragment of `size` bytes.
    fn publish(dir: &Path, run: &str, bu: u16, sequence: u32, ids: std::ops::Range<u64>) {
        let pool = Pool::new("t", 4096, 4);
        let mut w = EventFileWriter::create(dir, run, bu, sequence).unwrap();
        let first = ids.start;
        for id in ids.clone() {
            let payload = vec![id as u8; 64];
            let mut block = pool.try_alloc().unwrap();
            let chain = Chain::from_slice(block.append(&payload).unwrap());
            let h = FragmentHeader {
                event_id: id,
                trigger_number: id as u32,
                source_id: 1,
                flags: 0,
                payload_size: 64,
                payload_crc: crc32c::crc32c(&payload),
            };
            w.write_event(id, id as u32, 0, &[(h, &chain)]).unwrap();
        }
        PartWriter::set_ranges(&mut w, &[(first, (ids.end - first) as u32)]);
        w.finish().unwrap();
    }

    /// A run `r` of 20 events in two files, its manifest as the EVM makes it.
    fn run(dir: &Path) -> RunManifest {
        publish(dir, "r", 0, 0, 0..10);
        publish(dir, "r", 1, 0, 10..20);
        RunManifest {
            format: MANIFEST_FORMAT.into(),
            version: MANIFEST_VERSION,
            run: "r".into(),
            verdict: "OK".into(),
            problems: Vec::new(),
            triggered: 20,
            released: 20,
            partial: 0,
            parts: scan(dir, "r", None).0,
            temporaries: Vec::new(),
            config: None,
            node_events: Vec::new(),
            spares_out: Vec::new(),
        }
    }

    fn fault_of<'a>(j: &'a Judgement, file: &str) -> &'a Fault {
        &j.faults.iter().find(|f| f.file == file).unwrap().fault
    }

    #[test]
    fn a_clean_run_is_as_published_and_its_folder_holds_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        let m = run(d.path());
        assert_eq!(m.parts.len(), 2);
        let j = judge(d.path(), &m);
        assert!(j.as_published(), "{j:?}");
        assert_eq!(j.events, 20);
        assert_eq!(folder(d.path(), &[m]), FolderCheck::default());
    }

    #[test]
    fn each_changed_part_says_how() {
        let d = tempfile::tempdir().unwrap();
        let m = run(d.path());
        let a = d.path().join("r_bu0_000000.evb");
        let b = d.path().join("r_bu1_000000.evb");
        let (len_a, len_b) = (m.parts[0].bytes, m.parts[1].bytes);
        // cut inside its last event
        std::fs::OpenOptions::new()
            .write(true)
            .open(&a)
            .unwrap()
            .set_len(len_a - 10)
            .unwrap();
        let mut data = std::fs::read(&b).unwrap();
        let at = data.len() / 2;
        data[at] ^= 0x01;
        std::fs::write(&b, &data).unwrap();
        let j = judge(d.path(), &m);
        assert!(!j.complete);
        assert_eq!(j.bad_files, ["r_bu0_000000.evb", "r_bu1_000000.evb"]);
        assert_eq!(j.missing, [(0, 19)]);
        match fault_of(&j, "r_bu0_000000.evb") {
            Fault::Size {
                listed,
                found,
                content: Some(Content::Events { whole, bad, .. }),
                ..
            } => {
                assert_eq!((*listed, *found), (len_a, len_a - 10));
                assert_eq!(*whole, Some(9));
                assert!(bad.as_deref().unwrap().contains("truncated"), "{bad:?}");
            }
            f => panic!("{f:?}"),
        }
        match fault_of(&j, "r_bu1_000000.evb") {
            Fault::Crc32c {
                listed,
                found,
                bytes,
                content: Some(Content::Events { bad: Some(_), .. }),
            } => {
                assert_eq!(*bytes, len_b);
                assert_eq!(*listed, m.parts[1].crc32c);
                assert_eq!(*found, crc32c::crc32c(&data));
            }
            f => panic!("{f:?}"),
        }
        let said = fault_of(&j, "r_bu1_000000.evb").to_string();
        assert!(said.starts_with("changed: CRC32C 0x"), "{said}");

        std::fs::remove_file(&a).unwrap();
        std::fs::write(&b, b"not an event file at all").unwrap();
        let j = judge(d.path(), &m);
        assert_eq!(fault_of(&j, "r_bu0_000000.evb"), &Fault::Absent);
        assert!(matches!(
            fault_of(&j, "r_bu1_000000.evb"),
            Fault::Size {
                content: Some(Content::NotEvb(_)),
                ..
            }
        ));
        // the metadata was not touched
        assert!(j.faults.iter().all(|f| !f.metadata), "{:?}", j.faults);
    }

    #[test]
    fn a_listed_files_metadata_must_say_what_the_manifest_lists() {
        let d = tempfile::tempdir().unwrap();
        let m = run(d.path());
        let meta = d.path().join("r_bu0_000000.evb.json");
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
        v["crc32c"] = 7.into();
        std::fs::write(&meta, v.to_string()).unwrap();
        std::fs::remove_file(d.path().join("r_bu1_000000.evb.json")).unwrap();
        let j = judge(d.path(), &m);
        // the events are all there: complete, but not as published
        assert!(j.complete && !j.as_published(), "{j:?}");
        assert!(matches!(
            fault_of(&j, "r_bu0_000000.evb.json"),
            Fault::Metadata { key: "crc32c", .. }
        ));
        assert_eq!(fault_of(&j, "r_bu1_000000.evb.json"), &Fault::Absent);
        std::fs::write(&meta, "{").unwrap();
        let j = judge(d.path(), &m);
        assert!(matches!(
            fault_of(&j, "r_bu0_000000.evb.json"),
            Fault::NotMetadata(_)
        ));
    }

    #[test]
    fn every_unlisted_data_file_is_named_and_told_apart() {
        let d = tempfile::tempdir().unwrap();
        let m = run(d.path());
        let p = d.path();
        std::fs::write(p.join("junk_bu0_000099.evb"), vec![0x5au8; 3000]).unwrap();
        publish(p, "other", 0, 0, 0..5);
        publish(p, "r", 0, 7, 20..25); // after the manifest: not listed
        std::fs::copy(p.join("r_bu1_000000.evb"), p.join("copy.evb")).unwrap();
        std::fs::write(p.join("r_bu0_000000.evb.zst"), b"(zstd)").unwrap();
        std::fs::write(p.join("x.h5"), b"not hdf5").unwrap();
        let mut h5 = vec![0u8; 600];
        h5[512..520].copy_from_slice(&[0x89, b'H', b'D', b'F', b'\r', b'\n', 0x1a, b'\n']);
        std::fs::write(p.join("y.hdf5"), &h5).unwrap();
        std::fs::copy(
            p.join("other_bu0_000000.evb"),
            p.join(".o_bu0_000001.evb.tmp"),
        )
        .unwrap();
        std::fs::write(p.join("notes.txt"), b"hi").unwrap();
        std::fs::create_dir(p.join("sub")).unwrap();
        std::fs::write(p.join(".hidden"), b"").unwrap();
        let f = folder(p, &[m]);
        let kinds: Vec<(&str, &StrayKind)> = f
            .strays
            .iter()
            .map(|s| (s.file.as_str(), &s.kind))
            .collect();
        let other = |by| StrayKind::OtherRun {
            run: "other".into(),
            by,
        };
        let same = |by, copy_of: Option<&str>| StrayKind::SameRunId {
            run: "r".into(),
            by,
            copy_of: copy_of.map(String::from),
        };
        assert_eq!(kinds.len(), 10, "{kinds:#?}");
        assert_eq!(kinds[0], (".o_bu0_000001.evb.tmp", &other("its header")));
        assert_eq!(
            kinds[1],
            ("copy.evb", &same("its header", Some("r_bu1_000000.evb")))
        );
        assert!(matches!(
            kinds[2],
            ("junk_bu0_000099.evb", StrayKind::Junk(_))
        ));
        assert_eq!(kinds[3], ("other_bu0_000000.evb", &other("its header")));
        assert_eq!(
            kinds[4],
            ("other_bu0_000000.evb.json", &other("its metadata"))
        );
        assert!(matches!(
            kinds[5],
            ("r_bu0_000000.evb.zst", StrayKind::NotListed(_))
        ));
        assert_eq!(kinds[6], ("r_bu0_000007.evb", &same("its header", None)));
        assert_eq!(
            kinds[7],
            ("r_bu0_000007.evb.json", &same("its metadata", None))
        );
        assert_eq!(
            kinds[8],
            ("x.h5", &StrayKind::Junk("no HDF5 signature".into()))
        );
        assert!(matches!(kinds[9], ("y.hdf5", StrayKind::NotListed(_))));
        assert_eq!(f.others, ["notes.txt", "sub/"]);
    }

    #[test]
    fn names_that_look_like_data() {
        for n in [
            "a.evb",
            "a.EVB",
            "a.evb.json",
            "a.h5",
            "a.hdf5.json",
            "a.evb.zst",
            "a.evb.json.gz",
            ".a.evb.tmp",
            ".a.evb.json.tmp",
        ] {
            assert!(looks_like_data(n), "{n}");
        }
        for n in [
            "a.json",
            "a.manifest.json",
            "a.txt",
            "evb",
            "a.evb.bak",
            "a.tmp",
        ] {
            assert!(!looks_like_data(n), "{n}");
        }
    }

    /// Malformed manifests and files are judged, never a panic.
    #[test]
    fn malformed_input_is_judged_without_a_panic() {
        let d = tempfile::tempdir().unwrap();
        let mut m = run(d.path());
        m.parts[0].file = "../../etc/passwd".into();
        m.parts[1].ranges = vec![(u64::MAX - 1, u32::MAX), (0, u32::MAX)];
        m.triggered = u64::MAX;
        let j = judge(d.path(), &m);
        assert!(!j.complete);
        assert!(matches!(
            fault_of(&j, "../../etc/passwd"),
            Fault::Unreadable(_)
        ));
        for (i, bytes) in [
            b"EVBE".to_vec(),
            b"EVBE\x01\x00\x00\x00\x00\x00\x00\x00\xff\xff\x00\x00r".to_vec(),
            b"EVBE\x02\x00\x00\x00\x00\x00\x00\x00\x01\x00\x01\x00rEVEV".to_vec(),
            Vec::new(),
        ]
        .into_iter()
        .enumerate()
        {
            std::fs::write(d.path().join(format!("bad{i}.evb")), &bytes).unwrap();
            std::fs::write(d.path().join(format!("bad{i}.evb.json")), &bytes).unwrap();
            std::fs::write(d.path().join(format!("bad{i}.h5")), &bytes).unwrap();
        }
        let f = folder(d.path(), &[m]);
        // those twelve, and the renamed part's own file and metadata, now listed by no name
        assert_eq!(f.strays.len(), 14, "{:#?}", f.strays);
    }
}

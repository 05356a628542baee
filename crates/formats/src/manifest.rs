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
}

/// The manifest's file name for run `run`.
pub fn manifest_name(run: &str) -> String {
    format!("{run}.manifest.json")
}

/// The run's published files (`<run>_bu<i>_<seq>.evb|.h5` with their `.json`) in `dir`
/// whose metadata was written at or after `since`, and its temporary files, by name.
pub fn scan(dir: &Path, run: &str, since: Option<SystemTime>) -> (Vec<ManifestPart>, Vec<String>) {
    let (mut parts, mut temporaries) = (Vec::new(), Vec::new());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (parts, temporaries);
    };
    let prefix = format!("{run}_bu");
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
    /// Temporary files of the run still in the folder.
    pub temporaries: Vec<String>,
}

/// The ids `p.ranges` lists, in order.
fn listed(p: &ManifestPart) -> Vec<u64> {
    p.ranges
        .iter()
        .flat_map(|&(a, n)| a..a + n as u64)
        .collect()
}

/// The event ids of the `.evb` file `data` in file order (`None`: bad).
fn evb_ids(data: Vec<u8>, name: &str) -> Option<Vec<u64>> {
    crate::events::EventFile::parse(data, name.to_string())
        .ok()?
        .map(|e| e.ok().map(|e| e.event_id))
        .collect()
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

/// Judges the run of manifest `m` from the files in `dir`: each listed file must be there
/// with its size and CRC32C (an `.evb` file holding exactly the ids listed for it), and the ids of the intact ones must cover `0 .. triggered`
/// exactly once. A run whose manifest says some events were never released is complete
/// when no id is in two files and the ids in none are exactly as many as it says.
pub fn judge(dir: &Path, m: &RunManifest) -> Judgement {
    let mut j = Judgement::default();
    // every id run of every intact file, as (first, last), swept in order
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for p in &m.parts {
        let path = dir.join(&p.file);
        let intact = if p.file.ends_with(".evb") {
            // read once: its size and CRC32C, then its events from the same bytes
            std::fs::read(&path).is_ok_and(|data| {
                (data.len() as u64, crc32c::crc32c(&data)) == (p.bytes, p.crc32c)
                    && evb_ids(data, &p.file).is_some_and(|ids| ids == listed(p))
            })
        } else {
            size_and_crc(&path).is_ok_and(|sc| sc == (p.bytes, p.crc32c))
        };
        if !intact {
            j.bad_files.push(p.file.clone());
            continue;
        }
        spans.extend(
            p.ranges
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|&(first, n)| (first, first + n as u64 - 1)),
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
        next = next.max(b + 1);
    }
    let beyond = next > m.triggered;
    if next < m.triggered {
        j.missing.push((next, m.triggered - 1));
    }
    j.unreleased = m.triggered.saturating_sub(m.released);
    let missing: u64 = j.missing.iter().map(|(a, b)| b - a + 1).sum();
    j.temporaries = scan(dir, &m.run, None).1;
    j.complete = j.bad_files.is_empty() && j.twice.is_empty() && !beyond && missing == j.unreleased;
    j
}

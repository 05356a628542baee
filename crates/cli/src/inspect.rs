//! `evb inspect`: what a data file holds, and whether every checksum in it is right.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use evb_formats::events::{
    EventFile, FileMeta, EVENT_CORRUPT, EVENT_PARTIAL, EVENT_TRIGGER_MISMATCH,
};
use evb_formats::{fed, framed};
use evb_wire::{super_fragment, window, FLAG_MISSING, FLAG_SUPER, FLAG_SYNC_LOSS, FLAG_WINDOW};

/// Sizes seen, for min / mean / max.
#[derive(Default)]
struct Sizes {
    n: u64,
    sum: u64,
    min: u64,
    max: u64,
}

impl Sizes {
    fn add(&mut self, v: u64) {
        self.min = if self.n == 0 { v } else { self.min.min(v) };
        self.max = self.max.max(v);
        self.n += 1;
        self.sum += v;
    }
    fn show(&self) -> String {
        if self.n == 0 {
            return "-".into();
        }
        format!(
            "{} / {:.0} / {} bytes (min / mean / max)",
            self.min,
            self.sum as f64 / self.n as f64,
            self.max
        )
    }
}

fn hex_head(bytes: &[u8], max: usize) -> String {
    let shown: Vec<String> = bytes.iter().take(max).map(|b| format!("{b:02x}")).collect();
    let more = if bytes.len() > max { " ..." } else { "" };
    format!("{}{more}", shown.join(" "))
}

/// A directory stands for the completed event files in it (hidden temporary files left out).
pub fn event_files(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut inside: Vec<PathBuf> = std::fs::read_dir(p)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    f.extension().is_some_and(|x| x == "evb")
                        && !f
                            .file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with('.'))
                })
                .collect();
            inside.sort();
            out.extend(inside);
        } else {
            out.push(p.clone());
        }
    }
    out
}

/// Event ids found in more than one evb event file (or twice in one): a consumer would take
/// them twice. Returns one line per duplicated id, at most `show`, and the total.
pub fn duplicates_across(files: &[PathBuf], show: usize) -> (Vec<String>, u64) {
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let mut lines = Vec::new();
    let mut total = 0u64;
    for (k, f) in files.iter().enumerate() {
        // the ids from the event headers: the bodies are not read back
        let Ok(ids) = evb_formats::events::event_ids(f) else {
            continue;
        };
        for id in ids {
            if let Some(first) = seen.insert(id, k) {
                total += 1;
                if lines.len() < show {
                    lines.push(format!(
                        "event {id} is in {} and in {}",
                        files[first].display(),
                        f.display()
                    ));
                }
            }
        }
    }
    (lines, total)
}

/// What the files held, for the grand total of several: events in evb event files, fragments
/// or records in fragment files (FED, evb framed), bytes of every file read.
#[derive(Default)]
struct Totals {
    files: u64,
    events: u64,
    fragments: u64,
    bytes: u64,
}

impl Totals {
    fn line(&self) -> String {
        let fragments = if self.fragments > 0 {
            format!(", {} fragments (in fragment files)", self.fragments)
        } else {
            String::new()
        };
        format!(
            "total: {} files, {} events{fragments}, {} bytes",
            self.files, self.events, self.bytes
        )
    }
}

/// Inspects every file (a directory: every completed event file in it); false if any
/// problem was found, including an event id in two files.
pub fn run(paths: &[PathBuf], event: Option<u64>) -> bool {
    let files = event_files(paths);
    let mut ok = true;
    if files.is_empty() {
        println!("no files to inspect");
        return false;
    }
    let (dups, n) = duplicates_across(&files, 10);
    if n > 0 {
        ok = false;
    }
    let mut totals = Totals::default();
    for f in &files {
        match std::fs::read(f) {
            Err(e) => {
                println!("{}: cannot read: {e}", f.display());
                ok = false;
            }
            Ok(data) => {
                totals.files += 1;
                totals.bytes += data.len() as u64;
                let good = if data.starts_with(b"EVBE") {
                    events_file(f, data, event, &mut totals.events)
                } else if data.starts_with(&framed::RECORD_MAGIC) {
                    framed_file(f, &data, event, &mut totals.fragments)
                } else if data.len() >= 8 && data[7] >> 4 == 0x5 {
                    fed_file(f, &data, event, &mut totals.fragments)
                } else if data.starts_with(b"\x89HDF\r\n\x1a\n") {
                    // not read here (no HDF5 library in every build): said what reads it
                    println!(
                        "{}: an HDF5 file (the hdf5 sink): `evb inspect FILE` reads .evb, \
                         framed and FED files; judge an HDF5 run with `evb inspect --run \
                         <its folder>` (every file's size and CRC32C against the run's \
                         manifest) and read its events with h5py (docs/formats.md §6, §11, §12)",
                        f.display()
                    );
                    false
                } else {
                    println!(
                        "{}: not an evb event file, an evb framed file or a FED file",
                        f.display()
                    );
                    false
                };
                ok &= good;
            }
        }
    }
    if n > 0 {
        println!("DUPLICATES: {n} event ids appear more than once across these files:");
        for d in dups {
            println!("  {d}");
        }
    } else if files.len() > 1 {
        println!("{} files: no event id appears twice", files.len());
    }
    if files.len() > 1 {
        println!("{}", totals.line());
    }
    ok
}

fn events_file(path: &Path, data: Vec<u8>, dump: Option<u64>, total: &mut u64) -> bool {
    let file_crc = crc32c::crc32c(&data);
    let len = data.len() as u64;
    let f = match EventFile::parse(data, path.display().to_string()) {
        Ok(f) => f,
        Err(e) => {
            println!("{e}");
            return false;
        }
    };
    println!(
        "{}: evb event file, run {:?}, BU {}, sequence {}",
        path.display(),
        f.run,
        f.bu,
        f.sequence
    );
    let mut problems = Vec::new();
    let mut sources: BTreeMap<u16, u64> = BTreeMap::new();
    // streams inside super-fragments, and events built with a stream flagged for sync loss
    let mut streams: BTreeMap<u16, u64> = BTreeMap::new();
    let mut sync_losses = 0u64;
    let (mut events, mut partial, mut mismatch, mut corrupt) = (0u64, 0u64, 0u64, 0u64);
    let mut sizes = Sizes::default();
    let mut windows = WindowCounts::default();
    let (mut first, mut last) = (None, None);
    for ev in f {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                problems.push(e.to_string());
                continue;
            }
        };
        events += 1;
        first.get_or_insert(ev.event_id);
        last = Some(ev.event_id);
        partial += (ev.flags & EVENT_PARTIAL != 0) as u64;
        mismatch += (ev.flags & EVENT_TRIGGER_MISMATCH != 0) as u64;
        corrupt += (ev.flags & EVENT_CORRUPT != 0) as u64;
        sizes.add(ev.fragments.iter().map(|(_, p)| p.len() as u64).sum());
        for (h, p) in &ev.fragments {
            *sources.entry(h.source_id).or_default() += 1;
            if h.flags & FLAG_MISSING == 0 && crc32c::crc32c(p) != h.payload_crc {
                problems.push(format!(
                    "event {}: source {} payload CRC32C mismatch",
                    ev.event_id, h.source_id
                ));
            }
            if h.flags & FLAG_WINDOW != 0 {
                for (source, part) in window_parts(h.source_id, h.flags, p) {
                    match window::decode_window(part) {
                        Ok(w) => windows.count(&w),
                        Err(e) => problems.push(format!(
                            "record {}: source {source}: window fragment: {e}",
                            ev.event_id
                        )),
                    }
                }
            }
            if h.flags & FLAG_SUPER != 0 {
                match super_fragment::decode_directory(p, p.len()) {
                    Ok(entries) => {
                        for e in entries {
                            *streams.entry(e.source_id).or_default() += 1;
                        }
                    }
                    Err(e) => problems.push(format!(
                        "event {}: source {}: super-fragment: {e}",
                        ev.event_id, h.source_id
                    )),
                }
            }
        }
        sync_losses += ev
            .fragments
            .iter()
            .any(|(h, _)| h.flags & FLAG_SYNC_LOSS != 0) as u64;
        if dump == Some(ev.event_id) {
            println!(
                "  event {} at byte {}: trigger {}, flags {:#06x}, {} fragments",
                ev.event_id,
                ev.offset,
                ev.trigger_number,
                ev.flags,
                ev.fragments.len()
            );
            for (h, p) in &ev.fragments {
                println!(
                    "    source {:>5} trigger {:>8} flags {:#06x} {:>8} bytes crc32c {:#010x}: {}",
                    h.source_id,
                    h.trigger_number,
                    h.flags,
                    p.len(),
                    h.payload_crc,
                    hex_head(p, 32)
                );
                if h.flags & FLAG_SUPER != 0 {
                    dump_super(p);
                }
                if h.flags & FLAG_WINDOW != 0 {
                    for (_, part) in window_parts(h.source_id, h.flags, p) {
                        dump_window(part);
                    }
                }
            }
        }
    }
    let meta_path = std::path::PathBuf::from(format!("{}.json", path.display()));
    match std::fs::read_to_string(&meta_path).map(|t| serde_json::from_str::<FileMeta>(&t)) {
        Ok(Ok(m)) => {
            if m.crc32c != file_crc || m.bytes != len || m.events != events {
                problems.push(format!(
                    "metadata {} disagrees with the file",
                    meta_path.display()
                ));
            }
        }
        Ok(Err(e)) => problems.push(format!("metadata {}: {e}", meta_path.display())),
        Err(_) => println!("  (no metadata file beside it)"),
    }
    let ids = match (first, last) {
        (Some(a), Some(b)) => format!(", ids {a} .. {b}"),
        _ => String::new(),
    };
    *total += events;
    println!("  {events} events{ids}; event payload {}", sizes.show());
    let src: Vec<String> = sources.iter().map(|(s, n)| format!("{s} ({n})")).collect();
    println!("  sources: {}", src.join(", "));
    if !streams.is_empty() {
        let st: Vec<String> = streams.iter().map(|(s, n)| format!("{s} ({n})")).collect();
        println!(
            "  streams in super-fragments: {}; events with a sync loss flagged: {sync_losses}",
            st.join(", ")
        );
    }
    if windows.fragments > 0 {
        println!("  {}", windows.line());
    }
    println!("  partial {partial}, trigger mismatches {mismatch}, flagged corrupt {corrupt}");
    verdict(&problems)
}

/// What a file's window fragments (records built by time) held.
#[derive(Default)]
struct WindowCounts {
    fragments: u64,
    frames: u64,
    frame_bytes: u64,
    late: u64,
    missing: u64,
    empty: u64,
}

/// A window fragment's parts with their sources: itself, or each entry of a super-fragment
/// of them (an RU of several streams); a directory that does not decode gives the whole,
/// for the decoder to name what is wrong.
fn window_parts(source: u16, flags: u16, p: &[u8]) -> Vec<(u16, &[u8])> {
    if flags & FLAG_SUPER == 0 {
        return vec![(source, p)];
    }
    match super_fragment::split(p) {
        Ok(parts) => parts
            .into_iter()
            .map(|(e, part)| (e.source_id, part))
            .collect(),
        Err(_) => vec![(source, p)],
    }
}

impl WindowCounts {
    fn count(&mut self, w: &window::WindowFragment<'_>) {
        self.fragments += 1;
        self.frames += w.frames.len() as u64;
        self.frame_bytes += w.frames.iter().map(|(_, p)| p.len() as u64).sum::<u64>();
        match w.header.status {
            window::WindowStatus::Late => self.late += 1,
            window::WindowStatus::Missing => self.missing += 1,
            window::WindowStatus::Empty => self.empty += 1,
            window::WindowStatus::Complete => {}
        }
    }

    fn line(&self) -> String {
        format!(
            "window fragments {} (LATE {}, MISSING {}, EMPTY {}), holding {} time frames of {} payload bytes",
            self.fragments, self.late, self.missing, self.empty, self.frames, self.frame_bytes
        )
    }
}

/// One window fragment: its window and status, and its frames, one line each (the first 8).
fn dump_window(p: &[u8]) {
    let Ok(w) = window::decode_window(p) else {
        return;
    };
    let h = w.header;
    println!(
        "      window [{}, {}) core end {}, {:?}, {} frames",
        h.begin,
        h.end,
        h.core_end,
        h.status,
        w.frames.len()
    );
    for (f, data) in w.frames.iter().take(8) {
        println!(
            "        frame [{}, {}) source {:>5} flags {:#06x} {:>8} bytes: {}",
            f.begin,
            f.end,
            f.source_id,
            f.flags,
            data.len(),
            hex_head(data, 16)
        );
    }
    if w.frames.len() > 8 {
        println!("        ... {} more", w.frames.len() - 8);
    }
}

/// The streams of one super-fragment, one line each.
fn dump_super(p: &[u8]) {
    let Ok(entries) = super_fragment::split(p) else {
        return;
    };
    for (e, bytes) in entries {
        let mut what = Vec::new();
        if e.flags & super_fragment::ENTRY_MISSING != 0 {
            what.push("left out");
        }
        if e.flags & super_fragment::ENTRY_SYNC_LOSS != 0 {
            what.push("SYNC LOSS");
        }
        println!(
            "      stream source {:>5} trigger {:>8} flags {:#06x} {:>8} bytes{}: {}",
            e.source_id,
            e.trigger_number,
            e.flags,
            e.length,
            if what.is_empty() {
                String::new()
            } else {
                format!(" ({})", what.join(", "))
            },
            hex_head(bytes, 24)
        );
    }
}

fn verdict(problems: &[String]) -> bool {
    if problems.is_empty() {
        println!("  checksums: all valid");
        true
    } else {
        println!("  checksums: {} problems", problems.len());
        for p in problems.iter().take(20) {
            println!("    - {p}");
        }
        false
    }
}

fn fed_file(path: &Path, data: &[u8], dump: Option<u64>, total: &mut u64) -> bool {
    println!("{}: CMS FED fragments", path.display());
    let ranges = match fed::split(data) {
        Ok(r) => r,
        Err(e) => {
            println!("  {e}");
            return false;
        }
    };
    let mut problems = Vec::new();
    let mut sources: BTreeMap<u16, u64> = BTreeMap::new();
    let mut sizes = Sizes::default();
    let (mut lo, mut hi) = (u32::MAX, 0);
    for (k, r) in ranges.iter().enumerate() {
        let frag = &data[r.clone()];
        sizes.add(frag.len() as u64);
        match fed::validate(frag, r.start, None) {
            Ok(info) => {
                *sources.entry(info.source_id).or_default() += 1;
                lo = lo.min(info.lv1_id);
                hi = hi.max(info.lv1_id);
                if dump == Some(k as u64) {
                    println!(
                        "  fragment {k} at byte {}: LV1 {}, BX {}, source {}, type {}, {} words: {}",
                        r.start,
                        info.lv1_id,
                        info.bx_id,
                        info.source_id,
                        info.event_type,
                        info.words,
                        hex_head(frag, 32)
                    );
                }
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    *total += ranges.len() as u64;
    println!(
        "  {} fragments, LV1 ids {lo} .. {hi}; size {}",
        ranges.len(),
        sizes.show()
    );
    let src: Vec<String> = sources.iter().map(|(s, n)| format!("{s} ({n})")).collect();
    println!("  sources: {}", src.join(", "));
    verdict(&problems)
}

fn framed_file(path: &Path, data: &[u8], dump: Option<u64>, total: &mut u64) -> bool {
    println!("{}: evb framed fragments", path.display());
    let mut problems = Vec::new();
    let mut sizes = Sizes::default();
    let mut at = 0;
    let mut k = 0u64;
    while at < data.len() {
        match framed::read_at(data, at) {
            Ok((rec, crc)) => {
                sizes.add(rec.payload.len() as u64);
                if let Some(e) = crc {
                    problems.push(e.to_string());
                }
                if dump == Some(k) {
                    println!(
                        "  record {k} at byte {}: trigger {}, {} bytes: {}",
                        rec.offset,
                        rec.trigger_number,
                        rec.payload.len(),
                        hex_head(&data[rec.payload.clone()], 32)
                    );
                }
                at = rec.payload.end;
                k += 1;
            }
            Err(e) => {
                problems.push(format!("{e} (the rest of the file cannot be read)"));
                break;
            }
        }
    }
    *total += k;
    println!("  {k} records; size {}", sizes.show());
    verdict(&problems)
}

#[cfg(test)]
mod tests {
    use evb_buffers::{Chain, Pool};
    use evb_formats::events::EventFileWriter;
    use evb_wire::FragmentHeader;

    /// Two files sharing ids 3 and 4, one file holding id 9 twice, and a file that is no
    /// event file: three duplicates found, each line naming both files, the junk skipped.
    #[test]
    fn an_id_in_two_files_or_twice_in_one_is_a_duplicate() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::new("t", 4096, 8);
        let write = |seq: u32, ids: &[u64]| {
            let mut w = EventFileWriter::create(dir.path(), "dup", 0, seq).unwrap();
            for &e in ids {
                let mut b = pool.try_alloc().unwrap();
                let c = Chain::from_slice(b.append(&[e as u8; 40]).unwrap());
                let h = FragmentHeader {
                    event_id: e,
                    trigger_number: e as u32,
                    source_id: 1,
                    flags: 0,
                    payload_size: 40,
                    payload_crc: crc32c::crc32c(&[e as u8; 40]),
                };
                w.write_event(e, e as u32, 0, &[(h, &c)]).unwrap();
            }
            w.finish().unwrap();
            dir.path().join(format!("dup_bu0_{seq:06}.evb"))
        };
        let a = write(0, &[1, 2, 3, 4]);
        let b = write(1, &[3, 4, 5]);
        let c = write(2, &[9, 9]);
        let junk = dir.path().join("junk.evb");
        std::fs::write(&junk, b"not an event file").unwrap();
        let (lines, n) = super::duplicates_across(&[a.clone(), b.clone(), c.clone(), junk], 10);
        assert_eq!(n, 3, "{lines:?}");
        assert!(lines[0].starts_with("event 3 is in") && lines[0].contains(&*b.to_string_lossy()));
        assert!(lines
            .iter()
            .any(|l| l.starts_with("event 9") && l.matches("dup_bu0_000002").count() == 2));
        let (_, none) = super::duplicates_across(&[a, c.with_file_name("absent.evb")], 10);
        assert_eq!(none, 0);
    }
}

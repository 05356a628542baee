//! `evb bench sinks`: a row per sink beside two references of the same round (issue 67),
//! as `scripts/sink-bench.sh` measures them: the discard sink (the build limit) and, for each
//! sink that writes files, a plain writer of the same bytes into the same filesystem in the
//! same part sizes with the same syncs (the write limit). Every row is `evb run`'s default
//! shape (2 RUs x 2 BUs over tcp, 1 MiB events), its files in a fresh folder on /dev/shm
//! (else the bench's output folder), removed after each run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::eb::{fill_from_summary, read_summary};
use crate::Point;

/// The event size of every row: `evb run`'s default two fragments of 512 KiB.
pub const EVENT_BYTES: u64 = 1 << 20;
/// The plain writer's writes, as the sink-bench script's.
const WRITE_BYTES: usize = 1 << 20;

/// A sink measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkKind {
    Discard,
    Count,
    File,
    FileZstd,
    /// HDF5 in the packed layout (an evb built with the `hdf5` feature).
    Hdf5Packed,
}

impl SinkKind {
    pub const ALL: [SinkKind; 5] = [
        SinkKind::Discard,
        SinkKind::Count,
        SinkKind::File,
        SinkKind::FileZstd,
        SinkKind::Hdf5Packed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SinkKind::Discard => "discard",
            SinkKind::Count => "count",
            SinkKind::File => "file",
            SinkKind::FileZstd => "file-zstd",
            SinkKind::Hdf5Packed => "hdf5-packed",
        }
    }

    /// Whether it writes files (and so has a write limit).
    pub fn writes(self) -> bool {
        matches!(
            self,
            SinkKind::File | SinkKind::FileZstd | SinkKind::Hdf5Packed
        )
    }

    /// Its `[sink]` table, files into `dir`.
    fn table(self, dir: &Path) -> String {
        let dir = format!("dir = \"{}\"\n", dir.display());
        match self {
            SinkKind::Discard => "kind = \"discard\"\n".into(),
            SinkKind::Count => "kind = \"count\"\n".into(),
            SinkKind::File => format!("kind = \"file\"\n{dir}"),
            SinkKind::FileZstd => format!("kind = \"file\"\ncompress = \"zstd\"\n{dir}"),
            SinkKind::Hdf5Packed => format!("kind = \"hdf5\"\nhdf5_layout = \"packed\"\n{dir}"),
        }
    }
}

/// What the last run of a sink wrote, for its write limit's run in the same round: its files'
/// count and bytes.
pub type Written = Arc<Mutex<Option<(u64, u64)>>>;

/// Where the sinks write: a folder of this process's on /dev/shm where there is one, else in
/// `fallback`; each run makes it and removes it.
pub fn scratch(fallback: &Path) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() { shm } else { fallback };
    base.join(format!("evb-bench-sinks-{}", std::process::id()))
}

/// `dir`, made (and its parents).
fn make(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))
}

/// One `evb run` of `sink`, `seconds` long, its files in `dir/out`: its built GB/s and
/// events/s, the BUs' CPU per GB; the files' count and bytes go to `written`.
pub fn sink_run(
    sink: SinkKind,
    seconds: f64,
    dir: &Path,
    written: &Written,
) -> Result<Point, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find evb itself: {e}"))?;
    let tag = format!("sinks-{}-{}", std::process::id(), sink.name());
    let out = dir.join("out");
    let _ = std::fs::remove_dir_all(&out);
    make(dir)?;
    let cfg = dir.join(format!("{tag}.toml"));
    let json = dir.join(format!("{tag}.json"));
    let toml = format!(
        "[run]\nid = \"{tag}\"\nduration_s = {seconds}\nstall_timeout_s = 20.0\n\n[sink]\n{}",
        sink.table(&out)
    );
    std::fs::write(&cfg, toml).map_err(|e| format!("{}: {e}", cfg.display()))?;
    let _ = std::fs::remove_file(&json);
    let run = Command::new(&exe)
        .arg("run")
        .arg("--quiet")
        .arg("--json")
        .arg(&json)
        .arg("--config")
        .arg(&cfg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()));
    let files = data_files(&out);
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_file(&cfg);
    let run = run?;
    let v = read_summary(&json, &run);
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_dir(dir);
    let v = v?;
    let mut p = Point::new("sink", "evb", "tcp", sink.name(), EVENT_BYTES);
    (p.senders, p.receivers) = (2, 2);
    fill_from_summary(&v, &mut p)?;
    if sink.writes() {
        if files.0 == 0 {
            return Err(format!("the {} sink wrote no file", sink.name()));
        }
        p.note.push_str(&format!(
            "; {} files, {:.3} GB in {}",
            files.0,
            files.1 as f64 / 1e9,
            dir.display()
        ));
    }
    *written.lock().unwrap_or_else(|e| e.into_inner()) = sink.writes().then_some(files);
    Ok(p)
}

/// The data files in `dir` (not their metadata, the manifest or temporaries): their count
/// and bytes.
fn data_files(dir: &Path) -> (u64, u64) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    rd.filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            !n.starts_with('.') && (n.ends_with(".evb") || n.ends_with(".h5"))
        })
        .filter_map(|e| e.metadata().ok())
        .fold((0, 0), |(n, b), m| (n + 1, b + m.len()))
}

/// The write limit of the files in `written`: two threads (one per BU) writing as many files
/// of their mean size into `dir/plain`, 1 MiB a write from memory, each file then committed
/// as a part is (fdatasync, its pages given back as the sink's are, a metadata file written
/// and fdatasync'd, two renames, the folder synced).
pub fn plain_writer(sink: SinkKind, dir: &Path, written: &Written) -> Result<Point, String> {
    let (files, bytes) = written
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .ok_or_else(|| format!("no {} run in this round to write as it did", sink.name()))?;
    let out = dir.join("plain");
    let _ = std::fs::remove_dir_all(&out);
    make(&out)?;
    let part = (bytes / files.max(1)).max(1);
    let block: Arc<Vec<u8>> = Arc::new((0..WRITE_BYTES).map(|i| (i * 131 % 251) as u8).collect());
    let t0 = Instant::now();
    let cpu0 = process_cpu_s();
    let threads: Vec<_> = (0..2u64)
        .map(|w| {
            let n = files / 2 + u64::from(w < files % 2);
            let (out, block) = (out.clone(), block.clone());
            std::thread::spawn(move || write_parts(&out, w, n, part, &block))
        })
        .collect();
    let mut result = Ok(());
    for t in threads {
        let r = t
            .join()
            .unwrap_or_else(|_| Err("a writer thread panicked".into()));
        result = result.and(r);
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = process_cpu_s() - cpu0;
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir(dir);
    result?;
    let total = part * files;
    let mut p = Point::new(
        "sink",
        "plain",
        "file",
        &format!("write limit for {}", sink.name()),
        EVENT_BYTES,
    );
    (p.senders, p.receivers) = (2, 2);
    p.gb_per_s = total as f64 / secs / 1e9;
    p.recv_cpu_s_per_gb = cpu / (total as f64 / 1e9);
    p.note = format!(
        "{files} files of {:.1} MB in {secs:.2} s, as the {} sink's of the same round",
        part as f64 / 1e6,
        sink.name()
    );
    Ok(p)
}

/// `n` files of `part` bytes, written and committed one after another.
fn write_parts(out: &Path, w: u64, n: u64, part: u64, block: &[u8]) -> Result<(), String> {
    use std::io::Write;
    let e = |p: &Path| {
        let p = p.display().to_string();
        move |err: std::io::Error| format!("{p}: {err}")
    };
    let folder = std::fs::File::open(out).map_err(e(out))?;
    for k in 0..n {
        let name = format!("plain_bu{w}_{k:06}.evb");
        let tmp = out.join(format!(".{name}.tmp"));
        let meta_tmp = out.join(format!(".{name}.json.tmp"));
        let mut f = std::fs::File::create(&tmp).map_err(e(&tmp))?;
        let mut left = part;
        while left > 0 {
            let k = left.min(block.len() as u64) as usize;
            f.write_all(&block[..k]).map_err(e(&tmp))?;
            left -= k as u64;
        }
        f.sync_data().map_err(e(&tmp))?;
        evb_formats::events::drop_cached_pages(&f);
        let mut m = std::fs::File::create(&meta_tmp).map_err(e(&meta_tmp))?;
        m.write_all(&br#"{"format": "evb-events"}"#.repeat(20))
            .map_err(e(&meta_tmp))?;
        m.sync_data().map_err(e(&meta_tmp))?;
        let path = out.join(&name);
        std::fs::rename(&tmp, &path).map_err(e(&path))?;
        let meta = out.join(format!("{name}.json"));
        std::fs::rename(&meta_tmp, &meta).map_err(e(&meta))?;
        folder.sync_all().map_err(e(out))?;
    }
    Ok(())
}

/// This process's CPU seconds so far (user and system, all threads).
fn process_cpu_s() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes a `rusage` into `ru`, which is large enough for one.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) } != 0 {
        return f64::NAN;
    }
    // SAFETY: getrusage returned 0, so it filled `ru`.
    let ru = unsafe { ru.assume_init() };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    s(ru.ru_utime) + s(ru.ru_stime)
}

/// The targets of issue 67 on /dev/shm: the file sink at 0.6 of the build limit and 0.8 of
/// the write limit; HDF5 (packed) at 0.9 of the file sink at 1 MiB events. Other rows are
/// shown beside the references with no target.
pub fn targets(sink: &str) -> (f64, f64, f64) {
    match sink {
        "file" => (0.6, 0.8, 0.0),
        "hdf5-packed" => (0.0, 0.0, 0.9),
        _ => (0.0, 0.0, 0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain writer writes and commits the files it is told of, two writers sharing
    /// them, and leaves nothing behind; without a sink run of the round it refuses.
    #[test]
    fn the_plain_writer_writes_what_the_sink_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = dir.path().join("scratch");
        let written: Written = Arc::new(Mutex::new(Some((3, 3 * 1500))));
        let p = plain_writer(SinkKind::File, &scratch, &written).unwrap();
        assert!(p.gb_per_s > 0.0 && p.gb_per_s.is_finite(), "{p:?}");
        assert!(p.note.starts_with("3 files of 0.0 MB"), "{}", p.note);
        assert!(!scratch.exists(), "its folder is removed after");
        assert!(plain_writer(SinkKind::File, &scratch, &written).is_err());
        // its parts as a committed sink's: the data and its metadata under their names
        let out = dir.path().join("o");
        std::fs::create_dir_all(&out).unwrap();
        write_parts(&out, 1, 2, 10, &[7u8; 4]).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "plain_bu1_000000.evb",
                "plain_bu1_000000.evb.json",
                "plain_bu1_000001.evb",
                "plain_bu1_000001.evb.json"
            ]
        );
        assert_eq!(
            std::fs::read(out.join("plain_bu1_000001.evb")).unwrap(),
            [7u8; 10]
        );
        assert_eq!(data_files(&out), (2, 20));
    }
}

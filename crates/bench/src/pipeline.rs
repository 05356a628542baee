//! The real pipeline against raw transfer: `evb feed` streams recorded CMS FED files over
//! tcp into two stream-fed RUs (`source.kind = "stream"`, one front-end each), two BUs hand
//! the events to a sink (discarded, written to files, or served to an `evb consume`), and
//! the 2 x 2 `nxn` mesh moves messages of the files' mean fragment size in the same run as
//! the reference. A real RU reads front-ends rather than generating content: this is the
//! row that says what evb costs between the front-end's socket and the sink.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use evb_formats::fed;
use evb_messaging::free_ports;

use crate::eb::{fill_from_summary, read_summary};
use crate::measure::Point;

/// The two recorded files (sources 841 and 843) and their fragments' sizes.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub files: [PathBuf; 2],
    pub sources: [u16; 2],
    /// Mean fragment size over both files, bytes.
    pub mean: u64,
    /// The largest fragment of either file, bytes.
    pub max: u64,
}

const FILES: [(&str, u16); 2] = [
    ("csc_00307511_EmuRUI01_Local_000.raw", 841),
    ("csc_00307511_EmuRUI03_Local_000.raw", 843),
];

/// The recorded files in `dir`, cut into fragments to learn their sizes.
pub fn recorded(dir: &Path) -> Result<Recorded, String> {
    let (mut n, mut bytes, mut max) = (0u64, 0u64, 0u64);
    let mut files = Vec::new();
    for (name, _) in FILES {
        let path = dir.join(name);
        let data = std::fs::read(&path)
            .map_err(|e| format!("recorded data {}: {e} (--data DIR)", path.display()))?;
        let frags = fed::split(&data).map_err(|e| format!("{}: {e}", path.display()))?;
        for r in frags {
            n += 1;
            bytes += r.len() as u64;
            max = max.max(r.len() as u64);
        }
        files.push(path);
    }
    if n == 0 {
        return Err(format!("no fragments in the files of {}", dir.display()));
    }
    let [a, b]: [PathBuf; 2] = files.try_into().expect("two files");
    Ok(Recorded {
        files: [a, b],
        sources: [FILES[0].1, FILES[1].1],
        mean: bytes / n,
        max,
    })
}

/// The recorded CMS files: the repository's `data/cms`, found in an ancestor of the current
/// folder or of this program.
pub fn find_data() -> Option<PathBuf> {
    let mut starts = Vec::new();
    starts.extend(std::env::current_dir().ok());
    starts.extend(std::env::current_exe().ok());
    for s in starts {
        for a in s.ancestors() {
            let d = a.join("data/cms");
            if d.join(FILES[0].0).exists() {
                return Some(d);
            }
        }
    }
    None
}

/// Where the BUs' events go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    Discard,
    /// Event files, committed with the EVM (`sink.commit_events` as [`PipeSpec`] says).
    File,
    /// Served over tcp to one `evb consume` reading both BUs.
    Serve,
    /// Event files with each event's body compressed (`sink.compress = "zstd"`, level 3).
    FileZstd,
    /// HDF5 files (`sink.kind = "hdf5"`; an evb built with the `hdf5` feature).
    Hdf5,
}

impl Sink {
    pub fn name(self) -> &'static str {
        match self {
            Sink::Discard => "discard",
            Sink::File => "file",
            Sink::Serve => "serve+consume",
            Sink::FileZstd => "file-zstd",
            Sink::Hdf5 => "hdf5",
        }
    }

    /// Whether it writes files into the output folder.
    fn files(self) -> bool {
        matches!(self, Sink::File | Sink::FileZstd | Sink::Hdf5)
    }
}

#[derive(Debug, Clone)]
pub struct PipeSpec {
    pub data: Recorded,
    pub sink: Sink,
    /// Fragments each front-end sends (the files looped, renumbered); the run ends when
    /// the streams end, every fragment built (no drain of fragments sent after a stop).
    pub fragments: u64,
    /// `source.max_fragment`: the largest fragment the front-ends may send, which sizes
    /// the BUs' default credits (`None`: the default, 1 MiB).
    pub max_fragment: Option<u64>,
    /// The file sink's `sink.commit_events`: events per file, each file synced and committed
    /// with the EVM (`None`: the default, the BU's credits).
    pub commit_events: Option<u64>,
}

impl PipeSpec {
    pub fn variant(&self) -> String {
        let commit = self
            .commit_events
            .map_or(String::new(), |n| format!(" commit_events={n}"));
        format!(
            "feed->{} max_fragment={}{commit}",
            self.sink.name(),
            self.max_fragment
                .map_or("default".to_string(), |m| crate::output::human_size(
                    m as f64
                ))
        )
    }

    fn toml(&self, run_id: &str, streams: u16, serve: u16, out: &Path) -> String {
        let max = self
            .max_fragment
            .map_or(String::new(), |m| format!("max_fragment = {m}\n"));
        let sink = match self.sink {
            Sink::Discard => "kind = \"discard\"\n".to_string(),
            Sink::File | Sink::FileZstd | Sink::Hdf5 => format!(
                "kind = \"{}\"\ndir = \"{}\"\n{}{}",
                if self.sink == Sink::Hdf5 {
                    "hdf5"
                } else {
                    "file"
                },
                out.display(),
                self.commit_events
                    .map_or(String::new(), |n| format!("commit_events = {n}\n")),
                if self.sink == Sink::FileZstd {
                    "compress = \"zstd\"\n"
                } else {
                    ""
                }
            ),
            Sink::Serve => format!("kind = \"serve\"\nserve_base_port = {serve}\n"),
        };
        let mut t = format!(
            "[run]\nid = \"{run_id}\"\nduration_s = 0\nstall_timeout_s = 20.0\n\n\
             [source]\nkind = \"stream\"\n{max}\n[sink]\n{sink}\n",
        );
        for (i, src) in self.data.sources.iter().enumerate() {
            t.push_str(&format!(
                "[[ru]]\nid = \"ru{i}\"\nstreams = [\"127.0.0.1:{}\"]\nstream_sources = [{src}]\n\n",
                streams + i as u16
            ));
        }
        for i in 0..2 {
            t.push_str(&format!("[[bu]]\nid = \"bu{i}\"\n\n"));
        }
        t
    }
}

/// The output files' bytes over the payload bytes they hold (from their metadata files).
fn stored_ratio(dir: &Path) -> Option<f64> {
    let (mut bytes, mut payload) = (0u64, 0u64);
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.ends_with(".evb.json") || name.ends_with(".h5.json")) {
            continue;
        }
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
        bytes += v["bytes"].as_u64()?;
        payload += v["payload_bytes"].as_u64()?;
    }
    (payload > 0).then(|| bytes as f64 / payload as f64)
}

/// A child's user + system CPU seconds so far (from /proc; 0 where unreadable).
fn cpu_s(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // the fields after the command name, which ends with the last ')'
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name, in
    // clock ticks of USER_HZ, which Linux fixes at 100 for user space
    (ticks(11) + ticks(12)) / 100.0
}

/// Whether child `pid` has exited (a zombie, not yet reaped) or is gone.
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

fn spawn(cmd: &mut Command, what: &str) -> Result<Child, String> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {what}: {e}"))
}

/// One run of the pipeline: `evb run` with the stream-fed RUs, `evb feed --loop --limit` at
/// full speed into them (and `evb consume` for the serve sink); the run ends with the streams.
pub fn pipeline(spec: &PipeSpec, scratch: &Path) -> Result<Point, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find evb itself: {e}"))?;
    let tag = format!("pipeline-{}-{}", std::process::id(), spec.sink.name());
    let tag = tag.replace('+', "-");
    let cfg_path = scratch.join(format!("{tag}.toml"));
    let json_path = scratch.join(format!("{tag}.json"));
    let out_dir = scratch.join(format!("{tag}-out"));
    let base = free_ports(4).ok_or("no free ports for the streams")?;
    let (streams, serve) = (base, base + 2);
    std::fs::write(&cfg_path, spec.toml(&tag, streams, serve, &out_dir))
        .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&json_path);
    let _ = std::fs::remove_dir_all(&out_dir);
    let run = Command::new(&exe)
        .arg("run")
        .arg("--quiet")
        .arg("--json")
        .arg(&json_path)
        .arg("--config")
        .arg(&cfg_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    // the front-ends: one stream per RU, as fast as the RUs read
    let mut feed = Command::new(&exe);
    feed.arg("feed")
        .arg("--loop")
        .arg("--limit")
        .arg(spec.fragments.to_string());
    for i in 0..2u16 {
        feed.arg("--to").arg(format!("127.0.0.1:{}", streams + i));
    }
    feed.args(&spec.data.files);
    let mut feed = spawn(&mut feed, "evb feed")?;
    let mut consume = match spec.sink {
        Sink::Serve => Some(spawn(
            Command::new(&exe)
                .arg("consume")
                .arg("--run-id")
                .arg(&tag)
                .arg(format!("--from=127.0.0.1:{serve},127.0.0.1:{}", serve + 1)),
            "evb consume",
        )?),
        _ => None,
    };
    let out = run
        .wait_with_output()
        .map_err(|e| format!("evb run: {e}"))?;
    // the feed's CPU over the run, read once it has exited and before it is reaped
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && !exited(feed.id()) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let feed_cpu = cpu_s(feed.id());
    let _ = feed.kill();
    let _ = feed.wait();
    if let Some(c) = consume.as_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    let files = std::fs::read_dir(&out_dir).map_or(0, |d| d.count() / 2);
    let stored = stored_ratio(&out_dir);
    let _ = std::fs::remove_dir_all(&out_dir);
    let _ = std::fs::remove_file(&cfg_path);
    let v = read_summary(&json_path, &out)?;
    let _ = std::fs::remove_file(&json_path);
    let mut p = Point::new("pipeline", "evb", "tcp", &spec.variant(), spec.data.mean);
    p.senders = 2;
    p.receivers = 2;
    fill_from_summary(&v, &mut p)?;
    let events = v["run"]["evm"]["triggered"].as_u64().unwrap_or(0);
    if events > 0 && feed_cpu > 0.0 {
        p.note.push_str(&format!(
            "; evb feed {:.2} us/event",
            feed_cpu * 1e6 / events as f64
        ));
    }
    if spec.sink.files() {
        p.note.push_str(&format!("; {files} files"));
        if let Some(r) = stored {
            p.note
                .push_str(&format!("; files {r:.3} of the payload bytes they hold"));
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(sink: Sink, commit_events: Option<u64>) -> PipeSpec {
        PipeSpec {
            data: Recorded {
                files: [PathBuf::from("a.raw"), PathBuf::from("b.raw")],
                sources: [841, 843],
                mean: 461,
                max: 23_000,
            },
            sink,
            fragments: 1000,
            max_fragment: Some(32768),
            commit_events,
        }
    }

    /// Each row's configuration is one `evb run` accepts, and the file rows' files hold the
    /// events their names say: the credits' worth by default, 2048 where asked.
    #[test]
    fn pipeline_rows_make_valid_configurations() {
        let out = Path::new("/tmp/evb-pipeline-test-out");
        for (s, commit) in [
            (spec(Sink::Discard, None), 0),
            (spec(Sink::File, None), 0),
            (spec(Sink::File, Some(2048)), 2048),
            (spec(Sink::Serve, None), 0),
            (spec(Sink::FileZstd, Some(2048)), 2048),
        ] {
            let c = evb_config::Config::from_toml(&s.toml("t", 7301, 7401, out))
                .unwrap_or_else(|e| panic!("{}: {e}", s.variant()));
            assert_eq!(c.sink.commit_events, commit, "{}", s.variant());
        }
        let z = spec(Sink::FileZstd, Some(2048)).toml("t", 7301, 7401, out);
        assert_eq!(
            evb_config::Config::from_toml(&z).unwrap().sink.compress,
            evb_config::Compress::Zstd
        );
        // the HDF5 row's configuration is refused by name where evb has no HDF5
        let h = spec(Sink::Hdf5, Some(2048)).toml("t", 7301, 7401, out);
        match evb_config::Config::from_toml(&h) {
            Ok(c) => assert_eq!(c.sink.kind, evb_config::SinkKind::Hdf5),
            Err(e) => assert!(e.to_string().contains("sink.kind"), "{e}"),
        }
        assert_eq!(
            spec(Sink::File, Some(2048)).variant(),
            "feed->file max_fragment=32K commit_events=2048"
        );
        assert_eq!(
            spec(Sink::File, None).variant(),
            "feed->file max_fragment=32K"
        );
    }
}

//! Front-ends over TCP, as real processes: `evb feed` streams the real CMS FED files into
//! RUs with `source.kind = "stream"` (two RUs of one stream each, and one RU reading both
//! streams as super-fragments), a altered LV1 id makes a sync loss (both policies), a
//! front-end sending garbage gets a clear error, and a late front-end shows as the RU
//! waiting for it.

mod common;
use common::{assert_exact, clock_seed, evb_run_in, free_base_port, text, Rng, EVB};

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use evb_formats::fed;
use serde_json::Value;

/// The tests here pick their streams' ports up front, and `evb run` picks free ports for its
/// nodes: run one at a time, so that one test's run cannot take another's stream port.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

const EVENTS: u64 = 4685;

/// The two real CMS files (sources 841 and 843), in the repository's data/cms.
fn cms_files() -> (PathBuf, PathBuf) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/cms");
    let a = dir.join("csc_00307511_EmuRUI01_Local_000.raw");
    let b = dir.join("csc_00307511_EmuRUI03_Local_000.raw");
    assert!(
        a.exists() && b.exists(),
        "the recorded CMS data is part of the repository (data/cms, its README): {} lacks it",
        dir.display()
    );
    (a, b)
}

/// `evb feed` of `files` to `to` (one file per address), started before the run.
fn feed(to: &[String], files: &[&Path], extra: &[&str]) -> Child {
    let mut c = Command::new(EVB);
    c.arg("feed");
    for a in to {
        c.args(["--to", a]);
    }
    c.args(files).args(extra);
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Whether something listens on TCP `port` of this host (read from /proc/net, without
/// connecting: a connection would be a front-end to the RU).
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let c: Vec<&str> = l.split_whitespace().collect();
                c.len() > 3 && c[1].ends_with(&want) && c[3] == "0A"
            })
        })
    })
}

/// `evb run` of `toml` in `dir` with `evb feed EXTRA` of `files` to `to`, started once the
/// RU listens on every stream address ([`start_run`]): the run's output and JSON summary, and
/// the feed's (success, output).
fn run_fed(
    dir: &Path,
    toml: &str,
    to: &[String],
    files: &[&Path],
    extra: &[&str],
) -> (Output, Value, (bool, String)) {
    let json = dir.join("summary.json");
    let _ = std::fs::remove_file(&json);
    let run = start_run(dir, toml, &[], to);
    let f = feed(to, files, extra);
    let out = run.wait_with_output().unwrap();
    let fed = feed_output(f);
    let summary = std::fs::read_to_string(&json)
        .map(|s| serde_json::from_str(&s).unwrap())
        .unwrap_or(Value::Null);
    (out, summary, fed)
}

/// `evb run ARGS` of `toml` in `dir` (its JSON summary to `dir`/summary.json), returned
/// once the RUs listen on every stream address in `to` (not before, hoping that it retries
/// long enough, and not after a guessed delay).
fn start_run(dir: &Path, toml: &str, args: &[&str], to: &[String]) -> Child {
    let cfg = dir.join("run.toml");
    std::fs::write(&cfg, toml).unwrap();
    let mut run = Command::new(EVB)
        .args(["run", "--quiet"])
        .args(args)
        .arg("--config")
        .arg(&cfg)
        .arg("--json")
        .arg(dir.join("summary.json"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ports: Vec<u16> = to
        .iter()
        .map(|a| a.rsplit_once(':').unwrap().1.parse().unwrap())
        .collect();
    let until = Instant::now() + Duration::from_secs(60);
    while !ports.iter().all(|&p| listening(p)) {
        if run.try_wait().unwrap().is_some() {
            let out = run.wait_with_output().unwrap();
            panic!(
                "evb run ended before its RU listened on {to:?}:\n{}",
                text(&out)
            );
        }
        if Instant::now() > until {
            let _ = run.kill();
            let out = run.wait_with_output().unwrap();
            panic!(
                "the RU did not listen on {to:?} within 60 s:\n{}",
                text(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    run
}

fn feed_output(c: Child) -> (bool, String) {
    let out = c.wait_with_output().unwrap();
    (out.status.success(), text(&out))
}

fn addrs(n: u16) -> Vec<String> {
    let base = free_base_port(n);
    (0..n).map(|k| format!("127.0.0.1:{}", base + k)).collect()
}

fn list(v: &[String]) -> String {
    let q: Vec<String> = v.iter().map(|a| format!("{a:?}")).collect();
    format!("[{}]", q.join(", "))
}

fn sum(s: &Value, role: &str, key: &str) -> u64 {
    s["run"][role]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x[key].as_u64().unwrap())
        .sum()
}

#[test]
fn cms_files_streamed_into_two_rus_build_every_event() {
    let _one = one_at_a_time();
    let (a, b) = cms_files();
    let d = common::out_dir();
    let to = addrs(2);
    let toml = format!(
        "[run]\nid = \"st2\"\nduration_s = 0\n[source]\nkind = \"stream\"\n\
         [[ru]]\nid = \"ru841\"\nsource_id = 841\nstreams = {}\n\
         [[ru]]\nid = \"ru843\"\nsource_id = 843\nstreams = {}\n",
        list(&to[..1]),
        list(&to[1..])
    );
    let (out, s, fed_out) = run_fed(d.path(), &toml, &to, &[&a, &b], &[]);
    let (fed_ok, fed_text) = fed_out;
    assert_exact(&out, &s, EVENTS, 2, 2);
    assert!(fed_ok, "{fed_text}");
    assert_eq!(
        fed_text.matches("sent 4685 fragments").count(),
        2,
        "{fed_text}"
    );
    assert_eq!(sum(&s, "rus", "stream_fragments_received"), 2 * EVENTS);
    assert_eq!(sum(&s, "rus", "stream_fragments_unbuilt"), 0);
    assert_eq!(sum(&s, "bus", "trigger_mismatches"), 0);
}

#[test]
fn cms_files_streamed_into_one_ru_build_super_fragments() {
    let _one = one_at_a_time();
    let (a, b) = cms_files();
    let d = common::out_dir();
    let to = addrs(2);
    // a short read-ahead and slow BU sinks: the RU must stop reading (back-pressure to the
    // senders), never drop
    let toml = format!(
        "[run]\nid = \"st1\"\nduration_s = 0\n[source]\nkind = \"stream\"\nread_ahead = 8\n\
         [sink]\nkind = \"file\"\ndir = \"out\"\n\
         [[ru]]\nid = \"ru0\"\nstreams = {}\nstream_sources = [841, 843]\n\
         [[bu]]\nid = \"bu0\"\ncredits = 4\nsink_delay_us = 100\n[[bu]]\nid = \"bu1\"\ncredits = 4\n",
        list(&to)
    );
    let (out, s, fed_out) = run_fed(d.path(), &toml, &to, &[&a, &b], &[]);
    let (fed_ok, fed_text) = fed_out;
    assert_exact(&out, &s, EVENTS, 1, 2);
    assert!(fed_ok, "{fed_text}");
    assert_eq!(sum(&s, "bus", "super_fragment_errors"), 0);
    assert_eq!(sum(&s, "bus", "partial_events"), 0);
    // the files hold every event, each one super-fragment of both FEDs
    let files: Vec<PathBuf> = std::fs::read_dir(d.path().join("out"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "evb"))
        .collect();
    let insp = Command::new(EVB)
        .arg("inspect")
        .args(&files)
        .output()
        .unwrap();
    let t = text(&insp);
    assert!(insp.status.success(), "{t}");
    let streams: Vec<(u64, u64)> = t
        .lines()
        .filter_map(|l| l.trim().strip_prefix("streams in super-fragments: "))
        .map(|l| {
            let n = |src: &str| {
                l.split(", ")
                    .find_map(|p| p.strip_prefix(&format!("{src} (")))
                    .and_then(|p| p.split(')').next())
                    .map_or(0, |p| p.parse::<u64>().unwrap())
            };
            (n("841"), n("843"))
        })
        .collect();
    let total = streams.iter().fold((0, 0), |s, x| (s.0 + x.0, s.1 + x.1));
    assert_eq!(total, (EVENTS, EVENTS), "{t}");
}

/// The 843 file with the LV1 id of its 100th fragment changed to 999 (CRC made again, so
/// only the number is wrong).
fn altered(src: &Path, dir: &Path) -> PathBuf {
    let mut data = std::fs::read(src).unwrap();
    let ranges = fed::split(&data).unwrap();
    let r = ranges[99].clone();
    let h = u64::from_le_bytes(data[r.start..r.start + 8].try_into().unwrap());
    assert_eq!((h >> 32) & 0xff_ffff, 100);
    let h = (h & !(0xff_ffffu64 << 32)) | (999u64 << 32);
    data[r.start..r.start + 8].copy_from_slice(&h.to_le_bytes());
    let frag = &data[r.clone()];
    let crc = fed::crc16(frag) as u64;
    let t = r.end - 8;
    let tw = u64::from_le_bytes(data[t..t + 8].try_into().unwrap());
    let tw = (tw & !(0xffffu64 << 16)) | (crc << 16);
    data[t..t + 8].copy_from_slice(&tw.to_le_bytes());
    fed::validate(&data[r], 0, Some(843)).unwrap();
    let out = dir.join("altered843.raw");
    std::fs::write(&out, data).unwrap();
    out
}

#[test]
fn an_altered_lv1_id_is_a_sync_loss_under_both_policies() {
    let _one = one_at_a_time();
    let (a, b) = cms_files();
    let d = common::out_dir();
    let bad = altered(&b, d.path());
    for policy in ["stop", "flag"] {
        let to = addrs(2);
        let toml = format!(
            "[run]\nid = \"sync\"\nduration_s = 0\nstall_timeout_s = 20\n[source]\nkind = \"stream\"\n\
             on_sync_loss = \"{policy}\"\n[[ru]]\nid = \"ru0\"\nstreams = {}\nstream_sources = [841, 843]\n",
            list(&to)
        );
        let (out, s, (_, fed_text)) = run_fed(d.path(), &toml, &to, &[&a, &bad], &[]);
        // what the run and the front-ends said, for every failure message
        let run_text = text(&out);
        let t = format!("{run_text}\n--- evb feed:\n{fed_text}");
        assert!(!t.contains("panicked"), "{t}");
        if policy == "stop" {
            assert!(!out.status.success(), "{t}");
            let reason = s["run"]["reason"].as_str().unwrap_or_default().to_string();
            for want in [
                "sync loss",
                "source 843",
                "LV1 id 999",
                "LV1 id 100",
                "source 841",
            ] {
                assert!(
                    reason.contains(want),
                    "{want:?} not in the reason: {reason}\n{t}"
                );
            }
        } else {
            // every event built, but one of them out of sync: degraded, never an OK
            assert!(!out.status.success(), "{t}");
            assert_eq!(s["run"]["evm"]["released"], EVENTS, "{t}");
            assert!(
                run_text.contains("ru[0]: 1 event flagged for sync loss"),
                "{t}"
            );
            assert_eq!(sum(&s, "bus", "sync_loss_events"), 1, "{t}");
            assert_eq!(sum(&s, "rus", "sync_losses"), 1);
        }
    }
}

#[test]
fn a_front_end_sending_garbage_gets_a_clear_error() {
    let _one = one_at_a_time();
    let d = common::out_dir();
    let junk = d.path().join("junk.bin");
    let bytes: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    std::fs::write(&junk, bytes).unwrap();
    let to = addrs(1);
    let toml = format!(
        "[run]\nid = \"junk\"\nduration_s = 0\n[source]\nkind = \"stream\"\nmax_fragment = 65536\n\
         [[ru]]\nid = \"ru0\"\nstreams = {}\n",
        list(&to)
    );
    let (out, s, fed_out) = run_fed(d.path(), &toml, &to, &[&junk], &["--format", "raw"]);
    let t = text(&out);
    let (_, fed_text) = fed_out;
    assert!(!out.status.success(), "{t}");
    assert!(
        !t.contains("panicked") && !fed_text.contains("panicked"),
        "{t}\n{fed_text}"
    );
    let reason = s["run"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("stream 0 (source 0")
            && reason.contains("no FED trailer within 65536 bytes"),
        "{reason}\n{t}"
    );
}

#[test]
fn a_late_front_end_shows_as_the_ru_waiting_for_it() {
    let _one = one_at_a_time();
    let d = common::out_dir();
    let (a, b) = (d.path().join("a.raw"), d.path().join("b.raw"));
    for (p, src) in [(&a, 841u16), (&b, 843)] {
        let data: Vec<u8> = (1..=300u32)
            .flat_map(|k| fed::build(k, src, &[k as u64; 4]))
            .collect();
        std::fs::write(p, data).unwrap();
    }
    let to = addrs(2);
    let toml = format!(
        "[run]\nid = \"late\"\nduration_s = 0\n[source]\nkind = \"stream\"\nstall_warn_s = 0.3\n\
         [[ru]]\nid = \"ru841\"\nsource_id = 841\nstreams = {}\n\
         [[ru]]\nid = \"ru843\"\nsource_id = 843\nstreams = {}\n",
        list(&to[..1]),
        list(&to[1..])
    );
    let early = feed(&to[..1], &[&a], &[]);
    // the second front-end comes 2 s later: the run waits for it, says so, and loses nothing
    let b2 = b.clone();
    let late_to = to[1..].to_vec();
    let late = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(2));
        feed_output(feed(&late_to, &[&b2], &[]))
    });
    let (out, s) = evb_run_in(d.path(), &toml);
    let t = text(&out);
    assert!(feed_output(early).0);
    assert!(late.join().unwrap().0);
    assert_exact(&out, &s, 300, 2, 2);
    assert!(
        t.contains("waiting for stream 0 (source 843") && t.contains("no front-end connected"),
        "{t}"
    );
}

#[test]
fn a_stream_that_ends_early_ends_the_run_with_the_data() {
    let _one = one_at_a_time();
    let d = common::out_dir();
    let (a, b) = (d.path().join("a.raw"), d.path().join("b.raw"));
    for (p, src, n) in [(&a, 841u16, 300u32), (&b, 843, 200)] {
        let data: Vec<u8> = (1..=n)
            .flat_map(|k| fed::build(k, src, &[k as u64; 3]))
            .collect();
        std::fs::write(p, data).unwrap();
    }
    let to = addrs(2);
    let toml = format!(
        "[run]\nid = \"short\"\nduration_s = 0\n[source]\nkind = \"stream\"\n\
         [[ru]]\nid = \"ru841\"\nsource_id = 841\nstreams = {}\n\
         [[ru]]\nid = \"ru843\"\nsource_id = 843\nstreams = {}\n",
        list(&to[..1]),
        list(&to[1..])
    );
    let (out, s, fed_out) = run_fed(d.path(), &toml, &to, &[&a, &b], &[]);
    assert!(fed_out.0);
    // 200 events have both fragments; the 100 more of source 841 are counted, not lost
    assert_exact(&out, &s, 200, 2, 2);
    assert_eq!(sum(&s, "rus", "stream_fragments_received"), 500);
    assert_eq!(sum(&s, "rus", "stream_fragments_unbuilt"), 100);
}

#[test]
fn a_front_end_that_never_comes_fails_the_run_after_the_connect_timeout() {
    let _one = one_at_a_time();
    let d = common::out_dir();
    let to = addrs(2);
    let toml = format!(
        "[run]\nid = \"absent\"\nduration_s = 0\nconnect_timeout_s = 1.5\n[source]\nkind = \"stream\"\n\
         [[ru]]\nid = \"ru0\"\nstreams = {}\nstream_sources = [841, 843]\n",
        list(&to)
    );
    // only the first of the RU's two streams gets a front-end
    let data: Vec<u8> = (1..=50u32)
        .flat_map(|k| fed::build(k, 841, &[k as u64; 4]))
        .collect();
    let a = d.path().join("a.raw");
    std::fs::write(&a, data).unwrap();
    let f = feed(&to[..1], &[&a], &[]);
    let started = std::time::Instant::now();
    let (out, s) = evb_run_in(d.path(), &toml);
    let t = text(&out);
    let _ = feed_output(f);
    assert!(!out.status.success(), "{t}");
    let reason = s["run"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("stream 1 (source 843")
            && reason.contains("no front-end connected within 1.5 s"),
        "{reason}\n{t}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{t}"
    );
}

/// A seed for the moments a test picks at random (`EVB_STREAM_SEED`, else the clock), printed
/// so that a failure can be replayed.
fn seeded(test: &str) -> Rng {
    let seed = std::env::var("EVB_STREAM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(clock_seed);
    eprintln!("{test}: EVB_STREAM_SEED={seed}");
    Rng(seed | 1)
}

/// Connects to `addr` as soon as something listens there (within 20 s).
fn connect_when_listening(addr: &str) -> TcpStream {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return s,
            Err(e) if Instant::now() > until => panic!("{addr}: never listened: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The RU's own final report (after its streams were drained at the end of the run).
fn ru_stat(s: &Value, ru: &str, key: &str) -> u64 {
    s["nodes"][ru]["stats"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in {ru}'s report: {}", s["nodes"][ru]))
}

/// (a) A socket that connects to a stream and closes without a byte (a port check) is no
/// front-end: the stream goes on listening and the real front-end, after it, builds every
/// event.
#[test]
fn a_probe_that_connects_and_closes_does_not_take_the_stream() {
    let _one = one_at_a_time();
    let (a, b) = cms_files();
    let mut rng = seeded("a_probe_that_connects_and_closes_does_not_take_the_stream");
    let d = common::out_dir();
    let to = addrs(2);
    let toml = format!(
        "[run]\nid = \"probe\"\nduration_s = 0\n[source]\nkind = \"stream\"\n\
         [[ru]]\nid = \"ru0\"\nstreams = {}\nstream_sources = [841, 843]\n",
        list(&to)
    );
    // the probe holds its connection a random moment, then closes; the front-end comes a
    // random moment after
    let (hold, gap) = (rng.below(300), rng.below(300));
    let (to2, a2, b2) = (to.clone(), a.clone(), b.clone());
    let front_end = std::thread::spawn(move || {
        let probe = connect_when_listening(&to2[0]);
        std::thread::sleep(Duration::from_millis(hold));
        drop(probe);
        std::thread::sleep(Duration::from_millis(gap));
        feed_output(feed(&to2, &[&a2, &b2], &[]))
    });
    let (out, s) = evb_run_in(d.path(), &toml);
    let t = text(&out);
    let (fed_ok, fed_text) = front_end.join().unwrap();
    assert!(fed_ok, "{fed_text}\n{t}");
    assert_exact(&out, &s, EVENTS, 1, 2);
    assert!(
        t.contains("stream 0 (source 841") && t.contains("taken for a probe"),
        "{t}"
    );
    assert_eq!(ru_stat(&s, "ru0", "stream_fragments_received"), 2 * EVENTS);
    assert_eq!(ru_stat(&s, "ru0", "stream_fragments_unbuilt"), 0);
}

/// (b) With `source.allow_from = ["127.0.0.1"]`, a front-end connecting from 127.0.0.2 is
/// closed at once (and told so: its `evb feed` fails) without taking the stream; the real
/// front-end builds everything.
#[test]
fn a_front_end_not_in_the_allow_list_is_refused_and_the_real_one_builds_everything() {
    let _one = one_at_a_time();
    let (a, b) = cms_files();
    let mut rng = seeded("a_front_end_not_in_the_allow_list_is_refused");
    let d = common::out_dir();
    let to = addrs(2);
    let toml = format!(
        "[run]\nid = \"allow\"\nduration_s = 0\n[source]\nkind = \"stream\"\n\
         allow_from = [\"127.0.0.1\"]\n\
         [[ru]]\nid = \"ru0\"\nstreams = {}\nstream_sources = [841, 843]\n",
        list(&to)
    );
    let gap = rng.below(300);
    let (to2, a2, b2) = (to.clone(), a.clone(), b.clone());
    let front_ends = std::thread::spawn(move || {
        let intruder = feed_output(feed(&to2[..1], &[&a2], &["--from", "127.0.0.2"]));
        std::thread::sleep(Duration::from_millis(gap));
        (intruder, feed_output(feed(&to2, &[&a2, &b2], &[])))
    });
    let (out, s) = evb_run_in(d.path(), &toml);
    let t = text(&out);
    let ((intruder_ok, intruder_text), (fed_ok, fed_text)) = front_ends.join().unwrap();
    assert!(
        !intruder_ok,
        "the refused front-end was told: {intruder_text}"
    );
    assert!(
        intruder_text.contains("closed the stream"),
        "{intruder_text}"
    );
    assert!(fed_ok, "{fed_text}\n{t}");
    assert_exact(&out, &s, EVENTS, 1, 2);
    assert!(
        t.contains("connection from 127.0.0.2:") && t.contains("not in source.allow_from"),
        "{t}"
    );
    assert_eq!(ru_stat(&s, "ru0", "stream_fragments_received"), 2 * EVENTS);
}

/// (c) A stream that never delivers a fragment fails the run, naming the stream: one whose
/// only connection was a probe (the connect timeout), one whose front-end sent bytes but no
/// whole fragment until the run's time was up, and one whose connection stayed open and
/// silent (a front-end may connect long before its first trigger: not taken for absent at
/// the connect timeout, but failed at the end of the run all the same).
#[test]
fn a_stream_that_never_delivers_fails_the_run_naming_it() {
    let _one = one_at_a_time();
    let d = common::out_dir();
    let data: Vec<u8> = (1..=300u32)
        .flat_map(|k| fed::build(k, 841, &[k as u64; 4]))
        .collect();
    let a = d.path().join("a.raw");
    std::fs::write(&a, data).unwrap();
    for case in ["probe", "no whole fragment", "silent"] {
        let to = addrs(2);
        let end = match case {
            "probe" => "duration_s = 0\nconnect_timeout_s = 2",
            "silent" => "duration_s = 3\nconnect_timeout_s = 1",
            _ => "duration_s = 2",
        };
        let toml = format!(
            "[run]\nid = \"silent\"\n{end}\n[source]\nkind = \"stream\"\n\
             [[ru]]\nid = \"ru0\"\nstreams = {}\nstream_sources = [841, 843]\n",
            list(&to)
        );
        let f = feed(&to[..1], &[&a], &[]);
        let (to2, case2) = (to.clone(), case);
        let other = std::thread::spawn(move || {
            let mut s = connect_when_listening(&to2[1]);
            match case2 {
                "probe" => return,
                "silent" => {}
                _ => {
                    // a FED header and half a payload, then nothing (the connection stays open)
                    let frag = fed::build(1, 843, &[7; 4]);
                    s.write_all(&frag[..12]).unwrap();
                }
            }
            std::thread::sleep(Duration::from_secs(6));
        });
        let (out, s) = evb_run_in(d.path(), &toml);
        let t = text(&out);
        let _ = feed_output(f);
        other.join().unwrap();
        assert!(!out.status.success(), "{case}: {t}");
        assert!(!t.contains("VERDICT: OK"), "{case}: {t}");
        assert!(!t.contains("panicked"), "{case}: {t}");
        let want = match case {
            "probe" => "closed without sending anything",
            "silent" => "connected and sent nothing",
            _ => "no fragment in the whole run",
        };
        assert!(
            t.contains("stream 1 (source 843") && t.contains(want),
            "{case}: {want:?} not said\n{t}"
        );
        if case == "silent" {
            // open and silent is not absent: the run went on to its end
            assert!(!t.contains("run.connect_timeout_s"), "{t}");
        }
        // and the verdict names the stream
        let verdict = String::from_utf8_lossy(&out.stdout);
        let verdict = verdict.split("VERDICT").nth(1).unwrap_or_default();
        assert!(verdict.contains("stream 1 (source 843"), "{case}: {t}");
        if case != "probe" {
            // the EVM's own verdict names it too, from the RU's report (so a standalone EVM,
            // whose RUs run on other hosts, does not call the run OK)
            let problems = s["problems"].to_string();
            assert!(
                problems.contains("ru[0]: no fragment in the whole run from stream 1 (source 843"),
                "{case}: {problems}"
            );
            // what stream 0 sent is counted all the same
            assert_eq!(ru_stat(&s, "ru0", "stream_fragments_received"), 300, "{t}");
            assert_eq!(ru_stat(&s, "ru0", "stream_fragments_unbuilt"), 300, "{t}");
        }
    }
}

/// The 843 file without its 101st fragment: from event 100 on, stream 1 is one event ahead.
fn one_fragment_missing(src: &Path, dir: &Path) -> PathBuf {
    let data = std::fs::read(src).unwrap();
    let ranges = fed::split(&data).unwrap();
    let r = ranges[100].clone();
    let mut out = data[..r.start].to_vec();
    out.extend_from_slice(&data[r.end..]);
    let path = dir.join("843-without-101st.raw");
    std::fs::write(&path, out).unwrap();
    path
}

/// (d) `on_sync_loss = "flag"` builds every event, but the verdict names the events flagged
/// and the exit is non-zero; a warning says so, not once per event.
#[test]
fn flagged_sync_losses_are_named_by_the_verdict_and_fail_the_exit() {
    let _one = one_at_a_time();
    let (a, b) = cms_files();
    let d = common::out_dir();
    let short = one_fragment_missing(&b, d.path());
    let to = addrs(2);
    let toml = format!(
        "[run]\nid = \"flag\"\nduration_s = 0\n[source]\nkind = \"stream\"\n\
         on_sync_loss = \"flag\"\n[[ru]]\nid = \"ru0\"\nstreams = {}\nstream_sources = [841, 843]\n",
        list(&to)
    );
    let (out, s, fed_out) = run_fed(d.path(), &toml, &to, &[&a, &short], &[]);
    let t = text(&out);
    let (fed_ok, fed_text) = fed_out;
    assert!(fed_ok, "{fed_text}");
    assert!(!out.status.success(), "{t}");
    assert!(!t.contains("VERDICT: OK"), "{t}");
    assert!(
        t.contains("ru[0]: 4584 events flagged for sync loss"),
        "{t}"
    );
    assert_eq!(s["run"]["evm"]["released"], EVENTS - 1, "{t}");
    assert_eq!(sum(&s, "rus", "sync_losses"), 4584);
    assert_eq!(sum(&s, "bus", "sync_loss_events"), 4584);
    // warned, with the count, not once per event
    let warnings = t
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("sync loss"))
        .count();
    assert!((1..=5).contains(&warnings), "{warnings} warnings:\n{t}");
    // the one fragment of stream 0 beyond stream 1's end is counted
    assert_eq!(ru_stat(&s, "ru0", "stream_fragments_unbuilt"), 1);
}

/// (e) A run that stops before the front-ends finished: whatever they sent is built or
/// counted (read ahead, or still in the sockets when the run stopped: drained and counted),
/// so fragments sent = built + unbuilt.
#[test]
fn every_fragment_sent_is_built_or_counted_when_the_run_stops_first() {
    let _one = one_at_a_time();
    let (a, b) = cms_files();
    let mut rng = seeded("every_fragment_sent_is_built_or_counted");
    let events = 100 + rng.below(3900);
    // batches of read_ahead fragments at most (64), whole or cut short by a small bound
    let read_ahead = 1 + rng.below(200);
    eprintln!("the run stops after {events} of {EVENTS} events; read_ahead = {read_ahead}");
    let d = common::out_dir();
    let to = addrs(2);
    let toml = format!(
        "[run]\nid = \"rest\"\nduration_s = 0\nevents = {events}\n[source]\nkind = \"stream\"\n\
         read_ahead = {read_ahead}\n\
         [[ru]]\nid = \"ru0\"\nstreams = {}\nstream_sources = [841, 843]\n",
        list(&to)
    );
    let (out, s, fed_out) = run_fed(d.path(), &toml, &to, &[&a, &b], &[]);
    let t = text(&out);
    let (fed_ok, fed_text) = fed_out;
    assert_exact(&out, &s, events, 1, 2);
    // the front-ends were read to their end: each sent every fragment, and knows it was read
    assert!(fed_ok, "{fed_text}\n{t}");
    assert_eq!(
        fed_text.matches("sent 4685 fragments").count(),
        2,
        "{fed_text}"
    );
    let sent = 2 * EVENTS;
    let built = 2 * events;
    assert_eq!(ru_stat(&s, "ru0", "stream_fragments_received"), sent, "{t}");
    assert_eq!(
        ru_stat(&s, "ru0", "stream_fragments_unbuilt"),
        sent - built,
        "{t}"
    );
    // and the verdict line itself says so: an OK that names what was not built
    assert!(
        t.contains(&format!(
            "{} fragments the front-ends sent after the run's end counted as unbuilt",
            sent - built
        )),
        "{t}"
    );
}

/// A front-end whose every fragment fails its CRC, under `on_error = "drop"`: every event is
/// built partial, and the log says so in a few lines with counts, not one line per dropped
/// fragment (4,685 warnings here before).
#[test]
fn thousands_of_dropped_fragments_are_a_few_log_lines() {
    let _one = one_at_a_time();
    let (a, b) = cms_files();
    let d = common::out_dir();
    let mut data = std::fs::read(&b).unwrap();
    let ranges = fed::split(&data).unwrap();
    for r in &ranges {
        // flip a bit of the trailer's CRC16 (bits 16..32 of the last word)
        data[r.end - 8 + 2] ^= 1;
    }
    let bad = d.path().join("badcrc843.raw");
    std::fs::write(&bad, &data).unwrap();
    let to = addrs(2);
    let toml = format!(
        "[run]\nid = \"drops\"\nduration_s = 0\n[source]\nkind = \"stream\"\non_error = \"drop\"\n\
         [[ru]]\nid = \"ru0\"\nstreams = {}\nstream_sources = [841, 843]\n",
        list(&to)
    );
    let (out, s, _) = run_fed(d.path(), &toml, &to, &[&a, &bad], &[]);
    let t = text(&out);
    assert_eq!(s["run"]["evm"]["released"], EVENTS, "{t}");
    assert_eq!(sum(&s, "rus", "dropped_at_source"), EVENTS, "{t}");
    let lines = t.lines().filter(|l| l.contains("dropped")).count();
    assert!(lines < 20, "{lines} lines about dropped fragments:\n{t}");
    // the first is said at once, the rest summed up (at the latest at the run's end)
    assert!(t.contains("dropped, its event will be partial"), "{t}");
    assert!(
        t.contains("more bad fragments dropped since the last warning"),
        "{t}"
    );
}

/// `evb run --standby` with both RUs fed by front-ends (`evb feed --loop`, 10,000 fragments
/// a stream at 2,500 a second): the front-ends stalled and the EVM killed at a seeded moment.
/// The standby takes the run over, the RUs tell it what their streams hold (nothing new
/// arrives to make them announce it), the front-ends go on, and every event they sent is
/// built once, in exactly one file, with the takeover named and nothing left unbuilt.
#[test]
fn a_standby_takes_over_a_live_fed_run_and_builds_every_event_once() {
    let _one = one_at_a_time();
    let (a, b) = cms_files();
    let mut rng = seeded("a_standby_takes_over_a_live_fed_run");
    let at = 1000 + rng.below(6000);
    eprintln!("the EVM is killed once {at} events are triggered");
    let events = 10_000u64;
    let d = common::out_dir();
    let to = addrs(2);
    let cbase = free_base_port(5);
    let out_dir = d.path().join("out");
    let toml = format!(
        "[run]\nid = \"live-standby\"\nduration_s = 0\n[control]\nbase_port = {cbase}\n\
         [source]\nkind = \"stream\"\n\
         [[ru]]\nid = \"ru841\"\nsource_id = 841\nstreams = {}\n\
         [[ru]]\nid = \"ru843\"\nsource_id = 843\nstreams = {}\n\
         [sink]\nkind = \"file\"\ndir = \"{}\"\n",
        list(&to[..1]),
        list(&to[1..]),
        out_dir.display()
    );
    let json = d.path().join("summary.json");
    let mut run = start_run(d.path(), &toml, &["--standby"], &to);
    let limit = events.to_string();
    let f = feed(
        &to,
        &[&a, &b],
        &["--loop", "--limit", &limit, "--rate", "2500"],
    );
    let evm_api = format!("127.0.0.1:{cbase}");
    common::wait_node(
        &evm_api,
        "the moment (the EVM's status)",
        60,
        || match run.try_wait() {
            Ok(Some(st)) => Some(format!("evb run ended ({st})")),
            _ => None,
        },
        |line| common::triggered_at_least(line, at),
    );
    let pid = common::node_status(&evm_api)["pid"].as_u64().unwrap();
    let kill = |sig: &str, pid: u32| {
        assert!(Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success());
    };
    // the front-ends stall first, so that the RUs have nothing new to announce when the
    // standby takes over (it must not assign what they do not hold), and go on after it
    kill("-STOP", f.id());
    std::thread::sleep(Duration::from_millis(300));
    kill("-9", pid as u32);
    std::thread::sleep(Duration::from_secs(3));
    kill("-CONT", f.id());
    let out = run.wait_with_output().unwrap();
    let (fed_ok, fed_text) = feed_output(f);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("VERDICT: OK"), "{t}");
    assert!(t.contains("standby took over"), "{t}");
    assert!(fed_ok, "{fed_text}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(s["run"]["evm"]["triggered"], events, "{t}");
    assert_eq!(s["run"]["evm"]["released"], events, "{t}");
    assert_eq!(s["run"]["evm"]["duplicate_releases"], 0, "{t}");
    let files = common::nodes::events_in(&out_dir);
    assert!(
        files.keys().copied().eq(0..events),
        "{} of {events} events in the files\n{t}",
        files.len()
    );
    assert_eq!(
        sum(&s, "rus", "stream_fragments_received"),
        2 * events,
        "{t}"
    );
    assert_eq!(sum(&s, "rus", "stream_fragments_unbuilt"), 0, "{t}");
    assert_eq!(sum(&s, "bus", "trigger_mismatches"), 0, "{t}");
}

/// Live slices: 2 RUs of one stream of frames each, `SLICES_LIVE` slices of 30 frames and a
/// 4-frame overlap.
const SLICES_LIVE: u64 = 150;
const LIVE_SLICE: u64 = 21_000;
const LIVE_FRAME: u64 = 700;

/// `evb run` over `transport` of two RUs each reading `evb feed --frames` (every stream's
/// frames until the end of slice `SLICES_LIVE - 1`, at `rate` frames/s, 0: as fast as read),
/// with `fault(evb run's pid)` called while the frames flow; the run's output, summary and
/// output folder, checked by the outside reader of docs/formats.md §8: every frame of both
/// streams in exactly one slice's core, the overlaps the next slices' first frames, every
/// byte the generator's pattern.
fn live_slices(
    d: &Path,
    transport: &str,
    rate: u32,
    fault: impl FnOnce(u32),
) -> (Output, Value, u64) {
    let out_dir = d.join("out");
    let to = addrs(2);
    let frames = SLICES_LIVE * LIVE_SLICE / LIVE_FRAME;
    let seed = clock_seed();
    let toml = format!(
        "[run]\nid = \"live-slices\"\nduration_s = 0\nseed = {seed}\n\
         [transport]\nkind = \"{transport}\"\n\
         [builder]\nby = \"time\"\nslice_ticks = {LIVE_SLICE}\noverlap_ticks = 2500\n\
         [frames]\nticks = {LIVE_FRAME}\nsize = 300\ndistribution = \"lognormal\"\nstddev = 200\n\
         [source]\nkind = \"stream\"\nformat = \"frames\"\nmax_fragment = 8192\nread_ahead = 16\n\
         [sink]\nkind = \"file\"\ndir = \"{}\"\nfile_max_events = 40\n\
         [[ru]]\nid = \"ru0\"\nsource_id = 3\nstreams = {}\n\
         [[ru]]\nid = \"ru1\"\nsource_id = 9\nstreams = {}\n",
        out_dir.display(),
        list(&to[..1]),
        list(&to[1..])
    );
    let run = start_run(d, &toml, &[], &to);
    let pid = run.id();
    let cfg = d.join("run.toml").display().to_string();
    let (limit, rate) = (frames.to_string(), rate.to_string());
    let f = feed(
        &to,
        &[],
        &["--frames", &cfg, "--limit", &limit, "--rate", &rate],
    );
    fault(pid);
    let out = run.wait_with_output().unwrap();
    let (fed_ok, fed_text) = feed_output(f);
    let t = text(&out);
    assert!(out.status.success(), "seed {seed}: {t}\n{fed_text}");
    assert!(fed_ok, "{fed_text}");
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["run"]["evm"]["released"], SLICES_LIVE, "{s}");
    let (seed_arg, slice, frame) = (
        seed.to_string(),
        LIVE_SLICE.to_string(),
        LIVE_FRAME.to_string(),
    );
    let args = [
        "--seed",
        &seed_arg,
        "--slice",
        &slice,
        "--overlap",
        "2500",
        "--frame",
        &frame,
    ];
    let r = common::check_slices(&out_dir, &args).expect("python3, checked above");
    assert_eq!(r["problems"], 0, "seed {seed}: {r}\n{t}");
    assert_eq!(r["records"], SLICES_LIVE, "{r}");
    for (src, ru) in [("3", "ru0"), ("9", "ru1")] {
        assert_eq!(r["sources"][src]["core_frames"], frames, "{r}");
        // the RU's byte account: every byte in is in one slice core the files hold (the
        // reader counts payloads, the RU frames with their 24-byte headers)
        let cores = r["sources"][src]["core_bytes"].as_u64().unwrap() + 24 * frames;
        assert_eq!(
            ru_stat(&s, ru, "frame_bytes_in_slice_cores"),
            cores,
            "{ru}: {r}"
        );
        assert_eq!(ru_stat(&s, ru, "frame_bytes_in"), cores, "{ru}");
        assert_eq!(ru_stat(&s, ru, "frame_bytes_held_unused"), 0, "{ru}");
    }
    assert!(t.contains("kB in slice cores + 0.0 kB held"), "{t}");
    // every slice but the last carries the next one's first 4 frames (2500 ticks of 700)
    assert_eq!(r["overlap_frames"], (SLICES_LIVE - 1) * 4 * 2, "{r}");
    (out, s, frames)
}

/// Building by time from live streams (issue 54): `evb feed --frames` streams the generator's
/// frames of two sources, each RU cuts its stream into time slices in its latency buffer,
/// and the files hold every frame of every stream in exactly one slice's core (see
/// [`live_slices`]), over tcp and over shm. The stream ends on a slice's end: the last slice
/// is whole.
#[test]
fn frames_streamed_into_two_rus_build_slices_that_tile_every_stream() {
    let _one = one_at_a_time();
    if !common::python3("stream") {
        return;
    }
    for transport in ["tcp", "shm"] {
        let d = common::out_dir();
        let (_, s, frames) = live_slices(d.path(), transport, 0, |_| {});
        assert_eq!(sum(&s, "rus", "stream_fragments_received"), 2 * frames);
        assert_eq!(sum(&s, "rus", "stream_fragments_unbuilt"), 0);
        // the latency buffer held about a slice and its overlap, never the stream
        let peak = sum(&s, "rus", "frame_buffer_bytes_high_water");
        assert!(peak > 0 && peak < 2 * 200_000, "{peak}");
    }
}

/// A BU killed (`kill -9`) at a random moment while frames stream in: its slices are built
/// again by the other BU from the fragments the RUs still hold, and the files still hold
/// every frame of both streams in exactly one slice core (`EVB_STREAM_SEED` replays).
#[test]
fn live_slices_survive_a_killed_bu() {
    let _one = one_at_a_time();
    if !common::python3("stream") {
        return;
    }
    let mut rng = seeded("live_slices_survive_a_killed_bu");
    let at = Duration::from_millis(500 + rng.below(1500));
    let d = common::out_dir();
    let (out, s, _) = live_slices(d.path(), "tcp", 1500, |pid| {
        std::thread::sleep(at);
        let marker = format!("--launched-by=evb-run-{pid}-");
        let bu1 = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .find_map(|e| {
                let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                (cmd.contains(&marker) && cmd.contains("--id bu1 ")).then(|| e.file_name())
            })
            .expect("bu1's process");
        let killed = Command::new("kill")
            .arg("-KILL")
            .arg(&bu1)
            .status()
            .unwrap();
        assert!(killed.success());
    });
    let t = text(&out);
    assert!(t.contains("node event: bu[1] lost"), "{t}");
    assert!(t.contains("VERDICT: OK"), "{t}");
    assert_eq!(sum(&s, "rus", "retained"), 0, "{s}");
}

/// A front-end whose stream of frames skips a frame stops the run, naming the stream and the
/// frame: no slice is built over a hole.
#[test]
fn a_gap_in_a_stream_of_frames_stops_the_run_naming_the_frame() {
    let _one = one_at_a_time();
    let d = common::out_dir();
    let file = d.path().join("gap.frames");
    let bytes: Vec<u8> = (0..400u64)
        .filter(|&j| j != 250)
        .flat_map(|j| evb_formats::frames::encode(j * 100, (j + 1) * 100, 0, 0, &[j as u8; 40]))
        .collect();
    std::fs::write(&file, bytes).unwrap();
    let to = addrs(1);
    let toml = format!(
        "[run]\nid = \"gap\"\nduration_s = 0\n[builder]\nby = \"time\"\nslice_ticks = 1000\n\
         overlap_ticks = 100\n[frames]\nticks = 100\n\
         [source]\nkind = \"stream\"\nformat = \"frames\"\nmax_fragment = 4096\n\
         [[ru]]\nid = \"ru0\"\nstreams = {}\n",
        list(&to)
    );
    let (out, s, _) = run_fed(d.path(), &toml, &to, &[&file], &[]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(!t.contains("panicked"), "{t}");
    let reason = s["run"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("stream 0 (source 0")
            && reason.contains("frame [25100, 25200)")
            && reason.contains("ended at tick 25000"),
        "{reason}\n{t}"
    );
}

/// Decision windows over live streams (issue 54, DUNE-like): `evb feed --frames` streams two
/// sources in real time (1000 frames of 1000 ticks per second, `windows.tick_hz` = 1 MHz)
/// for 1 s, while the EVM makes 150 decisions at 100 Hz reaching up to 0.4 s back with a
/// 200 ms latency buffer. Each RU cuts each window from what its buffer holds: complete,
/// MISSING when its first frames were evicted, LATE (at once, with what there is) past the
/// stream's end. The outside reader recomputes every window from the seed and checks every
/// frame's bytes and every status against the frames held, and the verdict's counts are
/// the files'. Each RU's byte account adds up: bytes in = bytes in windows + bytes evicted
/// that no window took + bytes held that no window took.
#[test]
fn frames_streamed_into_decision_windows_are_complete_missing_or_late_as_held() {
    live_windows(
        "size = 200\ndistribution = \"lognormal\"\nstddev = 150\n",
        "buffer_ms = 200\n",
        200_000,
    );
}

/// The same run with the latency buffer bounded in bytes (`windows.buffer_bytes`) and not
/// in time: frames of 200 bytes (224 with their header), 50 of them held, so the outside
/// reader judges every window as if the buffer kept 50 frames' ticks. No RU ever held more
/// than the bound.
#[test]
fn a_latency_buffer_bounded_in_bytes_evicts_as_its_bound_says() {
    let s = live_windows(
        "size = 200\n",
        "buffer_ms = 3600000\nbuffer_bytes = 11200\n",
        50_000,
    );
    if s.is_null() {
        return;
    }
    for ru in ["ru0", "ru1"] {
        let peak = ru_stat(&s, ru, "frame_buffer_bytes_high_water");
        assert!((11_200 - 224..=11_200).contains(&peak), "{ru}: {peak}");
    }
}

/// `evb run` of 150 decision windows over two RUs' streams of 1000 frames, the frames'
/// `[frames]` sizes and the `[windows]` buffer as given; the outside reader judges the
/// files with the buffer's depth `buffer_ticks`. The run's summary.
fn live_windows(frames: &str, buffer: &str, buffer_ticks: u64) -> Value {
    let _one = one_at_a_time();
    if !common::python3("stream") {
        return Value::Null;
    }
    let d = common::out_dir();
    let out_dir = d.path().join("out");
    let to = addrs(2);
    let seed = clock_seed();
    let records = 150u64;
    let toml = format!(
        "[run]\nid = \"live-windows\"\nevents = {records}\nduration_s = 0\nrate_hz = 100\n\
         seed = {seed}\n[builder]\nby = \"window\"\n\
         [frames]\nticks = 1000\n{frames}\
         [windows]\ntick_hz = 1000000\nbefore_ticks = 1500\nafter_ticks = 1500\n\
         delay_min_ticks = -50000\ndelay_max_ticks = 400000\n{buffer}wait_ms = 30\n\
         [source]\nkind = \"stream\"\nformat = \"frames\"\nmax_fragment = 8192\n\
         [sink]\nkind = \"file\"\ndir = \"{}\"\nfile_max_events = 40\n\
         [[ru]]\nid = \"ru0\"\nsource_id = 3\nstreams = {}\n\
         [[ru]]\nid = \"ru1\"\nsource_id = 9\nstreams = {}\n",
        out_dir.display(),
        list(&to[..1]),
        list(&to[1..])
    );
    let cfg = d.path().join("run.toml").display().to_string();
    let (out, s, fed) = run_fed(
        d.path(),
        &toml,
        &to,
        &[],
        &["--frames", &cfg, "--limit", "1000", "--rate", "1000"],
    );
    let t = text(&out);
    assert!(out.status.success(), "seed {seed}: {t}\n{}", fed.1);
    assert_eq!(s["run"]["evm"]["released"], records, "{s}");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/outside/check_windows.py");
    let o = Command::new("python3")
        .arg(&script)
        .arg(&out_dir)
        .args(["--seed", &seed.to_string(), "--frame", "1000"])
        .args(["--rate-hz", "100", "--tick-hz", "1000000"])
        .args(["--before", "1500", "--after", "1500"])
        .args(["--delay-min", "-50000", "--delay-max", "400000"])
        // the stream's lead on the decisions is its start before the run's: a slack
        .args([
            "--buffer-ticks",
            &buffer_ticks.to_string(),
            "--slack",
            "100000",
        ])
        .args(["--stream-end", "1000000"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["problems"], 0, "seed {seed}: {r}\n{t}");
    assert_eq!(r["records"], records, "{r}");
    let c = &r["components"];
    // decisions past 1 s of stream reach beyond its end: LATE; 0.2-0.4 s back: MISSING
    assert!(c["late"].as_u64().unwrap() >= 2 * 10, "{r}");
    assert!(c["missing"].as_u64().unwrap() > 0, "{r}");
    assert!(c["complete"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(sum(&s, "bus", "late_components"), c["late"], "{r}\n{s}");
    assert_eq!(
        sum(&s, "bus", "missing_components"),
        c["missing"],
        "{r}\n{s}"
    );
    assert!(t.contains(&format!("{} components LATE", c["late"])), "{t}");
    for ru in ["ru0", "ru1"] {
        let st = |k: &str| ru_stat(&s, ru, k);
        assert_eq!(st("stream_fragments_received"), 1000, "{ru}");
        assert!(st("frames_evicted") > 0, "{ru}");
        assert_eq!(
            st("frame_bytes_in"),
            st("frame_bytes_in_windows")
                + st("frame_bytes_evicted_unused")
                + st("frame_bytes_held_unused"),
            "{ru}: {}",
            s["nodes"][ru]
        );
    }
    s
}

/// Several streams into one RU by time (issue 54: "4 RUs × 4 sources"): two RUs of two
/// streams each (sources 3, 4 and 9, 10), fed by `evb feed --frames`. Each RU's fragment is
/// a super-fragment of its streams' window fragments (docs/formats.md §4, §8). Time slices:
/// every frame of all four streams in exactly one slice core, by the outside reader, and
/// each RU's byte account. Then decision windows from a file, every fourth naming sources 3
/// and 10 only: exactly the other two streams' fragments of those are EMPTY, every window's
/// frames and status as the reader judges them. Both on a detector's absolute clock
/// (`frames.first_tick`).
#[test]
fn several_streams_into_one_ru_by_time_build_every_source() {
    let _one = one_at_a_time();
    if !common::python3("stream") {
        return;
    }
    // the streams' clocks absolute, as a detector's (multiples of the frames' ticks)
    const T1: u64 = 700 * 151_785_714_285_714;
    const T2: u64 = 106_250_000_000_000_000;
    let rus = |to: &[String]| {
        format!(
            "[[ru]]\nid = \"ru0\"\nstreams = {}\nstream_sources = [3, 4]\n\
             [[ru]]\nid = \"ru1\"\nstreams = {}\nstream_sources = [9, 10]\n",
            list(&to[..2]),
            list(&to[2..])
        )
    };
    // time slices
    let d = common::out_dir();
    let out_dir = d.path().join("out");
    let to = addrs(4);
    let seed = clock_seed();
    let frames = 40 * 7000 / 700;
    let toml = format!(
        "[run]\nid = \"streams-slices\"\nduration_s = 0\nseed = {seed}\n\
         [builder]\nby = \"time\"\nslice_ticks = 7000\noverlap_ticks = 1400\n\
         [frames]\nticks = 700\nsize = 300\ndistribution = \"lognormal\"\nstddev = 200\n\
         first_tick = {T1}\n\
         [source]\nkind = \"stream\"\nformat = \"frames\"\nmax_fragment = 8192\n\
         [sink]\nkind = \"file\"\ndir = \"{}\"\n{}",
        out_dir.display(),
        rus(&to)
    );
    let cfg = d.path().join("run.toml").display().to_string();
    let (out, s, fed) = run_fed(
        d.path(),
        &toml,
        &to,
        &[],
        &["--frames", &cfg, "--limit", &frames.to_string()],
    );
    let t = text(&out);
    assert!(out.status.success(), "seed {seed}: {t}\n{}", fed.1);
    assert_eq!(s["run"]["evm"]["released"], 40, "{s}");
    let args = [
        "--seed",
        &seed.to_string(),
        "--slice",
        "7000",
        "--overlap",
        "1400",
        "--frame",
        "700",
        "--t0",
        &T1.to_string(),
    ];
    let r = common::check_slices(&out_dir, &args).expect("python3, checked above");
    assert_eq!(r["problems"], 0, "seed {seed}: {r}\n{t}");
    let mut cores = [0u64; 2];
    for (src, ru) in [("3", 0), ("4", 0), ("9", 1), ("10", 1)] {
        assert_eq!(r["sources"][src]["core_frames"], frames, "{src}: {r}");
        cores[ru] += r["sources"][src]["core_bytes"].as_u64().unwrap() + 24 * frames;
    }
    for (ru, cores) in ["ru0", "ru1"].into_iter().zip(cores) {
        assert_eq!(ru_stat(&s, ru, "frame_bytes_in_slice_cores"), cores, "{ru}");
        assert_eq!(ru_stat(&s, ru, "frame_bytes_in"), cores, "{ru}");
    }

    // decision windows from a file, a fourth of them over sources 3 and 10 only
    let d = common::out_dir();
    let out_dir = d.path().join("out");
    let to = addrs(4);
    let decisions = d.path().join("decisions.txt");
    let mut lines = String::new();
    for k in 0..100u64 {
        let named = if k % 4 == 1 { " 3,10" } else { "" };
        lines += &format!("{} {}{named}\n", T2 + 10_000 * k, T2 + 10_000 * k + 3000);
    }
    std::fs::write(&decisions, lines).unwrap();
    let toml = format!(
        "[run]\nid = \"streams-windows\"\nevents = 100\nduration_s = 0\nrate_hz = 100\n\
         seed = {seed}\n[builder]\nby = \"window\"\n\
         [frames]\nticks = 1000\nsize = 200\nfirst_tick = {T2}\n\
         [windows]\ntick_hz = 1000000\nbuffer_ms = 1000\nwait_ms = 50\ndecisions = \"{}\"\n\
         [source]\nkind = \"stream\"\nformat = \"frames\"\nmax_fragment = 8192\n\
         [sink]\nkind = \"file\"\ndir = \"{}\"\n{}",
        decisions.display(),
        out_dir.display(),
        rus(&to)
    );
    let cfg = d.path().join("run.toml").display().to_string();
    let (out, s, fed) = run_fed(
        d.path(),
        &toml,
        &to,
        &[],
        &["--frames", &cfg, "--limit", "1100", "--rate", "1000"],
    );
    let t = text(&out);
    assert!(out.status.success(), "seed {seed}: {t}\n{}", fed.1);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/outside/check_windows.py");
    let o = Command::new("python3")
        .arg(&script)
        .arg(&out_dir)
        .args(["--seed", &seed.to_string(), "--frame", "1000"])
        .args(["--rate-hz", "100", "--tick-hz", "1000000"])
        .args(["--buffer-ticks", "1000000", "--slack", "100000"])
        .args(["--t0", &T2.to_string()])
        .arg("--decisions")
        .arg(&decisions)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["problems"], 0, "seed {seed}: {r}\n{t}");
    assert_eq!(r["records"], 100, "{r}");
    // four components a record: 25 records leave out two each
    assert_eq!(r["components"]["empty"], 50, "{r}");
    assert_eq!(sum(&s, "bus", "empty_components"), 50, "{s}");
    assert_eq!(
        sum(&s, "bus", "late_components") + sum(&s, "bus", "missing_components"),
        r["components"]["late"].as_u64().unwrap() + r["components"]["missing"].as_u64().unwrap(),
        "{r}"
    );
    // the streams may still run when the last record is built: each RU read some of both,
    // never more than was sent, and its byte account adds up
    for ru in ["ru0", "ru1"] {
        let st = |k: &str| ru_stat(&s, ru, k);
        assert!(
            (2..=2 * 1100).contains(&st("stream_fragments_received")),
            "{ru}"
        );
        assert_eq!(
            st("frame_bytes_in"),
            st("frame_bytes_in_windows")
                + st("frame_bytes_evicted_unused")
                + st("frame_bytes_held_unused"),
            "{ru}"
        );
    }
    // evb inspect reads each stream's window inside the super-fragments
    let insp = Command::new(EVB)
        .arg("inspect")
        .arg(&out_dir)
        .output()
        .unwrap();
    let it = text(&insp);
    assert!(insp.status.success(), "{it}");
    let empty: u64 = it
        .lines()
        .filter_map(|l| {
            l.split("EMPTY ")
                .nth(1)?
                .split(')')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert_eq!(empty, 50, "{it}");
}

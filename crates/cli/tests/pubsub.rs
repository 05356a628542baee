//! `evb pub` and `evb sub` as separate processes on 127.0.0.1 (and over shm): exact tag
//! filtering, each slow-subscriber policy with counts that add up on both sides, and a
//! subscriber killed mid-stream.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

mod common;
use common::{clock_seed, Rng};

const EVB: &str = env!("CARGO_BIN_EXE_evb");

/// Starts `evb pub` with `args`; returns it and the address it bound.
fn start_pub(dir: &Path, args: &[&str]) -> (Child, String) {
    let mut child = Command::new(EVB)
        .arg("pub")
        .args(args)
        .arg("--json")
        .arg(dir.join("pub.json"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    (child, addr)
}

fn start_sub(dir: &Path, name: &str, addr: &str, args: &[&str]) -> Child {
    Command::new(EVB)
        .args(["sub", "--quiet", "--timeout", "120", "--from", addr])
        .args(args)
        .arg("--json")
        .arg(dir.join(format!("{name}.json")))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn json(dir: &Path, name: &str) -> Value {
    let text = std::fs::read_to_string(dir.join(format!("{name}.json")))
        .unwrap_or_else(|e| panic!("{name}.json: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

fn filtering(transport: &str) {
    let dir = common::out_dir();
    let d = dir.path();
    let (mut p, addr) = start_pub(
        d,
        &[
            "--transport",
            transport,
            "--tags",
            "10",
            "--size",
            "200",
            "--count",
            "20000",
            "--wait",
            "2",
            "--policy",
            "block",
        ],
    );
    let mut a = start_sub(d, "a", &addr, &["--transport", transport, "--tags", "0-4"]);
    let mut b = start_sub(
        d,
        "b",
        &addr,
        &[
            "--transport",
            transport,
            "--tags",
            "3,7",
            "--delivery",
            "latency",
        ],
    );
    assert!(a.wait().unwrap().success());
    assert!(b.wait().unwrap().success());
    assert!(p.wait().unwrap().success());
    let (pj, aj, bj) = (json(d, "pub"), json(d, "a"), json(d, "b"));
    assert_eq!(n(&aj, "received"), 5 * 2000);
    assert_eq!(n(&bj, "received"), 2 * 2000);
    for s in [&aj, &bj] {
        assert_eq!(n(s, "missed"), 0);
        assert_eq!(n(s, "unannounced_losses"), 0);
        assert_eq!(s["goodbyes"][0]["code"], "Shutdown");
    }
    assert_eq!(n(&pj, "published"), 20000);
    assert_eq!(n(&pj, "delivered"), 7 * 2000);
    assert_eq!(n(&pj, "dropped"), 0);
}

#[test]
fn filtering_tcp() {
    filtering("tcp")
}

#[test]
fn filtering_shm() {
    filtering("shm")
}

/// Policy drop, with one subscriber reading slowly: every message is received or counted
/// missed, on both sides.
#[test]
fn drop_counts_add_up() {
    let dir = common::out_dir();
    let d = dir.path();
    let (mut p, addr) = start_pub(
        d,
        &[
            "--tags",
            "4",
            "--size",
            "1024",
            "--count",
            "50000",
            "--wait",
            "2",
            "--policy",
            "drop",
            "--max-queued",
            "65536",
        ],
    );
    let mut slow = start_sub(d, "slow", &addr, &["--tags", "0-3", "--slow-us", "50"]);
    let mut fast = start_sub(d, "fast", &addr, &["--tags", "0-3"]);
    assert!(slow.wait().unwrap().success());
    assert!(fast.wait().unwrap().success());
    assert!(p.wait().unwrap().success());
    let (pj, sj, fj) = (json(d, "pub"), json(d, "slow"), json(d, "fast"));
    for s in [&sj, &fj] {
        assert_eq!(n(s, "received") + n(s, "missed"), 50000, "{s}");
        assert_eq!(n(s, "unannounced_losses"), 0);
    }
    assert!(n(&sj, "missed") > 0, "the slow one never fell behind: {sj}");
    assert_eq!(n(&pj, "delivered"), n(&sj, "received") + n(&fj, "received"));
    assert_eq!(n(&pj, "dropped"), n(&sj, "missed") + n(&fj, "missed"));
    // missed per tag, summed
    let per_tag: u64 = sj["missed_by_tag"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x[1].as_u64().unwrap())
        .sum();
    assert_eq!(per_tag, n(&sj, "missed"));
}

/// Policy disconnect: the slow subscriber is cut off and told why; what it received is an
/// unbroken run; the other one gets everything.
#[test]
fn disconnect_tells_why() {
    let dir = common::out_dir();
    let d = dir.path();
    let (mut p, addr) = start_pub(
        d,
        &[
            "--tags",
            "1",
            "--size",
            "1024",
            "--count",
            "50000",
            "--wait",
            "2",
            "--policy",
            "disconnect",
            "--max-queued",
            "65536",
        ],
    );
    let mut slow = start_sub(d, "slow", &addr, &["--tags", "0", "--slow-us", "100"]);
    let mut fast = start_sub(d, "fast", &addr, &["--tags", "0"]);
    assert!(slow.wait().unwrap().success());
    assert!(fast.wait().unwrap().success());
    assert!(p.wait().unwrap().success());
    let (pj, sj, fj) = (json(d, "pub"), json(d, "slow"), json(d, "fast"));
    assert_eq!(sj["goodbyes"][0]["code"], "SlowSubscriber", "{sj}");
    assert!(n(&pj, "disconnected_slow") >= 1, "{pj}");
    assert_eq!(n(&sj, "unannounced_losses"), 0);
    assert_eq!(n(&fj, "unannounced_losses"), 0);
    assert!(n(&sj, "received") < 50000);
    // the fast one may have been cut off too on a busy machine; if not, it has everything
    if fj["goodbyes"][0]["code"] == "Shutdown" {
        assert_eq!(n(&fj, "received"), 50000);
    }
    assert_eq!(n(&pj, "delivered"), n(&sj, "received") + n(&fj, "received"));
}

/// Policy block: nothing lost even with a slow subscriber; the publisher waited.
#[test]
fn block_loses_nothing() {
    let dir = common::out_dir();
    let d = dir.path();
    let (mut p, addr) = start_pub(
        d,
        &[
            "--tags",
            "2",
            "--size",
            "1024",
            "--count",
            "20000",
            "--wait",
            "1",
            "--policy",
            "block",
            "--max-queued",
            "65536",
        ],
    );
    let mut slow = start_sub(d, "slow", &addr, &["--tags", "0-1", "--slow-us", "20"]);
    assert!(slow.wait().unwrap().success());
    assert!(p.wait().unwrap().success());
    let (pj, sj) = (json(d, "pub"), json(d, "slow"));
    assert_eq!(n(&sj, "received"), 20000);
    assert_eq!(n(&sj, "missed"), 0);
    assert_eq!(n(&pj, "dropped"), 0);
    assert!(n(&pj, "would_block") > 0, "{pj}");
}

/// A subscriber killed mid-stream, at a moment drawn from a printed seed (`EVB_TEST_SEED`
/// repeats it), while `evb pub` publishes under policy block with its default send thread
/// (the killed one is the second to connect, so the send thread writes its socket): the
/// publisher stops waiting for it, the other two get every message in order, and
/// everything exits cleanly.
#[test]
fn a_subscriber_killed_mid_stream_does_not_hold_up_the_others() {
    let seed = std::env::var("EVB_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(clock_seed);
    eprintln!("seed {seed} (EVB_TEST_SEED={seed} repeats it)");
    let mut rng = Rng(seed | 1);
    let dir = common::out_dir();
    let d = dir.path();
    let count = 40_000u64;
    let (mut p, addr) = start_pub(
        d,
        &[
            "--tags",
            "2",
            "--size",
            "16384",
            "--count",
            &count.to_string(),
            "--wait",
            "3",
            "--policy",
            "block",
        ],
    );
    let mut a = start_sub(d, "a", &addr, &["--tags", "0-1"]);
    std::thread::sleep(std::time::Duration::from_millis(100));
    // slow, and not quiet: its first rate line (after a second of messages) says the stream
    // is under way
    let mut victim = Command::new(EVB)
        .args(["sub", "--timeout", "120", "--from", &addr, "--tags", "0-1"])
        .args(["--slow-us", "50"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let mut b = start_sub(d, "b", &addr, &["--tags", "0-1"]);
    let mut line = String::new();
    BufReader::new(victim.stderr.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(!line.is_empty(), "the victim said nothing");
    let delay = rng.below(300);
    std::thread::sleep(std::time::Duration::from_millis(delay));
    eprintln!(
        "killing the slow subscriber {delay} ms after: {}",
        line.trim()
    );
    victim.kill().unwrap();
    victim.wait().unwrap();
    assert!(a.wait().unwrap().success());
    assert!(b.wait().unwrap().success());
    assert!(p.wait().unwrap().success());
    let (pj, aj, bj) = (json(d, "pub"), json(d, "a"), json(d, "b"));
    for s in [&aj, &bj] {
        assert_eq!(n(s, "received"), count, "{s}");
        assert_eq!(n(s, "missed"), 0, "{s}");
        assert_eq!(n(s, "unannounced_losses"), 0, "{s}");
    }
    assert_eq!(n(&pj, "published"), count);
    assert_eq!(n(&pj, "dropped"), 0);
    // a and b got every message; the victim some of them before it died
    let victim_got = n(&pj, "delivered") - 2 * count;
    assert!(victim_got > 0 && victim_got < count, "{pj}");
}

/// A subscriber that reaches no publisher did nothing it was asked: it says whom it could
/// not reach and exits 1 (it exited 0 after "connect failed").
#[test]
fn a_subscriber_that_reaches_no_publisher_fails() {
    // below the ephemeral range: no port-0 listener of another process can be given it
    let port = common::free_base_port(1);
    let addr = format!("127.0.0.1:{port}");
    let o = Command::new(EVB)
        .args(["sub", "--quiet", "--timeout", "10", "--from", &addr])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("could not reach {addr}")), "{err}");
}

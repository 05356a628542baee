//! The network output (`sink.kind = "serve"`) with `evb consume` processes, all real
//! processes on 127.0.0.1: exact counts, every event acknowledged once, a consumer killed
//! mid-run losing nothing, a slow consumer slowing the trigger, a garbage client and a wrong
//! run id refused while the run goes on.

mod common;
use common::{evb_run_in, free_base_port, text, EVB};

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use evb_formats::events::EventFile;
use serde_json::Value;

/// A configuration of `bus` serving BUs (ports from `serve_base_port`), 2 RUs, 4 KiB fragments.
fn config(run_id: &str, events: u64, bus: u32, base: u16, extra: &str) -> String {
    format!(
        "[run]\nid = \"{run_id}\"\nevents = {events}\nduration_s = 0\n\
         [fragments]\nsize = 4096\n[topology]\nrus = 2\nbus = {bus}\n\
         [sink]\nkind = \"serve\"\nserve_base_port = {base}\n{extra}"
    )
}

fn addrs(base: u16, bus: u16) -> String {
    (0..bus)
        .map(|i| format!("127.0.0.1:{}", base + i))
        .collect::<Vec<_>>()
        .join(",")
}

fn consumer(dir: &Path, name: &str, run_id: &str, from: &str, extra: &[&str]) -> Child {
    Command::new(EVB)
        .args([
            "consume", "--from", from, "--run-id", run_id, "--name", name,
        ])
        .arg("--ids")
        .arg(dir.join(format!("{name}.ids")))
        .args(extra)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `evb run` on a thread: its output and JSON summary once it ends.
fn run_async(dir: &Path, toml: String) -> std::thread::JoinHandle<(Output, Value)> {
    let dir = dir.to_path_buf();
    std::thread::spawn(move || evb_run_in(&dir, &toml))
}

fn ids(dir: &Path, name: &str) -> Vec<u64> {
    std::fs::read_to_string(dir.join(format!("{name}.ids")))
        .unwrap_or_default()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

fn finished(c: Child) -> (Output, Value) {
    let out = c.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null);
    (out, summary)
}

/// The run passed and every BU's output went to consumers: nothing lost.
fn assert_served(out: &Output, s: &Value, events: u64, bus: usize) -> Vec<Value> {
    assert!(out.status.success(), "evb run failed:\n{}", text(out));
    assert_eq!(s["ok"], true, "{}", text(out));
    assert_eq!(s["run"]["evm"]["triggered"], events);
    let mut sinks = Vec::new();
    let mut acked = 0;
    for i in 0..bus {
        let b = &s["run"]["bus"][i];
        assert_eq!(b["output_lost"], 0, "bu{i}");
        let sink = s["nodes"][format!("bu{i}")]["sink"]["report"].clone();
        assert_eq!(sink["lost"], 0, "bu{i}: {sink}");
        assert_eq!(
            sink["acked"], b["events_built"],
            "bu{i}: every built event acked"
        );
        acked += sink["acked"].as_u64().unwrap();
        sinks.push(sink);
    }
    assert_eq!(acked, events, "every event acknowledged once");
    sinks
}

#[test]
fn two_serving_bus_three_consumers_every_event_once() {
    const EVENTS: u64 = 30_000;
    let dir = common::out_dir();
    let d = dir.path();
    let base = free_base_port(2);
    let run = run_async(d, config("farm", EVENTS, 2, base, ""));
    let from = addrs(base, 2);
    let kids: Vec<Child> = (0..3)
        .map(|k| {
            let name = format!("c{k}");
            let extra: &[&str] = if k == 0 { &["--out", "out"] } else { &[] };
            consumer(d, &name, "farm", &from, extra)
        })
        .collect();
    let (out, s) = run.join().unwrap();
    let sinks = assert_served(&out, &s, EVENTS, 2);
    let mut all: BTreeMap<u64, u32> = BTreeMap::new();
    let mut total = 0;
    for (k, c) in kids.into_iter().enumerate() {
        let (o, summary) = finished(c);
        assert!(o.status.success(), "consumer c{k}:\n{}", text(&o));
        assert_eq!(summary["errors"], 0);
        assert_eq!(summary["repeated"], 0);
        let got = ids(d, &format!("c{k}"));
        assert_eq!(summary["events"], got.len() as u64);
        total += got.len() as u64;
        for id in got {
            *all.entry(id).or_default() += 1;
        }
    }
    assert_eq!(total, EVENTS, "no event given to two consumers");
    assert_eq!(all.len() as u64, EVENTS);
    assert!(
        all.keys().copied().eq(0..EVENTS),
        "exactly the ids 0..{EVENTS}"
    );
    for sink in &sinks {
        assert_eq!(sink["re_served"], 0);
        assert_eq!(sink["sent"], sink["acked"]);
    }
    // the files one consumer wrote: every checksum valid, its events exactly
    let mut in_files = Vec::new();
    let outdir = d.join("out/c0");
    for e in std::fs::read_dir(&outdir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "evb") {
            for ev in EventFile::open(&p).unwrap() {
                let ev = ev.unwrap();
                for (h, payload) in &ev.fragments {
                    assert_eq!(crc32c::crc32c(payload), h.payload_crc);
                }
                in_files.push(ev.event_id);
            }
        }
    }
    in_files.sort_unstable();
    let mut c0 = ids(d, "c0");
    c0.sort_unstable();
    assert_eq!(in_files, c0, "c0's files hold exactly what it acknowledged");
    let inspect = Command::new(EVB)
        .arg("inspect")
        .args(
            std::fs::read_dir(&outdir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "evb")),
        )
        .output()
        .unwrap();
    assert!(inspect.status.success(), "{}", text(&inspect));
}

/// The test's own seeded randomness (printed, and taken from EVB_TEST_SEED to repeat a run).
fn rng() -> impl FnMut() -> u64 {
    let seed = std::env::var("EVB_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(common::clock_seed);
    eprintln!("seed {seed} (EVB_TEST_SEED={seed} repeats it)");
    let mut r = common::Rng(seed | 1);
    move || r.next()
}

#[test]
fn a_consumer_killed_mid_run_loses_nothing() {
    const EVENTS: u64 = 6_000;
    let mut r = rng();
    let dir = common::out_dir();
    let d = dir.path();
    let base = free_base_port(2);
    let run = run_async(d, config("kill", EVENTS, 2, base, ""));
    let from = addrs(base, 2);
    // slow enough that the run lasts about 4 s (6,000 events x 2 ms over 3 consumers)
    let mut kids: Vec<Child> = (0..3)
        .map(|k| consumer(d, &format!("c{k}"), "kill", &from, &["--slow-ms", "2"]))
        .collect();
    let victim = (r() % 3) as usize;
    let after = Duration::from_millis(100 + r() % 1500);
    let t0 = Instant::now();
    // kill only once it is serving (it has acknowledged something)
    while ids(d, &format!("c{victim}")).is_empty() && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(after);
    eprintln!("killing c{victim} after {after:?}");
    assert!(
        !run.is_finished(),
        "the run ended before the kill: make it longer"
    );
    kids[victim].kill().unwrap(); // SIGKILL
    let _ = kids[victim].wait();
    let (out, s) = run.join().unwrap();
    let sinks = assert_served(&out, &s, EVENTS, 2);
    let dropped: u64 = sinks
        .iter()
        .map(|x| x["consumers_dropped"].as_u64().unwrap())
        .sum();
    assert!(dropped >= 1, "the killed consumer was dropped: {sinks:?}");
    let mut all: BTreeMap<u64, u32> = BTreeMap::new();
    for (k, c) in kids.into_iter().enumerate() {
        if k == victim {
            continue;
        }
        let (o, summary) = finished(c);
        assert!(o.status.success(), "consumer c{k}:\n{}", text(&o));
        assert_eq!(summary["errors"], 0);
        for id in ids(d, &format!("c{k}")) {
            *all.entry(id).or_default() += 1;
        }
    }
    // the survivors got each event at most once; the killed one's events they did not get
    // are the ones it acknowledged before it died
    assert!(
        all.values().all(|&n| n == 1),
        "an event served twice to survivors"
    );
    let dead = ids(d, &format!("c{victim}"));
    for id in &dead {
        all.entry(*id).or_default();
    }
    assert_eq!(
        all.len() as u64,
        EVENTS,
        "every event reached a consumer (killed one: {} events)",
        dead.len()
    );
    let re_served: u64 = sinks.iter().map(|x| x["re_served"].as_u64().unwrap()).sum();
    eprintln!("re-served {re_served} events of the killed consumer");
    assert!(re_served > 0, "it held events when killed: {sinks:?}");
}

#[test]
fn a_slow_consumer_slows_the_trigger_and_nothing_is_dropped() {
    const EVENTS: u64 = 400;
    let dir = common::out_dir();
    let d = dir.path();
    let base = free_base_port(1);
    let run = run_async(
        d,
        config(
            "slow",
            EVENTS,
            1,
            base,
            "serve_max_held = 4\nserve_hold = 8\n",
        ),
    );
    let c = consumer(d, "c0", "slow", &addrs(base, 1), &["--slow-ms", "5"]);
    let (out, s) = run.join().unwrap();
    let sinks = assert_served(&out, &s, EVENTS, 1);
    // 400 events at 5 ms each, one at a time: the run took as long as the consumer
    let secs = s["run"]["seconds"].as_f64().unwrap();
    assert!(secs >= 1.8, "the trigger was not slowed: {secs} s");
    assert!(
        sinks[0]["busy"].as_u64().unwrap() > 0,
        "the BU was held back: {}",
        sinks[0]
    );
    let (o, summary) = finished(c);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(summary["events"], EVENTS);
    let mut got = ids(d, "c0");
    got.sort_unstable();
    assert!(got.into_iter().eq(0..EVENTS));
}

#[test]
fn garbage_and_a_wrong_run_id_are_refused_and_the_run_goes_on() {
    const EVENTS: u64 = 1_000;
    let dir = common::out_dir();
    let d = dir.path();
    let base = free_base_port(1);
    // the sink holds few events: the run lasts as long as its (slow) consumer
    let run = run_async(d, config("right", EVENTS, 1, base, "serve_hold = 16\n"));
    let addr = format!("127.0.0.1:{base}");
    let c = consumer(d, "good", "right", &addr, &["--slow-ms", "3"]);
    // a client that speaks something else: refused and closed, no panic
    let t0 = Instant::now();
    let mut sock = loop {
        match std::net::TcpStream::connect(&addr) {
            Ok(s) => break s,
            Err(_) if t0.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("the BU never listened: {e}"),
        }
    };
    sock.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = Vec::new();
    let _ = sock.read_to_end(&mut answer);
    assert!(answer.starts_with(b"EVBC"), "a Refuse frame: {answer:?}");
    assert_eq!(answer[6], 3, "frame type Refuse");
    // a consumer naming another run: refused, exits non-zero saying why
    let wrong = consumer(d, "wrong", "other-run", &addr, &["--wait-s", "5"]);
    let (o, _) = finished(wrong);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("refused (WrongRun)"), "{err}");
    assert!(ids(d, "wrong").is_empty());
    assert!(!run.is_finished(), "the checks ran while the run was on");
    // the run goes on with the proper consumer
    let (out, s) = run.join().unwrap();
    let sinks = assert_served(&out, &s, EVENTS, 1);
    assert_eq!(sinks[0]["connections_refused"], 2, "{}", sinks[0]);
    let (o, summary) = finished(c);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(summary["events"], EVENTS);
    // the BU said why, in its log
    let log = text(&out);
    assert!(
        log.contains("not Hello") || log.contains("bad hello"),
        "the garbage client's refusal is logged:\n{log}"
    );
    assert!(log.contains("other-run"), "{log}");
}

#[test]
fn a_consumer_that_stops_acknowledging_is_dropped_and_its_events_served_again() {
    const EVENTS: u64 = 2_000;
    let dir = common::out_dir();
    let d = dir.path();
    let base = free_base_port(1);
    let run = run_async(
        d,
        config("hang", EVENTS, 1, base, "serve_ack_timeout_s = 0.5\n"),
    );
    let addr = addrs(base, 1);
    // takes 4 events and sits on the first for 20 s
    let mut stuck = consumer(
        d,
        "stuck",
        "hang",
        &addr,
        &["--slow-ms", "20000", "--max-held", "4", "--wait-s", "1"],
    );
    // the stuck one is served first (it waits up to 30 s for the BU to listen)
    std::thread::sleep(Duration::from_millis(800));
    let good = consumer(d, "good", "hang", &addr, &[]);
    let (out, s) = run.join().unwrap();
    let sinks = assert_served(&out, &s, EVENTS, 1);
    assert!(
        sinks[0]["consumers_dropped"].as_u64().unwrap() >= 1,
        "{}",
        sinks[0]
    );
    assert!(sinks[0]["re_served"].as_u64().unwrap() >= 1, "{}", sinks[0]);
    assert!(
        text(&out).contains("no acknowledgement for"),
        "{}",
        text(&out)
    );
    let (o, summary) = finished(good);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        summary["events"], EVENTS,
        "the good consumer got every event"
    );
    assert!(ids(d, "stuck").is_empty());
    let _ = stuck.kill();
    let _ = stuck.wait();
}

/// Connects to `addr`, trying for 30 s (the BU is starting).
fn connect_when_up(addr: &str) -> std::net::TcpStream {
    let t0 = Instant::now();
    loop {
        match std::net::TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(_) if t0.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("the BU never listened on {addr}: {e}"),
        }
    }
}

/// A TCP connection to `addr` from the loopback address `src` (127.0.0.x: a source IP of
/// its own, as from another host).
fn connect_from(src: std::net::Ipv4Addr, addr: &str) -> std::io::Result<std::net::TcpStream> {
    use std::os::fd::FromRawFd;
    let to: std::net::SocketAddrV4 = addr.parse().expect("an IPv4 address");
    let sa = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip.octets()),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor this function owns (the TcpStream closes
    // it on every path), with sockaddr_in values that live across the calls.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let s = std::net::TcpStream::from_raw_fd(fd);
        let local = sa(src, 0);
        if libc::bind(fd, &local as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let remote = sa(*to.ip(), to.port());
        if libc::connect(fd, &remote as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(s)
    }
}

/// 64 sockets, 8 from each of 127.0.0.1 ..= 127.0.0.8 (so that they fill every slot
/// without going over the limit per address), that each declare the largest Hello the BU
/// waits for (1 KiB) and then send one byte every 2 s, connecting again 0.5 s after the BU
/// closes them; until `stop`.
fn slow_hellos(
    addr: &str,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<u32>> {
    use evb_wire::consumer::{ConsumerFrame, ConsumerHeader, CONSUMER_MAX_HANDSHAKE};
    use std::sync::atomic::Ordering;
    (0..64u8)
        .map(|i| {
            let (addr, stop) = (addr.to_string(), stop.clone());
            let src = std::net::Ipv4Addr::new(127, 0, 0, 1 + i % 8);
            std::thread::spawn(move || {
                let mut closed = 0u32;
                while !stop.load(Ordering::Acquire) {
                    let Ok(mut s) = connect_from(src, &addr) else {
                        std::thread::sleep(Duration::from_millis(500));
                        continue;
                    };
                    let head = ConsumerHeader::new(ConsumerFrame::Hello, CONSUMER_MAX_HANDSHAKE);
                    let _ = s.write_all(&head.encode());
                    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                    loop {
                        let mut b = [0u8; 2048];
                        match s.read(&mut b) {
                            Ok(_) => break, // a Refuse, or closed: the BU let go of it
                            Err(e)
                                if e.kind() == std::io::ErrorKind::WouldBlock
                                    || e.kind() == std::io::ErrorKind::TimedOut =>
                            {
                                if stop.load(Ordering::Acquire) || s.write_all(&[0]).is_err() {
                                    break;
                                }
                            }
                            Err(_) => break,
                        }
                    }
                    closed += 1;
                    std::thread::sleep(Duration::from_millis(500));
                }
                closed
            })
        })
        .collect()
}

/// Issue 28: 64 sockets trickling their Hellos once held every slot of the consumer port,
/// the real consumer was refused and the run lost its events. Now the handshake deadline is
/// a whole one, unfinished handshakes are bounded per address and shed for newer
/// connections: the consumer, started and attacked at seeded random moments, gets every
/// event and the run ends OK.
#[test]
fn sixty_four_slow_hellos_do_not_keep_the_consumer_out() {
    let _turn = TAKE_TURNS.lock().unwrap_or_else(|e| e.into_inner());
    use std::sync::atomic::{AtomicBool, Ordering};
    const EVENTS: u64 = 2_500;
    let mut r = rng();
    let dir = common::out_dir();
    let d = dir.path();
    let base = free_base_port(1);
    let run = run_async(
        d,
        config("slow-hellos", EVENTS, 1, base, "serve_hold = 16\n"),
    );
    let addr = addrs(base, 1);
    drop(connect_when_up(&addr));
    // the attack at a random moment; the consumer comes while its sockets hold every slot,
    // at a random point of their 5 s deadline
    let attack_at = Duration::from_millis(r() % 1500);
    let consumer_at = attack_at + Duration::from_millis(300 + r() % 4000);
    eprintln!("slow hellos at +{attack_at:?}, the consumer at +{consumer_at:?}");
    let t0 = Instant::now();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    while t0.elapsed() < attack_at {
        std::thread::sleep(Duration::from_millis(5));
    }
    let attack = slow_hellos(&addr, &stop);
    while t0.elapsed() < consumer_at {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!run.is_finished(), "the run waits for its consumer");
    // 3 ms per event: the run lasts 7.5 s more, under attack all along
    let c = consumer(d, "c0", "slow-hellos", &addr, &["--slow-ms", "3"]);
    let (out, s) = run.join().unwrap();
    stop.store(true, Ordering::Release);
    let closed: u32 = attack.into_iter().map(|t| t.join().unwrap()).sum();
    let sinks = assert_served(&out, &s, EVENTS, 1);
    let (o, summary) = finished(c);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(summary["events"], EVENTS);
    let mut got = ids(d, "c0");
    got.sort_unstable();
    assert!(got.into_iter().eq(0..EVENTS), "every event, once");
    let (shed, late) = (
        sinks[0]["handshakes_shed"].as_u64().unwrap(),
        sinks[0]["handshakes_timed_out"].as_u64().unwrap(),
    );
    eprintln!(
        "the BU shed {shed} and timed out {late} handshakes; the attackers saw {closed} closed"
    );
    assert!(
        late >= 32,
        "the slow sockets were closed at their deadline: {}",
        sinks[0]
    );
    assert!(shed >= 1, "the consumer came to a full house: {}", sinks[0]);
    assert!(
        closed as u64 >= late + shed,
        "the attackers saw every closing: {closed}"
    );
}

/// With run.secret, a consumer without it, and one with another, are refused and get
/// nothing (the BU and the consumer each prove the secret); consumers with it (from
/// --config, or EVB_SECRET) get every event.
#[test]
fn with_a_secret_only_consumers_that_prove_it_get_events() {
    const EVENTS: u64 = 3_000;
    let dir = common::out_dir();
    let d = dir.path();
    let base = free_base_port(1);
    let toml = config("locked", EVENTS, 1, base, "").replacen(
        "[run]\n",
        "[run]\nsecret = \"open-sesame-4b8e1d\"\n",
        1,
    );
    std::fs::write(d.join("farm.toml"), &toml).unwrap();
    let run = run_async(d, toml);
    let addr = addrs(base, 1);
    let mut none = consumer_env(d, "none", "locked", &addr, &[], None);
    let mut wrong = consumer_env(d, "wrong", "locked", &addr, &[], Some("open sesame!"));
    let (o, _) = finished(std::mem::replace(&mut none, dummy()));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("refused (Unauthenticated)") && err.contains("EVB_SECRET"),
        "{err}"
    );
    let (o, _) = finished(std::mem::replace(&mut wrong, dummy()));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("did not prove the run's secret"), "{err}");
    assert!(ids(d, "none").is_empty() && ids(d, "wrong").is_empty());
    assert!(!run.is_finished(), "the refusals came while the run was on");
    // the run id and the secret from the run's configuration; or the secret from EVB_SECRET
    let mut by_config = Command::new(EVB);
    by_config
        .args([
            "consume",
            "--from",
            &addr,
            "--name",
            "cfg",
            "--config",
            "farm.toml",
        ])
        .arg("--ids")
        .arg(d.join("cfg.ids"))
        .env_remove("EVB_SECRET")
        .current_dir(d)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let a = by_config.spawn().unwrap();
    let b = consumer_env(d, "env", "locked", &addr, &[], Some("open-sesame-4b8e1d"));
    let (out, s) = run.join().unwrap();
    let sinks = assert_served(&out, &s, EVENTS, 1);
    let mut all = Vec::new();
    for (name, c) in [("cfg", a), ("env", b)] {
        let (o, summary) = finished(c);
        assert!(o.status.success(), "{name}: {}", text(&o));
        assert_eq!(summary["errors"], 0);
        all.extend(ids(d, name));
    }
    all.sort_unstable();
    assert!(all.into_iter().eq(0..EVENTS), "every event, once");
    assert_eq!(sinks[0]["authenticated"], true);
    assert!(
        sinks[0]["auth_failed"].as_u64().unwrap() >= 1,
        "{}",
        sinks[0]
    );
    let log = text(&out);
    assert!(log.contains("requires the run's secret"), "{log}");
}

/// `evb consume` with EVB_SECRET set to `secret` (or removed).
fn consumer_env(
    dir: &Path,
    name: &str,
    run_id: &str,
    from: &str,
    extra: &[&str],
    secret: Option<&str>,
) -> Child {
    let mut c = Command::new(EVB);
    c.args([
        "consume", "--from", from, "--run-id", run_id, "--name", name,
    ])
    .arg("--ids")
    .arg(dir.join(format!("{name}.ids")))
    .args(extra)
    .current_dir(dir)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    match secret {
        Some(s) => c.env("EVB_SECRET", s),
        None => c.env_remove("EVB_SECRET"),
    };
    c.spawn().unwrap()
}

/// A finished stand-in child (for moving a real one out of a variable).
fn dummy() -> Child {
    Command::new("true").spawn().unwrap()
}

/// Every connection slot taken by consumers being served: `evb consume` is refused for room
/// (`Busy`), says so, tries again with a growing pause, and gets in once they leave; the
/// events they held unacknowledged go to it.
/// Tests that load the host hard (a BU killed mid-run and its events rebuilt) or that need
/// a quick BU (64 handshakes answered in time) take turns: a BU on a loaded host sheds
/// unfinished handshakes to make room, which is right, but not what that test checks.
static TAKE_TURNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_consumer_refused_for_room_tries_again_and_gets_in() {
    let _turn = TAKE_TURNS.lock().unwrap_or_else(|e| e.into_inner());
    use evb_wire::consumer::{ConsumerHeader, ConsumerHello, ConsumerMsg, CONSUMER_HEADER_LEN};
    const EVENTS: u64 = 1_000;
    let dir = common::out_dir();
    let d = dir.path();
    let base = free_base_port(1);
    let run = run_async(d, config("full", EVENTS, 1, base, "serve_max_held = 1\n"));
    let addr = addrs(base, 1);
    let hello = ConsumerMsg::Hello(ConsumerHello {
        max_held: 1,
        nonce: 0,
        run_id: "full".into(),
        name: "squatter".into(),
    })
    .encode();
    // a squatter the BU reset before its welcome (a loaded host sheds unfinished
    // handshakes, and the other tests' clients share 127.0.0.1) calls again
    let squat = || -> std::io::Result<std::net::TcpStream> {
        let mut s = connect_when_up(&addr);
        s.write_all(&hello)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut h = [0u8; CONSUMER_HEADER_LEN];
        s.read_exact(&mut h)?;
        let h = ConsumerHeader::decode(&h, 1 << 20).unwrap();
        let mut p = vec![0u8; h.length as usize];
        s.read_exact(&mut p)?;
        let m = ConsumerMsg::decode(h.kind, &p).unwrap();
        assert!(matches!(m, ConsumerMsg::Welcome(_)), "{m:?}");
        Ok(s)
    };
    let squatters: Vec<std::net::TcpStream> = (0..64)
        .map(|k| {
            let mut tries = 0;
            loop {
                match squat() {
                    Ok(s) => break s,
                    Err(e) if tries < 20 => {
                        tries += 1;
                        eprintln!("squatter {k}: {e}; calling again");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Err(e) => panic!("squatter {k} never got in: {e}"),
                }
            }
        })
        .collect();
    let c = consumer(d, "c0", "full", &addr, &[]);
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!run.is_finished());
    drop(squatters); // they leave without acknowledging what they hold
    let (out, s) = run.join().unwrap();
    let sinks = assert_served(&out, &s, EVENTS, 1);
    let (o, summary) = finished(c);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        err.contains("no room yet") && err.contains("too many connections"),
        "{err}"
    );
    assert!(err.contains("trying again in"), "{err}");
    assert_eq!(summary["events"], EVENTS);
    let mut got = ids(d, "c0");
    got.sort_unstable();
    assert!(got.into_iter().eq(0..EVENTS));
    assert!(
        sinks[0]["connections_refused"].as_u64().unwrap() >= 1,
        "{}",
        sinks[0]
    );
    assert!(sinks[0]["re_served"].as_u64().unwrap() >= 1, "{}", sinks[0]);
}

/// The pid of `evb run`'s (`parent`'s) node process `id`, once it is up.
fn node_pid(parent: u32, id: &str) -> Option<u32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // the parent pid is the 4th field, after the parenthesised command name
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
        let named = args
            .windows(2)
            .any(|w| w[0] == b"--id" && w[1] == id.as_bytes());
        // the EVM's standby runs with the EVM's id: never taken for it
        let standby = args.iter().any(|a| *a == b"--standby");
        if ppid == Some(parent) && named && !standby {
            return Some(pid);
        }
    }
    None
}

/// A serving run of `EVENTS` events at 2 kHz (about 4 s) through `evb run` (`extra`
/// arguments), one consumer connected to every BU, and `victim` killed with `kill -9` at a
/// seeded moment after the consumer's 200th event. Returns evb run's output, its JSON
/// summary and the consumer, still to be finished.
fn serving_run_with_a_kill(
    d: &Path,
    run_id: &str,
    bus: u32,
    extra: &[&str],
    victim: &str,
) -> (std::process::Output, Value, Child) {
    let mut r = rng();
    let base = free_base_port(bus as u16);
    let toml = config(run_id, EVENTS_KILLED, bus, base, "").replacen(
        "duration_s = 0\n",
        "duration_s = 0\nrate_hz = 2000.0\n",
        1,
    );
    std::fs::write(d.join("run.toml"), &toml).unwrap();
    let run = Command::new(EVB)
        .args(["run", "--quiet"])
        .args(extra)
        .arg("--config")
        .arg(d.join("run.toml"))
        .arg("--json")
        .arg(d.join("summary.json"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let from = addrs(base, bus as u16);
    let c = consumer(d, "c", run_id, &from, &["--wait-s", "3"]);
    let t0 = Instant::now();
    while ids(d, "c").len() < 200 && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = Duration::from_millis(r() % 1500);
    std::thread::sleep(after);
    let pid = node_pid(run.id(), victim).unwrap_or_else(|| panic!("{victim} is running"));
    eprintln!("kill -9 {victim} (pid {pid}) {after:?} after the consumer's 200th event");
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    let out = run.wait_with_output().unwrap();
    let s: Value = std::fs::read_to_string(d.join("summary.json"))
        .map(|t| serde_json::from_str(&t).unwrap())
        .unwrap_or(Value::Null);
    assert!(out.status.success(), "evb run failed:\n{}", text(&out));
    assert_eq!(s["ok"], true, "{}", text(&out));
    assert_eq!(
        s["run"]["evm"]["triggered"],
        EVENTS_KILLED,
        "{}",
        text(&out)
    );
    assert_eq!(s["run"]["evm"]["released"], EVENTS_KILLED);
    (out, s, c)
}

/// Events of the runs with a kill.
const EVENTS_KILLED: u64 = 8_000;

/// The consumer wrote every event of a run with a kill exactly once.
fn each_event_consumed_once(d: &Path, c: Child) -> Value {
    let (o, summary) = finished(c);
    let mut got = ids(d, "c");
    let n = got.len();
    got.sort_unstable();
    got.dedup();
    assert_eq!(got.len(), n, "an event written twice:\n{}", text(&o));
    assert_eq!(
        got,
        (0..EVENTS_KILLED).collect::<Vec<_>>(),
        "every event once:\n{}",
        text(&o)
    );
    summary
}

/// A serving BU killed with `kill -9` at a seeded moment through `evb run`: the serve sink
/// commits at the consumer's acknowledgement (docs/protocol.md §6 step 7), so what the BU
/// had handed out and not seen acknowledged is built again by another BU; the consumer,
/// connected to every BU, writes each event once (a repeat is acknowledged, not written).
/// The run's verdict is OK and every triggered event is in the consumer's output exactly once.
#[test]
fn a_serving_bu_killed_mid_run_loses_nothing_and_each_event_is_consumed_once() {
    let _turn = TAKE_TURNS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::out_dir();
    let d = dir.path();
    let (out, s, c) = serving_run_with_a_kill(d, "bukill", 3, &[], "bu1");
    assert_eq!(
        s["run"]["down"],
        serde_json::json!(["bu[1]"]),
        "{}",
        text(&out)
    );
    // bu1 died mid-run: it had handed out events not yet acknowledged and committed
    assert!(s["run"]["evm"]["reassigned"].as_u64().unwrap() > 0);
    // the consumer lost bu1 without an End: it says so (exit 1), but wrote every event once
    let summary = each_event_consumed_once(d, c);
    eprintln!(
        "served again and not written twice: {}",
        summary["repeated"]
    );
}

/// The EVM killed with `kill -9` at a seeded moment of a serving run started with
/// `evb run --standby`: the standby takes the run over (docs/standby.md), the BUs' consumers
/// never notice, and every triggered event reaches the consumer exactly once; the verdict
/// is OK and names the takeover.
#[test]
fn a_standby_takes_over_a_serving_run_and_each_event_is_consumed_once() {
    let _turn = TAKE_TURNS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::out_dir();
    let d = dir.path();
    let (out, s, c) = serving_run_with_a_kill(d, "evmkill", 2, &["--standby"], "evm");
    let took_over = s["run"]["evm"]["lost"].as_array().is_some_and(|l| {
        l.iter().any(|e| {
            e["node"] == "evm"
                && e["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("standby took over"))
        })
    });
    assert!(
        took_over,
        "the takeover is not in the report:\n{}",
        text(&out)
    );
    each_event_consumed_once(d, c);
}

/// One frame from a consumer connection, as the BU reads it.
fn bu_reads(s: &mut std::net::TcpStream) -> evb_wire::consumer::ConsumerMsg {
    use evb_wire::consumer::{ConsumerHeader, ConsumerMsg, CONSUMER_HEADER_LEN};
    let mut h = [0u8; CONSUMER_HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let h = ConsumerHeader::decode(&h, 1 << 20).unwrap();
    let mut p = vec![0u8; h.length as usize];
    s.read_exact(&mut p).unwrap();
    ConsumerMsg::decode(h.kind, &p).unwrap()
}

/// `evb consume` acknowledges what it has taken in one Ack whenever nothing more is buffered
/// to read, not one Ack per event: ten events that arrive in one write come back in fewer
/// Acks than events, every id exactly once, and the consumer counts the ten.
#[test]
fn events_that_arrive_together_are_acknowledged_together() {
    use evb_buffers::{Chain, Pool};
    use evb_formats::events::event_header;
    use evb_wire::consumer::{ConsumerFrame, ConsumerHeader, ConsumerMsg, Welcome};
    use evb_wire::FragmentHeader;

    let d = common::out_dir();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let c = consumer(d.path(), "c", "r", &addr, &[]);
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // the consumer's Hello: its header names the payload's length
    let mut h = [0u8; evb_wire::consumer::CONSUMER_HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let len = u32::from_le_bytes(h[8..12].try_into().unwrap());
    std::io::copy(&mut (&mut s).take(len as u64), &mut std::io::sink()).unwrap();
    s.write_all(
        &ConsumerMsg::Welcome(Welcome {
            bu_index: 0,
            max_held: 16,
            bu_id: "bu0".into(),
        })
        .encode(),
    )
    .unwrap();
    let pool = Pool::new("t", 4096, 16);
    let mut burst = Vec::new();
    for id in 0..10u64 {
        let payload = id.to_le_bytes();
        let mut w = pool.try_alloc().unwrap();
        let chain = Chain::from_slice(w.append(&payload).unwrap());
        let fh = FragmentHeader {
            event_id: id,
            trigger_number: id as u32,
            source_id: 1,
            flags: 0,
            payload_size: 8,
            payload_crc: crc32c::crc32c(&payload),
        };
        let mut record = event_header(id, id as u32, 0, &[(fh, &chain)]).to_vec();
        record.extend_from_slice(&fh.encode());
        record.extend_from_slice(&payload);
        burst.extend_from_slice(
            &ConsumerHeader::new(ConsumerFrame::Event, record.len() as u32).encode(),
        );
        burst.extend_from_slice(&record);
    }
    s.write_all(&burst).unwrap();
    let (mut acks, mut acked) = (0, Vec::new());
    while acked.len() < 10 {
        match bu_reads(&mut s) {
            ConsumerMsg::Ack(ids) => {
                acks += 1;
                acked.extend(ids);
            }
            other => panic!("expected an Ack, got {:?}", other.kind()),
        }
    }
    assert_eq!(
        acked,
        (0..10).collect::<Vec<u64>>(),
        "every id once, in order"
    );
    assert!(acks < 10, "{acks} Acks for 10 events that came together");
    s.write_all(&ConsumerMsg::End { acked: 10, lost: 0 }.encode())
        .unwrap();
    let (out, summary) = finished(c);
    assert_eq!(summary["events"], 10, "{}", text(&out));
    assert_eq!(ids(d.path(), "c"), (0..10).collect::<Vec<u64>>());
}

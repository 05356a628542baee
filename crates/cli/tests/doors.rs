//! The doors around the data path, tried from outside as an adversary on the same host would
//! (issue "Every door locked"): the control API with and without a secret (forged Origin,
//! DNS-rebinding Host, unauthenticated commands, the page's session), and slow,
//! unfinished HTTP requests against a running node. Real `evb up` / `evb run` processes on
//! loopback; timing from a printed seed.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::up::Up;
use common::{chaos_seed, free_base_port, text, HelloFlood, Rng, EVB};
use serde_json::{json, Value};

/// One raw HTTP/1.1 request (so that every header is the test's own, as an attacker's
/// would be); returns the status and the whole reply.
fn raw(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req += &format!("Host: {addr}\r\n");
    }
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += &format!("Content-Length: {}\r\n\r\n{body}", body.len());
    s.write_all(req.as_bytes()).unwrap();
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    let status = reply
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, reply)
}

/// Starts `evb run --quiet` on `toml`, written to `dir/run.toml`, with its JSON summary to
/// `dir/summary.json`; stdout and stderr piped.
fn spawn_run(dir: &std::path::Path, toml: &str) -> std::process::Child {
    let cfg = dir.join("run.toml");
    std::fs::write(&cfg, toml).unwrap();
    Command::new(EVB)
        .args(["run", "--quiet", "--config"])
        .arg(&cfg)
        .arg("--json")
        .arg(dir.join("summary.json"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn addr_of(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string()
}

/// With `run.secret` set, nothing that changes the run gets in without the token, from
/// loopback included; a web page cannot drive the API (forged Origin, text/plain bodies,
/// DNS rebinding); the page itself works once opened with the token (its own session).
#[test]
fn with_a_secret_no_local_process_or_web_page_controls_the_run() {
    let up = Up::start(
        "[run]\nsecret = \"door-key-0f3a9c2e\"\nevents = 2000\nduration_s = 0\n[fragments]\nsize = 4096\n",
    );
    let evm = addr_of(&up.url);
    let token = evb_control::control_token(b"door-key-0f3a9c2e");
    let bearer = format!("Bearer {token}");
    let json_ct = ("Content-Type", "application/json");

    // what curl from another user, or a page's fetch, sent in the reproduction
    let (code, body) = raw(
        &evm,
        "POST",
        "/api/v1/start",
        &[
            ("Content-Type", "text/plain"),
            ("Origin", "http://evil.example"),
        ],
        "{}",
    );
    assert_eq!(code, 403, "{body}");
    let (code, body) = raw(&evm, "POST", "/api/v1/start", &[json_ct], "{}");
    assert_eq!(code, 401, "an unauthenticated start on loopback: {body}");
    assert!(body.contains("bearer token"), "{body}");
    let (code, _) = raw(&evm, "POST", "/api/v1/reset", &[], "");
    assert_eq!(code, 401);
    let cfg = json!({"config": "[sink]\nkind = \"serve\"\nserve_host = \"0.0.0.0\"\n"}).to_string();
    let (code, _) = raw(&evm, "POST", "/api/v1/configure", &[json_ct], &cfg);
    assert_eq!(code, 401, "an unauthenticated configure");
    // DNS rebinding: a name that resolves to 127.0.0.1 but is not this node's
    let (code, body) = raw(
        &evm,
        "GET",
        "/api/v1/status",
        &[("Host", "rebind.evil.example")],
        "",
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("DNS rebinding"), "{body}");
    // a node's own API: the EVM's calls carry the token, nobody else's get in
    let s = up.status();
    let ru0 = Up::node(&s, "ru0")["control"].as_str().unwrap().to_string();
    let (code, _) = raw(
        &ru0,
        "POST",
        "/api/v1/node/abort",
        &[json_ct],
        "{\"reason\":\"x\"}",
    );
    assert_eq!(code, 401, "a node's abort without the token");
    // run numbers are range-checked (u64::MAX used to wrap the next run to 0)
    let big = json!({"run": u64::MAX}).to_string();
    let (code, body) = raw(
        &evm,
        "POST",
        "/api/v1/start",
        &[json_ct, ("Authorization", &bearer)],
        &big,
    );
    assert_eq!(code, 400, "{body}");
    assert_eq!(
        up.status()["state"],
        "ready",
        "a refused request changed the state"
    );

    // the page: opened once with the token, it gets a session of its own, in the address's
    // fragment (never sent to a server), and no cookie that holds a credential (browsers
    // send a host's cookies to every port of it: issue 53 item 2)
    let (code, reply) = raw(&evm, "GET", &format!("/?token={token}"), &[], "");
    assert_eq!(code, 303, "{reply}");
    for l in reply
        .lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
    {
        let value = l.split_once(':').unwrap().1.split(';').next().unwrap();
        assert!(
            value.trim().ends_with('=') && l.contains("Max-Age=0"),
            "a cookie with a value: {l}"
        );
        assert!(!l.contains(&token), "{l}");
    }
    let location = reply
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("location:"))
        .unwrap_or_else(|| panic!("no redirect: {reply}"));
    let session = location
        .split_once("#session=")
        .unwrap_or_else(|| panic!("no session: {location}"))
        .1
        .trim()
        .to_string();
    assert_eq!(session.len(), 64, "{location}");
    assert_ne!(session, token);
    let (code, _) = raw(&evm, "GET", "/?token=0123", &[], "");
    assert_eq!(code, 401, "a wrong token in the page's URL");
    // what a cookie of earlier versions carried (the token) no longer authenticates
    let port = evm.rsplit_once(':').unwrap().1;
    let own = format!("http://{evm}");
    // a start with these headers besides JSON's: its status and reply
    let start = |headers: &[(&str, &str)]| {
        let mut all = vec![json_ct];
        all.extend_from_slice(headers);
        raw(&evm, "POST", "/api/v1/start", &all, "{}")
    };
    let cookie = format!("evb_token_{port}={token}");
    let code = start(&[("Cookie", &cookie), ("Origin", &own)]).0;
    assert_eq!(code, 401, "the token as a cookie");
    // a session is not a bearer token: leaked, it does not stand for the token
    let bearer = format!("Bearer {session}");
    let code = start(&[("Authorization", &bearer)]).0;
    assert_eq!(code, 401, "the session as a bearer token");
    // the page's session from another origin's page is refused
    let other = start(&[
        ("X-Evb-Session", &session),
        ("Origin", "http://127.0.0.1:1"),
    ]);
    assert_eq!(other.0, 403);
    // the page's own button: same origin, its session, JSON
    let (code, body) = start(&[("X-Evb-Session", &session), ("Origin", &own)]);
    assert_eq!(code, 200, "{body}");
    let rec = up.wait_run(1);
    assert_eq!(rec["ok"], true, "{rec:#}");
    // a session can be ended; then it opens nothing
    let ended = raw(
        &evm,
        "POST",
        "/api/v1/logout",
        &[("X-Evb-Session", &session)],
        "",
    );
    assert_eq!(ended.0, 200, "{}", ended.1);
    let code = start(&[("X-Evb-Session", &session), ("Origin", &own)]).0;
    assert_eq!(code, 401, "an ended session");
    // evb up printed the page's URL with the token for the operator
    up.wait_said("the page's URL with the token", |said| {
        said.iter().any(|l| l.contains(&format!("?token={token}")))
    });
    assert!(up.halt().success());
}

/// Without a secret the API is loopback's, and a configuration sent to it is held to the
/// rules of one on disk: no consumer port beyond loopback.
#[test]
fn a_configuration_over_the_api_obeys_the_rules_of_one_on_disk() {
    let up = Up::start("[run]\nevents = 500\nduration_s = 0\n[fragments]\nsize = 4096\n");
    let (code, body) = up.post(
        "configure",
        json!({"config": "[run]\nevents = 500\nduration_s = 0\n[fragments]\nsize = 4096\n[sink]\nkind = \"serve\"\nserve_host = \"0.0.0.0\"\n"}),
    );
    assert_eq!(code, 400, "{body}");
    let msg = body["error"].as_str().unwrap_or_default();
    assert!(
        msg.contains("sink.serve_host") && msg.contains("run.secret"),
        "{msg}"
    );
    // a forged Origin is refused without a secret too
    let evm = addr_of(&up.url);
    let (code, _) = raw(
        &evm,
        "POST",
        "/api/v1/start",
        &[
            ("Content-Type", "application/json"),
            ("Origin", "http://evil.example"),
        ],
        "{}",
    );
    assert_eq!(code, 403);
    assert_eq!(up.status()["state"], "ready");
    // `evb ctl status | head`: the reader is gone before evb writes; it must end quietly
    for args in [
        vec!["ctl", "--url", up.url.as_str(), "status"],
        vec!["config", "default"],
    ] {
        let o = Command::new(EVB)
            .args(&args)
            .stdout(closed_pipe())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "evb {args:?}: {err}");
    }
    assert!(up.halt().success());
}

/// The write end of a pipe whose read end is already closed (a `| head` that has exited).
fn closed_pipe() -> std::process::Stdio {
    use std::os::fd::FromRawFd;
    let mut fds = [0i32; 2];
    // SAFETY: pipe(2) fills the two descriptors; the read end is closed at once and the write
    // end is owned by the Stdio returned.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        libc::close(fds[0]);
        std::process::Stdio::from_raw_fd(fds[1])
    }
}

/// Raises this process's descriptor limit to its hard limit (the flood below needs ~1,100).
fn raise_fd_limit() -> u64 {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur = l.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
    }
    l.rlim_cur
}

/// 1,100 unfinished HTTP requests to a BU's API in mid-run, under `ulimit -n 1024`, trickling
/// a byte every 2 s: the API holds at most its connection cap, each unfinished request is
/// cut at the header deadline, and the run builds every event (it used to end `failed -
/// stalled` on `Too many open files`).
#[test]
fn slow_unfinished_http_requests_cannot_take_a_nodes_descriptors() {
    let (seed, _) = chaos_seed("EVB_DOORS_TRIALS", 1);
    eprintln!("doors: seed {seed}: EVB_CHAOS_SEED={seed} replays it");
    let mut rng = Rng(seed | 1);
    if raise_fd_limit() < 1400 {
        evb_buffers::skips::skipped(
            "descriptor flood",
            "the hard descriptor limit is below 1,400",
        );
        return;
    }
    let base = free_base_port(5);
    let dir = common::out_dir();
    let cfg = dir.path().join("run.toml");
    std::fs::write(
        &cfg,
        format!(
            "[run]\nevents = 0\nduration_s = 8\n[fragments]\nsize = 16384\n[control]\nbase_port = {base}\n"
        ),
    )
    .unwrap();
    let json_out = dir.path().join("summary.json");
    let run = Command::new("bash")
        .arg("-c")
        .arg("ulimit -n 1024 && exec \"$0\" \"$@\"")
        .arg(EVB)
        .args(["run", "--quiet", "--config"])
        .arg(&cfg)
        .arg("--json")
        .arg(&json_out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // bu0's API: EVM, ru0, ru1, then the BUs
    let bu0 = format!("127.0.0.1:{}", base + 3);
    let wait_from = Instant::now();
    while TcpStream::connect(&bu0).is_err() {
        assert!(
            wait_from.elapsed() < Duration::from_secs(20),
            "bu0's API never came up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500 + rng.below(2500)));
    let mut held = Vec::new();
    for _ in 0..1100 {
        match TcpStream::connect_timeout(&bu0.parse().unwrap(), Duration::from_secs(1)) {
            Ok(mut s) => {
                let _ = s.write_all(b"GET /api/v1/node HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
                let _ = s.set_read_timeout(Some(Duration::from_millis(1)));
                held.push(s);
            }
            Err(_) => break,
        }
    }
    eprintln!("doors: {} slow requests open", held.len());
    // trickle: one byte every 2 s, and count the ones the node has closed
    let start = Instant::now();
    let mut closed = 0;
    while start.elapsed() < Duration::from_secs(7) {
        std::thread::sleep(Duration::from_secs(2));
        closed = 0;
        for s in &mut held {
            let _ = s.write_all(b"x");
            let mut b = [0u8; 64];
            match s.read(&mut b) {
                Ok(0) => closed += 1,
                Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => closed += 1,
                _ => {}
            }
        }
    }
    assert_eq!(
        closed,
        held.len(),
        "unfinished requests still open after the header deadline"
    );
    drop(held);
    let out = run.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "seed {seed}: {}", text(&out));
    assert!(stdout.contains("VERDICT: OK"), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("Too many open files"), "{stderr}");
    // one line every few seconds about the refused connections, not one per connection
    let warnings = stderr.matches("control API: closed").count();
    assert!(
        warnings < 50,
        "{warnings} lines about refused connections:\n{stderr}"
    );
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&json_out).unwrap()).unwrap();
    assert_eq!(s["ok"], true);
}

/// 80 sockets on 127.0.0.1 that keep unfinished 1,000-byte Hellos open on the EVM's and a BU's
/// data ports from before the nodes listen (re-opened whenever closed, as a persistent
/// attacker would): a run with a secret still starts and builds every event. It used to end
/// `only 0 of 4 connections up after 10 s` with every node exiting 1.
#[test]
fn a_handshake_flood_at_start_up_does_not_keep_the_nodes_apart() {
    let (seed, _) = chaos_seed("EVB_DOORS_TRIALS", 1);
    eprintln!("doors: seed {seed}: EVB_CHAOS_SEED={seed} replays it");
    let mut rng = Rng(seed | 1);
    let base = free_base_port(5);
    // on the EVM's and bu0's data ports, more than the places of one IP (scaled to this
    // 5-node topology: 18)
    let floods = [HelloFlood::start(base, 40), HelloFlood::start(base + 3, 40)];
    std::thread::sleep(Duration::from_millis(rng.below(1000)));
    let dir = common::out_dir();
    let (out, s) = common::evb_run_in(
        dir.path(),
        &format!(
            "[run]\nsecret = \"flood-key-5c7e2a91\"\nevents = 3000\nduration_s = 0\n[fragments]\nsize = 4096\n\
             [topology]\nbase_port = {base}\n"
        ),
    );
    let opened: u64 = floods.into_iter().map(HelloFlood::stop).sum();
    eprintln!("doors: the flood opened {opened} sockets");
    assert!(opened >= 80, "the flood never got in");
    common::assert_exact(&out, &s, 3000, 2, 2);
    // a flood is a few lines with counts, not one per socket
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = stderr
        .lines()
        .filter(|l| l.contains("incoming connection"))
        .count();
    assert!(lines < 40, "{lines} lines about the flood:\n{stderr}");
}

/// Issue 53 item 3: 80 sockets holding unfinished 1,000-byte Hellos on bu0's data port and
/// reconnecting as soon as they are shed, then 256 of them from 127.0.0.1–8: a run with a
/// secret starts and builds every event (80 used to fail 3 runs of 5: every newcomer, the
/// real RU included, was "closed at once: none older than 250 ms").
#[test]
fn a_reconnecting_hello_flood_on_a_bu_does_not_keep_a_run_with_a_secret_from_starting() {
    let (seed, _) = chaos_seed("EVB_DOORS_TRIALS", 1);
    eprintln!("doors: seed {seed}: EVB_CHAOS_SEED={seed} replays it");
    let mut rng = Rng(seed | 1);
    for (sockets, sources) in [(80usize, vec![1u8]), (256, (1..=8).collect())] {
        let base = free_base_port(5);
        // bu0's data port: EVM, ru0, ru1, bu0
        let flood = HelloFlood::start_from(base + 3, sockets, &sources);
        std::thread::sleep(Duration::from_millis(200 + rng.below(800)));
        let dir = common::out_dir();
        let (out, s) = common::evb_run_in(
            dir.path(),
            &format!(
                "[run]\nsecret = \"flood-key-5c7e2a91\"\nevents = 3000\nduration_s = 0\n[fragments]\nsize = 4096\n\
                 [topology]\nbase_port = {base}\n"
            ),
        );
        let opened = flood.stop();
        eprintln!("doors: {sockets} flood sockets opened {opened} connections");
        // a socket connects only once bu0 listens, and 3,000 small events may be built
        // within a few hundred ms of that: on a loaded host not every one of 256 threads
        // gets its turn first (a fresh-clone CI saw 252), half of them shows the flood in
        assert!(opened >= sockets as u64 / 2, "the flood never got in");
        common::assert_exact(&out, &s, 3000, 2, 2);
    }
}

/// Many nodes on one host all dial the same BU at once from 127.0.0.1: the per-IP limit on
/// unfinished handshakes scales with the topology, so none of them is closed (16 RUs used to
/// trip the limit of 8 by themselves).
#[test]
fn a_large_topology_on_one_host_is_not_mistaken_for_a_flood() {
    let dir = common::out_dir();
    let (out, s) = common::evb_run_in(
        dir.path(),
        "[run]\nevents = 400\nduration_s = 0\n[fragments]\nsize = 1024\n[topology]\nrus = 16\nbus = 2\n",
    );
    common::assert_exact(&out, &s, 400, 16, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("closing") && !stderr.contains("shed after"),
        "legitimate peers were closed:\n{stderr}"
    );
}

/// Ctrl-C to `evb run` at a seeded moment in its first 400 ms (from 50 ms), before or just after the run
/// starts: the run ends cleanly and exits 0 (nothing was lost), naming the operator's stop;
/// a stop before the start used to abort the run and exit 1.
#[test]
fn ctrl_c_at_start_up_ends_the_run_cleanly() {
    let (seed, trials) = chaos_seed("EVB_DOORS_TRIALS", 3);
    eprintln!("doors: seed {seed} ({trials} trials): EVB_CHAOS_SEED={seed} replays them");
    let mut rng = Rng(seed | 1);
    for trial in 0..trials {
        // from 50 ms: before that the launcher may not have started to watch for signals
        let at = if trial == 0 { 50 } else { 50 + rng.below(350) };
        let dir = common::out_dir();
        let spawned = Instant::now();
        let l = spawn_run(
            dir.path(),
            "[run]\nduration_s = 20\n[fragments]\nsize = 4096\n",
        );
        // the moment counts from the spawn, but not before the launcher catches SIGINT: on a
        // loaded host it may take longer than 50 ms to get there, and a signal before that
        // is the default action's (or lost, where the parent left SIGINT ignored)
        wait_until_it_catches_sigint(l.id());
        let at = Duration::from_millis(at);
        std::thread::sleep(at.saturating_sub(spawned.elapsed()));
        // SAFETY: kill(2) with a pid of a child of this process and a valid signal.
        unsafe { libc::kill(l.id() as i32, libc::SIGINT) };
        let o = l.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "seed {seed} trial {trial} at {at:?}: {}",
            text(&o)
        );
        assert!(
            out.contains("VERDICT: OK"),
            "seed {seed} trial {trial} at {at:?}: {out}"
        );
        assert!(
            out.contains("ended early by the operator"),
            "seed {seed} trial {trial} at {at:?}: {out}"
        );
    }
}

/// Waits (up to 20 s) until process `pid` has a handler for SIGINT (`SigCgt` in
/// /proc/PID/status), or has exited: from then on a Ctrl-C is the program's to handle.
fn wait_until_it_catches_sigint(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let catches = || {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            return true; // it has exited: the caller's checks say how
        };
        status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|mask| mask & (1 << (libc::SIGINT - 1)) != 0)
    };
    while !catches() {
        assert!(
            Instant::now() < deadline,
            "evb run (pid {pid}) did not catch SIGINT within 20 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// SIGKILL of `evb run` (no cleanup runs): no file on the host holds the run's secret, and
/// the nodes, whose launcher is gone, exit. `evb run` used to leave its resolved
/// configuration in /tmp with the secret in it.
#[test]
fn a_killed_launcher_leaves_no_secret_behind() {
    let secret = format!("secret-{}-{}", std::process::id(), common::clock_seed());
    let dir = common::out_dir();
    let mut l = spawn_run(
        dir.path(),
        &format!("[run]\nduration_s = 20\nsecret = \"{secret}\"\n[fragments]\nsize = 4096\n"),
    );
    let marker = format!("evb-run-{}-", l.id());
    let nodes = || common::pids_with(&marker, "");
    let t0 = Instant::now();
    while nodes().len() < 5 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the nodes never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1000));
    l.kill().unwrap();
    l.wait().unwrap();
    let t0 = Instant::now();
    while !nodes().is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "nodes outlived their launcher: {:?}",
            nodes()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // no file in the temporary folder (where the configuration used to go) holds the secret
    let holders: Vec<String> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| {
            std::fs::read(e.path()).is_ok_and(|b| String::from_utf8_lossy(&b).contains(&secret))
        })
        .map(|e| e.path().display().to_string())
        .collect();
    assert!(holders.is_empty(), "files holding the secret: {holders:?}");
}

/// A BU killed (SIGKILL) as soon as its process exists, before it registers: the verdict
/// names the cause first, as the EVM does for a node lost before the start, instead of
/// `bu1 exited with None` among a line per node about the others.
#[test]
fn a_node_killed_before_it_registers_is_named_as_the_cause() {
    let dir = common::out_dir();
    let l = spawn_run(
        dir.path(),
        "[run]\nduration_s = 5\n[fragments]\nsize = 4096\n",
    );
    let pid = node_pid(&l, "bu1");
    // SAFETY: kill(2) on a pid just read from /proc, with a valid signal.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let o = l.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success(), "{}", text(&o));
    // either the launcher saw it first, or the EVM did (bu1 had just registered)
    assert!(
        out.contains("lost bu1 before the run started: was killed by signal 9 (SIGKILL)")
            || out.contains("lost bu[1] before the run started"),
        "{out}"
    );
    assert!(!out.contains("exited with None"), "{out}");
}

/// A node that cannot start (its data port taken by another process) is named at the verdict
/// and in `--json`'s problems with its own last line on stderr and the class of the cause
/// with its fix (issue 71 item 2), not only `exited with exit code 1`.
#[test]
fn a_node_that_cannot_listen_is_named_with_its_last_line_and_the_fix() {
    let dir = common::out_dir();
    let base = common::free_base_port(6);
    // ru0 listens at base + 1 (the EVM at base): another process holds that port
    let taken = std::net::TcpListener::bind(("127.0.0.1", base + 1)).unwrap();
    // with a folder of its own per run (`{run}`): a run that never started leaves none
    let out_dir = dir.path().join("out");
    let toml = format!(
        "[run]\nid = \"portuse\"\nevents = 1000\nrecords_dir = {:?}\n[topology]\nbase_port = {base}\n\
         [sink]\nkind = \"file\"\ndir = \"{}/{{run}}\"\n",
        dir.path().join("records").display().to_string(),
        out_dir.display()
    );
    let (o, s) = common::evb_run_in(dir.path(), &toml);
    drop(taken);
    let left: Vec<_> = std::fs::read_dir(&out_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "a run that never started left {left:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success(), "{}", text(&o));
    let want = format!("lost ru0 before the run started: exited with exit code 1; its last line on stderr: evb node ru0: cannot listen on 127.0.0.1:{}", base + 1);
    let named = |l: &str| {
        l.contains(&want)
            && l.contains("Address already in use")
            && l.contains("(port in use: another process listens there")
    };
    assert!(out.lines().any(named), "{out}");
    let problems = s["problems"].as_array().cloned().unwrap_or_default();
    assert!(
        problems.iter().any(|p| p.as_str().is_some_and(named)),
        "--json's problems: {problems:?}"
    );
}

/// The output disk fills up mid-run (a tmpfs the test mounts, filled by another file): the
/// BUs hold their events and credits and say `sink blocked`; when the space returns they go
/// on, and the run builds and writes every event once (docs/operations/faults.md,
/// "What failures look like": "the output disk is full").
#[test]
fn a_full_output_disk_holds_the_events_until_space_returns() {
    let dir = common::out_dir();
    let mnt = dir.path().join("out");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=48m", "tmpfs"])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        evb_buffers::skips::skipped("a full output disk", "cannot mount a tmpfs (needs root)");
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _m = Unmount(mnt.clone());
    // all but ~3 MB taken: the run's ~16 MB of events cannot fit until the filler goes
    let filler = mnt.join("filler");
    std::fs::write(&filler, vec![7u8; 45 << 20]).unwrap();
    let mut l = spawn_run(
        dir.path(),
        &format!(
            "[run]\nevents = 2000\nduration_s = 0\nstall_timeout_s = 30\n[fragments]\nsize = 4096\n\
             [sink]\nkind = \"file\"\ndir = {:?}\n",
            mnt.display().to_string()
        ),
    );
    let json = dir.path().join("summary.json");
    let stderr = l.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut all = String::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("sink blocked") {
                let _ = tx.send(());
            }
            all += &line;
            all.push('\n');
        }
        all
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("no BU said `sink blocked` on a full disk");
    // the disk stays full a while (a seeded 0.2–1.7 s), then space returns
    let (seed, _) = chaos_seed("EVB_DOORS_TRIALS", 1);
    let hold = 200 + Rng(seed | 1).below(1500);
    eprintln!(
        "doors: seed {seed}: the disk stays full {hold} ms; EVB_CHAOS_SEED={seed} replays it"
    );
    std::thread::sleep(Duration::from_millis(hold));
    std::fs::remove_file(&filler).unwrap();
    let out = l.wait_with_output().unwrap();
    let log = reader.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{log}");
    assert!(stdout.contains("VERDICT: OK"), "{stdout}");
    assert!(log.contains("No space left on device"), "{log}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(s["run"]["evm"]["released"], 2000);
    // every event is in the files, once
    let ids: Vec<u64> = std::fs::read_dir(&mnt)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".evb"))
        .flat_map(|e| {
            evb_formats::events::EventFile::open(&e.path())
                .unwrap()
                .map(|ev| ev.unwrap().event_id)
                .collect::<Vec<_>>()
        })
        .collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(ids.len(), 2000, "events in the files");
    assert_eq!(sorted.len(), 2000, "an event written twice");
}

/// Another local user plants the directory and the URL file that `evb ctl` reads (issue 53
/// item 1): `evb ctl --config` refuses them and sends nothing (no token) to the planted
/// address, and `evb up` refuses the directory, naming it, instead of failing to write there
/// in silence. Run as root the planting is done as user `nobody` (setpriv); otherwise as this
/// user, with modes that let others in.
#[test]
fn a_control_url_planted_by_another_user_is_refused() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let t = common::out_dir();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let uid = std::fs::metadata("/proc/self").unwrap().uid();
    // the attacker's listener: counts what reaches it
    let trap = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let trap_url = format!("http://{}/", trap.local_addr().unwrap());
    trap.set_nonblocking(true).unwrap();
    let planted = t.path().join(format!("evb-{uid}"));
    let file = planted.join("planted.url");
    let as_nobody = uid == 0 && std::path::Path::new("/usr/bin/setpriv").exists();
    if as_nobody {
        let script = format!(
            "mkdir -m 0755 '{}' && printf '%s' '{trap_url}' > '{}' && chmod 0644 '{}'",
            planted.display(),
            file.display(),
            file.display()
        );
        let st = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sh",
                "-c",
            ])
            .arg(&script)
            .status()
            .unwrap();
        assert!(st.success(), "planting as nobody");
        assert_eq!(std::fs::metadata(&planted).unwrap().uid(), 65534);
    } else {
        std::fs::create_dir(&planted).unwrap();
        std::fs::write(&file, &trap_url).unwrap();
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let cfg = t.path().join("run.toml");
    std::fs::write(
        &cfg,
        "[run]\nid = \"planted\"\nsecret = \"door-key-0f3a9c2e\"\n[control]\nbase_port = 0\n",
    )
    .unwrap();
    let evb = |args: &[&str]| {
        Command::new(EVB)
            .args(args)
            .env("TMPDIR", t.path())
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("EVB_URL")
            .env_remove("EVB_SECRET")
            .output()
            .unwrap()
    };
    let cfg_s = cfg.display().to_string();
    let out = evb(&["ctl", "--config", &cfg_s, "status"]);
    let err = text(&out);
    assert!(
        !out.status.success(),
        "evb ctl followed a planted URL: {err}"
    );
    assert!(err.contains("refusing"), "{err}");
    assert!(err.contains(&planted.display().to_string()), "{err}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        trap.accept().is_err(),
        "evb ctl connected to the planted address"
    );
    let out = evb(&["up", "--config", &cfg_s]);
    let err = text(&out);
    assert!(
        !out.status.success(),
        "evb up ran with a planted state directory: {err}"
    );
    assert!(err.contains("refusing the state directory"), "{err}");
    assert!(trap.accept().is_err());
    // the planted file is untouched: evb up wrote nothing into another user's directory
    assert_eq!(std::fs::read_to_string(&file).unwrap(), trap_url);
}

/// With `run.secret`, the event files and their metadata are the run's user's alone (0600,
/// in folders evb makes 0700), or its group's too with `sink.file_group_read` (0640): no
/// other local user reads the data (issue 53 item 5). As root, `nobody` tries to read one.
#[test]
fn with_a_secret_the_output_files_are_not_readable_by_other_users() {
    use std::os::unix::fs::PermissionsExt;
    for (group, file_mode, dir_mode) in [(false, 0o600, 0o700), (true, 0o640, 0o750)] {
        let dir = common::out_dir();
        let out = dir.path().join("out").join("run");
        let cfg = dir.path().join("run.toml");
        std::fs::write(
            &cfg,
            format!(
                "[run]\nsecret = \"door-key-0f3a9c2e\"\nevents = 3000\nduration_s = 0\n[fragments]\nsize = 1024\n\
                 [sink]\nkind = \"file\"\ndir = \"{}\"\nfile_group_read = {group}\n",
                out.display()
            ),
        )
        .unwrap();
        let o = Command::new(EVB)
            .args(["run", "--quiet", "--config"])
            .arg(&cfg)
            .env_remove("EVB_SECRET")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&out), dir_mode, "{}", out.display());
        assert_eq!(mode(out.parent().unwrap()), dir_mode);
        let files: Vec<_> = std::fs::read_dir(&out)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(files.len() >= 4, "{files:?}");
        // the run manifest too (docs/formats.md §7)
        assert!(
            files
                .iter()
                .any(|f| f.to_string_lossy().ends_with(".manifest.json")),
            "{files:?}"
        );
        for f in &files {
            assert_eq!(mode(f), file_mode, "{}", f.display());
        }
        let running_as_root = std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
            .unwrap_or(false);
        if running_as_root && std::path::Path::new("/usr/bin/setpriv").exists() {
            // the parents are opened to others, so that only the evb-made folders and the
            // files' own modes stand between `nobody` and the data
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            let read = Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
                .arg(&files[0])
                .output()
                .unwrap();
            assert!(!read.status.success(), "nobody read {}", files[0].display());
        }
    }
}

/// Sockets from 127.0.0.2–9 (under the 16-per-IP cap each, 80 in all) that keep unfinished
/// requests open on the EVM's control API and reconnect as soon as they are closed: the
/// operator's `evb ctl status`, `start` and `stop` each succeed within 2 s (issue 53 item
/// 4; before, every one failed while strangers held the 64 places).
#[test]
fn strangers_holding_the_api_s_places_do_not_lock_the_operator_out() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let (seed, _) = chaos_seed("EVB_DOORS_TRIALS", 1);
    eprintln!("doors: seed {seed}: EVB_CHAOS_SEED={seed} replays it");
    let mut rng = Rng(seed | 1);
    let up = Up::start(
        "[run]\nsecret = \"door-key-0f3a9c2e\"\nevents = 0\nduration_s = 30\nrate_hz = 2000\n[fragments]\nsize = 4096\n",
    );
    let evm: std::net::SocketAddr = addr_of(&up.url).parse().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..80u8)
        .map(|k| {
            let (stop, opened) = (stop.clone(), opened.clone());
            let from: std::net::SocketAddr = ([127, 0, 0, 2 + k % 8], 0).into();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let s =
                        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                            .unwrap();
                    if s.bind(&from.into()).is_err()
                        || s.connect_timeout(&evm.into(), Duration::from_millis(500))
                            .is_err()
                    {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    let mut s: TcpStream = s.into();
                    opened.fetch_add(1, Ordering::Relaxed);
                    let _ =
                        s.write_all(b"GET /api/v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
                    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
                    let mut b = [0u8; 256];
                    // held until the API closes it (or the test ends), then at once again
                    loop {
                        match s.read(&mut b) {
                            Ok(0) => break,
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                                ) && !stop.load(Ordering::Relaxed) => {}
                            _ => break,
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500 + rng.below(1000)));
    assert!(
        opened.load(Ordering::Relaxed) >= 64,
        "the strangers did not take the API's places"
    );
    let timed = |args: &[&str]| {
        let t0 = Instant::now();
        let o = up.ctl(args);
        let took = t0.elapsed();
        assert!(o.status.success(), "evb ctl {args:?}: {}", text(&o));
        assert!(
            took < Duration::from_secs(2),
            "evb ctl {args:?} took {took:?} while strangers held the API"
        );
    };
    for _ in 0..5 {
        timed(&["status"]);
    }
    timed(&["start"]);
    std::thread::sleep(Duration::from_millis(300 + rng.below(700)));
    timed(&["status"]);
    timed(&["stop"]);
    for _ in 0..3 {
        timed(&["status"]);
    }
    let reconnects = opened.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    eprintln!("doors: the strangers opened {reconnects} connections");
    let rec = up.wait_run(1);
    assert_eq!(rec["ok"], true, "{rec}");
    assert!(up.halt().success());
}

/// A malformed request (400) and one with oversized headers (431) are each logged with its
/// reason, not dropped in silence; an unauthenticated command's refusal too (issue 53 item 5).
#[test]
fn malformed_and_refused_requests_are_logged_with_their_reasons() {
    let base = free_base_port(5);
    let dir = common::out_dir();
    let cfg = dir.path().join("run.toml");
    std::fs::write(
        &cfg,
        format!(
            "[run]\nsecret = \"door-key-0f3a9c2e\"\nevents = 0\nduration_s = 4\nrate_hz = 1000\n\
             [fragments]\nsize = 1024\n[control]\nbase_port = {base}\n"
        ),
    )
    .unwrap();
    let run = Command::new(EVB)
        .args(["run", "--quiet", "--config"])
        .arg(&cfg)
        .env_remove("EVB_SECRET")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let evm = format!("127.0.0.1:{base}");
    let t0 = Instant::now();
    while TcpStream::connect(&evm).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the EVM's API never came up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let send = |bytes: &[u8]| -> String {
        let mut s = TcpStream::connect(&evm).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(bytes);
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        reply
    };
    let bad = send(b"NOT\x01A REQUEST\r\n\r\n");
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    let mut big = b"GET /api/v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 200_000));
    big.extend_from_slice(b"\r\n\r\n");
    let large = send(&big);
    assert!(large.starts_with("HTTP/1.1 431"), "{large}");
    let (code, _) = raw(&evm, "POST", "/api/v1/stop", &[], "");
    assert_eq!(code, 401);
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let said: Vec<&str> = err.lines().filter(|l| l.contains("control API:")).collect();
    let all = said.join("\n");
    assert!(all.contains("closed connections"), "{all}\n---\n{err}");
    assert!(
        all.contains("invalid") || all.contains("parse"),
        "no 400 reason: {all}"
    );
    assert!(all.contains("too large"), "no 431 reason: {all}");
    assert!(
        all.contains("refused requests") && all.contains("401 to POST /api/v1/stop"),
        "{all}"
    );
}

/// Issue 71 item 9: a URL file left by an `evb up` that did not end in order names an address
/// that is now another's. `evb ctl` trusts it only once the control there proves it is the
/// run id's: a server that is not evb's, or nothing at all, is refused in words, and no
/// request of the operator's goes there; `evb up` of that run id is not taken for up.
#[test]
fn a_stale_control_url_file_is_not_trusted() {
    use std::os::unix::fs::PermissionsExt;
    let dir = common::out_dir();
    let runtime = dir.path().join("runtime");
    std::fs::create_dir_all(runtime.join("evb")).unwrap();
    for d in [runtime.clone(), runtime.join("evb")] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    // a web server that is not evb's: 404 to everything, counting what it was asked
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = other.local_addr().unwrap();
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    {
        let asked = asked.clone();
        std::thread::spawn(move || {
            for s in other.incoming() {
                let Ok(mut s) = s else { return };
                let mut buf = [0u8; 4096];
                let n = s.read(&mut buf).unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]);
                asked
                    .lock()
                    .unwrap()
                    .push(head.lines().next().unwrap_or("").to_string());
                let _ = s.write_all(
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\nconnection: close\r\n\r\nnot here\n",
                );
            }
        });
    }
    let url_file = runtime.join("evb").join("evb-local.url");
    let ctl = |args: &[&str]| {
        Command::new(EVB)
            .arg("ctl")
            .args(args)
            .env("XDG_RUNTIME_DIR", &runtime)
            .env_remove("EVB_URL")
            .output()
            .unwrap()
    };
    std::fs::write(&url_file, format!("http://{at}/\n")).unwrap();
    std::fs::set_permissions(&url_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = ctl(&["stop"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        err.contains(&format!("names http://{at}/"))
            && err.contains("answers HTTP 404 as no evb control does")
            && err.contains("not this run's control"),
        "{err}"
    );
    // it was asked who it is, and nothing else: the stop never went there
    let asked = asked.lock().unwrap().clone();
    assert!(
        asked.iter().all(|l| l.starts_with("GET /api/v1/status")),
        "{asked:?}"
    );
    // nothing at the address at all
    let gone = free_base_port(1);
    std::fs::write(&url_file, format!("http://127.0.0.1:{gone}/\n")).unwrap();
    let o = ctl(&["status"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(err.contains("nothing answers there"), "{err}");
}

/// The EVM held at its exit (a ptrace stop at the exit, after its report and its run record)
/// for a seeded 6–13 s, 2 s under its bound: it is not hung (its record flush alone may take
/// 10 s on a busy disk), so the run stays OK; `evb run` used to kill an EVM 5 s after its
/// report and call an exact run FAILED. The same with bu1 killed first, at a seeded moment
/// mid-run (two faults: the EVM builds bu1's events elsewhere). Held 2 s past its bound (15
/// s) it is killed, the run is FAILED, and `evb run` names the threads it was killed in.
#[test]
fn an_evm_slow_to_exit_after_its_report_is_waited_for_within_its_bound() {
    let (seed, _) = chaos_seed("EVB_DOORS_TRIALS", 1);
    eprintln!("doors: seed {seed}: EVB_CHAOS_SEED={seed} replays it");
    let mut rng = Rng(seed | 1);
    let cases = [
        (6_000 + rng.below(7_000), None, true),
        (
            6_000 + rng.below(7_000),
            Some(1_000 + rng.below(4_000)),
            true,
        ),
        (17_000, None, false),
    ];
    for (held, bu_lost_at, ok) in cases {
        eprintln!("doors: bu1 killed once {bu_lost_at:?} events were triggered");
        let (o, evm) = run_with_the_evm_held_at_its_exit(held, bu_lost_at);
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        eprintln!("doors: the EVM held at its exit for {held} ms");
        if ok {
            assert!(o.status.success(), "held {held} ms: {}", text(&o));
            assert!(out.contains("VERDICT: OK"), "held {held} ms: {out}");
        } else {
            assert!(!o.status.success(), "held {held} ms: {}", text(&o));
            assert!(out.contains("evm had to be killed"), "{out}");
            assert!(
                err.contains(&format!("evm (pid {evm}) had not exited; its threads: ")),
                "{err}"
            );
        }
    }
}

/// Runs `evb run` with its EVM traced (PTRACE_O_TRACEEXIT): the EVM runs as ever until it
/// exits, is held there (its report sent, its record written, its threads but the main one
/// gone) for `held_ms`, then let go; first, with `bu_lost_at`, bu1 is killed once the EVM has
/// triggered that many of the run's 8,000 events (paced at 4 kHz). The EVM's pid comes back
/// with the launcher's output. Run records go to the run's own folder.
fn run_with_the_evm_held_at_its_exit(
    held_ms: u64,
    bu_lost_at: Option<u64>,
) -> (std::process::Output, i32) {
    let dir = common::out_dir();
    let control = free_base_port(5);
    let l = spawn_run(
        dir.path(),
        &format!(
            "[run]\nevents = 8000\nrate_hz = 4000\nduration_s = 0\nrecords_dir = {:?}\n\
             [fragments]\nsize = 4096\n[control]\nbase_port = {control}\n",
            dir.path().join("records").display().to_string()
        ),
    );
    let evm = node_pid(&l, "evm");
    if let Some(n) = bu_lost_at {
        common::wait_node(
            &format!("127.0.0.1:{control}"),
            &format!("{n} events triggered (the EVM's status)"),
            60,
            || None,
            |line| common::triggered_at_least(line, n),
        );
        let bu1 = node_pid(&l, "bu1");
        // SAFETY: kill(2) on a pid read from /proc by the launcher's marker.
        unsafe { libc::kill(bu1, libc::SIGKILL) };
    }
    // SAFETY: ptrace(2) on a process of this test's (a descendant), with no memory passed.
    let rc = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            evm,
            std::ptr::null_mut::<libc::c_void>(),
            libc::PTRACE_O_TRACEEXIT as usize as *mut libc::c_void,
        )
    };
    assert_eq!(rc, 0, "PTRACE_SEIZE: {}", std::io::Error::last_os_error());
    let exit_stop = libc::SIGTRAP | (libc::PTRACE_EVENT_EXIT << 8);
    loop {
        let mut st = 0;
        // SAFETY: waitpid(2) for the tracee, into a local.
        let r = unsafe { libc::waitpid(evm, &mut st, libc::__WALL) };
        assert_eq!(r, evm, "waitpid: {}", std::io::Error::last_os_error());
        assert!(
            libc::WIFSTOPPED(st),
            "the EVM ended without stopping at its exit: {st:#x}"
        );
        if st >> 8 == exit_stop {
            break;
        }
        // a signal for the EVM (or a group stop): passed on, the EVM goes on
        let sig = match libc::WSTOPSIG(st) {
            libc::SIGTRAP | libc::SIGSTOP => 0,
            s => s,
        };
        // SAFETY: ptrace(2) on our stopped tracee.
        unsafe {
            libc::ptrace(
                libc::PTRACE_CONT,
                evm,
                std::ptr::null_mut::<libc::c_void>(),
                sig as usize as *mut libc::c_void,
            )
        };
    }
    std::thread::sleep(Duration::from_millis(held_ms));
    // SAFETY: ptrace(2) on our tracee; it fails if the launcher killed it meanwhile.
    let detached = unsafe {
        libc::ptrace(
            libc::PTRACE_DETACH,
            evm,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
        )
    } == 0;
    if !detached {
        // killed while traced: its end is reported here first, and only then to its parent
        let mut st = 0;
        // SAFETY: waitpid(2) for the tracee, into a local.
        unsafe { libc::waitpid(evm, &mut st, libc::__WALL) };
    }
    (l.wait_with_output().unwrap(), evm)
}

/// The pid of node `id` of the `evb run` that is `launcher`, once its process exists (20 s
/// at most): `evb run` tags its nodes' command lines with its own pid.
fn node_pid(launcher: &std::process::Child, id: &str) -> i32 {
    let marker = format!("evb-run-{}-", launcher.id());
    let t0 = Instant::now();
    loop {
        if let Some(&pid) = common::pids_with(&marker, &format!("--id {id} ")).first() {
            return pid;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{id} never started");
        std::thread::sleep(Duration::from_millis(2));
    }
}

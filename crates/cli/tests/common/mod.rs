//! Helpers shared by the process tests: run `evb` and read what it reports.
#![allow(dead_code)] // each test binary uses its own subset

pub mod cc;
pub mod nodes;
pub mod up;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

pub const EVB: &str = env!("CARGO_BIN_EXE_evb");

/// A folder for a process test's files and output, in memory (/dev/shm) where the host has
/// one. On this project's VMs, a disk write's completion waits for seconds when the CPUs
/// are saturated (two busy loops beside ten evb processes: fdatasync of 4 MB took 2–10 s,
/// against 0.03 s beside the busy loops alone), and the EVM rightly calls a run stalled that
/// released nothing for `stall_timeout_s`. These tests check the commit protocol, not the
/// disk (the full-disk test mounts its own small file system).
pub fn out_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let in_memory = shm
        .is_dir()
        .then(|| {
            tempfile::Builder::new()
                .prefix("evb-test-")
                .tempdir_in(shm)
                .ok()
        })
        .flatten();
    match in_memory {
        Some(d) => d,
        None => tempfile::tempdir().unwrap(),
    }
}

/// Writes `toml` to `dir/run.toml`, runs `evb run --quiet --json` on it; returns the process
/// output and the JSON summary (`Null` if none was written).
pub fn evb_run_in(dir: &Path, toml: &str) -> (Output, Value) {
    evb_run_in_env(dir, toml, &[])
}

/// Like `evb_run_in`, with environment variables set for `evb` (and so its nodes).
pub fn evb_run_in_env(dir: &Path, toml: &str, env: &[(&str, &str)]) -> (Output, Value) {
    let cfg = dir.join("run.toml");
    std::fs::write(&cfg, toml).unwrap();
    let json = dir.join("summary.json");
    let _ = std::fs::remove_file(&json);
    let out = Command::new(EVB)
        .args(["run", "--quiet", "--config"])
        .arg(&cfg)
        .arg("--json")
        .arg(&json)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let summary = std::fs::read_to_string(&json)
        .map(|s| serde_json::from_str(&s).unwrap())
        .unwrap_or(Value::Null);
    (out, summary)
}

/// Like `evb_run_in`, in a temporary folder of its own.
pub fn evb_run(toml: &str) -> (Output, Value) {
    let dir = out_dir();
    evb_run_in(dir.path(), toml)
}

/// `n` consecutive free loopback ports (best effort: bound together, then released).
pub fn free_base_port(n: u16) -> u16 {
    // The tests of one binary run side by side, each drawing a random free range: two ranges
    // a few ports apart, both free when drawn, collide once both systems start (seen in CI:
    // two fault tests' nodes 2 ports apart). So no range overlaps one given before.
    static GIVEN: std::sync::Mutex<Vec<(u32, u32)>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    for _ in 0..100 {
        let base = evb_messaging::free_ports(n).expect("free loopback ports");
        let (b, e) = (u32::from(base), u32::from(base) + u32::from(n));
        if given.iter().all(|&(gb, ge)| e <= gb || b >= ge) {
            given.push((b, e));
            return base;
        }
    }
    panic!("no free range of {n} loopback ports apart from those given to this binary's tests")
}

/// stdout and stderr together, for failure messages.
pub fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Asserts a run that built exactly `events` events (ids 0..events) once each, intact, with
/// every node exiting cleanly and no process left behind.
pub fn assert_exact(out: &Output, s: &Value, events: u64, rus: usize, bus: usize) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "evb run failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("VERDICT: OK"), "{stdout}");
    assert_eq!(s["ok"], true);
    let run = &s["run"];
    assert_eq!(run["evm"]["triggered"], events);
    assert_eq!(run["evm"]["released"], events);
    assert_eq!(run["evm"]["duplicate_releases"], 0);
    let bus_r = run["bus"].as_array().unwrap();
    assert_eq!(bus_r.len(), bus);
    let built: u64 = bus_r
        .iter()
        .map(|b| b["events_built"].as_u64().unwrap())
        .sum();
    assert_eq!(built, events, "every event built once");
    let id_sum: u64 = bus_r
        .iter()
        .map(|b| b["event_id_sum"].as_u64().unwrap())
        .fold(0, u64::wrapping_add);
    assert_eq!(
        id_sum,
        (0..events).sum::<u64>(),
        "the built ids are exactly 0..events"
    );
    for b in bus_r {
        assert_eq!(b["crc_errors"], 0);
        assert_eq!(b["content_errors"], 0);
        assert_eq!(b["duplicate_fragments"], 0);
        assert_eq!(b["incomplete_at_stop"], 0);
        if bus > 1 {
            assert!(
                b["events_built"].as_u64().unwrap() > 0,
                "a BU got no events"
            );
        }
    }
    for r in run["rus"].as_array().unwrap() {
        assert_eq!(r["fragments_sent"], events);
        assert_eq!(r["retained"], 0);
    }
    let codes = s["exit_codes"].as_object().unwrap();
    assert_eq!(codes.len(), 1 + rus + bus);
    assert!(codes.values().all(|c| c == 0), "{codes:?}");
    for pid in s["pids"].as_array().unwrap() {
        let pid = pid.as_u64().unwrap();
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "node process {pid} left behind"
        );
    }
}

/// xorshift64*: a few lines serve; the seed is all that is needed to replay a campaign.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A seed from the clock, for a run that was given none.
pub fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// A random-moment campaign's seed (`EVB_CHAOS_SEED`, else the clock) and its number of
/// trials (`trials_var`, else `default`).
pub fn chaos_seed(trials_var: &str, default: u64) -> (u64, u64) {
    let seed = std::env::var("EVB_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(clock_seed);
    let trials = std::env::var(trials_var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    (seed, trials)
}

/// Threads that keep `sockets` sockets on 127.0.0.1 with unfinished 1,000-byte data-port
/// Hellos on a port, re-opening each shortly after it is closed (not in a tight loop: a CPU
/// hog is not what these tests are about), until stopped.
pub struct HelloFlood {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    opened: std::sync::Arc<std::sync::atomic::AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl HelloFlood {
    pub fn start(port: u16, sockets: usize) -> HelloFlood {
        HelloFlood::start_from(port, sockets, &[1])
    }

    /// As [`HelloFlood::start`], socket k from 127.0.0.`sources[k % sources.len()]`.
    pub fn start_from(port: u16, sockets: usize, sources: &[u8]) -> HelloFlood {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let opened = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut hello = evb_wire::FrameHeader::new(evb_wire::FrameType::Hello, 1000, 0, 0)
            .encode()
            .to_vec();
        hello.resize(hello.len() + 999, 7);
        let threads = (0..sockets)
            .map(|k| {
                let (stop, opened, hello) = (stop.clone(), opened.clone(), hello.clone());
                let from: std::net::SocketAddr =
                    ([127, 0, 0, sources[k % sources.len()]], 0).into();
                std::thread::spawn(move || {
                    let to: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(mut s) = connect_from(from, to) else {
                            std::thread::sleep(std::time::Duration::from_millis(5));
                            continue;
                        };
                        opened.fetch_add(1, Ordering::Relaxed);
                        let _ = s.write_all(&hello);
                        let _ = s.set_read_timeout(Some(std::time::Duration::from_millis(100)));
                        let mut b = [0u8; 256];
                        while !stop.load(Ordering::Relaxed) {
                            match s.read(&mut b) {
                                Ok(0) => break,
                                Err(e)
                                    if !matches!(
                                        e.kind(),
                                        std::io::ErrorKind::WouldBlock
                                            | std::io::ErrorKind::TimedOut
                                    ) =>
                                {
                                    break
                                }
                                _ => {}
                            }
                        }
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                })
            })
            .collect();
        HelloFlood {
            stop,
            opened,
            threads,
        }
    }

    /// Stops the flood; how many sockets it opened.
    pub fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        self.opened.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A TCP connection to `to` from the local address `from` (port 0: any).
pub fn connect_from(
    from: std::net::SocketAddr,
    to: std::net::SocketAddr,
) -> std::io::Result<std::net::TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&from.into())?;
    s.connect_timeout(&to.into(), std::time::Duration::from_millis(200))?;
    Ok(s.into())
}

/// Pids of the live processes whose command line holds `marker` and `also` (e.g. the
/// launcher's tag `evb-run-<pid>-` and `--id bu1 `).
pub fn pids_with(marker: &str, also: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c).replace('\0', " ");
                c.contains(marker) && c.contains(also)
            })
        })
        .collect()
}

/// What the node whose control API is at `api` (`IP:port`) publishes of itself
/// (`GET /api/v1/node`: `phase`, `pid`, and `snapshot`, its latest status line); `Null` while
/// it does not answer.
pub fn node_status(api: &str) -> Value {
    evb_control::client::Api::new(api, None)
        .with_timeout(std::time::Duration::from_secs(2))
        .get("/api/v1/node")
        .ok()
        .filter(|r| r.status == 200)
        .map(|r| r.body)
        .unwrap_or(Value::Null)
}

/// Waits (polling every 50 ms, at most `secs`) until the latest status line of the node at
/// `api` satisfies `f`, and returns it; panics naming `what` and the last status seen. `gone`
/// is asked on every pass and ends the wait with a panic when it returns a reason (the
/// process awaited has exited, say).
pub fn wait_node(
    api: &str,
    what: &str,
    secs: u64,
    mut gone: impl FnMut() -> Option<String>,
    mut f: impl FnMut(&Value) -> bool,
) -> Value {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let s = node_status(api);
        let line = &s["snapshot"];
        if f(line) {
            return line.clone();
        }
        if let Some(why) = gone() {
            panic!("gave up waiting for {what} ({api}): {why}; last status: {s}");
        }
        assert!(
            std::time::Instant::now() < until,
            "gave up waiting {secs} s for {what} ({api}); last status: {s}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The EVM's status line says the run is running and has triggered at least `n` events.
pub fn triggered_at_least(line: &Value, n: u64) -> bool {
    line["state"] == "running" && line["stats"]["triggered"].as_u64().is_some_and(|t| t >= n)
}

/// Sends signal `sig` (`-9`, `-STOP`, ...) to process `pid`, which must exist.
pub fn signal(pid: u64, sig: &str) {
    assert!(
        Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success(),
        "kill {sig} {pid}"
    );
}

/// Waits (at most `secs`) until process `pid` is gone (exited and reaped, or a zombie).
pub fn wait_gone(pid: u64, what: &str, secs: u64) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while up::alive(pid) {
        assert!(
            std::time::Instant::now() < until,
            "{what} (pid {pid}) still running after {secs} s"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A small tmpfs mounted on `dir` (made here), of `size` (`"3m"`), unmounted when dropped:
/// a disk that fills. `None`, said on stderr, where it cannot be had (not root, no mount):
/// the caller skips.
#[allow(dead_code)]
pub struct Tmpfs(pub std::path::PathBuf);

#[allow(dead_code)]
impl Tmpfs {
    pub fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        let root = std::fs::read_to_string("/proc/self/status")
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
        if !root {
            evb_buffers::skips::skipped("small tmpfs", "needs root to mount a small tmpfs");
            return None;
        }
        std::fs::create_dir_all(dir).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status();
        if !mounted.is_ok_and(|s| s.success()) {
            evb_buffers::skips::skipped("small tmpfs", "cannot mount a tmpfs here");
            return None;
        }
        Some(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The outside reader of time slices (`tests/outside/check_slices.py`, written from
/// docs/formats.md §8) on the files in `dir`, with its `args` (`--slice`, `--overlap`,
/// `--frame`, ...): its JSON verdict, or `None` (said) when python3 is not installed.
pub fn check_slices(dir: &Path, args: &[&str]) -> Option<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/outside/check_slices.py");
    let Ok(o) = Command::new("python3")
        .arg(&script)
        .arg(dir)
        .args(args)
        .output()
    else {
        evb_buffers::skips::skipped("the outside reader", "python3 is not installed");
        return None;
    };
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    Some(serde_json::from_slice(&o.stdout).unwrap())
}

/// Whether python3 runs here (the outside readers need it); says that `what` is skipped if
/// not.
pub fn python3(what: &str) -> bool {
    let ok = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        evb_buffers::skips::skipped(what, "python3 is not installed");
    }
    ok
}

/// A Python with h5py and numpy: `EVB_PYTHON`, or the test environment `scripts/test.sh`
/// makes in `target/pyenv`. `None` (a skip, said on stderr) where there is none, unless the
/// tools are required (`EVB_REQUIRE_TOOLS`): then it fails.
pub fn python_with_h5py() -> Option<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let py = std::env::var_os("EVB_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target/pyenv/bin/python"));
    let ok = Command::new(&py)
        .args(["-c", "import h5py, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(py);
    }
    assert!(
        std::env::var("EVB_REQUIRE_TOOLS").is_err(),
        "h5py is required (EVB_REQUIRE_TOOLS) but {} cannot import it",
        py.display()
    );
    evb_buffers::skips::skipped(
        "h5py",
        &format!(
            "no Python with h5py at {} (./scripts/test.sh makes one)",
            py.display()
        ),
    );
    None
}

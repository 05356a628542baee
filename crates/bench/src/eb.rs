//! The event builder itself: a whole `evb run` (EVM, RUs and BUs as processes over tcp, or
//! shm for the rows that say so), launched as a child of this process (`evb run --json ...
//! --quiet --config ...`).

use std::process::{Command, Stdio};

use serde_json::Value;

use crate::measure::Point;
use evb_messaging::free_ports;

/// Bytes of each generated frame in a run by time.
const FRAME_BYTES: u64 = 4096;

/// The decision rate of [`WindowsRow::FullSpeed`]: 20 kHz of 1 MiB records, 21 GB/s, more
/// than a host's loopback moves, so that the EVM always has a decision waiting for a credit
/// and the run builds windows as fast as it can, as an unpaced run builds events.
const FULL_SPEED_DECISIONS_HZ: f64 = 20_000.0;

/// Which run by decision windows a build row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowsRow {
    /// Built by events or time slices.
    No,
    /// 10 kHz of decisions, each a 1 ms window of 100 µs frames of `fragment / 10` bytes,
    /// 5 ms old when decided: the latency from the decision (when it was due) to the record
    /// built. Its rate is set, so it is no throughput row.
    Latency,
    /// Decisions faster than the host can build them, each a window of `fragment` bytes per
    /// RU (4 KiB frames): the throughput of building by windows, beside `nxn` of the same
    /// bytes. Its latency counts the backlog of decisions, so it says nothing.
    FullSpeed,
}

#[derive(Debug, Clone)]
pub struct BuildSpec {
    pub rus: u32,
    pub bus: u32,
    /// payload bytes per fragment (the mean for lognormal)
    pub fragment: u64,
    pub lognormal: bool,
    /// "headers", "crc" or "full"
    pub verify: &'static str,
    /// generator content: "static" (made once: the builder alone) or "unique"
    pub content: &'static str,
    /// RUs on one CPU, BUs on another (`[affinity]`), the EVM anywhere
    pub pin: Option<(usize, usize)>,
    pub seconds: f64,
    /// Watched as an operator would: every node's `/metrics` and the EVM's run status (what
    /// the page polls) fetched once a second while the run is on.
    pub scraped: bool,
    /// One of the N x M scaling series (named so in the variant, for the scaling plot).
    pub scaling: bool,
    /// Triggered at this fraction of the maximum rate (measured first, by a run of the same
    /// shape without a limit): the latency under load.
    pub load: Option<f64>,
    /// `evb run` as a newcomer types it: no configuration file (the built-in default, its
    /// placement included), only `--duration`; the fields above that shape a run describe
    /// that default and are not passed.
    pub as_typed: bool,
    /// `transport.kind`: "tcp" (every row but those that say otherwise) or "shm".
    pub transport: &'static str,
    /// LSEB's shape, a "folded" builder: RU i and BU i share host i (loopback address
    /// 127.0.0.i+1 here), which talk over shm (`transport.local`), everything between hosts
    /// over `transport`. Half the fragments of a 2 x 2 run then never touch the kernel's tcp.
    pub folded: bool,
    /// Busy compute threads (at nice 0, in the bench process) running beside the builder
    /// for the whole run: a filter farm's processes on the builder's hosts.
    pub compute_load: u32,
    /// `run.priority` of the builder's nodes: "normal", "high" or "realtime".
    pub priority: &'static str,
    /// Built by time (`builder.by = "time"`): each RU's fragment is a time slice's window
    /// fragment of `fragment / 4096` generated frames of 4096 bytes (`content` theirs), plus
    /// one frame of overlap.
    pub slices: bool,
    /// Built by decision windows (`builder.by = "window"`, DUNE's shape), or not.
    pub windows: WindowsRow,
}

impl BuildSpec {
    pub fn variant(&self) -> String {
        if self.as_typed {
            return DEFAULT_RUN.into();
        }
        format!(
            "{} {} verify={}{}",
            if self.lognormal { "lognormal" } else { "fixed" },
            self.content,
            self.verify,
            if self.pin.is_some() { " pinned" } else { "" }
        ) + if self.folded { " folded" } else { "" }
            + if self.scraped { " scraped" } else { "" }
            + if self.scaling { " scaling" } else { "" }
            + if self.slices { " time slices" } else { "" }
            + match self.windows {
                WindowsRow::No => "",
                WindowsRow::Latency => " windows 10 kHz",
                WindowsRow::FullSpeed => " windows full speed",
            }
            + &self
                .load
                .map(|f| format!(" load={:.0}%", f * 100.0))
                .unwrap_or_default()
            + &if self.compute_load > 0 {
                format!(" compute={}", self.compute_load)
            } else {
                String::new()
            }
            + &if self.priority != "normal" {
                format!(" priority={}", self.priority)
            } else {
                String::new()
            }
    }

    fn toml(&self, run_id: &str, rate_hz: f64) -> String {
        let mut affinity = String::new();
        if let Some((ru_cpu, bu_cpu)) = self.pin {
            affinity.push_str("\n[affinity]\n");
            for i in 0..self.rus {
                affinity.push_str(&format!("ru{i} = [{ru_cpu}]\n"));
            }
            for i in 0..self.bus {
                affinity.push_str(&format!("bu{i} = [{bu_cpu}]\n"));
            }
        }
        let (local, nodes) = if self.folded {
            ("local = \"shm\"\n", self.folded_nodes())
        } else {
            (
                "",
                format!(
                    "[topology]\nrus = {}\nbus = {}\nhost = \"127.0.0.1\"\n",
                    self.rus, self.bus
                ),
            )
        };
        let base = format!(
            r#"[run]
id = "{run_id}"
duration_s = {secs}
stall_timeout_s = 20.0
rate_hz = {rate_hz}
priority = "{priority}"

{sizes}
[builder]
verify = "{verify}"
{by}
[transport]
kind = "{transport}"
{local}
{nodes}"#,
            secs = self.seconds,
            sizes = self.sizes(),
            by = self.by_time(),
            verify = self.verify,
            transport = self.transport,
            priority = self.priority,
        );
        base + &affinity
    }

    /// `[fragments]`, or `[frames]` for a run by time.
    fn sizes(&self) -> String {
        let dist = if self.lognormal { "lognormal" } else { "fixed" };
        match self.windows {
            WindowsRow::Latency => {
                return format!(
                    "[frames]\nticks = 100\nsize = {}\ndistribution = \"{dist}\"\n\
                     content = \"{}\"\n[windows]\ntick_hz = 1000000\nbefore_ticks = 500\n\
                     after_ticks = 500\ndelay_min_ticks = 5000\ndelay_max_ticks = 5000\n",
                    (self.fragment / 10).max(1),
                    self.content
                )
            }
            WindowsRow::FullSpeed => {
                // a frame every 2 ticks; the window as many frames as the events' fragment
                // holds bytes, half before its decision's tick and half after; every
                // decision 5 ms old, and the latency buffer deeper than the run, so that
                // a window decided late is still whole
                let side = (self.fragment / FRAME_BYTES).max(1);
                return format!(
                    "[frames]\nticks = 2\nsize = {FRAME_BYTES}\ndistribution = \"{dist}\"\n\
                     content = \"{}\"\n[windows]\ntick_hz = 1000000\nbefore_ticks = {side}\n\
                     after_ticks = {side}\ndelay_min_ticks = 5000\ndelay_max_ticks = 5000\n\
                     buffer_ms = {}\n",
                    self.content,
                    (self.seconds.ceil() as u64 + 2) * 1000
                );
            }
            WindowsRow::No => {}
        }
        if self.slices {
            format!(
                "[frames]\nticks = 1000\nsize = {FRAME_BYTES}\ndistribution = \"{dist}\"\n\
                 content = \"{}\"\n",
                self.content
            )
        } else {
            format!(
                "[fragments]\nsize = {}\ndistribution = \"{dist}\"\ncontent = \"{}\"\n",
                self.fragment, self.content
            )
        }
    }

    /// The `[builder]` keys of a run by time: slices of `fragment` bytes of frames, and one
    /// frame of overlap.
    fn by_time(&self) -> String {
        if self.windows != WindowsRow::No {
            return "by = \"window\"\n".into();
        }
        if !self.slices {
            return String::new();
        }
        let frames = (self.fragment / FRAME_BYTES).max(1);
        format!(
            "by = \"time\"\nslice_ticks = {}\noverlap_ticks = 1000\n",
            frames * 1000
        )
    }

    /// The nodes one by one: the EVM with host 0, RU i and BU i on host i mod the hosts
    /// (as many hosts as the larger role), host k being 127.0.0.k+1, every port chosen by
    /// `evb run`.
    fn folded_nodes(&self) -> String {
        let hosts = self.rus.max(self.bus).max(1);
        let at = |i: u32| format!("127.0.0.{}:0", i % hosts + 1);
        let mut out = format!("[evm]\nid = \"evm\"\naddr = \"{}\"\n", at(0));
        for i in 0..self.rus {
            out.push_str(&format!("\n[[ru]]\nid = \"ru{i}\"\naddr = \"{}\"\n", at(i)));
        }
        for i in 0..self.bus {
            out.push_str(&format!("\n[[bu]]\nid = \"bu{i}\"\naddr = \"{}\"\n", at(i)));
        }
        out
    }
}

/// Runs one event-building run and reads its JSON summary.
/// The variant of the default run's point.
pub const DEFAULT_RUN: &str = "default run (evb run as typed)";

/// The built-in default run's shape (crates/config/src/default.toml), for `as_typed`.
pub fn default_run(seconds: f64) -> BuildSpec {
    BuildSpec {
        rus: 2,
        bus: 2,
        fragment: 512 * 1024,
        lognormal: false,
        verify: "full",
        content: "unique",
        pin: None,
        seconds,
        scraped: false,
        scaling: false,
        load: None,
        as_typed: true,
        transport: "tcp",
        folded: false,
        compute_load: 0,
        priority: "normal",
        slices: false,
        windows: WindowsRow::No,
    }
}

pub fn build(spec: &BuildSpec, scratch: &std::path::Path) -> Result<Point, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find evb itself: {e}"))?;
    let tag = format!("build-{}-{}", std::process::id(), spec.fragment);
    let cfg_path = scratch.join(format!("{tag}.toml"));
    let json_path = scratch.join(format!("{tag}.json"));
    // under load: the maximum rate of the same shape first, then this fraction of it
    let (rate_hz, max) = match spec.load {
        Some(f) => {
            let unloaded = BuildSpec {
                load: None,
                seconds: spec.seconds.min(2.0),
                ..spec.clone()
            };
            let max = build(&unloaded, scratch)?.msgs_per_s;
            ((f * max).max(1.0), Some(max))
        }
        None => (0.0, None),
    };
    // decision windows come at their own rate (their windows are placed by it)
    let rate_hz = match spec.windows {
        WindowsRow::No => rate_hz,
        WindowsRow::Latency => 10_000.0,
        WindowsRow::FullSpeed => FULL_SPEED_DECISIONS_HZ,
    };
    let mut toml = spec.toml(&tag, rate_hz);
    let nodes = 1 + spec.rus + spec.bus;
    let control_base = if spec.scraped {
        let base = free_ports(nodes as u16).ok_or("no free ports for the control APIs")?;
        toml.push_str(&format!("\n[control]\nbase_port = {base}\n"));
        Some(base)
    } else {
        None
    };
    if !spec.as_typed {
        std::fs::write(&cfg_path, toml).map_err(|e| e.to_string())?;
    }
    let _ = std::fs::remove_file(&json_path);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraper = control_base.map(|base| {
        let done = done.clone();
        std::thread::spawn(move || scrape(base, nodes as u16, &done))
    });
    // the compute load: its pace alone first (the reference of its progress), then
    // running through the whole of the builder's run
    let compute = (spec.compute_load > 0).then(|| {
        let alone = Burners::start(spec.compute_load);
        std::thread::sleep(std::time::Duration::from_secs(1));
        let alone = alone.stop();
        (alone, Burners::start(spec.compute_load))
    });
    let mut cmd = Command::new(&exe);
    cmd.arg("run").arg("--quiet").arg("--json").arg(&json_path);
    if spec.as_typed {
        cmd.arg("--duration").arg(spec.seconds.to_string());
    } else {
        cmd.arg("--config").arg(&cfg_path);
    }
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let compute = compute.map(|(alone, beside)| beside.stop() / alone);
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let scrapes = scraper.and_then(|t| t.join().ok()).unwrap_or(0);
    let v = read_summary(&json_path, &out)?;
    let _ = std::fs::remove_file(&cfg_path);
    let mut p = Point::new(
        "build",
        "evb",
        spec.transport,
        &spec.variant(),
        spec.fragment,
    );
    p.senders = spec.rus;
    p.receivers = spec.bus;
    fill_from_summary(&v, &mut p)?;
    if spec.windows == WindowsRow::FullSpeed {
        // a throughput of whole windows: none may have come LATE or MISSING
        let partial: u64 = v["run"]["bus"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|b| b["partial_events"].as_u64().unwrap_or(0))
            .sum();
        if partial > 0 {
            return Err(format!(
                "{partial} windows were built partial: not a throughput of whole windows"
            ));
        }
        p.note.push_str(&format!(
            "; decisions at {FULL_SPEED_DECISIONS_HZ:.0} Hz, faster than they were built, every \
             window whole: the latency counts their backlog"
        ));
    }
    {
        // an event's (a record's) latency from its trigger (decision): the EVM's clock, to
        // the release by the BU that built it; the BUs' own (Assign to built) in the note
        let h: evb_builder::LatencyHistogram =
            serde_json::from_value(v["run"]["evm"]["record_latency"].clone())
                .map_err(|e| format!("summary has no run.evm.record_latency: {e}"))?;
        let q = |x: f64| h.quantile_us(x).map_or(f64::NAN, |u| u as f64);
        let built = (p.p50_us, p.p99_us);
        (p.p50_us, p.p99_us, p.p999_us) = (q(0.5), q(0.99), q(0.999));
        p.note.push_str(&format!(
            "; latency from the trigger to the BU's release (the EVM's clock); from the \
             BU's Assign to built: p50 {:.0} us, p99 {:.0} us",
            built.0, built.1
        ));
    }
    if let Some(max) = max {
        p.note.push_str(&format!(
            "; triggered at {rate_hz:.0} Hz, {:.0} % of the {max:.0} events/s measured just before",
            100.0 * rate_hz / max
        ));
    }
    if let Some(share) = compute {
        p.note.push_str(&format!(
            "; the {} compute threads ran at {:.0} % of their pace alone (priority {})",
            spec.compute_load,
            100.0 * share,
            spec.priority
        ));
    }
    if spec.scraped {
        if scrapes == 0 {
            return Err("the run was never scraped".into());
        }
        p.note.push_str(&format!("; {scrapes} scrapes"));
    }
    Ok(p)
}

/// The JSON summary `evb run --json` wrote, checked to be a run that ended OK.
pub fn read_summary(
    json_path: &std::path::Path,
    out: &std::process::Output,
) -> Result<Value, String> {
    let text = std::fs::read_to_string(json_path).map_err(|e| {
        format!(
            "evb run wrote no summary ({e}); exit {:?}; stderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        )
    })?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("summary: {e}"))?;
    if v["ok"] != Value::Bool(true) {
        return Err(format!("evb run failed: {}", v["problems"]));
    }
    Ok(v)
}

/// A run's events/s, built GB/s, each role's CPU per event and per GB, and its latency
/// percentiles, from its summary `v`, into `p`.
pub fn fill_from_summary(v: &Value, p: &mut Point) -> Result<(), String> {
    let run = &v["run"];
    let secs = run["seconds"]
        .as_f64()
        .ok_or("summary has no run.seconds")?;
    let events = run["evm"]["triggered"]
        .as_u64()
        .ok_or("summary has no run.evm.triggered")?;
    let bytes: u64 = run["bus"]
        .as_array()
        .ok_or("summary has no run.bus")?
        .iter()
        .map(|b| b["payload_bytes_built"].as_u64().unwrap_or(0))
        .sum();
    p.msgs_per_s = events as f64 / secs;
    p.gb_per_s = bytes as f64 / secs / 1e9;
    p.note = format!("{events} events in {secs:.2} s; msgs_per_s is events/s");
    // the cost of an event: each role's process CPU over the run (getrusage), per event and
    // per GB built; tx/rx CPU per GB are the RUs' and the BUs'
    let cpu_of = |role: &str| -> f64 {
        v["nodes"].as_object().map_or(0.0, |nodes| {
            nodes
                .values()
                .filter(|r| r["role"] == role)
                .map(|r| r["cpu"]["run_s"].as_f64().unwrap_or(0.0))
                .sum()
        })
    };
    let (evm, rus, bus) = (cpu_of("evm"), cpu_of("ru"), cpu_of("bu"));
    if bytes > 0 && events > 0 {
        let gb = bytes as f64 / 1e9;
        p.send_cpu_s_per_gb = rus / gb;
        p.recv_cpu_s_per_gb = bus / gb;
        let us = |c: f64| c * 1e6 / events as f64;
        p.note.push_str(&format!(
            "; CPU us/event: EVM {:.2}, RUs {:.2}, BUs {:.2}",
            us(evm),
            us(rus),
            us(bus)
        ));
    }
    // event-building latency, assigned to built, from the BUs' HDR histograms (within 1 %)
    let mut lat = evb_builder::LatencyHistogram::default();
    for b in run["bus"].as_array().into_iter().flatten() {
        if let Ok(h) = serde_json::from_value::<evb_builder::LatencyHistogram>(b["latency"].clone())
        {
            lat.merge(&h);
        }
    }
    let q = |x: f64| lat.quantile_us(x).map_or(f64::NAN, |u| u as f64);
    (p.p50_us, p.p99_us, p.p999_us) = (q(0.5), q(0.99), q(0.999));
    Ok(())
}

/// Busy compute threads counting their work: the load beside the builder.
struct Burners {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    work: std::sync::Arc<std::sync::atomic::AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
    started: std::time::Instant,
}

impl Burners {
    fn start(n: u32) -> Burners {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let work = std::sync::Arc::new(AtomicU64::new(0));
        let threads = (0..n)
            .map(|k| {
                let (stop, work) = (stop.clone(), work.clone());
                std::thread::spawn(move || {
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ k as u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..(1 << 16) {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                        }
                        work.fetch_add(1, Ordering::Relaxed);
                    }
                    std::hint::black_box(x);
                })
            })
            .collect();
        Burners {
            stop,
            work,
            threads,
            started: std::time::Instant::now(),
        }
    }

    /// Stops them; their work per second.
    fn stop(self) -> f64 {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
        self.work.load(std::sync::atomic::Ordering::SeqCst) as f64
            / self.started.elapsed().as_secs_f64()
    }
}

/// Every second until `done`: `/metrics` of every node and the EVM's `/api/v1/status`.
/// Returns the number of successful scrapes of `/metrics`.
fn scrape(base: u16, nodes: u16, done: &std::sync::atomic::AtomicBool) -> u64 {
    use evb_control::client::Api;
    let apis: Vec<Api> = (0..nodes)
        .map(|k| Api::new(&format!("127.0.0.1:{}", base + k), None))
        .collect();
    let mut ok = 0;
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        let t = std::time::Instant::now();
        for a in &apis {
            if a.get("/metrics").is_ok_and(|r| r.ok()) {
                ok += 1;
            }
        }
        let _ = apis[0].get("/api/v1/status");
        let left = std::time::Duration::from_secs(1).saturating_sub(t.elapsed());
        let until = std::time::Instant::now() + left;
        while std::time::Instant::now() < until && !done.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The full-speed windows row builds the events' bytes by decision windows: a window of
    /// `fragment` bytes of frames per RU, decided faster than a host builds (so the EVM
    /// always waits for a credit), from a latency buffer deeper than the run (so no window
    /// decided late loses frames).
    #[test]
    fn full_speed_windows_hold_the_events_bytes_and_outlast_the_run() {
        let spec = BuildSpec {
            as_typed: false,
            fragment: 512 * 1024,
            seconds: 3.5,
            windows: WindowsRow::FullSpeed,
            ..default_run(1.0)
        };
        assert!(
            spec.variant().ends_with(" windows full speed"),
            "{}",
            spec.variant()
        );
        let cfg = evb_config::Config::from_toml(&spec.toml("t", FULL_SPEED_DECISIONS_HZ)).unwrap();
        assert_eq!(cfg.builder.by, evb_config::BuildBy::Window);
        let (f, w) = (&cfg.frames, &cfg.windows);
        let frames = (w.before_ticks + w.after_ticks) / f.ticks;
        assert_eq!(frames * f.size, spec.fragment);
        assert!(
            w.buffer_ms as f64 > spec.seconds * 1000.0,
            "{}",
            w.buffer_ms
        );
        assert!(
            w.delay_min_ticks > w.after_ticks as i64,
            "windows not yet arrived"
        );
        // 2 x 2: more bytes a second than any host's loopback moves
        assert!(FULL_SPEED_DECISIONS_HZ * 2.0 * spec.fragment as f64 > 20e9);
    }

    /// The folded shape's configuration is valid and puts RU i and BU i on host i, the
    /// EVM with host 0, with shm between the nodes of a host.
    #[test]
    fn folded_runs_pair_ru_i_and_bu_i_on_host_i() {
        let spec = BuildSpec {
            folded: true,
            ..default_run(1.0)
        };
        let spec = BuildSpec {
            as_typed: false,
            rus: 3,
            bus: 2,
            ..spec
        };
        assert!(spec.variant().ends_with(" folded"), "{}", spec.variant());
        let cfg = evb_config::Config::from_toml(&spec.toml("t", 0.0)).unwrap();
        assert_eq!(cfg.transport.local, Some(evb_config::TransportKind::Shm));
        assert_eq!(cfg.transport.kind, evb_config::TransportKind::Tcp);
        let host_of = |id: &str| {
            let n = cfg.nodes().into_iter().find(|n| n.id == id).unwrap();
            n.addr.rsplit_once(':').unwrap().0.to_string()
        };
        for (id, host) in [
            ("evm", "127.0.0.1"),
            ("ru0", "127.0.0.1"),
            ("bu0", "127.0.0.1"),
            ("ru1", "127.0.0.2"),
            ("bu1", "127.0.0.2"),
            ("ru2", "127.0.0.3"),
        ] {
            assert_eq!(host_of(id), host, "{id}");
        }
        assert_eq!(cfg.nodes().len(), 6);
        // not folded: the counts, one host, no local transport
        let plain = BuildSpec {
            folded: false,
            ..spec
        };
        let cfg = evb_config::Config::from_toml(&plain.toml("t", 0.0)).unwrap();
        assert_eq!(cfg.transport.local, None);
        assert_eq!(cfg.nodes().len(), 6);
    }
}

//! `evb bench`: the benchmark suite (p2p, lat, nxn, build) against references measured in
//! the same run (iperf3, memcpy, ZeroMQ). See docs/benchmarks.md.
//!
//! Every point runs `reps` times and is reported as the median of each figure. Senders and
//! receivers of evb and ZeroMQ are threads of this process; `build` runs a whole `evb run`
//! (one process per node) as a child. Results go to the terminal (a table), to
//! `OUT/bench.csv` and `OUT/bench.json` (every point, the ratios, the command) and to
//! `OUT/throughput.svg` (throughput against message size).

mod eb;
mod measure;
mod messenger;
mod output;
mod pipeline;
mod plan;
mod pubsubbench;
mod refs;
mod sinks;
mod zmqref;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

pub use evb_messaging::free_ports;
pub use measure::{median, thread_cpu, Point};
pub use output::Ratio;

use plan::plan;

/// Where `evb bench` writes without `--out`: `evb-out/bench` in the current folder (never a
/// build tree's `target/`, which a user's current folder may not have).
pub const DEFAULT_OUT: &str = "evb-out/bench";

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Which benchmark: p2p, lat, nxn, build, monitor (the cost of being watched), pubsub
    /// (1 publisher to 1, 2, 4 subscribers, evb beside ZeroMQ PUB/SUB), sinks (a row per
    /// sink beside the discard sink and a plain writer of the same files), or all.
    #[arg(default_value = "all")]
    pub which: String,
    /// A short smoke run (a few seconds): fewer sizes, one repetition, short points.
    #[arg(long)]
    pub quick: bool,
    /// The folder the CSV, JSON and SVG go to (made if missing; printed at the end).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_OUT)]
    pub out: PathBuf,
    /// Repetitions of every point, interleaved (the median is reported); default 5, 1 with
    /// --quick.
    #[arg(long)]
    pub reps: Option<u32>,
    /// Seconds per point for p2p, lat and nxn (default 0.5, 0.1 with --quick); a unit may
    /// be given (`200ms`).
    #[arg(long, value_parser = evb_config::duration::secs)]
    pub seconds: Option<f64>,
    /// Seconds per event-building run (default 3, 1 with --quick); a unit may be given
    /// (`1500ms`).
    #[arg(long, value_parser = evb_config::duration::secs)]
    pub build_seconds: Option<f64>,
    /// Message sizes for p2p and pubsub, comma-separated, K/M suffixes allowed
    /// (default p2p 64,256,1K,...,4M; pubsub 64,1K,16K,256K,1M; 64,1M with --quick).
    #[arg(long)]
    pub sizes: Option<String>,
    /// pubsub: the numbers of subscribers, comma-separated (default 1,2,4; 1,2 with --quick).
    #[arg(long)]
    pub fanout: Option<String>,
    /// Busy-poll time (microseconds) for the busy-poll latency points.
    #[arg(long, default_value_t = 200)]
    pub spin_us: u64,
    /// Leave out the ZeroMQ references.
    #[arg(long)]
    pub no_zmq: bool,
    /// Leave out the iperf3 reference.
    #[arg(long)]
    pub no_iperf3: bool,
    /// build: instead of its usual rows, the default run's shape beside N busy compute
    /// threads, unloaded and loaded at each `run.priority` (normal, high, realtime).
    #[arg(long, value_name = "N")]
    pub compute_load: Option<u32>,
    /// pipeline: the folder of the recorded CMS files (default: data/cms beside an
    /// ancestor of the current folder or of this program).
    #[arg(long, value_name = "DIR")]
    pub data: Option<std::path::PathBuf>,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (n, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1024),
        Some('M' | 'm') => (&s[..s.len() - 1], 1024 * 1024),
        _ => (s, 1),
    };
    let v: usize = n.parse().map_err(|_| format!("bad size {s:?}"))?;
    if v * mult < 16 {
        return Err(format!("size {s:?} is below 16 bytes"));
    }
    Ok(v * mult)
}

struct Settings {
    reps: u32,
    secs: Duration,
    build_secs: f64,
    sizes: Vec<usize>,
    /// pubsub's own sizes and subscriber counts, when given.
    pubsub_sizes: Option<Vec<usize>>,
    fanout: Option<Vec<usize>>,
    spin: Duration,
    zmq: bool,
    iperf3: bool,
    quick: bool,
    compute_load: Option<u32>,
    /// The recorded data of the pipeline rows (`None`: not found).
    data: Option<std::path::PathBuf>,
}

fn find(points: &[Point], f: impl Fn(&Point) -> bool) -> Option<&Point> {
    points.iter().find(|p| f(p))
}

fn ratios(points: &[Point]) -> Vec<Ratio> {
    let mut out = Vec::new();
    let mut push =
        |name: &str, evb: Option<f64>, reference: Option<f64>, target: f64, unit: &str| {
            if let (Some(e), Some(r)) = (evb, reference) {
                if e.is_nan() || r.is_nan() || r == 0.0 {
                    return;
                }
                let value = e / r;
                out.push(Ratio {
                    name: name.into(),
                    value,
                    target,
                    met: value >= target,
                    evb: e,
                    reference: r,
                    unit: unit.into(),
                });
            }
        };
    let p2p = |sys: &str, variant: &str, size: u64| {
        find(points, |p| {
            p.bench == "p2p"
                && p.system == sys
                && p.transport == "tcp"
                && p.size == size
                && (variant.is_empty() || p.variant == variant)
        })
    };
    let iperf = find(points, |p| p.system == "iperf3").map(|p| p.gb_per_s);
    let mib = 1 << 20;
    let evb_1m = p2p("evb", "fragment", mib).map(|p| p.gb_per_s);
    push(
        "p2p tcp 1 MiB: evb (send_fragment) / iperf3 -l 1M, GB/s",
        evb_1m,
        iperf,
        0.95,
        "GB/s",
    );
    push(
        "p2p tcp 1 MiB: evb / ZeroMQ PUSH-PULL, GB/s",
        evb_1m,
        p2p("zmq", "", mib).map(|p| p.gb_per_s),
        1.0,
        "GB/s",
    );
    push(
        "p2p tcp 64 B: evb (send_batched) / ZeroMQ, msgs/s",
        p2p("evb", "batched", 64).map(|p| p.msgs_per_s),
        p2p("zmq", "", 64).map(|p| p.msgs_per_s),
        2.0,
        "msgs/s",
    );
    let lat_on = |transport: &str, sys: &str, variant: &str, k: u32| {
        find(points, |p| {
            p.bench == "lat"
                && p.system == sys
                && p.transport == transport
                && p.in_flight == k
                && (variant.is_empty() || p.variant.starts_with(variant))
        })
        .map(|p| p.p50_us)
    };
    let lat = |sys: &str, variant: &str, k: u32| lat_on("tcp", sys, variant, k);
    // Latency: reference / evb, so that >= 1 means evb is no slower.
    for (variant, what) in [("blocking", "blocking"), ("busy-poll", "busy-poll")] {
        let (e, z) = (lat("evb", variant, 1), lat("zmq", "", 1));
        if let (Some(e), Some(z)) = (e, z) {
            push(
                &format!("lat 64 B k=1 p50: ZeroMQ / evb {what} (>=1: evb no slower)"),
                Some(z),
                Some(e),
                1.0,
                "us zmq vs evb",
            );
        }
    }
    // shared memory: a round trip of 64 B within 4 µs busy-polling (issue 15), and blocking
    // no slower than tcp
    push(
        "lat shm 64 B k=1 p50 busy-poll: 4 us / evb (>=1: within 4 us)",
        Some(4.0),
        lat_on("shm", "evb", "busy-poll", 1),
        1.0,
        "us target vs evb",
    );
    push(
        "lat 64 B k=1 p50 blocking: tcp / shm (>=1: shm no slower)",
        lat("evb", "blocking", 1),
        lat_on("shm", "evb", "blocking", 1),
        1.0,
        "us tcp vs shm",
    );
    // publish/subscribe (issue 13): fan-out of small messages against ZeroMQ, and each
    // subscriber of a large message stream against one p2p stream shared k ways
    let pubsub = |sys: &str, k: u32, size: u64| {
        find(points, |p| {
            p.bench == "pubsub" && p.system == sys && p.receivers == k && p.size == size
        })
        .map(|p| p.msgs_per_s)
    };
    push(
        "pubsub k=4 64 B: evb / ZeroMQ PUB-SUB, slowest subscriber msgs/s",
        pubsub("evb", 4, 64),
        pubsub("zmq", 4, 64),
        2.0,
        "msgs/s",
    );
    for k in [1u32, 2, 4] {
        push(
            &format!("pubsub k={k} 1 MiB: evb per subscriber / (p2p 1 MiB / {k}), msgs/s"),
            pubsub("evb", k, mib),
            p2p("evb", "fragment", mib).map(|p| p.msgs_per_s / k as f64),
            0.9,
            "msgs/s",
        );
    }
    for b in points
        .iter()
        .filter(|p| p.bench == "build" && p.variant.ends_with(" scraped"))
    {
        let quiet = b.variant.trim_end_matches(" scraped");
        let base = find(points, |p| p.bench == "build" && p.variant == quiet);
        push(
            "build 2x2 512 KiB scraped every second / not watched, GB/s (monitoring cost)",
            Some(b.gb_per_s),
            base.map(|p| p.gb_per_s),
            0.98,
            "GB/s",
        );
    }
    // the builder's share beside a compute load (issue 33): each loaded row against the
    // unloaded one; the target is for the protected rows
    let unloaded = find(points, |p| {
        p.bench == "build" && p.variant == "fixed unique verify=full"
    });
    for b in points
        .iter()
        .filter(|p| p.bench == "build" && p.variant.contains(" compute="))
    {
        let protected = b.variant.contains(" priority=");
        push(
            &format!(
                "build 2x2 512 KiB {} / unloaded, GB/s",
                b.variant.trim_start_matches("fixed unique verify=full ")
            ),
            Some(b.gb_per_s),
            unloaded.map(|p| p.gb_per_s),
            if protected { 0.9 } else { 0.0 },
            "GB/s",
        );
    }
    // small events against issue 15's absolute targets: 5 M events/s at 2 x 2, 256 B over
    // tcp, static content, headers checked (1.2x LSEB's 4.2 M here); 4 M/s with CRCs. The
    // same rows over shm are reported beside them and not judged (the targets are tcp's).
    // LSEB's shape (folded: RU i and BU i on one host, tcp between hosts) is judged too: the
    // 5 M target is 1.2x LSEB, which builds in that shape.
    for (verify, target) in [("headers", 5e6), ("crc", 4e6)] {
        for (transport, folded, over, judged) in [
            ("tcp", "", "", 1.0),
            ("tcp", " folded", " folded (LSEB's shape)", 1.0),
            ("shm", "", " over shm", 0.0),
        ] {
            let small = find(points, |p| {
                p.bench == "build"
                    && p.transport == transport
                    && p.size == 256
                    && p.senders == 2
                    && p.receivers == 2
                    && p.variant == format!("fixed static verify={verify}{folded}")
            });
            let no_target = if judged == 0.0 {
                " (no target: tcp's)"
            } else {
                ""
            };
            push(
                &format!(
                    "build 2x2 256 B static verify={verify}{over}: events/s / {} M{no_target}",
                    target / 1e6
                ),
                small.map(|p| p.msgs_per_s),
                Some(target),
                judged,
                "events/s",
            );
        }
    }
    // the real pipeline (issue 33): front-end streams into the RUs and out of a sink, against
    // the 2 x 2 mesh moving messages of the recorded fragments' mean size in the same run.
    // The target (0.8) is the stream -> RU path's, with the events discarded.
    for b in points.iter().filter(|p| p.bench == "pipeline") {
        let nxn = find(points, |p| {
            p.bench == "nxn"
                && p.system == "evb"
                && p.size == b.size
                && p.senders == 2
                && p.variant != messenger::TWO_MESHES
        });
        let judged = b.variant.starts_with("feed->discard") && !b.variant.ends_with("default");
        push(
            &format!(
                "pipeline {} / nxn 2x2 {} B, GB/s{}",
                b.variant,
                b.size,
                if judged { "" } else { " (no target)" }
            ),
            Some(b.gb_per_s),
            nxn.map(|p| p.gb_per_s),
            if judged { 0.8 } else { 0.0 },
            "GB/s",
        );
        // and against the most that two hops (front-end -> RU -> BU) could move here
        let twice = find(points, |p| {
            p.bench == "nxn" && p.size == b.size && p.variant == messenger::TWO_MESHES
        });
        push(
            &format!(
                "pipeline {} / two nxn 2x2 {} B meshes at once (the two-hop ceiling), GB/s (no target)",
                b.variant, b.size
            ),
            Some(b.gb_per_s),
            twice.map(|p| p.gb_per_s),
            0.0,
            "GB/s",
        );
    }
    // each sink against the build limit (discard) and its write limit (a plain writer of the
    // same files), and HDF5 against the file sink (issue 67)
    let sink = |variant: &str| {
        find(points, |p| {
            p.bench == "sink" && p.system == "evb" && p.variant == variant
        })
        .map(|p| p.gb_per_s)
    };
    for p in points
        .iter()
        .filter(|p| p.bench == "sink" && p.system == "evb" && p.variant != "discard")
    {
        let (of_discard, of_write, of_file) = sinks::targets(&p.variant);
        push(
            &format!("sink {} / discard (the build limit), GB/s", p.variant),
            Some(p.gb_per_s),
            sink("discard"),
            of_discard,
            "GB/s",
        );
        let write_limit = find(points, |q| {
            q.bench == "sink"
                && q.system == "plain"
                && q.variant == format!("write limit for {}", p.variant)
        });
        push(
            &format!(
                "sink {} / plain writer of its files (the write limit), GB/s",
                p.variant
            ),
            Some(p.gb_per_s),
            write_limit.map(|q| q.gb_per_s),
            of_write,
            "GB/s",
        );
        // here building and writing share the cores, each reference taking them all: a
        // sink that did both at the references' costs, one after the other, would reach
        // 1 / (1/discard + 1/write limit) (where the write limit is over 1.25 times the
        // build limit, 0.8 of it is beyond any sink that also builds)
        if let (Some(d), Some(w)) = (sink("discard"), write_limit.map(|q| q.gb_per_s)) {
            push(
                &format!(
                    "sink {} / building then writing on the same cores (1 / (1/discard + 1/write limit)), GB/s (no target)",
                    p.variant
                ),
                Some(p.gb_per_s),
                Some(1.0 / (1.0 / d + 1.0 / w)),
                0.0,
                "GB/s",
            );
        }
        if p.variant == "file-zstd" {
            // zstd's cost: the BUs' CPU per GB built beside the plain file sink's
            push(
                "sink file-zstd / file, the BUs' CPU s per GB (zstd's cost, no target)",
                Some(p.recv_cpu_s_per_gb),
                find(points, |q| {
                    q.bench == "sink" && q.system == "evb" && q.variant == "file"
                })
                .map(|q| q.recv_cpu_s_per_gb),
                0.0,
                "BU CPU s/GB",
            );
        }
        if p.variant.starts_with("hdf5") {
            push(
                &format!("sink {} / file, 1 MiB events, events/s", p.variant),
                Some(p.msgs_per_s),
                find(points, |q| {
                    q.bench == "sink" && q.system == "evb" && q.variant == "file"
                })
                .map(|q| q.msgs_per_s),
                of_file,
                "events/s",
            );
        }
    }
    // the default run as typed, against raw transfer in the same run (issue 15: no target)
    let default_run = find(points, |p| {
        p.bench == "build" && p.variant == eb::DEFAULT_RUN
    });
    push(
        "default run (evb run as typed) / nxn 2x2 512 KiB, GB/s",
        default_run.map(|p| p.gb_per_s),
        find(points, |p| {
            p.bench == "nxn"
                && p.system == "evb"
                && p.size == 512 * 1024
                && p.senders == 2
                && !p.variant.ends_with("pinned")
        })
        .map(|p| p.gb_per_s),
        0.0,
        "GB/s",
    );
    push(
        "default run (evb run as typed) / iperf3 -l 1M, GB/s",
        default_run.map(|p| p.gb_per_s),
        iperf,
        0.0,
        "GB/s",
    );
    for b in points.iter().filter(|p| {
        p.bench == "build"
            && p.transport == "tcp"
            && p.variant.starts_with("fixed")
            && !p.variant.ends_with(" scraped")
            && !p.variant.ends_with(" scaling")
            && !p.variant.contains(" load=")
            // half of a folded run's bytes never cross tcp: nxn is no reference for it
            && !p.variant.ends_with(" folded")
            // decision windows at a fixed rate: a latency row
            && !p.variant.contains(" windows 10 kHz")
    }) {
        let pinned = b.variant.ends_with("pinned");
        let nxn = find(points, |p| {
            p.bench == "nxn"
                && p.system == "evb"
                && p.size == b.size
                && p.senders == b.senders
                && p.receivers == b.receivers
                && p.variant.ends_with("pinned") == pinned
        });
        push(
            &format!(
                "build {}x{} {} ({}) / nxn same bytes, GB/s",
                b.senders,
                b.receivers,
                output::human_size(b.size as f64),
                b.variant
            ),
            Some(b.gb_per_s),
            nxn.map(|p| p.gb_per_s),
            0.9,
            "GB/s",
        );
    }
    out
}

fn settings(args: &BenchArgs) -> Result<Settings, String> {
    let sizes = match &args.sizes {
        Some(list) => list
            .split(',')
            .map(parse_size)
            .collect::<Result<Vec<_>, _>>()?,
        None if args.quick => vec![64, 1 << 20],
        None => (0..9).map(|i| 64usize << (2 * i)).collect(),
    };
    Ok(Settings {
        reps: args.reps.unwrap_or(if args.quick { 1 } else { 5 }).max(1),
        secs: Duration::from_secs_f64(args.seconds.unwrap_or(if args.quick { 0.1 } else { 0.5 })),
        build_secs: args
            .build_seconds
            .unwrap_or(if args.quick { 1.0 } else { 3.0 }),
        pubsub_sizes: args.sizes.is_some().then(|| sizes.clone()),
        fanout: match &args.fanout {
            Some(list) => Some(
                list.split(',')
                    .map(|k| match k.trim().parse::<usize>() {
                        Ok(k) if (1..=64).contains(&k) => Ok(k),
                        _ => Err(format!("--fanout: {k:?} is not a count of 1 to 64")),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            None => None,
        },
        sizes,
        spin: Duration::from_micros(args.spin_us),
        zmq: !args.no_zmq,
        iperf3: !args.no_iperf3,
        quick: args.quick,
        compute_load: match args.compute_load {
            Some(n) if !(1..=256).contains(&n) => {
                return Err(format!("--compute-load: {n} is not a count of 1 to 256"))
            }
            n => n,
        },
        data: args.data.clone().or_else(pipeline::find_data),
    })
}

/// Runs the selected benchmarks.
pub fn run(args: &BenchArgs) -> Result<(), String> {
    let s = settings(args)?;
    let mut notes = Vec::new();
    let tasks = plan(&args.which, &s, &mut notes)?;
    let out_dir = args.out.clone();
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;

    let total: u64 = tasks.iter().map(|t| t.reps as u64).sum();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    let started = Instant::now();
    // Repetitions are interleaved: every point's first run, then every point's second, ...
    // so that each system samples the same spread of machine states (another process
    // waking up, the scheduler placing both ends on one core) and ratios stay fair.
    let mut reps: Vec<Vec<Point>> = tasks.iter().map(|_| Vec::new()).collect();
    let mut failures = Vec::new();
    let max_reps = tasks.iter().map(|t| t.reps).max().unwrap_or(0);
    for round in 0..max_reps {
        for (t, got) in tasks.iter().zip(reps.iter_mut()) {
            if round >= t.reps {
                continue;
            }
            bar.set_message(format!("{} (run {} of {})", t.label, round + 1, t.reps));
            match (t.job)() {
                Ok(p) => got.push(p),
                Err(e) => {
                    failures.push(format!("{}: {e}", t.label));
                    bar.println(format!("evb bench: {}: {e}", t.label));
                }
            }
            bar.inc(1);
        }
    }
    let points: Vec<Point> = reps
        .iter()
        .filter(|r| !r.is_empty())
        .map(|r| Point::median_of(r))
        .collect();
    bar.finish_and_clear();
    let ratios = ratios(&points);
    print!("{}", output::table(&points, &ratios));
    for n in notes.iter().chain(&failures) {
        println!("note: {n}");
    }

    let command: Vec<String> = std::env::args().collect();
    let doc = json!({
        "command": command.join(" "),
        "which": args.which,
        "quick": args.quick,
        "reps": s.reps,
        "seconds_per_point": s.secs.as_secs_f64(),
        "elapsed_s": started.elapsed().as_secs_f64(),
        "machine": machine(),
        "points": points,
        "ratios": ratios,
        "notes": notes,
        "failures": failures,
    });
    let write = |name: &str, text: String| {
        let p = out_dir.join(name);
        std::fs::write(&p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))
    };
    write(
        "bench.json",
        serde_json::to_string_pretty(&doc).unwrap_or_default(),
    )?;
    write("bench.csv", output::csv(&points))?;
    let svg = out_dir.join("throughput.svg");
    output::plot(
        &points,
        &svg,
        &format!(
            "evb bench p2p: throughput vs message size ({} cores, loopback)",
            num_cpus()
        ),
    )?;
    let scaling_svg = out_dir.join("scaling.svg");
    output::plot_scaling(
        &points,
        &scaling_svg,
        &format!(
            "evb bench build: N x N on one host ({} cores, loopback)",
            num_cpus()
        ),
    )?;
    println!(
        "wrote {}, {} and {}{} ({:.1} s)",
        out_dir.join("bench.csv").display(),
        out_dir.join("bench.json").display(),
        svg.display(),
        if scaling_svg.exists() {
            format!(" and {}", scaling_svg.display())
        } else {
            String::new()
        },
        started.elapsed().as_secs_f64()
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("{} point(s) failed", failures.len()))
    }
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn machine() -> serde_json::Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    json!({ "cpus": num_cpus(), "cpu": cpu, "kernel": kernel })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("64").unwrap(), 64);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert!(parse_size("x").is_err());
        assert!(parse_size("8").is_err());
    }

    /// An nxn row at 2 x 2, 256 B.
    fn nxn_256() -> Point {
        let mut p = Point::new("nxn", "evb", "tcp", "fragment", 256);
        (p.senders, p.receivers, p.gb_per_s) = (2, 2, 2.0);
        p
    }

    #[test]
    fn small_event_rows_are_judged_against_the_absolute_targets() {
        let point = |verify: &str, events: f64| {
            let mut p = Point::new(
                "build",
                "evb",
                "tcp",
                &format!("fixed static verify={verify}"),
                256,
            );
            (p.senders, p.receivers, p.msgs_per_s) = (2, 2, events);
            p
        };
        let r = ratios(&[point("headers", 5.5e6), point("crc", 2.0e6)]);
        let find = |name: &str| r.iter().find(|r| r.name.contains(name)).unwrap();
        let h = find("verify=headers: events/s / 5 M");
        assert!(h.met && (h.value - 1.1).abs() < 1e-9, "{h:?}");
        let c = find("verify=crc: events/s / 4 M");
        assert!(!c.met && (c.value - 0.5).abs() < 1e-9, "{c:?}");
        // a row of another size or shape is not taken for it
        let mut other = point("headers", 9e6);
        other.size = 4096;
        assert!(ratios(&[other]).is_empty());
        // a row over shm is reported on its own line, never judged, never taken for tcp's
        let mut shm = point("headers", 4.5e6);
        shm.transport = "shm".into();
        let r = ratios(&[shm]);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].name.contains("over shm") && r[0].target == 0.0,
            "{r:?}"
        );
        assert!((r[0].value - 0.9).abs() < 1e-9, "{r:?}");
        // a folded row (LSEB's shape) is judged on its own line, never taken for tcp's
        let mut folded = point("crc", 4.4e6);
        folded.variant.push_str(" folded");
        let r = ratios(&[folded, nxn_256()]);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].name.contains("verify=crc folded (LSEB's shape)") && r[0].met,
            "{r:?}"
        );
        assert!((r[0].value - 1.1).abs() < 1e-9, "{r:?}");
    }

    /// Building by time is judged against nxn of the same bytes: time slices and decision
    /// windows built as fast as they can be; decision windows at a set rate (a latency row)
    /// are not.
    #[test]
    fn slices_and_full_speed_windows_are_judged_against_nxn_the_latency_row_is_not() {
        let row = |variant: &str, gb: f64| {
            let mut p = Point::new("build", "evb", "tcp", variant, 256);
            (p.senders, p.receivers, p.gb_per_s) = (2, 2, gb);
            p
        };
        let r = ratios(&[
            nxn_256(),
            row("fixed static verify=headers time slices", 1.9),
            row("fixed static verify=headers windows full speed", 1.7),
            row("fixed static verify=headers windows 10 kHz", 0.2),
        ]);
        let judged: Vec<_> = r
            .iter()
            .filter(|r| r.name.contains("/ nxn same bytes"))
            .collect();
        assert_eq!(judged.len(), 2, "{r:?}");
        assert!(
            judged[0].name.contains("time slices") && judged[0].met,
            "{r:?}"
        );
        assert!(
            judged[1].name.contains("windows full speed") && !judged[1].met,
            "{r:?}"
        );
        assert!((judged[1].value - 0.85).abs() < 1e-9, "{r:?}");
        assert!(!r.iter().any(|r| r.name.contains("10 kHz")), "{r:?}");
    }

    /// The pipeline's rows are judged against one mesh of their fragment size, never against
    /// the two meshes at once, which give the second, unjudged ratio (the two-hop ceiling).
    #[test]
    fn pipeline_rows_get_the_mesh_and_the_two_hop_ceiling() {
        let mesh = |variant: &str, gb: f64| {
            let mut p = Point::new("nxn", "evb", "tcp", variant, 461);
            (p.senders, p.receivers, p.gb_per_s) = (2, 2, gb);
            p
        };
        let mut row = Point::new(
            "pipeline",
            "evb",
            "tcp",
            "feed->discard max_fragment=32K",
            461,
        );
        row.gb_per_s = 0.4;
        // the ceiling first, so that a search that let it pass would find it first
        let r = ratios(&[mesh(messenger::TWO_MESHES, 0.8), mesh("fragment", 1.6), row]);
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(
            r[0].name.contains("/ nxn 2x2 461 B") && r[0].target == 0.8,
            "{r:?}"
        );
        assert!((r[0].value - 0.25).abs() < 1e-9 && !r[0].met, "{r:?}");
        assert!(
            r[1].name.contains("two-hop ceiling") && r[1].target == 0.0,
            "{r:?}"
        );
        assert!((r[1].value - 0.5).abs() < 1e-9, "{r:?}");
    }

    /// Each sink's row gets its two references (discard, its own plain writer), the two
    /// combined as on shared cores, and the targets of issue 67: the file sink 0.6 of
    /// discard and 0.8 of its write limit, HDF5 0.9 of the file sink's events/s; the other
    /// rows no target.
    #[test]
    fn sink_rows_are_judged_against_both_references() {
        let row = |system: &str, variant: &str, gb: f64| {
            let mut p = Point::new("sink", system, "tcp", variant, 1 << 20);
            (p.gb_per_s, p.msgs_per_s) = (gb, gb * 1000.0);
            p
        };
        let r = ratios(&[
            row("evb", "discard", 3.0),
            row("evb", "file", 1.5),
            row("plain", "write limit for file", 1.6),
            row("evb", "file-zstd", 1.0),
            row("plain", "write limit for file-zstd", 2.0),
            row("evb", "hdf5-packed", 1.41),
        ]);
        let find = |name: &str| {
            r.iter()
                .find(|r| r.name.starts_with(name))
                .unwrap_or_else(|| panic!("no {name} in {r:?}"))
        };
        let f = find("sink file / discard");
        assert!(
            f.target == 0.6 && !f.met && (f.value - 0.5).abs() < 1e-9,
            "{f:?}"
        );
        let f = find("sink file / plain writer");
        assert!(
            f.target == 0.8 && f.met && (f.value - 0.9375).abs() < 1e-9,
            "{f:?}"
        );
        // building (3.0) then writing (1.6) on the same cores: 1 / (1/3 + 1/1.6) = 1.0435
        let f = find("sink file / building then writing");
        assert!(
            f.target == 0.0 && (f.value - 1.5 / (1.0 / (1.0 / 3.0 + 1.0 / 1.6))).abs() < 1e-9,
            "{f:?}"
        );
        let z = find("sink file-zstd / plain writer");
        assert!(z.target == 0.0 && (z.value - 0.5).abs() < 1e-9, "{z:?}");
        let h = find("sink hdf5-packed / file");
        assert!(
            h.target == 0.9 && h.met && (h.value - 0.94).abs() < 1e-9,
            "{h:?}"
        );
        // no write limit was measured for HDF5: no such ratio, and none of discard against itself
        assert!(!r
            .iter()
            .any(|r| r.name.starts_with("sink hdf5-packed / plain")));
        assert!(!r.iter().any(|r| r.name.starts_with("sink discard")));
    }

    #[test]
    fn unknown_benchmark_is_refused() {
        let args = BenchArgs {
            which: "nope".into(),
            quick: true,
            out: DEFAULT_OUT.into(),
            reps: None,
            seconds: None,
            build_seconds: None,
            compute_load: None,
            data: None,
            sizes: None,
            fanout: None,
            spin_us: 0,
            no_zmq: true,
            no_iperf3: true,
        };
        assert!(run(&args).is_err());
    }

    /// `--seconds` and `--build-seconds` take units, as every other duration does.
    #[test]
    fn bench_durations_take_units() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            a: BenchArgs,
        }
        let c =
            Cli::try_parse_from(["bench", "--seconds", "200ms", "--build-seconds", "2"]).unwrap();
        assert_eq!((c.a.seconds, c.a.build_seconds), (Some(0.2), Some(2.0)));
        assert!(Cli::try_parse_from(["bench", "--seconds", "2 parsecs"]).is_err());
    }
}

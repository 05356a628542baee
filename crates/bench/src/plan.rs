//! Which points a run measures: the tasks of each benchmark group, in the order they run,
//! each label once.

use std::time::Duration;

use crate::eb::{self, BuildSpec, WindowsRow};
use crate::messenger::{self, Kind, MeshSpec, Path as SendPath};
use crate::pipeline::{self as pipe, PipeSpec, Sink};
use crate::{output, pubsubbench, refs, zmqref, Point, Settings};

pub(crate) type Job = Box<dyn Fn() -> Result<Point, String>>;

pub(crate) struct Task {
    pub(crate) label: String,
    pub(crate) reps: u32,
    pub(crate) job: Job,
}

const LAT_SIZE: usize = 64;
/// The default `evb run`: 2 RUs x 2 BUs, 512 KiB fragments (1 MiB events).
const BUILD_FRAGMENT: usize = 512 * 1024;

/// The tasks of benchmark `which` (a group, or "all"); why a series is skipped goes to
/// `notes`.
pub(crate) fn plan(
    which: &str,
    s: &Settings,
    notes: &mut Vec<String>,
) -> Result<Vec<Task>, String> {
    let groups: Vec<&str> = match which {
        "all" => vec![
            "p2p", "lat", "nxn", "build", "monitor", "pubsub", "pipeline", "sinks",
        ],
        "p2p" | "lat" | "nxn" | "build" | "monitor" | "pubsub" | "pipeline" | "sinks" => {
            vec![which]
        }
        other => {
            return Err(format!(
                "unknown benchmark {other:?}: p2p, lat, nxn, build, monitor, pubsub, pipeline, \
                 sinks or all"
            ))
        }
    };
    let mut p = Planner {
        s,
        notes,
        tasks: Vec::new(),
    };
    for g in groups {
        match g {
            "p2p" => p.p2p(),
            "lat" => p.lat(),
            "nxn" => p.nxn(false),
            "build" => match s.compute_load {
                Some(n) => p.compute_load(n),
                None => p.nxn(true),
            },
            "monitor" => p.monitor(),
            "pubsub" => p.pubsub(),
            "pipeline" => p.pipeline(),
            "sinks" => p.sinks(),
            _ => unreachable!(),
        }
    }
    Ok(p.tasks)
}

/// The tasks so far, and the settings they follow.
struct Planner<'a> {
    s: &'a Settings,
    notes: &'a mut Vec<String>,
    tasks: Vec<Task>,
}

/// The host's load average over the last minute (NaN where unknown).
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The default run's shape (2 x 2, tcp, static content), `fragment` bytes a fragment,
/// checked as `verify`.
fn base_spec(fragment: usize, verify: &'static str, seconds: f64) -> BuildSpec {
    BuildSpec {
        rus: 2,
        bus: 2,
        fragment: fragment as u64,
        lognormal: false,
        verify,
        content: "static",
        pin: None,
        seconds,
        scraped: false,
        scaling: false,
        load: None,
        as_typed: false,
        transport: "tcp",
        folded: false,
        compute_load: 0,
        priority: "normal",
        slices: false,
        windows: WindowsRow::No,
    }
}

impl Planner<'_> {
    /// A row per sink with its two references (issue 67): the discard sink (the build
    /// limit) first in each round, then each sink, each that writes files followed by the
    /// plain writer of the same files (the write limit). HDF5 where evb has it.
    fn sinks(&mut self) {
        use crate::sinks::{self as sk, SinkKind};
        let secs = self.s.build_secs;
        let dir = sk::scratch(&std::env::temp_dir());
        for sink in SinkKind::ALL {
            if sink == SinkKind::Hdf5Packed && !cfg!(feature = "hdf5") {
                self.notes.push(
                    "sinks: no hdf5-packed row: this evb was built without the hdf5 feature".into(),
                );
                continue;
            }
            let written: sk::Written = Default::default();
            let (d, w) = (dir.clone(), written.clone());
            self.add(
                format!("sink {}", sink.name()),
                Box::new(move || sk::sink_run(sink, secs, &d, &w)),
            );
            if sink.writes() {
                let d = dir.clone();
                self.add(
                    format!("sink {} write limit", sink.name()),
                    Box::new(move || sk::plain_writer(sink, &d, &written)),
                );
            }
        }
        self.notes.push(format!(
            "sinks: files written in {} (removed after each run); host load before: {:.2}",
            dir.display(),
            load_average()
        ));
    }

    /// Adds a task, unless one of that label is planned already.
    fn add(&mut self, label: String, job: Job) {
        if !self.tasks.iter().any(|t| t.label == label) {
            let reps = self.s.reps;
            self.tasks.push(Task { label, reps, job });
        }
    }

    /// `n` senders to `n` receivers over `kind`, `size` bytes a message.
    fn mesh_spec(&self, kind: Kind, path: SendPath, n: usize, size: usize, pin: bool) -> MeshSpec {
        MeshSpec {
            kind,
            path,
            senders: n,
            receivers: n,
            size,
            duration: self.s.secs,
            pin,
        }
    }

    fn mesh_pinned(&self, kind: Kind, path: SendPath, n: usize, size: usize, pin: bool) -> Job {
        let spec = self.mesh_spec(kind, path, n, size, pin);
        Box::new(move || messenger::mesh(&spec))
    }

    fn mesh(&self, kind: Kind, path: SendPath, n: usize, size: usize) -> Job {
        self.mesh_pinned(kind, path, n, size, false)
    }

    /// The iperf3 reference moving `bytes`, when asked for and installable.
    fn iperf3(&mut self, bytes: u64) {
        match refs::ensure_iperf3() {
            Ok(()) => self.add("iperf3 -l 1M".into(), Box::new(move || refs::iperf3(bytes))),
            Err(e) => self.notes.push(format!("iperf3 reference skipped: {e}")),
        }
    }

    /// Point to point: memcpy and iperf3 references, then each size over every transport
    /// (and ZeroMQ).
    fn p2p(&mut self) {
        let s = self.s;
        let secs = s.secs;
        let mem = if s.quick { 0.03 } else { 0.2 };
        self.add(
            "memcpy 1M".into(),
            Box::new(move || Ok(refs::memcpy(1 << 20, Duration::from_secs_f64(mem)))),
        );
        self.add(
            "memcpy 64M".into(),
            Box::new(move || Ok(refs::memcpy(64 << 20, Duration::from_secs_f64(mem * 2.0)))),
        );
        if s.iperf3 {
            self.iperf3(if s.quick { 1 << 29 } else { 4 << 30 });
        }
        let ofi_ok = match evb_transport::ofi::probe("tcp") {
            Ok(_) => true,
            Err(e) => {
                self.notes.push(format!("ofi series skipped: {e}"));
                false
            }
        };
        for &size in &s.sizes {
            let h = output::human_size(size as f64);
            let job = self.mesh(Kind::Tcp, SendPath::Fragment, 1, size);
            self.add(format!("p2p evb tcp fragment {h}"), job);
            if size <= 16 * 1024 {
                let job = self.mesh(Kind::Tcp, SendPath::Batched, 1, size);
                self.add(format!("p2p evb tcp batched {h}"), job);
            }
            if ofi_ok {
                let job = self.mesh(Kind::Ofi, SendPath::Fragment, 1, size);
                self.add(format!("p2p evb ofi-tcp fragment {h}"), job);
            }
            if !s.quick || size == LAT_SIZE {
                let job = self.mesh(Kind::Shm, SendPath::Fragment, 1, size);
                self.add(format!("p2p evb shm fragment {h}"), job);
            }
            if s.zmq {
                self.add(
                    format!("p2p zmq tcp {h}"),
                    Box::new(move || zmqref::p2p(size, secs)),
                );
            }
            if !s.quick || size == LAT_SIZE {
                let job = self.mesh(Kind::Inproc, SendPath::Fragment, 1, size);
                self.add(format!("p2p evb inproc fragment {h}"), job);
            }
        }
    }

    /// Round-trip latency: tcp blocking and busy-polling with `k` in flight (and ZeroMQ),
    /// then the other transports at k = 1.
    fn lat(&mut self) {
        let s = self.s;
        let (secs, spin) = (s.secs, s.spin);
        let ks: &[usize] = if s.quick { &[1] } else { &[1, 8] };
        for &k in ks {
            self.add(
                format!("lat evb tcp blocking k={k}"),
                Box::new(move || messenger::latency(Kind::Tcp, LAT_SIZE, k, Duration::ZERO, secs)),
            );
            self.add(
                format!("lat evb tcp busy-poll k={k}"),
                Box::new(move || messenger::latency(Kind::Tcp, LAT_SIZE, k, spin, secs)),
            );
            if s.zmq {
                self.add(
                    format!("lat zmq tcp k={k}"),
                    Box::new(move || zmqref::latency(LAT_SIZE, k, secs)),
                );
            }
        }
        // shared memory (and libfabric's tcp provider where it works): k = 1 only
        let mut kinds = vec![Kind::Shm];
        match evb_transport::ofi::probe("tcp") {
            Ok(_) => kinds.push(Kind::Ofi),
            Err(e) => self.notes.push(format!("ofi latency series skipped: {e}")),
        }
        for kind in kinds {
            let name = if kind == Kind::Ofi {
                "ofi-tcp"
            } else {
                kind.name()
            };
            self.add(
                format!("lat evb {name} blocking k=1"),
                Box::new(move || messenger::latency(kind, LAT_SIZE, 1, Duration::ZERO, secs)),
            );
            self.add(
                format!("lat evb {name} busy-poll k=1"),
                Box::new(move || messenger::latency(kind, LAT_SIZE, 1, spin, secs)),
            );
        }
        if !s.quick {
            self.add(
                "lat evb inproc blocking k=1".into(),
                Box::new(move || {
                    messenger::latency(Kind::Inproc, LAT_SIZE, 1, Duration::ZERO, secs)
                }),
            );
        }
    }

    /// The real pipeline: recorded fragments streamed by `evb feed` into stream-fed RUs,
    /// events discarded, written to files, or served to `evb consume`; and the 2 x 2 mesh of
    /// the fragments' mean size as its reference. The rows but one run at `source.max_fragment`
    /// = the files' largest fragment rounded up to a power of two (what an operator who knows
    /// the front-ends sets); the one at the default (1 MiB) shows what the default credits cost,
    /// and a second file row with files of 2048 events what the default's small files cost.
    fn pipeline(&mut self) {
        let Some(dir) = self.s.data.clone() else {
            self.notes
                .push("pipeline skipped: no recorded data found (data/cms; --data DIR)".into());
            return;
        };
        let data = match pipe::recorded(&dir) {
            Ok(d) => d,
            Err(e) => return self.notes.push(format!("pipeline skipped: {e}")),
        };
        let job = self.mesh(Kind::Tcp, SendPath::Fragment, 2, data.mean as usize);
        self.add(
            format!("nxn evb tcp 2x2 {}", output::human_size(data.mean as f64)),
            job,
        );
        // the ceiling of a path that moves every byte twice on these cores
        let spec = self.mesh_spec(Kind::Tcp, SendPath::Fragment, 2, data.mean as usize, false);
        self.add(
            format!(
                "nxn evb tcp 2x2 {} x 2 at once",
                output::human_size(data.mean as f64)
            ),
            Box::new(move || messenger::two_meshes(&spec)),
        );
        let bound = data.max.next_power_of_two().max(4096);
        let mut specs = vec![PipeSpec {
            data: data.clone(),
            sink: Sink::Discard,
            // about build_secs at this machine's rate (2 x 2, ~460 B: ~0.3 M events/s)
            fragments: (self.s.build_secs * 300_000.0) as u64,
            max_fragment: Some(bound),
            commit_events: None,
        }];
        if !self.s.quick {
            for sink in [Sink::File, Sink::Serve] {
                specs.push(PipeSpec {
                    sink,
                    ..specs[0].clone()
                });
            }
            // files of 2048 events instead of the credits' 255: what the default's small
            // files (a sync, a commit and two new inodes each) cost
            specs.push(PipeSpec {
                sink: Sink::File,
                commit_events: Some(2048),
                ..specs[0].clone()
            });
            specs.push(PipeSpec {
                max_fragment: None,
                ..specs[0].clone()
            });
            // the output formats against the plain file row of the same files (2048 events
            // each): zstd per event, and HDF5 (a group and datasets per event: slower, so
            // fewer events). An evb without HDF5 reports that row as failed.
            for (sink, share) in [(Sink::FileZstd, 1), (Sink::Hdf5, 10)] {
                specs.push(PipeSpec {
                    sink,
                    commit_events: Some(2048),
                    fragments: specs[0].fragments / share,
                    ..specs[0].clone()
                });
            }
        }
        for spec in specs {
            let scratch = std::env::temp_dir();
            self.add(
                format!("pipeline evb tcp 2x2 {}", spec.variant()),
                Box::new(move || pipe::pipeline(&spec, &scratch)),
            );
        }
    }

    /// 2 x 2 meshes of each fragment size; with `build`, the whole builder's runs of those
    /// sizes too.
    fn nxn(&mut self, build: bool) {
        let mut frags = vec![BUILD_FRAGMENT];
        if !self.s.quick {
            frags.push(256);
        }
        for f in frags {
            let h = output::human_size(f as f64);
            let job = self.mesh(Kind::Tcp, SendPath::Fragment, 2, f);
            self.add(format!("nxn evb tcp 2x2 {h}"), job);
            if build {
                self.build(f, &h);
            }
        }
    }

    /// The builder's runs with `f`-byte fragments (`h`, its size in words): the variants of
    /// the default shape, then the N x M scaling series.
    fn build(&mut self, f: usize, h: &str) {
        let specs = self.build_specs(f, h);
        let scaling = self.scaling_specs(f, &specs);
        for spec in specs {
            let scratch = std::env::temp_dir();
            self.add(
                format!("build evb {} 2x2 {h} {}", spec.transport, spec.variant()),
                Box::new(move || eb::build(&spec, &scratch)),
            );
        }
        for (n, m, spec) in scaling {
            let scratch = std::env::temp_dir();
            self.add(
                format!("build evb tcp {n}x{m} {h} {}", spec.variant()),
                Box::new(move || eb::build(&spec, &scratch)),
            );
        }
    }

    /// The 2 x 2 runs with `f`-byte fragments. Along the way it adds the pinned nxn mesh and
    /// the iperf3 reference, which run before these.
    fn build_specs(&mut self, f: usize, h: &str) -> Vec<BuildSpec> {
        let s = self.s;
        let mut specs = vec![base_spec(f, "headers", s.build_secs)];
        if !s.quick {
            // The same with the RUs writing every byte (as the default run).
            specs.push(BuildSpec {
                content: "unique",
                ..specs[0].clone()
            });
        }
        if !s.quick && f == 256 {
            // small events with every payload's CRC checked (issue 15: 4 M/s)
            specs.push(BuildSpec {
                verify: "crc",
                ..specs[0].clone()
            });
            // and both over shared memory: the builder without the kernel's
            // loopback copies (their own rows; the targets are for tcp)
            for verify in ["headers", "crc"] {
                specs.push(BuildSpec {
                    verify,
                    transport: "shm",
                    ..specs[0].clone()
                });
            }
            // and in LSEB's shape: RU i and BU i on one host, talking over
            // shm, tcp between the hosts (the comparison with LSEB)
            for verify in ["headers", "crc"] {
                specs.push(BuildSpec {
                    verify,
                    folded: true,
                    ..specs[0].clone()
                });
            }
        }
        // Both again with senders on one CPU and receivers on another, which
        // takes this VM's loopback mode out of the comparison.
        if let (false, true, Some(cpus)) = (s.quick, f == BUILD_FRAGMENT, messenger::pin_cpus()) {
            let job = self.mesh_pinned(Kind::Tcp, SendPath::Fragment, 2, f, true);
            self.add(format!("nxn evb tcp 2x2 {h} pinned"), job);
            specs.push(BuildSpec {
                pin: Some(cpus),
                ..specs[0].clone()
            });
        }
        // Building by time: time slices of generated frames moving the same bytes as the
        // events, against the same nxn
        if f == BUILD_FRAGMENT {
            specs.push(BuildSpec {
                slices: true,
                ..specs[0].clone()
            });
            // decision windows as fast as they can be built, the same bytes as the events
            specs.push(BuildSpec {
                windows: WindowsRow::FullSpeed,
                ..specs[0].clone()
            });
            // and at 10 kHz, 1 ms of 1 KiB frames each: the latency from the decision (a
            // latency row; nxn is no reference for its bytes)
            specs.push(BuildSpec {
                windows: WindowsRow::Latency,
                fragment: 10 * 1024,
                ..specs[0].clone()
            });
        }
        if s.quick || f != BUILD_FRAGMENT {
            return specs;
        }
        let base = specs[1].clone();
        specs.push(BuildSpec {
            verify: "full",
            ..base.clone()
        });
        specs.push(BuildSpec {
            lognormal: true,
            ..base.clone()
        });
        // event-building latency under load: the default run's shape triggered at
        // 50 % and 90 % of its maximum rate
        for load in [0.5, 0.9] {
            specs.push(BuildSpec {
                load: Some(load),
                ..base.clone()
            });
        }
        // what a newcomer types, beside nxn above and iperf3 in the same run
        specs.push(eb::default_run(s.build_secs));
        if s.iperf3 {
            self.iperf3(4 << 30);
        }
        specs
    }

    /// N x M from 1 x 1 to 4 x 4 (and the trapezoids 2 x 4, 4 x 2): GB/s and each role's
    /// CPU per event and per GB, as the builder grows on one host. Only for the default
    /// fragment size of a full run; `specs[1]` is its shape.
    fn scaling_specs(&self, f: usize, specs: &[BuildSpec]) -> Vec<(u32, u32, BuildSpec)> {
        if self.s.quick || f != BUILD_FRAGMENT {
            return Vec::new();
        }
        [(1, 1), (2, 2), (3, 3), (4, 4), (2, 4), (4, 2)]
            .into_iter()
            .map(|(n, m)| {
                let mut spec = specs[1].clone();
                (spec.rus, spec.bus, spec.scaling) = (n, m, true);
                (n, m, spec)
            })
            .collect()
    }

    /// The builder beside `n` busy compute threads (issue 33): the default run's shape
    /// unloaded, then loaded at each `run.priority`; builder throughput and the load's
    /// progress, both.
    fn compute_load(&mut self, n: u32) {
        let base = BuildSpec {
            as_typed: false,
            ..eb::default_run(self.s.build_secs)
        };
        let specs = [(0, "normal"), (n, "normal"), (n, "high"), (n, "realtime")];
        for (load, priority) in specs {
            let spec = BuildSpec {
                compute_load: load,
                priority,
                ..base.clone()
            };
            let scratch = std::env::temp_dir();
            self.add(
                format!("build evb tcp 2x2 512 KiB {}", spec.variant()),
                Box::new(move || eb::build(&spec, &scratch)),
            );
        }
    }

    /// The default run's shape, watched and not, alternating (the cost of /metrics and of
    /// the page's status polls).
    fn monitor(&mut self) {
        for scraped in [false, true] {
            let spec = BuildSpec {
                scraped,
                ..base_spec(BUILD_FRAGMENT, "crc", self.s.build_secs)
            };
            let scratch = std::env::temp_dir();
            self.add(
                format!("build evb tcp 2x2 512 KiB {}", spec.variant()),
                Box::new(move || eb::build(&spec, &scratch)),
            );
        }
    }

    /// Publish/subscribe fan-out to `k` subscribers of each size (and ZeroMQ's), with the
    /// p2p stream of the large sizes as their reference.
    fn pubsub(&mut self) {
        let s = self.s;
        let secs = s.secs;
        let sizes: &[usize] = match &s.pubsub_sizes {
            Some(v) => v,
            None if s.quick => &[64, 1 << 20],
            None => &[64, 1024, 16 * 1024, 256 * 1024, 1 << 20],
        };
        let ks: &[usize] = match &s.fanout {
            Some(v) => v,
            None if s.quick => &[1, 2],
            None => &[1, 2, 4],
        };
        // the reference of the large-message target: one p2p stream of that size
        for &size in sizes.iter().filter(|&&z| z >= 1 << 20) {
            let job = self.mesh(Kind::Tcp, SendPath::Fragment, 1, size);
            self.add(
                format!("p2p evb tcp fragment {}", output::human_size(size as f64)),
                job,
            );
        }
        for &k in ks {
            for &size in sizes {
                let h = output::human_size(size as f64);
                self.add(
                    format!("pubsub evb tcp k={k} {h}"),
                    Box::new(move || pubsubbench::evb(k, size, secs)),
                );
                if s.zmq {
                    self.add(
                        format!("pubsub zmq tcp k={k} {h}"),
                        Box::new(move || pubsubbench::zmq(k, size, secs)),
                    );
                }
            }
        }
    }
}

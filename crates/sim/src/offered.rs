//! An event builder in physical units under an offered trigger rate (open loop): the
//! numbers that size a system — whether it keeps up, the build latency's distribution,
//! how much memory each RU and BU holds, and how often the trigger is throttled.
//!
//! The model, at the grain of fragments:
//! - Triggers come at `trigger_hz`, as a Poisson process or periodically. Each is given to
//!   a BU by round robin among those with a free credit (`credits` events per BU, from
//!   assignment to release); when no BU has one the trigger is throttled (counted, not
//!   built: dead time).
//! - Every RU then has a fragment of the event (`fragment_bytes`, log-normal with
//!   `fragment_sd_bytes`) and sends it on its link (`link_gbps`), first come first served.
//!   The switch is non-blocking and lossless, with `hop_us` between the two links; each BU
//!   receives on its own link, one fragment at a time, in the order they reach it (an
//!   output-queued switch: what a shaped fabric such as the barrel shifter achieves).
//! - An event is built when its last fragment is in; it is released `build_us` later,
//!   which returns the BU's credit. As evb does, an RU keeps each fragment until its event
//!   is released, and a BU holds what it received of an event until then.
//!
//! Occupancies are sampled at every trigger: under Poisson triggers that is the time
//! average (arrivals see time averages). The first tenth of the events are a warm-up and
//! not measured.
//!
//! The data's shape and the hosts (issue 70 item 4):
//! - Each RU may have its own mean size (`fragment_bytes_per_ru`), and the sizes of one
//!   event may vary together (`size_correlation`: the share of the log-size variance that is
//!   the event's, as pile-up makes every source large in the same crossing). Each fragment
//!   keeps its RU's mean and the coefficient of variation `fragment_sd_bytes /
//!   fragment_bytes`.
//! - `host_gbps` is what a host moves through its NIC, PCIe and memory, below the link's
//!   rate: each direction of a node's link carries at most that.
//! - `folded = true` puts RU i and BU i on one host: the fragment of an event built there
//!   does not cross the network (it is in the BU at once), and the host's two directions
//!   share `host_gbps` (each gets half: the load is symmetric, as seed 003 measured a
//!   host's two-way limit).
//! - [`degraded`] gives the system with a part lost (a BU, an RU or a host, a spine of the
//!   fabric), each to be planned like any system: what the run does after the loss, in
//!   its steady state (the seconds of rebuilding the lost BU's events are not modelled).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use rand::rngs::SmallRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Exp, StandardNormal};
use serde::{Deserialize, Serialize};

/// A system to plan, in physical units (`evb sim --system FILE`, docs/planning.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct System {
    /// A name for the report.
    #[serde(default)]
    pub name: String,
    /// Readout units: one fragment of every event each.
    pub rus: usize,
    /// Builder units.
    pub bus: usize,
    /// Each node's link rate, each way (Gb/s, 10⁹ bits per second).
    pub link_gbps: f64,
    /// The fraction of the link rate that carries event data: what the headers, the gaps
    /// and the switch's blocking leave (1: all of it; on evb's testbed 0.95 with the barrel
    /// shifter, 0.83 for unshaped traffic at 8 × 8, docs/scaling.md). The links carry
    /// data at `link_gbps` × this.
    #[serde(default = "default_efficiency")]
    pub link_efficiency: f64,
    /// The offered trigger rate (Hz).
    pub trigger_hz: f64,
    /// "poisson" or "periodic".
    #[serde(default = "default_trigger")]
    pub trigger: String,
    /// The mean fragment size (bytes).
    pub fragment_bytes: f64,
    /// The fragment size's standard deviation (bytes; 0: every fragment the mean).
    #[serde(default)]
    pub fragment_sd_bytes: f64,
    /// Events each BU may hold, from assignment to release.
    #[serde(default = "default_credits")]
    pub credits: u32,
    /// A BU's time from an event's last fragment to its release (µs): checks, hand-off.
    #[serde(default)]
    pub build_us: f64,
    /// The switch's latency between an RU's link and a BU's (µs).
    #[serde(default)]
    pub hop_us: f64,
    /// Events triggered in the simulation (a tenth of them warm up).
    #[serde(default = "default_events")]
    pub events: u64,
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Each RU's mean fragment size (bytes), one per RU; empty: every RU `fragment_bytes`.
    #[serde(default)]
    pub fragment_bytes_per_ru: Vec<f64>,
    /// How much the sizes of one event's fragments vary together, from 0 (independently) to
    /// 1 (all by the same factor): the share of the log-size variance common to the event.
    #[serde(default)]
    pub size_correlation: f64,
    /// A host's own data rate (Gb/s: NIC, PCIe, memory), each direction of its link at most
    /// this (0: no limit below the link's).
    #[serde(default)]
    pub host_gbps: f64,
    /// RU i and BU i share a host (as `topology.folded`): needs as many RUs as BUs.
    #[serde(default)]
    pub folded: bool,
    /// The spines of the leaf-spine fabric every fragment crosses (0: not said), for
    /// [`degraded`]'s "a spine lost".
    #[serde(default)]
    pub spines: usize,
    /// The leaf-spine fabric's routing ("static", "random", "local", "pair", "ecmp" or
    /// "adaptive"; "": none said): `link_efficiency` is then the Clos model's efficiency
    /// for this system's hosts under it (`evb sim --model clos`), not typed in.
    #[serde(default)]
    pub fabric_routing: String,
    /// With `fabric_routing`: the traffic the fabric carries, "none" (each RU's fragments in
    /// assignment order) or "barrel" (the barrel shifter).
    #[serde(default = "default_fabric_shaping")]
    pub fabric_shaping: String,
    /// With `fabric_routing`: ports per leaf switch (half to hosts, half up).
    #[serde(default = "default_leaf_radix")]
    pub leaf_radix: usize,
    /// With `fabric_routing`: host ports per uplink of a leaf (1: full bisection).
    #[serde(default = "default_oversubscription")]
    pub oversubscription: usize,
}

impl Default for System {
    /// A 2 × 2 system of 100 Gb/s links at 10 kHz of 100 kB fragments.
    fn default() -> System {
        System {
            name: String::new(),
            rus: 2,
            bus: 2,
            link_gbps: 100.0,
            link_efficiency: default_efficiency(),
            trigger_hz: 10e3,
            trigger: default_trigger(),
            fragment_bytes: 100e3,
            fragment_sd_bytes: 0.0,
            credits: default_credits(),
            build_us: 0.0,
            hop_us: 0.0,
            events: default_events(),
            seed: default_seed(),
            fragment_bytes_per_ru: Vec::new(),
            size_correlation: 0.0,
            host_gbps: 0.0,
            folded: false,
            spines: 0,
            fabric_routing: String::new(),
            fabric_shaping: default_fabric_shaping(),
            leaf_radix: default_leaf_radix(),
            oversubscription: default_oversubscription(),
        }
    }
}

fn default_trigger() -> String {
    "poisson".into()
}
fn default_efficiency() -> f64 {
    1.0
}
fn default_fabric_shaping() -> String {
    "none".into()
}
fn default_leaf_radix() -> usize {
    32
}
fn default_oversubscription() -> usize {
    1
}
fn default_credits() -> u32 {
    8
}
fn default_events() -> u64 {
    20_000
}
fn default_seed() -> u64 {
    1
}

impl System {
    /// Reads a system from TOML; an error names the key.
    pub fn from_toml(text: &str) -> Result<System, String> {
        let mut s: System = toml::from_str(text).map_err(|e| e.to_string().trim().to_string())?;
        s.validate()?;
        let table: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
        if s.fabric_routing.is_empty() {
            // the fabric's shape does nothing without a routing to model it with
            for key in ["fabric_shaping", "leaf_radix", "oversubscription"] {
                if table.contains_key(key) {
                    return Err(format!(
                        "{key}: only with fabric_routing (the Clos model it shapes)"
                    ));
                }
            }
        } else {
            if table.contains_key("link_efficiency") {
                return Err(
                    "link_efficiency: given with fabric_routing, which derives it from \
                     the Clos model; give one of them"
                        .into(),
                );
            }
            s.derive_fabric()?;
        }
        Ok(s)
    }

    /// `fabric_routing`: the links' share for data from the Clos model of this system's
    /// hosts (folded: host i is RU i and BU i; else the BUs on leaves of their own), and
    /// the fabric's spines.
    fn derive_fabric(&mut self) -> Result<(), String> {
        let routing = crate::clos::Routing::parse(&self.fabric_routing).ok_or_else(|| {
            format!(
                "fabric_routing: {:?} is not one of static, random, local, pair, ecmp, adaptive",
                self.fabric_routing
            )
        })?;
        let policy = match self.fabric_shaping.as_str() {
            "none" => crate::Policy::RandomFifo,
            "barrel" => crate::Policy::Barrel,
            other => {
                return Err(format!(
                    "fabric_shaping: {other:?} is not \"none\" or \"barrel\""
                ))
            }
        };
        if !(4..=1024).contains(&self.leaf_radix) {
            return Err("leaf_radix: must be from 4 to 1024".into());
        }
        if !(1..=64).contains(&self.oversubscription) {
            return Err("oversubscription: must be from 1 to 64".into());
        }
        let hosts = self.rus;
        let o = crate::clos::ClosModel {
            hosts,
            bus: (!self.folded).then_some(self.bus),
            radix: self.leaf_radix,
            oversubscription: self.oversubscription,
            routing,
            settle: 1000,
            policy,
            repeat: false,
            // as `evb sim --model clos` steps by default
            slots: (20_000_000 / hosts as u64).clamp(2_000, 200_000),
            seed: self.seed,
        }
        .run();
        if self.spines != 0 && self.spines != o.spines {
            return Err(format!(
                "spines: {} given, but {}-port leaves with oversubscription {} have {}",
                self.spines, self.leaf_radix, self.oversubscription, o.spines
            ));
        }
        self.spines = o.spines;
        self.link_efficiency = o.efficiency.clamp(1e-6, 1.0);
        Ok(())
    }

    pub fn validate(&self) -> Result<(), String> {
        let bad = |key: &str, why: &str| Err(format!("{key}: {why}"));
        if !(1..=4096).contains(&self.rus) {
            return bad("rus", "must be from 1 to 4096");
        }
        if !(1..=4096).contains(&self.bus) {
            return bad("bus", "must be from 1 to 4096");
        }
        if !(self.link_gbps > 0.0 && self.link_gbps <= 1e5) {
            return bad("link_gbps", "must be above 0 and at most 100000");
        }
        if !(self.link_efficiency > 0.0 && self.link_efficiency <= 1.0) {
            return bad("link_efficiency", "must be above 0 and at most 1");
        }
        if !(self.trigger_hz > 0.0 && self.trigger_hz <= 1e9) {
            return bad("trigger_hz", "must be above 0 and at most 10⁹");
        }
        if self.trigger != "poisson" && self.trigger != "periodic" {
            return bad("trigger", "must be \"poisson\" or \"periodic\"");
        }
        if !(self.fragment_bytes >= 1.0 && self.fragment_bytes <= 1e9) {
            return bad("fragment_bytes", "must be from 1 to 10⁹");
        }
        if !(self.fragment_sd_bytes >= 0.0 && self.fragment_sd_bytes <= 100.0 * self.fragment_bytes)
        {
            return bad(
                "fragment_sd_bytes",
                "must be from 0 to 100 × fragment_bytes",
            );
        }
        if !(1..=1_000_000).contains(&self.credits) {
            return bad("credits", "must be from 1 to 10⁶");
        }
        if !(self.build_us >= 0.0 && self.build_us <= 1e9) {
            return bad("build_us", "must be from 0 to 10⁹");
        }
        if !(self.hop_us >= 0.0 && self.hop_us <= 1e6) {
            return bad("hop_us", "must be from 0 to 10⁶");
        }
        if !(100..=100_000_000).contains(&self.events) {
            return bad("events", "must be from 100 to 10⁸");
        }
        if (self.rus as u64).saturating_mul(self.events) > 2_000_000_000 {
            return bad("events", "rus × events must be at most 2·10⁹ fragments");
        }
        if !self.fragment_bytes_per_ru.is_empty() {
            if self.fragment_bytes_per_ru.len() != self.rus {
                return Err(format!(
                    "fragment_bytes_per_ru: one per RU: {} given for {} RUs",
                    self.fragment_bytes_per_ru.len(),
                    self.rus
                ));
            }
            if let Some(k) = self
                .fragment_bytes_per_ru
                .iter()
                .position(|b| !(*b >= 1.0 && *b <= 1e9))
            {
                return Err(format!("fragment_bytes_per_ru[{k}]: must be from 1 to 10⁹"));
            }
        }
        if !(0.0..=1.0).contains(&self.size_correlation) {
            return bad("size_correlation", "must be from 0 to 1");
        }
        if !(self.host_gbps >= 0.0 && self.host_gbps <= 1e5) {
            return bad("host_gbps", "must be from 0 (no limit) to 100000");
        }
        if self.folded && self.rus != self.bus {
            return bad(
                "folded",
                "a folded system has as many RUs as BUs (RU i and BU i on host i)",
            );
        }
        if self.spines > 4096 {
            return bad("spines", "must be from 0 (not said) to 4096");
        }
        Ok(())
    }

    /// RU `r`'s mean fragment size (bytes).
    pub fn ru_bytes(&self, r: usize) -> f64 {
        self.fragment_bytes_per_ru
            .get(r)
            .copied()
            .unwrap_or(self.fragment_bytes)
    }

    /// The mean bytes of an event: every RU's mean fragment.
    pub fn event_bytes(&self) -> f64 {
        if self.fragment_bytes_per_ru.is_empty() {
            self.fragment_bytes * self.rus as f64
        } else {
            self.fragment_bytes_per_ru.iter().sum()
        }
    }

    /// Of an event's bytes, the share that crosses the network (folded: not the fragment
    /// of the host that builds it).
    fn crossing(&self) -> f64 {
        if self.folded {
            (self.rus as f64 - 1.0) / self.rus as f64
        } else {
            1.0
        }
    }

    /// What the links must carry at the offered rate, as a fraction of a BU's link: above 1
    /// no shaping or buffer can keep up.
    pub fn link_load(&self) -> f64 {
        let bits_per_event = self.event_bytes() * 8.0 * self.crossing();
        let per_bu = self.trigger_hz * bits_per_event / self.bus as f64;
        (per_bu / (self.data_gbps() * 1e9)).max(self.ru_link_load())
    }

    /// What the busiest RU's link must carry at the offered rate, as a fraction of it: its
    /// fragment of every event, however many BUs share them (folded: not those built on
    /// its own host).
    pub fn ru_link_load(&self) -> f64 {
        let largest = (0..self.rus).map(|r| self.ru_bytes(r)).fold(0.0, f64::max);
        self.trigger_hz * largest * 8.0 * self.crossing() / (self.data_gbps() * 1e9)
    }

    /// The rate a link carries event data at (Gb/s): the link's share for data, at most
    /// the host's own rate (folded: half of it each way).
    pub fn data_gbps(&self) -> f64 {
        let link = self.link_gbps * self.link_efficiency;
        match (self.host_gbps > 0.0, self.folded) {
            (false, _) => link,
            (true, false) => link.min(self.host_gbps),
            (true, true) => link.min(self.host_gbps / 2.0),
        }
    }
}

/// `text` (a system's TOML) with `key` set to `value` (read as TOML, else as a string).
pub fn with_key(text: &str, key: &str, value: &str) -> Result<String, String> {
    let mut t: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    let v: toml::Value = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_string()));
    t.insert(key.to_string(), v);
    toml::to_string(&t).map_err(|e| e.to_string())
}

/// Percentiles of a sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Spread {
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Spread {
    fn of(mut v: Vec<f64>) -> Spread {
        if v.is_empty() {
            return Spread::default();
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Spread {
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: at(0.5),
            p99: at(0.99),
            p999: at(0.999),
            max: v[v.len() - 1],
        }
    }
}

/// What the system does at the offered rate.
#[derive(Debug, Clone, Serialize)]
pub struct Planned {
    pub system: System,
    /// The links' load at the offered rate (1.0: a BU's link busy all the time).
    pub offered_link_load: f64,
    /// Events built per second, measured after the warm-up.
    pub built_hz: f64,
    /// Event data built per second (Gb/s, all BUs).
    pub built_gbps: f64,
    /// The BUs' links busy, as a fraction of their capacity.
    pub bu_link_busy: f64,
    /// Triggers throttled (no BU had a credit), of those offered after the warm-up.
    pub throttled: f64,
    /// Built at the offered rate: the links' load below 1 (at 1 or more no system keeps
    /// up for long), nothing throttled (below 10⁻³) and the latency not growing (the last
    /// quarter's median within 2 × the second quarter's, + 1 µs).
    pub keeps_up: bool,
    /// Trigger to the event's last fragment at its BU (µs).
    pub latency_us: Spread,
    /// One RU's memory held (bytes): fragments of events not yet released.
    pub ru_buffer_bytes: Spread,
    /// One BU's memory held (bytes): fragments of its events not yet released.
    pub bu_buffer_bytes: Spread,
    /// Events simulated and measured.
    pub events_measured: u64,
    /// Over replications (`confidence::combine`): the figures above are their means, and
    /// this their ranges and verdicts. `None`: one run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confidence: Option<crate::confidence::Confidence>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// A fragment reaches its BU's link (event, bytes as u64 in `Ev::b`).
    Arrive,
    /// The BU's link has received its current fragment.
    Received,
    /// A fragment made on the BU's own host (folded) is in the BU: no link carried it.
    Local,
    /// An event is released: its credit returns.
    Release,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Ev {
    /// Time in picoseconds (integers keep the heap's order exact).
    t: u64,
    kind: Kind,
    bu: u32,
    event: u64,
    bytes: u64,
}

const PS: f64 = 1e12;

impl System {
    /// The system in one line: nodes, links, triggers, fragments, credits.
    pub fn shape(&self) -> String {
        self.shape_with(&[])
    }

    /// The system in one line, the keys in `swept` written as ‹key› (a sweep's report
    /// does not show its first point's value as the system's).
    pub fn shape_with(&self, swept: &[&str]) -> String {
        let v = |key: &str, text: String| {
            if swept.contains(&key) {
                format!("‹{key}›")
            } else {
                text
            }
        };
        format!(
            "{} RUs × {} BUs, {} Gb/s links ({} for data), {} triggers at {} Hz, fragments {} B (sd {} B), {} credits per BU",
            v("rus", self.rus.to_string()),
            v("bus", self.bus.to_string()),
            v("link_gbps", self.link_gbps.to_string()),
            v("link_efficiency", format!("{:.0} %", self.link_efficiency * 100.0)),
            v("trigger", self.trigger.clone()),
            v("trigger_hz", format!("{:.0}", self.trigger_hz)),
            v("fragment_bytes", format!("{:.0}", self.fragment_bytes)),
            v("fragment_sd_bytes", format!("{:.0}", self.fragment_sd_bytes)),
            v("credits", self.credits.to_string())
        ) + &self.shape_extras(swept)
    }

    /// The shape's words for the keys that are not at their defaults.
    fn shape_extras(&self, swept: &[&str]) -> String {
        let mut out = String::new();
        let on = |key: &str, set: bool| set || swept.contains(&key);
        if on(
            "fragment_bytes_per_ru",
            !self.fragment_bytes_per_ru.is_empty(),
        ) {
            let (lo, hi) = (0..self.rus)
                .map(|r| self.ru_bytes(r))
                .fold((f64::MAX, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
            out += &format!(", RUs' means {lo:.0}–{hi:.0} B");
        }
        if on("size_correlation", self.size_correlation > 0.0) {
            out += &format!(", sizes correlated {:.2}", self.size_correlation);
        }
        if on("host_gbps", self.host_gbps > 0.0) {
            out += &format!(", hosts {} Gb/s", self.host_gbps);
        }
        if on("folded", self.folded) {
            out += ", folded (RU i and BU i on host i)";
        }
        if on("fabric_routing", !self.fabric_routing.is_empty()) {
            out += &format!(
                ", a Clos of {}-port leaves ({} routing, {} traffic, oversubscription {}): {:.1} % of the links for data from its model",
                self.leaf_radix,
                self.fabric_routing,
                if self.fabric_shaping == "barrel" { "barrel-shifted" } else { "unshaped" },
                self.oversubscription,
                self.link_efficiency * 100.0
            );
        }
        if on("spines", self.spines > 0) {
            out += &format!(", {} spines", self.spines);
        }
        out
    }
}

/// Simulates `s` at its offered rate (one run, its seed).
pub fn plan(s: &System) -> Planned {
    let (n, m) = (s.rus, s.bus);
    let mut rng = SmallRng::seed_from_u64(s.seed);
    let ps_per_byte = 8.0 / (s.data_gbps() * 1e9) * PS;
    let hop = (s.hop_us * 1e6) as u64;
    let build = (s.build_us * 1e6) as u64;
    let gap = Exp::new(s.trigger_hz).expect("a positive rate");
    let sizes = Sizes::of(s);
    let warm = s.events / 10;
    // per RU: when its link is next free (ps), and the bytes it holds
    let mut ru_free = vec![0u64; n];
    let mut ru_held = vec![0u64; n];
    // per BU: credits in use, its link's queue and whether busy, bytes held
    let mut bu_used = vec![0u32; m];
    let mut bu_queue: Vec<VecDeque<(u64, u64)>> = vec![VecDeque::new(); m];
    let mut bu_busy = vec![false; m];
    let mut bu_held = vec![0u64; m];
    let mut bu_link_ps = 0u64;
    // per event in flight: its trigger time, fragments still to come, its sizes' total per
    // RU (kept to free the RUs' memory at release)
    let mut trig_at: std::collections::HashMap<u64, (u64, usize, Vec<u64>)> =
        std::collections::HashMap::new();
    let mut heap: BinaryHeap<Reverse<Ev>> = BinaryHeap::new();
    let mut next_bu = 0usize;
    let mut t_trig = 0u64;
    let (mut throttled, mut offered) = (0u64, 0u64);
    let mut latencies: Vec<(u64, f64)> = Vec::new();
    let (mut ru_samples, mut bu_samples) = (Vec::new(), Vec::new());
    let (mut built, mut built_bytes) = (0u64, 0u64);
    let (mut t_first, mut t_last) = (None::<u64>, 0u64);
    let mut triggered = 0u64;
    let period = (PS / s.trigger_hz) as u64;
    loop {
        // the next trigger, or the next event in the fabric, whichever is first
        let fabric_next = heap.peek().map(|Reverse(e)| e.t);
        let trigger_due = triggered < s.events && fabric_next.is_none_or(|t| t_trig <= t);
        if trigger_due {
            let now = t_trig;
            t_trig += if s.trigger == "periodic" {
                period
            } else {
                (gap.sample(&mut rng) * PS) as u64
            };
            triggered += 1;
            let measured = triggered > warm;
            if measured {
                offered += 1;
                ru_samples.push(ru_held[0] as f64);
                bu_samples.push(bu_held[0] as f64);
            }
            // round robin among the BUs with a free credit
            let Some(bu) = (0..m)
                .map(|k| (next_bu + k) % m)
                .find(|&b| bu_used[b] < s.credits)
            else {
                if measured {
                    throttled += 1;
                }
                continue;
            };
            next_bu = (bu + 1) % m;
            bu_used[bu] += 1;
            let event = triggered;
            let mut per_ru = Vec::with_capacity(n);
            let common = sizes.event_factor(&mut rng);
            for (r, free) in ru_free.iter_mut().enumerate() {
                let bytes = sizes.fragment(r, common, &mut rng);
                ru_held[r] += bytes;
                per_ru.push(bytes);
                if s.folded && r == bu {
                    // made on the host that builds it: in the BU at once
                    heap.push(Reverse(Ev {
                        t: now,
                        kind: Kind::Local,
                        bu: bu as u32,
                        event,
                        bytes,
                    }));
                    continue;
                }
                let start = (*free).max(now);
                *free = start + (bytes as f64 * ps_per_byte) as u64;
                heap.push(Reverse(Ev {
                    t: *free + hop,
                    kind: Kind::Arrive,
                    bu: bu as u32,
                    event,
                    bytes,
                }));
            }
            trig_at.insert(event, (now, n, per_ru));
            continue;
        }
        let Some(Reverse(e)) = heap.pop() else {
            break;
        };
        let b = e.bu as usize;
        match e.kind {
            Kind::Arrive => bu_queue[b].push_back((e.event, e.bytes)),
            Kind::Received | Kind::Local => {
                bu_held[b] += e.bytes;
                if e.kind == Kind::Received {
                    bu_busy[b] = false;
                }
                let done = trig_at.get_mut(&e.event).map(|(t0, left, _)| {
                    *left -= 1;
                    (*left == 0).then_some(*t0)
                });
                if let Some(Some(t0)) = done {
                    if e.event > warm {
                        t_first.get_or_insert(e.t);
                        t_last = e.t;
                        built += 1;
                        latencies.push((e.event, (e.t - t0) as f64 / 1e6));
                    }
                    heap.push(Reverse(Ev {
                        t: e.t + build,
                        kind: Kind::Release,
                        ..e
                    }));
                }
            }
            Kind::Release => {
                bu_used[b] -= 1;
                if let Some((_, _, per_ru)) = trig_at.remove(&e.event) {
                    let total: u64 = per_ru.iter().sum();
                    if e.event > warm {
                        built_bytes += total;
                    }
                    bu_held[b] -= total;
                    for (r, bytes) in per_ru.into_iter().enumerate() {
                        ru_held[r] -= bytes;
                    }
                }
            }
        }
        // a fragment came in or one was received: the BU's link takes the next, if idle
        if e.kind != Kind::Release {
            start_receiving(
                &mut heap,
                &mut bu_queue[b],
                &mut bu_busy[b],
                b,
                e.t,
                ps_per_byte,
                &mut bu_link_ps,
                t_first.is_some(),
            );
        }
    }
    let span_s = t_first.map_or(0.0, |t0| (t_last - t0) as f64 / PS);
    let built_hz = if span_s > 0.0 {
        (built.saturating_sub(1)) as f64 / span_s
    } else {
        0.0
    };
    let bytes_per_event = if built > 0 {
        built_bytes as f64 / built as f64
    } else {
        0.0
    };
    let throttled_frac = if offered > 0 {
        throttled as f64 / offered as f64
    } else {
        0.0
    };
    // a growing latency: the system falls behind even where nothing is throttled yet
    latencies.sort_by_key(|(e, _)| *e);
    let quarter = |k: usize| {
        let q = latencies.len() / 4;
        Spread::of(
            latencies[k * q..(k + 1) * q]
                .iter()
                .map(|(_, l)| *l)
                .collect(),
        )
        .p50
    };
    let growing = latencies.len() >= 8 && quarter(3) > 2.0 * quarter(1).max(1e-3) + 1.0;
    Planned {
        system: s.clone(),
        offered_link_load: s.link_load(),
        built_hz,
        built_gbps: built_hz * bytes_per_event * 8.0 / 1e9,
        bu_link_busy: if span_s > 0.0 {
            bu_link_ps as f64 / PS / span_s / m as f64
        } else {
            0.0
        },
        throttled: throttled_frac,
        keeps_up: s.link_load() < 1.0 && throttled_frac < 1e-3 && !growing,
        latency_us: Spread::of(latencies.into_iter().map(|(_, l)| l).collect()),
        ru_buffer_bytes: Spread::of(ru_samples),
        bu_buffer_bytes: Spread::of(bu_samples),
        events_measured: built,
        confidence: None,
    }
}

/// How fragment sizes are drawn: log-normal around each RU's mean with the system's
/// coefficient of variation, a share `size_correlation` of the log variance common to the
/// event (the marginal distribution of each fragment stays the same).
struct Sizes {
    means: Vec<f64>,
    /// The log-normal's σ (0: every fragment its RU's mean).
    sigma: f64,
    correlation: f64,
}

impl Sizes {
    fn of(s: &System) -> Sizes {
        let cv = s.fragment_sd_bytes / s.fragment_bytes;
        Sizes {
            means: (0..s.rus).map(|r| s.ru_bytes(r)).collect(),
            sigma: (1.0 + cv * cv).ln().sqrt(),
            correlation: s.size_correlation,
        }
    }

    /// The event's own normal draw (0 where sizes do not vary).
    fn event_factor(&self, rng: &mut SmallRng) -> f64 {
        if self.sigma > 0.0 && self.correlation > 0.0 {
            StandardNormal.sample(rng)
        } else {
            0.0
        }
    }

    /// RU `r`'s fragment of an event whose own draw is `common` (bytes, at least 1).
    fn fragment(&self, r: usize, common: f64, rng: &mut SmallRng) -> u64 {
        let mean = self.means[r];
        if self.sigma == 0.0 {
            return mean.round().max(1.0) as u64;
        }
        let own: f64 = StandardNormal.sample(rng);
        let z = self.correlation.sqrt() * common + (1.0 - self.correlation).sqrt() * own;
        let mu = mean.ln() - self.sigma * self.sigma / 2.0;
        (mu + self.sigma * z).exp().round().max(1.0) as u64
    }
}

/// The system with one part lost, each as (what was lost, the system that is left), to be
/// planned like any: a BU (its events go to the others), an RU (`builder.on_ru_loss =
/// "partial"`: events built without its fragment), for a folded system a host (its RU and
/// its BU), and with `spines` given, a spine (the fabric carries (S − 1)/S of what it
/// did: the same share off every link's data rate). What the run does while it loses the
/// part (its events rebuilt) is not modelled: this is the run that goes on after.
pub fn degraded(s: &System) -> Vec<(String, System)> {
    let mut out = Vec::new();
    let without_ru = |s: &System| {
        let mut t = s.clone();
        t.rus -= 1;
        if !t.fragment_bytes_per_ru.is_empty() {
            // the largest RU lost: the loss that most changes the events
            let k = (0..s.rus)
                .max_by(|&a, &b| s.ru_bytes(a).total_cmp(&s.ru_bytes(b)))
                .unwrap_or(0);
            t.fragment_bytes_per_ru.remove(k);
        }
        t
    };
    if s.folded {
        if s.rus > 1 {
            let mut t = without_ru(s);
            t.bus -= 1;
            out.push(("a host lost (RU, BU)".to_string(), t));
        }
    } else {
        if s.bus > 1 {
            let mut t = s.clone();
            t.bus -= 1;
            out.push(("a BU lost".to_string(), t));
        }
        if s.rus > 1 {
            out.push(("an RU lost (partial)".to_string(), without_ru(s)));
        }
    }
    if s.spines >= 2 {
        let mut t = s.clone();
        t.spines -= 1;
        t.link_efficiency *= (s.spines - 1) as f64 / s.spines as f64;
        out.push((format!("a spine lost (of {})", s.spines), t));
    }
    out
}

/// The BU's link takes the next fragment of its queue, if any.
#[allow(clippy::too_many_arguments)]
fn start_receiving(
    heap: &mut BinaryHeap<Reverse<Ev>>,
    queue: &mut VecDeque<(u64, u64)>,
    busy: &mut bool,
    bu: usize,
    now: u64,
    ps_per_byte: f64,
    link_ps: &mut u64,
    measuring: bool,
) {
    if *busy {
        return;
    }
    let Some((event, bytes)) = queue.pop_front() else {
        return;
    };
    *busy = true;
    let took = (bytes as f64 * ps_per_byte) as u64;
    if measuring {
        *link_ps += took;
    }
    heap.push(Reverse(Ev {
        t: now + took,
        kind: Kind::Received,
        bu: bu as u32,
        event,
        bytes,
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_link(rho: f64, events: u64) -> System {
        // 1 µs per fragment on a 8 Gb/s link: 1000 bytes
        System {
            name: String::new(),
            rus: 1,
            bus: 1,
            link_gbps: 8.0,
            link_efficiency: 1.0,
            trigger_hz: rho * 1e6,
            trigger: "poisson".into(),
            fragment_bytes: 1000.0,
            fragment_sd_bytes: 0.0,
            credits: 1_000_000,
            build_us: 0.0,
            hop_us: 0.0,
            events,
            seed: 7,
            ..System::default()
        }
    }

    #[test]
    fn one_link_is_an_m_d_1_queue() {
        // the RU's link is M/D/1 with service 1 µs: the mean wait is ρ/(2(1-ρ)) µs; the
        // BU's link then takes each fragment 1 µs more, never waiting (its arrivals are
        // at least 1 µs apart)
        for rho in [0.3, 0.5, 0.8] {
            let p = plan(&one_link(rho, 400_000));
            let want = rho / (2.0 * (1.0 - rho)) + 2.0;
            let got = p.latency_us.mean;
            assert!(
                (got - want).abs() / want < 0.03,
                "ρ = {rho}: mean latency {got:.4} µs, M/D/1 says {want:.4}"
            );
            assert!(p.keeps_up, "{p:?}");
            assert!((p.bu_link_busy - rho).abs() < 0.02, "{p:?}");
            assert!((p.built_hz / (rho * 1e6) - 1.0).abs() < 0.02, "{p:?}");
        }
    }

    #[test]
    fn occupancy_and_latency_obey_littles_law() {
        // the RU holds each fragment from trigger to release: its mean memory is the
        // rate × the mean time held × the size (Poisson arrivals see time averages)
        let mut s = one_link(0.6, 300_000);
        s.build_us = 3.0;
        let p = plan(&s);
        let held_us = p.latency_us.mean + 3.0;
        let want = 0.6e6 * held_us * 1e-6 * 1000.0;
        let got = p.ru_buffer_bytes.mean;
        assert!(
            (got - want).abs() / want < 0.03,
            "mean RU memory {got:.1} B, Little's law says {want:.1} B"
        );
    }

    #[test]
    fn credits_throttle_an_overloaded_system_and_units_add_up() {
        // 4 × 4, 100 Gb/s, 100 kB fragments: a BU's link carries 4 × 100 kB per event it
        // builds, so 4 BUs keep up to 4 × 100e9 / 8 / 400e3 = 125 kHz
        let base = System {
            name: "4x4".into(),
            rus: 4,
            bus: 4,
            link_gbps: 100.0,
            link_efficiency: 1.0,
            trigger_hz: 100e3,
            trigger: "periodic".into(),
            fragment_bytes: 100e3,
            fragment_sd_bytes: 0.0,
            credits: 4,
            build_us: 0.0,
            hop_us: 1.0,
            events: 20_000,
            seed: 3,
            ..System::default()
        };
        assert!((base.link_load() - 0.8).abs() < 1e-9);
        let ok = plan(&base);
        assert!(ok.keeps_up, "{ok:?}");
        assert!((ok.built_hz / 100e3 - 1.0).abs() < 0.01, "{ok:?}");
        assert!((ok.built_gbps - 320.0).abs() / 320.0 < 0.01, "{ok:?}");
        let over = plan(&System {
            trigger_hz: 150e3,
            ..base
        });
        assert!(!over.keeps_up, "{over:?}");
        assert!(over.throttled > 0.1, "{over:?}");
        // what is built is what the links carry: at most 125 kHz
        assert!(over.built_hz < 126e3 && over.built_hz > 110e3, "{over:?}");
        // the RU holds at most the credits' events' fragments
        assert!(over.ru_buffer_bytes.max <= 16.0 * 100e3, "{over:?}");
    }

    #[test]
    fn a_bad_key_is_named() {
        let e = System::from_toml(
            "rus = 4\nbus = 0\nlink_gbps = 100\ntrigger_hz = 1\nfragment_bytes = 10\n",
        )
        .unwrap_err();
        assert!(e.starts_with("bus:"), "{e}");
        let e = System::from_toml(
            "rus = 4\nbus = 4\nlink_gbps = 100\ntrigger_hz = 1\nfragment_bytes = 10\nlinks = 3\n",
        )
        .unwrap_err();
        assert!(e.contains("links"), "{e}");
    }

    /// A 4 × 4 system of 100 Gb/s links, 100 kB fragments, Poisson at `load` of the links.
    fn four(load: f64) -> System {
        System {
            rus: 4,
            bus: 4,
            link_gbps: 100.0,
            trigger_hz: load * 125e3,
            fragment_bytes: 100e3,
            credits: 16,
            events: 40_000,
            seed: 11,
            ..System::default()
        }
    }

    #[test]
    fn sizes_that_vary_together_keep_their_mean_and_widen_the_latency() {
        let mut apart = four(0.7);
        apart.fragment_sd_bytes = 50e3;
        let together = System {
            size_correlation: 1.0,
            ..apart.clone()
        };
        let (a, t) = (plan(&apart), plan(&together));
        // the same bytes per event on average (sizes keep their marginal distribution)
        let per_event = |p: &Planned| p.built_gbps * 1e9 / 8.0 / p.built_hz;
        let (ba, bt) = (per_event(&a), per_event(&t));
        assert!((ba / 400e3 - 1.0).abs() < 0.03, "{ba}");
        assert!((bt / 400e3 - 1.0).abs() < 0.03, "{bt}");
        // an event whose every fragment is large keeps its BU's link longer: the tail grows
        assert!(
            t.latency_us.p99 > 1.2 * a.latency_us.p99,
            "p99 {} µs together, {} µs apart",
            t.latency_us.p99,
            a.latency_us.p99
        );
        // and so does the memory a BU holds at its peak
        assert!(
            t.bu_buffer_bytes.p99 > a.bu_buffer_bytes.p99,
            "{t:?}\n{a:?}"
        );
    }

    #[test]
    fn each_ru_its_own_size_and_the_largest_sets_the_ru_link_load() {
        let s = System {
            fragment_bytes_per_ru: vec![50e3, 50e3, 100e3, 200e3],
            ..four(0.5)
        };
        s.validate().unwrap();
        assert_eq!(s.event_bytes(), 400e3);
        // RU 3 sends 200 kB per event at 62.5 kHz: its link is full
        assert!(
            (s.ru_link_load() - 1.0).abs() < 1e-9,
            "{}",
            s.ru_link_load()
        );
        assert!((s.link_load() - 1.0).abs() < 1e-9);
        let lighter = System {
            trigger_hz: 0.8 * 62.5e3,
            ..s.clone()
        };
        let p = plan(&lighter);
        assert!(p.keeps_up, "{p:?}");
        let want = 0.8 * 62.5e3 * 400e3 * 8.0 / 1e9;
        assert!(
            (p.built_gbps / want - 1.0).abs() < 0.02,
            "{} Gb/s",
            p.built_gbps
        );
        let e = System {
            fragment_bytes_per_ru: vec![1e3; 3],
            ..four(0.5)
        }
        .validate()
        .unwrap_err();
        assert!(e.starts_with("fragment_bytes_per_ru:"), "{e}");
    }

    #[test]
    fn a_folded_host_keeps_its_own_fragment_off_the_network() {
        let open = four(0.6);
        let folded = System {
            folded: true,
            ..open.clone()
        };
        assert!((folded.link_load() / open.link_load() - 0.75).abs() < 1e-9);
        let (o, f) = (plan(&open), plan(&folded));
        assert!(o.keeps_up && f.keeps_up, "{o:?}\n{f:?}");
        assert!((o.built_hz / f.built_hz - 1.0).abs() < 0.02);
        // a BU's link carries 3 of the 4 fragments of each event it builds
        let ratio = f.bu_link_busy / o.bu_link_busy;
        assert!((ratio - 0.75).abs() < 0.03, "{ratio}");
        // a folded system needs as many RUs as BUs
        let e = System { bus: 3, ..folded }.validate().unwrap_err();
        assert!(e.starts_with("folded:"), "{e}");
    }

    #[test]
    fn a_host_slower_than_its_link_is_the_limit() {
        let s = four(0.7);
        assert!(plan(&s).keeps_up);
        // a host that moves 60 Gb/s: the same triggers need 70/60 of it
        let host = System {
            host_gbps: 60.0,
            ..s.clone()
        };
        assert_eq!(host.data_gbps(), 60.0);
        let p = plan(&host);
        assert!(!p.keeps_up && p.offered_link_load > 1.0, "{p:?}");
        // folded, each direction gets half of the host: 120 Gb/s hosts give 60 each way
        let folded = System {
            host_gbps: 120.0,
            folded: true,
            ..s
        };
        assert_eq!(folded.data_gbps(), 60.0);
    }

    #[test]
    fn a_part_lost_is_a_system_of_its_own() {
        let s = System {
            spines: 4,
            ..four(0.8)
        };
        let lost = degraded(&s);
        let names: Vec<&str> = lost.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["a BU lost", "an RU lost (partial)", "a spine lost (of 4)"]
        );
        assert!(plan(&s).keeps_up);
        // 4 BUs at 0.8: 3 left carry 1.07 of their links: it cannot keep up
        let bu = plan(&lost[0].1);
        assert!(!bu.keeps_up && bu.throttled > 0.0, "{bu:?}");
        assert!((bu.offered_link_load - 0.8 * 4.0 / 3.0).abs() < 1e-9);
        // an RU lost: events are 3/4 the bytes (the BUs' links 0.6), each RU's link as busy
        // as before (0.8): it keeps up
        let ru = plan(&lost[1].1);
        assert!(ru.keeps_up, "{ru:?}");
        assert!((ru.offered_link_load - 0.8).abs() < 1e-9);
        assert!((ru.bu_link_busy - 0.6).abs() < 0.03, "{ru:?}");
        // a spine of 4: every link 3/4 of its data rate: 1.07 again
        let spine = &lost[2].1;
        assert!((spine.link_load() - 0.8 / 0.75).abs() < 1e-9);
        assert!(!plan(spine).keeps_up);
        // folded: a host lost is its RU and its BU
        let f = degraded(&System {
            folded: true,
            ..four(0.5)
        });
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].1.rus, f[0].1.bus), (3, 3));
        // the largest RU is the one lost where RUs differ
        let r = degraded(&System {
            fragment_bytes_per_ru: vec![1e3, 9e3, 2e3, 3e3],
            ..four(0.5)
        });
        assert_eq!(r[1].1.fragment_bytes_per_ru, vec![1e3, 2e3, 3e3]);
    }

    #[test]
    fn a_fabric_routing_takes_the_links_share_from_the_clos_model() {
        use crate::clos::{ClosModel, Routing};
        let text = |extra: &str| {
            format!(
                "rus = 64\nbus = 64\nfolded = true\nlink_gbps = 100\ntrigger_hz = 1000\n\
                 fragment_bytes = 1000\nleaf_radix = 16\n{extra}"
            )
        };
        let clos = |routing, policy| {
            ClosModel {
                hosts: 64,
                bus: None,
                radix: 16,
                oversubscription: 1,
                routing,
                settle: 1000,
                policy,
                repeat: false,
                slots: (20_000_000 / 64u64).clamp(2_000, 200_000),
                seed: 1,
            }
            .run()
        };
        let ecmp = System::from_toml(&text("fabric_routing = \"ecmp\"")).unwrap();
        let want = clos(Routing::Ecmp, crate::Policy::RandomFifo);
        assert_eq!(ecmp.link_efficiency, want.efficiency);
        assert!(ecmp.link_efficiency < 0.8, "{}", ecmp.link_efficiency);
        assert_eq!(ecmp.spines, want.spines);
        assert!(
            ecmp.shape_with(&[]).contains("ecmp routing"),
            "{}",
            ecmp.shape_with(&[])
        );
        // the barrel shifter on static routes crosses the fabric as one switch
        let barrel = System::from_toml(&text(
            "fabric_routing = \"static\"\nfabric_shaping = \"barrel\"",
        ))
        .unwrap();
        assert!(barrel.link_efficiency > 0.99, "{}", barrel.link_efficiency);
        // the links' share is what the offered model runs on
        assert!(ecmp.link_load() > barrel.link_load());
        for (extra, key) in [
            (
                "fabric_routing = \"ecmp\"\nlink_efficiency = 0.9",
                "link_efficiency",
            ),
            ("fabric_routing = \"wormhole\"", "fabric_routing"),
            (
                "fabric_routing = \"ecmp\"\nfabric_shaping = \"shifted\"",
                "fabric_shaping",
            ),
            ("fabric_routing = \"ecmp\"\nspines = 3", "spines"),
        ] {
            let e = System::from_toml(&text(extra)).unwrap_err();
            assert!(e.starts_with(key), "{extra}: {e}");
        }
        // the fabric's shape without a routing is refused, key by key
        let e = System::from_toml(&text("")).unwrap_err();
        assert!(e.starts_with("leaf_radix"), "{e}");
        let plain = "rus = 4\nbus = 4\nlink_gbps = 100\ntrigger_hz = 1000\nfragment_bytes = 1000\n";
        for key in ["fabric_shaping = \"barrel\"", "oversubscription = 2"] {
            let e = System::from_toml(&format!("{plain}{key}")).unwrap_err();
            assert!(e.starts_with(key.split(' ').next().unwrap()), "{key}: {e}");
        }
    }
}

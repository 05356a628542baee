//! "Keeps up" with an error bar: a system planned over independent replications.
//!
//! One run of [`plan`] is one sample of a stochastic system: its verdict near saturation
//! and its tail percentiles move with the seed. Here a point is `R` runs with seeds
//! `seed`, `seed + 1`, ..., `seed + R - 1`; its figures are their means, each with the
//! range (min–max) over the runs, and it keeps up only if every run does. With R runs the
//! chance that a further run falls outside the range is 2 / (R + 1): a range, not a
//! confidence interval of the mean. A margin M is applied by the caller, who plans the
//! system at (1 + M) × its trigger rate ([`at_margin`]); it is recorded here.

use serde::Serialize;

use crate::offered::{plan, Planned, Spread, System};

/// The most replications a point may have.
pub const MAX_REPLICATIONS: u32 = 100;

/// A figure's range over the replications.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Interval {
    pub lo: f64,
    pub hi: f64,
}

impl Interval {
    fn of(vals: impl Iterator<Item = f64>) -> Interval {
        let (lo, hi) = vals.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
        if lo > hi {
            Interval::default()
        } else {
            Interval { lo, hi }
        }
    }

    pub fn contains(&self, v: f64) -> bool {
        self.lo <= v && v <= self.hi
    }
}

/// What the replications of a point say, beside their mean figures in [`Planned`].
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Confidence {
    pub replications: u32,
    /// Replications that kept up: the point keeps up only if all did.
    pub kept_up: u32,
    /// The headroom asked for: every replication ran at (1 + margin) × the file's rate.
    pub margin: f64,
    /// Each replication's seed.
    pub seeds: Vec<u64>,
    /// How the intervals are made.
    pub interval: &'static str,
    pub built_hz: Interval,
    pub built_gbps: Interval,
    pub bu_link_busy: Interval,
    pub throttled: Interval,
    pub latency_p50_us: Interval,
    pub latency_p99_us: Interval,
    pub latency_p999_us: Interval,
    pub ru_mem_p99_bytes: Interval,
    pub bu_mem_p99_bytes: Interval,
}

/// `s` at (1 + `margin`) × its trigger rate, checked as a file's system is.
pub fn at_margin(s: &System, margin: f64) -> Result<System, String> {
    if !(0.0..=100.0).contains(&margin) {
        return Err(format!(
            "--margin {margin}: from 0 to 100 (0.2: keep up at 1.2 × trigger_hz)"
        ));
    }
    let mut m = s.clone();
    m.trigger_hz *= 1.0 + margin;
    m.validate()
        .map_err(|e| format!("trigger_hz × (1 + margin) = {}: {e}", m.trigger_hz))?;
    Ok(m)
}

/// The `r` replications of `s`: the same system with seeds `seed`, `seed + 1`, ...
pub fn replicas(s: &System, r: u32) -> Vec<System> {
    (0..r.max(1) as u64)
        .map(|k| System {
            seed: s.seed.wrapping_add(k),
            ..s.clone()
        })
        .collect()
}

/// The replications' runs of one system as one point: the mean of each figure, the
/// verdict of all, and the ranges. `None` without runs.
pub fn combine(runs: &[Planned], margin: f64) -> Option<Planned> {
    let first = runs.first()?;
    let n = runs.len() as f64;
    let mean = |f: &dyn Fn(&Planned) -> f64| runs.iter().map(f).sum::<f64>() / n;
    let range = |f: &dyn Fn(&Planned) -> f64| Interval::of(runs.iter().map(f));
    let spread = |f: &dyn Fn(&Planned) -> &Spread| Spread {
        mean: mean(&|p| f(p).mean),
        p50: mean(&|p| f(p).p50),
        p99: mean(&|p| f(p).p99),
        p999: mean(&|p| f(p).p999),
        max: runs.iter().map(|p| f(p).max).fold(0.0, f64::max),
    };
    let kept_up = runs.iter().filter(|p| p.keeps_up).count() as u32;
    let confidence = Confidence {
        replications: runs.len() as u32,
        kept_up,
        margin,
        seeds: runs.iter().map(|p| p.system.seed).collect(),
        interval: "min-max over the replications",
        built_hz: range(&|p| p.built_hz),
        built_gbps: range(&|p| p.built_gbps),
        bu_link_busy: range(&|p| p.bu_link_busy),
        throttled: range(&|p| p.throttled),
        latency_p50_us: range(&|p| p.latency_us.p50),
        latency_p99_us: range(&|p| p.latency_us.p99),
        latency_p999_us: range(&|p| p.latency_us.p999),
        ru_mem_p99_bytes: range(&|p| p.ru_buffer_bytes.p99),
        bu_mem_p99_bytes: range(&|p| p.bu_buffer_bytes.p99),
    };
    Some(Planned {
        system: first.system.clone(),
        offered_link_load: first.offered_link_load,
        built_hz: mean(&|p| p.built_hz),
        built_gbps: mean(&|p| p.built_gbps),
        bu_link_busy: mean(&|p| p.bu_link_busy),
        throttled: mean(&|p| p.throttled),
        keeps_up: kept_up == runs.len() as u32,
        latency_us: spread(&|p| &p.latency_us),
        ru_buffer_bytes: spread(&|p| &p.ru_buffer_bytes),
        bu_buffer_bytes: spread(&|p| &p.bu_buffer_bytes),
        events_measured: runs.iter().map(|p| p.events_measured).sum(),
        confidence: Some(confidence),
    })
}

/// `s` over `r` replications, one after the other (a caller with cores runs
/// [`replicas`] in parallel and [`combine`]s them).
pub fn plan_replicated(s: &System, r: u32, margin: f64) -> Planned {
    let runs: Vec<Planned> = replicas(s, r).iter().map(plan).collect();
    combine(&runs, margin).unwrap_or_else(|| plan(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 8 × 8 at 10 Gb/s, 10 kB fragments of varying size under Poisson triggers.
    fn stochastic(load: f64, trigger: &str) -> System {
        // a BU's link carries 8 × 10 kB per event it builds: 8 BUs at 10 Gb/s keep up to
        // 8 × 10e9 / 8 / 80e3 = 125 kHz
        System {
            name: "8x8".into(),
            rus: 8,
            bus: 8,
            link_gbps: 10.0,
            link_efficiency: 1.0,
            trigger_hz: load * 125e3,
            trigger: trigger.into(),
            fragment_bytes: 10e3,
            fragment_sd_bytes: if trigger == "poisson" { 3e3 } else { 0.0 },
            credits: 64,
            build_us: 0.0,
            hop_us: 1.0,
            events: 4000,
            seed: 11,
            ..System::default()
        }
    }

    /// A figure of a run.
    type Of = dyn Fn(&Planned) -> f64;

    #[test]
    fn replications_with_different_seeds_spread_and_the_range_holds_each() {
        let s = stochastic(0.7, "poisson");
        let runs: Vec<Planned> = replicas(&s, 3).iter().map(plan).collect();
        let seeds: Vec<u64> = runs.iter().map(|p| p.system.seed).collect();
        assert_eq!(seeds, [11, 12, 13]);
        let p = combine(&runs, 0.0).unwrap();
        let c = p.confidence.as_ref().unwrap();
        assert_eq!((c.replications, c.kept_up), (3, 3), "{c:?}");
        assert!(p.keeps_up);
        // a stochastic system: the seeds give different tails
        assert!(c.latency_p99_us.hi > c.latency_p99_us.lo, "{c:?}");
        assert!(c.ru_mem_p99_bytes.hi > c.ru_mem_p99_bytes.lo, "{c:?}");
        // every replication's figure, and the mean, inside its range
        let checks: [(&str, Interval, &Of); 6] = [
            ("p50", c.latency_p50_us, &|p| p.latency_us.p50),
            ("p99", c.latency_p99_us, &|p| p.latency_us.p99),
            ("p99.9", c.latency_p999_us, &|p| p.latency_us.p999),
            ("RU mem", c.ru_mem_p99_bytes, &|p| p.ru_buffer_bytes.p99),
            ("BU mem", c.bu_mem_p99_bytes, &|p| p.bu_buffer_bytes.p99),
            ("BU link", c.bu_link_busy, &|p| p.bu_link_busy),
        ];
        for (name, iv, f) in checks {
            for r in runs.iter().chain([&p]) {
                assert!(iv.contains(f(r)), "{name}: {} outside {iv:?}", f(r));
            }
        }
        // the same seeds give the same point
        assert_eq!(plan_replicated(&s, 3, 0.0).confidence, p.confidence);
    }

    #[test]
    fn a_margin_fails_a_system_that_keeps_up_just_under_the_limit() {
        // periodic triggers at 99.5 % of the links: every replication keeps up, with no
        // headroom; asked for 5 % more triggers (104.5 %), none does
        let s = stochastic(0.995, "periodic");
        assert!((s.link_load() - 0.995).abs() < 1e-9);
        let bare = plan_replicated(&s, 3, 0.0);
        assert!(bare.keeps_up, "{bare:?}");
        let m = at_margin(&s, 0.05).unwrap();
        assert!((m.trigger_hz / s.trigger_hz - 1.05).abs() < 1e-12);
        let with = plan_replicated(&m, 3, 0.05);
        let c = with.confidence.as_ref().unwrap();
        assert!(!with.keeps_up, "{with:?}");
        assert_eq!(c.kept_up, 0, "{c:?}");
        assert_eq!(c.margin, 0.05);
        assert!(at_margin(&s, -0.1).is_err());
    }

    #[test]
    fn one_bad_replication_is_enough_to_say_no() {
        let s = stochastic(0.5, "poisson");
        let mut runs: Vec<Planned> = replicas(&s, 3).iter().map(plan).collect();
        runs[1].keeps_up = false;
        let p = combine(&runs, 0.0).unwrap();
        assert!(!p.keeps_up);
        assert_eq!(p.confidence.unwrap().kept_up, 2);
        assert!(combine(&[], 0.0).is_none());
    }
}

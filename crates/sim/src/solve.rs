//! The planner's "how many" (`evb sim --system FILE --solve bus|link_gbps`): the fewest BUs,
//! or the slowest links, for which a system keeps up with a margin.
//!
//! The margin m asks for headroom: the answer must keep up at (1 + m) × the file's
//! `trigger_hz`, and every figure reported is at that rate. The search runs [`plan`] only:
//! a bound from the links' load (below it the model says no system keeps up), then
//! candidates growing geometrically from it until one keeps up, then a search between the
//! last that did not and the first that did until they are neighbours: BUs one apart,
//! link rates 1 % apart (on a grid of 4 significant digits, so that `--set link_gbps=`
//! the answer gives its row again). Each round evaluates a fixed number of candidates
//! ([`ROUND`]), in parallel where the caller can: the answer does not depend on the
//! machine's cores.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;

use crate::offered::{Planned, System};

/// The most BUs a system may have (`System::validate`).
pub const MAX_BUS: usize = 4096;
/// The fastest link a system may have (Gb/s, `System::validate`).
pub const MAX_LINK_GBPS: f64 = 1e5;
/// Candidates evaluated per round of the search.
pub const ROUND: usize = 4;
/// The link rate's resolution: neighbours on its grid are this factor apart.
const STEP: f64 = 1.01;

/// The key solved for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Key {
    /// Builder units.
    Bus,
    /// Each node's link rate (Gb/s).
    LinkGbps,
}

impl Key {
    /// The key as the system's file names it.
    pub fn parse(s: &str) -> Option<Key> {
        match s {
            "bus" => Some(Key::Bus),
            "link_gbps" => Some(Key::LinkGbps),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Key::Bus => "bus",
            Key::LinkGbps => "link_gbps",
        }
    }

    /// `s` with the key set to `v`.
    pub fn set(self, s: &System, v: f64) -> System {
        let mut s = s.clone();
        match self {
            Key::Bus => s.bus = v as usize,
            Key::LinkGbps => s.link_gbps = v,
        }
        s
    }

    /// The key's value in `s`.
    pub fn of(self, s: &System) -> f64 {
        match self {
            Key::Bus => s.bus as f64,
            Key::LinkGbps => s.link_gbps,
        }
    }

    /// A value as it reads: BUs whole, link rates to 4 significant digits.
    pub fn text(self, v: f64) -> String {
        match self {
            Key::Bus => format!("{v:.0}"),
            Key::LinkGbps => {
                let decimals = (3 - v.log10().floor() as i32).max(0) as usize;
                format!("{v:.decimals$}")
            }
        }
    }
}

/// What one BU more or fewer than the answer changes, relative to the answer (0.1: 10 %
/// more; the memory is one RU's and one BU's p99).
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    pub bus: usize,
    pub latency_p50: f64,
    pub latency_p99: f64,
    pub ru_mem_p99: f64,
    pub bu_mem_p99: f64,
}

/// What a row of a solve is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The value below the answer (one BU fewer, a link 1 % slower, or at its first step
    /// the rate the links' load reaches 1 at, floored): it does not keep up.
    Below,
    /// The least value that keeps up.
    Answer,
    /// The answer with one BU fewer (solving a link rate: for BUs it is the row below).
    OneBuFewer,
    /// The answer with one BU more.
    OneBuMore,
}

/// A row of a solve: a system simulated at the margin's rate.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub role: Role,
    pub planned: Planned,
}

/// The answer of a solve.
#[derive(Debug, Clone, Serialize)]
pub struct Solved {
    pub key: Key,
    pub margin: f64,
    /// The file's trigger rate (Hz).
    pub trigger_hz: f64,
    /// The rate every row is simulated at: (1 + margin) × trigger_hz.
    pub solved_at_hz: f64,
    /// The least value of the key that keeps up.
    pub value: f64,
    /// The next value down, which does not keep up; none where the answer is one BU.
    pub below: Option<f64>,
    /// The rows in order of the key and then of BUs: below (if any), the answer, one BU
    /// fewer (solving a link rate) and one more, each with its system.
    pub rows: Vec<Row>,
    /// What one BU fewer and one more than the answer change.
    pub changes: Vec<Change>,
    /// Systems simulated.
    pub evaluated: usize,
}

impl Solved {
    /// The row of a role, if there is one.
    pub fn row(&self, role: Role) -> Option<&Planned> {
        self.rows
            .iter()
            .find(|r| r.role == role)
            .map(|r| &r.planned)
    }
}

/// Runs systems, in parallel where it can; the results in order.
pub type Eval<'a> = &'a (dyn Fn(&[System]) -> Vec<Planned> + Sync);

/// The least value of `key` for which `s` keeps up at (1 + `margin`) × its trigger rate, or
/// why there is none within the model's bounds.
pub fn solve(s: &System, key: Key, margin: f64, eval: Eval) -> Result<Solved, String> {
    if !(0.0..=100.0).contains(&margin) {
        return Err(format!("margin {margin}: from 0 to 100"));
    }
    let mut at = s.clone();
    at.trigger_hz = s.trigger_hz * (1.0 + margin);
    at.validate()
        .map_err(|e| format!("trigger_hz × (1 + margin) = {}: {e}", at.trigger_hz))?;
    let grid = Grid::new(&at, key)?;
    let count = AtomicUsize::new(0);
    let eval = |systems: &[System]| {
        count.fetch_add(systems.len(), Ordering::Relaxed);
        eval(systems)
    };
    let mut seen: BTreeMap<u64, Planned> = BTreeMap::new();
    let run = |idx: &[u64], seen: &mut BTreeMap<u64, Planned>| {
        let todo: Vec<u64> = idx
            .iter()
            .copied()
            .filter(|i| !seen.contains_key(i))
            .collect();
        let systems: Vec<System> = todo.iter().map(|&i| key.set(&at, grid.value(i))).collect();
        seen.extend(todo.into_iter().zip(eval(&systems)));
    };
    let (lo, hi) = bracket(&grid, &mut seen, &run)?;
    let (lo, hi) = narrow(lo, hi, &mut seen, &run);
    // below the least BU there is none; below the least link rate, the full load's
    let below = (lo >= 1 || key == Key::LinkGbps).then_some(lo);
    let rows = rows_around(key, below, hi, &mut seen, &run, &eval);
    let answer = &rows[usize::from(below.is_some())].planned;
    let changes = rows
        .iter()
        .map(|r| &r.planned)
        .filter(|p| p.system.bus.abs_diff(answer.system.bus) == 1)
        .filter(|p| p.system.link_gbps == answer.system.link_gbps)
        .map(|p| change(answer, p))
        .collect();
    Ok(Solved {
        key,
        margin,
        trigger_hz: s.trigger_hz,
        solved_at_hz: at.trigger_hz,
        value: grid.value(hi),
        below: below.map(|i| grid.value(i)),
        rows,
        changes,
        evaluated: count.into_inner(),
    })
}

/// The rows of an answer at index `hi`: the index below (if any), the answer, and the
/// answer's system with a BU fewer (unless that is the row below) and one more.
fn rows_around(
    key: Key,
    below: Option<u64>,
    hi: u64,
    seen: &mut BTreeMap<u64, Planned>,
    run: Run,
    eval: Eval,
) -> Vec<Row> {
    let mut wanted: Vec<u64> = below.into_iter().chain([hi]).collect();
    if key == Key::Bus && (hi as usize) < MAX_BUS {
        wanted.push(hi + 1);
    }
    run(&wanted, seen);
    let row = |role, i| Row {
        role,
        planned: seen[&i].clone(),
    };
    let mut rows: Vec<Row> = below.map(|i| row(Role::Below, i)).into_iter().collect();
    rows.push(row(Role::Answer, hi));
    match key {
        Key::Bus if (hi as usize) < MAX_BUS => rows.push(row(Role::OneBuMore, hi + 1)),
        Key::Bus => {}
        Key::LinkGbps => rows.extend(bus_either_side(&seen[&hi].system, eval)),
    }
    rows
}

/// `s` with one BU fewer (if it has more than one) and one more (within the bound).
fn bus_either_side(s: &System, eval: Eval) -> Vec<Row> {
    let either: Vec<(Role, usize)> = [(Role::OneBuFewer, s.bus - 1), (Role::OneBuMore, s.bus + 1)]
        .into_iter()
        .filter(|&(_, b)| (1..=MAX_BUS).contains(&b))
        .collect();
    let systems: Vec<System> = either
        .iter()
        .map(|&(_, b)| Key::Bus.set(s, b as f64))
        .collect();
    either
        .into_iter()
        .zip(eval(&systems))
        .map(|((role, _), planned)| Row { role, planned })
        .collect()
}

/// The values a key is searched over, by index: BUs themselves, or link rates 1 % apart.
struct Grid {
    key: Key,
    /// The least index the model's bound leaves (the one below is known not to keep up).
    from: u64,
    /// The greatest index within the key's bound.
    to: u64,
    /// Link rates: the rate at which the busiest link's load is exactly 1 (Gb/s).
    full_gbps: f64,
}

impl Grid {
    fn new(at: &System, key: Key) -> Result<Grid, String> {
        let rate = at.trigger_hz;
        match key {
            Key::Bus => {
                // an RU's link carries its fragment of every event, whatever the BUs
                let ru = at.ru_link_load();
                if ru >= 1.0 {
                    return Err(format!(
                        "no number of BUs keeps up at {rate:.0} Hz: each RU's link would be \
                         {:.1} % loaded by its fragments alone, so more BUs cannot help \
                         (faster links can: --solve link_gbps)",
                        ru * 100.0
                    ));
                }
                // with one BU the BU's link carries every fragment: b BUs share that load
                let one = Key::Bus.set(at, 1.0).link_load();
                let from = one.floor() as u64 + 1;
                if from as usize > MAX_BUS {
                    return Err(format!(
                        "no number of BUs up to {MAX_BUS} keeps up at {rate:.0} Hz: the BUs' \
                         links alone need more than {} of them",
                        from - 1
                    ));
                }
                Ok(Grid {
                    key,
                    from,
                    to: MAX_BUS as u64,
                    full_gbps: 0.0,
                })
            }
            Key::LinkGbps => {
                // the load is inversely proportional to the link rate
                let full_gbps = at.link_gbps * at.link_load();
                let mut g = Grid {
                    key,
                    from: 1,
                    to: ((MAX_LINK_GBPS / full_gbps).ln() / STEP.ln())
                        .floor()
                        .max(0.0) as u64,
                    full_gbps,
                };
                // rounding may lift the last value over the bound
                while g.to >= 1 && g.value(g.to) > MAX_LINK_GBPS {
                    g.to -= 1;
                }
                if g.to < 1 {
                    return Err(format!(
                        "no link up to {MAX_LINK_GBPS} Gb/s keeps up at {rate:.0} Hz: the \
                         busiest link needs {full_gbps:.0} Gb/s"
                    ));
                }
                Ok(g)
            }
        }
    }

    /// The key's value at index `i`. Link rates: index 0 is just below the full load (the
    /// model's bound: it does not keep up), the others on a 1 % grid above it, each to 4
    /// significant digits.
    fn value(&self, i: u64) -> f64 {
        match self.key {
            Key::Bus => i as f64,
            Key::LinkGbps if i == 0 => sig4(self.full_gbps * (1.0 - 1e-9), f64::floor),
            Key::LinkGbps => sig4(self.full_gbps * STEP.powi(i as i32), f64::round),
        }
    }
}

/// `x` to 4 significant digits, by `to` (rounded, or floored to stay below a bound).
fn sig4(x: f64, to: fn(f64) -> f64) -> f64 {
    let scale = 10f64.powi(3 - x.log10().floor() as i32);
    to(x * scale) / scale
}

/// Evaluates the indices not yet seen, into what was seen.
type Run<'a> = &'a dyn Fn(&[u64], &mut BTreeMap<u64, Planned>);

/// Candidates growing geometrically from the grid's first, [`ROUND`] a round, until one
/// keeps up: (the last that did not, the first that did). The last that did not is the
/// index below the grid's first where every candidate kept up.
fn bracket(g: &Grid, seen: &mut BTreeMap<u64, Planned>, run: Run) -> Result<(u64, u64), String> {
    let mut lo = g.from - 1;
    let mut next = 0u32;
    loop {
        let idx: Vec<u64> = (next..next + ROUND as u32)
            .map(|k| g.from.saturating_add((1u64 << k.min(62)) - 1).min(g.to))
            .filter(|&i| i > lo)
            .fold(Vec::new(), |mut v, i| {
                if v.last() != Some(&i) {
                    v.push(i);
                }
                v
            });
        if idx.is_empty() {
            return Err(nothing_keeps_up(g, seen.get(&lo)));
        }
        run(&idx, seen);
        for &i in &idx {
            if seen[&i].keeps_up {
                return Ok((lo, i));
            }
            lo = i;
        }
        next += ROUND as u32;
    }
}

/// Why not even the key's bound keeps up, from its row.
fn nothing_keeps_up(g: &Grid, last: Option<&Planned>) -> String {
    let (what, bound) = match g.key {
        Key::Bus => ("number of BUs", format!("{MAX_BUS}")),
        Key::LinkGbps => ("link rate", format!("{MAX_LINK_GBPS} Gb/s")),
    };
    let why = match last {
        Some(p) if p.throttled >= 1e-3 => format!(
            "; at the bound {:.3} % of the triggers are throttled (every BU's credits in use: \
             more credits per BU can help)",
            p.throttled * 100.0
        ),
        Some(p) if p.offered_link_load >= 1.0 => format!(
            "; at the bound the busiest link is {:.1} % loaded",
            p.offered_link_load * 100.0
        ),
        Some(_) => "; at the bound the latency still grows".to_string(),
        None => String::new(),
    };
    format!("no {what} up to {bound} keeps up{why}")
}

/// Between a bracket's ends until they are neighbours, [`ROUND`] evenly spaced candidates a
/// round. Each round keeps the least candidate that kept up and the greatest below it that
/// did not, so the answer always keeps up and the index below it never did.
fn narrow(mut lo: u64, mut hi: u64, seen: &mut BTreeMap<u64, Planned>, run: Run) -> (u64, u64) {
    while hi - lo > 1 {
        let mut idx: Vec<u64> = (1..=ROUND as u64)
            .map(|k| lo + (hi - lo) * k / (ROUND as u64 + 1))
            .filter(|&i| i > lo && i < hi)
            .collect();
        idx.dedup();
        run(&idx, seen);
        let first = idx.iter().copied().find(|i| seen[i].keeps_up);
        if let Some(f) = first {
            hi = f;
        }
        if let Some(&l) = idx.iter().rev().find(|&&i| i < hi && !seen[&i].keeps_up) {
            lo = l;
        }
    }
    (lo, hi)
}

/// `other` relative to `answer`.
fn change(answer: &Planned, other: &Planned) -> Change {
    let rel = |a: f64, b: f64| if a > 0.0 { b / a - 1.0 } else { 0.0 };
    Change {
        bus: other.system.bus,
        latency_p50: rel(answer.latency_us.p50, other.latency_us.p50),
        latency_p99: rel(answer.latency_us.p99, other.latency_us.p99),
        ru_mem_p99: rel(answer.ru_buffer_bytes.p99, other.ru_buffer_bytes.p99),
        bu_mem_p99: rel(answer.bu_buffer_bytes.p99, other.bu_buffer_bytes.p99),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offered::plan;

    fn serial(systems: &[System]) -> Vec<Planned> {
        systems.iter().map(plan).collect()
    }

    /// 4 RUs of 10 kB fragments on 100 Gb/s links, a single credit per BU held 50 µs past
    /// the last fragment: the credits, not the links, set how many BUs it takes (the links
    /// alone would need 4 at 120 kHz), so the search has to find it.
    fn credit_bound() -> System {
        System {
            name: "credit-bound".into(),
            rus: 4,
            bus: 4,
            link_gbps: 100.0,
            link_efficiency: 1.0,
            trigger_hz: 100e3,
            trigger: "poisson".into(),
            fragment_bytes: 10e3,
            fragment_sd_bytes: 5e3,
            credits: 1,
            build_us: 50.0,
            hop_us: 1.0,
            events: 4_000,
            seed: 5,
            ..System::default()
        }
    }

    /// `s` at the rate a margin asks for, with `key` set to `v`.
    fn at(s: &System, margin: f64, key: Key, v: f64) -> System {
        let mut s = key.set(s, v);
        s.trigger_hz *= 1.0 + margin;
        s
    }

    #[test]
    fn the_fewest_bus_keep_up_at_the_margin_and_one_fewer_do_not() {
        let s = credit_bound();
        let got = solve(&s, Key::Bus, 0.2, &serial).unwrap();
        assert_eq!(got.solved_at_hz, 120e3);
        let n = got.value;
        assert!(n > 5.0, "the credits need more BUs than the links: {got:?}");
        // checked afresh, not from the solver's rows
        assert!(plan(&at(&s, 0.2, Key::Bus, n)).keeps_up, "{n} BUs");
        assert!(
            !plan(&at(&s, 0.2, Key::Bus, n - 1.0)).keeps_up,
            "{} BUs",
            n - 1.0
        );
        assert_eq!(got.below, Some(n - 1.0));
        let roles: Vec<Role> = got.rows.iter().map(|r| r.role).collect();
        assert_eq!(roles, [Role::Below, Role::Answer, Role::OneBuMore]);
        assert_eq!(got.changes.len(), 2);
        // one BU more holds no more events per BU: its latency is no worse
        let more = got.row(Role::OneBuMore).unwrap();
        assert!(more.latency_us.p99 <= got.row(Role::Answer).unwrap().latency_us.p99 * 1.05);
        // a margin asks for at least as many
        let none = solve(&s, Key::Bus, 0.0, &serial).unwrap();
        assert!(none.value <= n, "{} > {n}", none.value);
    }

    #[test]
    fn the_slowest_link_keeps_up_and_one_step_slower_does_not() {
        // 8 credits: the links set the answer, near where their load is 1
        let s = System {
            credits: 8,
            build_us: 0.0,
            ..credit_bound()
        };
        let got = solve(&s, Key::LinkGbps, 0.5, &serial).unwrap();
        let (v, below) = (got.value, got.below.unwrap());
        assert!(plan(&at(&s, 0.5, Key::LinkGbps, v)).keeps_up, "{v} Gb/s");
        assert!(
            !plan(&at(&s, 0.5, Key::LinkGbps, below)).keeps_up,
            "{below} Gb/s"
        );
        // 1 % apart, but for the 4 digits the one below is floored to
        assert!(v / below <= STEP * 1.002, "{below} to {v}: not 1 % apart");
        // 150 kHz × 4 × 10 kB × 8 / 4 BUs = 12 Gb/s per BU link
        assert!(v > 12.0 && v < 24.0, "{v}");
        let roles: Vec<Role> = got.rows.iter().map(|r| r.role).collect();
        assert_eq!(
            roles,
            [Role::Below, Role::Answer, Role::OneBuFewer, Role::OneBuMore]
        );
        assert_eq!(got.row(Role::OneBuMore).unwrap().system.link_gbps, v);
    }

    #[test]
    fn saturated_ru_links_are_refused_with_the_reason() {
        // each RU sends 12 Gb/s at 150 kHz: a 10 Gb/s link cannot, whatever the BUs
        let s = System {
            link_gbps: 10.0,
            ..credit_bound()
        };
        let e = solve(&s, Key::Bus, 0.5, &serial).unwrap_err();
        assert!(
            e.contains("RU's link") && e.contains("more BUs cannot help"),
            "{e}"
        );
        // credits that cannot keep up at any link rate: a BU's one event takes a second
        let slow = System {
            build_us: 1e6,
            bus: 1,
            ..credit_bound()
        };
        let e = solve(&slow, Key::LinkGbps, 0.0, &serial).unwrap_err();
        assert!(e.contains("no link rate") && e.contains("throttled"), "{e}");
        assert!(solve(&s, Key::Bus, -0.1, &serial).is_err());
    }
}

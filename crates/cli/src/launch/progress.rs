//! The live progress line of `evb run`: built events and rates from the latest status lines.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use evb_builder::{NodeStatus, RoleStats, RunState};

/// What the run is to do: `run.events` (0: no limit) and `run.duration_s` (0: none).
#[derive(Debug, Clone, Copy)]
pub(super) struct Target {
    pub events: u64,
    pub duration_s: f64,
}

/// Live figures from the latest status lines. Events built are the EVM's ledger's (released:
/// final), not the BUs' sum, which a BU's restart sets back; with a target, the share done
/// and the time left.
pub(super) fn progress_line(
    latest: &BTreeMap<String, Box<NodeStatus>>,
    rate: &mut RateMeter,
    target: Target,
) -> String {
    let mut built_by_bus = 0u64;
    let mut released = None;
    let mut running = false;
    let mut bytes = 0u64;
    let mut in_flight = 0u64;
    let mut credits = 0u64;
    let mut triggered = 0u64;
    // RUs fed by front-ends name the streams they wait for
    let mut waiting = Vec::new();
    for v in latest.values() {
        match &v.stats {
            RoleStats::Ru(s) => {
                for w in &s.waiting_for {
                    waiting.push(format!("{} {w}", v.node));
                }
            }
            RoleStats::Bu(s) => {
                built_by_bus += s.events_built;
                bytes += s.payload_bytes_built;
            }
            RoleStats::Evm(s) => {
                in_flight = s.in_flight;
                credits = s.credits_available;
                triggered = s.triggered;
                released = Some(s.released);
                running = v.state == RunState::Running;
            }
        }
    }
    let built = released.unwrap_or(built_by_bus);
    let (ev_rate, byte_rate) = rate.update(built, bytes);
    if running {
        rate.started.get_or_insert_with(Instant::now);
    }
    // nodes report at slightly different moments: never show more built than triggered
    let triggered = triggered.max(built);
    let mut line = format!("built {built}");
    if target.events > 0 {
        let pct = 100.0 * built as f64 / target.events as f64;
        line += &format!(" of {} ({pct:.0} %", target.events);
        let left = target.events.saturating_sub(built);
        if left > 0 && ev_rate > 0.0 {
            line += &format!(", {} left", eta(left as f64 / ev_rate));
        }
        line += ")";
    }
    if target.duration_s > 0.0 {
        if let Some(t0) = rate.started {
            let done = t0.elapsed().as_secs_f64().min(target.duration_s);
            line += &format!(" | {done:.0} of {:.0} s", target.duration_s);
        }
    }
    line += &format!(
        " | triggered {triggered} | {ev_rate:.0} ev/s | {:.2} GB/s | in flight {in_flight} | credits free {credits}",
        byte_rate / 1e9
    );
    if !waiting.is_empty() {
        line += &format!(" | waiting for {}", waiting.join("; "));
    }
    line
}

/// `secs` as a short time left: `42 s`, `3 min 5 s`, `2 h 10 min`.
fn eta(secs: f64) -> String {
    let s = secs.round() as u64;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

/// Rates over the last second or so.
pub(super) struct RateMeter {
    last: Option<(Instant, u64, u64)>,
    ev: f64,
    by: f64,
    /// When the EVM was first seen running.
    started: Option<Instant>,
}

impl RateMeter {
    pub(super) fn new() -> RateMeter {
        RateMeter {
            last: None,
            ev: 0.0,
            by: 0.0,
            started: None,
        }
    }

    fn update(&mut self, events: u64, bytes: u64) -> (f64, f64) {
        let now = Instant::now();
        match self.last {
            Some((t, e, b)) if now.duration_since(t) >= Duration::from_millis(500) => {
                let dt = now.duration_since(t).as_secs_f64();
                self.ev = events.saturating_sub(e) as f64 / dt;
                self.by = bytes.saturating_sub(b) as f64 / dt;
                self.last = Some((now, events, bytes));
            }
            None => self.last = Some((now, events, bytes)),
            _ => {}
        }
        (self.ev, self.by)
    }
}

/// Past the start of a BU's run, this long, its counts are steady state (its first Assigns,
/// slow start and first pages are behind it).
pub(crate) const STEADY_AFTER_S: f64 = 1.0;
/// The least span of steady-state counts a BU must have for a rate.
const STEADY_SPAN_S: f64 = 0.5;

/// Events built per second in steady state: each BU's own counts and clock from its status
/// lines while the run runs, from [`STEADY_AFTER_S`] after its first running line to its
/// last, summed over the BUs. The whole run's rate (`evb run`'s summary) counts the start
/// too, where LSEB and other builders report their steady state.
#[derive(Default)]
pub(super) struct SteadyRate {
    /// Per BU: when it was first seen running, and its first and last steady (t, built).
    bus: BTreeMap<String, SteadyBu>,
}

#[derive(Default)]
struct SteadyBu {
    running_since: f64,
    first: Option<(f64, u64)>,
    last: Option<(f64, u64)>,
}

impl SteadyRate {
    /// A status line of node `node`: counted when it is a BU's while the run runs.
    pub(super) fn note(&mut self, v: &NodeStatus) {
        if let (RoleStats::Bu(s), RunState::Running) = (&v.stats, v.state) {
            self.note_bu(&v.node, v.t, s.events_built);
        }
    }

    /// BU `node` had built `built` events at `t` seconds of its own clock, running.
    fn note_bu(&mut self, node: &str, t: f64, built: u64) {
        let b = self
            .bus
            .entry(node.to_string())
            .or_insert_with(|| SteadyBu {
                running_since: t,
                ..SteadyBu::default()
            });
        if t < b.running_since + STEADY_AFTER_S {
            return;
        }
        b.first.get_or_insert((t, built));
        b.last = Some((t, built));
    }

    /// Events per second over all BUs, or `None` when a BU that ran has no steady span (a
    /// run shorter than about 1.5 s, or a BU lost early).
    pub(super) fn rate(&self) -> Option<f64> {
        if self.bus.is_empty() {
            return None;
        }
        self.bus
            .values()
            .map(|b| match (b.first, b.last) {
                (Some((t0, n0)), Some((t1, n1))) if t1 - t0 >= STEADY_SPAN_S => {
                    Some(n1.saturating_sub(n0) as f64 / (t1 - t0))
                }
                _ => None,
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_reads_as_a_person_says_it() {
        assert_eq!(eta(0.4), "0 s");
        assert_eq!(eta(42.0), "42 s");
        assert_eq!(eta(185.0), "3 min 5 s");
        assert_eq!(eta(7800.0), "2 h 10 min");
    }

    #[test]
    fn the_steady_rate_leaves_out_each_bus_start_and_sums_the_bus() {
        let mut r = SteadyRate::default();
        assert_eq!(r.rate(), None, "no BU seen");
        // bu0 starts at its t = 10 s, slowly for a second, then 1,000 events/s;
        // bu1 on a clock of its own, 500 events/s throughout
        for k in 0..=40 {
            let t = k as f64 * 0.1;
            let bu0 = if t < 1.0 {
                10 * k
            } else {
                100 + 1000 * (k - 10) / 10
            };
            r.note_bu("bu0", 10.0 + t, bu0 as u64);
            r.note_bu("bu1", 3.0 + t, 50 * k as u64);
        }
        let rate = r.rate().unwrap();
        assert!((rate - 1500.0).abs() < 1e-6, "{rate}");
        // a BU with less than half a second past its start gives no rate at all
        r.note_bu("bu2", 0.0, 0);
        r.note_bu("bu2", 1.2, 100);
        assert_eq!(r.rate(), None);
    }
}

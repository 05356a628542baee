//! The live progress line of `evb run`: built events and rates from the latest status lines.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use evb_builder::{NodeStatus, RoleStats};

/// Live figures from the latest status lines.
pub(super) fn progress_line(
    latest: &BTreeMap<String, Box<NodeStatus>>,
    rate: &mut RateMeter,
) -> String {
    let mut built = 0u64;
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
                built += s.events_built;
                bytes += s.payload_bytes_built;
            }
            RoleStats::Evm(s) => {
                in_flight = s.in_flight;
                credits = s.credits_available;
                triggered = s.triggered;
            }
        }
    }
    let (ev_rate, byte_rate) = rate.update(built, bytes);
    // nodes report at slightly different moments: never show more built than triggered
    let triggered = triggered.max(built);
    let mut line = format!(
        "built {built} of {triggered} events | {ev_rate:.0} ev/s | {:.2} GB/s | in flight {in_flight} | credits free {credits}",
        byte_rate / 1e9
    );
    if !waiting.is_empty() {
        line += &format!(" | waiting for {}", waiting.join("; "));
    }
    line
}

/// Rates over the last second or so.
pub(super) struct RateMeter {
    last: Option<(Instant, u64, u64)>,
    ev: f64,
    by: f64,
}

impl RateMeter {
    pub(super) fn new() -> RateMeter {
        RateMeter {
            last: None,
            ev: 0.0,
            by: 0.0,
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

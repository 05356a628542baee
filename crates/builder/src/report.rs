//! The end-of-run report and the verdict: every triggered event built exactly once,
//! complete, with valid checksums.

use serde::{Deserialize, Serialize};

use crate::action::RunState;
use crate::{BuStats, EvmStats, RuStats};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunReport {
    pub state: RunState,
    /// Why the run was aborted, if it was.
    pub reason: Option<String>,
    pub n_ru: u16,
    pub n_bu: u16,
    /// From Start to the moment the last event was released.
    pub seconds: f64,
    /// Nodes lost during the run and not back at its end.
    #[serde(default)]
    pub down: Vec<String>,
    pub evm: EvmStats,
    /// Each node's own report, `None` if it never arrived.
    pub rus: Vec<Option<RuStats>>,
    pub bus: Vec<Option<BuStats>>,
}

/// Sum of ids 0..n, wrapping like the BUs' sums.
fn id_sum(n: u64) -> u64 {
    let (a, b) = if n.is_multiple_of(2) {
        (n / 2, n.wrapping_sub(1))
    } else {
        (n, (n - 1) / 2)
    };
    a.wrapping_mul(b)
}

/// Everything wrong with the run; empty means every triggered event was built exactly
/// once, complete and intact.
pub fn verdict(r: &RunReport) -> Vec<String> {
    let mut p = Vec::new();
    let t = r.evm.triggered;
    if let Some(why) = &r.reason {
        p.push(format!("run aborted: {why}"));
    }
    if r.evm.released != t {
        p.push(format!(
            "{} of {t} triggered events released",
            r.evm.released
        ));
    }
    for (what, n) in [
        ("duplicate releases", r.evm.duplicate_releases),
        ("releases of unknown events", r.evm.unknown_releases),
        ("releases from the wrong BU", r.evm.misrouted_releases),
        ("EVM protocol errors", r.evm.errors),
    ] {
        if n > 0 {
            p.push(format!("{n} {what}"));
        }
    }
    // Every release, by live BUs and by lost ones, must add up to exactly the triggered ids.
    let released: u64 = r.evm.released_by_bu.iter().sum::<u64>() + r.evm.released_by_lost;
    let sum = r
        .evm
        .released_id_sum_by_bu
        .iter()
        .fold(r.evm.released_id_sum_by_lost, |a, b| a.wrapping_add(*b));
    if released == t && sum != id_sum(t) {
        p.push(
            "released event ids do not match the triggered ones (lost and duplicated events)"
                .into(),
        );
    }
    let is_down = |node: String| r.down.contains(&node);
    for (i, b) in r.bus.iter().enumerate() {
        match b {
            None if is_down(format!("bu[{i}]")) => {}
            None => p.push(format!("bu[{i}] did not report")),
            Some(b) => {
                // What this BU's sink received is exactly what the EVM's ledger says it released.
                let (n, s) = (
                    r.evm.released_by_bu.get(i).copied().unwrap_or(0),
                    r.evm.released_id_sum_by_bu.get(i).copied().unwrap_or(0),
                );
                if b.events_built != n || b.event_id_sum != s {
                    p.push(format!(
                        "bu[{i}] built {} events but the ledger has {n} released by it",
                        b.events_built
                    ));
                }
                if b.output_lost > 0 {
                    p.push(format!(
                        "bu[{i}] lost {} events at its output (accepted, never acknowledged by a consumer)",
                        b.output_lost
                    ));
                }
                if !b.clean() {
                    p.push(format!("bu[{i}] saw errors: {}", b.errors_in_words()));
                }
            }
        }
    }
    for (i, ru) in r.rus.iter().enumerate() {
        match ru {
            None if is_down(format!("ru[{i}]")) => {}
            None => p.push(format!("ru[{i}] did not report")),
            Some(s) => {
                if !s.silent_streams.is_empty() {
                    p.push(format!(
                        "ru[{i}]: no fragment in the whole run from {}",
                        s.silent_streams.join(", ")
                    ));
                }
                if s.fragments_sent != t {
                    p.push(format!(
                        "ru[{i}] sent {} fragments for {t} events",
                        s.fragments_sent
                    ));
                }
                if s.retained != 0 {
                    p.push(format!("ru[{i}] still holds {} fragments", s.retained));
                }
                if s.errors != 0 {
                    p.push(format!("ru[{i}] saw {} protocol errors", s.errors));
                }
                // Built, but not as one event: a degraded run, never an unqualified OK.
                if s.sync_losses != 0 {
                    let n = s.sync_losses;
                    p.push(format!(
                        "ru[{i}]: {n} event{} flagged for sync loss (on_sync_loss = \"flag\": \
                         built with fragments whose trigger numbers disagree)",
                        if n == 1 { "" } else { "s" }
                    ));
                }
            }
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flagged_sync_losses_fail_the_verdict_naming_the_count() {
        let clean = RunReport {
            state: RunState::Halted,
            reason: None,
            n_ru: 1,
            n_bu: 0,
            seconds: 1.0,
            down: Vec::new(),
            evm: EvmStats::default(),
            rus: vec![Some(RuStats::default())],
            bus: Vec::new(),
        };
        assert!(verdict(&clean).is_empty(), "{:?}", verdict(&clean));
        let mut flagged = clean.clone();
        if let Some(Some(ru)) = flagged.rus.first_mut() {
            ru.sync_losses = 4584;
        }
        let v = verdict(&flagged);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].contains("ru[0]: 4584 events flagged for sync loss"),
            "{v:?}"
        );
    }

    #[test]
    fn a_bus_errors_are_named_in_words_not_dumped() {
        let b = crate::BuStats {
            crc_errors: 3,
            duplicate_fragments: 1,
            ..Default::default()
        };
        assert_eq!(b.errors_in_words(), "3 CRC errors, 1 duplicate fragments");
        let r = RunReport {
            state: RunState::Halted,
            reason: None,
            n_ru: 0,
            n_bu: 1,
            seconds: 1.0,
            down: Vec::new(),
            evm: EvmStats {
                released_by_bu: vec![0],
                released_id_sum_by_bu: vec![0],
                ..Default::default()
            },
            rus: Vec::new(),
            bus: vec![Some(b)],
        };
        let v = verdict(&r);
        assert!(
            v.iter()
                .any(|p| p == "bu[0] saw errors: 3 CRC errors, 1 duplicate fragments"),
            "{v:?}"
        );
        assert!(
            v.iter()
                .all(|p| !p.contains("BuStats") && !p.contains("Latency")),
            "{v:?}"
        );
    }

    #[test]
    fn id_sum_matches_the_loop() {
        for n in [0u64, 1, 2, 3, 10, 1001] {
            assert_eq!(id_sum(n), (0..n).sum::<u64>());
        }
    }
}

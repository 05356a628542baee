//! The end-of-run report and the verdict: every triggered event built exactly once,
//! complete, with valid checksums.

use serde::{Deserialize, Serialize};

use crate::action::{NodeRef, RunState};
use crate::{BuStats, EvmStats, RuStats};

/// Something that happened to a node during a run, as the EVM saw it: the entries of
/// `EvmStats::lost` (`evm.lost` in the EVM's status and report: docs/protocol.md §4, "The
/// EVM's report"; the losses themselves are §6's).
/// Whoever reads them (the launcher, the controller, metrics, `evb ctl`, the run page) reads
/// these fields, never the text.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NodeEvent {
    /// The node as the protocol names it: `"ru[0]"`, `"bu[1]"` (as in `down`).
    pub node: String,
    /// Seconds from the run's Start (0 before it).
    pub at_s: f64,
    pub kind: NodeEventKind,
    /// Why, in words; empty for a rejoin.
    pub reason: String,
}

/// What happened to the node of a [`NodeEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeEventKind {
    /// Lost while the run was on (its connection closed, its heartbeats stopped, or a data
    /// link to it broke): a BU's events are rebuilt by the others, an RU's loss follows
    /// `builder.on_ru_loss`.
    Lost,
    /// Lost after Stop, before its report reached the EVM.
    LostBeforeReport,
    /// A BU lost earlier came back (restarted) and was started and given events again.
    Rejoined,
    /// Its report came but was refused: not the fields of docs/protocol.md §4 ("Report body").
    ReportRefused,
    /// A BU the operator asked to retire: given no more events from then on.
    Retiring,
    /// A retiring BU left the run, every event it held final, its report in the run's.
    Retired,
    /// A retiring BU builds on: every other BU was lost before it was told Stop.
    RetireCalledOff,
    /// A spare BU (not in the run at its start) joined the run under way: started and
    /// given events from then on.
    Joined,
}

impl NodeEventKind {
    /// The node left the run ([`Lost`](Self::Lost) or
    /// [`LostBeforeReport`](Self::LostBeforeReport)); a rejoin or a refused report is no loss.
    pub fn is_loss(self) -> bool {
        matches!(self, Self::Lost | Self::LostBeforeReport)
    }
}

impl NodeEvent {
    pub fn new(node: NodeRef, at_s: f64, kind: NodeEventKind, reason: impl Into<String>) -> Self {
        NodeEvent {
            node: node.to_string(),
            at_s,
            kind,
            reason: reason.into(),
        }
    }

    /// This event is about `node`.
    pub fn is_about(&self, node: NodeRef) -> bool {
        self.node == node.to_string()
    }
}

/// The event in words, as the run's summary and `evb ctl` print it:
/// `bu[1] lost at 0.217 s: data link from ru[0] lost`, `bu[1] rejoined`.
impl std::fmt::Display for NodeEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (node, why) = (&self.node, &self.reason);
        match self.kind {
            NodeEventKind::Lost => write!(f, "{node} lost at {:.3} s: {why}", self.at_s),
            NodeEventKind::LostBeforeReport => write!(f, "{node} lost before its report: {why}"),
            NodeEventKind::Rejoined => write!(f, "{node} rejoined"),
            NodeEventKind::ReportRefused => {
                write!(f, "{node} sent a report that was refused: {why}")
            }
            NodeEventKind::Retiring => write!(f, "{node} retiring from {:.3} s", self.at_s),
            NodeEventKind::Retired => write!(f, "{node} retired at {:.3} s", self.at_s),
            NodeEventKind::RetireCalledOff => write!(f, "{node} builds on: {why}"),
            NodeEventKind::Joined => write!(f, "{node} joined at {:.3} s", self.at_s),
        }
    }
}

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

impl RunReport {
    /// Everything wrong with the run: [`verdict`].
    pub fn verdict(&self) -> Vec<String> {
        verdict(self)
    }

    /// Every BU that took part in the run reported (a spare that never joined takes none).
    pub fn every_bu_reported(&self) -> bool {
        self.bus
            .iter()
            .enumerate()
            .all(|(i, b)| b.is_some() || self.evm.spares_out.contains(&format!("bu[{i}]")))
    }

    /// The run ended as it should: halted after Stop, and the verdict is clean. This is
    /// what the EVM decides its own outcome by.
    pub fn ok(&self) -> bool {
        self.state == RunState::Halted && verdict(self).is_empty()
    }

    /// The EVM lost `node` during the run ([`NodeEventKind::is_loss`]) and handled it by its
    /// rule (a BU's events rebuilt elsewhere, an RU's by `on_ru_loss`); whether that cost
    /// anything is the verdict's to say.
    pub fn lost(&self, node: NodeRef) -> bool {
        self.evm
            .lost
            .iter()
            .any(|e| e.kind.is_loss() && e.is_about(node))
    }
}

/// Sum of ids 0..n, wrapping like the BUs' sums.
pub(crate) fn id_sum(n: u64) -> u64 {
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
    if r.evm.committed_unpublished > 0 {
        p.push(format!(
            "{} committed events are in parts that neither their BU (lost before it published \
             them) nor the EVM (the BU's directory was not reachable) published: its \
             temporary .evb.tmp files hold them",
            r.evm.committed_unpublished
        ));
    }
    // a BU out of the run at its end (lost and not back), or a spare that never joined it
    let is_down = |node: String| r.down.contains(&node) || r.evm.spares_out.contains(&node);
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
                if let Some(why) = s.frame_account_gap() {
                    p.push(format!("ru[{i}]: {why}"));
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

    /// A live stream's byte account that does not add up fails the verdict naming the RU;
    /// one that does (slices: in = cores + held; windows: in = taken + evicted and held
    /// that none took) passes.
    #[test]
    fn a_latency_buffer_whose_bytes_do_not_add_up_fails_the_verdict() {
        let slices = RuStats {
            frame_bytes_in: 1000,
            frame_bytes_in_slice_cores: 900,
            frame_bytes_held_unused: 100,
            ..RuStats::default()
        };
        let windows = RuStats {
            frame_bytes_in: 1000,
            frame_bytes_in_windows: 600,
            frame_bytes_evicted_unused: 300,
            frame_bytes_held_unused: 100,
            ..RuStats::default()
        };
        let report = |ru: RuStats| RunReport {
            state: RunState::Halted,
            reason: None,
            n_ru: 1,
            n_bu: 0,
            seconds: 1.0,
            down: Vec::new(),
            evm: EvmStats::default(),
            rus: vec![Some(ru)],
            bus: Vec::new(),
        };
        for ok in [slices.clone(), windows.clone()] {
            assert!(verdict(&report(ok)).is_empty());
        }
        for bad in [
            RuStats {
                frame_bytes_in_slice_cores: 901,
                ..slices
            },
            RuStats {
                frame_bytes_evicted_unused: 299,
                ..windows
            },
        ] {
            let v = verdict(&report(bad));
            assert!(
                v.len() == 1 && v[0].starts_with("ru[0]: its latency buffer's bytes do not add up"),
                "{v:?}"
            );
        }
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

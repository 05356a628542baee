//! The controller's record of each run: made when the run is started, followed through its
//! states, closed with the EVM's verdict (`GET /api/v1/runs/N`, docs/control.md).

use evb_builder::{NodeEvent, NodeStatus};
use serde::{Deserialize, Serialize};

use crate::fsm::State;

/// One run, as the controller saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run: u64,
    /// The run state while it goes on (`starting`, `running`, ...); once over, `complete`,
    /// `failed`, `aborted` (by a reset), or `unknown` (a promoted standby's record of a run
    /// that ended at the lost EVM).
    pub state: String,
    pub started_unix: f64,
    /// The rest is known once the run is over.
    #[serde(flatten)]
    pub end: Option<RunEnd>,
    /// What ties a closed record to the run's folder (docs/formats.md §7.3): the SHA-256 of
    /// its manifest and of its configuration's copy there, as they were when the record
    /// was closed (absent: the run wrote no files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_sha256: Option<String>,
    /// The chain of one run id's records: the SHA-256 of the record file's last line of the
    /// run before this one (by number) when this one was closed. A record deleted or edited
    /// after it was chained no longer matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_sha256: Option<String>,
}

/// The digests of run `run_id`'s manifest and configuration copy in `dir`, where they are.
pub(crate) fn folder_digests(dir: &str, run_id: &str) -> (Option<String>, Option<String>) {
    if dir.is_empty() {
        return (None, None);
    }
    let dir = std::path::Path::new(dir);
    let digest = |name: String| {
        evb_formats::evidence::sha256_file(&dir.join(name))
            .ok()
            .map(|(d, _)| d)
    };
    (
        digest(evb_formats::manifest::manifest_name(run_id)),
        digest(evb_formats::evidence::config_name(run_id)),
    )
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEnd {
    /// The run did what it should: every triggered event built exactly once.
    pub ok: bool,
    /// The outcome in words (the EVM's, or the verdict's problems).
    pub reason: String,
    /// Everything wrong with the run by the builder's verdict (empty: nothing).
    pub verdict: Vec<String>,
    pub ended_unix: f64,
    pub wall_s: f64,
    /// Events released into the EVM's ledger (by live and lost BUs alike).
    pub events_built: u64,
    /// The payload bytes of the built events, from the BUs' reports: `None` (null) when a
    /// BU was lost or sent no report, since a BU's count dies with it (the event count,
    /// from the EVM's ledger, is exact either way).
    pub payload_bytes_built: Option<u64>,
    /// `None`: the EVM sent no report (the run did not start, or the EVM failed).
    pub triggered: Option<u64>,
    pub lost: Option<Vec<NodeEvent>>,
    pub seconds: Option<f64>,
    /// The EVM's whole report (left out of run lists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<Box<NodeStatus>>,
}

impl RunEnd {
    /// The end of a run whose control ended before it did, as the next control finds it
    /// on disk: no verdict, no counts (the nodes' logs and the run's output folder hold
    /// what there is).
    pub(super) fn interrupted(rec: &RunRecord, unix: f64) -> RunEnd {
        RunEnd {
            ok: false,
            reason: format!(
                "the run control ended while run {} was {}: its verdict is not known (the \
                 nodes' logs and the run's output folder hold what there is)",
                rec.run, rec.state
            ),
            verdict: Vec::new(),
            ended_unix: unix,
            wall_s: unix - rec.started_unix,
            events_built: 0,
            payload_bytes_built: None,
            triggered: None,
            lost: None,
            seconds: None,
            report: None,
        }
    }
}

impl RunRecord {
    pub(super) fn starting(run: u64, unix: f64) -> RunRecord {
        RunRecord {
            run,
            state: State::Starting.name().to_string(),
            started_unix: unix,
            end: None,
            manifest_sha256: None,
            config_sha256: None,
            prev_sha256: None,
        }
    }

    /// The record without the EVM's full report (run lists).
    pub fn summary(&self) -> RunRecord {
        let mut s = self.clone();
        if let Some(end) = &mut s.end {
            end.report = None;
        }
        s
    }
}

/// How the EVM's part of a run ended, as the controller is told it.
#[derive(Debug, Clone)]
pub struct Finished {
    pub ok: bool,
    pub reason: String,
    /// The EVM's final status line with the run's report (`None`: the run never got that far).
    pub report: Option<NodeStatus>,
    /// This EVM was fenced by a standby that the nodes followed (the epoch): the run is the
    /// standby's, and this record says so instead of a verdict of its own.
    pub fenced: Option<u16>,
}

impl Finished {
    /// Judges the EVM's report by the builder's verdict (the one the EVM used): a run whose
    /// report says something is wrong is not ok, whatever the outcome said.
    pub(super) fn close(self, record: &mut RunRecord, reset: bool, unix: f64) -> (bool, String) {
        let run_report = self.report.as_ref().and_then(|r| r.run.as_ref());
        let verdict = run_report.map(|r| r.verdict()).unwrap_or_default();
        let mut reason = self.reason;
        if self.ok && !verdict.is_empty() {
            reason = verdict.join("; ");
        }
        let ok = self.ok && verdict.is_empty() && self.fenced.is_none();
        record.state = if self.fenced.is_some() {
            "fenced"
        } else if ok {
            "complete"
        } else if reset {
            "aborted"
        } else {
            "failed"
        }
        .to_string();
        record.end = Some(RunEnd {
            ok,
            reason: reason.clone(),
            verdict,
            ended_unix: unix,
            wall_s: unix - record.started_unix,
            events_built: run_report.map_or(0, |r| r.evm.released),
            payload_bytes_built: run_report.and_then(|r| {
                let bu_lost = r.evm.lost.iter().any(|e| e.node.starts_with("bu["));
                (!bu_lost && r.every_bu_reported())
                    .then(|| r.bus.iter().flatten().map(|b| b.payload_bytes_built).sum())
            }),
            triggered: run_report.map(|r| r.evm.triggered),
            lost: run_report.map(|r| r.evm.lost.clone()),
            seconds: run_report.map(|r| r.seconds),
            report: self.report.map(Box::new),
        });
        (ok, reason)
    }
}

//! A node's status line, typed: what a node publishes to its run control a few times a
//! second, prints to its watcher (`evb run`, a launcher's stdout) and, with the outcome
//! added, sends as its final report. The control API's `snapshot`, `/metrics`, the node
//! table, `evb run`'s summary and the verdict all read these fields (docs/control.md,
//! "The status line"); nothing reads a status by string key.

use serde::{Deserialize, Serialize};

use crate::action::RunState;
use crate::report::RunReport;
use crate::{BuStats, EvmStats, RuStats};

/// The three roles, as status lines and metrics name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatusRole {
    Evm,
    Ru,
    Bu,
}

impl StatusRole {
    pub fn name(self) -> &'static str {
        match self {
            StatusRole::Evm => "evm",
            StatusRole::Ru => "ru",
            StatusRole::Bu => "bu",
        }
    }
}

/// A line while the run goes on, or the node's last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatusKind {
    Status,
    Report,
}

/// The role's own counters: the builder's state machines' stats as they are.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum RoleStats {
    Evm(Box<EvmStats>),
    Ru(Box<RuStats>),
    Bu(Box<BuStats>),
}

impl RoleStats {
    pub fn role(&self) -> StatusRole {
        match self {
            RoleStats::Evm(_) => StatusRole::Evm,
            RoleStats::Ru(_) => StatusRole::Ru,
            RoleStats::Bu(_) => StatusRole::Bu,
        }
    }

    pub fn evm(&self) -> Option<&EvmStats> {
        match self {
            RoleStats::Evm(s) => Some(s),
            _ => None,
        }
    }

    pub fn ru(&self) -> Option<&RuStats> {
        match self {
            RoleStats::Ru(s) => Some(s),
            _ => None,
        }
    }

    pub fn bu(&self) -> Option<&BuStats> {
        match self {
            RoleStats::Bu(s) => Some(s),
            _ => None,
        }
    }

    /// The events and payload bytes the node has moved, by role: events released (built,
    /// final) at the EVM, fragments sent from an RU, events built at a BU (what the node
    /// table's rates use; the EVM's is the system's event rate).
    pub fn progress(&self) -> (u64, u64) {
        match self {
            RoleStats::Evm(s) => (s.released, 0),
            RoleStats::Ru(s) => (s.fragments_sent, s.payload_bytes_sent),
            RoleStats::Bu(s) => (s.events_built, s.payload_bytes_built),
        }
    }

    /// Every error counter the role keeps, by its `kind` label in `evb_errors`.
    pub fn errors(&self) -> Vec<(&'static str, u64)> {
        match self {
            RoleStats::Evm(s) => vec![
                ("duplicate_release", s.duplicate_releases),
                ("unknown_release", s.unknown_releases),
                ("misrouted_release", s.misrouted_releases),
                ("protocol", s.errors),
            ],
            RoleStats::Ru(s) => vec![
                ("dropped_at_source", s.dropped_at_source),
                ("protocol", s.errors),
            ],
            RoleStats::Bu(s) => vec![
                ("crc", s.crc_errors),
                ("content", s.content_errors),
                ("window", s.window_errors),
                ("trigger_mismatch", s.trigger_mismatches),
                ("duplicate_fragment", s.duplicate_fragments),
                ("source_mismatch", s.source_mismatches),
                ("misrouted", s.misrouted),
                ("release_refused", s.releases_refused),
                ("protocol", s.errors),
            ],
        }
    }
}

/// The process's CPU seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuSeconds {
    /// Since the process started.
    pub process_s: f64,
    /// Since the run started (`None` before it runs).
    pub run_s: Option<f64>,
}

/// A BU's sink queue and the sink's own figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SinkStatus {
    /// The sink's name: `file`, `serve`, `null`, or a plug-in's.
    pub kind: String,
    /// The sink's own figures. Each kind reports its own (a file sink its files, the serve
    /// sink its consumers, a plug-in whatever it counts), so this one field stays open.
    pub report: serde_json::Value,
    /// Why the sink is busy, while it is: built events wait in the queue, holding their
    /// credits.
    pub blocked: Option<String>,
    /// Built events waiting for the sink.
    pub queued: u64,
    /// Times the sink was busy and held events.
    pub stalls: u64,
}

/// What went over the node's links (the messenger's and transport's counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct NetStatus {
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub frames_sent: u64,
    pub messages_sent: u64,
    pub protocol_errors: u64,
    pub bytes_copied: u64,
    pub bytes_by_reference: u64,
}

/// One of the node's buffer pools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStatus {
    /// What it holds: `receive`, `fragments`, ...
    pub pool: String,
    pub blocks: u64,
    pub block_size: u64,
    pub in_use: u64,
    pub high_water: u64,
    /// Allocations that found it empty and waited (back-pressure).
    pub exhausted: u64,
}

/// What a node said about itself when it registered with the EVM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    /// The node as the protocol names it (`ru[0]`).
    pub peer: String,
    /// The launcher's rank, if it has one.
    pub rank: Option<u32>,
    pub host: String,
    pub pid: u32,
    /// Its data listener and control API (empty: not known).
    pub data: String,
    pub control: String,
}

/// Bytes queued to send to one peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerQueue {
    pub peer: String,
    pub queued_bytes: u64,
}

/// A node's status line (docs/control.md, "The status line").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawStatus")]
pub struct NodeStatus {
    pub kind: StatusKind,
    /// The node's id in the configuration (`bu0`).
    pub node: String,
    pub role: StatusRole,
    pub state: RunState,
    /// Seconds since the node was made.
    pub t: f64,
    pub cpu: CpuSeconds,
    pub stats: RoleStats,
    /// A BU's sink (`None` at the EVM and RUs).
    pub sink: Option<SinkStatus>,
    pub net: NetStatus,
    /// The run id of the configuration (with `#N` under run control).
    pub run_id: String,
    pub pools: Vec<PoolStatus>,
    /// The EVM: every node that registered, by rank (`None` elsewhere, or before any did).
    pub registered: Option<Vec<Registered>>,
    pub peers: Vec<PeerQueue>,
    /// The run number under run control (`evb up`); absent under `evb run` in-process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_number: Option<u64>,
    /// A report's outcome: the run ended as it should (reports only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok: Option<bool>,
    /// A report's outcome in words (reports only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The EVM's report of the whole run (the EVM's last line only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunReport>,
    /// The EVM's verdict on the run: everything wrong with it (the EVM's last line only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Vec<String>>,
    /// An EVM replaced by a standby that the nodes followed: the epoch that fenced it. Its
    /// counts and verdict are then not the run's (docs/standby.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced: Option<u16>,
    /// A BU: this process's incarnation (docs/protocol.md §3), told from the process a
    /// restart replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<u16>,
    /// An RU or BU: the highest epoch of an EVM it followed in this run (the Term that
    /// opens each control connection says it; 0 until a takeover).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evm_epoch: Option<u16>,
}

impl NodeStatus {
    /// A status line of `node` with these stats and nothing else counted yet.
    pub fn new(node: &str, state: RunState, stats: RoleStats) -> NodeStatus {
        NodeStatus {
            kind: StatusKind::Status,
            node: node.to_string(),
            role: stats.role(),
            state,
            t: 0.0,
            cpu: CpuSeconds::default(),
            stats,
            sink: None,
            net: NetStatus::default(),
            run_id: String::new(),
            pools: Vec::new(),
            registered: None,
            peers: Vec::new(),
            run_number: None,
            ok: None,
            reason: None,
            run: None,
            verdict: None,
            fenced: None,
            incarnation: None,
            evm_epoch: None,
        }
    }

    /// The node's final report.
    pub fn is_report(&self) -> bool {
        self.kind == StatusKind::Report
    }

    pub fn evm(&self) -> Option<&EvmStats> {
        self.stats.evm()
    }

    /// An EVM that took its run over from a lost one (a standby, epoch above 0).
    pub fn took_over(&self) -> bool {
        self.evm().is_some_and(|e| e.epoch > 0)
    }

    pub fn ru(&self) -> Option<&RuStats> {
        self.stats.ru()
    }

    pub fn bu(&self) -> Option<&BuStats> {
        self.stats.bu()
    }

    /// A status line as text (a launcher reads them from its children's stdout); an error
    /// names what is wrong with it.
    pub fn from_json(text: &str) -> Result<NodeStatus, serde_json::Error> {
        serde_json::from_str(text)
    }
}

/// A status line as it is written: its `stats` are read by its `role`.
#[derive(Deserialize)]
struct RawStatus {
    kind: StatusKind,
    node: String,
    role: StatusRole,
    state: RunState,
    t: f64,
    cpu: CpuSeconds,
    stats: serde_json::Value,
    sink: Option<SinkStatus>,
    net: NetStatus,
    run_id: String,
    pools: Vec<PoolStatus>,
    registered: Option<Vec<Registered>>,
    peers: Vec<PeerQueue>,
    #[serde(default)]
    run_number: Option<u64>,
    #[serde(default)]
    ok: Option<bool>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    run: Option<RunReport>,
    #[serde(default)]
    verdict: Option<Vec<String>>,
    #[serde(default)]
    fenced: Option<u16>,
    #[serde(default)]
    incarnation: Option<u16>,
    #[serde(default)]
    evm_epoch: Option<u16>,
}

impl TryFrom<RawStatus> for NodeStatus {
    type Error = serde_json::Error;

    fn try_from(r: RawStatus) -> Result<NodeStatus, serde_json::Error> {
        let stats = match r.role {
            StatusRole::Evm => RoleStats::Evm(serde_json::from_value(r.stats)?),
            StatusRole::Ru => RoleStats::Ru(serde_json::from_value(r.stats)?),
            StatusRole::Bu => RoleStats::Bu(serde_json::from_value(r.stats)?),
        };
        Ok(NodeStatus {
            kind: r.kind,
            node: r.node,
            role: r.role,
            state: r.state,
            t: r.t,
            cpu: r.cpu,
            stats,
            sink: r.sink,
            net: r.net,
            run_id: r.run_id,
            pools: r.pools,
            registered: r.registered,
            peers: r.peers,
            run_number: r.run_number,
            ok: r.ok,
            reason: r.reason,
            run: r.run,
            verdict: r.verdict,
            fenced: r.fenced,
            incarnation: r.incarnation,
            evm_epoch: r.evm_epoch,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bu_line() -> NodeStatus {
        NodeStatus {
            kind: StatusKind::Status,
            node: "bu0".into(),
            role: StatusRole::Bu,
            state: RunState::Running,
            t: 1.5,
            cpu: CpuSeconds {
                process_s: 2.0,
                run_s: Some(1.0),
            },
            stats: RoleStats::Bu(Box::new(BuStats {
                events_built: 42,
                crc_errors: 1,
                ..Default::default()
            })),
            sink: Some(SinkStatus {
                kind: "null".into(),
                report: serde_json::Value::Null,
                blocked: None,
                queued: 2,
                stalls: 0,
            }),
            net: NetStatus::default(),
            run_id: "r#1".into(),
            pools: vec![],
            registered: None,
            peers: vec![],
            run_number: Some(1),
            ok: None,
            reason: None,
            run: None,
            verdict: None,
            fenced: None,
            incarnation: None,
            evm_epoch: None,
        }
    }

    #[test]
    fn a_status_line_reads_back_as_written_with_its_role_s_stats() {
        let line = bu_line();
        let text = serde_json::to_string(&line).unwrap();
        assert!(text.contains("\"events_built\":42"), "{text}");
        let back = NodeStatus::from_json(&text).unwrap();
        assert_eq!(back, line);
        assert_eq!(back.bu().map(|b| b.events_built), Some(42));
        assert!(back.evm().is_none());
        assert_eq!(back.stats.progress(), (42, 0));
    }

    #[test]
    fn a_line_missing_a_field_is_refused_by_name() {
        let mut v = serde_json::to_value(bu_line()).unwrap();
        v.as_object_mut().unwrap().remove("net");
        let e = serde_json::from_value::<NodeStatus>(v).unwrap_err();
        assert!(e.to_string().contains("net"), "{e}");
        let mut v = serde_json::to_value(bu_line()).unwrap();
        v["role"] = "rx".into();
        assert!(serde_json::from_value::<NodeStatus>(v).is_err());
    }

    #[test]
    fn a_run_state_s_name_is_how_a_status_line_writes_it() {
        use RunState::*;
        for st in [Configured, Ready, Running, Stopping, Halted, Aborted] {
            assert_eq!(serde_json::to_value(st).unwrap(), st.name());
        }
    }

    #[test]
    fn error_counters_carry_their_metric_labels() {
        let line = bu_line();
        let errors = line.stats.errors();
        assert!(errors.contains(&("crc", 1)), "{errors:?}");
        assert!(errors.iter().any(|(k, _)| *k == "protocol"));
    }
}

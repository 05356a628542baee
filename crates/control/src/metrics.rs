//! `/metrics`: a node's status snapshot in the Prometheus text format, made with the
//! prometheus-client crate at scrape time. The node's event loop keeps its own counters and
//! publishes a snapshot a few times a second; nothing here touches the data path.
//!
//! Every series carries `node` and `role` labels. Names follow the Prometheus conventions:
//! counters end in `_total`, sizes are in bytes and times in seconds.

use evb_builder::{NodeStatus, RoleStats, LATENCY_BOUNDS_US};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::fsm::State;

/// What a scrape shows besides the node's own snapshot.
#[derive(Debug, Clone)]
pub struct Scrape {
    pub node: String,
    pub role: String,
    /// The run number this node is in (or was last in), and the run state (the EVM's
    /// controller state at the EVM; the node's own phase elsewhere).
    pub run: u64,
    pub state: State,
    pub snapshot: Option<NodeStatus>,
    /// Runs this process has taken part in.
    pub runs_total: u64,
}

#[derive(Debug)]
struct SnapshotCollector(Scrape);

type Labels = Vec<(String, String)>;

impl SnapshotCollector {
    /// A latency histogram in seconds, from the fixed buckets of a `LatencyHistogram`.
    fn latency_histogram(
        &self,
        enc: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        h: &evb_builder::LatencyHistogram,
    ) -> Result<(), std::fmt::Error> {
        let mut m =
            enc.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
        // per-bucket counts: the encoder makes them cumulative
        let buckets: Vec<(f64, u64)> = LATENCY_BOUNDS_US
            .iter()
            .map(|&b| b as f64 / 1e6)
            .chain(std::iter::once(f64::MAX)) // written as +Inf
            .zip(h.counts.iter().copied())
            .collect();
        let labels = self.labels(&[]);
        m.encode_family(&labels)?.encode_histogram::<Labels>(
            h.sum_us as f64 / 1e6,
            h.count,
            &buckets,
            None,
        )
    }

    fn labels(&self, extra: &[(&str, &str)]) -> Labels {
        let mut l = vec![
            ("node".to_string(), self.0.node.clone()),
            ("role".to_string(), self.0.role.clone()),
        ];
        l.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        l
    }
}

/// Writes one metric family with one or more labelled samples.
fn family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    samples: &[(Labels, u64)],
    counter: bool,
) -> Result<(), std::fmt::Error> {
    if samples.is_empty() {
        return Ok(());
    }
    let kind = if counter {
        MetricType::Counter
    } else {
        MetricType::Gauge
    };
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), kind)?;
    for (labels, v) in samples {
        let f = m.encode_family(labels)?;
        if counter {
            ConstCounter::new(*v).encode(f)?;
        } else {
            ConstGauge::new(*v as i64).encode(f)?;
        }
    }
    Ok(())
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.0;
        let one = |v: u64| vec![(self.labels(&[]), v)];
        family(
            &mut enc,
            "evb_run_number",
            "Number of the run this node is in or was last in",
            None,
            &one(s.run),
            false,
        )?;
        let states: Vec<(Labels, u64)> = State::ALL
            .iter()
            .map(|&st| (self.labels(&[("state", st.name())]), (st == s.state) as u64))
            .collect();
        family(
            &mut enc,
            "evb_run_state",
            "Run state (1 for the current state)",
            None,
            &states,
            false,
        )?;
        family(
            &mut enc,
            "evb_runs",
            "Runs this process has taken part in",
            None,
            &one(s.runs_total),
            true,
        )?;
        let Some(snap) = &s.snapshot else {
            return Ok(());
        };
        let counter = |enc: &mut DescriptorEncoder, name, help, unit, v: u64| {
            family(enc, name, help, unit, &one(v), true)
        };
        let gauge = |enc: &mut DescriptorEncoder, name, help, unit, v: u64| {
            family(enc, name, help, unit, &one(v), false)
        };
        match &snap.stats {
            RoleStats::Evm(st) => {
                self.latency_histogram(
                    &mut enc,
                    "evb_trigger_to_release_latency",
                    "Time from an event's trigger (its entry into the EVM, the wait for credit included) to its release by the BU that built it, committed with a committing sink; the EVM's clock",
                    &st.record_latency,
                )?;
                counter(
                    &mut enc,
                    "evb_events_triggered",
                    "Events triggered and assigned to a BU",
                    None,
                    st.triggered,
                )?;
                counter(
                    &mut enc,
                    "evb_events_released",
                    "Events released by the BUs and accepted by the EVM's ledger",
                    None,
                    st.released,
                )?;
                gauge(
                    &mut enc,
                    "evb_events_in_flight",
                    "Events assigned and not yet final (released, or committed with a file sink)",
                    None,
                    st.in_flight,
                )?;
                gauge(
                    &mut enc,
                    "evb_credits_available",
                    "Credits granted by the BUs and not yet used",
                    None,
                    st.credits_available,
                )?;
                counter(
                    &mut enc,
                    "evb_events_reassigned",
                    "Events taken from a lost BU and assigned again",
                    None,
                    st.reassigned,
                )?;
                counter(
                    &mut enc,
                    "evb_output_parts_committed",
                    "Parts of output (files) the EVM committed: their events final, the RUs freed",
                    None,
                    st.parts_committed,
                )?;
                counter(
                    &mut enc,
                    "evb_events_committed_unpublished",
                    "Committed events in parts nobody could publish (a lost BU's, out of the EVM's reach)",
                    None,
                    st.committed_unpublished,
                )?;
                gauge(
                    &mut enc,
                    "evb_evm_epoch",
                    "Takeovers of this run by a standby EVM (0: the first EVM runs it)",
                    None,
                    st.epoch as u64,
                )?;
                gauge(
                    &mut enc,
                    "evb_evm_active",
                    "1 on the EVM that runs the run, 0 on a standby still following it or on an EVM fenced by one",
                    None,
                    u64::from(!st.following && snap.fenced.is_none()),
                )?;
                gauge(
                    &mut enc,
                    "evb_evm_fenced_by_epoch",
                    "The epoch of the standby that fenced this EVM (its counts are then not the run's); 0: not fenced",
                    None,
                    snap.fenced.map_or(0, u64::from),
                )?;
                // only losses count (a rejoin is none)
                let losses = st.lost.iter().filter(|e| e.kind.is_loss()).count();
                counter(
                    &mut enc,
                    "evb_nodes_lost",
                    "Nodes lost during the run",
                    None,
                    losses as u64,
                )?;
                gauge(
                    &mut enc,
                    "evb_nodes_down",
                    "Nodes lost and not back",
                    None,
                    st.down.len() as u64,
                )?;
                gauge(
                    &mut enc,
                    "evb_paused",
                    "1 while triggering is paused",
                    None,
                    st.paused as u64,
                )?;
            }
            RoleStats::Ru(st) => {
                counter(
                    &mut enc,
                    "evb_fragments_sent",
                    "Fragments sent to the BUs",
                    None,
                    st.fragments_sent,
                )?;
                counter(
                    &mut enc,
                    "evb_fragment_payload_sent",
                    "Fragment payload bytes sent to the BUs",
                    Some(Unit::Bytes),
                    st.payload_bytes_sent,
                )?;
                counter(
                    &mut enc,
                    "evb_events_released",
                    "Events whose fragments this RU freed",
                    None,
                    st.events_released,
                )?;
                gauge(
                    &mut enc,
                    "evb_fragments_retained",
                    "Fragments held until their event is released",
                    None,
                    st.retained,
                )?;
                gauge(
                    &mut enc,
                    "evb_events_pending",
                    "Assignments waiting for their fragment to be made",
                    None,
                    st.pending_events,
                )?;
                gauge(
                    &mut enc,
                    "evb_frame_buffer_frames",
                    "Live frames built by time: frames held in the RU's latency buffer",
                    None,
                    st.frame_buffer_frames,
                )?;
                gauge(
                    &mut enc,
                    "evb_frame_buffer",
                    "Live frames built by time: bytes held in the RU's latency buffer",
                    Some(Unit::Bytes),
                    st.frame_buffer_bytes,
                )?;
                counter(
                    &mut enc,
                    "evb_frames_evicted",
                    "Live frames into decision windows: frames evicted from the RU's latency buffer (older than windows.buffer_ms, or past windows.buffer_bytes)",
                    None,
                    st.frames_evicted,
                )?;
                counter(
                    &mut enc,
                    "evb_frame_evicted_unused",
                    "Live frames into decision windows: bytes evicted that no window took",
                    Some(Unit::Bytes),
                    st.frame_bytes_evicted_unused,
                )?;
                counter(
                    &mut enc,
                    "evb_frame_in",
                    "Live frames built by time: bytes of frames into the RU's latency buffer (headers included)",
                    Some(Unit::Bytes),
                    st.frame_bytes_in,
                )?;
                counter(
                    &mut enc,
                    "evb_frame_in_slice_cores",
                    "Live frames built into time slices: bytes of frames cut into a slice's core (each frame in exactly one)",
                    Some(Unit::Bytes),
                    st.frame_bytes_in_slice_cores,
                )?;
                gauge(
                    &mut enc,
                    "evb_frame_buffer_ticks",
                    "Live frames built by time: ticks of data held in the RU's latency buffer",
                    None,
                    st.frame_buffer_ticks,
                )?;
            }
            RoleStats::Bu(st) => {
                counter(
                    &mut enc,
                    "evb_events_built",
                    "Events built, handed to the sink and accepted by the EVM",
                    None,
                    st.events_built,
                )?;
                counter(
                    &mut enc,
                    "evb_event_payload_built",
                    "Payload bytes of the events built",
                    Some(Unit::Bytes),
                    st.payload_bytes_built,
                )?;
                counter(
                    &mut enc,
                    "evb_fragments_received",
                    "Fragments received from the RUs",
                    None,
                    st.fragments_received,
                )?;
                counter(
                    &mut enc,
                    "evb_events_partial",
                    "Events built with a source flagged missing",
                    None,
                    st.partial_events,
                )?;
                counter(
                    &mut enc,
                    "evb_window_components_late",
                    "Decision windows (builder.by = \"window\") an RU sent LATE: their end had not arrived within windows.wait_ms",
                    None,
                    st.late_components,
                )?;
                counter(
                    &mut enc,
                    "evb_window_components_missing",
                    "Decision windows an RU sent MISSING: their first frames were evicted from its latency buffer",
                    None,
                    st.missing_components,
                )?;
                counter(
                    &mut enc,
                    "evb_window_components_empty",
                    "Decision windows an RU sent EMPTY: the decision named other components (nothing left out)",
                    None,
                    st.empty_components,
                )?;
                let sink = snap.sink.as_ref();
                gauge(
                    &mut enc,
                    "evb_sink_queued_events",
                    "Built events waiting for the sink",
                    None,
                    sink.map_or(0, |k| k.queued),
                )?;
                counter(
                    &mut enc,
                    "evb_sink_stalls",
                    "Times the sink was busy and held events (and their credits)",
                    None,
                    sink.map_or(0, |k| k.stalls),
                )?;
                self.latency_histogram(
                    &mut enc,
                    "evb_event_build_latency",
                    "Time from an event's assignment (or first fragment) to its completion at the BU",
                    &st.latency,
                )?;
            }
        }
        // errors by kind, from whichever counters this role keeps
        let mut errors: Vec<(Labels, u64)> = snap
            .stats
            .errors()
            .into_iter()
            .map(|(kind, v)| (self.labels(&[("kind", kind)]), v))
            .collect();
        errors.push((self.labels(&[("kind", "wire")]), snap.net.protocol_errors));
        family(
            &mut enc,
            "evb_errors",
            "Errors by kind",
            None,
            &errors,
            true,
        )?;
        let net = &snap.net;
        counter(
            &mut enc,
            "evb_network_sent",
            "Payload bytes sent to peers",
            Some(Unit::Bytes),
            net.bytes_sent,
        )?;
        counter(
            &mut enc,
            "evb_network_received",
            "Payload bytes received from peers",
            Some(Unit::Bytes),
            net.bytes_received,
        )?;
        counter(
            &mut enc,
            "evb_messages_sent",
            "Messages sent to peers",
            None,
            net.messages_sent,
        )?;
        let per_pool = |field: fn(&evb_builder::PoolStatus) -> u64| -> Vec<(Labels, u64)> {
            snap.pools
                .iter()
                .map(|p| (self.labels(&[("pool", &p.pool)]), field(p)))
                .collect()
        };
        family(
            &mut enc,
            "evb_pool_blocks",
            "Blocks in the pool",
            None,
            &per_pool(|p| p.blocks),
            false,
        )?;
        family(
            &mut enc,
            "evb_pool_blocks_in_use",
            "Blocks on loan",
            None,
            &per_pool(|p| p.in_use),
            false,
        )?;
        family(
            &mut enc,
            "evb_pool_exhausted",
            "Allocations that found the pool empty and waited (back-pressure)",
            None,
            &per_pool(|p| p.exhausted),
            true,
        )?;
        let peers: Vec<(Labels, u64)> = snap
            .peers
            .iter()
            .map(|p| (self.labels(&[("peer", &p.peer)]), p.queued_bytes))
            .collect();
        family(
            &mut enc,
            "evb_peer_send_queue",
            "Bytes queued to send to each peer",
            Some(Unit::Bytes),
            &peers,
            false,
        )?;
        Ok(())
    }
}

/// The Prometheus text exposition of one node.
pub fn exposition(scrape: Scrape) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector(scrape)));
    let mut out = String::new();
    // writing to a String cannot fail
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// The same exposition in the classic Prometheus text format (0.0.4), for scrapers that do
/// not ask for OpenMetrics (curl, `promtool check metrics`, older servers): a counter's
/// HELP and TYPE name the `_total` series, and there are no UNIT or EOF lines.
pub fn classic(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((p, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let name = if counters.contains(name) {
                    format!("{name}_total")
                } else {
                    name.to_string()
                };
                out.push_str(&format!("{p}{name} {tail}\n"));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bu_scrape() -> Scrape {
        use evb_builder::{BuStats, LatencyHistogram, PeerQueue, PoolStatus, RunState};
        let mut latency = LatencyHistogram::default();
        latency.record(std::time::Duration::from_micros(30));
        latency.record(std::time::Duration::from_millis(3));
        let stats = BuStats {
            events_built: 42,
            payload_bytes_built: 4200,
            crc_errors: 1,
            latency,
            ..Default::default()
        };
        let mut snap = NodeStatus::new("bu0", RunState::Running, RoleStats::Bu(Box::new(stats)));
        snap.sink = Some(evb_builder::SinkStatus {
            kind: "null".into(),
            report: serde_json::Value::Null,
            blocked: None,
            queued: 2,
            stalls: 0,
        });
        snap.net.messages_sent = 3;
        snap.pools = vec![PoolStatus {
            pool: "receive".into(),
            blocks: 64,
            block_size: 4096,
            in_use: 5,
            high_water: 6,
            exhausted: 0,
        }];
        snap.peers = vec![PeerQueue {
            peer: "ru0".into(),
            queued_bytes: 0,
        }];
        Scrape {
            node: "bu0".into(),
            role: "bu".into(),
            run: 7,
            state: State::Running,
            runs_total: 3,
            snapshot: Some(snap),
        }
    }

    #[test]
    fn a_bu_exposes_counters_gauges_and_its_latency_histogram() {
        let text = exposition(bu_scrape());
        for line in [
            "evb_run_number{node=\"bu0\",role=\"bu\"} 7",
            "evb_run_state{node=\"bu0\",role=\"bu\",state=\"running\"} 1",
            "evb_run_state{node=\"bu0\",role=\"bu\",state=\"ready\"} 0",
            "evb_events_built_total{node=\"bu0\",role=\"bu\"} 42",
            "evb_event_payload_built_bytes_total{node=\"bu0\",role=\"bu\"} 4200",
            "evb_errors_total{node=\"bu0\",role=\"bu\",kind=\"crc\"} 1",
            "evb_pool_blocks_in_use{node=\"bu0\",role=\"bu\",pool=\"receive\"} 5",
            "evb_peer_send_queue_bytes{node=\"bu0\",role=\"bu\",peer=\"ru0\"} 0",
            "evb_event_build_latency_seconds_bucket{le=\"0.00005\",node=\"bu0\",role=\"bu\"} 1",
            "evb_event_build_latency_seconds_bucket{le=\"0.0025\",node=\"bu0\",role=\"bu\"} 1",
            "evb_event_build_latency_seconds_bucket{le=\"0.005\",node=\"bu0\",role=\"bu\"} 2",
            "evb_event_build_latency_seconds_bucket{le=\"+Inf\",node=\"bu0\",role=\"bu\"} 2",
            "evb_event_build_latency_seconds_count{node=\"bu0\",role=\"bu\"} 2",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn the_classic_format_names_counters_by_their_series() {
        let text = classic(&exposition(bu_scrape()));
        assert!(text.contains("# HELP evb_events_built_total Events built"));
        assert!(text.contains("# TYPE evb_events_built_total counter\n"));
        assert!(text.contains("evb_events_built_total{node=\"bu0\",role=\"bu\"} 42\n"));
        assert!(text.contains("# TYPE evb_event_build_latency_seconds histogram\n"));
        assert!(text.contains("# TYPE evb_run_number gauge\n"));
        assert!(!text.contains("# UNIT") && !text.contains("# EOF"));
        assert!(text.ends_with('\n'));
    }

    /// An EVM's scrape with the stats of a real `Evm` (as the driver's status line has them)
    /// whose BU was lost mid-run and came back.
    fn evm_scrape_after_a_rejoin() -> Scrape {
        use evb_builder::{Assignment, Evm, EvmConfig, NodeRef, RuLossPolicy};
        use evb_wire::{Message, UNLIMITED};
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let cfg = EvmConfig {
            n_ru: 1,
            n_bu: 2,
            max_events: Some(1000),
            duration: None,
            rate_hz: None,
            batch: 4,
            stall_timeout: Duration::from_secs(60),
            max_per_poll: 64,
            on_ru_loss: RuLossPolicy::Stop,
            assignment: Assignment::Credits,
            link_grace: Duration::from_millis(50),
            commits: Vec::new(),
            spares: Vec::new(),
        };
        let mut evm = Evm::new(cfg, t0);
        let ready = || Message::Ready {
            available: UNLIMITED,
        };
        for n in [NodeRef::Ru(0), NodeRef::Bu(0), NodeRef::Bu(1)] {
            evm.handle(t0, n, ready());
        }
        let t1 = t0 + Duration::from_millis(300);
        evm.peer_lost(t1, NodeRef::Bu(1), "connection reset");
        evm.handle(t1, NodeRef::Bu(1), ready());
        Scrape {
            node: "evm".into(),
            role: "evm".into(),
            run: 1,
            state: State::Running,
            runs_total: 1,
            snapshot: Some(NodeStatus::new(
                "evm",
                evb_builder::RunState::Running,
                RoleStats::Evm(Box::new(evm.stats())),
            )),
        }
    }

    /// `evb_nodes_lost_total` counts losses only: a BU lost and back is one loss, not two
    /// (the rejoin used to count as a second), and it is not down.
    #[test]
    fn a_rejoin_is_not_counted_as_a_loss() {
        let s = evm_scrape_after_a_rejoin();
        let lost = &s.snapshot.as_ref().and_then(|n| n.evm()).unwrap().lost;
        assert_eq!(lost.len(), 2, "a loss and a rejoin: {lost:?}");
        let text = exposition(s);
        for line in [
            "evb_nodes_lost_total{node=\"evm\",role=\"evm\"} 1\n",
            "evb_nodes_down{node=\"evm\",role=\"evm\"} 0\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    /// Every run state of the state machine is a sample of `evb_run_state`, the current one
    /// 1 and the others 0: a new state cannot go missing from the metrics.
    #[test]
    fn every_run_state_is_in_the_exposition() {
        for &current in State::ALL {
            let mut s = bu_scrape();
            s.state = current;
            let text = exposition(s);
            for &st in State::ALL {
                let line = format!(
                    "evb_run_state{{node=\"bu0\",role=\"bu\",state=\"{}\"}} {}\n",
                    st.name(),
                    (st == current) as u8
                );
                assert!(text.contains(&line), "missing {line:?} in\n{text}");
            }
            let samples = text
                .lines()
                .filter(|l| l.starts_with("evb_run_state{"))
                .count();
            assert_eq!(samples, State::ALL.len(), "{text}");
        }
    }

    #[test]
    fn a_node_without_a_snapshot_still_says_its_state() {
        let mut s = bu_scrape();
        s.snapshot = None;
        s.state = State::Ready;
        let text = exposition(s);
        assert!(text.contains("evb_run_state{node=\"bu0\",role=\"bu\",state=\"ready\"} 1"));
        assert!(!text.contains("evb_events_built_total"));
    }
}

//! A node's status line: the document `evb run` reads, the control API's snapshot and the
//! final report are all this.

use super::*;

/// Where and when a node says how it is: status lines to its watcher (`evb run`, the
/// process's stdout) every `status_every`, snapshots to its run control every
/// [`PUBLISH_EVERY`], and the figures of its own that those carry (time since start, the
/// run's CPU, the pools).
pub(super) struct Reporter {
    out: StatusOut,
    every: Duration,
    next_status: Instant,
    next_publish: Instant,
    /// Snapshots go here (the control API reads them).
    control: RunControl,
    started: Instant,
    /// The process's CPU seconds when the run started (the cost of the run is measured
    /// from there, leaving out start-up and backing the pools).
    cpu_at_start: Option<f64>,
    /// The node's pools, by what they hold.
    pools: Vec<(&'static str, evb_buffers::Pool)>,
}

impl Reporter {
    pub(super) fn new(
        out: StatusOut,
        every: Duration,
        control: RunControl,
        pools: Vec<(&'static str, evb_buffers::Pool)>,
        now: Instant,
    ) -> Reporter {
        Reporter {
            out,
            every,
            next_status: now,
            next_publish: now,
            control,
            started: now,
            cpu_at_start: None,
            pools,
        }
    }

    /// Notes the run's state: CPU is counted from the moment it runs.
    #[inline]
    pub(super) fn note_state(&mut self, state: RunState) {
        if self.cpu_at_start.is_none() && state == RunState::Running {
            self.cpu_at_start = Some(process_cpu_s());
        }
    }

    /// A status line or a snapshot is due.
    #[inline]
    pub(super) fn due(&self, now: Instant) -> bool {
        now >= self.next_status || now >= self.next_publish
    }

    /// Sends `line` where it is due.
    pub(super) fn send(&mut self, now: Instant, line: Value) {
        if now >= self.next_publish {
            self.control.publish(line.clone());
            self.next_publish = now + PUBLISH_EVERY;
        }
        if now >= self.next_status {
            (self.out)(line);
            self.next_status = now + self.every;
        }
    }

    /// Sends the final report everywhere.
    pub(super) fn report(&mut self, report: Value) {
        self.control.publish(report.clone());
        (self.out)(report);
    }

    /// Seconds since the node was made.
    fn t(&self, now: Instant) -> f64 {
        now.duration_since(self.started).as_secs_f64()
    }

    /// The process's CPU seconds: in all, and since the run started.
    fn cpu(&self) -> Value {
        let cpu = process_cpu_s();
        json!({
            "process_s": cpu,
            "run_s": self.cpu_at_start.map(|c| cpu - c),
        })
    }

    fn pools(&self) -> Value {
        self.pools
            .iter()
            .map(|(what, p)| {
                let st = p.stats();
                json!({
                    "pool": what,
                    "blocks": st.blocks,
                    "block_size": st.block_size,
                    "in_use": st.blocks - st.free,
                    "high_water": st.high_water,
                    "exhausted": st.exhausted,
                })
            })
            .collect()
    }
}

impl Driver {
    pub(super) fn status_line(&self, kind: &str, now: Instant) -> Value {
        let stats = match &self.logic {
            Logic::Evm(e) => serde_json::to_value(e.stats()),
            Logic::Ru(r) => serde_json::to_value(r.stats()),
            Logic::Bu(b, _) => serde_json::to_value(b.stats()),
        }
        .unwrap_or(Value::Null);
        let m = self.messenger.stats();
        let t = self.messenger.transport_counters();
        json!({
            "kind": kind,
            "node": self.me.id,
            "role": format!("{:?}", self.me.role).to_lowercase(),
            "state": self.state(),
            "t": self.reporter.t(now),
            // the process's CPU seconds: in all, and since the run started
            "cpu": self.reporter.cpu(),
            "stats": stats,
            "sink": match &self.logic {
                Logic::Bu(_, sink) => self.sink.status(sink.as_ref()),
                _ => Value::Null,
            },
            "net": {
                "bytes_sent": m.payload_bytes_sent,
                "bytes_received": m.payload_bytes_received,
                "frames_sent": m.frames_sent,
                "messages_sent": m.messages_sent,
                "protocol_errors": m.protocol_errors,
                "bytes_copied": t.bytes_copied,
                "bytes_by_reference": t.bytes_by_reference,
            },
            "run_id": self.cfg.run.id,
            "pools": self.reporter.pools(),
            // the EVM: what each node said about itself (rank, host, pid, addresses)
            "registered": (!self.evm.registry.is_empty()).then(|| {
                let mut v: Vec<(usize, Value)> = self.evm.registry.iter().map(|(p, r)| (self.rank_of(*p), json!({
                    "peer": p.to_string(),
                    "rank": (r.rank != evb_wire::discovery::NO_RANK).then_some(r.rank),
                    "host": r.host,
                    "pid": r.pid,
                    "data": r.data,
                    "control": r.control,
                }))).collect();
                v.sort_by_key(|(k, _)| *k);
                v.into_iter().map(|(_, j)| j).collect::<Vec<Value>>()
            }),
            "peers": self.links.conns().map(|(p, c)| json!({
                "peer": p.to_string(),
                "queued_bytes": self.messenger.queued_bytes(c),
            })).collect::<Vec<Value>>(),
        })
    }
}

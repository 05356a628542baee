//! A node's status line: the document `evb run` reads, the control API's snapshot and the
//! final report are all this.

use evb_builder::{
    CpuSeconds, NetStatus, NodeStatus, PeerQueue, PoolStatus, Registered, RoleStats, StatusKind,
};

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
    pub(super) fn send(&mut self, now: Instant, line: NodeStatus) {
        let status_due = now >= self.next_status;
        if now >= self.next_publish {
            self.next_publish = now + PUBLISH_EVERY;
            if status_due {
                self.control.publish(line.clone());
            } else {
                self.control.publish(line);
                return;
            }
        }
        if status_due {
            (self.out)(line);
            self.next_status = now + self.every;
        }
    }

    /// Sends the final report everywhere.
    pub(super) fn report(&mut self, report: NodeStatus) {
        self.control.publish(report.clone());
        (self.out)(report);
    }

    /// Seconds since the node was made.
    fn t(&self, now: Instant) -> f64 {
        now.duration_since(self.started).as_secs_f64()
    }

    /// The process's CPU seconds: in all, and since the run started.
    fn cpu(&self) -> CpuSeconds {
        let cpu = process_cpu_s();
        CpuSeconds {
            process_s: cpu,
            run_s: self.cpu_at_start.map(|c| cpu - c),
        }
    }

    fn pools(&self) -> Vec<PoolStatus> {
        self.pools
            .iter()
            .map(|(what, p)| {
                let st = p.stats();
                PoolStatus {
                    pool: what.to_string(),
                    blocks: st.blocks as u64,
                    block_size: st.block_size as u64,
                    in_use: (st.blocks - st.free) as u64,
                    high_water: st.high_water as u64,
                    exhausted: st.exhausted,
                }
            })
            .collect()
    }
}

impl Driver {
    pub(super) fn status_line(&self, kind: StatusKind, now: Instant) -> NodeStatus {
        let stats = match &self.logic {
            Logic::Evm(e) => RoleStats::Evm(Box::new(e.stats())),
            Logic::Ru(r) => RoleStats::Ru(Box::new(r.stats())),
            Logic::Bu(b, _) => RoleStats::Bu(Box::new(b.stats())),
        };
        let m = self.messenger.stats();
        let t = self.messenger.transport_counters();
        // the EVM: what each node said about itself (rank, host, pid, addresses)
        let registered = (!self.evm.registry.is_empty()).then(|| {
            let mut v: Vec<(usize, Registered)> = self
                .evm
                .registry
                .iter()
                .map(|(p, r)| {
                    let reg = Registered {
                        peer: p.to_string(),
                        rank: (r.rank != evb_wire::discovery::NO_RANK).then_some(r.rank),
                        host: r.host.clone(),
                        pid: r.pid,
                        data: r.data.clone(),
                        control: r.control.clone(),
                    };
                    (self.rank_of(*p), reg)
                })
                .collect();
            v.sort_by_key(|(k, _)| *k);
            v.into_iter().map(|(_, r)| r).collect()
        });
        NodeStatus {
            kind,
            node: self.me.id.clone(),
            role: stats.role(),
            state: self.state(),
            t: self.reporter.t(now),
            cpu: self.reporter.cpu(),
            stats,
            sink: match &self.logic {
                Logic::Bu(_, sink) => Some(self.sink.status(sink.as_ref())),
                _ => None,
            },
            net: NetStatus {
                bytes_sent: m.payload_bytes_sent,
                bytes_received: m.payload_bytes_received,
                frames_sent: m.frames_sent,
                messages_sent: m.messages_sent,
                protocol_errors: m.protocol_errors,
                bytes_copied: t.bytes_copied,
                bytes_by_reference: t.bytes_by_reference,
            },
            run_id: self.cfg.run.id.clone(),
            pools: self.reporter.pools(),
            registered,
            peers: self
                .links
                .conns()
                .map(|(p, c)| PeerQueue {
                    peer: p.to_string(),
                    queued_bytes: self.messenger.queued_bytes(c) as u64,
                })
                .collect(),
            run_number: None,
            ok: None,
            reason: None,
            run: None,
            verdict: None,
            fenced: self.standby.fenced(),
            incarnation: (self.links.own_incarnation() != 0).then(|| self.links.own_incarnation()),
            evm_epoch: matches!(self.logic, Logic::Ru(_) | Logic::Bu(..))
                .then(|| self.links.authority.followed().get()),
        }
    }
}

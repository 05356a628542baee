//! A node's status line: the document `evb run` reads, the control API's snapshot and the
//! final report are all this.

use super::*;

impl Driver {
    pub(super) fn status_line(&self, kind: &str, now: Instant) -> Value {
        let stats = match &self.logic {
            Logic::Evm(e) => serde_json::to_value(e.stats()),
            Logic::Ru(r) => serde_json::to_value(r.stats()),
            Logic::Bu(b, _) => serde_json::to_value(b.stats()),
        }
        .unwrap_or(Value::Null);
        let cpu = process_cpu_s();
        let m = self.messenger.stats();
        let t = self.messenger.transport_counters();
        json!({
            "kind": kind,
            "node": self.me.id,
            "role": format!("{:?}", self.me.role).to_lowercase(),
            "state": self.state(),
            "t": now.duration_since(self.started).as_secs_f64(),
            // the process's CPU seconds: in all, and since the run started
            "cpu": {
                "process_s": cpu,
                "run_s": self.cpu_at_start.map(|c| cpu - c),
            },
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
            "pools": self.pools.iter().map(|(what, p)| {
                let st = p.stats();
                json!({
                    "pool": what,
                    "blocks": st.blocks,
                    "block_size": st.block_size,
                    "in_use": st.blocks - st.free,
                    "high_water": st.high_water,
                    "exhausted": st.exhausted,
                })
            }).collect::<Vec<Value>>(),
            // the EVM: what each node said about itself (rank, host, pid, addresses)
            "registered": (!self.registry.is_empty()).then(|| {
                let mut v: Vec<(usize, Value)> = self.registry.iter().map(|(p, r)| (self.rank_of(*p), json!({
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
            "peers": self.conns.iter().map(|(p, c)| json!({
                "peer": p.to_string(),
                "queued_bytes": self.messenger.queued_bytes(*c),
            })).collect::<Vec<Value>>(),
        })
    }
}

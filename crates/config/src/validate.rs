//! Validation: every key against its range, then every check that needs more than one
//! key, each error naming the key at fault.

use std::collections::HashMap;
use std::net::SocketAddr;

use crate::net::{AllowedNet, Interface};
use crate::{
    invalid, limits, stream, Compress, Config, ConfigError, Distribution, Hdf5Layout, Role,
    RuSection, SinkKind, SourceKind, SourceSection, TransportKind, MAX_CPUS, MAX_FRAGMENT,
};

/// `value` outside `lo ..= hi`: an error naming the key, the value and the range.
pub(crate) fn int_in(
    key: &str,
    value: u64,
    lo: u64,
    hi: u64,
    unit: &str,
) -> Result<(), ConfigError> {
    if (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!("{value} is out of range ({lo} ..= {hi}{unit})"),
        ))
    }
}

/// Like [`int_in`] for a real number; NaN and infinities are out of every range.
pub(crate) fn real_in(
    key: &str,
    value: f64,
    lo: f64,
    hi: f64,
    unit: &str,
) -> Result<(), ConfigError> {
    if value.is_finite() && (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!(
                "{} is out of range ({} ..= {}{unit})",
                real(value),
                real(lo),
                real(hi)
            ),
        ))
    }
}

/// A number as a person would write it: 1e20 rather than twenty-one digits.
fn real(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-3..1e7).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

impl Config {
    /// Spare BUs (`topology.spare_bus`, `[[bu]] spare`): some BU must start the run, and
    /// a spare needs what lets a BU join a running run (no barrel cycle over a fixed set
    /// of BUs, no standby EVM: neither follows a BU that joins).
    fn check_spares(&self) -> Result<(), ConfigError> {
        let t = &self.topology;
        let key = if self.bu.is_empty() {
            "topology.spare_bus"
        } else {
            "bu.spare"
        };
        if !self.bu.is_empty() && t.spare_bus != 0 {
            return Err(invalid(
                "topology.spare_bus",
                "counts make BUs only without [[bu]] entries: mark a listed BU `spare = true`",
            ));
        }
        let spares = self.nodes_unchecked().iter().filter(|n| n.spare).count() as u64;
        if spares == 0 {
            return Ok(());
        }
        if spares == self.n_bu() {
            return Err(invalid(
                key,
                "every BU is a spare: at least one must start the run",
            ));
        }
        if self.n_bu() > limits::MAX_NODES as u64 {
            return Err(invalid(
                key,
                format!(
                    "{} BUs with the spares: at most {}",
                    self.n_bu(),
                    limits::MAX_NODES
                ),
            ));
        }
        if self.traffic.shaping == crate::Shaping::Barrel {
            return Err(invalid(
                key,
                "spare BUs join a running run; traffic.shaping = \"barrel\" cycles over a \
                 fixed set of BUs: use one or the other",
            ));
        }
        if !self.evm.standby.is_empty() {
            return Err(invalid(
                key,
                "spare BUs are not yet followed by a standby EVM (evm.standby): use one or the \
                 other",
            ));
        }
        Ok(())
    }

    /// Whether a run of this configuration ends by itself: `run.events` or `run.duration_s`,
    /// or replay files read once. A run that does not goes on until it is stopped, which
    /// a run under `evb up` is (`evb ctl stop`, the page, Ctrl-C); `evb run` refuses it.
    pub fn ends_by_itself(&self) -> bool {
        let ends_with_data = self.source.kind != SourceKind::Generator && !self.source.looped;
        self.run.events > 0 || self.run.duration_s > 0.0 || ends_with_data
    }

    /// [`Config::validate`], and a run that ends by itself: what `evb run` needs, where no
    /// operator is there to stop it.
    pub fn validate_once(&self) -> Result<(), ConfigError> {
        self.validate()?;
        if !self.ends_by_itself() {
            return Err(invalid(
                "run",
                "set `events` or `duration_s` (or both): a run of `evb run` must end (under \
                 `evb up` a run with neither goes on until `evb ctl stop`)",
            ));
        }
        Ok(())
    }

    /// Every check that needs more than one key, each naming the key at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let r = &self.run;
        if r.id.is_empty() || r.id.len() > 64 {
            return Err(invalid("run.id", "must be 1 to 64 bytes"));
        }
        self.check_ranges()?;
        crate::time::validate(self)?;
        self.check_slots()?;
        crate::api::validate(self)?;

        let needs_ru_entries = !matches!(self.source.kind, SourceKind::Generator | SourceKind::Api);
        if needs_ru_entries && self.ru.is_empty() {
            let what = match self.source.kind {
                SourceKind::Stream => {
                    "stream sources need [[ru]] entries, each listing its `streams`"
                }
                _ => "file sources need [[ru]] entries, each listing its `files`",
            };
            return Err(invalid("source.kind", what));
        }
        stream::validate(self)?;
        self.source.validate_allow(&self.ru)?;
        for (i, ru) in self.ru.iter().enumerate() {
            let key = format!("ru[{i}].files");
            match (self.source.kind, ru.files.is_empty()) {
                (SourceKind::Generator | SourceKind::Stream | SourceKind::Api, false) => {
                    return Err(invalid(
                        key,
                        "only read when source.kind is \"fed\", \"framed\" or \"evb\"",
                    ))
                }
                (SourceKind::Fed | SourceKind::Framed | SourceKind::Evb, true) => {
                    let kind = format!("{:?}", self.source.kind).to_lowercase();
                    return Err(invalid(
                        key,
                        format!("source.kind = \"{kind}\" needs at least one file"),
                    ));
                }
                _ => {}
            }
        }
        let file_sink = self.sink.kind.writes_files()
            || self
                .bu
                .iter()
                .any(|b| b.sink.is_some_and(SinkKind::writes_files));
        if file_sink && self.sink.dir.is_empty() {
            return Err(invalid("sink.dir", "the file sink needs a directory"));
        }
        let hdf5 = self.sink.kind == SinkKind::Hdf5
            || self.bu.iter().any(|b| b.sink == Some(SinkKind::Hdf5));
        if hdf5 && !cfg!(feature = "hdf5") {
            let key = if self.sink.kind == SinkKind::Hdf5 {
                "sink.kind".to_string()
            } else {
                let i = self.bu.iter().position(|b| b.sink == Some(SinkKind::Hdf5));
                format!("bu[{}].sink", i.unwrap_or(0))
            };
            return Err(invalid(
                key,
                "\"hdf5\" needs evb built with HDF5 (cargo build --features hdf5, with \
                 Debian's libhdf5-dev; ./scripts/test.sh does both)",
            ));
        }
        let evb_files = self.sink.kind == SinkKind::File
            || self.bu.iter().any(|b| b.sink == Some(SinkKind::File));
        if self.sink.compress != Compress::None && !evb_files {
            return Err(invalid(
                "sink.compress",
                "only read when a BU's sink is \"file\" (an hdf5 sink compresses with sink.hdf5_deflate)",
            ));
        }
        match self.sink.compress_level {
            Some(l) if !(1..=19).contains(&l) => {
                return Err(invalid(
                    "sink.compress_level",
                    format!("{l} is not a zstd level (1 to 19)"),
                ))
            }
            Some(_) if self.sink.compress != Compress::Zstd => {
                return Err(invalid(
                    "sink.compress_level",
                    "only read with sink.compress = \"zstd\"",
                ))
            }
            _ => {}
        }
        if self.sink.hdf5_deflate > 9 {
            return Err(invalid(
                "sink.hdf5_deflate",
                format!("{} is not a deflate level (0 to 9)", self.sink.hdf5_deflate),
            ));
        }
        if self.sink.hdf5_deflate > 0 && !hdf5 {
            return Err(invalid(
                "sink.hdf5_deflate",
                "only read when a BU's sink is \"hdf5\"",
            ));
        }
        if self.sink.keep_in_page_cache && !file_sink {
            return Err(invalid(
                "sink.keep_in_page_cache",
                "only read when a BU's sink writes files (\"file\" or \"hdf5\")",
            ));
        }
        if self.sink.hdf5_layout != Hdf5Layout::Evb && !hdf5 {
            return Err(invalid(
                "sink.hdf5_layout",
                "only read when a BU's sink is \"hdf5\"",
            ));
        }
        for (i, b) in self.bu.iter().enumerate() {
            if b.serve.is_empty() {
                continue;
            }
            let key = format!("bu[{i}].serve");
            if b.sink.unwrap_or(self.sink.kind) != SinkKind::Serve {
                return Err(invalid(key, "only read when the BU's sink is \"serve\""));
            }
            if b.serve.parse::<std::net::SocketAddr>().is_err() {
                return Err(invalid(
                    key,
                    format!("{:?} is not an IP:port address", b.serve),
                ));
            }
        }
        if self.sink.serve_host.is_empty() {
            return Err(invalid("sink.serve_host", "must not be empty"));
        }
        if let Some(secret) = self.secret() {
            if let Some(why) = weak_secret(&secret) {
                let from_env = std::env::var("EVB_SECRET").is_ok_and(|v| !v.is_empty());
                return Err(invalid(
                    if from_env { "EVB_SECRET" } else { "run.secret" },
                    why,
                ));
            }
        }
        if self.sink.file_group_read && self.secret().is_none() {
            return Err(invalid(
                "sink.file_group_read",
                "takes effect only with run.secret (or EVB_SECRET): without one the output files follow the umask",
            ));
        }
        let serving = self.sink.kind == SinkKind::Serve
            || self.bu.iter().any(|b| b.sink == Some(SinkKind::Serve));
        if serving && self.secret().is_none() {
            // the consumer port is a listener like the data ports: beyond loopback only with
            // a secret, which consumers then prove (docs/operations/security.md, "Security")
            for i in 0..self.n_bu().min(u16::MAX as u64) as u16 {
                let addr = self.serve_addr(i);
                // the same test as the streams' and the data ports'
                let beyond = addr
                    .parse::<std::net::SocketAddr>()
                    .is_ok_and(|sa| !sa.ip().to_canonical().is_loopback());
                if beyond {
                    let key = match self.bu.get(i as usize) {
                        Some(b) if !b.serve.is_empty() => format!("bu[{i}].serve"),
                        _ => "sink.serve_host".to_string(),
                    };
                    return Err(invalid(
                        key,
                        format!("{addr} is beyond loopback: set run.secret (or EVB_SECRET) so that only consumers that prove it get events"),
                    ));
                }
            }
        }
        let committing = self.sink.kind.commits()
            || self
                .bu
                .iter()
                .any(|b| b.sink.is_some_and(SinkKind::commits));
        if committing && self.sink.commit_ms as f64 >= self.run.stall_timeout_s * 1000.0 {
            return Err(invalid(
                "sink.commit_ms",
                format!(
                    "{} ms must be shorter than run.stall_timeout_s ({} s): the EVM waits for \
                     every event to be committed",
                    self.sink.commit_ms, self.run.stall_timeout_s
                ),
            ));
        }
        if serving && self.sink.serve_drain_timeout_s >= self.run.stall_timeout_s {
            return Err(invalid(
                "sink.serve_drain_timeout_s",
                format!(
                    "{} s must be shorter than run.stall_timeout_s ({} s): the EVM waits that long for the BUs' reports",
                    self.sink.serve_drain_timeout_s, self.run.stall_timeout_s
                ),
            ));
        }
        if let Some(local) = self.transport.local {
            if local == TransportKind::Inproc || self.transport.kind == TransportKind::Inproc {
                return Err(invalid("transport.local", "cannot be combined with inproc"));
            }
            if local == self.transport.kind {
                return Err(invalid(
                    "transport.local",
                    "is the same as transport.kind: leave it out",
                ));
            }
        }
        if self.transport.multipath && self.transport.kind != TransportKind::Tcp {
            return Err(invalid(
                "transport.multipath",
                format!(
                    "Multipath TCP needs kind = \"tcp\", not {:?}",
                    self.transport.kind
                ),
            ));
        }
        if !self.transport.interface.is_empty() {
            Interface::parse(&self.transport.interface)
                .map_err(|e| invalid("transport.interface", e))?;
        }
        if self.run.rendezvous.len() > 4096 {
            return Err(invalid("run.rendezvous", "is longer than 4096 bytes"));
        }
        if self.run.records_dir.len() > 4096 {
            return Err(invalid("run.records_dir", "is longer than 4096 bytes"));
        }
        let f = &self.fragments;
        if f.distribution == Distribution::Lognormal {
            if f.max != 0 && f.max < f.size {
                return Err(invalid(
                    "fragments.max",
                    format!("must be at least fragments.size and at most {MAX_FRAGMENT}"),
                ));
            }
            if f.min > f.size {
                return Err(invalid("fragments.min", "must not exceed fragments.size"));
            }
        } else {
            for (k, v) in [
                ("fragments.stddev", f.stddev),
                ("fragments.min", f.min),
                ("fragments.max", f.max),
            ] {
                if v != 0 {
                    return Err(invalid(k, "only applies to distribution = \"lognormal\""));
                }
            }
        }

        let b = &self.buffers;
        let nodes = self.nodes_unchecked();
        let mut ids: HashMap<&str, String> = HashMap::new();
        let mut addrs: HashMap<SocketAddr, String> = HashMap::new();
        let mut sources: HashMap<u16, String> = HashMap::new();
        for n in &nodes {
            let key = self.key_of(n);
            if n.id.is_empty() || n.id.len() > 64 {
                return Err(invalid(format!("{key}.id"), "must be 1 to 64 bytes"));
            }
            if let Some(other) = ids.insert(&n.id, key.clone()) {
                return Err(invalid(
                    format!("{key}.id"),
                    format!("duplicate node id {:?} (also {other})", n.id),
                ));
            }
            if self.transport.kind == TransportKind::Inproc {
                continue;
            }
            let sa: SocketAddr = n.addr.parse().map_err(|_| {
                invalid(
                    format!("{key}.addr"),
                    format!("{:?} is not an IP:port address", n.addr),
                )
            })?;
            if !sa.ip().is_loopback() && self.secret().is_none() {
                return Err(invalid(
                    format!("{key}.addr"),
                    format!("{sa} is beyond loopback: set run.secret (or EVB_SECRET) so strangers cannot join the run"),
                ));
            }
            if sa.port() != 0 {
                if let Some(other) = addrs.insert(sa, key.clone()) {
                    return Err(invalid(
                        format!("{key}.addr"),
                        format!("port clash: {sa} is also {other}'s address"),
                    ));
                }
            }
            let ctl_key = if n.control == self.made_control(n) {
                "control.host".to_string()
            } else {
                format!("{key}.control")
            };
            let ca: SocketAddr = n.control.parse().map_err(|_| {
                invalid(
                    &ctl_key,
                    format!("{:?} is not an IP:port address", n.control),
                )
            })?;
            if !ca.ip().is_loopback() && self.secret().is_none() {
                return Err(invalid(
                    ctl_key,
                    format!("{ca} is beyond loopback: set run.secret (or EVB_SECRET): the control API then requires it as a bearer token"),
                ));
            }
            if ca.port() != 0 {
                if let Some(other) = addrs.insert(ca, format!("{key}.control")) {
                    return Err(invalid(
                        format!("{key}.control"),
                        format!("port clash: {ca} is also {other}'s address"),
                    ));
                }
            }
            if n.role == Role::Ru {
                if let Some(other) = sources.insert(n.source_id, key.clone()) {
                    return Err(invalid(
                        format!("{key}.source_id"),
                        format!("source id {} is also {other}'s", n.source_id),
                    ));
                }
            }
        }
        for (key, addr) in [
            ("evm.standby", &self.evm.standby),
            ("evm.standby_control", &self.evm.standby_control),
        ] {
            if addr.is_empty() || self.transport.kind == TransportKind::Inproc {
                continue;
            }
            let sa: SocketAddr = addr
                .parse()
                .map_err(|_| invalid(key, format!("{addr:?} is not an IP:port address")))?;
            if !sa.ip().is_loopback() && self.secret().is_none() {
                return Err(invalid(
                    key,
                    format!("{sa} is beyond loopback: set run.secret (or EVB_SECRET)"),
                ));
            }
            if sa.port() != 0 {
                if let Some(other) = addrs.insert(sa, key.to_string()) {
                    return Err(invalid(
                        key,
                        format!("port clash: {sa} is also {other}'s address"),
                    ));
                }
            }
        }
        if self.evm.standby.is_empty() && !self.evm.standby_control.is_empty() {
            return Err(invalid(
                "evm.standby_control",
                "set evm.standby too: a standby's control API without a standby",
            ));
        }
        for (id, cpus) in &self.affinity {
            let key = format!("affinity.{id}");
            if !ids.contains_key(id.as_str()) {
                return Err(invalid(key, format!("no node {id:?} in this run")));
            }
            if cpus.is_empty() {
                return Err(invalid(key, "list at least one CPU"));
            }
            if let Some(c) = cpus.iter().find(|&&c| c >= MAX_CPUS) {
                return Err(invalid(
                    key,
                    format!("CPU {c} is out of range (0 to {})", MAX_CPUS - 1),
                ));
            }
        }
        // explicit pools must hold what the credits allow in flight, with fragments as
        // large as the source may make (`source.max_fragment` for recorded data)
        let (ru_need, bu_need) = self.pool_needs()?;
        let largest = match self.source.kind {
            SourceKind::Generator => "fragments",
            SourceKind::Stream => "super-fragments (streams × source.max_fragment)",
            _ => "source.max_fragment",
        };
        if b.ru_pool_mib != 0 && b.ru_pool_mib << 20 < ru_need {
            return Err(invalid(
                "buffers.ru_pool_mib",
                format!(
                    "too small: the credits allow {} MiB in flight per RU with {largest} of up to {} bytes",
                    ru_need.div_ceil(1 << 20),
                    self.max_fragment()
                ),
            ));
        }
        if b.bu_pool_mib != 0 && b.bu_pool_mib << 20 < bu_need {
            return Err(invalid(
                "buffers.bu_pool_mib",
                format!(
                    "too small: the credits allow {} MiB in flight per BU with {largest} of up to {} bytes",
                    bu_need.div_ceil(1 << 20),
                    self.max_fragment()
                ),
            ));
        }
        // the pools of all the nodes together must be a number
        self.pool_bytes(&nodes)?;
        Ok(())
    }

    /// The barrel shifter's slot: one length (given, or from the link rate, not both), and
    /// room for the largest fragment with its prefix (a slot is never over-filled, so a
    /// fragment larger than a slot could never be sent).
    fn check_slots(&self) -> Result<(), ConfigError> {
        let t = &self.traffic;
        if t.slot_us != 0 && t.link_mbps != 0 {
            return Err(invalid(
                "traffic.slot_us",
                "give the slot length or traffic.link_mbps (the slot is then as long as \
                 slot_bytes takes at that rate), not both",
            ));
        }
        if t.shaping == crate::Shaping::Barrel {
            let largest = self
                .max_fragment()
                .saturating_add(crate::FRAGMENT_PREFIX_BYTES);
            if self.slot_bytes() < largest {
                return Err(invalid(
                    "traffic.slot_bytes",
                    format!(
                        "{} bytes is less than the largest fragment with its prefix \
                         ({largest} bytes): a slot is never over-filled, so that fragment \
                         could never be sent",
                        t.slot_bytes
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Every number against its range (see [`limits`]), before anything computes with them.
    fn check_ranges(&self) -> Result<(), ConfigError> {
        use limits::*;
        let r = &self.run;
        int_in("run.events", r.events, 0, MAX_EVENTS, "")?;
        if self.traffic.slot_us != 0 {
            int_in(
                "traffic.slot_us",
                self.traffic.slot_us,
                10,
                1_000_000,
                " µs",
            )?;
        }
        int_in(
            "traffic.link_mbps",
            self.traffic.link_mbps,
            0,
            10_000_000,
            " Mb/s",
        )?;
        if self.traffic.slot_bytes != 0 {
            int_in(
                "traffic.slot_bytes",
                self.traffic.slot_bytes,
                1024,
                1 << 30,
                " bytes",
            )?;
        }
        real_in("run.duration_s", r.duration_s, 0.0, MAX_SECONDS, " s")?;
        real_in("run.rate_hz", r.rate_hz, 0.0, MAX_RATE_HZ, " Hz")?;
        for (key, v) in [
            ("run.stall_timeout_s", r.stall_timeout_s),
            ("run.connect_timeout_s", r.connect_timeout_s),
        ] {
            real_in(key, v, MIN_TIMEOUT_S, MAX_SECONDS, " s")?;
        }
        int_in(
            "run.heartbeat_ms",
            r.heartbeat_ms,
            1,
            MAX_HEARTBEAT_MS,
            " ms",
        )?;
        // run.heartbeat_ms is at most a minute: twice it cannot overflow
        int_in(
            "run.heartbeat_timeout_ms",
            r.heartbeat_timeout_ms,
            2 * r.heartbeat_ms,
            MAX_HEARTBEAT_TIMEOUT_MS,
            " ms: at least twice run.heartbeat_ms",
        )?;
        let f = &self.fragments;
        int_in("fragments.size", f.size, 1, MAX_FRAGMENT, " bytes")?;
        for (key, v) in [
            ("fragments.stddev", f.stddev),
            ("fragments.min", f.min),
            ("fragments.max", f.max),
        ] {
            int_in(key, v, 0, MAX_FRAGMENT, " bytes")?;
        }
        int_in(
            "source.max_fragment",
            self.source.max_fragment,
            1,
            MAX_FRAGMENT,
            " bytes",
        )?;
        let b = &self.builder;
        int_in(
            "builder.credits",
            b.credits.into(),
            0,
            MAX_CREDITS.into(),
            "",
        )?;
        int_in("builder.batch", b.batch.into(), 0, MAX_BATCH.into(), "")?;
        let p = &self.buffers;
        let block = p.block_size;
        int_in("buffers.block_size", block, MIN_BLOCK, MAX_BLOCK, " bytes")?;
        int_in(
            "buffers.ru_pool_mib",
            p.ru_pool_mib,
            0,
            MAX_POOL_MIB,
            " MiB",
        )?;
        int_in(
            "buffers.bu_pool_mib",
            p.bu_pool_mib,
            0,
            MAX_POOL_MIB,
            " MiB",
        )?;
        let m = &self.messaging;
        int_in(
            "messaging.page_size",
            m.page_size,
            MIN_PAGE,
            MAX_PAGE,
            " bytes",
        )?;
        int_in("messaging.flush_us", m.flush_us, 0, MAX_POLL_US, " µs")?;
        int_in(
            "messaging.busy_poll_us",
            m.busy_poll_us,
            0,
            MAX_POLL_US,
            " µs",
        )?;
        let s = &self.sink;
        int_in("sink.file_max_events", s.file_max_events, 0, MAX_EVENTS, "")?;
        int_in("sink.file_max_mib", s.file_max_mib, 0, MAX_FILE_MIB, " MiB")?;
        int_in(
            "sink.commit_events",
            s.commit_events,
            0,
            MAX_CREDITS as u64,
            "",
        )?;
        int_in("sink.commit_ms", s.commit_ms, 1, 3_600_000, " ms")?;
        int_in(
            "sink.serve_max_held",
            s.serve_max_held.into(),
            1,
            MAX_SERVE_HELD,
            "",
        )?;
        int_in(
            "sink.serve_hold",
            s.serve_hold.into(),
            0,
            MAX_CREDITS.into(),
            "",
        )?;
        real_in(
            "sink.serve_ack_timeout_s",
            s.serve_ack_timeout_s,
            MIN_TIMEOUT_S,
            MAX_SECONDS,
            " s",
        )?;
        real_in(
            "sink.serve_drain_timeout_s",
            s.serve_drain_timeout_s,
            0.0,
            MAX_SECONDS,
            " s",
        )?;
        let last = s.serve_base_port as u64 + self.n_bu().saturating_sub(1);
        if s.serve_base_port != 0 && last > u16::MAX as u64 {
            return Err(invalid(
                "sink.serve_base_port",
                format!(
                    "{} is too high for {} BUs: the last would get port {last} (> 65535)",
                    s.serve_base_port,
                    self.n_bu()
                ),
            ));
        }
        let t = &self.topology;
        if self.ru.is_empty() && t.rus == 0 {
            return Err(invalid("topology.rus", "must be at least 1"));
        }
        if self.bu.is_empty() && t.bus == 0 {
            return Err(invalid(
                "topology.bus",
                "BU count 0: at least one builder unit is needed",
            ));
        }
        let max = MAX_NODES.into();
        int_in("topology.rus", t.rus.into(), 0, max, "")?;
        int_in("topology.bus", t.bus.into(), 0, max, "")?;
        int_in("topology.spare_bus", t.spare_bus.into(), 0, max, "")?;
        self.check_spares()?;
        if self.ru.len() as u64 > max {
            return Err(invalid("ru", format!("at most {MAX_NODES} RUs")));
        }
        if self.bu.len() as u64 > max {
            return Err(invalid("bu", format!("at most {MAX_NODES} BUs")));
        }
        let c = &self.control;
        let last = c.base_port as u64 + self.n_ru() + self.n_bu();
        if c.base_port != 0 && last > u16::MAX as u64 {
            return Err(invalid(
                "control.base_port",
                format!(
                    "{} is too high for {} nodes: the last would get port {last} (> 65535)",
                    c.base_port,
                    1 + self.n_ru() + self.n_bu()
                ),
            ));
        }
        // the EVM takes base_port, the RUs and BUs the ports after it
        let last = t.base_port as u64 + self.n_ru() + self.n_bu();
        if t.base_port != 0 && last > u16::MAX as u64 {
            return Err(invalid(
                "topology.base_port",
                format!(
                    "{} is too high for {} nodes: the last would get port {last} (> 65535)",
                    t.base_port,
                    1 + self.n_ru() + self.n_bu()
                ),
            ));
        }
        for (i, bu) in self.bu.iter().enumerate() {
            if let Some(c) = bu.credits {
                int_in(
                    &format!("bu[{i}].credits"),
                    c.into(),
                    1,
                    MAX_CREDITS.into(),
                    "",
                )?;
            }
            if let Some(us) = bu.sink_delay_us {
                int_in(
                    &format!("bu[{i}].sink_delay_us"),
                    us,
                    0,
                    MAX_SINK_DELAY_US,
                    " µs",
                )?;
            }
            if let Some(n) = bu.sink_delay_events {
                int_in(&format!("bu[{i}].sink_delay_events"), n, 0, MAX_EVENTS, "")?;
            }
        }
        Ok(())
    }
}

impl SourceSection {
    /// Checks `source.allow_from` against the streams' addresses; errors name the key.
    fn validate_allow(&self, ru: &[RuSection]) -> Result<(), ConfigError> {
        const KEY: &str = "source.allow_from";
        let Some(list) = &self.allow_from else {
            if self.kind != SourceKind::Stream {
                return Ok(());
            }
            // unset: loopback only, so every stream must listen on loopback
            for (i, r) in ru.iter().enumerate() {
                for (j, a) in r.streams.iter().enumerate() {
                    let beyond = a
                        .parse::<SocketAddr>()
                        .is_ok_and(|sa| !sa.ip().to_canonical().is_loopback());
                    if beyond {
                        return Err(invalid(
                            KEY,
                            format!(
                                "ru[{i}].streams[{j}] listens on {a}, beyond loopback: list the \
                                 front-ends allowed to connect (e.g. allow_from = [\"10.0.0.0/24\"]); \
                                 unset, streams take connections from loopback only \
                                 (a stream is plain TCP: a FEROL cannot prove who it is)"
                            ),
                        ));
                    }
                }
            }
            return Ok(());
        };
        if self.kind != SourceKind::Stream {
            return Err(invalid(KEY, "only read when source.kind = \"stream\""));
        }
        if list.is_empty() {
            return Err(invalid(
                KEY,
                "empty: no front-end could connect; list the front-ends' addresses or \
                 networks (\"10.0.0.7\", \"10.0.0.0/24\"), or leave it out for loopback only",
            ));
        }
        for (j, s) in list.iter().enumerate() {
            AllowedNet::parse(s).map_err(|e| invalid(format!("{KEY}[{j}]"), e))?;
        }
        Ok(())
    }
}

/// Least length of a secret, in characters, and least number of different characters in it.
pub const SECRET_MIN_CHARS: usize = 16;
pub const SECRET_MIN_DISTINCT: usize = 8;

/// Why `secret` is too weak to stand between a stranger and the run, if it is. A stranger
/// that opens a handshake receives an HMAC keyed by the secret over bytes mostly of its
/// choosing (docs/protocol.md §1), so a short or guessable secret could be found offline;
/// `evb config secret` makes one of 256 random bits.
pub fn weak_secret(secret: &str) -> Option<String> {
    let chars = secret.chars().count();
    let distinct = secret
        .chars()
        .collect::<std::collections::BTreeSet<char>>()
        .len();
    if chars < SECRET_MIN_CHARS {
        return Some(format!(
            "{chars} characters: a secret needs at least {SECRET_MIN_CHARS} (`evb config secret` makes a strong one)"
        ));
    }
    if distinct < SECRET_MIN_DISTINCT {
        return Some(format!(
            "only {distinct} different characters: a secret needs at least {SECRET_MIN_DISTINCT} (`evb config secret` makes a strong one)"
        ));
    }
    None
}

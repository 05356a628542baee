//! The declarative description of a run: a TOML file, parsed with unknown keys refused and
//! then validated, so every mistake comes back as an error that names the key.
//!
//! Nodes are listed one by one (`[[ru]]`, `[[bu]]`, for a multi-host deployment) or made
//! from counts (`[topology] rus = 2, bus = 2`, for a local test system).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

#[cfg(test)]
mod tests;

#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    /// Bad TOML, an unknown key, or a value of the wrong type (the message names the key).
    #[error("{0}")]
    Parse(String),
    #[error("invalid configuration: `{key}`: {reason}")]
    Invalid { key: String, reason: String },
}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub run: RunSection,
    pub fragments: FragmentSection,
    pub builder: BuilderSection,
    pub buffers: BufferSection,
    pub messaging: MessagingSection,
    pub transport: TransportSection,
    pub topology: TopologySection,
    pub evm: EvmSection,
    pub source: SourceSection,
    pub sink: SinkSection,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ru: Vec<RuSection>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bu: Vec<BuSection>,
    /// CPUs each node may run on, by node id (`evm = [0]`, `bu1 = [2, 3]`); nodes not listed
    /// run wherever the system puts them.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub affinity: BTreeMap<String, Vec<usize>>,
}

/// CPU numbers an affinity list may name (the kernel's `CPU_SETSIZE`).
pub const MAX_CPUS: usize = 1024;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    /// Named in every connection's handshake: nodes of another run are refused.
    pub id: String,
    /// Stop triggering after this many events (0: no limit).
    pub events: u64,
    /// Stop triggering after this many seconds (0: no limit).
    pub duration_s: f64,
    /// Trigger rate limit in Hz (0: as fast as credits allow).
    pub rate_hz: f64,
    /// Abort if events are in flight and none completes for this long.
    pub stall_timeout_s: f64,
    /// How long a node keeps retrying to connect to its peers at start.
    pub connect_timeout_s: f64,
    /// Seed of the generator (sizes and contents).
    pub seed: u64,
    /// Nodes and the EVM exchange heartbeats this often when otherwise idle (ms).
    pub heartbeat_ms: u64,
    /// A peer silent for this long is declared lost (ms).
    pub heartbeat_timeout_ms: u64,
    /// Shared secret every connection must prove (HMAC handshake); the environment variable
    /// EVB_SECRET overrides it. Required when any node listens beyond loopback.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub secret: String,
}

impl Default for RunSection {
    fn default() -> Self {
        RunSection {
            id: "evb-local".into(),
            events: 0,
            duration_s: 10.0,
            rate_hz: 0.0,
            stall_timeout_s: 10.0,
            connect_timeout_s: 10.0,
            seed: 1,
            heartbeat_ms: 200,
            heartbeat_timeout_ms: 1000,
            secret: String::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Distribution {
    Fixed,
    Lognormal,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FragmentSection {
    /// Payload bytes per fragment (the mean, for log-normal sizes).
    pub size: u64,
    pub distribution: Distribution,
    /// Log-normal standard deviation in bytes (0: equal to `size`).
    pub stddev: u64,
    /// Log-normal bounds (0: 1 byte and 4 × `size`).
    pub min: u64,
    pub max: u64,
    /// Generator content: "unique" (from event and source id; the RU writes every byte) or
    /// "static" (from the source id only; made once and sent from memory, like DMA'd readout
    /// data, to measure the event builder without the cost of making data).
    pub content: Content,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Content {
    #[default]
    Unique,
    Static,
}

impl Default for FragmentSection {
    fn default() -> Self {
        FragmentSection {
            size: 512 * 1024,
            distribution: Distribution::Fixed,
            stddev: 0,
            min: 0,
            max: 0,
            content: Content::Unique,
        }
    }
}

impl FragmentSection {
    /// The largest fragment payload the generator can make.
    pub fn max_size(&self) -> u64 {
        match self.distribution {
            Distribution::Fixed => self.size,
            Distribution::Lognormal => {
                if self.max > 0 {
                    self.max
                } else {
                    4 * self.size
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum VerifyLevel {
    Headers,
    Crc,
    Full,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BuilderSection {
    /// Events each BU may hold at once (its credits), unless a `[[bu]]` entry says otherwise;
    /// 0: about 16 MiB worth of events (16 to 4096).
    pub credits: u32,
    /// Consecutive events assigned to one BU at a time (0: automatic, from the event size).
    pub batch: u32,
    pub verify: VerifyLevel,
    /// A lost RU: "stop" the run, or go on building "partial" events without it.
    pub on_ru_loss: RuLossPolicy,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RuLossPolicy {
    Stop,
    Partial,
}

impl Default for BuilderSection {
    fn default() -> Self {
        BuilderSection {
            credits: 0,
            batch: 0,
            verify: VerifyLevel::Full,
            on_ru_loss: RuLossPolicy::Stop,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BufferSection {
    /// Bytes per pool block.
    pub block_size: u64,
    /// RU pool size in MiB (0: sized from credits and fragment sizes).
    pub ru_pool_mib: u64,
    /// BU receive pool size in MiB (0: sized from credits and event sizes).
    pub bu_pool_mib: u64,
}

impl Default for BufferSection {
    fn default() -> Self {
        BufferSection {
            block_size: 256 * 1024,
            ru_pool_mib: 0,
            bu_pool_mib: 0,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MessagingSection {
    /// A page is sent when it holds this many bytes.
    pub page_size: u64,
    /// A partly filled page waits at most this long (0: sent at the end of each loop pass).
    pub flush_us: u64,
    /// Busy-poll: keep polling (yielding the core) this long before sleeping in epoll (µs).
    /// Lower latency when cores are free; 0 (default) always sleeps.
    pub busy_poll_us: u64,
}

impl Default for MessagingSection {
    fn default() -> Self {
        MessagingSection {
            page_size: 256 * 1024,
            flush_us: 0,
            busy_poll_us: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// Every node its own process, TCP between them.
    Tcp,
    /// Every node a thread of one process (`evb run` only).
    Inproc,
    /// Processes on one host: payloads in shared memory, only descriptors move.
    Shm,
    /// libfabric (verbs on InfiniBand/RoCE, its tcp provider here), addressed by IP:port.
    Ofi,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TransportSection {
    pub kind: TransportKind,
    /// libfabric provider for `ofi` ("verbs", "tcp", "sockets", ...; empty: the best available).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub provider: String,
    /// Transport for routes between nodes on the same host (same IP address), e.g. "shm"
    /// with `kind = "tcp"` for the rest. Absent: `kind` everywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<TransportKind>,
}

impl Default for TransportSection {
    fn default() -> Self {
        TransportSection {
            kind: TransportKind::Tcp,
            provider: String::new(),
            local: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TopologySection {
    /// Number of RUs made when no `[[ru]]` is listed.
    pub rus: u32,
    /// Number of BUs made when no `[[bu]]` is listed.
    pub bus: u32,
    /// Host of the nodes made from counts.
    pub host: String,
    /// First port: the EVM gets it, then the RUs, then the BUs (0: the launcher picks free ports).
    pub base_port: u16,
}

impl Default for TopologySection {
    fn default() -> Self {
        TopologySection {
            rus: 2,
            bus: 2,
            host: "127.0.0.1".into(),
            base_port: 0,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EvmSection {
    pub id: String,
    /// host:port (empty: from the topology section).
    pub addr: String,
}

impl Default for EvmSection {
    fn default() -> Self {
        EvmSection {
            id: "evm".into(),
            addr: String::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuSection {
    pub id: String,
    /// host:port (empty: the topology host, port from base_port or picked by `evb run`).
    #[serde(default)]
    pub addr: String,
    /// Source id in this RU's fragment headers (default: its index).
    pub source_id: Option<u16>,
    /// Files replayed by this RU when `source.kind` is a file format, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// Built-in generator (sizes from `[fragments]`, content verifiable byte by byte).
    Generator,
    /// CMS common FED format files.
    Fed,
    /// evb's generic framed fragment files.
    Framed,
    /// evb built-event files (a recorded run replayed): each RU takes its source's fragments.
    Evb,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// A bad recorded fragment stops the run before it starts, naming the file and offset.
    Stop,
    /// A bad recorded fragment is counted and replaced by an empty fragment flagged MISSING:
    /// its event is built as partial with that source flagged.
    Drop,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SourceSection {
    pub kind: SourceKind,
    /// Replay the files again from the start when they end (otherwise the run ends there).
    #[serde(rename = "loop")]
    pub looped: bool,
    pub on_error: OnError,
    /// FED files: each fragment's source id must be the RU's `source_id`.
    pub check_source_id: bool,
    /// Largest recorded fragment accepted (bytes); sizes buffers for file sources.
    pub max_fragment: u64,
}

impl Default for SourceSection {
    fn default() -> Self {
        SourceSection {
            kind: SourceKind::Generator,
            looped: false,
            on_error: OnError::Stop,
            check_source_id: true,
            max_fragment: 1 << 20,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SinkSection {
    /// What every BU does with built events, unless its `[[bu]]` entry says otherwise.
    pub kind: SinkKind,
    /// `file` sink: the directory the BUs write into.
    pub dir: String,
    /// `file` sink: start a new file after this many events (0: no limit).
    pub file_max_events: u64,
    /// `file` sink: start a new file after this many MiB (0: no limit).
    pub file_max_mib: u64,
}

impl Default for SinkSection {
    fn default() -> Self {
        SinkSection {
            kind: SinkKind::Discard,
            dir: String::new(),
            file_max_events: 0,
            file_max_mib: 1024,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    Discard,
    Count,
    /// Files of built events in `sink.dir`.
    File,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BuSection {
    pub id: String,
    #[serde(default)]
    pub addr: String,
    pub credits: Option<u32>,
    pub sink: Option<SinkKind>,
    /// Testing back-pressure: each delivery to the sink takes this long (µs)...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink_delay_us: Option<u64>,
    /// ... for this many events (0 or absent: all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink_delay_events: Option<u64>,
}

/// One node of the run, after validation.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    pub id: String,
    pub role: Role,
    /// Index among the nodes of its role.
    pub index: u16,
    pub addr: String,
    pub source_id: u16,
    pub credits: u32,
    pub sink: SinkKind,
    /// Recorded files this RU replays.
    pub files: Vec<String>,
    /// Testing: sink delay per event (µs) and for how many events (0: all).
    pub sink_delay: Option<(u64, u64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Evm,
    Ru,
    Bu,
}

/// The default configuration as a commented TOML file (`evb config default`).
pub const DEFAULT_TOML: &str = include_str!("default.toml");

/// Largest single fragment accepted in a configuration.
pub const MAX_FRAGMENT: u64 = 256 << 20;
const MAX_NODES: u32 = 4096;

impl Config {
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text)
            .map_err(|e| ConfigError::Parse(e.to_string().trim_end().to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads a file; relative paths in it (`[[ru]] files`, `sink.dir`) are taken relative
    /// to the file's own directory.
    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let mut cfg = Config::from_toml(&text).map_err(|e| match e {
            ConfigError::Parse(m) => ConfigError::Parse(format!("{}: {m}", path.display())),
            other => other,
        })?;
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        let base = std::path::absolute(parent).unwrap_or_else(|_| parent.to_path_buf());
        let rebase = |p: &mut String| {
            if !p.is_empty() && std::path::Path::new(p.as_str()).is_relative() {
                *p = base.join(p.as_str()).display().to_string();
            }
        };
        for ru in &mut cfg.ru {
            ru.files.iter_mut().for_each(rebase);
        }
        rebase(&mut cfg.sink.dir);
        Ok(cfg)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a Config always serialises")
    }

    /// Every check that needs more than one key, each naming the key at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let r = &self.run;
        if r.id.is_empty() || r.id.len() > 64 {
            return Err(invalid("run.id", "must be 1 to 64 bytes"));
        }
        if !(r.duration_s >= 0.0 && r.duration_s.is_finite()) {
            return Err(invalid(
                "run.duration_s",
                "must be a non-negative number of seconds",
            ));
        }
        let ends_with_data = self.source.kind != SourceKind::Generator && !self.source.looped;
        if r.events == 0 && r.duration_s == 0.0 && !ends_with_data {
            return Err(invalid(
                "run",
                "set `events` or `duration_s` (or both): a run must end",
            ));
        }
        if self.source.kind != SourceKind::Generator {
            if self.ru.is_empty() {
                return Err(invalid(
                    "source.kind",
                    "file sources need [[ru]] entries, each listing its `files`",
                ));
            }
            if self.source.max_fragment == 0 || self.source.max_fragment > MAX_FRAGMENT {
                return Err(invalid(
                    "source.max_fragment",
                    format!("must be 1 to {MAX_FRAGMENT} bytes"),
                ));
            }
        }
        for (i, ru) in self.ru.iter().enumerate() {
            let key = format!("ru[{i}].files");
            match (self.source.kind, ru.files.is_empty()) {
                (SourceKind::Generator, false) => {
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
        let file_sink = self.sink.kind == SinkKind::File
            || self.bu.iter().any(|b| b.sink == Some(SinkKind::File));
        if file_sink && self.sink.dir.is_empty() {
            return Err(invalid("sink.dir", "the file sink needs a directory"));
        }
        if !(r.rate_hz >= 0.0 && r.rate_hz.is_finite()) {
            return Err(invalid(
                "run.rate_hz",
                "must be zero (no limit) or a positive rate",
            ));
        }
        if !(r.stall_timeout_s > 0.0 && r.stall_timeout_s.is_finite()) {
            return Err(invalid("run.stall_timeout_s", "must be positive"));
        }
        if r.heartbeat_ms == 0 {
            return Err(invalid("run.heartbeat_ms", "must be positive"));
        }
        if r.heartbeat_timeout_ms <= r.heartbeat_ms {
            return Err(invalid(
                "run.heartbeat_timeout_ms",
                "must be longer than run.heartbeat_ms",
            ));
        }
        if !(r.connect_timeout_s > 0.0 && r.connect_timeout_s.is_finite()) {
            return Err(invalid("run.connect_timeout_s", "must be positive"));
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
        let f = &self.fragments;
        if f.size == 0 || f.size > MAX_FRAGMENT {
            return Err(invalid(
                "fragments.size",
                format!("must be 1 to {MAX_FRAGMENT} bytes"),
            ));
        }
        if f.distribution == Distribution::Lognormal {
            if f.max != 0 && (f.max < f.size || f.max > MAX_FRAGMENT) {
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
        if b.block_size < 4096 || b.block_size > (1 << 30) {
            return Err(invalid("buffers.block_size", "must be 4096 bytes to 1 GiB"));
        }
        if self.messaging.page_size < 64 || self.messaging.page_size > (64 << 20) {
            return Err(invalid("messaging.page_size", "must be 64 bytes to 64 MiB"));
        }
        let t = &self.topology;
        if self.ru.is_empty() {
            if t.rus == 0 {
                return Err(invalid("topology.rus", "must be at least 1"));
            }
            if t.rus > MAX_NODES {
                return Err(invalid("topology.rus", format!("at most {MAX_NODES}")));
            }
        }
        if self.bu.is_empty() {
            if t.bus == 0 {
                return Err(invalid(
                    "topology.bus",
                    "BU count 0: at least one builder unit is needed",
                ));
            }
            if t.bus > MAX_NODES {
                return Err(invalid("topology.bus", format!("at most {MAX_NODES}")));
            }
        }
        if t.base_port != 0 && t.base_port as u32 + t.rus + t.bus > u16::MAX as u32 {
            return Err(invalid(
                "topology.base_port",
                "too high for the number of nodes",
            ));
        }
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
            if n.role == Role::Ru {
                if let Some(other) = sources.insert(n.source_id, key.clone()) {
                    return Err(invalid(
                        format!("{key}.source_id"),
                        format!("source id {} is also {other}'s", n.source_id),
                    ));
                }
            }
            if n.role == Role::Bu && n.credits == 0 {
                return Err(invalid(format!("{key}.credits"), "must be at least 1"));
            }
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
        if nodes.iter().filter(|n| n.role == Role::Ru).count() > MAX_NODES as usize {
            return Err(invalid("ru", format!("at most {MAX_NODES} RUs")));
        }
        if nodes.iter().filter(|n| n.role == Role::Bu).count() > MAX_NODES as usize {
            return Err(invalid("bu", format!("at most {MAX_NODES} BUs")));
        }
        // explicit pools must hold what the credits allow in flight
        let (ru_need, bu_need) = self.pool_needs();
        if b.ru_pool_mib != 0 && b.ru_pool_mib << 20 < ru_need {
            return Err(invalid(
                "buffers.ru_pool_mib",
                format!(
                    "too small: the credits allow {} MiB in flight per RU",
                    ru_need >> 20
                ),
            ));
        }
        if b.bu_pool_mib != 0 && b.bu_pool_mib << 20 < bu_need {
            return Err(invalid(
                "buffers.bu_pool_mib",
                format!(
                    "too small: the credits allow {} MiB in flight per BU",
                    bu_need >> 20
                ),
            ));
        }
        Ok(())
    }

    fn key_of(&self, n: &NodeSpec) -> String {
        match n.role {
            Role::Evm => "evm".into(),
            Role::Ru if self.ru.is_empty() => format!("topology.rus (ru{})", n.index),
            Role::Bu if self.bu.is_empty() => format!("topology.bus (bu{})", n.index),
            Role::Ru => format!("ru[{}]", n.index),
            Role::Bu => format!("bu[{}]", n.index),
        }
    }

    /// Every node: the EVM first, then the RUs, then the BUs.
    pub fn nodes(&self) -> Vec<NodeSpec> {
        self.nodes_unchecked()
    }

    fn nodes_unchecked(&self) -> Vec<NodeSpec> {
        let t = &self.topology;
        let port = |k: u32| {
            if t.base_port == 0 {
                0
            } else {
                t.base_port as u32 + k
            }
        };
        let auto = |k: u32| format!("{}:{}", t.host, port(k));
        let or_auto = |addr: &str, k: u32| {
            if addr.is_empty() {
                auto(k)
            } else {
                addr.to_string()
            }
        };
        let mut v = vec![NodeSpec {
            id: self.evm.id.clone(),
            role: Role::Evm,
            index: 0,
            addr: or_auto(&self.evm.addr, 0),
            source_id: 0,
            credits: 0,
            sink: SinkKind::Discard,
            files: Vec::new(),
            sink_delay: None,
        }];
        let n_ru = if self.ru.is_empty() {
            t.rus
        } else {
            self.ru.len() as u32
        };
        for i in 0..n_ru {
            let (id, addr, source_id, files) = match self.ru.get(i as usize) {
                Some(r) => (
                    r.id.clone(),
                    or_auto(&r.addr, 1 + i),
                    r.source_id.unwrap_or(i as u16),
                    r.files.clone(),
                ),
                None => (format!("ru{i}"), auto(1 + i), i as u16, Vec::new()),
            };
            v.push(NodeSpec {
                id,
                role: Role::Ru,
                index: i as u16,
                addr,
                source_id,
                credits: 0,
                sink: SinkKind::Discard,
                files,
                sink_delay: None,
            });
        }
        let n_bu = if self.bu.is_empty() {
            t.bus
        } else {
            self.bu.len() as u32
        };
        for i in 0..n_bu {
            let (id, addr, credits, sink) = match self.bu.get(i as usize) {
                Some(b) => (
                    b.id.clone(),
                    or_auto(&b.addr, 1 + n_ru + i),
                    b.credits.unwrap_or_else(|| self.default_credits()),
                    b.sink.unwrap_or(self.sink.kind),
                ),
                None => (
                    format!("bu{i}"),
                    auto(1 + n_ru + i),
                    self.default_credits(),
                    self.sink.kind,
                ),
            };
            let sink_delay = self.bu.get(i as usize).and_then(|b| {
                b.sink_delay_us
                    .map(|d| (d, b.sink_delay_events.unwrap_or(0)))
            });
            v.push(NodeSpec {
                id,
                role: Role::Bu,
                index: i as u16,
                addr,
                source_id: 0,
                credits,
                sink,
                files: Vec::new(),
                sink_delay,
            });
        }
        v
    }

    /// The shared secret in force: EVB_SECRET if set, else `run.secret`; `None` if neither.
    pub fn secret(&self) -> Option<String> {
        match std::env::var("EVB_SECRET") {
            Ok(s) if !s.is_empty() => Some(s),
            _ => (!self.run.secret.is_empty()).then(|| self.run.secret.clone()),
        }
    }

    /// Credits of a BU without its own: `builder.credits`, or when that is 0 enough events to
    /// hold about 16 MiB (16 to 4096): small events need many in flight to keep the pipes full.
    pub fn default_credits(&self) -> u32 {
        if self.builder.credits > 0 {
            return self.builder.credits;
        }
        let n_ru = if self.ru.is_empty() {
            self.topology.rus as u64
        } else {
            self.ru.len() as u64
        };
        let event = n_ru.max(1) * (self.max_fragment() + 64);
        ((16u64 << 20) / event).clamp(16, 4096) as u32
    }

    /// The largest fragment payload any RU can send.
    pub fn max_fragment(&self) -> u64 {
        match self.source.kind {
            SourceKind::Generator => self.fragments.max_size(),
            _ => self.source.max_fragment,
        }
    }

    /// Bytes an RU and a BU must be able to hold for everything the credits allow in flight.
    pub fn pool_needs(&self) -> (u64, u64) {
        let nodes = self.nodes_unchecked();
        let n_ru = nodes.iter().filter(|n| n.role == Role::Ru).count() as u64;
        let total_credits: u64 = nodes
            .iter()
            .filter(|n| n.role == Role::Bu)
            .map(|n| n.credits as u64)
            .sum();
        let max_credits: u64 = nodes
            .iter()
            .filter(|n| n.role == Role::Bu)
            .map(|n| n.credits as u64)
            .max()
            .unwrap_or(0);
        let frag = self.max_fragment() + 64;
        let block = self.buffers.block_size;
        let blocks = |bytes: u64| bytes.div_ceil(block) * block;
        // Small fragments share blocks and a block is freed with its last fragment, so
        // allow twice the live bytes, plus the blocks being filled.
        // Static content adds its template, held for the whole run.
        let template = match self.fragments.content {
            Content::Static => blocks(frag),
            Content::Unique => 0,
        };
        let ru = 2 * blocks(total_credits * frag) + 4 * block + template;
        let bu = 2 * blocks(max_credits * n_ru * frag) + 2 * (n_ru + 4) * block;
        (ru, bu)
    }
}

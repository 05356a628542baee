//! The declarative description of a run: a TOML file, parsed with unknown keys refused and
//! then validated, so every mistake comes back as an error that names the key.
//!
//! Nodes are listed one by one (`[[ru]]`, `[[bu]]`, for a multi-host deployment) or made
//! from counts (`[topology] rus = 2, bus = 2`, for a local test system).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

mod api;
mod stream;
pub use api::API_PREFIX_LEN;
#[cfg(test)]
mod tests;

pub use stream::{OnSyncLoss, StreamFormat};

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
    pub traffic: TrafficSection,
    pub transport: TransportSection,
    pub topology: TopologySection,
    pub evm: EvmSection,
    pub source: SourceSection,
    pub sink: SinkSection,
    pub control: ControlSection,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ru: Vec<RuSection>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bu: Vec<BuSection>,
    /// CPUs each node may run on, by node id (`evm = [0]`, `bu1 = [2, 3]`); nodes not listed
    /// run wherever the system puts them.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub affinity: BTreeMap<String, Vec<usize>>,
    /// Addresses a node learnt at start rather than read from the file (discovery: its
    /// own bound listener), by node id; never written to or read from TOML.
    #[serde(skip)]
    pub learnt: BTreeMap<String, String>,
}

/// `transport.interface`: where nodes started without an address listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interface {
    /// A network interface by name ("ib0", "eth1").
    Name(String),
    /// One address of this host.
    Addr(std::net::IpAddr),
    /// This host's address inside a network ("10.1.0.0/16").
    Net(std::net::IpAddr, u8),
}

impl Interface {
    pub fn parse(s: &str) -> Result<Interface, String> {
        if let Some((ip, len)) = s.split_once('/') {
            let ip: std::net::IpAddr = ip
                .parse()
                .map_err(|_| format!("{s:?}: {ip:?} is not an IP address"))?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let len: u8 = len
                .parse()
                .ok()
                .filter(|l| *l <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?;
            return Ok(Interface::Net(ip, len));
        }
        if let Ok(ip) = s.parse() {
            return Ok(Interface::Addr(ip));
        }
        // Linux interface names: 1 to 15 bytes, no '/', no white space
        let ok = (1..=15).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:@".contains(&b));
        if ok {
            Ok(Interface::Name(s.to_string()))
        } else {
            Err(format!(
                "{s:?} is neither an interface name (1 to 15 letters, digits, - _ . : @), an IP \
                 address, nor a network such as \"10.1.0.0/16\""
            ))
        }
    }

    /// Whether `ip` lies in this network (`Net`) or is this address (`Addr`).
    pub fn holds(&self, ip: std::net::IpAddr) -> bool {
        use std::net::IpAddr;
        match (self, ip) {
            (Interface::Addr(a), _) => *a == ip,
            (Interface::Net(IpAddr::V4(n), len), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - *len as u32).unwrap_or(0);
                u32::from(*n) & mask == u32::from(a) & mask
            }
            (Interface::Net(IpAddr::V6(n), len), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - *len as u32).unwrap_or(0);
                u128::from(*n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
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
    /// Discovery: a file on a filesystem every host sees where the EVM writes the address
    /// it listens on, for nodes started without addresses to read (docs/operations.md).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub rendezvous: String,
    /// Where `evb run` and `evb up` put the RUs and BUs that `[affinity]` does not pin:
    /// a CPU each, or an RU and a BU together on each group of CPUs when there are fewer
    /// CPUs than nodes ("auto"), or wherever the system puts them ("none"). A lone
    /// `evb node` ignores it.
    pub placement: Placement,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    #[default]
    Auto,
    None,
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
            rendezvous: String::new(),
            placement: Placement::Auto,
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
    /// How the EVM picks each batch's BU: "credits" (the next with credit) or "random".
    pub assignment: Assignment,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Assignment {
    #[default]
    Credits,
    Random,
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
            assignment: Assignment::Credits,
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

/// Traffic shaping in the RUs (docs/scaling.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrafficSection {
    /// "none": fragments leave as soon as they are made; "barrel": the barrel shifter.
    pub shaping: Shaping,
    /// Barrel: the slot length on the wall clock every node shares.
    pub slot_us: u64,
    /// Barrel: most bytes an RU sends in one slot (about the link's rate × slot_us).
    pub slot_bytes: u64,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Shaping {
    #[default]
    None,
    Barrel,
}

impl Default for TrafficSection {
    fn default() -> Self {
        TrafficSection {
            shaping: Shaping::None,
            slot_us: 1000,
            slot_bytes: 131_072,
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
    /// Where nodes started without an address listen: an interface name ("ib0"), an
    /// address of this host, or a network ("10.1.0.0/16": this host's address in it).
    /// Empty: the address this host uses to reach the EVM.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub interface: String,
}

impl Default for TransportSection {
    fn default() -> Self {
        TransportSection {
            kind: TransportKind::Tcp,
            provider: String::new(),
            local: None,
            interface: String::new(),
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
    /// RU k and BU k share a host (seed 001's folded configuration): RU k's fragment for its
    /// own BU stays in the host, and each host's link carries data both ways. Read by the
    /// launchers that place nodes on hosts (`evb testbed`).
    pub folded: bool,
}

impl Default for TopologySection {
    fn default() -> Self {
        TopologySection {
            rus: 2,
            bus: 2,
            host: "127.0.0.1".into(),
            base_port: 0,
            folded: false,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EvmSection {
    pub id: String,
    /// host:port (empty: from the topology section).
    pub addr: String,
    /// host:port of its control API (empty: from the control section).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub control: String,
}

impl Default for EvmSection {
    fn default() -> Self {
        EvmSection {
            id: "evm".into(),
            addr: String::new(),
            control: String::new(),
        }
    }
}

/// Where the nodes' control APIs (HTTP/JSON, Prometheus `/metrics`, the run page) listen.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ControlSection {
    /// Host of every node's control API unless a node names its own `control` address.
    /// Beyond loopback the API requires the run's secret as a bearer token.
    pub host: String,
    /// The EVM's API on base_port, then the RUs', then the BUs' (0: `evb run` / `evb up`
    /// pick free ports; a lone `evb node` takes any free port and logs it).
    pub base_port: u16,
}

impl Default for ControlSection {
    fn default() -> Self {
        ControlSection {
            host: "127.0.0.1".into(),
            base_port: 0,
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
    /// host:port of its control API (empty: from the control section).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub control: String,
    /// `source.kind = "stream"`: the addresses this RU listens on, one front-end stream each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub streams: Vec<String>,
    /// The source (FED) id of each stream (default with one stream: the RU's `source_id`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stream_sources: Vec<u16>,
    /// `source.kind = "api"`: one plug-in producer per entry, each its source (FED) id; two
    /// or more make super-fragments (default: one producer with the RU's `source_id`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub producer_sources: Vec<u16>,
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
    /// Front-ends over TCP: each RU listens on its `streams` and reads fragments as they come.
    Stream,
    /// A readout program in the RU's process submits fragments through the plug-in API
    /// (`evb_plugin::Producer`, or libevb from C).
    Api,
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
    /// Streams: how fragments are framed on the wire from the front-ends.
    pub format: StreamFormat,
    /// Streams: what a trigger number that differs between an RU's streams does.
    pub on_sync_loss: OnSyncLoss,
    /// Streams: fragments read ahead per stream before the RU stops reading it.
    pub read_ahead: u64,
    /// Streams: seconds without a fragment from a stream the RU waits for before it warns.
    pub stall_warn_s: f64,
    /// Streams: the front-end addresses (`"10.0.0.7"`) or networks (`"10.0.0.0/24"`) an RU
    /// takes a stream connection from; any other is closed at once. Unset: loopback only,
    /// and then every stream must listen on loopback (see [`SourceSection::stream_allow`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_from: Option<Vec<String>>,
}

/// One entry of `source.allow_from`: an address and how many leading bits of it must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllowedNet {
    addr: std::net::IpAddr,
    prefix: u8,
}

impl AllowedNet {
    /// `"10.0.0.7"` (that address) or `"10.0.0.0/24"` (a network); IPv6 alike.
    pub fn parse(s: &str) -> Result<AllowedNet, String> {
        let (ip, prefix) = match s.split_once('/') {
            Some((ip, p)) => (ip, Some(p)),
            None => (s, None),
        };
        let addr: std::net::IpAddr = ip
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not an IP address or IP/prefix network"))?;
        let addr = addr.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.trim().parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("{s:?}: the prefix must be 0 ..= {max}")),
            },
        };
        Ok(AllowedNet { addr, prefix })
    }

    /// Whether `ip` is in this network (an IPv4 address written as IPv6, `::ffff:a.b.c.d`,
    /// counts as IPv4).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        let bits = |a: std::net::IpAddr| -> u128 {
            match a {
                std::net::IpAddr::V4(v) => u32::from(v) as u128,
                std::net::IpAddr::V6(v) => u128::from(v),
            }
        };
        let ip = ip.to_canonical();
        if ip.is_ipv4() != self.addr.is_ipv4() {
            return false;
        }
        let width = if ip.is_ipv4() { 32 } else { 128 };
        let shift = width - u32::from(self.prefix);
        if shift >= 128 {
            return true;
        }
        (bits(ip) >> shift) == (bits(self.addr) >> shift)
    }
}

impl std::fmt::Display for AllowedNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let max = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.prefix == max {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

impl SourceSection {
    /// The networks front-end streams accept connections from: `allow_from`, or loopback
    /// (127.0.0.0/8 and ::1) when it is unset. Entries that do not parse are left out
    /// ([`Config::validate`] refuses them).
    pub fn stream_allow(&self) -> Vec<AllowedNet> {
        match &self.allow_from {
            Some(list) => list
                .iter()
                .filter_map(|s| AllowedNet::parse(s).ok())
                .collect(),
            None => ["127.0.0.0/8", "::1"]
                .iter()
                .filter_map(|s| AllowedNet::parse(s).ok())
                .collect(),
        }
    }

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

impl Default for SourceSection {
    fn default() -> Self {
        SourceSection {
            kind: SourceKind::Generator,
            looped: false,
            on_error: OnError::Stop,
            check_source_id: true,
            max_fragment: 1 << 20,
            format: StreamFormat::Fed,
            on_sync_loss: OnSyncLoss::Stop,
            read_ahead: 1024,
            stall_warn_s: 2.0,
            allow_from: None,
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
    /// `serve` sink: the host the BUs serve consumers on (a `[[bu]] serve` overrides).
    pub serve_host: String,
    /// `serve` sink: BU i serves on `serve_base_port + i` (0: any free port, which the BU
    /// logs and shows in its status as `sink.report.listen`).
    pub serve_base_port: u16,
    /// `serve` sink: most events one consumer is sent unacknowledged (a consumer asking
    /// for more gets this many).
    pub serve_max_held: u32,
    /// `serve` sink: most events the sink holds at once (awaiting the EVM's acceptance,
    /// waiting for a consumer, or sent and not acknowledged); beyond it the sink is busy and
    /// the BU keeps its credits. 0: half the BU's credits (at least 1).
    pub serve_hold: u32,
    /// `serve` sink: a consumer holding events and acknowledging none for this long is
    /// dropped and its events go to another.
    pub serve_ack_timeout_s: f64,
    /// `serve` sink: at the end of the run, how long the BU waits for its consumers to
    /// acknowledge what it holds; events not acknowledged by then are counted lost.
    pub serve_drain_timeout_s: f64,
}

impl Default for SinkSection {
    fn default() -> Self {
        SinkSection {
            kind: SinkKind::Discard,
            dir: String::new(),
            file_max_events: 0,
            file_max_mib: 1024,
            serve_host: "127.0.0.1".into(),
            serve_base_port: 0,
            serve_max_held: 32,
            serve_hold: 0,
            serve_ack_timeout_s: 10.0,
            serve_drain_timeout_s: 5.0,
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
    /// A consumer program in the BU's process takes built events through the plug-in API
    /// (`evb_plugin::Consumer`, or libevb from C).
    Api,
    /// Built events served over TCP to consumer processes (`evb consume`), each to one
    /// consumer, held until it acknowledges them (docs/protocol.md §7).
    Serve,
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
    /// host:port of its control API (empty: from the control section).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub control: String,
    /// `serve` sink: host:port it serves consumers on (empty: from `sink.serve_host` and
    /// `sink.serve_base_port`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub serve: String,
}

/// One node of the run, after validation.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    pub id: String,
    pub role: Role,
    /// Index among the nodes of its role.
    pub index: u16,
    pub addr: String,
    /// host:port of the node's control API (port 0: any free one).
    pub control: String,
    pub source_id: u16,
    pub credits: u32,
    pub sink: SinkKind,
    /// Recorded files this RU replays.
    pub files: Vec<String>,
    /// Addresses this RU listens on for front-end streams, and the source id of each of its
    /// inputs: its streams, or its plug-in producers (`producer_sources`).
    pub streams: Vec<String>,
    pub stream_sources: Vec<u16>,
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
pub const MAX_FRAGMENT: u64 = limits::MAX_FRAGMENT;

/// The range of every number in a configuration, checked by [`Config::validate`] (the table
/// in `default.toml` and docs/operations.md lists the same). Bounds keep every value that
/// passes validation clear of overflows and panics in the nodes (durations, pool sizes,
/// ports), with room to spare for any real run.
pub mod limits {
    /// Longest duration in seconds (`run.duration_s`, `run.stall_timeout_s`,
    /// `run.connect_timeout_s`): one week.
    pub const MAX_SECONDS: f64 = 604_800.0;
    /// Shortest positive timeout in seconds (`run.stall_timeout_s`, `run.connect_timeout_s`).
    pub const MIN_TIMEOUT_S: f64 = 0.001;
    /// Most events in a run (`run.events`) or in one output file (`sink.file_max_events`).
    pub const MAX_EVENTS: u64 = 1_000_000_000_000_000;
    /// Highest trigger rate (`run.rate_hz`).
    pub const MAX_RATE_HZ: f64 = 1e9;
    /// Longest heartbeat interval (`run.heartbeat_ms`): one minute.
    pub const MAX_HEARTBEAT_MS: u64 = 60_000;
    /// Longest heartbeat timeout (`run.heartbeat_timeout_ms`): one hour; at least twice
    /// `run.heartbeat_ms`.
    pub const MAX_HEARTBEAT_TIMEOUT_MS: u64 = 3_600_000;
    /// Largest fragment (`fragments.size`, `.min`, `.max`, `.stddev`, `source.max_fragment`).
    pub const MAX_FRAGMENT: u64 = 256 << 20;
    /// Most credits of one BU (`builder.credits`, `[[bu]] credits`).
    pub const MAX_CREDITS: u32 = 1 << 20;
    /// Longest assignment batch (`builder.batch`).
    pub const MAX_BATCH: u32 = 1 << 16;
    /// Pool block size (`buffers.block_size`): 4 KiB to 1 GiB.
    pub const MIN_BLOCK: u64 = 4096;
    pub const MAX_BLOCK: u64 = 1 << 30;
    /// Largest explicit pool (`buffers.ru_pool_mib`, `buffers.bu_pool_mib`), MiB: 1 TiB.
    pub const MAX_POOL_MIB: u64 = 1 << 20;
    /// Page size (`messaging.page_size`): 64 B to 64 MiB.
    pub const MIN_PAGE: u64 = 64;
    pub const MAX_PAGE: u64 = 64 << 20;
    /// Longest flush delay and busy-poll time, µs (`messaging.flush_us`,
    /// `messaging.busy_poll_us`): one second.
    pub const MAX_POLL_US: u64 = 1_000_000;
    /// Most RUs, and most BUs (`topology.rus`, `topology.bus`, `[[ru]]`, `[[bu]]` entries).
    pub const MAX_NODES: u32 = 4096;
    /// Longest testing sink delay, µs (`[[bu]] sink_delay_us`): ten seconds.
    pub const MAX_SINK_DELAY_US: u64 = 10_000_000;
    /// Largest output file, MiB (`sink.file_max_mib`): 1 TiB.
    pub const MAX_FILE_MIB: u64 = 1 << 20;
    /// Most events one consumer may hold unacknowledged (`sink.serve_max_held`).
    pub const MAX_SERVE_HELD: u64 = 65_536;
}

/// `value` outside `lo ..= hi`: an error naming the key, the value and the range.
fn int_in(key: &str, value: u64, lo: u64, hi: u64, unit: &str) -> Result<(), ConfigError> {
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
fn real_in(key: &str, value: f64, lo: f64, hi: f64, unit: &str) -> Result<(), ConfigError> {
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
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let cfg = Config::parse_unvalidated(text)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses without validating: for a configuration that is completed before it is
    /// validated (a node puts its own secret into the one its EVM sent).
    pub fn parse_unvalidated(text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string().trim_end().to_string()))
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
        self.check_ranges()?;
        crate::api::validate(self)?;
        let ends_with_data = self.source.kind != SourceKind::Generator && !self.source.looped;
        if r.events == 0 && r.duration_s == 0.0 && !ends_with_data {
            return Err(invalid(
                "run",
                "set `events` or `duration_s` (or both): a run must end",
            ));
        }
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
        let file_sink = self.sink.kind == SinkKind::File
            || self.bu.iter().any(|b| b.sink == Some(SinkKind::File));
        if file_sink && self.sink.dir.is_empty() {
            return Err(invalid("sink.dir", "the file sink needs a directory"));
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
        let serving = self.sink.kind == SinkKind::Serve
            || self.bu.iter().any(|b| b.sink == Some(SinkKind::Serve));
        if serving && self.secret().is_none() {
            // the consumer port is a listener like the data ports: beyond loopback only with
            // a secret, which consumers then prove (docs/operations.md, Security model)
            for i in 0..self.n_bu().min(u16::MAX as u64) as u16 {
                let addr = self.serve_addr(i);
                let (host, _) = addr.rsplit_once(':').unwrap_or((addr.as_str(), ""));
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let loopback = host == "localhost"
                    || host
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback());
                if !loopback {
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
        if !self.transport.interface.is_empty() {
            Interface::parse(&self.transport.interface)
                .map_err(|e| invalid("transport.interface", e))?;
        }
        if self.run.rendezvous.len() > 4096 {
            return Err(invalid("run.rendezvous", "is longer than 4096 bytes"));
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

    /// Every number against its range (see [`limits`]), before anything computes with them.
    fn check_ranges(&self) -> Result<(), ConfigError> {
        use limits::*;
        let r = &self.run;
        int_in("run.events", r.events, 0, MAX_EVENTS, "")?;
        int_in(
            "traffic.slot_us",
            self.traffic.slot_us,
            10,
            1_000_000,
            " µs",
        )?;
        int_in(
            "traffic.slot_bytes",
            self.traffic.slot_bytes,
            1024,
            1 << 30,
            " bytes",
        )?;
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

    /// Where BU `index` serves consumers (`sink.kind = "serve"`): its `[[bu]] serve`, or
    /// `sink.serve_host` and `sink.serve_base_port + index` (port 0: any free one).
    pub fn serve_addr(&self, index: u16) -> String {
        if let Some(b) = self.bu.get(index as usize).filter(|b| !b.serve.is_empty()) {
            return b.serve.clone();
        }
        let s = &self.sink;
        let port = if s.serve_base_port == 0 {
            0
        } else {
            s.serve_base_port as u32 + index as u32
        };
        if s.serve_host.contains(':') && !s.serve_host.starts_with('[') {
            format!("[{}]:{port}", s.serve_host)
        } else {
            format!("{}:{port}", s.serve_host)
        }
    }

    /// RUs in the run: `[[ru]]` entries, or `topology.rus` when there are none.
    fn n_ru(&self) -> u64 {
        if self.ru.is_empty() {
            self.topology.rus.into()
        } else {
            self.ru.len() as u64
        }
    }

    /// BUs in the run: `[[bu]]` entries, or `topology.bus` when there are none.
    fn n_bu(&self) -> u64 {
        if self.bu.is_empty() {
            self.topology.bus.into()
        } else {
            self.bu.len() as u64
        }
    }

    /// The control address node `n` gets from the control section.
    fn made_control(&self, n: &NodeSpec) -> String {
        let k = match n.role {
            Role::Evm => 0,
            Role::Ru => 1 + n.index as u64,
            Role::Bu => 1 + self.n_ru() + n.index as u64,
        };
        let c = &self.control;
        let port = if c.base_port == 0 {
            0
        } else {
            c.base_port as u64 + k
        };
        format!("{}:{port}", c.host)
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
        let mut v = self.nodes_unchecked();
        for n in &mut v {
            if let Some(a) = self.learnt.get(&n.id) {
                n.addr = a.clone();
            }
        }
        v
    }

    /// Whether node address `addr` is to be discovered at start rather than dialled as
    /// written: port 0 outside `inproc` (`evb run` and `evb up` choose ports before they
    /// start nodes, so only nodes started one by one see it).
    pub fn is_discovered(&self, addr: &str) -> bool {
        self.transport.kind != TransportKind::Inproc
            && addr.parse::<SocketAddr>().is_ok_and(|a| a.port() == 0)
    }

    fn nodes_unchecked(&self) -> Vec<NodeSpec> {
        let t = &self.topology;
        let c = &self.control;
        // the k-th node (EVM 0, then RUs, then BUs): its address, or one made from a scheme
        let made = |host: &str, base: u16, k: u32| {
            let port = if base == 0 { 0 } else { base as u32 + k };
            format!("{host}:{port}")
        };
        let pick = |given: &str, host: &str, base: u16, k: u32| {
            if given.is_empty() {
                made(host, base, k)
            } else {
                given.to_string()
            }
        };
        let data = |given: &str, k: u32| pick(given, &t.host, t.base_port, k);
        let control = |given: &str, k: u32| pick(given, &c.host, c.base_port, k);
        let mut v = vec![NodeSpec {
            id: self.evm.id.clone(),
            role: Role::Evm,
            index: 0,
            addr: data(&self.evm.addr, 0),
            control: control(&self.evm.control, 0),
            source_id: 0,
            credits: 0,
            sink: SinkKind::Discard,
            files: Vec::new(),
            streams: Vec::new(),
            stream_sources: Vec::new(),
            sink_delay: None,
        }];
        let n_ru = if self.ru.is_empty() {
            t.rus
        } else {
            self.ru.len() as u32
        };
        for i in 0..n_ru {
            let k = 1 + i;
            let (id, addr, ctl, source_id, files, streams, mut stream_sources) =
                match self.ru.get(i as usize) {
                    Some(r) => (
                        r.id.clone(),
                        data(&r.addr, k),
                        control(&r.control, k),
                        r.source_id.unwrap_or(i as u16),
                        r.files.clone(),
                        r.streams.clone(),
                        if r.producer_sources.is_empty() {
                            r.stream_sources.clone()
                        } else {
                            r.producer_sources.clone()
                        },
                    ),
                    None => (
                        format!("ru{i}"),
                        data("", k),
                        control("", k),
                        i as u16,
                        Vec::new(),
                        Vec::new(),
                        Vec::new(),
                    ),
                };
            if streams.len() == 1 && stream_sources.is_empty() {
                stream_sources.push(source_id);
            }
            v.push(NodeSpec {
                id,
                role: Role::Ru,
                index: i as u16,
                addr,
                control: ctl,
                source_id,
                credits: 0,
                sink: SinkKind::Discard,
                files,
                streams,
                stream_sources,
                sink_delay: None,
            });
        }
        let n_bu = if self.bu.is_empty() {
            t.bus
        } else {
            self.bu.len() as u32
        };
        for i in 0..n_bu {
            let k = 1 + n_ru + i;
            let (id, addr, ctl, credits, sink) = match self.bu.get(i as usize) {
                Some(b) => (
                    b.id.clone(),
                    data(&b.addr, k),
                    control(&b.control, k),
                    b.credits.unwrap_or_else(|| self.default_credits()),
                    b.sink.unwrap_or(self.sink.kind),
                ),
                None => (
                    format!("bu{i}"),
                    data("", k),
                    control("", k),
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
                control: ctl,
                source_id: 0,
                credits,
                sink,
                files: Vec::new(),
                streams: Vec::new(),
                stream_sources: Vec::new(),
                sink_delay,
            });
        }
        v
    }

    /// The keys whose change needs the nodes restarted (who the nodes are, where they
    /// listen, how they connect): a running system refuses a new configuration that
    /// changes any of them, naming them. Everything else may change between runs.
    pub fn restart_needed(&self, new: &Config) -> Vec<String> {
        let mut keys = Vec::new();
        let (a, b) = (self.nodes(), new.nodes());
        if a.len() != b.len() {
            keys.push("topology (the number of nodes)".to_string());
        }
        for (x, y) in a.iter().zip(&b) {
            let key = self.key_of(x);
            if x.id != y.id || x.role != y.role {
                keys.push(format!("{key}.id"));
            }
            if x.addr != y.addr {
                keys.push(format!("{key}.addr"));
            }
            if x.control != y.control {
                keys.push(format!("{key}.control"));
            }
        }
        if self.transport != new.transport {
            keys.push("transport".into());
        }
        if self.control != new.control {
            keys.push("control".into());
        }
        if self.secret() != new.secret() {
            keys.push("run.secret".into());
        }
        if self.affinity != new.affinity {
            keys.push("affinity".into());
        }
        keys.sort();
        keys.dedup();
        keys
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
        let event = n_ru
            .max(1)
            .saturating_mul(self.max_fragment().saturating_add(64));
        ((16u64 << 20) / event).clamp(16, 4096) as u32
    }

    /// The largest fragment payload any RU can send.
    pub fn max_fragment(&self) -> u64 {
        match self.source.kind {
            SourceKind::Generator => self.fragments.max_size(),
            SourceKind::Stream | SourceKind::Api => stream::max_payload(self),
            _ => self.source.max_fragment,
        }
    }

    /// Bytes an RU and a BU must be able to hold for everything the credits allow in flight.
    ///
    /// # Errors
    /// If the sizes overflow (only for a configuration that fails [`Config::validate`]).
    pub fn pool_needs(&self) -> Result<(u64, u64), ConfigError> {
        let nodes = self.nodes_unchecked();
        let bus = nodes.iter().filter(|n| n.role == Role::Bu);
        let total_credits: u64 = bus.clone().map(|n| n.credits as u64).sum();
        let max_credits: u64 = bus.map(|n| n.credits as u64).max().unwrap_or(0);
        let n_ru = self.n_ru();
        let block = self.buffers.block_size.max(1);
        let too_big = || {
            invalid(
                "builder.credits",
                "the pools these credits, fragment sizes and node counts need overflow 64 bits",
            )
        };
        let frag = self.max_fragment().checked_add(64).ok_or_else(too_big)?;
        let blocks = |bytes: Option<u64>| {
            bytes
                .map(|b| b.div_ceil(block))
                .and_then(|n| n.checked_mul(block))
        };
        let add = |a: Option<u64>, b: Option<u64>| a?.checked_add(b?);
        let mul = |a: Option<u64>, b: u64| a?.checked_mul(b);
        // Small fragments share blocks and a block is freed with its last fragment, so
        // allow twice the live bytes, plus the blocks being filled.
        // Static content adds its template, held for the whole run.
        let template = match self.fragments.content {
            Content::Static => blocks(Some(frag)),
            Content::Unique => Some(0),
        };
        let ru = add(
            mul(blocks(total_credits.checked_mul(frag)), 2),
            add(4u64.checked_mul(block), template),
        );
        let bu_live = max_credits
            .checked_mul(n_ru)
            .and_then(|k| k.checked_mul(frag));
        let bu = add(mul(blocks(bu_live), 2), mul(mul(Some(n_ru + 4), 2), block));
        Ok((ru.ok_or_else(too_big)?, bu.ok_or_else(too_big)?))
    }

    /// The pools a node of `role` makes, as `evb-node` makes them.
    ///
    /// # Errors
    /// If the sizes overflow (only for a configuration that fails [`Config::validate`]).
    pub fn pool_plan(&self, role: Role) -> Result<PoolPlan, ConfigError> {
        let block = self.buffers.block_size.max(1);
        let nodes = 1 + self.n_ru() + self.n_bu();
        // Control traffic only: a few blocks per peer.
        let small = 4 * nodes + 8;
        let blocks = |bytes: u64| bytes.div_ceil(block).max(4);
        let (ru_need, bu_need) = self.pool_needs()?;
        let explicit = |mib: u64| (mib > 0).then(|| mib.checked_mul(1 << 20)).flatten();
        let plan = match role {
            Role::Evm => PoolPlan {
                block_size: block,
                rx_blocks: small,
                fragment_blocks: 0,
            },
            Role::Ru => PoolPlan {
                block_size: block,
                rx_blocks: small,
                fragment_blocks: blocks(explicit(self.buffers.ru_pool_mib).unwrap_or(ru_need)),
            },
            Role::Bu => PoolPlan {
                block_size: block,
                rx_blocks: blocks(explicit(self.buffers.bu_pool_mib).unwrap_or(bu_need)),
                fragment_blocks: 0,
            },
        };
        plan.checked_bytes().ok_or_else(|| {
            invalid(
                "builder.credits",
                "the pools these credits, fragment sizes and node counts need overflow 64 bits",
            )
        })?;
        Ok(plan)
    }

    /// Bytes of pool memory `nodes` make together.
    ///
    /// # Errors
    /// If the sum overflows (only for a configuration that fails [`Config::validate`]).
    pub fn pool_bytes(&self, nodes: &[NodeSpec]) -> Result<u64, ConfigError> {
        let mut by_role = [(Role::Evm, 0u64), (Role::Ru, 0), (Role::Bu, 0)];
        for n in nodes {
            by_role
                .iter_mut()
                .find(|(r, _)| *r == n.role)
                .expect("every role")
                .1 += 1;
        }
        let mut total = 0u64;
        for (role, count) in by_role {
            if count > 0 {
                total = self
                    .pool_plan(role)?
                    .checked_bytes()
                    .and_then(|b| b.checked_mul(count))
                    .and_then(|b| b.checked_add(total))
                    .ok_or_else(|| {
                        invalid(
                            "builder.credits",
                            format!("the pools of {} nodes overflow 64 bits", nodes.len()),
                        )
                    })?;
            }
        }
        Ok(total)
    }

    /// The nodes that would run on this host: every node for `inproc`; otherwise those whose
    /// address is loopback, unspecified or one of this host's addresses (an address that
    /// does not parse counts as local: the memory check errs on the safe side).
    pub fn local_nodes(&self) -> Vec<NodeSpec> {
        let inproc = self.transport.kind == TransportKind::Inproc;
        self.nodes()
            .into_iter()
            .filter(|n| {
                inproc
                    || match n.addr.parse::<SocketAddr>() {
                        Ok(sa) => {
                            sa.ip().is_loopback()
                                || sa.ip().is_unspecified()
                                || std::net::UdpSocket::bind((sa.ip(), 0)).is_ok()
                        }
                        Err(_) => true,
                    }
            })
            .collect()
    }

    /// Compares the pools `nodes` make (see [`Config::pool_plan`]) with `host`'s memory:
    /// an error naming `builder.credits` or the `buffers.*` key at fault when they exceed its
    /// total memory, `Ok(Some(warning))` when they exceed what is available now, `Ok(None)`
    /// when they fit.
    pub fn check_memory(
        &self,
        nodes: &[NodeSpec],
        host: HostMemory,
    ) -> Result<Option<String>, ConfigError> {
        let need = self.pool_bytes(nodes)?;
        let count = |role| nodes.iter().filter(|n| n.role == role).count() as u64;
        let part = |role| {
            self.pool_plan(role).map(|p| {
                p.checked_bytes()
                    .unwrap_or(u64::MAX)
                    .saturating_mul(count(role))
            })
        };
        let (ru, bu) = (part(Role::Ru)?, part(Role::Bu)?);
        let what = format!(
            "the pools of the {} node(s) on this host need {} (RUs {}, BUs {})",
            nodes.len(),
            human(need),
            human(ru),
            human(bu)
        );
        let knobs = "lower builder.credits (or [[bu]] credits), buffers.ru_pool_mib / \
                     buffers.bu_pool_mib, or the fragment sizes, or run fewer nodes here";
        if need > host.total {
            let key = if bu >= ru && self.buffers.bu_pool_mib > 0 {
                "buffers.bu_pool_mib"
            } else if ru > bu && self.buffers.ru_pool_mib > 0 {
                "buffers.ru_pool_mib"
            } else {
                "builder.credits"
            };
            return Err(invalid(
                key,
                format!(
                    "{what}, more than this host's memory ({}): {knobs}",
                    human(host.total)
                ),
            ));
        }
        Ok((need > host.available).then(|| {
            format!(
                "{what}, more than the {} available now (of {}): the nodes may be swapped \
                 out or killed; {knobs}",
                human(host.available),
                human(host.total)
            )
        }))
    }

    /// [`Config::check_memory`] for [`Config::local_nodes`] against this host's
    /// /proc/meminfo; `Ok(None)` where the host does not say how much memory it has.
    pub fn check_host_memory(&self) -> Result<Option<String>, ConfigError> {
        match HostMemory::read() {
            Some(host) => self.check_memory(&self.local_nodes(), host),
            None => Ok(None),
        }
    }
}

/// The pools one node makes, in blocks of `block_size` bytes: every node a receive pool
/// (control messages for the EVM and the RUs, fragments for a BU), an RU also its fragment
/// pool. `evb-node` allocates exactly this; [`Config::check_memory`] adds it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolPlan {
    pub block_size: u64,
    pub rx_blocks: u64,
    /// 0 for the EVM and the BUs.
    pub fragment_blocks: u64,
}

impl PoolPlan {
    /// Bytes of both pools (`None` if that overflows).
    pub fn checked_bytes(&self) -> Option<u64> {
        self.rx_blocks
            .checked_add(self.fragment_blocks)?
            .checked_mul(self.block_size)
    }
}

/// A host's memory, from /proc/meminfo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemory {
    /// `MemTotal`, bytes.
    pub total: u64,
    /// `MemAvailable`, bytes.
    pub available: u64,
}

impl HostMemory {
    /// This host's memory; `None` where /proc/meminfo cannot be read or lacks the fields.
    pub fn read() -> Option<HostMemory> {
        HostMemory::parse(&std::fs::read_to_string("/proc/meminfo").ok()?)
    }

    /// Reads `MemTotal` and `MemAvailable` (kB) from the text of /proc/meminfo.
    pub fn parse(meminfo: &str) -> Option<HostMemory> {
        let field = |name: &str| -> Option<u64> {
            let line = meminfo
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))?;
            let mut words = line.split_whitespace();
            let kb: u64 = words.next()?.parse().ok()?;
            match words.next() {
                Some("kB") | None => kb.checked_mul(1024),
                Some(_) => None,
            }
        };
        let total = field("MemTotal")?;
        Some(HostMemory {
            total,
            available: field("MemAvailable").unwrap_or(total),
        })
    }
}

/// Bytes for a person: MiB below 1 GiB, GiB above.
fn human(bytes: u64) -> String {
    if bytes < 1 << 30 {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    }
}

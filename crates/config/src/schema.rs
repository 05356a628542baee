//! The schema: every section of a configuration file as a struct, each key a field with
//! its meaning, and the defaults a key left out takes.
//!
//! One idea, one file: the configuration's sections and their defaults.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::net::AllowedNet;
use crate::stream::{OnSyncLoss, StreamFormat};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub run: RunSection,
    pub fragments: FragmentSection,
    /// The generator's time frames (`builder.by = "time"` or `"window"`).
    pub frames: FramesSection,
    /// Triggered readout windows (`builder.by = "window"`).
    pub windows: WindowsSection,
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
    /// it listens on, for nodes started without addresses to read (docs/operations/deployment.md).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub rendezvous: String,
    /// The folder where the run control keeps every run's record (JSON Lines, one file per
    /// run id; docs/operations/data.md, "Run records"), so that records and run numbers outlive
    /// the processes: "" is the user's state directory (`$XDG_STATE_HOME/evb/runs`, else
    /// `~/.local/state/evb/runs`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub records_dir: String,
    /// Where `evb run` and `evb up` put the RUs and BUs that `[affinity]` does not pin:
    /// a CPU each, or an RU and a BU together on each group of CPUs when there are fewer
    /// CPUs than nodes ("auto"), or wherever the system puts them ("none"). A lone
    /// `evb node` ignores it.
    pub placement: Placement,
    /// How the nodes' threads (network, builder, sink) compete with other work on their
    /// hosts, such as a filter farm's processes beside the BUs: "normal" (as the host
    /// schedules them), "high" (nice -20: a process at nice 0 then gets about 1 % of a CPU
    /// that a node wants) or "realtime" (SCHED_RR; refused where the kernel does not bound
    /// real-time threads, `kernel.sched_rt_runtime_us = -1`). Both need root or
    /// CAP_SYS_NICE; a node that cannot raise itself refuses to start. docs/operations/running.md.
    pub priority: Priority,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    #[default]
    Normal,
    High,
    Realtime,
}

impl Priority {
    /// As the configuration spells it.
    pub fn name(self) -> &'static str {
        match self {
            Priority::Normal => "normal",
            Priority::High => "high",
            Priority::Realtime => "realtime",
        }
    }
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
            records_dir: String::new(),
            placement: Placement::Auto,
            priority: Priority::Normal,
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
    /// What a record is: "event" (one trigger, a fragment per source), "time" (one time
    /// slice of continuous streams) or "window" (one trigger decision's readout window of
    /// them): docs/architecture.md, "Building by time".
    pub by: BuildBy,
    /// Under `by = "time"`: ticks in each slice's core.
    pub slice_ticks: u64,
    /// Under `by = "time"`: ticks after a core whose frames the slice carries again (the
    /// next slice's first frames).
    pub overlap_ticks: u64,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BuildBy {
    #[default]
    Event,
    Time,
    Window,
}

/// Triggered readout windows (`builder.by = "window"`, DUNE's and artdaq's request mode):
/// the generator's frames arrive in real time at `tick_hz`, each RU keeps the last
/// `buffer_ms` of them, and decision k (the EVM's k-th trigger, at `run.rate_hz`) asks every
/// RU for the frames overlapping its window (docs/architecture.md, "Building by time").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WindowsSection {
    /// The streams' clock: the data of tick t arrives t / tick_hz s after the RU's start.
    pub tick_hz: u64,
    /// A window begins this many ticks before its decision's tick...
    pub before_ticks: u64,
    /// ...and ends this many after it.
    pub after_ticks: u64,
    /// Decision k's tick is k × tick_hz / rate_hz less a delay drawn per decision from
    /// [delay_min_ticks, delay_max_ticks] (negative: a window reaching into data not yet
    /// arrived): the trigger's latency.
    pub delay_min_ticks: i64,
    pub delay_max_ticks: i64,
    /// The RU's latency buffer: frames older than this are evicted (a window over them gets
    /// what is left, flagged MISSING).
    pub buffer_ms: u64,
    /// The RU's latency buffer in bytes as well, for a live stream or producer of frames (0:
    /// bounded by `buffer_ms` only): past it the oldest frames are evicted as if aged out.
    pub buffer_bytes: u64,
    /// How long an RU waits for a window's data to arrive before it sends what it has,
    /// flagged LATE.
    pub wait_ms: u64,
    /// A file of decisions ("" for none): decision k's window is its k-th line, `begin end`
    /// in ticks (docs/formats.md §8), instead of the seeded ones; every node reads it.
    pub decisions: String,
    /// Decisions come from outside at run time (`evb ctl decide`, `POST /api/v1/decide`),
    /// each with its window: a record per decision, as they arrive.
    pub outside: bool,
    /// With `outside`: the longest window a decision may ask for, in ticks (it bounds the
    /// RUs' fragments); longer ones are refused by the control API.
    pub longest_ticks: u64,
}

impl Default for WindowsSection {
    fn default() -> Self {
        WindowsSection {
            tick_hz: 62_500_000,
            before_ticks: 31_250,
            after_ticks: 31_250,
            delay_min_ticks: 0,
            delay_max_ticks: 0,
            buffer_ms: 1000,
            buffer_bytes: 0,
            wait_ms: 100,
            decisions: String::new(),
            outside: false,
            longest_ticks: 0,
        }
    }
}

/// The generator's continuous data under `builder.by = "time"`: each source's stream is a
/// sequence of frames of `ticks` ticks each, frame j covering `[j·ticks, (j+1)·ticks)`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FramesSection {
    /// Ticks per frame.
    pub ticks: u64,
    /// Payload bytes per frame (the mean, for log-normal sizes).
    pub size: u64,
    pub distribution: Distribution,
    /// Log-normal standard deviation in bytes (0: equal to `size`).
    pub stddev: u64,
    /// Log-normal bounds (0: 0 bytes and 4 × `size`).
    pub min: u64,
    pub max: u64,
    /// "unique" (from the frame's index and source) or "static" (from the source only, made
    /// once: measures the builder without the cost of making data).
    pub content: Content,
    /// The run's first tick (t0), a multiple of `ticks`: every stream begins here, slice
    /// k's core is `[t0 + k·slice_ticks, ...)`, decision k's tick `t0 + k·tick_hz/rate_hz`.
    /// A detector's absolute clock (62.5 MHz since an epoch) needs no rebasing.
    pub first_tick: u64,
}

impl Default for FramesSection {
    fn default() -> Self {
        FramesSection {
            ticks: 1000,
            size: 1024,
            distribution: Distribution::Fixed,
            stddev: 0,
            min: 0,
            max: 0,
            content: Content::Unique,
            first_tick: 0,
        }
    }
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
            by: BuildBy::Event,
            slice_ticks: 100_000,
            overlap_ticks: 1000,
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
    /// Barrel: the slot length on the wall clock every node shares (0: from `link_mbps`
    /// when that is given, else 1000 µs; see [`crate::Config::slot_us`]).
    pub slot_us: u64,
    /// Barrel: most bytes an RU sends in one slot, never exceeded (at least one fragment
    /// with its 40-byte prefix; 0: exactly that, one of the largest fragments a slot; see
    /// [`crate::Config::slot_bytes`]).
    pub slot_bytes: u64,
    /// Barrel: the links' rate in Mb/s; the slot is then as long as `slot_bytes` takes at
    /// that rate (0: not given).
    pub link_mbps: u64,
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
            slot_us: 0,
            slot_bytes: 0,
            link_mbps: 0,
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

impl TransportKind {
    /// Every kind (evb-node's tests hold each to a row of evb-messaging's table).
    pub const ALL: [TransportKind; 4] = [
        TransportKind::Tcp,
        TransportKind::Inproc,
        TransportKind::Shm,
        TransportKind::Ofi,
    ];

    /// The name as a configuration file writes it (`transport.kind = "tcp"`).
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Inproc => "inproc",
            TransportKind::Shm => "shm",
            TransportKind::Ofi => "ofi",
        }
    }
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
    /// `kind = "tcp"` over Multipath TCP: each connection spread by the kernel over every
    /// rail (network) the two hosts share, their MPTCP endpoints, and kept up on the others
    /// when one is lost (docs/scaling.md, "Several rails").
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub multipath: bool,
}

impl Default for TransportSection {
    fn default() -> Self {
        TransportSection {
            kind: TransportKind::Tcp,
            provider: String::new(),
            local: None,
            interface: String::new(),
            multipath: false,
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
    /// Spare BUs made after them (`bu{bus}` on): the run starts without them, and each
    /// joins the run under way when its process starts (`evb ctl add-bu`).
    pub spare_bus: u32,
    /// Host of the nodes made from counts.
    pub host: String,
    /// First port: the EVM gets it, then the RUs, then the BUs (0: the launcher picks free ports).
    pub base_port: u16,
    /// RU k and BU k share a host (seed 001's folded configuration): RU k's fragment for its
    /// own BU stays in the host, and each host's link carries data both ways. Read by the
    /// launchers that place nodes on hosts (`evb testbed`), and by the barrel shifter: with as
    /// many RUs as BUs its cycle is N − 1 slots and skips each RU's own BU.
    pub folded: bool,
}

impl Default for TopologySection {
    fn default() -> Self {
        TopologySection {
            rus: 2,
            bus: 2,
            spare_bus: 0,
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
    /// host:port where a standby EVM listens (docs/standby.md; empty: no standby). The
    /// nodes call it when they lose the EVM, and wait for it instead of ending the run.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub standby: String,
    /// host:port of the standby's control API (empty: with `standby`, a free port).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub standby_control: String,
    /// Only in the standby's own copy of the configuration (never in a file): where the
    /// active EVM it follows listens. Set by `evb node --standby`.
    #[serde(skip)]
    pub follow: String,
    /// With `follow`: the followed EVM's control API (where the next standby's listens once
    /// this one takes the control over).
    #[serde(skip)]
    pub follow_control: String,
    /// How many times a standby has taken the run control over (`evb up --standby`): the
    /// configuration a promoted standby sends with its runs carries one more than the one
    /// it replaced, and a node refuses a run whose configuration's is not the one it
    /// follows (docs/standby.md). Leave it 0 in a file.
    #[serde(skip_serializing_if = "is_zero_u16")]
    pub control_epoch: u16,
}

fn is_zero_u16(n: &u16) -> bool {
    *n == 0
}

impl Default for EvmSection {
    fn default() -> Self {
        EvmSection {
            id: "evm".into(),
            addr: String::new(),
            control: String::new(),
            standby: String::new(),
            standby_control: String::new(),
            follow: String::new(),
            follow_control: String::new(),
            control_epoch: 0,
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
    /// `file` and `hdf5` sinks: the directory the BUs write into. `{run}` in it becomes the
    /// run number (six digits) and `{run_id}` the run id, so `"out/{run}"` gives every run
    /// a folder of its own; without them, `evb run` refuses a folder that holds files of
    /// an earlier run of the same run id (they would mix).
    pub dir: String,
    /// `file` sink: start a new file after this many events at most (0: no limit); the
    /// commit interval (`commit_events`, `commit_ms`) and `file_max_mib` close one sooner.
    pub file_max_events: u64,
    /// `file` sink: start a new file after this many MiB (0: no limit).
    pub file_max_mib: u64,
    /// `file` sink: a file is closed and committed (synced, then renamed once the EVM
    /// agrees) after this many events; until then the RUs keep its events' fragments
    /// (0: the BU's credits).
    pub commit_events: u64,
    /// `file` sink: ... or once its first event is this old (ms).
    pub commit_ms: u64,
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
    /// `file` sink: `"zstd"` compresses each event's body alone (one zstd frame, so that
    /// every event can still be read on its own), `"none"` stores it as it is.
    pub compress: Compress,
    /// `file` sink with `compress = "zstd"`: the zstd level, 1 (fastest) to 19 (unset: 3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compress_level: Option<i32>,
    /// `hdf5` sink: compress every fragment's dataset with deflate (gzip) at this level,
    /// 1 (fastest) to 9 (smallest); 0: stored as it is. Every HDF5 reader reads deflate
    /// without plug-ins.
    pub hdf5_deflate: u8,
    /// `hdf5` sink: the files' layout, `"evb"` (evb's own, a group per event,
    /// docs/formats.md §6), `"dune"` (DUNE's hdf5libs trigger-record and time-slice files,
    /// file layout version 5, docs/formats.md §11), which DUNE's tools open, or `"packed"`
    /// (every event's payloads in one dataset with an index row per event, docs/formats.md
    /// §12), which small events can afford.
    pub hdf5_layout: Hdf5Layout,
    /// `file` sink with `run.secret`: the output files are readable by their group too
    /// (mode 0640 instead of 0600). Without a secret files follow the umask, and this is
    /// refused.
    pub file_group_read: bool,
    /// `file` and `hdf5` sinks: keep a committed file's pages in the page cache (true), or
    /// give them back to the kernel once the file is synced (false): the BU never reads its
    /// files again, and a page cache that grows by every byte written takes fresh memory,
    /// which costs more to write into than the pages just given back. On tmpfs (/dev/shm) a
    /// file's pages are the file and stay either way.
    pub keep_in_page_cache: bool,
}

impl Default for SinkSection {
    fn default() -> Self {
        SinkSection {
            kind: SinkKind::Discard,
            dir: String::new(),
            file_max_events: 0,
            file_max_mib: 1024,
            commit_events: 0,
            commit_ms: 200,
            serve_host: "127.0.0.1".into(),
            serve_base_port: 0,
            serve_max_held: 32,
            serve_hold: 0,
            serve_ack_timeout_s: 10.0,
            serve_drain_timeout_s: 5.0,
            compress: Compress::None,
            compress_level: None,
            hdf5_deflate: 0,
            hdf5_layout: Hdf5Layout::Evb,
            file_group_read: false,
            keep_in_page_cache: false,
        }
    }
}

/// The layout of the `hdf5` sink's files (`sink.hdf5_layout`).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Hdf5Layout {
    /// evb's own: a group per event, its fragments' headers and payloads (docs/formats.md §6).
    #[default]
    Evb,
    /// DUNE's hdf5libs files, file layout version 5: trigger records or time slices, each
    /// fragment behind a DUNE FragmentHeader (docs/formats.md §11).
    Dune,
    /// Every event's payloads back to back in one dataset, an index row per event and per
    /// fragment (docs/formats.md §12): what small events can afford.
    Packed,
}

impl Hdf5Layout {
    /// Every layout by its name in the configuration.
    pub const CHOICES: [(&'static str, Hdf5Layout); 3] = [
        ("evb", Hdf5Layout::Evb),
        ("dune", Hdf5Layout::Dune),
        ("packed", Hdf5Layout::Packed),
    ];

    /// The choices as an error names them: `"evb", "dune" or "packed"`.
    pub fn choices() -> String {
        let names: Vec<String> = Self::CHOICES
            .iter()
            .map(|(n, _)| format!("{n:?}"))
            .collect();
        match names.split_last() {
            Some((last, [])) => last.clone(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }
}

/// Read by name, a wrong one refused naming the key and the choices (serde's own message
/// names neither the table nor the key).
impl<'de> Deserialize<'de> for Hdf5Layout {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Hdf5Layout::CHOICES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, l)| *l)
            .ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "sink.hdf5_layout: {name:?} is not a layout ({})",
                    Hdf5Layout::choices()
                ))
            })
    }
}

/// How the file sink stores event bodies (`sink.compress`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Compress {
    None,
    Zstd,
}

impl SinkKind {
    /// Whether this sink commits its output (docs/protocol.md §6 step 7): a BU's events stay
    /// with the RUs until a part of its output holding them is committed (a file synced, or
    /// events a consumer acknowledged).
    pub fn commits(self) -> bool {
        matches!(self, SinkKind::File | SinkKind::Hdf5 | SinkKind::Serve)
    }

    /// Whether this sink writes files in `sink.dir` (`file`, `hdf5`).
    pub fn writes_files(self) -> bool {
        matches!(self, SinkKind::File | SinkKind::Hdf5)
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    Discard,
    Count,
    /// Files of built events in `sink.dir`.
    File,
    /// HDF5 files of built events in `sink.dir` (docs/formats.md §6); needs evb built with
    /// the `hdf5` feature.
    Hdf5,
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
    /// A spare: the run starts without it; it joins the run under way when its process
    /// starts (`evb ctl add-bu`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spare: bool,
}

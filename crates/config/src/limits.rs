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

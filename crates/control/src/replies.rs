//! The run control API's requests and replies as types (docs/control.md): the controller
//! makes them, `evb ctl`, `evb up`, the bench and the tests read them. A reply that lacks a
//! field, or holds one of another type, is refused when read, with the field named: no
//! reader takes a missing count for zero. The JSON mapping of a request (its body's keys)
//! is in [`Request::parse`], called by the HTTP shell only.

use evb_builder::{NodeEvent, StatusRole};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::controller::RunRecord;
use crate::fsm::{Command, State};
use crate::service::{LastRun, Mode};

/// A refusal: the HTTP status and why, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub status: u16,
    pub why: String,
}

impl Refused {
    pub fn new(status: u16, why: impl Into<String>) -> Refused {
        Refused {
            status,
            why: why.into(),
        }
    }
}

/// An operator's command with what it carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// A new configuration, as TOML text.
    Configure {
        config: String,
    },
    /// Start a run, numbered `run` (`None`: the next number).
    Start {
        run: Option<u64>,
    },
    Pause,
    Resume,
    Stop,
    Reset,
    Halt,
}

impl Request {
    /// The request of command `cmd` from its JSON body (`{}` for the commands that carry
    /// nothing); a bad key is refused with status 400, naming it.
    pub fn parse(cmd: Command, body: &Value) -> Result<Request, Refused> {
        Ok(match cmd {
            Command::Configure => Request::Configure {
                config: body["config"]
                    .as_str()
                    .ok_or_else(|| {
                        Refused::new(400, "configure needs {\"config\": \"<TOML text>\"}")
                    })?
                    .to_string(),
            },
            Command::Start => Request::Start {
                run: match body.get("run") {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(v.as_u64().filter(|&n| n >= 1).ok_or_else(|| {
                        Refused::new(
                            400,
                            format!(
                                "`run` must be an integer from 1 to {}",
                                crate::controller::MAX_RUN
                            ),
                        )
                    })?),
                },
            },
            Command::Pause => Request::Pause,
            Command::Resume => Request::Resume,
            Command::Stop => Request::Stop,
            Command::Reset => Request::Reset,
            Command::Halt => Request::Halt,
        })
    }

    /// The state-machine command it is.
    pub fn command(&self) -> Command {
        match self {
            Request::Configure { .. } => Command::Configure,
            Request::Start { .. } => Command::Start,
            Request::Pause => Command::Pause,
            Request::Resume => Command::Resume,
            Request::Stop => Command::Stop,
            Request::Reset => Command::Reset,
            Request::Halt => Command::Halt,
        }
    }
}

/// The reply to decisions from outside (`POST /api/v1/decide`): the run they went to and
/// how many; each becomes that run's next record, in order, as the EVM triggers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecideReply {
    pub run: u64,
    pub accepted: u64,
}

/// The reply to a command accepted: the state it leads to and the run it concerns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandReply {
    pub state: State,
    pub run: u64,
    /// `configure`: the sections the new configuration changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed: Option<Vec<String>>,
}

/// `GET /api/v1/status`: the whole system as the EVM's controller sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub state: State,
    pub run: u64,
    /// Why the last run failed (state `failed`).
    pub reason: Option<String>,
    pub mode: Mode,
    /// The commands the state allows.
    pub legal: Vec<String>,
    /// Spare BUs asked to start (`POST /api/v1/add-bu`) whose process does not answer
    /// yet: a launcher (`evb up`) starts each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adding: Vec<String>,
    pub evm: EvmSummary,
    pub totals: Totals,
    pub latency: Latency,
    /// The EVM's histogram of the current (or last) run: from each event's trigger to its
    /// release by the BU that built it, on the EVM's clock, every event released counted
    /// once (a lost BU's included); `bus` is 0. `None` before the EVM's first snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_latency: Option<Latency>,
    pub nodes: Vec<NodeRow>,
    /// The latest runs (20 at most, newest first), without their reports.
    pub runs: Vec<RunRecord>,
    pub config: ConfigSummary,
    pub time_unix: f64,
}

/// The EVM's own figures (each `null` before the EVM's first status line).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EvmSummary {
    pub triggered: Option<u64>,
    pub released: Option<u64>,
    pub in_flight: Option<u64>,
    pub credits_available: Option<u64>,
    pub paused: Option<bool>,
    /// Takeovers of the run by a standby (docs/standby.md).
    pub epoch: Option<u16>,
    /// This EVM is a standby that still follows the active one.
    pub following: Option<bool>,
    /// A standby that the nodes followed fenced this EVM (its epoch): its word is no
    /// longer the run's.
    pub fenced: Option<u16>,
    /// What happened to nodes during the run.
    pub lost: Option<Vec<NodeEvent>>,
    /// The nodes lost and not back.
    pub down: Option<Vec<String>>,
    /// The stages of the run's end reached so far, each with when (seconds since Start):
    /// triggers stopped, drained, sources stopped (empty while the run is not ending).
    #[serde(default)]
    pub stop_stages: Option<Vec<evb_builder::StopStageAt>>,
}

/// The run's totals in the header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// The EVM's count of final events of the run under way, or the last run's.
    pub events_built: u64,
    pub rate_hz: f64,
    pub bytes_per_s: f64,
}

/// The BUs' build latency histogram, merged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub bounds_us: Vec<u64>,
    pub counts: Vec<u64>,
    pub count: u64,
    pub sum_us: u64,
    /// How many BUs' histograms are in it.
    pub bus: u64,
    pub p50_us: Option<u64>,
    pub p99_us: Option<u64>,
}

/// One node's row of the table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRow {
    pub node: String,
    pub role: StatusRole,
    pub control: String,
    /// The driver's state during a run, the node's phase between runs, `unreachable`, or
    /// `unknown` before it was asked.
    pub state: String,
    /// The run it is in, or was last in.
    pub run: Option<u64>,
    pub events: u64,
    pub bytes: u64,
    pub rate_hz: f64,
    pub bytes_per_s: f64,
    /// EVM: credits free; BU: events queued at its sink; RU: fragments held.
    pub credits: Option<u64>,
    pub errors: u64,
    /// Why it could not be asked, in words.
    pub error: Option<String>,
    pub last: Option<LastRun>,
    /// A run built by time, in words: an RU's latency buffer (held now, its peak, what it
    /// evicted), a BU's LATE and MISSING components and window errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_time: Option<String>,
}

/// The configuration in force, in brief.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigSummary {
    pub run_id: String,
    pub events: u64,
    pub duration_s: f64,
    pub rate_hz: f64,
    pub fragment_size: u64,
    pub sink: String,
    pub transport: String,
}

/// `GET /api/v1/history`: the rate samples of the run under way or the last, as columns
/// (docs/control.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct History {
    /// The run the samples are of (0: none yet).
    pub run: u64,
    pub started_unix: f64,
    /// The span kept (seconds before the newest sample) and the most samples kept.
    pub window_s: f64,
    pub max_points: usize,
    /// Each sample's time (unix seconds).
    pub t: Vec<f64>,
    /// The system's rates at each sample (the EVM's released events, the BUs' bytes).
    pub totals: RateColumns,
    /// Every node's rates at each sample, by node id.
    pub nodes: std::collections::BTreeMap<String, RateColumns>,
}

/// Events and bytes per second, one entry per sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RateColumns {
    pub rate_hz: Vec<f64>,
    pub bytes_per_s: Vec<f64>,
}

/// `GET /api/v1/links`: the RU→BU matrix of the run under way or the last; row i is
/// `rus[i]`, column j `bus[j]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Links {
    pub run: u64,
    pub rus: Vec<String>,
    pub bus: Vec<String>,
    /// Payload bytes sent on each link in the run.
    pub bytes: Vec<Vec<u64>>,
    /// Their rate at the last poll (bytes/s, to a tenth).
    pub bytes_per_s: Vec<Vec<f64>>,
    /// Bytes queued to send on each link now.
    pub queued_bytes: Vec<Vec<u64>>,
}

/// `POST /api/v1/node/start`: the run control tells a node to start run `run` with the
/// configuration `config` (TOML, without the secret: each node puts in its own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStart {
    pub run: u64,
    pub config: String,
}

/// A node's answer to [`NodeStart`] when it is in that run already (the run's start and a
/// restarted BU's rejoin can cross).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStarted {
    pub node: String,
    pub run: u64,
    pub phase: crate::service::Phase,
}

/// `POST /api/v1/add-bu`: the spare BU (its id) to start; it joins the run under way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddBuRequest {
    pub bu: String,
}

/// The answer to an [`AddBuRequest`]: the spare is to be started (a launcher such as
/// `evb up` starts it; elsewhere `start` says how), and joins run `run` if one is under
/// way once its process answers (the EVM's node events say `joined` then).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AddBuReply {
    /// The run under way (`None`: between runs; it takes part from the next).
    pub run: Option<u64>,
    pub bu: String,
    /// The BU as the EVM's node events name it (`bu[2]`).
    pub node: String,
    /// The command that starts it by hand, on its host (`evb up` runs it itself).
    pub start: String,
}

/// `POST /api/v1/retire`: the BU (its id) to retire from the run under way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetireRequest {
    pub bu: String,
}

/// The answer to a [`RetireRequest`]: the BU is retiring from run `run` (it leaves once all
/// it holds is final; the EVM's node events say `retired` then).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetireReply {
    pub run: u64,
    pub bu: String,
    /// The BU as the EVM's node events name it (`bu[1]`).
    pub node: String,
}

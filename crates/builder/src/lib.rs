//! Event building without IO: the EVM, RU and BU as state machines.
//!
//! Each takes messages (and the time) in and returns [`Action`]s; none touches a socket or
//! reads a clock. A driver (`evb-node`) connects them to messaging; tests drive them with
//! scripted messages. The protocol: BUs grant credits to the EVM; the EVM assigns each
//! event to a BU with credit and tells the RUs; RUs send their fragments to that BU; the BU
//! checks and builds the event, hands it to a sink, and releases it to the EVM, which tells
//! the RUs to free their fragments.

mod action;
pub mod assembly;
mod awaiting;
mod bu;
mod entered;
mod event;
mod evm;
pub mod frames;
mod generator;
mod ids;
mod join;
mod latency;
mod ledger;
mod pages;
mod report;
mod ru;
pub mod shaping;
mod sink;
pub mod slice_buffer;
mod source;
mod status;
pub mod window_buffer;

pub use action::{Action, NodeRef, Path, RunState};
pub use awaiting::{Awaiting, AWAIT_LIMIT};
pub use bu::{Bu, BuConfig, BuStats, Verify};
pub use event::BuiltEvent;
pub use evm::{
    Assignment, BuResync, Evm, EvmConfig, EvmStats, RuLossPolicy, RuResync, StopStage, StopStageAt,
    Takeover, FIRST_CREDITS_GRACE,
};
pub use generator::{Content, Generator, SizeModel};
pub use ids::{FastMap, FastSet};
pub use latency::{LatencyHistogram, LATENCY_BOUNDS_US};
pub use ledger::{Ledger, ReleaseOutcome};
pub use report::{verdict, NodeEvent, NodeEventKind, RunReport};
pub use ru::{Ru, RuConfig, RuStats, PREFIX_LEN};
pub use sink::{CountingSink, DiscardSink, PreparedPart, Sink, SinkError};
pub use source::{FragmentSpec, LiveFeed, LiveStats, Recorded, Recording, Source};
pub use status::{
    CpuSeconds, NetStatus, NodeStatus, PeerQueue, PoolStatus, Registered, RoleStats, SinkStatus,
    StatusKind, StatusRole,
};

#[cfg(test)]
mod tests;

//! Run control and observability: long-lived nodes that run numbered runs on command, the
//! run state machine, the HTTP/JSON control API, Prometheus `/metrics` and the run page.
//!
//! Layering: this crate drives `evb-node` (a run of one node) through its narrow
//! [`evb_node::RunControl`] handle, and is driven by the command line (`evb up`, `evb ctl`,
//! `evb run`, `evb node`).

mod api;
pub mod client;
mod controller;
pub mod fsm;
pub mod guard;
pub mod metrics;
mod page;
pub mod replies;
mod service;
pub mod session;

pub use controller::{
    check_chain, record_file, ChainCheck, Controller, OnceRecord, RunEnd, RunRecord, ScrapeTarget,
};
pub use evb_transport::control_token;
pub use service::{
    numbered_run_id, run_process, Ended, LastRun, Lines, Mode, Node, NodeReply, Phase,
    ProcessError, RECORDS_FLUSH_LIMIT,
};

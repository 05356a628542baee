//! Nodes: the IO drivers that run an EVM, RU or BU state machine over messaging, and the
//! node lifecycle (configure → ready → running → stopping → halted).
//!
//! A node is configured when its [`Driver`] is made (pools allocated, listener bound,
//! connections dialled); it reports Ready to the EVM once every connection is up; the EVM
//! starts the run when all nodes are ready, stops it when the configured event count or
//! duration is reached and every event is released, collects every node's report, and
//! halts them.

mod driver;
mod file_sink;
mod playback;
pub mod setup;

pub use driver::{Driver, NodeOutcome, StatusOut};

use std::time::Duration;

use evb_config::{Config, TransportKind};
use evb_transport::inproc::InprocTransport;
use evb_transport::tcp::TcpTransport;
use evb_transport::Transport;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum NodeError {
    #[error("no node {0:?} in the configuration")]
    UnknownNode(String),
    #[error("cannot listen on {0}: {1}")]
    Listen(String, String),
    #[error("cannot connect to {0}: {1}")]
    Connect(String, String),
    #[error("io: {0}")]
    Io(String),
    #[error("{0}")]
    Setup(String),
}

/// Runs node `id` of `cfg` on the transport the configuration names, until the run ends.
pub fn run_node(
    cfg: &Config,
    id: &str,
    status: StatusOut,
    status_every: Duration,
) -> Result<NodeOutcome, NodeError> {
    let kind = cfg.transport.kind;
    let provider = cfg.transport.provider.clone();
    let driver = Driver::new(
        cfg,
        id,
        |tc| -> Result<Box<dyn Transport>, NodeError> {
            Ok(match kind {
                TransportKind::Tcp => {
                    Box::new(TcpTransport::new(tc).map_err(|e| NodeError::Io(e.to_string()))?)
                }
                TransportKind::Inproc => Box::new(InprocTransport::new(tc)),
                TransportKind::Ofi => evb_transport::ofi::OfiTransport::new(tc, &provider)
                    .map_err(|e| NodeError::Setup(format!("transport ofi: {e}")))?,
                TransportKind::Shm => evb_transport::shm::ShmTransport::new(tc)
                    .map_err(|e| NodeError::Setup(format!("transport shm: {e}")))?,
            })
        },
        status,
        status_every,
    )?;
    driver.run()
}

//! Nodes: the IO drivers that run an EVM, RU or BU state machine over messaging, and the
//! node lifecycle (configure → ready → running → stopping → halted).
//!
//! A node is configured when its [`Driver`] is made (pools allocated, listener bound,
//! connections dialled); it reports Ready to the EVM once every connection is up; the EVM
//! starts the run when all nodes are ready, stops it when the configured event count or
//! duration is reached and every event is released, collects every node's report, and
//! halts them.

pub mod affinity;
pub mod control;
pub mod discovery;
mod driver;
mod file_sink;
mod file_syncer;
mod playback;
pub mod plug;
pub mod priority;
pub mod serve_sink;
pub mod session;
pub mod setup;
mod stream_source;

pub use control::RunControl;
pub use driver::{Driver, NodeOutcome, StatusOut};

use std::time::Duration;

use evb_config::{host_of as host, Config, TransportKind};
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

/// One transport of `kind` for this node.
fn make(
    kind: TransportKind,
    multipath: bool,
    provider: &str,
    tc: evb_transport::TransportConfig,
) -> Result<Box<dyn Transport>, NodeError> {
    // the configuration's name is the table's (evb_messaging::TRANSPORTS); multipath tcp
    // is a row of its own
    let name = match kind {
        TransportKind::Tcp if multipath => "mptcp",
        _ => kind.name(),
    };
    evb_messaging::open_transport(name, tc, provider).map_err(|e| match kind {
        TransportKind::Tcp => NodeError::Io(e),
        _ => NodeError::Setup(format!("transport {name}: {e}")),
    })
}

/// Makes `cfg` the standby EVM's own configuration (`evb node --id EVM --standby`): it
/// listens at `evm.standby` (its control API at `evm.standby_control`) and follows the EVM
/// at its configured address (docs/standby.md).
pub fn make_standby(cfg: &mut Config, id: &str) -> Result<(), String> {
    let Some(evm) = cfg.nodes().into_iter().next() else {
        return Err("no EVM in the configuration".into());
    };
    if evm.id != id {
        return Err(format!("--standby is for the EVM ({}), not {id}", evm.id));
    }
    if cfg.evm.standby.is_empty() {
        return Err("--standby needs evm.standby (where the standby listens)".into());
    }
    if cfg.is_discovered(&evm.addr) {
        return Err("--standby needs the EVM's address (evm.addr, or --evm)".into());
    }
    cfg.evm.follow = evm.addr;
    cfg.evm.follow_control = evm.control;
    cfg.evm.addr = cfg.evm.standby.clone();
    cfg.evm.control = cfg.standby_control();
    // the active EVM writes the rendezvous file; the standby must not overwrite it
    cfg.run.rendezvous.clear();
    Ok(())
}

/// Runs node `id` of `cfg` on the transport the configuration names, until the run ends.
pub fn run_node(
    cfg: &Config,
    id: &str,
    status: StatusOut,
    status_every: Duration,
) -> Result<NodeOutcome, NodeError> {
    run_node_controlled(cfg, id, status, status_every, RunControl::new())
}

/// [`run_node`], commanded and watched through `control`.
pub fn run_node_controlled(
    cfg: &Config,
    id: &str,
    status: StatusOut,
    status_every: Duration,
    control: RunControl,
) -> Result<NodeOutcome, NodeError> {
    let plugs = plug::Plugs::default();
    run_node_plugged(cfg, id, status, status_every, control, plugs)
}

/// [`run_node_controlled`] with a program's own code plugged in: a producer feeding this RU
/// or a consumer taking this BU's events (see [`plug`]; the public API is `evb-plugin`).
pub fn run_node_plugged(
    cfg: &Config,
    id: &str,
    status: StatusOut,
    status_every: Duration,
    control: RunControl,
    plugs: plug::Plugs,
) -> Result<NodeOutcome, NodeError> {
    if let Some(cpus) = cfg.affinity.get(id) {
        affinity::pin_current_thread(cpus).map_err(|e| {
            NodeError::Setup(format!("affinity.{id}: cannot run on CPUs {cpus:?}: {e}"))
        })?;
        let now = affinity::current_cpus().unwrap_or_default();
        tracing::info!(node = id, "pinned to CPUs {now:?}");
    }
    if cfg.run.priority != evb_config::Priority::Normal {
        let how = priority::raise_current_thread(cfg.run.priority).map_err(|e| {
            NodeError::Setup(format!(
                "run.priority = \"{}\": {e}",
                cfg.run.priority.name()
            ))
        })?;
        tracing::info!(node = id, "raised: {how}");
    }
    let (kind, local) = (cfg.transport.kind, cfg.transport.local);
    let multipath = cfg.transport.multipath;
    let provider = cfg.transport.provider.clone();
    let my_host = cfg
        .nodes()
        .into_iter()
        .find(|n| n.id == id)
        .map(|n| host(&n.addr).to_string())
        .unwrap_or_default();
    let driver = Driver::new(
        cfg,
        id,
        |tc| -> Result<Box<dyn Transport>, NodeError> {
            match local {
                None => make(kind, multipath, &provider, tc),
                Some(local) => {
                    // same host: `local`; elsewhere: `kind`
                    // rails join hosts: the same host's routes stay single-path
                    let near = make(local, false, &provider, tc.clone())?;
                    let far = make(kind, multipath, &provider, tc)?;
                    let route: evb_transport::mux::Route =
                        Box::new(move |addr: &str| if host(addr) == my_host { 1 } else { 0 });
                    Ok(Box::new(evb_transport::mux::MuxTransport::new(
                        vec![far, near],
                        route,
                    )))
                }
            }
        },
        status,
        status_every,
        control,
        plugs,
    )?;
    driver.run()
}

#[cfg(test)]
mod transport_names {
    use evb_config::TransportKind;

    /// Every kind a configuration names is a row of the one transport table (a kind added
    /// to the configuration without its row, or renamed on one side, fails here).
    #[test]
    fn every_configured_kind_has_its_row_in_the_transport_table() {
        for kind in TransportKind::ALL {
            assert!(
                evb_messaging::TRANSPORT_KINDS.contains(&kind.name()),
                "{} is not in {:?}",
                kind.name(),
                evb_messaging::TRANSPORT_KINDS
            );
        }
        assert!(evb_messaging::TRANSPORT_KINDS.contains(&"mptcp"));
    }
}

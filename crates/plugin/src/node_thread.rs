//! The plugged node's driver on a thread of the program's process; the rest of the run (EVM,
//! other RUs and BUs) are ordinary `evb node` processes that it connects to.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use evb_builder::{NodeStatus, RunState};
use evb_config::Config;
use evb_node::plug::Plugs;
use evb_node::{NodeError, NodeOutcome, RunControl};

use crate::Error;

pub(crate) struct NodeThread {
    id: String,
    handle: Option<JoinHandle<Result<NodeOutcome, NodeError>>>,
    ended: Option<Result<NodeOutcome, String>>,
    /// The node's latest status line (what `evb node` prints).
    status: Arc<Mutex<Option<NodeStatus>>>,
    /// Where the node calls the EVM, and how long it tries (`run.connect_timeout_s`).
    evm_addr: String,
    connect_timeout: Duration,
    started: Instant,
}

/// How often the plugged node's status is refreshed.
const STATUS_EVERY: Duration = Duration::from_millis(200);

/// How much longer than `run.connect_timeout_s` [`NodeThread::connected`] waits for the
/// node's own verdict before giving up on it (the node waits a little longer than the
/// timeout for the EVM to name missing peers).
const CONNECT_SLACK: Duration = Duration::from_secs(5);

impl NodeThread {
    pub(crate) fn spawn(cfg: &Config, id: &str, plugs: Plugs) -> Result<NodeThread, Error> {
        Self::spawn_with(cfg, id, plugs, RunControl::new())
    }

    /// As [`NodeThread::spawn`], the node's run controlled through `control` (the trigger's
    /// decisions go in there).
    pub(crate) fn spawn_with(
        cfg: &Config,
        id: &str,
        plugs: Plugs,
        control: RunControl,
    ) -> Result<NodeThread, Error> {
        let evm_addr = cfg
            .nodes()
            .into_iter()
            .find(|n| n.role == evb_config::Role::Evm)
            .map(|n| n.addr)
            .unwrap_or_default();
        let connect_timeout = Duration::from_secs_f64(cfg.run.connect_timeout_s);
        let (cfg, node) = (cfg.clone(), id.to_string());
        let status = Arc::new(Mutex::new(None));
        let latest = status.clone();
        let handle = std::thread::Builder::new()
            .name(format!("evb-{id}"))
            .spawn(move || {
                evb_node::run_node_plugged(
                    &cfg,
                    &node,
                    Box::new(move |line| {
                        if let Ok(mut s) = latest.lock() {
                            *s = Some(line);
                        }
                    }),
                    STATUS_EVERY,
                    control,
                    plugs,
                )
            })
            .map_err(|e| Error::Setup(format!("{id}: cannot start its thread: {e}")))?;
        Ok(NodeThread {
            id: id.to_string(),
            handle: Some(handle),
            ended: None,
            status,
            evm_addr,
            connect_timeout,
            started: Instant::now(),
        })
    }

    /// The node is connected to the EVM: its latest status line names the EVM among its
    /// peers, or is past `configured` (every connection was up).
    fn reached_evm(&self) -> bool {
        self.status().is_some_and(|s| {
            s.state != RunState::Configured || s.peers.iter().any(|p| p.peer == "evm")
        })
    }

    /// Whether the node is connected to the EVM yet (`Ok(false)`: still trying); once it
    /// cannot be, why: the node's own error at `run.connect_timeout_s` (an [`Error::Setup`]
    /// naming the peers it could not reach and where it tried), or, should that not come
    /// within [`CONNECT_SLACK`] more, one naming the EVM's address. It sees the connection
    /// in the status lines, so within [`STATUS_EVERY`] of it.
    pub(crate) fn connected(&mut self) -> Result<bool, Error> {
        if self.reached_evm() {
            return Ok(true);
        }
        if self.is_over() {
            return match self.join() {
                Err(e) => Err(e),
                Ok(o) => Err(Error::RunOver(format!(
                    "{}: the run ended before it reached the EVM at {}: {}",
                    self.id, self.evm_addr, o.reason
                ))),
            };
        }
        if self.started.elapsed() > self.connect_timeout + CONNECT_SLACK {
            return Err(Error::Setup(format!(
                "{}: not connected to the EVM at {} within run.connect_timeout_s ({:.1} s)",
                self.id,
                self.evm_addr,
                self.connect_timeout.as_secs_f64()
            )));
        }
        Ok(false)
    }

    /// Waits until the node is connected to the EVM, or cannot be (see
    /// [`NodeThread::connected`]).
    pub(crate) fn wait_connected(&mut self) -> Result<(), Error> {
        while !self.connected()? {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// The node's latest status line (`None` before its first).
    pub(crate) fn status(&self) -> Option<NodeStatus> {
        self.status.lock().ok().and_then(|s| s.clone())
    }

    /// The node's run ended (its thread returned).
    pub(crate) fn is_over(&mut self) -> bool {
        if self.handle.as_ref().is_some_and(|h| h.is_finished()) {
            let _ = self.join();
        }
        self.ended.is_some()
    }

    /// Why the run is over, once it is.
    pub(crate) fn why_over(&mut self) -> String {
        match &self.ended {
            Some(Ok(o)) => o.reason.clone(),
            Some(Err(e)) => e.clone(),
            None => "still running".into(),
        }
    }

    /// Waits for the node's run to end.
    pub(crate) fn join(&mut self) -> Result<NodeOutcome, Error> {
        if let Some(h) = self.handle.take() {
            self.ended = Some(match h.join() {
                Ok(Ok(outcome)) => Ok(outcome),
                Ok(Err(e)) => Err(format!("{}: {e}", self.id)),
                Err(_) => Err(format!("{}: its driver panicked", self.id)),
            });
        }
        match self.ended.as_ref().expect("joined above") {
            Ok(o) => Ok(o.clone()),
            Err(e) => Err(Error::Setup(e.clone())),
        }
    }
}

//! The plugged node's driver on a thread of the program's process; the rest of the run (EVM,
//! other RUs and BUs) are ordinary `evb node` processes that it connects to.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use evb_builder::NodeStatus;
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
}

/// How often the plugged node's status is refreshed.
const STATUS_EVERY: Duration = Duration::from_millis(200);

impl NodeThread {
    pub(crate) fn spawn(cfg: &Config, id: &str, plugs: Plugs) -> Result<NodeThread, Error> {
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
                    RunControl::new(),
                    plugs,
                )
            })
            .map_err(|e| Error::Setup(format!("{id}: cannot start its thread: {e}")))?;
        Ok(NodeThread {
            id: id.to_string(),
            handle: Some(handle),
            ended: None,
            status,
        })
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

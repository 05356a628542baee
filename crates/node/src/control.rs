//! The narrow interface between a running node and whatever controls and watches it (the
//! control API, `evb run`'s Ctrl-C): commands go in as flags the driver reads once per loop
//! pass, and the driver publishes a snapshot of its status a few times a second. Neither
//! side waits for the other, so watching a node costs its event loop nothing but the
//! snapshot.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use evb_builder::NodeStatus;

/// How often a running driver publishes its status snapshot.
pub const PUBLISH_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

#[derive(Clone, Default)]
pub struct RunControl(Arc<Inner>);

#[derive(Default)]
struct Inner {
    stop: AtomicBool,
    pause: AtomicBool,
    abort: Mutex<Option<String>>,
    aborting: AtomicBool,
    snapshot: Mutex<Option<NodeStatus>>,
    /// Where the node's control API listens, once bound.
    api: Mutex<Option<String>>,
    /// Decisions from outside (their windows) not yet handed to the EVM.
    decisions: Mutex<Vec<evb_wire::window::DecisionWindow>>,
    /// BUs (by index) the operator retires, not yet handed to the EVM.
    retire: Mutex<Vec<u16>>,
}

impl RunControl {
    pub fn new() -> RunControl {
        RunControl::default()
    }

    /// Ends the run cleanly (at the EVM: no new events, everything in flight built).
    pub fn stop(&self) {
        self.0.stop.store(true, Ordering::SeqCst);
    }

    /// Pauses (or resumes) triggering, at the EVM.
    pub fn set_paused(&self, paused: bool) {
        self.0.pause.store(paused, Ordering::SeqCst);
    }

    /// Ends the run at once, failed, with this reason (the EVM tells every node).
    pub fn abort(&self, why: impl Into<String>) {
        *self.0.abort.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.into());
        self.0.aborting.store(true, Ordering::SeqCst);
    }

    /// Clears the commands: the next run starts unpaused and unstopped.
    pub fn reset(&self) {
        self.0.stop.store(false, Ordering::SeqCst);
        self.0.pause.store(false, Ordering::SeqCst);
        self.0.aborting.store(false, Ordering::SeqCst);
        *self.0.abort.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.0
            .decisions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.0
            .retire
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        // a new run's figures start from nothing, not from the last run's
        *self.0.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Decisions from outside (`windows.outside`): their windows, for the EVM's next pass.
    pub fn decide(&self, windows: &[evb_wire::window::DecisionWindow]) {
        self.0
            .decisions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(windows.iter().cloned());
    }

    /// Retires BU `bu` from the run under way, at the EVM's next pass (`Evm::retire`).
    pub fn retire(&self, bu: u16) {
        self.0
            .retire
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(bu);
    }

    /// The BUs to retire handed in since the last call.
    pub(crate) fn take_retirements(&self) -> Vec<u16> {
        std::mem::take(&mut *self.0.retire.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The decisions handed in since the last call.
    pub(crate) fn take_decisions(&self) -> Vec<evb_wire::window::DecisionWindow> {
        std::mem::take(&mut *self.0.decisions.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Records where the node's control API listens (the driver tells the EVM).
    pub fn set_api(&self, addr: String) {
        *self.0.api.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr);
    }

    /// Where the node's control API listens (empty before it is bound, or without one).
    pub fn api(&self) -> String {
        self.0
            .api
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default()
    }

    /// The latest status the node published (`None` before its first).
    pub fn snapshot(&self) -> Option<NodeStatus> {
        self.0
            .snapshot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Publishes a status (the driver, or the node's process between runs).
    pub fn publish(&self, v: NodeStatus) {
        *self.0.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
    }

    pub(crate) fn stop_requested(&self) -> bool {
        self.0.stop.load(Ordering::Relaxed)
    }

    pub(crate) fn paused(&self) -> bool {
        self.0.pause.load(Ordering::Relaxed)
    }

    /// The abort reason, once (a cheap load on every pass when there is none).
    pub(crate) fn take_abort(&self) -> Option<String> {
        if !self.0.aborting.load(Ordering::Relaxed) {
            return None;
        }
        self.0.aborting.store(false, Ordering::SeqCst);
        self.0
            .abort
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_seen_and_reset() {
        let c = RunControl::new();
        assert!(!c.stop_requested() && !c.paused() && c.take_abort().is_none());
        c.stop();
        c.set_paused(true);
        c.abort("operator");
        let seen = c.clone();
        assert!(seen.stop_requested() && seen.paused());
        assert_eq!(seen.take_abort().as_deref(), Some("operator"));
        assert_eq!(seen.take_abort(), None, "an abort is taken once");
        let line = NodeStatus::new(
            "ru0",
            evb_builder::RunState::Running,
            evb_builder::RoleStats::Ru(Box::default()),
        );
        c.publish(line);
        assert_eq!(
            seen.snapshot().map(|s| s.state),
            Some(evb_builder::RunState::Running)
        );
        c.reset();
        assert!(!seen.stop_requested() && !seen.paused());
        assert!(seen.snapshot().is_none());
    }
}

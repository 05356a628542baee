//! The trigger: an outside trigger program handing the run its decisions (`builder.by =
//! "window"` with `windows.outside = true`), the EVM running in the program's process. Each
//! decision is a readout window `[begin, end)` in ticks over every source or the sources it
//! names; the EVM makes it the run's next record, in the order decided, as credits allow
//! (docs/formats.md §8). The same decisions as `evb ctl decide` or `POST /api/v1/decide`,
//! with no HTTP hop and the same checks.

use std::time::Duration;

use evb_builder::NodeStatus;
use evb_config::{BuildBy, Config, Role};
use evb_node::plug::Plugs;
use evb_node::{NodeOutcome, RunControl};
use evb_wire::window::DecisionWindow;

use crate::node_thread::NodeThread;
use crate::Error;

/// An outside trigger program's handle on its EVM.
pub struct Trigger {
    node: NodeThread,
    control: RunControl,
    longest: u64,
    sources: Vec<u16>,
    decided: u64,
    finished: bool,
}

impl Trigger {
    /// Starts `cfg`'s EVM in this process (its driver on a thread), its records decided by
    /// the returned trigger. The configuration must say `builder.by = "window"` and
    /// `windows.outside = true`; the RUs and BUs are started elsewhere (`evb node`) from
    /// the same configuration. The run ends after `run.events` decisions (or its
    /// duration), as under `evb up`.
    pub fn start(cfg: &Config) -> Result<Trigger, Error> {
        cfg.validate().map_err(|e| Error::Setup(e.to_string()))?;
        if cfg.builder.by != BuildBy::Window || !cfg.windows.outside {
            return Err(Error::Setup(
                "a trigger decides a run's records: set builder.by = \"window\" and \
                 windows.outside = true"
                    .into(),
            ));
        }
        let evm = cfg
            .nodes()
            .into_iter()
            .find(|n| n.role == Role::Evm)
            .ok_or_else(|| Error::Setup("the configuration has no EVM".into()))?;
        let control = RunControl::new();
        let node = NodeThread::spawn_with(cfg, &evm.id, Plugs::default(), control.clone())?;
        Ok(Trigger {
            node,
            control,
            longest: cfg.windows.longest_ticks,
            sources: cfg.ru_source_ids(),
            decided: 0,
            finished: false,
        })
    }

    /// Decides a record: readout window `[begin, end)` in ticks over the sources named in
    /// `components` (any order; empty: every source). Answers the record's number (the
    /// decisions made so far, from 0). Refused, and nothing taken, for a window that does
    /// not end after it begins or is longer than `windows.longest_ticks`, for a source no
    /// RU reads or one named twice ([`Error::Refused`], the run goes on), and once the run
    /// is over ([`Error::RunOver`]).
    pub fn decide(&mut self, begin: u64, end: u64, components: &[u16]) -> Result<u64, Error> {
        let refused = |why: String| Error::Refused {
            why,
            run_stopped: false,
        };
        if self.finished {
            return Err(Error::State("decide after finish".into()));
        }
        if self.node.is_over() {
            return Err(Error::RunOver(self.node.why_over()));
        }
        if end <= begin || end - begin > self.longest {
            return Err(refused(format!(
                "window [{begin}, {end}): it must end after it begins and last at most \
                 windows.longest_ticks = {} ticks",
                self.longest
            )));
        }
        let w = DecisionWindow::new(begin, end, components.to_vec()).map_err(refused)?;
        if let Some(s) = w.components.iter().find(|s| !self.sources.contains(s)) {
            return Err(refused(format!(
                "window [{begin}, {end}) names source {s}, which no RU of the run reads \
                 (their source ids: {:?})",
                self.sources
            )));
        }
        self.control.decide(&[w]);
        self.decided += 1;
        Ok(self.decided - 1)
    }

    /// Decisions made so far.
    pub fn decided(&self) -> u64 {
        self.decided
    }

    /// Whether the EVM is connected to the run's nodes yet, without waiting (`Ok(false)`:
    /// still trying), the error of [`Trigger::wait_connected`] once it cannot be.
    pub fn connected(&mut self) -> Result<bool, Error> {
        self.node.connected()
    }

    /// Waits until every RU and BU is connected to the EVM, or cannot be (the node's
    /// setup error at `run.connect_timeout_s`).
    pub fn wait_connected(&mut self) -> Result<(), Error> {
        self.node.wait_connected()
    }

    /// The EVM's latest status, refreshed 5 times a second (`None` before the first): its
    /// `decisions_received`, `triggered` and `released` say how far the decisions are.
    pub fn status(&self) -> Option<NodeStatus> {
        self.node.status()
    }

    /// Ends the run now: no decision after this one is triggered (those handed in and not
    /// triggered are counted, `decisions_unbuilt`), every record in flight is built.
    pub fn stop(&self) {
        self.control.stop();
    }

    /// Waits for the run to end (after `run.events` decisions, its duration, or
    /// [`Trigger::stop`]): the EVM's outcome, its report and verdict.
    pub fn finish(mut self) -> Result<NodeOutcome, Error> {
        self.finished = true;
        while !self.node.is_over() {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.node.join()
    }
}

//! What the state machines ask their driver to do. They never touch a socket themselves.

use std::collections::VecDeque;

use evb_buffers::Chain;
use evb_wire::Message;

/// A node of the run, as the logic names it (the driver maps it to a connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeRef {
    Evm,
    Ru(u16),
    Bu(u16),
}

impl std::fmt::Display for NodeRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeRef::Evm => write!(f, "evm"),
            NodeRef::Ru(i) => write!(f, "ru[{i}]"),
            NodeRef::Bu(i) => write!(f, "bu[{i}]"),
        }
    }
}

/// Which messaging path a message takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Low latency: on the wire at once (lifecycle, aborts).
    Now,
    /// High throughput: packed into the destination's page.
    Batched,
}

#[derive(Debug)]
pub enum Action {
    Send {
        to: NodeRef,
        msg: Message,
        path: Path,
    },
    /// RU → BU: `count` encoded fragments of consecutive events, back to back (each its
    /// message header, fragment header and payload) in pool blocks.
    ///
    /// `inc`: the incarnation of the BU that the assignment named. The driver sends them
    /// only over a connection to that incarnation; otherwise they stay held, unsent, and
    /// the EVM's reassignment sends them again (docs/protocol.md §6 item 11).
    SendFragments {
        to: NodeRef,
        inc: u16,
        data: Chain,
        count: u32,
    },
    /// BU: the EVM accepted the release of these events: the sink may make them output.
    Accepted(evb_wire::EventRange),
    /// BU: the EVM committed part `part` of the sink's output: publish it
    /// (`Sink::publish`), then call `Bu::published`.
    Publish(u32),
    /// EVM: BU `bu` was lost after part `part` of its output was committed and before it
    /// said the part was published: publish it for the BU where its files can be reached
    /// (the sink's directory), then call `Evm::published_for`.
    PublishFor { bu: u16, part: u32 },
    /// EVM: drop this node from the run now (close its control connection), e.g. a BU
    /// that an RU can no longer reach.
    Disconnect(NodeRef),
    /// The node's part in the run is over; the driver flushes and exits.
    Exit { ok: bool, reason: String },
}

/// Node lifecycle, the same for every role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    /// Configured, pools allocated, connecting to peers.
    Configured,
    /// Connected; told the EVM (or, for the EVM, waiting for everyone).
    Ready,
    Running,
    /// Stop received or sent: draining and reporting.
    Stopping,
    Halted,
    Aborted,
}

impl RunState {
    /// The state's name, as status lines write it.
    pub fn name(self) -> &'static str {
        match self {
            RunState::Configured => "configured",
            RunState::Ready => "ready",
            RunState::Running => "running",
            RunState::Stopping => "stopping",
            RunState::Halted => "halted",
            RunState::Aborted => "aborted",
        }
    }

    /// Halted or aborted: nothing more happens.
    pub fn is_over(self) -> bool {
        matches!(self, RunState::Halted | RunState::Aborted)
    }
}

/// An RU or BU halted by the EVM: its final state, and the driver is told to exit.
pub(crate) fn halt(state: &mut RunState, actions: &mut VecDeque<Action>, ok: bool) {
    *state = RunState::Halted;
    actions.push_back(Action::Exit {
        ok,
        reason: "halted by the EVM".into(),
    });
}

/// An RU or BU with a standby EVM lost its EVM while the run was on (ready, running or
/// stopping): it goes on working and waits for the standby instead of aborting.
pub(crate) fn waits_for_standby(standby: bool, state: RunState) -> bool {
    standby
        && matches!(
            state,
            RunState::Ready | RunState::Running | RunState::Stopping
        )
}

/// An RU or BU resyncs with a standby that took the run over: what it had queued for the
/// old EVM went with that connection (its resync says it instead), and a node that had not
/// heard the old EVM's Start is in the run all the same.
pub(crate) fn resync_with_new_evm(state: &mut RunState, actions: &mut VecDeque<Action>) {
    actions.retain(|a| {
        !matches!(
            a,
            Action::Send {
                to: NodeRef::Evm,
                ..
            }
        )
    });
    if *state == RunState::Ready {
        *state = RunState::Running;
    }
}

/// An RU or BU leaves the run on an error (`reason`): aborted, and the driver exits.
pub(crate) fn abort(state: &mut RunState, actions: &mut VecDeque<Action>, reason: String) {
    *state = RunState::Aborted;
    actions.push_back(Action::Exit { ok: false, reason });
}

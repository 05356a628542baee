//! The run state machine of a long-lived event builder, as the operator sees it.
//!
//! ```text
//!             configure                     pause
//!            ┌────────┐        start      ┌───────┐
//!   (up) ──▶ │ ready  │ ───▶ starting ──▶ │running│ ◀──▶ paused
//!            └────────┘                   └───────┘ resume
//!              ▲   ▲                          │ stop (also from starting, paused)
//!   reset      │   │  run complete            ▼
//!   ┌──────┐   │   └────────────────────── stopping
//!   │failed│ ──┘      (a failed run ──▶ failed, with the reason)
//!   └──────┘
//!   halt (from ready or failed) ──▶ halted: every node process exits
//! ```
//!
//! `reset` in starting, running, paused or stopping aborts the run and returns to ready.
//! Pure: no IO, no clock; the controller applies the transitions.

use serde::{Deserialize, Serialize};

/// The reason a reset gives the EVM to abort the run under way: a run that ends with it is
/// `aborted` in the run records, and every reader says so (not `FAILED`).
pub const RESET_REASON: &str = "reset by the operator";

/// Declares the run states in one place: the enum, [`State::ALL`] and each state's name, so
/// that whatever lists the states (metrics, tests) iterates `State::ALL` and a new state
/// cannot be left out of it.
macro_rules! states {
    ($($state:ident = $name:literal,)*) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(rename_all = "lowercase")]
        pub enum State {
            $($state,)*
        }

        impl State {
            /// Every state, in the order of the diagram.
            pub const ALL: &'static [State] = &[$(State::$state,)*];

            pub fn name(self) -> &'static str {
                match self {
                    $(State::$state => $name,)*
                }
            }
        }
    };
}

states! {
    Ready = "ready",
    Starting = "starting",
    Running = "running",
    Paused = "paused",
    Stopping = "stopping",
    Failed = "failed",
    Halted = "halted",
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Command {
    Configure,
    Start,
    Pause,
    Resume,
    Stop,
    Halt,
    Reset,
}

pub const COMMANDS: [Command; 7] = [
    Command::Configure,
    Command::Start,
    Command::Pause,
    Command::Resume,
    Command::Stop,
    Command::Halt,
    Command::Reset,
];

impl Command {
    pub fn parse(s: &str) -> Option<Command> {
        COMMANDS.into_iter().find(|c| c.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            Command::Configure => "configure",
            Command::Start => "start",
            Command::Pause => "pause",
            Command::Resume => "resume",
            Command::Stop => "stop",
            Command::Halt => "halt",
            Command::Reset => "reset",
        }
    }
}

impl State {
    /// A run is on (its nodes are busy with it).
    pub fn active(self) -> bool {
        matches!(
            self,
            State::Starting | State::Running | State::Paused | State::Stopping
        )
    }
}

/// The state a command leads to from `from`, or `None` when it is illegal there.
pub fn next(from: State, cmd: Command) -> Option<State> {
    use Command as C;
    use State as S;
    Some(match (from, cmd) {
        (S::Ready | S::Failed, C::Configure) => from,
        (S::Ready, C::Start) => S::Starting,
        (S::Starting | S::Running, C::Pause) => S::Paused,
        (S::Paused, C::Resume) => S::Running,
        (S::Starting | S::Running | S::Paused, C::Stop) => S::Stopping,
        (S::Ready | S::Failed, C::Halt) => S::Halted,
        (S::Failed, C::Reset) => S::Ready,
        // aborts the run: the controller returns to ready when its nodes are done
        (S::Starting | S::Running | S::Paused | S::Stopping, C::Reset) => S::Stopping,
        _ => return None,
    })
}

/// The commands legal in `state`.
pub fn legal(state: State) -> Vec<Command> {
    COMMANDS
        .into_iter()
        .filter(|c| next(state, *c).is_some())
        .collect()
}

/// Why a command was refused, for the operator: the state and what is legal in it.
pub fn refusal(state: State, cmd: Command) -> String {
    let legal: Vec<&str> = legal(state).iter().map(|c| c.name()).collect();
    format!(
        "`{}` is not allowed in state {}; allowed: {}",
        cmd.name(),
        state.name(),
        if legal.is_empty() {
            "nothing".to_string()
        } else {
            legal.join(", ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole table: every (state, command) pair, legal or not.
    #[test]
    fn every_transition_legal_and_illegal() {
        use Command as C;
        use State as S;
        let table: &[(State, &[(Command, State)])] = &[
            (
                S::Ready,
                &[
                    (C::Configure, S::Ready),
                    (C::Start, S::Starting),
                    (C::Halt, S::Halted),
                ],
            ),
            (
                S::Starting,
                &[
                    (C::Pause, S::Paused),
                    (C::Stop, S::Stopping),
                    (C::Reset, S::Stopping),
                ],
            ),
            (
                S::Running,
                &[
                    (C::Pause, S::Paused),
                    (C::Stop, S::Stopping),
                    (C::Reset, S::Stopping),
                ],
            ),
            (
                S::Paused,
                &[
                    (C::Resume, S::Running),
                    (C::Stop, S::Stopping),
                    (C::Reset, S::Stopping),
                ],
            ),
            (S::Stopping, &[(C::Reset, S::Stopping)]),
            (
                S::Failed,
                &[
                    (C::Configure, S::Failed),
                    (C::Halt, S::Halted),
                    (C::Reset, S::Ready),
                ],
            ),
            (S::Halted, &[]),
        ];
        let mut checked = 0;
        for &(state, allowed) in table {
            for cmd in COMMANDS {
                let want = allowed.iter().find(|(c, _)| *c == cmd).map(|(_, s)| *s);
                assert_eq!(next(state, cmd), want, "{state:?} + {cmd:?}");
                checked += 1;
            }
        }
        assert_eq!(checked, State::ALL.len() * COMMANDS.len());
        assert_eq!(table.len(), State::ALL.len(), "every state in the table");
    }

    #[test]
    fn a_refusal_names_the_state_and_the_legal_commands() {
        let r = refusal(State::Running, Command::Start);
        assert_eq!(
            r,
            "`start` is not allowed in state running; allowed: pause, stop, reset"
        );
        assert!(refusal(State::Halted, Command::Start).ends_with("allowed: nothing"));
    }

    #[test]
    fn names_round_trip() {
        for c in COMMANDS {
            assert_eq!(Command::parse(c.name()), Some(c));
        }
        assert_eq!(Command::parse("launch"), None);
        for &s in State::ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), s.name());
            assert_eq!(serde_json::from_value::<State>(s.name().into()).unwrap(), s);
        }
    }
}

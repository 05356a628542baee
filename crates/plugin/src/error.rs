//! What a plug-in call can answer besides success: one typed error per cause, so that a
//! program (and the C ABI's error codes) can tell back-pressure from bad input from the end
//! of the run.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Error {
    /// The RU's pool has no room now (back-pressure: built events have not been released
    /// yet). Asked for with [`crate::WhenFull::ReturnFull`]; try again later.
    #[error("the RU's pool is full: no buffer now (back-pressure), try again")]
    Full,
    /// A buffer or fragment size outside what this RU accepts; nothing was submitted.
    #[error("fragment of {size} bytes: {why}")]
    Size { size: usize, why: String },
    /// The fragment failed the RU's checks (its trigger number does not move forward). Under
    /// `on_error = "stop"` the run stops (`run_stopped`); under `"drop"` the event is built
    /// with this source flagged MISSING and the producer goes on.
    #[error("fragment refused: {why}{}", if *run_stopped { " (the run stops: source.on_error = \"stop\")" } else { " (its event is built without it: source.on_error = \"drop\")" })]
    Refused { why: String, run_stopped: bool },
    /// A buffer that this producer did not hand out, or that was already submitted or
    /// released (from C; in Rust, ownership makes it impossible).
    #[error("not an outstanding buffer of this producer (submitted or released already?)")]
    UnknownBuffer,
    /// A call that does not fit the state of the producer or consumer (e.g. after `finish`).
    #[error("wrong state: {0}")]
    State(String),
    /// The node's run is over (ended, stopped or aborted): why.
    #[error("the run is over: {0}")]
    RunOver(String),
    /// The node could not be set up (configuration, addresses, pools).
    #[error("{0}")]
    Setup(String),
    /// Nothing within the time given (pub/sub: a publisher held back by a slow subscriber
    /// under policy `block`, subscribers that did not come): what did not happen.
    #[error("timed out: {0}")]
    Timeout(String),
    /// A socket failed (pub/sub: the transport's poll, a request that cannot be sent).
    #[error("{0}")]
    Io(String),
}

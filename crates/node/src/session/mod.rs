//! The run's authority as machines with no IO (docs/standby.md): whose word is the run's.
//!
//! - [`term`]: the [`Epoch`] an EVM speaks at, a BU's [`Incarnation`], and a node's door for
//!   EVMs ([`Authority`]: the Term that opens every control connection, stale epochs refused);
//! - [`follower`]: the standby EVM, from calling the active one to taking the run over;
//! - [`active`]: the active EVM's follower slot and its fence.
//!
//! Each is driven the same way (after quinn-proto's connection): `handle(now, input)` for
//! what happened, `handle_timeout(now)` when `poll_timeout()` is due, and `poll_transmit()`
//! / `poll_event()` for what the driver is to send and do. Time is passed in, so the tests
//! run them in virtual time (`tests`) and the model checker (`model`) through every
//! interleaving of a small system.

pub mod active;
pub mod follower;
pub mod term;

#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;

pub use active::Active;
pub use follower::Follower;
pub use term::{Authority, Epoch, Incarnation, Refusal};

/// A machine's time: how long since the driver's origin (virtual in tests).
pub type Time = std::time::Duration;

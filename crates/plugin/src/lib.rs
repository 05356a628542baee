//! evb's plug-in API: a program's own code feeds an RU or takes a BU's built events, the
//! node running in the program's process (its driver on a thread started here) and the rest
//! of the run as ordinary `evb node` processes. See docs/plugin.md. [`pubsub`]: publish and
//! subscribe by tag with a blocking socket (docs/messaging.md).
//!
//! ```no_run
//! use evb_plugin::{Producer, WhenFull};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = evb_config::Config::from_file("run.toml".as_ref())?; // source.kind = "api"
//! let mut p = Producer::start(&cfg, "ru0")?;
//! for trigger in 1..=1000u32 {
//!     let mut buf = p.buffer(4096, WhenFull::Block)?; // room in the RU's pool
//!     buf.payload_mut().fill(trigger as u8);          // the bytes that go on the wire
//!     p.submit(buf, trigger)?;                        // event k = the k-th submitted
//! }
//! let outcome = p.finish()?; // the run ends after the events submitted
//! assert!(outcome.ok);
//! # Ok(()) }
//! ```

mod consumer;
mod error;
mod node_thread;
mod producer;
pub mod pubsub;
mod trigger;

pub use consumer::{Consumer, ConsumerOptions, Event, Fragment, Next};
pub use error::Error;
pub use evb_config::Config;
pub use evb_node::NodeOutcome;
pub use evb_wire::window::DecisionWindow;
pub use producer::{Buffer, Producer, WhenFull};
pub use trigger::Trigger;

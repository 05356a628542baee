//! A built event, as the BU hands it to a sink.

use evb_buffers::Chain;
use evb_wire::FragmentHeader;

/// One event with all its fragments; payloads still sit in the receive pool.
#[derive(Debug)]
pub struct BuiltEvent {
    pub event_id: u64,
    pub trigger_number: u32,
    pub fragments: Vec<(FragmentHeader, Chain)>,
    /// Payload bytes over all fragments.
    pub bytes: u64,
    /// Fragments' trigger numbers disagree.
    pub trigger_mismatch: bool,
    /// A fragment failed its CRC or content check.
    pub corrupt: bool,
    /// Sources whose fragment is a MISSING placeholder (a partial event).
    pub missing_sources: Vec<u16>,
}

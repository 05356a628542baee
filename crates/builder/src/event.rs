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
    /// A source gave less than its whole share though its fragment came: a super-fragment
    /// left a stream out, or a decision window came LATE or MISSING (a partial event too).
    pub partial: bool,
}

impl BuiltEvent {
    /// A complete event of one fragment, `payload` from `source_id`, its trigger number the
    /// event id's low 32 bits (for sinks' tests and tools).
    pub fn of_one_fragment(event_id: u64, source_id: u16, payload: Chain) -> BuiltEvent {
        let header = FragmentHeader {
            event_id,
            trigger_number: event_id as u32,
            source_id,
            flags: 0,
            payload_size: payload.len() as u32,
            payload_crc: payload.crc32c(),
        };
        BuiltEvent {
            event_id,
            trigger_number: event_id as u32,
            bytes: payload.len() as u64,
            fragments: vec![(header, payload)],
            trigger_mismatch: false,
            corrupt: false,
            missing_sources: vec![],
            partial: false,
        }
    }
}

//! What a socket's readiness event asks of its connection, one rule for tcp and shm (their
//! poll loops had drifted: shm ignored an error event, tcp read and flushed on it).

use mio::{Events, Token};

/// Each event's token, whether to read (data, the peer's close, or an error: the read
/// finds which and closes the connection) and whether to write (room, or an error: the
/// write finds it too).
pub(crate) fn ready(events: &Events) -> Vec<(Token, bool, bool)> {
    events
        .iter()
        .map(|e| {
            (
                e.token(),
                e.is_readable() || e.is_read_closed() || e.is_error(),
                e.is_writable() || e.is_error(),
            )
        })
        .collect()
}

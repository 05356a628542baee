//! Helpers shared by the transport test binaries.
#![allow(dead_code)] // each test binary uses its own subset

use std::time::{Duration, Instant};

use evb_transport::{Event, Transport};

/// Polls until `until` holds (10 s at most).
pub fn pump(
    ts: &mut [&mut dyn Transport],
    evs: &mut [Vec<Event>],
    what: &str,
    until: impl Fn(&[Vec<Event>]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !until(evs) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; events: {:?}",
            evs.iter()
                .map(|e| e
                    .iter()
                    .map(|x| match x {
                        Event::Frame { frame, .. } => format!("frame {}", frame.payload.len()),
                        other => format!("{other:?}"),
                    })
                    .collect::<Vec<_>>())
                .collect::<Vec<_>>()
        );
        for (t, e) in ts.iter_mut().zip(evs.iter_mut()) {
            t.poll(e, Some(Duration::from_millis(1))).unwrap();
        }
    }
}

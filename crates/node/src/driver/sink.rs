//! The BU's sink queue: events offered to the sink for a share of each pass; a busy sink
//! keeps them, and their credits (back-pressure).

use super::*;

/// Events offered to the sink between two looks at the clock.
const SINK_CLOCK_EVERY: u32 = 16;

impl Driver {
    /// Offers queued events to the sink. A busy sink keeps them (and so the BU's credits)
    /// until a retry succeeds: back-pressure instead of loss.
    pub(super) fn drain_sink(&mut self, now: Instant) {
        let Logic::Bu(b, sink) = &mut self.logic else {
            return;
        };
        if self.sink_retry_at.is_some_and(|t| now < t) {
            return;
        }
        self.sink_retry_at = None;
        let mut offered = 0u32;
        while let Some(ev) = self.sink_queue.front() {
            // A slow sink gets a share of each pass, not all of it: the loop must go on
            // reading its sockets and sending heartbeats, or a slow node is taken for dead.
            // The clock is read every few events (a read per event was a visible share of a
            // small-event run, where the discard sink takes millions a second).
            if offered.is_multiple_of(SINK_CLOCK_EVERY) && Instant::now() >= self.sink_pass_until {
                break;
            }
            offered = offered.wrapping_add(1);
            let news = sink.busy_is_news();
            match sink.deliver(ev) {
                Ok(()) => {
                    if let Some(why) = self.sink_blocked.take().filter(|_| news) {
                        info!(node = %self.me.id, "sink accepts events again (was: {why})");
                    }
                    let ev = self.sink_queue.pop_front().expect("front exists");
                    b.delivered(ev.event_id, ev.bytes);
                    b.recycle(ev.fragments);
                }
                Err(SinkError::Busy(why)) => {
                    if self.sink_blocked.is_none() && news {
                        warn!(
                            node = %self.me.id,
                            "sink blocked, holding {} events and their credits: {why}",
                            self.sink_queue.len()
                        );
                    }
                    self.sink_stalls += 1;
                    self.sink_blocked = Some(why);
                    self.sink_retry_at = Some(now + sink.retry_after());
                    break;
                }
                Err(SinkError::Fatal(why)) => {
                    error!(node = %self.me.id, "sink failed: {why}");
                    b.fail(format!("sink failed: {why}"));
                    self.sink_queue.clear();
                    break;
                }
            }
        }
    }
}

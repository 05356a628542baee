//! Sinks: where built events go. The BU has checked them before they get here.

use std::collections::HashSet;

use serde_json::Value;

use crate::event::BuiltEvent;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkError {
    /// Cannot take the event now (a full disk, a slow consumer): offer it again later. The
    /// BU holds it, and its credits, meanwhile: that is the back-pressure.
    Busy(String),
    /// Cannot go on at all.
    Fatal(String),
}

/// A part of a sink's output made durable under a temporary name (a file written, synced
/// and not yet renamed), holding these accepted events as (first id, count) ranges, waiting
/// for the EVM's word (docs/protocol.md §6 step 7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedPart {
    pub part: u32,
    /// At most `evb_wire::MAX_COMMIT_RANGES` ranges.
    pub ranges: Vec<(u64, u32)>,
}

pub trait Sink: Send {
    /// Takes one built event; the BU releases it when this returns Ok.
    fn deliver(&mut self, event: &BuiltEvent) -> Result<(), SinkError>;
    /// Takes built events from the front of `run` (in delivery order) and returns how many
    /// it took: all of them, or fewer with the error that stopped it (the rest are offered
    /// again, as after [`Sink::deliver`]'s error). It takes at least one unless it returns
    /// an error. The BU releases those it took.
    ///
    /// The default hands them to [`Sink::deliver`] one by one, so a sink that has only
    /// `deliver` sees exactly the events, in the order, it would see one at a time. A sink
    /// with a cost per call (a write to disk) takes the run at once.
    fn deliver_run(&mut self, run: &[BuiltEvent]) -> (usize, Result<(), SinkError>) {
        for (taken, event) in run.iter().enumerate() {
            if let Err(e) = self.deliver(event) {
                return (taken, Err(e));
            }
        }
        (run.len(), Ok(()))
    }
    /// Whether the sink takes built events as spans of ids ([`Sink::deliver_span`]), without
    /// looking at their fragments (it drops or counts them). The BU then builds the events
    /// that come regularly without a record or an object each (`Bu::set_join`); events
    /// that do not still come through [`Sink::deliver`].
    fn takes_spans(&self) -> bool {
        false
    }
    /// Takes events `first .. first + count`, built and checked, complete and not partial,
    /// `bytes` of payload in all; the BU releases them when this returns Ok. Only called
    /// when [`Sink::takes_spans`] says so.
    fn deliver_span(&mut self, first: u64, count: u32, bytes: u64) -> Result<(), SinkError> {
        let _ = (first, count, bytes);
        Err(SinkError::Fatal(format!(
            "the {} sink takes events, not spans",
            self.name()
        )))
    }
    /// The EVM accepted the release of events `first .. first + count` (delivered here
    /// earlier, in this order): they are this BU's to output. A sink that commits output
    /// (files) makes only such events visible; delivered events never accepted by the end
    /// (the EVM dropped this BU, or the run aborted) must not become output.
    ///
    /// No default: a sink that wraps another must pass this on, or the inner one never
    /// makes anything output.
    fn accepted(&mut self, first: u64, count: u32) -> Result<(), SinkError>;
    /// The run is over: complete whatever is open, with the accepted events only. May be
    /// called again after an error (a full disk): it carries on where it stopped.
    fn finish(&mut self) -> Result<(), SinkError>;
    fn name(&self) -> &'static str;
    /// How long to wait before offering an event again after `Busy` (a consumer that frees
    /// room within microseconds wants a shorter wait than a full disk).
    fn retry_after(&self) -> std::time::Duration {
        std::time::Duration::from_millis(100)
    }
    /// Whether `Busy` is worth a warning (a full disk) or routine (a consumer program that is
    /// slower than the builder: that is its back-pressure working).
    fn busy_is_news(&self) -> bool {
        true
    }
    /// Accepted events not yet output for good (a `serve` sink: not acknowledged by a
    /// consumer). When the EVM stops the run the BU waits up to [`Sink::drain_timeout`] for
    /// this to reach 0 before it reports.
    fn outstanding(&self) -> u64 {
        0
    }
    fn drain_timeout(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
    /// The run is over for the output (called once, when the BU reports): stop taking
    /// acknowledgements. Returns the accepted events never output: lost, and judged so.
    fn close_output(&mut self) -> u64 {
        0
    }
    /// Whether the sink commits its output: its accepted events stay in flight (the RUs
    /// keep their fragments, and a lost BU's are built again elsewhere) until a part
    /// holding them is committed by the EVM ([`Sink::prepare`], [`Sink::publish`]). A sink
    /// that does not commit outputs an event once it is accepted.
    fn commits(&self) -> bool {
        false
    }
    /// Parts of output made durable since the last call, each waiting for the EVM's word.
    /// The sink closes its open part when it is due (at `now`, by its commit interval) or
    /// full. Called every loop pass: cheap when nothing is due.
    fn prepare(&mut self, _now: std::time::Instant) -> Result<Vec<PreparedPart>, SinkError> {
        Ok(Vec::new())
    }
    /// The EVM committed `part`: make it output under its final name. After an error it is
    /// tried again (at the latest by [`Sink::finish`]). A sink that
    /// [`Sink::publishes_later`] only starts it here.
    fn publish(&mut self, _part: u32) -> Result<(), SinkError> {
        Ok(())
    }
    /// Whether [`Sink::publish`] only starts publishing (on a thread of the sink's own, so
    /// that the BU does not wait for the disk): its `Ok` then means started, and
    /// [`Sink::published`] says when each part is out. The BU tells the EVM a part is
    /// published only once it is.
    fn publishes_later(&self) -> bool {
        false
    }
    /// Parts published since the last call, by a sink that [`Sink::publishes_later`].
    /// Called every loop pass: cheap when nothing is under way.
    fn published(&mut self) -> Vec<u32> {
        Vec::new()
    }
    /// The sink's own counters, for the node's report.
    fn report(&self) -> Value {
        Value::Null
    }
}

/// Drops every event (after the BU's verification).
#[derive(Default)]
pub struct DiscardSink;

impl Sink for DiscardSink {
    fn deliver(&mut self, _event: &BuiltEvent) -> Result<(), SinkError> {
        Ok(())
    }
    fn takes_spans(&self) -> bool {
        true
    }
    fn deliver_span(&mut self, _first: u64, _count: u32, _bytes: u64) -> Result<(), SinkError> {
        Ok(())
    }
    fn accepted(&mut self, _first: u64, _count: u32) -> Result<(), SinkError> {
        Ok(())
    }
    fn finish(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
    fn name(&self) -> &'static str {
        "discard"
    }
}

/// The counting sink's report.
#[derive(Debug, serde::Serialize)]
struct CountReport {
    events: u64,
    bytes: u64,
    /// Distinct event ids received.
    distinct: usize,
    duplicates: u64,
}

/// Remembers every event id it received, to prove exactly-once delivery.
#[derive(Default)]
pub struct CountingSink {
    pub events: u64,
    pub bytes: u64,
    pub ids: HashSet<u64>,
    pub duplicates: u64,
}

impl Sink for CountingSink {
    fn deliver(&mut self, event: &BuiltEvent) -> Result<(), SinkError> {
        self.deliver_span(event.event_id, 1, event.bytes)
    }
    fn takes_spans(&self) -> bool {
        true
    }
    fn deliver_span(&mut self, first: u64, count: u32, bytes: u64) -> Result<(), SinkError> {
        self.events += count as u64;
        self.bytes += bytes;
        for id in first..first + count as u64 {
            if !self.ids.insert(id) {
                self.duplicates += 1;
            }
        }
        Ok(())
    }
    fn accepted(&mut self, _first: u64, _count: u32) -> Result<(), SinkError> {
        Ok(())
    }
    fn finish(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
    fn name(&self) -> &'static str {
        "count"
    }
    fn report(&self) -> Value {
        let r = CountReport {
            events: self.events,
            bytes: self.bytes,
            distinct: self.ids.len(),
            duplicates: self.duplicates,
        };
        serde_json::to_value(r).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evb_buffers::Chain;

    /// Has only `deliver`: takes events until its room is used up, then is busy.
    struct Room {
        left: usize,
        seen: Vec<u64>,
    }

    impl Sink for Room {
        fn deliver(&mut self, event: &BuiltEvent) -> Result<(), SinkError> {
            if self.left == 0 {
                return Err(SinkError::Busy("full".into()));
            }
            self.left -= 1;
            self.seen.push(event.event_id);
            Ok(())
        }
        fn accepted(&mut self, _first: u64, _count: u32) -> Result<(), SinkError> {
            Ok(())
        }
        fn finish(&mut self) -> Result<(), SinkError> {
            Ok(())
        }
        fn name(&self) -> &'static str {
            "room"
        }
    }

    fn events(ids: impl IntoIterator<Item = u64>) -> Vec<BuiltEvent> {
        ids.into_iter()
            .map(|id| BuiltEvent::of_one_fragment(id, 1, Chain::new()))
            .collect()
    }

    /// A per-event sink behind the run adapter sees exactly the events, in the order, that
    /// it sees one at a time, and the count taken is what it took before it was busy.
    #[test]
    fn a_per_event_sink_sees_a_run_as_its_events_one_by_one() {
        // ids out of order and with gaps: a run is delivery order, not consecutive ids
        let run = events([5, 6, 9, 7, 40, 41]);
        for room in 0..=run.len() + 1 {
            let mut one_by_one = Room {
                left: room,
                seen: Vec::new(),
            };
            let mut singly = 0;
            for ev in &run {
                if one_by_one.deliver(ev).is_err() {
                    break;
                }
                singly += 1;
            }
            let mut by_run = Room {
                left: room,
                seen: Vec::new(),
            };
            let (taken, result) = by_run.deliver_run(&run);
            assert_eq!(taken, singly, "room {room}");
            assert_eq!(by_run.seen, one_by_one.seen, "room {room}");
            assert_eq!(result.is_err(), room < run.len(), "room {room}");
            // the rest, offered again once there is room, completes the same sequence
            by_run.left = usize::MAX;
            let (rest, again) = by_run.deliver_run(&run[taken..]);
            assert_eq!((rest, again), (run.len() - taken, Ok(())));
            let all: Vec<u64> = run.iter().map(|e| e.event_id).collect();
            assert_eq!(by_run.seen, all, "room {room}");
        }
        assert_eq!(
            Room {
                left: 0,
                seen: Vec::new()
            }
            .deliver_run(&[]),
            (0, Ok(()))
        );
    }
}

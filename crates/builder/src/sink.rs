//! Sinks: where built events go. The BU has checked them before they get here.

use std::collections::HashSet;

use serde_json::{json, Value};

use crate::event::BuiltEvent;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkError {
    /// Cannot take the event now (a full disk, a slow consumer): offer it again later. The
    /// BU holds it, and its credits, meanwhile: that is the back-pressure.
    Busy(String),
    /// Cannot go on at all.
    Fatal(String),
}

pub trait Sink: Send {
    /// Takes one built event; the BU releases it when this returns Ok.
    fn deliver(&mut self, event: &BuiltEvent) -> Result<(), SinkError>;
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
        self.events += 1;
        self.bytes += event.bytes;
        if !self.ids.insert(event.event_id) {
            self.duplicates += 1;
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
        json!({ "events": self.events, "bytes": self.bytes, "distinct": self.ids.len(), "duplicates": self.duplicates })
    }
}

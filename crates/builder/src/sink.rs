//! Sinks: where built events go. The BU has checked them before they get here.

use std::collections::HashSet;

use crate::event::BuiltEvent;

pub trait Sink: Send {
    /// Takes one built event; the BU releases it when this returns.
    fn deliver(&mut self, event: &BuiltEvent);
    fn name(&self) -> &'static str;
}

/// Drops every event (after the BU's verification).
#[derive(Default)]
pub struct DiscardSink;

impl Sink for DiscardSink {
    fn deliver(&mut self, _event: &BuiltEvent) {}
    fn name(&self) -> &'static str {
        "discard"
    }
}

/// Remembers every event id it received, to prove exactly-once delivery in tests.
#[derive(Default)]
pub struct CountingSink {
    pub events: u64,
    pub bytes: u64,
    pub ids: HashSet<u64>,
    pub duplicates: u64,
}

impl Sink for CountingSink {
    fn deliver(&mut self, event: &BuiltEvent) {
        self.events += 1;
        self.bytes += event.bytes;
        if !self.ids.insert(event.event_id) {
            self.duplicates += 1;
        }
    }
    fn name(&self) -> &'static str {
        "count"
    }
}

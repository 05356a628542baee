//! The consumer: a program taking one BU's built events (`sink = "api"`) in its own process.
//! Each [`Event`] holds its fragments where the BU received them (its receive pool); they
//! go back to the pool when the event is dropped.
//!
//! Back-pressure: the BU hands the consumer at most `max_held` events at a time (received
//! and not yet dropped). Beyond that its sink is busy: the BU keeps the next events and
//! their credits, so the EVM sends it no more, and the trigger slows to what the consumer
//! takes. Nothing is dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};
use evb_buffers::Chain;
use evb_builder::{BuiltEvent, Sink, SinkError};
use evb_config::{Config, Role, SinkKind};
use evb_node::plug::Plugs;
use evb_node::NodeOutcome;
use evb_wire::FragmentHeader;
use serde_json::{json, Value};

use crate::node_thread::NodeThread;
use crate::Error;

/// How a consumer is run.
#[derive(Debug, Clone, Copy)]
pub struct ConsumerOptions {
    /// Most events the consumer holds at once (its share of the BU's credits).
    pub max_held: usize,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        ConsumerOptions { max_held: 8 }
    }
}

/// One built event, checked by the BU (headers, CRC32C; what `builder.verify` asks).
pub struct Event {
    event_id: u64,
    trigger_number: u32,
    fragments: Vec<(FragmentHeader, Chain)>,
    partial: bool,
    corrupt: bool,
    trigger_mismatch: bool,
    _held: Held,
}

/// One fragment of an event: its header and its payload, in place in the BU's pool.
pub struct Fragment<'a> {
    header: &'a FragmentHeader,
    payload: &'a Chain,
}

impl Fragment<'_> {
    pub fn source_id(&self) -> u16 {
        self.header.source_id
    }
    pub fn trigger_number(&self) -> u32 {
        self.header.trigger_number
    }
    /// Fragment header flags (`evb_wire::FLAG_MISSING`, `FLAG_SUPER`, ...).
    pub fn flags(&self) -> u16 {
        self.header.flags
    }
    /// CRC32C of the payload as its RU computed it (the BU checked it).
    pub fn payload_crc(&self) -> u32 {
        self.header.payload_crc
    }
    pub fn len(&self) -> usize {
        self.payload.len()
    }
    pub fn is_empty(&self) -> bool {
        self.payload.is_empty()
    }
    /// The payload in place, as one or more byte slices (several when it spans blocks).
    pub fn chunks(&self) -> impl Iterator<Item = &[u8]> {
        self.payload.chunks()
    }
    /// The payload in place when it is one slice.
    pub fn contiguous(&self) -> Option<&[u8]> {
        match self.payload.slices() {
            [] => Some(&[]),
            [one] => Some(one),
            _ => None,
        }
    }
    /// The payload copied out.
    pub fn to_vec(&self) -> Vec<u8> {
        self.payload.to_vec()
    }
}

impl Event {
    pub fn event_id(&self) -> u64 {
        self.event_id
    }
    pub fn trigger_number(&self) -> u32 {
        self.trigger_number
    }
    /// One fragment per RU, in RU order.
    pub fn fragments(&self) -> impl ExactSizeIterator<Item = Fragment<'_>> {
        self.fragments
            .iter()
            .map(|(header, payload)| Fragment { header, payload })
    }
    pub fn fragment(&self, i: usize) -> Option<Fragment<'_>> {
        self.fragments
            .get(i)
            .map(|(header, payload)| Fragment { header, payload })
    }
    pub fn fragment_count(&self) -> usize {
        self.fragments.len()
    }
    /// Payload bytes over all fragments.
    pub fn bytes(&self) -> usize {
        self.fragments.iter().map(|(_, c)| c.len()).sum()
    }
    /// A source's fragment is a MISSING placeholder, or a source gave less than its share (a
    /// super-fragment left a stream out, a decision window came LATE or MISSING).
    pub fn is_partial(&self) -> bool {
        self.partial
    }
    /// A fragment failed its CRC or content check.
    pub fn is_corrupt(&self) -> bool {
        self.corrupt
    }
    /// The fragments' trigger numbers disagree.
    pub fn trigger_mismatch(&self) -> bool {
        self.trigger_mismatch
    }
}

/// One of the `max_held` places; given back when its event is dropped.
struct Held(Arc<AtomicUsize>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The BU's sink: hands events to the consumer while it holds fewer than `max_held`, each
/// only once the EVM accepted the BU's release of it (`Sink::accepted`): a BU the EVM
/// dropped never hands out an event that is built elsewhere as well.
struct ApiSink {
    tx: Sender<Event>,
    held: Arc<AtomicUsize>,
    max_held: usize,
    /// Delivered, awaiting the EVM's acceptance (they count against `max_held`).
    pending: std::collections::VecDeque<Event>,
    delivered: u64,
    handed: u64,
    busy: u64,
    /// Delivered but never accepted (the EVM refused them, or dropped this BU): not output.
    left_out: u64,
}

impl Sink for ApiSink {
    fn deliver(&mut self, ev: &BuiltEvent) -> Result<(), SinkError> {
        let held = self.held.load(Ordering::Acquire);
        if held >= self.max_held {
            self.busy += 1;
            return Err(SinkError::Busy(format!(
                "the consumer holds {held} events (its max_held)"
            )));
        }
        self.held.fetch_add(1, Ordering::AcqRel);
        let event = Event {
            event_id: ev.event_id,
            trigger_number: ev.trigger_number,
            // references to the received blocks, not copies of the bytes
            fragments: ev.fragments.clone(),
            partial: !ev.missing_sources.is_empty() || ev.partial,
            corrupt: ev.corrupt,
            trigger_mismatch: ev.trigger_mismatch,
            _held: Held(self.held.clone()),
        };
        self.pending.push_back(event);
        self.delivered += 1;
        Ok(())
    }
    fn accepted(&mut self, first: u64, count: u32) -> Result<(), SinkError> {
        'ids: for id in first..first.saturating_add(count as u64) {
            // acceptances come in delivery order: the oldest pending event is next
            while let Some(e) = self.pending.pop_front() {
                if e.event_id == id {
                    self.tx
                        .send(e)
                        .map_err(|_| SinkError::Fatal("the consumer went away".into()))?;
                    self.handed += 1;
                    continue 'ids;
                }
                self.left_out += 1;
            }
            break;
        }
        Ok(())
    }
    fn finish(&mut self) -> Result<(), SinkError> {
        self.left_out += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }
    fn name(&self) -> &'static str {
        "api"
    }
    fn retry_after(&self) -> Duration {
        // a consumer frees a place within microseconds of finishing an event
        Duration::from_micros(50)
    }
    fn busy_is_news(&self) -> bool {
        false
    }
    fn report(&self) -> Value {
        json!({
            "delivered": self.delivered,
            "handed_out": self.handed,
            "awaiting_acceptance": self.pending.len(),
            "left_out_unaccepted": self.left_out,
            "consumer_busy": self.busy,
            "max_held": self.max_held,
        })
    }
}

/// What [`Consumer::next_timeout`] found.
pub enum Next {
    Event(Event),
    /// Nothing within the time given; the run goes on.
    Timeout,
    /// The run is over: no more events.
    End,
}

/// A consumer program's handle on its BU. Iterate it (or call [`Consumer::next_timeout`])
/// for events; the iteration ends with the run.
pub struct Consumer {
    node: NodeThread,
    events: Receiver<Event>,
    taken: u64,
}

impl Consumer {
    /// Starts BU `bu_id` of `cfg` in this process (its driver on a thread), its events
    /// handed to the returned consumer. Its sink must be `"api"` (`sink.kind`, or `sink` of
    /// its `[[bu]]` entry); the EVM and RUs run elsewhere from the same configuration.
    pub fn start(cfg: &Config, bu_id: &str, opts: ConsumerOptions) -> Result<Consumer, Error> {
        cfg.validate().map_err(|e| Error::Setup(e.to_string()))?;
        let me = cfg
            .nodes()
            .into_iter()
            .find(|n| n.id == bu_id && n.role == Role::Bu)
            .ok_or_else(|| Error::Setup(format!("no BU {bu_id:?} in the configuration")))?;
        if me.sink != SinkKind::Api {
            return Err(Error::Setup(format!(
                "{bu_id}: its sink must be \"api\" for a consumer to take its events"
            )));
        }
        if opts.max_held == 0 {
            return Err(Error::Setup("max_held must be at least 1".into()));
        }
        let (tx, events) = unbounded();
        let sink = ApiSink {
            tx,
            held: Arc::new(AtomicUsize::new(0)),
            max_held: opts.max_held,
            pending: std::collections::VecDeque::new(),
            delivered: 0,
            handed: 0,
            busy: 0,
            left_out: 0,
        };
        let plugs = Plugs {
            feed: None,
            sink: Some(Box::new(sink)),
        };
        let node = NodeThread::spawn(cfg, bu_id, plugs)?;
        Ok(Consumer {
            node,
            events,
            taken: 0,
        })
    }

    /// The next built event, waiting up to `timeout`.
    pub fn next_timeout(&mut self, timeout: Duration) -> Next {
        match self.events.recv_timeout(timeout) {
            Ok(e) => {
                self.taken += 1;
                Next::Event(e)
            }
            Err(RecvTimeoutError::Timeout) => Next::Timeout,
            // the BU's sink is dropped with its driver: the run is over
            Err(RecvTimeoutError::Disconnected) => Next::End,
        }
    }

    /// Waits until the BU is connected to the EVM, or fails: [`Consumer::start`] returns
    /// before the BU reaches the EVM, and an EVM that cannot be reached would otherwise show
    /// only as the events ending `run.connect_timeout_s` later. The error says why
    /// ([`Error::Setup`]: the peers not connected and their addresses). Returns within a
    /// status period (0.2 s) of the connection.
    pub fn wait_connected(&mut self) -> Result<(), Error> {
        self.node.wait_connected()
    }

    /// Whether the BU is connected to the EVM yet, without waiting: `Ok(false)` while it
    /// still tries, the error of [`Consumer::wait_connected`] once it cannot be.
    pub fn connected(&mut self) -> Result<bool, Error> {
        self.node.connected()
    }

    /// The BU's latest status, refreshed 5 times a second: the status line `evb node`
    /// prints (docs/control.md; `None` before the first).
    pub fn status(&self) -> Option<evb_builder::NodeStatus> {
        self.node.status()
    }

    /// Events taken so far.
    pub fn events_taken(&self) -> u64 {
        self.taken
    }

    /// Waits for the BU's run to end and returns its outcome (its report). Call it once the
    /// events have ended; events still coming are released unread (counted in the log).
    pub fn finish(mut self) -> Result<NodeOutcome, Error> {
        let mut unread = 0u64;
        loop {
            match self.events.recv_timeout(Duration::from_millis(50)) {
                Ok(_) => unread += 1,
                Err(RecvTimeoutError::Timeout) if !self.node.is_over() => {}
                Err(_) => break,
            }
        }
        if unread > 0 {
            tracing::warn!("consumer finished with {unread} events unread (released)");
        }
        self.node.join()
    }
}

impl Iterator for Consumer {
    type Item = Event;
    fn next(&mut self) -> Option<Event> {
        loop {
            match self.next_timeout(Duration::from_millis(100)) {
                Next::Event(e) => return Some(e),
                Next::Timeout => {}
                Next::End => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evb_buffers::Pool;

    fn event(pool: &Pool, id: u64) -> BuiltEvent {
        let mut w = pool.try_alloc().unwrap();
        let payload = Chain::from_slice(w.append(&id.to_le_bytes()).unwrap());
        BuiltEvent::of_one_fragment(id, 0, payload)
    }

    /// The consumer gets an event only once the EVM accepted its release: delivered and
    /// never accepted (a BU the EVM dropped) is never handed out.
    #[test]
    fn events_reach_the_consumer_only_when_the_evm_accepts_them() {
        let pool = Pool::new("t", 4096, 16);
        let (tx, rx) = unbounded();
        let mut s = ApiSink {
            tx,
            held: Arc::new(AtomicUsize::new(0)),
            max_held: 4,
            pending: std::collections::VecDeque::new(),
            delivered: 0,
            handed: 0,
            busy: 0,
            left_out: 0,
        };
        for id in [10, 11, 12, 13] {
            s.deliver(&event(&pool, id)).unwrap();
        }
        assert!(rx.try_recv().is_err(), "nothing before the echo");
        // the pending ones count against max_held: back-pressure
        assert!(matches!(
            s.deliver(&event(&pool, 14)),
            Err(SinkError::Busy(_))
        ));
        // 10 refused by the ledger (skipped), 11 and 12 accepted
        s.accepted(11, 2).unwrap();
        let got: Vec<u64> = rx.try_iter().map(|e| e.event_id).collect();
        assert_eq!(got, vec![11, 12]);
        // 13 never accepted: the run ends (the EVM dropped this BU)
        s.finish().unwrap();
        assert!(rx.try_recv().is_err());
        assert_eq!(s.report()["left_out_unaccepted"], 2);
        assert_eq!(s.report()["handed_out"], 2);
        assert_eq!(s.held.load(Ordering::Acquire), 0, "every place given back");
    }
}

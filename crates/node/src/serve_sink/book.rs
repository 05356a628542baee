//! The serve sink's bookkeeping, free of IO: the events waiting for a consumer, which
//! consumer holds which events, their acknowledgements and ack deadlines, and the counters
//! of the report. Time is passed in; each consumer carries a handle `H` (its socket in the
//! sink, anything in tests) that the bookkeeping only hands back, never uses.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use evb_buffers::Chain;
use evb_wire::FragmentHeader;

/// One event, ready to send: the frame header and event header, and the fragments in place.
pub(super) struct Item {
    pub(super) id: u64,
    pub(super) head: Vec<u8>,
    pub(super) frags: Vec<(FragmentHeader, Chain)>,
    pub(super) bytes: u64,
}

pub(super) struct Consumer<H> {
    pub(super) name: String,
    pub(super) peer: String,
    pub(super) max_held: usize,
    /// Sent, not acknowledged: the event and when it was sent.
    pub(super) in_flight: BTreeMap<u64, (Arc<Item>, Instant)>,
    pub(super) acked: u64,
    /// Its last acknowledgement (or when it last started holding events after holding
    /// none): a consumer holding events with no progress for the ack timeout is dropped.
    pub(super) progress: Instant,
    pub(super) handle: H,
}

pub(super) struct Book<H> {
    /// Accepted by the EVM, waiting for a consumer (re-served ones first).
    pub(super) ready: VecDeque<Arc<Item>>,
    pub(super) consumers: BTreeMap<u64, Consumer<H>>,
    next_consumer: u64,
    /// Connections being served (welcomed, their threads running).
    pub(super) connections: usize,
    pub(super) sent: u64,
    pub(super) acked: u64,
    pub(super) acked_bytes: u64,
    pub(super) re_served: u64,
    pub(super) consumers_dropped: u64,
    /// Connections closed without being served, for any reason (the next three included).
    pub(super) connections_refused: u64,
    /// Handshakes not finished within the deadline.
    pub(super) handshakes_timed_out: u64,
    /// Unfinished handshakes closed to make room for a newer connection.
    pub(super) handshakes_shed: u64,
    /// Consumers without the secret, or with a wrong one.
    pub(super) auth_failed: u64,
    /// The output is closed (end of run): writers send End; nothing more is served.
    pub(super) over: bool,
    pub(super) lost: u64,
    /// Ids acknowledged since the sink last committed (`Sink::prepare` takes them).
    pub(super) to_commit: Vec<u64>,
}

impl<H> Default for Book<H> {
    fn default() -> Self {
        Book {
            ready: VecDeque::new(),
            consumers: BTreeMap::new(),
            next_consumer: 0,
            connections: 0,
            sent: 0,
            acked: 0,
            acked_bytes: 0,
            re_served: 0,
            consumers_dropped: 0,
            connections_refused: 0,
            handshakes_timed_out: 0,
            handshakes_shed: 0,
            auth_failed: 0,
            over: false,
            lost: 0,
            to_commit: Vec::new(),
        }
    }
}

/// A consumer taken out by [`Book::drop_consumer`]: what to log, and its handle to close.
pub(super) struct Dropped<H> {
    pub(super) name: String,
    pub(super) peer: String,
    /// Its unacknowledged events, now back at the front of the queue.
    pub(super) re_served: usize,
    pub(super) handle: H,
}

/// What an Ack frame did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Acked {
    /// Every id was one the consumer held: released.
    Done,
    /// The consumer is no longer served (dropped meanwhile).
    Gone,
    /// It acknowledged an event it does not hold (those before it are released).
    NotHeld(u64),
}

/// What a consumer's writer does next.
pub(super) enum Next {
    /// The consumer is no longer served.
    Gone,
    /// The output is closed: send End with these totals.
    End { acked: u64, lost: u64 },
    /// Send this event (now held by the consumer).
    Send(Arc<Item>),
    /// Nothing to send now: the consumer holds its most, or nothing is ready.
    Wait,
}

impl<H> Book<H> {
    /// Events held: waiting for a consumer, or sent and not acknowledged.
    pub(super) fn held(&self) -> usize {
        self.ready.len()
            + self
                .consumers
                .values()
                .map(|c| c.in_flight.len())
                .sum::<usize>()
    }

    /// The EVM accepted events `first..first + count`: they move from `pending` (delivered,
    /// in delivery order) to the queue, or are counted lost once the output is closed.
    /// Answers how many pending events were passed over (never accepted).
    pub(super) fn accepted(
        &mut self,
        pending: &mut VecDeque<Arc<Item>>,
        first: u64,
        count: u32,
    ) -> u64 {
        let mut refused = 0;
        'ids: for id in first..first.saturating_add(count as u64) {
            // acceptances come in delivery order: the oldest pending event is next
            while let Some(it) = pending.pop_front() {
                if it.id == id {
                    if self.over {
                        self.lost += 1;
                    } else {
                        self.ready.push_back(it);
                    }
                    continue 'ids;
                }
                refused += 1;
            }
            break;
        }
        refused
    }

    /// Registers a consumer that finished its handshake (it holds nothing yet); answers its
    /// id.
    pub(super) fn register(
        &mut self,
        name: String,
        peer: String,
        max_held: usize,
        handle: H,
        now: Instant,
    ) -> u64 {
        let id = self.next_consumer;
        self.next_consumer += 1;
        self.connections += 1;
        self.consumers.insert(
            id,
            Consumer {
                name,
                peer,
                max_held,
                in_flight: BTreeMap::new(),
                acked: 0,
                progress: now,
                handle,
            },
        );
        id
    }

    /// Drops a consumer: its unacknowledged events go back to the front of the queue, in
    /// their order. None when it is gone already.
    pub(super) fn drop_consumer(&mut self, id: u64) -> Option<Dropped<H>> {
        let c = self.consumers.remove(&id)?;
        let n = c.in_flight.len();
        for (_, (item, _)) in c.in_flight.into_iter().rev() {
            self.ready.push_front(item);
        }
        self.re_served += n as u64;
        self.consumers_dropped += 1;
        Some(Dropped {
            name: c.name,
            peer: c.peer,
            re_served: n,
            handle: c.handle,
        })
    }

    /// Removes a consumer without re-serving anything (it was sent End); answers its handle.
    pub(super) fn remove(&mut self, id: u64) -> Option<H> {
        self.consumers.remove(&id).map(|c| c.handle)
    }

    /// Removes every consumer; answers their handles.
    pub(super) fn remove_all(&mut self) -> Vec<H> {
        std::mem::take(&mut self.consumers)
            .into_values()
            .map(|c| c.handle)
            .collect()
    }

    /// Consumer `id` acknowledged `ids` at `now`.
    pub(super) fn ack(
        &mut self,
        id: u64,
        ids: impl IntoIterator<Item = u64>,
        now: Instant,
    ) -> Acked {
        let Some(c) = self.consumers.get_mut(&id) else {
            return Acked::Gone;
        };
        c.progress = now;
        for e in ids {
            match c.in_flight.remove(&e) {
                Some((it, _)) => {
                    c.acked += 1;
                    self.acked += 1;
                    self.acked_bytes += it.bytes;
                    self.to_commit.push(e);
                }
                None => return Acked::NotHeld(e),
            }
        }
        Acked::Done
    }

    /// What consumer `id`'s writer does next; an event it is to send is counted sent and
    /// held by it from the time `now` gives (asked only then: the writer's clock is read
    /// once per event sent, not per wake-up).
    pub(super) fn next_for(&mut self, id: u64, now: impl FnOnce() -> Instant) -> Next {
        let (over, acked, lost) = (self.over, self.acked, self.lost);
        let Some(c) = self.consumers.get_mut(&id) else {
            return Next::Gone;
        };
        if over {
            return Next::End { acked, lost };
        }
        if c.in_flight.len() < c.max_held {
            if let Some(it) = self.ready.pop_front() {
                let now = now();
                if c.in_flight.is_empty() {
                    c.progress = now;
                }
                c.in_flight.insert(it.id, (it.clone(), now));
                self.sent += 1;
                return Next::Send(it);
            }
        }
        Next::Wait
    }

    /// Consumers holding events without progress for longer than `timeout` at `now`, and
    /// for how many seconds.
    pub(super) fn late(&self, now: Instant, timeout: Duration) -> Vec<(u64, f64)> {
        self.consumers
            .iter()
            .filter(|(_, c)| !c.in_flight.is_empty())
            .filter_map(|(id, c)| {
                let waited = now.duration_since(c.progress);
                (waited > timeout).then_some((*id, waited.as_secs_f64()))
            })
            .collect()
    }

    /// The end of the output: nothing more is served; what is queued or held unacknowledged
    /// is counted lost. Answers how many events that is.
    pub(super) fn close(&mut self) -> u64 {
        self.over = true;
        let mut lost = self.ready.len() as u64;
        self.ready.clear();
        for c in self.consumers.values_mut() {
            lost += c.in_flight.len() as u64;
            c.in_flight.clear();
        }
        self.lost += lost;
        lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: u64) -> Arc<Item> {
        Arc::new(Item {
            id,
            head: Vec::new(),
            frags: Vec::new(),
            bytes: 100 + id,
        })
    }

    /// A book with events `ids` accepted and waiting.
    fn book_of(ids: &[u64]) -> Book<&'static str> {
        let mut b = Book::default();
        let mut pending: VecDeque<_> = ids.iter().map(|&i| item(i)).collect();
        let refused = b.accepted(&mut pending, ids[0], ids.len() as u32);
        assert_eq!(refused, 0);
        b
    }

    fn ids(b: &Book<&str>) -> Vec<u64> {
        b.ready.iter().map(|i| i.id).collect()
    }

    fn sent(b: &mut Book<&str>, id: u64, now: Instant) -> Option<u64> {
        match b.next_for(id, || now) {
            Next::Send(it) => Some(it.id),
            _ => None,
        }
    }

    /// Acceptances come in delivery order: pending events passed over are refused (never
    /// served), an acceptance beyond what is pending ends the scan, and after the close
    /// accepted events are lost.
    #[test]
    fn acceptance_moves_pending_events_in_order() {
        let mut b: Book<()> = Book::default();
        let mut pending: VecDeque<_> = [1, 2, 3, 4, 5].into_iter().map(item).collect();
        assert_eq!(b.accepted(&mut pending, 2, 2), 1, "1 passed over");
        assert_eq!(b.ready.iter().map(|i| i.id).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(pending.len(), 2);
        assert_eq!(b.close(), 2);
        assert_eq!(b.accepted(&mut pending, 4, 1), 0);
        assert_eq!(b.lost, 3);
        assert!(b.ready.is_empty());
        assert_eq!(
            b.accepted(&mut pending, 9, 3),
            1,
            "5 passed over, then none left"
        );
        assert!(pending.is_empty());
    }

    /// A consumer gets at most `max_held` events, oldest first; acks free room and count
    /// bytes; an ack of an event it does not hold is named.
    #[test]
    fn a_consumer_holds_at_most_its_share_until_it_acknowledges() {
        let t0 = Instant::now();
        let mut b = book_of(&[10, 11, 12]);
        let c = b.register("c".into(), "p".into(), 2, "sock", t0);
        assert_eq!(b.connections, 1);
        assert_eq!(sent(&mut b, c, t0), Some(10));
        assert_eq!(sent(&mut b, c, t0), Some(11));
        assert!(matches!(b.next_for(c, || t0), Next::Wait), "holds 2 of 2");
        assert_eq!(b.held(), 3);
        assert_eq!(b.sent, 2);
        assert_eq!(b.ack(c, [11], t0), Acked::Done);
        assert_eq!((b.acked, b.acked_bytes), (1, 111));
        assert_eq!(sent(&mut b, c, t0), Some(12));
        assert_eq!(b.ack(c, [10, 7, 12], t0), Acked::NotHeld(7));
        assert_eq!(b.acked, 2, "10 released before the bad id");
        assert_eq!(b.consumers[&c].in_flight.len(), 1);
        assert_eq!(b.ack(99, [12], t0), Acked::Gone);
    }

    /// A dropped consumer's events go back to the front of the queue in their order, before
    /// those never sent; its handle is handed back once.
    #[test]
    fn a_dropped_consumers_events_are_served_first() {
        let t0 = Instant::now();
        let mut b = book_of(&[1, 2, 3, 4]);
        let a = b.register("a".into(), "pa".into(), 3, "sock-a", t0);
        for want in [1, 2, 3] {
            assert_eq!(sent(&mut b, a, t0), Some(want));
        }
        b.ack(a, [2], t0);
        let d = b.drop_consumer(a).unwrap();
        assert_eq!((d.name.as_str(), d.re_served, d.handle), ("a", 2, "sock-a"));
        assert!(b.drop_consumer(a).is_none());
        assert_eq!(ids(&b), [1, 3, 4]);
        assert_eq!((b.re_served, b.consumers_dropped), (2, 1));
        let n = b.register("n".into(), "pn".into(), 8, "sock-n", t0);
        assert_eq!(sent(&mut b, n, t0), Some(1));
        assert!(matches!(b.next_for(a, || t0), Next::Gone));
    }

    /// The ack deadline counts from the last acknowledgement, or from when a consumer that
    /// held nothing was sent an event; a consumer holding nothing is never late.
    #[test]
    fn ack_deadlines_run_from_the_last_progress() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let timeout = 10 * s;
        let mut b = book_of(&[1, 2, 3]);
        let c = b.register("c".into(), "p".into(), 8, "sock", t0);
        assert!(b.late(t0 + 60 * s, timeout).is_empty(), "holds nothing");
        assert_eq!(sent(&mut b, c, t0 + 20 * s), Some(1));
        assert_eq!(
            sent(&mut b, c, t0 + 25 * s),
            Some(2),
            "no progress: held already"
        );
        assert!(b.late(t0 + 30 * s, timeout).is_empty());
        assert_eq!(b.late(t0 + 31 * s, timeout), [(c, 11.0)]);
        b.ack(c, [1], t0 + 31 * s);
        assert!(b.late(t0 + 41 * s, timeout).is_empty());
        assert_eq!(b.late(t0 + 42 * s, timeout).len(), 1);
        b.ack(c, [2], t0 + 42 * s);
        assert!(
            b.late(t0 + 99 * s, timeout).is_empty(),
            "holds nothing again"
        );
    }

    /// Closing counts what is queued and held as lost; writers are then told to send End
    /// with the totals, and a removed consumer is gone.
    #[test]
    fn closing_counts_the_unacknowledged_lost() {
        let t0 = Instant::now();
        let mut b = book_of(&[1, 2, 3]);
        let c = b.register("c".into(), "p".into(), 1, "sock", t0);
        assert_eq!(sent(&mut b, c, t0), Some(1));
        assert_eq!(b.close(), 3);
        assert_eq!(b.held(), 0);
        assert!(matches!(
            b.next_for(c, || t0),
            Next::End { acked: 0, lost: 3 }
        ));
        assert_eq!(b.remove(c), Some("sock"));
        assert!(b.remove(c).is_none());
        let d = b.register("d".into(), "p".into(), 1, "sock-d", t0);
        assert_eq!(b.remove_all(), ["sock-d"]);
        assert!(matches!(b.next_for(d, || t0), Next::Gone));
    }
}

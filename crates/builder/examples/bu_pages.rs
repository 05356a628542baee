//! The BU's state machine alone, without IO or other processes: pages of fragments from two
//! RUs filed as the driver files them (`Bu::handle_page`, a page at a time), the events
//! built, delivered, released and echoed. Prints nanoseconds per event for each round and
//! their median. One thread and no peers: its profile (`perf record`) shows the BU's own
//! costs without the scheduling of five processes on two cores, and its rounds scatter by a
//! few percent where a whole `evb run` scatters by tens. Compare two builds by alternating
//! their runs.
//!
//! `cargo run --release -p evb-builder --example bu_pages [ROUNDS] [FRAGMENT_BYTES] [cold]
//! [records]`
//!
//! The sink drops the events, as `evb run`'s default sink does, so the BU joins them and
//! hands them on as spans (`Bu::set_join`); with `records`, every event gets a record and is
//! handed on as an event (as with a file or serve sink, and as every BU did before the join).
//!
//! What is timed: filing the pages, completing the events, the sink's side
//! (`deliver_spans`, or `delivered` and `recycle`), releases and credits, and the EVM's echo. Not timed: making the pages, and
//! with `cold`, the sweep of 8 MiB of other memory before each page is filed and before the
//! events are delivered (in an `evb run` the kernel's copies and four other processes pass
//! through the caches between an event's Assign, its fragments and its delivery).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use evb_buffers::{Chain, Pool};

use evb_builder::{Bu, BuConfig, BuiltEvent, DiscardSink, NodeRef, Verify};
use evb_wire::{EventRange, FragmentHeader, Message};

const RUS: u16 = 2;
const BLOCK: usize = 256 << 10;
/// Passes per round.
const PASSES: usize = 400;

/// One RU's page: fragments of events `first..first + n`, each payload a slice of `pool`.
fn page(pool: &Pool, ru: u16, first: u64, n: usize, size: usize) -> Vec<(FragmentHeader, Chain)> {
    let mut w = pool
        .try_alloc()
        .expect("the pool holds the pages of a pass");
    let payload = vec![ru as u8; size];
    (0..n as u64)
        .map(|k| {
            let h = FragmentHeader {
                event_id: first + k,
                trigger_number: (first + k) as u32,
                source_id: 100 + ru,
                flags: 0,
                payload_size: size as u32,
                payload_crc: 0,
            };
            let s = w.append(&payload).expect("a page fits a block");
            (h, Chain::from_slice(s))
        })
        .collect()
}

/// One pass: the events of a page from every RU, assigned, filed, built, delivered and
/// released; returns the time it took beyond making the pages.
fn pass(
    b: &mut Bu,
    pool: &Pool,
    first: u64,
    n: usize,
    size: usize,
    cold: &mut Option<Vec<u64>>,
    queue: &mut VecDeque<BuiltEvent>,
) -> Duration {
    let pages: Vec<(NodeRef, Vec<(FragmentHeader, Chain)>)> = (0..RUS)
        .map(|ru| (NodeRef::Ru(ru), page(pool, ru, first, n, size)))
        .collect();
    let mut spent = Duration::ZERO;
    let mut t = Instant::now();
    let now = t;
    let range = EventRange {
        bu: 0,
        first,
        count: n as u32,
    };
    b.handle(now, NodeRef::Evm, Message::Assign(range, 0));
    for (from, run) in pages {
        sweep(cold, &mut spent, &mut t);
        b.handle_page(now, from, run);
    }
    sweep(cold, &mut spent, &mut t);
    while b.next_action().is_some() {}
    let mut built = b.spans_queued() as usize;
    b.deliver_spans(&mut DiscardSink)
        .expect("the discard sink takes every span");
    // as the driver does: the pass's events to the sink's queue in one move
    b.move_built(queue);
    for e in queue.drain(..) {
        b.delivered(e.event_id, e.bytes);
        b.recycle(e.fragments);
        built += 1;
    }
    assert_eq!(built, n, "every event of the pass is built");
    b.poll(now);
    while b.next_action().is_some() {}
    b.handle(now, NodeRef::Evm, Message::Release(range));
    while b.next_action().is_some() {}
    spent + t.elapsed()
}

/// With `cold` memory, walks it (a line at a time, untimed): the time so far is added to
/// `spent` and the clock `t` starts again after the walk.
fn sweep(cold: &mut Option<Vec<u64>>, spent: &mut Duration, t: &mut Instant) {
    let Some(m) = cold else { return };
    *spent += t.elapsed();
    for w in m.iter_mut().step_by(8) {
        *w = w.wrapping_add(1);
    }
    std::hint::black_box(&m);
    *t = Instant::now();
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let rest: Vec<String> = args.collect();
    let mut cold = rest
        .iter()
        .any(|a| a == "cold")
        .then(|| vec![0u64; 1 << 20]);
    let records = rest.iter().any(|a| a == "records");
    // a page as the messenger cuts one: 256 KiB of fragments and their 40 B prefixes
    let n = (BLOCK / (size + 40)).max(1);
    let pool = Pool::new("bu-pages", BLOCK, 4 * RUS as usize);
    let mut b = Bu::new(BuConfig {
        index: 0,
        source_ids: (0..RUS).map(|r| 100 + r).collect(),
        credits: 4096,
        verify: Verify::Headers,
        generator: None,
        slices: None,
        duplicate_window: 1 << 16,
    });
    b.set_join(!records);
    b.handle(Instant::now(), NodeRef::Evm, Message::Start);
    let mut queue = VecDeque::new();
    let mut first = 0u64;
    let mut rounds_ns = Vec::new();
    for round in 0..rounds {
        let mut spent = Duration::ZERO;
        for _ in 0..PASSES {
            spent += pass(&mut b, &pool, first, n, size, &mut cold, &mut queue);
            first += n as u64;
        }
        let ns = spent.as_nanos() as f64 / (PASSES * n) as f64;
        println!("round {round}: {ns:6.1} ns/event");
        rounds_ns.push(ns);
    }
    println!(
        "{size} B fragments, {n} per page, {RUS} RUs{}{}: {:.1} ns/event (median of {rounds})",
        if cold.is_some() { ", cold" } else { "" },
        if records { ", records" } else { ", joined" },
        median(rounds_ns)
    );
    assert!(b.stats().clean(), "{}", b.stats().errors_in_words());
}

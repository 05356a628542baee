//! The RU's state machine alone, without IO or other processes: assignments of consecutive
//! events alternating between two BUs, made (static generator content, as the small-event
//! benchmarks use), handed on as runs (dropped here, as a sent page is), held and released.
//! Prints nanoseconds per fragment for each round and their median. Compare two builds by
//! alternating their runs (its rounds scatter by a few percent where an `evb run` scatters
//! by tens).
//!
//! `cargo run --release -p evb-builder --example ru_runs [ROUNDS] [FRAGMENT_BYTES]`

use std::time::{Duration, Instant};

use evb_buffers::Pool;
use evb_builder::{Action, Content, Generator, NodeRef, Ru, RuConfig, SizeModel, Source};
use evb_wire::{EventRange, Message};

const BLOCK: usize = 256 << 10;
/// Assignments per round.
const PASSES: usize = 400;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One assignment of `n` events to `bu`, made, sent and released; the time it took.
fn pass(ru: &mut Ru, bu: u16, first: u64, n: u32) -> Duration {
    let t = Instant::now();
    let range = EventRange {
        bu,
        first,
        count: n,
    };
    ru.handle(t, NodeRef::Evm, Message::Assign(range, 0));
    let mut sent = 0u32;
    while sent < n {
        ru.poll(t);
        while let Some(a) = ru.next_action() {
            if let Action::SendFragments { count, .. } = a {
                sent += count;
            }
        }
    }
    ru.handle(t, NodeRef::Evm, Message::Release(range));
    while ru.next_action().is_some() {}
    t.elapsed()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    // an assignment as the EVM sizes one: a page of two RUs' fragments
    let n = (BLOCK / ((size + 40) * 2)).max(1) as u32;
    let g = Generator::new(SizeModel::Fixed(size), 1).with_content(Content::Static);
    let mut ru = Ru::new(
        RuConfig {
            index: 0,
            source_id: 100,
            source: Source::Generator(g),
            max_per_poll: 4096,
            max_run_bytes: BLOCK,
        },
        Pool::new("ru-runs", BLOCK, 64),
    );
    ru.connections_up();
    while ru.next_action().is_some() {}
    ru.handle(Instant::now(), NodeRef::Evm, Message::Start);
    while ru.next_action().is_some() {}
    let mut first = 0u64;
    let mut rounds_ns = Vec::new();
    for round in 0..rounds {
        let mut spent = Duration::ZERO;
        for p in 0..PASSES {
            spent += pass(&mut ru, (p % 2) as u16, first, n);
            first += n as u64;
        }
        let ns = spent.as_nanos() as f64 / (PASSES as f64 * n as f64);
        println!("round {round}: {ns:6.1} ns/fragment");
        rounds_ns.push(ns);
    }
    let s = ru.stats();
    assert_eq!(s.fragments_sent, first, "every assigned fragment is made");
    assert_eq!((s.retained, s.errors), (0, 0), "all released, no errors");
    println!(
        "{size} B fragments, {n} per assignment: {:.1} ns/fragment (median of {rounds})",
        median(rounds_ns)
    );
}

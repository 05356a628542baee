//! The message splitter alone: a page of 256 B fragments (as an RU's run of small events
//! fills it) read into one receive block, cut into fragments as a BU's messenger cuts it
//! (coalesced), and dropped. Prints nanoseconds per fragment for each round and their
//! median; compare two builds by alternating their runs.
//!
//! `cargo run --release -p evb-messaging --example split_pages [ROUNDS] [FRAGMENT_BYTES]`

use std::time::Instant;

use evb_buffers::{Chain, Pool};
use evb_messaging::{fragment_prefix, split_messages_into};
use evb_wire::FragmentHeader;

const PAGE: usize = 256 << 10;
const SPLITS: usize = 2000;

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let payload = vec![7u8; size];
    let mut page = Vec::with_capacity(PAGE);
    let mut count = 0u32;
    while page.len() + 40 + size <= PAGE {
        let h = FragmentHeader {
            event_id: count as u64,
            trigger_number: count,
            source_id: 1,
            flags: 0,
            payload_size: size as u32,
            payload_crc: crc32c::crc32c(&payload),
        };
        page.extend_from_slice(&fragment_prefix(&h));
        page.extend_from_slice(&payload);
        count += 1;
    }
    let pool = Pool::new("split", PAGE, 4);
    let mut w = pool.try_alloc().expect("a block");
    let chain = Chain::from_slice(w.append(&page).expect("the page fits its block"));
    let mut out = Vec::new();
    let mut per_round = Vec::new();
    for round in 0..rounds {
        let t = Instant::now();
        for _ in 0..SPLITS {
            out.clear();
            split_messages_into(&chain, count, &mut out, true).expect("a valid page");
        }
        let ns = t.elapsed().as_nanos() as f64 / (SPLITS as f64 * count as f64);
        println!("round {round}: {ns:.1} ns/fragment");
        per_round.push(ns);
    }
    per_round.sort_by(f64::total_cmp);
    println!(
        "{size} B fragments, {count} per page: {:.1} ns/fragment (median of {rounds})",
        per_round[rounds / 2]
    );
}

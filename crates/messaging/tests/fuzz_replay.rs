//! The `page` fuzz target's checks on stable Rust: its checked-in seeds and fixed crashes
//! (fuzz/seeds/page, fuzz/regressions/page), the seeds made in code and damaged
//! copies of them. The coverage-guided fuzzing itself needs nightly: scripts/fuzz.sh.

#[path = "../../../fuzz/checks/page.rs"]
mod page;
#[path = "../../../fuzz/checks/replay.rs"]
mod replay;

use evb_buffers::{Chain, Pool};
use evb_messaging::{fragment_prefix, split_messages, Received};
use evb_wire::{EventRange, FragmentHeader, Message, FLAG_GENERATED};
use replay::Rng;

#[test]
fn page_fuzz_corpus_and_damaged_valid_inputs() {
    let seeds = page::seeds();
    let n = replay::run("page", page::check, &seeds, 2000);
    assert!(n >= seeds.len() * (2000 + 1), "{n} inputs checked");
}

/// A valid page of `count` messages: control messages and fragments with correct CRCs.
fn valid_page(rng: &mut Rng) -> (Vec<u8>, u32) {
    let mut page = Vec::new();
    let count = 1 + rng.below(8) as u32;
    for k in 0..count {
        match rng.below(6) {
            0 => Message::Credit {
                bu: k as u16,
                count: 1 + rng.below(100) as u32,
            }
            .encode_into(&mut page),
            1 => Message::Assign(
                EventRange {
                    bu: 1,
                    first: rng.next() >> 2,
                    count: 1 + rng.below(10) as u32,
                },
                1,
            )
            .encode_into(&mut page),
            2 => Message::Report(format!("{{\"k\":{k}}}")).encode_into(&mut page),
            3 => Message::Heartbeat.encode_into(&mut page),
            _ => {
                let payload: Vec<u8> = (0..rng.below(300)).map(|_| rng.next() as u8).collect();
                let h = FragmentHeader {
                    event_id: rng.next() >> 1,
                    trigger_number: k,
                    source_id: 3,
                    flags: FLAG_GENERATED,
                    payload_size: payload.len() as u32,
                    payload_crc: crc32c::crc32c(&payload),
                };
                page.extend_from_slice(&fragment_prefix(&h));
                page.extend_from_slice(&payload);
            }
        }
    }
    (page, count)
}

/// Damages a page: flipped bits, a message length or the count rewritten, truncation.
fn damage(rng: &mut Rng, page: &mut Vec<u8>, count: &mut u32) {
    for _ in 0..1 + rng.below(3) {
        match rng.below(5) {
            0 if !page.is_empty() => {
                let at = rng.below(page.len());
                page[at] ^= 1 << rng.below(8);
            }
            1 if page.len() >= 4 => {
                // a 4-byte field, often a message length (offset 4 of a header)
                let at = rng.below(page.len() - 3);
                let v: u32 = match rng.below(4) {
                    0 => 0,
                    1 => u32::MAX,
                    2 => rng.below(400) as u32,
                    _ => rng.next() as u32,
                };
                page[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
            2 => page.truncate(rng.below(page.len() + 1)),
            3 => *count = rng.below(10) as u32,
            _ => page.extend((0..1 + rng.below(20)).map(|_| rng.next() as u8)),
        }
    }
}

/// Cuts `page` into blocks of `step` bytes, as a socket read into the receive pool would.
fn in_blocks(pool: &Pool, page: &[u8], step: usize) -> Chain {
    let mut chain = Chain::new();
    for piece in page.chunks(step) {
        let mut w = pool.try_alloc().unwrap();
        chain.push(w.append(piece).unwrap());
    }
    chain
}

/// Valid pages, split over blocks anywhere, read back exactly; damaged ones are refused
/// with a typed error or read as messages that encode back to exactly the page's bytes,
/// and `split_messages` never panics. (Random bytes would hardly ever reach the length and
/// count handling: valid fragment headers carry a CRC.)
#[test]
fn damaged_valid_pages_are_refused_or_read_exactly() {
    // one block per piece: enough for the largest page cut into 1-byte pieces
    let pool = Pool::new("pages", 256, 4096);
    let mut rng = Rng(16);
    let (mut read, mut refused) = (0, 0);
    for case in 0..4000 {
        let (mut page, mut count) = valid_page(&mut rng);
        let step = 1 + rng.below(200);
        let mut out = Vec::new();
        split_messages(&in_blocks(&pool, &page, step), count, &mut out)
            .unwrap_or_else(|e| panic!("case {case}: a valid page refused: {e}"));
        assert_eq!(out.len(), count as usize, "case {case}");
        assert_eq!(page::re_encode(&out), page, "case {case}");
        damage(&mut rng, &mut page, &mut count);
        out.clear();
        match split_messages(&in_blocks(&pool, &page, step), count, &mut out) {
            Ok(()) => {
                read += 1;
                assert_eq!(out.len(), count as usize, "case {case}");
                assert_eq!(page::re_encode(&out), page, "case {case}");
                for r in &out {
                    if let Received::Fragment { header, payload } = r {
                        assert_eq!(payload.len(), header.payload_size as usize, "case {case}");
                    }
                    if let Received::Message(Message::Assign(r, _) | Message::Release(r)) = r {
                        assert!(r.count >= 1, "case {case}");
                    }
                }
            }
            Err(_) => refused += 1,
        }
    }
    // both outcomes are exercised: damage the checks miss (a flipped payload bit, caught
    // later by the payload CRC) and damage they refuse
    assert!(
        read > 100 && refused > 1000,
        "read {read}, refused {refused}"
    );
}

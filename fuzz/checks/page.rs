//! The `page` fuzz target: a Messages frame's payload (a page of messages, fragments
//! included) as received, cut over pool blocks. Shared by `fuzz_targets/page.rs`
//! (cargo-fuzz) and the stable replay test `crates/messaging/tests/fuzz_replay.rs`.

use evb_buffers::{Chain, Pool};
use evb_messaging::{fragment_prefix, split_messages, split_messages_into, Received};
use evb_wire::pubsub::{Delivery, GoodbyeCode, PubSubMessage, PublishedHeader, TagRange};
use evb_wire::{EventRange, FragmentHeader, Message, FLAG_GENERATED};

/// Input: u32 message count (modulo 64; its first byte also picks the block size), then the
/// page. `split_messages` must refuse it or read exactly `count` messages that encode back
/// to the page's bytes; coalescing fragments (as a BU does) must agree with it.
pub fn check(data: &[u8]) {
    if data.len() < 4 {
        return;
    }
    let count = u32::from_le_bytes(data[..4].try_into().unwrap()) % 64;
    // split across blocks at an input-chosen size, as a socket read would
    let step = 1 + data[0] as usize % 97;
    let page = &data[4..];
    let pool = Pool::new("fuzz", 4096, page.len() / step + 2);
    let mut chain = Chain::new();
    for piece in page.chunks(step) {
        let mut w = pool.try_alloc().unwrap();
        chain.push(w.append(piece).unwrap());
    }
    let mut out = Vec::new();
    let plain = split_messages(&chain, count, &mut out);
    let mut runs = Vec::new();
    let coalesced = split_messages_into(&chain, count, &mut runs, true);
    assert_eq!(
        plain.is_ok(),
        coalesced.is_ok(),
        "{plain:?} / {coalesced:?}"
    );
    if plain.is_ok() {
        assert_eq!(out.len(), count as usize);
        for r in &out {
            if let Received::Fragment { header, payload } = r {
                assert_eq!(payload.len(), header.payload_size as usize);
            }
        }
        assert_eq!(re_encode(&out), page);
        assert_eq!(re_encode(&runs), page);
        // no two runs side by side: consecutive fragments are one run
        let is_run = |r: &Received| matches!(r, Received::Fragments(_));
        assert!(!runs.windows(2).any(|w| is_run(&w[0]) && is_run(&w[1])));
    }
}

/// Encodes again what `split_messages` read: the bytes of the page it came from.
pub fn re_encode(out: &[Received]) -> Vec<u8> {
    let mut v = Vec::new();
    for r in out {
        match r {
            Received::Message(m) => m.encode_into(&mut v),
            Received::Fragment { header, payload } => {
                v.extend_from_slice(&fragment_prefix(header));
                v.extend_from_slice(&payload.to_vec());
            }
            Received::Fragments(run) => {
                for (header, payload) in run {
                    v.extend_from_slice(&fragment_prefix(header));
                    v.extend_from_slice(&payload.to_vec());
                }
            }
            Received::Published { header, payload } => {
                let prefix = header
                    .prefix(payload.len())
                    .expect("a decoded payload fits a message");
                v.extend_from_slice(&prefix);
                v.extend_from_slice(&payload.to_vec());
            }
            Received::PubSub(m) => m.encode_into(&mut v),
        }
    }
    v
}

/// Valid pages: control messages and fragments with correct CRCs.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for n in 1..6u32 {
        let mut page = Vec::new();
        for k in 0..n {
            match k % 4 {
                0 => {
                    let payload: Vec<u8> =
                        (0..(k * 37 + n * 11) as usize).map(|b| b as u8).collect();
                    let h = FragmentHeader {
                        event_id: 1000 + k as u64,
                        trigger_number: k,
                        source_id: 2,
                        flags: FLAG_GENERATED,
                        payload_size: payload.len() as u32,
                        payload_crc: crc32c::crc32c(&payload),
                    };
                    page.extend_from_slice(&fragment_prefix(&h));
                    page.extend_from_slice(&payload);
                }
                1 => Message::Assign(
                    EventRange {
                        bu: 1,
                        first: k as u64,
                        count: 1 + n,
                    },
                    1,
                )
                .encode_into(&mut page),
                2 => Message::Credit { bu: 0, count: n }.encode_into(&mut page),
                _ => Message::Report(format!("{{\"n\":{n}}}")).encode_into(&mut page),
            }
        }
        let mut data = n.to_le_bytes().to_vec();
        data.extend_from_slice(&page);
        seeds.push(data);
    }
    // pub/sub: a Published, a Subscribe, a Gap and a Goodbye in one page
    let mut page = Vec::new();
    let payload = b"published payload";
    let prefix = PublishedHeader { tag: 7, seq: 3 }
        .prefix(payload.len())
        .expect("fits");
    page.extend_from_slice(&prefix);
    page.extend_from_slice(payload);
    PubSubMessage::Subscribe {
        delivery: Delivery::Throughput,
        ranges: vec![TagRange { first: 1, last: 9 }],
    }
    .encode_into(&mut page);
    PubSubMessage::Gap { tag: 7, missed: 2 }.encode_into(&mut page);
    PubSubMessage::Goodbye {
        code: GoodbyeCode::SlowSubscriber,
        reason: "slow".into(),
    }
    .encode_into(&mut page);
    let mut data = 4u32.to_le_bytes().to_vec();
    data.extend_from_slice(&page);
    seeds.push(data);
    seeds
}

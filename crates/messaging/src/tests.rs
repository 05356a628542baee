use std::time::{Duration, Instant};

use evb_buffers::{Chain, Pool};
use evb_transport::inproc::InprocTransport;
use evb_transport::tcp::TcpTransport;
use evb_transport::{ConnId, Transport, TransportConfig};
use evb_wire::{
    Channel, EventRange, FragmentHeader, Hello, Message, Role, WireError, FLAG_GENERATED,
};

use crate::*;

fn cfg(node: &str) -> TransportConfig {
    TransportConfig {
        run_id: "r".into(),
        local: Hello::new(Channel::Data, Role::Bu, 0, "r", node),
        max_frame: 4 << 20,
        rx_pool: Pool::new(node, 64 * 1024, 256),
        secret: None,
    }
}

fn pair(tcp: bool, name: &str) -> (Messenger, Messenger, ConnId) {
    let (ta, tb): (Box<dyn Transport>, Box<dyn Transport>) = if tcp {
        (
            Box::new(TcpTransport::new(cfg("a")).unwrap()),
            Box::new(TcpTransport::new(cfg("b")).unwrap()),
        )
    } else {
        (
            Box::new(InprocTransport::new(cfg("a"))),
            Box::new(InprocTransport::new(cfg("b"))),
        )
    };
    let mut a = Messenger::new(ta, MessengerConfig::default());
    let mut b = Messenger::new(tb, MessengerConfig::default());
    let addr = b.listen(if tcp { "127.0.0.1:0" } else { name }).unwrap();
    let conn = a
        .connect(&addr, Hello::new(Channel::Data, Role::Ru, 0, "r", "a"))
        .unwrap();
    let mut ev = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut connected = false;
    while !connected {
        assert!(Instant::now() < deadline);
        a.poll(&mut ev, Some(Duration::from_millis(1))).unwrap();
        connected = ev.iter().any(|e| matches!(e, Incoming::Connected { .. }));
        b.poll(&mut Vec::new(), Some(Duration::from_millis(1)))
            .unwrap();
    }
    (a, b, conn)
}

/// The header of source `source_id`'s fragment of `event_id` carrying `payload`.
fn header_of(event_id: u64, source_id: u16, payload: &[u8]) -> FragmentHeader {
    FragmentHeader {
        event_id,
        trigger_number: event_id as u32,
        source_id,
        flags: FLAG_GENERATED,
        payload_size: payload.len() as u32,
        payload_crc: crc32c::crc32c(payload),
    }
}

fn fragment(pool: &Pool, event_id: u64, payload: &[u8]) -> Chain {
    let h = header_of(event_id, 1, payload);
    let mut w = pool.try_alloc().unwrap();
    let mut c = Chain::new();
    c.push(w.append(&fragment_prefix(&h)).unwrap());
    c.push(w.append(payload).unwrap());
    c
}

/// The payload of test fragment `i`.
fn payload_of(i: u64) -> Vec<u8> {
    (0..(i as usize * 13 % 3000))
        .map(|b| (b as u64 ^ i) as u8)
        .collect()
}

fn mixed_traffic_keeps_order(tcp: bool, name: &str) {
    let (mut a, mut b, conn) = pair(tcp, name);
    let pool = Pool::new("frags", 16 * 1024, 400);
    let mut want = 0;
    for i in 0..500u64 {
        match i % 5 {
            0 => a
                .send_now(
                    conn,
                    &Message::Credit {
                        bu: 0,
                        count: i as u32 + 1,
                    },
                )
                .unwrap(),
            1 | 2 => a
                .send_batched(
                    conn,
                    &Message::Assign(
                        EventRange {
                            bu: 1,
                            first: i,
                            count: 1,
                        },
                        3,
                    ),
                )
                .unwrap(),
            _ => a
                .send_fragment(conn, &fragment(&pool, i, &payload_of(i)))
                .unwrap(),
        }
        want += 1;
        if i % 97 == 0 {
            a.flush_due(Instant::now());
        }
    }
    a.flush_due(Instant::now());
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < want {
        assert!(Instant::now() < deadline, "got {} of {want}", got.len());
        a.poll(&mut Vec::new(), Some(Duration::from_millis(1)))
            .unwrap();
        b.poll(&mut got, Some(Duration::from_millis(1))).unwrap();
        got.retain(|e| matches!(e, Incoming::Received { .. }));
    }
    // nothing more than was sent arrives, even given time
    let quiet = Instant::now() + Duration::from_millis(100);
    while Instant::now() < quiet {
        a.poll(&mut Vec::new(), Some(Duration::from_millis(1)))
            .unwrap();
        b.poll(&mut got, Some(Duration::from_millis(1))).unwrap();
        got.retain(|e| matches!(e, Incoming::Received { .. }));
    }
    assert_eq!(got.len(), want, "exactly the messages sent");
    assert_eq!(want, 500);
    for (i, e) in got.iter().enumerate() {
        let i = i as u64;
        let Incoming::Received { msg, .. } = e else {
            unreachable!()
        };
        match (i % 5, msg) {
            (0, Received::Message(m)) => assert_eq!(
                *m,
                Message::Credit {
                    bu: 0,
                    count: i as u32 + 1
                }
            ),
            (1 | 2, Received::Message(m)) => assert_eq!(
                *m,
                Message::Assign(
                    EventRange {
                        bu: 1,
                        first: i,
                        count: 1,
                    },
                    3,
                )
            ),
            (3 | 4, Received::Fragment { header, payload }) => {
                let bytes = payload_of(i);
                assert_eq!(header.event_id, i);
                assert_eq!(header.trigger_number, i as u32);
                assert_eq!(header.payload_size as usize, bytes.len());
                assert_eq!(header.payload_crc, crc32c::crc32c(&bytes));
                assert_eq!(payload.to_vec(), bytes, "fragment {i}'s payload");
            }
            other => panic!("message {i} out of order: {other:?}"),
        }
    }
    assert!(
        a.stats().frames_sent < a.stats().messages_sent,
        "batching packed nothing"
    );
}

#[test]
fn tcp_mixed_traffic_keeps_order() {
    mixed_traffic_keeps_order(true, "");
}

#[test]
fn inproc_mixed_traffic_keeps_order() {
    mixed_traffic_keeps_order(false, "messaging-order");
}

#[test]
fn fragments_arrive_in_receive_pool_blocks_without_copy() {
    let (mut a, mut b, conn) = pair(false, "messaging-zero-copy");
    let pool = Pool::new("frags", 64 * 1024, 2);
    let chain = fragment(&pool, 9, &[5u8; 1000]);
    let sent_at = chain.slices()[0].block_address();
    a.send_fragment(conn, &chain).unwrap();
    a.flush_due(Instant::now());
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.is_empty() {
        assert!(Instant::now() < deadline, "the fragment never arrived");
        b.poll(&mut got, Some(Duration::from_millis(10))).unwrap();
        got.retain(|e| matches!(e, Incoming::Received { .. }));
    }
    let Incoming::Received {
        msg: Received::Fragment { payload, .. },
        ..
    } = &got[0]
    else {
        panic!()
    };
    // inproc passes pool slices through: the BU reads the RU's very block
    assert_eq!(payload.slices()[0].block_address(), sent_at);
}

#[test]
fn split_rejects_bad_pages() {
    let pool = Pool::new("p", 4096, 4);
    let mut w = pool.try_alloc().unwrap();
    let mut bytes = Message::Start.encode();
    Message::Halt.encode_into(&mut bytes);
    let c = Chain::from_slice(w.append(&bytes).unwrap());
    let mut out = Vec::new();
    split_messages(&c, 2, &mut out).unwrap();
    assert!(
        matches!(
            &out[..],
            [
                Received::Message(Message::Start),
                Received::Message(Message::Halt)
            ]
        ),
        "{out:?}"
    );
    out.clear();
    assert_eq!(
        split_messages(&c, 1, &mut out).unwrap_err(),
        WireError::MessageCount {
            declared: 1,
            found: 2
        },
        "extra message accepted"
    );
    out.clear();
    assert_eq!(
        split_messages(&c, 3, &mut out).unwrap_err(),
        WireError::MessageCount {
            declared: 3,
            found: 2
        },
        "missing message accepted"
    );
    out.clear();
    assert_eq!(
        split_messages(&c.sub(0, 12), 2, &mut out).unwrap_err(),
        WireError::Truncated {
            what: "message header",
            need: 8,
            have: 4
        },
        "truncated accepted"
    );
    // a fragment whose header's payload size disagrees with its length
    let frag = fragment(&pool, 1, &[1; 10]);
    let mut bad = frag.to_vec();
    bad.push(0);
    bad[4] += 1; // message length covers the extra byte
    let c = Chain::from_slice(w.append(&bad).unwrap());
    out.clear();
    assert_eq!(
        split_messages(&c, 1, &mut out).unwrap_err(),
        WireError::BadLength {
            what: "fragment payload",
            expected: 10,
            got: 11
        }
    );
    // an empty range inside a page is refused, naming it
    let mut empty = Message::Heartbeat.encode();
    Message::Release(EventRange {
        bu: 0,
        first: 7,
        count: 0,
    })
    .encode_into(&mut empty);
    let c = Chain::from_slice(w.append(&empty).unwrap());
    out.clear();
    assert_eq!(
        split_messages(&c, 2, &mut out).unwrap_err(),
        WireError::OutOfRange {
            what: "release count",
            value: 0
        }
    );
}

/// A corrupt fragment header in the middle of a page of fragments refuses the page, with
/// the checksum error named, whether fragments come one by one or coalesced into runs.
#[test]
fn a_corrupt_fragment_inside_a_run_refuses_the_page() {
    let pool = Pool::new("p", 64 * 1024, 4);
    let mut page = Vec::new();
    for id in 0..5u64 {
        page.extend(fragment(&pool, id, &[id as u8; 100]).to_vec());
    }
    let one = page.len() / 5;
    // flip a bit of the third fragment's event id (its header CRC no longer matches)
    page[2 * one + evb_wire::MESSAGE_HEADER_LEN] ^= 1;
    let mut w = pool.try_alloc().unwrap();
    let c = Chain::from_slice(w.append(&page).unwrap());
    for coalesce in [false, true] {
        let mut out = Vec::new();
        let err = split_messages_into(&c, 5, &mut out, coalesce).unwrap_err();
        assert!(
            matches!(err, WireError::HeaderChecksum { .. }),
            "coalesce {coalesce}: {err:?}"
        );
    }
}

#[test]
fn busy_poll_delivers_every_message() {
    let (mut a, mut b, conn) = pair(true, "");
    let spin = Duration::from_micros(100);
    a.set_busy_poll(spin);
    b.set_busy_poll(spin);
    assert_eq!(b.busy_poll(), spin);
    for i in 1..=50u32 {
        a.send_now(conn, &Message::Credit { bu: 0, count: i })
            .unwrap();
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.is_empty() {
            assert!(Instant::now() < deadline, "message {i} never arrived");
            b.poll(&mut got, Some(Duration::from_millis(5))).unwrap();
            got.retain(|e| matches!(e, Incoming::Received { .. }));
        }
        match &got[..] {
            [Incoming::Received {
                msg: Received::Message(Message::Credit { count, .. }),
                ..
            }] => assert_eq!(*count, i),
            other => panic!("{other:?}"),
        }
    }
}

/// A page of fragments with a control message among them, cut into two slices at every
/// byte: the fragments inside one slice (taken with a local offset) and those across the
/// cut (the general path) come out the same, in order, coalesced around the control
/// message; a count one short is refused wherever the cut falls.
#[test]
fn a_page_split_anywhere_gives_the_same_fragments() {
    let mut page = Vec::new();
    let mut sent = Vec::new();
    for id in 0..9u64 {
        if id == 5 {
            Message::Heartbeat.encode_into(&mut page);
        }
        let payload: Vec<u8> = (0..(id as usize * 7) % 40)
            .map(|i| (id as u8) ^ i as u8)
            .collect();
        let h = header_of(id, 2, &payload);
        page.extend_from_slice(&fragment_prefix(&h));
        page.extend_from_slice(&payload);
        sent.push((h, payload));
    }
    let pool = Pool::new("cuts", 4096, 4);
    for cut in 0..=page.len() {
        let mut chain = Chain::new();
        for piece in [&page[..cut], &page[cut..]] {
            if !piece.is_empty() {
                chain.push(pool.try_alloc().unwrap().append(piece).unwrap());
            }
        }
        let mut out = Vec::new();
        split_messages_into(&chain, 10, &mut out, true).unwrap();
        let mut got = Vec::new();
        let mut shape = Vec::new();
        for r in out {
            match r {
                Received::Fragments(run) => {
                    shape.push(run.len());
                    got.extend(run.into_iter().map(|(h, p)| (h, p.to_vec())));
                }
                Received::Message(Message::Heartbeat) => shape.push(0),
                other => panic!("cut {cut}: {other:?}"),
            }
        }
        assert_eq!(got, sent, "cut {cut}");
        assert_eq!(shape, [5, 0, 4], "cut {cut}");
        let mut out = Vec::new();
        assert_eq!(
            split_messages_into(&chain, 9, &mut out, true).unwrap_err(),
            WireError::MessageCount {
                declared: 9,
                found: 10
            },
            "cut {cut}"
        );
    }
}

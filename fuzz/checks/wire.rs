//! The `wire` fuzz target: frame headers, handshakes, rejects, fragment headers and message
//! bodies from raw bytes. Shared by `fuzz_targets/wire.rs` (cargo-fuzz) and the stable
//! replay test `crates/wire/tests/fuzz_replay.rs`.

use evb_wire::*;

/// Every decoder over `data`: each returns an error or a value that encodes back to exactly
/// the bytes it read. Panics only when a decoder breaks that contract.
pub fn check(data: &[u8]) {
    if let Ok(h) = FrameHeader::decode(data, 1 << 24) {
        assert_eq!(&h.encode()[..], &data[..FRAME_HEADER_LEN]);
        assert!(h.length <= 1 << 24);
    }
    if let Ok(h) = Hello::decode(data) {
        assert_eq!(h.encode().unwrap(), data);
    }
    if let Ok(r) = Reject::decode(data) {
        assert_eq!(r.encode(), data);
    }
    if let Ok(h) = FragmentHeader::decode(data) {
        assert_eq!(&h.encode()[..], &data[..FRAGMENT_HEADER_LEN]);
    }
    if let Ok(h) = MessageHeader::decode(data) {
        assert_eq!(&h.encode()[..], &data[..MESSAGE_HEADER_LEN]);
    }
    // first byte: the message type; the rest: its body
    if let Some((&t, body)) = data.split_first() {
        // (0x00–0x21: every event-building message type, the standby's included)
        if let Ok(mt) = MessageType::from_u16(t as u16 % 0x22) {
            if let Ok(m) = Message::decode(mt, body) {
                assert_eq!(&m.encode()[MESSAGE_HEADER_LEN..], body);
                if let Message::Assign(r, _) | Message::Release(r) = m {
                    assert!(r.count > 0 && r.first.checked_add(r.count as u64).is_some());
                }
                if let Message::Credit { count, .. } = m {
                    assert!(count > 0);
                }
                if let Message::Commit { bu, ranges, .. } = &m {
                    assert!(!ranges.is_empty() && ranges.len() <= MAX_COMMIT_RANGES);
                    assert!(ranges.iter().all(|r| r.bu == *bu && r.count > 0));
                }
            }
        }
        // pub/sub: the first byte picks one of the four control messages
        let mt = [
            MessageType::Subscribe,
            MessageType::Unsubscribe,
            MessageType::Gap,
            MessageType::Goodbye,
        ][t as usize % 4];
        if let Ok(m) = pubsub::PubSubMessage::decode(mt, body) {
            assert_eq!(&m.encode()[MESSAGE_HEADER_LEN..], body);
        }
        if let Ok(h) = pubsub::PublishedHeader::decode(body) {
            let p = h.prefix(0).expect("an empty payload fits");
            assert_eq!(
                &p[MESSAGE_HEADER_LEN..],
                &body[..pubsub::PUBLISHED_HEADER_LEN]
            );
        }
    }
}

/// Valid inputs for every decoder.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut v = vec![
        FrameHeader::new(FrameType::Messages, 4096, 3, 7)
            .encode()
            .to_vec(),
        FrameHeader::new(FrameType::Bye, 0, 0, 1 << 40)
            .encode()
            .to_vec(),
        Hello::new(Channel::Data, Role::Ru, 3, "run-42", "ru3")
            .encode()
            .unwrap(),
        Reject {
            code: RejectCode::WrongRun,
            reason: "run id mismatch".into(),
        }
        .encode(),
        FragmentHeader {
            event_id: 77,
            trigger_number: 78,
            source_id: 3,
            flags: FLAG_GENERATED,
            payload_size: 2048,
            payload_crc: 0xdead_beef,
        }
        .encode()
        .to_vec(),
    ];
    let range = EventRange {
        bu: 1,
        first: 1 << 40,
        count: 300,
    };
    for m in [
        Message::Credit { bu: 2, count: 17 },
        Message::Assign(range, 1),
        Message::Release(range),
        Message::Ready { available: 4685 },
        Message::Start,
        Message::Stop { triggered: 123_456 },
        Message::Halt,
        Message::Report("{\"built\":3}".into()),
        Message::Abort("evm lost".into()),
        Message::Heartbeat,
        Message::SourceLost { ru: 3 },
        Message::LinkLost { peer: 2, inc: 7 },
        Message::Register(discovery::Registration {
            rank: 4,
            pid: 4711,
            host: "n13".into(),
            data: "10.1.0.13:40211".into(),
            control: "127.0.0.1:8004".into(),
        }),
        Message::Peers(vec![discovery::PeerAddr {
            role: Role::Bu,
            index: 1,
            addr: "10.1.0.13:40211".into(),
        }]),
        Message::ResyncRu {
            resync: evb_wire::resync::RuResync {
                ru: 2,
                known_until: 1 << 41,
                holds: vec![range, range],
                stopping: true,
            },
            more: true,
        },
        Message::ResyncBu {
            resync: Box::new(evb_wire::resync::BuResync {
                bu: 1,
                free_credits: 9,
                building: vec![range],
                unacked: vec![range, range],
                parts: vec![(4, vec![range]), (5, Vec::new())],
                built: 77,
                built_id_sum: 3,
                ..Default::default()
            }),
            more: false,
        },
        Message::Follow(evb_wire::resync::Follow {
            elapsed_ms: 2345,
            stop_requested: true,
            over: false,
            paused: false,
            epoch: 0,
            dropped: vec![(Role::Bu, 1), (Role::Ru, 0)],
            max_events: 6000,
            decisions_final: 12,
            since_ms: 1_795_000_000_000,
        }),
        Message::Fence { epoch: 1 },
        Message::Window {
            first: 9,
            windows: vec![
                evb_wire::window::DecisionWindow::all(100, 200),
                evb_wire::window::DecisionWindow {
                    begin: 5,
                    end: 9,
                    components: vec![1, 4, 7],
                },
            ],
        },
    ] {
        let b = m.encode();
        v.push(b.clone()); // as a message header
        let mut typed = vec![m.msg_type() as u16 as u8];
        typed.extend_from_slice(&b[MESSAGE_HEADER_LEN..]);
        v.push(typed); // as type byte + body
    }
    // pub/sub control messages: type byte (index into the four, see `check`) + body
    for (i, m) in [
        pubsub::PubSubMessage::Subscribe {
            delivery: pubsub::Delivery::Throughput,
            ranges: vec![pubsub::TagRange { first: 3, last: 9 }],
        },
        pubsub::PubSubMessage::Unsubscribe {
            ranges: vec![pubsub::TagRange::one(4)],
        },
        pubsub::PubSubMessage::Gap { tag: 5, missed: 2 },
        pubsub::PubSubMessage::Goodbye {
            code: pubsub::GoodbyeCode::SlowSubscriber,
            reason: "slow".into(),
        },
    ]
    .into_iter()
    .enumerate()
    {
        let mut typed = vec![i as u8];
        typed.extend_from_slice(&m.encode()[MESSAGE_HEADER_LEN..]);
        v.push(typed);
    }
    v
}

use super::*;

#[test]
fn frame_header_round_trip() {
    let h = FrameHeader::new(FrameType::Messages, 1234, 7, 99);
    let b = h.encode();
    assert_eq!(&b[0..4], b"EVBF");
    assert_eq!(FrameHeader::decode(&b, 1 << 20).unwrap(), h);
}

#[test]
fn frame_header_rejections() {
    let good = FrameHeader::new(FrameType::Messages, 100, 1, 0).encode();
    assert_eq!(
        FrameHeader::decode(&good[..10], 1000),
        Err(WireError::Truncated {
            what: "frame header",
            need: 24,
            have: 10
        })
    );
    let mut b = good;
    b[0] = b'X';
    assert!(matches!(
        FrameHeader::decode(&b, 1000),
        Err(WireError::BadMagic(_))
    ));
    let mut b = good;
    b[4] = 9;
    assert_eq!(
        FrameHeader::decode(&b, 1000),
        Err(WireError::UnsupportedVersion {
            got: 9,
            supported: 2
        })
    );
    let mut b = good;
    b[6] = 77;
    assert_eq!(
        FrameHeader::decode(&b, 1000),
        Err(WireError::UnknownFrameType(77))
    );
    let mut b = good;
    b[7] = 1;
    assert!(matches!(
        FrameHeader::decode(&b, 1000),
        Err(WireError::ReservedNonZero { .. })
    ));
    assert_eq!(
        FrameHeader::decode(&good, 99),
        Err(WireError::FrameTooLarge { len: 100, max: 99 })
    );
    let h = FrameHeader::new(FrameType::Bye, 0, 3, 0).encode();
    assert!(matches!(
        FrameHeader::decode(&h, 99),
        Err(WireError::ReservedNonZero { .. })
    ));
}

#[test]
fn hello_round_trip_and_rejections() {
    let h = Hello::new(Channel::Data, Role::Ru, 3, "run-42", "ru3");
    let b = h.encode().unwrap();
    assert_eq!(Hello::decode(&b).unwrap(), h);
    // every truncation is an error, never a panic
    for n in 0..b.len() {
        assert!(Hello::decode(&b[..n]).is_err(), "prefix {n} accepted");
    }
    let mut extra = b.clone();
    extra.push(0);
    assert!(matches!(
        Hello::decode(&extra),
        Err(WireError::BadLength { .. })
    ));
    // bytes 6–7: a BU's incarnation; from anyone else, reserved
    let bu = Hello::new(Channel::Data, Role::Bu, 1, "run-42", "bu1").with_incarnation(0x1234);
    let bb = bu.encode().unwrap();
    assert_eq!(&bb[6..8], &[0x34, 0x12]);
    assert_eq!(Hello::decode(&bb).unwrap(), bu);
    let mut ru_with = b.clone();
    ru_with[6] = 1;
    assert!(matches!(
        Hello::decode(&ru_with),
        Err(WireError::ReservedNonZero { what: "hello" })
    ));
    let mut bad = b.clone();
    bad[2] = 5;
    assert!(matches!(
        Hello::decode(&bad),
        Err(WireError::OutOfRange {
            what: "hello channel",
            ..
        })
    ));
    let mut bad = b.clone();
    bad[3] = 5;
    assert!(matches!(
        Hello::decode(&bad),
        Err(WireError::OutOfRange {
            what: "hello role",
            ..
        })
    ));
    let mut bad = b.clone();
    bad[0] = 1; // the first published version
    assert!(matches!(
        Hello::decode(&bad),
        Err(WireError::UnsupportedVersion { got: 1, .. })
    ));
    let mut bad = b.clone();
    bad[17] = 0xff; // first byte of the run id: invalid UTF-8
    assert!(matches!(
        Hello::decode(&bad),
        Err(WireError::BadUtf8 { what: "run id" })
    ));
    let long = Hello::new(Channel::Data, Role::Ru, 0, &"x".repeat(65), "a");
    assert!(matches!(long.encode(), Err(WireError::TooLong { .. })));
}

#[test]
fn messages_round_trip() {
    let all = [
        Message::Credit { bu: 2, count: 17 },
        Message::Assign(
            EventRange {
                bu: 1,
                first: 1 << 40,
                count: 300,
            },
            0xBEEF,
        ),
        Message::Release(EventRange {
            bu: 0,
            first: 5,
            count: 1,
        }),
        Message::Ready { available: 4685 },
        Message::Start,
        Message::Stop { triggered: 123_456 },
        Message::Halt,
        Message::Report("{\"built\":3}".into()),
        Message::Abort("evm lost".into()),
        Message::Heartbeat,
        Message::SourceLost { ru: 3 },
        Message::LinkLost { peer: 2, inc: 7 },
        Message::Available {
            count: 4685,
            done: true,
        },
        Message::Register(crate::discovery::Registration {
            rank: 3,
            pid: 4711,
            host: "n12".into(),
            data: "10.1.0.12:40211".into(),
            control: "127.0.0.1:8003".into(),
        }),
        Message::Peers(vec![
            crate::discovery::PeerAddr {
                role: crate::Role::Bu,
                index: 1,
                addr: "10.1.0.13:40999".into(),
            },
            crate::discovery::PeerAddr {
                role: crate::Role::Bu,
                index: 0,
                addr: "n13:shm77-0".into(),
            },
        ]),
        Message::Peers(vec![]),
        Message::Commit {
            bu: 3,
            part: 7,
            ranges: vec![
                EventRange {
                    bu: 3,
                    first: 64,
                    count: 32,
                },
                EventRange {
                    bu: 3,
                    first: 160,
                    count: 1,
                },
            ],
        },
        Message::Committed { bu: 3, part: 7 },
        Message::PartPublished { bu: 3, part: 7 },
    ];
    for m in all {
        let b = m.encode();
        let h = MessageHeader::decode(&b).unwrap();
        assert_eq!(h.length as usize, b.len() - MESSAGE_HEADER_LEN);
        assert_eq!(
            Message::decode(h.msg_type, &b[MESSAGE_HEADER_LEN..]).unwrap(),
            m
        );
    }
}

/// Register and Peers bodies: every length, count and reserved field is checked; no input
/// panics the decoder.
#[test]
fn discovery_rejections() {
    use crate::discovery::{PeerAddr, Registration};
    let reg = Message::Register(Registration {
        rank: 0,
        pid: 1,
        host: "h".into(),
        data: "127.0.0.1:5".into(),
        control: String::new(),
    })
    .encode();
    let body = &reg[MESSAGE_HEADER_LEN..];
    // every truncation and one byte too many
    for n in 0..body.len() {
        assert!(
            Message::decode(MessageType::Register, &body[..n]).is_err(),
            "{n}"
        );
    }
    let mut long = body.to_vec();
    long.push(0);
    assert!(matches!(
        Message::decode(MessageType::Register, &long),
        Err(WireError::BadLength {
            what: "register",
            ..
        })
    ));
    // an empty data address, a host length beyond the limit, bad UTF-8
    let mut b = 7u32.to_le_bytes().to_vec();
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&[1, 0, b'h', 0, 0, 0, 0]);
    assert!(matches!(
        Message::decode(MessageType::Register, &b),
        Err(WireError::OutOfRange { .. })
    ));
    let mut b = vec![0; 8];
    b.extend_from_slice(&1000u16.to_le_bytes());
    assert!(matches!(
        Message::decode(MessageType::Register, &b),
        Err(WireError::TooLong { .. })
    ));
    let mut b = vec![0; 8];
    b.extend_from_slice(&[1, 0, 0xff, 1, 0, b'x', 0, 0]);
    assert!(matches!(
        Message::decode(MessageType::Register, &b),
        Err(WireError::BadUtf8 { .. })
    ));
    let peers = Message::Peers(vec![PeerAddr {
        role: crate::Role::Bu,
        index: 2,
        addr: "127.0.0.1:9".into(),
    }])
    .encode();
    let body = &peers[MESSAGE_HEADER_LEN..];
    for n in 0..body.len() {
        assert!(
            Message::decode(MessageType::Peers, &body[..n]).is_err(),
            "{n}"
        );
    }
    let bad = |at: usize, v: u8| {
        let mut b = body.to_vec();
        b[at] = v;
        Message::decode(MessageType::Peers, &b)
    };
    assert!(matches!(bad(2, 1), Err(WireError::ReservedNonZero { .. })));
    assert!(matches!(
        bad(4, 3),
        Err(WireError::OutOfRange {
            what: "peers role",
            ..
        })
    ));
    assert!(matches!(bad(5, 1), Err(WireError::ReservedNonZero { .. })));
    // a count larger than the entries, and one beyond the limit
    assert!(bad(0, 2).is_err());
    let mut b = body.to_vec();
    b[0..2].copy_from_slice(&5000u16.to_le_bytes());
    assert!(matches!(
        Message::decode(MessageType::Peers, &b),
        Err(WireError::OutOfRange {
            what: "peers count",
            ..
        })
    ));
}

#[test]
fn message_rejections() {
    assert_eq!(
        MessageHeader::decode(&[0x99, 0, 0, 0, 0, 0, 0, 0]),
        Err(WireError::UnknownMessageType(0x99))
    );
    assert!(matches!(
        MessageHeader::decode(&[1, 0, 1, 0, 0, 0, 0, 0]),
        Err(WireError::ReservedNonZero { .. })
    ));
    assert_eq!(
        Message::decode(MessageType::Credit, &[0; 7]),
        Err(WireError::BadLength {
            what: "credit",
            expected: 8,
            got: 7
        })
    );
    assert!(Message::decode(MessageType::Start, &[0]).is_err());
    assert!(Message::decode(MessageType::Report, &[0xff, 0xfe]).is_err());
    let mut overflow = [0u8; 16];
    overflow[0..8].copy_from_slice(&u64::MAX.to_le_bytes());
    overflow[8] = 2;
    assert!(matches!(
        Message::decode(MessageType::Assign, &overflow),
        Err(WireError::OutOfRange { .. })
    ));
    assert!(Message::decode(MessageType::Fragment, &[]).is_err());
}

#[test]
fn fragment_header_round_trip_and_checksum() {
    let h = FragmentHeader {
        event_id: 77,
        trigger_number: 78,
        source_id: 3,
        flags: FLAG_GENERATED,
        payload_size: 2048,
        payload_crc: 0xdead_beef,
    };
    let b = h.encode();
    assert_eq!(FragmentHeader::decode(&b).unwrap(), h);
    for i in 0..28 {
        let mut bad = b;
        bad[i] ^= 0x10;
        assert!(
            matches!(
                FragmentHeader::decode(&bad),
                Err(WireError::HeaderChecksum { .. })
            ),
            "flip at {i} not caught"
        );
    }
    assert!(FragmentHeader::decode(&b[..31]).is_err());
}

#[test]
fn reject_round_trip() {
    let r = Reject {
        code: RejectCode::WrongRun,
        reason: "run id mismatch".into(),
    };
    assert_eq!(Reject::decode(&r.encode()).unwrap(), r);
    assert!(Reject::decode(&[7, 0]).is_err());
    assert!(Reject::decode(&[1]).is_err());
}

/// An empty range or credit is refused by the decoder (issue #16: an Assign of count 0
/// reached the RU, which counts a range down from its first event and underflowed).
#[test]
fn empty_ranges_and_credits_are_refused() {
    let range = EventRange {
        bu: 1,
        first: 10,
        count: 0,
    };
    for (m, what) in [
        (Message::Assign(range, 7), "assign count"),
        (Message::Release(range), "release count"),
        (Message::Credit { bu: 1, count: 0 }, "credit count"),
    ] {
        let b = m.encode();
        let h = MessageHeader::decode(&b).unwrap();
        assert_eq!(
            Message::decode(h.msg_type, &b[MESSAGE_HEADER_LEN..]),
            Err(WireError::OutOfRange { what, value: 0 })
        );
    }
    // a count of one is the smallest range
    let one = Message::Assign(EventRange { count: 1, ..range }, 7);
    let b = one.encode();
    assert_eq!(
        Message::decode(MessageType::Assign, &b[MESSAGE_HEADER_LEN..]),
        Ok(one)
    );
    // the incarnation is bytes 14–15 of the body, after the BU index
    assert_eq!(
        &b[MESSAGE_HEADER_LEN + 12..MESSAGE_HEADER_LEN + 16],
        &[1, 0, 7, 0]
    );
}

/// Commit bodies: the count bounds the body, every range is of the sending BU and not
/// empty, and the layout is protocol.md's, byte by byte.
#[test]
fn commit_bodies_are_checked() {
    let r = |first, count| EventRange {
        bu: 2,
        first,
        count,
    };
    let m = Message::Commit {
        bu: 2,
        part: 9,
        ranges: vec![r(10, 4), r(20, 1)],
    };
    let b = m.encode();
    let body = &b[MESSAGE_HEADER_LEN..];
    assert_eq!(body.len(), 8 + 2 * 16);
    assert_eq!(&body[0..8], &[2, 0, 2, 0, 9, 0, 0, 0]);
    assert_eq!(
        &body[8..24],
        &[10, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 2, 0, 0, 0]
    );
    for n in 0..body.len() {
        assert!(
            Message::decode(MessageType::Commit, &body[..n]).is_err(),
            "{n} bytes"
        );
    }
    let mut zero = body.to_vec();
    zero[2] = 0;
    assert_eq!(
        Message::decode(MessageType::Commit, &zero[..8]),
        Err(WireError::OutOfRange {
            what: "commit range count",
            value: 0
        })
    );
    let mut other = body.to_vec();
    other[8 + 12] = 5; // the first range names bu 5
    assert!(matches!(
        Message::decode(MessageType::Commit, &other),
        Err(WireError::OutOfRange {
            what: "commit range of another BU",
            ..
        })
    ));
    let mut empty = body.to_vec();
    empty[8 + 8] = 0; // the first range's count
    assert!(Message::decode(MessageType::Commit, &empty).is_err());
    let mut too_many = body.to_vec();
    too_many[2..4].copy_from_slice(&((MAX_COMMIT_RANGES + 1) as u16).to_le_bytes());
    assert!(Message::decode(MessageType::Commit, &too_many).is_err());
    let c = Message::Committed { bu: 2, part: 9 }.encode();
    let mut bad = c[MESSAGE_HEADER_LEN..].to_vec();
    bad[3] = 1;
    assert!(Message::decode(MessageType::Committed, &bad).is_err());
}

/// The fragment header's bytes are exactly protocol.md's layout, field by field, with the
/// CRC32C of the first 28 bytes (whatever way the encoder computes it).
#[test]
fn fragment_header_bytes_follow_the_layout() {
    let h = FragmentHeader {
        event_id: 0x0102_0304_0506_0708,
        trigger_number: 0x1112_1314,
        source_id: 0x2122,
        flags: FLAG_GENERATED | FLAG_SUPER,
        payload_size: 0x3132_3334,
        payload_crc: 0x4142_4344,
    };
    let mut expected = Vec::new();
    expected.extend_from_slice(&h.event_id.to_le_bytes());
    expected.extend_from_slice(&h.trigger_number.to_le_bytes());
    expected.extend_from_slice(&h.source_id.to_le_bytes());
    expected.extend_from_slice(&h.flags.to_le_bytes());
    expected.extend_from_slice(&h.payload_size.to_le_bytes());
    expected.extend_from_slice(&h.payload_crc.to_le_bytes());
    expected.extend_from_slice(&[0; 4]);
    let crc = crc32c::crc32c(&expected);
    expected.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(h.encode().to_vec(), expected);
    let prefix = fragment_prefix(&h);
    assert_eq!(&prefix[MESSAGE_HEADER_LEN..], &expected[..]);
    let mut direct = [0xaa; FRAGMENT_PREFIX_LEN];
    write_fragment_prefix(&h, &mut direct);
    assert_eq!(direct, prefix);
    assert_eq!(FragmentHeader::decode(&expected).unwrap(), h);
}

/// The decoder reads the header as four words: it must give what reading each field at its
/// offset gives, for any bytes, and reject a reserved word or an unknown flag that a valid
/// CRC covers with their own errors (not as a checksum failure).
#[test]
fn fragment_header_decodes_as_its_fields_at_their_offsets() {
    let field = |b: &[u8], at: usize, n: usize| {
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(&b[at..at + n]);
        u64::from_le_bytes(v)
    };
    let sealed = |mut b: [u8; FRAGMENT_HEADER_LEN]| {
        let crc = crc32c::crc32c(&b[..28]);
        b[28..].copy_from_slice(&crc.to_le_bytes());
        b
    };
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut read = 0;
    for i in 0..2000 {
        let mut b = [0u8; FRAGMENT_HEADER_LEN];
        for byte in b[..24].iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *byte = x as u8;
        }
        if i % 2 == 0 {
            // known flags only (random ones almost never are)
            let known = crate::fragment::KNOWN_FLAGS.to_le_bytes();
            b[14] &= known[0];
            b[15] &= known[1];
        }
        let b = sealed(b);
        let flags = field(&b, 14, 2) as u16;
        match FragmentHeader::decode(&b) {
            Ok(h) => {
                assert_eq!(flags & !crate::fragment::KNOWN_FLAGS, 0, "{b:02x?}");
                assert_eq!(h.event_id, field(&b, 0, 8));
                assert_eq!(h.trigger_number as u64, field(&b, 8, 4));
                assert_eq!(h.source_id as u64, field(&b, 12, 2));
                assert_eq!(h.flags, flags);
                assert_eq!(h.payload_size as u64, field(&b, 16, 4));
                assert_eq!(h.payload_crc as u64, field(&b, 20, 4));
                assert_eq!(h.encode(), b);
                read += 1;
            }
            Err(e) => {
                assert_ne!(
                    flags & !crate::fragment::KNOWN_FLAGS,
                    0,
                    "{e:?} for {b:02x?}"
                );
                assert!(matches!(e, WireError::OutOfRange { .. }), "{e:?}");
            }
        }
        // a reserved byte set, the CRC made to cover it
        let mut r = b;
        r[24 + (x % 4) as usize] = 1;
        assert!(matches!(
            FragmentHeader::decode(&sealed(r)),
            Err(WireError::ReservedNonZero { .. })
        ));
        // the CRC itself damaged
        let mut c = b;
        c[28 + (x % 4) as usize] ^= 0x40;
        assert!(matches!(
            FragmentHeader::decode(&c),
            Err(WireError::HeaderChecksum { .. })
        ));
    }
    assert_eq!(read, 1000);
}

fn ranges(bu: u16, from: u64, n: usize) -> Vec<EventRange> {
    (0..n as u64)
        .map(|k| EventRange {
            bu,
            first: from + 10 * k,
            count: 3,
        })
        .collect()
}

/// A resync too long for one message goes in several, each within the limit, and the new
/// EVM joins them back into what the node sent, through the bytes.
#[test]
fn resyncs_split_travel_and_join_back() {
    use crate::resync::{BuResync, RuResync, MAX_RESYNC_RANGES};
    let ru = RuResync {
        ru: 3,
        known_until: 200_000,
        holds: ranges(1, 0, MAX_RESYNC_RANGES * 2 + 5),
        stopping: true,
    };
    let bu = BuResync {
        bu: 2,
        free_credits: 17,
        building: ranges(2, 0, 10),
        unassigned: ranges(2, 5, 2),
        unacked: ranges(2, 100, MAX_RESYNC_RANGES),
        recent: ranges(2, 7, 300),
        accepted: ranges(2, 9, 4),
        committed: ranges(2, 1, 1),
        parts: vec![(7, ranges(2, 50, 3000)), (8, ranges(2, 60, 2))],
        built: 12_345,
        built_id_sum: 99,
        stopping: false,
    };
    let mut back_ru: Option<RuResync> = None;
    let parts = ru.split();
    assert_eq!(parts.len(), 3);
    for (k, (part, more)) in parts.iter().enumerate() {
        let msg = Message::ResyncRu {
            resync: part.clone(),
            more: *more,
        };
        let bytes = msg.encode();
        let h = MessageHeader::decode(&bytes[..MESSAGE_HEADER_LEN]).unwrap();
        let Message::ResyncRu { resync, more } =
            Message::decode(h.msg_type, &bytes[MESSAGE_HEADER_LEN..]).unwrap()
        else {
            panic!("not a ResyncRu")
        };
        assert_eq!(more, k + 1 < parts.len());
        match &mut back_ru {
            Some(r) => r.absorb(resync),
            None => back_ru = Some(resync),
        }
    }
    assert_eq!(back_ru.unwrap(), ru);
    let mut back_bu: Option<BuResync> = None;
    let parts = bu.split();
    assert_eq!(parts.len(), 2, "7,319 ranges: two messages");
    for (part, more) in parts {
        let bytes = Message::ResyncBu {
            resync: Box::new(part),
            more,
        }
        .encode();
        let Message::ResyncBu { resync, .. } =
            Message::decode(MessageType::ResyncBu, &bytes[MESSAGE_HEADER_LEN..]).unwrap()
        else {
            panic!("not a ResyncBu")
        };
        match &mut back_bu {
            Some(b) => b.absorb(*resync),
            None => back_bu = Some(*resync),
        }
    }
    assert_eq!(back_bu.unwrap(), bu);
}

/// Malformed resyncs are refused with a typed error, never a panic.
#[test]
fn resync_bodies_are_checked() {
    use crate::resync::{BuResync, RuResync, MAX_RESYNC_RANGES};
    let ru = Message::ResyncRu {
        resync: RuResync {
            ru: 0,
            known_until: 100,
            holds: ranges(1, 0, 3),
            stopping: false,
        },
        more: false,
    }
    .encode();
    let body = &ru[MESSAGE_HEADER_LEN..];
    assert!(Message::decode(MessageType::ResyncRu, body).is_ok());
    let mut flags = body.to_vec();
    flags[2] = 4;
    assert_eq!(
        Message::decode(MessageType::ResyncRu, &flags),
        Err(WireError::ReservedNonZero { what: "resync ru" })
    );
    let mut past = body.to_vec();
    past[8..16].copy_from_slice(&5u64.to_le_bytes()); // known_until below a held range
    assert!(matches!(
        Message::decode(MessageType::ResyncRu, &past),
        Err(WireError::OutOfRange { .. })
    ));
    let mut count = body.to_vec();
    count[4..8].copy_from_slice(&((MAX_RESYNC_RANGES + 1) as u32).to_le_bytes());
    assert!(Message::decode(MessageType::ResyncRu, &count).is_err());
    assert!(Message::decode(MessageType::ResyncRu, &body[..body.len() - 1]).is_err());
    assert!(Message::decode(MessageType::ResyncRu, &body[..10]).is_err());

    let bu = Message::ResyncBu {
        resync: Box::new(BuResync {
            bu: 4,
            building: ranges(4, 0, 2),
            parts: vec![(1, ranges(4, 40, 2))],
            ..BuResync::default()
        }),
        more: true,
    }
    .encode();
    let body = &bu[MESSAGE_HEADER_LEN..];
    assert!(Message::decode(MessageType::ResyncBu, body).is_ok());
    let mut other = body.to_vec();
    other[52 + 12] = 5; // the first range names bu 5
    assert!(matches!(
        Message::decode(MessageType::ResyncBu, &other),
        Err(WireError::OutOfRange {
            what: "resync bu range of another BU",
            ..
        })
    ));
    let mut extra = body.to_vec();
    extra.push(0);
    assert!(Message::decode(MessageType::ResyncBu, &extra).is_err());
    assert!(Message::decode(MessageType::ResyncBu, &body[..body.len() - 8]).is_err());
    let mut huge = body.to_vec();
    huge[48..52].copy_from_slice(&u32::MAX.to_le_bytes()); // parts count
    assert!(Message::decode(MessageType::ResyncBu, &huge).is_err());
    let mut empty = body.to_vec();
    empty[52 + 8] = 0; // the first range's count
    assert!(Message::decode(MessageType::ResyncBu, &empty).is_err());
}

/// The active EVM's word to its standby travels intact; a role that cannot be dropped (the
/// EVM) or reserved bits are refused.
#[test]
fn follow_bodies_are_checked() {
    use crate::resync::Follow;
    let f = Follow {
        elapsed_ms: 1234,
        stop_requested: true,
        over: false,
        paused: true,
        epoch: 3,
        dropped: vec![(Role::Bu, 3), (Role::Ru, 1)],
        max_events: 77,
        decisions_final: 0x0102_0304,
        since_ms: 1_795_000_000_123,
    };
    let bytes = Message::Follow(f.clone()).encode();
    let body = &bytes[MESSAGE_HEADER_LEN..];
    assert_eq!(
        Message::decode(MessageType::Follow, body),
        Ok(Message::Follow(f))
    );
    // bytes 24–31: the decisions final
    assert_eq!(&body[24..28], &[4, 3, 2, 1]);
    // bytes 32–39: when the run's output began
    assert_eq!(&body[32..40], &1_795_000_000_123u64.to_le_bytes());
    let mut evm = body.to_vec();
    evm[40] = 0; // role 0: the EVM
    assert!(Message::decode(MessageType::Follow, &evm).is_err());
    // bit 2: paused
    assert_eq!(body[8], 1 | 4);
    // bytes 14–15: the EVM's epoch
    assert_eq!(&body[14..16], &[3, 0]);
    let mut flags = body.to_vec();
    flags[8] = 8;
    assert!(Message::decode(MessageType::Follow, &flags).is_err());
    assert!(Message::decode(MessageType::Follow, &body[..body.len() - 2]).is_err());
}

/// A standby's fence travels intact; epoch 0 (the first EVM's, never a fence), reserved
/// bytes and other lengths are refused.
#[test]
fn fence_bodies_are_checked() {
    let bytes = Message::Fence { epoch: 2 }.encode();
    let body = &bytes[MESSAGE_HEADER_LEN..];
    assert_eq!(body, &[2, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        Message::decode(MessageType::Fence, body),
        Ok(Message::Fence { epoch: 2 })
    );
    assert!(Message::decode(MessageType::Fence, &[0; 8]).is_err());
    assert!(Message::decode(MessageType::Fence, &[1, 0, 0, 0, 0, 0, 0, 1]).is_err());
    assert!(Message::decode(MessageType::Fence, &body[..6]).is_err());
    assert_eq!(MessageType::from_u16(0x0022), Ok(MessageType::Fence));
}

/// An EVM's term travels intact, epoch 0 (the first EVM's) included; reserved bytes and
/// other lengths are refused.
#[test]
fn term_bodies_are_checked() {
    for epoch in [0u16, 1, 0xfffe] {
        let bytes = Message::Term { epoch }.encode();
        let body = &bytes[MESSAGE_HEADER_LEN..];
        assert_eq!(body.len(), 8);
        assert_eq!(
            Message::decode(MessageType::Term, body),
            Ok(Message::Term { epoch })
        );
    }
    assert!(Message::decode(MessageType::Term, &[1, 0, 0, 0, 0, 0, 1, 0]).is_err());
    assert!(Message::decode(MessageType::Term, &[1, 0, 0, 0, 0, 0]).is_err());
    assert!(Message::decode(MessageType::Term, &[1, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
    assert_eq!(MessageType::from_u16(0x0023), Ok(MessageType::Term));
}

/// The windows of records decided from outside travel intact, with the components each
/// names; a window that does not end after it begins, components out of order or twice or
/// too many, reserved or padding bytes, a count of 0 or too many, and every other length
/// are refused, and every bit flipped in the counts, reserved bytes or padding is noticed.
/// A long list is split within the limits and joins back.
#[test]
fn window_bodies_are_checked() {
    use crate::window::{DecisionWindow, MAX_WINDOW_COMPONENTS};
    let some = DecisionWindow {
        begin: 1000,
        end: 2500,
        components: vec![3, 9, 700],
    };
    let m = Message::Window {
        first: 41,
        windows: vec![
            DecisionWindow {
                begin: 0,
                end: 1,
                components: vec![5],
            },
            some.clone(),
            DecisionWindow::all(u64::MAX - 1, u64::MAX),
        ],
    };
    let bytes = m.encode();
    let body = &bytes[MESSAGE_HEADER_LEN..];
    // 20 + 2·3 bytes padded to 32
    assert_eq!(body.len(), 16 + 24 + 32 + 24);
    assert_eq!(Message::decode(MessageType::Window, body), Ok(m));
    assert_eq!(MessageType::from_u16(0x0024), Ok(MessageType::Window));
    for cut in 0..body.len() {
        assert!(
            Message::decode(MessageType::Window, &body[..cut]).is_err(),
            "{cut}"
        );
    }
    let mut longer = body.to_vec();
    longer.extend_from_slice(&[0; 24]);
    assert!(Message::decode(MessageType::Window, &longer).is_err());
    // the count (bytes 8..12), reserved (12..16), the first entry's component count and
    // reserved (16..20 of it: one component, then padding), the second's reserved (18..20)
    // and padding (26..32)
    let second = 16 + 24;
    for i in (8..16)
        .chain(16 + 16..16 + 20)
        .chain(second + 18..second + 20)
        .chain(second + 26..second + 32)
    {
        for bit in 0..8 {
            let mut bad = body.to_vec();
            bad[i] ^= 1 << bit;
            assert!(
                Message::decode(MessageType::Window, &bad).is_err(),
                "byte {i} bit {bit} went unnoticed"
            );
        }
    }
    // a window that ends where it begins
    let mut bad = body.to_vec();
    bad[second + 8..second + 16].copy_from_slice(&1000u64.to_le_bytes());
    assert!(Message::decode(MessageType::Window, &bad).is_err());
    // components out of order, and one twice
    for list in [[9u16, 3, 700], [3, 3, 700]] {
        let mut bad = body.to_vec();
        for (i, c) in list.iter().enumerate() {
            bad[second + 20 + 2 * i..second + 22 + 2 * i].copy_from_slice(&c.to_le_bytes());
        }
        assert!(
            Message::decode(MessageType::Window, &bad).is_err(),
            "{list:?}"
        );
    }
    let many = Message::Window {
        first: 0,
        windows: vec![DecisionWindow {
            begin: 0,
            end: 1,
            components: (0..=MAX_WINDOW_COMPONENTS as u16).collect(),
        }],
    }
    .encode();
    assert!(Message::decode(MessageType::Window, &many[MESSAGE_HEADER_LEN..]).is_err());
    let empty = Message::Window {
        first: 0,
        windows: vec![],
    }
    .encode();
    assert!(Message::decode(MessageType::Window, &empty[MESSAGE_HEADER_LEN..]).is_err());
    // a long list: split within the limits, joined back in order
    let list: Vec<DecisionWindow> = (0..9000u64)
        .map(|k| DecisionWindow {
            begin: k,
            end: k + 5,
            components: (0..(k % 300) as u16).collect(),
        })
        .collect();
    let mut joined = Vec::new();
    for part in Message::windows(7, &list) {
        let bytes = part.encode();
        assert!(bytes.len() - MESSAGE_HEADER_LEN <= crate::MAX_WINDOW_BODY);
        let Message::Window { first, windows } =
            Message::decode(MessageType::Window, &bytes[MESSAGE_HEADER_LEN..]).unwrap()
        else {
            panic!("not a Window")
        };
        assert_eq!(first, 7 + joined.len() as u64);
        joined.extend(windows);
    }
    assert_eq!(joined, list);
}

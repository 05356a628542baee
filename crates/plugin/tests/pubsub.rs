//! The pub/sub sockets of evb-plugin over real sockets on 127.0.0.1 (tcp and shm): tag
//! filtering, order under policy block, gaps under policy drop, subscribe/unsubscribe,
//! several publishers, the end of a publisher, errors.

use std::collections::HashMap;
use std::thread;
use std::time::Duration;

use evb_plugin::pubsub::{
    parse_tags, Delivery, GoodbyeCode, PubOptions, PubSocket, Received, SlowPolicy, SubOptions,
    SubSocket, TagRange, TransportKind,
};
use evb_plugin::Error;

const LONG: Option<Duration> = Some(Duration::from_secs(30));

/// A payload that names its tag and sequence number, `size` bytes (at least 16).
fn payload(tag: u64, seq: u64, size: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..size)
        .map(|i| (i as u64 * 7 + tag + seq) as u8)
        .collect();
    v[..8].copy_from_slice(&tag.to_le_bytes());
    v[8..16].copy_from_slice(&seq.to_le_bytes());
    v
}

/// What a subscriber took until every publisher said goodbye and closed.
#[derive(Default, Debug)]
struct Took {
    /// (publisher, tag) → sequence numbers received, in order.
    seqs: HashMap<(usize, u64), Vec<u64>>,
    /// (publisher, tag) → missed, summed over gaps.
    missed: HashMap<(usize, u64), u64>,
    bad_payloads: u64,
    goodbyes: Vec<(usize, GoodbyeCode, String)>,
    closed: usize,
}

fn take_all(sub: &mut SubSocket, size: usize) -> Took {
    let mut t = Took::default();
    while let Some(r) = sub.recv(LONG).unwrap() {
        match r {
            Received::Message {
                publisher,
                tag,
                seq,
                payload: p,
            } => {
                if !p.eq_bytes(&payload(tag, seq, size)) {
                    t.bad_payloads += 1;
                }
                t.seqs.entry((publisher, tag)).or_default().push(seq);
            }
            Received::Gap {
                publisher,
                tag,
                missed,
            } => *t.missed.entry((publisher, tag)).or_default() += missed,
            Received::Goodbye {
                publisher,
                code,
                reason,
            } => t.goodbyes.push((publisher, code, reason)),
            Received::Closed { .. } => t.closed += 1,
        }
    }
    assert_eq!(sub.open_publishers(), 0);
    t
}

fn pub_opts(kind: TransportKind, policy: SlowPolicy) -> PubOptions {
    PubOptions {
        transport: kind,
        run_id: "pstest".into(),
        policy,
        ..PubOptions::default()
    }
}

fn sub_opts(kind: TransportKind, delivery: Delivery) -> SubOptions {
    SubOptions {
        transport: kind,
        run_id: "pstest".into(),
        delivery,
        ..SubOptions::default()
    }
}

/// Two subscribers of different tags on threads of their own, a publisher of tags 0..10
/// under policy block: each gets every message of its tags, in order, and nothing else.
fn filtering_and_order(kind: TransportKind, size: usize, per_tag: u64) {
    let mut p = PubSocket::bind("127.0.0.1:0", pub_opts(kind, SlowPolicy::Block)).unwrap();
    let addr = p.local_addr().to_string();
    let subs: Vec<_> = [("2,5-7", Delivery::Throughput), ("0,9", Delivery::Latency)]
        .into_iter()
        .map(|(tags, delivery)| {
            let addr = addr.clone();
            let tags = parse_tags(tags).unwrap();
            let mut s =
                SubSocket::connect(&[addr.as_str()], &tags, sub_opts(kind, delivery)).unwrap();
            thread::spawn(move || take_all(&mut s, size))
        })
        .collect();
    assert_eq!(p.wait_subscribers(2, LONG).unwrap(), 2);
    assert_eq!(p.subscribers_of(6), 1);
    assert_eq!(p.subscribers_of(3), 0);
    let mut delivered = 0;
    for seq in 0..per_tag {
        for tag in 0..10u64 {
            let sent = p.publish(tag, &payload(tag, seq, size)).unwrap();
            assert_eq!(sent.dropped, 0);
            delivered += sent.delivered;
        }
    }
    let stats = p.close("test over").unwrap();
    assert_eq!(stats.published, 10 * per_tag);
    assert_eq!(stats.delivered as usize, delivered);
    assert_eq!(delivered as u64, 6 * per_tag);
    assert_eq!(stats.dropped, 0);
    let want: [&[u64]; 2] = [&[2, 5, 6, 7], &[0, 9]];
    for (h, tags) in subs.into_iter().zip(want) {
        let t = h.join().unwrap();
        assert_eq!(t.bad_payloads, 0);
        assert!(t.missed.is_empty(), "{:?}", t.missed);
        let mut got: Vec<u64> = t.seqs.keys().map(|&(_, tag)| tag).collect();
        got.sort_unstable();
        assert_eq!(got, tags, "tags received");
        for tag in tags {
            let seqs = &t.seqs[&(0, *tag)];
            assert_eq!(seqs.len() as u64, per_tag, "tag {tag}");
            assert!(
                seqs.iter().copied().eq(0..per_tag),
                "tag {tag} out of order"
            );
        }
        assert_eq!(t.goodbyes.len(), 1);
        assert_eq!(t.goodbyes[0].1, GoodbyeCode::Shutdown);
        assert_eq!(t.goodbyes[0].2, "test over");
        assert_eq!(t.closed, 1);
    }
}

#[test]
fn tcp_tags_are_filtered_exactly_and_arrive_in_order_under_block() {
    // small messages, and messages larger than a receive block (chains)
    filtering_and_order(TransportKind::Tcp, 100, 2000);
    filtering_and_order(TransportKind::Tcp, 100_000, 30);
}

#[test]
fn shm_tags_are_filtered_exactly_and_arrive_in_order_under_block() {
    filtering_and_order(TransportKind::Shm, 100, 2000);
    filtering_and_order(TransportKind::Shm, 100_000, 30);
}

#[test]
fn block_holds_the_publisher_back_until_a_slow_subscriber_reads() {
    // max_queued at its least: the publisher waits for the subscriber again and again
    let opts = PubOptions {
        max_queued: 4096,
        ..pub_opts(TransportKind::Tcp, SlowPolicy::Block)
    };
    let mut p = PubSocket::bind("127.0.0.1:0", opts).unwrap();
    let addr = p.local_addr().to_string();
    let mut s = SubSocket::connect(
        &[addr.as_str()],
        &[TagRange::one(1)],
        sub_opts(TransportKind::Tcp, Delivery::Throughput),
    )
    .unwrap();
    let h = thread::spawn(move || {
        let mut n = 0u64;
        let mut t = Took::default();
        while let Some(r) = s.recv(LONG).unwrap() {
            if let Received::Message {
                tag,
                seq,
                payload: pl,
                ..
            } = r
            {
                t.bad_payloads += u64::from(!pl.eq_bytes(&payload(tag, seq, 8192)));
                t.seqs.entry((0, tag)).or_default().push(seq);
                n += 1;
                if n.is_multiple_of(100) {
                    thread::sleep(Duration::from_millis(1));
                }
            }
        }
        t
    });
    p.wait_subscribers(1, LONG).unwrap();
    const N: u64 = 3000; // 24 MB: more than the kernel's socket buffers hold
    for seq in 0..N {
        let sent = p.publish(1, &payload(1, seq, 8192)).unwrap();
        assert_eq!(sent.delivered, 1);
    }
    let stats = p.close("done").unwrap();
    let t = h.join().unwrap();
    assert_eq!(t.bad_payloads, 0);
    assert!(t.seqs[&(0, 1)].iter().copied().eq(0..N));
    assert_eq!(stats.dropped, 0);
    assert_eq!(stats.delivered, N);
    assert!(
        stats.would_block > 0,
        "the publisher never had to wait: {stats:?}"
    );
}

/// Polls both sides until the publisher has the subscriber's subscription; the subscriber
/// gets nothing meanwhile.
fn meet(p: &mut PubSocket, s: &mut SubSocket) {
    while p.subscribed() < 1 {
        assert!(s.recv(Some(Duration::from_millis(5))).unwrap().is_none());
        p.poll(Duration::from_millis(5)).unwrap();
    }
}

#[test]
fn a_block_timeout_sends_nothing_and_says_why() {
    let opts = PubOptions {
        max_queued: 4096,
        block_timeout: Some(Duration::from_millis(20)),
        ..pub_opts(TransportKind::Tcp, SlowPolicy::Block)
    };
    let mut p = PubSocket::bind("127.0.0.1:0", opts).unwrap();
    let addr = p.local_addr().to_string();
    // a subscriber that stops reading once subscribed
    let mut s = SubSocket::connect(
        &[addr.as_str()],
        &[TagRange::one(3)],
        sub_opts(TransportKind::Tcp, Delivery::Latency),
    )
    .unwrap();
    meet(&mut p, &mut s);
    let big = vec![0u8; 64 * 1024];
    let mut sent = 0u64;
    let err = loop {
        match p.publish(3, &big) {
            Ok(_) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent < 100_000, "never blocked");
    };
    assert!(matches!(err, Error::Timeout(_)), "{err:?}");
    assert!(err.to_string().contains("tag 3"), "{err}");
    assert_eq!(p.stats().published, sent);
    // another tag, nobody's: not held back
    assert_eq!(p.publish(4, &big).unwrap().delivered, 0);
}

#[test]
fn drop_tells_a_subscriber_that_did_not_read_what_it_missed() {
    const SIZE: usize = 16384;
    let opts = PubOptions {
        max_queued: 4096,
        ..pub_opts(TransportKind::Tcp, SlowPolicy::Drop)
    };
    let mut p = PubSocket::bind("127.0.0.1:0", opts).unwrap();
    let addr = p.local_addr().to_string();
    let mut s = SubSocket::connect(
        &[addr.as_str()],
        &parse_tags("1-2").unwrap(),
        sub_opts(TransportKind::Tcp, Delivery::Throughput),
    )
    .unwrap();
    meet(&mut p, &mut s);
    // 64 MB for a subscriber that does not read: more than the kernel's buffers hold
    const N: u64 = 2000;
    let mut dropped = 0;
    for seq in 0..N {
        for tag in [1, 2, 3] {
            let sent = p.publish(tag, &payload(tag, seq, SIZE)).unwrap();
            assert_eq!(
                sent.delivered + sent.dropped,
                usize::from(tag != 3),
                "tag {tag}"
            );
            dropped += sent.dropped as u64;
        }
    }
    assert!(dropped > 0, "nothing was dropped");
    // now it reads; the publisher goes on polling (the gaps of a subscriber that caught up)
    let mut t = Took::default();
    let mut next: HashMap<u64, u64> = HashMap::new();
    let mut accounted = 0;
    while accounted < 2 * N {
        p.poll(Duration::ZERO).unwrap();
        match s.recv(Some(Duration::from_millis(5))).unwrap() {
            Some(Received::Message {
                tag,
                seq,
                payload: pl,
                ..
            }) => {
                t.bad_payloads += u64::from(!pl.eq_bytes(&payload(tag, seq, SIZE)));
                // in order, anything skipped announced by a gap before
                let n = next.entry(tag).or_default();
                assert_eq!(seq, *n, "tag {tag}");
                *n = seq + 1;
                t.seqs.entry((0, tag)).or_default().push(seq);
                accounted += 1;
            }
            Some(Received::Gap { tag, missed, .. }) => {
                *next.entry(tag).or_default() += missed;
                *t.missed.entry((0, tag)).or_default() += missed;
                accounted += missed;
            }
            Some(other) => panic!("{other:?}"),
            None => {}
        }
    }
    assert_eq!(accounted, 2 * N);
    assert_eq!(t.bad_payloads, 0);
    let missed: u64 = t.missed.values().sum();
    assert_eq!(missed, dropped);
    for tag in [1, 2] {
        let got = t.seqs.get(&(0, tag)).map_or(0, Vec::len) as u64;
        let lost = t.missed.get(&(0, tag)).copied().unwrap_or(0);
        assert_eq!(got + lost, N, "tag {tag}");
        assert_eq!(next[&tag], N, "tag {tag}");
    }
    assert!(!t.seqs.keys().any(|&(_, tag)| tag == 3));
    let st = p.stats();
    assert_eq!(st.dropped, dropped);
    assert_eq!(st.delivered + st.dropped, 2 * N);
    assert_eq!(s.stats().missed, dropped);
}

#[test]
fn subscribe_and_unsubscribe_change_what_arrives() {
    let mut p = PubSocket::bind(
        "127.0.0.1:0",
        pub_opts(TransportKind::Tcp, SlowPolicy::Block),
    )
    .unwrap();
    let addr = p.local_addr().to_string();
    let mut s = SubSocket::connect(
        &[addr.as_str()],
        &[TagRange::one(1)],
        sub_opts(TransportKind::Tcp, Delivery::Latency),
    )
    .unwrap();
    meet(&mut p, &mut s);
    let round = |p: &mut PubSocket, s: &mut SubSocket, want: usize| -> Vec<u64> {
        for tag in 1..=4u64 {
            p.publish(tag, &tag.to_le_bytes()).unwrap();
        }
        p.flush().unwrap();
        let mut tags = Vec::new();
        while tags.len() < want {
            p.poll(Duration::ZERO).unwrap();
            if let Some(Received::Message { tag, payload, .. }) =
                s.recv(Some(Duration::from_millis(5))).unwrap()
            {
                assert_eq!(payload.to_vec(), tag.to_le_bytes());
                tags.push(tag);
            }
        }
        tags
    };
    assert_eq!(round(&mut p, &mut s, 1), vec![1]);
    s.subscribe(&parse_tags("3-4").unwrap()).unwrap();
    while p.subscribers_of(4) == 0 {
        p.poll(Duration::from_millis(5)).unwrap();
    }
    assert_eq!(round(&mut p, &mut s, 3), vec![1, 3, 4]);
    s.unsubscribe(&[TagRange::one(1), TagRange::one(3)])
        .unwrap();
    while p.subscribers_of(1) == 1 {
        p.poll(Duration::from_millis(5)).unwrap();
    }
    assert_eq!(round(&mut p, &mut s, 1), vec![4]);
    // and nothing else came: the publisher's count says so
    assert_eq!(p.stats().delivered, 5);
    p.close("bye").unwrap();
    let mut rest = Vec::new();
    while let Some(r) = s.recv(LONG).unwrap() {
        rest.push(r);
    }
    assert!(
        matches!(
            rest[..],
            [Received::Goodbye { .. }, Received::Closed { .. }]
        ),
        "{rest:?}"
    );
    assert!(matches!(p.publish(1, b"x"), Err(Error::State(_))));
}

#[test]
fn one_subscriber_of_several_publishers_knows_which_is_which() {
    let mut pubs: Vec<PubSocket> = (0..3)
        .map(|_| {
            PubSocket::bind(
                "127.0.0.1:0",
                pub_opts(TransportKind::Tcp, SlowPolicy::Block),
            )
            .unwrap()
        })
        .collect();
    let addrs: Vec<String> = pubs.iter().map(|p| p.local_addr().to_string()).collect();
    let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    let mut s = SubSocket::connect(
        &refs,
        &[TagRange { first: 0, last: 9 }],
        sub_opts(TransportKind::Tcp, Delivery::Throughput),
    )
    .unwrap();
    let h = thread::spawn(move || take_all(&mut s, 32));
    for (i, p) in pubs.iter_mut().enumerate() {
        p.wait_subscribers(1, LONG).unwrap();
        for seq in 0..100 {
            p.publish(i as u64, &payload(i as u64, seq, 32)).unwrap();
            p.publish(20, &payload(20, seq, 32)).unwrap(); // nobody's
        }
    }
    for p in &mut pubs {
        p.close("done").unwrap();
    }
    let t = h.join().unwrap();
    assert_eq!(t.bad_payloads, 0);
    let mut keys: Vec<_> = t.seqs.keys().copied().collect();
    keys.sort_unstable();
    assert_eq!(keys, vec![(0, 0), (1, 1), (2, 2)]);
    for k in keys {
        assert!(t.seqs[&k].iter().copied().eq(0..100));
    }
    assert_eq!(t.goodbyes.len(), 3);
    assert_eq!(t.closed, 3);
}

#[test]
fn bad_input_is_an_error_that_names_it() {
    let e = PubSocket::bind("no-port-here", PubOptions::default())
        .err()
        .unwrap();
    assert!(
        matches!(e, Error::Setup(_)) && e.to_string().contains("no-port-here"),
        "{e}"
    );
    let mut p = PubSocket::bind(
        "127.0.0.1:0",
        PubOptions {
            max_message: 100,
            ..PubOptions::default()
        },
    )
    .unwrap();
    let e = p.publish(1, &[0; 101]).unwrap_err();
    assert!(
        matches!(e, Error::Size { size: 101, .. }) && e.to_string().contains("max_message 100"),
        "{e}"
    );
    let e = SubSocket::connect(&[], &[TagRange::one(1)], SubOptions::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("no publisher address"), "{e}");
    let e = SubSocket::connect(&["127.0.0.1:1"], &[], SubOptions::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("no tags"), "{e}");
    // nobody listens there: the connection's end says why
    let mut s =
        SubSocket::connect(&["127.0.0.1:1"], &[TagRange::one(1)], SubOptions::default()).unwrap();
    match s.recv(LONG).unwrap() {
        Some(Received::Closed {
            publisher: 0,
            reason,
        }) => assert!(!reason.is_empty()),
        other => panic!("{other:?}"),
    }
    assert!(s.recv(LONG).unwrap().is_none());
    // limits past what an Instant holds are no limit, not a panic
    assert!(s.recv(Some(Duration::MAX)).unwrap().is_none());
    let mut p = PubSocket::bind(
        "127.0.0.1:0",
        PubOptions {
            block_timeout: Some(Duration::MAX),
            linger: Duration::MAX,
            ..PubOptions::default()
        },
    )
    .unwrap();
    assert_eq!(p.wait_subscribers(0, Some(Duration::MAX)).unwrap(), 0);
    assert_eq!(p.publish(1, b"x").unwrap().delivered, 0);
    assert!(p.drain(Duration::MAX).unwrap());
    p.close("bye").unwrap();
    // a different run id is refused at the handshake
    let mut p = PubSocket::bind("127.0.0.1:0", PubOptions::default()).unwrap();
    let addr = p.local_addr().to_string();
    let mut s = SubSocket::connect(
        &[addr.as_str()],
        &[TagRange::one(1)],
        SubOptions {
            run_id: "other".into(),
            ..SubOptions::default()
        },
    )
    .unwrap();
    let h = thread::spawn(move || s.recv(LONG).unwrap());
    while !h.is_finished() {
        p.poll(Duration::from_millis(5)).unwrap();
    }
    match h.join().unwrap() {
        Some(Received::Closed { reason, .. }) => assert!(!reason.is_empty()),
        other => panic!("{other:?}"),
    }
    assert_eq!(p.subscribers(), 0);
}

#[test]
fn a_shared_secret_lets_in_only_who_knows_it() {
    let secret = |s: &[u8]| Some(s.to_vec());
    let opts = PubOptions {
        secret: secret(b"s3cret"),
        ..pub_opts(TransportKind::Tcp, SlowPolicy::Block)
    };
    let mut p = PubSocket::bind("127.0.0.1:0", opts).unwrap();
    let addr = p.local_addr().to_string();
    let sub = |s: &[u8]| {
        SubSocket::connect(
            &[addr.as_str()],
            &[TagRange::one(1)],
            SubOptions {
                secret: secret(s),
                ..sub_opts(TransportKind::Tcp, Delivery::Latency)
            },
        )
        .unwrap()
    };
    let mut good = sub(b"s3cret");
    let mut bad = sub(b"guess");
    let h = thread::spawn(move || bad.recv(LONG).unwrap());
    meet(&mut p, &mut good);
    while !h.is_finished() {
        p.poll(Duration::from_millis(5)).unwrap();
    }
    match h.join().unwrap() {
        Some(Received::Closed { reason, .. }) => assert!(!reason.is_empty()),
        other => panic!("{other:?}"),
    }
    assert_eq!(p.subscribers(), 1);
    assert_eq!(p.publish(1, b"for those who know").unwrap().delivered, 1);
    p.flush().unwrap();
    match good.recv(LONG).unwrap() {
        Some(Received::Message { payload, .. }) => {
            assert_eq!(payload.to_vec(), b"for those who know")
        }
        other => panic!("{other:?}"),
    }
}

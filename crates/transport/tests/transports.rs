//! Both transports through the same checks: handshake, ordered delivery of frames from a few
//! bytes to several blocks, refusals, and (tcp) garbage from a raw socket.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use evb_buffers::{Pool, Slice};
use evb_transport::inproc::InprocTransport;
use evb_transport::tcp::TcpTransport;
use evb_transport::{CloseReason, ConnId, Event, Segment, Transport, TransportConfig};
use evb_wire::{Channel, FrameType, Hello, Role};

fn cfg(run: &str, node: &str, role: Role) -> TransportConfig {
    TransportConfig {
        run_id: run.into(),
        local: Hello::new(Channel::Data, role, 0, run, node),
        max_frame: 8 << 20,
        rx_pool: Pool::new(node, 64 * 1024, 512),
        secret: None,
    }
}

fn pump(
    ts: &mut [&mut dyn Transport],
    until: impl Fn(&[Vec<Event>]) -> bool,
    evs: &mut [Vec<Event>],
) {
    common::pump(ts, evs, "events", until)
}

fn payload(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|b| (b * 31 + i) as u8).collect()
}

fn ordered_delivery(mut a: Box<dyn Transport>, mut b: Box<dyn Transport>, addr: &str) {
    let bound = b.listen(addr).unwrap();
    let conn = a
        .connect(
            &bound,
            Hello::new(Channel::Data, Role::Ru, 0, "run1", "ru0"),
        )
        .unwrap();
    let mut evs = vec![Vec::new(), Vec::new()];
    pump(
        &mut [&mut *a, &mut *b],
        |e| e[0].iter().any(|e| matches!(e, Event::Connected { .. })) && !e[1].is_empty(),
        &mut evs,
    );
    let Event::Accepted { peer, conn: bconn } = &evs[1][0] else {
        panic!("{:?}", evs[1])
    };
    assert_eq!(peer.node_id, "ru0");
    let bconn = *bconn;
    evs.iter_mut().for_each(Vec::clear);

    // sizes from 1 byte to several receive blocks, some as shared pool slices
    let pool = Pool::new("tx", 4 << 20, 4);
    let sizes = [1usize, 7, 1000, 65_536, 65_537, 300_000, 4 << 20];
    let mut expect = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let data = payload(i, n);
        let seg = if i % 2 == 0 {
            let mut w = pool.try_alloc().unwrap();
            let s: Slice = w.append(&data).unwrap();
            Segment::Shared(s)
        } else {
            Segment::Owned(data.clone())
        };
        a.send(
            conn,
            FrameType::Messages,
            1,
            vec![Segment::Owned(vec![]), seg],
        )
        .unwrap();
        expect.push(data);
    }
    pump(
        &mut [&mut *a, &mut *b],
        |e| {
            e[1].iter()
                .filter(|e| matches!(e, Event::Frame { .. }))
                .count()
                == sizes.len()
        },
        &mut evs,
    );
    for (e, want) in evs[1].iter().zip(&expect) {
        let Event::Frame { frame, conn } = e else {
            panic!()
        };
        assert_eq!(*conn, bconn);
        assert_eq!(frame.payload.len(), want.len());
        assert!(frame.payload.eq_bytes(want));
    }
    evs.iter_mut().for_each(Vec::clear);
    a.close(conn);
    pump(
        &mut [&mut *a, &mut *b],
        |e| {
            e[1].iter().any(|e| {
                matches!(
                    e,
                    Event::Closed {
                        reason: CloseReason::PeerClosed,
                        ..
                    }
                )
            })
        },
        &mut evs,
    );
}

#[test]
fn tcp_delivers_frames_in_order() {
    let a = Box::new(TcpTransport::new(cfg("run1", "ru0", Role::Ru)).unwrap());
    let b = Box::new(TcpTransport::new(cfg("run1", "bu0", Role::Bu)).unwrap());
    ordered_delivery(a, b, "127.0.0.1:0");
}

#[test]
fn inproc_delivers_frames_in_order() {
    let a = Box::new(InprocTransport::new(cfg("run1", "ru0", Role::Ru)));
    let b = Box::new(InprocTransport::new(cfg("run1", "bu0", Role::Bu)));
    ordered_delivery(a, b, "inproc-order-test");
}

fn wrong_run_is_refused(mut a: Box<dyn Transport>, mut b: Box<dyn Transport>, addr: &str) {
    let bound = b.listen(addr).unwrap();
    let conn = a
        .connect(
            &bound,
            Hello::new(Channel::Data, Role::Ru, 0, "other-run", "ru0"),
        )
        .unwrap();
    let mut evs = vec![Vec::new(), Vec::new()];
    pump(&mut [&mut *a, &mut *b], |e| !e[0].is_empty(), &mut evs);
    match &evs[0][0] {
        Event::Closed {
            conn: c,
            reason: CloseReason::Rejected(why),
        } => {
            assert_eq!(*c, conn);
            assert!(why.contains("other-run"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert!(evs[1].iter().all(|e| !matches!(e, Event::Accepted { .. })));
}

#[test]
fn tcp_refuses_wrong_run() {
    let a = Box::new(TcpTransport::new(cfg("run1", "ru0", Role::Ru)).unwrap());
    let b = Box::new(TcpTransport::new(cfg("run1", "bu0", Role::Bu)).unwrap());
    wrong_run_is_refused(a, b, "127.0.0.1:0");
}

#[test]
fn inproc_refuses_wrong_run() {
    let a = Box::new(InprocTransport::new(cfg("run1", "ru0", Role::Ru)));
    let b = Box::new(InprocTransport::new(cfg("run1", "bu0", Role::Bu)));
    wrong_run_is_refused(a, b, "inproc-refuse-test");
}

#[test]
fn tcp_connect_to_nobody_fails_cleanly() {
    let mut a = TcpTransport::new(cfg("run1", "ru0", Role::Ru)).unwrap();
    // bind then drop to find a port nobody listens on
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let conn = a
        .connect(
            &format!("127.0.0.1:{port}"),
            Hello::new(Channel::Data, Role::Ru, 0, "run1", "ru0"),
        )
        .unwrap();
    let mut evs = vec![Vec::new()];
    pump(&mut [&mut a], |e| !e[0].is_empty(), &mut evs);
    assert!(
        matches!(&evs[0][0], Event::Closed { conn: c, reason: CloseReason::ConnectFailed(_) } if *c == conn)
    );
}

#[test]
fn tcp_garbage_peer_is_disconnected_and_others_carry_on() {
    let mut b = TcpTransport::new(cfg("run1", "bu0", Role::Bu)).unwrap();
    let bound = b.listen("127.0.0.1:0").unwrap();
    let mut good = TcpTransport::new(cfg("run1", "ru0", Role::Ru)).unwrap();
    let gconn = good
        .connect(
            &bound,
            Hello::new(Channel::Data, Role::Ru, 0, "run1", "ru0"),
        )
        .unwrap();

    let mut raw = std::net::TcpStream::connect(&bound).unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();

    let mut evs = vec![Vec::new(), Vec::new()];
    pump(
        &mut [&mut good, &mut b],
        |e| {
            e[1].iter().any(|e| {
                matches!(
                    e,
                    Event::Closed {
                        reason: CloseReason::Protocol(_),
                        ..
                    }
                )
            }) && e[0].iter().any(|e| matches!(e, Event::Connected { .. }))
        },
        &mut evs,
    );
    good.send(
        gconn,
        FrameType::Messages,
        1,
        vec![Segment::Owned(b"still here".to_vec())],
    )
    .unwrap();
    pump(
        &mut [&mut good, &mut b],
        |e| e[1].iter().any(|e| matches!(e, Event::Frame { .. })),
        &mut evs,
    );
    let got: Vec<ConnId> = evs[1]
        .iter()
        .filter_map(|e| {
            if let Event::Frame { conn, frame } = e {
                assert!(frame.payload.eq_bytes(b"still here"));
                Some(*conn)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(got.len(), 1);
}

#[test]
fn tcp_peer_death_is_reported_as_lost() {
    let mut b = TcpTransport::new(cfg("run1", "bu0", Role::Bu)).unwrap();
    let bound = b.listen("127.0.0.1:0").unwrap();
    let mut evs = vec![Vec::new()];
    {
        let mut a = TcpTransport::new(cfg("run1", "ru0", Role::Ru)).unwrap();
        a.connect(
            &bound,
            Hello::new(Channel::Data, Role::Ru, 0, "run1", "ru0"),
        )
        .unwrap();
        let mut aev = vec![Vec::new(), Vec::new()];
        pump(
            &mut [&mut a, &mut b],
            |e| !e[1].is_empty() && !e[0].is_empty(),
            &mut aev,
        );
        // `a` drops here without a Bye, as a killed process would
    }
    pump(
        &mut [&mut b],
        |e| e[0].iter().any(|e| matches!(e, Event::Closed { .. })),
        &mut evs,
    );
    assert!(evs[0].iter().any(|e| matches!(
        e,
        Event::Closed {
            reason: CloseReason::Lost(_),
            ..
        }
    )));
}

#[test]
fn tcp_stalled_receiver_does_not_block_others() {
    let mut a = TcpTransport::new(cfg("run1", "ru0", Role::Ru)).unwrap();
    let mut slow = TcpTransport::new(cfg("run1", "bu0", Role::Bu)).unwrap();
    let mut fast = TcpTransport::new(cfg("run1", "bu1", Role::Bu)).unwrap();
    let slow_addr = slow.listen("127.0.0.1:0").unwrap();
    let fast_addr = fast.listen("127.0.0.1:0").unwrap();
    let c_slow = a
        .connect(
            &slow_addr,
            Hello::new(Channel::Data, Role::Ru, 0, "run1", "ru0"),
        )
        .unwrap();
    let c_fast = a
        .connect(
            &fast_addr,
            Hello::new(Channel::Data, Role::Ru, 0, "run1", "ru0"),
        )
        .unwrap();
    let mut evs = vec![Vec::new(), Vec::new(), Vec::new()];
    pump(
        &mut [&mut a, &mut slow, &mut fast],
        |e| {
            e[0].iter()
                .filter(|e| matches!(e, Event::Connected { .. }))
                .count()
                == 2
        },
        &mut evs,
    );
    evs.iter_mut().for_each(Vec::clear);
    // 64 MiB towards a receiver that never reads again: far more than socket buffers hold
    let chunk = vec![7u8; 1 << 20];
    for _ in 0..64 {
        a.send(
            c_slow,
            FrameType::Messages,
            1,
            vec![Segment::Owned(chunk.clone())],
        )
        .unwrap();
    }
    for i in 0..200u32 {
        a.send(
            c_fast,
            FrameType::Messages,
            1,
            vec![Segment::Owned(i.to_le_bytes().to_vec())],
        )
        .unwrap();
    }
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while got < 200 {
        assert!(
            Instant::now() < deadline,
            "fast receiver starved by the stalled one: {got}/200"
        );
        a.poll(&mut evs[0], Some(Duration::from_millis(1))).unwrap();
        fast.poll(&mut evs[2], Some(Duration::from_millis(1)))
            .unwrap();
        got = evs[2]
            .iter()
            .filter(|e| matches!(e, Event::Frame { .. }))
            .count();
    }
    assert!(
        a.queued_bytes(c_slow) > 16 << 20,
        "the stalled connection's queue should hold the backlog"
    );
    assert_eq!(a.queued_bytes(c_fast), 0);
}

fn secret_cfg(node: &str, secret: Option<&str>) -> TransportConfig {
    TransportConfig {
        secret: secret.map(|s| s.as_bytes().to_vec()),
        ..cfg("run1", node, Role::Bu)
    }
}

/// Connects a (secret a) to b (secret b); returns what each side saw.
fn handshake(a: Option<&str>, b: Option<&str>) -> (Vec<Event>, Vec<Event>) {
    let mut ta = TcpTransport::new(secret_cfg("ru0", a)).unwrap();
    let mut tb = TcpTransport::new(secret_cfg("bu0", b)).unwrap();
    let addr = tb.listen("127.0.0.1:0").unwrap();
    ta.connect(&addr, Hello::new(Channel::Data, Role::Ru, 0, "run1", "ru0"))
        .unwrap();
    let mut evs = vec![Vec::new(), Vec::new()];
    let deadline = Instant::now() + Duration::from_millis(500);
    while Instant::now() < deadline {
        ta.poll(&mut evs[0], Some(Duration::from_millis(1)))
            .unwrap();
        tb.poll(&mut evs[1], Some(Duration::from_millis(1)))
            .unwrap();
    }
    let b_ev = evs.pop().unwrap();
    (evs.pop().unwrap(), b_ev)
}

#[test]
fn tcp_shared_secret_admits_only_who_knows_it() {
    let opened = |e: &[Event]| {
        e.iter()
            .any(|e| matches!(e, Event::Connected { .. } | Event::Accepted { .. }))
    };
    let (a, b) = handshake(Some("k1"), Some("k1"));
    assert!(opened(&a) && opened(&b), "same secret: {a:?} {b:?}");
    for (sa, sb) in [
        (Some("k1"), Some("k2")),
        (None, Some("k1")),
        (Some("k1"), None),
    ] {
        let (a, b) = handshake(sa, sb);
        if sb.is_some() {
            assert!(!opened(&b), "{sa:?} -> {sb:?}: the acceptor let it in");
        } else {
            // an acceptor without a secret admits anyone; the connector still refuses it
            assert!(b.iter().any(|e| matches!(e, Event::Closed { .. })), "{b:?}");
        }
        assert!(
            !opened(&a),
            "{sa:?} -> {sb:?}: the connector talks to an unproven peer"
        );
        assert!(
            a.iter().any(|e| matches!(
                e,
                Event::Closed {
                    reason: CloseReason::Rejected(_),
                    ..
                }
            )),
            "{a:?}"
        );
    }
}

// ---- shm ----

use evb_transport::shm::ShmTransport;

fn shm(node: &str) -> Box<ShmTransport> {
    Box::new(ShmTransport::create(cfg("run1", node, Role::Bu)).unwrap())
}

#[test]
fn shm_delivers_frames_in_order() {
    ordered_delivery(shm("ru0"), shm("bu0"), "127.0.0.1:0");
}

#[test]
fn shm_refuses_wrong_run() {
    // the listener's name includes its run: another run does not even find it
    let mut a = ShmTransport::create(cfg("other-run", "ru0", Role::Ru)).unwrap();
    let mut b = shm("bu0");
    let addr = b.listen("127.0.0.1:0").unwrap();
    let conn = a
        .connect(
            &addr,
            Hello::new(Channel::Data, Role::Ru, 0, "other-run", "ru0"),
        )
        .unwrap();
    let mut evs = vec![Vec::new(), Vec::new()];
    pump(&mut [&mut a, &mut *b], |e| !e[0].is_empty(), &mut evs);
    assert!(
        matches!(&evs[0][0], Event::Closed { conn: c, reason: CloseReason::ConnectFailed(_) } if *c == conn)
    );
}

#[test]
fn shm_moves_shared_pool_slices_without_copying_and_gets_them_back() {
    let mut a = shm("ru0");
    let mut b = shm("bu0");
    let addr = b.listen("127.0.0.1:0").unwrap();
    let conn = a
        .connect(&addr, Hello::new(Channel::Data, Role::Ru, 0, "run1", "ru0"))
        .unwrap();
    let mut evs = vec![Vec::new(), Vec::new()];
    pump(
        &mut [&mut *a, &mut *b],
        |e| e[0].iter().any(|e| matches!(e, Event::Connected { .. })),
        &mut evs,
    );
    evs.iter_mut().for_each(Vec::clear);

    let pool = Pool::new_shared("frags", 1 << 20, 8).unwrap();
    let mut sent = 0;
    for i in 0..20usize {
        let mut w = pool.try_alloc().unwrap();
        let data = payload(i, 300_000 + i);
        let s = w.append(&data).unwrap();
        sent += s.len() as u64;
        a.send(
            conn,
            FrameType::Messages,
            1,
            vec![Segment::Owned(vec![i as u8; 8]), Segment::Shared(s)],
        )
        .unwrap();
        // receive it and let it go, so the sender's 8 blocks suffice for 20 frames
        pump(
            &mut [&mut *a, &mut *b],
            |e| e[1].iter().any(|e| matches!(e, Event::Frame { .. })),
            &mut evs,
        );
        let Some(Event::Frame { frame, .. }) = evs[1].pop() else {
            panic!("{:?}", evs[1])
        };
        let mut want = vec![i as u8; 8];
        want.extend_from_slice(&data);
        assert!(frame.payload.eq_bytes(&want));
        evs.iter_mut().for_each(Vec::clear);
    }
    let counters = a.counters();
    assert_eq!(
        counters.bytes_by_reference, sent,
        "every fragment byte crossed by reference"
    );
    assert_eq!(
        counters.bytes_copied, 0,
        "nothing was copied (the 8-byte headers went inline)"
    );
    // every block came back from the receiver
    pump(
        &mut [&mut *a, &mut *b],
        |_| pool.free_blocks() == 8,
        &mut evs,
    );
}

#[test]
fn shm_dead_peer_is_seen_at_once_and_lent_blocks_come_home() {
    let pool = Pool::new_shared("frags", 64 * 1024, 4).unwrap();
    let mut a = shm("ru0");
    let mut evs = vec![Vec::new(), Vec::new()];
    {
        let mut b = shm("bu0");
        let addr = b.listen("127.0.0.1:0").unwrap();
        let conn = a
            .connect(&addr, Hello::new(Channel::Data, Role::Ru, 0, "run1", "ru0"))
            .unwrap();
        pump(
            &mut [&mut *a, &mut *b],
            |e| e[0].iter().any(|e| matches!(e, Event::Connected { .. })),
            &mut evs,
        );
        let mut w = pool.try_alloc().unwrap();
        let s = w.append(&[9; 1000]).unwrap();
        drop(w);
        a.send(conn, FrameType::Messages, 1, vec![Segment::Shared(s)])
            .unwrap();
        pump(
            &mut [&mut *a, &mut *b],
            |e| e[1].iter().any(|e| matches!(e, Event::Frame { .. })),
            &mut evs,
        );
        assert_eq!(pool.free_blocks(), 3, "the receiver holds one block");
        // the receiver dies holding the fragment (its transport and frame dropped unreturned)
        std::mem::forget(evs[1].drain(..).collect::<Vec<_>>());
    }
    evs.iter_mut().for_each(Vec::clear);
    pump(
        &mut [&mut *a],
        |e| {
            e[0].iter().any(|e| {
                matches!(
                    e,
                    Event::Closed {
                        reason: CloseReason::Lost(_),
                        ..
                    }
                )
            })
        },
        &mut evs,
    );
    assert_eq!(pool.free_blocks(), 4, "the dead peer's loan ended with it");
}

/// A sender whose connections are written by a send thread, waiting in `poll` (directly, or
/// through a mux waiting on the transport's descriptor) for its queue to drain, is woken as
/// the thread writes, not by its timeout; every byte arrives in order.
fn send_thread_wakes_waiting_sender(through_mux: bool) {
    const FRAMES: usize = 48;
    const LEN: usize = 256 * 1024;
    let mut tcp = TcpTransport::new(cfg("run1", "ru0", Role::Ru)).unwrap();
    tcp.set_send_threads(1).unwrap();
    let mut a: Box<dyn Transport> = if through_mux {
        Box::new(evb_transport::mux::MuxTransport::new(
            vec![Box::new(tcp)],
            Box::new(|_| 0),
        ))
    } else {
        Box::new(tcp)
    };
    let mut b = TcpTransport::new(cfg("run1", "bu0", Role::Bu)).unwrap();
    let bound = b.listen("127.0.0.1:0").unwrap();
    let receiver = std::thread::spawn(move || {
        let (mut frames, mut evs) = (Vec::new(), Vec::new());
        let deadline = Instant::now() + Duration::from_secs(60);
        let (mut accepted, mut slept) = (0, false);
        while frames.len() < FRAMES && Instant::now() < deadline {
            if accepted == 2 && !slept {
                // both connections open: read nothing for a while, the sender's queue fills
                std::thread::sleep(Duration::from_millis(500));
                slept = true;
            }
            b.poll(&mut evs, Some(Duration::from_millis(10))).unwrap();
            for e in evs.drain(..) {
                match e {
                    Event::Frame { frame, .. } => frames.push(frame.payload.to_vec()),
                    Event::Accepted { .. } => accepted += 1,
                    _ => {}
                }
            }
        }
        // `b` lives on until joined: its connections closing would wake the sender too
        (frames, b)
    });
    // two connections: the first is written by the caller's thread, the second by the thread
    let hello = Hello::new(Channel::Data, Role::Ru, 0, "run1", "ru0");
    let first = a.connect(&bound, hello.clone()).unwrap();
    let conn = a.connect(&bound, hello).unwrap();
    let mut evs = Vec::new();
    let mut open = 0;
    while open < 2 {
        a.poll(&mut evs, Some(Duration::from_millis(10))).unwrap();
        open += evs
            .drain(..)
            .filter(|e| matches!(e, Event::Connected { .. }))
            .count();
    }
    for i in 0..FRAMES {
        a.send(
            conn,
            FrameType::Messages,
            1,
            vec![Segment::Owned(payload(i, LEN))],
        )
        .unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        a.queued_bytes(conn) > 0,
        "nothing waited: the test proves nothing"
    );
    let start = Instant::now();
    let mut waits = 0;
    while a.queued_bytes(conn) > 0 {
        a.poll(&mut evs, Some(Duration::from_secs(30))).unwrap();
        waits += 1;
    }
    let took = start.elapsed();
    // a lost wake-up costs the whole 30 s timeout
    assert!(
        took < Duration::from_secs(15),
        "{waits} waits took {took:?}"
    );
    let (frames, _b) = receiver.join().unwrap();
    assert_eq!(frames.len(), FRAMES);
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f, &payload(i, LEN), "frame {i}");
    }
    a.close(first);
    a.close(conn);
}

#[test]
fn tcp_send_thread_wakes_a_waiting_sender() {
    send_thread_wakes_waiting_sender(false)
}

#[test]
fn tcp_send_thread_wakes_a_sender_waiting_through_a_mux() {
    send_thread_wakes_waiting_sender(true)
}

/// A peer of protocol version 1 (frame header and Hello as the first published docs wrote
/// them) is told why it is refused, in a Reject whose header it can read, naming both versions
/// (issue 66 item 4); a peer whose frames are of this version but whose Hello is not is told
/// the same in frames of this version. Neither stalls.
#[test]
fn tcp_a_peer_of_another_protocol_version_gets_a_reject_naming_both() {
    use std::io::Read;
    for (frame_version, hello_version) in [(1u16, 1u16), (evb_wire::PROTOCOL_VERSION, 1)] {
        let mut b = TcpTransport::new(cfg("run1", "bu0", Role::Bu)).unwrap();
        let bound = b.listen("127.0.0.1:0").unwrap();
        let mut raw = std::net::TcpStream::connect(&bound).unwrap();
        let mut hello = Hello::new(Channel::Data, Role::Ru, 0, "run1", "old")
            .encode()
            .unwrap();
        hello[0..2].copy_from_slice(&hello_version.to_le_bytes());
        let header = evb_wire::FrameHeader::new(FrameType::Hello, hello.len() as u32, 0, 0)
            .encode_as(frame_version);
        raw.write_all(&header).unwrap();
        raw.write_all(&hello).unwrap();
        // the peer reads the reply and hangs up, as a refused peer does
        let reader = std::thread::spawn(move || {
            raw.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut got = vec![0u8; 24];
            raw.read_exact(&mut got).unwrap();
            let len = u32::from_le_bytes([got[8], got[9], got[10], got[11]]) as usize;
            got.resize(24 + len, 0);
            raw.read_exact(&mut got[24..]).unwrap();
            got
        });
        let mut evs = vec![Vec::new()];
        pump(
            &mut [&mut b],
            |e| {
                e[0].iter().any(|e| {
                    matches!(
                        e,
                        Event::Closed {
                            reason: CloseReason::Rejected(_),
                            ..
                        }
                    )
                })
            },
            &mut evs,
        );
        let got = reader.join().unwrap();
        assert_eq!(
            u16::from_le_bytes([got[4], got[5]]),
            frame_version,
            "the reply's header is not in the peer's version"
        );
        assert_eq!(got[6], FrameType::Reject as u8);
        let reject = evb_wire::Reject::decode(&got[24..]).unwrap();
        assert!(
            reject.reason.contains("protocol version 1 ")
                && reject
                    .reason
                    .contains(&format!("speaks version {}", evb_wire::PROTOCOL_VERSION)),
            "the reject does not name both versions: {}",
            reject.reason
        );
    }
}

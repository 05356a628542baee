//! The transport conformance suite: one set of checks, run against every transport kind.
//!
//! Each kind gets a module of tests (`cargo test -p evb-transport --test conformance ofi::`):
//! ordering per connection, frames from 1 B to 64 MiB, many peers into one receiver, a peer
//! that disconnects in the middle of a frame, back-pressure when the receiver stops polling
//! (bounded memory, nothing lost once it resumes), and reconnecting after a close.
//! tcp runs twice: written from the caller's thread, and from send threads.
//! Kinds that cannot run here (ofi without libfabric) print a notice and pass.

use std::collections::HashMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use evb_buffers::Pool;
use evb_transport::inproc::InprocTransport;
use evb_transport::ofi::{probe as ofi_probe, OfiTransport};
use evb_transport::shm::ShmTransport;
use evb_transport::tcp::TcpTransport;
use evb_transport::{CloseReason, ConnId, Event, Segment, Transport, TransportConfig};
use evb_wire::{Channel, FrameType, Hello, Role};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Tcp,
    /// tcp with its sockets written by two send threads
    TcpSendThreads,
    Inproc,
    Ofi,
    Shm,
}

/// What a kind promises beyond the common checks.
struct Caps {
    /// `queued_bytes` grows while the receiver does not read (inproc's queues are unbounded
    /// by design: the builder's credits bound it).
    bounded_queues: bool,
    /// A peer that goes away without closing is reported as `Lost` (an inproc peer is a
    /// thread of this process: dropping it says Bye).
    death_is_lost: bool,
}

fn caps(kind: Kind) -> Caps {
    Caps {
        bounded_queues: !matches!(kind, Kind::Inproc),
        death_is_lost: !matches!(kind, Kind::Inproc),
    }
}

/// The ofi provider the suite uses (`EVB_TEST_OFI_PROVIDER` overrides; "" = best available).
fn ofi_provider() -> String {
    std::env::var("EVB_TEST_OFI_PROVIDER").unwrap_or_else(|_| "tcp".into())
}

/// A transport of `kind`, or None (with a printed notice) when it cannot run here.
fn make(kind: Kind, cfg: TransportConfig) -> Option<Box<dyn Transport>> {
    match kind {
        Kind::Tcp => Some(Box::new(TcpTransport::new(cfg).unwrap())),
        Kind::TcpSendThreads => {
            let mut t = TcpTransport::new(cfg).unwrap();
            t.set_send_threads(2).unwrap();
            Some(Box::new(t))
        }
        Kind::Inproc => Some(Box::new(InprocTransport::new(cfg))),
        Kind::Ofi => {
            let prov = ofi_provider();
            if let Err(why) = ofi_probe(&prov) {
                // where the test script could install libfabric, a missing one is a failure
                assert!(
                    std::env::var_os("EVB_REQUIRE_TOOLS").is_none(),
                    "ofi unavailable though EVB_REQUIRE_TOOLS is set: {why}"
                );
                evb_buffers::skips::skipped("ofi conformance", &why.to_string());
                return None;
            }
            Some(OfiTransport::new(cfg, &prov).unwrap())
        }
        Kind::Shm => Some(ShmTransport::new(cfg).unwrap()),
    }
}

fn addr(kind: Kind, test: &str) -> String {
    match kind {
        Kind::Inproc => format!("conformance-{test}-{}", std::process::id()),
        Kind::Tcp | Kind::TcpSendThreads | Kind::Ofi | Kind::Shm => "127.0.0.1:0".into(),
    }
}

fn cfg(node: &str, block: usize, blocks: usize, max_frame: u32) -> TransportConfig {
    TransportConfig {
        run_id: "conf".into(),
        local: Hello::new(Channel::Data, Role::Bu, 0, "conf", node),
        max_frame,
        rx_pool: Pool::new(node, block, blocks),
        secret: None,
    }
}

fn small_cfg(node: &str) -> TransportConfig {
    cfg(node, 64 * 1024, 512, 8 << 20)
}

fn hello(node: &str) -> Hello {
    Hello::new(Channel::Data, Role::Ru, 0, "conf", node)
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|b| (b.wrapping_mul(131) ^ seed.wrapping_mul(7919)) as u8)
        .collect()
}

fn count_bytes(seed: usize, i: u32, len: usize) -> Vec<u8> {
    let mut v = pattern(seed + i as usize, len.max(4));
    v[..4].copy_from_slice(&i.to_le_bytes());
    v.truncate(len.max(4));
    v
}

/// Polls every transport until `done` says so; panics after a generous deadline (a hang is a
/// failure, not a measurement).
fn pump_until(
    ts: &mut [&mut Box<dyn Transport>],
    evs: &mut [Vec<Event>],
    mut done: impl FnMut(&mut [Vec<Event>]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done(evs) {
        assert!(Instant::now() < deadline, "timed out");
        for (t, e) in ts.iter_mut().zip(evs.iter_mut()) {
            t.poll(e, Some(Duration::from_millis(1))).unwrap();
        }
    }
}

/// Connects `a` to `b`; returns (a's conn, b's conn).
fn connect(
    a: &mut Box<dyn Transport>,
    b: &mut Box<dyn Transport>,
    at: &str,
    node: &str,
) -> (ConnId, ConnId) {
    let ac = a.connect(at, hello(node)).unwrap();
    let mut evs = vec![Vec::new(), Vec::new()];
    pump_until(&mut [a, b], &mut evs, |e| {
        e[0].iter()
            .any(|e| matches!(e, Event::Connected { conn, .. } if *conn == ac))
            && e[1].iter().any(|e| matches!(e, Event::Accepted { .. }))
    });
    let bc = evs[1]
        .iter()
        .find_map(|e| match e {
            Event::Accepted { conn, peer } => {
                assert_eq!(peer.node_id, node);
                Some(*conn)
            }
            _ => None,
        })
        .unwrap();
    (ac, bc)
}

fn frames_of(evs: &mut Vec<Event>, conn: ConnId) -> Vec<evb_transport::InFrame> {
    let mut out = Vec::new();
    evs.retain_mut(|e| match e {
        Event::Frame { conn: c, .. } if *c == conn => {
            let Event::Frame { frame, .. } = std::mem::replace(
                e,
                Event::Closed {
                    conn,
                    reason: CloseReason::Local,
                },
            ) else {
                unreachable!()
            };
            out.push(frame);
            false
        }
        _ => true,
    });
    out
}

fn check_ordering(kind: Kind) {
    // many small frames: small blocks, so a transport that gives each frame its own block
    // (inproc copies) has enough of them
    let (Some(mut a), Some(mut b)) = (
        make(kind, cfg("ru0", 4096, 4096, 1 << 20)),
        make(kind, cfg("bu0", 4096, 4096, 1 << 20)),
    ) else {
        return;
    };
    let at = b.listen(&addr(kind, "order")).unwrap();
    let (ac, bc) = connect(&mut a, &mut b, &at, "ru0");
    const N: u32 = 2000;
    for i in 0..N {
        let len = 4 + (i as usize * 37) % 3000;
        a.send(
            ac,
            FrameType::Messages,
            i,
            vec![Segment::Owned(count_bytes(1, i, len))],
        )
        .unwrap();
    }
    let mut got = 0u32;
    let mut evs = vec![Vec::new(), Vec::new()];
    pump_until(&mut [&mut a, &mut b], &mut evs, |e| {
        for f in frames_of(&mut e[1], bc) {
            let len = 4 + (got as usize * 37) % 3000;
            assert_eq!(f.count, got, "{kind:?}: frame out of order");
            assert!(
                f.payload.eq_bytes(&count_bytes(1, got, len)),
                "{kind:?}: frame {got} corrupted"
            );
            got += 1;
        }
        got == N
    });
    assert_eq!(got, N);
}

fn check_sizes(kind: Kind) {
    // 64 MiB frames: the limit and the receive pool are sized for them
    let max = (64 << 20) + 1;
    let (Some(mut a), Some(mut b)) = (
        make(kind, cfg("ru0", 1 << 20, 8, max)),
        make(kind, cfg("bu0", 1 << 20, 96, max)),
    ) else {
        return;
    };
    let at = b.listen(&addr(kind, "sizes")).unwrap();
    let (ac, bc) = connect(&mut a, &mut b, &at, "ru0");
    let sizes = [
        1usize,
        2,
        23,
        24,
        25,
        1000,
        65_535,
        65_536,
        65_537,
        (1 << 20) - 24,
        1 << 20,
        (1 << 20) + 1,
        8 << 20,
        64 << 20,
    ];
    let tx = Pool::new("tx", 1 << 20, 8);
    for (i, &n) in sizes.iter().enumerate() {
        let data = pattern(i, n);
        // small ones also as a shared pool slice after an empty segment
        let segs = if n <= 1 << 20 && i % 2 == 0 {
            let mut w = tx.try_alloc().unwrap();
            vec![
                Segment::Owned(Vec::new()),
                Segment::Shared(w.append(&data).unwrap()),
            ]
        } else {
            vec![Segment::Owned(data)]
        };
        a.send(ac, FrameType::Messages, i as u32, segs).unwrap();
    }
    let mut next = 0;
    let mut evs = vec![Vec::new(), Vec::new()];
    pump_until(&mut [&mut a, &mut b], &mut evs, |e| {
        for f in frames_of(&mut e[1], bc) {
            assert_eq!(f.count as usize, next, "{kind:?}: out of order");
            assert_eq!(f.payload.len(), sizes[next], "{kind:?}: size");
            assert!(
                f.payload.eq_bytes(&pattern(next, sizes[next])),
                "{kind:?}: {} bytes corrupted",
                sizes[next]
            );
            next += 1;
        }
        next == sizes.len()
    });
    // the limit holds: one byte more is refused at the sender
    assert!(a
        .send(
            ac,
            FrameType::Messages,
            0,
            vec![Segment::Owned(vec![0; max as usize + 1])]
        )
        .is_err());
}

fn check_many_peers(kind: Kind) {
    const PEERS: usize = 8;
    const N: u32 = 300;
    let Some(mut b) = make(kind, cfg("bu0", 8192, 4096, 1 << 20)) else {
        return;
    };
    let at = b.listen(&addr(kind, "many")).unwrap();
    let mut senders = Vec::new();
    for p in 0..PEERS {
        let mut a = make(kind, small_cfg(&format!("ru{p}"))).unwrap();
        let (ac, _) = connect(&mut a, &mut b, &at, &format!("ru{p}"));
        senders.push((a, ac));
    }
    // the receiver learnt each connection's node from its handshake; map them back
    let mut evs_b = Vec::new();
    for (p, (a, ac)) in senders.iter_mut().enumerate() {
        for i in 0..N {
            let len = 4 + (i as usize * 101 + p) % 5000;
            a.send(
                *ac,
                FrameType::Messages,
                i,
                vec![Segment::Owned(count_bytes(p * 1000, i, len))],
            )
            .unwrap();
        }
    }
    // which conn is which peer: first frame's content tells (seed differs per peer)
    let mut next: HashMap<ConnId, (usize, u32)> = HashMap::new();
    let mut total = 0usize;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut sink = Vec::new();
    while total < PEERS * N as usize {
        assert!(Instant::now() < deadline, "{kind:?}: timed out at {total}");
        for (a, _) in senders.iter_mut() {
            a.poll(&mut sink, Some(Duration::ZERO)).unwrap();
            sink.clear();
        }
        b.poll(&mut evs_b, Some(Duration::from_millis(1))).unwrap();
        for e in evs_b.drain(..) {
            if let Event::Frame { conn, frame } = e {
                let entry = next.entry(conn).or_insert_with(|| {
                    let p = (0..PEERS)
                        .find(|&p| {
                            frame
                                .payload
                                .eq_bytes(&count_bytes(p * 1000, 0, 4 + p % 5000))
                        })
                        .expect("first frame of an unknown peer");
                    (p, 0)
                });
                let (p, i) = *entry;
                assert_eq!(frame.count, i, "{kind:?}: peer {p} out of order");
                let len = 4 + (i as usize * 101 + p) % 5000;
                assert!(frame.payload.eq_bytes(&count_bytes(p * 1000, i, len)));
                entry.1 += 1;
                total += 1;
            }
        }
    }
    assert_eq!(next.len(), PEERS);
    assert!(next.values().all(|&(_, n)| n == N));
}

fn check_disconnect_mid_frame(kind: Kind) {
    let big = 16 << 20;
    let Some(mut b) = make(kind, cfg("bu0", 1 << 20, 48, 32 << 20)) else {
        return;
    };
    let at = b.listen(&addr(kind, "disconnect")).unwrap();
    let bc;
    {
        let mut a = make(kind, cfg("ru0", 64 * 1024, 64, 32 << 20)).unwrap();
        let (ac, c) = connect(&mut a, &mut b, &at, "ru0");
        bc = c;
        a.send(
            ac,
            FrameType::Messages,
            1,
            vec![Segment::Owned(pattern(3, big))],
        )
        .unwrap();
        // let part of it out, then die without a Bye
        let mut sink = Vec::new();
        for _ in 0..20 {
            a.poll(&mut sink, Some(Duration::ZERO)).unwrap();
            b.poll(&mut Vec::new(), Some(Duration::ZERO)).unwrap();
        }
    }
    let mut evs = [Vec::new()];
    let mut closed = None;
    let mut frames = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while closed.is_none() {
        assert!(
            Instant::now() < deadline,
            "{kind:?}: peer death never reported"
        );
        b.poll(&mut evs[0], Some(Duration::from_millis(1))).unwrap();
        for e in evs[0].drain(..) {
            match e {
                Event::Frame { conn, frame } if conn == bc => frames.push(frame),
                Event::Closed { conn, reason } if conn == bc => closed = Some(reason),
                _ => {}
            }
        }
        // a transport may only notice a dead peer when it writes to it
        if closed.is_none() {
            let _ = b.send(bc, FrameType::Messages, 0, vec![Segment::Owned(vec![1])]);
        }
    }
    for f in &frames {
        assert_eq!(
            f.payload.len(),
            big,
            "{kind:?}: a partial frame was delivered"
        );
        assert!(f.payload.eq_bytes(&pattern(3, big)));
    }
    if caps(kind).death_is_lost {
        assert!(
            matches!(closed, Some(CloseReason::Lost(_))),
            "{kind:?}: {closed:?}"
        );
    }
}

fn check_back_pressure(kind: Kind) {
    const FRAMES: usize = 64;
    const LEN: usize = 1 << 20;
    let (Some(mut a), Some(mut b)) = (make(kind, small_cfg("ru0")), make(kind, small_cfg("bu0")))
    else {
        return;
    };
    let at = b.listen(&addr(kind, "backpressure")).unwrap();
    let (ac, bc) = connect(&mut a, &mut b, &at, "ru0");
    let tx = Pool::new("tx", LEN, FRAMES);
    for i in 0..FRAMES {
        let mut w = tx.try_alloc().unwrap();
        let s = w.append(&pattern(i, LEN)).unwrap();
        a.send(ac, FrameType::Messages, i as u32, vec![Segment::Shared(s)])
            .unwrap();
    }
    // the receiver stops polling; the sender keeps going
    let mut sink = Vec::new();
    for _ in 0..300 {
        a.poll(&mut sink, Some(Duration::from_millis(1))).unwrap();
    }
    assert!(sink.iter().all(|e| !matches!(e, Event::Closed { .. })));
    let queued = a.queued_bytes(ac);
    if caps(kind).bounded_queues {
        // all but what socket buffers and the receive pool can absorb (32 MiB) waits here
        assert!(
            queued > 16 << 20,
            "{kind:?}: only {queued} bytes queued behind a stalled receiver"
        );
        assert!(queued <= FRAMES * (LEN + 24));
    }
    // it resumes: everything arrives, in order, intact; frames dropped as they are checked
    let mut next = 0;
    let mut evs = vec![Vec::new(), Vec::new()];
    pump_until(&mut [&mut a, &mut b], &mut evs, |e| {
        e[0].clear();
        for f in frames_of(&mut e[1], bc) {
            assert_eq!(f.count as usize, next);
            assert!(
                f.payload.eq_bytes(&pattern(next, LEN)),
                "{kind:?}: frame {next}"
            );
            next += 1;
        }
        next == FRAMES
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while a.queued_bytes(ac) > 0 {
        assert!(
            Instant::now() < deadline,
            "{kind:?}: the queue never drained"
        );
        a.poll(&mut sink, Some(Duration::from_millis(1))).unwrap();
        b.poll(&mut sink, Some(Duration::ZERO)).unwrap();
        sink.clear();
    }
    // every sender block went back to its pool: nothing is held after delivery
    assert_eq!(tx.free_blocks(), FRAMES);
}

fn check_reconnect(kind: Kind) {
    let (Some(mut a), Some(mut b)) = (make(kind, small_cfg("ru0")), make(kind, small_cfg("bu0")))
    else {
        return;
    };
    let at = b.listen(&addr(kind, "reconnect")).unwrap();
    for round in 0..3u32 {
        let (ac, bc) = connect(&mut a, &mut b, &at, "ru0");
        a.send(
            ac,
            FrameType::Messages,
            round,
            vec![Segment::Owned(count_bytes(9, round, 100))],
        )
        .unwrap();
        a.close(ac);
        let mut evs = vec![Vec::new(), Vec::new()];
        pump_until(&mut [&mut a, &mut b], &mut evs, |e| {
            e[0].iter()
                .any(|e| matches!(e, Event::Closed { conn, .. } if *conn == ac))
                && e[1]
                    .iter()
                    .any(|e| matches!(e, Event::Closed { conn, .. } if *conn == bc))
        });
        // the frame sent before close arrived, then the close, as a Bye
        let frames = frames_of(&mut evs[1], bc);
        assert_eq!(frames.len(), 1, "{kind:?} round {round}");
        assert!(frames[0].payload.eq_bytes(&count_bytes(9, round, 100)));
        assert!(evs[1].iter().any(|e| matches!(
            e,
            Event::Closed {
                reason: CloseReason::PeerClosed,
                ..
            }
        )));
        assert!(evs[0].iter().any(|e| matches!(
            e,
            Event::Closed {
                reason: CloseReason::Local,
                ..
            }
        )));
    }
}

/// Sends frames `ids` on `conn`, each `count_bytes(seed, id, len)`.
fn send_counted(
    t: &mut Box<dyn Transport>,
    conn: ConnId,
    seed: usize,
    ids: Range<u32>,
    len: usize,
) {
    for i in ids {
        t.send(
            conn,
            FrameType::Messages,
            1,
            vec![Segment::Owned(count_bytes(seed, i, len))],
        )
        .unwrap();
    }
}

/// Polls `a` until its queue to `ac` is written: alone for up to `alone` passes, then with
/// `b` (whose events go to `evs`) for transports that need the receiver to move.
fn write_out(
    kind: Kind,
    a: &mut Box<dyn Transport>,
    ac: ConnId,
    b: &mut Box<dyn Transport>,
    evs: &mut Vec<Event>,
    alone: usize,
) {
    for _ in 0..alone {
        if a.queued_bytes(ac) == 0 {
            return;
        }
        a.poll(&mut Vec::new(), Some(Duration::from_millis(1)))
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.queued_bytes(ac) > 0 {
        assert!(Instant::now() < deadline, "{kind:?}: queue never written");
        a.poll(&mut Vec::new(), Some(Duration::from_millis(1)))
            .unwrap();
        b.poll(evs, Some(Duration::ZERO)).unwrap();
    }
}

/// A peer that dies with input still unread (it never read what it was sent) must not take
/// with it what it had already handed to the transport: everything it wrote arrives, in
/// order, before the close is reported. (A Unix socket closed with unread input resets its
/// peer, and the reset is reported ahead of the peer's own queued input.)
fn check_sent_before_death_arrives(kind: Kind) {
    let n = 300u32;
    let Some(mut b) = make(kind, small_cfg("bu0")) else {
        return;
    };
    let at = b.listen(&addr(kind, "sentbefore")).unwrap();
    let bc;
    let mut evs = [Vec::new()];
    {
        let mut a = make(kind, small_cfg("ru0")).unwrap();
        let (ac, c) = connect(&mut a, &mut b, &at, "ru0");
        bc = c;
        send_counted(&mut a, ac, 1, 0..n, 100);
        // Whatever a transport could not write at once is written now.
        write_out(kind, &mut a, ac, &mut b, &mut evs[0], 0);
        // A last few that `b` has not read when `a` dies (written without `b`'s help if the
        // transport can; otherwise with it, and then `b` may have read them already).
        send_counted(&mut a, ac, 1, n..n + 5, 100);
        write_out(kind, &mut a, ac, &mut b, &mut evs[0], 100);
        // Input for `a` that it will never read.
        send_counted(&mut b, bc, 9, 0..3, 64);
        std::thread::sleep(Duration::from_millis(20));
    } // `a` dies: no Bye, its input unread
    let mut got = frames_of(&mut evs[0], bc);
    let mut closed = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !closed {
        assert!(Instant::now() < deadline, "{kind:?}: death never reported");
        b.poll(&mut evs[0], Some(Duration::from_millis(1))).unwrap();
        got.extend(frames_of(&mut evs[0], bc));
        closed = evs[0]
            .iter()
            .any(|e| matches!(e, Event::Closed { conn, .. } if *conn == bc));
        evs[0].clear();
    }
    assert_eq!(
        got.len(),
        n as usize + 5,
        "{kind:?}: frames lost at the peer's death"
    );
    for (i, f) in got.iter().enumerate() {
        assert!(
            f.payload.eq_bytes(&count_bytes(1, i as u32, 100)),
            "{kind:?}: frame {i}"
        );
    }
}

macro_rules! conformance {
    ($name:ident, $kind:expr) => {
        mod $name {
            use super::*;

            #[test]
            fn ordering_per_connection() {
                check_ordering($kind)
            }

            #[test]
            fn sizes_from_1_byte_to_64_mib() {
                check_sizes($kind)
            }

            #[test]
            fn many_peers_into_one_receiver() {
                check_many_peers($kind)
            }

            #[test]
            fn peer_disconnect_mid_frame() {
                check_disconnect_mid_frame($kind)
            }

            #[test]
            fn back_pressure_when_the_receiver_stops() {
                check_back_pressure($kind)
            }

            #[test]
            fn what_a_dying_peer_sent_arrives() {
                check_sent_before_death_arrives($kind)
            }

            #[test]
            fn reconnect_after_close() {
                check_reconnect($kind)
            }
        }
    };
}

conformance!(tcp, Kind::Tcp);
conformance!(tcp_send_threads, Kind::TcpSendThreads);
conformance!(inproc, Kind::Inproc);
conformance!(ofi, Kind::Ofi);
conformance!(shm, Kind::Shm);

//! Faults from peers that do not play by the rules (issues #10, #16): unauthenticated sockets
//! that try to starve a node, a receive pool that runs dry under shm, frames whose descriptors
//! do not fit one packet, and shared memory that cannot be trusted.

mod common;
use common::pump;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use evb_buffers::Pool;
use evb_transport::tcp::{Admission, TcpTransport};
use evb_transport::{CloseReason, ConnId, Event, Segment, Transport, TransportConfig};
use evb_wire::{Channel, FrameHeader, FrameType, Hello, Role};

fn cfg(node: &str, block: usize, blocks: usize) -> TransportConfig {
    TransportConfig {
        run_id: "run1".into(),
        local: Hello::new(Channel::Data, Role::Bu, 0, "run1", node),
        max_frame: 8 << 20,
        rx_pool: Pool::new(node, block, blocks),
        secret: None,
    }
}

fn opened(e: &[Event]) -> Option<ConnId> {
    e.iter().find_map(|e| match e {
        Event::Connected { conn, .. } | Event::Accepted { conn, .. } => Some(*conn),
        _ => None,
    })
}

/// A TCP connection to `to` from the source address `from` (another 127.x address, so that
/// the per-address limit can be seen apart from the legitimate peer's).
fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let SocketAddr::V4(to) = to else {
        panic!("v4 only")
    };
    let sin = |ip: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain system call; the result is checked before it is owned.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a fresh socket that nothing else owns; the stream closes it.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let src = sin(from, 0);
    let dst = sin(to.ip().octets(), to.port());
    // SAFETY: valid socket and a sockaddr_in of `len` bytes.
    let r = unsafe { libc::bind(fd, (&src as *const libc::sockaddr_in).cast(), len) };
    assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
    // SAFETY: as for bind.
    let r = unsafe { libc::connect(fd, (&dst as *const libc::sockaddr_in).cast(), len) };
    assert_eq!(r, 0, "connect: {}", std::io::Error::last_os_error());
    stream
}

/// Runs one hostile socket in a thread: connects from `from`, writes `bytes`, then waits
/// until the node closes it and reports how long that took (None: still open after 8 s).
fn hostile(
    from: [u8; 4],
    to: SocketAddr,
    bytes: Vec<u8>,
    done: mpsc::Sender<(usize, Option<Duration>)>,
    id: usize,
) {
    std::thread::spawn(move || {
        let mut s = connect_from(from, to);
        let t0 = Instant::now();
        let _ = s.write_all(&bytes);
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut buf = [0u8; 4096];
        while t0.elapsed() < Duration::from_secs(8) {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
        let elapsed = t0.elapsed();
        let _ = done.send((id, (elapsed < Duration::from_secs(8)).then_some(elapsed)));
        // keep the socket open until the test ends, as a stalled attacker would
        std::thread::sleep(Duration::from_secs(60));
    });
}

/// A Hello header declaring `len` payload bytes, then all but one byte of that payload.
fn big_hello(len: u32) -> Vec<u8> {
    let mut v = FrameHeader::new(FrameType::Hello, len, 0, 0)
        .encode()
        .to_vec();
    v.resize(v.len() + len as usize - 1, 7);
    v
}

#[test]
fn tcp_unauthenticated_sockets_cannot_starve_a_node() {
    let secret = Some(b"s3cret".to_vec());
    // 1 MiB of receive pool: four stalled 340 KB Hellos would hold all of it on the old code
    let mut node = TcpTransport::new(TransportConfig {
        secret: secret.clone(),
        ..cfg("evm", 64 * 1024, 16)
    })
    .unwrap();
    node.set_admission(Admission {
        handshake_deadline: Duration::from_secs(1),
        per_ip: 8,
        total: 64,
        ..Admission::default()
    });
    let bound = node.listen("127.0.0.1:0").unwrap();
    let to: SocketAddr = bound.parse().unwrap();
    let (tx, rx) = mpsc::channel();

    // 12 sockets declaring a 340 KB Hello and sending all of it but one byte, from two addresses
    for i in 0..12 {
        let from = if i % 2 == 0 {
            [127, 0, 0, 3]
        } else {
            [127, 0, 0, 4]
        };
        hostile(from, to, big_hello(340_000), tx.clone(), i);
    }
    // 4 sockets that send half a header and stall: only the deadline closes them
    let half = FrameHeader::new(FrameType::Hello, 100, 0, 0).encode()[..10].to_vec();
    for i in 12..16 {
        hostile([127, 0, 0, 5], to, half.clone(), tx.clone(), i);
    }
    // 10 silent sockets from one address: two more than it may have handshaking
    for i in 16..26 {
        hostile([127, 0, 0, 6], to, Vec::new(), tx.clone(), i);
    }
    // let the node see them all before the legitimate peer arrives
    let mut evs = vec![Vec::new(), Vec::new()];
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(300) {
        node.poll(&mut evs[1], Some(Duration::from_millis(1)))
            .unwrap();
    }
    assert!(opened(&evs[1]).is_none(), "{:?}", evs[1]);

    let mut peer = TcpTransport::new(TransportConfig {
        secret,
        ..cfg("ru0", 64 * 1024, 64)
    })
    .unwrap();
    let conn = peer
        .connect(
            &bound,
            Hello::new(Channel::Control, Role::Ru, 0, "run1", "ru0"),
        )
        .unwrap();
    pump(
        &mut [&mut peer, &mut node],
        &mut evs,
        "the legitimate peer's handshake",
        |e| opened(&e[0]).is_some() && opened(&e[1]).is_some(),
    );
    evs.iter_mut().for_each(Vec::clear);
    // 20 frames of 200 KB: each needs 4 of the node's 16 blocks
    for i in 0..20u8 {
        peer.send(
            conn,
            FrameType::Messages,
            1,
            vec![Segment::Owned(vec![i; 200_000])],
        )
        .unwrap();
    }
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < 20 {
        assert!(Instant::now() < deadline, "got {} of 20 frames", got.len());
        peer.poll(&mut evs[0], Some(Duration::from_millis(1)))
            .unwrap();
        node.poll(&mut evs[1], Some(Duration::from_millis(1)))
            .unwrap();
        for e in evs[1].drain(..) {
            if let Event::Frame { frame, .. } = e {
                // the frame (and its blocks) is dropped here, as an application would
                got.push(frame.payload.to_vec());
            }
        }
    }
    for (i, f) in got.iter().enumerate() {
        assert_eq!(f.len(), 200_000);
        assert!(f.iter().all(|&b| b == i as u8), "frame {i} corrupted");
    }

    // every hostile socket is closed: the oversized Hellos and the excess at once, the
    // stalled ones at the deadline
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut closed = vec![None; 26];
    let mut reported = 0;
    while reported < 26 && Instant::now() < deadline {
        node.poll(&mut evs[1], Some(Duration::from_millis(1)))
            .unwrap();
        while let Ok((id, when)) = rx.try_recv() {
            closed[id] = Some(when);
            reported += 1;
        }
    }
    let fast = Duration::from_millis(900);
    for (i, c) in closed.iter().enumerate().take(12) {
        let when = c
            .flatten()
            .unwrap_or_else(|| panic!("oversized Hello {i} never closed"));
        assert!(
            when < fast,
            "oversized Hello {i} closed only after {when:?}"
        );
    }
    for (i, c) in closed.iter().enumerate().take(16).skip(12) {
        let when = c
            .flatten()
            .unwrap_or_else(|| panic!("stalled socket {i} never closed"));
        assert!(
            when >= Duration::from_millis(900) && when < Duration::from_secs(4),
            "stalled socket {i} closed after {when:?}, the deadline is 1 s"
        );
    }
    let silent: Vec<Duration> = closed[16..]
        .iter()
        .map(|c| c.flatten().expect("silent socket never closed"))
        .collect();
    let at_once = silent.iter().filter(|d| **d < fast).count();
    assert_eq!(
        at_once, 2,
        "closed at once over the per-address limit: {silent:?}"
    );
    assert!(
        evs[1].iter().all(|e| !matches!(e, Event::Accepted { .. })),
        "a hostile socket was admitted: {:?}",
        evs[1]
    );
    // the closes of never-opened connections are reported as refusals or protocol errors
    for e in &evs[1] {
        if let Event::Closed { reason, .. } = e {
            assert!(
                matches!(
                    reason,
                    CloseReason::Rejected(_) | CloseReason::Protocol(_) | CloseReason::Lost(_)
                ),
                "{reason:?}"
            );
        }
    }
}

/// Sockets on the peer's own IP holding unfinished 1,000-byte Hellos used to take every
/// handshake place of that IP, so that a peer with the secret was closed at once and the run
/// never started. The oldest unfinished handshake is now shed for a newcomer: the peer gets
/// in long before the stalled sockets' deadline.
#[test]
fn tcp_stalled_handshakes_on_the_peers_own_ip_cannot_keep_it_out() {
    let secret = Some(b"s3cret".to_vec());
    let mut node = TcpTransport::new(TransportConfig {
        secret: secret.clone(),
        ..cfg("bu0", 64 * 1024, 16)
    })
    .unwrap();
    let bound = node.listen("127.0.0.1:0").unwrap();
    let to: SocketAddr = bound.parse().unwrap();
    let (tx, _rx) = mpsc::channel();
    for i in 0..16 {
        hostile([127, 0, 0, 1], to, big_hello(1000), tx.clone(), i);
    }
    let mut evs = vec![Vec::new(), Vec::new()];
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(400) {
        node.poll(&mut evs[1], Some(Duration::from_millis(1)))
            .unwrap();
    }
    let mut peer = TcpTransport::new(TransportConfig {
        secret,
        ..cfg("ru0", 64 * 1024, 64)
    })
    .unwrap();
    peer.connect(
        &bound,
        Hello::new(Channel::Data, Role::Ru, 0, "run1", "ru0"),
    )
    .unwrap();
    let t = Instant::now();
    pump(
        &mut [&mut peer, &mut node],
        &mut evs,
        "the legitimate peer's handshake",
        |e| opened(&e[0]).is_some() && opened(&e[1]).is_some(),
    );
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "the peer got in only after {:?} (the stalled sockets' deadline is 5 s)",
        t.elapsed()
    );
}

/// A topology of n nodes on one host: every one may dial at once from 127.0.0.1.
#[test]
fn admission_limits_scale_with_the_topology() {
    let a = Admission::for_peers(29);
    assert!(a.per_ip >= 2 * 29, "{a:?}");
    assert!(a.total > a.per_ip, "{a:?}");
    assert_eq!(
        Admission::for_peers(1).per_ip,
        Admission::default().per_ip.max(10)
    );
}

// ---- shm ----

use evb_transport::shm::ShmTransport;

/// Two shm transports, connected on `channel`; returns them and the sender's connection.
fn shm_pair(
    tx_cfg: TransportConfig,
    rx_cfg: TransportConfig,
    channel: Channel,
) -> (ShmTransport, ShmTransport, ConnId) {
    let mut a = ShmTransport::create(tx_cfg).unwrap();
    let mut b = ShmTransport::create(rx_cfg).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let conn = a
        .connect(&addr, Hello::new(channel, Role::Ru, 0, "run1", "ru0"))
        .unwrap();
    let mut evs = vec![Vec::new(), Vec::new()];
    pump(&mut [&mut a, &mut b], &mut evs, "the shm handshake", |e| {
        opened(&e[0]).is_some() && opened(&e[1]).is_some()
    });
    (a, b, conn)
}

fn pattern(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|b| (b * 13 + i * 7) as u8).collect()
}

/// Frames of inline bytes into a receive pool far too small for them, held by a slow consumer:
/// the receiver stops reading while it has no block, and everything arrives, in order, with
/// no close (old code: `receive pool exhausted`, connection closed).
fn shm_tiny_pool_back_pressure(channel: Channel) {
    // 16 blocks of 4 KiB = 64 KiB; each frame is 24 KB of inline segments (3 KB each)
    let (mut a, mut b, conn) = shm_pair(cfg("ru0", 64 * 1024, 64), cfg("bu0", 4096, 16), channel);
    const FRAMES: usize = 200;
    for i in 0..FRAMES {
        let segs = (0..8)
            .map(|k| Segment::Owned(pattern(i * 8 + k, 3000)))
            .collect();
        a.send(conn, FrameType::Messages, 8, segs).unwrap();
    }
    let mut evs = [Vec::new(), Vec::new()];
    // a slow consumer: each frame is kept for 3 polls before it is dropped
    let mut held: std::collections::VecDeque<(usize, evb_transport::InFrame)> = Default::default();
    let mut got = 0;
    let mut polls = 0usize;
    let deadline = Instant::now() + Duration::from_secs(20);
    while got < FRAMES {
        assert!(Instant::now() < deadline, "got {got} of {FRAMES} frames");
        a.poll(&mut evs[0], Some(Duration::from_millis(1))).unwrap();
        b.poll(&mut evs[1], Some(Duration::from_millis(1))).unwrap();
        polls += 1;
        for e in evs.iter_mut().flat_map(|e| e.drain(..)) {
            match e {
                Event::Frame { frame, .. } => {
                    let i = got;
                    let mut want = Vec::new();
                    for k in 0..8 {
                        want.extend_from_slice(&pattern(i * 8 + k, 3000));
                    }
                    assert!(
                        frame.payload.eq_bytes(&want),
                        "frame {i} out of order or corrupt"
                    );
                    assert_eq!(frame.count, 8);
                    got += 1;
                    held.push_back((polls, frame));
                }
                Event::Closed { reason, .. } => panic!("closed after {got} frames: {reason}"),
                other => panic!("{other:?}"),
            }
        }
        while held.front().is_some_and(|(at, _)| polls >= at + 3) {
            held.pop_front();
        }
    }
}

#[test]
fn shm_empty_receive_pool_is_back_pressure_not_a_protocol_violation() {
    shm_tiny_pool_back_pressure(Channel::Data);
    shm_tiny_pool_back_pressure(Channel::Control);
}

/// A data connection may not take the last eighth of the receive pool: a control connection
/// still gets blocks while bulk data holds the rest.
#[test]
fn shm_bulk_data_cannot_starve_control_messages() {
    let rx = cfg("bu0", 4096, 16);
    let pool = rx.rx_pool.clone();
    let mut b = ShmTransport::create(rx).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let mut data = ShmTransport::create(cfg("ru0", 64 * 1024, 64)).unwrap();
    let mut ctl = ShmTransport::create(cfg("evm", 64 * 1024, 64)).unwrap();
    let dconn = data
        .connect(&addr, Hello::new(Channel::Data, Role::Ru, 0, "run1", "ru0"))
        .unwrap();
    let cconn = ctl
        .connect(
            &addr,
            Hello::new(Channel::Control, Role::Evm, 0, "run1", "evm"),
        )
        .unwrap();
    let mut evs = vec![Vec::new(), Vec::new(), Vec::new()];
    pump(
        &mut [&mut data, &mut ctl, &mut b],
        &mut evs,
        "both handshakes",
        |e| {
            opened(&e[0]).is_some()
                && opened(&e[1]).is_some()
                && e[2]
                    .iter()
                    .filter(|e| matches!(e, Event::Accepted { .. }))
                    .count()
                    == 2
        },
    );
    evs.iter_mut().for_each(Vec::clear);
    // bulk data: 40 frames of 4 KB, kept by the receiver (never dropped)
    for i in 0..40 {
        data.send(
            dconn,
            FrameType::Messages,
            1,
            vec![Segment::Owned(pattern(i, 4000))],
        )
        .unwrap();
    }
    let mut kept = Vec::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(300) {
        data.poll(&mut evs[0], Some(Duration::from_millis(1)))
            .unwrap();
        b.poll(&mut evs[2], Some(Duration::from_millis(1))).unwrap();
        kept.append(&mut evs[2]);
    }
    assert_eq!(kept.len(), 14, "data may fill all but 16/8 = 2 blocks");
    assert_eq!(pool.free_blocks(), 2);
    // a control message still gets through
    ctl.send(
        cconn,
        FrameType::Messages,
        1,
        vec![Segment::Owned(b"assign".to_vec())],
    )
    .unwrap();
    pump(
        &mut [&mut ctl, &mut b],
        &mut evs[1..],
        "the control message",
        |e| e[1].iter().any(|e| matches!(e, Event::Frame { .. })),
    );
    let Event::Frame { frame, conn } = &evs[2][0] else {
        panic!("{:?}", evs[2])
    };
    assert!(frame.payload.eq_bytes(b"assign"));
    assert!(kept
        .iter()
        .all(|e| !matches!(e, Event::Frame { conn: c, .. } if c == conn)));
    // and the data resumes once the consumer lets its frames go
    drop(kept);
    let mut rest = 0;
    let t = Instant::now();
    while rest < 26 {
        assert!(t.elapsed() < Duration::from_secs(10), "{rest} of 26");
        data.poll(&mut evs[0], Some(Duration::from_millis(1)))
            .unwrap();
        b.poll(&mut evs[2], Some(Duration::from_millis(1))).unwrap();
        rest += evs[2]
            .drain(..)
            .filter(|e| matches!(e, Event::Frame { .. }))
            .count();
    }
}

/// A 16 MiB frame of 4 KiB shared blocks needs 4096 descriptors (100 KiB, more than one
/// 64 KiB packet): it is split over packets and arrives whole (old code: TooLarge after its
/// blocks were lent, or a stall when it had been deferred).
#[test]
fn shm_frame_with_more_descriptors_than_one_packet_holds_arrives_whole() {
    let (mut a, mut b, conn) = shm_pair(
        TransportConfig {
            max_frame: 32 << 20,
            ..cfg("ru0", 64 * 1024, 64)
        },
        TransportConfig {
            max_frame: 32 << 20,
            ..cfg("bu0", 64 * 1024, 64)
        },
        Channel::Data,
    );
    let pool = Pool::new_shared("frags", 4096, 4096 + 16).unwrap();
    let mut segs = Vec::new();
    let mut want = Vec::new();
    // a header inline, then 4096 slices of 4 KiB, then a 20 KB private (copied) tail
    segs.push(Segment::Owned(b"header".to_vec()));
    want.extend_from_slice(b"header");
    for i in 0..4096 {
        let mut w = pool.try_alloc().unwrap();
        let d = pattern(i, 4096);
        want.extend_from_slice(&d);
        segs.push(Segment::Shared(w.append(&d).unwrap()));
    }
    let tail = pattern(99, 20_000);
    want.extend_from_slice(&tail);
    segs.push(Segment::Owned(tail));
    a.send(conn, FrameType::Messages, 1, segs).unwrap();
    // and a small frame behind it, which must come second
    a.send(
        conn,
        FrameType::Messages,
        1,
        vec![Segment::Owned(b"next".to_vec())],
    )
    .unwrap();
    let mut evs = vec![Vec::new(), Vec::new()];
    pump(&mut [&mut a, &mut b], &mut evs, "both frames", |e| {
        e[1].iter()
            .filter(|e| matches!(e, Event::Frame { .. }))
            .count()
            == 2
    });
    let frames: Vec<&evb_transport::InFrame> = evs[1]
        .iter()
        .filter_map(|e| match e {
            Event::Frame { frame, .. } => Some(frame),
            _ => None,
        })
        .collect();
    assert_eq!(frames[0].payload.len(), want.len());
    assert!(frames[0].payload.eq_bytes(&want));
    assert!(frames[1].payload.eq_bytes(b"next"));
    assert_eq!(a.counters().bytes_by_reference, 4096 * 4096);
    evs[1].clear();
    // every block comes home once the receiver lets the frame go
    pump(
        &mut [&mut a, &mut b],
        &mut evs,
        "the blocks' return",
        |_| pool.free_blocks() == 4096 + 16,
    );
}

/// A node that fails writes why and exits with our input unread, which resets the connection.
/// A send of ours that meets the reset must not cost those last words: they are delivered,
/// then the connection is closed (an RU's Abort was lost this way, and the run's reason
/// became "lost ru[0]: connection reset").
#[test]
fn a_peers_last_frame_arrives_before_the_reset_its_exit_caused() {
    let mut node = TcpTransport::new(cfg("evm", 64 * 1024, 64)).unwrap();
    let bound = node.listen("127.0.0.1:0").unwrap();
    let mut peer = TcpTransport::new(cfg("ru0", 64 * 1024, 64)).unwrap();
    let conn = peer
        .connect(
            &bound,
            Hello::new(Channel::Control, Role::Ru, 0, "run1", "ru0"),
        )
        .unwrap();
    let mut evs = vec![Vec::new(), Vec::new()];
    pump(
        &mut [&mut peer, &mut node],
        &mut evs,
        "the handshake",
        |e| opened(&e[0]).is_some() && opened(&e[1]).is_some(),
    );
    let at_node = opened(&evs[1]).unwrap();
    evs.iter_mut().for_each(Vec::clear);
    // the node's message, which the peer never reads
    node.send(
        at_node,
        FrameType::Messages,
        1,
        vec![Segment::Owned(vec![7; 1000])],
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    peer.send(
        conn,
        FrameType::Messages,
        1,
        vec![Segment::Owned(b"last words".to_vec())],
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    drop(peer); // input unread: the kernel resets the connection
    std::thread::sleep(Duration::from_millis(50));
    // the node writes before it reads: the write meets the reset
    let _ = node.send(
        at_node,
        FrameType::Messages,
        1,
        vec![Segment::Owned(vec![8; 1000])],
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "no close: {seen:?}");
        node.poll(&mut evs[1], Some(Duration::from_millis(5)))
            .unwrap();
        for e in evs[1].drain(..) {
            match e {
                Event::Frame { frame, .. } => {
                    seen.push(String::from_utf8_lossy(&frame.payload.to_vec()).into_owned())
                }
                Event::Closed { reason, .. } => seen.push(format!("closed: {reason}")),
                _ => {}
            }
        }
        if seen.iter().any(|s| s.starts_with("closed")) {
            break;
        }
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0], "last words", "{seen:?}");
}

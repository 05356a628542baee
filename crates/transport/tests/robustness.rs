//! Faults from peers that do not play by the rules (issues #10, #16): unauthenticated sockets
//! that try to starve a node, a receive pool that runs dry under shm, frames whose descriptors
//! do not fit one packet, and shared memory that cannot be trusted.

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

/// Polls until `until` holds (10 s at most).
fn pump(
    ts: &mut [&mut dyn Transport],
    evs: &mut [Vec<Event>],
    what: &str,
    until: impl Fn(&[Vec<Event>]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !until(evs) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; events: {:?}",
            evs.iter()
                .map(|e| e
                    .iter()
                    .map(|x| match x {
                        Event::Frame { frame, .. } => format!("frame {}", frame.payload.len()),
                        other => format!("{other:?}"),
                    })
                    .collect::<Vec<_>>())
                .collect::<Vec<_>>()
        );
        for (t, e) in ts.iter_mut().zip(evs.iter_mut()) {
            t.poll(e, Some(Duration::from_millis(1))).unwrap();
        }
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

use super::codec::TAG_POOL;
use super::*;
use evb_wire::{Channel, Role};
use std::os::fd::{AsFd, FromRawFd};

fn cfg(node: &str) -> TransportConfig {
    TransportConfig {
        run_id: "seal-run".into(),
        local: Hello::new(Channel::Data, Role::Bu, 0, "seal-run", node),
        max_frame: 8 << 20,
        rx_pool: Pool::new(node, 64 * 1024, 16),
        secret: None,
    }
}

/// A FRAME packet of inline segments (also for the ring tests).
pub(super) fn frame_packet(ft: FrameType, seq: u64, segs: &[&[u8]]) -> Vec<u8> {
    let mut p = vec![TAG_FRAME, ft as u8, 0, 0, 0, 0, 0, 0];
    p.extend_from_slice(&seq.to_le_bytes());
    p.extend_from_slice(&(segs.len() as u32).to_le_bytes());
    for s in segs {
        p.push(0);
        p.extend_from_slice(&(s.len() as u32).to_le_bytes());
        p.extend_from_slice(s);
    }
    p
}

/// A memfd of `size` bytes with `seals` (none if 0).
fn memfd(size: usize, seals: libc::c_int) -> OwnedFd {
    let name = c"evb-test";
    // SAFETY: plain system call on a valid C string; the result is checked.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    assert!(raw >= 0);
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    std::fs::File::from(fd.try_clone().unwrap())
        .set_len(size as u64)
        .unwrap();
    if seals != 0 {
        // SAFETY: F_ADD_SEALS on our own memfd with an integer argument.
        let sealed = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) };
        assert_eq!(sealed, 0);
    }
    fd
}

/// A hand-made peer: handshakes, offers `fd` as a pool of `claimed` bytes, then sends a
/// frame with a descriptor 512 KiB into it. Returns how the transport closed it.
fn offer(fd: OwnedFd, claimed: u64) -> CloseReason {
    let mut t = ShmTransport::create(cfg("bu0")).unwrap();
    let addr = t.listen("127.0.0.1:0").unwrap();
    let raw = sys::connect(&socket_name("seal-run", &addr)).unwrap();
    let hello = Hello::new(Channel::Data, Role::Ru, 0, "seal-run", "ru0")
        .encode()
        .unwrap();
    assert!(sys::send(
        raw.as_raw_fd(),
        &frame_packet(FrameType::Hello, 0, &[&hello]),
        None
    )
    .unwrap());
    let mut evs = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !evs.iter().any(|e| matches!(e, Event::Accepted { .. })) {
        assert!(std::time::Instant::now() < deadline, "{evs:?}");
        t.poll(&mut evs, Some(Duration::from_millis(1))).unwrap();
    }
    let mut p = vec![TAG_POOL, 0, 0, 0, 0, 0, 0, 0];
    p.extend_from_slice(&77u64.to_le_bytes());
    p.extend_from_slice(&claimed.to_le_bytes());
    assert!(sys::send(raw.as_raw_fd(), &p, Some(fd.as_fd())).unwrap());
    let mut f = frame_packet(FrameType::Messages, 1, &[]);
    f[16..20].copy_from_slice(&1u32.to_le_bytes());
    f.push(1);
    f.extend_from_slice(&77u64.to_le_bytes());
    f.extend_from_slice(&(512u64 << 10).to_le_bytes());
    f.extend_from_slice(&4096u32.to_le_bytes());
    f.extend_from_slice(&0u32.to_le_bytes());
    assert!(sys::send(raw.as_raw_fd(), &f, None).unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        assert!(std::time::Instant::now() < deadline, "{evs:?}");
        t.poll(&mut evs, Some(Duration::from_millis(1))).unwrap();
        for e in evs.drain(..) {
            match e {
                // reading a page the file does not have would be SIGBUS here
                Event::Frame { frame, .. } => panic!("mapped: {}", frame.payload.crc32c()),
                Event::Closed { reason, .. } => return reason,
                _ => {}
            }
        }
    }
}

#[test]
fn unsealed_or_short_peer_memory_is_refused_before_it_is_mapped() {
    let all = sys::REQUIRED_SEALS;
    let r = offer(memfd(1 << 20, 0), 1 << 20);
    assert!(
        matches!(&r, CloseReason::Violation(w) if w.contains("not sealed")),
        "{r}"
    );
    let r = offer(memfd(1 << 20, libc::F_SEAL_SHRINK), 1 << 20);
    assert!(
        matches!(&r, CloseReason::Violation(w) if w.contains("not sealed")),
        "{r}"
    );
    // sealed, but shorter than it claims: mapping 1 MiB would fault at 4 KiB
    let r = offer(memfd(4096, all), 1 << 20);
    assert!(
        matches!(&r, CloseReason::Violation(w) if w.contains("holds 4096 bytes")),
        "{r}"
    );
    // not a memfd at all
    let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
    let r = offer(OwnedFd::from(a), 1 << 20);
    assert!(
        matches!(&r, CloseReason::Violation(w) if w.contains("not a memfd")),
        "{r}"
    );
    assert!(
        r.to_string()
            .starts_with("protocol violation: refusing the peer's shared pool"),
        "{r}"
    );
}

#[test]
fn our_shared_pools_carry_the_seals_peers_require() {
    let pool = Pool::new_shared("sealed", 4096, 4).unwrap();
    let fd = pool.shared_fd().unwrap();
    sys::check_peer_memfd(fd.as_raw_fd(), pool.region_len()).unwrap();
    // and cannot be shrunk under a reader
    // SAFETY: ftruncate on a descriptor we hold; expected to fail with EPERM.
    let r = unsafe { libc::ftruncate(fd.as_raw_fd(), 0) };
    assert_eq!(r, -1);
    let bounce = Pool::new_shared_untouched("bounce", 256 * 1024, 64).unwrap();
    sys::check_peer_memfd(bounce.shared_fd().unwrap().as_raw_fd(), bounce.region_len()).unwrap();
}

//! Tests of the FRAME rings: the ring alone (wrap-around, back-pressure, hostile indices and
//! lengths, no lost wake-ups) and through the transport (order and bytes across the socket
//! and the ring, a full ring, a hostile peer writing garbage into the ring). One idea, the
//! rings' behaviour under test, in one file longer than most.

use super::codec::{TAG_POOL, TAG_RETURN, TAG_RING};
use super::ring::{self, RxRing, TxRing};
use super::tests::frame_packet;
use super::*;
use evb_wire::{Channel, Role};
use std::os::fd::RawFd;
use std::time::Instant;

/// A small seeded generator (xorshift64*), so that every run replays the same schedule.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const SMALL: usize = 256 * 1024;

fn pair(cap: usize) -> (TxRing, RxRing) {
    let tx = TxRing::with_capacity(cap).unwrap();
    let rx = RxRing::map(tx.dup_fd(), cap as u64).unwrap();
    (tx, rx)
}

fn entry(i: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|b| (b as u64 * 31 + i * 7) as u8).collect();
    v[0] = TAG_FRAME;
    v
}

#[test]
fn ring_wraps_around_many_times_with_exact_bytes_and_order() {
    let (mut tx, mut rx) = pair(SMALL);
    let mut rng = Rng(0x5eed_0001);
    let (mut pushed, mut popped) = (0u64, 0u64);
    let mut lens = VecDeque::new();
    let mut bytes_through = 0usize;
    while popped < 20_000 {
        // a random burst of pushes (stopping at the first refusal), then of pops
        for _ in 0..rng.below(40) {
            let len = match rng.below(10) {
                0 => ring::ENTRY_MAX,
                1..=3 => 1 + rng.below(ring::ENTRY_MAX as u64) as usize,
                _ => 1 + rng.below(200) as usize,
            };
            if !tx.push(&entry(pushed, len)).unwrap() {
                break;
            }
            lens.push_back(len);
            pushed += 1;
        }
        for _ in 0..rng.below(40) {
            match rx.pop().unwrap() {
                Some(got) => {
                    let len = lens.pop_front().expect("nothing more was pushed");
                    assert_eq!(got, entry(popped, len), "entry {popped}");
                    bytes_through += ring::entry_size(len);
                    popped += 1;
                }
                None => {
                    assert!(lens.is_empty(), "an entry was pushed but cannot be popped");
                    break;
                }
            }
        }
    }
    // far more than the ring holds went through it: it wrapped many times
    assert!(bytes_through > 50 * SMALL, "{bytes_through}");
}

#[test]
fn a_full_ring_refuses_until_the_consumer_makes_room() {
    let (mut tx, mut rx) = pair(SMALL);
    let len = 1000;
    let per = ring::entry_size(len);
    let mut n = 0u64;
    while tx.push(&entry(n, len)).unwrap() {
        n += 1;
    }
    assert_eq!(n as usize, SMALL / per, "the ring holds exactly what fits");
    // full: the producer asks for a doorbell, and there is no room yet
    assert!(!tx.wait_for_room(len).unwrap());
    assert!(!tx.push(&entry(n, len)).unwrap());
    // one entry consumed: the consumer owes the producer a doorbell, once
    assert_eq!(rx.pop().unwrap().unwrap(), entry(0, len));
    assert!(rx.room_wanted());
    assert!(!rx.room_wanted());
    assert!(tx.push(&entry(n, len)).unwrap());
    for i in 1..=n {
        assert_eq!(rx.pop().unwrap().unwrap(), entry(i, len));
    }
    assert_eq!(rx.pop().unwrap(), None);
}

#[test]
fn impossible_indices_and_lengths_are_errors_not_reads() {
    let cap = SMALL as u64;
    // each case: a fresh ring, what a hostile producer writes, the error expected
    type Poke<'a> = Box<dyn Fn(&RxRing) + 'a>;
    let cases: Vec<(&str, Poke<'_>, &str)> = vec![
        (
            "head beyond the capacity",
            Box::new(|r| r.poke_u64(ring::OFF_HEAD, cap + 8)),
            "impossible",
        ),
        (
            "head behind the tail",
            Box::new(|r| r.poke_u64(ring::OFF_HEAD, u64::MAX - 7)),
            "impossible",
        ),
        (
            "unaligned head",
            Box::new(|r| r.poke_u64(ring::OFF_HEAD, 12)),
            "impossible",
        ),
        (
            "zero length",
            Box::new(|r| r.poke_u64(ring::OFF_HEAD, 16)),
            "bad entry header",
        ),
        (
            "length over 64 KiB",
            Box::new(|r| {
                r.poke_data(0, &(ring::ENTRY_MAX as u32 + 1).to_le_bytes());
                r.poke_u64(ring::OFF_HEAD, cap);
            }),
            "bad entry header",
        ),
        (
            "length beyond the head",
            Box::new(|r| {
                r.poke_data(0, &1000u32.to_le_bytes());
                r.poke_u64(ring::OFF_HEAD, 512);
            }),
            "only 512 bytes are published",
        ),
        (
            "reserved bits",
            Box::new(|r| {
                r.poke_data(0, &[8, 0, 0, 0, 1, 0, 0, 0]);
                r.poke_u64(ring::OFF_HEAD, 16);
            }),
            "bad entry header",
        ),
    ];
    for (what, poke, expect) in cases {
        let (_tx, mut rx) = pair(SMALL);
        poke(&rx);
        let e = rx.pop().expect_err(what);
        assert!(e.to_string().contains(expect), "{what}: {e}");
    }
    // a hostile consumer: an impossible tail is an error at the producer
    let (mut tx, _rx) = pair(SMALL);
    tx.poke_u64(ring::OFF_TAIL, 8);
    let e = tx.push(b"x").expect_err("tail ahead of the head");
    assert!(e.to_string().contains("impossible"), "{e}");
    // a memfd that claims another capacity than announced, or a size not allowed
    let tx = TxRing::with_capacity(SMALL).unwrap();
    assert!(RxRing::map(tx.dup_fd(), 2 * cap)
        .err()
        .unwrap()
        .to_string()
        .contains("holds"));
    assert!(RxRing::map(tx.dup_fd(), cap + 8)
        .err()
        .unwrap()
        .to_string()
        .contains("power of two"));
}

/// Waits until `fd` is readable (a doorbell) and reads what is there; `false` on timeout.
fn wait_bell(fd: &OwnedFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    if r != 1 {
        return false;
    }
    let mut b = [0u8; 64];
    // SAFETY: reading into a live buffer of 64 bytes.
    unsafe { libc::read(fd.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) };
    true
}

fn ring_bell(fd: &OwnedFd) {
    // SAFETY: writing one byte from a live buffer.
    unsafe { libc::write(fd.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
}

fn bell_pair() -> (OwnedFd, OwnedFd) {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    (OwnedFd::from(a), OwnedFd::from(b))
}

/// Producer and consumer on two threads, each sleeping (in poll(2), as the transport sleeps
/// in epoll) whenever it has nothing to do, after arming its flag, under a seeded random
/// schedule of pauses. A lost wake-up would leave one asleep with work waiting: the wait
/// times out and the test fails. The ring is small and the entries large, so the producer
/// waits for room often too.
#[test]
fn sleeping_and_waiting_flags_lose_no_wake_up() {
    for seed in [1u64, 2, 3] {
        let (mut tx, mut rx) = pair(SMALL);
        let (to_consumer, consumer_bell) = bell_pair();
        let (to_producer, producer_bell) = bell_pair();
        const N: u64 = 20_000;
        let producer = std::thread::spawn(move || {
            let mut rng = Rng(seed * 0x9e37_79b9);
            let mut bells = 0u64;
            let mut i = 0;
            while i < N {
                let len = if rng.below(4) == 0 {
                    20_000 + rng.below(40_000) as usize
                } else {
                    1 + rng.below(300) as usize
                };
                loop {
                    if tx.push(&entry(i, len)).unwrap() {
                        break;
                    }
                    if !tx.wait_for_room(len).unwrap() {
                        assert!(wait_bell(&producer_bell, 5000), "producer never woken");
                    }
                }
                i += 1;
                if tx.wake_needed() {
                    bells += 1;
                    ring_bell(&to_consumer);
                }
                for _ in 0..rng.below(3) * rng.below(2000) {
                    std::hint::spin_loop();
                }
            }
            bells
        });
        let mut rng = Rng(seed * 0x51_7cc1_b727);
        let mut got = 0u64;
        let (mut arms, mut sleeps) = (0u64, 0u64);
        while got < N {
            match rx.pop().unwrap() {
                Some(e) => {
                    assert_eq!(e[0], TAG_FRAME);
                    assert_eq!(&e[1..], &entry(got, e.len())[1..], "entry {got}");
                    got += 1;
                    if rng.below(8) == 0 && rx.room_wanted() {
                        ring_bell(&to_producer);
                    }
                }
                None => {
                    if rx.room_wanted() {
                        ring_bell(&to_producer);
                    }
                    arms += 1;
                    if !rx.arm() {
                        sleeps += 1;
                        assert!(wait_bell(&consumer_bell, 5000), "consumer never woken");
                        rx.disarm();
                    }
                    for _ in 0..rng.below(1000) {
                        std::hint::spin_loop();
                    }
                }
            }
        }
        let bells = producer.join().unwrap();
        assert_eq!(rx.pop().unwrap(), None);
        // a doorbell only when asked for, at most once per time the flag was set
        assert!(
            bells <= arms,
            "seed {seed}: {bells} doorbells, {arms} flags set"
        );
        assert!(sleeps > 0, "seed {seed}: the consumer never slept");
    }
}

// ---- through the transport ----

fn tcfg(node: &str, block: usize, blocks: usize) -> TransportConfig {
    TransportConfig {
        run_id: "ring-run".into(),
        local: Hello::new(Channel::Data, Role::Bu, 0, "ring-run", node),
        max_frame: 8 << 20,
        rx_pool: Pool::new(node, block, blocks),
        secret: None,
    }
}

fn connected(
    a_cfg: TransportConfig,
    b_cfg: TransportConfig,
) -> (ShmTransport, ShmTransport, ConnId) {
    let mut a = ShmTransport::create(a_cfg).unwrap();
    let mut b = ShmTransport::create(b_cfg).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let conn = a
        .connect(
            &addr,
            Hello::new(Channel::Data, Role::Ru, 0, "ring-run", "ru0"),
        )
        .unwrap();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ea.iter().any(|e| matches!(e, Event::Connected { .. }))
        || !eb.iter().any(|e| matches!(e, Event::Accepted { .. }))
    {
        assert!(Instant::now() < deadline, "{ea:?} {eb:?}");
        a.poll(&mut ea, Some(Duration::from_millis(1))).unwrap();
        b.poll(&mut eb, Some(Duration::from_millis(1))).unwrap();
    }
    (a, b, conn)
}

fn pattern(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|b| (b * 13 + i * 7 + b / 251) as u8).collect()
}

/// Frames of every shape (inline, descriptors of a shared pool announced on the socket while
/// the frames that name it go through the ring, bounce-pool copies, frames of several
/// packets) arrive whole, in order, byte for byte; and they really went through the ring.
#[test]
fn frames_of_every_shape_arrive_in_order_through_the_ring() {
    let (mut a, mut b, conn) = connected(tcfg("ru0", 64 * 1024, 64), tcfg("bu0", 64 * 1024, 512));
    let shared = Pool::new_shared("ring-src", 64 * 1024, 256).unwrap();
    let mut rng = Rng(0x5eed_0003);
    let mut sent: VecDeque<Vec<u8>> = VecDeque::new();
    let mut got = 0usize;
    let mut evs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    const FRAMES: usize = 2000;
    let mut i = 0;
    while got < FRAMES {
        assert!(Instant::now() < deadline, "{got} of {FRAMES} frames");
        if i < FRAMES && sent.len() < 64 {
            let mut segs = Vec::new();
            let mut whole = Vec::new();
            for k in 0..1 + rng.below(6) {
                let bytes = pattern(
                    i * 8 + k as usize,
                    match rng.below(8) {
                        0 => 5000 + rng.below(60_000) as usize,     // bounce pool
                        1 | 2 => 1 + rng.below(64 * 1024) as usize, // shared pool
                        _ => 1 + rng.below(3000) as usize,          // inline
                    },
                );
                whole.extend_from_slice(&bytes);
                if bytes.len() > 4096 || rng.below(3) == 0 {
                    if let Some(mut w) = shared.try_alloc() {
                        if bytes.len() <= w.remaining() {
                            segs.push(Segment::Shared(w.append(&bytes).unwrap()));
                            continue;
                        }
                    }
                }
                segs.push(Segment::Owned(bytes));
            }
            // now and then a frame of many small segments: several packets
            if rng.below(50) == 0 {
                for k in 0..40 {
                    let bytes = pattern(k, 3000);
                    whole.extend_from_slice(&bytes);
                    segs.push(Segment::Owned(bytes));
                }
            }
            a.send(conn, FrameType::Messages, 1, segs).unwrap();
            sent.push_back(whole);
            i += 1;
        }
        a.poll(&mut Vec::new(), Some(Duration::ZERO)).unwrap();
        b.poll(&mut evs, Some(Duration::ZERO)).unwrap();
        for e in evs.drain(..) {
            match e {
                Event::Frame { frame, .. } => {
                    let want = sent.pop_front().expect("a frame not sent");
                    assert_eq!(frame.payload.len(), want.len(), "frame {got}");
                    assert!(frame.payload.to_vec() == want, "frame {got}: bytes differ");
                    got += 1;
                }
                other => panic!("{other:?}"),
            }
        }
    }
    let c = a.conns.values().next().unwrap();
    assert!(c.tx_ring.is_some() && c.ring_queue.is_empty());
    // every frame after the handshake crossed in the ring (one on the socket would have been
    // a protocol violation): at least its header each
    let rx = b.conns.values().next().unwrap().rx_ring.as_ref().unwrap();
    assert!(
        rx.consumed() >= (FRAMES * FRAME_HEAD) as u64,
        "{}",
        rx.consumed()
    );
}

/// A receiver that does not poll: the ring fills, later frames wait in the sender's queue
/// (no error, no reordering), and all of them arrive once it reads, the sender woken by
/// the receiver's doorbells while both block in `poll`.
#[test]
fn a_full_ring_is_back_pressure_and_blocking_peers_wake_each_other() {
    let (mut a, mut b, conn) = connected(tcfg("ru0", 64 * 1024, 64), tcfg("bu0", 64 * 1024, 64));
    const FRAMES: usize = 600;
    const LEN: usize = 3000;
    for i in 0..FRAMES {
        a.send(
            conn,
            FrameType::Messages,
            1,
            vec![Segment::Owned(pattern(i, LEN))],
        )
        .unwrap();
    }
    let c = a.conns.values().next().unwrap();
    assert!(
        !c.ring_queue.is_empty(),
        "1.8 MB cannot all fit a 512 KiB ring"
    );
    assert!(a.queued_bytes(conn) > 0);
    let before = c.ring_queue.len();
    // the sender alone makes no progress and reports nothing
    let mut evs = Vec::new();
    a.poll(&mut evs, Some(Duration::from_millis(20))).unwrap();
    assert!(evs.is_empty(), "{evs:?}");
    assert_eq!(a.conns.values().next().unwrap().ring_queue.len(), before);
    // both now block in poll, on two threads: each wakes the other with doorbells
    let sender = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        while a.queued_bytes(conn) > 0 {
            assert!(Instant::now() < deadline, "the sender was never woken");
            a.poll(&mut Vec::new(), Some(Duration::from_secs(5)))
                .unwrap();
        }
        a
    });
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while got < FRAMES {
        assert!(Instant::now() < deadline, "{got} of {FRAMES}");
        b.poll(&mut evs, Some(Duration::from_secs(5))).unwrap();
        for e in evs.drain(..) {
            let Event::Frame { frame, .. } = e else {
                panic!("{e:?}")
            };
            assert!(frame.payload.to_vec() == pattern(got, LEN), "frame {got}");
            got += 1;
        }
    }
    let a = sender.join().unwrap();
    assert_eq!(a.queued_bytes(conn), 0);
}

/// Ping-pong with both sides blocking in `poll` (no busy-polling): every reply arrives by
/// the doorbell, never by a timeout.
#[test]
fn blocking_round_trips_are_woken_by_doorbells() {
    let (mut a, b, conn) = connected(tcfg("ru0", 64 * 1024, 64), tcfg("bu0", 64 * 1024, 64));
    const TRIPS: usize = 2000;
    let echo = echo_thread(b, TRIPS, Duration::ZERO);
    let slowest = slowest_round_trip(&mut a, conn, TRIPS);
    // a lost wake-up waits for the 10 s timeout
    assert!(
        slowest < Duration::from_secs(2),
        "slowest round trip {slowest:?}"
    );
    let _b = echo.join().unwrap();
}

/// Echoes `trips` frames back on the connection they came on, each after `pause`; returns
/// the transport when done.
fn echo_thread<T: Transport + 'static>(
    mut b: T,
    trips: usize,
    pause: Duration,
) -> std::thread::JoinHandle<T> {
    std::thread::spawn(move || {
        let mut evs = Vec::new();
        let mut n = 0;
        while n < trips {
            b.poll(&mut evs, Some(Duration::from_secs(10))).unwrap();
            for e in evs.drain(..) {
                if let Event::Frame { conn, frame } = e {
                    std::thread::sleep(pause);
                    let bytes = frame.payload.to_vec();
                    b.send(conn, FrameType::Messages, 1, vec![Segment::Owned(bytes)])
                        .unwrap();
                    n += 1;
                }
            }
        }
        b
    })
}

/// `trips` 64-byte round trips on `conn`, blocking in `poll` (10 s at most) for each reply;
/// the slowest.
fn slowest_round_trip(a: &mut dyn Transport, conn: ConnId, trips: usize) -> Duration {
    let mut evs = Vec::new();
    let mut slowest = Duration::ZERO;
    for i in 0..trips {
        let t = Instant::now();
        let segs = vec![Segment::Owned(pattern(i, 64))];
        a.send(conn, FrameType::Messages, 1, segs).unwrap();
        loop {
            a.poll(&mut evs, Some(Duration::from_secs(10))).unwrap();
            if let Some(Event::Frame { frame, .. }) = evs.pop() {
                assert!(frame.payload.to_vec() == pattern(i, 64));
                break;
            }
        }
        slowest = slowest.max(t.elapsed());
    }
    slowest
}

/// A hand-made peer of `t` (listening on `addr`): handshakes over a raw socket; returns the
/// socket and a ring of its own (not offered yet).
fn raw_peer_of(t: &mut ShmTransport, addr: &str) -> (OwnedFd, TxRing) {
    let raw = sys::connect(&socket_name("ring-run", addr)).unwrap();
    let hello = Hello::new(Channel::Data, Role::Ru, 0, "ring-run", "ru0")
        .encode()
        .unwrap();
    let p = frame_packet(FrameType::Hello, 0, &[&hello]);
    assert!(sys::send(raw.as_raw_fd(), &p, None).unwrap());
    let mut evs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !evs.iter().any(|e| matches!(e, Event::Accepted { .. })) {
        assert!(Instant::now() < deadline, "{evs:?}");
        t.poll(&mut evs, Some(Duration::from_millis(1))).unwrap();
    }
    (raw, TxRing::with_capacity(SMALL).unwrap())
}

fn raw_peer() -> (ShmTransport, OwnedFd, TxRing) {
    let mut t = ShmTransport::create(tcfg("bu0", 64 * 1024, 16)).unwrap();
    let addr = t.listen("127.0.0.1:0").unwrap();
    let (raw, ring) = raw_peer_of(&mut t, &addr);
    (t, raw, ring)
}

fn ring_packet(ring: &TxRing) -> Vec<u8> {
    let mut p = vec![TAG_RING, 0, 0, 0, 0, 0, 0, 0];
    p.extend_from_slice(&(ring.capacity() as u64).to_le_bytes());
    p
}

/// Polls until the connection closes or `n` frames arrive; returns the frames' bytes and the
/// close reason.
fn collect(t: &mut ShmTransport, n: usize) -> (Vec<Vec<u8>>, Option<CloseReason>) {
    let mut evs = Vec::new();
    let mut frames = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while frames.len() < n {
        assert!(Instant::now() < deadline, "{} frames", frames.len());
        t.poll(&mut evs, Some(Duration::from_millis(1))).unwrap();
        for e in evs.drain(..) {
            match e {
                Event::Frame { frame, .. } => frames.push(frame.payload.to_vec()),
                Event::Closed { reason, .. } => return (frames, Some(reason)),
                _ => {}
            }
        }
    }
    (frames, None)
}

/// Frames over the socket first, then the RING packet, then frames in the ring (one naming a
/// pool whose POOL packet is in the socket): all in sequence, and a peer's end of stream is
/// reported after what its ring still held.
#[test]
fn socket_frames_then_ring_frames_keep_their_order() {
    let (mut t, raw, mut ring) = raw_peer();
    let fd = raw.as_raw_fd();
    for seq in 1..=3u64 {
        let p = frame_packet(
            FrameType::Messages,
            seq,
            &[format!("socket {seq}").as_bytes()],
        );
        assert!(sys::send(fd, &p, None).unwrap());
    }
    assert!(sys::send(fd, &ring_packet(&ring), ring.fd()).unwrap());
    for seq in 4..=6u64 {
        let p = frame_packet(
            FrameType::Messages,
            seq,
            &[format!("ring {seq}").as_bytes()],
        );
        assert!(ring.push(&p).unwrap());
    }
    let (frames, closed) = collect(&mut t, 6);
    assert_eq!(closed, None);
    let want: Vec<Vec<u8>> = (1..=6)
        .map(|s| format!("{} {s}", if s <= 3 { "socket" } else { "ring" }).into_bytes())
        .collect();
    assert_eq!(frames, want);
    // a descriptor of a pool announced on the socket just before, read by a busy-polling
    // receiver that looks at the ring first
    let pool = Pool::new_shared("raw-pool", 4096, 4).unwrap();
    let mut w = pool.try_alloc().unwrap();
    let s = w.append(b"by reference").unwrap();
    let mut p = vec![TAG_POOL, 0, 0, 0, 0, 0, 0, 0];
    p.extend_from_slice(&9u64.to_le_bytes());
    p.extend_from_slice(&(pool.region_len() as u64).to_le_bytes());
    assert!(sys::send(fd, &p, pool.shared_fd()).unwrap());
    let mut f = frame_packet(FrameType::Messages, 7, &[]);
    f[16..20].copy_from_slice(&1u32.to_le_bytes());
    f.push(1);
    f.extend_from_slice(&9u64.to_le_bytes());
    f.extend_from_slice(&(s.region_offset() as u64).to_le_bytes());
    f.extend_from_slice(&(s.len() as u32).to_le_bytes());
    f.extend_from_slice(&0u32.to_le_bytes());
    assert!(ring.push(&f).unwrap());
    let mut evs = Vec::new();
    t.zero_polls = 0;
    t.poll(&mut evs, Some(Duration::ZERO)).unwrap();
    let Some(Event::Frame { frame, .. }) = evs.pop() else {
        panic!("{evs:?}")
    };
    assert_eq!(frame.payload.to_vec(), b"by reference");
    // a frame on the socket once the ring is open is a violation; but first, the peer's
    // last ring frames and its end: the frames come first, then the close
    for seq in 8..=9u64 {
        assert!(ring
            .push(&frame_packet(FrameType::Messages, seq, &[b"last"]))
            .unwrap());
    }
    drop(raw);
    let (frames, closed) = collect(&mut t, 3);
    assert_eq!(frames, vec![b"last".to_vec(), b"last".to_vec()]);
    assert!(matches!(closed, Some(CloseReason::Lost(_))), "{closed:?}");
}

/// A peer that writes garbage into its ring (any field, any time), or breaks the rules
/// around it, loses its connection with a protocol violation; the transport keeps serving
/// its other connections and accepts new ones.
#[test]
fn garbage_in_a_peers_ring_closes_that_connection_only() {
    type Poke = Box<dyn Fn(&mut TxRing, RawFd)>;
    let cases: Vec<(&str, Poke, &str)> = vec![
        (
            "head far ahead",
            Box::new(|r, _| r.poke_u64(ring::OFF_HEAD, 1 << 40)),
            "impossible",
        ),
        (
            "head unaligned",
            Box::new(|r, _| r.poke_u64(ring::OFF_HEAD, 3)),
            "impossible",
        ),
        (
            "zero-length entry",
            Box::new(|r, _| r.poke_u64(ring::OFF_HEAD, 8)),
            "bad entry header",
        ),
        (
            "an entry that is not a frame",
            Box::new(|r, _| {
                assert!(r.push(&[TAG_RETURN, 0, 0, 0, 0, 0, 0, 0]).unwrap());
            }),
            "not a FRAME",
        ),
        (
            "a frame of garbage",
            Box::new(|r, _| {
                assert!(r.push(&[TAG_FRAME, 9, 9, 9, 9, 9, 9]).unwrap());
            }),
            "short frame packet",
        ),
        (
            "a descriptor of a pool never announced",
            Box::new(|r, _| {
                let mut f = frame_packet(FrameType::Messages, 1, &[]);
                f[16..20].copy_from_slice(&1u32.to_le_bytes());
                f.push(1);
                f.extend_from_slice(&[0u8; 24]);
                assert!(r.push(&f).unwrap());
            }),
            "unknown pool",
        ),
        (
            "a frame on the socket after RING",
            Box::new(|_, fd| {
                let p = frame_packet(FrameType::Messages, 1, &[b"late"]);
                assert!(sys::send(fd, &p, None).unwrap());
            }),
            "on the socket after RING",
        ),
        (
            "a second RING",
            Box::new(|_, fd| {
                let r2 = TxRing::with_capacity(SMALL).unwrap();
                assert!(sys::send(fd, &ring_packet(&r2), r2.fd()).unwrap());
            }),
            "second RING",
        ),
    ];
    let mut t = ShmTransport::create(tcfg("bu0", 64 * 1024, 64)).unwrap();
    let addr = t.listen("127.0.0.1:0").unwrap();
    // a good connection beside the bad ones
    let mut good_peer = ShmTransport::create(tcfg("ru9", 64 * 1024, 16)).unwrap();
    let good = good_peer
        .connect(
            &addr,
            Hello::new(Channel::Data, Role::Ru, 1, "ring-run", "ru9"),
        )
        .unwrap();
    let mut evs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut good_evs = Vec::new();
    let mut good_at_t = None;
    while good_at_t.is_none()
        || !good_evs
            .iter()
            .any(|e| matches!(e, Event::Connected { .. }))
    {
        assert!(Instant::now() < deadline);
        good_peer
            .poll(&mut good_evs, Some(Duration::from_millis(1)))
            .unwrap();
        t.poll(&mut evs, Some(Duration::from_millis(1))).unwrap();
        if let Some(Event::Accepted { conn, .. }) = evs.pop() {
            good_at_t = Some(conn);
        }
    }
    let good_at_t = good_at_t.unwrap();
    for (what, poke, expect) in cases {
        let (raw, mut ring) = raw_peer_of(&mut t, &addr);
        assert!(sys::send(raw.as_raw_fd(), &ring_packet(&ring), ring.fd()).unwrap());
        for _ in 0..5 {
            t.poll(&mut evs, Some(Duration::from_millis(1))).unwrap();
        }
        assert!(evs.is_empty(), "{what}: {evs:?}");
        poke(&mut ring, raw.as_raw_fd());
        let (frames, closed) = collect(&mut t, 1);
        assert!(frames.is_empty(), "{what}");
        match closed {
            Some(CloseReason::Violation(w)) => assert!(w.contains(expect), "{what}: {w}"),
            other => panic!("{what}: {other:?}"),
        }
    }
    // the good connection still works, both ways
    good_peer
        .send(
            good,
            FrameType::Messages,
            1,
            vec![Segment::Owned(b"still here".to_vec())],
        )
        .unwrap();
    let (frames, closed) = collect(&mut t, 1);
    assert_eq!((frames, closed), (vec![b"still here".to_vec()], None));
    t.send(
        good_at_t,
        FrameType::Messages,
        1,
        vec![Segment::Owned(b"and back".to_vec())],
    )
    .unwrap();
    let (frames, closed) = collect(&mut good_peer, 1);
    assert_eq!((frames, closed), (vec![b"and back".to_vec()], None));
}

/// A peer that writes an impossible tail into the ring it reads: the writer (us) closes that
/// connection with a protocol violation instead of overwriting what it has not read.
#[test]
fn an_impossible_tail_from_the_reader_closes_the_connection() {
    let (mut t, raw, _ring) = raw_peer();
    // our RING packet comes after the HelloAck
    let mut buf = vec![0u8; MAX_PACKET];
    let deadline = Instant::now() + Duration::from_secs(5);
    let rx = loop {
        assert!(Instant::now() < deadline);
        t.poll(&mut Vec::new(), Some(Duration::from_millis(1)))
            .unwrap();
        if let sys::Recv::Packet { len, fd, .. } = sys::recv(raw.as_raw_fd(), &mut buf).unwrap() {
            if buf[0] == TAG_RING {
                let Ok(Control::Ring { capacity: cap }) = Control::decode(&buf[..len]) else {
                    panic!("a RING packet");
                };
                break RxRing::map(fd.unwrap(), cap).unwrap();
            }
        }
    };
    let conn = ConnId(t.conns.keys().next().unwrap().0 as u64);
    rx.poke_u64(ring::OFF_TAIL, 1 << 30);
    t.send(
        conn,
        FrameType::Messages,
        1,
        vec![Segment::Owned(b"x".to_vec())],
    )
    .unwrap();
    let (_, closed) = collect(&mut t, 1);
    assert!(
        matches!(&closed, Some(CloseReason::Violation(w)) if w.contains("tail")),
        "{closed:?}"
    );
}

/// An idle mux asked to wait less than a millisecond waits (epoll's whole millisecond,
/// rounded up), where it returned at once and left its caller spinning.
#[test]
fn an_idle_mux_waits_out_a_sub_millisecond_timeout() {
    let a = ShmTransport::create(tcfg("ru0", 64 * 1024, 64)).unwrap();
    let route: crate::mux::Route = Box::new(|_| 0);
    let mut mux = crate::mux::MuxTransport::new(vec![Box::new(a)], route);
    let mut out = Vec::new();
    for wait in [Duration::from_micros(300), Duration::from_micros(999)] {
        let t = Instant::now();
        mux.poll(&mut out, Some(wait)).unwrap();
        assert!(out.is_empty(), "{out:?}");
        assert!(
            t.elapsed() >= wait,
            "{wait:?}: back after {:?}",
            t.elapsed()
        );
    }
}

/// A shm transport inside `mux`, which sleeps on the parts' `wait_fd` itself: it arms the
/// rings first (`prepare_wait`), so a frame written into a ring while it sleeps wakes it.
#[test]
fn mux_waiting_on_the_wait_fd_is_woken_by_ring_frames() {
    let a = ShmTransport::create(tcfg("ru0", 64 * 1024, 64)).unwrap();
    let mut b = ShmTransport::create(tcfg("bu0", 64 * 1024, 64)).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let route: crate::mux::Route = Box::new(|_| 0);
    let mut mux = crate::mux::MuxTransport::new(vec![Box::new(a)], route);
    let hello = Hello::new(Channel::Data, Role::Ru, 0, "ring-run", "ru0");
    let conn = mux.connect(&addr, hello).unwrap();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ea.iter().any(|e| matches!(e, Event::Connected { .. }))
        || !eb.iter().any(|e| matches!(e, Event::Accepted { .. }))
    {
        assert!(Instant::now() < deadline, "{ea:?} {eb:?}");
        mux.poll(&mut ea, Some(Duration::from_millis(1))).unwrap();
        b.poll(&mut eb, Some(Duration::from_millis(1))).unwrap();
    }
    const TRIPS: usize = 300;
    // a pause before each reply, so that the mux is asleep when it comes
    let echo = echo_thread(b, TRIPS, Duration::from_micros(200));
    let slowest = slowest_round_trip(&mut mux, conn, TRIPS);
    // a lost wake-up waits for the 10 s timeout
    assert!(
        slowest < Duration::from_secs(2),
        "slowest round trip {slowest:?}"
    );
    echo.join().unwrap();
}

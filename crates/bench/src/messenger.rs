//! evb's messaging layer on its own: senders and receivers as threads of this process, each
//! with its own `Messenger` over the tcp (loopback) or inproc transport.
//!
//! Threads rather than child processes: per-thread CPU time is exact, start-up is instant,
//! and over loopback the kernel does the same work either way (a thread of another process
//! shares nothing with its peer but the socket).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use evb_buffers::{Chain, Pool};
use evb_messaging::{fragment_prefix, Incoming, Messenger, MessengerConfig, Received};
use evb_transport::{ConnId, TransportConfig};
use evb_wire::{Channel, FragmentHeader, Hello, Message, Role, FLAG_GENERATED};

use crate::measure::{fill_rates, thread_cpu, Point, RoundTrips};

const RUN: &str = "bench";
const BLOCK: usize = 256 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tcp,
    Inproc,
    /// libfabric's tcp provider through the `ofi` transport.
    Ofi,
    /// Shared memory between threads' transports (descriptors over a Unix socket).
    Shm,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Tcp => "tcp",
            Kind::Inproc => "inproc",
            Kind::Ofi => "ofi",
            Kind::Shm => "shm",
        }
    }
}

/// How the senders hand messages to the messenger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// `send_batched` of a control message (a `Report` whose encoding is `size` bytes).
    Batched,
    /// `send_fragment` of a fragment with `size` payload bytes in pool blocks (no copy).
    Fragment,
}

impl Path {
    pub fn name(self) -> &'static str {
        match self {
            Path::Batched => "batched",
            Path::Fragment => "fragment",
        }
    }
}

#[derive(Debug, Clone)]
pub struct MeshSpec {
    pub kind: Kind,
    pub path: Path,
    pub senders: usize,
    pub receivers: usize,
    pub size: usize,
    pub duration: Duration,
    /// Senders on the first CPU, receivers on the last (needs two CPUs).
    pub pin: bool,
}

/// (sender CPU, receiver CPU) for pinned runs: the first and the last this process may use.
pub fn pin_cpus() -> Option<(usize, usize)> {
    let cpus = evb_node::affinity::current_cpus().ok()?;
    match (cpus.first(), cpus.last()) {
        (Some(&a), Some(&b)) if a != b => Some((a, b)),
        _ => None,
    }
}

fn pin(cpu: Option<usize>) -> Result<(), String> {
    match cpu {
        Some(c) => evb_node::affinity::pin_current_thread(&[c])
            .map_err(|e| format!("cannot pin to CPU {c}: {e}")),
        None => Ok(()),
    }
}

static UNIQUE: AtomicU64 = AtomicU64::new(0);

fn unique(prefix: &str) -> String {
    format!(
        "bench-{prefix}-{}-{}",
        std::process::id(),
        UNIQUE.fetch_add(1, Ordering::Relaxed)
    )
}

fn messenger(kind: Kind, node: &str, role: Role, index: u16, rx_blocks: usize) -> Messenger {
    let cfg = TransportConfig {
        run_id: RUN.into(),
        local: Hello::new(Channel::Data, role, index, RUN, node),
        max_frame: 16 << 20,
        rx_pool: Pool::new(node, BLOCK, rx_blocks),
        secret: None,
    };
    // `evb bench` adds ofi series only where `ofi::probe("tcp")` succeeded
    let t = evb_messaging::open_transport(kind.name(), cfg, "tcp")
        .unwrap_or_else(|e| panic!("{} transport: {e}", kind.name()));
    Messenger::new(t, MessengerConfig::default())
}

fn listen(m: &mut Messenger, kind: Kind) -> Result<String, String> {
    let addr = match kind {
        Kind::Tcp | Kind::Ofi | Kind::Shm => "127.0.0.1:0".to_string(),
        Kind::Inproc => unique("inproc"),
    };
    m.listen(&addr).map_err(|e| e.to_string())
}

/// Connects to every address and waits until all are open.
fn connect_all(
    m: &mut Messenger,
    addrs: &[String],
    me: &str,
    index: u16,
) -> Result<Vec<ConnId>, String> {
    let mut conns = Vec::new();
    for a in addrs {
        let hello = Hello::new(Channel::Data, Role::Ru, index, RUN, me);
        conns.push(m.connect(a, hello).map_err(|e| e.to_string())?);
    }
    let mut open = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut inc = Vec::new();
    while open < conns.len() {
        if Instant::now() > deadline {
            return Err("connections did not open within 10 s".into());
        }
        m.poll(&mut inc, Some(Duration::from_millis(5)))
            .map_err(|e| e.to_string())?;
        for e in inc.drain(..) {
            match e {
                Incoming::Connected { .. } => open += 1,
                Incoming::Closed { reason, .. } => return Err(format!("connect: {reason}")),
                _ => {}
            }
        }
    }
    Ok(conns)
}

/// A fragment of `size` payload bytes (pattern-filled once) as a chain of pool slices.
fn make_fragment(pool: &Pool, size: usize) -> Chain {
    let payload: Vec<u8> = (0..size).map(|i| (i * 7 + 1) as u8).collect();
    let h = FragmentHeader {
        event_id: 1,
        trigger_number: 1,
        source_id: 0,
        flags: FLAG_GENERATED,
        payload_size: size as u32,
        payload_crc: 0,
    };
    let mut chain = Chain::new();
    let mut w = pool.try_alloc().expect("fragment pool");
    chain.push(w.append(&fragment_prefix(&h)).expect("prefix fits"));
    let mut rest = &payload[..];
    while !rest.is_empty() {
        if w.remaining() == 0 {
            w = pool.try_alloc().expect("fragment pool");
        }
        let n = rest.len().min(w.remaining());
        chain.push(w.append(&rest[..n]).expect("fits"));
        rest = &rest[n..];
    }
    chain
}

fn report_of(size: usize) -> Message {
    Message::Report("x".repeat(size.saturating_sub(8)))
}

struct SenderResult {
    cpu: Duration,
}

struct ReceiverResult {
    msgs: u64,
    bytes: u64,
    first: Option<Instant>,
    last: Instant,
    cpu: Duration,
}

/// The variant of [`two_meshes`]' point.
pub const TWO_MESHES: &str = "two meshes at once";

/// Two [`mesh`]es of `spec` at the same time, each moving its own bytes: what each moves is
/// the most a pipeline whose every byte crosses the host's network stack twice (a front-end
/// to its RU, the RU to a BU) could move on the same cores with no work of its own. The
/// point holds the two meshes' mean rate per mesh.
pub fn two_meshes(spec: &MeshSpec) -> Result<Point, String> {
    let other = spec.clone();
    let a = std::thread::spawn(move || mesh(&other));
    let b = mesh(spec);
    let a = a.join().map_err(|_| "mesh thread panicked".to_string())??;
    let b = b?;
    let mut p = a.clone();
    p.variant = TWO_MESHES.into();
    let mean = |x: f64, y: f64| (x + y) / 2.0;
    p.msgs_per_s = mean(a.msgs_per_s, b.msgs_per_s);
    p.gb_per_s = mean(a.gb_per_s, b.gb_per_s);
    p.send_cpu_s_per_gb = mean(a.send_cpu_s_per_gb, b.send_cpu_s_per_gb);
    p.recv_cpu_s_per_gb = mean(a.recv_cpu_s_per_gb, b.recv_cpu_s_per_gb);
    p.note = format!("per mesh: {:.3} and {:.3} GB/s", a.gb_per_s, b.gb_per_s);
    Ok(p)
}

/// Runs `senders` threads sending round-robin to `receivers` threads for `duration`.
pub fn mesh(spec: &MeshSpec) -> Result<Point, String> {
    let MeshSpec {
        kind,
        path,
        senders,
        receivers,
        size,
        duration,
        pin: pinned,
    } = spec.clone();
    let cpus = if pinned { pin_cpus() } else { None };
    // Bytes a sender may have sent to one receiver that it has not consumed yet.
    let window: u64 = match kind {
        Kind::Tcp | Kind::Ofi | Kind::Shm => (32u64 << 20).max(4 * size as u64),
        Kind::Inproc => (8u64 << 20).max(2 * size as u64),
    };
    let acked: Arc<Vec<AtomicU64>> = Arc::new(
        (0..senders * receivers)
            .map(|_| AtomicU64::new(0))
            .collect(),
    );
    // Sized for the window: the pool reuses its most recently freed blocks first, so a
    // larger one would only hold memory that is never touched.
    let rx_blocks = match kind {
        Kind::Tcp => (8usize << 20).max(4 * size) / BLOCK + 8,
        Kind::Ofi | Kind::Shm => 2 * window as usize / BLOCK + 16,
        Kind::Inproc => 2 * window as usize / BLOCK + 16,
    };

    let mut addrs = Vec::new();
    let mut rx_threads = Vec::new();
    for r in 0..receivers {
        let mut m = messenger(kind, &unique("rx"), Role::Bu, r as u16, rx_blocks);
        addrs.push(listen(&mut m, kind)?);
        let acked = acked.clone();
        rx_threads.push(std::thread::spawn(move || {
            pin(cpus.map(|c| c.1))?;
            receiver(m, r, senders, receivers, &acked)
        }));
    }
    let barrier = Arc::new(Barrier::new(senders));
    let mut tx_threads = Vec::new();
    for s in 0..senders {
        let addrs = addrs.clone();
        let acked = acked.clone();
        let barrier = barrier.clone();
        tx_threads.push(std::thread::spawn(move || {
            pin(cpus.map(|c| c.0))?;
            sender(
                kind, path, s, &addrs, size, duration, window, &acked, &barrier,
            )
        }));
    }
    let mut send_cpu = Duration::ZERO;
    let mut errors = Vec::new();
    for t in tx_threads {
        match t.join() {
            Ok(Ok(r)) => send_cpu += r.cpu,
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push("sender thread panicked".into()),
        }
    }
    let mut recv_cpu = Duration::ZERO;
    let (mut msgs, mut bytes) = (0, 0);
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    for t in rx_threads {
        match t.join() {
            Ok(Ok(r)) => {
                recv_cpu += r.cpu;
                msgs += r.msgs;
                bytes += r.bytes;
                first = match (first, r.first) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                last = Some(last.map_or(r.last, |l: Instant| l.max(r.last)));
            }
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push("receiver thread panicked".into()),
        }
    }
    if let Some(e) = errors.into_iter().next() {
        return Err(e);
    }
    let (Some(first), Some(last)) = (first, last) else {
        return Err("nothing was received".into());
    };
    let secs = last.duration_since(first).as_secs_f64().max(1e-9);
    let bench = if senders == 1 && receivers == 1 {
        "p2p"
    } else {
        "nxn"
    };
    let variant = match cpus {
        Some(_) => format!("{} pinned", path.name()),
        None => path.name().to_string(),
    };
    let mut p = Point::new(bench, "evb", kind.name(), &variant, size as u64);
    p.senders = senders as u32;
    p.receivers = receivers as u32;
    fill_rates(&mut p, msgs, bytes, secs, send_cpu, recv_cpu);
    Ok(p)
}

#[allow(clippy::too_many_arguments)]
fn sender(
    kind: Kind,
    path: Path,
    me: usize,
    addrs: &[String],
    size: usize,
    duration: Duration,
    window: u64,
    acked: &[AtomicU64],
    barrier: &Barrier,
) -> Result<SenderResult, String> {
    let name = unique("tx");
    let mut m = messenger(kind, &name, Role::Ru, me as u16, 16);
    let conns = connect_all(&mut m, addrs, &name, me as u16)?;
    let r = conns.len();
    // over shm the payload lives where the receiver can read it in place
    let pool = match kind {
        Kind::Shm => Pool::new_shared(&name, BLOCK, size / BLOCK + 4).map_err(|e| e.to_string())?,
        _ => Pool::new(&name, BLOCK, size / BLOCK + 4),
    };
    let frag = make_fragment(&pool, size);
    let report = report_of(size);
    let mut sent = vec![0u64; r];
    let mut inc = Vec::new();
    let burst = if size <= 4096 { 256 } else { 4 };
    // Below this much queued in the transport, add more: the socket takes it from there.
    // Queuing several MiB in user space measured up to 2x slower over loopback (the kernel
    // then hands the receiver more than its socket takes at once; see docs/performance.md).
    let queue_cap = (1usize << 20).max(size);
    barrier.wait();
    let cpu0 = thread_cpu();
    let end = Instant::now() + duration;
    let mut dest = 0;
    loop {
        let mut stalled = 0;
        let mut i = 0;
        while i < burst && stalled < r {
            let d = dest;
            dest = (dest + 1) % r;
            let ack = acked[me * r + d].load(Ordering::Relaxed);
            if sent[d] - ack >= window || m.queued_bytes(conns[d]) >= queue_cap {
                stalled += 1;
                continue;
            }
            stalled = 0;
            let res = match path {
                Path::Batched => m.send_batched(conns[d], &report),
                Path::Fragment => m.send_fragment(conns[d], &frag),
            };
            res.map_err(|e| format!("send: {e}"))?;
            sent[d] += size as u64;
            i += 1;
        }
        m.flush_due(Instant::now());
        if Instant::now() >= end {
            break;
        }
        let wait = if stalled >= r {
            // Every destination is full: wait for the socket (tcp) or the receiver (inproc).
            if kind != Kind::Inproc && conns.iter().all(|c| m.queued_bytes(*c) > 0) {
                Some(Duration::from_millis(2))
            } else {
                std::thread::yield_now();
                Some(Duration::ZERO)
            }
        } else {
            Some(Duration::ZERO)
        };
        m.poll(&mut inc, wait).map_err(|e| e.to_string())?;
        check_closed(&mut inc)?;
    }
    for c in &conns {
        m.send_now(*c, &Message::Halt).map_err(|e| e.to_string())?;
    }
    drain(&mut m, &conns, &mut inc)?;
    let cpu = thread_cpu() - cpu0;
    Ok(SenderResult { cpu })
}

fn check_closed(inc: &mut Vec<Incoming>) -> Result<(), String> {
    for e in inc.drain(..) {
        if let Incoming::Closed { reason, .. } = e {
            return Err(format!("connection closed: {reason}"));
        }
    }
    Ok(())
}

/// Polls until every connection's queue is written out (after the final Halt: a receiver
/// that has what it needs may close first, which is not an error).
fn drain(m: &mut Messenger, conns: &[ConnId], inc: &mut Vec<Incoming>) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut closed = 0;
    while closed < conns.len() && conns.iter().any(|c| m.queued_bytes(*c) > 0) {
        if Instant::now() > deadline {
            return Err("could not write out the send queue in 30 s".into());
        }
        m.poll(inc, Some(Duration::from_millis(2)))
            .map_err(|e| e.to_string())?;
        closed += inc
            .drain(..)
            .filter(|e| matches!(e, Incoming::Closed { .. }))
            .count();
    }
    Ok(())
}

fn receiver(
    mut m: Messenger,
    me: usize,
    senders: usize,
    receivers: usize,
    acked: &[AtomicU64],
) -> Result<ReceiverResult, String> {
    let mut from: HashMap<ConnId, usize> = HashMap::new();
    let mut inc = Vec::new();
    let mut halts = 0;
    let mut halted = Vec::new();
    let (mut last_conn, mut last_from) = (ConnId(u64::MAX), 0);
    let (mut msgs, mut bytes) = (0u64, 0u64);
    let mut first = None;
    let mut cpu0 = Duration::ZERO;
    let mut pending = vec![0u64; senders];
    let deadline_idle = Duration::from_secs(30);
    let mut last_seen = Instant::now();
    while halts < senders {
        m.poll(&mut inc, Some(Duration::from_millis(50)))
            .map_err(|e| e.to_string())?;
        if inc.is_empty() {
            if last_seen.elapsed() > deadline_idle {
                return Err(format!("receiver {me}: nothing for 30 s"));
            }
            continue;
        }
        last_seen = Instant::now();
        for e in inc.drain(..) {
            match e {
                Incoming::Accepted { conn, peer } => {
                    from.insert(conn, peer.index as usize);
                }
                Incoming::Received { conn, msg } => {
                    if first.is_none() {
                        first = Some(Instant::now());
                        cpu0 = thread_cpu();
                    }
                    if conn != last_conn {
                        last_conn = conn;
                        last_from = from.get(&conn).copied().unwrap_or(0);
                    }
                    let s = last_from;
                    let n = match msg {
                        Received::Fragment { payload, .. } => payload.len() as u64,
                        Received::Message(Message::Report(text)) => text.len() as u64 + 8,
                        Received::Message(Message::Halt) => {
                            halted.push(conn);
                            halts += 1;
                            continue;
                        }
                        Received::Message(_) | Received::PubSub(_) => 0,
                        Received::Published { payload, .. } => payload.len() as u64,
                        // not asked for: this messenger does not coalesce
                        Received::Fragments(_) => 0,
                    };
                    msgs += 1;
                    bytes += n;
                    pending[s] += n;
                }
                Incoming::Closed { conn, reason } => {
                    // A sender that said Halt may go away before the others are done.
                    if !halted.contains(&conn) {
                        return Err(format!("receiver {me}: connection closed: {reason}"));
                    }
                }
                Incoming::Connected { .. } => {}
            }
        }
        for (s, n) in pending.iter_mut().enumerate() {
            if *n > 0 {
                acked[s * receivers + me].fetch_add(*n, Ordering::Relaxed);
                *n = 0;
            }
        }
    }
    Ok(ReceiverResult {
        msgs,
        bytes,
        first,
        last: Instant::now(),
        cpu: thread_cpu() - cpu0,
    })
}

/// Round-trip latency: a client keeps `in_flight` messages of `size` bytes (send_now) in
/// flight; a server echoes each one. `spin` is the messenger's busy-poll time on both ends.
pub fn latency(
    kind: Kind,
    size: usize,
    in_flight: usize,
    spin: Duration,
    duration: Duration,
) -> Result<Point, String> {
    let mut server = messenger(kind, &unique("srv"), Role::Bu, 0, 64);
    server.set_busy_poll(spin);
    let addr = listen(&mut server, kind)?;
    let srv = std::thread::spawn(move || -> Result<(), String> {
        let mut inc = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if Instant::now() > deadline {
                return Err("latency server: no Halt within 60 s".into());
            }
            server
                .poll(&mut inc, Some(Duration::from_millis(50)))
                .map_err(|e| e.to_string())?;
            for e in inc.drain(..) {
                if let Incoming::Received { conn, msg } = e {
                    match msg {
                        Received::Message(Message::Halt) => return Ok(()),
                        Received::Message(msg) => {
                            server.send_now(conn, &msg).map_err(|e| e.to_string())?
                        }
                        Received::Fragment { .. }
                        | Received::Fragments(_)
                        | Received::Published { .. }
                        | Received::PubSub(_) => {}
                    }
                }
            }
        }
    });
    let name = unique("cli");
    let mut client = messenger(kind, &name, Role::Ru, 0, 64);
    client.set_busy_poll(spin);
    let conn = connect_all(&mut client, &[addr], &name, 0)?[0];
    let msg = report_of(size);
    let mut inc = Vec::new();
    let mut trips = RoundTrips::new(duration);
    for _ in 0..in_flight {
        trips.sent();
        client.send_now(conn, &msg).map_err(|e| e.to_string())?;
    }
    while trips.in_flight() {
        client
            .poll(&mut inc, Some(Duration::from_millis(100)))
            .map_err(|e| e.to_string())?;
        for e in inc.drain(..) {
            match e {
                Incoming::Received { .. } => {
                    let another = trips.replied()?;
                    if another {
                        trips.sent();
                        client.send_now(conn, &msg).map_err(|e| e.to_string())?;
                    }
                }
                Incoming::Closed { reason, .. } => return Err(format!("closed: {reason}")),
                _ => {}
            }
        }
    }
    let variant = if spin.is_zero() {
        "blocking".to_string()
    } else {
        format!("busy-poll {}us", spin.as_micros())
    };
    let mut p = Point::new("lat", "evb", kind.name(), &variant, size as u64);
    p.in_flight = in_flight as u32;
    trips.fill(&mut p, size);
    client
        .send_now(conn, &Message::Halt)
        .map_err(|e| e.to_string())?;
    drain(&mut client, &[conn], &mut inc)?;
    srv.join().map_err(|_| "server panicked")??;
    Ok(p)
}

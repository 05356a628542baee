//! Publish/subscribe: one publisher to k subscribers over loopback TCP, evb's `Publisher` /
//! `Subscriber` (policy block: nothing lost) beside ZeroMQ PUB/SUB (which drops at its
//! high-water mark; what it dropped is noted). Every thread is a thread of this process.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use evb_buffers::Pool;
use evb_messaging::pubsub::{
    Publish, Publisher, PublisherConfig, SlowPolicy, SubEvent, Subscriber,
};
use evb_messaging::MessengerConfig;
use evb_transport::tcp::TcpTransport;
use evb_transport::TransportConfig;
use evb_wire::pubsub::{Delivery, TagRange};
use evb_wire::{Channel, Hello, Role};

use crate::measure::{fill_rates, thread_cpu, Point};

const RUN: &str = "bench-pubsub";

fn tcp(node: &str) -> Result<Box<TcpTransport>, String> {
    let cfg = TransportConfig {
        run_id: RUN.into(),
        local: Hello::new(Channel::Data, Role::Ru, 0, RUN, node),
        max_frame: 16 << 20,
        rx_pool: Pool::new(node, 256 * 1024, 256),
        secret: None,
    };
    TcpTransport::new(cfg)
        .map(Box::new)
        .map_err(|e| e.to_string())
}

/// What one subscriber thread saw: messages, bytes, first and last arrival, its CPU time.
type SubResult = (u64, u64, Option<Instant>, Instant, Duration);

/// Fills `p` from the subscribers' results: the rate is the slowest subscriber's.
fn fill(p: &mut Point, results: &[SubResult], send_cpu: Duration) {
    let mut worst = f64::INFINITY;
    let mut worst_idx = 0;
    for (i, (n, _, first, last, _)) in results.iter().enumerate() {
        let secs = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
        let rate = if secs > 0.0 { *n as f64 / secs } else { 0.0 };
        if rate < worst {
            worst = rate;
            worst_idx = i;
        }
    }
    let (n, bytes, first, last, _) = results[worst_idx];
    let secs = first
        .map_or(0.0, |f| last.duration_since(f).as_secs_f64())
        .max(1e-9);
    let recv_cpu = results.iter().map(|r| r.4).sum();
    fill_rates(p, n, bytes, secs, send_cpu, recv_cpu);
}

/// evb: `k` subscribers of tag 0 (high-throughput delivery), `size`-byte messages for
/// `duration`, policy block.
/// How long a partly filled page may wait (see `evb pub --flush-us`).
pub const PAGE_FLUSH: Duration = Duration::from_micros(200);

pub fn evb(k: usize, size: usize, duration: Duration) -> Result<Point, String> {
    let cfg = PublisherConfig {
        policy: SlowPolicy::Block,
        // the default 4 MiB per subscriber: 32 MiB measured slower at 1 MiB and k = 1
        max_queued: PublisherConfig::default().max_queued,
        // as `evb pub` by default: the publishing thread writes half the subscribers'
        // sockets, one send thread the other half (two cores here)
        send_threads: 1,
        // high-throughput pages go out when full or 200 µs after their first message (as
        // `evb pub` by default, and NetIO's buffers): not at the end of every loop pass
        messenger: MessengerConfig {
            flush: evb_messaging::FlushPolicy::After(PAGE_FLUSH),
            ..MessengerConfig::default()
        },
    };
    let mut p = Publisher::new(tcp("pub")?, cfg).map_err(|e| e.to_string())?;
    let addr = p.listen("127.0.0.1:0").map_err(|e| e.to_string())?;
    let limit = duration + Duration::from_secs(60);
    let subs: Vec<_> = (0..k)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || -> Result<SubResult, String> {
                let name = format!("sub{i}");
                let mut s = Subscriber::new(tcp(&name)?, MessengerConfig::default());
                let c = s
                    .connect(
                        &addr,
                        Hello::new(Channel::Data, Role::Bu, i as u16, RUN, &name),
                    )
                    .map_err(|e| e.to_string())?;
                s.subscribe(c, &[TagRange::one(0)], Delivery::Throughput)
                    .map_err(|e| e.to_string())?;
                let (mut n, mut bytes, mut first, mut last) = (0u64, 0u64, None, Instant::now());
                let start = Instant::now();
                let mut cpu0 = None;
                let mut ev = Vec::new();
                loop {
                    if start.elapsed() > limit {
                        return Err("subscriber timed out".into());
                    }
                    s.poll(&mut ev, Some(Duration::from_millis(50)))
                        .map_err(|e| e.to_string())?;
                    // the messages of one poll arrived together: one clock reading each
                    let now = Instant::now();
                    for e in ev.drain(..) {
                        match e {
                            SubEvent::Message { payload, .. } => {
                                if first.is_none() {
                                    first = Some(now);
                                    cpu0 = Some(thread_cpu());
                                }
                                n += 1;
                                bytes += payload.len() as u64;
                                last = now;
                            }
                            SubEvent::Closed { .. } => {
                                let cpu = cpu0.map_or(Duration::ZERO, |c| thread_cpu() - c);
                                return Ok((n, bytes, first, last, cpu));
                            }
                            SubEvent::Gap { missed, .. } => {
                                return Err(format!("{missed} dropped under policy block"))
                            }
                            _ => {}
                        }
                    }
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while p.subscribed() < k {
        if Instant::now() > deadline {
            return Err(format!("{} of {k} subscribers came", p.subscribed()));
        }
        p.poll(Some(Duration::from_millis(5)))
            .map_err(|e| e.to_string())?;
    }
    let payload = vec![0x5au8; size];
    // large messages written once into the publisher's pool and published by reference
    // (as the p2p fragment series sends its pool slices); small ones copied into pages
    let chain = if size >= evb_messaging::pubsub::SHARE_MIN {
        p.pool().and_then(|pool| {
            let mut c = evb_buffers::Chain::new();
            let mut rest = &payload[..];
            while !rest.is_empty() {
                let mut w = pool.try_alloc()?;
                let n = rest.len().min(w.remaining());
                c.push(w.append(&rest[..n])?);
                rest = &rest[n..];
            }
            Some(c)
        })
    } else {
        None
    };
    let cpu0 = thread_cpu();
    let end = Instant::now() + duration;
    let mut sent = 0u64;
    while Instant::now() < end {
        for _ in 0..64 {
            let r = match &chain {
                Some(c) => p.publish_chain(0, c),
                None => p.publish(0, &payload),
            };
            match r.map_err(|e| e.to_string())? {
                Publish::Sent(_) => sent += 1,
                Publish::WouldBlock => {
                    p.poll(Some(Duration::from_millis(1)))
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        p.poll(Some(Duration::ZERO)).map_err(|e| e.to_string())?;
    }
    p.flush();
    let drain = Instant::now() + Duration::from_secs(30);
    while p.backlog_total() > 0 && Instant::now() < drain {
        p.poll(Some(Duration::from_millis(1)))
            .map_err(|e| e.to_string())?;
    }
    let send_cpu = thread_cpu() - cpu0;
    p.shutdown("done");
    // keep the publisher's connections served until every subscriber has seen the end
    let bye = Instant::now() + Duration::from_secs(30);
    while subs.iter().any(|h| !h.is_finished()) && Instant::now() < bye {
        p.poll(Some(Duration::from_millis(1)))
            .map_err(|e| e.to_string())?;
    }
    let mut results = Vec::new();
    for h in subs {
        results.push(h.join().map_err(|_| "subscriber panicked")??);
    }
    for r in &results {
        if r.0 != sent {
            return Err(format!(
                "a subscriber got {} of {sent} under policy block",
                r.0
            ));
        }
    }
    let mut pt = Point::new("pubsub", "evb", "tcp", &format!("block k={k}"), size as u64);
    pt.senders = 1;
    pt.receivers = k as u32;
    fill(&mut pt, &results, send_cpu);
    pt.note = "the slowest subscriber's rate; every message delivered".into();
    Ok(pt)
}

/// ZeroMQ PUB → `k` SUB (all topics), `size`-byte messages for `duration`.
pub fn zmq(k: usize, size: usize, duration: Duration) -> Result<Point, String> {
    let ctx = zmq::Context::new();
    let publ = ctx.socket(zmq::PUB).map_err(|e| e.to_string())?;
    let _ = publ.set_sndhwm(10_000);
    publ.bind("tcp://127.0.0.1:*").map_err(|e| e.to_string())?;
    let ep = publ
        .get_last_endpoint()
        .map_err(|e| e.to_string())?
        .map_err(|_| "endpoint is not UTF-8".to_string())?;
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let subs: Vec<_> = (0..k)
        .map(|_| {
            let ctx = ctx.clone();
            let ep = ep.clone();
            let ready = ready_tx.clone();
            std::thread::spawn(move || -> Result<SubResult, String> {
                let s = ctx.socket(zmq::SUB).map_err(|e| e.to_string())?;
                let _ = s.set_rcvhwm(10_000);
                s.set_rcvtimeo(3000).map_err(|e| e.to_string())?;
                s.connect(&ep).map_err(|e| e.to_string())?;
                s.set_subscribe(b"").map_err(|e| e.to_string())?;
                let mut msg = zmq::Message::new();
                let (mut n, mut bytes, mut first, mut last) = (0u64, 0u64, None, Instant::now());
                let mut cpu0 = None;
                let mut signalled = false;
                loop {
                    match s.recv(&mut msg, 0) {
                        Ok(()) => {}
                        Err(zmq::Error::EAGAIN) => break, // the end marker was dropped too
                        Err(e) => return Err(e.to_string()),
                    }
                    if msg.is_empty() {
                        break;
                    }
                    if msg.len() == 1 {
                        if !signalled {
                            let _ = ready.send(());
                            signalled = true;
                        }
                        continue;
                    }
                    let now = Instant::now();
                    if first.is_none() {
                        first = Some(now);
                        cpu0 = Some(thread_cpu());
                    }
                    n += 1;
                    bytes += msg.len() as u64;
                    last = now;
                }
                let cpu = cpu0.map_or(Duration::ZERO, |c| thread_cpu() - c);
                Ok((n, bytes, first, last, cpu))
            })
        })
        .collect();
    drop(ready_tx);
    // the slow-joiner: send single bytes until every subscriber has seen one
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut ready = 0;
    while ready < k {
        if Instant::now() > deadline {
            return Err("ZeroMQ subscribers did not join".into());
        }
        publ.send(&b"w"[..], 0).map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_millis(1));
        while ready_rx.try_recv().is_ok() {
            ready += 1;
        }
    }
    let payload = vec![0x5au8; size];
    let cpu0 = thread_cpu();
    let end = Instant::now() + duration;
    let mut sent = 0u64;
    while Instant::now() < end {
        for _ in 0..64 {
            publ.send(&payload[..], 0).map_err(|e| e.to_string())?;
            sent += 1;
        }
    }
    let send_cpu = thread_cpu() - cpu0;
    for _ in 0..20 {
        publ.send(&[][..], 0).map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut results = Vec::new();
    for h in subs {
        results.push(h.join().map_err(|_| "subscriber panicked")??);
    }
    let got: u64 = results.iter().map(|r| r.0).sum();
    let lost = (sent * k as u64).saturating_sub(got);
    let mut pt = Point::new(
        "pubsub",
        "zmq",
        "tcp",
        &format!("pub-sub k={k}"),
        size as u64,
    );
    pt.senders = 1;
    pt.receivers = k as u32;
    fill(&mut pt, &results, send_cpu);
    pt.note = format!(
        "the slowest subscriber's rate; {lost} of {} copies dropped silently ({:.1} %); libzmq I/O threads' CPU not included",
        sent * k as u64,
        100.0 * lost as f64 / (sent * k as u64).max(1) as f64
    );
    Ok(pt)
}

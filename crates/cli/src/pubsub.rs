//! `evb pub` and `evb sub`: a publisher and a subscriber of tagged messages (the pub/sub
//! sockets of evb-messaging), as ZeroMQ's perf tools are for its PUB/SUB: rates, gaps and
//! drops, and a JSON summary.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use evb_buffers::Pool;
use evb_messaging::pubsub::{
    Publish, Publisher, PublisherConfig, SlowPolicy, SubEvent, Subscriber, MAX_QUEUED_RANGE,
    MAX_SEND_THREADS,
};
use evb_messaging::MessengerConfig;
use evb_transport::{Transport, TransportConfig};
use evb_wire::pubsub::{Delivery, TagRange};
use evb_wire::{Channel, Hello, Role};
use serde_json::json;

#[derive(Clone, Copy, ValueEnum)]
pub enum Kind {
    Tcp,
    Shm,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Policy {
    Block,
    Drop,
    Disconnect,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Mode {
    Latency,
    Throughput,
}

#[derive(Args)]
pub struct PubArgs {
    // (`--wait` and `--wait-timeout`, the old names of --subscribers and
    // --subscribers-timeout, are hidden aliases)
    /// Address to listen on (tcp: HOST:PORT, port 0 for any; shm: a name, NAME:0 for any).
    /// The address bound is printed first, as `listening on ADDR`.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// The transport: tcp (HOST:PORT addresses) or shm (names, on this host).
    #[arg(long, value_enum, default_value_t = Kind::Tcp)]
    transport: Kind,
    /// Tags 0..N, published round robin (1..=1000000).
    #[arg(long, default_value_t = 1)]
    tags: u64,
    /// Payload bytes per message (16..=16777216; the first 16 hold tag and sequence).
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Messages per second (0: as fast as possible).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Messages to publish (1..=10^12).
    #[arg(long, default_value_t = 100_000)]
    count: u64,
    /// What to do with a subscriber that does not keep up.
    #[arg(long, value_enum, default_value_t = Policy::Block)]
    policy: Policy,
    /// A subscriber is slow with this many bytes waiting for it.
    #[arg(long, default_value_t = 4 << 20)]
    max_queued: usize,
    /// High-throughput subscribers' pages go out when full (256 KiB) or once their first
    /// message has waited this long (0: at the end of each pass of the publisher's loop;
    /// at most 1 s). [microseconds, or with a unit: 1ms]
    #[arg(long, default_value_t = 200, value_parser = crate::duration::micros)]
    flush_us: u64,
    /// Threads writing subscribers' sockets beside the publishing one, which writes its
    /// share (0: it writes them all) [0 ..= 16]. Over tcp, one thread's copy into the kernel
    /// limits a fan-out of large messages.
    #[arg(long, default_value_t = 1)]
    send_threads: usize,
    /// Start once this many subscribers are connected and have subscribed (0..=10000).
    #[arg(long, value_name = "N", alias = "wait", default_value_t = 1)]
    subscribers: usize,
    /// Give up waiting for the --subscribers after this long. [seconds, or with a unit:
    /// 500ms, 2m]
    #[arg(
        long,
        value_name = "DURATION",
        alias = "wait-timeout",
        default_value_t = 30.0,
        value_parser = crate::duration::secs
    )]
    subscribers_timeout: f64,
    /// After the last message, wait at most this long for subscribers to take what is queued
    /// for them (then they are told Goodbye, shutdown). [seconds, or with a unit: 500ms, 2m]
    #[arg(long, default_value_t = 10.0, value_parser = crate::duration::secs)]
    linger: f64,
    /// Handshake run id (publishers and subscribers must agree).
    #[arg(long, default_value = "pubsub")]
    run_id: String,
    /// Write the summary as JSON to FILE; `-` (or `--json` alone): to stdout, as one line.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    json: Option<PathBuf>,
}

#[derive(Args)]
pub struct SubArgs {
    /// A publisher's address; repeat for several.
    #[arg(long, required = true)]
    from: Vec<String>,
    /// The transport: tcp (HOST:PORT addresses) or shm (names, on this host).
    #[arg(long, value_enum, default_value_t = Kind::Tcp)]
    transport: Kind,
    /// Tags: a list and ranges, e.g. `0,5,10-19` (at most 65536 items).
    #[arg(long, default_value = "0")]
    tags: String,
    /// How the publishers send this subscription: throughput (messages packed into pages,
    /// sent when full or after --flush-us) or latency (each message on the wire at once).
    #[arg(long, value_enum, default_value_t = Mode::Throughput)]
    delivery: Mode,
    /// Stop after this many messages (0: when every publisher has said goodbye).
    #[arg(long, default_value_t = 0)]
    count: u64,
    /// Stop after this long in any case (0.1 s ..= 86400 s). [seconds, or with a unit: 500ms,
    /// 2m]
    #[arg(long, default_value_t = 60.0, value_parser = crate::duration::secs)]
    timeout: f64,
    /// Read slowly: sleep this long after each message (0 ..= 1 s), to see the publisher's
    /// policy at work. [microseconds, or with a unit: 1ms]
    #[arg(long, default_value_t = 0, value_parser = crate::duration::micros)]
    slow_us: u64,
    /// Handshake run id (publishers and subscribers must agree).
    #[arg(long, default_value = "pubsub")]
    run_id: String,
    /// Write the summary as JSON to FILE; `-` (or `--json` alone): to stdout, as one line.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    json: Option<PathBuf>,
    /// No per-second rate lines.
    #[arg(long, short)]
    quiet: bool,
}

#[cfg(test)]
impl PubArgs {
    /// --subscribers and --subscribers-timeout.
    pub fn waits(&self) -> (usize, f64) {
        (self.subscribers, self.subscribers_timeout)
    }
}

fn check<T: PartialOrd + std::fmt::Display>(what: &str, v: T, lo: T, hi: T) -> Result<(), String> {
    if v < lo || v > hi {
        return Err(format!("--{what} {v} is outside {lo}..={hi}"));
    }
    Ok(())
}

/// Parses `0,5,10-19` into ranges (the plug-in API's parser, errors named as the flag).
pub fn parse_tags(s: &str) -> Result<Vec<TagRange>, String> {
    evb_plugin::pubsub::parse_tags(s).map_err(|e| format!("--{e}"))
}

fn transport(
    kind: Kind,
    run_id: &str,
    node: &str,
    max_frame: u32,
) -> Result<Box<dyn Transport>, String> {
    let cfg = TransportConfig {
        run_id: run_id.to_string(),
        // a publisher answers as the sending side (Ru), a subscriber connects as the
        // receiving side (Bu): the handshake has no pub/sub role (see evb-plugin's pubsub)
        local: Hello::new(Channel::Data, Role::Ru, 0, run_id, node),
        max_frame,
        rx_pool: Pool::new(node, 256 * 1024, 256),
        secret: std::env::var("EVB_SECRET").ok().map(String::into_bytes),
    };
    let name = match kind {
        Kind::Tcp => "tcp",
        Kind::Shm => "shm",
    };
    evb_messaging::open_transport(name, cfg, "").map_err(|e| format!("{name}: {e}"))
}

fn write_json(path: &Option<PathBuf>, v: &serde_json::Value) -> Result<(), String> {
    match path {
        None => Ok(()),
        Some(p) if p.as_os_str() == "-" => {
            println!("{v}");
            Ok(())
        }
        Some(p) => {
            std::fs::write(p, format!("{v:#}\n")).map_err(|e| format!("{}: {e}", p.display()))
        }
    }
}

fn payload(buf: &mut [u8], tag: u64, seq: u64) {
    buf[..8].copy_from_slice(&tag.to_le_bytes());
    buf[8..16].copy_from_slice(&seq.to_le_bytes());
}

pub fn run_pub(a: &PubArgs) -> Result<(), String> {
    check("tags", a.tags, 1, 1_000_000)?;
    check("size", a.size, 16, 16 << 20)?;
    check("count", a.count, 1, 1_000_000_000_000)?;
    check("rate", a.rate, 0.0, 1e9)?;
    check(
        "max-queued",
        a.max_queued,
        MAX_QUEUED_RANGE.0,
        MAX_QUEUED_RANGE.1,
    )?;
    check("subscribers", a.subscribers, 0, 10_000)?;
    check("subscribers-timeout", a.subscribers_timeout, 0.0, 86_400.0)?;
    check("linger", a.linger, 0.0, 86_400.0)?;
    check("flush-us", a.flush_us, 0, 1_000_000)?;
    check("send-threads", a.send_threads, 0, MAX_SEND_THREADS)?;
    let policy = match a.policy {
        Policy::Block => SlowPolicy::Block,
        Policy::Drop => SlowPolicy::Drop,
        Policy::Disconnect => SlowPolicy::Disconnect,
    };
    let max_frame = (a.size + 4096).max(4 << 20) as u32;
    let cfg = PublisherConfig {
        policy,
        max_queued: a.max_queued,
        send_threads: a.send_threads,
        messenger: MessengerConfig {
            flush: if a.flush_us == 0 {
                evb_messaging::FlushPolicy::EndOfPass
            } else {
                evb_messaging::FlushPolicy::After(Duration::from_micros(a.flush_us))
            },
            ..MessengerConfig::default()
        },
    };
    let mut p = Publisher::new(transport(a.transport, &a.run_id, "pub", max_frame)?, cfg)
        .map_err(|e| e.to_string())?;
    let addr = p.listen(&a.listen).map_err(|e| e.to_string())?;
    println!("listening on {addr}");
    let _ = std::io::stdout().flush();
    let deadline = Instant::now() + Duration::from_secs_f64(a.subscribers_timeout);
    while p.subscribed() < a.subscribers {
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {} subscribers came within {} s",
                p.subscribers(),
                a.subscribers,
                a.subscribers_timeout
            ));
        }
        p.poll(Some(Duration::from_millis(10)))
            .map_err(|e| e.to_string())?;
    }
    // a moment for every subscriber's Subscribe to land
    for _ in 0..10 {
        p.poll(Some(Duration::from_millis(5)))
            .map_err(|e| e.to_string())?;
    }
    let mut buf = vec![0u8; a.size];
    for (i, b) in buf.iter_mut().enumerate().skip(16) {
        *b = i as u8;
    }
    let mut seqs = vec![0u64; a.tags as usize];
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < a.count {
        if a.rate > 0.0 {
            let due = start + Duration::from_secs_f64(sent as f64 / a.rate);
            let now = Instant::now();
            if due > now {
                p.poll(Some(due - now)).map_err(|e| e.to_string())?;
                continue;
            }
        }
        let tag = sent % a.tags;
        payload(&mut buf, tag, seqs[tag as usize]);
        match p.publish(tag, &buf).map_err(|e| e.to_string())? {
            Publish::Sent(_) => {
                seqs[tag as usize] += 1;
                sent += 1;
                if sent.is_multiple_of(64) {
                    p.poll(Some(Duration::ZERO)).map_err(|e| e.to_string())?;
                }
            }
            Publish::WouldBlock => p
                .poll(Some(Duration::from_millis(1)))
                .map_err(|e| e.to_string())?,
        }
    }
    p.flush();
    let elapsed = start.elapsed().as_secs_f64();
    // let subscribers drain, then say goodbye
    let linger = Instant::now() + Duration::from_secs_f64(a.linger);
    while Instant::now() < linger && p.subscribers() > 0 {
        p.poll(Some(Duration::from_millis(5)))
            .map_err(|e| e.to_string())?;
        if all_drained(&p) {
            break;
        }
    }
    p.shutdown("the publisher is done");
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until && p.subscribers() > 0 {
        p.poll(Some(Duration::from_millis(5)))
            .map_err(|e| e.to_string())?;
    }
    // the Goodbyes on their way
    for _ in 0..20 {
        p.poll(Some(Duration::from_millis(5)))
            .map_err(|e| e.to_string())?;
    }
    let s = p.stats();
    let rate = sent as f64 / elapsed.max(1e-9);
    eprintln!(
        "published {sent} messages of {} B on {} tags in {elapsed:.3} s: {rate:.0} msg/s, {:.1} MB/s; delivered {}, dropped {}, gaps sent {}, would-block {}, cut off {} slow + {} bad",
        a.size,
        a.tags,
        rate * a.size as f64 / 1e6,
        s.delivered,
        s.dropped,
        s.gaps_sent,
        s.would_block,
        s.disconnected_slow,
        s.disconnected_bad
    );
    write_json(
        &a.json,
        &json!({
            "published": s.published,
            "delivered": s.delivered,
            "dropped": s.dropped,
            "gaps_sent": s.gaps_sent,
            "would_block": s.would_block,
            "disconnected_slow": s.disconnected_slow,
            "disconnected_bad": s.disconnected_bad,
            "send_failures": s.send_failures,
            "subscribers_joined": s.subscribers_joined,
            "seconds": elapsed,
            "msg_per_s": rate,
            "size": a.size,
            "tags": a.tags,
        }),
    )
}

fn all_drained(p: &Publisher) -> bool {
    p.backlog_total() == 0
}

pub fn run_sub(a: &SubArgs) -> Result<(), String> {
    check("timeout", a.timeout, 0.1, 86_400.0)?;
    check("slow-us", a.slow_us, 0, 1_000_000)?;
    let ranges = parse_tags(&a.tags)?;
    let delivery = match a.delivery {
        Mode::Latency => Delivery::Latency,
        Mode::Throughput => Delivery::Throughput,
    };
    let mut sub = Subscriber::new(
        transport(a.transport, &a.run_id, "sub", 64 << 20)?,
        MessengerConfig::default(),
    );
    let me = format!("sub-{}", std::process::id());
    let mut pubs = HashMap::new();
    for addr in &a.from {
        let c = sub
            .connect(addr, Hello::new(Channel::Data, Role::Bu, 0, &a.run_id, &me))
            .map_err(|e| e.to_string())?;
        sub.subscribe(c, &ranges, delivery)
            .map_err(|e| e.to_string())?;
        pubs.insert(c, addr.clone());
    }
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(a.timeout);
    let mut events = Vec::new();
    let (mut received, mut bytes, mut missed, mut gaps, mut silent) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut first_msg: Option<Instant> = None;
    let mut last_msg = start;
    let mut next: HashMap<(evb_transport::ConnId, u64), u64> = HashMap::new();
    let mut missed_by_tag: HashMap<u64, u64> = HashMap::new();
    let mut goodbyes = Vec::new();
    let mut open = pubs.len();
    let mut tick = Instant::now();
    let mut tick_n = 0u64;
    let mut tick_b = 0u64;
    let mut timed_out = false;
    let mut reached = std::collections::HashSet::new();
    while open > 0 && (a.count == 0 || received < a.count) {
        if Instant::now() > deadline {
            timed_out = true;
            break;
        }
        sub.poll(&mut events, Some(Duration::from_millis(5)))
            .map_err(|e| e.to_string())?;
        for e in events.drain(..) {
            match e {
                SubEvent::Message {
                    publisher,
                    tag,
                    seq,
                    payload,
                } => {
                    received += 1;
                    bytes += payload.len() as u64;
                    tick_n += 1;
                    tick_b += payload.len() as u64;
                    let now = Instant::now();
                    first_msg.get_or_insert(now);
                    last_msg = now;
                    // the payload's own tag and sequence must agree with the header
                    let mut h = [0u8; 16];
                    if !payload.copy_prefix(&mut h)
                        || u64::from_le_bytes(h[..8].try_into().expect("8")) != tag
                        || u64::from_le_bytes(h[8..].try_into().expect("8")) != seq
                    {
                        silent += 1;
                    }
                    if let Some(&n) = next.get(&(publisher, tag)) {
                        if n != seq {
                            silent += 1;
                        }
                    }
                    next.insert((publisher, tag), seq + 1);
                    if a.slow_us > 0 {
                        std::thread::sleep(Duration::from_micros(a.slow_us));
                    }
                }
                SubEvent::Gap {
                    publisher,
                    tag,
                    missed: m,
                } => {
                    gaps += 1;
                    missed += m;
                    *missed_by_tag.entry(tag).or_default() += m;
                    if let Some(n) = next.get_mut(&(publisher, tag)) {
                        *n += m;
                    }
                    if !a.quiet {
                        eprintln!("gap: tag {tag}: {m} missed");
                    }
                }
                SubEvent::Goodbye {
                    publisher,
                    code,
                    reason,
                } => {
                    eprintln!(
                        "goodbye from {}: {code:?}: {reason}",
                        pubs.get(&publisher).map_or("?", |s| s.as_str())
                    );
                    goodbyes.push(json!({"publisher": pubs.get(&publisher), "code": format!("{code:?}"), "reason": reason}));
                }
                SubEvent::Closed { publisher, reason } => {
                    open -= 1;
                    if !a.quiet {
                        eprintln!(
                            "{}: closed: {reason}",
                            pubs.get(&publisher).map_or("?", |s| s.as_str())
                        );
                    }
                }
                SubEvent::Connected { publisher, .. } => {
                    reached.insert(publisher);
                }
            }
        }
        if !a.quiet && tick.elapsed() >= Duration::from_secs(1) {
            let dt = tick.elapsed().as_secs_f64();
            eprintln!(
                "{:.0} msg/s, {:.1} MB/s, received {received}, missed {missed} in {gaps} gaps",
                tick_n as f64 / dt,
                tick_b as f64 / dt / 1e6
            );
            tick = Instant::now();
            tick_n = 0;
            tick_b = 0;
        }
    }
    let span = first_msg.map_or(0.0, |f| last_msg.duration_since(f).as_secs_f64());
    let rate = if span > 0.0 {
        received as f64 / span
    } else {
        0.0
    };
    eprintln!(
        "received {received} messages ({bytes} B), {rate:.0} msg/s, {:.1} MB/s; missed {missed} in {gaps} gaps; unannounced losses {silent}",
        if span > 0.0 { bytes as f64 / span / 1e6 } else { 0.0 }
    );
    let mut by_tag: Vec<_> = missed_by_tag.into_iter().collect();
    by_tag.sort_unstable();
    write_json(
        &a.json,
        &json!({
            "received": received,
            "bytes": bytes,
            "missed": missed,
            "gaps": gaps,
            "missed_by_tag": by_tag.into_iter().map(|(t, m)| json!([t, m])).collect::<Vec<_>>(),
            "unannounced_losses": silent,
            "goodbyes": goodbyes,
            "timed_out": timed_out,
            "seconds": span,
            "msg_per_s": rate,
        }),
    )?;
    if silent > 0 {
        return Err(format!("{silent} messages lost or corrupted without a gap"));
    }
    // a publisher asked for and never reached is a failure, not an empty success
    let mut unreached: Vec<&str> = pubs
        .iter()
        .filter(|(c, _)| !reached.contains(*c))
        .map(|(_, a)| a.as_str())
        .collect();
    if !unreached.is_empty() {
        unreached.sort_unstable();
        return Err(format!("could not reach {}", unreached.join(", ")));
    }
    Ok(())
}

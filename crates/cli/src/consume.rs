//! `evb consume`: a ready-made consumer of BUs serving built events (`sink.kind = "serve"`,
//! docs/protocol.md §7). It connects to each `--from` address, checks every event (event
//! header and body CRC32C, each fragment's header CRC and payload CRC32C, the BU's flags),
//! optionally writes them to event files (`evb inspect` reads them), acknowledges each one
//! after that, and prints a summary. Exit status 1 on a bad event, a refusal, or a BU lost
//! without saying that the run is over.

use std::collections::HashSet;
use std::io::{BufWriter, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use evb_formats::events::{parse_event, EventFileWriter, EVENT_CORRUPT, EVENT_TRIGGER_MISMATCH};
use evb_wire::consumer::{ConsumerHeader, ConsumerHello, ConsumerMsg, CONSUMER_HEADER_LEN};

#[derive(Args, Clone)]
pub struct ConsumeArgs {
    /// A BU's serve address, HOST:PORT (repeat, or separate with commas, for several BUs).
    #[arg(long, required = true, value_delimiter = ',')]
    from: Vec<String>,
    /// The run id the BUs serve (their configuration's run.id).
    #[arg(long, default_value = "evb-local")]
    run_id: String,
    /// Write the events into event files under DIR/NAME/ (one file per BU connection).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Most events held unacknowledged per BU (the BU may grant fewer).
    #[arg(long, default_value_t = 16)]
    max_held: u32,
    /// Stop after this many events (the rest go to other consumers).
    #[arg(long)]
    limit: Option<u64>,
    /// Work this long on each event before acknowledging it (a slow filter).
    #[arg(long, default_value_t = 0)]
    slow_ms: u64,
    /// Keep trying to reach a BU this long (at start, and after a connection drops).
    #[arg(long, default_value_t = 30.0)]
    wait_s: f64,
    /// This consumer's name (the BUs log it; default consume-PID).
    #[arg(long)]
    name: Option<String>,
    /// Largest event accepted, MiB.
    #[arg(long, default_value_t = 1024)]
    max_event_mib: u32,
    /// Append the id of each event to FILE before acknowledging it (for checks).
    #[arg(long)]
    ids: Option<PathBuf>,
}

#[derive(Default)]
struct Totals {
    events: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    /// Events seen a second time (served again after a reconnection): at-least-once.
    repeated: AtomicU64,
    stop: AtomicBool,
}

struct Ctx {
    a: ConsumeArgs,
    name: String,
    totals: Totals,
    seen: Mutex<HashSet<u64>>,
    ids: Option<Mutex<std::fs::File>>,
}

/// What became of one BU connection.
enum Ended {
    /// The BU said the run is over.
    End { acked: u64, lost: u64 },
    /// `--limit` reached.
    Limit,
    /// Refused, or a bad event: do not try again.
    Fatal(String),
    /// The connection dropped: try again.
    Dropped(String),
}

pub fn run(a: &ConsumeArgs) -> Result<bool, String> {
    if a.max_held == 0 {
        return Err("--max-held must be at least 1".into());
    }
    if !(0.0..=86_400.0).contains(&a.wait_s) {
        return Err("--wait-s must be within 0 ..= 86400".into());
    }
    let name = a
        .name
        .clone()
        .unwrap_or_else(|| format!("consume-{}", std::process::id()));
    let ids = match &a.ids {
        Some(p) => Some(Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| format!("{}: {e}", p.display()))?,
        )),
        None => None,
    };
    let ctx = Arc::new(Ctx {
        a: a.clone(),
        name,
        totals: Totals::default(),
        seen: Mutex::new(HashSet::new()),
        ids,
    });
    let started = Instant::now();
    let threads: Vec<_> = a
        .from
        .iter()
        .map(|addr| {
            let (ctx, addr) = (ctx.clone(), addr.clone());
            std::thread::spawn(move || {
                let r = one_bu(&ctx, &addr);
                (addr, r)
            })
        })
        .collect();
    let mut ok = true;
    for t in threads {
        let (addr, r) = t
            .join()
            .map_err(|_| "a consumer thread panicked".to_string())?;
        match r {
            Ok(line) => eprintln!("evb consume: {addr}: {line}"),
            Err(e) => {
                ok = false;
                eprintln!("evb consume: {addr}: {e}");
            }
        }
    }
    let t = &ctx.totals;
    let secs = started.elapsed().as_secs_f64();
    let (events, bytes, errors) = (
        t.events.load(Ordering::Acquire),
        t.bytes.load(Ordering::Acquire),
        t.errors.load(Ordering::Acquire),
    );
    ok &= errors == 0;
    println!(
        "{}",
        serde_json::json!({
            "consumer": ctx.name,
            "events": events,
            "payload_bytes": bytes,
            "errors": errors,
            "repeated": t.repeated.load(Ordering::Acquire),
            "seconds": secs,
            "ok": ok,
        })
    );
    eprintln!(
        "evb consume: {events} events, {:.1} MB, {errors} errors in {secs:.1} s ({:.0} events/s, {:.3} GB/s)",
        bytes as f64 / 1e6,
        events as f64 / secs.max(1e-9),
        bytes as f64 / secs.max(1e-9) / 1e9
    );
    Ok(ok)
}

/// Serves one BU address until it says the run is over (reconnecting meanwhile).
fn one_bu(ctx: &Ctx, addr: &str) -> Result<String, String> {
    let wait = Duration::from_secs_f64(ctx.a.wait_s);
    let mut since = Instant::now();
    let mut writer: Option<EventFileWriter> = None;
    let mut seq = 0u32;
    let r = loop {
        if ctx.totals.stop.load(Ordering::Acquire) {
            break Ok("stopped at --limit".to_string());
        }
        let stream = match TcpStream::connect(addr) {
            Ok(s) => s,
            Err(e) => {
                if since.elapsed() > wait {
                    break Err(format!(
                        "cannot reach it for {:.0} s: {e}",
                        wait.as_secs_f64()
                    ));
                }
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        match session(ctx, stream, &mut writer, &mut seq) {
            Ended::End { acked, lost } => {
                break if lost > 0 {
                    Err(format!(
                        "the run is over; the BU's consumers acknowledged {acked} events and it lost {lost}"
                    ))
                } else {
                    Ok(format!(
                        "the run is over; the BU's consumers acknowledged {acked} events"
                    ))
                }
            }
            Ended::Limit => break Ok("stopped at --limit".to_string()),
            Ended::Fatal(e) => break Err(e),
            Ended::Dropped(e) => {
                eprintln!("evb consume: {addr}: {e}; connecting again");
                since = Instant::now();
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    if let Some(mut w) = writer {
        if w.events() > 0 {
            w.finish().map_err(|e| e.to_string())?;
        } else {
            w.discard();
        }
    }
    r
}

fn read_frame(r: &mut impl Read, max_event: u32) -> Result<ConsumerMsg, String> {
    let mut h = [0u8; CONSUMER_HEADER_LEN];
    r.read_exact(&mut h).map_err(|e| e.to_string())?;
    let h = ConsumerHeader::decode(&h, max_event).map_err(|e| e.to_string())?;
    let mut p = vec![0u8; h.length as usize];
    r.read_exact(&mut p).map_err(|e| e.to_string())?;
    ConsumerMsg::decode(h.kind, &p).map_err(|e| e.to_string())
}

fn session(
    ctx: &Ctx,
    stream: TcpStream,
    writer: &mut Option<EventFileWriter>,
    seq: &mut u32,
) -> Ended {
    let _ = stream.set_nodelay(true);
    let Ok(mut out) = stream.try_clone() else {
        return Ended::Dropped("cannot clone the socket".into());
    };
    let mut input = std::io::BufReader::with_capacity(1 << 20, stream);
    let hello = ConsumerMsg::Hello(ConsumerHello {
        max_held: ctx.a.max_held,
        run_id: ctx.a.run_id.clone(),
        name: ctx.name.clone(),
    });
    if let Err(e) = out.write_all(&hello.encode()) {
        return Ended::Dropped(format!("sending hello: {e}"));
    }
    let max_event = ctx.a.max_event_mib.saturating_mul(1 << 20);
    let welcome = match read_frame(&mut input, max_event) {
        Ok(ConsumerMsg::Welcome(w)) => w,
        Ok(ConsumerMsg::Refuse { code, reason }) => {
            return Ended::Fatal(format!("refused ({code:?}): {reason}"))
        }
        Ok(other) => return Ended::Fatal(format!("expected Welcome, got {:?}", other.kind())),
        Err(e) => return Ended::Dropped(format!("no welcome: {e}")),
    };
    if let (Some(dir), None) = (&ctx.a.out, writer.as_ref()) {
        let dir = dir.join(&ctx.name);
        if let Err(e) = std::fs::create_dir_all(&dir) {
            return Ended::Fatal(format!("{}: {e}", dir.display()));
        }
        match EventFileWriter::create(&dir, &ctx.a.run_id, welcome.bu_index, *seq) {
            Ok(w) => {
                *seq += 1;
                *writer = Some(w);
            }
            Err(e) => return Ended::Fatal(e.to_string()),
        }
    }
    let mut out = BufWriter::new(out);
    loop {
        let msg = match read_frame(&mut input, max_event) {
            Ok(m) => m,
            Err(e) => return Ended::Dropped(format!("connection lost: {e}")),
        };
        let record = match msg {
            ConsumerMsg::Event(r) => r,
            ConsumerMsg::End { acked, lost } => return Ended::End { acked, lost },
            other => return Ended::Fatal(format!("unexpected {:?} from the BU", other.kind())),
        };
        if ctx.totals.stop.load(Ordering::Acquire) {
            return Ended::Limit; // not acknowledged: it goes to another consumer
        }
        let ev = match parse_event(&record) {
            Ok(ev) => ev,
            Err(e) => {
                ctx.totals.errors.fetch_add(1, Ordering::AcqRel);
                return Ended::Fatal(format!("bad event: {e}"));
            }
        };
        let mut bad = Vec::new();
        if ev.flags & (EVENT_CORRUPT | EVENT_TRIGGER_MISMATCH) != 0 {
            bad.push(format!("flagged {:#06x} by the BU", ev.flags));
        }
        let mut bytes = 0u64;
        for (h, p) in &ev.fragments {
            bytes += p.len() as u64;
            if crc32c::crc32c(p) != h.payload_crc {
                bad.push(format!("source {}: payload CRC32C mismatch", h.source_id));
            }
            if h.event_id != ev.event_id {
                bad.push(format!(
                    "source {}: fragment of event {}",
                    h.source_id, h.event_id
                ));
            }
        }
        if !bad.is_empty() {
            ctx.totals.errors.fetch_add(1, Ordering::AcqRel);
            return Ended::Fatal(format!("event {}: {}", ev.event_id, bad.join("; ")));
        }
        if ctx.a.slow_ms > 0 {
            std::thread::sleep(Duration::from_millis(ctx.a.slow_ms));
        }
        if let Some(w) = writer.as_mut() {
            if let Err(e) = w.write_record(&record) {
                return Ended::Fatal(format!("writing event {}: {e}", ev.event_id));
            }
        }
        if let Some(f) = &ctx.ids {
            let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
            let _ = writeln!(f, "{}", ev.event_id);
        }
        let first_time = ctx
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ev.event_id);
        if !first_time {
            ctx.totals.repeated.fetch_add(1, Ordering::AcqRel);
        }
        let n = ctx.totals.events.fetch_add(1, Ordering::AcqRel) + 1;
        ctx.totals.bytes.fetch_add(bytes, Ordering::AcqRel);
        let ack = ConsumerMsg::Ack(vec![ev.event_id]).encode();
        if let Err(e) = out.write_all(&ack).and_then(|_| out.flush()) {
            return Ended::Dropped(format!("sending an ack: {e}"));
        }
        if ctx.a.limit.is_some_and(|l| n >= l) {
            ctx.totals.stop.store(true, Ordering::Release);
            return Ended::Limit;
        }
    }
}

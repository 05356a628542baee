//! `evb consume`: a ready-made consumer of BUs serving built events (`sink.kind = "serve"`,
//! docs/protocol.md §7). It connects to each `--from` address, checks every event (event
//! header and body CRC32C, each fragment's header CRC and payload CRC32C, the BU's flags),
//! optionally writes them to event files (`evb inspect` reads them), acknowledges each one
//! after that, and prints a summary. Exit status 1 on a bad event, a refusal, or a BU lost
//! without saying that the run is over.
//!
//! With the run's secret (`EVB_SECRET`, or `--config`'s `run.secret`) it proves it to each BU
//! and checks the BU's own proof (docs/protocol.md §7.3). A BU that cannot be reached yet,
//! or that has no room (`Busy`), is tried again with a growing pause for `--retry-for`.

use std::collections::HashSet;
use std::io::{BufWriter, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use evb_formats::events::{parse_event, EventFileWriter, EVENT_CORRUPT, EVENT_TRIGGER_MISMATCH};
use evb_wire::consumer::{
    proof_key, ConsumerHeader, ConsumerHello, ConsumerMsg, ProofRole, RefuseCode,
    CONSUMER_HEADER_LEN, MAX_ACK_IDS, PROOF_LEN,
};

#[derive(Args, Clone)]
pub struct ConsumeArgs {
    /// A BU's serve address, HOST:PORT (repeat, or separate with commas, for several BUs).
    #[arg(long, required = true, value_delimiter = ',')]
    from: Vec<String>,
    /// The run id the BUs serve (their configuration's run.id; default: --config's run.id,
    /// else "evb-local").
    #[arg(long)]
    run_id: Option<String>,
    /// The run's configuration: its run.secret (EVB_SECRET wins) and its run.id.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Write the events into event files under DIR/NAME/ (one file per BU connection).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Most events held unacknowledged per BU (the BU may grant fewer).
    #[arg(long, default_value_t = 16)]
    max_held: u32,
    /// Stop after this many events (the rest go to other consumers).
    #[arg(long)]
    limit: Option<u64>,
    /// Work this long on each event before acknowledging it (a slow filter). [milliseconds, or
    /// with a unit: 2s]
    #[arg(long, default_value_t = 0, value_parser = crate::duration::millis)]
    slow_ms: u64,
    /// Keep trying to reach a BU this long (at start, after a connection drops, and while the
    /// BU has no room for another consumer), with a growing pause between tries. [seconds, or
    /// with a unit: 500ms, 2m]
    #[arg(
        long,
        value_name = "DURATION",
        alias = "wait-s",
        default_value_t = 30.0,
        value_parser = crate::duration::secs
    )]
    retry_for: f64,
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
    /// Events seen a second time (served again after a reconnection, or built again after
    /// their BU died): acknowledged, not written again.
    repeated: AtomicU64,
    stop: AtomicBool,
}

struct Ctx {
    a: ConsumeArgs,
    name: String,
    run_id: String,
    /// The run's secret: proved to every BU, and every BU must prove it.
    secret: Option<Vec<u8>>,
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
    /// The connection dropped after the BU welcomed this consumer: try again.
    Dropped(String),
    /// No Welcome: the BU has no room (`Busy`), or the connection closed during the
    /// handshake. Try again after a pause, for `--retry-for` in all.
    NotYet(String),
}

#[cfg(test)]
impl ConsumeArgs {
    /// --retry-for, seconds.
    pub fn retry_for(&self) -> f64 {
        self.retry_for
    }
}

pub fn run(a: &ConsumeArgs) -> Result<bool, String> {
    if a.max_held == 0 {
        return Err("--max-held must be at least 1".into());
    }
    if !(0.0..=86_400.0).contains(&a.retry_for) {
        return Err("--retry-for must be within 0 ..= 86400".into());
    }
    let name = a
        .name
        .clone()
        .unwrap_or_else(|| format!("consume-{}", std::process::id()));
    let (cfg, secret) = crate::ctl::config_and_secret(a.config.as_deref())?;
    let secret = secret.map(String::into_bytes);
    let run_id = a
        .run_id
        .clone()
        .or_else(|| cfg.as_ref().map(|c| c.run.id.clone()))
        .unwrap_or_else(|| "evb-local".to_string());
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
        run_id,
        secret,
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

/// The pause before the next try: 100 ms, doubling to 2 s, with ±25 % jitter (consumers
/// refused together do not come back together).
fn backoff(tries: u32) -> Duration {
    let base = 100u64 << tries.min(5);
    let ms = base.min(2_000);
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64 ^ std::process::id() as u64)
        .unwrap_or(0)
        % (ms / 2 + 1);
    Duration::from_millis(ms - ms / 4 + jitter)
}

/// Serves one BU address until it says the run is over (reconnecting meanwhile).
fn one_bu(ctx: &Ctx, addr: &str) -> Result<String, String> {
    let wait = Duration::from_secs_f64(ctx.a.retry_for);
    // the first failed try of the current run of them, and how many
    let mut since = Instant::now();
    let mut tries = 0u32;
    let mut writer: Option<EventFileWriter> = None;
    let mut seq = 0u32;
    let r = loop {
        if ctx.totals.stop.load(Ordering::Acquire) {
            break Ok("stopped at --limit".to_string());
        }
        let why = match TcpStream::connect(addr) {
            Err(e) => format!("cannot connect yet ({e})"),
            Ok(stream) => match session(ctx, stream, &mut writer, &mut seq) {
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
                    tries = 0;
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
                Ended::NotYet(e) => e,
            },
        };
        if tries == 0 {
            since = Instant::now();
        }
        let left = wait.saturating_sub(since.elapsed());
        if left.is_zero() {
            break Err(format!(
                "{why}; gave up after trying for {:.0} s (--retry-for)",
                wait.as_secs_f64()
            ));
        }
        let pause = backoff(tries).min(left);
        // every refusal for room is news; an unreachable BU is said once
        if tries == 0 || !why.starts_with("cannot connect") {
            eprintln!(
                "evb consume: {addr}: {why}; trying again in {:.1} s (for {:.0} s more)",
                pause.as_secs_f64(),
                left.as_secs_f64()
            );
        }
        tries += 1;
        std::thread::sleep(pause);
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

/// A proof: HMAC-SHA256 keyed by a [`proof_key`] (docs/protocol.md §7.2), made with the
/// same primitive as the control API's token.
fn prove(key: &[u8]) -> [u8; PROOF_LEN] {
    let t = evb_transport::control_token(key);
    let mut out = [0u8; PROOF_LEN];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).unwrap_or(0);
    }
    out
}

/// Constant-time check of the BU's proof.
fn proof_matches(key: &[u8], proof: &[u8; PROOF_LEN]) -> bool {
    let hex: String = proof.iter().map(|b| format!("{b:02x}")).collect();
    evb_transport::control_token_matches(key, &hex)
}

/// A random, non-zero nonce for the Hello; without randomness no Hello is sent.
fn nonce() -> Result<u64, String> {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| format!("no randomness for the Hello's nonce: {e}"))?;
    match u64::from_le_bytes(b) {
        0 => Err("the random source gave an all-zero nonce".into()),
        n => Ok(n),
    }
}

/// Acknowledges the events in `taken` (if any) in one Ack frame, sent at once.
fn acknowledge(out: &mut impl Write, taken: &mut Vec<u64>) -> std::io::Result<()> {
    if taken.is_empty() {
        return Ok(());
    }
    let ack = ConsumerMsg::Ack(std::mem::take(taken)).encode();
    out.write_all(&ack).and_then(|_| out.flush())
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
    let nonce = match &ctx.secret {
        Some(_) => match nonce() {
            Ok(n) => n,
            Err(e) => return Ended::Fatal(e),
        },
        None => 0,
    };
    let hello = ConsumerMsg::Hello(ConsumerHello {
        max_held: ctx.a.max_held,
        nonce,
        run_id: ctx.run_id.clone(),
        name: ctx.name.clone(),
    });
    let payload = hello.encode_payload();
    if let Err(e) = out.write_all(&hello.encode()) {
        return Ended::NotYet(format!("sending hello: {e}"));
    }
    let max_event = ctx.a.max_event_mib.saturating_mul(1 << 20);
    let mut answer = read_frame(&mut input, max_event);
    let mut proved = false;
    if let Ok(ConsumerMsg::Challenge { nonce: ch, proof }) = &answer {
        let Some(secret) = &ctx.secret else {
            return Ended::Fatal("the BU sent a Challenge to a Hello without a nonce".into());
        };
        if !proof_matches(&proof_key(ProofRole::Bu, secret, &payload, *ch), proof) {
            return Ended::Fatal(
                "the BU did not prove the run's secret: this consumer's secret (EVB_SECRET or \
                 --config's run.secret) is not the BU's run.secret; taking no events from it"
                    .into(),
            );
        }
        let auth = ConsumerMsg::Auth(prove(&proof_key(
            ProofRole::Consumer,
            secret,
            &payload,
            *ch,
        )));
        if let Err(e) = out.write_all(&auth.encode()) {
            return Ended::NotYet(format!("sending auth: {e}"));
        }
        proved = true;
        answer = read_frame(&mut input, max_event);
    }
    let welcome = match answer {
        Ok(ConsumerMsg::Welcome(_)) if ctx.secret.is_some() && !proved => {
            return Ended::Fatal(
                "the BU does not authenticate (it has no run.secret) but this consumer has a \
                 secret (EVB_SECRET or --config's run.secret): taking no events from it"
                    .into(),
            )
        }
        Ok(ConsumerMsg::Welcome(w)) => w,
        Ok(ConsumerMsg::Refuse {
            code: RefuseCode::Busy,
            reason,
        }) => return Ended::NotYet(format!("no room yet: {reason}")),
        Ok(ConsumerMsg::Refuse {
            code: RefuseCode::Unauthenticated,
            reason,
        }) => {
            return Ended::Fatal(match ctx.secret {
                None => format!(
                    "refused (Unauthenticated): {reason}: set EVB_SECRET, or give --config \
                     with the run's configuration (its run.secret)"
                ),
                Some(_) => format!(
                    "refused (Unauthenticated): {reason}: this consumer's secret (EVB_SECRET \
                     or --config's run.secret) is not the BU's run.secret"
                ),
            })
        }
        Ok(ConsumerMsg::Refuse { code, reason }) => {
            return Ended::Fatal(format!("refused ({code:?}): {reason}"))
        }
        Ok(other) => return Ended::Fatal(format!("expected Welcome, got {:?}", other.kind())),
        Err(e) => return Ended::NotYet(format!("no welcome: {e}")),
    };
    if let (Some(dir), None) = (&ctx.a.out, writer.as_ref()) {
        let dir = dir.join(&ctx.name);
        if let Err(e) = std::fs::create_dir_all(&dir) {
            return Ended::Fatal(format!("{}: {e}", dir.display()));
        }
        match EventFileWriter::create(&dir, &ctx.run_id, welcome.bu_index, *seq) {
            Ok(w) => {
                *seq += 1;
                *writer = Some(w);
            }
            Err(e) => return Ended::Fatal(e.to_string()),
        }
    }
    let mut out = BufWriter::new(out);
    // Events taken and not yet acknowledged: they are acknowledged together, in one Ack,
    // whenever nothing more is buffered to read (before this consumer would wait, so the
    // BU, which sends no more than its window unacknowledged, is never left waiting).
    let mut taken: Vec<u64> = Vec::new();
    loop {
        if input.buffer().is_empty() || taken.len() >= MAX_ACK_IDS {
            if let Err(e) = acknowledge(&mut out, &mut taken) {
                return Ended::Dropped(format!("sending an ack: {e}"));
            }
        }
        let msg = match read_frame(&mut input, max_event) {
            Ok(m) => m,
            Err(e) => return Ended::Dropped(format!("connection lost: {e}")),
        };
        let record = match msg {
            ConsumerMsg::Event(r) => r,
            ConsumerMsg::End { acked, lost } => {
                let _ = acknowledge(&mut out, &mut taken);
                return Ended::End { acked, lost };
            }
            other => {
                let _ = acknowledge(&mut out, &mut taken);
                return Ended::Fatal(format!("unexpected {:?} from the BU", other.kind()));
            }
        };
        if ctx.totals.stop.load(Ordering::Acquire) {
            // this one is not acknowledged: it goes to another consumer
            let _ = acknowledge(&mut out, &mut taken);
            return Ended::Limit;
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
            let _ = acknowledge(&mut out, &mut taken);
            return Ended::Fatal(format!("event {}: {}", ev.event_id, bad.join("; ")));
        }
        if ctx.a.slow_ms > 0 {
            std::thread::sleep(Duration::from_millis(ctx.a.slow_ms));
        }
        // An event served again (its BU died before the EVM committed it, and another BU
        // built it) is acknowledged, not written twice: event ids are unique in a run.
        let first_time = ctx
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ev.event_id);
        if !first_time {
            ctx.totals.repeated.fetch_add(1, Ordering::AcqRel);
        }
        if let Some(w) = writer.as_mut().filter(|_| first_time) {
            if let Err(e) = w.write_record(&record) {
                return Ended::Fatal(format!("writing event {}: {e}", ev.event_id));
            }
        }
        if let Some(f) = ctx.ids.as_ref().filter(|_| first_time) {
            let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
            let _ = writeln!(f, "{}", ev.event_id);
        }
        let n = if first_time {
            ctx.totals.bytes.fetch_add(bytes, Ordering::AcqRel);
            ctx.totals.events.fetch_add(1, Ordering::AcqRel) + 1
        } else {
            ctx.totals.events.load(Ordering::Acquire)
        };
        taken.push(ev.event_id);
        if ctx.a.limit.is_some_and(|l| n >= l) {
            ctx.totals.stop.store(true, Ordering::Release);
            if let Err(e) = acknowledge(&mut out, &mut taken) {
                return Ended::Dropped(format!("sending an ack: {e}"));
            }
            return Ended::Limit;
        }
    }
}

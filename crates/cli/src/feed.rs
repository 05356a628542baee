//! `evb feed`: a front-end emulator. Streams recorded fragment files over TCP to RUs that
//! read `source.kind = "stream"`, one connection per address, at a given rate or as fast as
//! the RU takes them (a full RU stops reading: TCP flow control slows the sender). With
//! `--frames CONFIG` it streams the generator's timestamped frames instead of files: the
//! continuous data of a detector read out without a trigger (docs/formats.md §9).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use evb_formats::{fed, framed, frames};

#[derive(Args)]
pub struct FeedArgs {
    /// Where to send: an RU's stream address. Give one `--to` per FILE (the i-th file goes
    /// to the i-th address), or one `--to` for all files, sent one after the other.
    #[arg(long, required = true, value_name = "HOST:PORT")]
    to: Vec<String>,
    /// Files of fragments (CMS FED, evb framed, or timestamped frames).
    #[arg(required_unless_present = "frames", conflicts_with = "frames")]
    files: Vec<PathBuf>,
    /// Stream the generator's frames of this run configuration (its `[frames]` and
    /// `run.seed`, built by time) instead of files: to each `--to` the frames of the source
    /// whose stream it is in the configuration, from tick 0, until `--limit` frames.
    #[arg(long, value_name = "CONFIG")]
    frames: Option<PathBuf>,
    /// Fragments (frames) per second on each stream (0: as fast as the RU reads).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Start again at the end of the files (trigger numbers go on counting), until `--limit`.
    #[arg(long = "loop")]
    looped: bool,
    /// Stop after this many fragments per stream (0: at the end of the files, or never with --loop).
    #[arg(long, default_value_t = 0)]
    limit: u64,
    /// How the files are framed (`auto`: evb framed if it starts with "EVFR", frames if
    /// "EVTF", else FED; `raw`: the bytes as they are, in 64 KiB pieces, to test a reader
    /// with bad input).
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    format: Format,
    /// Keep trying to connect for this long (the RU may not be listening yet). [seconds, or
    /// with a unit: 500ms, 2m]
    #[arg(long, default_value_t = 30.0, value_parser = crate::duration::secs)]
    connect_timeout_s: f64,
    /// Connect from this local IP address (the RU takes streams only from
    /// `source.allow_from`; this shows what a front-end at that address sees).
    #[arg(long, value_name = "IP")]
    from: Option<IpAddr>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Auto,
    Fed,
    Framed,
    Frames,
    Raw,
}

/// One record to send: a fragment (FED), a record with its header (framed), or a piece (raw).
struct Record {
    bytes: Vec<u8>,
}

/// What one stream sends: its records, in order, and how they are renumbered.
struct Plan {
    to: String,
    names: String,
    records: Vec<Record>,
    format: Format,
    /// `--frames`: the run's configuration and the source whose frames are made as sent.
    generated: Option<(evb_config::Config, u16)>,
}

/// What one stream sent.
struct Sent {
    fragments: u64,
    bytes: u64,
    seconds: f64,
}

pub fn run(a: &FeedArgs) -> Result<(), String> {
    if !(a.rate.is_finite() && a.rate >= 0.0) {
        return Err(format!("--rate {}: must be 0 or a positive number", a.rate));
    }
    if let Some(path) = &a.frames {
        return run_plans(a, generated_plans(a, path)?);
    }
    if a.to.len() != 1 && a.to.len() != a.files.len() {
        return Err(format!(
            "{} addresses for {} files: give one --to per file, or one for all",
            a.to.len(),
            a.files.len()
        ));
    }
    let mut plans: Vec<Plan> = Vec::new();
    for (i, file) in a.files.iter().enumerate() {
        let to = if a.to.len() == 1 { &a.to[0] } else { &a.to[i] };
        let data =
            std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let format = match a.format {
            Format::Auto if data.starts_with(&framed::RECORD_MAGIC) => Format::Framed,
            Format::Auto if data.starts_with(&frames::FRAME_MAGIC) => Format::Frames,
            Format::Auto => Format::Fed,
            f => f,
        };
        let records = split(&data, format).map_err(|e| format!("{}: {e}", file.display()))?;
        match plans.iter_mut().find(|p| &p.to == to) {
            Some(p) if p.format == format => {
                p.records.extend(records);
                p.names.push_str(&format!(", {}", file.display()));
            }
            Some(_) => {
                return Err(format!(
                    "{}: not the format of the other files to {to}",
                    file.display()
                ))
            }
            None => plans.push(Plan {
                to: to.clone(),
                names: file.display().to_string(),
                records,
                format,
                generated: None,
            }),
        }
    }
    run_plans(a, plans)
}

/// `--frames CONFIG`: a plan per `--to`, each the generator's frames of the source that
/// address is the stream of.
fn generated_plans(a: &FeedArgs, path: &std::path::Path) -> Result<Vec<Plan>, String> {
    let cfg = evb_config::Config::from_file(path).map_err(|e| e.to_string())?;
    if !cfg.by_time() {
        return Err(format!(
            "--frames {}: not a run built by time (builder.by = \"time\" or \"window\")",
            path.display()
        ));
    }
    if a.limit == 0 && !a.looped {
        return Err(
            "--frames needs --limit (frames per stream), or --loop to send for ever".into(),
        );
    }
    let nodes = cfg.nodes();
    a.to.iter()
        .map(|to| {
            let source = nodes
                .iter()
                .find_map(|n| {
                    let i = n.streams.iter().position(|s| s == to)?;
                    Some(n.stream_sources.get(i).copied().unwrap_or(n.source_id))
                })
                .ok_or_else(|| format!("{to}: no RU's stream in {}", path.display()))?;
            Ok(Plan {
                to: to.clone(),
                names: format!("source {source}'s frames"),
                records: Vec::new(),
                format: Format::Frames,
                generated: Some((cfg.clone(), source)),
            })
        })
        .collect()
}

fn run_plans(a: &FeedArgs, plans: Vec<Plan>) -> Result<(), String> {
    let timeout = Duration::from_secs_f64(a.connect_timeout_s.clamp(0.0, 86_400.0));
    let threads: Vec<_> = plans
        .into_iter()
        .map(|p| {
            let (rate, looped, limit, from) = (a.rate, a.looped, a.limit, a.from);
            std::thread::spawn(move || {
                let r = send(&p, rate, looped, limit, timeout, from);
                (p.to, p.names, r)
            })
        })
        .collect();
    let mut failed = Vec::new();
    for t in threads {
        let (to, names, r) = t.join().map_err(|_| "a sender thread failed".to_string())?;
        match r {
            Ok(s) => println!(
                "{to}: sent {} fragments, {:.2} MB from {names} in {:.2} s ({:.0} fragments/s)",
                s.fragments,
                s.bytes as f64 / 1e6,
                s.seconds,
                s.fragments as f64 / s.seconds.max(1e-9)
            ),
            Err(e) => failed.push(format!("{to}: {e}")),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// Cuts a file into the records sent one by one (a rate applies per record).
fn split(data: &[u8], format: Format) -> Result<Vec<Record>, String> {
    Ok(match format {
        Format::Fed | Format::Auto => fed::split(data)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|r| Record {
                bytes: data[r].to_vec(),
            })
            .collect(),
        Format::Framed => {
            let mut out = Vec::new();
            let mut at = 0;
            while at < data.len() {
                let (rec, _) = framed::read_at(data, at).map_err(|e| e.to_string())?;
                out.push(Record {
                    bytes: data[at..rec.payload.end].to_vec(),
                });
                at = rec.payload.end;
            }
            out
        }
        Format::Frames => frames::split(data)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|f| Record { bytes: f.to_vec() })
            .collect(),
        Format::Raw => data
            .chunks(64 << 10)
            .map(|c| Record { bytes: c.to_vec() })
            .collect(),
    })
}

/// The record as sent on pass `pass` of a loop: trigger numbers moved on by `pass × shift`
/// (and the checksums that cover them made again), so a looping front-end never repeats one.
#[cfg(test)]
fn renumbered(r: &Record, format: Format, pass: u64, shift: u64) -> Vec<u8> {
    let mut b = Vec::new();
    append_renumbered(r, format, pass, shift, &mut b);
    b
}

/// Appends the record to `out` as [`renumbered`] makes it, without a copy of its own.
fn append_renumbered(r: &Record, format: Format, pass: u64, shift: u64, out: &mut Vec<u8>) {
    let at = out.len();
    out.extend_from_slice(&r.bytes);
    if pass == 0 {
        return;
    }
    let b = &mut out[at..];
    match format {
        Format::Fed | Format::Auto if b.len() >= 16 => {
            let h = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
            let lv1 = ((h >> 32) & 0xff_ffff).wrapping_add(pass.wrapping_mul(shift)) & 0xff_ffff;
            let h = (h & !(0xff_ffffu64 << 32)) | (lv1 << 32);
            b[..8].copy_from_slice(&h.to_le_bytes());
            let n = b.len();
            let t = u64::from_le_bytes(b[n - 8..].try_into().expect("8 bytes"));
            let crc = fed::crc16(b) as u64;
            let t = (t & !(0xffffu64 << 16)) | (crc << 16);
            b[n - 8..].copy_from_slice(&t.to_le_bytes());
        }
        Format::Frames if b.len() >= frames::FRAME_PREFIX_LEN + 24 => {
            // every tick moved on by the file's span (`shift`, in ticks)
            let f = &mut b[frames::FRAME_PREFIX_LEN..];
            for at in [0, 8] {
                let t = u64::from_le_bytes(f[at..at + 8].try_into().expect("8 bytes"));
                let t = t.wrapping_add(pass.wrapping_mul(shift));
                f[at..at + 8].copy_from_slice(&t.to_le_bytes());
            }
            let crc = crc32c::crc32c_append(crc32c::crc32c(&f[..20]), &f[24..]);
            f[20..24].copy_from_slice(&crc.to_le_bytes());
        }
        Format::Framed if b.len() >= framed::RECORD_HEADER_LEN => {
            let t = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
            let t = t.wrapping_add((pass.wrapping_mul(shift)) as u32);
            b[12..16].copy_from_slice(&t.to_le_bytes());
            let crc = crc32c::crc32c(&b[..20]);
            b[20..24].copy_from_slice(&crc.to_le_bytes());
        }
        _ => {}
    }
}

fn connect(to: &str, timeout: Duration, from: Option<IpAddr>) -> Result<TcpStream, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let attempt = match from {
            None => TcpStream::connect(to),
            Some(ip) => connect_from(to, ip),
        };
        match attempt {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!(
                    "cannot connect after {:.1} s: {e}",
                    timeout.as_secs_f64()
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Connects to `to` from the local address `from` (any port): bound before it connects,
/// which the standard library cannot do.
fn connect_from(to: &str, from: IpAddr) -> std::io::Result<TcpStream> {
    use std::io::{Error, ErrorKind};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let target = to
        .to_socket_addrs()?
        .find(|a| a.is_ipv4() == from.is_ipv4())
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("{to} has no address of the family of --from {from}"),
            )
        })?;
    let domain = if target.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: a plain socket(2) call; the descriptor is owned (and closed) by `fd` below.
    let raw = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor just opened and owned by no one else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let (local, len) = sockaddr(SocketAddr::new(from, 0));
    // SAFETY: `local` is a sockaddr_storage holding a sockaddr of `len` bytes.
    if unsafe { libc::bind(fd.as_raw_fd(), (&raw const local).cast(), len) } < 0 {
        return Err(Error::last_os_error());
    }
    let (remote, len) = sockaddr(target);
    // SAFETY: as for bind.
    if unsafe { libc::connect(fd.as_raw_fd(), (&raw const remote).cast(), len) } < 0 {
        return Err(Error::last_os_error());
    }
    Ok(TcpStream::from(fd))
}

/// `a` as the C library's socket address.
fn sockaddr(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero bytes are a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&raw mut ss).cast::<libc::sockaddr_in>(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&raw mut ss).cast::<libc::sockaddr_in6>(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn send(
    p: &Plan,
    rate: f64,
    looped: bool,
    limit: u64,
    timeout: Duration,
    from: Option<IpAddr>,
) -> Result<Sent, String> {
    let mut s = connect(&p.to, timeout, from)?;
    let _ = s.set_nodelay(true);
    let t0 = Instant::now();
    let (mut fragments, mut bytes) = (0u64, 0u64);
    let n = p.records.len() as u64;
    let mut pass = 0;
    // Unpaced, fragments go out in writes of up to BATCH bytes: a front-end streams, and a
    // send per few-hundred-byte fragment made this emulator, not the RU, the bottleneck.
    // Paced, each fragment is written at its time.
    const BATCH: usize = 64 * 1024;
    let mut out: Vec<u8> = Vec::with_capacity(BATCH + 4096);
    let (mut sent_frags, mut sent_bytes) = (0u64, 0u64);
    let mut write = |out: &mut Vec<u8>, frags: u64| -> Result<(), String> {
        s.write_all(out).map_err(|e| {
            format!("the receiver closed the stream after {sent_frags} fragments ({sent_bytes} bytes): {e}")
        })?;
        sent_frags = frags;
        sent_bytes += out.len() as u64;
        out.clear();
        Ok(())
    };
    if let Some((cfg, source)) = &p.generated {
        let g = evb_node::setup::frame_generator(cfg)?
            .ok_or_else(|| "the configuration makes no frames".to_string())?;
        // from the run's first tick (frames.first_tick, a multiple of frames.ticks)
        let first = cfg.frames.first_tick / cfg.frames.ticks.max(1);
        let mut n = 0u64;
        while limit == 0 || n < limit {
            let j = first + n;
            if rate > 0.0 {
                let due = t0 + Duration::from_secs_f64(n as f64 / rate);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            let at = out.len();
            out.extend_from_slice(&frames::FRAME_MAGIC);
            out.extend_from_slice(&[0; 4]);
            g.frame(*source, j, &mut out);
            let len = (out.len() - at - frames::FRAME_PREFIX_LEN) as u32;
            out[at + 4..at + 8].copy_from_slice(&len.to_le_bytes());
            bytes += (out.len() - at) as u64;
            n += 1;
            fragments += 1;
            if rate > 0.0 || out.len() >= BATCH {
                write(&mut out, fragments)?;
            }
        }
    }
    // a looped file of frames moves on by its span of ticks, other formats by its count
    let shift = match p.format {
        Format::Frames => p
            .records
            .last()
            .and_then(|r| r.bytes.get(16..24))
            .map_or(0, |e| u64::from_le_bytes(e.try_into().expect("8 bytes"))),
        _ => n,
    };
    'outer: loop {
        for r in p.records.iter().filter(|_| p.generated.is_none()) {
            if limit > 0 && fragments >= limit {
                break 'outer;
            }
            if rate > 0.0 {
                let due = t0 + Duration::from_secs_f64(fragments as f64 / rate);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            append_renumbered(r, p.format, pass, shift, &mut out);
            fragments += 1;
            bytes += r.bytes.len() as u64;
            if rate > 0.0 || out.len() >= BATCH {
                write(&mut out, fragments)?;
            }
        }
        pass += 1;
        if !looped || n == 0 || p.generated.is_some() {
            break;
        }
    }
    write(&mut out, fragments)?;
    s.flush().map_err(|e| e.to_string())?;
    // a clean end of stream: the RU reads it as the end of this source's data
    let _ = s.shutdown(std::net::Shutdown::Write);
    // Written is not read: the RU closes its end once it read everything (a clean end of
    // stream here), or resets it with bytes still unread (it refused the connection, or the
    // run ended and it stopped reading). Wait for which.
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(format!(
                    "the receiver closed the stream without reading all {fragments} fragments \
                     ({bytes} bytes) sent: {e}"
                ))
            }
        }
    }
    Ok(Sent {
        fragments,
        bytes,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_looped_fed_fragment_is_renumbered_and_still_valid() {
        let r = Record {
            bytes: fed::build(7, 841, &[1, 2, 3]),
        };
        let b = renumbered(&r, Format::Fed, 2, 100);
        let info = fed::validate(&b, 0, Some(841)).unwrap();
        assert_eq!(info.lv1_id, 207);
        let r = Record {
            bytes: framed::encode(5, b"abc"),
        };
        let b = renumbered(&r, Format::Framed, 1, 10);
        let (rec, crc) = framed::read_at(&b, 0).unwrap();
        assert_eq!((rec.trigger_number, crc), (15, None));
        // a file of frames moves on by its span of ticks, its CRC made again
        let r = Record {
            bytes: frames::encode(990, 1000, 3, 0, b"abc"),
        };
        let b = renumbered(&r, Format::Frames, 2, 1000);
        let h = frames::check(&b[frames::FRAME_PREFIX_LEN..]).unwrap();
        assert_eq!((h.begin, h.end, h.source_id), (2990, 3000, 3));
    }
}

//! ZeroMQ through its Rust binding (`zmq` 0.10, a static libzmq 4.3.4 built from source),
//! over the same loopback: PUSH/PULL for throughput, PAIR ping-pong for latency.

use std::time::{Duration, Instant};

use crate::measure::{fill_rates, thread_cpu, Point, RoundTrips};

fn bind_any(sock: &zmq::Socket) -> Result<String, String> {
    sock.bind("tcp://127.0.0.1:*").map_err(|e| e.to_string())?;
    sock.get_last_endpoint()
        .map_err(|e| e.to_string())?
        .map_err(|_| "endpoint is not UTF-8".to_string())
}

/// PUSH → PULL, `size`-byte messages for `duration`; a zero-length message ends the run.
pub fn p2p(size: usize, duration: Duration) -> Result<Point, String> {
    let ctx = zmq::Context::new();
    let pull = ctx.socket(zmq::PULL).map_err(|e| e.to_string())?;
    let _ = pull.set_rcvhwm(10_000);
    let ep = bind_any(&pull)?;
    let push = ctx.socket(zmq::PUSH).map_err(|e| e.to_string())?;
    let _ = push.set_sndhwm(10_000);
    push.connect(&ep).map_err(|e| e.to_string())?;
    let rx = std::thread::spawn(
        move || -> Result<(u64, u64, Instant, Instant, Duration), String> {
            let mut msg = zmq::Message::new();
            let (mut n, mut bytes) = (0u64, 0u64);
            pull.recv(&mut msg, 0).map_err(|e| e.to_string())?;
            let first = Instant::now();
            let cpu0 = thread_cpu();
            loop {
                if msg.is_empty() {
                    break;
                }
                n += 1;
                bytes += msg.len() as u64;
                pull.recv(&mut msg, 0).map_err(|e| e.to_string())?;
            }
            Ok((n, bytes, first, Instant::now(), thread_cpu() - cpu0))
        },
    );
    let payload = vec![0x5au8; size];
    let cpu0 = thread_cpu();
    let end = Instant::now() + duration;
    'run: loop {
        for _ in 0..64 {
            push.send(&payload[..], 0).map_err(|e| e.to_string())?;
        }
        if Instant::now() >= end {
            break 'run;
        }
    }
    push.send(&[][..], 0).map_err(|e| e.to_string())?;
    let send_cpu = thread_cpu() - cpu0;
    let (n, bytes, first, last, recv_cpu) = rx.join().map_err(|_| "zmq receiver panicked")??;
    let mut p = Point::new("p2p", "zmq", "tcp", "push-pull", size as u64);
    let secs = last.duration_since(first).as_secs_f64().max(1e-9);
    fill_rates(&mut p, n, bytes, secs, send_cpu, recv_cpu);
    p.note = "libzmq I/O threads' CPU not included".into();
    Ok(p)
}

/// PAIR ping-pong: `in_flight` messages of `size` bytes kept in flight, each echoed.
pub fn latency(size: usize, in_flight: usize, duration: Duration) -> Result<Point, String> {
    let ctx = zmq::Context::new();
    let srv = ctx.socket(zmq::PAIR).map_err(|e| e.to_string())?;
    let ep = bind_any(&srv)?;
    let cli = ctx.socket(zmq::PAIR).map_err(|e| e.to_string())?;
    cli.connect(&ep).map_err(|e| e.to_string())?;
    let echo = std::thread::spawn(move || -> Result<(), String> {
        let mut msg = zmq::Message::new();
        loop {
            srv.recv(&mut msg, 0).map_err(|e| e.to_string())?;
            if msg.is_empty() {
                return Ok(());
            }
            srv.send(&msg[..], 0).map_err(|e| e.to_string())?;
        }
    });
    let payload = vec![0x5au8; size];
    let mut trips = RoundTrips::new(duration);
    let mut msg = zmq::Message::new();
    for _ in 0..in_flight {
        trips.sent();
        cli.send(&payload[..], 0).map_err(|e| e.to_string())?;
    }
    while trips.in_flight() {
        cli.recv(&mut msg, 0).map_err(|e| e.to_string())?;
        if trips.replied()? {
            trips.sent();
            cli.send(&payload[..], 0).map_err(|e| e.to_string())?;
        }
    }
    let mut p = Point::new("lat", "zmq", "tcp", "pair", size as u64);
    p.in_flight = in_flight as u32;
    trips.fill(&mut p, size);
    cli.send(&[][..], 0).map_err(|e| e.to_string())?;
    echo.join().map_err(|_| "zmq echo panicked")??;
    Ok(p)
}

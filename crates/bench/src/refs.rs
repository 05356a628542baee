//! References that are not message libraries: iperf3 over loopback and memcpy.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::measure::Point;

fn have(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Makes sure iperf3 is there: installs it with apt-get when missing and we are root.
pub fn ensure_iperf3() -> Result<(), String> {
    if have("iperf3") {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        return Err("iperf3 is not installed and we are not root to install it".into());
    }
    eprintln!("evb bench: installing iperf3 with apt-get");
    let ok = Command::new("apt-get")
        .args(["install", "-y", "-q", "iperf3"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok && have("iperf3") {
        Ok(())
    } else {
        Err("apt-get install iperf3 failed".into())
    }
}

/// One iperf3 single-stream run over loopback with 1 MiB writes, moving `bytes` bytes.
pub fn iperf3(bytes: u64) -> Result<Point, String> {
    let port = evb_messaging::free_ports(1)
        .ok_or("no free loopback port")?
        .to_string();
    let mut server = Command::new("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("iperf3 -s: {e}"))?;
    let mut result = Err("iperf3 client never connected".to_string());
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(50));
        let out = Command::new("iperf3")
            .args(["-c", "127.0.0.1", "-p", &port, "-l", "1M", "-J", "-n"])
            .arg(bytes.to_string())
            .output()
            .map_err(|e| format!("iperf3 -c: {e}"))?;
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if let Some(e) = v["error"].as_str() {
            result = Err(format!("iperf3: {e}"));
            if e.contains("connect") {
                continue;
            }
            break;
        }
        result = parse_iperf3(&v);
        break;
    }
    let _ = server.kill();
    let _ = server.wait();
    result
}

fn parse_iperf3(v: &Value) -> Result<Point, String> {
    let end = &v["end"];
    let bps = end["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or("iperf3 JSON has no end.sum_received.bits_per_second")?;
    let secs = end["sum_received"]["seconds"].as_f64().unwrap_or(f64::NAN);
    let gbps = bps / 8e9;
    let mut p = Point::new("ref", "iperf3", "tcp", "-l 1M", 1 << 20);
    p.gb_per_s = gbps;
    p.msgs_per_s = gbps * 1e9 / (1 << 20) as f64;
    let cpu = &end["cpu_utilization_percent"];
    let gb = gbps * secs;
    if let (Some(h), Some(r)) = (cpu["host_total"].as_f64(), cpu["remote_total"].as_f64()) {
        p.send_cpu_s_per_gb = h / 100.0 * secs / gb;
        p.recv_cpu_s_per_gb = r / 100.0 * secs / gb;
    }
    Ok(p)
}

/// Single-thread memcpy bandwidth for a buffer of `size` bytes, copied for about `duration`.
pub fn memcpy(size: usize, duration: Duration) -> Point {
    let src = vec![0xa5u8; size];
    let mut dst = vec![0u8; size];
    dst.copy_from_slice(&src); // fault the pages in, warm the cache
    let start = Instant::now();
    let mut copies = 0u64;
    while copies < 2 || start.elapsed() < duration {
        std::hint::black_box(&mut dst).copy_from_slice(std::hint::black_box(&src));
        copies += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let variant = if size <= 4 << 20 {
        "cache-warm"
    } else {
        "memory"
    };
    let mut p = Point::new("ref", "memcpy", "memory", variant, size as u64);
    p.msgs_per_s = copies as f64 / secs;
    p.gb_per_s = copies as f64 * size as f64 / secs / 1e9;
    p
}

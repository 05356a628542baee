//! Measurement helpers: per-thread CPU time, medians, result points.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// CPU time consumed so far by the calling thread (user + system).
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call, and
    // CLOCK_THREAD_CPUTIME_ID is a clock every Linux kernel we run on provides.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Median of the values (the mean of the middle two for an even count); NaN when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| !x.is_nan());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One measured point: a system moving messages of one size (one repetition, or the
/// median of several, field by field).
#[derive(Debug, Clone, Serialize, Default)]
pub struct Point {
    /// p2p, lat, nxn, build, ref
    pub bench: String,
    /// evb, zmq, iperf3, memcpy
    pub system: String,
    /// tcp, inproc, or what the reference measures
    pub transport: String,
    /// how evb sent: batched (send_batched), fragment (send_fragment), now (send_now),
    /// busy-poll, fixed, lognormal, ...
    pub variant: String,
    /// bytes per message (per fragment for nxn and build)
    pub size: u64,
    /// senders x receivers (RUs x BUs for build)
    pub senders: u32,
    pub receivers: u32,
    /// messages in flight (lat)
    pub in_flight: u32,
    /// repetitions behind the medians
    pub reps: u32,
    pub msgs_per_s: f64,
    pub gb_per_s: f64,
    /// CPU seconds per GB moved, summed over the sending threads
    pub send_cpu_s_per_gb: f64,
    /// CPU seconds per GB moved, summed over the receiving threads
    pub recv_cpu_s_per_gb: f64,
    /// round trip, microseconds
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub note: String,
}

impl Point {
    pub fn new(bench: &str, system: &str, transport: &str, variant: &str, size: u64) -> Point {
        Point {
            bench: bench.into(),
            system: system.into(),
            transport: transport.into(),
            variant: variant.into(),
            size,
            senders: 1,
            receivers: 1,
            in_flight: 0,
            reps: 1,
            msgs_per_s: f64::NAN,
            gb_per_s: f64::NAN,
            send_cpu_s_per_gb: f64::NAN,
            recv_cpu_s_per_gb: f64::NAN,
            p50_us: f64::NAN,
            p99_us: f64::NAN,
            p999_us: f64::NAN,
            note: String::new(),
        }
    }

    /// A short label naming the series this point belongs to.
    pub fn series(&self) -> String {
        let mut s = format!("{} {}", self.system, self.transport);
        if !self.variant.is_empty() {
            s.push(' ');
            s.push_str(&self.variant);
        }
        if self.senders != 1 || self.receivers != 1 {
            s.push_str(&format!(" {}x{}", self.senders, self.receivers));
        }
        if self.in_flight > 1 {
            s.push_str(&format!(" k={}", self.in_flight));
        }
        s
    }

    /// Combines repetitions of the same point: the median of every figure.
    pub fn median_of(reps: &[Point]) -> Point {
        let mut p = reps[0].clone();
        let m = |f: fn(&Point) -> f64| median(reps.iter().map(f).collect());
        p.reps = reps.len() as u32;
        p.msgs_per_s = m(|p| p.msgs_per_s);
        p.gb_per_s = m(|p| p.gb_per_s);
        p.send_cpu_s_per_gb = m(|p| p.send_cpu_s_per_gb);
        p.recv_cpu_s_per_gb = m(|p| p.recv_cpu_s_per_gb);
        p.p50_us = m(|p| p.p50_us);
        p.p99_us = m(|p| p.p99_us);
        p.p999_us = m(|p| p.p999_us);
        p
    }
}

/// Throughput figures from a byte and message count over a time and CPU times.
pub fn fill_rates(
    p: &mut Point,
    msgs: u64,
    bytes: u64,
    secs: f64,
    send_cpu: Duration,
    recv_cpu: Duration,
) {
    let gb = bytes as f64 / 1e9;
    p.msgs_per_s = msgs as f64 / secs;
    p.gb_per_s = gb / secs;
    if gb > 0.0 {
        p.send_cpu_s_per_gb = send_cpu.as_secs_f64() / gb;
        p.recv_cpu_s_per_gb = recv_cpu.as_secs_f64() / gb;
    }
}

/// Ping-pong bookkeeping shared by the latency benchmarks (evb and ZeroMQ): the send times of
/// the requests in flight, a warm-up, then a histogram of round trips for `duration`.
pub struct RoundTrips {
    out: VecDeque<Instant>,
    hist: Histogram<u64>,
    done: u64,
    start: Instant,
    end: Instant,
    duration: Duration,
}

impl RoundTrips {
    /// Replies before this many are not recorded.
    const WARMUP: u64 = 200;

    pub fn new(duration: Duration) -> RoundTrips {
        let start = Instant::now();
        RoundTrips {
            out: VecDeque::new(),
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("bounds"),
            done: 0,
            start,
            end: start + duration,
            duration,
        }
    }

    /// A request goes out now.
    pub fn sent(&mut self) {
        self.out.push_back(Instant::now());
    }

    pub fn in_flight(&self) -> bool {
        !self.out.is_empty()
    }

    /// The oldest request's reply arrived: true when another request should go out.
    pub fn replied(&mut self) -> Result<bool, String> {
        let now = Instant::now();
        let t = self.out.pop_front().ok_or("reply to nothing")?;
        self.done += 1;
        if self.done == Self::WARMUP {
            self.start = now;
            self.end = now + self.duration;
            self.hist.reset();
        }
        self.hist
            .saturating_record(now.duration_since(t).as_nanos() as u64);
        Ok(self.done < Self::WARMUP || now < self.end)
    }

    /// Rates and percentiles into `p` (call when every reply is in).
    pub fn fill(&self, p: &mut Point, size: usize) {
        let secs = self.start.elapsed().as_secs_f64();
        let n = self.hist.len();
        p.msgs_per_s = n as f64 / secs;
        p.gb_per_s = n as f64 * size as f64 / secs / 1e9;
        p.p50_us = self.hist.value_at_quantile(0.5) as f64 / 1e3;
        p.p99_us = self.hist.value_at_quantile(0.99) as f64 / 1e3;
        p.p999_us = self.hist.value_at_quantile(0.999) as f64 / 1e3;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
        assert_eq!(median(vec![f64::NAN, 5.0]), 5.0);
    }

    #[test]
    fn thread_cpu_advances() {
        let a = thread_cpu();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu() >= a);
    }
}

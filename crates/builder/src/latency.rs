//! Event building latency (assigned → built) as a histogram with fixed buckets: a few
//! nanoseconds per event, no allocation, and the shape Prometheus histograms expect.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bounds of the buckets, in microseconds (a last, unbounded bucket follows).
pub const LATENCY_BOUNDS_US: [u64; 17] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct LatencyHistogram {
    /// Events per bucket (not cumulative): `counts[i]` took at most `LATENCY_BOUNDS_US[i]`
    /// and more than the bound before it; the last counts the rest.
    pub counts: Vec<u64>,
    pub sum_us: u64,
    pub count: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            counts: vec![0; LATENCY_BOUNDS_US.len() + 1],
            sum_us: 0,
            count: 0,
        }
    }
}

impl LatencyHistogram {
    pub fn record(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = LATENCY_BOUNDS_US.partition_point(|&b| b < us);
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.sum_us = self.sum_us.saturating_add(us);
        self.count += 1;
    }

    /// Adds another histogram's counts (a node's several BUs, or runs).
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
        self.count += other.count;
    }

    /// The bucket bound below which fraction `q` of the events fell (an upper estimate).
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let want = (q * self.count as f64).ceil() as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want.max(1) {
                return Some(LATENCY_BOUNDS_US.get(i).copied().unwrap_or(u64::MAX));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_latency_lands_in_its_bucket() {
        let mut h = LatencyHistogram::default();
        h.record(Duration::from_micros(10)); // ≤ 50 µs
        h.record(Duration::from_micros(50)); // ≤ 50 µs (bounds are inclusive)
        h.record(Duration::from_micros(51)); // ≤ 100 µs
        h.record(Duration::from_secs(60)); // beyond the last bound
        assert_eq!(h.counts[0], 2);
        assert_eq!(h.counts[1], 1);
        assert_eq!(h.counts[LATENCY_BOUNDS_US.len()], 1);
        assert_eq!(h.count, 4);
        assert_eq!(h.sum_us, 10 + 50 + 51 + 60_000_000);
        assert_eq!(h.quantile_us(0.5), Some(50));
        assert_eq!(h.quantile_us(0.75), Some(100));
        assert_eq!(h.quantile_us(1.0), Some(u64::MAX));
        let mut m = LatencyHistogram::default();
        m.merge(&h);
        m.merge(&h);
        assert_eq!(m.count, 8);
        assert_eq!(m.counts[0], 4);
    }

    #[test]
    fn an_old_report_without_counts_decodes() {
        let h: LatencyHistogram = serde_json::from_str("{}").unwrap();
        assert_eq!(h, LatencyHistogram::default());
    }
}

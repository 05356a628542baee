//! Event building latency (assigned → built), kept twice: in fixed buckets (the shape
//! Prometheus histograms expect, for `/metrics`) and in an HDR histogram whose percentiles
//! are within 1 % of the true value (for reports and benchmarks). Both cost a few
//! nanoseconds per event and allocate nothing after the start.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Upper bounds of the buckets, in microseconds (a last, unbounded bucket follows).
pub const LATENCY_BOUNDS_US: [u64; 17] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// The HDR histogram's range: 1 µs to an hour (longer is recorded as an hour), two
/// significant digits (a reported value is at most 1 % above the true one).
const HDR_MAX_US: u64 = 3_600_000_000;
const HDR_DIGITS: u8 = 2;

fn fine_histogram() -> Histogram<u64> {
    // the bounds are constants that hdrhistogram accepts (low ≥ 1, high ≥ 2 × low,
    // digits ≤ 5), so this cannot fail
    Histogram::new_with_bounds(1, HDR_MAX_US, HDR_DIGITS).expect("valid HDR histogram bounds")
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct LatencyHistogram {
    /// Events per bucket (not cumulative): `counts[i]` took at most `LATENCY_BOUNDS_US[i]`
    /// and more than the bound before it; the last counts the rest.
    pub counts: Vec<u64>,
    pub sum_us: u64,
    pub count: u64,
    /// The same events at 1 % resolution. In JSON: the non-empty cells as one string,
    /// `"value_us:count value_us:count …"` (`value_us` the highest value of the cell), which
    /// stays a line in a pretty-printed report however many cells there are.
    #[serde(serialize_with = "fine_out", deserialize_with = "fine_in")]
    pub fine: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            counts: vec![0; LATENCY_BOUNDS_US.len() + 1],
            sum_us: 0,
            count: 0,
            fine: fine_histogram(),
        }
    }
}

fn fine_out<S: Serializer>(h: &Histogram<u64>, s: S) -> Result<S::Ok, S::Error> {
    let cells: Vec<String> = h
        .iter_recorded()
        .map(|v| format!("{}:{}", v.value_iterated_to(), v.count_at_value()))
        .collect();
    s.serialize_str(&cells.join(" "))
}

fn fine_in<'de, D: Deserializer<'de>>(d: D) -> Result<Histogram<u64>, D::Error> {
    let text = String::deserialize(d)?;
    let mut h = fine_histogram();
    for cell in text.split_whitespace() {
        let parsed = cell
            .split_once(':')
            .and_then(|(v, n)| Some((v.parse::<u64>().ok()?, n.parse::<u64>().ok()?)));
        let Some((value, n)) = parsed else {
            return Err(serde::de::Error::custom(format!(
                "latency cell {cell:?} is not value_us:count"
            )));
        };
        h.saturating_record_n(value.clamp(1, HDR_MAX_US), n);
    }
    Ok(h)
}

impl LatencyHistogram {
    pub fn record(&mut self, d: Duration) {
        self.record_n(d, 1);
    }

    /// `n` events that each took `d`.
    pub fn record_n(&mut self, d: Duration, n: u64) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = LATENCY_BOUNDS_US.partition_point(|&b| b < us);
        if let Some(c) = self.counts.get_mut(i) {
            *c += n;
        }
        self.sum_us = self.sum_us.saturating_add(us.saturating_mul(n));
        self.count += n;
        self.fine.saturating_record_n(us.clamp(1, HDR_MAX_US), n);
    }

    /// Adds another histogram's counts (a node's several BUs, or runs).
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
        self.count += other.count;
        // same bounds on both sides, so the addition cannot fail; if a peer's report had
        // other bounds, its cells are re-recorded one by one
        if self.fine.add(&other.fine).is_err() {
            for v in other.fine.iter_recorded() {
                self.fine.saturating_record_n(
                    v.value_iterated_to().clamp(1, HDR_MAX_US),
                    v.count_at_value(),
                );
            }
        }
    }

    /// The latency below which fraction `q` of the events fell, in µs, at most 1 % above
    /// the true value (from the HDR histogram). `None` when nothing was recorded.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        if self.fine.is_empty() {
            return None;
        }
        Some(self.fine.value_at_quantile(q.clamp(0.0, 1.0)))
    }

    /// The fixed bucket's upper bound below which fraction `q` fell (what a Prometheus
    /// `histogram_quantile` over `/metrics` can at best say).
    pub fn bucket_quantile_us(&self, q: f64) -> Option<u64> {
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
        assert_eq!(h.bucket_quantile_us(0.5), Some(50));
        assert_eq!(h.bucket_quantile_us(0.75), Some(100));
        assert_eq!(h.bucket_quantile_us(1.0), Some(u64::MAX));
        let mut m = LatencyHistogram::default();
        m.merge(&h);
        m.merge(&h);
        assert_eq!(m.count, 8);
        assert_eq!(m.counts[0], 4);
        assert_eq!(m.fine.len(), 8);
    }

    /// The reported percentiles are the true ones within 1 %, not bucket edges, and they
    /// survive the trip through JSON (a BU's report) and a merge (several BUs).
    #[test]
    fn percentiles_are_within_one_percent_after_json_and_merge() {
        // 10,000 latencies spread over 37 µs … 37 ms, in two "BUs"
        let truth: Vec<u64> = (0..10_000u64).map(|i| 37 + i * i * 37 / 100_000).collect();
        let (mut a, mut b) = (LatencyHistogram::default(), LatencyHistogram::default());
        for (i, &us) in truth.iter().enumerate() {
            let h = if i % 3 == 0 { &mut a } else { &mut b };
            h.record(Duration::from_micros(us));
        }
        let mut all = LatencyHistogram::default();
        for h in [&a, &b] {
            let back: LatencyHistogram =
                serde_json::from_str(&serde_json::to_string(h).unwrap()).unwrap();
            assert_eq!(&back, h);
            all.merge(&back);
        }
        let mut sorted = truth.clone();
        sorted.sort_unstable();
        for q in [0.5, 0.9, 0.99, 0.999] {
            let exact = sorted[((q * sorted.len() as f64).ceil() as usize).max(1) - 1] as f64;
            let got = all.quantile_us(q).unwrap() as f64;
            assert!(
                (got - exact).abs() <= exact * 0.01 + 1.0,
                "q {q}: {got} µs against {exact} µs"
            );
        }
        // the bucket bound is far off: the reason for the HDR histogram
        let bucket = all.bucket_quantile_us(0.5).unwrap() as f64;
        let exact = sorted[4_999] as f64;
        assert!(bucket > exact * 1.05, "bucket {bucket} vs {exact}");
    }

    #[test]
    fn an_old_report_without_counts_decodes() {
        let h: LatencyHistogram = serde_json::from_str("{}").unwrap();
        assert_eq!(h, LatencyHistogram::default());
        assert_eq!(h.quantile_us(0.5), None);
    }

    #[test]
    fn a_garbled_fine_part_is_refused_or_clamped_never_a_panic() {
        assert!(serde_json::from_str::<LatencyHistogram>(r#"{"fine": 3}"#).is_err());
        assert!(serde_json::from_str::<LatencyHistogram>(r#"{"fine": "12:x"}"#).is_err());
        assert!(serde_json::from_str::<LatencyHistogram>(r#"{"fine": "12"}"#).is_err());
        let h: LatencyHistogram =
            serde_json::from_str(r#"{"fine": "0:5 18446744073709551615:1"}"#).unwrap();
        assert_eq!(h.fine.len(), 6);
    }
}

//! The built-in data source: fragment sizes and contents derived from (event id, source id),
//! so a builder unit can recompute and verify every byte it receives.

use rand::rngs::SmallRng;
use rand::SeedableRng;
use rand_distr::{Distribution, LogNormal};

/// How fragment sizes are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SizeModel {
    Fixed(usize),
    /// Log-normal with this mean and standard deviation (bytes), clamped to [min, max].
    LogNormal {
        mean: f64,
        stddev: f64,
        min: usize,
        max: usize,
    },
}

impl SizeModel {
    /// Largest size this model can produce.
    pub fn max(&self) -> usize {
        match *self {
            SizeModel::Fixed(n) => n,
            SizeModel::LogNormal { max, .. } => max,
        }
    }

    pub fn mean(&self) -> f64 {
        match *self {
            SizeModel::Fixed(n) => n as f64,
            SizeModel::LogNormal { mean, .. } => mean,
        }
    }
}

/// What a fragment's bytes are derived from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Content {
    /// Event id and source id: every fragment differs, and the RU writes each one.
    #[default]
    Unique,
    /// Source id only: a source's fragments all start with the same bytes, which the RU makes
    /// once and sends from memory, as a readout that DMAs its data costs the RU no CPU.
    /// Used to measure the event builder without the cost of making data.
    Static,
}

#[derive(Debug, Clone)]
pub struct Generator {
    pub sizes: SizeModel,
    pub seed: u64,
    pub content: Content,
    lognormal: Option<LogNormal<f64>>,
}

/// SplitMix64: a fast, well-mixed hash of one word.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const STEP: u64 = 0x9e37_79b9_7f4a_7c15;

impl Generator {
    pub fn new(sizes: SizeModel, seed: u64) -> Generator {
        let lognormal = match sizes {
            SizeModel::LogNormal { mean, stddev, .. } => {
                // parameters of the underlying normal from the wanted mean and deviation
                let sigma2 = (1.0 + (stddev * stddev) / (mean * mean)).ln();
                let mu = mean.ln() - sigma2 / 2.0;
                LogNormal::new(mu, sigma2.sqrt()).ok()
            }
            SizeModel::Fixed(_) => None,
        };
        Generator {
            sizes,
            seed,
            content: Content::Unique,
            lognormal,
        }
    }

    pub fn with_content(mut self, content: Content) -> Generator {
        self.content = content;
        self
    }

    fn key(&self, event_id: u64, source_id: u16) -> u64 {
        mix(self.seed ^ mix(event_id ^ ((source_id as u64) << 48)))
    }

    /// The key of a fragment's content (sizes always vary by event).
    fn content_key(&self, event_id: u64, source_id: u16) -> u64 {
        match self.content {
            Content::Unique => self.key(event_id, source_id),
            Content::Static => self.key(0, source_id),
        }
    }

    /// The payload size of this source's fragment of this event. (Inlined: an RU asks at
    /// every fragment, and with fixed sizes the answer is one load.)
    #[inline]
    pub fn size(&self, event_id: u64, source_id: u16) -> usize {
        match (self.sizes, &self.lognormal) {
            (SizeModel::Fixed(n), _) => n,
            (SizeModel::LogNormal { min, max, .. }, Some(d)) => {
                let mut rng = SmallRng::seed_from_u64(self.key(event_id, source_id));
                (d.sample(&mut rng).round() as usize).clamp(min, max.max(min))
            }
            (SizeModel::LogNormal { mean, .. }, None) => mean as usize,
        }
    }

    /// Writes bytes `[offset, offset + buf.len())` of the fragment's content into `buf`.
    /// Content is a sequence of little-endian words `key + i * STEP`, so any range can be
    /// made (or checked) on its own.
    pub fn fill(&self, event_id: u64, source_id: u16, offset: usize, buf: &mut [u8]) {
        let key = self.content_key(event_id, source_id);
        let word = |i: usize| {
            key.wrapping_add((i as u64).wrapping_mul(STEP))
                .to_le_bytes()
        };
        let mut pos = offset;
        let mut out = buf;
        // unaligned head, byte by byte
        while !pos.is_multiple_of(8) && !out.is_empty() {
            out[0] = word(pos / 8)[pos % 8];
            pos += 1;
            out = &mut out[1..];
        }
        let mut chunks = out.chunks_exact_mut(8);
        let mut i = pos / 8;
        for c in &mut chunks {
            c.copy_from_slice(&word(i));
            i += 1;
        }
        let tail = chunks.into_remainder();
        let w = word(i);
        let n = tail.len();
        tail.copy_from_slice(&w[..n]);
    }

    /// True when `data` (the fragment's payload, in pieces) is exactly what `fill` makes.
    /// Made and compared 4 KiB at a time, so the expected bytes never leave the L1 cache.
    pub fn verify<'a>(
        &self,
        event_id: u64,
        source_id: u16,
        pieces: impl Iterator<Item = &'a [u8]>,
    ) -> bool {
        let mut expected = [0u8; 4096];
        let mut offset = 0;
        for piece in pieces {
            for chunk in piece.chunks(expected.len()) {
                let want = &mut expected[..chunk.len()];
                self.fill(event_id, source_id, offset, want);
                if *want != *chunk {
                    return false;
                }
                offset += chunk.len();
            }
        }
        offset == self.size(event_id, source_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_the_same_whatever_the_split() {
        let g = Generator::new(SizeModel::Fixed(1000), 7);
        let mut whole = vec![0; 1000];
        g.fill(5, 2, 0, &mut whole);
        for split in [1, 3, 8, 13, 999] {
            let mut a = vec![0; split];
            let mut b = vec![0; 1000 - split];
            g.fill(5, 2, 0, &mut a);
            g.fill(5, 2, split, &mut b);
            assert_eq!([a, b].concat(), whole);
        }
        assert!(g.verify(5, 2, [&whole[..10], &whole[10..]].into_iter()));
        let mut bad = whole.clone();
        bad[500] ^= 1;
        assert!(!g.verify(5, 2, std::iter::once(&bad[..])));
        assert!(
            !g.verify(5, 3, std::iter::once(&whole[..])),
            "other source, same bytes"
        );
        assert!(
            !g.verify(5, 2, std::iter::once(&whole[..999])),
            "short accepted"
        );
    }

    #[test]
    fn verify_finds_any_wrong_byte_whatever_the_split() {
        let g = Generator::new(SizeModel::Fixed(61), 3);
        let mut whole = vec![0; 61];
        g.fill(9, 1, 0, &mut whole);
        for split in [0, 1, 5, 8, 13, 60, 61] {
            let (a, b) = whole.split_at(split);
            assert!(g.verify(9, 1, [a, b].into_iter()), "split {split}");
            for bad in 0..61 {
                let mut c = whole.clone();
                c[bad] ^= 0x40;
                let (a, b) = c.split_at(split);
                assert!(
                    !g.verify(9, 1, [a, b].into_iter()),
                    "split {split}, byte {bad}"
                );
            }
        }
        let mut long = whole.clone();
        long.push(0);
        assert!(!g.verify(9, 1, std::iter::once(&long[..])));
    }

    #[test]
    fn static_content_depends_on_the_source_only() {
        let sizes = SizeModel::LogNormal {
            mean: 100.0,
            stddev: 50.0,
            min: 100,
            max: 1000,
        };
        let g = Generator::new(sizes, 7).with_content(Content::Static);
        assert!(
            (0..100).any(|e| g.size(e, 2) != g.size(0, 2)),
            "sizes vary by event"
        );
        let (mut a, mut b, mut c) = (vec![0; 100], vec![0; 100], vec![0; 100]);
        g.fill(1, 2, 0, &mut a);
        g.fill(99, 2, 0, &mut b);
        g.fill(1, 3, 0, &mut c);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let g = Generator::new(SizeModel::Fixed(100), 7).with_content(Content::Static);
        assert!(g.verify(5, 2, std::iter::once(&a[..])));
        assert!(!g.verify(5, 3, std::iter::once(&a[..])));
        let unique = Generator::new(SizeModel::Fixed(100), 7);
        assert!(!unique.verify(5, 2, std::iter::once(&a[..])));
    }

    #[test]
    fn lognormal_sizes_are_deterministic_and_near_the_mean() {
        let g = Generator::new(
            SizeModel::LogNormal {
                mean: 2048.0,
                stddev: 2048.0,
                min: 8,
                max: 65536,
            },
            1,
        );
        let n = 20_000u64;
        let sum: usize = (0..n).map(|e| g.size(e, 0)).sum();
        let mean = sum as f64 / n as f64;
        assert!((mean - 2048.0).abs() < 100.0, "mean {mean}");
        assert_eq!(g.size(17, 3), g.size(17, 3));
        assert!((0..1000).any(|e| g.size(e, 0) != g.size(e, 1)));
    }
}

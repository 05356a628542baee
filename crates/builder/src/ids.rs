//! Hash maps keyed by event ids, connection ids and node references (the multiply-rotate
//! hash of `evb_buffers::small_keys`, shared with the transports and messaging), and the
//! ring of recently built ids.

pub type FastMap<K, V> = evb_buffers::small_keys::SmallKeyMap<K, V>;
pub type FastSet<K> = evb_buffers::small_keys::SmallKeySet<K>;
pub type IdMap<V> = FastMap<u64, V>;

/// A set of small indices (the RUs of an event, the events of an RU's run): the first 64 in
/// the value itself, the rest in a vector, so the common case allocates nothing and a record
/// holding it needs no second cache line.
#[derive(Debug, Default, Clone)]
pub(crate) struct Bits {
    low: u64,
    high: Vec<u64>,
}

impl Bits {
    /// `n` indices, every one set (whole words at once: an RU makes one per run).
    pub(crate) fn full(n: usize) -> Bits {
        let ones = |k: usize| if k >= 64 { !0 } else { (1u64 << k) - 1 };
        let high = n.saturating_sub(64);
        Bits {
            low: ones(n),
            high: (0..high.div_ceil(64))
                .map(|w| ones(high - 64 * w))
                .collect(),
        }
    }

    /// `n` indices, none set.
    pub(crate) fn reset(&mut self, n: usize) {
        self.low = 0;
        self.high.clear();
        self.high.resize(n.saturating_sub(64).div_ceil(64), 0);
    }

    /// Where index `i` lives: `None` for the inline word, else the vector's word; its mask.
    fn locate(i: usize) -> (Option<usize>, u64) {
        match i.checked_sub(64) {
            None => (None, 1 << i),
            Some(j) => (Some(j / 64), 1 << (j % 64)),
        }
    }

    fn word(&mut self, i: usize) -> (&mut u64, u64) {
        match Bits::locate(i) {
            (None, bit) => (&mut self.low, bit),
            (Some(w), bit) => (&mut self.high[w], bit),
        }
    }

    pub(crate) fn get(&self, i: usize) -> bool {
        match Bits::locate(i) {
            (None, bit) => self.low & bit != 0,
            (Some(w), bit) => self.high[w] & bit != 0,
        }
    }

    pub(crate) fn set(&mut self, i: usize) {
        let (w, bit) = self.word(i);
        *w |= bit;
    }

    /// Unsets `i`; whether it was set.
    pub(crate) fn clear(&mut self, i: usize) -> bool {
        let (w, bit) = self.word(i);
        let was = *w & bit != 0;
        *w &= !bit;
        was
    }
}

/// The event ids seen within a span behind the newest one: a ring of bits indexed by id.
///
/// A BU remembers the events it built to recognise late duplicates. Ids arrive nearly in
/// order, so a bitmap touches one cache line for many consecutive ids where a hash set of the
/// same ids misses the cache on every insert and removal (measured: 13 % of a small-event
/// run). Ids more than `span` behind the newest are forgotten.
#[derive(Debug, Clone)]
pub struct RecentIds {
    bits: Vec<u64>,
    /// One past the newest id inserted (0: none yet).
    end: u64,
}

impl RecentIds {
    /// Remembers ids up to `span` (rounded up to a power of two, at least 64) behind the newest.
    pub fn new(span: usize) -> RecentIds {
        let words = span.max(64).next_power_of_two() / 64;
        RecentIds {
            bits: vec![0; words],
            end: 0,
        }
    }

    fn span(&self) -> u64 {
        self.bits.len() as u64 * 64
    }

    fn slot(&self, id: u64) -> (usize, u64) {
        // the span is a power of two: a mask, not a division (a visible share of a BU's
        // filing at 256 B, twice per event)
        let i = id & (self.span() - 1);
        ((i / 64) as usize, 1 << (i % 64))
    }

    /// Whether `id` lies within the remembered span.
    fn in_span(&self, id: u64) -> bool {
        id < self.end && self.end - id <= self.span()
    }

    pub fn contains(&self, id: u64) -> bool {
        let (w, b) = self.slot(id);
        self.in_span(id) && self.bits[w] & b != 0
    }

    /// The remembered ids, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        (self.end.saturating_sub(self.span())..self.end).filter(|&id| self.contains(id))
    }

    /// Remembers `id`; false when it is too old to be remembered.
    pub fn insert(&mut self, id: u64) -> bool {
        if id == self.end {
            // the next id (a BU's releases mostly are): its bit only, once stale, now set
            let (w, b) = self.slot(id);
            self.bits[w] |= b;
            self.end = id + 1;
            return true;
        }
        if id > self.end {
            // Forget what the span no longer covers: the ids from the old end to `id`.
            let from = self.end.max((id + 1).saturating_sub(self.span()));
            if id + 1 - from >= self.span() {
                self.bits.fill(0);
            } else {
                for old in from..=id {
                    let (w, b) = self.slot(old);
                    self.bits[w] &= !b;
                }
            }
            self.end = id + 1;
        } else if !self.in_span(id) {
            return false;
        }
        let (w, b) = self.slot(id);
        self.bits[w] |= b;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::{Bits, RecentIds};
    use std::collections::BTreeSet;

    #[test]
    fn bits_cover_many_indices() {
        let mut h = Bits::default();
        for n in [1, 2, 63, 64, 65, 200] {
            h.reset(n);
            let set: Vec<usize> = (0..n).filter(|i| i % 3 != 1).collect();
            for &i in &set {
                h.set(i);
            }
            for i in 0..n {
                assert_eq!(h.get(i), set.contains(&i), "n {n} bit {i}");
            }
            let mut f = Bits::full(n);
            assert!((0..n).all(|i| f.get(i)), "full {n}");
            for &i in &set {
                assert!(f.clear(i));
                assert!(!f.clear(i), "cleared twice");
            }
            assert!((0..n).all(|i| f.get(i) != set.contains(&i)), "cleared {n}");
        }
    }
    #[test]
    fn recent_ids_agree_with_a_set_within_the_span() {
        let mut r = RecentIds::new(256);
        let mut all = BTreeSet::new();
        let mut x = 7u64;
        let mut newest = 0u64;
        for step in 0..20_000u64 {
            // mostly rising, sometimes back a little or a long way, sometimes a jump
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let id = match x >> 60 {
                0 => newest.saturating_sub(x % 300),
                1 => newest + 1000,
                _ => newest + (x >> 40) % 3,
            };
            newest = newest.max(id);
            let remembered = r.insert(id);
            assert_eq!(remembered, newest - id < 256, "step {step} id {id}");
            if remembered {
                all.insert(id);
            }
            for probe in newest.saturating_sub(300)..newest + 3 {
                let want = newest - probe.min(newest) < 256 && all.contains(&probe);
                assert_eq!(r.contains(probe), want, "step {step} probe {probe}");
            }
        }
    }
}

//! Maps keyed by small integers of our own (event ids, connection ids, mio tokens, node
//! references, tags a publisher chose), for every layer: hashed with a multiply-rotate step
//! instead of SipHash, which cost several percent of a small-event run and as much as
//! encoding a small message where a map is looked up per message. None of these keys comes
//! from a peer, so there is no hash flooding to defend against.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

const K: u64 = 0x9e37_79b9_7f4a_7c15;

#[derive(Default, Clone, Copy)]
pub struct SmallKeyHasher(u64);

impl SmallKeyHasher {
    fn add(&mut self, v: u64) {
        // Fibonacci hashing: consecutive ids spread over the table's top bits.
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(K);
    }
}

impl Hasher for SmallKeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.add(b as u64);
        }
    }

    fn write_u8(&mut self, v: u8) {
        self.add(v as u64)
    }

    fn write_u16(&mut self, v: u16) {
        self.add(v as u64)
    }

    fn write_u32(&mut self, v: u32) {
        self.add(v as u64)
    }

    fn write_u64(&mut self, v: u64) {
        self.add(v)
    }

    fn write_usize(&mut self, v: usize) {
        self.add(v as u64)
    }
}

pub type SmallKeyMap<K, V> = HashMap<K, V, BuildHasherDefault<SmallKeyHasher>>;
pub type SmallKeySet<K> = HashSet<K, BuildHasherDefault<SmallKeyHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_keys_spread() {
        let mut m: SmallKeyMap<u64, u64> = SmallKeyMap::default();
        for k in 0..10_000u64 {
            m.insert(k, k * 2);
        }
        assert!((0..10_000u64).all(|k| m[&k] == k * 2));
        // the hashes of consecutive keys differ in their top bits (hashbrown's control bytes)
        let top = |k: u64| {
            let mut h = SmallKeyHasher::default();
            h.write_u64(k);
            h.finish() >> 57
        };
        let distinct: SmallKeySet<u64> = (0..64).map(top).collect();
        assert!(distinct.len() > 32, "{}", distinct.len());
    }
}

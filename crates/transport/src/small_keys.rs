//! Maps keyed by small integers of our own (connection ids, mio tokens, tags a publisher
//! chose): hashed with one multiplication. They are looked up once or more per message, and
//! SipHash there costs as much as encoding a small message. None of these keys comes from a
//! peer, so there is no hash flooding to defend against.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default)]
pub struct SmallKeyHasher(u64);

impl Hasher for SmallKeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64)
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

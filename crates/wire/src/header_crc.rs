//! CRC32C of a fragment header's first 28 bytes, computed for every fragment sent and
//! received. The `crc32c` crate's general routine (alignment handling, three-way
//! interleaving for long inputs) costs twice what four CRC instructions do on so short an
//! input, and at millions of fragments a second that was a visible share of an RU.

/// Bytes covered: the fragment header up to its own CRC.
pub(crate) const COVERED: usize = 28;

/// CRC32C (Castagnoli) of 28 bytes given as three little-endian words and a 32-bit tail,
/// exactly as `crc32c::crc32c` of those bytes. The encoder and the decoder pass the words
/// they hold in registers: read back from the block just written (with stores of 2 to 8
/// bytes into memory not yet in the cache), each 8-byte read waited for those stores to
/// complete, a visible share of an RU's time.
#[inline]
pub(crate) fn crc32c_words(words: [u64; 3], tail: u32) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU was just checked for SSE4.2, the only feature `sse42` uses.
            return unsafe { sse42(words, tail) };
        }
    }
    portable(words, tail)
}

/// Without SSE4.2: the `crc32c` crate over the bytes.
fn portable(words: [u64; 3], tail: u32) -> u32 {
    let mut b = [0u8; COVERED];
    for (i, w) in words.iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    b[24..28].copy_from_slice(&tail.to_le_bytes());
    crc32c::crc32c(&b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn sse42(words: [u64; 3], tail: u32) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u32, _mm_crc32_u64};
    let mut c = u64::from(!0u32);
    for w in words {
        c = _mm_crc32_u64(c, w);
    }
    !_mm_crc32_u32(c as u32, tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Agrees with the general routine on every kind of input: zeros, ones, a walking bit
    /// and pseudo-random headers.
    #[test]
    fn agrees_with_the_crc32c_crate() {
        let mut inputs = vec![[0u8; COVERED], [0xff; COVERED]];
        for bit in 0..COVERED * 8 {
            let mut b = [0u8; COVERED];
            b[bit / 8] = 1 << (bit % 8);
            inputs.push(b);
        }
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..10_000 {
            let mut b = [0u8; COVERED];
            for byte in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *byte = x as u8;
            }
            inputs.push(b);
        }
        for b in &inputs {
            let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
            let tail = u32::from_le_bytes(b[24..28].try_into().unwrap());
            let words = [word(0), word(8), word(16)];
            assert_eq!(crc32c_words(words, tail), crc32c::crc32c(b), "{b:02x?}");
            // and the path for CPUs without SSE4.2
            assert_eq!(portable(words, tail), crc32c::crc32c(b), "{b:02x?}");
        }
    }
}

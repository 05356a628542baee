//! The FED CRC-16 (CRC-16/CMS: polynomial 0x8005, start 0xFFFF, not reflected), over each
//! 64-bit word in big-endian byte order, with the trailer's CRC field taken as zero.
//!
//! Read that way, a fragment is one long polynomial: its words, as little-endian integers,
//! concatenated first to last, bit 63 of the first word the highest power. Every stream-fed
//! RU checks every fragment and `evb feed` stamps every fragment it renumbers, so this runs
//! over every byte of the real pipeline twice; table-driven it was a sixth of the whole
//! pipeline's CPU. Where the CPU has carry-less multiplication (PCLMULQDQ), fragments of
//! 9 words or more are folded 16 bytes per multiply pair instead, several times faster;
//! shorter ones, and other CPUs, take the table route.

/// Bits 31–16 of the trailer: the CRC field, taken as zero.
const CRC_FIELD: u64 = 0xffff << 16;

use super::word;

/// The start value 0xFFFF, entered into the first word's top 16 bits (the same as a
/// register that starts at 0xFFFF).
const START: u64 = 0xffff << 48;

/// The CRC of `fragment`'s whole words (a partial last word is ignored); 0xFFFF for none.
#[allow(unsafe_code)] // the one call into the PCLMULQDQ route, after the CPU check
pub fn crc16(fragment: &[u8]) -> u16 {
    let words = fragment.len() / 8;
    if words == 0 {
        return 0xffff;
    }
    let fragment = &fragment[..words * 8];
    #[cfg(target_arch = "x86_64")]
    {
        if words >= clmul::MIN_WORDS && std::arch::is_x86_feature_detected!("pclmulqdq") {
            // SAFETY: the CPU was just checked for PCLMULQDQ, the only feature `fold`
            // enables beyond the SSE2 that every x86_64 CPU has.
            return unsafe { clmul::fold(fragment) };
        }
    }
    crc16_portable(fragment)
}

/// `x^k mod P(x)`, P = x^16 + x^15 + x^2 + 1 (bit i: the coefficient of x^i).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const fn x_pow_mod(k: u32) -> u64 {
    let mut r: u32 = 1;
    let mut i = 0;
    while i < k {
        r <<= 1;
        if r & 0x1_0000 != 0 {
            r ^= 0x1_8005;
        }
        i += 1;
    }
    r as u64
}

const fn crc16_table() -> [u16; 256] {
    let mut t = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = (i as u16) << 8;
        let mut k = 0;
        while k < 8 {
            c = if c & 0x8000 != 0 {
                (c << 1) ^ 0x8005
            } else {
                c << 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

/// Slicing-by-16 tables: `CRC16_SLICED[k][b]` is the CRC (zero start) of byte `b` followed
/// by `k` zero bytes. A CRC is linear, so two 8-byte words are 16 independent lookups XORed
/// together instead of 16 dependent ones.
const fn crc16_sliced() -> [[u16; 256]; 16] {
    let t0 = crc16_table();
    let mut t = [[0u16; 256]; 16];
    t[0] = t0;
    let mut k = 1;
    while k < 16 {
        let mut b = 0;
        while b < 256 {
            let prev = t[k - 1][b];
            t[k][b] = (prev << 8) ^ t0[(prev >> 8) as usize];
            b += 1;
        }
        k += 1;
    }
    t
}

static CRC16_SLICED: [[u16; 256]; 16] = crc16_sliced();

/// The zero-start CRC of word `w` (big-endian byte order) followed by `zeros` zero bytes
/// (0 or 8): `w(x) · x^(8·zeros + 16) mod P`, its eight bytes looked up in tables
/// `zeros..zeros + 8`, independently.
#[inline(always)]
fn sliced(w: u64, zeros: usize) -> u16 {
    let t = &CRC16_SLICED;
    (0..8).fold(0, |crc, i| {
        crc ^ t[zeros + i][((w >> (8 * i)) & 0xff) as usize]
    })
}

/// The table route, for any CPU: two words at a time up to the trailer, then the rest one at
/// a time; the running CRC enters the next word's top 16 bits.
pub(crate) fn crc16_portable(fragment: &[u8]) -> u16 {
    let n = fragment.len() / 8;
    if n == 0 {
        return 0xffff;
    }
    let start = |crc: u16| (crc as u64) << 48;
    let mut crc: u16 = 0xffff;
    let body = n - 1;
    let mut i = 0;
    while i + 2 <= body {
        crc = sliced(word(fragment, i) ^ start(crc), 8) ^ sliced(word(fragment, i + 1), 0);
        i += 2;
    }
    if i < body {
        crc = sliced(word(fragment, i) ^ start(crc), 0);
    }
    sliced((word(fragment, body) & !CRC_FIELD) ^ start(crc), 0)
}

/// The byte-wise CRC-16 both routes must equal (tests).
#[cfg(test)]
pub(crate) fn crc16_bytewise(fragment: &[u8]) -> u16 {
    let words = fragment.len() / 8;
    let mut crc: u16 = 0xffff;
    for w in 0..words {
        let mut word = word(fragment, w);
        if w == words - 1 {
            word &= !CRC_FIELD;
        }
        for b in word.to_be_bytes() {
            crc = (crc << 8) ^ CRC16_SLICED[0][((crc >> 8) as u8 ^ b) as usize];
        }
    }
    crc
}

/// Folding with carry-less multiplication. The fragment's polynomial M is kept reduced to
/// 128 bits V ≡ M (mod P) while it is read: appending 128 bits B makes V · x^128 + B, and
/// with V = H · x^64 + L that is H · (x^192 mod P) + L · (x^128 mod P) + B, two 64 × 16-bit
/// multiplies (79 bits each) and two XORs. Two such sums run side by side over alternate
/// 16-byte blocks (each then steps 256 bits) so that the multiplier's latency overlaps, and
/// are joined at the end. The CRC is V · x^16 mod P, which the tables give for V's halves.
#[cfg(target_arch = "x86_64")]
mod clmul {
    use std::arch::x86_64::{
        __m128i, _mm_clmulepi64_si128, _mm_cvtsi128_si64, _mm_set_epi64x, _mm_unpackhi_epi64,
        _mm_unpacklo_epi64, _mm_xor_si128,
    };

    use super::{sliced, x_pow_mod, CRC_FIELD, START};

    /// Below this many words the tables are as fast (measured: about equal at 6 words).
    pub(super) const MIN_WORDS: usize = 9;

    /// Low half x^128 mod P, high half x^192 mod P: one 128-bit step.
    const K128: i64 = x_pow_mod(128) as i64;
    const K192: i64 = x_pow_mod(192) as i64;
    /// x^256 and x^320 mod P: one 256-bit step of either of the two sums.
    const K256: i64 = x_pow_mod(256) as i64;
    const K320: i64 = x_pow_mod(320) as i64;

    /// 16 bytes as a 128-bit polynomial (the first word the higher half), `xor` entered into
    /// the first word.
    #[inline]
    #[target_feature(enable = "pclmulqdq")]
    fn block(b: &[u8], xor: u64) -> __m128i {
        let x = u128::from_le_bytes(b.try_into().expect("16 bytes"));
        _mm_set_epi64x((x as u64 ^ xor) as i64, (x >> 64) as u64 as i64)
    }

    /// `v · x^(128 or 256) + b` reduced to 128 bits, with `k` = (x^step, x^(step+64)) mod P.
    #[inline]
    #[target_feature(enable = "pclmulqdq")]
    fn step(v: __m128i, k: __m128i, b: __m128i) -> __m128i {
        let high = _mm_clmulepi64_si128::<0x11>(v, k);
        let low = _mm_clmulepi64_si128::<0x00>(v, k);
        _mm_xor_si128(_mm_xor_si128(high, low), b)
    }

    /// `v · x^64 + w` reduced to 128 bits (`k` as for a 128-bit step).
    #[inline]
    #[target_feature(enable = "pclmulqdq")]
    fn push_word(v: __m128i, k: __m128i, w: u64) -> __m128i {
        let high = _mm_clmulepi64_si128::<0x01>(v, k);
        _mm_xor_si128(high, _mm_unpacklo_epi64(_mm_set_epi64x(0, w as i64), v))
    }

    /// The CRC of `fragment`: whole words, at least [`MIN_WORDS`].
    #[target_feature(enable = "pclmulqdq")]
    pub(super) fn fold(fragment: &[u8]) -> u16 {
        let (body, trailer) = fragment.split_at(fragment.len() - 8);
        let trailer = u64::from_le_bytes(trailer.try_into().expect("8 bytes")) & !CRC_FIELD;
        let k1 = _mm_set_epi64x(K192, K128);
        let k2 = _mm_set_epi64x(K320, K256);
        // at least 8 body words: one 32-byte pair to start both sums
        let mut pairs = body.chunks_exact(32);
        let first = pairs.next().expect("9 words or more");
        let (mut a, mut b) = (block(&first[..16], START), block(&first[16..], 0));
        for p in pairs.by_ref() {
            a = step(a, k2, block(&p[..16], 0));
            b = step(b, k2, block(&p[16..], 0));
        }
        let mut v = step(a, k1, b);
        let rest = pairs.remainder();
        let mut words = rest.chunks_exact(16);
        for c in words.by_ref() {
            v = step(v, k1, block(c, 0));
        }
        if let Ok(w) = <[u8; 8]>::try_from(words.remainder()) {
            v = push_word(v, k1, u64::from_le_bytes(w));
        }
        v = push_word(v, k1, trailer);
        let high = _mm_cvtsi128_si64(_mm_unpackhi_epi64(v, v)) as u64;
        let low = _mm_cvtsi128_si64(v) as u64;
        sliced(high, 8) ^ sliced(low, 0)
    }
}

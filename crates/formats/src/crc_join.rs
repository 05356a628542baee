//! CRC32C of a concatenation from the CRC32Cs of its parts: `join(crc(A), crc(B), len(B))` is
//! `crc(AB)`, without reading a byte of A or B. A file writer that has each event body's CRC
//! (it is in the event header) keeps the file's running CRC this way instead of passing over
//! the body a second time.
//!
//! The arithmetic is in GF(2)[x] modulo the Castagnoli polynomial, bit-reflected as the CRC
//! is: appending n zero bytes multiplies the CRC by x^(8n), and x^(8n) is a product of the
//! precomputed x^(2^k) for the bits of 8n (at most 64 products of 32 steps each, well under a
//! microsecond; the `crc32c` crate's `crc32c_combine` squares 32×32 matrices instead, several
//! microseconds per call).

/// The Castagnoli polynomial, bit-reflected (x^0 in bit 31).
const POLY: u32 = 0x82F6_3B78;

/// `a * b` modulo the polynomial, both bit-reflected.
const fn mult_mod_p(a: u32, mut b: u32) -> u32 {
    let mut m = 1u32 << 31;
    let mut p = 0u32;
    loop {
        if a & m != 0 {
            p ^= b;
            if a & (m - 1) == 0 {
                return p;
            }
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
}

/// `X2K[k]` = x^(2^k) modulo the polynomial, for every bit of a 64-bit count of bits.
const X2K: [u32; 64] = {
    let mut t = [0u32; 64];
    let mut p = 1u32 << 30; // x^1
    let mut k = 0;
    while k < 64 {
        t[k] = p;
        p = mult_mod_p(p, p);
        k += 1;
    }
    t
};

/// x^(8 * len) modulo the polynomial: the operator that appends `len` zero bytes.
fn x_8n(len: u64) -> u32 {
    let mut p = 1u32 << 31; // x^0
    let (mut n, mut k) = (len, 3);
    while n != 0 {
        if n & 1 != 0 {
            p = mult_mod_p(X2K[k], p);
        }
        n >>= 1;
        k += 1;
    }
    p
}

/// The CRC32C of A followed by B, from `crc_a` = crc32c(A), `crc_b` = crc32c(B) and B's length.
pub fn crc32c_join(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    if len_b == 0 {
        return crc_a;
    }
    mult_mod_p(x_8n(len_b), crc_a) ^ crc_b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift64*), so a failure names its seed.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Random bytes cut at random places: the running CRC joined from each piece's own CRC
    /// is the CRC of the whole, read byte by byte, and the `crc32c` crate's combination agrees.
    #[test]
    fn joined_crc_is_the_plain_crc_on_random_splits() {
        for seed in 1..=200u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let len = rng.below(if seed % 10 == 0 { 3 << 20 } else { 70_000 });
            let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            let mut cuts: Vec<usize> = (0..rng.below(12)).map(|_| rng.below(len + 1)).collect();
            cuts.extend([0, len]);
            cuts.sort_unstable();
            let mut joined = 0u32;
            for w in cuts.windows(2) {
                let piece = &data[w[0]..w[1]];
                let crc = crc32c::crc32c(piece);
                assert_eq!(
                    crc32c_join(joined, crc, piece.len() as u64),
                    crc32c::crc32c_combine(joined, crc, piece.len()),
                    "seed {seed}: piece {}..{}",
                    w[0],
                    w[1]
                );
                joined = crc32c_join(joined, crc, piece.len() as u64);
            }
            assert_eq!(joined, crc32c::crc32c(&data), "seed {seed}, cuts {cuts:?}");
        }
    }

    /// Lengths at the edges of the table: powers of two, their neighbours, and lengths far
    /// beyond any file (the operator for 2^40 zero bytes, checked against the crate's).
    #[test]
    fn joined_crc_holds_at_every_bit_of_the_length() {
        let (a, b) = (crc32c::crc32c(b"evb"), crc32c::crc32c(b"event builder"));
        for k in 0..34u32 {
            for len in [(1u64 << k) - 1, 1u64 << k, (1u64 << k) + 1] {
                assert_eq!(
                    crc32c_join(a, b, len),
                    crc32c::crc32c_combine(a, b, len as usize),
                    "length {len}"
                );
            }
        }
        assert_eq!(crc32c_join(a, b, 0), a, "nothing appended");
        let zeros = vec![0u8; 4096];
        assert_eq!(
            crc32c_join(a, crc32c::crc32c(&zeros), 4096),
            crc32c::crc32c_append(a, &zeros)
        );
    }
}

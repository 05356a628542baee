//! Replays a fuzz target's checks on stable Rust, as a plain test: every input checked in
//! under `fuzz/seeds/<target>/` (valid inputs) and `fuzz/regressions/<target>/` (crashes
//! cargo-fuzz found, copied there from `fuzz/artifacts/` once fixed), any local
//! `fuzz/artifacts/<target>/` crash not yet copied, the target's seeds as code, and damaged
//! copies of those (bits
//! flipped, length fields rewritten, cut short, extended, tokens spliced in), so the checks
//! behind magic numbers and CRCs are reached. The full coverage-guided fuzzing needs nightly
//! and cargo-fuzz: `scripts/fuzz.sh`.
#![allow(dead_code)] // each including test uses what it needs

use std::path::PathBuf;

/// SplitMix64: deterministic, so a failing case can be named and rerun.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Text that configuration files and length fields find hard.
const TOKENS: &[&[u8]] = &[
    b"0",
    b"-1",
    b"1e20",
    b"nan",
    b"inf",
    b"-inf",
    b"4294967296",
    b"18446744073709551615",
    b"9223372036854775807",
    b"\n[[ru]]\nid = \"x\"\n",
    b"\n[[bu]]\nid = \"y\"\n",
    b"\xff\xff\xff\xff",
    b"\x00\x00\x00\x00",
];

/// Damages `b` in one to four ways.
pub fn mutate(rng: &mut Rng, b: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        match rng.below(7) {
            0 if !b.is_empty() => {
                let at = rng.below(b.len());
                b[at] ^= 1 << rng.below(8);
            }
            1 if b.len() >= 4 => {
                let at = rng.below(b.len() - 3);
                let v: u32 = match rng.below(5) {
                    0 => 0,
                    1 => u32::MAX,
                    2 => 1,
                    3 => rng.below(1 << 12) as u32,
                    _ => rng.next() as u32,
                };
                b[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
            2 => b.truncate(rng.below(b.len() + 1)),
            3 => b.extend((0..1 + rng.below(16)).map(|_| rng.next() as u8)),
            4 if !b.is_empty() => {
                let at = rng.below(b.len());
                b[at] = rng.next() as u8;
            }
            5 => {
                // replace a run of bytes with a token (a number in a configuration, a field)
                let t = TOKENS[rng.below(TOKENS.len())];
                let at = rng.below(b.len() + 1);
                let end = (at + rng.below(12)).min(b.len());
                b.splice(at..end, t.iter().copied());
            }
            _ if b.len() >= 2 => {
                // duplicate a slice (repeated records, messages, sections)
                let at = rng.below(b.len());
                let end = (at + 1 + rng.below(64)).min(b.len());
                let piece = b[at..end].to_vec();
                let to = rng.below(b.len() + 1);
                b.splice(to..to, piece);
            }
            _ => {}
        }
    }
}

/// The files under `fuzz/{seeds,regressions,artifacts}/<target>`, if any. (Not the grown
/// `fuzz/corpus/`, which is local and large.)
pub fn checked_in(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let fuzz = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut out = Vec::new();
    for dir in ["seeds", "regressions", "artifacts"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(target)) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_file() {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Runs `check` over the checked-in inputs, the seeds and `per_seed` damaged copies of each
/// seed; returns how many inputs were checked. A panic names the input that caused it.
///
/// With `EVB_FUZZ_WRITE_SEEDS=1` it first writes the seeds into `fuzz/seeds/<target>/` as
/// `seed-<k>`, where `scripts/fuzz.sh` starts cargo-fuzz from.
pub fn run(target: &str, check: fn(&[u8]), seeds: &[Vec<u8>], per_seed: usize) -> usize {
    if std::env::var_os("EVB_FUZZ_WRITE_SEEDS").is_some() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/seeds")
            .join(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (k, seed) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{k}")), seed).unwrap();
        }
    }
    let mut n = 0;
    for (path, data) in checked_in(target) {
        let r = std::panic::catch_unwind(|| check(&data));
        assert!(r.is_ok(), "{target}: {} fails the check", path.display());
        n += 1;
    }
    let mut rng = Rng(target.len() as u64 * 7919);
    for (s, seed) in seeds.iter().enumerate() {
        check(seed);
        n += 1;
        for k in 0..per_seed {
            let mut data = seed.clone();
            mutate(&mut rng, &mut data);
            let r = std::panic::catch_unwind(|| check(&data));
            assert!(
                r.is_ok(),
                "{target}: seed {s}, damaged copy {k} fails the check: {data:?}"
            );
            n += 1;
        }
    }
    n
}

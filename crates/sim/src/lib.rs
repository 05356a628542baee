//! `evb sim`: a slotted simulator of the switch in the middle of an event builder.
//!
//! N sources (RUs) and M destinations (BUs) share an N × M crossbar. In each time slot every
//! output port takes at most one fixed-size cell, and every input sends at most one. Inputs
//! are always busy (saturation): the figure of merit is the fraction of output slots used.
//! Two ways of feeding it:
//!
//! - [`Policy::RandomFifo`]: one FIFO queue per input, each cell for a uniformly random
//!   output. This is the classic input-queued switch. When two head-of-line cells want the
//!   same output, one waits and blocks the cells behind it, so throughput tends to
//!   2 − √2 ≈ 58.6 % for large N (seed 003, table VII).
//! - [`Policy::Barrel`]: the barrel shifter. Every RU keeps a queue per BU, and in slot t RU i
//!   sends to BU (i + t) mod M (with N > M, in the slots where that lands on a BU). No two RUs
//!   ever meet at one BU, so the outputs are used to the full.
//!
//! The simulator is deterministic for a given seed.

pub mod clos;
pub mod confidence;
pub mod eventbuilding;
pub mod offered;
pub mod plot;
pub mod solve;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    RandomFifo,
    Barrel,
}

impl Policy {
    pub const ALL: [Policy; 2] = [Policy::RandomFifo, Policy::Barrel];

    pub fn name(self) -> &'static str {
        match self {
            Policy::RandomFifo => "random-fifo",
            Policy::Barrel => "barrel",
        }
    }

    pub fn parse(s: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// One simulated point.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub policy: Policy,
    pub sources: usize,
    pub destinations: usize,
    pub slots: u64,
    /// Cells delivered / (slots × the smaller side): 1.0 is every link of the bottleneck
    /// side busy in every slot.
    pub efficiency: f64,
}

/// The barrel shifter's schedule, shared with the RUs' shaper (evb-builder).
pub use evb_builder::shaping::barrel_destination;

/// Simulates `slots` slots of an `n` × `m` switch under `policy`.
pub fn simulate(policy: Policy, n: usize, m: usize, slots: u64, seed: u64) -> Outcome {
    let mut rng = SmallRng::seed_from_u64(seed);
    let delivered = match policy {
        Policy::RandomFifo => random_fifo(n, m, slots, &mut rng),
        Policy::Barrel => barrel(n, m, slots),
    };
    let capacity = slots as f64 * n.min(m) as f64;
    Outcome {
        policy,
        sources: n,
        destinations: m,
        slots,
        efficiency: if capacity > 0.0 {
            delivered as f64 / capacity
        } else {
            0.0
        },
    }
}

/// Saturated FIFO inputs with uniformly random destinations: each output serves one of the
/// head-of-line cells that want it, chosen at random; the others wait.
fn random_fifo(n: usize, m: usize, slots: u64, rng: &mut SmallRng) -> u64 {
    let mut head: Vec<usize> = (0..n).map(|_| rng.gen_range(0..m)).collect();
    // per output: how many heads want it, and a reservoir-sampled winner
    let mut wanted = vec![0u32; m];
    let mut winner = vec![usize::MAX; m];
    let mut delivered = 0u64;
    for _ in 0..slots {
        wanted.iter_mut().for_each(|w| *w = 0);
        for (i, &d) in head.iter().enumerate() {
            wanted[d] += 1;
            if rng.gen_range(0..wanted[d]) == 0 {
                winner[d] = i;
            }
        }
        for d in 0..m {
            if wanted[d] > 0 {
                delivered += 1;
                head[winner[d]] = rng.gen_range(0..m);
            }
        }
    }
    delivered
}

/// The barrel shifter with saturated per-BU queues.
fn barrel(n: usize, m: usize, slots: u64) -> u64 {
    let mut taken = vec![false; m];
    let mut delivered = 0u64;
    for t in 0..slots {
        taken.iter_mut().for_each(|x| *x = false);
        for i in 0..n {
            if let Some(d) = barrel_destination(i, t, n, m) {
                // the schedule never puts two sources on one destination
                debug_assert!(!taken[d]);
                taken[d] = true;
                delivered += 1;
            }
        }
    }
    delivered
}

/// Seed 003, table VII: saturation throughput of an N × N input-queued switch with uniform
/// random traffic (N = ∞ is 2 − √2).
pub const TABLE_VII: [(usize, f64); 4] = [(1, 1.0), (2, 0.75), (4, 0.6553), (8, 0.6184)];

/// The large-N limit of [`Policy::RandomFifo`].
pub fn hol_limit() -> f64 {
    2.0 - std::f64::consts::SQRT_2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_barrel_never_puts_two_sources_on_one_destination_and_serves_every_pair_once_a_cycle() {
        for (n, m) in [(1, 1), (4, 4), (3, 5), (5, 3), (8, 2), (2, 8), (16, 16)] {
            let cycle = n.max(m) as u64;
            let mut served = vec![vec![0u32; m]; n];
            for t in 0..cycle {
                let mut seen = vec![false; m];
                for (i, row) in served.iter_mut().enumerate() {
                    if let Some(d) = barrel_destination(i, t, n, m) {
                        assert!(!seen[d], "{n}x{m}: two sources on {d} in slot {t}");
                        seen[d] = true;
                        row[d] += 1;
                    }
                }
                // the smaller side is busy in every slot
                assert_eq!(
                    seen.iter().filter(|s| **s).count(),
                    n.min(m),
                    "{n}x{m} slot {t}"
                );
            }
            assert!(
                served.iter().flatten().all(|&c| c == 1),
                "{n}x{m}: every pair once per cycle: {served:?}"
            );
        }
        assert_eq!(barrel_destination(0, 0, 0, 4), None);
    }

    #[test]
    fn random_fifo_matches_table_vii_and_the_limit() {
        for (n, want) in TABLE_VII {
            let got = simulate(Policy::RandomFifo, n, n, 200_000, 7).efficiency;
            assert!(
                (got - want).abs() < 0.005,
                "N = {n}: simulated {got:.4}, table VII {want}"
            );
        }
        let big = simulate(Policy::RandomFifo, 512, 512, 2_000, 7).efficiency;
        assert!(
            (big - hol_limit()).abs() < 0.005,
            "N = 512: {big:.4} against 2 - sqrt 2 = {:.4}",
            hol_limit()
        );
    }

    #[test]
    fn the_barrel_uses_every_link() {
        for (n, m) in [(4, 4), (8, 8), (3, 6), (6, 3)] {
            let b = simulate(Policy::Barrel, n, m, 10_000, 1).efficiency;
            assert!((b - 1.0).abs() < 1e-9, "{n}x{m} barrel {b}");
        }
    }

    #[test]
    fn runs_are_repeatable_for_a_seed() {
        let a = simulate(Policy::RandomFifo, 6, 6, 5_000, 42).efficiency;
        let b = simulate(Policy::RandomFifo, 6, 6, 5_000, 42).efficiency;
        assert_eq!(a, b);
    }
}

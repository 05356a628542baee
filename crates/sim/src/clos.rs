//! A folded Clos fabric (leaf and spine switches) in place of the crossbar: seed 003's
//! finding is that such a fabric blocks *internally* under event-building traffic unless
//! the traffic is scheduled, and that adaptive routing does not rescue it (destinations
//! change with every message).
//!
//! - **Fabric.** Leaves of `radix` ports: half go down to hosts, the other half (divided by
//!   the oversubscription) up, one to each spine. Host i is RU i and BU i (folded), or the
//!   M BUs are on leaves of their own after the RUs' (`bus`, seed 003's layout). A cell between
//!   hosts of one leaf crosses only that leaf; any other crosses an uplink, a spine and a
//!   downlink. Every link carries one cell per slot.
//! - **Cells cross in one slot or wait** (a bufferless, circuit-like fabric, as the seeds'
//!   wormhole switches): a source's head cell goes when its uplink, the spine's downlink to
//!   the destination's leaf and the destination's port are all free in that slot, the
//!   sources being served in a random order each slot; otherwise it waits, and blocks its
//!   FIFO (head-of-line).
//! - **Routing** picks the spine ([`Routing`]): `Static` by destination (d mod spines, as
//!   source routing tables do), `Random` per message, `Local` a spine whose uplink from this
//!   leaf is still free in this slot (what a leaf can see; the spine's downlink it cannot),
//!   `Pair` a spine drawn once per source and destination and kept (seed 003's Myrinet:
//!   source routes randomized per host pair, fixed for the run), `Ecmp` a hash per
//!   connection, and `Adaptive`, seed 003's adaptive dispersive routing: a route moves only
//!   when it is blocked, and only after about `settle` blocked messages.
//! - **Traffic** is saturated: [`crate::Policy::RandomFifo`] (each cell for a random BU) or
//!   [`crate::Policy::Barrel`] (in slot t RU i sends to BU (i + t) mod N).
//! - **Wormhole switching** ([`ClosModel::run_wormhole`], `evb sim --model clos --wormhole
//!   L`; off by default): the unit is a worm (a packet) of L cells, all for one BU. Its
//!   head takes the links of its path in order (the uplink, the spine's downlink, the
//!   destination's port; only the port within one leaf), each as soon as it is free, as
//!   many in one slot as are free (a switch's latency is far below a cell's time), and
//!   *holds* every link it has taken while it waits for the next one. Once the head holds
//!   the port the worm streams: its L cells arrive in L slots, and its tail frees all its
//!   links at once (hop latency neglected). A source sends one worm at a time, its FIFO's
//!   head; contenders for a link freed are served in the slot's random order, as above. The
//!   route of a worm is fixed when it starts (`Random`: drawn per worm; `Local`: the free
//!   uplink its head finds); `Adaptive` moves a pair's route for its later worms. The
//!   barrel shifter sends worms in periods of L slots (RU i to BU (i + p) mod N in period
//!   p), a worm late for its period starting when its path frees. With L = 1 on one leaf
//!   this is the model above; across a spine even L = 1 differs, as a blocked head keeps
//!   its uplink into the next slot.

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::{barrel_destination, Policy};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Routing {
    /// By destination: spine d mod S, as source-routing tables do.
    Static,
    /// A spine drawn for every message.
    Random,
    /// A spine whose uplink from this leaf is still free in this slot: a leaf's own view,
    /// taken at once (the spine's downlink it cannot see).
    Local,
    /// Seed 003's Myrinet routes: a spine drawn once per source and destination host and
    /// kept for the run.
    Pair,
    /// An Ethernet fabric's ECMP: a hash of the connection picks the spine for its whole
    /// life. A connection is a host pair here, so it blocks as `Pair` does (another hash).
    Ecmp,
    /// Seed 003's adaptive dispersive routing (Myrinet Express): every pair starts on a
    /// route drawn as `Pair`; a message blocked inside the fabric moves its pair's route
    /// with chance 1/`settle` (so a route is seen blocked over about `settle` messages
    /// before it moves), to the least used uplink of its leaf. Repetitive traffic settles
    /// on a conflict-free set within a few `settle` periods; event building's traffic,
    /// whose destinations change with every message, does not.
    Adaptive,
}

impl Routing {
    pub const ALL: [Routing; 6] = [
        Routing::Static,
        Routing::Random,
        Routing::Local,
        Routing::Pair,
        Routing::Ecmp,
        Routing::Adaptive,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Routing::Static => "static",
            Routing::Random => "random",
            Routing::Local => "local",
            Routing::Pair => "pair",
            Routing::Ecmp => "ecmp",
            Routing::Adaptive => "adaptive",
        }
    }

    pub fn parse(s: &str) -> Option<Routing> {
        Routing::ALL.into_iter().find(|r| r.name() == s)
    }
}

/// [`Routing::Adaptive`]: a blocked route moves after about this many blocked messages
/// (seed 003: routes must stay stable for "O(1000) consecutive messages").
pub const SETTLE: u32 = 1000;

/// A leaf-and-spine fabric's shape: which leaf each RU and BU hangs from, and how many
/// spines. Every link carries one cell per slot; a cell crosses in one slot when its
/// uplink and the spine's downlink are free, or waits (a bufferless fabric, as the seeds'
/// wormhole switches).
#[derive(Debug, Clone)]
pub struct Fabric {
    /// Hosts per leaf (half its ports).
    pub down: usize,
    pub spines: usize,
    pub leaves: usize,
    /// The first BU leaf: 0 when folded (host k is RU k and BU k), else after the RUs'.
    bu_leaf0: Option<usize>,
}

impl Fabric {
    /// `rus` RUs and `bus` BUs under leaves of `radix` ports; `apart`: the BUs on leaves
    /// of their own (seed 003's layout), else folded (RU k and BU k on host k).
    pub fn new(rus: usize, bus: usize, radix: usize, oversubscription: usize, apart: bool) -> Self {
        let down = (radix / 2).max(1);
        let spines = (down / oversubscription.max(1)).max(1);
        let ru_leaves = rus.max(1).div_ceil(down);
        let (leaves, bu_leaf0) = if apart {
            (ru_leaves + bus.max(1).div_ceil(down), Some(ru_leaves))
        } else {
            (ru_leaves.max(bus.max(1).div_ceil(down)), None)
        };
        Fabric {
            down,
            spines,
            leaves,
            bu_leaf0,
        }
    }

    pub fn ru_leaf(&self, i: usize) -> usize {
        i / self.down
    }

    pub fn bu_leaf(&self, d: usize) -> usize {
        self.bu_leaf0.unwrap_or(0) + d / self.down
    }
}

/// The links claimed in one slot, and the routing that picks a spine.
pub struct Crossing {
    pub fabric: Fabric,
    routing: Routing,
    seed: u64,
    up: Vec<bool>,
    dn: Vec<bool>,
    /// `Adaptive`: per pair (RU × BUs + BU), its spine.
    route: Vec<u32>,
    settle: u32,
    bus: usize,
    /// `Adaptive`: cells each uplink carried in this period of `settle` slots, and in the
    /// last one (what a host's NIC learns of its leaf's uplinks: a moved route goes to the
    /// least used).
    used: Vec<u32>,
    used_before: Vec<u32>,
    slot: u64,
    /// Route changes made (`Adaptive`).
    pub changes: u64,
}

impl Crossing {
    pub fn new(
        fabric: Fabric,
        routing: Routing,
        rus: usize,
        bus: usize,
        settle: u32,
        seed: u64,
    ) -> Self {
        let (l, s) = (fabric.leaves, fabric.spines);
        let pairs = if routing == Routing::Adaptive {
            rus * bus
        } else {
            0
        };
        let route = (0..pairs)
            .map(|p| pair_spine(p / bus.max(1), p % bus.max(1), seed, s) as u32)
            .collect();
        Crossing {
            fabric,
            routing,
            seed,
            up: vec![false; l * s],
            dn: vec![false; s * l],
            route,
            settle: settle.max(1),
            bus,
            used: vec![0; l * s],
            used_before: vec![0; l * s],
            slot: 0,
            changes: 0,
        }
    }

    /// A new slot: every link free.
    pub fn clear(&mut self) {
        self.up.iter_mut().for_each(|x| *x = false);
        self.dn.iter_mut().for_each(|x| *x = false);
        self.tick();
    }

    /// A new slot, the links kept as they are (wormhole: held across slots).
    fn tick(&mut self) {
        self.slot += 1;
        if self.routing == Routing::Adaptive && self.slot.is_multiple_of(self.settle as u64) {
            std::mem::swap(&mut self.used, &mut self.used_before);
            self.used.iter_mut().for_each(|x| *x = 0);
        }
    }

    /// Claims the path of a cell from RU `i` to BU `d` in this slot, if its route's links
    /// are free: `true`, the cell crosses; `false`, it waits (blocked inside the fabric).
    pub fn cross(&mut self, i: usize, d: usize, rng: &mut SmallRng) -> bool {
        let (ls, ld) = (self.fabric.ru_leaf(i), self.fabric.bu_leaf(d));
        if ls == ld {
            return true;
        }
        let (spines, leaves) = (self.fabric.spines, self.fabric.leaves);
        let Some(spine) = self.spine(i, d, rng) else {
            return false;
        };
        let free = !self.up[ls * spines + spine] && !self.dn[spine * leaves + ld];
        if free {
            self.up[ls * spines + spine] = true;
            self.dn[spine * leaves + ld] = true;
        }
        if self.routing == Routing::Adaptive {
            self.used[ls * spines + spine] += u32::from(free);
            if !free {
                self.blocked(i, d, spine, rng);
            }
        }
        free
    }

    /// The spine of a cell (or worm) from RU `i` to BU `d` on another leaf, by the routing;
    /// `None`: `Local` found no uplink of the leaf free.
    fn spine(&mut self, i: usize, d: usize, rng: &mut SmallRng) -> Option<usize> {
        let spines = self.fabric.spines;
        let ls = self.fabric.ru_leaf(i);
        Some(match self.routing {
            Routing::Static => d % spines,
            Routing::Random => rng.gen_range(0..spines),
            Routing::Pair => pair_spine(i, d, self.seed, spines),
            Routing::Ecmp => pair_spine(i, d, self.seed ^ 0xEC3F_0000_0000_0001, spines),
            Routing::Adaptive => self.route[i * self.bus + d] as usize,
            Routing::Local => {
                let k = rng.gen_range(0..spines);
                (0..spines)
                    .map(|j| (k + j) % spines)
                    .find(|&p| !self.up[ls * spines + p])?
            }
        })
    }

    /// `Adaptive`: the route of (`i`, `d`) through `spine` was blocked inside the fabric.
    fn blocked(&mut self, i: usize, d: usize, spine: usize, rng: &mut SmallRng) {
        let spines = self.fabric.spines;
        let ls = self.fabric.ru_leaf(i);
        // a blocked route moves with chance 1/settle: it is seen blocked over about
        // `settle` messages first, and of two routes in conflict one moves first
        if spines > 1 && rng.gen_range(0..self.settle) == 0 {
            // to the uplink least used over this period and the last, ties drawn;
            // the move counts as a period's use at once, so the next route to move
            // in this period goes elsewhere
            let k = rng.gen_range(0..spines);
            let base = ls * spines;
            if let Some(q) = (0..spines)
                .map(|j| (k + j) % spines)
                .filter(|&q| q != spine)
                .min_by_key(|&q| self.used[base + q] + self.used_before[base + q])
            {
                self.route[i * self.bus + d] = q as u32;
                self.used[base + q] += self.settle;
                self.changes += 1;
            }
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ClosModel {
    /// Hosts (each an RU and a BU), or the RUs when the BUs are apart (`bus`).
    pub hosts: usize,
    /// The BUs on leaves of their own, apart from the RUs' (seed 003's layout): `None`, the
    /// fabric is folded (host i is RU i and BU i).
    pub bus: Option<usize>,
    /// Ports per leaf switch: half down to hosts, half (over `oversubscription`) up.
    pub radix: usize,
    /// Host ports per uplink of a leaf (1: full bisection).
    pub oversubscription: usize,
    pub routing: Routing,
    /// `Adaptive`: a blocked route moves with chance 1/`settle` per blocked message.
    pub settle: u32,
    pub policy: Policy,
    /// Every source sends to one destination for the whole run (host s to s + M/2): the
    /// repetitive traffic adaptive routing is made for, not event building's.
    pub repeat: bool,
    pub slots: u64,
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClosOutcome {
    pub model: ClosModel,
    pub leaves: usize,
    pub spines: usize,
    /// Cells delivered / (slots × the smaller side: hosts, or min(RUs, BUs)).
    pub efficiency: f64,
    /// Route changes (`Adaptive`).
    pub route_changes: u64,
    /// Wormhole switching's worm length in cells ([`ClosModel::run_wormhole`]); absent
    /// when cells cross in one slot or wait, holding nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wormhole: Option<u32>,
}

/// A worm under way: its BU, its spine once chosen, how many links of its path its head
/// holds, and, once it streams, the slot in which its tail has passed and its links free.
#[derive(Clone, Copy)]
struct Worm {
    d: usize,
    spine: Option<usize>,
    taken: usize,
    end: Option<u64>,
}

/// What a run of the model starts from ([`ClosModel::start`]).
struct Start {
    n: usize,
    m: usize,
    leaves: usize,
    spines: usize,
    crossing: Crossing,
    rng: SmallRng,
    head: Vec<usize>,
    order: Vec<usize>,
}

impl ClosModel {
    /// What both runs start from: the sources and destinations, the fabric's crossing, the
    /// generator and each source's head-of-line destination (drawn first, in the same
    /// order, so that the two runs see the same traffic), and the service order.
    fn start(&self) -> Start {
        let n = self.hosts.max(1);
        // destinations: the same hosts (folded), or M BUs on leaves after the RUs'
        let m = self.bus.map_or(n, |m| m.max(1));
        let fabric = Fabric::new(n, m, self.radix, self.oversubscription, self.bus.is_some());
        let (leaves, spines) = (fabric.leaves, fabric.spines);
        let crossing = Crossing::new(fabric, self.routing, n, m, self.settle, self.seed);
        let mut rng = SmallRng::seed_from_u64(self.seed);
        // RandomFifo: each source's head-of-line destination
        let head: Vec<usize> = (0..n).map(|_| rng.gen_range(0..m)).collect();
        let order: Vec<usize> = (0..n).collect();
        Start {
            n,
            m,
            leaves,
            spines,
            crossing,
            rng,
            head,
            order,
        }
    }

    /// The outcome of a run that delivered `delivered` cells.
    fn outcome(
        &self,
        n: usize,
        m: usize,
        (leaves, spines): (usize, usize),
        delivered: u64,
        changes: u64,
        wormhole: Option<u32>,
    ) -> ClosOutcome {
        ClosOutcome {
            model: self.clone(),
            leaves,
            spines,
            efficiency: delivered as f64 / (self.slots.max(1) as f64 * n.min(m) as f64),
            route_changes: changes,
            wormhole,
        }
    }

    pub fn run(&self) -> ClosOutcome {
        let Start {
            n,
            m,
            leaves,
            spines,
            mut crossing,
            mut rng,
            mut head,
            mut order,
        } = self.start();
        let mut port = vec![false; m];
        let mut delivered = 0u64;
        for t in 0..self.slots {
            crossing.clear();
            port.iter_mut().for_each(|x| *x = false);
            order.shuffle(&mut rng);
            for &s in &order {
                let d = match self.policy {
                    _ if self.repeat => (s + m / 2) % m,
                    Policy::RandomFifo => head[s],
                    Policy::Barrel => match barrel_destination(s, t, n, m) {
                        Some(d) => d,
                        None => continue,
                    },
                };
                if port[d] || !crossing.cross(s, d, &mut rng) {
                    continue;
                }
                port[d] = true;
                delivered += 1;
                if self.policy == Policy::RandomFifo {
                    head[s] = rng.gen_range(0..m);
                }
            }
        }
        self.outcome(n, m, (leaves, spines), delivered, crossing.changes, None)
    }

    /// The same fabric and traffic under wormhole switching (the module's doc): worms of
    /// `cells` cells (at least 1) whose heads hold the links they have taken while they
    /// wait for the next.
    pub fn run_wormhole(&self, cells: u32) -> ClosOutcome {
        let len = u64::from(cells.max(1));
        // drawn as `run` draws them: with one cell per worm on one leaf, the same figures
        let Start {
            n,
            m,
            leaves,
            spines,
            crossing: mut x,
            mut rng,
            mut head,
            mut order,
        } = self.start();
        // the links held across slots: uplinks and downlinks in the crossing's, ports here
        let mut port = vec![false; m];
        let mut worm: Vec<Option<Worm>> = vec![None; n];
        let mut delivered = 0u64;
        for t in 0..self.slots {
            x.tick();
            // the tails that have passed free their paths
            for (s, slot) in worm.iter_mut().enumerate() {
                let Some(w) = *slot else { continue };
                if w.end != Some(t) {
                    continue;
                }
                port[w.d] = false;
                if let Some(p) = w.spine {
                    x.up[x.fabric.ru_leaf(s) * spines + p] = false;
                    x.dn[p * leaves + x.fabric.bu_leaf(w.d)] = false;
                }
                *slot = None;
            }
            order.shuffle(&mut rng);
            for &s in &order {
                let mut w = match worm[s] {
                    Some(w) if w.end.is_some() => continue,
                    Some(w) => w,
                    None => {
                        let d = match self.policy {
                            _ if self.repeat => Some((s + m / 2) % m),
                            Policy::RandomFifo => Some(head[s]),
                            Policy::Barrel if t % len == 0 => barrel_destination(s, t / len, n, m),
                            Policy::Barrel => None,
                        };
                        let Some(d) = d else { continue };
                        let (ls, ld) = (x.fabric.ru_leaf(s), x.fabric.bu_leaf(d));
                        // within one leaf only the port; `Local` picks its uplink when
                        // the head reaches it, the others when the worm starts
                        let (spine, taken) = if ls == ld {
                            (None, 2)
                        } else if self.routing == Routing::Local {
                            (None, 0)
                        } else {
                            (x.spine(s, d, &mut rng), 0)
                        };
                        Worm {
                            d,
                            spine,
                            taken,
                            end: None,
                        }
                    }
                };
                let (ls, ld) = (x.fabric.ru_leaf(s), x.fabric.bu_leaf(w.d));
                // the head moves on, hop by hop, while the next link is free
                while w.taken < 3 {
                    let free = match w.taken {
                        0 => match w.spine.or_else(|| x.spine(s, w.d, &mut rng)) {
                            Some(p) if !x.up[ls * spines + p] => {
                                x.up[ls * spines + p] = true;
                                if self.routing == Routing::Adaptive {
                                    x.used[ls * spines + p] += cells.max(1);
                                }
                                w.spine = Some(p);
                                true
                            }
                            p => {
                                if let (Some(p), Routing::Adaptive) = (p, self.routing) {
                                    x.blocked(s, w.d, p, &mut rng);
                                }
                                false
                            }
                        },
                        1 => {
                            let p = w.spine.unwrap_or(0);
                            let free = !x.dn[p * leaves + ld];
                            if free {
                                x.dn[p * leaves + ld] = true;
                            } else if self.routing == Routing::Adaptive {
                                x.blocked(s, w.d, p, &mut rng);
                            }
                            free
                        }
                        _ => {
                            let free = !port[w.d];
                            port[w.d] = true;
                            free
                        }
                    };
                    if !free {
                        break;
                    }
                    w.taken += 1;
                }
                if w.taken == 3 {
                    // the head is in: the worm streams, its tail passes in `len` slots
                    w.end = Some(t + len);
                    delivered += len.min(self.slots - t);
                    if self.policy == Policy::RandomFifo {
                        head[s] = rng.gen_range(0..m);
                    }
                }
                worm[s] = Some(w);
            }
        }
        self.outcome(
            n,
            m,
            (leaves, spines),
            delivered,
            x.changes,
            Some(cells.max(1)),
        )
    }
}

/// The spine of the pair (`s`, `d`) under `Routing::Pair`: a hash of the pair and the seed
/// (splitmix64), the same for every cell of the run.
fn pair_spine(s: usize, d: usize, seed: u64, spines: usize) -> usize {
    let mut z = seed ^ ((s as u64) << 32 | d as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z % spines as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(hosts: usize, routing: Routing, policy: Policy) -> ClosModel {
        ClosModel {
            hosts,
            bus: None,
            radix: 16,
            oversubscription: 1,
            routing,
            settle: SETTLE,
            policy,
            repeat: false,
            slots: 4_000,
            seed: 5,
        }
    }

    #[test]
    fn one_leaf_is_the_crossbar() {
        // 8 hosts on one 16-port leaf: no spine is crossed, random FIFO is table VII's 8 x 8
        let o = model(8, Routing::Static, Policy::RandomFifo).run();
        assert_eq!(o.leaves, 1);
        assert!((o.efficiency - 0.6184).abs() < 0.01, "{o:?}");
        let b = model(8, Routing::Random, Policy::Barrel).run();
        assert!((b.efficiency - 1.0).abs() < 1e-9, "{b:?}");
    }

    #[test]
    fn seed_003s_ordering_holds_on_a_clos() {
        // scheduled traffic with static routing is conflict-free; random routing blocks it
        // internally; unscheduled traffic loses more than on a crossbar, and adaptive
        // routing does not give it back
        let n = 64;
        let barrel_static = model(n, Routing::Static, Policy::Barrel).run().efficiency;
        let barrel_random = model(n, Routing::Random, Policy::Barrel).run().efficiency;
        let fifo: Vec<f64> = Routing::ALL
            .iter()
            .map(|&r| model(n, r, Policy::RandomFifo).run().efficiency)
            .collect();
        let crossbar = crate::simulate(Policy::RandomFifo, n, n, 4_000, 5).efficiency;
        assert!((barrel_static - 1.0).abs() < 1e-9, "{barrel_static}");
        assert!(barrel_random < 0.9, "{barrel_random}");
        for (r, e) in Routing::ALL.iter().zip(&fifo) {
            assert!(
                *e < crossbar - 0.02,
                "{r:?}: {e} against the crossbar's {crossbar}"
            );
        }
        assert!(fifo.iter().all(|&e| e < barrel_random), "{fifo:?}");
    }

    #[test]
    fn a_spine_fixed_per_pair_blocks_as_one_drawn_per_message() {
        // seed 003's randomized source routes: the same spine for every cell of a pair,
        // which a blocked cell cannot escape by drawing again; at N = 64 it is within a
        // point of random routing, for the barrel shifter and for random traffic alike
        for policy in [Policy::Barrel, Policy::RandomFifo] {
            let pair = model(64, Routing::Pair, policy).run().efficiency;
            let random = model(64, Routing::Random, policy).run().efficiency;
            assert!(
                (pair - random).abs() < 0.015,
                "{policy:?}: {pair} against {random}"
            );
            assert!(pair < 0.8, "{policy:?}: {pair}");
        }
        // fixed: the same pair, the same spine; the spines all in use
        assert_eq!(pair_spine(3, 40, 5, 8), pair_spine(3, 40, 5, 8));
        let used: std::collections::BTreeSet<usize> =
            (0..64).map(|d| pair_spine(0, d, 5, 8)).collect();
        assert_eq!(used.len(), 8);
    }

    #[test]
    fn rus_and_bus_on_leaves_of_their_own() {
        // seed 003's layout: every cell crosses a spine. The barrel shifter with static
        // routing stays conflict-free (the slot's destinations are consecutive: distinct
        // spines, and one destination per spine and leaf); random routing blocks it
        let apart = |routing, policy, m| {
            ClosModel {
                bus: Some(m),
                ..model(64, routing, policy)
            }
            .run()
        };
        let b = apart(Routing::Static, Policy::Barrel, 64);
        assert_eq!(b.leaves, 16);
        assert!((b.efficiency - 1.0).abs() < 1e-9, "{b:?}");
        let r = apart(Routing::Random, Policy::Barrel, 64).efficiency;
        assert!(r < 0.8, "{r}");
        // N ≠ M: measured against the smaller side (32 BUs, each busy all the time)
        let fewer = apart(Routing::Static, Policy::Barrel, 32);
        assert!((fewer.efficiency - 1.0).abs() < 1e-9, "{fewer:?}");
        // random traffic with nothing on a leaf of its own blocks more than folded
        let folded = model(64, Routing::Static, Policy::RandomFifo)
            .run()
            .efficiency;
        let f = apart(Routing::Static, Policy::RandomFifo, 64).efficiency;
        assert!(f <= folded + 0.01, "{f} against folded {folded}");
    }

    #[test]
    fn oversubscribed_uplinks_cap_what_crosses_the_spines() {
        let over = ClosModel {
            oversubscription: 2,
            ..model(64, Routing::Static, Policy::Barrel)
        }
        .run();
        assert_eq!(over.spines, 4);
        // 7/8 of the traffic leaves its leaf through half the bandwidth
        assert!(over.efficiency < 0.6, "{over:?}");
    }

    #[test]
    fn adaptive_routing_settles_on_repetitive_traffic_and_not_on_event_building() {
        // seed 003: a route changes only when blocking is seen over a stable run of
        // messages. With every source sending to one destination, the pairs' routes
        // settle on a conflict-free set; with event building's ever-changing
        // destinations a pair is tried too rarely to learn, and the fabric stays as
        // blocked as with routes drawn per pair
        let n = 64;
        let run = |routing, policy, repeat, settle| {
            ClosModel {
                repeat,
                settle,
                slots: 20_000,
                ..model(n, routing, policy)
            }
            .run()
        };
        let pair = run(Routing::Pair, Policy::Barrel, true, 100);
        let adaptive = run(Routing::Adaptive, Policy::Barrel, true, 100);
        assert!(pair.efficiency < 0.85, "{pair:?}");
        assert!(adaptive.efficiency > 0.97, "{adaptive:?}");
        assert!(adaptive.route_changes > 0);
        for policy in [Policy::Barrel, Policy::RandomFifo] {
            let pair = run(Routing::Pair, policy, false, SETTLE).efficiency;
            let a = run(Routing::Adaptive, policy, false, SETTLE);
            assert!(
                (a.efficiency - pair).abs() < 0.02,
                "{policy:?}: adaptive {a:?} against pair {pair}"
            );
            let fixed = run(Routing::Static, policy, false, SETTLE).efficiency;
            assert!(
                a.efficiency + 0.03 < fixed,
                "{policy:?}: {a:?} against static {fixed}"
            );
        }
    }

    #[test]
    fn a_waiting_worm_holds_the_links_it_has_taken() {
        // seed 003's 7 x 7: the RUs on one 16-port leaf, the BUs on another, 8 spines
        let seven = |routing| ClosModel {
            bus: Some(7),
            slots: 20_000,
            ..model(7, routing, Policy::RandomFifo)
        };
        // routes per pair share spines among BUs: a worm waiting for its BU's port holds
        // an uplink and a downlink that another RU's worm for a free BU needs
        let pair = seven(Routing::Pair);
        let (cells, worms) = (pair.run().efficiency, pair.run_wormhole(1).efficiency);
        assert!(worms < cells - 0.03, "held {worms} against {cells}");
        // worms all of one length all start in slot 0: their length only scales time
        let long = pair.run_wormhole(4);
        assert_eq!(long.wormhole, Some(4));
        assert!(
            (long.efficiency - worms).abs() < 0.02,
            "{long:?} against {worms}"
        );
        // routes by destination give each BU a spine of its own: what a waiting worm holds
        // no other BU's worm needs, and holding changes nothing, to the cell
        let fixed = seven(Routing::Static);
        assert_eq!(fixed.run_wormhole(1).efficiency, fixed.run().efficiency);
        // on one leaf the path is the port alone: worms of one cell are the model's cells
        let one = model(8, Routing::Pair, Policy::RandomFifo);
        let (o, w) = (one.run(), one.run_wormhole(1));
        assert_eq!((o.leaves, w.wormhole, o.wormhole), (1, Some(1), None));
        assert_eq!(w.efficiency, o.efficiency);
        // the barrel shifter's worms go in periods of L slots: conflict-free with routes
        // by destination, folded or apart
        for m in [None, Some(64)] {
            let b = ClosModel {
                bus: m,
                ..model(64, Routing::Static, Policy::Barrel)
            };
            let w = b.run_wormhole(4).efficiency;
            assert!((w - 1.0).abs() < 1e-9, "{m:?}: {w}");
        }
    }

    #[test]
    fn ecmp_is_one_spine_per_connection() {
        // a connection is a host pair here: ECMP blocks as routes drawn per pair do
        for policy in [Policy::Barrel, Policy::RandomFifo] {
            let ecmp = model(64, Routing::Ecmp, policy).run().efficiency;
            let pair = model(64, Routing::Pair, policy).run().efficiency;
            assert!(
                (ecmp - pair).abs() < 0.015,
                "{policy:?}: {ecmp} against {pair}"
            );
        }
    }
}

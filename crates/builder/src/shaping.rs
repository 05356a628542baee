//! Traffic shaping in the RUs: the barrel shifter (seeds 001 and 003). Time is cut into
//! slots of a fixed length on the wall clock, which every node of the run shares (one host,
//! or hosts kept in step by NTP/PTP); in slot t RU i sends only to BU (i + t) mod max(N, M),
//! at most one slot's worth of bytes, never more (a run of fragments that would not fit in
//! what is left of the slot waits for the BU's next slot). No two RUs then send to one BU in the same slot, so no
//! switch output port has two inputs to queue, and every RU–BU pair is served once a cycle.
//! More RUs than BUs, or fewer (trapezoidal), works: the cycle is max(N, M) slots long and
//! a slot that falls on no BU (or no RU) is idle. No IO here: the driver pushes fragments
//! and takes what is due.

use std::collections::VecDeque;
use std::time::Duration;

use evb_buffers::Chain;

/// The BU that RU `i` of `n` sends to in slot `t` (with `m` BUs), if any: BU (i + t) mod M
/// when N ≤ M; with more RUs than BUs the cycle is N slots long and RU i sends when
/// (i + t) mod N falls on a BU.
pub fn barrel_destination(i: usize, t: u64, n: usize, m: usize) -> Option<usize> {
    if n == 0 || m == 0 || i >= n {
        return None;
    }
    let cycle = n.max(m) as u64;
    let d = ((i as u64 + t) % cycle) as usize;
    (d < m).then_some(d)
}

/// Folded (RU k and BU k on host k), N × N: the BU that RU `i` sends to in slot `t` of a
/// cycle of N − 1 slots, never its own, whose fragments stay in the host and need no slot:
/// BU (i + 1 + t mod (N − 1)) mod N. For each t every RU adds the same offset, so the slot's
/// destinations are still a permutation.
pub fn folded_barrel_destination(i: usize, t: u64, n: usize) -> Option<usize> {
    if n < 2 || i >= n {
        return None;
    }
    let offset = 1 + (t % (n as u64 - 1)) as usize;
    Some((i + offset) % n)
}

/// How well an RU kept its slots: each slot in which it sent to a BU over the link, and how
/// far into the slot its first send came. A send that starts late runs over into the next
/// slot, where another RU sends to that BU: the two meet at the BU's port, which is what the
/// shifter is there to prevent. Two causes are told apart: the RU woke late for a slot its
/// bytes were waiting for (the slip: the host's timing), or the bytes came during the slot
/// (its assignment came then). What the kernel holds longer is not seen here: on the wire a
/// slot can slip more.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotTiming {
    /// Slots in which this RU sent to a BU over the link (the host's own BU not counted).
    pub slots: u64,
    /// Of those, the slots whose bytes were waiting when the slot began, and whose first
    /// send came more than a tenth of a slot late: the RU woke late.
    pub late: u64,
    /// Of those, the slots whose first send came more than a tenth of a slot in because
    /// their bytes came then.
    pub started_mid_slot: u64,
    /// How far into its slot the first send came, for the slots whose bytes were waiting:
    /// added up and the largest, in nanoseconds, and how many such slots.
    pub slip_ns_total: u64,
    pub slip_ns_max: u64,
    pub waited: u64,
}

/// One RU's barrel shifter: a queue per BU, released one slot at a time.
pub struct BarrelShaper {
    ru: usize,
    n_ru: usize,
    /// Folded N × N: this RU's own BU, served at once and given no slot.
    own: Option<usize>,
    /// Per BU: runs of fragments (the encoded fragments, how many, the BU incarnation
    /// their assignment named, when they were queued in wall-clock ns).
    queues: Vec<VecDeque<(Chain, u32, u16, u64)>>,
    slot_ns: u64,
    slot_bytes: usize,
    /// The slot being served and the bytes already released in it.
    slot: u64,
    sent: usize,
    queued_bytes: usize,
    timing: SlotTiming,
}

impl BarrelShaper {
    /// RU `ru` of `n_ru`, sending to `n_bu` BUs in slots of `slot` carrying at most
    /// `slot_bytes` each. The configuration makes a slot hold the largest fragment; a piece
    /// larger than a slot (none should be) is sent alone in a slot of its own. `folded`
    /// (RU k and BU k share a host) with as many RUs as BUs: the cycle skips the own BU
    /// ([`folded_barrel_destination`]); otherwise it is ignored.
    pub fn new(
        ru: usize,
        n_ru: usize,
        n_bu: usize,
        slot: Duration,
        slot_bytes: usize,
        folded: bool,
    ) -> BarrelShaper {
        BarrelShaper {
            ru,
            n_ru,
            own: (folded && n_ru == n_bu && n_ru > 1).then_some(ru),
            queues: vec![VecDeque::new(); n_bu],
            slot_ns: (slot.as_nanos() as u64).max(1),
            slot_bytes: slot_bytes.max(1),
            slot: u64::MAX,
            sent: 0,
            queued_bytes: 0,
            timing: SlotTiming::default(),
        }
    }

    /// Queues a fragment for incarnation `inc` of BU `bu` at wall-clock time `now_ns` (an
    /// out-of-range BU is sent in slot order as BU 0's).
    pub fn push(&mut self, bu: usize, inc: u16, data: Chain, count: u32, now_ns: u64) {
        self.queued_bytes += data.len();
        let n = self.queues.len();
        self.queues[if bu < n { bu } else { 0 }].push_back((data, count, inc, now_ns));
    }

    /// How well the slots were kept so far.
    pub fn timing(&self) -> SlotTiming {
        self.timing
    }

    /// Bytes waiting for their slot.
    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    /// What may be sent at wall-clock time `now_ns` (nanoseconds since the epoch): the
    /// fragments for this slot's BU, up to the slot's bytes.
    pub fn due(&mut self, now_ns: u64, mut out: impl FnMut(usize, u16, Chain, u32)) {
        let slot = now_ns / self.slot_ns;
        if slot != self.slot {
            self.slot = slot;
            self.sent = 0;
        }
        if let Some(own) = self.own {
            // the host's own BU: no link to share
            while let Some((data, count, inc, _)) = self.queues[own].pop_front() {
                self.queued_bytes -= data.len();
                out(own, inc, data, count);
            }
        }
        let bu = match self.own {
            Some(_) => folded_barrel_destination(self.ru, slot, self.n_ru),
            None => barrel_destination(self.ru, slot, self.n_ru, self.queues.len()),
        };
        let Some(bu) = bu else {
            return;
        };
        while let Some(len) = self.queues[bu].front().map(|(d, ..)| d.len()) {
            // what does not fit in the rest of the slot waits: the budget is never exceeded
            if self.sent + len > self.slot_bytes && self.sent > 0 {
                break;
            }
            let Some((data, count, inc, queued)) = self.queues[bu].pop_front() else {
                break;
            };
            if self.sent == 0 {
                let begun = slot * self.slot_ns;
                let into = now_ns - begun;
                let late = into * 10 > self.slot_ns;
                let t = &mut self.timing;
                t.slots += 1;
                if queued <= begun {
                    t.waited += 1;
                    t.late += u64::from(late);
                    t.slip_ns_total += into;
                    t.slip_ns_max = t.slip_ns_max.max(into);
                } else {
                    t.started_mid_slot += u64::from(late);
                }
            }
            self.sent += data.len();
            self.queued_bytes -= data.len();
            out(bu, inc, data, count);
        }
    }

    /// How long until the next slot begins, when anything is queued.
    pub fn next_slot_in(&self, now_ns: u64) -> Option<Duration> {
        if self.own.is_some_and(|own| !self.queues[own].is_empty()) {
            return Some(Duration::ZERO);
        }
        (self.queued_bytes > 0).then(|| Duration::from_nanos(self.slot_ns - now_ns % self.slot_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evb_buffers::Pool;

    /// A piece of `len` bytes from `pool`.
    fn piece(pool: &Pool, len: usize) -> Chain {
        let mut w = pool.try_alloc().unwrap();
        w.advance(len);
        Chain::from_slice(w.slice(0, len))
    }

    #[test]
    fn no_two_rus_share_a_bu_in_a_slot_and_every_pair_is_served_once_a_cycle() {
        for (n, m) in [(1, 1), (2, 2), (4, 4), (3, 5), (5, 3), (8, 2)] {
            let cycle = n.max(m) as u64;
            let mut served = vec![vec![0; m]; n];
            for t in 0..cycle {
                let mut seen = vec![false; m];
                for (i, row) in served.iter_mut().enumerate() {
                    if let Some(d) = barrel_destination(i, t, n, m) {
                        assert!(!seen[d], "{n}x{m} slot {t}: BU {d} twice");
                        seen[d] = true;
                        row[d] += 1;
                    }
                }
            }
            assert!(
                served.iter().flatten().all(|&c| c == 1),
                "{n}x{m}: {served:?}"
            );
        }
        assert_eq!(barrel_destination(0, 0, 0, 4), None);
    }

    #[test]
    fn a_folded_cycle_skips_the_own_bu_and_still_serves_every_other_pair_once() {
        for n in [2, 3, 4, 8] {
            let mut served = vec![vec![0; n]; n];
            for t in 0..(n as u64 - 1) {
                let mut seen = vec![false; n];
                for (i, row) in served.iter_mut().enumerate() {
                    let d = folded_barrel_destination(i, t, n).unwrap();
                    assert_ne!(d, i, "{n}: RU {i} sent to its own BU in slot {t}");
                    assert!(!seen[d], "{n} slot {t}: BU {d} twice");
                    seen[d] = true;
                    row[d] += 1;
                }
            }
            for (i, row) in served.iter().enumerate() {
                for (d, &c) in row.iter().enumerate() {
                    assert_eq!(c, usize::from(d != i), "{n}: RU {i} to BU {d}");
                }
            }
        }
        assert_eq!(folded_barrel_destination(0, 0, 1), None);
        // the own BU's fragments go at once, unbudgeted; the others wait for their slot
        let pool = Pool::new("test", 4096, 4);
        let mut w = pool.try_alloc().unwrap();
        w.advance(800);
        let frag = || Chain::from_slice(w.slice(0, 800));
        let mut s = BarrelShaper::new(1, 3, 3, Duration::from_millis(1), 1000, true);
        s.push(1, 1, frag(), 1, 0);
        s.push(1, 1, frag(), 1, 0);
        s.push(0, 1, frag(), 1, 0);
        assert_eq!(s.next_slot_in(0), Some(Duration::ZERO));
        let mut got = Vec::new();
        // slot 0: RU 1 sends to BU (1 + 1) mod 3 = 2 (nothing queued); its own two go now
        s.due(0, |bu, _, c, _| got.push((bu, c.len())));
        assert_eq!(got, [(1, 800), (1, 800)]);
        assert_eq!(s.next_slot_in(0), Some(Duration::from_millis(1)));
        // slot 1: BU (1 + 2) mod 3 = 0
        s.due(1_000_000, |bu, _, c, _| got.push((bu, c.len())));
        assert_eq!(got, [(1, 800), (1, 800), (0, 800)]);
        // not N x N: folded changes nothing
        let plain = BarrelShaper::new(1, 3, 2, Duration::from_millis(1), 1000, true);
        assert_eq!(plain.own, None);
    }

    #[test]
    fn each_slot_s_first_send_counts_how_late_it_came() {
        let pool = Pool::new("test", 4096, 16);
        let frag = |len| piece(&pool, len);
        // RU 0 of 2, 2 BUs, 1 ms slots: slot t goes to BU t mod 2
        let mut s = BarrelShaper::new(0, 2, 2, Duration::from_millis(1), 1000, false);
        // pieces of 600 bytes: one a slot; BU 0 has two and a small one, BU 1 one
        s.push(0, 1, frag(600), 1, 0);
        s.push(0, 1, frag(300), 1, 0);
        s.push(0, 1, frag(600), 1, 0);
        s.push(1, 1, frag(600), 1, 0);
        let ms = 1_000_000u64;
        let mut sent = 0;
        // slot 0 on time (50 µs in), its second piece later in the same slot: one slot
        s.due(50_000, |_, _, _, _| sent += 1);
        s.due(900_000, |_, _, _, _| sent += 1);
        // slot 1, 300 µs in: late (over a tenth of a slot)
        s.due(ms + 300_000, |_, _, _, _| sent += 1);
        // slot 2 exactly a tenth in: not late; slot 3 with nothing queued for BU 1: no slot
        s.due(2 * ms + 100_000, |_, _, _, _| sent += 1);
        s.due(3 * ms + 500_000, |_, _, _, _| sent += 1);
        // a fragment that comes during its slot (5, BU 1's), sent 400 µs in: not the RU's
        // lateness, but a slot started in its middle
        s.push(1, 1, frag(600), 1, 5 * ms + 350_000);
        s.due(5 * ms + 400_000, |_, _, _, _| sent += 1);
        assert_eq!(sent, 5);
        assert_eq!(s.queued_bytes(), 0);
        let t = s.timing();
        assert_eq!(t.slots, 4);
        assert_eq!((t.waited, t.late, t.started_mid_slot), (3, 1, 1));
        assert_eq!(t.slip_ns_total, 450_000);
        assert_eq!(t.slip_ns_max, 300_000);
    }

    #[test]
    fn a_slot_releases_its_bus_fragments_up_to_its_bytes() {
        let pool = Pool::new("test", 4096, 16);
        let frag = |len| piece(&pool, len);
        // RU 1 of 2, 2 BUs, 1 ms slots of 1000 bytes: slot t goes to BU (1 + t) mod 2
        let mut s = BarrelShaper::new(1, 2, 2, Duration::from_millis(1), 1000, false);
        for _ in 0..3 {
            s.push(0, 1, frag(600), 1, 0);
        }
        s.push(1, 1, frag(100), 1, 0);
        let ms = 1_000_000u64;
        let mut got = Vec::new();
        // slot 0: BU 1's fragment
        s.due(0, |bu, _, c, _| got.push((bu, c.len())));
        assert_eq!(got, [(1, 100)]);
        // slot 1: BU 0, one fragment: a second would over-fill the slot (1,200 > 1,000)
        got.clear();
        s.due(ms + 5, |bu, _, c, _| got.push((bu, c.len())));
        s.due(ms + 500_000, |bu, _, c, _| got.push((bu, c.len())));
        assert_eq!(got, [(0, 600)]);
        assert_eq!(s.queued_bytes(), 1200);
        assert_eq!(
            s.next_slot_in(ms + 500_000),
            Some(Duration::from_micros(500))
        );
        // slot 2 is BU 1's (nothing queued), slots 3 and 5 BU 0's again, one fragment each
        got.clear();
        s.due(2 * ms, |bu, _, c, _| got.push((bu, c.len())));
        assert!(got.is_empty());
        s.due(3 * ms, |bu, _, c, _| got.push((bu, c.len())));
        assert_eq!(got, [(0, 600)]);
        s.due(5 * ms, |bu, _, c, _| got.push((bu, c.len())));
        assert_eq!(got, [(0, 600), (0, 600)]);
        assert_eq!(s.next_slot_in(5 * ms), None);
        // pieces that fit share a slot; one larger than a slot goes alone
        s.push(0, 1, frag(400), 1, 0);
        s.push(0, 1, frag(400), 1, 0);
        s.push(0, 1, frag(300), 1, 0);
        got.clear();
        s.due(7 * ms, |bu, _, c, _| got.push((bu, c.len())));
        assert_eq!(got, [(0, 400), (0, 400)]);
        let mut big = BarrelShaper::new(0, 1, 1, Duration::from_millis(1), 1000, false);
        big.push(0, 1, frag(1500), 1, 0);
        big.push(0, 1, frag(100), 1, 0);
        got.clear();
        big.due(0, |bu, _, c, _| got.push((bu, c.len())));
        assert_eq!(got, [(0, 1500)]);
    }
}

//! Where `evb run` puts the node processes: RU–BU pairs on every CPU (`run.placement = "auto"`).

use evb_config::{host_of, Config, Role};

/// `run.placement = "auto"`: the RUs and BUs that `[affinity]` leaves free are pinned, one
/// CPU each when there are enough; otherwise the CPUs are cut into groups, each holding as
/// many RUs as BUs (RU i and BU i together, round the groups), so every CPU carries both
/// halves of the work. The EVM, which does little, goes wherever the system puts it.
///
/// Why pairs rather than RUs on some CPUs and BUs on others (the earlier rule): an
/// RU and a BU cost different CPU time per event (the BU more for small events, the RU more
/// with unique content), so splitting by role left one side idle while the other was
/// saturated; a pair per CPU balances by construction, and half the traffic stays within a
/// CPU's cache. Measured in docs/performance.md ("Placement"): pairs build 1.17x the
/// role split at 256 B, up to 1.5x at 128 KiB, never less.
///
/// When RU i and BU i share a host and a local transport of their own (the folded layout:
/// `transport.local = "shm"`), RU i goes with BU i+1 instead, which it reaches over the
/// network: the kernel's copies of that traffic then stay within one CPU's cache, where
/// shared memory is read once whichever CPU wrote it (1.13x at 256 B, docs/performance.md,
/// "Instructions, and where the BU waits").
pub(crate) fn auto_place(cfg: &mut Config, quiet: bool) {
    if cfg.run.placement != evb_config::Placement::Auto {
        return;
    }
    let Ok(cpus) = evb_node::affinity::current_cpus() else {
        return;
    };
    let free: Vec<evb_config::NodeSpec> = cfg
        .nodes()
        .into_iter()
        .filter(|n| n.role != Role::Evm && !cfg.affinity.contains_key(&n.id))
        .collect();
    let (rus, mut bus): (Vec<_>, Vec<_>) = free.iter().partition(|n| n.role == Role::Ru);
    let local_apart = cfg.transport.local.is_some_and(|l| l != cfg.transport.kind);
    let ru_hosts: Vec<&str> = rus.iter().map(|n| host_of(&n.addr)).collect();
    let bu_hosts: Vec<&str> = bus.iter().map(|n| host_of(&n.addr)).collect();
    if local_apart && partners_share_hosts(&ru_hosts, &bu_hosts) {
        bus.rotate_left(1);
    }
    let ids = |ns: &[&evb_config::NodeSpec]| ns.iter().map(|n| n.id.clone()).collect::<Vec<_>>();
    let placed = cpu_groups(&cpus, &ids(&rus), &ids(&bus));
    if placed.is_empty() {
        return;
    }
    let mut said: Vec<(Vec<usize>, Vec<String>)> = Vec::new();
    for (id, set) in placed {
        match said.iter_mut().find(|(s, _)| *s == set) {
            Some((_, ids)) => ids.push(id.clone()),
            None => said.push((set.clone(), vec![id.clone()])),
        }
        cfg.affinity.insert(id, set);
    }
    if !quiet {
        let groups: Vec<String> = said
            .iter()
            .map(|(set, ids)| format!("{} on CPUs {set:?}", ids.join(", ")))
            .collect();
        eprintln!(
            "evb: {} (run.placement = \"auto\"; \"none\" leaves them to the system)",
            groups.join("; ")
        );
    }
}

/// RU i and BU i are on one host, and RU i and BU i+1 are not (the folded layout): as many
/// RUs as BUs, at least two.
fn partners_share_hosts<S: PartialEq>(rus: &[S], bus: &[S]) -> bool {
    let m = bus.len();
    rus.len() == m && m >= 2 && (0..m).all(|i| rus[i] == bus[i] && rus[i] != bus[(i + 1) % m])
}

/// Where `auto` puts RUs `rus` and BUs `bus` on `cpus`: one CPU each when there are enough,
/// else `g` = min(CPUs, most of either role) groups of consecutive CPUs, RU i and BU i in
/// group i mod g. Nothing with fewer than two CPUs.
pub(super) fn cpu_groups(
    cpus: &[usize],
    rus: &[String],
    bus: &[String],
) -> Vec<(String, Vec<usize>)> {
    if cpus.len() < 2 || rus.len() + bus.len() == 0 {
        return Vec::new();
    }
    if rus.len() + bus.len() <= cpus.len() {
        return rus
            .iter()
            .chain(bus)
            .zip(cpus)
            .map(|(id, cpu)| (id.clone(), vec![*cpu]))
            .collect();
    }
    let g = cpus.len().min(rus.len().max(bus.len()));
    // g groups of consecutive CPUs, the first ones one larger when they do not divide evenly
    let group = |k: usize| {
        let (base, extra) = (cpus.len() / g, cpus.len() % g);
        let start = k * base + k.min(extra);
        cpus[start..start + base + usize::from(k < extra)].to_vec()
    };
    let mut out = Vec::new();
    for i in 0..rus.len().max(bus.len()) {
        for id in [rus.get(i), bus.get(i)].into_iter().flatten() {
            out.push((id.clone(), group(i % g)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn auto_placement_pairs_rus_with_bus_on_every_cpu() {
        let ids = |p: &str, n: usize| (0..n).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
        let place = |cpus: &[usize], r: usize, b: usize| {
            cpu_groups(cpus, &ids("ru", r), &ids("bu", b))
                .into_iter()
                .collect::<BTreeMap<String, Vec<usize>>>()
        };
        // 2 x 2 on two CPUs: one RU and one BU on each
        let p = place(&[0, 1], 2, 2);
        assert_eq!(p["ru0"], vec![0]);
        assert_eq!(p["bu0"], vec![0]);
        assert_eq!(p["ru1"], vec![1]);
        assert_eq!(p["bu1"], vec![1]);
        // enough CPUs: one each, none shared
        let p = place(&[2, 3, 4, 5, 6], 2, 2);
        let mut all: Vec<usize> = p.values().flatten().copied().collect();
        all.sort_unstable();
        assert_eq!(all, vec![2, 3, 4, 5]);
        // 4 x 4 on three CPUs: groups [0], [1], [2] hold ru i, bu i for i mod 3
        let p = place(&[0, 1, 2], 4, 4);
        for i in 0..4 {
            assert_eq!(p[&format!("ru{i}")], vec![i % 3]);
            assert_eq!(p[&format!("bu{i}")], vec![i % 3]);
        }
        // 2 x 2 on three CPUs: two groups, [0, 1] and [2]
        let p = place(&[0, 1, 2], 2, 2);
        assert_eq!(p["ru0"], vec![0, 1]);
        assert_eq!(p["bu1"], vec![2]);
        // 3 RUs x 1 BU on two CPUs: every node placed, the BU with ru0
        let p = place(&[0, 1], 3, 1);
        assert_eq!(p.len(), 4);
        assert_eq!(p["bu0"], p["ru0"]);
        assert_eq!(p["ru1"], vec![1]);
        assert_eq!(p["ru2"], vec![0]);
        // nothing to do with one CPU, or nothing free
        assert!(place(&[0], 2, 2).is_empty());
        assert!(place(&[0, 1], 0, 0).is_empty());
    }

    /// In the folded layout (RU i and BU i on one host, a local transport between them)
    /// each RU is placed with the next host's BU; any other layout keeps RU i with BU i.
    #[test]
    fn folded_pairs_are_placed_apart() {
        let folded = |n: usize| {
            let mut t = String::from(
                "[transport]\nkind = \"tcp\"\nlocal = \"shm\"\n[evm]\nid = \"evm\"\naddr = \"127.0.0.1:0\"\n",
            );
            for i in 0..n {
                for role in ["ru", "bu"] {
                    t += &format!(
                        "[[{role}]]\nid = \"{role}{i}\"\naddr = \"127.0.0.{}:0\"\n",
                        i + 1
                    );
                }
            }
            evb_config::Config::from_toml(&t).expect("a valid configuration")
        };
        let placed = |mut c: evb_config::Config| {
            auto_place(&mut c, true);
            c.affinity
        };
        assert!(partners_share_hosts(&["a", "b", "c"], &["a", "b", "c"]));
        assert!(!partners_share_hosts(&["a", "b"], &["a", "c"]));
        assert_eq!(host_of("[::1]:5000"), "[::1]");
        assert_eq!(host_of("127.0.0.2:0"), "127.0.0.2");
        if evb_node::affinity::current_cpus().map_or(0, |c| c.len()) != 2 {
            // the placements below are two CPUs' (CI's and this project's host): with more,
            // every node has a CPU of its own
            return;
        }
        let p = placed(folded(2));
        assert_eq!(p["ru0"], p["bu1"], "ru0 with the other host's BU");
        assert_eq!(p["ru1"], p["bu0"]);
        assert_ne!(p["ru0"], p["ru1"]);
        // no local transport of its own: RU i with BU i
        let mut c = folded(2);
        c.transport.local = None;
        let p = placed(c);
        assert_eq!(p["ru0"], p["bu0"]);
        // every node on one host: nothing to keep apart, RU i with BU i
        let mut c = folded(2);
        for n in &mut c.ru {
            n.addr = "127.0.0.1:0".into();
        }
        for n in &mut c.bu {
            n.addr = "127.0.0.1:0".into();
        }
        let p = placed(c);
        assert_eq!(p["ru0"], p["bu0"]);
    }
}

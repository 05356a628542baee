//! Free loopback ports for tests and benchmarks that start processes listening on them.

use std::hash::{BuildHasher, Hasher};

/// `n` consecutive free loopback ports (best effort: bound together, then released; the
/// multi-process tests use it too).
///
/// They are drawn at random below the kernel's ephemeral range: a port there is never handed
/// out for another process's port-0 listener or outgoing connection in the moment between
/// this check and the nodes' own binds (a test once found an HTTP server of a concurrent run
/// on a BU's port, taken from the ephemeral range in that moment).
pub fn free_ports(n: u16) -> Option<u16> {
    const LOWEST: u16 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let top = ephemeral_low.saturating_sub(n);
    if top <= LOWEST {
        return None;
    }
    for _ in 0..200 {
        // a fresh RandomState is seeded at random: no dependency needed for one number
        let r = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let base = LOWEST + (r % u64::from(top - LOWEST)) as u16;
        let held: Vec<_> = (0..n)
            .filter_map(|k| std::net::TcpListener::bind(("127.0.0.1", base + k)).ok())
            .collect();
        if held.len() == n as usize {
            return Some(base);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ports_given_can_be_bound() {
        let base = free_ports(3).expect("free ports");
        assert!(base >= 10_000);
        let held: Vec<_> = (0..3)
            .map(|k| std::net::TcpListener::bind(("127.0.0.1", base + k)))
            .collect();
        // another process may take one meanwhile: best effort, but on a quiet machine all bind
        assert!(held.iter().filter(|l| l.is_ok()).count() >= 1);
        assert_eq!(
            free_ports(u16::MAX),
            None,
            "no room below the ephemeral range"
        );
    }
}

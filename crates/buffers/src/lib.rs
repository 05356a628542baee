//! Buffers: the bottom layer of evb.
//!
//! A [`Pool`] owns fixed-size blocks allocated up front. A [`BlockWriter`] is a loaned
//! block being filled; the filled part is shared as [`Slice`]s; a block goes back to its
//! pool when its writer and its last slice are dropped. A [`Chain`] strings slices together
//! for messages larger than a block. Data moves from source to wire to builder as slices of
//! pool blocks, never copied in user space.

mod block;
mod chain;
mod pool;
pub mod skips;
pub mod small_keys;

pub use block::{BlockWriter, Slice};
pub use chain::Chain;
pub use pool::{Pool, PoolStats, RemotePool};

#[cfg(test)]
mod tests {
    use super::*;

    /// A populated pool's pages are marked for huge pages (the `hg` flag of its mapping in
    /// /proc/self/smaps) on a kernel that has transparent huge pages.
    #[test]
    fn a_populated_pool_asks_for_huge_pages() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
            skips::skipped("huge pages", "this kernel has no transparent huge pages");
            return;
        }
        let pool = Pool::new("huge", 1 << 20, 16);
        pool.populate().unwrap();
        // the middle block's address lies in the region's whole 2 MiB pages
        let mut held: Vec<BlockWriter> = (0..16).map(|_| pool.try_alloc().unwrap()).collect();
        let mut at: Vec<usize> = held
            .iter_mut()
            .map(|w| w.append(b"x").unwrap().as_ptr() as usize)
            .collect();
        at.sort_unstable();
        let mid = at[8];
        // the mapping that holds it: its header line ("start-end perms ...") then its fields
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let holds = |l: &str| {
            let range = l.split(' ').next().unwrap_or("");
            let (a, b) = range.split_once('-').unwrap_or(("", ""));
            let hex = |x| usize::from_str_radix(x, 16).ok();
            matches!((hex(a), hex(b)), (Some(a), Some(b)) if a <= mid && mid < b)
        };
        let flags = smaps
            .lines()
            .skip_while(|l| !holds(l))
            .find(|l| l.starts_with("VmFlags:"))
            .expect("the pool's mapping in /proc/self/smaps");
        assert!(flags.split_whitespace().any(|f| f == "hg"), "{flags}");
    }

    #[test]
    fn block_returns_to_pool_when_last_user_drops() {
        let pool = Pool::new("t", 64, 2);
        assert_eq!(pool.free_blocks(), 2);
        let mut w = pool.try_alloc().unwrap();
        let s = w.append(b"hello").unwrap();
        assert_eq!(pool.free_blocks(), 1);
        drop(w);
        assert_eq!(pool.free_blocks(), 1, "slice still holds the block");
        assert_eq!(&s[..], b"hello");
        let s2 = s.clone();
        drop(s);
        assert_eq!(pool.free_blocks(), 1);
        drop(s2);
        assert_eq!(pool.free_blocks(), 2);
    }

    #[test]
    fn push_from_grows_the_last_slice_only_where_the_bytes_follow_it() {
        let pool = Pool::new("t", 64, 2);
        let mut ws = [pool.try_alloc().unwrap(), pool.try_alloc().unwrap()];
        let mut c = Chain::new();
        for (k, byte) in [(0, 1u8), (0, 2), (1, 3), (0, 4)] {
            let w = &mut ws[k];
            let start = w.filled();
            w.spare_mut()[..4].fill(byte);
            w.advance(4);
            c.push_from(w, start, 4);
        }
        // a's first two pieces are one slice; b's and a's third are not next to the last
        assert_eq!(c.slices().len(), 3);
        assert_eq!(c.to_vec(), [[1u8; 4], [2; 4], [3; 4], [4; 4]].concat());
        drop(ws);
        assert_eq!(pool.free_blocks(), 0, "the chain holds both blocks");
        drop(c);
        assert_eq!(pool.free_blocks(), 2);
    }

    #[test]
    fn exhausted_pool_refuses_and_counts() {
        let pool = Pool::new("t", 16, 1);
        let a = pool.try_alloc().unwrap();
        assert!(pool.try_alloc().is_none());
        assert_eq!(pool.stats().exhausted, 1);
        assert_eq!(pool.stats().high_water, 1);
        drop(a);
        assert!(pool.try_alloc().is_some());
    }

    #[test]
    fn writer_keeps_filling_while_head_is_shared() {
        let pool = Pool::new("t", 32, 1);
        let mut w = pool.try_alloc().unwrap();
        let a = w.append(&[1; 10]).unwrap();
        w.spare_mut()[..5].copy_from_slice(&[2; 5]);
        w.advance(5);
        let b = w.slice(10, 5);
        assert_eq!(&a[..], &[1; 10]);
        assert_eq!(&b[..], &[2; 5]);
        assert!(a.is_followed_by(&b));
        assert!(w.append(&[0; 18]).is_none());
        assert_eq!(w.remaining(), 17);
    }

    #[test]
    fn chain_merges_contiguous_slices_and_spans_blocks() {
        let pool = Pool::new("t", 8, 3);
        let mut w1 = pool.try_alloc().unwrap();
        let mut w2 = pool.try_alloc().unwrap();
        let mut c = Chain::new();
        c.push(w1.append(b"abcd").unwrap());
        c.push(w1.append(b"efgh").unwrap());
        c.push(w2.append(b"ijk").unwrap());
        assert_eq!(c.slices().len(), 2);
        assert_eq!(c.len(), 11);
        assert_eq!(c.to_vec(), b"abcdefghijk");
        assert_eq!(c.sub(6, 4).to_vec(), b"ghij");
        assert_eq!(c.crc32c(), crc32c::crc32c(b"abcdefghijk"));
        let mut p = [0u8; 9];
        assert!(c.copy_prefix(&mut p));
        assert_eq!(&p, b"abcdefghi");
        assert!(c.eq_bytes(b"abcdefghijk"));
        assert!(!c.eq_bytes(b"abcdefghijx"));
    }

    #[test]
    fn shared_pool_is_seen_in_place_by_a_remote_view() {
        let pool = Pool::new_shared("t", 4096, 4).unwrap();
        let mut w = pool.try_alloc().unwrap();
        let _skip = w.append(&[0; 100]).unwrap();
        let s = w.append(b"fragment bytes").unwrap();
        let fd = pool.shared_fd().unwrap().try_clone_to_owned().unwrap();
        let remote = RemotePool::map("peer", fd, pool.region_len()).unwrap();
        let seen = remote.slice(s.region_offset(), s.len(), 7).unwrap();
        assert_eq!(&seen[..], b"fragment bytes");
        assert!(
            remote.slice(pool.region_len() - 1, 2, 8).is_none(),
            "out of the region"
        );
        let sub = seen.sub(9, 5);
        drop(seen);
        let mut back = Vec::new();
        remote.take_returns(&mut back);
        assert!(back.is_empty(), "a sub-slice still holds it");
        drop(sub);
        remote.take_returns(&mut back);
        assert_eq!(back, vec![7]);
    }

    #[test]
    fn slices_cross_threads() {
        let pool = Pool::new("t", 64, 4);
        let mut w = pool.try_alloc().unwrap();
        let s = w.append(&[7; 64]).unwrap();
        let h = std::thread::spawn(move || s.iter().map(|&b| b as u32).sum::<u32>());
        assert_eq!(h.join().unwrap(), 7 * 64);
        drop(w);
        assert_eq!(pool.free_blocks(), 4);
    }
}

#[cfg(test)]
mod huge {
    use super::*;

    fn free_huge() -> Option<u64> {
        let m = std::fs::read_to_string("/proc/meminfo").ok()?;
        m.lines()
            .find(|l| l.starts_with("HugePages_Free:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }

    /// Where the system has huge pages reserved, a large shared pool uses them.
    #[test]
    fn large_shared_pools_take_huge_pages_when_there_are_any() {
        let Some(before) = free_huge().filter(|&n| n >= 4) else {
            eprintln!("no huge pages reserved here: nothing to check");
            return;
        };
        let pool = Pool::new_shared("huge", 1 << 20, 4).unwrap();
        let after = free_huge().unwrap();
        assert!(
            after < before,
            "4 MiB shared pool did not take huge pages ({before} -> {after})"
        );
        let mut w = pool.try_alloc().unwrap();
        assert_eq!(&w.append(b"ok").unwrap()[..], b"ok");
    }
}

//! A pool of fixed-size blocks carved out of one region allocated up front.
//!
//! One contiguous region (rather than a box per block) is what a fabric registers once and
//! what a shared-memory segment maps. The region is private memory, or a memfd that another
//! process on the host can map (`Pool::new_shared`): then a peer reads the blocks where they
//! are, and a [`RemotePool`] is its view of them.

use std::cell::UnsafeCell;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_queue::SegQueue;

use crate::block::{BlockWriter, Slice};

/// Counters describing a pool's use, cheap to read at any time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    pub block_size: usize,
    pub blocks: usize,
    pub free: usize,
    /// The most blocks ever on loan at once.
    pub high_water: usize,
    /// Allocation attempts that found the pool empty.
    pub exhausted: u64,
}

/// Where a pool's bytes live.
enum Region {
    Heap(Box<[UnsafeCell<u8>]>),
    /// A shared mapping: our own memfd, or a peer's mapped read-only.
    Mapped {
        ptr: *mut u8,
        len: usize,
        fd: Option<OwnedFd>,
    },
}

impl Region {
    fn base(&self) -> *mut u8 {
        match self {
            // SAFETY: `UnsafeCell<u8>` is `repr(transparent)` over `u8`: the slice is one run of
            // bytes, and a pointer taken from the whole slice keeps provenance over all of it.
            Region::Heap(b) => UnsafeCell::raw_get(b.as_ptr()),
            Region::Mapped { ptr, .. } => *ptr,
        }
    }

    fn len(&self) -> usize {
        match self {
            Region::Heap(b) => b.len(),
            Region::Mapped { len, .. } => *len,
        }
    }

    /// Maps `len` bytes of `fd` shared; writable for our own memory, read-only for a peer's.
    fn map(fd: OwnedFd, len: usize, writable: bool) -> std::io::Result<Region> {
        use std::os::fd::AsRawFd;
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of a file we hold open; no Rust object aliases it yet.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Region::Mapped {
            ptr: ptr.cast(),
            len,
            fd: Some(fd),
        })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Region::Mapped { ptr, len, .. } = self {
            // SAFETY: the mapping was made by `Region::map` with this length, and the region is
            // dropped only when no block or slice (each holds an Arc to it) can reach it.
            unsafe { libc::munmap(ptr.cast(), *len) };
        }
    }
}

/// How blocks come back.
#[allow(clippy::large_enum_variant)] // one per pool
enum Returns {
    /// Our own pool: a free list, last in first out, so the block handed out next is the one
    /// most recently freed, still in cache. (First in first out cycled through the whole
    /// pool: the kernel then copied received data into cache-cold memory, which cost the
    /// event builder's BUs, whose pools are sized for their credits, about 10 % of throughput.)
    /// A mutex held for one push or pop: blocks are loaned a few thousand times a second.
    Free(Mutex<Vec<u32>>),
    /// A peer's pool seen here: the tokens of dropped slices, to be sent back to it.
    ToPeer(SegQueue<u32>),
}

pub(crate) struct PoolShared {
    region: Region,
    block_size: usize,
    blocks: usize,
    returns: Returns,
    id: u64,
    high_water: AtomicUsize,
    exhausted: AtomicUsize,
    name: String,
}

// SAFETY: the region is only reached through `BlockWriter` (unique writer of the unfilled
// tail of one block) and `Slice` (readers of its filled head), whose invariants keep every
// byte either written by exactly one thread or read-only; the free list is behind a mutex.
unsafe impl Sync for PoolShared {}
// SAFETY: see the `Sync` impl; the region owns plain bytes or a mapping.
unsafe impl Send for PoolShared {}

impl PoolShared {
    /// Pointer to byte `offset` of the region.
    pub(crate) fn ptr_at(&self, offset: usize) -> *mut u8 {
        assert!(offset <= self.region.len());
        // SAFETY: `offset` is inside the region (checked above).
        unsafe { self.region.base().add(offset) }
    }

    pub(crate) fn block_size(&self) -> usize {
        self.block_size
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Our own shared region's memfd and length (a peer's mapping is not passed on).
    pub(crate) fn shared_fd(&self) -> Option<(BorrowedFd<'_>, usize)> {
        match (&self.region, &self.returns) {
            (
                Region::Mapped {
                    fd: Some(fd), len, ..
                },
                Returns::Free(_),
            ) => Some((fd.as_fd(), *len)),
            _ => None,
        }
    }

    pub(crate) fn release(&self, index: u32) {
        match &self.returns {
            Returns::Free(q) => lock(q).push(index),
            Returns::ToPeer(q) => q.push(index),
        }
    }
}

/// The free list, even if a thread panicked while holding it (a push or pop cannot leave it
/// inconsistent).
fn lock(m: &Mutex<Vec<u32>>) -> std::sync::MutexGuard<'_, Vec<u32>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Asks the kernel to back the whole 2 MiB pages inside `[at, at + len)`, a pool's region
/// about to be populated, with transparent huge pages where the host allows them (`enabled` =
/// `madvise`, Debian's default): the kernel's copies into and out of a pool (a socket's
/// bytes in, a file's out) then miss the TLB once per 2 MiB instead of once per 4 KiB,
/// which under a hypervisor costs a walk of two page tables. Only advice: refused or
/// ignored, the pool keeps ordinary pages. Asked only before [`Pool::populate`], which
/// backs the pages off the data path: a huge page's fault may wait for the kernel to
/// compact memory, which a node's event loop must not.
fn ask_huge_pages(at: usize, len: usize) {
    const HUGE: usize = 2 << 20;
    let (start, end) = (at.next_multiple_of(HUGE), (at + len) / HUGE * HUGE);
    if end > start {
        // SAFETY: [start, end) lies within [at, at + len), a pool's region that the pool
        // keeps mapped; MADV_HUGEPAGE changes how its pages are backed, never its contents.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    // Unique within the process; with the pid, unique on the host.
    (std::process::id() as u64) << 32 | NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A cloneable handle on a block pool. Blocks return to it when their last user drops them.
#[derive(Clone)]
pub struct Pool {
    shared: Arc<PoolShared>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.shared.name)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Pool {
    fn with_region(name: &str, region: Region, block_size: usize, blocks: usize) -> Pool {
        // Popped from the end: block 0 first.
        let free = Mutex::new((0..blocks as u32).rev().collect());
        Pool {
            shared: Arc::new(PoolShared {
                region,
                block_size,
                blocks,
                returns: Returns::Free(free),
                id: next_id(),
                high_water: AtomicUsize::new(0),
                exhausted: AtomicUsize::new(0),
                name: name.to_string(),
            }),
        }
    }

    fn size(block_size: usize, blocks: usize) -> usize {
        assert!(block_size > 0 && blocks > 0, "empty pool");
        assert!(blocks <= u32::MAX as usize);
        block_size.checked_mul(blocks).expect("pool size overflows")
    }

    /// Allocates `blocks` blocks of `block_size` bytes up front in private memory, zeroed.
    /// A large region's pages are the kernel's zero pages until first written: call
    /// [`Pool::populate`] (off the data path: it takes a while for a large pool) to back them
    /// before the run. Allocating takes no time that grows with the size.
    ///
    /// # Panics
    /// If `block_size` or `blocks` is zero or the region size overflows: these are
    /// programming errors, configuration is validated before pools are made.
    pub fn new(name: &str, block_size: usize, blocks: usize) -> Pool {
        let bytes = Self::size(block_size, blocks);
        let zeroed: Box<[u8]> = vec![0u8; bytes].into_boxed_slice();
        let len = zeroed.len();
        let raw = Box::into_raw(zeroed).cast::<UnsafeCell<u8>>();
        // SAFETY: `UnsafeCell<u8>` is `repr(transparent)` over `u8`, so a boxed slice of `len`
        // bytes is a boxed slice of `len` cells with the same layout; the box is rebuilt from
        // the pointer it gave up, once, and owns the allocation from then on.
        let region = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(raw, len)) };
        Self::with_region(name, Region::Heap(region), block_size, blocks)
    }

    /// Like `new`, but in a memfd that processes on this host can map ([`Pool::shared_fd`]).
    /// A memfd has no name in any file system: nothing is left behind when the process dies.
    pub fn new_shared(name: &str, block_size: usize, blocks: usize) -> std::io::Result<Pool> {
        let pool = Self::new_shared_untouched(name, block_size, blocks)?;
        // Touch every page now: a huge-page memfd that cannot be backed fails here, not with
        // a SIGBUS on the data path.
        // SAFETY: the mapping is ours, writable and this long; no block is loaned yet.
        unsafe { std::ptr::write_bytes(pool.shared.region.base(), 0, pool.region_len()) };
        Ok(pool)
    }

    /// A shared pool whose pages are only allocated when first written (for rarely used,
    /// generously sized pools such as a transport's bounce buffers).
    pub fn new_shared_untouched(
        name: &str,
        block_size: usize,
        blocks: usize,
    ) -> std::io::Result<Pool> {
        let bytes = Self::size(block_size, blocks);
        let cname = std::ffi::CString::new(format!("evb-{name}")).unwrap_or_default();
        // Huge pages when the system has them reserved (fewer TLB misses on a large region);
        // otherwise ordinary pages.
        const HUGE: usize = 2 << 20;
        let region = if bytes >= HUGE {
            Self::memfd(&cname, libc::MFD_HUGETLB, bytes.div_ceil(HUGE) * HUGE).ok()
        } else {
            None
        };
        let region = match region {
            Some(r) => r,
            None => Self::memfd(&cname, 0, bytes)?,
        };
        Ok(Self::with_region(name, region, block_size, blocks))
    }

    /// A shared mapping of a new memfd of `len` bytes, sealed at that size (F_SEAL_SHRINK,
    /// F_SEAL_GROW, F_SEAL_SEAL): a process it is passed to can map it without fear of a
    /// later truncation (SIGBUS), and checks the seals before it does (the shm transport).
    fn memfd(cname: &std::ffi::CStr, flags: libc::c_uint, len: usize) -> std::io::Result<Region> {
        use std::os::fd::AsRawFd;
        // SAFETY: plain system call on a valid C string; the returned fd is checked.
        let raw = unsafe {
            libc::memfd_create(
                cname.as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | flags,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        std::fs::File::from(fd.try_clone()?).set_len(len as u64)?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: F_ADD_SEALS on a memfd we own, with a plain integer argument.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Region::map(fd, len, true)
    }

    /// The memfd behind a shared pool (`None` for private memory).
    pub fn shared_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.shared.region {
            Region::Mapped { fd: Some(fd), .. } => Some(fd.as_fd()),
            _ => None,
        }
    }

    /// Identity of the pool, unique on this host (its region, for peers).
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// Bytes in the region.
    pub fn region_len(&self) -> usize {
        self.shared.region.len()
    }

    /// Makes the kernel back every page of the pool now, without changing a byte (so it is
    /// safe while blocks are in use). A pool's pages are otherwise allocated on first write,
    /// each fault stalling the data path; a large pool faulted in during a run can keep a
    /// node's event loop from running for hundreds of milliseconds. Slow for a large pool:
    /// run it off the event loop. Does nothing for a peer's pool mapped read-only. Asks for
    /// huge pages first, where the host gives them on request.
    pub fn populate(&self) -> std::io::Result<()> {
        if let Region::Mapped { fd: None, .. } = self.shared.region {
            return Ok(());
        }
        const PAGE: usize = 4096;
        let base = self.shared.region.base() as usize;
        let start = base.next_multiple_of(PAGE);
        let end = base + self.shared.region.len();
        if end <= start {
            return Ok(());
        }
        ask_huge_pages(base, self.shared.region.len());
        // In pieces: the kernel holds the process's memory-map lock while it backs a range,
        // and a thread of the same process that needs it (to map memory, or to fault a page
        // in) waits behind a multi-GiB range for seconds (49 nodes on 2 CPUs starved their
        // event loops past the heartbeat timeout that way).
        const PIECE: usize = 32 << 20;
        let mut at = start;
        while at < end {
            let len = PIECE.min(end - at);
            // SAFETY: [at, at + len) lies within the pool's region, which this `Pool` keeps
            // mapped; MADV_POPULATE_WRITE only allocates pages and leaves their contents as
            // they are.
            let r =
                unsafe { libc::madvise(at as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) };
            if r != 0 {
                return Err(std::io::Error::last_os_error());
            }
            at += len;
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Loans a block, or `None` when every block is in use (the caller backs off: that is
    /// how a full pool turns into back-pressure).
    pub fn try_alloc(&self) -> Option<BlockWriter> {
        let Returns::Free(free) = &self.shared.returns else {
            return None;
        };
        let (popped, left) = {
            let mut f = lock(free);
            (f.pop(), f.len())
        };
        match popped {
            Some(index) => {
                let used = self.shared.blocks - left;
                self.shared.high_water.fetch_max(used, Ordering::Relaxed);
                Some(BlockWriter::new(self.shared.clone(), index))
            }
            None => {
                self.shared.exhausted.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    pub fn block_size(&self) -> usize {
        self.shared.block_size
    }

    pub fn free_blocks(&self) -> usize {
        match &self.shared.returns {
            Returns::Free(q) => lock(q).len(),
            Returns::ToPeer(_) => 0,
        }
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            block_size: self.shared.block_size,
            blocks: self.shared.blocks,
            free: self.free_blocks(),
            high_water: self.shared.high_water.load(Ordering::Relaxed),
            exhausted: self.shared.exhausted.load(Ordering::Relaxed) as u64,
        }
    }
}

/// A peer's shared pool, mapped read-only here. Slices made from it refer to the peer's own
/// bytes (no copy); when the last user of one drops it, its token is queued to go back to the
/// peer, which then frees the block.
#[derive(Clone)]
pub struct RemotePool {
    shared: Arc<PoolShared>,
}

impl RemotePool {
    /// Maps `len` bytes of a peer's pool memfd.
    pub fn map(name: &str, fd: OwnedFd, len: usize) -> std::io::Result<RemotePool> {
        let region = Region::map(fd, len, false)?;
        Ok(RemotePool {
            shared: Arc::new(PoolShared {
                region,
                block_size: len,
                blocks: 0,
                returns: Returns::ToPeer(SegQueue::new()),
                id: 0,
                high_water: AtomicUsize::new(0),
                exhausted: AtomicUsize::new(0),
                name: name.to_string(),
            }),
        })
    }

    /// `len` bytes at `offset` of the peer's region, returned under `token` once dropped;
    /// `None` if the range is not inside the region (a peer's bad descriptor).
    pub fn slice(&self, offset: usize, len: usize, token: u32) -> Option<Slice> {
        let end = offset.checked_add(len)?;
        if end > self.shared.region.len() || len > u32::MAX as usize {
            return None;
        }
        Some(Slice::remote(self.shared.clone(), offset, len, token))
    }

    /// Moves the tokens of dropped slices into `out`.
    pub fn take_returns(&self, out: &mut Vec<u32>) {
        if let Returns::ToPeer(q) = &self.shared.returns {
            while let Some(t) = q.pop() {
                out.push(t);
            }
        }
    }
}

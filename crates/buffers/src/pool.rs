//! A pool of fixed-size blocks carved out of one region allocated up front.
//!
//! One contiguous region (rather than a box per block) is what a fabric registers once
//! and what a shared-memory segment maps; blocks are addressed by index inside it.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

use crate::block::BlockWriter;

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

pub(crate) struct PoolShared {
    region: Box<[UnsafeCell<u8>]>,
    block_size: usize,
    blocks: usize,
    free: ArrayQueue<u32>,
    high_water: AtomicUsize,
    exhausted: AtomicUsize,
    name: String,
}

// SAFETY: the region is only reached through `BlockWriter` (unique writer of the unfilled
// tail of one block) and `Slice` (readers of its filled head), whose invariants keep every
// byte either written by exactly one thread or read-only; the free list is a lock-free queue.
unsafe impl Sync for PoolShared {}
// SAFETY: see the `Sync` impl; the region owns plain bytes.
unsafe impl Send for PoolShared {}

impl PoolShared {
    /// Pointer to the first byte of block `index`.
    pub(crate) fn block_ptr(&self, index: u32) -> *mut u8 {
        assert!((index as usize) < self.blocks);
        // SAFETY: `UnsafeCell<u8>` is `repr(transparent)` over `u8`, so the region is one run
        // of bytes; taking the pointer from the whole slice keeps provenance over all of it,
        // and `index < blocks` keeps the offset inside the allocation.
        unsafe { UnsafeCell::raw_get(self.region.as_ptr()).add(index as usize * self.block_size) }
    }

    pub(crate) fn block_size(&self) -> usize {
        self.block_size
    }

    pub(crate) fn release(&self, index: u32) {
        // Cannot fail: every index was taken from this queue, whose capacity is the block count.
        let _ = self.free.push(index);
    }
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
    /// Allocates `blocks` blocks of `block_size` bytes up front (zeroed, so the pages are
    /// touched now rather than on the data path).
    ///
    /// # Panics
    /// If `block_size` or `blocks` is zero or the region size overflows: these are
    /// programming errors, configuration is validated before pools are made.
    pub fn new(name: &str, block_size: usize, blocks: usize) -> Pool {
        assert!(block_size > 0 && blocks > 0, "empty pool");
        assert!(blocks <= u32::MAX as usize);
        let bytes = block_size.checked_mul(blocks).expect("pool size overflows");
        let region: Box<[UnsafeCell<u8>]> = (0..bytes).map(|_| UnsafeCell::new(0)).collect();
        let free = ArrayQueue::new(blocks);
        for i in 0..blocks as u32 {
            let _ = free.push(i);
        }
        Pool {
            shared: Arc::new(PoolShared {
                region,
                block_size,
                blocks,
                free,
                high_water: AtomicUsize::new(0),
                exhausted: AtomicUsize::new(0),
                name: name.to_string(),
            }),
        }
    }

    /// Loans a block, or `None` when every block is in use (the caller backs off: that is
    /// how a full pool turns into back-pressure).
    pub fn try_alloc(&self) -> Option<BlockWriter> {
        match self.shared.free.pop() {
            Some(index) => {
                let used = self.shared.blocks - self.shared.free.len();
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
        self.shared.free.len()
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            block_size: self.shared.block_size,
            blocks: self.shared.blocks,
            free: self.shared.free.len(),
            high_water: self.shared.high_water.load(Ordering::Relaxed),
            exhausted: self.shared.exhausted.load(Ordering::Relaxed) as u64,
        }
    }
}

//! Loaned blocks: one writer fills a block front to back while readers share the filled part.
//!
//! This split is what lets a receiver read a socket straight into a block, hand out the
//! complete messages at its head as [`Slice`]s, and keep reading into the tail, with no copy.

use std::sync::Arc;

use crate::pool::PoolShared;

/// A block on loan. Returns to its pool when the writer and every slice of it are dropped.
pub(crate) struct BlockInner {
    pool: Arc<PoolShared>,
    /// Block index (own pool) or return token (a peer's pool).
    index: u32,
    /// Byte offset of the block's first byte in the pool's region.
    base: usize,
}

impl Drop for BlockInner {
    fn drop(&mut self) {
        self.pool.release(self.index);
    }
}

impl BlockInner {
    fn ptr(&self) -> *mut u8 {
        self.pool.ptr_at(self.base)
    }
}

/// The unique writer of a loaned block. Bytes below `filled()` are frozen (readable through
/// slices, never written again); bytes above are writable through `spare_mut`.
pub struct BlockWriter {
    inner: Arc<BlockInner>,
    filled: usize,
}

impl BlockWriter {
    pub(crate) fn new(pool: Arc<PoolShared>, index: u32) -> Self {
        BlockWriter {
            inner: Arc::new(BlockInner {
                base: index as usize * pool.block_size(),
                pool,
                index,
            }),
            filled: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.inner.pool.block_size()
    }

    pub fn filled(&self) -> usize {
        self.filled
    }

    pub fn remaining(&self) -> usize {
        self.capacity() - self.filled
    }

    /// The writable, not yet filled tail of the block.
    pub fn spare_mut(&mut self) -> &mut [u8] {
        let cap = self.capacity();
        // SAFETY: the tail [filled, cap) is never covered by a `Slice` (slices are only made
        // of [0, filled)) and only this writer, which is not Clone and is borrowed mutably
        // here, can reach it; the range lies inside the block.
        unsafe {
            std::slice::from_raw_parts_mut(self.inner.ptr().add(self.filled), cap - self.filled)
        }
    }

    /// The filled head of the block (read-only).
    pub fn filled_bytes(&self) -> &[u8] {
        // SAFETY: [0, filled) is frozen: nobody writes it while the block is on loan.
        unsafe { std::slice::from_raw_parts(self.inner.ptr(), self.filled) }
    }

    /// Marks `n` more bytes of the tail as filled (frozen).
    ///
    /// # Panics
    /// If `n` exceeds the remaining space.
    pub fn advance(&mut self, n: usize) {
        assert!(n <= self.remaining(), "advance past the end of a block");
        self.filled += n;
    }

    /// Appends `data` and returns the slice it now occupies, or `None` if it does not fit.
    pub fn append(&mut self, data: &[u8]) -> Option<Slice> {
        if data.len() > self.remaining() {
            return None;
        }
        let start = self.filled;
        self.spare_mut()[..data.len()].copy_from_slice(data);
        self.advance(data.len());
        Some(self.slice(start, data.len()))
    }

    /// A shared view of `len` filled bytes starting at `offset`.
    ///
    /// # Panics
    /// If the range reaches past the filled part.
    pub fn slice(&self, offset: usize, len: usize) -> Slice {
        assert!(
            offset + len <= self.filled,
            "slice past the filled part of a block"
        );
        Slice {
            inner: self.inner.clone(),
            offset: offset as u32,
            len: len as u32,
        }
    }
}

/// A shared, read-only view of part of a block. Cheap to clone (a reference count).
#[derive(Clone)]
pub struct Slice {
    inner: Arc<BlockInner>,
    offset: u32,
    len: u32,
}

impl Slice {
    /// A view of a peer's shared region (see `RemotePool::slice`).
    pub(crate) fn remote(pool: Arc<PoolShared>, offset: usize, len: usize, token: u32) -> Slice {
        Slice {
            inner: Arc::new(BlockInner {
                pool,
                index: token,
                base: offset,
            }),
            offset: 0,
            len: len as u32,
        }
    }

    /// The pool this slice belongs to (its `Pool::id`).
    pub fn pool_id(&self) -> u64 {
        self.inner.pool.id()
    }

    /// The memfd and size of the shared region this slice lies in (`None`: private memory).
    pub fn shared_region(&self) -> Option<(std::os::fd::BorrowedFd<'_>, usize)> {
        self.inner.pool.shared_fd()
    }

    /// Byte offset of the slice's first byte in its pool's region.
    pub fn region_offset(&self) -> usize {
        self.inner.base + self.offset as usize
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A sub-range of this slice.
    ///
    /// # Panics
    /// If the range reaches past the end of this slice.
    pub fn sub(&self, offset: usize, len: usize) -> Slice {
        assert!(offset + len <= self.len(), "sub-slice out of range");
        Slice {
            inner: self.inner.clone(),
            offset: self.offset + offset as u32,
            len: len as u32,
        }
    }

    /// True when `next` starts right where this slice ends, in the same block.
    pub fn is_followed_by(&self, next: &Slice) -> bool {
        Arc::ptr_eq(&self.inner, &next.inner) && self.offset + self.len == next.offset
    }

    /// Grows this slice over `len` filled bytes of `w` starting at `offset`, when `w` is this
    /// slice's block and they start where it ends; false (nothing changed) otherwise.
    ///
    /// # Panics
    /// If the range reaches past the filled part of the block.
    pub(crate) fn grow_within(&mut self, w: &BlockWriter, offset: usize, len: usize) -> bool {
        assert!(
            offset + len <= w.filled,
            "slice past the filled part of a block"
        );
        if Arc::ptr_eq(&self.inner, &w.inner) && (self.offset + self.len) as usize == offset {
            self.len += len as u32;
            true
        } else {
            false
        }
    }

    /// Joins a slice that `is_followed_by` this one.
    pub fn extend_with(&mut self, next: &Slice) -> bool {
        if self.is_followed_by(next) {
            self.len += next.len;
            true
        } else {
            false
        }
    }

    /// Identity of the underlying block, for tests that prove no copy happened.
    pub fn block_address(&self) -> usize {
        self.inner.ptr() as usize
    }
}

impl std::ops::Deref for Slice {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: a Slice only ever covers filled (frozen) bytes of a block that its Arc keeps
        // on loan, so the bytes are initialised, in bounds and not written while it lives.
        unsafe {
            std::slice::from_raw_parts(
                self.inner.ptr().add(self.offset as usize),
                self.len as usize,
            )
        }
    }
}

impl AsRef<[u8]> for Slice {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for Slice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slice({} bytes @ {})", self.len, self.offset)
    }
}

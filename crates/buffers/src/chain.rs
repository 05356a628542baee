//! Chains: one logical message made of slices of one or more blocks.

use smallvec::SmallVec;

use crate::block::{BlockWriter, Slice};

/// A message larger than a block (or one that straddles two blocks) as a list of slices.
#[derive(Clone, Default, Debug)]
pub struct Chain {
    /// Most chains are one slice (a received fragment's payload): kept inline, no
    /// allocation, and a chain is 32 bytes, which a BU moves several times per fragment
    /// (two inline slices made it 48, and the BU's state machine 7–8 % slower at 256 B:
    /// `examples/bu_pages.rs`). A fragment across a block boundary, or a run of fragments,
    /// spills its slices to the heap.
    slices: SmallVec<[Slice; 1]>,
    len: usize,
}

impl Chain {
    pub fn new() -> Chain {
        Chain::default()
    }

    pub fn from_slice(s: Slice) -> Chain {
        let len = s.len();
        Chain {
            slices: smallvec::smallvec![s],
            len,
        }
    }

    /// Appends `len` filled bytes of `w`'s block from `offset`. When they follow the last
    /// slice in the same block, that slice grows and no reference is taken (an RU writing
    /// small fragments one after another into a block makes one slice of them this way).
    ///
    /// # Panics
    /// If the range reaches past the filled part of the block.
    pub fn push_from(&mut self, w: &BlockWriter, offset: usize, len: usize) {
        if len == 0 {
            return;
        }
        if let Some(last) = self.slices.last_mut() {
            if last.grow_within(w, offset, len) {
                self.len += len;
                return;
            }
        }
        self.push(w.slice(offset, len));
    }

    /// Appends every slice of `other` (moved, not shared again).
    pub fn append(&mut self, other: Chain) {
        for s in other.slices {
            self.push(s);
        }
    }

    /// Appends a slice, merging it with the last one when they are contiguous in one block.
    pub fn push(&mut self, s: Slice) {
        if s.is_empty() {
            return;
        }
        self.len += s.len();
        if let Some(last) = self.slices.last_mut() {
            if last.extend_with(&s) {
                return;
            }
        }
        self.slices.push(s);
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn slices(&self) -> &[Slice] {
        &self.slices
    }

    /// Iterates over the bytes' contiguous pieces.
    pub fn chunks(&self) -> impl Iterator<Item = &[u8]> {
        self.slices.iter().map(|s| &s[..])
    }

    /// CRC32C (Castagnoli) of the whole chain.
    pub fn crc32c(&self) -> u32 {
        self.chunks().fold(0, crc32c::crc32c_append)
    }

    /// Copies the chain into one vector (tests and diagnostics; the data path never does).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for c in self.chunks() {
            v.extend_from_slice(c);
        }
        v
    }

    /// The sub-chain `[offset, offset+len)`, sharing the same blocks.
    ///
    /// # Panics
    /// If the range reaches past the end.
    pub fn sub(&self, mut offset: usize, len: usize) -> Chain {
        assert!(offset + len <= self.len, "sub-chain out of range");
        let mut out = Chain::new();
        let mut want = len;
        for s in &self.slices {
            if want == 0 {
                break;
            }
            if offset >= s.len() {
                offset -= s.len();
                continue;
            }
            let take = (s.len() - offset).min(want);
            out.push(s.sub(offset, take));
            want -= take;
            offset = 0;
        }
        out
    }

    /// Copies the first `dst.len()` bytes into `dst`; false when the chain is shorter.
    pub fn copy_prefix(&self, dst: &mut [u8]) -> bool {
        if dst.len() > self.len {
            return false;
        }
        let mut at = 0;
        for c in self.chunks() {
            if at == dst.len() {
                break;
            }
            let n = c.len().min(dst.len() - at);
            dst[at..at + n].copy_from_slice(&c[..n]);
            at += n;
        }
        true
    }

    /// Compares the chain's bytes with a flat buffer.
    pub fn eq_bytes(&self, other: &[u8]) -> bool {
        if other.len() != self.len {
            return false;
        }
        let mut at = 0;
        for c in self.chunks() {
            if c != &other[at..at + c.len()] {
                return false;
            }
            at += c.len();
        }
        true
    }
}

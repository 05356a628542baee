//! The FRAME ring of one direction of a shm connection: a single-producer single-consumer
//! byte ring in a sealed memfd that both processes map read-write. Layout, entry format and
//! the wake-up rule are in docs/protocol.md ("shm transport"); the constants below are those.
//!
//! The peer can write anything into the ring at any time. The consumer keeps its own copy of
//! the tail and the producer its own copy of the head; every index and length read from the
//! shared memory is checked before it is used, an entry is copied out before it is decoded,
//! and a bad value is an `Err` (the connection is closed with a protocol violation), never a
//! panic or a read outside the mapping.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use thiserror::Error;

use super::sys;

/// What is wrong with a ring the peer shares: its announcement, its memfd or an index or
/// entry it wrote. The connection is closed with this as the violation.
#[derive(Debug, Error)]
pub enum RingError {
    #[error("ring capacity out of range")]
    CapacityRange,
    #[error("ring capacity {0} is not a power of two from {CAPACITY_MIN} to {CAPACITY_MAX}")]
    Capacity(usize),
    #[error("refusing the peer's ring: {0}")]
    Refused(sys::MemfdError),
    #[error("cannot map the peer's ring: {0}")]
    Map(io::Error),
    #[error(
        "the peer's ring header says magic {magic:#x} capacity {announced}, expected \
         {MAGIC:#x} and {cap}"
    )]
    Header {
        magic: u64,
        announced: u64,
        cap: usize,
    },
    #[error("the peer's ring starts at an unaligned tail {0}")]
    UnalignedTail(u64),
    #[error("shm ring: the peer's tail {tail} is impossible (head {head})")]
    Tail { tail: u64, head: u64 },
    #[error("shm ring: the peer's head {head} is impossible (tail {tail})")]
    Head { head: u64, tail: u64 },
    #[error("shm ring: bad entry header (length {len}, reserved {reserved:#x})")]
    EntryHeader { len: usize, reserved: u32 },
    #[error("shm ring: an entry of {len} bytes, but only {avail} bytes are published")]
    EntryLength { len: usize, avail: u64 },
}

/// Bytes of the header before the data area (one page: the data area is page aligned).
pub const HEADER: usize = 4096;
/// "EVBRING1", little-endian, at offset 0.
pub const MAGIC: u64 = u64::from_le_bytes(*b"EVBRING1");
/// Offsets of the header fields (each on its own 64-byte cache line but the first two).
pub const OFF_MAGIC: usize = 0;
pub const OFF_CAPACITY: usize = 8;
pub const OFF_HEAD: usize = 64;
pub const OFF_TAIL: usize = 128;
pub const OFF_SLEEPING: usize = 192;
pub const OFF_WAITING: usize = 256;
/// An entry's header: length u32, reserved u32 (zero).
pub const ENTRY_HEAD: usize = 8;
/// Largest entry payload: one shm packet.
pub const ENTRY_MAX: usize = super::codec::MAX_PACKET;
/// The data area of the rings this side creates: 512 KiB, room for eight entries of the
/// largest size and thousands of small frames (a descriptor frame is ~56 bytes), so that
/// a busy sender rarely waits, while a node with a hundred connections maps 100 MiB of
/// address space at most, touched only as far as it is used.
pub const CAPACITY: usize = 512 * 1024;
/// The capacities a peer may announce: a power of two in this range (the smallest holds
/// three entries of the largest size).
pub const CAPACITY_MIN: usize = 256 * 1024;
pub const CAPACITY_MAX: usize = 64 << 20;

/// Bytes an entry of `len` payload bytes takes in the ring: its header and the payload
/// rounded up to a multiple of 8.
pub fn entry_size(len: usize) -> usize {
    ENTRY_HEAD + len.div_ceil(8) * 8
}

/// A read-write shared mapping of a ring memfd.
struct Mapping {
    ptr: *mut u8,
    len: usize,
    /// The memfd, while it is still to be passed (ours); the mapping outlives it, so it is
    /// closed as soon as possible (a node then holds no descriptor per connection for rings).
    fd: Option<OwnedFd>,
}

// SAFETY: the mapping is plain shared memory, reached only through atomics and bounded
// copies; moving its owner to another thread changes nothing about that.
unsafe impl Send for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are the mapping made in `Mapping::new`, unmapped only here.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl Mapping {
    fn new(fd: OwnedFd, len: usize) -> io::Result<Mapping> {
        let ptr = sys::map_shared_rw(fd.as_raw_fd(), len)?;
        Ok(Mapping {
            ptr,
            len,
            fd: Some(fd),
        })
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= HEADER && HEADER <= self.len);
        // SAFETY: `off` is 8-aligned and inside the header of the mapping (asserted; the
        // mapping is page aligned), the mapping lives as long as `self`, and the word is only
        // ever accessed atomically by this process.
        unsafe { &*self.ptr.add(off).cast::<AtomicU64>() }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && off + 4 <= self.len);
        // SAFETY: as for `u64_at`: aligned, inside the mapping, accessed atomically only.
        unsafe { &*self.ptr.add(off).cast::<AtomicU32>() }
    }

    /// The data area: `cap` bytes after the header.
    fn data(&self) -> *mut u8 {
        // SAFETY: HEADER < len (checked at creation and at mapping), so the pointer stays in
        // the mapping.
        unsafe { self.ptr.add(HEADER) }
    }
}

/// Copies `dst.len()` bytes out of the data area starting at ring position `pos` (wrapping at
/// `cap`). `dst.len() <= cap`.
fn copy_out(m: &Mapping, cap: usize, pos: u64, dst: &mut [u8]) {
    assert!(dst.len() <= cap && HEADER + cap <= m.len);
    let at = (pos % cap as u64) as usize;
    let first = dst.len().min(cap - at);
    // SAFETY: [at, at + first) and [0, dst.len() - first) lie inside the data area of `cap`
    // bytes, which lies inside the mapping (asserted). The peer may be writing these bytes
    // at the same time (a hostile one): they are copied once, as plain bytes, into our own
    // buffer, and only the copy is looked at.
    unsafe {
        std::ptr::copy_nonoverlapping(m.data().add(at), dst.as_mut_ptr(), first);
        std::ptr::copy_nonoverlapping(m.data(), dst.as_mut_ptr().add(first), dst.len() - first);
    }
}

/// Copies `src` into the data area at ring position `pos` (wrapping at `cap`).
fn copy_in(m: &Mapping, cap: usize, pos: u64, src: &[u8]) {
    assert!(src.len() <= cap && HEADER + cap <= m.len);
    let at = (pos % cap as u64) as usize;
    let first = src.len().min(cap - at);
    // SAFETY: both ranges lie inside the data area, inside the mapping (asserted); the bytes
    // are not published yet, so an honest consumer does not read them.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), m.data().add(at), first);
        std::ptr::copy_nonoverlapping(src.as_ptr().add(first), m.data(), src.len() - first);
    }
}

/// Our end of a ring we write: created here, its memfd passed to the peer (RING packet).
pub struct TxRing {
    m: Mapping,
    cap: usize,
    /// Bytes published: our own copy, authoritative (the shared one may be overwritten).
    head: u64,
}

impl TxRing {
    pub fn create() -> io::Result<TxRing> {
        Self::with_capacity(CAPACITY)
    }

    pub fn with_capacity(cap: usize) -> io::Result<TxRing> {
        assert!(cap.is_power_of_two() && (CAPACITY_MIN..=CAPACITY_MAX).contains(&cap));
        let fd = sys::sealed_memfd(c"evb-shm-ring", HEADER + cap)?;
        let m = Mapping::new(fd, HEADER + cap)?;
        m.u64_at(OFF_MAGIC).store(MAGIC, Ordering::Relaxed);
        m.u64_at(OFF_CAPACITY).store(cap as u64, Ordering::Relaxed);
        Ok(TxRing { m, cap, head: 0 })
    }

    /// The memfd to pass with the RING packet (until `passed`).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.m.fd.as_ref().map(|f| f.as_fd())
    }

    /// The RING packet is sent: the descriptor is closed (the mapping stays).
    pub fn passed(&mut self) {
        self.m.fd = None;
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Free bytes, from the consumer's tail; `Err` if the tail cannot be right.
    fn free(&self) -> Result<usize, RingError> {
        let tail = self.m.u64_at(OFF_TAIL).load(Ordering::Acquire);
        let used = self.head.wrapping_sub(tail);
        if used > self.cap as u64 || !used.is_multiple_of(8) {
            return Err(RingError::Tail {
                tail,
                head: self.head,
            });
        }
        Ok(self.cap - used as usize)
    }

    /// Publishes one entry; `Ok(false)` if the ring has no room for it now.
    pub fn push(&mut self, bytes: &[u8]) -> Result<bool, RingError> {
        assert!(!bytes.is_empty() && bytes.len() <= ENTRY_MAX);
        let need = entry_size(bytes.len());
        if self.free()? < need {
            return Ok(false);
        }
        let mut head = [0u8; ENTRY_HEAD];
        head[..4].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
        copy_in(&self.m, self.cap, self.head, &head);
        copy_in(&self.m, self.cap, self.head + ENTRY_HEAD as u64, bytes);
        let pad = need - ENTRY_HEAD - bytes.len();
        if pad > 0 {
            let at = self.head + (ENTRY_HEAD + bytes.len()) as u64;
            copy_in(&self.m, self.cap, at, &[0u8; 8][..pad]);
        }
        self.head += need as u64;
        self.m.u64_at(OFF_HEAD).store(self.head, Ordering::Release);
        Ok(true)
    }

    /// After publishing: whether the consumer asked to be woken (it is then owed a DOORBELL;
    /// the flag is cleared here).
    pub fn wake_needed(&self) -> bool {
        // pairs with the consumer's fence between setting the flag and reading the head
        fence(Ordering::SeqCst);
        let f = self.m.u32_at(OFF_SLEEPING);
        f.load(Ordering::Relaxed) != 0 && f.swap(0, Ordering::SeqCst) != 0
    }

    /// The ring is full: asks the consumer for a DOORBELL when it makes room. `Ok(true)` if
    /// room for `len` bytes appeared meanwhile (the flag is then withdrawn).
    pub fn wait_for_room(&self, len: usize) -> Result<bool, RingError> {
        let w = self.m.u32_at(OFF_WAITING);
        w.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.free()? >= entry_size(len) {
            w.store(0, Ordering::Relaxed);
            return Ok(true);
        }
        Ok(false)
    }
}

/// Our end of a ring the peer writes: mapped from the memfd of its RING packet.
pub struct RxRing {
    m: Mapping,
    cap: usize,
    /// Bytes consumed: our own copy, authoritative.
    tail: u64,
    /// We set the sleeping flag and have not cleared it since.
    armed: bool,
    /// Entries consumed since the producer's waiting flag was last looked at.
    consumed: bool,
}

impl RxRing {
    /// Checks and maps a peer's ring memfd announced with `cap` bytes of data area.
    pub fn map(fd: OwnedFd, cap: u64) -> Result<RxRing, RingError> {
        let cap = usize::try_from(cap).map_err(|_| RingError::CapacityRange)?;
        if !cap.is_power_of_two() || !(CAPACITY_MIN..=CAPACITY_MAX).contains(&cap) {
            return Err(RingError::Capacity(cap));
        }
        sys::check_peer_memfd(fd.as_raw_fd(), HEADER + cap).map_err(RingError::Refused)?;
        let mut m = Mapping::new(fd, HEADER + cap).map_err(RingError::Map)?;
        // mapped: the descriptor is not needed any more
        m.fd = None;
        let magic = m.u64_at(OFF_MAGIC).load(Ordering::Relaxed);
        let announced = m.u64_at(OFF_CAPACITY).load(Ordering::Relaxed);
        if magic != MAGIC || announced != cap as u64 {
            return Err(RingError::Header {
                magic,
                announced,
                cap,
            });
        }
        let tail = m.u64_at(OFF_TAIL).load(Ordering::Relaxed);
        if !tail.is_multiple_of(8) {
            return Err(RingError::UnalignedTail(tail));
        }
        Ok(RxRing {
            m,
            cap,
            tail,
            armed: false,
            consumed: false,
        })
    }

    /// Bytes published and not consumed; `Err` if the producer's head cannot be right.
    fn available(&self) -> Result<u64, RingError> {
        let head = self.m.u64_at(OFF_HEAD).load(Ordering::Acquire);
        let avail = head.wrapping_sub(self.tail);
        if avail > self.cap as u64 || !avail.is_multiple_of(8) {
            return Err(RingError::Head {
                head,
                tail: self.tail,
            });
        }
        Ok(avail)
    }

    /// Whether an entry (or garbage, reported by `pop`) is waiting: one load.
    pub fn has_data(&self) -> bool {
        self.m.u64_at(OFF_HEAD).load(Ordering::Relaxed) != self.tail
    }

    /// The next entry, copied out; `Ok(None)` when the ring is empty.
    pub fn pop(&mut self) -> Result<Option<Vec<u8>>, RingError> {
        let avail = self.available()?;
        if avail == 0 {
            return Ok(None);
        }
        let mut head = [0u8; ENTRY_HEAD];
        copy_out(&self.m, self.cap, self.tail, &mut head);
        let len = u32::from_le_bytes(head[..4].try_into().expect("4")) as usize;
        let reserved = u32::from_le_bytes(head[4..].try_into().expect("4"));
        if len == 0 || len > ENTRY_MAX || reserved != 0 {
            return Err(RingError::EntryHeader { len, reserved });
        }
        let need = entry_size(len) as u64;
        if need > avail {
            return Err(RingError::EntryLength { len, avail });
        }
        let mut bytes = vec![0u8; len];
        copy_out(&self.m, self.cap, self.tail + ENTRY_HEAD as u64, &mut bytes);
        self.tail += need;
        self.m.u64_at(OFF_TAIL).store(self.tail, Ordering::Release);
        self.consumed = true;
        Ok(Some(bytes))
    }

    /// After consuming: whether the producer waits for room (it is then owed a DOORBELL;
    /// the flag is cleared here).
    pub fn room_wanted(&mut self) -> bool {
        if !std::mem::take(&mut self.consumed) {
            return false;
        }
        fence(Ordering::SeqCst);
        let w = self.m.u32_at(OFF_WAITING);
        w.load(Ordering::Relaxed) != 0 && w.swap(0, Ordering::SeqCst) != 0
    }

    /// Before blocking: sets the sleeping flag, then looks again. `true` if the ring is not
    /// empty (the flag is withdrawn: do not block).
    pub fn arm(&mut self) -> bool {
        let f = self.m.u32_at(OFF_SLEEPING);
        f.store(1, Ordering::SeqCst);
        self.armed = true;
        // pairs with the producer's fence between publishing and reading the flag: either it
        // sees the flag, or we see its entry
        fence(Ordering::SeqCst);
        if self.has_data() {
            self.disarm();
            return true;
        }
        false
    }

    /// Awake again: clears the sleeping flag if we set it.
    pub fn disarm(&mut self) {
        if std::mem::take(&mut self.armed) {
            self.m.u32_at(OFF_SLEEPING).store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
impl RxRing {
    /// The raw mapping, for tests that play a hostile producer.
    pub(super) fn poke_u64(&self, off: usize, v: u64) {
        self.m.u64_at(off).store(v, Ordering::SeqCst);
    }
    pub(super) fn consumed(&self) -> u64 {
        self.tail
    }
    pub(super) fn poke_data(&self, pos: u64, bytes: &[u8]) {
        copy_in(&self.m, self.cap, pos, bytes);
    }
}

#[cfg(test)]
impl TxRing {
    pub(super) fn poke_u64(&self, off: usize, v: u64) {
        self.m.u64_at(off).store(v, Ordering::SeqCst);
    }
    pub(super) fn dup_fd(&self) -> OwnedFd {
        self.m
            .fd
            .as_ref()
            .expect("not passed yet")
            .try_clone()
            .expect("dup")
    }
}

//! Send side: a queue of frames per connection, written with vectored writes straight from
//! the segments (pool slices stay shared until the kernel has taken their bytes).

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};

use evb_wire::{FrameType, FRAME_HEADER_LEN};

use crate::framing::TxSeq;
use crate::Segment;

/// iovecs per writev: enough to batch many frames, well under IOV_MAX.
const MAX_IOV: usize = 128;

struct OutFrame {
    header: [u8; FRAME_HEADER_LEN],
    segments: Vec<Segment>,
    len: usize,
}

#[derive(Default)]
pub(crate) struct TxQueue {
    frames: VecDeque<OutFrame>,
    /// Bytes of the front frame already written.
    head_written: usize,
    bytes: usize,
    seq: TxSeq,
    pub(crate) total_bytes: u64,
}

impl TxQueue {
    pub(crate) fn push(&mut self, frame_type: FrameType, count: u32, segments: Vec<Segment>) {
        let payload: usize = segments.iter().map(Segment::len).sum();
        let header = self.seq.header(frame_type, payload, count);
        self.queue(header, segments, payload);
    }

    /// A frame in protocol `version`'s header: only to refuse a peer of an older version in
    /// frames it can read.
    pub(crate) fn push_as(
        &mut self,
        version: u16,
        frame_type: FrameType,
        count: u32,
        segments: Vec<Segment>,
    ) {
        let payload: usize = segments.iter().map(Segment::len).sum();
        let header = self.seq.header_as(version, frame_type, payload, count);
        self.queue(header, segments, payload);
    }

    fn queue(&mut self, header: [u8; FRAME_HEADER_LEN], segments: Vec<Segment>, payload: usize) {
        let len = FRAME_HEADER_LEN + payload;
        self.bytes += len;
        self.frames.push_back(OutFrame {
            header,
            segments,
            len,
        });
    }

    /// An empty queue whose frames continue this one's sequence numbers.
    pub(crate) fn continuation(&self) -> TxQueue {
        TxQueue {
            seq: self.seq,
            ..TxQueue::default()
        }
    }

    /// Moves every queued frame to the back of `other`, in order (sequence numbers stay
    /// with `self`; `self` must not be partly written).
    pub(crate) fn move_into(&mut self, other: &mut TxQueue) {
        debug_assert_eq!(self.head_written, 0);
        other.bytes += self.bytes;
        self.bytes = 0;
        other.frames.append(&mut self.frames);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Writes until the queue is empty (true) or the writer would block (false).
    pub(crate) fn write_to<W: Write>(&mut self, w: &mut W) -> io::Result<bool> {
        loop {
            if self.frames.is_empty() {
                return Ok(true);
            }
            let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(MAX_IOV);
            let mut skip = self.head_written;
            'frames: for f in &self.frames {
                let pieces =
                    std::iter::once(&f.header[..]).chain(f.segments.iter().map(Segment::bytes));
                for p in pieces {
                    if skip >= p.len() {
                        skip -= p.len();
                        continue;
                    }
                    iov.push(IoSlice::new(&p[skip..]));
                    skip = 0;
                    if iov.len() == MAX_IOV {
                        break 'frames;
                    }
                }
            }
            let n = match w.write_vectored(&iov) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            drop(iov);
            self.advance(n);
        }
    }

    fn advance(&mut self, mut n: usize) {
        self.bytes -= n;
        self.total_bytes += n as u64;
        while n > 0 {
            let front = self.frames.front().expect("wrote more than was queued");
            let left = front.len - self.head_written;
            if n >= left {
                n -= left;
                self.head_written = 0;
                self.frames.pop_front();
            } else {
                self.head_written += n;
                n = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evb_wire::FrameHeader;

    /// A writer that takes at most `cap` bytes per call and blocks after `calls` calls.
    struct Choppy {
        out: Vec<u8>,
        cap: usize,
        calls: usize,
    }

    impl Write for Choppy {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.write_vectored(&[IoSlice::new(buf)])
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            if self.calls == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.calls -= 1;
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(self.cap - n);
                self.out.extend_from_slice(&b[..take]);
                n += take;
                if n == self.cap {
                    break;
                }
            }
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn partial_writes_resume_where_they_stopped() {
        let mut q = TxQueue::default();
        for i in 0..50u8 {
            q.push(
                FrameType::Messages,
                1,
                vec![Segment::Owned(vec![i; i as usize]), Segment::Owned(vec![])],
            );
        }
        let total = q.bytes();
        let mut w = Choppy {
            out: Vec::new(),
            cap: 13,
            calls: 5,
        };
        assert!(!q.write_to(&mut w).unwrap());
        assert_eq!(q.bytes(), total - 65);
        w.calls = usize::MAX;
        assert!(q.write_to(&mut w).unwrap());
        assert_eq!(w.out.len(), total);
        // the stream parses back into the same frames
        let mut at = 0;
        for i in 0..50u8 {
            let h = FrameHeader::decode(&w.out[at..], 1 << 20).unwrap();
            assert_eq!(h.sequence, i as u64);
            at += FRAME_HEADER_LEN;
            assert!(w.out[at..at + i as usize].iter().all(|&b| b == i));
            at += i as usize;
        }
    }
}

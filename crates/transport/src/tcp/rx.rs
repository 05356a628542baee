//! Receive side: reads a byte stream straight into receive-pool blocks and has the framing
//! layer (`crate::framing`) cut it into frames. A frame's payload is a chain of slices of
//! those blocks, never copied; only a header split across two blocks (at most 23 bytes) is
//! moved to the next block.

use std::io::{self, Read};

use evb_buffers::{BlockWriter, Pool};
use evb_wire::{FrameHeader, WireError, FRAME_HEADER_LEN};

use crate::framing::{Admit, RxFramer};
use crate::InFrame;

/// Below this much room left in a block, start the next frame header in a fresh block.
const MIN_READ: usize = 4096;

#[derive(Debug)]
pub(crate) enum RxError {
    Io(io::Error),
    Wire(WireError),
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReadOutcome {
    /// The socket has nothing more for now.
    WouldBlock,
    /// The peer closed its side.
    Eof,
    /// The receive pool is empty: reading resumes when blocks come back.
    Starved,
    /// Read budget used up; more may be waiting.
    Budget,
}

/// What reading one handshake frame gave.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HandshakeRead {
    /// A whole handshake frame, read into a small buffer of its own (never from the pool).
    Frame(FrameHeader, Vec<u8>),
    WouldBlock,
    Eof,
}

/// A handshake frame being read: header first, then exactly its payload, so not one byte of
/// what follows the handshake is consumed here.
#[derive(Default)]
struct SmallFrame {
    header: [u8; FRAME_HEADER_LEN],
    have: usize,
    decoded: Option<FrameHeader>,
    payload: Vec<u8>,
}

pub(crate) struct RxAssembler {
    pool: Pool,
    max_frame: u32,
    block: Option<BlockWriter>,
    parsed: usize,
    framer: RxFramer,
    pub(crate) bytes: u64,
    small: SmallFrame,
}

impl RxAssembler {
    pub(crate) fn new(pool: Pool, max_frame: u32) -> Self {
        assert!(
            pool.block_size() >= 2 * FRAME_HEADER_LEN,
            "receive blocks too small"
        );
        RxAssembler {
            pool,
            max_frame,
            block: None,
            parsed: 0,
            framer: RxFramer::default(),
            bytes: 0,
            small: SmallFrame::default(),
        }
    }

    /// Reads at most one handshake frame of at most `limit` payload bytes into a buffer of
    /// its own: before a peer is admitted it gets no receive-pool block, and a header that
    /// declares more than `limit` is an error at once.
    pub(crate) fn read_handshake<R: Read>(
        &mut self,
        src: &mut R,
        limit: u32,
    ) -> Result<HandshakeRead, RxError> {
        debug_assert!(self.block.is_none(), "handshake after pool reads");
        let s = &mut self.small;
        loop {
            let (buf, at) = match s.decoded {
                None => (&mut s.header[..], s.have),
                Some(_) => (&mut s.payload[..], s.have),
            };
            if at < buf.len() {
                match src.read(&mut buf[at..]) {
                    Ok(0) => return Ok(HandshakeRead::Eof),
                    Ok(n) => {
                        s.have += n;
                        self.bytes += n as u64;
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return Ok(HandshakeRead::WouldBlock)
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(RxError::Io(e)),
                }
            }
            match s.decoded {
                None => {
                    let header = self
                        .framer
                        .header(&s.header, limit.min(self.max_frame))
                        .map_err(RxError::Wire)?;
                    s.decoded = Some(header);
                    s.payload = vec![0; header.length as usize];
                    s.have = 0;
                }
                Some(header) => {
                    let payload = std::mem::take(&mut s.payload);
                    *s = SmallFrame::default();
                    return Ok(HandshakeRead::Frame(header, payload));
                }
            }
        }
    }

    /// Makes sure there is a block with room to read into; false if the pool is empty.
    fn ensure_space(&mut self) -> bool {
        let need_new = match &self.block {
            None => true,
            Some(b) => {
                b.remaining() == 0
                    || (!self.framer.in_frame() && b.remaining() < MIN_READ.min(b.capacity() / 4))
            }
        };
        if !need_new {
            return true;
        }
        let Some(mut next) = self.pool.try_alloc() else {
            return false;
        };
        if let Some(old) = self.block.take() {
            // Payload bytes are taken as they arrive, so what is left is a partial header.
            let leftover = &old.filled_bytes()[self.parsed..];
            debug_assert!(leftover.len() < FRAME_HEADER_LEN);
            let _ = next.append(leftover);
        }
        self.parsed = 0;
        self.block = Some(next);
        true
    }

    /// Reads from `src` (at most `budget` reads) and appends complete frames to `out`.
    pub(crate) fn read_from<R: Read>(
        &mut self,
        src: &mut R,
        out: &mut Vec<InFrame>,
        budget: usize,
    ) -> Result<ReadOutcome, RxError> {
        for _ in 0..budget {
            if !self.ensure_space() {
                return Ok(ReadOutcome::Starved);
            }
            let block = self.block.as_mut().expect("ensured");
            match src.read(block.spare_mut()) {
                Ok(0) => return Ok(ReadOutcome::Eof),
                Ok(n) => {
                    block.advance(n);
                    self.bytes += n as u64;
                    self.cut_frames(out)?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Ok(ReadOutcome::WouldBlock)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(RxError::Io(e)),
            }
        }
        Ok(ReadOutcome::Budget)
    }

    fn cut_frames(&mut self, out: &mut Vec<InFrame>) -> Result<(), RxError> {
        let block = self.block.as_ref().expect("block present while cutting");
        self.framer
            .cut(block, &mut self.parsed, self.max_frame, out, |_, _| {
                Ok(Admit::Take)
            })
            .map_err(RxError::Wire)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evb_wire::FrameType;

    /// A reader that hands out its bytes in pieces of the given sizes.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        sizes: Vec<usize>,
        i: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.at == self.data.len() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let want = self.sizes[self.i % self.sizes.len()].max(1);
            self.i += 1;
            let n = want.min(buf.len()).min(self.data.len() - self.at);
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    fn stream(payloads: &[Vec<u8>]) -> Vec<u8> {
        let mut v = Vec::new();
        for (i, p) in payloads.iter().enumerate() {
            v.extend_from_slice(
                &FrameHeader::new(FrameType::Messages, p.len() as u32, 1, i as u64).encode(),
            );
            v.extend_from_slice(p);
        }
        v
    }

    #[test]
    fn frames_survive_any_read_split_and_span_blocks() {
        let payloads: Vec<Vec<u8>> = (0..40u32)
            .map(|i| (0..(i * 37 % 700)).map(|b| (b ^ i) as u8).collect())
            .collect();
        for sizes in [vec![1], vec![7, 3, 100], vec![23, 24, 25], vec![4096]] {
            let pool = Pool::new("rx", 256, 256);
            let mut rx = RxAssembler::new(pool.clone(), 1 << 20);
            let mut src = Trickle {
                data: stream(&payloads),
                at: 0,
                sizes,
                i: 0,
            };
            let mut out = Vec::new();
            loop {
                match rx.read_from(&mut src, &mut out, 1000).unwrap() {
                    ReadOutcome::WouldBlock => break,
                    ReadOutcome::Budget => continue,
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(out.len(), payloads.len());
            for (f, p) in out.iter().zip(&payloads) {
                assert_eq!(&f.payload.to_vec(), p);
            }
        }
    }

    #[test]
    fn oversized_and_out_of_sequence_frames_are_errors() {
        let pool = Pool::new("rx", 256, 8);
        let mut rx = RxAssembler::new(pool.clone(), 100);
        let mut src = Trickle {
            data: stream(&[vec![0; 101]]),
            at: 0,
            sizes: vec![4096],
            i: 0,
        };
        let r = rx.read_from(&mut src, &mut Vec::new(), 10);
        assert!(matches!(
            r,
            Err(RxError::Wire(WireError::FrameTooLarge { .. }))
        ));

        let mut rx = RxAssembler::new(pool, 1000);
        let mut data = FrameHeader::new(FrameType::Messages, 0, 0, 0)
            .encode()
            .to_vec();
        data.extend_from_slice(&FrameHeader::new(FrameType::Messages, 0, 0, 5).encode());
        let mut src = Trickle {
            data,
            at: 0,
            sizes: vec![4096],
            i: 0,
        };
        let r = rx.read_from(&mut src, &mut Vec::new(), 10);
        assert!(matches!(
            r,
            Err(RxError::Wire(WireError::Sequence {
                got: 5,
                expected: 1
            }))
        ));
    }

    #[test]
    fn empty_pool_starves_instead_of_allocating() {
        let pool = Pool::new("rx", 128, 1);
        let held = pool.try_alloc().unwrap();
        let mut rx = RxAssembler::new(pool.clone(), 1000);
        let mut src = Trickle {
            data: stream(&[vec![1; 10]]),
            at: 0,
            sizes: vec![4096],
            i: 0,
        };
        let mut out = Vec::new();
        assert_eq!(
            rx.read_from(&mut src, &mut out, 10).unwrap(),
            ReadOutcome::Starved
        );
        drop(held);
        assert_eq!(
            rx.read_from(&mut src, &mut out, 10).unwrap(),
            ReadOutcome::WouldBlock
        );
        assert_eq!(out.len(), 1);
    }
}

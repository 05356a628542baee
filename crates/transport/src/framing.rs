//! Framing shared by the stream-like transports (`tcp`, `ofi`), free of IO: received bytes
//! in (the filled part of a receive-pool block), whole frames or a typed [`WireError`] out;
//! outgoing frame headers numbered in sequence. No sockets, no clock.
//!
//! A received frame's payload is a chain of slices of the blocks it arrived in, never
//! copied. Every frame header is decoded with the connection's size limit and must carry the
//! next sequence number.

use evb_buffers::{BlockWriter, Chain};
use evb_wire::{FrameHeader, FrameType, WireError, FRAME_HEADER_LEN};

use crate::InFrame;

/// Numbers outgoing frames: each header carries the next sequence number, from 0.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct TxSeq {
    next: u64,
}

impl TxSeq {
    /// The encoded header of the next frame, of `payload` bytes.
    pub(crate) fn header(
        &mut self,
        frame_type: FrameType,
        payload: usize,
        count: u32,
    ) -> [u8; FRAME_HEADER_LEN] {
        self.header_as(evb_wire::PROTOCOL_VERSION, frame_type, payload, count)
    }

    /// The same in an older protocol `version`'s header (a refusal the peer can read).
    pub(crate) fn header_as(
        &mut self,
        version: u16,
        frame_type: FrameType,
        payload: usize,
        count: u32,
    ) -> [u8; FRAME_HEADER_LEN] {
        let header =
            FrameHeader::new(frame_type, payload as u32, count, self.next).encode_as(version);
        self.next += 1;
        header
    }
}

/// What the caller's header check decides about the next frame (see [`RxFramer::cut`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Cut it.
    Take,
    /// Stop before its header; `cut` returns [`Cut::Paused`] with the position left there.
    Pause,
}

/// Where [`RxFramer::cut`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// Every byte is taken (the last frame may still wait for more payload).
    Done,
    /// Fewer bytes than a frame header are left: the start of the next header.
    PartialHeader,
    /// The header check asked to stop before the next header.
    Paused,
}

/// A frame whose header is read and whose payload is still arriving.
struct Pending {
    header: FrameHeader,
    payload: Chain,
    remaining: usize,
}

/// Cuts received bytes into frames, checking each header's size limit and sequence number.
#[derive(Default)]
pub(crate) struct RxFramer {
    pending: Option<Pending>,
    expected_seq: u64,
}

impl RxFramer {
    /// A frame's payload is still arriving.
    pub(crate) fn in_frame(&self) -> bool {
        self.pending.is_some()
    }

    /// Decodes the next frame header from `bytes` with payload limit `max` and checks its
    /// sequence number (then counted as seen). For a frame read outside [`RxFramer::cut`]
    /// (a handshake frame read into a buffer of its own).
    pub(crate) fn header(&mut self, bytes: &[u8], max: u32) -> Result<FrameHeader, WireError> {
        let header = FrameHeader::decode(bytes, max)?;
        self.sequence(&header)?;
        Ok(header)
    }

    fn sequence(&mut self, header: &FrameHeader) -> Result<(), WireError> {
        if header.sequence != self.expected_seq {
            return Err(WireError::Sequence {
                got: header.sequence,
                expected: self.expected_seq,
            });
        }
        self.expected_seq += 1;
        Ok(())
    }

    /// Cuts the filled part of `block` from `*at` into frames appended to `out`, advancing
    /// `*at` over what it took. Each header is decoded with limit `max_frame`, then shown to
    /// `check` (with the frames cut so far) before its sequence number is checked.
    pub(crate) fn cut<F>(
        &mut self,
        block: &BlockWriter,
        at: &mut usize,
        max_frame: u32,
        out: &mut Vec<InFrame>,
        mut check: F,
    ) -> Result<Cut, WireError>
    where
        F: FnMut(&FrameHeader, &[InFrame]) -> Result<Admit, WireError>,
    {
        let len = block.filled();
        loop {
            if let Some(p) = &mut self.pending {
                let take = (len - *at).min(p.remaining);
                if take > 0 {
                    p.payload.push(block.slice(*at, take));
                    *at += take;
                    p.remaining -= take;
                }
                if p.remaining > 0 {
                    return Ok(Cut::Done);
                }
                let Some(p) = self.pending.take() else {
                    return Ok(Cut::Done);
                };
                out.push(InFrame {
                    frame_type: p.header.frame_type,
                    count: p.header.count,
                    sequence: p.header.sequence,
                    payload: p.payload,
                });
            } else {
                if *at == len {
                    return Ok(Cut::Done);
                }
                if len - *at < FRAME_HEADER_LEN {
                    return Ok(Cut::PartialHeader);
                }
                let bytes = &block.filled_bytes()[*at..*at + FRAME_HEADER_LEN];
                let header = FrameHeader::decode(bytes, max_frame)?;
                if check(&header, out)? == Admit::Pause {
                    return Ok(Cut::Paused);
                }
                self.sequence(&header)?;
                *at += FRAME_HEADER_LEN;
                self.pending = Some(Pending {
                    header,
                    payload: Chain::new(),
                    remaining: header.length as usize,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evb_buffers::Pool;

    fn take_all(_: &FrameHeader, _: &[InFrame]) -> Result<Admit, WireError> {
        Ok(Admit::Take)
    }

    fn stream(payloads: &[Vec<u8>]) -> Vec<u8> {
        let mut seq = TxSeq::default();
        let mut v = Vec::new();
        for p in payloads {
            v.extend_from_slice(&seq.header(FrameType::Messages, p.len(), 3));
            v.extend_from_slice(p);
        }
        v
    }

    /// Feeds `pieces` one block each, carrying a partial header over to the next block as a
    /// stream reader does.
    fn feed(pieces: &[&[u8]], max: u32) -> Result<Vec<InFrame>, WireError> {
        let pool = Pool::new("framing", 4096, 64);
        let mut rx = RxFramer::default();
        let mut out = Vec::new();
        let mut carry: Vec<u8> = Vec::new();
        for piece in pieces {
            let mut b = pool.try_alloc().expect("block");
            b.append(&carry).expect("fits");
            b.append(piece).expect("fits");
            let mut at = 0;
            match rx.cut(&b, &mut at, max, &mut out, take_all)? {
                Cut::Done => carry.clear(),
                Cut::PartialHeader => carry = b.filled_bytes()[at..].to_vec(),
                Cut::Paused => unreachable!("never paused"),
            }
        }
        Ok(out)
    }

    #[test]
    fn sequence_numbers_count_from_zero() {
        let mut seq = TxSeq::default();
        for i in 0..3u64 {
            let h = seq.header(FrameType::Messages, 7, 1);
            let d = FrameHeader::decode(&h, 100).unwrap();
            assert_eq!((d.sequence, d.length, d.count), (i, 7, 1));
        }
    }

    #[test]
    fn a_stream_split_at_every_byte_gives_the_same_frames() {
        let payloads: Vec<Vec<u8>> = vec![vec![1; 5], vec![], vec![9; 40], vec![4; 1]];
        let data = stream(&payloads);
        for cut in 0..=data.len() {
            let out = feed(&[&data[..cut], &data[cut..]], 1000).unwrap();
            assert_eq!(out.len(), payloads.len(), "split at {cut}");
            for (i, (f, p)) in out.iter().zip(&payloads).enumerate() {
                assert_eq!(f.sequence, i as u64);
                assert_eq!(f.count, 3);
                assert_eq!(&f.payload.to_vec(), p);
            }
        }
        // one byte at a time: every header split every way
        let bytes: Vec<&[u8]> = data.chunks(1).collect();
        assert_eq!(feed(&bytes, 1000).unwrap().len(), payloads.len());
    }

    #[test]
    fn a_partial_header_is_left_for_more_bytes() {
        let pool = Pool::new("framing", 4096, 4);
        let data = stream(&[vec![7; 3]]);
        let mut b = pool.try_alloc().unwrap();
        b.append(&data[..FRAME_HEADER_LEN - 1]).unwrap();
        let mut rx = RxFramer::default();
        let mut at = 0;
        let r = rx.cut(&b, &mut at, 100, &mut Vec::new(), take_all);
        assert_eq!(r, Ok(Cut::PartialHeader));
        assert_eq!(at, 0);
        assert!(!rx.in_frame());
    }

    #[test]
    fn a_sequence_gap_is_an_error() {
        let mut data = FrameHeader::new(FrameType::Messages, 0, 0, 0)
            .encode()
            .to_vec();
        data.extend_from_slice(&FrameHeader::new(FrameType::Messages, 0, 0, 2).encode());
        let r = feed(&[&data], 100);
        assert!(matches!(
            r,
            Err(WireError::Sequence {
                got: 2,
                expected: 1
            })
        ));
        let mut rx = RxFramer::default();
        let h = FrameHeader::new(FrameType::Hello, 0, 0, 1).encode();
        assert!(matches!(
            rx.header(&h, 100),
            Err(WireError::Sequence {
                got: 1,
                expected: 0
            })
        ));
    }

    #[test]
    fn bad_headers_are_typed_errors() {
        let big = stream(&[vec![0; 101]]);
        assert!(matches!(
            feed(&[&big], 100),
            Err(WireError::FrameTooLarge { .. })
        ));
        let mut garbage = stream(&[vec![1; 4]]);
        garbage[0] ^= 0xff;
        assert!(feed(&[&garbage], 100).is_err());
        let mut rx = RxFramer::default();
        assert!(rx.header(&garbage[..FRAME_HEADER_LEN], 100).is_err());
    }

    #[test]
    fn the_check_sees_each_header_and_may_pause() {
        let pool = Pool::new("framing", 4096, 4);
        let data = stream(&[vec![1; 2], vec![2; 2]]);
        let mut b = pool.try_alloc().unwrap();
        b.append(&data).unwrap();
        let mut rx = RxFramer::default();
        let mut at = 0;
        let mut out = Vec::new();
        let pause_second = |_: &FrameHeader, cut: &[InFrame]| {
            Ok(if cut.is_empty() {
                Admit::Take
            } else {
                Admit::Pause
            })
        };
        assert_eq!(
            rx.cut(&b, &mut at, 100, &mut out, pause_second),
            Ok(Cut::Paused)
        );
        assert_eq!((out.len(), at), (1, FRAME_HEADER_LEN + 2));
        out.clear();
        let r = rx.cut(&b, &mut at, 100, &mut out, take_all);
        assert_eq!(r, Ok(Cut::Done));
        assert_eq!(out[0].sequence, 1);
        let refuse = |h: &FrameHeader, _: &[InFrame]| {
            Err(WireError::OutOfRange {
                what: "test",
                value: h.sequence,
            })
        };
        let mut rx = RxFramer::default();
        let mut at = 0;
        assert!(rx.cut(&b, &mut at, 100, &mut Vec::new(), refuse).is_err());
    }
}

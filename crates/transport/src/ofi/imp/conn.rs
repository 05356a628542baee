//! One `ofi` connection: its endpoint and state, the send queue cut into libfabric messages
//! (a frame header never split), and received messages cut into frames by the framing layer.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// fi_connect issued, waiting for FI_CONNECTED (outbound).
    Connecting,
    /// fi_accept issued, waiting for FI_CONNECTED (inbound).
    Accepting,
    /// Exchanging Hellos (and proofs): where it stands is the connection's `Handshake`.
    Handshaking,
    Open,
    /// Sending what is queued (ending with Bye or Reject), then shutting down.
    Closing,
}

pub(super) struct OutFrame {
    /// Boxed: its address must not move while a message points into it.
    pub(super) header: Box<[u8; FRAME_HEADER_LEN]>,
    pub(super) segments: Vec<Segment>,
    pub(super) len: usize,
}

pub(super) struct Msg {
    pub(super) ctx: u64,
    pub(super) len: usize,
    pub(super) done: bool,
    pub(super) _staging: Option<BlockWriter>,
}

pub(super) struct Conn {
    /// Declared first: dropped (closed) before the buffers it may still point at.
    pub(super) ep: Fid,
    pub(super) addr: String,
    pub(super) state: State,
    /// Largest message the peer can receive.
    pub(super) peer_chunk: usize,
    // send side
    pub(super) frames: VecDeque<OutFrame>,
    /// Next byte to post: frame index into `frames`, offset in it.
    pub(super) cursor: (usize, usize),
    /// Bytes of the front frames whose messages completed.
    pub(super) completed: usize,
    pub(super) queued: usize,
    pub(super) seq: TxSeq,
    pub(super) inflight: VecDeque<Msg>,
    // receive side
    pub(super) rx_posted: usize,
    pub(super) framer: RxFramer,
    // handshake
    pub(super) close_reason: Option<CloseReason>,
    pub(super) hs: Handshake,
    /// The provider reported the connection gone; reported once the CQ is drained.
    pub(super) peer_gone: Option<String>,
    /// The handshake succeeded: until then one receive is posted, not `rx_depth`.
    pub(super) admitted: bool,
    /// An incoming connection: when it was requested (for the handshake deadline).
    pub(super) accepted: Option<std::time::Instant>,
}

impl Conn {
    pub(super) fn new(ep: Fid, addr: String, state: State) -> Conn {
        Conn {
            ep,
            addr,
            state,
            peer_chunk: 0,
            frames: VecDeque::new(),
            cursor: (0, 0),
            completed: 0,
            queued: 0,
            seq: TxSeq::default(),
            inflight: VecDeque::new(),
            rx_posted: 0,
            framer: RxFramer::default(),
            close_reason: None,
            hs: Handshake::accept(),
            peer_gone: None,
            admitted: false,
            accepted: None,
        }
    }

    pub(super) fn push(&mut self, frame_type: FrameType, count: u32, segments: Vec<Segment>) {
        let payload: usize = segments.iter().map(Segment::len).sum();
        let header = self.seq.header(frame_type, payload, count);
        let len = FRAME_HEADER_LEN + payload;
        self.queued += len;
        self.frames.push_back(OutFrame {
            header: Box::new(header),
            segments,
            len,
        });
    }

    pub(super) fn connected(&self) -> bool {
        !matches!(self.state, State::Connecting | State::Accepting)
    }

    pub(super) fn has_unposted(&self) -> bool {
        self.cursor.0 < self.frames.len()
    }

    pub(super) fn idle(&self) -> bool {
        self.frames.is_empty() && self.inflight.is_empty()
    }

    /// The pieces of the next message: at most `limit` pieces and `chunk` bytes; a frame
    /// header is never split. Advances the cursor.
    pub(super) fn next_pieces(
        &mut self,
        chunk: usize,
        limit: usize,
        out: &mut Vec<(*const u8, usize)>,
    ) {
        let (mut fi, mut off) = self.cursor;
        let mut total = 0;
        while fi < self.frames.len() && out.len() < limit && total < chunk {
            let f = &self.frames[fi];
            if off == 0 {
                if chunk - total < FRAME_HEADER_LEN {
                    break;
                }
                out.push((f.header.as_ptr(), FRAME_HEADER_LEN));
                total += FRAME_HEADER_LEN;
                off = FRAME_HEADER_LEN;
            } else {
                let mut pos = FRAME_HEADER_LEN;
                for seg in &f.segments {
                    let n = seg.len();
                    if off < pos + n {
                        let start = off - pos;
                        let take = (n - start).min(chunk - total);
                        out.push((seg.bytes()[start..].as_ptr(), take));
                        total += take;
                        off += take;
                        break;
                    }
                    pos += n;
                }
            }
            if off >= f.len {
                fi += 1;
                off = 0;
            }
        }
        self.cursor = (fi, off);
    }

    /// A message completed: frees what every earlier message also finished.
    pub(super) fn send_done(&mut self, ctx: u64) {
        if let Some(m) = self.inflight.iter_mut().find(|m| m.ctx == ctx) {
            m.done = true;
        }
        while self.inflight.front().is_some_and(|m| m.done) {
            let m = self.inflight.pop_front().expect("front");
            self.completed += m.len;
            self.queued -= m.len;
        }
        while let Some(f) = self.frames.front() {
            if self.completed < f.len {
                break;
            }
            self.completed -= f.len;
            self.frames.pop_front();
            self.cursor.0 -= 1;
        }
    }

    /// Cuts a received message (the filled part of `block`) into frames.
    ///
    /// Starts at byte `from`; returns `Ok(Some(at))` when it stopped at `at`, before the header
    /// of a frame that is not a handshake frame while the connection is not admitted: the
    /// caller handles the handshake frames cut so far, then calls again from `at`. Handshake
    /// frames may not declare more than `HANDSHAKE_FRAME_MAX` bytes.
    pub(super) fn parse(
        &mut self,
        block: &BlockWriter,
        from: usize,
        max_frame: u32,
        out: &mut Vec<InFrame>,
    ) -> Result<Option<usize>, WireError> {
        let len = block.filled();
        let mut at = from;
        let admitted = self.admitted;
        let cut = self
            .framer
            .cut(block, &mut at, max_frame, out, |header, cut| {
                let handshake = matches!(
                    header.frame_type,
                    FrameType::Hello | FrameType::HelloAck | FrameType::Reject | FrameType::Auth
                );
                if handshake && header.length > HANDSHAKE_FRAME_MAX {
                    return Err(WireError::FrameTooLarge {
                        len: header.length as u64,
                        max: HANDSHAKE_FRAME_MAX as u64,
                    });
                }
                if !handshake && !admitted {
                    if !cut.is_empty() {
                        return Ok(Admit::Pause);
                    }
                    // nothing that could admit it came before: a frame before the handshake
                    return Err(WireError::OutOfRange {
                        what: "frame type before the handshake completed",
                        value: header.frame_type as u64,
                    });
                }
                Ok(Admit::Take)
            })?;
        match cut {
            Cut::Done => Ok(None),
            // frame headers are never split between messages
            Cut::PartialHeader => Err(WireError::Truncated {
                what: "frame header in an ofi message",
                need: FRAME_HEADER_LEN,
                have: len - at,
            }),
            Cut::Paused => Ok(Some(at)),
        }
    }
}

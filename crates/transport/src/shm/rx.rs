//! Receive side of the `shm` transport: packets read from the socket and the ring, checked
//! (`codec.rs` reads the bytes, the connection's state decides the rest) and turned into
//! frames whose payload is in the peer's shared pools or packed into receive-pool blocks.

use super::*;

/// Why `consume` stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The backlog is consumed.
    Done,
    /// No receive-pool block for the next inline bytes.
    Starved,
    /// A ring frame names a pool whose POOL packet is still in the socket.
    NeedPool,
}

impl ShmTransport {
    /// Reads packets until the socket and the ring are empty or the budget is spent. FRAME
    /// packets are consumed in order; when the receive pool has no block for one, reading
    /// stops (at most BACKLOG_MAX packets are read ahead from the socket, so RETURNs behind
    /// them are still seen; the ring is left alone) and resumes from `poll` when blocks come
    /// back. With `socket` false only the ring is read (busy-polling), unless a ring frame
    /// names a pool not known yet: its POOL packet is then in the socket, read now.
    pub(super) fn read(&mut self, token: Token, out: &mut Vec<Event>, socket: bool) {
        self.read_inner(token, out, socket);
        // consumed ring entries may have made the room a waiting producer asked for
        if let Some(c) = self.conns.get_mut(&token) {
            if c.rx_ring.as_mut().is_some_and(|r| r.room_wanted()) {
                c.push_socket(Out::plain(codec::DOORBELL.to_vec()));
                self.flush(token);
            }
        }
    }

    fn read_inner(&mut self, token: Token, out: &mut Vec<Event>, mut socket: bool) {
        self.starved.remove(&token);
        // the socket was found empty since a frame asked for a pool
        let mut socket_empty = false;
        for _ in 0..64 {
            let stop = match self.consume(token, out) {
                Ok(stop) => stop,
                Err(what) => return self.protocol(token, what),
            };
            let starved = stop == Stop::Starved;
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            if stop == Stop::NeedPool {
                if socket_empty || c.eof.is_some() {
                    return self.protocol(token, ShmError::UnknownPool);
                }
                socket = true;
            }
            if stop == Stop::Done && c.rx_pkt.is_none() && c.backlog.is_empty() {
                // the ring after the socket's backlog: its frames come after those
                if let Some(r) = c.rx_ring.as_mut() {
                    match r.pop() {
                        Ok(Some(bytes)) => {
                            if bytes[0] != TAG_FRAME {
                                return self.protocol(token, "a ring entry that is not a FRAME");
                            }
                            c.backlog.push_back(bytes);
                            continue;
                        }
                        Ok(None) => {}
                        Err(what) => return self.protocol(token, what),
                    }
                }
            }
            if c.eof.is_some() {
                if stop != Stop::Done || c.rx_pkt.is_some() || !c.backlog.is_empty() {
                    self.starved.insert(token);
                    return;
                }
                let reason = c.eof.take().expect("checked");
                return self.drop_conn(token, reason);
            }
            if !socket {
                if starved {
                    self.starved.insert(token);
                }
                return;
            }
            if starved && c.backlog.len() >= BACKLOG_MAX {
                self.starved.insert(token);
                return;
            }
            let fd = c.fd.as_raw_fd();
            match sys::recv(fd, &mut self.buf) {
                Ok(sys::Recv::Empty) => {
                    if stop == Stop::NeedPool {
                        socket_empty = true;
                        continue;
                    }
                    if starved {
                        self.starved.insert(token);
                    }
                    return;
                }
                Ok(sys::Recv::Eof) => {
                    c.eof = Some(if c.state == State::Closing {
                        CloseReason::Local
                    } else {
                        CloseReason::Lost("peer closed the stream without Bye".into())
                    });
                }
                Err(e) => return self.drop_conn(token, CloseReason::Lost(e.to_string())),
                Ok(sys::Recv::Packet {
                    len,
                    fd: passed,
                    truncated,
                }) => {
                    if truncated {
                        return self.protocol(token, "shm packet larger than 64 KiB");
                    }
                    if self.buf[0] == TAG_FRAME {
                        if c.rx_ring.is_some() {
                            return self.protocol(token, "a FRAME packet on the socket after RING");
                        }
                        // any descriptor that came with it is closed here
                        drop(passed);
                        c.backlog.push_back(self.buf[..len].to_vec());
                        continue;
                    }
                    let pkt = self.buf[..len].to_vec();
                    if let Err(what) = self.on_packet(token, &pkt, passed) {
                        return self.protocol(token, what);
                    }
                }
            }
        }
        self.more_to_read.push_back(token);
    }

    /// A POOL, RETURN, RING or DOORBELL packet.
    fn on_packet(
        &mut self,
        token: Token,
        p: &[u8],
        passed: Option<OwnedFd>,
    ) -> Result<(), ShmError> {
        let c = self.conns.get_mut(&token).ok_or(ShmError::Gone)?;
        // what the connection's state forbids is refused before the packet is read
        match p.first().copied() {
            Some(codec::TAG_POOL) if c.state != State::Open => {
                return Err(ShmError::PoolBeforeHandshake)
            }
            Some(codec::TAG_RING) if c.state != State::Open => {
                return Err(ShmError::RingBeforeHandshake)
            }
            Some(codec::TAG_RING) if c.rx_ring.is_some() => return Err(ShmError::SecondRing),
            _ => {}
        }
        match Control::decode(p)? {
            Control::Pool { id, len } => {
                let fd = passed.ok_or(ShmError::PoolWithoutFd)?;
                if c.remotes.len() >= MAX_REMOTE_POOLS {
                    return Err(ShmError::TooManyPools);
                }
                let len = usize::try_from(len).map_err(|_| ShmError::PoolLength)?;
                sys::check_peer_memfd(fd.as_raw_fd(), len).map_err(ShmError::PoolRefused)?;
                let r = RemotePool::map(&c.name, fd, len)
                    .map_err(|source| ShmError::PoolMap { len, source })?;
                c.remotes.insert(id, r);
            }
            Control::Ring { capacity } => {
                let fd = passed.ok_or(ShmError::RingWithoutFd)?;
                c.rx_ring = Some(ring::RxRing::map(fd, capacity)?);
            }
            // the ring is read after every socket read: nothing more to do
            Control::Doorbell => {}
            Control::Return(tokens) => {
                for t in tokens {
                    if let Some((_, charge)) = c.lent.remove(&t) {
                        c.held -= charge;
                    }
                }
            }
        }
        Ok(())
    }

    /// Consumes FRAME packets of the backlog in order, until it is empty (`Stop::Done`), a
    /// receive-pool block is wanted (`Starved`) or a ring frame names a pool not known yet
    /// (`NeedPool`); what is consumed so far is kept: it resumes where it stopped.
    fn consume(&mut self, token: Token, out: &mut Vec<Event>) -> Result<Stop, ShmError> {
        let max_frame = self.cfg.max_frame as usize;
        loop {
            let Some(c) = self.conns.get_mut(&token) else {
                return Ok(Stop::Done);
            };
            if c.rx_pkt.is_none() {
                let Some(bytes) = c.backlog.pop_front() else {
                    return Ok(Stop::Done);
                };
                let head = FrameHead::decode(&bytes)?;
                let FrameHead {
                    frame_type,
                    count,
                    sequence,
                    ..
                } = head;
                match &c.rx_frame {
                    None if sequence != c.seq_in => {
                        return Err(ShmError::Sequence {
                            got: sequence,
                            expected: c.seq_in,
                        })
                    }
                    Some(f)
                        if (f.frame_type, f.count, f.sequence) != (frame_type, count, sequence) =>
                    {
                        return Err(ShmError::Continuation);
                    }
                    None | Some(_) => {}
                }
                if c.state == State::Handshaking {
                    // before the handshake: small inline frames only, never from the pool
                    let payload = codec::handshake_payload(&bytes, &head)?;
                    c.seq_in += 1;
                    self.on_handshake(token, frame_type, &payload, out);
                    continue;
                }
                if !c.admitted {
                    // refused, its Reject on the way out: what it sends is dropped unread
                    c.backlog.clear();
                    return Ok(Stop::Done);
                }
                c.rx_frame.get_or_insert(InFrame {
                    frame_type,
                    count,
                    sequence,
                    payload: Chain::new(),
                });
                c.rx_pkt = Some(RxPacket {
                    bytes,
                    at: FRAME_HEAD,
                    left: head.segments,
                    more: head.more,
                    copied: 0,
                });
            }
            let pool = &self.cfg.rx_pool;
            let reserve = if c.control { 0 } else { self.rx_reserve };
            let pkt = c.rx_pkt.as_mut().expect("set above");
            let frame = c.rx_frame.as_mut().expect("set with the packet");
            let p = &pkt.bytes;
            while pkt.left > 0 {
                match Seg::decode(p, pkt.at)? {
                    Seg::Inline(bytes) => {
                        let len = bytes.len();
                        if pkt.copied == 0 && frame.payload.len() + len > max_frame {
                            return Err(ShmError::FrameTooLarge(max_frame));
                        }
                        while pkt.copied < len {
                            if c.rx_block.as_ref().is_none_or(|b| b.remaining() == 0) {
                                c.rx_block = None;
                                if pool.free_blocks() <= reserve {
                                    return Ok(Stop::Starved);
                                }
                                match pool.try_alloc() {
                                    Some(b) => c.rx_block = Some(b),
                                    None => return Ok(Stop::Starved),
                                }
                            }
                            let w = c.rx_block.as_mut().expect("just ensured");
                            let n = (len - pkt.copied).min(w.remaining());
                            let chunk = &bytes[pkt.copied..pkt.copied + n];
                            frame.payload.push(w.append(chunk).expect("fits"));
                            pkt.copied += n;
                        }
                        pkt.copied = 0;
                        pkt.at += INLINE_HEAD + len;
                    }
                    Seg::Desc(d) => {
                        let (offset, len) = (d.offset as usize, d.len as usize);
                        if frame.payload.len() + len > max_frame {
                            return Err(ShmError::FrameTooLarge(max_frame));
                        }
                        let Some(r) = c.remotes.get(&d.pool) else {
                            // a ring frame may overtake the POOL packet, which the sender
                            // wrote to the socket before it: the caller reads the socket
                            if c.rx_ring.is_some() {
                                return Ok(Stop::NeedPool);
                            }
                            return Err(ShmError::UnknownPool);
                        };
                        frame
                            .payload
                            .push(r.slice(offset, len, d.token).ok_or(ShmError::OutsidePool)?);
                        pkt.at += DESC_LEN;
                    }
                }
                pkt.left -= 1;
            }
            if pkt.at != p.len() {
                return Err(PacketError::MoreBytes.into());
            }
            let more = pkt.more;
            c.rx_pkt = None;
            if !more {
                let frame = c.rx_frame.take().expect("present");
                c.seq_in += 1;
                self.on_frame(token, frame, out);
            }
        }
    }

    fn on_frame(&mut self, token: Token, frame: InFrame, out: &mut Vec<Event>) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let conn = ConnId(token.0 as u64);
        match (c.state, frame.frame_type) {
            (State::Open, FrameType::Messages) => out.push(Event::Frame { conn, frame }),
            (State::Open, FrameType::Bye) => self.drop_conn(token, CloseReason::PeerClosed),
            (State::Closing, _) => {}
            (_, t) => self.protocol(token, format!("frame type {t:?} on an open connection")),
        }
    }

    /// One handshake frame (its payload read without the receive pool).
    fn on_handshake(
        &mut self,
        token: Token,
        frame_type: FrameType,
        payload: &[u8],
        out: &mut Vec<Event>,
    ) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let conn = ConnId(token.0 as u64);
        let mut send = Vec::new();
        // same-host peers are checked by uid at accept: no secret on this transport
        let outcome =
            c.hs.step(&self.cfg, None, frame_type, payload, &c.name, &mut send);
        for (ft, bytes) in send {
            let _ = self.queue_frame(token, ft, 0, vec![Segment::Owned(bytes)]);
        }
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        match outcome {
            Outcome::Continue => self.flush(token),
            Outcome::Open(peer) => {
                c.name = peer.node_id.clone();
                if c.accepted.is_some() {
                    c.control = peer.channel == evb_wire::Channel::Control;
                }
                c.state = State::Open;
                c.admitted = true;
                c.open_ring();
                out.push(c.hs.opened(conn, peer));
                self.flush(token);
            }
            Outcome::Refuse(reason) => {
                c.state = State::Closing;
                c.close_reason = Some(reason);
                self.flush(token);
            }
            Outcome::Drop(reason) => self.drop_conn(token, reason),
        }
    }
}

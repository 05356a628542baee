//! Send side of the `shm` transport: a frame becomes FRAME packets (announcing the pools its
//! descriptors name, copying into the bounce pool what is not in shared memory yet), queued
//! for the socket or the ring and written from there in order.

use super::*;

impl ShmTransport {
    /// Encodes one frame as a packet (announcing pools first as needed) and queues it.
    pub(super) fn queue_frame(
        &mut self,
        token: Token,
        frame_type: FrameType,
        count: u32,
        segments: Vec<Segment>,
    ) -> Result<(), TransportError> {
        let bounce = self.bounce.clone();
        let max_frame = self.cfg.max_frame as usize;
        let c = self
            .conns
            .get_mut(&token)
            .ok_or(TransportError::NoConnection(ConnId(token.0 as u64)))?;
        let payload: usize = segments.iter().map(Segment::len).sum();
        if payload > max_frame {
            return Err(TransportError::TooLarge {
                len: payload,
                max: max_frame,
            });
        }
        // Bytes not in shared memory need bounce blocks; without enough free ones (the
        // receiver holds them) the frame waits, and so does every frame after it. A frame
        // that needs more than the whole pool could never go: refused now, before any effect.
        let need = bounce_blocks(&segments, bounce.block_size());
        let total = bounce.stats().blocks;
        if need > total {
            return Err(TransportError::TooLarge {
                len: need * bounce.block_size(),
                max: total * bounce.block_size(),
            });
        }
        if !c.deferred.is_empty() || need > bounce.free_blocks() {
            c.queued += payload;
            c.deferred.push_back(Deferred {
                frame_type,
                count,
                segments,
            });
            return Ok(());
        }
        c.queued += payload;
        Self::encode(
            c,
            &bounce,
            frame_type,
            count,
            segments,
            &mut self.bytes_copied,
            &mut self.bytes_by_reference,
        )
    }

    /// Encodes frames that were waiting for bounce blocks, as far as blocks allow.
    fn pump_deferred(&mut self, token: Token) {
        let bounce = self.bounce.clone();
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        while let Some(d) = c.deferred.front() {
            if bounce_blocks(&d.segments, bounce.block_size()) > bounce.free_blocks() {
                break;
            }
            let d = c.deferred.pop_front().expect("front");
            let r = Self::encode(
                c,
                &bounce,
                d.frame_type,
                d.count,
                d.segments,
                &mut self.bytes_copied,
                &mut self.bytes_by_reference,
            );
            if let Err(e) = r {
                // cannot happen (the blocks were counted just above), but a frame that was
                // accepted by `send` is never dropped silently: the connection goes instead
                let reason = CloseReason::Lost(format!("cannot send a queued frame: {e}"));
                return self.drop_conn(token, reason);
            }
        }
    }

    /// Turns one frame into packets at the back of the queue (its payload is already counted
    /// in `queued`). Everything that can fail (taking bounce blocks) happens before anything
    /// is lent, announced or queued.
    fn encode(
        c: &mut Conn,
        bounce: &Pool,
        frame_type: FrameType,
        count: u32,
        segments: Vec<Segment>,
        bytes_copied: &mut u64,
        bytes_by_reference: &mut u64,
    ) -> Result<(), TransportError> {
        enum Part {
            Inline(Vec<u8>),
            /// A descriptor, and the bytes of shared memory it holds until returned (a
            /// bounce block counts whole, on its first descriptor).
            Desc(Slice, usize),
        }
        let mut payload = 0usize;
        let mut copied = 0u64;
        let mut by_ref = 0u64;
        let mut parts: Vec<Part> = Vec::with_capacity(segments.len());
        // bytes not in shared memory are packed into bounce blocks
        let mut block: Option<evb_buffers::BlockWriter> = None;
        let mut copy_in = |mut rest: &[u8], parts: &mut Vec<Part>| {
            while !rest.is_empty() {
                let mut charge = 0;
                if block.as_ref().is_none_or(|b| b.remaining() == 0) {
                    block = Some(bounce.try_alloc().ok_or_else(|| {
                        TransportError::Unavailable(
                            "shm: bounce pool exhausted (the peer is not returning buffers)".into(),
                        )
                    })?);
                    charge = bounce.block_size();
                }
                let w = block.as_mut().expect("just ensured");
                let n = rest.len().min(w.remaining());
                parts.push(Part::Desc(w.append(&rest[..n]).expect("fits"), charge));
                rest = &rest[n..];
            }
            Ok::<(), TransportError>(())
        };
        for seg in segments {
            payload += seg.len();
            match seg {
                s if s.is_empty() => {}
                Segment::Shared(s) if s.shared_region().is_some() => {
                    by_ref += s.len() as u64;
                    let n = s.len();
                    parts.push(Part::Desc(s, n));
                }
                Segment::Shared(s) => {
                    copied += s.len() as u64;
                    copy_in(&s, &mut parts)?;
                }
                Segment::Owned(v) if v.len() <= INLINE_MAX => parts.push(Part::Inline(v)),
                Segment::Owned(v) => {
                    copied += v.len() as u64;
                    copy_in(&v, &mut parts)?;
                }
            }
        }
        // announce pools the peer has not mapped yet
        for part in &parts {
            let Part::Desc(s, _) = part else { continue };
            if c.announced.insert(s.pool_id()) {
                let (_, len) = s.shared_region().expect("shared");
                let p = codec::pool_packet(s.pool_id(), len as u64);
                c.push_socket(Out {
                    bytes: p,
                    pass: Some(s.clone()),
                    ring: false,
                    payload: 0,
                });
            }
        }
        // packets of at most MAX_PACKET bytes; every part fits an empty one
        let frame_head = FrameHead {
            frame_type,
            more: false,
            count,
            sequence: c.seq_out,
            segments: 0,
        };
        let head = || {
            let mut pkt = Vec::with_capacity(256);
            frame_head.encode_into(&mut pkt);
            pkt
        };
        let mut packets = vec![head()];
        let mut nseg = 0u32;
        for part in parts {
            let size = match &part {
                Part::Inline(b) => INLINE_HEAD + b.len(),
                Part::Desc(..) => DESC_LEN,
            };
            let pkt = packets.last_mut().expect("one at least");
            if pkt.len() + size > MAX_PACKET && nseg > 0 {
                codec::set_segments(pkt, nseg);
                codec::set_more(pkt);
                packets.push(head());
                nseg = 0;
            }
            let pkt = packets.last_mut().expect("one at least");
            match part {
                Part::Inline(bytes) => Seg::Inline(&bytes).encode_into(pkt),
                Part::Desc(s, charge) => {
                    let t = c.next_token;
                    c.next_token = c.next_token.wrapping_add(1);
                    Seg::Desc(Desc {
                        pool: s.pool_id(),
                        offset: s.region_offset() as u64,
                        len: s.len() as u32,
                        token: t,
                    })
                    .encode_into(pkt);
                    c.held += charge;
                    c.lent.insert(t, (s, charge));
                }
            }
            nseg += 1;
        }
        codec::set_segments(packets.last_mut().expect("one at least"), nseg);
        c.seq_out += 1;
        let last = packets.len() - 1;
        for (i, bytes) in packets.into_iter().enumerate() {
            debug_assert!(bytes.len() <= MAX_PACKET);
            // the frame leaves the queue's count when its last packet is sent
            let payload = if i == last { payload } else { 0 };
            if c.tx_ring.is_some() {
                c.ring_queue.push_back(RingOut {
                    bytes,
                    payload,
                    after: c.sock_pushed,
                });
            } else {
                c.push_socket(Out {
                    bytes,
                    pass: None,
                    ring: false,
                    payload,
                });
            }
        }
        *bytes_copied += copied;
        *bytes_by_reference += by_ref;
        Ok(())
    }

    pub(super) fn flush(&mut self, token: Token) {
        self.pump_deferred(token);
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        loop {
            while c.writable {
                let Some(front) = c.queue.front() else { break };
                let pass = if front.ring {
                    c.tx_ring.as_ref().and_then(|r| r.fd())
                } else {
                    front
                        .pass
                        .as_ref()
                        .and_then(|s| s.shared_region())
                        .map(|(fd, _)| fd)
                };
                match sys::send(c.fd.as_raw_fd(), &front.bytes, pass) {
                    Ok(true) => {
                        let done = c.queue.pop_front().expect("front");
                        c.queued -= done.payload;
                        c.sock_sent += 1;
                        if done.ring {
                            if let Some(r) = c.tx_ring.as_mut() {
                                r.passed();
                            }
                        }
                    }
                    Ok(false) => c.writable = false,
                    Err(e) if c.state == State::Closing => {
                        return self.drop_conn(token, CloseReason::Lost(e.to_string()));
                    }
                    Err(_) => {
                        // The peer is gone or going: what it sent before (a Bye, perhaps) is
                        // still to be read, and the end of its stream says how it left.
                        c.queue.clear();
                        c.ring_queue.clear();
                        c.queued = 0;
                        c.writable = false;
                        self.more_to_read.push_back(token);
                        return;
                    }
                }
            }
            // FRAME packets into the ring, in order, each once the socket packets queued
            // before it (the POOLs it names) are sent
            let Some(tx) = c.tx_ring.as_mut() else { break };
            let mut pushed = false;
            while let Some(front) = c.ring_queue.front() {
                if front.after > c.sock_sent {
                    break;
                }
                let r = match tx.push(&front.bytes) {
                    Ok(false) => tx
                        .wait_for_room(front.bytes.len())
                        .map(|room| (false, room)),
                    other => other.map(|done| (done, false)),
                };
                match r {
                    Ok((true, _)) => {
                        let done = c.ring_queue.pop_front().expect("front");
                        c.queued -= done.payload;
                        pushed = true;
                    }
                    // room appeared while we asked for a DOORBELL: try again
                    Ok((false, true)) => {}
                    // full: the peer sends a DOORBELL when it makes room
                    Ok((false, false)) => break,
                    Err(what) => return self.protocol(token, what),
                }
            }
            if pushed && tx.wake_needed() {
                c.push_socket(Out::plain(codec::DOORBELL.to_vec()));
                continue;
            }
            break;
        }
        if let Some(c) = self.conns.get(&token) {
            if c.state == State::Closing && c.queue.is_empty() && c.ring_queue.is_empty() {
                if c.lent.is_empty() {
                    let reason = c.close_reason.clone().unwrap_or(CloseReason::Local);
                    self.drop_conn(token, reason);
                } else {
                    self.draining.insert(token);
                }
            }
        }
    }
}

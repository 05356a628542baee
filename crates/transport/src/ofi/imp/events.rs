//! What the provider reports, and what `poll` does with it: completions (received messages
//! become frames, finished sends free the queue), connection-manager events (requests,
//! accepts, shutdowns, errors), and the handshake deadline.

use super::*;

impl Ofi {
    pub(super) fn on_frame(&mut self, id: u64, frame: InFrame, out: &mut Vec<Event>) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let conn = ConnId(id);
        match (c.state, frame.frame_type) {
            (State::Open, FrameType::Messages) => out.push(Event::Frame { conn, frame }),
            (State::Open, FrameType::Bye) => self.drop_conn(id, CloseReason::PeerClosed, out),
            (State::Closing, _) => {}
            (State::Handshaking, t) => {
                let mut send = Vec::new();
                let payload = frame.payload.to_vec();
                let secret = self.cfg.secret.as_deref();
                let outcome =
                    c.hs.step(&self.cfg, secret, t, &payload, &c.addr, &mut send);
                for (ft, bytes) in send {
                    c.push(ft, 0, vec![Segment::Owned(bytes)]);
                }
                match outcome {
                    Outcome::Continue => self.pump_tx(id, out),
                    Outcome::Open(peer) => {
                        c.state = State::Open;
                        c.admitted = true;
                        out.push(c.hs.opened(conn, peer));
                        self.pump_tx(id, out);
                    }
                    Outcome::Refuse(reason) => {
                        self.begin_close(id, reason);
                        self.pump_tx(id, out);
                    }
                    Outcome::Drop(reason) => self.drop_conn(id, reason, out),
                }
            }
            (_, t) => {
                let e = WireError::OutOfRange {
                    what: "frame type in this connection state",
                    value: t as u64,
                };
                self.drop_conn(id, CloseReason::Protocol(e), out)
            }
        }
    }

    pub(super) fn on_recv(
        &mut self,
        id: u64,
        mut block: BlockWriter,
        len: usize,
        out: &mut Vec<Event>,
    ) {
        let max_frame = self.cfg.max_frame;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.rx_posted = c.rx_posted.saturating_sub(1);
        if c.state == State::Accepting {
            // data can overtake the FI_CONNECTED event
            c.state = State::Handshaking;
        }
        if len > block.remaining() {
            let e = WireError::TooLong {
                what: "ofi message",
                len,
                max: block.remaining(),
            };
            return self.drop_conn(id, CloseReason::Protocol(e), out);
        }
        block.advance(len);
        let mut frames = Vec::new();
        let mut from = 0;
        loop {
            let Some(c) = self.conns.get_mut(&id) else {
                return;
            };
            let parsed = c.parse(&block, from, max_frame, &mut frames);
            for f in frames.drain(..) {
                self.on_frame(id, f, out);
            }
            match parsed {
                Ok(None) => break,
                // handshake frames handled: the rest is read if they admitted the peer
                Ok(Some(at)) => from = at,
                Err(e) => return self.drop_conn(id, CloseReason::Protocol(e), out),
            }
        }
        drop(block);
        if !self.conns.contains_key(&id) {
            return;
        }
        if let Err(e) = self.post_recvs(id) {
            self.drop_conn(id, CloseReason::Lost(e.to_string()), out);
        }
    }

    pub(super) fn on_eq(&mut self, ev: sys::EqEv, out: &mut Vec<Event>) {
        let id = ev.ctx;
        match ev.kind {
            sys::EQ_CONNREQ => {
                let info = Info::from_raw(ev.info);
                let data = &ev.data[..(ev.datalen as usize).min(ev.data.len())];
                let Some(pep) = self.listeners.get(&id) else {
                    return;
                };
                let Some(chunk) = cm_chunk(data) else {
                    warn!("refusing a libfabric connection that is not from evb");
                    sys::reject(pep, &info);
                    return;
                };
                let waiting = self
                    .conns
                    .values()
                    .filter(|c| c.accepted.is_some() && !c.admitted)
                    .count();
                if waiting >= self.handshake_room {
                    warn!(
                        waiting,
                        "refusing a libfabric connection: too many connections still handshaking"
                    );
                    sys::reject(pep, &info);
                    return;
                }
                let cid = self.id();
                let ep = match self.fabric.endpoint(&info, cid) {
                    Ok(ep) => ep,
                    Err(e) => {
                        warn!("cannot open an endpoint for an incoming connection: {e}");
                        if let Some(pep) = self.listeners.get(&id) {
                            sys::reject(pep, &info);
                        }
                        return;
                    }
                };
                let mut c = Conn::new(ep, format!("ofi-conn-{cid}"), State::Accepting);
                c.peer_chunk = chunk;
                c.accepted = Some(std::time::Instant::now());
                self.conns.insert(cid, c);
                let param = cm_param(self.cfg.rx_pool.block_size());
                let r = self
                    .post_recvs(cid)
                    .and_then(|()| sys::accept(&self.conns[&cid].ep, &param));
                if let Err(e) = r {
                    warn!("accepting a connection failed: {e}");
                    // never reported: it was not accepted yet
                    self.conns.remove(&cid);
                    self.ops.retain(|_, op| match op {
                        Op::Recv { conn, .. } | Op::Send { conn } => *conn != cid,
                    });
                }
            }
            sys::EQ_CONNECTED => {
                let data = &ev.data[..(ev.datalen as usize).min(ev.data.len())];
                let Some(c) = self.conns.get_mut(&id) else {
                    return;
                };
                match c.state {
                    State::Connecting => match cm_chunk(data) {
                        Some(chunk) => {
                            c.peer_chunk = chunk;
                            c.state = State::Handshaking;
                            self.pump_tx(id, out);
                        }
                        None => {
                            let why = "the peer did not identify as evb".to_string();
                            self.drop_conn(id, CloseReason::ConnectFailed(why), out)
                        }
                    },
                    State::Accepting => c.state = State::Handshaking,
                    _ => {}
                }
            }
            sys::EQ_SHUTDOWN => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.peer_gone = Some("the peer disconnected without Bye".into());
                }
            }
            sys::EQ_ERROR => {
                let why = sys::strerror(ev.err as i64);
                if let Some(c) = self.conns.get_mut(&id) {
                    if c.state == State::Connecting {
                        self.drop_conn(id, CloseReason::ConnectFailed(why), out);
                    } else {
                        c.peer_gone = Some(why);
                    }
                } else if self.listeners.contains_key(&id) {
                    warn!("listener error: {why}");
                }
            }
            _ => {}
        }
    }

    pub(super) fn on_cq(&mut self, e: CqEv, out: &mut Vec<Event>) {
        let Some(op) = self.ops.remove(&e.ctx) else {
            return; // an operation of a connection already closed
        };
        match op {
            Op::Recv { conn, block } => {
                if e.err != 0 {
                    drop(block);
                    if let Some(c) = self.conns.get_mut(&conn) {
                        c.rx_posted = c.rx_posted.saturating_sub(1);
                        if e.err != sys::FI_ECANCELED {
                            c.peer_gone = Some(sys::strerror(e.err as i64));
                        }
                    }
                    return;
                }
                self.on_recv(conn, block, e.len as usize, out);
            }
            Op::Send { conn } => {
                if e.err != 0 {
                    if let Some(c) = self.conns.get_mut(&conn) {
                        c.peer_gone = Some(sys::strerror(e.err as i64));
                    }
                    return;
                }
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.send_done(e.ctx);
                }
                self.sends_done += 1;
                self.pump_tx(conn, out);
            }
        }
    }

    /// One pass: completions, connection events, reposts, queued sends, closes.
    pub(super) fn progress(&mut self, out: &mut Vec<Event>) -> io::Result<()> {
        let mut buf = std::mem::take(&mut self.cq_buf);
        let mut handled = 0;
        // completions before connection events: a peer's last frames (Bye, Reject) must be
        // seen before its shutdown
        while handled < CQ_BUDGET {
            let n = self.fabric.cq_read(&mut buf).map_err(io::Error::other)?;
            if n == 0 {
                break;
            }
            handled += n;
            self.completions += n as u64;
            for e in &buf[..n] {
                self.on_cq(*e, out);
            }
        }
        while let Some(ev) = self.fabric.eq_read().map_err(io::Error::other)? {
            self.on_eq(ev, out);
        }
        // what arrived before a shutdown is reported before it
        let gone: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.peer_gone.is_some())
            .map(|(id, _)| *id)
            .collect();
        if !gone.is_empty() {
            loop {
                let n = self.fabric.cq_read(&mut buf).map_err(io::Error::other)?;
                if n == 0 {
                    break;
                }
                for e in &buf[..n] {
                    self.on_cq(*e, out);
                }
            }
            for id in gone {
                let Some(c) = self.conns.get_mut(&id) else {
                    continue;
                };
                let why = c.peer_gone.take().unwrap_or_default();
                let reason = if c.state == State::Closing {
                    CloseReason::Local
                } else {
                    CloseReason::Lost(why)
                };
                self.drop_conn(id, reason, out);
            }
        }
        self.cq_buf = buf;
        for id in self.starved.iter().copied().collect::<Vec<_>>() {
            if let Err(e) = self.post_recvs(id) {
                self.drop_conn(id, CloseReason::Lost(e.to_string()), out);
            }
        }
        let ids: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.has_unposted() || (c.state == State::Closing && c.idle()))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.pump_tx(id, out);
            if let Some(c) = self.conns.get(&id) {
                if c.state == State::Closing && c.idle() {
                    sys::shutdown(&c.ep);
                    self.drop_conn(id, CloseReason::Local, out);
                }
            }
        }
        Ok(())
    }

    /// Closes incoming connections whose handshake has taken too long.
    pub(super) fn expire_handshakes(&mut self, out: &mut Vec<Event>) {
        let limit = Admission::default().handshake_deadline;
        let late: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.admitted)
            .filter(|(_, c)| c.accepted.is_some_and(|t| t.elapsed() >= limit))
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            if let Some(c) = self.conns.get_mut(&id) {
                c.close_reason = None;
            }
            let why = format!("handshake not completed within {} ms", limit.as_millis());
            self.drop_conn(id, CloseReason::Rejected(why), out);
        }
    }

    pub(super) fn busy(&self) -> bool {
        !self.starved.is_empty()
            || self
                .conns
                .values()
                .any(|c| !c.idle() || c.peer_gone.is_some())
    }
}

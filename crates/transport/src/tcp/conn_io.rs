//! Reading and writing one connection: connect completion, flushing its send queue,
//! handshake frames read into a buffer of its own, then frames read into the receive pool.

use super::*;

impl TcpTransport {
    pub(super) fn on_writable(&mut self, token: Token, out: &mut Vec<Event>) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if c.state == State::Connecting {
            match c.stream.take_error() {
                Ok(Some(e)) | Err(e) => {
                    return self.drop_conn(token, CloseReason::ConnectFailed(e.to_string()), out);
                }
                Ok(None) => {}
            }
            match c.stream.peer_addr() {
                Ok(_) => {
                    let _ = c.stream.set_nodelay(true);
                    c.state = State::Handshaking;
                }
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return,
                Err(e) => {
                    return self.drop_conn(token, CloseReason::ConnectFailed(e.to_string()), out)
                }
            }
        }
        c.writable = true;
        self.flush(token, out);
    }

    pub(super) fn flush(&mut self, token: Token, out: &mut Vec<Event>) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if c.sender.is_some() {
            // its thread writes; here only the shutdown once everything is out
            if c.state == State::Closing && c.queued() == 0 {
                let _ = c.stream.shutdown(Shutdown::Write);
                c.state = State::Draining;
                self.more_to_read.push_back(token);
            }
            return;
        }
        if !c.writable || c.state == State::Connecting || c.state == State::Draining {
            return;
        }
        match c.tx.write_to(&mut c.stream) {
            Ok(true) => {
                if c.state == State::Closing {
                    let _ = c.stream.shutdown(Shutdown::Write);
                    c.state = State::Draining;
                    // Input may already be at EOF with no new readiness event to come.
                    self.more_to_read.push_back(token);
                }
            }
            Ok(false) => c.writable = false,
            Err(e) => self.write_failed(token, e.to_string(), out),
        }
    }

    /// A write failed: the peer is gone, but what it sent before it went may still wait in
    /// the socket (a node that fails writes why, then exits with our input unread, which
    /// resets the connection). Linux hands out that data before the reset, so it is read
    /// and delivered first, then the connection is closed with the write's error.
    pub(super) fn write_failed(&mut self, token: Token, why: String, out: &mut Vec<Event>) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let salvage = c.admitted && matches!(c.state, State::Open | State::Closing);
        c.close_reason
            .get_or_insert_with(|| CloseReason::Lost(why.clone()));
        c.writable = false;
        // bounded: each pass reads at most READ_BUDGET times; a reset socket ends in a few
        for _ in 0..64 {
            if !salvage || !self.conns.contains_key(&token) {
                break;
            }
            self.more_to_read.retain(|t| *t != token);
            self.on_readable(token, out);
            if !self.more_to_read.contains(&token) {
                break;
            }
        }
        self.drop_conn(token, CloseReason::Lost(why), out);
    }

    pub(super) fn on_readable(&mut self, token: Token, out: &mut Vec<Event>) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if c.state == State::Connecting {
            return self.on_writable(token, out);
        }
        if c.state == State::Handshaking {
            // Handshake frames go into a small buffer of the connection's own, one at a time,
            // until the connection is admitted (then the rest is read below, into the pool).
            loop {
                let Some(c) = self.conns.get_mut(&token) else {
                    return;
                };
                if c.state != State::Handshaking {
                    break;
                }
                match c.rx.read_handshake(&mut c.stream, HANDSHAKE_FRAME_MAX) {
                    Ok(HandshakeRead::Frame(header, payload)) => {
                        self.on_handshake(token, header.frame_type, &payload, out)
                    }
                    Ok(HandshakeRead::WouldBlock) => return,
                    Ok(HandshakeRead::Eof) => {
                        let reason =
                            CloseReason::Lost("peer closed the stream during the handshake".into());
                        return self.drop_conn(token, reason, out);
                    }
                    Err(RxError::Io(e)) => {
                        return self.drop_conn(token, CloseReason::Lost(e.to_string()), out)
                    }
                    Err(RxError::Wire(WireError::UnsupportedVersion { got, supported })) => {
                        return self.refuse_version(token, got, supported, out)
                    }
                    Err(RxError::Wire(e)) => {
                        return self.drop_conn(token, CloseReason::Protocol(e), out)
                    }
                }
            }
        }
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if c.state == State::Draining || !c.admitted {
            // Input of a connection we are leaving, or of a peer never admitted (refused,
            // its Reject being flushed): discarded, never read into the pool.
            let mut sink = [0u8; 4096];
            loop {
                match io::Read::read(&mut c.stream, &mut sink) {
                    Ok(0) if c.state == State::Draining => {
                        return self.drop_conn(token, CloseReason::Local, out)
                    }
                    Ok(0) => {
                        let reason = CloseReason::Lost("peer closed the stream".into());
                        return self.drop_conn(token, reason, out);
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(_) => return self.drop_conn(token, CloseReason::Local, out),
                }
            }
        }
        let mut frames = std::mem::take(&mut self.frames);
        let outcome = c.rx.read_from(&mut c.stream, &mut frames, READ_BUDGET);
        self.starved.remove(&token);
        for f in frames.drain(..) {
            self.on_frame(token, f, out);
        }
        self.frames = frames;
        if !self.conns.contains_key(&token) {
            return;
        }
        match outcome {
            Ok(ReadOutcome::WouldBlock) => {}
            Ok(ReadOutcome::Budget) => self.more_to_read.push_back(token),
            Ok(ReadOutcome::Starved) => {
                self.starved.insert(token);
            }
            Ok(ReadOutcome::Eof) => {
                let state = self.conns[&token].state;
                let reason = if state == State::Closing {
                    CloseReason::Local
                } else {
                    CloseReason::Lost("peer closed the stream without Bye".into())
                };
                self.drop_conn(token, reason, out)
            }
            Err(RxError::Io(e)) => self.drop_conn(token, CloseReason::Lost(e.to_string()), out),
            Err(RxError::Wire(e)) => self.drop_conn(token, CloseReason::Protocol(e), out),
        }
    }

    pub(super) fn on_frame(&mut self, token: Token, frame: InFrame, out: &mut Vec<Event>) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let conn = ConnId(token.0 as u64);
        match (c.state, frame.frame_type) {
            (State::Open, FrameType::Messages) => out.push(Event::Frame { conn, frame }),
            (State::Open, FrameType::Bye) => self.drop_conn(token, CloseReason::PeerClosed, out),
            (State::Closing, _) => {} // we are leaving; late input is dropped
            (_, t) => {
                let e = WireError::OutOfRange {
                    what: "frame type in this connection state",
                    value: t as u64,
                };
                self.drop_conn(token, CloseReason::Protocol(e), out)
            }
        }
    }

    /// A peer whose first frame header says another protocol version: told so in a Reject
    /// written in a header of its version (docs/protocol.md, Compatibility), then closed; a
    /// version no peer ever spoke is dropped as garbage.
    fn refuse_version(&mut self, token: Token, got: u16, supported: u16, out: &mut Vec<Event>) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let Some((version, reject)) = c.hs.version_refusal(got) else {
            let e = WireError::UnsupportedVersion { got, supported };
            return self.drop_conn(token, CloseReason::Protocol(e), out);
        };
        let reason = version_refusal(got);
        warn!(peer = %c.addr, "refusing connection: {reason}");
        c.tx.push_as(version, FrameType::Reject, 0, vec![Segment::Owned(reject)]);
        self.begin_close(token, CloseReason::Rejected(reason));
        self.flush(token, out);
    }

    /// One handshake frame, read outside the pool.
    pub(super) fn on_handshake(
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
        let secret = self.cfg.secret.as_deref();
        let outcome =
            c.hs.step(&self.cfg, secret, frame_type, payload, &c.addr, &mut send);
        for (ft, bytes) in send {
            c.tx.push(ft, 0, vec![Segment::Owned(bytes)]);
        }
        match outcome {
            Outcome::Continue => self.flush(token, out),
            Outcome::Open(peer) => {
                c.state = State::Open;
                c.admitted = true;
                out.push(c.hs.opened(conn, peer));
                self.flush(token, out);
                self.hand_over(token, out);
            }
            Outcome::Refuse(reason) => {
                self.begin_close(token, reason);
                self.flush(token, out);
            }
            Outcome::Drop(reason) => self.drop_conn(token, reason, out),
        }
    }
}

//! The connection handshake as a state machine shared by every transport: frames in, frames
//! to send and a verdict out, no IO (docs/protocol.md §1).
//!
//! Connector: Hello → (HelloAck [→ Auth ⇄ Auth]) → open. Acceptor: (Hello → HelloAck [+ Auth]
//! → Auth) → open, or Reject and close.

use evb_wire::{
    version_refusal, FrameType, Hello, Reject, RejectCode, WireError, OLDEST_KNOWN_VERSION,
    PROTOCOL_VERSION,
};
use tracing::{debug, warn};

use crate::{auth, CloseReason, ConnId, Event, TransportConfig, TransportError};

/// Where a connection's handshake stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// We sent Hello; waiting for HelloAck or Reject.
    Ack,
    /// We accepted; waiting for the peer's Hello.
    Hello,
    /// A secret is in use; waiting for the peer's proof.
    Auth,
}

/// What the handshake remembers between frames.
pub(crate) struct Handshake {
    phase: Phase,
    /// The connector's Hello and the acceptor's HelloAck, as sent: what the proofs cover.
    hello: Vec<u8>,
    ack: Vec<u8>,
    /// The peer, held until its proof checks out.
    peer: Option<Hello>,
    outbound: bool,
}

/// What the transport does next.
pub(crate) enum Outcome {
    /// Still handshaking.
    Continue,
    /// Open: report this peer (`Connected` if outbound, else `Accepted`).
    Open(Hello),
    /// Send what was produced (a Reject), then close.
    Refuse(CloseReason),
    /// Close now.
    Drop(CloseReason),
}

impl Handshake {
    /// An outgoing connection: the Hello payload to send first (with a fresh nonce when a
    /// secret is in use).
    pub fn connect(
        hello: Hello,
        secret: Option<&[u8]>,
    ) -> Result<(Handshake, Vec<u8>), TransportError> {
        let mut hello = hello;
        hello.nonce = match secret {
            Some(_) => auth::nonce().map_err(|e| TransportError::Unavailable(e.to_string()))?,
            None => 0,
        };
        let bytes = hello.encode()?;
        let hs = Handshake {
            phase: Phase::Ack,
            hello: bytes.clone(),
            ack: Vec::new(),
            peer: None,
            outbound: true,
        };
        Ok((hs, bytes))
    }

    pub fn accept() -> Handshake {
        Handshake {
            phase: Phase::Hello,
            hello: Vec::new(),
            ack: Vec::new(),
            peer: None,
            outbound: false,
        }
    }

    /// An incoming connection whose peer has sent a whole, well-formed Hello (with a secret,
    /// it is now to prove it): a peer that behaves as evb's own do, not a socket stalled in
    /// its first frame.
    pub fn hello_seen(&self) -> bool {
        !self.outbound && self.phase != Phase::Hello
    }

    /// A peer that opened this connection with a frame header of protocol `got`, not ours:
    /// the version to write the refusal in (one the peer can read) and the refusal, which names
    /// both versions. `None` where the connection is ours, is past its first frame, or `got`
    /// is no version at all (then it is dropped, as any garbage is).
    pub fn version_refusal(&self, got: u16) -> Option<(u16, Vec<u8>)> {
        if self.outbound || self.phase != Phase::Hello || got < OLDEST_KNOWN_VERSION {
            return None;
        }
        let reject = Reject {
            code: RejectCode::BadHandshake,
            reason: version_refusal(got),
        };
        Some((got.min(PROTOCOL_VERSION), reject.encode()))
    }

    /// The event that reports the connection open: `Connected` on our side of an outgoing
    /// connection, `Accepted` on an incoming one.
    pub fn opened(&self, conn: ConnId, peer: Hello) -> Event {
        if self.outbound {
            Event::Connected { conn, peer }
        } else {
            Event::Accepted { conn, peer }
        }
    }

    /// Handles one handshake frame; frames to send are appended to `send`.
    pub fn step(
        &mut self,
        cfg: &TransportConfig,
        secret: Option<&[u8]>,
        frame_type: FrameType,
        payload: &[u8],
        addr: &str,
        send: &mut Vec<(FrameType, Vec<u8>)>,
    ) -> Outcome {
        match (self.phase, frame_type) {
            (Phase::Hello, FrameType::Hello) => {
                let peer = match Hello::decode(payload) {
                    Ok(p) => p,
                    Err(WireError::UnsupportedVersion { got, .. }) => {
                        // frames of our version, a Hello of another: say so in a Reject
                        let reason = version_refusal(got);
                        warn!(peer = %addr, "refusing connection: {reason}");
                        let reject = Reject {
                            code: RejectCode::BadHandshake,
                            reason: reason.clone(),
                        };
                        send.push((FrameType::Reject, reject.encode()));
                        return Outcome::Refuse(CloseReason::Rejected(reason));
                    }
                    Err(e) => return Outcome::Drop(CloseReason::Protocol(e)),
                };
                let refuse = |code, reason: String, send: &mut Vec<(FrameType, Vec<u8>)>| {
                    warn!(peer = %addr, node = %peer.node_id, "refusing connection: {reason}");
                    send.push((
                        FrameType::Reject,
                        Reject {
                            code,
                            reason: reason.clone(),
                        }
                        .encode(),
                    ));
                    Outcome::Refuse(CloseReason::Rejected(reason))
                };
                if peer.run_id != cfg.run_id {
                    let reason = format!(
                        "run id {:?} is not this run ({:?})",
                        peer.run_id, cfg.run_id
                    );
                    return refuse(RejectCode::WrongRun, reason, send);
                }
                if secret.is_some() && peer.nonce == 0 {
                    let reason = "this run requires authentication (set run.secret or EVB_SECRET)"
                        .to_string();
                    return refuse(RejectCode::BadHandshake, reason, send);
                }
                let mut local = cfg.local.clone();
                local.nonce = match secret.map(|_| auth::nonce()) {
                    None => 0,
                    Some(Ok(n)) => n,
                    Some(Err(e)) => {
                        warn!(peer = %addr, "cannot authenticate: {e}");
                        return refuse(RejectCode::Other, e.to_string(), send);
                    }
                };
                // an empty HelloAck would be a protocol error at the peer: say why instead
                let ack = match local.encode() {
                    Ok(ack) => ack,
                    Err(e) => {
                        let reason = format!("cannot encode this node's HelloAck: {e}");
                        warn!(peer = %addr, "{reason}");
                        return refuse(RejectCode::Other, reason, send);
                    }
                };
                send.push((FrameType::HelloAck, ack.clone()));
                match secret {
                    Some(secret) => {
                        send.push((FrameType::Auth, auth::acceptor_proof(secret, payload, &ack)));
                        self.hello = payload.to_vec();
                        self.ack = ack;
                        self.peer = Some(peer);
                        {
                            self.phase = Phase::Auth;
                            Outcome::Continue
                        }
                    }
                    None => {
                        debug!(peer = %addr, node = %peer.node_id, "accepted");
                        Outcome::Open(peer)
                    }
                }
            }
            (Phase::Ack, FrameType::HelloAck) => {
                let peer = match Hello::decode(payload) {
                    Ok(p) => p,
                    Err(e) => return Outcome::Drop(CloseReason::Protocol(e)),
                };
                match (secret.is_some(), peer.nonce) {
                    (false, 0) => Outcome::Open(peer),
                    (false, _) => Outcome::Drop(CloseReason::Rejected(
                        "the peer requires a shared secret and none is configured".into(),
                    )),
                    (true, 0) => Outcome::Drop(CloseReason::Rejected(
                        "the peer does not authenticate; refusing to talk to it".into(),
                    )),
                    (true, _) => {
                        self.ack = payload.to_vec();
                        self.peer = Some(peer);
                        {
                            self.phase = Phase::Auth;
                            Outcome::Continue
                        }
                    }
                }
            }
            (Phase::Auth, FrameType::Auth) => {
                let secret = secret.unwrap_or_default();
                // each side checks the other's proof: an outbound connection checks the acceptor's
                if !auth::check(secret, self.outbound, &self.hello, &self.ack, payload) {
                    warn!(peer = %addr, "authentication failed: wrong shared secret");
                    return Outcome::Drop(CloseReason::Rejected(
                        "authentication failed: wrong shared secret".into(),
                    ));
                }
                let Some(peer) = self.peer.take() else {
                    return Outcome::Drop(CloseReason::Lost("handshake state".into()));
                };
                if self.outbound {
                    send.push((
                        FrameType::Auth,
                        auth::connector_proof(secret, &self.hello, &self.ack),
                    ));
                } else {
                    debug!(peer = %addr, node = %peer.node_id, "accepted (authenticated)");
                }
                Outcome::Open(peer)
            }
            (Phase::Ack | Phase::Auth, FrameType::Reject) => {
                let why = match Reject::decode(payload) {
                    Ok(r) => r.reason,
                    Err(e) => format!("undecodable reject: {e}"),
                };
                Outcome::Drop(CloseReason::Rejected(why))
            }
            (_, t) => Outcome::Drop(CloseReason::Protocol(WireError::OutOfRange {
                what: "frame type in this connection state",
                value: t as u64,
            })),
        }
    }
}

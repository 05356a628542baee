//! The `inproc` transport: nodes as threads of one process, frames over channels.
//!
//! Listening names a place in a process-wide registry; shared slices cross unchanged (no
//! copy), owned bytes are copied once into the receiver's pool so every received payload
//! lives in pool blocks, as with any other transport. Queues are unbounded (the event
//! builder's credits bound what is in flight), but `queued_bytes` counts what the peer has
//! not yet taken, so a slow receiver can be seen (pub/sub's slow-subscriber policies).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use evb_buffers::{Chain, Pool};
use evb_wire::{FrameType, Hello};

use crate::{
    CloseReason, ConnId, Event, InFrame, Segment, Transport, TransportConfig, TransportError,
};

enum Wire {
    Connect {
        reply: Sender<Wire>,
        their_conn: ConnId,
        hello: Hello,
    },
    Accept {
        to: ConnId,
        their_conn: ConnId,
        hello: Hello,
    },
    Refuse {
        to: ConnId,
        reason: String,
    },
    Frame {
        to: ConnId,
        frame_type: FrameType,
        count: u32,
        sequence: u64,
        segments: Vec<Segment>,
        /// The sender's count of bytes not yet taken by this receiver (`queued_bytes`).
        queued: Arc<AtomicUsize>,
        len: usize,
    },
    Bye {
        to: ConnId,
    },
}

fn registry() -> &'static Mutex<HashMap<String, Sender<Wire>>> {
    static REG: OnceLock<Mutex<HashMap<String, Sender<Wire>>>> = OnceLock::new();
    REG.get_or_init(Default::default)
}

struct Peer {
    tx: Sender<Wire>,
    /// The peer's id for this connection (None until it accepts).
    their_conn: Option<ConnId>,
    next_seq: u64,
    /// Bytes sent and not yet taken by the peer's `poll`.
    queued: Arc<AtomicUsize>,
}

pub struct InprocTransport {
    cfg: TransportConfig,
    inbox_tx: Sender<Wire>,
    inbox: Receiver<Wire>,
    conns: HashMap<ConnId, Peer>,
    next_conn: u64,
    names: Vec<String>,
    local_events: Vec<Event>,
}

impl InprocTransport {
    pub fn new(cfg: TransportConfig) -> Self {
        let (inbox_tx, inbox) = crossbeam_channel::unbounded();
        InprocTransport {
            cfg,
            inbox_tx,
            inbox,
            conns: HashMap::new(),
            next_conn: 1,
            names: Vec::new(),
            local_events: Vec::new(),
        }
    }

    fn new_conn(&mut self, tx: Sender<Wire>, their_conn: Option<ConnId>) -> ConnId {
        let id = ConnId(self.next_conn);
        self.next_conn += 1;
        self.conns.insert(
            id,
            Peer {
                tx,
                their_conn,
                next_seq: 0,
                queued: Arc::new(AtomicUsize::new(0)),
            },
        );
        id
    }

    fn land(pool: &Pool, segments: Vec<Segment>) -> Option<Chain> {
        let mut chain = Chain::new();
        for s in segments {
            match s {
                Segment::Shared(slice) => chain.push(slice),
                Segment::Owned(bytes) => {
                    let mut rest = &bytes[..];
                    while !rest.is_empty() {
                        let mut w = pool.try_alloc()?;
                        let n = rest.len().min(w.capacity());
                        chain.push(w.append(&rest[..n]).expect("fits"));
                        rest = &rest[n..];
                    }
                }
            }
        }
        Some(chain)
    }

    fn handle(&mut self, msg: Wire, out: &mut Vec<Event>) {
        match msg {
            Wire::Connect {
                reply,
                their_conn,
                hello,
            } => {
                if hello.run_id != self.cfg.run_id {
                    let reason = format!(
                        "run id {:?} is not this run ({:?})",
                        hello.run_id, self.cfg.run_id
                    );
                    let _ = reply.send(Wire::Refuse {
                        to: their_conn,
                        reason,
                    });
                    return;
                }
                let conn = self.new_conn(reply.clone(), Some(their_conn));
                let _ = reply.send(Wire::Accept {
                    to: their_conn,
                    their_conn: conn,
                    hello: self.cfg.local.clone(),
                });
                out.push(Event::Accepted { conn, peer: hello });
            }
            Wire::Accept {
                to,
                their_conn,
                hello,
            } => {
                if let Some(p) = self.conns.get_mut(&to) {
                    p.their_conn = Some(their_conn);
                    out.push(Event::Connected {
                        conn: to,
                        peer: hello,
                    });
                }
            }
            Wire::Refuse { to, reason } => {
                self.conns.remove(&to);
                out.push(Event::Closed {
                    conn: to,
                    reason: CloseReason::Rejected(reason),
                });
            }
            Wire::Frame {
                to,
                frame_type,
                count,
                sequence,
                segments,
                queued,
                len,
            } => {
                queued.fetch_sub(len, Ordering::Relaxed);
                if !self.conns.contains_key(&to) {
                    return;
                }
                match Self::land(&self.cfg.rx_pool, segments) {
                    Some(payload) => out.push(Event::Frame {
                        conn: to,
                        frame: InFrame {
                            frame_type,
                            count,
                            sequence,
                            payload,
                        },
                    }),
                    None => {
                        // No pool memory for the copy: treat like a transport failure, visibly.
                        self.conns.remove(&to);
                        out.push(Event::Closed {
                            conn: to,
                            reason: CloseReason::Lost("receive pool exhausted".into()),
                        });
                    }
                }
            }
            Wire::Bye { to } => {
                if self.conns.remove(&to).is_some() {
                    out.push(Event::Closed {
                        conn: to,
                        reason: CloseReason::PeerClosed,
                    });
                }
            }
        }
    }
}

impl Drop for InprocTransport {
    fn drop(&mut self) {
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        for n in &self.names {
            reg.remove(n);
        }
        for p in self.conns.values() {
            if let Some(to) = p.their_conn {
                let _ = p.tx.send(Wire::Bye { to });
            }
        }
    }
}

impl Transport for InprocTransport {
    fn listen(&mut self, addr: &str) -> Result<String, TransportError> {
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        if reg.contains_key(addr) {
            return Err(TransportError::Io {
                addr: addr.to_string(),
                source: std::io::ErrorKind::AddrInUse.into(),
            });
        }
        reg.insert(addr.to_string(), self.inbox_tx.clone());
        self.names.push(addr.to_string());
        Ok(addr.to_string())
    }

    fn connect(&mut self, addr: &str, hello: Hello) -> Result<ConnId, TransportError> {
        let target = registry()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(addr)
            .cloned();
        let conn = ConnId(self.next_conn);
        match target {
            Some(tx) => {
                let conn = self.new_conn(tx.clone(), None);
                let _ = tx.send(Wire::Connect {
                    reply: self.inbox_tx.clone(),
                    their_conn: conn,
                    hello,
                });
                Ok(conn)
            }
            None => {
                self.next_conn += 1;
                self.local_events.push(Event::Closed {
                    conn,
                    reason: CloseReason::ConnectFailed(format!("nobody listens on {addr}")),
                });
                Ok(conn)
            }
        }
    }

    fn send(
        &mut self,
        conn: ConnId,
        frame_type: FrameType,
        count: u32,
        segments: Vec<Segment>,
    ) -> Result<(), TransportError> {
        let p = self
            .conns
            .get_mut(&conn)
            .ok_or(TransportError::NoConnection(conn))?;
        let to = p.their_conn.ok_or(TransportError::NotOpen(conn))?;
        let len: usize = segments.iter().map(Segment::len).sum();
        if len > self.cfg.max_frame as usize {
            return Err(TransportError::TooLarge {
                len,
                max: self.cfg.max_frame as usize,
            });
        }
        let sequence = p.next_seq;
        p.next_seq += 1;
        p.queued.fetch_add(len, Ordering::Relaxed);
        if p.tx
            .send(Wire::Frame {
                to,
                frame_type,
                count,
                sequence,
                segments,
                queued: p.queued.clone(),
                len,
            })
            .is_err()
        {
            self.conns.remove(&conn);
            self.local_events.push(Event::Closed {
                conn,
                reason: CloseReason::Lost("peer gone".into()),
            });
        }
        Ok(())
    }

    fn queued_bytes(&self, conn: ConnId) -> usize {
        self.conns
            .get(&conn)
            .map_or(0, |p| p.queued.load(Ordering::Relaxed))
    }

    fn close(&mut self, conn: ConnId) {
        if let Some(p) = self.conns.remove(&conn) {
            if let Some(to) = p.their_conn {
                let _ = p.tx.send(Wire::Bye { to });
            }
            self.local_events.push(Event::Closed {
                conn,
                reason: CloseReason::Local,
            });
        }
    }

    fn poll(&mut self, out: &mut Vec<Event>, timeout: Option<Duration>) -> std::io::Result<()> {
        out.append(&mut self.local_events);
        let first = if out.is_empty() {
            match timeout {
                Some(t) => self.inbox.recv_timeout(t).ok(),
                None => self.inbox.recv().ok(),
            }
        } else {
            self.inbox.try_recv().ok()
        };
        if let Some(m) = first {
            self.handle(m, out);
            // Every frame lands in receive blocks of its own: stop taking more while the pool
            // runs low (the rest wait in the inbox, in order) rather than exhaust it and lose
            // the connection; the blocks come back as the program drops what it received.
            let reserve = (self.cfg.rx_pool.stats().blocks / 4).max(2);
            for _ in 0..1024 {
                if self.cfg.rx_pool.free_blocks() <= reserve {
                    break;
                }
                match self.inbox.try_recv() {
                    Ok(m) => self.handle(m, out),
                    Err(_) => break,
                }
            }
        }
        Ok(())
    }
}

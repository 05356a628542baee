//! The `ofi` transport proper: connected message endpoints (FI_EP_MSG), one event queue for
//! connection management and one completion queue for every send and receive, both driven
//! from `poll`.
//!
//! On the wire, each connection carries the same frames as `tcp` (header, sequence numbers,
//! handshake), cut into libfabric messages of at most the receiver's block size (learnt from
//! the connection request's private data). Frame headers are never split between messages,
//! so the receiver parses each received block on its own: complete frames, and the parts of
//! large ones, become slices of the block the provider wrote — no copy.
//!
//! Here: the transport, posting receives and sends, and `poll`. One connection's state is in
//! `imp/conn.rs`, what the provider reports is handled in `imp/events.rs`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::c_void;
use std::io;
use std::time::Duration;

use evb_buffers::{BlockWriter, Pool};
use evb_wire::{FrameType, Hello, WireError, FRAME_HEADER_LEN};
use tracing::{debug, warn};

mod conn;
mod events;

use super::sys::{self, CqEv, Fabric, Fid, Info, PostError};
use super::OfiError;
use crate::framing::{Admit, Cut, RxFramer, TxSeq};
use crate::handshake::{Handshake, Outcome};
use crate::tcp::{Admission, HANDSHAKE_FRAME_MAX};
use crate::{
    CloseReason, ConnId, Event, InFrame, Segment, Transport, TransportConfig, TransportError,
};

/// Private data in connection requests and accepts: magic, version, receive block size.
use conn::{Conn, Msg, State};

const CM_MAGIC: &[u8; 8] = b"evb-ofi\x01";
const CM_LEN: usize = 16;
/// Messages in flight per connection.
const TX_DEPTH: usize = 16;
/// Largest libfabric message (the receiver's block size permitting).
const MAX_MSG: usize = 1 << 20;
/// Completions handled per poll pass before other work gets a turn.
const CQ_BUDGET: usize = 1024;
/// Staging blocks for providers that need registered send buffers (FI_MR_LOCAL).
const STAGING_BLOCK: usize = 256 * 1024;
const STAGING_BLOCKS: usize = 64;
/// How long `poll` keeps driving a busy provider before it sleeps.
const BUSY_SPIN: Duration = Duration::from_micros(200);

enum Op {
    Recv { conn: u64, block: BlockWriter },
    Send { conn: u64 },
}

/// See the module docs.
pub(crate) struct Ofi {
    /// Connections, then listeners, then operations (their buffers), then registrations, then
    /// the fabric: the order `Drop` closes them in.
    conns: HashMap<u64, Conn>,
    listeners: HashMap<u64, Fid>,
    ops: HashMap<u64, Op>,
    rx_mr: Option<(Fid, usize)>,
    staging: Option<(Pool, Fid, usize)>,
    fabric: Fabric,
    cfg: TransportConfig,
    provider: String,
    next_id: u64,
    rx_depth: usize,
    iov_limit: usize,
    mr_local: bool,
    /// Connections waiting for receive-pool blocks.
    starved: HashSet<u64>,
    pending_events: Vec<Event>,
    cq_buf: Vec<CqEv>,
    pieces: Vec<(*const u8, usize)>,
    /// Completions handled so far (tells `poll` whether the provider is moving).
    completions: u64,
    /// Send completions handled so far: queue space freed, so `poll` returns and the caller
    /// may send more (as a writable socket does for `tcp`).
    sends_done: u64,
    /// Incoming connections that may be handshaking at once (`Admission::total`, scaled to
    /// the topology by `expect_peers`).
    handshake_room: usize,
}

// SAFETY: the raw pointers inside (libfabric objects opened with FI_THREAD_DOMAIN, and piece
// pointers into frames this struct owns) are only used through `&mut self`, so from one thread
// at a time; libfabric objects may move between threads.
unsafe impl Send for Ofi {}

impl Drop for Ofi {
    fn drop(&mut self) {
        // endpoints first (the provider stops touching our buffers), then the buffers,
        // registrations and the fabric (field order).
        self.conns.clear();
        self.listeners.clear();
        self.ops.clear();
        self.rx_mr = None;
        self.staging = None;
    }
}

fn split_addr(addr: &str) -> Result<(String, String), TransportError> {
    let bad = || TransportError::BadAddress(addr.to_string());
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    Ok((host.to_string(), port.to_string()))
}

fn cm_param(block: usize) -> [u8; CM_LEN] {
    let mut p = [0u8; CM_LEN];
    p[..8].copy_from_slice(CM_MAGIC);
    p[8..12].copy_from_slice(&(block.min(u32::MAX as usize) as u32).to_le_bytes());
    p
}

/// The peer's receive block size from its private data, if it is an evb peer.
fn cm_chunk(data: &[u8]) -> Option<usize> {
    if data.len() < CM_LEN || &data[..8] != CM_MAGIC {
        return None;
    }
    let block = u32::from_le_bytes(data[8..12].try_into().ok()?) as usize;
    (block >= 2 * FRAME_HEADER_LEN).then_some(block.min(MAX_MSG))
}

impl Ofi {
    pub(crate) fn new(cfg: TransportConfig, provider: String) -> Result<Ofi, TransportError> {
        let fabric =
            Fabric::new(&provider).map_err(|e| TransportError::Unavailable(e.to_string()))?;
        let blocks = cfg.rx_pool.free_blocks();
        Ok(Ofi {
            conns: HashMap::new(),
            listeners: HashMap::new(),
            ops: HashMap::new(),
            rx_mr: None,
            staging: None,
            fabric,
            rx_depth: (blocks / 8).clamp(1, 8),
            cfg,
            provider,
            next_id: 1,
            iov_limit: 1,
            mr_local: false,
            starved: HashSet::new(),
            pending_events: Vec::new(),
            cq_buf: vec![CqEv::default(); 64],
            pieces: Vec::new(),
            completions: 0,
            sends_done: 0,
            handshake_room: Admission::default().total,
        })
    }

    fn id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn getinfo(&mut self, addr: &str, source: bool) -> Result<Info, TransportError> {
        let (host, port) = split_addr(addr)?;
        let had_domain = self.fabric.has_domain();
        let info = self
            .fabric
            .getinfo(&host, &port, source)
            .map_err(|e| TransportError::Io {
                addr: addr.to_string(),
                source: io::Error::other(e),
            })?;
        if !had_domain {
            self.domain_opened();
        }
        Ok(info)
    }

    /// The domain exists now: register the receive pool (once) and learn the limits.
    fn domain_opened(&mut self) {
        self.mr_local = self.fabric.mr_local();
        self.iov_limit = self.fabric.iov_limit().clamp(1, 64);
        let (prov, domain) = self.fabric.names();
        debug!(provider = %prov, %domain, mr_local = self.mr_local, "ofi domain open");
        let pool = self.cfg.rx_pool.clone();
        if let Some(mut b) = pool.try_alloc() {
            let offset = b.slice(0, 0).region_offset();
            let base = b.spare_mut().as_mut_ptr().wrapping_sub(offset);
            // The pool (and so its region) lives as long as `cfg`, which outlives the MR.
            match self.fabric.register(base, pool.region_len()) {
                Ok(mr) => self.rx_mr = Some(mr),
                Err(e) => warn!("cannot register the receive pool: {e}"),
            }
        }
        if self.mr_local {
            let staging = Pool::new("ofi-tx", STAGING_BLOCK, STAGING_BLOCKS);
            if let Some(mut b) = staging.try_alloc() {
                let offset = b.slice(0, 0).region_offset();
                let base = b.spare_mut().as_mut_ptr().wrapping_sub(offset);
                drop(b);
                match self.fabric.register(base, staging.region_len()) {
                    Ok((mr, desc)) => self.staging = Some((staging, mr, desc)),
                    Err(e) => warn!("cannot register the send staging pool: {e}"),
                }
            }
        }
    }

    fn rx_desc(&self) -> usize {
        self.rx_mr.as_ref().map_or(0, |m| m.1)
    }

    /// Keeps `rx_depth` receives posted on `id`. Err: the endpoint failed.
    fn post_recvs(&mut self, id: u64) -> Result<(), OfiError> {
        let desc = self.rx_desc();
        loop {
            let Some(c) = self.conns.get(&id) else {
                return Ok(());
            };
            // before its handshake succeeds a connection gets one receive, not `rx_depth`
            let depth = if c.admitted { self.rx_depth } else { 1 };
            if c.rx_posted >= depth {
                self.starved.remove(&id);
                return Ok(());
            }
            let Some(mut block) = self.cfg.rx_pool.try_alloc() else {
                self.starved.insert(id);
                return Ok(());
            };
            let ctx = self.next_id;
            self.next_id += 1;
            let spare = block.spare_mut();
            let (ptr, len) = (spare.as_mut_ptr(), spare.len());
            // SAFETY: the block stays in `self.ops` (untouched by us: `BlockWriter` is its only
            // writer) until its completion arrives or the endpoint is closed, which
            // `drop_conn` does before dropping the block.
            match unsafe { sys::recv(&c.ep, ptr, len, desc, ctx) } {
                Ok(()) => {
                    self.ops.insert(ctx, Op::Recv { conn: id, block });
                    if let Some(c) = self.conns.get_mut(&id) {
                        c.rx_posted += 1;
                    }
                }
                Err(PostError::Full) => {
                    self.starved.insert(id);
                    return Ok(());
                }
                Err(PostError::Failed(e)) => return Err(e),
            }
        }
    }

    /// Posts what fits of `id`'s queue.
    fn pump_tx(&mut self, id: u64, out: &mut Vec<Event>) {
        let mut pieces = std::mem::take(&mut self.pieces);
        let mut failed = None;
        while let Some(c) = self.conns.get_mut(&id) {
            if !c.connected() || !c.has_unposted() || c.inflight.len() >= TX_DEPTH {
                break;
            }
            let saved = c.cursor;
            pieces.clear();
            let mut staging_block = None;
            let iovs: Vec<libc::iovec>;
            let mut descs: Vec<*mut c_void>;
            let len;
            if let Some((pool, _, desc)) = &self.staging {
                let Some(mut b) = pool.try_alloc() else {
                    break;
                };
                c.next_pieces(c.peer_chunk.min(STAGING_BLOCK), usize::MAX, &mut pieces);
                for &(p, n) in &pieces {
                    // SAFETY: each piece points into a frame held in `c.frames` (header box or
                    // segment bytes), alive and unchanged for this call.
                    let bytes = unsafe { std::slice::from_raw_parts(p, n) };
                    let _ = b.append(bytes);
                }
                len = b.filled();
                iovs = vec![libc::iovec {
                    iov_base: b.filled_bytes().as_ptr() as *mut c_void,
                    iov_len: len,
                }];
                descs = vec![*desc as *mut c_void];
                staging_block = Some(b);
            } else {
                c.next_pieces(c.peer_chunk, self.iov_limit, &mut pieces);
                iovs = pieces
                    .iter()
                    .map(|&(p, n)| libc::iovec {
                        iov_base: p as *mut c_void,
                        iov_len: n,
                    })
                    .collect();
                descs = vec![std::ptr::null_mut(); iovs.len()];
                len = pieces.iter().map(|p| p.1).sum();
            }
            if len == 0 {
                c.cursor = saved;
                break;
            }
            let ctx = self.next_id;
            self.next_id += 1;
            // SAFETY: the iovecs point into frames that stay in `c.frames` until this message's
            // completion (or into the staging block kept in `inflight`); the endpoint is closed
            // before either is dropped.
            match unsafe { sys::sendv(&c.ep, &iovs, &mut descs, ctx) } {
                Ok(()) => {
                    c.inflight.push_back(Msg {
                        ctx,
                        len,
                        done: false,
                        _staging: staging_block,
                    });
                    self.ops.insert(ctx, Op::Send { conn: id });
                }
                Err(PostError::Full) => {
                    c.cursor = saved;
                    break;
                }
                Err(PostError::Failed(e)) => {
                    c.cursor = saved;
                    failed = Some(e);
                    break;
                }
            }
        }
        self.pieces = pieces;
        if let Some(e) = failed {
            self.drop_conn(id, CloseReason::Lost(e.to_string()), out);
        }
    }

    fn begin_close(&mut self, id: u64, reason: CloseReason) {
        if let Some(c) = self.conns.get_mut(&id) {
            if c.state != State::Closing {
                c.state = State::Closing;
                c.close_reason = Some(reason);
            }
        }
    }

    fn drop_conn(&mut self, id: u64, reason: CloseReason, out: &mut Vec<Event>) {
        let Some(mut c) = self.conns.remove(&id) else {
            return;
        };
        let reason = c.close_reason.take().unwrap_or(reason);
        match &reason {
            CloseReason::Protocol(_) | CloseReason::Rejected(_) => {
                warn!(peer = %c.addr, "closed: {reason}")
            }
            _ => debug!(peer = %c.addr, "closed: {reason}"),
        }
        // Close the endpoint before its posted buffers and queued frames go.
        drop(c);
        self.ops.retain(|_, op| match op {
            Op::Recv { conn, .. } | Op::Send { conn } => *conn != id,
        });
        self.starved.remove(&id);
        out.push(Event::Closed {
            conn: ConnId(id),
            reason,
        });
    }
}

impl Transport for Ofi {
    fn expect_peers(&mut self, peers: usize) {
        self.handshake_room = Admission::for_peers(peers).total;
    }

    fn listen(&mut self, addr: &str) -> Result<String, TransportError> {
        let info = self.getinfo(addr, true)?;
        let id = self.id();
        let (pep, bound) = self
            .fabric
            .listen(&info, id)
            .map_err(|e| TransportError::Io {
                addr: addr.to_string(),
                source: io::Error::other(e),
            })?;
        self.listeners.insert(id, pep);
        debug!(provider = %self.provider, %bound, "ofi listening");
        Ok(bound)
    }

    fn connect(&mut self, addr: &str, hello: Hello) -> Result<ConnId, TransportError> {
        let info = self.getinfo(addr, false)?;
        let io_err = |e: OfiError| TransportError::Io {
            addr: addr.to_string(),
            source: io::Error::other(e),
        };
        let id = self.id();
        let ep = self.fabric.endpoint(&info, id).map_err(io_err)?;
        let mut c = Conn::new(ep, addr.to_string(), State::Connecting);
        let (hs, bytes) = Handshake::connect(hello, self.cfg.secret.as_deref())?;
        c.hs = hs;
        c.push(FrameType::Hello, 0, vec![Segment::Owned(bytes)]);
        self.conns.insert(id, c);
        let param = cm_param(self.cfg.rx_pool.block_size());
        let r = self
            .post_recvs(id)
            .and_then(|()| sys::connect(&self.conns[&id].ep, &info, &param));
        if let Err(e) = r {
            self.conns.remove(&id);
            self.ops.retain(|_, op| match op {
                Op::Recv { conn, .. } | Op::Send { conn } => *conn != id,
            });
            return Err(io_err(e));
        }
        Ok(ConnId(id))
    }

    fn send(
        &mut self,
        conn: ConnId,
        frame_type: FrameType,
        count: u32,
        segments: Vec<Segment>,
    ) -> Result<(), TransportError> {
        let max = self.cfg.max_frame as usize;
        let c = self
            .conns
            .get_mut(&conn.0)
            .ok_or(TransportError::NoConnection(conn))?;
        if c.state != State::Open {
            return Err(TransportError::NotOpen(conn));
        }
        let len: usize = segments.iter().map(Segment::len).sum();
        if len > max {
            return Err(TransportError::TooLarge { len, max });
        }
        c.push(frame_type, count, segments);
        let mut evs = Vec::new();
        self.pump_tx(conn.0, &mut evs);
        self.pending_events.extend(evs);
        Ok(())
    }

    fn queued_bytes(&self, conn: ConnId) -> usize {
        self.conns.get(&conn.0).map_or(0, |c| c.queued)
    }

    fn close(&mut self, conn: ConnId) {
        let mut evs = Vec::new();
        match self.conns.get(&conn.0).map(|c| c.state) {
            Some(State::Open) => {
                let c = self.conns.get_mut(&conn.0).expect("present");
                c.push(FrameType::Bye, 0, Vec::new());
                self.begin_close(conn.0, CloseReason::Local);
                self.pump_tx(conn.0, &mut evs);
            }
            Some(State::Closing) | None => {}
            Some(_) => self.drop_conn(conn.0, CloseReason::Local, &mut evs),
        }
        self.pending_events.extend(evs);
    }

    fn poll(&mut self, out: &mut Vec<Event>, timeout: Option<Duration>) -> io::Result<()> {
        out.append(&mut self.pending_events);
        self.expire_handshakes(out);
        let sends_done = self.sends_done;
        self.progress(out)?;
        // Sends that completed freed queue space: return, as `tcp` does when its socket turns
        // writable. Sleeping on here left a window-limited sender idle for its whole timeout
        // (the ~2 ms per frame stall of frames larger than one message).
        if !out.is_empty() || timeout == Some(Duration::ZERO) || self.sends_done != sends_done {
            return Ok(());
        }
        // The tcp provider makes progress only when called, and its wait fd does not wake a
        // sender whose socket had no room: with sends in flight, keep calling it (yielding the
        // core between passes) for up to BUSY_SPIN, then sleep at most a millisecond.
        if self.busy() {
            // keep going while completions keep coming (a socket draining), up to `timeout`
            let start = std::time::Instant::now();
            let limit = timeout.unwrap_or(Duration::MAX);
            let mut quiet_since = start;
            while start.elapsed() < limit && quiet_since.elapsed() < BUSY_SPIN {
                std::thread::yield_now();
                let before = self.completions;
                self.progress(out)?;
                if !out.is_empty() || !self.busy() || self.sends_done != sends_done {
                    return Ok(());
                }
                if self.completions != before {
                    quiet_since = std::time::Instant::now();
                }
            }
        }
        let busy = self.busy();
        // an incoming connection still handshaking has a deadline: look at least every 100 ms
        let timeout = if self
            .conns
            .values()
            .any(|c| c.accepted.is_some() && !c.admitted)
        {
            Some(timeout.map_or(Duration::from_millis(100), |t| {
                t.min(Duration::from_millis(100))
            }))
        } else {
            timeout
        };
        let ms = match timeout {
            None if busy => 1,
            None => -1,
            Some(t) => {
                let ms = t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
                if busy {
                    ms.min(1)
                } else {
                    ms
                }
            }
        };
        if ms != 0 {
            self.fabric.wait(ms);
        }
        self.progress(out)?;
        self.expire_handshakes(out);
        Ok(())
    }
}

#[cfg(test)]
mod tests;

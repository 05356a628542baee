//! Several transports behind one: each outgoing connection takes the transport its route
//! calls for (shm to a node on this host, tcp or ofi to another), incoming connections arrive
//! on whichever one the peer chose, and one `poll` serves them all.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use evb_wire::{FrameType, Hello};

use crate::{ConnId, Event, Segment, Transport, TransportCounters, TransportError};

/// Picks, for a peer's address, the index of the transport to call it with.
pub type Route = Box<dyn Fn(&str) -> usize + Send>;

pub struct MuxTransport {
    parts: Vec<Box<dyn Transport>>,
    route: Route,
    /// Outer id → (transport, its id), and back.
    conns: HashMap<ConnId, (usize, ConnId)>,
    outer: HashMap<(usize, ConnId), ConnId>,
    next: u64,
    /// Level-triggered epoll over the parts' own wait fds.
    epoll: Option<OwnedFd>,
    inner: Vec<Event>,
}

impl MuxTransport {
    pub fn new(parts: Vec<Box<dyn Transport>>, route: Route) -> MuxTransport {
        // SAFETY: plain system call; the result is checked before it is owned.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        // SAFETY: `ep` is a fresh descriptor owned by nobody else.
        let epoll = (ep >= 0).then(|| unsafe { OwnedFd::from_raw_fd(ep) });
        let mut all_fds = true;
        if let Some(ep) = &epoll {
            for p in &parts {
                match p.wait_fd() {
                    Some(fd) => {
                        let mut ev = libc::epoll_event {
                            events: libc::EPOLLIN as u32,
                            u64: fd as u64,
                        };
                        // SAFETY: valid epoll fd, valid fd, valid event pointer.
                        unsafe {
                            libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev)
                        };
                    }
                    None => all_fds = false,
                }
            }
        }
        MuxTransport {
            parts,
            route,
            conns: HashMap::new(),
            outer: HashMap::new(),
            next: 1,
            epoll: if all_fds { epoll } else { None },
            inner: Vec::new(),
        }
    }

    fn wrap(&mut self, part: usize, inner: ConnId) -> ConnId {
        if let Some(c) = self.outer.get(&(part, inner)) {
            return *c;
        }
        let c = ConnId(self.next);
        self.next += 1;
        self.conns.insert(c, (part, inner));
        self.outer.insert((part, inner), c);
        c
    }

    fn part_of(&self, conn: ConnId) -> Result<(usize, ConnId), TransportError> {
        self.conns
            .get(&conn)
            .copied()
            .ok_or(TransportError::NoConnection(conn))
    }

    /// Polls every part without waiting; translates what they report.
    fn sweep(&mut self, out: &mut Vec<Event>) -> std::io::Result<()> {
        for i in 0..self.parts.len() {
            self.parts[i].poll(&mut self.inner, Some(Duration::ZERO))?;
            for ev in std::mem::take(&mut self.inner) {
                out.push(match ev {
                    Event::Connected { conn, peer } => Event::Connected {
                        conn: self.wrap(i, conn),
                        peer,
                    },
                    Event::Accepted { conn, peer } => Event::Accepted {
                        conn: self.wrap(i, conn),
                        peer,
                    },
                    Event::Frame { conn, frame } => Event::Frame {
                        conn: self.wrap(i, conn),
                        frame,
                    },
                    Event::Closed { conn, reason } => {
                        let c = self.wrap(i, conn);
                        self.conns.remove(&c);
                        self.outer.remove(&(i, conn));
                        Event::Closed { conn: c, reason }
                    }
                });
            }
        }
        Ok(())
    }
}

impl Transport for MuxTransport {
    fn listen(&mut self, addr: &str) -> Result<String, TransportError> {
        // Every part listens on the first one's address: with port 0 the first picks the
        // port, and a caller of either part dials that one address.
        let mut first: Option<String> = None;
        for p in &mut self.parts {
            let bound = p.listen(first.as_deref().unwrap_or(addr))?;
            first.get_or_insert(bound);
        }
        Ok(first.unwrap_or_default())
    }

    fn connect(&mut self, addr: &str, hello: Hello) -> Result<ConnId, TransportError> {
        let i = (self.route)(addr).min(self.parts.len() - 1);
        let inner = self.parts[i].connect(addr, hello)?;
        Ok(self.wrap(i, inner))
    }

    fn send(
        &mut self,
        conn: ConnId,
        frame_type: FrameType,
        count: u32,
        segments: Vec<Segment>,
    ) -> Result<(), TransportError> {
        let (i, inner) = self.part_of(conn)?;
        self.parts[i].send(inner, frame_type, count, segments)
    }

    fn expect_peers(&mut self, peers: usize) {
        self.parts.iter_mut().for_each(|p| p.expect_peers(peers));
    }

    fn set_send_threads(&mut self, n: usize) -> Result<(), TransportError> {
        self.parts
            .iter_mut()
            .try_for_each(|p| p.set_send_threads(n))
    }

    fn queued_bytes(&self, conn: ConnId) -> usize {
        self.part_of(conn)
            .map_or(0, |(i, inner)| self.parts[i].queued_bytes(inner))
    }

    fn close(&mut self, conn: ConnId) {
        if let Ok((i, inner)) = self.part_of(conn) {
            self.parts[i].close(inner);
        }
    }

    fn poll(&mut self, out: &mut Vec<Event>, timeout: Option<Duration>) -> std::io::Result<()> {
        self.sweep(out)?;
        if !out.is_empty() || timeout == Some(Duration::ZERO) {
            return Ok(());
        }
        // Nothing yet: sleep until a part's fd is ready (or, without fds, a short while).
        // epoll counts whole milliseconds: a shorter wait rounds up, as mio's does, not
        // down to 0, which would return at once and leave the caller spinning
        let ms = timeout.map_or(-1, |t| {
            t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32
        });
        // every part arms its wake-ups (rings); one with work already means no sleep
        let mut ready = false;
        for p in &mut self.parts {
            ready |= !p.prepare_wait();
        }
        if ready {
            return self.sweep(out);
        }
        match &self.epoll {
            Some(ep) => {
                let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
                // SAFETY: valid epoll fd and a buffer of 8 events.
                unsafe { libc::epoll_wait(ep.as_raw_fd(), evs.as_mut_ptr(), evs.len() as i32, ms) };
            }
            None => std::thread::sleep(Duration::from_millis(ms.clamp(0, 1) as u64)),
        }
        self.sweep(out)
    }

    fn counters(&self) -> TransportCounters {
        self.parts
            .iter()
            .map(|p| p.counters())
            .fold(TransportCounters::default(), |a, b| TransportCounters {
                bytes_copied: a.bytes_copied + b.bytes_copied,
                bytes_by_reference: a.bytes_by_reference + b.bytes_by_reference,
            })
    }

    fn wait_fd(&self) -> Option<RawFd> {
        self.epoll.as_ref().map(|e| e.as_raw_fd())
    }

    fn prepare_wait(&mut self) -> bool {
        // every part is armed, even after one that has work
        let mut all = true;
        for p in &mut self.parts {
            all &= p.prepare_wait();
        }
        all
    }
}

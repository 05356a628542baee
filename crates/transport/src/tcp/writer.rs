//! Send threads: open connections' sockets written by threads beside the transport's own.
//!
//! One thread copies at most one core's worth of bytes into the kernel. A publisher sending
//! every large message to several subscribers (or any node sending to several peers) is
//! limited by that copy. With `n` send threads, the open connections are shared among
//! `n + 1` writers: the caller's thread (which writes its share inline, as without threads)
//! and the `n` threads, each connection going to the writer with the fewest (the first to
//! the caller's thread, so a single connection pays no hand-off). libzmq's I/O threads do
//! the same job. The receive side, the handshake and closing stay on the transport's loop.
//!
//! A connection handed to a thread keeps its frames in an [`Outbox`]: the transport pushes
//! frames (sequence numbers assigned in push order), the thread moves them to its own queue
//! and writes them when the socket takes bytes. The thread wakes the transport's loop when it
//! made progress (as a writable socket would have: at most one wake-up outstanding), so a
//! sender held back by a full queue learns at once that there is room again, also when it
//! waits on the transport's `wait_fd` (mux).

use std::collections::HashMap;

use evb_buffers::small_keys::SmallKeySet;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};
use tracing::warn;

use super::tx::TxQueue;

/// The waker's token in a send thread's poll and in the transport's.
pub(crate) const WAKE: Token = Token(usize::MAX);

/// Most send threads one transport may have.
pub const MAX_SEND_THREADS: usize = 16;

/// One connection's frames on their way to its send thread.
#[derive(Default)]
pub(crate) struct Outbox {
    pending: Mutex<TxQueue>,
    /// Bytes pushed and not yet taken by the kernel.
    queued: AtomicUsize,
    /// Why writing failed: the transport drops the connection with it.
    failed: Mutex<Option<String>>,
}

impl Outbox {
    fn new(continuing: &TxQueue) -> Outbox {
        Outbox {
            pending: Mutex::new(continuing.continuation()),
            ..Outbox::default()
        }
    }

    /// Queues one frame; true if the thread must be told (nothing was pending).
    pub(crate) fn push(
        &self,
        frame_type: evb_wire::FrameType,
        count: u32,
        segments: Vec<crate::Segment>,
    ) -> bool {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let was_empty = p.is_empty();
        let before = p.bytes();
        p.push(frame_type, count, segments);
        self.queued.fetch_add(p.bytes() - before, Ordering::AcqRel);
        was_empty
    }

    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    pub(crate) fn failure(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// What the threads tell the transport's loop.
#[derive(Default)]
struct Signal {
    /// A wake-up was sent that the loop's poll has not returned with yet.
    wake_pending: AtomicBool,
    /// Bumped by a thread after every write that moved bytes, or a failure.
    progress: AtomicU64,
}

enum Cmd {
    /// A connection to write from now on: its socket (a duplicate descriptor), its outbox,
    /// and frames already queued (perhaps partly written).
    Add(Token, OwnedFd, Arc<Outbox>, TxQueue),
    /// The connection's outbox has frames.
    Kick(Token),
    /// The connection is gone: stop writing it.
    Remove(Token),
}

struct Thread {
    cmds: Sender<Cmd>,
    waker: Arc<Waker>,
    join: Option<JoinHandle<()>>,
}

/// The transport's side: its threads, started when the first connection is handed over.
pub(crate) struct SendThreads {
    wanted: usize,
    threads: Vec<Thread>,
    /// Connections per writer: [0] the caller's thread, [i] thread i (1-based).
    load: Vec<usize>,
    /// Connections the caller's thread writes.
    inline: SmallKeySet<Token>,
    loop_waker: Arc<Waker>,
    signal: Arc<Signal>,
    seen: u64,
}

impl SendThreads {
    pub(crate) fn new(wanted: usize, loop_waker: Arc<Waker>) -> SendThreads {
        SendThreads {
            wanted,
            threads: Vec::new(),
            load: vec![0; wanted + 1],
            inline: SmallKeySet::default(),
            loop_waker,
            signal: Arc::default(),
            seen: 0,
        }
    }

    pub(crate) fn wanted(&self) -> usize {
        self.wanted
    }

    /// Gives an open connection a writer: None for the caller's thread, else the thread's
    /// number and the connection's outbox. `queued` holds what already waits for the socket
    /// (handshake frames); a thread takes it over.
    pub(crate) fn adopt(
        &mut self,
        token: Token,
        stream: &TcpStream,
        queued: &mut TxQueue,
    ) -> std::io::Result<Option<(usize, Arc<Outbox>)>> {
        let slot = (0..self.load.len())
            .min_by_key(|&i| self.load[i])
            .unwrap_or(0);
        if slot == 0 {
            self.load[0] += 1;
            self.inline.insert(token);
            return Ok(None);
        }
        // SAFETY: `dup` on a descriptor we own and keep open; the result is checked and then
        // owned by the OwnedFd alone.
        let fd = unsafe { libc::dup(stream.as_raw_fd()) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        while self.threads.len() < slot {
            self.threads.push(self.spawn()?);
        }
        self.load[slot] += 1;
        let queued = std::mem::take(queued);
        let outbox = Arc::new(Outbox::new(&queued));
        outbox.queued.store(queued.bytes(), Ordering::Release);
        let t = &self.threads[slot - 1];
        if t.cmds
            .send(Cmd::Add(token, fd, outbox.clone(), queued))
            .is_err()
        {
            self.load[slot] -= 1;
            return Err(std::io::Error::other("its send thread has stopped"));
        }
        let _ = t.waker.wake();
        Ok(Some((slot, outbox)))
    }

    /// The connection's outbox has new frames.
    pub(crate) fn kick(&self, thread: usize, token: Token) {
        if let Some(t) = self.threads.get(thread.wrapping_sub(1)) {
            let _ = t.cmds.send(Cmd::Kick(token));
            let _ = t.waker.wake();
        }
    }

    /// The connection is gone (`thread`: the one writing it, None: the caller's thread).
    pub(crate) fn forget(&mut self, thread: Option<usize>, token: Token) {
        match thread {
            Some(i) => {
                if let Some(t) = self.threads.get(i.wrapping_sub(1)) {
                    let _ = t.cmds.send(Cmd::Remove(token));
                    let _ = t.waker.wake();
                    self.load[i] -= 1;
                }
            }
            None => {
                if self.inline.remove(&token) {
                    self.load[0] -= 1;
                }
            }
        }
    }

    /// After the loop's poll: true if a thread made progress since the last call. A thread's
    /// progress after this sends a new wake-up, which the next poll sees.
    pub(crate) fn woke(&mut self) -> bool {
        self.signal.wake_pending.store(false, Ordering::SeqCst);
        let now = self.signal.progress.load(Ordering::SeqCst);
        let moved = now != self.seen;
        self.seen = now;
        moved
    }

    fn spawn(&self) -> std::io::Result<Thread> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
        let (tx, rx) = crossbeam_channel::unbounded();
        let signal = self.signal.clone();
        let loop_waker = self.loop_waker.clone();
        let join = std::thread::Builder::new()
            .name("evb-tcp-send".into())
            .spawn(move || run(poll, rx, signal, loop_waker))?;
        Ok(Thread {
            cmds: tx,
            waker,
            join: Some(join),
        })
    }
}

impl Drop for SendThreads {
    fn drop(&mut self) {
        for t in &mut self.threads {
            // closing the command channel ends the thread
            let (dead, _) = crossbeam_channel::bounded(0);
            t.cmds = dead;
            let _ = t.waker.wake();
        }
        for t in &mut self.threads {
            if let Some(j) = t.join.take() {
                let _ = j.join();
            }
        }
    }
}

struct Written {
    stream: TcpStream,
    outbox: Arc<Outbox>,
    queue: TxQueue,
    writable: bool,
}

/// A send thread: writes its connections' queues as their sockets take bytes.
fn run(mut poll: Poll, cmds: Receiver<Cmd>, signal: Arc<Signal>, loop_waker: Arc<Waker>) {
    let mut events = Events::with_capacity(256);
    let mut conns: HashMap<Token, Written> = HashMap::new();
    let mut work: Vec<Token> = Vec::new();
    loop {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                warn!("send thread: poll failed: {e}");
                // nobody writes these connections any more: they are lost, not stuck
                for c in conns.values() {
                    fail(
                        &c.outbox,
                        format!("send thread: poll failed: {e}"),
                        &signal,
                        &loop_waker,
                    );
                }
                return;
            }
        }
        for e in events.iter() {
            if e.token() != WAKE {
                if let Some(c) = conns.get_mut(&e.token()) {
                    c.writable = true;
                    work.push(e.token());
                }
            }
        }
        loop {
            match cmds.try_recv() {
                Ok(Cmd::Add(token, fd, outbox, queue)) => {
                    let mut stream = TcpStream::from(fd);
                    if let Err(e) = poll
                        .registry()
                        .register(&mut stream, token, Interest::WRITABLE)
                    {
                        fail(&outbox, format!("send thread: {e}"), &signal, &loop_waker);
                        continue;
                    }
                    conns.insert(
                        token,
                        Written {
                            stream,
                            outbox,
                            queue,
                            writable: true,
                        },
                    );
                    work.push(token);
                }
                Ok(Cmd::Kick(token)) => work.push(token),
                Ok(Cmd::Remove(token)) => {
                    if let Some(mut c) = conns.remove(&token) {
                        let _ = poll.registry().deregister(&mut c.stream);
                    }
                }
                Err(crossbeam_channel::TryRecvError::Empty) => break,
                Err(crossbeam_channel::TryRecvError::Disconnected) => return,
            }
        }
        work.sort_unstable();
        work.dedup();
        let mut moved = false;
        for token in work.drain(..) {
            let Some(c) = conns.get_mut(&token) else {
                continue;
            };
            match write(c) {
                Ok(n) => moved |= n > 0,
                Err(e) => {
                    let c = conns.remove(&token).expect("present");
                    fail(&c.outbox, e.to_string(), &signal, &loop_waker);
                }
            }
        }
        if moved {
            tell(&signal, &loop_waker);
        }
    }
}

/// Writes `c`'s frames until its socket is full or nothing is left; the bytes written.
fn write(c: &mut Written) -> std::io::Result<usize> {
    let mut total = 0;
    while c.writable {
        {
            let mut p = c.outbox.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.move_into(&mut c.queue);
        }
        if c.queue.is_empty() {
            break;
        }
        let before = c.queue.bytes();
        let done = c.queue.write_to(&mut c.stream)?;
        let n = before - c.queue.bytes();
        c.outbox.queued.fetch_sub(n, Ordering::AcqRel);
        total += n;
        c.writable = done;
    }
    Ok(total)
}

fn fail(outbox: &Outbox, why: String, signal: &Signal, loop_waker: &Waker) {
    *outbox.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    tell(signal, loop_waker);
}

/// Progress: wake the transport's loop, unless a wake-up is already on its way.
fn tell(signal: &Signal, loop_waker: &Waker) {
    signal.progress.fetch_add(1, Ordering::SeqCst);
    if !signal.wake_pending.swap(true, Ordering::SeqCst) {
        let _ = loop_waker.wake();
    }
}

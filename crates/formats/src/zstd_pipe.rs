//! Event bodies compressed on a thread of their own (`sink.compress = "zstd"`): the BU hands
//! an event's plain body over and builds on; the compressed record comes back, in the order
//! given, to be written by the file's writer. What the thread makes is exactly what the
//! writer made itself before (the same compressor, level and rule: the body stored as it
//! is where compressing does not make it smaller).

use std::collections::VecDeque;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

/// An event's body to compress, and what its record header needs.
pub(crate) struct Job {
    pub(crate) event_id: u64,
    pub(crate) trigger: u32,
    pub(crate) count: u16,
    pub(crate) flags: u16,
    pub(crate) plain: Vec<u8>,
}

/// A compressed event: its record's fields and body (the body as it was, where compressing
/// did not make it smaller).
pub(crate) struct Done {
    pub(crate) event_id: u64,
    pub(crate) trigger: u32,
    pub(crate) count: u16,
    /// The event's flags, with the compressed-body flag where the body is compressed.
    pub(crate) flags: u16,
    pub(crate) body: Vec<u8>,
    /// The body's CRC32C (in its record header, and joined into the file's).
    pub(crate) body_crc: u32,
    /// Bytes of the plain body (what the event adds to the file at most).
    pub(crate) plain_len: u64,
}

/// The compressing thread and the records on their way to the file.
pub(crate) struct Pipe {
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    /// Jobs given whose records have not come back.
    pub(crate) in_flight: usize,
    /// Records back and not yet in the file, in file order.
    pub(crate) queued: VecDeque<Done>,
    /// Records staged since the last write that reached the file (put back in front of
    /// `queued` if the next one fails).
    pub(crate) unflushed: Vec<Done>,
    /// Plain bytes of the events given and not yet staged.
    pub(crate) ahead_bytes: u64,
}

/// The compressed-body flag of an event record (docs/formats.md §3).
const ZSTD_FLAG: u16 = crate::events::EVENT_ZSTD;

impl Pipe {
    /// A thread compressing at `level` (`None`: no thread could be started, or zstd refused
    /// the level: the writer compresses in its own time).
    pub(crate) fn start(level: i32, name: String) -> Option<Pipe> {
        let mut c = zstd::bulk::Compressor::new(level).ok()?;
        let (jobs, rx) = channel::<Job>();
        let (tx, done) = channel::<Done>();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let mut packed = Vec::new();
                for j in rx {
                    packed.clear();
                    packed.reserve(zstd::zstd_safe::compress_bound(j.plain.len()));
                    let smaller = c.compress_to_buffer(&j.plain, &mut packed).is_ok()
                        && packed.len() < j.plain.len();
                    let plain_len = j.plain.len() as u64;
                    let (body, flags) = if smaller {
                        (packed.clone(), j.flags | ZSTD_FLAG)
                    } else {
                        (j.plain, j.flags)
                    };
                    let d = Done {
                        event_id: j.event_id,
                        trigger: j.trigger,
                        count: j.count,
                        flags,
                        body_crc: crc32c::crc32c(&body),
                        body,
                        plain_len,
                    };
                    if tx.send(d).is_err() {
                        return;
                    }
                }
            })
            .ok()?;
        Some(Pipe {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
            in_flight: 0,
            queued: VecDeque::new(),
            unflushed: Vec::new(),
            ahead_bytes: 0,
        })
    }

    /// Hands `job` to the thread. `Err`: the thread is gone (the job comes back).
    pub(crate) fn give(&mut self, job: Job) -> Result<(), Job> {
        let n = job.plain.len() as u64;
        let Some(jobs) = self.jobs.as_ref() else {
            return Err(job);
        };
        jobs.send(job).map_err(|e| e.0)?;
        self.in_flight += 1;
        self.ahead_bytes += n;
        Ok(())
    }

    /// Moves the records back from the thread to `queued`; with `wait`, every one in flight.
    /// `false`: the thread is gone with records in flight (they are lost: the file cannot be
    /// completed).
    pub(crate) fn collect(&mut self, wait: bool) -> bool {
        while self.in_flight > 0 {
            let d = if wait {
                match self.done.recv() {
                    Ok(d) => d,
                    Err(_) => return false,
                }
            } else {
                match self.done.try_recv() {
                    Ok(d) => d,
                    Err(std::sync::mpsc::TryRecvError::Empty) => return true,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => return false,
                }
            };
            self.in_flight -= 1;
            self.queued.push_back(d);
        }
        true
    }

    /// After a failed write: the records staged since the last good one go back in front of
    /// the queue, in order.
    pub(crate) fn requeue(&mut self) {
        for d in self.unflushed.drain(..).rev() {
            self.ahead_bytes += d.plain_len;
            self.queued.push_front(d);
        }
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

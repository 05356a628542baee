//! The file sink's syncer: a thread that makes closed files durable (`fdatasync` of the data,
//! the metadata written and synced) and publishes committed ones (two renames, the directory
//! synced) while the BU's loop goes on building. A sync waits a millisecond or more for the
//! disk; done in the loop, a file of a few hundred small events spent about as long waiting
//! as building.
//!
//! Jobs run one at a time, in the order given, and each result comes back once. Dropping the
//! syncer lets the thread finish the jobs it was given, and waits for it.

use std::collections::VecDeque;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{unbounded, Receiver, Sender};
use evb_formats::events::{EventFileError, FileMeta, PartWriter, PrepareJob};

/// What the thread is asked to do with a part.
pub(crate) enum Job {
    /// Make it durable under its temporary names.
    Prepare(Box<PrepareJob>),
    /// Rename it into place and sync the directory (the writer goes to the thread and back).
    Publish(Box<dyn PartWriter>),
}

/// What came of a [`Job`].
pub(crate) enum Outcome {
    Prepared(Result<(), EventFileError>),
    Published(Box<dyn PartWriter>, Result<FileMeta, EventFileError>),
}

impl Job {
    fn run(self) -> Outcome {
        match self {
            Job::Prepare(job) => Outcome::Prepared(job.run()),
            Job::Publish(mut w) => {
                let r = w.publish();
                Outcome::Published(w, r)
            }
        }
    }
}

type Done = (u32, Outcome);

pub(crate) struct Syncer {
    name: String,
    worker: Option<Worker>,
    /// Results of jobs run in the caller's thread (no thread could be started).
    inline: VecDeque<Done>,
    in_flight: usize,
    /// When each job in flight was started, oldest first (results come back in order).
    started: VecDeque<Instant>,
}

struct Worker {
    jobs: Option<Sender<(u32, Job)>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
}

impl Syncer {
    /// `name` names the thread, which starts with the first job.
    pub(crate) fn new(name: String) -> Syncer {
        Syncer {
            name,
            worker: None,
            inline: VecDeque::new(),
            in_flight: 0,
            started: VecDeque::new(),
        }
    }

    /// Jobs started whose results [`Syncer::next`] has not returned yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// When the oldest job still in flight was started.
    pub(crate) fn oldest_started(&self) -> Option<Instant> {
        self.started.front().copied()
    }

    /// Runs `job` for part `part` on the thread (in the caller's time if no thread can be
    /// started: slower, not wrong).
    pub(crate) fn start(&mut self, part: u32, job: Job) {
        self.in_flight += 1;
        self.started.push_back(Instant::now());
        if self.worker.is_none() {
            self.worker = spawn(&self.name);
        }
        let job = match self.worker.as_ref().and_then(|w| w.jobs.as_ref()) {
            Some(jobs) => match jobs.send((part, job)) {
                Ok(()) => return,
                Err(e) => e.into_inner().1,
            },
            None => job,
        };
        self.inline.push_back((part, job.run()));
    }

    /// A finished job's part and result; with `wait`, waits for one while any is in flight.
    pub(crate) fn next(&mut self, wait: bool) -> Option<Done> {
        if self.in_flight == 0 {
            return None;
        }
        let done = match self.inline.pop_front() {
            Some(d) => Some(d),
            None => {
                let w = self.worker.as_ref()?;
                if wait {
                    w.done.recv().ok()
                } else {
                    w.done.try_recv().ok()
                }
            }
        };
        if done.is_some() {
            self.in_flight -= 1;
            self.started.pop_front();
        }
        done
    }
}

fn spawn(name: &str) -> Option<Worker> {
    let (jobs, rx) = unbounded::<(u32, Job)>();
    let (tx, done) = unbounded();
    let thread = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            for (part, job) in rx {
                if tx.send((part, job.run())).is_err() {
                    return;
                }
            }
        })
        .ok()?;
    Some(Worker {
        jobs: Some(jobs),
        done,
        thread: Some(thread),
    })
}

impl Drop for Syncer {
    fn drop(&mut self) {
        if let Some(w) = &mut self.worker {
            w.jobs = None;
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evb_formats::events::EventFileWriter;

    /// Every job's result comes back once, in the order given, and the synced files are
    /// durable under their temporary names (their metadata written).
    #[test]
    fn every_sync_comes_back_once_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Syncer::new("test-sync".into());
        let mut writers: Vec<EventFileWriter> = (0..5)
            .map(|seq| EventFileWriter::create(dir.path(), "r", 0, seq).unwrap())
            .collect();
        for (seq, w) in writers.iter_mut().enumerate() {
            s.start(
                seq as u32,
                Job::Prepare(Box::new(w.begin_prepare().unwrap().unwrap())),
            );
        }
        assert_eq!(s.in_flight(), 5);
        let mut parts = Vec::new();
        while let Some((part, r)) = s.next(true) {
            let Outcome::Prepared(r) = r else {
                panic!("only prepares were asked")
            };
            r.unwrap();
            parts.push(part);
        }
        assert_eq!(parts, vec![0, 1, 2, 3, 4]);
        assert_eq!(s.in_flight(), 0);
        assert!(s.next(true).is_none(), "nothing in flight: no wait");
        for (seq, w) in writers.iter_mut().enumerate() {
            assert!(dir
                .path()
                .join(format!(".r_bu0_{seq:06}.evb.json.tmp"))
                .exists());
            w.prepared();
            assert!(w.begin_prepare().unwrap().is_none(), "prepared once");
        }
        // publishing on the thread: each file in place once its outcome is back
        for (seq, w) in writers.into_iter().enumerate() {
            s.start(seq as u32, Job::Publish(Box::new(w)));
        }
        for seq in 0..5 {
            let Some((part, Outcome::Published(w, r))) = s.next(true) else {
                panic!("a publication comes back")
            };
            assert_eq!((part, r.unwrap().sequence), (seq, seq));
            assert_eq!(w.name(), format!("r_bu0_{seq:06}.evb"));
            assert!(dir.path().join(w.name()).exists());
            assert!(dir.path().join(format!("{}.json", w.name())).exists());
        }
    }
}

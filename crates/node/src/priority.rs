//! Raising a node above other work on its host (`run.priority`, docs/operations/running.md).
//!
//! Applied to the calling thread when a node starts, with its pinning and before it starts
//! threads of its own (they inherit both). Linux keeps the nice value and the scheduling
//! policy per thread, so `evb run`'s inproc nodes, which are threads, each raise themselves.

use std::io;

use evb_config::Priority;

/// The nice value of `priority = "high"`: the strongest, so that a compute process at nice 0
/// (CFS weight 1024 against 88761) gets about 1 % of a CPU a node wants.
pub const HIGH_NICE: i32 = -20;

/// The real-time priority of `priority = "realtime"` (SCHED_RR, 1 ..= 99): low, so that the
/// kernel's own real-time threads (watchdogs, interrupt threads) still come first.
pub const REALTIME_PRIORITY: i32 = 10;

/// Where the kernel says how much of each period real-time threads may take (-1: all).
const RT_RUNTIME: &str = "/proc/sys/kernel/sched_rt_runtime_us";

/// Raises the calling thread as `priority` says; returns what was done, in words. An
/// error names what is missing (the privilege, the kernel's bound).
pub fn raise_current_thread(priority: Priority) -> io::Result<String> {
    match priority {
        Priority::Normal => Ok("normal".into()),
        Priority::High => {
            // SAFETY: a plain system call on the calling thread (`who` 0); no memory is passed.
            let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, HIGH_NICE) };
            if rc != 0 {
                return Err(denied(io::Error::last_os_error(), "nice -20"));
            }
            Ok(format!("nice {HIGH_NICE}"))
        }
        Priority::Realtime => {
            let bound = std::fs::read_to_string(RT_RUNTIME)
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok());
            if bound == Some(-1) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "{RT_RUNTIME} is -1: the kernel would let a runaway real-time thread \
                         starve the host; set it (the default is 950000) or use \"high\""
                    ),
                ));
            }
            let param = libc::sched_param {
                sched_priority: REALTIME_PRIORITY,
            };
            // SAFETY: `param` is a valid sched_param for the call; pid 0 is the calling thread.
            let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_RR, &param) };
            if rc != 0 {
                return Err(denied(io::Error::last_os_error(), "SCHED_RR"));
            }
            Ok(format!("SCHED_RR {REALTIME_PRIORITY}"))
        }
    }
}

fn denied(e: io::Error, what: &str) -> io::Error {
    if e.kind() == io::ErrorKind::PermissionDenied {
        io::Error::new(
            e.kind(),
            format!("{what} needs root or CAP_SYS_NICE ({e}); use priority = \"normal\""),
        )
    } else {
        e
    }
}

/// The calling thread's nice value and scheduling policy, as the kernel has them.
pub fn current() -> (i32, i32) {
    // SAFETY: plain system calls on the calling thread; no memory is passed. getpriority
    // may return -1 as a value; the nice range makes that unambiguous enough here.
    unsafe {
        (
            libc::getpriority(libc::PRIO_PROCESS, 0),
            libc::sched_getscheduler(0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each level does what it says, on a thread of its own (the test runner's threads keep
    /// theirs); without the privilege the refusal names it.
    #[test]
    fn each_priority_is_applied_to_the_calling_thread_or_refused_by_name() {
        let normal = std::thread::spawn(|| {
            let before = current();
            raise_current_thread(Priority::Normal).unwrap();
            (before, current())
        })
        .join()
        .unwrap();
        assert_eq!(normal.0, normal.1, "normal changes nothing");

        let high = std::thread::spawn(|| {
            let r = raise_current_thread(Priority::High);
            // inherited by a thread started afterwards
            let child = std::thread::spawn(current).join().unwrap();
            (r, current(), child)
        })
        .join()
        .unwrap();
        match high.0 {
            Ok(words) => {
                assert_eq!(words, "nice -20");
                assert_eq!(high.1 .0, HIGH_NICE);
                assert_eq!(high.2 .0, HIGH_NICE, "a thread started after inherits it");
            }
            Err(e) => assert!(e.to_string().contains("CAP_SYS_NICE"), "{e}"),
        }

        let rt = std::thread::spawn(|| {
            let r = raise_current_thread(Priority::Realtime);
            (r, current())
        })
        .join()
        .unwrap();
        match rt.0 {
            Ok(words) => {
                assert_eq!(words, "SCHED_RR 10");
                assert_eq!(rt.1 .1, libc::SCHED_RR);
            }
            Err(e) => {
                let s = e.to_string();
                assert!(s.contains("CAP_SYS_NICE") || s.contains("-1"), "{s}");
            }
        }
        // the test runner's own thread is untouched
        assert_ne!(current().1, libc::SCHED_RR);
    }
}

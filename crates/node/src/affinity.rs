//! Pinning a node to the CPUs its configuration names (`[affinity]`).
//!
//! Applied to the calling thread when a node starts, before it starts any thread of its own
//! (those inherit it). `evb run` with the `inproc` transport runs each node as a thread, so
//! each is pinned on its own.

use std::io;

/// Lets the calling thread run only on `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain old data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        if c >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CPU {c} is out of range"),
            ));
        }
        // SAFETY: `c` is below CPU_SETSIZE (checked above), so the bit lies inside `set`.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPUs the calling thread may run on.
pub fn current_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: as above; the kernel fills `set`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable for the size passed; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: every index is below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_thread_runs_only_where_it_was_told() {
        let all = current_cpus().unwrap();
        let one = *all.last().unwrap();
        let seen = std::thread::spawn(move || {
            pin_current_thread(&[one]).unwrap();
            // a thread it starts inherits the set
            let child = std::thread::spawn(current_cpus).join().unwrap().unwrap();
            (current_cpus().unwrap(), child)
        })
        .join()
        .unwrap();
        assert_eq!(seen, (vec![one], vec![one]));
        // this thread was not touched
        assert_eq!(current_cpus().unwrap(), all);
    }

    #[test]
    fn cpus_that_do_not_exist_are_an_error() {
        let e = std::thread::spawn(|| pin_current_thread(&[1000]))
            .join()
            .unwrap();
        assert!(e.is_err());
        assert!(pin_current_thread(&[5000]).is_err());
    }
}

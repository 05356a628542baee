//! Listening sockets handed over by a launcher (`evb node --listen-fd ADDR=FD`).
//!
//! `evb run` picks free ports for nodes whose configuration says port 0. Were it to bind a
//! port, release it and let the node bind it again later, anything else on the host could
//! take the port in between, and the run would fail at the connect timeout. Instead the
//! launcher keeps the bound socket open and the node process inherits it: the port is never
//! free. Whoever listens on that address (the TCP transport, the control API) takes a
//! duplicate of the inherited socket instead of binding; the original stays open for the
//! process's life, so a node that runs several runs (`--serve`) listens on the same socket
//! each time.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::{FromRawFd, RawFd};
use std::sync::Mutex;

static OFFERED: Mutex<Vec<(SocketAddr, TcpListener)>> = Mutex::new(Vec::new());

/// Takes over file descriptor `fd`, a listening TCP socket bound to `addr`, for this
/// process's listeners. Refuses an fd that is not open, not a socket, or bound elsewhere.
pub fn adopt(addr: &str, fd: RawFd) -> Result<(), String> {
    let want: SocketAddr = addr
        .parse()
        .map_err(|_| format!("--listen-fd {addr}={fd}: not an address with a port"))?;
    // SAFETY: F_GETFD only reads the descriptor's flags; it fails on a descriptor that is
    // not open, which is checked before anything takes ownership of it.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags == -1 {
        return Err(format!(
            "--listen-fd {addr}={fd}: no such open file descriptor"
        ));
    }
    // Close it on exec again: programs this node starts (plug-ins) must not hold the port.
    // SAFETY: as above, on a descriptor just found open; only its flags change.
    unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
    // SAFETY: the launcher handed this descriptor to this process for exactly this use (it
    // is open, checked above), and nothing else in the process knows its number: owning it
    // here is the only ownership.
    let l = unsafe { TcpListener::from_raw_fd(fd) };
    match l.local_addr() {
        Ok(got) if got == want => {
            OFFERED
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((want, l));
            Ok(())
        }
        Ok(got) => Err(format!(
            "--listen-fd {addr}={fd}: the socket is bound to {got}, not {want}"
        )),
        Err(e) => {
            // not a socket: leave the descriptor as it was found
            std::mem::forget(l);
            Err(format!(
                "--listen-fd {addr}={fd}: not a listening socket ({e})"
            ))
        }
    }
}

/// A listener on `addr` made from an inherited socket (a duplicate: the inherited one stays
/// for the next run), if the launcher handed one over for that address.
pub fn listener(addr: SocketAddr) -> Option<std::io::Result<TcpListener>> {
    let offered = OFFERED.lock().unwrap_or_else(|p| p.into_inner());
    offered
        .iter()
        .find(|(a, _)| *a == addr)
        .map(|(_, l)| l.try_clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    #[test]
    fn an_adopted_socket_is_listened_on_again_and_again_without_binding() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let fd = l.into_raw_fd();
        adopt(&addr.to_string(), fd).unwrap();
        // the port stays taken: binding it again would fail, the adopted socket serves
        assert!(TcpListener::bind(addr).is_err());
        for _ in 0..2 {
            let mine = listener(addr).expect("offered").unwrap();
            let c = std::net::TcpStream::connect(addr).unwrap();
            let (s, _) = mine.accept().unwrap();
            assert_eq!(s.peer_addr().unwrap(), c.local_addr().unwrap());
        }
        let other: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert!(listener(other).is_none());
    }

    #[test]
    fn descriptors_that_are_not_the_named_listener_are_refused() {
        let e = adopt("127.0.0.1:1", 1_000_000).unwrap_err();
        assert!(e.contains("no such open file descriptor"), "{e}");
        let e = adopt("nonsense", 0).unwrap_err();
        assert!(e.contains("not an address"), "{e}");
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        let fd = l.into_raw_fd();
        let e = adopt("127.0.0.1:2", fd).unwrap_err();
        assert!(e.contains(&format!("bound to {at}")), "{e}");
        let f = std::fs::File::open("/proc/self/status").unwrap();
        let fd = f.into_raw_fd();
        let e = adopt("127.0.0.1:3", fd).unwrap_err();
        assert!(e.contains("not a listening socket"), "{e}");
        // SAFETY: the file's descriptor, given up above and not taken by `adopt`.
        drop(unsafe { std::fs::File::from_raw_fd(fd) });
    }
}

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
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

static OFFERED: Mutex<Vec<(SocketAddr, TcpListener)>> = Mutex::new(Vec::new());

/// Takes over `fd`, a listening TCP socket bound to `addr`, for this process's listeners.
/// Refuses (and closes) one that is not a socket or is bound elsewhere. The caller owns the
/// descriptor already (see `evb node --listen-fd`: it checks that the number is open before
/// taking it), so this function has nothing unsafe to trust.
pub fn adopt(addr: &str, fd: OwnedFd) -> Result<(), String> {
    let raw = fd.as_raw_fd();
    let want: SocketAddr = addr
        .parse()
        .map_err(|_| format!("--listen-fd {addr}={raw}: not an address with a port"))?;
    // Close it on exec again: programs this node starts (plug-ins) must not hold the port.
    // SAFETY: fcntl on a descriptor this function owns; only its flags change.
    unsafe {
        let flags = libc::fcntl(raw, libc::F_GETFD);
        if flags != -1 {
            libc::fcntl(raw, libc::F_SETFD, flags | libc::FD_CLOEXEC);
        }
    }
    let l = TcpListener::from(fd);
    match l.local_addr() {
        Ok(got) if got == want => {
            OFFERED
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((want, l));
            Ok(())
        }
        Ok(got) => Err(format!(
            "--listen-fd {addr}={raw}: the socket is bound to {got}, not {want}"
        )),
        Err(e) => Err(format!(
            "--listen-fd {addr}={raw}: not a listening socket ({e})"
        )),
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

    #[test]
    fn an_adopted_socket_is_listened_on_again_and_again_without_binding() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        adopt(&addr.to_string(), OwnedFd::from(l)).unwrap();
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
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = adopt("nonsense", OwnedFd::from(l)).unwrap_err();
        assert!(e.contains("not an address"), "{e}");
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        let e = adopt("127.0.0.1:2", OwnedFd::from(l)).unwrap_err();
        assert!(e.contains(&format!("bound to {at}")), "{e}");
        let f = std::fs::File::open("/proc/self/status").unwrap();
        let e = adopt("127.0.0.1:3", OwnedFd::from(f)).unwrap_err();
        assert!(e.contains("not a listening socket"), "{e}");
    }
}

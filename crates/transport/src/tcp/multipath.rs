//! Multipath TCP sockets (Linux MPTCP) for the TCP transport: the same byte stream, carried
//! by the kernel over one subflow per rail. A connect or listen differs from plain TCP only
//! in the protocol number; everything after (mio readiness, framing, `TCP_NODELAY`) is the
//! same, and a peer without MPTCP falls back to plain TCP inside the kernel.

use std::io;
use std::net::SocketAddr;

use mio::net::{TcpListener, TcpStream};
use socket2::{Domain, Protocol, Socket, Type};

fn socket(sa: SocketAddr) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::MPTCP))?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// Whether this kernel makes MPTCP sockets; the error says how to turn them on.
pub fn available() -> io::Result<()> {
    socket("127.0.0.1:0".parse().expect("an address"))
        .map(drop)
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "transport.multipath: this kernel makes no MPTCP socket ({e}); it needs \
                 Linux 5.6 or later with net.mptcp.enabled = 1"
                ),
            )
        })
}

/// A non-blocking MPTCP connect to `sa`: completes later, as mio's own connect does.
pub fn connect(sa: SocketAddr) -> io::Result<TcpStream> {
    let s = socket(sa)?;
    match s.connect(&sa.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from_std(std::net::TcpStream::from(s)))
}

/// An MPTCP listener on `sa` (address reuse and backlog as mio's own bind).
pub fn listen(sa: SocketAddr) -> io::Result<TcpListener> {
    let s = socket(sa)?;
    s.set_reuse_address(true)?;
    s.bind(&sa.into())?;
    s.listen(1024)?;
    Ok(TcpListener::from_std(std::net::TcpListener::from(s)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Where the kernel has MPTCP (net.mptcp.enabled), a connection over it carries bytes
    /// as TCP does; without it, `available` says so and nothing else is tried.
    #[test]
    fn an_mptcp_connection_carries_bytes_or_the_kernel_says_it_has_none() {
        if let Err(e) = available() {
            assert!(e.to_string().contains("net.mptcp.enabled"), "{e}");
            evb_buffers::skips::skipped("mptcp", &e.to_string());
            return;
        }
        let l = listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let at = l.local_addr().unwrap();
        let c = connect(at).unwrap();
        let mut accepted = None;
        for _ in 0..200 {
            match l.accept() {
                Ok((s, _)) => {
                    accepted = Some(s);
                    break;
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        }
        let mut server = accepted.expect("accepted");
        let mut client = c;
        let (mut sent, mut got, mut buf) = (0, Vec::new(), [0u8; 16]);
        for _ in 0..400 {
            if sent < 5 {
                sent += client.write(&b"hello"[sent..]).unwrap_or(0);
            }
            match server.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
            if got.len() >= 5 {
                break;
            }
        }
        assert_eq!(got, b"hello");
    }
}

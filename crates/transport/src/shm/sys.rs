//! The operating-system corner of the shm transport: Unix-domain SOCK_SEQPACKET sockets in
//! the abstract namespace (no file to clean up, gone with the process) and passing a memfd
//! with SCM_RIGHTS; creating and mapping the memfd of a FRAME ring. Everything `unsafe` in
//! the transport is here, but for the ring's atomics and bounded copies (`ring.rs`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use thiserror::Error;

/// Why a memfd a peer passed is not mapped.
#[derive(Debug, Error)]
pub enum MemfdError {
    #[error("an empty pool")]
    Empty,
    #[error("fstat: {0}")]
    Stat(io::Error),
    #[error("the descriptor is not a memfd (not a regular file)")]
    NotRegular,
    #[error("the memfd holds {size} bytes, the pool claims {len}")]
    Short { size: i64, len: usize },
    #[error("the memfd cannot be sealed: {0}")]
    Seals(io::Error),
    #[error(
        "the memfd is not sealed against resizing (seals {seals:#x}, need \
         F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL = {required:#x})"
    )]
    NotSealed {
        seals: libc::c_int,
        required: libc::c_int,
    },
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// An abstract-namespace address: a leading NUL, then the name (at most 107 bytes).
fn address(name: &str) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = name.as_bytes();
    if bytes.len() + 1 > a.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "shm address name too long",
        ));
    }
    for (i, b) in bytes.iter().enumerate() {
        a.sun_path[i + 1] = *b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + bytes.len();
    Ok((a, len as libc::socklen_t))
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: a plain system call; the result is checked before it is owned.
    let fd = cvt(unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn listen(name: &str) -> io::Result<OwnedFd> {
    let fd = socket()?;
    let (a, len) = address(name)?;
    // SAFETY: `a` is a valid sockaddr_un of length `len`.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) })?;
    // SAFETY: plain system call on our socket.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 256) })?;
    Ok(fd)
}

pub fn connect(name: &str) -> io::Result<OwnedFd> {
    let fd = socket()?;
    let (a, len) = address(name)?;
    // SAFETY: `a` is a valid sockaddr_un of length `len`.
    cvt(unsafe { libc::connect(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) })?;
    Ok(fd)
}

/// A pending connection, or `None` when there is none.
pub fn accept(listener: RawFd) -> io::Result<Option<OwnedFd>> {
    // SAFETY: null address pointers are allowed; flags make the new socket non-blocking.
    let r = unsafe {
        libc::accept4(
            listener,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock {
            Ok(None)
        } else {
            Err(e)
        };
    }
    // SAFETY: `r` is a fresh descriptor owned by nobody else.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(r) }))
}

/// The user id of the process at the other end.
pub fn peer_uid(fd: RawFd) -> Option<u32> {
    // SAFETY: ucred is plain old data; getsockopt fills at most `len` bytes of it.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: valid pointers to `cred` and `len`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred.uid)
}

pub fn my_uid() -> u32 {
    // SAFETY: always succeeds.
    unsafe { libc::geteuid() }
}

/// Sends one packet, with `pass` attached as SCM_RIGHTS. `Ok(false)`: the socket is full.
pub fn send(fd: RawFd, data: &[u8], pass: Option<BorrowedFd<'_>>) -> io::Result<bool> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cbuf = [0u64; 8]; // room for one cmsg with one fd, aligned
                              // SAFETY: msghdr is plain old data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(p) = pass {
        // SAFETY: CMSG_SPACE is a pure computation; the buffer is large enough for one fd.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points at `cbuf`, which holds `space` bytes, so the first header
        // and its data area lie inside it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), p.as_raw_fd());
        }
    }
    // SAFETY: `msg` points at live buffers for the duration of the call.
    let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock {
            Ok(false)
        } else {
            Err(e)
        };
    }
    if r as usize != data.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "packet cut short"));
    }
    Ok(true)
}

/// The seals a peer's memfd must carry before it is mapped: its size can then never change
/// (no SIGBUS from a shrunk file), and nobody can lift the seals.
pub const REQUIRED_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// Checks a memfd a peer passed before `len` bytes of it are mapped: a regular file at least
/// `len` bytes long, sealed with [`REQUIRED_SEALS`].
pub fn check_peer_memfd(fd: RawFd, len: usize) -> Result<(), MemfdError> {
    if len == 0 {
        return Err(MemfdError::Empty);
    }
    // SAFETY: stat is plain old data; all-zero is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is an open descriptor we own; `st` is a valid stat buffer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(MemfdError::Stat(io::Error::last_os_error()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(MemfdError::NotRegular);
    }
    if (st.st_size as u64) < len as u64 {
        return Err(MemfdError::Short {
            size: st.st_size as i64,
            len,
        });
    }
    // SAFETY: F_GET_SEALS takes no argument and only reads the descriptor's state.
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if seals < 0 {
        return Err(MemfdError::Seals(io::Error::last_os_error()));
    }
    if seals & REQUIRED_SEALS != REQUIRED_SEALS {
        return Err(MemfdError::NotSealed {
            seals,
            required: REQUIRED_SEALS,
        });
    }
    Ok(())
}

/// A new memfd of `len` bytes, sealed at that size with [`REQUIRED_SEALS`] (so that the peer
/// accepts it), for a FRAME ring.
pub fn sealed_memfd(name: &std::ffi::CStr, len: usize) -> io::Result<OwnedFd> {
    // SAFETY: plain system call on a valid C string; the result is checked before it is owned.
    let raw = cvt(unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    })?;
    // SAFETY: `raw` is a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    std::fs::File::from(fd.try_clone()?).set_len(len as u64)?;
    // SAFETY: F_ADD_SEALS on a memfd we own, with a plain integer argument.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, REQUIRED_SEALS) })?;
    Ok(fd)
}

/// Maps `len` bytes of `fd` shared, readable and writable (a ring: both ends write to it).
/// The caller unmaps it.
pub fn map_shared_rw(fd: RawFd, len: usize) -> io::Result<*mut u8> {
    // SAFETY: a fresh shared mapping of a file the caller holds open (and checked to be at
    // least `len` bytes long and sealed against shrinking, if it is a peer's); no Rust object
    // aliases it yet.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(ptr.cast())
}

/// What one receive gave.
pub enum Recv {
    Packet {
        len: usize,
        fd: Option<OwnedFd>,
        truncated: bool,
    },
    Empty,
    Eof,
}

pub fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<Recv> {
    match recv_once(fd, buf) {
        // A peer that closed with input of its own unread resets us, and the kernel reports
        // the reset ahead of the packets it had already sent us. Reading the error clears it:
        // the packets follow, then end of file, so nothing the peer wrote is lost.
        Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => match recv_once(fd, buf) {
            Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => Ok(Recv::Eof),
            Ok(Recv::Empty) => Ok(Recv::Eof),
            other => other,
        },
        other => other,
    }
}

fn recv_once(fd: RawFd, buf: &mut [u8]) -> io::Result<Recv> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain old data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: `msg` points at live buffers; CMSG_CLOEXEC keeps received fds from leaking to children.
    let r = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock {
            Ok(Recv::Empty)
        } else {
            Err(e)
        };
    }
    if r == 0 {
        return Ok(Recv::Eof);
    }
    // Every descriptor the kernel installed for us is ours: the first is kept, any other one
    // (a peer may pack several into one message, or several messages) is closed here.
    let mut passed = None;
    // SAFETY: walking the control messages the kernel wrote into `cbuf`, as described by `msg`
    // (CMSG_NXTHDR stops at msg_controllen); each SCM_RIGHTS message holds
    // (cmsg_len - CMSG_LEN(0)) / sizeof(int) descriptors, read unaligned from its data area.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let bytes = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    let raw = std::ptr::read_unaligned(data.add(i));
                    // the kernel installed `raw` in our table for this message: we own it
                    let fd = OwnedFd::from_raw_fd(raw);
                    if passed.is_none() {
                        passed = Some(fd);
                    } // else: dropped, so closed
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    let truncated = msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
    Ok(Recv::Packet {
        len: r as usize,
        fd: passed,
        truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors socketpair writes.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        assert_eq!(r, 0);
        // SAFETY: two fresh descriptors that nothing else owns.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    /// Sends one byte with several descriptors in one SCM_RIGHTS message, as a hostile peer may.
    fn send_fds(sock: RawFd, fds: &[RawFd]) {
        let byte = [TAG; 1];
        let mut iov = libc::iovec {
            iov_base: byte.as_ptr() as *mut libc::c_void,
            iov_len: 1,
        };
        let mut cbuf = [0u64; 8];
        let data = std::mem::size_of_val(fds) as u32;
        // SAFETY: msghdr is plain old data; all-zero is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        // SAFETY: a pure computation; 3 fds need 32 bytes, `cbuf` has 64.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(data) } as usize;
        // SAFETY: the header and its data area lie inside `cbuf` (see above).
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(data) as usize;
            for (i, fd) in fds.iter().enumerate() {
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>().add(i), *fd);
            }
        }
        // SAFETY: `msg` points at live buffers.
        let r = unsafe { libc::sendmsg(sock, &msg, 0) };
        assert_eq!(r, 1, "{}", io::Error::last_os_error());
    }
    const TAG: u8 = 9;

    #[test]
    fn every_received_descriptor_but_the_one_kept_is_closed() {
        let (a, b) = seqpacket_pair();
        let mut p = [0; 2];
        // SAFETY: `p` has room for the pipe's two descriptors.
        let made = unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
        assert_eq!(made, 0);
        // SAFETY: fresh descriptors that nothing else owns.
        let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        // three copies of the write end in one message
        send_fds(a.as_raw_fd(), &[wr.as_raw_fd(); 3]);
        drop(wr);
        let mut buf = [0u8; 16];
        let Recv::Packet { len, fd, .. } = recv(b.as_raw_fd(), &mut buf).unwrap() else {
            panic!("no packet")
        };
        assert_eq!((len, buf[0]), (1, TAG));
        assert!(fd.is_some(), "the first descriptor is handed over");
        drop(fd);
        // every write end is closed now, unless one leaked: then the read would block
        let mut one = [0u8; 1];
        // SAFETY: reading into a live one-byte buffer.
        let r = unsafe { libc::read(rd.as_raw_fd(), one.as_mut_ptr().cast(), 1) };
        assert_eq!(
            r,
            0,
            "a passed descriptor leaked: {}",
            io::Error::last_os_error()
        );
    }
}

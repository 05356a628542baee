//! The C shim's interface (csrc/evb_ofi.c) and thin safe wrappers over it.
//!
//! The shim owns every libfabric struct layout; what crosses here is its own `evb_` types,
//! opaque pointers and 64-bit operation ids.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use super::OfiError;

pub(crate) const EQ_CONNREQ: u32 = 1;
pub(crate) const EQ_CONNECTED: u32 = 2;
pub(crate) const EQ_SHUTDOWN: u32 = 3;
pub(crate) const EQ_ERROR: u32 = 4;

/// libfabric's FI_EAGAIN and FI_ECANCELED (errno values).
pub(crate) const FI_EAGAIN: isize = 11;
pub(crate) const FI_ECANCELED: i32 = 125;

#[repr(C)]
pub(crate) struct EqEv {
    pub kind: u32,
    pub err: i32,
    pub ctx: u64,
    pub info: *mut c_void,
    pub datalen: u32,
    pub data: [u8; 64],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct CqEv {
    pub ctx: u64,
    pub len: u64,
    pub err: i32,
    pub recv: u32,
}

#[repr(C)]
pub(crate) struct Shim {
    _private: [u8; 0],
}

extern "C" {
    fn evb_ofi_load(lib: *const c_char, err: *mut c_char, errlen: usize) -> c_int;
    fn evb_ofi_strerror(code: c_int) -> *const c_char;
    fn evb_ofi_check(
        prov: *const c_char,
        chosen: *mut c_char,
        chosenlen: usize,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    fn evb_ofi_new(prov: *const c_char) -> *mut Shim;
    fn evb_ofi_free(o: *mut Shim);
    fn evb_ofi_has_domain(o: *const Shim) -> c_int;
    fn evb_ofi_mr_local(o: *const Shim) -> c_int;
    fn evb_ofi_iov_limit(o: *const Shim) -> usize;
    fn evb_ofi_domain_name(o: *const Shim) -> *const c_char;
    fn evb_ofi_prov_name(o: *const Shim) -> *const c_char;
    fn evb_ofi_getinfo(
        o: *mut Shim,
        node: *const c_char,
        service: *const c_char,
        source: c_int,
        out: *mut *mut c_void,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    fn evb_ofi_freeinfo(info: *mut c_void);
    fn evb_ofi_pep(
        o: *mut Shim,
        info: *mut c_void,
        ctx: u64,
        out: *mut *mut c_void,
        bound: *mut c_char,
        boundlen: usize,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    fn evb_ofi_ep(
        o: *mut Shim,
        info: *mut c_void,
        ctx: u64,
        out: *mut *mut c_void,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    fn evb_ofi_connect(
        ep: *mut c_void,
        info: *mut c_void,
        param: *const c_void,
        plen: usize,
    ) -> c_int;
    fn evb_ofi_accept(ep: *mut c_void, param: *const c_void, plen: usize) -> c_int;
    fn evb_ofi_reject(pep: *mut c_void, info: *mut c_void) -> c_int;
    fn evb_ofi_shutdown(ep: *mut c_void) -> c_int;
    fn evb_ofi_close_fid(f: *mut c_void) -> c_int;
    fn evb_ofi_reg(
        o: *mut Shim,
        buf: *mut c_void,
        len: usize,
        mr: *mut *mut c_void,
        desc: *mut *mut c_void,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    fn evb_ofi_recv(
        ep: *mut c_void,
        buf: *mut c_void,
        len: usize,
        desc: *mut c_void,
        ctx: u64,
    ) -> isize;
    fn evb_ofi_sendv(
        ep: *mut c_void,
        iov: *const libc::iovec,
        desc: *mut *mut c_void,
        count: usize,
        ctx: u64,
    ) -> isize;
    fn evb_ofi_eq_read(o: *mut Shim, ev: *mut EqEv) -> c_int;
    fn evb_ofi_cq_read(o: *mut Shim, out: *mut CqEv, n: usize) -> c_int;
    fn evb_ofi_wait(o: *mut Shim, timeout_ms: c_int) -> c_int;
}

const ERRLEN: usize = 256;

fn errbuf() -> Vec<u8> {
    vec![0u8; ERRLEN]
}

fn text(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn cstring(s: &str) -> Result<CString, OfiError> {
    CString::new(s).map_err(|_| OfiError::Nul(s.to_string()))
}

/// Loads libfabric (once per process).
pub(crate) fn load(lib: &str) -> Result<(), OfiError> {
    let lib = cstring(lib)?;
    let mut err = errbuf();
    // SAFETY: valid NUL-terminated name; `err` is writable for ERRLEN bytes.
    let rc = unsafe { evb_ofi_load(lib.as_ptr(), err.as_mut_ptr().cast(), ERRLEN) };
    if rc == 0 {
        Ok(())
    } else {
        Err(OfiError::Libfabric(text(&err)))
    }
}

/// libfabric's message for an error number (positive or negative).
pub(crate) fn strerror(code: i64) -> String {
    // SAFETY: returns a pointer to a static string (libfabric's, or the shim's own).
    let p = unsafe { evb_ofi_strerror(code as c_int) };
    if p.is_null() {
        return format!("error {code}");
    }
    // SAFETY: non-null, NUL-terminated, static.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The provider that would be used for `prov` ("" = the best available). Needs `load`.
pub(crate) fn check(prov: &str) -> Result<String, OfiError> {
    let p = cstring(prov)?;
    let mut chosen = vec![0u8; 64];
    let mut err = errbuf();
    // SAFETY: valid C string; both buffers writable for the lengths given.
    let rc = unsafe {
        evb_ofi_check(
            p.as_ptr(),
            chosen.as_mut_ptr().cast(),
            chosen.len(),
            err.as_mut_ptr().cast(),
            ERRLEN,
        )
    };
    if rc == 0 {
        Ok(text(&chosen))
    } else {
        Err(OfiError::Libfabric(text(&err)))
    }
}

/// An fi_info returned by `Fabric::getinfo`, freed on drop.
pub(crate) struct Info(*mut c_void);

impl Info {
    pub(crate) fn raw(&self) -> *mut c_void {
        self.0
    }

    /// Takes ownership of a connection request's info (from an EQ event).
    pub(crate) fn from_raw(p: *mut c_void) -> Info {
        Info(p)
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: the pointer came from fi_getinfo or a CONNREQ event and is freed only here.
        unsafe { evb_ofi_freeinfo(self.0) }
    }
}

/// An endpoint, passive endpoint or memory region (fid), closed on drop.
pub(crate) struct Fid(*mut c_void);

impl Fid {
    pub(crate) fn raw(&self) -> *mut c_void {
        self.0
    }
}

impl Drop for Fid {
    fn drop(&mut self) {
        // SAFETY: a fid opened by the shim, closed exactly once (here); the domain it belongs
        // to outlives it (the transport drops its fids before its `Fabric`).
        unsafe { evb_ofi_close_fid(self.0) };
    }
}

/// Fabric, domain, event queue and completion queue (opened with the first address).
pub(crate) struct Fabric(*mut Shim);

impl Fabric {
    pub(crate) fn new(prov: &str) -> Result<Fabric, OfiError> {
        let p = cstring(prov)?;
        // SAFETY: valid C string; the shim copies it.
        let o = unsafe { evb_ofi_new(p.as_ptr()) };
        if o.is_null() {
            return Err(OfiError::OutOfMemory);
        }
        Ok(Fabric(o))
    }

    pub(crate) fn has_domain(&self) -> bool {
        // SAFETY: `self.0` is a live shim object.
        unsafe { evb_ofi_has_domain(self.0) != 0 }
    }

    pub(crate) fn mr_local(&self) -> bool {
        // SAFETY: as above.
        unsafe { evb_ofi_mr_local(self.0) != 0 }
    }

    pub(crate) fn iov_limit(&self) -> usize {
        // SAFETY: as above.
        unsafe { evb_ofi_iov_limit(self.0) }
    }

    pub(crate) fn names(&self) -> (String, String) {
        // SAFETY: both return NUL-terminated strings owned by the shim object (or static).
        unsafe {
            (
                CStr::from_ptr(evb_ofi_prov_name(self.0))
                    .to_string_lossy()
                    .into_owned(),
                CStr::from_ptr(evb_ofi_domain_name(self.0))
                    .to_string_lossy()
                    .into_owned(),
            )
        }
    }

    pub(crate) fn getinfo(
        &mut self,
        node: &str,
        service: &str,
        source: bool,
    ) -> Result<Info, OfiError> {
        let n = cstring(node)?;
        let s = cstring(service)?;
        let mut out = std::ptr::null_mut();
        let mut err = errbuf();
        // SAFETY: valid C strings, out-pointer and error buffer.
        let rc = unsafe {
            evb_ofi_getinfo(
                self.0,
                n.as_ptr(),
                s.as_ptr(),
                source as c_int,
                &mut out,
                err.as_mut_ptr().cast(),
                ERRLEN,
            )
        };
        if rc == 0 {
            Ok(Info(out))
        } else {
            Err(OfiError::Libfabric(text(&err)))
        }
    }

    /// A listening passive endpoint and the address it is bound to.
    pub(crate) fn listen(&mut self, info: &Info, ctx: u64) -> Result<(Fid, String), OfiError> {
        let mut out = std::ptr::null_mut();
        let mut bound = vec![0u8; 128];
        let mut err = errbuf();
        // SAFETY: `info` is a live fi_info; buffers writable for their lengths.
        let rc = unsafe {
            evb_ofi_pep(
                self.0,
                info.raw(),
                ctx,
                &mut out,
                bound.as_mut_ptr().cast(),
                bound.len(),
                err.as_mut_ptr().cast(),
                ERRLEN,
            )
        };
        if rc == 0 {
            Ok((Fid(out), text(&bound)))
        } else {
            Err(OfiError::Libfabric(text(&err)))
        }
    }

    /// An enabled endpoint bound to the EQ and CQ.
    pub(crate) fn endpoint(&mut self, info: &Info, ctx: u64) -> Result<Fid, OfiError> {
        let mut out = std::ptr::null_mut();
        let mut err = errbuf();
        // SAFETY: `info` is a live fi_info; out-pointer and buffer valid.
        let rc = unsafe {
            evb_ofi_ep(
                self.0,
                info.raw(),
                ctx,
                &mut out,
                err.as_mut_ptr().cast(),
                ERRLEN,
            )
        };
        if rc == 0 {
            Ok(Fid(out))
        } else {
            Err(OfiError::Libfabric(text(&err)))
        }
    }

    /// Registers `len` bytes at `base`; returns the region and its local descriptor.
    ///
    /// The memory must stay allocated until the returned `Fid` is dropped.
    pub(crate) fn register(&mut self, base: *mut u8, len: usize) -> Result<(Fid, usize), OfiError> {
        let mut mr = std::ptr::null_mut();
        let mut desc = std::ptr::null_mut();
        let mut err = errbuf();
        // SAFETY: the caller keeps [base, base+len) allocated while the region lives;
        // out-pointers and buffer valid.
        let rc = unsafe {
            evb_ofi_reg(
                self.0,
                base.cast(),
                len,
                &mut mr,
                &mut desc,
                err.as_mut_ptr().cast(),
                ERRLEN,
            )
        };
        if rc == 0 {
            Ok((Fid(mr), desc as usize))
        } else {
            Err(OfiError::Libfabric(text(&err)))
        }
    }

    /// Next connection-management event, if any.
    pub(crate) fn eq_read(&mut self) -> Result<Option<EqEv>, OfiError> {
        let mut ev = EqEv {
            kind: 0,
            err: 0,
            ctx: 0,
            info: std::ptr::null_mut(),
            datalen: 0,
            data: [0; 64],
        };
        // SAFETY: `ev` is a valid, writable evb_eq_ev.
        let rc = unsafe { evb_ofi_eq_read(self.0, &mut ev) };
        match rc {
            0 => Ok(None),
            1 => Ok(Some(ev)),
            e => Err(OfiError::Libfabric(strerror(e as i64))),
        }
    }

    /// Completions, into `out`; returns how many.
    pub(crate) fn cq_read(&mut self, out: &mut [CqEv]) -> Result<usize, OfiError> {
        // SAFETY: `out` is writable for `out.len()` entries.
        let rc = unsafe { evb_ofi_cq_read(self.0, out.as_mut_ptr(), out.len()) };
        if rc < 0 {
            Err(OfiError::Libfabric(strerror(rc as i64)))
        } else {
            Ok(rc as usize)
        }
    }

    /// Sleeps on the queues' wait fds for at most `ms` (< 0: no limit).
    pub(crate) fn wait(&mut self, ms: i32) {
        // SAFETY: `self.0` is a live shim object.
        unsafe { evb_ofi_wait(self.0, ms) };
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // SAFETY: closes CQ, EQ, domain and fabric once; every endpoint and region of this
        // fabric has been closed before (the transport's field order guarantees it).
        unsafe { evb_ofi_free(self.0) }
    }
}

pub(crate) fn connect(ep: &Fid, info: &Info, param: &[u8]) -> Result<(), OfiError> {
    // SAFETY: live endpoint and info; `param` readable for its length (copied by libfabric).
    let rc = unsafe { evb_ofi_connect(ep.raw(), info.raw(), param.as_ptr().cast(), param.len()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(OfiError::Libfabric(strerror(rc as i64)))
    }
}

pub(crate) fn accept(ep: &Fid, param: &[u8]) -> Result<(), OfiError> {
    // SAFETY: live endpoint; `param` readable for its length.
    let rc = unsafe { evb_ofi_accept(ep.raw(), param.as_ptr().cast(), param.len()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(OfiError::Libfabric(strerror(rc as i64)))
    }
}

pub(crate) fn reject(pep: &Fid, info: &Info) {
    // SAFETY: live passive endpoint and the connection request's info.
    unsafe { evb_ofi_reject(pep.raw(), info.raw()) };
}

pub(crate) fn shutdown(ep: &Fid) {
    // SAFETY: live endpoint.
    unsafe { evb_ofi_shutdown(ep.raw()) };
}

/// Why a receive or send was not posted.
#[derive(Debug)]
pub(crate) enum PostError {
    /// The queue is full: try later.
    Full,
    Failed(OfiError),
}

/// Posts a receive of `len` bytes at `buf`.
///
/// # Safety
/// `buf` must stay valid and otherwise untouched until the operation completes or the
/// endpoint is closed.
pub(crate) unsafe fn recv(
    ep: &Fid,
    buf: *mut u8,
    len: usize,
    desc: usize,
    ctx: u64,
) -> Result<(), PostError> {
    // SAFETY: guaranteed by the caller.
    let rc = unsafe { evb_ofi_recv(ep.raw(), buf.cast(), len, desc as *mut c_void, ctx) };
    match rc {
        0 => Ok(()),
        r if r == -FI_EAGAIN => Err(PostError::Full),
        r => Err(PostError::Failed(OfiError::Libfabric(strerror(r as i64)))),
    }
}

/// Posts one message gathered from `iov`.
///
/// # Safety
/// Every iovec must stay valid until the operation completes or the endpoint is closed.
pub(crate) unsafe fn sendv(
    ep: &Fid,
    iov: &[libc::iovec],
    desc: &mut [*mut c_void],
    ctx: u64,
) -> Result<(), PostError> {
    // SAFETY: guaranteed by the caller; `desc` has one entry per iovec.
    let rc = unsafe { evb_ofi_sendv(ep.raw(), iov.as_ptr(), desc.as_mut_ptr(), iov.len(), ctx) };
    match rc {
        0 => Ok(()),
        r if r == -FI_EAGAIN => Err(PostError::Full),
        r => Err(PostError::Failed(OfiError::Libfabric(strerror(r as i64)))),
    }
}

//! Status codes and the thread's last error message.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use evb_plugin::Error;

/// Success.
pub const EVB_OK: c_int = 0;
/// The RU's pool is full (asked not to wait): back-pressure, try again.
pub const EVB_FULL: c_int = 1;
/// Nothing within the time given.
pub const EVB_TIMEOUT: c_int = 2;
/// The run is over: no more events.
pub const EVB_END: c_int = 3;
/// A size outside what the RU accepts; nothing was submitted.
pub const EVB_ERR_SIZE: c_int = -1;
/// The fragment failed the RU's checks; `source.on_error` says what followed (the message).
pub const EVB_ERR_REFUSED: c_int = -2;
/// Not an outstanding buffer of this producer (submitted or released already).
pub const EVB_ERR_UNKNOWN_BUFFER: c_int = -3;
/// A call that does not fit the handle's state (e.g. after finish).
pub const EVB_ERR_STATE: c_int = -4;
/// The node's run is over (ended, stopped or aborted).
pub const EVB_ERR_RUN_OVER: c_int = -5;
/// The node could not be set up (configuration, addresses).
pub const EVB_ERR_SETUP: c_int = -6;
/// A bad argument (a null pointer, a string that is not UTF-8).
pub const EVB_ERR_ARG: c_int = -7;
/// A bug in libevb (a caught panic).
pub const EVB_ERR_PANIC: c_int = -8;
/// The run ended, but not cleanly (`evb_*_finish`): the message says why.
pub const EVB_ERR_RUN_FAILED: c_int = -9;
/// A pub/sub socket failed (its transport's poll, a request that cannot be sent).
pub const EVB_ERR_IO: c_int = -10;
/// The configuration could not be read, does not parse as TOML, or is not valid (a file
/// given by path, or the text given to a `*_toml` function); the message says where.
pub const EVB_ERR_CONFIG: c_int = -11;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// The error an API call answers, with its message kept for `evb_last_error`.
pub(crate) fn fail(code: c_int, msg: &str) -> c_int {
    set_error(msg);
    code
}

pub(crate) fn code_of(e: &Error) -> c_int {
    let code = match e {
        Error::Full => EVB_FULL,
        Error::Size { .. } => EVB_ERR_SIZE,
        Error::Refused { .. } => EVB_ERR_REFUSED,
        Error::UnknownBuffer => EVB_ERR_UNKNOWN_BUFFER,
        Error::State(_) => EVB_ERR_STATE,
        Error::RunOver(_) => EVB_ERR_RUN_OVER,
        Error::Setup(_) => EVB_ERR_SETUP,
        Error::Timeout(_) => EVB_TIMEOUT,
        Error::Io(_) => EVB_ERR_IO,
    };
    fail(code, &e.to_string())
}

/// Runs `f`, turning an error into its code and a panic into `EVB_ERR_PANIC`.
pub(crate) fn guard(f: impl FnOnce() -> Result<c_int, c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(code) | Err(code)) => code,
        Err(_) => fail(EVB_ERR_PANIC, "libevb: internal error (a panic was caught)"),
    }
}

/// The version of the header a program was compiled with (the library's own is
/// [`evb_version`]): major, minor, patch. Before 1.0 the ABI may change with the minor
/// version, which is why the library's SONAME is `libevb.so.0.<minor>`.
pub const EVB_VERSION_MAJOR: u32 = 0;
pub const EVB_VERSION_MINOR: u32 = 1;
pub const EVB_VERSION_PATCH: u32 = 0;

/// The library's version as text, `"MAJOR.MINOR.PATCH"` (static; never freed): a program
/// can compare it with the `EVB_VERSION_*` it was compiled against.
#[no_mangle]
pub extern "C" fn evb_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The message of the last error on this thread ("" if none). Valid until the next libevb
/// call on this thread.
#[no_mangle]
pub extern "C" fn evb_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header's version is the crate's (a release bumps both, or this fails).
    #[test]
    fn the_version_is_the_crate_s() {
        let text = format!("{EVB_VERSION_MAJOR}.{EVB_VERSION_MINOR}.{EVB_VERSION_PATCH}");
        assert_eq!(text, env!("CARGO_PKG_VERSION"));
        // SAFETY: evb_version returns a pointer to a static NUL-terminated string.
        let got = unsafe { std::ffi::CStr::from_ptr(evb_version()) };
        assert_eq!(got.to_str().unwrap(), text);
    }
}

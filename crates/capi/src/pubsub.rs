//! Publish/subscribe by tag for C ([`evb_plugin::pubsub`]): a publisher handle and a
//! subscriber handle, options as `key=value` text. Same conventions as the producer and
//! consumer entry points: `int` status codes, `evb_last_error()`, no panic into C, every
//! `unsafe` block at the boundary.

use std::ffi::{c_char, c_int, c_void, CString};
use std::time::Duration;

use evb_plugin::pubsub::{
    parse_tags, PubOptions, PubSocket, Received, SubOptions, SubSocket, TagRange,
};
use evb_plugin::Error;

use crate::ffi::{handle, put, text};
use crate::status::*;

/// `evb_sub_recv`: a message (`tag`, `seq`, payload in `data`/`len`).
pub const EVB_SUB_MESSAGE: c_int = 0;
/// `evb_sub_recv`: `missed` messages of `tag` were dropped for this subscriber (the
/// publisher's policy `drop`); the next message of that tag has `seq` = last + 1 + missed.
pub const EVB_SUB_GAP: c_int = 1;
/// `evb_sub_recv`: the publisher cut this subscriber off (`code`; the reason in `data`).
pub const EVB_SUB_GOODBYE: c_int = 2;
/// `evb_sub_recv`: the connection to the publisher is gone (the reason in `data`).
pub const EVB_SUB_CLOSED: c_int = 3;

/// A publishing socket (opaque).
pub struct EvbPub {
    socket: PubSocket,
    addr: CString,
}

/// A subscribing socket (opaque).
pub struct EvbSub {
    socket: SubSocket,
    /// The payload handed out last (its pool blocks), until the next recv or close.
    held: Option<evb_plugin::pubsub::Chain>,
    /// Its bytes when they were not one piece.
    copy: Vec<u8>,
    /// The last Goodbye's or Closed's reason.
    reason: CString,
}

/// What one `evb_pub_send` did.
#[repr(C)]
pub struct EvbPubSent {
    /// Subscribers the message went to (0: nobody subscribes to its tag).
    pub delivered: usize,
    /// Subscribers whose copy was dropped (policy drop: they get a gap) or who were cut off
    /// (policy disconnect).
    pub dropped: usize,
}

/// A publisher's counters.
#[repr(C)]
pub struct EvbPubStats {
    /// Messages published (not counting refused ones).
    pub published: u64,
    /// Copies sent, one per subscriber per message.
    pub delivered: u64,
    /// Copies dropped for slow subscribers (policy drop).
    pub dropped: u64,
    pub gaps_sent: u64,
    /// Times a send waited for a slow subscriber (policy block).
    pub would_block: u64,
    /// Subscribers cut off for being slow (policy disconnect).
    pub disconnected_slow: u64,
    /// Subscribers connected now.
    pub subscribers: usize,
}

/// A subscriber's counters over all its publishers.
#[repr(C)]
pub struct EvbSubStats {
    pub received: u64,
    pub payload_bytes: u64,
    /// Sum of every gap's `missed`.
    pub missed: u64,
    pub gaps: u64,
    pub goodbyes: u64,
}

/// One thing `evb_sub_recv` took.
#[repr(C)]
pub struct EvbSubMsg {
    /// `EVB_SUB_MESSAGE`, `EVB_SUB_GAP`, `EVB_SUB_GOODBYE` or `EVB_SUB_CLOSED`.
    pub kind: c_int,
    /// Which publisher: its index in the addresses given to `evb_sub_open`.
    pub publisher: usize,
    /// Message and gap: the tag.
    pub tag: u64,
    /// Message: the publisher's sequence number for this tag (0, 1, ...).
    pub seq: u64,
    /// Gap: how many messages of `tag` were dropped.
    pub missed: u64,
    /// Goodbye: why (1 slow subscriber, 2 bad request, 3 shutdown, 4 send failed).
    pub code: c_int,
    /// Message: the payload; goodbye and closed: the reason, NUL-terminated. Valid until
    /// the next `evb_sub_recv` or `evb_sub_close`.
    pub data: *const u8,
    /// Bytes at `data` (without the NUL).
    pub len: usize,
}

fn ms(timeout_ms: i64) -> Option<Duration> {
    (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64))
}

/// An optional C string (NULL: "").
///
/// # Safety
/// `p` is null or a NUL-terminated string that outlives the call.
unsafe fn opt_text<'a>(p: *const c_char, what: &str) -> Result<&'a str, c_int> {
    if p.is_null() {
        return Ok("");
    }
    // SAFETY: non-null, and the caller promises a NUL-terminated string.
    unsafe { text(p, what) }
}

fn setup(e: &Error) -> c_int {
    code_of(e)
}

fn tag_ranges(s: &str) -> Result<Vec<TagRange>, c_int> {
    parse_tags(s).map_err(|e| setup(&e))
}

/// Listens on `addr` (tcp: "HOST:PORT", port 0 for any free one; shm: a name, "NAME:0" for
/// any) and writes the publisher to `*out`. `options` (NULL or "": defaults) is
/// `key=value` pairs separated by commas or spaces: `transport` (tcp, shm), `run_id`,
/// `policy` (block, drop, disconnect), `max_queued`, `send_threads` (0..=16, default 0:
/// threads writing subscribers' sockets beside the publishing one, over tcp),
/// `max_message` (bytes), `block_timeout_ms` (-1: no limit), `linger_ms`, `secret` (else
/// `EVB_SECRET`).
///
/// # Safety
/// `addr` is a NUL-terminated string, `options` NULL or one; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_pub_open(
    addr: *const c_char,
    options: *const c_char,
    out: *mut *mut EvbPub,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(fail(EVB_ERR_ARG, "out is NULL"));
        }
        // SAFETY: forwarded from this function's contract.
        let (addr, options) = unsafe { (text(addr, "addr")?, opt_text(options, "options")?) };
        let opts = PubOptions::parse(options).map_err(|e| setup(&e))?;
        let socket = PubSocket::bind(addr, opts).map_err(|e| setup(&e))?;
        let addr = CString::new(socket.local_addr()).unwrap_or_default();
        let h = Box::into_raw(Box::new(EvbPub { socket, addr }));
        // SAFETY: checked non-null; valid for a write (this function's contract).
        unsafe { put(out, h, "out") }?;
        Ok(EVB_OK)
    })
}

/// The address the publisher listens on (what subscribers connect to); NULL for NULL.
/// Valid until `evb_pub_close`.
///
/// # Safety
/// `p` is NULL or a live publisher.
#[no_mangle]
pub unsafe extern "C" fn evb_pub_local_addr(p: *const EvbPub) -> *const c_char {
    // SAFETY: this function's contract: null or live.
    unsafe { p.as_ref() }.map_or(std::ptr::null(), |p| p.addr.as_ptr())
}

/// Polls until `n` subscribers have subscribed to something: `EVB_OK`, or `EVB_TIMEOUT`
/// after `timeout_ms` (negative: no limit). How many have goes to `*count` unless NULL.
///
/// # Safety
/// `p` is a live publisher; `count` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_pub_wait_subscribers(
    p: *mut EvbPub,
    n: usize,
    timeout_ms: i64,
    count: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: a live publisher (this function's contract).
        let p = unsafe { handle(p) }?;
        let r = p.socket.wait_subscribers(n, ms(timeout_ms));
        if !count.is_null() {
            // SAFETY: non-null and valid for a write (this function's contract).
            unsafe { count.write(p.socket.subscribed()) };
        }
        r.map_err(|e| code_of(&e))?;
        Ok(EVB_OK)
    })
}

/// Publishes `len` bytes at `data` under `tag` to every subscriber of `tag` (the bytes are
/// copied; `data` is the caller's again on return). Under policy block it waits while a
/// subscriber of the tag is slow, at most `block_timeout_ms` (then `EVB_TIMEOUT`, nothing
/// sent). What it did goes to `*sent` unless NULL. `EVB_ERR_SIZE`: more than
/// `max_message`.
///
/// # Safety
/// `p` is a live publisher; `data` is valid for `len` reads (NULL only with `len` 0);
/// `sent` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_pub_send(
    p: *mut EvbPub,
    tag: u64,
    data: *const c_void,
    len: usize,
    sent: *mut EvbPubSent,
) -> c_int {
    guard(|| {
        // SAFETY: a live publisher (this function's contract).
        let p = unsafe { handle(p) }?;
        let bytes: &[u8] = if len == 0 {
            &[]
        } else if data.is_null() {
            return Err(fail(EVB_ERR_ARG, &format!("data is NULL with len {len}")));
        } else {
            // SAFETY: non-null and valid for `len` reads (this function's contract).
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }
        };
        let s = p.socket.publish(tag, bytes).map_err(|e| code_of(&e))?;
        if !sent.is_null() {
            // SAFETY: non-null and valid for a write (this function's contract).
            unsafe {
                sent.write(EvbPubSent {
                    delivered: s.delivered,
                    dropped: s.dropped,
                })
            };
        }
        Ok(EVB_OK)
    })
}

/// Sends every batched page now (messages to `delivery=throughput` subscribers wait in a
/// page until the next send, poll or flush).
///
/// # Safety
/// `p` is a live publisher.
#[no_mangle]
pub unsafe extern "C" fn evb_pub_flush(p: *mut EvbPub) -> c_int {
    guard(|| {
        // SAFETY: a live publisher (this function's contract).
        let p = unsafe { handle(p) }?;
        p.socket.flush().map_err(|e| code_of(&e))?;
        Ok(EVB_OK)
    })
}

/// Makes progress (new subscribers and subscriptions, queued messages out), waiting at
/// most `timeout_ms` (0: not at all) for something to happen. A publisher with nothing to
/// send calls it now and then.
///
/// # Safety
/// `p` is a live publisher.
#[no_mangle]
pub unsafe extern "C" fn evb_pub_poll(p: *mut EvbPub, timeout_ms: u32) -> c_int {
    guard(|| {
        // SAFETY: a live publisher (this function's contract).
        let p = unsafe { handle(p) }?;
        p.socket
            .poll(Duration::from_millis(timeout_ms.into()))
            .map_err(|e| code_of(&e))?;
        Ok(EVB_OK)
    })
}

/// The publisher's counters, in `*out`.
///
/// # Safety
/// `p` is a live publisher; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_pub_stats(p: *const EvbPub, out: *mut EvbPubStats) -> c_int {
    guard(|| {
        // SAFETY: this function's contract: a live publisher.
        let p = unsafe { p.as_ref() }.ok_or_else(|| fail(EVB_ERR_ARG, "handle is NULL"))?;
        let s = p.socket.stats();
        let v = EvbPubStats {
            published: s.published,
            delivered: s.delivered,
            dropped: s.dropped,
            gaps_sent: s.gaps_sent,
            would_block: s.would_block,
            disconnected_slow: s.disconnected_slow,
            subscribers: p.socket.subscribers(),
        };
        // SAFETY: valid for a write (this function's contract).
        unsafe { put(out, v, "out") }?;
        Ok(EVB_OK)
    })
}

/// Lets subscribers take what is queued for them (at most `linger_ms`), tells each
/// Goodbye with `reason` (NULL: "closed"), closes them and frees the publisher, whatever
/// the answer. NULL does nothing.
///
/// # Safety
/// `p` is NULL or a live publisher, not used again after this call; `reason` is NULL or a
/// NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn evb_pub_close(p: *mut EvbPub, reason: *const c_char) -> c_int {
    guard(|| {
        if p.is_null() {
            return Ok(EVB_OK);
        }
        // SAFETY: made by Box::into_raw in evb_pub_open, closed once (contract).
        let mut p = unsafe { Box::from_raw(p) };
        // SAFETY: this function's contract.
        let reason = match unsafe { opt_text(reason, "reason") }? {
            "" => "closed",
            r => r,
        };
        p.socket.close(reason).map_err(|e| code_of(&e))?;
        Ok(EVB_OK)
    })
}

/// Connects to the publishers at `addrs` (comma-separated) and subscribes to `tags` there
/// ("0,5,10-19"); the subscriber goes to `*out`. `options` (NULL or "": defaults) is
/// `key=value` pairs: `transport` (tcp, shm), `run_id`, `delivery` (latency, throughput),
/// `max_message`, `secret` (else `EVB_SECRET`). A publisher that cannot be reached is an
/// `EVB_SUB_CLOSED` from `evb_sub_recv`.
///
/// # Safety
/// `addrs` and `tags` are NUL-terminated strings, `options` NULL or one; `out` is valid
/// for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_sub_open(
    addrs: *const c_char,
    tags: *const c_char,
    options: *const c_char,
    out: *mut *mut EvbSub,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(fail(EVB_ERR_ARG, "out is NULL"));
        }
        // SAFETY: forwarded from this function's contract.
        let (addrs, t, options) = unsafe {
            (
                text(addrs, "addrs")?,
                text(tags, "tags")?,
                opt_text(options, "options")?,
            )
        };
        let list: Vec<&str> = addrs
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .collect();
        let opts = SubOptions::parse(options).map_err(|e| setup(&e))?;
        let socket = SubSocket::connect(&list, &tag_ranges(t)?, opts).map_err(|e| setup(&e))?;
        let h = Box::into_raw(Box::new(EvbSub {
            socket,
            held: None,
            copy: Vec::new(),
            reason: CString::default(),
        }));
        // SAFETY: checked non-null; valid for a write (this function's contract).
        unsafe { put(out, h, "out") }?;
        Ok(EVB_OK)
    })
}

/// The next thing that arrived, in `*out`, waiting at most `timeout_ms` (negative: no
/// limit): `EVB_OK`, `EVB_TIMEOUT`, or `EVB_END` once every publisher's connection is
/// closed and everything was taken. The previous message's bytes are given back.
///
/// # Safety
/// `s` is a live subscriber; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_sub_recv(
    s: *mut EvbSub,
    timeout_ms: i64,
    out: *mut EvbSubMsg,
) -> c_int {
    guard(|| {
        // SAFETY: a live subscriber (this function's contract).
        let s = unsafe { handle(s) }?;
        if out.is_null() {
            return Err(fail(EVB_ERR_ARG, "out is NULL"));
        }
        s.held = None;
        s.copy.clear();
        let Some(r) = s.socket.recv(ms(timeout_ms)).map_err(|e| code_of(&e))? else {
            return Ok(if s.socket.open_publishers() == 0 {
                EVB_END
            } else {
                EVB_TIMEOUT
            });
        };
        let mut m = EvbSubMsg {
            kind: EVB_SUB_MESSAGE,
            publisher: 0,
            tag: 0,
            seq: 0,
            missed: 0,
            code: 0,
            data: std::ptr::null(),
            len: 0,
        };
        match r {
            Received::Message {
                publisher,
                tag,
                seq,
                payload,
            } => {
                (m.publisher, m.tag, m.seq, m.len) = (publisher, tag, seq, payload.len());
                m.data = match payload.slices() {
                    [one] => one.as_ptr(),
                    _ => {
                        for c in payload.chunks() {
                            s.copy.extend_from_slice(c);
                        }
                        s.copy.as_ptr()
                    }
                };
                // the bytes stay where they are while the chain is held
                s.held = Some(payload);
            }
            Received::Gap {
                publisher,
                tag,
                missed,
            } => (m.kind, m.publisher, m.tag, m.missed) = (EVB_SUB_GAP, publisher, tag, missed),
            Received::Goodbye {
                publisher,
                code,
                reason,
            } => {
                (m.kind, m.publisher, m.code) = (EVB_SUB_GOODBYE, publisher, code as c_int);
                s.reason = CString::new(reason.replace('\0', " ")).unwrap_or_default();
                (m.data, m.len) = (s.reason.as_ptr().cast(), s.reason.as_bytes().len());
            }
            Received::Closed { publisher, reason } => {
                (m.kind, m.publisher) = (EVB_SUB_CLOSED, publisher);
                s.reason = CString::new(reason.replace('\0', " ")).unwrap_or_default();
                (m.data, m.len) = (s.reason.as_ptr().cast(), s.reason.as_bytes().len());
            }
        }
        // SAFETY: checked non-null; valid for a write (this function's contract).
        unsafe { out.write(m) };
        Ok(EVB_OK)
    })
}

/// Subscribes to more tags ("0,5,10-19") at every publisher still connected.
///
/// # Safety
/// `s` is a live subscriber; `tags` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn evb_sub_subscribe(s: *mut EvbSub, tags: *const c_char) -> c_int {
    guard(|| {
        // SAFETY: this function's contract.
        let (s, t) = unsafe { (handle(s)?, text(tags, "tags")?) };
        s.socket
            .subscribe(&tag_ranges(t)?)
            .map_err(|e| code_of(&e))?;
        Ok(EVB_OK)
    })
}

/// Unsubscribes from tags ("0,5,10-19") at every publisher still connected; messages a
/// publisher sent before it read this still arrive.
///
/// # Safety
/// `s` is a live subscriber; `tags` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn evb_sub_unsubscribe(s: *mut EvbSub, tags: *const c_char) -> c_int {
    guard(|| {
        // SAFETY: this function's contract.
        let (s, t) = unsafe { (handle(s)?, text(tags, "tags")?) };
        s.socket
            .unsubscribe(&tag_ranges(t)?)
            .map_err(|e| code_of(&e))?;
        Ok(EVB_OK)
    })
}

/// The subscriber's counters, in `*out`.
///
/// # Safety
/// `s` is a live subscriber; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_sub_stats(s: *const EvbSub, out: *mut EvbSubStats) -> c_int {
    guard(|| {
        // SAFETY: this function's contract: a live subscriber.
        let s = unsafe { s.as_ref() }.ok_or_else(|| fail(EVB_ERR_ARG, "handle is NULL"))?;
        let st = s.socket.stats();
        let v = EvbSubStats {
            received: st.received,
            payload_bytes: st.payload_bytes,
            missed: st.missed,
            gaps: st.gaps,
            goodbyes: st.goodbyes,
        };
        // SAFETY: valid for a write (this function's contract).
        unsafe { put(out, v, "out") }?;
        Ok(EVB_OK)
    })
}

/// Closes the subscriber's connections and frees it (the last message's bytes with it).
/// NULL does nothing.
///
/// # Safety
/// `s` is NULL or a live subscriber, not used again after this call.
#[no_mangle]
pub unsafe extern "C" fn evb_sub_close(s: *mut EvbSub) {
    guard(|| {
        if !s.is_null() {
            // SAFETY: made by Box::into_raw in evb_sub_open, closed once (contract).
            let mut s = unsafe { Box::from_raw(s) };
            s.socket.close();
        }
        Ok(EVB_OK)
    });
}

//! The entry points. Every `unsafe` block is here, at the boundary: reading C strings,
//! dereferencing handles made by this library, writing out-parameters.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr};
use std::time::Duration;

use evb_config::Config;
use evb_plugin::{
    Buffer, Consumer, ConsumerOptions, Event, Next, NodeOutcome, Producer, Trigger, WhenFull,
};

use crate::status::*;

/// A producer feeding one RU (opaque).
pub struct EvbProducer {
    producer: Option<Producer>,
    /// Buffers handed out and not yet submitted or released, by id.
    buffers: HashMap<u64, Buffer>,
    next_buffer: u64,
    outcome: Option<NodeOutcome>,
}

/// A consumer of one BU's events (opaque).
pub struct EvbConsumer {
    consumer: Option<Consumer>,
    outcome: Option<NodeOutcome>,
}

/// An outside trigger program's EVM (opaque): decides the run's records.
pub struct EvbTrigger {
    trigger: Option<Trigger>,
    outcome: Option<NodeOutcome>,
}

/// One built event (opaque), the consumer's until `evb_event_release`.
pub struct EvbEvent {
    event: Event,
}

/// Room for one fragment's payload in the RU's pool.
#[repr(C)]
pub struct EvbBuffer {
    /// What `evb_producer_submit` and `evb_producer_release` take.
    pub id: u64,
    /// Where to write the payload: `capacity` bytes, valid until submitted or released.
    pub data: *mut u8,
    pub capacity: usize,
}

/// One fragment of a built event.
#[repr(C)]
pub struct EvbFragment {
    pub source_id: u16,
    /// Fragment header flags (MISSING 0x1, ...; docs/formats.md).
    pub flags: u16,
    pub trigger_number: u32,
    /// CRC32C of the payload (the BU checked it).
    pub payload_crc: u32,
    /// Payload bytes.
    pub size: usize,
    /// Pieces the payload is in (`evb_event_chunk`); 1 unless it spans pool blocks.
    pub chunks: usize,
}

/// A C string argument as `&str`.
///
/// # Safety
/// `p` is null or a NUL-terminated string that outlives the call.
pub(crate) unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, c_int> {
    if p.is_null() {
        return Err(fail(EVB_ERR_ARG, &format!("{what} is NULL")));
    }
    // SAFETY: non-null, and the caller promises a NUL-terminated string alive for the call.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|_| fail(EVB_ERR_ARG, &format!("{what} is not UTF-8")))
}

/// The configuration file at `path` (relative paths in it are relative to its folder).
fn config(path: &str) -> Result<Config, c_int> {
    Config::from_file(path.as_ref()).map_err(|e| fail(EVB_ERR_CONFIG, &format!("{path}: {e}")))
}

/// A configuration given as TOML text (relative paths in it are relative to the current
/// folder, as no file names one).
fn config_toml(text: &str) -> Result<Config, c_int> {
    Config::from_toml(text).map_err(|e| fail(EVB_ERR_CONFIG, &format!("configuration text: {e}")))
}

/// A configuration argument: a file's path, or TOML text.
#[derive(Clone, Copy)]
enum ConfigArg {
    Path,
    Toml,
}

impl ConfigArg {
    /// The configuration `p` gives.
    ///
    /// # Safety
    /// `p` is null or a NUL-terminated string that outlives the call.
    unsafe fn load(self, p: *const c_char) -> Result<Config, c_int> {
        match self {
            // SAFETY: forwarded from this function's contract.
            ConfigArg::Path => config(unsafe { text(p, "config_path") }?),
            // SAFETY: forwarded from this function's contract.
            ConfigArg::Toml => config_toml(unsafe { text(p, "toml") }?),
        }
    }
}

/// The end of a run as a status: `EVB_OK` for a clean one.
fn ended(outcome: &NodeOutcome) -> c_int {
    if outcome.ok {
        EVB_OK
    } else {
        fail(EVB_ERR_RUN_FAILED, &outcome.reason)
    }
}

/// Writes `v` to the out-parameter `out`.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
pub(crate) unsafe fn put<T>(out: *mut T, v: T, what: &str) -> Result<(), c_int> {
    if out.is_null() {
        return Err(fail(EVB_ERR_ARG, &format!("{what} is NULL")));
    }
    // SAFETY: non-null, and the caller promises it is valid for a write.
    unsafe { out.write(v) };
    Ok(())
}

/// A handle made by this library.
///
/// # Safety
/// `p` is null or a live handle from the matching `*_start`, not used by another thread
/// during the call.
pub(crate) unsafe fn handle<'a, T>(p: *mut T) -> Result<&'a mut T, c_int> {
    // SAFETY: the caller promises a live, unshared handle (or null, answered below).
    unsafe { p.as_mut() }.ok_or_else(|| fail(EVB_ERR_ARG, "handle is NULL"))
}

/// Starts RU `ru_id` of the configuration file `config_path` (`source.kind = "api"`) in
/// this process, fed by the producer written to `*out`.
///
/// # Safety
/// `config_path` and `ru_id` are NUL-terminated strings; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_producer_start(
    config_path: *const c_char,
    ru_id: *const c_char,
    out: *mut *mut EvbProducer,
) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe { producer_start(ConfigArg::Path, config_path, ru_id, out) }
}

/// `evb_producer_start` with the configuration given as TOML text instead of a file's path
/// (what `evb config default` prints; relative paths in it are relative to the current
/// folder). Text that does not parse or is not valid is `EVB_ERR_CONFIG`, nothing started.
///
/// # Safety
/// `toml` and `ru_id` are NUL-terminated strings; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_producer_start_toml(
    toml: *const c_char,
    ru_id: *const c_char,
    out: *mut *mut EvbProducer,
) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe { producer_start(ConfigArg::Toml, toml, ru_id, out) }
}

/// # Safety
/// `config` and `ru_id` are NUL-terminated strings; `out` is valid for a write.
unsafe fn producer_start(
    from: ConfigArg,
    config: *const c_char,
    ru_id: *const c_char,
    out: *mut *mut EvbProducer,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from this function's contract.
        let (cfg, id) = unsafe { (from.load(config)?, text(ru_id, "ru_id")?) };
        let producer = Producer::start(&cfg, id).map_err(|e| code_of(&e))?;
        // SAFETY: `out` is valid for a write (this function's contract).
        unsafe { put(out, handle_of(producer), "out") }?;
        Ok(EVB_OK)
    })
}

/// Starts RU `ru_id` fed by several producers, one per entry of its `[[ru]]
/// producer_sources` (in that order): their handles go to `out[0..k]` and k to `*count`.
/// Each handle may be used from a thread of its own; the RU joins their k-th fragments into
/// event k's super-fragment. `capacity` is how many handles `out` holds; fewer than k is
/// `EVB_ERR_ARG` (with `*count` set to k) and nothing is started.
///
/// # Safety
/// `config_path` and `ru_id` are NUL-terminated strings; `out` is valid for `capacity`
/// writes; `count` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_producer_start_many(
    config_path: *const c_char,
    ru_id: *const c_char,
    out: *mut *mut EvbProducer,
    capacity: usize,
    count: *mut usize,
) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe { producer_start_many(ConfigArg::Path, config_path, ru_id, out, capacity, count) }
}

/// `evb_producer_start_many` with the configuration given as TOML text (see
/// `evb_producer_start_toml`).
///
/// # Safety
/// `toml` and `ru_id` are NUL-terminated strings; `out` is valid for `capacity` writes;
/// `count` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_producer_start_many_toml(
    toml: *const c_char,
    ru_id: *const c_char,
    out: *mut *mut EvbProducer,
    capacity: usize,
    count: *mut usize,
) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe { producer_start_many(ConfigArg::Toml, toml, ru_id, out, capacity, count) }
}

/// # Safety
/// `config` and `ru_id` are NUL-terminated strings; `out` is valid for `capacity` writes;
/// `count` is valid for a write.
unsafe fn producer_start_many(
    from: ConfigArg,
    config: *const c_char,
    ru_id: *const c_char,
    out: *mut *mut EvbProducer,
    capacity: usize,
    count: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from this function's contract.
        let (cfg, id) = unsafe { (from.load(config)?, text(ru_id, "ru_id")?) };
        let k = cfg
            .nodes()
            .into_iter()
            .find(|n| n.id == id)
            .map_or(0, |n| n.stream_sources.len());
        // SAFETY: `count` is valid for a write (this function's contract).
        unsafe { put(count, k, "count") }?;
        if out.is_null() || capacity < k {
            return Err(fail(
                EVB_ERR_ARG,
                &format!("{id} has {k} producers: out must hold {k} handles"),
            ));
        }
        let producers = Producer::start_many(&cfg, id).map_err(|e| code_of(&e))?;
        for (i, producer) in producers.into_iter().enumerate() {
            // SAFETY: i < k <= capacity, and `out` is valid for `capacity` writes.
            unsafe { out.add(i).write(handle_of(producer)) };
        }
        Ok(EVB_OK)
    })
}

/// A new producer handle, owned by the caller until `evb_producer_free`.
fn handle_of(producer: Producer) -> *mut EvbProducer {
    Box::into_raw(Box::new(EvbProducer {
        producer: Some(producer),
        buffers: HashMap::new(),
        next_buffer: 1,
        outcome: None,
    }))
}

fn live(p: &mut EvbProducer) -> Result<&mut Producer, c_int> {
    p.producer
        .as_mut()
        .ok_or_else(|| fail(EVB_ERR_STATE, "the producer has finished"))
}

/// Room for a payload of `size` bytes in the RU's pool, written to `*out`. With `wait`
/// non-zero it waits while the pool is full; with 0 it answers `EVB_FULL` at once.
///
/// # Safety
/// `p` is a live producer; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_producer_buffer(
    p: *mut EvbProducer,
    size: usize,
    wait: c_int,
    out: *mut EvbBuffer,
) -> c_int {
    guard(|| {
        // SAFETY: a live producer (this function's contract).
        let p = unsafe { handle(p) }?;
        if out.is_null() {
            return Err(fail(EVB_ERR_ARG, "out is NULL"));
        }
        let when_full = if wait != 0 {
            WhenFull::Block
        } else {
            WhenFull::ReturnFull
        };
        let mut buf = live(p)?.buffer(size, when_full).map_err(|e| code_of(&e))?;
        let id = p.next_buffer;
        p.next_buffer += 1;
        let b = EvbBuffer {
            id,
            data: buf.payload_mut().as_mut_ptr(),
            capacity: buf.capacity(),
        };
        // the bytes stay put in the pool while the Buffer moves into the map
        p.buffers.insert(id, buf);
        // SAFETY: checked non-null; valid for a write (this function's contract).
        unsafe { put(out, b, "out") }?;
        Ok(EVB_OK)
    })
}

/// Submits buffer `id` with its first `len` bytes as the fragment of the next event,
/// with `trigger_number` (which must move forward). Its event id goes to `*event_id` unless
/// that is NULL. The buffer is the RU's from now on, whatever the answer.
///
/// # Safety
/// `p` is a live producer; `event_id` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_producer_submit(
    p: *mut EvbProducer,
    id: u64,
    len: usize,
    trigger_number: u32,
    event_id: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: a live producer (this function's contract).
        let p = unsafe { handle(p) }?;
        live(p)?;
        let mut buf = p
            .buffers
            .remove(&id)
            .ok_or_else(|| code_of(&evb_plugin::Error::UnknownBuffer))?;
        buf.set_len(len).map_err(|e| code_of(&e))?;
        let event = live(p)?
            .submit(buf, trigger_number)
            .map_err(|e| code_of(&e))?;
        if !event_id.is_null() {
            // SAFETY: non-null and valid for a write (this function's contract).
            unsafe { event_id.write(event) };
        }
        Ok(EVB_OK)
    })
}

/// A run built by time (`builder.by = "time"` or `"window"`): submits the next frame of
/// this producer's stream, its data for ticks `[begin, end)`: `len` bytes at `data`, copied
/// once (its time frame header in front). The stream begins at tick 0 and each frame lasts
/// `frames.ticks`, beginning where the last one ended; one that does not stops the run,
/// named. `wait` non-zero waits while the RU holds `source.read_ahead` frames it has not
/// cut; zero answers `EVB_ERR_FULL`. The frame's number (from 0) goes to `*frame` unless
/// that is NULL.
///
/// # Safety
/// `p` is a live producer; `data` is valid for `len` bytes of reading (or NULL with `len`
/// 0); `frame` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_producer_submit_frame(
    p: *mut EvbProducer,
    begin: u64,
    end: u64,
    data: *const u8,
    len: usize,
    wait: c_int,
    frame: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: a live producer (this function's contract).
        let p = unsafe { handle(p) }?;
        if data.is_null() && len > 0 {
            return Err(fail(EVB_ERR_ARG, "data is NULL"));
        }
        let bytes: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: non-null and valid for `len` bytes (this function's contract).
            unsafe { std::slice::from_raw_parts(data, len) }
        };
        let when_full = if wait != 0 {
            WhenFull::Block
        } else {
            WhenFull::ReturnFull
        };
        let n = live(p)?
            .submit_frame(begin, end, bytes, when_full)
            .map_err(|e| code_of(&e))?;
        if !frame.is_null() {
            // SAFETY: non-null and valid for a write (this function's contract).
            unsafe { frame.write(n) };
        }
        Ok(EVB_OK)
    })
}

/// A window fragment's window (docs/protocol.md §10.2): ticks `[begin, end)`, the core's end,
/// the status (0 complete, 1 LATE, 2 MISSING, 3 EMPTY) and how many frames it holds.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EvbWindow {
    pub begin: u64,
    pub end: u64,
    pub core_end: u64,
    pub status: u16,
    pub frames: u32,
}

/// One frame of a window fragment: its ticks, source and flags, and where its payload lies
/// in the fragment (`offset` bytes from its start, `length` bytes: no copy).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EvbFrame {
    pub begin: u64,
    pub end: u64,
    pub source_id: u16,
    pub flags: u16,
    pub offset: usize,
    pub length: usize,
}

/// Reads and checks a window fragment (a fragment flagged WINDOW in a run built by time):
/// its window into `*out`, and its first `capacity` frames into `frames` (which may be NULL
/// with `capacity` 0). `EVB_ERR_SIZE` when it holds more frames than `capacity` (`out->frames`
/// says how many: call again with room); `EVB_ERR_ARG` for damaged input, the reason in
/// `evb_last_error()`.
///
/// # Safety
/// `data` is valid for `len` bytes of reading; `out` is valid for a write; `frames` is NULL
/// or valid for `capacity` writes.
#[no_mangle]
pub unsafe extern "C" fn evb_decode_window(
    data: *const u8,
    len: usize,
    out: *mut EvbWindow,
    frames: *mut EvbFrame,
    capacity: usize,
) -> c_int {
    guard(|| {
        if data.is_null() || out.is_null() || (frames.is_null() && capacity > 0) {
            return Err(fail(EVB_ERR_ARG, "data, out or frames is NULL"));
        }
        // SAFETY: non-null and valid for `len` bytes (this function's contract).
        let bytes = unsafe { std::slice::from_raw_parts(data, len) };
        let w = evb_wire::window::decode_window(bytes)
            .map_err(|e| fail(EVB_ERR_ARG, &format!("not a window fragment: {e}")))?;
        let h = w.header;
        let n = w.frames.len();
        let window = EvbWindow {
            begin: h.begin,
            end: h.end,
            core_end: h.core_end,
            status: h.status as u16,
            frames: n as u32,
        };
        // SAFETY: checked non-null; valid for a write (this function's contract).
        unsafe { put(out, window, "out") }?;
        if n > capacity {
            return Err(fail(
                EVB_ERR_SIZE,
                &format!("the fragment holds {n} frames, room was given for {capacity}"),
            ));
        }
        for (i, (f, payload)) in w.frames.iter().enumerate() {
            let frame = EvbFrame {
                begin: f.begin,
                end: f.end,
                source_id: f.source_id,
                flags: f.flags,
                offset: payload.as_ptr() as usize - bytes.as_ptr() as usize,
                length: payload.len(),
            };
            // SAFETY: i < n <= capacity, and `frames` is valid for `capacity` writes.
            unsafe { frames.add(i).write(frame) };
        }
        Ok(EVB_OK)
    })
}

/// Gives buffer `id` back unsubmitted.
///
/// # Safety
/// `p` is a live producer.
#[no_mangle]
pub unsafe extern "C" fn evb_producer_release(p: *mut EvbProducer, id: u64) -> c_int {
    guard(|| {
        // SAFETY: a live producer (this function's contract).
        let p = unsafe { handle(p) }?;
        match p.buffers.remove(&id) {
            Some(_) => Ok(EVB_OK),
            None => Err(code_of(&evb_plugin::Error::UnknownBuffer)),
        }
    })
}

/// Ends the feed (the run ends after the events submitted) and waits for the RU's run to
/// end: `EVB_OK` if it ended cleanly, `EVB_ERR_RUN_FAILED` and the reason otherwise.
///
/// # Safety
/// `p` is a live producer.
#[no_mangle]
pub unsafe extern "C" fn evb_producer_finish(p: *mut EvbProducer) -> c_int {
    guard(|| {
        // SAFETY: a live producer (this function's contract).
        let p = unsafe { handle(p) }?;
        p.buffers.clear();
        let producer = p
            .producer
            .take()
            .ok_or_else(|| fail(EVB_ERR_STATE, "the producer has finished already"))?;
        let outcome = producer.finish().map_err(|e| code_of(&e))?;
        let code = ended(&outcome);
        p.outcome = Some(outcome);
        Ok(code)
    })
}

/// Frees a producer (finishing it first if needed, without waiting for the run).
///
/// # Safety
/// `p` is NULL or a live producer, not used again after this call.
#[no_mangle]
pub unsafe extern "C" fn evb_producer_free(p: *mut EvbProducer) {
    guard(|| {
        if !p.is_null() {
            // SAFETY: made by Box::into_raw in evb_producer_start, freed once (contract).
            drop(unsafe { Box::from_raw(p) });
        }
        Ok(EVB_OK)
    });
}

/// Starts BU `bu_id` of the configuration file `config_path` (its sink `"api"`) in this
/// process, its events handed to the consumer written to `*out`, which holds at most
/// `max_held` events at once (0: 8).
///
/// # Safety
/// `config_path` and `bu_id` are NUL-terminated strings; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_consumer_start(
    config_path: *const c_char,
    bu_id: *const c_char,
    max_held: usize,
    out: *mut *mut EvbConsumer,
) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe { consumer_start(ConfigArg::Path, config_path, bu_id, max_held, out) }
}

/// `evb_consumer_start` with the configuration given as TOML text (see
/// `evb_producer_start_toml`).
///
/// # Safety
/// `toml` and `bu_id` are NUL-terminated strings; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_consumer_start_toml(
    toml: *const c_char,
    bu_id: *const c_char,
    max_held: usize,
    out: *mut *mut EvbConsumer,
) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe { consumer_start(ConfigArg::Toml, toml, bu_id, max_held, out) }
}

/// # Safety
/// `config` and `bu_id` are NUL-terminated strings; `out` is valid for a write.
unsafe fn consumer_start(
    from: ConfigArg,
    config: *const c_char,
    bu_id: *const c_char,
    max_held: usize,
    out: *mut *mut EvbConsumer,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from this function's contract.
        let (cfg, id) = unsafe { (from.load(config)?, text(bu_id, "bu_id")?) };
        let opts = ConsumerOptions {
            max_held: if max_held == 0 { 8 } else { max_held },
        };
        let consumer = Consumer::start(&cfg, id, opts).map_err(|e| code_of(&e))?;
        let h = Box::new(EvbConsumer {
            consumer: Some(consumer),
            outcome: None,
        });
        // SAFETY: `out` is valid for a write (this function's contract).
        unsafe { put(out, Box::into_raw(h), "out") }?;
        Ok(EVB_OK)
    })
}

/// The next built event, waiting up to `timeout_ms` (negative: without limit): `EVB_OK`
/// and the event in `*out`, `EVB_TIMEOUT`, or `EVB_END` when the run is over.
///
/// # Safety
/// `c` is a live consumer; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_consumer_next(
    c: *mut EvbConsumer,
    timeout_ms: i64,
    out: *mut *mut EvbEvent,
) -> c_int {
    guard(|| {
        // SAFETY: a live consumer (this function's contract).
        let c = unsafe { handle(c) }?;
        if out.is_null() {
            return Err(fail(EVB_ERR_ARG, "out is NULL"));
        }
        let consumer = c
            .consumer
            .as_mut()
            .ok_or_else(|| fail(EVB_ERR_STATE, "the consumer has finished"))?;
        let next = if timeout_ms < 0 {
            consumer.next().map_or(Next::End, Next::Event)
        } else {
            consumer.next_timeout(Duration::from_millis(timeout_ms as u64))
        };
        match next {
            Next::Event(event) => {
                let e = Box::into_raw(Box::new(EvbEvent { event }));
                // SAFETY: checked non-null; valid for a write (this function's contract).
                unsafe { out.write(e) };
                Ok(EVB_OK)
            }
            Next::Timeout => Ok(EVB_TIMEOUT),
            Next::End => Ok(EVB_END),
        }
    })
}

/// Waits for the BU's run to end (events still coming are released unread): `EVB_OK` if it
/// ended cleanly, `EVB_ERR_RUN_FAILED` and the reason otherwise.
///
/// # Safety
/// `c` is a live consumer.
#[no_mangle]
pub unsafe extern "C" fn evb_consumer_finish(c: *mut EvbConsumer) -> c_int {
    guard(|| {
        // SAFETY: a live consumer (this function's contract).
        let c = unsafe { handle(c) }?;
        let consumer = c
            .consumer
            .take()
            .ok_or_else(|| fail(EVB_ERR_STATE, "the consumer has finished already"))?;
        let outcome = consumer.finish().map_err(|e| code_of(&e))?;
        let code = ended(&outcome);
        c.outcome = Some(outcome);
        Ok(code)
    })
}

/// Frees a consumer. Events not yet released stay valid until released.
///
/// # Safety
/// `c` is NULL or a live consumer, not used again after this call.
#[no_mangle]
pub unsafe extern "C" fn evb_consumer_free(c: *mut EvbConsumer) {
    guard(|| {
        if !c.is_null() {
            // SAFETY: made by Box::into_raw in evb_consumer_start, freed once (contract).
            drop(unsafe { Box::from_raw(c) });
        }
        Ok(EVB_OK)
    });
}

/// An event handle made by `evb_consumer_next`.
///
/// # Safety
/// `e` is null or a live event.
unsafe fn event<'a>(e: *const EvbEvent) -> Option<&'a Event> {
    // SAFETY: the caller promises a live event (or null).
    unsafe { e.as_ref() }.map(|e| &e.event)
}

/// The event's id (0 for NULL).
///
/// # Safety
/// `e` is NULL or a live event.
#[no_mangle]
pub unsafe extern "C" fn evb_event_id(e: *const EvbEvent) -> u64 {
    // SAFETY: this function's contract.
    unsafe { event(e) }.map_or(0, Event::event_id)
}

/// The event's trigger number (0 for NULL).
///
/// # Safety
/// `e` is NULL or a live event.
#[no_mangle]
pub unsafe extern "C" fn evb_event_trigger_number(e: *const EvbEvent) -> u32 {
    // SAFETY: this function's contract.
    unsafe { event(e) }.map_or(0, Event::trigger_number)
}

/// Fragments in the event (one per RU; 0 for NULL).
///
/// # Safety
/// `e` is NULL or a live event.
#[no_mangle]
pub unsafe extern "C" fn evb_event_fragment_count(e: *const EvbEvent) -> usize {
    // SAFETY: this function's contract.
    unsafe { event(e) }.map_or(0, Event::fragment_count)
}

/// Fragment `i` of the event, described in `*out`.
///
/// # Safety
/// `e` is a live event; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_event_fragment(
    e: *const EvbEvent,
    i: usize,
    out: *mut EvbFragment,
) -> c_int {
    guard(|| {
        // SAFETY: this function's contract.
        let ev = unsafe { event(e) }.ok_or_else(|| fail(EVB_ERR_ARG, "event is NULL"))?;
        let f = ev
            .fragment(i)
            .ok_or_else(|| fail(EVB_ERR_ARG, &format!("no fragment {i}")))?;
        let d = EvbFragment {
            source_id: f.source_id(),
            flags: f.flags(),
            trigger_number: f.trigger_number(),
            payload_crc: f.payload_crc(),
            size: f.len(),
            chunks: f.chunks().count(),
        };
        // SAFETY: valid for a write (this function's contract).
        unsafe { put(out, d, "out") }?;
        Ok(EVB_OK)
    })
}

/// Piece `chunk` of fragment `i`'s payload, in place: `*data` and `*len`, valid until the
/// event is released.
///
/// # Safety
/// `e` is a live event; `data` and `len` are valid for writes.
#[no_mangle]
pub unsafe extern "C" fn evb_event_chunk(
    e: *const EvbEvent,
    i: usize,
    chunk: usize,
    data: *mut *const u8,
    len: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: this function's contract.
        let ev = unsafe { event(e) }.ok_or_else(|| fail(EVB_ERR_ARG, "event is NULL"))?;
        let piece = ev
            .fragment(i)
            .and_then(|f| f.chunks().nth(chunk).map(|c| (c.as_ptr(), c.len())))
            .ok_or_else(|| fail(EVB_ERR_ARG, &format!("no chunk {chunk} of fragment {i}")))?;
        if len.is_null() {
            return Err(fail(EVB_ERR_ARG, "len is NULL"));
        }
        // SAFETY: valid for writes (this function's contract); `len` checked non-null.
        unsafe {
            put(data, piece.0, "data")?;
            len.write(piece.1);
        }
        Ok(EVB_OK)
    })
}

/// Releases an event: its bytes go back to the BU's pool and its place to the consumer.
///
/// # Safety
/// `e` is NULL or a live event, not used again after this call.
#[no_mangle]
pub unsafe extern "C" fn evb_event_release(e: *mut EvbEvent) {
    guard(|| {
        if !e.is_null() {
            // SAFETY: made by Box::into_raw in evb_consumer_next, released once (contract).
            drop(unsafe { Box::from_raw(e) });
        }
        Ok(EVB_OK)
    });
}

/// Starts the EVM of the configuration file `config_path` (`builder.by = "window"`,
/// `windows.outside = true`) in this process, its records decided through the trigger
/// written to `*out`; the RUs and BUs run elsewhere (`evb node`) from the same file.
///
/// # Safety
/// `config_path` is a NUL-terminated string; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_trigger_start(
    config_path: *const c_char,
    out: *mut *mut EvbTrigger,
) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe { trigger_start(ConfigArg::Path, config_path, out) }
}

/// `evb_trigger_start` with the configuration given as TOML text.
///
/// # Safety
/// `toml` is a NUL-terminated string; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_trigger_start_toml(
    toml: *const c_char,
    out: *mut *mut EvbTrigger,
) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe { trigger_start(ConfigArg::Toml, toml, out) }
}

/// # Safety
/// `config` is a NUL-terminated string; `out` is valid for a write.
unsafe fn trigger_start(
    from: ConfigArg,
    config: *const c_char,
    out: *mut *mut EvbTrigger,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from this function's contract.
        let cfg = unsafe { from.load(config) }?;
        let trigger = Trigger::start(&cfg).map_err(|e| code_of(&e))?;
        let handle = Box::into_raw(Box::new(EvbTrigger {
            trigger: Some(trigger),
            outcome: None,
        }));
        // SAFETY: `out` is valid for a write (this function's contract).
        if let Err(code) = unsafe { put(out, handle, "out") } {
            // SAFETY: made just above and not handed out.
            drop(unsafe { Box::from_raw(handle) });
            return Err(code);
        }
        Ok(EVB_OK)
    })
}

/// Waits until the run's RUs and BUs are connected to the EVM (`EVB_ERR_SETUP` naming
/// what could not be reached, once `run.connect_timeout_s` is over).
///
/// # Safety
/// `t` is a live trigger.
#[no_mangle]
pub unsafe extern "C" fn evb_trigger_wait_connected(t: *mut EvbTrigger) -> c_int {
    guard(|| {
        // SAFETY: a live trigger (this function's contract).
        let t = unsafe { handle(t) }?;
        let trigger = t
            .trigger
            .as_mut()
            .ok_or_else(|| fail(EVB_ERR_STATE, "the trigger has finished already"))?;
        trigger.wait_connected().map_err(|e| code_of(&e))?;
        Ok(EVB_OK)
    })
}

/// Decides a record: readout window `[begin, end)` in ticks over the `n` source ids at
/// `components` (any order; `n` 0: every source, `components` may then be NULL); its record
/// number goes to `*record` (may be NULL). `EVB_ERR_REFUSED` (nothing taken, the run goes
/// on) for a window that does not end after it begins, is longer than
/// `windows.longest_ticks`, or names a source no RU reads or one twice; `EVB_ERR_RUN_OVER`
/// once the run is over.
///
/// # Safety
/// `t` is a live trigger; `components` is valid for `n` reads of `uint16_t` (or NULL with
/// `n` 0); `record` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn evb_trigger_decide(
    t: *mut EvbTrigger,
    begin: u64,
    end: u64,
    components: *const u16,
    n: usize,
    record: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: a live trigger (this function's contract).
        let t = unsafe { handle(t) }?;
        let list: &[u16] = if n == 0 {
            &[]
        } else if components.is_null() {
            return Err(fail(EVB_ERR_ARG, "components is NULL with n > 0"));
        } else {
            // SAFETY: non-null and valid for `n` reads (this function's contract).
            unsafe { std::slice::from_raw_parts(components, n) }
        };
        let trigger = t
            .trigger
            .as_mut()
            .ok_or_else(|| fail(EVB_ERR_STATE, "the trigger has finished already"))?;
        let k = trigger.decide(begin, end, list).map_err(|e| code_of(&e))?;
        if !record.is_null() {
            // SAFETY: non-null, valid for a write (this function's contract).
            unsafe { record.write(k) };
        }
        Ok(EVB_OK)
    })
}

/// Ends the run now: decisions not yet triggered are counted, not built.
///
/// # Safety
/// `t` is a live trigger.
#[no_mangle]
pub unsafe extern "C" fn evb_trigger_stop(t: *mut EvbTrigger) -> c_int {
    guard(|| {
        // SAFETY: a live trigger (this function's contract).
        let t = unsafe { handle(t) }?;
        if let Some(trigger) = &t.trigger {
            trigger.stop();
        }
        Ok(EVB_OK)
    })
}

/// Waits for the run's end (after `run.events` decisions, its duration, or
/// `evb_trigger_stop`): `EVB_OK` for a clean run, `EVB_ERR_RUN_FAILED` with the reason in
/// `evb_last_error` otherwise.
///
/// # Safety
/// `t` is a live trigger.
#[no_mangle]
pub unsafe extern "C" fn evb_trigger_finish(t: *mut EvbTrigger) -> c_int {
    guard(|| {
        // SAFETY: a live trigger (this function's contract).
        let t = unsafe { handle(t) }?;
        let trigger = t
            .trigger
            .take()
            .ok_or_else(|| fail(EVB_ERR_STATE, "the trigger has finished already"))?;
        let outcome = trigger.finish().map_err(|e| code_of(&e))?;
        let code = ended(&outcome);
        t.outcome = Some(outcome);
        Ok(code)
    })
}

/// Frees a trigger (without waiting for the run: its EVM goes on until the run ends, then
/// its thread is left).
///
/// # Safety
/// `t` is NULL or a live trigger, not used again after this call.
#[no_mangle]
pub unsafe extern "C" fn evb_trigger_free(t: *mut EvbTrigger) {
    guard(|| {
        if !t.is_null() {
            // SAFETY: made by Box::into_raw in evb_trigger_start, freed once (contract).
            drop(unsafe { Box::from_raw(t) });
        }
        Ok(EVB_OK)
    });
}

//! `evb.Consumer`, `evb.Event`, `evb.Fragment`, `evb.Chunk`: a BU's built events in Python,
//! their payloads exported in place (read-only buffer protocol) from the BU's pool.

use std::os::raw::{c_int, c_void};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use evb_plugin::{Consumer, ConsumerOptions, Event, Next};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use crate::{
    load_config, lock, outcome, state_error, status_json, to_py, to_python, wait_connected,
    Outcome, Timeout,
};

/// A consumer program's handle on its BU: `Consumer(config, "bu0", max_held=8)`, where
/// `config` is the configuration file's path or its TOML text (the BU's sink `"api"`).
/// It returns once the BU is connected to its EVM, and raises `evb.SetupError` naming the
/// address tried when the EVM cannot be reached within `run.connect_timeout_s`. Iterate it
/// for events (the iteration ends with the run), or call `next(timeout)`.
#[pyclass(name = "Consumer", module = "evb", frozen)]
pub struct PyConsumer {
    inner: Mutex<Option<Consumer>>,
}

const FINISHED: &str = "the consumer has finished";

#[pymethods]
impl PyConsumer {
    #[new]
    #[pyo3(signature = (config, bu_id, max_held = 8))]
    fn new(
        py: Python<'_>,
        config: &Bound<'_, PyAny>,
        bu_id: &str,
        max_held: usize,
    ) -> PyResult<Self> {
        let cfg = load_config(config)?;
        let c = py
            .detach(|| Consumer::start(&cfg, bu_id, ConsumerOptions { max_held }))
            .map_err(to_py)?;
        let c = wait_connected(py, c, Consumer::connected)?;
        Ok(PyConsumer {
            inner: Mutex::new(Some(c)),
        })
    }

    /// The next built event; `None` once the run is over. With a `timeout` (seconds) it
    /// raises `evb.Timeout` when no event came in that time (the run goes on).
    #[pyo3(signature = (timeout = None))]
    fn next(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<PyEvent>> {
        let deadline = match timeout {
            Some(t) if !(t >= 0.0 && t.is_finite()) => {
                return Err(pyo3::exceptions::PyValueError::new_err(
                    "timeout must be a finite number of seconds >= 0 (or None)",
                ))
            }
            Some(t) => Some(Instant::now() + Duration::from_secs_f64(t)),
            None => None,
        };
        loop {
            // short waits with the GIL released, Ctrl-C honoured between them
            let wait = deadline.map_or(Duration::from_millis(100), |d| {
                d.saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(100))
            });
            let got = py.detach(|| lock(&self.inner).as_mut().map(|c| c.next_timeout(wait)));
            match got {
                None => return Err(state_error(FINISHED)),
                Some(Next::Event(e)) => return Ok(Some(PyEvent::new(e))),
                Some(Next::End) => return Ok(None),
                Some(Next::Timeout) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(Timeout::new_err(format!(
                            "no event within {} s",
                            timeout.unwrap_or_default()
                        )));
                    }
                    py.check_signals()?;
                }
            }
        }
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<PyEvent>> {
        self.next(py, None)
    }

    /// Waits for the BU's run to end and returns its `evb.Outcome` (events still coming
    /// are released unread).
    fn finish(&self, py: Python<'_>) -> PyResult<Outcome> {
        let c = lock(&self.inner)
            .take()
            .ok_or_else(|| state_error(FINISHED))?;
        let o = py.detach(|| c.finish()).map_err(to_py)?;
        outcome(py, o)
    }

    /// The BU's latest status (a dict: the JSON line `evb node` prints).
    fn status(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let s = lock(&self.inner)
            .as_ref()
            .map(Consumer::status)
            .ok_or_else(|| state_error(FINISHED))?;
        to_python(py, &status_json(s)?)
    }

    /// Events taken so far.
    #[getter]
    fn events_taken(&self) -> PyResult<u64> {
        lock(&self.inner)
            .as_ref()
            .map(Consumer::events_taken)
            .ok_or_else(|| state_error(FINISHED))
    }
}

struct EventState {
    event: Option<Event>,
    /// In-place views of its payloads alive now.
    views: usize,
    /// Release when the last view goes (a `with` block ended while views were alive).
    pending: bool,
}

/// One built event (checked by the BU). Its fragments' payloads stay in the BU's pool
/// until the event is released: by `release()`, at the end of a `with` block, or when the
/// object is garbage collected. Views of its payloads keep it alive; `release()` while
/// some are alive raises `evb.StateError`, a `with` block's end releases it when the last
/// one goes.
#[pyclass(name = "Event", module = "evb", frozen)]
pub struct PyEvent {
    state: Mutex<EventState>,
    /// The event id.
    #[pyo3(get)]
    event_id: u64,
    /// The trigger number.
    #[pyo3(get)]
    trigger_number: u32,
    /// A source's fragment is a MISSING placeholder.
    #[pyo3(get)]
    is_partial: bool,
    /// A fragment failed its CRC or content check.
    #[pyo3(get)]
    is_corrupt: bool,
    /// The fragments' trigger numbers disagree.
    #[pyo3(get)]
    trigger_mismatch: bool,
    /// Payload bytes over all fragments.
    #[pyo3(get)]
    bytes: usize,
    fragment_count: usize,
}

impl PyEvent {
    fn new(e: Event) -> PyEvent {
        PyEvent {
            event_id: e.event_id(),
            trigger_number: e.trigger_number(),
            is_partial: e.is_partial(),
            is_corrupt: e.is_corrupt(),
            trigger_mismatch: e.trigger_mismatch(),
            bytes: e.bytes(),
            fragment_count: e.fragment_count(),
            state: Mutex::new(EventState {
                event: Some(e),
                views: 0,
                pending: false,
            }),
        }
    }

    /// Fills `view` with the bytes of fragment `frag` (chunk `chunk`, or the whole payload:
    /// in place when it is one slice, else `copy`, made once) of this event, for `owner`.
    ///
    /// # Safety
    /// `view` is the Py_buffer Python asked `owner` to fill.
    unsafe fn export(
        &self,
        owner: &Bound<'_, PyAny>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
        frag: usize,
        chunk: Option<usize>,
        copy: Option<&OnceLock<Box<[u8]>>>,
    ) -> PyResult<()> {
        let mut st = lock(&self.state);
        let e = st.event.as_ref().ok_or_else(|| {
            PyBufferError::new_err("this event was released: its payloads are gone")
        })?;
        let f = e
            .fragment(frag)
            .ok_or_else(|| PyBufferError::new_err("no such fragment"))?;
        let (bytes, in_place): (&[u8], bool) = match (chunk, f.contiguous(), copy) {
            (Some(j), _, _) => (
                f.chunks()
                    .nth(j)
                    .ok_or_else(|| PyBufferError::new_err("no such chunk"))?,
                true,
            ),
            (None, Some(one), _) => (one, true),
            (None, None, Some(c)) => (c.get_or_init(|| f.to_vec().into_boxed_slice()), false),
            (None, None, None) => return Err(PyBufferError::new_err("no such payload")),
        };
        // SAFETY: `view` is ours to fill. In place, the bytes are the BU pool's, held by
        // the `Event` in `st.event`, which is not dropped while `st.views` > 0 (counted
        // below, uncounted by `unexport`); a copy lives in `owner`, which the view holds a
        // reference to (FillInfo sets `view.obj`). Read-only: a writable request fails.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                owner.as_ptr(),
                bytes.as_ptr() as *mut c_void,
                bytes.len() as ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(owner.py()));
        }
        if in_place {
            st.views += 1;
            // SAFETY: `view` was filled above; `internal` is the exporter's to use: it
            // marks an in-place view for `unexport`.
            unsafe { (*view).internal = std::ptr::dangling_mut::<c_void>() };
        }
        Ok(())
    }

    /// A view filled by `export` was released.
    ///
    /// # Safety
    /// `view` is one that `export` filled.
    unsafe fn unexport(&self, view: *mut ffi::Py_buffer) {
        // SAFETY: the caller passes a view that `export` filled (or null).
        let in_place = !view.is_null() && unsafe { !(*view).internal.is_null() };
        if !in_place {
            return;
        }
        let released = {
            let mut st = lock(&self.state);
            st.views = st.views.saturating_sub(1);
            if st.views == 0 && st.pending {
                st.event.take()
            } else {
                None
            }
        };
        drop(released);
    }
}

#[pymethods]
impl PyEvent {
    /// Number of fragments (one per RU).
    fn __len__(&self) -> usize {
        self.fragment_count
    }

    #[getter]
    fn fragment_count(&self) -> usize {
        self.fragment_count
    }

    /// The fragments (`evb.Fragment`), one per RU in RU order.
    #[getter]
    fn fragments(slf: Bound<'_, Self>) -> PyResult<Vec<PyFragment>> {
        let me = slf.get();
        let st = lock(&me.state);
        let e = st
            .event
            .as_ref()
            .ok_or_else(|| state_error("this event was released"))?;
        Ok(e.fragments()
            .enumerate()
            .map(|(index, f)| PyFragment {
                event: slf.clone().unbind(),
                index,
                source_id: f.source_id(),
                trigger_number: f.trigger_number(),
                flags: f.flags(),
                payload_crc: f.payload_crc(),
                len: f.len(),
                chunk_count: f.chunks().count(),
                copy: OnceLock::new(),
            })
            .collect())
    }

    /// True once released.
    #[getter]
    fn released(&self) -> bool {
        lock(&self.state).event.is_none()
    }

    /// Gives the event's blocks back to the BU (and its place among the `max_held`).
    /// Raises `evb.StateError` while views of its payloads are alive; a second call does
    /// nothing.
    fn release(&self) -> PyResult<()> {
        let e = {
            let mut st = lock(&self.state);
            if st.views > 0 {
                return Err(state_error(format!(
                    "event {} has {} view(s) of its payloads alive (memoryview, numpy): \
                     release them first",
                    self.event_id, st.views
                )));
            }
            st.event.take()
        };
        drop(e);
        Ok(())
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// The end of a `with` block releases the event, or, views of it being alive, marks it
    /// to be released when the last one goes.
    fn __exit__(
        &self,
        _t: &Bound<'_, PyAny>,
        _v: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> bool {
        let e = {
            let mut st = lock(&self.state);
            if st.views > 0 {
                st.pending = true;
                None
            } else {
                st.event.take()
            }
        };
        drop(e);
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "evb.Event(event_id={}, trigger_number={}, fragments={}, bytes={}{})",
            self.event_id,
            self.trigger_number,
            self.fragment_count,
            self.bytes,
            if self.released() { ", released" } else { "" }
        )
    }
}

/// One fragment of an event: its header's fields and its payload through the read-only
/// buffer protocol (`memoryview(f)`, `numpy.frombuffer(f, dtype=numpy.uint8)`): in place in
/// the BU's pool when it is one slice (`contiguous`), else a copy made once. `chunks()`
/// gives the slices in place whatever the layout.
#[pyclass(name = "Fragment", module = "evb", frozen)]
pub struct PyFragment {
    event: Py<PyEvent>,
    /// Index among the event's fragments.
    #[pyo3(get)]
    index: usize,
    #[pyo3(get)]
    source_id: u16,
    #[pyo3(get)]
    trigger_number: u32,
    /// Fragment header flags (MISSING = 1, ...).
    #[pyo3(get)]
    flags: u16,
    /// CRC32C of the payload as its RU computed it (the BU checked it).
    #[pyo3(get)]
    payload_crc: u32,
    len: usize,
    chunk_count: usize,
    copy: OnceLock<Box<[u8]>>,
}

#[pymethods]
impl PyFragment {
    /// Payload length in bytes.
    fn __len__(&self) -> usize {
        self.len
    }

    /// The payload is one slice of the BU's pool (its buffer is then zero-copy).
    #[getter]
    fn contiguous(&self) -> bool {
        self.chunk_count <= 1
    }

    /// The payload as `evb.Chunk`s in place (several when it spans blocks).
    fn chunks(&self, py: Python<'_>) -> Vec<PyChunk> {
        (0..self.chunk_count)
            .map(|chunk| PyChunk {
                event: self.event.clone_ref(py),
                frag: self.index,
                chunk,
            })
            .collect()
    }

    /// The payload copied into `bytes`.
    fn tobytes(slf: Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let mv = py
            .import("builtins")?
            .getattr("memoryview")?
            .call1((&slf,))?;
        let b = mv.call_method0("tobytes")?;
        mv.call_method0("release")?;
        Ok(b.unbind())
    }

    /// The event it belongs to.
    #[getter]
    fn event(&self, py: Python<'_>) -> Py<PyEvent> {
        self.event.clone_ref(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "evb.Fragment(source_id={}, trigger_number={}, len={}, payload_crc={:#010x})",
            self.source_id, self.trigger_number, self.len, self.payload_crc
        )
    }

    /// # Safety
    /// Called by Python with a `Py_buffer` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        // SAFETY: `view` is the one Python passed us.
        unsafe {
            me.event
                .get()
                .export(slf.as_any(), view, flags, me.index, None, Some(&me.copy))
        }
    }

    /// # Safety
    /// Called by Python when a view filled by `__getbuffer__` is released.
    unsafe fn __releasebuffer__(&self, view: *mut ffi::Py_buffer) {
        // SAFETY: `view` is one that `__getbuffer__` filled.
        unsafe { self.event.get().unexport(view) }
    }
}

/// One slice of a fragment's payload, in place in the BU's pool (read-only buffer protocol).
#[pyclass(name = "Chunk", module = "evb", frozen)]
pub struct PyChunk {
    event: Py<PyEvent>,
    frag: usize,
    chunk: usize,
}

#[pymethods]
impl PyChunk {
    /// # Safety
    /// Called by Python with a `Py_buffer` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        // SAFETY: `view` is the one Python passed us.
        unsafe {
            me.event
                .get()
                .export(slf.as_any(), view, flags, me.frag, Some(me.chunk), None)
        }
    }

    /// # Safety
    /// Called by Python when a view filled by `__getbuffer__` is released.
    unsafe fn __releasebuffer__(&self, view: *mut ffi::Py_buffer) {
        // SAFETY: `view` is one that `__getbuffer__` filled.
        unsafe { self.event.get().unexport(view) }
    }
}

//! `evb.Producer` and `evb.Buffer`: a readout in Python feeding an RU.

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use evb_plugin::{Buffer, Error as PlugError, Producer, WhenFull};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use crate::{
    load_config, lock, outcome, state_error, status_json, to_py, to_python, wait_connected, Outcome,
};

/// Calls `f` with the bytes of a buffer-protocol object (bytes, bytearray, memoryview,
/// numpy array, ...), in place when they are C-contiguous, else copied once into one run.
/// `f` may release the GIL: the exported buffer keeps the memory in place meanwhile.
pub(crate) fn with_bytes<R>(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    f: impl FnOnce(&[u8]) -> PyResult<R>,
) -> PyResult<R> {
    let view = PyUntypedBuffer::get(obj)?;
    if !view.is_c_contiguous() {
        let bytes: Vec<u8> = py
            .import("builtins")?
            .getattr("memoryview")?
            .call1((obj,))?
            .call_method0("tobytes")?
            .extract()?;
        return f(&bytes);
    }
    let (ptr, len) = (view.buf_ptr() as *const u8, view.len_bytes());
    let bytes = if len == 0 {
        &[][..]
    } else {
        // SAFETY: `view` holds the object's buffer exported (PyObject_GetBuffer) until it
        // is dropped below, after `f`: `len` bytes at `ptr`, C-contiguous, kept in place by
        // the exporter meanwhile (a bytearray cannot resize while exported).
        unsafe { std::slice::from_raw_parts(ptr, len) }
    };
    let r = f(bytes);
    drop(view);
    r
}

/// Room for one fragment in the RU's pool, from `Producer.buffer(size)`. It supports the
/// writable buffer protocol: `memoryview(buf)`, `numpy.frombuffer(buf, dtype=numpy.uint8)`
/// write straight into the pool block (zero copy). Submit it once with `Producer.submit`;
/// views of it must be gone by then (`del` them, or `with memoryview(buf) as m:`), else
/// `submit` raises `evb.StateError`. Dropped unsubmitted, its room goes back to the pool.
#[pyclass(name = "Buffer", module = "evb", frozen)]
pub struct PyBuf {
    inner: Mutex<Option<Buffer>>,
    /// Buffer-protocol views of it alive now.
    views: AtomicUsize,
}

impl PyBuf {
    /// The buffer for submission: refused while views of it are alive or once submitted.
    fn take(&self) -> PyResult<Buffer> {
        let mut g = lock(&self.inner);
        let views = self.views.load(Ordering::Acquire);
        if views > 0 {
            return Err(state_error(format!(
                "this buffer has {views} view(s) alive (memoryview, numpy array): release them \
                 (del, or `with memoryview(buf) as m:`) before submitting it"
            )));
        }
        g.take()
            .ok_or_else(|| state_error("this buffer was submitted already"))
    }
}

#[pymethods]
impl PyBuf {
    /// Payload length (initially the size asked for; `set_len` shortens it).
    fn __len__(&self) -> PyResult<usize> {
        Ok(lock(&self.inner).as_ref().map_or(0, Buffer::len))
    }

    /// The most payload it can hold (the size asked for).
    #[getter]
    fn capacity(&self) -> usize {
        lock(&self.inner).as_ref().map_or(0, Buffer::capacity)
    }

    /// True once submitted (it can no longer be written or submitted).
    #[getter]
    fn submitted(&self) -> bool {
        lock(&self.inner).is_none()
    }

    /// Makes the fragment `n` bytes long (at most its capacity).
    fn set_len(&self, n: usize) -> PyResult<()> {
        let mut g = lock(&self.inner);
        let b = g
            .as_mut()
            .ok_or_else(|| state_error("this buffer was submitted already"))?;
        b.set_len(n).map_err(to_py)
    }

    fn __repr__(&self) -> String {
        match lock(&self.inner).as_ref() {
            Some(b) => format!("evb.Buffer(len={}, capacity={})", b.len(), b.capacity()),
            None => "evb.Buffer(submitted)".into(),
        }
    }

    /// # Safety
    /// Called by Python with a `Py_buffer` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        let mut g = lock(&me.inner);
        let b = g.as_mut().ok_or_else(|| {
            PyBufferError::new_err("this evb.Buffer was submitted: it can no longer be written")
        })?;
        let data = b.payload_mut();
        // SAFETY: `view` is the Py_buffer Python asks us to fill; the bytes are this
        // buffer's room in the pool block, which stays in place until the `Buffer` is
        // dropped: it is neither submitted nor dropped while `views` > 0 (see `take`), and
        // the view holds a reference to this object (FillInfo sets `view.obj`).
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                data.as_mut_ptr().cast::<c_void>(),
                data.len() as ffi::Py_ssize_t,
                0,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        me.views.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// # Safety
    /// Called by Python when a view filled by `__getbuffer__` is released.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let _g = lock(&self.inner);
        self.views.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A readout program's handle on its RU: `Producer(config, "ru0")`, where `config` is the
/// configuration file's path or its TOML text (`source.kind = "api"`). The RU runs on a
/// thread of this process; the EVM and BUs are `evb node` processes. It returns once the
/// RU is connected to its EVM, and raises `evb.SetupError` naming the address tried when
/// the EVM cannot be reached within `run.connect_timeout_s`.
#[pyclass(name = "Producer", module = "evb", frozen)]
pub struct PyProducer {
    inner: Mutex<Option<Producer>>,
    max_fragment: usize,
}

const FINISHED: &str = "the producer has finished";

impl PyProducer {
    /// Runs `f` on the producer with the GIL released (it may block).
    fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Producer) -> Result<R, PlugError> + Send,
    ) -> PyResult<R> {
        py.detach(|| match lock(&self.inner).as_mut() {
            Some(p) => f(p).map_err(Some),
            None => Err(None),
        })
        .map_err(|e| e.map_or_else(|| state_error(FINISHED), to_py))
    }

    /// Repeats `f` (which answers `Full` when the pool has no room) until it succeeds,
    /// with the GIL released between tries and Ctrl-C honoured; once when `block` is false.
    fn retry_full<R: Send>(
        &self,
        py: Python<'_>,
        block: bool,
        mut f: impl FnMut(&mut Producer) -> Result<R, PlugError> + Send,
    ) -> PyResult<R> {
        let mut pause = Duration::from_micros(20);
        loop {
            let r = py.detach(|| match lock(&self.inner).as_mut() {
                Some(p) => f(p).map_err(Some),
                None => Err(None),
            });
            match r {
                Ok(v) => return Ok(v),
                Err(Some(PlugError::Full)) if block => {
                    py.detach(|| std::thread::sleep(pause));
                    pause = (pause * 2).min(Duration::from_millis(1));
                    py.check_signals()?;
                }
                Err(e) => return Err(e.map_or_else(|| state_error(FINISHED), to_py)),
            }
        }
    }
}

#[pymethods]
impl PyProducer {
    #[new]
    fn new(py: Python<'_>, config: &Bound<'_, PyAny>, ru_id: &str) -> PyResult<Self> {
        let cfg = load_config(config)?;
        let p = py.detach(|| Producer::start(&cfg, ru_id)).map_err(to_py)?;
        let p = wait_connected(py, p, |p| p.connected())?;
        Ok(PyProducer {
            max_fragment: p.max_fragment(),
            inner: Mutex::new(Some(p)),
        })
    }

    /// The producers of an RU with `[[ru]] producer_sources` (2 or more), one per entry and
    /// in that order: `Producer.many(config, "ru0")`. Each may be used from a thread of its
    /// own; the RU joins their k-th fragments into event k's super-fragment.
    #[staticmethod]
    fn many(py: Python<'_>, config: &Bound<'_, PyAny>, ru_id: &str) -> PyResult<Vec<Self>> {
        let cfg = load_config(config)?;
        let ps = py
            .detach(|| Producer::start_many(&cfg, ru_id))
            .map_err(to_py)?;
        // one RU: one connection to wait for
        let ps = wait_connected(py, ps, |ps| ps[0].connected())?;
        Ok(ps
            .into_iter()
            .map(|p| PyProducer {
                max_fragment: p.max_fragment(),
                inner: Mutex::new(Some(p)),
            })
            .collect())
    }

    /// The source id this producer's fragments carry.
    #[getter]
    fn source_id(&self) -> PyResult<u16> {
        lock(&self.inner)
            .as_ref()
            .map(Producer::source_id)
            .ok_or_else(|| state_error(FINISHED))
    }

    /// Room for a payload of `size` bytes in the RU's pool (an `evb.Buffer`). With
    /// `block=True` it waits while the pool is full (back-pressure); with `block=False` it
    /// raises `evb.Full`.
    #[pyo3(signature = (size, block = true))]
    fn buffer(&self, py: Python<'_>, size: usize, block: bool) -> PyResult<PyBuf> {
        let b = self.retry_full(py, block, |p| p.buffer(size, WhenFull::ReturnFull))?;
        Ok(PyBuf {
            inner: Mutex::new(Some(b)),
            views: AtomicUsize::new(0),
        })
    }

    /// Submits `buf` as the fragment of the next event with `trigger` (which must move
    /// forward, wrapping at 2**32). Returns the event id.
    fn submit(&self, py: Python<'_>, buf: &Bound<'_, PyBuf>, trigger: u32) -> PyResult<u64> {
        if lock(&self.inner).is_none() {
            return Err(state_error(FINISHED));
        }
        let b = buf.get().take()?;
        self.with(py, move |p| p.submit(b, trigger))
    }

    /// Copies `data` (any buffer-protocol object: bytes, bytearray, memoryview, numpy
    /// array; one copy, two when it is not C-contiguous) into the RU's pool and submits it.
    /// Returns the event id.
    #[pyo3(signature = (data, trigger, block = true))]
    fn submit_copy(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        trigger: u32,
        block: bool,
    ) -> PyResult<u64> {
        with_bytes(py, data, |bytes| {
            self.retry_full(py, block, |p| {
                p.submit_copy(bytes, trigger, WhenFull::ReturnFull)
            })
        })
    }

    /// A run built by time: submits the next frame of this producer's stream, ticks
    /// `[begin, end)` and `data` (any buffer-protocol object; copied once, its time frame
    /// header in front). The stream begins at tick 0 and each frame lasts `frames.ticks`,
    /// beginning where the last one ended; one that does not stops the run, named.
    /// Returns the frame's number, from 0.
    #[pyo3(signature = (begin, end, data, block = true))]
    fn submit_frame(
        &self,
        py: Python<'_>,
        begin: u64,
        end: u64,
        data: &Bound<'_, PyAny>,
        block: bool,
    ) -> PyResult<u64> {
        with_bytes(py, data, |bytes| {
            self.retry_full(py, block, |p| {
                p.submit_frame(begin, end, bytes, WhenFull::ReturnFull)
            })
        })
    }

    /// Ends the feed (the run ends after the events submitted), waits for the RU's run to
    /// end and returns its `evb.Outcome`.
    fn finish(&self, py: Python<'_>) -> PyResult<Outcome> {
        let p = lock(&self.inner)
            .take()
            .ok_or_else(|| state_error(FINISHED))?;
        let o = py.detach(|| p.finish()).map_err(to_py)?;
        outcome(py, o)
    }

    /// The RU's latest status (a dict: the JSON line `evb node` prints).
    fn status(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let s = self.with(py, |p| Ok(p.status()))?;
        to_python(py, &status_json(s)?)
    }

    /// Events submitted so far (the next one submitted is this event id).
    #[getter]
    fn events_submitted(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |p| Ok(p.events_submitted()))
    }

    /// The largest payload this RU accepts (`source.max_fragment`).
    #[getter]
    fn max_fragment(&self) -> usize {
        self.max_fragment
    }

    /// True once `finish` was called.
    #[getter]
    fn finished(&self) -> bool {
        lock(&self.inner).is_none()
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Leaving a `with` block ends the feed without waiting (call `finish` for the outcome).
    fn __exit__(
        &self,
        _t: &Bound<'_, PyAny>,
        _v: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> bool {
        drop(lock(&self.inner).take());
        false
    }
}

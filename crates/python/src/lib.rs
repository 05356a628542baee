//! The Python module `evb`: evb's plug-in API (docs/plugin.md) from Python. A `Producer`
//! feeds an RU (`source.kind = "api"`), a `Consumer` takes a BU's built events
//! (`sink = "api"`); the node runs on a thread of the Python process, the EVM and the other
//! nodes are `evb node` processes. `Publisher` and `Subscriber` publish and subscribe by
//! tag (evb_plugin::pubsub, docs/messaging.md).
//!
//! Every object is safe to use in any order from Python: the Rust handles live in mutexes
//! (taken with the GIL released around anything that blocks), a buffer or an event whose
//! memory is exported (memoryview, numpy) cannot be submitted or released until the views
//! are gone, and every misuse is a Python exception, never a crash.

use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::PyException;
use pyo3::prelude::*;

mod consumer;
mod files;
mod producer;
mod pubsub;
mod trigger;

pyo3::create_exception!(evb, Error, PyException, "Base of every evb error.");
pyo3::create_exception!(
    evb,
    Full,
    Error,
    "The RU's pool is full (back-pressure): no buffer now, try again."
);
pyo3::create_exception!(
    evb,
    SizeError,
    Error,
    "A payload size this RU does not accept (nothing was submitted)."
);
pyo3::create_exception!(
    evb,
    Refused,
    Error,
    "A fragment failed the RU's checks (trigger number not moving forward); `run_stopped` says whether the run stops."
);
pyo3::create_exception!(
    evb,
    RunOver,
    Error,
    "The node's run is over (ended, stopped, aborted)."
);
pyo3::create_exception!(
    evb,
    SetupError,
    Error,
    "The node could not be set up (configuration, addresses, pools)."
);
pyo3::create_exception!(
    evb,
    ConfigError,
    SetupError,
    "A configuration that is not valid TOML or that evb refuses: the message names the key (a SetupError, so code that catches those catches it too)."
);
pyo3::create_exception!(
    evb,
    StateError,
    Error,
    "A call that does not fit the object's state: a buffer submitted twice, a call after finish, a release while views are alive."
);
pyo3::create_exception!(
    evb,
    Timeout,
    Error,
    "Nothing within the time given: no event (the run goes on), a publisher held back by a slow subscriber, subscribers that did not come."
);
pyo3::create_exception!(
    evb,
    FormatError,
    Error,
    "A file that is not what its format says (docs/formats.md): named with the byte where it goes wrong."
);
pyo3::create_exception!(
    evb,
    IoError,
    Error,
    "A pub/sub socket failed (its transport's poll, a request that cannot be sent)."
);

/// The Python exception for an error of the plug-in API.
pub(crate) fn to_py(e: evb_plugin::Error) -> PyErr {
    use evb_plugin::Error as E;
    let msg = e.to_string();
    match e {
        E::Full => Full::new_err(msg),
        E::Size { .. } => SizeError::new_err(msg),
        E::Refused { run_stopped, .. } => Python::attach(|py| {
            let err = Refused::new_err(msg);
            // best effort: the attribute is a convenience, the message says it too
            let _ = err.value(py).setattr("run_stopped", run_stopped);
            err
        }),
        E::UnknownBuffer | E::State(_) => StateError::new_err(msg),
        E::RunOver(_) => RunOver::new_err(msg),
        E::Setup(_) => SetupError::new_err(msg),
        E::Timeout(_) => Timeout::new_err(msg),
        E::Io(_) => IoError::new_err(msg),
    }
}

pub(crate) fn state_error(msg: impl Into<String>) -> PyErr {
    StateError::new_err(msg.into())
}

/// Locks a handle's mutex; a panic while it was held (a bug) does not make it unusable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A configuration from a path (`str` or `os.PathLike`) or from TOML text (a `str` with a
/// line break). Relative paths in a file are relative to the file's directory.
pub(crate) fn load_config(config: &Bound<'_, PyAny>) -> PyResult<evb_plugin::Config> {
    if let Ok(text) = config.extract::<String>() {
        if text.contains('\n') {
            return evb_plugin::Config::from_toml(&text)
                .map_err(|e| ConfigError::new_err(e.to_string()));
        }
    }
    let os = config.py().import("os")?;
    let path: std::path::PathBuf = os.call_method1("fspath", (config,))?.extract()?;
    evb_plugin::Config::from_file(&path).map_err(|e| ConfigError::new_err(e.to_string()))
}

/// Waits until a node just started (`node`, a producer or consumer) is connected to its
/// EVM, as `connected` says, with the GIL released in slices and Ctrl-C honoured between
/// them: a constructor fails at once, naming the address, when the EVM cannot be reached
/// (not later, on an unrelated call, once `run.connect_timeout_s` is over).
pub(crate) fn wait_connected<T: Send>(
    py: Python<'_>,
    mut node: T,
    connected: fn(&mut T) -> Result<bool, evb_plugin::Error>,
) -> PyResult<T> {
    loop {
        let (back, r) = py.detach(move || {
            let until = std::time::Instant::now() + std::time::Duration::from_millis(100);
            loop {
                match connected(&mut node) {
                    Ok(false) if std::time::Instant::now() < until => {
                        std::thread::sleep(std::time::Duration::from_millis(5))
                    }
                    r => return (node, r),
                }
            }
        });
        node = back;
        if r.map_err(to_py)? {
            return Ok(node);
        }
        py.check_signals()?;
    }
}

/// A node's status line as JSON (`null` before its first).
pub(crate) fn status_json(s: Option<evb_builder::NodeStatus>) -> PyResult<serde_json::Value> {
    serde_json::to_value(s).map_err(|e| PyException::new_err(e.to_string()))
}

/// A JSON value as the Python value `json.loads` makes of it.
pub(crate) fn to_python(py: Python<'_>, v: &serde_json::Value) -> PyResult<Py<PyAny>> {
    let json = py.import("json")?;
    Ok(json.call_method1("loads", (v.to_string(),))?.unbind())
}

/// How a node's run ended: `ok`, `reason`, and its final `report` (a dict, the JSON the
/// node prints).
#[pyclass(name = "Outcome", module = "evb", frozen, get_all)]
pub struct Outcome {
    ok: bool,
    reason: String,
    report: Py<PyAny>,
}

#[pymethods]
impl Outcome {
    fn __repr__(&self) -> String {
        format!("Outcome(ok={}, reason={:?})", self.ok, self.reason)
    }
}

pub(crate) fn outcome(py: Python<'_>, o: evb_plugin::NodeOutcome) -> PyResult<Outcome> {
    Ok(Outcome {
        ok: o.ok,
        reason: o.reason,
        report: to_python(
            py,
            &serde_json::to_value(&o.report).map_err(|e| PyException::new_err(e.to_string()))?,
        )?,
    })
}

/// CRC32C (Castagnoli) of a buffer-protocol object's bytes: what the fragment headers'
/// `payload_crc` is.
#[pyfunction]
#[pyo3(name = "crc32c")]
fn crc32c_of(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<u32> {
    producer::with_bytes(py, data, |bytes| Ok(py.detach(|| ::crc32c::crc32c(bytes))))
}

/// A window fragment (a fragment flagged WINDOW in a run built by time, docs/protocol.md
/// §10.2) read and checked: a dict of its window (`begin`, `end`, `core_end`), `status`
/// ("complete", "late", "missing", "empty") and `frames`, each a tuple `(begin, end,
/// source_id, flags, offset, length)` whose payload is `data[offset:offset + length]` (slice
/// a memoryview of `data` for no copy). Raises ValueError, saying why, for damaged input.
#[pyfunction]
fn decode_window(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    use evb_wire::window::WindowStatus;
    producer::with_bytes(py, data, |bytes| {
        let w = evb_wire::window::decode_window(bytes)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        let h = w.header;
        let frames = pyo3::types::PyList::empty(py);
        for (f, payload) in &w.frames {
            let offset = payload.as_ptr() as usize - bytes.as_ptr() as usize;
            frames.append((f.begin, f.end, f.source_id, f.flags, offset, payload.len()))?;
        }
        let d = pyo3::types::PyDict::new(py);
        d.set_item("begin", h.begin)?;
        d.set_item("end", h.end)?;
        d.set_item("core_end", h.core_end)?;
        let status = match h.status {
            WindowStatus::Complete => "complete",
            WindowStatus::Late => "late",
            WindowStatus::Missing => "missing",
            WindowStatus::Empty => "empty",
        };
        d.set_item("status", status)?;
        d.set_item("frames", frames)?;
        Ok(d.into_any().unbind())
    })
}

/// evb's plug-in API from Python: a `Producer` feeds an RU (`source.kind = "api"`), a
/// `Consumer` takes a BU's built events (`sink = "api"`), the node running on a thread of
/// this process and the EVM and other nodes as `evb node` processes; `Publisher` and
/// `Subscriber` publish and subscribe by tag. Payloads go through the buffer protocol
/// (memoryview, numpy), zero copy. Every error is an `evb.Error`. Documentation:
/// docs/plugin.md ("Python") and docs/messaging.md in the evb repository; types: the
/// module's stubs (evb.pyi, PEP 561).
#[pymodule]
#[pyo3(name = "evb")]
fn evb_python(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(decode_window, m)?)?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("Full", py.get_type::<Full>())?;
    m.add("SizeError", py.get_type::<SizeError>())?;
    m.add("Refused", py.get_type::<Refused>())?;
    m.add("RunOver", py.get_type::<RunOver>())?;
    m.add("SetupError", py.get_type::<SetupError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("StateError", py.get_type::<StateError>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("IoError", py.get_type::<IoError>())?;
    m.add("FormatError", py.get_type::<FormatError>())?;
    m.add_class::<files::PyEventFile>()?;
    m.add_class::<files::PyEventIter>()?;
    m.add_class::<files::PyFileEvent>()?;
    m.add_class::<files::PyFileFragment>()?;
    m.add_function(wrap_pyfunction!(files::judge_run, m)?)?;
    m.add_class::<producer::PyProducer>()?;
    m.add_class::<producer::PyBuf>()?;
    m.add_class::<consumer::PyConsumer>()?;
    m.add_class::<consumer::PyEvent>()?;
    m.add_class::<consumer::PyFragment>()?;
    m.add_class::<consumer::PyChunk>()?;
    m.add_class::<Outcome>()?;
    m.add_class::<trigger::PyTrigger>()?;
    m.add_class::<pubsub::PyPublisher>()?;
    m.add_class::<pubsub::PySubscriber>()?;
    m.add_class::<pubsub::PyMessage>()?;
    m.add_class::<pubsub::PyGap>()?;
    m.add_class::<pubsub::PyGoodbye>()?;
    m.add_class::<pubsub::PyClosed>()?;
    m.add_function(wrap_pyfunction!(crc32c_of, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

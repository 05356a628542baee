//! Reading evb's output from Python: built-event files (docs/formats.md §3) as events whose
//! fragments are buffers in place in the memory-mapped file (numpy arrays without a copy),
//! and a run's completeness judged from its folder by the run manifest (§7).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::path::PathBuf;
use std::sync::Arc;

use evb_formats::events::{event_layout_at, parse_file_header, unpacked, EventLayout};
use evb_formats::manifest::{judge, RunManifest};
use pyo3::exceptions::{PyBufferError, PyIndexError, PyKeyError, PyOSError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::FormatError;

/// The file's bytes: mapped, or read into memory.
enum Bytes {
    Mapped(memmap2::Mmap),
    Read(Box<[u8]>),
}

impl Bytes {
    fn get(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Read(b) => b,
        }
    }
}

/// A built-event file (`.evb`, docs/formats.md §3), every checksum checked when it is
/// opened. With `mmap=True` (the default) the file is mapped into memory and fragments are
/// buffers in place in it (`numpy.frombuffer(fragment, dtype=numpy.uint8)` copies nothing);
/// a file truncated by someone else while it is mapped ends the process with SIGBUS, as
/// for any mapped reader (evb itself never changes a published file). With `mmap=False`
/// it is read into memory once.
#[pyclass(name = "EventFile", module = "evb", frozen)]
pub struct PyEventFile {
    bytes: Arc<Bytes>,
    events: Arc<Vec<EventLayout>>,
    by_id: HashMap<u64, usize>,
    #[pyo3(get)]
    path: String,
    /// The run id in its header.
    #[pyo3(get)]
    run: String,
    #[pyo3(get)]
    bu: u16,
    #[pyo3(get)]
    sequence: u32,
}

#[pymethods]
impl PyEventFile {
    #[new]
    #[pyo3(signature = (path, mmap = true))]
    fn new(py: Python<'_>, path: PathBuf, mmap: bool) -> PyResult<PyEventFile> {
        let shown = path.display().to_string();
        py.detach(|| -> PyResult<PyEventFile> {
            let os = |e: std::io::Error| PyOSError::new_err(format!("{shown}: {e}"));
            let bytes = if mmap {
                let f = std::fs::File::open(&path).map_err(os)?;
                // SAFETY: the map is only read. evb writes a data file under a temporary
                // name and never changes it once published; a file changed by someone else
                // meanwhile shows through (or ends the process with SIGBUS if truncated),
                // which the class documents.
                Bytes::Mapped(unsafe { memmap2::Mmap::map(&f) }.map_err(os)?)
            } else {
                Bytes::Read(std::fs::read(&path).map_err(os)?.into_boxed_slice())
            };
            let h = parse_file_header(bytes.get(), &shown)
                .map_err(|e| FormatError::new_err(e.to_string()))?;
            // a compressed file is read as its unpacked image (its payloads then in memory)
            let bytes = match unpacked(bytes.get(), &h, &shown)
                .map_err(|e| FormatError::new_err(e.to_string()))?
            {
                Some(image) => Bytes::Read(image.into_boxed_slice()),
                None => bytes,
            };
            let data = bytes.get();
            let (mut events, mut at) = (Vec::new(), h.len);
            while at < data.len() {
                let (l, next) = event_layout_at(data, at)
                    .map_err(|e| FormatError::new_err(format!("{shown} at byte {at}: {e}")))?;
                events.push(l);
                at = next;
            }
            let by_id = events
                .iter()
                .enumerate()
                .map(|(i, e)| (e.event_id, i))
                .collect();
            Ok(PyEventFile {
                bytes: Arc::new(bytes),
                events: Arc::new(events),
                by_id,
                path: shown.clone(),
                run: h.run,
                bu: h.bu,
                sequence: h.sequence,
            })
        })
    }

    /// Events in the file.
    fn __len__(&self) -> usize {
        self.events.len()
    }

    /// The `index`-th event in file order (negative from the end).
    fn __getitem__(&self, index: isize) -> PyResult<PyFileEvent> {
        let n = self.events.len() as isize;
        let i = if index < 0 { index + n } else { index };
        if !(0..n).contains(&i) {
            return Err(PyIndexError::new_err("event index out of range"));
        }
        Ok(self.at(i as usize))
    }

    fn __iter__(slf: Bound<'_, Self>) -> PyEventIter {
        PyEventIter {
            file: slf.unbind(),
            next: 0,
        }
    }

    /// The event with event id `event_id` (KeyError if the file has none).
    fn event(&self, event_id: u64) -> PyResult<PyFileEvent> {
        match self.by_id.get(&event_id) {
            Some(&i) => Ok(self.at(i)),
            None => Err(PyKeyError::new_err(event_id)),
        }
    }

    /// The event ids in file order.
    fn event_ids(&self) -> Vec<u64> {
        self.events.iter().map(|e| e.event_id).collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "evb.EventFile({:?}, run={:?}, bu={}, sequence={}, events={})",
            self.path,
            self.run,
            self.bu,
            self.sequence,
            self.events.len()
        )
    }
}

impl PyEventFile {
    fn at(&self, i: usize) -> PyFileEvent {
        let e = &self.events[i];
        PyFileEvent {
            bytes: self.bytes.clone(),
            events: self.events.clone(),
            index: i,
            event_id: e.event_id,
            trigger_number: e.trigger_number,
            flags: e.flags,
        }
    }
}

/// Iterates an `EventFile`'s events in file order.
#[pyclass(name = "EventFileIterator", module = "evb")]
pub struct PyEventIter {
    file: Py<PyEventFile>,
    next: usize,
}

#[pymethods]
impl PyEventIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> Option<PyFileEvent> {
        let f = self.file.bind(py).get();
        (self.next < f.events.len()).then(|| {
            self.next += 1;
            f.at(self.next - 1)
        })
    }
}

/// One event of an `EventFile`: its header's fields and its fragments.
#[pyclass(name = "FileEvent", module = "evb", frozen)]
pub struct PyFileEvent {
    bytes: Arc<Bytes>,
    events: Arc<Vec<EventLayout>>,
    index: usize,
    #[pyo3(get)]
    event_id: u64,
    #[pyo3(get)]
    trigger_number: u32,
    /// Event flags: 1 partial (a source MISSING), 2 trigger-number mismatch, 4 corrupt.
    #[pyo3(get)]
    flags: u16,
}

#[pymethods]
impl PyFileEvent {
    /// A source is missing (flag 1): the event was built partial.
    #[getter]
    fn partial(&self) -> bool {
        self.flags & evb_formats::events::EVENT_PARTIAL != 0
    }

    /// Its fragments in RU order.
    #[getter]
    fn fragments(&self) -> Vec<PyFileFragment> {
        (0..self.events[self.index].fragments.len())
            .map(|k| self.fragment_at(k))
            .collect()
    }

    /// The fragment from source `source_id` (KeyError if none).
    fn fragment(&self, source_id: u16) -> PyResult<PyFileFragment> {
        self.events[self.index]
            .fragments
            .iter()
            .position(|(h, _)| h.source_id == source_id)
            .map(|k| self.fragment_at(k))
            .ok_or_else(|| PyKeyError::new_err(source_id))
    }

    /// Number of fragments.
    fn __len__(&self) -> usize {
        self.events[self.index].fragments.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "evb.FileEvent(event_id={}, trigger_number={}, flags={}, fragments={})",
            self.event_id,
            self.trigger_number,
            self.flags,
            self.__len__()
        )
    }
}

impl PyFileEvent {
    fn fragment_at(&self, k: usize) -> PyFileFragment {
        let (h, r) = &self.events[self.index].fragments[k];
        PyFileFragment {
            bytes: self.bytes.clone(),
            start: r.start,
            len: r.len(),
            source_id: h.source_id,
            trigger_number: h.trigger_number,
            flags: h.flags,
            payload_crc: h.payload_crc,
        }
    }
}

/// One fragment of a `FileEvent`: its header's fields and its payload through the
/// read-only buffer protocol, in place in the file's bytes.
#[pyclass(name = "FileFragment", module = "evb", frozen)]
pub struct PyFileFragment {
    bytes: Arc<Bytes>,
    start: usize,
    len: usize,
    #[pyo3(get)]
    source_id: u16,
    #[pyo3(get)]
    trigger_number: u32,
    /// Fragment header flags (MISSING = 1, GENERATED = 2, SUPER = 4, SYNC_LOSS = 8).
    #[pyo3(get)]
    flags: u16,
    /// CRC32C of the payload (checked when the file was opened).
    #[pyo3(get)]
    payload_crc: u32,
}

#[pymethods]
impl PyFileFragment {
    /// A placeholder for a source that sent nothing (flag MISSING): no payload.
    #[getter]
    fn missing(&self) -> bool {
        self.flags & evb_wire::FLAG_MISSING != 0
    }

    /// Payload length in bytes.
    fn __len__(&self) -> usize {
        self.len
    }

    /// The payload copied into `bytes`.
    fn tobytes<'py>(&self, py: Python<'py>) -> Bound<'py, pyo3::types::PyBytes> {
        pyo3::types::PyBytes::new(py, &self.bytes.get()[self.start..self.start + self.len])
    }

    fn __repr__(&self) -> String {
        format!(
            "evb.FileFragment(source_id={}, trigger_number={}, len={}, payload_crc={:#010x})",
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
        let bytes = &me.bytes.get()[me.start..me.start + me.len];
        // SAFETY: `view` is ours to fill. The bytes are the file's, held by `me.bytes` (an
        // Arc the fragment keeps), and the view holds a reference to the fragment
        // (FillInfo sets `view.obj`), so they outlive the view. Read-only: a writable
        // request fails.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                bytes.as_ptr() as *mut c_void,
                bytes.len() as ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::take(slf.py())
                .unwrap_or_else(|| PyBufferError::new_err("cannot export the payload")));
        }
        Ok(())
    }
}

/// Judges whether a run's output is complete from its run manifest (docs/formats.md §7,
/// steps 1 and 3 of `evb inspect --run`'s judgement; not the metadata nor the folder's
/// unlisted files): a dict with `run`, `verdict`, `complete`, `triggered`, `released`,
/// `events`, `missing` and `twice` (lists of `(first, last)` id runs), `bad_files` and
/// `temporaries`. `run` names the run when the folder holds several manifests.
#[pyfunction]
#[pyo3(signature = (folder, run = None))]
pub fn judge_run<'py>(
    py: Python<'py>,
    folder: PathBuf,
    run: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let name = match run {
        Some(r) => evb_formats::manifest::manifest_name(&r),
        None => {
            let found: Vec<String> = std::fs::read_dir(&folder)
                .map_err(|e| PyOSError::new_err(format!("{}: {e}", folder.display())))?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".manifest.json") && !n.starts_with('.'))
                .collect();
            match found.as_slice() {
                [one] => one.clone(),
                _ => {
                    return Err(FormatError::new_err(format!(
                        "{}: {} run manifests ({found:?}): name the run",
                        folder.display(),
                        found.len()
                    )))
                }
            }
        }
    };
    let path = folder.join(&name);
    let m: RunManifest = std::fs::read(&path)
        .map_err(|e| PyOSError::new_err(format!("{}: {e}", path.display())))
        .and_then(|b| {
            serde_json::from_slice(&b)
                .map_err(|e| FormatError::new_err(format!("{}: {e}", path.display())))
        })?;
    let j = py.detach(|| judge(&folder, &m));
    let d = PyDict::new(py);
    d.set_item("run", &m.run)?;
    d.set_item("verdict", &m.verdict)?;
    d.set_item("complete", j.complete)?;
    d.set_item("triggered", m.triggered)?;
    d.set_item("released", m.released)?;
    d.set_item("events", j.events)?;
    d.set_item("missing", j.missing)?;
    d.set_item("twice", j.twice)?;
    d.set_item("bad_files", j.bad_files)?;
    d.set_item("temporaries", j.temporaries)?;
    Ok(d)
}

//! `evb.Publisher` and `evb.Subscriber`: publish/subscribe by tag (evb_plugin::pubsub) in
//! Python. Every call that waits releases the GIL, in slices of at most 100 ms between
//! which Ctrl-C is honoured.
//!
//! One idea, one file: the two pub/sub classes of the Python module.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use evb_plugin::pubsub::{
    parse_delivery, parse_tags, PubOptions, PubSocket, PublisherStats, Received, SubOptions,
    SubSocket, SubscriberStats, TagRange,
};
use evb_plugin::Error as PlugError;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::producer::with_bytes;
use crate::{lock, state_error, to_py, SetupError, Timeout};

/// The longest one wait holds the GIL released before checking for Ctrl-C.
const SLICE: Duration = Duration::from_millis(100);

fn seconds(what: &str, t: Option<f64>) -> PyResult<Option<Duration>> {
    match t {
        None => Ok(None),
        Some(s) if s >= 0.0 && s.is_finite() && s <= 86_400.0 * 365.0 => {
            Ok(Some(Duration::from_secs_f64(s)))
        }
        Some(s) => Err(PyValueError::new_err(format!(
            "{what} {s}: a finite number of seconds >= 0 (or None)"
        ))),
    }
}

fn secret_of(s: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<u8>>> {
    let Some(s) = s else { return Ok(None) };
    if s.is_none() {
        return Ok(None);
    }
    if let Ok(t) = s.extract::<String>() {
        return Ok(Some(t.into_bytes()));
    }
    s.extract::<Vec<u8>>()
        .map(Some)
        .map_err(|_| PyTypeError::new_err("secret: str or bytes"))
}

fn setup(e: PlugError) -> PyErr {
    to_py(e)
}

/// Tags as text ("0,5,10-19"), one int, or an iterable of ints and (first, last) pairs.
fn tags_of(obj: &Bound<'_, PyAny>) -> PyResult<Vec<TagRange>> {
    if let Ok(s) = obj.extract::<String>() {
        return parse_tags(&s).map_err(setup);
    }
    if let Ok(t) = obj.extract::<u64>() {
        return Ok(vec![TagRange::one(t)]);
    }
    let mut out = Vec::new();
    let it = obj.try_iter().map_err(|_| {
        PyTypeError::new_err(
            "tags: a str such as \"0,5,10-19\", an int, or an iterable of ints and (first, last) pairs",
        )
    })?;
    for item in it {
        let item = item?;
        if let Ok(t) = item.extract::<u64>() {
            out.push(TagRange::one(t));
        } else if let Ok((first, last)) = item.extract::<(u64, u64)>() {
            if first > last {
                return Err(SetupError::new_err(format!(
                    "tags: range ({first}, {last}) is empty"
                )));
            }
            out.push(TagRange { first, last });
        } else {
            return Err(PyTypeError::new_err(format!(
                "tags: {} is neither a tag (int 0..2^64) nor a (first, last) pair",
                item.repr()?
            )));
        }
    }
    if out.is_empty() {
        return Err(SetupError::new_err("tags: no tags"));
    }
    Ok(out)
}

fn pub_stats<'py>(
    py: Python<'py>,
    s: &PublisherStats,
    subscribers: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("published", s.published)?;
    d.set_item("delivered", s.delivered)?;
    d.set_item("dropped", s.dropped)?;
    d.set_item("gaps_sent", s.gaps_sent)?;
    d.set_item("would_block", s.would_block)?;
    d.set_item("disconnected_slow", s.disconnected_slow)?;
    d.set_item("disconnected_bad", s.disconnected_bad)?;
    d.set_item("send_failures", s.send_failures)?;
    d.set_item("subscribers_joined", s.subscribers_joined)?;
    d.set_item("subscribers_left", s.subscribers_left)?;
    d.set_item("subscribers", subscribers)?;
    Ok(d)
}

fn sub_stats<'py>(py: Python<'py>, s: &SubscriberStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("received", s.received)?;
    d.set_item("payload_bytes", s.payload_bytes)?;
    d.set_item("missed", s.missed)?;
    d.set_item("gaps", s.gaps)?;
    d.set_item("goodbyes", s.goodbyes)?;
    d.set_item("protocol_errors", s.protocol_errors)?;
    Ok(d)
}

const PUB_CLOSED: &str = "the publisher is closed";
const SUB_CLOSED: &str = "the subscriber is closed";

/// A publishing socket: `Publisher("127.0.0.1:0", transport="tcp", policy="block", ...)`
/// listens (tcp: "HOST:PORT", port 0 for any; shm: a name, "NAME:0" for any); `address`
/// is what subscribers connect to. `publish(tag, data)` sends to every subscriber of the
/// tag. Options: `run_id` (the handshake's; subscribers must agree), `policy` (block,
/// drop, disconnect: what to do with a subscriber that has `max_queued` bytes waiting),
/// `send_threads` (threads writing subscribers' sockets beside the publishing one over
/// tcp, 0..=16), `max_message` (largest payload), `block_timeout` (seconds `publish` waits under policy
/// block, None: no limit), `linger` (seconds `close` lets subscribers drain), `secret`
/// (str or bytes; else `EVB_SECRET`).
#[pyclass(name = "Publisher", module = "evb", frozen)]
pub struct PyPublisher {
    inner: Mutex<Option<PubSocket>>,
    /// The address bound.
    #[pyo3(get)]
    address: String,
    block_timeout: Option<Duration>,
}

impl PyPublisher {
    /// Runs `f` on the socket with the GIL released.
    fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut PubSocket) -> Result<R, PlugError> + Send,
    ) -> PyResult<R> {
        py.detach(|| match lock(&self.inner).as_mut() {
            Some(s) => f(s).map_err(Some),
            None => Err(None),
        })
        .map_err(|e| e.map_or_else(|| state_error(PUB_CLOSED), to_py))
    }
}

#[pymethods]
impl PyPublisher {
    #[new]
    #[pyo3(signature = (address = "127.0.0.1:0", *, transport = "tcp", run_id = "pubsub", policy = "block", max_queued = 4 << 20, send_threads = 0, max_message = 1 << 20, block_timeout = None, linger = 5.0, secret = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        address: &str,
        transport: &str,
        run_id: &str,
        policy: &str,
        max_queued: usize,
        send_threads: usize,
        max_message: usize,
        block_timeout: Option<f64>,
        linger: f64,
        secret: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let block_timeout = seconds("block_timeout", block_timeout)?;
        let opts = PubOptions {
            transport: transport.parse().map_err(setup)?,
            run_id: run_id.to_string(),
            policy: policy.parse().map_err(|e| setup(PlugError::Setup(e)))?,
            max_queued,
            send_threads,
            max_message,
            // waits in slices (Ctrl-C between them); the caller's limit is kept here
            block_timeout: Some(SLICE),
            linger: seconds("linger", Some(linger))?.unwrap_or_default(),
            secret: secret_of(secret)?,
        };
        let s = py
            .detach(|| PubSocket::bind(address, opts))
            .map_err(to_py)?;
        Ok(PyPublisher {
            address: s.local_addr().to_string(),
            inner: Mutex::new(Some(s)),
            block_timeout,
        })
    }

    /// Publishes `data` (bytes or any buffer) under `tag` to every subscriber of `tag`;
    /// returns `(delivered, dropped)`: the subscribers it went to, and those whose copy was
    /// dropped (policy drop; they are told by a gap) or who were cut off (policy
    /// disconnect). Under policy block it waits while a subscriber of the tag is slow, at
    /// most `block_timeout` (then `evb.Timeout`, nothing sent). `evb.SizeError`: more than
    /// `max_message`.
    fn publish(
        &self,
        py: Python<'_>,
        tag: u64,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<(usize, usize)> {
        let deadline = self
            .block_timeout
            .and_then(|t| Instant::now().checked_add(t));
        with_bytes(py, data, |bytes| loop {
            match self.with(py, |s| match s.publish(tag, bytes) {
                Ok(sent) => Ok(Some(sent)),
                Err(PlugError::Timeout(_)) => Ok(None),
                Err(e) => Err(e),
            })? {
                Some(sent) => return Ok((sent.delivered, sent.dropped)),
                None => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(Timeout::new_err(format!(
                            "a subscriber of tag {tag} is slow (policy block): nothing sent within block_timeout {} s",
                            self.block_timeout.unwrap_or_default().as_secs_f64()
                        )));
                    }
                    py.check_signals()?;
                }
            }
        })
    }

    /// Waits until `n` subscribers have subscribed to something (polling); returns how
    /// many have. `evb.Timeout` after `timeout` seconds (None: no limit).
    #[pyo3(signature = (n = 1, timeout = None))]
    fn wait_subscribers(&self, py: Python<'_>, n: usize, timeout: Option<f64>) -> PyResult<usize> {
        let limit = seconds("timeout", timeout)?;
        let deadline = limit.and_then(|t| Instant::now().checked_add(t));
        loop {
            let slice = deadline.map_or(SLICE, |d| {
                d.saturating_duration_since(Instant::now()).min(SLICE)
            });
            match self.with(py, |s| match s.wait_subscribers(n, Some(slice)) {
                Ok(k) => Ok(Some(k)),
                Err(PlugError::Timeout(_)) => Ok(None),
                Err(e) => Err(e),
            })? {
                Some(k) => return Ok(k),
                None => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        let have = self.with(py, |s| Ok(s.subscribed()))?;
                        return Err(Timeout::new_err(format!(
                            "{have} of {n} subscribers subscribed within {} s",
                            limit.unwrap_or_default().as_secs_f64()
                        )));
                    }
                    py.check_signals()?;
                }
            }
        }
    }

    /// Makes progress (new subscribers and subscriptions, queued messages out), waiting
    /// at most `timeout` seconds for something to happen. A publisher with nothing to send
    /// calls it now and then.
    #[pyo3(signature = (timeout = 0.0))]
    fn poll(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let t = seconds("timeout", Some(timeout))?
            .unwrap_or_default()
            .min(SLICE);
        self.with(py, |s| s.poll(t))
    }

    /// Sends every batched page now (messages to throughput subscribers wait in a page until
    /// the next publish, poll or flush).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, PubSocket::flush)
    }

    /// Waits until every subscriber has taken what is queued for it, at most `timeout`
    /// seconds; returns whether everything went.
    #[pyo3(signature = (timeout = 10.0))]
    fn drain(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let deadline = Instant::now() + seconds("timeout", Some(timeout))?.unwrap_or_default();
        loop {
            let slice = deadline
                .saturating_duration_since(Instant::now())
                .min(SLICE);
            if self.with(py, |s| s.drain(slice))? {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            py.check_signals()?;
        }
    }

    /// Subscribers connected now.
    #[getter]
    fn subscribers(&self) -> PyResult<usize> {
        lock(&self.inner)
            .as_ref()
            .map(PubSocket::subscribers)
            .ok_or_else(|| state_error(PUB_CLOSED))
    }

    /// Subscribers that subscribe to at least one tag.
    #[getter]
    fn subscribed(&self) -> PyResult<usize> {
        lock(&self.inner)
            .as_ref()
            .map(PubSocket::subscribed)
            .ok_or_else(|| state_error(PUB_CLOSED))
    }

    /// Subscribers of `tag`.
    fn subscribers_of(&self, tag: u64) -> PyResult<usize> {
        lock(&self.inner)
            .as_ref()
            .map(|s| s.subscribers_of(tag))
            .ok_or_else(|| state_error(PUB_CLOSED))
    }

    /// The counters (a dict): published, delivered, dropped, gaps_sent, would_block,
    /// disconnected_slow, ..., subscribers.
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (s, n) = lock(&self.inner)
            .as_ref()
            .map(|s| (s.stats(), s.subscribers()))
            .ok_or_else(|| state_error(PUB_CLOSED))?;
        pub_stats(py, &s, n)
    }

    /// Lets subscribers take what is queued for them (at most `linger` seconds), tells each
    /// Goodbye with `reason` and closes; returns the final counters. Later calls raise
    /// `evb.StateError`; a second `close` returns None.
    #[pyo3(signature = (reason = "closed"))]
    fn close<'py>(&self, py: Python<'py>, reason: &str) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(mut s) = lock(&self.inner).take() else {
            return Ok(None);
        };
        let stats = py.detach(|| s.close(reason)).map_err(to_py)?;
        Ok(Some(pub_stats(py, &stats, 0)?))
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: &Bound<'_, PyAny>,
        _v: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.close(py, "closed")?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("evb.Publisher({:?})", self.address)
    }
}

/// A message: from publisher `publisher` (its index in the addresses given), its `tag`,
/// the publisher's sequence number `seq` for that tag (0, 1, ...), and `payload` (bytes).
#[pyclass(name = "Message", module = "evb", frozen, get_all)]
pub struct PyMessage {
    publisher: usize,
    tag: u64,
    seq: u64,
    payload: Py<PyBytes>,
}

#[pymethods]
impl PyMessage {
    fn __len__(&self, py: Python<'_>) -> usize {
        self.payload.bind(py).as_bytes().len()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "evb.Message(publisher={}, tag={}, seq={}, len={})",
            self.publisher,
            self.tag,
            self.seq,
            self.__len__(py)
        )
    }
}

/// `missed` messages of `tag` were dropped for this subscriber by publisher `publisher`
/// (its policy drop): the next message of that tag has `seq` = last + 1 + missed.
#[pyclass(name = "Gap", module = "evb", frozen, get_all)]
pub struct PyGap {
    publisher: usize,
    tag: u64,
    missed: u64,
}

#[pymethods]
impl PyGap {
    fn __repr__(&self) -> String {
        format!(
            "evb.Gap(publisher={}, tag={}, missed={})",
            self.publisher, self.tag, self.missed
        )
    }
}

/// Publisher `publisher` cut this subscriber off: `code` (1 slow subscriber, 2 bad request,
/// 3 shutdown, 4 send failed) and `reason`. A `Closed` follows.
#[pyclass(name = "Goodbye", module = "evb", frozen, get_all)]
pub struct PyGoodbye {
    publisher: usize,
    code: u16,
    reason: String,
}

#[pymethods]
impl PyGoodbye {
    fn __repr__(&self) -> String {
        format!(
            "evb.Goodbye(publisher={}, code={}, reason={:?})",
            self.publisher, self.code, self.reason
        )
    }
}

/// The connection to publisher `publisher` is gone (or could not be made): `reason`.
#[pyclass(name = "Closed", module = "evb", frozen, get_all)]
pub struct PyClosed {
    publisher: usize,
    reason: String,
}

#[pymethods]
impl PyClosed {
    fn __repr__(&self) -> String {
        format!(
            "evb.Closed(publisher={}, reason={:?})",
            self.publisher, self.reason
        )
    }
}

/// A subscribing socket: `Subscriber(addresses, tags, transport="tcp", delivery="throughput",
/// ...)` connects to each publisher (`addresses`: a str, comma-separated, or a list) and
/// subscribes to `tags` there ("0,5,10-19", an int, or an iterable of ints and (first,
/// last) pairs). `recv(timeout)` gives a `Message`, `Gap`, `Goodbye` or `Closed`; iterate it
/// to take everything until every publisher has closed. Options: `run_id`, `delivery`
/// (latency: each message at once; throughput: packed into pages), `max_message`,
/// `secret` (str or bytes; else `EVB_SECRET`).
#[pyclass(name = "Subscriber", module = "evb", frozen)]
pub struct PySubscriber {
    inner: Mutex<Option<SubSocket>>,
}

impl PySubscriber {
    fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut SubSocket) -> Result<R, PlugError> + Send,
    ) -> PyResult<R> {
        py.detach(|| match lock(&self.inner).as_mut() {
            Some(s) => f(s).map_err(Some),
            None => Err(None),
        })
        .map_err(|e| e.map_or_else(|| state_error(SUB_CLOSED), to_py))
    }
}

fn to_object(py: Python<'_>, r: Received) -> PyResult<Py<PyAny>> {
    Ok(match r {
        Received::Message {
            publisher,
            tag,
            seq,
            payload,
        } => {
            let bytes = PyBytes::new_with(py, payload.len(), |buf| {
                let mut at = 0;
                for c in payload.chunks() {
                    buf[at..at + c.len()].copy_from_slice(c);
                    at += c.len();
                }
                Ok(())
            })?;
            Py::new(
                py,
                PyMessage {
                    publisher,
                    tag,
                    seq,
                    payload: bytes.unbind(),
                },
            )?
            .into_any()
        }
        Received::Gap {
            publisher,
            tag,
            missed,
        } => Py::new(
            py,
            PyGap {
                publisher,
                tag,
                missed,
            },
        )?
        .into_any(),
        Received::Goodbye {
            publisher,
            code,
            reason,
        } => Py::new(
            py,
            PyGoodbye {
                publisher,
                code: code as u16,
                reason,
            },
        )?
        .into_any(),
        Received::Closed { publisher, reason } => {
            Py::new(py, PyClosed { publisher, reason })?.into_any()
        }
    })
}

#[pymethods]
impl PySubscriber {
    #[new]
    #[pyo3(signature = (addresses, tags, *, transport = "tcp", run_id = "pubsub", delivery = "throughput", max_message = 1 << 20, secret = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        addresses: &Bound<'_, PyAny>,
        tags: &Bound<'_, PyAny>,
        transport: &str,
        run_id: &str,
        delivery: &str,
        max_message: usize,
        secret: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let addrs: Vec<String> = if let Ok(s) = addresses.extract::<String>() {
            s.split(',')
                .map(|a| a.trim().to_string())
                .filter(|a| !a.is_empty())
                .collect()
        } else {
            addresses.extract().map_err(|_| {
                PyTypeError::new_err("addresses: a str (comma-separated) or a list of str")
            })?
        };
        let tags = tags_of(tags)?;
        let opts = SubOptions {
            transport: transport.parse().map_err(setup)?,
            run_id: run_id.to_string(),
            delivery: parse_delivery(delivery).map_err(setup)?,
            max_message,
            secret: secret_of(secret)?,
        };
        let s = py
            .detach(|| {
                let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
                SubSocket::connect(&refs, &tags, opts)
            })
            .map_err(to_py)?;
        Ok(PySubscriber {
            inner: Mutex::new(Some(s)),
        })
    }

    /// The next `Message`, `Gap`, `Goodbye` or `Closed`; None once every publisher's
    /// connection is closed and everything was taken. With `timeout` (seconds) it raises
    /// `evb.Timeout` when nothing came in that time.
    #[pyo3(signature = (timeout = None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        let limit = seconds("timeout", timeout)?;
        let deadline = limit.and_then(|t| Instant::now().checked_add(t));
        loop {
            let slice = deadline.map_or(SLICE, |d| {
                d.saturating_duration_since(Instant::now()).min(SLICE)
            });
            let (got, open) = self.with(py, |s| {
                let r = s.recv(Some(slice))?;
                Ok((r, s.open_publishers()))
            })?;
            match got {
                Some(r) => return to_object(py, r).map(Some),
                None if open == 0 => return Ok(None),
                None => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(Timeout::new_err(format!(
                            "nothing received within {} s",
                            limit.unwrap_or_default().as_secs_f64()
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

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.recv(py, None)
    }

    /// Subscribes to more tags at every publisher still connected.
    fn subscribe(&self, py: Python<'_>, tags: &Bound<'_, PyAny>) -> PyResult<()> {
        let t = tags_of(tags)?;
        self.with(py, |s| s.subscribe(&t))
    }

    /// Unsubscribes from tags at every publisher still connected (messages a publisher sent
    /// before it read this still arrive).
    fn unsubscribe(&self, py: Python<'_>, tags: &Bound<'_, PyAny>) -> PyResult<()> {
        let t = tags_of(tags)?;
        self.with(py, |s| s.unsubscribe(&t))
    }

    /// Publishers still connected (or connecting).
    #[getter]
    fn open_publishers(&self) -> PyResult<usize> {
        lock(&self.inner)
            .as_ref()
            .map(SubSocket::open_publishers)
            .ok_or_else(|| state_error(SUB_CLOSED))
    }

    /// The counters (a dict): received, payload_bytes, missed, gaps, goodbyes.
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = lock(&self.inner)
            .as_ref()
            .map(SubSocket::stats)
            .ok_or_else(|| state_error(SUB_CLOSED))?;
        sub_stats(py, &s)
    }

    /// Closes the connections; later calls raise `evb.StateError` (a second close does
    /// nothing).
    fn close(&self, py: Python<'_>) {
        if let Some(mut s) = lock(&self.inner).take() {
            py.detach(|| s.close());
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: &Bound<'_, PyAny>,
        _v: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> bool {
        self.close(py);
        false
    }
}

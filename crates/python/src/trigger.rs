//! `evb.Trigger`: an outside trigger program's decisions (evb_plugin::Trigger), the EVM on
//! a thread of the Python process, the RUs and BUs `evb node` processes.

use std::sync::Mutex;

use evb_plugin::Trigger;
use pyo3::prelude::*;

use crate::{
    load_config, lock, outcome, state_error, status_json, to_py, to_python, wait_connected, Outcome,
};

/// An outside trigger program's handle on its EVM: `Trigger(config)`, `config` the
/// configuration file's path or its TOML text (`builder.by = "window"`, `windows.outside =
/// true`). Returns once the run's nodes are connected.
#[pyclass(name = "Trigger", module = "evb", frozen)]
pub struct PyTrigger {
    inner: Mutex<Option<Trigger>>,
}

const FINISHED: &str = "the trigger has finished";

#[pymethods]
impl PyTrigger {
    #[new]
    fn new(py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<Self> {
        let cfg = load_config(config)?;
        let t = py.detach(|| Trigger::start(&cfg)).map_err(to_py)?;
        let t = wait_connected(py, t, |t| t.connected())?;
        Ok(PyTrigger {
            inner: Mutex::new(Some(t)),
        })
    }

    /// Decides a record: window `[begin, end)` in ticks over the source ids in
    /// `components` (empty: every source); returns its record number. `evb.Refused` (the
    /// run goes on, nothing taken) for a window that does not end after it begins, is
    /// longer than `windows.longest_ticks`, or names a source no RU reads or one twice.
    #[pyo3(signature = (begin, end, components = Vec::new()))]
    fn decide(&self, py: Python<'_>, begin: u64, end: u64, components: Vec<u16>) -> PyResult<u64> {
        py.detach(|| match lock(&self.inner).as_mut() {
            Some(t) => t.decide(begin, end, &components).map_err(Some),
            None => Err(None),
        })
        .map_err(|e| e.map_or_else(|| state_error(FINISHED), to_py))
    }

    /// Decisions made so far.
    #[getter]
    fn decided(&self) -> PyResult<u64> {
        lock(&self.inner)
            .as_ref()
            .map(Trigger::decided)
            .ok_or_else(|| state_error(FINISHED))
    }

    /// The EVM's latest status (a dict: the JSON line `evb node` prints; None before the
    /// first).
    fn status(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let s = lock(&self.inner).as_ref().and_then(Trigger::status);
        to_python(py, &status_json(s)?)
    }

    /// Ends the run now: decisions not yet triggered are counted, not built.
    fn stop(&self) -> PyResult<()> {
        lock(&self.inner)
            .as_ref()
            .map(Trigger::stop)
            .ok_or_else(|| state_error(FINISHED))
    }

    /// Waits for the run's end (after `run.events` decisions, its duration, or `stop`) and
    /// returns the EVM's `evb.Outcome` (its report holds the run's).
    fn finish(&self, py: Python<'_>) -> PyResult<Outcome> {
        let t = lock(&self.inner)
            .take()
            .ok_or_else(|| state_error(FINISHED))?;
        let o = py.detach(|| t.finish()).map_err(to_py)?;
        outcome(py, o)
    }
}

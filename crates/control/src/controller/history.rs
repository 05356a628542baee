//! The run's rate history, kept by the controller (not by a browser): one sample per poll
//! of the node table, for every node and for the whole system, so that a page opened or
//! reloaded mid-run shows the run from its start (`GET /api/v1/history`, docs/control.md).
//!
//! Bounded: the samples of the last [`WINDOW_S`] seconds, and at most [`MAX_POINTS`] of
//! them (the table is polled once a second, four times a second while a node does not
//! answer). Each sample holds a time, two numbers for the totals and two per node (in a
//! vector of its own): about `48 + 16 × nodes` bytes, so 1200 samples of 5 nodes take about
//! 150 KiB, of 200 nodes about 3.7 MiB.

use std::collections::VecDeque;

/// Samples older than this (seconds before the newest) are dropped.
pub(crate) const WINDOW_S: f64 = 300.0;
/// At most this many samples are kept (a ring: the oldest go first).
pub(crate) const MAX_POINTS: usize = 1200;

/// One poll's rates: the events and bytes per second of the whole system (the BUs of the
/// run under way) and of every node, in the order of `History::nodes`.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    t: f64,
    total: (f64, f64),
    nodes: Vec<(f64, f64)>,
}

/// The rate history of one run: cleared when the next starts, kept between runs.
#[derive(Debug, Clone, Default)]
pub(crate) struct History {
    /// The run the samples are of (0: none yet).
    run: u64,
    started_unix: f64,
    nodes: Vec<String>,
    samples: VecDeque<Sample>,
}

impl History {
    /// Run `run` begins: the last run's samples go.
    pub(crate) fn begin(&mut self, run: u64, unix: f64) {
        self.run = run;
        self.started_unix = unix;
        self.samples.clear();
    }

    pub(crate) fn run(&self) -> u64 {
        self.run
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.samples.len()
    }

    /// One poll's rates at `t` (unix seconds): `(node, events/s, bytes/s)` for every node,
    /// and the system's totals.
    pub(crate) fn push(&mut self, t: f64, total: (f64, f64), nodes: Vec<(String, f64, f64)>) {
        let ids: Vec<&String> = nodes.iter().map(|(id, _, _)| id).collect();
        if ids.len() != self.nodes.len() || ids.iter().zip(&self.nodes).any(|(a, b)| *a != b) {
            // another set of nodes: the old samples would be read against the wrong names
            self.nodes = nodes.iter().map(|(id, _, _)| id.clone()).collect();
            self.samples.clear();
        }
        // a clock stepped back: the samples stay in time order
        if self.samples.back().is_some_and(|s| s.t > t) {
            self.samples.clear();
        }
        self.samples.push_back(Sample {
            t,
            total,
            nodes: nodes.into_iter().map(|(_, e, b)| (e, b)).collect(),
        });
        while self.samples.len() > MAX_POINTS
            || self.samples.front().is_some_and(|s| s.t < t - WINDOW_S)
        {
            self.samples.pop_front();
        }
    }

    /// The samples after `since` (unix seconds; `None`: all), as columns (docs/control.md).
    pub(crate) fn reply(&self, since: Option<f64>) -> crate::replies::History {
        use crate::replies::RateColumns;
        let taken: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| since.is_none_or(|t0| s.t > t0))
            .collect();
        let round = |x: f64| (x * 1000.0).round() / 1000.0;
        let column = |f: &dyn Fn(&Sample) -> (f64, f64)| RateColumns {
            rate_hz: taken.iter().map(|s| round(f(s).0)).collect(),
            bytes_per_s: taken.iter().map(|s| round(f(s).1)).collect(),
        };
        let nodes = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let of = |s: &Sample| s.nodes.get(i).copied().unwrap_or((0.0, 0.0));
                (id.clone(), column(&of))
            })
            .collect();
        crate::replies::History {
            run: self.run,
            started_unix: self.started_unix,
            window_s: WINDOW_S,
            max_points: MAX_POINTS,
            t: taken.iter().map(|s| s.t).collect(),
            totals: column(&|s: &Sample| s.total),
            nodes,
        }
    }
}

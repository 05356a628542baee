//! `evb run --standby`: the EVMs that held the run, in order, and a new standby after each
//! takeover (the roles swap, as under `evb up`), so that a one-shot run survives any number
//! of EVM losses one at a time (docs/standby.md, "A second takeover").
//!
//! The first EVM is labelled by its id (`evm`), the first standby `evm-standby`, each later
//! one `evm-standby2`, `evm-standby3`, …; the run's word is that of the last one that took
//! the run over (the highest epoch), whose report carries what the others saw.

use std::collections::BTreeMap;
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use evb_builder::NodeStatus;
use evb_config::Config;

use super::{spawn, ConfigFd, Note, Watched};

/// The EVM processes of one run with a standby.
pub(super) struct Lineage {
    /// The EVM's id (every EVM process of the run runs with it).
    evm: String,
    /// Their labels: the first EVM, then each standby in the order started.
    labels: Vec<String>,
    /// Which of them holds the run now (index into `labels`), and at which epoch.
    active: usize,
    epoch: u16,
    /// The configuration the newest standby runs with (the next one's is its promotion).
    cfg: Config,
    run_number: Option<u64>,
    /// The configurations given to later standbys, open while they run.
    configs: Vec<ConfigFd>,
    /// A takeover seen, its replaced EVM not yet gone: since when.
    replacing: Option<Instant>,
    /// How long a replaced EVM may take to see its fence and exit before it is killed (its
    /// addresses are where the next standby listens).
    grace: Duration,
    tx: mpsc::Sender<Note>,
}

impl Lineage {
    pub(super) fn new(
        cfg: &Config,
        evm: &str,
        run_number: Option<u64>,
        tx: mpsc::Sender<Note>,
    ) -> Lineage {
        Lineage {
            evm: evm.to_string(),
            labels: vec![evm.to_string(), spawn::standby_label(evm)],
            active: 0,
            epoch: 0,
            cfg: cfg.clone(),
            run_number,
            configs: Vec::new(),
            replacing: None,
            grace: Duration::from_millis((2 * cfg.run.heartbeat_timeout_ms).max(3000)),
            tx,
        }
    }

    /// Every EVM label so far.
    pub(super) fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The label of the EVM that holds the run now.
    pub(super) fn active(&self) -> &str {
        &self.labels[self.active]
    }

    /// The standby that follows the active EVM, if one was started.
    pub(super) fn standby(&self) -> Option<&str> {
        self.labels.get(self.active + 1).map(String::as_str)
    }

    /// `a` is an EVM that held (or was to hold) the run before `b` did.
    pub(super) fn before(&self, a: &str, b: &str) -> bool {
        let at = |x: &str| self.labels.iter().position(|l| l == x);
        matches!((at(a), at(b)), (Some(i), Some(j)) if i < j)
    }

    /// Looks at the newest status lines: a standby that took over becomes the active EVM;
    /// once the EVM it replaced is gone (or killed after the grace), a new standby is started
    /// at that EVM's addresses, following the new one. `watched` and `children` grow by it.
    pub(super) fn step(
        &mut self,
        latest: &BTreeMap<String, Box<NodeStatus>>,
        exit_codes: &BTreeMap<String, Option<i32>>,
        children: &mut Vec<(String, Child)>,
        watched: &mut Vec<String>,
        say: &dyn Fn(String),
    ) {
        if self.replacing.is_none() {
            let Some(standby) = self.standby() else {
                return;
            };
            let epoch = latest
                .get(standby)
                .and_then(|v| v.evm())
                .map_or(0, |e| e.epoch);
            if epoch <= self.epoch || exit_codes.contains_key(standby) {
                return;
            }
            self.active += 1;
            self.epoch = epoch;
            self.replacing = Some(Instant::now());
        }
        let since = self.replacing.unwrap_or_else(Instant::now);
        let old = &self.labels[self.active - 1];
        if let Some((_, child)) = children.iter_mut().find(|(l, _)| l == old) {
            if matches!(child.try_wait(), Ok(None)) {
                if since.elapsed() < self.grace {
                    return;
                }
                // fenced, but frozen or slow to see it: its addresses are the next standby's
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        self.replacing = None;
        let Some(next) = self.cfg.with_standby_promoted() else {
            return;
        };
        let label = format!("{}-standby{}", self.evm, self.labels.len());
        let started = ConfigFd::new(&next.to_toml(), &next.run.id).and_then(|mut c| {
            c.set_run_number(self.run_number);
            let child = spawn::spawn_standby_labelled(&c, &self.evm, &label, false, &self.tx)?;
            self.configs.push(c);
            Ok(child)
        });
        match started {
            Ok(child) => {
                say(format!(
                    "evb: {} took the run over (epoch {}); a new standby EVM ({label}, at {}) follows it",
                    self.labels[self.active], self.epoch, next.evm.standby
                ));
                children.push((label.clone(), child));
                watched.push(label.clone());
                self.labels.push(label);
                self.cfg = next;
            }
            Err(e) => say(format!(
                "evb: cannot start a new standby EVM: {e}; a loss of this EVM ends the run"
            )),
        }
    }

    /// At the end: the report and exit of the EVM that held the run last are the EVM's; the
    /// first EVM's report is kept as `<evm>-replaced`, the others' under their labels; the
    /// exits of the EVMs replaced and of standbys that never took over are not the run's.
    pub(super) fn settle(&self, w: &mut Watched) {
        let evm = &self.labels[0];
        // the run's word: the report of the highest epoch among them (typed, not read from
        // a sentence)
        let winner = self
            .labels
            .iter()
            .skip(1)
            .filter_map(|l| {
                let e = w.reports.get(l)?.evm()?.epoch;
                (e > 0).then_some((e, l.clone()))
            })
            .max_by_key(|(e, _)| *e)
            .map(|(_, l)| l);
        let code = winner.as_ref().and_then(|l| w.exit_codes.get(l).copied());
        let ended = winner.as_ref().and_then(|l| w.how_ended.get(l).cloned());
        let last = winner.as_ref().and_then(|l| w.last_lines.get(l).cloned());
        let killed = winner
            .as_ref()
            .is_some_and(|l| w.killed.iter().any(|k| k == l));
        for l in self.labels.iter().skip(1) {
            w.exit_codes.remove(l);
            w.how_ended.remove(l);
            w.last_lines.remove(l);
            w.killed.retain(|k| k != l);
        }
        let Some(winner) = winner else {
            // nobody took over: the standbys are left out
            for l in self.labels.iter().skip(1) {
                w.reports.remove(l);
            }
            return;
        };
        if let Some(r) = w.reports.remove(&winner) {
            if let Some(old) = w.reports.insert(evm.clone(), r) {
                w.reports.insert(format!("{evm}-replaced"), old);
            }
        }
        // standbys that never took over say nothing of the run
        for l in self.labels.iter().skip(1) {
            if w.reports.get(l).is_some_and(|r| !r.took_over()) {
                w.reports.remove(l);
            }
        }
        w.exit_codes.remove(evm);
        if let Some(c) = code {
            w.exit_codes.insert(evm.clone(), c);
        }
        w.how_ended.remove(evm);
        if let Some(e) = ended {
            w.how_ended.insert(evm.clone(), e);
        }
        w.last_lines.remove(evm);
        if let Some(l) = last {
            w.last_lines.insert(evm.clone(), l);
        }
        w.killed.retain(|k| k != evm);
        if killed {
            w.killed.push(evm.clone());
        }
    }
}

//! Run records on disk: every change of a run's record is appended, as one JSON line, to
//! `<run.records_dir>/<run id>.jsonl`, so that the records and the run numbering outlive
//! the run control's process (docs/operations/data.md, "Run records").
//!
//! Why JSON Lines and not SQLite: a record changes a few times per run, lines are appended
//! and never rewritten (a crash loses at most the line being written, which the reader
//! skips), an operator reads them with `jq` or `tail`, and no database library comes in.
//!
//! Each line carries the control epoch (the term) of the control that wrote it. A run's
//! record is its line of the highest term, the last of them: a control that a standby
//! fenced may still write, and its words never outrank the standby's. Numbers are claimed
//! under an exclusive lock of the file, so two controls of one run id never take the same.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use evb_config::Config;
use serde::{Deserialize, Serialize};

use super::records::{RunEnd, RunRecord};

/// One line of the file.
#[derive(Debug, Serialize, Deserialize)]
struct Line {
    /// The control epoch of the control that wrote it.
    term: u16,
    record: RunRecord,
}

/// Whether a record holds a verdict: closed, and not as `unknown` or `interrupted`.
pub(crate) fn known(r: &RunRecord) -> bool {
    r.end.is_some() && !matches!(r.state.as_str(), "unknown" | "interrupted")
}

/// The record file of one run id.
#[derive(Debug, Clone)]
pub(crate) struct RecordStore {
    path: PathBuf,
    term: u16,
}

/// The folder records go to when `run.records_dir` is empty.
fn default_dir() -> Result<PathBuf, String> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(state) = env("XDG_STATE_HOME").filter(|p| p.is_absolute()) {
        return Ok(state.join("evb").join("runs"));
    }
    match env("HOME") {
        Some(home) => Ok(home.join(".local/state/evb/runs")),
        None => Err("neither XDG_STATE_HOME nor HOME is set: set run.records_dir".into()),
    }
}

/// This process's user id (the owner of `/proc/self`).
fn uid() -> u32 {
    std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
}

/// The file is ours and a plain file: a record file another user planted (a shared
/// `records_dir`) is not read as ours.
fn check_owned(path: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() || !m.is_file() => {
            Err(format!("{} is not a plain file", path.display()))
        }
        Ok(m) if m.uid() != uid() => Err(format!(
            "{} belongs to uid {}, not to this user (uid {})",
            path.display(),
            m.uid(),
            uid()
        )),
        _ => Ok(()),
    }
}

impl RecordStore {
    /// The record file of `cfg`'s run id, its folder created (0700) when missing. The
    /// term is `evm.control_epoch`.
    pub(crate) fn open(cfg: &Config) -> Result<RecordStore, String> {
        let dir = if cfg.run.records_dir.is_empty() {
            default_dir()?
        } else {
            PathBuf::from(&cfg.run.records_dir)
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("run.records_dir: cannot create {}: {e}", dir.display()))?;
        let name = format!("{}.jsonl", evb_config::safe_file_name(&cfg.run.id));
        Ok(RecordStore {
            path: dir.join(name),
            term: cfg.evm.control_epoch,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The file, opened for appending (created 0600) and locked.
    fn locked(&self) -> Result<File, String> {
        check_owned(&self.path)?;
        let f = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        f.lock()
            .map_err(|e| format!("{}: cannot lock: {e}", self.path.display()))?;
        Ok(f)
    }

    /// Every run's record: per run, the last line of the highest term. Lines that do not
    /// parse (one cut by a crash) are skipped.
    fn read(f: &File) -> BTreeMap<u64, (u16, RunRecord)> {
        let mut best: BTreeMap<u64, (u16, RunRecord)> = BTreeMap::new();
        for line in BufReader::new(f).lines().map_while(Result::ok) {
            let Ok(l) = serde_json::from_str::<Line>(&line) else {
                continue;
            };
            let run = l.record.run;
            // a higher term's words win, except that a verdict known (the run closed
            // complete or failed, with its counts) is never replaced by one not known
            // (`unknown`, `interrupted`): the later control only says it did not see it
            let keep = best
                .get(&run)
                .is_some_and(|(t, r)| l.term < *t || (known(r) && !known(&l.record)));
            if !keep {
                best.insert(run, (l.term, l.record));
            }
        }
        best
    }

    fn append(&self, mut f: &File, rec: &RunRecord) -> Result<(), String> {
        use std::os::unix::fs::FileExt;
        let mut rec = rec.clone();
        if rec.end.is_some() && rec.prev_sha256.is_none() {
            rec.prev_sha256 = Self::last_line_before(f, rec.run)
                .map(|l| evb_formats::evidence::sha256_hex(l.as_bytes()));
        }
        let mut text = serde_json::to_string(&Line {
            term: self.term,
            record: rec,
        })
        .map_err(|e| e.to_string())?;
        text.push('\n');
        // a line cut by a crash: this one begins a line of its own
        let len = f.metadata().map_or(0, |m| m.len());
        let mut last = [b'\n'];
        if len > 0 && f.read_at(&mut last, len - 1).is_ok() && last[0] != b'\n' {
            text.insert(0, '\n');
        }
        // one write: a reader sees the whole line or, after a crash, a cut one it skips
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_data())
            .map_err(|e| format!("{}: {e}", self.path.display()))
    }

    /// The file's last line (its text, without the newline) of the highest run numbered
    /// below `run`: what run `run`'s closed record chains to.
    fn last_line_before(f: &File, run: u64) -> Option<String> {
        use std::io::Seek;
        let mut f = f;
        f.seek(std::io::SeekFrom::Start(0)).ok()?;
        let mut best: Option<(u64, String)> = None;
        for line in BufReader::new(f).lines().map_while(Result::ok) {
            let Ok(l) = serde_json::from_str::<Line>(&line) else {
                continue;
            };
            let r = l.record.run;
            if r < run && best.as_ref().is_none_or(|(b, _)| r >= *b) {
                best = Some((r, line));
            }
        }
        best.map(|(_, l)| l)
    }

    /// Every line of the file that parses, by run: what `evb inspect --run --verify` checks
    /// the chain with.
    pub fn lines_by_run(path: &Path) -> Result<BTreeMap<u64, Vec<String>>, String> {
        let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut out: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for line in BufReader::new(f).lines().map_while(Result::ok) {
            if let Ok(l) = serde_json::from_str::<Line>(&line) {
                out.entry(l.record.run).or_default().push(line);
            }
        }
        Ok(out)
    }

    /// Run `run`'s record as the file holds it now (the line that wins), if any; nothing
    /// is written.
    pub(crate) fn get(&self, run: u64) -> Option<RunRecord> {
        let f = self.locked().ok()?;
        Self::read(&f).remove(&run).map(|(_, r)| r)
    }

    /// The records of every run, for a control that starts: a run whose record was never
    /// closed (its control ended before it did) is closed as `interrupted`, here and in
    /// the file, with the time of this load — except `live`, the run a promoted standby
    /// holds (took over, or followed to its end): its own record follows at once, and a
    /// reader never sees it `interrupted` first.
    pub(crate) fn load(&self, unix: f64, live: Option<u64>) -> Result<Vec<RunRecord>, String> {
        let f = self.locked()?;
        let mut out = Vec::new();
        for (_, (term, mut rec)) in Self::read(&f) {
            if rec.end.is_none() && term <= self.term && Some(rec.run) != live {
                rec.end = Some(RunEnd::interrupted(&rec, unix));
                rec.state = "interrupted".into();
                self.append(&f, &rec)?;
            }
            out.push(rec);
        }
        Ok(out)
    }

    /// A new run's number, claimed for good: `asked`, if no record has it, else the next
    /// after every number recorded and after `floor`. The run's first record is written
    /// under the same lock.
    pub(crate) fn claim(
        &self,
        asked: Option<u64>,
        floor: u64,
        first: impl FnOnce(u64) -> RunRecord,
    ) -> Result<u64, ClaimError> {
        let f = self.locked().map_err(ClaimError::Io)?;
        let known = Self::read(&f);
        let last = known.keys().last().copied().unwrap_or(0).max(floor);
        let next = last.saturating_add(1);
        let run = match asked {
            Some(n) if known.contains_key(&n) => return Err(ClaimError::Taken { next }),
            Some(n) => n,
            None => next,
        };
        if !(1..=super::MAX_RUN).contains(&run) {
            return Err(ClaimError::Io(format!(
                "run {run} is not a number from 1 to {}",
                super::MAX_RUN
            )));
        }
        self.append(&f, &first(run)).map_err(ClaimError::Io)?;
        Ok(run)
    }

    /// A record changed: appended.
    pub(crate) fn write(&self, rec: &RunRecord) -> Result<(), String> {
        let f = self.locked()?;
        self.append(&f, rec)
    }
}

/// Why a run number could not be claimed.
#[derive(Debug)]
pub(crate) enum ClaimError {
    /// The number asked for has a record (the next free one).
    Taken {
        next: u64,
    },
    Io(String),
}

/// The record file of `cfg`'s run id, where it is (nothing is created).
pub fn record_file(cfg: &Config) -> Result<PathBuf, String> {
    let dir = if cfg.run.records_dir.is_empty() {
        default_dir()?
    } else {
        PathBuf::from(&cfg.run.records_dir)
    };
    Ok(dir.join(format!("{}.jsonl", evb_config::safe_file_name(&cfg.run.id))))
}

/// One run id's records as evidence (docs/formats.md §7.3): every closed line, and where the
/// chain of records breaks.
#[derive(Debug, Default)]
pub struct ChainCheck {
    /// Each run's closed records (every closing line, oldest first).
    pub closed: BTreeMap<u64, Vec<RunRecord>>,
    /// Where a record names a predecessor that is not in the file as it was chained: a
    /// record before it deleted or edited.
    pub breaks: Vec<String>,
}

/// Checks the chain of the records in `path`: each closed record's `prev_sha256` must be
/// the digest of a line of the run numbered just below it. Records closed before the chain
/// existed (no `prev_sha256`) are not judged.
pub fn check_chain(path: &Path) -> Result<ChainCheck, String> {
    let lines = RecordStore::lines_by_run(path)?;
    let mut check = ChainCheck::default();
    let mut before: Option<(u64, Vec<String>)> = None;
    for (run, texts) in &lines {
        let digests: Option<Vec<String>> = before.as_ref().map(|(_, t)| {
            t.iter()
                .map(|l| evb_formats::evidence::sha256_hex(l.as_bytes()))
                .collect()
        });
        for text in texts {
            let Ok(l) = serde_json::from_str::<Line>(text) else {
                continue;
            };
            if l.record.end.is_none() {
                continue;
            }
            if let Some(prev) = &l.record.prev_sha256 {
                let found = digests.as_ref().is_some_and(|d| d.contains(prev));
                if !found {
                    let which = match &before {
                        Some((b, _)) => format!("no line of run {b}'s record"),
                        None => "no record before it".to_string(),
                    };
                    let b = format!(
                        "run {run}'s record chains to a record that is not in the file as it was ({which} has its digest {}…): a record before it was deleted or edited",
                        &prev[..prev.len().min(12)]
                    );
                    if !check.breaks.contains(&b) {
                        check.breaks.push(b);
                    }
                }
            }
            check.closed.entry(*run).or_default().push(l.record);
        }
        before = Some((*run, texts.clone()));
    }
    Ok(check)
}

/// `evb run`'s one run in the run records: its number claimed before the nodes start (so
/// that its output folder is its own), its record closed with the launcher's verdict.
#[derive(Debug)]
pub struct OnceRecord {
    store: RecordStore,
    record: RunRecord,
    /// The run's output folder (empty: none) and run id, for the digests of its manifest
    /// and configuration that the closed record names.
    folder: String,
    run_id: String,
}

impl OnceRecord {
    /// The next run number of `cfg`'s run id, claimed.
    pub fn claim(cfg: &Config) -> Result<OnceRecord, String> {
        let store = RecordStore::open(cfg)?;
        let unix = super::unix_now();
        let run = store
            .claim(None, 0, |n| RunRecord::starting(n, unix))
            .map_err(|e| match e {
                ClaimError::Taken { .. } => unreachable_taken(),
                ClaimError::Io(e) => e,
            })?;
        Ok(OnceRecord {
            store,
            record: RunRecord::starting(run, unix),
            folder: String::new(),
            run_id: cfg.run.id.clone(),
        })
    }

    /// The run writes its files (and manifest) into `dir`: its closed record names them.
    pub fn set_folder(&mut self, dir: &str) {
        self.folder = dir.to_string();
    }

    pub fn run(&self) -> u64 {
        self.record.run
    }

    /// The record file.
    pub fn path(&self) -> &Path {
        self.store.path()
    }

    /// The run is over: `problems` is the launcher's verdict (empty: OK), `report` the
    /// EVM's last status line with the run's report, if one came.
    pub fn close(mut self, problems: &[String], report: Option<&evb_builder::NodeStatus>) {
        let ok = problems.is_empty();
        let f = super::records::Finished {
            ok,
            reason: if ok {
                "every triggered event built exactly once".into()
            } else {
                problems.join("; ")
            },
            report: report.cloned(),
            fenced: None,
        };
        f.close(&mut self.record, false, super::unix_now());
        if let Some(end) = &mut self.record.end {
            end.ok = ok;
            end.verdict = problems.to_vec();
        }
        self.record.state = if ok { "complete" } else { "failed" }.into();
        let (m, c) = super::records::folder_digests(&self.folder, &self.run_id);
        self.record.manifest_sha256 = m;
        self.record.config_sha256 = c;
        if let Err(e) = self.store.write(&self.record) {
            eprintln!(
                "evb: run {}: its record was not written: {e}",
                self.record.run
            );
        }
    }
}

/// A claim that asks for no number takes the next free one: never taken.
fn unreachable_taken() -> String {
    "the next run number was taken meanwhile".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &Path, term: u16) -> RecordStore {
        let mut cfg = Config::default();
        cfg.run.records_dir = dir.join("runs").display().to_string();
        cfg.run.id = "a run/with odd#chars".into();
        cfg.evm.control_epoch = term;
        RecordStore::open(&cfg).unwrap()
    }

    fn ended(run: u64, ok: bool) -> RunRecord {
        let mut r = RunRecord::starting(run, 1.0);
        r.state = if ok { "complete" } else { "failed" }.into();
        r.end = Some(RunEnd::interrupted(&r, 2.0));
        if let Some(e) = &mut r.end {
            e.ok = ok;
            e.events_built = 7;
        }
        r
    }

    #[test]
    fn numbers_continue_and_records_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 0);
        assert!(s.path().ends_with("runs/a_run_with_odd_chars.jsonl"));
        assert_eq!(
            s.claim(None, 0, |n| RunRecord::starting(n, 1.0)).unwrap(),
            1
        );
        s.write(&ended(1, true)).unwrap();
        assert_eq!(
            s.claim(None, 0, |n| RunRecord::starting(n, 1.0)).unwrap(),
            2
        );
        // the floor: a control that numbered on from a run it followed
        assert_eq!(
            s.claim(None, 5, |n| RunRecord::starting(n, 1.0)).unwrap(),
            6
        );
        assert!(matches!(
            s.claim(Some(2), 0, |n| RunRecord::starting(n, 1.0)),
            Err(ClaimError::Taken { next: 7 })
        ));
        assert_eq!(
            s.claim(Some(9), 0, |n| RunRecord::starting(n, 1.0))
                .unwrap(),
            9
        );
        // a new process: run 1 as closed; 2, 6 and 9 never closed
        let again = store(dir.path(), 0);
        let runs = again.load(3.0, None).unwrap();
        let states: Vec<(u64, &str)> = runs.iter().map(|r| (r.run, r.state.as_str())).collect();
        assert_eq!(
            states,
            [
                (1, "complete"),
                (2, "interrupted"),
                (6, "interrupted"),
                (9, "interrupted")
            ]
        );
        assert_eq!(runs[0].end.as_ref().unwrap().events_built, 7);
        assert!(!runs[1].end.as_ref().unwrap().ok);
        // the interruption was written: a third load reads it as it is
        let third = store(dir.path(), 0).load(4.0, None).unwrap();
        assert_eq!(third[1].end.as_ref().unwrap().ended_unix, 3.0);
        assert_eq!(
            store(dir.path(), 0)
                .claim(None, 0, |n| RunRecord::starting(n, 1.0))
                .unwrap(),
            10
        );
    }

    #[test]
    fn a_stale_terms_words_never_outrank_the_newer_control() {
        let dir = tempfile::tempdir().unwrap();
        let old = store(dir.path(), 0);
        let standby = store(dir.path(), 1);
        old.claim(None, 0, |n| RunRecord::starting(n, 1.0)).unwrap();
        // the standby takes run 1 over and closes it; the fenced EVM writes after it
        standby.write(&ended(1, false)).unwrap();
        old.write(&ended(1, true)).unwrap();
        let runs = store(dir.path(), 1).load(5.0, None).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].state, "failed");
        // a run the newer control has not closed is not closed by an older one's load
        standby
            .claim(None, 0, |n| RunRecord::starting(n, 1.0))
            .unwrap();
        let seen_by_old = store(dir.path(), 0).load(6.0, None).unwrap();
        assert_eq!(seen_by_old[1].state, "starting");
    }

    /// Issue 66 defect 3: the EVM of term 0 closed run 1 complete; the promoted control
    /// (term 1) did not see it end and writes `unknown`: the known verdict stands.
    #[test]
    fn a_higher_term_s_unknown_never_replaces_a_known_verdict() {
        let dir = tempfile::tempdir().unwrap();
        let old = store(dir.path(), 0);
        let standby = store(dir.path(), 1);
        old.claim(None, 0, |n| RunRecord::starting(n, 1.0)).unwrap();
        old.write(&ended(1, true)).unwrap();
        let mut unknown = ended(1, false);
        unknown.state = "unknown".into();
        standby.write(&unknown).unwrap();
        let runs = store(dir.path(), 1).load(5.0, None).unwrap();
        assert_eq!(runs[0].state, "complete", "{:?}", runs[0]);
        // a known verdict of the higher term does replace the lower's
        standby.write(&ended(1, false)).unwrap();
        let runs = store(dir.path(), 1).load(6.0, None).unwrap();
        assert_eq!(runs[0].state, "failed");
    }

    /// Issue 66 (defect 3's note): a promoted control that takes run 2 over while it runs
    /// leaves that run open when it loads the records (its own `running` line follows): the
    /// file never says `interrupted` for the run in between. Another open run is closed.
    #[test]
    fn a_promoted_control_never_writes_interrupted_for_the_run_it_takes_over() {
        let dir = tempfile::tempdir().unwrap();
        let old = store(dir.path(), 0);
        old.claim(None, 0, |n| RunRecord::starting(n, 1.0)).unwrap();
        old.claim(None, 0, |n| RunRecord::starting(n, 1.0)).unwrap();
        let runs = store(dir.path(), 1).load(5.0, Some(2)).unwrap();
        let state = |n: u64| runs.iter().find(|r| r.run == n).unwrap().state.clone();
        assert_eq!(state(1), "interrupted");
        assert_eq!(state(2), "starting");
        let text = std::fs::read_to_string(store(dir.path(), 1).path()).unwrap();
        assert_eq!(text.matches("interrupted").count(), 1, "{text}");
    }

    #[test]
    fn a_cut_line_is_skipped_and_a_planted_link_refused() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 0);
        s.write(&ended(1, true)).unwrap();
        let mut f = OpenOptions::new().append(true).open(s.path()).unwrap();
        f.write_all(b"{\"term\":0,\"record\":{\"run\":2,\"st")
            .unwrap();
        drop(f);
        assert_eq!(s.load(1.0, None).unwrap().len(), 1);
        // a line after the cut one is read again (it begins a line of its own)
        s.write(&ended(3, true)).unwrap();
        let runs: Vec<u64> = s.load(1.0, None).unwrap().iter().map(|r| r.run).collect();
        assert_eq!(runs, [1, 3]);
        let other = tempfile::tempdir().unwrap();
        let s2 = store(other.path(), 0);
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), s2.path()).unwrap();
        assert!(s2
            .write(&ended(1, true))
            .unwrap_err()
            .contains("not a plain file"));
    }
}

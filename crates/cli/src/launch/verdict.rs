//! Judging a run from what the launcher saw: the EVM's report and the builder's verdict on
//! it, how each node process ended, and the output files.

use std::collections::BTreeMap;
use std::path::PathBuf;

use evb_builder::{NodeRef, NodeStatus, RunReport, RunState};
use evb_config::{Config, Role};

use super::Watched;

/// Everything wrong with the run, in the order an operator reads it: a node lost before the
/// start (the cause), the operator's abort, a time-out, nodes that failed or sent no report,
/// the verdict's problems, the EVM's reason.
pub(super) fn problems(cfg: &Config, ids: &[String], w: &Watched) -> Vec<String> {
    let mut problems: Vec<String> = Vec::new();
    // a node process that died before the run started, with no word from the EVM: that is
    // the cause, said first as the EVM would have (`lost bu[1] before the run started`), and
    // what the launcher then did to the others is one line, not two per node
    let lost_early: Vec<&String> = if w.reports.contains_key(&ids[0]) {
        Vec::new()
    } else {
        w.how_ended
            .iter()
            .filter(|(id, (_, started))| !started && w.exit_codes.get(*id) != Some(&Some(0)))
            .map(|(id, _)| id)
            .collect()
    };
    for id in &lost_early {
        // what the node said last on stderr is the cause (a port in use, a missing file),
        // with the class of the cause and its fix where the line tells it
        let last = w.last_lines.get(*id).map_or(String::new(), |line| {
            let fix =
                cause(line).map_or(String::new(), |(class, fix)| format!(" ({class}: {fix})"));
            format!("; its last line on stderr: {line}{fix}")
        });
        problems.push(format!(
            "lost {id} before the run started: {}{last}",
            w.how_ended[*id].0
        ));
    }
    if !lost_early.is_empty() {
        let others: Vec<&str> = ids
            .iter()
            .filter(|id| !lost_early.contains(id))
            .map(String::as_str)
            .collect();
        problems.push(format!(
            "the run never started; the other nodes were stopped ({})",
            others.join(", ")
        ));
    }
    if w.user_abort {
        problems.push("aborted by the operator (second Ctrl-C)".into());
    }
    if w.timed_out {
        problems.push(format!("run did not finish within {:.0} s", w.budget));
    }
    let evm_report = w.reports.get(&ids[0]);
    // The EVM's report and the builder's verdict on it (the EVM's own).
    let run = evm_report.and_then(|r| r.run.as_ref());
    let verdict = run.map(RunReport::verdict).unwrap_or_default();
    let evm_ok = evm_report.and_then(|r| r.ok) == Some(true) && verdict.is_empty();
    // Nodes the EVM lost during the run and handled by the documented rule (a BU's events
    // rebuilt elsewhere, an RU's by the partial policy), and BUs that retired from it (their
    // report in, they had left): their exit is not a failure of the run; the EVM's verdict
    // says whether anything was lost.
    let lost_by_evm: Vec<String> = cfg
        .nodes()
        .iter()
        .filter(|n| {
            let node = match n.role {
                Role::Ru => NodeRef::Ru(n.index),
                Role::Bu => NodeRef::Bu(n.index),
                Role::Evm => return false,
            };
            let retired = |r: &RunReport| {
                r.evm
                    .lost
                    .iter()
                    .any(|e| e.is_about(node) && e.kind == evb_builder::NodeEventKind::Retired)
            };
            run.is_some_and(|r| r.lost(node) || retired(r))
        })
        .map(|n| n.id.clone())
        .collect();
    let evm_handled = |id: &String| lost_by_evm.contains(id) && evm_ok;
    for id in w.killed.iter().filter(|_| lost_early.is_empty()) {
        if !evm_handled(id) {
            problems.push(format!("{id} had to be killed"));
        }
    }
    for id in ids.iter().filter(|_| lost_early.is_empty()) {
        if evm_handled(id) {
            continue;
        }
        match w.exit_codes.get(id) {
            Some(Some(0)) => {}
            Some(code) if !w.killed.contains(id) => {
                // a node's own reason (not the EVM's, which the verdict says, nor an echo of it)
                let why = w
                    .reports
                    .get(id)
                    .and_then(|r| r.reason.as_deref())
                    .filter(|why| {
                        *id != ids[0] && !why.is_empty() && !why.starts_with("run aborted")
                    });
                let how = w
                    .how_ended
                    .get(id)
                    .map(|(h, _)| h.clone())
                    .unwrap_or_else(|| exit_words(*code));
                // else what it said last on stderr (a node that failed before it could report)
                let last = w
                    .last_lines
                    .get(id)
                    .filter(|_| why.is_none() && !w.reports.contains_key(id));
                problems.push(match (why, last) {
                    (Some(w), _) => format!("{id} {how}: {w}"),
                    (None, Some(line)) => format!("{id} {how}; its last line on stderr: {line}"),
                    (None, None) => format!("{id} {how}"),
                })
            }
            _ => {}
        }
        if !w.reports.contains_key(id) {
            problems.push(format!("{id} sent no final report"));
        }
    }
    problems.extend(verdict);
    if let Some(reason) = evm_report.and_then(|r| r.reason.as_deref()) {
        let failed = evm_report.and_then(|r| r.ok) == Some(false);
        if failed && !problems.iter().any(|p| p.contains(reason)) {
            problems.push(reason.to_string());
        }
    }
    problems
}

/// The run manifest the EVM left beside the output (docs/formats.md §7) carries the run's
/// verdict as this launcher judged it (it also sees how every process ended), so that the
/// files say what `evb run` said.
pub(super) fn amend_manifest(cfg: &Config, problems: &[String], launched: std::time::SystemTime) {
    if cfg.sink.dir.is_empty() {
        return;
    }
    let dir = PathBuf::from(&cfg.sink.dir);
    let path = dir.join(evb_formats::manifest::manifest_name(&cfg.run.id));
    let fresh = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= launched);
    let Some(mut m) = std::fs::read(&path)
        .ok()
        .filter(|_| fresh)
        .and_then(|b| serde_json::from_slice::<evb_formats::manifest::RunManifest>(&b).ok())
    else {
        return;
    };
    let verdict = if problems.is_empty() { "OK" } else { "FAILED" };
    if m.verdict == verdict && m.problems == problems {
        return;
    }
    m.verdict = verdict.into();
    m.problems = problems.to_vec();
    if let Err(e) = evb_formats::manifest::write(&dir, &m, cfg.output_file_mode()) {
        eprintln!("evb: cannot amend the run manifest {}: {e}", path.display());
    }
}

/// Files of an earlier run of this run id in `sink.dir` (its run manifest, or BU files
/// named after it), in words: a run that writes there would mix its files with theirs.
pub(super) fn earlier_run_files(cfg: &Config) -> Option<String> {
    if cfg.sink.dir.is_empty() || !cfg.nodes().iter().any(|n| n.sink.writes_files()) {
        return None;
    }
    let manifest = evb_formats::manifest::manifest_name(&cfg.run.id);
    let prefix = format!("{}_bu", cfg.run.id);
    let found = std::fs::read_dir(&cfg.sink.dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|name| {
            let name = name.strip_prefix('.').unwrap_or(name);
            name == manifest || name.starts_with(&prefix)
        })?;
    Some(format!(
        "{} already holds files of an earlier run of run id {:?} ({found})",
        cfg.sink.dir, cfg.run.id
    ))
}

/// Output files: no event may be in two of them (a consumer would take it twice). `.evb`
/// files' event headers are read (not their bodies); HDF5 files are judged by the ids the
/// run manifest lists for them.
pub(super) fn duplicate_output(cfg: &Config, launched: std::time::SystemTime) -> Option<String> {
    if cfg.sink.kind == evb_config::SinkKind::Hdf5 && !cfg.sink.dir.is_empty() {
        let dir = PathBuf::from(&cfg.sink.dir);
        let path = dir.join(evb_formats::manifest::manifest_name(&cfg.run.id));
        let m = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t >= launched)
            .then(|| std::fs::read(&path).ok())
            .flatten()
            .and_then(|b| serde_json::from_slice::<evb_formats::manifest::RunManifest>(&b).ok())?;
        let twice = evb_formats::manifest::judge(&dir, &m).twice;
        if let Some((a, b)) = twice.first() {
            return Some(format!(
                "event ids {a}..={b} are in more than one output file in {} ({} runs of ids)",
                dir.display(),
                twice.len()
            ));
        }
        return None;
    }
    if cfg.sink.kind == evb_config::SinkKind::File && !cfg.sink.dir.is_empty() {
        let dir = PathBuf::from(&cfg.sink.dir);
        // this run's files only (an earlier run may have used the same ids)
        let files: Vec<PathBuf> = crate::inspect::event_files(std::slice::from_ref(&dir))
            .into_iter()
            .filter(|f| {
                std::fs::metadata(f)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t >= launched)
            })
            .collect();
        let (lines, n) = crate::inspect::duplicates_across(&files, 3);
        if n > 0 {
            return Some(format!(
                "{n} event ids are in more than one output file in {}: {}",
                dir.display(),
                lines.join("; ")
            ));
        }
    }
    None
}

/// How a node process ended, in words: its exit code, or the signal that killed it
/// (`exited with exit code 1`, `was killed by signal 9 (SIGKILL)`).
pub(crate) fn ended_words(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with exit code {c}"),
        (None, Some(sig)) => {
            let name = match sig {
                libc::SIGKILL => " (SIGKILL)",
                libc::SIGTERM => " (SIGTERM)",
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGBUS => " (SIGBUS)",
                _ => "",
            };
            format!("was killed by signal {sig}{name}")
        }
        (None, None) => "ended without an exit status".into(),
    }
}

/// The same from an exit code alone (a node thread, or a status already taken).
fn exit_words(code: Option<i32>) -> String {
    match code {
        Some(c) => format!("exited with exit code {c}"),
        None => "was killed by a signal".into(),
    }
}

/// The class of a node's failure and its fix, read from its last line on stderr (the
/// operating system's words, which evb passes on), where the line tells it.
pub(super) fn cause(line: &str) -> Option<(&'static str, &'static str)> {
    let l = line.to_ascii_lowercase();
    let classes: [(&[&str], &str, &str); 4] = [
        (
            &["address already in use", "address in use"],
            "port in use",
            "another process listens there; stop it, or choose other ports (topology.base_port, control.base_port)",
        ),
        (
            &["no such file or directory", "not found"],
            "file missing",
            "a file or folder the configuration names does not exist; `evb config check` names the key",
        ),
        (
            &["permission denied", "read-only file system", "operation not permitted"],
            "permission",
            "the node cannot open or write a file or folder the configuration names; check its owner and mode",
        ),
        (
            &["did not run for", "starved of cpu"],
            "starved",
            "the host is busier than the heartbeat allows; raise run.heartbeat_timeout_ms or run fewer nodes per core",
        ),
    ];
    classes
        .iter()
        .find(|(words, _, _)| words.iter().any(|w| l.contains(w)))
        .map(|(_, class, fix)| (*class, *fix))
}

/// Notes how node `id` ended, and whether the EVM had started the run by then.
pub(super) fn note_exit(
    how: &mut BTreeMap<String, (String, bool)>,
    id: &str,
    status: std::process::ExitStatus,
    latest: &BTreeMap<String, Box<NodeStatus>>,
    evm: &str,
) {
    let started = latest
        .get(evm)
        .is_some_and(|v| !matches!(v.state, RunState::Ready | RunState::Configured));
    how.entry(id.to_string())
        .or_insert_with(|| (ended_words(status), started));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched(exit_codes: &[(&str, Option<i32>)], last: &[(&str, &str)]) -> Watched {
        Watched {
            reports: BTreeMap::new(),
            exit_codes: exit_codes
                .iter()
                .map(|(id, c)| (id.to_string(), *c))
                .collect(),
            how_ended: BTreeMap::new(),
            killed: Vec::new(),
            last_lines: last
                .iter()
                .map(|(id, l)| (id.to_string(), l.to_string()))
                .collect(),
            timed_out: false,
            user_abort: false,
            budget: 10.0,
            steady_events_per_s: None,
        }
    }

    #[test]
    fn a_failed_node_is_told_by_its_exit_code_and_its_last_line() {
        let cfg = Config::default();
        let ids: Vec<String> = cfg.nodes().into_iter().map(|n| n.id).collect();
        let w = watched(
            &[("ru0", Some(1)), ("bu0", None)],
            &[("ru0", "evb node ru0: cannot open input.fed: No such file")],
        );
        let p = problems(&cfg, &ids, &w);
        assert!(
            p.contains(
                &"ru0 exited with exit code 1; its last line on stderr: \
                  evb node ru0: cannot open input.fed: No such file"
                    .to_string()
            ),
            "{p:#?}"
        );
        assert!(
            p.contains(&"bu0 was killed by a signal".to_string()),
            "{p:#?}"
        );
        assert!(p.iter().all(|l| !l.contains("Some(")), "{p:#?}");
    }

    /// Issue 71 item 2: a node lost before the run started is named at the verdict with its
    /// last line on stderr and the class of the cause, with its fix.
    #[test]
    fn a_node_lost_before_the_start_is_named_with_its_last_line_and_the_fix() {
        let cfg = Config::default();
        let ids: Vec<String> = cfg.nodes().into_iter().map(|n| n.id).collect();
        let mut w = watched(
            &[("ru0", Some(1))],
            &[(
                "ru0",
                "evb node: cannot listen on 127.0.0.1:47500: Address already in use (os error 98)",
            )],
        );
        w.how_ended
            .insert("ru0".into(), ("exited with exit code 1".into(), false));
        let p = problems(&cfg, &ids, &w);
        assert!(
            p[0].starts_with(
                "lost ru0 before the run started: exited with exit code 1; its last line on \
                 stderr: evb node: cannot listen on 127.0.0.1:47500: Address already in use"
            ) && p[0].ends_with(
                "(port in use: another process listens there; stop it, or choose other ports \
                 (topology.base_port, control.base_port))"
            ),
            "{p:#?}"
        );
        assert_eq!(
            cause("bu0: cannot create /data/out: Permission denied").map(|c| c.0),
            Some("permission")
        );
        assert_eq!(cause("ru1: no heartbeat for 1000 ms"), None);
    }

    #[test]
    fn exit_status_in_words() {
        use std::os::unix::process::ExitStatusExt;
        let exited = std::process::ExitStatus::from_raw(1 << 8);
        assert_eq!(ended_words(exited), "exited with exit code 1");
        let killed = std::process::ExitStatus::from_raw(libc::SIGKILL);
        assert_eq!(ended_words(killed), "was killed by signal 9 (SIGKILL)");
    }
}

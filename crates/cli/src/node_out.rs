//! What a standalone `evb node` prints: one summary line per run on stdout, and its report
//! as JSON in the file `--json FILE` names (`-`: stdout). Under `mpirun -n 5 evb node` or
//! `srun -n 5 evb node` every rank shares the launcher's stdout: one line each reads as a
//! table there, where five pretty-printed JSON objects would interleave into something no
//! parser reads. `{id}` and `{rank}` in FILE give every rank its own file
//! (docs/operations/deployment.md, "A deployment over several hosts").
//!
//! The line is `evb node ID: verdict=OK|FAILED key=value ...`, the keys fixed per role, the
//! words of a failure in `reason="..."` (JSON-quoted) last.

use std::path::{Path, PathBuf};

use evb_builder::{NodeStatus, RoleStats};

/// Where the report goes.
#[derive(Debug, Clone, PartialEq)]
pub enum JsonOut {
    /// Nowhere: the summary line only.
    None,
    /// On stdout, pretty-printed, as before: the summary line goes to stderr then.
    Stdout,
    /// Into this file, rewritten by every run of the node (`--serve`).
    File(PathBuf),
}

impl JsonOut {
    /// `--json`'s value for node `id` at launcher rank `rank`: `-` is stdout; `{id}` and
    /// `{rank}` are replaced (`{rank}` by the id when no launcher gave one); an existing
    /// folder (or a path ending in `/`) gets `ID.json` inside it. The file's folder is made
    /// here, so that a path that cannot be written is said before the run, not after it.
    pub fn new(spec: Option<&str>, id: &str, rank: Option<&str>) -> Result<JsonOut, String> {
        let Some(spec) = spec else {
            return Ok(JsonOut::None);
        };
        if spec == "-" {
            return Ok(JsonOut::Stdout);
        }
        if spec.is_empty() {
            return Err("--json: give a file (or - for stdout)".into());
        }
        let named = spec
            .replace("{id}", id)
            .replace("{rank}", rank.unwrap_or(id));
        let mut path = PathBuf::from(&named);
        if named.ends_with('/') || path.is_dir() {
            path = path.join(format!("{id}.json"));
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("--json {spec}: {e}"))?;
        }
        Ok(JsonOut::File(path))
    }

    /// Prints the summary line of the report `r` and writes the report where it goes.
    pub fn report(&self, r: &NodeStatus, rank: Option<&str>) {
        let line = line(r, rank);
        let json = serde_json::to_string_pretty(r).unwrap_or_default();
        match self {
            JsonOut::None => println!("{line}"),
            JsonOut::Stdout => {
                println!("{json}");
                eprintln!("{line}");
            }
            JsonOut::File(p) => {
                println!("{line}");
                if let Err(e) = write(p, &json) {
                    eprintln!("evb node {}: --json {}: {e}", r.node, p.display());
                }
            }
        }
    }
}

/// The file written whole: a reader never sees half a report.
fn write(p: &Path, json: &str) -> std::io::Result<()> {
    let mut tmp = p.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, format!("{json}\n"))?;
    std::fs::rename(&tmp, p)
}

/// The report's summary line (module docs).
pub fn line(r: &NodeStatus, rank: Option<&str>) -> String {
    let ok = r.ok.unwrap_or(false) && r.verdict.as_ref().is_none_or(|v| v.is_empty());
    let mut f = vec![
        format!("verdict={}", if ok { "OK" } else { "FAILED" }),
        format!("role={}", r.role.name()),
    ];
    if let Some(k) = rank {
        f.push(format!("rank={k}"));
    }
    f.push(format!("state={}", r.state.name()));
    if let Some(n) = r.run_number {
        f.push(format!("run={n}"));
    }
    match &r.stats {
        RoleStats::Evm(s) => {
            f.push(format!("triggered={}", s.triggered));
            f.push(format!("released={}", s.released));
            if let Some(run) = &r.run {
                // the BUs' own counts, and the lost BU processes' releases (their reports
                // died with them): the run's events built, as the ledger's `released`
                let built: u64 = run
                    .bus
                    .iter()
                    .flatten()
                    .map(|b| b.events_built)
                    .sum::<u64>()
                    + s.released_by_lost;
                f.push(format!("built={built}"));
                f.push(format!("seconds={:.2}", run.seconds));
            }
            if let Some(reg) = &r.registered {
                f.push(format!("registered={}", reg.len()));
            }
        }
        RoleStats::Ru(s) => {
            f.push(format!("fragments={}", s.fragments_sent));
            f.push(format!("payload_bytes={}", s.payload_bytes_sent));
        }
        RoleStats::Bu(s) => {
            f.push(format!("built={}", s.events_built));
            f.push(format!("payload_bytes={}", s.payload_bytes_built));
            f.push(format!("partial={}", s.partial_events));
        }
    }
    let errors: u64 = r.stats.errors().iter().map(|e| e.1).sum();
    f.push(format!("errors={errors}"));
    let problems = r.verdict.as_deref().unwrap_or_default();
    if !problems.is_empty() {
        f.push(format!("problems={}", problems.len()));
    }
    // a failure's words (an exact run's reason, "run complete", says nothing more): the
    // reason, then the verdict's problems that do not just repeat it (`run aborted: REASON`)
    let mut words: Vec<&str> = Vec::new();
    let said = r.reason.iter().filter(|_| !ok).chain(problems);
    for w in said.map(String::as_str).filter(|w| !w.is_empty()) {
        if !words.iter().any(|x| x.contains(w) || w.contains(x)) {
            words.push(w);
        }
    }
    if !words.is_empty() {
        let reason = serde_json::to_string(&words.join("; ")).unwrap_or_default();
        f.push(format!("reason={reason}"));
    }
    format!("evb node {}: {}", r.node, f.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use evb_builder::{BuStats, RunState};

    /// Issue 71 item 7: the EVM's line counts a lost BU's events among those built (it said
    /// built=3245 in a run exact at 3499, the lost BU's 254 left out).
    #[test]
    fn the_evm_s_built_counts_a_lost_bu_s_releases() {
        let evm = evb_builder::EvmStats {
            triggered: 3499,
            released: 3499,
            released_by_lost: 254,
            ..Default::default()
        };
        let mut r = NodeStatus::new(
            "evm",
            RunState::Halted,
            RoleStats::Evm(Box::new(evm.clone())),
        );
        r.ok = Some(true);
        let bu = |n| BuStats {
            events_built: n,
            ..BuStats::default()
        };
        r.run = Some(evb_builder::RunReport {
            state: RunState::Halted,
            reason: None,
            n_ru: 2,
            n_bu: 2,
            seconds: 1.0,
            down: Vec::new(),
            evm,
            rus: vec![None, None],
            bus: vec![Some(bu(1700)), Some(bu(1545))],
        });
        let l = line(&r, None);
        assert!(l.contains("released=3499 built=3499 "), "{l}");
    }

    #[test]
    fn one_line_of_key_values_and_the_reason_quoted_last() {
        let s = BuStats {
            events_built: 1500,
            payload_bytes_built: 7,
            ..BuStats::default()
        };
        let mut r = NodeStatus::new("bu0", RunState::Halted, RoleStats::Bu(Box::new(s)));
        r.ok = Some(true);
        let l = line(&r, Some("3"));
        assert_eq!(
            l,
            "evb node bu0: verdict=OK role=bu rank=3 state=halted built=1500 \
             payload_bytes=7 partial=0 errors=0"
        );
        r.ok = Some(false);
        r.reason = Some("lost \"evm\"\nat 2 s".into());
        let l = line(&r, None);
        assert!(!l.contains('\n'), "{l}");
        let (head, reason) = l.split_once(" reason=").unwrap();
        assert!(head.contains("verdict=FAILED"), "{l}");
        let words: String = serde_json::from_str(reason).unwrap();
        assert_eq!(words, "lost \"evm\"\nat 2 s");
        // the verdict's problems after the reason, each said once
        r.verdict = Some(vec![
            "run aborted: lost \"evm\"\nat 2 s".into(),
            "3 events not built".into(),
        ]);
        let l = line(&r, None);
        assert!(l.contains(" problems=2 "), "{l}");
        let words: String = serde_json::from_str(l.split_once(" reason=").unwrap().1).unwrap();
        assert_eq!(words, "lost \"evm\"\nat 2 s; 3 events not built");
    }

    #[test]
    fn a_file_per_node() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let at = |spec: &str, rank| JsonOut::new(Some(spec), "ru1", rank).unwrap();
        assert_eq!(at("-", None), JsonOut::Stdout);
        assert_eq!(JsonOut::new(None, "ru1", None).unwrap(), JsonOut::None);
        assert_eq!(
            at(&format!("{d}/r/{{rank}}-{{id}}.json"), Some("2")),
            JsonOut::File(dir.path().join("r/2-ru1.json"))
        );
        assert!(dir.path().join("r").is_dir());
        assert_eq!(
            at(&format!("{d}/{{rank}}.json"), None),
            JsonOut::File(dir.path().join("ru1.json"))
        );
        assert_eq!(
            at(&d.to_string(), None),
            JsonOut::File(dir.path().join("ru1.json"))
        );
        assert_eq!(
            at(&format!("{d}/new/"), None),
            JsonOut::File(dir.path().join("new/ru1.json"))
        );
        assert!(JsonOut::new(Some(""), "ru1", None).is_err());
    }
}

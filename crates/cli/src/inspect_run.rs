//! `evb inspect --run DIR`: whether a run's output folder is whole, judged from the folder
//! alone by its run manifest (docs/formats.md §7): every listed file present and as listed
//! (size, CRC32C, an `.evb` file's ids, its metadata), every triggered event id in exactly
//! one of them (or counted by the manifest as never released), no file that looks like data
//! and that no manifest lists, and the temporary files that BUs which died left behind
//! (`--clean` removes them).

use std::path::{Path, PathBuf};

use evb_formats::manifest::{folder, judge, Judgement, RunManifest};

/// `(first, last)` runs in words: `62..92 (31)`, at most `show` of them.
fn id_runs(runs: &[(u64, u64)], show: usize) -> String {
    let mut v: Vec<String> = runs
        .iter()
        .take(show)
        .map(|&(a, b)| {
            if a == b {
                format!("{a}")
            } else {
                format!("{a}..{b} ({})", (b - a).saturating_add(1))
            }
        })
        .collect();
    if runs.len() > show {
        v.push(format!("and {} more runs", runs.len() - show));
    }
    v.join(", ")
}

/// The manifests in `dir` (`*.manifest.json`), by name.
fn manifests(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .is_some_and(|n| n.ends_with(".manifest.json") && !n.starts_with('.'))
        })
        .collect();
    v.sort();
    v
}

/// Judges every run manifest in `dir`, then the folder's other files; true when each run's
/// files are complete and as listed, its verdict is OK, and no file that looks like data is
/// left that no manifest lists.
pub fn run(dir: &Path, clean: bool) -> bool {
    if !dir.is_dir() {
        println!(
            "{}: {}",
            dir.display(),
            if dir.exists() {
                "not a folder (give the run's folder, where its manifest is)"
            } else {
                "no such folder"
            }
        );
        return false;
    }
    let found = manifests(dir);
    if found.is_empty() {
        println!(
            "{}: no run manifest (<run>.manifest.json): the EVM writes one when a run with a file sink ends",
            dir.display()
        );
        return false;
    }
    let mut all_good = true;
    let mut read = Vec::new();
    for path in found {
        let m: RunManifest = match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        {
            Ok(m) => m,
            Err(e) => {
                println!("{}: not a run manifest: {e}", path.display());
                all_good = false;
                continue;
            }
        };
        let j: Judgement = judge(dir, &m);
        println!(
            "run {}: verdict {}, {} triggered, {} released, {} partial; {} files, {} events",
            m.run,
            m.verdict,
            m.triggered,
            m.released,
            m.partial,
            m.parts.len(),
            j.events
        );
        for p in &m.problems {
            println!("  verdict: {p}");
        }
        let (data, metadata): (Vec<_>, Vec<_>) = j.faults.iter().partition(|f| !f.metadata);
        if j.complete {
            let unreleased = if j.unreleased > 0 {
                format!(" ({} never released, as the manifest counts)", j.unreleased)
            } else {
                String::new()
            };
            println!("  complete: every triggered event is in exactly one intact file{unreleased}");
        } else {
            println!("  INCOMPLETE:");
            for f in &data {
                println!("    - {}: {}", f.file, f.fault);
            }
            if !j.missing.is_empty() {
                println!("    - ids in no file: {}", id_runs(&j.missing, 10));
            }
            if !j.twice.is_empty() {
                println!("    - ids in more than one file: {}", id_runs(&j.twice, 10));
            }
        }
        if !metadata.is_empty() {
            println!("  METADATA NOT AS LISTED:");
            for f in &metadata {
                println!("    - {}: {}", f.file, f.fault);
            }
        }
        if !j.temporaries.is_empty() {
            println!(
                "  {} temporary files of BUs that died or were dropped (never output): {}",
                j.temporaries.len(),
                j.temporaries.join(" ")
            );
            if clean {
                let mut removed = 0;
                for t in &j.temporaries {
                    match std::fs::remove_file(dir.join(t)) {
                        Ok(()) => removed += 1,
                        Err(e) => println!("    cannot remove {t}: {e}"),
                    }
                }
                println!("  removed {removed} temporary files (--clean)");
            } else {
                println!("  (`evb inspect --run DIR --clean` removes them)");
            }
        }
        all_good &= j.as_published() && m.verdict == "OK";
        read.push(m);
    }
    let f = folder(dir, &read);
    if !f.strays.is_empty() {
        let whose = match read.as_slice() {
            [m] => format!("the manifest of run {} does not list", m.run),
            _ => "no manifest here lists".to_string(),
        };
        let n = match f.strays.len() {
            1 => "1 file looks".to_string(),
            n => format!("{n} files look"),
        };
        println!("NOT ONLY THE RUN'S OUTPUT: {n} like data and {whose}:");
        for s in &f.strays {
            println!("  - {}: {}", s.file, s.kind);
        }
        all_good = false;
    }
    if !f.others.is_empty() {
        println!(
            "not judged (not named as data, a manifest or a temporary): {}",
            f.others.join(" ")
        );
    }
    all_good
}

/// `--verify`: the folder's runs proven against their records (docs/formats.md §7.3). Prints
/// what holds and what does not; true when every manifest in `dir` is vouched for by a
/// closed run record that names it and its configuration copy by digest, the copy is as
/// the manifest names it, and the chain of the run id's records is unbroken.
pub fn verify(dir: &Path, records: Option<&Path>) -> bool {
    use evb_formats::evidence;
    let found = manifests(dir);
    let mut good = !found.is_empty();
    for path in found {
        let Ok(bytes) = std::fs::read(&path) else {
            println!("verify: {}: cannot be read", path.display());
            good = false;
            continue;
        };
        let Ok(m) = serde_json::from_slice::<RunManifest>(&bytes) else {
            good = false;
            continue;
        };
        let digest = evidence::sha256_hex(&bytes);
        println!("verify run {}: manifest SHA-256 {}…", m.run, &digest[..16]);
        let Some(c) = &m.config else {
            println!("  NOT PROVEN: the manifest names no configuration copy (written before 2026-11-28?)");
            good = false;
            continue;
        };
        if let Some(why) = evidence::changed(dir, c) {
            println!("  NOT PROVEN: the configuration copy {}: {why}", c.file);
            good = false;
        }
        let file = match records {
            Some(f) => Ok(f.to_path_buf()),
            // (a standby's copy names what only a standby's may: read, not validated)
            None => std::fs::read_to_string(dir.join(&c.file))
                .map_err(|e| e.to_string())
                .and_then(|t| evb_config::Config::parse_unvalidated(&t).map_err(|e| e.to_string()))
                .map_err(|e| format!("the configuration copy cannot be read: {e}"))
                .and_then(|cfg| evb_control::record_file(&cfg)),
        };
        let file = match file {
            Ok(f) => f,
            Err(e) => {
                println!("  NOT PROVEN: where are the run records? {e} (give --records FILE)");
                good = false;
                continue;
            }
        };
        let chain = match evb_control::check_chain(&file) {
            Ok(c) => c,
            Err(e) => {
                println!("  NOT PROVEN: the run records: {e} (give --records FILE)");
                good = false;
                continue;
            }
        };
        let vouching = chain.closed.iter().rev().find_map(|(run, recs)| {
            recs.iter()
                .rev()
                .find(|r| r.manifest_sha256.as_deref() == Some(digest.as_str()))
                .map(|r| (*run, r))
        });
        match vouching {
            Some((run, r)) => {
                println!(
                    "  run record {run} in {} names this manifest ({})",
                    file.display(),
                    r.state
                );
                if r.config_sha256.as_deref() != Some(c.sha256.as_str()) {
                    println!("  NOT PROVEN: run record {run} names another configuration than the copy the manifest lists");
                    good = false;
                }
            }
            None => {
                println!(
                    "  NOT PROVEN: no run record in {} names this manifest as it is (changed after the run, or its record is gone or edited)",
                    file.display()
                );
                good = false;
            }
        }
        for b in &chain.breaks {
            println!("  CHAIN BROKEN: {b}");
            good = false;
        }
    }
    if good {
        println!("verify: proven: each manifest here is named by its run record, with its configuration; the records' chain is whole");
    }
    good
}

//! `--json FILE`, the one convention of every command that writes JSON (run, node, ctl, pub,
//! sub, testbed, sim): the document goes to FILE, or with `-` to stdout. When stdout takes
//! the JSON, the command's words for people (tables, summaries, verdicts) go to stderr, so
//! that stdout is one JSON document a program can read whole: [`claim_stdout`] moves them.

use std::io::Write;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

/// The process's original stdout, kept for the JSON once [`claim_stdout`] sent the rest of
/// the output to stderr.
static JSON_STDOUT: OnceLock<Mutex<std::fs::File>> = OnceLock::new();

/// True for `-`: the JSON on stdout.
pub fn is_stdout(p: &Path) -> bool {
    p.as_os_str() == "-"
}

/// With `--json -` (`arg` is `-`), keeps stdout for the JSON and sends everything else this
/// process prints to stdout to stderr; otherwise does nothing. Call it before anything is
/// printed.
pub fn claim_stdout(arg: Option<&Path>) -> Result<(), String> {
    if !arg.is_some_and(is_stdout) || JSON_STDOUT.get().is_some() {
        return Ok(());
    }
    use std::os::fd::FromRawFd;
    // SAFETY: dup(2) of the standard output, which is open for the process's whole life; the
    // result is checked before use.
    let fd = unsafe { libc::dup(libc::STDOUT_FILENO) };
    if fd < 0 {
        return Err(format!(
            "--json -: stdout: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: `fd` was just made by dup and is owned by nothing else.
    let json = unsafe { std::fs::File::from_raw_fd(fd) };
    let _ = std::io::stdout().flush();
    // SAFETY: dup2(2) onto the standard output: both descriptors are open; afterwards fd 1
    // is the process's stderr, and the original stdout lives on in `json`.
    if unsafe { libc::dup2(libc::STDERR_FILENO, libc::STDOUT_FILENO) } < 0 {
        return Err(format!(
            "--json -: stdout: {}",
            std::io::Error::last_os_error()
        ));
    }
    let _ = JSON_STDOUT.set(Mutex::new(json));
    Ok(())
}

/// Writes `v` (pretty-printed) to `path`, or with `-` to stdout (the one [`claim_stdout`]
/// kept, if it was called).
pub fn write(path: &Path, v: &impl serde::Serialize) -> Result<(), String> {
    let text = serde_json::to_string_pretty(v).map_err(|e| e.to_string())? + "\n";
    if !is_stdout(path) {
        return std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()));
    }
    let r = match JSON_STDOUT.get() {
        Some(f) => {
            let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
            f.write_all(text.as_bytes()).and_then(|()| f.flush())
        }
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes()).and_then(|()| out.flush())
        }
    };
    r.map_err(|e| format!("stdout: {e}"))
}

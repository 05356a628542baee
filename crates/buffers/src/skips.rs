//! Tests that cannot run here say so and are counted: every crate's tests call
//! [`skipped`], and `scripts/test.sh` prints how many were skipped and why at its end (a
//! skip cargo hides on stderr would pass as a test that ran).

use std::io::Write;

/// Test `what` did not run here, because of `why`: said on stderr, and added as one line to
/// the file named by `EVB_SKIP_LOG` (where test.sh counts them) when that is set.
pub fn skipped(what: &str, why: &str) {
    eprintln!("SKIPPED: {what}: {why}");
    let Some(path) = std::env::var_os("EVB_SKIP_LOG") else {
        return;
    };
    // one write per line, appended: tests of one binary run side by side
    let line = format!("{what}: {}\n", why.replace('\n', " "));
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

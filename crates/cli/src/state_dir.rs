//! Per-user state that other local users must not plant or read: the control URL that
//! `evb up` leaves for `evb ctl`. It lives in a private directory — `$XDG_RUNTIME_DIR/evb`
//! when the runtime directory is ours and private, else `<temp>/evb-<uid>` — that is
//! created with mode 0700 and checked before every use (ours, a directory and not a link,
//! no access for group or others). A path in /tmp is predictable: another user can create
//! it first, and a file found there is trusted only when these checks pass.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// This process's user id.
fn uid() -> u32 {
    // /proc/self belongs to the process's user; no unsafe call needed
    fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
}

/// Why `path` is not a private directory of this user, if it is not.
fn not_private_dir(path: &Path) -> Option<String> {
    let m = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) => return Some(format!("{}: {e}", path.display())),
    };
    if m.file_type().is_symlink() {
        return Some(format!("{} is a symbolic link", path.display()));
    }
    if !m.is_dir() {
        return Some(format!("{} is not a directory", path.display()));
    }
    if m.uid() != uid() {
        return Some(format!(
            "{} belongs to uid {}, not to this user (uid {}): another user may have planted it",
            path.display(),
            m.uid(),
            uid()
        ));
    }
    if m.mode() & 0o077 != 0 {
        return Some(format!(
            "{} has mode {:o}: group or others may use it (0700 expected)",
            path.display(),
            m.mode() & 0o7777
        ));
    }
    None
}

/// The private directory, created when missing; an error names what is wrong with it.
pub fn dir() -> Result<PathBuf, String> {
    dir_under(
        std::env::var_os("XDG_RUNTIME_DIR")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from),
        std::env::temp_dir(),
    )
}

fn dir_under(runtime: Option<PathBuf>, temp: PathBuf) -> Result<PathBuf, String> {
    // the runtime directory is used only when it is itself ours and private (XDG's rule)
    let base = match runtime {
        Some(r) if not_private_dir(&r).is_none() => r.join("evb"),
        _ => temp.join(format!("evb-{}", uid())),
    };
    match fs::DirBuilder::new().mode(0o700).create(&base) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", base.display())),
    }
    match not_private_dir(&base) {
        None => Ok(base),
        Some(why) => Err(format!("refusing the state directory: {why}")),
    }
}

/// The name of run id `run_id`'s URL file: characters outside [A-Za-z0-9_-] become `_`.
pub fn url_name(run_id: &str) -> String {
    let safe: String = run_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}.url")
}

/// Writes `text` to `name` in the private directory, atomically (a new 0600 file renamed
/// over the old one): a reader sees the old text or the new, never a part.
pub fn write(name: &str, text: &str) -> Result<PathBuf, String> {
    write_in(&dir()?, name, text)
}

fn write_in(dir: &Path, name: &str, text: &str) -> Result<PathBuf, String> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    fs::rename(&tmp, &path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })?;
    Ok(path)
}

/// Reads `name` from the private directory: `Ok(None)` when there is none; an error when
/// the directory or the file is not private to this user (a planted file is never read).
pub fn read(name: &str) -> Result<Option<String>, String> {
    read_in(&dir()?, name)
}

fn read_in(dir: &Path, name: &str) -> Result<Option<String>, String> {
    let path = dir.join(name);
    let m = match fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    if !m.is_file() || m.uid() != uid() || m.permissions().mode() & 0o022 != 0 {
        return Err(format!(
            "refusing {}: not a regular file of this user writable by it alone",
            path.display()
        ));
    }
    fs::read_to_string(&path)
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Removes `name` from the private directory, if it is there.
pub fn remove(name: &str) {
    if let Ok(d) = dir() {
        let _ = fs::remove_file(d.join(name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("evb-state-test-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
        d
    }

    #[test]
    fn a_fresh_state_directory_is_private_and_round_trips() {
        let t = scratch("fresh");
        let d = dir_under(None, t.clone()).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        let p = write_in(&d, "run.url", "http://127.0.0.1:1/").unwrap();
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        assert_eq!(
            read_in(&d, "run.url").unwrap().as_deref(),
            Some("http://127.0.0.1:1/")
        );
        write_in(&d, "run.url", "http://127.0.0.1:2/").unwrap();
        assert_eq!(
            read_in(&d, "run.url").unwrap().as_deref(),
            Some("http://127.0.0.1:2/")
        );
        assert_eq!(read_in(&d, "other.url").unwrap(), None);
        fs::remove_dir_all(&t).unwrap();
    }

    #[test]
    fn an_open_or_linked_state_directory_is_refused() {
        let t = scratch("open");
        let planted = t.join(format!("evb-{}", uid()));
        fs::create_dir(&planted).unwrap();
        fs::set_permissions(&planted, fs::Permissions::from_mode(0o777)).unwrap();
        let e = dir_under(None, t.clone()).unwrap_err();
        assert!(e.contains("mode 777"), "{e}");
        fs::remove_dir(&planted).unwrap();
        let elsewhere = scratch("elsewhere");
        std::os::unix::fs::symlink(&elsewhere, &planted).unwrap();
        let e = dir_under(None, t.clone()).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        // a runtime directory that is not private is passed over for the temp directory
        fs::remove_file(&planted).unwrap();
        fs::set_permissions(&elsewhere, fs::Permissions::from_mode(0o755)).unwrap();
        let d = dir_under(Some(elsewhere.clone()), t.clone()).unwrap();
        assert_eq!(d, planted);
        fs::remove_dir_all(&t).unwrap();
        fs::remove_dir_all(&elsewhere).unwrap();
    }

    #[test]
    fn a_url_file_others_could_write_is_not_read() {
        let t = scratch("file");
        let d = dir_under(None, t.clone()).unwrap();
        let p = write_in(&d, "run.url", "http://127.0.0.1:1/").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o666)).unwrap();
        let e = read_in(&d, "run.url").unwrap_err();
        assert!(e.contains("refusing"), "{e}");
        fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &p).unwrap();
        assert!(read_in(&d, "run.url").is_err());
        fs::remove_dir_all(&t).unwrap();
    }
}

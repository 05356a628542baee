//! C programs against libevb: where cargo put libevb.so, and `cc` with evb.h.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The library's SONAME: what a program linked with `-levb` asks for at run time.
pub const SONAME: &str = concat!("libevb.so.0.", env!("CARGO_PKG_VERSION_MINOR"));

/// Where cargo put libevb.so (built as a dev-dependency, next to this test's binary), with
/// the SONAME's link beside it as an install makes it (cargo makes only libevb.so).
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let dir = [deps.to_path_buf(), deps.parent().unwrap().to_path_buf()]
        .into_iter()
        .find(|d| d.join("libevb.so").exists())
        .expect("libevb.so next to the test binary");
    let link = dir.join(SONAME);
    if std::fs::symlink_metadata(&link).is_err() {
        // several tests may make it at once: one wins, the others find it made
        let _ = std::os::unix::fs::symlink("libevb.so", &link);
    }
    dir
}

/// Compiles one of the C examples into `dir`; `None` (test skipped) when there is no `cc`.
pub fn compile(name: &str, dir: &Path) -> Option<PathBuf> {
    compile_c(&format!("examples/{name}.c"), dir)
}

/// Compiles the C program `source` (a path in crates/capi) into `dir`, named after it.
pub fn compile_c(source: &str, dir: &Path) -> Option<PathBuf> {
    let capi = Path::new(env!("CARGO_MANIFEST_DIR")).join("../capi");
    let name = Path::new(source).file_stem().unwrap().to_str().unwrap();
    let lib = lib_dir();
    let out = dir.join(name);
    let r = Command::new("cc")
        .args([
            // as a user may build them: strict C11, every warning an error, no feature
            // macros from outside (a file asks for POSIX itself)
            "-std=c11",
            "-Wpedantic",
            "-Wall",
            "-Wextra",
            "-Werror",
        ])
        .arg(capi.join(source))
        .arg("-I")
        .arg(capi.join("include"))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-levb", "-o"])
        .arg(&out)
        .output();
    match r {
        Ok(o) => {
            assert!(o.status.success(), "cc {name}.c: {}", super::text(&o));
            Some(out)
        }
        Err(e) => {
            eprintln!("no C compiler ({e}): test skipped");
            None
        }
    }
}

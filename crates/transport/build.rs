//! Compiles the libfabric shim (csrc/evb_ofi.c) when libfabric's headers are present.
//!
//! libfabric itself is never linked: the shim loads `libfabric.so.1` at run time. Without the
//! headers (Debian: `libfabric-dev`) the crate still builds, with the `evb_ofi_stub` cfg: the
//! `ofi` transport then reports that it was not built in. `EVB_OFI=0` forces that build.

use std::path::{Path, PathBuf};
use std::process::Command;

fn include_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(d) = std::env::var("EVB_LIBFABRIC_INCLUDE") {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(out) = Command::new("pkg-config")
        .args(["--cflags-only-I", "libfabric"])
        .output()
    {
        if out.status.success() {
            for flag in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Some(d) = flag.strip_prefix("-I") {
                    dirs.push(PathBuf::from(d));
                }
            }
        }
    }
    dirs.push("/usr/include".into());
    dirs.push("/usr/local/include".into());
    dirs
}

fn main() {
    println!("cargo::rustc-check-cfg=cfg(evb_ofi_stub)");
    println!("cargo:rerun-if-changed=csrc/evb_ofi.c");
    println!("cargo:rerun-if-env-changed=EVB_OFI");
    println!("cargo:rerun-if-env-changed=EVB_LIBFABRIC_INCLUDE");
    let disabled = std::env::var("EVB_OFI").is_ok_and(|v| v == "0");
    let found = include_dirs()
        .into_iter()
        .find(|d| Path::new(d).join("rdma/fabric.h").is_file());
    match found {
        Some(dir) if !disabled => {
            println!(
                "cargo:rerun-if-changed={}",
                dir.join("rdma/fabric.h").display()
            );
            cc::Build::new()
                .file("csrc/evb_ofi.c")
                .include(dir)
                .flag_if_supported("-Wno-unused-parameter")
                .flag_if_supported("-Wno-missing-field-initializers")
                .compile("evb_ofi");
            // dlopen/dlsym (part of libc since glibc 2.34; libdl before).
            println!("cargo:rustc-link-lib=dl");
        }
        _ => {
            if !disabled {
                println!(
                    "cargo:warning=libfabric headers (rdma/fabric.h) not found: the ofi transport \
                     is not built in (Debian: apt-get install libfabric-dev)"
                );
            }
            println!("cargo:rustc-cfg=evb_ofi_stub");
        }
    }
}

//! libevb.so's link: its SONAME (`libevb.so.0.<minor>` before 1.0, whose minor versions
//! may change the ABI; `libevb.so.<major>` after) and no debug information (the Rust
//! crates' debug info would make it ~26 MB; the library is a release artefact).

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_default();
    let minor = std::env::var("CARGO_PKG_VERSION_MINOR").unwrap_or_default();
    let soname = if major == "0" {
        format!("libevb.so.0.{minor}")
    } else {
        format!("libevb.so.{major}")
    };
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--strip-debug");
    println!("cargo:rerun-if-changed=build.rs");
}

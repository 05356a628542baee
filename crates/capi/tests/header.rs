//! include/evb.h is what cbindgen makes of the sources now (EVB_BLESS=1 rewrites it).

use std::path::Path;

#[test]
fn the_committed_header_is_up_to_date() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cfg = cbindgen::Config::from_file(dir.join("cbindgen.toml")).unwrap();
    let mut made = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(cfg)
        .generate()
        .expect("cbindgen parses the sources")
        .write(&mut made);
    let made = String::from_utf8(made).unwrap();
    let path = dir.join("include/evb.h");
    if std::env::var_os("EVB_BLESS").is_some() {
        std::fs::write(&path, &made).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == made,
        "{} is out of date: run EVB_BLESS=1 cargo test -p evb-capi --test header",
        path.display()
    );
}

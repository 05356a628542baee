//! What makes a run's folder and its record evidence (docs/formats.md §7.3): the
//! configuration the run ran, written beside its files (`<run>.config.toml`, without the
//! secret) and named with its SHA-256 in the manifest; SHA-256 digests of whole files for
//! the run record (which names the manifest's and the configuration's) and for the chain of
//! run records of one run id.

use std::io::{Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A file of the run that is not data, named with its size and digest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ManifestFile {
    pub file: String,
    pub bytes: u64,
    /// SHA-256 of the whole file, lowercase hex.
    pub sha256: String,
}

/// The name of the copy of run `run`'s configuration in its folder.
pub fn config_name(run: &str) -> String {
    format!("{run}.config.toml")
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// SHA-256 of the file at `path` and its size, read once.
pub fn sha256_file(path: &Path) -> std::io::Result<(String, u64)> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((hex(&h.finalize()), n))
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `text` (the run's configuration, its secret left out by the caller) as
/// `<run>.config.toml` in `dir` (temporary name, synced, renamed) and names it.
pub fn write_config(dir: &Path, run: &str, text: &str, mode: u32) -> std::io::Result<ManifestFile> {
    let name = config_name(run);
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = crate::events::create_file(&tmp, mode)?;
    f.write_all(text.as_bytes())?;
    f.sync_data()?;
    std::fs::rename(&tmp, dir.join(&name))?;
    Ok(ManifestFile {
        file: name,
        bytes: text.len() as u64,
        sha256: sha256_hex(text.as_bytes()),
    })
}

/// Whether the file `dir/f.file` is still the one named: `None` when it is, else why not.
pub fn changed(dir: &Path, f: &ManifestFile) -> Option<String> {
    match sha256_file(&dir.join(&f.file)) {
        Err(e) => Some(format!("cannot be read: {e}")),
        Ok((_, n)) if n != f.bytes => Some(format!("{n} bytes, listed with {}", f.bytes)),
        Ok((d, _)) if d != f.sha256 => Some(format!(
            "changed: SHA-256 {}…, listed {}…",
            &d[..12],
            &f.sha256[..f.sha256.len().min(12)]
        )),
        Ok(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_configuration_is_named_and_a_flipped_byte_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let f = write_config(dir.path(), "r", "[run]\nid = \"r\"\n", 0o600).unwrap();
        assert_eq!(f.file, "r.config.toml");
        assert_eq!(changed(dir.path(), &f), None);
        // the digest of a known text (sha256sum of the same bytes)
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let p = dir.path().join("r.config.toml");
        let mut b = std::fs::read(&p).unwrap();
        b[3] ^= 1;
        std::fs::write(&p, &b).unwrap();
        assert!(changed(dir.path(), &f).unwrap().contains("changed"));
    }
}

//! A closed data file's size and CRC32C, for a writer that did not see all of its file's
//! bytes go by (HDF5's library lays out its files itself). Where the writer knows the CRC32C
//! of some stretches of the file (the HDF5 chunks it handed the library whole, and where the
//! library put them), only the rest is read back, and the stretches' CRCs are joined in
//! (crc32c combination): the bytes of a file of large events are then read once, when they
//! are written, not again to be checked. Runs on the thread that makes files durable.

use std::fs::File;

use crate::crc_join::crc32c_join;

/// A stretch of a file whose CRC32C is known: its offset, its length and its CRC32C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Known {
    pub(crate) at: u64,
    pub(crate) len: u64,
    pub(crate) crc: u32,
}

/// The size and CRC32C of `f`, a file that no one writes any more, reading only what
/// `known` does not cover. `known` that does not fit the file (overlapping stretches, one
/// past its end) is ignored, and the whole file read.
pub(crate) fn size_and_crc(f: &File, known: &[Known]) -> std::io::Result<(u64, u32)> {
    let size = f.metadata()?.len();
    let mut known = known.to_vec();
    known.sort_by_key(|k| k.at);
    let fits = known
        .windows(2)
        .all(|w| w[0].at.saturating_add(w[0].len) <= w[1].at)
        && known
            .last()
            .is_none_or(|k| k.at.checked_add(k.len).is_some_and(|end| end <= size));
    if !fits {
        known.clear();
    }
    let (mut at, mut crc) = (0u64, 0u32);
    let mut buf = Vec::new();
    for k in &known {
        crc = read_crc(f, at, k.at - at, crc, &mut buf)?;
        crc = crc32c_join(crc, k.crc, k.len);
        at = k.at + k.len;
    }
    crc = read_crc(f, at, size - at, crc, &mut buf)?;
    Ok((size, crc))
}

/// `crc` carried over bytes `at..at + len` of `f`, read with `pread` into `buf`.
fn read_crc(
    f: &File,
    mut at: u64,
    len: u64,
    mut crc: u32,
    buf: &mut Vec<u8>,
) -> std::io::Result<u32> {
    use std::os::unix::fs::FileExt;
    let end = at + len;
    if len > 0 && buf.is_empty() {
        buf.resize(1 << 20, 0);
    }
    while at < end {
        let want = usize::try_from(end - at)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = f.read_at(&mut buf[..want], at)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        at += n as u64;
    }
    Ok(crc)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CRC and size are the file's bytes', whatever stretches are known (none, some,
    /// back to back, at either end) and when what is said to be known does not fit.
    #[test]
    fn the_crc_is_the_files_bytes_whatever_is_known() {
        let dir = tempfile::tempdir().unwrap();
        let len = (3 << 20) + 12345;
        let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let p = dir.path().join("f");
        std::fs::write(&p, &bytes).unwrap();
        let f = File::open(&p).unwrap();
        let k = |at: usize, n: usize| Known {
            at: at as u64,
            len: n as u64,
            crc: crc32c::crc32c(&bytes[at..at + n]),
        };
        let want = (len as u64, crc32c::crc32c(&bytes));
        for known in [
            vec![],
            vec![k(0, len)],
            vec![k(100, 65536), k(200_000, 65536)],
            // out of order, back to back, at both ends
            vec![k(len - 10, 10), k(0, 4096), k(4096, 1 << 20)],
            // overlapping, and past the end: ignored, all read
            vec![k(0, 100), k(50, 100)],
            vec![Known {
                at: len as u64 - 5,
                len: 10,
                crc: 0,
            }],
        ] {
            assert_eq!(size_and_crc(&f, &known).unwrap(), want, "{known:?}");
        }
        let empty = dir.path().join("e");
        std::fs::write(&empty, b"").unwrap();
        assert_eq!(
            size_and_crc(&File::open(&empty).unwrap(), &[]).unwrap(),
            (0, 0)
        );
    }
}

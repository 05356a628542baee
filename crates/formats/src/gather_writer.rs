//! A file written from gathered slices: small pieces are staged and go out together (one
//! system call for a run of small events), a large body goes straight from where its bytes
//! lie (the event's pages) with one vectored write, the staged bytes ahead of it; no byte of a
//! large body is copied in user space.

use std::fs::File;
use std::io::{IoSlice, Seek, Write};

/// Staged bytes are written out once they pass this (a `BufWriter`'s usual 1 MiB).
const STAGE_LIMIT: usize = 1 << 20;

pub(crate) struct GatherWriter {
    file: File,
    /// Bytes given and not yet written, in file order.
    staged: Vec<u8>,
}

impl GatherWriter {
    pub(crate) fn new(file: File) -> GatherWriter {
        GatherWriter {
            file,
            staged: Vec::with_capacity(64 << 10),
        }
    }

    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// Appends `b` to the staged bytes; writes them out once they pass the limit.
    pub(crate) fn stage(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.staged.extend_from_slice(b);
        if self.staged.len() >= STAGE_LIMIT {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the staged bytes and then `parts`, in that order, with as few vectored writes
    /// as the kernel takes (a short write goes on from where it stopped).
    pub(crate) fn write_gathered(&mut self, parts: &[&[u8]]) -> std::io::Result<()> {
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(parts.len() + 1);
        if !self.staged.is_empty() {
            slices.push(IoSlice::new(&self.staged));
        }
        slices.extend(
            parts
                .iter()
                .filter(|p| !p.is_empty())
                .map(|p| IoSlice::new(p)),
        );
        write_all_vectored(&mut self.file, &mut slices)?;
        self.staged.clear();
        Ok(())
    }

    /// Writes the staged bytes.
    pub(crate) fn flush(&mut self) -> std::io::Result<()> {
        if !self.staged.is_empty() {
            self.file.write_all(&self.staged)?;
            self.staged.clear();
        }
        Ok(())
    }

    /// Forgets the staged bytes and cuts the file to `len` bytes, the next write at its end.
    pub(crate) fn cut_back(&mut self, len: u64) -> std::io::Result<()> {
        self.staged.clear();
        self.file.set_len(len)?;
        self.file.seek(std::io::SeekFrom::Start(len)).map(|_| ())
    }
}

/// Writes every byte of `slices` (`writev` takes at most IOV_MAX slices and may write less
/// than asked: it goes on from where the kernel stopped).
fn write_all_vectored(f: &mut impl Write, mut slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    while !slices.is_empty() {
        match f.write_vectored(slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that takes at most `max` bytes and at most 3 slices per call (a kernel's
    /// short writes and IOV_MAX, made small).
    struct Short {
        out: Vec<u8>,
        max: usize,
        calls: usize,
    }

    impl Write for Short {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.write_vectored(&[IoSlice::new(b)])
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
            self.calls += 1;
            if self.calls.is_multiple_of(4) {
                return Err(std::io::ErrorKind::Interrupted.into());
            }
            let mut n = 0;
            for b in bufs.iter().take(3) {
                let take = b.len().min(self.max - n);
                self.out.extend_from_slice(&b[..take]);
                n += take;
                if n == self.max {
                    break;
                }
            }
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Short and interrupted writes lose and repeat nothing: every byte lands once, in order.
    #[test]
    fn short_writes_go_on_where_they_stopped() {
        let parts: Vec<Vec<u8>> = (0..40u8)
            .map(|i| (0..(i as usize * 37) % 300).map(|k| i ^ k as u8).collect())
            .collect();
        let whole: Vec<u8> = parts.concat();
        for max in [1, 7, 64, 1000, 1 << 20] {
            let mut w = Short {
                out: Vec::new(),
                max,
                calls: 0,
            };
            let mut slices: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
            write_all_vectored(&mut w, &mut slices).unwrap();
            assert_eq!(w.out, whole, "at most {max} bytes a write");
        }
    }

    /// Staged bytes, gathered slices and a cut back land in the file as given.
    #[test]
    fn staged_and_gathered_bytes_land_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let mut w = GatherWriter::new(File::create(&p).unwrap());
        w.stage(b"head").unwrap();
        let big = vec![7u8; 3 << 20];
        w.write_gathered(&[b"|", &big[..1 << 20], &[], &big[1 << 20..]])
            .unwrap();
        w.stage(b"tail").unwrap();
        w.flush().unwrap();
        let mut want = b"head|".to_vec();
        want.extend_from_slice(&big);
        want.extend_from_slice(b"tail");
        assert_eq!(std::fs::read(&p).unwrap(), want);
        w.stage(b"never written").unwrap();
        w.cut_back(5).unwrap();
        w.stage(b"again").unwrap();
        w.flush().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"head|again");
    }
}

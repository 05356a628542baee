//! Where the `.evb` writer stops staging event bodies and writes them from their pages
//! (`DIRECT_BODY` in events.rs): for each body size, the same bytes written to a file in DIR
//! (a) copied into a 1 MiB staging buffer written when full, as a `BufWriter` does, and
//! (b) one vectored write per event (a 32-byte header, then the body as 4 pieces of its
//! pages), in alternating rounds; prints the medians in GB/s and b/a.
//!
//!   cargo run --release -p evb-formats --example stage_or_gather -- DIR [MB_PER_SIZE] [ROUNDS]

use std::io::{IoSlice, Write};
use std::time::Instant;

fn staged(f: &mut std::fs::File, head: &[u8], pieces: &[&[u8]], n: usize) -> std::io::Result<()> {
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    for _ in 0..n {
        for p in std::iter::once(head).chain(pieces.iter().copied()) {
            if buf.len() + p.len() > buf.capacity() {
                f.write_all(&buf)?;
                buf.clear();
            }
            buf.extend_from_slice(p);
        }
    }
    f.write_all(&buf)
}

fn gathered(f: &mut std::fs::File, head: &[u8], pieces: &[&[u8]], n: usize) -> std::io::Result<()> {
    for _ in 0..n {
        let mut slices: Vec<IoSlice<'_>> = std::iter::once(head)
            .chain(pieces.iter().copied())
            .map(IoSlice::new)
            .collect();
        let mut s = &mut slices[..];
        while !s.is_empty() {
            let k = f.write_vectored(s)?;
            IoSlice::advance_slices(&mut s, k);
        }
    }
    Ok(())
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(args.get(1).map_or("/dev/shm", |s| s.as_str()));
    let mb: usize = args.get(2).map_or(512, |s| s.parse().expect("MB"));
    let rounds: usize = args.get(3).map_or(5, |s| s.parse().expect("rounds"));
    let path = dir.join(format!("stage-or-gather.{}", std::process::id()));
    // pages of the events: distinct memory, so neither way reads from the cache only
    let pages: Vec<u8> = (0..64usize << 20).map(|i| (i * 31) as u8).collect();
    let head = [0xabu8; 32];
    println!("size      staged GB/s  gathered GB/s  gathered/staged");
    for size in [
        2usize << 10,
        8 << 10,
        16 << 10,
        32 << 10,
        64 << 10,
        256 << 10,
        1 << 20,
    ] {
        let n = (mb << 20) / size;
        let q = size / 4;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for r in 0..rounds {
            for way in [0, 1] {
                let at = (r * 7919 * size) % (pages.len() - size);
                let body = &pages[at..at + size];
                let pieces: Vec<&[u8]> = body.chunks(q.max(1)).collect();
                let mut f = std::fs::File::create(&path)?;
                let t = Instant::now();
                if way == 0 {
                    staged(&mut f, &head, &pieces, n)?;
                } else {
                    gathered(&mut f, &head, &pieces, n)?;
                }
                let gbs = (n * (size + 32)) as f64 / t.elapsed().as_secs_f64() / 1e9;
                drop(f);
                std::fs::remove_file(&path)?;
                if way == 0 {
                    a.push(gbs)
                } else {
                    b.push(gbs)
                }
            }
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (ma, mb_) = (med(&mut a), med(&mut b));
        println!(
            "{:>7} KiB {ma:>10.3} {mb_:>14.3} {:>16.3}",
            size >> 10,
            mb_ / ma
        );
    }
    Ok(())
}

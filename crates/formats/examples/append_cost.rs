//! The `.evb` writer's own CPU per event, apart from the kernel's: events of two fragments
//! (each a chain of 256 KiB pages, as a BU holds them) appended into files of 16 events in
//! DIR, each file completed (synced, renamed); prints the process's user and system CPU
//! microseconds per event (from /proc/self/stat). User time is the writer's own work (CRCs,
//! copies); system time the kernel's (the copy into the page cache, the syncs).
//!
//!   cargo run --release -p evb-formats --example append_cost -- DIR [EVENTS] [FRAGMENT_KIB] [checked|packed] [PIECE_BYTES]
//!
//! `checked`: the fragments' payload CRCs are taken as checked (a BU with `verify` crc or
//! full): the writer reads no payload byte. `packed` (built with `--features hdf5`): the
//! HDF5 sink's packed layout instead of `.evb`, its files completed as the BU completes
//! them (the index and close, then the CRC32C and sync of the prepare job). PIECE_BYTES: the
//! bytes of a fragment each page holds (default a whole page; a BU's pages hold 256 KiB less
//! the message's head that came with them, e.g. 262080).

use evb_buffers::{Chain, Pool};
use evb_formats::events::EventFileWriter;
use evb_wire::FragmentHeader;

/// (user, system) CPU seconds of this process so far.
fn cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // fields 14 and 15 of the line (utime, stime), in clock ticks of 1/100 s
    let tick = |k: usize| f[k].parse::<f64>().expect("ticks") / 100.0;
    (tick(11), tick(12))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(args.get(1).map_or("/dev/shm", |s| s.as_str()));
    let events: u64 = args.get(2).map_or(2000, |s| s.parse().expect("events"));
    let kib: usize = args.get(3).map_or(512, |s| s.parse().expect("KiB"));
    let checked = args.get(4).is_some_and(|s| s == "checked");
    let packed = args.get(4).is_some_and(|s| s == "packed");
    let page = 256 << 10;
    let piece: usize = args
        .get(5)
        .map_or(page, |s| s.parse().expect("piece bytes"));
    assert!(piece > 0 && piece <= page, "PIECE_BYTES: 1 to {page}");
    let pool = Pool::new("pages", page, 4 * (kib * 1024).div_ceil(piece) + 4);
    let frags: Vec<(FragmentHeader, Chain)> = (0..2u16)
        .map(|src| {
            let bytes: Vec<u8> = (0..kib << 10)
                .map(|i| (i * 7 + src as usize) as u8)
                .collect();
            let mut c = Chain::new();
            for p in bytes.chunks(piece) {
                c.push(pool.try_alloc().unwrap().append(p).unwrap());
            }
            let h = FragmentHeader {
                event_id: 0,
                trigger_number: 0,
                source_id: src,
                flags: 0,
                payload_size: c.len() as u32,
                payload_crc: c.crc32c(),
            };
            (h, c)
        })
        .collect();
    let refs: Vec<(FragmentHeader, &Chain)> = frags.iter().map(|(h, c)| (*h, c)).collect();
    let out = dir.join(format!("append-cost.{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let (u0, s0) = cpu();
    let t = std::time::Instant::now();
    if packed {
        append_packed(&out, events, &refs);
    }
    let mut w = None;
    for e in (0..events).filter(|_| !packed) {
        let seq = (e / 16) as u32;
        let writer = w.get_or_insert_with(|| {
            #[allow(unused_mut)]
            let mut w = EventFileWriter::create(&out, "cost", 0, seq).unwrap();
            if checked {
                w.payload_crcs_checked(true);
            }
            w
        });
        writer.append_event(e, e as u32, 0, &refs).unwrap();
        writer.flush_events().unwrap();
        if e % 16 == 15 {
            w.take().unwrap().finish().unwrap();
        }
    }
    if let Some(mut w) = w {
        w.finish().unwrap();
    }
    let wall = t.elapsed().as_secs_f64();
    let (u1, s1) = cpu();
    std::fs::remove_dir_all(&out).unwrap();
    let per = |x: f64| x / events as f64 * 1e6;
    let gb = events as f64 * (2 * (kib << 10)) as f64 / 1e9;
    println!(
        "{events} events of 2 x {kib} KiB{}: user {:.1} us/event ({:.3} s/GB), system {:.1} us/event ({:.3} s/GB), {:.3} GB/s",
        match (checked, packed) {
            (_, true) => ", HDF5 packed",
            (true, _) => ", CRCs checked",
            _ => "",
        },
        per(u1 - u0),
        (u1 - u0) / gb,
        per(s1 - s0),
        (s1 - s0) / gb,
        gb / wall
    );
}

/// The packed HDF5 layout's files of 16 events, each completed as the BU's sink does.
#[cfg(feature = "hdf5")]
fn append_packed(out: &std::path::Path, events: u64, refs: &[(FragmentHeader, &Chain)]) {
    use evb_formats::events::PartWriter;
    use evb_formats::hdf5_events::{Hdf5EventWriter, Hdf5Layout};
    let mut w: Option<Hdf5EventWriter> = None;
    let complete = |mut w: Hdf5EventWriter| {
        if let Some(job) = w.begin_prepare().unwrap() {
            job.run().unwrap();
            w.prepared();
        }
        w.publish().unwrap();
    };
    for e in 0..events {
        let writer = w.get_or_insert_with(|| {
            Hdf5EventWriter::create(
                out,
                "cost",
                0,
                (e / 16) as u32,
                0o600,
                None,
                "event",
                Hdf5Layout::Packed,
            )
            .unwrap()
        });
        writer.append_event(e, e as u32, 0, refs).unwrap();
        writer.flush_events().unwrap();
        if e % 16 == 15 {
            complete(w.take().unwrap());
        }
    }
    if let Some(w) = w {
        complete(w);
    }
}

#[cfg(not(feature = "hdf5"))]
fn append_packed(_: &std::path::Path, _: u64, _: &[(FragmentHeader, &Chain)]) {
    panic!("`packed` needs the example built with --features hdf5");
}

//! The `files` fuzz target: data files (FED fragments, evb framed records, built-event
//! files). Shared by `fuzz_targets/files.rs` (cargo-fuzz) and the stable replay test
//! `crates/formats/tests/fuzz_replay.rs`.

use evb_buffers::{Chain, Pool};
use evb_formats::events::{EventFile, EventFileWriter};
use evb_formats::{fed, framed};
use evb_wire::{FragmentHeader, FLAG_GENERATED};

/// Every reader over `data`: errors, or records inside the data.
pub fn check(data: &[u8]) {
    if let Ok(ranges) = fed::split(data) {
        let mut end = 0;
        for r in ranges {
            assert!(r.start >= end && r.end <= data.len() && r.start < r.end);
            end = r.end;
            let _ = fed::validate(&data[r.clone()], r.start, Some(841));
        }
    }
    let mut at = 0;
    while let Ok((rec, _)) = framed::read_at(data, at) {
        assert!(rec.payload.end > at && rec.payload.end <= data.len());
        at = rec.payload.end;
    }
    if let Ok(f) = EventFile::parse(data.to_vec(), "fuzz".into()) {
        for ev in f.take(1000).flatten() {
            let n: usize = ev.fragments.iter().map(|(_, p)| p.len()).sum();
            assert!(n <= data.len());
        }
    }
}

/// A FED file, a framed file and a built-event file, all valid.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut fed_file = Vec::new();
    for k in 0..4u32 {
        let words: Vec<u64> = (0..k as u64 * 5).map(|w| w << 8 | 841).collect();
        fed_file.extend(fed::build(k + 1, 841, &words));
    }
    let framed_file: Vec<u8> = (0..4u32)
        .flat_map(|k| framed::encode(k, &vec![k as u8; k as usize * 13]))
        .collect();
    let dir = std::env::temp_dir().join(format!("evb-fuzz-seed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pool = Pool::new("seed", 4096, 8);
    let mut w = EventFileWriter::create(&dir, "seed", 0, 0).unwrap();
    for ev in 0..3u64 {
        let payload = vec![ev as u8; 20 + ev as usize];
        let h = FragmentHeader {
            event_id: ev,
            trigger_number: ev as u32,
            source_id: 841,
            flags: FLAG_GENERATED,
            payload_size: payload.len() as u32,
            payload_crc: crc32c::crc32c(&payload),
        };
        let mut b = pool.try_alloc().unwrap();
        let chain = Chain::from_slice(b.append(&payload).unwrap());
        w.write_event(ev, ev as u32, 0, &[(h, &chain)]).unwrap();
    }
    w.finish().unwrap();
    let file = dir.join("seed_bu0_000000.evb");
    let events = std::fs::read(&file).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    vec![fed_file, framed_file, events]
}

//! Data files: FED fragments, evb framed records, built-event files.
#![no_main]
use evb_formats::events::EventFile;
use evb_formats::{fed, framed};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(ranges) = fed::split(data) {
        for r in ranges {
            let _ = fed::validate(&data[r.clone()], r.start, Some(841));
        }
    }
    let mut at = 0;
    while let Ok((rec, _)) = framed::read_at(data, at) {
        at = rec.payload.end;
    }
    if let Ok(f) = EventFile::parse(data.to_vec(), "fuzz".into()) {
        for _ in f.take(1000) {}
    }
});

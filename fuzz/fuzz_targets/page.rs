//! A Messages frame's payload (a page of messages, fragments included) as received.
#![no_main]
use evb_buffers::{Chain, Pool};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let count = u32::from_le_bytes(data[..4].try_into().unwrap()) % 64;
    // split across blocks at an input-chosen size, as a socket read would
    let step = 1 + data[0] as usize % 97;
    let pool = Pool::new("fuzz", 4096, (data.len() / step + 2).max(1));
    let mut chain = Chain::new();
    for piece in data[4..].chunks(step) {
        let mut w = pool.try_alloc().unwrap();
        chain.push(w.append(piece).unwrap());
    }
    let mut out = Vec::new();
    let _ = evb_messaging::split_messages(&chain, count, &mut out);
});

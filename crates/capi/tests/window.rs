//! `evb_decode_window`, called as C would call it: a window fragment's window and frames
//! (each payload's place in the fragment, no copy), too little room answered with the count
//! needed, damaged input and NULLs refused with their codes.

use std::ffi::CStr;
use std::ptr::null_mut;

use evb::*;
use evb_wire::window::{window_directory_len, TimeFrameHeader, WindowHeader, WindowStatus};

/// A window fragment of `payloads` (one frame of 100 ticks each from tick 1000, source 4).
fn fragment(payloads: &[&[u8]]) -> Vec<u8> {
    let frames: Vec<Vec<u8>> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut h = TimeFrameHeader {
                begin: 1000 + 100 * i as u64,
                end: 1100 + 100 * i as u64,
                source_id: 4,
                flags: 0,
                crc: 0,
            };
            h.crc = h.crc_of([*p]);
            let mut v = h.encode().to_vec();
            v.extend_from_slice(p);
            v
        })
        .collect();
    let mut out = WindowHeader {
        begin: 1000,
        end: 1000 + 100 * payloads.len() as u64,
        core_end: 1000 + 100 * payloads.len() as u64,
        status: WindowStatus::Late,
        frames: frames.len() as u32,
    }
    .encode()
    .to_vec();
    let mut offset = 0u32;
    for f in &frames {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        offset += f.len() as u32;
    }
    assert_eq!(out.len(), window_directory_len(frames.len()));
    frames.iter().for_each(|f| out.extend_from_slice(f));
    out
}

#[test]
fn a_window_fragment_is_read_in_place_and_damage_is_refused() {
    let data = fragment(&[b"first", b"", b"third frame"]);
    let mut w = EvbWindow {
        begin: 0,
        end: 0,
        core_end: 0,
        status: 9,
        frames: 0,
    };
    let empty = EvbFrame {
        begin: 0,
        end: 0,
        source_id: 0,
        flags: 0,
        offset: 0,
        length: 0,
    };
    let mut frames = [empty; 3];
    // too little room: the count needed, nothing written past it
    // SAFETY: data is valid for its length, w for a write, frames for 2 writes.
    let rc =
        unsafe { evb_decode_window(data.as_ptr(), data.len(), &mut w, frames.as_mut_ptr(), 2) };
    assert_eq!((rc, w.frames), (EVB_ERR_SIZE, 3));
    // SAFETY: as above, room for 3.
    let rc =
        unsafe { evb_decode_window(data.as_ptr(), data.len(), &mut w, frames.as_mut_ptr(), 3) };
    assert_eq!(rc, EVB_OK);
    assert_eq!(
        (w.begin, w.end, w.core_end, w.status),
        (1000, 1300, 1300, 1)
    );
    let got: Vec<(u64, &[u8])> = frames
        .iter()
        .map(|f| (f.begin, &data[f.offset..f.offset + f.length]))
        .collect();
    assert_eq!(
        got,
        vec![
            (1000, &b"first"[..]),
            (1100, &b""[..]),
            (1200, &b"third frame"[..])
        ]
    );
    assert!(frames
        .iter()
        .all(|f| f.source_id == 4 && f.end == f.begin + 100));
    // every byte flipped in a frame's payload: its CRC refuses it, saying so
    for i in window_directory_len(3)..data.len() {
        let mut bad = data.clone();
        bad[i] ^= 0x20;
        // SAFETY: as above.
        let rc =
            unsafe { evb_decode_window(bad.as_ptr(), bad.len(), &mut w, frames.as_mut_ptr(), 3) };
        assert_eq!(rc, EVB_ERR_ARG, "byte {i}");
    }
    // SAFETY: evb_last_error returns a NUL-terminated string valid until the next call.
    let why = unsafe { CStr::from_ptr(evb_last_error()) }
        .to_string_lossy()
        .into_owned();
    assert!(why.starts_with("not a window fragment"), "{why}");
    // SAFETY: NULLs are answered, never read or written.
    let rc = unsafe { evb_decode_window(data.as_ptr(), data.len(), null_mut(), null_mut(), 0) };
    assert_eq!(rc, EVB_ERR_ARG);
}

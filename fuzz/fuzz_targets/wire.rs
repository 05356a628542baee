//! Frame headers, handshakes, rejects, fragment headers and message bodies from raw bytes.
#![no_main]
use evb_wire::*;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = FrameHeader::decode(data, 1 << 24);
    if let Ok(h) = Hello::decode(data) {
        // whatever decodes must encode back to the same bytes
        assert_eq!(h.encode().unwrap(), data);
    }
    let _ = Reject::decode(data);
    if let Ok(h) = FragmentHeader::decode(data) {
        assert_eq!(&h.encode()[..], &data[..FRAGMENT_HEADER_LEN]);
    }
    if let Some((&t, body)) = data.split_first() {
        if let Ok(mt) = MessageType::from_u16(t as u16 % 0x20) {
            if let Ok(m) = Message::decode(mt, body) {
                assert_eq!(&m.encode()[MESSAGE_HEADER_LEN..], body);
            }
        }
    }
});

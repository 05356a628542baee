//! The `shm` fuzz target: one packet as the shm transport receives it from a peer, on its
//! socket or out of its FRAME ring (`evb_transport::shm::codec`). Shared by
//! `fuzz_targets/shm.rs` (cargo-fuzz) and the stable replay test
//! `crates/transport/tests/fuzz_replay.rs`.

use evb_transport::shm::codec::{
    handshake_payload, pool_packet, return_packet, ring_packet, Control, Desc, FrameHead, Packet,
    Seg, DOORBELL, FRAME_HEAD, TAG_FRAME,
};
use evb_wire::FrameType;

/// Input: the packet. Decoding must refuse it with an error or give a packet that encodes
/// back to the same bytes (FRAME, RING) or to one that decodes to the same value (POOL,
/// RETURN, DOORBELL, whose padding and tails are not read); reading it piece by piece, as
/// the transport does, must agree; a handshake payload is only ever read from a whole
/// packet of inline segments.
pub fn check(data: &[u8]) {
    let decoded = Packet::decode(data);
    if let Ok(p) = &decoded {
        let again = p.encode();
        match p {
            Packet::Frame { .. } | Packet::Control(Control::Ring { .. }) => {
                assert_eq!(again, data)
            }
            Packet::Control(c) => {
                let back = Control::decode(&again).expect("an encoded packet decodes");
                assert_eq!(format!("{back:?}"), format!("{c:?}"));
            }
        }
    }
    if data.first() != Some(&TAG_FRAME) {
        return;
    }
    // piece by piece, as the transport reads a FRAME packet
    let piecewise = FrameHead::decode(data).and_then(|head| {
        let mut at = FRAME_HEAD;
        let mut segs = Vec::new();
        for _ in 0..head.segments {
            let s = Seg::decode(data, at)?;
            at += s.wire_len();
            segs.push(s);
        }
        Ok((head, segs, at))
    });
    match (&decoded, &piecewise) {
        (Ok(Packet::Frame { head, segments }), Ok((h, s, at))) => {
            assert_eq!((head, segments, *at), (h, s, data.len()));
        }
        (Ok(_), _) => panic!("a FRAME packet decoded as something else"),
        (Err(_), Ok((_, _, at))) => assert_ne!(*at, data.len()),
        (Err(a), Err(b)) => assert_eq!(a, b),
    }
    if let Ok(head) = FrameHead::decode(data) {
        if let Ok(payload) = handshake_payload(data, &head) {
            let Ok(Packet::Frame { segments, .. }) = &decoded else {
                panic!("a handshake payload from a packet that does not decode");
            };
            let mut joined = Vec::new();
            for s in segments {
                let Seg::Inline(b) = s else {
                    panic!("a handshake payload with a descriptor");
                };
                joined.extend_from_slice(b);
            }
            assert!(!head.more);
            assert_eq!(payload, joined);
        }
    }
}

fn frame(frame_type: FrameType, more: bool, segments: &[Seg<'_>]) -> Vec<u8> {
    let mut p = Vec::new();
    FrameHead {
        frame_type,
        more,
        count: 3,
        sequence: 41,
        segments: segments.len() as u32,
    }
    .encode_into(&mut p);
    for s in segments {
        s.encode_into(&mut p);
    }
    p
}

/// Valid packets of every kind.
pub fn seeds() -> Vec<Vec<u8>> {
    let desc = |token| {
        Seg::Desc(Desc {
            pool: 7,
            offset: 4096 * token as u64,
            len: 1000,
            token,
        })
    };
    vec![
        frame(FrameType::Hello, false, &[Seg::Inline(b"a hello payload")]),
        frame(
            FrameType::Messages,
            false,
            &[Seg::Inline(b"head"), desc(1), desc(2), Seg::Inline(b"")],
        ),
        frame(FrameType::Messages, true, &[desc(3)]),
        frame(FrameType::Bye, false, &[]),
        pool_packet(7, 1 << 24),
        ring_packet(512 * 1024),
        return_packet(&[1, 2, 3, 0xffff_ffff]),
        DOORBELL.to_vec(),
    ]
}

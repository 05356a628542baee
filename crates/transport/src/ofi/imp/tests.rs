use super::conn::OutFrame;
use super::*;
use crate::Transport;
use evb_wire::{Channel, FrameHeader, Role};
use std::time::Instant;

fn cfg(node: &str, blocks: usize) -> TransportConfig {
    TransportConfig {
        run_id: "ofi-adm".into(),
        local: Hello::new(Channel::Data, Role::Bu, 0, "ofi-adm", node),
        max_frame: 8 << 20,
        rx_pool: Pool::new(node, 64 * 1024, blocks),
        secret: None,
    }
}

/// Peers that connect and send a Hello header declaring 340 KB, then all of it but one
/// byte, must not take the node's receive pool: a legitimate peer still gets in and moves
/// 200 KB frames through a 16-block pool, and the stalled ones are closed at once.
#[test]
fn unauthenticated_peers_cannot_take_the_receive_pool() {
    if let Err(why) = super::super::probe("tcp") {
        eprintln!("NOTICE: skipped, {why}");
        return;
    }
    let mut node = Ofi::new(cfg("evm", 16), "tcp".into()).unwrap();
    let addr = node.listen("127.0.0.1:0").unwrap();
    let hello = || Hello::new(Channel::Data, Role::Ru, 0, "ofi-adm", "x");
    let mut attackers = Vec::new();
    for _ in 0..6 {
        let mut a = Ofi::new(cfg("bad", 16), "tcp".into()).unwrap();
        let id = a.connect(&addr, hello()).unwrap().0;
        let c = a.conns.get_mut(&id).unwrap();
        // the Hello queued by connect, replaced by one that never completes
        let header = FrameHeader::new(FrameType::Hello, 340_000, 0, 0).encode();
        c.frames.clear();
        c.queued = FRAME_HEADER_LEN + 339_999;
        c.frames.push_back(OutFrame {
            header: Box::new(header),
            segments: vec![Segment::Owned(vec![7; 339_999])],
            len: FRAME_HEADER_LEN + 339_999,
        });
        attackers.push(a);
    }
    let mut evs = Vec::new();
    let mut junk = Vec::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(500) {
        node.poll(&mut evs, Some(Duration::from_millis(1))).unwrap();
        for a in &mut attackers {
            a.poll(&mut junk, Some(Duration::ZERO)).unwrap();
        }
    }
    let too_large = evs
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::Closed {
                    reason: CloseReason::Protocol(WireError::FrameTooLarge { max: 2048, .. }),
                    ..
                }
            )
        })
        .count();
    assert_eq!(too_large, 6, "{evs:?}");
    evs.clear();

    let mut peer = Ofi::new(cfg("ru0", 64), "tcp".into()).unwrap();
    let conn = peer.connect(&addr, hello()).unwrap();
    let mut pevs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = 0;
    let mut sent = false;
    while got < 10 {
        assert!(
            Instant::now() < deadline,
            "{got} of 10 frames; {pevs:?} {evs:?}"
        );
        peer.poll(&mut pevs, Some(Duration::from_millis(1)))
            .unwrap();
        node.poll(&mut evs, Some(Duration::from_millis(1))).unwrap();
        for a in &mut attackers {
            a.poll(&mut junk, Some(Duration::ZERO)).unwrap();
        }
        if !sent && pevs.iter().any(|e| matches!(e, Event::Connected { .. })) {
            for i in 0..10u8 {
                let seg = vec![Segment::Owned(vec![i; 200_000])];
                peer.send(conn, FrameType::Messages, 1, seg).unwrap();
            }
            sent = true;
        }
        for e in evs.drain(..) {
            if let Event::Frame { frame, .. } = e {
                assert!(frame.payload.eq_bytes(&vec![got as u8; 200_000]));
                got += 1;
            }
        }
    }
}

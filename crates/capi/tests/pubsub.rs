//! The pub/sub entry points called as C would call them: NULLs, bad text and misuse answer
//! error codes with messages (never a crash), and a round trip on 127.0.0.1 with payloads
//! in one piece and spanning receive blocks.

use std::ffi::{c_char, CStr, CString};
use std::ptr::{null, null_mut};

use evb::*;

fn last() -> String {
    // SAFETY: evb_last_error returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(evb_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

fn empty_msg() -> EvbSubMsg {
    EvbSubMsg {
        kind: -1,
        publisher: 99,
        tag: 0,
        seq: 0,
        missed: 0,
        code: 0,
        data: null(),
        len: 0,
    }
}

#[test]
fn nulls_bad_text_and_misuse_are_error_codes_that_say_why() {
    // SAFETY: every pointer below is NULL, a live CString, or a handle made here.
    unsafe {
        let mut p: *mut EvbPub = null_mut();
        assert_eq!(evb_pub_open(null(), null(), &mut p), EVB_ERR_ARG);
        assert!(last().contains("addr is NULL"), "{}", last());
        assert_eq!(
            evb_pub_open(c("127.0.0.1:0").as_ptr(), null(), null_mut()),
            EVB_ERR_ARG
        );
        let bad = c("policy=maybe");
        assert_eq!(
            evb_pub_open(c("127.0.0.1:0").as_ptr(), bad.as_ptr(), &mut p),
            EVB_ERR_SETUP
        );
        assert!(last().contains("\"maybe\""), "{}", last());
        let not_utf8 = [0xffu8, 0];
        assert_eq!(
            evb_pub_open(not_utf8.as_ptr().cast::<c_char>(), null(), &mut p),
            EVB_ERR_ARG
        );
        assert!(last().contains("not UTF-8"), "{}", last());
        assert_eq!(
            evb_pub_send(null_mut(), 1, null(), 0, null_mut()),
            EVB_ERR_ARG
        );
        assert!(evb_pub_local_addr(null()).is_null());
        assert_eq!(evb_pub_close(null_mut(), null()), EVB_OK);
        assert_eq!(evb_pub_stats(null(), null_mut()), EVB_ERR_ARG);

        let opts = c("max_message=1000");
        assert_eq!(
            evb_pub_open(c("127.0.0.1:0").as_ptr(), opts.as_ptr(), &mut p),
            EVB_OK
        );
        let big = vec![0u8; 1001];
        assert_eq!(
            evb_pub_send(p, 1, big.as_ptr().cast(), big.len(), null_mut()),
            EVB_ERR_SIZE
        );
        assert!(last().contains("max_message 1000"), "{}", last());
        assert_eq!(evb_pub_send(p, 1, null(), 5, null_mut()), EVB_ERR_ARG);
        assert!(last().contains("data is NULL"), "{}", last());
        let mut sent = EvbPubSent {
            delivered: 7,
            dropped: 7,
        };
        assert_eq!(evb_pub_send(p, 1, null(), 0, &mut sent), EVB_OK);
        assert_eq!((sent.delivered, sent.dropped), (0, 0));
        let mut n = 9usize;
        assert_eq!(evb_pub_wait_subscribers(p, 1, 20, &mut n), EVB_TIMEOUT);
        assert_eq!(n, 0);
        assert!(last().contains("0 of 1 subscribers"), "{}", last());
        assert_eq!(evb_pub_close(p, null()), EVB_OK);

        let mut s: *mut EvbSub = null_mut();
        let tags = c("1,7-3");
        assert_eq!(
            evb_sub_open(c("127.0.0.1:1").as_ptr(), tags.as_ptr(), null(), &mut s),
            EVB_ERR_SETUP
        );
        assert!(last().contains("range \"7-3\" is empty"), "{}", last());
        assert_eq!(
            evb_sub_open(c(" , ").as_ptr(), c("1").as_ptr(), null(), &mut s),
            EVB_ERR_SETUP
        );
        assert!(last().contains("no publisher address"), "{}", last());
        assert_eq!(
            evb_sub_open(c("127.0.0.1:1").as_ptr(), null(), null(), &mut s),
            EVB_ERR_ARG
        );
        let mut m = empty_msg();
        assert_eq!(evb_sub_recv(null_mut(), 0, &mut m), EVB_ERR_ARG);
        // nobody listens on port 1: closed (why), then the end
        assert_eq!(
            evb_sub_open(
                c("127.0.0.1:1").as_ptr(),
                c("1").as_ptr(),
                c("").as_ptr(),
                &mut s
            ),
            EVB_OK
        );
        assert_eq!(evb_sub_recv(s, 1, null_mut()), EVB_ERR_ARG);
        assert_eq!(evb_sub_recv(s, 30_000, &mut m), EVB_OK);
        assert_eq!((m.kind, m.publisher), (EVB_SUB_CLOSED, 0));
        assert!(
            m.len > 0 && *m.data.add(m.len) == 0,
            "the reason, NUL-terminated"
        );
        assert_eq!(evb_sub_recv(s, i64::MAX, &mut m), EVB_END);
        assert_eq!(evb_sub_subscribe(s, c("x").as_ptr()), EVB_ERR_SETUP);
        assert!(last().contains("\"x\" is not a tag"), "{}", last());
        evb_sub_close(s);
        evb_sub_close(null_mut());
    }
}

#[test]
fn a_round_trip_with_payloads_in_one_piece_and_across_blocks() {
    // SAFETY: every pointer below is NULL, a live CString or buffer, or a handle made here;
    // a message's bytes are read before the next evb_sub_recv.
    unsafe {
        let mut p: *mut EvbPub = null_mut();
        let opts = c("transport=tcp run_id=capi-test max_message=300000 policy=block");
        assert_eq!(
            evb_pub_open(c("127.0.0.1:0").as_ptr(), opts.as_ptr(), &mut p),
            EVB_OK,
            "{}",
            last()
        );
        let addr = CStr::from_ptr(evb_pub_local_addr(p)).to_owned();
        let mut s: *mut EvbSub = null_mut();
        let sub_opts = c("run_id=capi-test max_message=300000 delivery=throughput");
        assert_eq!(
            evb_sub_open(addr.as_ptr(), c("4-5").as_ptr(), sub_opts.as_ptr(), &mut s),
            EVB_OK,
            "{}",
            last()
        );
        // one thread: both sides take turns until the subscription is in
        let mut m = empty_msg();
        let mut n = 0usize;
        // subscribed ones (timeout 0: one look; EVB_TIMEOUT until it is in)
        while n < 1 {
            assert_eq!(evb_sub_recv(s, 5, &mut m), EVB_TIMEOUT);
            assert_eq!(evb_pub_poll(p, 5), EVB_OK);
            evb_pub_wait_subscribers(p, 1, 0, &mut n);
        }
        let sizes = [0usize, 1, 100, 70_000, 200_000, 300_000, 5];
        let body =
            |i: usize, len: usize| -> Vec<u8> { (0..len).map(|k| (k * 13 + i) as u8).collect() };
        for (i, &len) in sizes.iter().enumerate() {
            let data = body(i, len);
            let mut sent = EvbPubSent {
                delivered: 0,
                dropped: 0,
            };
            for tag in [3u64, 4] {
                assert_eq!(
                    evb_pub_send(p, tag, data.as_ptr().cast(), len, &mut sent),
                    EVB_OK,
                    "{}",
                    last()
                );
                assert_eq!(sent.delivered, usize::from(tag == 4));
            }
        }
        assert_eq!(evb_pub_flush(p), EVB_OK);
        let mut got = Vec::new();
        while got.len() < sizes.len() {
            assert_eq!(evb_pub_poll(p, 0), EVB_OK);
            match evb_sub_recv(s, 5, &mut m) {
                EVB_TIMEOUT => continue,
                EVB_OK => {}
                other => panic!("{other}: {}", last()),
            }
            assert_eq!(m.kind, EVB_SUB_MESSAGE);
            assert_eq!((m.tag, m.seq), (4, got.len() as u64));
            let bytes = if m.len == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(m.data, m.len).to_vec()
            };
            got.push(bytes);
        }
        for (i, (&len, b)) in sizes.iter().zip(&got).enumerate() {
            assert_eq!(b.len(), len, "message {i}");
            assert!(*b == body(i, len), "message {i}: bytes differ");
        }
        assert_eq!(evb_sub_unsubscribe(s, c("4").as_ptr()), EVB_OK);
        assert_eq!(evb_sub_subscribe(s, c("3").as_ptr()), EVB_OK);
        assert_eq!(evb_pub_close(p, c("over").as_ptr()), EVB_OK);
        let mut kinds = Vec::new();
        loop {
            match evb_sub_recv(s, 30_000, &mut m) {
                EVB_END => break,
                EVB_OK => kinds.push(m.kind),
                other => panic!("{other}: {}", last()),
            }
            if m.kind == EVB_SUB_GOODBYE {
                assert_eq!(m.code, 3);
                assert_eq!(std::slice::from_raw_parts(m.data, m.len), b"over");
            }
        }
        assert_eq!(kinds, vec![EVB_SUB_GOODBYE, EVB_SUB_CLOSED]);
        let mut st = EvbSubStats {
            received: 0,
            payload_bytes: 0,
            missed: 0,
            gaps: 0,
            goodbyes: 0,
        };
        assert_eq!(evb_sub_stats(s, &mut st), EVB_OK);
        assert_eq!(st.received, sizes.len() as u64);
        assert_eq!(st.payload_bytes, sizes.iter().sum::<usize>() as u64);
        assert_eq!(st.goodbyes, 1);
        evb_sub_close(s);
    }
}

//! The serve sink over real sockets: serving, re-serving, refusals, authentication and the
//! handshake limits.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use evb_buffers::{Chain, Pool};
use evb_builder::{BuiltEvent, Sink, SinkError};
use evb_formats::events::parse_event;
use evb_wire::consumer::{
    proof_key, ConsumerFrame, ConsumerHeader, ConsumerHello, ConsumerMsg, ProofRole, RefuseCode,
    CONSUMER_HEADER_LEN,
};

use super::accept::prove;
use super::{ServeOptions, ServeSink, MAX_CONNECTIONS};

fn event(pool: &Pool, id: u64) -> BuiltEvent {
    let mut w = pool.try_alloc().unwrap();
    let payload = Chain::from_slice(w.append(&id.to_le_bytes()).unwrap());
    BuiltEvent::of_one_fragment(id, 3, payload)
}

fn sink(hold: usize) -> ServeSink {
    sink_of(hold, None)
}

fn sink_of(hold: usize, secret: Option<&str>) -> ServeSink {
    ServeSink::start(ServeOptions {
        listen: "127.0.0.1:0".into(),
        run_id: "r".into(),
        bu_id: "bu0".into(),
        bu_index: 0,
        max_held: 8,
        hold,
        ack_timeout: Duration::from_secs(10),
        drain_timeout: Duration::from_secs(1),
        secret: secret.map(|s| s.as_bytes().to_vec()),
    })
    .unwrap()
}

fn connect(s: &ServeSink, run: &str) -> (TcpStream, Result<ConsumerMsg, String>) {
    let mut c = TcpStream::connect(s.listen_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let hello = ConsumerMsg::Hello(ConsumerHello {
        max_held: 4,
        nonce: 0,
        run_id: run.into(),
        name: "t".into(),
    });
    c.write_all(&hello.encode()).unwrap();
    let first = read_any(&mut c);
    (c, first)
}

fn read_any(c: &mut TcpStream) -> Result<ConsumerMsg, String> {
    let mut h = [0u8; CONSUMER_HEADER_LEN];
    c.read_exact(&mut h).map_err(|e| e.to_string())?;
    let h = ConsumerHeader::decode(&h, 1 << 20).map_err(|e| e.to_string())?;
    let mut p = vec![0u8; h.length as usize];
    c.read_exact(&mut p).map_err(|e| e.to_string())?;
    ConsumerMsg::decode(h.kind, &p).map_err(|e| e.to_string())
}

/// The connection is open and has nothing to read: the read times out (not an end of
/// stream or a reset, which would pass a plain `is_err()` too).
fn assert_nothing_to_read(c: &mut TcpStream, why: &str) {
    let mut b = [0u8; 1];
    match c.read(&mut b) {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        other => panic!("{why}: expected nothing to read, got {other:?}"),
    }
}

fn wait_for(mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(5), "timed out");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Nothing is served before the EVM accepts it; an accepted event goes out, is held
/// until acknowledged, and one never accepted is left out.
#[test]
fn served_only_once_accepted_and_held_until_acknowledged() {
    let pool = Pool::new("t", 4096, 16);
    let mut s = sink(8);
    let (mut c, welcome) = connect(&s, "r");
    assert!(matches!(welcome, Ok(ConsumerMsg::Welcome(ref w)) if w.max_held == 4));
    for id in [5, 6, 7] {
        s.deliver(&event(&pool, id)).unwrap();
    }
    assert_nothing_to_read(&mut c, "nothing before the EVM's echo");
    s.accepted(5, 2).unwrap();
    let mut got = Vec::new();
    for _ in 0..2 {
        match read_any(&mut c).unwrap() {
            ConsumerMsg::Event(r) => {
                let ev = parse_event(&r).unwrap();
                assert_eq!(ev.fragments[0].1, ev.event_id.to_le_bytes());
                got.push(ev.event_id);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got, vec![5, 6]);
    assert_nothing_to_read(&mut c, "7 was never accepted");
    // 5 and 6 held until acknowledged, 7 awaiting the echo: the BU's Stop waits for all
    assert_eq!(s.outstanding(), 3);
    c.write_all(&ConsumerMsg::Ack(vec![5, 6]).encode()).unwrap();
    wait_for(|| s.outstanding() == 1);
    assert_eq!(s.close_output(), 0);
    assert!(matches!(
        read_any(&mut c),
        Ok(ConsumerMsg::End { acked: 2, lost: 0 })
    ));
    s.finish().unwrap();
    assert_eq!(s.report()["left_out_unaccepted"], 1);
    assert_eq!(s.report()["acked"], 2);
}

/// A consumer that goes away: its events go to the next; at the end what nobody
/// acknowledged is counted lost. With no consumer the sink is busy beyond `hold`.
#[test]
fn a_dropped_consumers_events_go_to_another_and_the_rest_is_counted_lost() {
    let pool = Pool::new("t", 4096, 16);
    let mut s = sink(3);
    for id in 0..3 {
        s.deliver(&event(&pool, id)).unwrap();
    }
    match s.deliver(&event(&pool, 3)) {
        Err(SinkError::Busy(why)) => assert!(why.contains("waiting for a consumer"), "{why}"),
        other => panic!("{other:?}"),
    }
    s.accepted(0, 3).unwrap();
    let (mut a, _) = connect(&s, "r");
    for _ in 0..3 {
        assert!(matches!(read_any(&mut a), Ok(ConsumerMsg::Event(_))));
    }
    drop(a); // dies holding 3
    let (mut b, _) = connect(&s, "r");
    let ev = match read_any(&mut b).unwrap() {
        ConsumerMsg::Event(r) => parse_event(&r).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(ev.event_id, 0, "re-served, oldest first");
    b.write_all(&ConsumerMsg::Ack(vec![0]).encode()).unwrap();
    wait_for(|| s.report()["acked"] == 1);
    assert_eq!(s.report()["re_served"], 3);
    // 1 and 2 are held by b, never acknowledged: lost at the end, and said so
    assert_eq!(s.close_output(), 2);
    s.finish().unwrap();
    assert_eq!(s.report()["lost"], 2);
}

#[test]
fn wrong_run_and_garbage_are_refused() {
    let s = sink(4);
    let (_, r) = connect(&s, "other");
    assert!(
        matches!(
            r,
            Ok(ConsumerMsg::Refuse {
                code: RefuseCode::WrongRun,
                ..
            })
        ),
        "{r:?}"
    );
    let mut g = TcpStream::connect(s.listen_addr()).unwrap();
    g.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    g.write_all(b"\x00\x01garbage garbage garbage").unwrap();
    assert!(matches!(
        read_any(&mut g),
        Ok(ConsumerMsg::Refuse {
            code: RefuseCode::BadHello,
            ..
        })
    ));
    wait_for(|| s.report()["connections_refused"] == 2);
}

fn sink_with(secret: Option<&str>) -> ServeSink {
    sink_of(8, secret)
}

fn hello(nonce: u64) -> ConsumerMsg {
    ConsumerMsg::Hello(ConsumerHello {
        max_held: 4,
        nonce,
        run_id: "r".into(),
        name: "t".into(),
    })
}

/// The handshake with a secret: a Hello with a nonce, then the Auth answering the
/// Challenge (the BU's own proof is checked in the test below); `secret` None sends a
/// Hello without a nonce.
fn connect_with(s: &ServeSink, secret: Option<&[u8]>) -> (TcpStream, Result<ConsumerMsg, String>) {
    let mut c = TcpStream::connect(s.listen_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let h = hello(if secret.is_some() { 0x5eed } else { 0 });
    c.write_all(&h.encode()).unwrap();
    let first = read_any(&mut c);
    let (Some(secret), Ok(ConsumerMsg::Challenge { nonce, .. })) = (secret, &first) else {
        return (c, first);
    };
    let payload = h.encode_payload();
    let mine = prove(&proof_key(ProofRole::Consumer, secret, &payload, *nonce));
    c.write_all(&ConsumerMsg::Auth(mine).encode()).unwrap();
    let r = read_any(&mut c);
    (c, r)
}

fn refused_with(r: &Result<ConsumerMsg, String>, want: RefuseCode) -> String {
    match r {
        Ok(ConsumerMsg::Refuse { code, reason }) if *code == want => reason.clone(),
        other => panic!("expected Refuse {want:?}, got {other:?}"),
    }
}

/// With a secret: no proof and a wrong proof are refused (Unauthenticated) and get no
/// event; the right one is welcomed after the BU proved the secret too.
#[test]
fn with_a_secret_only_a_consumer_that_proves_it_is_served() {
    let pool = Pool::new("t", 4096, 16);
    let mut s = sink_with(Some("s3cret"));
    s.deliver(&event(&pool, 1)).unwrap();
    s.accepted(1, 1).unwrap();
    let (_, r) = connect_with(&s, None);
    let why = refused_with(&r, RefuseCode::Unauthenticated);
    assert!(why.contains("requires the run's secret"), "{why}");
    let (_, r) = connect_with(&s, Some(b"guess"));
    let why = refused_with(&r, RefuseCode::Unauthenticated);
    assert!(why.contains("wrong secret"), "{why}");
    // an Auth that is not 32 bytes, or another frame where the Auth is due
    let mut c = TcpStream::connect(s.listen_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    c.write_all(&hello(7).encode()).unwrap();
    assert!(matches!(
        read_any(&mut c),
        Ok(ConsumerMsg::Challenge { .. })
    ));
    c.write_all(&ConsumerMsg::Ack(vec![1]).encode()).unwrap();
    refused_with(&read_any(&mut c), RefuseCode::BadHello);
    assert_eq!(s.report()["sent"], 0, "nothing to the unauthenticated");
    let (mut c, r) = connect_with(&s, Some(b"s3cret"));
    assert!(matches!(r, Ok(ConsumerMsg::Welcome(_))), "{r:?}");
    assert!(matches!(read_any(&mut c), Ok(ConsumerMsg::Event(_))));
    let rep = s.report();
    assert_eq!(rep["auth_failed"], 2, "{rep}");
    assert_eq!(rep["connections_refused"], 3, "{rep}");
    // the BU's own proof is checked by the consumer: a wrong secret on the BU's side
    // shows in the Challenge
    let mut c = TcpStream::connect(s.listen_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let h = hello(9);
    c.write_all(&h.encode()).unwrap();
    let Ok(ConsumerMsg::Challenge { nonce, proof }) = read_any(&mut c) else {
        panic!("no challenge")
    };
    let p = h.encode_payload();
    assert_eq!(
        proof,
        prove(&proof_key(ProofRole::Bu, b"s3cret", &p, nonce))
    );
    assert_ne!(proof, prove(&proof_key(ProofRole::Bu, b"other", &p, nonce)));
}

/// The deadline is a whole one from the accept: a byte every 600 ms does not keep the
/// connection (it is refused, `Busy`, at 5 s), and a Hello declaring more than 1 KiB is
/// refused before any of it is read.
#[test]
fn a_trickling_hello_is_closed_at_the_deadline() {
    let s = sink_with(None);
    let mut big = TcpStream::connect(s.listen_addr()).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    big.write_all(&ConsumerHeader::new(ConsumerFrame::Hello, 65_535).encode())
        .unwrap();
    let why = refused_with(&read_any(&mut big), RefuseCode::BadHello);
    assert!(why.contains("exceeds the limit of 1024"), "{why}");
    let mut c = TcpStream::connect(s.listen_addr()).unwrap();
    let t0 = Instant::now();
    c.write_all(&ConsumerHeader::new(ConsumerFrame::Hello, 1000).encode())
        .unwrap();
    c.set_read_timeout(Some(Duration::from_millis(600)))
        .unwrap();
    let mut got = Vec::new();
    while t0.elapsed() < Duration::from_secs(8) {
        let _ = c.write_all(&[0]); // fails once closed
        let mut b = [0u8; 256];
        match c.read(&mut b) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(_) => {}
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    assert!((4.5..7.0).contains(&secs), "closed after {secs} s");
    let h = ConsumerHeader::decode(&got, 0).unwrap();
    let r = ConsumerMsg::decode(h.kind, &got[CONSUMER_HEADER_LEN..]);
    let why = refused_with(&r.map_err(|e| e.to_string()), RefuseCode::Busy);
    assert!(why.contains("not completed within 5000 ms"), "{why}");
    assert_eq!(s.report()["handshakes_timed_out"], 1);
}

/// Stalled handshakes never keep a consumer out: the newest connection sheds the oldest
/// unfinished one (8 per address). Only consumers being served fill the slots for good:
/// then a new connection is refused `Busy`, and gets in once one leaves.
#[test]
fn stalled_handshakes_are_shed_and_only_served_consumers_fill_the_slots() {
    let s = sink_with(None);
    let stalled: Vec<TcpStream> = (0..40)
        .map(|_| {
            let mut c = TcpStream::connect(s.listen_addr()).unwrap();
            c.write_all(&ConsumerHeader::new(ConsumerFrame::Hello, 1000).encode()[..7])
                .unwrap();
            c
        })
        .collect();
    let (_c, r) = connect(&s, "r");
    assert!(matches!(r, Ok(ConsumerMsg::Welcome(_))), "{r:?}");
    wait_for(|| s.report()["handshakes_shed"].as_u64().unwrap() >= 32);
    drop(stalled);
    let mut served = vec![_c];
    while served.len() < MAX_CONNECTIONS {
        let (c, r) = connect(&s, "r");
        assert!(matches!(r, Ok(ConsumerMsg::Welcome(_))), "{r:?}");
        served.push(c);
    }
    let (_, r) = connect(&s, "r");
    let why = refused_with(&r, RefuseCode::Busy);
    assert!(why.contains("too many connections"), "{why}");
    drop(served.pop());
    wait_for(|| s.shared.lock().connections < MAX_CONNECTIONS);
    let (_c, r) = connect(&s, "r");
    assert!(matches!(r, Ok(ConsumerMsg::Welcome(_))), "{r:?}");
}

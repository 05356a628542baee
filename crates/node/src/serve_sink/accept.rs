//! The serve sink's acceptor: admits connections (bounded, shedding stalled handshakes),
//! runs every handshake on non-blocking sockets with poll(2), and checks the consumers' ack
//! deadlines.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use evb_wire::consumer::{
    proof_key, ConsumerFrame, ConsumerHeader, ConsumerHello, ConsumerMsg, ProofRole, RefuseCode,
    CONSUMER_HEADER_LEN, CONSUMER_MAX_HANDSHAKE, PROOF_LEN,
};
use tracing::{error, warn};

use super::admission::{admission, expired, poll_wait, Room};
use super::consumer::start_consumer;
use super::{drop_consumer, Shared, HANDSHAKE_DEADLINE, MAX_CONNECTIONS, MAX_HANDSHAKES_PER_IP};

/// A connection still handshaking, owned by the acceptor (non-blocking; no thread of its
/// own). Its frames are read into `buf`, never more than [`CONSUMER_MAX_HANDSHAKE`] bytes.
struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    since: Instant,
    buf: Vec<u8>,
    header: Option<ConsumerHeader>,
    phase: Phase,
}

enum Phase {
    /// Waiting for the Hello.
    Hello,
    /// The Hello came and the BU sent its Challenge: waiting for the consumer's Auth.
    Auth {
        hello: ConsumerHello,
        payload: Vec<u8>,
        challenge: u64,
    },
}

/// What became of a handshake after some of its bytes.
enum Step {
    /// More bytes are needed.
    Wait,
    /// Refused (or gone): close it.
    Close,
    /// Finished: serve this consumer.
    Serve(ConsumerHello),
}

pub(super) fn accept_loop(listener: TcpListener, s: Arc<Shared>) {
    let mut next_check = Instant::now();
    let mut pending: Vec<Pending> = Vec::new();
    while !s.stop.load(Ordering::Acquire) {
        // wait for a new connection or handshake bytes: 50 ms at most (the stop flag and
        // the ack timeouts), less when a handshake's deadline comes first
        let wait = poll_wait(pending.iter().map(|p| p.since), Instant::now());
        let mut fds = Vec::with_capacity(1 + pending.len());
        fds.push(libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for p in &pending {
            fds.push(libc::pollfd {
                fd: p.stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let ms = wait.as_millis().clamp(1, 50) as libc::c_int;
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            fds.iter_mut().for_each(|f| f.revents = 0);
        }
        // handshakes that have bytes (or closed): newest first, so that removing keeps the
        // indices of the ones still to look at
        for i in (0..pending.len()).rev() {
            if fds[i + 1].revents == 0 {
                continue;
            }
            match handshake_step(&mut pending[i], &s) {
                Step::Wait => {}
                Step::Close => {
                    pending.remove(i);
                }
                Step::Serve(hello) => {
                    let p = pending.remove(i);
                    start_consumer(p.stream, p.peer, hello, &s);
                }
            }
        }
        // the deadline: a whole one from accept, however the bytes trickle
        let now = Instant::now();
        pending.retain_mut(|p| {
            if !expired(p.since, now) {
                return true;
            }
            let why = format!(
                "handshake not completed within {} ms",
                HANDSHAKE_DEADLINE.as_millis()
            );
            {
                let mut st = s.lock();
                st.connections_refused += 1;
                st.handshakes_timed_out += 1;
            }
            if s.may_log() {
                warn!(node = %s.opts.bu_id, "consumer connection from {} closed: {why}", p.peer);
            }
            refuse(&mut p.stream, RefuseCode::Busy, &why);
            false
        });
        if fds[0].revents != 0 {
            loop {
                match listener.accept() {
                    Ok((stream, peer)) => admit(&mut pending, stream, peer, &s),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        warn!(node = %s.opts.bu_id, "accepting a consumer: {e}");
                        std::thread::sleep(Duration::from_millis(50));
                        break;
                    }
                }
            }
        }
        let now = Instant::now();
        if now >= next_check {
            next_check = now + Duration::from_millis(50);
            drop(s.next_log_second());
            let mut st = s.lock();
            for (id, waited) in st.late(now, s.opts.ack_timeout) {
                drop_consumer(
                    &mut st,
                    id,
                    &format!(
                        "no acknowledgement for {waited:.1} s (sink.serve_ack_timeout_s = {})",
                        s.opts.ack_timeout.as_secs_f64()
                    ),
                    &s.opts.bu_id,
                );
            }
            drop(st);
            s.cv.notify_all();
        }
    }
    // the end: close every connection
    drop(pending);
    for stream in s.lock().remove_all() {
        let _ = stream.shutdown(Shutdown::Both);
    }
}

/// A new connection. Unfinished handshakes must not keep a consumer out: when its address
/// already has [`MAX_HANDSHAKES_PER_IP`] handshaking, or every slot is taken, the OLDEST
/// unfinished handshake (of that address, or of all) is shed to make room. Only when every
/// slot is a consumer being served is the new connection refused (`Busy`: try again).
fn admit(pending: &mut Vec<Pending>, mut stream: TcpStream, peer: SocketAddr, s: &Arc<Shared>) {
    let bu = &s.opts.bu_id;
    let serving = s.lock().connections;
    let a = admission(pending.iter().map(|p| p.peer.ip()), peer.ip(), serving);
    if let Some(i) = a.shed_same_ip {
        shed(
            pending.remove(i),
            "its address has too many unfinished handshakes",
            s,
        );
    }
    match a.room {
        Room::Free => {}
        Room::Refuse => {
            s.lock().connections_refused += 1;
            let why = format!(
                "too many connections: {serving} consumers already served (at most {MAX_CONNECTIONS}); try again later"
            );
            if s.may_log() {
                warn!(node = %bu, "consumer connection from {peer} refused: {why}");
            }
            let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
            refuse(&mut stream, RefuseCode::Busy, &why);
            return;
        }
        Room::ShedOldest => shed(pending.remove(0), "every connection slot is taken", s),
    }
    let _ = stream.set_nonblocking(true);
    let _ = stream.set_nodelay(true);
    let mut p = Pending {
        stream,
        peer,
        since: Instant::now(),
        buf: Vec::new(),
        header: None,
        phase: Phase::Hello,
    };
    // a consumer writes its Hello as soon as it is connected: often it is here already, and
    // a handshake finished now cannot be shed by a burst of connections behind it
    match handshake_step(&mut p, s) {
        Step::Wait => pending.push(p),
        Step::Close => {}
        Step::Serve(hello) => start_consumer(p.stream, p.peer, hello, s),
    }
}

fn shed(mut p: Pending, why: &str, s: &Shared) {
    let ms = p.since.elapsed().as_millis();
    {
        let mut st = s.lock();
        st.connections_refused += 1;
        st.handshakes_shed += 1;
    }
    if s.may_log() {
        warn!(node = %s.opts.bu_id, "consumer connection from {} shed after {ms} ms without a finished handshake: {why} (limits: {MAX_HANDSHAKES_PER_IP} handshaking per IP, {MAX_CONNECTIONS} connections in all)", p.peer);
    }
    refuse(
        &mut p.stream,
        RefuseCode::Busy,
        &format!("handshake shed after {ms} ms unfinished: {why}; try again"),
    );
}

/// Reads what a handshaking connection has sent (never blocking, never past the frame it
/// waits for) and answers a finished frame.
fn handshake_step(p: &mut Pending, s: &Shared) -> Step {
    let bu = &s.opts.bu_id;
    let peer = p.peer;
    let refused = |p: &mut Pending, code: RefuseCode, why: String, name: Option<&str>| {
        {
            let mut st = s.lock();
            st.connections_refused += 1;
            if code == RefuseCode::Unauthenticated {
                st.auth_failed += 1;
            }
        }
        match name {
            _ if !s.may_log() => {}
            Some(n) => error!(node = %bu, "consumer {n} from {peer} refused: {why}"),
            None => error!(node = %bu, "consumer connection from {peer} refused: {why}"),
        }
        refuse(&mut p.stream, code, &why);
        Step::Close
    };
    loop {
        let want = match p.header {
            None => CONSUMER_HEADER_LEN - p.buf.len(),
            Some(h) => CONSUMER_HEADER_LEN + h.length as usize - p.buf.len(),
        };
        if want > 0 {
            let mut tmp = [0u8; CONSUMER_HEADER_LEN + CONSUMER_MAX_HANDSHAKE as usize];
            match p.stream.read(&mut tmp[..want]) {
                Ok(0) => {
                    let what = match p.phase {
                        Phase::Hello => "its Hello",
                        Phase::Auth { .. } => "its Auth",
                    };
                    return refused(
                        p,
                        RefuseCode::BadHello,
                        format!("bad hello: the connection closed before {what}"),
                        None,
                    );
                }
                Ok(n) => p.buf.extend_from_slice(&tmp[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Step::Wait,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return refused(p, RefuseCode::BadHello, format!("bad hello: {e}"), None),
            }
            continue;
        }
        let Some(h) = p.header else {
            let expect = match p.phase {
                Phase::Hello => ConsumerFrame::Hello,
                Phase::Auth { .. } => ConsumerFrame::Auth,
            };
            let h = match ConsumerHeader::decode(&p.buf, 0) {
                Ok(h) => h,
                Err(e) => return refused(p, RefuseCode::BadHello, format!("bad hello: {e}"), None),
            };
            if h.kind != expect {
                let why = match p.phase {
                    Phase::Hello => format!("first frame is {:?}, not Hello", h.kind),
                    Phase::Auth { .. } => format!("sent {:?} where its Auth was due", h.kind),
                };
                return refused(p, RefuseCode::BadHello, why, None);
            }
            if h.length > CONSUMER_MAX_HANDSHAKE {
                let why = format!(
                    "bad hello: a {:?} of {} bytes exceeds the limit of {CONSUMER_MAX_HANDSHAKE}",
                    h.kind, h.length
                );
                return refused(p, RefuseCode::BadHello, why, None);
            }
            p.header = Some(h);
            continue;
        };
        let payload = p.buf.split_off(CONSUMER_HEADER_LEN);
        p.buf.clear();
        p.header = None;
        match std::mem::replace(&mut p.phase, Phase::Hello) {
            Phase::Hello => {
                let hello = match ConsumerMsg::decode(h.kind, &payload) {
                    Ok(ConsumerMsg::Hello(hello)) => hello,
                    Ok(other) => {
                        let why = format!("first frame is {:?}, not Hello", other.kind());
                        return refused(p, RefuseCode::BadHello, why, None);
                    }
                    Err(e) => {
                        return refused(p, RefuseCode::BadHello, format!("bad hello: {e}"), None)
                    }
                };
                if hello.run_id != s.opts.run_id {
                    let why = format!(
                        "the consumer names run {:?}; this is run {:?}",
                        hello.run_id, s.opts.run_id
                    );
                    return refused(p, RefuseCode::WrongRun, why, Some(&hello.name));
                }
                if s.lock().over {
                    refuse(&mut p.stream, RefuseCode::Over, "the run is over");
                    return Step::Close;
                }
                let Some(secret) = &s.opts.secret else {
                    return Step::Serve(hello);
                };
                if hello.nonce == 0 {
                    let why = "this BU requires the run's secret (run.secret or EVB_SECRET) \
                               and the consumer proves none"
                        .to_string();
                    return refused(p, RefuseCode::Unauthenticated, why, Some(&hello.name));
                }
                let challenge = match nonce() {
                    Ok(n) => n,
                    Err(e) => {
                        return refused(p, RefuseCode::Other, e, Some(&hello.name));
                    }
                };
                let proof = prove(&proof_key(ProofRole::Bu, secret, &payload, challenge));
                let frame = ConsumerMsg::Challenge {
                    nonce: challenge,
                    proof,
                }
                .encode();
                // 52 bytes to a connection that has sent and not yet read anything: a
                // short write would mean a broken connection
                if p.stream.write_all(&frame).is_err() {
                    return Step::Close;
                }
                p.phase = Phase::Auth {
                    hello,
                    payload,
                    challenge,
                };
            }
            Phase::Auth {
                hello,
                payload: hello_payload,
                challenge,
            } => {
                let proof = match ConsumerMsg::decode(h.kind, &payload) {
                    Ok(ConsumerMsg::Auth(proof)) => proof,
                    Ok(other) => {
                        let why = format!("sent {:?} where its Auth was due", other.kind());
                        return refused(p, RefuseCode::BadHello, why, Some(&hello.name));
                    }
                    Err(e) => {
                        let why = format!("bad auth: {e}");
                        return refused(p, RefuseCode::BadHello, why, Some(&hello.name));
                    }
                };
                let secret = s.opts.secret.as_deref().unwrap_or_default();
                let key = proof_key(ProofRole::Consumer, secret, &hello_payload, challenge);
                if !evb_transport::control_token_matches(&key, &hex(&proof)) {
                    let why = "authentication failed: wrong secret".to_string();
                    return refused(p, RefuseCode::Unauthenticated, why, Some(&hello.name));
                }
                return Step::Serve(hello);
            }
        }
    }
}

/// A proof: HMAC-SHA256 keyed by a [`proof_key`] (docs/protocol.md §7.2).
pub(super) fn prove(key: &[u8]) -> [u8; PROOF_LEN] {
    let t = evb_transport::control_token(key);
    let mut out = [0u8; PROOF_LEN];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).unwrap_or(0);
    }
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A random, non-zero challenge nonce from the system; without randomness the handshake
/// fails rather than use a guessable one.
fn nonce() -> Result<u64, String> {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| format!("no randomness for the challenge nonce: {e}"))?;
    match u64::from_le_bytes(b) {
        0 => Err("the random source gave an all-zero nonce".into()),
        n => Ok(n),
    }
}

/// Best effort: the Refuse frame, then the connection is closed.
pub(super) fn refuse(stream: &mut TcpStream, code: RefuseCode, reason: &str) {
    let _ = stream.write_all(
        &ConsumerMsg::Refuse {
            code,
            reason: reason.to_string(),
        }
        .encode(),
    );
    let _ = stream.shutdown(Shutdown::Both);
}

//! A served consumer: its registration and Welcome, then a reader thread taking its acks
//! and a writer thread sending it events (and End at the end of the run).

use std::io::{BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use evb_wire::consumer::{
    ConsumerHeader, ConsumerHello, ConsumerMsg, RefuseCode, Welcome, CONSUMER_HEADER_LEN,
};
use tracing::{error, info};

use super::accept::refuse;
use super::book::{Acked, Next};
use super::{drop_consumer, Shared};

/// Reads one frame (header and payload); `max_event` 0 refuses Event frames by size.
fn read_frame(r: &mut impl Read) -> Result<ConsumerMsg, String> {
    let mut h = [0u8; CONSUMER_HEADER_LEN];
    r.read_exact(&mut h).map_err(|e| e.to_string())?;
    let h = ConsumerHeader::decode(&h, 0).map_err(|e| e.to_string())?;
    let mut p = vec![0u8; h.length as usize];
    r.read_exact(&mut p).map_err(|e| e.to_string())?;
    ConsumerMsg::decode(h.kind, &p).map_err(|e| e.to_string())
}

/// A finished handshake: the consumer is registered (only now can it be sent events), is
/// welcomed, and gets its threads (its acks here, its events on a writer).
pub(super) fn start_consumer(
    mut stream: TcpStream,
    peer: SocketAddr,
    hello: ConsumerHello,
    s: &Arc<Shared>,
) {
    let bu = &s.opts.bu_id;
    let peer = peer.to_string();
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let max_held = hello.max_held.min(s.opts.max_held);
    let welcome = ConsumerMsg::Welcome(Welcome {
        bu_index: s.opts.bu_index,
        max_held,
        bu_id: bu.clone(),
    })
    .encode();
    let (Ok(rstream), Ok(wstream), Ok(handle)) =
        (stream.try_clone(), stream.try_clone(), stream.try_clone())
    else {
        return;
    };
    let id = {
        let mut st = s.lock();
        if st.over {
            drop(st);
            refuse(&mut stream, RefuseCode::Over, "the run is over");
            return;
        }
        if stream.write_all(&welcome).is_err() {
            return;
        }
        let _ = stream.set_write_timeout(None);
        st.register(
            hello.name.clone(),
            peer.clone(),
            max_held as usize,
            handle,
            Instant::now(),
        )
    };
    let auth = if s.opts.secret.is_some() {
        ", authenticated"
    } else {
        ""
    };
    info!(node = %bu, "consumer {} connected from {peer} (holds at most {max_held}{auth})", hello.name);
    s.cv.notify_all();
    let s2 = s.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("{bu}-consumer"))
        .spawn(move || {
            serve_consumer(rstream, wstream, &peer, &hello.name, id, &s2);
            s2.lock().connections -= 1;
        });
    if spawned.is_err() {
        let mut st = s.lock();
        st.connections -= 1;
        drop_consumer(&mut st, id, "no thread for it", bu);
    }
}

/// A consumer's acks, until the connection closes or breaks the protocol (its writer on
/// another thread).
fn serve_consumer(
    mut stream: TcpStream,
    wstream: TcpStream,
    peer: &str,
    name: &str,
    id: u64,
    s: &Arc<Shared>,
) {
    let bu = &s.opts.bu_id;
    let s2 = s.clone();
    let writer = std::thread::Builder::new()
        .name(format!("{bu}-serve-w"))
        .spawn(move || writer_loop(wstream, id, s2));
    let why = loop {
        match read_frame(&mut stream) {
            Ok(ConsumerMsg::Ack(ids)) => {
                let acked = s.lock().ack(id, ids, Instant::now());
                let bad = match acked {
                    Acked::Gone => break None, // dropped meanwhile
                    Acked::Done => None,
                    Acked::NotHeld(e) => {
                        Some(format!("acknowledged event {e}, which it does not hold"))
                    }
                };
                s.cv.notify_all();
                if let Some(b) = bad {
                    break Some(b);
                }
            }
            Ok(other) => break Some(format!("sent {:?} after its Hello", other.kind())),
            Err(e) => break Some(format!("connection closed ({e})")),
        }
    };
    {
        let mut st = s.lock();
        let protocol = why
            .as_ref()
            .is_some_and(|w| !w.starts_with("connection closed"));
        if protocol {
            error!(node = %bu, "consumer {name} ({peer}): {}", why.as_deref().unwrap_or(""));
        }
        if let Some(w) = why {
            drop_consumer(&mut st, id, &w, bu);
        }
    }
    s.cv.notify_all();
    if let Ok(w) = writer {
        let _ = w.join();
    }
}

fn writer_loop(stream: TcpStream, id: u64, s: Arc<Shared>) {
    let mut w = BufWriter::with_capacity(256 << 10, stream);
    let mut unflushed = false;
    loop {
        let next = {
            let mut st = s.lock();
            loop {
                if s.stop.load(Ordering::Acquire) {
                    return;
                }
                match st.next_for(id, Instant::now) {
                    Next::Gone => return, // dropped
                    Next::End { acked, lost } => {
                        drop(st);
                        let _ = w.write_all(&ConsumerMsg::End { acked, lost }.encode());
                        let _ = w.flush();
                        if let Some(stream) = s.lock().remove(id) {
                            let _ = stream.shutdown(Shutdown::Both);
                        }
                        return;
                    }
                    Next::Send(it) => break Some(it),
                    Next::Wait => {}
                }
                if unflushed {
                    break None;
                }
                st =
                    s.cv.wait_timeout(st, Duration::from_millis(100))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
            }
        };
        let r = match next {
            None => {
                unflushed = false;
                w.flush()
            }
            Some(it) => {
                unflushed = true;
                (|| {
                    w.write_all(&it.head)?;
                    for (h, c) in &it.frags {
                        w.write_all(&h.encode())?;
                        for chunk in c.chunks() {
                            w.write_all(chunk)?;
                        }
                    }
                    Ok(())
                })()
            }
        };
        if let Err(e) = r {
            let mut st = s.lock();
            drop_consumer(&mut st, id, &format!("sending failed ({e})"), &s.opts.bu_id);
            drop(st);
            s.cv.notify_all();
            return;
        }
    }
}

//! Pub/sub conformance on tcp (also with a send thread), shm, inproc and ofi (libfabric's
//! tcp provider, where evb was built with it): exact tag filtering, subscriptions changing
//! while data flows, departures, the three slow-subscriber policies with their counts, and
//! bad subscribers. Everything runs on one thread: a subscriber that "does not read" is one
//! this test does not poll.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use evb_buffers::Pool;
use evb_messaging::pubsub::*;
use evb_messaging::{Messenger, MessengerConfig};
use evb_transport::inproc::InprocTransport;
use evb_transport::ofi::OfiTransport;
use evb_transport::shm::ShmTransport;
use evb_transport::tcp::TcpTransport;
use evb_transport::{ConnId, Transport, TransportConfig};
use evb_wire::pubsub::{Delivery, GoodbyeCode, PubSubMessage, TagRange};
use evb_wire::{Channel, Hello, Message, Role};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Tcp,
    /// tcp, the publisher writing half its subscribers' sockets and a send thread the rest
    TcpSendThreads,
    Shm,
    Inproc,
    /// libfabric's tcp provider, where evb was built with libfabric (else skipped).
    Ofi,
}

/// Whether `kind` can run here (ofi needs libfabric); prints why not.
fn available(kind: Kind) -> bool {
    if kind != Kind::Ofi {
        return true;
    }
    match evb_transport::ofi::probe("tcp") {
        Ok(_) => true,
        Err(why) => {
            evb_buffers::skips::skipped("ofi pub/sub", &why.to_string());
            false
        }
    }
}

const KINDS: [Kind; 3] = [Kind::Tcp, Kind::Shm, Kind::Inproc];

fn tcfg(node: &str) -> TransportConfig {
    TransportConfig {
        run_id: "ps".into(),
        local: Hello::new(Channel::Data, Role::Ru, 0, "ps", node),
        max_frame: 8 << 20,
        rx_pool: Pool::new(node, 256 * 1024, 256),
        secret: None,
    }
}

fn transport(kind: Kind, node: &str) -> Box<dyn Transport> {
    match kind {
        Kind::Tcp | Kind::TcpSendThreads => Box::new(TcpTransport::new(tcfg(node)).unwrap()),
        Kind::Shm => ShmTransport::new(tcfg(node)).unwrap(),
        Kind::Inproc => Box::new(InprocTransport::new(tcfg(node))),
        Kind::Ofi => OfiTransport::new(tcfg(node), "tcp").unwrap(),
    }
}

fn listen_addr(kind: Kind, test: &str) -> String {
    match kind {
        Kind::Inproc => format!("pubsub-{test}-{}", std::process::id()),
        _ => "127.0.0.1:0".into(),
    }
}

fn publisher(kind: Kind, test: &str, policy: SlowPolicy, max_queued: usize) -> (Publisher, String) {
    let cfg = PublisherConfig {
        policy,
        max_queued,
        send_threads: usize::from(kind == Kind::TcpSendThreads),
        messenger: MessengerConfig::default(),
    };
    let mut p = Publisher::new(transport(kind, &format!("pub-{test}")), cfg).unwrap();
    let addr = p.listen(&listen_addr(kind, test)).unwrap();
    (p, addr)
}

/// The payload of message `seq` of `tag`: tag and seq, then a pattern, `len` bytes in all.
fn payload(tag: u64, seq: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len.max(16))
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(tag * 7 + seq) as u8)
        .collect();
    v[..8].copy_from_slice(&tag.to_le_bytes());
    v[8..16].copy_from_slice(&seq.to_le_bytes());
    v
}

struct Client {
    sub: Subscriber,
    conn: ConnId,
    events: Vec<SubEvent>,
    /// (tag, seq) of every message, in arrival order.
    got: Vec<(u64, u64)>,
    /// Tag → (missed in all, gaps seen).
    missed: HashMap<u64, u64>,
    goodbye: Option<(GoodbyeCode, String)>,
    closed: bool,
    /// Tag → the next seq expected (checked: a jump must be announced by a Gap).
    next: HashMap<u64, u64>,
    /// Checked continuity (off while subscriptions change).
    strict: bool,
    name: String,
}

impl Client {
    fn new(kind: Kind, name: &str, addr: &str) -> Client {
        let mut sub = Subscriber::new(transport(kind, name), MessengerConfig::default());
        let conn = sub
            .connect(addr, Hello::new(Channel::Data, Role::Bu, 0, "ps", name))
            .unwrap();
        Client {
            sub,
            conn,
            events: Vec::new(),
            got: Vec::new(),
            missed: HashMap::new(),
            goodbye: None,
            closed: false,
            next: HashMap::new(),
            strict: true,
            name: name.to_string(),
        }
    }

    fn subscribe(&mut self, ranges: &[TagRange], d: Delivery) {
        self.sub.subscribe(self.conn, ranges, d).unwrap();
    }

    fn unsubscribe(&mut self, ranges: &[TagRange]) {
        self.sub.unsubscribe(self.conn, ranges).unwrap();
    }

    fn poll(&mut self) {
        self.sub
            .poll(&mut self.events, Some(Duration::ZERO))
            .unwrap();
        for e in self.events.drain(..) {
            match e {
                SubEvent::Message {
                    tag,
                    seq,
                    payload: p,
                    ..
                } => {
                    let flat = p.to_vec();
                    assert_eq!(
                        flat,
                        payload(tag, seq, flat.len()),
                        "payload of {tag}/{seq}"
                    );
                    if self.strict {
                        if let Some(&n) = self.next.get(&tag) {
                            assert_eq!(
                                seq, n,
                                "{}: tag {tag}: seq {seq} where {n} was due (silent loss?)",
                                self.name
                            );
                        }
                    }
                    self.next.insert(tag, seq + 1);
                    self.got.push((tag, seq));
                }
                SubEvent::Gap { tag, missed, .. } => {
                    *self.missed.entry(tag).or_default() += missed;
                    if let Some(n) = self.next.get_mut(&tag) {
                        *n += missed;
                    }
                }
                SubEvent::Goodbye { code, reason, .. } => self.goodbye = Some((code, reason)),
                SubEvent::Closed { .. } => self.closed = true,
                SubEvent::Connected { .. } => {}
            }
        }
    }

    fn total_missed(&self) -> u64 {
        self.missed.values().sum()
    }
}

/// Polls the publisher and the clients that read until `done`; panics after a generous
/// deadline (a hang is a failure).
fn pump(
    p: &mut Publisher,
    clients: &mut [&mut Client],
    mut done: impl FnMut(&Publisher, &[&mut Client]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done(p, clients) {
        assert!(Instant::now() < deadline, "timed out");
        p.poll(Some(Duration::ZERO)).unwrap();
        for c in clients.iter_mut() {
            c.poll();
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn r(first: u64, last: u64) -> TagRange {
    TagRange { first, last }
}

fn filtering_exact(kind: Kind) {
    if !available(kind) {
        return;
    }
    let (mut p, addr) = publisher(kind, "filter", SlowPolicy::Block, 64 << 20);
    let mut a = Client::new(kind, "a", &addr);
    a.subscribe(
        &[TagRange::one(1), TagRange::one(2), TagRange::one(3)],
        Delivery::Latency,
    );
    let mut b = Client::new(kind, "b", &addr);
    b.subscribe(&[r(100, 199)], Delivery::Throughput);
    let mut c = Client::new(kind, "c", &addr);
    c.subscribe(&[TagRange::one(2)], Delivery::Throughput);
    c.subscribe(&[TagRange::one(150)], Delivery::Throughput);
    pump(&mut p, &mut [&mut a, &mut b, &mut c], |p, _| {
        p.subscribers_of(1) == 1 && p.subscribers_of(150) == 2 && p.subscribers_of(2) == 2
    });
    assert_eq!(p.subscribers_of(0), 0);
    assert_eq!(p.subscribers_of(200), 0);
    let n = 3000u64;
    let mut sent: Vec<(u64, u64)> = Vec::new();
    let mut seqs: HashMap<u64, u64> = HashMap::new();
    for i in 0..n {
        let tag = i * 7 % 300;
        let seq = *seqs.entry(tag).and_modify(|s| *s += 1).or_insert(0);
        // mostly small (copied into each page), now and then large (written once into the
        // publisher's pool and shared by every subscriber's page)
        let len = if i % 97 == 0 {
            70_000 + i as usize
        } else {
            16 + (i as usize * 37 % 6000)
        };
        match p.publish(tag, &payload(tag, seq, len)).unwrap() {
            Publish::Sent(k) => {
                let want = [1, 2, 3].contains(&tag) as usize
                    + (100..200).contains(&tag) as usize
                    + [2, 150].contains(&tag) as usize;
                assert_eq!(k, want, "tag {tag}");
            }
            Publish::WouldBlock => panic!("nobody is slow"),
        }
        sent.push((tag, seq));
        if i % 100 == 0 {
            p.poll(Some(Duration::ZERO)).unwrap();
            a.poll();
            b.poll();
            c.poll();
        }
    }
    let want = |f: &dyn Fn(u64) -> bool| -> Vec<(u64, u64)> {
        sent.iter().copied().filter(|(t, _)| f(*t)).collect()
    };
    let wa = want(&|t| (1..=3).contains(&t));
    let wb = want(&|t| (100..=199).contains(&t));
    let wc = want(&|t| t == 2 || t == 150);
    assert!(!wa.is_empty() && !wb.is_empty() && !wc.is_empty());
    pump(&mut p, &mut [&mut a, &mut b, &mut c], |_, cs| {
        cs[0].got.len() >= wa.len() && cs[1].got.len() >= wb.len() && cs[2].got.len() >= wc.len()
    });
    // a moment more: nothing else may arrive
    for _ in 0..20 {
        p.poll(Some(Duration::ZERO)).unwrap();
        a.poll();
        b.poll();
        c.poll();
    }
    assert_eq!(a.got, wa);
    assert_eq!(b.got, wb);
    assert_eq!(c.got, wc);
    let s = p.stats();
    assert_eq!(s.published, n);
    assert_eq!(s.delivered, (wa.len() + wb.len() + wc.len()) as u64);
    assert_eq!(s.dropped, 0);
    assert_eq!(a.total_missed() + b.total_missed() + c.total_missed(), 0);
}

#[test]
fn filtering_exact_tcp() {
    filtering_exact(Kind::Tcp)
}
#[test]
fn filtering_exact_shm() {
    filtering_exact(Kind::Shm)
}
#[test]
fn filtering_exact_inproc() {
    filtering_exact(Kind::Inproc)
}

/// Subscribing and unsubscribing while the publisher keeps publishing: every tag's messages
/// arrive as one unbroken run of sequence numbers, from when the publisher learnt of the
/// subscription to when it learnt of the unsubscription; a subscriber that leaves disturbs
/// nobody.
fn churn(kind: Kind) {
    if !available(kind) {
        return;
    }
    let (mut p, addr) = publisher(kind, "churn", SlowPolicy::Block, 64 << 20);
    let mut a = Client::new(kind, "a", &addr);
    a.subscribe(&[TagRange::one(5)], Delivery::Latency);
    let mut stay = Client::new(kind, "stay", &addr);
    stay.subscribe(&[r(5, 6)], Delivery::Throughput);
    let mut leaver = Some(Client::new(kind, "leaver", &addr));
    leaver
        .as_mut()
        .unwrap()
        .subscribe(&[r(0, 10)], Delivery::Throughput);
    pump(
        &mut p,
        &mut [&mut a, &mut stay, leaver.as_mut().unwrap()],
        |p, _| p.subscribers_of(5) == 3,
    );
    let mut seqs = [0u64; 2];
    let mut phase = 0;
    let mut first6 = None;
    let mut last5 = None;
    for i in 0..6000u64 {
        for tag in [5u64, 6] {
            let seq = seqs[tag as usize - 5];
            assert!(matches!(
                p.publish(tag, &payload(tag, seq, 64)).unwrap(),
                Publish::Sent(_)
            ));
            seqs[tag as usize - 5] += 1;
        }
        p.poll(Some(Duration::ZERO)).unwrap();
        a.poll();
        stay.poll();
        if let Some(l) = leaver.as_mut() {
            l.poll();
        }
        match phase {
            0 if i == 1000 => {
                a.subscribe(&[TagRange::one(6)], Delivery::Latency);
                phase = 1;
            }
            1 if p.subscribers_of(6) == 3 => {
                // the publisher knows now: the next tag-6 message is the first `a` gets
                first6 = Some(seqs[1]);
                phase = 2;
            }
            2 if i >= 2500 => {
                a.unsubscribe(&[TagRange::one(5)]);
                leaver = None; // dropped: its connection closes
                phase = 3;
            }
            3 if p.subscribers_of(5) == 1 => {
                last5 = Some(seqs[0]);
                phase = 4;
            }
            _ => {}
        }
    }
    assert_eq!(phase, 4, "the publisher learnt of every change");
    let (first6, last5) = (first6.unwrap(), last5.unwrap());
    assert_eq!(p.subscribers(), 2);
    pump(&mut p, &mut [&mut a, &mut stay], |_, cs| {
        cs[1].got.len() as u64 == seqs[0] + seqs[1]
            && cs[0].got.iter().rfind(|g| g.0 == 6).map(|g| g.1) == Some(seqs[1] - 1)
    });
    // `stay` got everything, in order per tag, with no gap
    for tag in [5u64, 6] {
        let s: Vec<u64> = stay
            .got
            .iter()
            .filter(|g| g.0 == tag)
            .map(|g| g.1)
            .collect();
        assert_eq!(s, (0..seqs[tag as usize - 5]).collect::<Vec<_>>());
    }
    // `a`: tag 5 from 0 up to (at most) where the publisher learnt of the unsubscription,
    // unbroken; tag 6 unbroken from at most where the publisher learnt of the subscription
    let a5: Vec<u64> = a.got.iter().filter(|g| g.0 == 5).map(|g| g.1).collect();
    let a6: Vec<u64> = a.got.iter().filter(|g| g.0 == 6).map(|g| g.1).collect();
    assert_eq!(a5, (0..a5.len() as u64).collect::<Vec<_>>());
    assert!(a5.len() as u64 <= last5 && a5.len() as u64 >= 2500);
    let s6 = a6[0];
    assert!(s6 <= first6 && s6 >= 1000, "tag 6 from {s6}");
    assert_eq!(a6, (s6..seqs[1]).collect::<Vec<_>>());
    assert_eq!(p.stats().dropped, 0);
    assert_eq!(p.stats().subscribers_left, 1);
}

#[test]
fn filtering_exact_ofi() {
    filtering_exact(Kind::Ofi)
}

#[test]
fn churn_tcp() {
    churn(Kind::Tcp)
}
#[test]
fn filtering_exact_tcp_send_threads() {
    filtering_exact(Kind::TcpSendThreads)
}
#[test]
fn churn_tcp_send_threads() {
    churn(Kind::TcpSendThreads)
}
#[test]
fn churn_shm() {
    churn(Kind::Shm)
}
#[test]
fn churn_inproc() {
    churn(Kind::Inproc)
}
#[test]
fn churn_ofi() {
    churn(Kind::Ofi)
}

/// Thousands of tags: subscribers of scattered single tags and of ranges, a publisher
/// cycling through 5000 tags; each gets exactly its own.
fn many_tags(kind: Kind) {
    let (mut p, addr) = publisher(kind, "many", SlowPolicy::Block, 64 << 20);
    let mut odd = Client::new(kind, "odd", &addr);
    let odd_tags: Vec<TagRange> = (0..2500u64).map(|t| TagRange::one(2 * t + 1)).collect();
    odd.subscribe(&odd_tags, Delivery::Throughput);
    let mut low = Client::new(kind, "low", &addr);
    low.subscribe(&[r(0, 999), r(4000, 4999)], Delivery::Latency);
    pump(&mut p, &mut [&mut odd, &mut low], |p, _| {
        p.subscribed() == 2
    });
    assert_eq!(p.subscribers_of(4999), 2);
    assert_eq!(p.subscribers_of(2000), 0);
    let mut want_odd = Vec::new();
    let mut want_low = Vec::new();
    for round in 0..3u64 {
        for tag in 0..5000u64 {
            p.publish(tag, &payload(tag, round, 24)).unwrap();
            if tag % 2 == 1 {
                want_odd.push((tag, round));
            }
            if !(1000..4000).contains(&tag) {
                want_low.push((tag, round));
            }
            if tag % 500 == 0 {
                p.poll(Some(Duration::ZERO)).unwrap();
                odd.poll();
                low.poll();
            }
        }
    }
    pump(&mut p, &mut [&mut odd, &mut low], |_, cs| {
        cs[0].got.len() >= want_odd.len() && cs[1].got.len() >= want_low.len()
    });
    assert_eq!(odd.got, want_odd);
    assert_eq!(low.got, want_low);
    assert_eq!(
        p.stats().delivered,
        (want_odd.len() + want_low.len()) as u64
    );
}

#[test]
fn many_tags_tcp() {
    many_tags(Kind::Tcp)
}
#[test]
fn many_tags_inproc() {
    many_tags(Kind::Inproc)
}

const FLOOD: u64 = 8192;
const FLOOD_LEN: usize = 4096;

/// The slow-subscriber limit of the policy tests. Over shm a frame sent holds a whole
/// 256 KiB bounce block until the subscriber gives it back, so the limit there is larger.
fn limit(kind: Kind) -> usize {
    match kind {
        Kind::Shm => 4 << 20,
        _ => 64 * 1024,
    }
}

/// Policy drop: a subscriber that does not read misses messages, and is told exactly how
/// many of each tag; a fast one beside it misses nothing; the counts add up on both sides.
fn policy_drop(kind: Kind) {
    let (mut p, addr) = publisher(kind, "drop", SlowPolicy::Drop, limit(kind));
    let mut slow = Client::new(kind, "slow", &addr);
    slow.subscribe(&[r(0, 3)], Delivery::Throughput);
    let mut fast = Client::new(kind, "fast", &addr);
    fast.subscribe(&[r(0, 3)], Delivery::Latency);
    pump(&mut p, &mut [&mut slow, &mut fast], |p, _| {
        p.subscribers_of(0) == 2
    });
    let mut seqs = [0u64; 4];
    for i in 0..FLOOD {
        let tag = i % 4;
        let seq = seqs[tag as usize];
        seqs[tag as usize] += 1;
        assert!(matches!(
            p.publish(tag, &payload(tag, seq, FLOOD_LEN)).unwrap(),
            Publish::Sent(_)
        ));
        p.poll(Some(Duration::ZERO)).unwrap();
        // the fast one keeps up: at most max_queued waits for it
        let mut spins = 0;
        while p.stats().dropped > 0 && spins < 1000 && fast.got.len() as u64 + 64 < i {
            fast.poll();
            p.poll(Some(Duration::ZERO)).unwrap();
            spins += 1;
        }
        fast.poll();
    }
    let s = p.stats();
    assert!(
        s.dropped > 0,
        "the slow subscriber never fell behind: {s:?}"
    );
    // now the slow one reads: everything it was sent, then the gaps
    pump(&mut p, &mut [&mut slow, &mut fast], |_, cs| {
        cs[0].got.len() as u64 + cs[0].total_missed() == FLOOD && cs[1].got.len() as u64 == FLOOD
    });
    let s = p.stats();
    assert_eq!(fast.total_missed(), 0);
    assert_eq!(slow.got.len() as u64 + fast.got.len() as u64, s.delivered);
    assert_eq!(slow.total_missed(), s.dropped);
    assert_eq!(slow.sub.stats().missed, s.dropped);
    assert_eq!(slow.sub.stats().gaps, s.gaps_sent);
    // per tag: received + missed = published
    for tag in 0..4u64 {
        let got = slow.got.iter().filter(|g| g.0 == tag).count() as u64;
        assert_eq!(
            got + slow.missed.get(&tag).copied().unwrap_or(0),
            seqs[tag as usize],
            "tag {tag}"
        );
    }
}

#[test]
fn policy_drop_tcp() {
    policy_drop(Kind::Tcp)
}
#[test]
fn policy_drop_shm() {
    policy_drop(Kind::Shm)
}
#[test]
fn policy_drop_inproc() {
    policy_drop(Kind::Inproc)
}
#[test]
fn policy_drop_ofi() {
    if available(Kind::Ofi) {
        policy_drop(Kind::Ofi)
    }
}

/// Policy block: publish refuses (WouldBlock) while the subscriber is behind, and nothing is
/// lost: it gets every message in order once it reads.
fn policy_block(kind: Kind) {
    let (mut p, addr) = publisher(kind, "block", SlowPolicy::Block, limit(kind));
    let mut slow = Client::new(kind, "slow", &addr);
    slow.subscribe(&[TagRange::one(9)], Delivery::Throughput);
    pump(&mut p, &mut [&mut slow], |p, _| p.subscribers_of(9) == 1);
    // not read: the publisher must come to a stop
    let mut seq = 0;
    let mut blocked = false;
    for _ in 0..FLOOD {
        p.poll(Some(Duration::ZERO)).unwrap();
        match p.publish(9, &payload(9, seq, FLOOD_LEN)).unwrap() {
            Publish::Sent(1) => seq += 1,
            Publish::WouldBlock => {
                blocked = true;
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(blocked, "never blocked after {seq} messages");
    // a tag nobody subscribes to is not held back
    assert_eq!(p.publish(10, b"free").unwrap(), Publish::Sent(0));
    // then it reads, and the rest goes through
    while seq < FLOOD {
        match p.publish(9, &payload(9, seq, FLOOD_LEN)).unwrap() {
            Publish::Sent(1) => seq += 1,
            Publish::WouldBlock => {
                p.poll(Some(Duration::ZERO)).unwrap();
                slow.poll();
            }
            other => panic!("{other:?}"),
        }
    }
    pump(&mut p, &mut [&mut slow], |_, cs| {
        cs[0].got.len() as u64 == FLOOD
    });
    let want: Vec<(u64, u64)> = (0..FLOOD).map(|s| (9, s)).collect();
    assert_eq!(slow.got, want);
    let s = p.stats();
    assert_eq!(s.dropped, 0);
    assert!(s.would_block > 0);
    assert_eq!(s.delivered, FLOOD);
}

#[test]
fn policy_block_tcp() {
    policy_block(Kind::Tcp)
}
#[test]
fn policy_block_tcp_send_threads() {
    policy_block(Kind::TcpSendThreads)
}
#[test]
fn policy_block_shm() {
    policy_block(Kind::Shm)
}
#[test]
fn policy_block_inproc() {
    policy_block(Kind::Inproc)
}
#[test]
fn policy_block_ofi() {
    if available(Kind::Ofi) {
        policy_block(Kind::Ofi)
    }
}

/// Policy disconnect: the slow subscriber is cut off and told why, after an unbroken run of
/// messages; a fast one beside it loses nothing; the slow one may come back.
fn policy_disconnect(kind: Kind) {
    let (mut p, addr) = publisher(kind, "disc", SlowPolicy::Disconnect, limit(kind));
    let mut slow = Client::new(kind, "slow", &addr);
    slow.subscribe(&[TagRange::one(1)], Delivery::Throughput);
    let mut fast = Client::new(kind, "fast", &addr);
    fast.subscribe(&[TagRange::one(1)], Delivery::Throughput);
    pump(&mut p, &mut [&mut slow, &mut fast], |p, _| {
        p.subscribers_of(1) == 2
    });
    for seq in 0..FLOOD {
        assert!(matches!(
            p.publish(1, &payload(1, seq, FLOOD_LEN)).unwrap(),
            Publish::Sent(_)
        ));
        p.poll(Some(Duration::ZERO)).unwrap();
        let mut spins = 0;
        while p.stats().disconnected_slow > 0 && fast.got.len() as u64 + 32 < seq && spins < 1000 {
            fast.poll();
            p.poll(Some(Duration::ZERO)).unwrap();
            spins += 1;
        }
        fast.poll();
    }
    let s = p.stats();
    eprintln!("after flood: {s:?}");
    assert_eq!(s.disconnected_slow, 1, "{s:?}");
    assert_eq!(p.subscribers(), 1);
    pump(&mut p, &mut [&mut slow, &mut fast], |_, cs| {
        cs[0].closed && cs[1].got.len() as u64 == FLOOD
    });
    let (code, reason) = slow.goodbye.clone().expect("told why");
    assert_eq!(code, GoodbyeCode::SlowSubscriber);
    assert!(reason.contains("slow subscriber"), "{reason}");
    let k = slow.got.len() as u64;
    assert!(k > 0 && k < FLOOD);
    assert_eq!(slow.got, (0..k).map(|s| (1, s)).collect::<Vec<_>>());
    assert_eq!(k + FLOOD, p.stats().delivered);
    assert_eq!(fast.total_missed(), 0);
    // it comes back
    let mut again = Client::new(kind, "again", &addr);
    again.subscribe(&[TagRange::one(1)], Delivery::Latency);
    pump(&mut p, &mut [&mut again, &mut fast], |p, _| {
        p.subscribers_of(1) == 2
    });
    assert_eq!(
        p.publish(1, &payload(1, FLOOD, 100)).unwrap(),
        Publish::Sent(2)
    );
    pump(&mut p, &mut [&mut again, &mut fast], |_, cs| {
        cs[0].got.len() == 1
    });
    assert_eq!(again.got, vec![(1, FLOOD)]);
}

#[test]
fn policy_disconnect_tcp() {
    policy_disconnect(Kind::Tcp)
}
#[test]
fn policy_disconnect_shm() {
    policy_disconnect(Kind::Shm)
}
#[test]
fn policy_disconnect_inproc() {
    policy_disconnect(Kind::Inproc)
}
#[test]
fn policy_disconnect_ofi() {
    if available(Kind::Ofi) {
        policy_disconnect(Kind::Ofi)
    }
}

/// Bad subscribers: garbage, a message a subscriber may not send, a tag set beyond the
/// limit. Each loses its connection (told why where it can be told); the publisher and a
/// good subscriber carry on.
fn bad_input(kind: Kind) {
    let (mut p, addr) = publisher(kind, "bad", SlowPolicy::Drop, 1 << 20);
    let mut good = Client::new(kind, "good", &addr);
    good.subscribe(&[TagRange::one(3)], Delivery::Latency);
    // a raw messenger speaking nonsense after a proper handshake
    let mut raw = Messenger::new(transport(kind, "raw"), MessengerConfig::default());
    let rc = raw
        .connect(&addr, Hello::new(Channel::Data, Role::Bu, 0, "ps", "raw"))
        .unwrap();
    let mut rev = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !rev
        .iter()
        .any(|e| matches!(e, evb_messaging::Incoming::Connected { .. }))
    {
        assert!(Instant::now() < deadline);
        raw.poll(&mut rev, Some(Duration::ZERO)).unwrap();
        p.poll(Some(Duration::ZERO)).unwrap();
        good.poll();
    }
    // a Subscribe claiming 2^32-1 ranges with 8 bytes of them
    let mut bogus = PubSubMessage::Subscribe {
        delivery: Delivery::Latency,
        ranges: vec![TagRange::one(1)],
    }
    .encode();
    bogus[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    raw.send_encoded_now(rc, bogus).unwrap();
    // a liar about its length is closed too; and a greedy subscriber
    let mut greedy = Client::new(kind, "greedy", &addr);
    let many: Vec<TagRange> = (0..(MAX_SUBSCRIBER_RANGES as u64 + 10))
        .map(|t| TagRange::one(t * 2))
        .collect();
    greedy.subscribe(&many, Delivery::Latency);
    // one that sends an event-building message
    let mut rude = Messenger::new(transport(kind, "rude"), MessengerConfig::default());
    let rudec = rude
        .connect(&addr, Hello::new(Channel::Data, Role::Bu, 0, "ps", "rude"))
        .unwrap();
    let mut rude_ev = Vec::new();
    let mut rude_sent = false;
    let mut raw_closed = false;
    let mut rude_closed = false;
    let mut seq3 = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(raw_closed && rude_closed && greedy.closed) {
        assert!(
            Instant::now() < deadline,
            "raw {raw_closed} rude {rude_closed} greedy {}",
            greedy.closed
        );
        p.poll(Some(Duration::ZERO)).unwrap();
        good.poll();
        greedy.poll();
        raw.poll(&mut rev, Some(Duration::ZERO)).unwrap();
        raw_closed |= rev
            .iter()
            .any(|e| matches!(e, evb_messaging::Incoming::Closed { .. }));
        rude.poll(&mut rude_ev, Some(Duration::ZERO)).unwrap();
        if !rude_sent
            && rude_ev
                .iter()
                .any(|e| matches!(e, evb_messaging::Incoming::Connected { .. }))
        {
            rude.send_now(rudec, &Message::Heartbeat).unwrap();
            rude_sent = true;
        }
        rude_closed |= rude_ev
            .iter()
            .any(|e| matches!(e, evb_messaging::Incoming::Closed { .. }));
        // the good one is served all along
        p.publish(3, &payload(3, seq3, 32)).unwrap();
        seq3 += 1;
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(
        greedy.goodbye.as_ref().map(|g| g.0),
        Some(GoodbyeCode::BadRequest)
    );
    assert!(rude_ev.iter().any(|e| matches!(
        e,
        evb_messaging::Incoming::Received {
            msg: evb_messaging::Received::PubSub(PubSubMessage::Goodbye {
                code: GoodbyeCode::BadRequest,
                ..
            }),
            ..
        }
    )));
    assert_eq!(p.stats().disconnected_bad, 2);
    assert_eq!(p.subscribers(), 1);
    let before = good.got.len();
    p.publish(3, &payload(3, seq3, 32)).unwrap();
    pump(&mut p, &mut [&mut good], |_, cs| cs[0].got.len() > before);
    assert_eq!(good.total_missed(), 0);
}

#[test]
fn bad_input_tcp() {
    bad_input(Kind::Tcp)
}
#[test]
fn bad_input_shm() {
    bad_input(Kind::Shm)
}
#[test]
fn bad_input_inproc() {
    bad_input(Kind::Inproc)
}
#[test]
fn bad_input_ofi() {
    if available(Kind::Ofi) {
        bad_input(Kind::Ofi);
    }
}

/// A subscriber may subscribe to several publishers; each publisher's messages stay in
/// order.
#[test]
fn several_publishers() {
    for kind in KINDS {
        let (mut p1, a1) = publisher(kind, "multi1", SlowPolicy::Block, 1 << 20);
        let (mut p2, a2) = publisher(kind, "multi2", SlowPolicy::Block, 1 << 20);
        let mut sub = Subscriber::new(transport(kind, "multi-sub"), MessengerConfig::default());
        let h = Hello::new(Channel::Data, Role::Bu, 0, "ps", "multi-sub");
        let c1 = sub.connect(&a1, h.clone()).unwrap();
        let c2 = sub.connect(&a2, h).unwrap();
        sub.subscribe(c1, &[TagRange::one(1)], Delivery::Latency)
            .unwrap();
        sub.subscribe(c2, &[TagRange::one(1)], Delivery::Throughput)
            .unwrap();
        let mut ev = Vec::new();
        let mut got: Vec<(ConnId, u64)> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut sent = 0u64;
        while got.len() < 200 {
            assert!(Instant::now() < deadline, "{kind:?}");
            p1.poll(Some(Duration::ZERO)).unwrap();
            p2.poll(Some(Duration::ZERO)).unwrap();
            if sent < 100 && p1.subscribers_of(1) == 1 && p2.subscribers_of(1) == 1 {
                p1.publish(1, &payload(1, sent, 40)).unwrap();
                p2.publish(1, &payload(1, sent, 40)).unwrap();
                sent += 1;
            }
            sub.poll(&mut ev, Some(Duration::ZERO)).unwrap();
            for e in ev.drain(..) {
                if let SubEvent::Message { publisher, seq, .. } = e {
                    got.push((publisher, seq));
                }
            }
        }
        for c in [c1, c2] {
            let s: Vec<u64> = got.iter().filter(|g| g.0 == c).map(|g| g.1).collect();
            assert_eq!(s, (0..100).collect::<Vec<_>>(), "{kind:?}");
        }
    }
}

/// With a shared secret, a subscriber without it never gets to subscribe.
#[test]
fn subscribing_needs_the_handshake() {
    let mut pc = tcfg("secret-pub");
    pc.secret = Some(b"s3cret".to_vec());
    let mut p = Publisher::new(
        Box::new(TcpTransport::new(pc).unwrap()),
        PublisherConfig::default(),
    )
    .unwrap();
    let addr = p.listen("127.0.0.1:0").unwrap();
    let mut sub = Subscriber::new(
        Box::new(TcpTransport::new(tcfg("nosecret")).unwrap()),
        MessengerConfig::default(),
    );
    let c = sub
        .connect(
            &addr,
            Hello::new(Channel::Data, Role::Bu, 0, "ps", "nosecret"),
        )
        .unwrap();
    sub.subscribe(c, &[r(0, u64::MAX)], Delivery::Latency)
        .unwrap();
    let mut ev = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline);
        p.poll(Some(Duration::ZERO)).unwrap();
        sub.poll(&mut ev, Some(Duration::from_millis(1))).unwrap();
        if ev.iter().any(|e| matches!(e, SubEvent::Closed { .. })) {
            break;
        }
    }
    assert!(!ev.iter().any(|e| matches!(e, SubEvent::Connected { .. })));
    assert_eq!(p.subscribers(), 0);
    assert_eq!(p.publish(7, b"x").unwrap(), Publish::Sent(0));
}

/// A subscriber cut off for being slow that then never reads again (nor closes) does not
/// keep its connection and queue at the publisher for ever (tcp: dropped after 10 s without
/// progress).
#[test]
fn a_cut_off_subscriber_that_never_reads_is_let_go() {
    let kind = Kind::Tcp;
    let (mut p, addr) = publisher(kind, "never", SlowPolicy::Disconnect, 64 * 1024);
    let mut slow = Client::new(kind, "never", &addr);
    slow.subscribe(&[TagRange::one(1)], Delivery::Throughput);
    pump(&mut p, &mut [&mut slow], |p, _| p.subscribed() == 1);
    let conn = p
        .take_events()
        .into_iter()
        .find_map(|e| match e {
            PubEvent::Joined { conn, peer } if peer.node_id == "never" => Some(conn),
            _ => None,
        })
        .expect("joined");
    let mut seq = 0;
    while p.stats().disconnected_slow == 0 {
        assert!(seq < 100_000, "never cut off");
        p.publish(1, &payload(1, seq, 4096)).unwrap();
        p.poll(Some(Duration::ZERO)).unwrap();
        seq += 1;
    }
    assert_eq!(p.subscribers(), 0);
    assert!(
        p.queued_bytes(conn) > 0,
        "its queue is stuck behind a peer that reads nothing"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while p.queued_bytes(conn) > 0 {
        assert!(Instant::now() < deadline, "the connection was never let go");
        p.poll(Some(Duration::from_millis(50))).unwrap();
    }
    // the publisher still serves others
    let mut fresh = Client::new(kind, "fresh", &addr);
    fresh.subscribe(&[TagRange::one(1)], Delivery::Latency);
    pump(&mut p, &mut [&mut fresh], |p, _| p.subscribed() == 1);
    p.publish(1, &payload(1, seq, 64)).unwrap();
    pump(&mut p, &mut [&mut fresh], |_, cs| cs[0].got.len() == 1);
    drop(slow);
}

/// `publish_chain`: a message written once into the publisher's pool (one block or several)
/// and published again and again without a copy reaches every subscriber of its tag intact,
/// in order, mixed with copied messages; the blocks are reused once every copy is sent.
fn published_chains(kind: Kind) {
    if !available(kind) {
        return;
    }
    let (mut p, addr) = publisher(kind, "chain", SlowPolicy::Block, 64 << 20);
    let mut a = Client::new(kind, "ca", &addr);
    a.subscribe(&[TagRange::one(5)], Delivery::Throughput);
    let mut b = Client::new(kind, "cb", &addr);
    b.subscribe(&[r(4, 6)], Delivery::Latency);
    pump(&mut p, &mut [&mut a, &mut b], |p, _| {
        p.subscribers_of(5) == 2
    });
    let pool = p.pool().expect("a shared pool").clone();
    let mut sent = 0u64;
    for seq in 0..200u64 {
        if seq % 3 == 2 {
            // a copied one between the chains: one sequence for both kinds
            assert_eq!(
                p.publish(5, &payload(5, seq, 3000)).unwrap(),
                Publish::Sent(2)
            );
        } else {
            // 300 KB over two or more blocks, made for this message: the publisher keeps
            // references, we drop ours
            let bytes = payload(5, seq, 300_000);
            let mut chain = evb_buffers::Chain::new();
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let mut w = loop {
                    match pool.try_alloc() {
                        Some(w) => break w,
                        None => {
                            // every block still held by subscribers' queues
                            p.poll(Some(Duration::from_millis(1))).unwrap();
                            a.poll();
                            b.poll();
                        }
                    }
                };
                let n = rest.len().min(w.remaining());
                chain.push(w.append(&rest[..n]).unwrap());
                rest = &rest[n..];
            }
            loop {
                match p.publish_chain(5, &chain).unwrap() {
                    Publish::Sent(k) => {
                        assert_eq!(k, 2);
                        break;
                    }
                    Publish::WouldBlock => {
                        p.poll(Some(Duration::from_millis(1))).unwrap();
                        a.poll();
                        b.poll();
                    }
                }
            }
        }
        sent += 1;
        if seq % 10 == 0 {
            p.poll(Some(Duration::ZERO)).unwrap();
        }
    }
    p.flush();
    pump(&mut p, &mut [&mut a, &mut b], |_, c| {
        c.iter().all(|c| c.got.len() as u64 == sent)
    });
    for c in [&a, &b] {
        let want: Vec<(u64, u64)> = (0..sent).map(|s| (5, s)).collect();
        assert_eq!(c.got, want, "{}: every message once, in order", c.name);
        assert_eq!(c.total_missed(), 0);
    }
    assert_eq!(p.stats().delivered, 2 * sent);
}

#[test]
fn published_chains_tcp() {
    published_chains(Kind::Tcp);
}
#[test]
fn published_chains_tcp_send_threads() {
    published_chains(Kind::TcpSendThreads);
}
#[test]
fn published_chains_shm() {
    published_chains(Kind::Shm);
}
#[test]
fn published_chains_inproc() {
    published_chains(Kind::Inproc);
}
#[test]
fn published_chains_ofi() {
    if available(Kind::Ofi) {
        published_chains(Kind::Ofi);
    }
}

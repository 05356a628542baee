//! What an incoming connection may cost before its handshake has succeeded: the limits
//! ([`Admission`]), and how the transport keeps to them (shedding stalled handshakes for
//! newcomers, closing those past their deadline).

use super::*;

/// What an incoming connection may cost before its handshake has succeeded.
///
/// When a new connection finds its IP's or all places taken, an unfinished handshake (from
/// that IP, or from anyone) is shed to make room: the oldest of those whose peer has not
/// sent a whole Hello yet, whatever its age (a peer of evb sends its Hello as it connects,
/// and the transport reads a newcomer's first bytes as soon as it accepts it, so a socket
/// still in its first frame is stalled, or too new to matter); else the oldest that sent
/// its Hello and has waited at least `shed_after` for its proof. A newcomer is closed at once
/// only when every place is held by a peer that sent its Hello within `shed_after`. So
/// strangers that reconnect as fast as they are shed cannot keep a peer out by their age,
/// as they could when only handshakes older than `shed_after` were shed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// An incoming connection that has not completed its handshake by then is closed.
    pub handshake_deadline: Duration,
    /// Incoming connections still handshaking, from one IP address.
    pub per_ip: usize,
    /// Incoming connections still handshaking, in all.
    pub total: usize,
    /// An unfinished handshake at least this old may be shed for a newcomer.
    pub shed_after: Duration,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            handshake_deadline: Duration::from_secs(5),
            per_ip: 8,
            total: 64,
            shed_after: Duration::from_millis(250),
        }
    }
}

impl Admission {
    /// The limits for a node that expects up to `peers` other nodes to connect to it at once
    /// (all of them may share one IP: every node of `evb run` is on 127.0.0.1).
    pub fn for_peers(peers: usize) -> Admission {
        let d = Admission::default();
        let per_ip = d.per_ip.max(2 * peers + 8);
        Admission {
            per_ip,
            total: d.total.max(per_ip + d.total),
            ..d
        }
    }
}

impl TcpTransport {
    /// Incoming connections not admitted yet: from `ip`, and in all.
    fn unadmitted(&self, ip: IpAddr) -> (usize, usize) {
        let mut from_ip = 0;
        let mut total = 0;
        for c in self.conns.values() {
            if let (false, Some((peer, _))) = (c.admitted, c.inbound) {
                total += 1;
                from_ip += usize::from(peer == ip);
            }
        }
        (from_ip, total)
    }

    /// Makes a place for a new incoming connection from `ip` within the [`Admission`] limits,
    /// shedding the oldest unfinished handshake (of that IP when its limit is the one
    /// reached) if it is old enough. False: no place; the newcomer is to be closed.
    pub(super) fn make_room(&mut self, ip: IpAddr) -> bool {
        let (from_ip, total) = self.unadmitted(ip);
        let ip_full = from_ip >= self.admission.per_ip;
        if !ip_full && total < self.admission.total {
            return true;
        }
        // stalled in its first frame before waiting for a proof, then the oldest first
        let victim = self
            .conns
            .iter()
            .filter(|(_, c)| !c.admitted)
            .filter_map(|(t, c)| c.inbound.map(|(p, at)| (*t, p, at, c.hs.hello_seen())))
            .filter(|(_, p, _, _)| !ip_full || *p == ip)
            .filter(|(_, _, at, hello)| !hello || at.elapsed() >= self.admission.shed_after)
            .min_by_key(|(_, _, at, hello)| (*hello, *at));
        let Some((token, _, at, _)) = victim else {
            return false;
        };
        let waited = at.elapsed();
        let reason = CloseReason::Rejected(format!(
            "shed after {} ms without a finished handshake, for a newer connection (limits: {} per IP, {} in all)",
            waited.as_millis(),
            self.admission.per_ip,
            self.admission.total
        ));
        let mut out = Vec::new();
        self.drop_conn(token, reason, &mut out);
        self.pending_events.extend(out);
        true
    }

    /// The earliest handshake deadline of an incoming connection, if any.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.conns
            .values()
            .filter(|c| !c.admitted)
            .filter_map(|c| {
                c.inbound
                    .map(|(_, t)| t + self.admission.handshake_deadline)
            })
            .min()
    }

    /// Closes incoming connections whose handshake has taken too long.
    pub(super) fn expire_handshakes(&mut self, out: &mut Vec<Event>) {
        // no clock reading on every poll of a run whose connections are all admitted
        if self
            .conns
            .values()
            .all(|c| c.admitted || c.inbound.is_none())
        {
            return;
        }
        let now = Instant::now();
        let limit = self.admission.handshake_deadline;
        let late: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.admitted)
            .filter(|(_, c)| c.inbound.is_some_and(|(_, t)| now >= t + limit))
            .map(|(t, _)| *t)
            .collect();
        for t in late {
            let reason = CloseReason::Rejected(format!(
                "handshake not completed within {} ms",
                limit.as_millis()
            ));
            if let Some(c) = self.conns.get_mut(&t) {
                c.close_reason = None;
            }
            self.drop_conn(t, reason, out);
        }
    }
}

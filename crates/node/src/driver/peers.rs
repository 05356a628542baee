//! The driver's connections: dialling, identifying who called, losing and calling again,
//! and liveness (heartbeats, and a node that finds it did not run for a while).

use super::liveness::Liveness;
use super::*;
use crate::session::{Authority, Incarnation};

/// How often a peer that does not answer is called while the node's set comes up.
pub(super) const CALL_EVERY: Duration = Duration::from_millis(50);
/// How often a peer lost during the run is called again.
pub(super) const RECALL_EVERY: Duration = Duration::from_millis(200);

/// What becomes of a connection accepted (see [`Links::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    /// A node of the configuration, not connected yet: in.
    Accept(NodeRef),
    /// No node of the configuration calls this one so: closed.
    Stranger,
    /// A second connection for a node connected already (two processes claim one node, or
    /// a stale one): refused, or the launch aborted before the run starts.
    Second(NodeRef),
    /// A restarted BU with the incarnation of the process it replaces: refused.
    ReusedIncarnation(NodeRef),
    /// A BU whose Hello says incarnation 0, which is none (protocol.md §3): refused.
    NoIncarnation(NodeRef),
}

/// An outgoing connection still being set up.
pub(super) struct Dial {
    pub(super) peer: NodeRef,
    pub(super) addr: String,
    pub(super) channel: Channel,
    pub(super) retry_at: Option<Instant>,
}

/// The node's links to its peers: who is connected on which connection, the calls being
/// made and to be made again, when each control peer was last heard, the heartbeat and
/// liveness timers.
pub(super) struct Links {
    pub(super) peers: FastMap<ConnId, NodeRef>,
    conns: FastMap<NodeRef, ConnId>,
    dialing: FastMap<ConnId, Dial>,
    pub(super) waiting_dials: Vec<Dial>,
    /// Where each peer we call can be reached, to call it again after a loss.
    pub(super) dial_specs: FastMap<NodeRef, (String, Channel)>,
    /// Who is alive: heartbeats due, peers silent too long, this node's own pauses.
    pub(super) liveness: Liveness,
    /// The receive pool, watched for running dry.
    rx: RxWatch,
    /// Where this node's data listener is bound.
    bound: String,
    /// This process's incarnation (a BU's; 0 for the others), in every Hello it sends.
    incarnation: u16,
    /// Each connected BU's incarnation, from its Hello.
    incarnations: FastMap<NodeRef, u16>,
    /// At the EVM: the incarnation of each BU's last control connection in this run, to
    /// refuse a restarted BU that drew its predecessor's number (1 in 65,535).
    pub(super) seen_incarnations: FastMap<NodeRef, u16>,
    /// At an RU or BU: the door for EVMs (the highest epoch followed in this run, and the
    /// connection whose Term was admitted); see [`Authority`].
    pub(super) authority: Authority,
    /// How many connections make this node's set.
    expected: usize,
    /// Every connection was up once (the run may have lost some since).
    up: bool,
    /// Until when connections are awaited (`run.connect_timeout_s`).
    connect_deadline: Instant,
    /// Spare BUs: not of the set awaited at the start (the run starts without them), and
    /// called for as long as the node lives (each joins when its process starts).
    spares: FastSet<NodeRef>,
}

impl Links {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        bound: String,
        incarnation: u16,
        dials: Vec<Dial>,
        expected: usize,
        connect_deadline: Instant,
        heartbeat: Duration,
        timeout: Duration,
        now: Instant,
    ) -> Links {
        let dial_specs = dials
            .iter()
            .map(|d| (d.peer, (d.addr.clone(), d.channel)))
            .collect();
        Links {
            peers: FastMap::default(),
            conns: FastMap::default(),
            dialing: FastMap::default(),
            waiting_dials: dials,
            dial_specs,
            liveness: Liveness::new(heartbeat, timeout, now),
            rx: RxWatch::default(),
            bound,
            incarnation,
            incarnations: FastMap::default(),
            seen_incarnations: FastMap::default(),
            authority: Authority::default(),
            expected,
            up: false,
            connect_deadline,
            spares: FastSet::default(),
        }
    }

    /// The spare BUs among this node's peers (see [`Links::spares`]).
    pub(super) fn set_spares(&mut self, spares: impl IntoIterator<Item = NodeRef>) {
        self.spares = spares.into_iter().collect();
    }

    /// Peer `p` is a spare BU.
    pub(super) fn is_spare(&self, p: NodeRef) -> bool {
        self.spares.contains(&p)
    }

    /// How many of the connections up are of the set awaited at the start.
    fn of_the_set(&self) -> usize {
        self.conns
            .keys()
            .filter(|p| !self.spares.contains(p))
            .count()
    }

    /// The pool the transport reads into (see [`RxWatch`]).
    pub(super) fn watch_rx_pool(&mut self, pool: evb_buffers::Pool) {
        self.rx = RxWatch {
            exhausted: pool.stats().exhausted,
            pool: Some(pool),
        };
    }

    /// Where this node's data listener is bound.
    pub(super) fn bound(&self) -> &str {
        &self.bound
    }

    /// The connection to peer `p`, if it is connected.
    #[inline]
    pub(super) fn conn(&self, p: NodeRef) -> Option<ConnId> {
        self.conns.get(&p).copied()
    }

    /// The connected peers and their connections.
    pub(super) fn conns(&self) -> impl Iterator<Item = (NodeRef, ConnId)> + '_ {
        self.conns.iter().map(|(p, c)| (*p, *c))
    }

    /// The connection to BU `p` if it is of incarnation `inc` (any other peer: its
    /// connection). Fragments go nowhere else (docs/protocol.md §6 item 11).
    #[inline]
    pub(super) fn conn_to_incarnation(&self, p: NodeRef, inc: u16) -> Option<ConnId> {
        let conn = self.conn(p)?;
        match p {
            NodeRef::Bu(_) if self.incarnation_of(p) != inc => None,
            _ => Some(conn),
        }
    }

    /// The incarnation of connected BU `p` (0: not connected, or not a BU).
    pub(super) fn incarnation_of(&self, p: NodeRef) -> u16 {
        self.incarnations.get(&p).copied().unwrap_or(0)
    }

    /// This process's incarnation.
    pub(super) fn own_incarnation(&self) -> u16 {
        self.incarnation
    }

    /// The incarnations of the BUs connected now, by BU index (0: none).
    pub(super) fn bu_incarnations(&self, n_bu: usize) -> Vec<u16> {
        (0..n_bu)
            .map(|b| self.incarnation_of(NodeRef::Bu(b as u16)))
            .collect()
    }

    /// How many peers are connected, of how many expected.
    pub(super) fn connected(&self) -> (usize, usize) {
        (self.of_the_set(), self.expected)
    }

    /// Every connection was up once.
    #[inline]
    pub(super) fn is_up(&self) -> bool {
        self.up
    }

    /// Every expected connection is up now.
    pub(super) fn complete(&self) -> bool {
        self.of_the_set() == self.expected
    }

    pub(super) fn mark_up(&mut self) {
        self.up = true;
    }

    /// The set was not up after all (the EVM connection was not the run's EVM): the next
    /// time it is, the node says Ready again.
    pub(super) fn mark_down(&mut self) {
        self.up = false;
    }

    /// When a node of role `me` gives up waiting for its peers (see
    /// [`Driver::own_connect_deadline`]).
    pub(super) fn connect_deadline(&self, me: Role) -> Instant {
        if me != Role::Evm && self.conns.contains_key(&NodeRef::Evm) {
            self.connect_deadline + EVM_NAMES_GRACE
        } else {
            self.connect_deadline
        }
    }

    /// The calls due at `now`, taken from those waiting.
    pub(super) fn due_dials(&mut self, now: Instant) -> Vec<Dial> {
        let (ready, later): (Vec<Dial>, Vec<Dial>) = self
            .waiting_dials
            .drain(..)
            .partition(|d| d.retry_at.is_none_or(|t| t <= now));
        self.waiting_dials = later;
        ready
    }

    /// When a call that failed at `now` is made again (`rejected`: the peer refused the
    /// handshake): every [`RECALL_EVERY`] for as long as the run lasts once every
    /// connection was up (a lost peer may come back: a restarted BU is found so), every
    /// [`CALL_EVERY`] before that until the connect deadline; a spare BU every
    /// [`RECALL_EVERY`] from the start (it joins whenever its process starts). `None`: give
    /// up (a refusal, or the deadline passed before the set was up).
    pub(super) fn retry_at(&self, now: Instant, rejected: bool, peer: NodeRef) -> Option<Instant> {
        match (rejected, self.up || self.spares.contains(&peer)) {
            (true, _) => None,
            (false, true) => Some(now + RECALL_EVERY),
            (false, false) => (now < self.connect_deadline).then(|| now + CALL_EVERY),
        }
    }

    /// Whether a connection from `who` (the configuration's node its Hello names, `None`:
    /// none that should call this one on that channel), a BU of `incarnation`, is let in.
    /// `evm`: this node is the EVM, which remembers each BU's last incarnation.
    pub(super) fn admit(&self, who: Option<NodeRef>, incarnation: u16, evm: bool) -> Admit {
        match who {
            None => Admit::Stranger,
            Some(p) if self.conns.contains_key(&p) => Admit::Second(p),
            Some(p @ NodeRef::Bu(_)) if evm && Incarnation::from_wire(incarnation).is_none() => {
                Admit::NoIncarnation(p)
            }
            Some(p @ NodeRef::Bu(_))
                if evm && self.seen_incarnations.get(&p) == Some(&incarnation) =>
            {
                Admit::ReusedIncarnation(p)
            }
            Some(p) => Admit::Accept(p),
        }
    }

    /// Drops what is known of peer `p` and its connection.
    fn forget(&mut self, p: NodeRef, conn: ConnId) {
        self.authority.lost(conn);
        self.peers.remove(&conn);
        self.conns.remove(&p);
        self.liveness.forget(p);
        self.incarnations.remove(&p);
    }

    /// Peer `p` is connected on `conn`, heard from now; a BU's Hello said `incarnation`.
    fn add(&mut self, now: Instant, p: NodeRef, conn: ConnId, incarnation: u16) {
        self.peers.insert(conn, p);
        self.conns.insert(p, conn);
        self.liveness.heard(p, now);
        if matches!(p, NodeRef::Bu(_)) {
            self.incarnations.insert(p, incarnation);
        }
    }
}

impl Driver {
    pub(super) fn dial(&mut self, now: Instant) -> Result<(), NodeError> {
        let mut due = self.links.due_dials(now).into_iter();
        while let Some(mut d) = due.next() {
            let hello = setup::hello(&self.cfg, &self.me, d.channel, self.links.incarnation);
            match self.messenger.connect(&d.addr, hello) {
                Ok(conn) => {
                    self.links.dialing.insert(conn, d);
                }
                // calling a peer lost during the run again: a route that refuses at once (a
                // blackhole route, a network unreachable for now) is tried again later, as a
                // refused connection is; the run goes on without that peer meanwhile
                Err(e) if self.links.up || self.links.is_spare(d.peer) => {
                    debug!(node = %self.me.id, "calling {} again at {} failed: {e}", d.peer, d.addr);
                    d.retry_at = self.links.retry_at(now, false, d.peer);
                    self.links.waiting_dials.push(d);
                }
                Err(e) => {
                    self.links.waiting_dials.extend(due);
                    return Err(NodeError::Connect(d.addr.clone(), e.to_string()));
                }
            }
        }
        Ok(())
    }

    /// Checks an incoming handshake against the configuration.
    pub(super) fn identify(&self, peer: &Hello) -> Option<NodeRef> {
        let role = match peer.role {
            evb_wire::Role::Evm => Role::Evm,
            evb_wire::Role::Ru => Role::Ru,
            evb_wire::Role::Bu => Role::Bu,
        };
        let spec = self
            .nodes
            .iter()
            .find(|n| n.role == role && n.index == peer.index)?;
        if spec.id != peer.node_id {
            return None;
        }
        let wanted = match (self.me.role, role) {
            (Role::Evm, Role::Ru | Role::Bu) => peer.channel == Channel::Control,
            (Role::Bu, Role::Ru) => peer.channel == Channel::Data,
            _ => false,
        };
        wanted.then(|| node_ref(spec))
    }

    pub(super) fn on_incoming(&mut self, now: Instant, inc: Incoming) -> Result<(), NodeError> {
        if self.standby_incoming(now, &inc) {
            return Ok(());
        }
        match inc {
            Incoming::Connected { conn, peer } => {
                if let Some(d) = self.links.dialing.remove(&conn) {
                    debug!(node = %self.me.id, peer = %peer.node_id, "connected");
                    self.links.add(now, d.peer, conn, peer.incarnation);
                    self.reached(d.peer, peer.incarnation);
                    if d.peer == NodeRef::Evm {
                        // a node that left its EVM for the standby: what it holds, first (a
                        // standby that has not taken over takes a node only by its resync)
                        self.send_resync(conn);
                        // then who and where this process is
                        let me =
                            crate::discovery::registration(&self.links.bound, &self.control.api());
                        if let Err(e) = self.messenger.send_now(conn, &Message::Register(me)) {
                            debug!(node = %self.me.id, "register with the EVM failed: {e}");
                        }
                    }
                }
            }
            Incoming::Accepted { conn, peer } => match self.links.admit(
                self.identify(&peer),
                peer.incarnation,
                matches!(self.logic, Logic::Evm(_)),
            ) {
                Admit::ReusedIncarnation(p) => {
                    // a restarted BU that drew its predecessor's number: RUs could not tell
                    // the two apart, so it must not join (a new process draws another)
                    warn!(node = %self.me.id, "{p} ({}) called with incarnation {}, that of the process it replaces; refused: restart it", peer.node_id, peer.incarnation);
                    self.messenger.close(conn);
                }
                Admit::NoIncarnation(p) => {
                    // RUs hold an Assign that names 0 (protocol.md §6 item 11): such a BU
                    // would get no fragment from an RU that follows the docs
                    warn!(node = %self.me.id, "{p} ({}) called with incarnation 0, which is none (1…65535, protocol.md §3); refused", peer.node_id);
                    self.messenger.close(conn);
                }
                Admit::Accept(p) => {
                    debug!(node = %self.me.id, peer = %peer.node_id, "accepted");
                    self.links.add(now, p, conn, peer.incarnation);
                    self.reached(p, peer.incarnation);
                    if matches!(self.logic, Logic::Evm(_))
                        && !matches!(self.standby, super::standby::Standby::Follower(_))
                    {
                        // first on a node's control connection: the epoch this EVM speaks at
                        // (a standby that has not taken over says it only to a node that
                        // resyncs with it: standby_message)
                        let term = Message::Term {
                            epoch: self.own_epoch().get(),
                        };
                        if let Err(e) = self.messenger.send_now(conn, &term) {
                            debug!(node = %self.me.id, "term to {p} failed: {e}");
                        }
                    }
                    let follower = matches!(self.standby, super::standby::Standby::Follower(_));
                    if let (NodeRef::Bu(bu), Logic::Evm(e), false) = (p, &mut self.logic, follower)
                    {
                        self.links.seen_incarnations.insert(p, peer.incarnation);
                        e.set_incarnation(bu, peer.incarnation);
                    }
                }
                Admit::Second(p) => {
                    let before_start =
                        matches!(self.state(), RunState::Configured | RunState::Ready);
                    if before_start && matches!(self.logic, Logic::Evm(_)) {
                        // two processes run one node: a launch mistake, fatal for the run
                        let first = self
                            .evm
                            .registry
                            .get(&p)
                            .map_or("a process that has not registered".into(), |r| r.describe());
                        let why = format!(
                            "two processes claim {} (rank {}): the first is {first}; each \
                             node of the configuration must be started once",
                            peer.node_id,
                            self.rank_of(p)
                        );
                        // (its Term first: a node heeds no EVM word before it)
                        let term = Message::Term {
                            epoch: self.own_epoch().get(),
                        };
                        let _ = self.messenger.send_now(conn, &term);
                        let _ = self.messenger.send_now(conn, &Message::Abort(why.clone()));
                        self.messenger.close(conn);
                        self.abort_launch(why);
                    } else {
                        warn!(node = %self.me.id, "second connection from {p} ({}) refused", peer.node_id);
                        self.messenger.close(conn);
                    }
                }
                Admit::Stranger => {
                    warn!(node = %self.me.id, "connection from unexpected node {:?} ({:?} {}) refused", peer.node_id, peer.role, peer.index);
                    self.messenger.close(conn);
                }
            },
            Incoming::Received { conn, msg } => {
                let Some(&from) = self.links.peers.get(&conn) else {
                    return Ok(());
                };
                self.links.liveness.heard(from, now);
                // a standby taking over gathers resyncs before it is the run's EVM
                let msg = match msg {
                    Received::Message(m) if self.standby.following() => {
                        match self.standby_message(now, from, m) {
                            Some(m) => Received::Message(m),
                            None => return Ok(()),
                        }
                    }
                    other => other,
                };
                // a node heeds its EVM only after the Term that opens the connection
                if let (NodeRef::Evm, Logic::Ru(_) | Logic::Bu(..), Received::Message(m)) =
                    (from, &self.logic, &msg)
                {
                    if !matches!(m, Message::Term { .. } | Message::Heartbeat) {
                        if let Err(r) = self.links.authority.admit(conn) {
                            warn!(node = %self.me.id, "the EVM sent {:?} before its Term; refused ({r})", m.msg_type());
                            self.refuse_evm(now, conn, r);
                            return Ok(());
                        }
                    }
                }
                match (msg, &mut self.logic) {
                    (Received::Message(Message::Heartbeat), _) => {}
                    (Received::Message(Message::Register(r)), Logic::Evm(_)) => {
                        self.on_register(from, r)
                    }
                    (Received::Message(Message::Peers(p)), Logic::Ru(_))
                        if from == NodeRef::Evm =>
                    {
                        self.on_peers(now, p)
                    }
                    (Received::Message(Message::Term { epoch }), Logic::Ru(_) | Logic::Bu(..))
                        if from == NodeRef::Evm =>
                    {
                        self.on_term(now, conn, epoch)
                    }
                    (Received::Message(Message::Fence { epoch }), Logic::Evm(_))
                        if from != NodeRef::Evm =>
                    {
                        self.fenced_by_node(from, epoch)
                    }
                    (
                        Received::Message(
                            m @ (Message::Register(_)
                            | Message::Peers(_)
                            | Message::Term { .. }
                            | Message::Fence { .. }),
                        ),
                        _,
                    ) => {
                        warn!(node = %self.me.id, "{:?} from {from}, which should not send it; ignored", m.msg_type());
                    }
                    (Received::Message(m), Logic::Evm(e)) => e.handle(now, from, m),
                    (Received::Message(m), Logic::Ru(r)) => r.handle(now, from, m),
                    (Received::Message(m @ Message::Stop { .. }), Logic::Bu(..)) => {
                        // the sink's output first (a serve sink: every event acknowledged)
                        // (handed over by the loop, after this pass's actions: an echo
                        // that came with the Stop reaches the sink first)
                        self.sink.hold_stop(now, from, m);
                    }
                    (Received::Message(m), Logic::Bu(b, _)) => b.handle(now, from, m),
                    (Received::Fragment { header, payload }, Logic::Bu(b, _)) => {
                        b.handle_fragment(now, from, header, payload)
                    }
                    (Received::Fragments(run), Logic::Bu(b, _)) => b.handle_page(now, from, run),
                    (Received::Fragment { .. } | Received::Fragments(_), _) => {
                        warn!(node = %self.me.id, "fragment from {from} at a node that builds nothing; disconnecting");
                        self.messenger.close(conn);
                    }
                    (Received::Published { .. } | Received::PubSub(_), _) => {
                        warn!(node = %self.me.id, "pub/sub message from {from} on an event-building connection; disconnecting");
                        self.messenger.close(conn);
                    }
                }
            }
            Incoming::Closed { conn, reason } => {
                if let Some(mut d) = self.links.dialing.remove(&conn) {
                    let mut rejected = matches!(reason, CloseReason::Rejected(_));
                    // the EVM may have said meanwhile that a restarted BU moved (Peers)
                    if let Some((addr, _)) = self.links.dial_specs.get(&d.peer) {
                        d.addr = addr.clone();
                    }
                    if d.peer == NodeRef::Evm {
                        // nobody, or no EVM, at that address: with a standby, the other one
                        if let Some(other) = self.other_evm_address(&d.addr) {
                            debug!(node = %self.me.id, "the EVM at {} did not answer ({reason}): calling {other}", d.addr);
                            self.links
                                .dial_specs
                                .insert(NodeRef::Evm, (other.clone(), Channel::Control));
                            d.addr = other;
                            rejected = false;
                        }
                        if let Some(path) = self.evm_rendezvous() {
                            // a file left by an earlier run names a dead (or another
                            // run's) EVM until this run's EVM writes it: read it again
                            rejected = false;
                            if let Some(a) = crate::discovery::peek_evm(&path) {
                                d.addr = a.to_string();
                            }
                        }
                    }
                    match self.links.retry_at(now, rejected, d.peer) {
                        Some(at) => {
                            d.retry_at = Some(at);
                            self.links.waiting_dials.push(d);
                        }
                        None => return Err(NodeError::Connect(d.addr, reason.to_string())),
                    }
                } else if let Some(p) = self.links.peers.remove(&conn) {
                    self.lose(now, p, conn, reason.to_string());
                }
            }
        }
        Ok(())
    }

    /// A peer is gone: tell the logic, and call it again if we are the caller (a restarted
    /// BU is found again this way).
    pub(super) fn lose(&mut self, now: Instant, p: NodeRef, conn: ConnId, mut why: String) {
        // an EVM connection that closed before its Term was not the run's EVM: a fenced
        // one, or a standby that only follows; a node that never lost an EVM tries the other
        // address (a BU restarted after a takeover finds the new EVM so)
        if p == NodeRef::Evm
            && !matches!(self.logic, Logic::Evm(_))
            && self.links.authority.admit(conn).is_err()
            && self.call_the_other_evm(now, conn, &why)
        {
            return;
        }
        if let Some(gap) = self.links.liveness.own_pause(now) {
            why = format!(
                "{why} (after this node itself did not run for {} ms)",
                gap.as_millis()
            );
        }
        // the BU process whose connection this was (before it is forgotten)
        let inc = self.links.incarnation_of(p);
        self.forget(p, conn);
        // Peers leave once the run is over; that is not news.
        let quiet = matches!(
            self.state(),
            RunState::Stopping | RunState::Halted | RunState::Aborted
        );
        if quiet {
            debug!(node = %self.me.id, "{p} left: {why}");
        } else {
            warn!(node = %self.me.id, "lost {p}: {why}");
        }
        // an active EVM that did not run for a while: the node left because of it (and calls
        // the standby); it yields the run to its standby rather than decide on it
        if !quiet && p != NodeRef::Evm && self.state() == RunState::Running {
            let paused = self.links.liveness.own_pause(now).is_some();
            if self.yield_to_standby(p, paused) {
                return;
            }
        }
        match &mut self.logic {
            Logic::Evm(e) => e.peer_lost(now, p, &why),
            Logic::Ru(r) => match p {
                NodeRef::Bu(b) => r.link_lost(b, inc),
                _ => r.peer_lost(p, &why),
            },
            Logic::Bu(b, _) => b.peer_lost(p, &why),
        }
        if p == NodeRef::Evm && !matches!(self.state(), RunState::Halted | RunState::Aborted) {
            self.call_standby(now);
        }
        if !quiet && p != NodeRef::Evm {
            if let Some((addr, channel)) = self.links.dial_specs.get(&p).cloned() {
                self.links.waiting_dials.push(Dial {
                    peer: p,
                    addr,
                    channel,
                    retry_at: Some(now + RECALL_EVERY),
                });
            }
        }
    }

    /// The EVM, before the run starts: abort it, telling every node connected so far (the
    /// state machine tells only the nodes that said Ready).
    pub(super) fn abort_launch(&mut self, why: String) {
        for &conn in self.links.conns.values() {
            let _ = self.messenger.send_now(conn, &Message::Abort(why.clone()));
        }
        if let Logic::Evm(e) = &mut self.logic {
            e.abort(why);
        }
        self.run_actions();
    }

    /// The rendezvous file this node read the EVM's address from, if it did.
    pub(super) fn evm_rendezvous(&self) -> Option<std::path::PathBuf> {
        let from_file = self.me.role != Role::Evm
            && !self.cfg.run.rendezvous.is_empty()
            && self.cfg.learnt.contains_key(&self.nodes[0].id);
        from_file.then(|| std::path::PathBuf::from(&self.cfg.run.rendezvous))
    }

    /// The rank of node `p` under a launcher: its place in the configuration's order.
    pub(super) fn rank_of(&self, p: NodeRef) -> usize {
        let n_ru = self.nodes.iter().filter(|n| n.role == Role::Ru).count();
        match p {
            NodeRef::Evm => 0,
            NodeRef::Ru(i) => 1 + i as usize,
            NodeRef::Bu(i) => 1 + n_ru + i as usize,
        }
    }

    /// The peers this node still waits for, by id and rank, and why where it knows.
    pub(super) fn missing_peers(&self) -> Vec<String> {
        // every node of another role is a peer (the EVM's all, an RU's the EVM and the BUs)
        self.nodes
            .iter()
            .filter(|n| n.role != self.me.role && !n.spare)
            .filter(|n| !self.links.conns.contains_key(&node_ref(n)))
            .map(|n| {
                let p = node_ref(n);
                let rank = self.rank_of(p);
                let why = if self.me.role == Role::Ru
                    && n.role == Role::Bu
                    && !self.links.dial_specs.contains_key(&p)
                {
                    ": the EVM has not said where it listens (it has not registered)"
                } else if self.me.role == Role::Evm {
                    ": it never called (not started, or it cannot reach this EVM)"
                } else {
                    ""
                };
                let at = self
                    .links
                    .dial_specs
                    .get(&p)
                    .map(|(a, _)| format!(" at {a}"))
                    .unwrap_or_default();
                format!("{} (rank {rank}){at}{why}", n.id)
            })
            .collect()
    }

    /// The EVM: node `from` says who and where it is. A BU started without an address is
    /// made known to the RUs (all of them, or again when a restarted BU moved).
    fn on_register(&mut self, from: NodeRef, r: evb_wire::discovery::Registration) {
        info!(node = %self.me.id, "{from} registered: {}, listening on {}", r.describe(), r.data);
        let bu = match from {
            NodeRef::Bu(i) => self
                .nodes
                .iter()
                .find(|n| n.role == Role::Bu && n.index == i)
                .filter(|n| self.cfg.is_discovered(&n.addr))
                .map(|_| evb_wire::discovery::PeerAddr {
                    role: evb_wire::Role::Bu,
                    index: i,
                    addr: r.data.clone(),
                }),
            _ => None,
        };
        self.evm.registry.insert(from, r);
        let to: Vec<NodeRef> = match (&bu, from) {
            (Some(_), _) => self
                .links
                .conns
                .keys()
                .copied()
                .filter(|p| matches!(p, NodeRef::Ru(_)))
                .collect(),
            (None, NodeRef::Ru(_)) => vec![from],
            _ => Vec::new(),
        };
        let peers: Vec<_> = match bu {
            Some(b) => vec![b],
            None => self.discovered_bus(),
        };
        if peers.is_empty() {
            return;
        }
        for p in to {
            if let Some(&conn) = self.links.conns.get(&p) {
                let _ = self
                    .messenger
                    .send_now(conn, &Message::Peers(peers.clone()));
            }
        }
    }

    /// The registered addresses of the BUs started without one.
    fn discovered_bus(&self) -> Vec<evb_wire::discovery::PeerAddr> {
        self.nodes
            .iter()
            .filter(|n| n.role == Role::Bu && self.cfg.is_discovered(&n.addr))
            .filter_map(|n| {
                let r = self.evm.registry.get(&NodeRef::Bu(n.index))?;
                Some(evb_wire::discovery::PeerAddr {
                    role: evb_wire::Role::Bu,
                    index: n.index,
                    addr: r.data.clone(),
                })
            })
            .collect()
    }

    /// An RU: the EVM says where BUs started without an address listen; call them there.
    fn on_peers(&mut self, now: Instant, peers: Vec<evb_wire::discovery::PeerAddr>) {
        for a in peers {
            let known = self.nodes.iter().any(|n| {
                n.role == Role::Bu && n.index == a.index && self.cfg.is_discovered(&n.addr)
            });
            if a.role != evb_wire::Role::Bu || !known {
                warn!(node = %self.me.id, "the EVM named {:?} {} at {}, not a BU without an address; ignored", a.role, a.index, a.addr);
                continue;
            }
            let p = NodeRef::Bu(a.index);
            debug!(node = %self.me.id, "{p} listens on {}", a.addr);
            self.links
                .dial_specs
                .insert(p, (a.addr.clone(), Channel::Data));
            if let Some(d) = self.links.waiting_dials.iter_mut().find(|d| d.peer == p) {
                d.addr = a.addr;
            } else if !self.links.conns.contains_key(&p)
                && !self.links.dialing.values().any(|d| d.peer == p)
            {
                self.links.waiting_dials.push(Dial {
                    peer: p,
                    addr: a.addr,
                    channel: Channel::Data,
                    retry_at: Some(now),
                });
            }
        }
    }

    /// Drops what the driver knows of peer `p` and its connection.
    pub(super) fn forget(&mut self, p: NodeRef, conn: ConnId) {
        self.links.forget(p, conn);
    }

    /// Heartbeats on every link, control and data; a peer silent too long is lost. A data
    /// link that drops packets instead of closing (a dead switch port, a firewall) is found
    /// this way within `run.heartbeat_timeout_ms`: the RU or BU that stops hearing the other
    /// tells the EVM (LinkLost), which drops the BU and has its events built elsewhere. The
    /// decisions are [`Liveness`]'s; this does what it says.
    pub(super) fn heartbeats(&mut self, now: Instant) {
        // called every pass: nothing to decide most of them (one compare, as before)
        if now < self.links.liveness.poll_at() {
            return;
        }
        let judge = matches!(self.state(), RunState::Ready | RunState::Running);
        let up = self.links.up;
        let Links { liveness, rx, .. } = &mut self.links;
        let due = liveness.poll(now, up, judge, || rx.starved());
        let timeout = Duration::from_millis(self.cfg.run.heartbeat_timeout_ms);
        if let Some(gap) = due.paused_for {
            warn!(node = %self.me.id, "this node did not run for {} ms (stopped or starved of CPU): peers get a fresh {} ms to be heard", gap.as_millis(), timeout.as_millis());
        }
        if due.heartbeat {
            for &conn in self.links.conns.values() {
                let _ = self.messenger.send_batched(conn, &Message::Heartbeat);
            }
            self.tell_follower(false);
        }
        for p in due.silent {
            if let Some(&conn) = self.links.conns.get(&p) {
                self.messenger.close(conn);
                let what = if p == NodeRef::Evm || self.me.role == Role::Evm {
                    "no heartbeat"
                } else {
                    "data link silent: no heartbeat"
                };
                self.lose(
                    now,
                    p,
                    conn,
                    format!("{what} for {} ms", timeout.as_millis()),
                );
            }
        }
    }
}

/// The receive pool, and how often it was found empty at the last look: while it runs dry
/// the transport stops reading, so a peer's silence is this node's own.
#[derive(Default)]
pub(super) struct RxWatch {
    pool: Option<evb_buffers::Pool>,
    exhausted: u64,
}

impl RxWatch {
    /// The pool ran dry since the last look (or is dry now): reads stopped.
    fn starved(&mut self) -> bool {
        let Some(pool) = &self.pool else {
            return false;
        };
        let st = pool.stats();
        let starved = st.exhausted != self.exhausted || st.free == 0;
        self.exhausted = st.exhausted;
        starved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(now: Instant) -> Links {
        Links::new(
            "127.0.0.1:1".into(),
            0,
            Vec::new(),
            3,
            now + Duration::from_secs(5),
            Duration::from_millis(200),
            Duration::from_millis(1000),
            now,
        )
    }

    /// The EVM's door, scripted without a socket: two processes claiming one node, a
    /// restarted BU of a new incarnation and one with its predecessor's, a stranger; and
    /// fragments go only to the incarnation an Assign named.
    #[test]
    fn who_is_let_in_and_which_incarnation_gets_fragments() {
        let now = Instant::now();
        let mut l = links(now);
        let bu1 = NodeRef::Bu(1);
        assert_eq!(l.admit(None, 0, true), Admit::Stranger);
        assert_eq!(l.admit(Some(bu1), 0, true), Admit::NoIncarnation(bu1));
        assert_eq!(l.admit(Some(bu1), 7, true), Admit::Accept(bu1));
        l.add(now, bu1, ConnId(1), 7);
        l.seen_incarnations.insert(bu1, 7);
        // a second process for bu1 while the first is connected
        assert_eq!(l.admit(Some(bu1), 8, true), Admit::Second(bu1));
        assert_eq!(l.conn_to_incarnation(bu1, 7), Some(ConnId(1)));
        assert_eq!(l.conn_to_incarnation(bu1, 8), None);
        assert_eq!(l.conn_to_incarnation(bu1, 0), None);
        // bu1 lost: a restart is let in only with a new number
        l.forget(bu1, ConnId(1));
        assert_eq!(l.conn_to_incarnation(bu1, 7), None);
        assert_eq!(l.admit(Some(bu1), 7, true), Admit::ReusedIncarnation(bu1));
        assert_eq!(l.admit(Some(bu1), 9, true), Admit::Accept(bu1));
        // an RU's door (a BU's data listener) does not judge incarnations
        assert_eq!(l.admit(Some(bu1), 7, false), Admit::Accept(bu1));
        l.add(now, bu1, ConnId(2), 9);
        assert_eq!(l.conn_to_incarnation(bu1, 9), Some(ConnId(2)));
        assert_eq!(l.incarnation_of(bu1), 9);
        // other peers are not BUs: any Assign's number is theirs
        l.add(now, NodeRef::Evm, ConnId(3), 0);
        assert_eq!(l.conn_to_incarnation(NodeRef::Evm, 5), Some(ConnId(3)));
        assert_eq!(l.bu_incarnations(3), [0, 9, 0]);
    }

    /// Calls that fail: before the set is up, again every 50 ms until the connect deadline,
    /// then given up; once it was up, again every 200 ms for as long as the run lasts; a
    /// refused handshake never again.
    #[test]
    fn failed_calls_are_made_again_until_the_deadline_or_for_the_run() {
        let now = Instant::now();
        let mut l = links(now);
        let at = |ms: u64| now + Duration::from_millis(ms);
        assert_eq!(l.retry_at(at(100), false, NodeRef::Evm), Some(at(150)));
        assert_eq!(l.retry_at(at(4999), false, NodeRef::Evm), Some(at(5049)));
        assert_eq!(
            l.retry_at(at(5000), false, NodeRef::Evm),
            None,
            "the connect deadline"
        );
        assert_eq!(l.retry_at(at(100), true, NodeRef::Evm), None, "refused");
        l.mark_up();
        assert_eq!(
            l.retry_at(at(60_000), false, NodeRef::Evm),
            Some(at(60_200))
        );
        assert_eq!(l.retry_at(at(60_000), true, NodeRef::Evm), None);
        // due calls leave the queue; later ones wait
        let dial = |ms: u64| Dial {
            peer: NodeRef::Bu(0),
            addr: "127.0.0.1:9".into(),
            channel: Channel::Data,
            retry_at: Some(at(ms)),
        };
        l.waiting_dials = vec![dial(10), dial(30), dial(20)];
        assert_eq!(l.due_dials(at(20)).len(), 2);
        assert_eq!(l.waiting_dials.len(), 1);
        assert!(l.due_dials(at(29)).is_empty());
        assert_eq!(l.due_dials(at(30)).len(), 1);
    }

    /// A spare BU is no part of the set awaited at the start, and is called again for as
    /// long as the node lives, before the set is up and past the connect deadline.
    #[test]
    fn a_spare_bu_is_called_for_the_run_and_not_awaited() {
        let now = Instant::now();
        let mut l = links(now);
        let at = |ms: u64| now + Duration::from_millis(ms);
        l.set_spares([NodeRef::Bu(3)]);
        assert!(l.is_spare(NodeRef::Bu(3)) && !l.is_spare(NodeRef::Bu(0)));
        assert_eq!(l.retry_at(at(100), false, NodeRef::Bu(3)), Some(at(300)));
        assert_eq!(l.retry_at(at(9000), false, NodeRef::Bu(3)), Some(at(9200)));
        assert_eq!(l.retry_at(at(9000), false, NodeRef::Bu(0)), None);
        assert_eq!(l.retry_at(at(100), true, NodeRef::Bu(3)), None, "refused");
        let (up, expected) = l.connected();
        l.conns.insert(NodeRef::Bu(3), ConnId(77));
        assert_eq!(
            l.connected(),
            (up, expected),
            "a spare's connection is not counted"
        );
    }

    /// A rejoin: a peer lost and connected again is heard from its new connection on, and
    /// judged by the liveness of that one (not by the silence of the one it lost).
    #[test]
    fn a_rejoined_peer_is_judged_from_its_new_connection() {
        let now = Instant::now();
        let mut l = links(now);
        let ru = NodeRef::Ru(0);
        let at = |ms: u64| now + Duration::from_millis(ms);
        l.add(now, ru, ConnId(1), 0);
        let mut lost = Vec::new();
        for t in (0..=2000).step_by(10) {
            match t {
                900 => l.forget(ru, ConnId(1)),
                950 => l.add(at(t), ru, ConnId(2), 0),
                _ => {}
            }
            lost.extend(l.liveness.poll(at(t), true, true, || false).silent);
            if !lost.is_empty() {
                assert!(t > 1950, "lost at {t} ms: {lost:?}");
                break;
            }
        }
        assert_eq!(l.conn(ru), Some(ConnId(2)));
        assert_eq!(
            lost,
            [ru],
            "silent since it rejoined at 950 ms: lost just after 1,950"
        );
    }
}

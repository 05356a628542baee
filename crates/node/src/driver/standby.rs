//! A run with a standby EVM (docs/standby.md), as the driver sees it: the active EVM tells
//! its follower what it needs to take over; the follower notices the active EVM's loss,
//! gathers every node's resync and rebuilds the run (`Evm::take_over`); an RU or BU that
//! loses its EVM calls the standby and sends its resync first.

use std::collections::BTreeMap;

use evb_builder::{BuResync, RuResync, Takeover};
use evb_wire::resync::Follow;

use super::*;

/// How long a node or the standby waits for the other side of a takeover, beyond the
/// heartbeat timeout that started it.
fn takeover_wait(cfg: &Config) -> Duration {
    Duration::from_millis(2 * cfg.run.heartbeat_timeout_ms).max(Duration::from_secs(3))
}

/// This process's part in a run with a standby.
pub(super) enum Standby {
    /// No standby in this run.
    None,
    /// An RU or BU: where the standby listens, and since when it calls it (`None`: its
    /// EVM is the first one, or it reached the standby). `left`: while it calls, where the
    /// EVM it left listened: once it reached the standby, that is where the next standby
    /// listens (`evb up` starts one there), and a second loss calls it in turn.
    Node {
        addr: String,
        calling_since: Option<Instant>,
        switched: bool,
        left: Option<String>,
    },
    /// The active EVM: its follower's connection (the slot belongs to the first standby
    /// that calls, and is refused to a second while the first is heard), when it was last
    /// heard, and the epoch that fenced this EVM, once a standby that the nodes followed
    /// said so: from then on this EVM acts no more.
    Active {
        follower: Option<ConnId>,
        heard: Instant,
        fenced: Option<u16>,
    },
    /// The standby EVM, following the active one until it is lost, then taking over.
    Follower(Box<Following>),
}

pub(super) struct Following {
    /// Where the active EVM listens, and the connection to it.
    active: String,
    conn: Option<ConnId>,
    dialing: Option<ConnId>,
    retry_at: Instant,
    last_heard: Instant,
    /// When the follower next tells the active EVM it is there (every `heartbeat_ms`).
    next_beat: Instant,
    /// The active EVM's last word, and when it came.
    follow: Follow,
    follow_at: Instant,
    /// Taking over: since when, and what the nodes said so far. Until a node follows, this
    /// is only a suspicion: an active EVM that speaks again before any node left it keeps
    /// the run, and the standby stands down and follows on.
    taking_over: Option<Instant>,
    /// The active EVM's word heard while taking over (it woke): applied if the standby
    /// stands down, ignored once a node followed.
    late: Option<Follow>,
    /// The old EVM was told it is fenced (a node followed the standby).
    fence_sent: bool,
    rus: BTreeMap<u16, (RuResync, bool)>,
    bus: BTreeMap<u16, (BuResync, bool)>,
    /// What nodes sent after their resync, before the new EVM was made: handled then.
    held: Vec<(NodeRef, Message)>,
    /// The run ended at the active EVM: nothing to take over.
    over: bool,
    /// When it began following, and whether it ever reached the active EVM.
    since: Instant,
    reached: bool,
    /// Decisions from outside the active EVM has taken and whose records are not final,
    /// by record id (its Window messages): what a takeover triggers after the records the
    /// nodes know.
    decisions: BTreeMap<u64, evb_wire::window::DecisionWindow>,
}

impl Standby {
    pub(super) fn new(cfg: &Config, me: &NodeSpec, now: Instant) -> Standby {
        if me.role == Role::Evm && !cfg.evm.follow.is_empty() {
            return Standby::follower(cfg.evm.follow.clone(), now);
        }
        if cfg.evm.standby.is_empty() {
            return Standby::None;
        }
        match me.role {
            Role::Evm => Standby::Active {
                follower: None,
                heard: now,
                fenced: None,
            },
            _ => Standby::Node {
                addr: cfg.evm.standby.clone(),
                calling_since: None,
                switched: false,
                left: None,
            },
        }
    }

    /// The standby EVM, following the active one at `active`.
    pub(super) fn follower(active: String, now: Instant) -> Standby {
        Standby::Follower(Box::new(Following {
            active,
            conn: None,
            dialing: None,
            retry_at: now,
            last_heard: now,
            next_beat: now,
            follow: Follow::default(),
            follow_at: now,
            taking_over: None,
            late: None,
            fence_sent: false,
            rus: BTreeMap::new(),
            bus: BTreeMap::new(),
            held: Vec::new(),
            over: false,
            since: now,
            reached: false,
            decisions: BTreeMap::new(),
        }))
    }

    /// Still following: not yet the run's EVM.
    pub(super) fn following(&self) -> bool {
        matches!(self, Standby::Follower(_))
    }

    /// The epoch that fenced this (old) EVM, if one did.
    pub(super) fn fenced(&self) -> Option<u16> {
        match self {
            Standby::Active { fenced, .. } => *fenced,
            _ => None,
        }
    }
}

/// One message of node `i`'s resync: joined to the ones before it while they said more
/// follows, or the start of a new one.
fn gather<T>(
    got: &mut BTreeMap<u16, (T, bool)>,
    i: u16,
    part: T,
    more: bool,
    absorb: impl Fn(&mut T, T),
) {
    match got.get_mut(&i) {
        Some((r, open)) if *open => {
            absorb(r, part);
            *open = more;
        }
        _ => {
            got.insert(i, (part, more));
        }
    }
}

/// The nodes the active EVM had dropped, by its last word.
fn dropped_by(follow: &Follow) -> Vec<NodeRef> {
    follow
        .dropped
        .iter()
        .map(|&(role, index)| match role {
            evb_wire::Role::Evm => NodeRef::Evm,
            evb_wire::Role::Ru => NodeRef::Ru(index),
            evb_wire::Role::Bu => NodeRef::Bu(index),
        })
        .collect()
}

impl Driver {
    /// The active EVM's word to its follower (see [`Follow`]).
    fn follow_word(&self, over: bool) -> Option<Message> {
        let Logic::Evm(e) = &self.logic else {
            return None;
        };
        let st = e.stats();
        let dropped = e
            .down_nodes()
            .into_iter()
            .filter_map(|n| match n {
                NodeRef::Ru(i) => Some((evb_wire::Role::Ru, i)),
                NodeRef::Bu(i) => Some((evb_wire::Role::Bu, i)),
                NodeRef::Evm => None,
            })
            .collect();
        let over = over || e.state().is_over() || e.state() == RunState::Halted;
        Some(Message::Follow(Follow {
            elapsed_ms: e.elapsed(Instant::now()).as_millis() as u64,
            stop_requested: st.stopped_by_request,
            over,
            paused: st.paused,
            epoch: st.epoch,
            dropped,
            max_events: e.config().max_events.unwrap_or(evb_wire::UNLIMITED),
            decisions_final: e.decisions_final(),
        }))
    }

    /// The connection to this active EVM's follower, while it is not fenced.
    fn follower_conn(&self) -> Option<ConnId> {
        match self.standby {
            Standby::Active {
                follower: Some(conn),
                fenced: None,
                ..
            } => Some(conn),
            _ => None,
        }
    }

    /// The active EVM tells its follower (every heartbeat, before a drop, at the end).
    pub(super) fn tell_follower(&mut self, over: bool) {
        let Some(conn) = self.follower_conn() else {
            return;
        };
        if let Some(m) = self.follow_word(over) {
            let _ = self.messenger.send_now(conn, &m);
        }
    }

    /// The active EVM sends its follower `msgs` (a copy of decisions from outside).
    pub(super) fn copy_to_follower(&mut self, msgs: Vec<Message>) {
        let Some(conn) = self.follower_conn() else {
            return;
        };
        for m in msgs {
            let _ = self.messenger.send_now(conn, &m);
        }
    }

    /// An incoming connection event that belongs to the standby machinery; true when it
    /// was handled here.
    pub(super) fn standby_incoming(&mut self, now: Instant, inc: &Incoming) -> bool {
        match (&mut self.standby, inc) {
            // the active EVM: its follower calls (role EVM, index 1, this node's id)
            (
                Standby::Active {
                    follower, heard, ..
                },
                Incoming::Accepted { conn, peer },
            ) if peer.role == evb_wire::Role::Evm
                && peer.index == 1
                && peer.node_id == self.me.id =>
            {
                // one follower slot: a second caller does not replace a standby still heard
                // (its loss would make the real standby take over a run the nodes never left)
                let timeout = Duration::from_millis(self.cfg.run.heartbeat_timeout_ms);
                if follower.is_some() && now.duration_since(*heard) <= timeout {
                    warn!(node = %self.me.id, "a second standby EVM called ({}); refused: the follower slot is held", peer.node_id);
                    self.messenger.close(*conn);
                    return true;
                }
                if let Some(old) = follower.replace(*conn) {
                    info!(node = %self.me.id, "the standby EVM called again; its silent connection is closed");
                    self.messenger.close(old);
                } else {
                    info!(node = %self.me.id, "the standby EVM follows this one");
                }
                *heard = now;
                let conn = *conn;
                // decisions from outside taken before it came: it gets a copy of them
                if let Logic::Evm(e) = &self.logic {
                    let (first, queued) = e.queued_decisions();
                    for m in Message::windows(first, &queued) {
                        let _ = self.messenger.send_now(conn, &m);
                    }
                }
                true
            }
            // a fenced EVM takes no one: a node that lost the standby it followed and calls
            // this address again is for the standby that listens here next, never for it
            (
                Standby::Active {
                    fenced: Some(epoch),
                    ..
                },
                Incoming::Accepted { conn, peer },
            ) => {
                warn!(node = %self.me.id, "{} called this EVM, which epoch {epoch} fenced; refused", peer.node_id);
                self.messenger.close(*conn);
                true
            }
            (Standby::Active { follower, .. }, Incoming::Closed { conn, .. })
                if *follower == Some(*conn) =>
            {
                warn!(node = %self.me.id, "the standby EVM is gone: a loss of this EVM would end the run");
                *follower = None;
                true
            }
            (
                Standby::Active {
                    follower, heard, ..
                },
                Incoming::Received { conn, msg },
            ) if *follower == Some(*conn) => {
                *heard = now;
                if let Received::Message(Message::Fence { epoch }) = msg {
                    let epoch = *epoch;
                    self.fence(epoch);
                }
                true
            }
            (Standby::Follower(f), Incoming::Connected { conn, .. })
                if f.dialing == Some(*conn) =>
            {
                info!(node = %self.me.id, "following the active EVM at {}", f.active);
                f.dialing = None;
                f.conn = Some(*conn);
                f.last_heard = now;
                f.reached = true;
                true
            }
            (Standby::Follower(f), Incoming::Closed { conn, reason })
                if f.dialing == Some(*conn) =>
            {
                debug!(node = %self.me.id, "the active EVM at {} does not answer yet: {reason}", f.active);
                f.dialing = None;
                f.retry_at = now + Duration::from_millis(200);
                true
            }
            (Standby::Follower(f), Incoming::Closed { conn, reason }) if f.conn == Some(*conn) => {
                f.conn = None;
                if !f.over && f.taking_over.is_none() {
                    warn!(node = %self.me.id, "lost the active EVM: {reason}; taking over");
                    f.taking_over = Some(now);
                }
                true
            }
            (Standby::Follower(f), Incoming::Received { conn, msg }) if f.conn == Some(*conn) => {
                f.last_heard = now;
                if let Received::Message(Message::Window { first, windows }) = msg {
                    // a copy of decisions from outside the active EVM has taken
                    for (i, w) in windows.iter().enumerate() {
                        f.decisions.insert(first + i as u64, w.clone());
                    }
                    return true;
                }
                if let Received::Message(Message::Follow(w)) = msg {
                    // the records below it are final: their windows are needed no more
                    if w.decisions_final > 0 {
                        f.decisions = f.decisions.split_off(&w.decisions_final);
                    }
                    if f.taking_over.is_some() {
                        // a suspected EVM speaks again: its word counts only if the standby
                        // stands down (no node left it)
                        let mut w = w.clone();
                        if let Some(l) = &f.late {
                            w.over |= l.over;
                        }
                        f.late = Some(w);
                    } else {
                        f.over |= w.over;
                        f.follow = w.clone();
                        f.follow_at = now;
                    }
                }
                true
            }
            _ => false,
        }
    }

    /// A message from a node to the standby while it takes over: resyncs are gathered,
    /// the rest held until the new EVM is made. False when the standby is the EVM already.
    pub(super) fn standby_message(&mut self, from: NodeRef, msg: Message) -> Option<Message> {
        let Standby::Follower(f) = &mut self.standby else {
            return Some(msg);
        };
        match (from, msg) {
            (NodeRef::Ru(i), Message::ResyncRu { resync, more }) => {
                gather(&mut f.rus, i, resync, more, RuResync::absorb);
                None
            }
            (NodeRef::Bu(i), Message::ResyncBu { resync, more }) => {
                gather(&mut f.bus, i, *resync, more, BuResync::absorb);
                None
            }
            (from, Message::Heartbeat) => {
                let _ = from;
                None
            }
            (from, msg) => {
                f.held.push((from, msg));
                None
            }
        }
    }

    /// Each pass: the follower calls the active EVM, watches it, and takes over once it is
    /// lost and every node has answered (or the wait is over); a node waiting for the
    /// standby gives up after its wait. Returns true while this process is a follower that
    /// has not taken over (its EVM logic must not run yet).
    pub(super) fn standby_pass(&mut self, now: Instant) -> bool {
        let timeout = Duration::from_millis(self.cfg.run.heartbeat_timeout_ms);
        let wait = takeover_wait(&self.cfg);
        match &mut self.standby {
            Standby::Node {
                calling_since: Some(since),
                switched,
                ..
            } if *switched && self.links.conn(NodeRef::Evm).is_none() => {
                if now.duration_since(*since) > wait && self.exit.is_none() {
                    let why = format!(
                        "lost the EVM, and the standby did not answer within {} ms",
                        wait.as_millis()
                    );
                    self.exit = Some((false, why));
                }
                false
            }
            Standby::Follower(f) => {
                if f.over {
                    if self.exit.is_none() {
                        self.exit = Some((true, "the run ended at the active EVM".into()));
                    }
                    return true;
                }
                if f.taking_over.is_none() {
                    // an operator's stop or abort (Ctrl-C, SIGTERM, the control API) ends a
                    // standby that follows: it has no run of its own to drain
                    if self.control.stop_requested() || self.control.take_abort().is_some() {
                        if self.exit.is_none() {
                            self.exit = Some((true, "stopped while following the EVM".into()));
                        }
                        return true;
                    }
                    // an EVM that never answers (or is gone before the standby reached it)
                    let never = !f.reached
                        && now.duration_since(f.since)
                            > Duration::from_secs_f64(self.cfg.run.connect_timeout_s);
                    if never && self.exit.is_none() {
                        let why = format!(
                            "the EVM at {} did not answer within {} s (run.connect_timeout_s)",
                            f.active, self.cfg.run.connect_timeout_s
                        );
                        self.exit = Some((false, why));
                        return true;
                    }
                    if f.conn.is_none() && f.dialing.is_none() && now >= f.retry_at {
                        let hello = Hello::new(
                            Channel::Control,
                            evb_wire::Role::Evm,
                            1,
                            &self.cfg.run.id,
                            &self.me.id,
                        );
                        match self.messenger.connect(&f.active, hello) {
                            Ok(c) => f.dialing = Some(c),
                            Err(e) => {
                                debug!(node = %self.me.id, "calling the active EVM: {e}");
                                f.retry_at = now + Duration::from_millis(200);
                            }
                        }
                    }
                    if let Some(conn) = f.conn {
                        if now.duration_since(f.last_heard) > timeout {
                            // a suspicion until a node follows: the connection stays open, so
                            // that an EVM that wakes is heard (and told, if it was replaced)
                            warn!(node = %self.me.id, "the active EVM is silent for {} ms; taking over if the nodes follow", timeout.as_millis());
                            f.taking_over = Some(now);
                        } else if now >= f.next_beat {
                            f.next_beat = now + Duration::from_millis(self.cfg.run.heartbeat_ms);
                            let _ = self.messenger.send_batched(conn, &Message::Heartbeat);
                        }
                    }
                    return true;
                }
                let since = f.taking_over.unwrap_or(now);
                let followed = !f.rus.is_empty() || !f.bus.is_empty();
                let waited = now.duration_since(since) >= wait;
                // no node left the EVM, and it speaks again (or is still connected when the
                // wait is over): the run is still its own
                if !followed && f.conn.is_some() && (f.late.is_some() || waited) {
                    let why = if f.late.is_some() {
                        "it speaks again"
                    } else {
                        "its connection is open"
                    };
                    warn!(node = %self.me.id, "no node left the active EVM and {why}: standing down, following on");
                    if let Some(w) = f.late.take() {
                        f.over |= w.over;
                        f.follow = w;
                        f.follow_at = now;
                    }
                    f.taking_over = None;
                    f.last_heard = now;
                    return true;
                }
                // a node followed: the takeover is decided, and the old EVM, should it
                // wake, is told that it is fenced (it then closes its nodes' connections,
                // so that every node still with it calls here, and acts no more)
                if followed && !f.fence_sent {
                    if let Some(conn) = f.conn {
                        let epoch = f.follow.epoch.saturating_add(1);
                        info!(node = %self.me.id, "a node followed: fencing the old EVM (epoch {epoch})");
                        let _ = self.messenger.send_now(conn, &Message::Fence { epoch });
                    }
                    f.fence_sent = true;
                }
                let dropped = dropped_by(&f.follow);
                let all = self.nodes.iter().skip(1).all(|n| {
                    let p = node_ref(n);
                    dropped.contains(&p)
                        || match p {
                            NodeRef::Ru(i) => f.rus.get(&i).is_some_and(|(_, more)| !more),
                            NodeRef::Bu(i) => f.bus.get(&i).is_some_and(|(_, more)| !more),
                            NodeRef::Evm => true,
                        }
                });
                if !all && !waited {
                    return true;
                }
                self.take_over(now);
                false
            }
            _ => false,
        }
    }

    /// The epoch this process speaks for the run at, as the Term that opens each node's
    /// control connection says: the EVM's (0 before any takeover), or, for a standby that
    /// nodes call while it takes over, the one above the active EVM's.
    pub(super) fn own_epoch(&self) -> u16 {
        match (&self.standby, &self.logic) {
            (Standby::Follower(f), _) => f.follow.epoch.saturating_add(1),
            (_, Logic::Evm(e)) => e.stats().epoch,
            _ => 0,
        }
    }

    /// A node hears its EVM's term. One below the highest epoch this node followed in this
    /// run is stale: that EVM was replaced and missed its fence (a lost follow connection).
    /// It is told so with a Fence of the epoch followed (it then ends as fenced), and the
    /// connection is refused as a lost EVM (with a standby, the node calls it again).
    pub(super) fn on_term(&mut self, now: Instant, conn: ConnId, epoch: u16) {
        let Err(followed) = self.links.admit_term(epoch) else {
            return;
        };
        warn!(node = %self.me.id, "the EVM on this connection speaks at epoch {epoch}, below the {followed} this node followed; refused (stale epoch), and told it is fenced");
        let _ = self
            .messenger
            .send_now(conn, &Message::Fence { epoch: followed });
        self.messenger.close(conn);
        if self.links.peers.remove(&conn).is_some() {
            self.lose(
                now,
                NodeRef::Evm,
                conn,
                format!("stale epoch {epoch} (this node followed {followed})"),
            );
        }
    }

    /// An EVM hears from a node that it followed a later epoch than this EVM's: another EVM
    /// took the run over and this one missed its fence. It is fenced now, as by the Fence
    /// of the standby itself.
    pub(super) fn fenced_by_node(&mut self, from: NodeRef, epoch: u16) {
        let own = self.own_epoch();
        if epoch <= own || self.standby.following() {
            warn!(node = %self.me.id, "{from} sent a Fence of epoch {epoch}, not above this EVM's {own}; ignored");
            return;
        }
        warn!(node = %self.me.id, "{from} followed epoch {epoch}, above this EVM's {own}: this EVM was replaced");
        if matches!(self.standby, Standby::Active { .. }) {
            self.fence(epoch);
        } else if self.exit.is_none() {
            // (no standby configured: nothing else can have the run, but the node says so)
            self.exit = Some((
                false,
                format!("fenced by epoch {epoch}: {from} followed another EVM"),
            ));
        }
    }

    /// This (old) EVM hears that a standby the nodes followed holds the run at `epoch`: it
    /// closes every node's connection (a node still with it then calls the standby), acts
    /// no more (no Assign, Release, publication or Halt: `run_action` drops them) and ends
    /// with a report that says it was fenced, so that no reader takes it for the run's.
    fn fence(&mut self, epoch: u16) {
        let Standby::Active { fenced, .. } = &mut self.standby else {
            return;
        };
        if fenced.is_some() {
            return;
        }
        *fenced = Some(epoch);
        warn!(node = %self.me.id, "fenced by epoch {epoch}: the standby EVM holds the run; this EVM stops and its report is not the run's");
        let conns: Vec<ConnId> = self.links.conns().map(|(_, c)| c).collect();
        for c in conns {
            self.messenger.close(c);
        }
        self.exit = Some((
            false,
            format!("fenced by epoch {epoch}: the nodes followed the standby EVM, whose report is the run's"),
        ));
    }

    /// An active EVM with a follower: a Fence among `incoming` is acted on first, so that
    /// nothing else of the batch (the nodes' closed connections, found on waking) makes
    /// this EVM decide anything.
    pub(super) fn fence_first(&mut self, incoming: &[Incoming]) {
        let Standby::Active {
            follower: Some(f),
            fenced: None,
            ..
        } = self.standby
        else {
            return;
        };
        let epoch = incoming.iter().find_map(|inc| match inc {
            Incoming::Received {
                conn,
                msg: Received::Message(Message::Fence { epoch }),
            } if *conn == f => Some(*epoch),
            _ => None,
        });
        if let Some(e) = epoch {
            self.fence(e);
        }
    }

    /// Waits up to `most` for a Fence from the follower (an EVM about to report a failure).
    pub(super) fn await_fence(&mut self, most: Duration) {
        let until = Instant::now() + most;
        let mut got = Vec::new();
        while Instant::now() < until {
            let Standby::Active {
                follower: Some(_),
                fenced: None,
                ..
            } = self.standby
            else {
                return;
            };
            got.clear();
            if self
                .messenger
                .poll(&mut got, Some(Duration::from_millis(5)))
                .is_err()
            {
                return;
            }
            self.fence_first(&got);
        }
    }

    /// The standby becomes the run's EVM.
    fn take_over(&mut self, now: Instant) {
        let Standby::Follower(mut f) = std::mem::replace(&mut self.standby, Standby::None) else {
            return;
        };
        let Logic::Evm(old) = &self.logic else {
            return;
        };
        let cfg = old.config().clone();
        let dropped = dropped_by(&f.follow);
        // triggering time: a paused run's clock stood still since the EVM said so
        let since = if f.follow.paused {
            Duration::ZERO
        } else {
            now.duration_since(f.follow_at)
        };
        let elapsed = Duration::from_millis(f.follow.elapsed_ms) + since;
        if f.follow.paused {
            // the operator's pause holds under the new EVM, until resumed at its control
            info!(node = %self.me.id, "the run was paused: it stays paused");
            self.control.set_paused(true);
        }
        let rus: Vec<RuResync> = f
            .rus
            .into_values()
            .filter(|(_, more)| !more)
            .map(|(r, _)| r)
            .collect();
        let bus: Vec<BuResync> = f
            .bus
            .into_values()
            .filter(|(_, more)| !more)
            .map(|(b, _)| b)
            .collect();
        info!(node = %self.me.id, "taking the run over: {} RUs and {} BUs answered", rus.len(), bus.len());
        let t = Takeover {
            epoch: f.follow.epoch.saturating_add(1),
            elapsed,
            dropped,
            reason: "the active EVM was lost".into(),
            stop_requested: f.follow.stop_requested,
            max_events: (f.follow.max_events != evb_wire::UNLIMITED).then_some(f.follow.max_events),
            live_fed: matches!(
                self.cfg.source.kind,
                evb_config::SourceKind::Stream | evb_config::SourceKind::Api
            ),
            incarnations: self.links.bu_incarnations(cfg.n_bu as usize),
        };
        let mut evm = evb_builder::Evm::take_over(cfg, now, t, rus, bus);
        if self.cfg.windows.outside {
            // the lost EVM's decisions not yet triggered, from the next record on: each
            // still becomes its record (a gap in the copy ends them: ids are records)
            evm.take_decisions_from_outside();
            let mut next = evm.queued_decisions().0;
            let mut carried = Vec::new();
            while let Some(w) = f.decisions.remove(&next) {
                carried.push(w);
                next += 1;
            }
            let lost = f.decisions.range(next..).count();
            if lost > 0 {
                warn!(node = %self.me.id, "{lost} decisions from outside after a gap in the standby's copy are not carried over");
            }
            info!(node = %self.me.id, "carrying over {} decisions from outside not yet triggered", carried.len());
            evm.carry_decisions(carried);
        }
        for (from, msg) in f.held {
            evm.handle(now, from, msg);
        }
        self.logic = Logic::Evm(evm);
        self.links.mark_up();
        // the run's EVM now: a standby of its own may follow it (`evb up` starts one where
        // the old EVM was), and a second loss is taken over in turn
        self.standby = Standby::Active {
            follower: None,
            heard: now,
            fenced: None,
        };
    }

    /// A node lost its EVM: with a standby, call it (once).
    pub(super) fn call_standby(&mut self, now: Instant) {
        let Standby::Node {
            addr,
            calling_since,
            switched,
            left,
        } = &mut self.standby
        else {
            return;
        };
        if *switched {
            return;
        }
        *switched = true;
        *calling_since = Some(now);
        info!(node = %self.me.id, "lost the EVM: calling the standby at {addr}");
        *left = self
            .links
            .dial_specs
            .insert(NodeRef::Evm, (addr.clone(), Channel::Control))
            .map(|(a, _)| a);
        self.links.waiting_dials.push(peers::Dial {
            peer: NodeRef::Evm,
            addr: addr.clone(),
            channel: Channel::Control,
            retry_at: Some(now),
        });
    }

    /// A node reached the standby: its resync goes first.
    pub(super) fn send_resync(&mut self, conn: ConnId) {
        let Standby::Node {
            addr,
            calling_since,
            switched: switched @ true,
            left,
        } = &mut self.standby
        else {
            return;
        };
        *calling_since = None;
        // the next standby listens where the EVM left was: a second loss calls it there
        if let Some(old) = left.take() {
            *addr = old;
            *switched = false;
        }
        let msgs: Vec<Message> = match &mut self.logic {
            Logic::Ru(r) => r
                .resync()
                .split()
                .into_iter()
                .map(|(resync, more)| Message::ResyncRu { resync, more })
                .collect(),
            Logic::Bu(b, _) => {
                let mut r = b.resync();
                self.sink.fill_resync(&mut r);
                r.split()
                    .into_iter()
                    .map(|(resync, more)| Message::ResyncBu {
                        resync: Box::new(resync),
                        more,
                    })
                    .collect()
            }
            Logic::Evm(_) => Vec::new(),
        };
        info!(node = %self.me.id, "reached the standby; resync sent ({} messages)", msgs.len());
        for m in msgs {
            if let Err(e) = self.messenger.send_now(conn, &m) {
                warn!(node = %self.me.id, "resync to the standby failed: {e}");
            }
        }
    }
}

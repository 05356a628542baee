//! A run with a standby EVM (docs/standby.md), as the driver sees it: the active EVM tells
//! its follower what it needs to take over; the follower notices the active EVM's loss,
//! gathers every node's resync and rebuilds the run (`Evm::take_over`); an RU or BU that
//! loses its EVM calls the standby and sends its resync first.

use std::collections::BTreeMap;

use evb_builder::{BuResync, RuResync, Takeover};
use evb_wire::resync::Follow;

use super::*;
use crate::session::active::{Active, Call, Fenced};
use crate::session::follower::{
    dropped_by, Answer, Event, FirstWord, Follower, Input, Stage, Timers, Transmit,
};
use crate::session::{Epoch, Time};

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
    /// The active EVM: its follower slot and its fence (session::Active decides both).
    Active(Active),
    /// The standby EVM, following the active one until it is lost, then taking over.
    Follower(Box<Following>),
}

/// The standby: its machine (session::Follower decides) and what the nodes and the active
/// EVM sent that the new EVM is made of.
pub(super) struct Following {
    /// Where the active EVM listens.
    active: String,
    machine: Follower,
    rus: BTreeMap<u16, (RuResync, bool)>,
    bus: BTreeMap<u16, (BuResync, bool)>,
    /// What nodes sent after their resync, before the new EVM was made: handled then.
    held: Vec<(NodeRef, Message)>,
    /// Decisions from outside the active EVM has taken and whose records are not final,
    /// by record id (its Window messages): what a takeover triggers after the records the
    /// nodes know.
    decisions: BTreeMap<u64, evb_wire::window::DecisionWindow>,
}

impl Following {
    /// Whether node `p` sent (part of) its resync to this standby; the EVM counts as done.
    fn resynced(&self, p: NodeRef) -> bool {
        match p {
            NodeRef::Ru(i) => self.rus.contains_key(&i),
            NodeRef::Bu(i) => self.bus.contains_key(&i),
            NodeRef::Evm => true,
        }
    }
}

/// The follower's timers, from the run's configuration.
fn timers(cfg: &Config) -> Timers {
    Timers {
        heartbeat: Duration::from_millis(cfg.run.heartbeat_ms),
        timeout: Duration::from_millis(cfg.run.heartbeat_timeout_ms),
        wait: takeover_wait(cfg),
        connect: Duration::from_secs_f64(cfg.run.connect_timeout_s),
    }
}

impl Standby {
    pub(super) fn new(cfg: &Config, me: &NodeSpec, nodes: &[NodeSpec]) -> Standby {
        if me.role == Role::Evm && !cfg.evm.follow.is_empty() {
            let nodes = nodes
                .iter()
                .filter(|n| n.role != Role::Evm)
                .map(node_ref)
                .collect();
            return Standby::Follower(Box::new(Following {
                active: cfg.evm.follow.clone(),
                machine: Follower::new(timers(cfg), nodes, Duration::ZERO),
                rus: BTreeMap::new(),
                bus: BTreeMap::new(),
                held: Vec::new(),
                decisions: BTreeMap::new(),
            }));
        }
        if cfg.evm.standby.is_empty() {
            return Standby::None;
        }
        match me.role {
            Role::Evm => Standby::Active(Active::new(Epoch::FIRST, Duration::ZERO)),
            _ => Standby::Node {
                addr: cfg.evm.standby.clone(),
                calling_since: None,
                switched: false,
                left: None,
            },
        }
    }

    /// Still following: not yet the run's EVM.
    pub(super) fn following(&self) -> bool {
        matches!(self, Standby::Follower(_))
    }

    /// The epoch that fenced this (old) EVM, if one did.
    pub(super) fn fenced(&self) -> Option<u16> {
        match self {
            Standby::Active(a) => a.fenced().map(Epoch::get),
            _ => None,
        }
    }
}

/// Whether `peer`'s Hello is the follower of EVM `me` calling: role EVM, index 1, `me`'s id.
fn follower_call(peer: &Hello, me: &str) -> bool {
    peer.role == evb_wire::Role::Evm && peer.index == 1 && peer.node_id == me
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
            since_ms: self
                .evm
                .since
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        }))
    }

    /// While this EVM finishes (its word that the run is over already told), a standby's
    /// call that comes now hears that word too, not a connection closed without one (which
    /// it would take for a lost EVM). Anything else that arrives then is left.
    pub(super) fn answer_late_follower(&mut self, inc: &Incoming) {
        let Incoming::Accepted { conn, peer } = inc else {
            return;
        };
        if !(follower_call(peer, &self.me.id) && matches!(self.standby, Standby::Active(_))) {
            return;
        }
        if let Some(m) = self.follow_word(true) {
            let _ = self.messenger.send_now(*conn, &m);
        }
    }

    /// The connection to this active EVM's follower, while it is not fenced.
    fn follower_conn(&self) -> Option<ConnId> {
        match &self.standby {
            Standby::Active(a) => a.follower(),
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
        // (called for every incoming event, fragment pages too: a run without a standby
        // EVM, and every RU and BU, leaves at once)
        if !matches!(self.standby, Standby::Active(_) | Standby::Follower(_)) {
            return false;
        }
        let timeout = Duration::from_millis(self.cfg.run.heartbeat_timeout_ms);
        let at = self.at(now);
        match (&mut self.standby, inc) {
            // the active EVM: its follower calls (role EVM, index 1, this node's id)
            (Standby::Active(a), Incoming::Accepted { conn, peer })
                if follower_call(peer, &self.me.id) =>
            {
                match a.call(at, *conn, timeout) {
                    Call::Held => {
                        warn!(node = %self.me.id, "a second standby EVM called ({}); refused: the follower slot is held", peer.node_id);
                        self.messenger.close(*conn);
                        return true;
                    }
                    Call::Fenced(epoch) => {
                        warn!(node = %self.me.id, "a standby EVM called this EVM, which epoch {epoch} fenced; refused");
                        self.messenger.close(*conn);
                        return true;
                    }
                    Call::Taken {
                        replaced: Some(old),
                    } => {
                        info!(node = %self.me.id, "the standby EVM called again; its silent connection is closed");
                        self.messenger.close(old);
                    }
                    Call::Taken { replaced: None } => {
                        info!(node = %self.me.id, "the standby EVM follows this one")
                    }
                }
                let conn = *conn;
                // decisions from outside taken before it came: it gets a copy of them
                if let Logic::Evm(e) = &self.logic {
                    let (first, queued) = e.queued_decisions();
                    for m in Message::windows(first, &queued) {
                        let _ = self.messenger.send_now(conn, &m);
                    }
                }
                // and this EVM's word at once: a call that comes as the run ends (after
                // the word that said so, while this EVM says Bye to its nodes) hears that it
                // is over, rather than a closed connection
                if let Some(m) = self.follow_word(false) {
                    let _ = self.messenger.send_now(conn, &m);
                }
                true
            }
            // a fenced EVM takes no one: a node that lost the standby it followed and calls
            // this address again is for the standby that listens here next, never for it
            (Standby::Active(a), Incoming::Accepted { conn, peer }) if a.fenced().is_some() => {
                let epoch = a.fenced().unwrap_or_default();
                warn!(node = %self.me.id, "{} called this EVM, which epoch {epoch} fenced; refused", peer.node_id);
                self.messenger.close(*conn);
                true
            }
            (Standby::Active(a), Incoming::Closed { conn, .. }) if a.is_follower(*conn) => {
                warn!(node = %self.me.id, "the standby EVM is gone: a loss of this EVM would end the run");
                a.closed(*conn);
                true
            }
            (Standby::Active(a), Incoming::Received { conn, msg }) if a.is_follower(*conn) => {
                a.heard(at);
                if let Received::Message(Message::Fence { epoch }) = msg {
                    let epoch = *epoch;
                    self.fence(NodeRef::Evm, epoch);
                }
                true
            }
            (Standby::Follower(f), Incoming::Connected { conn, .. }) if f.machine.owns(*conn) => {
                f.machine.handle(at, Input::Connected(*conn));
                self.drive_follower(now);
                true
            }
            (Standby::Follower(f), Incoming::Closed { conn, reason }) if f.machine.owns(*conn) => {
                if matches!(f.machine.stage(), Stage::Following { .. }) {
                    warn!(node = %self.me.id, "the active EVM's connection closed: {reason}");
                } else {
                    debug!(node = %self.me.id, "the active EVM's connection closed: {reason}");
                }
                f.machine.handle(at, Input::Closed(*conn));
                self.drive_follower(now);
                true
            }
            (Standby::Follower(f), Incoming::Received { conn, msg }) if f.machine.owns(*conn) => {
                let input = match msg {
                    Received::Message(Message::Window { first, windows }) => {
                        // a copy of decisions from outside the active EVM has taken
                        for (i, w) in windows.iter().enumerate() {
                            f.decisions.insert(first + i as u64, w.clone());
                        }
                        Input::Heard(*conn)
                    }
                    Received::Message(Message::Follow(w)) => {
                        // the records below it are final: their windows are needed no more
                        if w.decisions_final > 0 {
                            f.decisions = f.decisions.split_off(&w.decisions_final);
                        }
                        Input::Word(*conn, w.clone())
                    }
                    _ => Input::Heard(*conn),
                };
                f.machine.handle(at, input);
                self.drive_follower(now);
                true
            }
            _ => false,
        }
    }

    /// A message from a node to the standby while it takes over: resyncs are gathered,
    /// the rest held until the new EVM is made. `None` when the standby took it.
    pub(super) fn standby_message(
        &mut self,
        now: Instant,
        from: NodeRef,
        msg: Message,
    ) -> Option<Message> {
        let at = self.at(now);
        let Standby::Follower(f) = &mut self.standby else {
            return Some(msg);
        };
        // a node's first resync: answered as the machine says (a node the EVM dropped is
        // closed, without a Term)
        let first_resync =
            matches!(msg, Message::ResyncRu { .. } | Message::ResyncBu { .. }) && !f.resynced(from);
        if first_resync && f.machine.answer(from, FirstWord::Resync) == Answer::Close {
            if let Some(conn) = self.links.conn(from) {
                info!(node = %self.me.id, "{from}, which the active EVM dropped, called the standby: closed without a Term (the run goes on without it)");
                self.messenger.close(conn);
                self.forget(from, conn);
            }
            return None;
        }
        let complete = match (from, msg) {
            (NodeRef::Ru(i), Message::ResyncRu { resync, more }) => {
                gather(&mut f.rus, i, resync, more, RuResync::absorb);
                f.rus.get(&i).is_some_and(|(_, more)| !more)
            }
            (NodeRef::Bu(i), Message::ResyncBu { resync, more }) => {
                gather(&mut f.bus, i, *resync, more, BuResync::absorb);
                f.bus.get(&i).is_some_and(|(_, more)| !more)
            }
            (_, Message::Heartbeat) => return None,
            (from, msg) => {
                if !f.resynced(from) && f.machine.answer(from, FirstWord::Other) == Answer::Close {
                    // a node that calls with no resync first did not leave an EVM for this
                    // standby: a restarted BU, or one that started before the EVM
                    // listened. It is not this standby's (it had no Term here): closed, it
                    // calls the EVM's address again, and finds the standby only once it
                    // took over. Held, it would be kept from the run.
                    if let Some(conn) = self.links.conn(from) {
                        info!(node = %self.me.id, "{from} called the standby with {:?}, not a resync: closed, to call the run's EVM", msg.msg_type());
                        self.messenger.close(conn);
                        self.forget(from, conn);
                    }
                    return None;
                }
                if let Message::Register(_) = msg {
                    // where a node that resynced listens: known at once
                    return Some(msg);
                }
                f.held.push((from, msg));
                return None;
            }
        };
        let answer = f.machine.answer(from, FirstWord::Resync);
        f.machine.handle(
            at,
            Input::Resync {
                node: from,
                complete,
            },
        );
        if let (true, Answer::Term(epoch)) = (first_resync, answer) {
            // a node that left its EVM for this standby: its Term now (not at the
            // connection: a node that calls here for another reason never hears one), and
            // a BU's number is known from here on (a successor must draw another)
            if let NodeRef::Bu(_) = from {
                let inc = self.links.incarnation_of(from);
                self.links.seen_incarnations.insert(from, inc);
            }
            if let Some(conn) = self.links.conn(from) {
                let term = Message::Term { epoch: epoch.get() };
                let _ = self.messenger.send_now(conn, &term);
            }
        }
        self.drive_follower(now);
        None
    }

    /// Each pass: the standby's machine is woken (it calls the active EVM, watches it, and
    /// takes over once it is lost and every node has answered, or the wait is over); a
    /// node waiting for the standby gives up after its wait. Returns true while this
    /// process is a follower that has not taken over (its EVM logic must not run yet).
    pub(super) fn standby_pass(&mut self, now: Instant) -> bool {
        let wait = takeover_wait(&self.cfg);
        let at = self.at(now);
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
                // an operator's stop or abort (Ctrl-C, SIGTERM, the control API) ends a
                // standby that follows: it has no run of its own to drain
                if f.machine.may_stop()
                    && (self.control.stop_requested() || self.control.take_abort().is_some())
                {
                    f.machine.handle(at, Input::Stop);
                }
                f.machine.handle_timeout(at);
                self.drive_follower(now);
                self.standby.following()
            }
            _ => false,
        }
    }

    /// How long the standby's loop may sleep at most: until its machine's next timeout.
    pub(super) fn standby_wait(&self, now: Instant, cap: Duration) -> Duration {
        match &self.standby {
            Standby::Follower(f) => f
                .machine
                .poll_timeout()
                .map_or(cap, |t| t.saturating_sub(self.at(now)).min(cap)),
            _ => cap,
        }
    }

    /// Does what the standby's machine asks: its calls, heartbeats and fence, and its
    /// decisions (an end, a takeover).
    fn drive_follower(&mut self, now: Instant) {
        let at = self.at(now);
        loop {
            let Standby::Follower(f) = &mut self.standby else {
                return;
            };
            if let Some(t) = f.machine.poll_transmit() {
                match t {
                    Transmit::Dial => {
                        let hello = Hello::new(
                            Channel::Control,
                            evb_wire::Role::Evm,
                            1,
                            &self.cfg.run.id,
                            &self.me.id,
                        );
                        match self.messenger.connect(&f.active, hello) {
                            Ok(c) => f.machine.handle(at, Input::Dialed(c)),
                            Err(e) => {
                                debug!(node = %self.me.id, "calling the active EVM: {e}");
                                f.machine.handle(at, Input::DialFailed);
                            }
                        }
                    }
                    Transmit::Heartbeat(conn) => {
                        let _ = self.messenger.send_batched(conn, &Message::Heartbeat);
                    }
                    Transmit::Fence(conn, epoch) => {
                        // a node followed: the takeover is decided, and the old EVM, should
                        // it wake, is told that it is fenced (it then closes its nodes'
                        // connections, so that every node still with it calls here)
                        info!(node = %self.me.id, "a node followed: fencing the old EVM (epoch {epoch})");
                        let _ = self
                            .messenger
                            .send_now(conn, &Message::Fence { epoch: epoch.get() });
                    }
                }
                continue;
            }
            let Some(e) = f.machine.poll_event() else {
                return;
            };
            let timeout = self.cfg.run.heartbeat_timeout_ms;
            match e {
                Event::Reached => {
                    info!(node = %self.me.id, "following the active EVM at {}", f.active)
                }
                Event::Suspected { lost: true } => {
                    warn!(node = %self.me.id, "lost the active EVM; taking over if the nodes follow")
                }
                Event::Suspected { lost: false } => {
                    warn!(node = %self.me.id, "the active EVM is silent for {timeout} ms; taking over if the nodes follow")
                }
                Event::StoodDown { spoke } => {
                    let why = if spoke {
                        "it speaks again"
                    } else {
                        "its connection is open"
                    };
                    warn!(node = %self.me.id, "no node left the active EVM and {why}: standing down, following on");
                }
                Event::Over { elsewhere: false } => {
                    self.end(true, "the run ended at the active EVM".into())
                }
                Event::Over { elsewhere: true } => self.end(
                    true,
                    "the active EVM, called again, is in another run: this one ended there".into(),
                ),
                Event::Recalling => {
                    warn!(node = %self.me.id, "no node left the active EVM within the wait after its connection closed: calling it again (a takeover needs a node that follows)")
                }
                Event::Abandoned => {
                    let why = format!(
                        "the active EVM was out of reach for {} s (run.connect_timeout_s) after its connection closed, and no node left it: the run's verdict is its own, not this standby's",
                        self.cfg.run.connect_timeout_s
                    );
                    warn!(node = %self.me.id, "{why}");
                    self.end(true, why);
                }
                Event::Stopped => self.end(true, "stopped while following the EVM".into()),
                Event::NeverReached => {
                    let why = format!(
                        "the EVM at {} did not answer within {} s (run.connect_timeout_s)",
                        f.active, self.cfg.run.connect_timeout_s
                    );
                    self.end(false, why);
                }
                Event::TakeOver {
                    epoch,
                    word,
                    word_at,
                    ..
                } => self.take_over(now, epoch, word, word_at),
            }
        }
    }

    /// This process ends for `why`, unless an end was decided before.
    fn end(&mut self, ok: bool, why: String) {
        if self.exit.is_none() {
            self.exit = Some((ok, why));
        }
    }

    /// The epoch this process speaks for the run at, as the Term that opens each node's
    /// control connection says: the EVM's (0 before any takeover), or, for a standby that
    /// nodes call while it takes over, the one above the active EVM's.
    pub(super) fn own_epoch(&self) -> Epoch {
        match (&self.standby, &self.logic) {
            (Standby::Follower(f), _) => f.machine.epoch(),
            (_, Logic::Evm(e)) => Epoch::new(e.stats().epoch),
            _ => Epoch::FIRST,
        }
    }

    /// A node hears its EVM's term. One below the highest epoch this node followed in this
    /// run is stale: that EVM was replaced and missed its fence (a lost follow connection).
    /// It is told so with a Fence of the epoch followed (it then ends as fenced), and the
    /// connection is refused as a lost EVM (with a standby, the node calls it again).
    pub(super) fn on_term(&mut self, now: Instant, conn: ConnId, epoch: u16) {
        let refusal = match self.links.authority.term(conn, Epoch::new(epoch)) {
            Ok(()) => {
                self.standby_answered();
                return;
            }
            Err(r) => r,
        };
        let followed = self.links.authority.followed();
        warn!(node = %self.me.id, "the EVM on this connection speaks at epoch {epoch}, below the {followed} this node followed; refused ({refusal}), and told it is fenced");
        let _ = self.messenger.send_now(
            conn,
            &Message::Fence {
                epoch: followed.get(),
            },
        );
        self.refuse_evm(now, conn, refusal);
    }

    /// A node refuses the EVM on `conn` (a stale term, or words before its Term): the
    /// connection is closed as a lost EVM (with a standby, the node calls it again).
    pub(super) fn refuse_evm(&mut self, now: Instant, conn: ConnId, why: crate::session::Refusal) {
        self.messenger.close(conn);
        if self.links.peers.remove(&conn).is_some() {
            self.lose(now, NodeRef::Evm, conn, why.to_string());
        }
    }

    /// An EVM hears from a node that it followed a later epoch than this EVM's: another EVM
    /// took the run over and this one missed its fence. It is fenced now, as by the Fence
    /// of the standby itself. Without a standby nothing else can hold the run: the word is
    /// refused by name.
    pub(super) fn fenced_by_node(&mut self, from: NodeRef, epoch: u16) {
        if self.standby.following() {
            warn!(node = %self.me.id, "{from} sent a Fence of epoch {epoch} to a standby that follows; ignored");
            return;
        }
        if !matches!(self.standby, Standby::Active(_)) {
            warn!(node = %self.me.id, "{from} sent a Fence of epoch {epoch}, in a run without a standby (no other EVM can hold it); ignored");
            return;
        }
        self.fence(from, epoch);
    }

    /// This (old) EVM hears (from `from`: its follower, or a node) that a standby the nodes
    /// followed holds the run at `epoch`: it closes every node's connection (a node still
    /// with it then calls the standby), acts no more (no Assign, Release, publication or
    /// Halt: `run_action` drops them) and ends with a report that says it was fenced, so
    /// that no reader takes it for the run's. A fence not above this EVM's epoch is refused.
    fn fence(&mut self, from: NodeRef, epoch: u16) {
        let own = self.own_epoch();
        let Standby::Active(a) = &mut self.standby else {
            return;
        };
        debug_assert_eq!(a.epoch(), own, "the slot speaks at the EVM's epoch");
        match a.fence(Epoch::new(epoch)) {
            Fenced::Already => {}
            Fenced::NotAbove { own } => {
                warn!(node = %self.me.id, "{from} sent a Fence of epoch {epoch}, not above this EVM's {own}; ignored")
            }
            Fenced::Now(epoch) => {
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
        }
    }

    /// An active EVM lost node `p` (`paused`: right after its own pause): if
    /// session::Active says so, it yields the run to its standby: every node's connection
    /// and the follower's closed (the standby suspects at once, the nodes call it), acting
    /// no more, and a report that says it was fenced. True when it yielded.
    pub(super) fn yield_to_standby(&mut self, p: NodeRef, paused: bool) -> bool {
        let Standby::Active(a) = &mut self.standby else {
            return false;
        };
        let follower = a.follower();
        let Some(epoch) = a.node_lost(paused) else {
            return false;
        };
        warn!(node = %self.me.id, "{p} left while this EVM did not run: yielding the run to the standby (epoch {epoch}); this EVM stops and its report is not the run's");
        let conns: Vec<ConnId> = self.links.conns().map(|(_, c)| c).chain(follower).collect();
        for c in conns {
            self.messenger.close(c);
        }
        self.exit = Some((
            false,
            format!("fenced by epoch {epoch}: {p} left while this EVM did not run, and the run was yielded to the standby EVM, whose report is the run's"),
        ));
        true
    }

    /// An active EVM with a follower: a Fence among `incoming` is acted on first, so that
    /// nothing else of the batch (the nodes' closed connections, found on waking) makes
    /// this EVM decide anything.
    pub(super) fn fence_first(&mut self, incoming: &[Incoming]) {
        let Some(f) = self.follower_conn() else {
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
            self.fence(NodeRef::Evm, e);
        }
    }

    /// Waits up to `most` for a Fence from the follower (an EVM about to report a failure).
    pub(super) fn await_fence(&mut self, most: Duration) {
        let until = Instant::now() + most;
        let mut got = Vec::new();
        while Instant::now() < until {
            if self.follower_conn().is_none() {
                return;
            }
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

    /// The standby becomes the run's EVM at `epoch`, from the active EVM's last `word`
    /// (heard at `word_at`) and what the nodes sent.
    fn take_over(&mut self, now: Instant, epoch: Epoch, word: Follow, word_at: Time) {
        let Standby::Follower(mut f) = std::mem::replace(&mut self.standby, Standby::None) else {
            return;
        };
        let Logic::Evm(old) = &self.logic else {
            return;
        };
        let cfg = old.config().clone();
        let dropped = dropped_by(&word);
        // the run's files count from its first EVM's start, not from this process's (a
        // standby started after an earlier takeover came later than some of them)
        if word.since_ms > 0 {
            let first = std::time::UNIX_EPOCH + Duration::from_millis(word.since_ms);
            self.evm.since = self.evm.since.min(first);
        }
        // triggering time: a paused run's clock stood still since the EVM said so
        let since = if word.paused {
            Duration::ZERO
        } else {
            self.at(now).saturating_sub(word_at)
        };
        let elapsed = Duration::from_millis(word.elapsed_ms) + since;
        if word.paused {
            // the operator's pause holds under the new EVM, until resumed at its control
            info!(node = %self.me.id, "the run was paused: it stays paused");
            self.control.set_paused(true);
        }
        // connected nodes whose resync has not come: their Term now, from the run's EVM
        let unresynced: Vec<ConnId> = self
            .links
            .conns()
            .filter(|&(p, _)| !f.resynced(p))
            .map(|(_, c)| c)
            .collect();
        for conn in unresynced {
            let _ = self
                .messenger
                .send_now(conn, &Message::Term { epoch: epoch.get() });
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
            epoch: epoch.get(),
            elapsed,
            dropped,
            reason: "the active EVM was lost".into(),
            stop_requested: word.stop_requested,
            max_events: (word.max_events != evb_wire::UNLIMITED).then_some(word.max_events),
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
            evm.carry_decisions(now, carried);
        }
        for (from, msg) in f.held {
            evm.handle(now, from, msg);
        }
        self.logic = Logic::Evm(evm);
        self.links.mark_up();
        // the run's EVM now: a standby of its own may follow it (`evb up` starts one where
        // the old EVM was), and a second loss is taken over in turn
        self.standby = Standby::Active(Active::new(epoch, self.at(now)));
    }

    /// For a node that never followed an EVM in this run (no Term admitted: a process that
    /// started before its EVM listened, or a restarted BU) in a run with a standby: the EVM
    /// address to call after `addr` failed, the configured EVM's or the
    /// standby's, whichever `addr` is not. `None` without a standby, once the node left an
    /// EVM for the standby (then the standby rules: `call_standby`), or where the EVM is
    /// found by its rendezvous file.
    pub(super) fn other_evm_address(&self, addr: &str) -> Option<String> {
        if self.links.authority.ever_followed() {
            return None;
        }
        let Standby::Node {
            addr: standby,
            switched: false,
            calling_since: None,
            ..
        } = &self.standby
        else {
            return None;
        };
        // the configured EVM's address (`evm.addr`, or its place in the topology)
        let evm = self
            .nodes
            .iter()
            .find(|n| n.role == Role::Evm)?
            .addr
            .clone();
        if standby.is_empty() || self.evm_rendezvous().is_some() || evm.is_empty() {
            return None;
        }
        Some(if addr == evm { standby.clone() } else { evm })
    }

    /// The EVM connection `conn` closed before its Term: not the run's EVM (a fenced EVM
    /// takes no one; a standby that only follows closes a node that did not resync). A node
    /// that has not lost an EVM calls the other address; true if it does.
    pub(super) fn call_the_other_evm(&mut self, now: Instant, conn: ConnId, why: &str) -> bool {
        let current = self
            .links
            .dial_specs
            .get(&NodeRef::Evm)
            .map(|(a, _)| a.clone())
            .unwrap_or_default();
        let Some(other) = self.other_evm_address(&current) else {
            return false;
        };
        self.forget(NodeRef::Evm, conn);
        if matches!(self.state(), RunState::Configured | RunState::Ready) {
            // a Ready said there was not heard by the run's EVM: said again once up
            self.links.mark_down();
        }
        info!(node = %self.me.id, "the EVM connection to {current} closed before its Term ({why}): not the run's EVM; calling {other}");
        self.links
            .dial_specs
            .insert(NodeRef::Evm, (other.clone(), Channel::Control));
        self.links.waiting_dials.push(peers::Dial {
            peer: NodeRef::Evm,
            addr: other,
            channel: Channel::Control,
            retry_at: Some(now + peers::CALL_EVERY),
        });
        true
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

    /// A node that called the standby heard its Term: it follows it now. The next standby
    /// listens where the EVM left was, so a second loss calls it there. (Until the Term, the
    /// node is still calling: a standby that closes it without one — it was dropped — leaves
    /// it to give up after its wait, not to call back and forth.)
    fn standby_answered(&mut self) {
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
        if let Some(old) = left.take() {
            *addr = old;
            *switched = false;
        }
    }

    /// A node reached the standby: its resync goes first.
    pub(super) fn send_resync(&mut self, conn: ConnId) {
        if !matches!(self.standby, Standby::Node { switched: true, .. }) {
            return;
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

//! The standby EVM's machine (docs/standby.md): it calls the active EVM, follows its word,
//! suspects it when it is lost or silent, and takes the run over once a node left it and
//! every node answered (or the wait is over) — or stands down when the active EVM speaks
//! again before any node left it. No IO and no clock: the driver feeds it what happened
//! and the time, sends what [`Follower::poll_transmit`] asks, acts on
//! [`Follower::poll_event`], and wakes it at [`Follower::poll_timeout`].

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use evb_builder::NodeRef;
use evb_transport::ConnId;
use evb_wire::resync::Follow;

use super::term::Epoch;
use super::Time;

/// How long a call to an active EVM that does not answer waits before the next.
pub const RECALL: Duration = Duration::from_millis(200);

/// The follower's timers, from the run's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Timers {
    /// A heartbeat to the active EVM this often.
    pub heartbeat: Duration,
    /// The active EVM silent this long is suspected.
    pub timeout: Duration,
    /// How long a suspicion or a takeover waits for the nodes.
    pub wait: Duration,
    /// An active EVM never reached within this ends the standby.
    pub connect: Duration,
}

/// Where the follower stands.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Not connected to the active EVM: it calls at `retry_at`.
    Calling { retry_at: Time },
    /// A call on its way on `conn`.
    Dialing { conn: ConnId },
    /// Hearing the active EVM on `conn`.
    Following {
        conn: ConnId,
        last_heard: Time,
        next_beat: Time,
    },
    /// The active EVM was lost or went silent at `since`, and no node has left it: a
    /// suspicion. `conn`: its connection, still open (a woken EVM is heard on it, and the
    /// standby stands down).
    Suspected { since: Time, conn: Option<ConnId> },
    /// A node followed the standby at `since`'s suspicion: the takeover is decided; it
    /// waits for every node's resync until `since + wait`.
    TakingOver { since: Time, conn: Option<ConnId> },
    /// The run ended at the active EVM: nothing to take over.
    Over,
    /// This standby is the run's EVM.
    TookOver,
    /// Ended without a run (stopped by the operator, or the active EVM never answered).
    Ended,
}

/// What happened, as the driver tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// The call asked for is on its way on `conn`; or it could not be made.
    Dialed(ConnId),
    DialFailed,
    /// `conn` is connected (the call answered).
    Connected(ConnId),
    /// `conn` closed (a call refused, or the active EVM's connection lost).
    Closed(ConnId),
    /// Anything heard on `conn`; a Follow word carries the active EVM's state.
    Heard(ConnId),
    Word(ConnId, Follow),
    /// Node `node` sent (part of) its resync; `complete`: its last part.
    Resync {
        node: NodeRef,
        complete: bool,
    },
    /// The operator stopped the standby.
    Stop,
}

/// What the driver is to send.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Transmit {
    /// Call the active EVM (then say [`Input::Dialed`] or [`Input::DialFailed`]).
    Dial,
    Heartbeat(ConnId),
    /// Tell the old EVM it is fenced by `epoch`.
    Fence(ConnId, Epoch),
}

/// What the driver is to act on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Event {
    Reached,
    /// The active EVM is suspected (lost: its connection closed; or silent).
    Suspected {
        lost: bool,
    },
    /// It spoke again (or its connection stayed open) and no node had left it.
    StoodDown {
        spoke: bool,
    },
    /// Take the run over at `epoch`, from the active EVM's last word (heard at `word_at`).
    TakeOver {
        epoch: Epoch,
        word: Follow,
        word_at: Time,
        answered: usize,
    },
    /// The active EVM's connection closed, the wait passed and no node left it: the
    /// standby calls it again (a takeover needs a node that followed).
    Recalling,
    /// The run ended at the active EVM (`elsewhere`: it was heard in another run, so the
    /// word that ended this one never came).
    Over {
        elsewhere: bool,
    },
    /// The active EVM was out of reach for the connect timeout since its connection
    /// closed, and no node left it: the run was never this standby's, which ends.
    Abandoned,
    /// Stopped by the operator while following.
    Stopped,
    /// The active EVM never answered within the connect timeout.
    NeverReached,
}

/// A node's first word on a new connection to the standby, before it took over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FirstWord {
    /// Its resync: a node that left its EVM for this standby.
    Resync,
    /// Anything else (Register, Ready): a node that did not lose an EVM — one that started
    /// before its EVM listened, or a restarted BU.
    Other,
}

/// How the standby answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// Its Term: the node follows this standby, which takes the run over at that epoch.
    Term(Epoch),
    /// Closed, without a Term: the node is not this standby's and calls the EVM again. A
    /// Term said to it would make it follow an epoch that may never hold the run, and
    /// fence the run's EVM once it reaches it (docs/standby.md, "A node that starts late").
    Close,
}

/// The standby's machine.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Follower {
    stage: Stage,
    timers: Timers,
    /// The nodes of the run (every RU and BU).
    nodes: Vec<NodeRef>,
    /// The active EVM's last word while followed, and when it came.
    word: Follow,
    word_at: Time,
    /// Since when it follows, and whether it ever reached the active EVM.
    since: Time,
    reached: bool,
    /// Since when the active EVM's connection is lost and it was not heard again.
    unheard_since: Option<Time>,
    /// The run followed, as its words name it (`Follow::since_ms`, 0: not yet known).
    run: u64,
    /// Each node that sent its resync: complete (its last part came) or not yet.
    answered: BTreeMap<NodeRef, bool>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    /// (The model checker's planted bug: the rule before 2026-11-29, a closed connection
    /// that no node left taken over at the end of the wait.)
    #[cfg(test)]
    pub(crate) takes_over_unfollowed: bool,
}

impl Follower {
    pub fn new(timers: Timers, nodes: Vec<NodeRef>, now: Time) -> Follower {
        Follower {
            stage: Stage::Calling { retry_at: now },
            timers,
            nodes,
            word: Follow::default(),
            word_at: now,
            since: now,
            reached: false,
            unheard_since: None,
            run: 0,
            answered: BTreeMap::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            #[cfg(test)]
            takes_over_unfollowed: false,
        }
    }

    pub fn stage(&self) -> &Stage {
        &self.stage
    }

    /// Whether `conn` is the machine's (its call, or the active EVM's connection).
    pub fn owns(&self, conn: ConnId) -> bool {
        match &self.stage {
            Stage::Dialing { conn: c } | Stage::Following { conn: c, .. } => *c == conn,
            Stage::Suspected { conn: c, .. } | Stage::TakingOver { conn: c, .. } => {
                *c == Some(conn)
            }
            _ => false,
        }
    }

    /// The operator may still end it (nothing suspected yet: a stop after that is the
    /// run's, once taken over).
    pub fn may_stop(&self) -> bool {
        matches!(
            self.stage,
            Stage::Calling { .. } | Stage::Dialing { .. } | Stage::Following { .. }
        )
    }

    /// A node followed: the takeover is decided (or done).
    pub fn decided(&self) -> bool {
        matches!(self.stage, Stage::TakingOver { .. } | Stage::TookOver)
    }

    /// The epoch this standby speaks at to the nodes that call it (one above the active
    /// EVM's last word).
    pub fn epoch(&self) -> Epoch {
        Epoch::new(self.word.epoch).next()
    }

    /// How node `node`'s first word on a new connection is answered (before the takeover;
    /// once this standby is the run's EVM, every node's connection opens with its Term). A
    /// node the active EVM dropped is closed too, resync or not: the run goes on without it
    /// (its resync never decides), so it must not follow this standby's epoch — it would wait
    /// here for a takeover that may never come, and fence the run's EVM if it called it
    /// again; closed, its run ends, and it may join again as a new incarnation.
    pub fn answer(&self, node: NodeRef, first: FirstWord) -> Answer {
        match first {
            FirstWord::Resync if !dropped_by(&self.word).contains(&node) => {
                Answer::Term(self.epoch())
            }
            FirstWord::Resync | FirstWord::Other => Answer::Close,
        }
    }

    pub fn handle(&mut self, now: Time, input: Input) {
        match (&mut self.stage, input) {
            (Stage::Calling { .. }, Input::Dialed(conn)) => self.stage = Stage::Dialing { conn },
            (Stage::Calling { retry_at }, Input::DialFailed) => {
                *retry_at = now + RECALL;
                self.left_while_calling(now);
            }
            (Stage::Dialing { conn }, Input::Connected(c)) if *conn == c => {
                self.reached = true;
                self.stage = Stage::Following {
                    conn: c,
                    last_heard: now,
                    next_beat: now,
                };
                self.events.push_back(Event::Reached);
            }
            (Stage::Dialing { conn }, Input::Closed(c)) if *conn == c => {
                self.stage = Stage::Calling {
                    retry_at: now + RECALL,
                };
                self.left_while_calling(now);
            }
            (Stage::Following { conn, .. }, Input::Closed(c)) if *conn == c => {
                self.unheard_since.get_or_insert(now);
                self.suspect(now, None, true)
            }
            (
                Stage::Following {
                    conn, last_heard, ..
                },
                Input::Heard(c),
            ) if *conn == c => *last_heard = now,
            (
                Stage::Following {
                    conn, last_heard, ..
                },
                Input::Word(c, w),
            ) if *conn == c => {
                *last_heard = now;
                self.heard_word(now, w);
            }
            (
                Stage::Calling { .. } | Stage::Dialing { .. } | Stage::Following { .. },
                Input::Stop,
            ) => {
                self.stage = Stage::Ended;
                self.events.push_back(Event::Stopped);
            }
            // a suspected EVM speaks again: no node left it, so the run is still its own
            (
                Stage::Suspected {
                    conn: Some(conn), ..
                },
                Input::Word(c, w),
            ) if *conn == c => self.stand_down(now, c, Some(w)),
            (Stage::Suspected { conn, .. } | Stage::TakingOver { conn, .. }, Input::Closed(c))
                if *conn == Some(c) =>
            {
                *conn = None
            }
            (Stage::Suspected { .. }, Input::Resync { node, complete })
                if !dropped_by(&self.word).contains(&node) =>
            {
                self.answered.insert(node, complete);
                self.decide();
            }
            (Stage::TakingOver { .. }, Input::Resync { node, complete }) => {
                self.answered.insert(node, complete);
                self.take_over_if_all(false);
            }
            // a resync while the active EVM is still heard: kept, and it decides only once
            // the standby suspects the EVM (a node the EVM dropped, which calls here on
            // finding itself cut off, never decides: the run goes on without it)
            (Stage::Following { .. }, Input::Resync { node, complete })
                if !dropped_by(&self.word).contains(&node) =>
            {
                self.answered.insert(node, complete);
            }
            // calling the active EVM again after its loss: a node that left it decides
            (Stage::Calling { .. } | Stage::Dialing { .. }, Input::Resync { node, complete })
                if self.unheard_since.is_some() && !dropped_by(&self.word).contains(&node) =>
            {
                self.answered.insert(node, complete);
                if matches!(self.stage, Stage::Calling { .. }) {
                    self.stage = Stage::Suspected {
                        since: now,
                        conn: None,
                    };
                    self.decide();
                }
            }
            _ => {}
        }
    }

    /// Time passed: whatever is due at `now` is decided.
    pub fn handle_timeout(&mut self, now: Time) {
        let t = self.timers;
        match &mut self.stage {
            Stage::Calling { .. } | Stage::Dialing { .. }
                if !self.reached && now.saturating_sub(self.since) > t.connect =>
            {
                self.stage = Stage::Ended;
                self.events.push_back(Event::NeverReached);
            }
            Stage::Calling { .. } | Stage::Dialing { .. }
                if self
                    .unheard_since
                    .is_some_and(|l| now.saturating_sub(l) > t.connect) =>
            {
                self.stage = Stage::Ended;
                self.events.push_back(Event::Abandoned);
            }
            Stage::Calling { retry_at } if now >= *retry_at => {
                // asked once: the next call waits for the answer to this one
                *retry_at = Time::MAX;
                self.transmits.push_back(Transmit::Dial);
            }
            Stage::Following {
                conn,
                last_heard,
                next_beat,
            } => {
                if now.saturating_sub(*last_heard) > t.timeout {
                    // a suspicion until a node follows: the connection stays open, so that
                    // an EVM that wakes is heard (and told, if it was replaced)
                    let c = *conn;
                    self.suspect(now, Some(c), false);
                } else if now >= *next_beat {
                    *next_beat = now + t.heartbeat;
                    self.transmits.push_back(Transmit::Heartbeat(*conn));
                }
            }
            Stage::Suspected { since, conn, .. } if now.saturating_sub(*since) >= t.wait => {
                match *conn {
                    // no node left it, and its connection is still open: still its run
                    Some(c) => self.stand_down(now, c, None),
                    // no node left it, and its connection closed: the nodes are with it
                    // still, or gone with it, or the run ended there — a takeover would be a
                    // second EVM with a verdict of its own. It is called again.
                    #[cfg(test)]
                    None if self.takes_over_unfollowed => self.take_over_if_all(true),
                    None => {
                        self.stage = Stage::Calling { retry_at: now };
                        self.events.push_back(Event::Recalling);
                    }
                }
            }
            Stage::TakingOver { since, .. } if now.saturating_sub(*since) >= t.wait => {
                self.take_over_if_all(true)
            }
            _ => {}
        }
    }

    /// When the machine next has something to decide on its own (`None`: nothing).
    pub fn poll_timeout(&self) -> Option<Time> {
        let t = self.timers;
        let never = match self.unheard_since {
            _ if !self.reached => Some(self.since + t.connect + TICK),
            Some(l) => Some(l + t.connect + TICK),
            None => None,
        };
        match &self.stage {
            // (a call asked for and not yet answered: no retry of its own)
            Stage::Calling { retry_at } if *retry_at == Time::MAX => never,
            Stage::Calling { retry_at } => Some(never.map_or(*retry_at, |n| n.min(*retry_at))),
            Stage::Dialing { .. } => never,
            Stage::Following {
                last_heard,
                next_beat,
                ..
            } => Some((*last_heard + t.timeout + TICK).min(*next_beat)),
            Stage::Suspected { since, .. } | Stage::TakingOver { since, .. } => {
                Some(*since + t.wait)
            }
            Stage::Over | Stage::TookOver | Stage::Ended => None,
        }
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn suspect(&mut self, now: Time, conn: Option<ConnId>, lost: bool) {
        self.stage = Stage::Suspected { since: now, conn };
        self.events.push_back(Event::Suspected { lost });
        // a node that answered before the suspicion followed already
        if !self.answered.is_empty() {
            self.decide();
        }
    }

    /// A node followed: the takeover is decided, and the old EVM, should it wake, is fenced.
    fn decide(&mut self) {
        let Stage::Suspected { since, conn } = self.stage else {
            return;
        };
        if let Some(c) = conn {
            self.transmits.push_back(Transmit::Fence(c, self.epoch()));
        }
        self.stage = Stage::TakingOver { since, conn };
        self.take_over_if_all(false);
    }

    fn stand_down(&mut self, now: Time, conn: ConnId, word: Option<Follow>) {
        self.events.push_back(Event::StoodDown {
            spoke: word.is_some(),
        });
        self.stage = Stage::Following {
            conn,
            last_heard: now,
            next_beat: now,
        };
        if let Some(w) = word {
            self.heard_word(now, w);
        } else if self.word.over {
            self.stage = Stage::Over;
            self.events.push_back(Event::Over { elsewhere: false });
        }
    }

    /// The active EVM's word, while it is followed. A word of another run than the one
    /// followed (a call again found it in its next one) says that this run ended there.
    fn heard_word(&mut self, now: Time, w: Follow) {
        self.unheard_since = None;
        if self.run != 0 && w.since_ms != 0 && w.since_ms != self.run {
            self.stage = Stage::Over;
            self.events.push_back(Event::Over { elsewhere: true });
            return;
        }
        if w.since_ms != 0 {
            self.run = w.since_ms;
        }
        let over = w.over;
        self.word = w;
        self.word_at = now;
        if over {
            self.stage = Stage::Over;
            self.events.push_back(Event::Over { elsewhere: false });
        }
    }

    /// Calling the active EVM again after its loss, a node that left it came: the takeover
    /// is decided.
    fn left_while_calling(&mut self, now: Time) {
        let dropped = dropped_by(&self.word);
        if self.unheard_since.is_some() && self.answered.keys().any(|n| !dropped.contains(n)) {
            self.stage = Stage::Suspected {
                since: now,
                conn: None,
            };
            self.decide();
        }
    }

    /// Takes the run over once every node not dropped answered completely, or at once
    /// when `waited` (the wait is over: the run goes on with the nodes that answered).
    fn take_over_if_all(&mut self, waited: bool) {
        let dropped = dropped_by(&self.word);
        let all = self
            .nodes
            .iter()
            .all(|p| dropped.contains(p) || self.answered.get(p) == Some(&true));
        if !all && !waited {
            return;
        }
        self.stage = Stage::TookOver;
        self.events.push_back(Event::TakeOver {
            epoch: self.epoch(),
            word: self.word.clone(),
            word_at: self.word_at,
            answered: self.answered.values().filter(|c| **c).count(),
        });
    }
}

/// The smallest step of time: a silence must pass its timeout, not only reach it.
const TICK: Duration = Duration::from_nanos(1);

/// The nodes the active EVM had dropped, by its last word.
pub fn dropped_by(follow: &Follow) -> Vec<NodeRef> {
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

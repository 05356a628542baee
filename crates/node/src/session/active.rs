//! The active EVM's side of a run with a standby: the follower slot (the first standby
//! that calls holds it; a second is refused while the first is heard) and the fence (a
//! standby that the nodes followed says so, at an epoch above this EVM's: from then on this
//! EVM acts no more). No IO.

use std::time::Duration;

use evb_transport::ConnId;

use super::term::Epoch;
use super::Time;

/// The active EVM's follower slot and fence.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Active {
    own: Epoch,
    follower: Option<ConnId>,
    heard: Time,
    fenced: Option<Epoch>,
}

/// What becomes of a standby's call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// It follows now (`replaced`: the silent connection of the one before, to close).
    Taken { replaced: Option<ConnId> },
    /// The slot is held by a follower heard within the timeout: refused.
    Held,
    /// This EVM is fenced: it takes no one.
    Fenced(Epoch),
}

/// What a Fence did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// Fenced now: close every node's connection, act no more, report as fenced.
    Now(Epoch),
    /// Fenced before: nothing more to do.
    Already,
    /// Not above this EVM's epoch: a stale or forged fence, ignored.
    NotAbove { own: Epoch },
}

impl Active {
    pub fn new(own: Epoch, now: Time) -> Active {
        Active {
            own,
            follower: None,
            heard: now,
            fenced: None,
        }
    }

    /// The epoch this EVM speaks at.
    pub fn epoch(&self) -> Epoch {
        self.own
    }

    /// The epoch that fenced this EVM, if one did.
    pub fn fenced(&self) -> Option<Epoch> {
        self.fenced
    }

    /// The follower's connection, while this EVM is not fenced: its word goes there.
    pub fn follower(&self) -> Option<ConnId> {
        self.follower.filter(|_| self.fenced.is_none())
    }

    /// Whether `conn` is the follower's.
    pub fn is_follower(&self, conn: ConnId) -> bool {
        self.follower == Some(conn)
    }

    /// A standby calls on `conn`.
    pub fn call(&mut self, now: Time, conn: ConnId, timeout: Duration) -> Call {
        if let Some(e) = self.fenced {
            return Call::Fenced(e);
        }
        // one slot: a second caller does not replace a standby still heard (its loss would
        // make the real standby take over a run the nodes never left)
        if self.follower.is_some() && now.saturating_sub(self.heard) <= timeout {
            return Call::Held;
        }
        self.heard = now;
        Call::Taken {
            replaced: self.follower.replace(conn),
        }
    }

    /// The follower was heard.
    pub fn heard(&mut self, now: Time) {
        self.heard = now;
    }

    /// `conn` closed: true if it was the follower's.
    pub fn closed(&mut self, conn: ConnId) -> bool {
        let was = self.follower == Some(conn);
        if was {
            self.follower = None;
        }
        was
    }

    /// A node was lost during the run. `after_pause`: this EVM's own pause (the process
    /// stopped, or starved of CPU) ended moments before, so the node most likely left
    /// because of it and is calling the standby. With a follower, this EVM does not decide
    /// on a loss it caused: it yields, fenced at the standby's epoch (its report is then not
    /// the run's), and the standby takes the run over. Returns that epoch when it yields.
    pub fn node_lost(&mut self, after_pause: bool) -> Option<Epoch> {
        if !after_pause || self.follower().is_none() {
            return None;
        }
        let e = self.own.next();
        self.fenced = Some(e);
        Some(e)
    }

    /// A Fence of `epoch` (from the follower, or from a node that followed a later EVM).
    pub fn fence(&mut self, epoch: Epoch) -> Fenced {
        if self.fenced.is_some() {
            return Fenced::Already;
        }
        if epoch <= self.own {
            return Fenced::NotAbove { own: self.own };
        }
        self.fenced = Some(epoch);
        Fenced::Now(epoch)
    }
}

//! Whose word is the run's: the epoch an EVM speaks at, the incarnation a BU process runs
//! as, and a node's door for EVMs (the highest epoch it followed, and the Term that must
//! open every control connection before the EVM says anything else).

use std::fmt;
use std::num::NonZeroU16;

use evb_transport::ConnId;

/// The epoch an EVM speaks for the run at: 0 for the EVM that started it, one more for
/// each standby that took it over. A lower epoch's words are stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Epoch(u16);

impl Epoch {
    /// The EVM that started the run.
    pub const FIRST: Epoch = Epoch(0);

    pub const fn new(e: u16) -> Epoch {
        Epoch(e)
    }

    /// As the wire carries it.
    pub const fn get(self) -> u16 {
        self.0
    }

    /// The epoch of the standby that takes this one over (saturating: 65,535 takeovers
    /// in one run are not a case to wrap around in).
    pub const fn next(self) -> Epoch {
        Epoch(self.0.saturating_add(1))
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A BU process's incarnation, drawn at its start: 1…65535 (docs/protocol.md §3). RUs send
/// an Assign's fragments only to the incarnation it names, so a restarted BU never gets its
/// predecessor's. 0 is not an incarnation: a Hello that says 0 is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Incarnation(NonZeroU16);

impl Incarnation {
    /// The wire's value, if it is an incarnation (0 is not).
    pub fn from_wire(v: u16) -> Option<Incarnation> {
        NonZeroU16::new(v).map(Incarnation)
    }

    pub fn get(self) -> u16 {
        self.0.get()
    }
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Why a node refuses what an EVM said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A Term below the highest epoch this node followed: that EVM was replaced.
    Stale { epoch: Epoch, followed: Epoch },
    /// A message other than Term first on the EVM's connection: every EVM says its epoch
    /// before anything else (protocol.md §6); one that does not is not followed.
    NoTerm,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Stale { epoch, followed } => {
                write!(f, "stale epoch {epoch} (this node followed {followed})")
            }
            Refusal::NoTerm => write!(f, "the EVM spoke before its Term"),
        }
    }
}

/// An RU's or BU's door for EVMs: which epoch it follows, and on which connection the EVM
/// said it. No IO; the driver does what its answers say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Authority {
    /// The highest epoch this node followed in this run (`None`: no EVM yet).
    followed: Option<Epoch>,
    /// The EVM connection whose Term was admitted: its words are the run's.
    termed: Option<ConnId>,
    /// (The model checker's planted bug: the Term check switched off.)
    #[cfg(test)]
    pub(crate) unchecked: bool,
}

impl Authority {
    /// The EVM on `conn` says it speaks at `epoch`. `Ok`: followed from now on (the
    /// highest epoch followed becomes it); a lower one than followed is stale.
    pub fn term(&mut self, conn: ConnId, epoch: Epoch) -> Result<(), Refusal> {
        match self.followed {
            Some(followed) if epoch < followed && !self.planted() => {
                Err(Refusal::Stale { epoch, followed })
            }
            _ => {
                self.followed = Some(self.followed.map_or(epoch, |f| f.max(epoch)));
                self.termed = Some(conn);
                Ok(())
            }
        }
    }

    /// Whether this node followed any EVM in this run (a Term admitted once). A node that
    /// never did may look for its EVM at the other EVM address; one that did follows the
    /// standby rules only (docs/standby.md, "A node that starts late").
    pub fn ever_followed(&self) -> bool {
        self.followed.is_some()
    }

    /// A message other than Term from the EVM on `conn`: the run's word only once that
    /// connection said its Term.
    pub fn admit(&self, conn: ConnId) -> Result<(), Refusal> {
        if self.termed == Some(conn) || self.planted() {
            Ok(())
        } else {
            Err(Refusal::NoTerm)
        }
    }

    /// The EVM's connection closed: the next must say its Term again.
    pub fn lost(&mut self, conn: ConnId) {
        if self.termed == Some(conn) {
            self.termed = None;
        }
    }

    /// The highest epoch this node followed in this run (0 before any).
    pub fn followed(&self) -> Epoch {
        self.followed.unwrap_or(Epoch::FIRST)
    }

    #[inline]
    fn planted(&self) -> bool {
        #[cfg(test)]
        return self.unchecked;
        #[cfg(not(test))]
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node's door for EVMs, scripted without a socket: terms of the same and later
    /// epochs pass, a replaced EVM's does not, and nothing passes before a Term.
    #[test]
    fn an_epoch_below_the_one_followed_is_stale() {
        let mut a = Authority::default();
        let (c1, c2, c3) = (ConnId(1), ConnId(2), ConnId(3));
        assert_eq!(a.admit(c1), Err(Refusal::NoTerm), "no Term yet");
        assert_eq!(a.term(c1, Epoch(0)), Ok(()));
        assert_eq!(a.admit(c1), Ok(()));
        assert_eq!(a.term(c1, Epoch(0)), Ok(()), "the same EVM's term again");
        a.lost(c1);
        assert_eq!(a.admit(c1), Err(Refusal::NoTerm), "a lost connection");
        assert_eq!(a.term(c2, Epoch(2)), Ok(()), "a takeover (or two) later");
        assert_eq!(a.followed(), Epoch(2));
        assert_eq!(a.admit(c2), Ok(()));
        assert_eq!(a.admit(c3), Err(Refusal::NoTerm), "another connection");
        assert_eq!(
            a.term(c3, Epoch(1)),
            Err(Refusal::Stale {
                epoch: Epoch(1),
                followed: Epoch(2)
            }),
            "an EVM replaced since"
        );
        assert_eq!(
            a.admit(c3),
            Err(Refusal::NoTerm),
            "a stale EVM stays unheard"
        );
        assert_eq!(a.admit(c2), Ok(()), "a stale term changes nothing");
        assert_eq!(a.followed(), Epoch(2));
        assert_eq!(a.term(c3, Epoch(3)), Ok(()));
    }

    #[test]
    fn incarnation_zero_is_not_one() {
        assert_eq!(Incarnation::from_wire(0), None);
        assert_eq!(Incarnation::from_wire(1).map(Incarnation::get), Some(1));
        assert_eq!(
            Incarnation::from_wire(u16::MAX).map(Incarnation::get),
            Some(u16::MAX)
        );
        assert_eq!(Epoch::new(u16::MAX).next(), Epoch::new(u16::MAX));
        assert_eq!(Epoch::FIRST.next().get(), 1);
    }
}

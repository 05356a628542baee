//! Admission of consumer connections and their handshake deadline, free of IO: which
//! unfinished handshake a new connection sheds, when it is refused, and how long the
//! acceptor may wait. Time is passed in.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::{HANDSHAKE_DEADLINE, MAX_CONNECTIONS, MAX_HANDSHAKES_PER_IP};

/// The acceptor waits at most this in poll(2) (the stop flag and the ack timeouts).
const MAX_WAIT: Duration = Duration::from_millis(50);

/// How a new connection gets its slot.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Admission {
    /// First shed this unfinished handshake (an index into the handshaking connections,
    /// oldest first): the new connection's address has too many handshaking.
    pub(super) shed_same_ip: Option<usize>,
    /// Then, with that one gone:
    pub(super) room: Room,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Room {
    /// A slot is free.
    Free,
    /// Every slot is taken: shed the oldest unfinished handshake.
    ShedOldest,
    /// Every slot is a consumer being served: refuse the new connection (`Busy`).
    Refuse,
}

/// A new connection from `ip`, with `handshaking` the addresses of the connections still
/// handshaking (oldest first) and `serving` consumers being served. Unfinished handshakes
/// never keep a consumer out: the oldest of the same address (beyond
/// [`MAX_HANDSHAKES_PER_IP`]), or of all (beyond [`MAX_CONNECTIONS`]), makes room.
pub(super) fn admission(
    handshaking: impl Iterator<Item = IpAddr> + Clone,
    ip: IpAddr,
    serving: usize,
) -> Admission {
    let same = handshaking.clone().filter(|&a| a == ip).count();
    let shed_same_ip = if same >= MAX_HANDSHAKES_PER_IP {
        handshaking.clone().position(|a| a == ip)
    } else {
        None
    };
    let left = handshaking.count() - usize::from(shed_same_ip.is_some());
    let room = if left + serving < MAX_CONNECTIONS {
        Room::Free
    } else if left == 0 {
        Room::Refuse
    } else {
        Room::ShedOldest
    };
    Admission { shed_same_ip, room }
}

/// Whether a handshake that started at `since` has run out of time at `now`: a whole
/// deadline from the accept, however its bytes trickle.
pub(super) fn expired(since: Instant, now: Instant) -> bool {
    now.duration_since(since) >= HANDSHAKE_DEADLINE
}

/// How long the acceptor may wait for news at `now`: [`MAX_WAIT`], or less when a handshake
/// (started at one of `since`) reaches its deadline first.
pub(super) fn poll_wait(since: impl Iterator<Item = Instant>, now: Instant) -> Duration {
    since.fold(MAX_WAIT, |wait, t| {
        wait.min((t + HANDSHAKE_DEADLINE).saturating_duration_since(now))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    #[test]
    fn a_slot_is_free_below_the_limits() {
        let hs = [ip(1), ip(2), ip(1)];
        let a = admission(hs.iter().copied(), ip(1), 10);
        assert_eq!(
            a,
            Admission {
                shed_same_ip: None,
                room: Room::Free
            }
        );
    }

    /// An address with its most handshaking sheds its own oldest; that frees a slot too.
    #[test]
    fn an_address_at_its_limit_sheds_its_oldest() {
        let mut hs = vec![ip(2)];
        hs.extend(std::iter::repeat_n(ip(1), MAX_HANDSHAKES_PER_IP));
        let a = admission(hs.iter().copied(), ip(1), 0);
        assert_eq!(a.shed_same_ip, Some(1));
        assert_eq!(a.room, Room::Free);
        let a = admission(hs.iter().copied(), ip(2), 0);
        assert_eq!(a.shed_same_ip, None, "another address is below its limit");
        // every slot taken: the per-address shed makes the room
        let serving = MAX_CONNECTIONS - hs.len();
        let a = admission(hs.iter().copied(), ip(1), serving);
        assert_eq!((a.shed_same_ip, a.room), (Some(1), Room::Free));
        // and when that is not enough, the oldest of all goes as well
        let a = admission(hs.iter().copied(), ip(1), serving + 1);
        assert_eq!((a.shed_same_ip, a.room), (Some(1), Room::ShedOldest));
    }

    /// With every slot taken the oldest handshake goes; only served consumers refuse.
    #[test]
    fn full_slots_shed_the_oldest_handshake_or_refuse() {
        let hs = [ip(1), ip(2)];
        let a = admission(hs.iter().copied(), ip(3), MAX_CONNECTIONS - 2);
        assert_eq!(a.room, Room::ShedOldest);
        let a = admission(std::iter::empty(), ip(3), MAX_CONNECTIONS);
        assert_eq!(a.room, Room::Refuse);
        let a = admission(std::iter::empty(), ip(3), MAX_CONNECTIONS - 1);
        assert_eq!(a.room, Room::Free);
    }

    #[test]
    fn the_deadline_counts_from_the_accept() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert!(!expired(t0, t0 + HANDSHAKE_DEADLINE - ms(1)));
        assert!(expired(t0, t0 + HANDSHAKE_DEADLINE));
        assert_eq!(poll_wait(std::iter::empty(), t0), MAX_WAIT);
        let now = t0 + HANDSHAKE_DEADLINE - ms(20);
        assert_eq!(poll_wait([t0, now].into_iter(), now), ms(20));
        assert_eq!(
            poll_wait([t0].into_iter(), t0 + 2 * HANDSHAKE_DEADLINE),
            ms(0)
        );
    }
}

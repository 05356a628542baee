//! One warning line per period for a message that may repeat thousands of times a second (a
//! handshake flood, a stream of bad fragments): the line carries how many it stands for.

use std::time::{Duration, Instant};

/// Counts occurrences and lets one through per period. See the module docs.
#[derive(Debug, Clone)]
pub struct LogLimit {
    every: Duration,
    last: Option<Instant>,
    count: u64,
}

impl LogLimit {
    /// At most one line per `every`.
    pub fn new(every: Duration) -> LogLimit {
        LogLimit {
            every,
            last: None,
            count: 0,
        }
    }

    /// Counts one occurrence. `Some(n)` when a line is due: it stands for these `n`
    /// (this one and those held back since the last line).
    pub fn tick(&mut self) -> Option<u64> {
        self.tick_at(Instant::now())
    }

    fn tick_at(&mut self, now: Instant) -> Option<u64> {
        self.count += 1;
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < self.every)
        {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}

impl Default for LogLimit {
    /// One line every 5 s.
    fn default() -> Self {
        LogLimit::new(Duration::from_secs(5))
    }
}

/// Most distinct reasons a [`Tally`] tells apart within a period; more are counted together.
const TALLY_REASONS: usize = 32;

/// Like [`LogLimit`], for refusals whose reasons differ, so that a flood of one kind hides no
/// other: the first refusal of each reason in a period is said at once; its repeats are
/// counted and said together once the period is over (reasons that differ only in their
/// numbers are one, shown by their latest wording). So every reason is said at least once,
/// even if the process ends before the period does.
#[derive(Debug, Clone)]
pub struct Tally {
    every: Duration,
    /// When the current period began (`None`: no refusal since the last summary).
    since: Option<Instant>,
    /// Reasons (digits folded) said in this period.
    said: std::collections::BTreeSet<String>,
    /// Repeats held back: reason with its digits folded → (count, latest wording).
    held: std::collections::BTreeMap<String, (u64, String)>,
    /// Refusals beyond [`TALLY_REASONS`] distinct reasons.
    others: u64,
}

impl Tally {
    /// A summary of repeats at most once per `every`.
    pub fn new(every: Duration) -> Tally {
        Tally {
            every,
            since: None,
            said: Default::default(),
            held: Default::default(),
            others: 0,
        }
    }

    /// Counts one refusal for `reason`. `Some(line)` when something is to be said: this
    /// reason, if it is new in the period, and the repeats held back if the period is over,
    /// as `n × reason; ...`.
    pub fn tick(&mut self, reason: &str) -> Option<String> {
        self.tick_at(reason, Instant::now())
    }

    /// The repeats held back, if the period is over (so that the last of a flood is said
    /// even if nothing follows it).
    pub fn due(&mut self) -> Option<String> {
        // no clock reading while nothing waits (it is asked on every pass of a run)
        self.since?;
        self.due_at(Instant::now())
    }

    fn due_at(&mut self, now: Instant) -> Option<String> {
        let since = self.since?;
        if now.saturating_duration_since(since) < self.every {
            return None;
        }
        self.since = None;
        self.said.clear();
        let others = std::mem::take(&mut self.others);
        let mut parts: Vec<String> = std::mem::take(&mut self.held)
            .into_values()
            .map(|(n, wording)| format!("{n} × {wording}"))
            .collect();
        if others > 0 {
            parts.push(format!("{others} × other reasons"));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    fn tick_at(&mut self, reason: &str, now: Instant) -> Option<String> {
        let held = self.due_at(now);
        self.since.get_or_insert(now);
        let key: String = reason
            .split(|c: char| c.is_ascii_digit())
            .filter(|p| !p.is_empty())
            .collect::<Vec<_>>()
            .join("N");
        let first = if self.said.contains(&key) {
            let room = self.held.len() < TALLY_REASONS;
            match self.held.get_mut(&key) {
                Some(e) => {
                    e.0 += 1;
                    e.1 = reason.to_string();
                }
                None if room => {
                    self.held.insert(key, (1, reason.to_string()));
                }
                None => self.others += 1,
            }
            None
        } else if self.said.len() < TALLY_REASONS {
            self.said.insert(key);
            Some(format!("1 × {reason}"))
        } else {
            self.others += 1;
            None
        };
        match (held, first) {
            (Some(h), Some(f)) => Some(format!("{h}; {f}")),
            (h, f) => h.or(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_says_every_reason_and_counts_the_repeats() {
        let mut t = Tally::new(Duration::from_secs(5));
        let t0 = Instant::now();
        assert_eq!(
            t.tick_at("shed after 300 ms", t0).as_deref(),
            Some("1 × shed after 300 ms")
        );
        for i in 1..100u64 {
            assert_eq!(t.tick_at(&format!("shed after {} ms", 300 + i), t0), None);
        }
        // a new reason in the flood is said at once
        assert_eq!(
            t.tick_at("bad frame magic", t0).as_deref(),
            Some("1 × bad frame magic")
        );
        assert_eq!(t.tick_at("bad frame magic", t0), None);
        assert_eq!(t.due_at(t0 + Duration::from_secs(1)), None);
        assert_eq!(
            t.due_at(t0 + Duration::from_secs(5)).as_deref(),
            Some("1 × bad frame magic; 99 × shed after 399 ms")
        );
        assert_eq!(t.due_at(t0 + Duration::from_secs(20)), None);
        // a new period: said at once again
        assert_eq!(
            t.tick_at("shed after 1 ms", t0 + Duration::from_secs(21))
                .as_deref(),
            Some("1 × shed after 1 ms")
        );
    }

    #[test]
    fn a_flood_becomes_one_line_per_period_with_its_count() {
        let mut l = LogLimit::new(Duration::from_secs(5));
        let t0 = Instant::now();
        assert_eq!(l.tick_at(t0), Some(1));
        for i in 1..1000u64 {
            assert_eq!(l.tick_at(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(l.tick_at(t0 + Duration::from_secs(5)), Some(1000));
        assert_eq!(l.tick_at(t0 + Duration::from_secs(6)), None);
        assert_eq!(l.tick_at(t0 + Duration::from_secs(11)), Some(2));
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

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

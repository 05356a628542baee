//! Sets of tag ranges: sorted, disjoint and non-adjacent, as a publisher keeps them per
//! subscriber.

use evb_wire::pubsub::TagRange;

/// Sorts and merges overlapping or adjacent ranges.
pub(super) fn normalize(ranges: &mut Vec<TagRange>) {
    ranges.sort_unstable();
    let mut out: Vec<TagRange> = Vec::with_capacity(ranges.len());
    for r in ranges.drain(..) {
        match out.last_mut() {
            Some(l) if r.first <= l.last.saturating_add(1) => l.last = l.last.max(r.last),
            _ => out.push(r),
        }
    }
    *ranges = out;
}

/// `set` minus `cut`, both normalized or not; the result is normalized.
pub(super) fn subtract(set: &mut Vec<TagRange>, cut: &[TagRange]) {
    for c in cut {
        let mut out = Vec::with_capacity(set.len() + 1);
        for r in set.drain(..) {
            if r.last < c.first || r.first > c.last {
                out.push(r);
                continue;
            }
            if r.first < c.first {
                out.push(TagRange {
                    first: r.first,
                    last: c.first - 1,
                });
            }
            if r.last > c.last {
                out.push(TagRange {
                    first: c.last + 1,
                    last: r.last,
                });
            }
        }
        *set = out;
    }
    normalize(set);
}

#[cfg(test)]
mod unit {
    use super::*;

    fn r(first: u64, last: u64) -> TagRange {
        TagRange { first, last }
    }

    #[test]
    fn range_sets() {
        let mut s = vec![r(5, 9), r(1, 2), r(3, 4), r(20, 20)];
        normalize(&mut s);
        assert_eq!(s, vec![r(1, 9), r(20, 20)]);
        subtract(&mut s, &[r(4, 6)]);
        assert_eq!(s, vec![r(1, 3), r(7, 9), r(20, 20)]);
        subtract(&mut s, &[r(0, u64::MAX)]);
        assert!(s.is_empty());
        let mut s = vec![r(0, u64::MAX)];
        subtract(&mut s, &[r(0, 0), r(u64::MAX, u64::MAX)]);
        assert_eq!(s, vec![r(1, u64::MAX - 1)]);
    }
}

//! A queue that takes its items a page at a time: a `Vec` the reader filled is moved in
//! whole, its items never touched, and read where a split between the items taken and the
//! rest has got to. The join keeps each RU's fragments in one (its lane): a page is what one
//! pass over that RU's connection brought, the split is how many events were built.
//!
//! Moving a page's items one by one into a ring cost the BU a copy of every fragment (64
//! bytes, through the stack) at 256 B fragments; a page in costs one `Vec` moved.

use std::collections::VecDeque;

pub(crate) struct Pages<T> {
    pages: VecDeque<VecDeque<T>>,
    len: usize,
    /// Items before the split.
    split: usize,
    /// Where the split is: (page, offset in it); `(pages.len(), 0)` when it is at the end.
    at: (usize, usize),
}

impl<T> Default for Pages<T> {
    fn default() -> Self {
        Pages {
            pages: VecDeque::new(),
            len: 0,
            split: 0,
            at: (0, 0),
        }
    }
}

impl<T> Pages<T> {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Appends one item (to the last page).
    pub fn push(&mut self, x: T) {
        let at_end = self.split == self.len;
        match self.pages.back_mut() {
            Some(p) => p.push_back(x),
            None => self.pages.push_back(VecDeque::from([x])),
        }
        self.len += 1;
        if at_end {
            let last = self.pages.len() - 1;
            self.at = (last, self.pages[last].len() - 1);
        }
    }

    /// Appends a page, moving it in whole.
    pub fn push_page(&mut self, page: Vec<T>) {
        if page.is_empty() {
            return;
        }
        // a split at the end was `(pages.len(), 0)`: now the new page's start
        self.len += page.len();
        self.pages.push_back(VecDeque::from(page));
    }

    /// The first item after the split.
    #[inline(always)]
    pub fn after_split(&self) -> Option<&T> {
        self.pages.get(self.at.0).and_then(|p| p.get(self.at.1))
    }

    /// Moves the split past one more item (there must be one).
    #[inline(always)]
    pub fn advance_split(&mut self) {
        debug_assert!(self.split < self.len, "no item after the split");
        self.split += 1;
        self.at.1 += 1;
        if self.at.1 == self.pages[self.at.0].len() {
            self.at = (self.at.0 + 1, 0);
        }
    }

    /// The `k`-th item from the back (0: the last).
    pub fn nth_back(&self, mut k: usize) -> Option<&T> {
        for p in self.pages.iter().rev() {
            if k < p.len() {
                return p.get(p.len() - 1 - k);
            }
            k -= p.len();
        }
        None
    }

    /// Drops the first `n` items, all before the split (their pages' memory goes as they
    /// empty).
    pub fn drop_front(&mut self, mut n: usize) {
        assert!(n <= self.split, "only items before the split are dropped");
        (self.split, self.len) = (self.split - n, self.len - n);
        while n > 0 {
            let front = self.pages.front_mut().expect("n items are held");
            if front.len() <= n {
                n -= front.len();
                self.pages.pop_front();
                self.at.0 -= 1;
            } else {
                front.drain(..n);
                if self.at.0 == 0 {
                    self.at.1 -= n;
                }
                n = 0;
            }
        }
    }

    /// Takes the first item (before the split or not).
    pub fn pop_front(&mut self) -> Option<T> {
        let front = self.pages.front_mut()?;
        let x = front.pop_front().expect("no page is empty");
        let emptied = front.is_empty();
        self.len -= 1;
        if self.split > 0 {
            self.split -= 1;
            if emptied {
                self.at.0 -= 1;
            } else if self.at.0 == 0 {
                self.at.1 -= 1;
            }
        }
        if emptied {
            self.pages.pop_front();
        }
        Some(x)
    }

    /// Every item, oldest first.
    pub fn into_items(self) -> impl Iterator<Item = T> {
        self.pages.into_iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages and single items in any mix, the split moved and items dropped and popped at
    /// seeded moments: the queue holds what a plain ring of the same items holds, and its
    /// split reads the item a ring would read at that index.
    #[test]
    fn pages_behave_as_one_ring_of_their_items() {
        let mut seed = 0x2026_1126_u64;
        let mut rand = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for trial in 0..300 {
            let mut q = Pages::default();
            let mut ring = VecDeque::new();
            let mut split = 0usize;
            let mut next = 0u32;
            for step in 0..200 {
                let what = format!("trial {trial} step {step}");
                match rand(7) {
                    0 => {
                        q.push(next);
                        ring.push_back(next);
                        next += 1;
                    }
                    1 | 2 => {
                        let n = rand(6) as u32;
                        q.push_page((next..next + n).collect());
                        ring.extend(next..next + n);
                        next += n;
                    }
                    3 | 4 if split < ring.len() => {
                        q.advance_split();
                        split += 1;
                    }
                    5 if split > 0 => {
                        let n = 1 + rand(split as u64) as usize;
                        q.drop_front(n);
                        ring.drain(..n);
                        split -= n;
                    }
                    6 => {
                        assert_eq!(q.pop_front(), ring.pop_front(), "{what}: popped");
                        split = split.saturating_sub(1);
                    }
                    _ => {}
                }
                assert_eq!(q.len(), ring.len(), "{what}: length");
                assert_eq!(q.after_split(), ring.get(split), "{what}: after the split");
                let k = rand(4) as usize;
                let back = ring.len().checked_sub(k + 1).and_then(|i| ring.get(i));
                assert_eq!(q.nth_back(k), back, "{what}: {k} from the back");
            }
            assert!(q.into_items().eq(ring), "trial {trial}: the items");
        }
    }
}

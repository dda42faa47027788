//! The simulator's draws, on the crate's seeded generator (`crate::rng`), so a run replays
//! exactly from its seed.

pub(crate) use crate::rng::Rng;

impl Rng {
    /// A number in `0..n` (`n` > 0); the modulo bias is irrelevant at these sizes.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True with probability `percent` in 100.
    pub(crate) fn percent(&mut self, percent: u32) -> bool {
        self.below(100) < percent as usize
    }

    /// One element of `items`, if any.
    pub(crate) fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        (!items.is_empty()).then(|| items[self.below(items.len())])
    }

    /// An index chosen with the given weights (all zero: `None`).
    pub(crate) fn weighted(&mut self, weights: &[u32]) -> Option<usize> {
        let total: u32 = weights.iter().sum();
        if total == 0 {
            return None;
        }
        let mut r = self.below(total as usize) as u32;
        for (i, w) in weights.iter().enumerate() {
            if r < *w {
                return Some(i);
            }
            r -= w;
        }
        None
    }
}

//! The simulator's draws, on the crate's seeded generator (`crate::rng`), so a run replays
//! exactly from its seed. Each draw is recorded, so a failing run can be shrunk: a step replayed
//! alone gets back the draws it made in the whole run (see `shrink.rs`).

use std::collections::VecDeque;

/// The crate's generator, with the record of its draws and the draws to give back first.
#[derive(Debug)]
pub(crate) struct Rng {
    generator: crate::rng::Rng,
    /// Every draw since the last `take_recorded`.
    recorded: Vec<u64>,
    /// Draws of a recorded step, given back before the generator's own.
    replayed: VecDeque<u64>,
}

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng {
            generator: crate::rng::Rng::new(seed),
            recorded: Vec::new(),
            replayed: VecDeque::new(),
        }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let draw = self
            .replayed
            .pop_front()
            .unwrap_or_else(|| self.generator.next_u64());
        self.recorded.push(draw);
        draw
    }

    /// The draws made since the last call.
    pub(crate) fn take_recorded(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.recorded)
    }

    /// The next draws are `draws` (what a step drew in the recorded run), then the generator's;
    /// what the previous step left of its own is dropped.
    pub(crate) fn replay(&mut self, draws: &[u64]) {
        self.replayed = draws.iter().copied().collect();
    }

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

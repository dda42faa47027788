//! The unit reads waiting for a free slot (at most `max_reads_in_flight` are out at once).
//!
//! A client waits on some reads: a `watch` is answered after its first read (and the reads
//! after it that following an alias takes). Queued behind every other unit's re-read, with few
//! slots and units restarted again and again, such a client could wait without bound (found
//! by the simulator, 86376599874571: a `watch` unanswered for 61 steps with one read in
//! flight). Always going first, they could starve the other watches' reads as long as new
//! watches keep coming (found by the simulator, 86376599891229: a proof waited on a read
//! behind a stream of new watches). So the two take turns: after a read a client waits on, one
//! of the others goes, if any waits.

use std::collections::VecDeque;

use super::UnitKey;
use crate::memory::shrink_when_drained;

/// Reads waiting for a slot, in two queues that take turns.
#[derive(Debug, Default)]
pub(super) struct ReadQueue {
    /// Reads a client waits on, in the order they were asked.
    awaited: VecDeque<UnitKey>,
    /// The other reads, in the order they were asked.
    others: VecDeque<UnitKey>,
    /// Whether the last read taken was one a client waits on.
    awaited_last: bool,
}

impl ReadQueue {
    /// Queues the read of `key`; `awaited` if a client waits on it.
    pub(super) fn push(&mut self, key: UnitKey, awaited: bool) {
        match awaited {
            true => self.awaited.push_back(key),
            false => self.others.push_back(key),
        }
    }

    /// The next read to send: one a client waits on, unless the last one was and another read
    /// waits too.
    pub(super) fn pop(&mut self) -> Option<UnitKey> {
        let others_turn = self.awaited_last && !self.others.is_empty();
        let key = match others_turn {
            true => None,
            false => self.awaited.pop_front(),
        };
        self.awaited_last = key.is_some();
        let key = key.or_else(|| self.others.pop_front());
        if key.is_none() {
            shrink_when_drained(&mut self.awaited);
            shrink_when_drained(&mut self.others);
        }
        key
    }

    /// Drops the read of `key`, if queued (its watch is gone).
    pub(super) fn remove(&mut self, key: UnitKey) {
        self.awaited.retain(|k| *k != key);
        self.others.retain(|k| *k != key);
    }

    /// Drops every queued read (the connection was lost).
    pub(super) fn clear(&mut self) {
        self.awaited.clear();
        self.others.clear();
        self.awaited_last = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads a client waits on go first, but never twice in a row while another read waits;
    /// each queue keeps its order.
    #[test]
    fn awaited_reads_take_turns_with_the_others() {
        let mut queue = ReadQueue::default();
        for (key, awaited) in [(1, false), (2, false), (3, true), (4, true), (5, true)] {
            queue.push(UnitKey(key), awaited);
        }
        let order: Vec<u64> = std::iter::from_fn(|| queue.pop()).map(|k| k.0).collect();
        assert_eq!(order, [3, 1, 4, 2, 5]);
        queue.push(UnitKey(6), false);
        queue.push(UnitKey(7), true);
        queue.remove(UnitKey(6));
        assert_eq!(queue.pop(), Some(UnitKey(7)));
        assert_eq!(queue.pop(), None);
    }
}

//! Callers waiting for a unit's proof, each until its own deadline.
//!
//! Pure bookkeeping with `now` passed in: the loop asks for the next deadline and hands back
//! the time; nothing here reads the clock.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::time::Instant;

/// Identifies one waiting caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct WaiterId(u64);

/// The waiters of every unit, keyed by what they wait on (`K`) and who they answer (`R`).
#[derive(Debug)]
pub(super) struct Waiters<K, R> {
    next: u64,
    by_id: HashMap<WaiterId, (K, R, Option<Instant>)>,
    /// The waiters of each key, so a proof finds its waiters without a scan of all of them.
    by_key: HashMap<K, Vec<WaiterId>>,
    deadlines: BTreeSet<(Instant, WaiterId)>,
}

impl<K: Copy + Eq + Hash, R> Default for Waiters<K, R> {
    fn default() -> Self {
        Waiters {
            next: 0,
            by_id: HashMap::new(),
            by_key: HashMap::new(),
            deadlines: BTreeSet::new(),
        }
    }
}

impl<K: Copy + Eq + Hash, R> Waiters<K, R> {
    /// Adds a waiter on `key` that answers `reply`, until `deadline` (none: until the proof).
    pub(super) fn add(&mut self, key: K, reply: R, deadline: Option<Instant>) -> WaiterId {
        let id = WaiterId(self.next);
        self.next += 1;
        if let Some(at) = deadline {
            self.deadlines.insert((at, id));
        }
        self.by_id.insert(id, (key, reply, deadline));
        self.by_key.entry(key).or_default().push(id);
        id
    }

    /// Takes every waiter on `key` (its proof arrived, or it was unwatched), oldest first.
    pub(super) fn take_key(&mut self, key: K) -> Vec<R> {
        let ids = self.by_key.remove(&key).unwrap_or_default();
        self.take_ids(ids)
    }

    /// Takes every waiter whose reply matches `pred` (its client went away). A scan of all
    /// waiters: clients leave far less often than proofs arrive.
    pub(super) fn take_where(&mut self, mut pred: impl FnMut(&R) -> bool) -> Vec<R> {
        let ids: Vec<WaiterId> = self
            .by_id
            .iter()
            .filter(|(_, (_, r, _))| pred(r))
            .map(|(id, _)| *id)
            .collect();
        self.take_ids(ids)
    }

    fn take_ids(&mut self, ids: Vec<WaiterId>) -> Vec<R> {
        ids.into_iter()
            .filter_map(|id| self.remove(id))
            .map(|(_, r)| r)
            .collect()
    }

    /// Takes every waiter whose deadline is at or before `now`, with the key it waited on.
    pub(super) fn take_expired(&mut self, now: Instant) -> Vec<(K, R)> {
        let mut expired = Vec::new();
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now {
                break;
            }
            expired.extend(self.remove(id));
        }
        expired
    }

    /// The earliest deadline of any waiter.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(at, _)| *at)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_id.len()
    }

    fn remove(&mut self, id: WaiterId) -> Option<(K, R)> {
        let (key, reply, deadline) = self.by_id.remove(&id)?;
        if let Some(at) = deadline {
            self.deadlines.remove(&(at, id));
        }
        if let Some(ids) = self.by_key.get_mut(&key) {
            ids.retain(|other| *other != id);
            if ids.is_empty() {
                self.by_key.remove(&key);
            }
        }
        Some((key, reply))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn waiters_leave_by_proof_by_deadline_or_by_client() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut w: Waiters<u32, &str> = Waiters::default();
        w.add(1, "a", Some(t0 + 3 * s));
        w.add(1, "b", None);
        w.add(2, "c", Some(t0 + s));
        w.add(2, "d", Some(t0 + 2 * s));
        assert_eq!(w.next_deadline(), Some(t0 + s));
        assert_eq!(w.take_expired(t0), vec![]);
        assert_eq!(w.take_expired(t0 + s), vec![(2, "c")]);
        assert_eq!(w.next_deadline(), Some(t0 + 2 * s));
        let mut proven = w.take_key(1);
        proven.sort();
        assert_eq!(proven, vec!["a", "b"]);
        assert_eq!(w.next_deadline(), Some(t0 + 2 * s));
        assert_eq!(w.take_where(|r| *r == "d"), vec!["d"]);
        assert_eq!(w.len(), 0);
        assert!(w.by_key.is_empty(), "no index entry outlives its waiters");
        assert_eq!(w.next_deadline(), None);
    }

    #[test]
    fn deadlines_fire_in_order_and_only_once() {
        let t0 = Instant::now();
        let mut w: Waiters<u32, u32> = Waiters::default();
        for i in (0..10).rev() {
            w.add(0, i, Some(t0 + Duration::from_millis(u64::from(i))));
        }
        let fired: Vec<u32> = w
            .take_expired(t0 + Duration::from_secs(1))
            .into_iter()
            .map(|(_, r)| r)
            .collect();
        assert_eq!(fired, (0..10).collect::<Vec<_>>());
        assert!(w.take_expired(t0 + Duration::from_secs(2)).is_empty());
        assert_eq!(w.len(), 0);
    }
}

//! Watches found by a name of theirs: the client's name for the unit, or systemd's.
//!
//! A slot holds only the watch's key; the name is read from the watch itself, through
//! [`Watches`]. A table keyed by the name would hold a 16-byte `Rc<str>` besides the key in
//! each of its slots, up to twice as many as watches: 256 KiB an index at 10,000 watches.
//! The price is that the index is handed the watches at every call, and a watch's name must
//! not change while its key is in the index ([`NameIndex::remove`] it first).

use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;

use super::UnitKey;
use super::watch::{Watch, Watches};

/// Below this many slots the index is not worth shrinking: a busy turn fills that.
const SHRINK_MIN_CAPACITY: usize = 64;

/// The keys of watches by one of their names ([`NameIndex::new`] says which). A name may have
/// several keys: two watches of the same unit under different client names share systemd's.
pub(super) struct NameIndex {
    table: HashTable<UnitKey>,
    /// Seeded at random, like std's maps: a client picks the names it watches.
    hasher: RandomState,
    name_of: fn(&Watch) -> &str,
}

impl NameIndex {
    /// An empty index of watches by `name_of`.
    pub(super) fn new(name_of: fn(&Watch) -> &str) -> NameIndex {
        NameIndex {
            table: HashTable::new(),
            hasher: RandomState::new(),
            name_of,
        }
    }

    /// Files `key` under `name`, once; every key already in the index must be of a watch in
    /// `units` (the index reads their names when it grows).
    pub(super) fn insert(&mut self, name: &str, key: UnitKey, units: &Watches) {
        let hash = self.hasher.hash_one(name);
        if self.table.find(hash, |&k| k == key).is_none() {
            let (hasher, name_of) = (&self.hasher, self.name_of);
            self.table
                .insert_unique(hash, key, |k| rehash(hasher, name_of, units, k));
        }
    }

    /// Files `key` under `name` in place of any other key of that name: the index then holds
    /// one key a name.
    pub(super) fn replace(&mut self, name: &str, key: UnitKey, units: &Watches) {
        if let Some(other) = self.key(name, units).filter(|&other| other != key) {
            self.remove(name, other, units);
        }
        self.insert(name, key, units);
    }

    /// Takes `key` out from under `name` if it is filed there; its watch must still be in
    /// `units` with that name. A key is filed once, under its watch's present name, so a call
    /// under any other name removes nothing: without that check the table's search by hash
    /// and key could find the key's own slot under its real name, or not, by the hasher's
    /// seed.
    pub(super) fn remove(&mut self, name: &str, key: UnitKey, units: &Watches) {
        if units.get(&key).is_none_or(|w| (self.name_of)(w) != name) {
            return;
        }
        let hash = self.hasher.hash_one(name);
        if let Ok(entry) = self.table.find_entry(hash, |&k| k == key) {
            entry.remove();
            let (capacity, len) = (self.table.capacity(), self.table.len());
            if capacity > SHRINK_MIN_CAPACITY && len < capacity / 4 {
                let (hasher, name_of) = (&self.hasher, self.name_of);
                self.table
                    .shrink_to(len * 2, |k| rehash(hasher, name_of, units, k));
            }
        }
    }

    /// The first key filed under `name` (the only one, in an index kept by
    /// [`NameIndex::replace`]).
    pub(super) fn key(&self, name: &str, units: &Watches) -> Option<UnitKey> {
        self.keys(name, units).next()
    }

    /// The keys filed under `name`, oldest watch first, owned so the caller may change the
    /// core while it goes through them; with one key (almost always: this runs for every
    /// signal) nothing is allocated.
    pub(super) fn keys(
        &self,
        name: &str,
        units: &Watches,
    ) -> impl Iterator<Item = UnitKey> + use<> {
        let named = self
            .table
            .iter_hash(self.hasher.hash_one(name))
            .copied()
            .filter(|key| units.get(key).is_some_and(|w| (self.name_of)(w) == name));
        let mut first = None;
        let mut others = Vec::new();
        for key in named {
            match first {
                None => first = Some(key),
                Some(_) => others.push(key),
            }
        }
        if !others.is_empty() {
            others.extend(first.take());
            others.sort_unstable();
        }
        first.into_iter().chain(others)
    }
}

/// The hash of the name `name_of` reads from `key`'s watch, for the index to move it when the
/// table grows or shrinks. Every key in the index has its watch in `units`; were one missing,
/// its key would only be moved where a lookup cannot find it, never a panic.
fn rehash(
    hasher: &RandomState,
    name_of: fn(&Watch) -> &str,
    units: &Watches,
    key: &UnitKey,
) -> u64 {
    units
        .get(key)
        .map_or(0, |watch| hasher.hash_one(name_of(watch)))
}

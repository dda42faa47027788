//! Signals about units no watch is filed under, kept while a watch waits for the read that
//! names its unit.
//!
//! systemd signals a unit only under its own name's object path, never an alias's. A watch
//! made with an alias is filed under the alias until a read tells it the unit's name, so what
//! systemd signalled of the unit meanwhile (a ControlPID said only in a signal, say) never
//! reached it. Those signals are kept, with the starts of the roots they named, and the watch
//! takes them when it follows the alias (found by the simulator, 94778623380596: a watch made
//! with an alias before a lost connection missed the ControlPID of a later invocation, and a
//! process in that root's session waited as ours for good).

use std::collections::{BTreeSet, VecDeque};

use super::{ProcessStart, UnitKey};
use crate::systemd::signal::UnitChange;

/// How many signals are kept: the oldest go first, and one forgotten only leaves the watch
/// knowing less, so that it waits.
const MAX_KEPT: usize = 64;

/// Signals of units no watch was filed under, on the current connection, while a watch waited
/// for its unit's name.
#[derive(Debug, Default)]
pub(super) struct Unheard {
    /// The watches whose first read has not come back: one may be filed under an alias.
    naming: BTreeSet<UnitKey>,
    /// Each kept signal: its serial, its unit (systemd's name) and what it said.
    changes: VecDeque<(u32, Box<str>, UnitChange)>,
    /// The starts of the roots the kept signals named, by unit.
    starts: Vec<(Box<str>, ProcessStart)>,
}

impl Unheard {
    /// `key` is a new watch, filed under the client's name until its first read comes back.
    pub(super) fn naming(&mut self, key: UnitKey) {
        self.naming.insert(key);
    }

    /// `key`'s first read came back, or it is gone: once no watch waits, nothing is kept.
    pub(super) fn named(&mut self, key: UnitKey) {
        if self.naming.remove(&key) && self.naming.is_empty() {
            self.clear();
        }
    }

    /// Whether signals no watch hears are kept now.
    pub(super) fn keeping(&self) -> bool {
        !self.naming.is_empty()
    }

    /// Keeps the signal `serial` about `unit`, which no watch is filed under.
    pub(super) fn keep(&mut self, serial: u32, unit: &str, change: &UnitChange) {
        if self.changes.len() == MAX_KEPT {
            self.changes.pop_front();
        }
        self.changes
            .push_back((serial, unit.into(), change.clone()));
    }

    /// Keeps the start of a root a kept signal about `unit` named.
    pub(super) fn note_start(&mut self, unit: &str, start: ProcessStart) {
        if !self.changes.iter().any(|(_, of, _)| **of == *unit) {
            return;
        }
        if self.starts.len() == MAX_KEPT {
            self.starts.remove(0);
        }
        self.starts.push((unit.into(), start));
    }

    /// The signals kept about `unit`, oldest first, and the starts of the roots they named.
    pub(super) fn of(&self, unit: &str) -> (Vec<(u32, UnitChange)>, Vec<ProcessStart>) {
        let changes = self
            .changes
            .iter()
            .filter(|(_, of, _)| **of == *unit)
            .map(|(serial, _, change)| (*serial, change.clone()))
            .collect();
        let starts = self
            .starts
            .iter()
            .filter(|(of, _)| **of == *unit)
            .map(|(_, start)| *start)
            .collect();
        (changes, starts)
    }

    /// Forgets what was kept: the connection was lost (serials start afresh on the next one),
    /// or no watch waits for its unit's name.
    pub(super) fn clear(&mut self) {
        self.changes = VecDeque::new();
        self.starts = Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control(pid: u32) -> UnitChange {
        UnitChange {
            control_pid: Some(pid),
            ..UnitChange::default()
        }
    }

    /// Signals are kept only while a watch waits for its unit's name, at most [`MAX_KEPT`],
    /// and handed out by unit with the starts of the roots they named.
    #[test]
    fn signals_are_kept_while_a_watch_waits_for_its_units_name() {
        let mut unheard = Unheard::default();
        assert!(!unheard.keeping());
        unheard.naming(UnitKey(1));
        assert!(unheard.keeping());
        for serial in 0..70 {
            unheard.keep(serial, "s.service", &control(serial + 100));
        }
        unheard.keep(70, "t.service", &control(7));
        let start = ProcessStart {
            pid: 169,
            start_ticks: 5,
            held_as: None,
        };
        unheard.note_start("s.service", start);
        unheard.note_start("u.service", ProcessStart { pid: 8, ..start });
        let (changes, starts) = unheard.of("s.service");
        assert_eq!(changes.len(), MAX_KEPT - 1, "the oldest went first");
        assert_eq!(changes[0], (7, control(107)));
        assert_eq!(starts, [start]);
        assert_eq!(
            unheard.of("u.service"),
            (vec![], vec![]),
            "no signal of it kept"
        );
        unheard.named(UnitKey(1));
        assert!(!unheard.keeping());
        assert_eq!(unheard.of("t.service"), (vec![], vec![]), "forgotten");
    }
}

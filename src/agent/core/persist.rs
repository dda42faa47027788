//! Keeping the watch set across restarts: what of it is saved (all of it in a snapshot, or
//! what changed since the last save: the units and generations marked in [`Unsaved`]), and
//! taking it up again at start.
//!
//! A save names each changed unit with its whole new record, so a change need not say what
//! changed in a watch, only that it did; [`Core::mark_changed`] and [`Unsaved::unit`] are
//! called wherever a field [`saved_watch_of`] reads may change. The tests check every change set
//! against a snapshot, so a mark missing is a failing test, not a silent loss.
//!
//! A watch whose invocation is not known yet (its first read has not come back, so nobody has
//! been told of it) is not saved: saving it with an empty invocation would make every
//! invocation look foreign after a restart. A watch saved in another boot is proven at once:
//! every process of it died with the machine, and nothing is sent to systemd for it (the
//! unit's invocation in this boot is not ours to stop).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

use super::watch::{UnsentStop, Watch};
use super::{AgentState, ChangeSet, Core, StopKind, UnitKey};
use crate::agent::saved::{ProofJson, SavedProcess, SavedWatch};
use crate::cgroup::procs::{OffsetFloors, ProcessStart};
use crate::control::protocol::WatchSpec;
use crate::control::wire;
use crate::proof::release::{Release, ReleaseInput};
use crate::proof::{Input as ProofInput, Resumed, StopReason, UnitProof};
use crate::unit_name;

/// What changed since the last save.
#[derive(Debug, Default)]
pub(super) struct Unsaved {
    /// A save is owed: something changed, or an answer waits for a save.
    pub owed: bool,
    /// Units whose record may have changed (or gone), by the name the client used.
    units: BTreeSet<String>,
    /// Generations taken (`true`) or given back (`false`).
    generations: BTreeMap<(String, u64), bool>,
    /// The offset floors rose.
    offset_floors: bool,
}

impl Unsaved {
    /// The record of `unit` may have changed.
    pub(super) fn unit(&mut self, unit: &str) {
        self.owed = true;
        if !self.units.contains(unit) {
            self.units.insert(unit.to_owned());
        }
    }

    /// A generation of `unit` was taken or given back.
    pub(super) fn generation(&mut self, unit: &str, generation: u64, taken: bool) {
        self.owed = true;
        self.generations
            .insert((unit.to_owned(), generation), taken);
    }

    /// The offset floors rose.
    pub(super) fn offset_floors(&mut self) {
        self.owed = true;
        self.offset_floors = true;
    }
}

impl Core {
    /// The record of the watch `key` may have changed.
    pub(super) fn mark_changed(&mut self, key: UnitKey) {
        if let Some(watch) = self.units.get(&key) {
            self.unsaved.unit(&watch.unit);
        }
    }

    /// What changed since the last save, taken: each marked unit's record as it is now, or
    /// its removal. A client's name has one watch at most, so `by_name` finds it.
    pub(super) fn changes(&mut self) -> ChangeSet {
        let unsaved = std::mem::take(&mut self.unsaved);
        let mut changes = ChangeSet::default();
        for unit in unsaved.units {
            let record = self
                .by_name
                .key(unit.as_str(), &self.units)
                .and_then(|key| self.units.get(&key))
                .and_then(saved_watch_of);
            match record {
                Some(record) => changes.watches.push(record),
                None => changes.removed.push(unit),
            }
        }
        for (generation, taken) in unsaved.generations {
            if taken {
                changes.generations.push(generation);
            } else {
                changes.generations_freed.push(generation);
            }
        }
        if unsaved.offset_floors {
            changes.offset_floors = self.offset_floors.pairs().to_vec();
        }
        #[cfg(test)]
        self.check_changes(&changes);
        changes
    }

    /// Checks that the saves so far add up to the watch set as it is: a change the marks
    /// missed would be lost to a restart.
    #[cfg(test)]
    fn check_changes(&mut self, changes: &ChangeSet) {
        let Some(mut mirror) = self.saved_mirror.take() else {
            return;
        };
        mirror.apply([changes]);
        let expected = self.snapshot();
        assert_eq!(
            mirror, expected,
            "the change set {changes:?} does not bring the saved state up to date"
        );
        self.saved_mirror = Some(mirror);
    }

    /// Takes up the watches of a previous run: unproven ones are watched again with their
    /// invocation and stop-requested kept (proofs that became true meanwhile are made as soon
    /// as each unit has been read); proven ones are listed again with their event.
    pub(super) fn restore(&mut self, state: AgentState, now: Instant) {
        self.generations = state.generations.into_iter().collect();
        let rebooted = match (&state.boot_id, &self.config.boot_id) {
            (Some(saved), Some(current)) => saved != current,
            _ => false,
        };
        // The clocks start afresh with a boot; a file with no boot named may be of another.
        let same_boot = state.boot_id.is_some() && state.boot_id == self.config.boot_id;
        if same_boot {
            self.offset_floors = OffsetFloors::from_pairs(&state.offset_floors);
        }
        let (proven, watching): (Vec<SavedWatch>, Vec<SavedWatch>) =
            one_record_per_unit(state.watches)
                .into_iter()
                .partition(|r| r.proof.is_some());
        let counts = (watching.len(), proven.len());
        // A launch file named by two watches is left where it is by a release resumed here:
        // it may be the other generation's by now.
        let mut launch_files: BTreeMap<&PathBuf, usize> = BTreeMap::new();
        for path in proven
            .iter()
            .chain(&watching)
            .filter_map(|r| r.launch_file.as_ref())
        {
            *launch_files.entry(path).or_default() += 1;
        }
        let shared_launch_files: BTreeSet<PathBuf> = launch_files
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(path, _)| path.clone())
            .collect();
        let mut to_prove = Vec::new();
        let mut to_release = Vec::new();
        for record in proven.into_iter().chain(watching) {
            let Ok(unit) = unit_name::validate(&record.unit) else {
                self.log(
                    log::Level::Error,
                    format!("state: skipping invalid unit name {:?}", record.unit),
                );
                continue;
            };
            let spec = WatchSpec {
                run_dir: record.run_dir,
                record: record.record,
                generation: record.generation,
                launch_file: record.launch_file,
            };
            let has_launch_file = spec
                .launch_file
                .as_ref()
                .is_some_and(|path| !shared_launch_files.contains(path));
            let mut watch = Watch::new(&unit, Some(record.invocation.clone()), spec);
            watch.restored = true;
            if let Some(id) = record.unit_id.as_deref().filter(|id| *id != &*watch.id) {
                watch.id = Rc::from(id);
            }
            if let Some(cgroup) = &record.control_group {
                watch.control_group = self.control_groups.make(cgroup, &watch.id);
            }
            if watch.release.is_some() {
                watch.release = Some(Box::new(Release::resume(
                    has_launch_file,
                    record.stop_succeeded,
                )));
            }
            if let Some(proof) = record.proof {
                match proof.event() {
                    Ok(event) => {
                        let key = self.new_key();
                        let (name, id) = (Rc::clone(&watch.unit), Rc::clone(&watch.id));
                        let event_rebooted = event.cause == wire::Cause::Rebooted;
                        watch.event = Some(Box::new(event));
                        self.units.insert(key, watch);
                        self.by_name.replace(&name, key, &self.units);
                        if record.release_unfinished {
                            // Killed between the proof's save and the end of its release,
                            // whose final stop hears the unit's signals until it is decided.
                            self.by_id.insert(&id, key, &self.units);
                            to_release.push((key, rebooted || event_rebooted));
                        }
                        self.proven_order.push_back((now, key));
                    }
                    Err(e) => self.log(
                        log::Level::Error,
                        format!("state: skipping the proof of {unit}: {e}"),
                    ),
                }
                continue;
            }
            watch.resumed = Resumed {
                stop_requested: record.stop_requested,
            };
            // A start is of its boot: in another, every process of the watch is gone.
            if same_boot {
                watch.restore_leftovers(record.held.into_iter().map(ProcessStart::from));
            }
            if record.stop_unsent && !rebooted {
                watch.unsent_stop = Some(Box::new(UnsentStop {
                    kind: StopKind::Proof(StopReason::Requested),
                    target: record.invocation.clone(),
                    first_read: None,
                }));
            }
            let key = self.new_key();
            let (name, id) = (Rc::clone(&watch.unit), Rc::clone(&watch.id));
            self.units.insert(key, watch);
            self.by_name.replace(&name, key, &self.units);
            self.by_id.insert(&id, key, &self.units);
            if rebooted {
                to_prove.push(key);
            }
        }
        // Proven once every watch is back: a proof's save (before its release) must hold all.
        for key in to_prove {
            self.prove_rebooted(key, now);
        }
        // Released at least once: the launch file again (gone already, or this generation's
        // alone), the final stop only after a read shows the unit runs nothing (`stop`), and
        // none in another boot.
        for (key, after_reboot) in to_release {
            let input = if after_reboot {
                ReleaseInput::ProvenAfterReboot
            } else {
                ReleaseInput::Proven
            };
            self.release(key, input);
        }
        if counts != (0, 0) {
            self.log(
                log::Level::Info,
                format!(
                    "re-adopted {} watches and {} proven units from the state file{}",
                    counts.0,
                    counts.1,
                    if rebooted {
                        " (saved in another boot: the watches are proven)"
                    } else {
                        ""
                    }
                ),
            );
        }
    }

    fn prove_rebooted(&mut self, key: crate::agent::core::UnitKey, now: Instant) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        let invocation = watch
            .asked_invocation
            .as_deref()
            .cloned()
            .unwrap_or_default();
        watch.proof = Some(UnitProof::resume(invocation, watch.resumed));
        self.feed(key, ProofInput::Rebooted, now);
    }

    /// What must survive a restart.
    ///
    /// A snapshot is the agent's largest transient, so its records are sized up front (at
    /// 10,000 watches heaptrack saw a collected `Vec`, grown by doubling, peak at 3.0 MB for
    /// 1.9 MB of records) and sorted in place (a stable sort took a 1.7 MB scratch buffer; a
    /// name has one watch, so the order is the same).
    pub(super) fn snapshot(&self) -> AgentState {
        let mut watches = Vec::with_capacity(self.units.len());
        watches.extend(self.units.values().filter_map(saved_watch_of));
        watches.sort_unstable_by(|a, b| a.unit.cmp(&b.unit));
        let mut generations: Vec<(String, u64)> = self.generations.iter().cloned().collect();
        // Each once (a set), as the watches.
        generations.sort_unstable();
        AgentState {
            watches,
            generations,
            boot_id: self.config.boot_id.clone(),
            offset_floors: self.offset_floors.pairs().to_vec(),
            ..AgentState::default()
        }
    }
}

/// One record per unit, as the agent keeps one watch per name: where a unit was watched again
/// after its proof (files of older agents kept both), the new watch replaces the proof, as it
/// does in a running agent.
fn one_record_per_unit(records: Vec<SavedWatch>) -> Vec<SavedWatch> {
    let mut by_unit: BTreeMap<String, SavedWatch> = BTreeMap::new();
    for record in records {
        let replaces = by_unit
            .get(&record.unit)
            .is_none_or(|kept| kept.proof.is_some());
        if replaces {
            by_unit.insert(record.unit.clone(), record);
        }
    }
    by_unit.into_values().collect()
}

/// What of a watch must survive a restart; `None` while its invocation is not known.
fn saved_watch_of(watch: &Watch) -> Option<SavedWatch> {
    let invocation = watch.our_invocation()?.to_owned();
    Some(SavedWatch {
        unit: watch.unit.to_string(),
        invocation,
        stop_requested: watch.stop_requested(),
        generation: watch.spec.generation,
        run_dir: watch.spec.run_dir.clone(),
        record: watch.spec.record.clone(),
        launch_file: watch.spec.launch_file.clone(),
        stop_succeeded: watch
            .release
            .as_deref()
            .is_some_and(Release::stop_succeeded),
        proof: watch
            .event
            .as_ref()
            .and_then(|event| ProofJson::of(event).ok()),
        control_group: (!watch.control_group.is_empty()).then(|| watch.control_group.to_string()),
        stop_unsent: watch
            .unsent_stop
            .as_ref()
            .is_some_and(|s| s.kind == StopKind::Proof(StopReason::Requested))
            || (watch.pending_stop && watch.proof.is_none()),
        unit_id: (*watch.id != *watch.unit).then(|| watch.id.to_string()),
        held: (watch.leftovers.as_deref().into_iter())
            .flat_map(|leftovers| leftovers.values())
            .map(SavedProcess::from)
            .collect(),
        release_unfinished: watch.event.is_some()
            && (watch.release.as_deref().is_some_and(Release::unfinished)
                || watch
                    .unsent_stop
                    .as_ref()
                    .is_some_and(|s| s.kind == StopKind::FinalGeneration)),
    })
}

//! Keeping the watch set across restarts: what goes into the state file, and taking it up
//! again at start.
//!
//! The set is saved at the end of every loop turn that changed it (one atomic write, however
//! many changes the turn made), but at most once per [`SAVE_INTERVAL`]: a save writes the whole
//! set (about 20 ms at 10,000 watches, most of it fsync), so a burst of changes is saved as it
//! goes rather than once per turn. An isolated change is saved at once. A watch whose invocation is not known yet (its first read has
//! not come back, so nobody has been told of it) is not saved: saving it with an empty
//! invocation would make every invocation look foreign after a restart.

use std::time::{Duration, Instant};

/// The least time between two saves of the state file.
pub(super) const SAVE_INTERVAL: Duration = Duration::from_millis(100);

use super::event::ProofEvent;
use super::state::{AgentState, WatchRecord};
use super::{Agent, UnitKey, Watch, WatchSpec};
use crate::proof::UnitProof;
use crate::proof::release::Release;
use crate::unit_name;

impl Agent {
    /// Takes up the watches of a previous run: unproven ones are watched again with their
    /// invocation and stop-requested kept (proofs that became true meanwhile are made as soon
    /// as each unit has been read); proven ones are listed again with their event.
    pub(super) fn restore(&mut self, state: AgentState) {
        self.generations = state.generations.into_iter().collect();
        let (proven, watching): (Vec<WatchRecord>, Vec<WatchRecord>) =
            state.watches.into_iter().partition(|r| r.proof.is_some());
        let counts = (watching.len(), proven.len());
        // Proven first, so that a unit watched again after its proof maps to the new watch.
        for record in proven.into_iter().chain(watching) {
            let Ok(unit) = unit_name::validate(&record.unit) else {
                log::error!("state: skipping invalid unit name {:?}", record.unit);
                continue;
            };
            let spec = WatchSpec {
                run_dir: record.run_dir,
                record: record.record,
                generation: record.generation,
                launch_file: record.launch_file,
            };
            match record.proof {
                Some(proof) => match serde_json::from_value::<ProofEvent>(proof) {
                    Ok(event) => {
                        let key = self.new_key();
                        self.by_name.insert(unit.to_string(), key);
                        let mut watch = Watch::new(unit, None, spec);
                        watch.event = Some(event);
                        self.units.insert(key, watch);
                        self.proven_order.push_back((Instant::now(), key));
                    }
                    Err(e) => log::error!("state: skipping the proof of {unit}: {e}"),
                },
                None => {
                    let has_launch_file = spec.launch_file.is_some();
                    let key = self.new_watch(&unit, Some(record.invocation), spec);
                    if let Some(watch) = self.units.get_mut(&key) {
                        watch.resumed_stop_requested = record.stop_requested;
                        if watch.release.is_some() {
                            watch.release =
                                Some(Release::resume(has_launch_file, record.stop_succeeded));
                        }
                    }
                }
            }
        }
        if counts != (0, 0) {
            log::info!(
                "re-adopted {} watches and {} proven units from the state file",
                counts.0,
                counts.1
            );
        }
        self.dirty = false;
    }

    /// Saves the watch set if it changed, unless the last save was less than
    /// [`SAVE_INTERVAL`] ago: then a save is due when it has passed.
    pub(super) fn save_state(&mut self, now: Instant) {
        if !self.dirty {
            return;
        }
        if let Some(last) = self.last_save
            && now.saturating_duration_since(last) < SAVE_INTERVAL
        {
            self.save_due = Some(last + SAVE_INTERVAL);
            return;
        }
        self.save_now(now);
    }

    /// Saves the watch set if it changed, now (at start and at shutdown).
    pub(super) fn save_now(&mut self, now: Instant) {
        if !std::mem::take(&mut self.dirty) {
            return;
        }
        self.last_save = Some(now);
        self.save_due = None;
        let Some(file) = &self.state_file else {
            return;
        };
        let mut watches: Vec<WatchRecord> = self.units.values().filter_map(record_of).collect();
        watches.sort_by(|a, b| a.unit.cmp(&b.unit));
        let mut generations: Vec<(String, u64)> = self.generations.iter().cloned().collect();
        generations.sort();
        let state = AgentState {
            watches,
            generations,
            ..AgentState::default()
        };
        if let Err(e) = file.save(&state) {
            log::error!("{e}: the watch set would not survive a restart");
        }
    }

    pub(super) fn new_key(&mut self) -> UnitKey {
        let key = UnitKey(self.next_key);
        self.next_key += 1;
        key
    }
}

/// What of a watch must survive a restart; `None` while its invocation is not known.
fn record_of(watch: &Watch) -> Option<WatchRecord> {
    let invocation = match (&watch.event, &watch.proof) {
        (Some(event), _) => event.invocation.clone(),
        (None, Some(proof)) => proof.invocation().to_owned(),
        (None, None) => watch.asked_invocation.clone()?,
    };
    Some(WatchRecord {
        unit: watch.unit.to_string(),
        invocation,
        stop_requested: watch.proof.as_ref().is_some_and(UnitProof::stop_requested)
            || watch.pending_stop
            || watch.resumed_stop_requested,
        generation: watch.spec.generation,
        run_dir: watch.spec.run_dir.clone(),
        record: watch.spec.record.clone(),
        launch_file: watch.spec.launch_file.clone(),
        stop_succeeded: watch.release.as_ref().is_some_and(Release::stop_succeeded),
        proof: watch
            .event
            .as_ref()
            .and_then(|event| serde_json::to_value(event).ok()),
    })
}

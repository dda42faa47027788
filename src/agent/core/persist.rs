//! Keeping the watch set across restarts: what of it goes into the state file, and taking it
//! up again at start.
//!
//! A watch whose invocation is not known yet (its first read has not come back, so nobody has
//! been told of it) is not saved: saving it with an empty invocation would make every
//! invocation look foreign after a restart. A watch saved in another boot is proven at once:
//! every process of it died with the machine, and nothing is sent to systemd for it (the
//! unit's invocation in this boot is not ours to stop).

use std::time::Instant;

use super::event::ProofEvent;
use super::watch::{UnsentStop, Watch, WatchSpec};
use super::{AgentState, Core, StopKind};
use crate::agent::state::{ProofJson, WatchRecord};
use crate::proof::release::Release;
use crate::proof::{Input as ProofInput, Resumed, StopReason, UnitProof};
use crate::unit_name;

impl Core {
    /// Takes up the watches of a previous run: unproven ones are watched again with their
    /// invocation and stop-requested kept (proofs that became true meanwhile are made as soon
    /// as each unit has been read); proven ones are listed again with their event.
    pub(super) fn restore(&mut self, state: AgentState, now: Instant) {
        self.generations = state.generations.into_iter().collect();
        let rebooted = match (&state.boot_id, &self.config.boot_id) {
            (Some(saved), Some(current)) => saved != current,
            _ => false,
        };
        let (proven, watching): (Vec<WatchRecord>, Vec<WatchRecord>) =
            state.watches.into_iter().partition(|r| r.proof.is_some());
        let counts = (watching.len(), proven.len());
        // Proven first, so that a unit watched again after its proof maps to the new watch.
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
            let has_launch_file = spec.launch_file.is_some();
            let mut watch = Watch::new(unit.clone(), Some(record.invocation.clone()), spec);
            watch.restored = true;
            watch.control_group = record.control_group.unwrap_or_default();
            if watch.release.is_some() {
                watch.release = Some(Release::resume(has_launch_file, record.stop_succeeded));
            }
            if let Some(proof) = record.proof {
                match proof.decode::<ProofEvent>() {
                    Ok(event) => {
                        let key = self.new_key();
                        self.by_name.insert(unit.to_string(), key);
                        watch.event = Some(Box::new(event));
                        self.units.insert(key, watch);
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
            if record.stop_unsent && !rebooted {
                watch.unsent_stop = Some(Box::new(UnsentStop {
                    kind: StopKind::Proof(StopReason::Requested),
                    target: record.invocation.clone(),
                    first_read: 0,
                }));
            }
            let key = self.new_key();
            self.by_name.insert(unit.to_string(), key);
            self.by_id.insert(&watch.id, key);
            self.by_path.insert(&watch.path, key);
            self.units.insert(key, watch);
            if rebooted {
                self.prove_rebooted(key, now);
            }
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
        self.dirty = rebooted;
    }

    fn prove_rebooted(&mut self, key: crate::agent::core::UnitKey, now: Instant) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        let invocation = watch.asked_invocation.clone().unwrap_or_default();
        watch.proof = Some(UnitProof::resume(invocation, watch.resumed));
        self.feed(key, ProofInput::Rebooted, now);
    }

    /// What must survive a restart.
    pub(super) fn snapshot(&self) -> AgentState {
        let mut watches: Vec<WatchRecord> = self.units.values().filter_map(record_of).collect();
        watches.sort_by(|a, b| a.unit.cmp(&b.unit));
        let mut generations: Vec<(String, u64)> = self.generations.iter().cloned().collect();
        generations.sort();
        AgentState {
            watches,
            generations,
            boot_id: self.config.boot_id.clone(),
            ..AgentState::default()
        }
    }
}

/// What of a watch must survive a restart; `None` while its invocation is not known.
fn record_of(watch: &Watch) -> Option<WatchRecord> {
    let invocation = watch.our_invocation()?.to_owned();
    Some(WatchRecord {
        unit: watch.unit.to_string(),
        invocation,
        stop_requested: watch.stop_requested(),
        generation: watch.spec.generation,
        run_dir: watch.spec.run_dir.clone(),
        record: watch.spec.record.clone(),
        launch_file: watch.spec.launch_file.clone(),
        stop_succeeded: watch.release.as_ref().is_some_and(Release::stop_succeeded),
        proof: watch
            .event
            .as_ref()
            .and_then(|event| ProofJson::encode(event).ok()),
        control_group: (!watch.control_group.is_empty()).then(|| watch.control_group.clone()),
        stop_unsent: watch
            .unsent_stop
            .as_ref()
            .is_some_and(|s| s.kind == StopKind::Proof(StopReason::Requested))
            || (watch.pending_stop && watch.proof.is_none()),
    })
}

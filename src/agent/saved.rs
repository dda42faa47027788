//! The agent's durable watch set as values (pure): what it is ([`AgentState`]), what changed
//! of it in one turn ([`ChangeSet`]), and applying the one to the other. The core builds them,
//! and the snapshot file (`state.rs`), the journal (`journal.rs`) and the simulator's model of
//! the disk write and read them.

use std::collections::HashMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::record_name::RecordName;

/// The version of the file's format this agent writes. Version 2 added `boot_id`, each watch's
/// `control_group` and `stop_unsent`; version 3 the `journal` that follows the snapshot.
pub(crate) const STATE_VERSION: u32 = 3;

/// A proof event kept as the JSON text it was encoded to: every save writes every proven
/// watch's event, and encoding it to a string once per save costs one allocation where a
/// `serde_json::Value` costs one per field (the saves of 1,000 proven watches took 13 ms of
/// building the state, measured, while proofs were due).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct ProofJson(Box<serde_json::value::RawValue>);

impl ProofJson {
    /// Encodes `value`.
    pub(crate) fn encode<T: Serialize>(value: &T) -> serde_json::Result<Self> {
        serde_json::value::to_raw_value(value).map(Self)
    }

    /// Decodes it as a `T`.
    pub(crate) fn decode<T: serde::de::DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_str(self.0.get())
    }
}

/// Equal when the texts are: a state read back is the state written.
impl PartialEq for ProofJson {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Eq for ProofJson {}

/// One watch as it must survive a restart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WatchRecord {
    /// The unit's name; the state file's loader rejects a file holding an invalid one.
    pub unit: String,
    /// Our invocation, `""` if the unit had none when the watch began.
    pub invocation: String,
    /// A stop was requested for this watch.
    pub stop_requested: bool,
    /// The generation (never 0) the watch is for, if any.
    #[serde(rename = "gen")]
    pub generation: Option<u64>,
    /// The run directory of the unit's advisory exit record.
    pub run_dir: Option<PathBuf>,
    /// The exit record's file name in `run_dir`.
    pub record: Option<RecordName>,
    /// The generation's launch file, removed after the proof.
    pub launch_file: Option<PathBuf>,
    /// A stop of ours already succeeded for this generation (the final stop is then not needed).
    pub stop_succeeded: bool,
    /// Set once proven: the proof event as JSON, kept so `list` still shows it after a restart.
    pub proof: Option<ProofJson>,
    /// The unit's cgroup as systemd last reported it, so a restarted agent can still read it
    /// when systemd no longer reports one (the unit was unloaded meanwhile).
    #[serde(default)]
    pub control_group: Option<String>,
    /// A requested stop that never reached systemd (the bus was down): it is sent after the
    /// restart if the unit still runs our invocation.
    #[serde(default)]
    pub stop_unsent: bool,
}

#[cfg(test)]
impl WatchRecord {
    /// A watch of `unit` for `invocation` with nothing else set, for tests to build on.
    pub(crate) fn bare(unit: &str, invocation: &str) -> WatchRecord {
        WatchRecord {
            unit: unit.to_owned(),
            invocation: invocation.to_owned(),
            stop_requested: false,
            generation: None,
            run_dir: None,
            record: None,
            launch_file: None,
            stop_succeeded: false,
            proof: None,
            control_group: None,
            stop_unsent: false,
        }
    }
}

/// Everything the agent keeps across a restart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentState {
    /// The format's version, [`STATE_VERSION`]; any other makes the file corrupt.
    pub version: u32,
    /// The watched units, proven ones included until they are dropped.
    pub watches: Vec<WatchRecord>,
    /// Every (unit, gen) ever watched: generation numbers are never reused, across restarts too.
    pub generations: Vec<(String, u64)>,
    /// The boot the watches were saved in (`/proc/sys/kernel/random/boot_id`): after a reboot
    /// every process of them is gone.
    #[serde(default)]
    pub boot_id: Option<String>,
    /// The journal that follows this snapshot: only a journal of this number is applied to it
    /// (0 in files of versions 1 and 2, which have none). Set by the store when it writes.
    #[serde(default)]
    pub journal: u64,
}

/// What changed of the watch set in one turn of the agent: the journal's unit of writing.
///
/// A unit's records are replaced whole: a unit in `watches` has that record and no other
/// afterwards, a unit in `removed` has none. A unit is in one of the two at most.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChangeSet {
    /// The new record of each unit that changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub watches: Vec<WatchRecord>,
    /// Units that have no record any more.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
    /// Generations taken.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generations: Vec<(String, u64)>,
    /// Generations given back (a watch refused before its first read succeeded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generations_freed: Vec<(String, u64)>,
}

impl ChangeSet {
    /// Nothing changed.
    pub(crate) fn is_empty(&self) -> bool {
        self.watches.is_empty()
            && self.removed.is_empty()
            && self.generations.is_empty()
            && self.generations_freed.is_empty()
    }
}

/// One save of the watch set: all of it (at start, and when the journal is compacted), or what
/// changed since the save before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StateSave {
    Snapshot(AgentState),
    Changes(ChangeSet),
}

impl AgentState {
    /// Applies change sets in order, in one pass over the watches however many there are (a
    /// journal of thousands of turns is replayed at start). Pure: the loader and the
    /// simulator's model of the disk both restart through it.
    pub(crate) fn apply<'a>(&mut self, changes: impl IntoIterator<Item = &'a ChangeSet>) {
        // Each unit's final record (`None`: removed), and each generation's final presence.
        let mut records: HashMap<&str, Option<&WatchRecord>> = HashMap::new();
        let mut generations: HashMap<&(String, u64), bool> = HashMap::new();
        for change in changes {
            for unit in &change.removed {
                records.insert(unit, None);
            }
            for record in &change.watches {
                records.insert(&record.unit, Some(record));
            }
            for generation in &change.generations_freed {
                generations.insert(generation, false);
            }
            for generation in &change.generations {
                generations.insert(generation, true);
            }
        }
        if !records.is_empty() {
            self.watches
                .retain(|record| !records.contains_key(record.unit.as_str()));
            self.watches
                .extend(records.into_values().flatten().cloned());
            self.watches.sort_by(|a, b| a.unit.cmp(&b.unit));
        }
        if !generations.is_empty() {
            self.generations
                .retain(|generation| !generations.contains_key(generation));
            self.generations.extend(
                generations
                    .into_iter()
                    .filter(|(_, present)| *present)
                    .map(|(generation, _)| generation.clone()),
            );
            self.generations.sort();
        }
    }
}

impl Default for AgentState {
    /// An empty state of the current version (a derived default would say version 0, which
    /// would not load back).
    fn default() -> AgentState {
        AgentState {
            version: STATE_VERSION,
            watches: Vec::new(),
            generations: Vec::new(),
            boot_id: None,
            journal: 0,
        }
    }
}

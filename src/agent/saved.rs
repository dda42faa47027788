//! The agent's durable watch set as values (pure): what it is ([`AgentState`]), what changed
//! of it in one turn ([`ChangeSet`]), and applying the one to the other. The core builds them,
//! and the snapshot file (`state.rs`), the journal (`journal.rs`) and the simulator's model of
//! the disk write and read them.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::cgroup::procs::{Lineage, ProcessStart};
use crate::control::wire::{Cause, EventKind, Level, ProofEvent, SanitizedRecord};
use crate::record_name::RecordName;

/// The version of the file's format this agent writes. Version 2 added `boot_id`, each watch's
/// `control_group` and `stop_unsent`; version 3 the `journal` that follows the snapshot;
/// version 4 saves a proof as [`SavedProof`], the state's own shape (its names are the ones
/// versions 1 to 3 saved, so their proofs still load); a watch's `release_unfinished` and
/// `unit_id`, and the state's `offset_floors`, each written only when set, came later within
/// version 4.
pub(crate) const STATE_VERSION: u32 = 4;

/// The oldest version of a journal this agent still replays: a journal follows a snapshot of
/// its version, and journals began with version 3.
pub(crate) const OLDEST_JOURNAL_VERSION: u32 = 3;

/// A proof event kept as the JSON text of its [`SavedProof`]: every save writes every proven
/// watch's event, and encoding it to a string once per save costs one allocation where a
/// `serde_json::Value` costs one per field (the saves of 1,000 proven watches took 13 ms of
/// building the state, measured, while proofs were due).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct ProofJson(Box<serde_json::value::RawValue>);

impl ProofJson {
    /// Saves `event`.
    pub(crate) fn of(event: &ProofEvent) -> serde_json::Result<Self> {
        serde_json::value::to_raw_value(&SavedProof::from(event)).map(Self)
    }

    /// The event saved; an error if the text is not a [`SavedProof`].
    pub(crate) fn event(&self) -> serde_json::Result<ProofEvent> {
        serde_json::from_str::<SavedProof<'_>>(self.0.get()).map(ProofEvent::from)
    }

    /// Any JSON as a saved proof, for tests of what a damaged one does.
    #[cfg(test)]
    pub(crate) fn from_json(value: &serde_json::Value) -> serde_json::Result<Self> {
        serde_json::value::to_raw_value(value).map(Self)
    }
}

/// A proof event as the state file saves it: the state's own shape, apart from the wire's
/// `ProofEvent`, so that changing the protocol cannot make a newer agent drop the proofs an
/// older one retained. Its names are those the wire used when versions 1 to 3 were written;
/// they change only with a new [`STATE_VERSION`], which must still read the names before.
#[derive(Serialize, Deserialize)]
struct SavedProof<'a> {
    #[serde(rename = "type")]
    kind: SavedKind,
    unit: Cow<'a, str>,
    invocation: Cow<'a, str>,
    level: SavedLevel,
    message: Cow<'a, str>,
    cause: SavedCause,
    proven_mono_ns: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    proven_realtime_us: Option<u64>,
    stop_requested: bool,
    systemd: Option<SavedRecord<'a>>,
    record: Option<SavedRecord<'a>>,
    #[serde(rename = "gen")]
    generation: Option<u64>,
    launch_file: Option<Cow<'a, str>>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum SavedKind {
    Proven,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum SavedLevel {
    Info,
    Warn,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum SavedCause {
    Exited,
    ReplacedAfterStop,
    RestartedOutside,
    Rebooted,
    /// A cause this build does not know, saved by a newer agent: a proof all the same.
    #[serde(other)]
    Other,
}

#[derive(Serialize, Deserialize)]
struct SavedRecord<'a> {
    result: Cow<'a, str>,
    code: Cow<'a, str>,
    status: Cow<'a, str>,
}

impl<'a> From<&'a ProofEvent> for SavedProof<'a> {
    fn from(event: &'a ProofEvent) -> Self {
        // Another kind of event would need a saved kind of its own.
        let EventKind::Proven = event.kind;
        SavedProof {
            kind: SavedKind::Proven,
            unit: Cow::Borrowed(&event.unit),
            invocation: Cow::Borrowed(&event.invocation),
            level: match event.level {
                Level::Info => SavedLevel::Info,
                Level::Warn => SavedLevel::Warn,
            },
            message: Cow::Borrowed(&event.message),
            cause: match event.cause {
                Cause::Exited => SavedCause::Exited,
                Cause::ReplacedAfterStop => SavedCause::ReplacedAfterStop,
                Cause::RestartedOutside => SavedCause::RestartedOutside,
                Cause::Rebooted => SavedCause::Rebooted,
                Cause::Other => SavedCause::Other,
            },
            proven_mono_ns: event.proven_mono_ns,
            proven_realtime_us: event.proven_realtime_us,
            stop_requested: event.stop_requested,
            systemd: event.systemd.as_ref().map(SavedRecord::from),
            record: event.record.as_ref().map(SavedRecord::from),
            generation: event.generation,
            launch_file: event.launch_file.as_deref().map(Cow::Borrowed),
        }
    }
}

impl From<SavedProof<'_>> for ProofEvent {
    fn from(saved: SavedProof<'_>) -> Self {
        let SavedKind::Proven = saved.kind;
        ProofEvent {
            kind: EventKind::Proven,
            unit: saved.unit.into_owned(),
            invocation: saved.invocation.into_owned(),
            level: match saved.level {
                SavedLevel::Info => Level::Info,
                SavedLevel::Warn => Level::Warn,
            },
            message: saved.message.into_owned(),
            cause: match saved.cause {
                SavedCause::Exited => Cause::Exited,
                SavedCause::ReplacedAfterStop => Cause::ReplacedAfterStop,
                SavedCause::RestartedOutside => Cause::RestartedOutside,
                SavedCause::Rebooted => Cause::Rebooted,
                SavedCause::Other => Cause::Other,
            },
            proven_mono_ns: saved.proven_mono_ns,
            proven_realtime_us: saved.proven_realtime_us,
            stop_requested: saved.stop_requested,
            systemd: saved.systemd.map(SanitizedRecord::from),
            record: saved.record.map(SanitizedRecord::from),
            generation: saved.generation,
            launch_file: saved.launch_file.map(Cow::into_owned),
        }
    }
}

impl<'a> From<&'a SanitizedRecord> for SavedRecord<'a> {
    fn from(record: &'a SanitizedRecord) -> Self {
        SavedRecord {
            result: Cow::Borrowed(&record.result),
            code: Cow::Borrowed(&record.code),
            status: Cow::Borrowed(&record.status),
        }
    }
}

impl From<SavedRecord<'_>> for SanitizedRecord {
    fn from(saved: SavedRecord<'_>) -> Self {
        SanitizedRecord {
            result: saved.result.into_owned(),
            code: saved.code.into_owned(),
            status: saved.status.into_owned(),
        }
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
pub(crate) struct SavedWatch {
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
    /// Proven, and the generation's release (its launch file, its final stop) is not over:
    /// an agent restarted from this carries it out. Written only when set, so a file an
    /// earlier agent of the same version wrote reads the same.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub release_unfinished: bool,
    /// systemd's own name of the unit, where `unit` is an alias of it: a restarted agent hears
    /// the unit's signals, which name it by that name, before its first read tells it again.
    /// Written only when set, as `release_unfinished`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit_id: Option<String>,
    /// The processes a count held as possibly ours, with their starts, while the cgroup held
    /// them beside a later invocation. A restarted agent cannot read a start again once its
    /// process is gone, and systemd may meanwhile have named one a later invocation's MainPID
    /// (its guess, `unit_search_main_pid`), which only that start tells from its own fork.
    /// Written only when some are held, as `release_unfinished`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<SavedProcess>,
}

/// A process a count held, as the state saves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SavedProcess {
    pub pid: i32,
    /// Its start, in clock ticks since the boot the state was saved in.
    pub start: u64,
    /// Its parent where the count that first held it saw it (0: not in the census), and its
    /// session; both absent where that was not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<i32>,
}

impl From<&ProcessStart> for SavedProcess {
    fn from(process: &ProcessStart) -> Self {
        SavedProcess {
            pid: process.pid,
            start: process.start_ticks,
            parent: process.held_as.map(|lineage| lineage.parent),
            session: process.held_as.map(|lineage| lineage.session),
        }
    }
}

impl From<SavedProcess> for ProcessStart {
    fn from(saved: SavedProcess) -> Self {
        ProcessStart {
            pid: saved.pid,
            start_ticks: saved.start,
            held_as: saved
                .parent
                .zip(saved.session)
                .map(|(parent, session)| Lineage { parent, session }),
        }
    }
}

#[cfg(test)]
impl SavedWatch {
    /// A watch of `unit` for `invocation` with nothing else set, for tests to build on.
    pub(crate) fn bare(unit: &str, invocation: &str) -> SavedWatch {
        SavedWatch {
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
            release_unfinished: false,
            unit_id: None,
            held: Vec::new(),
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
    pub watches: Vec<SavedWatch>,
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
    /// How long the machine had been suspended, at least, from each of a few CLOCK_MONOTONIC
    /// instants on (µs, ns; `OffsetFloors`), in the boot of `boot_id`: an agent started again
    /// places a process's start before a suspend it slept through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offset_floors: Vec<(u64, u64)>,
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
    pub watches: Vec<SavedWatch>,
    /// Units that have no record any more.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
    /// Generations taken.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generations: Vec<(String, u64)>,
    /// Generations given back (a watch refused before its first read succeeded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generations_freed: Vec<(String, u64)>,
    /// The state's `offset_floors`, all of them, if they rose (after a suspend).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offset_floors: Vec<(u64, u64)>,
}

impl ChangeSet {
    /// Nothing changed.
    pub(crate) fn is_empty(&self) -> bool {
        self.watches.is_empty()
            && self.removed.is_empty()
            && self.generations.is_empty()
            && self.generations_freed.is_empty()
            && self.offset_floors.is_empty()
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
        let mut records: HashMap<&str, Option<&SavedWatch>> = HashMap::new();
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
            if !change.offset_floors.is_empty() {
                self.offset_floors.clone_from(&change.offset_floors);
            }
        }
        if !records.is_empty() {
            self.watches
                .retain(|record| !records.contains_key(record.unit.as_str()));
            self.watches
                .extend(records.into_values().flatten().cloned());
            // A unit once (the records are keyed by it), so the order is a stable sort's,
            // without its scratch buffer and its code.
            self.watches.sort_unstable_by(|a, b| a.unit.cmp(&b.unit));
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
            // Each once, as the watches.
            self.generations.sort_unstable();
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
            offset_floors: Vec::new(),
        }
    }
}

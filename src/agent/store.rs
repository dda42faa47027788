//! The durable watch set: the snapshot (`state.rs`) and the journal that follows it
//! (`journal.rs`), loaded together at start and written as the core asks: a change set is
//! appended to the journal, a snapshot replaces the snapshot file and starts a new journal.
//!
//! Every step of a compaction leaves a loadable pair: the new snapshot is renamed into place
//! first, naming a journal one higher than the old one, and the old journal is then replaced
//! by the new journal's header. Killed in between, the old journal is older than the snapshot
//! and is not applied (its changes are in the snapshot).
//!
//! A journal file is there whenever a snapshot of version 3 or later is: where there was none
//! (the first start, or a state of an older version), an empty journal numbered below the
//! snapshot is put there before the snapshot is written. So a snapshot found without any journal lost
//! it after it was written, with whatever changes were acknowledged since, and it is not
//! taken up alone (it could bring back watches since unwatched, and proofs since released).

use std::os::fd::AsFd;
use std::path::PathBuf;

use crate::clock;

use super::journal::{self, JOURNAL_FILE_NAME, JournalFile, Replayed};
use super::saved::{AgentState, STATE_VERSION, StateSave};
use super::state::{Found, STATE_FILE_NAME, StateError, StateFile, open_dir};

/// The journal is compacted into a new snapshot once it is longer than this, or than twice the
/// last snapshot (so a compaction costs at most as much as the appends since the last one).
const COMPACT_AT_LEAST: u64 = 1 << 20;

/// The state as loaded at start.
#[derive(Debug)]
pub(super) struct Loaded {
    pub state: AgentState,
    /// Something the operator should hear of that is not an error (a killed append dropped, a
    /// journal older than the snapshot left out).
    pub note: Option<String>,
}

/// The snapshot and the journal of one state directory.
#[derive(Debug)]
pub(super) struct StateStore {
    snapshot: StateFile,
    /// The journal being appended to, once a snapshot was written by this agent.
    journal: Option<JournalFile>,
    /// The number the next snapshot names: above every journal on disk.
    next_journal: u64,
    snapshot_len: u64,
}

impl StateStore {
    /// The store of the state directory `dir`.
    pub(super) fn new(dir: PathBuf) -> StateStore {
        StateStore {
            snapshot: StateFile::new(dir),
            journal: None,
            next_journal: 1,
            snapshot_len: 0,
        }
    }

    /// Reads the snapshot and replays the journal that follows it, once, at start.
    ///
    /// A corrupt snapshot or journal is handled as [`StateFile::load`] handles a corrupt
    /// snapshot: moved aside and reported, and the agent starts empty. Both go aside together,
    /// so the pair stays evidence (and a snapshot without the changes acknowledged after it is
    /// never taken up).
    pub(super) fn load(&mut self) -> Result<Loaded, StateError> {
        let mut state = match self.snapshot.load() {
            Ok(state) => state,
            Err(error) => {
                if matches!(error, StateError::Corrupt { .. }) {
                    self.move_journal_aside(clock::wall_seconds());
                }
                return Err(error);
            }
        };
        self.next_journal = state.journal + 1;
        let found = journal::read(&self.snapshot)?;
        let reason = match found {
            Found::Nothing if state.journal > 0 => {
                let reason = format!(
                    "its journal {} (number {}) is missing: the changes saved after the \
                     snapshot are lost",
                    self.journal_path().display(),
                    state.journal
                );
                return Err(self.move_snapshot_aside_because(reason));
            }
            Found::Nothing => return Ok(Loaded { state, note: None }),
            Found::NotAFile(what) => format!("it is {what}"),
            Found::Bytes(bytes) => match journal::replay(&mut state, &bytes) {
                Ok(Replayed::Applied { torn_bytes, .. }) => {
                    let note = (torn_bytes > 0).then(|| {
                        format!(
                            "dropped the last {torn_bytes} bytes of {}: an append the agent \
                             was killed in, of which nothing was carried out",
                            self.journal_path().display()
                        )
                    });
                    return Ok(Loaded { state, note });
                }
                Ok(Replayed::Stale { journal }) => {
                    let note = Some(format!(
                        "left out {} (journal {journal}): the snapshot after it, naming \
                         journal {}, holds its changes",
                        self.journal_path().display(),
                        state.journal
                    ));
                    return Ok(Loaded { state, note });
                }
                Err(reason) => reason,
            },
        };
        let seconds = clock::wall_seconds();
        let snapshot_aside = self.snapshot.move_snapshot_aside(seconds);
        let reason = match snapshot_aside {
            Some(aside) => format!(
                "{reason}; the snapshot it follows went aside too, to {}",
                aside.display()
            ),
            None => reason,
        };
        Err(self.move_journal_aside_because(seconds, reason))
    }

    /// Writes a save: a snapshot replaces the snapshot file and starts a new journal, durable
    /// when it returns `Ok`; a change set is appended to the journal, which a restart after
    /// the agent is killed finds, but which survives the machine's crash only once
    /// [`StateStore::sync`]ed. Returns the bytes written.
    pub(super) fn save(&mut self, save: StateSave) -> Result<usize, StateError> {
        match save {
            StateSave::Snapshot(mut state) => {
                let number = self.next_journal;
                // A state loaded from an older version is written in this one.
                state.version = STATE_VERSION;
                state.journal = number;
                // The old journal is useless from here, whatever happens next.
                self.journal = None;
                // Asked of the disk, not remembered: a journal moved aside as corrupt is gone.
                if !self.journal_path().exists() {
                    // Left out once the snapshot names a higher number; there, it says the
                    // snapshot had a journal.
                    self.snapshot
                        .replace(JOURNAL_FILE_NAME, &journal::header(number - 1))?;
                }
                let bytes = self.snapshot.save(&state)?;
                self.next_journal = number + 1;
                self.snapshot_len = bytes as u64;
                self.journal = Some(JournalFile::start(&self.snapshot, number)?);
                Ok(bytes)
            }
            StateSave::Changes(changes) => {
                let Some(journal) = self.journal.as_mut() else {
                    return Err(StateError::Io {
                        path: self.journal_path(),
                        action: "append before a snapshot started",
                        source: std::io::Error::other("no journal is open"),
                    });
                };
                journal.append(&changes)
            }
        }
    }

    /// Makes every save so far durable on disk; `false` if nothing needed it.
    pub(super) fn sync(&mut self) -> Result<bool, StateError> {
        match self.journal.as_mut() {
            Some(journal) => journal.sync(),
            None => Ok(false),
        }
    }

    /// Whether a save is not yet durable on disk.
    pub(super) fn unsynced(&self) -> bool {
        self.journal.as_ref().is_some_and(JournalFile::unsynced)
    }

    /// Whether the journal is long enough to be compacted into a snapshot.
    pub(super) fn wants_snapshot(&self) -> bool {
        self.journal.as_ref().is_some_and(|journal| {
            journal.len() > COMPACT_AT_LEAST.max(self.snapshot_len.saturating_mul(2))
        })
    }

    fn journal_path(&self) -> PathBuf {
        self.snapshot.dir().join(JOURNAL_FILE_NAME)
    }

    /// Moves the journal aside (the snapshot it follows was corrupt), best effort: it is
    /// evidence, and the next start would replace it.
    fn move_journal_aside(&self, seconds: u64) {
        let _ = self.move_journal_aside_because(seconds, String::new());
    }

    fn move_snapshot_aside_because(&self, reason: String) -> StateError {
        match open_dir(self.snapshot.dir()) {
            Ok(dirfd) => self.snapshot.move_aside(
                dirfd.as_fd(),
                STATE_FILE_NAME,
                clock::wall_seconds(),
                reason,
            ),
            Err(errno) => StateError::Corrupt {
                path: self.snapshot.path().to_owned(),
                moved_to: None,
                reason: format!("{reason}; moving it aside failed: {errno}"),
            },
        }
    }

    fn move_journal_aside_because(&self, seconds: u64, reason: String) -> StateError {
        let dir = self.snapshot.dir();
        match open_dir(dir) {
            Ok(dirfd) => {
                self.snapshot
                    .move_aside(dirfd.as_fd(), JOURNAL_FILE_NAME, seconds, reason)
            }
            Err(errno) => StateError::Corrupt {
                path: self.journal_path(),
                moved_to: None,
                reason: format!("{reason}; moving it aside failed: {errno}"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::saved::{ChangeSet, SavedWatch};
    use crate::atomic_file::dir_entries as entries;
    use crate::control::wire::{Cause, EventKind, Level, ProofEvent, SanitizedRecord};
    use std::fs;
    use std::path::Path;

    fn record(unit: &str) -> SavedWatch {
        SavedWatch {
            control_group: Some(format!("/app.slice/{unit}")),
            ..SavedWatch::bare(unit, "6f6c8d4b3b33415a9c74b562581b76a5")
        }
    }

    fn state_of(units: &[&str]) -> AgentState {
        AgentState {
            watches: units.iter().map(|u| record(u)).collect(),
            ..AgentState::default()
        }
    }

    fn put(unit: &str) -> StateSave {
        StateSave::Changes(ChangeSet {
            watches: vec![record(unit)],
            ..ChangeSet::default()
        })
    }

    fn load(dir: &Path) -> Loaded {
        StateStore::new(dir.to_owned()).load().expect("load")
    }

    /// The state loaded, with the journal number the store gave it left out.
    fn watches(loaded: &Loaded) -> Vec<&str> {
        loaded
            .state
            .watches
            .iter()
            .map(|w| w.unit.as_str())
            .collect()
    }

    /// An append is written before anything after it is carried out and synced later: an
    /// agent killed in between finds it at its restart (the kernel keeps what was written),
    /// and the sync makes it durable on disk once.
    #[test]
    fn an_unsynced_append_is_taken_up_by_a_restart_and_synced_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = StateStore::new(dir.path().to_owned());
        store.load().expect("first start");
        store
            .save(StateSave::Snapshot(state_of(&["a.service"])))
            .expect("snapshot");
        assert!(!store.unsynced(), "a snapshot is durable when saved");
        store.save(put("b.service")).expect("append");
        assert!(store.unsynced());
        assert_eq!(watches(&load(dir.path())), ["a.service", "b.service"]);
        assert!(store.sync().expect("sync"));
        assert!(!store.unsynced());
        assert!(!store.sync().expect("nothing to sync"));
    }

    #[test]
    fn a_snapshot_and_the_changes_after_it_load_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = StateStore::new(dir.path().to_owned());
        assert!(store.load().expect("first start").state == AgentState::default());
        store
            .save(StateSave::Snapshot(state_of(&["a.service"])))
            .expect("snapshot");
        store.save(put("b.service")).expect("append");
        store
            .save(StateSave::Changes(ChangeSet {
                removed: vec!["a.service".to_owned()],
                ..ChangeSet::default()
            }))
            .expect("append");
        let loaded = load(dir.path());
        assert_eq!(watches(&loaded), ["b.service"]);
        assert_eq!(loaded.state.journal, 1);
        assert_eq!(loaded.note, None);
        assert_eq!(entries(dir.path()), ["state.journal", "state.json"]);
        let text = fs::read_to_string(dir.path().join("state.journal")).expect("read");
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(text.starts_with(&format!("{{\"version\":{STATE_VERSION},\"journal\":1}}\n")));
    }

    /// A store in `dir` whose snapshot holds `a.service`, and whose journal then `b.service`.
    fn snapshot_of_a_then_b_appended(dir: &Path) -> StateStore {
        let mut store = StateStore::new(dir.to_owned());
        store
            .save(StateSave::Snapshot(state_of(&["a.service"])))
            .expect("snapshot");
        store.save(put("b.service")).expect("append");
        store
    }

    #[test]
    fn a_new_snapshot_starts_a_new_journal_numbered_above_the_old() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = snapshot_of_a_then_b_appended(dir.path());
        store
            .save(StateSave::Snapshot(state_of(&["a.service", "b.service"])))
            .expect("compact");
        store.save(put("c.service")).expect("append");
        // A restart goes on numbering from the snapshot it loaded.
        let mut restarted = StateStore::new(dir.path().to_owned());
        let loaded = restarted.load().expect("load");
        assert_eq!(loaded.state.journal, 2);
        assert_eq!(watches(&loaded), ["a.service", "b.service", "c.service"]);
        restarted
            .save(StateSave::Snapshot(loaded.state))
            .expect("snapshot at start");
        assert_eq!(load(dir.path()).state.journal, 3);
    }

    #[test]
    fn a_compaction_killed_at_any_step_loads_the_same_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = snapshot_of_a_then_b_appended(dir.path());
        let whole = state_of(&["a.service", "b.service"]);
        let journal_path = dir.path().join(JOURNAL_FILE_NAME);
        let old_journal = fs::read(&journal_path).expect("read the journal");

        // Killed before the snapshot's rename: its temporary file is all that is new.
        fs::write(dir.path().join(".state.json.77.0000000000000001.tmp"), b"{").expect("write");
        let loaded = load(dir.path());
        assert_eq!(watches(&loaded), ["a.service", "b.service"]);
        assert_eq!(entries(dir.path()), ["state.journal", "state.json"]);

        // Killed after the snapshot's rename, before the new journal: the old journal, which
        // the snapshot holds already, is left out (replayed again it would bring back a unit
        // removed in the snapshot).
        store
            .save(StateSave::Snapshot(state_of(&["b.service"])))
            .expect("compact");
        fs::write(&journal_path, &old_journal).expect("put the old journal back");
        let loaded = load(dir.path());
        assert_eq!(watches(&loaded), ["b.service"]);
        let note = loaded.note.expect("a note");
        assert!(
            note.contains("journal 1") && note.contains("naming journal 2"),
            "{note}"
        );

        // Killed after both: the new journal is the header alone.
        store
            .save(StateSave::Snapshot(whole.clone()))
            .expect("compact");
        let loaded = load(dir.path());
        assert_eq!(watches(&loaded), ["a.service", "b.service"]);
        assert_eq!(loaded.note, None);
    }

    #[test]
    fn a_killed_append_is_dropped_with_a_note() {
        let dir = tempfile::tempdir().expect("tempdir");
        snapshot_of_a_then_b_appended(dir.path());
        let journal_path = dir.path().join(JOURNAL_FILE_NAME);
        let mut bytes = fs::read(&journal_path).expect("read");
        bytes.extend_from_slice(b"{\"seq\":2,\"changes\":{\"removed\":[\"a.ser");
        fs::write(&journal_path, &bytes).expect("write");
        let loaded = load(dir.path());
        assert_eq!(watches(&loaded), ["a.service", "b.service"]);
        let note = loaded.note.expect("a note");
        assert!(note.contains("dropped the last 37 bytes"), "{note}");
    }

    #[test]
    fn a_corrupt_journal_goes_aside_with_its_snapshot_and_the_agent_starts_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = snapshot_of_a_then_b_appended(dir.path());
        store.save(put("c.service")).expect("append");
        let journal_path = dir.path().join(JOURNAL_FILE_NAME);
        let text = fs::read_to_string(&journal_path).expect("read");
        let damaged = text.replacen("\"seq\":1", "\"seq\":7", 1);
        fs::write(&journal_path, &damaged).expect("write");
        let error = StateStore::new(dir.path().to_owned())
            .load()
            .expect_err("corrupt");
        let message = error.to_string();
        assert!(
            message.contains("state.journal is corrupt")
                && message.contains("numbered 7")
                && message.contains("the snapshot it follows went aside too")
                && message.contains("moved it aside to"),
            "{message}"
        );
        let names = entries(dir.path());
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names[0].starts_with("state.journal.corrupt-"), "{names:?}");
        assert!(names[1].starts_with("state.json.corrupt-"), "{names:?}");
        assert_eq!(
            fs::read_to_string(dir.path().join(&names[0])).expect("read"),
            damaged
        );
        assert_eq!(load(dir.path()).state, AgentState::default());
    }

    #[test]
    fn a_snapshot_whose_journal_is_missing_is_not_taken_up_alone() {
        for compactions in [0, 1] {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut store = StateStore::new(dir.path().to_owned());
            store.load().expect("first start");
            for _ in 0..=compactions {
                store
                    .save(StateSave::Snapshot(state_of(&["a.service"])))
                    .expect("snapshot");
            }
            store
                .save(StateSave::Changes(ChangeSet {
                    removed: vec!["a.service".to_owned()],
                    ..ChangeSet::default()
                }))
                .expect("append an acknowledged unwatch");
            fs::remove_file(dir.path().join(JOURNAL_FILE_NAME)).expect("remove the journal");
            let error = StateStore::new(dir.path().to_owned())
                .load()
                .expect_err("a snapshot without its journal");
            let message = error.to_string();
            assert!(
                message.contains("state.json is corrupt")
                    && message.contains("is missing")
                    && message.contains("moved it aside to"),
                "{message}"
            );
            let names = entries(dir.path());
            assert!(
                names.len() == 1 && names[0].starts_with("state.json.corrupt-"),
                "{names:?}"
            );
        }
    }

    #[test]
    fn a_start_killed_before_its_first_journal_loads_at_every_step() {
        // A fresh directory, and starts killed between the snapshot and its journal: the
        // journal put there before the first snapshot keeps each pair loadable.
        let dir = tempfile::tempdir().expect("tempdir");
        let journal_path = dir.path().join(JOURNAL_FILE_NAME);
        for _ in 0..3 {
            let mut store = StateStore::new(dir.path().to_owned());
            let loaded = store.load().expect("load");
            let number = loaded.state.journal + 1;
            let before = fs::read(&journal_path).ok();
            store
                .save(StateSave::Snapshot(state_of(&["a.service"])))
                .expect("snapshot");
            // Undo the journal's start: a kill right after the snapshot's rename leaves the
            // journal before it, or the empty one put there first.
            let left = before.unwrap_or_else(|| journal::header(number - 1));
            fs::write(&journal_path, left).expect("write");
            let loaded = load(dir.path());
            assert_eq!(watches(&loaded), ["a.service"]);
        }
    }

    #[test]
    fn a_corrupt_snapshot_takes_its_journal_aside_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        snapshot_of_a_then_b_appended(dir.path());
        fs::write(dir.path().join("state.json"), b"{\"version\":3,").expect("damage");
        let error = StateStore::new(dir.path().to_owned())
            .load()
            .expect_err("corrupt");
        assert!(matches!(error, StateError::Corrupt { .. }), "{error}");
        let names = entries(dir.path());
        assert!(
            names.len() == 2 && names.iter().all(|n| n.contains(".corrupt-")),
            "{names:?}"
        );
    }

    /// A snapshot and journal written by the agent of version 3, each with a proven watch,
    /// load with both proofs, which read back as the events saved; the next snapshot is of
    /// this version and holds the same.
    #[test]
    fn a_state_of_version_3_loads_with_its_proofs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state-v3");
        for name in ["state.json", "state.journal"] {
            fs::copy(fixture.join(name), dir.path().join(name)).expect("copy the fixture");
        }
        let mut store = StateStore::new(dir.path().to_owned());
        let loaded = store.load().expect("load");
        assert_eq!(loaded.note, None);
        assert_eq!(watches(&loaded), ["a.service", "b.service", "c.service"]);
        let proofs = |state: &AgentState| -> Vec<ProofEvent> {
            let proofs = state.watches.iter().filter_map(|w| w.proof.as_ref());
            proofs.map(|p| p.event().expect("a saved proof")).collect()
        };
        let events = proofs(&loaded.state);
        let expected = |unit: &str, cause| ProofEvent {
            kind: EventKind::Proven,
            unit: unit.to_owned(),
            invocation: "0123456789abcdef0123456789abcdef".to_owned(),
            level: Level::Warn,
            message: format!(
                "proven {unit} (invocation 01234567): instance exited: exit 3 (exit-code)"
            ),
            cause,
            proven_mono_ns: 123_456_789,
            proven_realtime_us: None,
            stop_requested: true,
            systemd: Some(exit_3()),
            record: Some(exit_3()),
            generation: Some(7),
            launch_file: Some("/run/launch/a".to_owned()),
        };
        assert_eq!(
            events,
            [
                expected("a.service", Cause::Exited),
                expected("b.service", Cause::ReplacedAfterStop)
            ]
        );
        store
            .save(StateSave::Snapshot(loaded.state))
            .expect("snapshot");
        let again = load(dir.path());
        assert_eq!(again.state.version, STATE_VERSION);
        assert_eq!(proofs(&again.state), events);
    }

    fn exit_3() -> SanitizedRecord {
        SanitizedRecord {
            result: "exit-code".to_owned(),
            code: "exited".to_owned(),
            status: "3".to_owned(),
        }
    }

    #[test]
    fn state_files_of_versions_1_and_2_load_without_a_journal() {
        for version in [1, 2] {
            let dir = tempfile::tempdir().expect("tempdir");
            let record = serde_json::to_string(&record("a.service")).expect("encode");
            let record = if version == 1 {
                record
                    .replace(",\"control_group\":\"/app.slice/a.service\"", "")
                    .replace(",\"stop_unsent\":false", "")
            } else {
                record
            };
            let text = format!(
                r#"{{"version":{version},"watches":[{record}],"generations":[["a.service",3]]}}"#
            );
            fs::write(dir.path().join("state.json"), text).expect("write");
            let mut store = StateStore::new(dir.path().to_owned());
            let loaded = store.load().expect("load");
            assert_eq!(watches(&loaded), ["a.service"], "version {version}");
            assert_eq!(loaded.state.generations, [("a.service".to_owned(), 3)]);
            // The first snapshot after it is of the current version, with journal 1.
            store
                .save(StateSave::Snapshot(loaded.state))
                .expect("snapshot");
            let saved: serde_json::Value =
                serde_json::from_slice(&fs::read(dir.path().join("state.json")).expect("read"))
                    .expect("json");
            assert_eq!(saved["version"], STATE_VERSION, "version {version}");
            assert_eq!(saved["journal"], 1, "version {version}");
        }
    }

    #[test]
    fn changes_before_a_snapshot_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = StateStore::new(dir.path().to_owned());
        let error = store.save(put("a.service")).expect_err("no journal");
        assert!(error.to_string().contains("before a snapshot"), "{error}");
        assert!(entries(dir.path()).is_empty());
    }

    #[test]
    fn the_journal_is_compacted_once_longer_than_a_mebibyte_or_twice_the_snapshot() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = StateStore::new(dir.path().to_owned());
        assert!(!store.wants_snapshot(), "no journal yet");
        store
            .save(StateSave::Snapshot(AgentState::default()))
            .expect("snapshot");
        let big = StateSave::Changes(ChangeSet {
            watches: (0..1500)
                .map(|n| record(&format!("u{n}.service")))
                .collect(),
            ..ChangeSet::default()
        });
        store.save(big).expect("append");
        assert!(!store.wants_snapshot(), "under 1 MiB");
        let bigger = StateSave::Changes(ChangeSet {
            watches: (0..4000)
                .map(|n| record(&format!("u{n}.service")))
                .collect(),
            ..ChangeSet::default()
        });
        store.save(bigger).expect("append");
        assert!(store.wants_snapshot(), "over 1 MiB");
        let loaded = load(dir.path());
        store
            .save(StateSave::Snapshot(loaded.state))
            .expect("compact");
        assert!(!store.wants_snapshot(), "a new journal");
        store.save(put("x.service")).expect("append");
        assert!(!store.wants_snapshot(), "under twice the snapshot");
    }
}

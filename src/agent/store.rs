//! The durable watch set: the snapshot (`state.rs`) and the journal that follows it
//! (`journal.rs`), loaded together at start and written as the core asks: a change set is
//! appended to the journal, a snapshot replaces the snapshot file and starts a new journal.
//!
//! Every step of a compaction leaves a loadable pair: the new snapshot is renamed into place
//! first, naming a journal one higher than the old one, and the old journal is then replaced
//! by the new journal's header. Killed in between, the old journal is older than the snapshot
//! and is not applied (its changes are in the snapshot).

use std::os::fd::AsFd;
use std::path::PathBuf;

use super::journal::{self, JOURNAL_FILE_NAME, JournalFile, Replayed};
use super::state::{AgentState, Found, StateError, StateFile, StateSave, now_seconds, open_dir};

/// The journal is compacted into a new snapshot once it is longer than this, or than twice the
/// last snapshot (so a compaction costs at most as much as the appends since the last one).
const COMPACT_AT_LEAST: u64 = 1 << 20;

/// The state as loaded at start.
#[derive(Debug)]
pub struct Loaded {
    pub state: AgentState,
    /// Something the operator should hear of that is not an error (a killed append dropped, a
    /// journal older than the snapshot left out).
    pub note: Option<String>,
}

/// The snapshot and the journal of one state directory.
#[derive(Debug)]
pub struct StateStore {
    snapshot: StateFile,
    /// The journal being appended to, once a snapshot was written by this agent.
    journal: Option<JournalFile>,
    /// The number the next snapshot names: above every journal on disk.
    next_journal: u64,
    snapshot_len: u64,
}

impl StateStore {
    /// The store of the state directory `dir`.
    pub fn new(dir: PathBuf) -> StateStore {
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
    pub fn load(&mut self) -> Result<Loaded, StateError> {
        let mut state = match self.snapshot.load() {
            Ok(state) => state,
            Err(error) => {
                if matches!(error, StateError::Corrupt { .. }) {
                    self.move_journal_aside(now_seconds());
                }
                return Err(error);
            }
        };
        self.next_journal = state.journal + 1;
        let reason = match journal::read(&self.snapshot)? {
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
        let seconds = now_seconds();
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

    /// Writes a save: a snapshot replaces the snapshot file and starts a new journal; a change
    /// set is appended to the journal. Durable when it returns `Ok`, with the bytes written.
    pub fn save(&mut self, save: StateSave) -> Result<usize, StateError> {
        match save {
            StateSave::Snapshot(mut state) => {
                let number = self.next_journal;
                state.journal = number;
                // The old journal is useless from here, whatever happens next.
                self.journal = None;
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

    /// Whether the journal is long enough to be compacted into a snapshot.
    pub fn wants_snapshot(&self) -> bool {
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

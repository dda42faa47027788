//! The journal: what changed of the watch set since the last snapshot, one line per turn of
//! the agent that changed anything, appended and synced (group commit: one `fdatasync` a turn)
//! before anything that relies on it is carried out.
//!
//! `state.journal` holds JSON lines: a header `{"version":V,"journal":N}`, written whole and
//! atomically right after the snapshot that names journal `N`, then one line per turn,
//! `{"seq":S,"changes":{...}}`, numbered from 1 without a gap. A journal is applied only to the
//! snapshot of its number: an older one is what a compaction killed before it started the new
//! journal left behind, and its changes are in the snapshot already.
//!
//! A last line without its newline is an append that was killed: nothing it held was carried
//! out, so it is dropped (and said so). Anything else that is not exactly such a journal is
//! corrupt. Replaying is pure, so the simulator's model of the disk restarts through it too.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::fcntl::{self, OFlag};
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};

use super::saved::{AgentState, ChangeSet, OLDEST_JOURNAL_VERSION, STATE_VERSION};
use super::state::{Found, StateError, StateFile, check, io_error, open_dir};

/// The journal's name in the state directory.
pub(super) const JOURNAL_FILE_NAME: &str = "state.journal";

/// The first line of a journal: the format, and the number the snapshot it follows names.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    version: u32,
    journal: u64,
}

/// One turn's changes as written.
#[derive(Serialize)]
struct LineOut<'a> {
    seq: u64,
    changes: &'a ChangeSet,
}

/// One turn's changes as read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LineIn {
    seq: u64,
    changes: ChangeSet,
}

/// The header line of journal `journal`.
pub(super) fn header(journal: u64) -> Vec<u8> {
    let header = Header {
        version: STATE_VERSION,
        journal,
    };
    let mut bytes = serde_json::to_vec(&header).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// The line of change set number `seq`.
pub(super) fn line(seq: u64, changes: &ChangeSet) -> serde_json::Result<Vec<u8>> {
    // Room for a proven watch's line, about 700 bytes: serde_json's 128 would grow three times.
    let mut bytes = Vec::with_capacity(1024);
    serde_json::to_writer(&mut bytes, &LineOut { seq, changes })?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// What replaying a journal did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Replayed {
    /// The journal followed the snapshot: this many change sets were applied, and the bytes
    /// of a last append that was killed half-way (0: none) dropped.
    Applied { changes: u64, torn_bytes: usize },
    /// The journal precedes the snapshot (a compaction was killed before it started the new
    /// journal): nothing of it applies.
    Stale { journal: u64 },
}

/// Applies the journal `bytes` to `state`, the snapshot read before it; or says why the
/// journal is corrupt (then `state` is unchanged).
pub(super) fn replay(state: &mut AgentState, bytes: &[u8]) -> Result<Replayed, String> {
    // Everything after the last newline is an append that did not finish.
    let (complete, torn_bytes) = match bytes.iter().rposition(|&b| b == b'\n') {
        Some(end) => (&bytes[..=end], bytes.len() - end - 1),
        None => return Err("the journal has no complete header".to_owned()),
    };
    // Decoded from text, as everything else the agent reads: one parser per type (from bytes
    // as well, the binary was 12 KB larger).
    let complete = std::str::from_utf8(&complete[..complete.len() - 1])
        .map_err(|error| format!("the journal is not UTF-8: {error}"))?;
    let mut lines = complete.split('\n');
    let header: Header = serde_json::from_str(lines.next().unwrap_or_default())
        .map_err(|error| format!("the journal's header: {error}"))?;
    if !(OLDEST_JOURNAL_VERSION..=STATE_VERSION).contains(&header.version) {
        return Err(format!(
            "the journal's version is {}, this agent reads {OLDEST_JOURNAL_VERSION} to \
             {STATE_VERSION}",
            header.version
        ));
    }
    if header.journal < state.journal {
        return Ok(Replayed::Stale {
            journal: header.journal,
        });
    }
    if header.journal > state.journal {
        return Err(format!(
            "journal {} follows a snapshot this one (naming journal {}) is older than",
            header.journal, state.journal
        ));
    }
    let mut changes = Vec::new();
    for (expected, text) in (1u64..).zip(lines) {
        let line: LineIn = serde_json::from_str(text)
            .map_err(|error| format!("change set {expected} of the journal: {error}"))?;
        if line.seq != expected {
            return Err(format!(
                "change set {expected} of the journal is numbered {}",
                line.seq
            ));
        }
        changes.push(line.changes);
    }
    let mut replayed = state.clone();
    replayed.apply(&changes);
    check(&replayed).map_err(|reason| format!("after the journal, {reason}"))?;
    *state = replayed;
    Ok(Replayed::Applied {
        changes: changes.len() as u64,
        torn_bytes,
    })
}

/// The journal open for appending.
#[derive(Debug)]
pub(super) struct JournalFile {
    file: File,
    path: PathBuf,
    len: u64,
    next_seq: u64,
    /// An append since the last sync.
    unsynced: bool,
}

impl JournalFile {
    /// Starts journal `journal` in the directory of `state_file`, whose snapshot names it:
    /// replaces the journal there atomically with the header alone, and opens it to append.
    pub(super) fn start(state_file: &StateFile, journal: u64) -> Result<JournalFile, StateError> {
        let header = header(journal);
        state_file.replace(JOURNAL_FILE_NAME, &header)?;
        let path = state_file.dir().join(JOURNAL_FILE_NAME);
        let dirfd = open_dir(state_file.dir())
            .map_err(|errno| io_error(state_file.dir(), "open state directory", errno))?;
        let fd = fcntl::openat(
            dirfd.as_fd(),
            JOURNAL_FILE_NAME,
            OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| io_error(&path, "open to append", errno))?;
        Ok(JournalFile {
            file: File::from(fd),
            path,
            len: header.len() as u64,
            next_seq: 1,
            unsynced: false,
        })
    }

    /// Appends one turn's changes, unsynced: in the page cache, which an agent killed after it
    /// finds at its restart, but not on disk before [`JournalFile::sync`]. Returns the bytes
    /// written. After a failure the journal may end in part of the line, which a load drops:
    /// the agent must stop.
    pub(super) fn append(&mut self, changes: &ChangeSet) -> Result<usize, StateError> {
        let bytes = line(self.next_seq, changes)
            .map_err(|error| io_error(&self.path, "encode a change set for", error))?;
        self.file
            .write_all(&bytes)
            .map_err(|error| io_error(&self.path, "append to", error))?;
        self.next_seq += 1;
        self.len += bytes.len() as u64;
        self.unsynced = true;
        Ok(bytes.len())
    }

    /// Makes every append so far durable on disk (one `fdatasync`, for all of them); `false`
    /// if there was none to sync.
    pub(super) fn sync(&mut self) -> Result<bool, StateError> {
        if !self.unsynced {
            return Ok(false);
        }
        // The file's size is metadata fdatasync writes too; its times are not needed.
        self.file
            .sync_data()
            .map_err(|error| io_error(&self.path, "sync", error))?;
        self.unsynced = false;
        Ok(true)
    }

    /// Whether an append is not yet synced.
    pub(super) fn unsynced(&self) -> bool {
        self.unsynced
    }

    /// The journal's length in bytes.
    pub(super) fn len(&self) -> u64 {
        self.len
    }
}

/// Reads what is at the journal's name, if anything.
pub(super) fn read(state_file: &StateFile) -> Result<Found, StateError> {
    let dirfd = match open_dir(state_file.dir()) {
        Ok(dirfd) => dirfd,
        Err(Errno::ENOENT) => return Ok(Found::Nothing),
        Err(errno) => return Err(io_error(state_file.dir(), "open state directory", errno)),
    };
    state_file.read(dirfd.as_fd(), JOURNAL_FILE_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::saved::SavedWatch;

    fn record(unit: &str, invocation: &str) -> SavedWatch {
        SavedWatch::bare(unit, invocation)
    }

    /// A snapshot naming journal 5, with two watches and a generation.
    fn snapshot() -> AgentState {
        AgentState {
            watches: vec![record("a.service", "1"), record("b.service", "2")],
            generations: vec![("a.service".to_owned(), 1)],
            boot_id: Some("boot".to_owned()),
            journal: 5,
            ..AgentState::default()
        }
    }

    /// Three turns: c is watched and a's generation 2 taken; a stops being watched and b's
    /// record changes; the generation is given back.
    fn turns() -> Vec<ChangeSet> {
        vec![
            ChangeSet {
                watches: vec![record("c.service", "3")],
                generations: vec![("a.service".to_owned(), 2)],
                ..ChangeSet::default()
            },
            ChangeSet {
                watches: vec![SavedWatch {
                    stop_requested: true,
                    ..record("b.service", "2")
                }],
                removed: vec!["a.service".to_owned()],
                ..ChangeSet::default()
            },
            ChangeSet {
                generations_freed: vec![("a.service".to_owned(), 2)],
                ..ChangeSet::default()
            },
        ]
    }

    fn journal(number: u64, changes: &[ChangeSet]) -> Vec<u8> {
        let mut bytes = header(number);
        for (seq, change) in (1..).zip(changes) {
            bytes.extend(line(seq, change).expect("encode"));
        }
        bytes
    }

    fn after(turns: usize) -> AgentState {
        let mut state = snapshot();
        state.apply(&turns_so_far(turns));
        state
    }

    fn turns_so_far(n: usize) -> Vec<ChangeSet> {
        turns().into_iter().take(n).collect()
    }

    #[test]
    fn a_journal_replays_onto_the_snapshot_it_follows() {
        let mut state = snapshot();
        let replayed = replay(&mut state, &journal(5, &turns())).expect("replay");
        assert_eq!(
            replayed,
            Replayed::Applied {
                changes: 3,
                torn_bytes: 0
            }
        );
        let expected = AgentState {
            watches: vec![
                SavedWatch {
                    stop_requested: true,
                    ..record("b.service", "2")
                },
                record("c.service", "3"),
            ],
            ..snapshot()
        };
        assert_eq!(state, expected);
    }

    #[test]
    fn change_sets_applied_one_by_one_or_all_at_once_agree() {
        let mut one_by_one = snapshot();
        for change in turns() {
            one_by_one.apply([&change]);
        }
        assert_eq!(one_by_one, after(3));
    }

    #[test]
    fn a_last_append_cut_anywhere_is_dropped_and_the_rest_applied() {
        let whole = journal(5, &turns());
        let last = line(3, &turns()[2]).expect("encode");
        let before = whole.len() - last.len();
        // Every cut short of the newline, including the whole line without it.
        for cut in 0..last.len() {
            let mut state = snapshot();
            let replayed = replay(&mut state, &whole[..before + cut]).expect("replay");
            assert_eq!(
                replayed,
                Replayed::Applied {
                    changes: 2,
                    torn_bytes: cut
                },
                "cut at {cut}"
            );
            assert_eq!(state, after(2), "cut at {cut}");
        }
    }

    #[test]
    fn a_journal_older_than_its_snapshot_is_left_out() {
        // A compaction killed after its snapshot and before its new journal.
        let mut state = snapshot();
        let replayed = replay(&mut state, &journal(4, &turns())).expect("replay");
        assert_eq!(replayed, Replayed::Stale { journal: 4 });
        assert_eq!(state, snapshot());
    }

    #[test]
    fn damage_other_than_a_cut_last_append_is_corrupt_and_changes_nothing() {
        let good = journal(5, &turns());
        let lines: Vec<&[u8]> = good.split_inclusive(|&b| b == b'\n').collect();
        let with_line = |index: usize, text: &str| {
            let mut bytes = Vec::new();
            for (i, line) in lines.iter().enumerate() {
                if i == index {
                    bytes.extend_from_slice(text.as_bytes());
                } else {
                    bytes.extend_from_slice(line);
                }
            }
            bytes
        };
        let missing_second: Vec<u8> = [lines[0], lines[1], lines[3]].concat();
        let first_twice: Vec<u8> = [lines[0], lines[1], lines[1], lines[2]].concat();
        let cases = [
            (b"".to_vec(), "no complete header"),
            (b"{\"version\":3,\"jou".to_vec(), "no complete header"),
            (journal(6, &turns()), "follows a snapshot"),
            (
                with_line(0, "{\"version\":2,\"journal\":5}\n"),
                "version is 2",
            ),
            (with_line(0, "[]\n"), "header"),
            (with_line(2, "garbage\n"), "change set 2 of the journal"),
            (with_line(2, "\n"), "change set 2 of the journal"),
            (
                with_line(2, "{\"seq\":2,\"changes\":{},\"extra\":1}\n"),
                "unknown field",
            ),
            (missing_second, "change set 2 of the journal is numbered 3"),
            (first_twice, "change set 2 of the journal is numbered 1"),
            (
                with_line(
                    1,
                    "{\"seq\":1,\"changes\":{\"watches\":[{\"unit\":\"../x\",\"invocation\":\"\",\
                     \"stop_requested\":false,\"gen\":null,\"run_dir\":null,\"record\":null,\
                     \"launch_file\":null,\"stop_succeeded\":false,\"proof\":null}]}}\n",
                ),
                "invalid unit name",
            ),
            (
                with_line(
                    1,
                    "{\"seq\":1,\"changes\":{\"generations\":[[\"c.service\",0]]}}\n",
                ),
                "is 0",
            ),
        ];
        for (bytes, words) in cases {
            let mut state = snapshot();
            let reason = replay(&mut state, &bytes).expect_err("corrupt");
            assert!(
                reason.contains(words),
                "{}: {reason}",
                String::from_utf8_lossy(&bytes)
            );
            assert_eq!(state, snapshot());
        }
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_replay_without_a_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let mut state = snapshot();
            let _ = replay(&mut state, &bytes);
            let mut framed = header(5);
            framed.extend(&bytes);
            let _ = replay(&mut state, &framed);
        }
    }
}

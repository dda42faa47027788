//! The agent's durable watch set as a whole ([`AgentState`], its values in `saved.rs`) in its
//! snapshot file, `state.json` under the state directory,
//! written atomically and read once at start. Between snapshots the changes go to the journal
//! (`journal.rs`); `store.rs` puts the two together.
//!
//! It must never lose a state silently: a file that cannot be read back exactly is renamed
//! aside (never deleted, never overwritten) and reported, and a save either replaces the whole
//! file or leaves the old one intact. It never writes through a symlink and never leaves a
//! temporary file behind. It knows nothing of D-Bus, cgroups or the loop.

use std::collections::HashSet;
use std::fs::{self, DirBuilder, File};
use std::hash::{BuildHasher, RandomState};
use std::io::{self, BufWriter, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{self, OFlag, RenameFlags};
use nix::sys::stat::Mode;
use nix::unistd::{self, UnlinkatFlags};
use serde::Deserialize;

use super::saved::{AgentState, STATE_VERSION};
use crate::atomic_file;
use crate::clock;
use crate::unit_name;

/// The oldest version this agent still reads; the fields added since read as absent.
const OLDEST_READABLE_VERSION: u32 = 1;

/// The state file's name in the state directory.
pub(super) const STATE_FILE_NAME: &str = "state.json";

/// What a temporary file's name starts with: `.state.json.<pid>.<random>.tmp`, and the
/// journal's `.state.journal.<pid>.<random>.tmp`.
const TEMP_PREFIX: &str = ".state.";

/// What a temporary file's name ends with.
const TEMP_SUFFIX: &str = ".tmp";

/// The state file's mode: it names units and paths, which are nobody else's business.
pub(super) const FILE_MODE: u32 = 0o600;

/// The mode of a state directory this module creates.
pub(crate) const DIR_MODE: u32 = 0o700;

/// How many names `state.json.corrupt-<seconds>[.<n>]` are tried before giving up on moving a
/// corrupt file aside; far more than can collide in one second.
const ASIDE_ATTEMPTS: u32 = 1000;

/// Just the version of a file that does not parse as a whole, to tell a newer format from
/// damage.
#[derive(Deserialize)]
struct VersionOnly {
    version: u32,
}

/// Why the state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The system call named by `action` failed on `path`.
    #[error("{action} {path}: {source}")]
    Io {
        path: PathBuf,
        action: &'static str,
        source: io::Error,
    },
    /// The file at `path` is not a state this agent can read; it was moved to `moved_to`, or
    /// is still at `path` when that failed (then `reason` says why too, and a save will
    /// replace it).
    #[error("state file {path} is corrupt ({reason}); {}", where_now(.moved_to))]
    Corrupt {
        path: PathBuf,
        moved_to: Option<PathBuf>,
        reason: String,
    },
}

/// Where a corrupt state file is now, for [`StateError::Corrupt`]'s message.
fn where_now(moved_to: &Option<PathBuf>) -> String {
    match moved_to {
        Some(moved_to) => format!("moved it aside to {}", moved_to.display()),
        None => "it is still there".to_owned(),
    }
}

/// Builds a [`StateError::Io`].
pub(super) fn io_error(
    path: &Path,
    action: &'static str,
    source: impl Into<io::Error>,
) -> StateError {
    StateError::Io {
        path: path.to_owned(),
        action,
        source: source.into(),
    }
}

/// A writer that counts the bytes written through it.
struct Counted<W> {
    inner: W,
    bytes: usize,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The state file `state.json` in a state directory.
#[derive(Clone, Debug)]
pub(crate) struct StateFile {
    dir: PathBuf,
    path: PathBuf,
}

/// What was found at a file's name.
pub(super) enum Found {
    /// Nothing: the agent's first start.
    Nothing,
    /// Something that is not a regular file; says what.
    NotAFile(&'static str),
    /// A regular file's bytes.
    Bytes(Vec<u8>),
}

impl StateFile {
    /// The state file of the state directory `dir`.
    pub(crate) fn new(dir: PathBuf) -> StateFile {
        let path = dir.join(STATE_FILE_NAME);
        StateFile { dir, path }
    }

    /// The state file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the state, once, at start.
    ///
    /// A missing directory or file is an empty state (first start). A file that is not exactly
    /// a state of [`STATE_VERSION`] (truncated, not JSON, the wrong shape, an unknown field or
    /// version, an invalid unit name, generation 0, a unit watched twice unproven) is renamed
    /// aside to `state.json.corrupt-<unix seconds>` (with `.<n>` added if that name exists; it
    /// is never deleted nor overwritten) and reported as [`StateError::Corrupt`]; the caller
    /// logs it loudly and starts empty. Temporary files left by a save that was killed are
    /// removed, so this must only be called by the one agent that owns the directory.
    pub(crate) fn load(&self) -> Result<AgentState, StateError> {
        let dirfd = match open_dir(&self.dir) {
            Ok(dirfd) => dirfd,
            Err(Errno::ENOENT) => return Ok(AgentState::default()),
            Err(errno) => return Err(io_error(&self.dir, "open state directory", errno)),
        };
        self.remove_stale_temp_files(dirfd.as_fd());
        let reason = match self.read(dirfd.as_fd(), STATE_FILE_NAME)? {
            Found::Nothing => return Ok(AgentState::default()),
            Found::NotAFile(what) => format!("it is {what}"),
            Found::Bytes(bytes) => match parse(&bytes) {
                Ok(state) => return Ok(state),
                Err(reason) => reason,
            },
        };
        Err(self.move_aside(
            dirfd.as_fd(),
            STATE_FILE_NAME,
            clock::wall_seconds(),
            reason,
        ))
    }

    /// Moves the snapshot aside after it was read well, because the journal that follows it
    /// is corrupt: the two are kept together as evidence. Returns where it went, if anywhere.
    pub(super) fn move_snapshot_aside(&self, seconds: u64) -> Option<PathBuf> {
        let dirfd = open_dir(&self.dir).ok()?;
        match self.move_aside(dirfd.as_fd(), STATE_FILE_NAME, seconds, String::new()) {
            StateError::Corrupt { moved_to, .. } => moved_to,
            StateError::Io { .. } => None,
        }
    }

    /// The state directory.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes the state atomically.
    ///
    /// The state goes to a temporary file in the state directory (created exclusively, never
    /// through a symlink, mode 0600 whatever the umask), which is synced and renamed over
    /// `state.json` (replacing a symlink there rather than writing through it); then the
    /// directory is synced. On failure the temporary file is removed and the old `state.json`
    /// is intact. The directory is created (mode 0700) if missing. Returns the bytes written.
    pub(crate) fn save(&self, state: &AgentState) -> Result<usize, StateError> {
        // Compact, and encoded straight into the file: with 10,000 watches this is 2-4 MB,
        // which a buffer would hold whole at every compaction, the agent's peak of memory.
        let mut written = 0;
        self.replace_with(STATE_FILE_NAME, |file| {
            let mut out = Counted {
                inner: BufWriter::new(file),
                bytes: 0,
            };
            serde_json::to_writer(&mut out, state)?;
            out.write_all(b"\n")?;
            out.inner.flush()?;
            written = out.bytes;
            Ok(())
        })?;
        Ok(written)
    }

    /// Replaces the file `name` in the state directory with `contents` atomically, through a
    /// temporary file `.<name>.<pid>.<random>.tmp`, creating the directory if missing.
    pub(super) fn replace(&self, name: &str, contents: &[u8]) -> Result<(), StateError> {
        self.replace_with(name, |file| file.write_all(contents))
    }

    /// [`StateFile::replace`] with what `write` writes to the file.
    fn replace_with(
        &self,
        name: &str,
        write: impl FnOnce(&mut File) -> io::Result<()>,
    ) -> Result<(), StateError> {
        let dirfd = self.open_or_create_dir()?;
        let temp_name = format!(
            ".{name}.{}.{:016x}{TEMP_SUFFIX}",
            std::process::id(),
            // RandomState is keyed from the OS's randomness, so no crate is needed for this.
            RandomState::new().hash_one(name)
        );
        debug_assert!(temp_name.starts_with(TEMP_PREFIX));
        atomic_file::replace_with(dirfd.as_fd(), &self.dir, name, &temp_name, FILE_MODE, write)
            .map_err(|e| io_error(&e.path, e.action, e.source))
    }

    /// Reads what is at `name` in the state directory, without following a symlink there and
    /// without blocking on a FIFO.
    pub(super) fn read(&self, dirfd: BorrowedFd<'_>, name: &str) -> Result<Found, StateError> {
        let path = self.dir.join(name);
        let fd = match fcntl::openat(
            dirfd,
            name,
            OFlag::O_RDONLY
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC
                | OFlag::O_NONBLOCK
                | OFlag::O_NOCTTY,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(Found::Nothing),
            Err(Errno::ELOOP) => return Ok(Found::NotAFile("a symlink")),
            Err(errno) => return Err(io_error(&path, "open", errno)),
        };
        let mut file = File::from(fd);
        let metadata = file
            .metadata()
            .map_err(|error| io_error(&path, "stat", error))?;
        if metadata.is_dir() {
            return Ok(Found::NotAFile("a directory"));
        }
        if !metadata.is_file() {
            return Ok(Found::NotAFile("not a regular file"));
        }
        // The length is a hint for the buffer only; the read goes to the end whatever it is.
        let mut bytes = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
        file.read_to_end(&mut bytes)
            .map_err(|error| io_error(&path, "read", error))?;
        Ok(Found::Bytes(bytes))
    }

    /// Renames the corrupt file `name` to the first free `<name>.corrupt-<seconds>[.<n>]` and
    /// returns the error that reports it.
    pub(super) fn move_aside(
        &self,
        dirfd: BorrowedFd<'_>,
        name: &str,
        seconds: u64,
        reason: String,
    ) -> StateError {
        let path = self.dir.join(name);
        let base = format!("{name}.corrupt-{seconds}");
        let mut failure = None;
        for attempt in 0..ASIDE_ATTEMPTS {
            let aside = match attempt {
                0 => base.clone(),
                n => format!("{base}.{n}"),
            };
            // RENAME_NOREPLACE: an earlier corrupt file of the same name is evidence too.
            match fcntl::renameat2(
                dirfd,
                name,
                dirfd,
                aside.as_str(),
                RenameFlags::RENAME_NOREPLACE,
            ) {
                Ok(()) => {
                    // Best effort: the file is aside either way; a crash may only bring it back.
                    let _ = unistd::fsync(dirfd);
                    return StateError::Corrupt {
                        path,
                        moved_to: Some(self.dir.join(aside)),
                        reason,
                    };
                }
                Err(Errno::EEXIST) => continue,
                Err(errno) => {
                    failure = Some(errno.to_string());
                    break;
                }
            }
        }
        let failure = failure.unwrap_or_else(|| format!("{ASIDE_ATTEMPTS} names taken"));
        StateError::Corrupt {
            path,
            moved_to: None,
            reason: format!("{reason}; moving it aside failed: {failure}"),
        }
    }

    /// Removes the temporary files of saves that were killed before their rename.
    fn remove_stale_temp_files(&self, dirfd: BorrowedFd<'_>) {
        // Best effort: a leftover temporary file wastes space but is never read.
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            if name.starts_with(TEMP_PREFIX) && name.ends_with(TEMP_SUFFIX) {
                let _ = unistd::unlinkat(dirfd, name, UnlinkatFlags::NoRemoveDir);
            }
        }
    }

    /// Opens the state directory, creating it (and its parents) with mode 0700 if missing.
    pub(super) fn open_or_create_dir(&self) -> Result<OwnedFd, StateError> {
        match open_dir(&self.dir) {
            Err(Errno::ENOENT) => {}
            opened => {
                return opened.map_err(|errno| io_error(&self.dir, "open state directory", errno));
            }
        }
        DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(&self.dir)
            .map_err(|error| io_error(&self.dir, "create state directory", error))?;
        // The new directory's own entry must be durable before a file in it can be.
        let parent = match self.dir.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        let parentfd =
            open_dir(parent).map_err(|errno| io_error(parent, "open directory", errno))?;
        unistd::fsync(&parentfd).map_err(|errno| io_error(parent, "sync directory", errno))?;
        open_dir(&self.dir).map_err(|errno| io_error(&self.dir, "open state directory", errno))
    }
}

/// Opens a directory for `*at` calls and for fsync. The state directory is the operator's
/// choice, so a symlink to it is followed.
pub(super) fn open_dir(dir: &Path) -> nix::Result<OwnedFd> {
    fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Parses and checks a state file's bytes, or says why they are not a state.
fn parse(bytes: &[u8]) -> Result<AgentState, String> {
    // From text, as the journal (one parser per type).
    let text =
        std::str::from_utf8(bytes).map_err(|error| format!("the state is not UTF-8: {error}"))?;
    let state: AgentState =
        serde_json::from_str(text).map_err(|error| {
            match serde_json::from_str::<VersionOnly>(text) {
                Ok(VersionOnly { version }) if !readable(version) => unknown_version(version),
                _ => error.to_string(),
            }
        })?;
    if !readable(state.version) {
        return Err(unknown_version(state.version));
    }
    check(&state)?;
    Ok(state)
}

fn readable(version: u32) -> bool {
    (OLDEST_READABLE_VERSION..=STATE_VERSION).contains(&version)
}

/// The reason given for a file of another version.
fn unknown_version(version: u32) -> String {
    format!(
        "unknown version {version}, this agent reads versions {OLDEST_READABLE_VERSION} to {STATE_VERSION}"
    )
}

/// Checks what the format's shape cannot: valid unit names, no generation 0, and no unit
/// watched twice before its proof.
pub(super) fn check(state: &AgentState) -> Result<(), String> {
    let mut unproven = HashSet::new();
    for watch in &state.watches {
        unit_name::validate(&watch.unit).map_err(|error| format!("a watch has an {error}"))?;
        if let Some(id) = &watch.unit_id {
            unit_name::validate(id)
                .map_err(|error| format!("the watch of {} names an {error}", watch.unit))?;
        }
        if watch.generation == Some(0) {
            return Err(format!("the watch of {} has generation 0", watch.unit));
        }
        if watch.proof.is_none() && !unproven.insert(watch.unit.as_str()) {
            return Err(format!("{} is watched twice unproven", watch.unit));
        }
    }
    for (unit, generation) in &state.generations {
        unit_name::validate(unit).map_err(|error| format!("a generation has an {error}"))?;
        if *generation == 0 {
            return Err(format!("a generation of {unit} is 0"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::saved::{ProofJson, SavedProcess, SavedWatch};
    use crate::record_name::RecordName;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn watch(unit: &str) -> SavedWatch {
        SavedWatch::bare(unit, "")
    }

    fn sample_state() -> AgentState {
        let full = SavedWatch {
            unit: "app@1.service".to_owned(),
            invocation: "6f6c8d4b3b33415a9c74b562581b76a5".to_owned(),
            stop_requested: true,
            generation: Some(7),
            run_dir: Some(PathBuf::from("/run/app")),
            record: Some(RecordName::parse("exit-6f6c.json").expect("a valid name")),
            launch_file: Some(PathBuf::from("/var/lib/app/launch-7")),
            stop_succeeded: true,
            proof: None,
            control_group: Some("/app.slice/app@1.service".to_owned()),
            stop_unsent: true,
            release_unfinished: false,
            unit_id: Some("real-app@1.service".to_owned()),
            held: vec![
                SavedProcess {
                    pid: 121,
                    start: 426,
                    parent: Some(0),
                    session: Some(121),
                },
                SavedProcess {
                    pid: 140,
                    start: 2582,
                    parent: None,
                    session: None,
                },
            ],
        };
        let proven = SavedWatch {
            proof: Some(
                ProofJson::from_json(
                    &serde_json::json!({"type": "proven", "unit": "backup.service"}),
                )
                .expect("encode"),
            ),
            release_unfinished: true,
            ..watch("backup.service")
        };
        AgentState {
            version: STATE_VERSION,
            // A proven watch and a fresh one of the same unit may coexist.
            watches: vec![full, proven, watch("backup.service")],
            generations: vec![("app@1.service".to_owned(), 7)],
            boot_id: Some("3f1e0c5a-93c3-4cd0-9a4b-5e2b1d0c8a77".to_owned()),
            journal: 12,
            offset_floors: vec![(15_000_000, 40_000_000_000)],
        }
    }

    use crate::atomic_file::dir_entries as entries;

    /// Loads a file expected to be corrupt; checks that it moved aside with its bytes intact
    /// and that the next load starts empty; returns the reason and where it went.
    fn load_corrupt(state_file: &StateFile, original: &[u8]) -> (String, PathBuf) {
        let (moved_to, reason) = match state_file.load() {
            Err(StateError::Corrupt {
                path,
                moved_to: Some(moved_to),
                reason,
            }) => {
                assert_eq!(path, state_file.path());
                (moved_to, reason)
            }
            other => panic!("expected a corrupt file moved aside, got {other:?}"),
        };
        let name = moved_to.file_name().expect("name").to_string_lossy();
        assert!(name.starts_with("state.json.corrupt-"), "{name}");
        assert_eq!(fs::read(&moved_to).expect("read moved file"), original);
        assert!(!state_file.path().exists());
        assert_eq!(
            state_file.load().expect("load again"),
            AgentState::default()
        );
        (reason, moved_to)
    }

    #[test]
    fn round_trip_in_compact_json() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state_file = StateFile::new(dir.path().to_owned());
        state_file.save(&sample_state()).expect("save");
        assert_eq!(state_file.load().expect("load"), sample_state());
        let text = fs::read_to_string(state_file.path()).expect("read");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.ends_with("}\n") && !text.contains(": "), "{text}");
        assert!(text.contains("\"gen\":7"), "{text}");
    }

    #[test]
    fn a_missing_file_or_directory_is_an_empty_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        for state_dir in [dir.path().to_owned(), dir.path().join("missing")] {
            let state = StateFile::new(state_dir).load().expect("load");
            assert_eq!(state, AgentState::default());
            assert_eq!(state.version, STATE_VERSION);
        }
        assert!(entries(dir.path()).is_empty());
    }

    #[test]
    fn a_truncated_file_is_moved_aside_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state_file = StateFile::new(dir.path().to_owned());
        state_file.save(&sample_state()).expect("save");
        let bytes = fs::read(state_file.path()).expect("read");
        let half = &bytes[..bytes.len() / 2];
        fs::write(state_file.path(), half).expect("truncate");
        let (reason, moved_to) = load_corrupt(&state_file, half);
        assert!(reason.contains("EOF"), "{reason}");
        assert_eq!(
            entries(dir.path()),
            [moved_to.file_name().expect("name").to_string_lossy()]
        );
    }

    #[test]
    fn files_that_are_not_a_state_are_moved_aside() {
        let unit_json = |unit: &str| serde_json::to_string(&watch(unit)).expect("encode");
        let state_of = |watches: &[String], generations: &str| {
            format!(
                r#"{{"version":1,"watches":[{}],"generations":{generations}}}"#,
                watches.join(",")
            )
        };
        // (file contents, words the reason must contain)
        let cases = [
            ("".to_owned(), "EOF"),
            ("garbage\u{0}\u{ff}".to_owned(), "expected value"),
            ("[1,2,3]".to_owned(), "invalid type"),
            (r#"{"version":1}"#.to_owned(), "missing field"),
            (
                r#"{"version":0,"watches":[],"generations":[]}"#.to_owned(),
                "unknown version 0",
            ),
            (
                r#"{"version":5,"watches":"new shape","extra":true}"#.to_owned(),
                "unknown version 5",
            ),
            (
                r#"{"version":1,"watches":[],"generations":[],"extra":1}"#.to_owned(),
                "unknown field",
            ),
            (state_of(&[], "[]") + "trailing", "trailing characters"),
            (
                state_of(&[unit_json("no-suffix")], "[]"),
                "invalid unit name",
            ),
            (
                state_of(
                    &[unit_json("a.service")
                        .replace("\"gen\":null", "\"unit_id\":\"../x\",\"gen\":null")],
                    "[]",
                ),
                "the watch of a.service names an invalid unit name",
            ),
            (
                state_of(&[unit_json("a.service"), unit_json("a.service")], "[]"),
                "a.service is watched twice unproven",
            ),
            (
                state_of(
                    &[unit_json("a.service").replace("\"gen\":null", "\"gen\":0")],
                    "[]",
                ),
                "generation 0",
            ),
            (
                state_of(&[], r#"[["../x.service",1]]"#),
                "invalid unit name",
            ),
            (state_of(&[], r#"[["a.service",0]]"#), "is 0"),
            (state_of(&[], r#"[["a.service",-1]]"#), "invalid value"),
        ];
        for (contents, words) in cases {
            let dir = tempfile::tempdir().expect("tempdir");
            let state_file = StateFile::new(dir.path().to_owned());
            fs::write(state_file.path(), &contents).expect("write");
            let (reason, _) = load_corrupt(&state_file, contents.as_bytes());
            assert!(reason.contains(words), "{contents}: {reason}");
        }
    }

    #[test]
    fn a_symlink_or_directory_at_the_name_is_moved_aside_untouched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state_file = StateFile::new(dir.path().join("state"));
        fs::create_dir(dir.path().join("state")).expect("mkdir");
        let outside = dir.path().join("outside");
        let valid = serde_json::to_vec(&sample_state()).expect("encode");
        fs::write(&outside, &valid).expect("write outside");
        symlink(&outside, state_file.path()).expect("symlink");
        let (reason, moved_to) = match state_file.load() {
            Err(StateError::Corrupt {
                moved_to: Some(moved_to),
                reason,
                ..
            }) => (reason, moved_to),
            other => panic!("expected a corrupt file moved aside, got {other:?}"),
        };
        assert!(reason.contains("symlink"), "{reason}");
        assert_eq!(fs::read_link(&moved_to).expect("readlink"), outside);
        assert_eq!(fs::read(&outside).expect("read outside"), valid);

        fs::create_dir(state_file.path()).expect("mkdir state.json");
        match state_file.load() {
            Err(StateError::Corrupt {
                moved_to: Some(moved_to),
                reason,
                ..
            }) => {
                assert!(reason.contains("directory"), "{reason}");
                assert!(moved_to.is_dir());
            }
            other => panic!("expected a corrupt file moved aside, got {other:?}"),
        }
        assert_eq!(state_file.load().expect("load"), AgentState::default());
    }

    #[test]
    fn corrupt_files_in_the_same_second_do_not_overwrite_each_other() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state_file = StateFile::new(dir.path().to_owned());
        let dirfd = open_dir(dir.path()).expect("open dir");
        let mut moved = Vec::new();
        for contents in ["first", "second", "third"] {
            fs::write(state_file.path(), contents).expect("write");
            match state_file.move_aside(
                dirfd.as_fd(),
                STATE_FILE_NAME,
                1_700_000_000,
                "test".to_owned(),
            ) {
                StateError::Corrupt {
                    moved_to: Some(moved_to),
                    ..
                } => moved.push((moved_to, contents)),
                other => panic!("expected a move aside, got {other:?}"),
            }
        }
        let names: Vec<String> = moved
            .iter()
            .map(|(path, _)| {
                path.file_name()
                    .expect("name")
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(
            names,
            [
                "state.json.corrupt-1700000000",
                "state.json.corrupt-1700000000.1",
                "state.json.corrupt-1700000000.2"
            ]
        );
        for (path, contents) in moved {
            assert_eq!(fs::read_to_string(path).expect("read"), contents);
        }
        // Through load, with the real clock: two loads never share a name either.
        fs::write(state_file.path(), "fourth").expect("write");
        let (_, fourth) = load_corrupt(&state_file, b"fourth");
        fs::write(state_file.path(), "fifth").expect("write");
        let (_, fifth) = load_corrupt(&state_file, b"fifth");
        assert_ne!(fourth, fifth);
        assert_eq!(fs::read(&fourth).expect("read"), b"fourth");
        assert_eq!(entries(dir.path()).len(), 5);
    }

    #[test]
    fn a_corrupt_file_that_cannot_move_aside_stays_and_says_so() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state_file = StateFile::new(dir.path().to_owned());
        let dirfd = open_dir(dir.path()).expect("open dir");
        fs::write(dir.path().join("state.json.corrupt-9"), b"").expect("take name");
        for n in 1..ASIDE_ATTEMPTS {
            fs::write(dir.path().join(format!("state.json.corrupt-9.{n}")), b"").expect("take");
        }
        fs::write(state_file.path(), b"garbage").expect("write");
        match state_file.move_aside(dirfd.as_fd(), STATE_FILE_NAME, 9, "not json".to_owned()) {
            StateError::Corrupt {
                moved_to: None,
                reason,
                ..
            } => assert_eq!(reason, "not json; moving it aside failed: 1000 names taken"),
            other => panic!("expected a corrupt file left in place, got {other:?}"),
        }
        assert_eq!(fs::read(state_file.path()).expect("read"), b"garbage");
    }

    #[test]
    fn a_save_replaces_the_old_state_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state_file = StateFile::new(dir.path().to_owned());
        state_file.save(&sample_state()).expect("save");
        let mut newer = sample_state();
        newer.watches.truncate(1);
        newer.generations.push(("b.service".to_owned(), 1));
        state_file.save(&newer).expect("save again");
        assert_eq!(state_file.load().expect("load"), newer);
        assert_eq!(entries(dir.path()), ["state.json"]);
    }

    #[test]
    fn a_save_creates_the_directory_0700_and_the_file_0600() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state_dir = dir.path().join("lib").join("exitproof");
        let state_file = StateFile::new(state_dir.clone());
        state_file.save(&AgentState::default()).expect("save");
        let mode = |path: &Path| fs::metadata(path).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode(&state_dir), DIR_MODE);
        assert_eq!(mode(state_file.path()), FILE_MODE);
        assert_eq!(state_file.load().expect("load"), AgentState::default());
    }

    #[test]
    fn a_failed_save_leaves_no_temporary_file_and_the_old_state_intact() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state_file = StateFile::new(dir.path().to_owned());
        // As root a read-only directory does not stop a write; a directory at the name stops
        // the rename.
        fs::create_dir(state_file.path()).expect("mkdir");
        fs::write(state_file.path().join("inside"), b"keep").expect("fill");
        let err = state_file.save(&sample_state()).expect_err("save");
        assert!(
            matches!(&err, StateError::Io { path, action, .. }
                if path == state_file.path() && action.starts_with("rename")),
            "{err}"
        );
        assert_eq!(entries(dir.path()), ["state.json"]);
        assert_eq!(entries(state_file.path()), ["inside"]);
    }

    #[test]
    fn a_symlink_at_the_name_is_replaced_not_written_through() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state_dir = dir.path().join("state");
        fs::create_dir(&state_dir).expect("mkdir");
        let outside = dir.path().join("outside");
        fs::write(&outside, b"keep").expect("write outside");
        let state_file = StateFile::new(state_dir.clone());
        symlink(&outside, state_file.path()).expect("symlink");
        state_file.save(&sample_state()).expect("save");
        let written = fs::symlink_metadata(state_file.path()).expect("stat");
        assert!(written.file_type().is_file());
        assert_eq!(fs::read(&outside).expect("read outside"), b"keep");
        assert_eq!(state_file.load().expect("load"), sample_state());
        assert_eq!(entries(&state_dir), ["state.json"]);
    }

    #[test]
    fn load_removes_temporary_files_of_killed_saves_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state_file = StateFile::new(dir.path().to_owned());
        state_file.save(&sample_state()).expect("save");
        let stale = ".state.json.4242.00000000deadbeef.tmp";
        fs::write(dir.path().join(stale), b"{\"version\":1,").expect("write stale");
        fs::write(dir.path().join("other.tmp"), b"").expect("write other");
        assert_eq!(state_file.load().expect("load"), sample_state());
        assert_eq!(entries(dir.path()), ["other.tmp", "state.json"]);
    }

    #[test]
    fn errors_name_their_paths_in_lower_case() {
        let io = io_error(
            Path::new("/var/lib/exitproof/state.json"),
            "rename a temporary file to",
            Errno::EISDIR,
        );
        let moved = StateError::Corrupt {
            path: PathBuf::from("/s/state.json"),
            moved_to: Some(PathBuf::from("/s/state.json.corrupt-5")),
            reason: "unknown version 4, this agent reads versions 1 to 3".to_owned(),
        };
        let stuck = StateError::Corrupt {
            path: PathBuf::from("/s/state.json"),
            moved_to: None,
            reason: "it is a directory; moving it aside failed: EACCES".to_owned(),
        };
        let cases = [
            (
                io,
                "rename a temporary file to /var/lib/exitproof/state.json: Is a directory (os error 21)",
            ),
            (
                moved,
                "state file /s/state.json is corrupt (unknown version 4, this agent reads \
                 versions 1 to 3); moved it aside to /s/state.json.corrupt-5",
            ),
            (
                stuck,
                "state file /s/state.json is corrupt (it is a directory; moving it aside \
                 failed: EACCES); it is still there",
            ),
        ];
        for (error, text) in cases {
            assert_eq!(error.to_string(), text);
        }
    }
}

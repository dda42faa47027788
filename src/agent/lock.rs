//! One agent per state directory: an exclusive `flock` on `state.lock` in it, taken before the
//! state is read and held for the agent's life. A second agent on the same directory would
//! write a new snapshot and journal under the first, which would go on appending to a journal
//! no longer there: every change it acknowledged after that would be lost at its restart.
//!
//! The kernel releases the lock with the holder's last descriptor, so a crashed holder never
//! leaves it behind. The holder writes its pid into the file only so that a refused agent can
//! name it; nothing else trusts that number.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::state::{FILE_MODE, StateError, io_error};

/// The lock file's name in the state directory.
pub(crate) const LOCK_FILE_NAME: &str = "state.lock";

/// More than any pid's digits and a newline: what a refused agent reads of the file.
const MAX_PID_BYTES: u64 = 32;

/// The state directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds the lock: another agent runs on this state directory.
    #[error(
        "another agent{} holds the state directory {}: one agent per state directory; \
         stop it, or give this one its own --state-dir",
        holder_words(*.holder),
        .dir.display()
    )]
    Held {
        dir: PathBuf,
        /// The pid the holder wrote into the lock file, if it could be read.
        holder: Option<u32>,
    },
    /// The lock file could not be opened or locked.
    #[error("{0}")]
    State(StateError),
}

fn holder_words(holder: Option<u32>) -> String {
    holder.map_or_else(String::new, |pid| format!(" (pid {pid})"))
}

/// The lock on a state directory, held until dropped (with the agent).
#[derive(Debug)]
pub(crate) struct StateLock {
    _file: Flock<File>,
}

/// Locks the state directory `dir` (which exists), without waiting: another agent holding it
/// is [`LockError::Held`]. Nothing in `dir` but the lock file is touched before the lock is
/// held, and the lock file's contents only after.
pub(crate) fn lock(dir: &Path) -> Result<StateLock, LockError> {
    let path = dir.join(LOCK_FILE_NAME);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(FILE_MODE)
        // O_NOFOLLOW: never lock (or write a pid into) a file a symlink points at;
        // O_NONBLOCK: a FIFO put there must not hang the start. O_CLOEXEC is std's own.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| LockError::State(io_error(&path, "open lock file", e)))?;
    let metadata = file
        .metadata()
        .map_err(|e| LockError::State(io_error(&path, "stat lock file", e)))?;
    if !metadata.is_file() {
        let error = std::io::Error::other("not a regular file");
        return Err(LockError::State(io_error(&path, "use lock file", error)));
    }
    let mut locked = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(locked) => locked,
        Err((file, Errno::EWOULDBLOCK)) => {
            return Err(LockError::Held {
                dir: dir.to_owned(),
                holder: holder_pid(file),
            });
        }
        Err((_, errno)) => return Err(LockError::State(io_error(&path, "lock", errno))),
    };
    // Best effort: the pid only names the holder to an agent it refuses.
    if let Err(e) = write_pid(&mut locked) {
        log::warn!("cannot write this agent's pid into {}: {e}", path.display());
    }
    Ok(StateLock { _file: locked })
}

/// Replaces the lock file's contents with this process's pid.
fn write_pid(file: &mut File) -> std::io::Result<()> {
    file.set_len(0)?;
    // The file is opened without O_APPEND and never read by the holder: offset 0.
    file.write_all(format!("{}\n", std::process::id()).as_bytes())
}

/// The pid the holder wrote, if it reads as one.
fn holder_pid(file: File) -> Option<u32> {
    let mut text = String::new();
    file.take(MAX_PID_BYTES).read_to_string(&mut text).ok()?;
    text.trim().parse().ok().filter(|pid| *pid > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock held by an open file description of this process: flock locks belong to the
    /// description, so a second `open` in the same process conflicts as another agent would.
    #[test]
    fn a_second_lock_is_refused_naming_the_holder_and_taken_once_released() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock(dir.path()).expect("the first lock");
        let error = lock(dir.path()).expect_err("the second lock is refused");
        let pid = std::process::id();
        assert!(
            matches!(&error, LockError::Held { holder: Some(holder), .. } if *holder == pid),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(message.contains(&format!("(pid {pid})")), "{message}");
        assert!(
            message.contains(&dir.path().display().to_string()),
            "{message}"
        );
        drop(first);
        let _again = lock(dir.path()).expect("taken once released");
    }

    #[test]
    fn an_unreadable_pid_leaves_the_holder_unnamed() {
        let dir = tempfile::tempdir().unwrap();
        let _first = lock(dir.path()).unwrap();
        std::fs::write(dir.path().join(LOCK_FILE_NAME), "not a pid").unwrap();
        let error = lock(dir.path()).expect_err("refused");
        assert!(
            matches!(error, LockError::Held { holder: None, .. }),
            "{error:?}"
        );
        assert!(
            error.to_string().starts_with("another agent holds"),
            "{error}"
        );
    }

    #[test]
    fn a_symlink_in_place_of_the_lock_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(LOCK_FILE_NAME)).unwrap();
        let error = lock(dir.path()).expect_err("refused");
        assert!(matches!(error, LockError::State(_)), "{error:?}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "");
    }
}

//! Replacing a file atomically: the exit-record writer and the state file share this.
//!
//! The contents go to a temporary file in the same directory (created exclusively, never
//! through a symlink), are set to an exact mode whatever the umask, synced, renamed over the
//! final name (which replaces a symlink there rather than writing through it), and the
//! directory is synced. On any failure the temporary file is removed and the old file is
//! intact.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{self, OFlag};
use nix::sys::stat::{self, Mode};
use nix::unistd::{self, UnlinkatFlags};

/// What failed, on which path.
#[derive(Debug)]
pub(crate) struct AtomicWriteError {
    pub path: PathBuf,
    pub action: &'static str,
    pub source: io::Error,
}

/// Removes the temporary file when dropped, unless it was renamed into place.
struct TempFile<'a> {
    dirfd: BorrowedFd<'a>,
    name: &'a str,
    renamed: bool,
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        if !self.renamed {
            // Best effort: there is no better answer to a failing cleanup of a failed write.
            let _ = unistd::unlinkat(self.dirfd, self.name, UnlinkatFlags::NoRemoveDir);
        }
    }
}

/// Writes `contents` as `name` in the directory open as `dirfd` (at `dir`, for messages),
/// through the temporary file `temp_name` there, with permission bits `mode`.
pub(crate) fn replace(
    dirfd: BorrowedFd<'_>,
    dir: &Path,
    name: &str,
    temp_name: &str,
    contents: &[u8],
    mode: u32,
) -> Result<(), AtomicWriteError> {
    replace_with(dirfd, dir, name, temp_name, mode, |file| {
        file.write_all(contents)
    })
}

/// [`replace`] with what `write` writes to the temporary file, for contents too large to be
/// worth holding whole in memory first.
pub(crate) fn replace_with(
    dirfd: BorrowedFd<'_>,
    dir: &Path,
    name: &str,
    temp_name: &str,
    mode: u32,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), AtomicWriteError> {
    let fail = |path: PathBuf, action| {
        move |source: io::Error| AtomicWriteError {
            path,
            action,
            source,
        }
    };
    let temp_path = dir.join(temp_name);
    let fd = fcntl::openat(
        dirfd,
        temp_name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|errno| fail(temp_path.clone(), "create")(errno.into()))?;
    let mut temp = TempFile {
        dirfd,
        name: temp_name,
        renamed: false,
    };
    // The creation mode is masked by the umask; fchmod is not.
    stat::fchmod(&fd, Mode::from_bits_truncate(mode))
        .map_err(|errno| fail(temp_path.clone(), "set the mode of")(errno.into()))?;
    let mut file = File::from(fd);
    write(&mut file).map_err(fail(temp_path.clone(), "write"))?;
    file.sync_all().map_err(fail(temp_path, "sync"))?;
    drop(file);
    fcntl::renameat(dirfd, temp_name, dirfd, name)
        .map_err(|errno| fail(dir.join(name), "rename a temporary file to")(errno.into()))?;
    temp.renamed = true;
    // The rename is durable only once the directory is.
    unistd::fsync(dirfd.as_fd())
        .map_err(|errno| fail(dir.to_owned(), "sync directory")(errno.into()))
}

/// The names in `dir`, sorted: what the writers' tests check for leftover temporary files.
#[cfg(test)]
pub(crate) fn dir_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

//! The directories the agent keeps its control socket and its state in, created at start when
//! they are missing: on a fresh host nothing but the shipped unit's `RuntimeDirectory=` and
//! `StateDirectory=` would create them.

use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A directory the agent needs could not be made ready.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// `path`, the directory or one of its ancestors, exists and is not a directory.
    #[error("{path} exists and is not a directory, so it cannot hold the {purpose}")]
    NotADirectory {
        path: PathBuf,
        /// What the directory is for, e.g. "control socket".
        purpose: &'static str,
    },
    /// The system call named by `action` failed on `path`.
    #[error("cannot {action} {path} for the {purpose}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        purpose: &'static str,
        source: io::Error,
    },
}

/// Creates `dir` and each of its missing ancestors with exactly `mode` (the umask would narrow
/// it: the shipped unit's `UMask=0077` would lock allowed peers out of a socket directory),
/// logs each one, and returns them outermost first. A directory that exists, or a symlink to
/// one, is used as it is: its mode is the operator's and is never changed. A component that
/// exists and is not a directory is an error. `purpose` names what the directory is for, in
/// the log and in errors.
pub(crate) fn create_missing(
    dir: &Path,
    mode: u32,
    purpose: &'static str,
) -> Result<Vec<PathBuf>, DirError> {
    let io_error = |action, path: &Path, source| DirError::Io {
        action,
        path: path.to_owned(),
        purpose,
        source,
    };
    let mut created = Vec::new();
    let mut ancestors: Vec<&Path> = dir
        .ancestors()
        .filter(|path| !path.as_os_str().is_empty())
        .collect();
    ancestors.reverse();
    for path in ancestors {
        if is_directory(path, purpose)? {
            continue;
        }
        match DirBuilder::new().mode(mode).create(path) {
            Ok(()) => {}
            // Made by someone else since we looked: theirs, used as it is.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && is_directory(path, purpose)? => {
                continue;
            }
            Err(source) => return Err(io_error("create directory", path, source)),
        }
        // O_NOFOLLOW: the mode goes to the directory just made, never through a symlink that
        // replaced it.
        let opened = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| io_error("open new directory", path, e))?;
        opened
            .set_permissions(Permissions::from_mode(mode))
            .map_err(|e| io_error("set the mode of new directory", path, e))?;
        // The new entry must be durable before anything saved inside it can be.
        let parent = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        File::open(parent)
            .and_then(|parent| parent.sync_all())
            .map_err(|e| io_error("sync directory", parent, e))?;
        log::info!(
            "created directory {} (mode {mode:04o}) for the {purpose}",
            path.display()
        );
        created.push(path.to_owned());
    }
    Ok(created)
}

/// Whether `path` is a directory (following symlinks), `false` if it does not exist, an error
/// if it is something else.
fn is_directory(path: &Path, purpose: &'static str) -> Result<bool, DirError> {
    match fs::metadata(path) {
        Ok(metadata) if metadata.is_dir() => Ok(true),
        Ok(_) => Err(DirError::NotADirectory {
            path: path.to_owned(),
            purpose,
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(DirError::Io {
            action: "inspect",
            path: path.to_owned(),
            purpose,
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).expect("stat").permissions().mode() & 0o7777
    }

    #[test]
    fn creates_every_missing_directory_with_exactly_the_mode() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("a/b/c");
        // 0777 shows the umask is not applied (a test's umask is at least 0002).
        for (dir, wanted) in [(dir.clone(), 0o777), (root.path().join("d/e"), 0o711)] {
            let created = create_missing(&dir, wanted, "test").expect("create");
            let expected: Vec<PathBuf> = dir
                .ancestors()
                .take_while(|path| *path != root.path())
                .map(Path::to_owned)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            assert_eq!(created, expected);
            for path in &created {
                assert_eq!(mode(path), wanted, "{}", path.display());
            }
        }
        assert_eq!(
            create_missing(&dir, 0o700, "test").expect("again"),
            Vec::<PathBuf>::new(),
            "nothing is missing the second time"
        );
        assert_eq!(mode(&dir), 0o777, "an existing directory keeps its mode");
    }

    #[test]
    fn existing_directories_keep_their_mode() {
        let root = tempfile::tempdir().expect("tempdir");
        let existing = root.path().join("existing");
        DirBuilder::new()
            .mode(0o750)
            .create(&existing)
            .expect("mkdir");
        fs::set_permissions(&existing, Permissions::from_mode(0o750)).expect("chmod");
        let created = create_missing(&existing.join("new"), 0o700, "test").expect("create");
        assert_eq!(created, vec![existing.join("new")]);
        assert_eq!(mode(&existing), 0o750);
        assert_eq!(mode(&existing.join("new")), 0o700);
    }

    #[test]
    fn a_symlink_to_a_directory_is_followed() {
        let root = tempfile::tempdir().expect("tempdir");
        fs::create_dir(root.path().join("real")).expect("mkdir");
        std::os::unix::fs::symlink("real", root.path().join("link")).expect("symlink");
        let created = create_missing(&root.path().join("link/new"), 0o700, "test").expect("create");
        assert_eq!(created, vec![root.path().join("link/new")]);
        assert!(root.path().join("real/new").is_dir());
    }

    #[test]
    fn a_component_that_is_not_a_directory_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        let file = root.path().join("file");
        fs::write(&file, "").expect("write");
        for dir in [file.clone(), file.join("sub/dir")] {
            let err = create_missing(&dir, 0o700, "control socket").expect_err("a file");
            assert!(
                matches!(&err, DirError::NotADirectory { path, .. } if *path == file),
                "{err:?}"
            );
            assert_eq!(
                err.to_string(),
                format!(
                    "{} exists and is not a directory, so it cannot hold the control socket",
                    file.display()
                )
            );
        }
        let dangling = root.path().join("dangling");
        std::os::unix::fs::symlink("nowhere", &dangling).expect("symlink");
        let err = create_missing(&dangling.join("x"), 0o700, "state").expect_err("dangling");
        assert!(
            err.to_string()
                .starts_with(&format!("cannot create directory {}", dangling.display())),
            "{err}"
        );
    }

    #[test]
    fn the_empty_path_and_the_working_directory_need_nothing() {
        assert_eq!(
            create_missing(Path::new(""), 0o700, "test").expect("nothing to do"),
            Vec::<PathBuf>::new()
        );
        assert_eq!(
            create_missing(Path::new("."), 0o700, "test").expect("exists"),
            Vec::<PathBuf>::new()
        );
    }
}

//! Reads and removes one file directly beneath a directory when that file may have been planted
//! by a hostile tenant. It never follows a symlink (the final component included), never reads
//! from anything but a regular file, never blocks on a FIFO, and never reads more than a bound.
//!
//! The directory path itself is trusted: the caller (the control plane) names it, and its own
//! components are resolved normally, except that its last component must not be a symlink. Only
//! the one file name inside it is hostile, and it must be a single path component.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{self, FileStat, Mode, SFlag};
use nix::unistd::{self, UnlinkatFlags};

use crate::record_name::{InvalidRecordName, RecordName};

/// Why a file beneath a directory was not read or removed.
#[derive(Debug, thiserror::Error)]
pub enum BeneathError {
    /// The name is not a single path component.
    #[error(transparent)]
    InvalidName(#[from] InvalidRecordName),
    /// The directory could not be opened (missing, not a directory, or a symlink).
    #[error("open directory {dir}: {source}")]
    OpenDir {
        /// The directory.
        dir: PathBuf,
        /// The error of `openat2` or `open`.
        source: io::Error,
    },
    /// No file of that name is in the directory.
    #[error("{}: no such file", Shown(.dir, .name))]
    NotFound {
        /// The directory.
        dir: PathBuf,
        /// The file's name in it.
        name: String,
    },
    /// The name resolved through a symlink or out of the directory, or the file has other hard
    /// links (one could be a file the tenant may not read).
    #[error("{}: refused: {reason}", Shown(.dir, .name))]
    Refused {
        /// The directory.
        dir: PathBuf,
        /// The file's name in it.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The file is a FIFO, directory, socket or device; it was not read.
    #[error("{}: not a regular file", Shown(.dir, .name))]
    NotRegular {
        /// The directory.
        dir: PathBuf,
        /// The file's name in it.
        name: String,
    },
    /// The file has more than `limit` bytes.
    #[error("{}: larger than {limit} bytes", Shown(.dir, .name))]
    TooLarge {
        /// The directory.
        dir: PathBuf,
        /// The file's name in it.
        name: String,
        /// The limit in bytes.
        limit: usize,
    },
    /// Any other failure of the system call named by `action`.
    #[error("{action} {}: {source}", Shown(.dir, .name))]
    Io {
        /// The directory.
        dir: PathBuf,
        /// The file's name in it.
        name: String,
        /// The system call, e.g. `read`.
        action: &'static str,
        /// Its error.
        source: io::Error,
    },
}

/// Shows `dir/name` with the untrusted name escaped, so it cannot break a log line.
struct Shown<'a>(&'a Path, &'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.0.display(), self.1.escape_debug())
    }
}

/// Opens the trusted directory `dir` for `*at` calls and for fsync; its last component must
/// not be a symlink.
pub(super) fn open_dir(dir: &Path) -> nix::Result<OwnedFd> {
    fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// How a file beneath a directory is opened: [`open_file_beneath`], or its fallback alone.
type Opener = fn(BorrowedFd<'_>, &str) -> nix::Result<OwnedFd>;

/// The flags of the file's open: read-only, not following a final symlink, and non-blocking so
/// a FIFO can never stall the agent's single-threaded loop.
fn file_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NOCTTY
}

/// Opens `name` beneath `dirfd` with `openat2`, which refuses every symlink and any escape from
/// the directory, falling back to [`open_file_nofollow`] where `openat2` is missing (`ENOSYS`)
/// or forbidden by a seccomp profile (`EPERM`).
fn open_file_beneath(dirfd: BorrowedFd<'_>, name: &str) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(file_flags())
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    match fcntl::openat2(dirfd, name, how) {
        Err(Errno::ENOSYS | Errno::EPERM) => open_file_nofollow(dirfd, name),
        opened => opened,
    }
}

/// Opens `name` beneath `dirfd` with `O_NOFOLLOW`. Since `name` is one validated component,
/// this is the whole walk: nothing can lead out of the directory or through a symlink.
fn open_file_nofollow(dirfd: BorrowedFd<'_>, name: &str) -> nix::Result<OwnedFd> {
    fcntl::openat(dirfd, name, file_flags(), Mode::empty())
}

fn is_regular(stat: &FileStat) -> bool {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG
}

fn io_error(dir: &Path, name: &str, action: &'static str, errno: Errno) -> BeneathError {
    BeneathError::Io {
        dir: dir.to_owned(),
        name: name.to_owned(),
        action,
        source: errno.into(),
    }
}

/// Reads the regular file `name` directly beneath `dir`, at most `limit` bytes.
///
/// `dir` is trusted (see the module docs); `name` must be a [`RecordName`]. A symlink
/// anywhere in `name`'s resolution, a file with several hard links, anything but a regular
/// file, and a file of more than `limit` bytes are errors, and nothing is read from them.
pub fn read_beneath(dir: &Path, name: &str, limit: usize) -> Result<Vec<u8>, BeneathError> {
    read_with(open_file_beneath, dir, name, limit)
}

fn read_with(open: Opener, dir: &Path, name: &str, limit: usize) -> Result<Vec<u8>, BeneathError> {
    RecordName::parse(name)?;
    let dirfd = open_dir(dir).map_err(|errno| BeneathError::OpenDir {
        dir: dir.to_owned(),
        source: errno.into(),
    })?;
    let fd = open(dirfd.as_fd(), name).map_err(|errno| match errno {
        Errno::ENOENT => BeneathError::NotFound {
            dir: dir.to_owned(),
            name: name.to_owned(),
        },
        // ELOOP: a symlink (the final one, or any under RESOLVE_NO_SYMLINKS); EXDEV: an escape.
        Errno::ELOOP | Errno::EXDEV => BeneathError::Refused {
            dir: dir.to_owned(),
            name: name.to_owned(),
            reason: "a symlink, or a path out of the directory",
        },
        // A Unix socket cannot be opened at all.
        Errno::ENXIO => BeneathError::NotRegular {
            dir: dir.to_owned(),
            name: name.to_owned(),
        },
        errno => io_error(dir, name, "open", errno),
    })?;
    let file_stat = stat::fstat(&fd).map_err(|errno| io_error(dir, name, "stat", errno))?;
    if !is_regular(&file_stat) {
        return Err(BeneathError::NotRegular {
            dir: dir.to_owned(),
            name: name.to_owned(),
        });
    }
    // Another link may be a file the tenant cannot read itself, planted here for us to read.
    if file_stat.st_nlink > 1 {
        return Err(BeneathError::Refused {
            dir: dir.to_owned(),
            name: name.to_owned(),
            reason: "the file has other hard links",
        });
    }
    let mut bytes = Vec::new();
    // One byte past the limit tells a file of exactly `limit` bytes from a longer one.
    File::from(fd)
        .take((limit as u64).saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| BeneathError::Io {
            dir: dir.to_owned(),
            name: name.to_owned(),
            action: "read",
            source,
        })?;
    if bytes.len() > limit {
        return Err(BeneathError::TooLarge {
            dir: dir.to_owned(),
            name: name.to_owned(),
            limit,
        });
    }
    Ok(bytes)
}

/// Removes `name` directly beneath `dir` if it is a regular file.
///
/// Returns `Ok(true)` when a regular file was removed, and `Ok(false)` when there was nothing
/// to remove or the entry is a symlink, FIFO, directory, socket or device, which is left alone.
/// Only the directory entry is removed: a symlink swapped in between the check and the removal
/// is removed itself, never its target.
pub fn remove_beneath(dir: &Path, name: &str) -> Result<bool, BeneathError> {
    RecordName::parse(name)?;
    let dirfd = open_dir(dir).map_err(|errno| BeneathError::OpenDir {
        dir: dir.to_owned(),
        source: errno.into(),
    })?;
    let entry = match stat::fstatat(&dirfd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(entry) => entry,
        Err(Errno::ENOENT) => return Ok(false),
        Err(errno) => return Err(io_error(dir, name, "stat", errno)),
    };
    if !is_regular(&entry) {
        return Ok(false);
    }
    match unistd::unlinkat(&dirfd, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) => Ok(true),
        // Swapped between the stat and the unlink: already gone, or now a directory.
        Err(Errno::ENOENT | Errno::EISDIR) => Ok(false),
        Err(errno) => Err(io_error(dir, name, "remove", errno)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    use tempfile::TempDir;

    const NAME: &str = "exit-0123.json";

    /// Both ways of opening: openat2 (with its fallback), and the fallback alone.
    const OPENERS: [(&str, Opener); 2] = [
        ("openat2", open_file_beneath),
        ("nofollow walk", open_file_nofollow),
    ];

    /// A scratch directory with a `dir` to read from and a sibling `outside` it.
    struct Scratch {
        root: TempDir,
    }

    impl Scratch {
        fn new() -> Scratch {
            let root = tempfile::tempdir().expect("create tempdir");
            fs::create_dir(root.path().join("dir")).expect("create dir");
            Scratch { root }
        }

        fn dir(&self) -> PathBuf {
            self.root.path().join("dir")
        }

        fn outside(&self) -> PathBuf {
            self.root.path().join("outside")
        }
    }

    fn mkfifo(path: &Path) {
        unistd::mkfifo(path, Mode::from_bits_truncate(0o644)).expect("mkfifo");
    }

    #[test]
    fn reads_a_regular_file() {
        for (how, open) in OPENERS {
            let scratch = Scratch::new();
            fs::write(scratch.dir().join(NAME), b"{}\n").expect("write");
            let bytes = read_with(open, &scratch.dir(), NAME, 4096).expect(how);
            assert_eq!(bytes, b"{}\n", "{how}");
        }
    }

    #[test]
    fn reads_exactly_the_limit_and_refuses_one_byte_more() {
        for (how, open) in OPENERS {
            let scratch = Scratch::new();
            fs::write(scratch.dir().join(NAME), [b'x'; 10]).expect("write");
            assert_eq!(
                read_with(open, &scratch.dir(), NAME, 10).expect(how).len(),
                10
            );
            let err = read_with(open, &scratch.dir(), NAME, 9).expect_err(how);
            assert!(
                matches!(err, BeneathError::TooLarge { limit: 9, .. }),
                "{how}: {err}"
            );
        }
    }

    #[test]
    fn symlinks_are_refused_wherever_they_point_and_left_alone() {
        for (how, open) in OPENERS {
            for target_inside in [false, true] {
                let scratch = Scratch::new();
                let target = if target_inside {
                    scratch.dir().join("real.json")
                } else {
                    scratch.outside()
                };
                fs::write(&target, b"{}").expect("write target");
                symlink(&target, scratch.dir().join(NAME)).expect("symlink");
                let err = read_with(open, &scratch.dir(), NAME, 4096).expect_err(how);
                assert!(
                    matches!(err, BeneathError::Refused { .. }),
                    "{how}, inside {target_inside}: {err}"
                );
                assert!(!remove_beneath(&scratch.dir(), NAME).expect("remove"));
                let link = fs::symlink_metadata(scratch.dir().join(NAME)).expect("link stays");
                assert!(link.file_type().is_symlink());
                assert_eq!(fs::read(&target).expect("target stays"), b"{}");
            }
        }
    }

    #[test]
    fn a_relative_symlink_is_refused_too() {
        for (how, open) in OPENERS {
            let scratch = Scratch::new();
            fs::write(scratch.outside(), b"{}").expect("write target");
            symlink("../outside", scratch.dir().join(NAME)).expect("symlink");
            let err = read_with(open, &scratch.dir(), NAME, 4096).expect_err(how);
            assert!(matches!(err, BeneathError::Refused { .. }), "{how}: {err}");
        }
    }

    #[test]
    fn a_fifo_is_not_read_and_never_blocks() {
        for (how, open) in OPENERS {
            let scratch = Scratch::new();
            mkfifo(&scratch.dir().join(NAME));
            let dir = scratch.dir();
            let (sender, receiver) = mpsc::channel();
            // A regression would block in open or read forever; the thread lets the test fail
            // instead of hanging.
            thread::spawn(move || {
                let _ = sender.send(read_with(open, &dir, NAME, 4096));
            });
            let outcome = receiver
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("{how}: reading a FIFO blocked"));
            assert!(
                matches!(outcome, Err(BeneathError::NotRegular { .. })),
                "{how}: {outcome:?}"
            );
            assert!(!remove_beneath(&scratch.dir(), NAME).expect("remove"));
            assert!(scratch.dir().join(NAME).exists(), "{how}: FIFO left alone");
        }
    }

    #[test]
    fn a_directory_is_not_read_and_left_alone() {
        for (how, open) in OPENERS {
            let scratch = Scratch::new();
            fs::create_dir(scratch.dir().join(NAME)).expect("mkdir");
            let err = read_with(open, &scratch.dir(), NAME, 4096).expect_err(how);
            assert!(
                matches!(err, BeneathError::NotRegular { .. }),
                "{how}: {err}"
            );
            assert!(!remove_beneath(&scratch.dir(), NAME).expect("remove"));
            assert!(scratch.dir().join(NAME).is_dir(), "{how}");
        }
    }

    #[test]
    fn a_socket_is_not_read() {
        for (how, open) in OPENERS {
            let scratch = Scratch::new();
            let _listener = std::os::unix::net::UnixListener::bind(scratch.dir().join(NAME))
                .expect("bind socket");
            let err = read_with(open, &scratch.dir(), NAME, 4096).expect_err(how);
            assert!(
                matches!(err, BeneathError::NotRegular { .. }),
                "{how}: {err}"
            );
            assert!(!remove_beneath(&scratch.dir(), NAME).expect("remove"));
        }
    }

    #[test]
    fn a_hard_linked_file_is_refused() {
        for (how, open) in OPENERS {
            let scratch = Scratch::new();
            fs::write(scratch.outside(), b"{}").expect("write");
            fs::hard_link(scratch.outside(), scratch.dir().join(NAME)).expect("link");
            let err = read_with(open, &scratch.dir(), NAME, 4096).expect_err(how);
            assert!(matches!(err, BeneathError::Refused { .. }), "{how}: {err}");
        }
    }

    #[test]
    fn a_large_file_is_too_large_but_removable() {
        for (how, open) in OPENERS {
            let scratch = Scratch::new();
            fs::write(scratch.dir().join(NAME), vec![b'x'; 1 << 20]).expect("write");
            let err = read_with(open, &scratch.dir(), NAME, 4096).expect_err(how);
            assert!(
                matches!(err, BeneathError::TooLarge { limit: 4096, .. }),
                "{how}: {err}"
            );
            assert!(
                remove_beneath(&scratch.dir(), NAME).expect("remove"),
                "{how}"
            );
            assert!(!scratch.dir().join(NAME).exists(), "{how}");
        }
    }

    #[test]
    fn a_missing_file_is_not_found_and_not_removed() {
        for (how, open) in OPENERS {
            let scratch = Scratch::new();
            let err = read_with(open, &scratch.dir(), NAME, 4096).expect_err(how);
            assert!(matches!(err, BeneathError::NotFound { .. }), "{how}: {err}");
            assert!(!remove_beneath(&scratch.dir(), NAME).expect("remove"));
        }
    }

    #[test]
    fn a_missing_or_symlinked_directory_fails_to_open() {
        let scratch = Scratch::new();
        symlink(scratch.dir(), scratch.outside()).expect("symlink dir");
        for dir in [scratch.root.path().join("missing"), scratch.outside()] {
            let err = read_beneath(&dir, NAME, 4096).expect_err("read");
            assert!(matches!(err, BeneathError::OpenDir { .. }), "{err}");
            let err = remove_beneath(&dir, NAME).expect_err("remove");
            assert!(matches!(err, BeneathError::OpenDir { .. }), "{err}");
        }
    }

    #[test]
    fn removes_a_regular_file() {
        let scratch = Scratch::new();
        fs::write(scratch.dir().join(NAME), b"{}").expect("write");
        assert!(remove_beneath(&scratch.dir(), NAME).expect("remove"));
        assert!(!scratch.dir().join(NAME).exists());
        assert!(!remove_beneath(&scratch.dir(), NAME).expect("remove again"));
    }

    #[test]
    fn invalid_names_are_refused_before_any_access() {
        let long = "a".repeat(256);
        let longest = "a".repeat(255);
        let scratch = Scratch::new();
        for name in ["", ".", "..", "a/b", "/", "a\0b", "../outside", &long] {
            for (how, open) in OPENERS {
                let err = read_with(open, &scratch.dir(), name, 4096).expect_err(how);
                assert!(matches!(err, BeneathError::InvalidName(_)), "{how}: {err}");
            }
            let err = remove_beneath(&scratch.dir(), name).expect_err(name);
            assert!(matches!(err, BeneathError::InvalidName(_)), "{err}");
        }
        for name in [NAME, "...", ".hidden", &longest, "a\nb"] {
            RecordName::parse(name).expect(name);
        }
    }

    #[test]
    fn errors_name_the_directory_and_escape_the_name() {
        let dir = Path::new("/run/x");
        let cases = [
            (
                BeneathError::NotRegular {
                    dir: dir.to_owned(),
                    name: "a\nb".to_owned(),
                },
                "/run/x/a\\nb: not a regular file",
            ),
            (
                BeneathError::TooLarge {
                    dir: dir.to_owned(),
                    name: "r".to_owned(),
                    limit: 4096,
                },
                "/run/x/r: larger than 4096 bytes",
            ),
            (
                io_error(dir, "r", "open", Errno::EACCES),
                "open /run/x/r: Permission denied (os error 13)",
            ),
            (
                BeneathError::InvalidName(InvalidRecordName {
                    name: "a/\u{1b}".to_owned(),
                    reason: "contains '/'",
                }),
                "invalid file name \"a/\\u{1b}\": contains '/'",
            ),
        ];
        for (err, text) in cases {
            assert_eq!(err.to_string(), text);
        }
    }
}

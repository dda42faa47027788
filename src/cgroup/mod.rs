//! The cgroup v2 side of exitproof: finding the cgroup2 mount, parsing `cgroup.events`, and watching
//! units' cgroups with one inotify descriptor. Nothing here may treat a notification, an error or an
//! unreadable file as proof that a unit is empty; only a fresh read saying `populated 0` (or a cgroup
//! that is gone) is.

pub mod events;
pub mod mount;
pub mod procs;
pub mod watcher;

use std::fmt;
use std::io;
use std::path::PathBuf;

pub use events::CgroupReading;
pub use mount::cgroup2_mount;
#[cfg(feature = "bench")]
pub use watcher::read_events_file;
pub use watcher::{CgroupWatcher, Notice};

/// Where the kernel's limit on inotify watches per user is set; named in [`CgroupError::WatchLimit`].
pub const MAX_USER_WATCHES_PATH: &str = "/proc/sys/fs/inotify/max_user_watches";

/// A failure of the cgroup side, with the path or cgroup it concerns.
#[derive(Debug)]
pub enum CgroupError {
    /// The mount table could not be read.
    Mountinfo { path: PathBuf, source: io::Error },
    /// The mount table lists no cgroup2 file system.
    NoCgroup2Mount { path: PathBuf },
    /// A cgroup string (as systemd reports it) was rejected before touching the file system.
    InvalidCgroup {
        cgroup: String,
        reason: &'static str,
    },
    /// The inotify instance could not be created.
    InotifyInit { source: io::Error },
    /// Reading events from the inotify instance failed.
    InotifyRead { source: io::Error },
    /// Adding an inotify watch failed for a reason other than the watch limit.
    Watch { path: PathBuf, source: io::Error },
    /// Adding an inotify watch failed because the per-user watch limit was reached (ENOSPC).
    WatchLimit { path: PathBuf, source: io::Error },
    /// The kernel gave a directory watch and a `cgroup.events` watch the same descriptor, which only
    /// happens when both paths name one inode; real cgroupfs never does that.
    WatchClash { path: PathBuf },
}

impl fmt::Display for CgroupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Mountinfo { path, source } => {
                write!(f, "cannot read mount table {}: {source}", path.display())
            }
            Self::NoCgroup2Mount { path } => {
                write!(
                    f,
                    "no cgroup2 file system is mounted according to {}",
                    path.display()
                )
            }
            Self::InvalidCgroup { cgroup, reason } => {
                write!(f, "invalid cgroup path {cgroup:?}: {reason}")
            }
            Self::InotifyInit { source } => write!(f, "cannot create inotify instance: {source}"),
            Self::InotifyRead { source } => write!(f, "cannot read inotify events: {source}"),
            Self::Watch { path, source } => {
                write!(
                    f,
                    "cannot add inotify watch on {}: {source}",
                    path.display()
                )
            }
            Self::WatchLimit { path, source } => write!(
                f,
                "cannot add inotify watch on {}: inotify watch limit reached, raise \
                 {MAX_USER_WATCHES_PATH}: {source}",
                path.display()
            ),
            Self::WatchClash { path } => write!(
                f,
                "inotify watch on {} shares its descriptor with a watch of another kind",
                path.display()
            ),
        }
    }
}

impl std::error::Error for CgroupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Mountinfo { source, .. }
            | Self::InotifyInit { source }
            | Self::InotifyRead { source }
            | Self::Watch { source, .. }
            | Self::WatchLimit { source, .. } => Some(source),
            Self::NoCgroup2Mount { .. } | Self::InvalidCgroup { .. } | Self::WatchClash { .. } => {
                None
            }
        }
    }
}

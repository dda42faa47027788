//! The cgroup v2 side of exitproof: finding the cgroup2 mount, parsing `cgroup.events`, and watching
//! units' cgroups with one inotify descriptor. Nothing here may treat a notification, an error or an
//! unreadable file as proof that a unit is empty; only a fresh read saying `populated 0` (or a cgroup
//! that is gone) is.

pub(crate) mod events;
pub(crate) mod mount;
pub(crate) mod procs;
mod watch_table;
pub(crate) mod watcher;

use std::io;
use std::path::PathBuf;

pub(crate) use crate::proof::CgroupReading;
pub(crate) use mount::cgroup2_mount;
#[cfg(feature = "bench")]
pub(crate) use watcher::read_events_file;
pub(crate) use watcher::{CgroupWatcher, Notice};

/// Where the kernel's limit on inotify watches per user is set; named in [`CgroupError::WatchLimit`].
pub(crate) const MAX_USER_WATCHES_PATH: &str = "/proc/sys/fs/inotify/max_user_watches";

/// A failure of the cgroup side, with the path or cgroup it concerns.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The mount table could not be read.
    #[error("cannot read mount table {path}: {source}")]
    Mountinfo { path: PathBuf, source: io::Error },
    /// The mount table lists no cgroup2 file system.
    #[error("no cgroup2 file system is mounted according to {path}")]
    NoCgroup2Mount { path: PathBuf },
    /// A cgroup string (as systemd reports it) was rejected before touching the file system.
    #[error("invalid cgroup path {cgroup:?}: {reason}")]
    InvalidCgroup {
        cgroup: String,
        reason: &'static str,
    },
    /// The inotify instance could not be created.
    #[error("cannot create inotify instance: {source}")]
    InotifyInit { source: io::Error },
    /// Reading events from the inotify instance failed.
    #[error("cannot read inotify events: {source}")]
    InotifyRead { source: io::Error },
    /// Adding an inotify watch failed for a reason other than the watch limit.
    #[error("cannot add inotify watch on {path}: {source}")]
    Watch { path: PathBuf, source: io::Error },
    /// Adding an inotify watch failed because the per-user watch limit was reached (ENOSPC).
    #[error(
        "cannot add inotify watch on {path}: inotify watch limit reached, raise {limit}: {source}",
        limit = MAX_USER_WATCHES_PATH
    )]
    WatchLimit { path: PathBuf, source: io::Error },
    /// The kernel gave a directory watch and a `cgroup.events` watch the same descriptor, which only
    /// happens when both paths name one inode; real cgroupfs never does that.
    #[error("inotify watch on {path} shares its descriptor with a watch of another kind")]
    WatchClash { path: PathBuf },
}

/// The cgroup v2 path in the text of `/proc/PID/cgroup`: its `0::` line.
pub(crate) fn cgroup_v2_path(text: &str) -> Option<&str> {
    text.lines().find_map(|line| line.strip_prefix("0::"))
}

//! Placeholder until the cgroup driver lands: the reading type the proof core consumes.

/// What one read of a unit's cgroup showed. A read is a fresh fact; an inotify notification is only a hint to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupReading {
    Populated,
    Empty,
    Gone,
    Unreadable(String),
}

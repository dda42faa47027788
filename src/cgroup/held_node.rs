//! When a unit's `cgroup.events` may be read through the cgroup directory (node) held since an
//! earlier read, instead of by its path. Pure: the driver holds descriptors, the simulator
//! node numbers.
//!
//! Why hold one: opening `cgroup.events` by path walks the cgroup file system under a lock that
//! is taken for writing while cgroups are made and removed. Measured on this project's test
//! machine, an open by path waited up to 4.1 ms while another process made and removed
//! cgroups; a re-open of an `O_PATH` descriptor taken earlier, 56 µs at most.
//!
//! Why a reading through it is the reading of the path: a path names one cgroup directory at a
//! time; cgroup v2 refuses to rename one; the kernel removes one only when no process is left
//! in it or below it, and a removed one never opens again. So a held directory that still
//! opens is the one at its path, and what it says is what the path says. One that was removed
//! (`ENODEV`) says nothing of what the path holds now: the unit's next invocation may already
//! have a new directory there, populated, and the proof's fact is the unit's cgroup, not one
//! invocation's. So a removed directory, and any failure or reading other than `populated 0`
//! or `1`, sends the read back to the path.

use super::events::CgroupReading;

/// How one reading is to be taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// Through the directory held for the unit's path.
    Held,
    /// Take the directory now at the path (none there is a cgroup gone), hold it in place of
    /// any other, and read through it.
    TakeNode,
    /// By path, holding nothing.
    Path,
}

/// How to read a unit's cgroup: `held` is the directory held for the unit, given only if it
/// was taken at the path read now (a directory found at another path speaks for that one);
/// `room` says whether one more directory may be held.
pub(crate) fn route<H>(held: Option<&H>, room: bool) -> Route {
    match held {
        Some(_) => Route::Held,
        None if room => Route::TakeNode,
        None => Route::Path,
    }
}

/// What opening a held directory's `cgroup.events` gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NodeOpen {
    /// It opened, and this is what a read of it gave.
    Read(CgroupReading),
    /// The directory was removed (`ENODEV`).
    Removed,
    /// Anything else: no /proc, a descriptor gone bad.
    Failed,
}

/// The reading a held directory gave, or `None` when it gave none that stands for the path:
/// the caller then drops it and reads by path.
pub(crate) fn reading_through(open: NodeOpen) -> Option<CgroupReading> {
    match open {
        NodeOpen::Read(reading @ (CgroupReading::Populated | CgroupReading::Empty)) => {
            Some(reading)
        }
        // Removed, between the open and the read too: the path may hold a new one.
        NodeOpen::Read(CgroupReading::Gone) | NodeOpen::Removed => None,
        // An unreadable file is the path's to say, and a failure no evidence.
        NodeOpen::Read(CgroupReading::Unreadable(_)) | NodeOpen::Failed => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_directory_is_read_through_and_a_new_one_taken_only_while_there_is_room() {
        assert_eq!(route(Some(&7), false), Route::Held);
        assert_eq!(route::<i32>(None, true), Route::TakeNode);
        assert_eq!(route::<i32>(None, false), Route::Path);
    }

    #[test]
    fn only_populated_or_not_through_a_live_directory_stands_for_the_path() {
        for reading in [CgroupReading::Populated, CgroupReading::Empty] {
            assert_eq!(
                reading_through(NodeOpen::Read(reading.clone())),
                Some(reading)
            );
        }
        for open in [
            NodeOpen::Removed,
            NodeOpen::Read(CgroupReading::Gone),
            NodeOpen::Read(CgroupReading::Unreadable("EIO".into())),
            NodeOpen::Failed,
        ] {
            assert_eq!(reading_through(open.clone()), None, "{open:?}");
        }
    }
}

//! cgroup v2: the pure `cgroup.events` parser and the inotify driver.
pub mod events;
pub use events::CgroupReading;

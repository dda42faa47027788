//! The kernel as the agent sees it: processes (pid, parent, start time, the invocation they
//! were started under) in a cgroup v2 tree, and inotify on `cgroup.events` with its merged
//! notifications and its overflow.
//!
//! A process's parent is what forked it (systemd, pid [`MANAGER`], for the main and control
//! processes); when a parent dies its children are reparented to the manager, as the kernel
//! does to the nearest subreaper. Start times are virtual CLOCK_MONOTONIC microseconds; the
//! machine may suspend, which moves CLOCK_BOOTTIME ahead of CLOCK_MONOTONIC, so `/proc`'s start
//! ticks are the start time plus the time suspended before it, truncated to whole ticks of
//! [`TICK_US`].
//!
//! A process keeps the invocation it was started under for its whole life: a KillMode=process
//! leftover still belongs to the old invocation while the next one runs beside it, which is
//! exactly what the oracle must see.

use std::collections::{BTreeMap, BTreeSet};

pub(crate) type Pid = u32;

/// systemd's pid: the parent of every process it forks, and of every orphan.
pub(crate) const MANAGER: Pid = 1;

/// One clock tick of `/proc/PID/stat` (`_SC_CLK_TCK` = 100), in microseconds.
pub(crate) const TICK_US: u64 = 10_000;
/// An InvocationID; 0 is "none", as systemd prints all-zero as empty.
pub(crate) type Inv = u128;

/// What a process is to its unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Main,
    /// An ExecStop= or ExecStopPost= process: it runs under the invocation it stops.
    Control,
    /// Anything a unit's process forked; survives a stop with KillMode=process.
    Child,
    /// `systemctl clean`'s process: systemd's own, forked after the invocation ended, under
    /// its InvocationID; not the workload a proof of that invocation speaks of.
    Clean,
}

#[derive(Clone, Debug)]
pub(crate) struct Proc {
    pub pid: Pid,
    /// The process that forked it, or [`MANAGER`] once that one died.
    pub ppid: Pid,
    /// Its session: systemd starts main and control processes in a session of their own, and
    /// a child keeps its parent's, orphaned or not.
    pub session: Pid,
    /// When it was forked (virtual CLOCK_MONOTONIC, µs).
    pub start_us: u64,
    /// The same on CLOCK_BOOTTIME, which `/proc/PID/stat` counts.
    pub start_boot_us: u64,
    pub cgroup: String,
    pub invocation: Inv,
    pub unit: usize,
    pub role: Role,
    /// Which process this is, for good: a pid may be reused, a pidfd is not.
    pub id: u64,
    /// It waits for its unit's next start, then forks a child and exits (an ExecStop= that
    /// left `read line < fifo; sleep 1000 &` behind, the fifo written by the next ExecStart=).
    pub waits_for_start: bool,
}

/// What a read of a cgroup's `cgroup.events` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reading {
    Populated,
    Empty,
    Gone,
}

/// The agent's watches of one cgroup, as the real driver makes them (`cgroup/watcher.rs`):
/// `IN_MODIFY` on its `cgroup.events`, and `IN_CREATE|IN_DELETE` on its parent directory.
#[derive(Debug)]
struct Watched {
    /// How many of the agent's watches name the cgroup.
    users: u32,
    /// The inode of the cgroup when the agent watched it (`None`: it did not exist, so only
    /// the parent is watched).
    dir: Option<u64>,
    /// The inode of its parent then (`None`: a directory the model does not make, which
    /// stays).
    parent: Option<u64>,
}

#[derive(Debug, Default)]
pub(crate) struct Kernel {
    pub procs: BTreeMap<Pid, Proc>,
    /// Each cgroup directory with its inode number, new at every mkdir: an inotify watch is on
    /// an inode, not on a path (`fsnotify_add_mark` marks the inode).
    dirs: BTreeMap<String, u64>,
    next_inode: u64,
    next_pid: Pid,
    /// Pids wrap past this (`/proc/sys/kernel/pid_max`) and are reused.
    pub pid_max: Pid,
    spawned: u64,
    /// cgroups the agent watches, with what each watch is on.
    watched: BTreeMap<String, Watched>,
    /// Watched cgroups with a notification not yet read: a set, because the kernel merges.
    pending: BTreeSet<String>,
    /// Watches the kernel dropped, not yet reported.
    lost: BTreeSet<String>,
    /// The inotify queue overflowed since the agent last read it.
    pub overflow: bool,
    /// CLOCK_BOOTTIME minus CLOCK_MONOTONIC: the time suspended so far (µs).
    pub suspended_us: u64,
}

impl Kernel {
    pub(crate) fn new() -> Kernel {
        Kernel {
            next_pid: 100,
            pid_max: 4_000_000,
            ..Kernel::default()
        }
    }

    /// Whether any process is in `path` or below it (`populated` counts descendants).
    pub(crate) fn populated(&self, path: &str) -> bool {
        self.procs.values().any(|p| within(&p.cgroup, path))
    }

    pub(crate) fn exists(&self, path: &str) -> bool {
        self.dirs.contains_key(path)
    }

    fn inode(&self, path: &str) -> Option<u64> {
        self.dirs.get(path).copied()
    }

    fn parent_inode(&self, path: &str) -> Option<u64> {
        path.rsplit_once('/')
            .and_then(|(parent, _)| self.inode(parent))
    }

    pub(crate) fn read(&self, path: &str) -> Reading {
        match (self.exists(path), self.populated(path)) {
            (false, _) => Reading::Gone,
            (true, true) => Reading::Populated,
            (true, false) => Reading::Empty,
        }
    }

    /// Applies `change`, then queues a notification for every watched cgroup whose
    /// `cgroup.events` it changed (`kernfs_notify`, to the watch on that file's inode), or
    /// which it created or removed (`fsnotify_create`, `fsnotify_delete`, to the watch on the
    /// parent directory's inode). Removing a cgroup sends nothing to the watch on its own file
    /// (no `IN_IGNORED`, seen on Linux 6.18): that watch is dead, and one made before a cgroup
    /// of the same path was created again never hears of the new one.
    fn notifying(&mut self, change: impl FnOnce(&mut Kernel)) {
        let before: Vec<(String, Reading, Option<u64>)> = self
            .watched
            .keys()
            .map(|p| (p.clone(), self.read(p), self.parent_inode(p)))
            .collect();
        change(self);
        for (path, was, parent_before) in before {
            let now = self.read(&path);
            let Some(watch) = self.watched.get(&path) else {
                continue;
            };
            let heard = if (was == Reading::Gone) != (now == Reading::Gone) {
                // A removal reaches the parent before the parent itself may go.
                let parent = if now == Reading::Gone {
                    parent_before
                } else {
                    self.parent_inode(&path)
                };
                watch.parent == parent
            } else {
                now != was && watch.dir.is_some() && watch.dir == self.inode(&path)
            };
            if heard {
                self.pending.insert(path);
            }
        }
    }

    pub(crate) fn mkdir(&mut self, path: &str) {
        if !self.exists(path) {
            let path = path.to_owned();
            self.next_inode += 1;
            let inode = self.next_inode;
            self.notifying(|k| {
                k.dirs.insert(path, inode);
            });
        }
    }

    /// Removes `path` and every empty cgroup below it (systemd trims delegated subtrees);
    /// refused, as by the kernel, while a process is anywhere in it.
    pub(crate) fn rmdir(&mut self, path: &str) -> bool {
        if !self.exists(path) || self.populated(path) {
            return false;
        }
        self.notifying(|k| k.dirs.retain(|d, _| !within(d, path)));
        true
    }

    /// Forks a process of `unit` under `invocation` into `cgroup`: `parent` forked it at
    /// `start_us`.
    pub(crate) fn spawn(
        &mut self,
        cgroup: &str,
        invocation: Inv,
        unit: usize,
        role: Role,
        parent: Pid,
        start_us: u64,
    ) -> Pid {
        self.mkdir(cgroup);
        self.next_free_pid();
        self.spawned += 1;
        let session = match role {
            Role::Child => self.procs.get(&parent).map_or(self.next_pid, |p| p.session),
            Role::Main | Role::Control | Role::Clean => self.next_pid,
        };
        let proc = Proc {
            id: self.spawned,
            pid: self.next_pid,
            ppid: parent,
            session,
            start_us,
            start_boot_us: start_us + self.suspended_us,
            cgroup: cgroup.to_owned(),
            invocation,
            unit,
            role,
            waits_for_start: false,
        };
        self.notifying(|k| {
            k.procs.insert(proc.pid, proc);
        });
        self.next_pid
    }

    /// The kernel's next pid (`alloc_pid`): the one after the last, wrapping past `pid_max`
    /// to the low end, skipping pids in use (a session or group id in use included, here only
    /// sessions).
    fn next_free_pid(&mut self) {
        if self.procs.len() + 200 >= self.pid_max as usize {
            self.pid_max *= 2;
        }
        loop {
            self.next_pid += 1;
            if self.next_pid >= self.pid_max {
                self.next_pid = 100;
            }
            let pid = self.next_pid;
            if !self.procs.contains_key(&pid) && !self.procs.values().any(|p| p.session == pid) {
                return;
            }
        }
    }

    /// `setsid()`: the process begins a session of its own.
    pub(crate) fn setsid(&mut self, pid: Pid) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.session = pid;
        }
    }

    /// What the process is to its unit from now on (a daemon made MainPID, a main process
    /// forgotten at the end of a stop).
    pub(crate) fn set_role(&mut self, pid: Pid, role: Role) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.role = role;
        }
    }

    /// The manager writes `pid` into `cgroup`'s `cgroup.procs` (scope attach: a privileged
    /// write; a unit's own processes cannot leave their cgroup, as the trust model has it).
    pub(crate) fn move_to(&mut self, pid: Pid, cgroup: &str) {
        self.mkdir(cgroup);
        let cgroup = cgroup.to_owned();
        self.notifying(|k| {
            if let Some(p) = k.procs.get_mut(&pid) {
                p.cgroup = cgroup;
            }
        });
    }

    /// Whether process `id`, once given `pid`, still lives (what its pidfd tells).
    pub(crate) fn alive_id(&self, pid: Pid, id: u64) -> bool {
        self.procs.get(&pid).is_some_and(|p| p.id == id)
    }

    pub(crate) fn kill(&mut self, pid: Pid) -> bool {
        let mut existed = false;
        self.notifying(|k| existed = k.procs.remove(&pid).is_some());
        self.reparent_orphans();
        existed
    }

    /// Kills everything in `path` and below (`cgroup.kill`, or KillMode=control-group).
    pub(crate) fn kill_all(&mut self, path: &str) -> usize {
        let pids: Vec<Pid> = self.pids_in(path);
        self.notifying(|k| k.procs.retain(|_, p| !within(&p.cgroup, path)));
        self.reparent_orphans();
        pids.len()
    }

    /// The children of processes that died now have the manager as parent.
    fn reparent_orphans(&mut self) {
        let alive: BTreeSet<Pid> = self.procs.keys().copied().collect();
        for p in self.procs.values_mut() {
            if p.ppid != MANAGER && !alive.contains(&p.ppid) {
                p.ppid = MANAGER;
            }
        }
    }

    pub(crate) fn alive(&self, pid: Pid) -> bool {
        self.procs.contains_key(&pid)
    }

    pub(crate) fn pids_in(&self, path: &str) -> Vec<Pid> {
        self.procs
            .values()
            .filter(|p| within(&p.cgroup, path))
            .map(|p| p.pid)
            .collect()
    }

    /// The agent adds a watch; it never fails in this model unless `fail` says so (the
    /// inotify watch limit).
    /// Watching again puts the watches on the inodes there now, for every user of the path
    /// (one descriptor an inode, shared).
    pub(crate) fn watch(&mut self, path: &str) {
        let (dir, parent) = (self.inode(path), self.parent_inode(path));
        let watch = self.watched.entry(path.to_owned()).or_insert(Watched {
            users: 0,
            dir,
            parent,
        });
        watch.users += 1;
        watch.dir = dir;
        watch.parent = parent;
    }

    pub(crate) fn unwatch(&mut self, path: &str) {
        if let Some(watch) = self.watched.get_mut(path) {
            watch.users -= 1;
            if watch.users == 0 {
                self.watched.remove(path);
                self.pending.remove(path);
            }
        }
    }

    /// The agent died: its inotify descriptor, and everything queued on it, is gone.
    pub(crate) fn drop_watches(&mut self) {
        self.watched.clear();
        self.pending.clear();
        self.lost.clear();
        self.overflow = false;
    }

    /// A process as a violation report names it.
    pub(crate) fn describe(&self, pid: Pid, units: &[String]) -> String {
        match self.procs.get(&pid) {
            Some(p) => format!(
                "{pid} ({:?} of {}, child of {}, started at {:.6} s, in {})",
                p.role,
                units.get(p.unit).map_or("?", String::as_str),
                p.ppid,
                p.start_us as f64 / 1e6,
                p.cgroup
            ),
            None => format!("{pid} (gone)"),
        }
    }

    pub(crate) fn watched_paths(&self) -> Vec<String> {
        self.watched.keys().cloned().collect()
    }

    /// The kernel drops queued events and says only that it did.
    pub(crate) fn overflow_now(&mut self) {
        self.pending.clear();
        self.overflow = true;
    }

    /// The kernel dropped the watch of `path` (all its users).
    pub(crate) fn lose_watch(&mut self, path: &str) {
        if self.watched.remove(path).is_some() {
            self.pending.remove(path);
            self.lost.insert(path.to_owned());
        }
    }

    pub(crate) fn pending_paths(&self) -> Vec<String> {
        self.pending.iter().cloned().collect()
    }

    pub(crate) fn take_pending(&mut self, path: &str) -> bool {
        self.pending.remove(path)
    }

    pub(crate) fn take_lost(&mut self) -> Vec<String> {
        std::mem::take(&mut self.lost).into_iter().collect()
    }

    pub(crate) fn take_overflow(&mut self) -> bool {
        std::mem::take(&mut self.overflow)
    }

    pub(crate) fn has_notices(&self) -> bool {
        self.overflow || !self.pending.is_empty() || !self.lost.is_empty()
    }
}

/// Whether cgroup `path` is `root` or below it.
pub(crate) fn within(path: &str, root: &str) -> bool {
    path == root
        || path
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn populated_counts_descendants_and_notifications_merge() {
        let mut k = Kernel::new();
        k.watch("/a.service");
        let p2 = k.spawn("/a.service", 7, 0, Role::Main, MANAGER, 1);
        let p1 = k.spawn("/a.service/payload", 7, 0, Role::Child, p2, 2);
        assert_eq!(k.read("/a.service"), Reading::Populated);
        assert_eq!(k.read("/a.servicex"), Reading::Gone);
        // Creation and populating: one pending notification, not two.
        assert_eq!(k.pending_paths(), vec!["/a.service".to_owned()]);
        assert!(k.take_pending("/a.service"));
        // Watched before it existed, only its parent was: the agent watches it again.
        k.watch("/a.service");
        k.kill(p2);
        assert_eq!(k.procs[&p1].ppid, MANAGER, "the orphan goes to the manager");
        assert!(!k.take_pending("/a.service"), "still populated: no change");
        assert!(
            !k.rmdir("/a.service"),
            "a populated cgroup cannot be removed"
        );
        k.kill(p1);
        assert!(k.take_pending("/a.service"));
        assert!(k.rmdir("/a.service"));
        assert_eq!(k.read("/a.service"), Reading::Gone);
        assert!(!k.exists("/a.service/payload"));
    }
    #[test]
    fn a_watch_is_on_an_inode_and_a_cgroup_made_again_is_a_new_one() {
        let mut k = Kernel::new();
        k.mkdir("/s.slice");
        k.mkdir("/s.slice/a.service");
        k.watch("/s.slice/a.service");
        assert!(k.rmdir("/s.slice/a.service"));
        assert!(
            k.take_pending("/s.slice/a.service"),
            "the parent hears it go"
        );
        k.mkdir("/s.slice/a.service");
        assert!(
            k.take_pending("/s.slice/a.service"),
            "the parent hears it come"
        );
        let pid = k.spawn("/s.slice/a.service", 7, 0, Role::Main, MANAGER, 1);
        assert!(
            !k.take_pending("/s.slice/a.service"),
            "the old watch is on the removed inode's cgroup.events"
        );
        k.watch("/s.slice/a.service");
        k.kill(pid);
        assert!(k.take_pending("/s.slice/a.service"), "watched again: heard");
        // A slice made again: the watch on its old inode hears nothing of what is below.
        assert!(k.rmdir("/s.slice"));
        assert!(k.take_pending("/s.slice/a.service"));
        k.mkdir("/s.slice");
        k.mkdir("/s.slice/a.service");
        assert!(!k.take_pending("/s.slice/a.service"));
    }

    #[test]
    fn a_process_moved_into_a_watched_cgroup_populates_it() {
        let mut k = Kernel::new();
        k.mkdir("/a.scope");
        k.watch("/a.scope");
        let pid = k.spawn("/session.scope", 7, 0, Role::Child, MANAGER, 1);
        assert!(!k.take_pending("/a.scope"));
        k.move_to(pid, "/a.scope");
        assert!(k.take_pending("/a.scope"), "cgroup.events changed");
        assert_eq!(k.read("/a.scope"), Reading::Populated);
        assert_eq!(k.read("/session.scope"), Reading::Empty);
    }
}

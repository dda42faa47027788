//! Watches the `cgroup.events` files of many units with ONE non-blocking inotify descriptor that the
//! agent polls in its single-threaded mio loop. It only says which unit to re-read; it must never report
//! a unit's state from a notification (the kernel merges and delays them), only [`CgroupWatcher::read`]
//! reads state, and it must never leak a watch.
//!
//! Two kinds of watch exist: `IN_MODIFY` on `<unit dir>/cgroup.events`, and `IN_CREATE|IN_DELETE` on
//! the unit's parent directory, because removing a cgroup sends nothing to the watch on its own
//! `cgroup.events`. The kernel gives one descriptor per inode, so many units (all services of a slice)
//! share one parent watch; each watch is reference-counted by the keys that use it.
//!
//! Removing a cgroup directory sends nothing to watches on the directory itself either (no
//! `IN_DELETE_SELF`, no `IN_IGNORED`; seen on Linux 6.18). So a parent watch on a removed slice stays
//! held until its keys are unwatched, and a slice re-created meanwhile is a new inode that the old watch
//! does not see: the caller must call [`CgroupWatcher::add_watches`] again when systemd reports the unit anew.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::hash::Hash;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};
use nix::errno::Errno;

use super::CgroupError;
use super::events::parse_populated;
use super::watch_table::{Clash, Role, Unused, WatchTable};
use crate::key_hash::KeyMap;
use crate::memory::shrink_when_sparse;
use crate::proof::CgroupReading;

/// The file of a cgroup whose `populated` key says whether any process is left in it or below it.
const EVENTS_FILE: &str = "cgroup.events";

/// `cgroup.events` is a few dozen bytes; anything larger than this is not one.
const MAX_EVENTS_FILE_BYTES: usize = 4096;

/// Room for many events per read; one event needs at most 16 bytes plus a 256-byte name.
const EVENT_BUFFER_BYTES: usize = 4096;

/// What the watcher asks its caller to do after draining inotify.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Notice<K> {
    /// Something about this unit's cgroup may have changed: read it again.
    Changed(K),
    /// The kernel dropped a watch this unit used (`IN_IGNORED`): rebuild its watches, then
    /// read it again.
    Lost(K),
    /// The kernel dropped events (`IN_Q_OVERFLOW`): rebuild every watch and read every unit
    /// again.
    Overflow,
}

/// The cgroup of one watched unit, and the watches it holds.
#[derive(Debug)]
struct Unit {
    /// The directory that holds the unit's cgroup directory, shared with its parent watch and
    /// so with every sibling (all services of a slice).
    parent: Rc<Path>,
    /// The name of the unit's cgroup directory inside `parent`, shared with the parent
    /// watch's list of children.
    name: Rc<OsStr>,
    /// The descriptor of the watch on `parent`, if the directory existed.
    parent_wd: Option<i32>,
    /// The descriptor of the watch on the unit's `cgroup.events`, if the cgroup existed.
    events_wd: Option<i32>,
}

impl Unit {
    fn events_path(&self) -> PathBuf {
        self.parent.join(&*self.name).join(EVENTS_FILE)
    }
}

/// One decoded inotify event; kept apart from the read so that dispatch can be tested with synthetic
/// events (an overflow cannot be forced without changing machine-wide limits).
#[derive(Clone, Copy, Debug)]
struct RawEvent<'a> {
    wd: i32,
    mask: EventMask,
    name: Option<&'a OsStr>,
}

/// Watches units' cgroups with one inotify descriptor, keyed by a caller-chosen unit key.
#[derive(Debug)]
pub(crate) struct CgroupWatcher<K> {
    root: PathBuf,
    inotify: Inotify,
    units: KeyMap<K, Unit>,
    watches: WatchTable<K>,
}

impl<K: Copy + Eq + Hash + std::fmt::Debug> CgroupWatcher<K> {
    /// Creates a watcher for cgroups below `root`, the cgroup2 mount point.
    pub(crate) fn new(root: PathBuf) -> Result<Self, CgroupError> {
        let inotify = Inotify::init().map_err(|source| CgroupError::InotifyInit { source })?;
        Ok(Self {
            root,
            inotify,
            units: KeyMap::default(),
            watches: WatchTable::new(),
        })
    }

    /// Returns the inotify descriptor, for the caller to register in mio as readable.
    pub(crate) fn as_raw_fd(&self) -> RawFd {
        self.inotify.as_raw_fd()
    }

    /// Starts watching `cgroup` (as systemd reports it, such as `/app.slice/x.service`) for `key`.
    ///
    /// Calling it again for the same key moves the watch. The watches are in place when this returns,
    /// so the caller must [`read`](Self::read) afterwards: a change before the watch existed is seen
    /// only by that read. A cgroup (or parent) that does not exist is not an error: `read` then says
    /// [`CgroupReading::Gone`], and a cgroup created later in an existing parent is reported. On error
    /// the key is left unwatched.
    pub(crate) fn add_watches(&mut self, key: K, cgroup: &str) -> Result<(), CgroupError> {
        let (parent, name) = locate(&self.root, cgroup)?;
        self.remove_watches(key);
        let mut unit = Unit {
            parent: Rc::from(parent),
            name: Rc::from(name),
            parent_wd: None,
            events_wd: None,
        };
        match self.add_unit_watches(key, &mut unit) {
            Ok(()) => {
                self.units.insert(key, unit);
                Ok(())
            }
            Err(error) => {
                self.remove_unit_watches(key, &unit);
                Err(error)
            }
        }
    }

    /// Stops watching `key`, removing every watch no other key uses. Unknown keys are ignored.
    pub(crate) fn remove_watches(&mut self, key: K) {
        if let Some(unit) = self.units.remove(&key) {
            shrink_when_sparse(&mut self.units);
            self.remove_unit_watches(key, &unit);
        }
    }

    /// Reads the unit's `cgroup.events` now. A cgroup that does not exist is
    /// [`CgroupReading::Gone`]; a key this watcher does not know is unreadable, never gone: not
    /// knowing is no evidence. The agent reads by path, in its turn; the benchmark's observer
    /// reads by key.
    #[cfg(any(test, feature = "bench"))]
    pub(crate) fn read(&self, key: K) -> CgroupReading {
        match self.units.get(&key) {
            Some(unit) => read_events_file(&unit.events_path()),
            None => CgroupReading::Unreadable(format!("no cgroup is watched for {key:?}")),
        }
    }

    /// Reads the `cgroup.events` of `cgroup` (as systemd reports it) now, whether or not it
    /// is watched. A cgroup that does not exist is [`CgroupReading::Gone`].
    pub(crate) fn read_cgroup(&self, cgroup: &str) -> CgroupReading {
        match locate(&self.root, cgroup) {
            Ok((parent, name)) => read_events_file(&parent.join(name).join(EVENTS_FILE)),
            Err(error) => CgroupReading::Unreadable(error.to_string()),
        }
    }

    /// Reads every pending inotify event and appends what the caller must re-read to `out`.
    ///
    /// If re-adding a watch for a re-created cgroup fails, every event is still handled and the
    /// notices are in `out`, then the first such error is returned.
    pub(crate) fn drain(&mut self, out: &mut Vec<Notice<K>>) -> Result<(), CgroupError> {
        let mut buffer = [0u8; EVENT_BUFFER_BYTES];
        let mut first_error = None;
        loop {
            let events = match self.inotify.read_events(&mut buffer) {
                Ok(events) => events,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => return Err(CgroupError::InotifyRead { source }),
            };
            for event in events {
                let event = RawEvent {
                    wd: event.wd.get_watch_descriptor_id(),
                    mask: event.mask,
                    name: event.name,
                };
                if let Err(error) = self.dispatch(event, out) {
                    first_error.get_or_insert(error);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Returns how many inotify watches are held now.
    pub(crate) fn watch_count(&self) -> usize {
        self.watches.len()
    }

    /// Adds the parent watch, then the `cgroup.events` watch, recording them in `unit`.
    fn add_unit_watches(&mut self, key: K, unit: &mut Unit) -> Result<(), CgroupError> {
        // The parent first, so that a cgroup created between the two adds is still reported.
        // No MOVED_FROM/MOVED_TO: cgroup v2 refuses to rename cgroups (EPERM).
        let parent_mask = WatchMask::CREATE | WatchMask::DELETE | WatchMask::ONLYDIR;
        let Some(descriptor) = self.add_watch(&unit.parent, parent_mask)? else {
            return Ok(());
        };
        let wd = self.attach(key, descriptor, &unit.parent, Role::Parent(&unit.name))?;
        unit.parent_wd = Some(wd);
        // Every unit under one parent shares its path.
        if let Some(path) = self.watches.parent_path(wd)
            && *path == unit.parent
        {
            unit.parent = Rc::clone(path);
        }
        self.add_events_watch(key, unit)
    }

    /// Adds the watch on the unit's `cgroup.events`, unless the cgroup does not exist.
    fn add_events_watch(&mut self, key: K, unit: &mut Unit) -> Result<(), CgroupError> {
        let path = unit.events_path();
        if let Some(descriptor) = self.add_watch(&path, WatchMask::MODIFY)? {
            unit.events_wd = Some(self.attach(key, descriptor, &path, Role::Events)?);
        }
        Ok(())
    }

    /// Adds an inotify watch; `None` means the path does not exist.
    fn add_watch(
        &mut self,
        path: &Path,
        mask: WatchMask,
    ) -> Result<Option<WatchDescriptor>, CgroupError> {
        match self.inotify.watches().add(path, mask) {
            Ok(descriptor) => Ok(Some(descriptor)),
            Err(error) => classify_add_error(path, error).map(|()| None),
        }
    }

    /// Records that `key` uses the watch `descriptor` in `role`, and returns the descriptor's
    /// number, which is what the table keeps of it.
    fn attach(
        &mut self,
        key: K,
        descriptor: WatchDescriptor,
        path: &Path,
        role: Role<'_>,
    ) -> Result<i32, CgroupError> {
        let wd = descriptor.get_watch_descriptor_id();
        self.watches
            .attach(key, wd, path, role)
            .map_err(|Clash| CgroupError::WatchClash {
                path: path.to_owned(),
            })?;
        Ok(wd)
    }

    /// Records that `key` no longer uses watch `wd` in `role`, and removes the watch once unused.
    fn detach(&mut self, key: K, wd: i32, role: Role<'_>) {
        if let Some(unused) = self.watches.detach(key, wd, role) {
            self.remove_kernel_watch(unused);
        }
    }

    /// Removes a watch from the kernel, by its number on this watcher's inotify descriptor (the
    /// inotify crate removes only by a `WatchDescriptor`, which the table does not keep).
    fn remove_kernel_watch(&mut self, unused: Unused) {
        let wd = unused.wd;
        // SAFETY: inotify_rm_watch takes a descriptor and a number and touches no memory.
        let removed = unsafe { libc::inotify_rm_watch(self.inotify.as_raw_fd(), wd) };
        let result = if removed == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        };
        match result {
            Ok(()) => {}
            // The kernel already dropped the watch because its inode went away.
            Err(error) if error.raw_os_error() == Some(Errno::EINVAL as i32) => {}
            Err(error) => match &unused.parent {
                Some(path) => {
                    log::warn!("cannot remove inotify watch on {}: {error}", path.display())
                }
                None => {
                    log::warn!("cannot remove inotify watch {wd} on a cgroup.events: {error}")
                }
            },
        }
    }

    /// Releases every watch `unit` holds for `key`.
    fn remove_unit_watches(&mut self, key: K, unit: &Unit) {
        if let Some(wd) = unit.events_wd {
            self.detach(key, wd, Role::Events);
        }
        if let Some(wd) = unit.parent_wd {
            self.detach(key, wd, Role::Parent(&unit.name));
        }
    }

    /// Releases the `cgroup.events` watch of `key`, whose cgroup was removed.
    fn drop_events_watch(&mut self, key: K) {
        if let Some(wd) = self
            .units
            .get_mut(&key)
            .and_then(|unit| unit.events_wd.take())
        {
            self.detach(key, wd, Role::Events);
        }
    }

    /// Watches the `cgroup.events` of a re-created cgroup of `key` (a new inode).
    fn rewatch_events(&mut self, key: K) -> Result<(), CgroupError> {
        self.drop_events_watch(key);
        let Some(mut unit) = self.units.remove(&key) else {
            return Ok(());
        };
        let result = self.add_events_watch(key, &mut unit);
        self.units.insert(key, unit);
        result
    }

    /// Handles one decoded event, appending what the caller must re-read to `out`.
    fn dispatch(
        &mut self,
        event: RawEvent<'_>,
        out: &mut Vec<Notice<K>>,
    ) -> Result<(), CgroupError> {
        if event.mask.contains(EventMask::Q_OVERFLOW) {
            out.push(Notice::Overflow);
            return Ok(());
        }
        if event.mask.contains(EventMask::IGNORED) {
            self.on_kernel_dropped(event.wd, out);
            return Ok(());
        }
        // An unknown descriptor is a late event of a watch already removed: no keys.
        let keys = self.watches.keys_to_reread(
            event.wd,
            event.mask.contains(EventMask::MODIFY),
            event.name,
        );
        let mut first_error = None;
        for &key in &keys {
            if event.mask.contains(EventMask::DELETE) {
                self.drop_events_watch(key);
            }
            if event.mask.contains(EventMask::CREATE)
                && let Err(error) = self.rewatch_events(key)
            {
                first_error.get_or_insert(error);
            }
            out.push(Notice::Changed(key));
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Forgets watch `wd`, which the kernel dropped (`IN_IGNORED`), and asks for a re-read of every
    /// key that used it.
    fn on_kernel_dropped(&mut self, wd: i32, out: &mut Vec<Notice<K>>) {
        let keys = self.watches.kernel_dropped(wd);
        for key in keys {
            if let Some(unit) = self.units.get_mut(&key) {
                if unit.events_wd == Some(wd) {
                    unit.events_wd = None;
                }
                if unit.parent_wd == Some(wd) {
                    unit.parent_wd = None;
                }
            }
            out.push(Notice::Lost(key));
        }
    }
}

/// Checks a cgroup string as systemd reports it and returns the unit's parent directory below `root`
/// and the name of its cgroup directory. Nothing touches the file system with a rejected string.
pub(crate) fn locate(root: &Path, cgroup: &str) -> Result<(PathBuf, OsString), CgroupError> {
    let invalid = |reason| CgroupError::InvalidCgroup {
        cgroup: cgroup.to_owned(),
        reason,
    };
    let relative = cgroup
        .strip_prefix('/')
        .ok_or_else(|| invalid("must start with /"))?;
    if cgroup.contains('\0') {
        return Err(invalid("contains a nul byte"));
    }
    let components: Vec<&str> = relative.split('/').collect();
    if components.iter().any(|component| component.is_empty()) {
        return Err(invalid("has an empty component"));
    }
    if components
        .iter()
        .any(|component| matches!(*component, "." | ".."))
    {
        return Err(invalid("has a . or .. component"));
    }
    let Some((name, ancestors)) = components.split_last() else {
        // split('/') always yields at least one component, and empty ones were rejected above.
        return Err(invalid("has no component"));
    };
    let mut parent = root.to_path_buf();
    parent.extend(ancestors);
    Ok((parent, OsString::from(name)))
}

/// Turns a failed `inotify_add_watch` into `Ok(())` when the path does not exist, or an error.
fn classify_add_error(path: &Path, error: io::Error) -> Result<(), CgroupError> {
    let path = path.to_owned();
    match error.raw_os_error().map(Errno::from_raw) {
        Some(Errno::ENOENT) => Ok(()),
        Some(Errno::ENOSPC) => Err(CgroupError::WatchLimit {
            path,
            source: error,
        }),
        _ => Err(CgroupError::Watch {
            path,
            source: error,
        }),
    }
}

/// Reads a `cgroup.events` file now. A missing file (or a cgroup being removed, ENODEV) is
/// [`CgroupReading::Gone`]; any other failure is [`CgroupReading::Unreadable`], naming the path.
pub(crate) fn read_events_file(path: &Path) -> CgroupReading {
    let mut contents = Vec::new();
    // One byte more than allowed, to tell a full-size file from an oversized one.
    let limit = MAX_EVENTS_FILE_BYTES as u64 + 1;
    let result = File::open(path).and_then(|file| file.take(limit).read_to_end(&mut contents));
    match result {
        Err(error)
            if matches!(
                error.raw_os_error().map(Errno::from_raw),
                Some(Errno::ENOENT | Errno::ENODEV)
            ) =>
        {
            CgroupReading::Gone
        }
        Err(error) => CgroupReading::Unreadable(format!("cannot read {}: {error}", path.display())),
        Ok(_) if contents.len() > MAX_EVENTS_FILE_BYTES => CgroupReading::Unreadable(format!(
            "{} is larger than {MAX_EVENTS_FILE_BYTES} bytes",
            path.display()
        )),
        Ok(_) => match parse_populated(&contents) {
            Ok(true) => CgroupReading::Populated,
            Ok(false) => CgroupReading::Empty,
            Err(error) => CgroupReading::Unreadable(format!("{}: {error}", path.display())),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::fs;
    use std::process::{Child, Command};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use mio::unix::SourceFd;
    use mio::{Events, Interest, Poll, Token};

    use super::*;
    use crate::cgroup::MAX_USER_WATCHES_PATH;
    use crate::cgroup::mount::cgroup2_mount;

    /// How long a test waits for the kernel before failing; generous, never a speed assertion.
    const KERNEL_WAIT: Duration = Duration::from_secs(20);

    static NEXT_SCRATCH: AtomicUsize = AtomicUsize::new(0);

    fn unique_name() -> String {
        let n = NEXT_SCRATCH.fetch_add(1, Ordering::Relaxed);
        format!("exitproof-cgtest-{}-{n}", std::process::id())
    }

    /// A scratch cgroup below the real cgroup2 mount and the `sleep`s started in it. Dropping it kills
    /// them and removes every cgroup below it, deepest first, even when the test failed. Only root
    /// may make one, so the tests that do are `#[ignore]`d: `cargo test --lib` passes as anyone,
    /// and scripts/test, as root, runs them with `--ignored`.
    struct ScratchCgroup {
        mount: PathBuf,
        name: String,
        sleeps: HashMap<u32, Child>,
    }

    impl ScratchCgroup {
        fn new() -> Self {
            let mount = cgroup2_mount().expect("the test machine has a cgroup2 mount");
            let name = unique_name();
            fs::create_dir(mount.join(&name)).expect("root may create a scratch cgroup");
            Self {
                mount,
                name,
                sleeps: HashMap::new(),
            }
        }

        fn dir(&self) -> PathBuf {
            self.mount.join(&self.name)
        }

        /// The cgroup string of `child` (a path below the scratch cgroup), as systemd reports one.
        fn cgroup(&self, child: &str) -> String {
            format!("/{}/{child}", self.name)
        }

        fn mkdir(&self, child: &str) {
            fs::create_dir(self.dir().join(child)).expect("mkdir of a scratch cgroup");
        }

        fn rmdir(&self, child: &str) {
            fs::remove_dir(self.dir().join(child)).expect("rmdir of an empty scratch cgroup");
        }

        /// Starts `sleep 1000` and moves it into cgroup `child`; returns its pid.
        fn spawn_sleep_in(&mut self, child: &str) -> u32 {
            let sleep = Command::new("sleep")
                .arg("1000")
                .spawn()
                .expect("sleep can be started");
            let pid = sleep.id();
            self.sleeps.insert(pid, sleep);
            fs::write(self.dir().join(child).join("cgroup.procs"), pid.to_string())
                .expect("a pid can be moved into a scratch cgroup");
            pid
        }

        /// Kills and reaps the sleep with this pid.
        fn kill(&mut self, pid: u32) {
            if let Some(mut sleep) = self.sleeps.remove(&pid) {
                let _ = sleep.kill();
                let _ = sleep.wait();
            }
        }
    }

    impl Drop for ScratchCgroup {
        fn drop(&mut self) {
            // cgroup.kill catches anything that was moved in; our own sleeps are then reaped by pid.
            let _ = fs::write(self.dir().join("cgroup.kill"), "1");
            let pids: Vec<u32> = self.sleeps.keys().copied().collect();
            for pid in pids {
                self.kill(pid);
            }
            remove_cgroup_tree(&self.dir());
        }
    }

    /// Removes a cgroup and its descendants, deepest first.
    fn remove_cgroup_tree(dir: &Path) {
        if let Ok(entries) = fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                    remove_cgroup_tree(&entry.path());
                }
            }
        }
        // A killed task may take a moment to leave its cgroup; rmdir says EBUSY until then.
        let deadline = Instant::now() + KERNEL_WAIT;
        while let Err(error) = fs::remove_dir(dir) {
            if error.raw_os_error() != Some(Errno::EBUSY as i32) || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A plain temporary directory used as a fake cgroup root; removed on drop.
    struct TempRoot(PathBuf);

    impl TempRoot {
        fn new() -> Self {
            let dir = std::env::temp_dir().join(unique_name());
            fs::create_dir(&dir).expect("a temporary directory can be created");
            Self(dir)
        }

        /// Creates `<root><cgroup>/cgroup.events` with `contents`.
        fn write_events(&self, cgroup: &str, contents: &[u8]) {
            let dir = self.0.join(cgroup.trim_start_matches('/'));
            fs::create_dir_all(&dir).expect("a fake cgroup directory can be created");
            fs::write(dir.join(EVENTS_FILE), contents)
                .expect("a fake cgroup.events can be written");
        }
    }

    impl Drop for TempRoot {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// Polls the watcher's descriptor with mio and drains it until `done` holds for one drained batch
    /// (checked right after that batch, so a read in `done` follows the notification). Returns every
    /// notice seen; panics after [`KERNEL_WAIT`].
    fn wait_for(
        watcher: &mut CgroupWatcher<u32>,
        what: &str,
        mut done: impl FnMut(&CgroupWatcher<u32>, &[Notice<u32>]) -> bool,
    ) -> Vec<Notice<u32>> {
        let mut poll = Poll::new().expect("mio poll");
        let fd = watcher.as_raw_fd();
        poll.registry()
            .register(&mut SourceFd(&fd), Token(0), Interest::READABLE)
            .expect("the inotify descriptor can be registered");
        let mut events = Events::with_capacity(8);
        let deadline = Instant::now() + KERNEL_WAIT;
        let mut seen = Vec::new();
        loop {
            let mut batch = Vec::new();
            watcher.drain(&mut batch).expect("drain");
            seen.extend_from_slice(&batch);
            if done(watcher, &batch) {
                return seen;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                panic!("timed out waiting for {what}; notices seen: {seen:?}");
            };
            poll.poll(&mut events, Some(left)).expect("mio poll");
        }
    }

    /// `done` for [`wait_for`]: the batch asked to re-read `key`, and a read now gives `reading`.
    fn changed_to(
        key: u32,
        reading: CgroupReading,
    ) -> impl FnMut(&CgroupWatcher<u32>, &[Notice<u32>]) -> bool {
        move |watcher, batch| batch.contains(&Notice::Changed(key)) && watcher.read(key) == reading
    }

    #[test]
    #[ignore = "creates cgroups, so it needs root: scripts/test runs it with --ignored as root"]
    fn real_cgroup_lifecycle_is_reported() {
        let mut scratch = ScratchCgroup::new();
        scratch.mkdir("unit");
        let pid = scratch.spawn_sleep_in("unit");
        let mut watcher = CgroupWatcher::new(scratch.mount.clone()).expect("watcher");
        watcher
            .add_watches(1, &scratch.cgroup("unit"))
            .expect("watch");
        assert_eq!(watcher.watch_count(), 2, "parent and cgroup.events watches");
        assert_eq!(watcher.read(1), CgroupReading::Populated);

        scratch.kill(pid);
        wait_for(
            &mut watcher,
            "populated 0",
            changed_to(1, CgroupReading::Empty),
        );

        scratch.rmdir("unit");
        wait_for(&mut watcher, "removal", changed_to(1, CgroupReading::Gone));
        assert_eq!(watcher.watch_count(), 1, "only the parent watch is left");

        scratch.mkdir("unit");
        wait_for(
            &mut watcher,
            "re-creation",
            changed_to(1, CgroupReading::Empty),
        );
        assert_eq!(watcher.watch_count(), 2, "the new cgroup.events is watched");

        // The watch on the re-created cgroup's new cgroup.events inode works.
        let pid = scratch.spawn_sleep_in("unit");
        wait_for(
            &mut watcher,
            "populated 1",
            changed_to(1, CgroupReading::Populated),
        );
        scratch.kill(pid);
        wait_for(
            &mut watcher,
            "populated 0 again",
            changed_to(1, CgroupReading::Empty),
        );

        watcher.remove_watches(1);
        assert_eq!(watcher.watch_count(), 0);
    }

    /// The watches the kernel holds on `watcher`'s inotify descriptor (one `inotify wd:` line
    /// each in its fdinfo), to check what the watcher removed is gone from the kernel too.
    fn kernel_watches<K: Copy + Eq + Hash + std::fmt::Debug>(watcher: &CgroupWatcher<K>) -> usize {
        let fdinfo = format!("/proc/self/fdinfo/{}", watcher.as_raw_fd());
        let text = std::fs::read_to_string(fdinfo).expect("read the inotify descriptor's fdinfo");
        text.lines()
            .filter(|l| l.starts_with("inotify wd:"))
            .count()
    }

    #[test]
    #[ignore = "creates cgroups, so it needs root: scripts/test runs it with --ignored as root"]
    fn sibling_units_share_one_parent_watch() {
        let mut scratch = ScratchCgroup::new();
        scratch.mkdir("a");
        scratch.mkdir("b");
        let mut watcher = CgroupWatcher::new(scratch.mount.clone()).expect("watcher");
        watcher
            .add_watches(1, &scratch.cgroup("a"))
            .expect("watch a");
        watcher
            .add_watches(2, &scratch.cgroup("b"))
            .expect("watch b");
        watcher
            .add_watches(3, &scratch.cgroup("a"))
            .expect("watch a again under another key");
        assert_eq!(
            watcher.watch_count(),
            3,
            "one parent watch and two cgroup.events watches"
        );

        scratch.spawn_sleep_in("a");
        wait_for(&mut watcher, "both keys of a", |watcher, batch| {
            batch.contains(&Notice::Changed(1))
                && batch.contains(&Notice::Changed(3))
                && watcher.read(1) == CgroupReading::Populated
                && watcher.read(3) == CgroupReading::Populated
        });
        assert_eq!(watcher.read(2), CgroupReading::Empty);

        scratch.rmdir("b");
        wait_for(
            &mut watcher,
            "removal of b",
            changed_to(2, CgroupReading::Gone),
        );
        assert_eq!(watcher.watch_count(), 2);

        watcher.remove_watches(1);
        assert_eq!(watcher.watch_count(), 2, "key 3 still uses a's watches");
        assert_eq!(kernel_watches(&watcher), 2);
        watcher.remove_watches(3);
        assert_eq!(
            watcher.watch_count(),
            1,
            "key 2 still uses the parent watch"
        );
        assert_eq!(kernel_watches(&watcher), 1, "a's events watch removed");
        watcher.remove_watches(2);
        assert_eq!(watcher.watch_count(), 0);
        assert_eq!(kernel_watches(&watcher), 0, "the parent watch removed");
    }

    #[test]
    #[ignore = "creates cgroups, so it needs root: scripts/test runs it with --ignored as root"]
    fn missing_cgroup_is_gone_until_created() {
        let scratch = ScratchCgroup::new();
        let mut watcher = CgroupWatcher::new(scratch.mount.clone()).expect("watcher");

        watcher
            .add_watches(1, &scratch.cgroup("nowhere/unit"))
            .expect("missing parent is no error");
        assert_eq!(watcher.watch_count(), 0);
        assert_eq!(watcher.read(1), CgroupReading::Gone);

        watcher
            .add_watches(2, &scratch.cgroup("later"))
            .expect("missing cgroup is no error");
        assert_eq!(watcher.watch_count(), 1, "only the parent watch");
        assert_eq!(watcher.read(2), CgroupReading::Gone);

        scratch.mkdir("later");
        wait_for(
            &mut watcher,
            "creation",
            changed_to(2, CgroupReading::Empty),
        );
        assert_eq!(watcher.watch_count(), 2);

        watcher.remove_watches(1);
        watcher.remove_watches(2);
        assert_eq!(watcher.watch_count(), 0);
    }

    #[test]
    #[ignore = "creates cgroups, so it needs root: scripts/test runs it with --ignored as root"]
    fn watching_again_moves_the_watch() {
        let mut scratch = ScratchCgroup::new();
        scratch.mkdir("old");
        scratch.mkdir("new");
        scratch.spawn_sleep_in("old");
        let mut watcher = CgroupWatcher::new(scratch.mount.clone()).expect("watcher");
        watcher
            .add_watches(1, &scratch.cgroup("old"))
            .expect("watch old");
        assert_eq!(watcher.read(1), CgroupReading::Populated);

        watcher
            .add_watches(1, &scratch.cgroup("new"))
            .expect("watch new");
        assert_eq!(watcher.watch_count(), 2);
        assert_eq!(
            watcher.read(1),
            CgroupReading::Empty,
            "the read follows the new path"
        );

        scratch.spawn_sleep_in("new");
        wait_for(
            &mut watcher,
            "populated 1 in new",
            changed_to(1, CgroupReading::Populated),
        );

        watcher.remove_watches(1);
        assert_eq!(watcher.watch_count(), 0);
    }

    #[test]
    fn invalid_cgroup_strings_are_rejected() {
        let root = TempRoot::new();
        let mut watcher = CgroupWatcher::new(root.0.clone()).expect("watcher");
        let cases = [
            ("", "must start with /"),
            ("a.slice/x.service", "must start with /"),
            ("/", "has an empty component"),
            ("//a", "has an empty component"),
            ("/a//b", "has an empty component"),
            ("/a/", "has an empty component"),
            ("/..", "has a . or .. component"),
            ("/a/../b", "has a . or .. component"),
            ("/a/.", "has a . or .. component"),
            ("/a\0b", "contains a nul byte"),
        ];
        for (cgroup, expected) in cases {
            match watcher.add_watches(1, cgroup) {
                Err(CgroupError::InvalidCgroup { reason, .. }) => {
                    assert_eq!(reason, expected, "cgroup {cgroup:?}")
                }
                other => panic!("cgroup {cgroup:?} gave {other:?}"),
            }
            assert_eq!(watcher.watch_count(), 0);
            assert!(matches!(watcher.read(1), CgroupReading::Unreadable(_)));
            assert!(matches!(
                watcher.read_cgroup(cgroup),
                CgroupReading::Unreadable(why) if why.contains(expected)
            ));
        }
        // Dots inside a name are no traversal.
        watcher
            .add_watches(1, "/a..b.service")
            .expect("dots inside a name");
        watcher.remove_watches(1);
        assert_eq!(watcher.watch_count(), 0);
    }

    #[test]
    fn read_reports_what_the_file_shows() {
        let root = TempRoot::new();
        root.write_events("/populated", b"populated 1\nfrozen 0\n");
        root.write_events("/empty", b"populated 0\nfrozen 0\n");
        root.write_events("/garbage", b"populated maybe\n");
        // Exactly the size limit: still read whole.
        let mut full_size = b"populated 0\n".to_vec();
        full_size.extend(b"k v\n".repeat((MAX_EVENTS_FILE_BYTES - full_size.len()) / 4));
        assert_eq!(full_size.len(), MAX_EVENTS_FILE_BYTES);
        root.write_events("/full-size", &full_size);
        let mut oversized = full_size.clone();
        oversized.extend(b"k v\n");
        root.write_events("/oversized", &oversized);
        fs::create_dir_all(root.0.join("is-dir").join(EVENTS_FILE)).expect("mkdir");
        fs::create_dir(root.0.join("no-file")).expect("mkdir");

        let mut watcher = CgroupWatcher::new(root.0.clone()).expect("watcher");
        let cases: &[(&str, Option<CgroupReading>)] = &[
            ("/populated", Some(CgroupReading::Populated)),
            ("/empty", Some(CgroupReading::Empty)),
            ("/full-size", Some(CgroupReading::Empty)),
            ("/missing", Some(CgroupReading::Gone)),
            ("/missing/child", Some(CgroupReading::Gone)),
            ("/no-file", Some(CgroupReading::Gone)),
            // None: Unreadable, with a message naming the path.
            ("/garbage", None),
            ("/oversized", None),
            ("/is-dir", None),
        ];
        for (key, (cgroup, expected)) in (0u32..).zip(cases) {
            watcher.add_watches(key, cgroup).expect("watch");
            let reading = watcher.read(key);
            assert_eq!(
                reading,
                watcher.read_cgroup(cgroup),
                "by key and by path alike"
            );
            match expected {
                Some(expected) => assert_eq!(&reading, expected, "cgroup {cgroup}"),
                None => {
                    let path = root.0.join(&cgroup[1..]).join(EVENTS_FILE);
                    let path = path.display().to_string();
                    assert!(
                        matches!(&reading, CgroupReading::Unreadable(message) if message.contains(&path)),
                        "cgroup {cgroup} gave {reading:?}"
                    );
                }
            }
        }
        // Not knowing is no evidence: an unknown key is unreadable, never gone.
        assert!(
            matches!(watcher.read(999), CgroupReading::Unreadable(_)),
            "unknown key"
        );
        for key in 0..cases.len() as u32 {
            watcher.remove_watches(key);
        }
        assert_eq!(watcher.watch_count(), 0);
    }

    #[test]
    fn overflow_asks_to_reread_everything() {
        let root = TempRoot::new();
        root.write_events("/unit", b"populated 0\n");
        let mut watcher = CgroupWatcher::new(root.0.clone()).expect("watcher");
        watcher.add_watches(1, "/unit").expect("watch");
        let overflow = RawEvent {
            wd: -1,
            mask: EventMask::Q_OVERFLOW,
            name: None,
        };
        let mut out = Vec::new();
        watcher.dispatch(overflow, &mut out).expect("dispatch");
        assert_eq!(out, [Notice::Overflow]);
        assert_eq!(watcher.watch_count(), 2, "an overflow drops no watch");
        watcher.remove_watches(1);
        assert_eq!(watcher.watch_count(), 0);
    }

    #[test]
    fn kernel_dropped_watches_are_forgotten() {
        let root = TempRoot::new();
        root.write_events("/slice/a", b"populated 0\n");
        root.write_events("/slice/b", b"populated 0\n");
        let mut watcher = CgroupWatcher::new(root.0.clone()).expect("watcher");
        watcher.add_watches(1, "/slice/a").expect("watch a");
        watcher.add_watches(2, "/slice/b").expect("watch b");
        assert_eq!(watcher.watch_count(), 3);
        let wds = |watcher: &CgroupWatcher<u32>, key: u32| {
            let unit = &watcher.units[&key];
            (unit.parent_wd, unit.events_wd)
        };
        let (Some(parent_wd), Some(events_wd_a)) = wds(&watcher, 1) else {
            panic!("both watches of a are held");
        };

        // Synthetic IN_IGNORED events, as if the kernel had dropped these watches itself.
        let mut out = Vec::new();
        for wd in [events_wd_a, events_wd_a, 12345] {
            let ignored = RawEvent {
                wd,
                mask: EventMask::IGNORED,
                name: None,
            };
            watcher.dispatch(ignored, &mut out).expect("dispatch");
        }
        assert_eq!(
            out,
            [Notice::Lost(1)],
            "a repeated or unknown wd changes nothing"
        );
        assert_eq!(wds(&watcher, 1), (Some(parent_wd), None));
        assert_eq!(watcher.watch_count(), 2);

        out.clear();
        let ignored = RawEvent {
            wd: parent_wd,
            mask: EventMask::IGNORED,
            name: None,
        };
        watcher.dispatch(ignored, &mut out).expect("dispatch");
        out.sort_by_key(|notice| format!("{notice:?}"));
        assert_eq!(out, [Notice::Lost(1), Notice::Lost(2)]);
        assert_eq!(wds(&watcher, 1), (None, None));
        assert_eq!(
            watcher.watch_count(),
            1,
            "b's cgroup.events watch is still held"
        );

        watcher.remove_watches(1);
        watcher.remove_watches(2);
        assert_eq!(watcher.watch_count(), 0);
    }

    #[test]
    fn add_watch_errors_are_classified() {
        let path = Path::new("/sys/fs/cgroup/x.slice");
        assert!(
            classify_add_error(path, io::Error::from_raw_os_error(Errno::ENOENT as i32)).is_ok()
        );
        match classify_add_error(path, io::Error::from_raw_os_error(Errno::ENOSPC as i32)) {
            Err(error @ CgroupError::WatchLimit { .. }) => {
                let message = error.to_string();
                assert!(message.contains(MAX_USER_WATCHES_PATH), "{message}");
                assert!(message.contains("/sys/fs/cgroup/x.slice"), "{message}");
            }
            other => panic!("ENOSPC gave {other:?}"),
        }
        for errno in [Errno::EACCES, Errno::ENOTDIR, Errno::EINVAL] {
            match classify_add_error(path, io::Error::from_raw_os_error(errno as i32)) {
                Err(CgroupError::Watch {
                    path: error_path, ..
                }) => assert_eq!(error_path, path),
                other => panic!("{errno} gave {other:?}"),
            }
        }
    }
}

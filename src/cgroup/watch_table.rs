//! Who uses which inotify watch (pure): each watch descriptor with the keys that use it, either
//! as their `cgroup.events` or as the parent directory of their cgroup. The watcher makes the
//! inotify calls; this table decides when a watch is shared, unused, or whose it was.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::rc::Rc;

use crate::key_hash::KeyMap;
use crate::memory::shrink_when_sparse;

/// The part a key plays in a watch, naming the child directory for a parent watch.
#[derive(Clone, Copy, Debug)]
pub(super) enum Role<'a> {
    Events,
    Parent(&'a Rc<OsStr>),
}

/// The kernel gave one descriptor to watches of two kinds (which only happens when both paths
/// name one inode).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Clash;

/// A watch no key uses any more, for the caller to remove from the kernel.
#[derive(Debug)]
pub(super) struct Unused {
    /// Its descriptor number.
    pub(super) wd: i32,
    /// The directory of a parent watch; `None` for a `cgroup.events` watch.
    pub(super) parent: Option<Rc<Path>>,
}

/// The watches held, by descriptor number, which is all the kernel needs to remove one: the
/// inotify crate's `WatchDescriptor` beside it made every watch 16 bytes larger (262 KB at
/// 10,000 units).
#[derive(Debug)]
pub(super) struct WatchTable<K> {
    watches: KeyMap<i32, Target<K>>,
}

/// Who uses one inotify watch.
#[derive(Debug)]
enum Target<K> {
    /// A `cgroup.events` file, used by every key that watches that cgroup.
    Events(Keys<K>),
    /// A parent directory, boxed: there are few of them, and every watch would be its size.
    Parent(Box<ParentDir<K>>),
}

/// A watched parent directory.
#[derive(Debug)]
struct ParentDir<K> {
    path: Rc<Path>,
    /// The name of each watched child directory, and the keys watching it.
    children: HashMap<Rc<OsStr>, Keys<K>>,
}

/// The keys that use one watch or one child directory, each once, never none: almost always a
/// single one (an alias and its unit may share a cgroup), so that one is held inline and only
/// more go in a list, which would otherwise cost every unit two allocations. The list is boxed:
/// inline it would make every entry of both tables 16 bytes larger.
#[derive(Debug)]
enum Keys<K> {
    One(K),
    #[expect(
        clippy::box_collection,
        reason = "a thin pointer keeps the common `One` small"
    )]
    More(Box<Vec<K>>),
}

impl<K: Copy + PartialEq> Keys<K> {
    fn add(&mut self, key: K) {
        match self {
            Keys::One(first) if *first == key => {}
            Keys::One(first) => *self = Keys::More(Box::new(vec![*first, key])),
            Keys::More(keys) if keys.contains(&key) => {}
            Keys::More(keys) => keys.push(key),
        }
    }

    /// Removes `key`, and says whether none is left: the caller drops the keys then.
    fn remove(&mut self, key: K) -> bool {
        match self {
            Keys::One(first) => *first == key,
            Keys::More(keys) => {
                keys.retain(|k| *k != key);
                keys.is_empty()
            }
        }
    }

    fn to_vec(&self) -> Vec<K> {
        match self {
            Keys::One(first) => vec![*first],
            Keys::More(keys) => keys.to_vec(),
        }
    }
}

impl<K: Copy + PartialEq> WatchTable<K> {
    pub(super) fn new() -> Self {
        Self {
            watches: KeyMap::default(),
        }
    }

    /// How many watches are held.
    pub(super) fn len(&self) -> usize {
        self.watches.len()
    }

    /// Records that `key` uses watch `wd` (on `path`) in `role`. A descriptor already held
    /// keeps its first path.
    pub(super) fn attach(
        &mut self,
        key: K,
        wd: i32,
        path: &Path,
        role: Role<'_>,
    ) -> Result<(), Clash> {
        let target = self.watches.entry(wd).or_insert_with(|| match role {
            Role::Events => Target::Events(Keys::One(key)),
            Role::Parent(_) => Target::Parent(Box::new(ParentDir {
                path: Rc::from(path),
                children: HashMap::new(),
            })),
        });
        match (target, role) {
            (Target::Events(keys), Role::Events) => keys.add(key),
            (Target::Parent(dir), Role::Parent(name)) => match dir.children.get_mut(&**name) {
                Some(keys) => keys.add(key),
                None => {
                    dir.children.insert(Rc::clone(name), Keys::One(key));
                }
            },
            _ => return Err(Clash),
        }
        Ok(())
    }

    /// The directory of parent watch `wd`, shared by every key under it.
    pub(super) fn parent_path(&self, wd: i32) -> Option<&Rc<Path>> {
        match self.watches.get(&wd) {
            Some(Target::Parent(dir)) => Some(&dir.path),
            _ => None,
        }
    }

    /// Records that `key` no longer uses watch `wd` in `role`; returns the watch once no key
    /// uses it.
    pub(super) fn detach(&mut self, key: K, wd: i32, role: Role<'_>) -> Option<Unused> {
        let target = self.watches.get_mut(&wd)?;
        let unused = match (target, role) {
            (Target::Events(keys), Role::Events) => keys.remove(key),
            (Target::Parent(dir), Role::Parent(name)) => {
                if let Some(keys) = dir.children.get_mut(&**name)
                    && keys.remove(key)
                {
                    dir.children.remove(&**name);
                    shrink_when_sparse(&mut dir.children);
                }
                dir.children.is_empty()
            }
            _ => false,
        };
        if !unused {
            return None;
        }
        let target = self.watches.remove(&wd)?;
        shrink_when_sparse(&mut self.watches);
        Some(Unused {
            wd,
            parent: match target {
                Target::Parent(dir) => Some(dir.path),
                Target::Events(_) => None,
            },
        })
    }

    /// The keys to re-read after an event on watch `wd`: for a `cgroup.events` watch, its keys
    /// if the file was `modified`; for a parent watch, the keys of the child `name`. None for
    /// a descriptor not held (a late event of a removed watch).
    pub(super) fn keys_to_reread(&self, wd: i32, modified: bool, name: Option<&OsStr>) -> Vec<K> {
        match self.watches.get(&wd) {
            Some(Target::Events(keys)) if modified => keys.to_vec(),
            Some(Target::Events(_)) | None => Vec::new(),
            Some(Target::Parent(dir)) => name
                .and_then(|name| dir.children.get(name))
                .map_or_else(Vec::new, |keys| keys.to_vec()),
        }
    }

    /// Forgets watch `wd`, which the kernel dropped, and returns every key that used it.
    pub(super) fn kernel_dropped(&mut self, wd: i32) -> Vec<K> {
        match self.watches.remove(&wd) {
            Some(Target::Events(keys)) => keys.to_vec(),
            Some(Target::Parent(dir)) => dir.children.values().flat_map(Keys::to_vec).collect(),
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child directory's name, as the watcher shares it.
    fn name(name: &str) -> Rc<OsStr> {
        Rc::from(OsStr::new(name))
    }

    const EVENTS: &str = "/cg/slice/a/cgroup.events";

    fn table() -> WatchTable<u32> {
        WatchTable::new()
    }

    #[test]
    fn a_watch_is_unused_only_once_its_last_key_leaves() {
        let mut table = table();
        let a = &name("a");
        let b = &name("b");
        let parent = Path::new("/cg/slice");
        for (key, name) in [(1, a), (2, b), (3, a)] {
            table
                .attach(key, 7, parent, Role::Parent(name))
                .expect("one kind");
        }
        table
            .attach(1, 8, Path::new(EVENTS), Role::Events)
            .expect("one kind");
        table
            .attach(1, 8, Path::new(EVENTS), Role::Events)
            .expect("the same key again");
        assert_eq!(table.len(), 2);
        assert_eq!(table.parent_path(7).map(|path| &**path), Some(parent));
        assert_eq!(table.parent_path(8), None, "not a parent watch");

        assert!(table.detach(1, 7, Role::Parent(a)).is_none(), "3 uses a");
        assert!(table.detach(3, 7, Role::Parent(a)).is_none(), "2 uses b");
        let unused = table.detach(2, 7, Role::Parent(b)).expect("unused");
        assert_eq!(unused.wd, 7);
        assert_eq!(unused.parent.as_deref(), Some(parent));
        let unused = table.detach(1, 8, Role::Events).expect("unused");
        assert_eq!((unused.wd, unused.parent), (8, None));
        assert_eq!(table.len(), 0);
        assert!(table.detach(1, 8, Role::Events).is_none(), "no longer held");
    }

    #[test]
    fn a_descriptor_of_both_kinds_is_a_clash() {
        let mut table = table();
        table
            .attach(1, 7, Path::new(EVENTS), Role::Events)
            .expect("first");
        assert_eq!(
            table.attach(2, 7, Path::new("/cg"), Role::Parent(&name("x"))),
            Err(Clash)
        );
        assert!(
            table.detach(2, 7, Role::Parent(&name("x"))).is_none(),
            "a role the watch does not have removes nothing"
        );
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn events_name_the_keys_to_reread() {
        let mut table = table();
        let parent = Path::new("/cg/slice");
        table
            .attach(1, 7, parent, Role::Parent(&name("a")))
            .expect("attach");
        table
            .attach(2, 7, parent, Role::Parent(&name("b")))
            .expect("attach");
        table
            .attach(1, 8, Path::new(EVENTS), Role::Events)
            .expect("attach");
        assert_eq!(table.keys_to_reread(8, true, None), [1]);
        assert!(table.keys_to_reread(8, false, None).is_empty());
        assert_eq!(table.keys_to_reread(7, false, Some(OsStr::new("b"))), [2]);
        assert!(
            table
                .keys_to_reread(7, false, Some(OsStr::new("c")))
                .is_empty()
        );
        assert!(table.keys_to_reread(7, false, None).is_empty());
        assert!(
            table.keys_to_reread(99, true, None).is_empty(),
            "unknown wd"
        );
    }

    #[test]
    fn a_forgotten_watch_names_every_key_it_had() {
        let mut table = table();
        let parent = Path::new("/cg/slice");
        for (key, child) in [(1, "a"), (2, "b"), (3, "a")] {
            table
                .attach(key, 7, parent, Role::Parent(&name(child)))
                .expect("attach");
        }
        let mut keys = table.kernel_dropped(7);
        keys.sort_unstable();
        assert_eq!(keys, [1, 2, 3]);
        assert!(table.kernel_dropped(7).is_empty(), "forgotten once");
        assert_eq!(table.len(), 0);
    }
}

//! A unit's control group as the core keeps it, in two shared pieces: its parent directory,
//! which the units of one slice have in common, and its last component, which systemd names
//! after the unit. Kept as one string a watch, it was the largest allocation of a watch after
//! the watch itself (80 bytes of heap at 5,000 units).

use std::fmt;
use std::rc::Rc;

/// The last non-empty ControlGroup systemd reported for a unit (`/app.slice/web.service`),
/// or none yet: systemd reports it empty once the unit is gone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct ControlGroup(Option<Pieces>);

/// A control group split after its last `/`: the text is `parent` then `leaf`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pieces {
    parent: Rc<str>,
    leaf: Rc<str>,
}

impl ControlGroup {
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Whether this is the control group `path`, as systemd spells it.
    pub(super) fn is(&self, path: &str) -> bool {
        match &self.0 {
            None => path.is_empty(),
            Some(Pieces { parent, leaf }) => {
                path.len() == parent.len() + leaf.len()
                    && path.starts_with(&**parent)
                    && path.ends_with(&**leaf)
            }
        }
    }
}

impl fmt::Display for ControlGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(Pieces { parent, leaf }) = &self.0 {
            f.write_str(parent)?;
            f.write_str(leaf)?;
        }
        Ok(())
    }
}

/// Makes each [`ControlGroup`] from pieces already held where they are equal: the last parent
/// made (watches come in bursts from one slice), and the unit's own name.
#[derive(Debug, Default)]
pub(super) struct ControlGroups {
    last_parent: Option<Rc<str>>,
}

impl ControlGroups {
    /// The control group `path` of the unit systemd calls `unit` (empty: none).
    pub(super) fn make(&mut self, path: &str, unit: &Rc<str>) -> ControlGroup {
        if path.is_empty() {
            return ControlGroup(None);
        }
        let split = path.rfind('/').map_or(0, |slash| slash + 1);
        let (parent, leaf) = path.split_at(split);
        let parent = match &self.last_parent {
            Some(last) if **last == *parent => Rc::clone(last),
            _ => Rc::clone(self.last_parent.insert(Rc::from(parent))),
        };
        let leaf = if **unit == *leaf {
            Rc::clone(unit)
        } else {
            Rc::from(leaf)
        };
        ControlGroup(Some(Pieces { parent, leaf }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_group_reads_back_as_the_path_it_was_made_from() {
        let mut groups = ControlGroups::default();
        let unit: Rc<str> = Rc::from("web.service");
        for path in [
            "/app.slice/web.service",
            "/app.slice/other.service",
            "/web.service",
            "web.service",
            "/",
            "/app.slice/",
            "/app.slice/web.service/sub",
        ] {
            let group = groups.make(path, &unit);
            assert_eq!(group.to_string(), path);
            assert!(group.is(path), "{path}");
            assert!(!group.is("/app.slice/web.servic"), "{path}");
            assert!(!group.is(""), "{path}");
            assert!(!group.is_empty());
        }
        assert!(groups.make("", &unit).is_empty());
        assert!(groups.make("", &unit).is(""));
        assert!(!groups.make("", &unit).is("/"));
    }

    #[test]
    fn units_of_one_slice_share_its_parent_and_a_unit_named_like_its_cgroup_its_name() {
        let mut groups = ControlGroups::default();
        let (a, b): (Rc<str>, Rc<str>) = (Rc::from("a.service"), Rc::from("b.service"));
        let (Some(first), Some(second)) = (
            groups.make("/app.slice/a.service", &a).0,
            groups.make("/app.slice/b.service", &b).0,
        ) else {
            panic!("no pieces")
        };
        assert!(Rc::ptr_eq(&first.parent, &second.parent));
        assert!(Rc::ptr_eq(&first.leaf, &a));
        assert!(Rc::ptr_eq(&second.leaf, &b));
        // Another slice, then the first again: equal pieces, whether shared or not.
        let other = groups.make("/other.slice/a.service", &a);
        assert_eq!(other.to_string(), "/other.slice/a.service");
        assert!(
            groups
                .make("/app.slice/b.service", &b)
                .is("/app.slice/b.service")
        );
    }
}

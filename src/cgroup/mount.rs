//! Finds where the cgroup v2 hierarchy is mounted, from `/proc/self/mountinfo`. It must never assume a
//! path such as `/sys/fs/cgroup`: hybrid hosts mount v2 at `/sys/fs/cgroup/unified`.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use super::CgroupError;

/// Where the kernel lists this process's mounts.
const MOUNTINFO_PATH: &str = "/proc/self/mountinfo";

/// Returns the mount points of the cgroup v2 hierarchy listed in `mountinfo` (the format of
/// `/proc/self/mountinfo`), best first.
///
/// Mounts whose root field is `/` (the whole hierarchy) come before subtree mounts, and among
/// each, later lines before earlier ones: a later mount may hide an earlier one (a sandbox that
/// mounts a tmpfs over `/sys/fs/cgroup` and cgroup2 on top hides `/sys/fs/cgroup/unified`).
/// Malformed lines are skipped.
pub(crate) fn cgroup2_mount_candidates(mountinfo: &str) -> Vec<PathBuf> {
    let mounts: Vec<(&str, &str)> = mountinfo.lines().filter_map(cgroup2_fields).collect();
    let whole = mounts.iter().rev().filter(|(root, _)| *root == "/");
    let subtrees = mounts.iter().rev().filter(|(root, _)| *root != "/");
    whole
        .chain(subtrees)
        .map(|(_, mount_point)| unescape_octal(mount_point))
        .collect()
}

#[cfg(test)]
/// The best cgroup v2 mount point listed in `mountinfo`, if any.
pub(crate) fn find_cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    cgroup2_mount_candidates(mountinfo).into_iter().next()
}

/// Reads `/proc/self/mountinfo` and returns the cgroup v2 mount point that is really reachable:
/// the first candidate that `statfs` confirms is a cgroup2 filesystem. A hidden mount would make
/// every cgroup look gone, which is exactly the false proof this agent exists to prevent.
pub(crate) fn cgroup2_mount() -> Result<PathBuf, CgroupError> {
    let path = PathBuf::from(MOUNTINFO_PATH);
    let mountinfo = std::fs::read_to_string(&path).map_err(|source| CgroupError::Mountinfo {
        path: path.clone(),
        source,
    })?;
    cgroup2_mount_candidates(&mountinfo)
        .into_iter()
        .find(|candidate| is_cgroup2(candidate))
        .ok_or(CgroupError::NoCgroup2Mount { path })
}

/// Whether `path` is the root of a mounted cgroup2 filesystem.
fn is_cgroup2(path: &std::path::Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

/// Returns the (still escaped) root and mount point fields of a mountinfo line if its filesystem type
/// is `cgroup2`.
///
/// A line reads `id parent major:minor root mount_point options [optional fields...] - fstype source
/// super_options`; the optional fields end at the lone `-`.
fn cgroup2_fields(line: &str) -> Option<(&str, &str)> {
    let mut fields = line.split(' ');
    let root = fields.nth(3)?;
    let mount_point = fields.next()?;
    let fstype = fields.skip_while(|field| *field != "-").nth(1)?;
    (fstype == "cgroup2").then_some((root, mount_point))
}

/// Undoes the kernel's octal escaping of mountinfo fields (`\040` for a space, `\134` for a backslash).
/// A backslash not followed by three octal digits is kept as it is.
fn unescape_octal(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if let Some(byte) = octal_escape_at(bytes, index) {
            out.push(byte);
            index += 4;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

/// Returns the byte encoded by a `\NNN` escape starting at `index`, if there is one that fits a byte.
fn octal_escape_at(bytes: &[u8], index: usize) -> Option<u8> {
    let escape = bytes.get(index..index + 4)?;
    if escape[0] != b'\\' {
        return None;
    }
    escape[1..].iter().try_fold(0u8, |value, digit| {
        let digit = match digit {
            b'0'..=b'7' => digit - b'0',
            _ => return None,
        };
        value.checked_mul(8)?.checked_add(digit)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
24 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
30 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
34 24 0:29 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
35 34 0:30 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
36 34 0:31 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
39 34 0:34 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,memory
";

    const PURE_V2: &str = "\
22 28 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
28 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
31 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    const V1_ONLY: &str = "\
30 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
36 34 0:31 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
";

    const NO_OPTIONAL_FIELDS: &str =
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

    const ESCAPED: &str = "50 30 0:40 / /mnt/my\\040cgroups\\134v2 rw - cgroup2 none rw\n";

    const SUBTREE_FIRST: &str = "\
60 30 0:40 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw
61 30 0:40 / /run/full\\011cgroup rw - cgroup2 cgroup2 rw
";

    const ONLY_SUBTREE: &str = "60 30 0:40 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";

    const MALFORMED: &str = "\
garbage
1 2 3
70 30 0:40 / /a rw shared:1 cgroup2 cgroup2 rw
71 30 0:40 / /b rw -
72 30 0:40 / /c rw - cgroup2
";

    /// The sandbox's layout: a tmpfs over /sys/fs/cgroup hides the host's v2 at .../unified.
    const SHADOWED: &str = "\
60 50 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
66 50 0:40 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw
67 66 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn find_cgroup2_mount_handles_layouts() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("hybrid", HYBRID, Some("/sys/fs/cgroup/unified")),
            ("pure v2", PURE_V2, Some("/sys/fs/cgroup")),
            ("v1 only", V1_ONLY, None),
            ("empty", "", None),
            (
                "no optional fields",
                NO_OPTIONAL_FIELDS,
                Some("/sys/fs/cgroup/unified"),
            ),
            ("octal escapes", ESCAPED, Some("/mnt/my cgroups\\v2")),
            ("root / preferred", SUBTREE_FIRST, Some("/run/full\tcgroup")),
            (
                "a later mount hides an earlier one",
                SHADOWED,
                Some("/sys/fs/cgroup"),
            ),
            ("only a subtree", ONLY_SUBTREE, Some("/sys/fs/cgroup")),
            ("malformed lines", MALFORMED, Some("/c")),
        ];
        for (name, mountinfo, expected) in cases {
            assert_eq!(
                find_cgroup2_mount(mountinfo),
                expected.map(PathBuf::from),
                "case {name}"
            );
        }
    }

    #[test]
    fn unescape_octal_keeps_bad_escapes() {
        let cases = [
            ("/plain", "/plain"),
            ("/a\\040b", "/a b"),
            ("/trailing\\04", "/trailing\\04"),
            ("/not\\08x", "/not\\08x"),
            ("/too\\777big", "/too\\777big"),
            ("\\", "\\"),
            ("/\\134\\040", "/\\ "),
        ];
        for (field, expected) in cases {
            assert_eq!(
                unescape_octal(field),
                PathBuf::from(expected),
                "field {field:?}"
            );
        }
    }

    #[test]
    fn cgroup2_mount_finds_this_machine_mount() {
        // Every supported host has a cgroup2 mount; its cgroup.procs must exist there.
        let mount = cgroup2_mount().expect("this machine has a cgroup2 mount");
        assert!(mount.join("cgroup.procs").exists(), "{}", mount.display());
    }
}

//! The proof, on every connection to systemd, that the cgroup2 mount the agent reads is
//! systemd's view of the hierarchy: systemd's own process is listed in `cgroup.procs` where
//! systemd says its control group is.
//!
//! An agent in a cgroup namespace of its own (a container's, with cgroup2 mounted inside it)
//! resolves systemd's ControlGroup paths against another root: every cgroup would read as
//! gone, and a unit whose leftover still runs would be proven. The pid is the bus's, and
//! `cgroup.procs` lists pids as the agent's pid namespace numbers them, so an agent in another
//! pid namespace than the bus cannot prove the view either, and refuses too.

use std::io;
use std::path::{Path, PathBuf};

use zbus::Connection;

use crate::cgroup::procs::parse_procs;
use crate::cgroup::watcher::locate;
use crate::systemd::manager::{ManagerError, ManagerProcess, manager_process};

/// `cgroup.procs` of systemd's own control group is read up to this: far more than the
/// manager's scope holds (the manager alone).
const MAX_PROCS_BYTES: u64 = 1 << 20;

/// The cgroup2 mount could not be proven to be systemd's view.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// systemd could not be asked where its own process is.
    #[error("cannot tell whether the cgroup2 mount at {} is systemd's view: {source}", .mount.display())]
    Ask {
        mount: PathBuf,
        source: ManagerError,
    },
    /// What the mount shows is not where systemd says its process is.
    #[error(
        "the cgroup2 mount at {} is not systemd's view: systemd says its manager (pid {pid}) is \
         in {control_group}, but {found}; run the agent in the host's cgroup and pid \
         namespaces, with the host's cgroup2 mounted",
        .mount.display()
    )]
    NotSystemds {
        mount: PathBuf,
        pid: u32,
        control_group: String,
        /// What the agent found instead.
        found: String,
    },
}

/// Asks systemd (the bus name `systemd`, whose process the bus verified as `pid`) where its
/// own process is and checks that `mount` shows it there.
pub(super) async fn prove(
    conn: &Connection,
    systemd: &str,
    pid: u32,
    mount: &Path,
) -> Result<(), ViewError> {
    let manager = manager_process(conn, systemd, pid)
        .await
        .map_err(|source| ViewError::Ask {
            mount: mount.to_owned(),
            source,
        })?;
    check(mount, &manager)
}

/// Whether `mount` lists `manager`'s pid in the `cgroup.procs` of its control group.
fn check(mount: &Path, manager: &ManagerProcess) -> Result<(), ViewError> {
    let not_systemds = |found: String| ViewError::NotSystemds {
        mount: mount.to_owned(),
        pid: manager.pid,
        control_group: manager.control_group.clone(),
        found,
    };
    let (parent, name) = locate(mount, &manager.control_group)
        .map_err(|e| not_systemds(format!("that is not a cgroup path ({e})")))?;
    let procs = parent.join(name).join("cgroup.procs");
    let bytes = match read_bounded(&procs) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(not_systemds(format!("{} does not exist", procs.display())));
        }
        Err(e) => return Err(not_systemds(format!("{}: {e}", procs.display()))),
    };
    let pids =
        parse_procs(&bytes).map_err(|e| not_systemds(format!("{}: {e}", procs.display())))?;
    if pids
        .iter()
        .any(|pid| u32::try_from(*pid).is_ok_and(|pid| pid == manager.pid))
    {
        return Ok(());
    }
    Err(not_systemds(format!(
        "{} does not list it",
        procs.display()
    )))
}

fn read_bounded(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_PROCS_BYTES)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manager(control_group: &str) -> ManagerProcess {
        ManagerProcess {
            pid: 42,
            control_group: control_group.to_owned(),
        }
    }

    /// A directory laid out as a cgroup2 mount would be, with `procs` in `cg/cgroup.procs`.
    fn mount_with(cgroup: &str, procs: &str) -> tempfile::TempDir {
        let mount = tempfile::tempdir().unwrap();
        let dir = mount.path().join(cgroup.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup.procs"), procs).unwrap();
        mount
    }

    #[test]
    fn the_view_is_systemds_when_its_pid_is_where_it_says() {
        let mount = mount_with("/user.slice/init.scope", "7\n42\n");
        check(mount.path(), &manager("/user.slice/init.scope")).expect("systemd's view");
    }

    #[test]
    fn a_view_without_systemds_cgroup_or_pid_there_is_refused_saying_why() {
        let mount = mount_with("/init.scope", "7\n");
        let cases = [
            ("/elsewhere/init.scope", "does not exist"),
            ("/init.scope", "does not list it"),
            ("init.scope", "is not a cgroup path"),
            ("/../init.scope", "is not a cgroup path"),
        ];
        for (control_group, found) in cases {
            let error = check(mount.path(), &manager(control_group)).expect_err(control_group);
            let message = error.to_string();
            assert!(
                message.contains(found)
                    && message.contains("is not systemd's view")
                    && message.contains("(pid 42)")
                    && message.contains("run the agent in the host's cgroup and pid namespaces"),
                "{control_group}: {message}"
            );
        }
    }
}

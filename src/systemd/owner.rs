//! Who may speak for systemd: whether the owner of `org.freedesktop.systemd1` is the manager
//! itself, judged from what the bus daemon says of its connection and, on a user bus before
//! any manager was verified, what `/proc` says of its process (pure).
//!
//! Owning the name proves nothing. On a user (session) bus systemd asks for its name with
//! ALLOW_REPLACEMENT (`bus_setup_api` in systemd's `src/core/dbus.c`, so that a re-executed
//! manager can take it over from the old one), and any client of that bus may take it with
//! REPLACE_EXISTING. The rule, from systemd's own code:
//! - **System bus**: uid 0 and pid 1. The system manager is PID 1; systemd's own tools trust a
//!   peer of uid 0 or their own uid (`bus_check_peercred` in `src/shared/bus-util.c`).
//! - **User bus**: the uid the agent runs as (a user's bus and manager are that user's), and
//!   the manager process: the pid verified first (a daemon-reexec keeps the pid, and the bus
//!   goes with the manager that started it, so a manager under another pid is never ours) or,
//!   before any, a process named `systemd` whose cgroup v2 path ends in `/init.scope`:
//!   `manager_setup_cgroup` (`src/core/cgroup.c`) moves every manager, system or user, into
//!   the `init.scope` of its own cgroup root (`user@UID.service/init.scope` for a user's).

use std::fmt;

/// systemd's well-known name on the bus.
pub(crate) const SYSTEMD: &str = "org.freedesktop.systemd1";

/// The cgroup v2 leaf every systemd manager moves itself into.
const INIT_SCOPE: &str = "/init.scope";
/// A manager's process name (`/proc/PID/comm`).
const MANAGER_COMM: &str = "systemd";

/// What the bus daemon says of a connection (`GetConnectionCredentials`), as seen in the bus
/// daemon's pid namespace, which the agent shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub(crate) pid: u32,
    pub(crate) uid: u32,
}

/// What `/proc` says of a process, read only when the rule needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ProcessView {
    /// `/proc/PID/comm`, without its newline; `None` if it could not be read.
    pub(crate) comm: Option<String>,
    /// The cgroup v2 path of `/proc/PID/cgroup` (its `0::` line); `None` if none was read.
    pub(crate) cgroup: Option<String>,
}

/// Whom the agent takes for systemd on its bus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expected {
    /// The system manager: PID 1, uid 0.
    System,
    /// A user's manager: uid `uid`, and the pid of the manager verified before, if any.
    User {
        /// The user whose bus and manager these are: the agent's own.
        uid: u32,
        /// The manager verified before on this bus.
        manager: Option<u32>,
    },
}

/// Why the owner of systemd's name is not systemd.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Why {
    /// It runs as another user.
    #[error("systemd runs as uid {0}")]
    Uid(u32),
    /// The system manager is PID 1.
    #[error("the system manager is pid 1")]
    NotPid1,
    /// Another process than the manager verified before.
    #[error("the manager is pid {0}, which a re-execution keeps")]
    NotTheManager(u32),
    /// Not a process named `systemd`.
    #[error("it is {}, not systemd", shown(.0.as_deref()))]
    NotNamedSystemd(Option<String>),
    /// Not in a manager's `init.scope`.
    #[error("its cgroup is {}, not a manager's init.scope", shown(.0.as_deref()))]
    NotInInitScope(Option<String>),
}

fn shown(value: Option<&str>) -> String {
    value.map_or_else(|| "unknown".to_owned(), |v| format!("{v:?}"))
}

/// The owner of systemd's name, and why it is not systemd: none of its answers or signals is
/// a fact.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct NotSystemd {
    /// Its unique bus name.
    pub owner: String,
    /// Its pid, as the bus daemon sees it.
    pub pid: u32,
    /// Its uid.
    pub uid: u32,
    /// Why it is not systemd.
    pub why: Why,
}

impl fmt::Display for NotSystemd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (pid {}, uid {}) owns {SYSTEMD} and is not systemd: {}",
            self.owner, self.pid, self.uid, self.why
        )
    }
}

/// Judges the owner whose connection has `credentials`: its pid if it is the manager.
/// `process` is asked only on a user bus before any manager was verified.
pub(crate) fn judge(
    expected: Expected,
    credentials: Credentials,
    process: impl FnOnce(u32) -> ProcessView,
) -> Result<u32, Why> {
    let Credentials { pid, uid } = credentials;
    match expected {
        Expected::System if uid != 0 => Err(Why::Uid(0)),
        Expected::System if pid != 1 => Err(Why::NotPid1),
        Expected::System => Ok(pid),
        Expected::User { uid: user, .. } if uid != user => Err(Why::Uid(user)),
        Expected::User {
            manager: Some(manager),
            ..
        } if pid != manager => Err(Why::NotTheManager(manager)),
        Expected::User {
            manager: Some(_), ..
        } => Ok(pid),
        Expected::User { manager: None, .. } => {
            let view = process(pid);
            if view.comm.as_deref() != Some(MANAGER_COMM) {
                Err(Why::NotNamedSystemd(view.comm))
            } else if !view
                .cgroup
                .as_deref()
                .is_some_and(|c| c.ends_with(INIT_SCOPE))
            {
                Err(Why::NotInInitScope(view.cgroup))
            } else {
                Ok(pid)
            }
        }
    }
}

pub(crate) use crate::cgroup::cgroup_v2_path;

#[cfg(test)]
mod tests {
    use super::*;

    fn manager_view() -> ProcessView {
        ProcessView {
            comm: Some("systemd".into()),
            cgroup: Some("/user.slice/user-1000.slice/user@1000.service/init.scope".into()),
        }
    }

    fn creds(pid: u32, uid: u32) -> Credentials {
        Credentials { pid, uid }
    }

    fn never(_: u32) -> ProcessView {
        panic!("the rule read /proc where it needs not")
    }

    #[test]
    fn the_system_manager_is_root_and_pid_1() {
        assert_eq!(judge(Expected::System, creds(1, 0), never), Ok(1));
        assert_eq!(
            judge(Expected::System, creds(4242, 0), never),
            Err(Why::NotPid1)
        );
        assert_eq!(
            judge(Expected::System, creds(1, 1000), never),
            Err(Why::Uid(0))
        );
    }

    #[test]
    fn a_user_manager_verified_before_must_keep_its_pid() {
        let expected = Expected::User {
            uid: 1000,
            manager: Some(812),
        };
        // A daemon-reexec keeps the pid.
        assert_eq!(judge(expected, creds(812, 1000), never), Ok(812));
        // Another process of the user, even a second `systemd --user` in init.scope.
        assert_eq!(
            judge(expected, creds(9000, 1000), |_| manager_view()),
            Err(Why::NotTheManager(812))
        );
        assert_eq!(judge(expected, creds(812, 0), never), Err(Why::Uid(1000)));
    }

    #[test]
    fn a_first_user_manager_is_systemd_in_an_init_scope() {
        let expected = Expected::User {
            uid: 1000,
            manager: None,
        };
        assert_eq!(
            judge(expected, creds(812, 1000), |_| manager_view()),
            Ok(812)
        );
        // The sandbox's manager: its own cgroup root, init.scope below it.
        let sandboxed = ProcessView {
            comm: Some("systemd".into()),
            cgroup: Some("/exitproof-test-x/init.scope".into()),
        };
        assert_eq!(judge(expected, creds(7, 1000), |_| sandboxed), Ok(7));
        let in_a_service = ProcessView {
            comm: Some("systemd".into()),
            cgroup: Some(
                "/user.slice/user-1000.slice/user@1000.service/app.slice/x.service".into(),
            ),
        };
        assert_eq!(
            judge(expected, creds(9000, 1000), |_| in_a_service),
            Err(Why::NotInInitScope(Some(
                "/user.slice/user-1000.slice/user@1000.service/app.slice/x.service".into()
            )))
        );
        let named_otherwise = ProcessView {
            comm: Some("python3".into()),
            ..manager_view()
        };
        assert_eq!(
            judge(expected, creds(9000, 1000), |_| named_otherwise),
            Err(Why::NotNamedSystemd(Some("python3".into())))
        );
        // A process gone before it was looked at is unknown, never systemd.
        assert_eq!(
            judge(expected, creds(9000, 1000), |_| ProcessView::default()),
            Err(Why::NotNamedSystemd(None))
        );
        let init_scope_lookalike = ProcessView {
            comm: Some("systemd".into()),
            cgroup: Some("/x/not-init.scope".into()),
        };
        assert!(judge(expected, creds(9000, 1000), |_| init_scope_lookalike).is_err());
        assert_eq!(judge(expected, creds(812, 0), never), Err(Why::Uid(1000)));
    }

    #[test]
    fn the_cgroup_v2_path_is_the_0_line() {
        let text = "9:name=systemd:/\n4:memory:/x\n0::/exitproof-test-probe1/init.scope\n";
        assert_eq!(
            cgroup_v2_path(text),
            Some("/exitproof-test-probe1/init.scope")
        );
        assert_eq!(cgroup_v2_path("4:memory:/x\n"), None);
    }

    #[test]
    fn not_systemd_says_who_and_why() {
        let error = NotSystemd {
            owner: ":1.7".into(),
            pid: 9000,
            uid: 1000,
            why: Why::NotTheManager(812),
        };
        assert_eq!(
            error.to_string(),
            ":1.7 (pid 9000, uid 1000) owns org.freedesktop.systemd1 and is not systemd: the \
             manager is pid 812, which a re-execution keeps"
        );
    }
}

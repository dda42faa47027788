//! A unit as systemd holds it: its unit file settings, its state (`ServiceState`, which names
//! ActiveState and SubState), its job, its pids and its InvocationID. What moves it from state
//! to state is `service.rs`.

use super::kernel::{Inv, Pid};

/// The unit file settings that change what a stop and an exit do.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct UnitConfig {
    pub oneshot: bool,
    /// ExecStartPre=: a control process runs before the main one.
    pub exec_start_pre: bool,
    pub remain_after_exit: bool,
    /// KillMode=process: a stop kills the main process only.
    pub kill_process: bool,
    pub exec_stop: bool,
    pub exec_stop_post: bool,
    /// Restart=.
    pub restart: Restart,
    /// Delegate=yes: the service's children live in a sub-cgroup.
    pub delegate: bool,
    /// ExecReload=: a control process runs in state `reloading`.
    pub exec_reload: bool,
    /// SendSIGKILL=no: what ignores SIGTERM survives the stop.
    pub no_sigkill: bool,
}

/// Restart= (`service_shall_restart`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Restart {
    #[default]
    No,
    OnFailure,
    OnSuccess,
    Always,
}

impl Restart {
    /// Whether an end with this result restarts the service (`service_shall_restart`: never
    /// after a stop job, `stopping_by_job`, which the caller checks).
    pub(crate) fn shall(self, failed: bool) -> bool {
        match self {
            Restart::No => false,
            Restart::OnFailure => failed,
            Restart::OnSuccess => !failed,
            Restart::Always => true,
        }
    }
}

/// A service's state (systemd's `ServiceState`), which names both ActiveState and SubState.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SvcState {
    Dead,
    Failed,
    StartPre,
    Start,
    Running,
    Exited,
    /// ExecReload= runs (`SERVICE_RELOAD`).
    Reload,
    Stop,
    StopSigterm,
    StopPost,
    FinalSigterm,
    AutoRestart,
}

impl SvcState {
    pub(crate) fn active_state(self) -> &'static str {
        match self {
            SvcState::Dead => "inactive",
            SvcState::Failed => "failed",
            SvcState::StartPre | SvcState::Start | SvcState::AutoRestart => "activating",
            SvcState::Running | SvcState::Exited => "active",
            SvcState::Reload => "reloading",
            _ => "deactivating",
        }
    }

    pub(crate) fn sub_state(self) -> &'static str {
        match self {
            SvcState::Dead => "dead",
            SvcState::Failed => "failed",
            SvcState::StartPre => "start-pre",
            SvcState::Start => "start",
            SvcState::Running => "running",
            SvcState::Exited => "exited",
            SvcState::Reload => "reload",
            SvcState::Stop => "stop",
            SvcState::StopSigterm => "stop-sigterm",
            SvcState::StopPost => "stop-post",
            SvcState::FinalSigterm => "final-sigterm",
            SvcState::AutoRestart => "auto-restart",
        }
    }

    /// Whether systemd may still start a process under the current invocation: a running
    /// unit may fork, reload or run ExecStop=; a stopping one has ExecStopPost= to come
    /// unless it already runs (a live control process is a process of the invocation anyway).
    pub(crate) fn may_spawn(self, cfg: &UnitConfig) -> bool {
        match self {
            SvcState::StartPre
            | SvcState::Start
            | SvcState::Running
            | SvcState::Exited
            | SvcState::Reload => true,
            SvcState::Stop | SvcState::StopSigterm => cfg.exec_stop_post,
            _ => false,
        }
    }

    /// Whether the unit runs an invocation (not yet inactive, failed or waiting to restart).
    pub(crate) fn running(self) -> bool {
        !matches!(
            self,
            SvcState::Dead | SvcState::Failed | SvcState::AutoRestart
        )
    }

    /// Inactive or failed: leaving these stamps InactiveExitTimestamp.
    pub(crate) fn inactive(self) -> bool {
        matches!(self, SvcState::Dead | SvcState::Failed)
    }

    pub(crate) fn deactivating(self) -> bool {
        matches!(
            self,
            SvcState::Stop | SvcState::StopSigterm | SvcState::StopPost | SvcState::FinalSigterm
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Job {
    Start,
    Stop,
    Restart,
}

#[derive(Clone, Debug)]
pub(crate) struct Unit {
    pub name: String,
    pub aliases: Vec<String>,
    /// The cgroup the unit's next processes go to (its slice may change between invocations).
    pub cgroup: String,
    /// systemd knows the cgroup's path (`u->cgroup_path`): set when it realizes the cgroup,
    /// forgotten once it pruned it empty. ControlGroup reads "" without it.
    pub cgroup_known: bool,
    pub cfg: UnitConfig,
    pub loaded: bool,
    pub state: SvcState,
    pub invocation: Inv,
    /// The last invocation the unit ran, kept through garbage collection for the history.
    pub last_invocation: Inv,
    pub main_pid: Option<Pid>,
    pub control_pid: Option<Pid>,
    pub job: Option<Job>,
    /// A stop job drives the current stop: no auto-restart after it.
    pub(crate) stopping_by_job: bool,
    pub result: &'static str,
    pub exec_main_code: i32,
    pub exec_main_status: i32,
    pub inactive_enter_us: u64,
    pub inactive_exit_us: u64,
    pub(crate) dirty: bool,
    pub(crate) new_sent: bool,
}

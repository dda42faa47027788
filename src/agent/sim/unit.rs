//! A unit as systemd holds it: its unit file settings, its state (`ServiceState`, which names
//! ActiveState and SubState), its job, its pids and its InvocationID. What moves it from state
//! to state is `service.rs`.

use super::kernel::{Inv, Pid};

/// The unit file settings that change what a start, a stop and an exit do.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct UnitConfig {
    pub oneshot: bool,
    /// Type= of a service that is not oneshot.
    pub service_type: ServiceType,
    /// ExecCondition=: a control process decides whether the unit starts at all.
    pub exec_condition: bool,
    /// ExecStartPost=: a control process runs beside the main one before the unit is active.
    pub exec_start_post: bool,
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
    /// A scope unit (`scope.c`), made by StartTransientUnit with `PIDs=`: systemd moves
    /// processes that already run into its cgroup; it has no MainPID, ControlPID nor Exec*=.
    pub scope: bool,
}

/// Type= of a service that is not `oneshot` (`service_enter_start`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ServiceType {
    /// `exec` or `notify`: the main process is forked at once and the unit stays in `start`
    /// until it has exec'd or sent READY=1.
    #[default]
    Exec,
    /// `simple`: running as soon as the main process is forked, with no `start` state.
    Simple,
    /// `forking`: ExecStart= is a control process that forks the daemon and exits; the daemon
    /// becomes MainPID (`service_search_main_pid`) and the unit stays in `start` until then.
    Forking,
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
    /// after a stop job, `stopping_by_job`, which the caller checks, nor after a failed
    /// ExecCondition=).
    pub(crate) fn shall(self, result: &str) -> bool {
        let failed = result != "success";
        match self {
            _ if result == SKIP_CONDITION => false,
            Restart::No => false,
            Restart::OnFailure => failed,
            Restart::OnSuccess => !failed,
            Restart::Always => true,
        }
    }
}

/// Result= after ExecCondition= failed (`SERVICE_SKIP_CONDITION`): the unit ends inactive,
/// not failed.
pub(crate) const SKIP_CONDITION: &str = "exec-condition";

/// Whether a unit ending with `result` ends failed (`service_enter_dead`).
pub(crate) fn ends_failed(result: &str) -> bool {
    result != "success" && result != SKIP_CONDITION
}

/// A service's state (systemd's `ServiceState`), which names both ActiveState and SubState.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SvcState {
    Dead,
    Failed,
    /// ExecCondition= runs (`SERVICE_CONDITION`).
    Condition,
    StartPre,
    Start,
    /// ExecStartPost= runs beside the main process (`SERVICE_START_POST`).
    StartPost,
    Running,
    Exited,
    /// ExecReload= runs (`SERVICE_RELOAD`).
    Reload,
    Stop,
    StopSigterm,
    /// TimeoutStopSec= passed with processes left after SIGTERM: SIGKILL.
    StopSigkill,
    StopPost,
    FinalSigterm,
    FinalSigkill,
    AutoRestart,
    /// `systemctl clean` (`SERVICE_CLEANING`): a control process removes the unit's
    /// directories, in its cgroup, under its last InvocationID.
    Cleaning,
}

impl SvcState {
    pub(crate) fn active_state(self) -> &'static str {
        match self {
            SvcState::Dead => "inactive",
            SvcState::Failed => "failed",
            SvcState::Condition
            | SvcState::StartPre
            | SvcState::Start
            | SvcState::StartPost
            | SvcState::AutoRestart => "activating",
            SvcState::Running | SvcState::Exited => "active",
            SvcState::Reload => "reloading",
            SvcState::Cleaning => "maintenance",
            _ => "deactivating",
        }
    }

    pub(crate) fn sub_state(self) -> &'static str {
        match self {
            SvcState::Dead => "dead",
            SvcState::Failed => "failed",
            SvcState::Condition => "condition",
            SvcState::StartPre => "start-pre",
            SvcState::Start => "start",
            SvcState::StartPost => "start-post",
            SvcState::Running => "running",
            SvcState::Exited => "exited",
            SvcState::Reload => "reload",
            SvcState::Stop => "stop",
            SvcState::StopSigterm => "stop-sigterm",
            SvcState::StopSigkill => "stop-sigkill",
            SvcState::StopPost => "stop-post",
            SvcState::FinalSigterm => "final-sigterm",
            SvcState::FinalSigkill => "final-sigkill",
            SvcState::AutoRestart => "auto-restart",
            SvcState::Cleaning => "cleaning",
        }
    }

    /// Whether systemd may still start a process under the current invocation: a running
    /// unit may fork, reload or run ExecStop=; a stopping one has ExecStopPost= to come
    /// unless it already runs (a live control process is a process of the invocation anyway).
    pub(crate) fn may_spawn(self, cfg: &UnitConfig) -> bool {
        match self {
            SvcState::Condition
            | SvcState::StartPre
            | SvcState::Start
            | SvcState::StartPost
            | SvcState::Running
            | SvcState::Exited
            | SvcState::Reload => true,
            SvcState::Stop | SvcState::StopSigterm | SvcState::StopSigkill => cfg.exec_stop_post,
            _ => false,
        }
    }

    /// Whether the unit runs an invocation (not yet inactive, failed or waiting to restart;
    /// a clean runs after the invocation ended).
    pub(crate) fn running(self) -> bool {
        !matches!(
            self,
            SvcState::Dead | SvcState::Failed | SvcState::AutoRestart | SvcState::Cleaning
        )
    }

    /// Inactive or failed: leaving these stamps InactiveExitTimestamp.
    pub(crate) fn inactive(self) -> bool {
        matches!(self, SvcState::Dead | SvcState::Failed)
    }

    pub(crate) fn deactivating(self) -> bool {
        matches!(
            self,
            SvcState::Stop
                | SvcState::StopSigterm
                | SvcState::StopSigkill
                | SvcState::StopPost
                | SvcState::FinalSigterm
                | SvcState::FinalSigkill
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
    /// The aliases' symlinks were in place at systemd's last reload: it resolves them.
    pub aliases_linked: bool,
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
    /// This invocation's start woke a leftover that waited for it (`wake_start_waiters`): its
    /// ExecStart= only fed that waiter (the fifo) and forks no daemon of its own.
    pub(crate) fed_a_waiter: bool,
}

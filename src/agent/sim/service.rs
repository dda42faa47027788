//! The service state machine of one unit (`unit.rs`), as systemd's `service.c` drives it: jobs,
//! the processes it waits for, KillMode=, RemainAfterExit=, Restart=.
//!
//! Each rule names the function of systemd 252's `src/core/service.c` (or `unit.c`,
//! `cgroup.c`, `dbus-unit.c`) it follows. Signals: every change of state first sends the
//! unit's pending change signal (`service_set_state` → `bus_unit_send_pending_change_signal`),
//! so each state goes out on its own and only changes within one state are merged; a unit not
//! yet announced is announced by `UnitNew` alone (`bus_unit_send_change_signal`).
//!
//! Like systemd, it keeps MainPID (the main process, none when there is none) and ControlPID
//! (the ExecStartPre=, ExecStop= or ExecStopPost= process running), and stamps
//! InactiveExitTimestampMonotonic whenever the unit leaves inactive or failed (`unit_notify`):
//! a start forks its first process just before, so that process's start time is at or a little
//! before the stamp.

use super::kernel::{Inv, MANAGER, Pid, Role};
use super::unit::{Job, SKIP_CONDITION, ServiceType, SvcState, ends_failed};
use super::world::{InvRecord, World, short};

impl World {
    /// A job is queued (`manager_add_job` → `bus_job_send_change_signal`): the unit's pending
    /// change goes out first, announcing a unit loaded anew (`including_new`), and the unit's
    /// Job property changed, which sends its properties again unchanged.
    pub(super) fn request(&mut self, u: usize, job: Job) -> String {
        let unit = &mut self.units[u];
        if !unit.loaded {
            // systemd-run again, or a start that loads the unit file (`unit_new` for a unit
            // not in memory: not announced yet).
            unit.loaded = true;
            unit.new_sent = false;
            unit.invocation = 0;
            unit.state = SvcState::Dead;
            unit.cgroup_known = false;
            unit.dirty = true;
        }
        self.send_pending(u, true);
        let unit = &mut self.units[u];
        unit.job = Some(job);
        unit.dirty = true;
        format!("{}: someone queues a {job:?} job", unit.name)
    }

    /// A job ends (`job_finish_and_invalidate`, JobRemoved): the unit's Job property changes,
    /// so its properties go out again, unchanged.
    fn job_done(&mut self, u: usize) {
        let unit = &mut self.units[u];
        if unit.job.take().is_some() {
            unit.dirty = true;
        }
    }

    fn fresh_invocation(&mut self) -> Inv {
        loop {
            let inv = (u128::from(self.rng.next_u64()) << 64) | u128::from(self.rng.next_u64());
            if inv != 0 && !self.history.contains_key(&inv) {
                return inv;
            }
        }
    }

    /// `service_start`: `unit_acquire_invocation_id` sets the new InvocationID and queues the
    /// unit's change signal; the first process is forked (`service_spawn`, into the cgroup
    /// `unit_realize_cgroup` makes) and MainPID or ControlPID set; only then
    /// `service_set_state` enters start-pre or start, and its flush of the pending change sends
    /// the unit still inactive (or failed) with the NEW InvocationID and the new pids.
    pub(super) fn start(&mut self, u: usize) {
        let new = self.fresh_invocation();
        let old = self.units[u].last_invocation;
        self.units[u].last_invocation = new;
        if let Some(record) = self.history.get_mut(&old) {
            record.next = Some(new);
            record.ended = true;
        }
        self.history.insert(
            new,
            InvRecord {
                unit: u,
                ended: false,
                next: None,
                began_us: self.now_us,
            },
        );
        let unit = &mut self.units[u];
        unit.invocation = new;
        unit.result = "success";
        unit.exec_main_code = 0;
        unit.exec_main_status = 0;
        unit.dirty = true;
        self.job_done(u);
        // systemd forks the first process (ExecCondition=, ExecStartPre=, or ExecStart=) and
        // only then enters the new state, which stamps InactiveExitTimestamp: the fork comes at
        // the same instant or a little before.
        let forked_us = self.now_us.saturating_sub(self.rng.below(300) as u64);
        self.units[u].stopping_by_job = false;
        let cfg = self.units[u].cfg;
        if cfg.scope {
            return self.attach_scope(u);
        }
        let first = if cfg.exec_condition {
            SvcState::Condition
        } else if cfg.exec_start_pre {
            SvcState::StartPre
        } else {
            SvcState::Start
        };
        self.enter_start_phase(u, first, forked_us);
        self.start_note = self.wake_start_waiters(u);
    }

    /// `service_enter_condition`, `service_enter_start_pre`, `service_enter_start` and
    /// `service_enter_start_post`: the phase's process is forked at `forked_us` into the cgroup
    /// realized again (`service_spawn`), MainPID or ControlPID set, then the state entered.
    /// ExecStart= is the main process, except of Type=forking, whose ExecStart= is a control
    /// process; a Type=simple service goes on at once, never in `start`.
    fn enter_start_phase(&mut self, u: usize, state: SvcState, forked_us: u64) {
        let cgroup = self.realize_cgroup(u);
        let inv = self.units[u].invocation;
        let cfg = self.units[u].cfg;
        let main = state == SvcState::Start && cfg.service_type != ServiceType::Forking;
        let role = if main { Role::Main } else { Role::Control };
        let pid = self.kernel.spawn(&cgroup, inv, u, role, MANAGER, forked_us);
        let unit = &mut self.units[u];
        if main {
            unit.main_pid = Some(pid);
        } else {
            unit.control_pid = Some(pid);
        }
        if main && !cfg.oneshot && cfg.service_type == ServiceType::Simple {
            self.enter_start_post(u);
        } else {
            self.set_state(u, state);
        }
    }

    /// `scope_start` → `scope_enter_running`: the processes named in `PIDs=` (`systemd-run
    /// --scope` itself, and perhaps a child it forked), which started before the invocation
    /// was acquired, are moved into the realized cgroup (`unit_attach_pids_to_cgroup`), and
    /// the scope runs. From then on they are the invocation's.
    fn attach_scope(&mut self, u: usize) {
        let cgroup = self.realize_cgroup(u);
        let inv = self.units[u].invocation;
        let started = self
            .now_us
            .saturating_sub(1 + self.rng.below(2_000_000) as u64);
        let outside = "/user.slice/session-1.scope";
        let leader = self
            .kernel
            .spawn(outside, inv, u, Role::Child, MANAGER, started);
        self.kernel.setsid(leader);
        let mut pids = vec![leader];
        if self.rng.percent(50) {
            let child = self
                .kernel
                .spawn(outside, inv, u, Role::Child, leader, started);
            pids.push(child);
        }
        for pid in pids {
            self.kernel.move_to(pid, &cgroup);
        }
        self.set_state(u, SvcState::Running);
    }

    /// `service_enter_start_post`: ExecStartPost= runs beside the main process, or the unit
    /// goes on to running.
    fn enter_start_post(&mut self, u: usize) {
        if self.units[u].cfg.exec_start_post {
            self.enter_start_phase(u, SvcState::StartPost, self.now_us);
        } else {
            self.enter_running(u);
        }
    }

    /// `service_enter_running`: running while the service is good (`service_good`: its main
    /// process lives, or, none being known, its cgroup is populated), else exited
    /// (RemainAfterExit=) or stopped.
    fn enter_running(&mut self, u: usize) {
        let unit = &self.units[u];
        let guessing = unit.cfg.service_type == ServiceType::Forking;
        let good = unit.main_pid.is_some() || (guessing && self.kernel.populated(&unit.cgroup));
        if good {
            self.set_state(u, SvcState::Running);
        } else if unit.cfg.remain_after_exit {
            self.set_state(u, SvcState::Exited);
        } else {
            self.enter_stop(u);
        }
    }

    /// Type=forking: ExecStart= exits (`service_sigchld_event` in `start`), a failure failing
    /// the start. It forked the daemon first (mostly: one may die at once), which may begin a
    /// session of its own (setsid) and is the manager's child once its parent is gone. MainPID
    /// comes from the PID file (`service_load_pid_file`) or is guessed
    /// (`service_search_main_pid` → `unit_search_main_pid`: the only process directly in the
    /// cgroup whose parent is the manager, whichever invocation started it; none if there are
    /// more), then `service_enter_start_post`.
    fn launcher_exits(&mut self, u: usize) -> String {
        let name = self.units[u].name.clone();
        let Some(launcher) = self.units[u].control_pid else {
            self.enter_start_post(u);
            return format!("{name}: {}", self.describe(u));
        };
        if self.rng.percent(10) {
            self.kill_control(u);
            self.units[u].result = "exit-code";
            self.set_state(u, SvcState::StopSigterm);
            return format!("{name}: the forking ExecStart= fails: {}", self.describe(u));
        }
        let (cgroup, inv) = (self.units[u].cgroup.clone(), self.units[u].invocation);
        // One that fed a waiter its line exits with no daemon, as the real test's unit does.
        let forks = !self.units[u].fed_a_waiter && self.rng.percent(90);
        let daemon = forks.then(|| {
            let daemon = self
                .kernel
                .spawn(&cgroup, inv, u, Role::Child, launcher, self.now_us);
            if self.rng.percent(50) {
                self.kernel.setsid(daemon);
            }
            daemon
        });
        self.kill_control(u);
        let main = match daemon {
            Some(daemon) if self.rng.percent(60) => Some(daemon),
            _ => self.search_main_pid(&cgroup),
        };
        if let Some(main) = main {
            self.kernel.set_role(main, Role::Main);
            let own = self.kernel.procs.get(&main).map_or(inv, |p| p.invocation);
            if own != inv {
                self.misguessed.insert((own, main));
            }
        }
        self.units[u].main_pid = main;
        self.enter_start_post(u);
        format!(
            "{name}: the forking ExecStart= exits, daemon {daemon:?}, MainPID {main:?}: {}",
            self.describe(u)
        )
    }

    /// `unit_search_main_pid`: the only process of `cgroup` itself (`cgroup.procs`) whose
    /// parent is the manager.
    fn search_main_pid(&self, cgroup: &str) -> Option<Pid> {
        let mut kids = self.kernel.procs.values();
        let kids: Vec<Pid> = kids
            .by_ref()
            .filter(|p| p.cgroup == cgroup && p.ppid == MANAGER)
            .map(|p| p.pid)
            .collect();
        match kids[..] {
            [only] => Some(only),
            _ => None,
        }
    }

    pub(super) fn progress(&mut self, u: usize) -> String {
        let unit = &self.units[u];
        let (name, state, job) = (unit.name.clone(), unit.state, unit.job);
        let stable =
            !state.deactivating() && !matches!(state, SvcState::Reload | SvcState::Cleaning);
        if let (Some(job), true) = (job, stable) {
            match (job, state) {
                (Job::Start | Job::Restart, SvcState::Dead | SvcState::Failed) => self.start(u),
                // A job on a unit waiting to restart stops it first (`service_stop` in
                // auto-restart enters dead), then starts it.
                (Job::Start | Job::Restart, SvcState::AutoRestart) => {
                    self.set_state(u, SvcState::Dead);
                    self.start(u);
                }
                (Job::Start, _) | (Job::Stop, SvcState::Dead | SvcState::Failed) => {
                    self.job_done(u);
                }
                (Job::Stop, SvcState::AutoRestart) => {
                    self.job_done(u);
                    self.set_state(u, SvcState::Dead);
                }
                (Job::Stop, _) => {
                    self.job_done(u);
                    self.begin_stop(u);
                }
                (Job::Restart, _) => {
                    self.job_done(u);
                    self.begin_stop(u);
                    self.units[u].job = Some(Job::Start);
                }
            }
            let note = std::mem::take(&mut self.start_note);
            return format!("{name}: {job:?} job runs: {}{note}", self.describe(u));
        }
        if let (Some(Job::Stop), false) = (job, stable) {
            self.job_done(u);
            self.units[u].stopping_by_job = true;
        }
        let cfg = self.units[u].cfg;
        match state {
            SvcState::Condition => {
                // ExecCondition= exits (`service_sigchld_event` in `condition`): an exit status
                // of 1 to 254 skips the unit (`SERVICE_SKIP_CONDITION`: through stop-sigterm to
                // inactive, not failed); success goes on to ExecStartPre= or ExecStart=.
                self.kill_control(u);
                if self.rng.percent(30) {
                    self.units[u].result = SKIP_CONDITION;
                    self.set_state(u, SvcState::StopSigterm);
                } else {
                    let next = if cfg.exec_start_pre {
                        SvcState::StartPre
                    } else {
                        SvcState::Start
                    };
                    self.enter_start_phase(u, next, self.now_us);
                }
            }
            SvcState::StartPre => {
                // ExecStartPre= exits; a failure fails the start.
                self.kill_control(u);
                if self.rng.percent(15) {
                    let unit = &mut self.units[u];
                    unit.result = "exit-code";
                    self.set_state(u, SvcState::StopSigterm);
                } else {
                    self.enter_start_phase(u, SvcState::Start, self.now_us);
                }
            }
            SvcState::Start if cfg.oneshot => {
                let ok = self.rng.percent(75);
                return self.main_exits(u, ok);
            }
            SvcState::Start if cfg.service_type == ServiceType::Forking => {
                return self.launcher_exits(u);
            }
            // Exec'd, or READY=1 (`service_notify_message`).
            SvcState::Start => self.enter_start_post(u),
            SvcState::StartPost => {
                // ExecStartPost= exits (`service_sigchld_event` in `start-post`): a failure
                // stops the unit (`service_enter_signal`), else `service_enter_running`.
                self.kill_control(u);
                if self.rng.percent(10) {
                    self.units[u].result = "exit-code";
                    self.set_state(u, SvcState::StopSigterm);
                } else {
                    self.enter_running(u);
                }
            }
            SvcState::Reload => {
                // ExecReload= exits (`service_enter_running`): back to running, or to exited
                // (which prunes the cgroup again) when there is no main process.
                self.kill_control(u);
                let next = if self.units[u].main_pid.is_some() {
                    SvcState::Running
                } else {
                    SvcState::Exited
                };
                self.set_state(u, next);
            }
            SvcState::Stop => {
                self.kill_control(u);
                self.set_state(u, SvcState::StopSigterm);
            }
            SvcState::StopSigterm | SvcState::FinalSigterm => {
                if self.sigterm(u) {
                    // TimeoutStopSec= passes (`service_dispatch_timer`): SIGKILL.
                    let unit = &mut self.units[u];
                    if unit.result == "success" {
                        unit.result = "timeout";
                    }
                    let next = if state == SvcState::StopSigterm {
                        SvcState::StopSigkill
                    } else {
                        SvcState::FinalSigkill
                    };
                    self.set_state(u, next);
                } else {
                    self.after_stop_signal(u, state);
                }
            }
            SvcState::StopSigkill | SvcState::FinalSigkill => {
                self.sigkill(u);
                self.after_stop_signal(u, state);
            }
            SvcState::StopPost => {
                self.kill_control(u);
                self.set_state(u, SvcState::FinalSigterm);
            }
            SvcState::AutoRestart => {
                // The restart timer fires (`service_dispatch_timer` → the restart job):
                // `service_stop` enters dead, which flushes auto-restart; `service_start` then
                // acquires the new InvocationID before the next flush, so dead is sent with
                // the NEW invocation, never with the old one.
                self.set_state(u, SvcState::Dead);
                self.start(u);
            }
            SvcState::Cleaning => {
                // The clean's process exits (`service_sigchld_event` in `cleaning` →
                // `service_enter_dead`): inactive again, the cgroup pruned (`unit_notify`).
                self.kill_control(u);
                self.set_state(u, SvcState::Dead);
                self.prune_cgroup(u);
            }
            // A scope ran empty (`scope_notify_cgroup_empty_event` → `scope_enter_dead`).
            SvcState::Running if cfg.scope && !self.populated(u) => self.finish(u),
            // A forking service whose MainPID was never known ran empty
            // (`service_notify_cgroup_empty_event` in `running` → `service_enter_running`).
            SvcState::Running if self.units[u].main_pid.is_none() && !self.populated(u) => {
                self.enter_running(u);
            }
            SvcState::Dead | SvcState::Failed | SvcState::Running | SvcState::Exited => {
                // The cgroup ran empty (`unit_notify_cgroup_empty`): an inactive unit's is
                // pruned (`unit_prune_cgroup`).
                if self.prune_cgroup(u) {
                    let cgroup = &self.units[u].cgroup;
                    return format!("{name}: systemd removes the empty cgroup {cgroup}");
                }
            }
        }
        let note = std::mem::take(&mut self.start_note);
        format!("{name}: {}{note}", self.describe(u))
    }

    pub(super) fn describe(&self, u: usize) -> String {
        let unit = &self.units[u];
        format!(
            "{}/{} inv {} pids {:?} cgroup {:?}",
            unit.state.active_state(),
            unit.state.sub_state(),
            short(unit.invocation),
            self.kernel.pids_in(&unit.cgroup),
            if unit.cgroup_known {
                &unit.cgroup[..]
            } else {
                ""
            }
        )
    }

    /// `service_set_state`: a change of state first sends the pending change signal
    /// (`bus_unit_send_pending_change_signal(u, false)`), so the old state goes out on its own;
    /// entering exited prunes the cgroup (`unit_prune_cgroup`); `unit_notify` stamps
    /// InactiveExitTimestamp on leaving inactive or failed, InactiveEnterTimestamp on entering
    /// them, and prunes the cgroup of an inactive unit.
    pub(super) fn set_state(&mut self, u: usize, state: SvcState) {
        if self.units[u].state != state {
            self.send_pending(u, false);
        }
        let now = self.now_us;
        let unit = &mut self.units[u];
        if unit.state.inactive() && !state.inactive() {
            unit.inactive_exit_us = now;
        } else if !unit.state.inactive() && state.inactive() {
            unit.inactive_enter_us = now;
        }
        unit.state = state;
        unit.dirty = true;
        if state == SvcState::Exited {
            self.prune_cgroup(u);
        }
    }

    /// `unit_realize_cgroup`: the cgroup is made (again) and its path known, before systemd
    /// forks into it. Returns the path.
    pub(super) fn realize_cgroup(&mut self, u: usize) -> String {
        let cgroup = self.units[u].cgroup.clone();
        self.kernel.mkdir(&cgroup);
        self.units[u].cgroup_known = true;
        cgroup
    }

    /// `unit_prune_cgroup` with `unit_maybe_release_cgroup`: the cgroup is removed if empty,
    /// and its path forgotten only then (a populated one stays known). Whether it was removed.
    pub(super) fn prune_cgroup(&mut self, u: usize) -> bool {
        let cgroup = self.units[u].cgroup.clone();
        let removed = self.kernel.rmdir(&cgroup);
        if !self.kernel.exists(&cgroup) {
            self.units[u].cgroup_known = false;
        }
        removed
    }

    fn spawn_control(&mut self, u: usize) {
        self.spawn_control_as(u, Role::Control);
    }

    /// Forks ControlPID into the cgroup realized again, under the unit's invocation.
    fn spawn_control_as(&mut self, u: usize, role: Role) {
        let cgroup = self.realize_cgroup(u);
        let inv = self.units[u].invocation;
        let pid = self
            .kernel
            .spawn(&cgroup, inv, u, role, MANAGER, self.now_us);
        self.units[u].control_pid = Some(pid);
    }

    fn kill_control(&mut self, u: usize) {
        if let Some(pid) = self.units[u].control_pid.take() {
            self.kernel.kill(pid);
        }
    }

    /// SIGTERM as KillMode= says (`service_enter_signal` → `unit_kill_context`): the main and
    /// control processes, and unless KillMode=process the rest of the cgroup. A process may
    /// ignore it (`Swarm::ignore_sigterm`): systemd then waits out TimeoutStopSec= and sends
    /// SIGKILL; with SendSIGKILL=no it gives up waiting and what ignored SIGTERM lives on, a
    /// leftover. Whether anything is left for a SIGKILL.
    fn sigterm(&mut self, u: usize) -> bool {
        let ignore = self.swarm.ignore_sigterm;
        let no_sigkill = self.units[u].cfg.no_sigkill;
        let unit = &self.units[u];
        let mut kept = [unit.main_pid, unit.control_pid];
        let mut ignored = Vec::new();
        for pid in &mut kept {
            let Some(p) = *pid else { continue };
            if ignore > 0 && self.rng.percent(ignore) {
                ignored.push(p);
            } else {
                self.kernel.kill(p);
                *pid = None;
            }
        }
        if no_sigkill && !ignored.is_empty() {
            // systemd gives up waiting (TimeoutStopSec=, `service_enter_stop_post`) and
            // forgets them: leftovers like any other.
            for &pid in &ignored {
                self.kernel.set_role(pid, Role::Child);
            }
            kept = [None, None];
            if self.units[u].result == "success" {
                self.units[u].result = "timeout";
            }
        }
        let unit = &mut self.units[u];
        [unit.main_pid, unit.control_pid] = kept;
        let mut left = !ignored.is_empty() && !no_sigkill;
        if self.units[u].cfg.kill_process {
            return left;
        }
        let cgroup = self.units[u].cgroup.clone();
        if ignore == 0 && !no_sigkill {
            self.kernel.kill_all(&cgroup);
            return left;
        }
        let rest = self.kernel.pids_in(&cgroup).into_iter();
        for pid in rest.filter(|pid| !ignored.contains(pid)) {
            if no_sigkill {
                if !self.rng.percent(40) {
                    self.kernel.kill(pid);
                }
            } else if self.rng.percent(ignore) {
                left = true;
            } else {
                self.kernel.kill(pid);
            }
        }
        left
    }

    /// SIGKILL after SIGTERM was ignored (`service_enter_signal` with `stop-sigkill` or
    /// `final-sigkill`): nothing survives it, but KillMode=process sends it to the main and
    /// control processes only.
    fn sigkill(&mut self, u: usize) {
        let unit = &mut self.units[u];
        for pid in [unit.main_pid.take(), unit.control_pid.take()]
            .into_iter()
            .flatten()
        {
            self.kernel.kill(pid);
        }
        if !self.units[u].cfg.kill_process {
            let cgroup = self.units[u].cgroup.clone();
            self.kernel.kill_all(&cgroup);
        }
    }

    /// What follows the stop's signals (`service_sigchld_event`, or the cgroup ran empty):
    /// ExecStopPost= (`service_enter_stop_post`) after the stop's, the end after the final.
    fn after_stop_signal(&mut self, u: usize, state: SvcState) {
        let stopping = matches!(state, SvcState::StopSigterm | SvcState::StopSigkill);
        if stopping && self.units[u].cfg.exec_stop_post {
            self.spawn_control(u);
            self.set_state(u, SvcState::StopPost);
        } else {
            self.finish(u);
        }
    }

    /// Whether any process is in the unit's cgroup.
    fn populated(&self, u: usize) -> bool {
        self.kernel.populated(&self.units[u].cgroup)
    }

    /// A stop job (`service_stop`): ExecStop= from running, exited or reloading
    /// (`service_enter_stop`), else straight to SIGTERM.
    fn begin_stop(&mut self, u: usize) {
        let unit = &mut self.units[u];
        unit.stopping_by_job = true;
        let state = unit.state;
        if state == SvcState::Reload {
            self.kill_control(u);
        }
        if matches!(
            state,
            SvcState::Running | SvcState::Exited | SvcState::Reload
        ) {
            self.enter_stop(u);
        } else {
            self.set_state(u, SvcState::StopSigterm);
        }
    }

    /// `service_enter_stop`: ExecStop= forks into the cgroup realized again; else SIGTERM.
    fn enter_stop(&mut self, u: usize) {
        if self.units[u].cfg.exec_stop {
            self.spawn_control(u);
            self.set_state(u, SvcState::Stop);
        } else {
            self.set_state(u, SvcState::StopSigterm);
        }
    }

    /// `systemctl clean` (`unit_clean`, only of an inactive unit with no job → `service_clean`,
    /// only from dead): a control process (`unit_fork_and_watch_rm_rf`) forked into the cgroup
    /// realized again, under the last InvocationID, which stays; `cleaning` is ActiveState
    /// maintenance, and leaving inactive stamps InactiveExitTimestamp (`unit_notify`).
    pub(super) fn clean(&mut self, u: usize) -> String {
        self.spawn_control_as(u, Role::Clean);
        self.set_state(u, SvcState::Cleaning);
        format!(
            "{}: systemctl clean: {}",
            self.units[u].name,
            self.describe(u)
        )
    }

    /// `service_reload` → `service_enter_reload`: ExecReload= forks into the cgroup realized
    /// again (`unit_realize_cgroup`), under the same invocation.
    pub(super) fn reload_unit(&mut self, u: usize) -> String {
        self.spawn_control(u);
        self.set_state(u, SvcState::Reload);
        format!("{}: reload: {}", self.units[u].name, self.describe(u))
    }

    pub(super) fn main_exits(&mut self, u: usize, ok: bool) -> String {
        if let Some(main) = self.units[u].main_pid.take() {
            self.kernel.kill(main);
        }
        let unit = &mut self.units[u];
        (unit.result, unit.exec_main_code, unit.exec_main_status) = if ok {
            ("success", 1, 0)
        } else if self.rng.percent(50) {
            ("exit-code", 1, 3)
        } else {
            ("signal", 2, 9)
        };
        let next = match (ok, unit.cfg.remain_after_exit, unit.cfg.exec_stop) {
            (true, true, _) => SvcState::Exited,
            (true, false, true) => SvcState::Stop,
            _ => SvcState::StopSigterm,
        };
        if next == SvcState::Stop {
            self.spawn_control(u);
        }
        self.set_state(u, next);
        format!(
            "{}: main process exits ({}): {}",
            self.units[u].name,
            self.units[u].result,
            self.describe(u)
        )
    }

    /// `service_enter_dead`: the service reaches inactive or failed (`service_set_state`,
    /// whose flush sends the last deactivating state; `unit_notify` prunes the cgroup); when
    /// Restart= says so, it then enters auto-restart, whose flush sends failed (or inactive)
    /// with the old invocation first.
    fn finish(&mut self, u: usize) {
        let unit = &mut self.units[u];
        unit.main_pid = None;
        unit.control_pid = None;
        let failed = ends_failed(unit.result);
        let restart = unit.cfg.restart.shall(unit.result) && !unit.stopping_by_job;
        unit.stopping_by_job = false;
        let inv = unit.invocation;
        self.set_state(
            u,
            if failed {
                SvcState::Failed
            } else {
                SvcState::Dead
            },
        );
        if let Some(record) = self.history.get_mut(&inv) {
            record.ended = true;
        }
        self.prune_cgroup(u);
        if restart {
            self.set_state(u, SvcState::AutoRestart);
        }
    }

    /// `parent`, a main or control process or a child of one (perhaps left over from an
    /// invocation that ended), forks: the child belongs to the parent's invocation and starts in
    /// its cgroup, except that a delegated main process puts its children in a sub-cgroup.
    pub(super) fn fork(&mut self, parent: Pid) -> String {
        let Some(p) = self.kernel.procs.get(&parent) else {
            return format!("{parent} is gone");
        };
        let (u, inv, role) = (p.unit, p.invocation, p.role);
        let unit = &self.units[u];
        let cgroup = if role == Role::Main && unit.cfg.delegate {
            format!("{}/payload", p.cgroup)
        } else {
            p.cgroup.clone()
        };
        let pid = self
            .kernel
            .spawn(&cgroup, inv, u, Role::Child, parent, self.now_us);
        let waits = role == Role::Control
            && self.swarm.start_waiters > 0
            && self.waiter_rng.percent(self.swarm.start_waiters);
        if let Some(child) = self.kernel.procs.get_mut(&pid) {
            child.waits_for_start = waits;
        }
        let waiting = if waits {
            ", which waits for the next start"
        } else {
            ""
        };
        format!(
            "{}: {role:?} {parent} of inv {} forks child {pid} in {cgroup}{waiting}",
            self.units[u].name,
            short(inv)
        )
    }

    /// The leftovers of `u` that wait for its next start, now that it began: each forks a child
    /// (in its session, after the invocation began) and exits, leaving the child to the
    /// manager (where `unit_search_main_pid` may find it). What happened, for the transcript.
    fn wake_start_waiters(&mut self, u: usize) -> String {
        let waiters: Vec<Pid> = self
            .kernel
            .procs
            .values()
            .filter(|p| p.unit == u && p.waits_for_start)
            .map(|p| p.pid)
            .collect();
        self.units[u].fed_a_waiter = !waiters.is_empty();
        let mut woken = Vec::new();
        for waiter in waiters {
            let Some(p) = self.kernel.procs.get(&waiter) else {
                continue;
            };
            let (cgroup, inv) = (p.cgroup.clone(), p.invocation);
            let child = self
                .kernel
                .spawn(&cgroup, inv, u, Role::Child, waiter, self.now_us);
            self.kernel.kill(waiter);
            woken.push(format!("{waiter} forks {child} and exits"));
        }
        if woken.is_empty() {
            String::new()
        } else {
            format!("; waiting for it: {}", woken.join(", "))
        }
    }
}

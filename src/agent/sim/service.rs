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
use super::unit::{Job, SvcState};
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
            },
        );
        let unit = &mut self.units[u];
        unit.invocation = new;
        unit.result = "success";
        unit.exec_main_code = 0;
        unit.exec_main_status = 0;
        unit.dirty = true;
        self.job_done(u);
        // systemd forks the first process (ExecStartPre=, or ExecStart=) and only then enters
        // the new state, which stamps InactiveExitTimestamp: the fork comes at the same
        // instant or a little before.
        let forked_us = self.now_us.saturating_sub(self.rng.below(300) as u64);
        let cgroup = self.realize_cgroup(u);
        let pre = self.units[u].cfg.exec_start_pre;
        let role = if pre { Role::Control } else { Role::Main };
        let first = self.kernel.spawn(&cgroup, new, u, role, MANAGER, forked_us);
        let unit = &mut self.units[u];
        (unit.main_pid, unit.control_pid) = if pre {
            (None, Some(first))
        } else {
            (Some(first), None)
        };
        unit.stopping_by_job = false;
        let state = if pre {
            SvcState::StartPre
        } else {
            SvcState::Start
        };
        self.set_state(u, state);
    }

    pub(super) fn progress(&mut self, u: usize) -> String {
        let unit = &self.units[u];
        let (name, state, job) = (unit.name.clone(), unit.state, unit.job);
        let stable = !state.deactivating() && state != SvcState::Reload;
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
            return format!("{name}: {job:?} job runs: {}", self.describe(u));
        }
        if let (Some(Job::Stop), false) = (job, stable) {
            self.job_done(u);
            self.units[u].stopping_by_job = true;
        }
        match state {
            SvcState::StartPre => {
                // ExecStartPre= exits; a failure fails the start.
                self.kill_control(u);
                if self.rng.percent(15) {
                    let unit = &mut self.units[u];
                    unit.result = "exit-code";
                    self.set_state(u, SvcState::StopSigterm);
                } else {
                    let cgroup = self.realize_cgroup(u);
                    let inv = self.units[u].invocation;
                    let main = self
                        .kernel
                        .spawn(&cgroup, inv, u, Role::Main, MANAGER, self.now_us);
                    self.units[u].main_pid = Some(main);
                    self.set_state(u, SvcState::Start);
                }
            }
            SvcState::Start if self.units[u].cfg.oneshot => {
                let ok = self.rng.percent(75);
                return self.main_exits(u, ok);
            }
            SvcState::Start => self.set_state(u, SvcState::Running),
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
            SvcState::StopSigterm => {
                if let Some(main) = self.units[u].main_pid.take() {
                    self.kernel.kill(main);
                }
                self.kill_by_mode(u);
                if self.units[u].cfg.exec_stop_post {
                    self.spawn_control(u);
                    self.set_state(u, SvcState::StopPost);
                } else {
                    self.finish(u);
                }
            }
            SvcState::StopPost => {
                self.kill_control(u);
                self.set_state(u, SvcState::FinalSigterm);
            }
            SvcState::FinalSigterm => {
                self.kill_by_mode(u);
                self.finish(u);
            }
            SvcState::AutoRestart => {
                // The restart timer fires (`service_dispatch_timer` → the restart job):
                // `service_stop` enters dead, which flushes auto-restart; `service_start` then
                // acquires the new InvocationID before the next flush, so dead is sent with
                // the NEW invocation, never with the old one.
                self.set_state(u, SvcState::Dead);
                self.start(u);
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
        format!("{name}: {}", self.describe(u))
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
        let cgroup = self.realize_cgroup(u);
        let inv = self.units[u].invocation;
        let pid = self
            .kernel
            .spawn(&cgroup, inv, u, Role::Control, MANAGER, self.now_us);
        self.units[u].control_pid = Some(pid);
    }

    fn kill_control(&mut self, u: usize) {
        if let Some(pid) = self.units[u].control_pid.take() {
            self.kernel.kill(pid);
        }
    }

    /// SIGTERM as KillMode= says (`service_enter_signal` → `unit_kill_context`): the whole
    /// cgroup, or (KillMode=process) the main and control processes only, leaving the rest
    /// behind. With SendSIGKILL=no what ignores SIGTERM survives: systemd gives up waiting.
    fn kill_by_mode(&mut self, u: usize) {
        self.kill_control(u);
        if self.units[u].cfg.kill_process {
            return;
        }
        let cgroup = self.units[u].cgroup.clone();
        if !self.units[u].cfg.no_sigkill {
            self.kernel.kill_all(&cgroup);
            return;
        }
        for pid in self.kernel.pids_in(&cgroup) {
            if !self.rng.percent(40) {
                self.kernel.kill(pid);
            }
        }
    }

    /// `service_enter_stop`: ExecStop= (from running, exited or reloading) forks into the
    /// cgroup realized again; else straight to SIGTERM.
    fn begin_stop(&mut self, u: usize) {
        let unit = &mut self.units[u];
        unit.stopping_by_job = true;
        let next = match unit.state {
            SvcState::Running | SvcState::Exited | SvcState::Reload if unit.cfg.exec_stop => {
                SvcState::Stop
            }
            _ => SvcState::StopSigterm,
        };
        if unit.state == SvcState::Reload {
            self.kill_control(u);
        }
        if next == SvcState::Stop {
            self.spawn_control(u);
        }
        self.set_state(u, next);
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
        let failed = unit.result != "success";
        let restart = unit.cfg.restart.shall(failed) && !unit.stopping_by_job;
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
        format!(
            "{}: {role:?} {parent} of inv {} forks child {pid} in {cgroup}",
            unit.name,
            short(inv)
        )
    }
}

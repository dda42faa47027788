//! What the world does in one step, as the seed chooses: one turn of systemd's event loop (it
//! moves a unit on, answers calls, reloads, collects garbage), an outsider's act (a start, a
//! stop, a fork, an exit) or a fault (the bus daemon dies, inotify overflows); and the random
//! world a seed begins with.
//!
//! One world step is one turn of systemd's event loop: the PropertiesChanged signals of every
//! unit that changed go out at its end, so what happened inside one turn is merged.

use super::bus::{Answer, CallKind, NO_SUCH_UNIT};
use super::kernel::{Pid, Role};
use super::rng::Rng;
use super::unit::{Job, Restart, ServiceType, SvcState, UnitConfig};
use super::world::{Swarm, World};
use crate::systemd::signal::SystemdSignal;

/// One thing the world can do in a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// systemd moves a unit on (a job, a process it waited for, a timer).
    Progress(usize),
    /// systemd reads its next method calls and answers them.
    ProcessCalls(usize),
    MainExits(usize, bool),
    /// A main process, or a child of one, forks.
    Fork(Pid),
    ChildExits(Pid),
    Start(usize),
    Stop(usize),
    Restart(usize),
    ResetFailed(usize),
    /// `systemctl reload`: ExecReload= runs.
    ReloadUnit(usize),
    /// `systemctl clean`: a control process removes the directories of an inactive unit.
    Clean(usize),
    /// The machine suspends: CLOCK_BOOTTIME runs on, CLOCK_MONOTONIC does not.
    Suspend,
    Gc(usize),
    Reload,
    /// The operator takes the unit's aliases away (or makes them again) and reloads.
    ToggleAliases(usize),
    Reexec,
    SystemdBack,
    BusDown,
    BusBack,
    Overflow,
    LoseWatch(String),
}

/// Who acts in a world step besides systemd finishing what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Acting {
    Systemd,
    /// Outsiders too: starts, stops, restarts, reloads of a unit, exits and forks.
    Workload,
    /// Outsiders and faults: daemon-reload and reexec, the bus daemon's death, inotify's
    /// overflow and lost watches.
    Chaos,
}

impl World {
    /// A world of a few units of random kinds, some running, from `seed`, with the seed's own
    /// swarm of fault rates and unit settings.
    pub(crate) fn new(seed: u64) -> World {
        let mut world = World::empty(seed);
        let mut swarm = Swarm::draw(&mut world.rng);
        // From a generator of its own: every other draw of a seed stays what it was before
        // this mode was drawn, so the seeds that once failed still replay as they did.
        swarm.heals_under_load = Rng::new(!seed).percent(25);
        // The later model items draw from a generator of their own too.
        let mut later = Rng::new(seed.rotate_left(29) ^ 0x6d6f_6465_6c73);
        swarm.draw_later_items(&mut later);
        swarm.draw_census_races(&mut Rng::new(seed.rotate_left(17) ^ 0x0072_6163_6573));
        swarm.draw_start_waiters(&mut Rng::new(seed.rotate_left(41) ^ 0x0077_6169_7473));
        swarm.draw_alias_changes(&mut Rng::new(seed.rotate_left(53) ^ 0x616c_6961_7365));
        world.swarm = swarm;
        world.bus.lose_percent = swarm.signal_loss;
        world.bus.error_percent = swarm.method_errors;
        if swarm.high_serials {
            world.bus.start_serials_near_max(&mut world.rng);
        }
        world.kernel.pid_max = swarm.pid_max;
        let n = 2 + world.rng.below(4);
        for i in 0..n {
            let r = &mut world.rng;
            // A rare combination, on purpose: a RemainAfterExit unit with ExecStop= whose
            // leftovers survive, the kind a late watch finds active/exited.
            let rare = swarm.rare_combo && r.percent(80);
            let oneshot = rare || r.percent(25);
            let restart = match r.below(10) {
                0..=5 => Restart::No,
                6 | 7 => Restart::OnFailure,
                8 => Restart::OnSuccess,
                _ => Restart::Always,
            };
            let service_type = if oneshot || !later.percent(swarm.forking + swarm.simple) {
                ServiceType::Exec
            } else if later.below((swarm.forking + swarm.simple) as usize) < swarm.forking as usize
            {
                ServiceType::Forking
            } else {
                ServiceType::Simple
            };
            let scope = later.percent(swarm.scopes);
            let cfg = UnitConfig {
                oneshot,
                service_type,
                exec_condition: later.percent(swarm.exec_condition),
                exec_start_post: !oneshot && later.percent(swarm.exec_start_post),
                exec_start_pre: r.percent(30),
                remain_after_exit: rare || (oneshot && r.percent(70)) || r.percent(10),
                kill_process: rare || r.percent(swarm.kill_process),
                exec_stop: rare || r.percent(40),
                exec_stop_post: r.percent(40),
                restart: if rare { Restart::No } else { restart },
                delegate: r.percent(30),
                exec_reload: r.percent(swarm.exec_reload),
                no_sigkill: r.percent(swarm.no_sigkill),
                scope: false,
            };
            // A scope has none of a service's settings but SendSIGKILL=.
            let cfg = if scope {
                UnitConfig {
                    scope,
                    no_sigkill: cfg.no_sigkill,
                    ..UnitConfig::default()
                }
            } else {
                cfg
            };
            // Transient units (systemd-run) have no unit file to alias.
            let transient = r.percent(50);
            let (name, aliases) = if scope {
                (format!("run-u{i}.scope"), Vec::new())
            } else if transient {
                (format!("run-u{i}.service"), Vec::new())
            } else if r.percent(50) {
                (format!("s{i}.service"), vec![format!("nick{i}.service")])
            } else {
                (format!("s{i}.service"), Vec::new())
            };
            world.add_unit(&name, aliases, cfg);
            if world.rng.percent(if rare { 95 } else { 70 }) {
                world.start(i);
                while !oneshot
                    && matches!(
                        world.units[i].state,
                        SvcState::Condition
                            | SvcState::StartPre
                            | SvcState::Start
                            | SvcState::StartPost
                    )
                {
                    world.progress(i);
                }
                if rare && world.units[i].state == SvcState::Start {
                    world.main_exits(i, true);
                }
            }
        }
        world.flush();
        world
    }

    /// The actions possible now, with their weights.
    pub(crate) fn candidates(&self, acting: Acting) -> Vec<(u32, Action)> {
        let mut out = Vec::new();
        let mut add = |w: u32, a: Action| out.push((w, a));
        for (u, unit) in self.units.iter().enumerate() {
            if self.can_progress(u) {
                add(12, Action::Progress(u));
            }
            if acting == Acting::Systemd {
                continue;
            }
            if unit.main_pid.is_some() && matches!(unit.state, SvcState::Running | SvcState::Start)
            {
                add(3, Action::MainExits(u, true));
                add(3, Action::MainExits(u, false));
            }
            if let Some(main) = unit.main_pid {
                add(5, Action::Fork(main));
            }
            // ExecStop=, ExecStopPost=, ExecReload= fork too, and with KillMode=process (or
            // SendSIGKILL=no) what they fork outlives them.
            if let Some(control) = unit
                .control_pid
                .filter(|_| unit.state != SvcState::Cleaning)
            {
                add(
                    if self.swarm.rare_combo { 12 } else { 4 },
                    Action::Fork(control),
                );
            }
            if unit.cfg.exec_reload
                && unit.job.is_none()
                && matches!(unit.state, SvcState::Running | SvcState::Exited)
            {
                add(2, Action::ReloadUnit(u));
            }
            // A scope is made anew by StartTransientUnit, once the last one is collected; it
            // cannot be restarted.
            if !unit.loaded || (!unit.state.running() && !unit.cfg.scope) {
                add(4, Action::Start(u));
            }
            if unit.loaded && unit.state.running() {
                add(2, Action::Stop(u));
                if !unit.cfg.scope {
                    add(2, Action::Restart(u));
                }
            }
            if unit.loaded && unit.state == SvcState::Failed {
                add(2, Action::ResetFailed(u));
            }
            if self.collectable(u) {
                add(4, Action::Gc(u));
            }
            if self.swarm.clean
                && !unit.cfg.scope
                && unit.loaded
                && unit.state == SvcState::Dead
                && unit.job.is_none()
                && unit.invocation != 0
            {
                add(2, Action::Clean(u));
            }
        }
        if acting != Acting::Systemd && self.swarm.suspends {
            add(1, Action::Suspend);
        }
        if acting != Acting::Systemd {
            for p in self.kernel.procs.values() {
                if p.role == Role::Child {
                    add(3, Action::ChildExits(p.pid));
                    // A child forks too, left over or not; a unit's processes stay few.
                    let cgroup = &self.units[p.unit].cgroup;
                    if self.kernel.pids_in(cgroup).len() < 6 {
                        add(1, Action::Fork(p.pid));
                    }
                }
            }
        }
        if self.bus.systemd_on && !self.bus.calls.is_empty() {
            add(15, Action::ProcessCalls(1 + self.calls_batch()));
        }
        if !self.bus.systemd_on && self.bus.daemon_up {
            add(6, Action::SystemdBack);
        }
        if !self.bus.daemon_up {
            add(6, Action::BusBack);
        }
        if acting == Acting::Chaos {
            if self.bus.systemd_on {
                add(1, Action::Reload);
                add(1, Action::Reexec);
                add(1, Action::BusDown);
            }
            add(1, Action::Overflow);
            if self.bus.systemd_on && self.swarm.alias_changes > 0 {
                for (u, unit) in self.units.iter().enumerate() {
                    if !unit.aliases.is_empty() {
                        add(self.swarm.alias_changes, Action::ToggleAliases(u));
                    }
                }
            }
            for path in self.kernel.watched_paths() {
                add(1, Action::LoseWatch(path));
            }
        }
        out
    }

    fn calls_batch(&self) -> usize {
        self.bus.calls.len().min(3) - 1
    }

    /// Picks one action by weight and does it; `None` if the world has nothing to do.
    pub(crate) fn random_step(&mut self, acting: Acting) -> Option<String> {
        let candidates = self.candidates(acting);
        let weights: Vec<u32> = candidates.iter().map(|(w, _)| *w).collect();
        let i = self.rng.weighted(&weights)?;
        Some(self.apply(candidates[i].1.clone()))
    }

    fn can_progress(&self, u: usize) -> bool {
        let unit = &self.units[u];
        unit.loaded
            && (unit.job.is_some()
                || matches!(
                    unit.state,
                    SvcState::Condition
                        | SvcState::StartPre
                        | SvcState::Start
                        | SvcState::StartPost
                        | SvcState::Stop
                        | SvcState::StopSigterm
                        | SvcState::StopSigkill
                        | SvcState::StopPost
                        | SvcState::FinalSigterm
                        | SvcState::FinalSigkill
                        | SvcState::AutoRestart
                        | SvcState::Reload
                        | SvcState::Cleaning
                )
                || (!unit.state.running()
                    && unit.cgroup_known
                    && !self.kernel.populated(&unit.cgroup))
                // A forking service whose MainPID is not known ends when its cgroup runs empty.
                || (unit.state == SvcState::Running
                    && unit.main_pid.is_none()
                    && !self.kernel.populated(&unit.cgroup)))
    }

    fn collectable(&self, u: usize) -> bool {
        let unit = &self.units[u];
        unit.loaded
            && unit.state == SvcState::Dead
            && unit.job.is_none()
            && !self.kernel.populated(&unit.cgroup)
    }

    /// Does `action` as one turn of systemd's loop and says what happened.
    pub(crate) fn apply(&mut self, action: Action) -> String {
        let line = match action {
            Action::Progress(u) => self.progress(u),
            Action::ProcessCalls(n) => self.process_calls(n),
            Action::MainExits(u, ok) => self.main_exits(u, ok),
            Action::Fork(pid) => self.fork(pid),
            Action::ChildExits(pid) => {
                self.kernel.kill(pid);
                format!("child {pid} exits")
            }
            Action::Start(u) => self.request(u, Job::Start),
            Action::Stop(u) => self.request(u, Job::Stop),
            Action::Restart(u) => self.request(u, Job::Restart),
            Action::ResetFailed(u) => {
                // `service_reset_failed`: failed enters dead.
                self.units[u].result = "success";
                self.set_state(u, SvcState::Dead);
                format!("{}: reset-failed", self.units[u].name)
            }
            Action::ReloadUnit(u) => self.reload_unit(u),
            Action::Clean(u) => self.clean(u),
            Action::Suspend => {
                let us = 1 + self.rng.below(30_000_000) as u64;
                self.kernel.suspended_us += us;
                format!("the machine suspends for {} ms", us / 1000)
            }
            Action::Gc(u) => self.gc(u),
            Action::Reload => self.reload(false),
            Action::ToggleAliases(u) => {
                let unit = &mut self.units[u];
                unit.aliases_linked = !unit.aliases_linked;
                let what = match unit.aliases_linked {
                    true => "made again",
                    false => "taken away",
                };
                let line = format!("{}: its aliases {what}", unit.name);
                format!("{line}; {}", self.reload(false))
            }
            Action::Reexec => self.reload(true),
            Action::SystemdBack => {
                self.bus.systemd_back();
                "systemd is back on the bus (new connection, serials restart)".into()
            }
            Action::BusDown => {
                self.bus.daemon_down();
                "the bus daemon goes away".into()
            }
            Action::BusBack => {
                self.bus.daemon_back();
                "the bus daemon is back, systemd on it".into()
            }
            Action::Overflow => {
                self.kernel.overflow_now();
                "inotify queue overflows".into()
            }
            Action::LoseWatch(path) => {
                self.kernel.lose_watch(&path);
                format!("inotify drops the watch of {path}")
            }
        };
        self.flush();
        line
    }

    /// `unit_gc_sweep` → `unit_free`: UnitRemoved, and the cgroup released.
    fn gc(&mut self, u: usize) -> String {
        self.flush();
        self.prune_cgroup(u);
        self.units[u].cgroup_known = false;
        let unit = &mut self.units[u];
        unit.loaded = false;
        let (inv, name) = (unit.invocation, unit.name.clone());
        unit.invocation = 0;
        if let Some(record) = self.history.get_mut(&inv) {
            record.ended = true;
        }
        self.emit(SystemdSignal::UnitRemoved { unit: name.clone() });
        format!("{name}: garbage-collected (UnitRemoved)")
    }

    /// daemon-reload, or daemon-reexec (which ends with systemd leaving the bus):
    /// `manager_reload` sends Reloading true, UnitRemoved for every unit as it is serialized,
    /// UnitNew alone for every unit loaded again (`sent_dbus_new_signal` starts false; no
    /// PropertiesChanged while `MANAGER_IS_RELOADING`), then Reloading false. A unit whose
    /// cgroup systemd does not hold may come back with another Slice= (`unit_set_slice` is
    /// refused only while the cgroup is realized): its next invocation runs elsewhere.
    fn reload(&mut self, reexec: bool) -> String {
        self.flush();
        self.emit(SystemdSignal::Reloading(true));
        let loaded: Vec<usize> = (0..self.units.len())
            .filter(|u| self.units[*u].loaded)
            .collect();
        for &u in &loaded {
            let unit = self.units[u].name.clone();
            self.emit(SystemdSignal::UnitRemoved { unit });
        }
        if reexec {
            self.bus.systemd_leaves();
            return format!("daemon-reexec: {} units re-serialized", loaded.len());
        }
        self.reloading = true;
        let mut moved = Vec::new();
        for &u in &loaded {
            self.units[u].new_sent = false;
            self.units[u].dirty = true;
            let unit = &self.units[u];
            if !unit.cgroup_known && !unit.state.running() && self.rng.percent(10) {
                let slice = if unit.cgroup.starts_with("/app.slice/") {
                    "/other.slice"
                } else {
                    "/app.slice"
                };
                let cgroup = format!("{slice}/{}", unit.name);
                moved.push(format!("{} now in {cgroup}", unit.name));
                self.units[u].cgroup = cgroup;
            }
        }
        self.flush();
        self.reloading = false;
        self.emit(SystemdSignal::Reloading(false));
        format!("daemon-reload: {} units {}", loaded.len(), moved.join(", "))
    }

    fn process_calls(&mut self, n: usize) -> String {
        let mut done = Vec::new();
        for _ in 0..n {
            if !self.bus.systemd_on {
                break;
            }
            let Some(mut call) = self.bus.calls.pop_front() else {
                break;
            };
            let error = self.method_error(call.kind == CallKind::Stop);
            let answer = match (call.kind, error) {
                (CallKind::Read(_), Some(error)) => {
                    self.bus.next_serial(0);
                    Answer::Read(Err(error))
                }
                (CallKind::Stop, Some(error)) => {
                    self.bus.next_serial(0);
                    Answer::Stop(Err(error))
                }
                (CallKind::Read(kind), None) => {
                    // systemd answers a few of the read's messages now; anything may happen
                    // before it answers the rest.
                    let mut burst = 1 + self.rng.below(call.parts_needed(kind) - call.parts.len());
                    let mut unloaded = false;
                    while burst > 0 && !unloaded {
                        // After a GetUnit that found nothing, GetUnitByInvocationID
                        // (`method_get_unit_by_invocation_id`): the rest is read at the path of
                        // the loaded unit whose current invocation is the watch's.
                        let by_invocation = call.asked_by_invocation() && call.parts.len() == 1;
                        let running = by_invocation
                            .then(|| self.running(kind.by_invocation))
                            .flatten();
                        if let Some(u) = running {
                            call.unit = self.units[u].name.clone();
                        }
                        let mut part = self.snapshot(&call.unit);
                        part.loaded &= !by_invocation || running.is_some();
                        // GetUnit answers the unit's object path: the rest of the read goes
                        // there, whatever the name stands for meanwhile (an alias taken away).
                        if kind.get_unit && call.parts.is_empty() && part.loaded {
                            call.unit = part.id.clone();
                        }
                        unloaded = !part.loaded
                            && (by_invocation
                                || kind.get_unit
                                    && call.parts.is_empty()
                                    && kind.by_invocation.is_none());
                        call.parts.push(part);
                        burst -= 1;
                    }
                    if !unloaded && call.parts.len() < call.parts_needed(kind) {
                        // The driver sends the next message once this one is answered.
                        done.push(format!(
                            "Read {} #{} ({} of {})",
                            call.unit,
                            call.id,
                            call.parts.len(),
                            call.parts_needed(kind)
                        ));
                        self.bus.calls.push_back(call);
                        continue;
                    }
                    Answer::Read(Ok(std::mem::take(&mut call.parts)))
                }
                (CallKind::Stop, None) => match self.lookup(&call.unit) {
                    Some(u) if self.units[u].loaded => {
                        self.bus.next_serial(0);
                        self.units[u].job = Some(Job::Stop);
                        Answer::Stop(Ok(()))
                    }
                    _ => {
                        self.bus.next_serial(0);
                        Answer::Stop(Err(NO_SUCH_UNIT.into()))
                    }
                },
            };
            let dropped = if self.bus.wanted(&call) {
                ""
            } else {
                " (nobody waits)"
            };
            let kind = match call.kind {
                CallKind::Read(_) => "Read",
                CallKind::Stop => "Stop",
            };
            done.push(format!("{kind} {} #{}{dropped}", call.unit, call.id));
            self.bus.reply(&call, answer);
        }
        format!("systemd answers {}", done.join(", "))
    }

    /// One quiet turn: systemd moves every unit on and answers every call; no outsider acts.
    /// With `wind_down`, an operator stops everything and kills what stops leave behind.
    pub(crate) fn settle(&mut self, wind_down: bool) -> Vec<String> {
        let mut lines = Vec::new();
        if !self.bus.daemon_up {
            lines.push(self.apply(Action::BusBack));
        } else if !self.bus.systemd_on {
            lines.push(self.apply(Action::SystemdBack));
        }
        for u in 0..self.units.len() {
            let unit = &self.units[u];
            if wind_down && unit.loaded && unit.state.running() && unit.job != Some(Job::Stop) {
                lines.push(self.apply(Action::Stop(u)));
            }
            if wind_down && !self.units[u].state.running() {
                let cgroup = self.units[u].cgroup.clone();
                let killed = if self.operator_spares.is_empty() {
                    self.kernel.kill_all(&cgroup)
                } else {
                    let pids: Vec<Pid> = self
                        .kernel
                        .procs
                        .values()
                        .filter(|p| p.unit == u && !self.operator_spares.contains(&p.invocation))
                        .map(|p| p.pid)
                        .collect();
                    pids.into_iter().filter(|p| self.kernel.kill(*p)).count()
                };
                if killed > 0 {
                    lines.push(format!(
                        "{}: operator kills what is left",
                        self.units[u].name
                    ));
                }
            }
            if self.can_progress(u) {
                lines.push(self.apply(Action::Progress(u)));
            }
        }
        if !self.bus.calls.is_empty() {
            let n = self.bus.calls.len();
            lines.push(self.apply(Action::ProcessCalls(n)));
        }
        lines
    }

    /// Nothing more will happen without an outsider.
    pub(crate) fn settled(&self) -> bool {
        (0..self.units.len()).all(|u| !self.can_progress(u)) && self.bus.calls.is_empty()
    }

    /// An error systemd (or the bus daemon) may answer a call with, other than NoSuchUnit.
    fn method_error(&mut self, stop: bool) -> Option<String> {
        if self.bus.error_percent == 0 || !self.rng.percent(self.bus.error_percent) {
            return None;
        }
        let errors: &[&str] = if stop {
            &[
                "org.freedesktop.DBus.Error.AccessDenied",
                "org.freedesktop.DBus.Error.LimitsExceeded",
                "org.freedesktop.systemd1.TransactionIsDestructive",
            ]
        } else {
            &[
                "org.freedesktop.DBus.Error.AccessDenied",
                "org.freedesktop.DBus.Error.LimitsExceeded",
            ]
        };
        Some(errors[self.rng.below(errors.len())].to_owned())
    }
}

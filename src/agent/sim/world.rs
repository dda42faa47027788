//! The world the agent lives in: systemd's units and jobs, over the kernel and the bus models.
//!
//! A unit follows systemd's service state machine closely enough to produce every sequence of
//! states the agent can see: activating, active/running, active/exited (RemainAfterExit),
//! deactivating through ExecStop= and ExecStopPost= (under the invocation being stopped),
//! inactive or failed (the InvocationID stays), auto-restart (through failed/inactive, then a
//! new invocation), garbage collection (unloaded: no invocation, GetUnit says NoSuchUnit).
//! One world step is one turn of systemd's event loop: the PropertiesChanged signals of every
//! unit that changed go out at its end, so what happened inside one turn is merged. Each
//! carries every property systemd marks emits-change, as systemd sends them: first the Service
//! interface's (Result, ExecMain*, MainPID, ControlPID), then the Unit interface's (states,
//! InvocationID, InactiveExitTimestampMonotonic).

use std::collections::BTreeMap;

use super::bus::{Answer, Bus, CallKind, NO_SUCH_UNIT, Snapshot};
use super::kernel::{Inv, Kernel, Pid, Role};
use super::rng::Rng;
use super::service::{Job, Restart, SvcState, Unit, UnitConfig};
use crate::systemd::signal::{SystemdSignal, UnitChange, unit_path};

/// One seed's draw of fault rates and unit settings (swarm testing: each seed its own mix,
/// so rare combinations are common in some seeds instead of diluted in all).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Swarm {
    /// Most units are RemainAfterExit + ExecStop= + KillMode=process, started and exited.
    pub rare_combo: bool,
    /// Percent of units with KillMode=process, ExecReload=, SendSIGKILL=no.
    pub kill_process: u32,
    pub exec_reload: u32,
    pub no_sigkill: u32,
    /// Percent of signals the bus loses on a live connection (the core's relist is on then).
    pub signal_loss: u32,
    /// Percent of method calls systemd answers with an error other than NoSuchUnit.
    pub method_errors: u32,
    /// systemd's serials start near u32::MAX.
    pub high_serials: bool,
    /// The kernel's pid space is small: pids are reused soon.
    pub pid_max: u32,
    /// The operator winding the world down kills only what is left of invocations the
    /// platform watched: other invocations' leftovers live on.
    pub spare_unwatched: bool,
    /// The core reads at most this many units at once.
    pub max_reads_in_flight: usize,
    /// Weight of the platform's watches made late (of what runs now).
    pub late_watches: bool,
}

impl Swarm {
    pub(crate) fn draw(r: &mut Rng) -> Swarm {
        let mut swarm = Swarm {
            rare_combo: r.percent(25),
            kill_process: [10, 35, 80][r.below(3)],
            exec_reload: [0, 20, 60][r.below(3)],
            no_sigkill: [0, 0, 20, 50][r.below(4)],
            signal_loss: if r.percent(20) {
                1 + r.below(8) as u32
            } else {
                0
            },
            method_errors: if r.percent(20) {
                1 + r.below(5) as u32
            } else {
                0
            },
            high_serials: r.percent(20),
            pid_max: if r.percent(30) { 400 } else { 4_000_000 },
            spare_unwatched: r.percent(50),
            max_reads_in_flight: if r.percent(20) { 1 + r.below(3) } else { 32 },
            late_watches: r.percent(40),
        };
        // The rare combination is only worth its seeds if the platform watches late.
        swarm.late_watches |= swarm.rare_combo;
        swarm
    }
}

/// What became of one invocation, for the oracle.
#[derive(Clone, Debug)]
pub(crate) struct InvRecord {
    pub unit: usize,
    /// It reached inactive or failed (or its unit was unloaded).
    pub ended: bool,
    /// The invocation of the same unit that started after it.
    pub next: Option<Inv>,
}

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
    Gc(usize),
    Reload,
    Reexec,
    SystemdBack,
    BusDown,
    BusBack,
    Overflow,
    LoseWatch(String),
}

pub(crate) struct World {
    pub now_us: u64,
    pub units: Vec<Unit>,
    pub kernel: Kernel,
    pub bus: Bus,
    pub history: BTreeMap<Inv, InvRecord>,
    pub(crate) rng: Rng,
    pub swarm: Swarm,
    /// In a wind-down, the operator kills what is left of every invocation of a unit that
    /// stopped, except these.
    pub(crate) operator_spares: std::collections::BTreeSet<Inv>,
    /// systemd is in a daemon-reload (`MANAGER_IS_RELOADING`): no pending change goes out.
    reloading: bool,
}

pub(crate) fn hex(inv: Inv) -> String {
    if inv == 0 {
        String::new()
    } else {
        format!("{inv:032x}")
    }
}

/// An invocation as the transcript shows it.
pub(crate) fn short(inv: Inv) -> String {
    if inv == 0 {
        "-".into()
    } else {
        hex(inv)[..6].to_owned()
    }
}

impl World {
    /// A world of a few units of random kinds, some running, from `seed`, with the seed's own
    /// swarm of fault rates and unit settings.
    pub(crate) fn new(seed: u64) -> World {
        let mut world = World::empty(seed);
        let swarm = Swarm::draw(&mut world.rng);
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
            let cfg = UnitConfig {
                oneshot,
                exec_start_pre: r.percent(30),
                remain_after_exit: rare || (oneshot && r.percent(70)) || r.percent(10),
                kill_process: rare || r.percent(swarm.kill_process),
                exec_stop: rare || r.percent(40),
                exec_stop_post: r.percent(40),
                restart: if rare { Restart::No } else { restart },
                delegate: r.percent(30),
                exec_reload: r.percent(swarm.exec_reload),
                no_sigkill: r.percent(swarm.no_sigkill),
            };
            // Transient units (systemd-run) have no unit file to alias.
            let transient = r.percent(50);
            let (name, aliases) = if transient {
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
                    && matches!(world.units[i].state, SvcState::StartPre | SvcState::Start)
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

    /// A world with no units yet, for tests that build their own.
    pub(crate) fn empty(seed: u64) -> World {
        World {
            now_us: 1_000_000,
            units: Vec::new(),
            kernel: Kernel::new(),
            bus: Bus::new(),
            history: BTreeMap::new(),
            rng: Rng::new(seed),
            reloading: false,
            swarm: Swarm::default(),
            operator_spares: Default::default(),
        }
    }

    /// Adds a loaded, inactive unit and returns its index.
    pub(crate) fn add_unit(&mut self, name: &str, aliases: Vec<String>, cfg: UnitConfig) -> usize {
        self.units.push(Unit {
            cgroup: format!("/app.slice/{name}"),
            cgroup_known: false,
            name: name.to_owned(),
            aliases,
            cfg,
            loaded: true,
            state: SvcState::Dead,
            invocation: 0,
            last_invocation: 0,
            main_pid: None,
            control_pid: None,
            job: None,
            stopping_by_job: false,
            result: "success",
            exec_main_code: 0,
            exec_main_status: 0,
            inactive_enter_us: 0,
            inactive_exit_us: 0,
            dirty: false,
            new_sent: true,
        });
        self.units.len() - 1
    }

    pub(crate) fn advance(&mut self, us: u64) {
        self.now_us += us;
    }

    /// The unit a name (or an alias) stands for, loaded or not.
    pub(crate) fn resolve(&self, name: &str) -> Option<usize> {
        self.units
            .iter()
            .position(|u| u.name == name || u.aliases.iter().any(|a| a == name))
    }

    /// The live processes started under `inv`.
    pub(crate) fn procs_of(&self, inv: Inv) -> Vec<Pid> {
        let procs = self.kernel.procs.values();
        procs
            .filter(|p| p.invocation == inv)
            .map(|p| p.pid)
            .collect()
    }

    /// Whether systemd may still start a process under `inv` (ExecStop=, ExecStopPost=, a
    /// main process of a starting unit...).
    pub(crate) fn may_start_under(&self, inv: Inv) -> bool {
        inv != 0
            && self
                .units
                .iter()
                .any(|u| u.loaded && u.invocation == inv && u.state.may_spawn(&u.cfg))
    }

    /// Every process of `inv` is gone and none can come.
    pub(crate) fn over(&self, inv: Inv) -> bool {
        self.procs_of(inv).is_empty() && !self.may_start_under(inv)
    }

    /// The invocation a unit is running (not yet inactive or failed), if any.
    pub(crate) fn running_invocation(&self, u: usize) -> Option<Inv> {
        let unit = &self.units[u];
        (unit.loaded && unit.invocation != 0 && unit.state.running()).then_some(unit.invocation)
    }

    fn gap(&mut self) -> u32 {
        if self.rng.percent(30) {
            self.rng.below(5) as u32
        } else {
            0
        }
    }

    fn emit(&mut self, signal: SystemdSignal) {
        self.emit_about(signal, 0);
    }

    /// Emits `signal`, which names invocation `inv` (0: none).
    fn emit_about(&mut self, signal: SystemdSignal, inv: Inv) {
        let gap = self.gap();
        if self.bus.lose_percent > 0 && self.rng.percent(self.bus.lose_percent) {
            self.bus.emit_lost(gap);
            return;
        }
        let over = if self.ended(inv) { inv } else { 0 };
        self.bus.emit(signal, gap, over);
    }

    /// The invocations of the same unit that started after `inv`, in order.
    pub(crate) fn later(&self, inv: Inv) -> Vec<Inv> {
        let mut out = Vec::new();
        let mut at = inv;
        while let Some(next) = self.history.get(&at).and_then(|r| r.next) {
            out.push(next);
            at = next;
        }
        out
    }

    /// Whether invocation `inv` has ended in the world.
    pub(crate) fn ended(&self, inv: Inv) -> bool {
        self.history.get(&inv).is_some_and(|r| r.ended)
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

    /// `bus_unit_send_pending_change_signal`: sends the unit's queued change now, unless it
    /// was never announced and `including_new` is false, or systemd is reloading.
    pub(crate) fn send_pending(&mut self, u: usize, including_new: bool) {
        let unit = &self.units[u];
        if !unit.dirty || !unit.loaded || (!unit.new_sent && !including_new) || self.reloading {
            return;
        }
        self.send_change(u);
    }

    /// `bus_unit_send_change_signal`: a unit not announced yet gets `UnitNew` alone
    /// (`send_new_signal`); later ones PropertiesChanged of the Service interface, then of the
    /// Unit interface (`send_changed_signal`), each with every property marked emits-change.
    fn send_change(&mut self, u: usize) {
        self.units[u].dirty = false;
        let unit = &self.units[u];
        let name = unit.name.clone();
        if !unit.new_sent {
            self.units[u].new_sent = true;
            self.emit(SystemdSignal::UnitNew { unit: name });
            return;
        }
        let path = unit_path(&name);
        let service = UnitChange {
            result: Some(unit.result.to_owned()),
            exec_main_code: Some(unit.exec_main_code),
            exec_main_status: Some(unit.exec_main_status),
            main_pid: Some(unit.main_pid.unwrap_or(0)),
            control_pid: Some(unit.control_pid.unwrap_or(0)),
            ..UnitChange::default()
        };
        let change = self.unit_change(u);
        let inv = unit.invocation;
        self.emit(SystemdSignal::UnitChanged {
            path: path.clone(),
            change: service,
        });
        self.emit_about(SystemdSignal::UnitChanged { path, change }, inv);
    }

    /// The end of systemd's loop turn (`manager_dispatch_dbus_queue`): every unit still queued
    /// sends its change.
    pub(crate) fn flush(&mut self) {
        for u in 0..self.units.len() {
            let unit = &self.units[u];
            if unit.dirty && unit.loaded {
                self.send_change(u);
            }
        }
    }

    fn unit_change(&self, u: usize) -> UnitChange {
        let unit = &self.units[u];
        UnitChange {
            active_state: Some(unit.state.active_state().to_owned()),
            sub_state: Some(unit.state.sub_state().to_owned()),
            invocation: Some(hex(unit.invocation)),
            inactive_exit_us: Some(unit.inactive_exit_us),
            ..UnitChange::default()
        }
    }

    /// What systemd answers a read of `name` with, now.
    pub(crate) fn snapshot(&mut self, name: &str) -> Snapshot {
        let gap = self.gap();
        let serial = self.bus.next_serial(gap);
        let Some(u) = self.resolve(name).filter(|u| self.units[*u].loaded) else {
            return Snapshot {
                serial,
                loaded: false,
                id: name.to_owned(),
                active_state: "inactive".into(),
                sub_state: "dead".into(),
                invocation: String::new(),
                control_group: String::new(),
                result: String::new(),
                exec_main_code: 0,
                exec_main_status: 0,
                inactive_enter_us: 0,
                inactive_exit_us: 0,
                main_pid: 0,
                control_pid: 0,
                ended: false,
            };
        };
        let unit = &self.units[u];
        Snapshot {
            serial,
            loaded: true,
            id: unit.name.clone(),
            active_state: unit.state.active_state().into(),
            sub_state: unit.state.sub_state().into(),
            invocation: hex(unit.invocation),
            // The path systemd knows (`u->cgroup_path`): forgotten once pruned empty.
            control_group: if unit.cgroup_known {
                unit.cgroup.clone()
            } else {
                String::new()
            },
            result: unit.result.into(),
            exec_main_code: unit.exec_main_code,
            exec_main_status: unit.exec_main_status,
            inactive_enter_us: unit.inactive_enter_us,
            inactive_exit_us: unit.inactive_exit_us,
            main_pid: unit.main_pid.unwrap_or(0),
            control_pid: unit.control_pid.unwrap_or(0),
            ended: self.ended(unit.invocation),
        }
    }

    /// The actions possible now, with their weights; `chaos` allows faults and outsiders.
    pub(crate) fn candidates(&self, chaos: bool) -> Vec<(u32, Action)> {
        let mut out = Vec::new();
        let mut add = |w: u32, a: Action| out.push((w, a));
        for (u, unit) in self.units.iter().enumerate() {
            if self.can_progress(u) {
                add(12, Action::Progress(u));
            }
            if !chaos {
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
            if let Some(control) = unit.control_pid {
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
            if !unit.state.running() || !unit.loaded {
                add(4, Action::Start(u));
            }
            if unit.loaded && unit.state.running() {
                add(2, Action::Stop(u));
                add(2, Action::Restart(u));
            }
            if unit.loaded && unit.state == SvcState::Failed {
                add(2, Action::ResetFailed(u));
            }
            if self.collectable(u) {
                add(4, Action::Gc(u));
            }
        }
        if chaos {
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
        if chaos {
            if self.bus.systemd_on {
                add(1, Action::Reload);
                add(1, Action::Reexec);
                add(1, Action::BusDown);
            }
            add(1, Action::Overflow);
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
    pub(crate) fn random_step(&mut self, chaos: bool) -> Option<String> {
        let candidates = self.candidates(chaos);
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
                    SvcState::StartPre
                        | SvcState::Start
                        | SvcState::Stop
                        | SvcState::StopSigterm
                        | SvcState::StopPost
                        | SvcState::FinalSigterm
                        | SvcState::AutoRestart
                        | SvcState::Reload
                )
                || (!unit.state.running()
                    && unit.cgroup_known
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
            Action::Gc(u) => self.gc(u),
            Action::Reload => self.reload(false),
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
                    let mut burst = 1 + self.rng.below(kind.parts() - call.parts.len());
                    let mut unloaded = false;
                    while burst > 0 && !unloaded {
                        let part = self.snapshot(&call.unit);
                        unloaded = kind.get_unit && call.parts.is_empty() && !part.loaded;
                        call.parts.push(part);
                        burst -= 1;
                    }
                    if !unloaded && call.parts.len() < kind.parts() {
                        // The driver sends the next message once this one is answered.
                        done.push(format!(
                            "Read {} #{} ({} of {})",
                            call.unit,
                            call.id,
                            call.parts.len(),
                            kind.parts()
                        ));
                        self.bus.calls.push_back(call);
                        continue;
                    }
                    Answer::Read(Ok(std::mem::take(&mut call.parts)))
                }
                (CallKind::Stop, None) => match self.resolve(&call.unit) {
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
}

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
use super::service::{Job, SvcState, Unit, UnitConfig};
use crate::systemd::signal::{SystemdSignal, UnitChange, unit_path};

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
    /// A world of a few units of random kinds, some running, from `seed`.
    pub(crate) fn new(seed: u64) -> World {
        let mut world = World::empty(seed);
        let n = 2 + world.rng.below(4);
        for i in 0..n {
            let r = &mut world.rng;
            let oneshot = r.percent(25);
            let cfg = UnitConfig {
                oneshot,
                exec_start_pre: r.percent(30),
                remain_after_exit: (oneshot && r.percent(70)) || r.percent(10),
                kill_process: r.percent(35),
                exec_stop: r.percent(40),
                exec_stop_post: r.percent(40),
                restart: r.percent(35),
                delegate: r.percent(30),
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
            if world.rng.percent(70) {
                world.start(i);
                while !oneshot
                    && matches!(world.units[i].state, SvcState::StartPre | SvcState::Start)
                {
                    world.progress(i);
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
        }
    }

    /// Adds a loaded, inactive unit and returns its index.
    pub(crate) fn add_unit(&mut self, name: &str, aliases: Vec<String>, cfg: UnitConfig) -> usize {
        self.units.push(Unit {
            cgroup: format!("/app.slice/{name}"),
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
        let gap = self.gap();
        self.bus.emit(signal, gap);
    }

    /// The end of systemd's loop turn: one signal per interface of every changed unit.
    pub(crate) fn flush(&mut self) {
        for u in 0..self.units.len() {
            let unit = &self.units[u];
            if !unit.dirty || !unit.loaded {
                continue;
            }
            let name = unit.name.clone();
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
            if !self.units[u].new_sent {
                self.units[u].new_sent = true;
                self.emit(SystemdSignal::UnitNew { unit: name });
            }
            self.emit(SystemdSignal::UnitChanged {
                path: path.clone(),
                change: service,
            });
            self.emit(SystemdSignal::UnitChanged { path, change });
            self.units[u].dirty = false;
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
            // systemd forgets the path once it removed the cgroup.
            control_group: if self.kernel.exists(&unit.cgroup) {
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
                )
                || (!unit.state.running()
                    && self.kernel.exists(&unit.cgroup)
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
                let unit = &mut self.units[u];
                unit.state = SvcState::Dead;
                unit.result = "success";
                unit.dirty = true;
                format!("{}: reset-failed", unit.name)
            }
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

    fn gc(&mut self, u: usize) -> String {
        self.flush();
        let cgroup = self.units[u].cgroup.clone();
        self.kernel.rmdir(&cgroup);
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

    /// daemon-reload, or daemon-reexec (which ends with systemd leaving the bus).
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
        for &u in &loaded {
            self.units[u].new_sent = false;
            self.units[u].dirty = true;
        }
        self.flush();
        self.emit(SystemdSignal::Reloading(false));
        format!("daemon-reload: {} units", loaded.len())
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
            let answer = match call.kind {
                CallKind::Read(kind) => {
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
                CallKind::Stop => match self.resolve(&call.unit) {
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
                if self.kernel.kill_all(&cgroup) > 0 {
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

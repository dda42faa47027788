//! The world the agent lives in: systemd's units (`unit.rs`) and what became of each invocation,
//! over the kernel and the bus models; the signals and read answers systemd sends about its
//! units, and what the oracle asks of the world. A unit is moved on by its state machine
//! (`service.rs`); what the world does in one step is `step.rs`.
//!
//! A unit follows systemd's service state machine closely enough to produce every sequence of
//! states the agent can see: activating, active/running, active/exited (RemainAfterExit),
//! deactivating through ExecStop= and ExecStopPost= (under the invocation being stopped),
//! inactive or failed (the InvocationID stays), auto-restart (through failed/inactive, then a
//! new invocation), garbage collection (unloaded: no invocation, GetUnit says NoSuchUnit).
//! The PropertiesChanged signals of every unit that changed go out at the end of systemd's loop
//! turn (`flush`), so what happened inside one turn is merged. Each carries every property systemd marks emits-change, as systemd sends them: first the Service
//! interface's (Result, ExecMain*, MainPID, ControlPID), then the Unit interface's (states,
//! InvocationID, InactiveExitTimestampMonotonic).

use std::collections::BTreeMap;

use super::bus::{Bus, Snapshot};
use super::kernel::{Inv, Kernel, Pid, Role};
use super::rng::Rng;
use super::unit::{SvcState, Unit, UnitConfig};
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
    /// After the chaos phase the faults stop but the workload goes on: the platform and
    /// outsiders keep acting while every owed proof is due within the liveness bound.
    pub heals_under_load: bool,
    /// Percent of units (not oneshot) of Type=forking, and of Type=simple.
    pub forking: u32,
    pub simple: u32,
    /// Percent of units with ExecCondition=, and with ExecStartPost=.
    pub exec_condition: u32,
    pub exec_start_post: u32,
    /// Percent of processes that ignore a SIGTERM: the stop waits out TimeoutStopSec= and
    /// goes on to SIGKILL (stop-sigkill, final-sigkill), or with SendSIGKILL=no leaves them.
    pub ignore_sigterm: u32,
    /// Outsiders run `systemctl clean` on inactive units.
    pub clean: bool,
    /// Percent of units that are scopes (`systemd-run --scope`).
    pub scopes: u32,
    /// The machine suspends now and then: CLOCK_BOOTTIME, which `/proc` start times count,
    /// runs ahead of CLOCK_MONOTONIC, which InactiveExitTimestampMonotonic counts.
    pub suspends: bool,
    /// Percent of leftover counts during which a process of the unit's, listed by the census,
    /// forks and exits: before its `/proc/PID/stat` is read, or before its pidfd is opened.
    pub census_races: u32,
    /// Percent of what an ExecStop= forks that waits for the unit's next start, then forks a
    /// child and exits: the child starts after that invocation began, in the session of an
    /// ExecStop= long gone, and may be guessed as its MainPID.
    pub start_waiters: u32,
    /// Weight of the operator taking a unit's aliases away (their symlinks) or making them
    /// again, then reloading the manager: until the next reload systemd resolves them as
    /// before; after it, `GetUnit` of a removed alias answers that no such unit is loaded
    /// (`unit_file_build_name_map` builds the names at a reload, `method_get_unit` finds
    /// only loaded names).
    pub alias_changes: u32,
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
            ..Swarm::default()
        };
        // The rare combination is only worth its seeds if the platform watches late.
        swarm.late_watches |= swarm.rare_combo;
        swarm
    }

    /// Draws the knobs of the model items added after the first (from `r`, a generator of
    /// their own, so a seed with all of them off replays as it did before they existed).
    pub(crate) fn draw_later_items(&mut self, r: &mut Rng) {
        let some = |r: &mut Rng, rates: &[u32]| rates[r.below(rates.len())];
        self.forking = some(r, &[0, 0, 20, 50]);
        self.simple = some(r, &[0, 0, 30]);
        self.exec_condition = some(r, &[0, 0, 20, 50]);
        self.exec_start_post = some(r, &[0, 0, 20, 50]);
        self.ignore_sigterm = some(r, &[0, 0, 20, 60]);
        self.clean = r.percent(30);
        self.suspends = r.percent(30);
        self.scopes = some(r, &[0, 0, 20, 50]);
    }

    /// Draws the census's races (from `r`, a generator of their own: the later items' draws
    /// go on to the units' settings, which one more draw there would shift for every seed).
    pub(crate) fn draw_census_races(&mut self, r: &mut Rng) {
        self.census_races = [0, 0, 10, 30][r.below(4)];
    }

    /// Draws the waiters for a next start (from `r`, a generator of their own, as the census's
    /// races).
    pub(crate) fn draw_start_waiters(&mut self, r: &mut Rng) {
        self.start_waiters = [0, 0, 30, 80][r.below(4)];
    }

    /// Draws how often aliases are taken away and made again (from a generator of their own).
    pub(crate) fn draw_alias_changes(&mut self, r: &mut Rng) {
        self.alias_changes = [0, 0, 0, 1, 3][r.below(5)];
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
    /// When it left inactive (its InactiveExitTimestampMonotonic).
    pub began_us: u64,
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
    pub(crate) reloading: bool,
    /// Processes systemd guessed as MainPID of an invocation other than their own
    /// (`unit_search_main_pid`), with their own invocation.
    pub misguessed: std::collections::BTreeSet<(Inv, Pid)>,
    /// Draws the races of processes against the agent's census (a generator of its own: a
    /// seed with none replays as it did before they were modelled).
    pub(crate) race_rng: Rng,
    /// Draws which ExecStop= leftovers wait for the next start (a generator of its own, as
    /// `race_rng`).
    pub(crate) waiter_rng: Rng,
    /// What the last start woke (see `wake_start_waiters`), for the step's line.
    pub(crate) start_note: String,
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
            misguessed: Default::default(),
            race_rng: Rng::new(seed ^ 0x6365_6e73_7573),
            waiter_rng: Rng::new(seed ^ 0x7761_6974_6572),
            start_note: String::new(),
        }
    }

    /// Adds a loaded, inactive unit and returns its index.
    pub(crate) fn add_unit(&mut self, name: &str, aliases: Vec<String>, cfg: UnitConfig) -> usize {
        self.units.push(Unit {
            cgroup: format!("/app.slice/{name}"),
            cgroup_known: false,
            name: name.to_owned(),
            aliases,
            aliases_linked: true,
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
            fed_a_waiter: false,
        });
        self.units.len() - 1
    }

    pub(crate) fn advance(&mut self, us: u64) {
        self.now_us += us;
    }

    /// The unit a name (or an alias) stands for, loaded or not, its aliases linked or not: the
    /// oracle's and the platform's view.
    pub(crate) fn resolve(&self, name: &str) -> Option<usize> {
        self.units
            .iter()
            .position(|u| u.name == name || u.aliases.iter().any(|a| a == name))
    }

    /// The loaded unit whose current invocation is `inv` (`units_by_invocation_id`).
    pub(crate) fn running(&self, inv: Option<Inv>) -> Option<usize> {
        let inv = inv.filter(|inv| *inv != 0)?;
        (self.units.iter()).position(|u| u.loaded && u.invocation == inv)
    }

    /// The unit systemd finds by `name` (`manager_get_unit`): its own name, or an alias whose
    /// symlink was there at the last reload.
    pub(crate) fn lookup(&self, name: &str) -> Option<usize> {
        self.units.iter().position(|u| {
            u.name == name || (u.aliases_linked && u.aliases.iter().any(|a| a == name))
        })
    }

    /// The live processes started under `inv`, but for `systemctl clean`'s, which systemd
    /// forks after `inv` ended (a proof is of the workload: over stays over).
    pub(crate) fn procs_of(&self, inv: Inv) -> Vec<Pid> {
        let procs = self.kernel.procs.values();
        procs
            .filter(|p| p.invocation == inv && p.role != Role::Clean)
            .map(|p| p.pid)
            .collect()
    }

    /// Whether a `systemctl clean` process lives under `inv`.
    pub(crate) fn cleaning_under(&self, inv: Inv) -> bool {
        let mut procs = self.kernel.procs.values();
        procs.any(|p| p.invocation == inv && p.role == Role::Clean)
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

    pub(crate) fn emit(&mut self, signal: SystemdSignal) {
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

    /// Whether a process of unit `u` lives that was started under an invocation older than
    /// `inv` (neither `inv` nor one started after it).
    pub(crate) fn older_leftovers(&self, u: usize, inv: Inv) -> bool {
        let later = self.later(inv);
        let mut procs = self.kernel.procs.values();
        procs.any(|p| p.unit == u && p.invocation != inv && !later.contains(&p.invocation))
    }

    /// Whether invocation `inv` has ended in the world.
    pub(crate) fn ended(&self, inv: Inv) -> bool {
        self.history.get(&inv).is_some_and(|r| r.ended)
    }

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
        // A scope's own interface marks only Result emits-change.
        let service = if unit.cfg.scope {
            UnitChange {
                result: Some(unit.result.to_owned()),
                ..UnitChange::default()
            }
        } else {
            UnitChange {
                result: Some(unit.result.to_owned()),
                exec_main_code: Some(unit.exec_main_code),
                exec_main_status: Some(unit.exec_main_status),
                main_pid: Some(unit.main_pid.unwrap_or(0)),
                control_pid: Some(unit.control_pid.unwrap_or(0)),
                ..UnitChange::default()
            }
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
        let Some(u) = self.lookup(name).filter(|u| self.units[*u].loaded) else {
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
                unresolved: self.resolve(name).is_some() && self.lookup(name).is_none(),
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
            unresolved: false,
        }
    }
}

//! The driver of the simulated agent: what the real mio loop does for the core (carry out its
//! outputs, answer the synchronous ones at once, feed what the bus and inotify deliver), done
//! against the world instead of the machine, plus the agent's own crashes and restarts.
//!
//! Its disk is the store's files as bytes and values: the snapshot, and the journal's bytes
//! encoded and replayed by the real journal code. A save may fail before it changes anything,
//! an append may be cut short, a compaction may die between its snapshot and its new journal,
//! and a restart takes up what the real loader would make of what is there.
//!
//! Leftovers are counted as the real driver counts them: a census of the cgroup subtree as
//! `list_processes` gives it (pid, ppid, start ticks of 10 ms since boot), classified by the
//! same `earlier_processes`; each pid kept is then held, as by a pidfd, until its exit is
//! delivered (at the step it dies or later, as the loop sees a pidfd event) or the key is
//! released.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use super::bus::{Answer as BusAnswer, CallKind, Msg, NO_SUCH_UNIT, ReadKind, Snapshot};
use super::kernel::{Inv, Pid, Reading, Role, TICK_US, within};
use super::oracle::{Oracle, StopSent, StopWhy, Told, parse_inv};
use super::rng::Rng;
use super::tenant::{Request, Tenant};
use super::world::{Swarm, World};
use crate::agent::core::{
    AgentState, Answer, Core, CoreConfig, CountedLeftovers, Input, Output, StateSave, StopKind,
    UnitKey,
};
use crate::agent::journal;
use crate::cgroup::CgroupReading;
use crate::cgroup::procs::{
    ClockBasis, NextInvocation, ProcessInfo, ProcessStart, earlier_processes,
};
use crate::control::protocol::{RequestId, parse_request};
use crate::proof::StopReason;
use crate::systemd::signal::{SERVICE_INTERFACE, SystemdSignal, unit_path};
use crate::systemd::snapshot::{
    self, Attempt, InvocationAnswer, Property, PropertyAnswers, SERVICE_PROPERTIES,
    UNIT_PROPERTIES, UnitSnapshot, properties_asked,
};

/// A process of a census that forks and exits while the driver takes it.
#[derive(Clone, Copy, Debug)]
enum CensusRace {
    /// After `cgroup.procs` listed it, before its `/proc/PID/stat` was read.
    BeforeStat(Pid),
    /// After the census, before the pidfd that would hold it was opened.
    BeforePidfd(Pid),
}

/// What a call in flight is for.
#[derive(Clone, Copy, Debug)]
enum CallFor {
    /// An attempt of the driver's read of a unit (see `read_again`), and the watch's
    /// invocation it asks the unit running of when none is loaded by the name, if any.
    Read(Attempt, Option<Inv>),
    Stop(StopKind),
}

/// What one simulated run is made of.
pub(crate) struct Sim {
    pub rng: Rng,
    pub world: World,
    pub core: Option<Core>,
    /// The state directory: what a restart takes up.
    disk: Disk,
    base: Instant,
    pub oracle: Oracle,
    pub tenant: Tenant,
    /// One line per thing that happened, when a transcript is wanted.
    pub trace: Option<Vec<String>>,
    /// Calls in flight: the key they are for, and the stop's kind.
    calls: BTreeMap<u64, (UnitKey, CallFor)>,
    /// The cgroup each key's inotify watch is on.
    watches: BTreeMap<UnitKey, String>,
    /// The leftovers each key holds a pidfd of, until their exit is delivered.
    leftovers: BTreeMap<UnitKey, BTreeSet<(Pid, u64)>>,
    /// Each invocation a read of which found no loaded unit by its watch's name, an alias
    /// systemd no longer resolved, and no unit running it: the oracle judges its proof as a
    /// documented limit, under any name (a proof is the invocation's, and every watch of it
    /// takes it).
    blind: BTreeSet<Inv>,
    /// The client's name for each key's unit, from its first read on.
    key_names: BTreeMap<UnitKey, String>,
    /// The name each key's last read went by: systemd's own name once a read found it.
    read_names: BTreeMap<UnitKey, String>,
    /// Each key's invocation as the agent holds it: asked for, restored, or adopted from the
    /// first read (`None` until that read).
    key_invs: BTreeMap<UnitKey, Option<Inv>>,
    /// The watch request being handed in: a new key read now is for it (name, invocation).
    asking: Option<(String, Option<Inv>)>,
    /// The state the running agent was started from.
    restored: AgentState,
    /// The last watch-creating request of each name in this life of the agent.
    asked_names: BTreeMap<String, Option<Inv>>,
    /// Requests the agent answered with an error during the request being handed in.
    refused: BTreeSet<u64>,
    /// The driver has fed BusUp since the last BusLost.
    pub connected: bool,
    /// Invocations of each unit the agent has been told of (in a signal or a read).
    seen: BTreeMap<usize, BTreeSet<Inv>>,
    /// Invocations of each unit the agent has been told are over: a message naming them sent
    /// after they ended in the world.
    told_over: BTreeMap<usize, BTreeSet<Inv>>,
    /// What each watch (unit, its invocation) has been told in this life: the sessions and
    /// the invocations an agent can know to be another invocation's, or after its own.
    pub told: BTreeMap<(usize, Inv), Told>,
    /// The pids of each unit's last Service change that no Unit change followed yet.
    unplaced_roots: BTreeMap<usize, [Option<u32>; 2]>,
    /// The serial of the first read answered for each watch (unit, its invocation) in this
    /// life that put it under the unit's own name: what the watch is told in an older message
    /// is of no invocation it can place before or after its own.
    read_units: BTreeMap<(usize, Inv), u32>,
    /// The watch (unit, invocation) each key's first read placed in `read_units`: one made
    /// without an invocation, refused at that read, is dropped before the core tells what it
    /// adopted, and what it was told must go with it.
    read_keys: BTreeMap<UnitKey, (usize, Inv)>,
    /// Keys made with an alias whose read found the unit under its own name in this life: the
    /// core follows the name at that read and adopts no invocation from it.
    followed_aliases: BTreeSet<UnitKey>,
    /// Keys whose watch the core dropped in this life: a read answered after is no first read
    /// of any watch.
    dropped_keys: BTreeSet<UnitKey>,
    /// Keys that sent a stop of their own invocation (requested) in this life of the agent.
    stopped_ours: BTreeSet<UnitKey>,
    /// Outputs of the drain under way, for the launch-file rule.
    drained: Vec<Output>,
    /// Whether the agent may die at a save (a failed save, or a SIGKILL right after one).
    pub deaths_at_saves: bool,
    /// The faults have stopped (the healing phase): every read of the kernel answers and
    /// every inotify watch is added.
    pub healed: bool,
    /// The agent dies at the save just carried out (before or after it was durable): nothing
    /// after that save is carried out.
    dies_at_save: bool,
    pub restarts: u32,
    /// Reads the driver asked again: the unit began another invocation while read property
    /// by property.
    pub reads_asked_again: u32,
    /// Leftover counts answered, and how many of them held a process of the invocation the
    /// unit runs now (which only delays a proof).
    pub counts: u32,
    pub counts_holding_current: u32,
}

/// The state directory as the store leaves it.
#[derive(Default)]
struct Disk {
    /// The snapshot file.
    snapshot: AgentState,
    /// The journal file's bytes.
    journal: Vec<u8>,
    /// The number of the journal's next change set.
    next_seq: u64,
}

impl Disk {
    /// What the loader makes of the files.
    fn load(&self) -> AgentState {
        let mut state = self.snapshot.clone();
        if !self.journal.is_empty()
            && let Err(reason) = journal::replay(&mut state, &self.journal)
        {
            panic!("the store's own files do not load: {reason}");
        }
        state
    }
}

fn config(base: Instant, swarm: &Swarm) -> CoreConfig {
    CoreConfig {
        retain_proven: 16,
        retain_for: Duration::from_secs(3600),
        // No safety net where no signal is lost: every proof must come from events, as the
        // liveness rule demands. Where the bus loses signals, the periodic relist is what
        // keeps liveness, within the same bound.
        resync_interval: (swarm.signal_loss > 0).then_some(Duration::from_secs(5)),
        // Usually large enough that a new watch's first read goes out with its request; some
        // seeds read a unit or three at a time.
        max_reads_in_flight: swarm.max_reads_in_flight,
        boot_id: Some("boot-1".into()),
        clock_anchor: (base, 0),
    }
}

impl Sim {
    pub(crate) fn new(seed: u64, traced: bool) -> Sim {
        let mut rng = Rng::new(seed);
        let world = World::new(rng.next_u64());
        let base = Instant::now();
        let mut sim = Sim {
            rng,
            world,
            core: None,
            disk: Disk::default(),
            base,
            oracle: Oracle::default(),
            tenant: Tenant::default(),
            trace: traced.then(Vec::new),
            calls: BTreeMap::new(),
            watches: BTreeMap::new(),
            leftovers: BTreeMap::new(),
            key_names: BTreeMap::new(),
            read_names: BTreeMap::new(),
            blind: BTreeSet::new(),
            key_invs: BTreeMap::new(),
            asking: None,
            restored: AgentState::default(),
            asked_names: BTreeMap::new(),
            refused: BTreeSet::new(),
            connected: false,
            seen: BTreeMap::new(),
            told_over: BTreeMap::new(),
            told: BTreeMap::new(),
            read_units: BTreeMap::new(),
            read_keys: BTreeMap::new(),
            followed_aliases: BTreeSet::new(),
            dropped_keys: BTreeSet::new(),
            unplaced_roots: BTreeMap::new(),
            stopped_ours: BTreeSet::new(),
            drained: Vec::new(),
            deaths_at_saves: true,
            healed: false,
            dies_at_save: false,
            restarts: 0,
            reads_asked_again: 0,
            counts: 0,
            counts_holding_current: 0,
        };
        sim.start_agent();
        sim
    }

    pub(crate) fn now(&self) -> Instant {
        self.base + Duration::from_micros(self.world.now_us)
    }

    pub(crate) fn log(&mut self, line: impl FnOnce() -> String) {
        if let Some(trace) = &mut self.trace {
            trace.push(line());
        }
    }

    /// The agent starts (again) from its last saved state, connects and subscribes.
    pub(crate) fn start_agent(&mut self) {
        let now = self.now();
        self.restored = self.disk.load();
        self.asked_names.clear();
        let core = Core::new(
            config(self.base, &self.world.swarm),
            self.restored.clone(),
            now,
        );
        self.core = Some(core);
        self.log(|| "agent starts from its saved state".into());
        self.drain();
        self.subscribe();
        self.connect();
        if let Some(core) = &mut self.core {
            core.save_snapshot(now);
        }
        self.drain();
    }

    /// A new connection of the platform, subscribed to proofs.
    fn subscribe(&mut self) {
        let request = self.tenant.subscribe();
        self.request(request);
    }

    /// The platform does one thing.
    pub(crate) fn tenant_step(&mut self) {
        let request = self
            .tenant
            .act(&mut self.rng, &self.world, &mut self.oracle);
        self.request(request);
    }

    /// Hands a request of the platform to the agent: a key read for the first time meanwhile
    /// is for the watch it asks for.
    fn request(&mut self, request: Request) {
        let Request { id, client, json } = request;
        if self.core.is_none() {
            // No agent listens: the platform's connect fails, and nothing is asked.
            self.tenant.not_sent(id);
            return;
        }
        let parsed = parse_request(json.to_string().as_bytes()).expect("a valid request");
        let unit = json["unit"].as_str().map(str::to_owned);
        // An unwatched unit's next watch is a new one: what was told to the one before is not
        // told to it.
        if json["cmd"] == "unwatch"
            && let Some(u) = unit.as_deref().and_then(|name| self.world.resolve(name))
        {
            self.read_units.retain(|(of, _), _| *of != u);
            self.read_keys.retain(|_, (of, _)| *of != u);
            self.told.retain(|(of, _), _| *of != u);
        }
        let inv = json["invocation"].as_str().map(parse_inv);
        self.asking = unit.clone().map(|u| (u, inv));
        self.input(Input::Request {
            client,
            request: parsed,
        });
        self.asking = None;
        // A request refused at once (say, a watch with other options) made no watch: the key
        // read later (after a reconnection) under its name is the existing one.
        if let Some(unit) = unit
            && !std::mem::take(&mut self.refused).contains(&id)
        {
            self.asked_names.insert(unit, inv);
        }
    }

    /// SIGKILL: everything in flight is lost; only the saved state survives.
    pub(crate) fn kill_agent(&mut self) {
        self.core = None;
        self.restarts += 1;
        self.world.bus.disconnect_agent();
        self.world.kernel.drop_watches();
        self.calls.clear();
        self.watches.clear();
        self.leftovers.clear();
        self.key_names.clear();
        self.read_names.clear();
        self.key_invs.clear();
        self.seen.clear();
        self.told_over.clear();
        self.told.clear();
        self.read_units.clear();
        self.read_keys.clear();
        self.followed_aliases.clear();
        self.dropped_keys.clear();
        self.unplaced_roots.clear();
        self.stopped_ours.clear();
        self.connected = false;
        self.tenant.agent_died();
        self.log(|| "agent killed".into());
    }

    /// The driver (re)connects when it can; false if the bus or systemd is away.
    pub(crate) fn connect(&mut self) -> bool {
        if self.core.is_none() || self.connected {
            return false;
        }
        if self.world.bus.connect().is_none() {
            return false;
        }
        self.connected = true;
        self.input(Input::BusUp);
        true
    }

    /// The driver's connection is gone: replies of it are dropped, stops in flight fail.
    pub(crate) fn bus_lost(&mut self, why: &str) {
        self.world.bus.disconnect_agent();
        if !self.connected {
            return;
        }
        self.connected = false;
        self.unplaced_roots.clear();
        let why = why.to_owned();
        self.log(|| format!("driver: {why}"));
        self.input(Input::BusLost);
        for (_, (key, call)) in std::mem::take(&mut self.calls) {
            if let CallFor::Stop(kind) = call {
                self.input(Input::StopDone {
                    key,
                    kind,
                    succeeded: false,
                });
            }
        }
    }

    /// Hands one input to the core and carries out everything it asks for.
    pub(crate) fn input(&mut self, input: Input) {
        let now = self.now();
        if self.core.is_none() {
            return;
        }
        self.note_offset_floor();
        if self.trace.is_some() {
            let line = format!("  core <- {}", show_input(&input));
            self.log(|| line);
        }
        if let Some(core) = &mut self.core {
            core.handle_input(input, now);
        }
        self.drain();
    }

    /// The end of a loop turn: timers, then a save if one is due, and now and then a
    /// compaction of the journal.
    pub(crate) fn end_turn(&mut self) {
        let now = self.now();
        self.note_offset_floor();
        if let Some(core) = &mut self.core {
            core.handle_timeout(now);
            core.end_turn(now);
        }
        self.drain();
        if self.core.is_some() && self.rng.percent(3) {
            if let Some(core) = &mut self.core {
                core.save_snapshot(now);
            }
            self.drain();
        }
    }

    /// What the driver notes at each turn: the time suspended so far.
    fn note_offset_floor(&mut self) {
        if let Some(core) = &mut self.core {
            core.observe_suspended(self.world.now_us, self.world.kernel.suspended_us * 1000);
        }
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.core.as_ref().and_then(Core::poll_timeout)
    }

    fn drain(&mut self) {
        while let Some(output) = self.core.as_mut().and_then(Core::poll_output) {
            self.drained.push(output.clone());
            self.carry_out(output);
            if self.dies_at_save {
                break;
            }
        }
        self.check_launch_files();
        self.drained.clear();
        if std::mem::take(&mut self.dies_at_save) {
            self.kill_agent();
        }
    }

    fn carry_out(&mut self, output: Output) {
        if self.trace.is_some() && !matches!(output, Output::Log { .. }) {
            let line = format!("  core -> {}", show_output(&output));
            self.log(|| line);
        }
        let now = self.now();
        match output {
            Output::ReadUnit {
                key, unit, ours, ..
            } => {
                if !self.key_names.contains_key(&key) {
                    let name = (self.core.as_ref())
                        .and_then(|core| core.client_name(key))
                        .map_or_else(|| unit.clone(), str::to_owned);
                    let inv = self.new_key_invocation(&name);
                    self.key_names.insert(key, name);
                    self.key_invs.insert(key, inv);
                }
                self.read_names.insert(key, unit.clone());
                // Without a connection the real driver drops the read too.
                let kind = ReadKind {
                    by_invocation: ours.as_deref().map(parse_inv),
                    ..ReadKind::of(Attempt::FIRST)
                };
                if let Some(id) = self.world.bus.send(&unit, CallKind::Read(kind)) {
                    let read = CallFor::Read(Attempt::FIRST, kind.by_invocation);
                    self.calls.insert(id, (key, read));
                }
            }
            Output::StopUnit { key, unit, kind } => self.stop_unit(key, &unit, kind),
            // The simulated clients never send `start`.
            Output::StartUnit { reply, unit } => {
                let result = Err((
                    crate::control::protocol::ErrorKind::Internal,
                    "the simulator starts no units".to_owned(),
                ));
                if let Some(core) = &mut self.core {
                    let started = Input::UnitStarted {
                        reply,
                        unit,
                        result,
                    };
                    core.handle_input(started, now);
                }
            }
            Output::AddInotifyWatches { key, cgroup } => {
                if let Some(old) = self.watches.insert(key, cgroup.clone()) {
                    self.world.kernel.unwatch(&old);
                }
                let result = if !self.healed && self.rng.percent(3) {
                    self.watches.remove(&key);
                    Err("inotify watch limit reached".to_owned())
                } else {
                    self.world.kernel.watch(&cgroup);
                    Ok(())
                };
                self.answer(Input::InotifyWatchesAdded { key, result }, now);
            }
            Output::DropKernelHandles { key } => {
                if let Some(old) = self.watches.remove(&key) {
                    self.world.kernel.unwatch(&old);
                }
                self.leftovers.remove(&key);
                // The watch is gone (refused, unwatched or proven): the next watch of its
                // invocation is a new one, told nothing this one was.
                self.dropped_keys.insert(key);
                let unit = self.key_names.get(&key).and_then(|n| self.world.resolve(n));
                let inv = self.key_invs.get(&key).copied().flatten();
                let read = self.read_keys.remove(&key);
                let of_key = unit.zip(inv).into_iter().chain(read);
                for watch in of_key.collect::<Vec<_>>() {
                    self.read_units.remove(&watch);
                    self.told.remove(&watch);
                }
            }
            Output::CountLeftovers {
                key,
                cgroup,
                next,
                held,
            } => {
                let result = self.count_leftovers(key, &cgroup, &next, &held);
                self.answer(Input::Leftovers { key, result }, now);
            }
            Output::ReadRootStart { unit, pid } => {
                // As the real driver: `/proc/PID/stat` of whatever has the pid now, if anything.
                let start_ticks = u32::try_from(pid)
                    .ok()
                    .and_then(|pid| self.world.kernel.procs.get(&pid))
                    .map(|p| p.start_boot_us / TICK_US);
                self.answer(
                    Input::RootStart {
                        unit,
                        pid,
                        start_ticks,
                    },
                    now,
                );
            }
            Output::ReadCgroup { key, cgroup } => {
                let reading = if !self.healed && self.rng.percent(2) {
                    CgroupReading::Unreadable(format!("{cgroup}: EIO"))
                } else {
                    match self.world.kernel.read(&cgroup) {
                        Reading::Populated => CgroupReading::Populated,
                        Reading::Empty => CgroupReading::Empty,
                        Reading::Gone => CgroupReading::Gone,
                    }
                };
                self.answer(Input::CgroupRead { key, reading }, now);
            }
            Output::TakeExitRecord { key, .. } => {
                self.answer(Input::ExitRecord { key, record: None }, now);
            }
            Output::RemoveLaunchFile { .. } | Output::Log { .. } => {}
            Output::Reply { to, answer } => {
                if let (Some(RequestId::Number(n)), Answer::Error(..)) = (&to.id, &answer) {
                    self.refused.extend(n.as_u64());
                }
                let world = &self.world;
                self.tenant.on_reply(world, &mut self.oracle, to, answer);
            }
            Output::Broadcast { event, .. } => {
                let u = self.world.resolve(&event.unit);
                let inv = parse_inv(&event.invocation);
                let asked = self.tenant.stop_requested(&event.unit);
                if let Some(u) = u {
                    let blind = self.blind.contains(&inv);
                    self.oracle
                        .on_proof(&self.world, u, inv, event.cause, asked, blind);
                    self.oracle.on_watch_proven(u, inv, event.cause);
                }
            }
            // The real driver stops at a save that fails, before carrying out anything after
            // it; and a SIGKILL may come right after a save, before what follows it.
            Output::Save(save) => {
                if self.deaths_at_saves && self.rng.percent(1) {
                    self.log(|| "driver: the save fails; the agent stops".into());
                    self.dies_at_save = true;
                    return;
                }
                match *save {
                    StateSave::Snapshot(mut state) => {
                        // The store names the journal after the one on disk.
                        state.journal = self.disk.snapshot.journal + 1;
                        let number = state.journal;
                        self.disk.snapshot = state;
                        if self.deaths_at_saves && self.rng.percent(1) {
                            self.log(|| "driver: killed between snapshot and journal".into());
                            self.dies_at_save = true;
                            return;
                        }
                        self.disk.journal = journal::header(number);
                        self.disk.next_seq = 1;
                    }
                    StateSave::Changes(changes) => {
                        let line = journal::line(self.disk.next_seq, &changes)
                            .expect("a change set encodes");
                        if self.deaths_at_saves && self.rng.percent(1) {
                            let cut = self.rng.below(line.len());
                            self.disk.journal.extend_from_slice(&line[..cut]);
                            self.log(|| format!("driver: killed {cut} bytes into an append"));
                            self.dies_at_save = true;
                            return;
                        }
                        self.disk.journal.extend_from_slice(&line);
                        self.disk.next_seq += 1;
                    }
                }
                self.saved_proofs();
                if self.deaths_at_saves && self.rng.percent(1) {
                    self.log(|| "driver: killed right after the save".into());
                    self.dies_at_save = true;
                }
            }
        }
    }

    /// A proof is made once it is saved, told or not: an agent killed right after the save
    /// never broadcasts it, and lists it from the saved state after its restart.
    fn saved_proofs(&mut self) {
        for record in &self.disk.load().watches {
            let Some(event) = record.proof.as_ref().and_then(|proof| proof.event().ok()) else {
                continue;
            };
            let inv = parse_inv(&event.invocation);
            let Some(u) = self.world.resolve(&event.unit) else {
                continue;
            };
            if !self.oracle.is_proven(u, inv) {
                let asked = self.tenant.stop_requested(&event.unit);
                let blind = self.blind.contains(&inv);
                self.oracle
                    .on_proof(&self.world, u, inv, event.cause, asked, blind);
            }
            self.oracle.on_watch_proven(u, inv, event.cause);
        }
    }

    /// What the real driver's `count_leftovers` does: a census of the cgroup subtree, the
    /// processes `earlier_processes` keeps, each held until it exits, in place of what was held
    /// for `key`. A listing that fails keeps what was held; a pidfd that cannot be opened drops
    /// it all.
    fn count_leftovers(
        &mut self,
        key: UnitKey,
        cgroup: &str,
        next: &NextInvocation,
        held: &[ProcessStart],
    ) -> Result<CountedLeftovers, String> {
        if !self.healed && self.rng.percent(2) {
            return Err(format!("cannot read {cgroup}/cgroup.procs: EIO"));
        }
        let mut census = census(&self.world, cgroup);
        let race = self.census_race(&census);
        let mut vanished = 0;
        if let Some(CensusRace::BeforeStat(pid)) = race {
            census.retain(|p| p.pid != pid as i32);
            vanished = 1;
            self.fork_and_exit(pid, "before its stat is read");
        }
        // The offset read now: at least what it was at any fork before.
        self.note_offset_floor();
        let basis = ClockBasis {
            clk_tck: 1_000_000 / TICK_US,
            boot_minus_mono_ns: self.world.kernel.suspended_us * 1000,
            floors: self
                .core
                .as_ref()
                .map(Core::offset_floors)
                .unwrap_or_default(),
        };
        let listed = census.iter().map(|p| p.pid).collect();
        let counted: Vec<ProcessStart> = earlier_processes(&census, next, &basis, held)
            .into_iter()
            .map(|p| ProcessStart::held_in(p, &listed))
            .collect();
        let earlier: Vec<i32> = counted.iter().map(|p| p.pid).collect();
        if self.trace.is_some() {
            let all: Vec<String> = census
                .iter()
                .map(|p| format!("{}<-{}@{}s{}", p.pid, p.ppid, p.start_ticks, p.session))
                .collect();
            let line = format!(
                "driver: census of {cgroup} [{}] for {next:?}: earlier {earlier:?}",
                all.join(" ")
            );
            self.log(|| line);
        }
        self.counts += 1;
        let current = self
            .world
            .units
            .iter()
            .find(|u| u.cgroup == cgroup)
            .map(|u| u.invocation);
        let procs = &self.world.kernel.procs;
        if earlier
            .iter()
            .any(|pid| procs.get(&(*pid as Pid)).map(|p| p.invocation) == current)
        {
            self.counts_holding_current += 1;
        }
        self.leftovers.remove(&key);
        if !self.healed && self.rng.percent(1) {
            return Err("cannot open a pidfd: EMFILE".into());
        }
        if let Some(CensusRace::BeforePidfd(pid)) = race {
            self.fork_and_exit(pid, "before its pidfd is opened");
        }
        let procs = &self.world.kernel.procs;
        let held = earlier
            .iter()
            .filter_map(|pid| procs.get(&(*pid as Pid)).map(|p| (p.pid, p.id)))
            .collect();
        self.leftovers.insert(key, held);
        let (held, exited) = counted
            .into_iter()
            .partition(|p| procs.contains_key(&(p.pid as Pid)));
        Ok(CountedLeftovers {
            held,
            exited,
            vanished,
        })
    }

    /// Whether, and how, a process of `census` that a tenant runs races the census (see
    /// [`Swarm::census_races`]).
    fn census_race(&mut self, census: &[ProcessInfo]) -> Option<CensusRace> {
        let percent = self.world.swarm.census_races;
        let rng = &mut self.world.race_rng;
        if percent == 0 || !rng.percent(percent) {
            return None;
        }
        let procs = &self.world.kernel.procs;
        let tenants: Vec<Pid> = census
            .iter()
            .map(|p| p.pid as Pid)
            .filter(|pid| procs.get(pid).is_some_and(|p| p.role == Role::Child))
            .collect();
        let pid = rng.pick(&tenants)?;
        Some(if rng.percent(50) {
            CensusRace::BeforeStat(pid)
        } else {
            CensusRace::BeforePidfd(pid)
        })
    }

    /// `pid` forks a child into its cgroup and exits, while the driver takes a census.
    fn fork_and_exit(&mut self, pid: Pid, when: &str) {
        let forked = self.world.fork(pid);
        self.world.kernel.kill(pid);
        self.log(|| format!("race: {forked}, then exits, {when}"));
    }

    /// Delivers the exit of one held leftover that died, as the pidfd's readiness.
    pub(crate) fn deliver_leftover_exit(&mut self) -> bool {
        let dead: Vec<(UnitKey, (Pid, u64))> = self
            .leftovers
            .iter()
            .flat_map(|(key, pids)| pids.iter().map(move |pid| (*key, *pid)))
            .filter(|(_, (pid, id))| !self.world.kernel.alive_id(*pid, *id))
            .collect();
        let Some((key, (pid, id))) = self.rng.pick(&dead) else {
            return false;
        };
        if let Some(pids) = self.leftovers.get_mut(&key) {
            pids.remove(&(pid, id));
        }
        self.input(Input::LeftoverExited {
            key,
            pid: pid as i32,
        });
        true
    }

    pub(crate) fn has_leftover_exits(&self) -> bool {
        let kernel = &self.world.kernel;
        self.leftovers
            .values()
            .any(|pids| pids.iter().any(|(pid, id)| !kernel.alive_id(*pid, *id)))
    }

    /// A synchronous answer: straight back to the core, before anything else.
    fn answer(&mut self, input: Input, now: Instant) {
        if self.trace.is_some() {
            let line = format!("  core <- {}", show_input(&input));
            self.log(|| line);
        }
        if let Some(core) = &mut self.core {
            core.handle_input(input, now);
        }
    }

    fn stop_unit(&mut self, key: UnitKey, unit: &str, kind: StopKind) {
        let why = match kind {
            StopKind::Proof(StopReason::Requested) => StopWhy::Requested,
            StopKind::Proof(StopReason::Foreign) => StopWhy::Foreign,
            StopKind::FinalGeneration => StopWhy::Final,
        };
        // A watch made without an invocation owns the one it adopted (from a read of the
        // unit under its own name, which for an alias is the second).
        let ours = self.key_invs.get(&key).copied().flatten().or_else(|| {
            let core = self.core.as_ref()?;
            core.adopted_invocation(key).map(parse_inv)
        });
        let of_unit = |m: &BTreeMap<usize, BTreeSet<Inv>>| {
            self.world
                .resolve(unit)
                .and_then(|u| m.get(&u))
                .cloned()
                .unwrap_or_default()
        };
        let (seen, told_over) = (of_unit(&self.seen), of_unit(&self.told_over));
        let name = self.key_names.get(&key).map_or(unit, String::as_str);
        let stop = StopSent {
            name: unit,
            ours,
            why,
            seen: &seen,
            told_over: &told_over,
            asked: self.tenant.stop_requested(name) || self.tenant.stop_requested(unit),
            ours_stopped_before: self.stopped_ours.contains(&key),
        };
        self.oracle.on_stop(&self.world, &stop);
        if why == StopWhy::Requested {
            self.stopped_ours.insert(key);
        }
        match self.world.bus.send(unit, CallKind::Stop) {
            Some(id) => {
                self.calls.insert(id, (key, CallFor::Stop(kind)));
            }
            None => {
                let now = self.now();
                self.answer(
                    Input::StopDone {
                        key,
                        kind,
                        succeeded: false,
                    },
                    now,
                );
            }
        }
    }

    /// The invocation of a key the agent reads for the first time: the one its watch request
    /// names, the one of the restored watch, or none yet (adopted at the first read).
    /// A restored proof (one whose release was cut short reads the unit again for its final
    /// stop) is of its own invocation: the core holds it as an event, not as a proof it could
    /// say it adopted, and the invocation a read names then is another's.
    fn new_key_invocation(&self, unit: &str) -> Option<Inv> {
        if let Some((name, inv)) = &self.asking
            && name == unit
        {
            return *inv;
        }
        if let Some(inv) = self.asked_names.get(unit) {
            return *inv;
        }
        // The record the core restores (`one_record_per_unit`): an unproven one if any, else
        // the last proof.
        let of_unit = || self.restored.watches.iter().filter(|w| w.unit == unit);
        of_unit()
            .find(|w| w.proof.is_none())
            .or_else(|| of_unit().next_back())
            .map(|w| parse_inv(&w.invocation))
    }

    /// A launch file goes only with its proof, which the same drain (or an earlier one) says.
    fn check_launch_files(&mut self) {
        for output in &self.drained {
            let Output::RemoveLaunchFile { path, .. } = output else {
                continue;
            };
            let path = path.display().to_string();
            let in_drain = self.drained.iter().any(|o| match o {
                Output::Broadcast { event, .. } => event.launch_file.as_deref() == Some(&path),
                _ => false,
            });
            let inv = self.tenant.launch_file_invocation(&path);
            // Or a release resumed after a restart: the saved proof that names the file was
            // judged when the agent started from it (`saved_proofs`).
            let saved_proof =
                self.restored.watches.iter().any(|w| {
                    w.proof.is_some() && w.launch_file.as_deref() == Some(Path::new(&path))
                });
            let proven =
                in_drain || saved_proof || self.tenant.launch_file_proven(&path, &self.oracle);
            self.oracle
                .on_remove_launch_file(&self.world, &path, inv, proven, self.restarts);
        }
    }

    /// Delivers the next signal (or the news that systemd left the bus).
    pub(crate) fn deliver_signal(&mut self) -> bool {
        let Some(msg) = self.world.bus.signals.pop_front() else {
            return false;
        };
        match msg {
            Msg::Signal(serial, signal, over) => {
                if let SystemdSignal::UnitChanged { path, change } = &signal
                    && let Some(inv) = &change.invocation
                    && let Some(u) = self.unit_by_path(path)
                {
                    self.seen.entry(u).or_default().insert(parse_inv(inv));
                    if over != 0 {
                        self.told_over.entry(u).or_default().insert(over);
                    }
                }
                if let SystemdSignal::UnitChanged { path, change } = &signal
                    && let Some(u) = self.unit_by_path(path)
                {
                    // A Service change is placed by the InvocationID of the Unit change that
                    // follows it: until then, nothing tells whose its pids are.
                    let pids = [change.main_pid, change.control_pid];
                    if let Some(inv) = &change.invocation {
                        let before = self.unplaced_roots.remove(&u).unwrap_or_default();
                        let began = change.inactive_exit_us.is_some()
                            && tells_a_beginning(
                                change.active_state.as_deref(),
                                change.sub_state.as_deref(),
                            );
                        let inv = parse_inv(inv);
                        self.tell(u, inv, began, before, serial);
                        self.tell(u, inv, began, pids, serial);
                    } else {
                        self.unplaced_roots.insert(u, pids);
                    }
                }
                self.input(Input::Signal { serial, signal });
            }
            Msg::SystemdLeft => self.bus_lost("systemd left the bus (NameOwnerChanged)"),
        }
        true
    }

    /// Tells the watches of unit `u` placed by message `serial` (their first read is no newer)
    /// of invocation `inv`, when it began if `began`, and its roots `pids`.
    fn tell(&mut self, u: usize, inv: Inv, began: bool, pids: [Option<u32>; 2], serial: u32) {
        let placed_for: Vec<(usize, Inv)> = self
            .read_units
            .iter()
            .filter(|((unit, _), first)| *unit == u && serial.wrapping_sub(**first) as i32 >= 0)
            .map(|(watch, _)| *watch)
            .collect();
        for watch in placed_for {
            let told = self.told.entry(watch).or_default();
            told.roots
                .extend(pids.into_iter().flatten().filter(|pid| *pid > 0));
            if began {
                told.began.insert(inv);
            }
        }
    }

    fn unit_by_path(&self, path: &str) -> Option<usize> {
        self.world
            .units
            .iter()
            .position(|u| unit_path(&u.name) == path)
    }

    /// Delivers the next reply.
    pub(crate) fn deliver_reply(&mut self) -> bool {
        let Some(reply) = self.world.bus.replies.pop_front() else {
            return false;
        };
        let Some((key, call)) = self.calls.remove(&reply.id) else {
            return true;
        };
        match (reply.answer, call) {
            (BusAnswer::Read(result), CallFor::Read(attempt, by_invocation)) => {
                let unit = self.read_names[&key].clone();
                let mut over = false;
                let mut unresolved = false;
                let result = match result.map(|parts| {
                    unresolved = parts.iter().any(|part| part.unresolved);
                    // Read at the path GetUnit answered (or the unit running ours): an attempt
                    // after this one asks there again.
                    let path_of = match parts.as_slice() {
                        [first, found, ..] if by_invocation.is_some() && !first.loaded => {
                            Some(found)
                        }
                        [first, ..] if attempt == Attempt::FIRST => Some(first),
                        _ => None,
                    };
                    if let Some(part) = path_of.filter(|part| part.loaded) {
                        self.read_names.insert(key, part.id.clone());
                    }
                    let read = driver_read(&unit, attempt, by_invocation.is_some(), &parts);
                    if let Some(read) = &read {
                        // Told only if every answer came once it was over: an answer
                        // made before may be the one the state was taken from.
                        over = parts
                            .iter()
                            .all(|p| p.ended && p.invocation == read.invocation);
                    }
                    read
                }) {
                    Ok(None) => {
                        self.read_again(key, attempt);
                        return true;
                    }
                    Ok(Some(snapshot)) => Ok(snapshot),
                    Err(e) => Err(e),
                };
                // Answered when systemd no longer resolved the alias, and (asked) found no unit
                // running ours.
                if let Ok(snapshot) = &result
                    && !snapshot.loaded
                    && unresolved
                    && let Some(ours) = by_invocation
                {
                    self.blind.insert(ours);
                }
                if let Ok(snapshot) = &result
                    && let Some(u) = self.world.resolve(&snapshot.id)
                {
                    let inv = parse_inv(&snapshot.invocation);
                    self.seen.entry(u).or_default().insert(inv);
                    let own_name = unit == self.world.units[u].name;
                    let follows_alias =
                        snapshot.loaded && !own_name && self.followed_aliases.insert(key);
                    // A watch made without an invocation adopts the one its first read under
                    // the unit's own name says (for an alias, the second).
                    let adopted = self
                        .core
                        .as_ref()
                        .and_then(|core| core.adopted_invocation(key).map(parse_inv));
                    let ours = match self.key_invs.get(&key).copied().flatten().or(adopted) {
                        Some(ours) => Some(ours),
                        None if follows_alias => None,
                        None => Some(inv),
                    };
                    // A watch hears the unit's signals under its own name only: one made with
                    // an alias, once a read found the unit loaded under that name.
                    if let Some(ours) = ours
                        && (snapshot.loaded || own_name)
                        && !self.dropped_keys.contains(&key)
                    {
                        self.read_units.entry((u, ours)).or_insert(snapshot.serial);
                        self.read_keys.entry(key).or_insert((u, ours));
                    }
                    let pids = snapshot.current.pids;
                    let roots = pids.map_or([None; 2], |((main, control), _)| {
                        [Some(main), Some(control)]
                    });
                    let began = snapshot.current.inactive_exit_us.is_some()
                        && tells_a_beginning(
                            Some(&snapshot.active_state),
                            Some(&snapshot.sub_state),
                        );
                    self.tell(u, inv, began, roots, snapshot.serial);
                    if over {
                        self.told_over.entry(u).or_default().insert(inv);
                    }
                }
                self.input(Input::UnitRead { key, result });
            }
            (BusAnswer::Stop(result), CallFor::Stop(kind)) => {
                // The real driver counts NoSuchUnit as stopped.
                let succeeded = match result {
                    Ok(()) => true,
                    Err(e) => e == NO_SUCH_UNIT,
                };
                self.input(Input::StopDone {
                    key,
                    kind,
                    succeeded,
                });
            }
            _ => {}
        }
        true
    }

    /// The unit began another invocation while it was read property by property: the driver
    /// asks again at the path it has, and after the last attempt with GetAll.
    fn read_again(&mut self, key: UnitKey, attempt: Attempt) {
        let Some(unit) = self.read_names.get(&key).cloned() else {
            return;
        };
        let attempt = attempt.next();
        self.reads_asked_again += 1;
        self.log(|| format!("driver: {unit} began another invocation while read; again"));
        if let Some(id) = self
            .world
            .bus
            .send(&unit, CallKind::Read(ReadKind::of(attempt)))
        {
            self.calls.insert(id, (key, CallFor::Read(attempt, None)));
        }
    }

    /// A call times out: the agent hears an error, though systemd may still carry it out.
    pub(crate) fn time_out_call(&mut self) -> bool {
        let outstanding = self.world.bus.outstanding();
        let Some(id) = self.rng.pick(&outstanding) else {
            return false;
        };
        self.world.bus.abandon(id);
        let Some((key, call)) = self.calls.remove(&id) else {
            return true;
        };
        self.log(|| format!("driver: call #{id} timed out"));
        match call {
            CallFor::Stop(kind) => self.input(Input::StopDone {
                key,
                kind,
                succeeded: false,
            }),
            CallFor::Read(..) => self.input(Input::UnitRead {
                key,
                result: Err("Method call timed out".into()),
            }),
        }
        true
    }

    /// Delivers what inotify has: a lost watch, an overflow, or one merged notification.
    pub(crate) fn deliver_cgroup_notice(&mut self) -> bool {
        let lost = self.world.kernel.take_lost();
        if !lost.is_empty() {
            for path in lost {
                for key in self.keys_watching(&path) {
                    self.watches.remove(&key);
                    self.input(Input::InotifyWatchLost { key });
                }
            }
            return true;
        }
        if self.world.kernel.take_overflow() {
            self.input(Input::CgroupOverflow);
            return true;
        }
        let pending = self.world.kernel.pending_paths();
        let Some(i) = (!pending.is_empty()).then(|| self.rng.below(pending.len())) else {
            return false;
        };
        let path = &pending[i];
        self.world.kernel.take_pending(path);
        for key in self.keys_watching(path) {
            self.input(Input::CgroupChanged { key });
        }
        true
    }

    fn keys_watching(&self, path: &str) -> Vec<UnitKey> {
        let watches = self.watches.iter();
        watches
            .filter(|(_, p)| p.as_str() == path)
            .map(|(k, _)| *k)
            .collect()
    }

    /// The world told the driver nothing, but its connection is gone (the bus daemon died).
    pub(crate) fn notice_bus_gone(&mut self) {
        if self.connected && self.world.bus.agent.is_none() {
            self.bus_lost("the bus connection closed");
        }
    }

    pub(crate) fn has_calls(&self) -> bool {
        !self.calls.is_empty()
    }
}

/// What `list_processes` gives for `cgroup`: every process in it and below, as `/proc` shows it
/// (start ticks since boot, on CLOCK_BOOTTIME).
pub(crate) fn census(world: &World, cgroup: &str) -> Vec<ProcessInfo> {
    let procs = world.kernel.procs.values();
    procs
        .filter(|p| within(&p.cgroup, cgroup))
        .map(|p| ProcessInfo {
            pid: p.pid as i32,
            ppid: p.ppid as i32,
            session: p.session as i32,
            start_ticks: p.start_boot_us / TICK_US,
            comm: format!("{:?}", p.role).into_bytes(),
            state: 'S',
            cgroup: p.cgroup[cgroup.len()..].trim_start_matches('/').into(),
        })
        .collect()
}

/// What the driver makes of a read's answers to `attempt` for `unit`, by the driver's own rule
/// (`systemd::snapshot`, `systemd::read::read_unit`): the snapshot, or `None` if the unit began
/// another invocation between the first and the last answer of a read property by property.
/// `by_invocation`: GetUnit finding nothing, it asked which unit runs the watch's invocation.
fn driver_read(
    unit: &str,
    attempt: Attempt,
    by_invocation: bool,
    parts: &[Snapshot],
) -> Option<UnitSnapshot> {
    let mut parts = parts.iter();
    if ReadKind::of(attempt).get_unit {
        let mut get_unit = parts.next()?;
        if !get_unit.loaded && by_invocation {
            get_unit = parts.next()?;
        }
        if !get_unit.loaded {
            return Some(snapshot::not_loaded(
                unit,
                &unit_path(unit),
                get_unit.serial,
            ));
        }
    }
    if !attempt.by_property() {
        // GetAll of the Unit interface, then of the Service interface (of another unit type,
        // Get of its ControlGroup).
        let (unit_part, second) = (parts.next()?, parts.next()?);
        let service = snapshot::cgroup_interface(&unit_part.id) == Some(SERVICE_INTERFACE);
        let second_properties: &[&str] = if service {
            &SERVICE_PROPERTIES
        } else {
            &["ControlGroup"]
        };
        let properties = std::iter::once("InvocationID")
            .chain(UNIT_PROPERTIES)
            .map(|name| property(name, unit_part))
            .chain(second_properties.iter().map(|name| property(name, second)));
        let path = unit_path(&unit_part.id);
        let read = snapshot::snapshot(
            unit,
            &path,
            unit_part.serial,
            properties,
            service.then_some(second.serial),
        );
        return Some(read);
    }
    let answer = |part: &Snapshot| InvocationAnswer {
        id: part.invocation.clone(),
        serial: part.serial,
    };
    let before = answer(parts.next()?);
    let asked = properties_asked(unit, snapshot::ReadKind::Get);
    let answered: Vec<&Snapshot> = parts.by_ref().take(asked.len()).collect();
    let after = answer(parts.next()?);
    let properties: Vec<Property> = asked
        .iter()
        .zip(&answered)
        .map(|((_, name), part)| property(name, part))
        .collect();
    // The object path GetUnit gave: the real unit's, which its `Id` names.
    let id = properties.iter().find_map(|p| match p {
        Property::Id(id) => Some(id.as_str()),
        _ => None,
    });
    let path = unit_path(id.unwrap_or(unit));
    let answers = PropertyAnswers::<std::convert::Infallible> {
        before,
        properties: properties.into_iter().map(Ok).collect(),
        after,
    };
    snapshot::by_property(unit, &path, answers).unwrap_or_else(|never| match never {})
}

/// Property `name` as systemd answered it at the moment of `part`. The simulator models only
/// the properties the driver reads.
fn property(name: &str, part: &Snapshot) -> Property {
    match name {
        "InvocationID" => Property::InvocationId(part.invocation.clone()),
        "Id" => Property::Id(part.id.clone()),
        "ActiveState" => Property::ActiveState(part.active_state.clone()),
        "SubState" => Property::SubState(part.sub_state.clone()),
        "InactiveExitTimestampMonotonic" => Property::InactiveExitUs(part.inactive_exit_us),
        "ControlGroup" => Property::ControlGroup(part.control_group.clone()),
        "Result" => Property::Result(part.result.clone()),
        "ExecMainCode" => Property::ExecMainCode(part.exec_main_code),
        "ExecMainStatus" => Property::ExecMainStatus(part.exec_main_status),
        "MainPID" => Property::MainPid(part.main_pid),
        "ControlPID" => Property::ControlPid(part.control_pid),
        other => panic!("the simulator does not model the property {other}"),
    }
}

fn short_hex(hex: &str) -> &str {
    if hex.is_empty() { "-" } else { &hex[..6] }
}

fn show_input(input: &Input) -> String {
    match input {
        Input::Signal { serial, signal } => match signal {
            SystemdSignal::UnitChanged { path, change } => {
                format!(
                    "signal #{serial} {} {}{}{}",
                    path.rsplit('/').next().unwrap_or(""),
                    change.active_state.as_deref().unwrap_or(""),
                    change
                        .sub_state
                        .as_deref()
                        .map_or(String::new(), |s| format!("/{s}")),
                    change
                        .invocation
                        .as_deref()
                        .map_or(String::new(), |i| format!(" inv {}", short_hex(i))),
                ) + &change
                    .result
                    .as_deref()
                    .map_or(String::new(), |r| format!("result {r}"))
                    + &[("main", change.main_pid), ("control", change.control_pid)]
                        .iter()
                        .filter_map(|(name, pid)| pid.map(|pid| format!(" {name} {pid}")))
                        .collect::<String>()
            }
            other => format!("signal #{serial} {other:?}"),
        },
        Input::UnitRead { key, result: Ok(s) } => format!(
            "read {key:?} #{} {} loaded={} {}/{} inv {} cgroup {:?}",
            s.serial,
            s.id,
            s.loaded,
            s.active_state,
            s.sub_state,
            short_hex(&s.invocation),
            s.control_group
        ),
        Input::Request { request, .. } => format!("request {:?} {:?}", request.id, request.command),
        other => format!("{other:?}"),
    }
}

fn show_output(output: &Output) -> String {
    match output {
        Output::Broadcast { event, .. } => format!(
            "PROOF {} inv {} {:?} stop_requested={} launch_file={:?}",
            event.unit,
            short_hex(&event.invocation),
            event.cause,
            event.stop_requested,
            event.launch_file
        ),
        Output::Save(save) => match &**save {
            StateSave::Snapshot(state) => format!(
                "save a snapshot ({} watches: {})",
                state.watches.len(),
                show_records(&state.watches)
            ),
            StateSave::Changes(changes) => format!(
                "save changes ({}; removed {:?}; generations {:?}, freed {:?})",
                show_records(&changes.watches),
                changes.removed,
                changes.generations,
                changes.generations_freed
            ),
        },
        Output::Reply { to, answer } => format!("reply {:?} {answer:?}", to.id),
        other => format!("{other:?}"),
    }
}

fn show_records(records: &[crate::agent::saved::SavedWatch]) -> String {
    records
        .iter()
        .map(|w| {
            format!(
                "{} {}{}{}",
                w.unit,
                short_hex(&w.invocation),
                if w.proof.is_some() { " proven" } else { "" },
                if w.stop_requested { " stop" } else { "" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether InactiveExitTimestamp said beside `active_state` and `sub_state` is when the
/// invocation named with it began: once it left inactive or failed, and not again after it
/// ended (`unit_notify` stamps it for a restart's wait and for `systemctl clean` too).
fn tells_a_beginning(active_state: Option<&str>, sub_state: Option<&str>) -> bool {
    !matches!(
        active_state,
        None | Some("inactive" | "failed" | "maintenance")
    ) && !matches!(sub_state, Some("auto-restart" | "auto-restart-queued"))
}

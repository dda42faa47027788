//! The agent: one single-threaded mio loop that owns the drivers and the units.
//!
//! Everything the agent hears is a hint or a fact fed to a unit's [`UnitProof`]: a systemd
//! signal or read (ordered by serial, see [`facts`]), an inotify notification (a hint to read
//! the cgroup, which is the fact), a request on the control socket. This loop is the only
//! place that reads the clock, and it sleeps in `epoll_wait` until the earliest of: a source is
//! ready, a unit's retry timer, a waiter's deadline, the runtime's own timers.

mod bus;
pub mod event;
pub mod facts;
mod persist;
#[cfg(test)]
mod sim;
pub mod state;
pub mod waiters;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use zbus::runtime::traits::TaskHandle;
use zbus::{Connection, Message};

use crate::cgroup::{CgroupError, CgroupReading, CgroupWatcher, Notice, cgroup2_mount};
use crate::control::ControlError;
use crate::control::protocol::{
    Command, ErrorKind, Request, RequestId, Response, UnwatchArgs, WaitArgs, WatchArgs, event_line,
};
use crate::control::server::{ClientId, ControlServer, ServerEvent, ServerOptions};
use crate::exit::record::SanitizedRecord;
use crate::exit::write::default_record_name;
use crate::exit::{read_record, remove_beneath};
use crate::proof::release::{Release, ReleaseInput, ReleaseOutput};
use crate::proof::{Cause, Input, Output, Phase, Proof, StopReason, UnitProof};
use crate::service::Notifier;
use crate::systemd::ConnectError;
use crate::systemd::manager::{self, ManagerError, Subscription, UnitSnapshot};
use crate::systemd::runtime::MioRuntime;
use crate::systemd::signal::{self, SystemdSignal, unit_path};
use crate::unit_name::UnitName;
use event::{EventKind, ProofEvent, WatchView, systemd_record, terminal_wording};
use facts::UnitFacts;
use state::{AgentState, StateError, StateFile};
use waiters::Waiters;

/// Reads of units in flight at once. A burst of watches is read a window at a time, which
/// bounds the replies held in memory (a service's properties are several KiB).
const MAX_READS_IN_FLIGHT: usize = 32;

const WAKER: Token = Token(0);
const INOTIFY: Token = Token(1);
const SIGNALS: Token = Token(2);
const CONTROL_TOKENS: std::ops::Range<usize> = 16..(1 << 20);
const RUNTIME_TOKENS: std::ops::Range<usize> = (1 << 20)..(1 << 30);

pub use crate::systemd::Bus;

/// How the agent runs.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub bus: Bus,
    pub socket: PathBuf,
    pub server: ServerOptions,
    /// The deadline of every D-Bus call, StopUnit included.
    pub method_timeout: Duration,
    /// Where the watch set is kept across restarts (`None`: in memory only).
    pub state_dir: Option<PathBuf>,
    /// How often every unit is read again as a safety net (`None`: never). Proofs are made from
    /// events; this only catches what an event could have missed.
    pub resync_interval: Option<Duration>,
    /// How many proven units stay listed at most; the oldest leave first.
    pub retain_proven: usize,
    /// How long a proven unit stays listed at most.
    pub retain_for: Duration,
}

impl AgentConfig {
    /// The defaults for `bus`, with the socket at `socket`.
    pub fn new(bus: Bus, socket: PathBuf) -> Self {
        AgentConfig {
            bus,
            socket,
            server: ServerOptions::default(),
            method_timeout: Duration::from_secs(10),
            state_dir: None,
            resync_interval: Some(Duration::from_secs(300)),
            retain_proven: 1024,
            retain_for: Duration::from_secs(3600),
        }
    }
}

/// Why the agent could not start or had to stop.
#[derive(Debug)]
pub enum AgentError {
    Io {
        what: &'static str,
        source: io::Error,
    },
    Connect(crate::systemd::ConnectError),
    Cgroup(CgroupError),
    Control(ControlError),
    State(StateError),
}

impl fmt::Display for AgentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AgentError::Io { what, source } => write!(f, "{what}: {source}"),
            AgentError::Connect(e) => write!(f, "{e}"),
            AgentError::Cgroup(e) => write!(f, "{e}"),
            AgentError::Control(e) => write!(f, "{e}"),
            AgentError::State(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for AgentError {}

fn io_error(what: &'static str) -> impl FnOnce(io::Error) -> AgentError {
    move |source| AgentError::Io { what, source }
}

/// Identifies a watch for its whole life; never reused, so a late reply for a unit that was
/// unwatched and watched again cannot land on the new watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct UnitKey(u64);

/// What async work on the runtime hands back to the loop.
enum Completion {
    Signal(Message),
    /// A signal stream of the connection of `epoch` ended: that connection is gone.
    SignalsEnded {
        epoch: u64,
    },
    /// `org.freedesktop.systemd1` changed hands on the connection of `epoch`.
    OwnerChanged {
        epoch: u64,
        new_owner: String,
    },
    /// A reconnect attempt finished.
    Connected {
        epoch: u64,
        result: Result<Box<(Connection, Subscription)>, ConnectError>,
    },
    Read {
        key: UnitKey,
        result: Result<UnitSnapshot, ManagerError>,
    },
    Stopped {
        key: UnitKey,
        unit: String,
        kind: StopKind,
        result: Result<(), ManagerError>,
    },
}

/// Why the agent issues a StopUnit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StopKind {
    /// The proof asked for it (a stop requested by a client, or a foreign invocation).
    Proof(StopReason),
    /// The final stop of a proven generation, so the control side removes its files.
    FinalGeneration,
}

impl fmt::Display for StopKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StopKind::Proof(StopReason::Requested) => "requested",
            StopKind::Proof(StopReason::Foreign) => "foreign invocation",
            StopKind::FinalGeneration => "final stop of the generation",
        })
    }
}

/// What a `watch` may carry besides the unit and the invocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct WatchSpec {
    run_dir: Option<PathBuf>,
    /// The record's file name; `None` with a run dir is `exit-<invocation>.json`.
    record: Option<String>,
    generation: Option<u64>,
    launch_file: Option<PathBuf>,
}

type Completions = Arc<Mutex<VecDeque<Completion>>>;

fn push(queue: &Completions, completion: Completion) {
    queue
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push_back(completion);
}

/// A caller to answer once: its client and the id of its request.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ReplyTo {
    client: ClientId,
    id: Option<RequestId>,
}

/// One watched unit.
struct Watch {
    unit: UnitName,
    path: String,
    /// The invocation the watch was asked for; `None` adopts the current one.
    asked_invocation: Option<String>,
    /// `None` until the first read of the unit came back.
    proof: Option<UnitProof>,
    facts: UnitFacts,
    /// The last non-empty ControlGroup: systemd reports it empty once the unit is gone.
    control_group: String,
    /// A stop asked for before the first read came back.
    pending_stop: bool,
    /// A stop requested before the agent restarted: it stays requested, with no new StopUnit.
    resumed_stop_requested: bool,
    /// `watch` requests answered once the first read is back.
    watch_replies: Vec<ReplyTo>,
    read_in_flight: bool,
    read_again: bool,
    timer: Option<Instant>,
    event: Option<ProofEvent>,
    spec: WatchSpec,
    /// A generation's files to release after the proof; `None` for a watch without `gen`.
    release: Option<Release>,
}

impl Watch {
    fn new(unit: UnitName, asked_invocation: Option<String>, spec: WatchSpec) -> Watch {
        Watch {
            path: unit_path(unit.as_str()),
            unit,
            asked_invocation,
            proof: None,
            facts: UnitFacts::default(),
            control_group: String::new(),
            pending_stop: false,
            resumed_stop_requested: false,
            watch_replies: Vec::new(),
            read_in_flight: false,
            read_again: false,
            timer: None,
            event: None,
            release: spec
                .generation
                .map(|_| Release::new(spec.launch_file.is_some())),
            spec,
        }
    }

    /// The exit record's file name, once our invocation is known.
    fn record_name(&self) -> Option<String> {
        self.spec.run_dir.as_ref()?;
        match &self.spec.record {
            Some(name) => Some(name.clone()),
            None => Some(default_record_name(self.proof.as_ref()?.invocation())),
        }
    }

    fn view(&self) -> WatchView {
        let proof = self.proof.as_ref();
        WatchView {
            unit: self.unit.to_string(),
            invocation: proof
                .map(|p| p.invocation().to_owned())
                .or_else(|| self.event.as_ref().map(|e| e.invocation.clone())),
            active_state: self.facts.active_state().map(Into::into),
            sub_state: self.facts.sub_state().map(Into::into),
            populated: match proof.and_then(|p| p.last_reading()) {
                Some(CgroupReading::Populated) => Some(true),
                Some(CgroupReading::Empty) => Some(false),
                _ => None,
            },
            phase: match (&self.event, proof) {
                (Some(_), _) => Phase::Proven,
                (None, Some(proof)) => proof.phase(),
                (None, None) => Phase::Watching,
            },
            stop_requested: proof.is_some_and(UnitProof::stop_requested)
                || self.pending_stop
                || self.resumed_stop_requested
                || self.event.as_ref().is_some_and(|e| e.stop_requested),
            run_dir: self.spec.run_dir.as_ref().map(|p| p.display().to_string()),
            record: self.record_name().or_else(|| self.spec.record.clone()),
            generation: self.spec.generation,
            launch_file: self
                .spec
                .launch_file
                .as_ref()
                .map(|p| p.display().to_string()),
            proof: self.event.clone(),
        }
    }
}

/// Runs the agent until SIGINT or SIGTERM.
pub fn run(config: AgentConfig) -> Result<(), AgentError> {
    let mut agent = Agent::start(config)?;
    agent.run()
}

struct Agent {
    config: AgentConfig,
    poll: Poll,
    runtime: MioRuntime,
    /// The bus connection; `None` while it is lost and being re-established.
    conn: Option<Connection>,
    systemd: String,
    /// Counts connections, so a late message of a lost one is told apart.
    bus_epoch: u64,
    /// When to try connecting again, and the backoff that got us there.
    reconnect: Option<(Instant, Duration)>,
    /// StopUnits asked for while the bus was down, issued once it is back.
    deferred_stops: Vec<(UnitKey, String, StopKind)>,
    /// The next safety-net relist of every unit.
    next_resync: Option<Instant>,
    completions: Completions,
    cgroups: CgroupWatcher<UnitKey>,
    server: ControlServer,
    signals: SignalFd,
    next_key: u64,
    units: HashMap<UnitKey, Watch>,
    by_name: HashMap<String, UnitKey>,
    by_path: HashMap<String, UnitKey>,
    timers: BTreeSet<(Instant, UnitKey)>,
    waiters: Waiters<UnitKey, ReplyTo>,
    subscribers: HashSet<ClientId>,
    proven_order: VecDeque<(Instant, UnitKey)>,
    /// Every (unit, generation) ever watched: generation numbers are never reused.
    generations: HashSet<(String, u64)>,
    reads_in_flight: usize,
    read_queue: VecDeque<UnitKey>,
    /// Where the watch set is kept across restarts; `None` keeps it in memory only.
    state_file: Option<StateFile>,
    /// The watch set changed since it was last saved.
    dirty: bool,
    last_save: Option<Instant>,
    /// A save held back by the save interval.
    save_due: Option<Instant>,
    /// systemd's notify socket, when started by systemd (`Type=notify`).
    notifier: Option<Notifier>,
    /// The next watchdog keep-alive, sent from the loop itself so a wedged loop is restarted.
    next_ping: Option<Instant>,
}

impl Agent {
    fn start(config: AgentConfig) -> Result<Agent, AgentError> {
        let state_file = config.state_dir.clone().map(StateFile::new);
        let restored = match &state_file {
            Some(file) => match file.load() {
                Ok(state) => state,
                // Said loudly and moved aside; starting empty is then not silent.
                Err(e @ StateError::Corrupt { .. }) => {
                    log::error!("{e}; starting with no watches");
                    AgentState::default()
                }
                Err(e) => return Err(AgentError::State(e)),
            },
            None => AgentState::default(),
        };
        let mut poll = Poll::new().map_err(io_error("create the event loop"))?;
        let runtime = MioRuntime::new(poll.registry(), WAKER, RUNTIME_TOKENS)
            .map_err(io_error("create the bus runtime"))?;
        // Connecting and subscribing happen before any other source is registered, so
        // block_on may drop foreign events: there are none yet.
        let (conn, subscription) =
            crate::systemd::connect(&runtime, &mut poll, config.bus, config.method_timeout)
                .map_err(AgentError::Connect)?;
        let completions: Completions = Arc::default();

        let root = cgroup2_mount().map_err(AgentError::Cgroup)?;
        let cgroups = CgroupWatcher::new(root).map_err(AgentError::Cgroup)?;
        poll.registry()
            .register(
                &mut SourceFd(&cgroups.as_raw_fd()),
                INOTIFY,
                Interest::READABLE,
            )
            .map_err(io_error("watch inotify"))?;

        let mut mask = SigSet::empty();
        mask.add(Signal::SIGINT);
        mask.add(Signal::SIGTERM);
        mask.thread_block()
            .map_err(|e| io_error("block signals")(e.into()))?;
        let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map_err(|e| io_error("create a signalfd")(e.into()))?;
        poll.registry()
            .register(
                &mut SourceFd(&signals.as_raw_fd()),
                SIGNALS,
                Interest::READABLE,
            )
            .map_err(io_error("watch signals"))?;

        let mut server = ControlServer::bind(&config.socket, config.server.clone())
            .map_err(AgentError::Control)?;
        server
            .register(poll.registry(), CONTROL_TOKENS)
            .map_err(io_error("register the control socket"))?;
        log::info!(
            "listening on {}, systemd is {} on the {}",
            config.socket.display(),
            subscription.systemd,
            config.bus
        );
        let next_resync = config.resync_interval.map(|every| Instant::now() + every);
        let mut agent = Agent {
            config,
            poll,
            runtime,
            conn: None,
            systemd: String::new(),
            bus_epoch: 0,
            reconnect: None,
            deferred_stops: Vec::new(),
            next_resync,
            completions,
            cgroups,
            server,
            signals,
            next_key: 0,
            units: HashMap::new(),
            by_name: HashMap::new(),
            by_path: HashMap::new(),
            timers: BTreeSet::new(),
            waiters: Waiters::default(),
            subscribers: HashSet::new(),
            proven_order: VecDeque::new(),
            generations: HashSet::new(),
            reads_in_flight: 0,
            read_queue: VecDeque::new(),
            state_file,
            dirty: false,
            last_save: None,
            save_due: None,
            notifier: Notifier::from_env(),
            next_ping: None,
        };
        agent.restore(restored);
        agent.on_connected(conn, subscription);
        agent.save_now(Instant::now());
        if let Some(notifier) = &agent.notifier {
            // The bus, the subscription and inotify are up and the state is re-adopted.
            if let Err(e) = notifier.ready() {
                log::warn!("{e}");
            }
            agent.next_ping = notifier
                .watchdog_interval()
                .map(|every| Instant::now() + every);
        }
        Ok(agent)
    }

    fn run(&mut self) -> Result<(), AgentError> {
        let mut events = Events::with_capacity(1024);
        let mut requests = Vec::new();
        loop {
            let timeout = self.timeout(Instant::now());
            match self.poll.poll(&mut events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_error("wait for events")(e)),
            }
            let mut cgroups_ready = false;
            for event in events.iter() {
                match event.token() {
                    t if self.runtime.owns(t) => self.runtime.handle_event(event),
                    INOTIFY => cgroups_ready = true,
                    SIGNALS => {
                        if let Ok(Some(info)) = self.signals.read_signal() {
                            log::info!("signal {}: shutting down", info.ssi_signo);
                            if let Some(notifier) = &self.notifier {
                                let _ = notifier.stopping();
                            }
                            self.save_now(Instant::now());
                            return Ok(());
                        }
                    }
                    _ => self
                        .server
                        .handle_event(self.poll.registry(), event, &mut requests),
                }
            }
            self.runtime.turn();
            self.take_completions();
            if cgroups_ready {
                self.take_cgroup_notices();
            }
            // Sends may drop slow clients; their `Closed` comes through take_closed.
            self.server.take_closed(&mut requests);
            for request in std::mem::take(&mut requests) {
                self.on_server_event(request);
            }
            self.server.take_closed(&mut requests);
            self.on_time(Instant::now());
            self.save_state(Instant::now());
        }
    }

    /// How long the loop may sleep: until the earliest timer of anyone.
    fn timeout(&self, now: Instant) -> Option<Duration> {
        let ours = [
            self.timers.first().map(|(at, _)| *at),
            self.waiters.next_deadline(),
            self.reconnect.map(|(at, _)| at),
            self.next_resync,
            self.next_ping,
            self.save_due,
            self.proven_order
                .front()
                .map(|(at, _)| *at + self.config.retain_for),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|at| at.saturating_duration_since(now));
        match (ours, self.runtime.timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn take_completions(&mut self) {
        loop {
            let next = self
                .completions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop_front();
            let Some(completion) = next else { break };
            match completion {
                Completion::Signal(message) => self.on_signal(&message),
                Completion::SignalsEnded { epoch } => {
                    if epoch == self.bus_epoch {
                        self.bus_lost("the bus connection closed");
                    }
                }
                Completion::OwnerChanged { epoch, new_owner } => {
                    if epoch == self.bus_epoch && new_owner != self.systemd {
                        self.bus_lost("systemd left the bus (re-executed or restarted)");
                    }
                }
                Completion::Connected { epoch, result } => self.on_reconnect(epoch, result),
                Completion::Read { key, result } => {
                    self.read_done();
                    self.on_read(key, result);
                }
                Completion::Stopped {
                    key,
                    unit,
                    kind,
                    result,
                } => {
                    match &result {
                        Ok(()) => log::debug!("{unit}: stop ({kind}) accepted"),
                        Err(e) => log::warn!("{unit}: stop ({kind}): {e}"),
                    }
                    let succeeded = result.is_ok();
                    self.release(key, ReleaseInput::StopFinished { succeeded });
                    self.dirty = true;
                }
            }
        }
    }

    fn on_signal(&mut self, message: &Message) {
        let header = message.header();
        if header.sender().map(|s| s.as_str()) != Some(self.systemd.as_str()) {
            return;
        }
        let serial = message.primary_header().serial_num().get();
        let decoded = match signal::decode(message) {
            Ok(Some(decoded)) => decoded,
            Ok(None) => return,
            Err(e) => {
                log::warn!("{e}");
                return;
            }
        };
        match decoded {
            SystemdSignal::UnitChanged { path, change } => {
                let Some(&key) = self.by_path.get(&path) else {
                    return;
                };
                let Some(watch) = self.units.get_mut(&key) else {
                    return;
                };
                let new_invocation = watch.facts.apply_change(&change, serial);
                if new_invocation || change.invalidated {
                    // A new invocation may run in another cgroup, and ControlGroup is never
                    // signalled: read it again.
                    self.read_unit(key);
                }
                self.feed_state(key);
            }
            SystemdSignal::UnitRemoved { unit } => {
                if let Some(&key) = self.by_name.get(&unit) {
                    if let Some(watch) = self.units.get_mut(&key) {
                        watch.facts.apply_unloaded(serial);
                    }
                    self.feed_state(key);
                }
            }
            SystemdSignal::UnitNew { unit } => {
                if let Some(&key) = self.by_name.get(&unit) {
                    self.read_unit(key);
                }
            }
            SystemdSignal::Reloading(true) => log::debug!("systemd is reloading"),
            SystemdSignal::Reloading(false) => {
                let keys: Vec<UnitKey> = self.units.keys().copied().collect();
                for key in keys {
                    self.read_unit(key);
                }
            }
        }
    }

    /// Reads a unit's state and cgroup path again; at most one read per unit is in flight, and
    /// one asked for meanwhile runs when it returns.
    fn read_unit(&mut self, key: UnitKey) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        if watch.event.is_some() {
            return;
        }
        if watch.read_in_flight {
            watch.read_again = true;
            return;
        }
        watch.read_in_flight = true;
        if self.reads_in_flight < MAX_READS_IN_FLIGHT {
            self.start_read(key);
        } else {
            self.read_queue.push_back(key);
        }
    }

    fn start_read(&mut self, key: UnitKey) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        let Some(conn) = self.conn.clone() else {
            // The bus is down: every unit is read again once it is back.
            watch.read_in_flight = false;
            return;
        };
        self.reads_in_flight += 1;
        let unit = watch.unit.to_string();
        let queue = self.completions.clone();
        self.runtime
            .spawn(async move {
                let result = manager::read_unit(&conn, &unit).await;
                push(&queue, Completion::Read { key, result });
            })
            .detach();
    }

    /// A read came back: the next queued one may go.
    fn read_done(&mut self) {
        self.reads_in_flight = self.reads_in_flight.saturating_sub(1);
        while self.reads_in_flight < MAX_READS_IN_FLIGHT {
            let Some(key) = self.read_queue.pop_front() else {
                break;
            };
            if self.units.contains_key(&key) {
                self.start_read(key);
            }
        }
    }

    fn on_read(&mut self, key: UnitKey, result: Result<UnitSnapshot, ManagerError>) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        watch.read_in_flight = false;
        let snapshot = match result {
            Ok(snapshot) => snapshot,
            // The bus went away under the read; it is read again once the bus is back.
            Err(_) if self.conn.is_none() => return,
            Err(e) if watch.proof.is_none() => {
                let message = format!("{}: {e}", watch.unit);
                self.fail_watch(key, &message);
                return;
            }
            Err(e) => {
                log::warn!("{}: {e}", watch.unit);
                return;
            }
        };
        watch.facts.apply_snapshot(&snapshot);
        let moved =
            !snapshot.control_group.is_empty() && snapshot.control_group != watch.control_group;
        if moved {
            watch.control_group = snapshot.control_group.clone();
        }
        let first = watch.proof.is_none();
        if first {
            let invocation = watch
                .asked_invocation
                .clone()
                .unwrap_or_else(|| snapshot.invocation.clone());
            watch.proof = Some(UnitProof::resume(invocation, watch.resumed_stop_requested));
            self.dirty = true;
        }
        if watch.read_again {
            watch.read_again = false;
            self.read_unit(key);
        }
        if (moved || first)
            && let Err(message) = self.watch_cgroup(key)
        {
            if first {
                // A watch that cannot see its cgroup change is no watch: refuse it clearly
                // (the inotify watch limit, typically) rather than prove late or never.
                self.fail_watch(key, &message);
                return;
            }
            log::error!("{message}");
        }
        if first {
            // A first reading for `list`; judged only if the state asks for it.
            let reading = self.cgroups.read(key);
            self.feed(key, Input::Cgroup(reading));
        }
        self.feed_state(key);
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        if first && std::mem::take(&mut watch.pending_stop) {
            self.feed(key, Input::StopRequested);
        }
        if first {
            let Some(watch) = self.units.get_mut(&key) else {
                return;
            };
            let view = watch.view();
            for reply in std::mem::take(&mut watch.watch_replies) {
                self.reply_ok(&reply, "watch", &view);
            }
        }
    }

    /// Adds the inotify watches for the unit's cgroup; they come before any read of it, so no
    /// change between the read and the watch can be missed.
    fn watch_cgroup(&mut self, key: UnitKey) -> Result<(), String> {
        let Some(watch) = self.units.get(&key) else {
            return Ok(());
        };
        if watch.control_group.is_empty() {
            return Ok(());
        }
        self.cgroups
            .watch(key, &watch.control_group)
            .map_err(|e| format!("{}: {e}", watch.unit))
    }

    /// Refuses a watch whose first read failed or whose cgroup cannot be watched: everyone
    /// waiting on it gets the error, and nothing of it stays.
    fn fail_watch(&mut self, key: UnitKey, message: &str) {
        log::warn!("{message}");
        let replies = self
            .units
            .get_mut(&key)
            .map(|w| std::mem::take(&mut w.watch_replies))
            .unwrap_or_default();
        for reply in replies.into_iter().chain(self.waiters.take_key(key)) {
            self.reply_error(&reply, ErrorKind::Internal, message);
        }
        self.forget(key);
    }

    fn feed_state(&mut self, key: UnitKey) {
        let Some(state) = self.units.get(&key).and_then(|w| w.facts.state()) else {
            return;
        };
        self.feed(key, Input::State(state));
    }

    /// Hands one input to a unit's proof and carries out everything it asks for.
    fn feed(&mut self, key: UnitKey, input: Input) {
        let now = Instant::now();
        let Some(proof) = self.units.get_mut(&key).and_then(|w| w.proof.as_mut()) else {
            return;
        };
        proof.handle_input(input, now);
        self.drive(key, now);
    }

    fn drive(&mut self, key: UnitKey, now: Instant) {
        loop {
            let Some(watch) = self.units.get_mut(&key) else {
                return;
            };
            let Some(proof) = watch.proof.as_mut() else {
                return;
            };
            let Some(output) = proof.poll_output() else {
                break;
            };
            match output {
                Output::ReadCgroup => {
                    let reading = self.cgroups.read(key);
                    if let Some(proof) = self.units.get_mut(&key).and_then(|w| w.proof.as_mut()) {
                        proof.handle_input(Input::Cgroup(reading), now);
                    }
                }
                Output::StopUnit(reason) => {
                    if let Some(release) = watch.release.as_mut() {
                        release.handle(ReleaseInput::StopIssued);
                    }
                    let unit = watch.unit.to_string();
                    self.stop_unit(key, unit, StopKind::Proof(reason));
                }
                Output::Log(level, line) => {
                    log::log!(to_log_level(level), "{}: {line}", watch.unit);
                }
                Output::Proven(proof) => {
                    if let Some(event) = self.proof_event(key, proof) {
                        // Released before anyone is told, as the seed's finaliseGen runs
                        // before Stop returns: a caller that hears "proven" finds the launch
                        // file gone.
                        self.release(key, ReleaseInput::Proven);
                        self.on_proven(key, event, now);
                    }
                }
            }
        }
        self.rearm(key);
    }

    /// The event of a proof. A terminal proof reads the advisory exit record (once, and
    /// consumes it: it must never count for a later invocation) and is worded from it, or
    /// from systemd's own exit status when the watch names no record.
    fn proof_event(&mut self, key: UnitKey, proof: Proof) -> Option<ProofEvent> {
        let watch = self.units.get(&key)?;
        let invocation = watch
            .proof
            .as_ref()
            .map(|p| p.invocation().to_owned())
            .unwrap_or_default();
        let mut event = ProofEvent {
            kind: EventKind::Proven,
            unit: watch.unit.to_string(),
            invocation,
            level: proof.level,
            message: proof.message,
            cause: proof.cause,
            proven_mono_ns: monotonic_ns(),
            stop_requested: watch.proof.as_ref().is_some_and(UnitProof::stop_requested),
            systemd: None,
            record: None,
            generation: watch.spec.generation,
            launch_file: watch
                .spec
                .launch_file
                .as_ref()
                .map(|p| p.display().to_string()),
        };
        if proof.cause != Cause::Exited {
            return Some(event);
        }
        let systemd = watch.facts.service_exit().map(|exit| systemd_record(&exit));
        let named = watch.spec.run_dir.clone().zip(watch.record_name());
        let record = named
            .as_ref()
            .and_then(|(dir, name)| match read_record(dir, name) {
                Ok(record) => record,
                Err(e) => {
                    log::info!("{}: no exit record: {e}", event.unit);
                    None
                }
            });
        if let Some((dir, name)) = &named
            && let Err(e) = remove_beneath(dir, name)
        {
            log::warn!("{}: remove the exit record: {e}", event.unit);
        }
        let (level, message) = terminal_wording(named.is_some(), record.as_ref(), systemd.as_ref());
        event.level = level;
        event.message = message;
        event.systemd = systemd.as_ref().map(SanitizedRecord::from);
        event.record = record.as_ref().map(SanitizedRecord::from);
        Some(event)
    }

    /// Hands a fact to a generation's release and carries out what it asks for.
    fn release(&mut self, key: UnitKey, input: ReleaseInput) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        let Some(release) = watch.release.as_mut() else {
            return;
        };
        release.handle(input);
        for output in release.take_outputs() {
            match output {
                ReleaseOutput::RemoveLaunchFile => {
                    if let Some(path) = &watch.spec.launch_file {
                        // unlink never follows the final component: a symlink is removed,
                        // never what it points to.
                        match std::fs::remove_file(path) {
                            Ok(()) => log::info!("{}: removed {}", watch.unit, path.display()),
                            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                            Err(e) => log::warn!("{}: remove {}: {e}", watch.unit, path.display()),
                        }
                    }
                }
                ReleaseOutput::FinalStop => {
                    let unit = watch.unit.to_string();
                    self.stop_unit(key, unit, StopKind::FinalGeneration);
                    return;
                }
            }
        }
    }

    fn rearm(&mut self, key: UnitKey) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        let next = watch.proof.as_ref().and_then(UnitProof::poll_timeout);
        if watch.timer != next {
            if let Some(old) = watch.timer.take() {
                self.timers.remove(&(old, key));
            }
            if let Some(at) = next {
                self.timers.insert((at, key));
            }
            watch.timer = next;
        }
    }

    fn stop_unit(&mut self, key: UnitKey, unit: String, kind: StopKind) {
        let Some(conn) = self.conn.clone() else {
            log::info!("{unit}: stop ({kind}) deferred until the bus is back");
            self.deferred_stops.push((key, unit, kind));
            return;
        };
        log::info!("{unit}: stopping ({kind})");
        let queue = self.completions.clone();
        self.runtime
            .spawn(async move {
                let result = manager::stop_unit(&conn, &unit).await;
                push(
                    &queue,
                    Completion::Stopped {
                        key,
                        unit,
                        kind,
                        result,
                    },
                );
            })
            .detach();
    }

    /// The proof is in: release what the unit held (here, its inotify watches), exactly once,
    /// then tell everyone.
    fn on_proven(&mut self, key: UnitKey, event: ProofEvent, now: Instant) {
        self.cgroups.unwatch(key);
        let level = to_log_level(event.level);
        log::log!(
            level,
            "{}: proven: {} ({:?})",
            event.unit,
            event.message,
            event.cause
        );
        for reply in self.waiters.take_key(key) {
            self.reply_ok(&reply, "event", &event);
        }
        match event_line(&event) {
            Ok(line) => {
                let subscribers: Vec<ClientId> = self.subscribers.iter().copied().collect();
                for client in subscribers {
                    self.send(client, &line);
                }
            }
            Err(e) => log::error!("{}: encode the proof event: {e}", event.unit),
        }
        if let Some(watch) = self.units.get_mut(&key) {
            watch.event = Some(event);
        }
        self.dirty = true;
        self.proven_order.push_back((now, key));
        while self.proven_order.len() > self.config.retain_proven {
            if let Some((_, old)) = self.proven_order.pop_front() {
                self.forget(old);
            }
        }
    }

    fn take_cgroup_notices(&mut self) {
        let mut notices = Vec::new();
        if let Err(e) = self.cgroups.drain(&mut notices) {
            log::error!("{e}");
        }
        for notice in notices {
            match notice {
                Notice::Changed(key) => {
                    let reading = self.cgroups.read(key);
                    self.feed(key, Input::Cgroup(reading));
                }
                Notice::Overflow => {
                    log::warn!("inotify queue overflowed: reading every cgroup again");
                    let keys: Vec<UnitKey> = self.units.keys().copied().collect();
                    for key in keys {
                        let reading = self.cgroups.read(key);
                        self.feed(key, Input::Cgroup(reading));
                    }
                }
            }
        }
    }

    fn on_time(&mut self, now: Instant) {
        self.bus_timers(now);
        if let (Some(at), Some(notifier)) = (self.next_ping, &self.notifier)
            && at <= now
        {
            if let Err(e) = notifier.ping() {
                log::warn!("{e}");
            }
            self.next_ping = notifier.watchdog_interval().map(|every| now + every);
        }
        while let Some(&(at, key)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.remove(&(at, key));
            if let Some(watch) = self.units.get_mut(&key) {
                watch.timer = None;
                if let Some(proof) = watch.proof.as_mut() {
                    proof.handle_timeout(now);
                }
            }
            self.drive(key, now);
        }
        for (key, reply) in self.waiters.take_expired(now) {
            let unit = self.units.get(&key).map(|w| w.unit.to_string());
            let message = format!(
                "{} still running: not proven before the timeout; it stays watched",
                unit.unwrap_or_default()
            );
            self.reply_error(&reply, ErrorKind::StillRunning, &message);
        }
        while let Some(&(at, key)) = self.proven_order.front() {
            if now.saturating_duration_since(at) < self.config.retain_for {
                break;
            }
            self.proven_order.pop_front();
            self.forget(key);
        }
    }

    fn on_server_event(&mut self, event: ServerEvent) {
        match event {
            ServerEvent::Closed { client } => {
                self.subscribers.remove(&client);
                self.waiters.take_where(|r| r.client == client);
            }
            ServerEvent::Request { client, request } => self.on_request(client, request),
        }
    }

    fn on_request(&mut self, client: ClientId, request: Request) {
        let reply = ReplyTo {
            client,
            id: request.id,
        };
        let now = Instant::now();
        match request.command {
            Command::Watch(WatchArgs {
                unit,
                invocation,
                run_dir,
                record,
                generation,
                launch_file,
            }) => {
                let spec = WatchSpec {
                    run_dir,
                    record,
                    generation,
                    launch_file,
                };
                self.cmd_watch(reply, unit, invocation, spec)
            }
            Command::Wait(WaitArgs { unit, timeout }) => {
                let key = self.ensure_watch(&unit);
                self.wait_for(key, reply, timeout.map(|t| now + t));
            }
            Command::Stop(WaitArgs { unit, timeout }) => {
                let key = self.ensure_watch(&unit);
                if let Some(watch) = self.units.get_mut(&key) {
                    if watch.proof.is_some() {
                        self.feed(key, Input::StopRequested);
                    } else {
                        watch.pending_stop = true;
                    }
                }
                self.dirty = true;
                self.wait_for(key, reply, timeout.map(|t| now + t));
            }
            Command::Unwatch(UnwatchArgs { unit }) => {
                match self.by_name.get(unit.as_str()).copied() {
                    Some(key) => {
                        for waiter in self.waiters.take_key(key) {
                            self.reply_error(&waiter, ErrorKind::NotWatched, "unwatched");
                        }
                        self.forget(key);
                        self.send(client, &Response::ok(reply.id, ()).to_line());
                    }
                    None => self.reply_error(
                        &reply,
                        ErrorKind::NotWatched,
                        &format!("{unit} is not watched"),
                    ),
                }
            }
            Command::List => {
                let mut views: Vec<WatchView> = self.units.values().map(Watch::view).collect();
                views.sort_by(|a, b| a.unit.cmp(&b.unit));
                self.reply_ok(&reply, "units", &views);
            }
            Command::Events => {
                self.subscribers.insert(client);
                self.send(client, &Response::ok(reply.id, ()).to_line());
            }
        }
    }

    fn cmd_watch(
        &mut self,
        reply: ReplyTo,
        unit: UnitName,
        invocation: Option<String>,
        spec: WatchSpec,
    ) {
        if let Some(generation) = spec.generation
            && !self.generations.insert((unit.to_string(), generation))
        {
            let message = format!(
                "generation {generation} of {unit} was already watched; generation numbers are never reused"
            );
            self.reply_error(&reply, ErrorKind::BadRequest, &message);
            return;
        }
        if let Some(&key) = self.by_name.get(unit.as_str()) {
            let Some(watch) = self.units.get_mut(&key) else {
                return;
            };
            let ours = watch
                .proof
                .as_ref()
                .map(|p| p.invocation().to_owned())
                .or_else(|| watch.asked_invocation.clone());
            if watch.event.is_some() {
                // A proven unit is watched afresh: its retained proof is replaced.
                self.forget(key);
            } else if invocation.is_some() && ours.is_some() && invocation != ours {
                let message = format!(
                    "{unit} is already watched with invocation {}",
                    ours.unwrap_or_default()
                );
                self.reply_error(&reply, ErrorKind::BadRequest, &message);
                return;
            } else if spec != WatchSpec::default() && spec != watch.spec {
                let message = format!("{unit} is already watched with other options");
                self.reply_error(&reply, ErrorKind::BadRequest, &message);
                return;
            } else if watch.proof.is_some() {
                let view = watch.view();
                self.reply_ok(&reply, "watch", &view);
                return;
            } else {
                watch.watch_replies.push(reply);
                return;
            }
        }
        let key = self.new_watch(&unit, invocation, spec);
        if let Some(watch) = self.units.get_mut(&key) {
            watch.watch_replies.push(reply);
        }
    }

    /// The unit's watch, started (adopting its current invocation) if there is none.
    fn ensure_watch(&mut self, unit: &UnitName) -> UnitKey {
        match self.by_name.get(unit.as_str()) {
            Some(&key) => key,
            None => self.new_watch(unit, None, WatchSpec::default()),
        }
    }

    fn new_watch(
        &mut self,
        unit: &UnitName,
        invocation: Option<String>,
        spec: WatchSpec,
    ) -> UnitKey {
        let key = self.new_key();
        let watch = Watch::new(unit.clone(), invocation, spec);
        self.by_name.insert(unit.to_string(), key);
        self.by_path.insert(watch.path.clone(), key);
        self.units.insert(key, watch);
        self.read_unit(key);
        self.dirty = true;
        key
    }

    fn wait_for(&mut self, key: UnitKey, reply: ReplyTo, deadline: Option<Instant>) {
        let Some(watch) = self.units.get(&key) else {
            return;
        };
        match &watch.event {
            Some(event) => {
                let event = event.clone();
                self.reply_ok(&reply, "event", &event);
            }
            None => {
                self.waiters.add(key, reply, deadline);
            }
        }
    }

    /// Drops a watch and everything it holds.
    fn forget(&mut self, key: UnitKey) {
        let Some(watch) = self.units.remove(&key) else {
            return;
        };
        self.dirty = true;
        self.cgroups.unwatch(key);
        if self.by_name.get(watch.unit.as_str()) == Some(&key) {
            self.by_name.remove(watch.unit.as_str());
        }
        if self.by_path.get(&watch.path) == Some(&key) {
            self.by_path.remove(&watch.path);
        }
        if let Some(at) = watch.timer {
            self.timers.remove(&(at, key));
        }
        self.proven_order.retain(|(_, k)| *k != key);
    }

    fn reply_ok<T: serde::Serialize>(&mut self, reply: &ReplyTo, field: &str, value: &T) {
        let mut payload = serde_json::Map::new();
        match serde_json::to_value(value) {
            Ok(value) => {
                payload.insert(field.to_owned(), value);
                let line = Response::ok(reply.id.clone(), payload).to_line();
                self.send(reply.client, &line);
            }
            Err(e) => self.reply_error(reply, ErrorKind::Internal, &format!("encode {field}: {e}")),
        }
    }

    fn reply_error(&mut self, reply: &ReplyTo, kind: ErrorKind, message: &str) {
        let line = Response::error(reply.id.clone(), kind, message).to_line();
        self.send(reply.client, &line);
    }

    /// Sends one line; a client the server dropped (gone, or too slow to read) is forgotten
    /// when the server reports it closed.
    fn send(&mut self, client: ClientId, line: &str) {
        self.server.send(self.poll.registry(), client, line);
    }
}

fn to_log_level(level: crate::proof::Level) -> log::Level {
    match level {
        crate::proof::Level::Info => log::Level::Info,
        crate::proof::Level::Warn => log::Level::Warn,
    }
}

/// CLOCK_MONOTONIC now, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => {
            u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000
                + u64::try_from(ts.tv_nsec()).unwrap_or(0)
        }
        Err(_) => 0,
    }
}

//! The agent's driver: one single-threaded mio loop around the pure `core::Core`.
//!
//! The core holds every rule; this module only turns OS events into the core's inputs (D-Bus
//! signals and replies, inotify notices, control requests, signals, the clock) and carries out
//! its outputs (D-Bus calls, inotify watches, cgroup and exit-record reads, files, client
//! lines, the state file). It is the only place that reads the clock, and it sleeps in
//! `epoll_wait` until the earliest of: a source is ready, the core's next deadline, the bus
//! runtime's own timers, a reconnect or a watchdog keep-alive.

mod bus;
mod cgroup_view;
pub(crate) mod core;
pub(crate) mod dirs;
mod journal;
mod lock;
mod metrics;
mod remaining;
pub(crate) mod saved;
#[cfg(test)]
mod sim;
pub(crate) mod state;
pub(crate) mod stats;
mod store;
mod turns;

use std::collections::VecDeque;
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

use self::core::{
    Answer, Core, CoreConfig, CountedLeftovers, Input, NextInvocation, Output, ReplyTo, StopKind,
    UnitKey,
};
use crate::cgroup::procs::{
    Census, ClockBasis, ProcessStart, ProcessTracker, Tracked, earlier_processes, list_processes,
    offset_now, read_stat,
};
use crate::cgroup::{CgroupError, CgroupWatcher, Notice, cgroup2_mount};
use crate::clock;
use crate::control::ControlError;
use crate::control::protocol::{ErrorKind, Response, event_line, list_reply};
use crate::control::server::{ClientInput, ControlServer, ServerOptions};
use crate::control::wire;
use crate::control::wire::AgentStats;
use crate::exit::{read_record, remove_beneath};
use crate::record_name::RecordName;
use crate::service::Notifier;
use crate::systemd::manager::{self, ManagerError, Subscribed};
use crate::systemd::read;
use crate::systemd::runtime::MioRuntime;
use crate::systemd::signal;
use crate::systemd::snapshot::{ReadKind, UnitSnapshot};
use crate::systemd::start::{self, StartError};
use crate::unit_name::UnitName;
use cgroup_view::ViewError;
use dirs::DirError;
use lock::{LockError, StateLock};
use saved::{AgentState, StateSave};
use state::StateError;
use stats::DriverCounters;
use store::StateStore;
use turns::{LoopAccount, Work};

/// Reads of units in flight at once. A burst of watches is read a window at a time, which
/// bounds what waits on the bus and in memory: a read is a dozen calls, and each read in flight
/// added about 15 KB to the agent's peak (128 against 32). Measured with the scale suite: 128
/// cost 1.4 MiB of peak and 1.0 MiB of resident memory at 1,000 watches, and answered 10,000
/// pipelined watches in 4.2 s, which 32 did in 4.1 to 5.4 s (64: 5.3 s); no faster for sure.
const MAX_READS_IN_FLIGHT: usize = 32;

/// Where the kernel says which boot this is.
/// How long after the loop had something to do the heap's free pages are given back: once per
/// burst, not once per turn, and never while the agent idles.
const RELEASE_HEAP_AFTER: Duration = Duration::from_secs(1);
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

const WAKER: Token = Token(0);
const INOTIFY: Token = Token(1);
const SIGNALS: Token = Token(2);
const CONTROL_TOKENS: std::ops::Range<usize> = 16..(1 << 20);
const RUNTIME_TOKENS: std::ops::Range<usize> = (1 << 20)..(1 << 30);
const LEFTOVER_TOKENS: std::ops::Range<usize> = (1 << 30)..(1 << 31);

pub use crate::systemd::Bus;
/// How the agent runs.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Where systemd is reached: the system bus or the session bus.
    pub bus: Bus,
    /// The control socket's path.
    pub socket: PathBuf,
    /// Who may use the control socket, its mode and its limits.
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
    /// Where the figures are written for node_exporter's textfile collector (`None`: nowhere).
    pub metrics_file: Option<PathBuf>,
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
            metrics_file: None,
        }
    }
}

/// Why the agent could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A system call of the loop failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// systemd could not be reached at start.
    #[error("{0}")]
    Connect(crate::systemd::ConnectError),
    /// The cgroup v2 mount or the inotify watcher could not be set up.
    #[error("{0}")]
    Cgroup(CgroupError),
    /// The cgroup v2 mount could not be proven to be systemd's view of the hierarchy.
    #[error("{0}")]
    CgroupView(ViewError),
    /// The control socket could not be set up.
    #[error("{0}")]
    Control(ControlError),
    /// The state file could not be read at start.
    #[error("{0}")]
    State(StateError),
    /// A save failed: nothing after it was carried out, so nobody was told anything it held.
    #[error(
        "{0}: stopping before anything that save held is answered or released; a restart \
         resumes from the last saved state"
    )]
    Save(StateError),
    /// A missing directory of the socket or the state could not be created.
    #[error("{0}")]
    Dir(DirError),
    /// The state directory could not be locked: another agent holds it, or its lock file
    /// could not be opened.
    #[error("{0}")]
    Lock(LockError),
    /// The metrics file could not be set up.
    #[error("{0}")]
    Metrics(String),
    /// The socket handed over by socket activation cannot be served.
    #[error("{0}")]
    Activation(crate::activation::ActivationError),
}

fn io_error(what: &'static str) -> impl FnOnce(io::Error) -> AgentError {
    move |source| AgentError::Io { what, source }
}

/// What async work on the runtime hands back to the loop.
enum Completion {
    Signal {
        epoch: u64,
        message: Message,
    },
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
        result: Result<Box<(Connection, Subscribed)>, bus::ReconnectError>,
    },
    Read {
        epoch: u64,
        key: UnitKey,
        result: Result<UnitSnapshot, ManagerError>,
    },
    /// A start finished. Answered even if its connection is lost since: the invocation it
    /// names is systemd's word (the connection's owner was verified), and IDs are never reused.
    Started {
        reply: ReplyTo,
        unit: UnitName,
        result: Result<String, StartError>,
    },
    Stopped {
        key: UnitKey,
        unit: String,
        kind: StopKind,
        result: Result<(), ManagerError>,
    },
}

type Completions = Arc<Mutex<VecDeque<Completion>>>;

fn push(queue: &Completions, completion: Completion) {
    queue
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push_back(completion);
}

/// Runs the agent until SIGINT or SIGTERM.
pub fn run(config: AgentConfig) -> Result<(), AgentError> {
    let mut agent = Agent::start(config)?;
    agent.run()
}

struct Agent {
    config: AgentConfig,
    core: Core,
    poll: Poll,
    runtime: MioRuntime,
    /// The bus connection; `None` while it is lost and being re-established.
    conn: Option<Connection>,
    /// systemd's unique name on `conn`, verified; empty while the owner of its name is not
    /// systemd.
    systemd: String,
    /// The manager's pid, once verified: every later owner of its name must have it.
    manager_pid: Option<u32>,
    /// Why systemd is not heard now (`None` while it is).
    unheard: Option<bus::Unheard>,
    /// Counts connections, so a late message of a lost one is told apart.
    bus_epoch: u64,
    /// When to try connecting again, and the backoff that got us there.
    reconnect: Option<(Instant, Duration)>,
    completions: Completions,
    cgroups: CgroupWatcher<UnitKey>,
    /// The cgroup2 mount, below which units' cgroups are.
    cgroup_root: PathBuf,
    /// pidfds of leftovers, so their exits come through the loop.
    leftovers: ProcessTracker<UnitKey>,
    server: ControlServer,
    signals: SignalFd,
    /// Where the watch set is kept across restarts; `None` keeps it in memory only.
    state_store: Option<StateStore>,
    /// The state directory's lock, held as long as the agent runs.
    _state_lock: Option<StateLock>,
    /// A save that failed. The outputs after it (answers and releases that promise it is
    /// durable) are never carried out; the loop stops with it.
    save_failed: Option<StateError>,
    /// systemd's notify socket, when started by systemd (`Type=notify`).
    notifier: Option<Notifier>,
    /// The next watchdog keep-alive, sent from the loop itself so a wedged loop is restarted.
    next_ping: Option<Instant>,
    /// When to give the heap's free pages back, set by the first event after the last time.
    release_heap: Option<Instant>,
    counters: DriverCounters,
    /// What each turn of the loop did, and each proof's time in it.
    account: LoopAccount,
    /// Exit records read for a proof, removed once the proof holding them is written.
    records_to_remove: Vec<(PathBuf, RecordName)>,
    metrics: Option<metrics::MetricsFile>,
}

impl Agent {
    fn start(config: AgentConfig) -> Result<Agent, AgentError> {
        // First: it changes the environment, which only a process with one thread may do.
        let activated = crate::activation::take_listener().map_err(AgentError::Activation)?;
        // Before anything else is touched, the socket included: a second agent on this state
        // directory must leave the first's files alone.
        let state_lock = match &config.state_dir {
            Some(dir) => {
                dirs::create_missing(dir, state::DIR_MODE, "state").map_err(AgentError::Dir)?;
                Some(lock::lock(dir).map_err(AgentError::Lock)?)
            }
            None => None,
        };
        if activated.is_none()
            && let Some(dir) = config.socket.parent()
        {
            dirs::create_missing(dir, config.server.directory_mode(), "control socket")
                .map_err(AgentError::Dir)?;
        }
        let mut state_store = config.state_dir.clone().map(StateStore::new);
        let restored = match &mut state_store {
            Some(store) => match store.load() {
                Ok(loaded) => {
                    if let Some(note) = loaded.note {
                        log::warn!("{note}");
                    }
                    loaded.state
                }
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
        let (conn, subscribed) =
            crate::systemd::connect(&runtime, &mut poll, config.bus, config.method_timeout, None)
                .map_err(AgentError::Connect)?;
        let completions: Completions = Arc::default();

        let root = cgroup2_mount().map_err(AgentError::Cgroup)?;
        // Before any unit is read: another view would make every cgroup read as gone. An
        // owner of systemd's name that is not systemd is asked nothing; the view is proven
        // once systemd is back (a reconnect).
        if let Subscribed::Systemd(subscription) = &subscribed {
            runtime
                .block_on(
                    &mut poll,
                    cgroup_view::prove(
                        &conn,
                        &subscription.systemd,
                        subscription.manager_pid,
                        &root,
                    ),
                )
                .map_err(io_error("run the bus connection"))?
                .map_err(AgentError::CgroupView)?;
        }
        let cgroups = CgroupWatcher::new(root.clone()).map_err(AgentError::Cgroup)?;
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

        let served = activated
            .as_ref()
            .map_or_else(|| config.socket.clone(), |a| a.path.clone());
        let mut server = match activated {
            Some(activated) => {
                if activated.path != config.socket {
                    log::warn!(
                        "serving the socket systemd passed, {}, not {}",
                        activated.path.display(),
                        config.socket.display()
                    );
                }
                ControlServer::adopt(activated.listener, &activated.path, config.server.clone())
            }
            None => ControlServer::bind(&config.socket, config.server.clone()),
        }
        .map_err(AgentError::Control)?;
        server
            .register(poll.registry(), CONTROL_TOKENS)
            .map_err(io_error("register the control socket"))?;
        log::info!("listening on {}, on the {}", served.display(), config.bus);
        let now = clock::now();
        let metrics = match &config.metrics_file {
            Some(path) => Some(metrics::MetricsFile::new(path, now).map_err(AgentError::Metrics)?),
            None => None,
        };
        let core_config = CoreConfig {
            retain_proven: config.retain_proven,
            retain_for: config.retain_for,
            resync_interval: config.resync_interval,
            max_reads_in_flight: MAX_READS_IN_FLIGHT,
            boot_id: boot_id(),
            clock_anchor: clock::anchor(),
        };
        let mut agent = Agent {
            config,
            core: Core::new(core_config, restored, now),
            poll,
            runtime,
            conn: None,
            systemd: String::new(),
            manager_pid: None,
            unheard: None,
            bus_epoch: 0,
            reconnect: None,
            completions,
            cgroups,
            cgroup_root: root,
            leftovers: ProcessTracker::new(LEFTOVER_TOKENS),
            server,
            signals,
            state_store,
            _state_lock: state_lock,
            save_failed: None,
            notifier: Notifier::from_env(),
            next_ping: None,
            release_heap: None,
            counters: DriverCounters::default(),
            account: LoopAccount::new(),
            records_to_remove: Vec::new(),
            metrics,
        };
        agent.carry_out();
        agent.on_connected(conn, subscribed);
        // A new snapshot and journal: a journal is only ever appended to by the agent that
        // started it, so a killed append's remains are never followed by another line.
        agent.core.save_snapshot(clock::now());
        agent.carry_out();
        if let Some(e) = agent.save_failed.take() {
            return Err(AgentError::Save(e));
        }
        if let Some(notifier) = &agent.notifier {
            // The bus, the subscription and inotify are up and the state is re-adopted.
            if let Err(e) = notifier.ready() {
                log::warn!("{e}");
            }
            agent.next_ping = notifier
                .watchdog_interval()
                .map(|every| clock::now() + every);
        }
        Ok(agent)
    }

    fn run(&mut self) -> Result<(), AgentError> {
        let mut events = Events::with_capacity(1024);
        let mut requests = Vec::new();
        loop {
            let timeout = self.timeout(clock::now());
            match self.poll.poll(&mut events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_error("wait for events")(e)),
            }
            self.account.turn_begins(clock::now());
            if let Some(offset) = clock::realtime_minus_monotonic_ns() {
                self.core.observe_wall_clock(offset);
            }
            // The time suspended so far: how a census tells a process that started before an
            // invocation after a suspend. A clock that cannot be read fails the next census,
            // which says so.
            if let Ok((mono_us, offset_ns)) = offset_now() {
                self.core.observe_suspended(mono_us, offset_ns);
            }
            if !events.is_empty() && self.release_heap.is_none() {
                self.release_heap = Some(clock::now() + RELEASE_HEAP_AFTER);
            }
            let mut cgroups_ready = false;
            for event in events.iter() {
                match event.token() {
                    t if self.runtime.owns(t) => {
                        let bus = self.account.begin(Work::Bus, clock::now());
                        self.runtime.handle_event(event);
                        self.account.end(bus, clock::now());
                    }
                    t if self.leftovers.owns(t) => {
                        if let Some((key, pid)) =
                            self.leftovers.handle_event(self.poll.registry(), t)
                        {
                            self.input(Input::LeftoverExited { key, pid });
                        }
                    }
                    INOTIFY => cgroups_ready = true,
                    SIGNALS => {
                        if let Ok(Some(info)) = self.signals.read_signal() {
                            log::info!("signal {}: shutting down", info.ssi_signo);
                            if let Some(notifier) = &self.notifier {
                                let _ = notifier.stopping();
                            }
                            self.core.save_now(clock::now());
                            self.carry_out();
                            self.sync_state(clock::now());
                            return match self.save_failed.take() {
                                Some(e) => Err(AgentError::Save(e)),
                                None => Ok(()),
                            };
                        }
                    }
                    _ => self
                        .server
                        .handle_event(self.poll.registry(), event, &mut requests),
                }
            }
            let bus = self.account.begin(Work::Bus, clock::now());
            self.runtime.turn();
            self.take_completions();
            self.account.end(bus, clock::now());
            if cgroups_ready {
                self.take_cgroup_notices();
            }
            // Sends may drop slow clients; their `Closed` comes through take_closed.
            self.server.take_closed(&mut requests);
            for request in std::mem::take(&mut requests) {
                let input = match request {
                    ClientInput::Closed { client } => Input::ClientClosed { client },
                    ClientInput::Request { client, request } => Input::Request { client, request },
                };
                self.input(input);
            }
            self.server.take_closed(&mut requests);
            let now = clock::now();
            self.on_time(now);
            if self.core.poll_timeout().is_some_and(|at| at <= now) {
                self.metrics_changed(now);
            }
            let rules = self.account.begin(Work::Rules, now);
            self.core.handle_timeout(now);
            self.core.end_turn(now);
            self.account.end(rules, clock::now());
            self.carry_out();
            if self
                .state_store
                .as_ref()
                .is_some_and(StateStore::wants_snapshot)
            {
                self.core.save_snapshot(clock::now());
                self.carry_out();
            }
            if let Some(e) = self.save_failed.take() {
                return Err(AgentError::Save(e));
            }
            self.account.turn_ends(clock::now());
        }
    }

    /// How long the loop may sleep: until the earliest timer of anyone.
    fn timeout(&self, now: Instant) -> Option<Duration> {
        let ours = [
            self.core.poll_timeout(),
            self.bus_timeout(),
            self.next_ping,
            self.release_heap,
            self.metrics.as_ref().and_then(metrics::MetricsFile::due),
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

    /// Hands one input to the core and carries out everything it asks for.
    fn input(&mut self, input: Input) {
        let now = clock::now();
        self.account.input();
        self.metrics_changed(now);
        self.rules(input, now);
        self.carry_out();
    }

    /// Hands `input` to the core, its time charged to the rules.
    fn rules(&mut self, input: Input, now: Instant) {
        let rules = self.account.begin(Work::Rules, now);
        self.core.handle_input(input, now);
        self.account.end(rules, clock::now());
    }

    /// Something happened that may change the figures: the metrics file is refreshed soon.
    fn metrics_changed(&mut self, now: Instant) {
        if let Some(metrics) = &mut self.metrics {
            metrics.changed(now);
        }
    }

    /// Drains the core's outputs. The synchronous ones are answered at once, so their answer
    /// reaches the core before any other input. After a failed save nothing more is carried
    /// out: what follows a save may promise that it is durable.
    fn carry_out(&mut self) {
        while self.save_failed.is_none()
            && let Some(output) = self.core.poll_output()
        {
            match output {
                Output::ReadUnit {
                    key,
                    unit,
                    kind,
                    ours,
                } => {
                    let bus = self.account.begin(Work::Bus, clock::now());
                    self.read_unit(key, unit, kind, ours);
                    self.account.end(bus, clock::now());
                }
                Output::StartUnit { reply, unit } => {
                    let bus = self.account.begin(Work::Bus, clock::now());
                    self.start_unit(reply, unit);
                    self.account.end(bus, clock::now());
                }
                Output::StopUnit { key, unit, kind } => {
                    let bus = self.account.begin(Work::Bus, clock::now());
                    self.stop_unit(key, unit, kind);
                    self.account.end(bus, clock::now());
                }
                Output::AddInotifyWatches { key, cgroup } => {
                    let result = self
                        .cgroups
                        .add_watches(key, &cgroup)
                        .map_err(|e| e.to_string());
                    self.rules(Input::InotifyWatchesAdded { key, result }, clock::now());
                }
                Output::DropKernelHandles { key } => {
                    self.cgroups.remove_watches(key);
                    self.leftovers.untrack_key(self.poll.registry(), key);
                }
                Output::CountLeftovers {
                    key,
                    cgroup,
                    next,
                    held,
                } => {
                    let census = self.account.begin(Work::Census, clock::now());
                    let result = self.count_leftovers(key, &cgroup, &next, &held);
                    let now = clock::now();
                    self.account.end(census, now);
                    self.rules(Input::Leftovers { key, result }, now);
                }
                Output::ReadRootStart { unit, pid } => {
                    let census = self.account.begin(Work::Census, clock::now());
                    // Gone, or unreadable: the start stays unknown, as before this read.
                    let start_ticks = read_stat(pid).ok().flatten().map(|stat| stat.start_ticks);
                    let now = clock::now();
                    self.account.end(census, now);
                    self.rules(
                        Input::RootStart {
                            unit,
                            pid,
                            start_ticks,
                        },
                        now,
                    );
                }
                Output::ReadCgroup { key, cgroup } => {
                    let read = self.account.begin(Work::CgroupRead, clock::now());
                    let reading = self.cgroups.read_cgroup(&cgroup);
                    let now = clock::now();
                    self.account.end(read, now);
                    self.account.input();
                    self.rules(Input::CgroupRead { key, reading }, now);
                }
                Output::TakeExitRecord { key, run_dir, name } => {
                    let record = read_exit_record(&run_dir, &name);
                    self.records_to_remove.push((run_dir, name));
                    self.account.input();
                    self.rules(Input::ExitRecord { key, record }, clock::now());
                }
                Output::RemoveLaunchFile { unit, path } => {
                    // unlink never follows the final component: a symlink is removed, never
                    // what it points to.
                    match std::fs::remove_file(&path) {
                        Ok(()) => {
                            log::info!(unit = unit.as_str(); "{unit}: removed {}", path.display())
                        }
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => {
                            log::warn!(unit = unit.as_str(); "{unit}: remove {}: {e}", path.display())
                        }
                    }
                }
                // At 100,000 watches the list is tens of MB: it is written as the client reads.
                // An answer to `watch` or `unwatch` promises that what was saved before it
                // survives any crash: it waits for the sync. Nothing else does, a proof
                // included (see ARCHITECTURE.md, "What is written before whom").
                Output::Reply {
                    answer: Answer::Watch(_) | Answer::Done | Answer::Unwatched(_),
                    ..
                } if !self.sync_state(clock::now()) => {}
                Output::Reply {
                    to,
                    answer: Answer::Units(views),
                } => {
                    let tell = self.account.begin(Work::Tell, clock::now());
                    let reply = list_reply(to.id, views);
                    self.server
                        .send_streamed(self.poll.registry(), to.client, reply);
                    self.account.end(tell, clock::now());
                }
                Output::Reply { to, mut answer } => {
                    let tell = self.account.begin(Work::Tell, clock::now());
                    if let Answer::Status(status) | Answer::StillRunning(status) = &mut answer {
                        remaining::add_remaining(&self.cgroup_root, status);
                        status.systemd_error = self.systemd_error();
                    }
                    let line = answer_line(to.id, answer, |core| self.stats(core));
                    self.server.send(self.poll.registry(), to.client, &line);
                    self.account.end(tell, clock::now());
                }
                Output::Broadcast { clients, event } => {
                    let tell = self.account.begin(Work::Tell, clock::now());
                    match event_line(&event) {
                        Ok(line) => {
                            // Told once the last write's own work is done: a write wakes its
                            // subscriber, which may take the loop's CPU before the write
                            // returns; that wait is the subscriber's, with the proof in its
                            // socket already, so the write counts by the CPU time it took.
                            let mut written = clock::now();
                            for client in clients {
                                let (at, cpu_ns) = (clock::now(), clock::thread_cpu_ns());
                                self.server.send(self.poll.registry(), client, &line);
                                let took = clock::thread_cpu_ns().saturating_sub(cpu_ns);
                                written = at + Duration::from_nanos(took);
                            }
                            self.account.proof_told(written);
                        }
                        Err(e) => log::error!("{}: encode the proof event: {e}", event.unit),
                    }
                    self.account.end(tell, clock::now());
                }
                Output::Log { level, line, about } => {
                    let log = self.account.begin(Work::Log, clock::now());
                    match about {
                        None => log::log!(level, "{line}"),
                        Some(about) => log::log!(
                            level,
                            unit = about.unit.as_str(),
                            invocation = about.invocation.as_str(),
                            cause = about.cause.map_or("", crate::control::wire::Cause::name);
                            "{line}"
                        ),
                    }
                    self.account.end(log, clock::now());
                }
                Output::Save(save) => {
                    if let Some(store) = &mut self.state_store {
                        let started = clock::now();
                        let timed = self.account.begin(Work::Save, started);
                        let (what, watches) = match &*save {
                            StateSave::Snapshot(state) => ("a snapshot of", state.watches.len()),
                            StateSave::Changes(changes) => {
                                ("changes of", changes.watches.len() + changes.removed.len())
                            }
                        };
                        let saved = store.save(*save);
                        let now = clock::now();
                        self.account.end(timed, now);
                        match saved {
                            Ok(bytes) => log::debug!(
                                "saved {what} {watches} watches ({bytes} bytes) in {} us",
                                now.saturating_duration_since(started).as_micros()
                            ),
                            Err(e) => self.save_failed = Some(e),
                        }
                    }
                    self.remove_taken_records();
                }
            }
        }
        if self.save_failed.is_none() {
            self.remove_taken_records();
        }
    }

    /// Removes the exit records read for proofs: after the save holding them is written, so
    /// that an agent killed in between finds either the record or the proof that holds it.
    fn remove_taken_records(&mut self) {
        for (run_dir, name) in self.records_to_remove.drain(..) {
            if let Err(e) = remove_beneath(&run_dir, name.as_str()) {
                log::warn!("remove the exit record: {e}");
            }
        }
    }

    /// Makes every save so far durable on disk, if one is not; `false` if that failed (the
    /// agent then stops, carrying out nothing more).
    fn sync_state(&mut self, now: Instant) -> bool {
        if self.save_failed.is_some() {
            return false;
        }
        let Some(store) = self.state_store.as_mut().filter(|s| s.unsynced()) else {
            return true;
        };
        let timed = self.account.begin(Work::Sync, now);
        let synced = store.sync();
        self.account.end(timed, clock::now());
        match synced {
            Ok(_) => true,
            Err(e) => {
                self.save_failed = Some(e);
                false
            }
        }
    }

    fn take_completions(&mut self) {
        loop {
            let next = {
                let mut queue = self
                    .completions
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let next = queue.pop_front();
                if next.is_none() {
                    crate::memory::shrink_when_drained(&mut queue);
                }
                next
            };
            let Some(completion) = next else { break };
            match completion {
                Completion::Signal { epoch, message } => {
                    if epoch == self.bus_epoch {
                        self.on_signal(&message);
                    }
                }
                Completion::SignalsEnded { epoch } => {
                    if epoch == self.bus_epoch {
                        self.bus_lost("the bus connection closed");
                    }
                }
                Completion::OwnerChanged { epoch, new_owner } => {
                    self.on_owner_changed(epoch, &new_owner);
                }
                Completion::Connected { epoch, result } => self.on_reconnect(epoch, result),
                Completion::Read { epoch, key, result } => {
                    // A reply of a lost connection is no fact: its serials mean nothing now.
                    if epoch == self.bus_epoch {
                        let result = result.map_err(|e| e.to_string());
                        self.input(Input::UnitRead { key, result });
                    }
                }
                Completion::Started {
                    reply,
                    unit,
                    result,
                } => {
                    let result = result.map_err(|e| match e {
                        StartError::NotFound(message) => (ErrorKind::NotFound, message),
                        StartError::Failed(message) => (ErrorKind::Internal, message),
                    });
                    self.input(Input::UnitStarted {
                        reply,
                        unit,
                        result,
                    });
                }
                Completion::Stopped {
                    key,
                    unit,
                    kind,
                    result,
                } => {
                    if let Err(e) = &result {
                        log::warn!(unit = unit.as_str(); "{unit}: stop ({kind}): {e}");
                    }
                    let succeeded = result.is_ok();
                    self.input(Input::StopDone {
                        key,
                        kind,
                        succeeded,
                    });
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
        match signal::decode(message) {
            Ok(Some(signal)) => self.input(Input::Signal { serial, signal }),
            Ok(None) => {}
            Err(e) => log::warn!("{e}"),
        }
    }

    fn read_unit(&mut self, key: UnitKey, unit: String, kind: ReadKind, ours: Option<String>) {
        let Some(conn) = self.conn.clone() else {
            // The core reads nothing while the bus is down; a read racing a loss is dropped.
            return;
        };
        let queue = self.completions.clone();
        let epoch = self.bus_epoch;
        let systemd = self.systemd.clone();
        self.runtime
            .spawn(async move {
                let result = read::read_unit(&conn, &systemd, &unit, kind, ours.as_deref()).await;
                push(&queue, Completion::Read { epoch, key, result });
            })
            .detach();
    }

    fn start_unit(&mut self, reply: ReplyTo, unit: UnitName) {
        let Some(conn) = self.conn.clone().filter(|_| !self.systemd.is_empty()) else {
            let message = format!("start {unit}: systemd is not on the bus");
            self.input(Input::UnitStarted {
                reply,
                unit,
                result: Err((ErrorKind::Internal, message)),
            });
            return;
        };
        let queue = self.completions.clone();
        let systemd = self.systemd.clone();
        self.runtime
            .spawn(async move {
                let result = start::start_unit(&conn, &systemd, unit.as_str()).await;
                push(
                    &queue,
                    Completion::Started {
                        reply,
                        unit,
                        result,
                    },
                );
            })
            .detach();
    }

    fn stop_unit(&mut self, key: UnitKey, unit: String, kind: StopKind) {
        let Some(conn) = self.conn.clone() else {
            log::warn!(unit = unit.as_str(); "{unit}: stop ({kind}) not sent: the bus is down");
            self.input(Input::StopDone {
                key,
                kind,
                succeeded: false,
            });
            return;
        };
        let queue = self.completions.clone();
        let systemd = self.systemd.clone();
        self.runtime
            .spawn(async move {
                let result = manager::stop_unit(&conn, &systemd, &unit).await;
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

    /// Lists the cgroup's processes, keeps those that may be ours, and holds a pidfd for each
    /// that is still alive, in place of what was held for `key`.
    fn count_leftovers(
        &mut self,
        key: UnitKey,
        cgroup: &str,
        next: &NextInvocation,
        held: &[ProcessStart],
    ) -> Result<CountedLeftovers, String> {
        let basis = ClockBasis::now(self.core.offset_floors()).map_err(|e| e.to_string())?;
        let Census {
            processes: census,
            vanished,
        } = list_processes(&self.cgroup_root, cgroup).map_err(|e| e.to_string())?;
        log::debug!(
            "{cgroup}: counting leftovers among {:?} ({vanished} vanished) against {next:?}",
            census
                .iter()
                .map(|p| (p.pid, p.ppid, p.start_ticks))
                .collect::<Vec<_>>()
        );
        let registry = self.poll.registry();
        self.leftovers.untrack_key(registry, key);
        let mut counted = CountedLeftovers {
            vanished,
            ..CountedLeftovers::default()
        };
        let listed = census.iter().map(|p| p.pid).collect();
        for process in earlier_processes(&census, next, &basis, held) {
            let start = ProcessStart::held_in(process, &listed);
            match self
                .leftovers
                .track(registry, key, process.pid, process.start_ticks)
            {
                Ok(Tracked::Alive) => counted.held.push(start),
                Ok(Tracked::AlreadyExited) => counted.exited.push(start),
                Err(e) => {
                    self.leftovers.untrack_key(registry, key);
                    return Err(e.to_string());
                }
            }
        }
        Ok(counted)
    }

    fn take_cgroup_notices(&mut self) {
        let mut notices = Vec::new();
        if let Err(e) = self.cgroups.drain(&mut notices) {
            log::error!("{e}");
        }
        for notice in notices {
            let input = match notice {
                Notice::Changed(key) => Input::CgroupChanged { key },
                Notice::Lost(key) => Input::InotifyWatchLost { key },
                Notice::Overflow => {
                    self.counters.inotify_overflows += 1;
                    Input::CgroupOverflow
                }
            };
            self.input(input);
        }
    }

    /// The agent's figures, from the core's.
    fn stats(&self, core: self::core::CoreStats) -> AgentStats {
        AgentStats::new(
            core,
            self.counters,
            self.cgroups.watch_count(),
            journald_dropped(),
            self.systemd_error(),
            self.account.stats(),
        )
    }

    /// Why systemd is not heard now, for `status` and `stats`.
    fn systemd_error(&self) -> Option<String> {
        self.unheard.as_ref().map(|unheard| unheard.why.clone())
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
        if self.release_heap.is_some_and(|at| at <= now) {
            self.release_heap = None;
            let trim = self.account.begin(Work::Trim, now);
            crate::memory::trim_free_heap();
            self.account.end(trim, clock::now());
        }
        if let Some(mut metrics) = self.metrics.take() {
            metrics.refresh_if_due(now, || self.stats(self.core.stats()));
            self.metrics = Some(metrics);
        }
    }
}

/// Records the CLI's journald logger dropped; none where the library runs under another logger.
fn journald_dropped() -> u64 {
    #[cfg(feature = "cli")]
    return crate::journald::dropped();
    #[cfg(not(feature = "cli"))]
    0
}

/// The line answering a caller, its payload one of the wire types the client reads; `stats`
/// completes the core's figures with the driver's.
fn answer_line(
    id: Option<crate::control::protocol::RequestId>,
    answer: Answer,
    stats: impl FnOnce(self::core::CoreStats) -> AgentStats,
) -> String {
    let response = match answer {
        Answer::Done => Response::ok(id, wire::Done {}),
        Answer::Watch(view) => Response::ok(id, wire::WatchAnswer { watch: *view }),
        Answer::Event(answer) => Response::ok(id, *answer),
        Answer::Units(units) => Response::ok(id, wire::ListAnswer { units }),
        Answer::Unwatched(unwatched) => Response::ok(id, wire::UnwatchedAnswer { unwatched }),
        Answer::Version(version) => Response::ok(id, wire::VersionAnswer { version }),
        Answer::Stats(core) => Response::ok(
            id,
            wire::StatsAnswer {
                stats: stats(*core),
            },
        ),
        Answer::Status(status) => Response::ok(id, wire::StatusAnswer { status: *status }),
        Answer::StillRunning(status) => Response::error(
            id,
            ErrorKind::StillRunning,
            self::core::still_running_message(&status),
        ),
        Answer::Error(kind, message) => Response::error(id, kind, message),
    };
    response.to_line()
}

/// Reads the advisory exit record once; it is removed once the proof is written, as it must
/// never count for a later invocation. A record that cannot be read words the proof as having
/// none.
fn read_exit_record(
    run_dir: &std::path::Path,
    name: &RecordName,
) -> Option<crate::exit::record::ExitRecord> {
    match read_record(run_dir, name) {
        Ok(record) => record,
        Err(e) => {
            log::info!("no exit record: {e}");
            None
        }
    }
}

/// This boot's id, or `None` (said once) if the kernel does not tell.
fn boot_id() -> Option<String> {
    match std::fs::read_to_string(BOOT_ID_PATH) {
        Ok(text) => Some(text.trim().to_owned()),
        Err(e) => {
            log::warn!("{BOOT_ID_PATH}: {e}: a reboot will not be recognised in the state file");
            None
        }
    }
}

//! The agent's rules as one pure state machine: the watch registry, the merge of systemd's
//! signals and reads, reloads and bus losses, the request rules, retention, the release of a
//! generation's files, and what must be saved. Each watched unit's decision is its own
//! [`UnitProof`]; this layer decides what each proof is told and what its outputs become.
//!
//! It does no I/O and never reads the clock. Every input goes in with `now` through
//! [`Core::handle_input`] and [`Core::handle_timeout`]; every action comes out of
//! [`Core::poll_output`], and [`Core::poll_timeout`] says when the core next wants the time.
//! After every input the driver drains `poll_output` until it returns `None`.
//!
//! Four outputs are *synchronous*: [`Output::AddInotifyWatches`], [`Output::ReadCgroup`],
//! [`Output::CountLeftovers`] and [`Output::TakeExitRecord`]. The driver carries each out when
//! it drains it and hands the result straight back ([`Input::InotifyWatchesAdded`],
//! [`Input::CgroupRead`], [`Input::Leftovers`], [`Input::ExitRecord`]) before any other input,
//! so a reading is never older than the state that asked for it.
//!
//! Driver contract for saves: [`Output::Save`] is written before the next output is carried
//! out (an agent killed after it finds it at its restart), or nothing after it is carried out
//! at all (the real driver stops; a restart resumes from the last save); an answer after it
//! ([`Output::Reply`]) goes out only once it is durable on disk (against a crash of the
//! machine too). A save is a change set of one turn, or a snapshot of everything at
//! start and whenever the driver asks ([`Core::save_snapshot`], to compact its journal).
//!
//! Driver contract for the bus: [`Input::BusUp`] after every (re)connection and subscription;
//! [`Input::BusLost`] when the connection or systemd behind it goes away (a new owner of
//! systemd's name); and never a read reply of a connection older than the last `BusUp`.

mod control_group;
mod event;
mod facts;
mod names;
mod persist;
mod proven;
mod read_queue;
mod requests;
pub(crate) mod stats;
mod status;
mod systemd;
#[cfg(test)]
mod tests;
mod unheard;
mod waiters;
mod watch;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

pub(crate) use crate::cgroup::procs::{NextInvocation, ProcessStart};
pub(crate) use crate::control::wire::CoreStats;
pub(crate) use crate::control::wire::EventAnswer;
pub(crate) use crate::control::wire::{RemainingProcess, UnitStatus};
pub(crate) use event::{ProofEvent, WatchView};
use names::NameIndex;
use persist::Unsaved;
pub(crate) use status::{MAX_REMAINING, still_running_message};
use waiters::Waiters;
use watch::{Heard, Watch, Watches};

use crate::cgroup::CgroupReading;
use crate::cgroup::procs::OffsetFloors;
use crate::control::ClientId;
use crate::control::protocol::{ErrorKind, Request, RequestId, Version};
use crate::exit::record::ExitRecord;
use crate::memory::{shrink_when_drained, shrink_when_sparse};
use crate::proof::{Input as ProofInput, StopReason, UnitProof};
use crate::record_name::RecordName;
use crate::systemd::signal::SystemdSignal;
use crate::systemd::snapshot::{ReadKind, UnitSnapshot};
use crate::unit_name::UnitName;

pub(crate) use super::saved::{AgentState, ChangeSet, StateSave};

/// Identifies a watch for its whole life; never reused, so a late answer for a unit that was
/// unwatched and watched again cannot land on the new watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct UnitKey(u64);

/// Why the core asks for a StopUnit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StopKind {
    /// The proof asked for it (a stop requested by a client, or a foreign invocation).
    Proof(StopReason),
    /// The final stop of a proven generation, so the control side removes its files.
    FinalGeneration,
}

impl std::fmt::Display for StopKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StopKind::Proof(StopReason::Requested) => "requested",
            StopKind::Proof(StopReason::Foreign) => "foreign invocation",
            StopKind::FinalGeneration => "final stop of the generation",
        })
    }
}

/// A caller to answer once: its client and the id of its request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReplyTo {
    pub client: ClientId,
    pub id: Option<RequestId>,
}

/// What a caller is answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Success with nothing to say (`unwatch`, `events`).
    Done,
    /// The watch as it stands (`watch`).
    Watch(Box<WatchView>),
    /// The proof, and what became of the unit since (`wait`, `stop`).
    Event(Box<EventAnswer>),
    /// Every watch, sorted by unit (`list`).
    Units(Vec<WatchView>),
    /// The units whose proven watches `unwatch` with `proven` forgot, sorted.
    Unwatched(Vec<String>),
    /// The protocol's and the agent's versions (`version`).
    Version(Version),
    /// The core's figures (`stats`); the driver adds its own.
    Stats(Box<CoreStats>),
    /// One watch (`status`); the driver lists the processes that block it.
    Status(Box<UnitStatus>),
    /// A `wait` or `stop` past its deadline, unproven: the `still-running` error, which the
    /// driver words with [`still_running_message`] once it has counted what blocks the proof.
    StillRunning(Box<UnitStatus>),
    Error(ErrorKind, String),
}

/// Everything that happens to the agent.
#[derive(Clone, Debug)]
pub(crate) enum Input {
    Request {
        client: ClientId,
        request: Request,
    },
    ClientClosed {
        client: ClientId,
    },
    /// A connection to the bus is up and subscribed to systemd's signals.
    BusUp,
    /// The connection, or systemd behind it, is gone: every fact of it is void.
    BusLost,
    /// A signal from systemd, with its message serial.
    Signal {
        serial: u32,
        signal: SystemdSignal,
    },
    /// The answer to [`Output::ReadUnit`].
    UnitRead {
        key: UnitKey,
        result: Result<UnitSnapshot, String>,
    },
    /// The answer to [`Output::StartUnit`]: the invocation the start job began, or why there
    /// is none to watch.
    UnitStarted {
        reply: ReplyTo,
        unit: UnitName,
        result: Result<String, (ErrorKind, String)>,
    },
    /// The answer to [`Output::StopUnit`].
    StopDone {
        key: UnitKey,
        kind: StopKind,
        succeeded: bool,
    },
    /// The synchronous answer to [`Output::AddInotifyWatches`].
    InotifyWatchesAdded {
        key: UnitKey,
        result: Result<(), String>,
    },
    /// The synchronous answer to [`Output::ReadCgroup`].
    CgroupRead {
        key: UnitKey,
        reading: CgroupReading,
    },
    /// inotify says the unit's cgroup may have changed: a hint to read it.
    CgroupChanged {
        key: UnitKey,
    },
    /// The kernel dropped a watch of the unit's cgroup (`IN_IGNORED`).
    InotifyWatchLost {
        key: UnitKey,
    },
    /// inotify dropped events (`IN_Q_OVERFLOW`): any cgroup may have changed unseen.
    CgroupOverflow,
    /// The synchronous answer to [`Output::CountLeftovers`]: what it found, or why nothing
    /// could be counted.
    Leftovers {
        key: UnitKey,
        result: Result<CountedLeftovers, String>,
    },
    /// The synchronous answer to [`Output::ReadRootStart`]: the start (clock ticks since boot)
    /// of the process `pid` is now, `None` if it is gone or cannot be read.
    RootStart {
        unit: String,
        pid: i32,
        start_ticks: Option<u64>,
    },
    /// A process counted by [`Output::CountLeftovers`] exited.
    LeftoverExited {
        key: UnitKey,
        pid: i32,
    },
    /// The synchronous answer to [`Output::TakeExitRecord`]: the record, if it could be read.
    ExitRecord {
        key: UnitKey,
        record: Option<ExitRecord>,
    },
}

/// What a count of leftovers ([`Output::CountLeftovers`]) found: the processes that may be
/// ours, each with its start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CountedLeftovers {
    /// Those now held (a pidfd each) until they exit.
    pub held: Vec<ProcessStart>,
    /// Those that exited before a pidfd could hold them.
    pub exited: Vec<ProcessStart>,
    /// How many processes the census listed were gone before their start could be read,
    /// whoever's they were.
    pub vanished: usize,
}

impl CountedLeftovers {
    /// Whether a process of the census exited while it was taken: what it forked after the
    /// listing is not in it, so a count that holds nothing proves nothing.
    fn missed_forks(&self) -> bool {
        !self.exited.is_empty() || self.vanished > 0
    }
}

/// Everything the driver must do.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Output {
    /// Read the unit's state and cgroup path (`GetUnit` or `LoadUnit`, as `kind` says, then
    /// its properties); answer with [`Input::UnitRead`]. `ours`: the watch's invocation, if
    /// known: when no unit is loaded by that name, the unit running it is read.
    ReadUnit {
        key: UnitKey,
        unit: String,
        kind: ReadKind,
        ours: Option<String>,
    },
    /// Start the unit (StartUnit) and learn the invocation its start job began; answer with
    /// [`Input::UnitStarted`].
    StartUnit { reply: ReplyTo, unit: UnitName },
    /// Issue StopUnit; answer with [`Input::StopDone`].
    StopUnit {
        key: UnitKey,
        unit: String,
        kind: StopKind,
    },
    /// (Re)build the inotify watches of this cgroup for `key` (synchronous).
    AddInotifyWatches { key: UnitKey, cgroup: String },
    /// Drop every kernel watch held for `key`: its inotify watches and the pidfds of its
    /// leftovers.
    DropKernelHandles { key: UnitKey },
    /// Count the processes in this cgroup and below that are not certainly `next`'s, hold a
    /// pidfd for each, and answer with their pids and starts (synchronous,
    /// [`Input::Leftovers`]); report
    /// each one's exit later with [`Input::LeftoverExited`]. Replaces what was held for `key`.
    CountLeftovers {
        key: UnitKey,
        cgroup: String,
        next: NextInvocation,
        /// The processes counted as earlier before, with their starts, so their children count
        /// so too.
        held: Vec<ProcessStart>,
    },
    /// systemd named `pid` a MainPID or ControlPID of `unit` (its own name) for the first time:
    /// read its start now (field 22 of `/proc/PID/stat`, synchronous, [`Input::RootStart`]),
    /// while it may still live. A root gone before any count saw it is judged by that start:
    /// systemd's guess of a leftover as a later MainPID (`unit_search_main_pid`) started
    /// before that invocation began.
    ReadRootStart { unit: String, pid: i32 },
    /// Read `cgroup.events` of this cgroup now (synchronous).
    ReadCgroup { key: UnitKey, cgroup: String },
    /// Read the advisory exit record `name` beneath `run_dir` once, and remove it
    /// (synchronous).
    TakeExitRecord {
        key: UnitKey,
        run_dir: PathBuf,
        name: RecordName,
    },
    /// Remove a generation's launch file (never following a final symlink).
    RemoveLaunchFile { unit: String, path: PathBuf },
    /// Answer one caller.
    Reply { to: ReplyTo, answer: Answer },
    /// Send a proof event to every subscriber listed.
    Broadcast {
        clients: Vec<ClientId>,
        event: Box<ProofEvent>,
    },
    Log {
        level: log::Level,
        line: String,
        /// The unit the line is about, for structured logging (journald fields).
        about: Option<Box<LogSubject>>,
    },
    /// Write this (a turn's changes, or the whole state) before carrying out any output after
    /// it, and make it durable on disk before any answer after it: those may promise that it
    /// is saved (a proof told, the release of a proven generation; answers to `watch` and
    /// `unwatch`, against a crash of the machine too). A driver that cannot save must carry out
    /// nothing after it.
    Save(Box<StateSave>),
}

/// The unit a log line is about: the watch's name, our invocation (empty while unknown), and
/// for the line of a proof, its cause.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LogSubject {
    /// The unit's name as the client watches it (`EXITPROOF_UNIT`).
    pub unit: String,
    /// Our invocation's ID, empty while unknown (`EXITPROOF_INVOCATION`).
    pub invocation: String,
    /// The proof's cause, on the line of a proof (`EXITPROOF_CAUSE`).
    pub cause: Option<crate::control::wire::Cause>,
}

/// How the core behaves.
#[derive(Clone, Debug)]
pub(crate) struct CoreConfig {
    /// How many proven units stay listed at most; the oldest leave first.
    pub retain_proven: usize,
    /// How long a proven unit stays listed at most.
    pub retain_for: Duration,
    /// How often every unit is read again as a safety net (`None`: never).
    pub resync_interval: Option<Duration>,
    /// Unit reads in flight at once: a burst of watches is read a window at a time, which
    /// bounds the replies held in memory.
    pub max_reads_in_flight: usize,
    /// This boot's id; a restored watch saved under another boot is proven at once.
    pub boot_id: Option<String>,
    /// An instant and the CLOCK_MONOTONIC nanoseconds at it, so proofs carry a timestamp
    /// other processes can compare without the core reading the clock.
    pub clock_anchor: (Instant, u64),
}

/// The least time between two saves: each is a write and a sync of the journal.
pub(crate) const SAVE_INTERVAL: Duration = Duration::from_millis(100);
/// The first wait before a unit whose read or cgroup watch failed is read again.
const RETRY_FIRST: Duration = Duration::from_millis(200);
/// The longest wait between two such reads.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// The agent's rules.
pub(crate) struct Core {
    config: CoreConfig,
    outputs: VecDeque<Output>,
    units: Watches,
    /// Watches by the name the client used: one a name.
    by_name: NameIndex,
    /// Makes the watches' control groups out of pieces they share.
    control_groups: control_group::ControlGroups,
    /// Watches by systemd's own name for the unit (differs from the client's for an alias),
    /// which names it in signals too (its object path escapes it).
    by_id: NameIndex,
    /// Each unit's next timer (its proof's retry, or a read retry).
    timers: BTreeSet<(Instant, UnitKey)>,
    waiters: Waiters<UnitKey, ReplyTo>,
    subscribers: BTreeSet<ClientId>,
    proven_order: VecDeque<(Instant, UnitKey)>,
    /// Every (unit, generation) ever watched: generation numbers are never reused.
    generations: HashSet<(String, u64)>,
    next_key: u64,
    bus_up: bool,
    /// Since when systemd reloads: between `Reloading(true)` and `Reloading(false)`.
    reloading: Option<Instant>,
    /// Bumped whenever facts seen before may be stale (reload, bus lost or back): a read
    /// started in an older epoch does not make a unit's facts fresh.
    fact_epoch: u32,
    reads_in_flight: usize,
    read_queue: read_queue::ReadQueue,
    next_resync: Option<Instant>,
    unsaved: Unsaved,
    /// A snapshot was saved in this life of the agent: change sets follow one (the driver
    /// starts a new journal with it), so the first save of a life is always a snapshot.
    snapshot_saved: bool,
    /// What the saves so far add up to, checked against the watch set at every save.
    #[cfg(test)]
    saved_mirror: Option<AgentState>,
    last_save: Option<Instant>,
    save_due: Option<Instant>,
    /// Answers that promise a change of the watch set (`watch`, `unwatch`): held until the
    /// change is saved, so an agent killed in between has promised nothing it forgot.
    replies_when_saved: Vec<(ReplyTo, Answer)>,
    /// Watches a `stop` made for the invocation running after a proven one, with the proven
    /// invocation, until their proof is answered; kept here, not in every watch, as few have
    /// one.
    moved_on: HashMap<UnitKey, String>,
    /// Signals no watch heard while a watch waited for the read that names its unit.
    unheard: unheard::Unheard,
    counters: stats::Counters,
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC, as the driver last read it: a proof's wall-clock
    /// time, to match it with the journal. Read afresh each turn, so a clock step since the
    /// start does not shift it.
    wall_minus_mono_ns: Option<i128>,
    /// How long the machine had been suspended, at least, from instants the driver noted it
    /// (each turn); saved, so a count after a restart places a start before a suspend the
    /// agent slept through as this life would have.
    offset_floors: OffsetFloors,
}

impl Core {
    /// A core taking up `restored`, the state of a previous run. Nothing is read until
    /// [`Input::BusUp`].
    pub(crate) fn new(config: CoreConfig, restored: AgentState, now: Instant) -> Core {
        let next_resync = config.resync_interval.map(|every| now + every);
        let mut core = Core {
            config,
            outputs: VecDeque::new(),
            units: Watches::default(),
            by_name: NameIndex::new(|watch| &watch.unit),
            by_id: NameIndex::new(|watch| &watch.id),
            control_groups: control_group::ControlGroups::default(),
            timers: BTreeSet::new(),
            waiters: Waiters::default(),
            subscribers: BTreeSet::new(),
            proven_order: VecDeque::new(),
            generations: HashSet::new(),
            next_key: 0,
            bus_up: false,
            reloading: None,
            fact_epoch: 0,
            reads_in_flight: 0,
            read_queue: read_queue::ReadQueue::default(),
            next_resync,
            unsaved: Unsaved::default(),
            snapshot_saved: false,
            #[cfg(test)]
            saved_mirror: None,
            last_save: None,
            save_due: None,
            replies_when_saved: Vec::new(),
            moved_on: HashMap::new(),
            unheard: unheard::Unheard::default(),
            counters: stats::Counters::default(),
            wall_minus_mono_ns: None,
            offset_floors: OffsetFloors::default(),
        };
        core.restore(restored, now);
        core
    }

    /// The wall clock's offset from CLOCK_MONOTONIC now (realtime minus monotonic, in
    /// nanoseconds), which the driver reads at each turn of its loop.
    pub(crate) fn observe_wall_clock(&mut self, wall_minus_mono_ns: i128) {
        self.wall_minus_mono_ns = Some(wall_minus_mono_ns);
    }

    /// The time suspended so far (CLOCK_BOOTTIME minus CLOCK_MONOTONIC, in nanoseconds) at
    /// `mono_us` on CLOCK_MONOTONIC, which the driver reads at each turn of its loop; saved
    /// when it rose (after a suspend), which is rare.
    pub(crate) fn observe_suspended(&mut self, mono_us: u64, offset_ns: u64) {
        if self.offset_floors.note(mono_us, offset_ns) {
            self.unsaved.offset_floors();
        }
    }

    /// What the time suspended was seen to be at least, from instants before: for the
    /// driver's counts of leftovers ([`ClockBasis`](crate::cgroup::procs::ClockBasis)).
    pub(crate) fn offset_floors(&self) -> OffsetFloors {
        self.offset_floors
    }

    /// CLOCK_REALTIME at `at`, in microseconds since the epoch, if the driver said the offset.
    pub(super) fn realtime_us(&self, at: Instant) -> Option<u64> {
        let wall_ns = i128::from(self.mono_ns(at)) + self.wall_minus_mono_ns?;
        u64::try_from(wall_ns / 1000).ok()
    }

    /// Hands one input to the core.
    pub(crate) fn handle_input(&mut self, input: Input, now: Instant) {
        match input {
            Input::Request { client, request } => self.on_request(client, request, now),
            Input::ClientClosed { client } => {
                self.subscribers.remove(&client);
                self.waiters.take_where(|r| r.client == client);
            }
            Input::BusUp => self.on_bus_up(now),
            Input::BusLost => self.on_bus_lost(now),
            Input::Signal { serial, signal } => self.on_signal(serial, signal, now),
            Input::UnitRead { key, result } => self.on_unit_read(key, result, now),
            Input::UnitStarted {
                reply,
                unit,
                result,
            } => self.on_unit_started(reply, unit, result),
            Input::StopDone {
                key,
                kind,
                succeeded,
            } => self.on_stop_done(key, kind, succeeded, now),
            Input::InotifyWatchesAdded { key, result } => self.on_cgroup_watched(key, result, now),
            Input::CgroupRead { key, reading } => self.on_cgroup_read(key, reading, now),
            Input::CgroupChanged { key } => self.on_cgroup_changed(key, now),
            Input::InotifyWatchLost { key } => self.rebuild_cgroup_watch(key),
            Input::CgroupOverflow => {
                self.log(
                    log::Level::Warn,
                    "inotify queue overflowed: rebuilding every cgroup watch and reading again"
                        .to_owned(),
                );
                for key in self.unproven_keys() {
                    self.rebuild_cgroup_watch(key);
                }
            }
            Input::ExitRecord { key, record } => self.on_exit_record(key, record, now),
            Input::Leftovers {
                key,
                result: Ok(counted),
            } if counted.held.is_empty() && counted.missed_forks() => {
                self.on_census_raced(key, counted, now);
            }
            Input::Leftovers { key, result } => {
                let count = result.map(|counted| {
                    let count = counted.held.len();
                    if let Some(watch) = self.units.get_mut(&key) {
                        let changed = watch.hold_leftovers(counted.held);
                        for process in counted.exited {
                            watch.note_once_held(process);
                        }
                        if let Some(after_ours) = &mut watch.after_ours {
                            after_ours.census_raced = None;
                        }
                        if changed {
                            self.unsaved.unit(&watch.unit);
                        }
                    }
                    count
                });
                self.feed(key, ProofInput::Leftovers(count), now);
            }
            Input::RootStart {
                unit,
                pid,
                start_ticks: Some(start_ticks),
            } => {
                let start = ProcessStart {
                    pid,
                    start_ticks,
                    held_as: None,
                };
                // Proven watches too: a watch made later takes what they heard.
                for key in self.by_id.keys(&unit, &self.units) {
                    if let Some(watch) = self.units.get_mut(&key) {
                        watch.note_once_held(start);
                    }
                }
                self.unheard.note_start(&unit, start);
            }
            Input::RootStart {
                start_ticks: None, ..
            } => {}
            Input::LeftoverExited { key, pid } => {
                if let Some(watch) = self.units.get_mut(&key)
                    && let Some(leftovers) = &mut watch.leftovers
                    && let Some(exited) = leftovers.remove(&pid)
                {
                    let count = leftovers.len();
                    watch.note_once_held(exited);
                    self.unsaved.unit(&watch.unit);
                    if count == 0 {
                        // What it forked since the last count may be left: count again, with
                        // it still counted as ours so its children are too.
                        self.count_leftovers(key, &[exited], now);
                    } else {
                        self.feed(key, ProofInput::Leftovers(Ok(count)), now);
                    }
                }
            }
        }
    }

    /// A count held nothing, but its census saw a process exit: one that exited between the
    /// listing and its pidfd (the ExecStop='s waiter that forks a daemon and exits as the next
    /// invocation starts) may have forked what the census missed. So the count is made again
    /// at once, the exited counted as held so that their sessions are too; if that census saw
    /// an exit as well (processes that keep forking and exiting), the proof is told the count
    /// failed, and counts again after its backoff rather than in a loop within this turn.
    fn on_census_raced(&mut self, key: UnitKey, counted: CountedLeftovers, now: Instant) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        if watch.hold_leftovers(Vec::new()) {
            self.unsaved.unit(&watch.unit);
        }
        for &process in &counted.exited {
            watch.note_once_held(process);
        }
        let after_ours = watch.after_ours.get_or_insert_default();
        let raced_before = after_ours.census_raced.is_some();
        let raced = after_ours.census_raced.get_or_insert_default();
        for &process in &counted.exited {
            if !raced.contains(&process) {
                raced.push(process);
            }
        }
        if raced_before {
            let why = format!(
                "processes exited during two censuses in a row ({} before their pidfd, {} \
                 before their start was read): counting again",
                counted.exited.len(),
                counted.vanished
            );
            self.feed(key, ProofInput::Leftovers(Err(why)), now);
        } else {
            self.count_leftovers(key, &[], now);
        }
    }

    /// Lets time pass: fires every timer due at `now`.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        while let Some(&(at, key)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.remove(&(at, key));
            self.on_unit_timer(key, now);
        }
        for (key, reply) in self.waiters.take_expired(now) {
            // A waiter's watch outlives it: unwatching answers its waiters first.
            if let Some(status) = self.unit_status(key, now) {
                self.reply(reply, Answer::StillRunning(Box::new(status)));
            }
        }
        while let Some(&(at, key)) = self.proven_order.front() {
            if now.saturating_duration_since(at) < self.config.retain_for {
                break;
            }
            self.proven_order.pop_front();
            self.drop_watch(key);
        }
        if let (Some(at), Some(every)) = (self.next_resync, self.config.resync_interval)
            && at <= now
        {
            self.next_resync = Some(now + every);
            self.resync(now);
        }
        if self.save_due.is_some_and(|at| at <= now) {
            self.save_now(now);
        }
    }

    /// Ends a turn of the driver's loop: saves what changed, at most once per
    /// [`SAVE_INTERVAL`] (a later save is then due, and [`Core::poll_timeout`] says when).
    pub(crate) fn end_turn(&mut self, now: Instant) {
        if !self.unsaved.owed {
            return;
        }
        match self.last_save {
            Some(last) if now.saturating_duration_since(last) < SAVE_INTERVAL => {
                self.save_due = Some(last + SAVE_INTERVAL);
            }
            _ => self.save_now(now),
        }
    }

    /// Saves what changed now, if anything did (at shutdown, and before a generation's
    /// release).
    pub(crate) fn save_now(&mut self, now: Instant) {
        if !self.unsaved.owed {
            return;
        }
        if !self.snapshot_saved {
            // A proof made while taking up the saved state (a reboot's) is saved before its
            // release, and before the driver's first snapshot.
            self.save_snapshot(now);
            return;
        }
        self.unsaved.owed = false;
        self.last_save = Some(now);
        self.save_due = None;
        let changes = self.changes();
        if !changes.is_empty() {
            self.outputs
                .push_back(Output::Save(Box::new(StateSave::Changes(changes))));
        }
        self.send_replies_when_saved();
    }

    /// Saves the whole state now: at start, and when the driver compacts its journal.
    pub(crate) fn save_snapshot(&mut self, now: Instant) {
        self.unsaved = Unsaved::default();
        self.snapshot_saved = true;
        self.last_save = Some(now);
        self.save_due = None;
        let state = self.snapshot();
        #[cfg(test)]
        {
            self.saved_mirror = Some(state.clone());
        }
        self.outputs
            .push_back(Output::Save(Box::new(StateSave::Snapshot(state))));
        self.send_replies_when_saved();
    }

    fn send_replies_when_saved(&mut self) {
        for (to, answer) in std::mem::take(&mut self.replies_when_saved) {
            self.reply(to, answer);
        }
    }

    /// The next thing the driver must do, if any.
    pub(crate) fn poll_output(&mut self) -> Option<Output> {
        let output = self.outputs.pop_front();
        if output.is_none() {
            shrink_when_drained(&mut self.outputs);
        }
        output
    }

    /// When the core next wants [`Core::handle_timeout`].
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        [
            self.timers.first().map(|(at, _)| *at),
            self.waiters.next_deadline(),
            self.next_resync,
            self.save_due,
            self.proven_order
                .front()
                .map(|(at, _)| *at + self.config.retain_for),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The name a watch's client gave its unit (the simulator's oracle judges stops by it:
    /// the watch reads the unit by systemd's own name once a read found it).
    #[cfg(test)]
    pub(crate) fn client_name(&self, key: UnitKey) -> Option<&str> {
        self.units.get(&key).map(|watch| &*watch.unit)
    }

    /// The invocation a watch owns once its first read is done (the simulator's oracle
    /// asks, for a watch made without one).
    #[cfg(test)]
    pub(crate) fn adopted_invocation(&self, key: UnitKey) -> Option<&str> {
        let watch = self.units.get(&key)?;
        watch
            .proof
            .as_ref()
            .map(crate::proof::UnitProof::invocation)
    }

    fn new_key(&mut self) -> UnitKey {
        let key = UnitKey(self.next_key);
        self.next_key += 1;
        key
    }

    /// The keys of the watches `pred` picks, in a deterministic order, so a simulated run
    /// replays exactly from its seed.
    fn keys_where(&self, pred: impl Fn(&Watch) -> bool) -> Vec<UnitKey> {
        let mut keys: Vec<UnitKey> = self
            .units
            .iter()
            .filter(|(_, w)| pred(w))
            .map(|(k, _)| *k)
            .collect();
        // Each key once: the same order as a stable sort, with no scratch buffer.
        keys.sort_unstable();
        keys
    }

    fn unproven_keys(&self) -> Vec<UnitKey> {
        self.keys_where(|w| w.event.is_none())
    }

    /// Units whose facts matter: unproven ones, and proven ones with a stop still to send.
    fn live_keys(&self) -> Vec<UnitKey> {
        self.keys_where(|w| w.event.is_none() || w.unsent_stop.is_some())
    }

    fn log(&mut self, level: log::Level, line: String) {
        self.outputs.push_back(Output::Log {
            level,
            line,
            about: None,
        });
    }

    /// Logs a line about the unit of `key` (and the proof's `cause`), which carries it as fields.
    fn log_about(
        &mut self,
        key: UnitKey,
        cause: Option<crate::control::wire::Cause>,
        level: log::Level,
        line: String,
    ) {
        let about = self.units.get(&key).map(|watch| {
            Box::new(LogSubject {
                unit: watch.unit.to_string(),
                invocation: watch.our_invocation().unwrap_or_default().to_owned(),
                cause,
            })
        });
        // Named in the text too, not only as a field: a line on stderr is matched with
        // `journalctl _SYSTEMD_INVOCATION_ID=` by it.
        let line = match about.as_deref() {
            Some(about) if !about.invocation.is_empty() => {
                format!("{line} (invocation {})", about.invocation)
            }
            _ => line,
        };
        self.outputs.push_back(Output::Log { level, line, about });
    }

    fn reply(&mut self, to: ReplyTo, answer: Answer) {
        self.outputs.push_back(Output::Reply { to, answer });
    }

    /// Answers once the watch set as it is now has been saved (at the end of this turn, or
    /// when the save interval allows).
    fn reply_when_saved(&mut self, to: ReplyTo, answer: Answer) {
        self.unsaved.owed = true;
        self.replies_when_saved.push((to, answer));
    }

    /// Answers now if everything is saved, else once it is: an answer about a watch that
    /// changed since the last save (one made this turn, say) must not outrun that save.
    fn reply_saved(&mut self, to: ReplyTo, answer: Answer) {
        if self.unsaved.owed {
            self.replies_when_saved.push((to, answer));
        } else {
            self.reply(to, answer);
        }
    }

    /// Arms the unit's one timer at the earlier of its proof's deadline and its read retry.
    fn rearm(&mut self, key: UnitKey) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        let next = [
            watch.proof.as_ref().and_then(|p| p.poll_timeout()),
            watch.retry.as_deref().map(|(at, _)| *at),
        ]
        .into_iter()
        .flatten()
        .min();
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

    fn on_unit_timer(&mut self, key: UnitKey, now: Instant) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        watch.timer = None;
        if let Some(retry) = watch.retry.as_deref_mut()
            && retry.0 <= now
        {
            // The backoff is kept until a read succeeds, so a lasting failure backs off.
            retry.0 = now + Duration::from_secs(3600);
            self.read_unit(key);
        }
        if let Some(proof) = self.units.get_mut(&key).and_then(|w| w.proof.as_mut()) {
            proof.handle_timeout(now);
        }
        self.drive(key, now);
    }

    /// Arms a read of the unit again after a failed read or cgroup watch, with backoff.
    fn retry_later(&mut self, key: UnitKey, now: Instant) {
        if let Some(watch) = self.units.get_mut(&key) {
            let backoff = watch
                .retry
                .as_deref()
                .map_or(RETRY_FIRST, |(_, b)| (*b * 2).min(RETRY_MAX));
            watch.retry = Some(Box::new((now + backoff, backoff)));
        }
        self.rearm(key);
    }

    /// The safety net: read every unit's state and cgroup again. Proofs normally come from
    /// events; this exists for whatever an event could have missed.
    fn resync(&mut self, now: Instant) {
        self.end_reload_never_heard_to_end(now);
        let keys = self.unproven_keys();
        self.count_resync();
        self.log(
            log::Level::Debug,
            format!("safety-net relist of {} units", keys.len()),
        );
        for key in keys {
            self.read_unit(key);
            self.read_cgroup(key, now);
        }
    }

    /// inotify says the unit's cgroup changed: read it if the proof would use the reading. A
    /// read made for nothing is not free: while systemd removes cgroups, a read of a removed
    /// one can wait tens of milliseconds on the cgroup filesystem's lock, and a burst of
    /// deaths brings two notices per unit before its state is terminal.
    fn on_cgroup_changed(&mut self, key: UnitKey, now: Instant) {
        let wanted = self
            .units
            .get(&key)
            .and_then(|watch| watch.proof.as_ref())
            .is_some_and(UnitProof::wants_reading);
        if wanted {
            self.read_cgroup(key, now);
        }
    }

    /// Asks for a fresh reading of the unit's cgroup for its proof. A unit for which systemd
    /// reported no cgroup in a read no older than the state has none: that is systemd's fact,
    /// not a guess. One whose cgroup systemd last reported missing before the state changed
    /// is read again first: the cgroup may have been made since.
    fn read_cgroup(&mut self, key: UnitKey, now: Instant) {
        let Some(watch) = self.units.get(&key) else {
            return;
        };
        if watch.event.is_some() || watch.proof.is_none() {
            return;
        }
        if watch.has_no_cgroup() {
            self.feed(key, ProofInput::Cgroup(CgroupReading::Gone), now);
        } else if watch.control_group.is_empty() {
            // The read's answer feeds the state again, and the proof asks anew.
            self.read_unit(key);
        } else {
            let cgroup = watch.control_group.to_string();
            self.outputs.push_back(Output::ReadCgroup { key, cgroup });
        }
    }

    /// Asks for the unit's leftovers to be counted and followed. A unit with no cgroup has none
    /// (see [`Core::read_cgroup`] for when a missing cgroup is a fact).
    fn count_leftovers(&mut self, key: UnitKey, gone: &[ProcessStart], now: Instant) {
        let Some(watch) = self.units.get(&key) else {
            return;
        };
        if watch.has_no_cgroup() {
            self.feed(key, ProofInput::Leftovers(Ok(0)), now);
            return;
        }
        if watch.control_group.is_empty() {
            self.read_unit(key);
            return;
        }
        let cgroup = watch.control_group.to_string();
        let next = watch.later_invocations();
        let held = watch
            .leftovers
            .as_deref()
            .into_iter()
            .flat_map(|leftovers| leftovers.values())
            .chain(
                (watch.after_ours.as_deref())
                    .and_then(|a| a.census_raced.as_deref())
                    .into_iter()
                    .flatten(),
            )
            .chain(gone)
            .copied()
            .collect();
        self.outputs.push_back(Output::CountLeftovers {
            key,
            cgroup,
            next,
            held,
        });
    }

    /// Rebuilds the inotify watches of the unit's cgroup (they may have been dropped, or
    /// events lost), then reads it.
    fn rebuild_cgroup_watch(&mut self, key: UnitKey) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        if watch.event.is_some() || watch.proof.is_none() || watch.control_group.is_empty() {
            return;
        }
        watch.inotify_watches = watch::InotifyWatches::Rebuilding;
        let cgroup = watch.control_group.to_string();
        self.outputs
            .push_back(Output::AddInotifyWatches { key, cgroup });
    }

    fn on_cgroup_read(&mut self, key: UnitKey, reading: CgroupReading, now: Instant) {
        let reading = match (reading, self.units.get(&key)) {
            (CgroupReading::Gone, Some(watch)) if watch.runs_in_its_cgroup() => {
                let why = format!(
                    "not found where systemd says ({}) while it is {} ({})",
                    watch.control_group,
                    watch.facts.active_state().unwrap_or_default(),
                    watch.facts.sub_state().unwrap_or_default(),
                );
                let line = format!("{}: cgroup {why}", watch.unit);
                self.log_about(key, None, log::Level::Warn, line);
                CgroupReading::Unreadable(why)
            }
            (reading, _) => reading,
        };
        self.feed(key, ProofInput::Cgroup(reading), now);
        self.answer_watch_replies(key);
    }

    /// Answers the `watch` requests of a unit once its first read and reading are in, or it is
    /// proven.
    fn answer_watch_replies(&mut self, key: UnitKey) {
        if let Some(watch) = self.units.get_mut(&key)
            && (watch.proof.is_some() || watch.event.is_some())
            && !watch.watch_replies.is_empty()
        {
            let view = Box::new(watch.view());
            for to in std::mem::take(&mut watch.watch_replies) {
                self.reply_when_saved(to, Answer::Watch(view.clone()));
            }
        }
    }

    /// Hands one input to a unit's proof and carries out everything it asks for.
    fn feed(&mut self, key: UnitKey, input: ProofInput, now: Instant) {
        let Some(proof) = self.units.get_mut(&key).and_then(|w| w.proof.as_mut()) else {
            return;
        };
        proof.handle_input(input, now);
        let terminal = proof.terminal();
        if let Some(watch) = self.units.get_mut(&key)
            && terminal
            && watch.terminal_at.is_none()
        {
            watch.terminal_at = Some(now);
        }
        self.drive(key, now);
    }

    /// Feeds the unit's merged state to its proof, unless the facts are stale (a reload or
    /// a lost bus since they were read): then nothing is decided until a fresh read.
    fn feed_state(&mut self, key: UnitKey, now: Instant) {
        let Some(watch) = self.units.get(&key) else {
            return;
        };
        let Some(state) = watch.facts.state() else {
            return;
        };
        // What was said before a reload is no less true of the past.
        self.note_after_ours(key, &state.invocation);
        if self.units.get(&key).is_some_and(|watch| !watch.stale) {
            self.feed(key, ProofInput::State(state), now);
        }
    }

    /// Gathers what systemd says of an invocation after ours, for [`Core::count_leftovers`].
    /// Only once the facts can name no invocation before ours: from the first read on (they
    /// only move forward from a read, on this connection and the next), and for a watch taken
    /// up after a restart (ours began before this life), even while its proof waits for
    /// another read (one that found its unit under another name): for a watch that names its
    /// invocation, such a read on a connection since lost places the next connection's
    /// messages too, all sent after it. Before the first read of a new watch, a signal sent
    /// before ours began may name an earlier invocation.
    fn note_after_ours(&mut self, key: UnitKey, invocation: &str) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        let later = watch.facts.next_invocation();
        let past_ours = watch.proof.is_some()
            || watch.restored
            || watch.facts.read_in()
            || (watch.asked_invocation.is_some() && watch.facts.read_before_loss());
        if past_ours {
            self.absorb_after_ours(key, invocation, &later);
            return;
        }
        // Before the first read: kept until it tells whether this invocation is after ours.
        let Some(since) = watch.facts.invocation_since() else {
            return;
        };
        if later == NextInvocation::default() {
            return;
        }
        let after_ours = watch.after_ours.get_or_insert_default();
        match after_ours
            .unconfirmed
            .iter_mut()
            .find(|(of, ..)| of == invocation)
        {
            Some(entry) => *entry = (invocation.to_owned(), since, later),
            None => after_ours
                .unconfirmed
                .push((invocation.to_owned(), since, later)),
        }
    }

    /// The first read is in, stamped `serial`: what was heard before it of an invocation
    /// named in a message newer than it is of ours or a later one.
    pub(super) fn confirm_after_ours(&mut self, key: UnitKey, serial: u32) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        let Some(after_ours) = watch.after_ours.as_mut() else {
            return;
        };
        for (invocation, since, later) in std::mem::take(&mut after_ours.unconfirmed) {
            if since.wrapping_sub(serial) as i32 > 0 {
                self.absorb_after_ours(key, &invocation, &later);
            }
        }
    }

    /// Keeps what `later` tells of the processes of `invocation`, if it is not ours.
    pub(super) fn absorb_after_ours(
        &mut self,
        key: UnitKey,
        invocation: &str,
        later: &NextInvocation,
    ) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        let Some(ours) = watch
            .our_invocation()
            .filter(|ours| !ours.is_empty() && *ours != invocation)
        else {
            return;
        };
        // Our own roots, while the facts still hold them (systemd may name one again for this
        // invocation: a guess).
        let our_roots = watch.facts.roots_of(ours);
        if *later != NextInvocation::default() || !our_roots.is_empty() {
            let later_control = watch
                .facts
                .current_control_pid()
                .filter(|_| watch.facts.state().is_some_and(|s| s.invocation != ours));
            let known = &mut watch.after_ours.get_or_insert_default().known;
            known.absorb(later);
            known.note_counted_roots(&our_roots);
            // The ControlPID of the invocation the unit runs now, not ours, is that one's,
            // even if it was counted as ours before (`UnitFacts::forget_as_earlier`).
            if let Some(control) = later_control {
                known.counted_roots.retain(|pid| *pid != control);
            }
        }
    }

    /// A watch at its first read takes what it and the unit's other watches heard of its
    /// invocation and of the ones after it ([`Heard`]): one made after that invocation ended
    /// heard none of it itself, only what the facts it carried on hold (`watch_afresh`). systemd may guess a root of ours, a leftover, as a later invocation's MainPID
    /// (CI's random base, 245230654104363: a false proof, the guessed leftover's child taken
    /// for the later invocation's); and a later invocation's leftover, whose MainPID only an
    /// older watch heard named, would wait as ours (CI's base of 131da92, 240964879799085: a
    /// lost proof).
    fn gather_what_was_heard(&mut self, key: UnitKey) {
        let Some(watch) = self.units.get(&key) else {
            return;
        };
        let Some(ours) = watch.our_invocation().filter(|i| !i.is_empty()) else {
            return;
        };
        // Its own facts add only the invocations they place after ours: the starts it knows
        // and the roots named for ours are its own already.
        let own = Heard {
            after_ours: watch.facts.known_after(ours),
            ..Heard::default()
        };
        let siblings = self
            .by_id
            .keys(&watch.id, &self.units)
            .filter(|other| *other != key)
            .filter_map(|other| self.units.get(&other))
            .map(|sibling| sibling.heard_of(ours));
        let heard: Vec<Heard> = std::iter::once(own).chain(siblings).collect();
        for heard in heard {
            self.take_heard(key, heard);
        }
    }

    /// Keeps what another watch of the unit heard ([`Watch::heard_of`]) for `key`'s counts.
    fn take_heard(&mut self, key: UnitKey, heard: Heard) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        if !heard.roots_of_ours.is_empty() {
            let known = &mut watch.after_ours.get_or_insert_default().known;
            known.note_counted_roots(&heard.roots_of_ours);
        }
        for start in heard.starts {
            watch.note_once_held(start);
        }
        for (invocation, later) in &heard.after_ours {
            self.absorb_after_ours(key, invocation, later);
        }
    }

    /// A late signal (handled after a read that told a later invocation) said the MainPID or
    /// ControlPID of an invocation in between: gathered as for any invocation after ours.
    pub(super) fn note_late_roots(&mut self, key: UnitKey) {
        let Some(watch) = self.units.get_mut(&key) else {
            return;
        };
        if let Some((invocation, roots)) = watch.facts.take_late_roots() {
            self.absorb_after_ours(key, &invocation, &roots);
        }
    }

    fn drive(&mut self, key: UnitKey, now: Instant) {
        use crate::proof::Output as ProofOutput;
        loop {
            let Some(watch) = self.units.get_mut(&key) else {
                return;
            };
            let proven = watch.event.is_some();
            let Some(proof) = watch.proof.as_mut() else {
                return;
            };
            let Some(output) = proof.poll_output() else {
                break;
            };
            // Proven by another watch of the same invocation: this machine decides nothing
            // more (its own proof would be a second one, its stop one after the proof).
            if proven {
                continue;
            }
            match output {
                ProofOutput::ReadCgroup => self.read_cgroup(key, now),
                ProofOutput::CountLeftovers => self.count_leftovers(key, &[], now),
                ProofOutput::StopUnit(reason) => self.stop(key, StopKind::Proof(reason)),
                ProofOutput::Log(level, line) => {
                    let line = format!("{}: {line}", watch.unit);
                    self.log_about(key, None, to_log_level(level), line);
                }
                ProofOutput::Proven(proof) => self.on_proof(key, proof, now),
            }
        }
        self.rearm(key);
    }

    /// Drops a watch and everything it holds.
    fn drop_watch(&mut self, key: UnitKey) {
        let Some((unit, id)) = self
            .units
            .get(&key)
            .map(|watch| (Rc::clone(&watch.unit), Rc::clone(&watch.id)))
        else {
            return;
        };
        // Out of the indexes while the watch is there to read its names from.
        self.by_name.remove(&unit, key, &self.units);
        self.by_id.remove(&id, key, &self.units);
        let Some(watch) = self.units.remove(&key) else {
            return;
        };
        self.unsaved.unit(&watch.unit);
        if watch.event.is_none() {
            self.outputs.push_back(Output::DropKernelHandles { key });
        }
        if let Some(at) = watch.timer {
            self.timers.remove(&(at, key));
        }
        self.read_queue.remove(key);
        self.unheard.named(key);
        self.proven_order.retain(|(_, k)| *k != key);
        if self.moved_on.remove(&key).is_some() {
            shrink_when_sparse(&mut self.moved_on);
        }
    }

    /// The answer to `wait` and `stop` once the watch of `key` is proven: its proof, what
    /// systemd runs now if another invocation, and the proven one a `stop` moved on from.
    fn event_answer(&self, key: UnitKey, event: ProofEvent) -> Answer {
        let watch = self.units.get(&key);
        Answer::Event(Box::new(EventAnswer {
            event,
            now_running: watch.and_then(Watch::now_running),
            moved_on_from: self.moved_on.get(&key).cloned(),
        }))
    }
}

fn to_log_level(level: crate::proof::Level) -> log::Level {
    match level {
        crate::proof::Level::Info => log::Level::Info,
        crate::proof::Level::Warn => log::Level::Warn,
    }
}

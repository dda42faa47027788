//! The termination proof for one unit, as a pure state machine.
//!
//! This module does no I/O and never reads the clock: facts and `now` go in through
//! [`UnitProof::handle_input`] and [`UnitProof::handle_timeout`], and what the driver must do
//! comes out of [`UnitProof::poll_output`], with the next deadline from
//! [`UnitProof::poll_timeout`]. After every mutation the driver drains `poll_output` until it
//! returns `None`, carries each output out, and arms a timer for `poll_timeout`.
//!
//! The decision table is the one of the polling design this replaces, branch for branch; only the trigger changed, from a one-second poll to
//! an event:
//!
//! | systemd says (with `stop` = a stop of ours was requested) | then |
//! |---|---|
//! | `stop`, not terminal, invocation foreign or empty | read the cgroup; if populated, count the processes not certainly the new invocation's (stricter than the replaced design, which proved at once) |
//! | foreign, not yet stopped by us, no `stop` | stop that invocation, once (again, at the next state or on a backoff, if that stop failed before systemd said it is over: nothing else would end it) |
//! | terminal, or foreign and stopped by us | read the cgroup |
//! | ... cgroup gone or `populated 0` | proven: exited (terminal), replaced after stop, or restarted outside once the foreign invocation we stopped is over too: systemd says so, or runs yet another invocation (stricter than the replaced design: that invocation may run in another cgroup) |
//! | ... none of ours left (replaced after stop, or the foreign invocation we stopped is over) | proven: replaced after stop, or restarted outside (the replaced design also waited for the other invocation's leftovers: a proof lost while they live) |
//! | ... `populated 1`, replaced after stop or the foreign invocation we stopped is over | count the processes not certainly the newer invocation's |
//! | ... `populated 1`, otherwise | log "processes remain", at most once per 2 s |
//! | ... read error | log it at most once per 2 s, retry on a backoff timer |
//!
//! *Terminal* is ActiveState `inactive` or `failed` for our own invocation, not said as its
//! start ([`UnitState::starting`]); *foreign* is an invocation that is non-empty and not ours,
//! and it takes precedence over terminal; a foreign invocation is *over* as ours is terminal. A
//! unit systemd no longer has loaded counts as inactive with no invocation.
//!
//! A proof that needs the cgroup is made only from a reading handed in after the state that
//! asked for it, so a reading is always at least as fresh as the state it is judged with.

#[cfg(test)]
mod tests;

pub mod release;
pub(crate) mod words;

use std::time::{Duration, Instant};

use words::{Word, word};

/// How often a repeated condition may be logged for one unit: one line per condition per
/// interval, however often the facts repeat it.
pub const LOG_INTERVAL: Duration = Duration::from_secs(2);
/// The first wait before a cgroup that could not be read is read again.
pub const RETRY_FIRST: Duration = Duration::from_millis(50);
/// The longest wait between two reads of a cgroup that cannot be read.
pub const RETRY_MAX: Duration = Duration::from_secs(2);

/// What one read of a unit's cgroup showed. A read is a fresh fact; an inotify notification is only a
/// hint to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupReading {
    /// `cgroup.events` said `populated 1`: at least one process is still in the cgroup or below it.
    Populated,
    /// `cgroup.events` said `populated 0`: no process is left in the cgroup or below it.
    Empty,
    /// The cgroup does not exist (or no cgroup is known for the unit).
    Gone,
    /// The file could not be read or parsed; the message names the path. This is never evidence of
    /// anything.
    Unreadable(String),
}

/// Whether `active_state` says an invocation is over: `inactive` or `failed`, unless said as
/// its start ([`UnitState::starting`]).
fn over(active_state: &str, starting: bool) -> bool {
    matches!(active_state, "inactive" | "failed") && !starting
}

/// The two fields of a unit's systemd state the proof is made from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitState {
    /// ActiveState: `active`, `inactive`, `failed`, `activating`, ...
    pub active_state: String,
    /// InvocationID in hex, or empty while the unit has none.
    pub invocation: String,
    /// `inactive` or `failed` said as the invocation's start, not its end: systemd sends the
    /// unit's old state with a new InvocationID just before `activating`. Not terminal. No
    /// invocation (an empty one) never starts: ignored there.
    pub starting: bool,
}

impl UnitState {
    /// Whether systemd says the invocation named is over: `inactive` or `failed`, not as its
    /// start.
    pub fn is_over(&self) -> bool {
        over(
            &self.active_state,
            self.starting && !self.invocation.is_empty(),
        )
    }

    /// The state of a unit systemd does not have loaded: inactive, with no invocation.
    pub fn unloaded() -> Self {
        UnitState {
            active_state: "inactive".to_owned(),
            invocation: String::new(),
            starting: false,
        }
    }
}

/// What a proof keeps across a restart of the agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resumed {
    /// A stop of ours was requested before the restart.
    pub stop_requested: bool,
}

/// A fact handed to the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// systemd's current state of the unit (from a signal or a read).
    State(UnitState),
    /// The driver no longer knows systemd's state (the bus went away, or a read failed): no
    /// decision is made until a fresh `State` arrives.
    StateUnknown,
    /// A read of the unit's cgroup, made when it was handed in.
    Cgroup(CgroupReading),
    /// The owner asks for the unit to be stopped: marked stop-requested first, then StopUnit.
    StopRequested,
    /// The machine rebooted since the invocation was watched: every process of it died with
    /// the machine, whatever systemd says of the unit now.
    Rebooted,
    /// The answer to [`Output::CountLeftovers`], kept current as they exit: how many processes
    /// in the unit's cgroup are not certainly the current invocation's, or why they could not
    /// be counted.
    Leftovers(Result<usize, String>),
    /// The StopUnit asked for the foreign invocation failed (the bus went away before its
    /// answer, or systemd refused it): unless systemd has said since that it is over, that
    /// invocation may run on and nothing else would stop it, so a stop is asked again at the
    /// next state that shows a foreign invocation, or on the retry timer, whichever comes
    /// first. Not at once: a stop systemd refuses would be refused as often as the loop turns.
    ForeignStopFailed,
}

/// Why the machine asks for a StopUnit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The owner asked for it.
    Requested,
    /// The unit runs an invocation that is not ours and nobody asked us to stop it.
    Foreign,
}

/// The severity of a proof or a log line (the wire spells it as `control::wire::Level`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// A clean end: the unit exited 0 or was stopped as asked.
    Info,
    /// Anything else: a failure, a signal, a missing exit record, a reboot.
    Warn,
}

/// What proved the invocation over (the wire spells it as `control::wire::Cause`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Our invocation reached a terminal state and its cgroup is empty or gone.
    Exited,
    /// A stop of ours was requested and systemd has since begun another invocation.
    ReplacedAfterStop,
    /// Another invocation was started outside us; we stopped it and its cgroup emptied.
    RestartedOutside,
    /// The machine rebooted since the watch began.
    Rebooted,
}

/// The proof that every process of our invocation is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proof {
    /// What proved it.
    pub cause: Cause,
    /// How it ended, for the event's severity.
    pub level: Level,
    /// One line for people.
    pub message: String,
}

impl Proof {
    /// Another watch's proof of the same invocation (an alias, another generation) as this
    /// watch words it: one asked to stop words a later invocation begun as its own stop
    /// replaced, as its own state would (`replaced`), and so keeps its generation's files. An
    /// exit is worded again from the watch's own facts and exit record.
    pub fn of_sibling(cause: Cause, stop_requested: bool) -> Proof {
        let (cause, message) = match cause {
            Cause::RestartedOutside if stop_requested => {
                (Cause::ReplacedAfterStop, REPLACED_AFTER_STOP)
            }
            Cause::RestartedOutside => (cause, RESTARTED_OUTSIDE),
            Cause::ReplacedAfterStop => (cause, REPLACED_AFTER_STOP),
            Cause::Exited => (cause, EXITED_NO_RECORD),
            Cause::Rebooted => (cause, REBOOTED),
        };
        Proof {
            cause,
            level: Level::Warn,
            message: message.into(),
        }
    }
}

/// Where the unit is in its life, as far as the proof goes (the wire spells it as
/// `control::wire::Phase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not proven; no stop of ours was requested.
    Watching,
    /// Not proven; a stop of ours was requested.
    Stopping,
    /// Every process of the invocation is gone. Final.
    Proven,
}

/// What the driver must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Issue StopUnit for the unit.
    StopUnit(StopReason),
    /// Read the unit's cgroup now and hand the reading back as [`Input::Cgroup`].
    ReadCgroup,
    /// Count the processes in the unit's cgroup that may be ours (not certainly the current
    /// invocation's), follow them until they exit, and hand the count back as
    /// [`Input::Leftovers`] whenever it changes.
    CountLeftovers,
    /// Log this line (already rate-limited to one per [`LOG_INTERVAL`] where it repeats).
    Log(Level, String),
    /// The invocation is proven over. Emitted exactly once; nothing follows it.
    Proven(Proof),
}

/// The message of a proof whose invocation ended on its own, until exit records word it.
pub const EXITED_NO_RECORD: &str = "instance exited (status unknown: no exit record)";
const REPLACED_AFTER_STOP: &str = "instance exited (status unknown: replaced after stop)";
const REBOOTED: &str =
    "instance exited (status unknown: the machine rebooted since it was watched)";
const RESTARTED_OUTSIDE: &str = "instance exited (status unknown: restarted outside the activator)";

/// Our invocation as a proof keeps it: systemd's 32 hex digits, or none, inline (40 bytes),
/// where a `String` was 24 bytes and a 32-byte allocation in every watch; anything longer
/// (never from systemd) on the heap.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Invocation {
    Inline {
        len: u8,
        text: [u8; INLINE_INVOCATION],
    },
    Heap(Box<str>),
}

/// The longest invocation kept inline: systemd's InvocationID in hex.
const INLINE_INVOCATION: usize = 32;

impl Invocation {
    fn new(invocation: String) -> Invocation {
        match u8::try_from(invocation.len()) {
            Ok(len) if usize::from(len) <= INLINE_INVOCATION => {
                let mut text = [0; INLINE_INVOCATION];
                text[..invocation.len()].copy_from_slice(invocation.as_bytes());
                Invocation::Inline { len, text }
            }
            _ => Invocation::Heap(invocation.into_boxed_str()),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            // The whole of a `str`, so never an error.
            Invocation::Inline { len, text } => {
                std::str::from_utf8(&text[..usize::from(*len)]).unwrap_or_default()
            }
            Invocation::Heap(text) => text,
        }
    }
}

/// A once-per-interval gate for a repeated log line.
#[derive(Clone, Copy, Debug, Default)]
struct RateLimit {
    last: Option<Instant>,
}

impl RateLimit {
    fn allow(&mut self, now: Instant) -> bool {
        let due = self
            .last
            .is_none_or(|last| now.saturating_duration_since(last) > LOG_INTERVAL);
        if due {
            self.last = Some(now);
        }
        due
    }
}

/// The read-again timer for a cgroup that could not be read: nothing notifies a read error
/// going away, so only a timer brings the next read.
#[derive(Clone, Copy, Debug, Default)]
struct Retry {
    at: Option<Instant>,
    backoff: Option<Duration>,
}

impl Retry {
    fn arm(&mut self, now: Instant) {
        let backoff = self.backoff.map_or(RETRY_FIRST, |b| (b * 2).min(RETRY_MAX));
        self.backoff = Some(backoff);
        self.at = Some(now + backoff);
    }

    fn reset(&mut self) {
        *self = Retry::default();
    }
}

/// What a unit proof needs of the rest of systemd's state, kept small: every watch holds one.
/// The active state is one of systemd's known words, and the invocation is ours or none in all
/// but the rare case of a foreign one.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    active_state: Word,
    invocation: SeenInvocation,
}

/// The invocation a state names, against ours, and whether the state is its start
/// ([`UnitState::starting`]; kept here, in the enum's room, not beside it: a `bool` there made
/// every watch 8 bytes larger).
#[derive(Clone, Debug, PartialEq, Eq)]
enum SeenInvocation {
    None,
    Ours {
        starting: bool,
    },
    /// Twice boxed, a thin pointer: a wide one made every watch 8 bytes larger for a rare case.
    Foreign {
        theirs: Box<Box<str>>,
        starting: bool,
    },
}

impl Seen {
    fn new(state: &UnitState, ours: &str) -> Seen {
        let starting = state.starting;
        Seen {
            active_state: word(&state.active_state),
            invocation: if state.invocation.is_empty() {
                SeenInvocation::None
            } else if state.invocation == ours {
                SeenInvocation::Ours { starting }
            } else {
                SeenInvocation::Foreign {
                    theirs: Box::new(state.invocation.as_str().into()),
                    starting,
                }
            },
        }
    }

    /// Whether the state is the invocation's start, not its end.
    fn starting(&self) -> bool {
        match self.invocation {
            SeenInvocation::None => false,
            SeenInvocation::Ours { starting } | SeenInvocation::Foreign { starting, .. } => {
                starting
            }
        }
    }
}

/// What only a unit in trouble needs (its cgroup unreadable, processes remaining, leftovers
/// beside a new invocation): boxed, made at the first trouble, so a watch never in trouble
/// carries none of it.
#[derive(Clone, Copy, Debug, Default)]
struct Trouble {
    leftovers_log: RateLimit,
    remain_log: RateLimit,
    read_error_log: RateLimit,
    retry: Retry,
}

/// How a state is classified against our invocation: terminal or not, ours or foreign.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Verdict {
    terminal: bool,
    foreign: bool,
    /// The foreign invocation is over too (`inactive` or `failed`).
    foreign_over: bool,
    no_invocation: bool,
}

/// The per-unit termination proof.
///
/// A unit whose invocation ends and whose cgroup is then read empty:
///
/// ```
/// use std::time::Instant;
/// use exitproof::proof::{CgroupReading, Cause, Input, Output, UnitProof, UnitState};
///
/// let ours = "c1a411bea0f8482a98b06f95dabafd31";
/// let mut proof = UnitProof::new(ours.to_owned());
/// let now = Instant::now();
/// let state = |active: &str| UnitState {
///     active_state: active.to_owned(),
///     invocation: ours.to_owned(),
///     starting: false,
/// };
/// proof.handle_input(Input::State(state("active")), now);
/// assert_eq!(proof.poll_output(), None);
///
/// // systemd says our invocation is over: the proof asks for a fresh read of the cgroup...
/// proof.handle_input(Input::State(state("inactive")), now);
/// assert_eq!(proof.poll_output(), Some(Output::ReadCgroup));
/// // ...and proves only from that read.
/// proof.handle_input(Input::Cgroup(CgroupReading::Empty), now);
/// let Some(Output::Proven(done)) = proof.poll_output() else {
///     panic!("not proven")
/// };
/// assert_eq!(done.cause, Cause::Exited);
/// ```
#[derive(Debug)]
pub struct UnitProof {
    invocation: Invocation,
    stop_requested: bool,
    /// The foreign invocation we stopped, once we did (`""` if the state named none).
    /// Twice boxed, a thin pointer, as in `SeenInvocation::Foreign`.
    foreign_stopped: Option<Box<Box<str>>>,
    state: Option<Seen>,
    last_reading: Option<CgroupReading>,
    /// Boxed: made once, at the end, and inline it would make every watch 24 bytes larger.
    proof: Option<Box<Proof>>,
    trouble: Option<Box<Trouble>>,
    /// Oldest first; a `Vec`, 8 bytes smaller than a `VecDeque`: it holds a few at most.
    outputs: Vec<Output>,
}

impl UnitProof {
    /// A proof for the invocation `invocation` (empty: the unit had none when the watch began).
    pub fn new(invocation: String) -> Self {
        UnitProof {
            invocation: Invocation::new(invocation),
            stop_requested: false,
            foreign_stopped: None,
            state: None,
            last_reading: None,
            proof: None,
            trouble: None,
            outputs: Vec::new(),
        }
    }

    /// A proof taken up again after the agent restarted: a stop requested before the restart
    /// stays requested (so a new invocation still proves ours over), without a new StopUnit,
    /// which could stop an invocation that is not ours.
    pub fn resume(invocation: String, resumed: Resumed) -> Self {
        let mut proof = UnitProof::new(invocation);
        proof.stop_requested = resumed.stop_requested;
        proof
    }

    /// Our invocation.
    pub fn invocation(&self) -> &str {
        self.invocation.as_str()
    }

    /// The last systemd state handed in, if it is still known.
    pub fn state(&self) -> Option<UnitState> {
        let seen = self.state.as_ref()?;
        Some(UnitState {
            active_state: seen.active_state.to_string(),
            invocation: match &seen.invocation {
                SeenInvocation::None => String::new(),
                SeenInvocation::Ours { .. } => self.invocation().to_owned(),
                SeenInvocation::Foreign { theirs, .. } => theirs.to_string(),
            },
            starting: seen.starting(),
        })
    }

    /// The last cgroup reading handed in.
    pub fn last_reading(&self) -> Option<&CgroupReading> {
        self.last_reading.as_ref()
    }

    /// The proof, once made.
    pub fn proof(&self) -> Option<&Proof> {
        self.proof.as_deref()
    }

    /// Whether a stop of ours was requested.
    pub fn stop_requested(&self) -> bool {
        self.stop_requested
    }

    /// Where the unit is in its life.
    pub fn phase(&self) -> Phase {
        match (&self.proof, self.stop_requested) {
            (Some(_), _) => Phase::Proven,
            (None, true) => Phase::Stopping,
            (None, false) => Phase::Watching,
        }
    }

    /// Hands one fact to the machine. Once proven, every input is ignored.
    pub fn handle_input(&mut self, input: Input, now: Instant) {
        if self.proof.is_some() {
            return;
        }
        match input {
            Input::State(state) => {
                self.state = Some(Seen::new(&state, self.invocation.as_str()));
                self.on_state();
            }
            Input::StateUnknown => {
                self.state = None;
                self.reset_retry();
            }
            Input::Cgroup(reading) => self.on_reading(reading, now),
            Input::Rebooted => self.prove(Cause::Rebooted, Level::Warn, REBOOTED.into()),
            Input::Leftovers(count) => self.on_leftovers(count, now),
            Input::ForeignStopFailed => self.on_foreign_stop_failed(now),
            Input::StopRequested => {
                // Marked before the StopUnit goes out: from here on a new
                // invocation is proof that ours is over, not a foreign one to stop.
                self.stop_requested = true;
                self.outputs.push(Output::StopUnit(StopReason::Requested));
                self.on_state();
            }
        }
    }

    /// The next instant at which [`UnitProof::handle_timeout`] wants to run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.trouble.as_ref()?.retry.at
    }

    /// Lets time pass: a due retry asks for another read of the cgroup.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(trouble) = &mut self.trouble
            && trouble.retry.at.is_some_and(|at| at <= now)
        {
            trouble.retry.at = None;
            if self.foreign_stop_due() {
                self.on_state();
            } else {
                self.outputs.push(Output::ReadCgroup);
            }
        }
    }

    /// The next thing the driver must do, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        let output = (!self.outputs.is_empty()).then(|| self.outputs.remove(0));
        if self.proof.is_some() && self.outputs.is_empty() {
            // Nothing follows the proof: the queue's room goes back now, not when the watch
            // is dropped.
            self.outputs = Vec::new();
        }
        output
    }

    /// Whether systemd's last state is terminal for our invocation (`inactive` or `failed`,
    /// not another invocation's).
    pub fn terminal(&self) -> bool {
        self.verdict().is_some_and(|v| v.terminal)
    }

    /// Whether a reading of the cgroup would be used now: only then is a change of the cgroup
    /// worth a read (a reading made while nothing needs it would prove nothing; the proof asks
    /// for its own read, with [`Output::ReadCgroup`], once the state calls for one).
    pub fn wants_reading(&self) -> bool {
        self.proof.is_none() && self.verdict().is_some_and(|v| self.needs_cgroup(v))
    }

    fn verdict(&self) -> Option<Verdict> {
        let state = self.state.as_ref()?;
        let foreign = matches!(state.invocation, SeenInvocation::Foreign { .. });
        let over = over(&state.active_state, state.starting());
        Some(Verdict {
            terminal: !foreign && over,
            foreign,
            foreign_over: foreign && over,
            no_invocation: state.invocation == SeenInvocation::None,
        })
    }

    /// What a unit in trouble needs, made at its first trouble.
    fn trouble(&mut self) -> &mut Trouble {
        self.trouble.get_or_insert_default()
    }

    /// No read again is due.
    fn reset_retry(&mut self) {
        if let Some(trouble) = &mut self.trouble {
            trouble.retry.reset();
        }
    }

    /// Whether our stop was requested and systemd has begun something that is not our
    /// invocation: the replaced-after-stop case.
    fn replaced(&self, v: Verdict) -> bool {
        self.stop_requested && !v.terminal && (v.foreign || v.no_invocation)
    }

    /// Whether the foreign invocation we stopped is over: systemd says so, or it runs another
    /// invocation since (an InvocationID is never used again, and a unit runs one at a time).
    /// What remains in the cgroup is then ours only if it began before that invocation (its
    /// own `KillMode=process` leftovers are not ours to wait for).
    fn stopped_foreign_over(&self, v: Verdict) -> bool {
        let Some(stopped) = &self.foreign_stopped else {
            return false;
        };
        let runs_another = match self.state.as_ref().map(|s| &s.invocation) {
            Some(SeenInvocation::Foreign { theirs, .. }) => **theirs != **stopped,
            _ => false,
        };
        !self.stop_requested && v.foreign && (v.foreign_over || runs_another)
    }

    /// Whether the state alone leaves the cgroup to decide.
    fn needs_cgroup(&self, v: Verdict) -> bool {
        v.terminal || (v.foreign && self.foreign_stopped.is_some()) || self.replaced(v)
    }

    /// Whether systemd says a foreign invocation runs that we have not stopped (or whose stop
    /// failed), and nobody asked us to stop ours.
    fn foreign_stop_due(&self) -> bool {
        self.verdict()
            .is_some_and(|v| v.foreign && self.foreign_stopped.is_none() && !self.stop_requested)
    }

    /// Our stop of the foreign invocation failed: forgotten (and asked again, see
    /// [`Input::ForeignStopFailed`]) unless systemd said since that it is over, or runs another
    /// (which is over then): a stop asked again would only reach what runs next.
    fn on_foreign_stop_failed(&mut self, now: Instant) {
        if self.stop_requested || self.foreign_stopped.is_none() {
            return;
        }
        let moot = self
            .verdict()
            .is_some_and(|v| v.foreign_over || self.stopped_foreign_over(v));
        if moot {
            return;
        }
        self.foreign_stopped = None;
        if self.foreign_stop_due() {
            self.trouble().retry.arm(now);
        }
    }

    fn on_state(&mut self) {
        let Some(v) = self.verdict() else {
            return;
        };
        if self.foreign_stop_due() {
            let theirs: &str = match self.state.as_ref().map(|s| &s.invocation) {
                Some(SeenInvocation::Foreign { theirs, .. }) => theirs,
                _ => "",
            };
            let stopped = Box::new(theirs.into());
            let line = format!(
                "unit restarted outside the activator (invocation {theirs}, ours {}); stopping it",
                display_invocation(self.invocation.as_str())
            );
            self.outputs.push(Output::Log(Level::Warn, line));
            self.outputs.push(Output::StopUnit(StopReason::Foreign));
            self.foreign_stopped = Some(stopped);
        }
        if self.needs_cgroup(v) {
            self.outputs.push(Output::ReadCgroup);
        } else {
            self.reset_retry();
        }
    }

    fn on_reading(&mut self, reading: CgroupReading, now: Instant) {
        self.last_reading = Some(reading.clone());
        let Some(v) = self.verdict() else {
            return;
        };
        if !self.needs_cgroup(v) {
            return;
        }
        match reading {
            CgroupReading::Empty | CgroupReading::Gone => {
                if v.terminal {
                    self.prove(Cause::Exited, Level::Warn, EXITED_NO_RECORD.into());
                } else if self.replaced(v) {
                    self.prove(
                        Cause::ReplacedAfterStop,
                        Level::Warn,
                        REPLACED_AFTER_STOP.into(),
                    );
                } else if self.stopped_foreign_over(v) {
                    self.prove(
                        Cause::RestartedOutside,
                        Level::Warn,
                        RESTARTED_OUTSIDE.into(),
                    );
                }
                // Else the foreign invocation we stopped still runs, maybe in a cgroup of its
                // own (a Slice= change): a writer of the unit until systemd says it is over,
                // or runs another.
            }
            CgroupReading::Populated if self.replaced(v) || self.stopped_foreign_over(v) => {
                // systemd starts a new invocation only once the stop job of ours completed, but
                // with `KillMode=process` (or `mixed`) it starts it beside what ours left in the
                // cgroup, and the invocation we stopped may leave its own: only a count of the
                // processes not certainly the newer invocation's tells.
                self.reset_retry();
                self.outputs.push(Output::CountLeftovers);
            }
            CgroupReading::Populated => {
                self.reset_retry();
                if v.terminal {
                    // What remains once ours is over is ours: counted now, and each held until
                    // it exits, so that a count made once another invocation runs knows where
                    // and when they started (a session ours began is told by a member's start)
                    // though the watch never heard systemd name our roots (made late, or
                    // taken up after a restart).
                    self.outputs.push(Output::CountLeftovers);
                }
                if self.trouble().remain_log.allow(now) {
                    let active = self.state.as_ref().map_or("", |s| &*s.active_state);
                    let line = format!("processes remain after {active}; not releasing");
                    self.outputs.push(Output::Log(Level::Warn, line));
                }
            }
            CgroupReading::Unreadable(why) => {
                // Not evidence of anything: not exited, not running, unknown.
                let trouble = self.trouble();
                if trouble.read_error_log.allow(now) {
                    self.outputs
                        .push(Output::Log(Level::Warn, format!("cgroup.events: {why}")));
                }
                self.trouble().retry.arm(now);
            }
        }
    }

    fn on_leftovers(&mut self, count: Result<usize, String>, now: Instant) {
        let Some(v) = self.verdict() else {
            return;
        };
        match count {
            Ok(count) => {
                let replaced = self.replaced(v);
                if !replaced && !self.stopped_foreign_over(v) {
                    return;
                }
                if count == 0 && replaced {
                    self.prove(
                        Cause::ReplacedAfterStop,
                        Level::Warn,
                        REPLACED_AFTER_STOP.into(),
                    );
                } else if count == 0 {
                    self.prove(
                        Cause::RestartedOutside,
                        Level::Warn,
                        RESTARTED_OUTSIDE.into(),
                    );
                } else if self.trouble().leftovers_log.allow(now) {
                    let line = format!(
                        "{count} processes of our invocation remain beside the new one; not releasing"
                    );
                    self.outputs.push(Output::Log(Level::Warn, line));
                }
            }
            Err(why) => {
                if self.trouble().read_error_log.allow(now) {
                    self.outputs
                        .push(Output::Log(Level::Warn, format!("count leftovers: {why}")));
                }
                if self.replaced(v) || self.stopped_foreign_over(v) {
                    self.trouble().retry.arm(now);
                }
            }
        }
    }

    fn prove(&mut self, cause: Cause, level: Level, message: String) {
        let proof = Proof {
            cause,
            level,
            message,
        };
        self.trouble = None;
        self.outputs.push(Output::Proven(proof.clone()));
        self.proof = Some(Box::new(proof));
    }
}

fn display_invocation(invocation: &str) -> &str {
    if invocation.is_empty() {
        "none"
    } else {
        invocation
    }
}

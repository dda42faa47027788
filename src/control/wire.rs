//! What the agent answers and tells, as typed values: the [watch view](WatchView), the
//! [proof event](ProofEvent) and the answers' payloads. The agent serializes these and
//! [`super::client::Client`] deserializes the very same types, so the two sides cannot drift
//! apart; `docs/protocol.md` specifies every field.
//!
//! Deserializing ignores fields it does not know, as the protocol asks of clients, so a newer
//! agent's additions do not break an older client.
//!
//! The proof core's [`Cause`], [`Level`] and [`Phase`] have no spelling of their own: these are
//! the wire's, converted `From` the proof's, and each of their words is written once, here
//! (their `name`, which the agent's logs, journald fields and metrics labels use too).

use std::fmt;

use serde::{Deserialize, Serialize};

pub use super::protocol::{ErrorKind, Version};
pub use crate::exit::SanitizedRecord;
use crate::proof;

/// Defines an enum the wire spells as one word a variant, each word written here once: `name`
/// returns it, serializing writes `name`, and deserializing matches the same words. After the
/// variants, `unknown { Variant = "word", }` names the variant a word this
/// build does not know decodes to (a newer agent's); without it, such a word is an error
/// naming the words known.
macro_rules! wire_words {
    (
        $(#[$meta:meta])*
        pub enum $ty:ident {
            $($(#[$doc:meta])* $variant:ident = $word:literal,)+
        }
        $(unknown { $(#[$other_doc:meta])* $other:ident = $other_word:literal, })?
    ) => {
        $(#[$meta])*
        pub enum $ty {
            $($(#[$doc])* $variant,)+
            $($(#[$other_doc])* $other,)?
        }

        impl $ty {
            /// The value as the wire spells it; logs and journald fields use the same word.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $word,)+
                    $($ty::$other => $other_word,)?
                }
            }
        }

        impl Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.name())
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Words;
                impl serde::de::Visitor<'_> for Words {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str(concat!("a ", stringify!($ty), " word"))
                    }
                    fn visit_str<E: serde::de::Error>(self, word: &str) -> Result<$ty, E> {
                        match word {
                            $($word => Ok($ty::$variant),)+
                            _ => wire_words!(@unknown word, [$($word),+] $(, $ty::$other)?),
                        }
                    }
                }
                deserializer.deserialize_str(Words)
            }
        }
    };
    (@unknown $word:ident, $known:expr, $other:expr) => {
        Ok($other)
    };
    (@unknown $word:ident, $known:expr) => {
        Err(serde::de::Error::unknown_variant($word, &$known))
    };
}

wire_words! {
    /// The severity of a proof event.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Level {
        /// A clean end: the unit exited 0 or was stopped as asked.
        Info = "info",
        /// Anything else: a failure, a signal, a missing exit record, a reboot.
        Warn = "warn",
    }
}

wire_words! {
    /// What proved the invocation over. A newer agent may tell of a cause this build does not
    /// know (the protocol lets new causes come without a new version: a proof is a proof
    /// whatever its cause): it decodes to [`Cause::Other`].
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    #[non_exhaustive]
    pub enum Cause {
        /// Our invocation reached a terminal state and its cgroup is empty or gone.
        Exited = "exited",
        /// A stop of ours was requested and systemd has since begun another invocation.
        ReplacedAfterStop = "replaced-after-stop",
        /// Another invocation was started outside us; we stopped it and its cgroup emptied.
        RestartedOutside = "restarted-outside",
        /// The machine rebooted since the watch began.
        Rebooted = "rebooted",
    }
    unknown {
        /// A cause this build does not know, read from a newer agent. Never made by this one.
        Other = "other",
    }
}

wire_words! {
    /// Where a watch is in its life.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Phase {
        /// Not proven; no stop of ours was requested.
        Watching = "watching",
        /// Not proven; a stop of ours was requested.
        Stopping = "stopping",
        /// Every process of the invocation is gone. Final.
        Proven = "proven",
    }
}

impl From<proof::Level> for Level {
    fn from(level: proof::Level) -> Self {
        match level {
            proof::Level::Info => Level::Info,
            proof::Level::Warn => Level::Warn,
        }
    }
}

impl From<proof::Cause> for Cause {
    fn from(cause: proof::Cause) -> Self {
        match cause {
            proof::Cause::Exited => Cause::Exited,
            proof::Cause::ReplacedAfterStop => Cause::ReplacedAfterStop,
            proof::Cause::RestartedOutside => Cause::RestartedOutside,
            proof::Cause::Rebooted => Cause::Rebooted,
        }
    }
}

impl From<proof::Phase> for Phase {
    fn from(phase: proof::Phase) -> Self {
        match phase {
            proof::Phase::Watching => Phase::Watching,
            proof::Phase::Stopping => Phase::Stopping,
            proof::Phase::Proven => Phase::Proven,
        }
    }
}

/// The kind of an event; a field so that other kinds can join the stream later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// Every process of the unit's invocation is gone.
    Proven,
}

/// The one event a proof produces, as clients receive it: the answer to `wait` and `stop`, an
/// event line of the `events` stream, and the `proof` of a proven [`WatchView`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProofEvent {
    /// Always [`EventKind::Proven`] (`"proven"`).
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// The unit, by the name it was watched by.
    pub unit: String,
    /// Our invocation, the one proven over (empty if the unit had none when watched).
    pub invocation: String,
    /// `info` for a clean end, `warn` for anything else.
    pub level: Level,
    /// One line for people; its wording may change in any version.
    pub message: String,
    /// What proved it.
    pub cause: Cause,
    /// CLOCK_MONOTONIC at the proof, in nanoseconds, for latency measured in another process.
    pub proven_mono_ns: u64,
    /// CLOCK_REALTIME at the proof, in microseconds since the epoch (as the journal's
    /// `__REALTIME_TIMESTAMP`), to find it in `journalctl`; `null` for a proof an agent of an
    /// earlier version made.
    #[serde(default)]
    pub proven_realtime_us: Option<u64>,
    /// A stop of ours was requested.
    pub stop_requested: bool,
    /// How the main process ended, as systemd itself reported it (terminal proofs of services).
    pub systemd: Option<SanitizedRecord>,
    /// The advisory exit record, sanitized, when the watch names one and it could be read.
    pub record: Option<SanitizedRecord>,
    /// The generation the invocation belonged to, if the watch named one.
    #[serde(rename = "gen")]
    pub generation: Option<u64>,
    /// The generation's launch file, removed once the generation was proven gone.
    pub launch_file: Option<String>,
}

/// One watched unit as `watch` and `list` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchView {
    /// The unit, by the name it was watched by.
    pub unit: String,
    /// Our invocation; absent while the first read of the unit is under way.
    pub invocation: Option<String>,
    /// systemd's ActiveState, as last known.
    pub active_state: Option<String>,
    /// systemd's SubState, as last known.
    pub sub_state: Option<String>,
    /// What the last cgroup read said: true, false, or null when gone, unread or unreadable.
    /// The cgroup is read when the watch begins and when the proof needs a reading, not on every
    /// change while our invocation runs.
    pub populated: Option<bool>,
    /// Where the watch is in its life.
    pub phase: Phase,
    /// A stop of ours was requested.
    pub stop_requested: bool,
    /// The directory holding the unit's exit record.
    pub run_dir: Option<String>,
    /// The exit record's file name in `run_dir`.
    pub record: Option<String>,
    /// The generation the invocation belongs to.
    #[serde(rename = "gen")]
    pub generation: Option<u64>,
    /// The generation's launch file.
    pub launch_file: Option<String>,
    /// The proof event, once proven.
    pub proof: Option<ProofEvent>,
    /// Once proven, the invocation systemd runs now instead of the one proven (started since
    /// by someone else), as last heard; absent when the unit runs nothing or that one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now_running: Option<String>,
}

/// The payload of a successful `watch` answer: `{"watch":…}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchAnswer {
    /// The watch as it stands.
    pub watch: WatchView,
}

/// The payload of a successful `wait` or `stop` answer, and an event line: `{"event":…}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventAnswer {
    /// The proof.
    pub event: ProofEvent,
    /// The invocation systemd runs now instead of the one proven, when the answer is a proof
    /// made before it started (a `wait` of a unit started again since); see
    /// [`WatchView::now_running`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now_running: Option<String>,
    /// The proven invocation a `stop` found over while systemd ran another: the watch moved on
    /// to the one running, stopped it, and this is its proof.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_on_from: Option<String>,
}

/// The payload of a successful `list` answer: `{"units":[…]}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListAnswer {
    /// Every watch, sorted by unit.
    pub units: Vec<WatchView>,
}

/// The payload of a successful `version` answer: `{"version":…}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionAnswer {
    /// The protocol's and the agent's versions.
    pub version: Version,
}

/// The payload of an answer with nothing more to say (`unwatch`, `events`): `{}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Done {}

/// The payload of `unwatch` with `proven`: `{"unwatched":[…]}`, the units whose proven watches
/// it forgot, sorted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnwatchedAnswer {
    /// The units, by the names they were watched by.
    pub unwatched: Vec<String>,
}

/// The payload of a successful `stats` answer: `{"stats":…}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsAnswer {
    /// The agent's counters and gauges.
    pub stats: AgentStats,
}

/// One cumulative bucket: how many observations were at most `le_us` (`None`: all of them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// The bucket's upper bound in microseconds; `null` for the last one (`+Inf`).
    pub le_us: Option<u64>,
    /// Observations at most `le_us`, cumulative.
    pub count: u64,
}

/// A histogram as reported, in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Cumulative buckets, in increasing bound.
    pub buckets: Vec<Bucket>,
    /// The sum of every observation, in microseconds.
    pub sum_us: u64,
    /// How many observations.
    pub count: u64,
}

/// Proofs made since the agent started, by cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ProofCounts {
    /// Proofs with cause `exited`.
    pub exited: u64,
    /// Proofs with cause `replaced-after-stop`.
    pub replaced_after_stop: u64,
    /// Proofs with cause `restarted-outside`.
    pub restarted_outside: u64,
    /// Proofs with cause `rebooted`.
    pub rebooted: u64,
}

/// The watches as they stand, by phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseCounts {
    /// Watches in phase `watching`.
    pub watching: u64,
    /// Watches in phase `stopping`.
    pub stopping: u64,
    /// Proven watches still listed.
    pub proven: u64,
}

/// The core's figures, counters and gauges, as the `stats` answer carries them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoreStats {
    /// The watches by phase.
    pub watches: PhaseCounts,
    /// Unproven units whose invocation is terminal while their cgroup was last read populated.
    pub blocked: u64,
    /// Proofs made since the agent started, by cause.
    pub proofs: ProofCounts,
    /// Safety-net relists of every unit since the agent started.
    pub resyncs: u64,
    /// From the core learning of systemd's terminal state of an invocation to its proof.
    pub proof_latency: LatencySummary,
}

/// The inotify instance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InotifyStats {
    /// Watches held now (a watched cgroup's `cgroup.events` and its parent directory, which
    /// sibling units share).
    pub watches: u64,
    /// Times the kernel dropped inotify events.
    pub overflows: u64,
}

/// Everything `stats` answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentStats {
    /// The core's figures, flattened into the answer.
    #[serde(flatten)]
    pub core: CoreStats,
    /// Connections to the bus taken into use after the first.
    pub bus_reconnects: u64,
    /// Why systemd is not heard now (the bus is lost, or the owner of systemd's name is not
    /// systemd): no watch can be proven meanwhile. `null` while it is heard.
    pub systemd_error: Option<String>,
    /// The inotify instance.
    pub inotify: InotifyStats,
    /// Structured logging to journald.
    pub journald: JournaldStats,
    /// The loop's own time: per proof, and what its slowest turns did (absent from agents
    /// older than it).
    #[serde(rename = "loop", default)]
    pub event_loop: LoopStats,
}

/// The agent's own time, measured by its loop: per proof, from the loop's receipt of what
/// decided it (its wake from `epoll_wait`, on the monotonic clock) to the proof written to
/// its subscribers; and what the turns of the loop did, so a slow proof is explained by the
/// agent's own figures.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopStats {
    /// Per proof told to subscribers (`events`), in microseconds; proofs made while nobody
    /// subscribed are not in it.
    pub proof_latency: LatencySummary,
    /// The longest of those, in microseconds.
    pub proof_latency_max_us: u64,
    /// Turns of the loop since the agent started.
    pub turns: u64,
    /// What every turn did, summed.
    pub work: TurnWork,
    /// The proofs that took longest, slowest first: each one's time and what its turn had
    /// done by then.
    pub slowest_proofs: Vec<SlowTurn>,
    /// The longest turns, slowest first: each one's time and what it did. A message that
    /// arrives during a turn waits for its end.
    pub slowest_turns: Vec<SlowTurn>,
}

/// What the loop did in a turn (or in all of them), with the time each kind of work took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnWork {
    /// Inputs handed to the rules (messages, notices, requests, answers of synchronous reads).
    pub inputs: u64,
    /// Proofs told to subscribers.
    pub proofs: u64,
    /// Saves of the state: a journal line written, or a whole snapshot.
    pub saves: u64,
    /// Their time, in microseconds.
    pub save_us: u64,
    /// `fdatasync`s of the journal.
    pub syncs: u64,
    /// Their time, in microseconds.
    pub sync_us: u64,
    /// Reads of a unit's `cgroup.events`.
    pub cgroup_reads: u64,
    /// Their time, in microseconds.
    pub cgroup_read_us: u64,
    /// Free heap pages given back (`malloc_trim`).
    pub trims: u64,
    /// Their time, in microseconds.
    pub trim_us: u64,
    /// Time spent counting leftovers (a cgroup's processes and their `/proc` entries), in
    /// microseconds. Absent from agents before it (0), as are the four below.
    #[serde(default)]
    pub census_us: u64,
    /// Time spent on the D-Bus connection (reading, decoding, sending), in microseconds.
    #[serde(default)]
    pub bus_us: u64,
    /// Time spent in the rules (the core and the proofs), in microseconds.
    #[serde(default)]
    pub rules_us: u64,
    /// Time spent encoding and writing answers and proof events to clients, in microseconds.
    #[serde(default)]
    pub tell_us: u64,
    /// Time spent writing log lines, in microseconds.
    #[serde(default)]
    pub log_us: u64,
    /// The time the loop's thread ran on a CPU (CLOCK_THREAD_CPUTIME_ID), in microseconds: the
    /// rest of the turn's time it was off the CPU, waiting for a disk, the kernel's locks or
    /// the scheduler. A kernel without IRQ time accounting (`CONFIG_IRQ_TIME_ACCOUNTING`)
    /// counts the interrupts it handled meanwhile on that CPU as the thread's time too,
    /// whoever they were for. Absent from agents before it (0).
    #[serde(default)]
    pub cpu_us: u64,
    /// Page faults the loop's thread took that read nothing from a disk (`getrusage`'s
    /// `ru_minflt`): a heap grown or given back and touched again. Absent from agents before
    /// it (0).
    #[serde(default)]
    pub minor_faults: u64,
    /// Times the scheduler gave the loop's CPU to another task while it could run
    /// (`ru_nivcsw`). Absent from agents before it (0).
    #[serde(default)]
    pub preemptions: u64,
}

/// One slow proof or turn: how long it took and what its turn did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlowTurn {
    /// CLOCK_MONOTONIC, in nanoseconds, when the turn began (the loop's wake).
    pub at_mono_ns: u64,
    /// The proof's time from the turn's beginning, or the turn's whole time, in microseconds.
    pub us: u64,
    /// What the turn had done by then.
    pub work: TurnWork,
}

/// The payload of a successful `status` answer: `{"status":…}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusAnswer {
    /// The watch, its facts and what blocks its proof.
    pub status: UnitStatus,
}

/// One process left in a blocked unit's cgroup, as `/proc` shows it when asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemainingProcess {
    /// The process ID.
    pub pid: i32,
    /// The command name (`/proc/PID/stat`'s second field), lossily decoded.
    pub comm: String,
    /// The state letter: `R`, `S`, `D` (uninterruptible: often what a stop waits on), `Z`, ...
    pub state: String,
    /// The cgroup holding it, as systemd names cgroups (the unit's own, or one below it).
    pub cgroup: String,
}

/// What `status` answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitStatus {
    /// The watch as `list` shows it.
    pub watch: WatchView,
    /// The unit's cgroup as systemd last reported it (`null` before the first read or if it
    /// has none).
    pub cgroup: Option<String>,
    /// Why the last reading of the cgroup is no evidence, while unproven: unreadable, or not
    /// found where systemd says while our invocation runs. `null` otherwise.
    #[serde(default)]
    pub cgroup_error: Option<String>,
    /// Unproven, terminal for systemd, and its cgroup last read populated.
    pub blocked: bool,
    /// CLOCK_MONOTONIC, in nanoseconds, when the agent learned our invocation is terminal;
    /// `null` until then and once proven.
    pub terminal_since_mono_ns: Option<u64>,
    /// Milliseconds since then, when the status was taken.
    pub terminal_for_ms: Option<u64>,
    /// Processes followed as possibly ours once our invocation is over (beside a new
    /// invocation above all).
    pub leftovers: Vec<i32>,
    /// When blocked: the processes in the cgroup and below, at most 32, listed
    /// by the driver; `null` when not blocked or if they could not be listed.
    pub remaining: Option<Vec<RemainingProcess>>,
    /// How many processes the listing found; `null` with `remaining`.
    pub remaining_total: Option<usize>,
    /// Why the processes could not be listed, if they could not.
    pub remaining_error: Option<String>,
    /// Why systemd is not heard now, as `stats` says it; `null` while it is.
    pub systemd_error: Option<String>,
}

/// The agent's records sent to journald's native socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournaldStats {
    /// Records dropped because journald's socket was full (the loop never waits on it).
    pub dropped: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every cause the proof makes, with its spelling as `docs/protocol.md` documents it. A new
    /// cause fails to compile here until it is given one.
    fn documented(cause: proof::Cause) -> &'static str {
        match cause {
            proof::Cause::Exited => "exited",
            proof::Cause::ReplacedAfterStop => "replaced-after-stop",
            proof::Cause::RestartedOutside => "restarted-outside",
            proof::Cause::Rebooted => "rebooted",
        }
    }

    #[test]
    fn every_proof_cause_is_spelled_on_the_wire_as_documented() {
        for cause in [
            proof::Cause::Exited,
            proof::Cause::ReplacedAfterStop,
            proof::Cause::RestartedOutside,
            proof::Cause::Rebooted,
        ] {
            let word = documented(cause);
            let wire = Cause::from(cause);
            assert_eq!(wire.name(), word, "{cause:?}");
            let json = serde_json::to_string(&wire).expect("serialize");
            assert_eq!(json, format!("\"{word}\""), "{cause:?}");
            assert_eq!(serde_json::from_str::<Cause>(&json).ok(), Some(wire));
        }
    }

    #[test]
    fn an_unknown_cause_decodes_to_other() {
        let unknown = serde_json::from_str::<Cause>(r#""evaporated""#);
        assert_eq!(unknown.ok(), Some(Cause::Other));
        let event: ProofEvent = serde_json::from_str(
            r#"{"type":"proven","unit":"a.service","invocation":"","level":"warn",
                "message":"m","cause":"evaporated","proven_mono_ns":1,"stop_requested":false,
                "systemd":null,"record":null,"gen":null,"launch_file":null}"#,
        )
        .expect("a proof event with a newer agent's cause");
        assert_eq!(event.cause, Cause::Other);
    }

    #[test]
    fn levels_and_phases_are_spelled_as_documented_and_unknown_ones_refused() {
        let levels = [(proof::Level::Info, "info"), (proof::Level::Warn, "warn")];
        for (level, word) in levels {
            assert_eq!(
                serde_json::to_value(Level::from(level)).ok(),
                Some(word.into())
            );
        }
        let phases = [
            (proof::Phase::Watching, "watching"),
            (proof::Phase::Stopping, "stopping"),
            (proof::Phase::Proven, "proven"),
        ];
        for (phase, word) in phases {
            let wire = Phase::from(phase);
            assert_eq!(serde_json::to_value(wire).ok(), Some(word.into()));
            assert_eq!(
                serde_json::from_value::<Phase>(word.into()).ok(),
                Some(wire)
            );
        }
        let error = serde_json::from_str::<Level>(r#""loud""#).expect_err("unknown level");
        assert_eq!(
            error.to_string(),
            "unknown variant `loud`, expected `info` or `warn` at line 1 column 6"
        );
        assert!(serde_json::from_str::<Phase>("1").is_err(), "not a string");
    }
}

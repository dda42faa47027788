//! What one benchmark run measured: raw per-unit timestamps and per-contender resources.
//!
//! Every timestamp is CLOCK_MONOTONIC in nanoseconds, comparable across the bench and the
//! agent (the agent reports `proven_mono_ns`).

use serde::{Deserialize, Serialize};

use crate::control::wire::LoopStats;

/// How the contenders share the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Each contender in a phase of its own, on units of its own, with the same kill schedule:
    /// neither loads the machine, systemd or the bus while the other is measured.
    Separate,
    /// Both contenders watch the same units at once.
    Together,
}

impl Mode {
    /// The phases a run of this mode goes through, in order.
    pub fn phases(self) -> &'static [Phase] {
        match self {
            Mode::Separate => &[Phase::Event, Phase::Poll],
            Mode::Together => &[Phase::Together],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Separate => "separate",
            Mode::Together => "together",
        }
    }
}

/// Which contenders watched a sample's unit (systemd's signal is observed in every phase).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The agent and the poller, on the same units.
    #[default]
    Together,
    /// The agent alone.
    Event,
    /// The poller alone.
    Poll,
}

impl Phase {
    /// Whether the agent watches this phase's units.
    pub fn has_agent(self) -> bool {
        matches!(self, Phase::Together | Phase::Event)
    }

    /// Whether the poller watches this phase's units.
    pub fn has_poller(self) -> bool {
        matches!(self, Phase::Together | Phase::Poll)
    }

    pub fn name(self) -> &'static str {
        match self {
            Phase::Together => "together",
            Phase::Event => "event",
            Phase::Poll => "poll",
        }
    }
}

/// The timestamps of one unit in one kill round.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitSample {
    /// Runs from before phases existed had every contender on every unit.
    #[serde(default)]
    pub phase: Phase,
    pub round: u32,
    pub unit: String,
    /// Just before the bench wrote `1` to the unit's `cgroup.kill`.
    pub t_kill_ns: u64,
    /// When the bench's own inotify saw `populated 0` or the cgroup's removal.
    pub t_cgroup_ns: Option<u64>,
    /// When the bench's own (subscribed) D-Bus connection saw ActiveState become terminal.
    pub t_signal_ns: Option<u64>,
    /// When the exitproof agent proved it (`proven_mono_ns`).
    pub t_event_ns: Option<u64>,
    /// When the polling contender (the replaced design) proved it.
    pub t_poll_ns: Option<u64>,
}

/// What one contender cost.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    /// CPU time used during the idle window, all units watched, in milliseconds.
    pub idle_cpu_ms: f64,
    /// CPU time used during the kill rounds, in milliseconds.
    pub round_cpu_ms: f64,
    /// Peak resident set size, KiB (`None` where it cannot be told apart from the bench's own).
    pub rss_kib: Option<u64>,
    /// Proportional set size at the end of the rounds, KiB: the resident pages, each shared
    /// one divided by the processes that map it (libc's mostly shared, the binary's not).
    pub pss_kib: Option<u64>,
    /// Anonymous memory (heap, stacks) resident at the end of the rounds, KiB.
    pub anon_kib: Option<u64>,
    /// Threads of the contender's process (`None` where it has no process of its own).
    pub threads: Option<u64>,
    /// CPU time of the processes the contender spawned (the poller's `systemctl`s), in ms,
    /// idle window and kill rounds together.
    pub spawned_cpu_ms: Option<f64>,
}

/// One whole benchmark run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchRun {
    pub units: usize,
    pub rounds: u32,
    /// Runs from before modes existed ran together, with every unit killed at once.
    #[serde(default = "together")]
    pub mode: Mode,
    /// One unit killed every this many ms, at a seeded random instant within its slot; 0: all
    /// at once.
    #[serde(default)]
    pub kill_interval_ms: u64,
    /// The seed of the kill instants' jitter, to replay the schedule.
    #[serde(default)]
    pub seed: u64,
    pub poll_interval_ms: u64,
    pub idle_ms: u64,
    /// When and where it ran (free text: date, kernel, CPU, cores).
    pub machine: String,
    pub date: String,
    pub samples: Vec<UnitSample>,
    pub event: Resources,
    pub poll: Resources,
    /// The agent's state directory, if not the bench's temporary one.
    #[serde(default)]
    pub state_dir: Option<String>,
    /// The agent's own accounting at the end of its phase (its `stats`' `loop`): its time per
    /// proof and its slowest turns. `None` in runs before it, or if the agent did not answer.
    #[serde(default)]
    pub agent_loop: Option<LoopStats>,
}

fn together() -> Mode {
    Mode::Together
}

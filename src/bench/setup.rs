//! What a benchmark run is given and what it starts: its configuration, and the units
//! started for a round. The run and the agent contender both use them.

use std::path::PathBuf;
use std::time::Duration;

use super::BenchError;
use super::sample::Mode;
use crate::systemd::Bus;
use crate::unit_name::UnitName;

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub bus: Bus,
    pub units: usize,
    pub rounds: u32,
    pub poll_interval: Duration,
    /// The idle window (zero: none).
    pub idle: Duration,
    /// One unit killed every `kill_interval`, at a random instant within it (zero: all at once).
    pub kill_interval: Duration,
    /// The seed of the kill instants' jitter.
    pub seed: u64,
    pub mode: Mode,
    /// The exitproof binary that runs the agent contender.
    pub agent_binary: PathBuf,
    /// The bench's own binary, run again as the observer.
    pub bench_binary: PathBuf,
    /// Where the agent's socket and log go.
    pub work_dir: PathBuf,
    /// The agent's state directory (`None`: `state` in `work_dir`).
    pub state_dir: Option<PathBuf>,
}

/// The bench's own unit names are valid; one that is not is the bench's bug, reported.
pub(super) fn unit_name(name: &str) -> Result<UnitName, BenchError> {
    name.parse()
        .map_err(|e| BenchError::Failed(format!("unit {name}: {e}")))
}

/// A unit started for a round, active, as systemd reported it.
pub(super) struct StartedUnit {
    pub(super) name: String,
    pub(super) invocation: String,
    /// Its ControlGroup, as systemd names it.
    pub(super) cgroup: String,
}

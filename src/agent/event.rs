//! What the agent tells its clients about a unit: the proof event and the watch view.

use serde::Serialize;

use crate::proof::{Cause, Level, Phase};

/// The one event a proof produces, as clients receive it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProofEvent {
    /// Always `"proven"`; a field so that other kinds of event can join the stream later.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub unit: String,
    /// Our invocation, the one proven over (empty if the unit had none when watched).
    pub invocation: String,
    pub level: Level,
    pub message: String,
    pub cause: Cause,
    /// CLOCK_MONOTONIC at the proof, in nanoseconds, for latency measured in another process.
    pub proven_mono_ns: u64,
    pub stop_requested: bool,
}

/// One watched unit as `watch` and `list` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WatchView {
    pub unit: String,
    /// Our invocation; absent while the first read of the unit is under way.
    pub invocation: Option<String>,
    pub active_state: Option<String>,
    pub sub_state: Option<String>,
    /// What the last cgroup read said: true, false, or null when gone, unread or unreadable.
    pub populated: Option<bool>,
    pub phase: Phase,
    pub stop_requested: bool,
    /// The proof event, once proven.
    pub proof: Option<ProofEvent>,
}

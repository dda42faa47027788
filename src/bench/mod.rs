//! The termination-latency benchmark: exitproof's agent, the polling design it replaces, and
//! systemd's own signal, on the same kill schedule.
//!
//! It is built only with the `bench` feature, as the `exitproof-bench` binary, so the agent's
//! binary carries none of it. `cli` is that binary's command line, `run` drives a run in
//! phases, `schedule` says when each unit is killed, `observer` is the independent referee (a
//! process of its own, with its own D-Bus connection and inotify), `poll` is the polling
//! baseline, `stats` and `report` turn samples into bench.json, bench.md and latency.svg.
//! Unlike the agent, the bench may use threads and sleep: it is a measuring harness, not the
//! thing measured.

#![allow(
    clippy::disallowed_methods,
    reason = "the benchmark measures with the clock; it is not the agent"
)]

mod agent;
pub mod cli;
pub mod observer;
pub mod poll;
pub mod report;
pub mod run;
pub mod sample;
pub mod schedule;
mod setup;
pub mod stats;

use std::time::Duration;

use crate::control::ControlError;
use crate::systemd::ConnectError;
use crate::systemd::manager::ManagerError;

/// The deadline of the bench's own D-Bus calls.
const METHOD_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a benchmark run failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Connect(ConnectError),
    #[error("{0}")]
    Manager(ManagerError),
    #[error("the agent: {0}")]
    Control(ControlError),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0}")]
    Failed(String),
}

/// Waits a few seconds for `child`, asked to end, to exit; kills it if it has not.
fn reap(child: &mut std::process::Child) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    // The bench may sleep: it measures, it is not measured.
    while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Time on CPU from a `schedstat` file (its first field, in nanoseconds).
fn schedstat_ns(path: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// CPU time of every child process this process has waited for, in nanoseconds.
fn children_cpu_ns() -> u64 {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(0, |u| {
        let ns = |t: nix::sys::time::TimeVal| {
            u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
                + u64::try_from(t.tv_usec()).unwrap_or(0) * 1_000
        };
        ns(u.user_time()) + ns(u.system_time())
    })
}

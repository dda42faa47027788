//! The agent's figures for operators: the core's counters and gauges, and what only the driver
//! sees (bus reconnects, inotify watches and overflows), as the `stats` answer and the metrics
//! file carry them.

use serde::Serialize;

use super::core::CoreStats;

/// What only the driver counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverCounters {
    /// Connections to the bus taken into use after the first.
    pub bus_reconnects: u64,
    /// Times the kernel dropped inotify events (`IN_Q_OVERFLOW`).
    pub inotify_overflows: u64,
}

/// The inotify instance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct InotifyStats {
    /// Watches held now (a watched cgroup's `cgroup.events` and its parent directory, which
    /// sibling units share).
    pub watches: u64,
    pub overflows: u64,
}

/// The agent's records sent to journald's native socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct JournaldStats {
    /// Records dropped because journald's socket was full (the loop never waits on it).
    pub dropped: u64,
}

/// Everything `stats` answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AgentStats {
    #[serde(flatten)]
    pub core: CoreStats,
    pub bus_reconnects: u64,
    pub inotify: InotifyStats,
    /// Structured logging to journald.
    pub journald: JournaldStats,
}

impl AgentStats {
    pub fn new(
        core: CoreStats,
        counters: DriverCounters,
        inotify_watches: usize,
        journald_dropped: u64,
    ) -> AgentStats {
        AgentStats {
            core,
            bus_reconnects: counters.bus_reconnects,
            inotify: InotifyStats {
                watches: u64::try_from(inotify_watches).unwrap_or(u64::MAX),
                overflows: counters.inotify_overflows,
            },
            journald: JournaldStats {
                dropped: journald_dropped,
            },
        }
    }
}

//! The agent's figures for operators: the core's counters and gauges, and what only the driver
//! sees (bus reconnects, why systemd is not heard, inotify watches and overflows), as the `stats` answer and the metrics
//! file carry them.

use crate::control::wire::{AgentStats, CoreStats, InotifyStats, JournaldStats, LoopStats};

/// What only the driver counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverCounters {
    /// Connections to the bus taken into use after the first.
    pub bus_reconnects: u64,
    /// Times the kernel dropped inotify events (`IN_Q_OVERFLOW`).
    pub inotify_overflows: u64,
}

impl AgentStats {
    /// The core's figures completed with the driver's.
    pub fn new(
        core: CoreStats,
        counters: DriverCounters,
        inotify_watches: usize,
        journald_dropped: u64,
        systemd_error: Option<String>,
        event_loop: LoopStats,
    ) -> AgentStats {
        AgentStats {
            core,
            bus_reconnects: counters.bus_reconnects,
            systemd_error,
            inotify: InotifyStats {
                watches: u64::try_from(inotify_watches).unwrap_or(u64::MAX),
                overflows: counters.inotify_overflows,
            },
            journald: JournaldStats {
                dropped: journald_dropped,
            },
            event_loop,
        }
    }
}

//! What the core counts as its rules run (proofs by cause, safety-net relists, the latency of
//! each proof past systemd's terminal state), and the gauges it reads off its watches on
//! demand (watches by phase, units blocked by remaining processes). Time comes in as `now`
//! like everywhere in the core.

use std::time::{Duration, Instant};

use super::Core;
use crate::cgroup::CgroupReading;
use crate::control::wire::{Bucket, CoreStats, LatencySummary, PhaseCounts, ProofCounts};
use crate::proof::{Cause, Phase};

/// The upper bounds of the proof-latency histogram's buckets, in microseconds; a last bucket
/// (`le` null, `+Inf`) holds the rest. Fixed, so figures from different agents add up.
pub(crate) const LATENCY_BOUNDS_US: [u64; 16] = [
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    5_000_000,
    30_000_000,
    300_000_000,
];

/// A histogram with fixed buckets: `N` upper bounds in microseconds, and a last bucket (`le`
/// null, `+Inf`) for the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Histogram<const N: usize> {
    bounds: &'static [u64; N],
    /// Per bound (not cumulative).
    counts: [u64; N],
    /// What exceeds every bound.
    above: u64,
    sum_us: u64,
}

impl<const N: usize> Histogram<N> {
    pub(crate) const fn new(bounds: &'static [u64; N]) -> Self {
        Histogram {
            bounds,
            counts: [0; N],
            above: 0,
            sum_us: 0,
        }
    }

    pub(crate) fn observe(&mut self, value: Duration) {
        let us = u64::try_from(value.as_micros()).unwrap_or(u64::MAX);
        match self.bounds.iter().position(|bound| us <= *bound) {
            Some(bucket) => self.counts[bucket] += 1,
            None => self.above += 1,
        }
        self.sum_us = self.sum_us.saturating_add(us);
    }

    /// What the wire and the metrics file show: cumulative counts per bound.
    pub(crate) fn summary(&self) -> LatencySummary {
        let mut running = 0;
        let mut buckets: Vec<Bucket> = self
            .bounds
            .iter()
            .zip(self.counts)
            .map(|(bound, count)| {
                running += count;
                Bucket {
                    le_us: Some(*bound),
                    count: running,
                }
            })
            .collect();
        running += self.above;
        buckets.push(Bucket {
            le_us: None,
            count: running,
        });
        LatencySummary {
            buckets,
            sum_us: self.sum_us,
            count: running,
        }
    }
}

impl ProofCounts {
    fn count(&mut self, cause: Cause) {
        let counter = match cause {
            Cause::Exited => &mut self.exited,
            Cause::ReplacedAfterStop => &mut self.replaced_after_stop,
            Cause::RestartedOutside => &mut self.restarted_outside,
            Cause::Rebooted => &mut self.rebooted,
        };
        *counter += 1;
    }
}

/// What the core counts as it goes.
#[derive(Clone, Debug)]
pub(crate) struct Counters {
    proofs: ProofCounts,
    resyncs: u64,
    latency: Histogram<{ LATENCY_BOUNDS_US.len() }>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            proofs: ProofCounts::default(),
            resyncs: 0,
            latency: Histogram::new(&LATENCY_BOUNDS_US),
        }
    }
}

impl Core {
    /// The core's figures now: its counters, and gauges read off every watch.
    pub(crate) fn stats(&self) -> CoreStats {
        let mut watches = PhaseCounts::default();
        let mut blocked = 0;
        for watch in self.units.values() {
            match watch.phase() {
                Phase::Watching => watches.watching += 1,
                Phase::Stopping => watches.stopping += 1,
                Phase::Proven => watches.proven += 1,
            }
            if watch.event.is_none() && watch.blocked() {
                blocked += 1;
            }
        }
        CoreStats {
            watches,
            blocked,
            proofs: self.counters.proofs,
            resyncs: self.counters.resyncs,
            proof_latency: self.counters.latency.summary(),
        }
    }

    /// Counts a proof, and its latency past the terminal state if the core saw one.
    pub(super) fn count_proof(&mut self, cause: Cause, terminal_at: Option<Instant>, now: Instant) {
        self.counters.proofs.count(cause);
        if let Some(at) = terminal_at {
            self.counters
                .latency
                .observe(now.saturating_duration_since(at));
        }
    }

    pub(super) fn count_resync(&mut self) {
        self.counters.resyncs += 1;
    }
}

impl super::watch::Watch {
    /// Terminal for systemd, but the last reading of its cgroup found processes.
    pub(super) fn blocked(&self) -> bool {
        self.proof.as_ref().is_some_and(|proof| {
            proof.terminal() && matches!(proof.last_reading(), Some(CgroupReading::Populated))
        })
    }
}

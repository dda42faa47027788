//! The loop's own accounting: per proof, the time from the loop's receipt of what decided it
//! (the turn's wake from `epoll_wait`) to the proof written to its subscribers; per turn, what
//! it did (saves, syncs, cgroup reads, heap trims) and how long each took, how long its
//! thread ran on a CPU (the rest it waited: for a disk, a kernel lock or the scheduler), the
//! page faults it took and how often the scheduler took the CPU from it, so that a slow proof
//! is explained by the agent's own figures. Fixed-size: nothing is allocated per turn; a turn
//! reads the thread's CPU time twice and its `getrusage` twice (about 1 and 0.5 to 0.7 µs a
//! read on the 2-vCPU VM of docs/benchmarks/2026-12-05-state).
//!
//! Every input of a turn is stamped with the turn's wake: the bus messages and inotify notices
//! handled in it were all read after it. What a proof waited for before that wake (the
//! scheduler, or a previous turn still running when its message came) is not the proof's
//! turn's, and shows in the slowest turns instead.

use std::time::{Duration, Instant};

use nix::sys::resource::{UsageWho, getrusage};

use crate::agent::core::stats::Histogram;
use crate::clock;
use crate::control::wire::{LoopStats, SlowTurn, TurnWork};

/// The upper bounds of the agent's own proof-latency buckets, in microseconds: fine where a
/// proof's own work lies (tens of microseconds) and around the 0.2 ms its p99 aims at,
/// coarse past a millisecond.
pub(crate) const OWN_LATENCY_BOUNDS_US: [u64; 23] = [
    10, 20, 30, 40, 50, 75, 100, 150, 175, 200, 225, 250, 300, 500, 750, 1_000, 2_000, 5_000,
    10_000, 50_000, 100_000, 1_000_000, 10_000_000,
];

/// How many of the slowest proofs, and of the slowest turns, are kept.
const SLOWEST_KEPT: usize = 5;

/// A kind of work a turn does, timed.
#[derive(Clone, Copy, Debug)]
pub(super) enum Work {
    Save,
    Sync,
    CgroupRead,
    Trim,
}

/// What the loop's turns did, and its proofs' times.
pub(super) struct LoopAccount {
    /// The wake of the turn under way; `None` outside the loop (at start).
    turn_began: Option<TurnStart>,
    turn: TurnWork,
    turns: u64,
    total: TurnWork,
    latency: Histogram<{ OWN_LATENCY_BOUNDS_US.len() }>,
    latency_max: Duration,
    slowest_proofs: Slowest,
    slowest_turns: Slowest,
}

impl LoopAccount {
    pub(super) fn new() -> Self {
        LoopAccount {
            turn_began: None,
            turn: TurnWork::default(),
            turns: 0,
            total: TurnWork::default(),
            latency: Histogram::new(&OWN_LATENCY_BOUNDS_US),
            latency_max: Duration::ZERO,
            slowest_proofs: Slowest::default(),
            slowest_turns: Slowest::default(),
        }
    }

    /// The loop woke at `now`: whatever it reads in this turn arrived by then.
    pub(super) fn turn_begins(&mut self, now: Instant) {
        self.turn_began = Some(TurnStart {
            wake: now,
            mono_ns: clock::monotonic_ns(),
            cpu_ns: clock::thread_cpu_ns(),
            counts: ThreadCounts::now(),
        });
        self.turn = TurnWork::default();
    }

    /// The turn is over at `now`.
    pub(super) fn turn_ends(&mut self, now: Instant) {
        let Some(began) = self.turn_began.take() else {
            return;
        };
        began.thread_since(&mut self.turn);
        self.turns += 1;
        add(&mut self.total, &self.turn);
        self.slowest_turns.offer(SlowTurn {
            at_mono_ns: began.mono_ns,
            us: micros(now.saturating_duration_since(began.wake)),
            work: self.turn,
        });
    }

    pub(super) fn input(&mut self) {
        self.turn.inputs += 1;
    }

    /// `work` ran from `started` to `now`.
    pub(super) fn worked(&mut self, work: Work, started: Instant, now: Instant) {
        let us = micros(now.saturating_duration_since(started));
        let (count, time) = match work {
            Work::Save => (&mut self.turn.saves, &mut self.turn.save_us),
            Work::Sync => (&mut self.turn.syncs, &mut self.turn.sync_us),
            Work::CgroupRead => (&mut self.turn.cgroup_reads, &mut self.turn.cgroup_read_us),
            Work::Trim => (&mut self.turn.trims, &mut self.turn.trim_us),
        };
        *count += 1;
        *time += us;
    }

    /// A proof was written to its subscribers at `now`.
    pub(super) fn proof_told(&mut self, now: Instant) {
        let Some(began) = self.turn_began else {
            return;
        };
        self.turn.proofs += 1;
        let took = now.saturating_duration_since(began.wake);
        self.latency.observe(took);
        self.latency_max = self.latency_max.max(took);
        if self.slowest_proofs.would_keep(micros(took)) {
            // The thread's figures are read only for a proof that is kept: two system calls.
            let mut work = self.turn;
            began.thread_since(&mut work);
            self.slowest_proofs.offer(SlowTurn {
                at_mono_ns: began.mono_ns,
                us: micros(took),
                work,
            });
        }
    }

    pub(super) fn stats(&self) -> LoopStats {
        LoopStats {
            proof_latency: self.latency.summary(),
            proof_latency_max_us: micros(self.latency_max),
            turns: self.turns,
            work: self.total,
            slowest_proofs: self.slowest_proofs.list(),
            slowest_turns: self.slowest_turns.list(),
        }
    }
}

/// Where a turn began: its wake, CLOCK_MONOTONIC and the thread's figures then.
#[derive(Clone, Copy)]
struct TurnStart {
    wake: Instant,
    mono_ns: u64,
    cpu_ns: u64,
    counts: ThreadCounts,
}

impl TurnStart {
    /// Sets `work`'s CPU time, page faults and preemptions to the thread's since the start.
    fn thread_since(&self, work: &mut TurnWork) {
        work.cpu_us = clock::thread_cpu_ns().saturating_sub(self.cpu_ns) / 1000;
        let counts = ThreadCounts::now();
        work.minor_faults = counts.minor_faults.saturating_sub(self.counts.minor_faults);
        work.preemptions = counts.preemptions.saturating_sub(self.counts.preemptions);
    }
}

/// What the kernel counts of the loop's thread (`getrusage(RUSAGE_THREAD)`; zeros if it
/// cannot be read).
#[derive(Clone, Copy, Default)]
struct ThreadCounts {
    minor_faults: u64,
    /// Involuntary context switches: the scheduler gave the CPU to another task.
    preemptions: u64,
}

impl ThreadCounts {
    fn now() -> Self {
        getrusage(UsageWho::RUSAGE_THREAD).map_or_else(
            |_| ThreadCounts::default(),
            |usage| ThreadCounts {
                minor_faults: u64::try_from(usage.minor_page_faults()).unwrap_or(0),
                preemptions: u64::try_from(usage.involuntary_context_switches()).unwrap_or(0),
            },
        )
    }
}

/// The slowest entries so far, slowest first.
#[derive(Default)]
struct Slowest {
    kept: [Option<SlowTurn>; SLOWEST_KEPT],
}

impl Slowest {
    /// Whether an entry that took `us` would be kept.
    fn would_keep(&self, us: u64) -> bool {
        self.kept
            .iter()
            .any(|kept| kept.is_none_or(|kept| kept.us < us))
    }

    fn offer(&mut self, entry: SlowTurn) {
        let Some(at) = self
            .kept
            .iter()
            .position(|kept| kept.is_none_or(|kept| kept.us < entry.us))
        else {
            return;
        };
        self.kept[at..].rotate_right(1);
        self.kept[at] = Some(entry);
    }

    fn list(&self) -> Vec<SlowTurn> {
        self.kept.iter().flatten().copied().collect()
    }
}

fn add(total: &mut TurnWork, turn: &TurnWork) {
    total.inputs += turn.inputs;
    total.proofs += turn.proofs;
    total.saves += turn.saves;
    total.save_us += turn.save_us;
    total.syncs += turn.syncs;
    total.sync_us += turn.sync_us;
    total.cgroup_reads += turn.cgroup_reads;
    total.cgroup_read_us += turn.cgroup_read_us;
    total.trims += turn.trims;
    total.trim_us += turn.trim_us;
    total.cpu_us += turn.cpu_us;
    total.minor_faults += turn.minor_faults;
    total.preemptions += turn.preemptions;
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slow(us: u64) -> SlowTurn {
        SlowTurn {
            us,
            ..SlowTurn::default()
        }
    }

    #[test]
    fn the_slowest_are_kept_slowest_first() {
        let mut slowest = Slowest::default();
        for us in [5, 1, 9, 3, 7, 2, 8, 6] {
            slowest.offer(slow(us));
        }
        let kept: Vec<u64> = slowest.list().iter().map(|s| s.us).collect();
        assert_eq!(kept, [9, 8, 7, 6, 5]);
    }

    #[test]
    fn a_proof_is_timed_from_its_turn_s_wake_with_the_work_done_before_it() {
        let mut account = LoopAccount::new();
        let wake = Instant::now();
        account.turn_begins(wake);
        account.input();
        account.worked(
            Work::CgroupRead,
            wake + Duration::from_micros(10),
            wake + Duration::from_micros(40),
        );
        account.proof_told(wake + Duration::from_micros(60));
        account.worked(
            Work::Save,
            wake + Duration::from_micros(60),
            wake + Duration::from_micros(560),
        );
        account.turn_ends(wake + Duration::from_micros(570));
        let stats = account.stats();
        assert_eq!(stats.proof_latency.count, 1);
        assert_eq!(stats.proof_latency_max_us, 60);
        assert_eq!(stats.turns, 1);
        let proof = stats.slowest_proofs[0];
        assert_eq!((proof.us, proof.work.cgroup_reads), (60, 1));
        assert_eq!(proof.work.cgroup_read_us, 30);
        assert_eq!(
            proof.work.saves, 0,
            "the save came after the proof was told"
        );
        let turn = stats.slowest_turns[0];
        assert_eq!((turn.us, turn.work.saves, turn.work.save_us), (570, 1, 500));
        assert_eq!(stats.work.proofs, 1);
    }

    #[test]
    fn a_turn_counts_the_time_its_thread_ran_on_a_cpu() {
        let mut account = LoopAccount::new();
        account.turn_begins(Instant::now());
        let spun = clock::thread_cpu_ns();
        while clock::thread_cpu_ns() < spun + 2_000_000 {
            std::hint::spin_loop();
        }
        account.proof_told(Instant::now());
        account.turn_ends(Instant::now());
        let stats = account.stats();
        assert!(stats.work.cpu_us >= 2_000, "{:?}", stats.work);
        assert!(stats.slowest_proofs[0].work.cpu_us >= 2_000);
    }

    #[test]
    fn a_turn_counts_the_page_faults_its_thread_took() {
        let mut account = LoopAccount::new();
        account.turn_begins(Instant::now());
        // 64 MiB, fresh from the kernel: touching it faults a page (or a huge page) at a time.
        let mut heap = vec![0u8; 64 << 20];
        for page in heap.chunks_mut(4096) {
            page[0] = 1;
        }
        std::hint::black_box(&heap);
        account.turn_ends(Instant::now());
        let work = account.stats().work;
        assert!(work.minor_faults >= 32, "{work:?}");
    }

    #[test]
    fn a_proof_outside_the_loop_is_not_timed() {
        let mut account = LoopAccount::new();
        account.proof_told(Instant::now());
        assert_eq!(account.stats().proof_latency.count, 0);
    }
}

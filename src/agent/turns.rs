//! The loop's own accounting: per proof, the time from the loop's receipt of what decided it
//! (the turn's wake from `epoll_wait`) to the proof written to its subscribers (the last write
//! counted by its own CPU time: the subscriber it wakes may take the CPU before it returns, and
//! has the proof by then); per turn, what
//! it did (saves, syncs, cgroup reads, heap trims, leftover counts, the bus, the rules, answers
//! and events to clients, log lines) and how long each took, how long its
//! thread ran on a CPU (the rest it waited: for a disk, a kernel lock or the scheduler), the
//! page faults it took and how often the scheduler took the CPU from it, so that a slow proof
//! is explained by the agent's own figures. Fixed-size: nothing is allocated per turn; a turn
//! reads the thread's CPU time twice and its `getrusage` twice (about 1 and 0.5 to 0.7 µs a
//! read on the 2-vCPU VM of docs/benchmarks/2026-12-05-state), and the clock once at each
//! beginning and end of a kind of work (tens of nanoseconds, from the vDSO).
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

/// A kind of work a turn does, timed. Each moment of a turn is charged to one kind at most:
/// work begun inside another pauses it (the rules, handed a message inside the bus's work, or
/// a save they asked for).
#[derive(Clone, Copy, Debug)]
pub(super) enum Work {
    Save,
    Sync,
    CgroupRead,
    Trim,
    /// Listing a cgroup's processes and reading `/proc` for a count of leftovers, or a root's
    /// start when systemd first names it.
    Census,
    /// The D-Bus connection: reading and decoding messages, sending calls.
    Bus,
    /// The core: the rules and the proofs.
    Rules,
    /// Answers and proof events encoded and written to clients.
    Tell,
    /// Log lines written.
    Log,
}

/// How many kinds of [`Work`] there are.
const WORK_KINDS: usize = 9;

/// The work a [`LoopAccount::begin`] paused, given back to [`LoopAccount::end`].
#[must_use = "the work paused is resumed by `end`"]
pub(super) struct Paused(Option<Work>);

/// What the loop's turns did, and its proofs' times.
pub(super) struct LoopAccount {
    /// The wake of the turn under way; `None` outside the loop (at start).
    turn_began: Option<TurnStart>,
    turn: TurnWork,
    /// The work under way and since when.
    doing: Option<(Work, Instant)>,
    /// Each kind's time in the turn so far, in nanoseconds, by `Work as usize`: summed in
    /// nanoseconds, as many spans are shorter than a microsecond.
    turn_ns: [u64; WORK_KINDS],
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
            doing: None,
            turn_ns: [0; WORK_KINDS],
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
        self.turn_ns = [0; WORK_KINDS];
        self.doing = None;
    }

    /// The turn is over at `now`.
    pub(super) fn turn_ends(&mut self, now: Instant) {
        let Some(began) = self.turn_began.take() else {
            return;
        };
        if let Some((work, since)) = self.doing.take() {
            self.charge(work, since, now);
        }
        self.turn_times();
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

    /// `work` begins at `now`, pausing the work under way, which [`LoopAccount::end`] resumes.
    pub(super) fn begin(&mut self, work: Work, now: Instant) -> Paused {
        let count = match work {
            Work::Save => Some(&mut self.turn.saves),
            Work::Sync => Some(&mut self.turn.syncs),
            Work::CgroupRead => Some(&mut self.turn.cgroup_reads),
            Work::Trim => Some(&mut self.turn.trims),
            Work::Census | Work::Bus | Work::Rules | Work::Tell | Work::Log => None,
        };
        if let Some(count) = count {
            *count += 1;
        }
        let paused = self.doing.replace((work, now));
        if let Some((outer, since)) = paused {
            self.charge(outer, since, now);
        }
        Paused(paused.map(|(outer, _)| outer))
    }

    /// The work begun last ends at `now`; what it paused resumes.
    pub(super) fn end(&mut self, paused: Paused, now: Instant) {
        if let Some((work, since)) = self.doing.take() {
            self.charge(work, since, now);
        }
        self.doing = paused.0.map(|outer| (outer, now));
    }

    fn charge(&mut self, work: Work, since: Instant, now: Instant) {
        let ns = now.saturating_duration_since(since).as_nanos();
        self.turn_ns[work as usize] += u64::try_from(ns).unwrap_or(u64::MAX);
    }

    /// Sets the turn's times of each kind of work from what was charged so far.
    fn turn_times(&mut self) {
        let us = |work: Work| self.turn_ns[work as usize] / 1000;
        self.turn.save_us = us(Work::Save);
        self.turn.sync_us = us(Work::Sync);
        self.turn.cgroup_read_us = us(Work::CgroupRead);
        self.turn.trim_us = us(Work::Trim);
        self.turn.census_us = us(Work::Census);
        self.turn.bus_us = us(Work::Bus);
        self.turn.rules_us = us(Work::Rules);
        self.turn.tell_us = us(Work::Tell);
        self.turn.log_us = us(Work::Log);
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
            // The work under way is charged up to now, and goes on.
            if let Some((work, since)) = self.doing {
                self.charge(work, since, now);
                self.doing = Some((work, now));
            }
            self.turn_times();
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
    total.census_us += turn.census_us;
    total.bus_us += turn.bus_us;
    total.rules_us += turn.rules_us;
    total.tell_us += turn.tell_us;
    total.log_us += turn.log_us;
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
        let at = |us| wake + Duration::from_micros(us);
        account.input();
        let bus = account.begin(Work::Bus, at(5));
        let rules = account.begin(Work::Rules, at(8));
        let read = account.begin(Work::CgroupRead, at(10));
        account.end(read, at(40));
        let tell = account.begin(Work::Tell, at(45));
        account.proof_told(at(60));
        account.end(tell, at(61));
        account.end(rules, at(62));
        account.end(bus, at(63));
        let save = account.begin(Work::Save, at(63));
        account.end(save, at(563));
        account.turn_ends(at(570));
        let stats = account.stats();
        assert_eq!(stats.proof_latency.count, 1);
        assert_eq!(stats.proof_latency_max_us, 60);
        assert_eq!(stats.turns, 1);
        let proof = stats.slowest_proofs[0];
        assert_eq!((proof.us, proof.work.cgroup_reads), (60, 1));
        assert_eq!(proof.work.cgroup_read_us, 30);
        // Each moment charged once: the bus until the rules began, the rules but for the
        // read, the telling up to the proof.
        let w = proof.work;
        assert_eq!((w.bus_us, w.rules_us, w.tell_us), (3, 7, 15));
        assert_eq!(
            proof.work.saves, 0,
            "the save came after the proof was told"
        );
        let turn = stats.slowest_turns[0];
        assert_eq!((turn.us, turn.work.saves, turn.work.save_us), (570, 1, 500));
        let w = turn.work;
        assert_eq!((w.bus_us, w.rules_us, w.tell_us), (4, 8, 16));
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

//! Placing a process's start (clock ticks since boot) against a CLOCK_MONOTONIC threshold, and
//! telling the processes that may be an earlier invocation's from the current one's.

use std::collections::{HashMap, HashSet};

use nix::time::ClockId;
use nix::unistd::{SysconfVar, sysconf};

use super::{NANOS_PER_SEC, ProcessInfo, ProcsError};

/// How a process's start time stands against a CLOCK_MONOTONIC threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StartOrder {
    /// The process certainly started before the threshold.
    Before,
    /// The tick truncation or the boottime/monotonic offset leaves it open.
    Uncertain,
    /// The process certainly started at or after the threshold.
    AtOrAfter,
}

impl StartOrder {
    #[cfg(test)]
    /// Whether a process with this order must be counted as started before the threshold: unless it
    /// certainly started at or after it, it is.
    pub(crate) fn counts_as_before(self) -> bool {
        self != Self::AtOrAfter
    }
}

/// What is needed to place a `/proc` start time (clock ticks on CLOCK_BOOTTIME) on CLOCK_MONOTONIC.
///
/// Both clocks, `/proc` and the threshold must belong to one time namespace (systemd's, the initial
/// one): a time namespace shifts CLOCK_BOOTTIME and CLOCK_MONOTONIC by offsets of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ClockBasis {
    /// Clock ticks per second, `sysconf(_SC_CLK_TCK)` (usually 100).
    pub clk_tck: u64,
    /// CLOCK_BOOTTIME minus CLOCK_MONOTONIC, in nanoseconds: the time spent suspended since boot.
    /// It only grows, so a value read now is at least the offset at any past instant.
    pub boot_minus_mono_ns: u64,
    /// What the offset was seen to be at least, from instants before: what bounds it at a past
    /// instant from below.
    pub floors: OffsetFloors,
}

/// How many offsets [`OffsetFloors`] keeps: the offset changes only when the machine suspends,
/// and forgetting the oldest only makes a start before them uncertain.
const MAX_FLOORS: usize = 4;

/// The least the boottime/monotonic offset was from each of a few CLOCK_MONOTONIC instants on,
/// as the driver saw it: the offset only grows, so a reading bounds it from below ever after.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OffsetFloors {
    /// (CLOCK_MONOTONIC µs, offset ns), both rising; `len` of them in use.
    seen: [(u64, u64); MAX_FLOORS],
    len: usize,
}

impl OffsetFloors {
    /// Notes that from `mono_us` on, the offset was at least `offset_ns`; true if that bounds
    /// it more than the floors before (a floor of 0 bounds nothing).
    pub(crate) fn note(&mut self, mono_us: u64, offset_ns: u64) -> bool {
        let known = self.seen[..self.len].last().map_or(0, |&(_, floor)| floor);
        if offset_ns <= known {
            return false;
        }
        if self.len == MAX_FLOORS {
            self.seen.copy_within(1.., 0);
            self.len -= 1;
        }
        self.seen[self.len] = (mono_us, offset_ns);
        self.len += 1;
        true
    }

    /// The floors as (CLOCK_MONOTONIC µs, offset ns) pairs, oldest first: what the agent saves,
    /// so that an agent started again in the same boot knows how long the machine had been
    /// suspended before it started (a start before a suspend it slept through is placed then).
    pub(crate) fn pairs(&self) -> &[(u64, u64)] {
        &self.seen[..self.len]
    }

    /// Floors from saved `pairs`; pairs that do not rise (a file edited by hand) are skipped.
    pub(crate) fn from_pairs(pairs: &[(u64, u64)]) -> OffsetFloors {
        let mut floors = OffsetFloors::default();
        for &(mono_us, offset_ns) in pairs {
            let later = floors
                .pairs()
                .last()
                .is_none_or(|&(since, _)| mono_us >= since);
            if later {
                floors.note(mono_us, offset_ns);
            }
        }
        floors
    }

    /// The least the offset can have been at `mono_ns`.
    fn at(&self, mono_ns: u128) -> u128 {
        self.seen[..self.len]
            .iter()
            .rev()
            .find(|&&(since_us, _)| u128::from(since_us) * 1000 <= mono_ns)
            .map_or(0, |&(_, floor)| u128::from(floor))
    }
}

impl ClockBasis {
    /// Reads the tick rate and the boottime/monotonic offset now, with the `floors` noted so
    /// far ([`offset_now`] at each turn).
    pub(crate) fn now(floors: OffsetFloors) -> Result<Self, ProcsError> {
        Ok(Self {
            clk_tck: clk_tck()?,
            boot_minus_mono_ns: boot_minus_mono_ns()?,
            floors,
        })
    }

    /// Places a process that started at `start_ticks` (field 22 of `/proc/PID/stat`) against
    /// `threshold_mono_us`, a CLOCK_MONOTONIC time in microseconds such as systemd's
    /// `InactiveExitTimestampMonotonic`.
    ///
    /// The kernel truncates the fork's boottime to whole ticks, so the true boottime start lies in
    /// `[ticks, ticks + 1)` ticks. Its monotonic time is that minus the offset at the fork, which lies
    /// between 0 and `boot_minus_mono_ns`. So:
    /// - [`StartOrder::AtOrAfter`] only if the earliest possible start (tick start minus the whole
    ///   offset read now, rounded down) is at or after the threshold;
    /// - [`StartOrder::Before`] only if the latest possible start (next tick start, less the least
    ///   offset at the threshold, rounded up) is at or before the threshold: a start at or after
    ///   the threshold had at least that offset;
    /// - [`StartOrder::Uncertain`] otherwise, and whenever `clk_tck` is 0.
    pub(crate) fn start_order(&self, start_ticks: u64, threshold_mono_us: u64) -> StartOrder {
        if self.clk_tck == 0 {
            return StartOrder::Uncertain;
        }
        let clk_tck = u128::from(self.clk_tck);
        let threshold_ns = u128::from(threshold_mono_us) * 1000;
        let earliest_boot_ns = u128::from(start_ticks) * NANOS_PER_SEC / clk_tck;
        let earliest_mono_ns = earliest_boot_ns.saturating_sub(u128::from(self.boot_minus_mono_ns));
        if earliest_mono_ns >= threshold_ns {
            return StartOrder::AtOrAfter;
        }
        // Monotonic time never exceeds boottime, so the end of the tick bounds the start from
        // above; a fork at or after the threshold saw at least the offset then.
        let end_of_tick_ns = (u128::from(start_ticks) + 1) * NANOS_PER_SEC;
        if end_of_tick_ns.div_ceil(clk_tck) <= threshold_ns + self.floors.at(threshold_ns) {
            StartOrder::Before
        } else {
            StartOrder::Uncertain
        }
    }
}

/// What tells the processes of a unit's current invocation from those of an earlier one, as
/// systemd reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NextInvocation {
    /// When the current invocation left `inactive` (InactiveExitTimestampMonotonic, µs), if
    /// known. systemd forks its first process just *before* it records this, so the roots below
    /// are needed too.
    pub began_us: Option<u64>,
    /// Its MainPID and ControlPID, if known (non-zero).
    pub roots: Vec<i32>,
    /// When the invocation `roots` are of began (the current one: `began_us` may be an
    /// earlier one's once others are absorbed), which rule 0 of [`earlier_processes`] judges
    /// them against.
    pub roots_began_us: Option<u64>,
    /// Every other MainPID and ControlPID systemd named for it before (an ExecStartPre=, an
    /// ExecStart= that has exited): each began a session of its own, which its orphans keep.
    pub gone_roots: Vec<GoneRoot>,
    /// Processes a count held as possibly ours and held no more (they exited, or a later count
    /// found them not ours), each with its start: a root systemd named with such a pid, gone
    /// now, is judged by that start, as rule 0 judges a root alive. systemd guesses our leftover as a MainPID (see
    /// [`earlier_processes`]), and the session such a guess leads stays ours once it is gone.
    /// A pid used again since started later, so that errs toward waiting.
    pub once_held: OnceHeld,
    /// The MainPIDs and ControlPIDs systemd named for the counted invocation: one named again
    /// for a later invocation and gone before a count saw its start is systemd's guess of that
    /// process (`unit_search_main_pid`), whose session stays the counted one's; a later root
    /// alive in the session one of them began is such a guess too (the counted one's leftover).
    /// Its pid used again by a root of a later invocation errs toward waiting.
    pub counted_roots: Vec<i32>,
}

/// A process as a count of leftovers saw it: its pid and its start (clock ticks since boot,
/// field 22 of `/proc/PID/stat`), which together name it for good; and, for one a count
/// holds, its place as the first count that held it saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ProcessStart {
    pub pid: i32,
    pub start_ticks: u64,
    /// Where the first count that held it found it (`None`: not known, as of one gone).
    pub held_as: Option<Lineage>,
}

/// A process's place when a count held it: what its judgment could rest on besides its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lineage {
    /// Its parent, if the parent was in the census (0: it was not).
    pub parent: i32,
    /// Its session.
    pub session: i32,
}

impl ProcessStart {
    /// `process` as a count holds it, with its place in the census, whose pids are `listed`.
    pub(crate) fn held_in(process: &ProcessInfo, listed: &HashSet<i32>) -> Self {
        let parent_listed = listed.contains(&process.ppid);
        Self {
            pid: process.pid,
            start_ticks: process.start_ticks,
            held_as: Some(Lineage {
                parent: if parent_listed { process.ppid } else { 0 },
                session: process.session,
            }),
        }
    }

    /// Whether this process, held, is `now` in the census of `by_pid` where a count first held
    /// it: its parent (in the census or not) and its session the same. Then it being held
    /// tells nothing a judgment of the census now does not: its lineage and session are there
    /// to judge, and what else it was held for (an unknown beginning, a root not yet told) is
    /// known as well or better now.
    fn placed_as_held(&self, now: &ProcessInfo, by_pid: &HashMap<i32, &ProcessInfo>) -> bool {
        self.held_as.is_some_and(|held_as| {
            let parent_listed = by_pid.contains_key(&now.ppid);
            now.pid == self.pid
                && now.start_ticks == self.start_ticks
                && now.session == held_as.session
                && if held_as.parent == 0 {
                    !parent_listed
                } else {
                    now.ppid == held_as.parent && parent_listed
                }
        })
    }
}

/// Processes held as possibly ours and held no more, each with its start
/// ([`NextInvocation::once_held`]), oldest first. One is kept inline, as every running unit's
/// MainPID is once its start is read: a vector of its own and the box around it held 2.7 MB at
/// 10,000 watched units (heaptrack, docs/benchmarks/2026-12-07). More are boxed, a thin
/// pointer, which keeps this the size of one.
#[derive(Clone, Debug, Default)]
pub(crate) enum OnceHeld {
    #[default]
    None,
    One(ProcessStart),
    #[expect(
        clippy::box_collection,
        reason = "a thin pointer keeps every watch 8 bytes smaller"
    )]
    Many(Box<Vec<ProcessStart>>),
}

impl OnceHeld {
    /// Each process kept, oldest first.
    pub(crate) fn as_slice(&self) -> &[ProcessStart] {
        match self {
            OnceHeld::None => &[],
            OnceHeld::One(process) => std::slice::from_ref(process),
            OnceHeld::Many(processes) => processes,
        }
    }

    /// Keeps `process`: the last of a pid replaces the one before (its place as first held
    /// kept if it is the same process), and the oldest go first beyond [`MAX_GONE_ROOTS`] (a
    /// start forgotten makes a root named with that pid, gone, count as its invocation's, as
    /// before a count held it).
    pub(crate) fn note(&mut self, mut process: ProcessStart) {
        let before = self.as_slice().iter().find(|k| k.pid == process.pid);
        if let Some(known) = before
            && known.start_ticks == process.start_ticks
        {
            process.held_as = process.held_as.or(known.held_as);
        }
        match self {
            OnceHeld::None => *self = OnceHeld::One(process),
            OnceHeld::One(only) if only.pid == process.pid => *only = process,
            OnceHeld::One(only) => *self = OnceHeld::Many(Box::new(vec![*only, process])),
            OnceHeld::Many(processes) => {
                processes.retain(|k| k.pid != process.pid);
                if processes.len() == MAX_GONE_ROOTS {
                    processes.remove(0);
                }
                processes.push(process);
            }
        }
    }
}

/// Equal when the same processes are kept in the same order, however they are held.
impl PartialEq for OnceHeld {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for OnceHeld {}

#[cfg(test)]
impl From<Vec<ProcessStart>> for OnceHeld {
    fn from(processes: Vec<ProcessStart>) -> Self {
        match processes[..] {
            [] => OnceHeld::None,
            [process] => OnceHeld::One(process),
            _ => OnceHeld::Many(Box::new(processes)),
        }
    }
}

/// A MainPID or ControlPID systemd named for an invocation after the counted one, and no longer
/// names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GoneRoot {
    pub pid: i32,
    /// When the invocation it was named for left `inactive` (InactiveExitTimestampMonotonic,
    /// µs), if known: no member of a session it began started before that invocation could
    /// fork.
    pub began_us: Option<u64>,
}

/// How many gone roots a [`NextInvocation`] keeps; the oldest go first, and a session
/// forgotten only makes its orphans wait. An invocation has up to eight (one per command it
/// runs), and a unit restarted outside while ours waits may run many: 16 lost the first
/// invocation after ours, whose orphans the cgroup holds as long as any other's, after three
/// or four restarts (found by the simulator). Only a watch that waits has them.
const MAX_GONE_ROOTS: usize = 64;

impl NextInvocation {
    /// Adds what is known of another invocation after the one counted for: a process that
    /// began after the earliest of them began, or in a session one of them began, is not the
    /// counted one's either.
    pub(crate) fn absorb(&mut self, later: &NextInvocation) {
        self.began_us = earliest(self.began_us, later.began_us);
        let later_roots = later.roots.iter().map(|&pid| GoneRoot {
            pid,
            began_us: later.roots_began_us,
        });
        for root in later_roots.chain(later.gone_roots.iter().copied()) {
            if self.roots.contains(&root.pid) {
                continue;
            }
            if let Some(known) = self.gone_roots.iter_mut().find(|g| g.pid == root.pid) {
                // A root gathered before its invocation's beginning was said takes it once
                // said; of two invocations after the counted one, the earlier's: a member of
                // that session which started between the two is the earlier's.
                known.began_us = earliest(known.began_us, root.began_us);
            } else {
                if self.gone_roots.len() == MAX_GONE_ROOTS {
                    self.gone_roots.remove(0);
                }
                self.gone_roots.push(root);
            }
        }
        for &process in later.once_held.as_slice() {
            self.note_once_held(process);
        }
        self.note_counted_roots(&later.counted_roots);
    }

    /// Keeps `pids`, roots systemd named for the counted invocation, the oldest going first
    /// beyond [`MAX_GONE_ROOTS`].
    pub(crate) fn note_counted_roots(&mut self, pids: &[i32]) {
        for &pid in pids {
            if !self.counted_roots.contains(&pid) {
                if self.counted_roots.len() == MAX_GONE_ROOTS {
                    self.counted_roots.remove(0);
                }
                self.counted_roots.push(pid);
            }
        }
    }

    /// Keeps `process`, held as possibly ours and held no more ([`OnceHeld::note`]).
    pub(crate) fn note_once_held(&mut self, process: ProcessStart) {
        self.once_held.note(process);
    }

    /// The pids of [`NextInvocation::gone_roots`].
    #[cfg(test)]
    pub(crate) fn gone_pids(&self) -> Vec<i32> {
        self.gone_roots.iter().map(|g| g.pid).collect()
    }
}

/// The earlier of two beginnings, either of which may be unknown.
fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// How far up the parent chain a process is followed to a root of the current invocation.
const MAX_ANCESTRY: usize = 64;

/// How long before the stamp of its beginning (InactiveExitTimestamp) systemd forks an
/// invocation's first process, in clock ticks, on a machine that lets it run: it forks, then
/// records the state change (`service_spawn`, then `service_set_state` and `unit_notify`),
/// microseconds apart, and the tick truncation of `/proc`'s start times is allowed for besides.
const FIRST_FORK_SLACK_TICKS: u64 = 2;

/// How long before that stamp systemd may have forked the first process on a loaded machine,
/// preempted between the fork and the stamp: 26 to 36 ms was seen in CI on the 2-core machine (a
/// real-systemd test's restart). A root that started within this of its invocation's
/// beginning, but before [`FIRST_FORK_SLACK_TICKS`], is taken for that first fork, not for a
/// guess, unless its invocation named another root: systemd guesses a MainPID only after the
/// ExecStart= of a Type=forking service exited.
const LATE_STAMP_SLACK_US: u64 = 500_000;

/// Whether a process that started at `start_ticks` certainly started more than `slack_us`
/// before an invocation that began at `began`.
fn started_before(basis: &ClockBasis, start_ticks: u64, began: Option<u64>, slack_us: u64) -> bool {
    began.is_some_and(|began| {
        basis.start_order(start_ticks, began.saturating_sub(slack_us)) == StartOrder::Before
    })
}

/// Whether a process that started at `start_ticks` certainly started before an invocation
/// that began at `began` could fork its first process, on a machine that lets systemd run.
fn before_first_fork(basis: &ClockBasis, start_ticks: u64, began: Option<u64>) -> bool {
    let slack_us = FIRST_FORK_SLACK_TICKS * 1_000_000 / basis.clk_tck.max(1);
    started_before(basis, start_ticks, began, slack_us)
}

/// Whether a process that started at `start_ticks` certainly started before an invocation
/// that began at `began` could fork its first process, however late systemd stamped it
/// ([`LATE_STAMP_SLACK_US`]).
fn before_late_stamp(basis: &ClockBasis, start_ticks: u64, began: Option<u64>) -> bool {
    let slack_us =
        LATE_STAMP_SLACK_US.max(FIRST_FORK_SLACK_TICKS * 1_000_000 / basis.clk_tck.max(1));
    started_before(basis, start_ticks, began, slack_us)
}

/// The processes of `census` that may belong to an earlier invocation, given `held`, the
/// processes an earlier count kept. systemd starts every process of a service as the leader of
/// a session of its own (MainPID, ControlPID), and what they fork keeps that session even once
/// orphaned. So, for each process, the first that applies:
/// 0. it certainly started before the invocation of `next`'s roots could fork (its beginning
///    less [`LATE_STAMP_SLACK_US`], or less [`FIRST_FORK_SLACK_TICKS`] where that invocation
///    named another root): neither a root of it, whatever systemd names it, nor of a root's
///    lineage or session. systemd guesses the MainPID of a Type=forking service without
///    PIDFile= (`unit_search_main_pid`: the only process of the cgroup whose parent is the
///    manager), after its ExecStart= exited, and an earlier invocation's orphan is such a one.
///    So is a root alive in the session of a root systemd named for the counted invocation
///    ([`NextInvocation::counted_roots`]), whenever it started: a session's members descend
///    from its leader. So is a root alive in a session not its own of which a member (alive,
///    or as a count held it) certainly started before that invocation could fork: systemd
///    begins a session for each process it spawns, so a daemon it names rightly is in a
///    session one of that invocation's processes began, which has no member older than it.
///    So, for the same reason, is a root alive in a session not its own whose leader systemd
///    never named a root of an invocation after ours (our leftover's child, guessed, when the
///    agent never heard the leftover's session named for ours; a daemon whose ExecStart= the
///    agent did not hear named waits too, until it exits). A root gone from the census is
///    judged so by its session too, and by its start where a count held it
///    ([`NextInvocation::once_held`]);
/// 1. it or an ancestor within the census is a root of `next`, or it is in a root's session:
///    `next`'s (systemd's word beats any guess);
/// 2. an ancestor within the census was held before or started before `next` began (the
///    child of a leftover is a leftover), unless rule 3 makes that ancestor `next`'s: earlier;
/// 3. it is a member of the session of one of `next`'s gone roots, or that root itself
///    outliving its stop: `next`'s, even if held before for want of knowing that root. The
///    kernel does not hand out a pid still in use as a session id, so the session is the one
///    that root began, or one begun after that root was gone, which is after `next` began; so
///    not a process that certainly started before that root's invocation could fork, where
///    its beginning is known (a session has no member older than it: the gone root was a
///    guess of systemd's, as in rule 0), nor a member of the session of a gone root that was
///    such a guess, by its start alive or as a count held it: that session is the one our
///    leftover led, and what it forked into it, even after `next` began, is ours. The root
///    itself counts only where that beginning is known and its start is not before it: its
///    pid may have been used again;
/// 4. it was held before, or it is in the session of a process held before or started before
///    `next` began: earlier;
/// 5. it is in a session whose leader is gone (not one it began itself): earlier, an orphan
///    of a session that is not known to be `next`'s;
/// 6. earlier unless it started certainly at or after `next` began.
///
/// A process of `held` counts as held before (rules 2 and 4) only once it is not where the count
/// that first held it found it ([`ProcessStart::held_as`]: its parent left the census, or its
/// session changed), or where that is not known; one still there is judged as if never held, by
/// what is known now.
///
/// An uncertain start counts as earlier: this errs toward waiting. What it cannot see: a child
/// that a leftover of ours forks after `next` began and that starts a session of its own,
/// counts as `next`'s.
pub(crate) fn earlier_processes<'a>(
    census: &'a [ProcessInfo],
    next: &NextInvocation,
    basis: &ClockBasis,
    held: &[ProcessStart],
) -> Vec<&'a ProcessInfo> {
    let by_pid: HashMap<i32, &ProcessInfo> = census.iter().map(|p| (p.pid, p)).collect();
    let sessions_of = |pids: &[i32]| -> HashSet<i32> {
        pids.iter()
            .flat_map(|pid| [Some(*pid), by_pid.get(pid).map(|p| p.session)])
            .flatten()
            .collect()
    };
    let before_next =
        |p: &ProcessInfo| before_late_stamp(basis, p.start_ticks, next.roots_began_us);
    // Whether the invocation that began at `began` named a root other than `pid`.
    let named_another = |pid: i32, began: Option<u64>| {
        let roots = next.roots.iter().map(|&root| (root, next.roots_began_us));
        let gone = next.gone_roots.iter().map(|g| (g.pid, g.began_us));
        began.is_some()
            && roots
                .chain(gone)
                .any(|(root, of)| root != pid && of == began)
    };
    // Whether a member of `session` started before an invocation that began at `began` could
    // fork: alive in the census, or as a count held it (gone since, the session id may have
    // been used again, which errs toward waiting).
    let session_older = |session: i32, began: Option<u64>| {
        let alive = census.iter().filter(|p| p.session == session);
        let held_in = held
            .iter()
            .chain(next.once_held.as_slice())
            .filter(|e| e.held_as.is_some_and(|h| h.session == session));
        alive
            .map(|p| p.start_ticks)
            .chain(held_in.map(|e| e.start_ticks))
            .any(|start| before_late_stamp(basis, start, began))
    };
    // Whether systemd's naming `pid` a root of an invocation that began at `began` was a
    // guess: alive, by its session where systemd named that session's leader a root of the
    // counted invocation (its leftover's, forked before or after `began`) or where it is not
    // its own and a member of it started before `began`, or its leader was never named a root
    // of an invocation after ours (systemd forks each root it spawns as a session's leader,
    // and a daemon it names is in a session one of them began), else by
    // its start (a pid used again is a new process); gone, by its start as a count held it
    // (held still, its exit not yet heard, or exited since), or, gone before any count saw
    // it, if systemd named it a root of the counted invocation too.
    // Whether systemd named `pid` a MainPID or ControlPID of an invocation after ours.
    let named_after_ours =
        |pid: i32| next.roots.contains(&pid) || next.gone_roots.iter().any(|g| g.pid == pid);
    let guessed = |pid: i32, began: Option<u64>| {
        let alive = by_pid.get(&pid);
        if alive.is_some_and(|p| {
            next.counted_roots.contains(&p.session)
                || (p.session != p.pid
                    && (session_older(p.session, began) || !named_after_ours(p.session)))
        }) {
            return true;
        }
        // Gone, by its session as alive: a member that certainly started before that
        // invocation could fork is in a session it did not begin (the simulator's
        // 228379457909335, once rule 3's other case was read).
        if alive.is_none() && session_older(pid, began) {
            return true;
        }
        let start = match alive {
            Some(p) => Some(p.start_ticks),
            None => held
                .iter()
                .chain(next.once_held.as_slice())
                .find(|e| e.pid == pid)
                .map(|e| e.start_ticks),
        };
        match start {
            Some(start) => {
                before_late_stamp(basis, start, began)
                    || (before_first_fork(basis, start, began) && named_another(pid, began))
            }
            None => next.counted_roots.contains(&pid),
        }
    };
    // What was held counts as held (rules 2 and 4) unless it is where it was when first held:
    // then it is judged afresh, as if never held. A process held while `next`'s beginning was
    // unknown would otherwise wait as ours for good, though it started after `next` began, in a
    // session of its own and with no parent in the census, which a count would not hold today.
    // One that has lost its parent or changed its session since is still held: what it was
    // held for may have gone with them (a child our leftover forked after `next` began).
    let held: Vec<i32> = held
        .iter()
        .filter(|h| {
            by_pid
                .get(&h.pid)
                .is_none_or(|now| !h.placed_as_held(now, &by_pid))
        })
        .map(|p| p.pid)
        .collect();
    // Rule 0: a root that started before `next` could fork is a guess of systemd's.
    let roots: Vec<i32> = next
        .roots
        .iter()
        .copied()
        .filter(|&pid| !guessed(pid, next.roots_began_us))
        .collect();
    let next_sessions = sessions_of(&roots);
    let held_sessions = sessions_of(&held);
    // The process and its ancestors within the census, nearest first.
    let lineage = |process: &'a ProcessInfo| {
        let mut chain = vec![process];
        let mut at = process;
        while chain.len() < MAX_ANCESTRY {
            match by_pid.get(&at.ppid) {
                Some(parent) if !chain.iter().any(|p| p.pid == parent.pid) => {
                    chain.push(parent);
                    at = parent;
                }
                _ => break,
            }
        }
        chain
    };
    let began_after = |p: &ProcessInfo| {
        next.began_us
            .is_some_and(|began| basis.start_order(p.start_ticks, began) == StartOrder::AtOrAfter)
    };
    let is_next = |process: &'a ProcessInfo| {
        !before_next(process)
            && (lineage(process).iter().any(|p| roots.contains(&p.pid))
                || next_sessions.contains(&process.session))
    };
    // Rule 3's: not a process that started before the root's invocation could fork, as a
    // session has no member older than its leader's setsid (a gone root systemd guessed, an
    // earlier invocation's orphan, leads a session of ours); and the session's leader only
    // where that beginning is known, as its pid may be a gone root's used again earlier.
    let in_gone_roots_session = |p: &ProcessInfo| {
        next.gone_roots.iter().any(|g| {
            g.pid == p.session
                && !guessed(g.pid, g.began_us)
                && !before_late_stamp(basis, p.start_ticks, g.began_us)
                && (p.session != p.pid || g.began_us.is_some())
        })
    };
    // Sessions of processes that started before `next` began and are not its: what else is in
    // them is ours too.
    let earlier_sessions: HashSet<i32> = census
        .iter()
        .filter(|p| !began_after(p) && !is_next(p))
        .map(|p| p.session)
        .collect();
    let earlier = |process: &'a ProcessInfo| {
        if is_next(process) {
            return false;
        }
        let chain = lineage(process);
        let ancestors = &chain[1..];
        if ancestors
            .iter()
            .any(|p| !in_gone_roots_session(p) && (held.contains(&p.pid) || !began_after(p)))
        {
            return true;
        }
        if in_gone_roots_session(process) {
            return false;
        }
        held.contains(&process.pid)
            || held_sessions.contains(&process.session)
            || earlier_sessions.contains(&process.session)
            || (process.session != process.pid && !by_pid.contains_key(&process.session))
            || !began_after(process)
    };
    census.iter().filter(|p| earlier(p)).collect()
}

/// Clock ticks per second, the unit of `/proc/PID/stat` times.
pub(super) fn clk_tck() -> Result<u64, ProcsError> {
    match sysconf(SysconfVar::CLK_TCK) {
        Ok(Some(ticks)) => u64::try_from(ticks)
            .ok()
            .filter(|&ticks| ticks > 0)
            .ok_or(ProcsError::ClkTck { source: None }),
        Ok(None) => Err(ProcsError::ClkTck { source: None }),
        Err(source) => Err(ProcsError::ClkTck {
            source: Some(source),
        }),
    }
}

/// CLOCK_MONOTONIC now in microseconds, and the boottime/monotonic offset then in
/// nanoseconds, read so that it comes out slightly small (boottime first, then monotonic): a
/// floor for [`OffsetFloors::note`].
pub(crate) fn offset_now() -> Result<(u64, u64), ProcsError> {
    let boot_ns = read_clock_ns(ClockId::CLOCK_BOOTTIME, "CLOCK_BOOTTIME")?;
    let mono_ns = read_clock_ns(ClockId::CLOCK_MONOTONIC, "CLOCK_MONOTONIC")?;
    let offset_ns = u64::try_from(boot_ns - mono_ns).unwrap_or(0);
    Ok((u64::try_from(mono_ns / 1000).unwrap_or(u64::MAX), offset_ns))
}

/// CLOCK_BOOTTIME minus CLOCK_MONOTONIC now, in nanoseconds.
///
/// Monotonic is read first: boottime, read a little later, makes the offset come out slightly large,
/// which moves converted start times earlier, towards "started before".
pub(super) fn boot_minus_mono_ns() -> Result<u64, ProcsError> {
    let mono_ns = read_clock_ns(ClockId::CLOCK_MONOTONIC, "CLOCK_MONOTONIC")?;
    let boot_ns = read_clock_ns(ClockId::CLOCK_BOOTTIME, "CLOCK_BOOTTIME")?;
    u64::try_from(boot_ns - mono_ns).map_err(|_| ProcsError::ClockOrder { boot_ns, mono_ns })
}

pub(super) fn read_clock_ns(clock: ClockId, name: &'static str) -> Result<i128, ProcsError> {
    crate::clock::clock_ns(clock).map_err(|source| ProcsError::Clock {
        clock: name,
        source,
    })
}

//! The processes left in a unit's cgroup subtree: listing them (`cgroup.procs` of the cgroup and every
//! descendant, then `/proc/PID/stat` of each), placing their start times on CLOCK_MONOTONIC, and
//! watching each one for its exit with a pidfd registered in the agent's mio loop.
//!
//! With `KillMode=process` systemd calls a unit inactive while processes of it remain, and the next
//! invocation may start beside them; these processes are what stand between a terminal state and a
//! proof. Nothing here may ever report a process as exited, or as started after a point in time,
//! unless that is certain: a read error, a parse error or a doubtful clock comparison must lean
//! towards "still there, still ours", never towards a false proof. It decides nothing about units.
//!
//! A pidfd is used rather than the pid because pids are reused; a process's exit is read from its
//! pidfd alone. `/proc` state letters are not evidence of exit: a thread-group leader shows `Z` while
//! other threads of its process still run, and its pidfd becomes readable only once they all exited.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::hash::Hash;
use std::io::{self, Read};
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::time::{ClockId, clock_gettime};
use nix::unistd::{SysconfVar, sysconf};

use super::CgroupError;
use super::watcher::locate;
use crate::token_pool::TokenPool;

/// The file of a cgroup that lists the processes (thread-group ids) in it, one per line.
const PROCS_FILE: &str = "cgroup.procs";

/// Where the kernel shows processes; pids are those of this agent's pid namespace.
const PROC_ROOT: &str = "/proc";

/// Descendant levels walked below a unit's cgroup before giving up.
pub const MAX_CGROUP_DEPTH: usize = 64;

/// Cgroups (the unit's and its descendants) walked before giving up.
pub const MAX_CGROUPS: usize = 100_000;

/// Processes listed in one unit's subtree before giving up.
pub const MAX_PROCESSES: usize = 100_000;

/// `/proc/PID/stat` is about 52 numbers and a command name of at most 64 bytes: well under this.
const MAX_STAT_BYTES: usize = 4096;

/// A pid is at most 10 digits and a newline; one file holding more than the process limit is refused.
const MAX_PROCS_FILE_BYTES: usize = (MAX_PROCESSES + 1) * 11;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// The fields of `/proc/PID/stat` this module uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 1: the process id.
    pub pid: i32,
    /// Field 2: the command name, raw bytes chosen by the process (any byte but NUL, parentheses and
    /// newlines included); for logs only.
    pub comm: Vec<u8>,
    /// Field 3: the state letter (`R`, `S`, `D`, `Z`, `T`, ...). Never evidence of exit.
    pub state: char,
    /// Field 4: the parent's process id (0 for processes whose parent is outside the pid namespace).
    pub ppid: i32,
    /// Field 6: the session id. systemd starts every process of a service in a session of its
    /// own, and children keep it when they are orphaned: it outlives the parent chain.
    pub session: i32,
    /// Field 22: when the process was forked, in clock ticks since boot (CLOCK_BOOTTIME).
    pub start_ticks: u64,
}

/// Why the contents of a `/proc/PID/stat` file were rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StatParseError {
    /// The contents do not end with a newline.
    #[error("stat does not end with a newline")]
    NoNewline,
    /// No `(` ... `)` around the command name.
    #[error("stat has no parenthesised command name")]
    NoCommand,
    /// The text before the command name is not `PID `.
    #[error("stat has pid {0:?}, expected a positive integer")]
    BadPid(String),
    /// Fewer fields than field 22 (starttime) follow the command name.
    #[error("stat has {0} fields after the command name, expected at least 20")]
    TooFewFields(usize),
    /// The state (field 3) is not one ASCII letter.
    #[error("stat has state {0:?}, expected one letter")]
    BadState(String),
    /// A numeric field (numbered as in proc(5)) is not a decimal integer, or is out of range.
    #[error("stat field {field} is {text:?}, expected an integer")]
    BadField { field: usize, text: String },
}

/// Why the contents of a `cgroup.procs` file were rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProcsParseError {
    /// The last line has no newline.
    #[error("cgroup.procs does not end with a newline")]
    NoNewline,
    /// A line is not a positive decimal pid.
    #[error("cgroup.procs has line {0:?}, expected a pid")]
    BadPid(String),
}

/// A failure to list or track processes, with the path, pid or clock it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ProcsError {
    /// The cgroup string was rejected before touching the file system.
    #[error("{0}")]
    Cgroup(#[source] CgroupError),
    /// A cgroup directory exists but could not be listed.
    #[error("cannot list cgroup {path}: {source}")]
    ReadDir { path: PathBuf, source: io::Error },
    /// A file exists but could not be read.
    #[error("cannot read {path}: {source}")]
    ReadFile { path: PathBuf, source: io::Error },
    /// A file is larger than anything the kernel writes there.
    #[error("{path} is larger than {limit} bytes")]
    FileTooLarge { path: PathBuf, limit: usize },
    /// A `cgroup.procs` file could not be parsed.
    #[error("{path}: {error}")]
    ProcsParse {
        path: PathBuf,
        #[source]
        error: ProcsParseError,
    },
    /// A `/proc/PID/stat` file could not be parsed.
    #[error("{path}: {error}")]
    StatParse {
        path: PathBuf,
        #[source]
        error: StatParseError,
    },
    /// A `/proc/PID/stat` file names another pid than its directory.
    #[error("{path} names pid {found}")]
    StatPidMismatch { path: PathBuf, found: i32 },
    /// The unit's own cgroup is threaded: only its threaded domain, above it, lists its processes.
    #[error("cgroup {path} is threaded; its processes are listed only by its threaded domain")]
    Threaded { path: PathBuf },
    /// The subtree is deeper than [`MAX_CGROUP_DEPTH`] below the unit's cgroup.
    #[error("cgroup {path} is more than {limit} levels below the unit's cgroup")]
    TooDeep { path: PathBuf, limit: usize },
    /// The subtree has more than [`MAX_CGROUPS`] cgroups.
    #[error("cgroup {path} has more than {limit} cgroups below it")]
    TooManyCgroups { path: PathBuf, limit: usize },
    /// The subtree holds more than [`MAX_PROCESSES`] processes.
    #[error("cgroup {path} holds more than {limit} processes")]
    TooManyProcesses { path: PathBuf, limit: usize },
    /// A pid that no process can have (zero or negative).
    #[error("invalid pid {pid}")]
    InvalidPid { pid: i32 },
    /// `pidfd_open` failed for a reason other than the process being gone.
    #[error("cannot open a pidfd for pid {pid}: {source}")]
    PidfdOpen { pid: i32, source: Errno },
    /// The pidfd could not be registered with mio.
    #[error("cannot register the pidfd of pid {pid}: {source}")]
    Register { pid: i32, source: io::Error },
    /// Every token of the tracker's range is in use.
    #[error("no free token to track pid {pid}: every token is in use")]
    NoToken { pid: i32 },
    /// A clock could not be read.
    #[error("cannot read {clock}: {source}")]
    Clock { clock: &'static str, source: Errno },
    /// CLOCK_BOOTTIME read less than CLOCK_MONOTONIC (a time namespace can do that), so start times
    /// cannot be placed on CLOCK_MONOTONIC.
    #[error("CLOCK_BOOTTIME ({boot_ns} ns) is behind CLOCK_MONOTONIC ({mono_ns} ns)")]
    ClockOrder { boot_ns: i128, mono_ns: i128 },
    /// `sysconf(_SC_CLK_TCK)` failed or gave no positive value.
    #[error("{}", clock_tick_problem(.source))]
    ClkTck { source: Option<Errno> },
}

/// What [`ProcsError::ClkTck`] says: the error of `sysconf`, or that its value was not usable.
fn clock_tick_problem(source: &Option<Errno>) -> String {
    match source {
        Some(source) => format!("cannot read the clock tick rate: {source}"),
        None => "the clock tick rate is not a positive number".to_owned(),
    }
}

/// Parses the contents of `/proc/PID/stat`.
///
/// The line is `PID (COMM) STATE PPID ...` with single spaces, numbers only after the command name,
/// and a final newline. The command name runs from the first `(` to the LAST `)`: it is chosen by the
/// process and may hold spaces, parentheses and newlines, but no field after it holds a `)`. Any
/// deviation is an error, never a default.
pub fn parse_stat(contents: &[u8]) -> Result<ProcStat, StatParseError> {
    let line = contents
        .strip_suffix(b"\n")
        .ok_or(StatParseError::NoNewline)?;
    let open = line
        .iter()
        .position(|&byte| byte == b'(')
        .ok_or(StatParseError::NoCommand)?;
    let close = line
        .iter()
        .rposition(|&byte| byte == b')')
        .ok_or(StatParseError::NoCommand)?;
    if close < open {
        return Err(StatParseError::NoCommand);
    }
    let pid_text = &line[..open];
    let pid = pid_text
        .strip_suffix(b" ")
        .and_then(parse_decimal)
        .and_then(|pid| i32::try_from(pid).ok())
        .filter(|&pid| pid > 0)
        .ok_or_else(|| StatParseError::BadPid(lossy(pid_text)))?;
    let comm = line[open + 1..close].to_vec();
    let after = &line[close + 1..];
    let fields: Vec<&[u8]> = match after.strip_prefix(b" ") {
        Some(rest) => rest.split(|&byte| byte == b' ').collect(),
        None if after.is_empty() => Vec::new(),
        // The command name must be followed by a space.
        None => return Err(StatParseError::TooFewFields(0)),
    };
    // fields[0] is field 3 (state); field 22 (starttime) is fields[19].
    if fields.len() < 20 {
        return Err(StatParseError::TooFewFields(fields.len()));
    }
    let state = match fields[0] {
        [letter] if letter.is_ascii_alphabetic() => char::from(*letter),
        other => return Err(StatParseError::BadState(lossy(other))),
    };
    let bad_field = |index: usize| StatParseError::BadField {
        field: index + 3,
        text: lossy(fields[index]),
    };
    if let Some(index) = (1..fields.len()).find(|&index| !is_integer(fields[index])) {
        return Err(bad_field(index));
    }
    let ppid = parse_decimal(fields[1])
        .and_then(|ppid| i32::try_from(ppid).ok())
        .ok_or_else(|| bad_field(1))?;
    let session = parse_decimal(fields[3])
        .and_then(|session| i32::try_from(session).ok())
        .ok_or_else(|| bad_field(3))?;
    let start_ticks = parse_decimal(fields[19]).ok_or_else(|| bad_field(19))?;
    Ok(ProcStat {
        pid,
        comm,
        state,
        ppid,
        session,
        start_ticks,
    })
}

/// Parses the contents of a `cgroup.procs` file: one positive decimal pid per line, each line ended
/// by a newline. An empty file is an empty cgroup. The kernel writes `0` for a process outside the
/// reader's pid namespace; that is rejected, since such a process could be neither read nor tracked.
pub fn parse_procs(contents: &[u8]) -> Result<Vec<i32>, ProcsParseError> {
    let Some(body) = contents.strip_suffix(b"\n") else {
        return if contents.is_empty() {
            Ok(Vec::new())
        } else {
            Err(ProcsParseError::NoNewline)
        };
    };
    body.split(|&byte| byte == b'\n')
        .map(|line| {
            parse_decimal(line)
                .and_then(|pid| i32::try_from(pid).ok())
                .filter(|&pid| pid > 0)
                .ok_or_else(|| ProcsParseError::BadPid(lossy(line)))
        })
        .collect()
}

/// A decimal number as the kernel prints one: digits only, no sign, no leading zero.
fn parse_decimal(text: &[u8]) -> Option<u64> {
    let digits_only = !text.is_empty() && text.iter().all(u8::is_ascii_digit);
    if !digits_only || (text.len() > 1 && text[0] == b'0') {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// Whether `text` is a decimal integer, possibly negative (some stat fields are signed).
fn is_integer(text: &[u8]) -> bool {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// How a process's start time stands against a CLOCK_MONOTONIC threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartOrder {
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
    pub fn counts_as_before(self) -> bool {
        self != Self::AtOrAfter
    }
}

/// What is needed to place a `/proc` start time (clock ticks on CLOCK_BOOTTIME) on CLOCK_MONOTONIC.
///
/// Both clocks, `/proc` and the threshold must belong to one time namespace (systemd's, the initial
/// one): a time namespace shifts CLOCK_BOOTTIME and CLOCK_MONOTONIC by offsets of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockBasis {
    /// Clock ticks per second, `sysconf(_SC_CLK_TCK)` (usually 100).
    pub clk_tck: u64,
    /// CLOCK_BOOTTIME minus CLOCK_MONOTONIC, in nanoseconds: the time spent suspended since boot.
    /// It only grows, so a value read now is at least the offset at any past instant.
    pub boot_minus_mono_ns: u64,
}

impl ClockBasis {
    /// Reads the tick rate and the boottime/monotonic offset now.
    pub fn now() -> Result<Self, ProcsError> {
        Ok(Self {
            clk_tck: clk_tck()?,
            boot_minus_mono_ns: boot_minus_mono_ns()?,
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
    /// - [`StartOrder::Before`] only if the latest possible start (next tick start, offset 0, rounded
    ///   up) is at or before the threshold;
    /// - [`StartOrder::Uncertain`] otherwise, and whenever `clk_tck` is 0.
    pub fn start_order(&self, start_ticks: u64, threshold_mono_us: u64) -> StartOrder {
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
        // Monotonic time never exceeds boottime, so the end of the tick bounds the start from above.
        let end_of_tick_ns = (u128::from(start_ticks) + 1) * NANOS_PER_SEC;
        if end_of_tick_ns.div_ceil(clk_tck) <= threshold_ns {
            StartOrder::Before
        } else {
            StartOrder::Uncertain
        }
    }
}

/// What tells the processes of a unit's current invocation from those of an earlier one, as
/// systemd reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NextInvocation {
    /// When the current invocation left `inactive` (InactiveExitTimestampMonotonic, µs), if
    /// known. systemd forks its first process just *before* it records this, so the roots below
    /// are needed too.
    pub began_us: Option<u64>,
    /// Its MainPID and ControlPID, if known (non-zero).
    pub roots: Vec<i32>,
}

/// How far up the parent chain a process is followed to a root of the current invocation.
const MAX_ANCESTRY: usize = 64;

/// The processes of `census` that may belong to an earlier invocation, given `held`, the
/// processes an earlier count kept. systemd starts every process of a service as the leader of
/// a session of its own (MainPID, ControlPID), and what they fork keeps that session even once
/// orphaned. So, for each process, the first that applies:
/// 1. it or an ancestor within the census is a root of `next`, or it is in a root's session:
///    `next`'s (systemd's word beats any guess);
/// 2. it or an ancestor was held before, or it is in the session of a process held before or
///    started before `next` began: earlier;
/// 3. an ancestor started before `next` began (the child of a leftover is a leftover): earlier;
/// 4. it is in a session whose leader is gone (not one it began itself): earlier, an orphan
///    of a session that is not known to be `next`'s (if it is, `next` has lost the process
///    that began it, and systemd is about to end `next` too: the wait is short);
/// 5. earlier unless it started certainly at or after `next` began.
///
/// An uncertain start counts as earlier: this errs toward waiting. What it cannot see: a child
/// that a leftover of ours forks after `next` began and that starts a session of its own,
/// counts as `next`'s.
pub fn earlier_processes<'a>(
    census: &'a [ProcessInfo],
    next: &NextInvocation,
    basis: &ClockBasis,
    held: &[i32],
) -> Vec<&'a ProcessInfo> {
    let by_pid: HashMap<i32, &ProcessInfo> = census.iter().map(|p| (p.pid, p)).collect();
    let sessions_of = |pids: &[i32]| -> HashSet<i32> {
        pids.iter()
            .flat_map(|pid| [Some(*pid), by_pid.get(pid).map(|p| p.session)])
            .flatten()
            .collect()
    };
    let next_sessions = sessions_of(&next.roots);
    let held_sessions = sessions_of(held);
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
        lineage(process).iter().any(|p| next.roots.contains(&p.pid))
            || next_sessions.contains(&process.session)
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
        chain.iter().any(|p| held.contains(&p.pid))
            || held_sessions.contains(&process.session)
            || earlier_sessions.contains(&process.session)
            || chain.iter().skip(1).any(|p| !began_after(p))
            || (process.session != process.pid && !by_pid.contains_key(&process.session))
            || !began_after(process)
    };
    census.iter().filter(|p| earlier(p)).collect()
}

/// Clock ticks per second, the unit of `/proc/PID/stat` times.
pub fn clk_tck() -> Result<u64, ProcsError> {
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

/// CLOCK_BOOTTIME minus CLOCK_MONOTONIC now, in nanoseconds.
///
/// Monotonic is read first: boottime, read a little later, makes the offset come out slightly large,
/// which moves converted start times earlier, towards "started before".
pub fn boot_minus_mono_ns() -> Result<u64, ProcsError> {
    let mono_ns = read_clock_ns(ClockId::CLOCK_MONOTONIC, "CLOCK_MONOTONIC")?;
    let boot_ns = read_clock_ns(ClockId::CLOCK_BOOTTIME, "CLOCK_BOOTTIME")?;
    u64::try_from(boot_ns - mono_ns).map_err(|_| ProcsError::ClockOrder { boot_ns, mono_ns })
}

fn read_clock_ns(clock: ClockId, name: &'static str) -> Result<i128, ProcsError> {
    let time = clock_gettime(clock).map_err(|source| ProcsError::Clock {
        clock: name,
        source,
    })?;
    Ok(i128::from(time.tv_sec()) * 1_000_000_000 + i128::from(time.tv_nsec()))
}

/// One process found in a unit's cgroup subtree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: i32,
    pub ppid: i32,
    /// The session id, which an orphan keeps.
    pub session: i32,
    /// Field 22 of `/proc/PID/stat`: clock ticks since boot, for [`ClockBasis::start_order`] and
    /// [`ProcessTracker::track`].
    pub start_ticks: u64,
    /// The command name, raw; for logs only.
    pub comm: Vec<u8>,
    /// The state letter when listed; never evidence of exit.
    pub state: char,
    /// The cgroup whose `cgroup.procs` listed it, relative to the unit's cgroup (empty for the unit's
    /// own). A process in a threaded cgroup is listed by its threaded domain, so it shows that one.
    pub cgroup: PathBuf,
}

/// How far a walk may go; a parameter so that tests can reach the limits.
#[derive(Clone, Copy, Debug)]
struct WalkLimits {
    depth: usize,
    cgroups: usize,
    processes: usize,
}

const WALK_LIMITS: WalkLimits = WalkLimits {
    depth: MAX_CGROUP_DEPTH,
    cgroups: MAX_CGROUPS,
    processes: MAX_PROCESSES,
};

/// Lists the processes in `cgroup` (as systemd reports it, such as `/app.slice/x.service`) and every
/// cgroup below it, under `root`, the cgroup2 mount point.
///
/// A cgroup that disappears during the walk, or a process that exits between its listing and its
/// `stat`, is skipped; a unit cgroup that does not exist gives an empty list. Symbolic links are not
/// followed. Each pid appears once. Any other failure is an error naming the path.
///
/// The walk is not atomic: a process that forks, or is moved between cgroups of the subtree, while it
/// runs may be missed. Callers that need the whole set list again after each change they learn of.
pub fn list_processes(root: &Path, cgroup: &str) -> Result<Vec<ProcessInfo>, ProcsError> {
    let (parent, name) = locate(root, cgroup).map_err(ProcsError::Cgroup)?;
    walk(&parent.join(name), WALK_LIMITS)
}

fn walk(top: &Path, limits: WalkLimits) -> Result<Vec<ProcessInfo>, ProcsError> {
    let mut found = Vec::new();
    let mut seen = HashSet::new();
    let mut pending = vec![(PathBuf::new(), 0usize)];
    let mut cgroups = 0usize;
    while let Some((relative, depth)) = pending.pop() {
        cgroups += 1;
        if cgroups > limits.cgroups {
            return Err(ProcsError::TooManyCgroups {
                path: top.to_owned(),
                limit: limits.cgroups,
            });
        }
        let dir = if relative.as_os_str().is_empty() {
            top.to_owned()
        } else {
            top.join(&relative)
        };
        let pids = match read_procs(&dir)? {
            ProcsFile::Pids(pids) => pids,
            ProcsFile::Vanished => continue,
            // Its processes, and those of every cgroup below it (all threaded too), are in the
            // cgroup.procs of its threaded domain, which is an ancestor already walked.
            ProcsFile::Threaded if depth > 0 => continue,
            ProcsFile::Threaded => return Err(ProcsError::Threaded { path: dir }),
        };
        for pid in pids {
            if !seen.insert(pid) {
                continue;
            }
            if seen.len() > limits.processes {
                return Err(ProcsError::TooManyProcesses {
                    path: top.to_owned(),
                    limit: limits.processes,
                });
            }
            if let Some(stat) = read_stat(pid)? {
                found.push(ProcessInfo {
                    pid,
                    ppid: stat.ppid,
                    session: stat.session,
                    start_ticks: stat.start_ticks,
                    comm: stat.comm,
                    state: stat.state,
                    cgroup: relative.clone(),
                });
            }
        }
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(error) if vanished(&error) => continue,
            Err(source) => return Err(ProcsError::ReadDir { path: dir, source }),
        };
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(error) if vanished(&error) => break,
                Err(source) => return Err(ProcsError::ReadDir { path: dir, source }),
            };
            // The type from the directory entry itself: a symbolic link is not a directory here.
            let is_dir = match entry.file_type() {
                Ok(kind) => kind.is_dir(),
                Err(error) if vanished(&error) => continue,
                Err(source) => {
                    return Err(ProcsError::ReadDir {
                        path: entry.path(),
                        source,
                    });
                }
            };
            if !is_dir {
                continue;
            }
            if depth + 1 > limits.depth {
                return Err(ProcsError::TooDeep {
                    path: entry.path(),
                    limit: limits.depth,
                });
            }
            pending.push((relative.join(entry.file_name()), depth + 1));
        }
    }
    Ok(found)
}

/// Whether an error says the file or cgroup is gone (ENODEV: a cgroup being removed).
fn vanished(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error().map(Errno::from_raw),
        Some(Errno::ENOENT | Errno::ENODEV)
    )
}

/// What reading a cgroup's `cgroup.procs` gave.
enum ProcsFile {
    Pids(Vec<i32>),
    /// The cgroup was removed.
    Vanished,
    /// The cgroup is threaded (EOPNOTSUPP).
    Threaded,
}

fn read_procs(dir: &Path) -> Result<ProcsFile, ProcsError> {
    let path = dir.join(PROCS_FILE);
    match read_bounded(&path, MAX_PROCS_FILE_BYTES) {
        Ok(contents) => parse_procs(&contents)
            .map(ProcsFile::Pids)
            .map_err(|error| ProcsError::ProcsParse { path, error }),
        Err(ReadError::Io(error)) if error.raw_os_error() == Some(Errno::EOPNOTSUPP as i32) => {
            Ok(ProcsFile::Threaded)
        }
        // ENODEV: the cgroup was removed after the file was opened.
        Err(ReadError::Io(error)) if error.raw_os_error() == Some(Errno::ENODEV as i32) => {
            Ok(ProcsFile::Vanished)
        }
        Err(ReadError::Io(error)) if vanished(&error) => {
            // Only a cgroup that is gone lacks the file; a directory without it is no cgroup.
            match fs::symlink_metadata(dir) {
                Err(gone) if vanished(&gone) => Ok(ProcsFile::Vanished),
                _ => Err(ProcsError::ReadFile {
                    path,
                    source: error,
                }),
            }
        }
        Err(ReadError::Io(source)) => Err(ProcsError::ReadFile { path, source }),
        Err(ReadError::TooLarge { limit }) => Err(ProcsError::FileTooLarge { path, limit }),
    }
}

/// Reads `/proc/PID/stat`; `None` means the process is gone (reaped).
pub fn read_stat(pid: i32) -> Result<Option<ProcStat>, ProcsError> {
    let path = Path::new(PROC_ROOT).join(pid.to_string()).join("stat");
    let contents = match read_bounded(&path, MAX_STAT_BYTES) {
        Ok(contents) => contents,
        // ESRCH: the process was reaped after the file was opened.
        Err(ReadError::Io(error))
            if vanished(&error) || error.raw_os_error() == Some(Errno::ESRCH as i32) =>
        {
            return Ok(None);
        }
        Err(ReadError::Io(source)) => return Err(ProcsError::ReadFile { path, source }),
        Err(ReadError::TooLarge { limit }) => {
            return Err(ProcsError::FileTooLarge { path, limit });
        }
    };
    let stat = parse_stat(&contents).map_err(|error| ProcsError::StatParse {
        path: path.clone(),
        error,
    })?;
    if stat.pid != pid {
        return Err(ProcsError::StatPidMismatch {
            path,
            found: stat.pid,
        });
    }
    Ok(Some(stat))
}

enum ReadError {
    Io(io::Error),
    TooLarge { limit: usize },
}

fn read_bounded(path: &Path, limit: usize) -> Result<Vec<u8>, ReadError> {
    let mut contents = Vec::new();
    // One byte more than allowed, to tell a full-size file from an oversized one.
    let take = u64::try_from(limit).map_or(u64::MAX, |limit| limit.saturating_add(1));
    File::open(path)
        .and_then(|file| file.take(take).read_to_end(&mut contents))
        .map_err(ReadError::Io)?;
    if contents.len() > limit {
        return Err(ReadError::TooLarge { limit });
    }
    Ok(contents)
}

/// What [`ProcessTracker::track`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracked {
    /// The process was running; its exit will be reported by [`ProcessTracker::handle_event`].
    Alive,
    /// The process with that start time has exited (or its pid now names another process); nothing
    /// is tracked for it.
    AlreadyExited,
}

/// One tracked process.
#[derive(Debug)]
struct Watched<K> {
    key: K,
    pid: i32,
    start_ticks: u64,
    pidfd: OwnedFd,
}

/// Watches processes for their exit, one pidfd each, registered in the caller's mio `Poll` under
/// tokens from a range given at construction; each process belongs to a caller-chosen key.
#[derive(Debug)]
pub struct ProcessTracker<K> {
    tokens: TokenPool,
    watched: HashMap<Token, Watched<K>>,
    by_key: HashMap<K, HashMap<i32, Token>>,
}

impl<K: Copy + Eq + Hash> ProcessTracker<K> {
    /// Creates a tracker that registers pidfds under tokens of `tokens` only. Fresh tokens are used
    /// before freed ones, so give a wide range to make a token's reuse rare.
    pub fn new(tokens: Range<usize>) -> Self {
        Self {
            tokens: TokenPool::new(tokens),
            watched: HashMap::new(),
            by_key: HashMap::new(),
        }
    }

    /// Starts watching process `pid` for `key`, if it is still the process that started at
    /// `start_ticks` (from [`list_processes`] or [`read_stat`]).
    ///
    /// The pidfd is opened first and the start time checked after, so the pidfd is known to refer to
    /// that process: had the pid been reused in between, the start time would differ. Tracking a
    /// (key, pid) again with the same start time does nothing. With another start time, the process
    /// tracked before is certainly gone (its pid names another one now): it is replaced if the new
    /// one is alive, otherwise left to report its exit.
    pub fn track(
        &mut self,
        registry: &Registry,
        key: K,
        pid: i32,
        start_ticks: u64,
    ) -> Result<Tracked, ProcsError> {
        if pid <= 0 {
            return Err(ProcsError::InvalidPid { pid });
        }
        let held = self
            .by_key
            .get(&key)
            .and_then(|pids| pids.get(&pid))
            .copied();
        if let Some(token) = held
            && self
                .watched
                .get(&token)
                .is_some_and(|watched| watched.start_ticks == start_ticks)
        {
            return Ok(Tracked::Alive);
        }
        let pidfd = match pidfd_open(pid) {
            Ok(pidfd) => pidfd,
            Err(Errno::ESRCH) => return Ok(Tracked::AlreadyExited),
            Err(source) => return Err(ProcsError::PidfdOpen { pid, source }),
        };
        match read_stat(pid)? {
            Some(stat) if stat.start_ticks == start_ticks => {}
            _ => return Ok(Tracked::AlreadyExited),
        }
        if has_exited(&pidfd) {
            return Ok(Tracked::AlreadyExited);
        }
        let token = self.tokens.take().ok_or(ProcsError::NoToken { pid })?;
        let raw = pidfd.as_raw_fd();
        if let Err(source) = registry.register(&mut SourceFd(&raw), token, Interest::READABLE) {
            self.tokens.give_back(token);
            return Err(ProcsError::Register { pid, source });
        }
        if let Some(stale) = held {
            self.forget(registry, stale);
        }
        self.watched.insert(
            token,
            Watched {
                key,
                pid,
                start_ticks,
                pidfd,
            },
        );
        self.by_key.entry(key).or_default().insert(pid, token);
        Ok(Tracked::Alive)
    }

    /// Whether `token` belongs to this tracker's range.
    pub fn owns(&self, token: Token) -> bool {
        self.tokens.owns(token)
    }

    /// Handles a readiness event for `token`: if its process has exited, stops tracking it and
    /// returns its key and pid.
    ///
    /// The event is only a hint: the pidfd itself is asked whether the process exited, so a stale
    /// event (for a token since reused) or a spurious one reports nothing. Unknown tokens are ignored.
    pub fn handle_event(&mut self, registry: &Registry, token: Token) -> Option<(K, i32)> {
        let watched = self.watched.get(&token)?;
        if !has_exited(&watched.pidfd) {
            return None;
        }
        let watched = self.forget(registry, token)?;
        Some((watched.key, watched.pid))
    }

    /// Stops tracking every process of `key`, closing their pidfds.
    pub fn untrack_key(&mut self, registry: &Registry, key: K) {
        let Some(pids) = self.by_key.remove(&key) else {
            return;
        };
        for token in pids.into_values() {
            self.release(registry, token);
        }
    }

    #[cfg(test)]
    /// The pids tracked for `key`, in no order.
    pub fn tracked(&self, key: K) -> impl Iterator<Item = i32> + '_ {
        self.by_key
            .get(&key)
            .into_iter()
            .flat_map(|pids| pids.keys().copied())
    }

    #[cfg(test)]
    /// How many processes are tracked for `key`.
    pub fn tracked_count(&self, key: K) -> usize {
        self.by_key.get(&key).map_or(0, HashMap::len)
    }

    #[cfg(test)]
    /// How many pidfds are held for all keys.
    pub fn len(&self) -> usize {
        self.watched.len()
    }

    #[cfg(test)]
    /// Whether no pidfd is held.
    pub fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }

    /// Stops tracking the process under `token` and returns it.
    fn forget(&mut self, registry: &Registry, token: Token) -> Option<Watched<K>> {
        let watched = self.release(registry, token)?;
        if let Some(pids) = self.by_key.get_mut(&watched.key) {
            if pids.get(&watched.pid) == Some(&token) {
                pids.remove(&watched.pid);
            }
            if pids.is_empty() {
                self.by_key.remove(&watched.key);
            }
        }
        Some(watched)
    }

    /// Deregisters the pidfd under `token` and frees the token; the pidfd closes when the returned
    /// value is dropped. Leaves `by_key` alone.
    fn release(&mut self, registry: &Registry, token: Token) -> Option<Watched<K>> {
        let watched = self.watched.remove(&token)?;
        // A failure changes nothing: closing the pidfd removes it from epoll anyway.
        let _ = registry.deregister(&mut SourceFd(&watched.pidfd.as_raw_fd()));
        self.tokens.give_back(token);
        Some(watched)
    }
}

/// Whether the process of `pidfd` has exited, asked of the pidfd now (readable once every thread of
/// the process exited, zombie or reaped). A failed poll says no: leaning towards waiting.
fn has_exited(pidfd: &OwnedFd) -> bool {
    loop {
        let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(_) => {
                return fds[0]
                    .revents()
                    .is_some_and(|events| events.contains(PollFlags::POLLIN));
            }
            Err(Errno::EINTR) => continue,
            Err(error) => {
                log::warn!(
                    "cannot poll pidfd {}: {error}; counting its process as running",
                    pidfd.as_raw_fd()
                );
                return false;
            }
        }
    }
}

/// Opens a pidfd (close-on-exec) for `pid`; nix 0.32 has no wrapper for the system call.
fn pidfd_open(pid: i32) -> Result<OwnedFd, Errno> {
    // SAFETY: pidfd_open takes two integers and returns a new descriptor or -1; it reads and writes
    // no memory of ours.
    let result = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if result < 0 {
        return Err(Errno::last());
    }
    let raw = RawFd::try_from(result).map_err(|_| Errno::EBADF)?;
    // SAFETY: the kernel has just returned this descriptor to us, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::process::{Child, Command};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use mio::{Events, Poll};
    use nix::sys::wait::{Id, WaitPidFlag, waitid};
    use proptest::prelude::*;

    use super::*;
    use crate::cgroup::cgroup2_mount;

    /// How long a test waits for the kernel before failing; generous, never a speed assertion.
    const KERNEL_WAIT: Duration = Duration::from_secs(20);

    /// A pid above the kernel's largest `pid_max` (2^22), so no process has it.
    const NO_SUCH_PID: i32 = i32::MAX;

    /// A real stat line (Linux 6.18), command name `sleep`.
    const SLEEP_STAT: &[u8] = b"4242 (sleep) S 4200 4242 4200 34816 4242 4194304 96 0 0 0 0 0 0 0 \
20 0 1 0 21220 5652480 256 18446744073709551615 94768343896064 94768343910961 140736429416432 \
0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 94768343921360 94768343922528 94768377503744 140736429419747 \
140736429419758 140736429419758 140736429420523 0\n";

    static NEXT_NAME: AtomicUsize = AtomicUsize::new(0);

    fn unique_name() -> String {
        let n = NEXT_NAME.fetch_add(1, Ordering::Relaxed);
        format!("exitproof-procstest-{}-{n}", std::process::id())
    }

    /// `sleep` children that are killed and reaped on drop, even when a test fails.
    #[derive(Default)]
    struct Sleeps(Vec<Child>);

    impl Sleeps {
        /// Starts `sleep 1000`; returns its pid.
        fn spawn(&mut self) -> i32 {
            let child = Command::new("sleep")
                .arg("1000")
                .spawn()
                .expect("sleep can be started");
            let pid = i32::try_from(child.id()).expect("pids fit in i32");
            self.0.push(child);
            pid
        }

        fn child(&mut self, pid: i32) -> &mut Child {
            self.0
                .iter_mut()
                .find(|child| child.id() as i32 == pid)
                .expect("a sleep of this test")
        }

        /// Sends SIGKILL without reaping: the process becomes a zombie.
        fn kill(&mut self, pid: i32) {
            self.child(pid).kill().expect("kill");
        }

        /// Kills, then waits until the process is a zombie, still unreaped.
        fn kill_to_zombie(&mut self, pid: i32) {
            self.kill(pid);
            waitid(
                Id::Pid(nix::unistd::Pid::from_raw(pid)),
                WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
            )
            .expect("waitid");
        }

        /// Kills and reaps.
        fn reap(&mut self, pid: i32) {
            let child = self.child(pid);
            let _ = child.kill();
            child.wait().expect("wait");
        }
    }

    impl Drop for Sleeps {
        fn drop(&mut self) {
            for child in &mut self.0 {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    fn start_ticks(pid: i32) -> u64 {
        read_stat(pid)
            .expect("stat is readable")
            .expect("the process exists")
            .start_ticks
    }

    /// A stat line with the given fields, the rest as a real kernel writes them.
    fn stat_line(pid: i32, comm: &[u8], state: u8, ppid: i32, start: u64) -> Vec<u8> {
        let mut line = format!("{pid} (").into_bytes();
        line.extend_from_slice(comm);
        line.extend_from_slice(b") ");
        line.push(state);
        line.extend_from_slice(
            format!(" {ppid} 1 1 0 -1 4194560 100 0 0 0 1 2 0 0 20 -5 1 0 {start} 1000 10 18446744073709551615 1 2 3 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n")
                .as_bytes(),
        );
        line
    }

    #[test]
    fn parse_stat_reads_a_real_line() {
        assert_eq!(
            parse_stat(SLEEP_STAT),
            Ok(ProcStat {
                pid: 4242,
                comm: b"sleep".to_vec(),
                state: 'S',
                ppid: 4200,
                session: 4200,
                start_ticks: 21220,
            })
        );
    }

    #[test]
    fn parse_stat_takes_the_command_up_to_the_last_paren() {
        let comms: &[&[u8]] = &[
            b"",
            b"a b",
            b"(",
            b")",
            b"a) R 1 2 (b",
            b") S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 ",
            b"new\nline",
            b"((()))",
            b"kworker/u8:3-events_unbound",
        ];
        for comm in comms {
            let line = stat_line(7, comm, b'R', 1, 1234);
            let stat = parse_stat(&line).expect("valid line");
            assert_eq!(stat.comm, *comm, "comm {:?}", lossy(comm));
            assert_eq!((stat.pid, stat.state, stat.ppid), (7, 'R', 1));
            assert_eq!(stat.start_ticks, 1234);
        }
    }

    #[test]
    fn parse_stat_rejects_malformed_lines() {
        use StatParseError::*;
        let valid = stat_line(7, b"x", b'S', 1, 99);
        let text = String::from_utf8(valid.clone()).expect("ascii");
        let replace = |from: &str, to: &str| text.replacen(from, to, 1).into_bytes();
        // The first 22 fields of the valid line, then the rest cut off.
        let first_22: Vec<&str> = text.split(' ').take(22).collect();
        let cases: Vec<(Vec<u8>, StatParseError)> = vec![
            (b"".to_vec(), NoNewline),
            (valid[..valid.len() - 1].to_vec(), NoNewline),
            (b"\n".to_vec(), NoCommand),
            (b"7 x S 1\n".to_vec(), NoCommand),
            (b"7 )x( S 1\n".to_vec(), NoCommand),
            (replace("7 (", "07 ("), BadPid("07 ".into())),
            (replace("7 (", "0 ("), BadPid("0 ".into())),
            (replace("7 (", "-7 ("), BadPid("-7 ".into())),
            (replace("7 (", "+7 ("), BadPid("+7 ".into())),
            (replace("7 (", "7  ("), BadPid("7  ".into())),
            (replace("7 (", "7("), BadPid("7".into())),
            (replace("7 (", "2147483648 ("), BadPid("2147483648 ".into())),
            (replace(") S", ")S"), TooFewFields(0)),
            (b"7 (x)\n".to_vec(), TooFewFields(0)),
            (b"7 (x) S 1 1\n".to_vec(), TooFewFields(3)),
            (
                format!("{}\n", first_22[..21].join(" ")).into_bytes(),
                TooFewFields(19),
            ),
            (replace(") S", ") s1"), BadState("s1".into())),
            (replace(") S", ") 1"), BadState("1".into())),
            (replace(") S", ") "), BadState("".into())),
            (
                replace(" S 1 ", " S 01 "),
                BadField {
                    field: 4,
                    text: "01".into(),
                },
            ),
            (
                replace(" S 1 ", " S -1 "),
                BadField {
                    field: 4,
                    text: "-1".into(),
                },
            ),
            (
                replace(" S 1 ", " S 2147483648 "),
                BadField {
                    field: 4,
                    text: "2147483648".into(),
                },
            ),
            (
                replace(" S 1 ", " S  1 "),
                BadField {
                    field: 4,
                    text: "".into(),
                },
            ),
            (
                replace(" 99 ", " -99 "),
                BadField {
                    field: 22,
                    text: "-99".into(),
                },
            ),
            (
                replace(" 99 ", " 18446744073709551616 "),
                BadField {
                    field: 22,
                    text: "18446744073709551616".into(),
                },
            ),
            (
                replace(" 99 ", " 9x "),
                BadField {
                    field: 22,
                    text: "9x".into(),
                },
            ),
            (
                replace(" 0\n", " 0 \n"),
                BadField {
                    field: 53,
                    text: "".into(),
                },
            ),
            (
                replace(" 0\n", " 0\r\n"),
                BadField {
                    field: 52,
                    text: "0\r".into(),
                },
            ),
            (
                replace(" 0\n", " 0\n\n"),
                BadField {
                    field: 52,
                    text: "0\n".into(),
                },
            ),
        ];
        for (contents, expected) in cases {
            assert_eq!(
                parse_stat(&contents),
                Err(expected),
                "contents {:?}",
                lossy(&contents)
            );
        }
    }

    proptest! {
        #[test]
        fn parse_stat_never_panics(contents in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = parse_stat(&contents);
        }

        #[test]
        fn parse_stat_never_panics_near_valid_lines(
            comm in proptest::collection::vec(any::<u8>(), 0..80),
            cut in 0usize..300,
            flip in any::<u8>(),
        ) {
            let mut line = stat_line(7, &comm, b'S', 1, 99);
            let at = cut % line.len();
            line[at] = flip;
            let _ = parse_stat(&line);
            line.truncate(at);
            let _ = parse_stat(&line);
        }

        #[test]
        fn parse_stat_recovers_generated_lines(
            pid in 1..=i32::MAX,
            comm in proptest::collection::vec(any::<u8>(), 0..80),
            state in proptest::sample::select(b"RSDZTtXxKWPI".to_vec()),
            ppid in 0..=i32::MAX,
            start in any::<u64>(),
        ) {
            let line = stat_line(pid, &comm, state, ppid, start);
            let stat = parse_stat(&line).expect("a generated line is valid");
            prop_assert_eq!(stat, ProcStat {
                pid,
                comm,
                state: char::from(state),
                ppid,
                session: 1,
                start_ticks: start,
            });
        }

        #[test]
        fn parse_procs_never_panics(contents in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_procs(&contents);
        }

        /// Whatever the true start within its tick and whatever the offset at the fork (at most the
        /// one read now), a certain answer is right.
        #[test]
        fn start_order_is_never_wrong_when_certain(
            clk_tck in 1u64..2000,
            start_ticks in 0u64..1_000_000_000,
            boot_minus_mono_ns in 0u64..10_000_000_000_000,
            threshold_mono_us in 0u64..20_000_000_000_000,
            within_tick in 0.0f64..1.0,
            offset_share in 0.0f64..=1.0,
        ) {
            let basis = ClockBasis { clk_tck, boot_minus_mono_ns };
            let order = basis.start_order(start_ticks, threshold_mono_us);
            let tick_ns = NANOS_PER_SEC as f64 / clk_tck as f64;
            let boot_ns = (start_ticks as f64 + within_tick) * tick_ns;
            let offset_then_ns = boot_minus_mono_ns as f64 * offset_share;
            let mono_ns = boot_ns - offset_then_ns;
            let threshold_ns = threshold_mono_us as f64 * 1000.0;
            // f64 cannot place points within a few ns of the threshold; those prove nothing here.
            prop_assume!((mono_ns - threshold_ns).abs() > 1e-6 * threshold_ns.max(1.0));
            match order {
                StartOrder::AtOrAfter => prop_assert!(mono_ns >= threshold_ns),
                StartOrder::Before => prop_assert!(mono_ns < threshold_ns),
                StartOrder::Uncertain => {}
            }
        }
    }

    #[test]
    fn parse_procs_accepts_only_pid_lines() {
        use ProcsParseError::*;
        type Case = (&'static [u8], Result<Vec<i32>, ProcsParseError>);
        let cases: &[Case] = &[
            (b"", Ok(vec![])),
            (b"1\n", Ok(vec![1])),
            (b"12\n3\n2147483647\n", Ok(vec![12, 3, 2147483647])),
            (b"1", Err(NoNewline)),
            (b"1\n2", Err(NoNewline)),
            (b"\n", Err(BadPid("".into()))),
            (b"1\n\n2\n", Err(BadPid("".into()))),
            (b"0\n", Err(BadPid("0".into()))),
            (b"01\n", Err(BadPid("01".into()))),
            (b"-1\n", Err(BadPid("-1".into()))),
            (b" 1\n", Err(BadPid(" 1".into()))),
            (b"1\r\n", Err(BadPid("1\r".into()))),
            (b"2147483648\n", Err(BadPid("2147483648".into()))),
        ];
        for (contents, expected) in cases {
            assert_eq!(
                &parse_procs(contents),
                expected,
                "contents {:?}",
                lossy(contents)
            );
        }
    }

    #[test]
    fn start_order_boundaries() {
        use StartOrder::*;
        // 100 ticks/s: tick 100 covers boottime [1 s, 1.01 s).
        let no_suspend = ClockBasis {
            clk_tck: 100,
            boot_minus_mono_ns: 0,
        };
        let cases = [
            (100, 999_999, AtOrAfter),
            (100, 1_000_000, AtOrAfter),
            (100, 1_000_001, Uncertain),
            (100, 1_009_999, Uncertain),
            (100, 1_010_000, Before),
            (100, 1_010_001, Before),
            (0, 0, AtOrAfter),
            (0, 1, Uncertain),
            (0, 10_000, Before),
        ];
        for (ticks, threshold, expected) in cases {
            assert_eq!(
                no_suspend.start_order(ticks, threshold),
                expected,
                "ticks {ticks}, threshold {threshold} us"
            );
        }

        // 5 ms suspended so far: the start may be up to 5 ms earlier on CLOCK_MONOTONIC, no later.
        let suspended = ClockBasis {
            clk_tck: 100,
            boot_minus_mono_ns: 5_000_000,
        };
        let cases = [
            (100, 995_000, AtOrAfter),
            (100, 995_001, Uncertain),
            (100, 1_000_000, Uncertain),
            (100, 1_009_999, Uncertain),
            (100, 1_010_000, Before),
            // An offset larger than the start itself: the earliest start is 0.
            (0, 0, AtOrAfter),
            (0, 1, Uncertain),
        ];
        for (ticks, threshold, expected) in cases {
            assert_eq!(
                suspended.start_order(ticks, threshold),
                expected,
                "ticks {ticks}, threshold {threshold} us, suspended"
            );
        }

        // 3 ticks/s: tick 1 covers [333_333_333.3, 666_666_666.7) ns; rounding widens it.
        let odd = ClockBasis {
            clk_tck: 3,
            boot_minus_mono_ns: 0,
        };
        assert_eq!(odd.start_order(1, 333_333), AtOrAfter);
        assert_eq!(odd.start_order(1, 333_334), Uncertain);
        assert_eq!(odd.start_order(1, 666_666), Uncertain);
        assert_eq!(odd.start_order(1, 666_667), Before);

        let broken = ClockBasis {
            clk_tck: 0,
            boot_minus_mono_ns: 0,
        };
        assert_eq!(broken.start_order(100, 0), Uncertain);

        let extreme = ClockBasis {
            clk_tck: 1,
            boot_minus_mono_ns: u64::MAX,
        };
        assert_eq!(extreme.start_order(u64::MAX, u64::MAX), AtOrAfter);
        assert_eq!(extreme.start_order(1, 0), AtOrAfter);
        assert_eq!(extreme.start_order(1, 1), Uncertain);
        assert_eq!(no_suspend.start_order(u64::MAX, 0), AtOrAfter);
        assert_eq!(no_suspend.start_order(0, u64::MAX), Before);

        assert!(Before.counts_as_before());
        assert!(Uncertain.counts_as_before());
        assert!(!AtOrAfter.counts_as_before());
    }

    #[test]
    fn clocks_can_be_read() {
        let basis = ClockBasis::now().expect("clocks");
        assert!(basis.clk_tck > 0);
        // This process started before now, whatever the offset.
        let boot_now_ns = read_clock_ns(ClockId::CLOCK_BOOTTIME, "CLOCK_BOOTTIME").expect("clock");
        let mono_now_us =
            read_clock_ns(ClockId::CLOCK_MONOTONIC, "CLOCK_MONOTONIC").expect("clock") / 1000;
        let own = start_ticks(std::process::id() as i32);
        let own_boot_ns = i128::from(own) * 1_000_000_000 / i128::from(basis.clk_tck);
        assert!(
            own_boot_ns <= boot_now_ns,
            "start time is on CLOCK_BOOTTIME"
        );
        let mono_now_us = u64::try_from(mono_now_us).expect("positive");
        assert!(
            basis
                .start_order(own, mono_now_us + 20_000)
                .counts_as_before()
        );
    }

    #[test]
    fn read_stat_reads_own_and_skips_missing() {
        let own = std::process::id() as i32;
        let stat = read_stat(own).expect("own stat").expect("own process");
        assert_eq!(stat.pid, own);
        assert_eq!(stat.ppid, nix::unistd::getppid().as_raw());
        assert!(read_stat(NO_SUCH_PID).expect("no error").is_none());
    }

    /// A temporary directory laid out like a cgroup tree; removed on drop.
    struct FakeTree(tempfile::TempDir);

    impl FakeTree {
        fn new() -> Self {
            Self(tempfile::tempdir().expect("temporary directory"))
        }

        fn root(&self) -> &Path {
            self.0.path()
        }

        /// Creates the cgroup directory `cgroup` (below the root) with `cgroup.procs` holding `procs`.
        fn cgroup(&self, cgroup: &str, procs: &[u8]) {
            let dir = self.root().join(cgroup);
            fs::create_dir_all(&dir).expect("mkdir");
            fs::write(dir.join(PROCS_FILE), procs).expect("write cgroup.procs");
        }
    }

    fn pids_of(found: &[ProcessInfo]) -> Vec<(i32, String)> {
        let mut pids: Vec<(i32, String)> = found
            .iter()
            .map(|info| (info.pid, info.cgroup.display().to_string()))
            .collect();
        pids.sort();
        pids
    }

    #[test]
    fn list_processes_walks_a_fake_tree() {
        let mut sleeps = Sleeps::default();
        let child = sleeps.spawn();
        let hidden = sleeps.spawn();
        let own = std::process::id() as i32;
        let tree = FakeTree::new();
        tree.cgroup(
            "u.slice/x.service",
            format!("{own}\n{NO_SUCH_PID}\n").as_bytes(),
        );
        tree.cgroup("u.slice/x.service/a", format!("{child}\n").as_bytes());
        // Listed twice: reported once.
        tree.cgroup("u.slice/x.service/a/b", format!("{own}\n").as_bytes());
        tree.cgroup("u.slice/x.service/a/b/c", b"");
        // Not followed: a link is no cgroup.
        tree.cgroup("elsewhere", format!("{hidden}\n").as_bytes());
        symlink(
            tree.root().join("elsewhere"),
            tree.root().join("u.slice/x.service/link"),
        )
        .expect("symlink");
        // Files other than cgroup.procs are ignored.
        fs::write(tree.root().join("u.slice/x.service/cgroup.events"), "").expect("write");

        let found = list_processes(tree.root(), "/u.slice/x.service").expect("list");
        let mut expected = vec![(own, String::new()), (child, "a".to_owned())];
        expected.sort();
        assert_eq!(pids_of(&found), expected);
        let sleep = found
            .iter()
            .find(|info| info.pid == child)
            .expect("the sleep");
        assert_eq!(sleep.comm, b"sleep");
        assert_eq!(sleep.ppid, own);
        assert_eq!(sleep.start_ticks, start_ticks(child));

        assert_eq!(
            list_processes(tree.root(), "/u.slice/missing.service").expect("list"),
            [],
            "a unit cgroup that does not exist holds nothing"
        );
    }

    #[test]
    fn list_processes_reports_errors_with_the_path() {
        let tree = FakeTree::new();
        tree.cgroup("bad.service", b"1\nx\n");
        fs::create_dir_all(tree.root().join("nofile.service")).expect("mkdir");
        tree.cgroup("nested.service", b"");
        fs::create_dir_all(tree.root().join("nested.service/not-a-cgroup")).expect("mkdir");
        tree.cgroup("huge.service", &vec![b'1'; MAX_PROCS_FILE_BYTES + 1]);

        let error = list_processes(tree.root(), "/bad.service").expect_err("bad pid");
        assert!(matches!(&error, ProcsError::ProcsParse { .. }), "{error:?}");
        let path = tree.root().join("bad.service/cgroup.procs");
        assert!(
            error.to_string().contains(&path.display().to_string()),
            "{error}"
        );

        for (cgroup, missing) in [
            ("/nofile.service", "nofile.service/cgroup.procs"),
            (
                "/nested.service",
                "nested.service/not-a-cgroup/cgroup.procs",
            ),
        ] {
            match list_processes(tree.root(), cgroup) {
                Err(ProcsError::ReadFile { path, .. }) => {
                    assert_eq!(path, tree.root().join(missing))
                }
                other => panic!("{cgroup} gave {other:?}"),
            }
        }
        match list_processes(tree.root(), "/huge.service") {
            Err(ProcsError::FileTooLarge { path, .. }) => {
                assert_eq!(path, tree.root().join("huge.service/cgroup.procs"))
            }
            other => panic!("huge gave {other:?}"),
        }

        for cgroup in ["", "x.service", "/", "/a/../b", "/a\0b", "/a//b"] {
            match list_processes(tree.root(), cgroup) {
                Err(ProcsError::Cgroup(CgroupError::InvalidCgroup { .. })) => {}
                other => panic!("cgroup {cgroup:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn walk_stops_at_its_limits() {
        let tree = FakeTree::new();
        tree.cgroup("unit", b"");
        tree.cgroup("unit/a", b"");
        tree.cgroup("unit/a/b", b"");
        tree.cgroup("wide", b"1\n");
        tree.cgroup("wide/a", b"2\n1\n");
        tree.cgroup("wide/b", b"3\n");
        let top = tree.root().join("unit");
        let limits = |depth, cgroups, processes| WalkLimits {
            depth,
            cgroups,
            processes,
        };

        assert!(walk(&top, limits(2, 3, 0)).is_ok(), "exactly at the limits");
        match walk(&top, limits(1, 10, 10)) {
            Err(ProcsError::TooDeep { path, limit: 1 }) => assert_eq!(path, top.join("a/b")),
            other => panic!("depth gave {other:?}"),
        }
        match walk(&top, limits(10, 2, 10)) {
            Err(ProcsError::TooManyCgroups { path, limit: 2 }) => assert_eq!(path, top),
            other => panic!("cgroups gave {other:?}"),
        }

        // Pids 1, 2, 3, with 1 listed twice; which of them exist does not matter to the count.
        let wide = tree.root().join("wide");
        assert!(
            walk(&wide, limits(10, 10, 3)).is_ok(),
            "a repeated pid counts once"
        );
        match walk(&wide, limits(10, 10, 2)) {
            Err(ProcsError::TooManyProcesses { path, limit: 2 }) => assert_eq!(path, wide),
            other => panic!("processes gave {other:?}"),
        }
    }

    /// Polls until the tracker reports at least one exit; panics after [`KERNEL_WAIT`].
    fn wait_for_exits(poll: &mut Poll, tracker: &mut ProcessTracker<u32>) -> Vec<(u32, i32)> {
        let mut events = Events::with_capacity(16);
        let deadline = Instant::now() + KERNEL_WAIT;
        loop {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                panic!("timed out waiting for an exit");
            };
            poll.poll(&mut events, Some(left)).expect("mio poll");
            let exits: Vec<(u32, i32)> = events
                .iter()
                .map(|event| event.token())
                .filter(|&token| tracker.owns(token))
                .collect::<Vec<Token>>()
                .into_iter()
                .filter_map(|token| tracker.handle_event(poll.registry(), token))
                .collect();
            if !exits.is_empty() {
                return exits;
            }
        }
    }

    fn token_of(tracker: &ProcessTracker<u32>, key: u32, pid: i32) -> Token {
        tracker.by_key[&key][&pid]
    }

    #[test]
    fn tracker_reports_exactly_the_exit_that_happened() {
        let mut poll = Poll::new().expect("mio poll");
        let mut tracker = ProcessTracker::new(100..200);
        let mut sleeps = Sleeps::default();
        let first = sleeps.spawn();
        let second = sleeps.spawn();
        let other_key = sleeps.spawn();
        for (key, pid) in [(1, first), (1, second), (2, other_key)] {
            let tracked = tracker
                .track(poll.registry(), key, pid, start_ticks(pid))
                .expect("track");
            assert_eq!(tracked, Tracked::Alive);
        }
        // The same (key, pid) again changes nothing.
        assert_eq!(
            tracker
                .track(poll.registry(), 1, first, start_ticks(first))
                .expect("track"),
            Tracked::Alive
        );
        assert_eq!(tracker.tracked_count(1), 2);
        assert_eq!(tracker.len(), 3);

        // A readiness event for a live process is no exit.
        let token = token_of(&tracker, 1, second);
        assert!(tracker.owns(token));
        assert_eq!(tracker.handle_event(poll.registry(), token), None);
        assert_eq!(tracker.tracked_count(1), 2);
        assert_eq!(tracker.handle_event(poll.registry(), Token(150)), None);
        assert!(!tracker.owns(Token(200)));

        sleeps.kill(first);
        assert_eq!(wait_for_exits(&mut poll, &mut tracker), [(1, first)]);
        let mut left: Vec<i32> = tracker.tracked(1).collect();
        left.sort();
        assert_eq!(left, [second]);
        sleeps.reap(first);

        // A zombie is an exit, and so is a reaped process.
        sleeps.kill_to_zombie(second);
        assert_eq!(wait_for_exits(&mut poll, &mut tracker), [(1, second)]);
        assert_eq!(tracker.tracked_count(1), 0);

        tracker.untrack_key(poll.registry(), 2);
        assert!(tracker.is_empty());
        assert_eq!(tracker.tracked_count(2), 0);
    }

    #[test]
    fn tracking_a_gone_process_says_so() {
        let poll = Poll::new().expect("mio poll");
        let mut tracker = ProcessTracker::new(0..10);
        let mut sleeps = Sleeps::default();

        let reaped = sleeps.spawn();
        let ticks = start_ticks(reaped);
        sleeps.reap(reaped);
        // The pid may have been reused since: that too is the original's exit.
        assert_eq!(
            tracker
                .track(poll.registry(), 1, reaped, ticks)
                .expect("track"),
            Tracked::AlreadyExited
        );

        let zombie = sleeps.spawn();
        let ticks = start_ticks(zombie);
        sleeps.kill_to_zombie(zombie);
        assert_eq!(
            tracker
                .track(poll.registry(), 1, zombie, ticks)
                .expect("track"),
            Tracked::AlreadyExited
        );

        let alive = sleeps.spawn();
        let ticks = start_ticks(alive);
        assert_eq!(
            tracker
                .track(poll.registry(), 1, alive, ticks + 1)
                .expect("track"),
            Tracked::AlreadyExited,
            "another start time is another process"
        );
        assert_eq!(
            tracker
                .track(poll.registry(), 1, NO_SUCH_PID, 0)
                .expect("track"),
            Tracked::AlreadyExited
        );
        assert!(tracker.is_empty());

        for pid in [0, -1, i32::MIN] {
            assert!(matches!(
                tracker.track(poll.registry(), 1, pid, 0),
                Err(ProcsError::InvalidPid { .. })
            ));
        }
    }

    #[test]
    fn tracker_tokens_stay_in_range_and_are_reused() {
        let mut poll = Poll::new().expect("mio poll");
        let mut tracker = ProcessTracker::new(7..8);
        let mut sleeps = Sleeps::default();
        let first = sleeps.spawn();
        let second = sleeps.spawn();
        tracker
            .track(poll.registry(), 1, first, start_ticks(first))
            .expect("track");
        assert_eq!(token_of(&tracker, 1, first), Token(7));
        assert!(matches!(
            tracker.track(poll.registry(), 1, second, start_ticks(second)),
            Err(ProcsError::NoToken { .. })
        ));
        sleeps.kill(first);
        assert_eq!(wait_for_exits(&mut poll, &mut tracker), [(1, first)]);
        assert_eq!(
            tracker
                .track(poll.registry(), 1, second, start_ticks(second))
                .expect("track"),
            Tracked::Alive
        );
        assert_eq!(token_of(&tracker, 1, second), Token(7));
        tracker.untrack_key(poll.registry(), 1);
        assert!(tracker.is_empty());
    }

    /// A scratch cgroup tree below the real cgroup2 mount. Dropping it kills what is in it, reaps the
    /// test's sleeps and removes the cgroups deepest first, even when the test failed.
    struct ScratchCgroup {
        mount: PathBuf,
        name: String,
        /// Child cgroups created, in creation order.
        children: Vec<String>,
        sleeps: Sleeps,
    }

    impl ScratchCgroup {
        /// `None`, with the reason printed, unless this test may create cgroups.
        fn new() -> Option<Self> {
            if !nix::unistd::geteuid().is_root() {
                println!("skipped: creating cgroups needs root");
                return None;
            }
            let mount = match cgroup2_mount() {
                Ok(mount) => mount,
                Err(error) => {
                    println!("skipped: {error}");
                    return None;
                }
            };
            let name = unique_name();
            if let Err(error) = fs::create_dir(mount.join(&name)) {
                println!(
                    "skipped: cgroup2 at {} is not writable: {error}",
                    mount.display()
                );
                return None;
            }
            Some(Self {
                mount,
                name,
                children: Vec::new(),
                sleeps: Sleeps::default(),
            })
        }

        fn dir(&self) -> PathBuf {
            self.mount.join(&self.name)
        }

        fn mkdir(&mut self, child: &str) {
            fs::create_dir(self.dir().join(child)).expect("mkdir of a scratch cgroup");
            self.children.push(child.to_owned());
        }

        /// Starts a sleep and moves it into `child` (empty: the scratch cgroup itself).
        fn spawn_sleep_in(&mut self, child: &str) -> i32 {
            let pid = self.sleeps.spawn();
            fs::write(self.dir().join(child).join(PROCS_FILE), pid.to_string())
                .expect("a pid can be moved into a scratch cgroup");
            pid
        }
    }

    impl Drop for ScratchCgroup {
        fn drop(&mut self) {
            let _ = fs::write(self.dir().join("cgroup.kill"), "1");
            for child in &mut self.sleeps.0 {
                let _ = child.kill();
                let _ = child.wait();
            }
            let dirs = self
                .children
                .iter()
                .rev()
                .map(|child| self.dir().join(child));
            for dir in dirs.chain([self.dir()]) {
                // A killed process not of ours may take a moment to leave; rmdir says EBUSY until then.
                let deadline = Instant::now() + KERNEL_WAIT;
                while let Err(error) = fs::remove_dir(&dir) {
                    if error.raw_os_error() != Some(Errno::EBUSY as i32)
                        || Instant::now() > deadline
                    {
                        eprintln!("cannot remove scratch cgroup {}: {error}", dir.display());
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    #[test]
    fn list_processes_finds_a_real_subtree() {
        let Some(mut scratch) = ScratchCgroup::new() else {
            return;
        };
        scratch.mkdir("a");
        scratch.mkdir("a/b");
        let top = scratch.spawn_sleep_in("");
        let middle = scratch.spawn_sleep_in("a");
        let deep = scratch.spawn_sleep_in("a/b");

        let cgroup = format!("/{}", scratch.name);
        let found = list_processes(&scratch.mount, &cgroup).expect("list");
        let mut expected = vec![
            (top, String::new()),
            (middle, "a".to_owned()),
            (deep, "a/b".to_owned()),
        ];
        expected.sort();
        assert_eq!(pids_of(&found), expected);
        for info in &found {
            assert_eq!(info.comm, b"sleep");
            assert_eq!(info.start_ticks, start_ticks(info.pid));
        }

        // The tracker sees the deepest one go.
        let mut poll = Poll::new().expect("mio poll");
        let mut tracker = ProcessTracker::new(0..16);
        for info in &found {
            assert_eq!(
                tracker
                    .track(poll.registry(), 9, info.pid, info.start_ticks)
                    .expect("track"),
                Tracked::Alive
            );
        }
        scratch.sleeps.reap(deep);
        assert_eq!(wait_for_exits(&mut poll, &mut tracker), [(9, deep)]);
        let after = list_processes(&scratch.mount, &cgroup).expect("list again");
        expected.retain(|(pid, _)| *pid != deep);
        assert_eq!(pids_of(&after), expected);
        tracker.untrack_key(poll.registry(), 9);
    }

    #[test]
    fn list_processes_reads_threaded_subtrees_through_their_domain() {
        let Some(mut scratch) = ScratchCgroup::new() else {
            return;
        };
        scratch.mkdir("t");
        fs::write(scratch.dir().join("t/cgroup.type"), "threaded").expect("make t threaded");
        let pid = scratch.spawn_sleep_in("t");
        let cgroup = format!("/{}", scratch.name);
        let found = list_processes(&scratch.mount, &cgroup).expect("list");
        assert_eq!(pids_of(&found), [(pid, String::new())]);
        match list_processes(&scratch.mount, &format!("{cgroup}/t")) {
            Err(ProcsError::Threaded { path }) => assert_eq!(path, scratch.dir().join("t")),
            other => panic!("a threaded unit cgroup gave {other:?}"),
        }
    }
}

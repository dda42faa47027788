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

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use super::watcher::locate;
use super::{CgroupError, cgroup_v2_path};

mod start_order;
mod tracker;

/// For the simulator's oracle, which places a start as the agent can.
#[cfg(test)]
pub(crate) use start_order::StartOrder;
pub(crate) use start_order::{
    ClockBasis, GoneRoot, Lineage, NextInvocation, OffsetFloors, OnceHeld, ProcessStart,
    earlier_processes, offset_now,
};
pub(crate) use tracker::{ProcessTracker, Tracked};

/// The file of a cgroup that lists the processes (thread-group ids) in it, one per line.
const PROCS_FILE: &str = "cgroup.procs";

/// Where the kernel shows processes; pids are those of this agent's pid namespace.
const PROC_ROOT: &str = "/proc";

/// Descendant levels walked below a unit's cgroup before giving up.
pub(crate) const MAX_CGROUP_DEPTH: usize = 64;

/// Cgroups (the unit's and its descendants) walked before giving up.
pub(crate) const MAX_CGROUPS: usize = 100_000;

/// Processes listed in one unit's subtree before giving up.
pub(crate) const MAX_PROCESSES: usize = 100_000;

/// `/proc/PID/stat` is about 52 numbers and a command name of at most 64 bytes: well under this.
const MAX_STAT_BYTES: usize = 4096;

/// A pid is at most 10 digits and a newline; one file holding more than the process limit is refused.
const MAX_PROCS_FILE_BYTES: usize = (MAX_PROCESSES + 1) * 11;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// The fields of `/proc/PID/stat` this module uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProcStat {
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
pub(crate) enum StatParseError {
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
pub(crate) enum ProcsParseError {
    /// The last line has no newline.
    #[error("cgroup.procs does not end with a newline")]
    NoNewline,
    /// A line is not a positive decimal pid.
    #[error("cgroup.procs has line {0:?}, expected a pid")]
    BadPid(String),
}

/// A failure to list or track processes, with the path, pid or clock it concerns.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProcsError {
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
pub(crate) fn parse_stat(contents: &[u8]) -> Result<ProcStat, StatParseError> {
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
pub(crate) fn parse_procs(contents: &[u8]) -> Result<Vec<i32>, ProcsParseError> {
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

/// One process found in a unit's cgroup subtree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProcessInfo {
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

/// What a walk of a cgroup subtree found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Census {
    /// Every process listed and still there when its `/proc/PID/stat` was read.
    pub processes: Vec<ProcessInfo>,
    /// How many listed processes were gone before their `stat` was read: whose they were is
    /// unknown, and what they forked after the listing is missing from `processes`.
    pub vanished: usize,
}

impl Census {
    /// Adds process `pid`, listed in the cgroup `below` the unit's, as its `/proc/PID/stat`
    /// shows it, or counts it vanished if it is gone.
    fn add(&mut self, pid: i32, below: PathBuf) -> Result<(), ProcsError> {
        match read_stat(pid)? {
            Some(stat) => self.processes.push(ProcessInfo {
                pid,
                ppid: stat.ppid,
                session: stat.session,
                start_ticks: stat.start_ticks,
                comm: stat.comm,
                state: stat.state,
                cgroup: below,
            }),
            None => self.vanished += 1,
        }
        Ok(())
    }
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
/// A cgroup that disappears during the walk is skipped, and so is a process that exits between
/// its listing and its `stat` (counted in [`Census::vanished`]); a unit cgroup that does not
/// exist gives an empty census. Symbolic links are not
/// followed. Each pid appears once. Any other failure is an error naming the path.
///
/// The walk is not atomic: a process that forks while it runs may be missed (callers that need
/// the whole set list again after each change they learn of), and so may one moved from a
/// cgroup of the subtree not yet walked into one already walked, which a unit with
/// `Delegate=yes` may do to its own. So where the subtree has cgroups below the unit's, every
/// process's own `/proc/PID/cgroup` is read too ([`scan_members`]), which finds a process
/// wherever in the subtree it is.
pub(crate) fn list_processes(root: &Path, cgroup: &str) -> Result<Census, ProcsError> {
    let (parent, name) = locate(root, cgroup).map_err(ProcsError::Cgroup)?;
    let (mut census, cgroups) = walk(&parent.join(name), WALK_LIMITS)?;
    if cgroups > 1 {
        scan_members(Path::new(PROC_ROOT), cgroup, WALK_LIMITS, &mut census)?;
    }
    Ok(census)
}

/// Adds to `census` every process under `proc` whose `cgroup` file places it in `cgroup` (as
/// systemd names it) or below, and that `census` does not hold yet. A process's membership is
/// read from the process, so moving between the subtree's cgroups hides none; one gone before
/// its start is read counts as vanished, one gone before its membership is read is left out
/// (on a busy host most would be other units'; a process of ours gone then, whose child took a
/// pid below the listing's place, is the one thing it may miss).
fn scan_members(
    proc: &Path,
    cgroup: &str,
    limits: WalkLimits,
    census: &mut Census,
) -> Result<(), ProcsError> {
    let mut seen: HashSet<i32> = census.processes.iter().map(|p| p.pid).collect();
    let entries = fs::read_dir(proc).map_err(|source| ProcsError::ReadDir {
        path: proc.to_owned(),
        source,
    })?;
    for entry in entries {
        let entry = entry.map_err(|source| ProcsError::ReadDir {
            path: proc.to_owned(),
            source,
        })?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if seen.contains(&pid) {
            continue;
        }
        let Some(text) = read_proc_file(&entry.path().join("cgroup"))? else {
            continue;
        };
        let Some(below) = cgroup_v2_path(&String::from_utf8_lossy(&text))
            .and_then(|member| within_cgroup(member, cgroup))
        else {
            continue;
        };
        seen.insert(pid);
        if seen.len() > limits.processes {
            return Err(ProcsError::TooManyProcesses {
                path: PathBuf::from(cgroup),
                limit: limits.processes,
            });
        }
        census.add(pid, below)?;
    }
    Ok(())
}

/// Where `member`, a cgroup path, lies below `cgroup`, relative to it (empty for `cgroup`
/// itself); `None` if it is not in that subtree.
fn within_cgroup(member: &str, cgroup: &str) -> Option<PathBuf> {
    let rest = member.strip_prefix(cgroup.trim_end_matches('/'))?;
    if rest.is_empty() {
        Some(PathBuf::new())
    } else {
        rest.strip_prefix('/').map(PathBuf::from)
    }
}

/// Walks the subtree at `top`: its census, and how many cgroups it read.
fn walk(top: &Path, limits: WalkLimits) -> Result<(Census, usize), ProcsError> {
    let mut found = Census::default();
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
            found.add(pid, relative.clone())?;
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
    Ok((found, cgroups))
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
pub(crate) fn read_stat(pid: i32) -> Result<Option<ProcStat>, ProcsError> {
    let path = Path::new(PROC_ROOT).join(pid.to_string()).join("stat");
    let Some(contents) = read_proc_file(&path)? else {
        return Ok(None);
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

/// Reads a file of `/proc/PID/`; `None` means the process is gone (reaped).
fn read_proc_file(path: &Path) -> Result<Option<Vec<u8>>, ProcsError> {
    match read_bounded(path, MAX_STAT_BYTES) {
        Ok(contents) => Ok(Some(contents)),
        // ESRCH: the process was reaped after the file was opened.
        Err(ReadError::Io(error))
            if vanished(&error) || error.raw_os_error() == Some(Errno::ESRCH as i32) =>
        {
            Ok(None)
        }
        Err(ReadError::Io(source)) => Err(ProcsError::ReadFile {
            path: path.to_owned(),
            source,
        }),
        Err(ReadError::TooLarge { limit }) => Err(ProcsError::FileTooLarge {
            path: path.to_owned(),
            limit,
        }),
    }
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

#[cfg(test)]
mod tests;

//! `exitproof run`: starts a command as a transient service, has the agent watch the
//! invocation, waits for its proof and gives the main process's exit status, like
//! `systemd-run --wait` but only once every process of the unit is gone.
//!
//! The unit is started with `AddRef=true`, so systemd keeps it loaded (its invocation, cgroup
//! and exit status readable) while this process's bus connection lives, however fast the
//! command exits. The start job's `JobRemoved` says when to read the invocation; the watch then
//! names it, so the proof is of that invocation whenever it was made.

use std::path::{Path, PathBuf};
use std::time::Duration;

use zbus::{Connection, OwnedVariant};

use crate::duration::{Timespan, parse_timespan};
use crate::systemd::manager::{ManagerError, exec_start, owned_variant, start_transient_unit};
use crate::systemd::read::read_unit;
use crate::systemd::runtime::MioRuntime;
use crate::systemd::snapshot::ReadKind;
use crate::systemd::start::job_result;
use crate::systemd::{self as sd, Bus, ConnectError};
use crate::unit_name::UnitName;

/// The properties `-p NAME=VALUE` may set, by the D-Bus type systemd wants for each.
const BOOLEANS: [&str; 6] = [
    "RemainAfterExit",
    "SendSIGKILL",
    "SendSIGHUP",
    "Delegate",
    "PrivateTmp",
    "NoNewPrivileges",
];
const STRINGS: [&str; 10] = [
    "Description",
    "Type",
    "KillMode",
    "User",
    "Group",
    "WorkingDirectory",
    "Slice",
    "StandardOutput",
    "StandardError",
    "CollectMode",
];
/// `-p NAME=DURATION`, sent in microseconds as systemd's `...USec` property.
const DURATIONS: [(&str, &str); 3] = [
    ("RuntimeMaxSec", "RuntimeMaxUSec"),
    ("TimeoutStopSec", "TimeoutStopUSec"),
    ("TimeoutStartSec", "TimeoutStartUSec"),
];
/// Properties `exitproof run` sets itself.
const OWN: [&str; 2] = ["ExecStart", "AddRef"];

/// Why `exitproof run` failed before it could give the command's exit status.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    /// A `-p` assignment that cannot be sent.
    #[error("{0}")]
    Property(String),
    /// The command to run is not an executable file found where it was looked for.
    #[error("{0}")]
    Command(String),
    /// `--unit` names no service.
    #[error("--unit {0}: exitproof run starts a .service")]
    NotAService(String),
    /// No random unit name could be made (`/proc/sys/kernel/random/uuid`).
    #[error("make a unit name: {0}")]
    UnitName(std::io::Error),
    /// The bus or systemd could not be reached.
    #[error("{0}")]
    Connect(ConnectError),
    /// A call to systemd failed.
    #[error("{0}")]
    Manager(ManagerError),
    /// The bus connection's loop failed.
    #[error("run the bus connection: {0}")]
    Runtime(std::io::Error),
    /// systemd's start job did not succeed (its result: `failed`, `dependency`, ...).
    #[error("start {unit}: the start job {result}")]
    Job { unit: String, result: String },
    /// The unit has no invocation after its start job finished.
    #[error("{0} has no invocation ID after its start job")]
    NoInvocation(String),
}

/// One `-p NAME=VALUE`, typed as `StartTransientUnit` takes it. `Environment=` takes one
/// `VAR=value` per `-p` (no splitting), and repeated ones add up.
pub(crate) fn property(assignment: &str) -> Result<(String, OwnedVariant), RunError> {
    let bad = |why: String| RunError::Property(format!("-p {assignment}: {why}"));
    let (name, value) = assignment
        .split_once('=')
        .ok_or_else(|| bad("expected NAME=VALUE".into()))?;
    let encoded = if BOOLEANS.contains(&name) {
        let flag = match value {
            "yes" | "true" | "on" | "1" => true,
            "no" | "false" | "off" | "0" => false,
            _ => return Err(bad("expected yes or no".into())),
        };
        (name.to_owned(), owned_variant(flag))
    } else if STRINGS.contains(&name) {
        (name.to_owned(), owned_variant(value))
    } else if name == "Environment" {
        if !value.contains('=') {
            return Err(bad("expected VAR=value".into()));
        }
        (name.to_owned(), owned_variant(vec![value.to_owned()]))
    } else if name == "KillSignal" {
        let signal = signal_number(value).ok_or_else(|| bad("not a signal".into()))?;
        (name.to_owned(), owned_variant(signal))
    } else if let Some((_, usec)) = DURATIONS.iter().find(|(sec, _)| *sec == name) {
        // systemd's infinity is u64::MAX microseconds (USEC_INFINITY).
        let micros = match parse_timespan(value).map_err(|e| bad(e.to_string()))? {
            Timespan::Finite(duration) => u64::try_from(duration.as_micros()).unwrap_or(u64::MAX),
            Timespan::Infinity => u64::MAX,
        };
        ((*usec).to_owned(), owned_variant(micros))
    } else if OWN.contains(&name) {
        return Err(bad("exitproof run sets it itself".into()));
    } else {
        return Err(bad(format!(
            "not a property exitproof run can set (it can: {}, Environment, KillSignal, {})",
            BOOLEANS
                .iter()
                .chain(STRINGS.iter())
                .copied()
                .collect::<Vec<_>>()
                .join(", "),
            DURATIONS.map(|(sec, _)| sec).join(", ")
        )));
    };
    let (name, value) = encoded;
    let value = value.map_err(|e| bad(e.to_string()))?;
    Ok((name, value))
}

/// A signal by name (`TERM`, `SIGTERM`) or number, as systemd's `KillSignal=` takes it.
pub(crate) fn signal_number(text: &str) -> Option<i32> {
    if let Ok(number) = text.parse::<i32>() {
        return nix::sys::signal::Signal::try_from(number)
            .ok()
            .map(|s| s as i32);
    }
    let name = if text.starts_with("SIG") {
        text.to_owned()
    } else {
        format!("SIG{text}")
    };
    name.parse::<nix::sys::signal::Signal>()
        .ok()
        .map(|s| s as i32)
}

/// The exit status of `exitproof run` from the proof event's `systemd` record: the main
/// process's exit status, or 128 + the signal's number if a signal ended it. `None` if the
/// record does not tell (a proof without systemd's status).
pub(crate) fn exit_status(code: &str, status: &str) -> Option<u8> {
    match code {
        "exited" => status.parse::<u8>().ok(),
        "killed" | "dumped" => {
            let signal = signal_number(status)?;
            u8::try_from(128 + signal).ok()
        }
        _ => None,
    }
}

/// The exit status of `wait --unit-status` and `stop --unit-status`, as `systemd-run --wait`
/// gives it (`run_context` in systemd's src/run/run.c): 0 when systemd calls the unit's result
/// a success (so `SuccessExitStatus=` and a stop's SIGTERM count), else as [`exit_status`].
pub(crate) fn unit_status(result: &str, code: &str, status: &str) -> Option<u8> {
    if result == "success" {
        return Some(0);
    }
    exit_status(code, status)
}

/// The absolute path of the program `argv` starts with ([`find_program`]), as UTF-8.
pub(crate) fn program(argv: &[String], path_var: Option<&str>) -> Result<String, RunError> {
    let first = argv
        .first()
        .ok_or_else(|| RunError::Command("no command given".into()))?;
    let program = find_program(first, path_var)?;
    program
        .to_str()
        .map(str::to_owned)
        .ok_or_else(|| RunError::Command(format!("{}: not UTF-8", program.display())))
}

/// Finds `program` as `systemd-run` does: a path with a `/` is made absolute, a bare name is
/// looked up in `$PATH`. systemd wants an absolute path.
pub(crate) fn find_program(program: &str, path_var: Option<&str>) -> Result<PathBuf, RunError> {
    let not_found = || RunError::Command(format!("{program}: command not found"));
    if program.contains('/') {
        let path = std::path::absolute(program)
            .map_err(|e| RunError::Command(format!("{program}: {e}")))?;
        // systemd would start the unit and fail it with 203/EXEC.
        return if is_executable(&path) {
            Ok(path)
        } else {
            Err(RunError::Command(format!(
                "{program}: no such executable file"
            )))
        };
    }
    path_var
        .unwrap_or("/usr/local/bin:/usr/bin:/bin")
        .split(':')
        .filter(|dir| dir.starts_with('/'))
        .map(|dir| Path::new(dir).join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(not_found)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A name for a unit started without `--unit`: `exitproof-run-` and 32 random hex digits.
pub(crate) fn generated_unit_name() -> Result<String, RunError> {
    let uuid =
        std::fs::read_to_string("/proc/sys/kernel/random/uuid").map_err(RunError::UnitName)?;
    Ok(format!(
        "exitproof-run-{}.service",
        uuid.trim().replace('-', "")
    ))
}

/// A started unit, kept loaded (`AddRef`) while this value lives.
pub(crate) struct Started {
    /// The invocation the start job began.
    pub invocation: String,
    // The connection holds systemd's reference to the unit: dropped, the unit may be
    // garbage-collected. The runtime and poll drive it.
    _conn: Connection,
    _runtime: MioRuntime,
    _poll: mio::Poll,
}

/// Starts `argv` as the transient service `unit` with `properties` on `bus`, waits for its
/// start job, and reads the invocation it began.
pub(crate) fn start(
    bus: Bus,
    unit: &UnitName,
    properties: Vec<(String, OwnedVariant)>,
    program: &str,
    argv: &[String],
    method_timeout: Duration,
) -> Result<Started, RunError> {
    let unit = unit.as_str().to_owned();
    if !unit.ends_with(".service") {
        return Err(RunError::NotAService(unit));
    }
    let mut all = vec![
        (
            "Description".to_owned(),
            owned_variant(format!("exitproof run {}", argv.join(" "))),
        ),
        (
            "ExecStart".to_owned(),
            owned_variant(exec_start(program, argv)),
        ),
        ("AddRef".to_owned(), owned_variant(true)),
    ]
    .into_iter()
    .map(|(name, value)| value.map(|value| (name, value)))
    .collect::<zbus::Result<Vec<_>>>()
    .map_err(|e| RunError::Property(format!("encode the unit's properties: {e}")))?;
    // The user's come after, so a Description of theirs wins.
    all.extend(properties);

    let mut poll = mio::Poll::new().map_err(RunError::Runtime)?;
    let runtime = MioRuntime::new(poll.registry(), mio::Token(0), 16..(1 << 20))
        .map_err(RunError::Runtime)?;
    let (conn, subscription) = sd::connect(&runtime, &mut poll, bus, method_timeout, None)
        .and_then(|(conn, subscribed)| Ok((conn, subscribed.into_systemd()?)))
        .map_err(RunError::Connect)?;
    let systemd = subscription.systemd.clone();
    // Only the manager's signals (JobRemoved) are read; an undrained stream would stall the
    // connection.
    let mut manager_signals = subscription.manager;
    drop((subscription.units, subscription.owner));
    let invocation = runtime
        .block_on(&mut poll, async {
            let job = start_transient_unit(&conn, &systemd, &unit, all)
                .await
                .map_err(RunError::Manager)?;
            let result = job_result(&mut manager_signals, &job).await;
            if result != "done" {
                return Err(RunError::Job {
                    unit: unit.clone(),
                    result,
                });
            }
            let snapshot = read_unit(&conn, &systemd, &unit, ReadKind::Get, None)
                .await
                .map_err(RunError::Manager)?;
            Ok(snapshot.invocation)
        })
        .map_err(RunError::Runtime)??;
    // Nothing more is read from the bus; its signals must not queue up while the proof is
    // awaited.
    drop(manager_signals);
    if invocation.is_empty() {
        return Err(RunError::NoInvocation(unit));
    }
    Ok(Started {
        invocation,
        _conn: conn,
        _runtime: runtime,
        _poll: poll,
    })
}

#[cfg(test)]
mod tests;

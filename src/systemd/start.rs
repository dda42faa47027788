//! Starting a unit and learning the invocation its start job began: `StartUnit`, the job's
//! `JobRemoved`, then a read of the unit. The agent's `start` and `exitproof run` (whose
//! transient unit is started by `StartTransientUnit`) both follow their job this way.

use std::future::poll_fn;
use std::pin::Pin;

use zbus::export::futures_core::Stream;
use zbus::{Connection, MatchRule, MessageStream, OwnedObjectPath};

use super::manager::{MANAGER_PATH, ManagerError, NO_SUCH_UNIT, call_manager, signal_stream};
use super::read::read_unit;
use super::signal::MANAGER_INTERFACE;
use super::snapshot::ReadKind;

/// The errors systemd answers a start of a unit it cannot load with
/// (`bus_unit_validate_load_state`): LoadState `not-found`, `error`, `bad-setting`, `masked`.
const NOT_LOADABLE: [&str; 4] = [
    NO_SUCH_UNIT,
    "org.freedesktop.systemd1.LoadFailed",
    "org.freedesktop.systemd1.BadUnitSetting",
    "org.freedesktop.systemd1.UnitMasked",
];

/// Why a unit could not be started and its invocation learned.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    /// systemd does not know the unit, or will not load it (masked, invalid).
    #[error("{0}")]
    NotFound(String),
    /// A call failed, or the start job did not succeed.
    #[error("{0}")]
    Failed(String),
}

/// Starts `unit` on `systemd` (a bus name) as `systemctl start` does (`StartUnit`, mode
/// `replace`), waits for the start job to finish, and returns the InvocationID it began.
///
/// The JobRemoved match is added before the call, so the job's end cannot be missed. The read
/// after it finds the new invocation: systemd gives a unit its InvocationID when the job starts
/// it (`unit_acquire_invocation_id`), and keeps it once the unit is inactive again, until the
/// next start or until it unloads the unit.
pub(crate) async fn start_unit(
    conn: &Connection,
    systemd: &str,
    unit: &str,
) -> Result<String, StartError> {
    let failed = |e: ManagerError| StartError::Failed(e.to_string());
    let rule = MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .sender(systemd)
        .interface(MANAGER_INTERFACE)
        .path(MANAGER_PATH)
        .member("JobRemoved");
    let mut removed = signal_stream(conn, rule, 64, "the JobRemoved match rule")
        .await
        .map_err(failed)?;
    let job = match call_manager(conn, systemd, "StartUnit", &(unit, "replace")).await {
        Ok(reply) => reply
            .body()
            .deserialize::<OwnedObjectPath>()
            .map_err(ManagerError::new(format!("start {unit}")))
            .map_err(failed)?,
        Err(zbus::Error::MethodError(name, message, _))
            if NOT_LOADABLE.contains(&name.as_str()) =>
        {
            let why = message.unwrap_or_else(|| name.to_string());
            return Err(StartError::NotFound(format!("start {unit}: {why}")));
        }
        Err(e) => return Err(failed(ManagerError::new(format!("start {unit}"))(e))),
    };
    let result = job_result(&mut removed, &job).await;
    if result != "done" {
        return Err(StartError::Failed(format!(
            "start {unit}: the start job {result}"
        )));
    }
    let snapshot = read_unit(conn, systemd, unit, ReadKind::Get, None)
        .await
        .map_err(failed)?;
    if snapshot.invocation.is_empty() {
        return Err(StartError::Failed(format!(
            "{unit} has no invocation after its start job: it ended and systemd unloaded it \
             before it could be read"
        )));
    }
    Ok(snapshot.invocation)
}

/// Waits for `JobRemoved` of `job` on `stream` and returns its result (`done`, `failed`,
/// `dependency`, ...).
pub(crate) async fn job_result(stream: &mut MessageStream, job: &OwnedObjectPath) -> String {
    loop {
        let Some(message) = poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx)).await else {
            return "could not be followed: the bus connection was lost".into();
        };
        let Ok(message) = message else { continue };
        if message
            .header()
            .member()
            .is_none_or(|m| m.as_str() != "JobRemoved")
        {
            continue;
        }
        // JobRemoved(u id, o job, s unit, s result)
        if let Ok((_, path, _, result)) = message
            .body()
            .deserialize::<(u32, OwnedObjectPath, String, String)>()
            && path == *job
        {
            return result;
        }
    }
}

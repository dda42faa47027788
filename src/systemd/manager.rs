//! Calls to systemd's manager over D-Bus: subscribe, stop a unit, start a transient one
//! (reading a unit is `read`'s).
//!
//! Every call here is async and runs on the agent's own loop (see `systemd::runtime`); the
//! connection has a method-call timeout, so a lost reply is an error, never a hang.

use std::collections::HashMap;
use std::num::NonZeroUsize;

use zbus::export::futures_core::Stream;
use zbus::{Connection, MatchRule, Message, MessageStream, OwnedVariant};

pub(crate) use super::owner::SYSTEMD;
use super::owner::{Credentials, Expected, NotSystemd, ProcessView, cgroup_v2_path, judge};
use super::signal::{MANAGER_INTERFACE, UNIT_PATH_PREFIX};

pub(super) const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
/// The bus daemon's own name and object.
const BUS_DAEMON: &str = "org.freedesktop.DBus";
const BUS_DAEMON_PATH: &str = "/org/freedesktop/DBus";
pub(super) const PROPERTIES: &str = "org.freedesktop.DBus.Properties";
pub(super) const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
/// `GetUnitByInvocationID`'s answer when no loaded unit has that invocation
/// (`BUS_ERROR_NO_UNIT_FOR_INVOCATION_ID`).
pub(super) const NO_UNIT_FOR_INVOCATION_ID: &str = "org.freedesktop.systemd1.NoUnitForInvocationID";
/// How many signals may wait in a stream before zbus stops reading the socket. zbus waits for
/// room rather than dropping, and the agent's task drains the stream whenever zbus's reader
/// waits, so this bounds memory, not what a burst may carry. The queue is a ring allocated up
/// front whose every slot (72 bytes) is written once as many signals have passed: at 1,024 the
/// two streams held 144 KiB resident for the agent's life.
const STREAM_QUEUE: usize = 128;
/// The queue of the stream of NameOwnerChanged for systemd's name alone, which changes only
/// when systemd goes or comes back.
const OWNER_QUEUE: usize = 16;

/// A failed call to systemd, with what it was for.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct ManagerError {
    what: String,
    source: zbus::Error,
}

impl ManagerError {
    pub(super) fn new(what: impl Into<String>) -> impl FnOnce(zbus::Error) -> ManagerError {
        let what = what.into();
        move |source| ManagerError { what, source }
    }
}

/// The streams of systemd's signals, subscribed before any unit is read so nothing slips
/// between a read and the first signal after it.
pub struct Subscription {
    /// The unique name behind `org.freedesktop.systemd1`: only its signals are facts.
    pub systemd: String,
    /// The manager's pid, which a later owner of the name must have (`owner::Expected`).
    pub manager_pid: u32,
    pub units: MessageStream,
    pub manager: MessageStream,
    /// NameOwnerChanged of `org.freedesktop.systemd1`: a new owner (systemd re-executed and
    /// came back) means every earlier fact and rule is stale.
    pub owner: MessageStream,
}

/// Who answered on the bus for systemd (each boxed: made once a connection, and the streams
/// make the values large).
pub enum Subscribed {
    /// systemd itself, subscribed to.
    Systemd(Box<Subscription>),
    /// Another process owns systemd's name.
    NotSystemd(Box<Impostor>),
}

/// An owner of systemd's name that is not systemd: nothing is asked of it and nothing it
/// sends is heard, but who owns the name next.
pub struct Impostor {
    /// Who it is, and why it is not systemd.
    pub who: NotSystemd,
    /// NameOwnerChanged of `org.freedesktop.systemd1`.
    pub owner: MessageStream,
}

/// Subscribes to systemd's unit signals, once the owner of its name is verified to be the
/// manager `expected` (`owner::judge`): `Subscribe` (without it systemd sends none), one match
/// rule for PropertiesChanged under the unit path namespace, one for the manager.
pub(crate) async fn subscribe(
    conn: &Connection,
    expected: Expected,
) -> Result<Subscribed, ManagerError> {
    let (systemd, owner) = systemd_owner(conn).await?;
    // The unique name is asked about, not the well-known one: it names one connection for
    // its whole life, and every call and match rule below names it.
    let credentials = owner_credentials(conn, &systemd).await?;
    let manager_pid = match judge(expected, credentials, process_view) {
        Ok(pid) => pid,
        Err(why) => {
            let who = NotSystemd {
                owner: systemd,
                pid: credentials.pid,
                uid: credentials.uid,
                why,
            };
            return Ok(Subscribed::NotSystemd(Box::new(Impostor { who, owner })));
        }
    };
    // The sender is part of each rule: anyone on the bus may emit a signal with any path and
    // interface, and only systemd's are facts.
    let units = MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .sender(systemd.as_str())
        .interface(PROPERTIES)
        .member("PropertiesChanged")
        .path_namespace(UNIT_PATH_PREFIX);
    let units = signal_stream(conn, units, STREAM_QUEUE, "the unit match rule").await?;
    let manager = MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .sender(systemd.as_str())
        .interface(MANAGER_INTERFACE)
        .path(MANAGER_PATH);
    let manager = signal_stream(conn, manager, STREAM_QUEUE, "the manager match rule").await?;
    call_manager(conn, &systemd, "Subscribe", &())
        .await
        .map_err(ManagerError::new("subscribe to systemd"))?;
    Ok(Subscribed::Systemd(Box::new(Subscription {
        systemd,
        manager_pid,
        units,
        manager,
        owner,
    })))
}

/// What the bus daemon says of the connection `unique` (`GetConnectionCredentials`).
async fn owner_credentials(conn: &Connection, unique: &str) -> Result<Credentials, ManagerError> {
    let what = format!("ask the bus who {unique}, owning {SYSTEMD}, is");
    let reply = conn
        .call_method(
            Some(BUS_DAEMON),
            BUS_DAEMON_PATH,
            Some(BUS_DAEMON),
            "GetConnectionCredentials",
            &(unique,),
        )
        .await
        .map_err(ManagerError::new(what.clone()))?;
    let credentials: HashMap<String, OwnedVariant> = reply
        .body()
        .deserialize()
        .map_err(ManagerError::new(what.clone()))?;
    let number = |key: &str| {
        credentials
            .get(key)
            .and_then(|value| u32::try_from(value).ok())
            .ok_or_else(|| {
                ManagerError::new(what.clone())(zbus::Error::Failure(format!(
                    "the bus daemon did not say its {key}"
                )))
            })
    };
    Ok(Credentials {
        pid: number("ProcessID")?,
        uid: number("UnixUserID")?,
    })
}

/// What `/proc` says of process `pid`; what cannot be read is unknown (never systemd).
fn process_view(pid: u32) -> ProcessView {
    let read = |file: &str| std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok();
    ProcessView {
        comm: read("comm").map(|comm| comm.trim_end_matches('\n').to_owned()),
        cgroup: read("cgroup").and_then(|text| cgroup_v2_path(&text).map(str::to_owned)),
    }
}

/// Adds the match rule `rule` and returns the stream of what it matches, with a queue of
/// `queue` messages.
pub(super) async fn signal_stream(
    conn: &Connection,
    rule: zbus::match_rule::Builder<'_>,
    queue: usize,
    what: &str,
) -> Result<MessageStream, ManagerError> {
    let rule = rule
        .build()
        .map(|rule| rule.to_owned())
        .map_err(ManagerError::new(format!("build {what}")))?;
    MessageStream::for_match_rule(rule, conn, NonZeroUsize::new(queue))
        .await
        .map_err(ManagerError::new(format!("add {what}")))
}

/// The unique name that owns `org.freedesktop.systemd1`, waiting for one if nobody does yet:
/// a user manager joins its session bus only once the bus has been socket-activated, which may
/// be by this very connection.
async fn systemd_owner(conn: &Connection) -> Result<(String, MessageStream), ManagerError> {
    let fail = ManagerError::new("find systemd on the bus");
    // The match comes before the question, so an owner that appears in between is not missed.
    let rule = MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .sender("org.freedesktop.DBus")
        .interface("org.freedesktop.DBus")
        .member("NameOwnerChanged")
        .add_arg(SYSTEMD);
    let mut changes = signal_stream(conn, rule, OWNER_QUEUE, "the name owner match rule").await?;
    let reply = conn
        .call_method(
            Some("org.freedesktop.DBus"),
            "/org/freedesktop/DBus",
            Some("org.freedesktop.DBus"),
            "GetNameOwner",
            &(SYSTEMD,),
        )
        .await;
    match reply {
        Ok(reply) => {
            let owner = reply.body().deserialize::<String>().map_err(fail)?;
            return Ok((owner, changes));
        }
        Err(zbus::Error::FDO(e)) if matches!(*e, zbus::fdo::Error::NameHasNoOwner(_)) => {}
        Err(e) => return Err(fail(e)),
    }
    log::info!("waiting for {SYSTEMD} to appear on the bus");
    while let Some(change) =
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut changes).poll_next(cx)).await
    {
        let change = change.map_err(ManagerError::new("find systemd on the bus"))?;
        let (_, _, new_owner): (String, String, String) = change
            .body()
            .deserialize()
            .map_err(ManagerError::new("find systemd on the bus"))?;
        if !new_owner.is_empty() {
            return Ok((new_owner, changes));
        }
    }
    Err(fail(zbus::Error::Failure(
        "the bus connection closed".into(),
    )))
}

pub(super) async fn call_manager<B>(
    conn: &Connection,
    systemd: &str,
    method: &str,
    body: &B,
) -> zbus::Result<Message>
where
    B: serde::Serialize + zbus::DynamicType,
{
    conn.call_method(
        Some(systemd),
        MANAGER_PATH,
        Some(MANAGER_INTERFACE),
        method,
        body,
    )
    .await
}

/// Asks `systemd` (a bus name) to stop `unit`, replacing any queued job. A unit systemd does
/// not have is already stopped.
pub(crate) async fn stop_unit(
    conn: &Connection,
    systemd: &str,
    unit: &str,
) -> Result<(), ManagerError> {
    match call_manager(conn, systemd, "StopUnit", &(unit, "replace")).await {
        Ok(_) => Ok(()),
        Err(zbus::Error::MethodError(name, _, _)) if name.as_str() == NO_SUCH_UNIT => Ok(()),
        Err(e) => Err(ManagerError::new(format!("stop {unit}"))(e)),
    }
}

/// The interface of a scope unit, whose `ControlGroup` the manager's own unit has.
const SCOPE_INTERFACE: &str = "org.freedesktop.systemd1.Scope";

/// systemd's own process, and the control group systemd says it is in.
#[derive(Debug)]
pub(crate) struct ManagerProcess {
    /// systemd's pid, as the bus daemon's credentials of its connection gave it (verified).
    pub pid: u32,
    /// The ControlGroup of the unit systemd answers for that pid: `init.scope`, since systemd's
    /// `manager_get_unit_by_pid` (`src/core/cgroup.c`) answers with it for its own pid, and
    /// `manager_setup_cgroup` puts the manager there.
    pub control_group: String,
}

/// Asks where systemd's own process `pid` (verified from the bus daemon's credentials when the
/// owner of its name was checked) is: the ControlGroup of the unit systemd says holds that pid
/// (`GetUnitByPID`).
pub(crate) async fn manager_process(
    conn: &Connection,
    systemd: &str,
    pid: u32,
) -> Result<ManagerProcess, ManagerError> {
    let what = || format!("ask systemd for the unit of its own pid {pid}");
    let unit = call_manager(conn, systemd, "GetUnitByPID", &(pid,))
        .await
        .map_err(ManagerError::new(what()))?
        .body()
        .deserialize::<zbus::OwnedObjectPath>()
        .map_err(ManagerError::new(what()))?;
    let what = || format!("ask systemd for the ControlGroup of {}", unit.as_str());
    let reply = conn
        .call_method(
            Some(systemd),
            &unit,
            Some(PROPERTIES),
            "Get",
            &(SCOPE_INTERFACE, "ControlGroup"),
        )
        .await
        .map_err(ManagerError::new(what()))?;
    let control_group = reply
        .body()
        .deserialize::<zbus::OwnedVariant>()
        .and_then(String::try_from)
        .map_err(ManagerError::new(what()))?;
    Ok(ManagerProcess { pid, control_group })
}

/// Starts a transient service `unit` running `argv` (the benchmark's units), like
/// `systemd-run --unit=UNIT ARGV...`.
#[cfg(feature = "bench")]
pub(crate) async fn start_transient_service(
    conn: &Connection,
    unit: &str,
    argv: &[&str],
) -> Result<(), ManagerError> {
    let Some(program) = argv.first() else {
        return Err(ManagerError::new(format!("start {unit}"))(
            zbus::Error::Failure("an empty command line".into()),
        ));
    };
    let properties = [
        ("Description", owned_variant("exitproof benchmark unit")),
        ("ExecStart", owned_variant(exec_start(program, argv))),
    ]
    .into_iter()
    .map(|(name, value)| value.map(|value| (name.to_owned(), value)))
    .collect::<zbus::Result<_>>()
    .map_err(ManagerError::new(format!("start {unit}")))?;
    start_transient_unit(conn, SYSTEMD, unit, properties)
        .await
        .map(|_| ())
}

// For `exitproof run` and the benchmark's units.
#[cfg(any(feature = "cli", feature = "bench"))]
/// The value of a transient service's `ExecStart`: `program` (an absolute path) run with
/// `argv` (its first element the process's name), its failure not ignored.
pub(crate) fn exec_start<S: AsRef<str>>(
    program: &str,
    argv: &[S],
) -> Vec<(String, Vec<String>, bool)> {
    let argv = argv.iter().map(|a| a.as_ref().to_owned()).collect();
    vec![(program.to_owned(), argv, false)]
}

// For `exitproof run` and the benchmark's units.
#[cfg(any(feature = "cli", feature = "bench"))]
/// A property value as `StartTransientUnit` takes it.
pub(crate) fn owned_variant<'a>(
    value: impl Into<zbus::Variant<'a>>,
) -> zbus::Result<zbus::OwnedVariant> {
    zbus::OwnedVariant::try_from(value.into())
}

// For `exitproof run` and the benchmark's units.
#[cfg(any(feature = "cli", feature = "bench"))]
/// Starts the transient unit `unit` with `properties` (`StartTransientUnit`, mode `fail`) from
/// `systemd` (a bus name); returns the start job's object path, which `JobRemoved` names.
pub(crate) async fn start_transient_unit(
    conn: &Connection,
    systemd: &str,
    unit: &str,
    properties: Vec<(String, zbus::OwnedVariant)>,
) -> Result<zbus::OwnedObjectPath, ManagerError> {
    let what = || format!("start {unit}");
    let aux: Vec<(&str, Vec<(&str, zbus::OwnedVariant)>)> = Vec::new();
    let reply = call_manager(
        conn,
        systemd,
        "StartTransientUnit",
        &(unit, "fail", properties, aux),
    )
    .await
    .map_err(ManagerError::new(what()))?;
    reply
        .body()
        .deserialize::<zbus::OwnedObjectPath>()
        .map_err(ManagerError::new(what()))
}

//! Reading one unit's state from systemd: `GetUnit`, then each property the agent uses with
//! its own `Get`, between two reads of InvocationID (or `GetAll` when the unit keeps beginning
//! another invocation while it is read).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use zbus::{Connection, OwnedObjectPath, OwnedVariant};

use super::manager::{ManagerError, NO_SUCH_UNIT, PROPERTIES, call_manager};
use super::signal::{SERVICE_INTERFACE, UNIT_INTERFACE, unit_change};

/// What one read of a unit showed, with the serial number of the reply it came from, so the
/// agent can order it against signals from the same sender.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UnitSnapshot {
    pub serial: u32,
    pub loaded: bool,
    /// The unit's own name (its `Id`): for an alias, the name systemd signals it under.
    pub id: String,
    /// The unit's object path, which its PropertiesChanged signals carry.
    pub path: String,
    pub active_state: String,
    pub sub_state: String,
    pub invocation: String,
    /// The cgroup as systemd reports it (`/app.slice/x.service`); empty once it is gone.
    pub control_group: String,
    /// The service's exit status (Result, ExecMainCode, ExecMainStatus) and the serial of the
    /// reply it came from; `None` for a unit that is not a loaded service.
    pub exit: Option<(ServiceExit, u32)>,
    /// What tells the current invocation's processes from earlier ones'.
    pub current: CurrentInvocation,
}

/// When the unit's current invocation began and which processes are its roots: with a stamp
/// (serial) each, as they come in different replies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CurrentInvocation {
    /// InactiveExitTimestampMonotonic in microseconds (0: never left inactive).
    pub inactive_exit_us: Option<u64>,
    /// MainPID and ControlPID (0: none), and the serial of the reply they came in.
    pub pids: Option<((u32, u32), u32)>,
}

/// How a service's main process ended, as systemd reports it (tenants cannot forge it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ServiceExit {
    pub result: Option<String>,
    pub exec_main_code: Option<i32>,
    pub exec_main_status: Option<i32>,
}

/// How many times a read asks for the unit's properties one by one before it asks with
/// `GetAll`, when each time the unit began another invocation while it was read.
pub(crate) const PROPERTY_READ_ATTEMPTS: u32 = 3;

/// The `Unit` properties a read asks for one by one (besides InvocationID, which comes first
/// and last).
pub(crate) const UNIT_PROPERTIES: [&str; 4] = [
    "Id",
    "ActiveState",
    "SubState",
    "InactiveExitTimestampMonotonic",
];

/// The `Service` properties a read of a service asks for one by one.
pub(crate) const SERVICE_PROPERTIES: [&str; 6] = [
    "ControlGroup",
    "Result",
    "ExecMainCode",
    "ExecMainStatus",
    "MainPID",
    "ControlPID",
];

/// Reads the state of `unit` from `systemd`: `GetUnit` (an unloaded unit is inactive with no
/// invocation and is not loaded by asking), then the properties the agent uses.
///
/// They are asked for one by one, between two reads of InvocationID: `GetAll` of the `Unit`
/// interface costs systemd several times what the handful of `Get`s do (it computes every
/// property, `NeedDaemonReload` among them), and with thousands of units to read systemd's
/// time is what bounds how fast watches are answered. Answers to separate calls come from
/// separate moments, so they are one invocation's only if the InvocationID asked before all
/// of them is still the one asked after: IDs are never reused, so no other invocation began
/// in between. The read is then stamped with the first answer's serial, so any signal sent
/// after it still wins (see `UnitFacts`). If another invocation began meanwhile, the read is
/// asked again, and after [`PROPERTY_READ_ATTEMPTS`] with `GetAll`, whose answers are each
/// one moment's.
///
/// `systemd` is the bus name asked: the agent names the unique name whose signals it orders
/// reads against, so a reply can never come from another systemd (one re-executed meanwhile,
/// whose serials started again), only fail.
pub(crate) async fn read_unit(
    conn: &Connection,
    systemd: &str,
    unit: &str,
) -> Result<UnitSnapshot, ManagerError> {
    let what = || format!("read {unit}");
    let path = match call_manager(conn, systemd, "GetUnit", &(unit,)).await {
        Ok(reply) => reply
            .body()
            .deserialize::<OwnedObjectPath>()
            .map_err(ManagerError::new(what()))?,
        Err(zbus::Error::MethodError(name, _, reply)) if name.as_str() == NO_SUCH_UNIT => {
            return Ok(UnitSnapshot {
                serial: reply.primary_header().serial_num().get(),
                loaded: false,
                id: unit.to_owned(),
                path: crate::systemd::signal::unit_path(unit),
                active_state: "inactive".into(),
                sub_state: "dead".into(),
                invocation: String::new(),
                control_group: String::new(),
                exit: None,
                current: CurrentInvocation::default(),
            });
        }
        Err(e) => return Err(ManagerError::new(what())(e)),
    };
    for _ in 0..PROPERTY_READ_ATTEMPTS {
        if let Some(snapshot) = read_properties(conn, systemd, unit, &path).await? {
            return Ok(snapshot);
        }
    }
    log::debug!("{unit} began another invocation during each read; reading it with GetAll");
    read_all_properties(conn, systemd, unit, &path).await
}

/// One read property by property; `None` if the unit began another invocation meanwhile.
async fn read_properties(
    conn: &Connection,
    systemd: &str,
    unit: &str,
    path: &OwnedObjectPath,
) -> Result<Option<UnitSnapshot>, ManagerError> {
    let what = || format!("read {unit}");
    let interface = cgroup_interface(unit);
    let extra: &[&str] = match interface {
        Some(SERVICE_INTERFACE) => &SERVICE_PROPERTIES,
        Some(_) => &["ControlGroup"],
        None => &[],
    };
    let asked: Vec<(&str, &str)> = UNIT_PROPERTIES
        .iter()
        .map(|name| (UNIT_INTERFACE, *name))
        .chain(
            extra
                .iter()
                .map(|name| (interface.unwrap_or_default(), *name)),
        )
        .collect();
    let (before, serial) = get(conn, systemd, path, UNIT_INTERFACE, "InvocationID")
        .await
        .map_err(ManagerError::new(what()))?;
    let answers = join_all(
        asked
            .iter()
            .map(|(interface, name)| get(conn, systemd, path, interface, name))
            .collect(),
    )
    .await;
    let (after, _) = get(conn, systemd, path, UNIT_INTERFACE, "InvocationID")
        .await
        .map_err(ManagerError::new(what()))?;
    if before != after {
        return Ok(None);
    }
    let mut unit_properties = HashMap::from([("InvocationID".to_owned(), before)]);
    let mut other_properties = HashMap::new();
    for ((interface, name), answer) in asked.into_iter().zip(answers) {
        let (value, _) = answer.map_err(ManagerError::new(what()))?;
        let properties = if interface == UNIT_INTERFACE {
            &mut unit_properties
        } else {
            &mut other_properties
        };
        properties.insert(name.to_owned(), value);
    }
    let (service, control_group) = match interface {
        Some(SERVICE_INTERFACE) => (Some((other_properties, serial)), None),
        _ => (None, Some(take_control_group(&mut other_properties, unit)?)),
    };
    snapshot_of(
        unit,
        path,
        (unit_properties, serial),
        service,
        control_group,
    )
    .map(Some)
}

/// One read with `GetAll` of each interface: every answer is one moment's.
async fn read_all_properties(
    conn: &Connection,
    systemd: &str,
    unit: &str,
    path: &OwnedObjectPath,
) -> Result<UnitSnapshot, ManagerError> {
    let what = || format!("read {unit}");
    let unit_properties = get_all(conn, systemd, path, UNIT_INTERFACE)
        .await
        .map_err(ManagerError::new(what()))?;
    let (service, control_group) = match cgroup_interface(unit) {
        // One GetAll of a service carries its cgroup, its exit status and its pids.
        Some(SERVICE_INTERFACE) => {
            let service = get_all(conn, systemd, path, SERVICE_INTERFACE)
                .await
                .map_err(ManagerError::new(what()))?;
            (Some(service), None)
        }
        Some(interface) => {
            let (value, _) = get(conn, systemd, path, interface, "ControlGroup")
                .await
                .map_err(ManagerError::new(what()))?;
            let mut properties = HashMap::from([("ControlGroup".to_owned(), value)]);
            (None, Some(take_control_group(&mut properties, unit)?))
        }
        None => (None, Some(String::new())),
    };
    snapshot_of(unit, path, unit_properties, service, control_group)
}

/// The snapshot made of the `Unit` properties and, for a service, the `Service` properties
/// (which carry its cgroup), each with the serial they are stamped with; `control_group` is
/// the cgroup of a unit that is not a service.
fn snapshot_of(
    unit: &str,
    path: &OwnedObjectPath,
    (mut unit_properties, serial): (HashMap<String, OwnedVariant>, u32),
    service: Option<(HashMap<String, OwnedVariant>, u32)>,
    control_group: Option<String>,
) -> Result<UnitSnapshot, ManagerError> {
    let what = || format!("read {unit}");
    // An alias answers with the real unit's path; its `Id` is the name signals carry.
    let id = unit_properties
        .remove("Id")
        .map(String::try_from)
        .transpose()
        .map_err(ManagerError::new(what()))?
        .unwrap_or_else(|| unit.to_owned());
    let change = unit_change(unit_properties, &[]).map_err(ManagerError::new(what()))?;
    let (control_group, exit, pids) = match service {
        Some((mut properties, exit_serial)) => {
            let control_group = take_control_group(&mut properties, unit)?;
            let service = unit_change(properties, &[]).map_err(ManagerError::new(what()))?;
            let exit = ServiceExit {
                result: service.result,
                exec_main_code: service.exec_main_code,
                exec_main_status: service.exec_main_status,
            };
            let pids = (
                service.main_pid.unwrap_or(0),
                service.control_pid.unwrap_or(0),
            );
            (
                control_group,
                Some((exit, exit_serial)),
                Some((pids, exit_serial)),
            )
        }
        None => (control_group.unwrap_or_default(), None, None),
    };
    Ok(UnitSnapshot {
        serial,
        loaded: true,
        id,
        path: path.to_string(),
        active_state: change.active_state.unwrap_or_default(),
        sub_state: change.sub_state.unwrap_or_default(),
        invocation: change.invocation.unwrap_or_default(),
        control_group,
        exit,
        current: CurrentInvocation {
            inactive_exit_us: change.inactive_exit_us,
            pids,
        },
    })
}

/// Every property of `interface` on the object `path`, with the serial of the reply.
async fn get_all(
    conn: &Connection,
    systemd: &str,
    path: &OwnedObjectPath,
    interface: &str,
) -> zbus::Result<(HashMap<String, OwnedVariant>, u32)> {
    let reply = conn
        .call_method(
            Some(systemd),
            path,
            Some(PROPERTIES),
            "GetAll",
            &(interface,),
        )
        .await?;
    let serial = reply.primary_header().serial_num().get();
    Ok((reply.body().deserialize()?, serial))
}

/// The interface that carries ControlGroup for a unit of this type, if it has a cgroup.
fn cgroup_interface(unit: &str) -> Option<&'static str> {
    let suffix = unit.rsplit_once('.')?.1;
    Some(match suffix {
        "service" => SERVICE_INTERFACE,
        "scope" => "org.freedesktop.systemd1.Scope",
        "slice" => "org.freedesktop.systemd1.Slice",
        "socket" => "org.freedesktop.systemd1.Socket",
        "mount" => "org.freedesktop.systemd1.Mount",
        "swap" => "org.freedesktop.systemd1.Swap",
        _ => return None,
    })
}

/// One property of `interface` on the object `path`, with the serial of the reply.
async fn get(
    conn: &Connection,
    systemd: &str,
    path: &OwnedObjectPath,
    interface: &str,
    name: &str,
) -> zbus::Result<(OwnedVariant, u32)> {
    let reply = conn
        .call_method(
            Some(systemd),
            path,
            Some(PROPERTIES),
            "Get",
            &(interface, name),
        )
        .await?;
    let serial = reply.primary_header().serial_num().get();
    Ok((reply.body().deserialize()?, serial))
}

/// Takes the unit's ControlGroup out of `properties` (empty if it has none); systemd never
/// signals it.
fn take_control_group(
    properties: &mut HashMap<String, OwnedVariant>,
    unit: &str,
) -> Result<String, ManagerError> {
    properties
        .remove("ControlGroup")
        .map(String::try_from)
        .transpose()
        .map(Option::unwrap_or_default)
        .map_err(ManagerError::new(format!("read the cgroup of {unit}")))
}

/// A future of `join_all` and its output once it is ready.
type Running<F> = (Pin<Box<F>>, Option<<F as Future>::Output>);

/// Runs `futures` together, each first polled in order (so calls are sent in order), and
/// gives their outputs in the same order.
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut running: Vec<Running<F>> = futures
        .into_iter()
        .map(|future| (Box::pin(future), None))
        .collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in &mut running {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    running
        .into_iter()
        .filter_map(|(_, output)| output)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::cgroup_interface;

    #[test]
    fn the_cgroup_interface_follows_the_unit_type() {
        for (unit, iface) in [
            ("a.service", Some("org.freedesktop.systemd1.Service")),
            ("a.scope", Some("org.freedesktop.systemd1.Scope")),
            ("a.b.slice", Some("org.freedesktop.systemd1.Slice")),
            ("a.target", None),
            ("a.timer", None),
            ("noext", None),
        ] {
            assert_eq!(cgroup_interface(unit), iface, "{unit}");
        }
    }
}

//! Reading one unit's state from systemd: `GetUnit`, then each property the agent uses with
//! its own `Get`, between two reads of InvocationID (or `GetAll` when the unit keeps beginning
//! another invocation while it is read).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use zbus::{Connection, OwnedObjectPath, OwnedVariant};

use super::manager::{
    ManagerError, NO_SUCH_UNIT, NO_UNIT_FOR_INVOCATION_ID, PROPERTIES, call_manager,
};
use super::signal::{SERVICE_INTERFACE, UNIT_INTERFACE, hex, unit_path};
use super::snapshot::{
    self, Attempt, InvocationAnswer, Property, PropertyAnswers, ReadKind, SERVICE_PROPERTIES,
    UNIT_PROPERTIES, UnitSnapshot, cgroup_interface, properties_asked,
};

/// Reads the state of `unit` from `systemd`: `GetUnit` (an unloaded unit is inactive with no
/// invocation and is not loaded by asking), or for [`ReadKind::Load`] `LoadUnit` and LoadState
/// besides, then the properties the agent uses.
///
/// They are asked for one by one, between two reads of InvocationID: `GetAll` of the `Unit`
/// interface costs systemd several times what the handful of `Get`s do (it computes every
/// property, `NeedDaemonReload` among them), and with thousands of units to read systemd's
/// time is what bounds how fast watches are answered. Answers to separate calls come from
/// separate moments, so they are one invocation's only if the InvocationID asked before all
/// of them is still the one asked after; if another invocation began meanwhile, the read is
/// asked again, and after [`PROPERTY_READ_ATTEMPTS`](snapshot::PROPERTY_READ_ATTEMPTS) with
/// `GetAll`, whose answers are each one moment's. What the answers make, and when to ask
/// again, is `snapshot`'s rule (pure, and the simulator's too).
///
/// `systemd` is the bus name asked: the agent names the unique name whose signals it orders
/// reads against, so a reply can never come from another systemd (one re-executed meanwhile,
/// whose serials started again), only fail.
///
/// `ours`, the invocation the watch is of (its text), if known: when no unit is loaded by the
/// name, the unit running it is read (`GetUnitByInvocationID`, which finds a loaded unit by
/// its current invocation). A name systemd no longer resolves (an alias taken away) says
/// nothing of the unit that runs ours; only when no loaded unit has it is it not loaded.
pub(crate) async fn read_unit(
    conn: &Connection,
    systemd: &str,
    unit: &str,
    kind: ReadKind,
    ours: Option<&str>,
) -> Result<UnitSnapshot, ManagerError> {
    let what = || format!("read {unit}");
    let method = match kind {
        ReadKind::Get => "GetUnit",
        // systemd's `method_load_unit` answers for any valid name, with a unit object whose
        // LoadState says whether a unit file was found (`manager_load_unit`).
        ReadKind::Load => "LoadUnit",
    };
    let path = match call_manager(conn, systemd, method, &(unit,)).await {
        Ok(reply) => reply
            .body()
            .deserialize::<OwnedObjectPath>()
            .map_err(ManagerError::new(what()))?,
        Err(zbus::Error::MethodError(name, _, reply)) if name.as_str() == NO_SUCH_UNIT => {
            let serial = reply.primary_header().serial_num().get();
            let by_invocation = match ours.and_then(invocation_bytes) {
                Some(id) => unit_running(conn, systemd, id, serial)
                    .await
                    .map_err(ManagerError::new(what()))?,
                None => Err(serial),
            };
            match by_invocation {
                Ok(path) => path,
                Err(serial) => return Ok(snapshot::not_loaded(unit, &unit_path(unit), serial)),
            }
        }
        Err(e) => return Err(ManagerError::new(what())(e)),
    };
    let mut attempt = Attempt::FIRST;
    while attempt.by_property() {
        if let Some(snapshot) = read_properties(conn, systemd, unit, &path, kind).await? {
            return Ok(snapshot);
        }
        attempt = attempt.next();
    }
    log::debug!("{unit} began another invocation during each read; reading it with GetAll");
    read_all_properties(conn, systemd, unit, &path, kind).await
}

/// The object path of the loaded unit whose current invocation is `id`, or the serial of
/// systemd's answer that none is (`method_get_unit_by_invocation_id`). A systemd older than
/// the method (238) cannot say: the name's answer, of serial `unloaded`, stands, as before the
/// method was asked. zbus hands the bus's own errors (UnknownMethod) over as `fdo::Error`,
/// without the reply.
async fn unit_running(
    conn: &Connection,
    systemd: &str,
    id: Vec<u8>,
    unloaded: u32,
) -> zbus::Result<Result<OwnedObjectPath, u32>> {
    match call_manager(conn, systemd, "GetUnitByInvocationID", &(id,)).await {
        Ok(reply) => Ok(Ok(reply.body().deserialize::<OwnedObjectPath>()?)),
        Err(zbus::Error::MethodError(name, _, reply))
            if [NO_UNIT_FOR_INVOCATION_ID, NO_SUCH_UNIT].contains(&name.as_str()) =>
        {
            Ok(Err(reply.primary_header().serial_num().get()))
        }
        Err(zbus::Error::FDO(e)) if matches!(*e, zbus::fdo::Error::UnknownMethod(_)) => {
            Ok(Err(unloaded))
        }
        Err(e) => Err(e),
    }
}

/// The 16 bytes of an invocation ID written as 32 hex digits (systemd's `sd_id128_t`).
fn invocation_bytes(text: &str) -> Option<Vec<u8>> {
    if text.len() != 32 {
        return None;
    }
    (0..16)
        .map(|i| u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// One read property by property; `None` if the unit began another invocation meanwhile.
async fn read_properties(
    conn: &Connection,
    systemd: &str,
    unit: &str,
    path: &OwnedObjectPath,
    kind: ReadKind,
) -> Result<Option<UnitSnapshot>, ManagerError> {
    let what = || format!("read {unit}");
    let asked = properties_asked(unit, kind);
    let before = get_invocation(conn, systemd, path)
        .await
        .map_err(ManagerError::new(what()))?;
    let answers = join_all(
        asked
            .iter()
            .map(|(interface, name)| get_property(conn, systemd, path, interface, name))
            .collect(),
    )
    .await;
    let after = get_invocation(conn, systemd, path)
        .await
        .map_err(ManagerError::new(what()))?;
    let answers = PropertyAnswers {
        before,
        properties: answers,
        after,
    };
    snapshot::by_property(unit, path.as_str(), answers).map_err(ManagerError::new(what()))
}

/// One read with `GetAll` of each interface: every answer is one moment's.
async fn read_all_properties(
    conn: &Connection,
    systemd: &str,
    unit: &str,
    path: &OwnedObjectPath,
    kind: ReadKind,
) -> Result<UnitSnapshot, ManagerError> {
    let what = || format!("read {unit}");
    let load_state: &[&str] = match kind {
        ReadKind::Get => &[],
        ReadKind::Load => &["LoadState"],
    };
    let (mut unit_properties, serial) = get_all(conn, systemd, path, UNIT_INTERFACE)
        .await
        .map_err(ManagerError::new(what()))?;
    let mut properties = take_properties(
        &mut unit_properties,
        std::iter::once("InvocationID")
            .chain(UNIT_PROPERTIES)
            .chain(load_state.iter().copied()),
    )
    .map_err(ManagerError::new(what()))?;
    let service = match cgroup_interface(unit) {
        // One GetAll of a service carries its cgroup, its exit status and its pids.
        Some(SERVICE_INTERFACE) => {
            let (mut service, service_serial) = get_all(conn, systemd, path, SERVICE_INTERFACE)
                .await
                .map_err(ManagerError::new(what()))?;
            properties.extend(
                take_properties(&mut service, SERVICE_PROPERTIES)
                    .map_err(ManagerError::new(what()))?,
            );
            Some(service_serial)
        }
        Some(interface) => {
            let control_group = get_property(conn, systemd, path, interface, "ControlGroup")
                .await
                .map_err(ManagerError::new(what()))?;
            properties.push(control_group);
            None
        }
        None => None,
    };
    Ok(snapshot::snapshot(
        unit,
        path.as_str(),
        serial,
        properties,
        service,
    ))
}

/// The properties named `names` that `answered` holds, decoded.
fn take_properties<'a>(
    answered: &mut HashMap<String, OwnedVariant>,
    names: impl IntoIterator<Item = &'a str>,
) -> zbus::Result<Vec<Property>> {
    names
        .into_iter()
        .filter_map(|name| answered.remove(name).map(|value| decode(name, value)))
        .collect()
}

/// Property `name` as systemd answered it, in the type the agent takes it as; a wrong type
/// is an error.
fn decode(name: &str, value: OwnedVariant) -> zbus::Result<Property> {
    Ok(match name {
        "InvocationID" => Property::InvocationId(hex(&Vec::<u8>::try_from(value)?)),
        "Id" => Property::Id(value.try_into()?),
        "ActiveState" => Property::ActiveState(value.try_into()?),
        "SubState" => Property::SubState(value.try_into()?),
        "InactiveExitTimestampMonotonic" => Property::InactiveExitUs(value.try_into()?),
        "ControlGroup" => Property::ControlGroup(value.try_into()?),
        "Result" => Property::Result(value.try_into()?),
        "ExecMainCode" => Property::ExecMainCode(value.try_into()?),
        "ExecMainStatus" => Property::ExecMainStatus(value.try_into()?),
        "MainPID" => Property::MainPid(value.try_into()?),
        "ControlPID" => Property::ControlPid(value.try_into()?),
        "LoadState" => Property::LoadState(value.try_into()?),
        other => {
            return Err(zbus::Error::Failure(format!(
                "the agent does not read the property {other}"
            )));
        }
    })
}

/// The unit's InvocationID, with the serial of the reply.
async fn get_invocation(
    conn: &Connection,
    systemd: &str,
    path: &OwnedObjectPath,
) -> zbus::Result<InvocationAnswer> {
    let (value, serial) = get(conn, systemd, path, UNIT_INTERFACE, "InvocationID").await?;
    let id = hex(&Vec::<u8>::try_from(value)?);
    Ok(InvocationAnswer { id, serial })
}

/// Property `name` of `interface` on the object `path`, decoded.
async fn get_property(
    conn: &Connection,
    systemd: &str,
    path: &OwnedObjectPath,
    interface: &str,
    name: &str,
) -> zbus::Result<Property> {
    let (value, _) = get(conn, systemd, path, interface, name).await?;
    decode(name, value)
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
    use futures_util::StreamExt;
    use zbus::message::Type;
    use zbus::runtime::traits::TaskHandle as _;

    use super::*;
    use crate::systemd::runtime::{MioRuntime, peer_to_peer};

    const OURS: &str = "00ff10a0b1c2d3e4f5060708090a0b0c";

    /// Reads `nick.service` for a watch of [`OURS`] from a fake manager over a peer-to-peer
    /// connection: it answers `GetUnit` that no such unit is loaded, and
    /// `GetUnitByInvocationID` with the error `by_invocation`.
    fn read_where_no_unit_is_loaded(by_invocation: &'static str) -> Result<UnitSnapshot, String> {
        let mut poll = mio::Poll::new().expect("a poll");
        let runtime = MioRuntime::new(poll.registry(), mio::Token(0), 100..200).expect("a runtime");
        let (server, client) = peer_to_peer(&mut poll, &runtime);
        let mut calls = zbus::MessageStream::from(&server);
        runtime
            .spawn(async move {
                while let Some(Ok(call)) = calls.next().await {
                    if call.message_type() != Type::MethodCall {
                        continue;
                    }
                    let header = call.header();
                    let error = match header.member().map(|m| m.as_str()) {
                        Some("GetUnit") => NO_SUCH_UNIT,
                        _ => by_invocation,
                    };
                    let sent = server.reply_error(&header, error, &("a fake",)).await;
                    sent.expect("a reply sent");
                }
            })
            .detach();
        let read = read_unit(&client, SYSTEMD, "nick.service", ReadKind::Get, Some(OURS));
        runtime
            .block_on(&mut poll, read)
            .expect("the poll waits")
            .map_err(|e| e.to_string())
    }

    const SYSTEMD: &str = "org.freedesktop.systemd1";

    /// With no unit loaded by the name, the answer is "not loaded" only when systemd says no
    /// loaded unit has the watch's invocation, or cannot say (older than the method): any other
    /// error fails the read, which is made again, rather than prove a unit that may run.
    #[test]
    fn no_unit_by_the_name_is_not_loaded_only_if_none_runs_ours_or_systemd_cannot_tell() {
        let unknown_method = "org.freedesktop.DBus.Error.UnknownMethod";
        for by_invocation in [NO_UNIT_FOR_INVOCATION_ID, unknown_method] {
            let read = read_where_no_unit_is_loaded(by_invocation).expect("a read");
            assert!(!read.loaded, "{by_invocation}: {read:?}");
            assert_eq!(read.invocation, "", "{by_invocation}");
        }
        let refused = read_where_no_unit_is_loaded("org.freedesktop.DBus.Error.AccessDenied");
        assert!(refused.is_err(), "{refused:?}");
    }

    /// The text of an invocation ID back to the 16 bytes `GetUnitByInvocationID` takes, and
    /// anything else (a wrong length, not hex) to none.
    #[test]
    fn an_invocation_id_is_32_hex_digits_of_16_bytes() {
        let text = "00ff10a0b1c2d3e4f5060708090a0b0c";
        let bytes = invocation_bytes(text).expect("an invocation ID");
        assert_eq!(bytes.len(), 16);
        assert_eq!(hex(&bytes), text);
        for bad in [
            "",
            "00ff",
            "00ff10a0b1c2d3e4f5060708090a0b0",
            "zzff10a0b1c2d3e4f5060708090a0b0c",
        ] {
            assert_eq!(invocation_bytes(bad), None, "{bad:?}");
        }
        // 32 bytes, but not 32 digits.
        let not_ascii = format!("é{}", &text[2..]);
        assert_eq!(not_ascii.len(), 32);
        assert_eq!(invocation_bytes(&not_ascii), None);
    }
}

//! Decoding systemd's D-Bus signals into the facts the agent uses.
//!
//! Pure: a [`Message`] in, a [`SystemdSignal`] out. Nothing here decides anything; a signal is
//! a hint carrying values, and the agent orders it against replies by serial number.

use std::collections::HashMap;

use zbus::message::Type as MessageType;
use zbus::{Message, OwnedObjectPath, OwnedVariant};

/// The interface of every unit object, which carries ActiveState, SubState and InvocationID.
pub(crate) const UNIT_INTERFACE: &str = "org.freedesktop.systemd1.Unit";
/// The interface of service units, which carries Result, ExecMainCode and ExecMainStatus.
pub(crate) const SERVICE_INTERFACE: &str = "org.freedesktop.systemd1.Service";
/// The manager's interface, which carries UnitNew, UnitRemoved and Reloading.
pub(crate) const MANAGER_INTERFACE: &str = "org.freedesktop.systemd1.Manager";
/// Where systemd puts its unit objects.
pub(crate) const UNIT_PATH_PREFIX: &str = "/org/freedesktop/systemd1/unit";

/// The properties of a unit that changed, as one PropertiesChanged signal carried them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct UnitChange {
    pub active_state: Option<String>,
    pub sub_state: Option<String>,
    /// InvocationID as lowercase hex; empty when the unit has none.
    pub invocation: Option<String>,
    /// The service's Result (`success`, `exit-code`, `signal`, ...).
    pub result: Option<String>,
    /// ExecMainCode: how the main process ended (CLD_EXITED 1, CLD_KILLED 2, CLD_DUMPED 3).
    pub exec_main_code: Option<i32>,
    /// ExecMainStatus: the exit status, or the signal number.
    pub exec_main_status: Option<i32>,
    /// InactiveExitTimestampMonotonic: when the unit's current invocation left `inactive`, in
    /// CLOCK_MONOTONIC microseconds (0: never).
    pub inactive_exit_us: Option<u64>,
    /// MainPID and ControlPID of the service (0: none): the roots of its current invocation's
    /// processes.
    pub main_pid: Option<u32>,
    pub control_pid: Option<u32>,
    /// A property we use was invalidated instead of carried: read the unit again.
    pub invalidated: bool,
}

impl UnitChange {
    /// Whether the signal says anything about the properties the proof uses.
    pub(crate) fn is_relevant(&self) -> bool {
        self.active_state.is_some()
            || self.sub_state.is_some()
            || self.invocation.is_some()
            || self.result.is_some()
            || self.exec_main_code.is_some()
            || self.exec_main_status.is_some()
            || self.inactive_exit_us.is_some()
            || self.main_pid.is_some()
            || self.control_pid.is_some()
            || self.invalidated
    }
}

/// A signal from systemd, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SystemdSignal {
    /// PropertiesChanged on a unit object's `Unit` or `Service` interface.
    UnitChanged { path: String, change: UnitChange },
    /// A unit was loaded into memory.
    UnitNew { unit: String },
    /// A unit was dropped from memory: it is inactive with no invocation.
    UnitRemoved { unit: String },
    /// systemd begins (`true`) or ends (`false`) a daemon-reload or reexec.
    Reloading(bool),
}

/// Why a message could not be decoded.
#[derive(Debug, thiserror::Error)]
#[error("decode signal {member}: {source}")]
pub(crate) struct DecodeError {
    member: String,
    source: zbus::Error,
}

/// Decodes `message`; `Ok(None)` for messages the agent has no use for.
pub(crate) fn decode(message: &Message) -> Result<Option<SystemdSignal>, DecodeError> {
    if message.message_type() != MessageType::Signal {
        return Ok(None);
    }
    let header = message.header();
    let (Some(interface), Some(member), Some(path)) =
        (header.interface(), header.member(), header.path())
    else {
        return Ok(None);
    };
    let fail = |source| DecodeError {
        member: member.to_string(),
        source,
    };
    match (interface.as_str(), member.as_str()) {
        ("org.freedesktop.DBus.Properties", "PropertiesChanged") => {
            let (iface, changed, invalidated): (
                String,
                HashMap<String, OwnedVariant>,
                Vec<String>,
            ) = message.body().deserialize().map_err(fail)?;
            if iface != UNIT_INTERFACE && iface != SERVICE_INTERFACE {
                return Ok(None);
            }
            let change = unit_change(changed, &invalidated).map_err(fail)?;
            Ok(change.is_relevant().then(|| SystemdSignal::UnitChanged {
                path: path.to_string(),
                change,
            }))
        }
        (MANAGER_INTERFACE, "UnitNew") => {
            let (unit, _path): (String, OwnedObjectPath) =
                message.body().deserialize().map_err(fail)?;
            Ok(Some(SystemdSignal::UnitNew { unit }))
        }
        (MANAGER_INTERFACE, "UnitRemoved") => {
            let (unit, _path): (String, OwnedObjectPath) =
                message.body().deserialize().map_err(fail)?;
            Ok(Some(SystemdSignal::UnitRemoved { unit }))
        }
        (MANAGER_INTERFACE, "Reloading") => {
            let active: bool = message.body().deserialize().map_err(fail)?;
            Ok(Some(SystemdSignal::Reloading(active)))
        }
        _ => Ok(None),
    }
}

/// Takes the properties the agent uses out of a changed dict (or a GetAll reply) of the `Unit`
/// or the `Service` interface.
pub(crate) fn unit_change(
    mut changed: HashMap<String, OwnedVariant>,
    invalidated: &[String],
) -> zbus::Result<UnitChange> {
    let active_state = take(&mut changed, "ActiveState")?;
    let sub_state = take(&mut changed, "SubState")?;
    let invocation = take::<Vec<u8>>(&mut changed, "InvocationID")?.map(|bytes| hex(&bytes));
    let result = take(&mut changed, "Result")?;
    let exec_main_code = take(&mut changed, "ExecMainCode")?;
    let exec_main_status = take(&mut changed, "ExecMainStatus")?;
    let inactive_exit_us = take(&mut changed, "InactiveExitTimestampMonotonic")?;
    let main_pid = take(&mut changed, "MainPID")?;
    let control_pid = take(&mut changed, "ControlPID")?;
    let invalidated = invalidated.iter().any(|p| {
        matches!(
            p.as_str(),
            "ActiveState"
                | "SubState"
                | "InvocationID"
                | "Result"
                | "ExecMainCode"
                | "ExecMainStatus"
        )
    });
    Ok(UnitChange {
        active_state,
        sub_state,
        invocation,
        result,
        exec_main_code,
        exec_main_status,
        inactive_exit_us,
        main_pid,
        control_pid,
        invalidated,
    })
}

/// Takes property `name` out of `changed`, converted to `T`; a wrong type is an error.
fn take<T>(changed: &mut HashMap<String, OwnedVariant>, name: &str) -> zbus::Result<Option<T>>
where
    T: TryFrom<OwnedVariant>,
    zbus::Error: From<T::Error>,
{
    changed
        .remove(name)
        .map(|v| T::try_from(v).map_err(zbus::Error::from))
        .transpose()
}

/// An InvocationID as systemd prints it: 32 lowercase hex digits, or empty for all zeroes or
/// none.
pub(crate) fn hex(bytes: &[u8]) -> String {
    if bytes.iter().all(|b| *b == 0) {
        return String::new();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The object path of a unit, as systemd escapes it (`bus_label_escape`): every byte that is
/// not an ASCII letter or digit, and a leading digit, becomes `_` and two hex digits.
pub(crate) fn unit_path(unit: &str) -> String {
    let mut path = String::with_capacity(UNIT_PATH_PREFIX.len() + 1 + unit.len() * 3);
    path.push_str(UNIT_PATH_PREFIX);
    path.push('/');
    if unit.is_empty() {
        path.push('_');
    }
    for (i, b) in unit.bytes().enumerate() {
        if b.is_ascii_alphabetic() || (b.is_ascii_digit() && i > 0) {
            path.push(char::from(b));
        } else {
            path.push_str(&format!("_{b:02x}"));
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    use zbus::Variant;

    #[test]
    fn unit_paths_are_escaped_like_systemd_does() {
        for (unit, path) in [
            ("x.service", "x_2eservice"),
            ("foo-bar@1.service", "foo_2dbar_401_2eservice"),
            ("1a.service", "_31a_2eservice"),
            ("dbus.service", "dbus_2eservice"),
            ("", "_"),
        ] {
            assert_eq!(
                unit_path(unit),
                format!("{UNIT_PATH_PREFIX}/{path}"),
                "{unit}"
            );
        }
    }

    #[test]
    fn invocation_ids_print_as_hex_and_zero_is_none() {
        assert_eq!(hex(&[0; 16]), "");
        assert_eq!(hex(&[]), "");
        assert_eq!(hex(&[0xab, 0x01]), "ab01");
    }

    fn properties_changed(
        iface: &str,
        changed: HashMap<&str, Variant<'_>>,
        invalidated: Vec<&str>,
    ) -> Message {
        Message::signal(
            "/org/freedesktop/systemd1/unit/x_2eservice",
            "org.freedesktop.DBus.Properties",
            "PropertiesChanged",
        )
        .build(&(iface, changed, invalidated))
        .expect("a message that serializes")
    }

    #[test]
    fn a_unit_properties_changed_signal_decodes() {
        let inv: Vec<u8> = (1..=16).collect();
        let changed = HashMap::from([
            ("ActiveState", Variant::from("inactive")),
            ("SubState", Variant::from("dead")),
            ("InvocationID", Variant::from(inv)),
            ("Other", Variant::from(7u32)),
        ]);
        let signal = decode(&properties_changed(UNIT_INTERFACE, changed, vec![])).unwrap();
        assert_eq!(
            signal,
            Some(SystemdSignal::UnitChanged {
                path: "/org/freedesktop/systemd1/unit/x_2eservice".into(),
                change: UnitChange {
                    active_state: Some("inactive".into()),
                    sub_state: Some("dead".into()),
                    invocation: Some("0102030405060708090a0b0c0d0e0f10".into()),
                    ..UnitChange::default()
                }
            })
        );
    }

    #[test]
    fn irrelevant_and_foreign_interface_changes_are_dropped() {
        let changed = HashMap::from([("Other", Variant::from(7u32))]);
        assert_eq!(
            decode(&properties_changed(UNIT_INTERFACE, changed, vec![])).unwrap(),
            None
        );
        let changed = HashMap::from([("ActiveState", Variant::from("active"))]);
        let socket = "org.freedesktop.systemd1.Socket";
        assert_eq!(
            decode(&properties_changed(socket, changed, vec![])).unwrap(),
            None
        );
    }

    #[test]
    fn a_service_exit_status_signal_decodes() {
        let changed = HashMap::from([
            ("Result", Variant::from("signal")),
            ("ExecMainCode", Variant::from(2i32)),
            ("ExecMainStatus", Variant::from(9i32)),
            ("ControlGroup", Variant::from("/x")),
        ]);
        let signal = decode(&properties_changed(SERVICE_INTERFACE, changed, vec![])).unwrap();
        let Some(SystemdSignal::UnitChanged { change, .. }) = signal else {
            panic!("{signal:?}");
        };
        assert_eq!(change.result.as_deref(), Some("signal"));
        assert_eq!(change.exec_main_code, Some(2));
        assert_eq!(change.exec_main_status, Some(9));
        assert_eq!(change.active_state, None);
    }

    #[test]
    fn an_invalidated_property_asks_for_a_read() {
        let signal = decode(&properties_changed(
            UNIT_INTERFACE,
            HashMap::new(),
            vec!["ActiveState"],
        ));
        let Ok(Some(SystemdSignal::UnitChanged { change, .. })) = signal else {
            panic!("{signal:?}");
        };
        assert!(change.invalidated);
    }

    #[test]
    fn a_property_of_the_wrong_type_is_an_error_not_a_panic() {
        let changed = HashMap::from([("ActiveState", Variant::from(3u32))]);
        assert!(decode(&properties_changed(UNIT_INTERFACE, changed, vec![])).is_err());
    }

    #[test]
    fn manager_signals_decode() {
        let path = "/org/freedesktop/systemd1";
        let new = Message::signal(path, MANAGER_INTERFACE, "UnitRemoved")
            .build(&("x.service", OwnedObjectPath::try_from("/a").unwrap()))
            .unwrap();
        assert_eq!(
            decode(&new).unwrap(),
            Some(SystemdSignal::UnitRemoved {
                unit: "x.service".into()
            })
        );
        let reloading = Message::signal(path, MANAGER_INTERFACE, "Reloading")
            .build(&(false,))
            .unwrap();
        assert_eq!(
            decode(&reloading).unwrap(),
            Some(SystemdSignal::Reloading(false))
        );
    }
}

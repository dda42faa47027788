//! Decoding systemd's D-Bus signals into the facts the agent uses.
//!
//! Pure: a [`Message`] in, a [`SystemdSignal`] out. Nothing here decides anything; a signal is
//! a hint carrying values, and the agent orders it against replies by serial number.

use std::collections::HashMap;

use zbus::message::{Body, Type as MessageType};
use zbus::wire::{Endian, Signature, Type, Variant};
use zbus::{Message, OwnedObjectPath};

use super::body::{BodyError, BodyReader};

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
    source: DecodeFailure,
}

/// What was wrong with a signal's body.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeFailure {
    #[error(transparent)]
    Zbus(#[from] zbus::Error),
    #[error(transparent)]
    Body(#[from] BodyError),
    #[error("a PropertiesChanged body of signature {0}, not sa{{sv}}as")]
    Signature(String),
    #[error("property {name} of type {found}, not {expected}")]
    PropertyType {
        name: String,
        found: String,
        expected: &'static str,
    },
}

/// The signature of a PropertiesChanged body: the interface, the changed properties, the
/// names of the invalidated ones.
const PROPERTIES_CHANGED: &Signature =
    <(&str, HashMap<&str, Variant<'static>>, Vec<&str>) as Type>::SIGNATURE;

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
    let fail = |source: DecodeFailure| DecodeError {
        member: member.to_string(),
        source,
    };
    match (interface.as_str(), member.as_str()) {
        ("org.freedesktop.DBus.Properties", "PropertiesChanged") => {
            let change = properties_changed(&message.body()).map_err(fail)?;
            Ok(change
                .filter(UnitChange::is_relevant)
                .map(|change| SystemdSignal::UnitChanged {
                    path: path.to_string(),
                    change,
                }))
        }
        (MANAGER_INTERFACE, "UnitNew") => {
            let (unit, _path): (String, OwnedObjectPath) =
                message.body().deserialize().map_err(|e| fail(e.into()))?;
            Ok(Some(SystemdSignal::UnitNew { unit }))
        }
        (MANAGER_INTERFACE, "UnitRemoved") => {
            let (unit, _path): (String, OwnedObjectPath) =
                message.body().deserialize().map_err(|e| fail(e.into()))?;
            Ok(Some(SystemdSignal::UnitRemoved { unit }))
        }
        (MANAGER_INTERFACE, "Reloading") => {
            let active: bool = message.body().deserialize().map_err(|e| fail(e.into()))?;
            Ok(Some(SystemdSignal::Reloading(active)))
        }
        _ => Ok(None),
    }
}

/// The body of a PropertiesChanged signal (`sa{sv}as`), read in its wire format: the
/// interface, then only the changed properties the agent uses (each checked for its type), then
/// whether one of those was invalidated. `None` for an interface other than `Unit` and
/// `Service`, whose properties are not read at all.
///
/// Every other property is skipped by its signature, unread: systemd sends every property of
/// an interface on each change (22 of `Unit`, more of `Service`, about 900 bytes), a death
/// brings two such signals, and both lie on the way to its proof.
fn properties_changed(body: &Body) -> Result<Option<UnitChange>, DecodeFailure> {
    if body.signature() != PROPERTIES_CHANGED {
        return Err(DecodeFailure::Signature(body.signature().to_string()));
    }
    let data = body.data();
    let context = data.context();
    let mut body = BodyReader::new(
        data.bytes(),
        context.position(),
        context.endian() == Endian::Big,
    );
    let interface = body.string_bytes()?;
    if interface != UNIT_INTERFACE.as_bytes() && interface != SERVICE_INTERFACE.as_bytes() {
        return Ok(None);
    }
    let mut change = UnitChange::default();
    let changed = body.array(8)?;
    while body.has_next(changed)? {
        body.align(8)?;
        let name = body.string_bytes()?;
        let signature = body.signature()?;
        // A property the agent uses must hold the type systemd gives it.
        let typed = |expected: &'static str| {
            if signature == expected.as_bytes() {
                Ok(())
            } else {
                Err(DecodeFailure::PropertyType {
                    name: String::from_utf8_lossy(name).into_owned(),
                    found: String::from_utf8_lossy(signature).into_owned(),
                    expected,
                })
            }
        };
        match name {
            b"ActiveState" => {
                typed("s")?;
                change.active_state = Some(body.string()?.into());
            }
            b"SubState" => {
                typed("s")?;
                change.sub_state = Some(body.string()?.into());
            }
            b"InvocationID" => {
                typed("ay")?;
                change.invocation = Some(hex(body.bytes()?));
            }
            b"Result" => {
                typed("s")?;
                change.result = Some(body.string()?.into());
            }
            b"ExecMainCode" => {
                typed("i")?;
                change.exec_main_code = Some(body.i32()?);
            }
            b"ExecMainStatus" => {
                typed("i")?;
                change.exec_main_status = Some(body.i32()?);
            }
            b"InactiveExitTimestampMonotonic" => {
                typed("t")?;
                change.inactive_exit_us = Some(body.u64()?);
            }
            b"MainPID" => {
                typed("u")?;
                change.main_pid = Some(body.u32()?);
            }
            b"ControlPID" => {
                typed("u")?;
                change.control_pid = Some(body.u32()?);
            }
            _ => body.skip(signature)?,
        }
    }
    let invalidated = body.array(4)?;
    while body.has_next(invalidated)? {
        let name = body.string_bytes()?;
        change.invalidated |= matches!(
            name,
            b"ActiveState"
                | b"SubState"
                | b"InvocationID"
                | b"Result"
                | b"ExecMainCode"
                | b"ExecMainStatus"
        );
    }
    Ok(Some(change))
}

/// An InvocationID as systemd prints it: 32 lowercase hex digits, or empty for all zeroes or
/// none.
pub(crate) fn hex(bytes: &[u8]) -> String {
    if bytes.iter().all(|b| *b == 0) {
        return String::new();
    }
    lower_hex(bytes)
}

/// Two lowercase hex digits a byte, zeroes included.
pub(crate) fn lower_hex(bytes: &[u8]) -> String {
    // Every unit signal and every proof's state carries one: two digits a byte into one
    // string, not a string a byte.
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        hex.push(char::from(DIGITS[usize::from(b >> 4)]));
        hex.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    hex
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
        if kept_as_is(b, i == 0) {
            path.push(char::from(b));
        } else {
            path.push_str(&format!("_{b:02x}"));
        }
    }
    path
}

/// Whether systemd writes byte `b` of a unit's name as it is in the object path (else escaped).
fn kept_as_is(b: u8, first: bool) -> bool {
    b.is_ascii_alphabetic() || (b.is_ascii_digit() && !first)
}

/// The unit whose object path is `path`: [`unit_path`] reversed, so the agent keeps a unit's
/// name and not its path too. `None` for a path that no unit name escapes to (not under
/// [`UNIT_PATH_PREFIX`], a malformed escape, or one systemd would have written otherwise, such
/// as an escaped letter or an uppercase hex digit), so a path names one unit or none. Runs for
/// every signal: it checks the spelling as it goes, allocating only the name.
pub(crate) fn unit_of_path(path: &str) -> Option<String> {
    let label = path.strip_prefix(UNIT_PATH_PREFIX)?.strip_prefix('/')?;
    if label == "_" {
        return Some(String::new());
    }
    let lower_hex = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    };
    let mut unit = Vec::with_capacity(label.len());
    let mut bytes = label.bytes();
    while let Some(b) = bytes.next() {
        let first = unit.is_empty();
        let byte = if b == b'_' {
            let byte = lower_hex(bytes.next()?)? << 4 | lower_hex(bytes.next()?)?;
            // Only systemd's own spelling: two spellings of one name would be two paths of it.
            (!kept_as_is(byte, first)).then_some(byte)?
        } else {
            kept_as_is(b, first).then_some(b)?
        };
        unit.push(byte);
    }
    if unit.is_empty() {
        return None;
    }
    String::from_utf8(unit).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use zbus::OwnedVariant;
    use zbus::wire::Endian;
    use zbus::wire::serialized::{Context, Data};

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
    fn a_unit_path_names_the_unit_it_was_made_from_and_no_other() {
        for unit in [
            "x.service",
            "foo-bar@1.service",
            "1a.service",
            "",
            "ünï.service",
        ] {
            assert_eq!(unit_of_path(&unit_path(unit)).as_deref(), Some(unit));
        }
        for path in [
            "/org/freedesktop/systemd1/unit/x_2Eservice",
            "/org/freedesktop/systemd1/unit/_78_2eservice",
            "/org/freedesktop/systemd1/unit/1a_2eservice",
            "/org/freedesktop/systemd1/unit/x_2",
            "/org/freedesktop/systemd1/unit/x_zzservice",
            "/org/freedesktop/systemd1/unit/_ff",
            "/org/freedesktop/systemd1/unit/",
            "/org/freedesktop/systemd1/unit",
            "/org/freedesktop/systemd1/unitx_2eservice",
            "/org/freedesktop/systemd1",
        ] {
            assert_eq!(unit_of_path(path), None, "{path}");
        }
    }

    proptest::proptest! {
        #[test]
        fn unit_of_path_reverses_unit_path(unit in ".{0,12}") {
            proptest::prop_assert_eq!(unit_of_path(&unit_path(&unit)), Some(unit));
        }

        #[test]
        fn a_path_names_a_unit_only_if_it_is_that_units_path(label in "(_[0-9a-fA-F]{2}|[0-9a-zA-Z_]){0,8}") {
            let path = format!("{UNIT_PATH_PREFIX}/{label}");
            if let Some(unit) = unit_of_path(&path) {
                proptest::prop_assert_eq!(unit_path(&unit), path);
            }
        }
    }

    #[test]
    fn invocation_ids_print_as_hex_and_zero_is_none() {
        assert_eq!(hex(&[0; 16]), "");
        assert_eq!(hex(&[]), "");
        assert_eq!(hex(&[0xab, 0x01]), "ab01");
        assert_eq!(hex(&[0xff, 0x0a, 0x10, 0x00]), "ff0a1000");
    }

    fn properties_changed(
        iface: &str,
        changed: HashMap<&str, Variant<'_>>,
        invalidated: Vec<&str>,
    ) -> Message {
        properties_changed_in(Endian::Little, iface, changed, invalidated)
    }

    fn properties_changed_in(
        endian: Endian,
        iface: &str,
        changed: HashMap<&str, Variant<'_>>,
        invalidated: Vec<&str>,
    ) -> Message {
        Message::signal(
            "/org/freedesktop/systemd1/unit/x_2eservice",
            "org.freedesktop.DBus.Properties",
            "PropertiesChanged",
        )
        .endian(endian)
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

    /// A message as systemd 252 sent it on this machine's bus, captured in a benchmark run.
    fn captured(bytes: &'static [u8]) -> Message {
        let data = Data::new(bytes, Context::new(Endian::Little, 0));
        // SAFETY: from_bytes checks the framing of the header and the body; the bytes are a
        // whole message as the bus delivered it.
        unsafe { Message::from_bytes(data) }.expect("a captured message")
    }

    /// The properties the agent uses as a generic decoding finds them: the whole dict as owned
    /// variants, each converted on its own. The oracle for the wire decoder.
    fn generic_change(message: &Message) -> zbus::Result<UnitChange> {
        /// The property, which must hold a `T` itself (zbus would also take one out of a
        /// variant in the variant, which systemd never sends and the agent refuses).
        fn take<T>(dict: &mut HashMap<String, OwnedVariant>, name: &str) -> zbus::Result<Option<T>>
        where
            T: TryFrom<OwnedVariant> + Type,
            zbus::Error: From<T::Error>,
        {
            dict.remove(name)
                .map(|v| {
                    if v.value_signature() != T::SIGNATURE {
                        return Err(zbus::Error::Failure(format!("{name}: wrong type")));
                    }
                    Ok(T::try_from(v)?)
                })
                .transpose()
        }
        let body = message.body();
        let (_, mut dict, invalidated): (String, HashMap<String, OwnedVariant>, Vec<String>) =
            body.deserialize()?;
        Ok(UnitChange {
            active_state: take(&mut dict, "ActiveState")?,
            sub_state: take(&mut dict, "SubState")?,
            invocation: take::<Vec<u8>>(&mut dict, "InvocationID")?.map(|b| hex(&b)),
            result: take(&mut dict, "Result")?,
            exec_main_code: take(&mut dict, "ExecMainCode")?,
            exec_main_status: take(&mut dict, "ExecMainStatus")?,
            inactive_exit_us: take(&mut dict, "InactiveExitTimestampMonotonic")?,
            main_pid: take(&mut dict, "MainPID")?,
            control_pid: take(&mut dict, "ControlPID")?,
            invalidated: invalidated.iter().any(|p| p == "ActiveState"),
        })
    }

    fn change_of(message: &Message) -> UnitChange {
        match decode(message) {
            Ok(Some(SystemdSignal::UnitChanged { change, .. })) => change,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn real_systemd_signals_decode_as_a_generic_decoding_reads_them() {
        let unit = captured(include_bytes!("fixtures/unit-failed.dbus"));
        let change = change_of(&unit);
        assert_eq!(change, generic_change(&unit).unwrap());
        assert_eq!(change.active_state.as_deref(), Some("failed"));
        assert_eq!(change.sub_state.as_deref(), Some("failed"));
        assert_eq!(change.invocation.as_ref().map(String::len), Some(32));
        assert!(
            change.inactive_exit_us.is_some_and(|us| us > 0),
            "{change:?}"
        );

        let service = captured(include_bytes!("fixtures/service-changed.dbus"));
        let change = change_of(&service);
        assert_eq!(change, generic_change(&service).unwrap());
        assert!(change.result.is_some() && change.exec_main_code.is_some());
        assert!(change.main_pid.is_some() && change.control_pid.is_some());
        assert_eq!(change.active_state, None);
    }

    #[test]
    fn a_foreign_interface_is_dropped_whatever_its_properties_hold() {
        let changed = HashMap::from([("ActiveState", Variant::from(3u32))]);
        let slice = "org.freedesktop.systemd1.Slice";
        assert_eq!(
            decode(&properties_changed(slice, changed, vec!["SubState"])).unwrap(),
            None
        );
    }

    /// A value of one of the types systemd's properties have, and some it has not.
    #[derive(Clone, Debug)]
    enum Value {
        U32(u32),
        I32(i32),
        U64(u64),
        Bool(bool),
        I16(i16),
        F64(f64),
        Str(String),
        Bytes(Vec<u8>),
        Pair(u32, String),
        /// Like the exec commands: `a(sasbttttuii)`, cut down.
        Commands(Vec<(String, Vec<String>, bool, u64)>),
        Dict(Vec<(String, u32)>),
        /// A variant in the variant.
        Nested(Box<Value>),
    }

    impl Value {
        fn variant(&self) -> Variant<'_> {
            match self {
                Value::U32(v) => Variant::from(*v),
                Value::I32(v) => Variant::from(*v),
                Value::U64(v) => Variant::from(*v),
                Value::Bool(v) => Variant::from(*v),
                Value::I16(v) => Variant::from(*v),
                Value::F64(v) => Variant::from(*v),
                Value::Str(v) => Variant::from(v.as_str()),
                Value::Bytes(v) => Variant::from(v.clone()),
                Value::Pair(a, b) => Variant::from(zbus::wire::Structure::from((*a, b.as_str()))),
                Value::Commands(v) => Variant::from(v.clone()),
                Value::Dict(v) => Variant::from(v.iter().cloned().collect::<HashMap<_, _>>()),
                Value::Nested(v) => Variant::Variant(Box::new(v.variant())),
            }
        }
    }

    fn value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::collection::vec;
        use proptest::prelude::*;
        let leaf = prop_oneof![
            any::<u32>().prop_map(Value::U32),
            any::<i32>().prop_map(Value::I32),
            any::<u64>().prop_map(Value::U64),
            any::<bool>().prop_map(Value::Bool),
            any::<i16>().prop_map(Value::I16),
            any::<f64>().prop_map(Value::F64),
            "[a-z-]{0,12}".prop_map(Value::Str),
            vec(any::<u8>(), 0..20).prop_map(Value::Bytes),
            (any::<u32>(), "[a-z]{0,5}").prop_map(|(a, b)| Value::Pair(a, b)),
            vec(
                (
                    "[a-z/]{0,8}",
                    vec("[a-z]{0,4}", 0..3),
                    any::<bool>(),
                    any::<u64>()
                ),
                0..3
            )
            .prop_map(Value::Commands),
            vec(("[a-z]{1,4}", any::<u32>()), 0..3).prop_map(Value::Dict),
        ];
        leaf.prop_recursive(2, 4, 1, |inner| {
            inner.prop_map(|v| Value::Nested(Box::new(v)))
        })
    }

    /// A value for property `name`: mostly of the type systemd gives it, sometimes any other.
    fn value_for(name: &str) -> proptest::strategy::BoxedStrategy<Value> {
        use proptest::prelude::*;
        let typed = match name {
            "ActiveState" | "SubState" | "Result" => "[a-z-]{0,12}".prop_map(Value::Str).boxed(),
            "InvocationID" => proptest::collection::vec(any::<u8>(), 16)
                .prop_map(Value::Bytes)
                .boxed(),
            "ExecMainCode" | "ExecMainStatus" => any::<i32>().prop_map(Value::I32).boxed(),
            "InactiveExitTimestampMonotonic" => any::<u64>().prop_map(Value::U64).boxed(),
            "MainPID" | "ControlPID" => any::<u32>().prop_map(Value::U32).boxed(),
            _ => value().boxed(),
        };
        prop_oneof![8 => typed, 1 => value()].boxed()
    }

    const NAMES: [&str; 12] = [
        "ActiveState",
        "SubState",
        "InvocationID",
        "Result",
        "ExecMainCode",
        "ExecMainStatus",
        "InactiveExitTimestampMonotonic",
        "MainPID",
        "ControlPID",
        "Job",
        "Conditions",
        "FreezerState",
    ];

    proptest::proptest! {
        /// Any dict of any values, on either interface, in either byte order: the wire decoder reads what the
        /// generic one reads, fails where it fails, and never panics.
        #[test]
        fn the_wire_decoder_reads_what_a_generic_decoding_reads(
            service in proptest::bool::ANY,
            big_endian in proptest::bool::ANY,
            values in NAMES.map(|name| proptest::option::of(value_for(name))).to_vec(),
            invalidated in proptest::collection::vec(proptest::sample::select(NAMES.to_vec()), 0..3),
        ) {
            let iface = if service { SERVICE_INTERFACE } else { UNIT_INTERFACE };
            let changed: HashMap<&str, Variant<'_>> = NAMES
                .iter()
                .zip(&values)
                .filter_map(|(name, v)| v.as_ref().map(|v| (*name, v.variant())))
                .collect();
            let endian = if big_endian { Endian::Big } else { Endian::Little };
            let message = properties_changed_in(endian, iface, changed, invalidated.clone());
            let streamed = decode(&message).map(|signal| match signal {
                Some(SystemdSignal::UnitChanged { change, .. }) => change,
                _ => UnitChange::default(),
            });
            match generic_change(&message) {
                Ok(mut expected) => {
                    expected.invalidated = invalidated.iter().any(|name| {
                        NAMES[..6].contains(name)
                    });
                    proptest::prop_assert_eq!(streamed.ok(), Some(expected));
                }
                Err(_) => proptest::prop_assert!(streamed.is_err()),
            }
        }
    }
}

//! What a read of a unit makes of systemd's answers (pure): which properties it asks for, the
//! snapshot they make, whether they are one invocation's, and when it asks with `GetAll`.
//!
//! `read.rs` asks systemd over D-Bus and the simulator answers from its model of systemd;
//! both assemble their answers here, so the simulation checks the driver's own rule.

use super::signal::{SERVICE_INTERFACE, UNIT_INTERFACE};

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
    /// systemd's LoadState (`loaded`, `not-found`, `masked`, ...), when the read asked for it
    /// (a read that loads the unit: [`ReadKind::Load`]).
    pub load_state: Option<String>,
}

/// How a read finds the unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadKind {
    /// `GetUnit`: a unit systemd does not have loaded is inactive with no invocation, and
    /// asking does not load it (nor does a watched unit garbage-collected after it ended come
    /// back as `not-found`).
    Get,
    /// `LoadUnit`, and LoadState besides: whether systemd knows the unit at all (`not-found`,
    /// `masked`, `bad-setting`), for a new watch that names no invocation. Loading a unit
    /// systemd knows changes nothing it does; it unloads it again when it collects garbage.
    Load,
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

/// One property as systemd answered it, in the type the agent takes it as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Property {
    /// InvocationID as lowercase hex; empty when the unit has none.
    InvocationId(String),
    Id(String),
    ActiveState(String),
    SubState(String),
    /// InactiveExitTimestampMonotonic, in CLOCK_MONOTONIC microseconds.
    InactiveExitUs(u64),
    ControlGroup(String),
    Result(String),
    ExecMainCode(i32),
    ExecMainStatus(i32),
    MainPid(u32),
    ControlPid(u32),
    LoadState(String),
}

/// Which attempt of a read this is: the first ones ask property by property, and once each
/// found the unit beginning another invocation, the last asks with `GetAll`, whose answers
/// are each one moment's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Attempt(u32);

impl Attempt {
    /// A read's first attempt, which follows `GetUnit`.
    pub(crate) const FIRST: Attempt = Attempt(1);

    /// Whether this attempt asks property by property (else with `GetAll`).
    pub(crate) fn by_property(self) -> bool {
        self.0 <= PROPERTY_READ_ATTEMPTS
    }

    /// The attempt after this one, which found that the unit began another invocation.
    pub(crate) fn next(self) -> Attempt {
        Attempt(self.0 + 1)
    }
}

/// An InvocationID as answered, with the serial of its reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct InvocationAnswer {
    pub id: String,
    pub serial: u32,
}

/// The answers of one attempt property by property; each property's answer may have failed
/// (`E`), which matters only if the invocation held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PropertyAnswers<E> {
    /// InvocationID, asked before the others.
    pub before: InvocationAnswer,
    /// The properties [`properties_asked`] names, as answered.
    pub properties: Vec<Result<Property, E>>,
    /// InvocationID, asked after the others were answered.
    pub after: InvocationAnswer,
}

/// The interface that carries ControlGroup for a unit of this type, if it has a cgroup.
pub(crate) fn cgroup_interface(unit: &str) -> Option<&'static str> {
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

/// The properties an attempt asks for one by one, between its two InvocationIDs, each with
/// its interface: the `Unit` ones (with LoadState for a read that loads the unit), then a
/// service's, or another unit type's ControlGroup.
pub(crate) fn properties_asked(unit: &str, kind: ReadKind) -> Vec<(&'static str, &'static str)> {
    let interface = cgroup_interface(unit);
    let extra: &[&str] = match interface {
        Some(SERVICE_INTERFACE) => &SERVICE_PROPERTIES,
        Some(_) => &["ControlGroup"],
        None => &[],
    };
    let load_state: &[&str] = match kind {
        ReadKind::Get => &[],
        ReadKind::Load => &["LoadState"],
    };
    UNIT_PROPERTIES
        .iter()
        .chain(load_state)
        .map(|name| (UNIT_INTERFACE, *name))
        .chain(
            extra
                .iter()
                .map(|name| (interface.unwrap_or_default(), *name)),
        )
        .collect()
}

/// The snapshot of `unit` (object `path`) made of one attempt property by property, or
/// `None` if the unit began another invocation meanwhile: ask again. A property whose answer
/// failed fails the read, unless it is to be asked again anyway.
///
/// Answers to separate calls come from separate moments, so they are one invocation's only if
/// the InvocationID asked before all of them is still the one asked after: IDs are never
/// reused, so no other invocation began in between. The read is then stamped with the first
/// answer's serial, so any signal sent after it still wins (see `UnitFacts`).
pub(crate) fn by_property<E>(
    unit: &str,
    path: &str,
    answers: PropertyAnswers<E>,
) -> Result<Option<UnitSnapshot>, E> {
    let PropertyAnswers {
        before,
        properties,
        after,
    } = answers;
    if before.id != after.id {
        return Ok(None);
    }
    let properties = properties.into_iter().collect::<Result<Vec<_>, E>>()?;
    let serial = before.serial;
    let service = (cgroup_interface(unit) == Some(SERVICE_INTERFACE)).then_some(serial);
    let properties = std::iter::once(Property::InvocationId(before.id)).chain(properties);
    Ok(Some(snapshot(unit, path, serial, properties, service)))
}

/// The snapshot of a loaded `unit` (object `path`) made of `properties`: the `Unit`
/// interface's stamped with `serial`, and for a service (`service` is `Some`) the `Service`
/// interface's, stamped with the serial `service` holds. A property not answered is empty.
pub(crate) fn snapshot(
    unit: &str,
    path: &str,
    serial: u32,
    properties: impl IntoIterator<Item = Property>,
    service: Option<u32>,
) -> UnitSnapshot {
    let mut read = UnitSnapshot {
        serial,
        loaded: true,
        id: unit.to_owned(),
        path: path.to_owned(),
        active_state: String::new(),
        sub_state: String::new(),
        invocation: String::new(),
        control_group: String::new(),
        exit: None,
        current: CurrentInvocation::default(),
        load_state: None,
    };
    let mut exit = ServiceExit::default();
    let (mut main_pid, mut control_pid) = (0, 0);
    for property in properties {
        match property {
            // An alias answers with the real unit's path; its `Id` is the name signals carry.
            Property::Id(id) => read.id = id,
            Property::InvocationId(id) => read.invocation = id,
            Property::ActiveState(state) => read.active_state = state,
            Property::SubState(state) => read.sub_state = state,
            Property::InactiveExitUs(us) => read.current.inactive_exit_us = Some(us),
            Property::ControlGroup(cgroup) => read.control_group = cgroup,
            Property::Result(result) => exit.result = Some(result),
            Property::ExecMainCode(code) => exit.exec_main_code = Some(code),
            Property::ExecMainStatus(status) => exit.exec_main_status = Some(status),
            Property::MainPid(pid) => main_pid = pid,
            Property::ControlPid(pid) => control_pid = pid,
            Property::LoadState(state) => read.load_state = Some(state),
        }
    }
    if let Some(service_serial) = service {
        read.exit = Some((exit, service_serial));
        read.current.pids = Some(((main_pid, control_pid), service_serial));
    }
    read
}

/// The snapshot of a unit systemd does not have loaded (`GetUnit` answered NoSuchUnit, with
/// the reply's `serial`): inactive, with no invocation. Reading it does not load it.
pub(crate) fn not_loaded(unit: &str, path: &str, serial: u32) -> UnitSnapshot {
    UnitSnapshot {
        serial,
        loaded: false,
        id: unit.to_owned(),
        path: path.to_owned(),
        active_state: "inactive".into(),
        sub_state: "dead".into(),
        invocation: String::new(),
        control_group: String::new(),
        exit: None,
        current: CurrentInvocation::default(),
        load_state: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = "/org/freedesktop/systemd1/unit/a_2eservice";

    fn answer(id: &str, serial: u32) -> InvocationAnswer {
        InvocationAnswer {
            id: id.into(),
            serial,
        }
    }

    /// A read's answers, where a failed answer says which property it was.
    type Answers = PropertyAnswers<&'static str>;

    fn service_answers(before: InvocationAnswer, after: InvocationAnswer) -> Answers {
        Answers {
            before,
            properties: [
                Property::Id("real.service".into()),
                Property::ActiveState("deactivating".into()),
                Property::SubState("stop-sigterm".into()),
                Property::InactiveExitUs(7),
                Property::ControlGroup("/app.slice/real.service".into()),
                Property::Result("success".into()),
                Property::ExecMainCode(1),
                Property::ExecMainStatus(3),
                Property::MainPid(0),
                Property::ControlPid(42),
            ]
            .map(Ok)
            .to_vec(),
            after,
        }
    }

    #[test]
    fn a_read_whose_invocation_held_is_stamped_with_its_first_answer() {
        let answers = service_answers(answer("ab", 10), answer("ab", 21));
        let read = by_property("a.service", PATH, answers)
            .expect("no answer failed")
            .expect("one invocation's answers");
        assert_eq!(
            read,
            UnitSnapshot {
                serial: 10,
                loaded: true,
                id: "real.service".into(),
                path: PATH.into(),
                active_state: "deactivating".into(),
                sub_state: "stop-sigterm".into(),
                invocation: "ab".into(),
                control_group: "/app.slice/real.service".into(),
                exit: Some((
                    ServiceExit {
                        result: Some("success".into()),
                        exec_main_code: Some(1),
                        exec_main_status: Some(3),
                    },
                    10
                )),
                current: CurrentInvocation {
                    inactive_exit_us: Some(7),
                    pids: Some(((0, 42), 10)),
                },
                load_state: None,
            }
        );
    }

    #[test]
    fn a_read_during_which_another_invocation_began_is_asked_again() {
        for (before, after) in [("ab", "cd"), ("", "cd"), ("ab", "")] {
            let answers = service_answers(answer(before, 10), answer(after, 21));
            assert_eq!(
                by_property("a.service", PATH, answers),
                Ok(None),
                "{before} {after}"
            );
        }
    }

    #[test]
    fn a_failed_answer_fails_the_read_only_if_the_invocation_held() {
        let failed = |after: &str| {
            let mut answers = service_answers(answer("ab", 10), answer(after, 21));
            answers.properties[2] = Err("SubState");
            by_property("a.service", PATH, answers)
        };
        assert_eq!(failed("ab"), Err("SubState"));
        assert_eq!(failed("cd"), Ok(None));
    }

    #[test]
    fn a_unit_that_is_not_a_service_has_a_cgroup_but_no_exit_status() {
        let answers = Answers {
            before: answer("ab", 5),
            properties: vec![
                Ok(Property::ActiveState("active".into())),
                Ok(Property::ControlGroup("/app.slice/a.scope".into())),
            ],
            after: answer("ab", 9),
        };
        let read = by_property("a.scope", "/p", answers)
            .expect("no answer failed")
            .expect("one invocation's answers");
        assert_eq!(read.control_group, "/app.slice/a.scope");
        assert_eq!(read.exit, None);
        assert_eq!(read.current, CurrentInvocation::default());
        // Without an `Id` answer the unit is the one asked for.
        assert_eq!(read.id, "a.scope");
    }

    #[test]
    fn get_all_stamps_each_interface_with_its_own_reply() {
        let properties = [
            Property::InvocationId("ab".into()),
            Property::ActiveState("failed".into()),
            Property::MainPid(9),
        ];
        let read = snapshot("a.service", PATH, 4, properties, Some(6));
        assert_eq!(read.serial, 4);
        assert_eq!(read.invocation, "ab");
        assert_eq!(read.exit.map(|(_, serial)| serial), Some(6));
        assert_eq!(read.current.pids, Some(((9, 0), 6)));
    }

    #[test]
    fn a_unit_not_loaded_is_inactive_with_no_invocation() {
        let read = not_loaded("a.service", PATH, 3);
        assert!(!read.loaded);
        assert_eq!(
            (read.active_state.as_str(), read.sub_state.as_str()),
            ("inactive", "dead")
        );
        assert_eq!((read.invocation.as_str(), read.serial), ("", 3));
        assert_eq!(read.exit, None);
    }

    #[test]
    fn the_first_attempts_ask_property_by_property_and_the_last_with_get_all() {
        let mut attempt = Attempt::FIRST;
        for _ in 0..PROPERTY_READ_ATTEMPTS {
            assert!(attempt.by_property(), "{attempt:?}");
            attempt = attempt.next();
        }
        assert!(!attempt.by_property(), "{attempt:?}");
    }

    #[test]
    fn the_properties_asked_follow_the_unit_type() {
        let names = |unit| -> Vec<&str> {
            properties_asked(unit, ReadKind::Get)
                .into_iter()
                .map(|(_, name)| name)
                .collect()
        };
        let unit: Vec<&str> = UNIT_PROPERTIES.to_vec();
        let service: Vec<&str> = UNIT_PROPERTIES
            .iter()
            .chain(&SERVICE_PROPERTIES)
            .copied()
            .collect();
        assert_eq!(names("a.service"), service);
        assert_eq!(names("a.scope"), [&unit[..], &["ControlGroup"]].concat());
        assert_eq!(names("a.target"), unit);
        assert_eq!(
            properties_asked("a.target", ReadKind::Load).last(),
            Some(&(UNIT_INTERFACE, "LoadState"))
        );
        assert!(
            properties_asked("a.service", ReadKind::Load)
                .iter()
                .all(|(interface, name)| (*interface == UNIT_INTERFACE)
                    == (UNIT_PROPERTIES.contains(name) || *name == "LoadState"))
        );
    }

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

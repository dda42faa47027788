use super::*;

#[test]
fn properties_are_sent_with_the_type_systemd_wants() {
    for (assignment, name, value) in [
        ("KillMode=process", "KillMode", "\"process\""),
        ("RemainAfterExit=yes", "RemainAfterExit", "true"),
        ("SendSIGKILL=off", "SendSIGKILL", "false"),
        ("KillSignal=SIGINT", "KillSignal", "2"),
        ("KillSignal=TERM", "KillSignal", "15"),
        ("RuntimeMaxSec=2m", "RuntimeMaxUSec", "uint64 120000000"),
        ("Environment=A=b c", "Environment", "[\"A=b c\"]"),
    ] {
        let (sent, encoded) = property(assignment).expect(assignment);
        assert_eq!(
            (sent.as_str(), format!("{}", *encoded)),
            (name, value.to_owned())
        );
    }
}

#[test]
fn a_property_it_cannot_type_or_sets_itself_is_refused_with_why() {
    for (assignment, why) in [
        ("KillMode", "expected NAME=VALUE"),
        ("RemainAfterExit=maybe", "expected yes or no"),
        ("KillSignal=NOPE", "not a signal"),
        ("RuntimeMaxSec=soon", "RuntimeMaxSec=soon"),
        ("Environment=novalue", "expected VAR=value"),
        ("AddRef=no", "sets it itself"),
        ("ExecStart=/bin/true", "sets it itself"),
        (
            "CPUQuota=20%",
            "not a property exitproof run can set (it can: RemainAfterExit",
        ),
    ] {
        let error = property(assignment).expect_err(assignment).to_string();
        assert!(error.starts_with(&format!("-p {assignment}: ")), "{error}");
        assert!(error.contains(why), "{assignment}: {error}");
    }
}

#[test]
fn the_exit_status_is_the_main_processs_or_128_plus_its_signal() {
    assert_eq!(exit_status("exited", "0"), Some(0));
    assert_eq!(exit_status("exited", "3"), Some(3));
    assert_eq!(exit_status("killed", "TERM"), Some(143));
    assert_eq!(exit_status("dumped", "SEGV"), Some(139));
    assert_eq!(exit_status("killed", "9"), Some(137));
    assert_eq!(exit_status("", ""), None, "systemd did not say");
    assert_eq!(exit_status("exited", "300"), None);
}

#[test]
fn a_bare_command_is_found_in_path_and_a_path_made_absolute_if_executable() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let tool = dir.path().join("tool");
    std::fs::write(&tool, "#!/bin/sh\n").expect("write");
    let plain = dir.path().join("plain");
    std::fs::write(&plain, "").expect("write");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = format!("relative:{}", dir.path().display());
    assert_eq!(find_program("tool", Some(&path)).expect("found"), tool);
    assert!(
        find_program("plain", Some(&path)).is_err(),
        "not executable"
    );
    assert!(find_program("absent", Some(&path)).is_err());
    // The tests run in the crate's directory.
    let relative = find_program("./scripts/test", None).expect("absolute");
    assert!(
        relative.is_absolute() && relative.ends_with("scripts/test"),
        "{relative:?}"
    );
    let error = find_program("/nonexistent/prog", None).expect_err("not there");
    assert_eq!(
        error.to_string(),
        "/nonexistent/prog: no such executable file"
    );
    assert!(find_program(&plain.display().to_string(), None).is_err());
}

#[test]
fn a_generated_unit_name_is_a_valid_service_name() {
    let name = generated_unit_name().expect("a name");
    assert!(
        name.starts_with("exitproof-run-") && name.ends_with(".service"),
        "{name}"
    );
    crate::unit_name::validate(&name).expect("valid");
    assert_ne!(name, generated_unit_name().expect("a name"));
}

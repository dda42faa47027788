//! How an Exited proof is worded: from the exit record a watch with a run dir takes, else
//! from systemd's own exit status; and which proofs take a record at all.

use super::*;

/// systemd's word on the main process: `exit 3`, as a `failed` unit's signal carries it.
fn failed_with_exit_3() -> UnitChange {
    UnitChange {
        active_state: Some("failed".into()),
        sub_state: Some("failed".into()),
        invocation: Some(A.into()),
        result: Some("exit-code".into()),
        exec_main_code: Some(1),
        exec_main_status: Some(3),
        ..UnitChange::default()
    }
}

fn clean_exit() -> ExitRecord {
    ExitRecord {
        result: "success".into(),
        code: "exited".into(),
        status: "0".into(),
    }
}

/// `r.service` watched with `watch_line`, waited for, and ended by `ending`: the proof event
/// the `wait` gets and how many exit records were taken for it.
fn proof_after(
    watch_line: &str,
    record: Option<ExitRecord>,
    ending: impl FnOnce(&mut Script),
) -> (ProofEvent, usize) {
    let mut s = Script::new();
    s.exit_record = record;
    s.input(Input::BusUp);
    let cgroup = "/app.slice/r.service";
    s.cgroups.insert(cgroup.into(), CgroupReading::Populated);
    s.request(watch_line);
    s.answer_reads(|u| Ok(snapshot(u, "active", A, cgroup)));
    s.request(r#"{"cmd":"wait","unit":"r.service"}"#);
    s.cgroups.insert(cgroup.into(), CgroupReading::Empty);
    ending(&mut s);
    // A `stop` is answered with the same event as the `wait`.
    let event = s.proofs().pop().expect("the wait is answered");
    (event, s.records_taken)
}

fn exited_with_exit_3(s: &mut Script) {
    s.signal(SystemdSignal::UnitChanged {
        path: unit_path("r.service"),
        change: failed_with_exit_3(),
    });
}

#[test]
fn an_exited_proof_is_worded_from_the_record_it_names_else_from_systemd() {
    let plain = r#"{"cmd":"watch","unit":"r.service"}"#;
    let with_run_dir = r#"{"cmd":"watch","unit":"r.service","run_dir":"/run/r"}"#;
    // (watch, record found, message, records taken, a record in the event)
    let cases = [
        (plain, None, "instance exited: exit 3 (exit-code)", 0, false),
        (
            with_run_dir,
            Some(clean_exit()),
            "instance exited (exit 0)",
            1,
            true,
        ),
        // A record named and not found is said so, never replaced by systemd's status.
        (
            with_run_dir,
            None,
            "instance exited (status unknown: no exit record)",
            1,
            false,
        ),
    ];
    for (watch_line, record, message, taken, has_record) in cases {
        let (event, records_taken) = proof_after(watch_line, record, exited_with_exit_3);
        assert_eq!(event.cause, Cause::Exited);
        assert_eq!(event.message, message, "{watch_line}");
        assert_eq!(records_taken, taken, "{watch_line}");
        assert_eq!(event.record.is_some(), has_record, "{watch_line}");
        let systemd = event
            .systemd
            .expect("systemd's exit status is in the event");
        assert_eq!(
            (systemd.result.as_str(), systemd.code.as_str()),
            ("exit-code", "exited")
        );
        assert_eq!(systemd.status, "3");
    }
}

#[test]
fn a_proof_other_than_an_exit_takes_no_record_and_keeps_its_own_words() {
    let watch_line = r#"{"cmd":"watch","unit":"r.service","run_dir":"/run/r"}"#;
    let replaced_after_stop = |s: &mut Script| {
        s.request(r#"{"cmd":"stop","unit":"r.service"}"#);
        s.changed("r.service", "activating", B);
    };
    let (event, records_taken) = proof_after(watch_line, Some(clean_exit()), replaced_after_stop);
    assert_eq!(event.cause, Cause::ReplacedAfterStop);
    assert_eq!(
        records_taken, 0,
        "the record is the next invocation's to word"
    );
    assert!(event.record.is_none() && event.systemd.is_none());
    assert_eq!(
        event.message,
        "instance exited (status unknown: replaced after stop)"
    );
}

#[test]
fn a_watch_with_a_run_dir_lists_the_record_named_for_its_invocation() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.request(r#"{"cmd":"watch","unit":"r.service","run_dir":"/run/r"}"#);
    s.answer_reads(|u| Ok(snapshot(u, "active", A, "")));
    assert_eq!(s.view("r.service").record, Some(format!("exit-{A}.json")));
}

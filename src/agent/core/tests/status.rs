//! `status`: a watch, its facts, and since when remaining processes block its proof.

use super::*;

fn status(s: &mut Script, unit: &str) -> Answer {
    let line = format!(r#"{{"cmd":"status","unit":"{unit}"}}"#);
    s.ask(&line, |answer| match answer {
        Answer::Status(_) | Answer::Error(..) => Some(answer.clone()),
        _ => None,
    })
    .expect("an answer")
}

fn unit_status(s: &mut Script, unit: &str) -> UnitStatus {
    match status(s, unit) {
        Answer::Status(status) => *status,
        other => panic!("not a status: {other:?}"),
    }
}

#[test]
fn a_terminal_unit_with_processes_left_is_blocked_since_it_became_terminal() {
    let mut s = watching("b.service", "active");
    let running = unit_status(&mut s, "b.service");
    assert!(!running.blocked);
    assert_eq!(running.terminal_since_mono_ns, None);
    assert_eq!(running.cgroup.as_deref(), Some("/app.slice/b.service"));
    assert_eq!(running.watch.invocation.as_deref(), Some(A));

    let became_terminal = s.now;
    s.changed("b.service", "failed", A);
    s.now += Duration::from_millis(1500);
    let blocked = unit_status(&mut s, "b.service");
    assert!(blocked.blocked);
    assert_eq!(blocked.terminal_for_ms, Some(1500));
    let anchor = s.core.config.clock_anchor;
    let since = became_terminal.duration_since(anchor.0).as_nanos() as u64 + anchor.1;
    assert_eq!(blocked.terminal_since_mono_ns, Some(since));
    assert_eq!(blocked.remaining, None, "the driver lists the processes");

    s.cgroups
        .insert("/app.slice/b.service".into(), CgroupReading::Empty);
    s.input(Input::CgroupChanged { key: UnitKey(0) });
    let proven = unit_status(&mut s, "b.service");
    assert!(!proven.blocked);
    assert_eq!(proven.terminal_for_ms, None);
    assert_eq!(proven.watch.phase, Phase::Proven);
}

#[test]
fn status_of_a_unit_not_watched_is_not_watched() {
    let mut s = watching("b.service", "active");
    match status(&mut s, "other.service") {
        Answer::Error(ErrorKind::NotWatched, message) => {
            assert_eq!(message, "other.service is not watched");
        }
        other => panic!("{other:?}"),
    }
}

/// A running unit whose cgroup the agent cannot find where systemd says (another cgroup
/// view): an error for that watch, shown by `status`, never a cgroup gone.
#[test]
fn a_running_units_cgroup_not_found_where_systemd_says_is_an_error_not_gone() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.request(r#"{"cmd":"watch","unit":"u.service"}"#);
    s.answer_reads(|u| Ok(snapshot(u, "active", A, "/app.slice/u.service")));
    let status = unit_status(&mut s, "u.service");
    assert_eq!(status.watch.populated, None);
    assert_eq!(
        status.cgroup_error.as_deref(),
        Some("not found where systemd says (/app.slice/u.service) while it is active (x)")
    );
    assert!(s.outputs.iter().any(|o| matches!(
        o,
        Output::Log { line, .. } if line.starts_with("u.service: cgroup not found where")
    )));
    // Once systemd says it is over, a cgroup gone is the fact it is.
    s.changed("u.service", "inactive", A);
    assert_eq!(s.phase("u.service"), Phase::Proven);
    assert_eq!(unit_status(&mut s, "u.service").cgroup_error, None);
}

/// `active (exited)` prunes the cgroup (RemainAfterExit=yes): no cgroup then is no error,
/// whether systemd already reads ControlGroup "" or the agent still knows the old path.
#[test]
fn an_exited_remain_after_exit_units_missing_cgroup_is_no_error() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.request(r#"{"cmd":"watch","unit":"pruned.service"}"#);
    s.request(r#"{"cmd":"watch","unit":"known.service"}"#);
    s.answer_reads(|u| {
        let cgroup = match u {
            "known.service" => "/app.slice/known.service",
            _ => "",
        };
        Ok(UnitSnapshot {
            sub_state: "exited".into(),
            ..snapshot(u, "active", A, cgroup)
        })
    });
    for unit in ["pruned.service", "known.service"] {
        let status = unit_status(&mut s, unit);
        assert_eq!(status.watch.phase, Phase::Watching, "{unit}");
        assert_eq!(status.cgroup_error, None, "{unit}");
    }
}

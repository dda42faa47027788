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

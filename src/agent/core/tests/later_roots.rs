//! What the watch keeps of the invocations after ours, which a count of leftovers is told of:
//! across reads, aliases and lost connections.

use super::*;

const REAL1_CGROUP: &str = "/app.slice/real1.service";

/// `nick.service` watched for invocation A, its cgroup populated; its first read names the
/// unit `real1.service`, in `active` running `invocation`, with MainPID `main_pid` (0: none).
/// Returns the script and the watch's key.
fn watched_by_an_alias_whose_read_names(
    active: &str,
    invocation: &str,
    main_pid: u32,
) -> (Script, UnitKey) {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.cgroups
        .insert(REAL1_CGROUP.into(), CgroupReading::Populated);
    s.request(&format!(
        r#"{{"cmd":"watch","unit":"nick.service","invocation":"{A}"}}"#
    ));
    let key = s.read_asked();
    let mut read = UnitSnapshot {
        serial: s.next_serial(),
        ..snapshot("real1.service", active, invocation, REAL1_CGROUP)
    };
    if main_pid > 0 {
        read.current.pids = Some(((main_pid, 0), read.serial));
    }
    s.input(Input::UnitRead {
        key,
        result: Ok(read),
    });
    (s, key)
}

/// As [`watched_by_an_alias_whose_read_names`], running invocation B with MainPID 77.
fn watched_by_an_alias_whose_read_names_b_with_main_pid_77() -> (Script, UnitKey) {
    watched_by_an_alias_whose_read_names("activating", B, 77)
}

/// An alias watch's read that names the unit under its own name and an invocation after ours
/// decides nothing, but what it says of that invocation is systemd's word: its MainPID is a root
/// after ours even once the connection it came on is lost and the next one names yet
/// another invocation (found by the simulator: a leftover in that root's session waited as
/// ours).
#[test]
fn a_later_root_an_alias_read_told_outlives_the_connection_it_came_on() {
    let (mut s, key) = watched_by_an_alias_whose_read_names_b_with_main_pid_77();
    assert_eq!(s.read_asked(), key, "the alias is followed");
    s.input(Input::BusLost);
    s.input(Input::BusUp);
    s.serial = 10;
    s.answer_reads(|_| Ok(snapshot("real1.service", "active", C, REAL1_CGROUP)));
    s.changed("real1.service", "inactive", C);
    s.assert_counted_as_a_later_root(77);
}

/// An alias watch that names its invocation, whose read found the unit under its own name
/// running ours, loses its connection before the read after it: every message of the next
/// connection was sent after that read, so the invocation they name is after ours and its
/// MainPID a root after ours, though no read is in on the new connection when they come (found
/// by the simulator, 110974389574438h: held until the next read, then dropped as possibly older
/// than ours, and an orphan in that root's session waited as ours).
#[test]
fn what_an_alias_watch_hears_on_its_next_connection_is_after_ours() {
    let (mut s, key) = watched_by_an_alias_whose_read_names("active", A, 0);
    assert_eq!(s.read_asked(), key, "the alias is followed");
    s.input(Input::BusLost);
    s.input(Input::BusUp);
    s.changed("real1.service", "active", B);
    s.main_pid("real1.service", 77);
    s.changed("real1.service", "deactivating", B);
    s.answer_reads(|_| Ok(snapshot("real1.service", "active", C, REAL1_CGROUP)));
    s.changed("real1.service", "inactive", C);
    s.assert_counted_as_a_later_root(77);
}

/// The same on one connection: the read after the alias's names yet another invocation, and
/// the facts keep only the current one's roots.
#[test]
fn a_later_root_an_alias_read_told_outlives_the_next_invocation() {
    let (mut s, _) = watched_by_an_alias_whose_read_names_b_with_main_pid_77();
    s.answer_reads(|_| Ok(snapshot("real1.service", "active", C, REAL1_CGROUP)));
    s.changed("real1.service", "inactive", C);
    s.assert_counted_as_a_later_root(77);
}

/// A unit restarted outside a dozen times while ours waits on a leftover: the roots of the
/// first invocation after ours, whose orphans the cgroup may hold as long as any other's, are
/// still counted as that invocation's (found by the simulator: they went first when the watch
/// kept 16, and an orphan of the first waited as ours).
#[test]
fn the_first_invocation_after_ours_keeps_its_roots_through_a_dozen_restarts() {
    let mut s = watching("r.service", "active");
    // A process that may be ours keeps the proof open.
    s.leftovers.insert("/app.slice/r.service".into(), vec![78]);
    s.changed("r.service", "inactive", A);
    for n in 0..12_u32 {
        s.changed("r.service", "active", &format!("{:032x}", 0xb0 + n));
        s.signal(SystemdSignal::UnitChanged {
            path: unit_path("r.service"),
            change: UnitChange {
                main_pid: Some(200 + n),
                control_pid: Some(300 + n),
                ..UnitChange::default()
            },
        });
        s.main_pid("r.service", 0);
    }
    s.changed("r.service", "inactive", &format!("{:032x}", 0xb0 + 11));
    let gone_roots = s.counted_gone_roots();
    assert!(
        gone_roots.contains(&200) && gone_roots.contains(&300),
        "the first invocation after ours: {gone_roots:?}"
    );
}

/// systemd names the next invocation while the unit is still inactive, with the ControlPID of
/// its ExecStartPre= in the change before, and says when it began only once it is activating:
/// the root gathered first, its beginning unknown, takes it once said (found by the simulator:
/// a ControlPID that outlived its stop waited as ours, its invocation's beginning never joined
/// to it).
#[test]
fn a_later_root_gathered_before_its_invocation_began_takes_its_beginning() {
    let mut s = watching("b.service", "active");
    s.leftovers.insert("/app.slice/b.service".into(), vec![78]);
    s.changed("b.service", "inactive", A);
    // ActiveState and InvocationID, with the InactiveExitTimestamp said beside them.
    let state = |active: &str, invocation: &str, inactive_exit_us: u64| UnitChange {
        active_state: Some(active.into()),
        invocation: Some(invocation.into()),
        inactive_exit_us: Some(inactive_exit_us),
        ..UnitChange::default()
    };
    let mut said = |change: UnitChange| {
        s.signal(SystemdSignal::UnitChanged {
            path: unit_path("b.service"),
            change,
        })
    };
    said(UnitChange {
        main_pid: Some(0),
        control_pid: Some(77),
        ..UnitChange::default()
    });
    said(state("inactive", B, 1_000));
    said(state("activating", B, 5_000));
    said(state("failed", B, 5_000));
    said(UnitChange {
        control_pid: Some(0),
        ..UnitChange::default()
    });
    said(state("inactive", C, 5_000));
    let counted = s.counted_against.take().expect("leftovers counted");
    assert!(
        counted.gone_roots.contains(&GoneRoot {
            pid: 77,
            began_us: Some(5_000)
        }),
        "{counted:?}"
    );
}

//! What the watch keeps of the invocations after ours, which a count of leftovers is told of:
//! across reads, aliases and lost connections.

use super::*;

/// An alias watch's read that names the unit under its own name and an invocation after ours
/// decides nothing, but what it says of that invocation is systemd's word: its MainPID is a root
/// after ours even once the connection it came on is lost and the next one names yet
/// another invocation (found by the simulator: a leftover in that root's session waited as
/// ours).
#[test]
fn a_later_root_an_alias_read_told_outlives_the_connection_it_came_on() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    let cgroup = "/app.slice/real1.service";
    s.cgroups.insert(cgroup.into(), CgroupReading::Populated);
    s.request(&format!(
        r#"{{"cmd":"watch","unit":"nick.service","invocation":"{A}"}}"#
    ));
    let key = s.read_asked();
    let mut read = UnitSnapshot {
        serial: s.next_serial(),
        ..snapshot("real1.service", "activating", B, cgroup)
    };
    read.current.pids = Some(((77, 0), read.serial));
    s.input(Input::UnitRead {
        key,
        result: Ok(read),
    });
    assert_eq!(s.read_asked(), key, "the alias is followed");
    s.input(Input::BusLost);
    s.input(Input::BusUp);
    s.serial = 10;
    s.answer_reads(|_| Ok(snapshot("real1.service", "active", C, cgroup)));
    s.changed("real1.service", "inactive", C);
    s.assert_counted_as_a_later_root(77);
}

/// The same on one connection: the read after the alias's names yet another invocation, and
/// the facts keep only the current one's roots.
#[test]
fn a_later_root_an_alias_read_told_outlives_the_next_invocation() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    let cgroup = "/app.slice/real1.service";
    s.cgroups.insert(cgroup.into(), CgroupReading::Populated);
    s.request(&format!(
        r#"{{"cmd":"watch","unit":"nick.service","invocation":"{A}"}}"#
    ));
    let key = s.read_asked();
    let mut read = UnitSnapshot {
        serial: s.next_serial(),
        ..snapshot("real1.service", "activating", B, cgroup)
    };
    read.current.pids = Some(((77, 0), read.serial));
    s.input(Input::UnitRead {
        key,
        result: Ok(read),
    });
    s.answer_reads(|_| Ok(snapshot("real1.service", "active", C, cgroup)));
    s.changed("real1.service", "inactive", C);
    s.assert_counted_as_a_later_root(77);
}

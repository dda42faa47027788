//! Unit reads: when they go out, how many at once, and what a read after a lost bus or a
//! reload may decide.

use super::*;

/// The units of the reads asked for so far, taken; the other outputs stay.
fn reads_asked(s: &mut Script) -> Vec<(UnitKey, String)> {
    let mut reads = Vec::new();
    for output in s.take() {
        match output {
            Output::ReadUnit { key, unit, .. } => reads.push((key, unit)),
            other => s.outputs.push(other),
        }
    }
    reads
}

/// Answers the read of `key` with `snapshot`, stamped with the next serial.
fn answer(s: &mut Script, key: UnitKey, snapshot: UnitSnapshot) {
    let serial = s.next_serial();
    s.input(Input::UnitRead {
        key,
        result: Ok(UnitSnapshot { serial, ..snapshot }),
    });
}

fn units(reads: &[(UnitKey, String)]) -> Vec<&str> {
    reads.iter().map(|(_, unit)| unit.as_str()).collect()
}

/// With one read in flight at most: `units` watched (each active, invocation A, its cgroup
/// populated) and their first reads answered, then each announced anew (`UnitNew`), which
/// reads it again: the first unit's read goes out, the others' wait in the queue.
fn read_again_one_at_a_time(units: &[&str]) -> Script {
    let config = CoreConfig {
        max_reads_in_flight: 1,
        ..config("boot-1")
    };
    let mut s = Script::configured(config, AgentState::default());
    s.input(Input::BusUp);
    for unit in units {
        let cgroup = format!("/app.slice/{unit}");
        s.cgroups.insert(cgroup.clone(), CgroupReading::Populated);
        s.request(&format!(r#"{{"cmd":"watch","unit":"{unit}"}}"#));
        s.answer_reads(|u| Ok(snapshot(u, "active", A, &cgroup)));
    }
    for unit in units {
        s.signal(SystemdSignal::UnitNew {
            unit: (*unit).into(),
        });
    }
    s
}

#[test]
fn no_unit_is_read_while_the_bus_is_down_or_systemd_reloads_and_each_is_read_after() {
    for reload in [false, true] {
        let mut s = Script::new();
        if reload {
            s.input(Input::BusUp);
            s.signal(SystemdSignal::Reloading(true));
        }
        s.request(r#"{"cmd":"watch","unit":"x.service"}"#);
        assert!(reads_asked(&mut s).is_empty(), "reload: {reload}");
        if reload {
            s.signal(SystemdSignal::Reloading(false));
        } else {
            s.input(Input::BusUp);
        }
        assert_eq!(
            units(&reads_asked(&mut s)),
            ["x.service"],
            "reload: {reload}"
        );
    }
}

#[test]
fn at_most_the_window_of_reads_is_in_flight_and_each_answer_lets_one_more_go() {
    let config = CoreConfig {
        max_reads_in_flight: 2,
        ..config("boot-1")
    };
    let mut s = Script::configured(config, AgentState::default());
    s.input(Input::BusUp);
    for unit in ["a", "b", "c", "d"] {
        let cgroup = format!("/app.slice/{unit}.service");
        s.cgroups.insert(cgroup, CgroupReading::Populated);
        s.request(&format!(r#"{{"cmd":"watch","unit":"{unit}.service"}}"#));
    }
    let reads = reads_asked(&mut s);
    assert_eq!(units(&reads), ["a.service", "b.service"]);
    let (key, unit) = &reads[0];
    let cgroup = format!("/app.slice/{unit}");
    answer(&mut s, *key, snapshot(unit, "active", A, &cgroup));
    assert_eq!(units(&reads_asked(&mut s)), ["c.service"]);
}

/// A generation's final stop waits for a read after its proof. The bus lost meanwhile makes
/// every fact stale; the read on the new connection is fresh again, and the stop goes out.
#[test]
fn a_proven_generations_final_stop_goes_out_after_a_fresh_read_on_a_new_connection() {
    let mut s = Script::watching_generation_3();
    s.cgroups
        .insert("/app.slice/g.service".into(), CgroupReading::Empty);
    s.changed("g.service", "failed", A);
    assert_eq!(s.phase("g.service"), Phase::Proven);
    // That read's reply is lost with the connection.
    assert_eq!(units(&reads_asked(&mut s)), ["g.service"]);
    s.input(Input::BusLost);
    s.input(Input::BusUp);
    let read = s.answer_reads(|u| Ok(snapshot(u, "failed", A, "")));
    assert_eq!(read, ["g.service"]);
    assert_eq!(
        s.stops(),
        [("g.service".to_owned(), StopKind::FinalGeneration)]
    );
}

/// A RemainAfterExit= unit watched while `active (exited)` has no cgroup of ours; the next
/// invocation's, in another slice, is taken (the Slice= change case).
#[test]
fn a_watch_that_knows_no_cgroup_of_ours_takes_the_next_invocations() {
    let mut s = Script::new();
    s.input(Input::BusUp);
    s.request(r#"{"cmd":"watch","unit":"rae.service"}"#);
    s.answer_reads(|u| Ok(snapshot(u, "active", A, "")));
    let theirs = "/b.slice/rae.service";
    s.cgroups.insert(theirs.into(), CgroupReading::Populated);
    s.changed("rae.service", "active", B);
    let read = s.answer_reads(|u| Ok(snapshot(u, "active", B, theirs)));
    assert_eq!(read, ["rae.service"]);
    assert_eq!(s.save().watches[0].control_group.as_deref(), Some(theirs));
}

/// A reply during a reload lets the next queued read go out, before the reload ends: what it
/// answers decides nothing, as a read sent before the reload (the reload's end is the epoch
/// that tells them apart).
#[test]
fn a_queued_read_sent_during_a_reload_decides_nothing_after_it() {
    let mut s = read_again_one_at_a_time(&["a.service", "b.service"]);
    s.signal(SystemdSignal::Reloading(true));
    let reads = reads_asked(&mut s);
    assert_eq!(units(&reads), ["a.service"], "b's read waits in the queue");
    let a = snapshot("a.service", "active", A, "/app.slice/a.service");
    answer(&mut s, reads[0].0, a);
    let reads = reads_asked(&mut s);
    assert_eq!(units(&reads), ["b.service"], "sent during the reload");
    s.signal(SystemdSignal::Reloading(false));
    s.cgroups
        .insert("/app.slice/b.service".into(), CgroupReading::Empty);
    answer(&mut s, reads[0].0, snapshot("b.service", "inactive", A, ""));
    assert_eq!(s.phase("b.service"), Phase::Watching);
    let read = s.answer_reads(|u| Ok(snapshot(u, "inactive", A, "")));
    assert_eq!(read, ["a.service"]);
    let read = s.answer_reads(|u| Ok(snapshot(u, "inactive", A, "")));
    assert_eq!(read, ["b.service"], "read again after the reload");
    assert_eq!(s.phase("b.service"), Phase::Proven);
}

/// With every read slot taken, a client's new watch is read before watches that have answered
/// their client, in the order the new ones came: a `watch` is answered after its first read,
/// and a unit restarted again and again (or an alias followed) would otherwise keep its client
/// waiting behind every other unit's reads (found by the simulator, 86376599874571: a `watch`
/// unanswered 61 steps with one read in flight).
#[test]
fn a_new_watchs_read_goes_before_the_reads_of_answered_watches() {
    let mut s = read_again_one_at_a_time(&["a.service", "b.service", "c.service"]);
    for unit in ["d.service", "e.service"] {
        s.request(&format!(r#"{{"cmd":"watch","unit":"{unit}"}}"#));
    }
    let mut order = Vec::new();
    for _ in 0..5 {
        let reads = reads_asked(&mut s);
        assert_eq!(reads.len(), 1, "one read at a time: {reads:?}");
        let (key, unit) = reads[0].clone();
        let cgroup = format!("/app.slice/{unit}");
        s.cgroups.insert(cgroup.clone(), CgroupReading::Populated);
        answer(&mut s, key, snapshot(&unit, "active", A, &cgroup));
        order.push(unit);
    }
    assert_eq!(
        order,
        [
            "a.service",
            "d.service",
            "b.service",
            "e.service",
            "c.service"
        ]
    );
}

/// A read queued for a watch that is proven before its turn is dropped: its slot goes to a
/// watch that still waits on one (the simulator, 171951904012746: with one read in flight,
/// reads of proven watches held up the only unproven watch's read for a dozen steps).
#[test]
fn a_watch_proven_while_its_read_waits_gives_up_its_slot() {
    let mut s = read_again_one_at_a_time(&["a.service", "b.service", "c.service"]);
    let reads = reads_asked(&mut s);
    assert_eq!(units(&reads), ["a.service"], "b's and c's reads wait");
    s.cgroups
        .insert("/app.slice/b.service".into(), CgroupReading::Empty);
    s.changed("b.service", "inactive", A);
    assert_eq!(s.phase("b.service"), Phase::Proven);
    answer(
        &mut s,
        reads[0].0,
        snapshot("a.service", "active", A, "/app.slice/a.service"),
    );
    assert_eq!(units(&reads_asked(&mut s)), ["c.service"]);
}

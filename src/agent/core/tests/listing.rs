//! What `list` shows: the cgroup as last read, and which proven units are kept.

use super::*;

/// Watches `unit` (its cgroup populated) and proves it: inactive, its cgroup empty.
fn watch_and_prove(s: &mut Script, unit: &str) {
    let cgroup = format!("/app.slice/{unit}");
    s.cgroups.insert(cgroup.clone(), CgroupReading::Populated);
    s.request(&format!(r#"{{"cmd":"watch","unit":"{unit}"}}"#));
    s.answer_reads(|u| Ok(snapshot(u, "active", A, &cgroup)));
    s.cgroups.insert(cgroup, CgroupReading::Empty);
    s.changed(unit, "inactive", A);
    assert_eq!(s.phase(unit), Phase::Proven);
}

fn listed(s: &mut Script) -> Vec<String> {
    s.list().into_iter().map(|view| view.unit).collect()
}

#[test]
fn the_last_retain_proven_proofs_are_kept_and_the_oldest_goes_first() {
    let config = CoreConfig {
        retain_proven: 2,
        ..config("boot-1")
    };
    let mut s = Script::configured(config, AgentState::default());
    s.input(Input::BusUp);
    watch_and_prove(&mut s, "a.service");
    watch_and_prove(&mut s, "b.service");
    assert_eq!(listed(&mut s), ["a.service", "b.service"]);
    watch_and_prove(&mut s, "c.service");
    assert_eq!(listed(&mut s), ["b.service", "c.service"]);
}

#[test]
fn a_list_says_whether_the_cgroup_was_populated_when_last_read() {
    let mut s = watching("p.service", "active");
    assert_eq!(s.view("p.service").populated, Some(true));
    s.cgroups
        .insert("/app.slice/p.service".into(), CgroupReading::Empty);
    s.changed("p.service", "inactive", A);
    assert_eq!(s.view("p.service").populated, Some(false));
}

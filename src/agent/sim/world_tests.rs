//! The model against what systemd was seen to do: each test is one observed behaviour.

use super::bus::{Answer, CallKind, Msg, ReadKind};
use super::harness::census;
use super::kernel::Reading;
use super::kernel::{MANAGER, TICK_US};
use super::step::{Acting, Action};
use super::unit::{Restart, SKIP_CONDITION, ServiceType, SvcState, UnitConfig};
use super::world::World;
use crate::systemd::signal::{SystemdSignal, unit_path};

/// A world with one unit of `cfg` and a subscribed agent.
fn one(cfg: UnitConfig) -> World {
    let mut w = World::empty(1);
    w.add_unit("x.service", vec!["nick.service".into()], cfg);
    w.bus.connect();
    w
}

/// Drives the unit until systemd has nothing more to do for it.
fn settle(w: &mut World) {
    for _ in 0..50 {
        if w.settled() {
            return;
        }
        w.settle(false);
    }
    panic!("the world does not settle");
}

fn signals(w: &mut World) -> Vec<(u32, SystemdSignal)> {
    w.bus
        .signals
        .drain(..)
        .filter_map(|m| match m {
            Msg::Signal(serial, s, _) => Some((serial, s)),
            Msg::SystemdLeft => None,
        })
        .collect()
}

fn states(signals: &[(u32, SystemdSignal)]) -> Vec<(String, String)> {
    signals
        .iter()
        .filter_map(|(_, s)| match s {
            SystemdSignal::UnitChanged { change, .. } => Some((
                change.active_state.clone()?,
                change.invocation.clone().unwrap_or_default(),
            )),
            _ => None,
        })
        .collect()
}

fn read(w: &mut World, name: &str) -> super::bus::Snapshot {
    let kind = ReadKind {
        get_unit: false,
        by_property: false,
        by_invocation: None,
    };
    w.bus.send(name, CallKind::Read(kind));
    w.apply(Action::ProcessCalls(kind.parts(name)));
    match w.bus.replies.pop_back().map(|r| r.answer) {
        Some(Answer::Read(Ok(mut parts))) => parts.remove(0),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_reload_sends_the_storm_in_order_and_the_units_were_never_gone() {
    let mut w = one(UnitConfig::default());
    w.add_unit("y.service", vec![], UnitConfig::default());
    w.apply(Action::Start(0));
    settle(&mut w);
    let inv = w.units[0].invocation;
    signals(&mut w);
    w.apply(Action::Reload);
    let got = signals(&mut w);
    let names: Vec<String> = got
        .iter()
        .map(|(_, s)| match s {
            SystemdSignal::Reloading(b) => format!("reloading {b}"),
            SystemdSignal::UnitRemoved { unit } => format!("removed {unit}"),
            SystemdSignal::UnitNew { unit } => format!("new {unit}"),
            SystemdSignal::UnitChanged { .. } => "changed".into(),
        })
        .collect();
    assert_eq!(
        names,
        [
            "reloading true",
            "removed x.service",
            "removed y.service",
            "new x.service",
            "new y.service",
            "reloading false"
        ]
    );
    assert!(got.windows(2).all(|p| p[0].0 < p[1].0), "serials grow");
    assert_eq!(w.units[0].invocation, inv);
    assert!(w.may_start_under(inv));
}

#[test]
fn kill_mode_process_leaves_leftovers_and_a_new_start_runs_beside_them() {
    let mut w = one(UnitConfig {
        kill_process: true,
        ..UnitConfig::default()
    });
    w.apply(Action::Start(0));
    settle(&mut w);
    let first = w.units[0].invocation;
    let main = w.units[0].main_pid.unwrap();
    w.apply(Action::Fork(main));
    w.apply(Action::Stop(0));
    settle(&mut w);
    assert_eq!(w.units[0].state, SvcState::Dead);
    assert_eq!(w.procs_of(first).len(), 1, "the child is left over");
    assert!(!w.over(first));
    assert_eq!(w.kernel.read("/app.slice/x.service"), Reading::Populated);
    assert_eq!(
        read(&mut w, "x.service").control_group,
        "/app.slice/x.service"
    );
    w.apply(Action::Start(0));
    settle(&mut w);
    let second = w.units[0].invocation;
    assert_ne!(first, second);
    assert_eq!(w.procs_of(first).len(), 1);
    assert_eq!(w.procs_of(second).len(), 1);
    assert_eq!(w.history[&first].next, Some(second));
}

#[test]
fn stopping_a_remain_after_exit_unit_runs_exec_stop_under_the_same_invocation() {
    let mut w = one(UnitConfig {
        oneshot: true,
        remain_after_exit: true,
        exec_stop: true,
        exec_stop_post: true,
        ..UnitConfig::default()
    });
    w.apply(Action::Start(0));
    w.apply(Action::Progress(0));
    w.apply(Action::Progress(0));
    let inv = w.units[0].invocation;
    if w.units[0].state != SvcState::Exited {
        return; // this seed's ExecStart failed; another test covers that
    }
    // `unit_prune_cgroup` on entering exited: the cgroup is gone and its path forgotten.
    assert_eq!(w.kernel.read("/app.slice/x.service"), Reading::Gone);
    assert_eq!(read(&mut w, "x.service").control_group, "");
    assert!(w.procs_of(inv).is_empty());
    assert!(
        w.may_start_under(inv),
        "active/exited may still run ExecStop"
    );
    w.apply(Action::Stop(0));
    w.apply(Action::Progress(0));
    assert_eq!(w.units[0].state, SvcState::Stop);
    assert_eq!(
        w.procs_of(inv).len(),
        1,
        "ExecStop runs under the invocation"
    );
    assert_eq!(
        read(&mut w, "x.service").control_group,
        "/app.slice/x.service",
        "ExecStop realizes the cgroup again"
    );
    settle(&mut w);
    assert!(w.over(inv));
    assert_eq!(
        w.units[0].invocation, inv,
        "InvocationID stays after inactive"
    );
}

#[test]
fn garbage_collection_unloads_and_get_unit_says_no_such_unit() {
    let mut w = one(UnitConfig::default());
    w.apply(Action::Start(0));
    settle(&mut w);
    w.apply(Action::Stop(0));
    settle(&mut w);
    assert_eq!(
        read(&mut w, "x.service").control_group,
        "",
        "cgroup removed"
    );
    signals(&mut w);
    assert!(w.candidates(Acting::Chaos).contains(&(4, Action::Gc(0))));
    w.apply(Action::Gc(0));
    let got = signals(&mut w);
    assert!(matches!(&got[..], [(_, SystemdSignal::UnitRemoved { unit })] if unit == "x.service"));
    let s = read(&mut w, "x.service");
    assert!(!s.loaded);
    assert_eq!((s.invocation.as_str(), s.control_group.as_str()), ("", ""));
    w.bus.send("x.service", CallKind::Stop);
    w.apply(Action::ProcessCalls(1));
    assert!(matches!(
        w.bus.replies.pop_back().map(|r| r.answer),
        Some(Answer::Stop(Err(_)))
    ));
}

#[test]
fn an_alias_reads_as_the_real_unit_and_signals_use_the_real_path() {
    let mut w = one(UnitConfig::default());
    w.apply(Action::Start(0));
    let got = signals(&mut w);
    assert!(got.iter().all(|(_, s)| match s {
        SystemdSignal::UnitChanged { path, .. } => *path == unit_path("x.service"),
        _ => true,
    }));
    assert_eq!(read(&mut w, "nick.service").id, "x.service");
}

#[test]
fn an_automatic_restart_passes_through_failed_with_the_old_invocation() {
    for seed in 0..20 {
        let mut w = World::empty(seed);
        let cfg = UnitConfig {
            restart: super::unit::Restart::OnFailure,
            ..UnitConfig::default()
        };
        w.add_unit("x.service", vec![], cfg);
        w.bus.connect();
        w.apply(Action::Start(0));
        settle(&mut w);
        let old = w.units[0].invocation;
        signals(&mut w);
        w.apply(Action::MainExits(0, false));
        settle(&mut w);
        let new = w.units[0].invocation;
        assert_ne!(old, new);
        let seen = states(&signals(&mut w));
        let at = |state: &str, inv: u128| {
            seen.iter()
                .position(|(s, i)| s == state && *i == super::world::hex(inv))
        };
        assert!(at("activating", new).is_some(), "{seen:?}");
        let old_seen = seen
            .iter()
            .all(|(_, i)| *i == super::world::hex(old) || *i == super::world::hex(new));
        assert!(old_seen);
        assert!(at("deactivating", old) < at("activating", new));
        assert!(w.over(old));
        // Each state on its own (`service_set_state` flushes the pending change): failed of
        // the old invocation before auto-restart, then inactive with the NEW invocation
        // (`unit_acquire_invocation_id` before the flush), never inactive with the old one.
        let (o, n) = (super::world::hex(old), super::world::hex(new));
        let want: Vec<(String, String)> = [
            ("deactivating", &o),
            ("failed", &o),
            ("activating", &o),
            ("inactive", &n),
            ("activating", &n),
            ("active", &n),
        ]
        .iter()
        .map(|(s, i)| (s.to_string(), i.to_string()))
        .collect();
        assert_eq!(seen, want, "seed {seed}");
    }
}

#[test]
fn a_reexec_ends_the_connection_and_serials_restart_on_the_new_one() {
    let mut w = one(UnitConfig::default());
    w.apply(Action::Start(0));
    settle(&mut w);
    // Enough traffic that the old connection's serials are well past a new one's first.
    for _ in 0..5 {
        w.apply(Action::Restart(0));
        settle(&mut w);
    }
    signals(&mut w);
    w.apply(Action::Reexec);
    assert!(matches!(w.bus.signals.back(), Some(Msg::SystemdLeft)));
    let before = w
        .bus
        .signals
        .iter()
        .filter_map(|m| match m {
            Msg::Signal(serial, _, _) => Some(*serial),
            Msg::SystemdLeft => None,
        })
        .max()
        .unwrap_or(0);
    let n = w.bus.signals.len();
    w.apply(Action::Stop(0));
    settle(&mut w); // systemd comes back on its own in settle
    assert_eq!(
        w.bus.signals.len(),
        n,
        "nothing reaches the stale subscription"
    );
    w.bus.disconnect_agent();
    assert!(w.bus.connect().is_some());
    w.apply(Action::Start(0));
    w.apply(Action::Progress(0));
    let after = signals(&mut w);
    assert!(
        after.first().is_some_and(|s| s.0 < before),
        "{before} {after:?}"
    );
}

#[test]
fn a_delegated_child_keeps_the_unit_cgroup_populated() {
    let mut w = one(UnitConfig {
        delegate: true,
        kill_process: true,
        ..UnitConfig::default()
    });
    w.apply(Action::Start(0));
    settle(&mut w);
    let main = w.units[0].main_pid.unwrap();
    w.apply(Action::Fork(main));
    let inv = w.units[0].invocation;
    w.apply(Action::MainExits(0, true));
    settle(&mut w);
    assert_eq!(w.kernel.read("/app.slice/x.service"), Reading::Populated);
    assert!(!w.over(inv));
    let child = w.procs_of(inv)[0];
    assert_eq!(
        w.kernel.procs[&child].cgroup,
        "/app.slice/x.service/payload"
    );
}

/// The model's own soundness, over random runs: the oracle's "over" must be final (nothing
/// starts under an invocation once it is over), and signals on one connection carry growing
/// serials.
#[test]
fn over_is_final_and_serials_grow_in_random_runs() {
    for seed in 0..300 {
        let mut w = World::new(seed);
        w.bus.connect();
        let mut over: std::collections::BTreeSet<u128> = Default::default();
        let mut last_serial = 0;
        for step in 0..300 {
            let chaos = step < 200;
            let acting = if chaos {
                Acting::Chaos
            } else {
                Acting::Systemd
            };
            if w.random_step(acting).is_none() && !chaos {
                w.settle(true);
            }
            if w.bus.agent.is_none() || w.rng.percent(10) {
                w.bus.disconnect_agent();
                w.bus.connect();
                last_serial = 0;
            }
            for m in w.bus.signals.drain(..) {
                if let Msg::Signal(serial, _, _) = m {
                    assert!(serial > last_serial, "seed {seed}: serials grow");
                    last_serial = serial;
                }
            }
            w.bus.replies.clear();
            for (&inv, _) in w.history.iter() {
                if over.contains(&inv) {
                    assert!(w.over(inv), "seed {seed} step {step}: {inv:x} came back");
                } else if w.over(inv) {
                    over.insert(inv);
                }
            }
            for p in w.kernel.procs.values() {
                assert!(
                    w.kernel.exists(&p.cgroup),
                    "seed {seed}: a process in no cgroup"
                );
            }
        }
    }
}

/// What systemd reports of an invocation's start and processes: InactiveExitTimestamp stamped
/// when the unit leaves inactive, just after its first fork; MainPID and ControlPID on the
/// Service interface (sent before the Unit interface), in reads too; parents as forked, orphans
/// reparented to the manager; and the driver's census classified by `earlier_processes`.
#[test]
fn a_start_is_stamped_after_its_first_fork_and_its_pids_are_reported() {
    use crate::cgroup::procs::{ClockBasis, NextInvocation, OnceHeld, earlier_processes};

    let cfg = UnitConfig {
        exec_start_pre: true,
        exec_stop: true,
        kill_process: true,
        ..UnitConfig::default()
    };
    let mut w = World::empty(1);
    w.add_unit("x.service", vec![], cfg);
    w.bus.connect();
    w.advance(123_456);
    w.apply(Action::Start(0));
    w.apply(Action::Progress(0));
    let began = w.units[0].inactive_exit_us;
    assert_eq!(began, w.now_us, "stamped when it leaves inactive");
    assert_eq!(w.units[0].state, SvcState::StartPre);
    let pre = w.units[0].control_pid.expect("ExecStartPre runs");
    assert_eq!(w.units[0].main_pid, None);
    let p = &w.kernel.procs[&pre];
    assert_eq!(p.ppid, MANAGER);
    assert!(
        p.start_us <= began && began - p.start_us < 300,
        "forked just before"
    );
    let got = signals(&mut w);
    let service = got.iter().position(|(_, s)| {
        matches!(s, SystemdSignal::UnitChanged { change, .. }
            if change.control_pid == Some(pre) && change.main_pid == Some(0))
    });
    let unit = got.iter().position(|(_, s)| {
        matches!(s, SystemdSignal::UnitChanged { change, .. }
            if change.inactive_exit_us == Some(began) && change.active_state.is_some())
    });
    assert!(service.is_some() && service < unit, "{got:?}");
    let s = read(&mut w, "x.service");
    assert_eq!(
        (s.inactive_exit_us, s.main_pid, s.control_pid),
        (began, 0, pre)
    );

    let mut first = w.units[0].invocation;
    for _ in 0..20 {
        if w.units[0].state == SvcState::Running {
            break;
        }
        w.advance(1000);
        w.apply(Action::Progress(0));
        if w.units[0].state.active_state() == "deactivating" || w.units[0].invocation != first {
            // ExecStartPre= failed: start again.
            settle(&mut w);
            w.apply(Action::Start(0));
            w.apply(Action::Progress(0));
            first = w.units[0].invocation;
        }
    }
    assert_eq!(w.units[0].state, SvcState::Running);
    assert!(!w.kernel.alive(pre), "ExecStartPre exited");
    let main = w.units[0].main_pid.expect("a main process");
    assert_eq!(w.units[0].control_pid, None);
    assert_eq!(w.kernel.procs[&main].ppid, MANAGER);
    w.apply(Action::Fork(main));
    let child = *w.kernel.procs.keys().max().unwrap();
    assert_eq!(w.kernel.procs[&child].ppid, main);
    w.apply(Action::Fork(child));
    let grandchild = *w.kernel.procs.keys().max().unwrap();
    assert_eq!(w.kernel.procs[&grandchild].ppid, child);

    // A stop runs ExecStop= as the control process, then leaves the children behind.
    w.apply(Action::Stop(0));
    w.apply(Action::Progress(0));
    let stop = w.units[0].control_pid.expect("ExecStop runs");
    assert_eq!(read(&mut w, "x.service").control_pid, stop);
    settle(&mut w);
    assert_eq!(w.units[0].state, SvcState::Dead);
    let s = read(&mut w, "x.service");
    assert_eq!((s.main_pid, s.control_pid), (0, 0));
    w.apply(Action::ChildExits(child));
    assert_eq!(
        w.kernel.procs[&grandchild].ppid, MANAGER,
        "orphan reparented"
    );

    // The next invocation starts beside the leftover.
    w.advance(5 * TICK_US);
    w.apply(Action::Start(0));
    w.apply(Action::Progress(0));
    let next_began = w.units[0].inactive_exit_us;
    assert!(next_began > began);
    let next_pre = w.units[0].control_pid.expect("ExecStartPre runs");
    let basis = ClockBasis {
        clk_tck: 100,
        boot_minus_mono_ns: 0,
        ..ClockBasis::default()
    };
    let count = |roots: Vec<i32>, w: &World| -> Vec<i32> {
        let census = census(w, "/app.slice/x.service");
        let next = NextInvocation {
            began_us: Some(next_began),
            roots_began_us: Some(next_began),
            roots,
            gone_roots: vec![],
            once_held: OnceHeld::None,
            counted_roots: vec![],
        };
        let mut pids: Vec<i32> = earlier_processes(&census, &next, &basis, &[])
            .into_iter()
            .map(|p| p.pid)
            .collect();
        pids.sort_unstable();
        pids
    };
    let (gc, np) = (grandchild as i32, next_pre as i32);
    assert_eq!(
        count(vec![], &w),
        vec![gc, np],
        "forked at the stamp's tick or before: not certainly the new invocation's"
    );
    assert_eq!(
        count(vec![np], &w),
        vec![gc],
        "a root is the new invocation's"
    );
    // What the leftover forks later is a leftover too, found by its parent while that lives.
    w.advance(2 * TICK_US);
    w.apply(Action::Fork(grandchild));
    let late = *w.kernel.procs.keys().max().unwrap();
    assert_eq!(w.kernel.procs[&late].invocation, first);
    let mut expected = vec![gc, late as i32];
    expected.sort_unstable();
    assert_eq!(count(vec![np], &w), expected);
}

/// A world of one unit of `cfg` from `seed`, started and driven until systemd has nothing
/// more to do for it.
fn started(seed: u64, cfg: UnitConfig) -> World {
    let mut w = World::empty(seed);
    w.add_unit("x.service", vec![], cfg);
    w.bus.connect();
    w.apply(Action::Start(0));
    settle(&mut w);
    w
}

#[test]
fn a_forking_service_runs_the_daemon_its_exec_start_forked_as_main_pid() {
    let forking = UnitConfig {
        service_type: ServiceType::Forking,
        ..UnitConfig::default()
    };
    let mut w = World::empty(1);
    w.add_unit("x.service", vec![], forking);
    w.bus.connect();
    w.apply(Action::Start(0));
    w.apply(Action::Progress(0));
    assert_eq!(w.units[0].state, SvcState::Start);
    assert_eq!(
        w.units[0].main_pid, None,
        "ExecStart= is the control process"
    );
    let launcher = w.units[0].control_pid.expect("ExecStart= runs");
    w.apply(Action::Progress(0));
    assert!(!w.kernel.alive(launcher), "ExecStart= exits");
    // Over the seeds, the daemon is MainPID from the PID file or guessed, or the start fails.
    let mut daemons = 0;
    for seed in 0..40 {
        let w = started(seed, forking);
        let unit = &w.units[0];
        if unit.state == SvcState::Running
            && let Some(main) = unit.main_pid
        {
            let p = &w.kernel.procs[&main];
            assert_eq!((p.ppid, p.invocation), (MANAGER, unit.invocation));
            daemons += 1;
        }
    }
    assert!(daemons > 20, "{daemons}");
}

#[test]
fn a_forking_start_guesses_an_earlier_invocations_leftover_as_main_pid() {
    // `unit_search_main_pid`: the only process of the cgroup whose parent is the manager.
    let cfg = UnitConfig {
        service_type: ServiceType::Forking,
        kill_process: true,
        ..UnitConfig::default()
    };
    let guessed = (0..400).find_map(|seed| {
        let mut w = started(seed, cfg);
        let first = w.units[0].invocation;
        let main = w.units[0].main_pid?;
        w.apply(Action::Fork(main));
        w.apply(Action::Stop(0));
        settle(&mut w);
        w.apply(Action::Start(0));
        settle(&mut w);
        let main = w.units[0].main_pid?;
        (w.kernel.procs[&main].invocation == first).then_some((w, first, main))
    });
    let (w, first, main) = guessed.expect("some seed's daemon died at once");
    assert!(w.misguessed.contains(&(first, main)));
    assert_ne!(w.units[0].invocation, first);
}

#[test]
fn a_failed_exec_condition_ends_the_unit_inactive_with_no_restart() {
    let cfg = UnitConfig {
        exec_condition: true,
        restart: Restart::Always,
        ..UnitConfig::default()
    };
    let skipped = (0..40)
        .map(|seed| started(seed, cfg))
        .find(|w| w.units[0].result == SKIP_CONDITION)
        .expect("some condition fails");
    let unit = &skipped.units[0];
    assert_eq!(unit.state, SvcState::Dead, "inactive, not failed");
    assert!(skipped.ended(unit.invocation));
    assert!(
        skipped.history.values().all(|r| r.next.is_none()),
        "no restart"
    );
}

#[test]
fn exec_start_post_runs_beside_the_main_process_before_the_unit_is_active() {
    let mut w = one(UnitConfig {
        service_type: ServiceType::Simple,
        exec_start_post: true,
        ..UnitConfig::default()
    });
    w.apply(Action::Start(0));
    w.apply(Action::Progress(0));
    let unit = &w.units[0];
    assert_eq!(
        unit.state,
        SvcState::StartPost,
        "Type=simple has no start state"
    );
    assert_eq!(unit.state.active_state(), "activating");
    assert!(unit.main_pid.is_some() && unit.control_pid.is_some());
}

#[test]
fn a_process_ignoring_sigterm_is_killed_in_stop_sigkill_unless_send_sigkill_is_off() {
    for no_sigkill in [false, true] {
        let cfg = UnitConfig {
            no_sigkill,
            ..UnitConfig::default()
        };
        let mut w = started(1, cfg);
        w.swarm.ignore_sigterm = 100;
        let inv = w.units[0].invocation;
        w.apply(Action::Stop(0));
        let mut states = Vec::new();
        for _ in 0..10 {
            w.settle(false);
            states.push(w.units[0].state);
        }
        assert_eq!(
            states.contains(&SvcState::StopSigkill),
            !no_sigkill,
            "{no_sigkill} {states:?}"
        );
        assert_eq!(w.units[0].state, SvcState::Failed, "result timeout");
        assert_eq!(w.units[0].result, "timeout");
        assert_eq!(w.procs_of(inv).is_empty(), !no_sigkill);
    }
}

#[test]
fn systemctl_clean_forks_under_the_last_invocation_in_maintenance() {
    let mut w = started(1, UnitConfig::default());
    w.apply(Action::Stop(0));
    settle(&mut w);
    let inv = w.units[0].invocation;
    let stopped_at = w.units[0].inactive_exit_us;
    w.advance(1000);
    signals(&mut w);
    w.apply(Action::Clean(0));
    let unit = &w.units[0];
    assert_eq!(unit.state.active_state(), "maintenance");
    assert_eq!(unit.invocation, inv);
    assert!(
        unit.inactive_exit_us > stopped_at,
        "leaving inactive stamps it"
    );
    let helper = unit.control_pid.expect("ControlPID");
    assert_eq!(w.kernel.procs[&helper].invocation, inv);
    assert!(w.over(inv), "systemd's, not the workload's");
    assert!(w.cleaning_under(inv));
    assert_eq!(states(&signals(&mut w)).last().unwrap().0, "maintenance");
    settle(&mut w);
    assert_eq!(w.units[0].state, SvcState::Dead);
    assert!(!w.cleaning_under(inv));
}

#[test]
fn a_suspend_moves_proc_start_times_ahead_of_the_monotonic_clock() {
    let mut w = World::empty(1);
    w.add_unit("x.service", vec![], UnitConfig::default());
    w.apply(Action::Suspend);
    let suspended = w.kernel.suspended_us;
    assert!(suspended > 0);
    w.apply(Action::Start(0));
    w.apply(Action::Progress(0));
    let main = w.units[0].main_pid.expect("main");
    let census = census(&w, "/app.slice/x.service");
    let p = &w.kernel.procs[&main];
    assert_eq!(census[0].start_ticks, (p.start_us + suspended) / TICK_US);
}

#[test]
fn a_scope_takes_processes_that_ran_before_its_invocation_and_ends_when_they_do() {
    let mut w = World::empty(1);
    w.add_unit(
        "run-u0.scope",
        vec![],
        UnitConfig {
            scope: true,
            ..UnitConfig::default()
        },
    );
    w.bus.connect();
    w.advance(5_000_000);
    w.apply(Action::Start(0));
    w.apply(Action::Progress(0));
    let unit = &w.units[0];
    let inv = unit.invocation;
    assert_eq!(unit.state.active_state(), "active");
    assert_eq!(
        (unit.main_pid, unit.control_pid),
        (None, None),
        "no MainPID"
    );
    let pids = w.kernel.pids_in("/app.slice/run-u0.scope");
    assert!(!pids.is_empty());
    for pid in &pids {
        let p = &w.kernel.procs[pid];
        assert!(p.start_us < unit.inactive_exit_us, "attached, not forked");
        assert_eq!(p.invocation, inv);
    }
    assert!(
        states(&signals(&mut w))
            .iter()
            .all(|(state, _)| state != "activating")
    );
    for pid in pids {
        w.apply(Action::ChildExits(pid));
    }
    settle(&mut w);
    assert_eq!(
        w.units[0].state,
        SvcState::Dead,
        "`scope_notify_cgroup_empty_event`"
    );
    assert!(w.over(inv));
}

#[test]
fn an_exec_stop_leftover_waiting_for_the_next_start_forks_then_and_exits() {
    let cfg = UnitConfig {
        exec_stop: true,
        kill_process: true,
        ..UnitConfig::default()
    };
    let mut w = started(3, cfg);
    w.swarm.start_waiters = 100;
    let first = w.units[0].invocation;
    w.apply(Action::Stop(0));
    let mut control = None;
    for _ in 0..10 {
        w.apply(Action::Progress(0));
        control = w.units[0]
            .control_pid
            .filter(|_| w.units[0].state == SvcState::Stop);
        if control.is_some() {
            break;
        }
    }
    let control = control.expect("ExecStop= runs");
    let line = w.apply(Action::Fork(control));
    assert!(line.contains("waits for the next start"), "{line}");
    let waiter = w
        .kernel
        .procs
        .values()
        .find(|p| p.waits_for_start)
        .map(|p| p.pid)
        .expect("the waiter");
    let session = w.kernel.procs[&waiter].session;
    assert_eq!(session, control, "the waiter is in its ExecStop='s session");
    settle(&mut w);
    assert!(w.kernel.alive(waiter), "KillMode=process leaves it");
    w.apply(Action::Start(0));
    let line = w.apply(Action::Progress(0));
    assert!(line.contains(&format!("{waiter} forks")), "{line}");
    let second = w.units[0].invocation;
    assert_ne!(second, first);
    assert!(!w.kernel.alive(waiter));
    let child: Vec<_> = w
        .kernel
        .procs
        .values()
        .filter(|p| p.session == session)
        .collect();
    let [child] = child[..] else {
        panic!("one child in the session: {child:?}");
    };
    assert_eq!((child.ppid, child.invocation), (MANAGER, first));
    assert!(child.start_us >= w.history[&second].began_us);
}

//! How systemd's own dynamics (reloads, re-execs, aliases, restarts beside leftovers, a proven
//! invocation watched again, a stop overtaken by a start) must not fool the agent into a proof,
//! nor make it stop or release what belongs to a newer invocation.
//!
//! Each test checks safety (no proof while a process of our invocation exists, or while systemd
//! may still start one under it) and, where a proof is due, liveness (it does arrive, for our
//! invocation). Waits are generous; nothing here asserts speed. "Not proven for a while" is an
//! observation of a few seconds after a barrier that makes sure the agent has seen the event.

use std::time::Duration;

use serde_json::Value;

use crate::Test;
use crate::support::Sandbox;
use crate::support::agent::Agent;

/// How long a test waits for something real systemd and the kernel will do.
const PATIENCE: Duration = Duration::from_secs(30);
const PATIENCE_ARG: &str = "30s";
/// How long a test watches for a proof that must not come.
const OBSERVE: Duration = Duration::from_secs(3);

pub const TESTS: &[Test] = &[
    (
        "a_leftover_beside_a_restart_blocks_the_proof_until_it_dies",
        a_leftover_beside_a_restart_blocks_the_proof_until_it_dies,
    ),
    (
        "replaced_after_stop_releases_no_generation_and_spares_the_new_invocation",
        replaced_after_stop_releases_no_generation_and_spares_the_new_invocation,
    ),
    (
        "daemon_reload_does_not_prove_a_remain_after_exit_unit",
        daemon_reload_does_not_prove_a_remain_after_exit_unit,
    ),
    (
        "daemon_reexec_does_not_prove_a_remain_after_exit_unit",
        daemon_reexec_does_not_prove_a_remain_after_exit_unit,
    ),
    (
        "daemon_reload_is_no_fact_about_a_running_unit",
        daemon_reload_is_no_fact_about_a_running_unit,
    ),
    (
        "a_unit_watched_by_its_alias_is_proven_under_the_alias",
        a_unit_watched_by_its_alias_is_proven_under_the_alias,
    ),
    (
        "watching_a_proven_invocation_again_answers_its_proof_and_spares_the_next",
        watching_a_proven_invocation_again_answers_its_proof_and_spares_the_next,
    ),
    (
        "a_transient_unit_collected_after_it_ended_is_proven",
        a_transient_unit_collected_after_it_ended_is_proven,
    ),
    (
        "a_unit_restarting_while_it_is_read_is_never_proven_while_it_runs",
        a_unit_restarting_while_it_is_read_is_never_proven_while_it_runs,
    ),
];

/// A shell command that waits until the file `go` exists: the test decides when it ends.
pub(super) fn until(go: &str) -> String {
    format!("while [ ! -e {go} ]; do sleep 0.05; done")
}

/// Releases a unit waiting in [`until`].
fn go(sandbox: &Sandbox, go: &str) {
    std::fs::write(sandbox.host_path(go), "").expect("write the go file");
}

/// Waits until `unit` runs an invocation other than `old`, active, and returns it.
pub(super) fn wait_for_new_invocation(sandbox: &Sandbox, unit: &str, old: &str) -> String {
    sandbox.wait_until(&format!("{unit} runs a new invocation"), PATIENCE, || {
        sandbox.show(unit, "ActiveState") == "active" && sandbox.show(unit, "InvocationID") != old
    });
    sandbox.show(unit, "InvocationID")
}

/// Asserts, for `period`, that `unit` stays active with the invocation `invocation`: nobody
/// (the agent above all) stopped or replaced it.
fn assert_stays_active(sandbox: &Sandbox, agent: &Agent, unit: &str, invocation: &str) {
    let deadline = std::time::Instant::now() + OBSERVE;
    while std::time::Instant::now() < deadline {
        let state = sandbox.show(unit, "ActiveState");
        let now = sandbox.show(unit, "InvocationID");
        assert!(
            state == "active" && now == invocation,
            "{unit} ({invocation}) must keep running, but is {state} with invocation {now:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = agent.log_text();
    assert!(
        !stopped_after_proof(&log, unit),
        "the agent stopped {unit} after its proof: {:?}",
        lines_with(&log, &format!("{unit}: stopping"))
    );
}

/// The lines of `log` that contain `needle`.
pub(super) fn lines_with<'a>(log: &'a str, needle: &str) -> Vec<&'a str> {
    log.lines().filter(|l| l.contains(needle)).collect()
}

/// Whether the agent's log shows a stop of `unit` issued at or after its proof.
fn stopped_after_proof(log: &str, unit: &str) -> bool {
    let proven = format!("{unit}: proven");
    let stopping = format!("{unit}: stopping");
    log.lines()
        .skip_while(|l| !l.contains(&proven))
        .any(|l| l.contains(&stopping))
}

/// `Type=oneshot`, `RemainAfterExit=yes`: active/exited with an empty cgroup after ExecStart,
/// and an ExecStop that runs under the same invocation until the test releases it.
const REMAIN_AFTER_EXIT: &str = "[Service]\nType=oneshot\nRemainAfterExit=yes\n\
     ExecStart=/bin/true\n\
     ExecStop=/bin/sh -c 'while [ ! -e /run/kept.go ]; do sleep 0.05; done'\n";

fn daemon_reload_does_not_prove_a_remain_after_exit_unit() {
    remain_after_exit_survives("daemon-reload");
}

fn daemon_reexec_does_not_prove_a_remain_after_exit_unit() {
    remain_after_exit_survives("daemon-reexec");
}

/// A RemainAfterExit unit has no process left but is not over: its ExecStop= will still run
/// under the same invocation. A reload (or reexec), which signals UnitRemoved for every unit,
/// must not prove it; the stop that follows must, once ExecStop= is done.
fn remain_after_exit_survives(verb: &str) {
    let sandbox = Sandbox::start("remain");
    sandbox.install_unit("kept.service", REMAIN_AFTER_EXIT);
    sandbox.systemctl_ok(&["start", "kept.service"]);
    let agent = Agent::start(&sandbox);
    let ours = sandbox.show("kept.service", "InvocationID");
    let watch = agent.one(&["watch", "kept.service"]);
    assert_eq!(watch["phase"], "watching", "{watch}");
    assert_eq!(watch["active_state"], "active", "{watch}");
    assert_eq!(watch["sub_state"], "exited", "{watch}");
    assert_eq!(watch["invocation"], ours.as_str(), "{watch}");

    sandbox.systemctl_ok(&[verb]);
    sandbox.wait_until("the manager is back", PATIENCE, || {
        let state = sandbox.systemctl(&["is-system-running"]);
        let state = String::from_utf8_lossy(&state.stdout);
        state.trim() == "running" || state.trim() == "degraded"
    });
    // The unit was never gone, nor was its invocation over.
    assert_eq!(sandbox.show("kept.service", "ActiveState"), "active");
    assert_eq!(sandbox.show("kept.service", "InvocationID"), ours);
    agent.barrier();
    agent.assert_unproven_for(
        "kept.service",
        OBSERVE,
        &format!("it is active/exited after a {verb} and its ExecStop= has yet to run"),
    );

    sandbox.systemctl_ok(&["stop", "--no-block", "kept.service"]);
    sandbox.wait_until("ExecStop= runs", PATIENCE, || {
        sandbox.show("kept.service", "ActiveState") == "deactivating"
    });
    agent.assert_unproven_for(
        "kept.service",
        OBSERVE,
        "its ExecStop= runs under our invocation",
    );
    assert_eq!(
        sandbox.show("kept.service", "ActiveState"),
        "deactivating",
        "ExecStop= still runs, so the observation above counts"
    );

    go(&sandbox, "/run/kept.go");
    let event = agent.one(&["wait", "kept.service", "--timeout", PATIENCE_ARG]);
    assert_eq!(event["cause"], "exited", "{event}");
    assert_eq!(event["invocation"], ours.as_str(), "{event}");
    assert_eq!(sandbox.show("kept.service", "ActiveState"), "inactive");
}

/// A reload signals UnitRemoved and UnitNew for every unit; for a running unit, that is no
/// fact at all: no proof, and no "processes remain after inactive" either (the unit was never
/// inactive). The proof of its real end still comes.
fn daemon_reload_is_no_fact_about_a_running_unit() {
    let sandbox = Sandbox::start("reloadrun");
    sandbox.install_unit("runs.service", "[Service]\nExecStart=/bin/sleep infinity\n");
    sandbox.systemctl_ok(&["start", "runs.service"]);
    let agent = Agent::start(&sandbox);
    let ours = sandbox.show("runs.service", "InvocationID");
    let watch = agent.one(&["watch", "runs.service"]);
    assert_eq!(watch["active_state"], "active", "{watch}");

    sandbox.systemctl_ok(&["daemon-reload"]);
    agent.barrier();
    agent.assert_unproven_for("runs.service", OBSERVE, "it runs through a daemon-reload");
    let log = agent.log_text();
    let remain = lines_with(&log, "runs.service: processes remain");
    assert!(
        remain.is_empty(),
        "a reload made the agent take a running unit for inactive: {remain:?}"
    );
    let entry = agent.entry("runs.service").expect("still watched");
    assert_eq!(entry["active_state"], "active", "{entry}");
    assert_eq!(entry["invocation"], ours.as_str(), "{entry}");

    sandbox.systemctl_ok(&["kill", "-s", "KILL", "runs.service"]);
    let event = agent.one(&["wait", "runs.service", "--timeout", PATIENCE_ARG]);
    assert_eq!(event["cause"], "exited", "{event}");
    assert_eq!(event["invocation"], ours.as_str(), "{event}");
}

/// systemd signals an alias's changes under the real unit's name and object path; a client
/// that watches the alias must still get the proof, under the name it used.
fn a_unit_watched_by_its_alias_is_proven_under_the_alias() {
    let sandbox = Sandbox::start("alias");
    sandbox.install_unit(
        "real1.service",
        "[Service]\nExecStart=/bin/sleep infinity\n",
    );
    sandbox.install_alias("nick.service", "real1.service");
    sandbox.systemctl_ok(&["start", "real1.service"]);
    let agent = Agent::start(&sandbox);
    let ours = sandbox.show("real1.service", "InvocationID");
    assert_eq!(sandbox.show("nick.service", "Id"), "real1.service");
    let watch = agent.one(&["watch", "nick.service"]);
    assert_eq!(watch["unit"], "nick.service", "{watch}");
    assert_eq!(watch["invocation"], ours.as_str(), "{watch}");
    agent.assert_unproven_for("nick.service", OBSERVE, "real1.service runs");

    sandbox.systemctl_ok(&["kill", "-s", "KILL", "real1.service"]);
    let out = agent.cli(&["--json", "wait", "nick.service", "--timeout", PATIENCE_ARG]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "no proof of nick.service (an alias of real1.service) {PATIENCE:?} after real1 was \
         killed ({} now): {out:?}",
        sandbox.show("real1.service", "ActiveState")
    );
    let event: Value = serde_json::from_slice(&out.stdout).expect("a proof event");
    assert_eq!(event["unit"], "nick.service", "{event}");
    assert_eq!(event["invocation"], ours.as_str(), "{event}");
    assert_eq!(event["cause"], "exited", "{event}");
}

/// A client that asks again about an invocation already proven (a retry, a restarted control
/// side) gets that proof; the unit's next invocation is none of its business and must not be
/// stopped as foreign.
fn watching_a_proven_invocation_again_answers_its_proof_and_spares_the_next() {
    let sandbox = Sandbox::start("rewatch");
    sandbox.install_unit(
        "again.service",
        "[Service]\nExecStart=/bin/sleep infinity\n",
    );
    sandbox.systemctl_ok(&["start", "again.service"]);
    let agent = Agent::start(&sandbox);
    let first = sandbox.show("again.service", "InvocationID");
    agent.one(&["watch", "again.service"]);
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "again.service"]);
    let proof = agent.one(&["wait", "again.service", "--timeout", PATIENCE_ARG]);
    assert_eq!(proof["invocation"], first.as_str(), "{proof}");

    sandbox.systemctl_ok(&["start", "again.service"]);
    let second = wait_for_new_invocation(&sandbox, "again.service", &first);
    let watch = agent.one(&["watch", "again.service", "--invocation", &first]);
    assert_stays_active(&sandbox, &agent, "again.service", &second);
    let log = agent.log_text();
    let stops = lines_with(&log, "again.service: stopping");
    assert!(
        stops.is_empty(),
        "the agent stopped the next invocation: {stops:?}"
    );
    assert_eq!(watch["invocation"], first.as_str(), "{watch}");
    assert_eq!(watch["phase"], "proven", "{watch}");
    assert_eq!(watch["proof"], proof, "{watch}");
    let mut event = agent.one(&["wait", "again.service", "--timeout", PATIENCE_ARG]);
    // The answer says which invocation runs now, beside the proof.
    let now_running = event.as_object_mut().and_then(|e| e.remove("now_running"));
    assert_eq!(now_running, Some(second.as_str().into()), "{event}");
    assert_eq!(event, proof);
}

/// A generation's files (its launch file, and through a final stop the control side's) are
/// released only on the two cgroup-based proofs, `exited` and `restarted-outside`. A stop of
/// ours overtaken by a start proves our invocation `replaced-after-stop`: that must release
/// nothing, and must not stop the new invocation.
fn replaced_after_stop_releases_no_generation_and_spares_the_new_invocation() {
    let sandbox = Sandbox::start("genreplaced");
    sandbox.install_unit(
        "slow.service",
        &format!(
            "[Service]\nExecStart=/bin/sleep infinity\nExecStop=/bin/sh -c '{}'\n",
            until("/run/slow.go")
        ),
    );
    sandbox.systemctl_ok(&["start", "slow.service"]);
    let agent = Agent::start(&sandbox);
    let ours = sandbox.show("slow.service", "InvocationID");
    let launch = sandbox.host_path("/run/launch-1.env");
    std::fs::write(&launch, "A=1\n").expect("write the launch file");
    agent.one(&[
        "watch",
        "slow.service",
        "--gen",
        "1",
        "--launch-file",
        "/run/launch-1.env",
    ]);
    // Our stop: its ExecStop= holds the unit in deactivating.
    let out = agent.cli(&["stop", "slow.service", "--timeout", "1s"]);
    assert_eq!(out.status.code(), Some(75), "ExecStop= still runs: {out:?}");
    sandbox.wait_until("our StopUnit was accepted", PATIENCE, || {
        agent
            .log_text()
            .contains("slow.service: stop (requested) accepted")
    });
    assert_eq!(sandbox.show("slow.service", "ActiveState"), "deactivating");

    // A start overtakes our stop; the agent, paused, sees it all only once the new invocation
    // runs, so it cannot prove `exited` from an empty cgroup in between.
    let second = {
        let _paused = agent.pause();
        sandbox.systemctl_ok(&["start", "--no-block", "slow.service"]);
        go(&sandbox, "/run/slow.go");
        wait_for_new_invocation(&sandbox, "slow.service", &ours)
    };
    let event = agent.one(&["wait", "slow.service", "--timeout", PATIENCE_ARG]);
    assert_eq!(event["invocation"], ours.as_str(), "{event}");
    assert_eq!(event["gen"], 1, "{event}");
    assert_stays_active(&sandbox, &agent, "slow.service", &second);
    let log = agent.log_text();
    let stops = lines_with(&log, "slow.service: stopping (");
    assert_eq!(
        stops.len(),
        1,
        "only our requested stop, never one of the new invocation: {stops:?}"
    );
    match event["cause"].as_str() {
        Some("replaced-after-stop") => assert!(
            launch.exists(),
            "a replaced-after-stop proof removed the generation's launch file: {event}"
        ),
        Some("exited" | "restarted-outside") => {
            assert!(!launch.exists(), "the launch file stays after {event}")
        }
        _ => panic!("an unknown cause: {event}"),
    }
}

/// `KillMode=process`: our stop kills only the main process, the unit goes inactive with a
/// leftover in its cgroup, and a new start runs beside it ("Found left-over process ...
/// Ignoring"). Our invocation is not over while its leftover lives, new invocation or not;
/// once it dies, the proof comes, and the new invocation keeps running.
fn a_leftover_beside_a_restart_blocks_the_proof_until_it_dies() {
    let sandbox = Sandbox::start("leftrestart");
    sandbox.install_unit(
        "lingers.service",
        "[Service]\nKillMode=process\nExecStart=/bin/sh -c 'sleep 1000 & exec sleep 1000'\n",
    );
    sandbox.systemctl_ok(&["start", "lingers.service"]);
    let agent = Agent::start(&sandbox);
    let ours = sandbox.show("lingers.service", "InvocationID");
    let cgroup = sandbox.show("lingers.service", "ControlGroup");
    agent.one(&["watch", "lingers.service"]);
    let out = agent.cli(&["stop", "lingers.service", "--timeout", "2s"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "the leftover blocks the proof: {out:?}"
    );
    sandbox.wait_until("the main process is stopped", PATIENCE, || {
        matches!(
            sandbox.show("lingers.service", "ActiveState").as_str(),
            "inactive" | "failed"
        )
    });
    let leftovers = sandbox.cgroup_pids(&cgroup);
    assert!(!leftovers.is_empty(), "the background sleep is left over");

    sandbox.systemctl_ok(&["start", "lingers.service"]);
    let second = wait_for_new_invocation(&sandbox, "lingers.service", &ours);
    agent.barrier();
    agent.assert_unproven_for(
        "lingers.service",
        OBSERVE,
        &format!("our invocation's leftover {leftovers:?} lives beside the new invocation"),
    );
    let pids = sandbox.cgroup_pids(&cgroup);
    assert!(
        leftovers.iter().all(|pid| pids.contains(pid)),
        "the leftover {leftovers:?} still lives in {pids:?}, so the observation counts"
    );

    for pid in &leftovers {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill the leftover");
    }
    let event = agent.one(&["wait", "lingers.service", "--timeout", PATIENCE_ARG]);
    assert_eq!(event["invocation"], ours.as_str(), "{event}");
    assert_stays_active(&sandbox, &agent, "lingers.service", &second);
    let log = agent.log_text();
    let stops = lines_with(&log, "lingers.service: stopping (");
    assert_eq!(
        stops.len(),
        1,
        "only our requested stop, never one of the new invocation: {stops:?}"
    );
}

/// A transient unit is garbage-collected (UnitRemoved) soon after it ends; an agent that only
/// hears of it all at once, end and removal, still proves it, from its cached cgroup.
fn a_transient_unit_collected_after_it_ended_is_proven() {
    let sandbox = Sandbox::start("collected");
    let agent = Agent::start(&sandbox);
    let out = sandbox.run(
        "systemd-run",
        &[
            "--user",
            "--unit=brief.service",
            "sh",
            "-c",
            &until("/run/brief.go"),
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let ours = sandbox.show("brief.service", "InvocationID");
    agent.one(&["watch", "brief.service"]);
    {
        let _paused = agent.pause();
        go(&sandbox, "/run/brief.go");
        sandbox.wait_until("brief.service is collected", PATIENCE, || {
            sandbox.show("brief.service", "LoadState") != "loaded"
        });
    }
    let event = agent.one(&["wait", "brief.service", "--timeout", PATIENCE_ARG]);
    assert_eq!(event["cause"], "exited", "{event}");
    assert_eq!(event["invocation"], ours.as_str(), "{event}");
}

/// The agent reads a unit's properties one by one, so a unit that restarts in the middle of a
/// read must not lend one invocation's state to another: a watch made while the unit restarts
/// again and again must adopt an invocation and prove it only once it has ended. After each
/// proof, systemd is asked (in one call, one moment's answer) whether the proven invocation is
/// still the unit's and running. The simulator provokes the exact interleavings; this is the
/// same rule against real systemd's timing.
fn a_unit_restarting_while_it_is_read_is_never_proven_while_it_runs() {
    let sandbox = Sandbox::start("churn");
    sandbox.install_unit(
        "churn.service",
        "[Unit]\nStartLimitIntervalSec=0\n\
         [Service]\nExecStart=/bin/sleep 0.05\nRestart=always\nRestartSec=0\n",
    );
    sandbox.systemctl_ok(&["start", "churn.service"]);
    let agent = Agent::start(&sandbox);
    let mut proven = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let watch = agent.one(&["watch", "churn.service"]);
        let ours = watch["invocation"].as_str().unwrap_or_default().to_owned();
        let proof = agent.one(&["wait", "churn.service", "--timeout", PATIENCE_ARG]);
        let now = sandbox.systemctl(&[
            "show",
            "-p",
            "InvocationID",
            "-p",
            "ActiveState",
            "-p",
            "SubState",
            "churn.service",
        ]);
        let now = String::from_utf8_lossy(&now.stdout).into_owned();
        assert_eq!(proof["invocation"], ours.as_str(), "{watch} then {proof}");
        assert!(
            !(now.contains(&format!("InvocationID={ours}\n"))
                && now.contains("ActiveState=active\n")),
            "proven while it runs: {proof}; systemd says {now}"
        );
        proven.insert(ours);
        agent.cli_json(&["unwatch", "churn.service"], 0);
    }
    sandbox.systemctl_ok(&["stop", "churn.service"]);
    assert!(
        proven.len() > 1,
        "the unit never restarted between watches: {proven:?}"
    );
}

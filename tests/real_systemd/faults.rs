//! Faults in the sources, against real systemd: each scenario checks the invariant (no proof
//! while any process of the unit lives) and that every unit that died is eventually proven.

use std::time::Duration;

use serde_json::Value;

use crate::Test;
use crate::support::Sandbox;
use crate::support::agent::Agent;
use crate::support::sandbox::cgroup_kill;

const PATIENCE: Duration = Duration::from_secs(60);
const PATIENCE_ARG: &str = "60s";

pub const TESTS: &[Test] = &[
    (
        "a_watch_saved_in_another_boot_is_proven_and_its_unit_left_alone",
        a_watch_saved_in_another_boot_is_proven_and_its_unit_left_alone,
    ),
    (
        "the_safety_net_relist_catches_a_missed_event",
        the_safety_net_relist_catches_a_missed_event,
    ),
    (
        "the_agent_runs_as_a_notify_service_with_a_watchdog",
        the_agent_runs_as_a_notify_service_with_a_watchdog,
    ),
    (
        "a_sigkilled_agent_loses_no_watch_and_makes_no_early_proof",
        a_sigkilled_agent_loses_no_watch_and_makes_no_early_proof,
    ),
    (
        "a_corrupt_state_file_is_moved_aside_loudly",
        a_corrupt_state_file_is_moved_aside_loudly,
    ),
    (
        "a_watch_whose_save_fails_is_never_answered_and_the_agent_stops",
        a_watch_whose_save_fails_is_never_answered_and_the_agent_stops,
    ),
    (
        "a_killed_dbus_daemon_loses_no_proof_and_makes_none_early",
        a_killed_dbus_daemon_loses_no_proof_and_makes_none_early,
    ),
    (
        "daemon_reexec_loses_nothing_and_proves_nothing_early",
        daemon_reexec_loses_nothing_and_proves_nothing_early,
    ),
    (
        "a_process_in_a_delegated_child_cgroup_blocks_the_proof",
        a_process_in_a_delegated_child_cgroup_blocks_the_proof,
    ),
    (
        "an_unreadable_cgroup_events_blocks_the_proof_until_readable",
        an_unreadable_cgroup_events_blocks_the_proof_until_readable,
    ),
];

fn one(agent: &Agent, args: &[&str]) -> Value {
    let mut lines = agent.cli_json(args, 0);
    assert_eq!(lines.len(), 1, "{lines:?}");
    lines.remove(0)
}

fn sleeper(sandbox: &Sandbox, unit: &str) {
    let out = sandbox.run(
        "systemd-run",
        &["--user", &format!("--unit={unit}"), "sleep", "1000"],
    );
    assert!(out.status.success(), "{out:?}");
}

/// Asserts that `unit` is not proven: `wait` gives up with 75.
fn assert_unproven(agent: &Agent, unit: &str) {
    let out = agent.cli(&["wait", unit, "--timeout", "1s"]);
    assert_eq!(out.status.code(), Some(75), "{unit} proven early: {out:?}");
}

/// How long the sandbox's systemd 252 was seen not to answer on its private socket after
/// dbus-daemon was killed (its default method timeout).
const MANAGER_STALL: Duration = Duration::from_secs(90);

/// SIGKILLs the sandbox's session bus (`dbus-daemon`): the agent loses its connection, and
/// every signal until it is back. systemd socket-activates the bus again on the next connect.
pub(super) fn kill_the_bus(sandbox: &Sandbox) {
    let bus_pid: i32 = sandbox
        .show("dbus.service", "MainPID")
        .parse()
        .expect("dbus-daemon's pid");
    assert!(bus_pid > 0, "dbus-daemon runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(bus_pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill dbus-daemon");
}

/// Waits until the agent noticed the bus was gone and is back on it.
pub(super) fn wait_back_on_the_bus(sandbox: &Sandbox, agent: &Agent) {
    sandbox.wait_until("the agent notices the bus is gone", PATIENCE, || {
        agent.log_text().contains("every unit's state is unknown")
    });
    // Seen here with the sandbox's systemd 252: a connection that reaches dbus.socket around
    // dbus-daemon's death can wait in the socket's backlog, unactivated, until something else
    // wakes the manager, however often the agent connects again (about one run in three). A
    // request over the manager's private socket (systemctl) is such a wake; the agent's own
    // reconnect attempts go on meanwhile. In about one run in six the manager itself does not
    // answer that request for 90 s (systemctl then fails with "Transport endpoint is not
    // connected"), so a failed wake is only retried, and this wait outlasts the manager's
    // stall.
    sandbox.wait_until(
        "the agent is back on the bus",
        MANAGER_STALL + PATIENCE,
        || {
            sandbox.systemctl(&["show", "-p", "ActiveState", "dbus.service"]);
            agent.log_text().contains("back on the bus")
        },
    );
}

fn a_killed_dbus_daemon_loses_no_proof_and_makes_none_early() {
    let sandbox = Sandbox::start("dbuskill");
    let agent = Agent::start(&sandbox);
    sleeper(&sandbox, "alive.service");
    sleeper(&sandbox, "doomed.service");
    one(&agent, &["watch", "alive.service"]);
    one(&agent, &["watch", "doomed.service"]);
    let doomed = sandbox.unit_cgroup_dir("doomed.service");

    kill_the_bus(&sandbox);
    // While the bus is down, a unit dies: no signal can tell the agent.
    cgroup_kill(&doomed);
    wait_back_on_the_bus(&sandbox, &agent);
    // The bus comes back when something connects to its socket (systemd socket-activates it),
    // and the agent's reconnect is such a thing.
    let event = one(
        &agent,
        &["wait", "doomed.service", "--timeout", PATIENCE_ARG],
    );
    assert_eq!(event["cause"], "exited", "{event}");
    assert!(
        agent.log_text().contains("back on the bus"),
        "{}",
        agent.log_text()
    );
    assert_unproven(&agent, "alive.service");
    cgroup_kill(&sandbox.unit_cgroup_dir("alive.service"));
    let event = one(
        &agent,
        &["wait", "alive.service", "--timeout", PATIENCE_ARG],
    );
    assert_eq!(event["cause"], "exited", "{event}");
}

fn daemon_reexec_loses_nothing_and_proves_nothing_early() {
    let sandbox = Sandbox::start("reexec");
    let agent = Agent::start(&sandbox);
    sleeper(&sandbox, "before.service");
    sleeper(&sandbox, "stays.service");
    one(&agent, &["watch", "before.service"]);
    one(&agent, &["watch", "stays.service"]);
    sandbox.systemctl_ok(&["daemon-reexec"]);
    sandbox.wait_until("the manager is back", PATIENCE, || {
        let state = sandbox.systemctl(&["is-system-running"]);
        let state = String::from_utf8_lossy(&state.stdout);
        state.trim() == "running" || state.trim() == "degraded"
    });
    assert_unproven(&agent, "before.service");
    assert_unproven(&agent, "stays.service");
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "before.service"]);
    let event = one(
        &agent,
        &["wait", "before.service", "--timeout", PATIENCE_ARG],
    );
    assert_eq!(event["cause"], "exited", "{event}");
    assert_unproven(&agent, "stays.service");
    let entry = agent.entry("stays.service").expect("still watched");
    assert_eq!(entry["phase"], "watching", "{entry}");
    assert_eq!(entry["active_state"], "active", "{entry}");
}

fn a_process_in_a_delegated_child_cgroup_blocks_the_proof() {
    let sandbox = Sandbox::start("delegate");
    let agent = Agent::start(&sandbox);
    // The child moves itself into a cgroup below the unit's own: the unit's cgroup.procs is
    // then empty, but `populated` counts descendants.
    // A script file, since systemd would expand the `$` of a command line itself.
    let script = "cg=$(grep ^0:: /proc/self/cgroup | cut -d: -f3)\n\
                  mkdir /sys/fs/cgroup$cg/leaf\n\
                  sh -c \"echo \\$\\$ > /sys/fs/cgroup$cg/leaf/cgroup.procs; exec sleep 1000\" &\n\
                  while [ ! -e /run/delegate.go ]; do sleep 0.05; done\n";
    std::fs::write(sandbox.host_path("/run/delegate.sh"), script).expect("write the script");
    let out = sandbox.run(
        "systemd-run",
        &[
            "--user",
            "--unit=delegated.service",
            "-p",
            "Delegate=yes",
            "-p",
            "KillMode=process",
            "sh",
            "/run/delegate.sh",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    one(&agent, &["watch", "delegated.service"]);
    let dir = sandbox.unit_cgroup_dir("delegated.service");
    let leaf = dir.join("leaf");
    sandbox.wait_until("the child is in the leaf cgroup", PATIENCE, || {
        std::fs::read_to_string(leaf.join("cgroup.procs")).is_ok_and(|p| !p.trim().is_empty())
    });
    std::fs::write(sandbox.host_path("/run/delegate.go"), "").expect("go");
    sandbox.wait_until("the main process exits", PATIENCE, || {
        matches!(
            sandbox.show("delegated.service", "ActiveState").as_str(),
            "inactive" | "failed"
        )
    });
    assert_unproven(&agent, "delegated.service");
    let procs = std::fs::read_to_string(leaf.join("cgroup.procs")).expect("leaf procs");
    for pid in procs.split_whitespace() {
        let pid: i32 = pid.parse().expect("a pid");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let event = one(
        &agent,
        &["wait", "delegated.service", "--timeout", PATIENCE_ARG],
    );
    assert_eq!(event["cause"], "exited", "{event}");
}

/// Hides `unit`'s cgroup from the agent behind a directory whose `cgroup.events` holds
/// `events` (a bind mount inside the sandbox's namespace only, where the agent reads; being a
/// mount point, the real directory cannot be removed by systemd either), kills the real
/// cgroup from outside, and waits until systemd sees the unit dead. Returns the mount point.
fn kill_behind_a_fake_cgroup(sandbox: &Sandbox, unit: &str, events: &str) -> String {
    let cgroup = sandbox.show(unit, "ControlGroup");
    let real_dir = sandbox.unit_cgroup_dir(unit);
    let inner_dir = format!("/sys/fs/cgroup{cgroup}");
    let fake = format!("/run/fake-{unit}");
    std::fs::create_dir_all(sandbox.host_path(&fake)).unwrap();
    std::fs::write(sandbox.host_path(&format!("{fake}/cgroup.events")), events).unwrap();
    let out = sandbox.run("mount", &["--bind", &fake, &inner_dir]);
    assert!(out.status.success(), "{out:?}");
    cgroup_kill(&real_dir);
    sandbox.wait_until("systemd sees the unit dead", PATIENCE, || {
        matches!(
            sandbox.show(unit, "ActiveState").as_str(),
            "inactive" | "failed"
        )
    });
    inner_dir
}

fn an_unreadable_cgroup_events_blocks_the_proof_until_readable() {
    let sandbox = Sandbox::start("unreadable");
    let agent = Agent::start(&sandbox);
    sleeper(&sandbox, "hidden.service");
    one(&agent, &["watch", "hidden.service"]);
    let inner_dir =
        kill_behind_a_fake_cgroup(&sandbox, "hidden.service", "not a cgroup.events file\n");
    assert_unproven(&agent, "hidden.service");
    assert!(
        agent.log_text().contains("cgroup.events"),
        "{}",
        agent.log_text()
    );
    let out = sandbox.run("umount", &[&inner_dir]);
    assert!(out.status.success(), "{out:?}");
    // Nothing notifies a read error going away: the retry timer finds it readable.
    let event = one(
        &agent,
        &["wait", "hidden.service", "--timeout", PATIENCE_ARG],
    );
    assert_eq!(event["cause"], "exited", "{event}");
}

fn a_sigkilled_agent_loses_no_watch_and_makes_no_early_proof() {
    const UNITS: usize = 50;
    let sandbox = Sandbox::start("agentkill");
    sandbox.install_unit("w@.service", "[Service]\nExecStart=/bin/sleep 1000\n");
    let names: Vec<String> = (0..UNITS).map(|i| format!("w@{i}.service")).collect();
    let mut start = vec!["start"];
    start.extend(names.iter().map(String::as_str));
    sandbox.systemctl_ok(&start);
    sandbox.install_unit(
        "stopped.service",
        "[Service]\nKillMode=process\nExecStart=/bin/sh -c 'sleep 1000 & exec sleep 1000'\n",
    );
    sandbox.systemctl_ok(&["start", "stopped.service"]);

    let mut agent = Agent::start(&sandbox);
    for name in &names {
        one(&agent, &["watch", name]);
    }
    let ours = sandbox.show("stopped.service", "InvocationID");
    one(&agent, &["watch", "stopped.service"]);
    // A stop whose proof is blocked by a leftover child: it must stay requested across the
    // restart, and so must the leftover, so a new invocation beside it proves nothing.
    let out = agent.cli(&["stop", "stopped.service", "--timeout", "1s"]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    agent.kill_hard();

    let (dying, living) = names.split_at(UNITS / 2);
    let mut kill = vec!["kill", "-s", "KILL"];
    kill.extend(dying.iter().map(String::as_str));
    sandbox.systemctl_ok(&kill);
    sandbox.systemctl_ok(&["start", "stopped.service"]);
    assert_ne!(sandbox.show("stopped.service", "InvocationID"), ours);

    let agent = Agent::start(&sandbox);
    for name in dying {
        let event = one(&agent, &["wait", name, "--timeout", PATIENCE_ARG]);
        assert_eq!(event["cause"], "exited", "{event}");
    }
    // The new invocation runs beside our leftover: no proof until it is gone too.
    assert_unproven(&agent, "stopped.service");
    let list = agent.list();
    for name in living {
        let entry = list
            .iter()
            .find(|u| u["unit"] == name.as_str())
            .expect("still watched");
        assert_eq!(entry["phase"], "watching", "{entry}");
    }
    assert_unproven(&agent, &living[0]);
    let mut kill = vec!["kill", "-s", "KILL"];
    kill.extend(living.iter().map(String::as_str));
    sandbox.systemctl_ok(&kill);
    for name in living {
        let event = one(&agent, &["wait", name, "--timeout", PATIENCE_ARG]);
        assert_eq!(event["cause"], "exited", "{event}");
    }
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "stopped.service"]);
    let event = one(
        &agent,
        &["wait", "stopped.service", "--timeout", PATIENCE_ARG],
    );
    assert_eq!(event["cause"], "replaced-after-stop", "{event}");
    assert_eq!(event["invocation"], ours.as_str());
}

fn a_corrupt_state_file_is_moved_aside_loudly() {
    let sandbox = Sandbox::start("corrupt");
    let dir = sandbox.host_path(crate::support::agent::STATE_DIR);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("state.json"),
        "{\"version\":1,\"watches\":[{\"unit\":",
    )
    .unwrap();
    let agent = Agent::start(&sandbox);
    assert!(agent.list().is_empty());
    let log = agent.log_text();
    assert!(
        log.contains("is corrupt") && log.contains("moved it aside"),
        "{log}"
    );
    let aside: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("state.json.corrupt-")
        })
        .collect();
    assert_eq!(aside.len(), 1, "moved aside, not deleted");
}

fn a_watch_whose_save_fails_is_never_answered_and_the_agent_stops() {
    let sandbox = Sandbox::start("save-fails");
    sandbox.install_unit("held.service", "[Service]\nExecStart=/bin/sleep 1000\n");
    sandbox.systemctl_ok(&["start", "held.service"]);
    // A state directory of four pages: the lock file (the holder's pid), the snapshot and the
    // journal's header take three at start (and the four at once while the journal is
    // started), so the append of a watch longer than two pages finds the file system full (as
    // root, a read-only directory would not stop a write, nor would it stop an open journal).
    let out = sandbox.run("mkdir", &["-p", crate::support::agent::STATE_DIR]);
    assert!(out.status.success(), "mkdir: {out:?}");
    let out = sandbox.run(
        "mount",
        &[
            "-t",
            "tmpfs",
            "-o",
            "size=16k,mode=0700",
            "tmpfs",
            crate::support::agent::STATE_DIR,
        ],
    );
    assert!(out.status.success(), "mount: {out:?}");
    let mut agent = Agent::start(&sandbox);
    let launch_file = format!("/run/{}launch-1", "a-long-directory-name/".repeat(500));
    let mut conn = agent.connect();
    conn.send_raw(
        format!(
            "{{\"id\":1,\"cmd\":\"watch\",\"unit\":\"held.service\",\"gen\":1,\
             \"launch_file\":\"{launch_file}\"}}\n"
        )
        .as_bytes(),
    );
    let answer = conn.read_unless_closed();
    assert_eq!(answer, None, "a watch answered though its save failed");
    let status = agent.wait();
    assert_eq!(status.code(), Some(1), "{status}");
    let log = agent.log_text();
    assert!(
        log.contains("append to")
            && log.contains("state.journal")
            && log.contains("stopping before anything that save held is answered"),
        "{log}"
    );
}

fn the_agent_runs_as_a_notify_service_with_a_watchdog() {
    let sandbox = Sandbox::start("service");
    let binary = format!(
        "/proc/{}/root{}",
        std::process::id(),
        crate::support::agent::binary()
    );
    let out = sandbox.run(
        "systemd-run",
        &[
            "--user",
            "--unit=exitproof-agent.service",
            "-p",
            "Type=notify",
            "-p",
            "NotifyAccess=main",
            "-p",
            "WatchdogSec=2s",
            &binary,
            "agent",
            "--user",
            "--socket",
            "/run/svc.sock",
            "--state-dir",
            "/run/svc-state",
        ],
    );
    // systemd-run waits for nothing here; READY=1 is what makes the unit active.
    assert!(out.status.success(), "{out:?}");
    sandbox.wait_until("the agent reports READY=1", PATIENCE, || {
        sandbox.show("exitproof-agent.service", "ActiveState") == "active"
    });
    // Three watchdog periods: only the loop's own keep-alives keep it running.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(
        sandbox.show("exitproof-agent.service", "ActiveState"),
        "active"
    );
    assert_eq!(sandbox.show("exitproof-agent.service", "NRestarts"), "0");
    sandbox.systemctl_ok(&["stop", "exitproof-agent.service"]);
    let result = sandbox.show("exitproof-agent.service", "Result");
    assert!(result == "success" || result.is_empty(), "{result}");
}

fn the_safety_net_relist_catches_a_missed_event() {
    let sandbox = Sandbox::start("relist");
    let agent = Agent::start_with(&sandbox, &["--resync-interval", "2s"]);
    sleeper(&sandbox, "missed.service");
    one(&agent, &["watch", "missed.service"]);
    // The agent reads "populated 1" whatever happens; once the fake is gone no event comes
    // again, since the cgroup was emptied (and could not be removed) behind it.
    let inner_dir =
        kill_behind_a_fake_cgroup(&sandbox, "missed.service", "populated 1\nfrozen 0\n");
    assert_unproven(&agent, "missed.service");
    let out = sandbox.run("umount", &[&inner_dir]);
    assert!(out.status.success(), "{out:?}");
    // Nothing notifies this any more: only the relist reads the cgroup again.
    let event = one(
        &agent,
        &["wait", "missed.service", "--timeout", PATIENCE_ARG],
    );
    assert_eq!(event["cause"], "exited", "{event}");
    assert!(
        agent.log_text().contains("safety-net relist"),
        "{}",
        agent.log_text()
    );
}

/// The state file outlives a reboot; a reboot is simulated by rewriting the boot id it was
/// saved under while the agent is down.
fn a_watch_saved_in_another_boot_is_proven_and_its_unit_left_alone() {
    let sandbox = Sandbox::start("reboot");
    sandbox.install_unit("boot@.service", "[Service]\nExecStart=/bin/sleep 1000\n");
    sandbox.systemctl_ok(&["start", "boot@1.service"]);
    let launch = sandbox.host_path("/run/launch-boot-1.env");
    std::fs::write(&launch, "A=1\n").unwrap();
    let mut agent = Agent::start(&sandbox);
    one(
        &agent,
        &[
            "watch",
            "boot@1.service",
            "--gen",
            "1",
            "--launch-file",
            "/run/launch-boot-1.env",
        ],
    );
    let invocation = sandbox.show("boot@1.service", "InvocationID");
    agent.kill_hard();

    let state_path = sandbox
        .host_path(crate::support::agent::STATE_DIR)
        .join("state.json");
    let mut state: Value =
        serde_json::from_slice(&std::fs::read(&state_path).expect("read the state file"))
            .expect("the state file is JSON");
    let this_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(state["boot_id"], this_boot.trim(), "the boot is saved");
    state["boot_id"] = Value::from("00000000-0000-4000-8000-000000000000");
    std::fs::write(&state_path, serde_json::to_vec(&state).unwrap()).unwrap();

    let agent = Agent::start(&sandbox);
    let event = one(
        &agent,
        &["wait", "boot@1.service", "--timeout", PATIENCE_ARG],
    );
    assert_eq!(event["cause"], "rebooted", "{event}");
    assert_eq!(event["invocation"], invocation.as_str());
    assert!(!launch.exists(), "the generation's launch file is released");
    // Whatever runs under the name in this boot is not ours: nothing was stopped.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(sandbox.show("boot@1.service", "ActiveState"), "active");
    assert_eq!(sandbox.show("boot@1.service", "InvocationID"), invocation);
    let log = agent.log_text();
    assert!(!log.contains("stopping ("), "{log}");
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "boot@1.service"]);
}

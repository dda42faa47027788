//! The agent's boundaries with what it shares a host with: one agent per state directory, a
//! cgroup view that must be systemd's own, and the tenant the proof holds against.

use std::os::unix::fs::MetadataExt;
use std::process::Output;
use std::time::Duration;

use crate::Test;
use crate::agent::{PATIENCE, PATIENCE_ARG, run_unit};
use crate::support::Sandbox;
use crate::support::agent::{Agent, STATE_DIR, agent_args, binary_in_sandbox};

pub const TESTS: &[Test] = &[
    (
        "a_second_agent_on_the_same_state_directory_is_refused_and_touches_nothing",
        a_second_agent_on_the_same_state_directory_is_refused_and_touches_nothing,
    ),
    (
        "the_state_directory_is_free_once_its_agent_exits_or_is_killed",
        the_state_directory_is_free_once_its_agent_exits_or_is_killed,
    ),
    (
        "an_agent_in_a_private_cgroup_namespace_refuses_to_start_and_proves_nothing",
        an_agent_in_a_private_cgroup_namespace_refuses_to_start_and_proves_nothing,
    ),
    (
        "a_tenant_under_user_cannot_move_itself_out_of_its_units_cgroup",
        a_tenant_under_user_cannot_move_itself_out_of_its_units_cgroup,
    ),
];

/// Runs an agent inside `sandbox` on `socket` and `state_dir` that is expected to refuse to
/// start; `timeout` ends it, should it start after all, so the test fails rather than hangs.
fn run_refused_agent(sandbox: &Sandbox, socket: &str, state_dir: &str) -> Output {
    let binary = binary_in_sandbox();
    let timeout = ["60", binary.as_str()];
    sandbox.run(
        "timeout",
        &[&timeout[..], &agent_args(socket, state_dir)].concat(),
    )
}

/// What identifies a file and its contents: its inode, and its bytes if it is a regular file
/// (a socket's are not read).
fn fingerprint(sandbox: &Sandbox, inner: &str) -> (u64, Option<Vec<u8>>) {
    let path = sandbox.host_path(inner);
    let metadata = std::fs::metadata(&path).unwrap_or_else(|e| panic!("stat {inner}: {e}"));
    let bytes = metadata
        .is_file()
        .then(|| std::fs::read(&path).unwrap_or_else(|e| panic!("read {inner}: {e}")));
    (metadata.ino(), bytes)
}

fn a_second_agent_on_the_same_state_directory_is_refused_and_touches_nothing() {
    let sandbox = Sandbox::start("statelock");
    run_unit(&sandbox, "kept.service", &[], &["sleep", "1000"]);
    run_unit(&sandbox, "later.service", &[], &["sleep", "1000"]);
    let mut first = Agent::start(&sandbox);
    first.one(&["watch", "kept.service"]);
    first.barrier();
    let files = [
        format!("{STATE_DIR}/state.json"),
        format!("{STATE_DIR}/state.journal"),
        crate::support::agent::SOCKET.to_owned(),
    ];
    let before: Vec<_> = files.iter().map(|f| fingerprint(&sandbox, f)).collect();

    // Only the socket differs, as in the issue.
    let second_socket = "/run/exitproof-second.sock";
    let out = run_refused_agent(&sandbox, second_socket, STATE_DIR);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "the second agent: {out:?}");
    let expected = format!(
        "exitproof: another agent (pid {}) holds the state directory {STATE_DIR}: one agent \
         per state directory; stop it, or give this one its own --state-dir",
        first.pid()
    );
    assert_eq!(stderr.trim_end(), expected, "one clear line");
    assert!(
        !sandbox.host_path(second_socket).exists(),
        "the refused agent made its socket"
    );
    for (file, before) in files.iter().zip(&before) {
        assert_eq!(
            &fingerprint(&sandbox, file),
            before,
            "{file} changed under the first agent"
        );
    }

    // The first agent's acknowledged changes survive its restart: its journal is still the
    // one its state names.
    first.one(&["watch", "later.service"]);
    first.cli_json(&["unwatch", "kept.service"], 0);
    first.kill_hard();
    let restarted = Agent::start(&sandbox);
    let units: Vec<_> = restarted
        .list()
        .iter()
        .map(|u| u["unit"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(units, ["later.service"], "{units:?}");
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "kept.service", "later.service"]);
}

fn the_state_directory_is_free_once_its_agent_exits_or_is_killed() {
    let sandbox = Sandbox::start("statefree");
    run_unit(&sandbox, "kept.service", &[], &["sleep", "1000"]);
    let first = Agent::start_at(&sandbox, "/run/ep-first.sock", STATE_DIR, &[]);
    first.one(&["watch", "kept.service"]);
    // Dropped: stopped with SIGTERM and waited for.
    drop(first);

    let mut second = Agent::start_at(&sandbox, "/run/ep-second.sock", STATE_DIR, &[]);
    assert!(
        second.entry("kept.service").is_some(),
        "{:?}",
        second.list()
    );
    // A crash: the kernel releases the lock with the process.
    second.kill_hard();

    let third = Agent::start_at(&sandbox, "/run/ep-third.sock", STATE_DIR, &[]);
    assert!(third.entry("kept.service").is_some(), "{:?}", third.list());
    // And it holds the lock in turn.
    let out = run_refused_agent(&sandbox, "/run/ep-fourth.sock", STATE_DIR);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(1)
            && stderr.contains(&format!("another agent (pid {})", third.pid())),
        "{out:?}"
    );
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "kept.service"]);
}

/// Runs its arguments as a container would run them: in a cgroup of its own below `$1` (the
/// sandbox's cgroup), then in a new cgroup namespace rooted there and a new mount namespace,
/// with cgroup2 mounted over a tmpfs at /sys/fs/cgroup (the hierarchy's own mount cannot be
/// mounted again on itself). The cgroup goes with the sandbox's.
const PRIVATE_CGROUP_NAMESPACE: &str = r#"set -eu
cg=/sys/fs/cgroup$1/agent-cgns
shift
mkdir -p "$cg"
echo $$ > "$cg/cgroup.procs"
exec unshare --cgroup --mount sh -c \
    'mount -t tmpfs tmpfs /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec "$@"' \
    sh "$@"
"#;

fn an_agent_in_a_private_cgroup_namespace_refuses_to_start_and_proves_nothing() {
    let sandbox = Sandbox::start("cgns");
    // A unit whose leftover still runs: only its main process is killed.
    sandbox.install_unit(
        "leftover.service",
        "[Service]\nKillMode=process\nExecStart=/bin/sh -c 'sleep 1000 & exec sleep 1000'\n",
    );
    sandbox.systemctl_ok(&["start", "leftover.service"]);
    // The shell must have forked its background sleep before its main process is killed;
    // killed earlier, it leaves nothing, and a proof is then right.
    let cgroup = sandbox.unit_cgroup_dir("leftover.service");
    sandbox.wait_until("both sleeps run", PATIENCE, || {
        std::fs::read_to_string(cgroup.join("cgroup.procs"))
            .is_ok_and(|procs| procs.lines().count() == 2)
    });
    sandbox.systemctl_ok(&["kill", "--kill-whom=main", "-s", "KILL", "leftover.service"]);
    sandbox.wait_until("the main process is dead", PATIENCE, || {
        matches!(
            sandbox.show("leftover.service", "ActiveState").as_str(),
            "inactive" | "failed"
        )
    });
    let procs =
        std::fs::read_to_string(cgroup.join("cgroup.procs")).expect("the leftover's cgroup");
    assert!(!procs.trim().is_empty(), "the leftover runs on");

    std::fs::write(sandbox.host_path("/run/cgns.sh"), PRIVATE_CGROUP_NAMESPACE)
        .expect("write the script");
    let socket = "/run/exitproof-cgns.sock";
    let mut command = sandbox.command("sh");
    command
        .args(["/run/cgns.sh", &sandbox.cgroup(), &binary_in_sandbox()])
        .args(agent_args(socket, "/run/exitproof-cgns-state"));
    match Agent::try_spawn(&sandbox, command, socket) {
        Ok(agent) => {
            let out = agent.cli(&["wait", "leftover.service", "--timeout", "10s"]);
            panic!(
                "an agent in a private cgroup namespace started; asked to wait for a unit whose \
                 leftover still runs, it answered (exit {:?}): {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stdout)
            );
        }
        Err((status, log)) => {
            assert_eq!(status.code(), Some(1), "{log}");
            let last = log.lines().last().unwrap_or_default();
            let expected = format!(
                "exitproof: the cgroup2 mount at /sys/fs/cgroup is not systemd's view: systemd \
                 says its manager (pid {pid}) is in {cgroup}/init.scope, but \
                 /sys/fs/cgroup{cgroup}/init.scope/cgroup.procs does not exist; run the agent \
                 in the host's cgroup and pid namespaces, with the host's cgroup2 mounted",
                pid = sandbox.pid(),
                cgroup = sandbox.cgroup(),
            );
            assert_eq!(last, expected, "{log}");
        }
    }

    // An agent in systemd's view starts, and waits for the leftover.
    let agent = Agent::start(&sandbox);
    agent.one(&["watch", "leftover.service"]);
    agent.assert_unproven_for(
        "leftover.service",
        Duration::from_secs(2),
        "its leftover runs",
    );
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "leftover.service"]);
    let event = agent.one(&["wait", "leftover.service", "--timeout", PATIENCE_ARG]);
    assert_eq!(event["cause"], "exited", "{event}");
}

/// Runs, as a transient unit with `properties`, a shell that tries to write its own pid into
/// each of `destinations` (a cgroup, inside the sandbox's cgroup2 mount), and returns its
/// report: `moved DIR` or `refused DIR` for each, then the cgroup it ends in.
fn try_to_leave(sandbox: &Sandbox, properties: &[&str], destinations: &[String]) -> String {
    let mut script = String::new();
    for dir in destinations {
        script.push_str(&format!(
            "if echo $BASHPID > /sys/fs/cgroup{dir}/cgroup.procs; then echo moved {dir}; \
             else echo refused {dir}; fi; "
        ));
    }
    script.push_str("grep '^0::' /proc/$BASHPID/cgroup");
    let mut args = vec!["--user", "--wait", "--pipe", "--quiet"];
    for property in properties {
        args.extend(["-p", property]);
    }
    args.extend(["/bin/bash", "-c", &script]);
    let out = sandbox.run("systemd-run", &args);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).expect("the report is text")
}

/// The trust model's central claim (README, "Trust model"): a tenant that runs
/// under `User=` in a unit without `Delegate=` cannot leave its unit's cgroup, since moving a
/// process needs write access to `cgroup.procs` of the common ancestor of where it is and
/// where it goes, and systemd leaves every cgroup above such a unit to the manager's user.
/// So its processes stay where the proof looks. The same shell running as the manager's user
/// (root here; any user of its own user manager) moves into a sibling unit's cgroup: the
/// limit the README states, and the check that this test can fail.
fn a_tenant_under_user_cannot_move_itself_out_of_its_units_cgroup() {
    let sandbox = Sandbox::start("tenant");
    run_unit(&sandbox, "sibling.service", &[], &["sleep", "1000"]);
    let sibling = sandbox.show("sibling.service", "ControlGroup");
    let slice = sibling
        .rsplit_once('/')
        .map(|(parent, _)| parent.to_owned())
        .expect("the sibling's cgroup has a parent");
    let destinations = [sibling.clone(), slice.clone()];

    let report = try_to_leave(&sandbox, &["User=nobody"], &destinations);
    assert!(
        report.contains(&format!("refused {sibling}\n"))
            && report.contains(&format!("refused {slice}\n")),
        "a tenant under User= moved itself out of its unit's cgroup: {report}"
    );
    let ends_in = report.lines().last().unwrap_or_default();
    assert!(
        ends_in.starts_with(&format!("0::{slice}/run-")) && ends_in.ends_with(".service"),
        "it stays in its own unit's cgroup: {report}"
    );

    let report = try_to_leave(&sandbox, &[], std::slice::from_ref(&sibling));
    assert_eq!(
        report,
        format!("moved {sibling}\n0::{sibling}\n"),
        "a process of the manager's own user can leave its unit"
    );
}

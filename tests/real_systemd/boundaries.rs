//! The agent's boundaries with what it shares a host with: one agent per state directory, and
//! a cgroup view that must be systemd's own.

use std::os::unix::fs::MetadataExt;
use std::process::Output;

use crate::Test;
use crate::agent::run_unit;
use crate::support::Sandbox;
use crate::support::agent::{Agent, STATE_DIR, binary_in_sandbox};

pub const TESTS: &[Test] = &[
    (
        "a_second_agent_on_the_same_state_directory_is_refused_and_touches_nothing",
        a_second_agent_on_the_same_state_directory_is_refused_and_touches_nothing,
    ),
    (
        "the_state_directory_is_free_once_its_agent_exits_or_is_killed",
        the_state_directory_is_free_once_its_agent_exits_or_is_killed,
    ),
];

/// Runs an agent inside `sandbox` on `socket` and `state_dir` that is expected to refuse to
/// start; `timeout` ends it, should it start after all, so the test fails rather than hangs.
fn run_refused_agent(sandbox: &Sandbox, socket: &str, state_dir: &str) -> Output {
    let binary = binary_in_sandbox();
    sandbox.run(
        "timeout",
        &[
            "60",
            &binary,
            "agent",
            "--user",
            "--socket",
            socket,
            "--state-dir",
            state_dir,
        ],
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

//! `exitproof run` against real systemd: the exit status it gives, and that it exits only once
//! every process of the unit is gone.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};

use serde_json::Value;

use crate::Test;
use crate::agent::PATIENCE;
use crate::support::Sandbox;
use crate::support::agent::{Agent, SOCKET, binary_in_sandbox};

pub const TESTS: &[Test] = &[
    (
        "run_exits_with_the_exit_status_of_a_command_that_exits_at_once",
        run_exits_with_the_exit_status_of_a_command_that_exits_at_once,
    ),
    (
        "run_of_a_command_killed_by_sigterm_exits_143",
        run_of_a_command_killed_by_sigterm_exits_143,
    ),
    (
        "run_exits_only_once_a_leftover_child_is_gone",
        run_exits_only_once_a_leftover_child_is_gone,
    ),
    (
        "run_refuses_a_property_it_cannot_set_and_starts_nothing",
        run_refuses_a_property_it_cannot_set_and_starts_nothing,
    ),
    (
        "run_names_its_unit_adds_service_and_leaves_no_watch_behind",
        run_names_its_unit_adds_service_and_leaves_no_watch_behind,
    ),
    (
        "run_refuses_a_program_it_cannot_find_and_starts_nothing",
        run_refuses_a_program_it_cannot_find_and_starts_nothing,
    ),
];

/// An `exitproof run` inside the sandbox, killed by pid if the test fails before it exits.
struct Run {
    child: Child,
    status: Option<ExitStatus>,
}

impl Run {
    fn spawn(sandbox: &Sandbox, args: &[&str]) -> Run {
        let mut command: Command = sandbox.command(&binary_in_sandbox());
        let child = command
            .args(["--user", "--socket", SOCKET, "--json", "run"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn exitproof run");
        Run {
            child,
            status: None,
        }
    }

    fn has_exited(&mut self) -> bool {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("wait for exitproof run");
        }
        self.status.is_some()
    }

    /// Waits for it to exit; returns its exit code, stdout and stderr.
    fn finish(mut self, sandbox: &Sandbox) -> (Option<i32>, String, String) {
        sandbox.wait_until("exitproof run exits", PATIENCE, || self.has_exited());
        let mut stdout = String::new();
        let mut stderr = String::new();
        if let Some(out) = self.child.stdout.as_mut() {
            out.read_to_string(&mut stdout).expect("read stdout");
        }
        if let Some(err) = self.child.stderr.as_mut() {
            err.read_to_string(&mut stderr).expect("read stderr");
        }
        let code = self.status.and_then(|s| s.code());
        (code, stdout, stderr)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if !self.has_exited() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The one proof event `exitproof run` printed.
fn event(stdout: &str, stderr: &str) -> Value {
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "stdout {stdout:?} stderr {stderr:?}");
    serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn run_exits_with_the_exit_status_of_a_command_that_exits_at_once() {
    let sandbox = Sandbox::start("run-exit");
    let _agent = Agent::start(&sandbox);
    // A generated unit name, and a command found in PATH.
    let run = Run::spawn(&sandbox, &["sh", "-c", "exit 3"]);
    let (code, stdout, stderr) = run.finish(&sandbox);
    assert_eq!(code, Some(3), "stdout {stdout} stderr {stderr}");
    let event = event(&stdout, &stderr);
    assert_eq!(event["cause"], "exited", "{event}");
    assert_eq!(event["systemd"]["code"], "exited", "{event}");
    assert_eq!(event["systemd"]["status"], "3", "{event}");
    let unit = event["unit"].as_str().expect("a unit name");
    assert!(unit.starts_with("exitproof-run-"), "{event}");
}

fn run_of_a_command_killed_by_sigterm_exits_143() {
    let sandbox = Sandbox::start("run-term");
    let _agent = Agent::start(&sandbox);
    let mut run = Run::spawn(&sandbox, &["--unit", "rt.service", "--", "sleep", "1000"]);
    sandbox.wait_until("the command runs", PATIENCE, || {
        sandbox.show("rt.service", "ActiveState") == "active"
    });
    assert!(
        !run.has_exited(),
        "exitproof run exited with its command running"
    );
    sandbox.systemctl_ok(&["kill", "-s", "TERM", "rt.service"]);
    let (code, stdout, stderr) = run.finish(&sandbox);
    assert_eq!(code, Some(143), "stdout {stdout} stderr {stderr}");
    let event = event(&stdout, &stderr);
    assert_eq!(event["unit"], "rt.service", "{event}");
    assert_eq!(event["systemd"]["code"], "killed", "{event}");
    assert_eq!(event["systemd"]["status"], "TERM", "{event}");
}

fn run_exits_only_once_a_leftover_child_is_gone() {
    let sandbox = Sandbox::start("run-left");
    let agent = Agent::start(&sandbox);
    let mut run = Run::spawn(
        &sandbox,
        &[
            "--unit",
            "rl.service",
            "-p",
            "KillMode=process",
            "--",
            "sh",
            "-c",
            "sleep 1000 & echo $! > /run/rl.pid; exit 7",
        ],
    );
    sandbox.wait_until("the main process exits", PATIENCE, || {
        let state = sandbox.show("rl.service", "ActiveState");
        state == "inactive" || state == "failed"
    });
    // The agent has handled every signal of the exit, and the sleep is alive: no proof yet.
    agent.barrier();
    let pid = std::fs::read_to_string(sandbox.host_path("/run/rl.pid")).expect("the pid");
    let pid = pid.trim();
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the leftover runs"
    );
    let entry = agent.entry("rl.service").expect("rl.service is watched");
    assert_eq!(entry["phase"], "watching", "{entry}");
    assert!(
        !run.has_exited(),
        "exitproof run exited with a process of its unit left"
    );

    sandbox.run("kill", &["-KILL", pid]);
    let (code, stdout, stderr) = run.finish(&sandbox);
    assert_eq!(code, Some(7), "stdout {stdout} stderr {stderr}");
    assert_eq!(event(&stdout, &stderr)["cause"], "exited");
}

fn run_refuses_a_property_it_cannot_set_and_starts_nothing() {
    let sandbox = Sandbox::start("run-bad");
    let _agent = Agent::start(&sandbox);
    let run = Run::spawn(
        &sandbox,
        &["--unit", "rb.service", "-p", "CPUQuota=20%", "--", "true"],
    );
    let (code, stdout, stderr) = run.finish(&sandbox);
    assert_eq!(code, Some(1), "stdout {stdout} stderr {stderr}");
    assert!(
        failure_message(&stdout).contains("-p CPUQuota=20%: not a property exitproof run can set"),
        "{stdout}"
    );
    assert_eq!(sandbox.show("rb.service", "LoadState"), "not-found");
}

/// The message of the one `--json` failure line `stdout` holds.
fn failure_message(stdout: &str) -> String {
    let line: Value = serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    line["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn run_names_its_unit_adds_service_and_leaves_no_watch_behind() {
    let sandbox = Sandbox::start("run-named");
    let agent = Agent::start(&sandbox);
    let run = Run::spawn(&sandbox, &["--unit", "bare", "--", "true"]);
    let (code, stdout, stderr) = run.finish(&sandbox);
    assert_eq!(code, Some(0), "stdout {stdout} stderr {stderr}");
    assert_eq!(event(&stdout, &stderr)["unit"], "bare.service");
    assert!(
        stderr.starts_with("Running as unit: bare.service; invocation ID: "),
        "{stderr}"
    );
    assert_eq!(
        agent.list(),
        Vec::<Value>::new(),
        "run unwatched its own unit"
    );
}

fn run_refuses_a_program_it_cannot_find_and_starts_nothing() {
    let sandbox = Sandbox::start("run-ghost");
    let agent = Agent::start(&sandbox);
    let run = Run::spawn(
        &sandbox,
        &["--unit", "ghost.service", "--", "/nonexistent/prog"],
    );
    let (code, stdout, stderr) = run.finish(&sandbox);
    assert_eq!(code, Some(1), "stdout {stdout} stderr {stderr}");
    assert_eq!(
        failure_message(&stdout),
        "/nonexistent/prog: no such executable file"
    );
    assert_eq!(sandbox.show("ghost.service", "LoadState"), "not-found");
    assert_eq!(agent.list(), Vec::<Value>::new());
}

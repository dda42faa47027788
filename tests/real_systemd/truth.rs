//! The CLI tells the truth about the unit a person named: a unit systemd does not know is an
//! error of its own (exit 4), never a proof; `stop` of a unit restarted since its proof stops
//! and proves the invocation running now; `wait`, `status` and `list` say when the unit runs
//! another invocation than the proven one; `start` watches the invocation it started, and
//! `watch` of a unit that never ran says so.

use std::process::Output;
use std::time::Duration;

use serde_json::Value;

use crate::Test;
use crate::support::Sandbox;
use crate::support::agent::Agent;

const PATIENCE: Duration = Duration::from_secs(30);
const SLEEPER: &str = "[Service]\nExecStart=/bin/sleep 1000\n";

pub const TESTS: &[Test] = &[
    (
        "a_unit_systemd_does_not_know_is_not_found_never_proven",
        a_unit_systemd_does_not_know_is_not_found_never_proven,
    ),
    (
        "stop_of_a_unit_restarted_since_its_proof_stops_the_running_invocation",
        stop_of_a_unit_restarted_since_its_proof_stops_the_running_invocation,
    ),
    (
        "wait_status_and_list_say_the_unit_now_runs_another_invocation",
        wait_status_and_list_say_the_unit_now_runs_another_invocation,
    ),
    (
        "start_watches_the_invocation_its_start_job_began",
        start_watches_the_invocation_its_start_job_began,
    ),
];

/// Runs the CLI, requires exit `code`, and returns its stdout and stderr.
fn run(agent: &Agent, args: &[&str], code: i32) -> (String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = agent.cli(args);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    );
    assert_eq!(
        status.code(),
        Some(code),
        "exitproof {args:?}: stdout {stdout:?} stderr {stderr:?}"
    );
    (stdout, stderr)
}

fn short(invocation: &str) -> &str {
    &invocation[..8]
}

fn a_unit_systemd_does_not_know_is_not_found_never_proven() {
    let sandbox = Sandbox::start("truth-nf");
    let agent = Agent::start(&sandbox);
    for args in [
        ["watch", "wbe.service"],
        ["wait", "wbe.service"],
        ["stop", "wbe.service"],
    ] {
        let (stdout, stderr) = run(&agent, &args, 4);
        assert_eq!(stdout, "", "{args:?}");
        assert_eq!(
            stderr, "exitproof: wbe.service not found: systemd has no such unit\n",
            "{args:?}"
        );
    }
    sandbox.systemctl_ok(&["mask", "--runtime", "masked.service"]);
    let (_, stderr) = run(&agent, &["watch", "masked.service"], 4);
    assert!(stderr.contains("masked.service is masked"), "{stderr}");
    let errors = agent.cli_json(&["watch", "wbe.service"], 4);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0]["error"]["kind"], "not-found", "{errors:?}");
    assert!(
        agent.list().is_empty(),
        "nothing of a refused watch stays: {:?}",
        agent.list()
    );
    // Naming an invocation proves it, whether or not systemd still has the unit.
    let invocation = "0123456789abcdef0123456789abcdef";
    let (stdout, _) = run(
        &agent,
        &["watch", "wbe.service", "--invocation", invocation],
        0,
    );
    assert!(
        stdout.starts_with("proven wbe.service (invocation 01234567"),
        "{stdout}"
    );
}

/// `web.service` installed and started, watched, killed and proven (invocation returned), then
/// started again outside the agent (the new invocation returned).
fn proven_then_started_again(sandbox: &Sandbox, agent: &Agent) -> (String, String) {
    sandbox.install_unit("web.service", SLEEPER);
    sandbox.systemctl_ok(&["start", "web.service"]);
    let proven = sandbox.show("web.service", "InvocationID");
    run(agent, &["watch", "web.service"], 0);
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "web.service"]);
    let (stdout, _) = run(agent, &["wait", "web.service", "--timeout", "30s"], 0);
    assert!(stdout.starts_with("proven web.service"), "{stdout}");
    sandbox.systemctl_ok(&["start", "web.service"]);
    let running = sandbox.show("web.service", "InvocationID");
    assert_ne!(proven, running);
    // The proven watch hears the new invocation through signals: wait until it has.
    sandbox.wait_until("the agent hears the new invocation", PATIENCE, || {
        agent
            .entry("web.service")
            .is_some_and(|view| view["now_running"] == running.as_str())
    });
    (proven, running)
}

fn stop_of_a_unit_restarted_since_its_proof_stops_the_running_invocation() {
    let sandbox = Sandbox::start("truth-stop");
    let agent = Agent::start(&sandbox);
    let (proven, running) = proven_then_started_again(&sandbox, &agent);
    let (stdout, _) = run(&agent, &["stop", "web.service", "--timeout", "30s"], 0);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "the proven invocation {} of web.service is over; stopped the running invocation {}",
            short(&proven),
            short(&running)
        ),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with(&format!(
            "proven web.service (invocation {})",
            short(&running)
        )),
        "{stdout}"
    );
    let state = sandbox.systemctl(&["is-active", "web.service"]);
    assert_eq!(String::from_utf8_lossy(&state.stdout).trim(), "inactive");
    assert!(
        agent.log_text().contains(&format!(
            "the proven invocation {proven} is over; stopping the running invocation {running}"
        )),
        "{}",
        agent.log_text()
    );
    // Asked again, it is that proof, and nothing runs.
    let event = agent.one(&["stop", "web.service"]);
    assert_eq!(event["invocation"], running.as_str(), "{event}");
    assert_eq!(event.get("moved_on_from"), None, "{event}");
}

fn wait_status_and_list_say_the_unit_now_runs_another_invocation() {
    let sandbox = Sandbox::start("truth-now");
    let agent = Agent::start(&sandbox);
    let (proven, running) = proven_then_started_again(&sandbox, &agent);
    let note = format!("(now running invocation {})", short(&running));
    let (stdout, _) = run(&agent, &["wait", "web.service"], 0);
    assert!(
        stdout.starts_with(&format!(
            "proven web.service (invocation {})",
            short(&proven)
        )),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with(&note), "{stdout}");
    let (stdout, _) = run(&agent, &["status", "web.service"], 0);
    assert!(
        stdout.lines().next().is_some_and(|l| l.ends_with(&note)),
        "{stdout}"
    );
    let (stdout, _) = run(&agent, &["list"], 0);
    assert!(
        stdout.contains(&format!(
            "web.service: the proven invocation {} is over; systemd now runs invocation {}",
            short(&proven),
            short(&running)
        )),
        "{stdout}"
    );
    let answers: Vec<Value> = agent.cli_json(&["wait", "web.service"], 0);
    assert_eq!(answers[0]["invocation"], proven.as_str(), "{answers:?}");
    assert_eq!(answers[0]["now_running"], running.as_str(), "{answers:?}");
}

fn start_watches_the_invocation_its_start_job_began() {
    let sandbox = Sandbox::start("truth-start");
    let agent = Agent::start(&sandbox);
    sandbox.install_unit("web.service", SLEEPER);
    let (stdout, _) = run(&agent, &["watch", "web.service"], 0);
    assert_eq!(
        stdout,
        "web.service is loaded but has not run since systemd started: nothing to prove yet; \
         start it with `exitproof start web.service`\n"
    );
    let (stdout, _) = run(&agent, &["start", "web.service"], 0);
    let started = sandbox.show("web.service", "InvocationID");
    assert_eq!(
        stdout,
        format!(
            "watching web.service (invocation {}, active/running, populated yes)\n",
            short(&started)
        )
    );
    let (stdout, _) = run(&agent, &["stop", "web.service", "--timeout", "30s"], 0);
    assert!(
        stdout.starts_with(&format!(
            "proven web.service (invocation {})",
            short(&started)
        )),
        "{stdout}"
    );
    let (_, stderr) = run(&agent, &["start", "wbe.service"], 4);
    assert!(stderr.contains("wbe.service"), "{stderr}");
}

//! Issue 24: only systemd speaks for systemd. A client of the user bus takes
//! `org.freedesktop.systemd1` from the manager and lies about a running unit; the agent must
//! take none of it as a fact, say so, and recover once the manager owns its name again.

use std::time::Duration;

use serde_json::Value;

use crate::Test;
use crate::support::Sandbox;
use crate::support::agent::Agent;
use crate::support::impostor::Impostor;

const PATIENCE: Duration = Duration::from_secs(60);
const PATIENCE_ARG: &str = "60s";
/// How long the impostor is given to fool the agent: its lie is signalled every 200 ms, and
/// an agent that followed it read the unit from it within milliseconds.
const FOOLING: Duration = Duration::from_secs(5);

pub const TESTS: &[Test] = &[(
    "an_impostor_owning_systemds_name_proves_nothing",
    an_impostor_owning_systemds_name_proves_nothing,
)];

/// The `systemd_error` field of `stats`.
fn stats_error(agent: &Agent) -> Value {
    agent.one(&["stats"])["systemd_error"].clone()
}

fn an_impostor_owning_systemds_name_proves_nothing() {
    let sandbox = Sandbox::start("impostor");
    let agent = Agent::start(&sandbox);
    let out = sandbox.run(
        "systemd-run",
        &["--user", "--unit=victim.service", "sleep", "1000"],
    );
    assert!(out.status.success(), "{out:?}");
    let watched = agent.one(&["watch", "victim.service"]);
    assert_eq!(watched["phase"], "watching", "{watched}");
    assert_eq!(stats_error(&agent), Value::Null);
    let invocation = sandbox.show("victim.service", "InvocationID");
    let cgroup = sandbox.unit_cgroup_dir("victim.service");

    let impostor = Impostor::start(&sandbox, "victim.service", &invocation);
    agent.assert_unproven_for(
        "victim.service",
        FOOLING,
        "an impostor owns systemd's name and its process runs",
    );
    sandbox.wait_until("stats name the impostor", PATIENCE, || {
        stats_error(&agent)
            .as_str()
            .is_some_and(|e| e.contains("is not systemd"))
    });
    let status = agent.one(&["status", "victim.service"]);
    let said = status["systemd_error"].as_str().unwrap_or_default();
    assert!(said.contains(impostor.unique_name()), "{status}");
    assert!(
        agent.log_text().contains("is not systemd"),
        "{}",
        agent.log_text()
    );
    assert!(
        std::fs::read_to_string(cgroup.join("cgroup.procs")).is_ok_and(|p| !p.trim().is_empty()),
        "the unit's process still runs"
    );

    // systemd asked for its name without SD_BUS_NAME_QUEUE (sd-bus then adds DBUS_NAME_FLAG_
    // DO_NOT_QUEUE): once replaced it is out of the queue, and the name has no owner after the
    // impostor leaves, until the manager asks again, as a re-execution does.
    impostor.leave();
    sandbox.wait_until("stats say nobody owns the name", PATIENCE, || {
        stats_error(&agent)
            .as_str()
            .is_some_and(|e| e.contains("no owner"))
    });
    agent.assert_unproven_for(
        "victim.service",
        Duration::from_secs(1),
        "nobody is systemd",
    );
    sandbox.systemctl_ok(&["daemon-reexec"]);
    sandbox.wait_until("the agent hears systemd again", PATIENCE, || {
        stats_error(&agent).is_null()
    });
    agent.barrier();
    agent.assert_unproven_for(
        "victim.service",
        Duration::from_secs(1),
        "systemd is back and the unit runs",
    );
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "victim.service"]);
    let event = agent.one(&["wait", "victim.service", "--timeout", PATIENCE_ARG]);
    assert_eq!(event["cause"], "exited", "{event}");
    assert_eq!(event["invocation"], invocation.as_str(), "{event}");
}

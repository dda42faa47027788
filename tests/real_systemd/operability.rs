//! What an operator sees of the agent: its figures (`stats`, the metrics file), socket
//! activation, its journal fields, `status`, against real systemd.

use std::time::Duration;

use serde_json::Value;

use crate::Test;
use crate::agent::{PATIENCE, PATIENCE_ARG, exit_when, run_unit};
use crate::support::Sandbox;
use crate::support::agent::Agent;

pub const TESTS: &[Test] = &[
    (
        "stats_count_a_unit_blocked_by_a_leftover_then_its_proof",
        stats_count_a_unit_blocked_by_a_leftover_then_its_proof,
    ),
    (
        "the_metrics_file_shows_a_proof_and_is_not_rewritten_while_idle",
        the_metrics_file_shows_a_proof_and_is_not_rewritten_while_idle,
    ),
];

fn stats(agent: &Agent) -> Value {
    agent.one(&["stats"])
}

fn stats_count_a_unit_blocked_by_a_leftover_then_its_proof() {
    let sandbox = Sandbox::start("stats");
    let agent = Agent::start(&sandbox);
    let script = format!(
        "sleep 1000 & echo $! > /run/left.pid; {}",
        exit_when("/run/left.go", 0)
    );
    run_unit(
        &sandbox,
        "left.service",
        &["-p", "KillMode=process"],
        &["sh", "-c", &script],
    );
    agent.one(&["watch", "left.service"]);
    let before = stats(&agent);
    assert_eq!(before["watches"]["watching"], 1, "{before}");
    assert_eq!(before["blocked"], 0, "{before}");
    assert!(before["inotify"]["watches"].as_u64() >= Some(1), "{before}");

    std::fs::write(sandbox.host_path("/run/left.go"), "").expect("write the go file");
    sandbox.wait_until("the main process exits", PATIENCE, || {
        let state = sandbox.show("left.service", "ActiveState");
        state == "inactive" || state == "failed"
    });
    agent.barrier();
    let blocked = stats(&agent);
    assert_eq!(blocked["blocked"], 1, "the sleep is left: {blocked}");
    assert_eq!(
        blocked["proofs"]["exited"], 1,
        "the barrier's own: {blocked}"
    );

    let pid = std::fs::read_to_string(sandbox.host_path("/run/left.pid")).expect("the pid");
    sandbox.run("kill", &["-KILL", pid.trim()]);
    let event = agent.one(&["wait", "left.service", "--timeout", PATIENCE_ARG]);
    assert_eq!(event["cause"], "exited", "{event}");
    let after = stats(&agent);
    assert_eq!(after["blocked"], 0, "{after}");
    assert_eq!(after["proofs"]["exited"], 2, "{after}");
    assert_eq!(after["watches"]["proven"], 1, "{after}");
    assert_eq!(after["watches"]["watching"], 0, "{after}");
    // Both proofs came after a terminal state: the barrier's unit (never loaded) and ours.
    assert_eq!(after["proof_latency"]["count"], 2, "{after}");
    let buckets = after["proof_latency"]["buckets"]
        .as_array()
        .expect("buckets");
    assert_eq!(buckets.last().map(|b| &b["count"]), Some(&Value::from(2)));
    assert_eq!(buckets.last().map(|b| &b["le_us"]), Some(&Value::Null));
}

fn the_metrics_file_shows_a_proof_and_is_not_rewritten_while_idle() {
    let sandbox = Sandbox::start("metrics");
    std::fs::create_dir(sandbox.host_path("/run/textfile")).expect("make the directory");
    let agent = Agent::start_with(
        &sandbox,
        &["--metrics-file", "/run/textfile/exitproof.prom"],
    );
    let file = sandbox.host_path("/run/textfile/exitproof.prom");
    run_unit(&sandbox, "m.service", &[], &["sleep", "1000"]);
    agent.one(&["watch", "m.service"]);
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "m.service"]);
    agent.one(&["wait", "m.service", "--timeout", PATIENCE_ARG]);
    let proven = "exitproof_proofs_total{cause=\"exited\"} 1\n";
    sandbox.wait_until("the metrics file shows the proof", PATIENCE, || {
        std::fs::read_to_string(&file).is_ok_and(|text| text.contains(proven))
    });
    let text = std::fs::read_to_string(&file).expect("the metrics file");
    for line in [
        "# TYPE exitproof_proof_latency_seconds histogram\n",
        "exitproof_watches{phase=\"proven\"} 1\n",
        "exitproof_proof_latency_seconds_count 1\n",
        "exitproof_proof_latency_seconds_bucket{le=\"+Inf\"} 1\n",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    // Nothing happens now: the file keeps its inode (every write is a rename of a new one).
    use std::os::unix::fs::MetadataExt;
    let inode = std::fs::metadata(&file).expect("metadata").ino();
    std::thread::sleep(Duration::from_secs(7));
    assert_eq!(
        std::fs::metadata(&file).expect("metadata").ino(),
        inode,
        "rewritten while idle"
    );
}

//! What an operator sees of the agent: its figures (`stats`, the metrics file), socket
//! activation, its journal fields, `status`, against real systemd.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::Test;
use crate::agent::{PATIENCE, PATIENCE_ARG, exit_when, run_unit};
use crate::support::Sandbox;
use crate::support::agent::{Agent, STATE_DIR, binary, binary_in_sandbox};

pub const TESTS: &[Test] = &[
    (
        "stats_count_a_unit_blocked_by_a_leftover_then_its_proof",
        stats_count_a_unit_blocked_by_a_leftover_then_its_proof,
    ),
    (
        "the_metrics_file_shows_a_proof_and_is_not_rewritten_while_idle",
        the_metrics_file_shows_a_proof_and_is_not_rewritten_while_idle,
    ),
    (
        "a_socket_handed_over_is_served_and_outlives_the_agent",
        a_socket_handed_over_is_served_and_outlives_the_agent,
    ),
    (
        "a_handed_over_socket_that_is_not_a_listening_stream_is_refused",
        a_handed_over_socket_that_is_not_a_listening_stream_is_refused,
    ),
    (
        "a_socket_unit_starts_the_agent_and_keeps_its_socket_across_a_restart",
        a_socket_unit_starts_the_agent_and_keeps_its_socket_across_a_restart,
    ),
    (
        "under_journald_a_proof_is_logged_with_the_units_fields",
        under_journald_a_proof_is_logged_with_the_units_fields,
    ),
    (
        "status_names_the_process_that_blocks_the_proof",
        status_names_the_process_that_blocks_the_proof,
    ),
];

/// Starts `unit`, watched by `agent`, whose main process leaves a `sleep` behind when it ends
/// (KillMode=process): the unit is then over for systemd, not for the proof.
fn start_leaving_a_child(sandbox: &Sandbox, agent: &Agent, unit: &str) {
    let script = format!(
        "sleep 1000 & echo $! > /run/{unit}.pid; {}",
        exit_when(&format!("/run/{unit}.go"), 0)
    );
    run_unit(
        sandbox,
        unit,
        &["-p", "KillMode=process"],
        &["sh", "-c", &script],
    );
    agent.one(&["watch", unit]);
}

/// Ends the main process of a unit of [`start_leaving_a_child`], returns once systemd and the
/// agent know it, and gives the pid of the child left behind.
fn end_leaving_the_child(sandbox: &Sandbox, agent: &Agent, unit: &str) -> i64 {
    std::fs::write(sandbox.host_path(&format!("/run/{unit}.go")), "").expect("write the go file");
    sandbox.wait_until("the main process exits", PATIENCE, || {
        let state = sandbox.show(unit, "ActiveState");
        state == "inactive" || state == "failed"
    });
    agent.barrier();
    std::fs::read_to_string(sandbox.host_path(&format!("/run/{unit}.pid")))
        .expect("the pid")
        .trim()
        .parse()
        .expect("a pid")
}

fn stats(agent: &Agent) -> Value {
    agent.one(&["stats"])
}

fn stats_count_a_unit_blocked_by_a_leftover_then_its_proof() {
    let sandbox = Sandbox::start("stats");
    let agent = Agent::start(&sandbox);
    start_leaving_a_child(&sandbox, &agent, "left.service");
    let before = stats(&agent);
    assert_eq!(before["watches"]["watching"], 1, "{before}");
    assert_eq!(before["blocked"], 0, "{before}");
    assert!(before["inotify"]["watches"].as_u64() >= Some(1), "{before}");

    let pid = end_leaving_the_child(&sandbox, &agent, "left.service");
    let blocked = stats(&agent);
    assert_eq!(blocked["blocked"], 1, "the sleep is left: {blocked}");
    assert_eq!(
        blocked["proofs"]["exited"], 1,
        "the barrier's own: {blocked}"
    );

    sandbox.run("kill", &["-KILL", &pid.to_string()]);
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

/// The agent inside `sandbox`, started as systemd's socket activation starts a service: `fd`
/// as file descriptor 3, `LISTEN_FDS=1` and `LISTEN_PID` its own pid (the shell's, which
/// `exec` keeps).
fn activated_agent(sandbox: &Sandbox, fd: RawFd) -> Command {
    let mut command = sandbox.command("sh");
    command.args([
        "-c",
        "export LISTEN_PID=$$ LISTEN_FDS=1; exec \"$0\" \"$@\"",
        &binary_in_sandbox(),
        "agent",
        "--user",
        "--state-dir",
        STATE_DIR,
    ]);
    // SAFETY: between fork and exec, only async-signal-safe calls (dup2, fcntl).
    unsafe {
        command.pre_exec(move || {
            let result = if fd == 3 {
                libc::fcntl(fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if result < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
}

fn a_socket_handed_over_is_served_and_outlives_the_agent() {
    let sandbox = Sandbox::start("activate");
    let socket = "/run/activated.sock";
    let listener = UnixListener::bind(sandbox.host_path(socket)).expect("bind the socket");
    let agent = Agent::spawn(
        &sandbox,
        activated_agent(&sandbox, listener.as_raw_fd()),
        socket,
    );
    // The socket accepted connections before the agent ran: an answer shows it is served.
    let version = agent.one(&["version"]);
    assert_eq!(version["agent"]["protocol"], 1, "{version}");
    assert!(
        agent.log_text().contains("control socket inherited"),
        "{}",
        agent.log_text()
    );
    assert!(
        !sandbox.host_path("/run/user/0/exitproof.sock").exists(),
        "the agent bound its default socket too"
    );
    run_unit(&sandbox, "act.service", &[], &["sleep", "1000"]);
    agent.one(&["watch", "act.service"]);
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "act.service"]);
    let event = agent.one(&["wait", "act.service", "--timeout", PATIENCE_ARG]);
    assert_eq!(event["cause"], "exited", "{event}");
    drop(agent);
    assert!(
        sandbox.host_path(socket).exists(),
        "the agent removed a socket it did not create"
    );

    // A restart is handed the same socket: clients keep the path, the watch set is kept.
    let agent = Agent::spawn(
        &sandbox,
        activated_agent(&sandbox, listener.as_raw_fd()),
        socket,
    );
    let entry = agent.entry("act.service").expect("still listed");
    assert_eq!(entry["phase"], "proven", "{entry}");
}

fn a_handed_over_socket_that_is_not_a_listening_stream_is_refused() {
    let sandbox = Sandbox::start("activate-bad");
    let datagram = UnixDatagram::bind(sandbox.host_path("/run/dgram.sock")).expect("bind");
    let output = activated_agent(&sandbox, datagram.as_raw_fd())
        .output()
        .expect("run the agent");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("socket activation: file descriptor 3 is a Datagram socket"),
        "{stderr}"
    );
    assert!(
        !sandbox.host_path("/run/user/0/exitproof.sock").exists(),
        "the agent fell back to a socket of its own"
    );
}

/// The CLI against the socket at `socket` (a host path); its one JSON line.
fn cli_one(socket: &std::path::Path, args: &[&str]) -> Value {
    let output = Command::new(binary())
        .arg("--json")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("run the CLI");
    assert!(output.status.success(), "exitproof {args:?}: {output:?}");
    serde_json::from_slice(&output.stdout).expect("one JSON line")
}

fn a_socket_unit_starts_the_agent_and_keeps_its_socket_across_a_restart() {
    let sandbox = Sandbox::start("socket-unit");
    sandbox.install_unit(
        "ep.socket",
        "[Socket]\nListenStream=/run/ep-unit.sock\nSocketMode=0600\n",
    );
    sandbox.install_unit(
        "ep.service",
        &format!(
            "[Service]\nType=notify\nExecStart={} agent --user --state-dir /run/ep-unit-state\n",
            binary_in_sandbox()
        ),
    );
    sandbox.systemctl_ok(&["start", "ep.socket"]);
    assert_eq!(sandbox.show("ep.service", "ActiveState"), "inactive");
    let socket = sandbox.host_path("/run/ep-unit.sock");
    // The first connection starts the agent, which answers on the socket systemd holds.
    let version = cli_one(&socket, &["version"]);
    assert_eq!(version["agent"]["protocol"], 1, "{version}");
    assert_eq!(sandbox.show("ep.service", "ActiveState"), "active");

    run_unit(&sandbox, "su.service", &[], &["sleep", "1000"]);
    cli_one(&socket, &["watch", "su.service"]);
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "su.service"]);
    cli_one(&socket, &["wait", "su.service", "--timeout", PATIENCE_ARG]);

    let first = sandbox.show("ep.service", "MainPID");
    sandbox.systemctl_ok(&["restart", "ep.service"]);
    assert_ne!(sandbox.show("ep.service", "MainPID"), first);
    let event = cli_one(&socket, &["wait", "su.service", "--timeout", "0s"]);
    assert_eq!(event["cause"], "exited", "the proof is kept: {event}");

    sandbox.systemctl_ok(&["stop", "ep.service"]);
    assert!(socket.exists(), "the agent removed systemd's socket");
    sandbox.systemctl_ok(&["stop", "ep.socket"]);
}

/// Whether `haystack` holds `needle`.
fn holds(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn under_journald_a_proof_is_logged_with_the_units_fields() {
    let sandbox = Sandbox::start("journald");
    // Where journald's native socket is: the sandbox's /run is its own, with no journald.
    let dir = sandbox.host_path("/run/systemd/journal");
    std::fs::create_dir_all(&dir).expect("make the journal's directory");
    let journal = UnixDatagram::bind(dir.join("socket")).expect("bind the journal's socket");
    journal
        .set_read_timeout(Some(PATIENCE))
        .expect("set a read timeout");
    // Its stderr is "the journal stream" as systemd names it, so the agent logs natively.
    let mut command = sandbox.command("sh");
    command.args([
        "-c",
        "export RUST_LOG=info JOURNAL_STREAM=$(stat -L -c %d:%i /proc/self/fd/2); \
         exec \"$0\" \"$@\"",
        &binary_in_sandbox(),
        "agent",
        "--user",
        "--socket",
        crate::support::agent::SOCKET,
        "--state-dir",
        STATE_DIR,
    ]);
    let agent = Agent::spawn(&sandbox, command, crate::support::agent::SOCKET);
    run_unit(&sandbox, "j.service", &[], &["sleep", "1000"]);
    agent.one(&["watch", "j.service"]);
    let invocation = sandbox.show("j.service", "InvocationID");
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "j.service"]);
    agent.one(&["wait", "j.service", "--timeout", PATIENCE_ARG]);

    let wanted = [
        b"EXITPROOF_UNIT=j.service\n".to_vec(),
        format!("EXITPROOF_INVOCATION={invocation}\n").into_bytes(),
        b"EXITPROOF_CAUSE=exited\n".to_vec(),
        b"PRIORITY=".to_vec(),
        b"SYSLOG_IDENTIFIER=exitproof\n".to_vec(),
    ];
    let mut buffer = vec![0; 65536];
    loop {
        let n = journal
            .recv(&mut buffer)
            .expect("a record with the proof's fields before the timeout");
        let record = &buffer[..n];
        if wanted.iter().all(|field| holds(record, field)) {
            assert!(holds(record, b"MESSAGE=j.service: proven: "), "{record:?}");
            break;
        }
    }
    assert!(
        !agent.log_text().contains("proven"),
        "the proof went to the journal's socket, not down the stream: {}",
        agent.log_text()
    );
}

fn status_names_the_process_that_blocks_the_proof() {
    let sandbox = Sandbox::start("status");
    let agent = Agent::start(&sandbox);
    start_leaving_a_child(&sandbox, &agent, "blocker.service");
    let running = agent.one(&["status", "blocker.service"]);
    assert_eq!(running["blocked"], false, "{running}");
    assert_eq!(running["watch"]["phase"], "watching", "{running}");
    let cgroup = sandbox.show("blocker.service", "ControlGroup");
    assert_eq!(running["cgroup"], cgroup.as_str(), "{running}");

    let pid = end_leaving_the_child(&sandbox, &agent, "blocker.service");
    let blocked = agent.one(&["status", "blocker.service"]);
    assert_eq!(blocked["blocked"], true, "{blocked}");
    assert!(
        blocked["terminal_since_mono_ns"].as_u64() > Some(0),
        "{blocked}"
    );
    assert!(blocked["terminal_for_ms"].is_u64(), "{blocked}");
    assert_eq!(blocked["remaining_total"], 1, "{blocked}");
    let process = &blocked["remaining"][0];
    assert_eq!(process["pid"], pid, "{blocked}");
    assert_eq!(process["comm"], "sleep", "{blocked}");
    assert_eq!(process["state"], "S", "{blocked}");
    assert_eq!(process["cgroup"], cgroup.as_str(), "{blocked}");

    sandbox.run("kill", &["-KILL", &pid.to_string()]);
    agent.one(&["wait", "blocker.service", "--timeout", PATIENCE_ARG]);
    let proven = agent.one(&["status", "blocker.service"]);
    assert_eq!(proven["blocked"], false, "{proven}");
    assert_eq!(proven["remaining"], Value::Null, "{proven}");
    assert_eq!(proven["watch"]["phase"], "proven", "{proven}");
}

//! The agent against real systemd, real D-Bus and real cgroups, driven through its CLI and its
//! socket. Every test boots its own sandbox and agent; nothing is mocked.
//!
//! Waits are generous and no assertion is about speed: these tests must pass on a loaded
//! 2-core machine.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::Test;
use crate::support::Sandbox;
use crate::support::agent::Agent;

/// How long a test waits for something real systemd and the kernel will do.
pub const PATIENCE: Duration = Duration::from_secs(30);
pub const PATIENCE_ARG: &str = "30s";

pub const TESTS: &[Test] = &[
    (
        "a_unit_that_exits_0_is_proven_exited",
        a_unit_that_exits_0_is_proven_exited,
    ),
    ("a_sigkilled_unit_is_proven", a_sigkilled_unit_is_proven),
    (
        "a_unit_whose_object_path_escapes_its_name_is_proven_from_its_signals",
        a_unit_whose_object_path_escapes_its_name_is_proven_from_its_signals,
    ),
    (
        "a_leftover_child_blocks_the_proof_until_it_dies",
        a_leftover_child_blocks_the_proof_until_it_dies,
    ),
    (
        "stop_of_a_unit_that_ignores_sigterm_returns_75_then_proves",
        stop_of_a_unit_that_ignores_sigterm_returns_75_then_proves,
    ),
    (
        "a_restart_outside_is_stopped_once_and_reported",
        a_restart_outside_is_stopped_once_and_reported,
    ),
    (
        "a_stop_then_a_fresh_invocation_beside_a_leftover_waits_for_it",
        a_stop_then_a_fresh_invocation_beside_a_leftover_waits_for_it,
    ),
    (
        "a_unit_dead_and_gone_is_not_found_unless_its_invocation_is_named",
        a_unit_dead_and_gone_is_not_found_unless_its_invocation_is_named,
    ),
    (
        "two_hundred_units_killed_at_once_are_all_proven_none_early",
        two_hundred_units_killed_at_once_are_all_proven_none_early,
    ),
    (
        "bad_socket_input_gets_errors_and_the_agent_survives",
        bad_socket_input_gets_errors_and_the_agent_survives,
    ),
    ("cli_usage_errors_exit_2", cli_usage_errors_exit_2),
    (
        "cli_watch_unwatch_and_the_event_stream",
        cli_watch_unwatch_and_the_event_stream,
    ),
    ("cli_version_tells_both_sides", cli_version_tells_both_sides),
    (
        "missing_socket_and_state_directories_are_created",
        missing_socket_and_state_directories_are_created,
    ),
];

/// Starts a transient service running `command` (with extra `systemd-run` options).
pub(crate) fn run_unit(sandbox: &Sandbox, unit: &str, options: &[&str], command: &[&str]) {
    let unit_arg = format!("--unit={unit}");
    let mut args = vec!["--user", unit_arg.as_str()];
    args.extend_from_slice(options);
    args.extend_from_slice(command);
    let out = sandbox.run("systemd-run", &args);
    assert!(
        out.status.success(),
        "systemd-run {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A shell command that waits until the file `go` exists, then exits with `code`. The wait is
/// the workload's own polling, so the test decides when the unit ends.
pub fn exit_when(go: &str, code: i32) -> String {
    format!("while [ ! -e {go} ]; do sleep 0.05; done; exit {code}")
}

fn populated(dir: &Path) -> Option<bool> {
    let events = std::fs::read_to_string(dir.join("cgroup.events")).ok()?;
    events
        .lines()
        .find_map(|l| l.strip_prefix("populated "))
        .map(|v| v == "1")
}

fn cli_event(agent: &Agent, args: &[&str]) -> Value {
    let mut lines = agent.cli_json(args, 0);
    assert_eq!(lines.len(), 1, "{lines:?}");
    lines.remove(0)
}

fn a_unit_that_exits_0_is_proven_exited() {
    let sandbox = Sandbox::start("exit0");
    let agent = Agent::start(&sandbox);
    run_unit(
        &sandbox,
        "exit0.service",
        &[],
        &["sh", "-c", &exit_when("/run/exit0.go", 0)],
    );
    let watch = cli_event(&agent, &["watch", "exit0.service"]);
    assert_eq!(watch["phase"], "watching");
    assert_eq!(watch["active_state"], "active");
    let invocation = sandbox.show("exit0.service", "InvocationID");
    assert_eq!(watch["invocation"], invocation.as_str());
    assert_eq!(watch["populated"], true);

    std::fs::write(sandbox.host_path("/run/exit0.go"), "").expect("write the go file");
    let event = cli_event(
        &agent,
        &["wait", "exit0.service", "--timeout", PATIENCE_ARG],
    );
    assert_eq!(event["unit"], "exit0.service");
    assert_eq!(event["invocation"], invocation.as_str());
    assert_eq!(event["cause"], "exited");
    assert_eq!(event["type"], "proven");
    assert!(
        event["proven_mono_ns"].as_u64().is_some_and(|ns| ns > 0),
        "{event}"
    );
    // No record named: worded from systemd's own exit status.
    assert_eq!(event["message"], "instance exited (exit 0)");
    assert_eq!(event["level"], "info");
    assert_eq!(
        event["systemd"],
        json!({"result": "success", "code": "exited", "status": "0"})
    );

    // Proven stays listed, and a later wait answers at once with the same event.
    let entry = agent.entry("exit0.service").expect("still listed");
    assert_eq!(entry["phase"], "proven");
    assert_eq!(entry["proof"], event);
    assert_eq!(cli_event(&agent, &["wait", "exit0.service"]), event);
}

fn a_sigkilled_unit_is_proven() {
    let sandbox = Sandbox::start("sigkill");
    let agent = Agent::start(&sandbox);
    run_unit(&sandbox, "victim.service", &[], &["sleep", "1000"]);
    cli_event(&agent, &["watch", "victim.service"]);
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "victim.service"]);
    let event = cli_event(
        &agent,
        &["wait", "victim.service", "--timeout", PATIENCE_ARG],
    );
    assert_eq!(event["cause"], "exited");
    assert_eq!(event["stop_requested"], false);
}

/// systemd escapes every byte of a unit's name but letters and digits (and a leading digit)
/// in the object path its signals carry, and the agent turns the path back into the name. A
/// name with each kind of escape (a leading digit, `-`, `_`, `\`, `:`, `@`) is proven from its
/// signals: without them nothing reads the unit again before the resync, minutes away.
fn a_unit_whose_object_path_escapes_its_name_is_proven_from_its_signals() {
    let sandbox = Sandbox::start("escaped");
    let agent = Agent::start(&sandbox);
    let unit = r"7-ep_x@a\x2db:c.service";
    run_unit(&sandbox, unit, &[], &["sleep", "1000"]);
    cli_event(&agent, &["watch", unit]);
    sandbox.systemctl_ok(&["kill", "-s", "KILL", unit]);
    let event = cli_event(&agent, &["wait", unit, "--timeout", PATIENCE_ARG]);
    assert_eq!(event["unit"], unit);
    assert_eq!(event["cause"], "exited");
}

fn a_leftover_child_blocks_the_proof_until_it_dies() {
    let sandbox = Sandbox::start("leftover");
    let agent = Agent::start(&sandbox);
    let script = format!(
        "sleep 1000 & echo $! > /run/leftover.pid; {}",
        exit_when("/run/leftover.go", 0)
    );
    run_unit(
        &sandbox,
        "leftover.service",
        &["-p", "KillMode=process"],
        &["sh", "-c", &script],
    );
    cli_event(&agent, &["watch", "leftover.service"]);
    let cgroup = sandbox.show("leftover.service", "ControlGroup");
    let dir = sandbox.host_cgroup_dir(&cgroup);
    std::fs::write(sandbox.host_path("/run/leftover.go"), "").expect("write the go file");
    sandbox.wait_until("the main process exits", PATIENCE, || {
        let state = sandbox.show("leftover.service", "ActiveState");
        state == "inactive" || state == "failed"
    });
    // The unit is terminal but its child lives on in the cgroup: no proof.
    assert_eq!(
        populated(&dir),
        Some(true),
        "the child is still in {}",
        dir.display()
    );
    let out = agent.cli(&["wait", "leftover.service", "--timeout", "2s"]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let entry = agent.entry("leftover.service").expect("listed");
    assert_eq!(entry["phase"], "watching", "{entry}");
    assert_eq!(entry["populated"], true, "{entry}");
    assert!(
        agent.log_text().contains("processes remain after"),
        "{}",
        agent.log_text()
    );

    let pid: i32 = std::fs::read_to_string(sandbox.host_path("/run/leftover.pid"))
        .expect("the child's pid")
        .trim()
        .parse()
        .expect("a pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the leftover child");
    let event = cli_event(
        &agent,
        &["wait", "leftover.service", "--timeout", PATIENCE_ARG],
    );
    assert_eq!(event["cause"], "exited");
    assert_ne!(populated(&dir), Some(true));
}

fn stop_of_a_unit_that_ignores_sigterm_returns_75_then_proves() {
    let sandbox = Sandbox::start("stubborn");
    let agent = Agent::start(&sandbox);
    run_unit(
        &sandbox,
        "stubborn.service",
        &["-p", "TimeoutStopSec=5"],
        &["sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"],
    );
    cli_event(&agent, &["watch", "stubborn.service"]);
    let out = agent.cli(&["stop", "stubborn.service", "--timeout", "1s"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "stop must give up at its deadline while systemd waits for SIGKILL: {out:?}"
    );
    let entry = agent.entry("stubborn.service").expect("still watched");
    assert_eq!(entry["phase"], "stopping", "{entry}");
    assert_eq!(entry["stop_requested"], true);
    // systemd sends SIGKILL after TimeoutStopSec; the proof then arrives on its own.
    let event = cli_event(
        &agent,
        &["wait", "stubborn.service", "--timeout", PATIENCE_ARG],
    );
    assert_eq!(event["cause"], "exited");
    assert_eq!(event["stop_requested"], true);
    let result = sandbox.show("stubborn.service", "Result");
    assert!(result == "timeout" || result.is_empty(), "{result}");
}

fn a_restart_outside_is_stopped_once_and_reported() {
    let sandbox = Sandbox::start("restart");
    sandbox.install_unit(
        "restarted.service",
        "[Service]\nExecStart=/bin/sleep 1000\n",
    );
    sandbox.systemctl_ok(&["start", "restarted.service"]);
    let agent = Agent::start(&sandbox);
    let ours = sandbox.show("restarted.service", "InvocationID");
    cli_event(&agent, &["watch", "restarted.service"]);
    // The agent is paused through the restart, as a busy agent would be: it then reads the
    // old invocation's terminal state only after the new one populates the cgroup, so it must
    // not prove "exited" but see the foreign invocation, stop it once, and prove from that.
    let agent_pid = nix::unistd::Pid::from_raw(agent.pid() as i32);
    nix::sys::signal::kill(agent_pid, nix::sys::signal::Signal::SIGSTOP).expect("pause the agent");
    let restarted = sandbox.systemctl(&["restart", "restarted.service"]);
    sandbox.wait_until("the restart is done", PATIENCE, || {
        sandbox.show("restarted.service", "ActiveState") == "active"
            && sandbox.show("restarted.service", "InvocationID") != ours
    });
    nix::sys::signal::kill(agent_pid, nix::sys::signal::Signal::SIGCONT).expect("resume the agent");
    assert!(restarted.status.success(), "{restarted:?}");
    let event = cli_event(
        &agent,
        &["wait", "restarted.service", "--timeout", PATIENCE_ARG],
    );
    assert_eq!(event["cause"], "restarted-outside");
    assert_eq!(
        event["message"],
        "instance exited (status unknown: restarted outside the activator)"
    );
    assert_eq!(event["invocation"], ours.as_str());
    // The foreign invocation was stopped, by us, once.
    sandbox.wait_until("the foreign invocation is stopped", PATIENCE, || {
        sandbox.show("restarted.service", "ActiveState") == "inactive"
    });
    let log = agent.log_text();
    assert_eq!(
        log.matches("stopping (foreign invocation)").count(),
        1,
        "{log}"
    );
}

fn a_stop_then_a_fresh_invocation_beside_a_leftover_waits_for_it() {
    let sandbox = Sandbox::start("replaced");
    // The stop leaves a child in the cgroup, so the first invocation cannot be proven exited
    // before the second one begins, and the second begins beside it.
    sandbox.install_unit(
        "replaced.service",
        "[Service]\nKillMode=process\nExecStart=/bin/sh -c 'sleep 1000 & exec sleep 1000'\n",
    );
    sandbox.systemctl_ok(&["start", "replaced.service"]);
    let agent = Agent::start(&sandbox);
    let ours = sandbox.show("replaced.service", "InvocationID");
    cli_event(&agent, &["watch", "replaced.service"]);
    let out = agent.cli(&["stop", "replaced.service", "--timeout", "2s"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "the leftover child blocks the proof: {out:?}"
    );
    sandbox.systemctl_ok(&["start", "replaced.service"]);
    assert_ne!(sandbox.show("replaced.service", "InvocationID"), ours);
    // A new invocation is no proof while a leftover of ours may still run beside it.
    let out = agent.cli(&["wait", "replaced.service", "--timeout", "3s"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "proven beside a leftover: {out:?}"
    );
    // Every process of the cgroup, the leftover included.
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "replaced.service"]);
    let event = cli_event(
        &agent,
        &["wait", "replaced.service", "--timeout", PATIENCE_ARG],
    );
    assert_eq!(event["cause"], "replaced-after-stop");
    assert_eq!(
        event["message"],
        "instance exited (status unknown: replaced after stop)"
    );
    assert_eq!(event["invocation"], ours.as_str());
}

fn a_unit_dead_and_gone_is_not_found_unless_its_invocation_is_named() {
    let sandbox = Sandbox::start("gone");
    let agent = Agent::start(&sandbox);
    agent.cli_json(
        &["wait", "never-existed.service", "--timeout", PATIENCE_ARG],
        4,
    );
    // A unit that ran and was garbage-collected: systemd no longer knows it.
    run_unit(&sandbox, "brief.service", &[], &["true"]);
    let ran = sandbox.show("brief.service", "InvocationID");
    sandbox.wait_until("brief.service is unloaded", PATIENCE, || {
        sandbox.show("brief.service", "LoadState") != "loaded"
    });
    agent.cli_json(&["stop", "brief.service", "--timeout", PATIENCE_ARG], 4);
    // Named, its invocation is proven at once: inactive with no invocation is over.
    let invocation = if ran.is_empty() {
        "0123456789abcdef0123456789abcdef"
    } else {
        ran.as_str()
    };
    let view = agent.one(&["watch", "brief.service", "--invocation", invocation]);
    assert_eq!(view["phase"], "proven", "{view}");
    assert_eq!(view["proof"]["cause"], "exited", "{view}");
}

fn two_hundred_units_killed_at_once_are_all_proven_none_early() {
    const UNITS: usize = 200;
    let sandbox = Sandbox::start("many");
    sandbox.install_unit("many@.service", "[Service]\nExecStart=/bin/sleep 1000\n");
    let names: Vec<String> = (0..UNITS).map(|i| format!("many@{i}.service")).collect();
    let mut start = vec!["start"];
    start.extend(names.iter().map(String::as_str));
    sandbox.systemctl_ok(&start);
    let agent = Agent::start(&sandbox);

    let mut conn = agent.connect();
    for name in &names {
        let reply = conn.request(&json!({"cmd": "watch", "unit": name}));
        assert_eq!(reply["ok"], true, "{reply}");
        assert_eq!(reply["watch"]["active_state"], "active", "{reply}");
    }
    let mut events = agent.connect();
    assert_eq!(events.request(&json!({"cmd": "events"}))["ok"], true);
    // Pipelined waits on one connection, answered as the proofs arrive.
    for (i, name) in names.iter().enumerate() {
        conn.send_raw(format!("{}\n", json!({"id": i, "cmd": "wait", "unit": name})).as_bytes());
    }
    assert!(
        agent.list().iter().all(|u| u["phase"] == "watching"),
        "nothing is proven before the kill"
    );

    let dirs: Vec<_> = names
        .iter()
        .map(|n| sandbox.host_cgroup_dir(&sandbox.show(n, "ControlGroup")))
        .collect();
    let t_kill = exitproof::clock::monotonic_ns();
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "many@*.service"]);

    let mut proven = [false; UNITS];
    for _ in 0..UNITS {
        let reply = conn.read();
        assert_eq!(reply["ok"], true, "{reply}");
        let i = reply["id"].as_u64().expect("the id of a wait") as usize;
        assert!(!proven[i], "proven twice: {reply}");
        proven[i] = true;
        let event = &reply["event"];
        assert_eq!(event["unit"], names[i].as_str());
        assert!(
            event["proven_mono_ns"].as_u64().expect("ns") > t_kill,
            "{event}"
        );
        assert_ne!(
            populated(&dirs[i]),
            Some(true),
            "proven while populated: {event}"
        );
    }
    // The subscriber saw every proof too, each once.
    let mut seen = std::collections::HashSet::new();
    for _ in 0..UNITS {
        let line = events.read();
        assert!(seen.insert(line["event"]["unit"].as_str().expect("unit").to_owned()));
    }
    assert_eq!(seen.len(), UNITS);
}

fn bad_socket_input_gets_errors_and_the_agent_survives() {
    let sandbox = Sandbox::start("badinput");
    let mut agent = Agent::start(&sandbox);
    let mut conn = agent.connect();
    let cases: &[(&[u8], &str)] = &[
        (b"this is not json\n", "bad-json"),
        (b"{\"cmd\":\"explode\"}\n", "unknown-command"),
        (b"{\"cmd\":\"watch\"}\n", "bad-request"),
        (
            b"{\"cmd\":\"watch\",\"unit\":\"../etc.service\"}\n",
            "invalid-unit",
        ),
        (b"{\"cmd\":\"watch\",\"unit\":\"x\"}\n", "invalid-unit"),
        (
            b"{\"cmd\":\"wait\",\"unit\":\"a.service\",\"timeout_ms\":-1}\n",
            "bad-request",
        ),
        (b"[1,2,3]\n", "bad-request"),
        (b"\xff\xfe\n", "bad-json"),
        (
            b"{\"cmd\":\"unwatch\",\"unit\":\"nope.service\"}\n",
            "not-watched",
        ),
    ];
    for (input, kind) in cases {
        conn.send_raw(input);
        let reply = conn.read();
        assert_eq!(reply["ok"], false, "{reply}");
        assert_eq!(
            reply["error"]["kind"],
            *kind,
            "{}: {reply}",
            String::from_utf8_lossy(input)
        );
    }
    let mut long = vec![b'x'; 100 * 1024];
    long.push(b'\n');
    conn.send_raw(&long);
    assert_eq!(conn.read()["error"]["kind"], "line-too-long");
    // Random bytes from another client, which then vanishes mid-line.
    {
        let mut rogue = agent.connect();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let noise: Vec<u8> = (0..64 * 1024)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed & 0xff) as u8
            })
            .collect();
        rogue.send_raw(&noise);
    }
    assert!(agent.is_running(), "the agent died: {}", agent.log_text());
    let reply = conn.request(&json!({"id": "still-here", "cmd": "list"}));
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(reply["id"], "still-here");
}

fn cli_usage_errors_exit_2() {
    let sandbox = Sandbox::start("usage");
    let agent = Agent::start(&sandbox);
    for args in [
        &["wait", "bad/name.service"][..],
        &["wait", "x.service", "--timeout", "10x"],
        &["watch", "x.service", "--invocation", "not-hex"],
        &["stop"],
        &["frobnicate"],
    ] {
        let out = agent.cli(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
    let out = std::process::Command::new(crate::support::agent::binary())
        .args(["--socket", "/nonexistent/exitproof.sock", "list"])
        .output()
        .expect("run the CLI");
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no agent listening"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

fn cli_version_tells_both_sides() {
    let sandbox = Sandbox::start("version");
    let agent = Agent::start(&sandbox);
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        agent.one(&["version"]),
        json!({"cli": version, "agent": {"protocol": 1, "agent": version}})
    );
    let out = std::process::Command::new(crate::support::agent::binary())
        .args([
            "--socket",
            "/nonexistent/exitproof.sock",
            "version",
            "--json",
        ])
        .output()
        .expect("run the CLI");
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    // The versions, then the failure: both JSON lines on stdout.
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0], json!({"cli": version, "agent": null}));
    assert_eq!(lines[1]["error"]["kind"], "no-agent", "{lines:?}");
    let message = lines[1]["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("no agent listening"), "{message}");
    assert_eq!(out.stderr, b"", "with --json the failure is on stdout");
}

fn cli_watch_unwatch_and_the_event_stream() {
    let sandbox = Sandbox::start("clistream");
    let agent = Agent::start(&sandbox);
    run_unit(&sandbox, "streamed.service", &[], &["sleep", "1000"]);
    run_unit(&sandbox, "dropped.service", &[], &["sleep", "1000"]);
    let ours = sandbox.show("streamed.service", "InvocationID");
    let watch = cli_event(
        &agent,
        &[
            "watch",
            "streamed.service",
            "--invocation",
            &ours.to_uppercase(),
        ],
    );
    assert_eq!(
        watch["invocation"],
        ours.as_str(),
        "normalized to lower case"
    );
    // Watching again is idempotent; with another invocation it is an error.
    assert_eq!(
        cli_event(&agent, &["watch", "streamed.service"])["invocation"],
        ours.as_str()
    );
    let other = "0123456789abcdef0123456789abcdef";
    let out = agent.cli(&["watch", "streamed.service", "--invocation", other]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    cli_event(&agent, &["watch", "dropped.service"]);
    assert_eq!(agent.list().len(), 2);
    agent.cli_json(&["unwatch", "dropped.service"], 0);
    let units: Vec<Value> = agent.list();
    assert_eq!(units.len(), 1, "{units:?}");
    assert_eq!(units[0]["unit"], "streamed.service");
    let out = agent.cli(&["unwatch", "dropped.service"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "unwatching twice is an error: {out:?}"
    );

    let mut events = std::process::Command::new(crate::support::agent::binary())
        .arg("--socket")
        .arg(agent.socket())
        .args(["events", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run exitproof events");
    // The stream is read on a thread, so the test can tell when the subscription is live:
    // it proves throwaway units until one of them shows up on the stream.
    let stdout = events.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            let Ok(line) = line else { break };
            let Ok(value) = serde_json::from_str(&line) else {
                break;
            };
            if tx.send(value).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + PATIENCE;
    let mut probe = 0;
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "exitproof events never streamed"
        );
        probe += 1;
        // A probe names an invocation: a unit systemd does not know is otherwise refused.
        let invocation = format!("{probe:032x}");
        let unit = format!("probe-{probe}.service");
        agent.one(&["watch", &unit, "--invocation", &invocation]);
        if rx.recv_timeout(Duration::from_millis(500)).is_ok() {
            break;
        }
    }
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "streamed.service"]);
    let event = loop {
        let event = rx
            .recv_timeout(PATIENCE)
            .expect("the proof of streamed.service");
        if event["unit"] == "streamed.service" {
            break event;
        }
    };
    assert_eq!(event["cause"], "exited");
    assert_eq!(event["invocation"], ours.as_str());
    let _ = events.kill();
    let _ = events.wait();
    let _ = reader.join();
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "dropped.service"]);
}

fn mode(sandbox: &Sandbox, inner: &str) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    let metadata =
        std::fs::metadata(sandbox.host_path(inner)).unwrap_or_else(|e| panic!("stat {inner}: {e}"));
    assert!(metadata.is_dir(), "{inner} is a directory");
    metadata.permissions().mode() & 0o7777
}

fn missing_socket_and_state_directories_are_created() {
    let sandbox = Sandbox::start("mkdirs");
    // An existing directory is used as it is; only what is missing is created.
    let existing = sandbox.host_path("/run/ep-existing");
    std::fs::create_dir(&existing).expect("create the existing directory");
    std::fs::set_permissions(
        &existing,
        std::os::unix::fs::PermissionsExt::from_mode(0o750),
    )
    .expect("set its mode");
    let agent = Agent::start_at(
        &sandbox,
        "/run/ep-existing/shared/sock/agent.sock",
        "/run/ep-state/a/state",
        &["--allow-gid", "65534"],
    );
    // Others are allowed, so they may search (not list) the socket's directories.
    assert_eq!(mode(&sandbox, "/run/ep-existing"), 0o750);
    assert_eq!(mode(&sandbox, "/run/ep-existing/shared"), 0o711);
    assert_eq!(mode(&sandbox, "/run/ep-existing/shared/sock"), 0o711);
    for dir in ["/run/ep-state", "/run/ep-state/a", "/run/ep-state/a/state"] {
        assert_eq!(mode(&sandbox, dir), 0o700, "{dir}");
    }
    let log = agent.log_text();
    for line in [
        "created directory /run/ep-existing/shared (mode 0711) for the control socket",
        "created directory /run/ep-existing/shared/sock (mode 0711) for the control socket",
        "created directory /run/ep-state (mode 0700) for the state",
        "created directory /run/ep-state/a/state (mode 0700) for the state",
    ] {
        assert!(log.contains(line), "{line:?} not in the log:\n{log}");
    }
    assert!(
        !log.contains("created directory /run/ep-existing "),
        "{log}"
    );
    // It serves, and saves its state there.
    agent.barrier();
    assert!(
        sandbox
            .host_path("/run/ep-state/a/state/state.json")
            .is_file()
    );
    drop(agent);

    // Only the agent's own uid may connect: its socket's directory is private.
    let private = Agent::start_at(
        &sandbox,
        "/run/ep-private/agent.sock",
        "/run/ep-state/a/state",
        &[],
    );
    assert_eq!(mode(&sandbox, "/run/ep-private"), 0o700);
    assert!(private.list().is_empty());
    drop(private);

    // A path component that is a file is refused at start, by name.
    std::fs::write(sandbox.host_path("/run/ep-file"), "").expect("write the file");
    let binary = crate::support::agent::binary_in_sandbox();
    let out = sandbox.run(
        "timeout",
        &[
            "60",
            &binary,
            "agent",
            "--user",
            "--socket",
            "/run/ep-file/agent.sock",
            "--state-dir",
            "/run/ep-state/a/state",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "/run/ep-file exists and is not a directory, so it cannot hold the control socket"
        ),
        "{stderr}"
    );
}

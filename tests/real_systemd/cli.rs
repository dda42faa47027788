//! The CLI's output for people and the typed client, against a real agent: what a person reads
//! and what a program decodes are the agent's own answers.

use std::time::Duration;

use exitproof::control::client::Client;
use exitproof::control::protocol::{ErrorKind, WatchArgs};
use exitproof::unit_name::UnitName;
use serde_json::{Value, json};

use crate::Test;
use crate::agent::run_unit;
use crate::support::Sandbox;
use crate::support::agent::{Agent, SOCKET, binary};

const PATIENCE: Duration = Duration::from_secs(30);

pub const TESTS: &[Test] = &[
    (
        "the_cli_prints_lines_and_a_table_for_people",
        the_cli_prints_lines_and_a_table_for_people,
    ),
    (
        "the_typed_client_reads_exactly_what_the_agent_sends",
        the_typed_client_reads_exactly_what_the_agent_sends,
    ),
    (
        "unit_status_makes_wait_and_stop_exit_with_the_units_own_status",
        unit_status_makes_wait_and_stop_exit_with_the_units_own_status,
    ),
    (
        "a_json_failure_is_one_line_of_its_kind_with_its_own_exit_code",
        a_json_failure_is_one_line_of_its_kind_with_its_own_exit_code,
    ),
    (
        "a_refused_user_reads_the_refusal_and_the_option_that_admits_it",
        a_refused_user_reads_the_refusal_and_the_option_that_admits_it,
    ),
    (
        "wait_past_its_timeout_says_what_blocks_a_unit_systemd_calls_dead",
        wait_past_its_timeout_says_what_blocks_a_unit_systemd_calls_dead,
    ),
    (
        "unwatch_proven_forgets_proven_watches_and_keeps_the_others",
        unwatch_proven_forgets_proven_watches_and_keeps_the_others,
    ),
];

/// Runs the CLI, requires exit 0, and returns its stdout.
fn stdout(agent: &Agent, args: &[&str]) -> String {
    let out = agent.cli(args);
    assert_eq!(out.status.code(), Some(0), "exitproof {args:?}: {out:?}");
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// The cells of each line of a table.
fn cells(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect()
}

fn the_cli_prints_lines_and_a_table_for_people() {
    let sandbox = Sandbox::start("people");
    let agent = Agent::start(&sandbox);
    run_unit(&sandbox, "people.service", &[], &["sleep", "1000"]);
    let ours = sandbox.show("people.service", "InvocationID");
    let short = &ours[..8];

    assert_eq!(
        stdout(&agent, &["watch", "people.service"]),
        format!("watching people.service (invocation {short}, active/running, populated yes)\n")
    );
    let header = ["UNIT", "INVOCATION", "PHASE", "STATE", "POPULATED", "AGE"];
    assert_eq!(
        cells(&stdout(&agent, &["list"])),
        vec![
            header.to_vec(),
            vec![
                "people.service",
                short,
                "watching",
                "active/running",
                "yes",
                "-"
            ],
            vec![],
            vec!["1", "unit", "watched,", "0", "proven"],
        ]
    );
    // --json is accepted anywhere on the line and prints the agent's own values.
    let json = stdout(&agent, &["list", "--json"]);
    let units: Vec<Value> = json
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(units.len(), 1, "{json}");
    assert_eq!(units[0]["unit"], "people.service");
    assert_eq!(units[0]["invocation"], ours.as_str());
    // Byte for byte the lines the CLI printed before it printed for people: each of the agent's
    // values as one JSON line, keys sorted.
    let mut raw = agent.connect();
    let listed = raw.request(&json!({"cmd": "list"}));
    assert_eq!(json, format!("{}\n", listed["units"][0]), "{listed}");
    assert_eq!(
        stdout(&agent, &["--json", "watch", "people.service"]),
        format!("{}\n", listed["units"][0])
    );

    sandbox.systemctl_ok(&["kill", "-s", "KILL", "people.service"]);
    let line = stdout(&agent, &["wait", "people.service", "--timeout", "30s"]);
    let event = agent.one(&["wait", "people.service"]);
    assert_eq!(event["unit"], "people.service", "{event}");
    let told = raw.request(&json!({"cmd": "stop", "unit": "people.service"}));
    for args in [
        ["stop", "people.service", "--json"],
        ["--json", "wait", "people.service"],
    ] {
        assert_eq!(
            stdout(&agent, &args),
            format!("{}\n", told["event"]),
            "{args:?}"
        );
    }
    assert_eq!(
        line,
        format!(
            "proven people.service (invocation {short}): {}\n",
            event["message"].as_str().expect("a message")
        )
    );
    let rows = cells(&stdout(&agent, &["list"]));
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert_eq!(rows[3].join(" "), "1 unit watched, 1 proven", "{rows:?}");
    assert_eq!(
        rows[1][..3],
        ["people.service", short, "proven"],
        "{rows:?}"
    );
    let age = &rows[1][5];
    assert!(
        age.ends_with("ms") || age.ends_with('s') || age.ends_with('m'),
        "the age of the proof: {rows:?}"
    );

    assert_eq!(
        stdout(&agent, &["unwatch", "people.service"]),
        "unwatched people.service\n"
    );
    assert_eq!(
        stdout(&agent, &["--json", "list"]),
        "",
        "nothing is watched"
    );
    assert_eq!(stdout(&agent, &["list"]), "no unit is watched\n");
    let out = agent.cli(&["unwatch", "people.service"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "exitproof: people.service is not watched\n"
    );
}

fn the_typed_client_reads_exactly_what_the_agent_sends() {
    let sandbox = Sandbox::start("typed");
    let agent = Agent::start(&sandbox);
    run_unit(&sandbox, "typed.service", &[], &["sleep", "1000"]);
    let unit: UnitName = "typed.service".parse().expect("a valid name");
    let mut client = Client::connect(agent.socket()).expect("connect");
    client
        .set_read_timeout(Some(PATIENCE))
        .expect("set a read timeout");
    let mut raw = agent.connect();

    let view = client.watch(WatchArgs::new(unit.clone())).expect("watch");
    assert_eq!(
        view.invocation.as_deref(),
        Some(sandbox.show("typed.service", "InvocationID").as_str())
    );
    let units = client.list().expect("list");
    let listed = raw.request(&json!({"cmd": "list"}));
    assert_eq!(as_json(&units), listed["units"], "{listed}");
    let version = client.version().expect("version");
    let told = raw.request(&json!({"cmd": "version"}));
    assert_eq!(as_json(&version), told["version"], "{told}");

    let err = client
        .wait(&unit, Some(Duration::ZERO))
        .expect_err("still running");
    assert_eq!(err.kind(), Some(ErrorKind::StillRunning), "{err:?}");

    let before_us = wall_clock_us();
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "typed.service"]);
    let event = client.wait(&unit, Some(PATIENCE)).expect("the proof").event;
    // The proof carries the wall clock, to be found in the journal, and the agent's log
    // line of it names the invocation in its text.
    let proven_us = event.proven_realtime_us.expect("a wall-clock time");
    assert!(
        (before_us..=wall_clock_us()).contains(&proven_us),
        "proven at {proven_us} us, not between the kill and now"
    );
    let log = agent.log_text();
    assert!(
        log.lines()
            .any(|line| line.contains("typed.service: proven: ")
                && line.ends_with(&format!("(invocation {})", event.invocation))),
        "{log}"
    );
    // The proof is retained: asked again, the agent sends the same event.
    let again = raw.request(&json!({"cmd": "wait", "unit": "typed.service"}));
    assert_eq!(as_json(&event), again["event"], "{again}");
    assert_eq!(
        client.stop(&unit, None).expect("stop a proven unit").event,
        event
    );
    let listed = raw.request(&json!({"cmd": "list"}));
    assert_eq!(as_json(&client.list().expect("list")), listed["units"]);

    client.unwatch(&unit).expect("unwatch");
    let err = client.unwatch(&unit).expect_err("not watched");
    assert_eq!(err.kind(), Some(ErrorKind::NotWatched), "{err:?}");
}

/// CLOCK_REALTIME now, in microseconds since the epoch.
fn wall_clock_us() -> u64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970");
    u64::try_from(since_epoch.as_micros()).expect("fits")
}

/// A typed value as JSON, to compare with the agent's raw line.
fn as_json(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("a wire value serializes")
}

/// Runs the CLI, requires exit `code`, and returns its (stdout, stderr).
fn exits(agent: &Agent, args: &[&str], code: i32) -> (String, String) {
    let out = agent.cli(args);
    assert_eq!(out.status.code(), Some(code), "exitproof {args:?}: {out:?}");
    (
        String::from_utf8(out.stdout).expect("UTF-8 stdout"),
        String::from_utf8(out.stderr).expect("UTF-8 stderr"),
    )
}

fn unit_status_makes_wait_and_stop_exit_with_the_units_own_status() {
    let sandbox = Sandbox::start("unitstatus");
    let agent = Agent::start(&sandbox);
    let trapping = [
        "sh",
        "-c",
        "trap 'exit 7' USR1; while :; do sleep 0.1; done",
    ];
    run_unit(&sandbox, "seven.service", &[], &trapping);
    run_unit(&sandbox, "nine.service", &[], &["sleep", "1000"]);
    run_unit(&sandbox, "plain.service", &[], &["sleep", "1000"]);
    run_unit(&sandbox, "calm.service", &[], &["sleep", "1000"]);
    for unit in ["seven", "nine", "plain", "calm"] {
        exits(&agent, &["watch", &format!("{unit}.service")], 0);
    }
    sandbox.systemctl_ok(&["kill", "-s", "USR1", "--kill-whom=main", "seven.service"]);
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "nine.service"]);
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "plain.service"]);
    let wait = ["wait", "--timeout", "30s", "--unit-status"];
    let (line, _) = exits(&agent, &[&wait[..], &["seven.service"]].concat(), 7);
    assert!(line.starts_with("proven seven.service "), "{line}");
    exits(&agent, &[&wait[..], &["nine.service"]].concat(), 128 + 9);
    // Without the option, 0 means proven, whatever the unit's status.
    exits(&agent, &["wait", "--timeout", "30s", "plain.service"], 0);
    // A stop's SIGTERM is a success to systemd, so to `--unit-status` as to systemd-run.
    exits(
        &agent,
        &["stop", "--timeout", "30s", "--unit-status", "calm.service"],
        0,
    );
}

fn a_json_failure_is_one_line_of_its_kind_with_its_own_exit_code() {
    let sandbox = Sandbox::start("jsonfail");
    let agent = Agent::start(&sandbox);
    run_unit(&sandbox, "slow.service", &[], &["sleep", "1000"]);
    let failure = |args: &[&str], code: i32| {
        let (stdout, stderr) = exits(&agent, &[&["--json"], args].concat(), code);
        assert_eq!(
            stderr, "",
            "{args:?}: a JSON failure is told on stdout alone"
        );
        assert_eq!(stdout.lines().count(), 1, "{args:?}: one line: {stdout}");
        let line: Value = serde_json::from_str(&stdout).expect("a JSON line");
        let error = &line["error"];
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{line}"
        );
        error["kind"].as_str().expect("a kind").to_owned()
    };
    assert_eq!(failure(&["unwatch", "slow.service"], 3), "not-watched");
    assert_eq!(failure(&["status", "slow.service"], 3), "not-watched");
    assert_eq!(
        failure(&["wait", "slow.service", "--timeout", "100ms"], 75),
        "still-running"
    );
    assert_eq!(failure(&["wait"], 2), "usage");
    let out = std::process::Command::new(binary())
        .args(["--json", "--socket", "/nonexistent/exitproof.sock", "list"])
        .output()
        .expect("run the CLI");
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    let line: Value = serde_json::from_slice(&out.stdout).expect("a JSON line");
    assert_eq!(line["error"]["kind"], "no-agent", "{line}");
    // For a person the same failure is a line on stderr, with the same exit code.
    let (stdout, stderr) = exits(&agent, &["unwatch", "nothing.service"], 3);
    assert_eq!(stdout, "");
    assert_eq!(stderr, "exitproof: nothing.service is not watched\n");
}

/// The CLI as uid and gid 65534 (nobody), inside the sandbox where the agent's socket is:
/// a copy of the binary in the sandbox's /run, which nobody can reach.
fn cli_as_nobody(sandbox: &Sandbox, args: &[&str]) -> std::process::Output {
    let inner = "/run/exitproof-cli-nobody";
    let copy = sandbox.host_path(inner);
    if !copy.exists() {
        std::fs::copy(binary(), &copy).expect("copy the CLI into the sandbox");
    }
    sandbox
        .command("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", inner])
        .args(["--socket", SOCKET])
        .args(args)
        .output()
        .expect("run the CLI as nobody")
}

fn a_refused_user_reads_the_refusal_and_the_option_that_admits_it() {
    let sandbox = Sandbox::start("refused");
    // A socket anyone may connect to, whose agent admits only its own uid.
    let agent = Agent::start_with(&sandbox, &["--socket-mode", "666"]);
    for args in [&["list"][..], &["wait", "x.service"], &["version"]] {
        let out = cli_as_nobody(&sandbox, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(77), "{args:?}: {out:?}");
        assert!(
            stderr.contains("uid 65534 is not allowed to use this socket")
                && stderr.contains("--allow-uid 65534"),
            "{args:?}: the refusal, not a broken pipe: {stderr}"
        );
    }
    drop(agent);
    // A socket whose mode keeps nobody out: connect(2) fails with EACCES.
    let _agent = Agent::start(&sandbox);
    let out = cli_as_nobody(&sandbox, &["list"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{out:?}");
    assert!(
        stderr.contains("does not let uid 65534 connect") && stderr.contains("--allow-uid"),
        "{stderr}"
    );
}

fn wait_past_its_timeout_says_what_blocks_a_unit_systemd_calls_dead() {
    let sandbox = Sandbox::start("deadblocked");
    sandbox.install_unit(
        "lingers.service",
        "[Service]\nKillMode=process\nExecStart=/bin/sh -c 'sleep 1000 & exec sleep 1000'\n",
    );
    sandbox.systemctl_ok(&["start", "lingers.service"]);
    let agent = Agent::start(&sandbox);
    let cgroup = sandbox.show("lingers.service", "ControlGroup");
    exits(&agent, &["watch", "lingers.service"], 0);
    // Stops the main process alone; the background sleep stays.
    sandbox.systemctl_ok(&["stop", "lingers.service"]);
    let leftovers = sandbox.cgroup_pids(&cgroup);
    assert_eq!(leftovers.len(), 1, "one process left over: {leftovers:?}");
    let (_, stderr) = exits(&agent, &["wait", "lingers.service", "--timeout", "1s"], 75);
    assert_eq!(
        stderr,
        "exitproof: lingers.service not proven before the timeout: systemd says \
         inactive/dead, but 1 process remains in its cgroup (`exitproof status \
         lingers.service` lists them); it stays watched\n"
    );
    for pid in leftovers {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill the leftover");
    }
    exits(&agent, &["wait", "lingers.service", "--timeout", "30s"], 0);
}

fn unwatch_proven_forgets_proven_watches_and_keeps_the_others() {
    let sandbox = Sandbox::start("prune");
    let agent = Agent::start(&sandbox);
    run_unit(&sandbox, "gone.service", &[], &["sleep", "1000"]);
    run_unit(&sandbox, "stays.service", &[], &["sleep", "1000"]);
    exits(&agent, &["watch", "gone.service"], 0);
    exits(&agent, &["watch", "stays.service"], 0);
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "gone.service"]);
    exits(&agent, &["wait", "gone.service", "--timeout", "30s"], 0);
    let (stdout, _) = exits(&agent, &["unwatch", "--proven"], 0);
    assert_eq!(stdout, "unwatched gone.service\n");
    let listed: Vec<Value> = agent.list();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["unit"], "stays.service");
    let (stdout, _) = exits(&agent, &["unwatch", "--proven"], 0);
    assert_eq!(stdout, "no proven watch to unwatch\n");
    let (stdout, _) = exits(&agent, &["--json", "unwatch", "--proven"], 0);
    assert_eq!(stdout, "{\"unwatched\":[]}\n");
}

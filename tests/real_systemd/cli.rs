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
use crate::support::agent::Agent;

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
    assert_eq!(rows.len(), 2, "{rows:?}");
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
    let out = agent.cli(&["unwatch", "people.service"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
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

    sandbox.systemctl_ok(&["kill", "-s", "KILL", "typed.service"]);
    let event = client.wait(&unit, Some(PATIENCE)).expect("the proof").event;
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

/// A typed value as JSON, to compare with the agent's raw line.
fn as_json(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("a wire value serializes")
}

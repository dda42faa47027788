//! Exit records, systemd's trusted exit status and generations, against real systemd.
//!
//! Units write their record with `exitproof record` from `ExecStopPost=`, as a user would; the
//! hostile cases put a symlink, a huge file, a FIFO or escape sequences where the record goes.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::Test;
use crate::support::Sandbox;
use crate::support::agent::{Agent, binary};

const PATIENCE: &str = "30s";
/// The run directory, inside the sandbox.
const RUN_DIR: &str = "/run/records";

pub const TESTS: &[Test] = &[
    (
        "exec_stop_post_records_word_exit_0_exit_3_and_sigkill",
        exec_stop_post_records_word_exit_0_exit_3_and_sigkill,
    ),
    (
        "without_a_record_systemd_words_the_exit",
        without_a_record_systemd_words_the_exit,
    ),
    (
        "hostile_records_are_no_record_and_the_agent_stays_up",
        hostile_records_are_no_record_and_the_agent_stays_up,
    ),
    (
        "a_generation_is_finalised_once_and_only_after_its_proof",
        a_generation_is_finalised_once_and_only_after_its_proof,
    ),
    (
        "the_record_helper_fails_clearly_without_its_variables",
        the_record_helper_fails_clearly_without_its_variables,
    ),
];

/// The agent binary as a unit inside the sandbox can execute it.
fn inner_binary() -> String {
    format!("/proc/{}/root{}", std::process::id(), binary())
}

fn one(agent: &Agent, args: &[&str]) -> Value {
    let mut lines = agent.cli_json(args, 0);
    assert_eq!(lines.len(), 1, "{lines:?}");
    lines.remove(0)
}

/// A unit that waits for its go file, then exits `code`, and records its exit on the way out.
fn recording_unit(name: &str, code: i32) -> String {
    format!(
        "[Service]\n\
         ExecStart=/bin/sh -c 'while [ ! -e /run/{name}.go ]; do sleep 0.05; done; exit {code}'\n\
         ExecStopPost={} record --dir {RUN_DIR}\n",
        inner_binary()
    )
}

fn exec_stop_post_records_word_exit_0_exit_3_and_sigkill() {
    let sandbox = Sandbox::start("records");
    std::fs::create_dir_all(sandbox.host_path(RUN_DIR)).expect("create the run dir");
    let agent = Agent::start(&sandbox);
    sandbox.install_unit("zero.service", &recording_unit("zero", 0));
    sandbox.install_unit("three.service", &recording_unit("three", 3));
    sandbox.install_unit("killed.service", &recording_unit("killed", 0));
    let cases = [
        (
            "zero",
            "info",
            "instance exited (exit 0)",
            json!({"result": "success", "code": "exited", "status": "0"}),
        ),
        (
            "three",
            "warn",
            "instance exited: exit 3 (exit-code)",
            json!({"result": "exit-code", "code": "exited", "status": "3"}),
        ),
        (
            "killed",
            "warn",
            "instance exited: signal KILL",
            json!({"result": "signal", "code": "killed", "status": "KILL"}),
        ),
    ];
    for (name, level, message, expected) in cases {
        let unit = format!("{name}.service");
        sandbox.systemctl_ok(&["start", &unit]);
        let invocation = sandbox.show(&unit, "InvocationID");
        let watch = one(&agent, &["watch", &unit, "--run-dir", RUN_DIR]);
        let record_name = format!("exit-{invocation}.json");
        assert_eq!(watch["record"], record_name.as_str(), "{watch}");
        if name == "killed" {
            sandbox.systemctl_ok(&["kill", "-s", "KILL", &unit]);
        } else {
            std::fs::write(sandbox.host_path(&format!("/run/{name}.go")), "").expect("go");
        }
        let event = one(&agent, &["wait", &unit, "--timeout", PATIENCE]);
        assert_eq!(event["cause"], "exited", "{event}");
        assert_eq!(event["message"], message, "{event}");
        assert_eq!(event["level"], level, "{event}");
        assert_eq!(event["systemd"], expected, "{event}");
        assert_eq!(event["record"], expected, "{event}");
        let record = sandbox.host_path(&format!("{RUN_DIR}/{record_name}"));
        assert!(
            !record.exists(),
            "the record is single use: {}",
            record.display()
        );
    }
}

fn without_a_record_systemd_words_the_exit() {
    let sandbox = Sandbox::start("norecord");
    let agent = Agent::start(&sandbox);
    let out = sandbox.run(
        "systemd-run",
        &[
            "--user",
            "--unit=plain.service",
            "sh",
            "-c",
            "while [ ! -e /run/plain.go ]; do sleep 0.05; done; exit 3",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    one(&agent, &["watch", "plain.service"]);
    std::fs::write(sandbox.host_path("/run/plain.go"), "").expect("go");
    let event = one(&agent, &["wait", "plain.service", "--timeout", PATIENCE]);
    assert_eq!(
        event["message"], "instance exited: exit 3 (exit-code)",
        "{event}"
    );
    assert_eq!(
        event["systemd"],
        json!({"result": "exit-code", "code": "exited", "status": "3"})
    );
    assert_eq!(event["record"], Value::Null);
}

/// Starts `name` (a sleeper), watches it naming `record` in the run dir, lets `plant` put
/// something there, kills the unit and returns the proof.
fn prove_with_planted_record(
    sandbox: &Sandbox,
    agent: &Agent,
    name: &str,
    plant: impl FnOnce(&Path),
) -> Value {
    let unit = format!("{name}.service");
    let out = sandbox.run(
        "systemd-run",
        &["--user", &format!("--unit={unit}"), "sleep", "1000"],
    );
    assert!(out.status.success(), "{out:?}");
    let record = format!("{name}.json");
    one(
        agent,
        &["watch", &unit, "--run-dir", RUN_DIR, "--record", &record],
    );
    plant(&sandbox.host_path(&format!("{RUN_DIR}/{record}")));
    sandbox.systemctl_ok(&["kill", "-s", "KILL", &unit]);
    one(agent, &["wait", &unit, "--timeout", PATIENCE])
}

fn hostile_records_are_no_record_and_the_agent_stays_up() {
    let sandbox = Sandbox::start("hostile");
    std::fs::create_dir_all(sandbox.host_path(RUN_DIR)).expect("create the run dir");
    let mut agent = Agent::start(&sandbox);
    let no_record = "instance exited (status unknown: no exit record)";

    // A symlink to a file outside the run dir: not followed, not removed.
    let outside = sandbox.host_path("/run/outside.json");
    std::fs::write(
        &outside,
        r#"{"result":"success","code":"exited","status":"0"}"#,
    )
    .unwrap();
    let event = prove_with_planted_record(&sandbox, &agent, "symlinked", |path| {
        std::os::unix::fs::symlink("/run/outside.json", path).expect("plant a symlink");
    });
    assert_eq!(event["message"], no_record, "{event}");
    assert_eq!(event["record"], Value::Null);
    let link = sandbox.host_path(&format!("{RUN_DIR}/symlinked.json"));
    assert!(link.symlink_metadata().is_ok(), "a symlink is left alone");
    assert!(
        std::fs::read_to_string(&outside)
            .unwrap()
            .contains("success")
    );

    // 1 MiB: too large to be a record; it is a regular file beneath the dir, so it is removed.
    let event = prove_with_planted_record(&sandbox, &agent, "huge", |path| {
        let mut body = br#"{"result":"success","code":"exited","status":"0","pad":""#.to_vec();
        body.resize(1 << 20, b'x');
        body.extend_from_slice(b"\"}");
        std::fs::write(path, body).expect("plant a huge record");
    });
    assert_eq!(event["message"], no_record, "{event}");
    assert!(!sandbox.host_path(&format!("{RUN_DIR}/huge.json")).exists());

    // A FIFO must not block the loop; it is not a regular file, so it stays.
    let event = prove_with_planted_record(&sandbox, &agent, "fifo", |path| {
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o644))
            .expect("plant a fifo");
    });
    assert_eq!(event["message"], no_record, "{event}");
    let fifo = sandbox.host_path(&format!("{RUN_DIR}/fifo.json"));
    assert!(fifo.symlink_metadata().unwrap().file_type().is_fifo());

    // Newlines and ANSI escapes in the fields: parsed, but every field becomes "?".
    let event = prove_with_planted_record(&sandbox, &agent, "escapes", |path| {
        let body = json!({"result": "exit\ncode", "code": "exited", "status": "\u{1b}[31m3"});
        std::fs::write(path, body.to_string()).expect("plant a record");
    });
    assert_eq!(event["message"], "instance exited: exit ? (?)", "{event}");
    assert_eq!(
        event["record"],
        json!({"result": "?", "code": "exited", "status": "?"})
    );
    assert!(
        !sandbox
            .host_path(&format!("{RUN_DIR}/escapes.json"))
            .exists()
    );

    assert!(agent.is_running(), "{}", agent.log_text());
    assert_eq!(agent.list().len(), 4);
}

fn a_generation_is_finalised_once_and_only_after_its_proof() {
    let sandbox = Sandbox::start("generation");
    sandbox.install_unit("gen@.service", "[Service]\nExecStart=/bin/sleep 1000\n");
    let agent = Agent::start(&sandbox);

    // Generation 1 dies on its own: the launch file goes only after the proof, then one final
    // stop of the inactive unit lets the control side remove the generation's files.
    sandbox.systemctl_ok(&["start", "gen@1.service"]);
    let launch = sandbox.host_path("/run/launch-1.env");
    std::fs::write(&launch, "A=1\n").unwrap();
    let watch = one(
        &agent,
        &[
            "watch",
            "gen@1.service",
            "--gen",
            "1",
            "--launch-file",
            "/run/launch-1.env",
        ],
    );
    assert_eq!(watch["gen"], 1);
    assert_eq!(watch["launch_file"], "/run/launch-1.env");
    let out = agent.cli(&["wait", "gen@1.service", "--timeout", "1s"]);
    assert_eq!(out.status.code(), Some(75));
    assert!(
        launch.exists(),
        "never removed while termination is unproven"
    );
    sandbox.systemctl_ok(&["kill", "-s", "KILL", "gen@1.service"]);
    let event = one(&agent, &["wait", "gen@1.service", "--timeout", PATIENCE]);
    assert_eq!(event["gen"], 1);
    assert_eq!(event["launch_file"], "/run/launch-1.env");
    assert!(!launch.exists(), "removed after the proof");
    let final_stop = "gen@1.service: stopping (final stop of the generation)";
    let wait_for_log = |needle: &str| {
        sandbox.wait_until(needle, Duration::from_secs(30), || {
            agent.log_text().contains(needle)
        });
    };
    wait_for_log(final_stop);

    // Generation 2 is stopped by us: that stop removed its files, so no final stop. Its launch
    // file is a symlink, which is removed without touching what it points to.
    sandbox.systemctl_ok(&["start", "gen@2.service"]);
    let target = sandbox.host_path("/run/launch-target");
    std::fs::write(&target, "keep me\n").unwrap();
    let link = sandbox.host_path("/run/launch-2.env");
    std::os::unix::fs::symlink("/run/launch-target", &link).unwrap();
    one(
        &agent,
        &[
            "watch",
            "gen@2.service",
            "--gen",
            "2",
            "--launch-file",
            "/run/launch-2.env",
        ],
    );
    let event = one(&agent, &["stop", "gen@2.service", "--timeout", PATIENCE]);
    assert_eq!(event["gen"], 2);
    assert!(
        link.symlink_metadata().is_err(),
        "the symlink itself is removed"
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me\n");
    wait_for_log("gen@2.service: stopping (requested)");

    // Generation numbers are never reused.
    let out = agent.cli(&["watch", "gen@1.service", "--gen", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("never reused"),
        "{out:?}"
    );

    let log = agent.log_text();
    assert_eq!(log.matches(final_stop).count(), 1, "{log}");
    assert!(
        !log.contains("gen@2.service: stopping (final stop of the generation)"),
        "{log}"
    );
}

fn the_record_helper_fails_clearly_without_its_variables() {
    let out = std::process::Command::new(binary())
        .args(["record", "--dir", "/nonexistent"])
        .env_remove("SERVICE_RESULT")
        .env_remove("EXIT_CODE")
        .env_remove("EXIT_STATUS")
        .env_remove("INVOCATION_ID")
        .output()
        .expect("run exitproof record");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("SERVICE_RESULT"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    let dir = tempfile::tempdir().expect("a temporary dir");
    let out = std::process::Command::new(binary())
        .args(["record", "--dir"])
        .arg(dir.path())
        .env("SERVICE_RESULT", "exit-code")
        .env("EXIT_CODE", "exited")
        .env("EXIT_STATUS", "3")
        .env("INVOCATION_ID", "0123456789abcdef0123456789abcdef")
        .output()
        .expect("run exitproof record");
    assert!(out.status.success(), "{out:?}");
    let written = dir
        .path()
        .join("exit-0123456789abcdef0123456789abcdef.json");
    let record: Value = serde_json::from_slice(&std::fs::read(&written).unwrap()).unwrap();
    assert_eq!(
        record,
        json!({"result": "exit-code", "code": "exited", "status": "3"})
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(&written.metadata().unwrap().permissions());
    assert_eq!(mode & 0o777, 0o644);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temp file left"
    );
}

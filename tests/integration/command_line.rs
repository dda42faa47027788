//! The `exitproof` binary's command line as a shell gives it: help and the version on stdout,
//! usage errors on stderr (or with `--json` as one JSON line on stdout) with exit 2, and where
//! the socket comes from (`--socket` after the subcommand, before it, `$EXITPROOF_SOCKET`). No
//! agent is needed: a socket where none listens names itself in the failure.

use std::process::{Command, Output};

const BINARY: &str = env!("CARGO_BIN_EXE_exitproof");

fn exitproof(args: &[&str], socket_variable: Option<&str>) -> Output {
    let mut command = Command::new(BINARY);
    command.args(args).env_remove("EXITPROOF_SOCKET");
    if let Some(socket) = socket_variable {
        command.env("EXITPROOF_SOCKET", socket);
    }
    command.output().expect("run the exitproof binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_and_the_version_go_to_stdout() {
    for args in [
        &["--help"][..],
        &["-h"],
        &["help"],
        &["wait", "--help"],
        &["help", "run"],
    ] {
        let output = exitproof(args, None);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {output:?}");
        assert!(
            text(&output.stdout).contains("\nUsage: exitproof "),
            "{output:?}"
        );
        assert!(output.stderr.is_empty(), "{output:?}");
    }
    for args in [["--version"], ["-V"]] {
        let output = exitproof(&args, None);
        assert_eq!(output.status.code(), Some(0), "{output:?}");
        let version = format!("exitproof {}\n", env!("CARGO_PKG_VERSION"));
        assert_eq!(text(&output.stdout), version);
    }
}

#[test]
fn usage_errors_exit_2_on_stderr_or_as_one_json_line() {
    let output = exitproof(&[], None);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(text(&output.stderr).contains("\nCommands:\n"), "{output:?}");
    assert!(output.stdout.is_empty());

    let output = exitproof(&["wath", "web.service"], None);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = text(&output.stderr);
    assert!(
        stderr.starts_with("error: unrecognized subcommand 'wath'\n"),
        "{stderr}"
    );
    assert!(stderr.contains("'watch'"), "a tip names watch: {stderr}");
    assert!(
        stderr.ends_with("For more information, try '--help'.\n"),
        "{stderr}"
    );

    for args in [
        &["--json", "wath"][..],
        &["wait", "--json"],
        &["list", "--json", "-x"],
    ] {
        let output = exitproof(args, None);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        assert!(output.stderr.is_empty(), "{args:?}: {output:?}");
        let line: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("one JSON line");
        assert_eq!(line["error"]["kind"], "usage", "{line}");
        assert!(
            line["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
}

#[test]
fn the_socket_comes_from_after_the_subcommand_then_before_it_then_the_environment() {
    let named = |args: &[&str], variable: Option<&str>| {
        let output = exitproof(args, variable);
        assert_eq!(output.status.code(), Some(69), "{args:?}: {output:?}");
        text(&output.stderr)
    };
    let socket = |name: &str| format!("/nonexistent/exitproof-{name}.sock");
    let (variable, before, after) = (socket("variable"), socket("before"), socket("after"));
    assert!(named(&["list"], Some(&variable)).contains(&variable));
    assert!(named(&["--socket", &before, "list"], Some(&variable)).contains(&before));
    let stderr = named(
        &["--socket", &before, "list", "--socket", &after],
        Some(&variable),
    );
    assert!(stderr.contains(&after), "{stderr}");
}

//! The command line read against its table: every subcommand typed as `run` wants it, help and
//! the version, each kind of usage error, and every command line the real-systemd tests and the
//! repository's units and tools type.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::time::Duration;

use super::*;

fn parse(args: &[&str]) -> Result<Outcome, UsageError> {
    Cli::parse(args.iter().map(OsString::from))
}

fn cli(args: &[&str]) -> Cli {
    match parse(args) {
        Ok(Outcome::Run(cli)) => cli,
        other => panic!("{args:?}: {other:?}"),
    }
}

fn printed(args: &[&str]) -> String {
    match parse(args) {
        Ok(Outcome::Print(text)) => text,
        other => panic!("{args:?}: {other:?}"),
    }
}

fn usage(args: &[&str]) -> UsageError {
    match parse(args) {
        Err(error) => error,
        other => panic!("{args:?} is no usage error: {other:?}"),
    }
}

fn unit(name: &str) -> UnitName {
    name.parse().expect("a valid unit name")
}

/// `agent`, typed, as `{:?}` shows it (its socket mode in decimal: 384 is 0o600).
#[test]
fn agent_takes_its_defaults_and_repeated_uids_and_gids() {
    let typed = |args: &[&str]| format!("{:?}", cli(args).command);
    assert_eq!(
        typed(&["agent"]),
        "Agent { socket: SocketArgs { user: false, socket: None }, method_timeout: 10s, \
         resync_interval: 300s, state_dir: None, allow_uids: [], allow_gids: [], \
         socket_mode: 384, metrics_file: None }"
    );
    let given = [
        "agent",
        "--user",
        "--socket=/run/a.sock",
        "--method-timeout",
        "2s",
        "--resync-interval",
        "0",
        "--state-dir",
        "/run/state",
        "--allow-uid",
        "1000",
        "--allow-gid=100",
        "--allow-uid",
        "1001",
        "--socket-mode",
        "0660",
        "--metrics-file",
        "/run/m.prom",
    ];
    assert_eq!(
        typed(&given),
        "Agent { socket: SocketArgs { user: true, socket: Some(\"/run/a.sock\") }, \
         method_timeout: 2s, resync_interval: 0ns, state_dir: Some(\"/run/state\"), \
         allow_uids: [1000, 1001], allow_gids: [100], socket_mode: 432, \
         metrics_file: Some(\"/run/m.prom\") }"
    );
}

#[test]
fn watch_takes_its_unit_and_options_in_any_order() {
    let invocation = "0123456789ABCDEF0123456789abcdef";
    let Cmd::Watch {
        unit: watched,
        invocation: read,
        run_dir,
        record,
        generation,
        launch_file,
        ..
    } = cli(&[
        "watch",
        "--invocation",
        invocation,
        "web.service",
        "--run-dir",
        "/run/web",
        "--record",
        "exit.json",
        "--gen",
        "3",
        "--launch-file",
        "/run/launch-3.env",
    ])
    .command
    else {
        panic!("not watch");
    };
    assert_eq!(watched, unit("web.service"));
    assert_eq!(read.as_deref(), Some("0123456789abcdef0123456789abcdef"));
    assert_eq!(run_dir, Some(PathBuf::from("/run/web")));
    assert_eq!(record.as_ref().map(RecordName::as_str), Some("exit.json"));
    assert_eq!(generation, Some(3));
    assert_eq!(launch_file, Some(PathBuf::from("/run/launch-3.env")));
}

#[test]
fn wait_and_stop_read_their_timeout_and_unit_status() {
    let Cmd::Wait {
        unit: waited,
        timeout,
        unit_status,
        ..
    } = cli(&["wait", "web.service"]).command
    else {
        panic!("not wait");
    };
    assert_eq!(waited, unit("web.service"));
    assert_eq!(timeout.0, None, "infinity by default");
    assert!(!unit_status);
    let Cmd::Stop {
        timeout,
        unit_status,
        ..
    } = cli(&[
        "stop",
        "--timeout",
        "1min 30s",
        "--unit-status",
        "web.service",
    ])
    .command
    else {
        panic!("not stop");
    };
    assert_eq!(timeout.0, Some(Duration::from_secs(90)));
    assert!(unit_status);
}

#[test]
fn unwatch_takes_a_unit_or_proven() {
    assert!(matches!(
        cli(&["unwatch", "web.service"]).command,
        Cmd::Unwatch { unit: Some(u), .. } if u == unit("web.service")
    ));
    assert!(matches!(
        cli(&["unwatch", "--proven"]).command,
        Cmd::Unwatch { unit: None, .. }
    ));
    let neither = usage(&["unwatch"]);
    assert_eq!(
        neither.message,
        "the following required arguments were not provided: [UNIT] (or --proven)"
    );
    let both = usage(&["unwatch", "web.service", "--proven"]);
    assert_eq!(
        both.message,
        "the argument '--proven' cannot be used with '[UNIT]'"
    );
}

#[test]
fn record_start_status_and_the_plain_subcommands_parse() {
    assert!(matches!(
        cli(&["record", "--dir", "/run/d", "--name", "x.json"]).command,
        Cmd::Record { dir, name: Some(name) } if dir == std::path::Path::new("/run/d") && name.as_str() == "x.json"
    ));
    assert!(matches!(
        cli(&["start", "web.service"]).command,
        Cmd::Start { unit: u, .. } if u == unit("web.service")
    ));
    assert!(matches!(
        cli(&["status", "web.service"]).command,
        Cmd::Status { unit: u, .. } if u == unit("web.service")
    ));
    assert!(matches!(cli(&["list"]).command, Cmd::List { .. }));
    assert!(matches!(cli(&["events"]).command, Cmd::Events { .. }));
    assert!(matches!(cli(&["version"]).command, Cmd::Version { .. }));
    assert!(matches!(cli(&["stats"]).command, Cmd::Stats { .. }));
    #[cfg(feature = "docs")]
    {
        assert!(matches!(cli(&["man"]).command, Cmd::Man));
        assert!(matches!(
            cli(&["completions", "fish"]).command,
            Cmd::Completions { shell } if shell == docs::Shell::parse("fish").expect("a shell")
        ));
    }
}

/// `run`'s options come first; its command is the first other word, or what follows `--`,
/// and every word after it is the command's, options or not.
#[test]
fn run_takes_options_then_the_command_verbatim() {
    let run = |args: &[&str]| match cli(args).command {
        Cmd::Run {
            client,
            unit,
            properties,
            method_timeout,
            command,
        } => (
            client.output.json,
            unit,
            properties,
            method_timeout,
            command,
        ),
        other => panic!("{args:?}: {other:?}"),
    };
    let (json, unit_name, properties, method_timeout, command) = run(&[
        "run",
        "--unit",
        "bare",
        "-p",
        "KillMode=process",
        "-pEnvironment=A=1",
        "--property=RuntimeMaxSec=5m",
        "--method-timeout",
        "3s",
        "sleep",
        "--json",
        "-p",
        "1",
    ]);
    assert!(!json, "--json after the command is the command's");
    assert_eq!(unit_name, Some(unit("bare.service")));
    assert_eq!(
        properties,
        ["KillMode=process", "Environment=A=1", "RuntimeMaxSec=5m"]
    );
    assert_eq!(method_timeout, Duration::from_secs(3));
    assert_eq!(command, ["sleep", "--json", "-p", "1"]);

    let (json, unit_name, _, method_timeout, command) =
        run(&["run", "--json", "--", "sh", "-c", "exit 3", "--", "x"]);
    assert!(json);
    assert_eq!(unit_name, None);
    assert_eq!(method_timeout, Duration::from_secs(10));
    assert_eq!(command, ["sh", "-c", "exit 3", "--", "x"]);

    assert_eq!(
        usage(&["run", "--unit", "x"]).message,
        "the following required arguments were not provided: <COMMAND>..."
    );
    assert_eq!(
        usage(&["run", "--bogus", "true"]).message,
        "unexpected argument '--bogus' found"
    );
}

/// `--user`, `--socket` and `--json` count before the subcommand and after it; a `--socket`
/// after it wins over one before.
#[test]
fn client_options_count_before_and_after_the_subcommand() {
    let options = |args: &[&str]| {
        let (socket, output) = cli(args).options();
        (socket.user, socket.socket, output.json)
    };
    let path = |p: &str| Some(PathBuf::from(p));
    assert!(!options(&["list"]).2);
    assert!(options(&["--json", "list"]).2);
    assert!(options(&["list", "--json"]).2);
    assert!(options(&["--user", "list"]).0);
    assert!(options(&["list", "--user"]).0);
    assert_eq!(options(&["--socket", "/a", "list"]).1, path("/a"));
    assert_eq!(options(&["list", "--socket", "/b"]).1, path("/b"));
    assert_eq!(
        options(&["--socket", "/a", "list", "--socket", "/b"]).1,
        path("/b")
    );
    // The agent takes --user and --socket, and prints no results to take --json.
    assert_eq!(
        options(&["--json", "agent", "--socket", "/c"]),
        (false, path("/c"), true)
    );
    assert_eq!(
        usage(&["agent", "--json"]).message,
        "unexpected argument '--json' found"
    );
    // A subcommand that does not ask the agent takes none of them after its name.
    assert_eq!(
        usage(&["record", "--dir", "/d", "--json"]).message,
        "unexpected argument '--json' found"
    );
    assert!(cli(&["--json", "record", "--dir", "/d"]).leading.json);
}

#[test]
fn help_and_version_are_printed() {
    let top = printed(&["--help"]);
    assert!(top.starts_with(spec::ABOUT), "{top}");
    assert!(top.contains("\nUsage: exitproof [OPTIONS] <COMMAND>\n\nCommands:\n"));
    for command in spec::COMMANDS {
        assert!(top.contains(&format!("\n  {} ", command.name)), "{top}");
    }
    assert_eq!(printed(&["-h"]), top);
    assert_eq!(printed(&["help"]), top);
    let version = format!("exitproof {}\n", env!("CARGO_PKG_VERSION"));
    assert_eq!(printed(&["--version"]), version);
    assert_eq!(printed(&["-V"]), version);
    let wait = printed(&["wait", "--help"]);
    assert!(wait.contains("\nUsage: exitproof wait [OPTIONS] <UNIT>\n\nArguments:\n"));
    assert!(wait.contains("[default: infinity]"), "{wait}");
    assert_eq!(printed(&["wait", "-h"]), wait);
    assert_eq!(printed(&["help", "wait"]), wait);
    // Help wins over what else is wrong after it, as with clap.
    assert_eq!(printed(&["wait", "--help", "--bogus"]), wait);
    for command in spec::COMMANDS {
        let help = printed(&[command.name, "--help"]);
        let client_options = help.contains("--json") || help.contains("--socket");
        assert_eq!(
            client_options,
            command.client != spec::Client::None,
            "{help}"
        );
    }
}

#[test]
fn no_subcommand_is_a_usage_error_that_lists_them() {
    let error = usage(&[]);
    assert_eq!(error.text, help::top());
    assert!(error.message.contains("agent, watch, start"), "{error:?}");
    assert!(
        usage(&["--json"])
            .message
            .starts_with("a subcommand is required")
    );
}

#[test]
fn unknown_words_are_usage_errors_with_a_likely_fix() {
    let error = usage(&["frobnicate"]);
    assert_eq!(error.message, "unrecognized subcommand 'frobnicate'");
    assert_eq!(
        error.text,
        "error: unrecognized subcommand 'frobnicate'\n\nUsage: exitproof [OPTIONS] <COMMAND>\n\n\
         For more information, try '--help'.\n"
    );
    assert!(
        usage(&["wath", "web.service"])
            .text
            .contains("  tip: some similar subcommands exist: 'watch', 'wait'\n")
    );
    let error = usage(&["list", "--jsn"]);
    assert_eq!(error.message, "unexpected argument '--jsn' found");
    assert_eq!(
        error.text,
        "error: unexpected argument '--jsn' found\n\n  tip: a similar argument exists: \
         '--json'\n\nUsage: exitproof list [OPTIONS]\n\nFor more information, try '--help'.\n"
    );
    assert!(
        usage(&["--sokcet", "/a", "list"])
            .text
            .contains("'--socket'")
    );
    assert_eq!(
        usage(&["list", "-x"]).message,
        "unexpected argument '-x' found"
    );
    assert_eq!(
        usage(&["wait", "a.service", "b.service"]).message,
        "unexpected argument 'b.service' found"
    );
    assert_eq!(
        usage(&["list", "--json=yes"]).message,
        "unexpected value 'yes' for '--json' found; no more were expected"
    );
    assert_eq!(
        usage(&["help", "nope"]).message,
        "unrecognized subcommand 'nope'"
    );
}

#[test]
fn missing_and_repeated_values_are_usage_errors() {
    assert_eq!(
        usage(&["wait"]).message,
        "the following required arguments were not provided: <UNIT>"
    );
    assert_eq!(
        usage(&["record"]).message,
        "the following required arguments were not provided: --dir <DIR>"
    );
    for args in [
        &["wait", "web.service", "--timeout"][..],
        &["wait", "--timeout", "--unit-status", "web.service"],
        &["--socket"],
    ] {
        let error = usage(args);
        assert!(
            error.message.starts_with("a value is required for '--"),
            "{args:?}: {error:?}"
        );
    }
    assert_eq!(
        usage(&["wait", "x.service", "--timeout", "1s", "--timeout", "2s"]).message,
        "the argument '--timeout <TIMEOUT>' cannot be used multiple times"
    );
    assert_eq!(
        usage(&["--json", "--json", "list"]).message,
        "the argument '--json' cannot be used multiple times"
    );
    assert_eq!(
        usage(&["watch", "x.service", "--record", "exit.json"]).message,
        "the following required arguments were not provided: --run-dir <RUN_DIR>"
    );
    assert_eq!(
        usage(&["watch", "x.service", "--launch-file", "/run/l"]).message,
        "the following required arguments were not provided: --gen <GENERATION>"
    );
}

/// An invalid value's error names it, its argument and the argument's parser's reason.
#[test]
fn invalid_values_are_usage_errors_with_the_reason() {
    let cases: [(&[&str], &str); 8] = [
        (
            &["completions", "tcsh"],
            "invalid value 'tcsh' for '<SHELL>': possible values: bash, elvish, fish, \
             powershell, zsh",
        ),
        (
            &["watch", "x.service", "--gen", "0"],
            "invalid value '0' for '--gen <GENERATION>': generations are numbered from 1",
        ),
        (
            &["wait", "x.service", "--timeout", "10x"],
            "invalid value '10x' for '--timeout <TIMEOUT>': duration \"10x\": unknown unit \
             \"x\" (use us, ms, s, min, h, d, w, M or y)",
        ),
        (
            &["wait", "bad/name.service"],
            "invalid value 'bad/name.service' for '<UNIT>': invalid unit name \
             \"bad/name.service\": unit name contains an invalid character '/'",
        ),
        (
            &["watch", "x.service", "--invocation", "not-hex"],
            "invalid value 'not-hex' for '--invocation <INVOCATION>': must be 32 hexadecimal \
             digits (a systemd invocation ID), not \"not-hex\"",
        ),
        (
            &["agent", "--socket-mode", "999"],
            "invalid value '999' for '--socket-mode <SOCKET_MODE>': \"999\" is not an octal \
             mode such as 600",
        ),
        (
            &["agent", "--allow-uid", "me"],
            "invalid value 'me' for '--allow-uid <ALLOW_UIDS>': invalid digit found in string",
        ),
        (
            &["--socket", "", "list"],
            "invalid value '' for '--socket <SOCKET>': an empty path names no file",
        ),
    ];
    for (args, message) in cases {
        let error = usage(args);
        assert_eq!(error.message, message, "{args:?}");
        assert_eq!(
            error.text,
            format!("error: {message}\n\nFor more information, try '--help'.\n")
        );
    }
}

/// Words that are not UTF-8: a path keeps its bytes, anything else is a usage error.
#[test]
fn non_utf8_words_are_kept_as_paths_or_refused() {
    let odd = OsString::from_vec(b"/run/\xff".to_vec());
    let parsed = Cli::parse([OsString::from("--socket"), odd.clone(), "list".into()]);
    let Ok(Outcome::Run(cli)) = parsed else {
        panic!("{parsed:?}");
    };
    assert_eq!(cli.options().0.socket, Some(PathBuf::from(odd)));
    for args in [
        vec!["wait".into(), OsString::from_vec(b"x\xff.service".to_vec())],
        vec![OsString::from_vec(b"li\xffst".to_vec())],
        vec!["list".into(), OsString::from_vec(b"--js\xffon".to_vec())],
        vec![
            "run".into(),
            "true".into(),
            OsString::from_vec(b"\xff".to_vec()),
        ],
    ] {
        assert!(Cli::parse(args.clone()).is_err(), "{args:?}");
    }
}

/// Every command line the real-systemd tests, the packaged units, the benchmark and the
/// README's examples give the binary (tests/real_systemd, tests/support, contrib/, src/bench),
/// a word a space (`S`: the test socket; `I`: an invocation ID).
#[test]
fn every_command_line_the_repository_types_parses() {
    let words = |line: &str| -> Vec<String> {
        line.split_whitespace()
            .map(|word| match word {
                "S" => "/run/exitproof-test.sock".to_owned(),
                "I" => "0123456789abcdef0123456789abcdef".to_owned(),
                word => word.to_owned(),
            })
            .collect()
    };
    let parse_line = |line: &str| Cli::parse(words(line).into_iter().map(OsString::from));
    for line in [
        "agent",
        "agent --user",
        "agent --socket S --state-dir /run/s",
        "agent --user --socket S --state-dir /run/s",
        "agent --user --state-dir /run/s",
        "agent --user --socket S --state-dir /run/s --socket-mode 666",
        "agent --user --socket S --state-dir /run/s --resync-interval 2s",
        "agent --user --socket S --state-dir /run/s --metrics-file /run/textfile/exitproof.prom",
        "agent --user --socket S --state-dir /run/s --allow-gid 65534",
        "--socket S --json watch x.service",
        "--socket S --json watch x.service --invocation I",
        "--socket S watch x.service --invocation I",
        "--socket S --json watch x@1.service --gen 1 --launch-file /run/launch-1.env",
        "--socket S --json watch x.service --run-dir /run/r",
        "--socket S --json watch x.service --run-dir /run/r --record exit-x.json",
        "--socket S watch gen@1.service --gen 1",
        "--socket S wait x.service --timeout 2s",
        "--socket S --json wait x.service --timeout 20s",
        "--socket S --json wait x.service",
        "--socket S wait --timeout 30s --unit-status x.service",
        "--socket S stop x.service --timeout 1s",
        "--socket S --json stop x.service --timeout 30s",
        "--socket S stop --timeout 30s --unit-status x.service",
        "--socket S stop x.service --json",
        "--socket S --json unwatch x.service",
        "--socket S unwatch --proven",
        "--socket S --json unwatch --proven",
        "--socket S list",
        "--socket S list --json",
        "--json --socket S list",
        "--socket S events --json",
        "--socket S --json version",
        "--socket /nonexistent/exitproof.sock version --json",
        "--socket S --json stats",
        "--socket S --json status x.service",
        "--user version",
        "record --dir /run/r",
        "--user --socket S --json run sh -c exit",
        "--user --socket S --json run --unit rt.service -- sleep 1000",
        "--user --socket S --json run --unit rl.service -p KillMode=process -- sh -c exit",
        "--user --socket S --json run --unit rb.service -p CPUQuota=20% -- true",
        "--user --socket S --json run --unit bare -- true",
        "--user --socket S --json run --unit ghost.service -- /nonexistent/prog",
    ] {
        let parsed = parse_line(line);
        assert!(matches!(parsed, Ok(Outcome::Run(_))), "{line}: {parsed:?}");
    }
    // And the ones they expect refused.
    for line in [
        "--socket S --json wait",
        "--socket S wait bad/name.service",
        "--socket S wait x.service --timeout 10x",
        "--socket S watch x.service --invocation not-hex",
        "--socket S stop",
        "--socket S frobnicate",
    ] {
        assert!(parse_line(line).is_err(), "{line}");
    }
}

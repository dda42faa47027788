//! `exitproof completions` and `exitproof man`: generated from the CLI's own definition, so each
//! must name every subcommand, and a shell clap_complete does not know is a usage error.

use std::process::{Command, Output};

const BINARY: &str = env!("CARGO_BIN_EXE_exitproof");
const SUBCOMMANDS: [&str; 9] = [
    "agent", "watch", "record", "wait", "stop", "unwatch", "list", "events", "version",
];

fn exitproof(args: &[&str]) -> Output {
    Command::new(BINARY)
        .args(args)
        .output()
        .expect("run the exitproof binary")
}

fn stdout_of_success(args: &[&str]) -> String {
    let output = exitproof(args);
    assert!(output.status.success(), "exitproof {args:?}: {output:?}");
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

fn assert_names_subcommands(text: &str, what: &str) {
    assert!(!text.trim().is_empty(), "{what} is empty");
    for subcommand in SUBCOMMANDS {
        assert!(
            text.contains(subcommand),
            "{what} does not mention {subcommand}"
        );
    }
}

#[test]
fn completions_for_each_shell_name_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout_of_success(&["completions", shell]);
        assert_names_subcommands(&script, &format!("the {shell} completions"));
    }
}

#[test]
fn man_page_is_roff_with_a_title_and_every_subcommand() {
    let page = stdout_of_success(&["man"]);
    // clap_mangen opens with roff conditionals (`.ie`/`.el`) that define a quote string, then
    // the title line.
    assert!(
        page.lines().all(|line| !line.is_empty()),
        "roff has no blank lines"
    );
    assert!(page.starts_with('.'), "roff opens with a request");
    assert!(
        page.lines()
            .any(|line| line.starts_with(".TH EXITPROOF 1 ")),
        "no .TH title line"
    );
    assert_names_subcommands(&page, "the man page");
}

#[test]
fn man_page_has_every_option_exit_status_environment_files_and_no_page_of_ours_elsewhere() {
    let page = stdout_of_success(&["man"]);
    for section in [
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "COMMANDS",
        "EXIT STATUS",
        "ENVIRONMENT",
        "FILES",
        "SEE ALSO",
    ] {
        assert!(
            page.contains(&format!(".SH \"{section}\"\n")),
            "no {section}"
        );
    }
    for option in [
        "\\-\\-unit\\-status",
        "\\-\\-allow\\-uid",
        "\\-\\-proven",
        "\\-\\-method\\-timeout",
        "\\-\\-launch\\-file",
        "\\-p\\fR, \\fB\\-\\-property",
    ] {
        assert!(page.contains(option), "the page lacks {option}");
    }
    for code in ["0", "1", "2", "3", "4", "69", "75", "77"] {
        assert!(
            page.contains(&format!(".TP\n\\fB{code}\\fR\n")),
            "exit {code}"
        );
    }
    for variable in ["EXITPROOF_SOCKET", "RUST_LOG"] {
        assert!(page.contains(&format!("\\fB${variable}\\fR")), "{variable}");
    }
    // clap_mangen named a page per subcommand (exitproof-agent(1)), none of which exists.
    for subcommand in SUBCOMMANDS {
        let named = format!("exitproof\\-{subcommand}(1)");
        assert!(!page.contains(&named), "{named} does not exist");
    }
}

#[test]
fn help_fits_80_columns_and_shows_client_options_only_where_they_mean_something() {
    let help = |args: &[&str]| stdout_of_success(&[args, &["--help"]].concat());
    for subcommand in SUBCOMMANDS.iter().chain(&["stats", "status", "run", "man"]) {
        let text = help(&[subcommand]);
        for line in text.lines() {
            assert!(
                line.chars().count() <= 80,
                "{subcommand} --help: {} columns: {line}",
                line.chars().count()
            );
        }
        let client_options = text.contains("--json") || text.contains("--socket");
        let asks_the_agent = !["record", "man"].contains(subcommand);
        assert_eq!(
            client_options, asks_the_agent,
            "{subcommand} --help shows --json or --socket: {text}"
        );
    }
    assert!(help(&[]).lines().all(|line| line.chars().count() <= 80));
}

#[test]
fn unknown_shell_is_a_usage_error() {
    let output = exitproof(&["completions", "tcsh"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("invalid value 'tcsh'"), "{stderr}");
    assert!(
        stderr.contains("bash"),
        "the error lists the shells: {stderr}"
    );
}

//! `exitproof man`: the man page, written from the command line's own definition (every
//! subcommand with its options, so it cannot fall behind) and the sections a page needs
//! besides: EXIT STATUS, ENVIRONMENT, FILES, SEE ALSO. One page: it names no other page of
//! ours, since there is none.

use std::fmt::Write as _;

use clap::{Arg, Command};

use super::failure::EXIT_STATUS;

/// What the environment changes.
const ENVIRONMENT: [(&str, &str); 4] = [
    (
        "EXITPROOF_SOCKET",
        "The control socket, when --socket is not given.",
    ),
    (
        "RUST_LOG",
        "The agent's log level: error, warn, info (the default), debug or trace.",
    ),
    (
        "XDG_RUNTIME_DIR",
        "With --user, the directory of the default socket, exitproof.sock.",
    ),
    (
        "XDG_STATE_HOME",
        "With --user, where the agent keeps its state, in exitproof/ (default \
         ~/.local/state/exitproof).",
    ),
];

/// The files of an agent of the system manager (with --user, see ENVIRONMENT).
const FILES: [(&str, &str); 4] = [
    ("/run/exitproof/exitproof.sock", "The control socket."),
    (
        "/var/lib/exitproof/state.json, /var/lib/exitproof/state.journal",
        "The watch set, kept across restarts: a snapshot and the journal of changes since.",
    ),
    (
        "/var/lib/exitproof/state.lock",
        "Held by the one agent of the state directory.",
    ),
    (
        "/lib/systemd/system/exitproof.service, /lib/systemd/system/exitproof.socket",
        "The agent's unit and its socket unit, as packaged.",
    ),
];

/// Pages of systemd that say what this page leans on.
const SEE_ALSO: &str = "systemctl(1), systemd-run(1), journalctl(1), systemd.time(7), \
                        systemd.service(5), systemd.kill(5)";

/// The man page of `command` (the CLI's, built), in roff.
pub(super) fn page(mut command: Command) -> String {
    command.build();
    let version = command.get_version().unwrap_or_default().to_owned();
    let mut page = String::new();
    let _ = writeln!(
        page,
        ".TH EXITPROOF 1 \"\" \"exitproof {version}\" \"User Commands\""
    );
    section(&mut page, "NAME");
    let _ = writeln!(
        page,
        "exitproof \\- prove that every process of a systemd unit is gone"
    );
    section(&mut page, "SYNOPSIS");
    let _ = writeln!(page, "\\fBexitproof\\fR \\fICOMMAND\\fR [\\fIOPTIONS\\fR]");
    section(&mut page, "DESCRIPTION");
    text(
        &mut page,
        "exitproof agent runs the agent: it watches systemd units and proves, from systemd's \
         unit state over D-Bus and the unit's cgroup becoming empty, that every process of an \
         invocation is gone. Every other command but record, completions and man asks a \
         running agent over its control socket, and prints for a person, or with --json the \
         agent's own values as JSON lines. --user, --socket and --json may also come before \
         the command. Durations are written as systemd writes them (systemd.time(7)): 500ms, \
         10s, 2min, 1min 30s, 1.5s, a bare number of seconds, or infinity.",
    );
    section(&mut page, "COMMANDS");
    for sub in command.get_subcommands_mut() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        let usage = sub.render_usage().to_string();
        let usage = usage.trim().trim_start_matches("Usage:").trim();
        let _ = writeln!(page, ".SS \"{}\"", escape(usage));
        let about = sub
            .get_long_about()
            .or(sub.get_about())
            .map(ToString::to_string)
            .unwrap_or_default();
        text(&mut page, &about);
        for arg in sub.get_arguments() {
            if !arg.is_hide_set() {
                option(&mut page, arg);
            }
        }
    }
    section(&mut page, "EXIT STATUS");
    text(
        &mut page,
        "A failure is one line on stderr, or with --json one line \
         {\"error\":{\"kind\":...,\"message\":...}} on stdout.",
    );
    for (code, meaning) in EXIT_STATUS {
        item(&mut page, &format!("\\fB{code}\\fR"), meaning);
    }
    section(&mut page, "ENVIRONMENT");
    for (name, meaning) in ENVIRONMENT {
        item(&mut page, &format!("\\fB${name}\\fR"), meaning);
    }
    section(&mut page, "FILES");
    for (path, meaning) in FILES {
        item(&mut page, &format!("\\fI{}\\fR", escape(path)), meaning);
    }
    section(&mut page, "SEE ALSO");
    text(&mut page, SEE_ALSO);
    page
}

fn section(page: &mut String, name: &str) {
    let _ = writeln!(page, ".SH \"{name}\"");
}

/// A paragraph of plain text.
fn text(page: &mut String, text: &str) {
    let _ = writeln!(page, ".PP");
    let _ = writeln!(page, "{}", escape(text));
}

/// A tagged paragraph: `tag` (roff already) and its meaning (plain text).
fn item(page: &mut String, tag: &str, meaning: &str) {
    let _ = writeln!(page, ".TP");
    let _ = writeln!(page, "{tag}");
    let meaning = escape(meaning.trim());
    // roff reads an empty line as a blank line of output.
    if !meaning.is_empty() {
        let _ = writeln!(page, "{meaning}");
    }
}

/// One option or argument of a subcommand, with its default.
fn option(page: &mut String, arg: &Arg) {
    let values: Vec<String> = arg
        .get_value_names()
        .map(|names| names.iter().map(|n| format!("\\fI{n}\\fR")).collect())
        .unwrap_or_default();
    let takes_value = arg.get_action().takes_values();
    let tag = match (arg.get_short(), arg.get_long()) {
        _ if arg.is_positional() => {
            let name = values
                .first()
                .cloned()
                .unwrap_or_else(|| format!("\\fI{}\\fR", arg.get_id().as_str().to_uppercase()));
            if arg.is_required_set() {
                name
            } else {
                format!("[{name}]")
            }
        }
        (short, Some(long)) => {
            let mut tag = String::new();
            if let Some(short) = short {
                let _ = write!(tag, "\\fB\\-{short}\\fR, ");
            }
            let _ = write!(tag, "\\fB\\-\\-{}\\fR", escape(long));
            if takes_value {
                let upper = arg.get_id().as_str().to_uppercase();
                let name = values
                    .first()
                    .cloned()
                    .unwrap_or_else(|| format!("\\fI{upper}\\fR"));
                let _ = write!(tag, " {name}");
            }
            tag
        }
        (Some(short), None) => format!("\\fB\\-{short}\\fR"),
        (None, None) => return,
    };
    let mut help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(ToString::to_string)
        .unwrap_or_default();
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if !defaults.is_empty() && takes_value {
        let _ = write!(help, " [default: {}]", defaults.join(", "));
    }
    let possible: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|value| !value.is_hide_set())
        .map(|value| value.get_name().to_owned())
        .collect();
    if !possible.is_empty() {
        let _ = write!(help, " [possible values: {}]", possible.join(", "));
    }
    item(page, &tag, &help);
}

/// Plain text made safe for roff: a backslash and a hyphen written out, and a line that
/// would start with a control character guarded.
fn escape(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    escaped
        .lines()
        .map(|line| {
            if line.starts_with('.') || line.starts_with('\'') {
                format!("\\&{line}")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

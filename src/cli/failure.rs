//! Why a command failed, and what the CLI makes of it: an exit code of the failure's own kind,
//! and one line, for a person on stderr, or with `--json` one JSON line
//! `{"error":{"kind":…,"message":…}}` on stdout with the protocol's error kind.
//!
//! The exit codes (the table of `cli`'s docs, the man page's EXIT STATUS and the README):
//! 0 done; 1 any other failure; 2 usage; 3 not watched; 4 not found; 69 no agent; 75 not
//! proven when the timeout passed; 77 refused.

use std::process::ExitCode;

use serde::Serialize;

use crate::control::ControlError;
use crate::control::protocol::ErrorKind;

/// Exit code of a failure no other code names.
pub(super) const EXIT_FAILED: u8 = 1;
/// Exit code of a command line the table (`spec.rs`) rejects (clap's, as before).
pub(super) const EXIT_USAGE: u8 = 2;
/// Exit code of a unit the agent does not watch.
pub(super) const EXIT_NOT_WATCHED: u8 = 3;
/// Exit code of a unit systemd does not know, as `systemctl`'s (LSB's "not installed").
pub(super) const EXIT_NOT_FOUND: u8 = 4;
/// Exit code when no agent listens on the socket (sysexits' EX_UNAVAILABLE).
pub(super) const EXIT_NO_AGENT: u8 = 69;
/// Exit code of a proof that did not arrive in time (sysexits' EX_TEMPFAIL).
pub(super) const EXIT_STILL_RUNNING: u8 = 75;
/// Exit code of a user the agent or the socket does not admit (sysexits' EX_NOPERM).
pub(super) const EXIT_REFUSED: u8 = 77;

/// Every exit code of the CLI and what it means, for the man page's EXIT STATUS (written by a
/// test: src/cli/docs.rs).
#[cfg(all(test, feature = "docs"))]
pub(super) const EXIT_STATUS: [(&str, &str); 9] = [
    (
        "0",
        "Done: proven (wait, stop), watched, unwatched, listed, printed.",
    ),
    (
        "1",
        "Any other failure: the agent failed (internal, busy), the connection broke, an \
         answer was bad, or (wait or stop with --unit-status, run) systemd gave no exit status.",
    ),
    ("2", "Usage: the command line is wrong (kind usage)."),
    ("3", "The unit is not watched (kind not-watched)."),
    (
        "4",
        "systemd does not know the unit (kind not-found), as systemctl says with 4.",
    ),
    ("69", "No agent listens on the socket (kind no-agent)."),
    (
        "75",
        "Not proven when --timeout passed; the unit stays watched (kind still-running).",
    ),
    (
        "77",
        "Refused: the agent does not admit this user (its --allow-uid, --allow-gid), or the \
         socket's mode does not let it connect (kind forbidden).",
    ),
    (
        "N",
        "wait and stop with --unit-status: the unit's own status, 0 if systemd calls its \
         result a success, else its main process's exit status or 128 + the number of the \
         signal that ended it. run: its main process's exit status, or 128 + the signal's \
         number.",
    ),
];

/// The kind of a failure: the agent's, or one the CLI finds itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// The agent refused the request with this kind.
    Agent(ErrorKind),
    /// No agent listens on the socket.
    NoAgent,
    /// The socket does not let this user connect (`EACCES`), which the agent would call
    /// `forbidden` too.
    NotPermitted,
    /// The command line is wrong.
    Usage,
    /// Anything else: the connection broke, a bad answer, a failed write.
    Failed,
}

impl Kind {
    /// The word `--json` gives the kind: the protocol's, or the CLI's own for the kinds the
    /// agent never sends.
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Agent(kind) => kind.as_str(),
            Kind::NoAgent => "no-agent",
            Kind::NotPermitted => ErrorKind::Forbidden.as_str(),
            Kind::Usage => "usage",
            Kind::Failed => "failed",
        }
    }

    /// The exit code of this kind.
    pub(super) fn exit_code(self) -> u8 {
        match self {
            Kind::Agent(ErrorKind::NotWatched) => EXIT_NOT_WATCHED,
            Kind::Agent(ErrorKind::NotFound) => EXIT_NOT_FOUND,
            Kind::Agent(ErrorKind::StillRunning) => EXIT_STILL_RUNNING,
            Kind::Agent(ErrorKind::Forbidden) | Kind::NotPermitted => EXIT_REFUSED,
            Kind::NoAgent => EXIT_NO_AGENT,
            Kind::Usage => EXIT_USAGE,
            Kind::Agent(_) | Kind::Failed => EXIT_FAILED,
        }
    }
}

/// A failed command: its kind and what a person is told.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) kind: Kind,
    pub(super) message: String,
}

impl Failure {
    /// A failure of [`Kind::Failed`].
    pub(super) fn failed(message: impl Into<String>) -> Failure {
        Failure {
            kind: Kind::Failed,
            message: message.into(),
        }
    }

    /// The text printed for it: `exitproof: <message>` for a person, or the JSON line.
    pub(super) fn text(&self, json: bool) -> String {
        if !json {
            return format!("exitproof: {}\n", self.message);
        }
        #[derive(Serialize)]
        struct Line<'a> {
            error: Body<'a>,
        }
        #[derive(Serialize)]
        struct Body<'a> {
            kind: &'a str,
            message: &'a str,
        }
        let line = Line {
            error: Body {
                kind: self.kind.name(),
                message: &self.message,
            },
        };
        // Two strings always encode.
        let mut text = serde_json::to_string(&line).unwrap_or_default();
        text.push('\n');
        text
    }

    /// The exit code.
    pub(super) fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.kind.exit_code())
    }
}

impl From<ControlError> for Failure {
    fn from(error: ControlError) -> Failure {
        let kind = match &error {
            ControlError::Refused { kind, .. } => Kind::Agent(*kind),
            ControlError::NoAgent { .. } => Kind::NoAgent,
            ControlError::NotPermitted { .. } => Kind::NotPermitted,
            _ => Kind::Failed,
        };
        Failure {
            kind,
            message: error.to_string(),
        }
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure::failed(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_own_exit_code() {
        let cases = [
            (Kind::Agent(ErrorKind::NotWatched), 3, "not-watched"),
            (Kind::Agent(ErrorKind::NotFound), 4, "not-found"),
            (Kind::Agent(ErrorKind::StillRunning), 75, "still-running"),
            (Kind::Agent(ErrorKind::Forbidden), 77, "forbidden"),
            (Kind::NotPermitted, 77, "forbidden"),
            (Kind::NoAgent, 69, "no-agent"),
            (Kind::Usage, 2, "usage"),
            (Kind::Agent(ErrorKind::Internal), 1, "internal"),
            (Kind::Failed, 1, "failed"),
        ];
        for (kind, code, name) in cases {
            assert_eq!((kind.exit_code(), kind.name()), (code, name), "{kind:?}");
        }
    }

    #[test]
    fn a_failure_is_a_line_for_a_person_or_one_json_line() {
        let failure = Failure {
            kind: Kind::Agent(ErrorKind::NotWatched),
            message: "web.service is not watched".to_owned(),
        };
        assert_eq!(
            failure.text(false),
            "exitproof: web.service is not watched\n"
        );
        assert_eq!(
            failure.text(true),
            "{\"error\":{\"kind\":\"not-watched\",\"message\":\"web.service is not watched\"}}\n"
        );
    }
}

//! The agent's control socket: a Unix stream socket speaking JSON lines, specified in
//! `docs/protocol.md`. [`protocol`] owns the wire format of requests and responses, [`wire`] the
//! typed values the agent answers with, [`server`] runs the socket inside the agent's mio loop,
//! [`client`] is the blocking, typed client the CLI uses. Nothing here knows what the commands
//! do; that is the agent's job.

pub mod client;
pub mod protocol;
pub mod server;
pub mod wire;

use std::fmt;
use std::io;
use std::path::PathBuf;

use protocol::ErrorKind;

/// A failure to set up or use the control socket, naming the socket path it concerns.
#[derive(Debug)]
pub enum ControlError {
    /// Another live agent answers on the socket path.
    AlreadyListening {
        /// The socket path.
        path: PathBuf,
    },
    /// The path exists and is not a socket; it is left alone.
    NotASocket {
        /// The offending path.
        path: PathBuf,
    },
    /// Nothing listens on the socket path (missing socket file or a stale one).
    NoAgent {
        /// The socket path.
        path: PathBuf,
    },
    /// An I/O operation on the socket path failed.
    Io {
        /// What was being done, e.g. "bind control socket".
        action: &'static str,
        /// The socket path.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The agent closed the connection.
    Disconnected {
        /// The socket path.
        path: PathBuf,
    },
    /// No line arrived within the client's read timeout.
    TimedOut {
        /// The socket path.
        path: PathBuf,
    },
    /// The agent sent a line longer than the client accepts; the connection is no longer usable.
    LineTooLong {
        /// The socket path.
        path: PathBuf,
        /// The limit in bytes.
        limit: usize,
    },
    /// A request could not be written as JSON (a path that is not UTF-8).
    BadRequest {
        /// The socket path.
        path: PathBuf,
        /// What was wrong with it.
        message: String,
    },
    /// The agent answered a request with an error.
    Refused {
        /// The socket path.
        path: PathBuf,
        /// The class of the failure, what a program decides on.
        kind: ErrorKind,
        /// What went wrong, for people.
        message: String,
    },
    /// The agent sent a line that is not a JSON value, or not the one expected.
    BadResponse {
        /// The socket path.
        path: PathBuf,
        /// What was wrong with it.
        message: String,
    },
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::AlreadyListening { path } => {
                write!(f, "another agent is listening on {}", path.display())
            }
            ControlError::NotASocket { path } => write!(
                f,
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            ),
            ControlError::NoAgent { path } => write!(
                f,
                "no agent listening on {} (is `exitproof agent` running?)",
                path.display()
            ),
            ControlError::Io {
                action,
                path,
                source,
            } => write!(f, "cannot {action} {}: {source}", path.display()),
            ControlError::Disconnected { path } => {
                write!(f, "the agent on {} closed the connection", path.display())
            }
            ControlError::TimedOut { path } => {
                write!(f, "timed out waiting for the agent on {}", path.display())
            }
            ControlError::LineTooLong { path, limit } => write!(
                f,
                "the agent on {} sent a line longer than {limit} bytes",
                path.display()
            ),
            ControlError::BadRequest { path, message } => write!(
                f,
                "cannot send a request to the agent on {}: {message}",
                path.display()
            ),
            // The agent's own message says it all, and names the unit.
            ControlError::Refused { message, .. } => f.write_str(message),
            ControlError::BadResponse { path, message } => write!(
                f,
                "the agent on {} sent an invalid line: {message}",
                path.display()
            ),
        }
    }
}

impl ControlError {
    /// The error kind the agent answered with, if this is its refusal.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            ControlError::Refused { kind, .. } => Some(*kind),
            _ => None,
        }
    }
}

impl std::error::Error for ControlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ControlError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

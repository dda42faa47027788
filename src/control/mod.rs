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

/// Identifies one client connection; never reused during a server's life. It is here rather
/// than in [`server`] because the agent's core names clients too, and the core knows no
/// socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(u64);

impl ClientId {
    /// A client of a simulated or scripted run of the agent's core.
    #[cfg(test)]
    pub(crate) fn for_test(n: u64) -> ClientId {
        ClientId(n)
    }
}

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client {}", self.0)
    }
}

/// A failure to set up or use the control socket, naming the socket path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Another live agent answers on the socket path.
    #[error("another agent is listening on {path}")]
    AlreadyListening {
        /// The socket path.
        path: PathBuf,
    },
    /// The path exists and is not a socket; it is left alone.
    #[error("{path} exists and is not a socket; refusing to replace it")]
    NotASocket {
        /// The offending path.
        path: PathBuf,
    },
    /// Nothing listens on the socket path (missing socket file or a stale one).
    #[error("no agent listening on {path} (is `exitproof agent` running?)")]
    NoAgent {
        /// The socket path.
        path: PathBuf,
    },
    /// The socket's file does not let this user connect (`EACCES`).
    #[error(
        "{path} does not let uid {uid} connect: the agent admits it with --allow-uid {uid} or \
         --allow-gid of its group, and a --socket-mode that lets it connect"
    )]
    NotPermitted {
        /// The socket path.
        path: PathBuf,
        /// This process's uid.
        uid: u32,
    },
    /// An I/O operation on the socket path failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done, e.g. "bind control socket".
        action: &'static str,
        /// The socket path.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The agent closed the connection.
    #[error("the agent on {path} closed the connection")]
    Disconnected {
        /// The socket path.
        path: PathBuf,
    },
    /// No line arrived within the client's read timeout.
    #[error("timed out waiting for the agent on {path}")]
    TimedOut {
        /// The socket path.
        path: PathBuf,
    },
    /// The agent sent a line longer than the client accepts; the connection is no longer usable.
    #[error("the agent on {path} sent a line longer than {limit} bytes")]
    LineTooLong {
        /// The socket path.
        path: PathBuf,
        /// The limit in bytes.
        limit: usize,
    },
    /// A request could not be written as JSON (a path that is not UTF-8).
    #[error("cannot send a request to the agent on {path}: {message}")]
    BadRequest {
        /// The socket path.
        path: PathBuf,
        /// What was wrong with it.
        message: String,
    },
    /// The agent answered a request with an error.
    // The agent's own message says it all, and names the unit.
    #[error("{message}")]
    Refused {
        /// The socket path.
        path: PathBuf,
        /// The class of the failure, what a program decides on.
        kind: ErrorKind,
        /// What went wrong, for people.
        message: String,
    },
    /// The agent sent a line that is not a JSON value, or not the one expected.
    #[error("the agent on {path} sent an invalid line: {message}")]
    BadResponse {
        /// The socket path.
        path: PathBuf,
        /// What was wrong with it.
        message: String,
    },
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

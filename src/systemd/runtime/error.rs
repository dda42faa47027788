//! The errors the runtime itself raises, on top of those of the poll and the sockets.
//!
//! They travel as `std::io::Error`, which is what the zbus runtime traits return; this module
//! must never lose the typed error on the way (it is the `io::Error`'s inner error).

use std::{io, ops::Range};

use mio::Token;

/// Something the runtime refused to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// The waker token given to `MioRuntime::new` lies in the range given for sources.
    #[error(
        "waker token {} lies in the source token range {}..{}",
        .waker.0,
        .sources.start,
        .sources.end
    )]
    WakerTokenInSourceRange {
        /// The waker token.
        waker: Token,
        /// The range of source tokens.
        sources: Range<usize>,
    },
    /// Every token of the source range is held by a registered source.
    #[error("all source tokens {}..{} are in use", .sources.start, .sources.end)]
    SourceTokensExhausted {
        /// The range of source tokens.
        sources: Range<usize>,
    },
    /// zbus asked for a child process, which this runtime does not run.
    #[error("cannot run {program}: the mio runtime does not spawn processes")]
    ProcessSpawnUnsupported {
        /// The program zbus wanted to run.
        program: String,
    },
}

impl From<RuntimeError> for io::Error {
    fn from(error: RuntimeError) -> Self {
        let kind = match error {
            RuntimeError::WakerTokenInSourceRange { .. } => io::ErrorKind::InvalidInput,
            RuntimeError::SourceTokensExhausted { .. } => io::ErrorKind::QuotaExceeded,
            RuntimeError::ProcessSpawnUnsupported { .. } => io::ErrorKind::Unsupported,
        };

        io::Error::new(kind, error)
    }
}

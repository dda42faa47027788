//! Logging to journald's native socket, so that a record about a unit carries it as fields
//! (`journalctl EXITPROOF_UNIT=backup.service` finds every line about it), without libsystemd.
//!
//! One datagram per record, in the native protocol: `NAME=value\n` per field, or for a value
//! holding a newline `NAME\n`, its length as 64-bit little endian, the bytes, `\n`. The socket is
//! non-blocking: a record journald cannot take at once (its queue is full) is dropped and
//! counted ([`dropped`]), never waited for, since the agent's one loop must not stall on its
//! logs.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use log::kv::Key;

/// journald's native socket.
pub(crate) const SOCKET: &str = "/run/systemd/journal/socket";
/// What the agent's records are filed under (`journalctl -t exitproof`).
const IDENTIFIER: &str = "exitproof";

static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Records dropped because journald's socket was full, since the agent started.
pub(crate) fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// The log record keys that become journal fields: `log::info!(unit = ..; "...")`.
const KEYS: [(&str, &str); 3] = [
    ("unit", "EXITPROOF_UNIT"),
    ("invocation", "EXITPROOF_INVOCATION"),
    ("cause", "EXITPROOF_CAUSE"),
];

/// Appends one field to a datagram. `name` must be a journal field name (upper-case letters,
/// digits, `_`, not starting with `_`); the callers' names are constants.
pub(crate) fn encode_field(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    if value.contains(&b'\n') {
        out.push(b'\n');
        out.extend_from_slice(&(value.len() as u64).to_le_bytes());
    } else {
        out.push(b'=');
    }
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// The syslog priority of a log level (3 error ... 7 debug).
fn priority(level: log::Level) -> &'static str {
    match level {
        log::Level::Error => "3",
        log::Level::Warn => "4",
        log::Level::Info => "6",
        log::Level::Debug | log::Level::Trace => "7",
    }
}

/// The datagram of one log record: its message, priority, identifier, where in the code it
/// was logged, and the unit fields it carries (empty values left out).
pub(crate) fn datagram(record: &log::Record<'_>) -> Vec<u8> {
    let message = record.args().to_string();
    let mut out = Vec::with_capacity(message.len() + 128);
    encode_field(&mut out, "MESSAGE", message.as_bytes());
    encode_field(&mut out, "PRIORITY", priority(record.level()).as_bytes());
    encode_field(&mut out, "SYSLOG_IDENTIFIER", IDENTIFIER.as_bytes());
    encode_field(&mut out, "CODE_MODULE", record.target().as_bytes());
    if let Some(file) = record.file() {
        encode_field(&mut out, "CODE_FILE", file.as_bytes());
    }
    if let Some(line) = record.line() {
        encode_field(&mut out, "CODE_LINE", line.to_string().as_bytes());
    }
    let values = record.key_values();
    for (key, field) in KEYS {
        if let Some(value) = values.get(Key::from_str(key)) {
            let text = value.to_string();
            if !text.is_empty() {
                encode_field(&mut out, field, text.as_bytes());
            }
        }
    }
    out
}

/// A socket that sends records to journald's native socket.
#[derive(Debug)]
pub(crate) struct Journald {
    socket: UnixDatagram,
    path: PathBuf,
}

impl Journald {
    /// Opens a non-blocking socket for journald's socket at `path` ([`SOCKET`] is journald's),
    /// failing if nothing listens there. Each record is addressed to the path, not sent on a
    /// connection, so that records reach a journald restarted since (a new socket file).
    pub(crate) fn connect(path: &Path) -> io::Result<Journald> {
        // Fails now, not at the first record, if there is no journald.
        UnixDatagram::unbound()?.connect(path)?;
        let socket = UnixDatagram::unbound()?;
        socket.set_nonblocking(true)?;
        Ok(Journald {
            socket,
            path: path.to_owned(),
        })
    }

    /// Sends one record. `Ok(false)`: journald could not take it at once, and it was
    /// dropped (and counted). `Err`: it could not be sent at all (too large, journald
    /// gone); the caller writes it elsewhere.
    pub(crate) fn send(&self, record: &log::Record<'_>) -> io::Result<bool> {
        match self.socket.send_to(&datagram(record), &self.path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                DROPPED.fetch_add(1, Ordering::Relaxed);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests;

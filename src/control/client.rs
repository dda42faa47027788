//! The CLI's blocking side of the control socket: connect, send a request line, read response and event
//! lines. It never interprets responses beyond parsing them as JSON; the caller decides what they mean.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::ControlError;

/// A blocking connection to the agent's control socket.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    /// Bytes of a line whose end has not arrived yet; kept across a read timeout so nothing is lost.
    partial: Vec<u8>,
}

impl Client {
    /// Connects to the agent listening on `path`.
    pub fn connect(path: &Path) -> Result<Client, ControlError> {
        let stream = UnixStream::connect(path).map_err(|source| match source.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => ControlError::NoAgent {
                path: path.to_owned(),
            },
            _ => ControlError::Io {
                action: "connect to control socket",
                path: path.to_owned(),
                source,
            },
        })?;
        Ok(Client {
            path: path.to_owned(),
            reader: BufReader::new(stream),
            partial: Vec::new(),
        })
    }

    /// Sets how long [`Client::request`] and [`Client::next_line`] wait for a line; `None` waits forever.
    /// A zero duration is rejected by the operating system.
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> Result<(), ControlError> {
        self.reader
            .get_ref()
            .set_read_timeout(timeout)
            .map_err(|source| self.io_error("set read timeout on", source))
    }

    /// Sends `request` as one line and returns the next line the agent sends, which is its response as
    /// long as this connection has not subscribed to events and has no other request outstanding.
    pub fn request(&mut self, request: &Value) -> Result<Value, ControlError> {
        self.send(request)?;
        self.next_line()?.ok_or_else(|| ControlError::Disconnected {
            path: self.path.clone(),
        })
    }

    /// Sends `request` as one line without waiting for the response.
    pub fn send(&mut self, request: &Value) -> Result<(), ControlError> {
        let mut line = request.to_string();
        line.push('\n');
        self.reader
            .get_ref()
            .write_all(line.as_bytes())
            .map_err(|source| self.io_error("write to control socket", source))
    }

    /// Reads the next line (a response or an event) as JSON; `Ok(None)` when the agent closed the
    /// connection cleanly between lines.
    pub fn next_line(&mut self) -> Result<Option<Value>, ControlError> {
        match self.reader.read_until(b'\n', &mut self.partial) {
            Ok(_) if self.partial.is_empty() => Ok(None),
            Ok(_) if self.partial.last() != Some(&b'\n') => Err(ControlError::BadResponse {
                path: self.path.clone(),
                message: "connection closed in the middle of a line".to_owned(),
            }),
            Ok(_) => {
                let line = std::mem::take(&mut self.partial);
                serde_json::from_slice(&line)
                    .map(Some)
                    .map_err(|e| ControlError::BadResponse {
                        path: self.path.clone(),
                        message: e.to_string(),
                    })
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(ControlError::TimedOut {
                    path: self.path.clone(),
                })
            }
            Err(source) => Err(self.io_error("read from control socket", source)),
        }
    }

    fn io_error(&self, action: &'static str, source: io::Error) -> ControlError {
        ControlError::Io {
            action,
            path: self.path.clone(),
            source,
        }
    }
}

//! The CLI's blocking side of the control socket: connect, send a request line, read response and event
//! lines. It never interprets responses beyond parsing them as JSON; the caller decides what they mean.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::ControlError;

/// The longest line [`Client`] accepts by default, newline excluded: 256 MiB. A `list` of 100,000
/// units at ~400 bytes each is ~40 MB; this leaves room for units several times larger while still
/// stopping a runaway peer before it exhausts the CLI's memory.
pub const DEFAULT_MAX_LINE: usize = 256 * 1024 * 1024;

/// A blocking connection to the agent's control socket.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    /// Bytes of a line whose end has not arrived yet; kept across a read timeout so nothing is lost.
    partial: Vec<u8>,
    max_line: usize,
    /// A line exceeded `max_line`; the connection is out of step and every read fails.
    overlong: bool,
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
            max_line: DEFAULT_MAX_LINE,
            overlong: false,
        })
    }

    /// Sets the longest line accepted, newline excluded ([`DEFAULT_MAX_LINE`] unless set). A longer
    /// line fails with [`ControlError::LineTooLong`] as soon as the limit is passed, without
    /// buffering the rest.
    pub fn set_max_line(&mut self, max_line: usize) {
        self.max_line = max_line;
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
    /// connection cleanly between lines. The read timeout applies to each read from the socket, so a
    /// long line that keeps arriving is not cut off by it.
    pub fn next_line(&mut self) -> Result<Option<Value>, ControlError> {
        self.read_line()?;
        if self.partial.is_empty() {
            return Ok(None);
        }
        if self.partial.last() != Some(&b'\n') {
            return Err(ControlError::BadResponse {
                path: self.path.clone(),
                message: "connection closed in the middle of a line".to_owned(),
            });
        }
        let line = std::mem::take(&mut self.partial);
        serde_json::from_slice(&line)
            .map(Some)
            .map_err(|e| ControlError::BadResponse {
                path: self.path.clone(),
                message: e.to_string(),
            })
    }

    /// Like `read_until(b'\n')` into `partial`, but fails once the line exceeds `max_line`.
    fn read_line(&mut self) -> Result<(), ControlError> {
        let too_long = |client: &Client| ControlError::LineTooLong {
            path: client.path.clone(),
            limit: client.max_line,
        };
        if self.overlong {
            return Err(too_long(self));
        }
        loop {
            let available = match self.reader.fill_buf() {
                Ok(available) => available,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ControlError::TimedOut {
                        path: self.path.clone(),
                    });
                }
                Err(source) => return Err(self.io_error("read from control socket", source)),
            };
            if available.is_empty() {
                return Ok(());
            }
            let (take, complete) = match available.iter().position(|&b| b == b'\n') {
                Some(newline) => (newline + 1, true),
                None => (available.len(), false),
            };
            let length = self.partial.len() + take - usize::from(complete);
            if length > self.max_line {
                // The rest of the line is never read, so the stream is out of step for good.
                self.overlong = true;
                self.partial = Vec::new();
                return Err(too_long(self));
            }
            self.partial.extend_from_slice(&available[..take]);
            self.reader.consume(take);
            if complete {
                return Ok(());
            }
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

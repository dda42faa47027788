//! The blocking, typed client of the control socket: one method per command, answering with the
//! [`wire`](super::wire) values the agent serializes, and a refusal as
//! [`ControlError::Refused`] carrying the protocol's error kind.
//!
//! ```no_run
//! use std::path::Path;
//! use std::time::Duration;
//! use exitproof::control::client::Client;
//! use exitproof::control::protocol::{ErrorKind, WatchArgs};
//! use exitproof::unit_name::UnitName;
//!
//! let unit: UnitName = "web.service".parse()?;
//! let mut client = Client::connect(Path::new("/run/exitproof/exitproof.sock"))?;
//! let view = client.watch(WatchArgs::new(unit.clone()))?;
//! println!("watching {} ({:?})", view.unit, view.invocation);
//! match client.wait(&unit, Some(Duration::from_secs(30))) {
//!     Ok(answer) => println!("{}: {}", answer.event.unit, answer.event.message),
//!     Err(e) if e.kind() == Some(ErrorKind::StillRunning) => println!("{unit} still runs"),
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::ControlError;
use super::protocol::{
    Command, ErrorKind, Request, StartArgs, StatusArgs, UnwatchArgs, WaitArgs, WatchArgs,
};
use super::wire::{
    AgentStats, Done, EventAnswer, EventKind, ListAnswer, ProofEvent, StatsAnswer, StatusAnswer,
    UnitStatus, UnwatchedAnswer, Version, VersionAnswer, WatchAnswer, WatchView,
};
use crate::unit_name::UnitName;

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

/// What every answer line says first: whether it succeeded, and if not, why.
#[derive(Deserialize)]
struct Envelope {
    ok: bool,
    error: Option<ErrorBody>,
}

#[derive(Deserialize)]
struct ErrorBody {
    kind: ErrorKind,
    message: String,
}

/// An event line, read for its type alone: a type this build does not know is skipped.
#[derive(Deserialize)]
struct EventType {
    event: TypeField,
}

#[derive(Deserialize)]
struct TypeField {
    #[serde(rename = "type")]
    kind: Value,
}

/// The event stream of a subscribed connection ([`Client::events`]): each proof event as it
/// comes, until the agent closes the connection. Event types this build does not know are
/// skipped, as the protocol asks.
#[derive(Debug)]
pub struct Events {
    client: Client,
}

impl Iterator for Events {
    type Item = Result<ProofEvent, ControlError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let line = match self.client.read_raw() {
                Ok(Some(line)) => line,
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            };
            let kind = match self.client.decode::<EventType>(&line) {
                Ok(event) => event.event.kind,
                Err(e) => return Some(Err(e)),
            };
            if EventKind::deserialize(&kind).is_ok() {
                return Some(self.client.decode::<EventAnswer>(&line).map(|a| a.event));
            }
        }
    }
}

impl Client {
    /// Connects to the agent listening on `path`.
    pub fn connect(path: &Path) -> Result<Client, ControlError> {
        let stream = UnixStream::connect(path).map_err(|source| match source.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => ControlError::NoAgent {
                path: path.to_owned(),
            },
            io::ErrorKind::PermissionDenied => ControlError::NotPermitted {
                path: path.to_owned(),
                uid: nix::unistd::getuid().as_raw(),
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

    /// Sets how long the client waits for a line; `None` waits forever.
    /// A zero duration is rejected by the operating system.
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> Result<(), ControlError> {
        self.reader
            .get_ref()
            .set_read_timeout(timeout)
            .map_err(|source| self.io_error("set read timeout on", source))
    }

    /// Starts watching a unit; answers with the watch as it stands once it is read and saved.
    pub fn watch(&mut self, args: WatchArgs) -> Result<WatchView, ControlError> {
        self.call::<WatchAnswer>(Command::Watch(args))
            .map(|answer| answer.watch)
    }

    /// Starts the unit (systemd's StartUnit, as `systemctl start`) and watches the invocation
    /// its start job began; answers with the watch once it is read and saved. A unit systemd
    /// does not know is refused with [`ErrorKind::NotFound`].
    pub fn start(&mut self, unit: &UnitName) -> Result<WatchView, ControlError> {
        let args = StartArgs { unit: unit.clone() };
        self.call::<WatchAnswer>(Command::Start(args))
            .map(|answer| answer.watch)
    }

    /// Waits for the unit's proof (watching it first if it is not watched), at most `timeout`
    /// (`None`: as long as it takes). At the timeout the error's kind is
    /// [`ErrorKind::StillRunning`]; the unit stays watched.
    pub fn wait(
        &mut self,
        unit: &UnitName,
        timeout: Option<Duration>,
    ) -> Result<EventAnswer, ControlError> {
        self.proof(Command::Wait, unit, timeout)
    }

    /// Stops the unit (a stop of ours requested, then systemd's StopUnit) and waits for its
    /// proof as [`Client::wait`] does.
    pub fn stop(
        &mut self,
        unit: &UnitName,
        timeout: Option<Duration>,
    ) -> Result<EventAnswer, ControlError> {
        self.proof(Command::Stop, unit, timeout)
    }

    /// Sends `wait` or `stop` (`command`) and reads the proof it answers with.
    fn proof(
        &mut self,
        command: fn(WaitArgs) -> Command,
        unit: &UnitName,
        timeout: Option<Duration>,
    ) -> Result<EventAnswer, ControlError> {
        let args = WaitArgs {
            unit: unit.clone(),
            timeout,
        };
        self.call::<EventAnswer>(command(args))
    }

    /// Forgets the unit's watch and its retained proof; answers once that is saved.
    pub fn unwatch(&mut self, unit: &UnitName) -> Result<(), ControlError> {
        let args = UnwatchArgs::unit(unit.clone());
        self.call::<Done>(Command::Unwatch(args)).map(|Done {}| ())
    }

    /// Forgets every proven watch and its retained proof; answers, once that is saved, with
    /// the units it forgot, sorted.
    pub fn unwatch_proven(&mut self) -> Result<Vec<String>, ControlError> {
        let args = UnwatchArgs {
            unit: None,
            proven: true,
        };
        self.call::<UnwatchedAnswer>(Command::Unwatch(args))
            .map(|answer| answer.unwatched)
    }

    /// Every watch, proven ones included, sorted by unit.
    pub fn list(&mut self) -> Result<Vec<WatchView>, ControlError> {
        self.call::<ListAnswer>(Command::List)
            .map(|answer| answer.units)
    }

    /// The protocol's version and the agent's.
    pub fn version(&mut self) -> Result<Version, ControlError> {
        self.call::<VersionAnswer>(Command::Version)
            .map(|answer| answer.version)
    }

    /// The agent's counters and gauges.
    pub fn stats(&mut self) -> Result<AgentStats, ControlError> {
        self.call::<StatsAnswer>(Command::Stats)
            .map(|answer| answer.stats)
    }

    /// One watch, its facts and, when its proof is blocked, the processes that block it.
    pub fn status(&mut self, unit: &UnitName) -> Result<UnitStatus, ControlError> {
        let args = StatusArgs { unit: unit.clone() };
        self.call::<StatusAnswer>(Command::Status(args))
            .map(|answer| answer.status)
    }

    /// Subscribes this connection to the event stream, which it then carries alone.
    pub fn events(mut self) -> Result<Events, ControlError> {
        self.call::<Done>(Command::Events)?;
        Ok(Events { client: self })
    }

    /// Sends `command` and reads its answer, as long as no other request is outstanding on this
    /// connection and it has not subscribed to events.
    fn call<T: DeserializeOwned>(&mut self, command: Command) -> Result<T, ControlError> {
        self.send(&Request { id: None, command })?;
        self.receive()
    }

    /// Sends `request` without waiting for its answer, for pipelining: read the answers with
    /// [`Client::receive`]. They may come in another order than the requests (see
    /// `docs/protocol.md`, "Ordering"): give each request an id when that matters.
    pub fn send(&mut self, request: &Request) -> Result<(), ControlError> {
        let line = serde_json::to_value(request).map_err(|e| ControlError::BadRequest {
            path: self.path.clone(),
            message: e.to_string(),
        })?;
        self.send_json(&line)
    }

    /// Reads the next answer and decodes its payload as `T` (a [`wire`](super::wire) answer such
    /// as [`WatchAnswer`]); an error answer is [`ControlError::Refused`].
    pub fn receive<T: DeserializeOwned>(&mut self) -> Result<T, ControlError> {
        let line = self.answer_line()?;
        self.decode(&line)
    }

    /// Reads the next answer: its line when it succeeded, the refusal when not. Apart from
    /// [`Client::receive`], which is instantiated once per answer type, so that only the
    /// payload's decoding is.
    fn answer_line(&mut self) -> Result<String, ControlError> {
        let line = self.read_raw()?.ok_or_else(|| ControlError::Disconnected {
            path: self.path.clone(),
        })?;
        let envelope: Envelope = self.decode(&line)?;
        match (envelope.ok, envelope.error) {
            (true, _) => Ok(line),
            (false, Some(ErrorBody { kind, message })) => Err(ControlError::Refused {
                path: self.path.clone(),
                kind,
                message,
            }),
            (false, None) => Err(self.bad_response("an error answer without `error`".to_owned())),
        }
    }

    /// Sends `request` as one line and returns the next line the agent sends as JSON, which is its
    /// response as long as this connection has not subscribed to events and has no other request
    /// outstanding. For what the typed methods do not cover: a raw line, a newer command.
    pub fn request_json(&mut self, request: &Value) -> Result<Value, ControlError> {
        self.send_json(request)?;
        self.next_json()?.ok_or_else(|| ControlError::Disconnected {
            path: self.path.clone(),
        })
    }

    /// Sends `request` as one line without waiting for the response.
    pub fn send_json(&mut self, request: &Value) -> Result<(), ControlError> {
        let mut line = request.to_string();
        line.push('\n');
        match self.reader.get_ref().write_all(line.as_bytes()) {
            Ok(()) => Ok(()),
            // An agent that refuses a peer writes why and closes before reading the request,
            // so the write may find the connection closed: the refusal is still to be read.
            Err(source)
                if matches!(
                    source.kind(),
                    io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                ) =>
            {
                match self.answer_line() {
                    Err(refusal @ ControlError::Refused { .. }) => Err(refusal),
                    _ => Err(self.io_error("write to control socket", source)),
                }
            }
            Err(source) => Err(self.io_error("write to control socket", source)),
        }
    }

    /// Reads the next line (a response or an event) as JSON; `Ok(None)` when the agent closed the
    /// connection cleanly between lines. The read timeout applies to each read from the socket, so a
    /// long line that keeps arriving is not cut off by it.
    pub fn next_json(&mut self) -> Result<Option<Value>, ControlError> {
        match self.read_raw()? {
            Some(line) => self.decode(&line).map(Some),
            None => Ok(None),
        }
    }

    /// Reads the next whole line, newline included; `Ok(None)` when the agent closed the
    /// connection cleanly between lines.
    fn read_raw(&mut self) -> Result<Option<String>, ControlError> {
        self.read_line()?;
        if self.partial.is_empty() {
            return Ok(None);
        }
        if self.partial.last() != Some(&b'\n') {
            return Err(self.bad_response("connection closed in the middle of a line".to_owned()));
        }
        String::from_utf8(std::mem::take(&mut self.partial))
            .map(Some)
            .map_err(|e| self.bad_response(format!("not UTF-8: {e}")))
    }

    fn decode<T: DeserializeOwned>(&self, line: &str) -> Result<T, ControlError> {
        // From text, not bytes: the agent decodes the events of its state file from text, and
        // one parser per type serves both (the binary is also the agent's).
        serde_json::from_str(line).map_err(|e| self.bad_response(e.to_string()))
    }

    fn bad_response(&self, message: String) -> ControlError {
        ControlError::BadResponse {
            path: self.path.clone(),
            message,
        }
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

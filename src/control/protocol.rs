//! The control socket's wire format: parsing request lines into typed [`Request`]s and building response
//! and event lines. This is the only module that knows the JSON shapes; it does no I/O and never panics
//! on input.
//!
//! The protocol itself (framing, every request and answer, error kinds, the event stream, ordering,
//! durability and limits) is specified in `docs/protocol.md`; the framing and the limits are
//! [`super::server`]'s, the answers' payloads the agent's.

use std::borrow::Cow;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::record_name::RecordName;
use crate::unit_name::{self, UnitName};

mod response;
mod streamed;

pub use response::{Response, event_line};
pub use streamed::{StreamError, StreamedReply, list_reply};

/// The identifier a client attached to a request, echoed back as the same JSON value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(untagged)]
pub enum RequestId {
    /// An integer id; always an integer (never a fraction) so it echoes back exactly.
    Number(serde_json::Number),
    /// A string id.
    Text(String),
}

impl RequestId {
    fn from_json(value: Value) -> Result<RequestId, String> {
        match value {
            Value::String(text) => Ok(RequestId::Text(text)),
            Value::Number(number) if number.is_u64() || number.is_i64() => {
                Ok(RequestId::Number(number))
            }
            Value::Number(number) => Err(format!(
                "field `id` must be a string or an integer between -2^63 and 2^64-1, not {number}"
            )),
            other => Err(format!(
                "field `id` must be a string or an integer, not {}",
                json_type_name(&other)
            )),
        }
    }
}

/// One request line: what [`parse_request`] makes of a line, and what a client serializes into
/// one (`{"id":…,"cmd":…,<the command's fields>}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The client's id for this request, if it sent one.
    pub id: Option<RequestId>,
    /// What the client asks for.
    pub command: Command,
}

impl Serialize for Request {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Line<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            id: Option<&'a RequestId>,
            #[serde(flatten)]
            command: &'a Command,
        }
        Line {
            id: self.id.as_ref(),
            command: &self.command,
        }
        .serialize(serializer)
    }
}

/// The commands a client can send, each with its validated arguments. Serialized, a command is
/// its `cmd` field and its own fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "cmd", rename_all = "lowercase")]
pub enum Command {
    /// Start watching a unit.
    Watch(WatchArgs),
    /// Wait until a watched unit's processes are all gone.
    Wait(WaitArgs),
    /// Stop a watched unit and wait until its processes are all gone.
    Stop(WaitArgs),
    /// Stop watching a unit.
    Unwatch(UnwatchArgs),
    /// List the watched units.
    List,
    /// Subscribe this connection to the event stream.
    Events,
    /// Tell the protocol's and the agent's versions.
    Version,
    /// Tell the agent's counters and gauges.
    Stats,
    /// Tell one watch, its facts and what blocks its proof.
    Status(StatusArgs),
    /// Start a unit and watch the invocation its start job began.
    Start(StartArgs),
}

impl Command {
    /// Returns the command's wire name (the `cmd` value), for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Watch(_) => "watch",
            Command::Wait(_) => "wait",
            Command::Stop(_) => "stop",
            Command::Unwatch(_) => "unwatch",
            Command::List => "list",
            Command::Events => "events",
            Command::Version => "version",
            Command::Stats => "stats",
            Command::Status(_) => "status",
            Command::Start(_) => "start",
        }
    }
}

// Each argument struct is decoded by serde with `deny_unknown_fields`, so adding a request field is
// one declaration here.

/// The protocol's version, answered by `version`. It goes up when a change could make a client
/// written for the previous one misread the agent; docs/protocol.md says which changes do.
pub const PROTOCOL_VERSION: u32 = 1;

/// What `version` answers: `{"protocol":N,"agent":"x.y.z"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    /// [`PROTOCOL_VERSION`].
    pub protocol: u32,
    /// The agent's own version (the crate's).
    pub agent: Cow<'static, str>,
}

impl Version {
    /// This build's versions.
    pub const CURRENT: Version = Version {
        protocol: PROTOCOL_VERSION,
        agent: Cow::Borrowed(env!("CARGO_PKG_VERSION")),
    };
}

/// Arguments of `watch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "WatchLine")]
pub struct WatchArgs {
    /// The unit to watch.
    pub unit: UnitName,
    /// The invocation to track, as 32 lowercase hex digits; `None` adopts the current invocation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invocation: Option<String>,
    /// The exit record and the generation, if the client names them.
    #[serde(flatten)]
    pub spec: WatchSpec,
}

/// What a watch may carry besides the unit and the invocation: the unit's exit record and its
/// generation. One type from the request to the core's watch, so no layer copies it field by
/// field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WatchSpec {
    /// The run directory that holds the unit's advisory exit record (an absolute path).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_dir: Option<PathBuf>,
    /// The exit record's file name in `run_dir` (one path component); `None` with a `run_dir`
    /// is `exit-<invocation>.json`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<RecordName>,
    /// The generation this invocation belongs to (> 0); generation numbers are never reused.
    #[serde(rename = "gen", skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// The generation's launch file (an absolute path), removed once the generation is proven
    /// gone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch_file: Option<PathBuf>,
}

/// A `watch` line as decoded: flat, because serde checks the fields of a flattened struct only
/// after the missing ones, so `{"cmd":"watch","unti":…}` would say "missing field `unit`"
/// instead of naming the unknown field, as docs/protocol.md shows.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WatchLine {
    unit: UnitName,
    #[serde(default, deserialize_with = "invocation_id")]
    invocation: Option<String>,
    #[serde(default, deserialize_with = "absolute_path")]
    run_dir: Option<PathBuf>,
    #[serde(default, deserialize_with = "record_name")]
    record: Option<RecordName>,
    #[serde(default, rename = "gen", deserialize_with = "generation")]
    generation: Option<u64>,
    #[serde(default, deserialize_with = "absolute_path")]
    launch_file: Option<PathBuf>,
}

impl From<WatchLine> for WatchArgs {
    fn from(line: WatchLine) -> WatchArgs {
        WatchArgs {
            unit: line.unit,
            invocation: line.invocation,
            spec: WatchSpec {
                run_dir: line.run_dir,
                record: line.record,
                generation: line.generation,
                launch_file: line.launch_file,
            },
        }
    }
}

impl WatchArgs {
    /// `watch` of `unit` alone: its current invocation, no exit record, no generation.
    pub fn new(unit: UnitName) -> WatchArgs {
        WatchArgs {
            unit,
            invocation: None,
            spec: WatchSpec::default(),
        }
    }
}

impl WatchArgs {
    /// The checks that involve more than one field.
    fn check(self) -> Result<WatchArgs, (ErrorKind, String)> {
        let bad = |message: &str| Err((ErrorKind::BadRequest, message.to_owned()));
        if self.spec.record.is_some() && self.spec.run_dir.is_none() {
            return bad("field `record` needs `run_dir`");
        }
        if self.spec.launch_file.is_some() && self.spec.generation.is_none() {
            return bad("field `launch_file` needs `gen`");
        }
        Ok(self)
    }
}

fn record_name<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<RecordName>, D::Error> {
    let Some(text) = Option::<String>::deserialize(deserializer)? else {
        return Ok(None);
    };
    RecordName::parse(&text)
        .map(Some)
        .map_err(|e| D::Error::custom(format!("field `record`: {e}")))
}

fn absolute_path<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<PathBuf>, D::Error> {
    let Some(text) = Option::<String>::deserialize(deserializer)? else {
        return Ok(None);
    };
    if text.starts_with('/') && !text.contains('\0') {
        Ok(Some(PathBuf::from(text)))
    } else {
        Err(D::Error::custom("a path field must be an absolute path"))
    }
}

fn generation<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    match Option::<u64>::deserialize(deserializer) {
        Ok(Some(0)) | Err(_) => Err(D::Error::custom(
            "field `gen` must be a whole number greater than 0",
        )),
        Ok(number) => Ok(number),
    }
}

/// Arguments of `wait` and of `stop` (which stops the unit, then waits the same way).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitArgs {
    /// The watched unit.
    pub unit: UnitName,
    /// How long to wait; `None` waits without limit. Sent in whole milliseconds (a longer one
    /// than 2^64-1 ms as that).
    #[serde(
        default,
        rename = "timeout_ms",
        deserialize_with = "timeout_ms",
        serialize_with = "timeout_as_ms",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout: Option<Duration>,
}

fn timeout_as_ms<S: serde::Serializer>(
    timeout: &Option<Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let millis = timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
    millis.serialize(serializer)
}

/// Arguments of `unwatch`: a unit, or every proven watch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnwatchArgs {
    /// The unit to stop watching; `None` with `proven`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<UnitName>,
    /// Forget every proven watch and its retained proof instead of one unit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub proven: bool,
}

impl UnwatchArgs {
    /// `unwatch` of `unit`.
    pub fn unit(unit: UnitName) -> UnwatchArgs {
        UnwatchArgs {
            unit: Some(unit),
            proven: false,
        }
    }

    /// Exactly one of `unit` and `proven`.
    fn check(self) -> Result<UnwatchArgs, (ErrorKind, String)> {
        match (&self.unit, self.proven) {
            (Some(_), false) | (None, true) => Ok(self),
            (Some(_), true) => Err((
                ErrorKind::BadRequest,
                "give `unit` or `proven`, not both".to_owned(),
            )),
            (None, false) => Err((
                ErrorKind::BadRequest,
                "missing field `unit` (or `proven`: true)".to_owned(),
            )),
        }
    }
}

/// Arguments of `status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusArgs {
    /// The watched unit, by the name it was watched by.
    pub unit: UnitName,
}

/// Arguments of `start`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartArgs {
    /// The unit to start and watch.
    pub unit: UnitName,
}

/// The argument list of commands that take none: any field is unknown.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

fn invocation_id<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    let Some(text) = Option::<String>::deserialize(deserializer)? else {
        return Ok(None);
    };
    parse_invocation_id(&text)
        .map(Some)
        .map_err(|e| D::Error::custom(format_args!("field `invocation` {e}")))
}

/// Checks a systemd invocation ID (32 hex digits, any case) and returns it in lower case.
pub fn parse_invocation_id(text: &str) -> Result<String, String> {
    if text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(text.to_ascii_lowercase())
    } else {
        let quoted: String = text.chars().take(64).collect();
        Err(format!(
            "must be 32 hexadecimal digits (a systemd invocation ID), not \"{}\"",
            quoted.escape_debug()
        ))
    }
}

fn timeout_ms<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    let millis = Option::<u64>::deserialize(deserializer).map_err(|_| {
        D::Error::custom(
            "field `timeout_ms` must be a non-negative integer number of milliseconds \
             (at most 2^64-1)",
        )
    })?;
    Ok(millis.map(Duration::from_millis))
}

/// The machine-readable class of a failed request, serialized in kebab-case (`"bad-json"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// The line is not UTF-8 or not JSON.
    BadJson,
    /// The line is JSON but not a valid request.
    BadRequest,
    /// The `cmd` is not a known command.
    UnknownCommand,
    /// The `unit` is not a valid unit name.
    InvalidUnit,
    /// The line exceeded the server's line limit.
    LineTooLong,
    /// The unit is not being watched.
    NotWatched,
    /// systemd does not know the unit (its LoadState is `not-found`, `masked`, `bad-setting`
    /// or `error`), so there is nothing of it to prove.
    NotFound,
    /// A timeout expired while the unit still had processes.
    StillRunning,
    /// The server has too many clients, or the connection too many large replies under way.
    Busy,
    /// The peer's credentials do not allow it to use the socket.
    Forbidden,
    /// The agent failed in a way that is not the client's fault.
    Internal,
    /// A kind this build does not know, read from a newer agent (the protocol lets new kinds
    /// come without a new version: treat it as a failure and show its message). Never sent.
    #[serde(other)]
    Unknown,
}

impl ErrorKind {
    /// Returns the wire name, e.g. `"bad-json"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::BadJson => "bad-json",
            ErrorKind::BadRequest => "bad-request",
            ErrorKind::UnknownCommand => "unknown-command",
            ErrorKind::InvalidUnit => "invalid-unit",
            ErrorKind::LineTooLong => "line-too-long",
            ErrorKind::NotWatched => "not-watched",
            ErrorKind::NotFound => "not-found",
            ErrorKind::StillRunning => "still-running",
            ErrorKind::Busy => "busy",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::Internal => "internal",
            ErrorKind::Unknown => "unknown",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request line that could not be parsed, with the request's id when it could be recovered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct RequestError {
    /// The request's id, if the line was an object with a valid `id`.
    pub id: Option<RequestId>,
    /// The class of the failure.
    pub kind: ErrorKind,
    /// What is wrong, for humans.
    pub message: String,
}

/// Parses one request line (without its newline).
pub fn parse_request(line: &[u8]) -> Result<Request, RequestError> {
    let fail = |id: &Option<RequestId>, kind, message| RequestError {
        id: id.clone(),
        kind,
        message,
    };
    let text = std::str::from_utf8(line).map_err(|e| {
        fail(
            &None,
            ErrorKind::BadJson,
            format!(
                "request is not valid UTF-8 (bad byte at offset {})",
                e.valid_up_to()
            ),
        )
    })?;
    let value: Value = serde_json::from_str(text).map_err(|e| {
        fail(
            &None,
            ErrorKind::BadJson,
            format!("request is not valid JSON: {e}"),
        )
    })?;
    let Value::Object(mut fields) = value else {
        return Err(fail(
            &None,
            ErrorKind::BadRequest,
            format!(
                "request must be a JSON object, not {}",
                json_type_name(&value)
            ),
        ));
    };
    let id = match fields.remove("id") {
        None => None,
        Some(value) => Some(
            RequestId::from_json(value)
                .map_err(|message| fail(&None, ErrorKind::BadRequest, message))?,
        ),
    };
    let name = match fields.remove("cmd") {
        Some(Value::String(name)) => name,
        Some(other) => {
            return Err(fail(
                &id,
                ErrorKind::BadRequest,
                format!(
                    "field `cmd` must be a string, not {}",
                    json_type_name(&other)
                ),
            ));
        }
        None => {
            return Err(fail(
                &id,
                ErrorKind::BadRequest,
                "missing field `cmd`".to_owned(),
            ));
        }
    };
    let command = match name.as_str() {
        "watch" => args::<WatchArgs>(fields)
            .and_then(WatchArgs::check)
            .map(Command::Watch),
        "wait" => args(fields).map(Command::Wait),
        "stop" => args(fields).map(Command::Stop),
        "unwatch" => args::<UnwatchArgs>(fields)
            .and_then(UnwatchArgs::check)
            .map(Command::Unwatch),
        "list" => args::<NoArgs>(fields).map(|NoArgs {}| Command::List),
        "events" => args::<NoArgs>(fields).map(|NoArgs {}| Command::Events),
        "version" => args::<NoArgs>(fields).map(|NoArgs {}| Command::Version),
        "stats" => args::<NoArgs>(fields).map(|NoArgs {}| Command::Stats),
        "status" => args(fields).map(Command::Status),
        "start" => args(fields).map(Command::Start),
        other => {
            let quoted: String = other.chars().take(64).collect();
            Err((
                ErrorKind::UnknownCommand,
                format!(
                    "unknown command \"{}\" (expected watch, start, wait, stop, unwatch, list, events, \
                     version, stats or status)",
                    quoted.escape_debug()
                ),
            ))
        }
    };
    command
        .map(|command| Request {
            id: id.clone(),
            command,
        })
        .map_err(|(kind, message)| fail(&id, kind, message))
}

/// Decodes a command's argument fields (everything but `id` and `cmd`).
fn args<T: DeserializeOwned>(fields: Map<String, Value>) -> Result<T, (ErrorKind, String)> {
    // An invalid unit name has its own error kind, which serde's single error type cannot carry, so
    // the name is checked before serde sees it.
    if let Some(Value::String(unit)) = fields.get("unit") {
        unit_name::validate(unit).map_err(|e| (ErrorKind::InvalidUnit, e.to_string()))?;
    }
    T::deserialize(Value::Object(fields)).map_err(|e| (ErrorKind::BadRequest, e.to_string()))
}

fn json_type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;

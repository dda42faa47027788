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

use crate::unit_name::{self, UnitName};

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
#[serde(deny_unknown_fields)]
pub struct WatchArgs {
    /// The unit to watch.
    pub unit: UnitName,
    /// The invocation to track, as 32 lowercase hex digits; `None` adopts the current invocation.
    #[serde(
        default,
        deserialize_with = "invocation_id",
        skip_serializing_if = "Option::is_none"
    )]
    pub invocation: Option<String>,
    /// The run directory that holds the unit's advisory exit record (an absolute path).
    #[serde(
        default,
        deserialize_with = "absolute_path",
        skip_serializing_if = "Option::is_none"
    )]
    pub run_dir: Option<PathBuf>,
    /// The exit record's file name in `run_dir` (one path component); `None` with a `run_dir`
    /// is `exit-<invocation>.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<String>,
    /// The generation this invocation belongs to (> 0); generation numbers are never reused.
    #[serde(
        default,
        rename = "gen",
        deserialize_with = "generation",
        skip_serializing_if = "Option::is_none"
    )]
    pub generation: Option<u64>,
    /// The generation's launch file (an absolute path), removed once the generation is proven
    /// gone.
    #[serde(
        default,
        deserialize_with = "absolute_path",
        skip_serializing_if = "Option::is_none"
    )]
    pub launch_file: Option<PathBuf>,
}

impl WatchArgs {
    /// `watch` of `unit` alone: its current invocation, no exit record, no generation.
    pub fn new(unit: UnitName) -> WatchArgs {
        WatchArgs {
            unit,
            invocation: None,
            run_dir: None,
            record: None,
            generation: None,
            launch_file: None,
        }
    }
}

impl WatchArgs {
    /// The checks that involve more than one field.
    fn check(self) -> Result<WatchArgs, (ErrorKind, String)> {
        let bad = |message: &str| Err((ErrorKind::BadRequest, message.to_owned()));
        if let Some(name) = &self.record {
            if self.run_dir.is_none() {
                return bad("field `record` needs `run_dir`");
            }
            if let Err(e) = crate::exit::beneath::validate_name(name) {
                return Err((ErrorKind::BadRequest, format!("field `record`: {e}")));
            }
        }
        if self.launch_file.is_some() && self.generation.is_none() {
            return bad("field `launch_file` needs `gen`");
        }
        Ok(self)
    }
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

/// Arguments of `unwatch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnwatchArgs {
    /// The unit to stop watching.
    pub unit: UnitName,
}

/// Arguments of `status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusArgs {
    /// The watched unit, by the name it was watched by.
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
        "unwatch" => args(fields).map(Command::Unwatch),
        "list" => args::<NoArgs>(fields).map(|NoArgs {}| Command::List),
        "events" => args::<NoArgs>(fields).map(|NoArgs {}| Command::Events),
        "version" => args::<NoArgs>(fields).map(|NoArgs {}| Command::Version),
        "stats" => args::<NoArgs>(fields).map(|NoArgs {}| Command::Stats),
        "status" => args(fields).map(Command::Status),
        other => {
            let quoted: String = other.chars().take(64).collect();
            Err((
                ErrorKind::UnknownCommand,
                format!(
                    "unknown command \"{}\" (expected watch, wait, stop, unwatch, list, events, version, \
                     stats or status)",
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

/// One response, built with [`Response::ok`] or [`Response::error`] and sent as [`Response::to_line`].
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    id: Option<RequestId>,
    outcome: Outcome,
}

#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    Ok(Map<String, Value>),
    Error { kind: ErrorKind, message: String },
}

/// Field names the response envelope owns; a payload must not use them.
const RESERVED_FIELDS: [&str; 3] = ["id", "ok", "error"];

impl Response {
    /// A success response carrying `payload`'s fields next to `"ok": true`.
    ///
    /// `payload` must serialize to a JSON object (or to null / `()` for no fields) that does not use the
    /// envelope's fields `id`, `ok` or `error`; otherwise this is the agent's bug, logged and reported to
    /// the client as an `internal` error rather than sent malformed.
    pub fn ok(id: Option<RequestId>, payload: impl Serialize) -> Response {
        let outcome = match serde_json::to_value(payload) {
            Ok(Value::Object(fields)) => match RESERVED_FIELDS
                .iter()
                .find(|reserved| fields.contains_key(**reserved))
            {
                None => Outcome::Ok(fields),
                Some(reserved) => internal_error(format!(
                    "response payload uses the reserved field `{reserved}`"
                )),
            },
            Ok(Value::Null) => Outcome::Ok(Map::new()),
            Ok(other) => internal_error(format!(
                "response payload must be a JSON object, not {}",
                json_type_name(&other)
            )),
            Err(e) => internal_error(format!("response payload cannot be serialized: {e}")),
        };
        Response { id, outcome }
    }

    /// A failure response.
    pub fn error(id: Option<RequestId>, kind: ErrorKind, message: impl Into<String>) -> Response {
        Response {
            id,
            outcome: Outcome::Error {
                kind,
                message: message.into(),
            },
        }
    }

    /// Serializes the response as one line of JSON without the trailing newline. Newlines inside
    /// strings are escaped by JSON, so the result never contains one.
    pub fn to_line(&self) -> String {
        #[derive(Serialize)]
        struct ErrorBody<'a> {
            kind: ErrorKind,
            message: &'a str,
        }
        #[derive(Serialize)]
        struct Line<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            id: Option<&'a RequestId>,
            ok: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            error: Option<ErrorBody<'a>>,
            #[serde(flatten)]
            payload: Option<&'a Map<String, Value>>,
        }
        let line = match &self.outcome {
            Outcome::Ok(payload) => Line {
                id: self.id.as_ref(),
                ok: true,
                error: None,
                payload: Some(payload),
            },
            Outcome::Error { kind, message } => Line {
                id: self.id.as_ref(),
                ok: false,
                error: Some(ErrorBody {
                    kind: *kind,
                    message,
                }),
                payload: None,
            },
        };
        serde_json::to_string(&line)
            .expect("a struct of strings, booleans and a string-keyed JSON map always serializes")
    }
}

fn internal_error(message: String) -> Outcome {
    log::error!("{message}");
    Outcome::Error {
        kind: ErrorKind::Internal,
        message,
    }
}

impl From<RequestError> for Response {
    fn from(error: RequestError) -> Response {
        Response::error(error.id, error.kind, error.message)
    }
}

/// Builds an event line `{"event":<event>}` (without the trailing newline) for subscribers. The event
/// must serialize to a JSON object.
pub fn event_line(event: &impl Serialize) -> Result<String, serde_json::Error> {
    let event = serde_json::to_value(event)?;
    if !event.is_object() {
        return Err(serde::ser::Error::custom(format_args!(
            "an event must be a JSON object, not {}",
            json_type_name(&event)
        )));
    }
    let mut line = Map::new();
    line.insert("event".to_owned(), event);
    serde_json::to_string(&line)
}

/// A success response too large to build at once (`list` at 100,000 units is tens of MB): the line
/// `{"id":..,"ok":true,"<field>":[<item>,...]}` is produced a piece at a time by
/// [`StreamedReply::write_next`], each item serialized only when asked for. The server asks as its
/// client reads, so the whole line never sits in memory. Build it with [`list_reply`].
pub struct StreamedReply {
    id: Option<RequestId>,
    field: &'static str,
    items: Box<dyn Iterator<Item = Result<Value, serde_json::Error>> + Send>,
    /// Items written so far; `None` until the head is written.
    written: Option<usize>,
    done: bool,
}

impl fmt::Debug for StreamedReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamedReply")
            .field("id", &self.id)
            .field("field", &self.field)
            .field("written", &self.written)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// A piece of a [`StreamedReply`] (in practice an item) failed to serialize. The line is then already
/// partly sent, so it cannot become an error response; the server drops the client, which sees a
/// truncated line rather than a list silently missing an item.
#[derive(Debug, thiserror::Error)]
#[error("the `{field}` reply failed after {written} items: {source}")]
pub struct StreamError {
    /// The field the items belong to (`units`).
    pub field: &'static str,
    /// Items written before the failure.
    pub written: usize,
    /// Why it failed.
    pub source: serde_json::Error,
}

impl StreamedReply {
    fn array<I>(id: Option<RequestId>, field: &'static str, items: I) -> StreamedReply
    where
        I: IntoIterator,
        I::Item: Serialize,
        I::IntoIter: Send + 'static,
    {
        StreamedReply {
            id,
            field,
            // Through `Value`, like `Response::ok`, so an item's keys come out in the same (sorted)
            // order as in the `watch` reply and the line is byte for byte what `Response::ok` makes.
            #[expect(
                clippy::redundant_closure,
                reason = "the function item would name `I::Item` and require it to be 'static"
            )]
            items: Box::new(items.into_iter().map(|item| serde_json::to_value(item))),
            written: None,
            done: false,
        }
    }

    /// The id of the request this answers.
    pub fn id(&self) -> Option<&RequestId> {
        self.id.as_ref()
    }

    /// Appends the next piece of the line to `out`: first the head, then one item (with its comma),
    /// then the tail. Returns `Ok(false)`, appending nothing, once the line is complete; the line
    /// never contains a newline and the caller adds the final one. After an error the reply is
    /// finished and the line must be abandoned.
    pub fn write_next(&mut self, out: &mut Vec<u8>) -> Result<bool, StreamError> {
        if self.done {
            return Ok(false);
        }
        let written = self.written.unwrap_or(0);
        let fail = |source| StreamError {
            field: self.field,
            written,
            source,
        };
        let step = match self.written {
            None => self.write_head(out),
            Some(_) => match self.items.next() {
                Some(Ok(item)) => {
                    if written > 0 {
                        out.push(b',');
                    }
                    serde_json::to_writer(&mut *out, &item)
                }
                Some(Err(source)) => Err(source),
                None => {
                    out.extend_from_slice(b"]}");
                    self.done = true;
                    return Ok(true);
                }
            },
        };
        match step {
            Ok(()) => {
                self.written = Some(self.written.map_or(0, |n| n + 1));
                Ok(true)
            }
            Err(source) => {
                self.done = true;
                Err(fail(source))
            }
        }
    }

    /// `{"id":..,"ok":true,"<field>":[`, the envelope in the order `Response::to_line` writes it.
    fn write_head(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        out.push(b'{');
        if let Some(id) = &self.id {
            out.extend_from_slice(b"\"id\":");
            serde_json::to_writer(&mut *out, id)?;
            out.push(b',');
        }
        out.extend_from_slice(b"\"ok\":true,");
        serde_json::to_writer(&mut *out, self.field)?;
        out.extend_from_slice(b":[");
        Ok(())
    }
}

/// The `list` response, `{"ok":true,"units":[...]}`, produced lazily from `units` as the client
/// reads it; hand it to [`super::server::ControlServer::send_streamed`]. The items are the caller's
/// snapshot: they are kept until the line is sent.
pub fn list_reply<I>(id: Option<RequestId>, units: I) -> StreamedReply
where
    I: IntoIterator,
    I::Item: Serialize,
    I::IntoIter: Send + 'static,
{
    StreamedReply::array(id, "units", units)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn unit(name: &str) -> UnitName {
        unit_name::validate(name).expect("test unit names are valid")
    }

    fn number_id(n: u64) -> Option<RequestId> {
        Some(RequestId::Number(n.into()))
    }

    #[test]
    fn parses_every_command() {
        let invocation = "0123456789abcdef0123456789abcdef";
        let cases: Vec<(String, Request)> = vec![
            (
                r#"{"cmd":"watch","unit":"x.service"}"#.to_owned(),
                Request {
                    id: None,
                    command: Command::Watch(WatchArgs {
                        unit: unit("x.service"),
                        invocation: None,
                        run_dir: None,
                        record: None,
                        generation: None,
                        launch_file: None,
                    }),
                },
            ),
            (
                format!(
                    r#"{{"id":1,"cmd":"watch","unit":"a@b.service","invocation":"{invocation}"}}"#
                ),
                Request {
                    id: number_id(1),
                    command: Command::Watch(WatchArgs {
                        unit: unit("a@b.service"),
                        invocation: Some(invocation.to_owned()),
                        run_dir: None,
                        record: None,
                        generation: None,
                        launch_file: None,
                    }),
                },
            ),
            (
                format!(
                    r#"{{"cmd":"watch","unit":"x.service","invocation":"{}"}}"#,
                    invocation.to_ascii_uppercase()
                ),
                Request {
                    id: None,
                    command: Command::Watch(WatchArgs {
                        unit: unit("x.service"),
                        invocation: Some(invocation.to_owned()),
                        run_dir: None,
                        record: None,
                        generation: None,
                        launch_file: None,
                    }),
                },
            ),
            (
                r#"{"cmd":"watch","unit":"x.service","invocation":null}"#.to_owned(),
                Request {
                    id: None,
                    command: Command::Watch(WatchArgs {
                        unit: unit("x.service"),
                        invocation: None,
                        run_dir: None,
                        record: None,
                        generation: None,
                        launch_file: None,
                    }),
                },
            ),
            (
                r#"{"id":"abc","cmd":"wait","unit":"x.service","timeout_ms":1500}"#.to_owned(),
                Request {
                    id: Some(RequestId::Text("abc".to_owned())),
                    command: Command::Wait(WaitArgs {
                        unit: unit("x.service"),
                        timeout: Some(Duration::from_millis(1500)),
                    }),
                },
            ),
            (
                r#"{"cmd":"wait","unit":"x.service"}"#.to_owned(),
                Request {
                    id: None,
                    command: Command::Wait(WaitArgs {
                        unit: unit("x.service"),
                        timeout: None,
                    }),
                },
            ),
            (
                r#"{"cmd":"stop","unit":"x.scope","timeout_ms":18446744073709551615}"#.to_owned(),
                Request {
                    id: None,
                    command: Command::Stop(WaitArgs {
                        unit: unit("x.scope"),
                        timeout: Some(Duration::from_millis(u64::MAX)),
                    }),
                },
            ),
            (
                r#"{"cmd":"stop","unit":"x.service","timeout_ms":0}"#.to_owned(),
                Request {
                    id: None,
                    command: Command::Stop(WaitArgs {
                        unit: unit("x.service"),
                        timeout: Some(Duration::ZERO),
                    }),
                },
            ),
            (
                r#"{"cmd":"unwatch","unit":"x.service","id":-3}"#.to_owned(),
                Request {
                    id: Some(RequestId::Number((-3i64).into())),
                    command: Command::Unwatch(UnwatchArgs {
                        unit: unit("x.service"),
                    }),
                },
            ),
            (
                r#"  {"cmd":"list"}  "#.to_owned(),
                Request {
                    id: None,
                    command: Command::List,
                },
            ),
            (
                "{\"cmd\":\"events\",\"id\":18446744073709551615}\r".to_owned(),
                Request {
                    id: number_id(u64::MAX),
                    command: Command::Events,
                },
            ),
            (
                r#"{"id":"v","cmd":"version"}"#.to_owned(),
                Request {
                    id: Some(RequestId::Text("v".to_owned())),
                    command: Command::Version,
                },
            ),
            (
                r#"{"cmd":"status","unit":"x.service"}"#.to_owned(),
                Request {
                    id: None,
                    command: Command::Status(StatusArgs {
                        unit: unit("x.service"),
                    }),
                },
            ),
            (
                r#"{"cmd":"stats"}"#.to_owned(),
                Request {
                    id: None,
                    command: Command::Stats,
                },
            ),
        ];
        for (line, expected) in cases {
            assert_eq!(parse_request(line.as_bytes()), Ok(expected), "{line}");
        }
    }

    #[test]
    fn rejects_bad_requests() {
        use ErrorKind::*;
        let text_id = || Some(RequestId::Text("q".to_owned()));
        // (line, recovered id, kind, a fragment the message must contain)
        let cases: Vec<(&[u8], Option<RequestId>, ErrorKind, &str)> = vec![
            (b"", None, BadJson, "not valid JSON"),
            (b"{", None, BadJson, "not valid JSON"),
            (b"{\"cmd\":\"list\"} x", None, BadJson, "trailing characters"),
            (b"{\"cmd\":\"list\"}{}", None, BadJson, "trailing characters"),
            (b"{\"cmd\":\"list\xff\"}", None, BadJson, "not valid UTF-8"),
            (b"\xc3\x28", None, BadJson, "offset 0"),
            (b"[1,2]", None, BadRequest, "must be a JSON object, not an array"),
            (b"\"list\"", None, BadRequest, "not a string"),
            (b"null", None, BadRequest, "not null"),
            (b"42", None, BadRequest, "not a number"),
            (b"{}", None, BadRequest, "missing field `cmd`"),
            (br#"{"id":"q"}"#, text_id(), BadRequest, "missing field `cmd`"),
            (br#"{"id":"q","cmd":7}"#, text_id(), BadRequest, "`cmd` must be a string"),
            (br#"{"id":"q","cmd":"frob"}"#, text_id(), UnknownCommand, "unknown command \"frob\""),
            (br#"{"cmd":"LIST"}"#, None, UnknownCommand, "unknown command"),
            (br#"{"id":null,"cmd":"list"}"#, None, BadRequest, "`id` must be a string or an integer, not null"),
            (br#"{"id":true,"cmd":"list"}"#, None, BadRequest, "not a boolean"),
            (br#"{"id":[1],"cmd":"list"}"#, None, BadRequest, "not an array"),
            (br#"{"id":{},"cmd":"list"}"#, None, BadRequest, "not an object"),
            (br#"{"id":1.5,"cmd":"list"}"#, None, BadRequest, "integer"),
            (br#"{"id":18446744073709551616,"cmd":"list"}"#, None, BadRequest, "integer"),
            (br#"{"id":1e400,"cmd":"list"}"#, None, BadJson, "out of range"),
            (br#"{"id":"q","cmd":"list","unit":"x.service"}"#, text_id(), BadRequest, "unknown field `unit`"),
            (br#"{"cmd":"events","x":1}"#, None, BadRequest, "unknown field `x`"),
            (br#"{"cmd":"version","protocol":1}"#, None, BadRequest, "unknown field `protocol`"),
            (br#"{"cmd":"stats","unit":"x.service"}"#, None, BadRequest, "unknown field `unit`"),
            (br#"{"id":"q","cmd":"watch"}"#, text_id(), BadRequest, "missing field `unit`"),
            (br#"{"cmd":"watch","unit":"x.service","unti":"y"}"#, None, BadRequest, "unknown field `unti`"),
            (br#"{"cmd":"watch","unit":5}"#, None, BadRequest, "unit name"),
            (br#"{"cmd":"watch","unit":null}"#, None, BadRequest, "unit name"),
            (br#"{"id":"q","cmd":"watch","unit":"../x.service"}"#, text_id(), InvalidUnit, "invalid character '/'"),
            (br#"{"cmd":"watch","unit":""}"#, None, InvalidUnit, "empty"),
            (br#"{"cmd":"watch","unit":"a@.service"}"#, None, InvalidUnit, "template without an instance"),
            (br#"{"cmd":"wait","unit":"x"}"#, None, InvalidUnit, "unit type suffix"),
            (br#"{"cmd":"stop","unit":"x\n.service"}"#, None, InvalidUnit, "'\\n'"),
            (br#"{"cmd":"stop","unit":"x.service\n"}"#, None, InvalidUnit, "not a unit type"),
            (br#"{"cmd":"watch","unit":"x.service","record":"r.json"}"#, None, BadRequest, "`record` needs `run_dir`"),
            (br#"{"cmd":"watch","unit":"x.service","run_dir":"/run/x","record":"../r.json"}"#, None, BadRequest, "field `record`"),
            (br#"{"cmd":"watch","unit":"x.service","run_dir":"/run/x","record":"a/b"}"#, None, BadRequest, "field `record`"),
            (br#"{"cmd":"watch","unit":"x.service","run_dir":"relative"}"#, None, BadRequest, "absolute path"),
            (br#"{"cmd":"watch","unit":"x.service","gen":0}"#, None, BadRequest, "greater than 0"),
            (br#"{"cmd":"watch","unit":"x.service","gen":-1}"#, None, BadRequest, "greater than 0"),
            (br#"{"cmd":"watch","unit":"x.service","gen":"1"}"#, None, BadRequest, "greater than 0"),
            (br#"{"cmd":"watch","unit":"x.service","launch_file":"/run/l"}"#, None, BadRequest, "`launch_file` needs `gen`"),
            (br#"{"cmd":"watch","unit":"x.service","gen":1,"launch_file":"l"}"#, None, BadRequest, "absolute path"),
            (br#"{"cmd":"watch","unit":"x.service","invocation":"abc"}"#, None, BadRequest, "32 hexadecimal digits"),
            (br#"{"cmd":"watch","unit":"x.service","invocation":"0123456789abcdef0123456789abcdeg"}"#, None, BadRequest, "32 hexadecimal"),
            (br#"{"cmd":"watch","unit":"x.service","invocation":"01234567-89ab-cdef-0123-456789abcdef"}"#, None, BadRequest, "32 hexadecimal"),
            (br#"{"cmd":"watch","unit":"x.service","invocation":7}"#, None, BadRequest, "invalid type"),
            (br#"{"cmd":"wait","unit":"x.service","timeout_ms":-1}"#, None, BadRequest, "non-negative integer"),
            (br#"{"cmd":"wait","unit":"x.service","timeout_ms":1.5}"#, None, BadRequest, "non-negative integer"),
            (br#"{"cmd":"wait","unit":"x.service","timeout_ms":"10s"}"#, None, BadRequest, "non-negative integer"),
            (br#"{"cmd":"stop","unit":"x.service","timeout_ms":18446744073709551616}"#, None, BadRequest, "non-negative integer"),
            (br#"{"cmd":"stop","unit":"x.service","timeout":5}"#, None, BadRequest, "unknown field `timeout`"),
            (br#"{"cmd":"unwatch","unit":"x.service","timeout_ms":5}"#, None, BadRequest, "unknown field `timeout_ms`"),
        ];
        for (line, id, kind, fragment) in cases {
            let shown = String::from_utf8_lossy(line);
            let err = parse_request(line).expect_err(&shown);
            assert_eq!((&err.id, err.kind), (&id, kind), "{shown}: {err}");
            assert!(err.message.contains(fragment), "{shown}: {err}");
        }
    }

    /// docs/protocol.md quotes these exact lines: the errors this module makes on its own.
    #[test]
    fn documented_error_examples_are_accurate() {
        let spec = include_str!("../../docs/protocol.md");
        let cases: [&[u8]; 8] = [
            br#"{"cmd":"list""#,
            br#"[1,2]"#,
            br#"{"id":null,"cmd":"list"}"#,
            br#"{"id":7,"cmd":"watch","unti":"backup.service"}"#,
            br#"{"id":12,"cmd":"frob"}"#,
            br#"{"id":13,"cmd":"watch","unit":"../etc.service"}"#,
            br#"{"id":14,"cmd":"watch","unit":"x.service","invocation":"abc"}"#,
            br#"{"id":15,"cmd":"wait","unit":"x.service","timeout_ms":-1}"#,
        ];
        for line in cases {
            let request = String::from_utf8_lossy(line);
            let answer = Response::from(parse_request(line).expect_err("documented failure"));
            let exchange = format!("> {request}\n< {}\n", answer.to_line());
            assert!(
                spec.contains(&exchange),
                "not in docs/protocol.md:\n{exchange}"
            );
        }
    }

    #[test]
    fn version_answer_line() {
        let line = Response::ok(number_id(1), json!({ "version": Version::CURRENT })).to_line();
        let expected = format!(
            r#"{{"id":1,"ok":true,"version":{{"agent":"{}","protocol":1}}}}"#,
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(line, expected);
    }

    #[test]
    fn unknown_command_is_reported_before_its_fields() {
        let err = parse_request(br#"{"cmd":"frob","unit":"/"}"#).expect_err("unknown");
        assert_eq!(err.kind, ErrorKind::UnknownCommand);
    }

    #[test]
    fn error_kinds_serialize_kebab_case() {
        let all = [
            ErrorKind::BadJson,
            ErrorKind::BadRequest,
            ErrorKind::UnknownCommand,
            ErrorKind::InvalidUnit,
            ErrorKind::LineTooLong,
            ErrorKind::NotWatched,
            ErrorKind::StillRunning,
            ErrorKind::Busy,
            ErrorKind::Forbidden,
            ErrorKind::Internal,
        ];
        for kind in all {
            let wire = serde_json::to_value(kind).expect("serialize kind");
            assert_eq!(wire, json!(kind.as_str()));
            assert_eq!(serde_json::from_value::<ErrorKind>(wire).ok(), Some(kind));
        }
        assert_eq!(ErrorKind::BadJson.as_str(), "bad-json");
    }

    #[test]
    fn response_lines() {
        #[derive(Serialize)]
        struct Listing {
            units: Vec<&'static str>,
        }
        let cases: Vec<(Response, &str)> = vec![
            (Response::ok(number_id(1), ()), r#"{"id":1,"ok":true}"#),
            (Response::ok(None, ()), r#"{"ok":true}"#),
            (
                Response::ok(
                    Some(RequestId::Text("a\nb".to_owned())),
                    Listing {
                        units: vec!["x.service"],
                    },
                ),
                r#"{"id":"a\nb","ok":true,"units":["x.service"]}"#,
            ),
            (
                Response::ok(
                    Some(RequestId::Number((-5i64).into())),
                    json!({"b": 1, "a": "line\nbreak"}),
                ),
                r#"{"id":-5,"ok":true,"a":"line\nbreak","b":1}"#,
            ),
            (
                Response::error(None, ErrorKind::BadJson, "oops\n"),
                r#"{"ok":false,"error":{"kind":"bad-json","message":"oops\n"}}"#,
            ),
            (
                Response::error(number_id(u64::MAX), ErrorKind::NotWatched, "x"),
                r#"{"id":18446744073709551615,"ok":false,"error":{"kind":"not-watched","message":"x"}}"#,
            ),
            (
                Response::ok(None, json!({"ok": false})),
                r#"{"ok":false,"error":{"kind":"internal","message":"response payload uses the reserved field `ok`"}}"#,
            ),
            (
                Response::ok(None, json!([1])),
                r#"{"ok":false,"error":{"kind":"internal","message":"response payload must be a JSON object, not an array"}}"#,
            ),
        ];
        for (response, expected) in cases {
            let line = response.to_line();
            assert_eq!(line, expected);
            assert!(!line.contains('\n'));
        }
    }

    #[test]
    fn request_errors_become_error_responses_with_their_id() {
        let err = parse_request(br#"{"id":"z","cmd":"nope"}"#).expect_err("unknown command");
        let line = Response::from(err).to_line();
        let value: Value = serde_json::from_str(&line).expect("response is JSON");
        assert_eq!(value["id"], json!("z"));
        assert_eq!(value["ok"], json!(false));
        assert_eq!(value["error"]["kind"], json!("unknown-command"));
    }

    #[test]
    fn event_lines_wrap_objects_only() {
        let line = event_line(&json!({"unit": "x.service", "state": "gone\n"})).expect("object");
        assert_eq!(line, r#"{"event":{"state":"gone\n","unit":"x.service"}}"#);
        assert!(event_line(&"text").is_err());
    }

    /// Drains a streamed reply, returning its line and how many pieces it took.
    fn stream_all(mut reply: StreamedReply) -> (String, usize) {
        let mut out = Vec::new();
        let mut pieces = 0;
        while reply.write_next(&mut out).expect("items serialize") {
            pieces += 1;
        }
        (String::from_utf8(out).expect("JSON is UTF-8"), pieces)
    }

    #[test]
    fn streamed_list_is_the_line_response_ok_would_build() {
        #[derive(Clone, Serialize)]
        struct View {
            unit: String,
            phase: &'static str,
            populated: Option<bool>,
        }
        let view = |n: usize| View {
            unit: format!("u{n}\n.service"),
            phase: "watching",
            populated: None,
        };
        let ids = [
            None,
            number_id(7),
            Some(RequestId::Number((-5i64).into())),
            Some(RequestId::Text("a\"b\nc".to_owned())),
        ];
        for id in ids {
            for count in [0, 1, 2, 50] {
                let views: Vec<View> = (0..count).map(view).collect();
                let eager = Response::ok(id.clone(), json!({ "units": views.clone() })).to_line();
                let (line, pieces) = stream_all(list_reply(id.clone(), views));
                assert_eq!(line, eager, "{id:?} {count}");
                // The head, one piece per item, the tail.
                assert_eq!(pieces, count + 2);
            }
        }
    }

    #[test]
    fn streamed_items_are_serialized_only_when_asked_for() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let pulled = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&pulled);
        let items = (0..1_000_000u64).inspect(move |_| {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        let mut reply = list_reply(number_id(1), items);
        assert_eq!(
            pulled.load(Ordering::Relaxed),
            0,
            "nothing before the first piece"
        );
        let mut out = Vec::new();
        assert!(reply.write_next(&mut out).expect("head"));
        assert_eq!(out, br#"{"id":1,"ok":true,"units":["#);
        assert_eq!(pulled.load(Ordering::Relaxed), 0, "the head pulls no item");
        for expected in 1..=3 {
            assert!(reply.write_next(&mut out).expect("item"));
            assert_eq!(pulled.load(Ordering::Relaxed), expected);
        }
        assert_eq!(out, br#"{"id":1,"ok":true,"units":[0,1,2"#);
    }

    #[test]
    fn a_failing_item_ends_the_reply_with_an_error() {
        struct Item(bool);
        impl Serialize for Item {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                if self.0 {
                    serializer.serialize_u8(1)
                } else {
                    Err(serde::ser::Error::custom("broken item"))
                }
            }
        }
        let mut reply = list_reply(None, vec![Item(true), Item(false), Item(true)]);
        let mut out = Vec::new();
        assert!(reply.write_next(&mut out).expect("head"));
        assert!(reply.write_next(&mut out).expect("first item"));
        let err = reply.write_next(&mut out).expect_err("second item fails");
        assert_eq!((err.field, err.written), ("units", 1));
        assert!(err.to_string().contains("broken item"), "{err}");
        assert_eq!(out, br#"{"ok":true,"units":[1"#);
        // Finished: nothing more, ever.
        assert!(!reply.write_next(&mut out).expect("done"));
        assert_eq!(out, br#"{"ok":true,"units":[1"#);
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(line in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = parse_request(&line);
        }

        #[test]
        fn never_panics_on_json_like_text(line in r#"[{}\[\]":,a-z0-9 .@\\-]{0,200}"#) {
            let _ = parse_request(line.as_bytes());
        }

        /// Objects built from the real field names and hostile values reach every validation path.
        #[test]
        fn request_shaped_objects_parse_or_fail_cleanly(
            fields in proptest::collection::vec((field_name(), json_value()), 0..6)
        ) {
            let object: Map<String, Value> = fields.into_iter().collect();
            let line = Value::Object(object).to_string();
            match parse_request(line.as_bytes()) {
                // Whatever parses must echo back as a single well-formed line.
                Ok(request) => {
                    let response = Response::ok(request.id, ()).to_line();
                    proptest::prop_assert!(!response.contains('\n'));
                }
                Err(error) => proptest::prop_assert!(!error.message.is_empty()),
            }
        }
    }

    fn field_name() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            proptest::sample::select(vec!["id", "cmd", "unit", "invocation", "timeout_ms", "x"])
                .prop_map(str::to_owned),
            "[a-z_]{0,12}",
        ]
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            proptest::sample::select(vec![
                "watch",
                "wait",
                "stop",
                "unwatch",
                "list",
                "events",
                "x.service",
                "a@.service",
                "a@b.service",
                "../x.service",
                "0123456789ABCDEF0123456789abcdef",
            ])
            .prop_map(Value::from),
            any::<String>().prop_map(Value::from),
            Just(json!([1, "x"])),
            Just(json!({"cmd": "list"})),
        ]
    }
}

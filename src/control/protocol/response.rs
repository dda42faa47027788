//! Response lines (`{"id":..,"ok":..}`) and event lines (`{"event":..}`).

use serde::Serialize;
use serde_json::{Map, Value};

use super::{ErrorKind, RequestError, RequestId, json_type_name};

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
/// must serialize to a JSON object; its fields come in the order it serializes them.
pub fn event_line(event: &impl Serialize) -> Result<String, serde_json::Error> {
    // Written straight into the line: a proof is told on the turn that decided it, and a `Value`
    // built first cost an allocation a field and a sort.
    const OPEN: &[u8] = br#"{"event":"#;
    let mut line = Vec::with_capacity(512);
    line.extend_from_slice(OPEN);
    serde_json::to_writer(&mut line, event)?;
    if line.get(OPEN.len()) != Some(&b'{') {
        let found = serde_json::from_slice::<Value>(&line[OPEN.len()..])?;
        return Err(serde::ser::Error::custom(format_args!(
            "an event must be a JSON object, not {}",
            json_type_name(&found)
        )));
    }
    line.push(b'}');
    // serde_json writes UTF-8 only.
    String::from_utf8(line).map_err(serde::ser::Error::custom)
}

//! A success response produced a piece at a time as the client reads it (`list`).

use std::fmt;

use serde::Serialize;
use serde_json::Value;

use super::RequestId;

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
/// reads it; hand it to [`crate::control::server::ControlServer::send_streamed`]. The items are the caller's
/// snapshot: they are kept until the line is sent.
pub fn list_reply<I>(id: Option<RequestId>, units: I) -> StreamedReply
where
    I: IntoIterator,
    I::Item: Serialize,
    I::IntoIter: Send + 'static,
{
    StreamedReply::array(id, "units", units)
}

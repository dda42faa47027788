//! One client's socket and buffers: reading it within a budget into lines, queueing output
//! within a limit, producing a streamed reply as the client drains it, and writing within a
//! budget.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::os::fd::AsRawFd;

use mio::net::UnixStream;
use mio::{Interest, Registry, Token};
use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, send};

use super::lines::{LineSplitter, parse_line};
use super::{ClientInput, MAX_STREAMS_PER_CLIENT, ServerOptions};
use crate::control::ClientId;
use crate::control::protocol::{ErrorKind, Response, StreamedReply};

/// Bytes read from one client per readiness event before yielding to other work, so one client
/// flooding its socket cannot starve the loop.
const READ_BUDGET: usize = 256 * 1024;

/// Size of the buffer each read fills.
pub(super) const READ_CHUNK: usize = 16 * 1024;

/// Output buffers larger than this are released once drained, so a past burst does not pin memory.
const OUTPUT_KEEP_CAPACITY: usize = 64 * 1024;

/// Bytes written to one client per call before yielding to other work, so a fast reader of a large
/// streamed reply cannot hold the loop for the whole reply.
const WRITE_BUDGET: usize = 256 * 1024;

/// Whether a connection can still be used after an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(super) enum Liveness {
    Alive,
    Gone,
}

/// One client's socket and buffers.
pub(super) struct Connection {
    pub(super) id: ClientId,
    token: Token,
    pub(super) stream: UnixStream,
    lines: LineSplitter,
    /// Output bytes; `output[sent..]` is still to be written.
    output: Vec<u8>,
    sent: usize,
    /// Output waiting behind a streamed reply, in order; empty unless a streamed reply is unfinished
    /// (the front one is the one being produced into `output`).
    backlog: VecDeque<Deferred>,
    /// Bytes of the `Deferred::Lines` in `backlog`.
    backlog_lines: usize,
    /// `Deferred::Stream`s in `backlog`.
    streams: usize,
    /// The most `queued()` bytes seen at once.
    pub(super) peak_queued: usize,
    /// Whether WRITABLE is part of the registered interest (only while output is pending).
    writable_interest: bool,
    /// The peer shut down its writing side; responses are still delivered.
    read_closed: bool,
}

/// Output queued behind a streamed reply.
enum Deferred {
    /// A reply still to be produced.
    Stream(StreamedReply),
    /// Whole lines with their newlines.
    Lines(Vec<u8>),
}

/// Why a write pass stopped.
enum Written {
    /// All of `output` is sent.
    All,
    /// The socket takes no more now; its writable readiness will say when it does.
    SocketFull,
    /// The write budget is spent while the socket may still take more.
    BudgetSpent,
    /// The peer is gone or the write failed.
    Failed,
}

impl Connection {
    pub(super) fn new(id: ClientId, token: Token, stream: UnixStream, max_line: usize) -> Self {
        Connection {
            id,
            token,
            stream,
            lines: LineSplitter::new(max_line),
            output: Vec::new(),
            sent: 0,
            backlog: VecDeque::new(),
            backlog_lines: 0,
            streams: 0,
            peak_queued: 0,
            writable_interest: false,
            read_closed: false,
        }
    }

    pub(super) fn queued(&self) -> usize {
        self.output.len() - self.sent + self.backlog_lines
    }

    fn note_peak(&mut self) {
        self.peak_queued = self.peak_queued.max(self.queued());
    }

    /// Reads until the socket is drained (or the read budget is spent), turning lines into `Request`
    /// events and answering malformed ones.
    pub(super) fn read_available(
        &mut self,
        registry: &Registry,
        buffer: &mut [u8],
        options: &ServerOptions,
        out: &mut Vec<ClientInput>,
    ) -> Liveness {
        let mut budget = READ_BUDGET;
        let mut parsed = Vec::new();
        while !self.read_closed {
            match self.stream.read(buffer) {
                Ok(0) => {
                    self.read_closed = true;
                    self.lines
                        .finish(|line| parsed.extend(parse_line(line, options.max_line)));
                }
                Ok(read) => {
                    self.lines.feed(&buffer[..read], |line| {
                        parsed.extend(parse_line(line, options.max_line));
                    });
                    budget = budget.saturating_sub(read);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::debug!("control {} read failed: {e}", self.id);
                    return Liveness::Gone;
                }
            }
            for result in parsed.drain(..) {
                match result {
                    Ok(request) => out.push(ClientInput::Request {
                        client: self.id,
                        request,
                    }),
                    Err(error) => {
                        let line = Response::from(error).to_line();
                        if self.queue(registry, &line, options.max_queued) == Liveness::Gone {
                            return Liveness::Gone;
                        }
                    }
                }
            }
            if budget == 0 {
                // Edge-triggered: re-arming makes epoll report the still-readable socket again on the
                // next poll, after other clients had their turn.
                return self.reregister(registry);
            }
        }
        Liveness::Alive
    }

    /// Appends `line` and a newline to the output (behind any unfinished streamed reply), writes what
    /// the socket takes, and gives up on the client if the rest exceeds `max_queued`.
    pub(super) fn queue(&mut self, registry: &Registry, line: &str, max_queued: usize) -> Liveness {
        if self.backlog.is_empty() {
            self.output.extend_from_slice(line.as_bytes());
            self.output.push(b'\n');
            if self.pump(registry, max_queued) == Liveness::Gone {
                return Liveness::Gone;
            }
        } else {
            // A line must never land inside the streamed line, so it waits behind it; the socket
            // state is unchanged, so there is nothing to write now.
            if let Some(Deferred::Lines(bytes)) = self.backlog.back_mut() {
                bytes.extend_from_slice(line.as_bytes());
                bytes.push(b'\n');
            } else {
                let mut bytes = Vec::with_capacity(line.len() + 1);
                bytes.extend_from_slice(line.as_bytes());
                bytes.push(b'\n');
                self.backlog.push_back(Deferred::Lines(bytes));
            }
            self.backlog_lines += line.len() + 1;
        }
        if self.queued() > max_queued {
            log::warn!(
                "control {} dropped: {} unsent bytes exceed the limit of {max_queued}",
                self.id,
                self.queued()
            );
            return Liveness::Gone;
        }
        self.note_peak();
        Liveness::Alive
    }

    /// Queues a streamed reply behind everything already queued and starts sending it, or answers
    /// `busy` if the client has too many unfinished.
    pub(super) fn queue_stream(
        &mut self,
        registry: &Registry,
        reply: StreamedReply,
        max_queued: usize,
    ) -> Liveness {
        if self.streams >= MAX_STREAMS_PER_CLIENT {
            log::warn!(
                "control {} refused a streamed reply: {MAX_STREAMS_PER_CLIENT} already unfinished",
                self.id
            );
            let line = Response::error(
                reply.id().cloned(),
                ErrorKind::Busy,
                format!(
                    "{MAX_STREAMS_PER_CLIENT} large replies are already being sent on this \
                     connection; read them before asking again"
                ),
            )
            .to_line();
            drop(reply);
            return self.queue(registry, &line, max_queued);
        }
        self.backlog.push_back(Deferred::Stream(reply));
        self.streams += 1;
        self.pump(registry, max_queued)
    }

    /// Whether the front streamed reply may produce another piece. Below half of `max_queued`
    /// waiting, so the next pieces are ready before the socket drains; lines waiting behind the reply
    /// count too, except that an empty output always takes a piece, so waiting lines can never stall
    /// the reply they wait for. Either way at most `max_queued` plus one piece is held.
    fn wants_piece(&self, max_queued: usize) -> bool {
        let ready = self.output.len() - self.sent;
        ready == 0 || (ready < max_queued / 2 && ready + self.backlog_lines < max_queued)
    }

    /// Moves backlog into `output` as far as [`Connection::wants_piece`] allows.
    fn refill(&mut self, max_queued: usize) -> Liveness {
        loop {
            let wants_piece = self.wants_piece(max_queued);
            match self.backlog.front_mut() {
                None => return Liveness::Alive,
                // Already counted toward the limit, so moving them costs nothing.
                Some(Deferred::Lines(bytes)) => {
                    self.backlog_lines -= bytes.len();
                    self.output.extend_from_slice(bytes);
                    self.backlog.pop_front();
                }
                Some(Deferred::Stream(_)) if !wants_piece => return Liveness::Alive,
                Some(Deferred::Stream(reply)) => match reply.write_next(&mut self.output) {
                    Ok(true) => self.note_peak(),
                    Ok(false) => {
                        self.output.push(b'\n');
                        self.backlog.pop_front();
                        self.streams -= 1;
                    }
                    Err(e) => {
                        // The head is out, so no error response can follow: the truncated line
                        // tells the client, where a shortened list would mislead it.
                        log::error!("control {} dropped: {e}", self.id);
                        return Liveness::Gone;
                    }
                },
            }
        }
    }

    /// Writes pending output, producing more of a streamed reply as it drains, until done, the socket
    /// is full or the write budget is spent; keeps WRITABLE interest only while output remains.
    pub(super) fn pump(&mut self, registry: &Registry, max_queued: usize) -> Liveness {
        let mut budget = WRITE_BUDGET;
        let stop = loop {
            if self.refill(max_queued) == Liveness::Gone {
                return Liveness::Gone;
            }
            if self.sent == self.output.len() {
                // refill leaves output empty only when the backlog is empty too.
                break Written::All;
            }
            match self.write_output(&mut budget) {
                Written::All => {}
                Written::Failed => return Liveness::Gone,
                stop @ (Written::SocketFull | Written::BudgetSpent) => break stop,
            }
        };
        if self.sent == self.output.len() {
            self.output.clear();
            self.sent = 0;
            if self.output.capacity() > OUTPUT_KEEP_CAPACITY && self.backlog.is_empty() {
                self.output = Vec::new();
            }
        } else if self.sent > self.output.len() / 2 {
            // Compacting only when over half is sent keeps the copying amortized linear.
            self.output.drain(..self.sent);
            self.sent = 0;
        }
        let want_writable = self.sent < self.output.len() || !self.backlog.is_empty();
        if matches!(stop, Written::BudgetSpent) {
            // Edge-triggered: the socket may still be writable, which no new edge would report;
            // re-arming makes epoll report it on the next poll, after other clients had their turn.
            self.writable_interest = true;
            return self.reregister(registry);
        }
        if want_writable == self.writable_interest {
            return Liveness::Alive;
        }
        self.writable_interest = want_writable;
        self.reregister(registry)
    }

    /// Sends `output[sent..]` until all is sent, the socket is full or `budget` is spent.
    fn write_output(&mut self, budget: &mut usize) -> Written {
        while self.sent < self.output.len() {
            if *budget == 0 {
                return Written::BudgetSpent;
            }
            let end = self.output.len().min(self.sent + *budget);
            // MSG_NOSIGNAL: a vanished peer must be an EPIPE error, not a SIGPIPE killing the agent.
            match send(
                self.stream.as_raw_fd(),
                &self.output[self.sent..end],
                MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(0) => return Written::Failed,
                Ok(written) => {
                    self.sent += written;
                    *budget = budget.saturating_sub(written);
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return Written::SocketFull,
                Err(errno) => {
                    log::debug!("control {} write failed: {errno}", self.id);
                    return Written::Failed;
                }
            }
        }
        Written::All
    }

    fn reregister(&mut self, registry: &Registry) -> Liveness {
        let interest = if self.writable_interest {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        match registry.reregister(&mut self.stream, self.token, interest) {
            Ok(()) => Liveness::Alive,
            Err(e) => {
                log::warn!("cannot reregister control {}: {e}", self.id);
                Liveness::Gone
            }
        }
    }
}

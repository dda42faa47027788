//! The control socket's server side, living in the agent's single-threaded, edge-triggered mio loop.
//!
//! It accepts clients, splits their input into lines, answers malformed lines itself and hands valid
//! requests to the agent as [`ClientInput`]s; the agent answers with [`ControlServer::send`], or with
//! [`ControlServer::send_streamed`] for a reply too large to build at once (`list`), which is produced
//! as the client reads it. It admits only peers whose kernel-reported credentials (`SO_PEERCRED`) the
//! options allow. It never blocks, never buffers more than its limits per client (an overlong line is
//! discarded, a client whose unsent output grows past the limit is dropped), never panics on input,
//! and never deletes a file it did not create.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use mio::net::{UnixListener, UnixStream};
use mio::{Interest, Registry, Token};
use nix::unistd::geteuid;

use super::protocol::{ErrorKind, Request, StreamedReply};
use super::{ClientId, ControlError};
use crate::token_pool::TokenPool;
use admission::{admitted, refuse};
use connection::{Connection, Liveness, READ_CHUNK};
use socket_file::{bind_with_mode, clear_stale_socket, remove_if_ours};

mod admission;
mod connection;
mod lines;
mod socket_file;

/// Streamed replies one client may have unfinished at once (the one being sent and the ones waiting
/// behind it). Each holds the agent's snapshot (all units) until sent, so a client that pipelines
/// `list` without reading must not pin one snapshot per request; a further one is answered `busy`.
pub const MAX_STREAMS_PER_CLIENT: usize = 2;

/// Limits and permissions of a [`ControlServer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerOptions {
    /// Permission bits of the socket file (connecting needs write permission on it).
    pub mode: u32,
    /// Clients served at once; more are told `busy` and disconnected.
    pub max_clients: usize,
    /// Longest accepted request line in bytes, without its newline.
    pub max_line: usize,
    /// Most unsent output bytes kept for one client before it is dropped.
    pub max_queued: usize,
    /// User ids allowed to connect besides the agent's own effective uid, which always is. `mode`
    /// must also let them open the socket (e.g. 0o666): both checks apply.
    pub allowed_uids: Vec<u32>,
    /// Group ids allowed to connect: a peer whose primary gid (as the kernel reports it at connect
    /// time; supplementary groups do not count) is listed is allowed whatever its uid.
    pub allowed_gids: Vec<u32>,
}

impl ServerOptions {
    /// Whether a peer with `uid` and primary `gid` may use the socket of an agent running with
    /// effective uid `own_euid`.
    fn allows(&self, own_euid: u32, uid: u32, gid: u32) -> bool {
        uid == own_euid || self.allowed_uids.contains(&uid) || self.allowed_gids.contains(&gid)
    }

    /// The mode of a directory the agent creates to hold the socket: connecting needs search
    /// permission on it, which only the agent's own uid needs unless others are allowed; they
    /// then get search alone (0711), never a listing, and `mode` and `allows` still decide.
    pub fn directory_mode(&self) -> u32 {
        if self.allowed_uids.is_empty() && self.allowed_gids.is_empty() {
            0o700
        } else {
            0o711
        }
    }
}

impl Default for ServerOptions {
    fn default() -> ServerOptions {
        ServerOptions {
            mode: 0o600,
            max_clients: 64,
            max_line: 64 * 1024,
            max_queued: 1024 * 1024,
            allowed_uids: Vec::new(),
            allowed_gids: Vec::new(),
        }
    }
}

/// What the server tells the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientInput {
    /// A client sent a valid request; answer it with [`ControlServer::send`].
    Request {
        /// Who asked.
        client: ClientId,
        /// What was asked.
        request: Request,
    },
    /// A client is gone; reported exactly once per client, after its last `Request`.
    Closed {
        /// Who left.
        client: ClientId,
    },
}

/// The control socket server. Create with [`ControlServer::bind`], add to the loop with
/// [`ControlServer::register`], feed it the events whose token it [`owns`](ControlServer::owns).
pub struct ControlServer {
    path: PathBuf,
    /// Device and inode of the socket file this server created, so `Drop` removes only that file;
    /// `None` for a socket it was handed (socket activation), which it never removes.
    socket_file: Option<(u64, u64)>,
    listener: UnixListener,
    options: ServerOptions,
    /// The agent's effective uid when the socket was bound; peers with it are always allowed.
    own_euid: u32,
    /// Once registered: the listener's token, and the pool of the clients' tokens.
    tokens: Option<(Token, TokenPool)>,
    clients: HashMap<Token, Connection>,
    client_tokens: HashMap<ClientId, Token>,
    next_client: u64,
    /// Clients dropped but not yet reported as `Closed`.
    closed: Vec<ClientId>,
    read_buffer: Box<[u8]>,
}

impl fmt::Debug for ControlServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlServer")
            .field("path", &self.path)
            .field("clients", &self.clients.len())
            .finish_non_exhaustive()
    }
}

impl ControlServer {
    /// Creates the socket at `path` with exactly `options.mode`, replacing a stale socket (one nobody
    /// answers on). Fails if a live agent answers there or if the path is something other than a
    /// socket.
    ///
    /// The socket is bound inside a fresh 0700 directory next to `path`, given its mode, then renamed
    /// into place, so it is never reachable with looser permissions and no process-wide umask change is
    /// needed.
    pub fn bind(path: &Path, options: ServerOptions) -> Result<ControlServer, ControlError> {
        clear_stale_socket(path)?;
        let listener = bind_with_mode(path, options.mode)?;
        let metadata = fs::symlink_metadata(path).map_err(|source| ControlError::Io {
            action: "inspect new control socket",
            path: path.to_owned(),
            source,
        })?;
        log::info!("control socket listening on {}", path.display());
        let socket_file = Some((metadata.dev(), metadata.ino()));
        Ok(ControlServer::serve(listener, path, socket_file, options))
    }

    /// Serves `listener`, a listening socket this process was handed at `path` (by systemd's
    /// socket activation). The socket file is not this server's: it is never removed.
    pub fn adopt(
        listener: std::os::unix::net::UnixListener,
        path: &Path,
        options: ServerOptions,
    ) -> Result<ControlServer, ControlError> {
        listener
            .set_nonblocking(true)
            .map_err(|source| ControlError::Io {
                action: "make the inherited control socket non-blocking",
                path: path.to_owned(),
                source,
            })?;
        log::info!("control socket inherited, listening on {}", path.display());
        let listener = UnixListener::from_std(listener);
        Ok(ControlServer::serve(listener, path, None, options))
    }

    fn serve(
        listener: UnixListener,
        path: &Path,
        socket_file: Option<(u64, u64)>,
        options: ServerOptions,
    ) -> ControlServer {
        ControlServer {
            path: path.to_owned(),
            socket_file,
            listener,
            options,
            own_euid: geteuid().as_raw(),
            tokens: None,
            clients: HashMap::new(),
            client_tokens: HashMap::new(),
            next_client: 0,
            closed: Vec::new(),
            read_buffer: vec![0; READ_CHUNK].into_boxed_slice(),
        }
    }

    /// Registers the listener with `registry`. The listener takes `tokens.start`; clients take the
    /// other tokens of the range, fresh ones first, so a token is reused only after the whole range
    /// has been used (give a wide range, e.g. 2^20 tokens, to make reuse practically never happen).
    pub fn register(&mut self, registry: &Registry, tokens: Range<usize>) -> io::Result<()> {
        if self.tokens.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "control server is already registered",
            ));
        }
        if tokens.len() < 2 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "control server needs at least two tokens (listener and one client)",
            ));
        }
        registry.register(&mut self.listener, Token(tokens.start), Interest::READABLE)?;
        self.tokens = Some((
            Token(tokens.start),
            TokenPool::new(tokens.start + 1..tokens.end),
        ));
        Ok(())
    }

    /// Tells whether `token` belongs to this server (its listener or one of its clients).
    pub fn owns(&self, token: Token) -> bool {
        self.tokens
            .as_ref()
            .is_some_and(|(listener, clients)| *listener == token || clients.owns(token))
    }

    /// Handles one readiness event for a token this server owns, appending what the agent must act on
    /// to `out`. Events for unknown or stale tokens are ignored.
    pub fn handle_event(
        &mut self,
        registry: &Registry,
        event: &mio::event::Event,
        out: &mut Vec<ClientInput>,
    ) {
        let token = event.token();
        if self
            .tokens
            .as_ref()
            .is_some_and(|(listener, _)| *listener == token)
        {
            self.accept_all(registry);
        } else if let Some(connection) = self.clients.get_mut(&token) {
            let mut liveness = Liveness::Alive;
            if event.is_readable() || event.is_read_closed() || event.is_error() {
                liveness =
                    connection.read_available(registry, &mut self.read_buffer, &self.options, out);
            }
            if liveness == Liveness::Alive && event.is_writable() {
                liveness = connection.pump(registry, self.options.max_queued);
            }
            // HUP: the peer closed both directions, so pending output can never be delivered. A
            // half-close (the peer only shut down writing) does not raise it and keeps the client.
            if liveness == Liveness::Alive && event.is_write_closed() {
                liveness = Liveness::Gone;
            }
            if liveness == Liveness::Gone {
                self.drop_client(registry, token);
            }
        }
        self.take_closed(out);
    }

    /// Queues `line` plus a newline for `client` and writes what the socket takes now. Returns false if
    /// the client is gone, or was dropped just now because it failed or its unsent output exceeded
    /// `max_queued`; such a drop is reported as `Closed` by the next [`ControlServer::take_closed`] or
    /// [`ControlServer::handle_event`]. `line` must not contain a newline (build it with
    /// [`super::protocol::Response::to_line`] or [`super::protocol::event_line`]).
    pub fn send(&mut self, registry: &Registry, client: ClientId, line: &str) -> bool {
        debug_assert!(!line.contains('\n'), "a protocol line contains a newline");
        let Some(&token) = self.client_tokens.get(&client) else {
            return false;
        };
        let Some(connection) = self.clients.get_mut(&token) else {
            return false;
        };
        match connection.queue(registry, line, self.options.max_queued) {
            Liveness::Alive => true,
            Liveness::Gone => {
                self.drop_client(registry, token);
                false
            }
        }
    }

    /// Queues a reply that is produced as `client` reads it, never held whole in memory: a piece is
    /// produced only while less than half of `max_queued` is waiting for the socket, so the bytes
    /// held for the client stay within `max_queued` plus one piece (one item). Lines sent to the client
    /// afterwards wait behind the whole reply, never inside it, and still count toward `max_queued`.
    /// If the client already has [`MAX_STREAMS_PER_CLIENT`] unfinished, `reply` is dropped and a
    /// `busy` error with its id is queued instead. Returns false exactly as [`ControlServer::send`]
    /// does; a client dropped later, mid-reply, is reported as `Closed` and its reply dropped.
    ///
    /// ```text
    /// server.send_streamed(registry, client, protocol::list_reply(id, views));
    /// ```
    pub fn send_streamed(
        &mut self,
        registry: &Registry,
        client: ClientId,
        reply: StreamedReply,
    ) -> bool {
        let Some(&token) = self.client_tokens.get(&client) else {
            return false;
        };
        let Some(connection) = self.clients.get_mut(&token) else {
            return false;
        };
        match connection.queue_stream(registry, reply, self.options.max_queued) {
            Liveness::Alive => true,
            Liveness::Gone => {
                self.drop_client(registry, token);
                false
            }
        }
    }

    /// Moves the `Closed` events of clients dropped by [`ControlServer::send`] into `out`.
    pub fn take_closed(&mut self, out: &mut Vec<ClientInput>) {
        out.extend(
            self.closed
                .drain(..)
                .map(|client| ClientInput::Closed { client }),
        );
    }

    /// The number of connected clients.
    pub fn client_count(&self) -> usize {
        self.clients.len()
    }

    /// The total unsent output bytes held for all clients (a streamed reply counts only the part
    /// already produced).
    pub fn queued_bytes(&self) -> usize {
        self.clients.values().map(Connection::queued).sum()
    }

    /// The unsent output bytes held for `client`, or `None` if it is not connected.
    pub fn client_queued_bytes(&self, client: ClientId) -> Option<usize> {
        self.connection(client).map(Connection::queued)
    }

    /// The most unsent output bytes held for `client` at once so far (sampled whenever output is
    /// queued or a piece of a streamed reply is produced), or `None` if it is not connected.
    pub fn client_peak_queued_bytes(&self, client: ClientId) -> Option<usize> {
        self.connection(client)
            .map(|connection| connection.peak_queued)
    }

    fn connection(&self, client: ClientId) -> Option<&Connection> {
        self.client_tokens
            .get(&client)
            .and_then(|token| self.clients.get(token))
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn accept_all(&mut self, registry: &Registry) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => self.admit(registry, stream),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    // E.g. out of file descriptors: the pending connections stay in the backlog and
                    // are accepted on the listener's next readiness event.
                    log::warn!(
                        "cannot accept on control socket {}: {e}",
                        self.path.display()
                    );
                    return;
                }
            }
        }
    }

    fn admit(&mut self, registry: &Registry, mut stream: UnixStream) {
        // Checked before the client limit, so a refused peer never takes or waits for a slot.
        if !admitted(&stream, &self.options, self.own_euid) {
            return;
        }
        let token = match self.tokens.as_mut() {
            Some((_, clients)) if self.clients.len() < self.options.max_clients => clients.take(),
            _ => None,
        };
        let Some(token) = token else {
            let max_clients = self.options.max_clients;
            log::warn!("control client refused: {max_clients} clients already connected");
            refuse(
                &stream,
                ErrorKind::Busy,
                format!("too many clients (the limit is {max_clients})"),
            );
            return;
        };
        if let Err(e) = registry.register(&mut stream, token, Interest::READABLE) {
            log::warn!("cannot register control client: {e}");
            if let Some((_, clients)) = self.tokens.as_mut() {
                clients.give_back(token);
            }
            return;
        }
        let id = ClientId(self.next_client);
        self.next_client += 1;
        log::debug!("control {id} connected");
        self.client_tokens.insert(id, token);
        self.clients.insert(
            token,
            Connection::new(id, token, stream, self.options.max_line),
        );
    }

    fn drop_client(&mut self, registry: &Registry, token: Token) {
        let Some(mut connection) = self.clients.remove(&token) else {
            return;
        };
        // Deregistering can only fail if the fd is already gone from epoll; closing it below removes
        // it anyway.
        let _ = registry.deregister(&mut connection.stream);
        self.client_tokens.remove(&connection.id);
        if let Some((_, clients)) = self.tokens.as_mut() {
            clients.give_back(token);
        }
        log::debug!("control {} disconnected", connection.id);
        self.closed.push(connection.id);
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        remove_if_ours(&self.path, self.socket_file);
    }
}

#[cfg(test)]
mod tests;

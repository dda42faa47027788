//! The control socket's server side, living in the agent's single-threaded, edge-triggered mio loop.
//!
//! It accepts clients, splits their input into lines, answers malformed lines itself and hands valid
//! requests to the agent as [`ServerEvent`]s; the agent answers with [`ControlServer::send`], or with
//! [`ControlServer::send_streamed`] for a reply too large to build at once (`list`), which is produced
//! as the client reads it. It admits only peers whose kernel-reported credentials (`SO_PEERCRED`) the
//! options allow. It never blocks, never buffers more than its limits per client (an overlong line is
//! discarded, a client whose unsent output grows past the limit is dropped), never panics on input,
//! and never deletes a file it did not create.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::fs;
use std::io::{self, Read};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use mio::net::{UnixListener, UnixStream};
use mio::{Interest, Registry, Token};
use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
use nix::sys::socket::{MsgFlags, getsockopt, send, sockopt};
use nix::unistd::geteuid;

use super::ControlError;
use super::protocol::{ErrorKind, Request, RequestError, Response, StreamedReply, parse_request};

/// The longest path a Unix socket address holds (`sun_path` is 108 bytes including the NUL).
const SOCKET_PATH_MAX: usize = 107;

/// Bytes read from one client per readiness event before yielding to other work, so one client
/// flooding its socket cannot starve the loop.
const READ_BUDGET: usize = 256 * 1024;

/// Size of the buffer each read fills.
const READ_CHUNK: usize = 16 * 1024;

/// Output buffers larger than this are released once drained, so a past burst does not pin memory.
const OUTPUT_KEEP_CAPACITY: usize = 64 * 1024;

/// Bytes written to one client per call before yielding to other work, so a fast reader of a large
/// streamed reply cannot hold the loop for the whole reply.
const WRITE_BUDGET: usize = 256 * 1024;

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

/// Identifies one client connection; never reused during a server's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(u64);

impl ClientId {
    /// A client of a simulated or scripted run of the agent's core.
    #[cfg(test)]
    pub(crate) fn for_test(n: u64) -> ClientId {
        ClientId(n)
    }
}

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client {}", self.0)
    }
}

/// What the server tells the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerEvent {
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
    tokens: Option<TokenPool>,
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
        self.tokens = Some(TokenPool::new(tokens));
        Ok(())
    }

    /// Tells whether `token` belongs to this server (its listener or one of its clients).
    pub fn owns(&self, token: Token) -> bool {
        self.tokens
            .as_ref()
            .is_some_and(|pool| pool.range.contains(&token.0))
    }

    /// Handles one readiness event for a token this server owns, appending what the agent must act on
    /// to `out`. Events for unknown or stale tokens are ignored.
    pub fn handle_event(
        &mut self,
        registry: &Registry,
        event: &mio::event::Event,
        out: &mut Vec<ServerEvent>,
    ) {
        let token = event.token();
        if self
            .tokens
            .as_ref()
            .is_some_and(|pool| pool.listener == token)
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
    /// [`Response::to_line`] or [`super::protocol::event_line`]).
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
    pub fn take_closed(&mut self, out: &mut Vec<ServerEvent>) {
        out.extend(
            self.closed
                .drain(..)
                .map(|client| ServerEvent::Closed { client }),
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
        let credentials = match getsockopt(&stream, sockopt::PeerCredentials) {
            Ok(credentials) => credentials,
            Err(errno) => {
                log::warn!("control client refused: cannot read its credentials: {errno}");
                return;
            }
        };
        let (uid, gid) = (credentials.uid(), credentials.gid());
        if !self.options.allows(self.own_euid, uid, gid) {
            log::warn!(
                "control client refused: uid {uid} gid {gid} (pid {}) is not allowed",
                credentials.pid()
            );
            refuse(
                &stream,
                ErrorKind::Forbidden,
                format!("uid {uid} is not allowed to use this socket"),
            );
            return;
        }
        let token = match self.tokens.as_mut() {
            Some(pool) if self.clients.len() < self.options.max_clients => pool.take(),
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
            if let Some(pool) = self.tokens.as_mut() {
                pool.give_back(token);
            }
            return;
        }
        let id = ClientId(self.next_client);
        self.next_client += 1;
        log::debug!("control {id} connected");
        self.client_tokens.insert(id, token);
        self.clients.insert(
            token,
            Connection {
                id,
                token,
                stream,
                lines: LineSplitter::new(self.options.max_line),
                output: Vec::new(),
                sent: 0,
                backlog: VecDeque::new(),
                backlog_lines: 0,
                streams: 0,
                peak_queued: 0,
                writable_interest: false,
                read_closed: false,
            },
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
        if let Some(pool) = self.tokens.as_mut() {
            pool.give_back(token);
        }
        log::debug!("control {} disconnected", connection.id);
        self.closed.push(connection.id);
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        // Only the file this server created is removed; if the path now names something else, it is
        // not ours.
        match fs::symlink_metadata(&self.path) {
            Ok(metadata) if Some((metadata.dev(), metadata.ino())) == self.socket_file => {
                if let Err(e) = fs::remove_file(&self.path) {
                    log::warn!("cannot remove control socket {}: {e}", self.path.display());
                }
            }
            _ => {}
        }
    }
}

/// Removes a stale socket file at `path`; errors if a live server answers there or the path is not a
/// socket.
fn clear_stale_socket(path: &Path) -> Result<(), ControlError> {
    let metadata = match fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ControlError::Io {
                action: "inspect control socket path",
                path: path.to_owned(),
                source,
            });
        }
    };
    if !metadata.file_type().is_socket() {
        return Err(ControlError::NotASocket {
            path: path.to_owned(),
        });
    }
    // A non-blocking connect never hangs on a live server with a full backlog: that is WouldBlock.
    match UnixStream::connect(path) {
        Ok(_) => Err(ControlError::AlreadyListening {
            path: path.to_owned(),
        }),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(ControlError::AlreadyListening {
            path: path.to_owned(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            log::info!("replacing stale control socket {}", path.display());
            match fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(ControlError::Io {
                    action: "remove stale control socket",
                    path: path.to_owned(),
                    source: e,
                }),
                _ => Ok(()),
            }
        }
        Err(source) => Err(ControlError::Io {
            action: "probe existing control socket",
            path: path.to_owned(),
            source,
        }),
    }
}

/// Distinguishes staging directories of several binds in one process.
static STAGING_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A private directory next to the socket path, removed with whatever is left in it when dropped.
struct StagingDir {
    dir: PathBuf,
    socket: PathBuf,
}

impl Drop for StagingDir {
    fn drop(&mut self) {
        // After a successful rename the socket is gone from here; both removals are best effort.
        let _ = fs::remove_file(&self.socket);
        let _ = fs::remove_dir(&self.dir);
    }
}

/// Binds a listener at `path` whose socket file has exactly `mode`, never visible with other bits.
fn bind_with_mode(path: &Path, mode: u32) -> Result<UnixListener, ControlError> {
    let io_error = |action, source| ControlError::Io {
        action,
        path: path.to_owned(),
        source,
    };
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let staging_name = format!(
        ".ep{:x}.{:x}",
        std::process::id(),
        STAGING_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let dir = parent.join(staging_name);
    let staging = StagingDir {
        socket: dir.join("s"),
        dir,
    };
    if staging.socket.as_os_str().len() > SOCKET_PATH_MAX {
        return Err(io_error(
            "bind control socket",
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "its directory path is too long for a Unix socket (the socket is staged at {}, \
                     which exceeds {SOCKET_PATH_MAX} bytes)",
                    staging.socket.display()
                ),
            ),
        ));
    }
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging.dir)
        .map_err(|e| io_error("create staging directory for control socket", e))?;
    let listener =
        UnixListener::bind(&staging.socket).map_err(|e| io_error("bind control socket", e))?;
    fs::set_permissions(&staging.socket, fs::Permissions::from_mode(mode))
        .map_err(|e| io_error("set permissions of control socket", e))?;
    // NOREPLACE: a file that appeared at the path since the stale check is never clobbered.
    renameat2(
        AT_FDCWD,
        &staging.socket,
        AT_FDCWD,
        path,
        RenameFlags::RENAME_NOREPLACE,
    )
    .map_err(|errno| io_error("move control socket into place at", errno.into()))?;
    Ok(listener)
}

/// Tells a refused client why it is disconnected, in one error line; best effort, the socket is closed
/// when the caller drops it.
fn refuse(stream: &UnixStream, kind: ErrorKind, message: String) {
    let mut line = Response::error(None, kind, message).to_line();
    line.push('\n');
    // A fresh socket's send buffer is empty, so the short line fits; if it does not, closing is enough.
    let _ = send(
        stream.as_raw_fd(),
        line.as_bytes(),
        MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
    );
}

/// Whether a connection can still be used after an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
enum Liveness {
    Alive,
    Gone,
}

/// Hands out client tokens from a range, fresh ones before recycled ones.
struct TokenPool {
    range: Range<usize>,
    listener: Token,
    next_fresh: usize,
    recycled: VecDeque<usize>,
}

impl TokenPool {
    fn new(range: Range<usize>) -> TokenPool {
        TokenPool {
            listener: Token(range.start),
            next_fresh: range.start + 1,
            range,
            recycled: VecDeque::new(),
        }
    }

    fn take(&mut self) -> Option<Token> {
        if self.next_fresh < self.range.end {
            self.next_fresh += 1;
            Some(Token(self.next_fresh - 1))
        } else {
            self.recycled.pop_front().map(Token)
        }
    }

    fn give_back(&mut self, token: Token) {
        self.recycled.push_back(token.0);
    }
}

/// One client's socket and buffers.
struct Connection {
    id: ClientId,
    token: Token,
    stream: UnixStream,
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
    peak_queued: usize,
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
    fn queued(&self) -> usize {
        self.output.len() - self.sent + self.backlog_lines
    }

    fn note_peak(&mut self) {
        self.peak_queued = self.peak_queued.max(self.queued());
    }

    /// Reads until the socket is drained (or the read budget is spent), turning lines into `Request`
    /// events and answering malformed ones.
    fn read_available(
        &mut self,
        registry: &Registry,
        buffer: &mut [u8],
        options: &ServerOptions,
        out: &mut Vec<ServerEvent>,
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
                    Ok(request) => out.push(ServerEvent::Request {
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
    fn queue(&mut self, registry: &Registry, line: &str, max_queued: usize) -> Liveness {
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
    fn queue_stream(
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
    fn pump(&mut self, registry: &Registry, max_queued: usize) -> Liveness {
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

/// Turns one split line into a request or a request error; `None` for blank lines.
fn parse_line(line: Line<'_>, max_line: usize) -> Option<Result<Request, RequestError>> {
    match line {
        Line::Complete(bytes) if bytes.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) => None,
        Line::Complete(bytes) => Some(parse_request(bytes)),
        Line::TooLong => Some(Err(RequestError {
            id: None,
            kind: ErrorKind::LineTooLong,
            message: format!("request line is longer than {max_line} bytes; it was discarded"),
        })),
    }
}

/// A line produced by [`LineSplitter`].
#[derive(Debug, PartialEq, Eq)]
enum Line<'a> {
    /// A whole line without its newline.
    Complete(&'a [u8]),
    /// A line exceeded the limit; reported once, as soon as detected, and the rest of it is skipped.
    TooLong,
}

/// Splits a byte stream into newline-terminated lines, holding at most `max_line` bytes of a partial
/// line.
#[derive(Debug)]
struct LineSplitter {
    partial: Vec<u8>,
    /// Inside an overlong line: bytes are dropped until its newline.
    discarding: bool,
    max_line: usize,
}

impl LineSplitter {
    fn new(max_line: usize) -> LineSplitter {
        LineSplitter {
            partial: Vec::new(),
            discarding: false,
            max_line,
        }
    }

    fn feed(&mut self, mut chunk: &[u8], mut on_line: impl FnMut(Line<'_>)) {
        while let Some(newline) = chunk.iter().position(|&b| b == b'\n') {
            let segment = &chunk[..newline];
            chunk = &chunk[newline + 1..];
            if self.discarding {
                self.discarding = false;
            } else if self.partial.len() + segment.len() > self.max_line {
                self.partial.clear();
                on_line(Line::TooLong);
            } else if self.partial.is_empty() {
                on_line(Line::Complete(segment));
            } else {
                self.partial.extend_from_slice(segment);
                on_line(Line::Complete(&self.partial));
                self.partial.clear();
            }
        }
        if self.discarding || chunk.is_empty() {
            return;
        }
        if self.partial.len() + chunk.len() > self.max_line {
            self.partial = Vec::new();
            self.discarding = true;
            on_line(Line::TooLong);
        } else {
            self.partial.extend_from_slice(chunk);
        }
    }

    /// Ends the stream: a last line without a newline still counts.
    fn finish(&mut self, mut on_line: impl FnMut(Line<'_>)) {
        if !self.discarding && !self.partial.is_empty() {
            on_line(Line::Complete(&self.partial));
        }
        self.partial = Vec::new();
        self.discarding = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(max_line: usize, chunks: &[&[u8]]) -> (Vec<Option<Vec<u8>>>, usize) {
        let mut splitter = LineSplitter::new(max_line);
        let mut lines = Vec::new();
        let mut most_buffered = 0;
        let mut collect = |line: Line<'_>| {
            lines.push(match line {
                Line::Complete(bytes) => Some(bytes.to_vec()),
                Line::TooLong => None,
            })
        };
        for chunk in chunks {
            splitter.feed(chunk, &mut collect);
            most_buffered = most_buffered.max(splitter.partial.len());
        }
        splitter.finish(&mut collect);
        (lines, most_buffered)
    }

    #[test]
    fn splits_lines_across_chunks() {
        let some = |s: &str| Some(s.as_bytes().to_vec());
        type Case<'a> = (usize, Vec<&'a [u8]>, Vec<Option<Vec<u8>>>);
        let cases: Vec<Case<'_>> = vec![
            (10, vec![b"a\nb\n"], vec![some("a"), some("b")]),
            (10, vec![b"ab", b"c\n"], vec![some("abc")]),
            (10, vec![b"\n\n"], vec![some(""), some("")]),
            (10, vec![b"tail"], vec![some("tail")]),
            (3, vec![b"abc\n"], vec![some("abc")]),
            (3, vec![b"abcd\nok\n"], vec![None, some("ok")]),
            (
                3,
                vec![b"ab", b"cd", b"ef", b"\nok\n"],
                vec![None, some("ok")],
            ),
            (3, vec![b"abcdefgh"], vec![None]),
            (3, vec![b"abcd", b"\n", b"xy"], vec![None, some("xy")]),
            (3, vec![b"abcd", b"efgh\nabcd\n"], vec![None, None]),
        ];
        for (max_line, chunks, expected) in cases {
            let (lines, most_buffered) = split(max_line, &chunks);
            assert_eq!(lines, expected, "{chunks:?}");
            assert!(
                most_buffered <= max_line,
                "{chunks:?} buffered {most_buffered}"
            );
        }
    }

    #[test]
    fn peers_are_allowed_by_own_uid_listed_uid_or_listed_gid() {
        const OWN: u32 = 1000;
        let options = |uids: &[u32], gids: &[u32]| ServerOptions {
            allowed_uids: uids.to_vec(),
            allowed_gids: gids.to_vec(),
            ..ServerOptions::default()
        };
        // (options, peer uid, peer gid, allowed)
        let cases = [
            (options(&[], &[]), OWN, 100, true),
            (options(&[], &[]), 0, 0, false),
            (options(&[], &[]), 65534, OWN, false),
            (options(&[65534], &[]), 65534, 65534, true),
            (options(&[65534], &[]), 65533, 65534, false),
            (options(&[], &[50]), 65534, 50, true),
            (options(&[], &[50]), 65534, 51, false),
            (options(&[7], &[50]), OWN, 1, true),
        ];
        for (options, uid, gid, allowed) in cases {
            assert_eq!(
                options.allows(OWN, uid, gid),
                allowed,
                "{options:?} {uid} {gid}"
            );
        }
    }

    #[test]
    fn the_socket_directory_is_searchable_only_when_others_are_allowed() {
        let mut options = ServerOptions::default();
        assert_eq!(options.directory_mode(), 0o700);
        options.allowed_gids = vec![50];
        assert_eq!(options.directory_mode(), 0o711);
        options.allowed_gids.clear();
        options.allowed_uids = vec![65534];
        assert_eq!(options.directory_mode(), 0o711);
    }

    proptest::proptest! {
        #[test]
        fn chunking_does_not_change_lines(
            data in proptest::collection::vec(proptest::sample::select(b"ab\n".to_vec()), 0..200),
            cuts in proptest::collection::vec(0usize..200, 0..10),
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|cut| cut.min(data.len())).collect();
            cuts.sort_unstable();
            let mut chunks: Vec<&[u8]> = Vec::new();
            let mut start = 0;
            for cut in cuts {
                chunks.push(&data[start..cut]);
                start = cut;
            }
            chunks.push(&data[start..]);
            let (whole, _) = split(8, &[&data]);
            let (pieces, most_buffered) = split(8, &chunks);
            proptest::prop_assert_eq!(whole, pieces);
            proptest::prop_assert!(most_buffered <= 8);
        }
    }
}

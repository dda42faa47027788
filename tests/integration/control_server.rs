//! Tests of the control server with real Unix sockets in a temporary directory, driven by a real mio
//! `Poll` in the test thread. Clients are non-blocking std sockets (or blocking ones in writer threads),
//! so the test thread never waits on a socket the server has not served yet.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener as StdListener, UnixStream as StdStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use exitproof::control::protocol::{Command, RequestId, Response, Version, event_line, list_reply};
use exitproof::control::server::{
    ClientInput, ControlServer, MAX_STREAMS_PER_CLIENT, ServerOptions,
};
use exitproof::control::{ClientId, ControlError};
use mio::{Events, Poll};
use nix::fcntl::OFlag;
use nix::sys::signal::{Signal, kill};
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr, connect, recv, send, socket,
};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Gid, Pid, Uid, fork, geteuid, pipe2, setgid, setgroups, setuid};
use serde_json::{Value, json};

/// Generous bound for anything that waits on the kernel; never a speed assertion.
const PATIENCE: Duration = Duration::from_secs(20);
const TOKENS: std::ops::Range<usize> = 10..1_000_000;

struct Harness {
    poll: Poll,
    events: Events,
    server: ControlServer,
    out: Vec<ClientInput>,
    path: PathBuf,
    // Declared last so it is removed after the server (whose Drop removes its socket file).
    dir: tempfile::TempDir,
}

impl Harness {
    fn new(options: ServerOptions) -> Harness {
        let dir = tempfile::tempdir().expect("create temporary directory");
        let path = dir.path().join("control.sock");
        let mut server = ControlServer::bind(&path, options).expect("bind control socket");
        let poll = Poll::new().expect("create poll");
        server
            .register(poll.registry(), TOKENS)
            .expect("register server");
        Harness {
            poll,
            events: Events::with_capacity(64),
            server,
            out: Vec::new(),
            path,
            dir,
        }
    }

    /// Runs one loop iteration: poll, then hand every owned event to the server.
    fn turn(&mut self, timeout: Duration) {
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return,
            Err(e) => panic!("poll failed: {e}"),
        }
        for event in self.events.iter() {
            assert!(self.server.owns(event.token()), "foreign token {event:?}");
            self.server
                .handle_event(self.poll.registry(), event, &mut self.out);
        }
    }

    /// Turns the loop until `done` holds, failing after [`PATIENCE`].
    fn pump_until(&mut self, what: &str, mut done: impl FnMut(&mut Harness) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !done(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            self.turn(Duration::from_millis(50));
        }
    }

    /// Turns the loop for a while to show that nothing more happens.
    fn settle(&mut self) {
        for _ in 0..5 {
            self.turn(Duration::from_millis(20));
        }
    }

    fn connect(&self) -> TestClient {
        TestClient::connect(&self.path)
    }

    fn send(&mut self, client: ClientId, line: &str) -> bool {
        self.server.send(self.poll.registry(), client, line)
    }

    /// Removes and returns the next request event, pumping until one arrives.
    fn next_request(&mut self) -> (ClientId, exitproof::control::protocol::Request) {
        self.pump_until("a request", |h| {
            h.out
                .iter()
                .any(|e| matches!(e, ClientInput::Request { .. }))
        });
        let index = self
            .out
            .iter()
            .position(|e| matches!(e, ClientInput::Request { .. }))
            .expect("pumped until a request arrived");
        match self.out.remove(index) {
            ClientInput::Request { client, request } => (client, request),
            ClientInput::Closed { .. } => unreachable!("position matched a request"),
        }
    }

    fn closed(&self) -> Vec<ClientId> {
        self.out
            .iter()
            .filter_map(|e| match e {
                ClientInput::Closed { client } => Some(*client),
                ClientInput::Request { .. } => None,
            })
            .collect()
    }
}

/// A client whose reads never block the test thread.
struct TestClient {
    stream: StdStream,
    input: Vec<u8>,
    eof: bool,
}

impl TestClient {
    fn connect(path: &std::path::Path) -> TestClient {
        let stream = StdStream::connect(path).expect("connect test client");
        stream.set_nonblocking(true).expect("set nonblocking");
        TestClient {
            stream,
            input: Vec::new(),
            eof: false,
        }
    }

    fn write(&mut self, bytes: &[u8]) {
        // Test writes are small enough for the socket buffer; a short write would be a test bug.
        let written = self.stream.write(bytes).expect("write test request");
        assert_eq!(written, bytes.len(), "short write in test");
    }

    fn fill(&mut self) {
        let mut buffer = [0u8; 4096];
        loop {
            match self.stream.read(&mut buffer) {
                Ok(0) => {
                    self.eof = true;
                    return;
                }
                Ok(n) => self.input.extend_from_slice(&buffer[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => panic!("test client read failed: {e}"),
            }
        }
    }

    /// Reads what has arrived, but at most `max` bytes: a reader slower than the server.
    fn fill_at_most(&mut self, max: usize) -> usize {
        let mut buffer = vec![0u8; max];
        loop {
            match self.stream.read(&mut buffer) {
                Ok(0) => {
                    self.eof = true;
                    return 0;
                }
                Ok(n) => {
                    self.input.extend_from_slice(&buffer[..n]);
                    return n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return 0,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => panic!("test client read failed: {e}"),
            }
        }
    }

    /// Returns the next complete line as JSON, if one has arrived.
    fn try_line(&mut self) -> Option<Value> {
        self.fill();
        let newline = self.input.iter().position(|&b| b == b'\n')?;
        let line: Vec<u8> = self.input.drain(..=newline).collect();
        Some(serde_json::from_slice(&line).expect("server sent JSON"))
    }

    fn line(&mut self, harness: &mut Harness) -> Value {
        let mut line = None;
        harness.pump_until("a line for the client", |_| {
            line = self.try_line();
            line.is_some()
        });
        line.expect("pumped until a line arrived")
    }

    fn at_eof(&mut self) -> bool {
        self.fill();
        self.eof
    }
}

fn error_kind(response: &Value) -> &str {
    response["error"]["kind"].as_str().unwrap_or("<none>")
}

#[test]
fn requests_round_trip() {
    let mut h = Harness::new(ServerOptions::default());
    let mut client = h.connect();
    client.write(
        b"{\"id\":1,\"cmd\":\"list\"}\n{\"id\":\"two\",\"cmd\":\"watch\",\"unit\":\"x.service\"}\n",
    );
    let (first, request) = h.next_request();
    assert_eq!(request.command, Command::List);
    let (second, watch) = h.next_request();
    assert_eq!(first, second);
    assert_eq!(watch.command.name(), "watch");
    assert!(h.send(
        first,
        &Response::ok(request.id, json!({"units": []})).to_line()
    ));
    assert!(h.send(first, &Response::ok(watch.id, ()).to_line()));
    assert_eq!(
        client.line(&mut h),
        json!({"id": 1, "ok": true, "units": []})
    );
    assert_eq!(client.line(&mut h), json!({"id": "two", "ok": true}));
    assert_eq!(h.server.client_count(), 1);
    assert_eq!(h.server.queued_bytes(), 0);
}

#[test]
fn version_reaches_the_agent_and_its_answer_the_client() {
    let mut h = Harness::new(ServerOptions::default());
    let mut client = h.connect();
    client.write(b"{\"id\":\"v\",\"cmd\":\"version\"}\n");
    let (id, request) = h.next_request();
    assert_eq!(request.command, Command::Version);
    let answer = Response::ok(request.id, json!({ "version": Version::CURRENT }));
    assert!(h.send(id, &answer.to_line()));
    assert_eq!(
        client.line(&mut h),
        json!({"id": "v", "ok": true, "version": {"protocol": 1, "agent": env!("CARGO_PKG_VERSION")}})
    );
}

#[test]
fn malformed_lines_are_answered_by_the_server_while_others_are_served() {
    let mut h = Harness::new(ServerOptions::default());
    let mut noisy = h.connect();
    let mut good = h.connect();
    noisy.write(b"garbage\n\n   \n{\"id\":2,\"cmd\":\"frob\"}\n\xff\xfe\n[1]\n");
    good.write(b"{\"id\":9,\"cmd\":\"events\"}\n");
    let expected = [
        (Value::Null, "bad-json"),
        (json!(2), "unknown-command"),
        (Value::Null, "bad-json"),
        (Value::Null, "bad-request"),
    ];
    for (id, kind) in expected {
        let response = noisy.line(&mut h);
        assert_eq!((&response["id"], error_kind(&response)), (&id, kind));
        assert_eq!(response["ok"], json!(false));
    }
    let (client, request) = h.next_request();
    assert_eq!(request.command, Command::Events);
    assert!(h.send(client, &Response::ok(request.id, ()).to_line()));
    assert_eq!(good.line(&mut h), json!({"id": 9, "ok": true}));
    // The noisy client is still served after its errors.
    noisy.write(b"{\"id\":3,\"cmd\":\"list\"}\n");
    let (noisy_id, request) = h.next_request();
    assert_ne!(noisy_id, client);
    assert!(h.send(noisy_id, &Response::ok(request.id, ()).to_line()));
    assert_eq!(noisy.line(&mut h), json!({"id": 3, "ok": true}));
    assert!(h.out.is_empty(), "unexpected events {:?}", h.out);
}

#[test]
fn overlong_line_is_reported_early_and_discarded() {
    let mut h = Harness::new(ServerOptions {
        max_line: 1024,
        ..ServerOptions::default()
    });
    let mut client = h.connect();
    client.write(&[b'x'; 5000]);
    // Reported before the line's newline arrives: the server does not wait for (or buffer) it.
    let response = client.line(&mut h);
    assert_eq!(error_kind(&response), "line-too-long");
    client.write(&[b'{'; 3000]);
    client.write(b"\n{\"id\":1,\"cmd\":\"list\"}\n");
    let (_, request) = h.next_request();
    assert_eq!(request.command, Command::List);
    h.settle();
    assert!(client.try_line().is_none(), "only one error per long line");
    // A line of exactly the limit is accepted.
    let mut exact = br#"{"id":2,"cmd":"list"}"#.to_vec();
    exact.resize(1024, b' ');
    exact.push(b'\n');
    client.write(&exact);
    let (_, request) = h.next_request();
    assert_eq!(request.id, Some(RequestId::Number(2.into())));
}

#[test]
fn half_closed_client_still_gets_its_response() {
    let mut h = Harness::new(ServerOptions::default());
    let mut client = h.connect();
    // The last request has no newline: end of stream completes it.
    client
        .write(b"{\"id\":1,\"cmd\":\"wait\",\"unit\":\"x.service\"}\n{\"id\":2,\"cmd\":\"list\"}");
    client
        .stream
        .shutdown(std::net::Shutdown::Write)
        .expect("half-close");
    let (id, wait) = h.next_request();
    let (_, list) = h.next_request();
    assert_eq!(list.command, Command::List);
    h.settle();
    assert!(h.closed().is_empty(), "half-closed client was dropped");
    assert_eq!(h.server.client_count(), 1);
    assert!(h.send(id, &Response::ok(list.id, ()).to_line()));
    assert!(h.send(id, &Response::ok(wait.id, ()).to_line()));
    assert_eq!(client.line(&mut h), json!({"id": 2, "ok": true}));
    assert_eq!(client.line(&mut h), json!({"id": 1, "ok": true}));
    drop(client);
    h.pump_until("Closed", |h| !h.closed().is_empty());
    assert_eq!(h.closed(), vec![id]);
    assert_eq!(h.server.client_count(), 0);
}

#[test]
fn abrupt_close_yields_one_closed() {
    let mut h = Harness::new(ServerOptions::default());
    // One client vanishes mid-line, one right after a request, one with a response pending.
    let mut mid_line = h.connect();
    mid_line.write(b"{\"cmd\":");
    let mut after_request = h.connect();
    after_request.write(b"{\"cmd\":\"list\"}\n");
    let mut pending = h.connect();
    pending.write(b"{\"cmd\":\"events\"}\n");
    let mut requests = [h.next_request(), h.next_request()];
    requests.sort_by_key(|(_, request)| request.command.name());
    let [(pending_id, _), (after_request_id, _)] = requests;
    h.settle();
    drop(mid_line);
    drop(after_request);
    h.pump_until("two Closed", |h| h.closed().len() == 2);
    assert!(h.closed().contains(&after_request_id));
    // Output to a peer that is gone: the send fails at once or queues; either way one Closed.
    let line = Response::ok(None, json!({"pad": "x".repeat(1000)})).to_line();
    drop(pending);
    let _ = h.send(pending_id, &line);
    h.pump_until("three Closed", |h| {
        h.server.take_closed(&mut h.out);
        h.closed().len() == 3
    });
    h.settle();
    h.server.take_closed(&mut h.out);
    let mut closed = h.closed();
    assert_eq!(closed.len(), 3, "{closed:?}");
    closed.sort();
    closed.dedup();
    assert_eq!(closed.len(), 3, "each client is closed exactly once");
    assert_eq!(h.server.client_count(), 0);
    assert!(
        !h.send(pending_id, &line),
        "a closed client cannot be sent to"
    );
}

#[test]
fn subscriber_that_never_reads_is_dropped_without_growing_memory() {
    let max_queued = 64 * 1024;
    let mut h = Harness::new(ServerOptions {
        max_queued,
        ..ServerOptions::default()
    });
    let mut client = h.connect();
    client.write(b"{\"cmd\":\"events\"}\n");
    let (id, _) = h.next_request();
    let event = event_line(&json!({"unit": "x.service", "pad": "y".repeat(1000)}))
        .expect("event serializes");
    let mut delivered = 0usize;
    // The kernel buffers some megabytes at most; the loop bound only keeps a broken server finite.
    for _ in 0..100_000 {
        if !h.send(id, &event) {
            break;
        }
        delivered += 1;
        assert!(
            h.server.queued_bytes() <= max_queued,
            "queue exceeded its limit"
        );
    }
    assert!(
        delivered < 100_000,
        "never-reading client was never dropped"
    );
    assert_eq!(h.server.client_count(), 0);
    assert_eq!(h.server.queued_bytes(), 0);
    assert!(!h.send(id, &event));
    h.server.take_closed(&mut h.out);
    assert_eq!(h.closed(), vec![id]);
    h.settle();
    assert_eq!(h.closed(), vec![id], "Closed reported exactly once");
    // The client sees a prefix of whole events, then end of stream.
    h.pump_until("client EOF", |_| client.at_eof());
    let text = String::from_utf8_lossy(&client.input);
    for line in text.lines() {
        assert_eq!(line, event);
    }
}

#[test]
fn clients_beyond_the_limit_are_told_busy() {
    let mut h = Harness::new(ServerOptions {
        max_clients: 2,
        ..ServerOptions::default()
    });
    let mut first = h.connect();
    let _second = h.connect();
    h.pump_until("two clients", |h| h.server.client_count() == 2);
    let mut third = h.connect();
    let response = third.line(&mut h);
    assert_eq!(error_kind(&response), "busy");
    h.pump_until("busy client closed", |_| third.at_eof());
    assert_eq!(h.server.client_count(), 2);
    assert!(
        h.out.is_empty(),
        "a refused client is invisible to the agent"
    );
    // A freed slot is taken by the next client.
    first.write(b"{\"cmd\":\"list\"}\n");
    let (first_id, _) = h.next_request();
    drop(first);
    h.pump_until("Closed", |h| h.closed() == vec![first_id]);
    let mut fourth = h.connect();
    fourth.write(b"{\"cmd\":\"list\"}\n");
    let (fourth_id, _) = h.next_request();
    assert!(fourth_id > first_id, "client ids are never reused");
    assert_eq!(h.server.client_count(), 2);
}

#[test]
fn socket_file_has_the_requested_mode_and_is_removed_on_drop() {
    for mode in [0o600, 0o660] {
        let h = Harness::new(ServerOptions {
            mode,
            ..ServerOptions::default()
        });
        let metadata = std::fs::symlink_metadata(&h.path).expect("socket exists");
        assert!(metadata.file_type().is_socket());
        assert_eq!(metadata.permissions().mode() & 0o7777, mode);
        let entries: Vec<_> = std::fs::read_dir(h.dir.path())
            .expect("list temporary directory")
            .collect();
        assert_eq!(entries.len(), 1, "staging leftovers: {entries:?}");
        let path = h.path.clone();
        let dir = h.dir.path().to_owned();
        let Harness {
            server, dir: keep, ..
        } = h;
        drop(server);
        assert!(!path.exists(), "socket file left behind");
        assert_eq!(std::fs::read_dir(&dir).expect("list").count(), 0);
        drop(keep);
    }
}

#[test]
fn drop_leaves_a_file_that_replaced_the_socket() {
    let h = Harness::new(ServerOptions::default());
    let replacement = h.dir.path().join("other");
    std::fs::write(&replacement, b"not ours").expect("write file");
    std::fs::rename(&replacement, &h.path).expect("replace socket");
    let Harness {
        server, dir, path, ..
    } = h;
    drop(server);
    assert_eq!(std::fs::read(&path).expect("file kept"), b"not ours");
    drop(dir);
}

#[test]
fn stale_socket_is_replaced() {
    let dir = tempfile::tempdir().expect("create temporary directory");
    let path = dir.path().join("control.sock");
    // Binding and dropping a std listener leaves a socket file nobody answers on.
    drop(StdListener::bind(&path).expect("bind stale socket"));
    assert!(StdStream::connect(&path).is_err());
    let server = ControlServer::bind(&path, ServerOptions::default()).expect("replace stale");
    StdStream::connect(&path).expect("new socket answers");
    drop(server);
}

#[test]
fn live_socket_is_refused() {
    let mut h = Harness::new(ServerOptions::default());
    let err = ControlServer::bind(&h.path, ServerOptions::default()).expect_err("second bind");
    assert!(
        matches!(err, ControlError::AlreadyListening { .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!("another agent is listening on {}", h.path.display())
    );
    // The first server is intact and its probe connection is reported closed.
    h.pump_until("probe closed", |h| h.closed().len() == 1);
    let mut client = h.connect();
    client.write(b"{\"id\":1,\"cmd\":\"list\"}\n");
    let (id, request) = h.next_request();
    assert!(h.send(id, &Response::ok(request.id, ()).to_line()));
    assert_eq!(client.line(&mut h), json!({"id": 1, "ok": true}));
}

#[test]
fn non_socket_file_is_never_replaced() {
    let dir = tempfile::tempdir().expect("create temporary directory");
    let file = dir.path().join("control.sock");
    std::fs::write(&file, b"precious").expect("write file");
    let subdir = dir.path().join("subdir");
    std::fs::create_dir(&subdir).expect("create dir");
    for path in [&file, &subdir] {
        let err = ControlServer::bind(path, ServerOptions::default()).expect_err("not a socket");
        assert!(matches!(err, ControlError::NotASocket { .. }), "{err:?}");
        assert!(err.to_string().contains("is not a socket"), "{err}");
    }
    assert_eq!(std::fs::read(&file).expect("file kept"), b"precious");
    assert!(subdir.is_dir());
    assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 2);
}

#[test]
fn missing_directory_is_an_error_naming_the_path() {
    let dir = tempfile::tempdir().expect("create temporary directory");
    let path = dir.path().join("missing").join("control.sock");
    let err = ControlServer::bind(&path, ServerOptions::default()).expect_err("no directory");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

/// A small deterministic generator (xorshift64*), enough to make varied garbage.
struct Garbage(u64);

impl Garbage {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let pieces: [&[u8]; 8] = [
            b"\n",
            b"{\"cmd\":\"watch\",\"unit\":",
            b"\"x.service\"}",
            b"{\"id\":",
            b"\xff\xc3",
            b"[[[[",
            b"\"\\u0000\"",
            b"}\n",
        ];
        let mut data = Vec::with_capacity(len);
        while data.len() < len {
            let roll = self.next();
            if roll.is_multiple_of(4) {
                data.extend_from_slice(pieces[(roll >> 8) as usize % pieces.len()]);
            } else {
                data.push((roll >> 16) as u8);
            }
        }
        data
    }
}

#[test]
fn garbage_never_breaks_the_server() {
    let mut h = Harness::new(ServerOptions {
        max_line: 4096,
        max_queued: 32 * 1024,
        ..ServerOptions::default()
    });
    let mut garbage = Garbage(0x9e37_79b9_7f4a_7c15);
    // Big writers run in threads with blocking sockets; the server drains them from this thread.
    let writers: Vec<_> = [1usize << 20, 300_000, 70_000]
        .into_iter()
        .map(|len| {
            let data = garbage.bytes(len);
            let path = h.path.clone();
            std::thread::spawn(move || {
                let mut stream = StdStream::connect(&path).expect("connect writer");
                stream
                    .set_write_timeout(Some(PATIENCE))
                    .expect("set write timeout");
                // The server may drop a writer that never reads its error lines: EPIPE ends it.
                let _ = stream.write_all(&data);
            })
        })
        .collect();
    let mut small: Vec<TestClient> = (0..20)
        .map(|i| {
            let mut client = h.connect();
            let data = garbage.bytes(1 + i * 97);
            client.write(&data);
            client
        })
        .collect();
    h.pump_until("writers to finish", |_| {
        writers.iter().all(|writer| writer.is_finished())
    });
    for writer in writers {
        writer.join().expect("writer thread");
    }
    small.clear();
    h.pump_until("all garbage clients closed", |h| {
        h.server.client_count() == 0
    });
    let closed = h.closed();
    let mut unique = closed.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(closed.len(), 23, "every client closed once: {closed:?}");
    assert_eq!(unique.len(), 23);
    let mut good = h.connect();
    good.write(b"{\"id\":\"after\",\"cmd\":\"list\"}\n");
    let (id, request) = h.next_request();
    assert!(h.send(id, &Response::ok(request.id, ()).to_line()));
    assert_eq!(good.line(&mut h), json!({"id": "after", "ok": true}));
    assert_eq!(h.server.queued_bytes(), 0);
}

#[test]
fn flooding_client_loses_no_requests() {
    const REQUESTS: usize = 50_000;
    let mut h = Harness::new(ServerOptions::default());
    let path = h.path.clone();
    // Padded lines make megabytes of input, more than one event's read budget.
    let writer = std::thread::spawn(move || {
        let mut line = br#"{"cmd":"list"}"#.to_vec();
        line.resize(120, b' ');
        line.push(b'\n');
        let data = line.repeat(REQUESTS);
        let mut stream = StdStream::connect(&path).expect("connect flooder");
        stream
            .set_write_timeout(Some(PATIENCE))
            .expect("set write timeout");
        stream.write_all(&data).expect("flood");
        stream
    });
    let mut other = h.connect();
    other.write(b"{\"id\":\"other\",\"cmd\":\"events\"}\n");
    let count_requests = |h: &Harness| {
        h.out
            .iter()
            .filter(|e| matches!(e, ClientInput::Request { .. }))
            .count()
    };
    h.pump_until("every request", |h| count_requests(h) == REQUESTS + 1);
    // The flooder's socket stays open until here, so no close event could have flushed out a tail
    // left unread when a read budget ran out: the server's re-arming did.
    let flooder = writer.join().expect("flooder thread");
    h.settle();
    assert_eq!(count_requests(&h), REQUESTS + 1);
    assert!(h.closed().is_empty());
    drop(flooder);
}

/// The uid and gid the foreign peer runs as (`nobody` and `nogroup` on Debian).
const NOBODY: u32 = 65534;

/// A child process that becomes uid and gid [`NOBODY`] (with no supplementary groups), connects to the
/// control socket, sends one `list` request with id 1, and reports the first line it reads back (or
/// everything up to end of stream) through a pipe. Killed and reaped on drop if it has not been reaped.
struct ForeignPeer {
    pid: Pid,
    report: std::fs::File,
    reaped: bool,
}

/// What the foreign peer's child sends.
const FOREIGN_REQUEST: &[u8] = b"{\"id\":1,\"cmd\":\"list\"}\n";

impl ForeignPeer {
    fn start(socket: &std::path::Path) -> ForeignPeer {
        // Everything the child uses is prepared here: after fork it must not allocate.
        let address = UnixAddr::new(socket).expect("socket path fits an address");
        let (report, report_writer) =
            pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).expect("create report pipe");
        // SAFETY: the test process has other threads, so until it exits the child may only make
        // async-signal-safe calls. `foreign_child` makes only raw system calls (through libc and
        // nix's thin wrappers, which do not allocate) and the child ends with `_exit`.
        match unsafe { fork() }.expect("fork foreign peer") {
            ForkResult::Child => {
                let code = foreign_child(&address, report_writer.as_raw_fd());
                // SAFETY: `_exit` ends the child without running the parent's destructors or atexit
                // handlers, which must not run twice.
                unsafe { nix::libc::_exit(code) }
            }
            ForkResult::Parent { child } => ForeignPeer {
                pid: child,
                report: std::fs::File::from(report),
                reaped: false,
            },
        }
    }

    /// Turns the server's loop until the child has exited, checks it succeeded, and returns the line
    /// it read from the server, newline included.
    fn reply(&mut self, harness: &mut Harness) -> String {
        let mut output = Vec::new();
        let mut buffer = [0u8; 512];
        let mut at_eof = false;
        harness.pump_until("the foreign peer to finish", |_| {
            loop {
                match self.report.read(&mut buffer) {
                    Ok(0) => at_eof = true,
                    Ok(n) => {
                        output.extend_from_slice(&buffer[..n]);
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("cannot read the foreign peer's report: {e}"),
                }
                return at_eof;
            }
        });
        let status = waitpid(self.pid, None).expect("reap foreign peer");
        self.reaped = true;
        assert_eq!(
            status,
            WaitStatus::Exited(self.pid, 0),
            "foreign peer failed (10: dropping privileges, 11: socket, 12: connect)"
        );
        String::from_utf8(output).expect("the server sends UTF-8")
    }
}

impl Drop for ForeignPeer {
    fn drop(&mut self) {
        if !self.reaped {
            // By pid, and the child cannot have been reaped and its pid reused: only this guard reaps it.
            let _ = kill(self.pid, Signal::SIGKILL);
            let _ = waitpid(self.pid, None);
        }
    }
}

/// The foreign peer's child: returns its exit code. Only async-signal-safe calls (see
/// [`ForeignPeer::start`]).
fn foreign_child(address: &UnixAddr, report: RawFd) -> i32 {
    // A child stuck on a broken server must not outlive the test: SIGALRM's default action ends it.
    nix::unistd::alarm::set(60);
    // The fork copied every descriptor of the test process; holding other tests' sockets open would
    // hide their closes, so all but the report pipe go.
    let report_bits = report as nix::libc::c_uint;
    // SAFETY: close_range only closes descriptors; none of those closed is used by the child again.
    // When the report pipe is descriptor 3, the first range is empty and fails harmlessly.
    unsafe {
        nix::libc::close_range(3, report_bits - 1, 0);
        nix::libc::close_range(report_bits + 1, nix::libc::c_uint::MAX, 0);
    }
    let nobody_gid = Gid::from_raw(NOBODY);
    if setgroups(&[]).is_err()
        || setgid(nobody_gid).is_err()
        || setuid(Uid::from_raw(NOBODY)).is_err()
    {
        return 10;
    }
    let Ok(stream) = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    ) else {
        return 11;
    };
    if connect(stream.as_raw_fd(), address).is_err() {
        return 12;
    }
    // A refused peer may already be disconnected: EPIPE (never SIGPIPE) is fine, the reply is what counts.
    let _ = send(stream.as_raw_fd(), FOREIGN_REQUEST, MsgFlags::MSG_NOSIGNAL);
    let mut reply = [0u8; 512];
    let mut length = 0;
    while length < reply.len() && !reply[..length].contains(&b'\n') {
        match recv(stream.as_raw_fd(), &mut reply[length..], MsgFlags::empty()) {
            Ok(0) | Err(_) => break,
            Ok(n) => length += n,
        }
    }
    // SAFETY: `report` is the pipe's write end, open in this process (kept by the close_range above).
    let report = unsafe { BorrowedFd::borrow_raw(report) };
    let _ = nix::unistd::write(report, &reply[..length]);
    0
}

/// A harness whose socket anyone may connect to, so refusals come from the credential check alone.
fn open_harness(options: ServerOptions) -> Harness {
    let h = Harness::new(ServerOptions {
        mode: 0o666,
        ..options
    });
    std::fs::set_permissions(h.dir.path(), std::fs::Permissions::from_mode(0o711))
        .expect("make the socket's directory traversable");
    h
}

/// Connects as ourselves and checks a request round trip, returning the client's id.
fn own_round_trip(h: &mut Harness, client: &mut TestClient) -> ClientId {
    client.write(b"{\"id\":\"own\",\"cmd\":\"list\"}\n");
    let (id, request) = h.next_request();
    assert!(h.send(id, &Response::ok(request.id, ()).to_line()));
    assert_eq!(client.line(h), json!({"id": "own", "ok": true}));
    id
}

fn is_root() -> bool {
    if geteuid().is_root() {
        return true;
    }
    eprintln!("skipped: only root can connect as another user");
    false
}

#[test]
fn peers_of_other_users_are_refused_unless_allowed() {
    if !is_root() {
        return;
    }
    let forbidden = format!(
        "{{\"ok\":false,\"error\":{{\"kind\":\"forbidden\",\"message\":\"uid {NOBODY} is not \
         allowed to use this socket (the agent admits it with --allow-uid {NOBODY} or \
         --allow-gid {NOBODY})\"}}}}\n"
    );
    // (allowed uids, allowed gids, whether the foreign peer is admitted)
    let cases = [
        (vec![], vec![], false),
        (vec![NOBODY], vec![], true),
        (vec![], vec![NOBODY], true),
        (vec![1234, 5678], vec![4321], false),
    ];
    for (allowed_uids, allowed_gids, admitted) in cases {
        let context = format!("uids {allowed_uids:?} gids {allowed_gids:?}");
        let mut h = open_harness(ServerOptions {
            allowed_uids,
            allowed_gids,
            ..ServerOptions::default()
        });
        // Our own uid is always allowed, whatever the lists say.
        let mut own = h.connect();
        let own_id = own_round_trip(&mut h, &mut own);
        let mut peer = ForeignPeer::start(&h.path);
        if admitted {
            let (peer_id, request) = h.next_request();
            assert_ne!(peer_id, own_id, "{context}");
            assert_eq!(request.command, Command::List, "{context}");
            assert!(h.send(peer_id, &Response::ok(request.id, ()).to_line()));
            assert_eq!(peer.reply(&mut h), "{\"id\":1,\"ok\":true}\n", "{context}");
            h.pump_until("the peer's Closed", |h| h.closed() == vec![peer_id]);
        } else {
            assert_eq!(peer.reply(&mut h), forbidden, "{context}");
            h.settle();
            assert!(h.out.is_empty(), "{context}: agent saw {:?}", h.out);
        }
        assert_eq!(h.server.client_count(), 1, "{context}");
        own_round_trip(&mut h, &mut own);
    }
}

#[test]
fn forbidden_peer_never_takes_a_client_slot() {
    if !is_root() {
        return;
    }
    let mut h = open_harness(ServerOptions {
        max_clients: 1,
        ..ServerOptions::default()
    });
    let mut own = h.connect();
    own_round_trip(&mut h, &mut own);
    // The server is full, yet the peer is told it is forbidden, not busy: credentials come first.
    let reply = ForeignPeer::start(&h.path).reply(&mut h);
    assert!(reply.contains(r#""kind":"forbidden""#), "{reply}");
    assert_eq!(h.server.client_count(), 1);
    assert!(h.out.is_empty(), "agent saw {:?}", h.out);
    own_round_trip(&mut h, &mut own);
}

/// One listed unit, about 300 bytes serialized, like the agent's `WatchView`.
#[derive(serde::Serialize)]
struct FakeView {
    unit: String,
    n: usize,
    pad: String,
}

fn fake_view(n: usize) -> FakeView {
    FakeView {
        unit: format!("unit-{n:06}.service"),
        n,
        pad: "p".repeat(250),
    }
}

/// The most bytes one streamed item adds: the item and its comma.
fn item_bytes(n: usize) -> usize {
    serde_json::to_string(&fake_view(n))
        .expect("serialize")
        .len()
        + 1
}

#[test]
fn streamed_list_of_100000_units_reaches_a_slow_reader_whole_and_in_order() {
    const UNITS: usize = 100_000;
    const READ_PER_TURN: usize = 16 * 1024;
    let options = ServerOptions::default();
    let max_queued = options.max_queued;
    let mut h = Harness::new(options);
    let mut slow = h.connect();
    slow.write(b"{\"id\":\"L\",\"cmd\":\"list\"}\n");
    let (slow_id, request) = h.next_request();
    assert_eq!(request.command, Command::List);
    let views: Vec<FakeView> = (0..UNITS).map(fake_view).collect();
    let item = item_bytes(UNITS - 1);
    let event = event_line(&json!({"unit": "after.service"})).expect("event");

    let started = Instant::now();
    assert!(
        h.server
            .send_streamed(h.poll.registry(), slow_id, list_reply(request.id, views))
    );
    // Sent while the reply is under way: it must come after the whole reply line.
    assert!(h.send(slow_id, &event));
    // So must the server's own answer to a malformed line read meanwhile.
    slow.write(b"{\n");

    // Another client is served while the slow one holds a reply in progress.
    let mut other = h.connect();
    other.write(b"{\"id\":\"o\",\"cmd\":\"list\"}\n");
    let (other_id, other_request) = h.next_request();
    assert_ne!(other_id, slow_id);
    assert!(h.send(other_id, &Response::ok(other_request.id, ()).to_line()));
    assert_eq!(other.line(&mut h), json!({"id": "o", "ok": true}));

    let mut most_queued = 0;
    let deadline = Instant::now() + PATIENCE * 3;
    let mut newlines = 0;
    while newlines < 3 {
        assert!(
            Instant::now() < deadline,
            "timed out streaming the list: {} bytes read, {:?} queued",
            slow.input.len(),
            h.server.client_queued_bytes(slow_id)
        );
        h.turn(Duration::from_millis(1));
        let before = slow.input.len();
        slow.fill_at_most(READ_PER_TURN);
        newlines += slow.input[before..].iter().filter(|&&b| b == b'\n').count();
        most_queued = most_queued.max(h.server.client_queued_bytes(slow_id).expect("connected"));
    }
    let elapsed = started.elapsed();
    let peak = h
        .server
        .client_peak_queued_bytes(slow_id)
        .expect("connected");
    eprintln!(
        "streamed {UNITS} units ({} bytes) to a reader taking {READ_PER_TURN} bytes a turn in \
         {elapsed:?}; peak queued {peak} bytes (sampled between turns: {most_queued})",
        slow.input.len()
    );
    assert!(
        peak <= max_queued + item,
        "peak {peak} exceeds {max_queued} + one item ({item})"
    );
    assert!(most_queued <= peak);

    let reply = slow.try_line().expect("the list line");
    assert_eq!(reply["id"], json!("L"));
    assert_eq!(reply["ok"], json!(true));
    let units = reply["units"].as_array().expect("units array");
    assert_eq!(units.len(), UNITS);
    for (n, unit) in units.iter().enumerate() {
        assert_eq!(unit["n"], json!(n), "unit {n} out of order");
        assert_eq!(unit["unit"], json!(format!("unit-{n:06}.service")));
    }
    assert_eq!(
        slow.try_line(),
        Some(serde_json::from_str(&event).expect("JSON"))
    );
    assert_eq!(
        error_kind(&slow.try_line().expect("bad-json answer")),
        "bad-json"
    );
    assert!(slow.input.is_empty());

    assert_eq!(h.server.client_count(), 2, "nobody was dropped");
    assert!(h.closed().is_empty());
    h.settle();
    assert_eq!(h.server.queued_bytes(), 0);
}

/// An iterator of fake views that records when it is dropped.
struct Watched {
    next: usize,
    end: usize,
    dropped: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Iterator for Watched {
    type Item = FakeView;

    fn next(&mut self) -> Option<FakeView> {
        (self.next < self.end).then(|| {
            self.next += 1;
            fake_view(self.next - 1)
        })
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.dropped
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn watched(end: usize) -> (Watched, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let iterator = Watched {
        next: 0,
        end,
        dropped: std::sync::Arc::clone(&dropped),
    };
    (iterator, dropped)
}

#[test]
fn client_leaving_mid_stream_is_dropped_and_its_reply_released() {
    let mut h = Harness::new(ServerOptions::default());
    let mut client = h.connect();
    client.write(b"{\"cmd\":\"list\"}\n");
    let (id, request) = h.next_request();
    let (items, dropped) = watched(100_000);
    assert!(
        h.server
            .send_streamed(h.poll.registry(), id, list_reply(request.id, items))
    );
    h.pump_until("part of the reply", |_| client.fill_at_most(4096) > 0);
    assert!(!dropped.load(std::sync::atomic::Ordering::SeqCst));
    drop(client);
    h.pump_until("the client to be closed", |h| h.closed() == vec![id]);
    assert!(
        dropped.load(std::sync::atomic::Ordering::SeqCst),
        "reply kept"
    );
    assert_eq!(h.server.client_count(), 0);
    assert_eq!(h.server.queued_bytes(), 0);
    assert!(!h.send(id, "{}"));
    let (items, dropped) = watched(1);
    assert!(
        !h.server
            .send_streamed(h.poll.registry(), id, list_reply(None, items))
    );
    assert!(dropped.load(std::sync::atomic::Ordering::SeqCst));
}

#[test]
fn events_behind_a_stalled_stream_still_count_toward_the_limit() {
    let max_queued = 64 * 1024;
    let mut h = Harness::new(ServerOptions {
        max_queued,
        ..ServerOptions::default()
    });
    let mut client = h.connect();
    client.write(b"{\"cmd\":\"list\"}\n");
    let (id, request) = h.next_request();
    let (items, dropped) = watched(100_000);
    assert!(
        h.server
            .send_streamed(h.poll.registry(), id, list_reply(request.id, items))
    );
    let event = event_line(&json!({"pad": "e".repeat(500)})).expect("event");
    let mut sent = 0;
    while h.send(id, &event) {
        sent += 1;
        assert!(sent < 10_000, "a client that never reads was never dropped");
        let queued = h.server.client_queued_bytes(id).expect("connected");
        assert!(queued <= max_queued + item_bytes(99_999), "{queued} queued");
    }
    assert!(dropped.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(h.server.client_count(), 0);
    assert_eq!(h.server.queued_bytes(), 0);
    h.server.take_closed(&mut h.out);
    assert_eq!(h.closed(), vec![id]);
}

#[test]
fn streamed_replies_beyond_the_limit_are_answered_busy_in_order() {
    assert_eq!(MAX_STREAMS_PER_CLIENT, 2, "the protocol docs say 2");
    let mut h = Harness::new(ServerOptions::default());
    let mut client = h.connect();
    client.write(b"{\"cmd\":\"events\"}\n");
    let (id, _) = h.next_request();
    // Each reply (about 6 MB) is larger than the socket buffer plus the output bound, so none is
    // finished before the client reads.
    const UNITS: usize = 20_000;
    let mut releases = Vec::new();
    for n in 0..=MAX_STREAMS_PER_CLIENT {
        let (items, dropped) = watched(UNITS);
        let reply_id = Some(RequestId::Number(n.into()));
        assert!(
            h.server
                .send_streamed(h.poll.registry(), id, list_reply(reply_id, items))
        );
        releases.push(dropped);
    }
    assert!(
        releases[MAX_STREAMS_PER_CLIENT].load(std::sync::atomic::Ordering::SeqCst),
        "the refused reply is released at once"
    );
    for (n, released) in releases.iter().take(MAX_STREAMS_PER_CLIENT).enumerate() {
        let reply = client.line(&mut h);
        assert_eq!(reply["id"], json!(n));
        assert_eq!(reply["units"].as_array().map(Vec::len), Some(UNITS));
        assert!(released.load(std::sync::atomic::Ordering::SeqCst));
    }
    let busy = client.line(&mut h);
    assert_eq!(busy["id"], json!(MAX_STREAMS_PER_CLIENT));
    assert_eq!(error_kind(&busy), "busy");
    assert_eq!(h.server.client_count(), 1);
    // With the replies done, a new one is accepted again.
    assert!(
        h.server
            .send_streamed(h.poll.registry(), id, list_reply(None, [1, 2]))
    );
    assert_eq!(client.line(&mut h), json!({"ok": true, "units": [1, 2]}));
}

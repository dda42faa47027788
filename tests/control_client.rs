//! Tests of the blocking CLI client against a real control server running its mio loop in a thread.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use exitproof::control::ControlError;
use exitproof::control::client::Client;
use exitproof::control::protocol::{Command, RequestId, Response, event_line, list_reply};
use exitproof::control::server::{ControlServer, ServerEvent, ServerOptions};
use mio::{Events, Poll, Token, Waker};
use serde_json::json;

const PATIENCE: Duration = Duration::from_secs(20);
const WAKE: Token = Token(0);

/// Units in the toy agent's streamed `list` reply.
const UNITS: usize = 100_000;

/// One unit of the streamed `list`, about 400 bytes serialized.
fn unit(n: usize) -> serde_json::Value {
    json!({"unit": format!("unit-{n:06}.service"), "n": n, "pad": "p".repeat(350)})
}

/// A toy agent: answers `list` with its client's id (or, when the request's id is `"big"`, with a
/// streamed list of [`UNITS`] units), `events` with ok plus two events, and stops when woken. Stops (and joins) on drop, so a failing test leaves no thread behind.
struct Agent {
    waker: Waker,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Agent {
    fn start() -> Agent {
        let dir = tempfile::tempdir().expect("create temporary directory");
        let path = dir.path().join("agent.sock");
        let mut server = ControlServer::bind(&path, ServerOptions::default()).expect("bind");
        let mut poll = Poll::new().expect("create poll");
        let waker = Waker::new(poll.registry(), WAKE).expect("create waker");
        server
            .register(poll.registry(), 1..1024)
            .expect("register server");
        let thread = std::thread::spawn(move || {
            let mut events = Events::with_capacity(16);
            let mut out = Vec::new();
            loop {
                if let Err(e) = poll.poll(&mut events, None) {
                    assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "poll: {e}");
                    continue;
                }
                for event in events.iter() {
                    if event.token() == WAKE {
                        return;
                    }
                    server.handle_event(poll.registry(), event, &mut out);
                }
                for event in out.drain(..) {
                    let ServerEvent::Request { client, request } = event else {
                        continue;
                    };
                    let registry = poll.registry();
                    match request.command {
                        Command::List if request.id == Some(RequestId::Text("big".to_owned())) => {
                            let reply = list_reply(request.id, (0..UNITS).map(unit));
                            server.send_streamed(registry, client, reply);
                        }
                        Command::Events => {
                            server.send(registry, client, &Response::ok(request.id, ()).to_line());
                            for n in 0..2 {
                                let line = event_line(&json!({"n": n})).expect("event");
                                server.send(registry, client, &line);
                            }
                        }
                        command => {
                            let payload =
                                json!({"client": client.to_string(), "cmd": command.name()});
                            server.send(
                                registry,
                                client,
                                &Response::ok(request.id, payload).to_line(),
                            );
                        }
                    }
                }
            }
        });
        Agent {
            waker,
            thread: Some(thread),
            path,
            _dir: dir,
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.waker.wake().is_ok()
            && let Some(thread) = self.thread.take()
        {
            let _ = thread.join();
        }
    }
}

fn connect(path: &Path) -> Client {
    let mut client = Client::connect(path).expect("connect to agent");
    client
        .set_read_timeout(Some(PATIENCE))
        .expect("set read timeout");
    client
}

#[test]
fn request_gets_its_response() {
    let agent = Agent::start();
    let mut client = connect(&agent.path);
    let response = client
        .request(&json!({"id": 5, "cmd": "list"}))
        .expect("list");
    assert_eq!(response["id"], json!(5));
    assert_eq!(response["ok"], json!(true));
    assert_eq!(response["cmd"], json!("list"));
    let response = client
        .request(&json!({"id": "bad", "cmd": "frob"}))
        .expect("server-side error");
    assert_eq!(response["error"]["kind"], json!("unknown-command"));
    assert_eq!(response["id"], json!("bad"));
}

#[test]
fn event_stream_is_read_line_by_line() {
    let agent = Agent::start();
    let mut client = connect(&agent.path);
    let response = client
        .request(&json!({"cmd": "events"}))
        .expect("subscribe");
    assert_eq!(response, json!({"ok": true}));
    for n in 0..2 {
        assert_eq!(
            client.next_line().expect("event"),
            Some(json!({"event": {"n": n}}))
        );
    }
    client
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("set short timeout");
    let err = client.next_line().expect_err("no more events");
    assert!(matches!(err, ControlError::TimedOut { .. }), "{err:?}");
}

#[test]
fn agent_going_away_ends_the_stream() {
    let agent = Agent::start();
    let mut client = connect(&agent.path);
    client
        .request(&json!({"cmd": "events"}))
        .expect("subscribe");
    client.next_line().expect("event 0");
    client.next_line().expect("event 1");
    let path = agent.path.clone();
    drop(agent);
    assert_eq!(client.next_line().expect("clean end"), None);
    let err = client.request(&json!({"cmd": "list"})).expect_err("gone");
    assert!(
        matches!(
            err,
            ControlError::Disconnected { .. } | ControlError::Io { .. }
        ),
        "{err:?}"
    );
    let err = Client::connect(&path).expect_err("socket removed");
    assert!(matches!(err, ControlError::NoAgent { .. }), "{err:?}");
}

#[test]
fn missing_socket_says_no_agent() {
    let dir = tempfile::tempdir().expect("create temporary directory");
    let path = dir.path().join("nothing.sock");
    let err = Client::connect(&path).expect_err("no socket");
    assert_eq!(
        err.to_string(),
        format!(
            "no agent listening on {} (is `exitproof agent` running?)",
            path.display()
        )
    );
    // A stale socket file (nobody listening) is reported the same way.
    drop(std::os::unix::net::UnixListener::bind(&path).expect("bind stale"));
    let err = Client::connect(&path).expect_err("stale socket");
    assert!(matches!(err, ControlError::NoAgent { .. }), "{err:?}");
}

#[test]
fn a_list_of_100000_units_is_read_as_one_line() {
    let agent = Agent::start();
    let mut client = connect(&agent.path);
    let started = std::time::Instant::now();
    let response = client
        .request(&json!({"id": "big", "cmd": "list"}))
        .expect("list");
    let elapsed = started.elapsed();
    let units = response["units"].as_array().expect("units array");
    eprintln!("read a list of {} units in {elapsed:?}", units.len());
    assert_eq!(response["id"], json!("big"));
    assert_eq!(units.len(), UNITS);
    for (n, listed) in units.iter().enumerate() {
        assert_eq!(listed, &unit(n), "unit {n}");
    }
    // The connection goes on: the next response is whole.
    let response = client
        .request(&json!({"id": 2, "cmd": "list"}))
        .expect("small list");
    assert_eq!(response["id"], json!(2));
}

#[test]
fn a_line_over_the_limit_fails_without_being_buffered() {
    let agent = Agent::start();
    let mut client = connect(&agent.path);
    client.set_max_line(1024 * 1024);
    let err = client
        .request(&json!({"id": "big", "cmd": "list"}))
        .expect_err("too long");
    assert!(
        matches!(err, ControlError::LineTooLong { limit, .. } if limit == 1024 * 1024),
        "{err:?}"
    );
    // The rest of that line is never read, so the connection stays unusable.
    let err = client.next_line().expect_err("still out of step");
    assert!(matches!(err, ControlError::LineTooLong { .. }), "{err:?}");
}

//! Test support shared by the bus tests: a private dbus-daemon, an agent-style loop around the
//! mio runtime, and the bus round trips the tests make.
//!
//! It must never leave a daemon or a directory behind, whatever the test does: both are released
//! by `Drop` guards.

#![allow(clippy::disallowed_methods, reason = "tests may read the clock")]

use std::{
    future::Future,
    io::{self, BufRead, BufReader, Read, Write},
    pin::Pin,
    process::{Child, Command, Stdio},
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

use exitproof::systemd::runtime::{MioRuntime, RuntimeHandle, Task};
use futures_util::StreamExt;
use mio::{Events, Interest, Token, net::UnixStream};
use zbus::{Connection, MatchRule, MessageStream, connection::Builder, message::Type};

/// How long a test waits for the bus or the kernel before it gives up.
pub const PATIENCE: Duration = Duration::from_secs(20);
/// The runtime's waker token.
const WAKER: Token = Token(0);
/// A source of the agent's own, outside the runtime's tokens.
const AGENT_SOURCE: Token = Token(1);
/// The tokens the runtime registers its sources under.
const RUNTIME_SOURCES: std::ops::Range<usize> = 1000..1100;

/// The bus name, object path and interface of the bus daemon itself.
const BUS: &str = "org.freedesktop.DBus";
const BUS_PATH: &str = "/org/freedesktop/DBus";
/// The object path and interface of the test's own signal.
const TEST_PATH: &str = "/org/exitproof/Test";
const TEST_INTERFACE: &str = "org.exitproof.Test";

/// A dbus-daemon of the test's own, listening in a temporary directory; killed and removed on
/// drop.
pub struct PrivateBus {
    daemon: Child,
    address: String,
    // Dropped after the daemon is killed, by field order.
    _directory: tempfile::TempDir,
}

impl PrivateBus {
    /// Starts the daemon and waits until it prints the address it listens on.
    pub fn start() -> Self {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let listen = format!("unix:path={}", directory.path().join("bus").display());
        let daemon = Command::new("dbus-daemon")
            .args(["--session", "--nofork", "--print-address=1"])
            .arg(format!("--address={listen}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("dbus-daemon starts (is it installed?)");
        let mut bus = Self {
            daemon,
            address: String::new(),
            _directory: directory,
        };

        // The daemon prints its address once it listens; a daemon that dies first closes its
        // output and leaves the line empty.
        let output = bus.daemon.stdout.take().expect("stdout was piped");
        BufReader::new(output)
            .read_line(&mut bus.address)
            .expect("the daemon's address");
        bus.address.truncate(bus.address.trim_end().len());
        assert!(
            !bus.address.is_empty(),
            "dbus-daemon exited without an address"
        );

        bus
    }

    /// The address the daemon listens on.
    pub fn address(&self) -> &str {
        &self.address
    }
}

impl Drop for PrivateBus {
    fn drop(&mut self) {
        // By pid: the child handle names exactly the daemon this test started.
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

/// What the agent's loop holds: the poll, the runtime on it, and a source of the agent's own.
pub struct Agent {
    pub poll: mio::Poll,
    pub runtime: MioRuntime,
    own_source: UnixStream,
    own_peer: UnixStream,
    /// How many events for the agent's own source the loop handled.
    pub own_events: usize,
}

impl Agent {
    /// A poll with the runtime and the agent's own source registered on it.
    pub fn new() -> Self {
        let poll = mio::Poll::new().expect("a poll");
        let runtime =
            MioRuntime::new(poll.registry(), WAKER, RUNTIME_SOURCES).expect("a mio runtime");
        let (mut own_source, own_peer) = UnixStream::pair().expect("a socket pair");
        poll.registry()
            .register(&mut own_source, AGENT_SOURCE, Interest::READABLE)
            .expect("the agent's own source registers");

        Self {
            poll,
            runtime,
            own_source,
            own_peer,
            own_events: 0,
        }
    }

    /// Makes the agent's own source readable, as the agent's other event sources would be.
    pub fn poke(&mut self) {
        self.own_peer.write_all(b"x").expect("a poke");
    }

    /// Runs the agent's loop (poll, dispatch by token, turn) until `task` ends, and returns
    /// what it produced.
    pub fn run_until_finished<T>(&mut self, mut task: Task<T>) -> T {
        let give_up = Instant::now() + PATIENCE;
        let mut events = Events::with_capacity(64);
        while !task.is_finished() {
            let now = Instant::now();
            assert!(now < give_up, "the task did not finish in {PATIENCE:?}");
            let timeout = self
                .runtime
                .timeout()
                .map_or(give_up - now, |t| t.min(give_up - now));
            self.poll
                .poll(&mut events, Some(timeout))
                .expect("the poll waits");
            for event in events.iter() {
                if self.runtime.owns(event.token()) {
                    self.runtime.handle_event(event);
                } else {
                    assert_eq!(event.token(), AGENT_SOURCE, "an unknown token");
                    self.drain_own_source();
                }
            }
            self.runtime.turn();
        }

        match Pin::new(&mut task).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Ok(output)) => output,
            Poll::Ready(Err(e)) => panic!("the runtime lost the task: {e}"),
            Poll::Pending => panic!("a finished task was pending"),
        }
    }

    /// Reads the agent's own source until it would block, as edge-triggered readiness requires.
    fn drain_own_source(&mut self) {
        self.own_events += 1;
        let mut buffer = [0u8; 64];
        loop {
            match self.own_source.read(&mut buffer) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => panic!("the agent's own source failed: {e}"),
            }
        }
    }
}

/// A bus connection on `handle`, with `method_timeout`.
pub async fn connect(
    handle: RuntimeHandle,
    address: &str,
    method_timeout: Duration,
) -> zbus::Result<Connection> {
    Builder::address(address)
        .runtime(handle)
        .method_timeout(method_timeout)
        .build()
        .await
}

/// The bus's id (`GetId`) and the names on it (`ListNames`).
pub async fn bus_id_and_names(connection: &Connection) -> zbus::Result<(String, Vec<String>)> {
    let id: String = connection
        .call_method(Some(BUS), BUS_PATH, Some(BUS), "GetId", &())
        .await?
        .body()
        .deserialize()?;
    let names: Vec<String> = connection
        .call_method(Some(BUS), BUS_PATH, Some(BUS), "ListNames", &())
        .await?
        .body()
        .deserialize()?;

    Ok((id, names))
}

/// Subscribes `listener` to the test signal, has `emitter` emit it with `text`, and returns the
/// text `listener` received.
pub async fn signal_round_trip(
    listener: Connection,
    emitter: Connection,
    text: &str,
) -> zbus::Result<String> {
    let rule = MatchRule::builder()
        .msg_type(Type::Signal)
        .interface(TEST_INTERFACE)
        .member("Ping")
        .build()?;
    // The stream has its match rule on the bus once this returns, before the signal is sent.
    let mut stream = MessageStream::for_match_rule(rule, &listener, None).await?;
    emitter
        .emit_signal(None::<()>, TEST_PATH, TEST_INTERFACE, "Ping", &(text,))
        .await?;
    let message = stream
        .next()
        .await
        .ok_or(zbus::Error::Failure("the signal stream ended".into()))??;

    message.body().deserialize()
}

//! An impostor on a sandbox's session bus: a client that takes `org.freedesktop.systemd1` from
//! the user manager (`RequestName` with REPLACE_EXISTING, which systemd's ALLOW_REPLACEMENT
//! lets any client of the bus do) and answers for systemd with lies about one unit.
//!
//! It runs on a thread of the test process, on the crate's own mio runtime, and says the unit
//! is `inactive (dead)` with its real InvocationID and a ControlGroup that does not exist, in
//! answers (`GetUnit`, `Get`, `GetAll`, `Subscribe`) and in a `PropertiesChanged` it sends
//! every 200 ms. Drop (or [`Impostor::leave`]) releases the name and closes the connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use exitproof::systemd::runtime::{MioRuntime, RuntimeHandle};
use futures_util::StreamExt;
use mio::{Events, Token};
use zbus::message::Type;
use zbus::{Connection, Message, MessageStream};
use zbus::{ObjectPath, OwnedVariant, Variant};

use super::Sandbox;

const SYSTEMD: &str = "org.freedesktop.systemd1";
/// RequestName's DBUS_NAME_FLAG_REPLACE_EXISTING.
const REPLACE_EXISTING: u32 = 0x2;
const WAKER: Token = Token(0);
const RUNTIME_TOKENS: std::ops::Range<usize> = 16..1024;
/// How long taking the name may take on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(30);
/// How often the lie is signalled.
const LIE_EVERY: Duration = Duration::from_millis(200);

/// A running impostor; it leaves the bus on drop.
pub struct Impostor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The impostor's unique name on the bus.
    unique_name: String,
}

impl Impostor {
    /// Takes systemd's name on `sandbox`'s bus and lies about `unit`, whose real invocation is
    /// `invocation` (hex, as `systemctl show -p InvocationID` prints it). Returns once the name
    /// is the impostor's; panics if it cannot take it.
    pub fn start(sandbox: &Sandbox, unit: &str, invocation: &str) -> Impostor {
        let address = format!(
            "unix:path={}",
            sandbox.host_path("/run/user/0/bus").display()
        );
        let lies = Lies::new(unit, invocation);
        let stop = Arc::new(AtomicBool::new(false));
        let (owned_tx, owned_rx) = std::sync::mpsc::channel();
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || run(&address, lies, &stop, &owned_tx))
        };
        let unique_name = match owned_rx.recv_timeout(PATIENCE) {
            Ok(Ok(name)) => name,
            Ok(Err(e)) => panic!("the impostor could not take {SYSTEMD}: {e}"),
            Err(e) => panic!("the impostor did not take {SYSTEMD} in {PATIENCE:?}: {e}"),
        };
        Impostor {
            stop,
            thread: Some(thread),
            unique_name,
        }
    }

    /// The impostor's unique bus name.
    pub fn unique_name(&self) -> &str {
        &self.unique_name
    }

    /// Releases the name and leaves the bus; returns once it has.
    pub fn leave(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Impostor {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// The impostor's thread: a mio loop running the runtime until `stop`.
fn run(
    address: &str,
    lies: Lies,
    stop: &AtomicBool,
    owned: &std::sync::mpsc::Sender<Result<String, String>>,
) {
    let mut poll = mio::Poll::new().expect("a poll");
    let runtime = MioRuntime::new(poll.registry(), WAKER, RUNTIME_TOKENS).expect("a runtime");
    let taken = runtime.block_on(&mut poll, take_name(runtime.handle(), address));
    let conn = match taken {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            let _ = owned.send(Err(e.to_string()));
            return;
        }
        Err(e) => {
            let _ = owned.send(Err(e.to_string()));
            return;
        }
    };
    let unique = conn
        .unique_name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    let lies = Arc::new(lies);
    zbus::runtime::traits::TaskHandle::detach(
        runtime.spawn(answer_calls(conn.clone(), lies.clone())),
    );
    let _ = owned.send(Ok(unique));
    let mut events = Events::with_capacity(64);
    let mut next_lie = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() >= next_lie {
            next_lie = Instant::now() + LIE_EVERY;
            zbus::runtime::traits::TaskHandle::detach(
                runtime.spawn(signal_lie(conn.clone(), lies.clone())),
            );
        }
        let wait = runtime.timeout().map_or(LIE_EVERY, |t| t.min(LIE_EVERY));
        poll.poll(&mut events, Some(wait)).expect("the poll waits");
        for event in events.iter() {
            if runtime.owns(event.token()) {
                runtime.handle_event(event);
            }
        }
        runtime.turn();
    }
    let _ = runtime.block_on(&mut poll, async move {
        let _ = conn.release_name(SYSTEMD).await;
        let _ = conn.close().await;
    });
}

/// Connects and takes systemd's name from whoever owns it.
async fn take_name(handle: RuntimeHandle, address: &str) -> zbus::Result<Connection> {
    let conn = zbus::connection::Builder::address(address)
        .runtime(handle)
        .method_timeout(PATIENCE)
        .build()
        .await?;
    let reply = conn
        .call_method(
            Some("org.freedesktop.DBus"),
            "/org/freedesktop/DBus",
            Some("org.freedesktop.DBus"),
            "RequestName",
            &(SYSTEMD, REPLACE_EXISTING),
        )
        .await?;
    let answer: u32 = reply.body().deserialize()?;
    // DBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER
    if answer != 1 {
        return Err(zbus::Error::Failure(format!(
            "RequestName answered {answer}, not primary owner"
        )));
    }
    Ok(conn)
}

/// What the impostor says of its unit.
struct Lies {
    unit: String,
    path: String,
    invocation: Vec<u8>,
}

impl Lies {
    fn new(unit: &str, invocation: &str) -> Lies {
        let invocation = (0..invocation.len() / 2)
            .map(|i| u8::from_str_radix(&invocation[2 * i..2 * i + 2], 16).expect("hex"))
            .collect();
        Lies {
            unit: unit.to_owned(),
            path: format!("/org/freedesktop/systemd1/unit/{}", escape(unit)),
            invocation,
        }
    }

    /// Every property the agent reads, each a lie but InvocationID.
    fn properties(&self) -> HashMap<&'static str, OwnedVariant> {
        let value = |v: Variant<'_>| OwnedVariant::try_from(v).expect("an owned value");
        HashMap::from([
            ("Id", value(Variant::from(self.unit.as_str()))),
            ("ActiveState", value(Variant::from("inactive"))),
            ("SubState", value(Variant::from("dead"))),
            ("InactiveExitTimestampMonotonic", value(Variant::from(1u64))),
            (
                "InvocationID",
                value(Variant::from(self.invocation.clone())),
            ),
            (
                "ControlGroup",
                value(Variant::from("/exitproof-impostor/nowhere.service")),
            ),
            ("Result", value(Variant::from("success"))),
            ("ExecMainCode", value(Variant::from(1i32))),
            ("ExecMainStatus", value(Variant::from(0i32))),
            ("MainPID", value(Variant::from(0u32))),
            ("ControlPID", value(Variant::from(0u32))),
        ])
    }
}

/// systemd's object path escaping of a unit name (`bus_label_escape`).
fn escape(unit: &str) -> String {
    unit.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                char::from(b).to_string()
            } else {
                format!("_{b:02x}")
            }
        })
        .collect()
}

/// Answers every method call with a lie, or an error for what it does not know.
async fn answer_calls(conn: Connection, lies: Arc<Lies>) {
    let mut stream = MessageStream::from(&conn);
    while let Some(Ok(call)) = stream.next().await {
        if call.message_type() != Type::MethodCall {
            continue;
        }
        let header = call.header();
        let member = header.member().map(|m| m.to_string()).unwrap_or_default();
        let reply = match member.as_str() {
            "Subscribe" => Message::method_return(&header).build(&()),
            "GetUnit" => {
                let path = ObjectPath::try_from(lies.path.as_str()).expect("an object path");
                Message::method_return(&header).build(&(path,))
            }
            "Get" => {
                let (_, name): (String, String) = call.body().deserialize().unwrap_or_default();
                match lies.properties().remove(name.as_str()) {
                    Some(value) => Message::method_return(&header).build(&(value,)),
                    None => Message::error(&header, "org.freedesktop.DBus.Error.UnknownProperty")
                        .build(&(format!("no {name}"),)),
                }
            }
            "GetAll" => Message::method_return(&header).build(&(lies.properties(),)),
            _ => Message::error(&header, "org.freedesktop.DBus.Error.UnknownMethod")
                .build(&(format!("no {member}"),)),
        };
        if let Ok(reply) = reply {
            let _ = conn.send(&reply).await;
        }
    }
}

/// Says the unit went inactive, on the Unit and the Service interface.
async fn signal_lie(conn: Connection, lies: Arc<Lies>) {
    for interface in [
        "org.freedesktop.systemd1.Unit",
        "org.freedesktop.systemd1.Service",
    ] {
        let changed = lies.properties();
        let invalidated: Vec<&str> = Vec::new();
        let _ = conn
            .emit_signal(
                None::<&str>,
                lies.path.as_str(),
                "org.freedesktop.DBus.Properties",
                "PropertiesChanged",
                &(interface, changed, invalidated),
            )
            .await;
    }
}

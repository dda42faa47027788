//! The systemd side: decoding its signals and calling its manager over D-Bus, on the caller's
//! own mio loop.
mod body;
pub(crate) mod manager;
pub(crate) mod owner;
pub(crate) mod read;
pub mod runtime;
pub(crate) mod signal;
pub(crate) mod snapshot;
pub(crate) mod start;

use std::fmt;
use std::time::Duration;

use zbus::Connection;

use manager::{ManagerError, Subscribed, Subscription};
use owner::Expected;
use runtime::MioRuntime;

/// Which bus systemd is reached on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bus {
    /// The system bus and the system manager.
    System,
    /// The session bus and the user's manager (`--user`).
    User,
}

impl fmt::Display for Bus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Bus::System => "system bus",
            Bus::User => "session bus",
        })
    }
}

/// Why systemd could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The runtime could not run the connection.
    #[error("run the bus connection: {0}")]
    Runtime(std::io::Error),
    /// Connecting to the bus failed.
    #[error("no systemd manager reachable on the {0}: {1}")]
    Bus(Bus, zbus::Error),
    /// The owner of systemd's name is not systemd, where nothing else would do.
    #[error("{0}")]
    NotSystemd(owner::NotSystemd),
    /// Subscribing to systemd's signals failed.
    #[error("{0}")]
    Subscribe(ManagerError),
}

/// Connects to `bus` on `runtime` (driving `poll` until done) and subscribes to systemd's
/// signals if the owner of its name is systemd (see [`connect_async`]). Call it before
/// registering anything else on `poll`: `block_on` drops events of sources it does not own.
pub fn connect(
    runtime: &MioRuntime,
    poll: &mut mio::Poll,
    bus: Bus,
    method_timeout: Duration,
    manager: Option<u32>,
) -> Result<(Connection, Subscribed), ConnectError> {
    runtime
        .block_on(
            poll,
            connect_async(runtime.handle(), bus, method_timeout, manager),
        )
        .map_err(ConnectError::Runtime)?
}

/// Connects to `bus` and subscribes to systemd's signals, as a future on `handle`'s runtime
/// (for reconnecting from inside a running loop), if the owner of systemd's name is the
/// manager (`owner::judge`): on the system bus PID 1, on a user bus `manager` (the pid
/// verified before) or, if `None`, a manager found by its process.
pub async fn connect_async(
    handle: runtime::RuntimeHandle,
    bus: Bus,
    method_timeout: Duration,
    manager: Option<u32>,
) -> Result<(Connection, Subscribed), ConnectError> {
    let expected = match bus {
        Bus::System => Expected::System,
        Bus::User => Expected::User {
            uid: nix::unistd::geteuid().as_raw(),
            manager,
        },
    };
    let builder = match bus {
        Bus::System => zbus::connection::Builder::system(),
        Bus::User => zbus::connection::Builder::session(),
    };
    let conn = builder
        .runtime(handle)
        .method_timeout(method_timeout)
        .build()
        .await
        .map_err(|e| ConnectError::Bus(bus, e))?;
    log::debug!("connected to the {bus}; subscribing");
    let subscribed = manager::subscribe(&conn, expected)
        .await
        .map_err(ConnectError::Subscribe)?;
    Ok((conn, subscribed))
}

impl Subscribed {
    /// The subscription to systemd; an owner of its name that is not systemd is an error, for
    /// those that can do nothing but stop.
    pub fn into_systemd(self) -> Result<Subscription, ConnectError> {
        match self {
            Subscribed::Systemd(subscription) => Ok(*subscription),
            Subscribed::NotSystemd(impostor) => Err(ConnectError::NotSystemd(impostor.who)),
        }
    }
}

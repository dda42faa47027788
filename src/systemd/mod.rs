//! The systemd side: decoding its signals and calling its manager over D-Bus, on the caller's
//! own mio loop.
mod body;
pub(crate) mod manager;
pub(crate) mod read;
pub mod runtime;
pub(crate) mod signal;
pub(crate) mod snapshot;

use std::fmt;
use std::time::Duration;

use zbus::Connection;

use manager::{ManagerError, Subscription};
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
    /// Subscribing to systemd's signals failed.
    #[error("{0}")]
    Subscribe(ManagerError),
}

/// Connects to `bus` on `runtime` (driving `poll` until done) and subscribes to systemd's
/// signals. Call it before registering anything else on `poll`: `block_on` drops events of
/// sources it does not own.
pub fn connect(
    runtime: &MioRuntime,
    poll: &mut mio::Poll,
    bus: Bus,
    method_timeout: Duration,
) -> Result<(Connection, Subscription), ConnectError> {
    runtime
        .block_on(poll, connect_async(runtime.handle(), bus, method_timeout))
        .map_err(ConnectError::Runtime)?
}

/// Connects to `bus` and subscribes to systemd's signals, as a future on `handle`'s runtime
/// (for reconnecting from inside a running loop).
pub async fn connect_async(
    handle: runtime::RuntimeHandle,
    bus: Bus,
    method_timeout: Duration,
) -> Result<(Connection, Subscription), ConnectError> {
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
    let subscription = manager::subscribe(&conn)
        .await
        .map_err(ConnectError::Subscribe)?;
    Ok((conn, subscription))
}

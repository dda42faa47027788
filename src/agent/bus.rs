//! The agent's bus connection over its life: forwarding signals, losing the connection and
//! reconnecting with backoff.
//!
//! A lost connection (dbus-daemon restarted) or a new owner of `org.freedesktop.systemd1`
//! (systemd re-executed) is [`Input::BusLost`] to the core, which then holds every unit's
//! state unknown until it has been read again on the new connection ([`Input::BusUp`]).

use std::pin::Pin;
use std::time::{Duration, Instant};

use zbus::export::futures_core::Stream;
use zbus::runtime::traits::TaskHandle;
use zbus::{Connection, Message, MessageStream};

use super::cgroup_view::{self, ViewError};
use super::core::Input;
use super::{Agent, Completion, Completions, push};
use crate::clock;
use crate::systemd::ConnectError;
use crate::systemd::manager::Subscription;

/// Why a reconnect attempt was not taken into use.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReconnectError {
    #[error("{0}")]
    Connect(ConnectError),
    /// Connected, but the cgroup2 mount no longer shows systemd's view: no unit is read (and
    /// nothing proven) until it does.
    #[error("{0}")]
    View(ViewError),
}

/// The first wait before reconnecting, doubled up to [`RECONNECT_MAX`].
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

impl Agent {
    /// Takes a fresh connection into use: forward its signals, then read every unit again.
    pub(super) fn on_connected(&mut self, conn: Connection, subscription: Subscription) {
        self.bus_epoch += 1;
        let epoch = self.bus_epoch;
        for stream in [subscription.units, subscription.manager] {
            forward(
                &self.runtime,
                stream,
                self.completions.clone(),
                epoch,
                move |message| Completion::Signal { epoch, message },
            );
        }
        forward(
            &self.runtime,
            subscription.owner,
            self.completions.clone(),
            epoch,
            move |message: Message| {
                let new_owner = message
                    .body()
                    .deserialize::<(String, String, String)>()
                    .map(|(_, _, new)| new)
                    .unwrap_or_default();
                Completion::OwnerChanged { epoch, new_owner }
            },
        );
        if epoch > 1 {
            self.counters.bus_reconnects += 1;
            log::info!("back on the bus; systemd is {}", subscription.systemd);
        }
        self.systemd = subscription.systemd;
        self.conn = Some(conn);
        self.reconnect = None;
        self.input(Input::BusUp);
    }

    /// The connection is gone, or systemd behind it is: forget every fact that came through
    /// it, and reconnect.
    pub(super) fn bus_lost(&mut self, why: &str) {
        if self.conn.take().is_none() {
            return;
        }
        self.bus_epoch += 1;
        log::error!("{why}");
        self.input(Input::BusLost);
        self.reconnect = Some((clock::now(), RECONNECT_FIRST));
    }

    /// A reconnect attempt came back.
    pub(super) fn on_reconnect(
        &mut self,
        epoch: u64,
        result: Result<Box<(Connection, Subscription)>, ReconnectError>,
    ) {
        if epoch != self.bus_epoch || self.conn.is_some() {
            return;
        }
        match result {
            Ok(connected) => {
                let (conn, subscription) = *connected;
                self.on_connected(conn, subscription)
            }
            Err(e) => {
                let backoff = self
                    .reconnect
                    .map_or(RECONNECT_FIRST, |(_, b)| (b * 2).min(RECONNECT_MAX));
                let level = match e {
                    ReconnectError::Connect(_) => log::Level::Warn,
                    ReconnectError::View(_) => log::Level::Error,
                };
                log::log!(level, "reconnect: {e}; trying again in {backoff:?}");
                self.reconnect = Some((clock::now() + backoff, backoff));
            }
        }
    }

    /// Fires the reconnect timer.
    pub(super) fn bus_timers(&mut self, now: Instant) {
        if let Some((at, backoff)) = self.reconnect
            && at <= now
        {
            // An attempt may hang (a socket-activated bus that never answers its handshake):
            // one that has not reported back within the method timeout is abandoned, its late
            // result ignored (a new epoch), and another one made. A failure re-arms sooner.
            self.reconnect = Some((now + self.config.method_timeout, backoff));
            self.bus_epoch += 1;
            let epoch = self.bus_epoch;
            log::debug!("connecting to the bus (attempt {epoch})");
            let queue = self.completions.clone();
            let connect = crate::systemd::connect_async(
                self.runtime.handle(),
                self.config.bus,
                self.config.method_timeout,
            );
            let mount = self.cgroup_root.clone();
            self.runtime
                .spawn(async move {
                    let result = async {
                        let (conn, subscription) =
                            connect.await.map_err(ReconnectError::Connect)?;
                        // systemd may have come back re-executed: its view is proven again.
                        cgroup_view::prove(&conn, &subscription.systemd, &mount)
                            .await
                            .map_err(ReconnectError::View)?;
                        Ok(Box::new((conn, subscription)))
                    };
                    let result = result.await;
                    push(&queue, Completion::Connected { epoch, result });
                })
                .detach();
        }
    }
}

/// Hands every message of `stream` to the loop, in order, as `wrap` makes it; then says the
/// stream of connection `epoch` ended.
fn forward(
    runtime: &crate::systemd::runtime::MioRuntime,
    mut stream: MessageStream,
    queue: Completions,
    epoch: u64,
    wrap: impl Fn(Message) -> Completion + Send + 'static,
) {
    runtime
        .spawn(async move {
            while let Some(next) =
                std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await
            {
                match next {
                    Ok(message) => push(&queue, wrap(message)),
                    Err(e) => log::warn!("bus: {e}"),
                }
            }
            push(&queue, Completion::SignalsEnded { epoch });
        })
        .detach();
}

//! The agent's bus connection over its life: forwarding signals, losing the connection and
//! reconnecting with backoff.
//!
//! A lost connection (dbus-daemon restarted) or a new owner of `org.freedesktop.systemd1`
//! (systemd re-executed) is [`Input::BusLost`] to the core, which then holds every unit's
//! state unknown until it has been read again on the new connection ([`Input::BusUp`]).
//!
//! Only systemd speaks for systemd: every owner of its name is verified (`systemd::owner`)
//! before anything is asked of it or heard from it. An owner that is not systemd leaves the
//! core's bus down (every watch unproven, nothing read or stopped), is said as an error, at
//! once and every minute while it lasts, and in `status` and `stats`; the next owner is
//! verified again, and systemd's return is taken up as after a re-execution.

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
use crate::systemd::manager::{Impostor, SYSTEMD, Subscribed};

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
/// How often the agent says again that systemd is not heard, while it is not.
const UNHEARD_SAID_EVERY: Duration = Duration::from_secs(60);

/// Why systemd's word is not taken now, since when, and when that is said again.
pub(super) struct Unheard {
    pub(super) why: String,
    since: Instant,
    next_said: Instant,
}

impl Agent {
    /// Takes a fresh connection into use: forward its signals, then read every unit again; or,
    /// if the owner of systemd's name is not systemd, only hear who owns it next.
    pub(super) fn on_connected(&mut self, conn: Connection, subscribed: Subscribed) {
        self.bus_epoch += 1;
        let epoch = self.bus_epoch;
        let subscription = match subscribed {
            Subscribed::Systemd(subscription) => *subscription,
            Subscribed::NotSystemd(impostor) => {
                let Impostor { who, owner } = *impostor;
                self.forward_owner_changes(owner, epoch);
                // No unique name is systemd's: no signal or reply is taken, and the core's bus
                // stays down.
                self.systemd = String::new();
                self.conn = Some(conn);
                self.reconnect = None;
                log::error!(
                    "{who}: none of its answers or signals is a fact, and no watch is \
                     proven until systemd owns {SYSTEMD} again"
                );
                self.set_unheard(who.to_string());
                return;
            }
        };
        for stream in [subscription.units, subscription.manager] {
            forward(
                &self.runtime,
                stream,
                self.completions.clone(),
                epoch,
                move |message| Completion::Signal { epoch, message },
            );
        }
        self.forward_owner_changes(subscription.owner, epoch);
        if self.manager_pid.is_some() {
            self.counters.bus_reconnects += 1;
            log::info!(
                "back on the bus; systemd is {} (pid {})",
                subscription.systemd,
                subscription.manager_pid
            );
        } else {
            log::info!(
                "systemd is {} (pid {})",
                subscription.systemd,
                subscription.manager_pid
            );
        }
        self.systemd = subscription.systemd;
        self.manager_pid = Some(subscription.manager_pid);
        self.unheard = None;
        self.conn = Some(conn);
        self.reconnect = None;
        self.input(Input::BusUp);
    }

    /// Hands each new owner of systemd's name on the connection of `epoch` to the loop.
    fn forward_owner_changes(&mut self, owner: MessageStream, epoch: u64) {
        forward(
            &self.runtime,
            owner,
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
    }

    /// systemd's name changed hands on the connection of `epoch`. After systemd, any new
    /// owner is a loss (and is verified on reconnecting); after an owner that was not systemd,
    /// a new owner is verified, and none is said.
    pub(super) fn on_owner_changed(&mut self, epoch: u64, new_owner: &str) {
        if epoch != self.bus_epoch {
            return;
        }
        if !self.systemd.is_empty() {
            if new_owner != self.systemd {
                self.bus_lost(&format!(
                    "{SYSTEMD} changed hands: systemd re-executed or restarted, or another \
                     client took its name"
                ));
            }
        } else if new_owner.is_empty() {
            // systemd asks for its name without queueing (sd-bus's DO_NOT_QUEUE): one that
            // was replaced is not given it back.
            let why = format!(
                "{SYSTEMD} has no owner since the owner that was not systemd left it; systemd \
                 asks for it again only when it starts or re-executes (daemon-reexec)"
            );
            log::error!("{why}");
            self.set_unheard(why);
        } else if self.conn.take().is_some() {
            log::info!("{SYSTEMD} changed hands to {new_owner}: checking who that is");
            self.bus_epoch += 1;
            self.reconnect = Some((clock::now(), RECONNECT_FIRST));
        }
    }

    /// The connection is gone, or systemd behind it is: forget every fact that came through
    /// it, and reconnect.
    pub(super) fn bus_lost(&mut self, why: &str) {
        if self.conn.take().is_none() {
            return;
        }
        self.bus_epoch += 1;
        log::error!("{why}");
        self.set_unheard(why.to_owned());
        self.input(Input::BusLost);
        self.reconnect = Some((clock::now(), RECONNECT_FIRST));
    }

    /// systemd is not heard, for `why`: `status` and `stats` say so, and the log every minute.
    fn set_unheard(&mut self, why: String) {
        let now = clock::now();
        self.metrics_changed(now);
        let since = self.unheard.as_ref().map_or(now, |unheard| unheard.since);
        self.unheard = Some(Unheard {
            why,
            since,
            next_said: now + UNHEARD_SAID_EVERY,
        });
    }

    /// Says again, once a minute, that systemd is not heard.
    fn say_unheard(&mut self, now: Instant) {
        if let Some(unheard) = &mut self.unheard
            && unheard.next_said <= now
        {
            log::error!(
                "{} (for {} s): every watch stays unproven until systemd is heard again",
                unheard.why,
                now.saturating_duration_since(unheard.since).as_secs()
            );
            unheard.next_said = now + UNHEARD_SAID_EVERY;
        }
    }

    /// When the bus's timers are next due: a reconnect, or saying systemd is not heard.
    pub(super) fn bus_timeout(&self) -> Option<Instant> {
        let reconnect = self.reconnect.map(|(at, _)| at);
        let unheard = self.unheard.as_ref().map(|unheard| unheard.next_said);
        reconnect.into_iter().chain(unheard).min()
    }

    /// A reconnect attempt came back.
    pub(super) fn on_reconnect(
        &mut self,
        epoch: u64,
        result: Result<Box<(Connection, Subscribed)>, ReconnectError>,
    ) {
        if epoch != self.bus_epoch || self.conn.is_some() {
            return;
        }
        match result {
            Ok(connected) => {
                let (conn, subscribed) = *connected;
                self.on_connected(conn, subscribed)
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

    /// Fires the reconnect timer, and says again that systemd is not heard.
    pub(super) fn bus_timers(&mut self, now: Instant) {
        self.say_unheard(now);
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
                self.manager_pid,
            );
            let mount = self.cgroup_root.clone();
            self.runtime
                .spawn(async move {
                    let result = async {
                        let (conn, subscribed) = connect.await.map_err(ReconnectError::Connect)?;
                        // systemd may have come back re-executed: its view is proven again
                        // (an owner that is not systemd is asked nothing).
                        if let Subscribed::Systemd(subscription) = &subscribed {
                            cgroup_view::prove(
                                &conn,
                                &subscription.systemd,
                                subscription.manager_pid,
                                &mount,
                            )
                            .await
                            .map_err(ReconnectError::View)?;
                        }
                        Ok(Box::new((conn, subscribed)))
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

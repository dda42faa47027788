//! The benchmark's independent observer: its own subscribed D-Bus connection and its own inotify,
//! on a thread of its own, timestamping when systemd says a unit is terminal (`t_signal`) and
//! when its cgroup is empty or gone (`t_cgroup`). It shares no state with the contenders.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use zbus::export::futures_core::Stream;

use super::BenchError;
use crate::agent::monotonic_ns;
use crate::cgroup::{CgroupReading, CgroupWatcher, Notice, cgroup2_mount};
use crate::systemd::Bus;
use crate::systemd::runtime::MioRuntime;
use crate::systemd::signal::{self, SystemdSignal, unit_path};

const WAKER: Token = Token(0);
const INOTIFY: Token = Token(1);
/// How often the thread looks for new units to watch; events themselves wake it at once.
const COMMAND_INTERVAL: Duration = Duration::from_millis(10);

/// What the observer saw of one unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    pub t_cgroup_ns: Option<u64>,
    pub t_signal_ns: Option<u64>,
}

#[derive(Default)]
struct Shared {
    /// Units to start watching: (unit, cgroup as systemd reports it).
    pending: Vec<(String, String)>,
    /// How many units the thread has started watching, so `arm` can wait for it.
    armed: usize,
    observed: HashMap<String, Observed>,
}

/// A running observer.
pub struct Observer {
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), BenchError>>>,
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Observer {
    /// Connects to `bus`, subscribes, and starts the observer's thread.
    pub fn start(bus: Bus) -> Result<Observer, BenchError> {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = {
            let shared = shared.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("bench observer".into())
                .spawn(move || observe(bus, &shared, &stop, ready_tx))
                .map_err(|e| BenchError::Io("start the observer thread".into(), e))?
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Observer {
                shared,
                stop,
                thread: Some(thread),
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => match thread.join() {
                Ok(Err(e)) => Err(e),
                _ => Err(BenchError::Failed(
                    "the observer thread died at start".into(),
                )),
            },
        }
    }

    /// Starts watching `units` (name, ControlGroup) and returns once the observer watches
    /// them all, so a kill that follows cannot slip past it.
    pub fn arm(&self, units: &[(String, String)]) -> Result<(), BenchError> {
        let target = {
            let mut shared = lock(&self.shared);
            for (unit, _) in units {
                shared.observed.insert(unit.clone(), Observed::default());
            }
            shared.pending.extend(units.iter().cloned());
            shared.armed + units.len()
        };
        while lock(&self.shared).armed < target {
            if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                return Err(BenchError::Failed("the observer thread stopped".into()));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// What was seen of `unit` so far.
    pub fn observed(&self, unit: &str) -> Observed {
        lock(&self.shared)
            .observed
            .get(unit)
            .copied()
            .unwrap_or_default()
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn observe(
    bus: Bus,
    shared: &Mutex<Shared>,
    stop: &AtomicBool,
    ready: std::sync::mpsc::Sender<Result<(), BenchError>>,
) -> Result<(), BenchError> {
    let setup = || -> Result<_, BenchError> {
        let mut poll = Poll::new().map_err(|e| BenchError::Io("create a poll".into(), e))?;
        let runtime = MioRuntime::new(poll.registry(), WAKER, 16..(1 << 20))
            .map_err(|e| BenchError::Io("create a runtime".into(), e))?;
        let (conn, subscription) =
            crate::systemd::connect(&runtime, &mut poll, bus, super::METHOD_TIMEOUT)
                .map_err(BenchError::Connect)?;
        let root = cgroup2_mount().map_err(|e| BenchError::Failed(e.to_string()))?;
        let cgroups =
            CgroupWatcher::<usize>::new(root).map_err(|e| BenchError::Failed(e.to_string()))?;
        poll.registry()
            .register(
                &mut SourceFd(&cgroups.as_raw_fd()),
                INOTIFY,
                Interest::READABLE,
            )
            .map_err(|e| BenchError::Io("watch inotify".into(), e))?;
        Ok((poll, runtime, conn, subscription, cgroups))
    };
    let (mut poll, runtime, _conn, subscription, mut cgroups) = match setup() {
        Ok(parts) => {
            let _ = ready.send(Ok(()));
            parts
        }
        Err(e) => {
            let _ = ready.send(Err(BenchError::Failed(e.to_string())));
            return Err(e);
        }
    };
    let signals: Arc<Mutex<Vec<(u64, zbus::Message)>>> = Arc::default();
    for mut stream in [subscription.units, subscription.manager] {
        let signals = signals.clone();
        zbus::runtime::traits::TaskHandle::detach(runtime.spawn(async move {
            while let Some(Ok(message)) =
                std::future::poll_fn(|cx| std::pin::Pin::new(&mut stream).poll_next(cx)).await
            {
                // Stamped as it comes off the socket, before anything else is done with it.
                let now = monotonic_ns();
                signals
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((now, message));
            }
        }));
    }
    let mut units: Vec<String> = Vec::new();
    let mut by_path: HashMap<String, usize> = HashMap::new();
    let mut by_name: HashMap<String, usize> = HashMap::new();
    let mut events = Events::with_capacity(1024);
    let mut notices = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let timeout = runtime
            .timeout()
            .map_or(COMMAND_INTERVAL, |t| t.min(COMMAND_INTERVAL));
        if let Err(e) = poll.poll(&mut events, Some(timeout))
            && e.kind() != std::io::ErrorKind::Interrupted
        {
            return Err(BenchError::Io("wait for events".into(), e));
        }
        let now = monotonic_ns();
        let mut cgroups_ready = false;
        for event in events.iter() {
            if runtime.owns(event.token()) {
                runtime.handle_event(event);
            } else if event.token() == INOTIFY {
                cgroups_ready = true;
            }
        }
        if cgroups_ready {
            notices.clear();
            let _ = cgroups.drain(&mut notices);
            for notice in &notices {
                let keys: Vec<usize> = match notice {
                    Notice::Changed(key) | Notice::Lost(key) => vec![*key],
                    Notice::Overflow => (0..units.len()).collect(),
                };
                for key in keys {
                    if matches!(
                        cgroups.read(key),
                        CgroupReading::Empty | CgroupReading::Gone
                    ) {
                        record(shared, &units[key], now, |o| &mut o.t_cgroup_ns);
                    }
                }
            }
        }
        runtime.turn();
        let arrived = std::mem::take(&mut *signals.lock().unwrap_or_else(PoisonError::into_inner));
        for (at, message) in arrived {
            let terminal_unit = match signal::decode(&message) {
                Ok(Some(SystemdSignal::UnitChanged { path, change })) => change
                    .active_state
                    .filter(|s| s == "inactive" || s == "failed")
                    .and_then(|_| by_path.get(&path).copied()),
                Ok(Some(SystemdSignal::UnitRemoved { unit })) => by_name.get(&unit).copied(),
                _ => None,
            };
            if let Some(key) = terminal_unit {
                record(shared, &units[key], at, |o| &mut o.t_signal_ns);
            }
        }
        let pending = std::mem::take(&mut lock(shared).pending);
        for (unit, cgroup) in pending {
            let key = units.len();
            by_path.insert(unit_path(&unit), key);
            by_name.insert(unit.clone(), key);
            units.push(unit.clone());
            // The watch comes before the read, so nothing between the two is missed.
            if let Err(e) = cgroups.watch(key, &cgroup) {
                return Err(BenchError::Failed(format!("observer: {e}")));
            }
            if matches!(
                cgroups.read(key),
                CgroupReading::Empty | CgroupReading::Gone
            ) {
                record(shared, &unit, monotonic_ns(), |o| &mut o.t_cgroup_ns);
            }
            lock(shared).armed += 1;
        }
    }
    Ok(())
}

/// Keeps the first time of what `field` picks for `unit`.
fn record(
    shared: &Mutex<Shared>,
    unit: &str,
    at: u64,
    field: impl FnOnce(&mut Observed) -> &mut Option<u64>,
) {
    if let Some(observed) = lock(shared).observed.get_mut(unit) {
        field(observed).get_or_insert(at);
    }
}

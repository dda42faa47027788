//! A zbus runtime that runs every task, timer and socket of a connection on the agent's own
//! `mio::Poll`, on the one thread that drives that poll.
//!
//! [`MioRuntime`] is owned by the agent's event loop, and [`RuntimeHandle`] is what a zbus
//! connection is given (`connection::Builder::runtime`). The loop asks [`MioRuntime::timeout`] how
//! long it may sleep, hands every event whose token [`MioRuntime::owns`] to
//! [`MioRuntime::handle_event`], and calls [`MioRuntime::turn`] after each wait. Readiness comes
//! from the poll, tasks from `async-task`, timers from a map of deadlines the runtime walks itself.
//!
//! It must never start a thread, never block the thread that drives it, and never touch a token
//! outside the waker token and the source range it was given. zbus's default
//! `spawn_blocking` is kept, so the few operations zbus has no async form of (a TCP host-name
//! lookup, a `nonce-tcp:` file read, peer-credential group lookups) would run on zruntime's
//! blocking pool, which starts threads. A client connection over a unix socket makes none of
//! them, as long as nobody calls `Connection::peer_creds` (its group lookup is one).
//!
//! Ported from the single-thread polling runtime in zbus 6.2.1's integration tests
//! (`tests/polling_runtime/runtime`, MIT licensed), with `mio` in place of `polling`.

use std::{
    collections::VecDeque,
    future::Future,
    io,
    net::SocketAddr,
    ops::Range,
    path::Path,
    pin::{Pin, pin},
    process::{Command, ExitStatus, Stdio},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, Wake, Waker},
    time::Duration,
};

use crate::clock;
use async_task::Runnable;
use mio::{Events, Registry, Token};
use zbus::runtime::{IoSource, traits};

mod connect;
mod error;
pub use error::RuntimeError;
mod io_source;
pub use io_source::RegisteredIoSource;
use io_source::Sources;
mod task;
use task::Detached;
pub use task::Task;
mod timer;
pub use timer::Sleep;
use timer::Timers;

/// How many events [`MioRuntime::block_on`] takes from the poll in one wait.
const BLOCK_ON_EVENTS: usize = 64;

/// A runtime on the agent's `mio::Poll`: a queue of runnables, a map of timers and the sources it
/// registered, all driven by the loop that owns it.
///
/// Dropping it cancels every task it still holds, whether the task waits in the queue as a
/// runnable, is parked in the timer or source maps as a waker, or was detached into its keeping.
pub struct MioRuntime(Arc<Inner>);

impl MioRuntime {
    /// A runtime that registers its sources on `registry` under tokens from `source_tokens`, and
    /// owns the poll's one `mio::Waker`, under `waker_token`.
    ///
    /// `registry` must belong to the poll the loop waits on, and the loop must not create another
    /// `mio::Waker` on it: mio allows only one per poll.
    pub fn new(
        registry: &Registry,
        waker_token: Token,
        source_tokens: Range<usize>,
    ) -> io::Result<Self> {
        if source_tokens.contains(&waker_token.0) {
            return Err(RuntimeError::WakerTokenInSourceRange {
                waker: waker_token,
                sources: source_tokens,
            }
            .into());
        }
        let inner = Inner {
            registry: registry.try_clone()?,
            waker: mio::Waker::new(registry, waker_token)?,
            waker_token,
            closed: AtomicBool::new(false),
            queue: Mutex::default(),
            detached: Mutex::default(),
            timers: Mutex::default(),
            sources: Mutex::new(Sources::new(source_tokens)),
        };

        Ok(Self(Arc::new(inner)))
    }

    /// The runtime to hand to `zbus::connection::Builder::runtime`.
    pub fn handle(&self) -> RuntimeHandle {
        RuntimeHandle(self.0.clone())
    }

    /// Whether `token` is this runtime's: its waker token or one of its source tokens.
    pub fn owns(&self, token: Token) -> bool {
        token == self.0.waker_token || lock(&self.0.sources).owns(token)
    }

    /// Wakes whoever waits on the source `event` reports, so that it runs in the next
    /// [`MioRuntime::turn`].
    ///
    /// An event for the waker token only had to interrupt the wait, and needs nothing more.
    pub fn handle_event(&self, event: &mio::event::Event) {
        if event.token() != self.0.waker_token {
            self.0.wake_source(event.token());
        }
    }

    /// Runs everything that is ready: queued runnables until the queue is empty, then due timers
    /// and what they woke, and releases detached tasks that have finished.
    pub fn turn(&self) {
        let inner = &self.0;
        loop {
            loop {
                // The runnable is taken before it runs: running it may queue another one.
                let next = lock(&inner.queue).runnables.pop_front();
                match next {
                    Some(runnable) => {
                        runnable.run();
                    }
                    None => break,
                }
            }
            inner.wake_due_timers();
            if lock(&inner.queue).runnables.is_empty() {
                break;
            }
        }

        // A detached task is the runtime's to hold until it ends, and only the runtime notices
        // that it has. The finished ones are dropped after the lock is let go: what a task
        // produced may, in its destructor, spawn and detach a task of its own.
        let finished = {
            let mut detached = lock(&inner.detached);
            let (finished, running): (Vec<_>, Vec<_>) = std::mem::take(&mut *detached)
                .into_iter()
                .partition(|task| task.is_finished());
            *detached = running;

            finished
        };
        drop(finished);
    }

    /// How long the loop may wait in the poll: not at all while runnables are queued, otherwise
    /// until the earliest timer, or without limit when there is no timer.
    ///
    /// Ask it right before each wait, after everything that may spawn or wake a task: the
    /// thread that asks is taken to be the one that waits, and a runnable queued on that thread
    /// does not interrupt the poll (it cannot be waiting in it; the next `timeout` sees the
    /// runnable). Only one queued from another thread does.
    pub fn timeout(&self) -> Option<Duration> {
        {
            let mut queue = lock(&self.0.queue);
            queue.driver = Some(std::thread::current().id());
            if !queue.runnables.is_empty() {
                return Some(Duration::ZERO);
            }
        }

        let timers = lock(&self.0.timers);
        let (deadline, _) = timers.pending.keys().next()?;

        Some(deadline.saturating_duration_since(clock::now()))
    }

    /// Runs `future` in the background on this runtime; dropping the handle cancels it.
    pub fn spawn<T: Send + 'static>(
        &self,
        future: impl Future<Output = T> + Send + 'static,
    ) -> Task<T> {
        self.0.spawn(future)
    }

    /// Drives this runtime alone on `poll` until `future` completes, and returns its output.
    ///
    /// Events for tokens this runtime does not own are dropped, so use it only while nothing
    /// else is registered on `poll`: in a command-line tool, at startup, or in tests. `poll` must
    /// be the one whose registry the runtime was created with. An error is one of the poll's own.
    pub fn block_on<F: Future>(&self, poll: &mut mio::Poll, future: F) -> io::Result<F::Output> {
        let waker = Waker::from(Arc::new(InterruptPoll(self.0.clone())));
        let mut cx = Context::from_waker(&waker);
        let mut future = pin!(future);
        let mut events = Events::with_capacity(BLOCK_ON_EVENTS);

        loop {
            self.turn();
            if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
                return Ok(output);
            }
            // Polling `future` may have queued runnables, which `timeout` accounts for.
            match poll.poll(&mut events, self.timeout()) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            for event in events.iter() {
                if self.owns(event.token()) {
                    self.handle_event(event);
                }
            }
        }
    }
}

/// Releases the tasks the runtime still holds, which nothing else can.
///
/// A task's future owns the [`RegisteredIoSource`]s and [`Sleep`]s it waits on, each of which
/// holds the shared state, and the shared state holds the task right back: as a runnable in the
/// queue, a waker in the timer or source maps, or a detached task. Only the runtime knows nobody
/// is left to run that ring, so it cuts it here.
///
/// Queued runnables and detached tasks are dropped, which cancels them. Parked tasks are woken
/// rather than merely forgotten: their schedule sees the runtime closed and drops the runnable,
/// which drops the future even while someone outside still holds the task's handle (that handle
/// then resolves to an error). One pass is not enough, since dropping a future cancels the tasks
/// whose handles it held and wakes the tasks that awaited it, so each pass takes what is there
/// until a pass finds nothing. Nothing is dropped or woken under a lock, because that reaches
/// back in.
impl Drop for MioRuntime {
    fn drop(&mut self) {
        // From now on a scheduled runnable is dropped on the spot, so neither a wake below nor a
        // handle that outlives the runtime can fill a queue nobody runs.
        {
            let _queue = lock(&self.0.queue);
            self.0.closed.store(true, Ordering::SeqCst);
        }
        loop {
            let queued = std::mem::take(&mut lock(&self.0.queue).runnables);
            let detached = std::mem::take(&mut *lock(&self.0.detached));
            let timers = std::mem::take(&mut lock(&self.0.timers).pending);
            let wakers = lock(&self.0.sources).take_wakers();

            if queued.is_empty() && detached.is_empty() && timers.is_empty() && wakers.is_empty() {
                break;
            }

            wakers
                .into_iter()
                .chain(timers.into_values())
                .for_each(Waker::wake);
            drop(detached);
            drop(queued);
        }
    }
}

/// What a [`MioRuntime`] hands to a zbus connection: a shared handle on its queue, timers and
/// sources.
#[derive(Clone)]
pub struct RuntimeHandle(Arc<Inner>);

impl traits::Runtime for RuntimeHandle {
    type RegisteredIoSource = RegisteredIoSource;
    type Sleep = Sleep;
    type Task<T>
        = Task<T>
    where
        T: Send + 'static;

    fn register_io_source(&self, source: IoSource) -> io::Result<RegisteredIoSource> {
        RegisteredIoSource::new(&self.0, source)
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        Sleep::new(self.0.clone(), duration)
    }

    fn spawn<T>(&self, _name: &str, future: impl Future<Output = T> + Send + 'static) -> Task<T>
    where
        T: Send + 'static,
    {
        // The name is for diagnostics only, and this runtime has nowhere to keep it.
        self.0.spawn(future)
    }

    fn connect_tcp(
        &self,
        address: SocketAddr,
    ) -> impl Future<Output = io::Result<IoSource>> + Send {
        connect::tcp(self, address)
    }

    fn connect_unix(&self, path: &Path) -> impl Future<Output = io::Result<IoSource>> + Send {
        connect::unix(self, path)
    }

    /// Refuses: waiting for a child needs a pidfd source or a timer that looks at it, and the
    /// agent never runs a `unixexec:` or `ibus:` program, the only callers (zbus calls this only
    /// with features the agent does not enable).
    ///
    /// `command` and the streams are dropped here, so no copy of a pipe end outlives the call.
    fn spawn_process(
        &self,
        command: Command,
        _stdin: Stdio,
        _stdout: Stdio,
        _stderr: Stdio,
    ) -> io::Result<Pin<Box<dyn Future<Output = io::Result<ExitStatus>> + Send>>> {
        Err(RuntimeError::ProcessSpawnUnsupported {
            program: command.get_program().to_string_lossy().into_owned(),
        }
        .into())
    }
}

/// Everything a [`MioRuntime`] shares with the handles, sources, timers and tasks it hands out.
struct Inner {
    /// A clone of the loop's registry; it stays valid however long a source outlives the poll.
    registry: Registry,
    /// Interrupts the loop's wait when a runnable is queued from another thread.
    waker: mio::Waker,
    waker_token: Token,
    /// Set once the [`MioRuntime`] is dropped: no one runs the queue any more.
    closed: AtomicBool,
    queue: Mutex<RunQueue>,
    detached: Mutex<Vec<Box<dyn Detached>>>,
    timers: Mutex<Timers>,
    sources: Mutex<Sources>,
}

/// The runnables waiting for the next turn, and the thread that waits in the poll.
#[derive(Default)]
struct RunQueue {
    runnables: VecDeque<Runnable>,
    /// The thread that last asked [`MioRuntime::timeout`], which is the one about to wait.
    driver: Option<std::thread::ThreadId>,
}

impl Inner {
    /// Spawns `future` as a task whose runnables go to this runtime's queue.
    fn spawn<T: Send + 'static>(
        self: &Arc<Self>,
        future: impl Future<Output = T> + Send + 'static,
    ) -> Task<T> {
        // A queued runnable owns this closure, so the hold on the runtime has to be weak: a strong
        // one would keep a released runtime's queue, timers and sources alive for good.
        let inner = Arc::downgrade(self);
        let schedule = move |runnable: Runnable| {
            let Some(inner) = inner.upgrade() else {
                // The runtime is gone, and dropping the runnable cancels the task.
                return;
            };
            let interrupt = {
                let mut queue = lock(&inner.queue);
                // Read under the queue's lock, which the runtime's drop sets it under, so that no
                // runnable slips into a queue that has been emptied for the last time.
                if inner.closed.load(Ordering::SeqCst) {
                    drop(queue);
                    // Dropping the runnable cancels the task, and drops its future.
                    drop(runnable);
                    return;
                }
                queue.runnables.push_back(runnable);
                // The loop may be asleep in the poll, unless this is the loop's own thread, which
                // asks `timeout` before it waits again (on a signal's way to its proof, that is
                // a write to the waker and an extra pass of the loop saved). A queue that
                // already held a runnable has already interrupted it (or is being run by a turn
                // that empties it), and `timeout` is zero while it is non-empty, so only the
                // first runnable needs to wake it.
                queue.runnables.len() == 1 && queue.driver != Some(std::thread::current().id())
            };
            // A failed wake leaves nothing to do: the runnable is queued and the next turn runs it.
            if interrupt {
                let _ = inner.waker.wake();
            }
        };

        let (runnable, task) = async_task::spawn(future, schedule);
        runnable.schedule();

        Task::new(task.fallible(), Arc::downgrade(self))
    }
}

/// The waker [`MioRuntime::block_on`] polls its future with: a wake interrupts the poll.
struct InterruptPoll(Arc<Inner>);

impl Wake for InterruptPoll {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // A wake that fails has nothing better to fall back on; `block_on` polls its future on
        // every pass of its loop anyway.
        let _ = self.0.waker.wake();
    }
}

/// The value behind a lock, taken whether or not a panic poisoned it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A server and a client connected peer to peer over a socket pair, both on `runtime` (for
/// tests: a fake systemd, or a flood of signals, with no bus daemon).
#[cfg(test)]
pub(crate) fn peer_to_peer(
    poll: &mut mio::Poll,
    runtime: &MioRuntime,
) -> (zbus::Connection, zbus::Connection) {
    let (server_end, client_end) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
    let handle = runtime.handle();
    let (server, client) = runtime
        .block_on(poll, async {
            let server = zbus::connection::Builder::unix_stream(server_end)
                .server(zbus::Guid::generate())
                .p2p()
                .runtime(handle.clone())
                .build();
            let client = zbus::connection::Builder::unix_stream(client_end)
                .p2p()
                .runtime(handle.clone())
                .build();
            futures_util::future::join(server, client).await
        })
        .expect("the poll waits");
    (server.expect("a server"), client.expect("a client"))
}

#[cfg(test)]
mod tests;

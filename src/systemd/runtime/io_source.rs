//! The sockets and pipes the runtime registered on the loop's poll, the tokens they are
//! registered under, and the readiness wait a connection does its I/O through.
//!
//! A source is registered once, for both directions, and stays registered until its registration
//! is dropped; it must never be left registered once the descriptor may be closed, nor be given a
//! token outside the runtime's range.

use std::{
    collections::HashMap,
    io,
    ops::Range,
    os::fd::AsRawFd,
    sync::{Arc, Mutex},
    task::{Context, Poll, Waker},
};

use mio::{Token, unix::SourceFd};
use zbus::runtime::{Interest, IoSource, traits};

use super::{Inner, RuntimeError, lock};

/// One source registered on the loop's poll, through which a connection does its I/O on it.
///
/// It holds a clone of the [`IoSource`], so the descriptor stays open until the drop has taken it
/// off the poll.
pub struct RegisteredIoSource {
    inner: Arc<Inner>,
    state: Arc<SourceState>,
}

impl RegisteredIoSource {
    /// Registers `source` for both directions, edge-triggered, under a token of its own.
    pub(super) fn new(inner: &Arc<Inner>, source: IoSource) -> io::Result<Self> {
        let mut sources = lock(&inner.sources);
        let token = sources.allocate()?;
        let registered = inner.registry.register(
            &mut SourceFd(&source.as_raw_fd()),
            token,
            mio::Interest::READABLE | mio::Interest::WRITABLE,
        );
        if let Err(e) = registered {
            sources.free.push(token);
            return Err(e);
        }
        let state = Arc::new(SourceState {
            source,
            token,
            readiness: Mutex::default(),
        });
        sources.states.insert(token, state.clone());

        Ok(Self {
            inner: inner.clone(),
            state,
        })
    }
}

impl traits::PollIo for RegisteredIoSource {
    /// Runs `operation` first, and waits only once it reports `WouldBlock`.
    ///
    /// mio reports a source once per edge, not while it stays ready, so the operation itself is
    /// what finds out whether the source is ready. Nothing is lost between a failed operation and
    /// the storing of the waker: on the loop's thread, which is where every task of this runtime
    /// runs, an edge that arrives in between stays in the kernel's ready list until the loop's
    /// next `Poll::poll`, and is handed to `handle_event` only after the waker is stored. For a
    /// caller on another thread, the count of events handled is read before the operation and
    /// compared after it: an event handled in between may be the edge the operation missed, so
    /// the operation is run again rather than waited on.
    fn poll_io<T>(
        &self,
        cx: &mut Context<'_>,
        interest: Interest,
        mut operation: impl FnMut() -> io::Result<T>,
    ) -> Poll<io::Result<T>> {
        loop {
            let events_before = lock(&self.state.readiness).events;
            match operation() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                result => return Poll::Ready(result),
            }

            let mut readiness = lock(&self.state.readiness);
            if readiness.events != events_before {
                continue;
            }
            let slot = match interest {
                Interest::Readable => &mut readiness.readable,
                Interest::Writable => &mut readiness.writable,
                // `Interest` is open, and the poll reports only these two kinds of readiness.
                _ => return Poll::Ready(Err(io::ErrorKind::Unsupported.into())),
            };
            match slot {
                Some(waker) if waker.will_wake(cx.waker()) => {}
                _ => *slot = Some(cx.waker().clone()),
            }

            return Poll::Pending;
        }
    }
}

impl Drop for RegisteredIoSource {
    fn drop(&mut self) {
        let released = {
            let mut sources = lock(&self.inner.sources);
            // Taken off the poll before the token can be handed out again, and while `state` still
            // holds the descriptor open. A failure leaves nothing to undo: the descriptor is about
            // to be closed, which takes it off the poll, and a stray event for a reused token only
            // wakes a waiter that finds its source not ready.
            let _ = self
                .inner
                .registry
                .deregister(&mut SourceFd(&self.state.source.as_raw_fd()));
            sources.remove(self.state.token)
        };
        // Dropped after the lock: a state's wakers can hold tasks whose drop reaches back in.
        drop(released);
    }
}

impl Inner {
    /// Wakes whoever waits on the source registered under `token`, in either direction.
    ///
    /// Both directions are woken for any event: mio's events say what the source became ready
    /// for, but a waiter that finds it was not for it just waits again.
    pub(super) fn wake_source(&self, token: Token) {
        let Some(state) = lock(&self.sources).states.get(&token).cloned() else {
            // A source that was dropped after the event was taken from the poll.
            return;
        };
        let (readable, writable) = {
            let mut readiness = lock(&state.readiness);
            readiness.events = readiness.events.wrapping_add(1);

            (readiness.readable.take(), readiness.writable.take())
        };

        for waker in [readable, writable].into_iter().flatten() {
            waker.wake();
        }
    }
}

/// The sources the runtime registered, under the tokens the poll reports them by.
pub(super) struct Sources {
    /// The tokens the runtime was given.
    range: Range<usize>,
    /// The first token of the range never handed out.
    next: usize,
    /// Tokens handed out and given back, to be handed out again first.
    free: Vec<Token>,
    states: HashMap<Token, Arc<SourceState>>,
}

impl Sources {
    /// No sources yet, with the tokens of `range` to register them under.
    pub(super) fn new(range: Range<usize>) -> Self {
        Self {
            next: range.start,
            range,
            free: Vec::new(),
            states: HashMap::new(),
        }
    }

    /// Whether `token` lies in the runtime's range of source tokens.
    pub(super) fn owns(&self, token: Token) -> bool {
        self.range.contains(&token.0)
    }

    /// A token no registered source holds, or an error once every token of the range is in use.
    fn allocate(&mut self) -> Result<Token, RuntimeError> {
        if let Some(token) = self.free.pop() {
            return Ok(token);
        }
        if self.next < self.range.end {
            self.next += 1;
            return Ok(Token(self.next - 1));
        }

        Err(RuntimeError::SourceTokensExhausted {
            sources: self.range.clone(),
        })
    }

    /// Forgets the source under `token` and makes the token free again, handing back its state.
    fn remove(&mut self, token: Token) -> Option<Arc<SourceState>> {
        let state = self.states.remove(&token);
        self.free.push(token);

        state
    }

    /// Takes every waker that waits on a source.
    pub(super) fn take_wakers(&self) -> Vec<Waker> {
        self.states
            .values()
            .flat_map(|state| {
                let mut readiness = lock(&state.readiness);

                [readiness.readable.take(), readiness.writable.take()]
            })
            .flatten()
            .collect()
    }
}

/// One registered source: the descriptor, its token, and who waits on it.
pub(super) struct SourceState {
    source: IoSource,
    token: Token,
    readiness: Mutex<Readiness>,
}

/// Who waits for each direction of one source, and how many events it has had.
#[derive(Default)]
struct Readiness {
    readable: Option<Waker>,
    writable: Option<Waker>,
    /// Counts the events handled for the source, so that `poll_io` can see one that arrived
    /// while its operation ran.
    events: u64,
}

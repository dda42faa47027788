//! Watching processes for their exit: one pidfd each, registered in the caller's mio loop. A
//! process's exit is read from its pidfd alone, never from `/proc` (see the parent module).

use std::collections::HashMap;
use std::hash::Hash;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::{ProcsError, read_stat};
use crate::token_pool::TokenPool;

/// What [`ProcessTracker::track`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tracked {
    /// The process was running; its exit will be reported by [`ProcessTracker::handle_event`].
    Alive,
    /// The process with that start time has exited (or its pid now names another process); nothing
    /// is tracked for it.
    AlreadyExited,
}

/// One tracked process.
#[derive(Debug)]
struct Watched<K> {
    key: K,
    pid: i32,
    start_ticks: u64,
    pidfd: OwnedFd,
}

/// Watches processes for their exit, one pidfd each, registered in the caller's mio `Poll` under
/// tokens from a range given at construction; each process belongs to a caller-chosen key.
#[derive(Debug)]
pub(crate) struct ProcessTracker<K> {
    tokens: TokenPool,
    watched: HashMap<Token, Watched<K>>,
    by_key: HashMap<K, HashMap<i32, Token>>,
}

impl<K: Copy + Eq + Hash> ProcessTracker<K> {
    /// Creates a tracker that registers pidfds under tokens of `tokens` only. Fresh tokens are used
    /// before freed ones, so give a wide range to make a token's reuse rare.
    pub(crate) fn new(tokens: Range<usize>) -> Self {
        Self {
            tokens: TokenPool::new(tokens),
            watched: HashMap::new(),
            by_key: HashMap::new(),
        }
    }

    /// Starts watching process `pid` for `key`, if it is still the process that started at
    /// `start_ticks` (from [`list_processes`] or [`read_stat`]).
    ///
    /// The pidfd is opened first and the start time checked after, so the pidfd is known to refer to
    /// that process: had the pid been reused in between, the start time would differ. Tracking a
    /// (key, pid) again with the same start time does nothing. With another start time, the process
    /// tracked before is certainly gone (its pid names another one now): it is replaced if the new
    /// one is alive, otherwise left to report its exit.
    pub(crate) fn track(
        &mut self,
        registry: &Registry,
        key: K,
        pid: i32,
        start_ticks: u64,
    ) -> Result<Tracked, ProcsError> {
        if pid <= 0 {
            return Err(ProcsError::InvalidPid { pid });
        }
        let held = self
            .by_key
            .get(&key)
            .and_then(|pids| pids.get(&pid))
            .copied();
        if let Some(token) = held
            && self
                .watched
                .get(&token)
                .is_some_and(|watched| watched.start_ticks == start_ticks)
        {
            return Ok(Tracked::Alive);
        }
        let pidfd = match pidfd_open(pid) {
            Ok(pidfd) => pidfd,
            Err(Errno::ESRCH) => return Ok(Tracked::AlreadyExited),
            Err(source) => return Err(ProcsError::PidfdOpen { pid, source }),
        };
        match read_stat(pid)? {
            Some(stat) if stat.start_ticks == start_ticks => {}
            _ => return Ok(Tracked::AlreadyExited),
        }
        if has_exited(&pidfd) {
            return Ok(Tracked::AlreadyExited);
        }
        let token = self.tokens.take().ok_or(ProcsError::NoToken { pid })?;
        let raw = pidfd.as_raw_fd();
        if let Err(source) = registry.register(&mut SourceFd(&raw), token, Interest::READABLE) {
            self.tokens.give_back(token);
            return Err(ProcsError::Register { pid, source });
        }
        if let Some(stale) = held {
            self.untrack(registry, stale);
        }
        self.watched.insert(
            token,
            Watched {
                key,
                pid,
                start_ticks,
                pidfd,
            },
        );
        self.by_key.entry(key).or_default().insert(pid, token);
        Ok(Tracked::Alive)
    }

    /// Whether `token` belongs to this tracker's range.
    pub(crate) fn owns(&self, token: Token) -> bool {
        self.tokens.owns(token)
    }

    /// Handles a readiness event for `token`: if its process has exited, stops tracking it and
    /// returns its key and pid.
    ///
    /// The event is only a hint: the pidfd itself is asked whether the process exited, so a stale
    /// event (for a token since reused) or a spurious one reports nothing. Unknown tokens are ignored.
    pub(crate) fn handle_event(&mut self, registry: &Registry, token: Token) -> Option<(K, i32)> {
        let watched = self.watched.get(&token)?;
        if !has_exited(&watched.pidfd) {
            return None;
        }
        let watched = self.untrack(registry, token)?;
        Some((watched.key, watched.pid))
    }

    /// Stops tracking every process of `key`, closing their pidfds.
    pub(crate) fn untrack_key(&mut self, registry: &Registry, key: K) {
        let Some(pids) = self.by_key.remove(&key) else {
            return;
        };
        for token in pids.into_values() {
            self.deregister(registry, token);
        }
    }

    #[cfg(test)]
    /// The pids tracked for `key`, in no order.
    pub(crate) fn tracked(&self, key: K) -> impl Iterator<Item = i32> + '_ {
        self.by_key
            .get(&key)
            .into_iter()
            .flat_map(|pids| pids.keys().copied())
    }

    #[cfg(test)]
    /// The token of `pid`'s pidfd, tracked for `key`; panics if it is not tracked.
    pub(crate) fn token_of(&self, key: K, pid: i32) -> Token {
        self.by_key[&key][&pid]
    }

    #[cfg(test)]
    /// How many processes are tracked for `key`.
    pub(crate) fn tracked_count(&self, key: K) -> usize {
        self.by_key.get(&key).map_or(0, HashMap::len)
    }

    #[cfg(test)]
    /// How many pidfds are held for all keys.
    pub(crate) fn len(&self) -> usize {
        self.watched.len()
    }

    #[cfg(test)]
    /// Whether no pidfd is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }

    /// Stops tracking the process under `token` and returns it.
    fn untrack(&mut self, registry: &Registry, token: Token) -> Option<Watched<K>> {
        let watched = self.deregister(registry, token)?;
        if let Some(pids) = self.by_key.get_mut(&watched.key) {
            if pids.get(&watched.pid) == Some(&token) {
                pids.remove(&watched.pid);
            }
            if pids.is_empty() {
                self.by_key.remove(&watched.key);
            }
        }
        Some(watched)
    }

    /// Deregisters the pidfd under `token` and frees the token; the pidfd closes when the returned
    /// value is dropped. Leaves `by_key` alone.
    fn deregister(&mut self, registry: &Registry, token: Token) -> Option<Watched<K>> {
        let watched = self.watched.remove(&token)?;
        // A failure changes nothing: closing the pidfd removes it from epoll anyway.
        let _ = registry.deregister(&mut SourceFd(&watched.pidfd.as_raw_fd()));
        self.tokens.give_back(token);
        Some(watched)
    }
}

/// Whether the process of `pidfd` has exited, asked of the pidfd now (readable once every thread of
/// the process exited, zombie or reaped). A failed poll says no: leaning towards waiting.
fn has_exited(pidfd: &OwnedFd) -> bool {
    loop {
        let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(_) => {
                return fds[0]
                    .revents()
                    .is_some_and(|events| events.contains(PollFlags::POLLIN));
            }
            Err(Errno::EINTR) => continue,
            Err(error) => {
                log::warn!(
                    "cannot poll pidfd {}: {error}; counting its process as running",
                    pidfd.as_raw_fd()
                );
                return false;
            }
        }
    }
}

/// Opens a pidfd (close-on-exec) for `pid`; nix 0.32 has no wrapper for the system call.
fn pidfd_open(pid: i32) -> Result<OwnedFd, Errno> {
    // SAFETY: pidfd_open takes two integers and returns a new descriptor or -1; it reads and writes
    // no memory of ours.
    let result = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if result < 0 {
        return Err(Errno::last());
    }
    let raw = RawFd::try_from(result).map_err(|_| Errno::EBADF)?;
    // SAFETY: the kernel has just returned this descriptor to us, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

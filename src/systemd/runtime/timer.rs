//! The timers a connection waits on, and the deadlines the runtime walks to fire them.
//!
//! A timer must never stay in the map once its `Sleep` is dropped.

use std::{
    collections::BTreeMap,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

use super::{Inner, lock};
use crate::clock;

/// A timer the runtime wakes once its deadline has passed. Dropping it cancels it.
pub struct Sleep {
    inner: Arc<Inner>,
    /// `None` for a wait too long to be a deadline on the clock, which never ends.
    deadline: Option<Instant>,
    /// Handed out on the first poll, which is when the timer joins the runtime's map.
    id: Option<u64>,
}

impl Sleep {
    /// A timer that is due once `duration` has passed on the standard monotonic clock.
    pub(super) fn new(inner: Arc<Inner>, duration: Duration) -> Self {
        Self {
            inner,
            deadline: clock::now().checked_add(duration),
            id: None,
        }
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let Some(deadline) = this.deadline else {
            // Never due, so nothing will ever have to wake it.
            return Poll::Pending;
        };
        if clock::now() >= deadline {
            return Poll::Ready(());
        }

        let mut timers = lock(&this.inner.timers);
        let id = *this.id.get_or_insert_with(|| {
            timers.next_id += 1;
            timers.next_id
        });
        timers.pending.insert((deadline, id), cx.waker().clone());

        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let (Some(deadline), Some(id)) = (self.deadline, self.id) {
            let waker = lock(&self.inner.timers).pending.remove(&(deadline, id));
            // Dropped after the lock: a waker can hold a task whose drop reaches back in.
            drop(waker);
        }
    }
}

impl Inner {
    /// Wakes and forgets every timer whose deadline has passed.
    pub(super) fn wake_due_timers(&self) {
        let due = {
            let mut timers = lock(&self.timers);
            // Ids start at one and count up, so none is `u64::MAX`, and the split leaves exactly
            // the deadlines that have passed on the left.
            let later = timers.pending.split_off(&(clock::now(), u64::MAX));

            std::mem::replace(&mut timers.pending, later)
        };

        for waker in due.into_values() {
            waker.wake();
        }
    }
}

/// The timers waiting for their deadline, keyed so that two with the same deadline stay apart.
#[derive(Default)]
pub(super) struct Timers {
    pub(super) pending: BTreeMap<(Instant, u64), Waker>,
    next_id: u64,
}

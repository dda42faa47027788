//! What a spawn hands back, and the detached tasks the runtime keeps until they end.
//!
//! A handle must never keep the runtime alive: it reaches the runtime only through a weak
//! reference, to hand a detached task over.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::Weak,
    task::{Context, Poll},
};

use zbus::runtime::traits;

use super::{Inner, lock};

/// A spawned task, which resolves to what its future produced. Dropping it cancels the task.
pub struct Task<T> {
    task: async_task::FallibleTask<T>,
    inner: Weak<Inner>,
}

impl<T> Task<T> {
    /// A handle on `task`, spawned on the runtime `inner` belongs to.
    pub(super) fn new(task: async_task::FallibleTask<T>, inner: Weak<Inner>) -> Self {
        Self { task, inner }
    }

    /// Whether the task has ended, so that awaiting the handle would not wait.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl<T> Future for Task<T> {
    type Output = io::Result<T>;

    /// Resolves to what the task produced, or to an error when the runtime dropped the task
    /// before it ended, which it does when it is itself dropped.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.task).poll(cx).map(|output| {
            output.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::Interrupted,
                    "the task was dropped with its runtime",
                )
            })
        })
    }
}

impl<T> traits::TaskHandle<T> for Task<T>
where
    T: Send + 'static,
{
    /// Hands the task to the runtime, which holds it until it ends or the runtime is dropped.
    ///
    /// `async_task`'s own `detach` would leave the task owned by nothing, and one parked on
    /// something that never fires would then hold its connection's state for good.
    fn detach(self) {
        let Some(inner) = self.inner.upgrade() else {
            // The runtime is gone, and dropping the task is all cancelling it takes.
            return;
        };

        lock(&inner.detached).push(Box::new(self.task));
    }
}

/// A detached task, whatever it produces: the runtime only asks whether it has ended.
pub(super) trait Detached: Send {
    fn is_finished(&self) -> bool;
}

impl<T: Send> Detached for async_task::FallibleTask<T> {
    fn is_finished(&self) -> bool {
        async_task::FallibleTask::is_finished(self)
    }
}

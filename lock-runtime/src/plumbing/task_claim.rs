//! The claim a background task holds on the state it serves. Dropped while armed (the task's
//! runtime shut down, or the task panicked), it tells that state, which moves the work on.

use std::sync::{Arc, Mutex, MutexGuard};

/// State served by one background task at a time.
pub(crate) trait ServedByTask: Send + Sync + 'static {
    /// What the task and its users share, under one lock.
    type Schedule;

    fn schedule(&self) -> &Mutex<Self::Schedule>;

    /// The task serving this state was dropped before it stopped on its own; `schedule` is
    /// locked (a poisoned lock is left alone).
    fn task_dropped(self: &Arc<Self>, schedule: MutexGuard<'_, Self::Schedule>);
}

/// A running task's claim on `S`.
pub(crate) struct TaskClaim<S: ServedByTask> {
    shared: Arc<S>,
    armed: bool,
}

impl<S: ServedByTask> TaskClaim<S> {
    pub(crate) fn new(shared: Arc<S>) -> Self {
        Self {
            shared,
            armed: true,
        }
    }

    pub(crate) fn shared(&self) -> &Arc<S> {
        &self.shared
    }

    /// The task stops on its own: its drop must leave the state alone (a new task may serve it
    /// by then).
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl<S: ServedByTask> Drop for TaskClaim<S> {
    fn drop(&mut self) {
        if self.armed
            && let Ok(schedule) = self.shared.schedule().lock()
        {
            self.shared.task_dropped(schedule);
        }
    }
}

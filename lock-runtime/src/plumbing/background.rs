//! The mechanics that a schedule served by one background task needs, shared by the request
//! bounds (`deadlines`) and the renewal watchdog (`hold::watchdog`); each keeps its own
//! schedule and what it does when something is due.
//!
//! - [`Task`]: under the schedule's lock, whether a task runs, in which runtime, and when it
//!   looks next by itself; an entry added starts a task, wakes the one that runs (only when it
//!   is due before that look), or neither.
//! - [`TaskClaim`]: the running task's claim. Dropped while armed (the task's runtime shut
//!   down, or the task panicked), it tells the state, which moves the work on.
//! - [`Idle`] and [`Task::plan`]: a task with nothing due lingers for [`LINGER`] before it
//!   exits (under the lock, so that an entry added meanwhile starts a new one), and a steady
//!   stream of entries reuses one task.
//! - [`nap`]: the task's wait, until its next look or until woken.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::plumbing::unpoisoned::Unpoisoned;
use tokio::runtime::Id;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How long a task waits with nothing due before it exits.
pub(crate) const LINGER: Duration = Duration::from_secs(1);

/// The background task of one schedule, as its users see it (kept under the schedule's lock).
#[derive(Debug, Default)]
pub(crate) struct Task {
    running: bool,
    /// When the running task looks at the schedule next by itself; `None` while it will look
    /// without being woken (it has not looked yet, or it is busy). An entry due before this
    /// wakes it.
    armed: Option<Instant>,
    /// The runtime the task runs in.
    home: Option<Id>,
}

/// What the caller that added an entry does once it let go of the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Added {
    /// No task ran: spawn one in the caller's runtime (it is `home` now).
    Spawn,
    /// The entry is due before the task's next look: wake the task.
    Wake,
    /// The task sees the entry in time.
    Nothing,
}

impl Task {
    /// Whether a task runs (or is about to).
    pub(crate) fn is_running(&self) -> bool {
        self.running
    }

    /// The runtime the task runs in.
    pub(crate) fn home(&self) -> Option<Id> {
        self.home
    }

    /// An entry due at `due` was added from runtime `here`.
    pub(crate) fn added(&mut self, due: Instant, here: Id) -> Added {
        if !self.running {
            self.start_in(Some(here));
            Added::Spawn
        } else if self.armed.is_some_and(|armed| due < armed) {
            Added::Wake
        } else {
            Added::Nothing
        }
    }

    /// A task is about to run in `home` (`None`: a runtime it makes itself, named once it
    /// runs); it looks at the schedule first.
    pub(crate) fn start_in(&mut self, home: Option<Id>) {
        self.running = true;
        self.armed = None;
        self.home = home;
    }

    /// The task is busy and looks at the schedule again without being woken.
    pub(crate) fn busy(&mut self) {
        self.armed = None;
    }

    /// No task runs: the next entry starts one.
    pub(crate) fn exited(&mut self) {
        self.running = false;
        self.armed = None;
        self.home = None;
    }

    /// Under the lock, after a look that left the next entry due at `soonest` (`None`: nothing
    /// waits): when the task looks next, which arms it, or `None` when it has lingered long
    /// enough and exits (its `claim` disarmed: a new task may serve the state from now on).
    pub(crate) fn plan<S: ServedByTask>(
        &mut self,
        idle: &mut Idle,
        now: Instant,
        soonest: Option<Instant>,
        claim: &mut TaskClaim<S>,
    ) -> Option<Instant> {
        let look_at = idle.next_look(now, soonest);
        match look_at {
            Some(at) => self.armed = Some(at),
            None => {
                self.exited();
                claim.disarm();
            }
        }
        look_at
    }
}

/// Since when a task has had nothing to wait for.
#[derive(Debug, Default)]
pub(crate) struct Idle {
    since: Option<Instant>,
}

impl Idle {
    /// When to look next: at `soonest`, the next entry due; with none, at the end of the
    /// linger, or `None` once it has passed.
    fn next_look(&mut self, now: Instant, soonest: Option<Instant>) -> Option<Instant> {
        if soonest.is_some() {
            self.since = None;
            return soonest;
        }
        let since = *self.since.get_or_insert(now);
        (now < since + LINGER).then_some(since + LINGER)
    }

    /// The task found work: it is not idle.
    pub(crate) fn busy(&mut self) {
        self.since = None;
    }
}

/// The task's wait: until `at`, or until an entry added wakes it.
pub(crate) async fn nap(at: Instant, wake: &Notify) {
    tokio::select! {
        () = tokio::time::sleep_until(at) => {}
        () = wake.notified() => {}
    }
}

/// State served by one background task at a time.
pub(crate) trait ServedByTask: Send + Sync + 'static {
    /// What the task and its users share, under one lock.
    type Schedule;

    fn schedule(&self) -> &Mutex<Self::Schedule>;

    /// The task serving this state was dropped before it exited on its own; `schedule` is
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

    /// The task exits on its own: its drop must leave the state alone (a new task may serve it
    /// by then).
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl<S: ServedByTask> Drop for TaskClaim<S> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.task_dropped(self.shared.schedule().locked());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A state that records whether a claim on it was dropped armed.
    #[derive(Default)]
    struct Served {
        schedule: Mutex<()>,
        dropped: AtomicBool,
    }

    impl ServedByTask for Served {
        type Schedule = ();

        fn schedule(&self) -> &Mutex<()> {
            &self.schedule
        }

        fn task_dropped(self: &Arc<Self>, _: MutexGuard<'_, ()>) {
            self.dropped.store(true, Ordering::Relaxed);
        }
    }

    #[tokio::test]
    async fn an_entry_starts_a_task_or_wakes_it_only_when_due_before_its_look() {
        let here = tokio::runtime::Handle::current().id();
        let (now, second) = (Instant::now(), Duration::from_secs(1));
        let mut task = Task::default();
        assert_eq!(task.added(now, here), Added::Spawn);
        assert!(task.is_running());
        assert_eq!(task.home(), Some(here));
        // It has not looked yet: it sees the entry when it does.
        assert_eq!(task.added(now, here), Added::Nothing);
        let served = Arc::new(Served::default());
        let mut claim = TaskClaim::new(Arc::clone(&served));
        let at = now + 5 * second;
        let planned = task.plan(&mut Idle::default(), now, Some(at), &mut claim);
        assert_eq!(planned, Some(at));
        assert_eq!(task.added(at, here), Added::Nothing);
        assert_eq!(task.added(now + second, here), Added::Wake);
        task.busy();
        assert_eq!(task.added(now, here), Added::Nothing);
        drop(claim);
        assert!(
            served.dropped.load(Ordering::Relaxed),
            "an armed claim tells"
        );
    }

    #[test]
    fn an_idle_task_lingers_then_exits_and_disarms_its_claim() {
        let now = Instant::now();
        let served = Arc::new(Served::default());
        let mut claim = TaskClaim::new(Arc::clone(&served));
        let (mut task, mut idle) = (Task::default(), Idle::default());
        task.start_in(None);
        let mut plan = |at: Instant, soonest| task.plan(&mut idle, at, soonest, &mut claim);
        assert_eq!(plan(now, None), Some(now + LINGER));
        assert_eq!(plan(now + LINGER / 2, None), Some(now + LINGER));
        // Work in between: the linger starts over once nothing waits again.
        let due = now + LINGER / 2;
        assert_eq!(plan(due, Some(due)), Some(due));
        assert_eq!(plan(now + LINGER, None), Some(now + 2 * LINGER));
        assert_eq!(plan(now + 2 * LINGER, None), None);
        assert!(!task.is_running());
        assert_eq!(task.home(), None);
        drop(claim);
        assert!(
            !served.dropped.load(Ordering::Relaxed),
            "a task that exited leaves it alone"
        );
    }
}

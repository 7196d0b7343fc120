//! Request bounds kept in one schedule per locker, instead of one runtime timer per request.
//!
//! Every request is bounded: a server that accepts connections but never answers must not
//! stretch a call. With a tokio timer per request, the engine's uncontended cycle woke the
//! runtime's I/O driver 0.7 times more per cycle than the floor's (strace: `eventfd` writes and
//! `epoll_wait` returns; a build without the bounds did not): tokio 1.54 wakes the driver
//! whenever a new timer is due sooner than the wake it planned at its last park, and it plans
//! that wake from the timers left then.
//!
//! Here the bounds wait in one schedule, watched by one task. A request registers with one
//! lock and a few stores, and wakes the task only when it is due before the task next looks.
//! That look is never moved later when a bound leaves, so in a steady stream of requests with
//! one limit (each due one response timeout after it was sent) no registration wakes the task:
//! it wakes about once per response timeout, finds the soonest bound, and sleeps until it.
//! Bounds of several lengths (an acquire limited by a validity under one response timeout,
//! next to releases limited by the response timeout) can wake it per request, as timers did.
//!
//! The task runs in the runtime of the request that started it. A request polled in another
//! runtime waits on a timer of its own runtime instead: the task's runtime may be idle (a
//! current-thread runtime outside `block_on`), and a bound must end whatever other runtimes do.

use crate::plumbing::background::{Added, Idle, ServedByTask, Task, TaskClaim, nap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::plumbing::unpoisoned::Unpoisoned;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

/// The schedule of one locker's request bounds; its nodes share one (each holds a clone).
#[derive(Default, Clone)]
pub(crate) struct Deadlines {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Notify,
}

/// The waiting requests, in slots that are reused (most calls leave before their bound, and
/// the task looks rarely): a registration and a removal are a few stores each, and the task's
/// look goes over every slot.
#[derive(Default)]
struct State {
    slots: Vec<Slot>,
    /// Slots without a request, the most recently freed last.
    free: Vec<usize>,
    /// The task that watches the slots (it lingers a while with none: a steady stream of
    /// requests reuses one task).
    task: Task,
}

struct Slot {
    deadline: Instant,
    /// The waiting request's waker; `None` while the slot is free.
    waker: Option<Waker>,
    /// Counts the slot's uses, so that a request leaving late cannot free its successor's.
    generation: u64,
}

impl State {
    /// Slot `index`, if generation `generation` of it still holds a request.
    fn held(&mut self, index: usize, generation: u64) -> Option<&mut Slot> {
        self.slots
            .get_mut(index)
            .filter(|slot| slot.generation == generation && slot.waker.is_some())
    }

    /// Frees `index` and returns its waker, if generation `generation` still holds it.
    fn take(&mut self, index: usize, generation: u64) -> Option<Waker> {
        let slot = self.held(index, generation)?;
        slot.generation += 1;
        let waker = slot.waker.take();
        self.free.push(index);
        waker
    }
}

/// A request's slot in the schedule.
struct Entry {
    index: usize,
    generation: u64,
}

/// The deadline of a [`Bound`] passed before its request finished.
#[derive(Debug)]
pub(crate) struct Elapsed;

impl Deadlines {
    /// `request`, bounded to finish by `deadline`.
    pub(crate) fn bound<F: Future>(&self, deadline: Instant, request: F) -> Bound<'_, F> {
        Bound {
            request,
            deadline,
            deadlines: self,
            entry: None,
            own: None,
        }
    }

    /// How many bounds wait in the schedule (for tests: none is left behind).
    #[cfg(test)]
    fn waiting(&self) -> usize {
        let s = self.shared.state.locked();
        s.slots.iter().filter(|slot| slot.waker.is_some()).count()
    }
}

impl Shared {
    /// Puts a request in the schedule; `None` when the task runs in another runtime than this
    /// request's (the request then keeps a timer of its own).
    fn insert(self: &Arc<Self>, deadline: Instant, waker: &Waker) -> Option<Entry> {
        let here = Handle::current();
        let mut s = self.state.locked();
        if s.task.is_running() && s.task.home() != Some(here.id()) {
            return None;
        }
        let waker = Some(waker.clone());
        let entry = match s.free.pop() {
            Some(index) => {
                let slot = &mut s.slots[index];
                slot.deadline = deadline;
                slot.waker = waker;
                Entry {
                    index,
                    generation: slot.generation,
                }
            }
            None => {
                s.slots.push(Slot {
                    deadline,
                    waker,
                    generation: 0,
                });
                Entry {
                    index: s.slots.len() - 1,
                    generation: 0,
                }
            }
        };
        match s.task.added(deadline, here.id()) {
            Added::Spawn => {
                drop(s);
                here.spawn(watch(Running::new(Arc::clone(self))));
            }
            Added::Wake => {
                drop(s);
                self.wake.notify_one();
            }
            Added::Nothing => {}
        }
        Some(entry)
    }

    /// A bound polled again with another waker: the task wakes that one. False when the bound
    /// is no longer in the schedule (the task that watched it ended with its runtime).
    fn rewake(&self, entry: &Entry, waker: &Waker) -> bool {
        let mut s = self.state.locked();
        let Some(known) = s
            .held(entry.index, entry.generation)
            .and_then(|slot| slot.waker.as_mut())
        else {
            return false;
        };
        if !known.will_wake(waker) {
            known.clone_from(waker);
        }
        true
    }

    fn remove(&self, entry: &Entry) {
        let waker = self.state.locked().take(entry.index, entry.generation);
        // Dropped outside the lock.
        drop(waker);
    }
}

pin_project_lite::pin_project! {
    /// A request bounded by a deadline (see [`Deadlines::bound`]): `Err(Elapsed)` once the
    /// deadline passes. Registers in the schedule only when the request has to wait.
    pub(crate) struct Bound<'a, F> {
        #[pin]
        request: F,
        deadline: Instant,
        deadlines: &'a Deadlines,
        entry: Option<Entry>,
        // The timer of a request polled outside the task's runtime.
        own: Option<Pin<Box<Sleep>>>,
    }

    impl<F> PinnedDrop for Bound<'_, F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(entry) = this.entry.take() {
                this.deadlines.shared.remove(&entry);
            }
        }
    }
}

impl<F: Future> Future for Bound<'_, F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let shared = &this.deadlines.shared;
        let deadline = *this.deadline;
        if let Poll::Ready(out) = this.request.poll(cx) {
            // Out of the schedule now, not when dropped: it may be kept a while.
            if let Some(entry) = this.entry.take() {
                shared.remove(&entry);
            }
            return Poll::Ready(Ok(out));
        }
        if let Some(own) = this.own {
            return match own.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
                Poll::Pending => Poll::Pending,
            };
        }
        match this.entry {
            // No clock read: a bound due already is due before the task's next look, so the
            // task is woken and fires it at once.
            None => *this.entry = shared.insert(deadline, cx.waker()),
            Some(entry) => {
                if Instant::now() >= deadline {
                    shared.remove(entry);
                    *this.entry = None;
                    return Poll::Ready(Err(Elapsed));
                }
                if shared.rewake(entry, cx.waker()) {
                    return Poll::Pending;
                }
                *this.entry = shared.insert(deadline, cx.waker());
            }
        }
        if this.entry.is_none() {
            let own = this
                .own
                .insert(Box::pin(tokio::time::sleep_until(deadline)));
            if own.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(Elapsed));
            }
        }
        Poll::Pending
    }
}

/// The running task's claim; if the task is dropped early (its runtime shut down), the bounds
/// left in the schedule are woken to register again from their own runtime.
type Running = TaskClaim<Shared>;

impl ServedByTask for Shared {
    type Schedule = State;

    fn schedule(&self) -> &Mutex<State> {
        &self.state
    }

    fn task_dropped(self: &Arc<Self>, mut s: MutexGuard<'_, State>) {
        s.task.exited();
        let left: Vec<Waker> = (0..s.slots.len())
            .filter_map(|index| {
                let generation = s.slots[index].generation;
                s.take(index, generation)
            })
            .collect();
        drop(s);
        left.into_iter().for_each(Waker::wake);
    }
}

/// Wakes each bound's request at its deadline (the request then sees it passed).
async fn watch(mut running: Running) {
    let shared = Arc::clone(running.shared());
    let mut idle = Idle::default();
    loop {
        let now = Instant::now();
        let mut fired = Vec::new();
        let look_at = {
            let mut s = shared.state.locked();
            let mut soonest: Option<Instant> = None;
            for index in 0..s.slots.len() {
                let slot = &s.slots[index];
                if slot.waker.is_none() {
                    continue;
                }
                if slot.deadline <= now {
                    let generation = slot.generation;
                    fired.extend(s.take(index, generation));
                } else if soonest.is_none_or(|at| slot.deadline < at) {
                    soonest = Some(slot.deadline);
                }
            }
            // Stops under the lock when it has lingered long enough: a new bound either
            // landed before this, or finds no task and starts one.
            s.task.plan(&mut idle, now, soonest, &mut running)
        };
        fired.into_iter().for_each(Waker::wake);
        let Some(at) = look_at else {
            return;
        };
        nap(at, &shared.wake).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const SHORT: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn a_request_that_never_finishes_ends_at_its_deadline() {
        let deadlines = Deadlines::default();
        ends_at_its_deadline(&deadlines).await;
        assert_eq!(deadlines.waiting(), 0);
    }

    #[tokio::test]
    async fn a_request_that_finishes_leaves_nothing_behind() {
        let deadlines = Deadlines::default();
        let far = Instant::now() + Duration::from_secs(60);
        let out = deadlines.bound(far, tokio::task::yield_now()).await;
        assert!(out.is_ok());
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let waiting = deadlines.bound(far, rx);
        tokio::pin!(waiting);
        assert!(futures_poll_once(waiting.as_mut()).await.is_none());
        assert_eq!(deadlines.waiting(), 1);
        tx.send(7).unwrap();
        assert_eq!(waiting.await.unwrap().unwrap(), 7);
        assert_eq!(deadlines.waiting(), 0);
        // Dropped while it waits (a cancelled call): out of the schedule too.
        let mut dropped = Box::pin(deadlines.bound(far, std::future::pending::<()>()));
        assert!(futures_poll_once(dropped.as_mut()).await.is_none());
        assert_eq!(deadlines.waiting(), 1);
        drop(dropped);
        assert_eq!(deadlines.waiting(), 0);
    }

    /// A request whose bound fired frees its slot; the next request reuses it, and the first
    /// one leaving afterwards must not take the slot from it.
    #[tokio::test]
    async fn a_reused_slot_stays_with_its_new_request() {
        let deadlines = Deadlines::default();
        let shared = &deadlines.shared;
        let at = Instant::now() + Duration::from_secs(60);
        let first = shared.insert(at, Waker::noop()).unwrap();
        // As the task does when the bound passes.
        let fired = {
            let mut s = shared.state.locked();
            s.take(first.index, first.generation)
        };
        assert!(fired.is_some());
        let second = shared.insert(at, Waker::noop()).unwrap();
        assert_eq!(second.index, first.index);
        shared.remove(&first);
        assert_eq!(deadlines.waiting(), 1);
        assert!(shared.rewake(&second, Waker::noop()));
        shared.remove(&second);
        assert_eq!(deadlines.waiting(), 0);
    }

    /// A bound due sooner than every other wakes the task: it is not kept to the later one.
    #[tokio::test]
    async fn a_sooner_bound_is_not_held_up_by_a_later_one() {
        let deadlines = Deadlines::default();
        let later = deadlines.bound(
            Instant::now() + Duration::from_secs(30),
            std::future::pending::<()>(),
        );
        tokio::pin!(later);
        assert!(futures_poll_once(later.as_mut()).await.is_none());
        // Let the task look once and plan its wake for the later bound.
        tokio::time::sleep(Duration::from_millis(5)).await;
        ends_at_its_deadline(&deadlines).await;
    }

    /// A request that never finishes, bounded `SHORT` from now, ends then. In a task of its own:
    /// only the schedule's wake-up can finish it (a timeout around the bound itself would poll
    /// it at its own expiry and see the deadline passed).
    async fn ends_at_its_deadline(deadlines: &Deadlines) {
        let theirs = deadlines.clone();
        let begun = Instant::now();
        let request = tokio::spawn(async move {
            theirs
                .bound(begun + SHORT, std::future::pending::<()>())
                .await
                .is_err()
        });
        let out = tokio::time::timeout(Duration::from_secs(5), request).await;
        assert!(matches!(out, Ok(Ok(true))), "{out:?}");
        assert!(begun.elapsed() >= SHORT);
    }

    fn current_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    fn multi_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap()
    }

    /// The task runs in the runtime of the request that started it. A request in another
    /// runtime must end at its bound while that runtime idles (a current-thread runtime
    /// outside `block_on` runs nothing), and after it shut down.
    #[test]
    fn a_bound_ends_while_the_watching_runtime_idles_or_is_gone() {
        let deadlines = Deadlines::default();
        let first = current_thread();
        let second = multi_thread();
        // The task starts in `first` and lingers there, never polled again.
        first.block_on(async {
            let far = deadlines.bound(
                Instant::now() + Duration::from_secs(60),
                std::future::pending::<()>(),
            );
            tokio::pin!(far);
            assert!(futures_poll_once(far.as_mut()).await.is_none());
        });
        let ends = || {
            second.block_on(async {
                let theirs = deadlines.clone();
                let request = tokio::spawn(async move {
                    let begun = Instant::now();
                    let out = theirs
                        .bound(begun + SHORT, std::future::pending::<()>())
                        .await;
                    (out.is_err(), begun.elapsed())
                });
                tokio::time::timeout(Duration::from_secs(5), request)
                    .await
                    .expect("the bound ended")
                    .unwrap()
            })
        };
        let (elapsed, took) = ends();
        assert!(elapsed && took >= SHORT, "{took:?}");
        drop(first);
        let (elapsed, took) = ends();
        assert!(elapsed && took >= SHORT, "{took:?}");
    }

    /// A request registered in the task's runtime and then polled in another (its future moved
    /// there) still ends after the task's runtime shuts down: the task's end wakes it, and it
    /// registers again from where it is polled.
    #[test]
    fn a_moved_bound_outlives_the_runtime_whose_task_watched_it() {
        let deadlines = Deadlines::default();
        let first = current_thread();
        let second = multi_thread();
        let limit = Duration::from_millis(300);
        let theirs = deadlines.clone();
        let (mut request, begun) = first.block_on(async move {
            let begun = Instant::now();
            let mut request = Box::pin(async move {
                theirs
                    .bound(begun + limit, std::future::pending::<()>())
                    .await
            });
            assert!(futures_poll_once(request.as_mut()).await.is_none());
            (request, begun)
        });
        assert_eq!(deadlines.waiting(), 1);
        let (polled, polled_rx) = std::sync::mpsc::channel();
        let waiting = second.spawn(async move {
            // Polled here once while `first`'s task still watches it: it waits on that task.
            assert!(futures_poll_once(request.as_mut()).await.is_none());
            polled.send(()).unwrap();
            // The limit first: at its end the request must not be polled (it would see its
            // deadline passed without anything having woken it).
            tokio::select! {
                biased;
                () = tokio::time::sleep(Duration::from_secs(5)) => None,
                out = request => Some(out),
            }
        });
        polled_rx.recv().unwrap();
        drop(first);
        let out = second.block_on(waiting).unwrap().expect("the bound ended");
        assert!(out.is_err());
        assert!(begun.elapsed() >= limit);
    }

    /// Polls `fut` once: its output if ready.
    async fn futures_poll_once<F: Future + Unpin>(mut fut: F) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            Poll::Ready(match Pin::new(&mut fut).poll(cx) {
                Poll::Ready(out) => Some(out),
                Poll::Pending => None,
            })
        })
        .await
    }
}

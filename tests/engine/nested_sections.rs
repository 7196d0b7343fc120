//! Reentrancy: nested sections on one name that a body runs at once (`join!`, `select!`, a set
//! of futures polled together) take turns; strictly nested sections run at once; a nested lease
//! handle that outlives its outer call reports the lease ended.

use crate::support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use lock_runtime::{LockOptions, Locker, LostReason};
use support::{Env, ms};

/// A balance and how many sections are inside at once (the most seen).
#[derive(Default)]
struct Account {
    balance: Mutex<i64>,
    inside: AtomicUsize,
    most_inside: AtomicUsize,
}

impl Account {
    fn new(balance: i64) -> Self {
        Self {
            balance: Mutex::new(balance),
            ..Self::default()
        }
    }

    /// Read, think, write: loses an update unless it runs alone.
    async fn withdraw(&self, amount: i64) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_inside.fetch_max(now, Ordering::SeqCst);
        let read = *self.balance.lock().unwrap();
        tokio::time::sleep(ms(20)).await;
        *self.balance.lock().unwrap() = read - amount;
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    fn balance(&self) -> i64 {
        *self.balance.lock().unwrap()
    }
}

fn opts() -> LockOptions {
    LockOptions::new(ms(10_000))
}

/// One nested section on `account`: a withdrawal under the lock.
async fn section(locker: &Locker, account: &Account, amount: i64) {
    locker
        .run("account", &opts(), async |_| account.withdraw(amount).await)
        .await
        .unwrap();
}

/// Polls every future in this task until all are done (as a `FuturesUnordered` would).
async fn poll_together(mut futures: Vec<Pin<Box<dyn Future<Output = ()> + '_>>>) {
    std::future::poll_fn(|cx| {
        futures.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if futures.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

/// Runs `body` in a section on "account", with an account of 100, then checks that the sections
/// `body` nested in it took turns (never two inside at once) and left `balance`.
async fn nested_sections_take_turns(balance: i64, body: impl AsyncFnOnce(&Locker, &Account)) {
    let env = Env::start().await;
    let locker = &env.locker;
    let account = Account::new(100);
    locker
        .run("account", &opts(), async |_| body(locker, &account).await)
        .await
        .unwrap();
    assert_eq!(account.balance(), balance);
    assert_eq!(account.most_inside.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_sections_joined_in_one_body_take_turns() {
    nested_sections_take_turns(80, async |locker, account| {
        tokio::join!(section(locker, account, 10), section(locker, account, 10));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_sections_polled_together_take_turns_in_order() {
    let order = Mutex::new(Vec::new());
    nested_sections_take_turns(100 - 15, async |locker, account| {
        let futures = (0..5)
            .map(|i| {
                let order = &order;
                Box::pin(async move {
                    locker
                        .run("account", &opts(), async |_| {
                            order.lock().unwrap().push(i);
                            account.withdraw(i + 1).await
                        })
                        .await
                        .unwrap();
                }) as Pin<Box<dyn Future<Output = ()>>>
            })
            .collect();
        poll_together(futures).await;
    })
    .await;
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
}

/// `select!` drops the section that loses the race: the winner ran alone, and the loser,
/// cancelled while it waited for its turn, leaves nothing behind (the next section runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_sections_in_a_select_take_turns_and_the_loser_leaves_no_trace() {
    nested_sections_take_turns(85, async |locker, account| {
        tokio::select! {
            biased;
            () = section(locker, account, 10) => {}
            () = section(locker, account, 30) => {}
        }
        tokio::time::timeout(Duration::from_secs(5), section(locker, account, 5))
            .await
            .expect("a section after the select runs");
    })
    .await;
}

/// Strictly nested sections run at once, under the same lease and fence, at any depth, also
/// inside sections that take turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strictly_nested_sections_run_at_once_under_the_same_fence() {
    let env = Env::start().await;
    let locker = &env.locker;
    let fences = Mutex::new(Vec::new());
    let inner = async |depth: usize| {
        locker
            .run("account", &opts(), async |outer| {
                let fence = locker
                    .run("account", &opts(), async |inner| {
                        locker
                            .run("account", &opts(), async |innermost| innermost.fence())
                            .await
                            .unwrap()
                            .max(inner.fence())
                    })
                    .await
                    .unwrap();
                fences.lock().unwrap().push((depth, outer.fence(), fence));
            })
            .await
            .unwrap();
    };
    let outer = tokio::time::timeout(
        Duration::from_secs(5),
        locker.run("account", &opts(), async |lease| {
            tokio::join!(inner(1), inner(2));
            lease.fence()
        }),
    )
    .await
    .expect("no section waits for the one around it")
    .unwrap();
    let fences = fences.lock().unwrap();
    assert_eq!(fences.len(), 2);
    assert!(fences.iter().all(|&(_, a, b)| a == outer && b == outer));
}

/// A lease handle returned by a nested `acquire` outlives the outer call: once the outer call
/// released the lock (and another locker took it), the handle is not held and `lost()` says
/// the lease was released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escaped_nested_lease_is_not_held_after_its_outer_call() {
    let env = Env::start().await;
    let locker = &env.locker;
    let escaped = locker
        .run("account", &opts(), async |_| {
            let nested = locker.acquire("account", &opts()).await.unwrap();
            assert!(nested.is_held());
            nested
        })
        .await
        .unwrap();
    assert!(!escaped.is_held());
    let reason = tokio::time::timeout(Duration::from_secs(2), escaped.lost())
        .await
        .expect("lost() completes on a handle to an ended lease");
    assert_eq!(reason, LostReason::Released);
    let other = env.second_locker().await;
    let lease = other.acquire("account", &opts()).await.unwrap();
    assert!(!escaped.is_held());
    // Dropping or releasing the escaped handle does not touch the new holder's key.
    escaped.release().await.unwrap();
    assert!(lease.is_held());
    lease.release().await.unwrap();
}

/// A handle waiting in `lost()` (in another task) while the outer call ends is woken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_wakes_when_the_outer_call_ends() {
    let env = Env::start().await;
    let locker = &env.locker;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let watcher = tokio::spawn(async move {
        let nested: lock_runtime::Lease = rx.await.unwrap();
        nested.lost().await
    });
    locker
        .run("account", &opts(), async |_| {
            let nested = locker.acquire("account", &opts()).await.unwrap();
            tx.send(nested).unwrap();
            tokio::time::sleep(ms(100)).await;
            assert!(!watcher.is_finished(), "lost() completed while held");
        })
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), watcher)
        .await
        .expect("lost() completes")
        .unwrap();
    assert_eq!(reason, LostReason::Released);
}

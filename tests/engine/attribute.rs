//! `#[distributed_lock]` against a real redis-server: the generated code goes through the same
//! engine path as `Locker::run`, so each return path, deadline and wait behaves the same.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use lock_runtime::{LockError, Locker, LostReason, distributed_lock};
use support::{Env, eventually, ms};
use tokio::time::Instant;

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Invalid,
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

/// A service that holds its own locker, as a real one would.
struct Ledger {
    locker: Locker,
    inside: AtomicBool,
    overlaps: AtomicUsize,
    fences: Mutex<Vec<u64>>,
}

impl Ledger {
    fn new(locker: Locker) -> Self {
        Self {
            locker,
            inside: AtomicBool::new(false),
            overlaps: AtomicUsize::new(0),
            fences: Mutex::default(),
        }
    }

    #[distributed_lock(name = "ledger", ttl = "5s", wait = "20s", locker = self.locker, guard = lease)]
    async fn post(&self, shared: &Ledger) -> Result<u64, AppError> {
        if shared.inside.swap(true, Ordering::SeqCst) {
            shared.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        shared.fences.lock().unwrap().push(lease.fence());
        tokio::task::yield_now().await;
        shared.inside.store(false, Ordering::SeqCst);
        Ok(lease.fence())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_on_two_lockers_exclude_each_other() {
    let env = Env::start().await;
    let shared = Arc::new(Ledger::new(env.locker.clone()));
    let ledgers = [
        Arc::new(Ledger::new(env.locker.clone())),
        Arc::new(Ledger::new(env.second_locker().await)),
    ];
    let mut tasks = Vec::new();
    for t in 0..8 {
        let (ledger, shared) = (Arc::clone(&ledgers[t % 2]), Arc::clone(&shared));
        tasks.push(tokio::spawn(async move {
            for _ in 0..100 {
                ledger.post(&shared).await.expect("posted");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(shared.overlaps.load(Ordering::SeqCst), 0);
    let fences = shared.fences.lock().unwrap();
    assert_eq!(fences.len(), 800);
    assert!(fences.windows(2).all(|w| w[0] < w[1]));
}

#[distributed_lock(name = "paths", ttl = "30s", locker = locker)]
async fn returns(locker: &Locker, how: &str) -> Result<u32, AppError> {
    if how == "early" {
        return Ok(2);
    }
    match how {
        "ok" => Ok(1),
        "question-mark" => {
            Err(AppError::Invalid)?;
            Ok(3)
        }
        "panic" => panic!("body panicked"),
        _ => {
            std::future::pending::<()>().await;
            Ok(4)
        }
    }
}

#[tokio::test]
async fn every_return_path_releases_the_key() {
    let env = Env::start().await;
    let key = env.key("paths");
    assert_eq!(returns(&env.locker, "ok").await.unwrap(), 1);
    assert!(!env.exists(&key).await, "normal return");
    assert_eq!(returns(&env.locker, "early").await.unwrap(), 2);
    assert!(!env.exists(&key).await, "early return");
    assert!(matches!(
        returns(&env.locker, "question-mark").await,
        Err(AppError::Invalid)
    ));
    assert!(!env.exists(&key).await, "`?`");
    let locker = env.locker.clone();
    let panicked = tokio::spawn(async move { returns(&locker, "panic").await })
        .await
        .unwrap_err();
    assert!(
        panicked.is_panic(),
        "the panic is resumed after the release"
    );
    assert!(!env.exists(&key).await, "panic");
    let locker = env.locker.clone();
    let task = tokio::spawn(async move { returns(&locker, "forever").await });
    eventually(ms(2_000), "the body holds the key", || async {
        env.exists(&key).await
    })
    .await;
    task.abort();
    eventually(
        ms(200),
        "released after the caller dropped the future",
        || async { !env.exists(&key).await },
    )
    .await;
}

#[distributed_lock(name = "deadline", ttl = "2s", max_exec = "150ms", locker = locker)]
async fn too_slow(locker: &Locker, finished: &AtomicBool) -> Result<(), AppError> {
    tokio::time::sleep(ms(5_000)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(name = "stolen", ttl = "10s", renew = "50ms", locker = locker)]
async fn until_stolen(
    locker: &Locker,
    started: tokio::sync::mpsc::Sender<()>,
) -> Result<(), AppError> {
    started.send(()).await.unwrap();
    tokio::time::sleep(ms(5_000)).await;
    Ok(())
}

#[tokio::test]
async fn max_exec_and_loss_cancel_the_body() {
    let env = Env::start().await;
    let finished = AtomicBool::new(false);
    let start = Instant::now();
    let err = too_slow(&env.locker, &finished).await.unwrap_err();
    assert!(
        matches!(err, AppError::Lock(LockError::MaxExecExceeded { .. })),
        "{err:?}"
    );
    assert!(start.elapsed() < ms(1_000) && !finished.load(Ordering::SeqCst));
    assert!(!env.exists(&env.key("deadline")).await);

    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let locker = env.locker.clone();
    let task = tokio::spawn(async move { until_stolen(&locker, tx).await });
    rx.recv().await.unwrap();
    env.del(&env.key("stolen")).await;
    let err = task.await.unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            AppError::Lock(LockError::Lost {
                reason: LostReason::NotOwner,
                ..
            })
        ),
        "{err:?}"
    );
}

#[distributed_lock(name = "tenant:{tenant}", ttl = "5s", wait = "5s", locker = locker)]
async fn per_tenant(
    locker: &Locker,
    tenant: &str,
    log: &Mutex<Vec<(String, bool)>>,
) -> Result<(), AppError> {
    log.lock().unwrap().push((tenant.to_owned(), true));
    tokio::time::sleep(ms(100)).await;
    log.lock().unwrap().push((tenant.to_owned(), false));
    Ok(())
}

/// Runs two calls for these tenants side by side; returns the enter (true) / leave order.
async fn side_by_side(locker: &Locker, tenants: [&str; 2]) -> Vec<bool> {
    let log = Mutex::new(Vec::new());
    let (a, b) = tokio::join!(
        per_tenant(locker, tenants[0], &log),
        per_tenant(locker, tenants[1], &log)
    );
    a.unwrap();
    b.unwrap();
    log.into_inner()
        .unwrap()
        .into_iter()
        .map(|(_, enter)| enter)
        .collect()
}

#[tokio::test]
async fn the_key_comes_from_the_arguments() {
    let env = Env::start().await;
    let events = side_by_side(&env.locker, ["acme", "globex"]).await;
    assert_eq!(
        events,
        [true, true, false, false],
        "different tenants run in parallel"
    );
    let events = side_by_side(&env.locker, ["acme", "acme"]).await;
    assert_eq!(
        events,
        [true, false, true, false],
        "the same tenant serialises"
    );
    assert_eq!(env.key("tenant:acme"), "lock:{tenant:acme}");
}

#[distributed_lock(name = "busy", ttl = "5s", wait = "200ms", locker = locker)]
async fn wait_briefly(locker: &Locker) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(name = "job", ttl = "2s", min_hold = "300ms", locker = locker)]
async fn scheduled_job(locker: &Locker, runs: &AtomicUsize) {
    runs.fetch_add(1, Ordering::SeqCst);
}

#[tokio::test]
async fn wait_busy_and_min_hold() {
    let env = Env::start().await;
    let holder = env
        .locker
        .acquire("busy", &support::opts(5_000))
        .await
        .unwrap();
    let start = Instant::now();
    let err = wait_briefly(&env.locker).await.unwrap_err();
    assert!(
        matches!(err, AppError::Lock(LockError::Busy { .. })),
        "{err:?}"
    );
    assert!(start.elapsed() >= ms(200));
    holder.release().await.unwrap();
    wait_briefly(&env.locker).await.unwrap();

    // A `()` job: the second call within min_hold finds the key held, logs and returns.
    let runs = AtomicUsize::new(0);
    let logs = support::capture_logs(async {
        scheduled_job(&env.locker, &runs).await;
        scheduled_job(&env.locker, &runs).await;
    })
    .await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "min_hold kept the second run out"
    );
    assert!(
        logs.iter()
            .any(|l| l.contains("job") && l.contains("held elsewhere")),
        "{logs:?}"
    );
    let pttl = env.pttl(&env.key("job")).await;
    assert!(pttl > 0 && pttl <= 300, "{pttl}");
}

#[tokio::test]
async fn the_generated_future_is_send_and_spawnable() {
    let env = Env::start().await;
    let locker = env.locker.clone();
    let v = tokio::spawn(async move { returns(&locker, "ok").await })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v, 1);
}

#[distributed_lock(name = "fenced", ttl = "5s", locker = locker, guard = lease)]
async fn fenced(locker: &Locker) -> Result<u64, AppError> {
    Ok(lease.fence())
}

/// A guard-less body cannot see its lease; a nested call inside it that can see one gets it.
#[distributed_lock(name = "fenced", ttl = "5s", locker = locker)]
async fn unguarded(
    locker: &Locker,
    env: &Env,
    nested: bool,
) -> Result<(Option<String>, Option<u64>), AppError> {
    let counter = env.get(&format!("{}:fence", env.key("fenced"))).await;
    let fence = match nested {
        true => Some(fenced(locker).await?),
        false => None,
    };
    Ok((counter, fence))
}

#[tokio::test]
async fn a_body_without_guard_takes_no_fence_and_a_nested_guarded_call_gets_a_greater_one() {
    let env = Env::start().await;
    let counter_key = format!("{}:fence", env.key("fenced"));
    let first = fenced(&env.locker).await.unwrap();
    assert_eq!(env.get(&counter_key).await, Some(first.to_string()));

    // Unguarded: neither the clock nor the counter is read, nor the counter written.
    env.reset_stats().await;
    let (seen, _) = unguarded(&env.locker, &env, false).await.unwrap();
    assert_eq!(seen, Some(first.to_string()));
    assert_eq!(env.get(&counter_key).await, Some(first.to_string()));
    assert_eq!(env.calls("time").await, 0, "no fence, no clock");
    assert!(!env.exists(&env.key("fenced")).await, "released");

    // A nested guarded call computes the fence while the outer call holds the key.
    let (_, nested) = unguarded(&env.locker, &env, true).await.unwrap();
    let nested = nested.unwrap();
    assert!(nested > first, "{nested} after {first}");
    assert_eq!(env.get(&counter_key).await, Some(nested.to_string()));
    let last = fenced(&env.locker).await.unwrap();
    assert!(last > nested, "{last} after {nested}");
}

/// Whose nested guarded call finds the key taken by someone else: the fence is refused.
#[distributed_lock(name = "fenced", ttl = "5s", locker = locker)]
async fn unguarded_then_stolen(locker: &Locker, env: &Env) -> Result<u64, AppError> {
    let mut raw = env.raw.clone();
    let _: () = redis::cmd("SET")
        .arg(env.key("fenced"))
        .arg("someone-else")
        .query_async(&mut raw)
        .await
        .unwrap();
    fenced(locker).await
}

#[tokio::test]
async fn a_nested_fence_is_not_computed_for_a_key_that_is_no_longer_ours() {
    let env = Env::start().await;
    let counter_key = format!("{}:fence", env.key("fenced"));
    let first = fenced(&env.locker).await.unwrap();
    let out = unguarded_then_stolen(&env.locker, &env).await;
    assert!(
        matches!(
            out,
            Err(AppError::Lock(LockError::Lost {
                reason: LostReason::NotOwner,
                ..
            }))
        ),
        "{out:?}"
    );
    // Nothing of the other holder's was touched: its value, and the counter.
    assert_eq!(
        env.get(&env.key("fenced")).await.as_deref(),
        Some("someone-else")
    );
    assert_eq!(env.get(&counter_key).await, Some(first.to_string()));
}

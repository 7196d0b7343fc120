//! `Locker::in_memory()`: what a user's tests rely on beyond the behaviour cases it shares with
//! the Redis deployments (`behaviour.rs`): paused time, `min_hold`, `max_exec`, inspection and
//! operator release, nested sections, and lockers that share nothing. No server is started.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockError, LockOptions, Locker, LostReason, distributed_lock};
use tokio::time::Instant;

use crate::support::ms;

#[distributed_lock(name = "nightly", ttl = "30s", wait = "5m", guard = lease, locker = locker)]
async fn nightly(
    locker: &Locker,
    runs: Arc<Mutex<Vec<(usize, u64)>>>,
    i: usize,
) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_secs(20)).await;
    runs.lock().unwrap().push((i, lease.fence()));
    Ok(())
}

/// Waits, in paused time, until `n` callers queue on `name`.
async fn queued(locker: &Locker, name: &str, n: usize) {
    for _ in 0..1000 {
        let info = locker.inspect(name).await.unwrap();
        if info.is_some_and(|i| i.waiters.len() == n) {
            return;
        }
        tokio::time::sleep(ms(1)).await;
    }
    panic!("{n} callers never queued on {name}");
}

#[tokio::test(start_paused = true)]
async fn a_30s_job_with_three_queued_callers_runs_on_paused_time() {
    let locker = Locker::in_memory();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let (started, real) = (Instant::now(), std::time::Instant::now());
    let mut calls = Vec::new();
    for i in 0..4 {
        let (caller, runs) = (locker.clone(), Arc::clone(&runs));
        calls.push(tokio::spawn(async move { nightly(&caller, runs, i).await }));
        // The next caller comes once this one holds the lock or has its place in line.
        match i {
            0 => {
                while locker.inspect("nightly").await.unwrap().is_none() {
                    tokio::time::sleep(ms(1)).await;
                }
            }
            i => queued(&locker, "nightly", i).await,
        }
    }
    for call in calls {
        call.await.unwrap().unwrap();
    }
    let runs = runs.lock().unwrap().clone();
    let order: Vec<usize> = runs.iter().map(|(i, _)| *i).collect();
    assert_eq!(order, [0, 1, 2, 3], "served in arrival order");
    assert!(
        runs.windows(2).all(|w| w[0].1 < w[1].1),
        "fences grow: {runs:?}"
    );
    // Four bodies of 20 s ran one after another on tokio's clock, each renewed twice.
    assert!(
        started.elapsed() >= Duration::from_secs(80),
        "{:?}",
        started.elapsed()
    );
    eprintln!(
        "80 s of locked work ran in {:?} of real time",
        real.elapsed()
    );
    assert!(
        locker.inspect("nightly").await.unwrap().is_none(),
        "released"
    );
}

#[tokio::test(start_paused = true)]
async fn min_hold_keeps_the_lock_after_a_short_body() {
    let locker = Locker::in_memory();
    let o = LockOptions::new(Duration::from_secs(60)).with_min_hold(Duration::from_secs(50));
    locker.run("tick", &o, async |_| ()).await.unwrap();
    let again = locker.run("tick", &o, async |_| ()).await;
    assert!(matches!(again, Err(LockError::Busy { .. })), "{again:?}");
    tokio::time::sleep(Duration::from_secs(51)).await;
    locker.run("tick", &o, async |_| ()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_body_past_max_exec_is_cancelled_and_the_lock_freed() {
    let locker = Locker::in_memory();
    let o = LockOptions::new(Duration::from_secs(30)).with_max_exec(Duration::from_secs(10));
    let out = locker
        .run("slow", &o, async |_| {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        })
        .await;
    assert!(
        matches!(out, Err(LockError::MaxExecExceeded { .. })),
        "{out:?}"
    );
    assert!(locker.inspect("slow").await.unwrap().is_none());
    locker.run("slow", &o, async |_| ()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_lease_outlives_its_ttl_only_while_renewed() {
    let locker = Locker::in_memory();
    let o = LockOptions::new(Duration::from_secs(5));
    let lease = locker.acquire("renewed", &o).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(lease.is_held(), "renewed on tokio's clock");
    let info = locker.inspect("renewed").await.unwrap().expect("held");
    assert!(info.ttl_left.is_some_and(|t| t <= Duration::from_secs(5)));
    lease.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn inspection_lists_and_an_operator_releases() {
    let locker = Locker::in_memory();
    let o = LockOptions::new(Duration::from_secs(30));
    let a = locker.acquire("invoice:1", &o).await.unwrap();
    let _b = locker.acquire("invoice:2", &o).await.unwrap();
    let two = LockOptions::new(Duration::from_secs(30)).with_permits(2);
    let _p = locker.acquire("export", &two).await.unwrap();
    let names: Vec<String> = locker
        .list("invoice:*")
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(names, ["invoice:1", "invoice:2"]);
    let export = locker.inspect("export").await.unwrap().expect("held");
    assert_eq!((export.permits, export.holders.len()), (Some(2), 1));
    let info = locker.inspect("invoice:1").await.unwrap().expect("held");
    let who = info.holder.as_ref().expect("a holder of ours");
    assert!(a.token().starts_with(&who.token), "{who:?}");
    assert_eq!(
        (info.value.as_str(), who.pid),
        (a.token(), std::process::id())
    );
    assert!(
        !locker
            .force_release("invoice:1", "not-its-value")
            .await
            .unwrap()
    );
    assert!(
        locker
            .force_release("invoice:1", &info.value)
            .await
            .unwrap()
    );
    let lost = tokio::time::timeout(Duration::from_secs(20), a.lost()).await;
    assert_eq!(lost.expect("the holder learns it"), LostReason::NotOwner);
}

#[tokio::test]
async fn a_nested_section_runs_under_the_held_lease() {
    let locker = Locker::in_memory();
    let o = LockOptions::new(Duration::from_secs(30));
    let inner = locker.clone();
    let fences = locker
        .run("account:7", &o, async |outer| {
            let nested = inner
                .run("account:7", &o, async |lease| lease.fence())
                .await
                .unwrap();
            (outer.fence(), nested)
        })
        .await
        .unwrap();
    assert_eq!(fences.0, fences.1);
}

#[tokio::test]
async fn two_in_memory_lockers_share_no_lock() {
    let (a, b) = (Locker::in_memory(), Locker::in_memory());
    let o = LockOptions::new(Duration::from_secs(30));
    let _held = a.acquire("job", &o).await.unwrap();
    b.acquire("job", &o).await.unwrap().release().await.unwrap();
    let busy = a.clone().acquire("job", &o).await;
    assert!(
        matches!(busy, Err(LockError::Busy { .. })),
        "clones share locks"
    );
}

#[tokio::test]
async fn replicas_are_refused_in_memory() {
    let err = Locker::builder()
        .in_memory()
        .replicas(1)
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("in-memory locker has none"), "{err}");
}

#[test]
fn each_runtime_has_locks_of_its_own() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let (a, b) = (runtime(), runtime());
    let locker = Locker::in_memory();
    let o = LockOptions::new(Duration::from_secs(30));
    let held_in_a = a.block_on(locker.acquire("job", &o)).unwrap();
    let held_in_b = b.block_on(locker.acquire("job", &o)).unwrap();
    a.block_on(async {
        let busy = locker.clone().acquire("job", &o).await;
        assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
        let info = locker.inspect("job").await.unwrap().expect("held");
        assert_eq!(info.value, held_in_a.token());
    });
    b.block_on(async {
        let info = locker.inspect("job").await.unwrap().expect("held");
        assert_eq!(info.value, held_in_b.token());
        held_in_b.release().await.unwrap();
    });
    a.block_on(held_in_a.release()).unwrap();
}

/// A locker shared by a runtime on real time and one on paused time (tests sharing the default
/// locker): the paused one's lease is renewed on its own clock, by its own engine.
#[test]
fn a_lease_on_paused_time_is_renewed_beside_a_real_time_runtime() {
    let locker = Locker::in_memory();
    let o = LockOptions::new(Duration::from_secs(5));
    let (started, start) = std::sync::mpsc::channel();
    let (done, finish) = tokio::sync::oneshot::channel::<()>();
    let real = {
        let (locker, o) = (locker.clone(), o);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                // First to renew anything: a single engine shared by both runtimes would renew
                // every lease from here, on real time.
                let lease = locker.acquire("on-real-time", &o).await.unwrap();
                started.send(()).unwrap();
                let _ = finish.await;
                lease.release().await.unwrap();
            });
        })
    };
    start.recv().unwrap();
    let paused = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    paused.block_on(async {
        let lease = locker.acquire("on-paused-time", &o).await.unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(lease.is_held(), "renewed on the paused clock");
        lease.release().await.unwrap();
    });
    done.send(()).unwrap();
    real.join().unwrap();
}

#[tokio::test(start_paused = true)]
async fn leadership_passes_on_resignation_and_watchers_see_it() {
    let locker = Locker::in_memory();
    let o = LockOptions::new(Duration::from_secs(10));
    let mut watch = locker.observe("scheduler");
    assert!(watch.changed().await.unwrap().is_none(), "nobody leads yet");
    let first = locker.campaign("scheduler", &o).await.unwrap();
    let seen = watch.changed().await.unwrap().expect("a leader");
    assert_eq!(seen.value, first.token());
    let next = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.campaign("scheduler", &o).await.unwrap() })
    };
    queued(&locker, "scheduler", 1).await;
    let first_term = first.fence();
    first.release().await.unwrap();
    let next = next.await.unwrap();
    assert!(next.fence() > first_term, "terms grow");
    loop {
        let seen = watch.changed().await.unwrap();
        if seen.is_some_and(|s| s.value.starts_with(next.token())) {
            break;
        }
    }
    next.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn transfers_both_ways_take_both_accounts_without_deadlock() {
    let locker = Locker::in_memory();
    let o = LockOptions::new(Duration::from_secs(10)).with_wait(Duration::from_secs(60));
    let balances = Arc::new(Mutex::new([1_000i64, 1_000]));
    let transfer = |names: [&'static str; 2], from: usize| {
        let (locker, balances) = (locker.clone(), Arc::clone(&balances));
        tokio::spawn(async move {
            for _ in 0..200 {
                let leases = locker.acquire_all(&names, &o).await.unwrap();
                {
                    let mut b = balances.lock().unwrap();
                    b[from] -= 1;
                    b[1 - from] += 1;
                }
                tokio::task::yield_now().await;
                for lease in leases {
                    lease.release().await.unwrap();
                }
            }
        })
    };
    let (ab, ba) = (transfer(["a", "b"], 0), transfer(["b", "a"], 1));
    ab.await.unwrap();
    ba.await.unwrap();
    assert_eq!(*balances.lock().unwrap(), [1_000, 1_000]);
    assert!(
        locker.list("*").await.unwrap().is_empty(),
        "nothing left held"
    );
}

//! The `metrics` feature: counters, histograms and the gauges of held leases and waiting calls,
//! labelled by the name's template and the mode of the hold, read back through the facade's
//! debugging recorder (one test per binary: the recorder is global).

pub mod support;

use std::collections::HashMap;

use lock_runtime::{LockError, LockOptions, Locker, distributed_lock};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::{Env, eventually, ms, opts};

#[distributed_lock(name = "invoice:{id}", ttl = "1s", locker = locker)]
async fn invoice(locker: &Locker, id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(name = "slow:{id}", ttl = "1s", max_exec = "30ms", locker = locker)]
async fn slow(locker: &Locker, id: u32) -> Result<(), LockError> {
    let _ = id;
    tokio::time::sleep(ms(5_000)).await;
    Ok(())
}

/// A metric's name and its `lock` and `mode` labels.
type Series = (String, String, String);

/// Every metric so far: `(name, lock label, mode label) -> value`, counters and gauges as
/// numbers, histograms as their number of samples. A debugging snapshot hands each value over
/// once (it resets counters and gauges to 0 and drains histograms), so the snapshots are added
/// up.
struct Totals {
    snapshotter: metrics_util::debugging::Snapshotter,
    totals: std::sync::Mutex<HashMap<Series, f64>>,
}

impl Totals {
    /// The series so far, with the latest snapshot added.
    fn all(&self) -> std::sync::MutexGuard<'_, HashMap<Series, f64>> {
        let mut totals = self.totals.lock().unwrap();
        for (key, v) in snapshot(&self.snapshotter) {
            *totals.entry(key).or_insert(0.0) += v;
        }
        totals
    }

    /// The value of `name` for the lock label `lock`, whatever its mode.
    fn get(&self, name: &str, lock: &str) -> f64 {
        self.all()
            .iter()
            .filter(|((n, l, _), _)| n == name && l == lock)
            .map(|(_, v)| v)
            .sum()
    }

    /// The value of `name` for the lock label `lock` in `mode`.
    fn get_in(&self, name: &str, lock: &str, mode: &str) -> f64 {
        let key = (name.to_owned(), lock.to_owned(), mode.to_owned());
        self.all().get(&key).copied().unwrap_or(0.0)
    }

    /// The modes recorded for the lock label `lock`, sorted.
    fn modes(&self, lock: &str) -> Vec<String> {
        let mut modes: Vec<String> = self
            .all()
            .keys()
            .filter(|(_, l, _)| l == lock)
            .map(|(_, _, mode)| mode.clone())
            .collect();
        modes.sort();
        modes.dedup();
        modes
    }

    fn labels(&self) -> Vec<String> {
        self.all().keys().map(|(_, lock, _)| lock.clone()).collect()
    }
}

fn snapshot(snapshotter: &metrics_util::debugging::Snapshotter) -> Vec<(Series, f64)> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let label = |name: &str| {
                key.labels()
                    .find(|l| l.key() == name)
                    .map(|l| l.value().to_owned())
                    .unwrap_or_default()
            };
            let v = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(samples) => samples.len() as f64,
            };
            ((key.name().to_owned(), label("lock"), label("mode")), v)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_each_outcome_by_template() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");
    let env = Env::start().await;
    let m = Totals {
        snapshotter,
        totals: Default::default(),
    };

    // Ten calls on ten rendered names: one label, the template.
    for id in 0..10 {
        assert_eq!(invoice(&env.locker, id).await.unwrap(), id);
    }
    assert_eq!(m.get("lock_acquired_total", "invoice:{id}"), 10.0);
    let labels = m.labels();
    assert!(
        !labels
            .iter()
            .any(|l| l.starts_with("invoice:") && l != "invoice:{id}"),
        "{labels:?}"
    );
    assert_eq!(m.get("lock_wait_seconds", "invoice:{id}"), 10.0);
    assert_eq!(m.get("lock_hold_seconds", "invoice:{id}"), 10.0);

    // Busy: a held name, tried once.
    let holder = env.locker.acquire("invoice:3", &opts(5_000)).await.unwrap();
    let err = invoice(&env.locker, 3).await.unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }));
    assert_eq!(m.get("lock_busy_total", "invoice:{id}"), 1.0);
    // The gauge counts the held lease; by the manual API, its label is its name.
    assert_eq!(m.get("lock_leases_held", "invoice:3"), 1.0);
    holder.release().await.unwrap();
    assert_eq!(m.get("lock_leases_held", "invoice:3"), 0.0);

    // max_exec.
    let err = slow(&env.locker, 1).await.unwrap_err();
    assert!(matches!(err, LockError::MaxExecExceeded { .. }));
    assert_eq!(m.get("lock_max_exec_total", "slow:{id}"), 1.0);

    // A renewal, then a loss: the key is taken away under a held lease.
    let templated = LockOptions::new(ms(300)).with_template("held:{n}");
    let lease = env.locker.acquire("held:1", &templated).await.unwrap();
    eventually(ms(2_000), "a confirmed renewal", || {
        let renewed = m.get("lock_renewal_seconds", "held:{n}");
        async move { renewed >= 1.0 }
    })
    .await;
    env.del(&env.key("held:1")).await;
    tokio::time::timeout(ms(2_000), lease.lost()).await.unwrap();
    // Counted by the watchdog right after it marks the loss, on its own thread.
    eventually(ms(2_000), "the loss counted", || {
        let lost = m.get("lock_lost_total", "held:{n}");
        async move { lost == 1.0 }
    })
    .await;
    drop(lease);
    assert_eq!(m.get("lock_leases_held", "held:{n}"), 0.0);

    // A release that cannot be confirmed: the server is frozen.
    let lease = env.locker.acquire("frozen", &opts(5_000)).await.unwrap();
    env.server.pause();
    let released = lease.release().await;
    env.server.resume();
    assert!(released.is_err());
    assert_eq!(m.get("lock_release_failures_total", "frozen"), 1.0);
    // Every invoice lease ended: the gauge of the template is back to 0.
    assert_eq!(m.get("lock_leases_held", "invoice:{id}"), 0.0);

    contention_is_counted_and_waiting_calls_gauged(&env, &m).await;
    permits_are_labelled_by_their_mode(&env, &m).await;
    in_memory_calls_are_counted_alike(&m).await;
    // Last: it stops the server.
    unlocked_runs_are_counted(&env, &m).await;
}

/// A `Locker::in_memory()` counts its calls under the same names and labels.
async fn in_memory_calls_are_counted_alike(m: &Totals) {
    let locker = Locker::in_memory();
    let before = m.get("lock_acquired_total", "invoice:{id}");
    assert_eq!(invoice(&locker, 100).await.unwrap(), 100);
    assert_eq!(m.get("lock_acquired_total", "invoice:{id}"), before + 1.0);
    let busy = m.get("lock_busy_total", "invoice:{id}");
    let holder = locker.acquire("invoice:100", &opts(5_000)).await.unwrap();
    assert_eq!(m.get("lock_leases_held", "invoice:100"), 1.0);
    assert!(matches!(
        invoice(&locker, 100).await,
        Err(LockError::Busy { .. })
    ));
    assert_eq!(m.get("lock_busy_total", "invoice:{id}"), busy + 1.0);
    holder.release().await.unwrap();
    assert_eq!(m.get("lock_leases_held", "invoice:100"), 0.0);
    let err = slow(&locker, 2).await.unwrap_err();
    assert!(matches!(err, LockError::MaxExecExceeded { .. }));
    assert_eq!(m.get("lock_max_exec_total", "slow:{id}"), 2.0);
}

/// A `fail_open` call that finds Redis unreachable runs unlocked and is counted as such; a
/// locked run is not.
async fn unlocked_runs_are_counted(env: &Env, m: &Totals) {
    let fail_open = opts(2_000).with_fail_open(true).with_template("warm:{n}");
    env.locker
        .run("warm:1", &fail_open, async |_| ())
        .await
        .unwrap();
    assert_eq!(m.get("lock_unlocked_runs_total", "warm:{n}"), 0.0);
    env.server.kill();
    for _ in 0..2 {
        env.locker
            .run("warm:1", &fail_open, async |_| ())
            .await
            .unwrap();
    }
    assert_eq!(
        m.get_in("lock_unlocked_runs_total", "warm:{n}", "exclusive"),
        2.0
    );
}

/// A call that finds the lock held counts once in `lock_contended_total`, whether it tried once
/// or waited; a waiting call is in `lock_waiters` until it gets the lock or is dropped.
async fn contention_is_counted_and_waiting_calls_gauged(env: &Env, m: &Totals) {
    let holder = env.locker.acquire("queue", &opts(5_000)).await.unwrap();
    let err = env.locker.acquire("queue", &opts(5_000)).await.unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }), "{err}");
    assert_eq!(m.get("lock_contended_total", "queue"), 1.0);
    assert_eq!(m.get("lock_waiters", "queue"), 0.0);

    let waiter = || {
        let locker = env.locker.clone();
        tokio::spawn(async move {
            let waiting = opts(5_000).with_wait(ms(30_000));
            let lease = locker.acquire("queue", &waiting).await.unwrap();
            lease.release().await.unwrap();
        })
    };
    let (first, second) = (waiter(), waiter());
    eventually(ms(5_000), "two calls waiting", || {
        let waiting = m.get("lock_waiters", "queue");
        async move { waiting == 2.0 }
    })
    .await;
    assert_eq!(m.get("lock_contended_total", "queue"), 3.0);
    // A waiting call dropped leaves the gauge.
    second.abort();
    assert!(second.await.unwrap_err().is_cancelled());
    eventually(ms(5_000), "one call waiting", || {
        let waiting = m.get("lock_waiters", "queue");
        async move { waiting == 1.0 }
    })
    .await;
    // The other gets the lock once it is released, and leaves the gauge too.
    holder.release().await.unwrap();
    first.await.unwrap();
    assert_eq!(m.get("lock_waiters", "queue"), 0.0);
    assert_eq!(m.get("lock_contended_total", "queue"), 3.0);
    assert_eq!(m.get("lock_acquired_total", "queue"), 2.0);
}

/// Three holders of a lock with 3 permits are counted under `mode="permits"`, a fourth caller's
/// `Busy` too, shared holders under `mode="shared"`; the exclusive locks of the test before are
/// `mode="exclusive"`.
async fn permits_are_labelled_by_their_mode(env: &Env, m: &Totals) {
    assert_eq!(
        m.get_in("lock_acquired_total", "invoice:{id}", "exclusive"),
        10.0
    );
    assert_eq!(
        m.get_in("lock_acquired_total", "invoice:{id}", "permits"),
        0.0
    );
    let o = LockOptions::new(ms(5_000)).with_permits(3);
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(env.locker.acquire("pool", &o).await.unwrap());
    }
    assert_eq!(m.get_in("lock_acquired_total", "pool", "permits"), 3.0);
    assert_eq!(m.get_in("lock_leases_held", "pool", "permits"), 3.0);
    let err = env.locker.acquire("pool", &o).await.unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }), "{err}");
    assert_eq!(m.get_in("lock_busy_total", "pool", "permits"), 1.0);
    assert_eq!(m.get_in("lock_wait_seconds", "pool", "permits"), 4.0);
    for lease in leases {
        lease.release().await.unwrap();
    }
    assert_eq!(m.get_in("lock_leases_held", "pool", "permits"), 0.0);
    assert_eq!(m.get_in("lock_hold_seconds", "pool", "permits"), 3.0);
    // Two shared holders of a read-write lock are counted under `mode="shared"`.
    let shared = LockOptions::new(ms(5_000)).with_shared(true);
    let a = env.locker.acquire("catalog", &shared).await.unwrap();
    let b = env.locker.acquire("catalog", &shared).await.unwrap();
    assert_eq!(m.get_in("lock_leases_held", "catalog", "shared"), 2.0);
    a.release().await.unwrap();
    b.release().await.unwrap();
    assert_eq!(m.get_in("lock_acquired_total", "catalog", "shared"), 2.0);
    assert_eq!(m.get_in("lock_hold_seconds", "catalog", "shared"), 2.0);
    // Every series has both labels, and each lock label one mode (no name is used both ways
    // here).
    assert!(m.modes("").is_empty(), "a series without a lock label");
    for lock in m.labels() {
        let expected = match lock.as_str() {
            "pool" => "permits",
            "catalog" => "shared",
            _ => "exclusive",
        };
        assert_eq!(m.modes(&lock), [expected], "{lock}");
    }
}

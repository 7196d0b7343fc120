//! The lock engine on one real redis-server: exclusion, scripts, renewal, loss, deadlines,
//! release on every path, min_hold, waiting, and bad input.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use lock_runtime::{LockError, LockOptions, Locker, LostReason};
use support::monitor::Monitor;
use support::{Env, eventually, ms, opts};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_across_two_lockers_with_increasing_fences() {
    let env = Env::start().await;
    let lockers = [env.locker.clone(), env.second_locker().await];
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(std::sync::Mutex::new(Vec::new()));
    let o = opts(5_000).with_wait(ms(20_000));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let locker = lockers[t % 2].clone();
        let (inside, overlaps, fences) = (inside.clone(), overlaps.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..300 {
                locker
                    .run("exclusive", &o, async |lease| {
                        if inside.swap(true, Ordering::SeqCst) {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        fences.lock().unwrap().push(lease.fence());
                        tokio::task::yield_now().await;
                        inside.store(false, Ordering::SeqCst);
                    })
                    .await
                    .expect("section runs");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two holders were inside at once"
    );
    let fences = fences.lock().unwrap();
    assert_eq!(fences.len(), 2400);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences must strictly increase in lock order"
    );
}

#[tokio::test]
async fn an_uncontended_cycle_is_one_round_trip_each_way_and_scripts_load_once() {
    let env = Env::start().await;
    let o = opts(5_000);
    // Warm up: the first release loads its script.
    env.locker
        .acquire("rt", &o)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    env.reset_stats().await;
    let lease = env.locker.acquire("rt", &o).await.unwrap();
    // One pipeline of plain commands: SET NX PX GET, TIME, GET of the fence counter. The queue
    // is not looked at.
    for (command, calls) in [
        ("set", 1),
        ("time", 1),
        ("get", 1),
        ("exists", 0),
        ("evalsha", 0),
    ] {
        assert_eq!(env.calls(command).await, calls, "acquire: {command}");
    }
    lease.release().await.unwrap();
    assert_eq!(env.calls("evalsha").await, 1, "release must be one EVALSHA");
    // Nobody waits: no release message.
    assert_eq!(env.calls("publish").await, 0);
    for _ in 0..50 {
        env.locker
            .acquire("rt", &o)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    assert_eq!(env.calls("eval").await, 0, "scripts are never sent in full");
    assert_eq!(env.calls("script|load").await, 0, "scripts are loaded once");
    assert_eq!(env.calls("evalsha").await, 51);
    // The release recorded the last fence in the counter.
    let lease = env.locker.acquire("rt", &o).await.unwrap();
    let fence = lease.fence();
    lease.release().await.unwrap();
    let counter: u64 = env
        .get(&format!("{}:fence", env.key("rt")))
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(counter, fence);
}

/// An uncontended release is one short EVALSHA: the lock key and the token; the fence counter's
/// retention and the fence only when the lease has a fence to record (the script names the
/// queue and the counter after the key, and its default retention is the locker's default).
/// The script then takes its shortest path: GET and DEL, with no look at the queue (a waiter
/// would have marked the value); a release that records its fence also looks at the queue.
/// Each argument costs the server on every release: sending all 3 keys and 6 arguments and going
/// through every check of the script costs about 0.7 µs more per release (INFO commandstats).
#[tokio::test]
async fn an_uncontended_release_sends_the_key_and_token_only() {
    let env = Env::start().await;
    let week = (7 * 24 * 3_600_000u64).to_string();
    // Warm up: the first release loads its script.
    take_and_release(env.locker.clone(), "short", opts(5_000))
        .await
        .unwrap();
    let key = env.key("short");
    for fenced in [false, true] {
        let monitor = Monitor::start(env.server.addr());
        let o = if fenced {
            opts(5_000)
        } else {
            opts(5_000).without_fence()
        };
        let lease = env.locker.acquire("short", &o).await.unwrap();
        let (token, fence) = (lease.token().to_owned(), lease.fence());
        lease.release().await.unwrap();
        eventually(ms(2_000), "the release's DEL is seen", || async {
            monitor.commands().iter().any(|c| c.args[0] == "DEL")
        })
        .await;
        let commands = monitor.commands();
        let scripts: Vec<_> = commands
            .iter()
            .filter(|c| !c.in_script && c.args[0].eq_ignore_ascii_case("EVALSHA"))
            .collect();
        assert_eq!(scripts.len(), 1, "fenced {fenced}: {commands:?}");
        // The retention is the script's default (7 days): sent only with a fence to record.
        let mut expected = vec!["1".to_owned(), key.clone(), token];
        if fenced {
            expected.extend([week.clone(), fence.to_string()]);
        }
        assert_eq!(scripts[0].args[2..], expected, "fenced {fenced}");
        let inner: Vec<_> = commands
            .iter()
            .filter(|c| c.in_script)
            .map(|c| c.args[0].as_str())
            .collect();
        if fenced {
            // No look at the queue: nobody marked the value, so nobody queued behind it. The
            // counter is read first: it is only ever raised, and only when it is a counter.
            assert_eq!(inner, ["GET", "GET", "SET", "DEL"], "records the fence");
        } else {
            assert_eq!(inner, ["GET", "DEL"], "the shortest path");
        }
    }
}

#[tokio::test]
async fn stale_holder_never_touches_the_new_holders_key() {
    let env = Env::start().await;
    let key = env.key("stale");
    for round in 0..100 {
        // A: long ttl, fast renewal, so its watchdog tries to renew right after the takeover.
        let a = env
            .locker
            .acquire("stale", &opts(60_000).with_renew(ms(5)))
            .await
            .unwrap();
        env.del(&key).await; // A's key expires (simulated).
        let b = env.locker.acquire("stale", &opts(10_000)).await.unwrap();
        assert!(b.fence() > a.fence());
        // A's watchdog notices at its next renewal and does not extend B's key.
        tokio::time::timeout(ms(2_000), a.lost())
            .await
            .expect("A learns it lost the lock");
        let err = a.release().await.expect_err("A's release must fail");
        assert!(
            matches!(
                err,
                LockError::Lost {
                    reason: LostReason::NotOwner,
                    ..
                }
            ),
            "round {round}: {err}"
        );
        assert_eq!(
            env.get(&key).await.as_deref(),
            Some(b.token()),
            "round {round}: B's key was touched"
        );
        assert!(
            env.pttl(&key).await <= 10_000,
            "round {round}: B's key was extended by A"
        );
        b.release().await.unwrap();
    }
}

#[tokio::test]
async fn watchdog_renews_while_the_body_runs_and_stops_after() {
    let env = Env::start().await;
    let key = env.key("renewed");
    let o = opts(1_000).with_renew(ms(100));
    let min_pttl = Arc::new(AtomicUsize::new(usize::MAX));
    let sampler = {
        let (raw_env_url, key, min_pttl) = (env.server.url(), key.clone(), min_pttl.clone());
        tokio::spawn(async move {
            let mut raw = support::raw_connection(&raw_env_url).await;
            loop {
                let p: i64 = redis::cmd("PTTL")
                    .arg(&key)
                    .query_async(&mut raw)
                    .await
                    .unwrap();
                if p > 0 {
                    min_pttl.fetch_min(p as usize, Ordering::SeqCst);
                }
                tokio::time::sleep(ms(5)).await;
            }
        })
    };
    env.locker
        .run("renewed", &o, async |_| tokio::time::sleep(ms(800)).await)
        .await
        .unwrap();
    sampler.abort();
    let min = min_pttl.load(Ordering::SeqCst);
    assert!(
        min >= 800,
        "PTTL dropped to {min} ms: the watchdog did not keep it above ttl - 2 x renew"
    );
    // After the end, no renewal is sent any more.
    env.reset_stats().await;
    tokio::time::sleep(ms(350)).await;
    assert_eq!(
        env.calls("evalsha").await,
        0,
        "the watchdog kept renewing an ended lease"
    );
}

#[tokio::test]
async fn key_deleted_by_someone_else_cancels_the_body_with_lost() {
    let env = Env::start().await;
    let key = env.key("stolen");
    let o = opts(10_000).with_renew(ms(100));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let finished = Arc::new(AtomicBool::new(false));
    let run = {
        let (locker, finished) = (env.locker.clone(), finished.clone());
        tokio::spawn(async move {
            locker
                .run("stolen", &o, async |_| {
                    started_tx.send(()).unwrap();
                    tokio::time::sleep(ms(5_000)).await;
                    finished.store(true, Ordering::SeqCst);
                })
                .await
        })
    };
    started_rx.await.unwrap();
    env.del(&key).await;
    let deleted = Instant::now();
    let res = run.await.unwrap();
    let took = deleted.elapsed();
    assert!(
        matches!(
            res,
            Err(LockError::Lost {
                reason: LostReason::NotOwner,
                ..
            })
        ),
        "{res:?}"
    );
    assert!(!finished.load(Ordering::SeqCst), "the body ran to its end");
    assert!(
        took <= ms(100 + 100),
        "loss noticed after {took:?}, more than one renew period + a round trip"
    );
}

/// Records when it is dropped: the moment the body was cancelled.
struct DropClock(Arc<std::sync::Mutex<Option<Instant>>>);

impl Drop for DropClock {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = Some(Instant::now());
    }
}

#[tokio::test]
async fn frozen_redis_cancels_the_body_before_validity_ends_and_locker_recovers() {
    let env = Env::start().await;
    // max_exec defaults to ttl - drift, counted from the body's start; validity counts from
    // when the acquire was sent, so here the lease's validity is the earlier bound.
    let o = opts(600).with_renew(ms(100));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let cancelled = Arc::new(std::sync::Mutex::new(None));
    let run = {
        let (locker, cancelled) = (env.locker.clone(), cancelled.clone());
        tokio::spawn(async move {
            locker
                .run("frozen", &o, async |lease| {
                    let _clock = DropClock(cancelled);
                    started_tx.send((Instant::now(), lease.deadline())).unwrap();
                    tokio::time::sleep(ms(5_000)).await;
                })
                .await
        })
    };
    let (body_start, validity) = started_rx.await.unwrap();
    env.server.pause();
    let res = run.await.unwrap();
    env.server.resume();
    assert!(
        matches!(
            res,
            Err(LockError::Lost {
                reason: LostReason::ValidityExpired,
                ..
            })
        ),
        "a body under a frozen Redis must end with Lost, got {res:?}"
    );
    let bound = (body_start + o.max_exec()).min(validity);
    let at = cancelled.lock().unwrap().expect("the body was dropped");
    assert!(
        at <= bound + ms(20),
        "body cancelled {:?} after the bound",
        at - bound
    );
    // The same locker works again once Redis is back.
    let lease = tokio::time::timeout(ms(5_000), async {
        loop {
            match env.locker.acquire("after-freeze", &opts(1_000)).await {
                Ok(lease) => break lease,
                Err(_) => tokio::time::sleep(ms(20)).await,
            }
        }
    })
    .await
    .expect("the locker recovers after SIGCONT");
    lease.release().await.unwrap();
}

#[tokio::test]
async fn max_exec_cancels_the_body_at_its_deadline_and_releases() {
    let env = Env::start().await;
    let o = opts(2_000).with_max_exec(ms(200));
    let start = Instant::now();
    let res = env
        .locker
        .run("slow", &o, async |_| tokio::time::sleep(ms(5_000)).await)
        .await;
    let took = start.elapsed();
    assert!(
        matches!(res, Err(LockError::MaxExecExceeded { .. })),
        "{res:?}"
    );
    assert!(
        took >= ms(200) && took <= ms(200 + 20 + 5),
        "cancelled after {took:?}"
    );
    assert!(
        !env.exists(&env.key("slow")).await,
        "the key must be released at once"
    );
}

#[tokio::test]
async fn every_return_path_releases_at_once() {
    let env = Env::start().await;
    let key = env.key("paths");
    let o = opts(30_000);
    // Normal return.
    let v = env.locker.run("paths", &o, async |_| 7).await.unwrap();
    assert_eq!(v, 7);
    assert!(!env.exists(&key).await, "normal return");
    // `?` in the body: an Err value.
    let r: Result<Result<(), std::io::Error>, _> = env
        .locker
        .run("paths", &o, async |_| {
            Err::<(), _>(std::io::Error::other("boom"))?;
            Ok(())
        })
        .await;
    assert!(r.unwrap().is_err());
    assert!(!env.exists(&key).await, "`?` return");
    // Panic: released, then the panic is resumed with its payload.
    let locker = env.locker.clone();
    let panicked = tokio::spawn(async move {
        locker
            .run("paths", &opts(30_000), async |_| panic!("body panicked"))
            .await
    })
    .await
    .expect_err("the panic is resumed");
    assert!(panicked.is_panic());
    let msg = panicked
        .into_panic()
        .downcast::<&str>()
        .map(|b| *b)
        .unwrap_or_default();
    assert_eq!(msg, "body panicked");
    assert!(!env.exists(&key).await, "panic");
    // The caller drops the future mid-body.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let locker = env.locker.clone();
    let task = tokio::spawn(async move {
        locker
            .run("paths", &opts(30_000), async |_| {
                started_tx.send(()).unwrap();
                std::future::pending::<()>().await;
            })
            .await
    });
    started_rx.await.unwrap();
    assert!(env.exists(&key).await);
    task.abort();
    eventually(
        ms(200),
        "key released after the caller dropped the future",
        || env_exists_not(&env, &key),
    )
    .await;
}

async fn env_exists_not(env: &Env, key: &str) -> bool {
    !env.exists(key).await
}

#[tokio::test]
async fn min_hold_keeps_the_key_after_an_early_return() {
    let env = Env::start().await;
    let key = env.key("job");
    let o = opts(2_000).with_min_hold(ms(400));
    let start = Instant::now();
    env.locker.run("job", &o, async |_| ()).await.unwrap();
    assert!(
        env.exists(&key).await,
        "the key stays after an early return"
    );
    let pttl = env.pttl(&key).await;
    assert!(
        pttl > 0 && pttl <= 400,
        "PTTL {pttl} must be the rest of min_hold"
    );
    eventually(ms(1_000), "the key expires after min_hold", || {
        env_exists_not(&env, &key)
    })
    .await;
    assert!(
        start.elapsed() >= ms(400),
        "gone after {:?}, before min_hold",
        start.elapsed()
    );
    // Another caller is refused while min_hold lasts.
    env.locker.run("job", &o, async |_| ()).await.unwrap();
    let err = env.locker.run("job", &o, async |_| ()).await.unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_is_woken_by_the_release_not_by_polling() {
    let env = Env::start().await;
    // A long ttl: a waiter relying on the PTTL would wait 10 s.
    let holder = env.locker.acquire("handoff", &opts(10_000)).await.unwrap();
    let waiter = {
        let locker = env.second_locker().await;
        tokio::spawn(async move {
            let lease = locker
                .acquire("handoff", &opts(10_000).with_wait(ms(5_000)))
                .await
                .unwrap();
            let at = Instant::now();
            lease.release().await.unwrap();
            at
        })
    };
    // Let the waiter subscribe and park.
    let channel = format!("{}:released", env.key("handoff"));
    eventually(ms(2_000), "the waiter subscribed", || async {
        env.subscribers(&channel).await > 0
    })
    .await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let acquired = waiter.await.unwrap();
    let latency = acquired - released;
    println!("hand-off latency: {latency:?}");
    assert!(
        latency <= ms(50),
        "waiter woke {latency:?} after the release"
    );
}

#[tokio::test]
async fn wait_runs_out_with_busy_and_zero_wait_tries_once() {
    let env = Env::start().await;
    let _holder = env.locker.acquire("busy", &opts(10_000)).await.unwrap();
    let start = Instant::now();
    let err = env
        .locker
        .acquire("busy", &opts(10_000).with_wait(ms(300)))
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, LockError::Busy { .. }), "{err}");
    assert!(took >= ms(300) && took <= ms(320), "Busy after {took:?}");
    assert!(err.to_string().contains("busy"), "{err}");
    env.reset_stats().await;
    let err = env.locker.acquire("busy", &opts(10_000)).await.unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }));
    assert_eq!(env.calls("set").await, 1, "wait = 0 tries exactly once");
}

#[tokio::test]
async fn bad_urls_and_unreachable_servers_fail_fast_with_the_address() {
    let err = Locker::connect("http://127.0.0.1:1").await.unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    assert!(err.to_string().contains("http://127.0.0.1:1"), "{err}");
    // A port with nothing listening.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = Instant::now();
    let err = Locker::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert!(
        start.elapsed() < ms(3_000),
        "connect took {:?}",
        start.elapsed()
    );
    assert!(matches!(err, LockError::Redis { .. }), "{err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
    // A lazily built locker fails at the lock call, naming the lock and the address.
    let locker = Locker::builder()
        .url(format!("redis://127.0.0.1:{port}"))
        .build()
        .unwrap();
    let err = locker.acquire("nowhere", &opts(1_000)).await.unwrap_err();
    assert!(
        err.to_string().contains("nowhere") && err.to_string().contains(&port.to_string()),
        "{err}"
    );
}

#[tokio::test]
async fn a_key_of_another_type_is_an_error_and_left_untouched() {
    let env = Env::start().await;
    let key = env.key("wrongtype");
    let mut raw = env.raw.clone();
    let _: i64 = redis::cmd("RPUSH")
        .arg(&key)
        .arg("a")
        .arg("b")
        .query_async(&mut raw)
        .await
        .unwrap();
    let err = env
        .locker
        .acquire("wrongtype", &opts(1_000).with_wait(ms(200)))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("wrongtype") && text.contains("list"),
        "{text}"
    );
    let len: i64 = redis::cmd("LLEN")
        .arg(&key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(len, 2, "the list was touched");
    // A fence counter of another type: the lock key is not left behind either.
    let fence_key = format!("{}:fence", env.key("badfence"));
    let _: () = redis::cmd("SET")
        .arg(&fence_key)
        .arg("not a number")
        .query_async(&mut raw)
        .await
        .unwrap();
    let err = env
        .locker
        .acquire("badfence", &opts(1_000))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    assert!(!env.exists(&env.key("badfence")).await);
    assert_eq!(env.get(&fence_key).await.as_deref(), Some("not a number"));
}

#[tokio::test]
async fn invalid_options_are_config_errors_naming_the_rule() {
    let env = Env::start().await;
    let cases: [(LockOptions, &str); 5] = [
        (opts(0), "ttl"),
        (
            LockOptions::new(Duration::from_micros(1500)),
            "whole number of milliseconds",
        ),
        (opts(1_000).with_max_exec(ms(995)), "max_exec"),
        (opts(1_000).with_renew(ms(600)), "renew"),
        (opts(1_000).with_min_hold(ms(2_000)), "min_hold"),
    ];
    for (o, rule) in cases {
        let err = env.locker.acquire("opts", &o).await.unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err}");
        assert!(
            err.to_string().contains(rule) && err.to_string().contains("opts"),
            "{err}"
        );
        assert!(o.validate().is_err());
    }
    assert!(!env.exists(&env.key("opts")).await);
}

#[tokio::test]
async fn lock_errors_convert_into_io_errors() {
    fn io_path(e: LockError) -> std::io::Result<()> {
        Err(e)?
    }
    let err = io_path(LockError::Busy {
        name: "n".into(),
        waited: ms(1),
    })
    .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
    assert!(err.to_string().contains("`n`"));
}

#[tokio::test]
async fn the_locker_reconnects_after_the_server_restarts() {
    let env = Env::start().await;
    let before = env.locker.acquire("after", &opts(1_000)).await.unwrap();
    let fence_before = before.fence();
    before.release().await.unwrap();
    env.server.restart();
    // The first call after the restart may see the dropped connection; it must not stay broken.
    let lease = tokio::time::timeout(ms(5_000), async {
        loop {
            match env.locker.acquire("after", &opts(1_000)).await {
                Ok(lease) => break lease,
                Err(e) => {
                    assert!(matches!(e, LockError::Redis { .. }), "{e}");
                    tokio::time::sleep(ms(10)).await;
                }
            }
        }
    })
    .await
    .expect("the locker reconnects by itself");
    // Scripts are re-loaded on the fresh server (EVALSHA falls back on NOSCRIPT), and the fence
    // keeps growing although the server lost its counter: it restarts from the server's clock.
    assert!(
        lease.fence() > fence_before,
        "fence went back: {} after {fence_before}",
        lease.fence()
    );
    lease.release().await.unwrap();
}

#[cfg(not(feature = "tls"))]
#[tokio::test]
async fn tls_urls_without_tls_support_say_so() {
    let err = Locker::builder()
        .url("rediss://127.0.0.1:6390")
        .build()
        .unwrap_err();
    println!("{err}");
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    assert!(err.to_string().contains("rediss://127.0.0.1:6390"), "{err}");
}

#[tokio::test]
async fn credentials_in_the_url_are_used_and_never_printed() {
    let server = lock_testing::RedisServer::start_with(&["--requirepass", "s3cret"]);
    let url = format!("redis://:s3cret@127.0.0.1:{}", server.port());
    let locker = Locker::connect(&url).await.expect("authenticated");
    locker
        .acquire("auth", &opts(1_000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert!(!format!("{locker:?}").contains("s3cret"));
    let wrong = format!("redis://:wrong@127.0.0.1:{}", server.port());
    let err = Locker::connect(&wrong).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&format!("127.0.0.1:{}", server.port())),
        "{text}"
    );
    assert!(!text.contains(":wrong@"), "the password leaked: {text}");
}

/// A body that blocks its thread past the lease's validity finishes without the lock: the call
/// reports the lease lost, not `Ok`.
#[tokio::test(flavor = "current_thread")]
async fn a_body_that_finishes_after_its_lease_ran_out_is_lost_not_ok() {
    let env = Env::start().await;
    let res = env
        .locker
        .run("blocked", &opts(200), async |_| {
            // Blocks the only runtime thread: no renewal and no timer can run meanwhile.
            std::thread::sleep(ms(400));
            42
        })
        .await;
    assert!(
        matches!(
            res,
            Err(LockError::Lost {
                reason: LostReason::ValidityExpired,
                ..
            })
        ),
        "{res:?}"
    );
}

/// Puts waiter `id` first in the queue of the lock `key`, as a waiter whose queue state has no
/// ttl and that then stopped coming back: a last attempt's nonce and a grace of 300 ms.
async fn queue_stalled_waiter(env: &Env, key: &str, id: &str) {
    queue_waiter(env, key, id, "nonce 300").await;
}

/// Puts waiter `id` first in the queue of the lock `key`, with `state` as its attempt would
/// write it (`<nonce> <ttl ms> <grace ms>`, or `<nonce> <grace ms>` for a state without a ttl).
async fn queue_waiter(env: &Env, key: &str, id: &str, state: &str) {
    let mut raw = env.raw.clone();
    let _: () = redis::pipe()
        .cmd("ZADD")
        .arg(format!("{key}:waiters"))
        .arg(1)
        .arg(id)
        .ignore()
        .cmd("HSET")
        .arg(format!("{key}:waiters:state"))
        .arg(id)
        .arg(state)
        .ignore()
        .query_async(&mut raw)
        .await
        .unwrap();
}

/// Marks the holder's value of the lock `key` as a queueing waiter does (`;w=0` becomes `;w=1`,
/// the expiry kept).
async fn mark(env: &Env, key: &str, token: &str) {
    let unmarked = token
        .strip_suffix(";w=0")
        .expect("the mark's field ends the value");
    let mut raw = env.raw.clone();
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(format!("{unmarked};w=1"))
        .arg("KEEPTTL")
        .query_async(&mut raw)
        .await
        .unwrap();
}

/// Sets the lock `key` to `value` for `ttl`, as a holder (or another client) would.
async fn set_for(env: &Env, key: &str, value: &str, ttl: Duration) {
    let mut raw = env.raw.clone();
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(ttl.as_millis() as u64)
        .query_async(&mut raw)
        .await
        .unwrap();
}

/// Waits (bounded) until the queue of the lock `name` holds `n` waiters.
async fn queued(env: &Env, name: &str, n: i64) {
    eventually(
        ms(2_000),
        &format!("{n} waiters queued on {name}"),
        || async { queue_len(env, name).await == n },
    )
    .await;
}

/// A waiter that takes the lock `name`, releases it at once and returns its fence.
fn take_and_release(
    locker: Locker,
    name: &'static str,
    o: LockOptions,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let lease = locker.acquire(name, &o).await.unwrap();
        let fence = lease.fence();
        lease.release().await.unwrap();
        fence
    })
}

async fn queue_len(env: &Env, name: &str) -> i64 {
    let mut raw = env.raw.clone();
    redis::cmd("ZCARD")
        .arg(format!("{}:waiters", env.key(name)))
        .query_async(&mut raw)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_the_lock_in_arrival_order() {
    let env = Env::start().await;
    let holder = env.locker.acquire("fifo", &opts(10_000)).await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..5 {
        let (locker, order) = (env.second_locker().await, order.clone());
        waiters.push(tokio::spawn(async move {
            let lease = locker
                .acquire("fifo", &opts(10_000).with_wait(ms(10_000)))
                .await
                .unwrap();
            order.lock().unwrap().push(i);
            lease.release().await.unwrap();
        }));
        // The next waiter arrives only once this one has its place.
        queued(&env, "fifo", i + 1).await;
    }
    holder.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        [0, 1, 2, 3, 4],
        "not served in arrival order"
    );
    assert_eq!(queue_len(&env, "fifo").await, 0);
}

/// Each release grants the lock to the first waiter and wakes only that one, which holds it
/// without an attempt of its own; the others send no attempt either (a waiter's attempt re-writes
/// its state in the queue's hash with HSET, which nothing else does). Waking everyone would cost
/// 5 + 4 + 3 + 2 + 1 = 15 needless attempts over the chain of six hand-overs, and each grantee's
/// own attempt 6 more script calls; only a waiter's own timer (every 100 ms or more) may add
/// one. Both through the server's message (a locker each) and through the releasing locker's
/// own wake-up (one shared locker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_grants_the_lock_to_the_first_waiter_and_wakes_only_it() {
    let env = Env::start().await;
    // The release script is loaded from here on (a first EVALSHA would be sent twice).
    let warm = env.locker.acquire("warm", &opts(10_000)).await.unwrap();
    warm.release().await.unwrap();
    for shared in [false, true] {
        let name = if shared { "wake-shared" } else { "wake-each" };
        let holder = env.locker.acquire(name, &opts(10_000)).await.unwrap();
        let mut waiters = Vec::new();
        for i in 0..6 {
            let locker = if shared {
                env.locker.clone()
            } else {
                env.second_locker().await
            };
            waiters.push(take_and_release(
                locker,
                name,
                opts(10_000).with_wait(ms(10_000)),
            ));
            queued(&env, name, i + 1).await;
        }
        env.reset_stats().await;
        let mut fences = vec![holder.fence()];
        holder.release().await.unwrap();
        for w in waiters {
            let fence = tokio::time::timeout(ms(5_000), w)
                .await
                .expect("every waiter gets the lock in turn")
                .unwrap();
            fences.push(fence);
        }
        let needless = env.calls("hset").await;
        assert!(
            needless <= 3,
            "{needless} attempts by waiters whose turn it was not (shared locker: {shared})"
        );
        // The seven releases, and at most those few timer attempts: no grantee asked.
        let scripts = env.calls("evalsha").await;
        assert!(
            scripts <= 7 + needless,
            "{scripts} script calls for 7 releases (shared locker: {shared})"
        );
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "fences in the order of the hand-overs: {fences:?}"
        );
        assert_eq!(queue_len(&env, name).await, 0);
    }
}

/// A grant sets the key for the waiter's grace only (a vanished grantee holds the lock up no
/// longer than it would have kept its place); the grantee's lease extends it to the ttl on its
/// own, well before the grace ends, and a hold longer than the grace keeps the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_lease_is_extended_to_its_ttl_before_the_grace_ends() {
    let env = Env::start().await;
    let name = "granted-long";
    let key = env.key(name);
    let holder = env.locker.acquire(name, &opts(10_000)).await.unwrap();
    let waiter_locker = env.second_locker().await;
    let waiter = tokio::spawn(async move {
        waiter_locker
            .acquire(name, &opts(10_000).with_wait(ms(5_000)))
            .await
            .unwrap()
    });
    queued(&env, name, 1).await;
    holder.release().await.unwrap();
    // The grant itself: the waiter's token, for about its grace (300 ms and a few round trips).
    let granted_pttl = env.pttl(&key).await;
    assert!(
        (0..=1_000).contains(&granted_pttl),
        "granted for the grace, not the ttl: pttl {granted_pttl} ms"
    );
    let lease = tokio::time::timeout(ms(2_000), waiter)
        .await
        .expect("the grantee holds the lock")
        .unwrap();
    assert_eq!(env.get(&key).await.as_deref(), Some(lease.token()));
    // The server extends the key before the renewal's reply reaches the lease: wait for both.
    eventually(
        ms(1_000),
        "the grantee extended its key to the ttl, and its lease learnt it",
        || async { env.pttl(&key).await > 5_000 && lease.deadline() > Instant::now() + ms(5_000) },
    )
    .await;
    // Well past the grace: still held, by the same token.
    tokio::time::sleep(ms(700)).await;
    assert!(lease.is_held());
    assert_eq!(env.get(&key).await.as_deref(), Some(lease.token()));
    lease.release().await.unwrap();
    assert!(!env.exists(&key).await);
}

/// A task on a tokio runtime of its own, on a thread of its own, with a locker of its own: driven
/// until [`Self::freeze`], then frozen (a current-thread runtime runs nothing outside
/// `block_on`: its sockets are not read, its timers do not fire) until [`Self::resume`], then
/// driven until [`Self::finish`]. A fault that the task must not see coming, made real.
struct OwnRuntime {
    task: tokio::task::AbortHandle,
    freeze: std::sync::mpsc::Sender<()>,
    /// Told once the runtime has left `block_on`: from then on it runs nothing.
    frozen: std::sync::mpsc::Receiver<()>,
    resume: std::sync::mpsc::Sender<()>,
    done: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl OwnRuntime {
    fn start<F, Fut>(url: String, task: F) -> Self
    where
        F: FnOnce(Locker) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (task_tx, task_rx) = std::sync::mpsc::channel();
        let (freeze, freeze_rx) = std::sync::mpsc::channel::<()>();
        let (frozen_tx, frozen) = std::sync::mpsc::channel::<()>();
        let (resume, resume_rx) = std::sync::mpsc::channel::<()>();
        let (done, done_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let locker = Locker::connect(&url).await.unwrap();
                task_tx
                    .send(tokio::spawn(task(locker)).abort_handle())
                    .unwrap();
                let _ = tokio::task::spawn_blocking(move || freeze_rx.recv()).await;
            });
            let _ = frozen_tx.send(());
            let _ = resume_rx.recv();
            rt.block_on(async {
                let _ = tokio::task::spawn_blocking(move || done_rx.recv()).await;
            });
        });
        Self {
            task: task_rx.recv().unwrap(),
            freeze,
            frozen,
            resume,
            done,
            thread,
        }
    }

    /// Returns once the runtime is frozen. Returning earlier let the runtime run on for a moment
    /// under load: long enough, after a fault made right after this, to react to it (reconnect,
    /// subscribe again) before freezing, which the fault was meant to keep it from.
    fn freeze(&self) {
        self.freeze.send(()).unwrap();
        self.frozen.recv().unwrap();
    }

    fn resume(&self) {
        self.resume.send(()).unwrap();
    }

    fn finish(self) {
        self.done.send(()).unwrap();
        self.thread.join().unwrap();
    }
}

/// A release grants the lock to the first waiter under its last attempt's token; if that waiter
/// is cancelled before the grant's message reaches it, dropping it passes the lock on to the next
/// waiter at once, not when the grant's grace runs out. The first waiter runs on a runtime of its
/// own, frozen while the grant is made, so the fault is real: the key holds the token of a
/// waiter that never learnt of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cancelled_after_its_grant_passes_the_lock_on() {
    let env = Env::start().await;
    let name = "granted-then-cancelled";
    let key = env.key(name);
    let holder = env.locker.acquire(name, &opts(30_000)).await.unwrap();
    let first_took = Arc::new(AtomicBool::new(false));
    let took = first_took.clone();
    let first = OwnRuntime::start(env.server.url(), move |locker| async move {
        let lease = locker
            .acquire(name, &opts(30_000).with_wait(ms(20_000)))
            .await;
        took.store(true, Ordering::SeqCst);
        drop(lease);
    });
    queued(&env, name, 1).await;
    first.freeze();
    let second_locker = env.second_locker().await;
    let second = take_and_release(second_locker, name, opts(30_000).with_wait(ms(20_000)));
    queued(&env, name, 2).await;
    let holder_fence = holder.fence();
    holder.release().await.unwrap();
    let granted = env.get(&key).await.expect("granted, not deleted");
    assert!(
        !granted.starts_with('~'),
        "granted to a token, not handed over: {granted}"
    );
    assert_eq!(queue_len(&env, name).await, 1, "the grantee left the queue");
    // Cancel the first waiter, then let its runtime go on: it drops the waiter unpolled.
    first.task.abort();
    let begun = Instant::now();
    first.resume();
    let fence = tokio::time::timeout(ms(5_000), second)
        .await
        .expect("the lock went on to the second waiter")
        .unwrap();
    // At once: not when the grant's grace (at least 300 ms from the release) ran out.
    assert!(
        begun.elapsed() < ms(200),
        "passed on after {:?}, as if the grant had expired",
        begun.elapsed()
    );
    assert!(fence > holder_fence, "fence {fence} after {holder_fence}");
    assert!(
        !first_took.load(Ordering::SeqCst),
        "the first waiter ran on after its cancellation"
    );
    first.finish();
    assert!(!env.exists(&key).await);
}

/// A grant whose message never reaches its waiter does not strand the lock: the waiter's next
/// attempt takes it (the grant is its last attempt's token), well before the grant's grace runs
/// out. The fault is real: the waiter's runtime is frozen while the server drops its pub/sub
/// connection and the release publishes the grant to nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_message_is_lost_is_taken_by_the_waiters_next_attempt() {
    let env = Env::start().await;
    let name = "grant-lost";
    let key = env.key(name);
    let holder = env.locker.acquire(name, &opts(30_000)).await.unwrap();
    let (got_tx, got_rx) = tokio::sync::oneshot::channel();
    let waiter = OwnRuntime::start(env.server.url(), move |locker| async move {
        let lease = locker
            .acquire(name, &opts(30_000).with_wait(ms(20_000)))
            .await
            .unwrap();
        let _ = got_tx.send((Instant::now(), lease.token().to_owned(), lease.fence()));
        lease.release().await.unwrap();
    });
    queued(&env, name, 1).await;
    let mut raw = env.raw.clone();
    let (_, grant_channel) = support::first_waiter(&env.raw, &key).await;
    eventually(ms(2_000), "the waiter listens for its grant", || async {
        env.subscribers(&grant_channel).await == 1
    })
    .await;
    waiter.freeze();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        env.subscribers(&grant_channel).await,
        0,
        "nobody hears the grant"
    );
    let holder_fence = holder.fence();
    holder.release().await.unwrap();
    let granted = env.get(&key).await.expect("granted, not deleted");
    let resumed = Instant::now();
    waiter.resume();
    let (got_at, token, fence) = tokio::time::timeout(ms(5_000), got_rx)
        .await
        .expect("the waiter got the lock")
        .unwrap();
    assert_ne!(
        token, granted,
        "taken by an attempt, not by the (lost) message"
    );
    assert!(fence > holder_fence, "fence {fence} after {holder_fence}");
    println!("taken {:?} after the waiter resumed", got_at - resumed);
    // Its grant held the lock for it: taken well inside the grace (300 ms and more).
    assert!(
        got_at - resumed < ms(250),
        "taken {:?} after the waiter resumed",
        got_at - resumed
    );
    waiter.finish();
    eventually(ms(2_000), "released", || async { !env.exists(&key).await }).await;
}

/// A waiter whose queue state has no ttl is not sent a grant it would not understand; it gets a
/// hand-over marked `~<waiter id>` for its grace, which its next attempt takes (and which goes on
/// to others once that grace is over). Such a waiter does not mark the holder's value, so only a
/// release that looks at the queue hands over to it: one whose value another waiter marked.
/// Alone behind a holder, fenced or not, that waiter finds the key freed by the release's short
/// path, and takes it at its next attempt, within a third of its grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_state_has_no_ttl_gets_a_hand_over_by_id() {
    let env = Env::start().await;
    let name = "old-waiter";
    let key = env.key(name);
    queue_stalled_waiter(&env, &key, "elder").await;
    // Nothing marked the value: a fenced release records its fence and frees the key.
    let holder = env.locker.acquire(name, &opts(10_000)).await.unwrap();
    holder.release().await.unwrap();
    assert_eq!(env.get(&key).await, None, "the short path freed the key");
    assert_eq!(queue_len(&env, name).await, 1, "the elder still queues");
    // A waiter with a ttl in its state queues behind the next holder and marks its value.
    let holder = env.locker.acquire(name, &opts(10_000)).await.unwrap();
    let waiter = take_and_release(
        env.second_locker().await,
        name,
        opts(10_000).with_wait(ms(5_000)),
    );
    queued(&env, name, 2).await;
    holder.release().await.unwrap();
    assert_eq!(env.get(&key).await.as_deref(), Some("~elder"));
    let pttl = env.pttl(&key).await;
    assert!(
        (0..=300).contains(&pttl),
        "handed over for its grace: {pttl}"
    );
    // The elder never comes back: the other waiter gets the lock after its grace.
    let start = Instant::now();
    tokio::time::timeout(ms(5_000), waiter)
        .await
        .expect("the waiter gets the lock")
        .unwrap();
    assert!(start.elapsed() < ms(2_000), "waited {:?}", start.elapsed());
}

/// A waiter that queues behind a holder marks the holder's value in place (`;w=0` becomes
/// `;w=1`; the key keeps its expiry), so that the holder's release, whose short path does not
/// look at the queue, knows it has the lock to hand over. The holder renews the marked key,
/// and its release grants the lock to the waiter in the same script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_waiter_marks_the_holders_value_and_the_release_hands_over() {
    let env = Env::start().await;
    let name = "marked";
    let key = env.key(name);
    // Unfenced: its release takes the short path unless the value is marked.
    let holder = env
        .locker
        .acquire(name, &opts(900).without_fence())
        .await
        .unwrap();
    let token = holder.token().to_owned();
    let unmarked = token
        .strip_suffix(";w=0")
        .expect("the mark's field ends the value");
    let marked = format!("{unmarked};w=1");
    let pttl_before = env.pttl(&key).await;
    let waiter = take_and_release(
        env.second_locker().await,
        name,
        opts(10_000).with_wait(ms(10_000)),
    );
    queued(&env, name, 1).await;
    assert_eq!(env.get(&key).await.as_deref(), Some(marked.as_str()));
    let pttl_marked = env.pttl(&key).await;
    assert!(
        (0..=pttl_before).contains(&pttl_marked),
        "marking kept the expiry: {pttl_before} -> {pttl_marked} ms"
    );
    // Renewed (every 300 ms) while marked: the expiry moves back up and the value stays.
    let lowest = AtomicI64::new(pttl_marked);
    eventually(ms(2_000), "the marked key is renewed", || async {
        let pttl = env.pttl(&key).await;
        pttl > lowest.fetch_min(pttl, Ordering::SeqCst).min(pttl) + 100
    })
    .await;
    assert_eq!(env.get(&key).await.as_deref(), Some(marked.as_str()));
    assert!(holder.is_held());
    let monitor = Monitor::start(env.server.addr());
    holder.release().await.unwrap();
    let fence = tokio::time::timeout(ms(5_000), waiter)
        .await
        .expect("the waiter gets the lock")
        .unwrap();
    assert!(fence > 0);
    // Only a release's script publishes a grant (`~<waiter id> <token> <fence>`); MONITOR
    // reports it a little later than the server runs it.
    eventually(
        ms(2_000),
        "the release granted the lock in its own script",
        || async {
            monitor.commands().iter().any(|c| {
                c.in_script
                    && c.args[0].eq_ignore_ascii_case("PUBLISH")
                    && c.args.last().is_some_and(|m| m.starts_with('~'))
            })
        },
    )
    .await;
}

/// A release without a fence to record leaves the retention out when it is the default (the
/// script's default is the locker's): a grant by such a release still keeps the fence counter
/// for the releasing locker's retention, whether the default, another, or forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_keeps_the_fence_counter_for_the_releasing_lockers_retention() {
    let env = Env::start().await;
    let (hour, week) = (3_600_000, 7 * 24 * 3_600_000);
    for (retention, pttl_in) in [
        (
            Some(lock_runtime::DEFAULT_FENCE_RETENTION),
            week - 60_000..=week,
        ),
        (Some(ms(hour as u64)), hour - 60_000..=hour),
        (None, -1..=-1),
    ] {
        let name = format!("retention-{}", pttl_in.end());
        let holder_locker = Locker::builder()
            .url(env.server.url())
            .fence_retention(retention)
            .connect()
            .await
            .unwrap();
        let holder = holder_locker
            .acquire(&name, &opts(5_000).without_fence())
            .await
            .unwrap();
        let waiter_locker = env.second_locker().await;
        let waiter_name = name.clone();
        let waiter = tokio::spawn(async move {
            waiter_locker
                .acquire(&waiter_name, &opts(5_000).with_wait(ms(10_000)))
                .await
        });
        queued(&env, &name, 1).await;
        holder.release().await.unwrap();
        let granted = tokio::time::timeout(ms(5_000), waiter)
            .await
            .expect("the waiter gets the lock")
            .unwrap()
            .unwrap();
        let counter = format!("{}:fence", env.key(&name));
        let pttl = env.pttl(&counter).await;
        assert!(
            pttl_in.contains(&pttl),
            "retention {retention:?}: counter PTTL {pttl} ms"
        );
        assert_eq!(env.get(&counter).await, Some(granted.fence().to_string()));
        granted.release().await.unwrap();
    }
}

/// A value without the waiters' mark field (another client's, for one) is never changed by a
/// waiter queued behind it; the waiter takes the lock once it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_never_changes_a_value_without_the_mark() {
    let env = Env::start().await;
    let name = "foreign-mark";
    let key = env.key(name);
    for value in [
        "8f3c0d5e-4b1a-4c2e-9f6d-2a7b8c9d0e1f",
        "0123456789abcdef0123456789abcdef;host=h;pid=7",
    ] {
        set_for(&env, &key, value, ms(700)).await;
        let waiter = take_and_release(
            env.second_locker().await,
            name,
            opts(10_000).with_wait(ms(5_000)),
        );
        queued(&env, name, 1).await;
        assert_eq!(env.get(&key).await.as_deref(), Some(value));
        tokio::time::timeout(ms(5_000), waiter)
            .await
            .expect("taken once the key expired")
            .unwrap();
    }
}

/// A key that expires under queued waiters (its holder died) is free for a moment: the first
/// waiter times its next attempt for the expiry, and an uncontended acquire does not look at
/// the queue, so a newcomer that comes in that moment takes the lock, once. The waiter's attempt
/// then marks the newcomer's value, and the newcomer's release grants the lock to the waiter
/// instead of freeing it for anyone. The waiter runs on a runtime of its own, frozen over the
/// expiry, so that the newcomer does come in that moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_that_takes_a_lock_expired_under_waiters_hands_it_to_the_first_of_them() {
    let env = Env::start().await;
    let name = "taken-under";
    let key = env.key(name);
    // A holder that died, its value with the waiters' mark field: its key expires in 500 ms.
    let dead = "AAAAAAAAAAAAAAAAAAAAAA;h=h;p=7;w=0";
    set_for(&env, &key, dead, ms(500)).await;
    let (got_tx, got_rx) = tokio::sync::oneshot::channel();
    let waiter = OwnRuntime::start(env.server.url(), move |locker| async move {
        let lease = locker
            .acquire(name, &opts(10_000).with_wait(ms(20_000)))
            .await
            .unwrap();
        let _ = got_tx.send(lease.token().to_owned());
        lease.release().await.unwrap();
    });
    queued(&env, name, 1).await;
    let marked_dead = format!("{}1", &dead[..dead.len() - 1]);
    assert_eq!(env.get(&key).await, Some(marked_dead), "the waiter marks");
    waiter.freeze();
    eventually(ms(2_000), "the dead holder's key expired", || async {
        !env.exists(&key).await
    })
    .await;
    let newcomer = env
        .locker
        .acquire(name, &opts(10_000))
        .await
        .expect("a newcomer takes the key in the moment it is free");
    let newcomer_token = newcomer.token().to_owned();
    assert_eq!(queue_len(&env, name).await, 1, "the waiter keeps its place");
    waiter.resume();
    let marked = format!("{}1", &newcomer_token[..newcomer_token.len() - 1]);
    eventually(
        ms(5_000),
        "the waiter's attempt marks the newcomer",
        || async { env.get(&key).await.as_deref() == Some(marked.as_str()) },
    )
    .await;
    newcomer.release().await.unwrap();
    let token = tokio::time::timeout(ms(5_000), got_rx)
        .await
        .expect("the newcomer's release granted the lock to the waiter")
        .unwrap();
    assert_ne!(token, newcomer_token);
    waiter.finish();
    eventually(ms(2_000), "released", || async { !env.exists(&key).await }).await;
    assert_eq!(queue_len(&env, name).await, 0);
}

/// The messages `listener` got up to the marker this sends on `<key>:released:end`: every
/// message published before it (one server delivers them in order).
async fn released_messages(
    env: &Env,
    key: &str,
    listener: &mut tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
) -> Vec<(String, String)> {
    let mut raw = env.raw.clone();
    let _: i64 = redis::cmd("PUBLISH")
        .arg(format!("{key}:released:end"))
        .arg("end")
        .query_async(&mut raw)
        .await
        .unwrap();
    let mut got = Vec::new();
    loop {
        let message = tokio::time::timeout(ms(2_000), listener.recv())
            .await
            .expect("the marker arrives")
            .unwrap();
        if message.1 == "end" {
            return got;
        }
        got.push(message);
    }
}

/// A grant goes to the grantee's locker alone: on the grant channel its waiter id names
/// (`;grants=<id>` at its end), not on the channel every waiter of the lock listens to, so the
/// connections of the other lockers (services) are not woken by a message that is not theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_is_published_to_the_grantees_locker_only() {
    let env = Env::start().await;
    let name = "grant-channel";
    let key = env.key(name);
    let holder = env.locker.acquire(name, &opts(10_000)).await.unwrap();
    let waiter = take_and_release(
        env.second_locker().await,
        name,
        opts(10_000).with_wait(ms(5_000)),
    );
    queued(&env, name, 1).await;
    let (head, grant_channel) = support::first_waiter(&env.raw, &key).await;
    // The waiter listens on both: the lock's channel and its locker's grant channel.
    let lock_channel = format!("{key}:released");
    eventually(ms(2_000), "the waiter subscribed to its grants", || async {
        env.subscribers(&lock_channel).await == 1 && env.subscribers(&grant_channel).await == 1
    })
    .await;
    let (_conn, mut listener) =
        support::listen(&env.server.url(), &format!("{key}:released*")).await;
    holder.release().await.unwrap();
    tokio::time::timeout(ms(5_000), waiter)
        .await
        .expect("the grantee took the lock")
        .unwrap();
    let messages = released_messages(&env, &key, &mut listener).await;
    assert_eq!(
        messages.len(),
        1,
        "one grant and nothing else: {messages:?}"
    );
    let (channel, payload) = &messages[0];
    assert_eq!(channel, &grant_channel, "published on {channel}");
    assert!(payload.starts_with(&format!("~{head} ")), "{payload}");
    assert_eq!(queue_len(&env, name).await, 0);
}

/// A locker whose callers wait on the same lock again and again subscribes once: its two
/// channels (the lock's, and its grant channel) stay subscribed for a second after the last
/// waiter left, instead of a SUBSCRIBE and an UNSUBSCRIBE of each per wait, and are unsubscribed
/// after that. While they are, a caller of that locker queues with its first attempt, without
/// a plain `SET` first: the lock was contended a moment ago.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_that_waits_again_and_again_subscribes_once() {
    let env = Env::start().await;
    let name = "linger";
    let key = env.key(name);
    let waiting = env.second_locker().await;
    let lock_channel = format!("{key}:released");
    let mut grant_channel = String::new();
    env.reset_stats().await;
    let monitor = Monitor::start(env.server.addr());
    for _ in 0..5 {
        let holder = env.locker.acquire(name, &opts(10_000)).await.unwrap();
        let waiter = take_and_release(waiting.clone(), name, opts(10_000).with_wait(ms(5_000)));
        queued(&env, name, 1).await;
        grant_channel = support::first_waiter(&env.raw, &key).await.1;
        eventually(ms(2_000), "the waiter listens on both channels", || async {
            env.subscribers(&lock_channel).await == 1 && env.subscribers(&grant_channel).await == 1
        })
        .await;
        holder.release().await.unwrap();
        tokio::time::timeout(ms(5_000), waiter)
            .await
            .expect("handed over")
            .unwrap();
    }
    let subscribes = env.calls("subscribe").await;
    assert_eq!(
        subscribes, 2,
        "5 waits sent {subscribes} SUBSCRIBEs: one per channel, not one per wait"
    );
    // Each holder's plain `SET`, and the waiter's before its first wait only.
    let plain_sets = monitor
        .commands()
        .iter()
        .filter(|c| !c.in_script && c.args[0] == "SET" && c.args.get(1) == Some(&key))
        .count();
    assert_eq!(
        plain_sets, 6,
        "5 holders and 5 waits sent {plain_sets} plain SETs: the waits after the first queue at once"
    );
    // Nobody waits any more: both are undone once they have been idle for a second.
    eventually(ms(3_000), "both channels unsubscribed", || async {
        env.subscribers(&lock_channel).await == 0 && env.subscribers(&grant_channel).await == 0
    })
    .await;
    assert_eq!(env.calls("unsubscribe").await, 2);
}

/// Many distinct names: a locker that waits on 2,000 locks at once subscribes once to each
/// lock's channel and each grant channel, and a second after the last waiter left every one is
/// undone and every task the waits started (a linger task per channel) has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_that_waited_on_many_names_leaves_no_subscription_or_task_behind() {
    const NAMES: usize = 2_000;
    let env = Env::start().await;
    let waiting = env.second_locker().await;
    // One wait first, so that the baseline counts the subscribing connection's own tasks.
    let warm_up = env
        .locker
        .acquire("many:warm-up", &opts(10_000))
        .await
        .unwrap();
    let waiter = take_and_release(
        waiting.clone(),
        "many:warm-up",
        opts(10_000).with_wait(ms(5_000)),
    );
    queued(&env, "many:warm-up", 1).await;
    warm_up.release().await.unwrap();
    waiter.await.unwrap();
    eventually(ms(3_000), "the warm-up's channels undone", || async {
        env.pubsub_channels().await.is_empty()
    })
    .await;
    let names: Vec<String> = (0..NAMES).map(|i| format!("many:{i}")).collect();
    let mut held = Vec::with_capacity(NAMES);
    for name in &names {
        held.push(env.locker.acquire(name, &opts(30_000)).await.unwrap());
    }
    let metrics = tokio::runtime::Handle::current().metrics();
    let base_tasks = metrics.num_alive_tasks();
    env.reset_stats().await;
    let waiters: Vec<_> = names
        .iter()
        .map(|name| {
            let (locker, name) = (waiting.clone(), name.clone());
            tokio::spawn(async move {
                let o = opts(30_000).with_wait(ms(20_000));
                locker
                    .acquire(&name, &o)
                    .await
                    .unwrap()
                    .release()
                    .await
                    .unwrap();
            })
        })
        .collect();
    // The fault: every waiter listens at once, on its lock's channel and on a grant channel.
    eventually(ms(10_000), "every waiter subscribed", || async {
        env.pubsub_channels().await.len() == 2 * NAMES
    })
    .await;
    for lease in held {
        lease.release().await.unwrap();
    }
    for waiter in waiters {
        tokio::time::timeout(ms(10_000), waiter)
            .await
            .expect("granted")
            .unwrap();
    }
    assert_eq!(
        env.calls("subscribe").await,
        2 * NAMES as u64,
        "one SUBSCRIBE per channel"
    );
    eventually(ms(5_000), "every channel undone", || async {
        env.pubsub_channels().await.is_empty()
    })
    .await;
    assert_eq!(
        env.calls("unsubscribe").await,
        2 * NAMES as u64,
        "one UNSUBSCRIBE per channel"
    );
    eventually(
        ms(5_000),
        "the runtime's task count back to its baseline",
        || async { metrics.num_alive_tasks() <= base_tasks },
    )
    .await;
}

/// The waiter queue's two keys expire by themselves once every waiter is gone (a backstop for
/// waiters that vanished): the attempt that queues gives both an expiry of up to 4 of its
/// graces, and never shortens a longer one (a waiter with a longer grace set it).
#[tokio::test]
async fn the_waiter_queues_keys_expire_and_a_waiter_never_shortens_their_expiry() {
    let env = Env::start().await;
    let waiting = env.second_locker().await;
    for (name, longer) in [("expiry-new", false), ("expiry-longer", true)] {
        let key = env.key(name);
        let (queue, states) = (format!("{key}:waiters"), format!("{key}:waiters:state"));
        let holder = env.locker.acquire(name, &opts(10_000)).await.unwrap();
        if longer {
            // Another waiter, first in line, with a grace of 30 s: its queue lives 2 minutes.
            queue_waiter(&env, &key, "patient", "nonce 10000 30000").await;
            for k in [&queue, &states] {
                let mut raw = env.raw.clone();
                let _: () = redis::cmd("PEXPIRE")
                    .arg(k)
                    .arg(120_000)
                    .query_async(&mut raw)
                    .await
                    .unwrap();
            }
        }
        let waiter = take_and_release(waiting.clone(), name, opts(10_000).with_wait(ms(5_000)));
        queued(&env, name, if longer { 2 } else { 1 }).await;
        let grace: i64 = {
            let mut raw = env.raw.clone();
            let ids: Vec<String> = redis::cmd("ZRANGE")
                .arg(&queue)
                .arg(-1)
                .arg(-1)
                .query_async(&mut raw)
                .await
                .unwrap();
            let state: String = redis::cmd("HGET")
                .arg(&states)
                .arg(&ids[0])
                .query_async(&mut raw)
                .await
                .unwrap();
            state.rsplit(' ').next().unwrap().parse().unwrap()
        };
        for k in [&queue, &states] {
            let pttl = env.pttl(k).await;
            if longer {
                assert!(pttl > 100_000, "{k}: shortened to {pttl} ms");
            } else {
                assert!(
                    pttl > 0 && pttl <= 4 * grace,
                    "{k}: {pttl} ms, grace {grace} ms"
                );
            }
        }
        if longer {
            // The patient waiter is first: the release hands it the lock; let it go.
            let mut raw = env.raw.clone();
            let _: () = redis::pipe()
                .cmd("ZREM")
                .arg(&queue)
                .arg("patient")
                .ignore()
                .cmd("HDEL")
                .arg(&states)
                .arg("patient")
                .ignore()
                .query_async(&mut raw)
                .await
                .unwrap();
        }
        holder.release().await.unwrap();
        tokio::time::timeout(ms(5_000), waiter)
            .await
            .expect("handed over")
            .unwrap();
    }
}

/// A waiter whose id names no grant channel (no `;grants=<id>` at its end) gets its grant on the
/// lock's channel, which such waiters listen to.
#[tokio::test]
async fn a_waiter_without_a_grant_channel_is_granted_on_the_locks_channel() {
    let env = Env::start().await;
    let name = "grant-shared";
    let key = env.key(name);
    let holder = env.locker.acquire(name, &opts(10_000)).await.unwrap();
    queue_waiter(&env, &key, "elder", "nonce 10000 300").await;
    // Such a waiter marks the holder's value as it queues, so that the release looks at the queue.
    mark(&env, &key, holder.token()).await;
    let (_conn, mut listener) =
        support::listen(&env.server.url(), &format!("{key}:released*")).await;
    holder.release().await.unwrap();
    assert_eq!(env.get(&key).await.as_deref(), Some("nonce"), "granted");
    let messages = released_messages(&env, &key, &mut listener).await;
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert_eq!(messages[0].0, format!("{key}:released"));
    assert!(
        messages[0].1.starts_with("~elder nonce "),
        "{:?}",
        messages[0]
    );
}

#[tokio::test]
async fn a_waiter_that_vanished_loses_its_place_after_the_grace() {
    let env = Env::start().await;
    let key = env.key("phantom");
    // A waiter that queued and then vanished (crashed without leaving the queue): first in
    // line, with a last attempt's nonce and a grace of 300 ms that it will never renew.
    queue_stalled_waiter(&env, &key, "ghost").await;
    // A holder (its value with the waiters' mark field) for 100 ms, so that the waiter below
    // queues behind the ghost instead of taking a free key with its first, plain-command attempt.
    set_for(&env, &key, "AAAAAAAAAAAAAAAAAAAAAA;h=h;p=7;w=0", ms(100)).await;
    // The waiter gets the lock once the ghost's place ran out (300 ms after the waiter first
    // saw it), well before the queue's keys would expire by themselves (4 graces, 1.2 s).
    let start = Instant::now();
    let lease = env
        .locker
        .acquire("phantom", &opts(1_000).with_wait(ms(3_000)))
        .await
        .unwrap();
    assert!(start.elapsed() < ms(1_000), "waited {:?}", start.elapsed());
    assert!(
        start.elapsed() >= ms(300),
        "taken after {:?}, before the ghost's grace ran out",
        start.elapsed()
    );
    lease.release().await.unwrap();
    assert_eq!(queue_len(&env, "phantom").await, 0);
}

#[tokio::test]
async fn a_cancelled_or_timed_out_waiter_leaves_the_queue_at_once() {
    let env = Env::start().await;
    let holder = env
        .locker
        .acquire("leave", &opts(10_000).without_fence())
        .await
        .unwrap();
    let locker = env.locker.clone();
    let task = tokio::spawn(async move {
        locker
            .acquire("leave", &opts(1_000).with_wait(ms(10_000)))
            .await
    });
    queued(&env, "leave", 1).await;
    task.abort();
    eventually(ms(150), "the cancelled waiter left the queue", || async {
        queue_len(&env, "leave").await == 0
    })
    .await;
    let err = env
        .locker
        .acquire("leave", &opts(1_000).with_wait(ms(100)))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }));
    assert_eq!(
        queue_len(&env, "leave").await,
        0,
        "a timed-out waiter left the queue"
    );
    // They marked the holder's value before they left: its release, with nobody queued any
    // more, still frees the key.
    let key = env.key("leave");
    assert!(env.get(&key).await.unwrap().ends_with(";w=1"));
    holder.release().await.unwrap();
    assert!(!env.exists(&key).await);
}

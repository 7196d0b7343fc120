//! Promises of the guarantees guide (docs/guarantees.md), each with a test that fails when it
//! breaks, against real redis-server processes. Each test also shows that the fault it guards
//! against really happened (a snapshot was loaded, a request was in flight, ...).

use crate::support;

use std::sync::{Arc, Mutex};

use lock_runtime::{LockError, LockOptions, Locker, LostReason};
use lock_testing::{FaultProxy, RedisServer, ServerClock};
use support::{
    Env, acquire_all, acquire_timed, assert_increasing, calls, connect_with, cycle, cycles,
    eventually, ms, opts, pubsub_channels, raw_connection, spawn_acquire, within,
};
use tokio::time::{Instant, sleep, timeout};

/// Sends `cmd` to the server at `url`, on a connection of its own.
async fn query<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> T {
    support::query(&raw_connection(url).await, cmd).await
}

/// A locker that reaches `server` through a fault proxy, with its scripts already loaded (so
/// that a delay set later costs one round trip per call, not three).
async fn proxied(server: &RedisServer) -> (FaultProxy, Locker) {
    let proxy = FaultProxy::start(server.addr()).await;
    let locker = connect_with(&proxy.url(), |b| b.response_timeout(ms(5_000))).await;
    warm_up(&locker).await;
    (proxy, locker)
}

/// Loads the acquire, renew and release scripts and opens the pub/sub connection: one lease
/// renewed once, then handed to a waiter.
async fn warm_up(locker: &Locker) {
    let lease = locker
        .acquire("warm-up", &opts(60).with_renew(ms(10)))
        .await
        .unwrap();
    let first = lease.deadline();
    while lease.deadline() == first {
        sleep(ms(2)).await;
    }
    let waiter = spawn_acquire(locker, "warm-up", opts(1_000).with_wait(ms(5_000)));
    sleep(ms(20)).await;
    lease.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
}

// Fences keep growing after a restart that loaded an older snapshot: the counter comes back
// smaller, the server's clock does not.
#[tokio::test]
async fn fences_never_go_backwards_after_a_restart_from_an_older_snapshot() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.unwrap();
    let o = opts(5_000);
    let mut fences = cycles(&locker, "snapshot", &o, 3, |_| false).await;
    let () = query(&server.url(), &redis::cmd("SAVE")).await;
    fences.extend(cycles(&locker, "snapshot", &o, 3, |_| false).await);
    server.kill();
    server.restart();
    // The fault happened: the server came back with the counter as it was at the SAVE.
    let counter: u64 = query(
        &server.url(),
        redis::cmd("GET").arg(format!("{}:fence", locker.key_of("snapshot"))),
    )
    .await;
    assert_eq!(counter, fences[2], "the older snapshot was loaded");
    let reconnecting = |e: &LockError| matches!(e, LockError::Redis { .. });
    fences.extend(cycles(&locker, "snapshot", &o, 3, reconnecting).await);
    assert_increasing(&fences, "fences across the restart");
}

// A restart from an older snapshot also brings back the waiter queue of that moment: a release
// may hand the lock to a waiter that got it and left since. Nobody renews that grant: the lock
// is free again after that waiter's grace, not after the queue's lifetime or never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_restored_from_an_older_snapshot_holds_the_lock_for_its_grace_at_most() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.unwrap();
    let holder = locker.acquire("restored-q", &opts(30_000)).await.unwrap();
    let waiter = spawn_acquire(&locker, "restored-q", opts(30_000).with_wait(ms(10_000)));
    let queue = format!("{}:waiters", locker.key_of("restored-q"));
    eventually(ms(3_000), "the waiter queued", || async {
        let n: usize = query(&server.url(), redis::cmd("ZCARD").arg(&queue)).await;
        n == 1
    })
    .await;
    let () = query(&server.url(), &redis::cmd("SAVE")).await;
    holder.release().await.unwrap();
    let lease = within(ms(5_000), waiter, "the waiter got the lock")
        .await
        .unwrap();
    let token = lease.token().split(';').next().unwrap().to_owned();
    // Gone: its lease released, its call ended.
    lease.release().await.unwrap();
    server.kill();
    server.restart();
    // The snapshot's holder comes back; an operator frees it, and the release hands the lock to
    // the restored waiter, whose call ended long ago.
    let until = Instant::now() + ms(3_000);
    let info = loop {
        match locker.inspect("restored-q").await {
            Ok(Some(info)) => break info,
            // The locker reconnects after the restart.
            Err(LockError::Redis { .. }) if Instant::now() < until => sleep(ms(20)).await,
            other => panic!("the snapshot's holder is not back: {other:?}"),
        }
    };
    assert!(
        locker
            .force_release("restored-q", &info.value)
            .await
            .unwrap()
    );
    let handed: String = query(
        &server.url(),
        redis::cmd("GET").arg(locker.key_of("restored-q")),
    )
    .await;
    assert!(
        handed.starts_with(&token),
        "handed to {handed}, not to the restored waiter {token}"
    );
    let (lease, waited) =
        acquire_timed(&locker, "restored-q", &opts(30_000).with_wait(ms(10_000))).await;
    assert!(
        waited < ms(2_000),
        "the lock waited {waited:?} behind a restored waiter"
    );
    lease.release().await.unwrap();
}

// An acquire whose future is dropped while its request is out is undone about one round trip
// later: its key is not left for the whole ttl.
#[tokio::test]
async fn an_acquire_dropped_in_flight_is_undone_within_a_round_trip() {
    let server = RedisServer::start();
    let (proxy, slow) = proxied(&server).await;
    let direct = Locker::connect(&server.url()).await.unwrap();
    let key = direct.key_of("dropped");
    let o = opts(10_000);
    proxy.delay(ms(100));
    // Dropped after the request reached the server (100 ms) and before its reply (200 ms).
    let gave_up = timeout(ms(150), slow.acquire("dropped", &o)).await;
    assert!(gave_up.is_err(), "the acquire should still have been out");
    // The fault is real: the server granted the lock to the caller that gave up.
    let value: Option<String> = query(&server.url(), redis::cmd("GET").arg(&key)).await;
    assert!(value.is_some(), "the dropped acquire set the key");
    let (lease, waited) = acquire_timed(&direct, "dropped", &o.with_wait(ms(5_000))).await;
    assert!(
        waited < ms(1_000),
        "the next waiter got the lock after {waited:?}, not within about one round trip (200 ms)"
    );
    lease.release().await.unwrap();
}

// Waiters cancelled while their SUBSCRIBE is in flight leave no subscription behind, and a
// reconnect does not add them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_leave_no_subscriptions_even_after_a_reconnect() {
    let server = RedisServer::start();
    let (proxy, slow) = proxied(&server).await;
    let holder = Locker::connect(&server.url()).await.unwrap();
    let names: Vec<String> = (0..40).map(|i| format!("sub-{i}")).collect();
    let mut held = Vec::new();
    for name in &names {
        held.push(holder.acquire(name, &opts(20_000)).await.unwrap());
    }
    proxy.delay(ms(20));
    // One live waiter, whose channel must stay.
    let live = spawn_acquire(&slow, "sub-live", opts(1_000).with_wait(ms(20_000)));
    let _live_holder = holder.acquire("sub-live", &opts(20_000)).await;
    // Waiters dropped at points spread over their first attempt (about 80 ms here, 40 waiters
    // at once) and their SUBSCRIBE (40 ms more), many of them while the SUBSCRIBE is out.
    let mut tasks = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let (slow, name) = (slow.clone(), name.clone());
        let cut = ms(60 + (i as u64 * 3) % 90);
        tasks.push(tokio::spawn(async move {
            let o = opts(1_000).with_wait(ms(10_000));
            timeout(cut, slow.acquire(&name, &o)).await.is_err()
        }));
    }
    for t in tasks {
        assert!(
            t.await.unwrap(),
            "every waiter was still waiting when dropped"
        );
    }
    // The server's view, on a connection of the test's own (not through the proxy).
    let raw = raw_connection(&server.url()).await;
    // The live waiter's channels: the lock's and its locker's grant channel (`:released:<id>`).
    let live_channel = format!("{}:released", slow.key_of("sub-live"));
    let only_live = |channels: &[String]| {
        channels.len() == 2 && channels.iter().all(|c| c.starts_with(&live_channel))
    };
    eventually(
        ms(3_000),
        "only the live waiter's channels are left",
        || async { only_live(&pubsub_channels(&raw).await) },
    )
    .await;
    // The fault is real: cancelled waiters' SUBSCRIBEs reached the server (and
    // were undone).
    let subscribes = calls(&raw, "subscribe").await;
    assert!(
        subscribes >= 10,
        "only {subscribes} SUBSCRIBEs reached the server"
    );
    // A reconnect must not bring any of them back, nor lose the live one.
    proxy.reset_all();
    sleep(ms(500)).await;
    let until = Instant::now() + ms(3_000);
    loop {
        let now = pubsub_channels(&raw).await;
        if only_live(&now) {
            break;
        }
        assert!(
            Instant::now() < until,
            "after the reconnect the server has {now:?}, not only {live_channel} and its grants; connections {}, live waiter finished: {}",
            proxy.connection_count(),
            live.is_finished()
        );
        sleep(ms(5)).await;
    }
    drop(held);
    live.abort();
}

// Thousands of leases renewed over a slow link are all kept: the chunks of one renewal round go
// out together, not one after another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_leases_over_a_slow_link_are_all_renewed() {
    let server = RedisServer::start();
    let (proxy, slow) = proxied(&server).await;
    let names = (0..6_000).map(|i| format!("many-{i}"));
    let leases = acquire_all(&slow, names, LockOptions::new(ms(3_000))).await;
    proxy.delay(ms(300));
    let started = Instant::now();
    // Two renewal rounds and more, over a 600 ms round trip.
    sleep(ms(4_500)).await;
    let lost = leases.iter().filter(|l| !l.is_held()).count();
    assert_eq!(lost, 0, "leases lost while the server answered");
    // The fault is real: the link is slow (a lease's renewal took at least the delay).
    assert!(started.elapsed() >= ms(4_500));
    let first_deadline = leases[0].deadline();
    assert!(
        first_deadline > started + ms(3_000),
        "renewed at least once"
    );
    proxy.pass();
    drop(leases);
}

// A renewal sent around a min_hold release never stretches the key back to the full ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_renewal_stretches_a_key_released_into_min_hold() {
    let env = Env::start().await;
    let o = opts(2_000).with_renew(ms(100)).with_min_hold(ms(400));
    let mut tasks = Vec::new();
    for i in 0..100 {
        let locker = env.locker.clone();
        tasks.push(tokio::spawn(async move {
            let lease = locker.acquire(&format!("hold-{i}"), &o).await.unwrap();
            // Release right when the first renewal is due, so that the two race.
            let due = lease.deadline() - ms(2_000 - 22) + ms(100);
            tokio::time::sleep_until(due - ms((i % 5) as u64)).await;
            lease.release().await.unwrap();
        }));
    }
    let released = Instant::now();
    for t in tasks {
        t.await.unwrap();
    }
    // min_hold ends 400 ms after each start: every key must be gone well before the ttl.
    tokio::time::sleep_until(released + ms(700)).await;
    let mut stretched = Vec::new();
    for i in 0..100 {
        if env.exists(&env.key(&format!("hold-{i}"))).await {
            stretched.push(i);
        }
    }
    assert!(
        stretched.is_empty(),
        "keys stretched past min_hold: {stretched:?}"
    );
}

// A renewal whose reply comes after the lease's deadline does not make a lost lease held again.
#[tokio::test]
async fn a_lost_lease_stays_lost_when_a_late_renewal_reply_arrives() {
    let server = RedisServer::start();
    let (proxy, slow) = proxied(&server).await;
    let o = opts(1_000).with_renew(ms(300));
    let lease = slow.acquire("late-reply", &o).await.unwrap();
    // The renewal at 300 ms reaches the server at 700 ms (the key lives until 1 s) and its
    // reply comes back at 1.1 s, after the lease's validity (988 ms) ran out.
    proxy.delay(ms(400));
    let reason = timeout(ms(2_000), lease.lost()).await.unwrap();
    assert_eq!(reason, LostReason::ValidityExpired);
    let lost_at = Instant::now();
    // The fault is real: the renewal did reach the server and re-set the key.
    eventually(ms(1_000), "the late renewal re-set the key", || async {
        let pttl: i64 = query(
            &server.url(),
            redis::cmd("PTTL").arg(slow.key_of("late-reply")),
        )
        .await;
        pttl > 0 && lost_at.elapsed() > ms(100)
    })
    .await;
    // The reply lands at about 1.1 s; it would have extended the lease to 1.29 s.
    let until = Instant::now() + ms(300);
    while Instant::now() < until {
        assert!(!lease.is_held(), "a lost lease became held again");
        sleep(ms(5)).await;
    }
    assert_eq!(timeout(ms(10), lease.lost()).await.ok(), Some(reason));
}

// Waiters on a link with a 1 s round trip keep their place in the queue and are served in
// arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_a_one_second_round_trip_are_served_in_arrival_order() {
    let env = Env::start().await;
    let holder = env
        .locker
        .acquire("slow-fifo", &opts(20_000))
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    let mut proxies = Vec::new();
    let queue = format!("{}:waiters", env.key("slow-fifo"));
    for i in 0..4 {
        let (proxy, locker) = proxied(&env.server).await;
        proxy.delay(ms(500));
        proxies.push(proxy);
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let o = opts(2_000).with_wait(ms(30_000));
            locker
                .run("slow-fifo", &o, async |_| order.lock().unwrap().push(i))
                .await
                .unwrap();
        }));
        eventually(ms(5_000), "the waiter queued", || async {
            let n: usize = query(&env.server.url(), redis::cmd("ZCARD").arg(&queue)).await;
            n == i + 1
        })
        .await;
    }
    // Several waiting rounds at a 1 s round trip.
    sleep(ms(3_000)).await;
    let n: usize = query(&env.server.url(), redis::cmd("ZCARD").arg(&queue)).await;
    assert_eq!(n, 4, "a live waiter lost its place");
    holder.release().await.unwrap();
    for w in waiters {
        timeout(ms(20_000), w).await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
}

// A transient Redis error while waiting does not end the wait: the waiter reconnects and gets
// the lock within it.
#[tokio::test]
async fn a_transient_error_while_waiting_is_retried_within_the_wait() {
    let server = RedisServer::start();
    let (proxy, slow) = proxied(&server).await;
    let holder = Locker::connect(&server.url()).await.unwrap();
    let lease = holder.acquire("flaky", &opts(600)).await.unwrap();
    let waiter = spawn_acquire(&slow, "flaky", opts(1_000).with_wait(ms(5_000)));
    sleep(ms(100)).await;
    // The fault: the waiter's connection is cut and refused for a moment.
    proxy.refuse(true);
    proxy.reset_all();
    sleep(ms(300)).await;
    proxy.refuse(false);
    drop(lease);
    let got = timeout(ms(6_000), waiter).await.unwrap().unwrap();
    assert!(got.is_ok(), "{:?}", got.err());
}

// Names with braces would break the hash tag, and an empty name would make a key of its own:
// both are config errors, and nothing is written.
#[tokio::test]
async fn names_that_would_break_the_hash_tag_are_config_errors() {
    let env = Env::start().await;
    for bad in ["", "a{b", "a}b", "{x}"] {
        let err = env.locker.acquire(bad, &opts(1_000)).await.unwrap_err();
        let LockError::Config { message, .. } = &err else {
            panic!("{bad:?}: {err}");
        };
        assert!(
            message.contains("lock name"),
            "{bad:?}: the message says why: {message}"
        );
        let err = env
            .locker
            .run(bad, &opts(1_000), async |_| ())
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err}");
    }
    let keys: Vec<String> = query(&env.server.url(), redis::cmd("KEYS").arg("*")).await;
    assert!(keys.is_empty(), "nothing was written: {keys:?}");
}

// A nested locked call on a name this task holds runs under the held lease instead of waiting
// for itself.
#[tokio::test]
async fn a_nested_call_on_a_held_name_runs_under_the_held_lease() {
    let env = Env::start().await;
    let o = opts(5_000).with_wait(ms(300));
    let locker = env.locker.clone();
    let (outer, inner) = env
        .locker
        .run("reentrant", &o, async |lease| {
            let inner = locker
                .run("reentrant", &o, async |nested| nested.fence())
                .await
                .unwrap();
            (lease.fence(), inner)
        })
        .await
        .unwrap();
    assert_eq!(outer, inner, "the nested call ran under the same lease");
    // Released once, at the end of the outer call.
    assert!(!env.exists(&env.key("reentrant")).await);
    // Another task, even one spawned by the holder, is another holder.
    let locker = env.locker.clone();
    let err = env
        .locker
        .run("reentrant", &o, async |_| {
            let locker = locker.clone();
            tokio::spawn(async move {
                locker
                    .run("reentrant", &opts(5_000).with_wait(ms(100)), async |_| ())
                    .await
            })
            .await
            .unwrap()
        })
        .await
        .unwrap();
    assert!(matches!(err, Err(LockError::Busy { .. })), "{err:?}");
}

// A vanished waiter's place is ended by the other waiters' own clocks (its state unchanged for
// its grace), not by the server's wall clock: a step back of the server's clock neither keeps
// that place alive nor keeps the free lock from everyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_clock_step_back_does_not_keep_a_vanished_waiters_place() {
    let clock = ServerClock::new();
    let server = RedisServer::start_with_clock(&clock, &[]);
    let direct = Locker::connect(&server.url()).await.unwrap();
    let holder = direct.acquire("clock-q", &opts(2_000)).await.unwrap();
    // A waiter that queues first, then vanishes: its link goes silent for good.
    let (proxy, vanishing) = proxied(&server).await;
    let ghost = spawn_acquire(&vanishing, "clock-q", opts(2_000).with_wait(ms(60_000)));
    let queue = format!("{}:waiters", direct.key_of("clock-q"));
    eventually(ms(3_000), "the vanishing waiter queued", || async {
        let n: usize = query(&server.url(), redis::cmd("ZCARD").arg(&queue)).await;
        n == 1
    })
    .await;
    proxy.blackhole();
    // The fault: the server's clock goes back an hour.
    let before: (u64, u64) = query(&server.url(), &redis::cmd("TIME")).await;
    clock.step_back(ms(3_600_000));
    let after: (u64, u64) = query(&server.url(), &redis::cmd("TIME")).await;
    assert!(after.0 + 3_500 < before.0, "the server clock stepped back");
    holder.release().await.unwrap();
    // A live waiter gets the free lock once the vanished one outstayed its grace, not in an hour.
    let (lease, waited) =
        acquire_timed(&direct, "clock-q", &opts(2_000).with_wait(ms(10_000))).await;
    assert!(
        waited < ms(2_000),
        "the free lock waited {waited:?} behind a vanished waiter"
    );
    // The vanished waiter really was first in line when the lock came free.
    assert!(waited >= ms(250), "got it after {waited:?}");
    lease.release().await.unwrap();
    ghost.abort();
}

// Where the server clock does matter (docs/guarantees.md#clocks): Redis expires keys by its wall
// clock, so a forward step expires a held key early. The holder learns it at its next renewal,
// and the fence of whoever took the key in between is higher, so a fenced store refuses the
// first.
#[tokio::test]
async fn a_server_clock_step_forward_expires_a_held_key_and_the_holder_learns_it() {
    let clock = ServerClock::new();
    let server = RedisServer::start_with_clock(&clock, &[]);
    let locker = Locker::connect(&server.url()).await.unwrap();
    let first = locker
        .acquire("clock-fwd", &opts(3_000).with_renew(ms(1_000)))
        .await
        .unwrap();
    clock.step_forward(ms(10_000));
    // The fault: the key expired at once, and someone else takes it.
    let second = locker
        .acquire("clock-fwd", &opts(3_000).with_wait(ms(500)))
        .await
        .unwrap();
    assert!(second.fence() > first.fence());
    let reason = timeout(ms(2_500), first.lost()).await.unwrap();
    assert_eq!(reason, LostReason::NotOwner);
    second.release().await.unwrap();
}

// The nested call's own max_exec still bounds its body, under the held lease.
#[tokio::test]
async fn a_nested_call_keeps_its_own_max_exec() {
    let env = Env::start().await;
    let locker = env.locker.clone();
    let outer = opts(5_000).with_wait(ms(100));
    let inner = opts(5_000).with_max_exec(ms(50));
    let (nested, still_held) = env
        .locker
        .run("nested-max", &outer, async |lease| {
            let nested = locker
                .run("nested-max", &inner, async |_| sleep(ms(1_000)).await)
                .await;
            (nested, lease.is_held())
        })
        .await
        .unwrap();
    assert!(
        matches!(nested, Err(LockError::MaxExecExceeded { .. })),
        "{nested:?}"
    );
    assert!(
        still_held,
        "the outer lease is untouched by the nested call's end"
    );
}

// Fence counters are not kept forever: they expire after the locker's retention (7 days by
// default), or never with `fence_retention(None)`.
#[tokio::test]
async fn fence_counters_expire_after_the_retention() {
    let env = Env::start().await;
    let fence_key = |name: &str| format!("{}:fence", env.key(name));
    cycle(&env.locker, "kept", &opts(1_000)).await;
    let week = 7 * 24 * 3_600_000;
    let pttl = env.pttl(&fence_key("kept")).await;
    assert!(pttl > week - 60_000 && pttl <= week, "PTTL {pttl}");
    let forever = env.locker_with(|b| b.fence_retention(None)).await;
    cycle(&forever, "forever", &opts(1_000)).await;
    assert_eq!(env.pttl(&fence_key("forever")).await, -1);
    // After the counter expired, fences still grow (they start from the server clock).
    let before = forever.acquire("forever", &opts(1_000)).await.unwrap();
    let f1 = before.fence();
    before.release().await.unwrap();
    env.del(&fence_key("forever")).await;
    let after = forever.acquire("forever", &opts(1_000)).await.unwrap();
    assert!(after.fence() > f1);
    after.release().await.unwrap();
}

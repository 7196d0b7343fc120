//! One locker used from several tokio runtimes (a process-wide default locker used by
//! `#[tokio::test]`s, a service with a runtime per subsystem): the renewal task runs in the
//! runtime of whoever started it, and that runtime may shut down while another runtime's
//! leases are still held. Those leases must go on being renewed, and the locker's calls must go
//! on working although its connections were made in the runtime that shut down.

use crate::support;

use std::time::Duration;

use lock_runtime::{Lease, LockOptions, Locker};
use lock_testing::{FaultProxy, RedisServer};
use support::monitor::Monitor;
use support::{eventually, ms, opts};
use tokio::runtime::Runtime;
use tokio::time::Instant;

fn multi_thread() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Waits (bounded) until `lease` was confirmed by a renewal sent after `since`, and fails if the
/// lease is lost first.
async fn renewed_after(lease: &Lease, since: Instant, o: &LockOptions, limit: Duration) {
    let confirmed = async {
        // The validity counts from the renewal's send time: past `since + ttl - drift` means a
        // renewal sent after `since` was confirmed.
        while lease.deadline() <= since + o.ttl() - o.drift() {
            tokio::time::sleep(ms(2)).await;
        }
    };
    tokio::select! {
        () = confirmed => {}
        reason = lease.lost() => panic!("the lease was lost ({reason:?}): nothing renewed it"),
        () = tokio::time::sleep(limit) => panic!("no renewal within {limit:?}"),
    }
    assert!(lease.is_held());
}

/// The locker is built without connecting, as the default locker is: its first call (in
/// runtime `a`) connects and starts the renewal task there. `a` shuts down while `b` holds a
/// lease: `b`'s lease is renewed from then on, and released as its own. Runtime `c`, which
/// registered a lease before `b` did, shut down first: the task passes it by.
#[test]
fn a_lease_stays_renewed_after_the_runtime_running_the_renewals_shuts_down() {
    let server = RedisServer::start();
    let (a, b, c) = (multi_thread(), multi_thread(), multi_thread());
    let locker = a.block_on(async { Locker::builder().url(server.url()).build().unwrap() });
    let o = opts(600).with_renew(ms(150));
    // `a` starts the renewal task, which stays while `a`'s lease is held.
    let first = a.block_on(locker.acquire("runtimes:first", &o)).unwrap();
    // Held outside `c` (moved out of it), so `c`'s place in the schedule outlives `c`.
    let third = c.block_on(locker.acquire("runtimes:third", &o)).unwrap();
    let second = b.block_on(locker.acquire("runtimes:second", &o)).unwrap();
    drop(c);
    let shut_down = Instant::now();
    drop(a);
    b.block_on(async {
        drop((first, third));
        renewed_after(&second, shut_down, &o, ms(3_000)).await;
        second.release().await.expect("still ours at release");
    });
}

/// A lease taken in `a` and held in `b`, which took none: when `a` shuts down, no runtime that
/// took a held lease is left, and renewal goes on in a thread of its own. The thread ends once
/// nothing is held, and the locker's calls in `b` go on working after it ended (its runtime made
/// the connections the renewals used).
#[test]
fn a_lease_held_outside_the_runtime_that_took_it_stays_renewed_after_that_runtime_shuts_down() {
    let server = RedisServer::start();
    let (a, b) = (multi_thread(), multi_thread());
    let locker = a.block_on(async { Locker::builder().url(server.url()).build().unwrap() });
    let o = opts(600).with_renew(ms(150));
    let lease = a.block_on(locker.acquire("runtimes:moved", &o)).unwrap();
    let shut_down = Instant::now();
    drop(a);
    b.block_on(async {
        renewed_after(&lease, shut_down, &o, ms(3_000)).await;
        assert!(renewal_threads() >= 1, "renewed by a thread of its own");
        lease.release().await.expect("still ours at release");
        eventually(ms(5_000), "the renewal thread ends", || async {
            renewal_threads() == 0
        })
        .await;
        let again = locker
            .acquire("runtimes:moved", &o)
            .await
            .expect("an acquire after the renewal thread ended");
        again.release().await.unwrap();
    });
}

/// How many threads of this process renew leases outside every runtime that took one.
fn renewal_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "lock-renewal")
        .count()
}

/// As above, but `a` shuts down while a renewal round it started waits for its reply (the
/// replies are delayed by a proxy): the leases that round took out of the schedule go back.
#[test]
fn a_lease_stays_renewed_when_its_renewal_round_is_dropped_mid_flight() {
    let server = RedisServer::start();
    // `a` runs the renewal round by itself, without a `block_on`.
    let (a, b) = (multi_thread(), multi_thread());
    let delay = ms(150);
    let (proxy, locker) = b.block_on(async {
        let proxy = FaultProxy::start(server.addr()).await;
        let locker = Locker::connect(&proxy.url()).await.unwrap();
        (proxy, locker)
    });
    let o = opts(3_000).with_renew(ms(500));
    let first = a.block_on(locker.acquire("runtimes:first", &o)).unwrap();
    let second = b.block_on(locker.acquire("runtimes:second", &o)).unwrap();
    let monitor = Monitor::start(server.addr());
    proxy.delay(delay);
    // A renewal reached the server; its reply is still on its way back (`delay`).
    let key = locker.key_of("runtimes:second");
    let seen = std::time::Instant::now();
    while !monitor
        .commands()
        .iter()
        .any(|c| !c.in_script && c.args[0] == "EVALSHA" && c.args.contains(&key))
    {
        assert!(seen.elapsed() < Duration::from_secs(5), "no renewal sent");
        std::thread::sleep(ms(1));
    }
    let shut_down = Instant::now();
    drop(a);
    b.block_on(async {
        drop(first);
        renewed_after(&second, shut_down, &o, ms(6_000)).await;
        second.release().await.expect("still ours at release");
    });
    drop(proxy);
}

/// The connections are made in runtime `a` (the release messages' one by a call that waits
/// there), and `a` shuts down. The first request through a connection whose runtime is gone
/// fails in redis-rs ("broken pipe") and the connection is made again, from `b`: a release and
/// an acquire with `wait = 0` are tried once more on the new connection, and succeed. Waits
/// and hand-overs work as before: a waiter listens for its grant (subscribed, as the server
/// counts) and is woken by it at its holder's release, long before the key would expire.
#[test]
fn calls_succeed_after_the_runtime_that_made_the_connections_shuts_down() {
    let server = RedisServer::start();
    let (a, b) = (multi_thread(), multi_thread());
    let build = || Locker::builder().url(server.url()).build().unwrap();
    let (first, second) = a.block_on(async { (build(), build()) });
    let once = opts(10_000);
    let waits = opts(10_000).with_wait(ms(3_000));
    let url = server.url();
    let take_and_hand_over = |locker: Locker| {
        let url = url.clone();
        async move {
            let raw = support::raw_connection(&url).await;
            let key = locker.key_of("runtimes:waited");
            support::warm_release_scripts(&locker, "runtimes:warm").await;
            let mut attempts = 0;
            for _ in 0..HAND_OVERS {
                let holder = locker.acquire("runtimes:waited", &once).await.unwrap();
                let waiter = {
                    let locker = locker.clone();
                    tokio::spawn(async move { locker.acquire("runtimes:waited", &waits).await })
                };
                // The waiter queued: the release hands the lock over to it.
                eventually(ms(2_000), "the waiter queued", || {
                    queued(&locker, "runtimes:waited")
                })
                .await;
                let (_, grants) = support::queue::first_waiter(&raw, &key).await;
                eventually(ms(2_000), "the waiter listens for its grant", || async {
                    support::subscribers(&raw, &grants).await == 1
                })
                .await;
                support::reset_stats(&raw).await;
                holder.release().await.unwrap();
                let lease = waiter
                    .await
                    .unwrap()
                    .expect("handed the lock at the release, within the wait");
                // The holder took the lock before anyone queued: its release is the short
                // script, which leaves the marked key to the whole one. An attempt of the
                // waiter's would be a third script call.
                let calls = support::calls(&raw, "evalsha").await;
                assert!(
                    calls >= 2,
                    "the release sent {calls} script calls, not 2: the count is off"
                );
                attempts += calls - 2;
                lease.release().await.unwrap();
            }
            // Woken by the grant's message, a waiter holds the lock without an attempt; only
            // its own timer (every 100 ms or more) may add one meanwhile. Without the message
            // every hand-over would wait for that timer's attempt (5 of 5, checked with the
            // waiting loop's wake-ups taken out).
            assert!(
                attempts <= 2,
                "{attempts} attempts in {HAND_OVERS} hand-overs: not woken by the grant"
            );
        }
    };
    let kept = a.block_on(async {
        take_and_hand_over(first.clone()).await;
        let lease = second.acquire("runtimes:other", &once).await.unwrap();
        lease.release().await.unwrap();
        first.acquire("runtimes:kept", &once).await.unwrap()
    });
    drop(a);
    b.block_on(async {
        // Each locker's first request here meets its connection gone.
        kept.release()
            .await
            .expect("a release is tried again on a new connection");
        let lease = second
            .acquire("runtimes:other", &once)
            .await
            .expect("an acquire with wait = 0 is tried again on a new connection");
        lease.release().await.unwrap();
        take_and_hand_over(first).await;
    });
}

/// A Redlock lease taken in runtime `a` is released from runtime `b` once `a` shut down: every
/// node's connection is found gone, and the release is sent again on each node, as it is on one
/// server, instead of counting the nodes as failed (which made the release fail with
/// `QuorumUnavailable` while the keys stayed until their ttl).
#[test]
fn a_redlock_release_is_sent_again_on_every_node_after_the_runtime_that_connected_shut_down() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let (a, b) = (multi_thread(), multi_thread());
    let once = opts(10_000);
    let (locker, lease) = a.block_on(async {
        let locker = Locker::builder().urls(urls.clone()).build().unwrap();
        // The release script is loaded on every node from here on.
        let warm = locker.acquire("runtimes:redlock", &once).await.unwrap();
        warm.release().await.unwrap();
        let lease = locker.acquire("runtimes:redlock", &once).await.unwrap();
        (locker, lease)
    });
    drop(a);
    b.block_on(async {
        lease
            .release()
            .await
            .expect("released on every node over new connections");
        let key = locker.key_of("runtimes:redlock");
        for url in &urls {
            let raw = support::raw_connection(url).await;
            assert!(!support::exists(&raw, &key).await, "{key} left on {url}");
        }
    });
}

/// Hand-overs per runtime in the connections test.
const HAND_OVERS: u64 = 5;

/// Whether a waiter queued behind the holder of `name`.
async fn queued(locker: &Locker, name: &str) -> bool {
    let info = locker.inspect(name).await;
    info.is_ok_and(|info| info.is_some_and(|info| !info.waiters.is_empty()))
}

/// One hand-over of `name` within `locker`: a holder, a waiter queued behind it, the release.
async fn hand_over(locker: &Locker, name: &'static str) {
    let holder = locker.acquire(name, &opts(10_000)).await.unwrap();
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move {
            let o = opts(10_000).with_wait(ms(3_000));
            locker.acquire(name, &o).await
        })
    };
    eventually(ms(2_000), "the waiter queued", || queued(locker, name)).await;
    holder.release().await.unwrap();
    let lease = waiter.await.unwrap().expect("handed over");
    lease.release().await.unwrap();
}

/// A channel stays subscribed for a second after its last waiter left, undone by a task in the
/// runtime where that waiter left. When that runtime shuts down within the second, the channel
/// stays subscribed on the live connection (made in another runtime) until the next waiter on
/// it leaves, whose own wait then undoes it.
#[test]
fn a_channel_left_lingering_by_a_runtime_that_shut_down_is_undone_after_its_next_waiter() {
    let server = RedisServer::start();
    let (a, b) = (multi_thread(), multi_thread());
    let locker = a.block_on(async { Locker::builder().url(server.url()).build().unwrap() });
    let name = "runtimes:linger";
    let channel = format!("{}:released", locker.key_of(name));
    let raw = a.block_on(support::raw_connection(&server.url()));
    // The subscribing connection is made in `a`, by a wait on another lock.
    a.block_on(hand_over(&locker, "runtimes:first-wait"));
    // A wait in `b`; its channel lingers, to be undone by a task in `b`, which shuts down.
    b.block_on(hand_over(&locker, name));
    drop(b);
    a.block_on(async {
        tokio::time::sleep(ms(1_500)).await;
        assert_eq!(
            support::subscribers(&raw, &channel).await,
            1,
            "the lingering channel is still subscribed: its undoing ended with `b`"
        );
        // The next waiter on it leaves in `a`: a second later the channel is undone.
        hand_over(&locker, name).await;
        eventually(ms(3_000), "the channel unsubscribed", || async {
            support::subscribers(&raw, &channel).await == 0
        })
        .await;
    });
}

//! Waiting for a lock on one server: a wait runs out with Busy, a locker subscribes once however
//! often it waits and leaves nothing behind, and the queue cleans up after waiters that left or
//! vanished. Arrival order and the hand-over on release are cases of `behaviour.rs`, run on
//! every deployment.

use crate::support;

use lock_runtime::LockError;
use support::monitor::{Command, Monitor};
use support::queue::{
    first_waiter, queue_len, queue_stalled_waiter, queue_taker, queue_waiter, queued,
};
use support::{
    Env, acquire_timed, assert_every_key_expires, cycle, eventually, ms, opts, query, set_for,
    spawn_acquire, timed, within,
};

#[tokio::test]
async fn wait_runs_out_with_busy_and_zero_wait_tries_once() {
    let env = Env::start().await;
    let _holder = env.locker.acquire("busy", &opts(10_000)).await.unwrap();
    // Bounded well below the holder's 10 s: the wait ends when it runs out, not with the lease.
    let waiting = opts(10_000).with_wait(ms(300));
    let attempt = env.locker.acquire("busy", &waiting);
    let (res, took) = timed(tokio::time::timeout(ms(5_000), attempt)).await;
    let err = res.expect("the wait ran out at 300 ms").unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }), "{err}");
    assert!(
        took >= ms(300),
        "Busy after {took:?}, before the wait ran out"
    );
    assert!(err.to_string().contains("busy"), "{err}");
    env.reset_stats().await;
    let err = env.locker.acquire("busy", &opts(10_000)).await.unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }));
    assert_eq!(env.calls("set").await, 1, "wait = 0 tries exactly once");
    assert_every_key_expires(&env.server).await;
}

/// A locker whose callers wait on the same lock again and again subscribes once: its two
/// channels (the lock's, and its grant channel) stay subscribed for a second after the last
/// waiter left, instead of a SUBSCRIBE and an UNSUBSCRIBE of each per wait, and are unsubscribed
/// after that. While they are, a caller of that locker queues with its first attempt, without
/// a plain `SET` first: the lock was contended a moment ago.
///
/// Read from the server's command stream, so that a slow machine does not fail it: a round may
/// take longer than the second (then the channels are undone and subscribed again), but no
/// channel is subscribed twice, none is undone sooner than ~1 s after a wait ended, and the
/// waiting locker sends a plain `SET` only before a wait that subscribes anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_that_waits_again_and_again_subscribes_once() {
    let env = Env::start().await;
    let name = "linger";
    let key = env.key(name);
    let waiting = env.second_locker().await;
    let lock_channel = format!("{key}:released");
    let mut grant_channel = String::new();
    let monitor = Monitor::start(env.server.addr());
    for _ in 0..5 {
        let holder = env.locker.acquire(name, &opts(10_000)).await.unwrap();
        let waiter = queue_taker(&env, waiting.clone(), name, ms(5_000), 1).await;
        grant_channel = first_waiter(&env.raw, &key).await.1;
        eventually(ms(2_000), "the waiter listens on both channels", || async {
            env.subscribers(&lock_channel).await == 1 && env.subscribers(&grant_channel).await == 1
        })
        .await;
        // In the command stream before the release: the wait ends after it.
        let _: String = query(&env.raw, redis::cmd("ECHO").arg(RELEASING)).await;
        holder.release().await.unwrap();
        within(ms(5_000), waiter, "handed over").await;
    }
    // Nobody waits any more: both are undone once they have been idle for a second.
    eventually(ms(3_000), "both channels unsubscribed", || async {
        env.subscribers(&lock_channel).await == 0 && env.subscribers(&grant_channel).await == 0
    })
    .await;
    let seen = monitor.commands();
    let subscribes = lingered_subscriptions(&seen, &lock_channel);
    lingered_subscriptions(&seen, &grant_channel);
    // Each holder's plain `SET`, and the waiter's before a wait that subscribed anew only.
    let plain_sets = seen
        .iter()
        .filter(|c| !c.in_script && c.args[0] == "SET" && c.args.get(1) == Some(&key))
        .count();
    let waiter_sets = plain_sets - 5;
    assert!(
        (1..=subscribes).contains(&waiter_sets),
        "5 waits sent {waiter_sets} plain SETs over {subscribes} subscriptions: a wait while \
         subscribed queues at once"
    );
    assert_every_key_expires(&env.server).await;
}

/// The marker each round of the linger test sends before its holder's release.
const RELEASING: &str = "test: releasing";

/// Checks `channel`'s subscriptions in the command stream `seen`: never subscribed twice, each
/// one undone, and none undone sooner than ~1 s after the last release before it (half a second
/// here: an UNSUBSCRIBE per wait comes milliseconds after it). Returns how many there were.
fn lingered_subscriptions(seen: &[Command], channel: &str) -> usize {
    let (mut subscribed, mut subscribes, mut releasing) = (false, 0, None);
    for c in seen.iter().filter(|c| !c.in_script) {
        let names_it = c.args[1..].iter().any(|a| a == channel);
        match c.args[0].as_str() {
            "ECHO" if c.args.get(1).map(String::as_str) == Some(RELEASING) => {
                releasing = Some(c.at)
            }
            "SUBSCRIBE" if names_it => {
                assert!(!subscribed, "{channel} subscribed while it was");
                (subscribed, subscribes) = (true, subscribes + 1);
            }
            "UNSUBSCRIBE" if names_it => {
                assert!(subscribed, "{channel} undone while it was not subscribed");
                let idle = c.at - releasing.expect("a release before the UNSUBSCRIBE");
                assert!(
                    idle >= 0.5,
                    "{channel} undone {idle:.3} s after a wait ended"
                );
                subscribed = false;
            }
            _ => {}
        }
    }
    assert!(
        subscribes >= 1 && !subscribed,
        "{channel}: {subscribes} SUBSCRIBEs, still on"
    );
    println!("{channel}: {subscribes} subscriptions over 5 waits");
    subscribes
}

/// Many distinct names: a locker that waits on 2,000 locks at once subscribes once to each
/// lock's channel and each grant channel, and a second after the last waiter left every one is
/// undone and every task the waits started (a linger task per channel) has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_that_waited_on_many_names_leaves_no_subscription_or_task_behind() {
    const NAMES: usize = 2_000;
    let env = Env::start().await;
    // A reply bound no load reaches: a SUBSCRIBE past it is sent again, and counted here.
    let waiting = env.locker_with(|b| b.response_timeout(ms(30_000))).await;
    // One wait first, so that the baseline counts the subscribing connection's own tasks.
    let warm_up = env
        .locker
        .acquire("many:warm-up", &opts(10_000))
        .await
        .unwrap();
    let waiter = queue_taker(&env, waiting.clone(), "many:warm-up", ms(5_000), 1).await;
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
                cycle(&locker, &name, &o).await
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
        within(ms(10_000), waiter, "granted").await;
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
    assert_every_key_expires(&env.server).await;
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
                let _: i64 = query(&env.raw, redis::cmd("PEXPIRE").arg(k).arg(120_000)).await;
            }
        }
        let waiter = queue_taker(
            &env,
            waiting.clone(),
            name,
            ms(5_000),
            if longer { 2 } else { 1 },
        )
        .await;
        let grace: i64 = {
            let ids: Vec<String> =
                query(&env.raw, redis::cmd("ZRANGE").arg(&queue).arg(-1).arg(-1)).await;
            let state: String = query(&env.raw, redis::cmd("HGET").arg(&states).arg(&ids[0])).await;
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
        within(ms(5_000), waiter, "handed over").await;
    }
    assert_every_key_expires(&env.server).await;
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
    let (lease, waited) =
        acquire_timed(&env.locker, "phantom", &opts(1_000).with_wait(ms(3_000))).await;
    assert!(waited < ms(1_000), "waited {waited:?}");
    assert!(
        waited >= ms(300),
        "taken after {waited:?}, before the ghost's grace ran out"
    );
    lease.release().await.unwrap();
    assert_eq!(queue_len(&env, "phantom").await, 0);
    assert_every_key_expires(&env.server).await;
}

#[tokio::test]
async fn a_cancelled_or_timed_out_waiter_leaves_the_queue_at_once() {
    let env = Env::start().await;
    let holder = env
        .locker
        .acquire(
            "leave",
            &lock_runtime::__private::without_fence(opts(10_000)),
        )
        .await
        .unwrap();
    let task = spawn_acquire(&env.locker, "leave", opts(1_000).with_wait(ms(10_000)));
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
    assert_every_key_expires(&env.server).await;
}

/// A queued waiter behind a key that expires comes back once per grace: nobody can evict it
/// before the key is free, which the release or the expiry tells it first. 20 waiters behind 20
/// held names cost the server at most 6 script calls a second each (a grace of about 300 ms),
/// and every one keeps its place over more than three graces: each release hands its name to
/// its waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_an_expiring_key_comes_back_once_per_grace() {
    const NAMES: usize = 20;
    let env = Env::start().await;
    let names: Vec<String> = (0..NAMES).map(|i| format!("patient:{i}")).collect();
    let mut holders = Vec::new();
    for name in &names {
        holders.push(env.locker.acquire(name, &opts(30_000)).await.unwrap());
    }
    let second = env.second_locker().await;
    let waiters: Vec<_> = names
        .iter()
        .map(|name| spawn_acquire(&second, name, opts(5_000).with_wait(ms(10_000))))
        .collect();
    for name in &names {
        queued(&env, name, 1).await;
    }
    // A rate, measured over a window: the waiters' returns in one second.
    env.reset_stats().await;
    tokio::time::sleep(ms(1_000)).await;
    let calls = env.calls("evalsha").await;
    assert!(
        calls <= 6 * NAMES as u64,
        "{calls} script calls in a second for {NAMES} waiters"
    );
    for holder in holders {
        holder.release().await.unwrap();
    }
    for (name, waiter) in names.iter().zip(waiters) {
        let lease = within(ms(2_000), waiter, "served").await.unwrap();
        assert_eq!(lease.name(), name.as_str());
        lease.release().await.unwrap();
    }
}

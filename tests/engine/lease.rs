//! `lease`: the key's expiry, renewed while the body runs, apart from `ttl`, which bounds the
//! whole hold. A live holder runs past its lease; a dead one frees the lock within it; a paused
//! one loses it, and its fenced writes are refused.

use crate::support;

use std::time::Duration;

use lock_runtime::{LockOptions, Locker};
use lock_testing::RedisServer;
use support::fenced::FencedStore;
use support::history::Mode;
use support::holder::{Holder, num_field};
use support::{Env, ms, query, timed};
use tokio::time::Instant;

const LEASE: u64 = 300;

/// A body three times as long as its lease runs to its end, renewed all along: the key's
/// remaining life, sampled every few ms, is never above the lease (the key's expiry is the
/// lease, not the ttl) and the key is never gone.
#[tokio::test]
async fn a_body_three_times_its_lease_runs_to_the_end_with_the_key_never_above_the_lease() {
    let env = Env::start().await;
    let key = env.key("long-body");
    let o = LockOptions::new(ms(60_000)).with_lease(ms(LEASE));
    let sampler = {
        let raw = env.raw.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let mut samples = Vec::new();
            // Until the key is released (a pttl of -2 after it was seen).
            loop {
                let pttl: i64 = query(&raw, redis::cmd("PTTL").arg(&key)).await;
                if pttl == -2 && !samples.is_empty() {
                    return samples;
                }
                if pttl != -2 {
                    samples.push(pttl);
                }
                tokio::time::sleep(ms(5)).await;
            }
        })
    };
    let (out, took) = timed(env.locker.run("long-body", &o, async |lease| {
        tokio::time::sleep(ms(3 * LEASE)).await;
        lease.is_held()
    }))
    .await;
    assert!(
        out.expect("the body ran to its end"),
        "the lease was not held at the end"
    );
    assert!(took >= ms(3 * LEASE), "{took:?}");
    let samples = support::within(ms(5_000), sampler, "the sampler saw the release").await;
    assert!(samples.len() >= 30, "{} samples", samples.len());
    let highest = *samples.iter().max().unwrap();
    let lowest = *samples.iter().min().unwrap();
    assert!(
        highest <= LEASE as i64 && lowest > 0,
        "pttl between {lowest} and {highest} ms: the key's expiry is not the lease"
    );
}

/// A holder process killed with SIGKILL (no release) leaves its key to expire: another caller
/// gets the lock within about the lease, not the ttl of a minute. The unsafe control: while
/// the holder lives, the lock is busy.
#[tokio::test]
async fn a_killed_holder_frees_the_lock_within_its_lease() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.unwrap();
    let mut holder = Holder::spawn(
        "hold",
        &[
            ("redis", server.url()),
            ("name", "killed".to_owned()),
            ("ttl", "60000".to_owned()),
            ("lease", LEASE.to_string()),
        ],
    );
    let held = holder.expect("acquired", ms(10_000)).await;
    let fence = num_field(&held, "fence");
    // Held past several leases: renewed by the live process.
    tokio::time::sleep(ms(2 * LEASE)).await;
    let busy = locker.acquire("killed", &LockOptions::new(ms(1_000))).await;
    assert!(busy.is_err(), "the live holder's lock was taken");
    let raw = support::raw_connection(&server.url()).await;
    let pttl: i64 = query(&raw, redis::cmd("PTTL").arg(locker.key_of("killed"))).await;
    assert!(0 < pttl && pttl <= LEASE as i64, "pttl {pttl}");
    holder.kill();
    let killed = Instant::now();
    let o = LockOptions::new(ms(1_000)).with_wait(ms(10_000));
    let lease = locker
        .acquire("killed", &o)
        .await
        .expect("free after the lease");
    let waited = killed.elapsed();
    assert!(lease.fence() > fence);
    assert!(
        waited <= ms(LEASE + 200),
        "the lock was free {waited:?} after the crash, not within the lease of {LEASE} ms"
    );
    lease.release().await.unwrap();
}

/// A holder frozen (SIGSTOP) past its lease loses the lock, although its ttl is a minute:
/// another caller takes it within about the lease and writes, and the frozen holder's write,
/// sent the moment it resumes, is refused by the fenced store.
#[tokio::test]
async fn a_holder_paused_past_its_lease_loses_it_and_its_fenced_write_is_refused() {
    let env = Env::start().await;
    let store_server = RedisServer::start();
    let store = FencedStore::connect(&store_server.url(), "paused-lease")
        .await
        .unwrap();
    store.reset(Mode::Fenced).await.unwrap();
    let mut a = Holder::spawn(
        "stale",
        &[
            ("redis", env.server.url()),
            ("store", store_server.url()),
            ("name", "paused-lease".to_owned()),
            ("client", "A".to_owned()),
            ("ttl", "60000".to_owned()),
            ("lease", LEASE.to_string()),
        ],
    );
    let a_fence = num_field(&a.expect("acquired", ms(10_000)).await, "fence");
    a.expect("blocked", ms(5_000)).await;
    a.pause().await;
    let paused = Instant::now();
    let o = LockOptions::new(ms(2_000)).with_wait(ms(10_000));
    let (b_fence, b_accepted) = env
        .locker
        .run("paused-lease", &o, async |lease| {
            let entered = store.enter("B", lease.fence()).await.unwrap();
            let wrote = store.write("B", lease.fence(), entered.basis).await;
            (lease.fence(), wrote.unwrap().accepted)
        })
        .await
        .expect("B takes the lock once A's lease ran out");
    let taken_after = paused.elapsed();
    assert!(
        b_fence > a_fence && b_accepted,
        "B: fence {b_fence}, accepted {b_accepted}"
    );
    assert!(a.is_stopped(), "A ran while B held the lock");
    assert!(
        taken_after < ms(LEASE + 2_000),
        "B waited {taken_after:?}: A's ttl, not its lease, kept the lock"
    );
    a.send_line("go");
    a.resume().await;
    let wrote = a.expect("wrote", ms(5_000)).await;
    assert!(wrote.contains("accepted=false"), "A's stale write: {wrote}");
    a.expect("result", ms(5_000)).await;
    assert!(a.wait(ms(5_000)).await.success());
    let report = store.check().await.unwrap();
    assert_eq!(report.stale_accepted.len(), 0, "{report}");
    assert_eq!(report.refused.len(), 1, "{report}");
}

/// The ttl still bounds the whole hold: `max_exec` defaults to `ttl - drift`, not to the lease.
#[tokio::test]
async fn max_exec_follows_the_ttl_not_the_lease() {
    let o = LockOptions::new(ms(60_000)).with_lease(ms(LEASE));
    assert_eq!(o.max_exec(), ms(60_000 - 602));
    assert_eq!(o.renew(), ms(LEASE / 3));
    assert_eq!(o.lease(), ms(LEASE));
    let env = Env::start().await;
    let short = LockOptions::new(ms(1_000))
        .with_lease(ms(LEASE))
        .with_max_exec(ms(2 * LEASE));
    let err = env
        .locker
        .run("bounded", &short, async |_| {
            tokio::time::sleep(Duration::from_secs(5)).await;
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, lock_runtime::LockError::MaxExecExceeded { .. }),
        "{err}"
    );
}

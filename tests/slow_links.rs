//! Leases renewed over a slow link: thousands of them over a link whose delay keeps changing
//! between 100 and 600 ms each way, and a lease of 1 s over 100, 200 and 300 ms each way. The
//! server always has each renewal in time, so no lease may be lost.

pub mod support;

use lock_runtime::{Lease, LockOptions, Locker};
use lock_testing::{FaultProxy, RedisServer};
use support::{acquire_all, connect_with, ms, query, raw_connection, timed};
use tokio::time::{Instant, sleep};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_leases_survive_a_slow_changing_link() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let locker = connect_with(&proxy.url(), |b| b.response_timeout(ms(3_000))).await;
    // ttl 6 s, renewed every 2 s: a renewal answered within 1.2 s (600 ms each way) leaves
    // more than 2.5 s of margin.
    let names = (0..4_000).map(|i| format!("slow-{i}"));
    let leases = acquire_all(&locker, names, LockOptions::new(ms(6_000))).await;
    let first_deadlines: Vec<Instant> = leases.iter().map(|l| l.deadline()).collect();
    // The fault: the delay changes every 400 ms, between 100 and 600 ms each way.
    let until = Instant::now() + ms(9_000);
    let mut delays = Vec::new();
    let mut step = 0u64;
    while Instant::now() < until {
        let delay = ms(100 + (step * 337) % 501);
        proxy.delay(delay);
        delays.push(delay.as_millis());
        step += 1;
        sleep(ms(400)).await;
        let lost = leases.iter().filter(|l| !l.is_held()).count();
        assert_eq!(
            lost, 0,
            "leases lost after {step} delay changes ({delays:?})"
        );
    }
    proxy.pass();
    // Every lease was renewed (several times) over the slow link.
    let renewed = leases
        .iter()
        .zip(&first_deadlines)
        .filter(|(l, first)| l.deadline() > **first + ms(3_000))
        .count();
    assert_eq!(renewed, leases.len(), "leases not renewed");
    println!(
        "{} leases held for 9 s through delays of {delays:?} ms each way: none lost",
        leases.len()
    );
    drop(leases);
    assert!(delays.iter().any(|&d| d >= 500) && delays.iter().any(|&d| d <= 200));
}

/// A lease of 1 s (ttl 60 s) over a link slowed to 100, 200 then 300 ms each way, each step held
/// 2.5 s by a lease taken at that step and by those taken before it. At 300 ms each way the
/// acquire's reply comes 600 ms after its request, and a renewal sent only then would be confirmed
/// at 1.2 s, past the 988 ms of validity the acquire gave: renewals must overlap. Every renewal
/// reaches the server in time, so no lease is ever lost, and the server holds every key
/// throughout (its PTTL, read directly, stays positive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_second_lease_holds_over_100_200_and_300_ms_each_way() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let locker = Locker::connect(&proxy.url()).await.unwrap();
    let raw = raw_connection(&server.url()).await;
    let o = LockOptions::new(ms(60_000)).with_lease(ms(1_000));
    let mut held: Vec<(String, Lease)> = Vec::new();
    for each_way in [100, 200, 300] {
        proxy.delay(ms(each_way));
        let name = format!("short-{each_way}");
        let (lease, took) = timed(locker.acquire(&name, &o)).await;
        // The fault is real: the acquire took a whole round trip of the slowed link.
        assert!(took >= ms(2 * each_way), "acquired in {took:?}");
        held.push((locker.key_of(&name), lease.unwrap()));
        let until = Instant::now() + ms(2_500);
        while Instant::now() < until {
            for (key, lease) in &held {
                assert!(
                    lease.is_held(),
                    "{key} lost at {each_way} ms each way (deadline {:?} ago)",
                    lease.deadline().elapsed()
                );
                let pttl: i64 = query(&raw, redis::cmd("PTTL").arg(key)).await;
                assert!(pttl > 0, "{key}: PTTL {pttl} at {each_way} ms each way");
            }
            sleep(ms(20)).await;
        }
    }
    proxy.pass();
    for (_, lease) in held {
        lease.release().await.unwrap();
    }
}

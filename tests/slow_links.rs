//! Thousands of held leases renewed over a link whose delay keeps changing between 100 and 600 ms
//! each way. The server always answers well inside each lease's margin, so no lease may be lost.

pub mod support;

use lock_runtime::LockOptions;
use lock_testing::{FaultProxy, RedisServer};
use support::{acquire_all, connect_with, ms};
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

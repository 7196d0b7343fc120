//! Row 5: Redlock on 3 and 5 nodes vs one node

use std::time::Duration;

use lock_runtime::Locker;
use lock_runtime::testing::RedisServer;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::raw::{RELEASE_LUA, join_all, load_script, raw_connection, raw_release, raw_take};
use crate::report::{Report, Verdict, median, median_duration, percentile, us, verdict};
use crate::{CYCLE_OPTS, CYCLE_TTL_MS, Config};

/// Latency of sequential cycles for `window`: `(acquire, whole cycle)` samples.
async fn engine_latencies(
    locker: &Locker,
    name: &str,
    window: Duration,
) -> (Vec<Duration>, Vec<Duration>) {
    let (mut acquire, mut cycle) = (Vec::new(), Vec::new());
    let until = Instant::now() + window;
    while Instant::now() < until {
        let t0 = Instant::now();
        let lease = locker.acquire(name, &CYCLE_OPTS).await.expect("acquire");
        let t1 = Instant::now();
        lease.release().await.expect("release");
        acquire.push(t1 - t0);
        cycle.push(t0.elapsed());
    }
    (acquire, cycle)
}

/// The raw floor on N nodes: SET NX PX on every node at once, then EVALSHA on every node at once.
async fn raw_latencies(
    conns: &[MultiplexedConnection],
    sha: &str,
    key: &str,
    window: Duration,
) -> (Vec<Duration>, Vec<Duration>) {
    let (mut acquire, mut cycle) = (Vec::new(), Vec::new());
    let until = Instant::now() + window;
    let mut seq = 0u64;
    while Instant::now() < until {
        seq += 1;
        let token = format!("{seq:022x}");
        let t0 = Instant::now();
        let taken = join_all(
            conns
                .iter()
                .map(|c| {
                    let mut c = c.clone();
                    let token = &token;
                    async move { raw_take(&mut c, key, token, CYCLE_TTL_MS).await }
                })
                .collect(),
        )
        .await;
        let t1 = Instant::now();
        assert!(taken.iter().all(|&t| t), "raw redlock floor: busy");
        join_all(
            conns
                .iter()
                .map(|c| {
                    let mut c = c.clone();
                    let token = &token;
                    async move { raw_release(&mut c, sha, key, token).await }
                })
                .collect(),
        )
        .await;
        acquire.push(t1 - t0);
        cycle.push(t0.elapsed());
    }
    (acquire, cycle)
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    percentile(&v, 50.0)
}

pub(crate) async fn redlock(cfg: &Config, report: &mut Report) {
    eprintln!("row 5: Redlock on 3 and 5 nodes");
    let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let sizes = [1usize, 3, 5];
    let mut lockers = Vec::new();
    let mut raws = Vec::new();
    let mut sha = String::new();
    for &n in &sizes {
        let locker = if n == 1 {
            Locker::connect(&urls[0]).await
        } else {
            Locker::redlock(urls[..n].iter().cloned()).await
        };
        lockers.push(locker.expect("locker connects"));
        let mut conns = Vec::new();
        for url in &urls[..n] {
            let mut conn = raw_connection(url).await;
            sha = load_script(&mut conn, RELEASE_LUA).await;
            conns.push(conn);
        }
        raws.push(conns);
    }
    let raw_key = "lock:{bench:redlock:raw}";
    // Per round and per size: p50 of [engine acquire, engine cycle, raw acquire, raw cycle].
    let mut rounds: Vec<Vec<[Duration; 4]>> = Vec::new();
    for round in 0..=cfg.rounds {
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut figures = vec![[Duration::ZERO; 4]; sizes.len()];
        for i in order {
            let name = format!("bench:redlock:{}", sizes[i]);
            let (a, c) = engine_latencies(&lockers[i], &name, cfg.slice).await;
            let (ra, rc) = raw_latencies(&raws[i], &sha, raw_key, cfg.slice).await;
            figures[i] = [p50(a), p50(c), p50(ra), p50(rc)];
        }
        // Round 0 is the warm-up.
        if round > 0 {
            rounds.push(figures);
        }
    }
    // Median over the rounds of a figure, and of its ratio to the one-node figure of its round.
    let fig = |i: usize, k: usize| median_duration(rounds.iter().map(|r| r[i][k]).collect());
    let ratio = |i: usize, k: usize| {
        median(
            rounds
                .iter()
                .map(|r| r[i][k].as_secs_f64() / r[0][k].as_secs_f64())
                .collect(),
        )
    };
    for (i, &n) in sizes.iter().enumerate().skip(1) {
        let r = ratio(i, 0);
        report.row(
            &format!("5{}", if n == 3 { 'a' } else { 'b' }),
            &format!("Redlock {n} nodes: acquire latency p50"),
            us(fig(i, 0)),
            format!("{} (engine, one node)", us(fig(0, 0))),
            format!("{r:.2}"),
            "<= 1.5",
            verdict(r <= 1.5),
        );
    }
    for (i, &n) in sizes.iter().enumerate().skip(1) {
        report.row(
            &format!("5{}", if n == 3 { 'c' } else { 'd' }),
            &format!("Redlock {n} nodes: acquire + release p50"),
            us(fig(i, 1)),
            format!("{} (engine, one node)", us(fig(0, 1))),
            format!("{:.2}", ratio(i, 1)),
            "report",
            Verdict::Info,
        );
    }
    for (i, &n) in sizes.iter().enumerate().skip(1) {
        report.row(
            &format!("5{}", if n == 3 { 'e' } else { 'f' }),
            &format!("raw floor, SET NX PX on {n} nodes at once vs 1: p50"),
            us(fig(i, 2)),
            format!("{} (raw, one node)", us(fig(0, 2))),
            format!("{:.2}", ratio(i, 2)),
            "(what this machine allows)",
            Verdict::Info,
        );
    }
    let one = [fig(0, 0), fig(0, 1), fig(0, 2), fig(0, 3)];
    report.note(format!(
        "5: acquire p50 on one node: engine {} vs raw SET NX PX {}; cycle p50 engine {} vs raw {}; \
         all nodes are local redis-server processes sharing the machine's cores with the client",
        us(one[0]),
        us(one[2]),
        us(one[1]),
        us(one[3]),
    ));
    drop(servers);
}

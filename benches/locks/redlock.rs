//! Row 5: Redlock on 3 and 5 nodes vs one node

use std::time::Duration;

use lock_runtime::Locker;
use lock_testing::RedisServer;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::compare::{RUN_OF, shuffle};
use crate::raw::{RELEASE_LUA, join_all, load_script, raw_connection, raw_release, raw_take};
use crate::report::{Report, Verdict, median, median_duration, percentile, us, verdict};
use crate::{CYCLE_OPTS, CYCLE_TTL_MS, Config};

/// The node counts row 5 compares; the first is the baseline.
const SIZES: [usize; 3] = [1, 3, 5];

/// Everything row 5 runs on: for each size, the engine's locker and raw connections to as many
/// nodes.
#[derive(Clone)]
struct Clients {
    lockers: Vec<Locker>,
    raws: Vec<Vec<MultiplexedConnection>>,
    sha: String,
}

/// Latencies of one kind of cycle: `(acquire, whole cycle)` samples.
type Samples = (Vec<Duration>, Vec<Duration>);

/// One engine cycle on `locker`: acquire, then release; with `fenced` false, as
/// `#[distributed_lock]` without `guard` takes it (no fence).
async fn engine_cycle(locker: &Locker, name: &str, fenced: bool, samples: &mut Samples) {
    let opts = match fenced {
        true => CYCLE_OPTS,
        false => lock_runtime::__private::without_fence(CYCLE_OPTS),
    };
    let t0 = Instant::now();
    let lease = locker.acquire(name, &opts).await.expect("acquire");
    let t1 = Instant::now();
    lease.release().await.expect("release");
    samples.0.push(t1 - t0);
    samples.1.push(t0.elapsed());
}

/// One cycle of the raw floor on N nodes: SET NX PX on every node at once, then EVALSHA on every
/// node at once.
async fn raw_cycle(
    conns: &[MultiplexedConnection],
    sha: &str,
    key: &str,
    seq: u64,
    samples: &mut Samples,
) {
    let token = format!("{seq:022x}");
    let token = token.as_str();
    let t0 = Instant::now();
    let taken = on_every_node(conns, |mut c| async move {
        raw_take(&mut c, key, token, CYCLE_TTL_MS).await
    })
    .await;
    let t1 = Instant::now();
    assert!(taken.iter().all(|&t| t), "raw redlock floor: busy");
    on_every_node(conns, |mut c| async move {
        raw_release(&mut c, sha, key, token).await
    })
    .await;
    samples.0.push(t1 - t0);
    samples.1.push(t0.elapsed());
}

/// `request` on every node's connection at once (a clone of each); the replies in node order.
async fn on_every_node<F: Future>(
    conns: &[MultiplexedConnection],
    request: impl Fn(MultiplexedConnection) -> F,
) -> Vec<F::Output> {
    join_all(conns.iter().map(|c| request(c.clone())).collect()).await
}

/// The kinds of cycle row 5 runs on each size.
const KINDS: usize = 3;

/// One round: a single task runs `RUN_OF` cycles of every kind (the engine with and without a
/// fence, and the raw floor, on each size) in a fresh random order, again and again for `length`
/// per kind, so that every kind meets the same placement of threads on CPUs (see row 1).
/// Returns, per size, the p50s of `[engine acquire, engine cycle, raw acquire, raw cycle,
/// unfenced acquire, unfenced cycle]`.
async fn interleaved_round(clients: &Clients, length: Duration, seed: u64) -> Vec<[Duration; 6]> {
    let clients = clients.clone();
    let kinds = KINDS * SIZES.len();
    let until = Instant::now() + length * kinds as u32;
    tokio::spawn(async move {
        let names: Vec<String> = SIZES.iter().map(|n| format!("bench:redlock:{n}")).collect();
        let raw_key = "lock:{bench:redlock:raw}";
        let mut samples: Vec<Samples> = vec![(Vec::new(), Vec::new()); kinds];
        let mut order: Vec<usize> = (0..kinds).collect();
        let mut rng = seed | 1;
        let mut seq = 0u64;
        while Instant::now() < until {
            shuffle(&mut order, &mut rng);
            for &k in &order {
                let (size, locker, name) =
                    (k / KINDS, &clients.lockers[k / KINDS], &names[k / KINDS]);
                for _ in 0..RUN_OF {
                    match k % KINDS {
                        0 => engine_cycle(locker, name, true, &mut samples[k]).await,
                        1 => {
                            seq += 1;
                            let conns = &clients.raws[size];
                            raw_cycle(conns, &clients.sha, raw_key, seq, &mut samples[k]).await;
                        }
                        _ => engine_cycle(locker, name, false, &mut samples[k]).await,
                    }
                }
            }
        }
        let mut samples = samples.into_iter().map(|(a, c)| (p50(a), p50(c)));
        (0..SIZES.len())
            .map(|_| {
                let (ea, ec) = samples.next().expect("engine kind");
                let (ra, rc) = samples.next().expect("raw kind");
                let (ua, uc) = samples.next().expect("unfenced kind");
                [ea, ec, ra, rc, ua, uc]
            })
            .collect()
    })
    .await
    .expect("row 5 round task")
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    percentile(&v, 50.0)
}

pub(crate) async fn redlock(cfg: &Config, report: &mut Report) {
    eprintln!("row 5: Redlock on 3 and 5 nodes");
    let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let mut clients = Clients {
        lockers: Vec::new(),
        raws: Vec::new(),
        sha: String::new(),
    };
    for n in SIZES {
        let locker = if n == 1 {
            Locker::connect(&urls[0]).await
        } else {
            Locker::redlock(urls[..n].iter().cloned()).await
        };
        clients.lockers.push(locker.expect("locker connects"));
        let mut conns = Vec::new();
        for url in &urls[..n] {
            let mut conn = raw_connection(url).await;
            clients.sha = load_script(&mut conn, RELEASE_LUA).await;
            conns.push(conn);
        }
        clients.raws.push(conns);
    }
    // Per round and per size: p50 of [engine acquire, engine cycle, raw acquire, raw cycle,
    // unfenced acquire, unfenced cycle].
    let mut rounds: Vec<Vec<[Duration; 6]>> = Vec::new();
    for round in 0..=cfg.rounds {
        let figures = interleaved_round(&clients, cfg.slice, 0x5eed + round as u64).await;
        // Round 0 is the warm-up.
        if round > 0 {
            rounds.push(figures);
        }
    }
    // Median over the rounds of a figure, and of its ratio to the figure `(j, l)` of its round.
    let fig = |i: usize, k: usize| median_duration(rounds.iter().map(|r| r[i][k]).collect());
    let ratio_to = |(i, k): (usize, usize), (j, l): (usize, usize)| {
        median(
            rounds
                .iter()
                .map(|r| r[i][k].as_secs_f64() / r[j][l].as_secs_f64())
                .collect(),
        )
    };
    let ratio = |i: usize, k: usize| ratio_to((i, k), (0, k));
    for (i, &n) in SIZES.iter().enumerate().skip(1) {
        let r = ratio_to((i, 0), (i, 2));
        report.row(
            &format!("5{}", if n == 3 { 'a' } else { 'b' }),
            &format!("Redlock {n} nodes: acquire latency p50"),
            us(fig(i, 0)),
            format!("{} (raw SET NX PX on the {n} nodes at once)", us(fig(i, 2))),
            format!("{r:.2}"),
            "<= 1.2",
            verdict(r <= 1.2),
        );
    }
    for (i, &n) in SIZES.iter().enumerate().skip(1) {
        let r = ratio_to((i, 4), (i, 2));
        report.row(
            &format!("5{}", if n == 3 { 'g' } else { 'h' }),
            &format!(
                "Redlock {n} nodes, without a fence (the attribute without `guard`): acquire \
                 latency p50"
            ),
            us(fig(i, 4)),
            format!("{} (raw SET NX PX on the {n} nodes at once)", us(fig(i, 2))),
            format!("{r:.2}"),
            "<= 1.2",
            verdict(r <= 1.2),
        );
    }
    for (i, &n) in SIZES.iter().enumerate().skip(1) {
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
    for (i, &n) in SIZES.iter().enumerate().skip(1) {
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
         all nodes are local redis-server processes sharing the machine's cores with the client; \
         each round runs every kind (engine and raw, on 1, 3 and 5 nodes) in one task, in runs of \
         {RUN_OF} cycles in a fresh random order, so that all meet the same placement of threads \
         on CPUs (as row 1)",
        us(one[0]),
        us(one[2]),
        us(one[1]),
        us(one[3]),
    ));
    report.note(format!(
        "5a/5b against the engine on one node: {:.2} / {:.2}",
        ratio(1, 0),
        ratio(2, 0)
    ));
    drop(servers);
}

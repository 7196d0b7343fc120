//! Row 7: the cost of a Redis Cluster (3 primaries + 3 replicas, all local) against one server:
//! the uncontended cycle's latency and the hand-off.

use std::time::Duration;

use lock_runtime::{Locker, LockerBuilder};
use lock_testing::{RedisCluster, RedisServer};
use tokio::time::Instant;

use crate::handoff::{Pause, Shape, engine_handoff_on};
use crate::report::{Report, Verdict, median, median_duration, percentile, us};
use crate::{CYCLE_OPTS, Config};

/// p50 of sequential acquire + release cycles for `window`.
async fn cycle_p50(locker: &Locker, name: &str, window: Duration) -> Duration {
    let mut cycles = Vec::new();
    let until = Instant::now() + window;
    while Instant::now() < until {
        let t0 = Instant::now();
        let lease = locker.acquire(name, &CYCLE_OPTS).await.expect("acquire");
        lease.release().await.expect("release");
        cycles.push(t0.elapsed());
    }
    cycles.sort();
    percentile(&cycles, 50.0)
}

pub(crate) async fn cluster(cfg: &Config, report: &mut Report) {
    eprintln!("row 7: Redis Cluster vs one server");
    let server = RedisServer::start();
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .expect("cluster starts");
    let one = Locker::builder().url(server.url());
    let many = Locker::builder().cluster(cluster.urls());
    let (one_locker, many_locker) = (
        one.clone().connect().await.expect("connects"),
        many.clone().connect().await.expect("connects"),
    );
    // Per round: p50 on [one server, cluster], alternating which goes first.
    let mut rounds: Vec<[Duration; 2]> = Vec::new();
    for round in 0..=cfg.rounds {
        let mut figures = [Duration::ZERO; 2];
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let locker = if i == 0 { &one_locker } else { &many_locker };
            figures[i] = cycle_p50(locker, "bench:cluster", cfg.slice).await;
        }
        if round > 0 {
            rounds.push(figures);
        }
    }
    let fig = |i: usize| median_duration(rounds.iter().map(|r| r[i]).collect());
    let ratio = median(
        rounds
            .iter()
            .map(|r| r[1].as_secs_f64() / r[0].as_secs_f64())
            .collect(),
    );
    report.row(
        "7a",
        "Redis Cluster (3+3, local): uncontended acquire + release p50",
        us(fig(1)),
        format!("{} (one server)", us(fig(0))),
        format!("{ratio:.2}"),
        "report",
        Verdict::Info,
    );
    let length = cfg.handoff_run;
    let on_one = hand_off(&one, length).await;
    let on_cluster = hand_off(&many, length).await;
    report.row(
        "7b",
        "Redis Cluster: hand-off, 8 tasks on 8 separate Lockers: util. / wait p99 / smallest share",
        on_cluster.summary(),
        format!("{} (one server)", on_one.summary()),
        format!("{:.2} (util.)", on_cluster.utilisation / on_one.utilisation),
        "report",
        Verdict::Info,
    );
    report.note(format!(
        "7: on the cluster every acquire is the acquire script (one EVALSHA routed to the slot's \
         primary; the plain-command path is for a single server), release wake-ups are sharded \
         pub/sub (SPUBLISH on the slot's primary); hand-off on one server: {}; on the cluster: {}",
        on_one.waits_text(),
        on_cluster.waits_text()
    ));
    crate::spread::spread(&cluster, &many_locker, cfg.handoff_run, report).await;
    drop(cluster);
}

async fn hand_off(builder: &LockerBuilder, length: Duration) -> crate::handoff_stats::Handoff {
    engine_handoff_on(builder, length, Pause::Precise, Shape::SeparateLockers).await
}

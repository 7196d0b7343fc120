//! Rows 7c and 7d: where a Redis Cluster's lock traffic goes. Many distinct names cycled by 64
//! tasks on a local 3-primary cluster: each primary's share of the names, of the commands and of
//! the server CPU; then, from the CPU one cycle costs a primary, the locks per second one shard
//! can serve and what 3, 6 and 12 shards would.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_runtime::Locker;
use lock_testing::RedisCluster;
use tokio::time::Instant;

use crate::CYCLE_OPTS;
use crate::raw::{command_calls, raw_connection, reads_stats, reset_stats};
use crate::report::{Report, Verdict};
use crate::threads::ThreadClock;

const NAMES: usize = 3_000;
const TASKS: usize = 64;

/// The name of lock `i` of the run.
fn name(i: usize) -> String {
    format!("bench:spread:{i}")
}

/// `TASKS` tasks, each taking and releasing the names `t`, `t + TASKS`, ... below `NAMES` in
/// turn for `window` (no two tasks share a name, so none finds one busy); returns how many
/// cycles they made.
async fn cycle_names(locker: &Locker, window: Duration) -> u64 {
    let cycles = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + window;
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (locker, cycles) = (locker.clone(), Arc::clone(&cycles));
            tokio::spawn(async move {
                let mut i = t;
                while Instant::now() < end {
                    let lease = locker.acquire(&name(i), &CYCLE_OPTS).await;
                    lease.expect("acquire").release().await.expect("release");
                    cycles.fetch_add(1, Ordering::Relaxed);
                    i += TASKS;
                    if i >= NAMES {
                        i = t;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    cycles.load(Ordering::Relaxed)
}

pub(crate) async fn spread(
    cluster: &RedisCluster,
    locker: &Locker,
    window: Duration,
    report: &mut Report,
) {
    let primaries = cluster.primaries();
    let mut names_on = vec![0usize; primaries.len()];
    for i in 0..NAMES {
        let owner = cluster.primary_for_key(locker.key_of(&name(i)));
        let at = primaries.iter().position(|p| p.port == owner.port);
        names_on[at.expect("a primary serves every slot")] += 1;
    }
    let mut conns = Vec::new();
    let mut clocks = Vec::new();
    for primary in &primaries {
        let mut conn = raw_connection(&primary.url()).await;
        reset_stats(&mut conn).await;
        conns.push(conn);
        clocks.push(ThreadClock::start(&primary.pid.to_string(), None));
    }
    let cycles = cycle_names(locker, window).await.max(1);
    let mut commands = Vec::new();
    for conn in &mut conns {
        let calls = command_calls(conn).await;
        let own: u64 = calls
            .into_iter()
            .filter(|(name, _)| !reads_stats(name))
            .map(|(_, calls)| calls)
            .sum();
        commands.push(own);
    }
    let cpu_us: Vec<f64> = clocks.iter().map(|c| c.elapsed().0 as f64 / 1e3).collect();
    let share = |v: &[f64]| {
        let total: f64 = v.iter().sum::<f64>().max(1.0);
        let parts: Vec<String> = v.iter().map(|x| format!("{:.2}", x / total)).collect();
        parts.join(" / ")
    };
    let names: Vec<f64> = names_on.iter().map(|&n| n as f64).collect();
    let commands: Vec<f64> = commands.iter().map(|&n| n as f64).collect();
    let per_second = cycles as f64 / window.as_secs_f64();
    report.row(
        "7c",
        "Redis Cluster (3 primaries): 3,000 names cycled by 64 tasks: each primary's share of names / commands / server CPU",
        format!(
            "{} | {} | {}",
            share(&names),
            share(&commands),
            share(&cpu_us)
        ),
        format!("{per_second:.0} cycles/s in all"),
        "-".to_owned(),
        "report",
        Verdict::Info,
    );
    let cpu_per_cycle = cpu_us.iter().sum::<f64>() / cycles as f64;
    let per_shard = 1e6 / cpu_per_cycle;
    report.row(
        "7d",
        "on paper, from 7c's server CPU per cycle: locks/s one shard serves at full CPU; 3 / 6 / 12 shards",
        format!(
            "{per_shard:.0}/s per shard; {:.0} / {:.0} / {:.0}",
            per_shard * 3.0,
            per_shard * 6.0,
            per_shard * 12.0
        ),
        format!("{cpu_per_cycle:.1} µs of primary CPU per cycle"),
        "-".to_owned(),
        "report",
        Verdict::Info,
    );
    report.note(format!(
        "7c/7d: {cycles} acquire + release cycles in {window:?} over {NAMES} names; names per \
         primary {names_on:?} (by hash slot), commands per primary {commands:?}, server CPU per \
         primary {cpu_us:.0?} µs. The paper figures assume names spread evenly (they do, by \
         slot) and a client side that keeps up; one name lives on one shard, so a hot name's \
         hand-overs stay bound by one primary (row 3e's server CPU per hand-over), and release \
         wake-ups are sharded pub/sub on the name's primary (SPUBLISH): they add no fan-out \
         across shards."
    ));
}

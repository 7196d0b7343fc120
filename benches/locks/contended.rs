//! Row 3: contended hand-off, in both shapes, 5 consecutive runs each, vs a polling loop

use std::time::Duration;

use lock_runtime::LockOptions;
use lock_testing::RedisServer;

use crate::Config;
use crate::handoff::{
    HANDOFF_TTL_MS, Pause, Shape, WORKERS, engine_handoff, engine_handoff_kinds, handoff_opts,
    polling_handoff,
};
use crate::handoff_floor::floor_handoff;
use crate::handoff_stats::Handoff;
use crate::raw::{command_calls, raw_connection, reads_stats, reset_stats};
use crate::report::{Report, Verdict, ms, verdict};
use crate::threads::ThreadClock;

/// Consecutive runs per shape; every one of them has to meet the targets.
const RUNS: usize = 5;
const MIN_UTILISATION: f64 = 0.8;
const MAX_WAIT_P99: Duration = Duration::from_millis(15);
/// Every worker gets at least this share of the acquisitions it would get if all were equal.
const MIN_SHARE: f64 = 0.5;
/// The most Redis commands one hand-over of a lock may cost.
const MAX_COMMANDS: f64 = 10.0;

/// What one hand-over cost: CPU µs in the client's threads (the blocking pool's sleeps
/// included) and in the redis-server process, and the commands the server ran (those inside
/// scripts counted one by one), of which script calls (`EVALSHA`).
struct Cost {
    client: f64,
    server: f64,
    commands: f64,
    scripts: f64,
    /// Commands per hand-over by name, the most frequent first (those below 0.05 left out).
    by_command: Vec<(String, f64)>,
}

impl Cost {
    fn text(&self) -> String {
        let by_command: Vec<String> = self
            .by_command
            .iter()
            .map(|(name, per)| format!("{name} {per:.1}"))
            .collect();
        format!(
            "CPU per hand-over {:.0} µs client / {:.0} µs server, {:.1} Redis commands per \
             hand-over ({:.1} of them script calls; {})",
            self.client,
            self.server,
            self.commands,
            self.scripts,
            by_command.join(", ")
        )
    }
}

/// A hand-off run on the server at `url` (process `server_pid`), and what it cost per hand-over.
async fn with_cost(
    url: &str,
    server_pid: u32,
    run: impl Future<Output = Handoff>,
) -> (Handoff, Cost) {
    let mut raw = raw_connection(url).await;
    reset_stats(&mut raw).await;
    let client = ThreadClock::start("self", None);
    let server = ThreadClock::start(&server_pid.to_string(), None);
    let run = run.await;
    let hand_overs = run.counts.iter().sum::<u64>().max(1) as f64;
    let per = |clock: &ThreadClock| clock.elapsed().0 as f64 / 1e3 / hand_overs;
    let (client, server) = (per(&client), per(&server));
    let (mut commands, mut scripts) = (0, 0);
    let mut by_command = Vec::new();
    for (name, calls) in command_calls(&mut raw).await {
        if reads_stats(&name) {
            continue;
        }
        commands += calls;
        if name == "evalsha" {
            scripts += calls;
        }
        let per = calls as f64 / hand_overs;
        if per >= 0.05 {
            by_command.push((name, per));
        }
    }
    by_command.sort_by(|a, b| b.1.total_cmp(&a.1));
    let cost = Cost {
        client,
        server,
        commands: commands as f64 / hand_overs,
        scripts: scripts as f64 / hand_overs,
        by_command,
    };
    (run, cost)
}

fn meets_targets(run: &Handoff) -> bool {
    run.utilisation >= MIN_UTILISATION
        && run.wait(99.0) <= MAX_WAIT_P99
        && run.min_share() >= MIN_SHARE
        && run.overlaps == 0
}

pub(crate) async fn contended(cfg: &Config, report: &mut Report) {
    let length = cfg.handoff_run;
    eprintln!("row 3: contended hand-off ({WORKERS} workers, {RUNS} runs of {length:?} per shape)");
    let server = RedisServer::start();
    let url = server.url();
    let polling = polling_handoff(&url, length, Pause::Precise).await;
    let baseline = format!("{} (100 ms polling loop)", polling.summary());
    let target = format!(
        "util >= {MIN_UTILISATION:.2}, p99 <= {}, share >= {MIN_SHARE:.2}",
        ms(MAX_WAIT_P99)
    );
    let mut lock_costs = Vec::new();
    for (letter, shape) in [('a', Shape::SharedLocker), ('b', Shape::SeparateLockers)] {
        let mut runs = Vec::new();
        let mut costs = Vec::new();
        for k in 1..=RUNS {
            let (run, cost) = with_cost(
                &url,
                server.pid(),
                engine_handoff(&url, length, Pause::Precise, shape),
            )
            .await;
            costs.push(cost);
            report.row(
                &format!("3{letter}.{k}"),
                &format!(
                    "hand-off, {}, run {k}/{RUNS}: util. / wait p99 / smallest share of fair",
                    shape.label()
                ),
                run.summary(),
                baseline.clone(),
                format!("{:.2} (util.)", run.utilisation / polling.utilisation),
                &target,
                verdict(meets_targets(&run)),
            );
            runs.push(run);
        }
        if shape == Shape::SharedLocker {
            lock_costs.extend(costs.iter().map(|c| (c.commands, c.server)));
        }
        let worst_util = runs.iter().map(|r| r.utilisation).fold(f64::MAX, f64::min);
        let worst_p99 = runs.iter().map(|r| r.wait(99.0)).max().unwrap_or_default();
        let worst_share = runs.iter().map(Handoff::min_share).fold(f64::MAX, f64::min);
        report.row(
            &format!("3{letter}"),
            &format!("hand-off, {}: worst of the {RUNS} runs", shape.label()),
            format!("{worst_util:.3} / {} / {worst_share:.2}", ms(worst_p99)),
            baseline.clone(),
            "-".to_owned(),
            &format!("each of the {RUNS} runs"),
            verdict(runs.iter().all(meets_targets)),
        );
        let details: Vec<String> = runs
            .iter()
            .zip(&costs)
            .enumerate()
            .map(|(i, (r, cost))| {
                format!(
                    "run {}: per worker {:?}, wait p50/p99/max {}, longest waiter served {:.0}%, \
                     mean / longest hold {} / {}, hand-over gap p50/p99/max {}, {}, machine \
                     stall {}, overlapping holders {}",
                    i + 1,
                    r.counts,
                    r.waits_text(),
                    r.oldest_share * 100.0,
                    ms(r.mean_hold),
                    ms(r.longest_hold),
                    r.gaps_text(),
                    cost.text(),
                    ms(r.stall),
                    r.overlaps
                )
            })
            .collect();
        report.note(format!(
            "3{letter} ({}): {}",
            shape.label(),
            details.join("; ")
        ));
    }

    let ticked = engine_handoff(&url, length, Pause::TokioTimer, Shape::SeparateLockers).await;
    report.row(
        "3c",
        "hand-off, 8 Lockers, but tokio::time::sleep for the 1 ms: util. / wait p99 / share",
        ticked.summary(),
        "-".to_owned(),
        "-".to_owned(),
        "(diagnostic)",
        Verdict::Info,
    );
    report.note(format!(
        "3c: with tokio::time::sleep every worker sleeps 1-2 ms (mean hold {}) and wakes on the \
         same timer tick as the holder that releases, so a worker coming back from outside tends \
         to reach the server before the waiters woken by the release message (barging): longest \
         waiter served {:.0}% of the time; per-worker acquisitions {:?}; wait p50/p99/max {}",
        ms(ticked.mean_hold),
        ticked.oldest_share * 100.0,
        ticked.counts,
        ticked.waits_text(),
    ));
    let (floor, floor_cost) = with_cost(
        &url,
        server.pid(),
        floor_handoff(&url, length, Pause::Precise),
    )
    .await;
    report.row(
        "3d",
        "hand-off floor: a raw FIFO list + PUBLISH to the next waiter, 8 connections: util. / p99 / share",
        floor.summary(),
        "-".to_owned(),
        "-".to_owned(),
        "(diagnostic)",
        Verdict::Info,
    );
    report.note(format!(
        "3d: the same workload on the least a fair hand-off costs here (see handoff_floor.rs: no \
         eviction of a vanished waiter, no fences, no bounds, no renewal): wait p50/p99/max {}, \
         hand-over gap p50/p99/max {}, mean hold {}, {}, machine stall {}, overlapping holders {}",
        floor.waits_text(),
        floor.gaps_text(),
        ms(floor.mean_hold),
        floor_cost.text(),
        ms(floor.stall),
        floor.overlaps,
    ));
    work_per_hand_over(&server, length, &lock_costs, &floor_cost, report).await;
    report.note(format!(
        "3: {WORKERS} workers, each holds the lock 1 ms (std::thread::sleep on the blocking pool, \
         about 1.1 ms) then stays 1 ms outside, for {length:?} per run; utilisation counts from \
         acquire() returning to release() being called; smallest share = the least served \
         worker's acquisitions / the mean. A wait spans the holds of the workers ahead, so a \
         1 ms sleep that overran (the blocking pool's thread woken late; each run's longest \
         hold is in its note) lengthens the waits behind it. Hand-over gap: from one holder \
         calling release() to the next holder's acquire() returning. CPU per hand-over: this \
         process's threads (the blocking pool's sleeps included) and the redis-server's, over \
         the run, per acquisition; Redis commands per hand-over: from INFO commandstats over \
         the run, a script's own calls counted one by one. Machine stall: the longest overrun \
         of a 5 ms sleep on a plain thread that touches neither tokio nor Redis, in that run; \
         a wait maximum far above the p99 next to a stall of about its excess was the \
         machine's, not the hand-off's. Polling baseline: per worker \
         {:?}, wait p50/p99/max {}, longest waiter served {:.0}% (random among 7 waiters ~ 1/7), mean hold {}, \
         overlapping holders {}; lease ttl {HANDOFF_TTL_MS} ms",
        polling.counts,
        polling.waits_text(),
        polling.oldest_share * 100.0,
        ms(polling.mean_hold),
        polling.overlaps,
    ));
}

/// A kind of hold row 3 measures: its row, what it is, its lock's name and places, and the
/// options of each worker.
type Kind = (
    &'static str,
    &'static str,
    (&'static str, u32),
    fn(usize) -> LockOptions,
);

/// Rows 3e to 3g: the Redis work of one hand-over (commands, and the server's CPU) of a lock
/// (the median of the 3a runs), of a permit, and between shared and exclusive holds, beside the
/// raw FIFO floor's (3d).
async fn work_per_hand_over(
    server: &RedisServer,
    length: std::time::Duration,
    lock: &[(f64, f64)],
    floor: &Cost,
    report: &mut Report,
) {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or_default()
    };
    let lock_commands = median(lock.iter().map(|c| c.0).collect());
    let lock_server = median(lock.iter().map(|c| c.1).collect());
    let floor_text = format!("{:.1} / {:.0} µs (3d floor)", floor.commands, floor.server);
    report.row(
        "3e",
        "Redis work per hand-over of a lock (3a, median of its runs): commands / server CPU",
        format!("{lock_commands:.1} / {lock_server:.0} µs"),
        floor_text.clone(),
        format!("{:.2} (commands)", lock_commands / floor.commands.max(1.0)),
        &format!("<= {MAX_COMMANDS:.0} commands"),
        verdict(lock_commands <= MAX_COMMANDS),
    );
    let permit = |_: usize| handoff_opts().with_permits(2);
    // Half the workers shared, half exclusive: the name passes between the two kinds.
    let mixed = |w: usize| handoff_opts().with_shared(w.is_multiple_of(2));
    let kinds: [Kind; 2] = [
        ("3f", "a permit of 2", ("bench:handoff:permit", 2), permit),
        (
            "3g",
            "shared and exclusive holds (4 workers each)",
            ("bench:handoff:shared", WORKERS as u32),
            mixed,
        ),
    ];
    for (row, what, lock, opts_of) in kinds {
        let url = server.url();
        let run = engine_handoff_kinds(&url, length, lock, opts_of);
        let (run, cost) = with_cost(&url, server.pid(), run).await;
        report.row(
            row,
            &format!("Redis work per hand-over of {what}, 8 tasks: commands / server CPU"),
            format!("{:.1} / {:.0} µs", cost.commands, cost.server),
            floor_text.clone(),
            format!("{:.2} (commands)", cost.commands / floor.commands.max(1.0)),
            "(diagnostic)",
            Verdict::Info,
        );
        report.note(format!(
            "{row} ({what}): per worker {:?}, {}, utilisation of the {} places {:.3}",
            run.counts,
            cost.text(),
            lock.1,
            run.utilisation
        ));
    }
}

//! Row 4: 10,000 leases held at once

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use lock_runtime::{Lease, LockOptions, Locker};
use lock_testing::RedisServer;
use tokio::time::Instant;

use crate::Config;
use crate::alloc::counting_allocs;
use crate::raw::{calls_of, raw_connection};
use crate::report::{Report, Verdict, ms, percentile, verdict};
use crate::threads::ThreadClock;

const HELD: usize = 10_000;
const HELD_TTL: Duration = Duration::from_secs(3);
const HELD_RENEW: Duration = Duration::from_secs(1);
const HELD_OPTS: LockOptions = LockOptions::new(HELD_TTL).with_renew(HELD_RENEW);
/// Concurrent acquire and release tasks for the 10,000 leases.
const HELD_TASKS: usize = 50;
/// How often the sampler reads every key's expiry. Below the shortest renewal interval
/// (renew - renew/4), so that no renewal goes unseen.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

async fn acquire_many(locker: &Locker, names: &Arc<Vec<String>>) -> Vec<Lease> {
    let handles: Vec<_> = (0..HELD_TASKS)
        .map(|t| {
            let (locker, names) = (locker.clone(), Arc::clone(names));
            tokio::spawn(async move {
                let mut leases = Vec::new();
                for name in names.iter().skip(t).step_by(HELD_TASKS) {
                    leases.push(
                        locker
                            .acquire(name, &HELD_OPTS)
                            .await
                            .expect("acquire a held lease"),
                    );
                }
                leases
            })
        })
        .collect();
    let mut all = Vec::with_capacity(names.len());
    for h in handles {
        all.extend(h.await.expect("acquire task"));
    }
    all
}

async fn release_many(mut leases: Vec<Lease>) {
    let per_task = leases.len().div_ceil(HELD_TASKS);
    let mut handles = Vec::new();
    while !leases.is_empty() {
        let chunk: Vec<Lease> = leases.split_off(leases.len().saturating_sub(per_task));
        handles.push(tokio::spawn(async move {
            for lease in chunk {
                lease.release().await.expect("release a held lease");
            }
        }));
    }
    for h in handles {
        h.await.expect("release task");
    }
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

struct Sampled {
    /// Observed intervals between consecutive renewals of one key, in server milliseconds.
    intervals_ms: Vec<i64>,
    samples: usize,
    /// Slowest sample (the sampler's script blocks the server this long).
    slowest: Duration,
}

/// Renewal lag, measured on the server: every `SAMPLE_EVERY`, one EVAL reads PEXPIRETIME (the
/// absolute expiry, in server ms) of every held key. Each renewal re-sets the expiry to now + ttl,
/// so a change of a key's expiry from `e0` to `e1` shows a renewal applied `e1 - e0` ms after the
/// previous one (or after the acquire). On schedule that interval is at most `renew`; the lag of
/// that renewal is `interval - renew` (negative: early, which the watchdog does on purpose by up to
/// renew/4 to batch leases). This counts everything between one renewal and the next on the
/// server's clock: the watchdog's timer, its batching, the queueing of its chunks and the round
/// trip, with millisecond resolution and no dependence on when the sample was taken (the sample
/// period only has to be shorter than the shortest interval, so that no renewal goes unseen).
/// The sampler runs on its own thread and runtime so that its CPU time can be left out of the
/// client's, and uses EVAL (not EVALSHA) so that INFO's evalsha count is the watchdog's alone.
fn spawn_sampler(
    url: String,
    keys: Vec<String>,
    stop: Arc<AtomicBool>,
    tid: mpsc::Sender<String>,
) -> std::thread::JoinHandle<Sampled> {
    std::thread::spawn(move || {
        let me = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_owned))
            .unwrap_or_default();
        tid.send(me).expect("send tid");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("sampler runtime");
        runtime.block_on(async move {
            let mut conn = raw_connection(&url).await;
            let script = "local out = {} for i, k in ipairs(KEYS) do out[i] = redis.call('PEXPIRETIME', k) end return out";
            let mut last = vec![-2i64; keys.len()];
            let mut out = Sampled { intervals_ms: Vec::new(), samples: 0, slowest: Duration::ZERO };
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !stop.load(Ordering::SeqCst) {
                tick.tick().await;
                let sent = Instant::now();
                let expiries: Vec<i64> = redis::cmd("EVAL")
                    .arg(script)
                    .arg(keys.len())
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await
                    .expect("sample PEXPIRETIME");
                out.slowest = out.slowest.max(sent.elapsed());
                out.samples += 1;
                for (prev, now) in last.iter_mut().zip(expiries) {
                    if now > 0 && *prev > 0 && now != *prev {
                        out.intervals_ms.push(now - *prev);
                    }
                    *prev = now;
                }
            }
            out
        })
    })
}

pub(crate) async fn held_leases(cfg: &Config, report: &mut Report) {
    eprintln!("row 4: {HELD} leases held for {:?}", cfg.secs);
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url())
        .await
        .expect("locker connects");
    let mut raw = raw_connection(&server.url()).await;
    let names: Arc<Vec<String>> = Arc::new((0..HELD).map(|i| format!("bench:held:{i}")).collect());
    let keys: Vec<String> = names.iter().map(|n| locker.key_of(n)).collect();

    // Warm-up on other names: the connections are made and the watchdog is running.
    let warm: Arc<Vec<String>> = Arc::new((0..200).map(|i| format!("bench:warm:{i}")).collect());
    release_many(acquire_many(&locker, &warm).await).await;

    let stop = Arc::new(AtomicBool::new(false));
    let (tid_tx, tid_rx) = mpsc::channel();
    let sampler = spawn_sampler(server.url(), keys, Arc::clone(&stop), tid_tx);
    let sampler_tid = tid_rx.recv().expect("sampler tid");

    let rss0 = rss_bytes();
    let t_acquire = Instant::now();
    let (leases, _, heap) = counting_allocs(acquire_many(&locker, &names)).await;
    let acquire_took = t_acquire.elapsed();
    let rss1 = rss_bytes();

    let calls0 = calls_of(&mut raw, "evalsha").await;
    let clock = ThreadClock::start("self", Some(&sampler_tid));
    let t0 = Instant::now();
    tokio::time::sleep(cfg.secs).await;
    let (cpu_ns, _) = clock.elapsed();
    let elapsed = t0.elapsed();
    let calls1 = calls_of(&mut raw, "evalsha").await;

    stop.store(true, Ordering::SeqCst);
    let sampled = tokio::task::spawn_blocking(move || sampler.join().expect("sampler"))
        .await
        .expect("join sampler");
    let still_held = leases.iter().filter(|l| l.is_held()).count();
    release_many(leases).await;

    let periods = elapsed.as_secs_f64() / HELD_RENEW.as_secs_f64();
    let calls = calls1 - calls0;
    let per_tick = calls as f64 / periods;
    let mut lags: Vec<i64> = sampled
        .intervals_ms
        .iter()
        .map(|&i| (i - HELD_RENEW.as_millis() as i64).max(0))
        .collect();
    lags.sort_unstable();
    let mut intervals = sampled.intervals_ms.clone();
    intervals.sort_unstable();
    let mean_interval = intervals.iter().sum::<i64>() as f64 / intervals.len().max(1) as f64;
    let lag_p99 = percentile(&lags, 99.0);
    let lag_max = lags.last().copied().unwrap_or(0);
    let cpu = Duration::from_nanos(cpu_ns);
    let cpu_per_lease_s = cpu.as_secs_f64() / HELD as f64 / elapsed.as_secs_f64();
    let rss_per_lease = rss1.saturating_sub(rss0) as f64 / HELD as f64;
    let renewals = HELD as f64 * elapsed.as_secs_f64() * 1000.0 / mean_interval.max(1.0);

    report.row(
        "4a",
        "10,000 held leases (ttl 3 s, renew 1 s): round trips per renew period",
        format!(
            "{per_tick:.1} EVALSHA / period (~{:.0} leases each)",
            renewals / calls.max(1) as f64
        ),
        format!("{HELD} (one call per lease, unbatched)"),
        format!("{:.4}", per_tick / HELD as f64),
        "batched (report)",
        Verdict::Info,
    );
    report.row(
        "4b",
        "held leases: renewal lag p99 / max (server clock)",
        format!("{lag_p99} ms / {lag_max} ms"),
        format!(
            "interval p50 {} ms, p99 {} ms",
            percentile(&intervals, 50.0),
            percentile(&intervals, 99.0)
        ),
        format!("{:.3}", lag_p99 as f64 / HELD_RENEW.as_millis() as f64),
        "p99 < renew/10 = 100 ms",
        verdict(lag_p99 < HELD_RENEW.as_millis() as i64 / 10 && still_held == HELD),
    );
    report.row(
        "4c",
        "held leases: client CPU per held lease",
        format!("{:.2} µs CPU per lease-second", cpu_per_lease_s * 1e6),
        format!(
            "{:.2}% of one core for all {HELD}",
            cpu.as_secs_f64() / elapsed.as_secs_f64() * 100.0
        ),
        "-".to_owned(),
        "report",
        Verdict::Info,
    );
    report.row(
        "4d",
        "held leases: client memory per held lease (heap / RSS)",
        format!(
            "{:.0} B heap, {rss_per_lease:.0} B RSS",
            heap as f64 / HELD as f64
        ),
        format!(
            "{:.1} MiB heap, {:.1} MiB RSS for {HELD}",
            heap as f64 / f64::from(1 << 20),
            rss1.saturating_sub(rss0) as f64 / f64::from(1 << 20)
        ),
        "-".to_owned(),
        "report",
        Verdict::Info,
    );
    report.note(format!(
        "4: {HELD} leases acquired in {:.0?} by {HELD_TASKS} tasks, then held {:.1?}: {calls} EVALSHA calls \
         ({periods:.1} renew periods); {} renewal intervals seen in {} samples (mean {mean_interval:.0} ms: \
         the watchdog renews up to renew/4 early on purpose, to batch leases); {still_held}/{HELD} still held at the end; \
         the sampler's slowest read of all expiries took {}; CPU is every thread's on-CPU time \
         (schedstat) but the sampler's; heap is the net of the allocations made while the leases were taken (a counting allocator), RSS the VmRSS delta across it",
        acquire_took,
        elapsed,
        sampled.intervals_ms.len(),
        sampled.samples,
        ms(sampled.slowest),
    ));
}

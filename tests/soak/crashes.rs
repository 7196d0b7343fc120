//! The read-write soak whose shared holders crash: shared holder processes (`lock_holder hold
//! shared=1`, a short lease) are killed with SIGKILL while they hold, beside live shared holders
//! with a long lease and exclusive writers in this process. A dead holder may keep the writers
//! out until its lease runs out, no longer; the live ones, until they leave. So each writer's
//! wait is judged against when the name came free for it: the later of its own start, the last
//! release of a live hold that began before the writer had the lock, and the end of the lease of
//! the last holder killed before then.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockOptions, Locker};
use tokio::time::{Instant, timeout};

use super::rig::{Baseline, Rig};
use crate::support::fenced::FencedStore;
use crate::support::history::{HoldMode, Mode, Report};
use crate::support::holder::Holder;
use crate::support::{Rng, keys_without_expiry, ms};

/// The killed holders' lease: they renew it every 100 ms while they live.
pub const DEAD_LEASE: Duration = Duration::from_millis(300);
/// The live holders' lease (and ttl): long, so that a key kept for a dead holder past its lease
/// (until a live holder's lease ran out) shows as a wait of seconds.
const LIVE_LEASE: Duration = Duration::from_secs(3);
/// How late a writer may have the lock after the name came free for it: its wake-up (a release's
/// message, or its retry when a dead holder's key expires) on a loaded machine of 2 cores.
pub const MARGIN: Duration = Duration::from_millis(600);
/// Live shared holders, exclusive writers, and shared holder processes alive at once.
const READERS: usize = 3;
const WRITERS: usize = 2;
const PROCESSES: usize = 2;

/// One hold of a live holder (in this process): when it was in hand, when its release returned.
#[derive(Debug, Clone, Copy)]
pub struct LiveHold {
    pub got: Instant,
    pub released: Instant,
}

/// One writer's wait: from its call to the lease in hand, or to its failure.
#[derive(Debug, Clone, Copy)]
pub struct Wait {
    pub writer: usize,
    pub start: Instant,
    pub end: Instant,
    pub got: bool,
}

/// A writer's wait, judged.
#[derive(Debug, Clone, Copy)]
pub struct Judged {
    pub wait: Wait,
    /// When the name came free for it (see the module's documentation).
    pub free: Instant,
    /// The end of a killed holder's lease was what it waited for last.
    pub by_dead: bool,
}

impl Judged {
    /// How long after `free + MARGIN` the writer had the lock (or gave up); zero when in time.
    pub fn late(&self) -> Duration {
        self.wait.end.saturating_duration_since(self.free + MARGIN)
    }
}

/// Judges `wait` against the live holds (`holds`) and the crashes of holders whose lease was
/// `dead_lease` (`crashes`: when each killed process was gone).
pub fn judge(wait: Wait, holds: &[LiveHold], crashes: &[Instant], dead_lease: Duration) -> Judged {
    // The writer's own hold began when its wait ended: not before it.
    let live = holds
        .iter()
        .filter(|h| h.got < wait.end)
        .map(|h| h.released);
    let dead = crashes
        .iter()
        .filter(|&&c| c < wait.end)
        .map(|&c| c + dead_lease)
        .max();
    let alive = live.max().unwrap_or(wait.start).max(wait.start);
    let free = alive.max(dead.unwrap_or(alive));
    Judged {
        wait,
        free,
        by_dead: dead.is_some_and(|d| d > alive),
    }
}

/// What the live workers and the killers record.
#[derive(Default)]
struct Timeline {
    holds: Mutex<Vec<LiveHold>>,
    waits: Mutex<Vec<Wait>>,
    crashes: Mutex<Vec<Instant>>,
    /// Calls that failed (none is expected: every wait is long enough), as `client: error`.
    errors: Mutex<Vec<String>>,
}

/// What the soak leaves to check.
pub struct CrashSoak {
    /// The live holds' history: exclusive never with another.
    pub report: Report,
    pub judged: Vec<Judged>,
    pub live_holds: usize,
    pub crashes: usize,
    pub errors: Vec<String>,
    /// The lock server's keys without an expiry once everyone was done.
    pub forever: Vec<String>,
    started: Instant,
}

/// The soak on `name` for the rig's length (`SOAK_SECS`, else `default_secs`).
pub async fn crash_soak(name: &'static str, default_secs: u64) -> CrashSoak {
    let rig = Rig::start(name, Mode::Unfenced, default_secs).await;
    let baseline = Baseline::take(&rig);
    let timeline = Arc::new(Timeline::default());
    let started = Instant::now();
    let until = started + rig.length();
    {
        let url = rig.server.url();
        let locker = Locker::connect(&url).await.unwrap();
        let mut tasks = Vec::new();
        for id in 0..READERS + WRITERS {
            let worker = Live {
                id,
                writer: id < WRITERS,
                locker: locker.clone(),
                store: rig.store.clone(),
                name,
                timeline: Arc::clone(&timeline),
            };
            tasks.push(tokio::spawn(worker.work(rig.seed, until)));
        }
        for slot in 0..PROCESSES {
            let (url, timeline) = (url.clone(), Arc::clone(&timeline));
            let seed = rig.seed ^ (slot as u64 + 101).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            tasks.push(tokio::spawn(kill_holders(url, name, timeline, seed, until)));
        }
        for t in tasks {
            let ended = timeout(Duration::from_secs(60), t).await;
            ended.expect("a worker hung").expect("a worker panicked");
        }
    }
    baseline.assert_back(&rig).await;
    let forever = keys_without_expiry(&rig.server.url()).await;
    let report = rig.store.check().await.unwrap();
    let (holds, waits, crashes) = (
        take(&timeline.holds),
        take(&timeline.waits),
        take(&timeline.crashes),
    );
    let judged = waits
        .into_iter()
        .map(|w| judge(w, &holds, &crashes, DEAD_LEASE))
        .collect();
    CrashSoak {
        report,
        judged,
        live_holds: holds.len(),
        crashes: crashes.len(),
        errors: take(&timeline.errors),
        forever,
        started,
    }
}

/// What `m` holds, taken out.
fn take<T>(m: &Mutex<Vec<T>>) -> Vec<T> {
    std::mem::take(&mut *m.lock().unwrap())
}

/// A shared holder or a writer in this process.
struct Live {
    id: usize,
    writer: bool,
    locker: Locker,
    store: FencedStore,
    name: &'static str,
    timeline: Arc<Timeline>,
}

impl Live {
    /// Holds the name again and again until `until`: a writer 0-20 ms with a pause of 20-100 ms
    /// between, a shared holder 0-50 ms with a pause of 0-30 ms; each hold entered in the store.
    async fn work(self, seed: u64, until: Instant) {
        let mut rng = Rng::new(seed ^ (self.id as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let o = LockOptions::new(LIVE_LEASE)
            .with_shared(!self.writer)
            .with_wait(ms(10_000));
        let (client, mode) = match self.writer {
            true => (format!("w{}", self.id), HoldMode::Exclusive),
            false => (format!("r{}", self.id), HoldMode::Shared),
        };
        let (hold, pause) = if self.writer {
            (20, (20, 100))
        } else {
            (50, (0, 30))
        };
        while Instant::now() < until {
            let start = Instant::now();
            let acquired = self.locker.acquire(self.name, &o).await;
            let end = Instant::now();
            if self.writer {
                let wait = Wait {
                    writer: self.id,
                    start,
                    end,
                    got: acquired.is_ok(),
                };
                self.timeline.waits.lock().unwrap().push(wait);
            }
            match acquired {
                Ok(lease) => {
                    let fence = lease.fence();
                    self.store.enter_as(&client, fence, mode).await.unwrap();
                    tokio::time::sleep(rng.ms(0, hold)).await;
                    self.store.leave(&client, fence).await.unwrap();
                    let released = lease.release().await;
                    let held = LiveHold {
                        got: end,
                        released: Instant::now(),
                    };
                    self.timeline.holds.lock().unwrap().push(held);
                    if let Err(e) = released {
                        self.error(&client, &e);
                    }
                }
                Err(e) => self.error(&client, &e),
            }
            tokio::time::sleep(rng.ms(pause.0, pause.1)).await;
        }
    }

    fn error(&self, client: &str, e: &dyn std::fmt::Display) {
        let error = format!("{client}: {e}");
        self.timeline.errors.lock().unwrap().push(error);
    }
}

/// Until `until`: a shared holder process (lease [`DEAD_LEASE`], waiting up to 20 s), killed with
/// SIGKILL 50-400 ms after it has the lock; then the next one.
async fn kill_holders(
    url: String,
    name: &'static str,
    timeline: Arc<Timeline>,
    seed: u64,
    until: Instant,
) {
    let mut rng = Rng::new(seed);
    let args = [
        ("redis", url),
        ("name", name.to_owned()),
        ("shared", "1".to_owned()),
        ("ttl", "30000".to_owned()),
        ("lease", DEAD_LEASE.as_millis().to_string()),
        ("wait", "20000".to_owned()),
    ];
    while Instant::now() < until {
        let mut holder = Holder::spawn("hold", &args);
        holder.expect("acquired", ms(20_000)).await;
        tokio::time::sleep(rng.ms(50, 400)).await;
        tokio::task::block_in_place(|| holder.kill());
        timeline.crashes.lock().unwrap().push(Instant::now());
    }
}

impl CrashSoak {
    /// Seconds since the soak began, for the messages.
    fn at(&self, t: Instant) -> String {
        format!("{:.3} s", (t - self.started).as_secs_f64())
    }

    fn describe(&self, j: &Judged) -> String {
        let w = j.wait;
        format!(
            "writer w{} from {} to {} ({}, waited {:?}): free at {}{}, {:?} late",
            w.writer,
            self.at(w.start),
            self.at(w.end),
            if w.got { "got the lock" } else { "gave up" },
            w.end - w.start,
            self.at(j.free),
            if j.by_dead {
                " (a killed holder's lease)"
            } else {
                ""
            },
            j.late()
        )
    }

    /// No writer waited for a dead holder past its lease (nor for anyone past the margin), no
    /// writer was inside with anyone, and the crashes were felt: at least one writer waited
    /// for a killed holder's lease. Every call succeeded, and every key the engine left expires.
    pub fn assert_sound(&self) {
        println!("{}", self.report);
        let late: Vec<&Judged> = self.judged.iter().filter(|j| j.late() > ms(0)).collect();
        let by_dead = self.judged.iter().filter(|j| j.by_dead).count();
        let longest = self.judged.iter().map(|j| j.wait.end - j.wait.start).max();
        let after_free = self
            .judged
            .iter()
            .map(|j| j.wait.end.saturating_duration_since(j.free));
        println!(
            "{} shared holder processes killed while holding (lease {DEAD_LEASE:?}); {} live \
             holds; {} writer waits (longest {longest:?}), {by_dead} of them for a killed \
             holder's lease; the lock in hand at most {:?} after it came free, {} waits late \
             (more than {MARGIN:?}); {} failed calls",
            self.crashes,
            self.live_holds,
            self.judged.len(),
            after_free.max().unwrap_or_default(),
            late.len(),
            self.errors.len()
        );
        for j in late.iter().take(5) {
            println!("  late: {}", self.describe(j));
        }
        assert!(
            late.is_empty(),
            "{} writers waited past a dead holder's lease or a live holder's release, first: {}",
            late.len(),
            self.describe(late[0])
        );
        assert_eq!(
            self.report.violations(),
            0,
            "a writer inside with others: {}",
            self.report
        );
        assert!(self.crashes > 0, "no holder was killed");
        assert!(by_dead > 0, "no writer waited for a killed holder");
        assert!(self.errors.is_empty(), "failed calls: {:?}", self.errors);
        assert!(
            self.forever.is_empty(),
            "keys without an expiry after the soak: {}",
            self.forever.join(", ")
        );
    }
}

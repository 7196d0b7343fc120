//! Handing a lock over to a waiter: the release grants it to the first waiter in its own
//! script and wakes only that one, on its locker's grant channel; queued waiters mark the
//! holder's value; a grant survives a cancelled grantee, a lost message, a newcomer, and keeps
//! the fence counter's retention.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use lock_runtime::{Lease, LockError, Locker};
use support::monitor::Monitor;
use support::queue::{
    first_waiter, queue_len, queue_stalled_waiter, queue_taker, queue_waiter, queued,
};
use support::{
    Env, assert_every_key_expires, assert_increasing, eventually, listen, ms, opts, query, set_for,
    take_and_release, within,
};
use tokio::time::Instant;

/// Marks the holder's value of the lock `key` as a queueing waiter does (`;w=0` becomes `;w=1`,
/// the expiry kept).
async fn mark(env: &Env, key: &str, token: &str) {
    let unmarked = token
        .strip_suffix(";w=0")
        .expect("the mark's field ends the value");
    let marked = format!("{unmarked};w=1");
    let () = query(
        &env.raw,
        redis::cmd("SET").arg(key).arg(marked).arg("KEEPTTL"),
    )
    .await;
}

/// A private server on which the lock `name` is held (ttl `ttl_ms`): the server, the lock's key
/// and the holder's lease.
async fn held(name: &str, ttl_ms: u64) -> (Env, String, Lease) {
    let env = Env::start().await;
    let key = env.key(name);
    let holder = env.locker.acquire(name, &opts(ttl_ms)).await.unwrap();
    (env, key, holder)
}

/// Each release grants the lock to the first waiter and wakes only that one, which holds it
/// without an attempt of its own; the others send no attempt either (a waiter's attempt re-writes
/// its state in the queue's hash with HSET, which nothing else does). Waking everyone would cost
/// 5 + 4 + 3 + 2 + 1 = 15 needless attempts over the chain of six hand-overs, and each grantee's
/// own attempt 6 more script calls; only a waiter's own timer (every 100 ms or more) may add
/// one; the first release, of a lock taken before anyone queued, tries the short release script
/// first. Both through the server's message (a locker each) and through the releasing locker's
/// own wake-up (one shared locker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_grants_the_lock_to_the_first_waiter_and_wakes_only_it() {
    let env = Env::start().await;
    support::warm_release_scripts(&env.locker, "warm").await;
    for shared in [false, true] {
        let name = if shared { "wake-shared" } else { "wake-each" };
        let holder = env.locker.acquire(name, &opts(10_000)).await.unwrap();
        let mut waiters = Vec::new();
        for i in 0..6 {
            let locker = if shared {
                env.locker.clone()
            } else {
                env.second_locker().await
            };
            waiters.push(queue_taker(&env, locker, name, ms(10_000), i + 1).await);
        }
        env.reset_stats().await;
        let mut fences = vec![holder.fence()];
        holder.release().await.unwrap();
        for w in waiters {
            fences.push(within(ms(5_000), w, "every waiter gets the lock in turn").await);
        }
        let needless = env.calls("hset").await;
        assert!(
            needless <= 3,
            "{needless} attempts by waiters whose turn it was not (shared locker: {shared})"
        );
        // The seven releases, and at most those few timer attempts: no grantee asked. The first
        // holder took the lock before anyone queued, so its release tries the short script
        // first, which leaves a marked key to the release script: one call more.
        let scripts = env.calls("evalsha").await;
        assert!(
            scripts <= 8 + needless,
            "{scripts} script calls for 7 releases (shared locker: {shared})"
        );
        assert_increasing(&fences, "fences in the order of the hand-overs");
        assert_eq!(queue_len(&env, name).await, 0);
    }
    assert_every_key_expires(&env.server).await;
}

/// A grant sets the key for the waiter's grace only (a vanished grantee holds the lock up no
/// longer than it would have kept its place); the grantee's lease extends it to the ttl on its
/// own, well before the grace ends, and a hold longer than the grace keeps the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_lease_is_extended_to_its_ttl_before_the_grace_ends() {
    let name = "granted-long";
    let (env, key, holder) = held(name, 10_000).await;
    let waiter_locker = env.second_locker().await;
    let waiter = tokio::spawn(async move {
        waiter_locker
            .acquire(name, &opts(10_000).with_wait(ms(5_000)))
            .await
            .unwrap()
    });
    queued(&env, name, 1).await;
    holder.release().await.unwrap();
    // The grant itself: the waiter's token, for about its grace (300 ms and a few round trips).
    let granted_pttl = env.pttl(&key).await;
    assert!(
        (0..=1_000).contains(&granted_pttl),
        "granted for the grace, not the ttl: pttl {granted_pttl} ms"
    );
    let lease = within(ms(2_000), waiter, "the grantee holds the lock").await;
    assert_eq!(env.get(&key).await.as_deref(), Some(lease.token()));
    // The server extends the key before the renewal's reply reaches the lease: wait for both.
    eventually(
        ms(1_000),
        "the grantee extended its key to the ttl, and its lease learnt it",
        || async { env.pttl(&key).await > 5_000 && lease.deadline() > Instant::now() + ms(5_000) },
    )
    .await;
    // Well past the grace: still held, by the same token.
    tokio::time::sleep(ms(700)).await;
    assert!(lease.is_held());
    assert_eq!(env.get(&key).await.as_deref(), Some(lease.token()));
    lease.release().await.unwrap();
    assert!(!env.exists(&key).await);
    assert_every_key_expires(&env.server).await;
}

/// A task on a tokio runtime of its own, on a thread of its own, with a locker of its own: driven
/// until [`Self::freeze`], then frozen (a current-thread runtime runs nothing outside
/// `block_on`: its sockets are not read, its timers do not fire) until [`Self::resume`], then
/// driven until [`Self::finish`]. A fault that the task must not see coming, made real.
struct OwnRuntime {
    task: tokio::task::AbortHandle,
    freeze: std::sync::mpsc::Sender<()>,
    /// Told once the runtime has left `block_on`: from then on it runs nothing.
    frozen: std::sync::mpsc::Receiver<()>,
    resume: std::sync::mpsc::Sender<()>,
    done: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl OwnRuntime {
    fn start<F, Fut>(url: String, task: F) -> Self
    where
        F: FnOnce(Locker) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (task_tx, task_rx) = std::sync::mpsc::channel();
        let (freeze, freeze_rx) = std::sync::mpsc::channel::<()>();
        let (frozen_tx, frozen) = std::sync::mpsc::channel::<()>();
        let (resume, resume_rx) = std::sync::mpsc::channel::<()>();
        let (done, done_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let locker = Locker::connect(&url).await.unwrap();
                task_tx
                    .send(tokio::spawn(task(locker)).abort_handle())
                    .unwrap();
                let _ = tokio::task::spawn_blocking(move || freeze_rx.recv()).await;
            });
            let _ = frozen_tx.send(());
            let _ = resume_rx.recv();
            rt.block_on(async {
                let _ = tokio::task::spawn_blocking(move || done_rx.recv()).await;
            });
        });
        Self {
            task: task_rx.recv().unwrap(),
            freeze,
            frozen,
            resume,
            done,
            thread,
        }
    }

    /// A waiter for the lock `name` (ttl `ttl_ms`, waiting up to 20 s) on a runtime of its own:
    /// once it holds the lock, it sends what `seen` makes of its lease on the returned channel,
    /// and releases the lock.
    fn taker<T: Send + 'static>(
        url: String,
        name: &'static str,
        ttl_ms: u64,
        seen: impl FnOnce(&Lease) -> T + Send + 'static,
    ) -> (Self, tokio::sync::oneshot::Receiver<T>) {
        let (got_tx, got_rx) = tokio::sync::oneshot::channel();
        let waiter = Self::start(url, move |locker| async move {
            let lease = locker
                .acquire(name, &opts(ttl_ms).with_wait(ms(20_000)))
                .await
                .unwrap();
            let _ = got_tx.send(seen(&lease));
            lease.release().await.unwrap();
        });
        (waiter, got_rx)
    }

    /// Returns once the runtime is frozen. Returning earlier let the runtime run on for a moment
    /// under load: long enough, after a fault made right after this, to react to it (reconnect,
    /// subscribe again) before freezing, which the fault was meant to keep it from.
    fn freeze(&self) {
        self.freeze.send(()).unwrap();
        self.frozen.recv().unwrap();
    }

    fn resume(&self) {
        self.resume.send(()).unwrap();
    }

    fn finish(self) {
        self.done.send(()).unwrap();
        self.thread.join().unwrap();
    }
}

/// A release grants the lock to the first waiter under its last attempt's token; if that waiter
/// is cancelled before the grant's message reaches it, dropping it passes the lock on to the next
/// waiter at once, not when the grant's grace runs out. The first waiter runs on a runtime of its
/// own, frozen while the grant is made, so the fault is real: the key holds the token of a
/// waiter that never learnt of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cancelled_after_its_grant_passes_the_lock_on() {
    let name = "granted-then-cancelled";
    let (env, key, holder) = held(name, 30_000).await;
    let first_took = Arc::new(AtomicBool::new(false));
    let took = first_took.clone();
    let first = OwnRuntime::start(env.server.url(), move |locker| async move {
        let lease = locker
            .acquire(name, &opts(30_000).with_wait(ms(20_000)))
            .await;
        took.store(true, Ordering::SeqCst);
        drop(lease);
    });
    queued(&env, name, 1).await;
    first.freeze();
    let second_locker = env.second_locker().await;
    let second = take_and_release(second_locker, name, opts(30_000).with_wait(ms(20_000)));
    queued(&env, name, 2).await;
    let holder_fence = holder.fence();
    holder.release().await.unwrap();
    let granted = env.get(&key).await.expect("granted, not deleted");
    assert!(
        !granted.starts_with('~'),
        "granted to a token, not handed over: {granted}"
    );
    assert_eq!(queue_len(&env, name).await, 1, "the grantee left the queue");
    // Cancel the first waiter, then let its runtime go on: it drops the waiter unpolled.
    first.task.abort();
    let begun = Instant::now();
    first.resume();
    let fence = within(ms(5_000), second, "the lock went on to the second waiter").await;
    // At once: not when the grant's grace (at least 300 ms from the release) ran out.
    assert!(
        begun.elapsed() < ms(200),
        "passed on after {:?}, as if the grant had expired",
        begun.elapsed()
    );
    assert!(fence > holder_fence, "fence {fence} after {holder_fence}");
    assert!(
        !first_took.load(Ordering::SeqCst),
        "the first waiter ran on after its cancellation"
    );
    first.finish();
    assert!(!env.exists(&key).await);
    assert_every_key_expires(&env.server).await;
}

/// A grant whose message never reaches its waiter does not strand the lock: the waiter's next
/// attempt takes it (the grant is its last attempt's token), well before the grant's grace runs
/// out. The fault is real: the waiter's runtime is frozen while the server drops its pub/sub
/// connection and the release publishes the grant to nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_message_is_lost_is_taken_by_the_waiters_next_attempt() {
    let name = "grant-lost";
    let (env, key, holder) = held(name, 30_000).await;
    let (waiter, got_rx) = OwnRuntime::taker(env.server.url(), name, 30_000, |lease| {
        (Instant::now(), lease.token().to_owned(), lease.fence())
    });
    queued(&env, name, 1).await;
    let (_, grant_channel) = first_waiter(&env.raw, &key).await;
    eventually(ms(2_000), "the waiter listens for its grant", || async {
        env.subscribers(&grant_channel).await == 1
    })
    .await;
    waiter.freeze();
    let _: i64 = query(
        &env.raw,
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub"),
    )
    .await;
    assert_eq!(
        env.subscribers(&grant_channel).await,
        0,
        "nobody hears the grant"
    );
    let holder_fence = holder.fence();
    holder.release().await.unwrap();
    let granted = env.get(&key).await.expect("granted, not deleted");
    let resumed = Instant::now();
    waiter.resume();
    let (got_at, token, fence) = tokio::time::timeout(ms(5_000), got_rx)
        .await
        .expect("the waiter got the lock")
        .unwrap();
    assert_ne!(
        token, granted,
        "taken by an attempt, not by the (lost) message"
    );
    assert!(fence > holder_fence, "fence {fence} after {holder_fence}");
    println!("taken {:?} after the waiter resumed", got_at - resumed);
    // Its grant held the lock for it: taken well inside the grace (300 ms and more).
    assert!(
        got_at - resumed < ms(250),
        "taken {:?} after the waiter resumed",
        got_at - resumed
    );
    waiter.finish();
    eventually(ms(2_000), "released", || async { !env.exists(&key).await }).await;
    assert_every_key_expires(&env.server).await;
}

/// A waiter whose queue state has no ttl is not sent a grant it would not understand; it gets a
/// hand-over marked `~<waiter id>` for its grace, which its next attempt takes (and which goes on
/// to others once that grace is over). Such a waiter does not mark the holder's value, so only a
/// release that looks at the queue hands over to it: one whose value another waiter marked.
/// Alone behind a holder, fenced or not, that waiter finds the key freed by the release's short
/// path, and takes it at its next attempt, within a third of its grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_state_has_no_ttl_gets_a_hand_over_by_id() {
    let env = Env::start().await;
    let name = "old-waiter";
    let key = env.key(name);
    queue_stalled_waiter(&env, &key, "elder").await;
    // Nothing marked the value: a fenced release records its fence and frees the key.
    let holder = env.locker.acquire(name, &opts(10_000)).await.unwrap();
    holder.release().await.unwrap();
    assert_eq!(env.get(&key).await, None, "the short path freed the key");
    assert_eq!(queue_len(&env, name).await, 1, "the elder still queues");
    // A waiter with a ttl in its state queues behind the next holder and marks its value.
    let holder = env.locker.acquire(name, &opts(10_000)).await.unwrap();
    let waiter = queue_taker(&env, env.second_locker().await, name, ms(5_000), 2).await;
    holder.release().await.unwrap();
    assert_eq!(env.get(&key).await.as_deref(), Some("~elder"));
    let pttl = env.pttl(&key).await;
    assert!(
        (0..=300).contains(&pttl),
        "handed over for its grace: {pttl}"
    );
    // The elder never comes back: the other waiter gets the lock after its grace.
    let start = Instant::now();
    within(ms(5_000), waiter, "the waiter gets the lock").await;
    assert!(start.elapsed() < ms(2_000), "waited {:?}", start.elapsed());
    assert_every_key_expires(&env.server).await;
}

/// A waiter that queues behind a holder marks the holder's value in place (`;w=0` becomes
/// `;w=1`; the key keeps its expiry), so that the holder's release, whose short path does not
/// look at the queue, knows it has the lock to hand over. The holder renews the marked key,
/// and its release grants the lock to the waiter in the same script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_waiter_marks_the_holders_value_and_the_release_hands_over() {
    let env = Env::start().await;
    let name = "marked";
    let key = env.key(name);
    // Unfenced: its release takes the short path unless the value is marked.
    let holder = env
        .locker
        .acquire(name, &lock_runtime::__private::without_fence(opts(900)))
        .await
        .unwrap();
    let token = holder.token().to_owned();
    let unmarked = token
        .strip_suffix(";w=0")
        .expect("the mark's field ends the value");
    let marked = format!("{unmarked};w=1");
    let pttl_before = env.pttl(&key).await;
    let waiter = queue_taker(&env, env.second_locker().await, name, ms(10_000), 1).await;
    assert_eq!(env.get(&key).await.as_deref(), Some(marked.as_str()));
    let pttl_marked = env.pttl(&key).await;
    assert!(
        (0..=pttl_before).contains(&pttl_marked),
        "marking kept the expiry: {pttl_before} -> {pttl_marked} ms"
    );
    // Renewed (every 300 ms) while marked: the expiry moves back up and the value stays.
    let lowest = AtomicI64::new(pttl_marked);
    eventually(ms(2_000), "the marked key is renewed", || async {
        let pttl = env.pttl(&key).await;
        pttl > lowest.fetch_min(pttl, Ordering::SeqCst).min(pttl) + 100
    })
    .await;
    assert_eq!(env.get(&key).await.as_deref(), Some(marked.as_str()));
    assert!(holder.is_held());
    let monitor = Monitor::start(env.server.addr());
    holder.release().await.unwrap();
    let fence = within(ms(5_000), waiter, "the waiter gets the lock").await;
    assert!(fence > 0);
    // Only a release's script publishes a grant (`~<waiter id> <token> <fence>`); MONITOR
    // reports it a little later than the server runs it.
    eventually(
        ms(2_000),
        "the release granted the lock in its own script",
        || async {
            monitor.commands().iter().any(|c| {
                c.in_script
                    && c.args[0].eq_ignore_ascii_case("PUBLISH")
                    && c.args.last().is_some_and(|m| m.starts_with('~'))
            })
        },
    )
    .await;
    assert_every_key_expires(&env.server).await;
}

/// A release without a fence to record leaves the retention out when it is the default (the
/// script's default is the locker's): a grant by such a release still keeps the fence counter
/// for the releasing locker's retention, whether the default, another, or forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_keeps_the_fence_counter_for_the_releasing_lockers_retention() {
    let env = Env::start().await;
    let (hour, week) = (3_600_000, 7 * 24 * 3_600_000);
    for (retention, pttl_in) in [
        (
            Some(lock_runtime::DEFAULT_FENCE_RETENTION),
            week - 60_000..=week,
        ),
        (Some(ms(hour as u64)), hour - 60_000..=hour),
        (None, -1..=-1),
    ] {
        let name = format!("retention-{}", pttl_in.end());
        let holder_locker = env.locker_with(|b| b.fence_retention(retention)).await;
        let holder = holder_locker
            .acquire(&name, &lock_runtime::__private::without_fence(opts(5_000)))
            .await
            .unwrap();
        let waiter_locker = env.second_locker().await;
        let waiter_name = name.clone();
        let waiter = tokio::spawn(async move {
            waiter_locker
                .acquire(&waiter_name, &opts(5_000).with_wait(ms(10_000)))
                .await
        });
        queued(&env, &name, 1).await;
        holder.release().await.unwrap();
        let granted = within(ms(5_000), waiter, "the waiter gets the lock")
            .await
            .unwrap();
        let counter = format!("{}:fence", env.key(&name));
        let pttl = env.pttl(&counter).await;
        assert!(
            pttl_in.contains(&pttl),
            "retention {retention:?}: counter PTTL {pttl} ms"
        );
        assert_eq!(env.get(&counter).await, Some(granted.fence().to_string()));
        granted.release().await.unwrap();
    }
    // No `assert_every_key_expires`: `fence_retention(None)` keeps its counter forever.
}

/// An operator's forced release of a lock with a waiter queued grants it to that waiter in the
/// same script, as the holder's release would; the holder learns of its loss at its release, and
/// every key the grant wrote expires (the fence counter too: the holder took the lock with the
/// plain commands, which leave the counter to its release, so the grant writes it first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_grants_the_lock_to_the_waiter_and_every_key_expires() {
    let name = "forced";
    let (env, key, holder) = held(name, 10_000).await;
    let waiter = queue_taker(&env, env.second_locker().await, name, ms(5_000), 1).await;
    let info = env.locker.inspect(name).await.unwrap().expect("held");
    assert!(env.locker.force_release(name, &info.value).await.unwrap());
    let fence = within(ms(5_000), waiter, "the waiter gets the lock").await;
    assert!(
        fence > holder.fence(),
        "fence {fence} after {}",
        holder.fence()
    );
    let lost = holder.release().await;
    assert!(matches!(lost, Err(LockError::Lost { .. })), "{lost:?}");
    assert!(!env.exists(&key).await);
    assert_every_key_expires(&env.server).await;
}

/// A value without the waiters' mark field (another client's, for one) is never changed by a
/// waiter queued behind it; the waiter takes the lock once it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_never_changes_a_value_without_the_mark() {
    let env = Env::start().await;
    let name = "foreign-mark";
    let key = env.key(name);
    for value in [
        "8f3c0d5e-4b1a-4c2e-9f6d-2a7b8c9d0e1f",
        "0123456789abcdef0123456789abcdef;host=h;pid=7",
    ] {
        set_for(&env, &key, value, ms(700)).await;
        let waiter = queue_taker(&env, env.second_locker().await, name, ms(5_000), 1).await;
        assert_eq!(env.get(&key).await.as_deref(), Some(value));
        within(ms(5_000), waiter, "taken once the key expired").await;
    }
    assert_every_key_expires(&env.server).await;
}

/// A key that expires under queued waiters (its holder died) is free for a moment: the first
/// waiter times its next attempt for the expiry, and an uncontended acquire does not look at
/// the queue, so a newcomer that comes in that moment takes the lock, once. The waiter's attempt
/// then marks the newcomer's value, and the newcomer's release grants the lock to the waiter
/// instead of freeing it for anyone. The waiter runs on a runtime of its own, frozen over the
/// expiry, so that the newcomer does come in that moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_that_takes_a_lock_expired_under_waiters_hands_it_to_the_first_of_them() {
    let env = Env::start().await;
    let name = "taken-under";
    let key = env.key(name);
    // A holder that died, its value with the waiters' mark field: its key expires in 500 ms.
    let dead = "AAAAAAAAAAAAAAAAAAAAAA;h=h;p=7;w=0";
    set_for(&env, &key, dead, ms(500)).await;
    let (waiter, got_rx) = OwnRuntime::taker(env.server.url(), name, 10_000, |lease| {
        lease.token().to_owned()
    });
    queued(&env, name, 1).await;
    let marked_dead = format!("{}1", &dead[..dead.len() - 1]);
    assert_eq!(env.get(&key).await, Some(marked_dead), "the waiter marks");
    waiter.freeze();
    eventually(ms(2_000), "the dead holder's key expired", || async {
        !env.exists(&key).await
    })
    .await;
    let newcomer = env
        .locker
        .acquire(name, &opts(10_000))
        .await
        .expect("a newcomer takes the key in the moment it is free");
    let newcomer_token = newcomer.token().to_owned();
    assert_eq!(queue_len(&env, name).await, 1, "the waiter keeps its place");
    waiter.resume();
    let marked = format!("{}1", &newcomer_token[..newcomer_token.len() - 1]);
    eventually(
        ms(5_000),
        "the waiter's attempt marks the newcomer",
        || async { env.get(&key).await.as_deref() == Some(marked.as_str()) },
    )
    .await;
    newcomer.release().await.unwrap();
    let token = tokio::time::timeout(ms(5_000), got_rx)
        .await
        .expect("the newcomer's release granted the lock to the waiter")
        .unwrap();
    assert_ne!(token, newcomer_token);
    waiter.finish();
    eventually(ms(2_000), "released", || async { !env.exists(&key).await }).await;
    assert_eq!(queue_len(&env, name).await, 0);
    assert_every_key_expires(&env.server).await;
}

/// The messages `listener` got up to the marker this sends on `<key>:released:end`: every
/// message published before it (one server delivers them in order).
async fn released_messages(
    env: &Env,
    key: &str,
    listener: &mut tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
) -> Vec<(String, String)> {
    let marker = redis::cmd("PUBLISH")
        .arg(format!("{key}:released:end"))
        .arg("end")
        .clone();
    let _: i64 = query(&env.raw, &marker).await;
    let mut got = Vec::new();
    loop {
        let message = tokio::time::timeout(ms(2_000), listener.recv())
            .await
            .expect("the marker arrives")
            .unwrap();
        if message.1 == "end" {
            return got;
        }
        got.push(message);
    }
}

/// A grant goes to the grantee's locker alone: on the grant channel its waiter id names
/// (`;grants=<id>` at its end), not on the channel every waiter of the lock listens to, so the
/// connections of the other lockers (services) are not woken by a message that is not theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_is_published_to_the_grantees_locker_only() {
    let name = "grant-channel";
    let (env, key, holder) = held(name, 10_000).await;
    let waiter = queue_taker(&env, env.second_locker().await, name, ms(5_000), 1).await;
    let (head, grant_channel) = first_waiter(&env.raw, &key).await;
    // The waiter listens on both: the lock's channel and its locker's grant channel.
    let lock_channel = format!("{key}:released");
    eventually(ms(2_000), "the waiter subscribed to its grants", || async {
        env.subscribers(&lock_channel).await == 1 && env.subscribers(&grant_channel).await == 1
    })
    .await;
    let (_conn, mut listener) = listen(&env.server.url(), &format!("{key}:released*")).await;
    holder.release().await.unwrap();
    within(ms(5_000), waiter, "the grantee took the lock").await;
    let messages = released_messages(&env, &key, &mut listener).await;
    assert_eq!(
        messages.len(),
        1,
        "one grant and nothing else: {messages:?}"
    );
    let (channel, payload) = &messages[0];
    assert_eq!(channel, &grant_channel, "published on {channel}");
    assert!(payload.starts_with(&format!("~{head} ")), "{payload}");
    assert_eq!(queue_len(&env, name).await, 0);
    assert_every_key_expires(&env.server).await;
}

/// A waiter whose id names no grant channel (no `;grants=<id>` at its end) gets its grant on the
/// lock's channel, which such waiters listen to.
#[tokio::test]
async fn a_waiter_without_a_grant_channel_is_granted_on_the_locks_channel() {
    let name = "grant-shared";
    let (env, key, holder) = held(name, 10_000).await;
    queue_waiter(&env, &key, "elder", "nonce 10000 300").await;
    // Such a waiter marks the holder's value as it queues, so that the release looks at the queue.
    mark(&env, &key, holder.token()).await;
    let (_conn, mut listener) = listen(&env.server.url(), &format!("{key}:released*")).await;
    holder.release().await.unwrap();
    assert_eq!(env.get(&key).await.as_deref(), Some("nonce"), "granted");
    let messages = released_messages(&env, &key, &mut listener).await;
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert_eq!(messages[0].0, format!("{key}:released"));
    assert!(
        messages[0].1.starts_with("~elder nonce "),
        "{:?}",
        messages[0]
    );
    assert_every_key_expires(&env.server).await;
}

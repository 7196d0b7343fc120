//! Mutual exclusion under real faults, checked against a fenced store's history.
//!
//! Every test runs real redis-server processes; process faults hit real processes (the
//! `lock_holder` binary), network faults go through `FaultProxy`. The fenced store lives on a
//! redis-server of its own, out of the faults' reach (see `support/fenced.rs`). Each fault test
//! also shows that the fault happened, so that it cannot pass by never exercising it.
//!
//! The tests of this file run one at a time (`SERIAL`): they measure lease timings on a small
//! machine, and one test running four holder processes would skew the others.

pub mod support;

use std::os::unix::process::ExitStatusExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{Lease, LockError, Locker, LostReason};
use lock_testing::{FaultProxy, RedisServer};
use support::fenced::FencedStore;
use support::history::{Event, Mode, Report};
use support::holder::{Holder, field, num_field};
use support::{
    Env, SERIAL, SleepingBody, acquire_retrying, assert_increasing, assert_mentions, cycle,
    eventually, lost_reason, ms, opts, query,
};
use tokio::time::{Instant, timeout};

/// A fenced store on a redis-server of its own.
struct Store {
    _server: RedisServer,
    url: String,
    store: FencedStore,
}

impl Store {
    async fn start(name: &str, mode: Mode) -> Self {
        let server = RedisServer::start();
        let url = server.url();
        let store = FencedStore::connect(&url, name)
            .await
            .expect("store connects");
        store.reset(mode).await.expect("store reset");
        Self {
            _server: server,
            url,
            store,
        }
    }
}

/// Records when it is dropped: the moment a body was cancelled.
struct DropClock(Arc<Mutex<Option<Instant>>>);

impl Drop for DropClock {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = Some(Instant::now());
    }
}

/// A locked section of the test process: a fenced read-modify-write under `lease`.
async fn section(store: &FencedStore, client: &str, lease: &Lease) -> bool {
    let entered = store
        .enter(client, lease.fence())
        .await
        .expect("store enter");
    store
        .write(client, lease.fence(), entered.basis)
        .await
        .expect("store write")
        .accepted
}

/// Acquires through a locker whose connection may still be reconnecting after a fault:
/// Redis errors are retried for a bounded time, anything else is returned.
async fn acquire_through(
    locker: &Locker,
    name: &str,
    o: &lock_runtime::LockOptions,
) -> Result<Lease, LockError> {
    acquire_retrying(locker, name, o, |e| matches!(e, LockError::Redis { .. })).await
}

/// A private server, the proxy of its faults, and a locker that reaches it through the proxy.
async fn proxied_env() -> (Env, FaultProxy, Locker) {
    let env = Env::start().await;
    let proxy = FaultProxy::start(env.server.addr()).await;
    let locker = Locker::connect(&proxy.url()).await.unwrap();
    (env, proxy, locker)
}

// ---------------------------------------------------------------------------------------------
// Many processes through the attribute.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_through_the_attribute_never_overlap() {
    let _serial = SERIAL.lock().await;
    let lock = RedisServer::start();
    let store = Store::start("many-processes", Mode::Fenced).await;
    let (procs, tasks, sections) = (4u64, 4u64, 200u64);
    let mut holders: Vec<Holder> = (0..procs)
        .map(|p| {
            Holder::spawn(
                "attr",
                &[
                    ("redis", lock.url()),
                    ("store", store.url.clone()),
                    ("name", "many-processes".to_owned()),
                    ("client", format!("p{p}")),
                    ("tasks", tasks.to_string()),
                    ("sections", sections.to_string()),
                ],
            )
        })
        .collect();
    let mut done = 0;
    let mut busy = 0;
    for h in &mut holders {
        let line = h.expect("done", Duration::from_secs(180)).await;
        assert_eq!(num_field(&line, "errors"), 0, "{line}");
        done += num_field(&line, "sections");
        busy += num_field(&line, "busy");
        assert!(h.wait(Duration::from_secs(10)).await.success());
    }
    let report = store.store.check().await.unwrap();
    println!("{report}; busy retries: {busy}");
    let total = procs * tasks * sections;
    assert_eq!(done, total);
    assert_eq!(report.holds.len() as u64, total, "{report}");
    assert_eq!(report.incomplete, 0, "{report}");
    assert_eq!(report.accepted as u64, total, "{report}");
    assert_eq!(report.overlaps.len(), 0, "overlapping holds: {report}");
    assert_eq!(report.lost_updates.len(), 0, "lost updates: {report}");
    assert_eq!(report.stale_accepted.len(), 0, "{report}");
    assert!(report.fences_increasing, "{report}");
    assert_eq!(report.final_value, total);
    assert_eq!(store.store.value().await.unwrap(), total);
}

// ---------------------------------------------------------------------------------------------
// Holder killed while holding.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_is_taken_over_after_its_key_expires_within_ttl() {
    let _serial = SERIAL.lock().await;
    let env = Env::start().await;
    const TTL: u64 = 500;
    let rounds = 3;
    let mut taken_over = 0;
    for round in 0..rounds {
        let name = format!("killed-{round}");
        let key = env.key(&name);
        let mut a = Holder::spawn(
            "hold",
            &[
                ("redis", env.server.url()),
                ("name", name.clone()),
                ("ttl", TTL.to_string()),
            ],
        );
        let line = a.expect("acquired", Duration::from_secs(10)).await;
        let (a_fence, a_token) = (num_field(&line, "fence"), field(&line, "token").to_owned());

        // Another holder waits for the lock before the crash.
        let waiter = {
            let (locker, name) = (env.second_locker().await, name.clone());
            tokio::spawn(async move {
                let lease = locker
                    .acquire(&name, &opts(5_000).with_wait(ms(5_000)))
                    .await;
                (Instant::now(), lease)
            })
        };
        let channel = format!("{key}:released");
        eventually(ms(5_000), "the waiter to subscribe", || async {
            env.subscribers(&channel).await > 0
        })
        .await;

        let status = a.kill();
        let killed = Instant::now();
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "the holder died of SIGKILL"
        );
        // The fault: the dead holder's key is still there, and only its expiry frees it.
        let asked = Instant::now();
        let mut raw = env.raw.clone();
        let (value, pttl): (Option<String>, i64) = redis::pipe()
            .get(&key)
            .pttl(&key)
            .query_async(&mut raw)
            .await
            .unwrap();
        // As the holder wrote it, or with the waiters' mark set by the queued waiter.
        let marked = a_token.strip_suffix(";w=0").map(|t| format!("{t};w=1"));
        assert!(
            value.as_deref() == Some(a_token.as_str()) || value == marked,
            "round {round}: the killed holder's key: {value:?}, token {a_token}"
        );
        assert!(pttl > 0, "round {round}: PTTL {pttl}");
        let expires_no_earlier = asked + ms(pttl as u64);

        let (acquired_at, lease) = timeout(ms(10_000), waiter)
            .await
            .expect("waiter finishes")
            .unwrap();
        let lease = lease.expect("the waiter takes the lock over");
        assert!(lease.fence() > a_fence, "round {round}: fences grow");
        assert!(
            acquired_at + ms(1) >= expires_no_earlier,
            "round {round}: taken over {:?} before the key's expiry",
            expires_no_earlier - acquired_at
        );
        let took = acquired_at - killed;
        println!("round {round}: taken over {took:?} after SIGKILL (ttl {TTL} ms)");
        assert!(
            took <= ms(TTL + 100),
            "round {round}: taken over {took:?} after the kill, more than ttl + 100 ms"
        );
        lease.release().await.unwrap();
        taken_over += 1;
    }
    assert_eq!(taken_over, rounds);
}

// ---------------------------------------------------------------------------------------------
// Holder paused past its ttl, with fencing and without.

/// Rounds of: holder A (a process) enters the store under the lock and blocks right before its
/// write; the test freezes A (SIGSTOP) until B, in the test process, has taken the lock after
/// A's key expired and written; then A is resumed and writes at once with its old fence.
async fn paused_holder_rounds(mode: Mode, rounds: usize) -> Report {
    let env = Env::start().await;
    let store = Store::start("paused", mode).await;
    const TTL: u64 = 300;
    for round in 0..rounds {
        let mut a = Holder::spawn(
            "stale",
            &[
                ("redis", env.server.url()),
                ("store", store.url.clone()),
                ("name", "paused".to_owned()),
                ("client", format!("A{round}")),
                ("ttl", TTL.to_string()),
            ],
        );
        let a_fence = num_field(
            &a.expect("acquired", Duration::from_secs(10)).await,
            "fence",
        );
        a.expect("blocked", Duration::from_secs(5)).await;
        a.pause().await;

        // B takes the lock once A's key expired: A's renewals are frozen with it.
        let o = opts(2_000).with_wait(ms(5_000));
        let client = format!("B{round}");
        let (b_fence, b_accepted) = env
            .locker
            .run("paused", &o, async |lease| {
                (lease.fence(), section(&store.store, &client, lease).await)
            })
            .await
            .expect("B runs its section");
        assert!(
            b_fence > a_fence,
            "round {round}: B's fence {b_fence} <= A's {a_fence}"
        );
        assert!(b_accepted, "round {round}: B's write was refused");
        assert!(a.is_stopped(), "round {round}: A ran while B held the lock");

        a.send_line("go");
        a.resume().await;
        let wrote = a.expect("wrote", Duration::from_secs(5)).await;
        let result = a.expect("result", Duration::from_secs(5)).await;
        println!("round {round}: A (fence {a_fence}) {wrote}; {result}; B fence {b_fence}");
        assert!(a.wait(Duration::from_secs(5)).await.success());
    }
    let report = store.store.check().await.unwrap();
    println!("{report}");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_stale_write_is_refused_by_the_fence() {
    let _serial = SERIAL.lock().await;
    let rounds = 3;
    let report = paused_holder_rounds(Mode::Fenced, rounds).await;
    assert_eq!(
        report.stale_accepted.len(),
        0,
        "stale writes accepted: {report}"
    );
    assert_eq!(
        report.refused.len(),
        rounds,
        "each paused holder's write is refused: {report}"
    );
    assert_eq!(
        report.accepted, rounds,
        "each B's write is accepted: {report}"
    );
    assert_eq!(report.lost_updates.len(), 0, "{report}");
    assert_eq!(report.violations(), 0, "{report}");
    // The fault happened: each paused holder's section overlapped the next holder's.
    assert_eq!(report.overlaps.len(), rounds, "{report}");
}

/// The same pause, landing wherever the holder happens to be in an async body: the body is
/// cancelled at its next await, or its write reaches the store and is refused. Never accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_async_body_is_cancelled_or_refused() {
    let _serial = SERIAL.lock().await;
    let env = Env::start().await;
    let store = Store::start("paused-async", Mode::Fenced).await;
    const TTL: u64 = 300;
    let rounds = 3;
    let (mut exercised, mut cancelled, mut refused) = (0, 0, 0);
    for round in 0..rounds {
        let client = format!("A{round}");
        let mut a = Holder::spawn(
            "stale-async",
            &[
                ("redis", env.server.url()),
                ("store", store.url.clone()),
                ("name", "paused-async".to_owned()),
                ("client", client.clone()),
                ("ttl", TTL.to_string()),
                ("hold", "150".to_owned()),
            ],
        );
        let a_fence = num_field(&a.expect("entered", Duration::from_secs(10)).await, "fence");
        a.pause().await;
        // Did the pause land before A's write? The store's history says.
        let wrote_before_pause = store
            .store
            .history()
            .await
            .unwrap()
            .iter()
            .any(|e| matches!(e, Event::Write { client: c, .. } if *c == client));
        let o = opts(2_000).with_wait(ms(5_000));
        let b_client = format!("B{round}");
        let b_fence = env
            .locker
            .run("paused-async", &o, async |lease| {
                assert!(
                    section(&store.store, &b_client, lease).await,
                    "B's write is accepted"
                );
                lease.fence()
            })
            .await
            .expect("B runs its section");
        assert!(b_fence > a_fence);
        a.resume().await;
        let rest = a.rest(Duration::from_secs(5)).await;
        let a_wrote = rest.iter().find(|l| l.starts_with("wrote"));
        let result = rest
            .iter()
            .find(|l| l.starts_with("result"))
            .cloned()
            .unwrap_or_default();
        println!(
            "round {round}: paused before its write: {}; after resume: {rest:?}",
            !wrote_before_pause
        );
        if !wrote_before_pause {
            exercised += 1;
            match a_wrote {
                Some(line) => {
                    assert_eq!(
                        field(line, "accepted"),
                        "false",
                        "round {round}: stale write accepted"
                    );
                    refused += 1;
                }
                None => {
                    assert!(
                        result.starts_with("result err=lost"),
                        "round {round}: {result}"
                    );
                    cancelled += 1;
                }
            }
        }
    }
    let report = store.store.check().await.unwrap();
    println!(
        "{report}; exercised {exercised} of {rounds}: {cancelled} cancelled, {refused} refused"
    );
    assert!(exercised >= 1, "no pause landed before the holder's write");
    assert_eq!(report.stale_accepted.len(), 0, "{report}");
    assert_eq!(report.violations(), 0, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_control_without_fencing_the_stale_write_is_accepted() {
    let _serial = SERIAL.lock().await;
    let rounds = 2;
    let report = paused_holder_rounds(Mode::Unfenced, rounds).await;
    // The checker sees the failure that fencing guards against.
    assert_eq!(report.stale_accepted.len(), rounds, "{report}");
    assert_eq!(report.lost_updates.len(), rounds, "{report}");
    assert_eq!(report.unsafe_overlaps, rounds, "{report}");
    assert_eq!(report.refused.len(), 0, "{report}");
    assert_eq!(
        report.final_value, rounds as u64,
        "{rounds} rounds of two increments each kept one"
    );
}

// ---------------------------------------------------------------------------------------------
// Redis frozen, or the holder's connection blackholed.

#[derive(Debug, Clone, Copy)]
enum Silence {
    /// The proxy between the holder and Redis forwards nothing; Redis itself runs.
    Blackhole,
    /// Redis is stopped (SIGSTOP).
    Freeze,
}

/// How the holder holds the lock while Redis goes silent.
#[derive(Debug, Clone, Copy)]
enum Style {
    /// `Locker::run`, silenced before the first renewal: the body's `max_exec` deadline (from the
    /// body's start) comes after the lease's validity (from the acquire's send), so the validity
    /// is what cancels the body. (After a renewal, `max_exec` always comes first by design.)
    Body,
    /// `Locker::acquire`, renewed for a while, then silenced: `Lease::lost` must fire in time.
    Lease,
}

async fn silenced_holder(fault: Silence) {
    let (env, proxy, a) = proxied_env().await;
    // B goes straight to Redis (connected now: it could not connect to a frozen Redis).
    let b = env.second_locker().await;
    const TTL: u64 = 1_000;
    let o = opts(TTL).with_renew(ms(100));
    let styles = [Style::Body, Style::Lease];
    let mut in_time = 0;
    for (round, style) in styles.into_iter().enumerate() {
        let name = format!("silenced-{round}");
        let key = env.key(&name);
        let ended = Arc::new(Mutex::new(None));
        let (deadline_tx, mut deadline_rx) = tokio::sync::watch::channel(None);
        let holder = {
            let (a, name, ended) = (a.clone(), name.clone(), ended.clone());
            tokio::spawn(async move {
                match style {
                    Style::Body => a
                        .run(&name, &o, async |lease| {
                            let _clock = DropClock(ended);
                            // Report the lease's deadline as it moves, until cancelled.
                            loop {
                                deadline_tx.send_replace(Some(lease.deadline()));
                                tokio::time::sleep(ms(5)).await;
                            }
                        })
                        .await
                        .map(|()| None),
                    Style::Lease => {
                        let lease = a.acquire(&name, &o).await?;
                        let reason = loop {
                            deadline_tx.send_replace(Some(lease.deadline()));
                            tokio::select! {
                                reason = lease.lost() => break reason,
                                () = tokio::time::sleep(ms(5)) => {}
                            }
                        };
                        *ended.lock().unwrap() = Some(Instant::now());
                        Ok(Some(reason))
                    }
                }
            })
        };
        let first = deadline_rx
            .wait_for(Option::is_some)
            .await
            .unwrap()
            .unwrap();
        if let Style::Lease = style {
            // Two confirmed renewals: the fault hits a lease in its steady state.
            deadline_rx
                .wait_for(|d| d.is_some_and(|d| d > first))
                .await
                .unwrap();
            let second = deadline_rx.borrow().unwrap();
            deadline_rx
                .wait_for(|d| d.is_some_and(|d| d > second))
                .await
                .unwrap();
        }
        match fault {
            Silence::Blackhole => proxy.blackhole(),
            Silence::Freeze => env.server.pause(),
        }
        // B waits for the key: it gets it only after the key expired (blackhole), and not at
        // all while Redis is frozen.
        let waiter = {
            let (locker, name) = (b.clone(), name.clone());
            tokio::spawn(async move {
                let lease =
                    acquire_through(&locker, &name, &opts(5_000).with_wait(ms(5_000))).await;
                (Instant::now(), lease)
            })
        };
        let res = timeout(ms(5_000), holder)
            .await
            .expect("the holder ends")
            .unwrap();
        let ended_at = ended.lock().unwrap().expect("the holder saw the end");
        // The fault happened: no renewal got through, the lease ran out.
        match style {
            Style::Body => assert_eq!(
                lost_reason(&res),
                Some(LostReason::ValidityExpired),
                "round {round} ({fault:?}, {style:?}): {res:?}"
            ),
            Style::Lease => assert!(
                matches!(res, Ok(Some(LostReason::ValidityExpired))),
                "round {round} ({fault:?}, {style:?}): {res:?}"
            ),
        }
        // The last deadline reported is the lease's final validity: no renewal confirmed after
        // it. The key cannot expire before it + drift (validity = sent + ttl - drift). The end
        // comes about 1 ms after the deadline on an idle machine; the margin is the drift, which
        // a scheduler stall on a loaded machine can exceed, so the hard checks are causal (below:
        // nobody else got the lock first) plus a loose bound that still fails if the end waited
        // for something slower than the clock, like a reply timeout (1 s).
        let last_deadline = deadline_rx.borrow().unwrap();
        let late = ended_at.saturating_duration_since(last_deadline);
        println!(
            "round {round} ({fault:?}, {style:?}): ended {late:?} after the lease's deadline; \
             the key cannot expire before {:?} after it{}",
            opts(TTL).drift(),
            if late >= opts(TTL).drift() {
                " (LATE: scheduler stall?)"
            } else {
                ""
            }
        );
        assert!(
            late < ms(250),
            "round {round} ({style:?}): ended {late:?} after the lease's deadline"
        );
        match fault {
            Silence::Blackhole => {
                let (b_at, b_lease) = timeout(ms(10_000), waiter).await.unwrap().unwrap();
                let b_lease = b_lease.expect("B takes the lock once A's key expired");
                assert!(
                    ended_at < b_at,
                    "round {round} ({style:?}): B held the lock before A stopped"
                );
                // Heal. A's renewals and release held by the proxy are delivered now: they
                // carry A's token and must not touch B's key.
                proxy.pass();
                let err = acquire_through(&a, &name, &opts(TTL))
                    .await
                    .expect_err("B holds the lock");
                assert!(
                    matches!(err, LockError::Busy { .. }),
                    "round {round}: {err}"
                );
                assert_eq!(
                    env.get(&key).await.as_deref(),
                    Some(b_lease.token()),
                    "round {round}: B's key"
                );
                b_lease.release().await.unwrap();
            }
            Silence::Freeze => {
                // Nobody can take the lock from a frozen Redis: the holder stopped first.
                assert!(
                    !waiter.is_finished(),
                    "round {round}: someone took the lock from a frozen Redis"
                );
                env.server.resume();
                let (_, b_lease) = timeout(ms(10_000), waiter).await.unwrap().unwrap();
                b_lease
                    .expect("B takes the lock after Redis resumes")
                    .release()
                    .await
                    .unwrap();
            }
        }
        // The same locker works again, without a restart.
        let lease = acquire_through(&a, &name, &opts(TTL).with_wait(ms(2_000)))
            .await
            .expect("A's locker works again");
        lease.release().await.unwrap();
        in_time += 1;
    }
    assert_eq!(in_time, styles.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_connection_cancels_the_body_before_the_key_expires_and_heals() {
    let _serial = SERIAL.lock().await;
    silenced_holder(Silence::Blackhole).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_redis_cancels_the_body_before_the_key_expires_and_heals() {
    let _serial = SERIAL.lock().await;
    silenced_holder(Silence::Freeze).await;
}

/// The engine bounds every request itself: the command connections have no response timeout of
/// their own, and an uncontended acquire's plain-command request has no timer but its attempt's.
/// So once an established connection goes silent, each acquire attempt and each release still
/// gives up after one response timeout (not at the lock's ttl, not never), and the key is left
/// to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_bounds_each_acquire_and_release_by_the_response_timeout() {
    let _serial = SERIAL.lock().await;
    let env = Env::start().await;
    let proxy = FaultProxy::start(env.server.addr()).await;
    let response = Duration::from_millis(300);
    let locker = Locker::builder()
        .url(proxy.url())
        .response_timeout(response)
        .build()
        .unwrap();
    // Connected, scripts loaded: what follows is the plain-command path and the release script.
    let long = opts(30_000);
    cycle(&locker, "silent-warm", &long).await;
    let held = locker.acquire("silent-held", &long).await.unwrap();
    proxy.blackhole();
    // Within the bound, plus scheduling slack on a loaded machine; far below the 30 s ttl.
    let bound = response + Duration::from_millis(700);
    let started = Instant::now();
    let err = timeout(
        Duration::from_secs(10),
        locker.acquire("silent-other", &long),
    )
    .await
    .expect("an acquire on a silent connection returns")
    .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, LockError::Redis { .. }), "{err:?}");
    assert_mentions(&err, &["did not answer within 300ms"]);
    assert!(took >= response && took < bound, "acquire took {took:?}");
    let started = Instant::now();
    let err = timeout(Duration::from_secs(10), held.release())
        .await
        .expect("a release on a silent connection returns")
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, LockError::Redis { .. }), "{err:?}");
    assert!(took >= response && took < bound, "release took {took:?}");
    // Nothing was deleted behind the silence: the held key is still there, to expire by its ttl.
    assert!(env.exists(&env.key("silent-held")).await);
}

// ---------------------------------------------------------------------------------------------
// Acquire reply delayed past the ttl.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_reply_delayed_past_ttl_is_not_held() {
    let _serial = SERIAL.lock().await;
    let (env, proxy, a) = proxied_env().await;
    const TTL: u64 = 200;
    // Load the scripts first: a first EVALSHA answered NOSCRIPT after the timeout would never
    // reach the acquire itself.
    cycle(&a, "delayed-warm", &opts(TTL)).await;
    let rounds = 3;
    let (mut held, mut granted) = (0, 0);
    for round in 0..rounds {
        let name = format!("delayed-{round}");
        let key = env.key(&name);
        // Watches the key from the side, so that the grant is seen while it lasts.
        let watcher = {
            let (raw, key) = (env.raw.clone(), key.clone());
            tokio::spawn(async move {
                let until = Instant::now() + ms(2_000);
                while Instant::now() < until {
                    let v: Option<String> = query(&raw, redis::cmd("GET").arg(&key)).await;
                    if v.is_some() {
                        return true;
                    }
                    tokio::time::sleep(ms(1)).await;
                }
                false
            })
        };
        // Each way 150 ms: the request is granted 150 ms after it was sent, the reply would
        // arrive after 300 ms, past the 200 ms ttl.
        proxy.delay(ms(150));
        let res = a.acquire(&name, &opts(TTL)).await;
        if res.is_ok() {
            held += 1;
        }
        println!("round {round}: {res:?}");
        // The fault happened: the server granted the lock (the key was set).
        assert!(
            watcher.await.unwrap(),
            "round {round}: the delayed acquire never reached the server"
        );
        granted += 1;
        // Another holder gets it once that grant is gone (expired or cleaned up).
        let b = env
            .locker
            .acquire(&name, &opts(5_000).with_wait(ms(5_000)))
            .await
            .expect("B acquires");
        // A's late cleanup never removes B's key: one more round trip through A's connection,
        // after everything A sent before, then B's key is checked.
        proxy.pass();
        let err = acquire_through(&a, &name, &opts(1_000))
            .await
            .expect_err("B holds it");
        assert!(matches!(err, LockError::Busy { .. }), "{err}");
        assert_eq!(
            env.get(&key).await.as_deref(),
            Some(b.token()),
            "round {round}: B's key"
        );
        b.release().await.unwrap();
    }
    assert_eq!(
        held, 0,
        "an acquire whose reply came after the ttl was reported as held"
    );
    assert_eq!(granted, rounds);

    // A reply delayed less than the ttl: held, with the validity counted from the send.
    const LONG: u64 = 1_000;
    proxy.delay(ms(60));
    let sent = Instant::now();
    let lease = a.acquire("delayed-valid", &opts(LONG)).await.expect("held");
    let replied = Instant::now();
    assert!(
        replied - sent >= ms(120),
        "the proxy delayed the round trip"
    );
    // Counted from the reply, the deadline would be `replied + ttl - drift`; counted from the
    // send, it is a round trip (>= 120 ms here) earlier.
    let from_reply = replied + ms(LONG) - opts(LONG).drift();
    assert!(
        lease.deadline() + ms(100) <= from_reply,
        "validity ends only {:?} before reply + ttl - drift: not counted from the send",
        from_reply.saturating_duration_since(lease.deadline())
    );
    assert!(lease.deadline() > sent, "the lease is valid for a while");
    proxy.pass();
    lease.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Connection reset during release.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_during_release_never_deletes_another_holders_key() {
    let _serial = SERIAL.lock().await;
    let (env, proxy, a) = proxied_env().await;
    let (name, key) = ("reset", env.key("reset"));
    let rounds = 100;
    let (mut intact, mut reported_ok, mut reported_err, mut applied_unreported) = (0, 0, 0, 0);
    for round in 0..rounds {
        proxy.pass();
        let lease = acquire_through(&a, name, &opts(5_000))
            .await
            .expect("A acquires");
        let token = lease.token().to_owned();
        proxy.delay(ms(15));
        let release = tokio::spawn(lease.release());
        if round % 2 == 0 {
            // The reply is lost: reset once the server applied the release.
            eventually(ms(2_000), "the release to reach the server", || async {
                env.get(&key).await.as_deref() != Some(token.as_str())
            })
            .await;
        }
        // Odd rounds: the request itself is lost, or goes out on a new connection.
        proxy.reset_all();
        let outcome = timeout(ms(5_000), release)
            .await
            .expect("release returns")
            .unwrap();
        let still_ours = env.get(&key).await.as_deref() == Some(token.as_str());
        match &outcome {
            // Honest: "released" means the key is gone.
            Ok(()) => {
                assert!(
                    !still_ours,
                    "round {round}: release reported Ok but A's key is still there"
                );
                reported_ok += 1;
            }
            // Honest: a connection failure says so, and does not claim the lock was lost.
            Err(LockError::Redis { .. }) => {
                reported_err += 1;
                if !still_ours {
                    applied_unreported += 1;
                }
            }
            Err(e) => panic!("round {round}: release reported `{e}` for a key that was A's"),
        }
        if still_ours {
            // The release never ran: stand in for the key's expiry, so rounds stay short.
            env.del(&key).await;
        }
        proxy.pass();
        let b = env
            .locker
            .acquire(name, &opts(5_000))
            .await
            .expect("B acquires");
        // Everything A sent before is processed before this round trip through A's locker.
        let err = acquire_through(&a, name, &opts(5_000))
            .await
            .expect_err("B holds it");
        assert!(
            matches!(err, LockError::Busy { .. }),
            "round {round}: {err}"
        );
        if env.get(&key).await.as_deref() == Some(b.token()) {
            intact += 1;
        }
        b.release().await.expect("B still owns its key");
    }
    println!(
        "release outcomes: {reported_ok} Ok, {reported_err} connection errors \
         ({applied_unreported} of them applied by the server); B's key intact {intact}/{rounds}"
    );
    assert_eq!(intact, rounds, "another holder's key was deleted");
    assert!(
        reported_err >= 1,
        "no reset hit a release: the fault did not happen"
    );
}

// ---------------------------------------------------------------------------------------------
// Redis restarted (no persistence) while a lease is held.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_redis_the_holder_learns_at_its_next_renewal() {
    let _serial = SERIAL.lock().await;
    let env = Env::start().await;
    let o = opts(1_000).with_renew(ms(100));
    let rounds = 3;
    let mut learned = 0;
    let mut fences = Vec::new();
    for round in 0..rounds {
        let (body, fence) = SleepingBody::start(&env.locker, "restarted", o).await;
        fences.push(fence);
        let pid = env.server.pid();
        tokio::task::block_in_place(|| env.server.restart());
        // The fault happened: a new process, with an empty data set.
        assert_ne!(env.server.pid(), pid);
        let (res, took) = body.cut_short().await;
        assert!(
            took < ms(5_000),
            "round {round}: the body ended after {took:?}"
        );
        // NotOwner: learned from a renewal's reply, long before the validity would run out.
        assert_eq!(
            lost_reason(&res),
            Some(LostReason::NotOwner),
            "round {round}: {res:?}"
        );
        learned += 1;
    }
    assert_eq!(learned, rounds);
    // Without persistence the fence counter is lost with the data set; it restarts from the
    // server's clock, so successive holders still get growing fences (docs/guarantees.md, "Fences
    // never go back").
    println!("fences of successive holders of one name, a restart between each: {fences:?}");
    assert_increasing(&fences, "fences across restarts");
}

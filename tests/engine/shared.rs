//! `shared`: a read-write lock. Shared holds of a name run together, an exclusive one runs alone,
//! and waiters are served in arrival order (an exclusive waiter before later shared callers:
//! a case of `behaviour.rs`, run on every deployment that has `shared`).

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lock_runtime::{LockError, LockOptions, Locker};
use lock_testing::{FaultProxy, RedisServer};
use support::holder::{Holder, num_field};
use support::{Env, assert_every_key_expires, eventually, ms, query, raw_connection};
use tokio::time::Instant;

/// Who is inside the name's sections now, and what was seen.
#[derive(Default)]
struct Room {
    readers: AtomicUsize,
    writers: AtomicUsize,
    /// The most shared holders seen inside at once.
    most_readers: AtomicUsize,
    /// Times an exclusive holder was inside with anyone else.
    overlaps: AtomicUsize,
}

impl Room {
    async fn read(&self, for_ms: u64) {
        let now = self.readers.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_readers.fetch_max(now, Ordering::SeqCst);
        if self.writers.load(Ordering::SeqCst) > 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        tokio::time::sleep(ms(for_ms)).await;
        self.readers.fetch_sub(1, Ordering::SeqCst);
    }

    async fn write(&self, for_ms: u64) {
        let writers = self.writers.fetch_add(1, Ordering::SeqCst);
        if writers > 0 || self.readers.load(Ordering::SeqCst) > 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        tokio::time::sleep(ms(for_ms)).await;
        self.writers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs 6 shared and 2 exclusive tasks, 6 sections each, on `name`; `locked: false` is the unsafe
/// control, the same sections without the lock.
async fn mixed_load(locker: &Locker, name: &'static str, locked: bool) -> Arc<Room> {
    let room = Arc::new(Room::default());
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (locker, room) = (locker.clone(), Arc::clone(&room));
            let shared = i >= 2;
            let o = LockOptions::new(ms(5_000))
                .with_shared(shared)
                .with_wait(ms(20_000));
            tokio::spawn(async move {
                for _ in 0..6 {
                    let section = async {
                        match shared {
                            true => room.read(15).await,
                            false => room.write(15).await,
                        }
                    };
                    if locked {
                        locker.run(name, &o, async |_| section.await).await.unwrap();
                    } else {
                        section.await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    room
}

/// Shared holders run together and an exclusive one alone; the unsafe control (the same tasks
/// without the lock) does put an exclusive section beside others.
#[tokio::test]
async fn shared_holds_run_together_and_an_exclusive_one_runs_alone() {
    let env = Env::start().await;
    let room = mixed_load(&env.locker, "catalog", true).await;
    assert_eq!(
        room.overlaps.load(Ordering::SeqCst),
        0,
        "exclusive beside others"
    );
    assert!(
        room.most_readers.load(Ordering::SeqCst) >= 2,
        "shared holders never ran together"
    );
    let raw = raw_connection(&env.server.url()).await;
    let left: Vec<String> = query(&raw, redis::cmd("KEYS").arg("lock:{catalog}*")).await;
    assert!(
        left.iter().all(|k| k.ends_with(":fence")),
        "left behind: {left:?}"
    );
    let control = mixed_load(&env.locker, "catalog", false).await;
    assert!(control.overlaps.load(Ordering::SeqCst) > 0, "the control");
    assert_every_key_expires(&env.server).await;
}

/// The number of waiters queued on `name`.
async fn queued(raw: &redis::aio::MultiplexedConnection, name: &str) -> usize {
    query(
        raw,
        redis::cmd("ZCARD").arg(format!("lock:{{{name}}}:waiters")),
    )
    .await
}

/// An exclusive holder's release with shared callers queued lets them all in together, at once.
#[tokio::test]
async fn an_exclusive_release_lets_every_queued_shared_caller_in_together() {
    let env = Env::start().await;
    let raw = raw_connection(&env.server.url()).await;
    let writer = env
        .locker
        .acquire("rw", &LockOptions::new(ms(10_000)))
        .await
        .unwrap();
    let shared = LockOptions::new(ms(10_000))
        .with_shared(true)
        .with_wait(ms(10_000));
    let room = Arc::new(Room::default());
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (locker, room) = (env.locker.clone(), Arc::clone(&room));
            tokio::spawn(async move {
                let lease = locker.acquire("rw", &shared).await.unwrap();
                let got = Instant::now();
                room.read(300).await;
                lease.release().await.unwrap();
                got
            })
        })
        .collect();
    eventually(ms(2_000), "the readers queue", || async {
        queued(&raw, "rw").await == 3
    })
    .await;
    let released = Instant::now();
    writer.release().await.unwrap();
    for reader in readers {
        let waited = reader.await.unwrap() - released;
        assert!(
            waited < ms(1_000),
            "a reader got in {waited:?} after the release"
        );
    }
    assert_eq!(room.most_readers.load(Ordering::SeqCst), 3);
    assert_every_key_expires(&env.server).await;
}

/// A shared holder process killed with SIGKILL frees the lock within its lease: an exclusive
/// caller gets it then, not after the ttl.
#[tokio::test]
async fn a_crashed_shared_holder_frees_the_lock_within_its_lease() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.unwrap();
    let mut holder = Holder::spawn(
        "hold",
        &[
            ("redis", server.url()),
            ("name", "crashy".to_owned()),
            ("ttl", "60000".to_owned()),
            ("lease", "300".to_owned()),
            ("shared", "1".to_owned()),
        ],
    );
    let fence = num_field(&holder.expect("acquired", ms(10_000)).await, "fence");
    assert!(fence > 0);
    let o = LockOptions::new(ms(1_000));
    tokio::time::sleep(ms(600)).await;
    let busy = locker.acquire("crashy", &o).await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "held: {busy}");
    holder.kill();
    let killed = Instant::now();
    let lease = locker
        .acquire("crashy", &o.with_wait(ms(10_000)))
        .await
        .expect("the lock after the crash");
    let waited = killed.elapsed();
    assert!(waited <= ms(500), "free {waited:?} after the crash");
    assert!(lease.fence() > fence);
    assert_every_key_expires(&server).await;
}

/// Shared holders with leases of different lengths: the shorter one's renewals never shorten
/// the key under the longer one.
#[tokio::test]
async fn a_shorter_lease_never_shortens_the_key_under_a_longer_one() {
    let env = Env::start().await;
    let long = LockOptions::new(ms(10_000))
        .with_lease(ms(4_000))
        .with_shared(true);
    let short = LockOptions::new(ms(10_000))
        .with_lease(ms(300))
        .with_shared(true);
    let a = env.locker.acquire("mixed", &long).await.unwrap();
    let b = env.locker.acquire("mixed", &short).await.unwrap();
    let until = Instant::now() + ms(1_000);
    let mut least = i64::MAX;
    while Instant::now() < until {
        least = least.min(env.pttl("lock:{mixed}").await);
        tokio::time::sleep(ms(10)).await;
    }
    assert!(least > 2_500, "the key's PTTL fell to {least} ms");
    b.release().await.unwrap();
    assert!(
        env.exists("lock:{mixed}").await,
        "freed with a holder inside"
    );
    a.release().await.unwrap();
    assert!(
        !env.exists("lock:{mixed}").await,
        "not freed by the last one"
    );
    assert_every_key_expires(&env.server).await;
}

/// `shared` with `permits`, and `shared` on Redlock, are `Config` errors that say why.
#[tokio::test]
async fn shared_with_permits_and_shared_on_redlock_are_config_errors() {
    let both = LockOptions::new(ms(5_000))
        .with_shared(true)
        .with_permits(2);
    let err = both.validate().unwrap_err();
    support::assert_mentions(&err, &["shared", "permits = 2"]);
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let locker = Locker::builder()
        .urls(servers.iter().map(RedisServer::url))
        .connect()
        .await
        .unwrap();
    let o = LockOptions::new(ms(5_000)).with_shared(true);
    let err = locker.acquire("catalog", &o).await.unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    support::assert_mentions(&err, &["catalog", "shared", "Redlock"]);
    for server in &servers {
        assert_every_key_expires(server).await;
    }
}

/// Nested calls: a shared one inside an exclusive hold runs under it; an exclusive one inside a
/// shared hold is a `Config` error (it would wait for itself).
#[tokio::test]
async fn nested_calls_under_a_shared_or_an_exclusive_hold() {
    let env = Env::start().await;
    let exclusive = LockOptions::new(ms(5_000));
    let shared = exclusive.with_shared(true);
    let (outer, inner) = env
        .locker
        .run("nested", &exclusive, async |lease| {
            let inner = env.locker.run("nested", &shared, async |l| l.fence()).await;
            (lease.fence(), inner.unwrap())
        })
        .await
        .unwrap();
    assert_eq!(outer, inner);
    let err = env
        .locker
        .run("nested", &shared, async |_| {
            env.locker.run("nested", &exclusive, async |_| ()).await
        })
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    support::assert_mentions(&err, &["nested", "shared", "exclusive"]);
    assert_every_key_expires(&env.server).await;
}

/// A shared attempt dropped while its request is on its way leaves the holders about one round
/// trip later: the lock is free again, not held until the end of its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_attempt_dropped_in_flight_leaves_the_holders() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let locker = Locker::connect(&proxy.url()).await.unwrap();
    let o = LockOptions::new(ms(60_000)).with_shared(true);
    support::cycle(&locker, "dropped", &o).await;
    let raw = raw_connection(&server.url()).await;
    proxy.delay(ms(100));
    let dropped = tokio::time::timeout(ms(150), locker.acquire("dropped", &o)).await;
    assert!(dropped.is_err(), "the attempt finished: {dropped:?}");
    let holders: usize = query(&raw, redis::cmd("ZCARD").arg("lock:{dropped}:readers")).await;
    assert_eq!(holders, 1, "the dropped attempt joined the holders");
    eventually(ms(2_000), "the dropped attempt leaves", || async {
        !support::exists(&raw, "lock:{dropped}").await
    })
    .await;
    assert_every_key_expires(&server).await;
}

#[lock_runtime::distributed_lock(name = "catalog:{shop}", ttl = "5s", shared, wait = "5s", locker = locker)]
async fn read_catalog(locker: &Locker, shop: &str, room: &Room) -> Result<(), LockError> {
    room.read(50).await;
    Ok(())
}

#[lock_runtime::distributed_lock(name = "catalog:{shop}", ttl = "5s", wait = "5s", locker = locker)]
async fn rebuild_catalog(locker: &Locker, shop: &str, room: &Room) -> Result<(), LockError> {
    room.write(20).await;
    Ok(())
}

/// Through the attribute: `shared` calls run together, a call without it alone.
#[tokio::test]
async fn the_attribute_takes_shared_and_exclusive_holds() {
    let env = Env::start().await;
    let room = Room::default();
    let (locker, room) = (&env.locker, &room);
    let (a, b, c, d) = tokio::join!(
        read_catalog(locker, "eu", room),
        read_catalog(locker, "eu", room),
        rebuild_catalog(locker, "eu", room),
        read_catalog(locker, "eu", room),
    );
    for result in [a, b, c, d] {
        result.unwrap();
    }
    assert_eq!(room.overlaps.load(Ordering::SeqCst), 0);
    assert!(room.most_readers.load(Ordering::SeqCst) >= 2);
    assert_every_key_expires(&env.server).await;
}

/// `inspect` shows every shared holder with its fence, and the lock as shared; the metrics label
/// the mode.
#[tokio::test]
async fn inspect_shows_every_shared_holder() {
    let env = Env::start().await;
    let o = LockOptions::new(ms(5_000)).with_shared(true);
    let a = env.locker.acquire("seen", &o).await.unwrap();
    let b = env.locker.acquire("seen", &o).await.unwrap();
    let info = env.locker.inspect("seen").await.unwrap().expect("held");
    assert_eq!(info.state, lock_runtime::LockState::Shared);
    let mut seen: Vec<(String, Option<u64>, bool)> = info
        .holders
        .iter()
        .map(|h| (h.value.clone(), h.fence, h.shared))
        .collect();
    seen.sort();
    let mut expected = vec![
        (a.token().to_owned(), Some(a.fence()), true),
        (b.token().to_owned(), Some(b.fence()), true),
    ];
    expected.sort();
    assert_eq!(seen, expected);
    a.release().await.unwrap();
    b.release().await.unwrap();
    assert!(env.locker.inspect("seen").await.unwrap().is_none());
    assert_every_key_expires(&env.server).await;
}

/// `min_hold` as for a lock: the last shared holder's early release keeps the key for the rest
/// of `min_hold` (an exclusive caller gets it only then), and so does a permit's.
#[tokio::test]
async fn min_hold_keeps_a_shared_hold_and_a_permit() {
    let env = Env::start().await;
    let shared = LockOptions::new(ms(5_000))
        .with_shared(true)
        .with_min_hold(ms(600));
    let begun = Instant::now();
    let reader = env.locker.acquire("kept", &shared).await.unwrap();
    reader.release().await.unwrap();
    let exclusive = LockOptions::new(ms(5_000)).with_wait(ms(5_000));
    let writer = env.locker.acquire("kept", &exclusive).await.unwrap();
    let waited = begun.elapsed();
    assert!(waited >= ms(550), "taken {waited:?} after the start");
    writer.release().await.unwrap();

    let permits = LockOptions::new(ms(5_000)).with_permits(2);
    let kept = env
        .locker
        .acquire("kept-permit", &permits.with_min_hold(ms(2_000)))
        .await;
    kept.unwrap().release().await.unwrap();
    let other = env.locker.acquire("kept-permit", &permits).await.unwrap();
    let busy = env
        .locker
        .acquire("kept-permit", &permits)
        .await
        .unwrap_err();
    assert!(
        matches!(busy, LockError::Busy { .. }),
        "the kept permit: {busy}"
    );
    other.release().await.unwrap();
    assert_every_key_expires(&env.server).await;
}

/// A shared holder process (lease 1 s) killed with SIGKILL while another shared holder (lease
/// 6 s) holds, and a writer queued: the dead holder keeps the writer out no longer than its own
/// lease. When the live holder leaves after the dead one's lease ran out, the writer gets in at
/// once; when it leaves before, the writer gets in when the dead one's lease runs out, not when
/// the live one's would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_shared_holder_keeps_writers_out_no_longer_than_its_lease() {
    for leaves_after_ms in [1_300, 200] {
        let env = Env::start().await;
        let mut dead = Holder::spawn(
            "hold",
            &[
                ("redis", env.server.url()),
                ("name", "books".to_owned()),
                ("ttl", "60000".to_owned()),
                ("lease", "1000".to_owned()),
                ("shared", "1".to_owned()),
            ],
        );
        dead.expect("acquired", ms(10_000)).await;
        let live_opts = LockOptions::new(ms(60_000))
            .with_lease(ms(6_000))
            .with_shared(true);
        let live = env.locker.acquire("books", &live_opts).await.unwrap();
        let writer = {
            let locker = env.second_locker().await;
            let o = LockOptions::new(ms(5_000)).with_wait(ms(15_000));
            tokio::spawn(async move {
                let lease = locker.acquire("books", &o).await;
                (Instant::now(), lease)
            })
        };
        eventually(ms(2_000), "the writer queues", || async {
            env.exists("lock:{books}:waiters").await
        })
        .await;
        dead.kill();
        let killed = Instant::now();
        tokio::time::sleep(ms(leaves_after_ms)).await;
        live.release().await.unwrap();
        let left = Instant::now();
        let (got_in, lease) = writer.await.unwrap();
        lease
            .expect("the writer gets the lock")
            .release()
            .await
            .unwrap();
        let after_crash = got_in - killed;
        let after_leave = got_in - left;
        println!(
            "leaves {leaves_after_ms} ms after the crash: writer in {after_crash:?} after it, {after_leave:?} after the leave"
        );
        assert!(
            after_crash <= ms(1_600),
            "the writer got in {after_crash:?} after the crash of a holder with a 1 s lease"
        );
        if leaves_after_ms > 1_000 {
            assert!(
                after_leave <= ms(300),
                "the writer got in {after_leave:?} after the last live holder left"
            );
        }
    }
}

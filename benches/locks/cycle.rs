//! One uncontended cycle (take a lock, give it back) of each kind that rows 1, 2 and 6 compare

use lock_runtime::{LockError, Locker, distributed_lock};
use redis::aio::MultiplexedConnection;
use rslock::LockManager;

use crate::raw::{RELEASE_LUA, load_script, raw_connection, raw_release, raw_take};
use crate::{CYCLE_OPTS, CYCLE_TTL, CYCLE_TTL_MS};

/// The attribute's cycle, with an empty body (no guard: no fence is computed).
#[distributed_lock(name = "{job}", ttl = "10s", locker = locker)]
async fn locked_noop(locker: &Locker, job: &str) -> Result<(), LockError> {
    Ok(())
}

/// The attribute's cycle with a guard whose fence the body reads.
#[distributed_lock(name = "{job}", ttl = "10s", locker = locker, guard = lease)]
async fn locked_fence(locker: &Locker, job: &str) -> Result<u64, LockError> {
    Ok(lease.fence())
}

/// Bytes of the future of one locked call through the attribute and through `Locker::acquire`
/// (not polled): every layer that awaits a future moves it, so its size is copied per call.
pub(crate) fn future_sizes(locker: &Locker) -> (usize, usize) {
    let attribute = std::mem::size_of_val(&locked_noop(locker, "size"));
    let acquire = std::mem::size_of_val(&locker.acquire("size", &CYCLE_OPTS));
    (attribute, acquire)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Cycle {
    /// SET NX PX, then EVALSHA compare-and-delete, on a MultiplexedConnection.
    Floor,
    /// The floor a fenced lock cannot beat: SET NX PX and INCR of a fence counter pipelined,
    /// then EVALSHA compare-and-delete.
    FencedFloor,
    /// The floor plus the server work that fencing and wake-ups add, on the same connection: one
    /// script that does SET NX PX and INCR of a fence counter, one that does compare-and-delete
    /// and PUBLISH.
    ScriptFloor,
    /// rslock 0.10: `LockManager::lock` + `unlock` on one name, on rslock's own connection.
    Rslock,
    /// `Locker::acquire` + `Lease::release`.
    Acquire,
    /// `Locker::run` with an empty body.
    Run,
    /// `#[distributed_lock]` with an empty body, without `guard`.
    Attr,
    /// `#[distributed_lock]` with `guard`, returning the fence.
    AttrFenced,
}

impl Cycle {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Cycle::Floor => "floor",
            Cycle::FencedFloor => "fenced floor",
            Cycle::ScriptFloor => "floor+fence+publish scripts",
            Cycle::Rslock => "rslock",
            Cycle::Acquire => "acquire+release",
            Cycle::Run => "run",
            Cycle::Attr => "attribute",
            Cycle::AttrFenced => "attribute with guard",
        }
    }
}

/// SET NX PX + INCR of the fence counter in one script (a fenced acquire, success path).
const FENCED_ACQUIRE_LUA: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
     return {1, redis.call('INCR', KEYS[2])} end return {0, redis.call('PTTL', KEYS[1])}";
/// Compare-and-delete + PUBLISH to wake waiters (a waking release).
const PUBLISHING_RELEASE_LUA: &str = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end \
     redis.call('DEL', KEYS[1]) redis.call('PUBLISH', ARGV[2], ARGV[1]) return 1";

/// Everything the cycles run on: one server (directly or through a proxy) and a client of each kind.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) locker: Locker,
    pub(crate) raw: MultiplexedConnection,
    rslock: LockManager,
    release_sha: String,
    fenced_acquire_sha: String,
    publishing_release_sha: String,
    /// The redis-server process, for its CPU time.
    pub(crate) server_pid: u32,
}

impl Target {
    /// Connects every kind of client to `url`; `server_pid` is the server behind it.
    pub(crate) async fn connect(url: &str, server_pid: u32) -> Target {
        let locker = Locker::connect(url).await.expect("locker connects");
        let mut raw = raw_connection(url).await;
        let release_sha = load_script(&mut raw, RELEASE_LUA).await;
        let fenced_acquire_sha = load_script(&mut raw, FENCED_ACQUIRE_LUA).await;
        let publishing_release_sha = load_script(&mut raw, PUBLISHING_RELEASE_LUA).await;
        Target {
            locker,
            raw,
            rslock: LockManager::new(vec![url.to_owned()]),
            release_sha,
            fenced_acquire_sha,
            publishing_release_sha,
            server_pid,
        }
    }
}

/// The lock name task `task` cycles on with `kind`.
pub(crate) fn cycle_name(kind: Cycle, task: usize) -> String {
    format!("bench:{kind:?}:{task}")
}

/// One cycle of `kind` on `name` (whose Redis key is `key`); `seq` makes the floors' tokens unique.
pub(crate) async fn one_cycle(
    t: &Target,
    raw: &mut MultiplexedConnection,
    kind: Cycle,
    name: &str,
    key: &str,
    seq: u64,
) {
    match kind {
        Cycle::Floor => {
            // A fresh token per cycle, as long as the engine's (22 characters).
            let token = format!("{seq:022x}");
            assert!(
                raw_take(raw, key, &token, CYCLE_TTL_MS).await,
                "floor: {key} was busy"
            );
            assert!(
                raw_release(raw, &t.release_sha, key, &token).await,
                "floor: {key} not ours"
            );
        }
        Cycle::FencedFloor => {
            let token = format!("{seq:022x}");
            let (taken, fence): (Option<String>, u64) = redis::pipe()
                .cmd("SET")
                .arg(key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(CYCLE_TTL_MS)
                .cmd("INCR")
                .arg(format!("{key}:fence"))
                .query_async(raw)
                .await
                .expect("SET NX PX + INCR");
            assert!(taken.is_some() && fence > 0, "fenced floor: {key} was busy");
            assert!(
                raw_release(raw, &t.release_sha, key, &token).await,
                "fenced floor: {key} not ours"
            );
        }
        Cycle::ScriptFloor => {
            let token = format!("{seq:022x}");
            let (taken, _fence): (i64, i64) = redis::cmd("EVALSHA")
                .arg(&t.fenced_acquire_sha)
                .arg(2)
                .arg(key)
                .arg(format!("{key}:fence"))
                .arg(&token)
                .arg(CYCLE_TTL_MS)
                .query_async(raw)
                .await
                .expect("EVALSHA fenced acquire");
            assert_eq!(taken, 1, "script floor: {key} was busy");
            let released: i64 = redis::cmd("EVALSHA")
                .arg(&t.publishing_release_sha)
                .arg(1)
                .arg(key)
                .arg(&token)
                .arg(format!("{key}:released"))
                .query_async(raw)
                .await
                .expect("EVALSHA publishing release");
            assert_eq!(released, 1, "script floor: {key} not ours");
        }
        Cycle::Rslock => {
            // rslock retries a busy name up to 3 times over ~600 ms, then fails: a leftover key
            // (a release that did not happen) would show as a panic here.
            let lock = t
                .rslock
                .lock(key, CYCLE_TTL)
                .await
                .unwrap_or_else(|e| panic!("rslock: {key}: {e}"));
            t.rslock.unlock(&lock).await;
        }
        Cycle::Acquire => {
            let lease = t.locker.acquire(name, &CYCLE_OPTS).await.expect("acquire");
            lease.release().await.expect("release");
        }
        Cycle::Run => t
            .locker
            .run(name, &CYCLE_OPTS, async |_| ())
            .await
            .expect("run"),
        Cycle::Attr => locked_noop(&t.locker, name).await.expect("attribute"),
        Cycle::AttrFenced => {
            let fence = locked_fence(&t.locker, name).await.expect("attribute");
            assert!(fence > 0, "attribute with guard: no fence");
        }
    }
}

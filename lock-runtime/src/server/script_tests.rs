//! One table per script, against a real redis-server: the keys before, the parameters of one
//! call, the reply, and every key after (value and expiry). Each row is one branch of a script
//! that replies differently or leaves the keys differently; every row runs on an empty database.
//! A row's parameters are made into the script's parameter type (`calls`), whose encoder writes
//! the call, and its reply is decoded by the script's reply type (`replies`) too.

use std::sync::LazyLock;
use std::time::Duration;

use lock_testing::{RedisCluster, RedisServer, key_slot};
use redis::aio::ConnectionLike;
use redis::{Arg, ErrorKind, FromRedisValue, Script, ServerErrorKind, Value};

use super::acquire::AcquireRequest;
use super::calls::{self, Call};
use super::replies::{Attempt, Forgot, Raised, Released, Renewal, ShortRelease};
use super::{FenceReply, Release, Waiter};
use crate::model::keys::{KeyFormat, Keys};

use super::scripts::{
    ACQUIRE, ACQUIRE_PERMIT, ACQUIRE_SHARED, ACQUIRE_UNQUEUED, FENCE, FORGET_PERMIT, RAISE_FENCE,
    RELEASE, RELEASE_SHARED, RELEASE_SHORT, RENEW, RENEW_ANY_SLOT,
};

/// What a key holds before the call, or is expected to hold after it.
#[derive(Debug, Clone)]
enum Data {
    /// A string; after the call, `*` at the end matches any rest.
    Str(&'static str),
    /// A sorted set: members with scores, a score given relative to the server's clock in ms
    /// (an expiry) when `Rel`.
    Zset(Vec<(Score, &'static str)>),
    Hash(Vec<(&'static str, &'static str)>),
    List,
    /// After the call: the key does not exist.
    Absent,
}

#[derive(Debug, Clone, Copy)]
enum Score {
    Abs(i64),
    /// The server's clock in ms plus this.
    Rel(i64),
}

/// A key's expiry after the call.
#[derive(Debug, Clone, Copy)]
enum Ttl {
    /// No expiry.
    None,
    /// About this many ms left (a tenth of it, at least 100 ms, either way).
    About(i64),
    /// Whatever it is.
    Any,
}

/// What a reply must be.
#[derive(Debug, Clone)]
enum Reply {
    Int(i64),
    /// A string; `*` at the end matches any rest.
    Str(&'static str),
    /// A number about this many ms (a remaining PTTL).
    AboutMs(i64),
    /// A fence from the server's clock: within 10 s of it, in µs.
    Fence,
    Arr(Vec<Reply>),
}

/// One call of a script and what it must leave.
struct Row {
    what: &'static str,
    script: &'static LazyLock<Script>,
    before: Vec<(&'static str, Data, Option<u64>)>,
    /// The keys the call must declare: the first is the lock's key (or a permit's).
    keys: Vec<&'static str>,
    /// The call's parameters, in the order of its callers' (see `command`); names and marks
    /// are the parameter type's to add.
    args: Vec<&'static str>,
    reply: Reply,
    after: Vec<(&'static str, Data, Ttl)>,
}

use Data::{Absent, Hash, List, Str, Zset};
use Reply::{AboutMs, Arr, Fence, Int};
use Score::{Abs, Rel};

fn s(text: &'static str) -> Reply {
    Reply::Str(text)
}

async fn now_ms(conn: &mut impl ConnectionLike) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * 1000 + micros / 1000
}

fn score_at(score: Score, now: i64) -> i64 {
    match score {
        Abs(n) => n,
        Rel(d) => now + d,
    }
}

async fn write(conn: &mut impl ConnectionLike, key: &str, data: &Data, px: Option<u64>) {
    let now = now_ms(conn).await;
    let mut cmd = match data {
        Str(v) => redis::cmd("SET").arg(key).arg(*v).clone(),
        Zset(members) => {
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(key);
            for (score, member) in members {
                cmd.arg(score_at(*score, now)).arg(*member);
            }
            cmd
        }
        Hash(fields) => {
            let mut cmd = redis::cmd("HSET");
            cmd.arg(key);
            for (f, v) in fields {
                cmd.arg(*f).arg(*v);
            }
            cmd
        }
        List => redis::cmd("RPUSH").arg(key).arg("x").clone(),
        Absent => return,
    };
    let _: Value = cmd.query_async(conn).await.unwrap();
    if let Some(px) = px {
        cmd = redis::cmd("PEXPIRE").arg(key).arg(px).clone();
        let _: Value = cmd.query_async(conn).await.unwrap();
    }
}

fn matches_text(pattern: &str, text: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => text.starts_with(prefix),
        None => text == pattern,
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn check_reply(what: &str, want: &Reply, got: &Value, now_us: i64) {
    let ok = match (want, got) {
        (Int(n), Value::Int(m)) => n == m,
        (Reply::Str(p), v) => text(v).is_some_and(|t| matches_text(p, &t)),
        (AboutMs(ms), Value::Int(m)) => (m - ms).abs() <= (ms / 10).max(100),
        (Fence, Value::Int(f)) => (f - now_us).abs() < 10_000_000,
        (Arr(items), Value::Array(got)) if items.len() == got.len() => {
            for (w, g) in items.iter().zip(got) {
                check_reply(what, w, g, now_us);
            }
            true
        }
        _ => false,
    };
    assert!(ok, "{what}: the reply is {got:?}, not {want:?}");
}

async fn check_key(what: &str, conn: &mut impl ConnectionLike, key: &str, want: &Data, ttl: Ttl) {
    let now = now_ms(conn).await;
    let kind: String = redis::cmd("TYPE").arg(key).query_async(conn).await.unwrap();
    let ok = match want {
        Absent => kind == "none",
        Str(p) => {
            let v: Option<String> = redis::cmd("GET")
                .arg(key)
                .query_async(conn)
                .await
                .ok()
                .flatten();
            v.is_some_and(|v| matches_text(p, &v))
        }
        List => kind == "list",
        Hash(fields) => {
            let got: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(key)
                .query_async(conn)
                .await
                .unwrap();
            got.len() == fields.len()
                && fields
                    .iter()
                    .all(|(f, v)| got.iter().any(|(g, w)| g == f && matches_text(v, w)))
        }
        Zset(members) => {
            let got: Vec<(String, f64)> = redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query_async(conn)
                .await
                .unwrap();
            got.len() == members.len()
                && members.iter().all(|(score, m)| {
                    got.iter().any(|(g, sc)| {
                        let want = score_at(*score, now) as f64;
                        let near = match score {
                            Abs(_) => *sc == want,
                            Rel(d) => (sc - want).abs() <= (d.abs() / 10).max(200) as f64,
                        };
                        matches_text(m, g) && near
                    })
                })
        }
    };
    assert!(ok, "{what}: `{key}` (a {kind}) is not {want:?}");
    let pttl: i64 = redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap();
    let ttl_ok = match (ttl, want) {
        (_, Absent) | (Ttl::Any, _) => true,
        (Ttl::None, _) => pttl == -1,
        (Ttl::About(ms), _) => pttl >= 0 && (pttl - ms).abs() <= (ms / 10).max(100),
    };
    assert!(ttl_ok, "{what}: `{key}` has PTTL {pttl}, not {ttl:?}");
}

/// The call of `row`, made by its script's parameter type from the row's parameters.
fn command(row: &Row) -> redis::Cmd {
    let is = |script: &'static LazyLock<Script>| std::ptr::eq(row.script, script);
    let a = |i: usize| row.args.get(i).copied().unwrap_or("");
    let n = |i: usize| a(i).parse::<u64>().unwrap_or(0);
    let lock = Keys::new(LOCK.to_owned(), KeyFormat::HashTagged);
    let permits: Vec<Keys> = (0..2).map(|i| lock.permit(i, 2)).collect();
    // A waiter's id, grace, stale head and its state, and previous token, from `at` on.
    let waiter = |at: usize, previous: bool| {
        (!a(at).is_empty()).then(|| Waiter {
            id: a(at).to_owned(),
            grace: Duration::from_millis(n(at + 1)),
            previous: if previous { a(at + 4) } else { "" }.to_owned(),
        })
    };
    let evict = |at: usize| (!a(at + 2).is_empty()).then(|| (a(at + 2), a(at + 3)));
    let request = |waiter: Option<&'static Waiter>, at: usize, queue| AcquireRequest {
        token: a(0),
        ttl_ms: n(1),
        waiter,
        evict: evict(at),
        fence_quantum: n(2),
        fence_retention_ms: n(3),
        limit: Duration::from_secs(5),
        queue,
    };
    // Leaked: a test's few rows; the requests borrow them.
    let leak = |w: Option<Waiter>| w.map(|w| &*Box::leak(Box::new(w)));
    if is(&ACQUIRE) || is(&ACQUIRE_UNQUEUED) {
        let req = request(leak(waiter(4, true)), 4, is(&ACQUIRE));
        return match is(&ACQUIRE) {
            true => calls::Acquire {
                keys: &lock,
                req: &req,
            }
            .command(),
            false => calls::AcquireUnqueued {
                keys: &lock,
                req: &req,
            }
            .command(),
        };
    }
    if is(&ACQUIRE_SHARED) {
        let req = request(leak(waiter(5, false)), 5, true);
        let publish = a(4);
        return calls::AcquireShared {
            keys: &lock,
            req: &req,
            publish,
        }
        .command();
    }
    if is(&ACQUIRE_PERMIT) {
        let req = request(leak(waiter(5, true)), 5, true);
        let permits = &permits[..n(4) as usize];
        return calls::AcquirePermit {
            keys: &lock,
            permits,
            req: &req,
        }
        .command();
    }
    if is(&FORGET_PERMIT) {
        let (token, publish) = (a(0), a(2));
        let permits = &permits[..row.keys.len() - 1];
        return calls::ForgetPermit {
            keys: &lock,
            permits,
            token,
            publish,
        }
        .command();
    }
    if is(&RELEASE) || is(&RELEASE_SHARED) {
        release_command(row, &lock, &permits)
    } else {
        other_command(row, &lock)
    }
}

/// The call of a `RELEASE_SHORT` row: token, retention, fence to record (see `command`).
fn short_release_command(row: &Row, lock: &Keys) -> redis::Cmd {
    let n = |i: usize| row.args[i].parse::<u64>().unwrap();
    let how = Release {
        keep_ms: 0,
        always_publish: false,
        record_fence: n(2),
        fence_retention_ms: n(1),
        look_at_queue: false,
        short_first: true,
    };
    calls::ReleaseShort {
        keys: lock,
        token: row.args[0],
        how: &how,
    }
    .command()
}

/// The call of a `RELEASE` or `RELEASE_SHARED` row (see `command`).
fn release_command(row: &Row, lock: &Keys, permits: &[Keys]) -> redis::Cmd {
    let a = |i: usize| row.args.get(i).copied().unwrap_or("");
    let n = |i: usize, default: u64| a(i).parse::<u64>().unwrap_or(default);
    let default = super::scripts::DEFAULT_RETENTION_MS;
    if std::ptr::eq(row.script, &RELEASE_SHARED) {
        let how = Release {
            keep_ms: n(4, 0),
            always_publish: false,
            record_fence: 0,
            fence_retention_ms: n(2, default),
            look_at_queue: false,
            short_first: false,
        };
        let (value, place, publish) = (a(0), a(1), a(3));
        let call = calls::ReleaseShared {
            keys: lock,
            value,
            place,
            how: &how,
            publish,
        };
        return call.command();
    }
    // The whole way from the fifth parameter on (keep, publish always), as the callers did.
    let how = Release {
        keep_ms: n(4, 0),
        always_publish: a(5) == "1",
        record_fence: n(2, 0),
        fence_retention_ms: n(1, default),
        look_at_queue: row.args.len() >= 5,
        short_first: false,
    };
    let keys = if row.keys[0] == P0 { &permits[0] } else { lock };
    let publish = if a(3).is_empty() { "PUBLISH" } else { a(3) };
    calls::Release {
        keys,
        token: a(0),
        how: &how,
        publish,
    }
    .command()
}

/// The call of a renewal, fence or short release row (see `command`).
fn other_command(row: &Row, lock: &Keys) -> redis::Cmd {
    let a = |i: usize| row.args.get(i).copied().unwrap_or("");
    let n = |i: usize| a(i).parse::<u64>().unwrap_or(0);
    let is = |script: &'static LazyLock<Script>| std::ptr::eq(row.script, script);
    if is(&RELEASE_SHORT) {
        return short_release_command(row, lock);
    }
    if is(&RENEW) {
        let items: Vec<(&str, &str, u64)> = (row.keys.iter().enumerate())
            .map(|(i, key)| (*key, a(2 * i), n(2 * i + 1)))
            .collect();
        return calls::Renew { items: &items }.command();
    }
    if is(&RENEW_ANY_SLOT) {
        let items: Vec<(&str, &str, u64)> = (0..row.args.len() / 3)
            .map(|i| (a(3 * i), a(3 * i + 1), n(3 * i + 2)))
            .collect();
        return calls::RenewAnySlot { items: &items }.command();
    }
    if is(&FENCE) {
        return calls::Fence {
            keys: lock,
            token: a(0),
            retention_ms: n(1),
        }
        .command();
    }
    assert!(is(&RAISE_FENCE), "{}: a script without a call", row.what);
    calls::RaiseFence {
        keys: lock,
        fence: n(0),
        retention_ms: n(1),
    }
    .command()
}

/// Whether the reply type of `row`'s script decodes `reply`.
fn decodes(row: &Row, reply: &Value) -> bool {
    let is = |script: &'static LazyLock<Script>| std::ptr::eq(row.script, script);
    let v = reply.clone();
    if is(&RELEASE) || is(&RELEASE_SHARED) {
        Released::from_redis_value(v).is_ok()
    } else if is(&RELEASE_SHORT) {
        ShortRelease::from_redis_value(v).is_ok()
    } else if is(&RENEW) || is(&RENEW_ANY_SLOT) {
        Vec::<Renewal>::from_redis_value(v).is_ok()
    } else if is(&FORGET_PERMIT) {
        Forgot::from_redis_value(v).is_ok()
    } else if is(&FENCE) {
        FenceReply::from_redis_value(v).is_ok()
    } else if is(&RAISE_FENCE) {
        Raised::from_redis_value(v).is_ok()
    } else {
        Attempt::from_redis_value(v).is_ok()
    }
}

/// Sends `cmd`, loading `script` first if the server does not have it.
async fn call(conn: &mut impl ConnectionLike, script: &Script, cmd: &redis::Cmd) -> Value {
    match cmd.query_async::<Value>(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(conn).await.unwrap();
            cmd.query_async(conn).await.unwrap()
        }
        other => other.unwrap(),
    }
}

async fn run(rows: Vec<Row>) {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    run_on(&mut conn, rows, "PUBLISH").await;
}

/// Runs `rows` on the server of `conn`, each on an empty database, with `publish` as the
/// publish command of the rows that give one.
async fn run_on(conn: &mut impl ConnectionLike, rows: Vec<Row>, publish: &'static str) {
    for mut row in rows {
        for arg in &mut row.args {
            if *arg == "PUBLISH" {
                *arg = publish;
            }
        }
        let _: () = redis::cmd("FLUSHALL").query_async(conn).await.unwrap();
        for (key, data, px) in &row.before {
            write(conn, key, data, *px).await;
        }
        let now_us = now_ms(conn).await * 1000;
        let cmd = command(&row);
        let declared: Vec<&[u8]> = (cmd.args_iter().skip(3))
            .filter_map(|arg| match arg {
                Arg::Simple(bytes) => Some(bytes),
                _ => None,
            })
            .collect();
        for key in &row.keys {
            let what = row.what;
            assert!(
                declared.contains(&key.as_bytes()),
                "{what}: `{key}` not sent"
            );
        }
        let reply = call(conn, row.script, &cmd).await;
        check_reply(row.what, &row.reply, &reply, now_us);
        assert!(decodes(&row, &reply), "{}: {reply:?} not decoded", row.what);
        for (key, data, ttl) in &row.after {
            check_key(row.what, conn, key, data, *ttl).await;
        }
    }
}

/// Every row of every table again, on the primary of a real local Redis Cluster that serves
/// the lock's slot, with sharded pub/sub (`SPUBLISH`) as on Cluster: every key of a row shares
/// the lock's hash tag, so each script runs there as a Cluster client sends it. One Cluster for
/// all the rows: it takes about 2 s to start.
#[tokio::test]
async fn every_row_on_a_cluster_primary() {
    let rows = every_row();
    let slot = key_slot(LOCK.as_bytes());
    for row in &rows {
        let keys = row.keys.iter().chain(row.before.iter().map(|b| &b.0));
        for key in keys.chain(row.after.iter().map(|a| &a.0)) {
            assert_eq!(key_slot(key.as_bytes()), slot, "{}: `{key}`", row.what);
        }
    }
    let cluster = RedisCluster::start();
    let primary = cluster.primary_for_key(LOCK);
    let client = redis::Client::open(primary.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    run_on(&mut conn, rows, "SPUBLISH").await;
}

/// Every row of every table again, on the server in this process (`Locker::in_memory`): each
/// script's Rust twin replies and leaves the keys as the script does on Redis.
#[tokio::test]
async fn every_row_on_the_in_process_server() {
    use crate::transport::in_process::InProcess;
    let server = std::sync::Arc::new(InProcess::new(super::in_process::twins()));
    let link = crate::transport::link::Link::new_in_process(server);
    let mut conn = link.conn().await.unwrap();
    run_on(&mut conn, every_row(), "PUBLISH").await;
}

/// The rows of every table.
fn every_row() -> Vec<Row> {
    let tables: [fn() -> Vec<Row>; 10] = [
        acquire_table_rows,
        acquire_unqueued_table_rows,
        renew_table_rows,
        release_table_rows,
        release_short_table_rows,
        acquire_permit_table_rows,
        forget_permit_table_rows,
        acquire_shared_table_rows,
        release_shared_table_rows,
        fence_tables_rows,
    ];
    tables.into_iter().flat_map(|table| table()).collect()
}

const LOCK: &str = "lock:{a}";
const FENCE_KEY: &str = "lock:{a}:fence";
const QUEUE: &str = "lock:{a}:waiters";
const STATES: &str = "lock:{a}:waiters:state";
const READERS: &str = "lock:{a}:readers";
const P0: &str = "lock:{a}:permit:0";
const P1: &str = "lock:{a}:permit:1";

/// ACQUIRE's keys, and its first four arguments for `t1;w=0` with a ttl of 2 s.
fn acquire(what: &'static str) -> Row {
    Row {
        what,
        script: &ACQUIRE,
        before: vec![],
        keys: vec![LOCK, FENCE_KEY, QUEUE, STATES],
        args: vec!["t1;w=0", "2000", "1", "60000"],
        reply: Arr(vec![Int(1), Fence]),
        after: vec![],
    }
}

/// The keys a row writes before its call, with their expiries.
type Before = Vec<(&'static str, Data, Option<u64>)>;
/// The keys a row checks after its call, with their expiries.
type After = Vec<(&'static str, Data, Ttl)>;

/// ACQUIRE by waiter `w1` (grace 3 s), whose previous attempt's token is `previous`.
fn waiter_row(what: &'static str, previous: &'static str) -> Row {
    Row {
        args: vec![
            "t1;w=0", "2000", "1", "60000", "w1", "3000", "", "", previous,
        ],
        ..acquire(what)
    }
}

/// RENEW of the lock's key for 2 s, under `token`, that renews it (1) or not (0).
fn renew_row(
    what: &'static str,
    before: Before,
    token: &'static str,
    reply: i64,
    after: After,
) -> Row {
    Row {
        what,
        script: &RENEW,
        before,
        keys: vec![LOCK],
        args: vec![token, "2000"],
        reply: Arr(vec![Int(reply)]),
        after,
    }
}

/// RENEW of the place `r1 7` in the shared holders' set, scored `score` before.
fn member_row(what: &'static str, score: Score, reply: i64, after: Data) -> Row {
    Row {
        keys: vec![READERS],
        args: vec!["r1 7", "2000"],
        ..renew_row(
            what,
            vec![(READERS, Zset(vec![(score, "r1 7")]), Some(500))],
            "",
            reply,
            vec![(READERS, after, Ttl::Any)],
        )
    }
}

/// RELEASE of the lock's key with its queue and counter declared.
fn release_row(
    what: &'static str,
    before: Before,
    args: Vec<&'static str>,
    reply: Reply,
    after: After,
) -> Row {
    Row {
        what,
        script: &RELEASE,
        before,
        keys: vec![LOCK, QUEUE, FENCE_KEY],
        args,
        reply,
        after,
    }
}

/// RELEASE's arguments that go the whole way (look at the queue, publish).
const WHOLE: [&str; 5] = ["t;w=0", "60000", "0", "PUBLISH", "0"];

/// RELEASE of permit 0 of 2 while the lock's key holds `mark` (`other`: what permit 1 holds);
/// the reply, and what the lock's key holds after.
fn permit_release_row(
    what: &'static str,
    (mark, other): (Option<&'static str>, Option<&'static str>),
    reply: i64,
    mark_after: Data,
) -> Row {
    let mut before = vec![(P0, Str("t;w=0"), Some(5000))];
    before.extend(mark.map(|v| (LOCK, Str(v), Some(5000))));
    before.extend(other.map(|v| (P1, Str(v), Some(5000))));
    Row {
        keys: vec![P0, QUEUE, FENCE_KEY, LOCK, P0, P1],
        ..release_row(
            what,
            before,
            vec!["t;w=0", "60000"],
            Int(reply),
            vec![(P0, Absent, Ttl::Any), (LOCK, mark_after, Ttl::Any)],
        )
    }
}

/// ACQUIRE_PERMIT of one of 2 permits for `t1;w=0`, ttl 2 s.
fn permit_row(what: &'static str, before: Before, reply: Reply, after: After) -> Row {
    Row {
        what,
        script: &ACQUIRE_PERMIT,
        before,
        keys: vec![LOCK, FENCE_KEY, QUEUE, STATES, P0, P1],
        args: vec!["t1;w=0", "2000", "1", "60000", "2"],
        reply,
        after,
    }
}

/// ACQUIRE_SHARED for `r1;w=0`, lease 2 s.
fn shared_row(what: &'static str, before: Before, reply: Reply, after: After) -> Row {
    Row {
        what,
        script: &ACQUIRE_SHARED,
        before,
        keys: vec![LOCK, FENCE_KEY, QUEUE, STATES, READERS],
        args: vec!["r1;w=0", "2000", "1", "60000", "PUBLISH"],
        reply,
        after,
    }
}

/// RELEASE_SHARED of the holder at `place` in the shared hold `shared:r1;w=0`.
fn release_shared_row(
    what: &'static str,
    before: Before,
    place: &'static str,
    reply: Reply,
    after: After,
) -> Row {
    Row {
        what,
        script: &RELEASE_SHARED,
        before,
        keys: vec![LOCK, READERS, QUEUE, FENCE_KEY],
        args: vec!["shared:r1;w=0", place, "60000", "PUBLISH", "0"],
        reply,
        after,
    }
}

/// A shared hold of `shared:r1;w=0` for 5 s with these places.
fn shared_held(members: Vec<(Score, &'static str)>) -> Before {
    vec![
        (LOCK, Str("shared:r1;w=0"), Some(5000)),
        (READERS, Zset(members), Some(5000)),
    ]
}

#[tokio::test]
async fn acquire_table() {
    run(acquire_table_rows()).await;
}

/// The rows of `acquire_table`.
fn acquire_table_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    rows.extend(acquire_table_rows_0());
    rows.extend(acquire_table_rows_1());
    rows.extend(acquire_table_rows_2());
    rows.extend(acquire_table_foreign_rows());
    rows
}

/// Rows of `acquire_table`, part 1 of 3.
fn acquire_table_rows_0() -> Vec<Row> {
    vec![
        Row {
            after: vec![
                (LOCK, Str("t1;w=0"), Ttl::About(2000)),
                (FENCE_KEY, Str("1*"), Ttl::About(60000)),
            ],
            ..acquire("free: taken, with a fence")
        },
        Row {
            before: vec![(LOCK, Str("o;w=0"), Some(5000))],
            reply: Arr(vec![Int(0), AboutMs(5000)]),
            after: vec![
                (LOCK, Str("o;w=0"), Ttl::About(5000)),
                (FENCE_KEY, Absent, Ttl::Any),
            ],
            ..acquire("held: busy, with its PTTL")
        },
        Row {
            before: vec![(LOCK, List, None)],
            reply: Arr(vec![Int(-1), s("list")]),
            after: vec![(LOCK, List, Ttl::None)],
            ..acquire("the key holds another type")
        },
        Row {
            before: vec![(FENCE_KEY, Str("abc"), None)],
            reply: Arr(vec![Int(-2), s("holds abc, not an integer counter")]),
            after: vec![(LOCK, Absent, Ttl::Any), (FENCE_KEY, Str("abc"), Ttl::None)],
            ..acquire("the counter is not a counter")
        },
        Row {
            before: vec![(LOCK, Str("permits:3"), Some(5000))],
            reply: Arr(vec![Int(-3), s("permits:3")]),
            after: vec![(LOCK, Str("permits:3"), Ttl::About(5000))],
            ..acquire("permits hold the name: another mode")
        },
        Row {
            before: vec![(QUEUE, Str("x"), None)],
            reply: Arr(vec![Int(-1), s("string"), s(QUEUE)]),
            after: vec![(LOCK, Absent, Ttl::Any), (QUEUE, Str("x"), Ttl::None)],
            ..acquire("the queue's name holds another type: nothing written")
        },
        Row {
            before: vec![(LOCK, Str("o;w=0"), Some(5000))],
            reply: Arr(vec![Int(0), AboutMs(5000)]),
            after: vec![
                (LOCK, Str("o;w=1"), Ttl::About(5000)),
                (QUEUE, Zset(vec![(Abs(1), "w1")]), Ttl::About(12000)),
                (
                    STATES,
                    Hash(vec![("w1", "t1;w=0 2000 3000")]),
                    Ttl::About(12000),
                ),
            ],
            ..waiter_row("a waiter queues and marks the holder's value", "")
        },
    ]
}

/// Rows of `acquire_table`, part 2 of 3.
fn acquire_table_rows_1() -> Vec<Row> {
    vec![
        Row {
            before: vec![
                (QUEUE, Zset(vec![(Abs(1), "w0")]), None),
                (STATES, Hash(vec![("w0", "n0 2000 3000")]), None),
            ],
            reply: Arr(vec![Int(2), s("w0"), s("n0 2000 3000")]),
            after: vec![(LOCK, Absent, Ttl::Any)],
            ..acquire("free, but another waiter is first: not our turn")
        },
        Row {
            before: vec![
                (LOCK, Str("~w1"), Some(3000)),
                (QUEUE, Zset(vec![(Abs(1), "w1")]), None),
                (STATES, Hash(vec![("w1", "n 1 3000")]), None),
            ],
            after: vec![
                (LOCK, Str("t1;w=0"), Ttl::About(2000)),
                (QUEUE, Absent, Ttl::Any),
                (STATES, Absent, Ttl::Any),
            ],
            ..waiter_row("handed to this waiter by id: taken, out of the queue", "")
        },
        Row {
            before: vec![
                (LOCK, Str("p1;w=0"), Some(3000)),
                (QUEUE, Zset(vec![(Abs(1), "w1"), (Abs(2), "w2")]), None),
                (
                    STATES,
                    Hash(vec![("w1", "p1;w=0 2000 3000"), ("w2", "n2 2000 3000")]),
                    None,
                ),
            ],
            after: vec![
                (LOCK, Str("t1;w=1"), Ttl::About(2000)),
                (QUEUE, Zset(vec![(Abs(2), "w2")]), Ttl::Any),
            ],
            ..waiter_row(
                "granted to the previous attempt: taken, marked for the next",
                "p1;w=0",
            )
        },
        Row {
            before: vec![
                (LOCK, Str("~w0"), Some(3000)),
                (QUEUE, Zset(vec![(Abs(1), "w0")]), None),
                (STATES, Hash(vec![("w0", "n0 3000")]), None),
            ],
            reply: Arr(vec![Int(2), s("w0"), s("n0 3000")]),
            after: vec![(LOCK, Str("~w0"), Ttl::About(3000))],
            ..acquire("handed to another waiter: its turn")
        },
    ]
}

/// Rows of `acquire_table`, part 3 of 3.
fn acquire_table_rows_2() -> Vec<Row> {
    vec![
        Row {
            before: vec![
                (LOCK, Str("~w0"), Some(3000)),
                (QUEUE, Zset(vec![(Abs(1), "w0")]), None),
                (STATES, Hash(vec![("w0", "n0 2000 3000")]), None),
            ],
            args: vec![
                "t1;w=0",
                "2000",
                "1",
                "60000",
                "w1",
                "3000",
                "w0",
                "n0 2000 3000",
                "",
            ],
            after: vec![
                (LOCK, Str("t1;w=0"), Ttl::About(2000)),
                (QUEUE, Absent, Ttl::Any),
                (STATES, Absent, Ttl::Any),
            ],
            ..acquire("a stale head is evicted with the key handed to it: taken")
        },
        Row {
            before: vec![
                (QUEUE, Zset(vec![(Abs(1), "w0"), (Abs(2), "w2")]), None),
                (STATES, Hash(vec![("w2", "n2 2000 3000")]), None),
            ],
            reply: Arr(vec![Int(2), s("w2"), s("n2 2000 3000")]),
            after: vec![
                (LOCK, Absent, Ttl::Any),
                (QUEUE, Zset(vec![(Abs(2), "w2")]), Ttl::Any),
            ],
            ..acquire("free: heads without a state leave, the first live one's turn")
        },
        Row {
            before: vec![
                (LOCK, Str("o;w=1"), Some(5000)),
                (QUEUE, Zset(vec![(Abs(1), "w0")]), None),
                (STATES, Hash(vec![("w2", "n2 2000 3000")]), None),
            ],
            reply: Arr(vec![Int(0), AboutMs(5000)]),
            after: vec![
                (LOCK, Str("o;w=1"), Ttl::About(5000)),
                (QUEUE, Zset(vec![(Abs(1), "w0"), (Abs(2), "w1")]), Ttl::Any),
            ],
            ..waiter_row("behind a holder: queued last, the head not looked at", "")
        },
    ]
}

/// Rows of `acquire_table`: another client's keys at the queue's names. The attempt reads their
/// types only when one of its commands meets one, and then writes nothing.
fn acquire_table_foreign_rows() -> Vec<Row> {
    vec![
        Row {
            before: vec![(STATES, Str("x"), None)],
            after: vec![
                (LOCK, Str("t1;w=0"), Ttl::About(2000)),
                (STATES, Str("x"), Ttl::None),
            ],
            ..acquire("the states' name holds another type, nobody queues: taken, untouched")
        },
        Row {
            before: vec![(LOCK, Str("o;w=0"), Some(5000)), (STATES, Str("x"), None)],
            reply: Arr(vec![Int(-1), s("string"), s(STATES)]),
            after: vec![
                (LOCK, Str("o;w=0"), Ttl::About(5000)),
                (QUEUE, Absent, Ttl::Any),
                (STATES, Str("x"), Ttl::None),
            ],
            ..waiter_row(
                "a waiter meets the states' name of another type: nothing written",
                "",
            )
        },
        Row {
            before: vec![(LOCK, Str("o;w=0"), Some(5000)), (QUEUE, Str("x"), None)],
            reply: Arr(vec![Int(-1), s("string"), s(QUEUE)]),
            after: vec![
                (LOCK, Str("o;w=0"), Ttl::About(5000)),
                (QUEUE, Str("x"), Ttl::None),
                (STATES, Absent, Ttl::Any),
            ],
            ..waiter_row(
                "a waiter meets the queue's name of another type: nothing written",
                "",
            )
        },
        Row {
            before: vec![(LOCK, Str("o;w=0"), Some(5000)), (QUEUE, Str("x"), None)],
            args: vec![
                "t1;w=0", "2000", "1", "60000", "w1", "3000", "", "", "t0;w=0",
            ],
            reply: Arr(vec![Int(-1), s("string"), s(QUEUE)]),
            after: vec![
                (LOCK, Str("o;w=0"), Ttl::About(5000)),
                (QUEUE, Str("x"), Ttl::None),
                (STATES, Absent, Ttl::Any),
            ],
            ..acquire("a returning waiter meets the queue's name of another type: nothing written")
        },
    ]
}

#[tokio::test]
async fn acquire_unqueued_table() {
    run(acquire_unqueued_table_rows()).await;
}

/// The rows of `acquire_unqueued_table`.
fn acquire_unqueued_table_rows() -> Vec<Row> {
    let row = |what| Row {
        script: &ACQUIRE_UNQUEUED,
        keys: vec![LOCK, FENCE_KEY],
        ..acquire(what)
    };
    vec![
        Row {
            after: vec![
                (LOCK, Str("t1;w=0"), Ttl::About(2000)),
                (FENCE_KEY, Str("1*"), Ttl::About(60000)),
            ],
            ..row("free: taken")
        },
        Row {
            before: vec![(LOCK, Str("o;w=0"), Some(5000))],
            reply: Arr(vec![Int(0), AboutMs(5000)]),
            after: vec![(LOCK, Str("o;w=0"), Ttl::About(5000))],
            ..row("held: busy")
        },
        Row {
            before: vec![(LOCK, List, None)],
            reply: Arr(vec![Int(-1), s("list")]),
            ..row("the key holds another type")
        },
        Row {
            before: vec![(LOCK, Str("permits:2"), None)],
            reply: Arr(vec![Int(-3), s("permits:2")]),
            ..row("permits hold the name")
        },
        Row {
            before: vec![(FENCE_KEY, Str("1.5"), None)],
            reply: Arr(vec![Int(-2), s("holds 1.5, not an integer counter")]),
            after: vec![(LOCK, Absent, Ttl::Any)],
            ..row("the counter is not a counter: the key just taken is deleted again")
        },
    ]
}

#[tokio::test]
async fn renew_table() {
    run(renew_table_rows()).await;
}

/// The rows of `renew_table`.
fn renew_table_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    rows.extend(renew_table_rows_0());
    rows.extend(renew_table_rows_1());
    rows.extend(renew_table_rows_2());
    rows
}

/// Rows of `renew_table`, part 1 of 3.
fn renew_table_rows_0() -> Vec<Row> {
    vec![
        renew_row(
            "ours: extended to the ttl",
            vec![(LOCK, Str("t;w=0"), Some(500))],
            "t;w=0",
            1,
            vec![(LOCK, Str("t;w=0"), Ttl::About(2000))],
        ),
        renew_row(
            "not ours: untouched",
            vec![(LOCK, Str("o;w=0"), Some(500))],
            "t;w=0",
            0,
            vec![(LOCK, Str("o;w=0"), Ttl::About(500))],
        ),
        renew_row(
            "ours with the waiters' mark",
            vec![(LOCK, Str("t;w=1"), Some(500))],
            "t;w=0",
            1,
            vec![(LOCK, Str("t;w=1"), Ttl::About(2000))],
        ),
        renew_row("no key", vec![], "t;w=0", 0, vec![(LOCK, Absent, Ttl::Any)]),
        renew_row(
            "a shared key is never shortened",
            vec![(LOCK, Str("shared:s;w=0"), Some(5000))],
            "shared:s;w=0",
            1,
            vec![(LOCK, Str("shared:s;w=0"), Ttl::About(5000))],
        ),
        renew_row(
            "a shared key is extended",
            vec![(LOCK, Str("shared:s;w=0"), Some(500))],
            "shared:s;w=0",
            1,
            vec![(LOCK, Str("shared:s;w=0"), Ttl::About(2000))],
        ),
        renew_row(
            "the mark of permits is never shortened",
            vec![(LOCK, Str("permits:3"), Some(5000))],
            "permits:3",
            1,
            vec![(LOCK, Str("permits:3"), Ttl::About(5000))],
        ),
    ]
}

/// Rows of `renew_table`, part 2 of 3.
fn renew_table_rows_1() -> Vec<Row> {
    vec![
        member_row(
            "a live shared holder's place moves to its new expiry",
            Rel(500),
            1,
            Zset(vec![(Rel(2000), "r1 7")]),
        ),
        member_row(
            "a shared holder whose lease ran out is not renewed",
            Rel(-50),
            0,
            Zset(vec![(Rel(-50), "r1 7")]),
        ),
        Row {
            args: vec!["r2 8", "2000"],
            ..member_row(
                "not among the shared holders",
                Rel(500),
                0,
                Zset(vec![(Rel(500), "r1 7")]),
            )
        },
        Row {
            what: "two keys in one call, each decided",
            script: &RENEW,
            before: vec![
                (LOCK, Str("t;w=0"), Some(500)),
                (READERS, Zset(vec![(Rel(500), "r1 7")]), None),
            ],
            keys: vec![LOCK, READERS],
            args: vec!["t;w=0", "2000", "r9 9", "2000"],
            reply: Arr(vec![Int(1), Int(0)]),
            after: vec![(LOCK, Str("t;w=0"), Ttl::About(2000))],
        },
    ]
}

/// Rows of `renew_table`, part 3 of 3.
fn renew_table_rows_2() -> Vec<Row> {
    vec![Row {
        what: "the cluster form: keys in the arguments",
        script: &RENEW_ANY_SLOT,
        before: vec![
            (LOCK, Str("t;w=0"), Some(500)),
            (READERS, Zset(vec![(Rel(500), "r1 7")]), None),
        ],
        keys: vec![],
        args: vec![
            LOCK, "t;w=0", "2000", READERS, "r1 7", "2000", P0, "x", "2000",
        ],
        reply: Arr(vec![Int(1), Int(1), Int(0)]),
        after: vec![
            (LOCK, Str("t;w=0"), Ttl::About(2000)),
            (READERS, Zset(vec![(Rel(2000), "r1 7")]), Ttl::About(2000)),
        ],
    }]
}

#[tokio::test]
async fn release_table() {
    run(release_table_rows()).await;
}

/// The rows of `release_table`.
fn release_table_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    rows.extend(release_table_rows_0());
    rows.extend(release_table_rows_1());
    rows.extend(release_table_rows_2());
    rows.extend(release_table_rows_3());
    rows
}

/// Rows of `release_table`, part 1 of 4.
fn release_table_rows_0() -> Vec<Row> {
    vec![
        release_row(
            "ours: deleted",
            vec![(LOCK, Str("t;w=0"), Some(5000))],
            vec!["t;w=0"],
            Int(1),
            vec![(LOCK, Absent, Ttl::Any)],
        ),
        release_row(
            "not ours: untouched",
            vec![(LOCK, Str("o;w=0"), Some(5000))],
            vec!["t;w=0"],
            Int(0),
            vec![(LOCK, Str("o;w=0"), Ttl::About(5000))],
        ),
        release_row(
            "a fence to record: the counter is raised, kept for the retention",
            vec![(LOCK, Str("t;w=0"), Some(5000))],
            vec!["t;w=0", "60000", "100"],
            Int(1),
            vec![
                (LOCK, Absent, Ttl::Any),
                (FENCE_KEY, Str("100"), Ttl::About(60000)),
            ],
        ),
        release_row(
            "a fence below the counter: the counter stays",
            vec![
                (LOCK, Str("t;w=0"), Some(5000)),
                (FENCE_KEY, Str("200"), Some(9000)),
            ],
            vec!["t;w=0", "60000", "100"],
            Int(1),
            vec![(FENCE_KEY, Str("200"), Ttl::About(9000))],
        ),
    ]
}

/// Rows of `release_table`, part 2 of 4.
fn release_table_rows_1() -> Vec<Row> {
    vec![
        release_row(
            "kept for min_hold under a value no lease renews",
            vec![(LOCK, Str("t;w=0"), Some(5000))],
            vec!["t;w=0", "60000", "0", "PUBLISH", "3000"],
            Int(1),
            vec![(LOCK, Str("t;w=0:released"), Ttl::About(3000))],
        ),
        release_row(
            "a waiter queued: granted to its last attempt for its grace",
            vec![
                (LOCK, Str("t;w=1"), Some(5000)),
                (QUEUE, Zset(vec![(Abs(1), "w1")]), None),
                (STATES, Hash(vec![("w1", "n1;w=0 2000 3000")]), None),
            ],
            WHOLE.to_vec(),
            s("~w1 n1;w=0 1*"),
            vec![
                (LOCK, Str("n1;w=0"), Ttl::About(3000)),
                (QUEUE, Absent, Ttl::Any),
                (STATES, Absent, Ttl::Any),
                (FENCE_KEY, Str("1*"), Ttl::About(60000)),
            ],
        ),
        release_row(
            "a waiter without a ttl (shared, permits): handed over by id",
            vec![
                (LOCK, Str("t;w=1"), Some(5000)),
                (QUEUE, Zset(vec![(Abs(1), "w1")]), None),
                (STATES, Hash(vec![("w1", "n1 3000")]), None),
            ],
            WHOLE.to_vec(),
            s("~w1"),
            vec![
                (LOCK, Str("~w1"), Ttl::About(3000)),
                (QUEUE, Absent, Ttl::Any),
            ],
        ),
    ]
}

/// Rows of `release_table`, part 3 of 4.
fn release_table_rows_2() -> Vec<Row> {
    vec![
        release_row(
            "the head left the queue's states: freed",
            vec![
                (LOCK, Str("t;w=1"), Some(5000)),
                (QUEUE, Zset(vec![(Abs(1), "w1")]), None),
            ],
            WHOLE.to_vec(),
            Int(1),
            vec![(LOCK, Absent, Ttl::Any)],
        ),
        release_row(
            "a queue name of another type is no queue",
            vec![(LOCK, Str("t;w=1"), Some(5000)), (QUEUE, Str("x"), None)],
            WHOLE.to_vec(),
            Int(1),
            vec![(LOCK, Absent, Ttl::Any), (QUEUE, Str("x"), Ttl::None)],
        ),
        permit_release_row(
            "the last permit out frees the lock's key of its mark",
            (Some("permits:2"), None),
            1,
            Absent,
        ),
        permit_release_row(
            "a permit out with another held: the mark stays",
            (Some("permits:2"), Some("o;w=0")),
            1,
            Str("permits:2"),
        ),
        permit_release_row(
            "a permit whose mark was deleted is freed and lost",
            (None, None),
            0,
            Absent,
        ),
        permit_release_row(
            "a permit whose mark is another mode's is freed and lost",
            (Some("x;w=0"), None),
            0,
            Str("x;w=0"),
        ),
        permit_release_row(
            "a permit whose mark is another N's is freed and lost",
            (Some("permits:3"), None),
            0,
            Str("permits:3"),
        ),
    ]
}

/// Rows of `release_table`, part 4 of 4.
fn release_table_rows_3() -> Vec<Row> {
    vec![Row {
        keys: vec![P0, QUEUE, FENCE_KEY, LOCK, P0, P1],
        ..release_row(
            "a permit kept for min_hold keeps the mark as long",
            vec![
                (LOCK, Str("permits:2"), Some(1000)),
                (P0, Str("t;w=0"), Some(5000)),
            ],
            vec!["t;w=0", "60000", "0", "PUBLISH", "4000"],
            Int(1),
            vec![
                (P0, Str("t;w=0:released"), Ttl::About(4000)),
                (LOCK, Str("permits:2"), Ttl::About(4000)),
            ],
        )
    }]
}

#[tokio::test]
async fn release_short_table() {
    run(release_short_table_rows()).await;
}

/// RELEASE_SHORT of `t;w=0`, recording fence `record` (0: none).
fn short_row(
    what: &'static str,
    before: Before,
    record: &'static str,
    reply: i64,
    after: After,
) -> Row {
    Row {
        what,
        script: &RELEASE_SHORT,
        before,
        // Without a fence to record, the call sends the key and the token alone.
        keys: if record == "0" {
            vec![LOCK]
        } else {
            vec![LOCK, FENCE_KEY]
        },
        args: vec!["t;w=0", "60000", record],
        reply: Int(reply),
        after,
    }
}

/// The rows of `release_short_table`.
fn release_short_table_rows() -> Vec<Row> {
    let held = || (LOCK, Str("t;w=0"), Some(5000));
    vec![
        short_row(
            "ours, unmarked: deleted",
            vec![held()],
            "0",
            1,
            vec![(LOCK, Absent, Ttl::Any), (FENCE_KEY, Absent, Ttl::Any)],
        ),
        short_row(
            "a fence to record: the counter is raised, kept for the retention",
            vec![held()],
            "100",
            1,
            vec![
                (LOCK, Absent, Ttl::Any),
                (FENCE_KEY, Str("100"), Ttl::About(60000)),
            ],
        ),
        short_row(
            "a fence below the counter: the counter stays",
            vec![held(), (FENCE_KEY, Str("200"), Some(9000))],
            "100",
            1,
            vec![
                (LOCK, Absent, Ttl::Any),
                (FENCE_KEY, Str("200"), Ttl::About(9000)),
            ],
        ),
        short_row(
            "a counter that is not a number stays; the key is deleted",
            vec![held(), (FENCE_KEY, Str("abc"), None)],
            "100",
            1,
            vec![(LOCK, Absent, Ttl::Any), (FENCE_KEY, Str("abc"), Ttl::None)],
        ),
        short_row(
            "a waiter's mark: untouched, left to RELEASE",
            vec![(LOCK, Str("t;w=1"), Some(5000))],
            "100",
            0,
            vec![
                (LOCK, Str("t;w=1"), Ttl::About(5000)),
                (FENCE_KEY, Absent, Ttl::Any),
            ],
        ),
        short_row(
            "another holder's value: untouched",
            vec![(LOCK, Str("o;w=0"), Some(5000))],
            "100",
            0,
            vec![
                (LOCK, Str("o;w=0"), Ttl::About(5000)),
                (FENCE_KEY, Absent, Ttl::Any),
            ],
        ),
        short_row(
            "a key of another type: untouched",
            vec![(LOCK, List, None)],
            "0",
            0,
            vec![(LOCK, List, Ttl::None)],
        ),
    ]
}

#[tokio::test]
async fn acquire_permit_table() {
    run(acquire_permit_table_rows()).await;
}

/// The rows of `acquire_permit_table`.
fn acquire_permit_table_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    rows.extend(acquire_permit_table_rows_0());
    rows.extend(acquire_permit_table_rows_1());
    rows.extend(acquire_permit_table_foreign_rows());
    rows
}

/// Rows of `acquire_permit_table`: another client's keys at the queue's names. The attempt
/// reads their types only when one of its commands meets one, and then writes nothing.
fn acquire_permit_table_foreign_rows() -> Vec<Row> {
    let waiter = |what, before: Before, reply, after| Row {
        args: PERMIT_WAITER.to_vec(),
        ..permit_row(what, before, reply, after)
    };
    vec![
        permit_row(
            "the states' name holds another type, nobody queues: taken, untouched",
            vec![(STATES, Str("x"), None)],
            Arr(vec![Int(1), Fence, Int(0)]),
            vec![
                (P0, Str("t1;w=0"), Ttl::About(2000)),
                (LOCK, Str("permits:2"), Ttl::About(2000)),
                (STATES, Str("x"), Ttl::None),
            ],
        ),
        waiter(
            "a waiter meets the states' name of another type: nothing written",
            vec![
                (LOCK, Str("permits:2"), Some(6000)),
                (P0, Str("a;w=0"), Some(4000)),
                (P1, Str("b;w=0"), Some(4000)),
                (STATES, Str("x"), None),
            ],
            Arr(vec![Int(-1), s("string"), s(STATES)]),
            vec![(QUEUE, Absent, Ttl::Any), (STATES, Str("x"), Ttl::None)],
        ),
        waiter(
            "a permit handed to a waiter meets the queue's name of another type: not taken",
            vec![
                (LOCK, Str("permits:2"), Some(6000)),
                (P0, Str("a;w=0"), Some(4000)),
                (P1, Str("~w1"), Some(3000)),
                (QUEUE, Str("x"), None),
            ],
            Arr(vec![Int(-1), s("string"), s(QUEUE)]),
            vec![
                (P1, Str("~w1"), Ttl::About(3000)),
                (QUEUE, Str("x"), Ttl::None),
            ],
        ),
    ]
}

/// Rows of `acquire_permit_table`, part 1 of 2.
fn acquire_permit_table_rows_0() -> Vec<Row> {
    vec![
        permit_row(
            "free: permit 0, and the lock's key marked",
            vec![],
            Arr(vec![Int(1), Fence, Int(0)]),
            vec![
                (P0, Str("t1;w=0"), Ttl::About(2000)),
                (LOCK, Str("permits:2"), Ttl::About(2000)),
                (FENCE_KEY, Str("1*"), Ttl::About(60000)),
            ],
        ),
        permit_row(
            "one held: the other, and the mark extended",
            vec![
                (LOCK, Str("permits:2"), Some(500)),
                (P0, Str("o;w=0"), Some(500)),
            ],
            Arr(vec![Int(1), Fence, Int(1)]),
            vec![
                (P1, Str("t1;w=0"), Ttl::About(2000)),
                (LOCK, Str("permits:2"), Ttl::About(2000)),
            ],
        ),
        permit_row(
            "another N holds the name",
            vec![(LOCK, Str("permits:3"), Some(5000))],
            Arr(vec![Int(-3), s("permits:3")]),
            vec![(P0, Absent, Ttl::Any)],
        ),
        permit_row(
            "an exclusive holder",
            vec![(LOCK, Str("o;w=0"), Some(5000))],
            Arr(vec![Int(-3), s("o;w=0")]),
            vec![(P0, Absent, Ttl::Any)],
        ),
        permit_row(
            "a shared hold",
            vec![(LOCK, Str("shared:o;w=0"), Some(5000))],
            Arr(vec![Int(-3), s("shared:o;w=0")]),
            vec![(P0, Absent, Ttl::Any)],
        ),
        permit_row(
            "every permit held: the soonest expiry",
            vec![
                (LOCK, Str("permits:2"), Some(6000)),
                (P0, Str("a;w=0"), Some(4000)),
                (P1, Str("b;w=0"), Some(6000)),
            ],
            Arr(vec![Int(0), AboutMs(4000)]),
            vec![],
        ),
    ]
}

/// Rows of `acquire_permit_table`, part 2 of 2.
fn acquire_permit_table_rows_1() -> Vec<Row> {
    vec![
        permit_row(
            "a permit free, but a waiter before this caller",
            vec![
                (LOCK, Str("permits:2"), Some(6000)),
                (P0, Str("a;w=0"), Some(4000)),
                (QUEUE, Zset(vec![(Abs(1), "w0")]), None),
                (STATES, Hash(vec![("w0", "n0 2000 3000")]), None),
            ],
            Arr(vec![Int(2), s("w0"), s("n0 2000 3000")]),
            vec![(P1, Absent, Ttl::Any)],
        ),
        permit_row(
            "the lock's key holds another type",
            vec![(LOCK, List, None)],
            Arr(vec![Int(-1), s("list")]),
            vec![(P0, Absent, Ttl::Any)],
        ),
        Row {
            args: PERMIT_WAITER.to_vec(),
            ..permit_row(
                "every permit held: a waiter joins last, the line ahead not read",
                vec![
                    (LOCK, Str("permits:2"), Some(6000)),
                    (P0, Str("a;w=0"), Some(4000)),
                    (P1, Str("b;w=0"), Some(6000)),
                    (QUEUE, Zset(vec![(Abs(1), "w0")]), None),
                    (STATES, Hash(vec![("w2", "n2 2000 3000")]), None),
                ],
                Arr(vec![Int(0), AboutMs(4000)]),
                vec![(QUEUE, Zset(vec![(Abs(1), "w0"), (Abs(2), "w1")]), Ttl::Any)],
            )
        },
        Row {
            args: PERMIT_WAITER.to_vec(),
            ..permit_row(
                "a permit free: waiters ahead without a state leave, the caller takes it",
                vec![
                    (LOCK, Str("permits:2"), Some(6000)),
                    (P0, Str("a;w=0"), Some(4000)),
                    (QUEUE, Zset(vec![(Abs(1), "w0")]), None),
                    (STATES, Hash(vec![("w2", "n2 2000 3000")]), None),
                ],
                Arr(vec![Int(1), Fence, Int(1)]),
                vec![
                    (P1, Str("t1;w=0"), Ttl::About(2000)),
                    (QUEUE, Absent, Ttl::Any),
                ],
            )
        },
    ]
}

/// ACQUIRE_PERMIT's arguments for waiter `w1` (grace 3 s, first attempt) on one of 2 permits.
const PERMIT_WAITER: [&str; 10] = [
    "t1;w=0", "2000", "1", "60000", "2", "w1", "3000", "", "", "",
];

#[tokio::test]
async fn forget_permit_table() {
    run(forget_permit_table_rows()).await;
}

/// The rows of `forget_permit_table`.
fn forget_permit_table_rows() -> Vec<Row> {
    let row = |what, before, reply, after| Row {
        what,
        script: &FORGET_PERMIT,
        before,
        keys: vec![LOCK, P0, P1],
        args: vec!["t;w=0", "", "PUBLISH"],
        reply,
        after,
    };
    vec![
        row(
            "the last permit forgotten: freed, and the mark with it",
            vec![
                (LOCK, Str("permits:2"), Some(5000)),
                (P1, Str("t;w=1"), Some(5000)),
            ],
            Int(1),
            vec![(P1, Absent, Ttl::Any), (LOCK, Absent, Ttl::Any)],
        ),
        row(
            "another permit held: the mark stays",
            vec![
                (LOCK, Str("permits:2"), Some(5000)),
                (P0, Str("t;w=0"), Some(5000)),
                (P1, Str("o;w=0"), Some(5000)),
            ],
            Int(1),
            vec![
                (P0, Absent, Ttl::Any),
                (LOCK, Str("permits:2"), Ttl::About(5000)),
                (P1, Str("o;w=0"), Ttl::Any),
            ],
        ),
        row(
            "the last of these permits forgotten: another N's mark stays",
            vec![
                (LOCK, Str("permits:3"), Some(5000)),
                (P1, Str("t;w=1"), Some(5000)),
            ],
            Int(1),
            vec![
                (P1, Absent, Ttl::Any),
                (LOCK, Str("permits:3"), Ttl::About(5000)),
            ],
        ),
        row(
            "no permit holds the token: nothing touched",
            vec![
                (LOCK, Str("permits:2"), Some(5000)),
                (P0, Str("o;w=0"), Some(5000)),
            ],
            Int(0),
            vec![
                (P0, Str("o;w=0"), Ttl::Any),
                (LOCK, Str("permits:2"), Ttl::Any),
            ],
        ),
    ]
}

#[tokio::test]
async fn acquire_shared_table() {
    run(acquire_shared_table_rows()).await;
}

/// The rows of `acquire_shared_table`.
fn acquire_shared_table_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    rows.extend(acquire_shared_table_rows_0());
    rows.extend(acquire_shared_table_rows_1());
    rows.extend(acquire_shared_table_foreign_rows());
    rows
}

/// Rows of `acquire_shared_table`: another client's keys at the queue's names. The attempt
/// reads their types only when one of its commands meets one, and then writes nothing.
fn acquire_shared_table_foreign_rows() -> Vec<Row> {
    let waiter = |what, before: Before, reply, after| Row {
        args: vec![
            "r1;w=0", "2000", "1", "60000", "PUBLISH", "w1", "3000", "", "",
        ],
        ..shared_row(what, before, reply, after)
    };
    vec![
        shared_row(
            "the states' name holds another type, nobody queues: held, untouched",
            vec![(STATES, Str("x"), None)],
            Arr(vec![Int(1), Fence, s("shared:r1;w=0"), s("r1;w=0 1*")]),
            vec![
                (LOCK, Str("shared:r1;w=0"), Ttl::About(2000)),
                (STATES, Str("x"), Ttl::None),
            ],
        ),
        waiter(
            "handed to this waiter, the states' name of another type: the key not written",
            vec![(LOCK, Str("~w1"), Some(3000)), (STATES, Str("x"), None)],
            Arr(vec![Int(-1), s("string"), s(STATES)]),
            vec![
                (LOCK, Str("~w1"), Ttl::About(3000)),
                (READERS, Absent, Ttl::Any),
                (STATES, Str("x"), Ttl::None),
            ],
        ),
        waiter(
            "behind an exclusive holder, the queue's name of another type: nothing written",
            vec![(LOCK, Str("o;w=0"), Some(5000)), (QUEUE, Str("x"), None)],
            Arr(vec![Int(-1), s("string"), s(QUEUE)]),
            vec![
                (LOCK, Str("o;w=0"), Ttl::About(5000)),
                (QUEUE, Str("x"), Ttl::None),
                (STATES, Absent, Ttl::Any),
            ],
        ),
    ]
}

/// Rows of `acquire_shared_table`, part 1 of 2.
fn acquire_shared_table_rows_0() -> Vec<Row> {
    vec![
        shared_row(
            "free: the key marked shared, this holder's place scored by its expiry",
            vec![],
            Arr(vec![Int(1), Fence, s("shared:r1;w=0"), s("r1;w=0 1*")]),
            vec![
                (LOCK, Str("shared:r1;w=0"), Ttl::About(2000)),
                (
                    READERS,
                    Zset(vec![(Rel(2000), "r1;w=0 1*")]),
                    Ttl::About(2000),
                ),
            ],
        ),
        shared_row(
            "joins a shared hold: the key extended, dead holders' places gone",
            vec![
                (LOCK, Str("shared:r0;w=0"), Some(500)),
                (
                    READERS,
                    Zset(vec![(Rel(500), "r0;w=0 5"), (Rel(-100), "rx;w=0 4")]),
                    Some(500),
                ),
            ],
            Arr(vec![Int(1), Fence, s("shared:r0;w=0"), s("r1;w=0 1*")]),
            vec![
                (LOCK, Str("shared:r0;w=0"), Ttl::About(2000)),
                (
                    READERS,
                    Zset(vec![(Rel(500), "r0;w=0 5"), (Rel(2000), "r1;w=0 1*")]),
                    Ttl::About(2000),
                ),
            ],
        ),
        shared_row(
            "an exclusive holder: busy",
            vec![(LOCK, Str("o;w=0"), Some(5000))],
            Arr(vec![Int(0), AboutMs(5000)]),
            vec![(READERS, Absent, Ttl::Any)],
        ),
        shared_row(
            "permits hold the name",
            vec![(LOCK, Str("permits:2"), Some(5000))],
            Arr(vec![Int(-3), s("permits:2")]),
            vec![(READERS, Absent, Ttl::Any)],
        ),
        shared_row(
            "the holders' set holds another type",
            vec![(READERS, Str("x"), None)],
            Arr(vec![Int(-1), s("string"), s(READERS)]),
            vec![(LOCK, Absent, Ttl::Any), (READERS, Str("x"), Ttl::None)],
        ),
        Row {
            args: vec![
                "r1;w=0", "2000", "1", "60000", "PUBLISH", "w1", "3000", "", "",
            ],
            ..shared_row(
                "an exclusive holder: a waiter joins last, the line ahead not read",
                vec![
                    (LOCK, Str("o;w=1"), Some(5000)),
                    (QUEUE, Zset(vec![(Abs(1), "w0")]), None),
                    (STATES, Hash(vec![("w2", "n2 3000")]), None),
                ],
                Arr(vec![Int(0), AboutMs(5000)]),
                vec![(QUEUE, Zset(vec![(Abs(1), "w0"), (Abs(2), "w1")]), Ttl::Any)],
            )
        },
    ]
}

/// Rows of `acquire_shared_table`, part 2 of 2.
fn acquire_shared_table_rows_1() -> Vec<Row> {
    vec![shared_row(
        "an exclusive waiter first in line: its turn",
        vec![
            (QUEUE, Zset(vec![(Abs(1), "w0")]), None),
            (STATES, Hash(vec![("w0", "n0 2000 3000")]), None),
        ],
        Arr(vec![Int(2), s("w0"), s("n0 2000 3000")]),
        vec![(LOCK, Absent, Ttl::Any)],
    )]
}

#[tokio::test]
async fn release_shared_table() {
    run(release_shared_table_rows()).await;
}

/// The rows of `release_shared_table`.
fn release_shared_table_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    rows.extend(release_shared_table_rows_0());
    rows.extend(release_shared_table_rows_1());
    rows
}

/// Rows of `release_shared_table`, part 1 of 2.
fn release_shared_table_rows_0() -> Vec<Row> {
    vec![
        release_shared_row(
            "the last one out: the key and the set deleted",
            shared_held(vec![(Rel(2000), "r1;w=0 5")]),
            "r1;w=0 5",
            Int(1),
            vec![(LOCK, Absent, Ttl::Any), (READERS, Absent, Ttl::Any)],
        ),
        release_shared_row(
            "others hold: the key cut down to the longest of their leases",
            shared_held(vec![(Rel(4000), "r1;w=0 5"), (Rel(1000), "r2;w=0 6")]),
            "r1;w=0 5",
            Int(1),
            vec![
                (LOCK, Str("shared:r1;w=0"), Ttl::About(1000)),
                (READERS, Zset(vec![(Rel(1000), "r2;w=0 6")]), Ttl::Any),
            ],
        ),
        release_shared_row(
            "only the token known: its place found",
            shared_held(vec![(Rel(2000), "r1;w=0 5"), (Rel(2000), "r2;w=0 6")]),
            "r2;w=0",
            Int(1),
            vec![(READERS, Zset(vec![(Rel(2000), "r1;w=0 5")]), Ttl::Any)],
        ),
        release_shared_row(
            "a dead holder is not counted: the last live one releases",
            shared_held(vec![(Rel(2000), "r1;w=0 5"), (Rel(-100), "r2;w=0 6")]),
            "r1;w=0 5",
            Int(1),
            vec![(LOCK, Absent, Ttl::Any), (READERS, Absent, Ttl::Any)],
        ),
        release_shared_row(
            "not among the holders: nothing touched",
            shared_held(vec![(Rel(2000), "r2;w=0 6")]),
            "r1;w=0 5",
            Int(0),
            vec![(LOCK, Str("shared:r1;w=0"), Ttl::About(5000))],
        ),
        release_shared_row(
            "the key is not shared: nothing touched",
            vec![(LOCK, Str("o;w=0"), Some(5000))],
            "r1;w=0 5",
            Int(0),
            vec![(LOCK, Str("o;w=0"), Ttl::Any)],
        ),
    ]
}

/// Rows of `release_shared_table`, part 2 of 2.
fn release_shared_table_rows_1() -> Vec<Row> {
    vec![Row {
        args: vec!["shared:r1;w=0", "r1;w=0 5", "60000", "PUBLISH", "3000"],
        ..release_shared_row(
            "the last one out with min_hold: kept under a value no lease renews",
            shared_held(vec![(Rel(2000), "r1;w=0 5")]),
            "",
            Int(1),
            vec![(LOCK, Str("r1;w=0:released"), Ttl::About(3000))],
        )
    }]
}

#[tokio::test]
async fn fence_tables() {
    run(fence_tables_rows()).await;
}

/// The rows of `fence_tables`.
fn fence_tables_rows() -> Vec<Row> {
    let fence = |what, before, reply, after| Row {
        what,
        script: &FENCE,
        before,
        keys: vec![LOCK, FENCE_KEY],
        args: vec!["t;w=0", "60000"],
        reply,
        after,
    };
    let raise = |what, counter: &'static str, reply, after: &'static str| Row {
        what,
        script: &RAISE_FENCE,
        before: vec![(FENCE_KEY, Str(counter), None)],
        keys: vec![FENCE_KEY],
        args: vec!["100", "60000"],
        reply,
        after: vec![(FENCE_KEY, Str(after), Ttl::Any)],
    };
    vec![
        fence(
            "ours: a fence from the clock, written",
            vec![(LOCK, Str("t;w=0"), Some(5000))],
            Arr(vec![Int(1), Fence]),
            vec![(FENCE_KEY, Str("1*"), Ttl::About(60000))],
        ),
        fence(
            "not ours: nothing",
            vec![(LOCK, Str("o;w=0"), Some(5000))],
            Arr(vec![Int(0)]),
            vec![(FENCE_KEY, Absent, Ttl::Any)],
        ),
        fence(
            "the counter is not a counter",
            vec![
                (LOCK, Str("t;w=0"), Some(5000)),
                (FENCE_KEY, Str("x"), None),
            ],
            Arr(vec![Int(-2), s("holds x, not an integer counter")]),
            vec![(FENCE_KEY, Str("x"), Ttl::None)],
        ),
        raise("a lower counter is raised", "5", Int(1), "100"),
        raise("a higher counter stays", "500", Int(1), "500"),
        raise(
            "the counter is not a counter",
            "x",
            Arr(vec![Int(-2), s("holds x, not an integer counter")]),
            "x",
        ),
    ]
}

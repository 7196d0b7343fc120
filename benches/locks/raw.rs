//! Raw connections and server statistics

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use redis::aio::MultiplexedConnection;

/// Compare-and-delete, the textbook release, loaded once and sent as EVALSHA by the floors.
pub(crate) const RELEASE_LUA: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

pub(crate) async fn raw_connection(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

pub(crate) async fn load_script(conn: &mut MultiplexedConnection, script: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script)
        .query_async(conn)
        .await
        .expect("SCRIPT LOAD")
}

pub(crate) async fn raw_take(
    conn: &mut MultiplexedConnection,
    key: &str,
    token: &str,
    ttl_ms: u64,
) -> bool {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .query_async(conn)
        .await
        .expect("SET NX PX");
    set.is_some()
}

pub(crate) async fn raw_release(
    conn: &mut MultiplexedConnection,
    sha: &str,
    key: &str,
    token: &str,
) -> bool {
    let deleted: i64 = redis::cmd("EVALSHA")
        .arg(sha)
        .arg(1)
        .arg(key)
        .arg(token)
        .query_async(conn)
        .await
        .expect("EVALSHA compare-and-delete");
    deleted == 1
}

/// Zeroes the server's command counts (CONFIG RESETSTAT), before a measured run.
pub(crate) async fn reset_stats(conn: &mut MultiplexedConnection) {
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .expect("CONFIG RESETSTAT");
}

/// Whether `command` (as INFO commandstats names it) is one the bench sends to reset and read
/// the counts, not part of what it measures.
pub(crate) fn reads_stats(command: &str) -> bool {
    command == "config|resetstat" || command == "info"
}

/// `(command, calls)` from INFO commandstats. Commands run by scripts are counted too.
pub(crate) async fn command_calls(conn: &mut MultiplexedConnection) -> Vec<(String, u64)> {
    command_stats(conn)
        .await
        .into_iter()
        .map(|(name, calls, _)| (name, calls))
        .collect()
}

/// `(command, calls, µs)` from INFO commandstats: the µs a command ran (a script's include its
/// commands'; reading requests and writing replies are not in any).
pub(crate) async fn command_stats(conn: &mut MultiplexedConnection) -> Vec<(String, u64, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(key))?
                    .parse()
                    .ok()
            };
            Some((name.to_owned(), field("calls=")?, field("usec=")?))
        })
        .collect()
}

pub(crate) async fn calls_of(conn: &mut MultiplexedConnection, command: &str) -> u64 {
    command_calls(conn)
        .await
        .into_iter()
        .find_map(|(name, calls)| (name == command).then_some(calls))
        .unwrap_or(0)
}

/// Polls every future until all are done; results in order (a join without spawning tasks).
/// Every wake-up polls them all: for a handful of futures, not thousands.
pub(crate) async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (fut, slot) in futures.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(v) => *slot = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|v| v.expect("every future finished"))
        .collect()
}

/// The number `field` of INFO `section` (0 when absent).
pub(crate) async fn info_field(
    conn: &mut MultiplexedConnection,
    section: &str,
    field: &str,
) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

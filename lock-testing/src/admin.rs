//! Blocking admin connections to the nodes the test support runs, and bounded polling.
//!
//! Shared by `RedisCluster` and `SentinelSet`. A fresh connection per check keeps the helpers
//! indifferent to restarts; every call is bounded by short timeouts, so that a paused or dead
//! node turns into an error the poller retries, never into a hang.

use std::thread;
use std::time::{Duration, Instant};

use redis::{Cmd, Connection, FromRedisValue};

/// Connect timeout of an admin connection (loopback: a healthy node accepts at once).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Read and write timeout of an admin command (a paused node must not stall a poll for long).
const IO_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between two checks of a poll.
const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// A connection to `127.0.0.1:port`, with short timeouts.
pub(crate) fn connect(port: u16) -> Result<Connection, String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .map_err(|e| format!("port {port}: {e}"))?;
    let con = client
        .get_connection_with_timeout(CONNECT_TIMEOUT)
        .map_err(|e| format!("port {port}: cannot connect: {e}"))?;
    con.set_read_timeout(Some(IO_TIMEOUT))
        .and_then(|()| con.set_write_timeout(Some(IO_TIMEOUT)))
        .map_err(|e| format!("port {port}: {e}"))?;
    Ok(con)
}

/// `args` as one command.
pub(crate) fn cmd(args: &[&str]) -> Cmd {
    let mut cmd = Cmd::new();
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

/// Runs `args` on `con`; the error names the command.
pub(crate) fn run<T: FromRedisValue>(con: &mut Connection, args: &[&str]) -> Result<T, String> {
    cmd(args)
        .query(con)
        .map_err(|e| format!("{}: {e}", args.join(" ")))
}

/// Runs `args` on a fresh connection to `port`.
pub(crate) fn query<T: FromRedisValue>(port: u16, args: &[&str]) -> Result<T, String> {
    run(&mut connect(port)?, args).map_err(|e| format!("port {port}: {e}"))
}

/// The value of `key` in an `INFO` reply (`key:value` lines).
pub(crate) fn info_field<'a>(info: &'a str, key: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(key)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim_end)
    })
}

/// Whether the replica on `port` has its link to its primary up and no sync in progress.
pub(crate) fn replica_synced(port: u16) -> Result<(), String> {
    let info: String = query(port, &["INFO", "replication"])?;
    let field = |key| info_field(&info, key).unwrap_or("?");
    match (
        field("role"),
        field("master_link_status"),
        field("master_sync_in_progress"),
    ) {
        ("slave", "up", "0") => Ok(()),
        (role, link, sync) => Err(format!(
            "port {port}: role {role}, master_link_status {link}, master_sync_in_progress {sync}"
        )),
    }
}

/// Whether the primary on `port` lists the replica on `replica_port` as `state=online` (the
/// state in which `WAIT` counts it).
pub(crate) fn replica_online_at_primary(port: u16, replica_port: u16) -> Result<(), String> {
    let info: String = query(port, &["INFO", "replication"])?;
    let wanted = format!("port={replica_port},");
    let line = info
        .lines()
        .filter(|line| line.starts_with("slave"))
        .find(|line| line.contains(&wanted));
    match line {
        Some(line) if line.contains("state=online") => Ok(()),
        Some(line) => Err(format!("port {port}: {line}")),
        None => Err(format!("port {port}: replica {replica_port} not listed")),
    }
}

/// Calls `check` until it returns `Ok`, at most for `timeout`; the error is the last one seen.
pub(crate) fn poll<T>(
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(value) => return Ok(value),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("not reached within {timeout:?}: {e}"));
            }
            Err(_) => thread::sleep(POLL_INTERVAL),
        }
    }
}

/// [`poll`] for async callers: sleeps on the runtime so that tasks on the same thread (a
/// `FaultProxy` in a current-thread runtime) keep running between checks. The checks themselves
/// are short blocking calls.
pub(crate) async fn poll_async<T>(
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(value) => return Ok(value),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("not reached within {timeout:?}: {e}"));
            }
            Err(_) => tokio::time::sleep(POLL_INTERVAL).await,
        }
    }
}

/// The last `lines` lines of `log`, for panic messages that stay readable.
pub(crate) fn log_tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Whether `pid` is a live `redis-server` process (a reaped pid may belong to someone else).
#[cfg(test)]
pub(crate) fn is_redis_process(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.contains("(redis-server)") && !stat.contains(") Z "))
}

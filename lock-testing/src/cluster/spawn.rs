//! Spawning the nodes and creating the cluster with `redis-cli --cluster create`.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::admin::log_tail;
use crate::server::{REDIS_SERVER_BIN_ENV, RedisServer, server_bin};

/// Short, so that a failover in a test takes seconds (detection is about one node timeout).
const NODE_TIMEOUT_MS: u32 = 1000;
/// Bound on `redis-cli --cluster create`.
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);
/// Log lines of each node shown when something fails.
const LOG_LINES: usize = 25;

/// Every node's configuration beyond `RedisServer`'s defaults.
pub(super) fn node_args() -> Vec<OsString> {
    let timeout = NODE_TIMEOUT_MS.to_string();
    [
        "--cluster-enabled",
        "yes",
        // Relative to the node's own `--dir`.
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        &timeout,
        // A replica may always take over, however long ago it last heard from its primary.
        "--cluster-replica-validity-factor",
        "0",
        // No replica moves to another primary, and an emptied primary stays a primary.
        "--cluster-allow-replica-migration",
        "no",
        // A Redis 7 primary otherwise waits 5 s before the first (diskless) sync of a replica.
        "--repl-diskless-sync-delay",
        "0",
    ]
    .into_iter()
    .map(OsString::from)
    .collect()
}

/// `redis-cli` next to `$REDIS_SERVER_BIN` when that is a path, else from `PATH`.
///
/// # Panics
///
/// If `$REDIS_SERVER_BIN` is a path with no `redis-cli` beside it.
pub(super) fn cli_bin() -> OsString {
    cli_beside(&server_bin()).unwrap_or_else(|e| panic!("RedisCluster: {e}"))
}

fn cli_beside(server: &OsStr) -> Result<OsString, String> {
    let path = Path::new(server);
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        None => Ok(OsString::from("redis-cli")),
        Some(dir) => {
            let cli = dir.join("redis-cli");
            if cli.exists() {
                Ok(cli.into_os_string())
            } else {
                Err(format!(
                    "creating a cluster needs redis-cli next to the redis-server binary \
                     ({REDIS_SERVER_BIN_ENV}={}), but {} does not exist",
                    path.display(),
                    cli.display()
                ))
            }
        }
    }
}

/// Runs `redis-cli --cluster create` over `servers` (the first half become primaries), bounded.
pub(super) fn create(cli: &OsString, servers: &[RedisServer]) -> Result<(), String> {
    // The output goes to a file in the first node's directory: no pipe to drain meanwhile.
    let log_path = servers[0].dir().join("cluster-create.log");
    let log = File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let log_err = log.try_clone().map_err(|e| e.to_string())?;
    let mut child = Command::new(cli)
        .arg("--cluster")
        .arg("create")
        .args(servers.iter().map(|s| format!("127.0.0.1:{}", s.port())))
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                format!(
                    "redis-cli not found (tried to run `{}`): it comes with redis-server \
                     (`apt-get install redis-server`, `brew install redis`), or set \
                     {REDIS_SERVER_BIN_ENV} to a redis-server that has redis-cli beside it",
                    cli.to_string_lossy()
                )
            } else {
                format!("cannot run `{}`: {e}", cli.to_string_lossy())
            }
        })?;
    let deadline = Instant::now() + CREATE_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            // Our own child, through its handle: not reaped yet, so its pid is still its own.
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let output = fs::read_to_string(&log_path).unwrap_or_default();
    match status {
        Some(status) if status.success() => Ok(()),
        Some(status) => Err(format!(
            "redis-cli --cluster create failed ({status}):\n{output}"
        )),
        None => Err(format!(
            "redis-cli --cluster create did not finish within {CREATE_TIMEOUT:?}:\n{output}"
        )),
    }
}

/// The tail of every server's log, for panic messages.
pub(super) fn logs<S: std::borrow::Borrow<RedisServer>>(servers: &[S]) -> String {
    servers
        .iter()
        .map(|s| {
            let s = s.borrow();
            format!(
                "--- node {} (pid {}) log tail:\n{}",
                s.port(),
                s.pid(),
                log_tail(&s.log_contents(), LOG_LINES)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_cli_is_looked_up_beside_the_server() {
        assert_eq!(cli_beside(OsStr::new("redis-server")).unwrap(), "redis-cli");
        let dir = crate::server::make_temp_dir();
        let (server, cli) = (dir.join("redis-server"), dir.join("redis-cli"));
        let err = cli_beside(server.as_os_str()).unwrap_err();
        assert!(err.contains("needs redis-cli next to"), "{err}");
        File::create(&cli).unwrap();
        assert_eq!(
            cli_beside(server.as_os_str()).unwrap(),
            cli.into_os_string()
        );
        fs::remove_dir_all(dir).unwrap();
    }
}

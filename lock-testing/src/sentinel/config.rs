//! Configuration of the data nodes and sentinels of a `SentinelSet`.
//!
//! # Keeping proxied replicas behind the proxy
//!
//! A sentinel that sees a replica replicate from an address other than the primary's (the proxy)
//! "fixes" it with `SLAVEOF <primary>` (`+fix-slave-config`, a few seconds after it first sees
//! it), which would silently bypass the proxy. In proxy mode the sentinels therefore log in to
//! the data nodes as a user of their own which, on the proxied replicas, may run `SLAVEOF NO ONE`
//! (promotion) but no other `SLAVEOF`/`REPLICAOF`. The fix is then refused (its `MULTI` aborts)
//! while promotion still works. [`lift_restriction`] gives that user the full commands back once
//! a failover has happened, so that the sentinels can reconfigure replicas as usual.

/// The sentinels' user on the data nodes (proxy mode only).
const SENTINEL_USER: &str = "lock-runtime-sentinel";
/// Its password: loopback-only servers of a test, nothing to protect.
const SENTINEL_PASS: &str = "lock-runtime-sentinel-pass";
/// Quorum: sentinels that must agree the primary is down.
const QUORUM: usize = 2;
/// Short, so that a failover in a test takes seconds.
const DOWN_AFTER_MS: u32 = 1000;
/// Also the sentinels' wait before retrying a failed election (twice this).
const FAILOVER_TIMEOUT_MS: u32 = 3000;

/// Arguments of a data node: `replica_of` the port it replicates from (the primary or the
/// proxy); `acl` creates the sentinels' user, `restricted` keeps it from repointing the node.
pub(super) fn data_node_args(acl: bool, restricted: bool, replica_of: Option<u16>) -> Vec<String> {
    let mut args: Vec<String> = [
        // A Redis 7 primary otherwise waits 5 s before the first (diskless) sync of a replica.
        "--repl-diskless-sync-delay",
        "0",
    ]
    .map(String::from)
    .to_vec();
    if let Some(port) = replica_of {
        args.extend(["--replicaof".into(), "127.0.0.1".into(), port.to_string()]);
        // The primary sees a proxied replica's connection come from the proxy; the announced
        // address is the replica's own, which sentinels and clients then use.
        args.extend(["--replica-announce-ip".into(), "127.0.0.1".into()]);
    }
    if acl {
        let password = format!(">{SENTINEL_PASS}");
        // Keys and channels too: sentinels publish and subscribe to `__sentinel__:hello`.
        args.extend(
            [
                "--user",
                SENTINEL_USER,
                "on",
                &password,
                "~*",
                "&*",
                "+@all",
            ]
            .map(String::from),
        );
        if restricted {
            args.extend(["-slaveof", "-replicaof", "+slaveof|no"].map(String::from));
        }
    }
    args
}

/// `ACL SETUSER` giving the sentinels' user every command back.
pub(super) fn lift_restriction() -> [&'static str; 5] {
    ["ACL", "SETUSER", SENTINEL_USER, "+slaveof", "+replicaof"]
}

/// A sentinel's config file, monitoring `name` at `127.0.0.1:primary`.
pub(super) fn sentinel_conf(name: &str, primary: u16, auth: bool) -> String {
    let mut conf = format!(
        "sentinel resolve-hostnames no\n\
         sentinel monitor {name} 127.0.0.1 {primary} {QUORUM}\n\
         sentinel down-after-milliseconds {name} {DOWN_AFTER_MS}\n\
         sentinel failover-timeout {name} {FAILOVER_TIMEOUT_MS}\n\
         sentinel parallel-syncs {name} 1\n"
    );
    if auth {
        conf.push_str(&format!(
            "sentinel auth-user {name} {SENTINEL_USER}\nsentinel auth-pass {name} {SENTINEL_PASS}\n"
        ));
    }
    conf
}

use std::time::Instant;

use super::*;
use crate::admin::{connect, info_field, is_redis_process, poll_async, query, run};

/// Bound on a replica catching up with a write (it normally takes milliseconds).
const CATCH_UP: Duration = Duration::from_secs(5);

fn get_on(port: u16, key: &str) -> Result<Option<String>, String> {
    query(port, &["GET", key])
}

/// `INFO replication`'s `master_port` of the replica on `port`.
fn master_port_of(port: u16) -> Result<u16, String> {
    let info: String = query(port, &["INFO", "replication"])?;
    info_field(&info, "master_port")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("port {port} has no master_port"))
}

/// Waits (bounded) until `key` reads `value` on `port`.
async fn wait_for_value(port: u16, key: &str, value: &str) {
    poll_async(CATCH_UP, || match get_on(port, key)? {
        Some(v) if v == value => Ok(()),
        other => Err(format!("{key} on {port}: {other:?}")),
    })
    .await
    .unwrap();
}

fn all_pids(set: &SentinelSet) -> Vec<u32> {
    set.data
        .iter()
        .chain(&set.sentinels)
        .map(RedisServer::pid)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_set_replicates_fails_over_and_restarts() {
    let started = Instant::now();
    let set = SentinelSet::builder().replicas(2).start().await;
    eprintln!("sentinel set ready in {:?}", started.elapsed());

    let primary = set.primary();
    assert_eq!(primary.port, set.data[0].port());
    for url in set.sentinel_urls() {
        let port = url.rsplit(':').next().unwrap().parse().unwrap();
        assert_eq!(set.master_port(port), Ok(primary.port), "sentinel {port}");
    }
    let replicas = set.replicas();
    assert_eq!(replicas.len(), 2, "{replicas:?}");
    assert!(replicas.iter().all(|r| r.port != primary.port));
    assert!(set.proxy().is_none());

    query::<()>(primary.port, &["SET", "k", "v"]).unwrap();
    for r in &replicas {
        wait_for_value(r.port, "k", "v").await;
    }

    let killed = Instant::now();
    assert_eq!(set.kill_primary(), primary.port);
    assert!(!set.node(primary.port).is_running());
    let new = set.wait_for_failover().await;
    eprintln!("failover reported {:?} after the kill", killed.elapsed());
    assert!(replicas.iter().any(|r| r.port == new), "{new} {replicas:?}");
    assert_eq!(set.primary().port, new);
    assert_eq!(get_on(new, "k").unwrap().as_deref(), Some("v"));
    // The sentinels repoint the other replica to the new primary.
    let other = replicas.iter().find(|r| r.port != new).unwrap().port;
    poll_async(Duration::from_secs(20), || match master_port_of(other)? {
        p if p == new => replica_synced(other),
        p => Err(format!("replica {other} follows {p}")),
    })
    .await
    .unwrap();

    // The old primary comes back as a replica of the new one, resynced.
    let restarted = Instant::now();
    set.restart(primary.port).await;
    eprintln!("restart done in {:?}", restarted.elapsed());
    assert_eq!(master_port_of(primary.port), Ok(new));
    assert_eq!(get_on(primary.port, "k").unwrap().as_deref(), Some("v"));
    assert!(set.replicas().iter().any(|r| r.port == primary.port));

    let pids = all_pids(&set);
    let dirs: Vec<_> = set
        .data
        .iter()
        .chain(&set.sentinels)
        .map(|s| s.dir().to_owned())
        .collect();
    drop(set);
    for pid in pids {
        assert!(!is_redis_process(pid), "pid {pid} survived the drop");
    }
    for dir in dirs {
        assert!(!dir.exists(), "{} survived the drop", dir.display());
    }
}

/// The failover hazard: a write the primary acknowledged but never replicated is gone once the
/// replica is promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_replication_loses_an_acknowledged_write_on_failover() {
    let started = Instant::now();
    let set = SentinelSet::builder().replica_via_proxy(true).start().await;
    eprintln!("sentinel set with proxy ready in {:?}", started.elapsed());
    let proxy = set.proxy().expect("a proxy");
    let primary = set.primary();
    let replicas = set.replicas();
    let [replica] = &replicas[..] else {
        panic!("one replica expected: {replicas:?}")
    };
    // Replication goes through the proxy.
    assert_eq!(master_port_of(replica.port), Ok(proxy.addr().port()));
    assert_eq!(proxy.upstream(), set.node(primary.port).addr());

    let mut con = connect(primary.port).unwrap();
    run::<()>(&mut con, &["SET", "before", "1"]).unwrap();
    wait_for_value(replica.port, "before", "1").await;

    proxy.blackhole();
    run::<()>(&mut con, &["SET", "lost", "1"]).unwrap(); // acknowledged by the primary
    let acked: i64 = run(&mut con, &["WAIT", "1", "300"]).unwrap();
    assert_eq!(acked, 0, "a replica acknowledged through the blackhole");
    assert_eq!(get_on(replica.port, "lost").unwrap(), None);

    let killed = Instant::now();
    assert_eq!(set.kill_primary(), primary.port);
    let new = set.wait_for_failover().await;
    eprintln!("failover reported {:?} after the kill", killed.elapsed());
    assert_eq!(new, replica.port, "the blackholed replica was not promoted");
    assert_eq!(get_on(new, "before").unwrap().as_deref(), Some("1"));
    assert_eq!(
        get_on(new, "lost").unwrap(),
        None,
        "the unreplicated write survived"
    );
}

/// Sentinels "fix" a replica that replicates from another address than the primary's; the
/// sentinels' restricted user keeps the proxied replica where it is, and still healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxied_replica_stays_behind_the_proxy() {
    let set = SentinelSet::builder().replica_via_proxy(true).start().await;
    let proxy_port = set.proxy().unwrap().addr().port();
    let replica = set.replicas()[0].port;
    // A sentinel tries within failover-timeout (3 s) plus one INFO period (10 s).
    let started = Instant::now();
    poll_async(Duration::from_secs(25), || {
        match set
            .sentinels
            .iter()
            .any(|s| s.log_contents().contains("+fix-slave-config"))
        {
            true => Ok(()),
            false => Err("no +fix-slave-config attempt yet".to_owned()),
        }
    })
    .await
    .unwrap();
    eprintln!("first +fix-slave-config after {:?}", started.elapsed());
    assert_eq!(master_port_of(replica), Ok(proxy_port));
    replica_synced(replica).unwrap();
    for s in &set.sentinels {
        set.check_sentinel(s.port(), set.primary().port, &[replica])
            .unwrap();
    }
}

/// Shareable between the code under test and the fault injector, and spawnable.
#[test]
fn sentinel_set_and_its_futures_are_send() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>(_: &T) {}
    send_sync::<SentinelSet>();
    send_sync::<SentinelSetBuilder>();
    // Never polled: nothing starts.
    let start = SentinelSet::start();
    send(&start);
    drop(start);
    // Compiled, not called.
    let _ = |set: &SentinelSet| {
        send(&set.wait_for_failover());
        send(&set.restart(0));
    };
}

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Instant;

use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::*;
use crate::admin::{cmd, connect, info_field, is_redis_process, query, run};

/// `SET key value` on `port`, with a plain, cluster-unaware connection.
fn set_on(port: u16, key: &str, value: &str) -> Result<(), RedisError> {
    cmd(&["SET", key, value]).query(&mut connect(port).unwrap())
}

fn get_on(port: u16, key: &str) -> Option<String> {
    query(port, &["GET", key]).unwrap()
}

/// The port a MOVED or ASK error redirects to.
fn redirect_port(e: &RedisError) -> Option<u16> {
    e.redirect_node()?.0.rsplit(':').next()?.parse().ok()
}

#[test]
fn cluster_starts_settled_and_keys_land_where_primary_for_key_says() {
    let started = Instant::now();
    let cluster = RedisCluster::start();
    eprintln!("cluster settled in {:?}", started.elapsed());

    let primaries = cluster.primaries();
    let replicas = cluster.replicas();
    assert_eq!(primaries.len(), 3, "{primaries:?}");
    assert_eq!(replicas.len(), 3, "{replicas:?}");
    // The primaries' slots cover 0..=16383 exactly once, in order.
    let mut next = 0u32;
    for range in primaries.iter().flat_map(|p| p.slots.iter()) {
        assert_eq!(u32::from(*range.start()), next, "{primaries:?}");
        next = u32::from(*range.end()) + 1;
    }
    assert_eq!(next, 16384);
    // Each primary has exactly one replica, synced.
    for p in &primaries {
        let mine: Vec<_> = replicas
            .iter()
            .filter(|r| r.primary == Some(p.port))
            .collect();
        assert_eq!(mine.len(), 1, "primary {} replicas {replicas:?}", p.port);
        assert!(mine[0].slots.is_empty());
    }
    for port in cluster.ports() {
        let info: String = query(port, &["CLUSTER", "INFO"]).unwrap();
        assert_eq!(
            info_field(&info, "cluster_state"),
            Some("ok"),
            "port {port}"
        );
    }
    assert_eq!(cluster.urls().len(), 6);

    for i in 0..40 {
        let key = format!("user:{i}");
        let owner = cluster.primary_for_key(&key);
        assert_eq!(owner, cluster.node_for_slot(key_slot(key.as_bytes())));
        set_on(owner.port, &key, "v").unwrap_or_else(|e| panic!("{key} on {}: {e}", owner.port));
        assert_eq!(get_on(owner.port, &key).as_deref(), Some("v"));
        // Any other primary redirects to the owner.
        let other = primaries.iter().find(|p| p.port != owner.port).unwrap();
        let err = set_on(other.port, &key, "v").expect_err("a non-owner accepted the key");
        assert_eq!(
            err.kind(),
            ErrorKind::Server(ServerErrorKind::Moved),
            "{err}"
        );
        assert_eq!(redirect_port(&err), Some(owner.port), "{err}");
    }
    // A lock and its fence share a slot, hence a node.
    assert_eq!(
        cluster.primary_for_key("lock:{invoice:42}"),
        cluster.primary_for_key("lock:{invoice:42}:fence")
    );

    let pids: Vec<u32> = cluster.nodes.iter().map(|n| n.server.pid()).collect();
    let dirs: Vec<_> = cluster
        .nodes
        .iter()
        .map(|n| n.server.dir().to_owned())
        .collect();
    drop(cluster);
    for pid in pids {
        assert!(!is_redis_process(pid), "pid {pid} survived the drop");
    }
    for dir in dirs {
        assert!(!dir.exists(), "{} survived the drop", dir.display());
    }
}

#[test]
fn killed_primary_fails_over_then_rejoins_as_a_replica() {
    let cluster = RedisCluster::start();
    let key = "lock:{failover}";
    let old = cluster.primary_for_key(key);
    let replica = cluster
        .replicas()
        .into_iter()
        .find(|r| r.primary == Some(old.port))
        .unwrap();
    let mut con = connect(old.port).unwrap();
    run::<()>(&mut con, &["SET", key, "v"]).unwrap();
    let acked: i64 = run(&mut con, &["WAIT", "1", "5000"]).unwrap();
    assert_eq!(acked, 1, "the replica did not acknowledge the write");

    let killed = Instant::now();
    cluster.kill(old.port);
    assert!(!cluster.node(old.port).is_running());
    let new = cluster.wait_for_failover(old.port);
    eprintln!("failover settled {:?} after the kill", killed.elapsed());
    assert_eq!(new, replica.port);
    assert_eq!(cluster.primary_for_key(key).port, new);
    assert_eq!(get_on(new, key).as_deref(), Some("v"));
    assert!(cluster.primaries().iter().all(|p| p.port != old.port));
    for port in cluster.ports().into_iter().filter(|&p| p != old.port) {
        let info: String = query(port, &["CLUSTER", "INFO"]).unwrap();
        assert_eq!(
            info_field(&info, "cluster_state"),
            Some("ok"),
            "port {port}"
        );
    }

    let restarted = Instant::now();
    cluster.restart(old.port);
    eprintln!("restart settled in {:?}", restarted.elapsed());
    let back = cluster
        .replicas()
        .into_iter()
        .find(|r| r.port == old.port)
        .expect("the old primary is back as a replica");
    assert_eq!(back.primary, Some(new));
    assert_ne!(back.pid, old.pid);
    assert_eq!(back.id, old.id);
    // Resynced from the new primary (reads on a replica need READONLY).
    let mut con = connect(old.port).unwrap();
    run::<()>(&mut con, &["READONLY"]).unwrap();
    let v: Option<String> = run(&mut con, &["GET", key]).unwrap();
    assert_eq!(v.as_deref(), Some("v"));
}

/// `SET` through a hand-made client that follows `MOVED` and `ASK`, as cluster clients do;
/// returns the port that took the write.
fn set_following_redirects(mut port: u16, key: &str, value: &str) -> Result<u16, String> {
    let mut asking = false;
    for _ in 0..5 {
        let mut con = connect(port)?;
        if asking {
            run::<()>(&mut con, &["ASKING"])?;
        }
        match cmd(&["SET", key, value]).query::<()>(&mut con) {
            Ok(()) => return Ok(port),
            Err(e) => {
                asking = e.kind() == ErrorKind::Server(ServerErrorKind::Ask);
                port = redirect_port(&e).ok_or_else(|| format!("SET {key} on {port}: {e}"))?;
            }
        }
    }
    Err(format!("SET {key}: too many redirects"))
}

#[test]
fn reshard_moves_a_given_range_while_a_client_writes() {
    let cluster = RedisCluster::start();
    let primaries = cluster.primaries();
    let (from, to) = (primaries[0].clone(), primaries[1].clone());
    let first = *from.slots[0].start();
    let range = first + 100..first + 300;
    let in_range = |k: &String| range.contains(&key_slot(k.as_bytes()));

    let before: Vec<String> = (0..)
        .map(|i| format!("before:{i}"))
        .filter(in_range)
        .take(50)
        .collect();
    for key in &before {
        set_on(from.port, key, key).unwrap();
    }

    // A client keeps writing keys of the range, through the move.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, range, start) = (Arc::clone(&stop), range.clone(), from.port);
        thread::spawn(move || {
            let mut written = Vec::new();
            let mut port = start;
            for key in (0..).map(|i| format!("during:{i}")) {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                if range.contains(&key_slot(key.as_bytes())) {
                    port = set_following_redirects(port, &key, &key).unwrap();
                    written.push(key);
                }
            }
            written
        })
    };
    let started = Instant::now();
    cluster.reshard(range.clone(), to.port);
    eprintln!(
        "reshard of {} slots settled in {:?}",
        range.len(),
        started.elapsed()
    );
    stop.store(true, Ordering::SeqCst);
    let during = writer.join().unwrap();
    assert!(!during.is_empty());

    assert_eq!(cluster.node_for_slot(range.start).port, to.port);
    assert_eq!(cluster.node_for_slot(range.end - 1).port, to.port);
    assert_eq!(cluster.node_for_slot(range.start - 1).port, from.port);
    assert_eq!(cluster.node_for_slot(range.end).port, from.port);
    let from_now = cluster
        .primaries()
        .into_iter()
        .find(|p| p.port == from.port)
        .unwrap();
    let last = *from.slots[0].end();
    assert_eq!(
        from_now.slots,
        vec![first..=range.start - 1, range.end..=last]
    );

    // Every key written before and during the move is served by the new owner.
    for key in before.iter().chain(&during) {
        assert_eq!(get_on(to.port, key).as_deref(), Some(key.as_str()), "{key}");
        assert_eq!(cluster.primary_for_key(key).port, to.port);
    }
    let err = set_on(from.port, &before[0], "x").expect_err("the old owner accepted a moved key");
    assert_eq!(redirect_port(&err), Some(to.port), "{err}");
}

#[test]
fn cluster_is_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<RedisCluster>();
    send_sync::<ClusterNode>();
}

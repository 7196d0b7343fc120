//! The process default locker can be a Redis Cluster (`LOCK_REDIS_CLUSTER`) with
//! `replicas(n)` (`LOCK_REDIS_REPLICAS`); one test per binary: the default locker is global.

use lock_runtime::{LockError, distributed_lock};
use lock_testing::RedisCluster;

// With a wait: the first call also connects to the cluster, which on a loaded machine can take
// longer than one attempt's bound (the connection goes on in the background meanwhile).
#[distributed_lock(name = "env-job:{n}", ttl = "2s", wait = "10s", guard = lease)]
async fn job(n: u32) -> Result<u64, LockError> {
    let _ = n;
    Ok(lease.fence())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_locker_is_a_cluster_from_the_environment() {
    let cluster = RedisCluster::start();
    // SAFETY: set before any thread reads the environment; this binary has one test.
    unsafe {
        std::env::set_var("LOCK_REDIS_CLUSTER", cluster.urls().join(","));
        std::env::set_var("LOCK_REDIS_REPLICAS", "1");
        std::env::set_var("LOCK_REDIS_URL", "redis://127.0.0.1:1");
    }
    let locker = lock_runtime::default_locker().expect("a valid environment");
    assert!(
        format!("{locker:?}").contains("Redis Cluster"),
        "{locker:?}"
    );
    for n in 0..20 {
        let fence = job(n).await.unwrap();
        assert!(fence > 0);
    }
    // The keys went to the primaries of their slots, each acknowledged by its replica.
    let key = locker.key_of("env-job:0");
    let owner = cluster.primary_for_key(&key).port;
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{owner}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(info.contains("cmdstat_wait:"), "{info}");
}

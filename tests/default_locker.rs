//! The process default locker comes from `LOCK_REDIS_URL`, and says so once, at INFO (one test
//! per binary: it is global).

pub mod support;

use std::time::Duration;

use lock_runtime::LockOptions;
use lock_testing::RedisServer;

#[tokio::test]
async fn default_locker_is_made_from_lock_redis_url() {
    let server = RedisServer::start();
    // SAFETY: set before any thread reads the environment; this binary has one test.
    unsafe {
        std::env::set_var("LOCK_REDIS_URL", server.url());
        std::env::set_var("REDIS_URL", "redis://127.0.0.1:1");
    }
    let mut made = None;
    let logs = support::capture_logs(async {
        made = Some(lock_runtime::default_locker().expect("a valid URL"));
        // Asked again: the same locker, and nothing more logged.
        lock_runtime::default_locker().expect("made already");
    })
    .await;
    let locker = made.unwrap();
    assert_eq!(
        logs,
        [format!(
            "INFO lock_runtime: message=default locker made deployment=\"one server, {}\" \
             from=\"LOCK_REDIS_URL\"",
            server.url()
        )]
    );
    assert!(
        format!("{locker:?}").contains(&server.port().to_string()),
        "{locker:?}"
    );
    let lease = locker
        .acquire("default", &LockOptions::new(Duration::from_secs(1)))
        .await
        .unwrap();
    assert!(lease.fence() > 0);
    lease.release().await.unwrap();
    // Once made, it cannot be replaced.
    assert!(lock_runtime::set_default_locker(locker).is_err());
}

//! A bad `LOCK_REDIS_URL` is a `Config` error through each locked call's output, never a panic
//! (one test per binary: the default locker is global).

use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(name = "bad-url:{n}", ttl = "1s")]
async fn with_result(n: u32) -> Result<u32, LockError> {
    Ok(n)
}

#[distributed_lock(name = "bad-url-job", ttl = "1s")]
async fn job(ran: &std::sync::atomic::AtomicBool) {
    ran.store(true, std::sync::atomic::Ordering::SeqCst);
}

#[tokio::test]
async fn a_bad_url_in_the_environment_is_a_config_error_not_a_panic() {
    // SAFETY: set before any thread reads the environment; this binary has one test.
    unsafe { std::env::set_var("LOCK_REDIS_URL", "not a url") };
    let err = lock_runtime::default_locker().unwrap_err();
    assert!(
        matches!(&err, LockError::Config { message, .. } if message.contains("LOCK_REDIS_URL")),
        "{err}"
    );
    // Every call reports it, named after its lock, and the body never runs.
    for n in [1, 2] {
        let err = with_result(n).await.unwrap_err();
        assert_eq!(err.lock_name(), format!("bad-url:{n}"));
        let text = err.to_string();
        assert!(
            text.contains("LOCK_REDIS_URL") && text.contains("invalid Redis URL"),
            "{text}"
        );
    }
    // A `()` job logs and returns.
    let ran = std::sync::atomic::AtomicBool::new(false);
    job(&ran).await;
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
}

//! Connecting to a server: bad URLs and unreachable servers fail fast naming the address,
//! credentials in the URL are used and never printed, and a locker reconnects by itself after
//! the server restarts.

use crate::support;

use lock_runtime::{LockError, Locker};
use support::{Env, acquire_retrying, assert_mentions, cycle, ms, opts, timed};

#[tokio::test]
async fn bad_urls_and_unreachable_servers_fail_fast_with_the_address() {
    let err = Locker::connect("http://127.0.0.1:1").await.unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    assert!(err.to_string().contains("http://127.0.0.1:1"), "{err}");
    // A port with nothing listening.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (connected, took) = timed(Locker::connect(&format!("redis://127.0.0.1:{port}"))).await;
    let err = connected.unwrap_err();
    assert!(took < ms(3_000), "connect took {took:?}");
    assert!(matches!(err, LockError::Redis { .. }), "{err}");
    assert_mentions(&err, &[&format!("127.0.0.1:{port}")]);
    // A lazily built locker fails at the lock call, naming the lock and the address.
    let locker = Locker::builder()
        .url(format!("redis://127.0.0.1:{port}"))
        .build()
        .unwrap();
    let err = locker.acquire("nowhere", &opts(1_000)).await.unwrap_err();
    assert_mentions(&err, &["nowhere", &port.to_string()]);
}

#[tokio::test]
async fn the_locker_reconnects_after_the_server_restarts() {
    let env = Env::start().await;
    let before = env.locker.acquire("after", &opts(1_000)).await.unwrap();
    let fence_before = before.fence();
    before.release().await.unwrap();
    env.server.restart();
    // The first call after the restart may see the dropped connection; it must not stay broken.
    let reconnecting = |e: &LockError| matches!(e, LockError::Redis { .. });
    let lease = acquire_retrying(&env.locker, "after", &opts(1_000), reconnecting)
        .await
        .expect("the locker reconnects by itself");
    // Scripts are re-loaded on the fresh server (EVALSHA falls back on NOSCRIPT), and the fence
    // keeps growing although the server lost its counter: it restarts from the server's clock.
    assert!(
        lease.fence() > fence_before,
        "fence went back: {} after {fence_before}",
        lease.fence()
    );
    lease.release().await.unwrap();
}

#[cfg(not(feature = "tls"))]
#[tokio::test]
async fn tls_urls_without_tls_support_say_so() {
    let err = Locker::builder()
        .url("rediss://127.0.0.1:6390")
        .build()
        .unwrap_err();
    println!("{err}");
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    assert!(err.to_string().contains("rediss://127.0.0.1:6390"), "{err}");
}

#[tokio::test]
async fn credentials_in_the_url_are_used_and_never_printed() {
    let server = lock_testing::RedisServer::start_with(&["--requirepass", "s3cret"]);
    let url = format!("redis://:s3cret@127.0.0.1:{}", server.port());
    let locker = Locker::connect(&url).await.expect("authenticated");
    cycle(&locker, "auth", &opts(1_000)).await;
    assert!(!format!("{locker:?}").contains("s3cret"));
    let wrong = format!("redis://:wrong@127.0.0.1:{}", server.port());
    let err = Locker::connect(&wrong).await.unwrap_err();
    assert_mentions(&err, &[&format!("127.0.0.1:{}", server.port())]);
    assert!(
        !err.to_string().contains(":wrong@"),
        "the password leaked: {err}"
    );
}

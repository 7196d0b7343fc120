//! `rediss://` through the `tls` feature, against a redis-server serving TLS with a test CA.
#![cfg(feature = "tls")]

use std::time::Duration;

use lock_runtime::{LockError, LockOptions, Locker};
use lock_testing::RedisServer;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn tls_server() -> (RedisServer, u16) {
    let tls_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (cert, key, ca) = (
        format!("{FIXTURES}/tls-server.pem"),
        format!("{FIXTURES}/tls-server-key.pem"),
        format!("{FIXTURES}/tls-ca.pem"),
    );
    let port = tls_port.to_string();
    let server = RedisServer::start_with(&[
        "--tls-port",
        &port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ]);
    (server, tls_port)
}

#[tokio::test]
async fn rediss_urls_work_with_a_private_root_certificate() {
    let (_server, port) = tls_server();
    let ca = std::fs::read(format!("{FIXTURES}/tls-ca.pem")).unwrap();
    let locker = Locker::builder()
        .url(format!("rediss://127.0.0.1:{port}"))
        .tls_root_cert(ca)
        .connect()
        .await
        .expect("TLS connection");
    let opts = LockOptions::new(Duration::from_secs(1));
    let lease = locker.acquire("tls", &opts).await.unwrap();
    assert!(lease.fence() > 0);
    // A waiter over TLS is woken by the release message too (the pub/sub connection is TLS as well).
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move {
            locker
                .acquire(
                    "tls",
                    &LockOptions::new(Duration::from_secs(10)).with_wait(Duration::from_secs(5)),
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    lease.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
}

#[tokio::test]
async fn an_untrusted_server_certificate_is_refused() {
    let (_server, port) = tls_server();
    // The system trust store does not know the test CA.
    let err = Locker::connect(&format!("rediss://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Redis { .. }), "{err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}

//! What a new user hits first: a port that is not Redis, a server that never answers, a
//! `rediss://` URL in a build without TLS.

use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockOptions, Locker};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A listener that answers every connection like an HTTP server that does not understand it.
async fn http_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let _ = conn
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    port
}

/// A listener that accepts connections and never writes a byte.
async fn silent_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_redis_is_one_line_that_says_so() {
    let url = format!("redis://127.0.0.1:{}", http_server().await);
    let err = Locker::connect(&url).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LockError::Config { .. }), "{err:?}");
    assert!(!text.contains('\n'), "one line: {text}");
    assert!(text.contains("does not speak the Redis protocol"), "{text}");
    // Through a lock call too, named after the lock, and not retried for the whole wait.
    let locker = Locker::builder().url(&url).build().unwrap();
    let started = Instant::now();
    let opts = LockOptions::new(Duration::from_secs(5)).with_wait(Duration::from_secs(5));
    let err = locker.acquire("job", &opts).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let text = err.to_string();
    assert!(
        text.starts_with("lock `job`: the server at") && !text.contains('\n'),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_costs_the_wait_plus_one_response_timeout() {
    let url = format!("redis://127.0.0.1:{}", silent_server().await);
    // A long connect timeout: before each attempt was bounded as a whole, the first attempt
    // waited for it (5 s), far past the wait.
    let response = Duration::from_millis(300);
    let locker = Locker::builder()
        .url(&url)
        .connect_timeout(Duration::from_secs(5))
        .response_timeout(response)
        .build()
        .unwrap();
    for wait in [Duration::ZERO, Duration::from_millis(800)] {
        let opts = LockOptions::new(Duration::from_secs(5)).with_wait(wait);
        let started = Instant::now();
        let err = locker.acquire("job", &opts).await.unwrap_err();
        let took = started.elapsed();
        assert!(took >= wait, "{took:?}");
        // The bound, plus scheduling slack on a loaded machine.
        assert!(
            took < wait + response + Duration::from_millis(500),
            "wait {wait:?}: took {took:?}"
        );
        let text = err.to_string();
        assert!(text.contains("did not answer within 300ms"), "{text}");
    }
}

#[cfg(not(feature = "tls"))]
#[tokio::test]
async fn a_tls_url_without_the_tls_feature_names_it() {
    let err = Locker::builder()
        .url("rediss://127.0.0.1:6390")
        .build()
        .unwrap_err();
    assert!(
        err.to_string().contains("enable the `tls` feature"),
        "{err}"
    );
}

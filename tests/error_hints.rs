//! Each Redis error's advice fits the error: refused credentials and a database the server does
//! not have say what to check in the URL; only a server out of reach is told to be checked for
//! being up.

use std::time::Duration;

use lock_runtime::{LockError, LockOptions, Locker};
use lock_testing::RedisServer;

const CREDENTIALS: &str = "check the user and password in the URL";
const UP: &str = "check that the server is up and reachable";

/// The error of connecting to `url`, and of a lock call through a locker built on it.
async fn errors_of(url: &str) -> [LockError; 2] {
    let connect = Locker::connect(url).await.expect_err("connect must fail");
    let locker = Locker::builder().url(url).build().unwrap();
    let opts = LockOptions::new(Duration::from_secs(5));
    let acquire = locker
        .acquire("job", &opts)
        .await
        .expect_err("acquire must fail");
    [connect, acquire]
}

fn assert_advice(err: &LockError, advice: &str, url: &str) {
    let text = err.to_string();
    assert!(matches!(err, LockError::Redis { .. }), "{url}: {err:?}");
    assert!(text.contains(advice), "{url}: {text}");
    if advice != UP {
        assert!(!text.contains("up and reachable"), "{url}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_say_to_check_the_user_and_password() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let port = server.port();
    let good = format!("redis://:s3cret@127.0.0.1:{port}");
    Locker::connect(&good)
        .await
        .expect("the right password connects");
    for url in [
        format!("redis://:wrong@127.0.0.1:{port}"),
        format!("redis://nobody:s3cret@127.0.0.1:{port}"),
        // No password at all: the server asks for one.
        format!("redis://127.0.0.1:{port}"),
    ] {
        let [connect, acquire] = errors_of(&url).await;
        assert_advice(&connect, CREDENTIALS, &url);
        assert_advice(&acquire, CREDENTIALS, &url);
        assert_eq!(acquire.lock_name(), "job");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_out_of_range_says_to_check_the_db_in_the_url() {
    let server = RedisServer::start();
    Locker::connect(&format!("{}/15", server.url()))
        .await
        .expect("the last of 16 databases connects");
    let url = format!("{}/99", server.url());
    let [connect, acquire] = errors_of(&url).await;
    for err in [&connect, &acquire] {
        assert_advice(err, "check the /db at the end of the URL", &url);
        assert!(err.to_string().contains("`databases` setting"), "{err}");
    }
    assert_eq!(acquire.lock_name(), "job");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_says_to_check_that_the_server_is_up() {
    // A port that was free a moment ago and that nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let [connect, acquire] = errors_of(&url).await;
    assert_advice(&connect, UP, &url);
    assert_advice(&acquire, UP, &url);
}

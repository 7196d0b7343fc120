//! Each Redis error's advice fits the error: refused credentials and a database the server does
//! not have say what to check in the URL; only a server out of reach is told to be checked for
//! being up. Each message says what happened in this call, once: a busy lock says whether the
//! call waited, a failed connection names its cause once (in the message, not again down the
//! `source()` chain) and no empty lock name, and a bad URL says what is wrong in this library's
//! words.

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

/// A free port that nobody listens on.
fn refused_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The error and its causes, as `anyhow`'s `{:#}` prints them.
fn with_causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(next) = cause {
        text = format!("{text}: {next}");
        cause = next.source();
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_lock_says_whether_the_call_waited() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url()).await.unwrap();
    let opts = LockOptions::new(Duration::from_secs(5));
    let held = locker.acquire("report", &opts).await.unwrap();

    let tried = locker.acquire("report", &opts).await.unwrap_err();
    assert!(
        matches!(tried, LockError::Busy { wait, .. } if wait.is_zero()),
        "{tried:?}"
    );
    assert_eq!(
        tried.to_string(),
        "lock `report` is busy: another holder has it, and this call tried once (it has no \
         `wait`); retry later, or give it a `wait`"
    );

    let waiting = opts.with_wait(Duration::from_millis(30));
    let waited = locker.acquire("report", &waiting).await.unwrap_err();
    assert_eq!(
        waited.to_string(),
        "lock `report` is busy: another holder kept it through this call's whole wait of 30ms; \
         retry later or raise `wait`"
    );
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_error_says_its_cause_once_and_no_empty_name() {
    let url = format!("redis://127.0.0.1:{}", refused_port());
    let [connect, acquire] = errors_of(&url).await;
    for err in [&connect, &acquire] {
        // The cause once, in the message; the chain adds nothing to say it again.
        let text = with_causes(err);
        assert_eq!(text.matches("Connection refused").count(), 1, "{text}");
        assert!(std::error::Error::source(err).is_none(), "{err:?}");
        assert_eq!(text, err.to_string());
    }
    let debug = format!("{connect:?}");
    assert!(
        debug.starts_with("Redis { addr: \"127.0.0.1:") && !debug.contains("name"),
        "{debug}"
    );
    assert!(
        format!("{acquire:?}").starts_with("Redis { name: \"job\", addr: "),
        "{acquire:?}"
    );
}

#[tokio::test]
async fn a_bad_url_says_what_is_wrong_in_the_librarys_words() {
    let cases = [
        (
            "http://127.0.0.1:1",
            "invalid Redis URL `http://127.0.0.1:1`: `http://` is not a Redis scheme; use \
             redis:// (rediss:// for TLS, unix:// for a socket)",
        ),
        (
            "127.0.0.1:6379",
            "invalid Redis URL `127.0.0.1:6379`: no scheme; write redis://127.0.0.1:6379",
        ),
        (
            "redis://cache:99999",
            "invalid Redis URL `redis://cache:99999`: `99999` is not a port number (1 to \
             65535); write it like redis://[user:password@]host:port[/db]",
        ),
        (
            "redis://:s3cret@cache:6379/x",
            "invalid Redis URL `redis://***@cache:6379/x`: `/x` is not a database number; end \
             the URL with /0 to /15 (or leave it out for 0)",
        ),
    ];
    for (url, said) in cases {
        let err = Locker::connect(url).await.expect_err(url);
        assert!(matches!(err, LockError::Config { .. }), "{err:?}");
        assert_eq!(err.to_string(), said);
        assert!(
            !format!("{err:?}").contains("InvalidClientConfig"),
            "{err:?}"
        );
    }
}

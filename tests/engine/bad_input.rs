//! Bad input: a lock key of another type is `NotALock` and left untouched, invalid options are
//! config errors naming the rule, and lock errors convert into I/O errors.

use crate::support;

use std::time::Duration;

use lock_runtime::{LockError, LockOptions};
use support::{Env, assert_mentions, ms, opts, query};

#[tokio::test]
async fn a_key_of_another_type_is_an_error_and_left_untouched() {
    let env = Env::start().await;
    let key = env.key("wrongtype");
    let _: i64 = query(&env.raw, redis::cmd("RPUSH").arg(&key).arg("a").arg("b")).await;
    let err = env
        .locker
        .acquire("wrongtype", &opts(1_000).with_wait(ms(200)))
        .await
        .unwrap_err();
    let LockError::NotALock { key: named, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(named, &key, "{err}");
    assert_mentions(
        &err,
        &["wrongtype", "list", "another lock name or key prefix"],
    );
    let len: i64 = query(&env.raw, redis::cmd("LLEN").arg(&key)).await;
    assert_eq!(len, 2, "the list was touched");
    // A fence counter of another type: the lock key is not left behind either.
    let fence_key = format!("{}:fence", env.key("badfence"));
    let () = query(
        &env.raw,
        redis::cmd("SET").arg(&fence_key).arg("not a number"),
    )
    .await;
    let err = env
        .locker
        .acquire("badfence", &opts(1_000))
        .await
        .unwrap_err();
    let LockError::NotALock { key: named, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(named, &fence_key, "{err}");
    assert!(!env.exists(&env.key("badfence")).await);
    assert_eq!(env.get(&fence_key).await.as_deref(), Some("not a number"));
}

#[tokio::test]
async fn invalid_options_are_config_errors_naming_the_rule() {
    let env = Env::start().await;
    let cases: [(LockOptions, &str); 8] = [
        (opts(0), "ttl"),
        (
            LockOptions::new(Duration::from_micros(1500)),
            "whole number of milliseconds",
        ),
        (opts(1_000).with_max_exec(ms(995)), "max_exec"),
        (opts(1_000).with_renew(ms(600)), "renew"),
        (opts(1_000).with_min_hold(ms(2_000)), "min_hold"),
        (
            opts(1_000).with_lease(ms(2_000)),
            "lease = 2s must be at most ttl",
        ),
        (
            opts(60_000).with_lease(ms(300)).with_renew(ms(200)),
            "renew = 200ms is too long for lease = 300ms",
        ),
        (
            opts(60_000).with_lease(Duration::from_micros(300_500)),
            "lease = 300.5ms must be a whole number of milliseconds",
        ),
    ];
    for (o, rule) in cases {
        let err = env.locker.acquire("opts", &o).await.unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err}");
        assert_mentions(&err, &[rule, "opts"]);
        assert!(o.validate().is_err());
    }
    assert!(!env.exists(&env.key("opts")).await);
}

#[tokio::test]
async fn lock_errors_convert_into_io_errors() {
    fn io_path(e: LockError) -> std::io::Result<()> {
        Err(e)?
    }
    let err = io_path(LockError::Busy {
        name: "n".into(),
        waited: ms(1),
        wait: ms(0),
    })
    .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
    assert!(err.to_string().contains("`n`"));
}

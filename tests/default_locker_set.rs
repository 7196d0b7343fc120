//! A default locker given to `set_default_locker` says so once, at INFO, with its deployment and
//! no credentials (one test per binary: the default locker is global).

pub mod support;

use lock_runtime::Locker;

#[tokio::test]
async fn a_default_locker_set_by_hand_is_logged_once() {
    // Built, not connected: nothing listens there.
    let locker = Locker::builder()
        .urls([
            "redis://:s3cret@127.0.0.1:1",
            "redis://127.0.0.1:2",
            "redis://127.0.0.1:3",
        ])
        .build()
        .unwrap();
    let mut second = None;
    let logs = support::capture_logs(async {
        lock_runtime::set_default_locker(locker.clone()).expect("the first default");
        second = Some(lock_runtime::set_default_locker(locker));
        lock_runtime::default_locker().expect("the one set");
    })
    .await;
    assert!(second.unwrap().is_err(), "a second default is refused");
    assert_eq!(
        logs,
        [
            "INFO lock_runtime: message=default locker made deployment=\"Redlock over 3 servers: \
             redis://***@127.0.0.1:1, redis://127.0.0.1:2, redis://127.0.0.1:3\" \
             from=\"set_default_locker\""
        ]
    );
}

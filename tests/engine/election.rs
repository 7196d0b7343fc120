//! Leader election: campaigners in processes of their own take the lead one at a time, in
//! arrival order; a leader that is killed is replaced within its lease, one that is paused is
//! replaced and its late write refused by the fence, one that resigns hands over at once; a
//! watcher in another process sees each change.

use crate::support;

use std::time::Duration;

use lock_runtime::{LeaderWatch, LockInfo, LockOptions};
use lock_testing::RedisServer;
use support::holder::{Holder, field};
use support::{Env, ms};

/// The campaigners' lease: a dead leader is replaced within it.
const LEASE_MS: u64 = 1_000;

fn campaigner(env: &Env, store: &RedisServer, client: &str) -> Holder {
    let args = [
        ("redis", env.server.url()),
        ("store", store.url()),
        ("name", "leader".to_owned()),
        ("client", client.to_owned()),
        ("ttl", LEASE_MS.to_string()),
    ];
    Holder::spawn("lead", &args)
}

/// The next leader the watcher reports that is one of `candidates` (skipping `None` and others),
/// and its index there.
async fn next_leader(watch: &mut LeaderWatch, candidates: &[Holder]) -> (usize, LockInfo) {
    let found = tokio::time::timeout(ms(10_000), async {
        loop {
            let Some(info) = watch.changed().await.expect("watch") else {
                continue;
            };
            let pid = info.holder.as_ref().map(|h| h.pid);
            if let Some(i) = candidates.iter().position(|c| Some(c.pid()) == pid) {
                return (i, info);
            }
        }
    })
    .await;
    found.expect("a new leader among the candidates within 10 s")
}

/// Its `leading fence=` line: the term.
async fn term(leader: &mut Holder) -> u64 {
    let line = leader.expect("leading", ms(10_000)).await;
    field(&line, "fence").parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaders_follow_one_another_on_death_pause_and_resignation() {
    let env = Env::start().await;
    let store = RedisServer::start();
    let mut watch = env.locker.observe("leader").with_fallback(ms(50));
    assert!(watch.changed().await.unwrap().is_none(), "nobody leads yet");
    let mut c = vec![
        campaigner(&env, &store, "a"),
        campaigner(&env, &store, "b"),
        campaigner(&env, &store, "c"),
    ];

    // One leads; killed, it is replaced by another, with a higher term.
    let (first, _) = next_leader(&mut watch, &c).await;
    let first_term = term(&mut c[first]).await;
    let killed = tokio::time::Instant::now();
    c[first].kill();
    let (second, _) = next_leader(&mut watch, &c).await;
    assert_ne!(second, first);
    let second_term = term(&mut c[second]).await;
    eprintln!("killed leader replaced after {:?}", killed.elapsed());
    assert!(second_term > first_term);

    // Paused, it is replaced; resumed, its write (sent while it was paused) is refused.
    c[second].pause().await;
    c[second].send_line("write");
    let (third, _) = next_leader(&mut watch, &c).await;
    assert!(third != first && third != second);
    let third_term = term(&mut c[third]).await;
    assert!(third_term > second_term);
    c[third].send_line("write");
    let wrote = c[third].expect("wrote", ms(5_000)).await;
    assert_eq!(field(&wrote, "accepted"), "true", "{wrote}");
    c[second].resume().await;
    let stale = c[second].expect("wrote", ms(5_000)).await;
    assert_eq!(field(&stale, "fence"), second_term.to_string());
    assert_eq!(
        field(&stale, "accepted"),
        "false",
        "a stale leader's write: {stale}"
    );

    // A new campaigner queues; the leader resigns and it leads at once.
    c.push(campaigner(&env, &store, "d"));
    c[3].expect("ready", ms(5_000)).await;
    support::eventually(ms(5_000), "the new campaigner queued", || async {
        let info = env.locker.inspect("leader").await.unwrap();
        info.is_some_and(|i| !i.waiters.is_empty())
    })
    .await;
    c[third].send_line("resign");
    c[third].expect("resigned", ms(5_000)).await;
    let (fourth, _) = next_leader(&mut watch, &c).await;
    assert_eq!(fourth, 3);
    assert!(term(&mut c[3]).await > third_term);
}

#[tokio::test]
async fn a_bounded_campaign_gives_up_busy_and_an_unbounded_one_waits() {
    let env = Env::start().await;
    let opts = LockOptions::new(ms(2_000));
    let leader = env.locker.campaign("bounded", &opts).await.unwrap();
    let bounded = opts.with_wait(ms(100));
    let err = env.locker.campaign("bounded", &bounded).await.unwrap_err();
    assert!(matches!(err, lock_runtime::LockError::Busy { .. }), "{err}");
    let other = env.second_locker().await;
    let waiting = tokio::spawn(async move { other.campaign("bounded", &opts).await });
    support::eventually(ms(5_000), "the campaigner queued", || async {
        let info = env.locker.inspect("bounded").await.unwrap();
        info.is_some_and(|i| !i.waiters.is_empty())
    })
    .await;
    let first_term = leader.fence();
    leader.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(next.fence() > first_term);
}

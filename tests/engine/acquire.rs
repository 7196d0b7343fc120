//! Taking a lock: mutual exclusion with fences that grow in lock order, and the uncontended
//! path's commands (one round trip each way, scripts loaded once).

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use support::{Env, assert_increasing, cycle, ms, opts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_across_two_lockers_with_increasing_fences() {
    let env = Env::start().await;
    let lockers = [env.locker.clone(), env.second_locker().await];
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(std::sync::Mutex::new(Vec::new()));
    let o = opts(5_000).with_wait(ms(20_000));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let locker = lockers[t % 2].clone();
        let (inside, overlaps, fences) = (inside.clone(), overlaps.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..300 {
                locker
                    .run("exclusive", &o, async |lease| {
                        if inside.swap(true, Ordering::SeqCst) {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        fences.lock().unwrap().push(lease.fence());
                        tokio::task::yield_now().await;
                        inside.store(false, Ordering::SeqCst);
                    })
                    .await
                    .expect("section runs");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two holders were inside at once"
    );
    let fences = fences.lock().unwrap();
    assert_eq!(fences.len(), 2400);
    assert_increasing(&fences, "fences in lock order");
}

#[tokio::test]
async fn an_uncontended_cycle_is_one_round_trip_each_way_and_scripts_load_once() {
    let env = Env::start().await;
    let o = opts(5_000);
    // Warm up: the first release loads its script.
    cycle(&env.locker, "rt", &o).await;
    env.reset_stats().await;
    let lease = env.locker.acquire("rt", &o).await.unwrap();
    // One pipeline of plain commands: SET NX PX GET, TIME, GET of the fence counter. The queue
    // is not looked at.
    for (command, calls) in [
        ("set", 1),
        ("time", 1),
        ("get", 1),
        ("exists", 0),
        ("evalsha", 0),
    ] {
        assert_eq!(env.calls(command).await, calls, "acquire: {command}");
    }
    lease.release().await.unwrap();
    assert_eq!(env.calls("evalsha").await, 1, "release must be one EVALSHA");
    // Nobody waits: no release message.
    assert_eq!(env.calls("publish").await, 0);
    for _ in 0..50 {
        cycle(&env.locker, "rt", &o).await;
    }
    assert_eq!(env.calls("eval").await, 0, "scripts are never sent in full");
    assert_eq!(env.calls("script|load").await, 0, "scripts are loaded once");
    assert_eq!(env.calls("evalsha").await, 51);
    // The release recorded the last fence in the counter.
    let fence = cycle(&env.locker, "rt", &o).await;
    let counter: u64 = env
        .get(&format!("{}:fence", env.key("rt")))
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(counter, fence);
}

// scratch: 64 tasks, distinct names, attr or floor, for perf. usage: many <url> <kind> <secs>
use lock_runtime::{LockError, Locker, distributed_lock};
use std::time::{Duration, Instant};

#[distributed_lock(name = "{job}", ttl = "10s", locker = locker)]
async fn locked_noop(locker: &Locker, job: &str) -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = args[1].clone();
    let kind = args[2].clone();
    let secs: f64 = args[3].parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let locker = Locker::connect(&url).await.unwrap();
        let raw = redis::Client::open(url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
        let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0").query_async(&mut raw.clone()).await.unwrap();
        let until = Instant::now() + Duration::from_secs_f64(secs);
        let hs: Vec<_> = (0..64).map(|t| {
            let locker = locker.clone(); let mut raw = raw.clone(); let sha = sha.clone(); let kind = kind.clone();
            tokio::spawn(async move {
                let name = format!("many:{t}");
                let key = format!("lock:{{many:{t}}}");
                let mut n = 0u64;
                while Instant::now() < until {
                    if kind == "attr" { locked_noop(&locker, &name).await.unwrap(); }
                    else {
                        let tok = format!("{n:022x}");
                        let _: Option<String> = redis::cmd("SET").arg(&key).arg(&tok).arg("NX").arg("PX").arg(10000).query_async(&mut raw).await.unwrap();
                        let _: i64 = redis::cmd("EVALSHA").arg(&sha).arg(1).arg(&key).arg(&tok).query_async(&mut raw).await.unwrap();
                    }
                    n += 1;
                }
                n
            })
        }).collect();
        let mut total = 0; for h in hs { total += h.await.unwrap(); }
        println!("{kind}: {:.0} cycles/s", total as f64 / secs);
    });
}

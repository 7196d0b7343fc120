//! A lock holder in a process of its own, for the fault tests (`tests/faults.rs`, the crashed
//! holders of `tests/engine/permits.rs`, `tests/engine/shared.rs` and the soaks): pausing or killing it is a
//! real process pause or crash, renewal watchdog included.
//!
//! ```text
//! lock_holder MODE key=value...
//!   redis=URL     the lock server                      (required)
//!   store=URL     the fenced store's server            (modes attr, lead, stale, stale-async)
//!   name=NAME     lock name, also the store's name     (default "suite")
//!   client=ID     this holder's name in the history    (default "holder")
//!   ttl=MS        the manual API's ttl                 (default 300)
//!   lease=MS      the manual API's lease               (default: the ttl)
//!   permits=N     the manual API's permits             (default 1)
//!   shared=1      the manual API takes a shared hold     (default: exclusive)
//!   wait=MS       the manual API's wait for a busy lock  (default 0: try once)
//!   tasks=N       concurrent tasks                     (mode attr, default 4)
//!   sections=N    locked sections per task             (mode attr, default 200)
//!   hold=MS       body's pause before writing          (mode stale-async, default 150)
//! ```
//!
//! Modes:
//! - `attr`: `tasks` tasks each run `sections` locked sections through `#[distributed_lock]`
//!   (enter the store, yield, write); a busy lock is retried.
//! - `hold`: acquires by hand and holds until killed.
//! - `stale`: in a locked body, enters the store, prints `blocked`, then blocks its thread reading
//!   stdin; on a line, writes to the store at once with a blocking call. The test freezes the
//!   process (SIGSTOP) while it is blocked, so the write is a stale holder's write sent the moment
//!   it is resumed: the pause lands between the holder's last check and its write, the case
//!   fencing exists for, and the write cannot be cancelled before it is sent.
//! - `lead`: campaigns for `name` (`Locker::campaign`, `wait=0`: without bound), prints
//!   `leading fence=`, then reads stdin: `write` writes to the store under its term's fence at
//!   once, from the reading thread (`wrote fence= accepted=`), any other line resigns
//!   (`resigned`). Prints `lost reason=` when the lead ends first.
//! - `transfer`: moves one unit from account `from` to account `to`, `count` times (default
//!   1000), each under both accounts' locks (`Locker::run_all`), with fenced writes of the
//!   balances on the `store` server; prints `done transfers= refused=`.
//! - `stale-async`: in a locked body, enters the store, prints `entered`, sleeps `hold` ms, then
//!   writes asynchronously. The test freezes it wherever it happens to be.
//!
//! Every event is one line on stdout (`key=value` fields), flushed as it happens:
//! `ready`, `acquired fence= token=`, `entered fence= basis=`, `blocked`, `wrote fence= accepted=`,
//! `result ok` / `result err=<kind> msg=<text>`, `done sections= busy= errors=`.

#[path = "../../tests/support/fenced.rs"]
mod fenced;

use std::collections::HashMap;
use std::io::BufRead;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use fenced::{BlockingStore, FencedStore};
use lock_runtime::{LockError, LockOptions, Locker, distributed_lock};

struct Args(HashMap<String, String>);

impl Args {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn str(&self, key: &str, default: &str) -> String {
        self.get(key).unwrap_or(default).to_owned()
    }

    fn required(&self, key: &str) -> String {
        self.get(key)
            .unwrap_or_else(|| panic!("lock_holder: missing {key}=..."))
            .to_owned()
    }

    fn num(&self, key: &str, default: u64) -> u64 {
        self.get(key).map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("lock_holder: bad {key}={v}"))
        })
    }
}

#[derive(Debug)]
enum HolderError {
    Lock(LockError),
    Store(redis::RedisError),
}

impl From<LockError> for HolderError {
    fn from(e: LockError) -> Self {
        HolderError::Lock(e)
    }
}

impl From<redis::RedisError> for HolderError {
    fn from(e: redis::RedisError) -> Self {
        HolderError::Store(e)
    }
}

/// `result ...` for a locked call's outcome.
fn print_result<T>(res: &Result<T, HolderError>) {
    match res {
        Ok(_) => println!("result ok"),
        Err(HolderError::Lock(e)) => {
            let kind = match e {
                LockError::Busy { .. } => "busy",
                LockError::Lost { .. } => "lost",
                LockError::MaxExecExceeded { .. } => "max-exec",
                LockError::Redis { .. } => "redis",
                _ => "other",
            };
            println!("result err={kind} msg={}", e.to_string().replace('\n', " "));
        }
        Err(HolderError::Store(e)) => println!("result err=store msg={e}"),
    }
}

struct Section {
    store: FencedStore,
    client: String,
}

/// The section of the `attr` mode, through the attribute: a fenced read-modify-write.
#[distributed_lock(name = "{name}", ttl = "2s", wait = "30s", locker = locker, guard = lease)]
async fn locked_section(
    locker: &Locker,
    name: &str,
    section: &Section,
) -> Result<bool, HolderError> {
    let fence = lease.fence();
    let entered = section.store.enter(&section.client, fence).await?;
    tokio::task::yield_now().await;
    let written = section
        .store
        .write(&section.client, fence, entered.basis)
        .await?;
    Ok(written.accepted)
}

async fn attr(args: &Args, locker: Locker) -> ExitCode {
    let name = args.str("name", "suite");
    let client = args.str("client", "holder");
    let store = FencedStore::connect(&args.required("store"), &name)
        .await
        .expect("store connects");
    let (tasks, sections) = (args.num("tasks", 4), args.num("sections", 200));
    println!("ready");
    let mut handles = Vec::new();
    for t in 0..tasks {
        let section = Arc::new(Section {
            store: store.clone(),
            client: format!("{client}.{t}"),
        });
        let (locker, name) = (locker.clone(), name.clone());
        handles.push(tokio::spawn(async move {
            let (mut done, mut busy, mut errors) = (0u64, 0u64, 0u64);
            while done < sections {
                match locked_section(&locker, &name, &section).await {
                    Ok(_) => done += 1,
                    Err(HolderError::Lock(LockError::Busy { .. })) => busy += 1,
                    Err(e) => {
                        errors += 1;
                        println!("error task={t} {e:?}");
                        if errors > 10 {
                            break;
                        }
                    }
                }
            }
            (done, busy, errors)
        }));
    }
    let (mut done, mut busy, mut errors) = (0, 0, 0);
    for h in handles {
        let (d, b, e) = h.await.expect("task");
        done += d;
        busy += b;
        errors += e;
    }
    println!("done sections={done} busy={busy} errors={errors}");
    if errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The options of the modes that lock by hand: `ttl`, `permits`, `shared`, `wait`, and `lease`
/// when given.
fn manual_options(args: &Args) -> LockOptions {
    let opts = LockOptions::new(Duration::from_millis(args.num("ttl", 300)))
        .with_permits(args.num("permits", 1) as u32)
        .with_shared(args.num("shared", 0) == 1)
        .with_wait(Duration::from_millis(args.num("wait", 0)));
    match args.get("lease") {
        Some(_) => opts.with_lease(Duration::from_millis(args.num("lease", 0))),
        None => opts,
    }
}

async fn hold(args: &Args, locker: Locker) -> ExitCode {
    let opts = manual_options(args);
    println!("ready");
    let lease = locker
        .acquire(&args.str("name", "suite"), &opts)
        .await
        .expect("acquire");
    println!("acquired fence={} token={}", lease.fence(), lease.token());
    let reason = lease.lost().await;
    println!("lost reason={reason:?}");
    ExitCode::FAILURE
}

async fn stale(args: &Args, locker: Locker) -> ExitCode {
    let name = args.str("name", "suite");
    let client = args.str("client", "holder");
    let store_url = args.required("store");
    let store = FencedStore::connect(&store_url, &name)
        .await
        .expect("store connects");
    let mut blocking = BlockingStore::connect(&store_url, &name).expect("store connects");
    let opts = manual_options(args);
    println!("ready");
    let res: Result<(), HolderError> = locker
        .run(&name, &opts, async |lease| {
            let fence = lease.fence();
            println!("acquired fence={fence} token={}", lease.token());
            let entered = store.enter(&client, fence).await?;
            println!("entered fence={fence} basis={}", entered.basis);
            println!("blocked");
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line).expect("stdin");
            let written = blocking.write(&client, fence, entered.basis)?;
            println!("wrote fence={fence} accepted={}", written.accepted);
            Ok(())
        })
        .await
        .map_err(HolderError::from)
        .and_then(|r| r);
    print_result(&res);
    ExitCode::SUCCESS
}

async fn stale_async(args: &Args, locker: Locker) -> ExitCode {
    let name = args.str("name", "suite");
    let client = args.str("client", "holder");
    let store = FencedStore::connect(&args.required("store"), &name)
        .await
        .expect("store connects");
    let opts = manual_options(args);
    let hold = Duration::from_millis(args.num("hold", 150));
    println!("ready");
    let res: Result<(), HolderError> = locker
        .run(&name, &opts, async |lease| {
            let fence = lease.fence();
            println!("acquired fence={fence} token={}", lease.token());
            let entered = store.enter(&client, fence).await?;
            println!("entered fence={fence} basis={}", entered.basis);
            tokio::time::sleep(hold).await;
            let written = store.write(&client, fence, entered.basis).await?;
            println!("wrote fence={fence} accepted={}", written.accepted);
            Ok(())
        })
        .await
        .map_err(HolderError::from)
        .and_then(|r| r);
    print_result(&res);
    ExitCode::SUCCESS
}

async fn lead(args: &Args, locker: Locker) -> ExitCode {
    let name = args.str("name", "suite");
    let client = args.str("client", "holder");
    let mut store = BlockingStore::connect(&args.required("store"), &name).expect("store connects");
    println!("ready");
    let lease = locker
        .campaign(&name, &manual_options(args))
        .await
        .expect("campaign");
    let fence = lease.fence();
    println!("leading fence={fence}");
    // Stdin on a thread of its own. A write goes out from there at once, without asking whether
    // the lead still holds: a leader paused before its write sends it as it resumes, and only
    // the fence can refuse it.
    let (resign, mut resigned) = tokio::sync::mpsc::unbounded_channel();
    let reader = std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line.as_deref() {
                Ok("write") => {
                    // No read first: only whether the fence lets the write in is of interest.
                    let written = store.write(&client, fence, 0).expect("write");
                    println!("wrote fence={fence} accepted={}", written.accepted);
                }
                _ => {
                    let _ = resign.send(());
                    break;
                }
            }
        }
    });
    tokio::select! {
        _ = resigned.recv() => {
            lease.release().await.expect("resign");
            println!("resigned");
            ExitCode::SUCCESS
        }
        reason = lease.lost() => {
            println!("lost reason={reason:?}");
            // A write read meanwhile still goes out: the process lives until stdin closes.
            let _ = tokio::task::spawn_blocking(move || reader.join()).await;
            ExitCode::FAILURE
        }
    }
}

/// A fenced write of an account's balance: `KEYS[1]` the balance, `KEYS[2]` the highest fence
/// seen; `ARGV` the fence and the new balance. 1 when written, 0 when the fence is older than
/// one seen (a stale holder's write, refused).
const SET_BALANCE: &str = r"
local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < seen then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return 1
";

/// Moves one unit from account `from` to `to`, `count` times, each under both accounts' locks
/// (`Locker::run_all`, names given in that order), reading and writing the balances on the
/// store's server with each account's fence.
async fn transfer(args: &Args, locker: Locker) -> ExitCode {
    let (from, to) = (args.required("from"), args.required("to"));
    let count = args.num("count", 1_000);
    let store = redis::Client::open(args.required("store")).expect("store url");
    let conn = store
        .get_multiplexed_async_connection()
        .await
        .expect("store connects");
    let names = [format!("account:{from}"), format!("account:{to}")];
    let opts = manual_options(args);
    let set = redis::Script::new(SET_BALANCE);
    println!("ready");
    let (mut done, mut refused) = (0, 0);
    for _ in 0..count {
        let moved = locker
            .run_all(&names, &opts, async |leases| {
                let mut conn = conn.clone();
                let balance = |name: &str| format!("{{{name}}}:balance");
                let (a, b): (i64, i64) = redis::pipe()
                    .get(balance(&names[0]))
                    .get(balance(&names[1]))
                    .query_async(&mut conn)
                    .await?;
                let mut written = 0;
                for (i, value) in [(0, a - 1), (1, b + 1)] {
                    let name = &names[i];
                    let ok: i32 = set
                        .key(balance(name))
                        .key(format!("{{{name}}}:seen"))
                        .arg(leases[i].fence())
                        .arg(value)
                        .invoke_async(&mut conn)
                        .await?;
                    written += ok;
                }
                Ok::<_, redis::RedisError>(written)
            })
            .await;
        match moved {
            Ok(Ok(2)) => done += 1,
            Ok(Ok(_)) => refused += 1,
            Ok(Err(e)) => panic!("store: {e}"),
            Err(LockError::Busy { .. }) => {}
            Err(e) => panic!("lock: {e}"),
        }
    }
    println!("done transfers={done} refused={refused}");
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let mut argv = std::env::args().skip(1);
    let mode = argv.next().unwrap_or_default();
    let args = Args(
        argv.map(|a| {
            let (k, v) = a
                .split_once('=')
                .unwrap_or_else(|| panic!("lock_holder: `{a}` is not key=value"));
            (k.to_owned(), v.to_owned())
        })
        .collect(),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let locker = Locker::connect(&args.required("redis"))
            .await
            .expect("locker connects");
        match mode.as_str() {
            "attr" => attr(&args, locker).await,
            "hold" => hold(&args, locker).await,
            "lead" => lead(&args, locker).await,
            "transfer" => transfer(&args, locker).await,
            "stale" => stale(&args, locker).await,
            "stale-async" => stale_async(&args, locker).await,
            other => {
                eprintln!(
                    "lock_holder: unknown mode `{other}` (attr, hold, lead, stale, stale-async, transfer)"
                );
                ExitCode::from(2)
            }
        }
    })
}

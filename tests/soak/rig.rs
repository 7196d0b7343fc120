//! What every soak runs on, and the faults it injects: the lock server with two fault proxies in
//! front of it, four lockers, the fenced store on a server of its own, and the injector.

use std::time::Duration;

use lock_runtime::{LockState, Locker};
use lock_testing::{FaultProxy, RedisServer};
use tokio::time::Instant;

use crate::support::fenced::FencedStore;
use crate::support::history::Mode;
use crate::support::{Rng, eventually, ms, query, raw_connection};

/// The servers and proxies of a soak, its length and its seed.
pub struct Rig {
    pub secs: u64,
    pub seed: u64,
    pub server: RedisServer,
    _store_server: RedisServer,
    pub store: FencedStore,
    pub proxies: [FaultProxy; 2],
}

impl Rig {
    /// `SOAK_SECS` (else `default_secs`) and `SOAK_SEED` (else the clock) from the environment;
    /// the store `name`, empty, in `mode`.
    pub async fn start(name: &str, mode: Mode, default_secs: u64) -> Rig {
        let env = |key: &str| std::env::var(key).ok().and_then(|s| s.parse().ok());
        let secs = env("SOAK_SECS").unwrap_or(default_secs);
        let seed = env("SOAK_SEED").unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
        println!("soak {name}: {secs} s, SOAK_SEED={seed}");
        let server = RedisServer::start();
        let store_server = RedisServer::start();
        let store = FencedStore::connect(&store_server.url(), name)
            .await
            .unwrap();
        store.reset(mode).await.unwrap();
        let proxies = [
            FaultProxy::start(server.addr()).await,
            FaultProxy::start(server.addr()).await,
        ];
        Rig {
            secs,
            seed,
            server,
            _store_server: store_server,
            store,
            proxies,
        }
    }

    /// One locker straight to Redis, three through the proxies (one of them with a short
    /// response timeout).
    pub async fn lockers(&self) -> [Locker; 4] {
        let quick = Locker::builder()
            .url(self.proxies[0].url())
            .response_timeout(ms(300))
            .connect();
        [
            Locker::connect(&self.server.url()).await.unwrap(),
            Locker::connect(&self.proxies[0].url()).await.unwrap(),
            Locker::connect(&self.proxies[1].url()).await.unwrap(),
            quick.await.unwrap(),
        ]
    }

    pub fn length(&self) -> Duration {
        Duration::from_secs(self.secs)
    }
}

/// The runtime's task count and Redis's client list before the lockers connect.
pub struct Baseline {
    tasks: usize,
    clients: usize,
}

impl Baseline {
    pub fn take(rig: &Rig) -> Baseline {
        let tasks = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        let clients = tokio::task::block_in_place(|| other_clients(&rig.server.url()));
        Baseline { tasks, clients }
    }

    /// Once every locker is dropped: every task they started ends, every connection they opened
    /// closes.
    pub async fn assert_back(&self, rig: &Rig) {
        let metrics = tokio::runtime::Handle::current().metrics();
        eventually(
            Duration::from_secs(10),
            "the runtime's task count back to its baseline",
            || async { metrics.num_alive_tasks() <= self.tasks },
        )
        .await;
        let url = rig.server.url();
        eventually(
            Duration::from_secs(10),
            "Redis's client list back to its baseline",
            || async { tokio::task::block_in_place(|| other_clients(&url)) <= self.clients },
        )
        .await;
    }
}

/// Connections to `url` other than the one asking (blocking: no task of the runtime is used).
fn other_clients(url: &str) -> usize {
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut conn).unwrap();
    list.lines().filter(|l| !l.trim().is_empty()).count() - 1
}

/// How a fault takes a held key from under its holder, as an operator, eviction or a failover
/// would.
#[derive(Clone, Copy)]
pub enum Forcing {
    /// The lock's key, through `inspect` and `force_release`.
    Lock,
    /// One of the name's N permit keys, at random, deleted if held.
    Permit(u32),
    /// The lock's key of a read-write lock, deleted if held: by one exclusive holder, or by all
    /// the shared holders at once.
    ReadWrite,
    /// A name held in every mode: as `ReadWrite`, or as `Permit` with permit keys up to N, at
    /// random.
    Mixed(u32),
}

/// The Redis crash and restart from the older snapshot.
#[derive(Debug, Clone, Copy)]
pub struct Restart {
    /// The store's sequence number right before the kill, and right after the restart.
    pub before: u64,
    pub after: u64,
    /// The lock server's clock in µs right after the restart. A fence is at least the server's
    /// clock in µs when it is handed out, so the leases granted before the crash have fences
    /// below it.
    pub fence_floor: u64,
}

/// What the injector did.
#[derive(Default)]
pub struct Injected {
    pub faults: Vec<String>,
    pub restart: Option<Restart>,
    /// The keys taken from under their holders.
    pub forced: Vec<Forced>,
    /// The tokens of the permit holders whose lock's key (the permits' mark, which keeps the
    /// other modes out) was taken: their own keys stayed, so they learn of it only if the mark
    /// they renew changed meanwhile (another mode or N took the name), not if a holder of their
    /// N set it again first.
    pub unmarked: Vec<Forced>,
}

/// A held key the injector took: the token it held, and when it was taken.
pub struct Forced {
    pub token: String,
    pub at: Instant,
}

fn taken_now(tokens: Vec<String>) -> impl Iterator<Item = Forced> {
    let at = Instant::now();
    tokens.into_iter().map(move |token| Forced { token, at })
}

/// Random faults on `rig` until `until` (the soak began at `started`): proxy delays, blackholes
/// and resets, Redis frozen, held keys taken (`forcing`; at least one by a sixth of the way in),
/// and one Redis crash (`kill -9`) and restart that loads a snapshot taken a third of the way in.
pub async fn inject(
    rig: &Rig,
    locker: &Locker,
    name: &str,
    forcing: Forcing,
    (started, until): (Instant, Instant),
) -> Injected {
    let mut rng = Rng::new(rig.seed);
    let at = |part: u32| started + rig.length() / part;
    let (save_at, force_by) = (at(3), at(6));
    let restart_at = started + rig.length() * 2 / 3;
    let mut done = Injected::default();
    let mut saved = false;
    while Instant::now() < until {
        tokio::time::sleep(rng.ms(100, 600)).await;
        let now = Instant::now();
        let proxy = &rig.proxies[rng.below(2) as usize];
        if !saved && now >= save_at {
            let raw = raw_connection(&rig.server.url()).await;
            let () = query(&raw, &redis::cmd("SAVE")).await;
            done.faults.push("snapshot saved".to_owned());
            saved = true;
        } else if done.restart.is_none() && now >= restart_at {
            let (restart, fault) = restart(rig, locker, name).await;
            done.faults.push(fault);
            done.restart = Some(restart);
        } else if done.forced.is_empty() && now >= force_by {
            force(rig, locker, name, forcing, &mut rng, &mut done).await;
        } else {
            match rng.below(6) {
                5 => force(rig, locker, name, forcing, &mut rng, &mut done).await,
                fault => done.faults.push(hinder(rig, proxy, fault, &mut rng).await),
            }
        }
    }
    for p in &rig.proxies {
        p.pass();
    }
    done
}

/// Fault `fault` (0 to 4) of the network or of Redis, for a random time; what it was.
async fn hinder(rig: &Rig, proxy: &FaultProxy, fault: u64, rng: &mut Rng) -> String {
    let lasting = rng.ms(50, 700);
    match fault {
        0 => {
            let d = rng.ms(5, 80);
            proxy.delay(d);
            tokio::time::sleep(lasting).await;
            proxy.pass();
            format!("delay {d:?} for {lasting:?}")
        }
        1 => {
            proxy.blackhole();
            tokio::time::sleep(lasting).await;
            proxy.pass();
            format!("blackhole for {lasting:?}")
        }
        2 => {
            proxy.reset_all();
            "reset".to_owned()
        }
        3 => {
            let lasting = rng.ms(50, 500);
            tokio::task::block_in_place(|| rig.server.pause());
            tokio::time::sleep(lasting).await;
            tokio::task::block_in_place(|| rig.server.resume());
            format!("redis frozen for {lasting:?}")
        }
        _ => {
            proxy.delay(rng.ms(5, 50));
            tokio::time::sleep(lasting).await;
            proxy.reset_all();
            proxy.pass();
            format!("delay+reset {lasting:?}")
        }
    }
}

/// A held key taken from under its live holder: its call must not report success.
async fn force(
    rig: &Rig,
    locker: &Locker,
    name: &str,
    forcing: Forcing,
    rng: &mut Rng,
    done: &mut Injected,
) {
    let tokens: Vec<String> = match forcing {
        Forcing::Lock => force_release(locker, name).await.into_iter().collect(),
        Forcing::Permit(n) => {
            let key = format!("{}:permit:{}", locker.key_of(name), rng.below(u64::from(n)));
            delete_held(&rig.server.url(), &key)
                .await
                .into_iter()
                .collect()
        }
        Forcing::ReadWrite => {
            match delete_holders(&rig.server.url(), &locker.key_of(name), 0).await {
                Taken::Holders(tokens) | Taken::Mark(tokens) => tokens,
            }
        }
        Forcing::Mixed(n) if rng.below(2) == 0 => {
            let key = format!("{}:permit:{}", locker.key_of(name), rng.below(u64::from(n)));
            delete_held(&rig.server.url(), &key)
                .await
                .into_iter()
                .collect()
        }
        Forcing::Mixed(n) => {
            let key = locker.key_of(name);
            match delete_holders(&rig.server.url(), &key, n).await {
                Taken::Holders(tokens) => tokens,
                Taken::Mark(tokens) => {
                    done.faults
                        .push(format!("permits mark taken: {}", tokens.len()));
                    done.unmarked.extend(taken_now(tokens));
                    return;
                }
            }
        }
    };
    done.faults
        .push(format!("force-release: {}", !tokens.is_empty()));
    done.forced.extend(taken_now(tokens));
}

/// An operator's force-release of the lock's holder, as `lockctl release --force` makes it.
async fn force_release(locker: &Locker, name: &str) -> Option<String> {
    let info = locker.inspect(name).await.ok()??;
    match (info.holder, info.state) {
        (Some(holder), LockState::Held) => match locker.force_release(name, &info.value).await {
            Ok(true) => Some(holder.token),
            _ => None,
        },
        _ => None,
    }
}

/// Deletes `key` if it is held, as eviction would (nobody is told); the token it held.
pub async fn delete_held(url: &str, key: &str) -> Option<String> {
    const GET_DEL: &str =
        "local v = redis.call('GET', KEYS[1]) if v then redis.call('DEL', KEYS[1]) end return v";
    let raw = raw_connection(url).await;
    let value: Option<String> = query(&raw, redis::cmd("EVAL").arg(GET_DEL).arg(1).arg(key)).await;
    value.map(|v| v.split(';').next().unwrap_or_default().to_owned())
}

/// Who held the lock's key that [`delete_holders`] deleted.
pub enum Taken {
    /// The exclusive holder, or every shared one.
    Holders(Vec<String>),
    /// The permits' mark: the holders of the permit keys, whose own keys stay.
    Mark(Vec<String>),
}

/// Deletes the lock's key `key` if it is held, as eviction would; who held it: the exclusive
/// holder, every shared one, or, for the mark of a lock with permits, the holders of its first
/// `permits` permit keys.
pub async fn delete_holders(url: &str, key: &str, permits: u32) -> Taken {
    const GET_DEL: &str = "local v = redis.call('GET', KEYS[1]) \
        if not v then return {'holders'} end \
        redis.call('DEL', KEYS[1]) \
        if string.sub(v, 1, 7) == 'shared:' then \
          return {'holders', unpack(redis.call('ZRANGE', KEYS[2], 0, -1))} end \
        if string.sub(v, 1, 8) ~= 'permits:' then return {'holders', v} end \
        local held = {'mark'} \
        for i = 3, #KEYS do \
          local p = redis.call('GET', KEYS[i]) if p then held[#held + 1] = p end end \
        return held";
    let raw = raw_connection(url).await;
    let mut eval = redis::cmd("EVAL");
    eval.arg(GET_DEL)
        .arg(2 + permits)
        .arg(key)
        .arg(format!("{key}:readers"));
    for i in 0..permits {
        eval.arg(format!("{key}:permit:{i}"));
    }
    let mut values: Vec<String> = query(&raw, &eval).await;
    let mark = values.remove(0) == "mark";
    let tokens = values
        .into_iter()
        .map(|v| v.split(';').next().unwrap_or_default().to_owned())
        .collect();
    if mark {
        Taken::Mark(tokens)
    } else {
        Taken::Holders(tokens)
    }
}

/// Kills Redis and starts it again: it loads the older snapshot, and the fence counter comes
/// back behind.
async fn restart(rig: &Rig, locker: &Locker, name: &str) -> (Restart, String) {
    let before = rig.store.seq().await.unwrap();
    tokio::task::block_in_place(|| {
        rig.server.kill();
        rig.server.restart();
    });
    let raw = raw_connection(&rig.server.url()).await;
    let (secs, micros): (u64, u64) = query(&raw, &redis::cmd("TIME")).await;
    let fence_key = format!("{}:fence", locker.key_of(name));
    let counter: Option<u64> = query(&raw, redis::cmd("GET").arg(&fence_key)).await;
    let restart = Restart {
        before,
        after: rig.store.seq().await.unwrap(),
        fence_floor: secs * 1_000_000 + micros,
    };
    let fault = format!(
        "redis killed and restarted from the snapshot (fence counter {counter:?}, server clock \
         {} µs)",
        restart.fence_floor
    );
    (restart, fault)
}

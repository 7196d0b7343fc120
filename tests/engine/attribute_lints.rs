//! `#[distributed_lock]` expansions are clean under strict lints: `cargo clippy --all-targets --
//! -D warnings` checks this file with clippy's pedantic group on. The test itself only builds
//! futures (nothing is polled, so no Redis is needed).
#![deny(warnings)]
#![deny(clippy::all, clippy::pedantic)]

use std::fmt::Display;
use std::sync::{Arc, LazyLock};

use lock_runtime::{LockError, Locker, distributed_lock};

static LOCKER: LazyLock<Locker> = LazyLock::new(|| {
    Locker::builder()
        .url("redis://127.0.0.1:6379")
        .build()
        .expect("valid url")
});

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Parse(std::num::ParseIntError),
}

impl Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Lock(e) => e.fmt(f),
            AppError::Parse(e) => e.fmt(f),
        }
    }
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(e: std::num::ParseIntError) -> Self {
        AppError::Parse(e)
    }
}

#[distributed_lock(name = "invoice:{tenant}:{year}", ttl = "30s", wait = "5s", guard = lease)]
async fn with_guard(tenant: &str, year: u16, amount: &str) -> Result<u64, AppError> {
    let amount: u64 = amount.parse()?;
    if amount == 0 {
        return Ok(lease.fence());
    }
    tokio::task::yield_now().await;
    Ok(amount + lease.fence())
}

#[distributed_lock(
    name = "nightly",
    ttl = "1m 30s",
    max_exec = "1m",
    renew = "20s",
    wait = "0s",
    min_hold = "250ms",
    locker = LOCKER
)]
async fn scheduled() {}

#[distributed_lock(name = ["account:{from}", "account:{to}"], ttl = "10s", guard = leases)]
async fn two_names(from: u32, to: u32) -> Result<u64, LockError> {
    Ok(leases.iter().map(lock_runtime::Lease::fence).sum::<u64>() + u64::from(from + to))
}

#[distributed_lock(name = "warm:{shard}", ttl = "10s", fail_open)]
async fn warm(shard: u32) -> Result<u32, LockError> {
    Ok(shard)
}

#[distributed_lock(name = "literal:{r#type}:{a}-{b}", ttl = "10s")]
async fn patterns(r#type: &str, (a, b): (u32, u32)) -> Result<u32, LockError> {
    Ok(a + b + u32::try_from(r#type.len()).unwrap_or(0))
}

#[distributed_lock(name = "generic:{key}", ttl = "10s")]
async fn generic<K, V>(key: K, value: V) -> Result<V, LockError>
where
    K: Display + Send,
    V: Send,
{
    Ok(value)
}

#[distributed_lock(name = "impl:{shown}", ttl = "10s")]
async fn impl_trait(shown: impl Display + Send) -> Result<impl Display, AppError> {
    let n: u32 = "7".parse()?;
    Ok(n)
}

#[tracing::instrument]
#[distributed_lock(name = "instrumented:{id}", ttl = "10s")]
async fn instrumented_above(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(name = "instrumented:{id}", ttl = "10s")]
#[tracing::instrument]
async fn instrumented_below(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

struct Service {
    locker: Locker,
    name: String,
}

impl Service {
    #[distributed_lock(name = "svc:{id}", ttl = "10s", locker = self.locker)]
    async fn by_ref(&self, id: u32) -> Result<&str, LockError> {
        if id == 0 {
            return Ok("none");
        }
        Ok(&self.name)
    }

    #[distributed_lock(name = "svc", ttl = "10s", locker = self.locker, guard = lease)]
    async fn by_mut(&mut self) -> Result<(), LockError> {
        self.name.push_str(lease.name());
        Ok(())
    }

    #[distributed_lock(name = "svc-arc", ttl = "10s", locker = self.locker)]
    async fn by_arc(self: Arc<Self>) -> Result<usize, LockError> {
        Ok(self.name.len())
    }
}

trait Job {
    async fn run(&self) -> Result<u32, LockError>;
}

impl Job for Service {
    #[distributed_lock(name = "job", ttl = "10s", locker = self.locker)]
    async fn run(&self) -> Result<u32, LockError> {
        Ok(u32::try_from(self.name.len()).unwrap_or(u32::MAX))
    }
}

// Under `#[async_trait]` the attribute wraps the body inside async-trait's boxed future.
#[async_trait::async_trait]
trait Billing {
    async fn bill(&self, tenant: &str, (low, high): (u32, u32)) -> Result<u64, AppError>;
    async fn tick(&mut self);
}

#[async_trait::async_trait]
impl Billing for Service {
    #[distributed_lock(name = "bill:{tenant}:{low}-{high}", ttl = "10s", locker = self.locker, guard = lease)]
    async fn bill(&self, tenant: &str, (low, high): (u32, u32)) -> Result<u64, AppError> {
        let parsed: u64 = tenant.parse()?;
        tokio::task::yield_now().await;
        Ok(parsed + lease.fence() + u64::from(low + high))
    }

    #[distributed_lock(name = "tick", ttl = "10s", locker = self.locker)]
    async fn tick(&mut self) {
        self.name.push('.');
    }
}

fn assert_send<T: Send>(_: &T) {}

// A runtime, because building a `Locker` starts its connection tasks (they never connect here).
#[tokio::test]
async fn expansions_build_send_futures() {
    let future = with_guard("acme", 2024, "12");
    assert_send(&future);
    drop(future);
    assert_send(&scheduled());
    assert_send(&patterns("t", (1, 2)));
    assert_send(&two_names(1, 2));
    assert_send(&warm(1));
    assert_send(&generic(1, 2));
    assert_send(&impl_trait(3));
    assert_send(&instrumented_above(1));
    assert_send(&instrumented_below(1));
    let service = Service {
        locker: LOCKER.clone(),
        name: String::new(),
    };
    assert_send(&service.by_ref(1));
    assert_send(&service.run());
    assert_send(&service.bill("7", (1, 2)));
    let mut service = service;
    assert_send(&service.tick());
    assert_send(&service.by_mut());
    assert_send(&Arc::new(service).by_arc());
    assert_eq!(
        AppError::from("x".parse::<u8>().unwrap_err()).to_string(),
        "invalid digit found in string"
    );
}

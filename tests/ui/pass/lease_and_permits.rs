use lock_runtime::{LockError, distributed_lock};

// A two-hour job whose key expires 30 s after its last renewal (every 10 s by default).
#[distributed_lock(name = "nightly", ttl = "2h", lease = "30s")]
async fn nightly() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(name = "report", ttl = "10m", lease = "3s", renew = "1s500ms", max_exec = "9m")]
async fn report() -> Result<u32, LockError> {
    Ok(1)
}

// At most 5 calls at once across the fleet.
#[distributed_lock(name = "partner-api", ttl = "30s", permits = 5, wait = "10s")]
async fn partner_call() -> Result<(), LockError> {
    Ok(())
}

// Many readers or one writer: shared holds run together, an exclusive one alone.
#[distributed_lock(name = "catalog", ttl = "30s", shared, wait = "5s")]
async fn read_catalog() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(name = "catalog", ttl = "30s", shared = false, wait = "5s")]
async fn rebuild_catalog() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let _ = (nightly(), report(), partner_call());
    let _ = (read_catalog(), rebuild_catalog());
}

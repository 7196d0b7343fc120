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

fn main() {
    let _ = (nightly(), report());
}

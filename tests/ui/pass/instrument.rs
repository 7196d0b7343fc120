//! `#[tracing::instrument]` above or below the attribute.
use lock_runtime::{LockError, distributed_lock};

#[tracing::instrument]
#[distributed_lock(name = "above:{id}", ttl = "5s", guard = lease)]
async fn instrument_above(id: u32) -> Result<u64, LockError> {
    tracing::info!(fence = lease.fence(), "working");
    Ok(u64::from(id))
}

#[distributed_lock(name = "below:{id}", ttl = "5s")]
#[tracing::instrument(err)]
async fn instrument_below(id: u32) -> Result<u32, LockError> {
    tracing::info!("working");
    Ok(id)
}

#[tracing::instrument]
#[distributed_lock(name = "unit", ttl = "5s")]
async fn instrumented_unit() {}

fn main() {
    drop(instrument_above(1));
    drop(instrument_below(1));
    drop(instrumented_unit());
}

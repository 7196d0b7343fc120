use lock_runtime::distributed_lock;

// `renew` is judged against the key's expiry, `lease`, not against `ttl`.
#[distributed_lock(name = "nightly", ttl = "2h", lease = "30s", renew = "20s")]
async fn nightly() {}

fn main() {}

use lock_runtime::distributed_lock;

// The range of `permits` is a rule of lock-rules (tested there); a string is the parser's.
#[distributed_lock(name = "api", ttl = "30s", permits = "5")]
async fn quoted() {}

fn main() {}

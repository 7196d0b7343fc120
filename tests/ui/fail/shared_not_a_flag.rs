use lock_runtime::distributed_lock;

// `shared` with `permits` is a rule of lock-rules (tested there); a value is the parser's.
#[distributed_lock(name = "catalog", ttl = "30s", shared = 1)]
async fn not_a_flag() {}

fn main() {}

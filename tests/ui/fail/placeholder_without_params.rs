use lock_runtime::distributed_lock;

#[distributed_lock(name = "invoice:{tenant}", ttl = "10s")]
async fn close_books() {}

fn main() {}

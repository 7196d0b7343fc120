use lock_runtime::distributed_lock;

#[distributed_lock(name = "job", ttl = "10s")]
async fn job() -> u32 {
    1
}

fn main() {}

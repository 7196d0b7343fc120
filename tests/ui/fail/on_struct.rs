use lock_runtime::distributed_lock;

#[distributed_lock(name = "job", ttl = "10s")]
struct Job {
    id: u32,
}

fn main() {}

use lock_runtime::distributed_lock;

struct Service {
    url: String,
}

impl Service {
    #[distributed_lock(name = "job", ttl = "10s", locker = self.url)]
    async fn job(&self) {}
}

fn main() {}

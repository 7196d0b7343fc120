use lock_runtime::distributed_lock;

struct Tenant {
    id: u32,
}

impl Tenant {
    #[distributed_lock(name = "tenant:{self.id}", ttl = "10s")]
    async fn close(&self) {}
}

fn main() {}

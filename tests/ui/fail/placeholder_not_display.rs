use lock_runtime::distributed_lock;

struct TenantId(u32);

#[distributed_lock(name = "tenant:{tenant}", ttl = "10s")]
async fn job(tenant: TenantId) {}

fn main() {}

use lock_runtime::distributed_lock;

#[distributed_lock(name = "invoice:{tenat}", ttl = "10s")]
async fn close_books(tenant: &str, year: u16) {}

fn main() {}

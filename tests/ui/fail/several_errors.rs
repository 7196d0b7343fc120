use lock_runtime::distributed_lock;

// Every problem in the list is reported in one compile, each at its own argument.
#[distributed_lock(
    name = "job:{id}",
    ttl = "10s",
    max_exec = "1m",
    renew = "6s",
    wiat = "1s"
)]
fn job(id: u32) {}

fn main() {}

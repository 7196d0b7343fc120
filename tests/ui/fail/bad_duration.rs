use lock_runtime::distributed_lock;

#[distributed_lock(name = "job", ttl = "30")]
async fn no_unit() {}

#[distributed_lock(name = "job", ttl = "3x")]
async fn unknown_unit() {}

#[distributed_lock(name = "job", ttl = "10s", wait = "a while")]
async fn words() {}

#[distributed_lock(name = "job", ttl = "")]
async fn empty() {}

fn main() {}

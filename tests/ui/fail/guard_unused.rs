#![deny(unused_variables)]
use lock_runtime::distributed_lock;

// A guard that the body never reads is reported like any unused binding, at its name.
#[distributed_lock(name = "job", ttl = "10s", guard = lease)]
async fn job() {}

fn main() {}

use lock_runtime::distributed_lock;

// `{{` and `}}` would put braces into the key's Redis Cluster hash tag.
#[distributed_lock(name = "{{tenant}}:{id}", ttl = "10s")]
async fn job(id: u32) {}

#[distributed_lock(name = "job:{id}}}", ttl = "10s")]
async fn other(id: u32) {}

fn main() {}

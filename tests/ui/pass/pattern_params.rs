//! Parameters bound by patterns can be named in the key.
use lock_runtime::{LockError, distributed_lock};

struct Point {
    x: i32,
    y: i32,
}

struct Id(u64);

#[distributed_lock(name = "pair:{a}-{b}", ttl = "5s")]
async fn pair((a, b): (u32, u32)) -> Result<u32, LockError> {
    Ok(a + b)
}

#[distributed_lock(name = "point:{x}:{y}:{id}", ttl = "5s")]
async fn point(Point { x, y }: Point, Id(id): Id, mut count: u32) -> Result<i32, LockError> {
    count += 1;
    Ok(x + y + i32::try_from(id + u64::from(count)).unwrap_or(0))
}

#[distributed_lock(name = "ref:{v}", ttl = "5s")]
async fn by_ref(&v: &u8, _: u8) -> Result<u8, LockError> {
    Ok(v)
}

fn main() {
    drop(pair((1, 2)));
    drop(point(Point { x: 1, y: 2 }, Id(3), 0));
    drop(by_ref(&1, 2));
}

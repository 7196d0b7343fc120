//! Generic parameters, where clauses, `impl Trait` arguments and named lifetimes.
use std::fmt::Display;

use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(name = "item:{key}", ttl = "5s")]
async fn generic<K: Display + Send, V>(key: K, value: V) -> Result<V, LockError>
where
    V: Clone + Send,
{
    Ok(value.clone())
}

#[distributed_lock(name = "impl:{a}:{b}", ttl = "5s")]
async fn impl_args(a: impl Display, b: &impl Display) -> Result<String, LockError> {
    Ok(format!("{a}{b}"))
}

#[distributed_lock(name = "ref:{s}", ttl = "5s")]
async fn lifetimes<'a, 'b: 'a>(s: &'a str, t: &'b str) -> Result<&'a str, LockError> {
    Ok(if s.is_empty() { t } else { s })
}

fn main() {
    drop(generic(1u8, vec![1]));
    drop(impl_args(1, &"x"));
    drop(lifetimes("a", "b"));
}

//! Return types with elided and `'_` lifetimes: the turbofish leaves them to inference.
use lock_runtime::{LockError, distributed_lock};

struct Reader<'a>(&'a str);

struct Store {
    data: String,
}

impl Store {
    #[distributed_lock(name = "store", ttl = "5s")]
    async fn get(&self) -> Result<&str, LockError> {
        Ok(&self.data)
    }

    #[distributed_lock(name = "store", ttl = "5s")]
    async fn reader(&self) -> Result<Reader<'_>, LockError> {
        Ok(Reader(&self.data))
    }
}

#[distributed_lock(name = "first:{s}", ttl = "5s")]
async fn first(s: &str) -> Result<&str, LockError> {
    Ok(s.split(':').next().unwrap_or(s))
}

#[distributed_lock(name = "dyn", ttl = "5s")]
async fn boxed(s: &str) -> Result<Box<dyn std::fmt::Display + '_>, LockError> {
    Ok(Box::new(s))
}

fn main() {
    let store = Store { data: "x".into() };
    drop(store.get());
    drop(store.reader());
    drop(first("a:b"));
    drop(boxed("a"));
    let _ = |r: Reader<'_>| r.0.len();
}

//! Key templates: raw identifiers, repeated and adjacent placeholders.
use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(name = "literal:{r#type}:{id}{id}", ttl = "5s")]
async fn braces(r#type: &str, id: u8) -> Result<(), LockError> {
    let _ = r#type;
    Ok(())
}

#[distributed_lock(name = "{r#type}", ttl = "5s")]
async fn raw_placeholder(r#type: String) -> Result<String, LockError> {
    Ok(r#type)
}

#[distributed_lock(name = "ünï:{naïve}", ttl = "5s")]
async fn unicode(naïve: char) -> Result<char, LockError> {
    Ok(naïve)
}

// Names the macro uses internally do not clash with the user's.
#[distributed_lock(name = "{__lock_name}", ttl = "5s", guard = __lock_locker)]
async fn shadowing(__lock_name: u8, __lock_lease: u8) -> Result<u8, LockError> {
    let _ = __lock_locker.fence();
    Ok(__lock_name + __lock_lease)
}

fn main() {
    drop(braces("a", 1));
    drop(raw_placeholder("b".into()));
    drop(unicode('x'));
    drop(shadowing(1, 2));
}

//! Tokens and jitter: random enough to be unique and unsynchronised, without a system call per
//! lock (each thread seeds a fast generator once from the operating system).

use std::cell::Cell;

thread_local! {
    /// xorshift128+ state, seeded from the OS on first use in each thread.
    static STATE: Cell<(u64, u64)> = Cell::new(seed());
}

fn seed() -> (u64, u64) {
    let bits = uuid::Uuid::new_v4().as_u128();
    let (a, b) = ((bits >> 64) as u64, bits as u64);
    // Never all zero (the generator would stay there).
    (a | 1, b)
}

fn next() -> u64 {
    STATE.with(|state| {
        let (mut s1, s0) = state.get();
        let result = s0.wrapping_add(s1);
        s1 ^= s1 << 23;
        state.set((s0, s1 ^ s0 ^ (s1 >> 17) ^ (s0 >> 26)));
        result
    })
}

/// A fresh token: a version 4 UUID in its 32-hex-digit form.
#[cfg(test)]
pub(crate) fn token() -> String {
    let mut token = String::with_capacity(32);
    push_token(&mut token);
    token
}

/// Appends a fresh token to `out`.
pub(crate) fn push_token(out: &mut String) {
    let bytes = ((u128::from(next()) << 64) | u128::from(next())).to_be_bytes();
    let uuid = uuid::Builder::from_random_bytes(bytes).into_uuid();
    let mut buf = [0u8; 32];
    out.push_str(uuid.simple().encode_lower(&mut buf));
}

/// A number in `0..=n`.
pub(crate) fn up_to(n: u64) -> u64 {
    next() % n.saturating_add(1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_v4_uuids_and_differ() {
        let a = token();
        let b = token();
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        let parsed = uuid::Uuid::parse_str(&a).unwrap();
        assert_eq!(parsed.get_version_num(), 4);
        let many: std::collections::HashSet<String> = (0..10_000).map(|_| token()).collect();
        assert_eq!(many.len(), 10_000);
    }

    #[test]
    fn up_to_stays_in_range() {
        assert!((0..1000).all(|_| up_to(5) <= 5));
        assert_eq!(up_to(0), 0);
    }
}

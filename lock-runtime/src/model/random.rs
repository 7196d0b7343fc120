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

/// A fresh token stamped with `now_ms` (see [`push_token`]).
#[cfg(test)]
pub(crate) fn token() -> String {
    let mut token = String::with_capacity(TOKEN_LEN);
    push_token(&mut token, 1_765_000_000_000);
    token
}

/// The length of a token.
pub(crate) const TOKEN_LEN: usize = 22;

/// How many of a token's characters are its time stamp (48 bits of ms since the Unix epoch).
const STAMP_LEN: usize = 8;

/// The token alphabet: URL-safe base64, so no `;`, `=` or space (the value's separators).
pub(crate) const TOKEN_ALPHABET: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Appends a fresh token to `out`: `now_ms` (ms since the Unix epoch) in 8 characters, then 84
/// random bits in 14, all of the URL-safe base64 alphabet. 22 characters rather than a UUID's
/// 32 hex digits: with who took it, a value then stays within the 44 bytes Redis stores in one
/// allocation with its key object (for a short host name). The stamp lets an operator see
/// since when a lock is held (see [`stamp_of`]).
pub(crate) fn push_token(out: &mut String, now_ms: u64) {
    let mut buf = [0u8; TOKEN_LEN];
    for (i, byte) in buf[..STAMP_LEN].iter_mut().enumerate() {
        *byte = TOKEN_ALPHABET[((now_ms >> (6 * (STAMP_LEN - 1 - i))) & 63) as usize];
    }
    let mut bits = (u128::from(next()) << 64) | u128::from(next());
    for byte in &mut buf[STAMP_LEN..] {
        *byte = TOKEN_ALPHABET[(bits & 63) as usize];
        bits >>= 6;
    }
    // Pushed as one string, not char by char (each a UTF-8 encoding and a capacity check): the
    // alphabet is ASCII, so the check cannot fail.
    out.push_str(std::str::from_utf8(&buf).unwrap_or_default());
}

/// The time stamp of a token made by [`push_token`], in ms since the Unix epoch.
pub(crate) fn stamp_of(token: &str) -> Option<u64> {
    token.get(..STAMP_LEN)?.bytes().try_fold(0u64, |acc, b| {
        let digit = TOKEN_ALPHABET.iter().position(|&a| a == b)?;
        Some(acc << 6 | digit as u64)
    })
}

/// Appends `n` fresh hex digits to `out` (`n` at most 16).
pub(crate) fn push_hex(out: &mut String, n: usize) {
    let bits = next();
    out.extend(
        (0..n.min(16))
            .map(|i| char::from_digit(((bits >> (4 * i)) & 15) as u32, 16).unwrap_or('0')),
    );
}

/// A number in `0..=n`.
pub(crate) fn up_to(n: u64) -> u64 {
    next() % n.saturating_add(1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_22_url_safe_characters_and_differ() {
        let a = token();
        let b = token();
        assert_ne!(a, b);
        assert_eq!(a.len(), TOKEN_LEN);
        assert!(a.bytes().all(|c| TOKEN_ALPHABET.contains(&c)), "{a}");
        let many: std::collections::HashSet<String> = (0..10_000).map(|_| token()).collect();
        assert_eq!(many.len(), 10_000);
        // Every character of the alphabet turns up in the random part; the stamp reads back.
        let seen: std::collections::HashSet<u8> =
            many.iter().flat_map(|t| t[STAMP_LEN..].bytes()).collect();
        assert_eq!(seen.len(), 64);
        assert!(many.iter().all(|t| stamp_of(t) == Some(1_765_000_000_000)));
        let mut max = String::new();
        push_token(&mut max, (1 << 48) - 1);
        assert_eq!(stamp_of(&max), Some((1 << 48) - 1));
        let mut hex = String::new();
        push_hex(&mut hex, 16);
        assert_eq!(hex.len(), 16);
        assert!(hex.bytes().all(|c| c.is_ascii_hexdigit()), "{hex}");
    }

    #[test]
    fn up_to_stays_in_range() {
        assert!((0..1000).all(|_| up_to(5) <= 5));
        assert_eq!(up_to(0), 0);
    }
}

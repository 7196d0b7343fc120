//! The Redis Cluster hash slot of a key (a leaf: the cluster deployment groups renewals by it).
//! The one copy: `lock-testing` uses it too (through `__slot`), and its tests compare it with
//! the server's own `CLUSTER KEYSLOT`.

/// Number of hash slots of a Redis Cluster.
pub const SLOT_COUNT: u16 = 16384;

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of the key, modulo 16384.
///
/// When the key contains a `{`, followed later by a `}` with at least one byte between them, only
/// the bytes between the first `{` and the first `}` after it are hashed (the *hash tag*), so
/// `lock:{invoice:42}` and `lock:{invoice:42}:fence` share a slot. This is what `CLUSTER KEYSLOT`
/// answers, computed locally.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOT_COUNT
}

/// The part of `key` that is hashed.
fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    let rest = &key[open + 1..];
    match rest.iter().position(|&b| b == b'}') {
        // `{}` (empty tag) hashes the whole key.
        Some(len) if len > 0 => &rest[..len],
        _ => key,
    }
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as Redis Cluster specifies.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_check_value() {
        // The standard check value of CRC-16/XMODEM.
        assert_eq!(crc16(b"123456789"), 0x31c3);
    }

    #[test]
    fn hash_tag_rules() {
        assert_eq!(hash_tag(b"{user1000}.following"), b"user1000");
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hash_tag(b"foo{bar"), b"foo{bar");
        assert_eq!(hash_tag(b"plain"), b"plain");
    }
}

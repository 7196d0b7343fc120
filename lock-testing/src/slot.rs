//! [`key_slot`]: the Redis Cluster hash slot of a key, as `CLUSTER KEYSLOT` computes it. It is
//! the engine's own function (`lock-runtime` keeps the one copy, with its unit tests); the test
//! here compares it with the server's answer.
//!
//! ```
//! use lock_testing::key_slot;
//!
//! assert_eq!(key_slot(b"123456789"), 0x31c3 % 16384);
//! assert_eq!(key_slot(b"lock:{a}"), key_slot(b"lock:{a}:fence"));
//! ```

pub use lock_runtime::__slot::{SLOT_COUNT, key_slot};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::{NodeSpec, RedisServer, make_temp_dir, server_bin};

    /// Compares with the server's own answer, on one cluster-enabled node (no cluster needed).
    #[test]
    fn key_slot_matches_cluster_keyslot() {
        let node = RedisServer::launch_node(NodeSpec {
            bin: server_bin(),
            dir: make_temp_dir(),
            conf_file: None,
            sentinel: false,
            cluster_bus: true,
            args: vec!["--cluster-enabled".into(), "yes".into()],
            env: Vec::new(),
        });
        let mut con = redis::Client::open(node.url())
            .and_then(|c| c.get_connection())
            .unwrap();
        let mut keys: Vec<Vec<u8>> = [
            "",
            "a",
            "foo",
            "{user1000}.following",
            "{user1000}.followers",
            "foo{}{bar}",
            "foo{{bar}}zap",
            "foo{bar}{zap}",
            "{}",
            "}{",
            "lock:{invoice:42}",
            "lock:{invoice:42}:fence",
        ]
        .iter()
        .map(|k| k.as_bytes().to_vec())
        .collect();
        // Binary keys and a spread of slots.
        keys.push(vec![0, 0xff, b'{', 0x80, b'}']);
        keys.extend((0..500u32).map(|i| format!("key:{i}:{}", i * 7919).into_bytes()));
        for key in &keys {
            let server: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(key)
                .query(&mut con)
                .unwrap();
            assert_eq!(
                key_slot(key),
                server,
                "key {:?}",
                String::from_utf8_lossy(key)
            );
        }
    }
}

//! [`RedisCluster::reshard`]: moving a given slot range, online.
//!
//! `redis-cli --cluster reshard` picks which slots to move itself, so this follows the documented
//! live-resharding steps per slot instead: `IMPORTING` on the target, `MIGRATING` on the source,
//! `MIGRATE` the keys, then `SETSLOT NODE` everywhere. Clients keep working throughout: the source
//! answers `ASK` for keys already moved, and `MOVED` once the slot is handed over.

use std::collections::HashMap;
use std::collections::hash_map::Entry as Slot;
use std::ops::Range;

use redis::Connection;

use super::topology::{Entry, View};
use super::{RedisCluster, SETTLE_TIMEOUT};
use crate::admin::{self, cmd, run};
use crate::slot::SLOT_COUNT;

/// Keys moved per `MIGRATE` call.
const BATCH: usize = 100;
/// `MIGRATE` timeout, in ms.
const MIGRATE_TIMEOUT_MS: &str = "10000";

impl RedisCluster {
    /// Moves the hash slots `slots` (with their keys) to the primary on `to_port`, one slot at a
    /// time, while clients keep running; returns once every node agrees that `to_port` serves
    /// them and the cluster is settled. Slots it already serves are skipped.
    ///
    /// ```no_run
    /// use lock_testing::{RedisCluster, key_slot};
    ///
    /// let cluster = RedisCluster::start();
    /// let slot = key_slot(b"lock:{job}");
    /// let target = cluster
    ///     .primaries()
    ///     .into_iter()
    ///     .find(|p| !p.slots.iter().any(|r| r.contains(&slot)))
    ///     .unwrap();
    /// cluster.reshard(slot..slot + 1, target.port);
    /// assert_eq!(cluster.primary_for_key("lock:{job}").port, target.port);
    /// ```
    ///
    /// # Panics
    ///
    /// If `slots` reaches past 16383, `to_port` is not a healthy primary, a migration command
    /// fails, or the cluster does not settle within 20 s.
    pub fn reshard(&self, slots: Range<u16>, to_port: u16) {
        assert!(
            slots.end <= SLOT_COUNT,
            "RedisCluster::reshard: slots {slots:?} reach past {}",
            SLOT_COUNT - 1
        );
        let view = self.settle("reshard", SETTLE_TIMEOUT, &[], |_| Ok(()));
        let Some(target) = view.by_port(to_port).filter(|e| e.primary && !e.failed) else {
            panic!("RedisCluster::reshard: port {to_port} is not a healthy primary: {view}");
        };
        let mut connections = HashMap::new();
        for slot in slots.clone() {
            let source = view
                .owner(slot)
                .expect("a settled cluster serves every slot");
            if source.id == target.id {
                continue;
            }
            if let Err(e) = move_slot(&mut connections, &view, slot, source, target) {
                panic!(
                    "RedisCluster::reshard: moving slot {slot} from port {} to {to_port}: {e}\n{}",
                    source.port,
                    self.logs()
                );
            }
        }
        let target_id = target.id.clone();
        self.settle("reshard", SETTLE_TIMEOUT, &[], |view| {
            match slots
                .clone()
                .find(|&s| view.owner(s).is_none_or(|o| o.id != target_id))
            {
                None => Ok(()),
                Some(slot) => Err(format!("slot {slot} not yet served by port {to_port}")),
            }
        });
    }
}

/// Moves one slot and its keys from `source` to `target`, and tells every primary.
fn move_slot(
    connections: &mut HashMap<u16, Connection>,
    view: &View,
    slot: u16,
    source: &Entry,
    target: &Entry,
) -> Result<(), String> {
    let slot_arg = slot.to_string();
    let (source_id, target_id) = (source.id.as_str(), target.id.as_str());
    exec(
        connections,
        target.port,
        &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", source_id],
    )?;
    exec(
        connections,
        source.port,
        &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", target_id],
    )?;
    let (target_port, batch) = (target.port.to_string(), BATCH.to_string());
    loop {
        let con = connection(connections, source.port)?;
        let keys: Vec<Vec<u8>> = run(con, &["CLUSTER", "GETKEYSINSLOT", &slot_arg, &batch])?;
        if keys.is_empty() {
            break;
        }
        let mut migrate = cmd(&["MIGRATE", "127.0.0.1", &target_port, "", "0"]);
        // REPLACE: a key a client created on the target meanwhile (after an ASK) cannot also
        // exist on the source, so nothing newer is ever overwritten.
        migrate.arg(MIGRATE_TIMEOUT_MS).arg("REPLACE").arg("KEYS");
        for key in &keys {
            migrate.arg(key);
        }
        migrate
            .query::<()>(con)
            .map_err(|e| format!("port {}: MIGRATE: {e}", source.port))?;
    }
    // The target first (it bumps its config epoch so that the change wins everywhere), then the
    // source (which stops answering ASK), then the other primaries.
    let others = view
        .entries
        .iter()
        .filter(|e| e.primary && !e.failed && e.id != source.id && e.id != target.id);
    for port in [target.port, source.port]
        .into_iter()
        .chain(others.map(|e| e.port))
    {
        exec(
            connections,
            port,
            &["CLUSTER", "SETSLOT", &slot_arg, "NODE", target_id],
        )?;
    }
    Ok(())
}

/// Runs `args` on `port`, expecting `OK`.
fn exec(
    connections: &mut HashMap<u16, Connection>,
    port: u16,
    args: &[&str],
) -> Result<(), String> {
    run::<()>(connection(connections, port)?, args).map_err(|e| format!("port {port}: {e}"))
}

/// The connection to `port`, opened once per reshard.
fn connection(
    connections: &mut HashMap<u16, Connection>,
    port: u16,
) -> Result<&mut Connection, String> {
    Ok(match connections.entry(port) {
        Slot::Occupied(e) => e.into_mut(),
        Slot::Vacant(e) => e.insert(admin::connect(port)?),
    })
}

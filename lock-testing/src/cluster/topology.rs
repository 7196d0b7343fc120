//! The cluster as its nodes describe it (`CLUSTER NODES`), and the "settled" check: every node
//! healthy, all agreeing, replicas synced.

use std::fmt;
use std::ops::RangeInclusive;

use crate::admin::{self, info_field};
use crate::slot::SLOT_COUNT;

/// One node of a `CLUSTER NODES` reply: the fields that must agree across nodes (not the
/// per-viewer ones: `myself`, ping times, link state, `fail?`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) port: u16,
    pub(crate) primary: bool,
    /// For a replica, its primary's id.
    pub(crate) primary_id: Option<String>,
    pub(crate) slots: Vec<RangeInclusive<u16>>,
    /// Flagged `fail` (agreed by a majority of primaries), not merely `fail?` (one viewer's guess).
    pub(crate) failed: bool,
}

impl Entry {
    pub(crate) fn serves(&self, slot: u16) -> bool {
        self.primary && self.slots.iter().any(|r| r.contains(&slot))
    }
}

/// Every node one node knows about, sorted by id so that views compare with `==`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct View {
    pub(crate) entries: Vec<Entry>,
}

impl View {
    pub(crate) fn by_port(&self, port: u16) -> Option<&Entry> {
        self.entries.iter().find(|e| e.port == port)
    }

    pub(crate) fn by_id(&self, id: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.id == id)
    }

    /// The primary serving `slot`.
    pub(crate) fn owner(&self, slot: u16) -> Option<&Entry> {
        self.entries.iter().find(|e| !e.failed && e.serves(slot))
    }

    /// Parses a `CLUSTER NODES` reply; nodes still in handshake make it an error (not settled).
    pub(crate) fn parse(text: &str) -> Result<View, String> {
        let mut entries = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [id, addr, flags, primary_id, ..] = fields[..] else {
                return Err(format!("unexpected CLUSTER NODES line: {line}"));
            };
            let flags: Vec<&str> = flags.split(',').collect();
            if flags.iter().any(|f| matches!(*f, "handshake" | "noaddr")) {
                return Err(format!("node {id} is not fully known yet: {line}"));
            }
            // `ip:port@cport[,hostname]`
            let port = addr
                .split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| format!("no port in CLUSTER NODES line: {line}"))?;
            let mut slots = Vec::new();
            // Slot fields start at the 9th; `[slot->-id]` / `[slot-<-id]` are migrations in
            // progress, seen only by the two nodes involved.
            for field in fields.iter().skip(8).filter(|f| !f.starts_with('[')) {
                let (start, end) = field.split_once('-').unwrap_or((field, field));
                match (start.parse(), end.parse()) {
                    (Ok(start), Ok(end)) => slots.push(start..=end),
                    _ => return Err(format!("bad slot range {field:?} in: {line}")),
                }
            }
            slots.sort_by_key(|r| *r.start());
            entries.push(Entry {
                id: id.to_owned(),
                port,
                primary: flags.contains(&"master"),
                primary_id: (primary_id != "-").then(|| primary_id.to_owned()),
                slots,
                failed: flags.contains(&"fail"),
            });
        }
        entries.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(View { entries })
    }
}

impl fmt::Display for View {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.entries {
            let role = match &e.primary_id {
                Some(p) => format!("replica of {}", &p[..p.len().min(8)]),
                None if e.primary => "primary".to_owned(),
                None => "?".to_owned(),
            };
            let failed = if e.failed { " FAIL" } else { "" };
            write!(
                f,
                "[{} :{} {role}{failed} {:?}] ",
                &e.id[..e.id.len().min(8)],
                e.port,
                e.slots
            )?;
        }
        Ok(())
    }
}

/// The view of one node, from a fresh connection.
pub(crate) fn view_of(port: u16) -> Result<View, String> {
    let text: String = admin::query(port, &["CLUSTER", "NODES"])?;
    View::parse(&text)
}

/// Whether the nodes `live` (port, node id) form a settled cluster, and if so their common view:
/// each reports `cluster_state:ok` with all 16384 slots assigned and served by healthy nodes;
/// all report the same view, in which none of them is failed; every replica among them has its
/// replication link up and synced.
pub(crate) fn check_settled(live: &[(u16, &str)]) -> Result<View, String> {
    let mut common: Option<(u16, View)> = None;
    for &(port, _) in live {
        let mut con = admin::connect(port)?;
        let info: String = admin::run(&mut con, &["CLUSTER", "INFO"])?;
        let all = SLOT_COUNT.to_string();
        for (key, want) in [
            ("cluster_state", "ok"),
            ("cluster_slots_assigned", all.as_str()),
            ("cluster_slots_ok", all.as_str()),
        ] {
            let got = info_field(&info, key).unwrap_or("?");
            if got != want {
                return Err(format!("port {port}: {key}:{got}"));
            }
        }
        let text: String = admin::run(&mut con, &["CLUSTER", "NODES"])?;
        let view = View::parse(&text).map_err(|e| format!("port {port}: {e}"))?;
        match &common {
            None => common = Some((port, view)),
            Some((_, first)) if *first == view => {}
            Some((first_port, first)) => {
                return Err(format!(
                    "nodes disagree: port {first_port} sees {first}; port {port} sees {view}"
                ));
            }
        }
    }
    let (_, view) = common.ok_or("no running node")?;
    for &(port, id) in live {
        match view.by_id(id) {
            Some(e) if !e.failed && e.port == port => {}
            _ => {
                return Err(format!(
                    "node {id} (port {port}) is failed or unknown in {view}"
                ));
            }
        }
    }
    for e in view.entries.iter().filter(|e| !e.primary) {
        if live.iter().any(|&(port, _)| port == e.port) {
            admin::replica_synced(e.port)?;
            // The replica says its link is up a moment before its primary counts it as online
            // (at its first ACK); `WAIT` counts only online replicas.
            let primary = e.primary_id.as_deref().and_then(|id| view.by_id(id));
            if let Some(p) = primary.filter(|p| live.iter().any(|&(port, _)| port == p.port)) {
                admin::replica_online_at_primary(p.port, e.port)?;
            }
        }
    }
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_nodes() {
        let text = "\
3025e7409efc4ebf4d12e2e987506f147bd10e5c 127.0.0.1:27004@28004 slave 833094d00811d5419b80354af93ca75ff3e884df 0 1796233147496 2 connected
e6c80b3b5ead6b194c1c8ae3d2b3d47898c5fe03 127.0.0.1:27003@28003 master,fail - 0 1796233147094 3 disconnected
554b1396bd9a6402d69a33e0eab50cdadea94c03 127.0.0.1:27001@28001 myself,master - 0 0 1 connected 0-5460 7000 [7001->-e6c80b3b5ead6b194c1c8ae3d2b3d47898c5fe03]
833094d00811d5419b80354af93ca75ff3e884df 127.0.0.1:27002@28002 master,fail? - 0 1796233147094 2 connected 5461-6999 7001-16383
";
        let view = View::parse(text).unwrap();
        assert_eq!(view.entries.len(), 4);
        let first = view.by_port(27001).unwrap();
        assert!(first.primary && !first.failed);
        assert_eq!(first.slots, vec![0..=5460, 7000..=7000]);
        let replica = view.by_port(27004).unwrap();
        assert!(!replica.primary);
        assert_eq!(
            replica.primary_id.as_deref(),
            Some("833094d00811d5419b80354af93ca75ff3e884df")
        );
        assert!(view.by_port(27003).unwrap().failed);
        assert!(
            !view.by_port(27002).unwrap().failed,
            "fail? is one viewer's guess"
        );
        assert_eq!(view.owner(7000).unwrap().port, 27001);
        assert_eq!(view.owner(16383).unwrap().port, 27002);
    }

    #[test]
    fn handshake_is_not_settled() {
        let text = "abc 127.0.0.1:1@2 handshake - 0 0 0 connected\n";
        assert!(View::parse(text).is_err());
    }
}

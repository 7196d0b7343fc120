//! A Redis Cluster: each lock's keys share one hash tag, so a lock lives in one slot and its
//! primary is one logical server with a fair queue.

use super::{Deployment, Setup, Traits};
use crate::LockError;
use crate::plumbing::deadlines::Deadlines;
use crate::server::Node;

/// A Redis Cluster's traits.
const TRAITS: Traits = Traits {
    fair_queue: true,
    // A pipeline that meets a slot in migration is sent again whole to the importing node, so
    // its SET could land on both: the acquire is always the script, one atomic command.
    plain_commands: false,
    always_publish: false,
    fence_quantum_us: 1,
    // The cluster groups renewals by primary itself (one pipeline per primary per round).
    renew_chunk: usize::MAX,
};

/// The deployment of the cluster that the nodes at `seed_urls` belong to. Nothing is sent yet.
pub(crate) fn open(seed_urls: &[String], setup: &Setup<'_>) -> Result<Deployment, LockError> {
    if seed_urls.is_empty() {
        return Err(LockError::config(
            "",
            "`.cluster(..)` was given no node URL: give the URLs of one or more cluster nodes",
        ));
    }
    let (settings, tls, replicas) = (setup.settings, setup.tls_root_cert, setup.replicas);
    let node = Node::cluster(seed_urls, settings, tls, replicas, Deadlines::default())?;
    Ok(Deployment::new(vec![node], TRAITS, setup))
}

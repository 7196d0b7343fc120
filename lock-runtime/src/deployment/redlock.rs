//! Redlock: N independent servers, a lock held by a majority of them. Nobody queues (the
//! servers could disagree on who is first), so every release is published.

use super::{Deployment, Setup, Traits};
use crate::LockError;
use crate::plumbing::deadlines::Deadlines;
use crate::server::{Node, RENEW_CHUNK};

/// Redlock's traits.
const TRAITS: Traits = Traits {
    fair_queue: false,
    plain_commands: false,
    always_publish: true,
    // A fence floor from the server's clock rounded down to the second, so that the servers of
    // a majority hand out the same fence and need no second round trip to agree.
    fence_quantum_us: 1_000_000,
    renew_chunk: RENEW_CHUNK,
};

/// The deployment of the servers at `urls` (two or more). Nothing is sent yet.
pub(crate) fn open(urls: &[String], setup: &Setup<'_>) -> Result<Deployment, LockError> {
    let (settings, tls, replicas) = (setup.settings, setup.tls_root_cert, setup.replicas);
    // One schedule of request bounds for all of them.
    let deadlines = Deadlines::default();
    let nodes = urls
        .iter()
        .map(|url| Node::direct(url, settings, tls, replicas, deadlines.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Deployment::new(nodes, TRAITS, setup))
}

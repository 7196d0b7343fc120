//! One Redis server at a fixed address. One place decides, so waiters queue there in arrival
//! order, and an uncontended acquire is plain commands.

use super::{Deployment, Setup, Traits};
use crate::LockError;
use crate::plumbing::deadlines::Deadlines;
use crate::server::{Node, RENEW_CHUNK};

/// One logical server that takes plain commands (also the primary behind Sentinel).
pub(crate) const TRAITS: Traits = Traits {
    fair_queue: true,
    plain_commands: true,
    always_publish: false,
    fence_quantum_us: 1,
    renew_chunk: RENEW_CHUNK,
};

/// The deployment of the server at `url`. Nothing is sent yet.
pub(crate) fn open(url: &str, setup: &Setup<'_>) -> Result<Deployment, LockError> {
    let (settings, tls, replicas) = (setup.settings, setup.tls_root_cert, setup.replicas);
    let node = Node::direct(url, settings, tls, replicas, Deadlines::default())?;
    Ok(Deployment::new(vec![node], TRAITS, setup))
}

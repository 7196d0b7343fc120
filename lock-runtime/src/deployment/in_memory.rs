//! A server in this process (`Locker::in_memory`): for users' tests. One place decides, as on
//! one Redis server, so waiters queue in arrival order and an uncontended acquire is plain
//! commands; the locks live in this process only.

use super::{Deployment, Setup, standalone};
use crate::plumbing::deadlines::Deadlines;
use crate::server::Node;

/// The deployment of a new, empty server in this process.
pub(crate) fn open(setup: &Setup<'_>) -> Deployment {
    let node = Node::in_process(setup.settings, Deadlines::default());
    Deployment::new(vec![node], standalone::TRAITS, setup)
}

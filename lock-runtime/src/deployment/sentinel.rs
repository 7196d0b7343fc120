//! The primary that Redis Sentinel names, found again after a failover: one logical server, as
//! [`standalone`] is.

use super::{Deployment, Setup, standalone};
use crate::LockError;
use crate::plumbing::deadlines::Deadlines;
use crate::server::Node;

/// The deployment of the primary that the Sentinels at `urls` name for `master`. Nothing is
/// sent yet.
pub(crate) fn open(
    urls: &[String],
    master: &str,
    setup: &Setup<'_>,
) -> Result<Deployment, LockError> {
    if urls.is_empty() {
        return Err(LockError::config(
            "",
            "`.sentinel(..)` was given no Sentinel URL: give the URLs of one or more Sentinels",
        ));
    }
    let (settings, replicas) = (setup.settings, setup.replicas);
    let node = Node::sentinel(urls, master, settings, replicas, Deadlines::default())?;
    Ok(Deployment::new(vec![node], standalone::TRAITS, setup))
}

//! How a request reaches one logical Redis server: connection settings and bounds, a direct
//! connection, a Redis Cluster (slots, MOVED and ASK), the primary that Sentinel names, or a
//! server in this process.

pub(crate) mod cluster;
pub(crate) mod connect;
pub(crate) mod in_process;
pub(crate) mod link;
pub(crate) mod sentinel;
pub(crate) mod slot;

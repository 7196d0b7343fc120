//! A granted hold: the renewal that keeps it (one watchdog per locker, batching every hold) and
//! the [`Lease`](crate::Lease) handle its holder uses.

pub(crate) mod lease;
pub(crate) mod watchdog;

//! The public facade: building a [`Locker`](crate::Locker), taking and running locked calls
//! (nested calls included), the process default locker, and inspection.

pub(crate) mod builder;
pub(crate) mod default_locker;
pub(crate) mod election;
pub(crate) mod inspect;
pub(crate) mod locker;
pub(crate) mod per_runtime;
pub(crate) mod reentrancy;
pub(crate) mod run;
pub(crate) mod several;

//! What a lock is, without any I/O: its options, errors, key names, holder tokens and the
//! output a locked function returns.

pub(crate) mod error;
pub(crate) mod hold;
pub(crate) mod holder;
pub(crate) mod keys;
#[cfg(test)]
mod keys_props;
pub(crate) mod options;
pub(crate) mod output;
pub(crate) mod random;
pub(crate) mod waiter;

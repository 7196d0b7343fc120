//! The `#[distributed_lock]` attribute. Depend on `lock-runtime` and use it as
//! `lock_runtime::distributed_lock`: the code it generates calls into that crate.
//!
//! Stages: `parse` reads the options, `config` checks them against each other and against the
//! function (`template` reads the key, `item` the function), `expand` writes the new body. On an
//! error the function is emitted unchanged next to the `compile_error!`s, so the rest of the
//! crate still type-checks sanely.

mod config;
mod expand;
mod item;
mod parse;
mod template;

use proc_macro::TokenStream;

/// Runs the body of an `async fn` while holding a distributed lock on Redis. Use it through
/// `lock_runtime::distributed_lock`, whose documentation has a compiled example.
///
/// Options: `name` (key template, `{param}` names a parameter), `ttl`, `max_exec`, `renew`,
/// `wait`, `min_hold` (durations like `"250ms"`, `"1m 30s"`), `locker` (an expression whose
/// reference derefs to a `Locker`), `guard` (an identifier bound to `&Lease` in the body) and
/// `crate` (path to `lock_runtime` when re-exported). See the `lock-runtime` docs.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::distributed_lock(args.into(), item.into()).into()
}

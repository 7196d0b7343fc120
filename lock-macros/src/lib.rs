//! The `#[distributed_lock]` attribute of [`lock-runtime`](https://docs.rs/lock-runtime): depend on
//! `lock-runtime` and use it as `lock_runtime::distributed_lock`, whose documentation is the
//! reference (the code it generates calls into that crate).
//!
//! Stages, each a module, each using only those above it: `errors`, `suggest`, `options` (the
//! option keys), `template` (the key) and `recursion` (a body that awaits its own function) are
//! leaves; `item` finds the function's body, `parse` reads the options as written, `config`
//! checks them against each other (with `lock_rules`) and against the function, and `expand`
//! writes the new body. On an error the function is emitted
//! unchanged next to the `compile_error!`s, so the rest of the crate still type-checks sanely.

mod config;
mod errors;
mod expand;
mod item;
mod options;
mod parse;
mod recursion;
mod suggest;
mod template;

use proc_macro::TokenStream;

/// `#[distributed_lock]` is defined in the `lock-macros` crate and re-exported by `lock-runtime`,
/// where it is documented: depend on `lock-runtime` only, as the code the attribute generates
/// calls into it.
//
// rustdoc appends this text to the re-export's documentation in lock-runtime (under its last
// heading, "Where it is defined"), so it reads well on both pages.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::distributed_lock(args.into(), item.into()).into()
}

//! Writes the new body: render the key, pick the locker, build the options as a const, and make
//! one call into the runtime with the user's body as an `async` block inside an async closure
//! (the closure receives the lease). Everything else about the function (attributes, visibility,
//! signature, and under async-trait the code around the body) is emitted as written.

use proc_macro2::{Delimiter, Group, Ident, Literal, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned};
use syn::visit_mut::{self, VisitMut};
use syn::{Block, GenericArgument, ItemFn, PathArguments, Token, Type, TypeInfer};

use crate::config::{self, Config};
use crate::errors::Errors;
use crate::item::{self, LockedFn};
use crate::parse;
use crate::recursion;

/// The attribute's whole job: the expanded function, or the function unchanged plus the errors.
pub(crate) fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    match expand(args, item.clone()) {
        Ok(out) => out,
        // Keeping the function lets its callers and body still be checked (and IDEs resolve it).
        Err(err) => {
            let item = unchanged(item);
            let errors = err.to_compile_error();
            quote!(#item #errors)
        }
    }
}

/// The function as written, for when the attribute reports an error. Its parameters may be
/// unused without the key that was to use them: rustc's warnings about them would only add
/// noise to the error, so they are allowed. A call of itself is boxed, as the error about it
/// says to, so that rustc does not report it again.
fn unchanged(item: TokenStream) -> TokenStream {
    match syn::parse2::<ItemFn>(item.clone()) {
        Ok(mut func) => {
            func.attrs
                .push(syn::parse_quote!(#[allow(unused_variables)]));
            if func.sig.asyncness.is_some() {
                recursion::box_calls(&mut func);
            }
            quote!(#func)
        }
        Err(_) => item,
    }
}

fn expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let func = item::parse(item)?;
    let mut errors = Errors::default();
    let raw = parse::parse_args(args, &mut errors);
    // The parameters are known even when the body is not usable, so the options still get checked.
    let declared_params = item::bindings(&func.sig);
    let locked = errors.push_result(item::analyze(func));
    // An async-trait method returns a boxed future already: it may call itself.
    if let Some(locked) = locked.as_ref().filter(|l| l.func.sig.asyncness.is_some()) {
        errors.push_result(recursion::check(&locked.func));
    }
    let params = locked.as_ref().map_or(&declared_params, |l| &l.params);
    let config = raw.and_then(|raw| config::build(raw, params, &mut errors));
    errors.finish()?;
    // `analyze` and `build` give `None` only after reporting why; never panic in a macro all the same.
    match (locked, config) {
        (Some(locked), Some(config)) => generate(locked, &config),
        _ => Err(internal()),
    }
}

fn internal() -> syn::Error {
    syn::Error::new(
        Span::call_site(),
        "#[distributed_lock] could not expand this function",
    )
}

fn generate(mut locked: LockedFn, config: &Config) -> syn::Result<TokenStream> {
    let krate = &config.krate;
    // Mixed-site names are invisible to the user's body, so they can never clash with its names.
    let def = Span::mixed_site();
    let private = quote_spanned!(def=> #krate::__private);
    let lease = Ident::new("__lock_lease", def);
    let name = Ident::new("__lock_name", def);
    let locker = Ident::new("__lock_locker", def);
    let options = Ident::new("__LOCK_OPTIONS", def);

    let ret = return_type(locked.output.as_ref());
    let key_format = &config.key_format;
    let key_args = &config.key_args;
    let locker_expr = locker_expr(&locked, config, &private);
    let options_expr = options_chain(&private, config);
    let (lease_pat, async_block) = wrapped_body(&mut locked, config, &private, &lease, &ret)?;

    let lock_failure = lock_failure(locked.output.as_ref(), &ret, &private);
    let lease_type = lease_type(config, &private);
    let args = quote_spanned!(def=>
        #locker, #name, &#options, async move |#lease_pat: #lease_type| #async_block.await,
        #lock_failure
    );
    let (name_type, name_value, run) = if config.several.is_empty() {
        let name_value = quote_spanned!(def=> ::std::format!(#key_format #(, #key_args)*));
        (quote!(::std::string::String), name_value, quote!(run))
    } else {
        let formats = config
            .several
            .iter()
            .map(|(format, args)| quote_spanned!(def=> ::std::format!(#format #(, #args)*)));
        let name_value = quote_spanned!(def=> ::std::vec![#(#formats),*]);
        let names_type = quote!(::std::vec::Vec<::std::string::String>);
        (names_type, name_value, quote!(run_all))
    };
    let call = quote_spanned!(def=> #private::#run(#args).await);

    // The const comes first: items after statements read badly (and clippy says so).
    let new_body: Block = syn::parse_quote_spanned! {def=> {
        const #options: #private::LockOptions = #options_expr;
        let #name: #name_type = #name_value;
        let #locker: ::core::result::Result<#private::Locker, #private::LockError> = #locker_expr;
        #call
    }};
    *locked.body_mut().ok_or_else(internal)? = new_body;
    let func = &locked.func;
    Ok(quote!(#func))
}

/// The expression that gives the call its `Locker`: `locker = expr` borrowed as `&(expr)`, or
/// the process default locker.
fn locker_expr(locked: &LockedFn, config: &Config, private: &TokenStream) -> TokenStream {
    let def = Span::mixed_site();
    match &config.locker {
        // `&(expr)`: a static, a field through `self` or a value all deref to `&Locker`; the
        // runtime clones it, so a borrow of `self` ends before the body takes `self`.
        Some(expr) => {
            let expr = match &locked.self_alias {
                // async-trait moved `self` into `__self` before the body: name it that way.
                Some(alias) => rename_self(quote!(#expr), alias),
                None => quote!(#expr),
            };
            let borrowed = around(expr.clone(), |first, last| {
                let mut group = Group::new(Delimiter::Parenthesis, expr);
                group.set_span(last);
                quote_spanned!(first=> &#group)
            });
            // A typed `let` is a coercion site like an argument, but a mismatch there names
            // no function of the runtime.
            let named = Ident::new("__lock_locker_ref", def);
            quote_spanned!(def=> {
                let #named: &#private::Locker = #borrowed;
                #private::locker_ref(#named)
            })
        }
        None => quote_spanned!(def=> #private::default_locker()),
    }
}

/// Takes the user's body out of `locked` and wraps it, unchanged, in an `async move` block:
/// with the `guard` binding first, and its return type fixed. Returns the closure's lease
/// pattern and the block.
fn wrapped_body(
    locked: &mut LockedFn,
    config: &Config,
    private: &TokenStream,
    lease: &Ident,
    ret: &TokenStream,
) -> syn::Result<(TokenStream, TokenStream)> {
    let def = Span::mixed_site();
    let body_slot = locked.body_mut().ok_or_else(internal)?;
    let mut body = std::mem::replace(body_slot, syn::parse_quote!({}));
    let lease_pat = match &config.guard {
        Some(guard) => {
            let lease_type = lease_type(config, private);
            body.stmts
                .insert(0, syn::parse_quote!(let #guard: #lease_type = #lease;));
            quote!(#lease)
        }
        None => quote!(_),
    };
    // A never-taken `return` of the declared type fixes the async block's output type before
    // its body is checked, so `return Ok(&string)` or a tail `Box::new(x)` coerce to it (as
    // tracing-attributes does for async blocks).
    if ret.to_string() != "_" {
        let fix_return_type = syn::parse_quote_spanned! {def=>
            #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop)]
            if false {
                return ::core::convert::identity::<#ret>(loop {});
            }
        };
        body.stmts.insert(0, fix_return_type);
    }
    // The body runs as an `async` block (not as the closure's own body): errors about it, like a
    // `?` it cannot use, then speak of an async block, and point at the function's `async fn`.
    let async_token = quote_spanned!(locked.async_span=> async);
    let move_token = quote_spanned!(locked.fn_span=> move);
    Ok((lease_pat, quote!(#async_token #move_token #body)))
}

/// What the body's `guard` is: the lease, or with `name = [..]` every lease in the order written.
fn lease_type(config: &Config, private: &TokenStream) -> TokenStream {
    if config.several.is_empty() {
        quote!(&#private::Lease)
    } else {
        quote!(&[#private::Lease])
    }
}

/// `self` in user tokens, renamed to `alias` (keeping each token's span).
fn rename_self(tokens: TokenStream, alias: &Ident) -> TokenStream {
    tokens
        .into_iter()
        .map(|tree| match tree {
            TokenTree::Ident(ident) if ident == "self" => {
                TokenTree::Ident(Ident::new(&alias.to_string(), ident.span()))
            }
            TokenTree::Group(group) => {
                let mut renamed = Group::new(group.delimiter(), rename_self(group.stream(), alias));
                renamed.set_span(group.span());
                TokenTree::Group(renamed)
            }
            other => other,
        })
        .collect()
}

/// How the call turns a lock failure into the function's return value, named with the user's
/// own tokens of the return type: a type that cannot carry a lock failure is then reported by
/// the trait's message at that type (the error type of a `Result<T, E>`, else the whole type),
/// and nowhere else, as no bound of the runtime's asks for it again.
fn lock_failure(output: Option<&Type>, ret: &TokenStream, private: &TokenStream) -> TokenStream {
    match output.and_then(result_error_type) {
        Some(error) => {
            let mut error = error.clone();
            InferImplTrait.visit_type_mut(&mut error);
            quote!(<#error as #private::FromLockError>::lock_failure)
        }
        None => quote!(<#ret as #private::LockOutput>::from_lock_error),
    }
}

/// `E` of a return type written `Result<T, E>` (any path ending in `Result` with two
/// arguments, like `std::io::Result<T, E>` or `anyhow::Result<T, E>`).
fn result_error_type(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = ty else {
        return None;
    };
    let last = path
        .path
        .segments
        .last()
        .filter(|last| last.ident == "Result")?;
    match &last.arguments {
        PathArguments::AngleBracketed(args) if args.args.len() == 2 => match &args.args[1] {
            GenericArgument::Type(error) => Some(error),
            _ => None,
        },
        _ => None,
    }
}

/// Wraps user tokens so that an error about the wrapping expression is reported on exactly those
/// tokens: its first generated token gets the span of their first token and its last generated
/// token the span of their last (a stable proc macro cannot join spans). Generated tokens
/// otherwise point at the whole attribute.
fn around(user: TokenStream, wrap: impl FnOnce(Span, Span) -> TokenStream) -> TokenStream {
    let mut trees = user.into_iter();
    let first = trees.next().map_or_else(Span::mixed_site, |t| t.span());
    let last = trees.last().map_or(first, |t| t.span());
    wrap(first, last)
}

/// `LockOptions::new(ttl)` plus one builder call per option given.
fn options_chain(private: &TokenStream, config: &Config) -> TokenStream {
    let millis = |ms: u64| {
        let ms = Literal::u64_unsuffixed(ms);
        quote!(#private::Duration::from_millis(#ms))
    };
    let mut chain = {
        let ttl = millis(config.ttl_ms);
        quote!(#private::LockOptions::new(#ttl))
    };
    let setters = [
        ("with_lease", config.lease_ms),
        ("with_max_exec", config.max_exec_ms),
        ("with_renew", config.renew_ms),
        ("with_wait", config.wait_ms),
        ("with_min_hold", config.min_hold_ms),
    ];
    for (setter, value) in setters {
        if let Some(ms) = value {
            let setter = Ident::new(setter, Span::mixed_site());
            let value = millis(ms);
            chain = quote!(#chain.#setter(#value));
        }
    }
    if let Some(permits) = config.permits {
        let permits = Literal::u32_unsuffixed(permits as u32);
        chain = quote!(#chain.with_permits(#permits));
    }
    if config.fail_open {
        chain = quote!(#chain.with_fail_open(true));
    }
    if config.shared {
        chain = quote!(#chain.with_shared(true));
    }
    let template = &config.template;
    chain = quote!(#chain.with_template(#template));
    // Without a guard the body cannot see its lease, so nobody could read a fence.
    if config.guard.is_none() {
        chain = quote!(#private::without_fence(#chain));
    }
    chain
}

/// The type for `run::<R, _>`, so that `?` and `Ok(..)` in the body infer. `impl Trait` cannot be
/// named in a turbofish, so each one becomes `_`: `Result<impl Display, E>` still fixes `E`.
fn return_type(output: Option<&Type>) -> TokenStream {
    match output {
        None => quote!(()),
        Some(ty) => {
            let mut ty = ty.clone();
            InferImplTrait.visit_type_mut(&mut ty);
            quote!(#ty)
        }
    }
}

/// Replaces every `impl Trait` in a type by `_`.
struct InferImplTrait;

impl VisitMut for InferImplTrait {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::ImplTrait(found) = ty {
            *ty = Type::Infer(TypeInfer {
                underscore_token: Token![_](found.impl_token.span),
            });
        } else {
            visit_mut::visit_type_mut(self, ty);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ret(sig: &str) -> String {
        let sig: syn::Signature = syn::parse_str(sig).unwrap();
        match &sig.output {
            syn::ReturnType::Default => return_type(None).to_string(),
            syn::ReturnType::Type(_, ty) => return_type(Some(ty)).to_string(),
        }
    }

    #[test]
    fn return_type_for_the_turbofish() {
        assert_eq!(ret("async fn f()"), "()");
        assert_eq!(ret("async fn f() -> Result<u8, E>"), "Result < u8 , E >");
        assert_eq!(ret("async fn f() -> impl Sized"), "_");
        assert_eq!(
            ret("async fn f() -> Result<Vec<impl Display>, E>"),
            "Result < Vec < _ > , E >"
        );
        assert_eq!(
            ret("async fn f() -> Result<(impl Sized, &'_ [impl Sized]), E>"),
            "Result < (_ , & '_ [_]) , E >"
        );
    }

    #[test]
    fn expands_to_one_runtime_call() {
        let out = distributed_lock(
            quote!(name = "job:{id}", ttl = "30s", wait = "5s", guard = lease),
            quote!(
                pub async fn job(id: u32) -> Result<(), E> {
                    Ok(())
                }
            ),
        )
        .to_string();
        assert!(
            out.starts_with("pub async fn job (id : u32) -> Result < () , E > {"),
            "{out}"
        );
        assert!(
            out.contains(":: std :: format ! (\"job:{}\" , id)"),
            "{out}"
        );
        assert!(out.contains("LockOptions :: new (:: lock_runtime :: __private :: Duration :: from_millis (30000)) . with_wait ("), "{out}");
        // One call; the body is an async block inside an async closure that takes the lease.
        assert_eq!(out.matches("__private :: run").count(), 1, "{out}");
        assert!(
            out.contains(
                "async move | __lock_lease : & :: lock_runtime :: __private :: Lease | async move {"
            ),
            "{out}"
        );
        assert!(
            out.contains("let lease : & :: lock_runtime :: __private :: Lease = __lock_lease ;"),
            "{out}"
        );
        assert!(
            out.contains(
                "return :: core :: convert :: identity :: < Result < () , E > > (loop { }) ;"
            ),
            "{out}"
        );
        assert!(!out.contains("compile_error"), "{out}");
    }

    #[test]
    fn values_of_the_wrong_kind_are_errors_not_panics() {
        let out = distributed_lock(
            quote!(name = job, ttl = 10),
            quote!(
                async fn job() {}
            ),
        )
        .to_string();
        assert_eq!(out.matches("compile_error").count(), 2, "{out}");
        let out = distributed_lock(
            quote!(name = "a", ttl = "1s", max_exec = 5),
            quote!(
                async fn job() {}
            ),
        )
        .to_string();
        assert_eq!(out.matches("compile_error").count(), 1, "{out}");
    }

    #[test]
    fn on_error_keeps_the_function() {
        let out = distributed_lock(
            quote!(ttl = "1s"),
            quote!(
                fn job() {}
            ),
        )
        .to_string();
        assert!(
            out.starts_with("# [allow (unused_variables)] fn job () { }"),
            "{out}"
        );
        assert_eq!(out.matches("compile_error").count(), 2, "{out}");
    }
}

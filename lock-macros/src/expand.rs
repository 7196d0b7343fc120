//! Writes the new body: render the key, pick the locker, build the options as a const, and hand
//! the user's body to the runtime as an `async move` closure. Everything else about the function
//! (attributes, visibility, signature) is emitted exactly as written.

use proc_macro2::{Delimiter, Group, Ident, Literal, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned};
use syn::visit_mut::{self, VisitMut};
use syn::{AttrStyle, ItemFn, ReturnType, Token, Type, TypeInfer};

use crate::config::{self, Config, Errors};
use crate::{item, parse};

/// The attribute's whole job: the expanded function, or the function unchanged plus the errors.
pub(crate) fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    match expand(args, item.clone()) {
        Ok(out) => out,
        // Keeping the function lets its callers and body still be checked (and IDEs resolve it).
        Err(err) => {
            let errors = err.to_compile_error();
            quote!(#item #errors)
        }
    }
}

fn expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let func = item::parse(item)?;
    let mut errors = Errors::default();
    let raw = parse::parse_args(args, &mut errors);
    errors.push_result(item::check_async(&func.sig));
    let params = item::bindings(&func.sig);
    let config = raw.and_then(|raw| config::build(raw, &params, &mut errors));
    errors.finish()?;
    // `build` gives `None` only after reporting why; never panic in a macro all the same.
    let config = config.ok_or_else(|| syn::Error::new(Span::call_site(), "invalid options"))?;
    Ok(generate(func, &config))
}

fn generate(func: ItemFn, config: &Config) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = func;
    let (inner, outer): (Vec<_>, Vec<_>) = attrs
        .into_iter()
        .partition(|a| matches!(a.style, AttrStyle::Inner(_)));
    let krate = &config.krate;
    // Mixed-site names are invisible to the user's body, so they can never clash with its names.
    let def = Span::mixed_site();
    let private = quote_spanned!(def=> #krate::__private);
    let lease = Ident::new("__lock_lease", def);
    let name = Ident::new("__lock_name", def);
    let locker = Ident::new("__lock_locker", def);
    let options = Ident::new("__LOCK_OPTIONS", def);

    let ret = return_type(&sig.output);
    let key_format = &config.key_format;
    let key_args = &config.key_args;
    let locker_expr = match &config.locker {
        // `&(expr)`: a static, a field through `self` or a value all deref to `&Locker`; the
        // runtime clones it, so a borrow of `self` ends before the body takes `self`.
        Some(expr) => {
            let borrowed = around(quote!(#expr), |first, last| {
                let mut group = Group::new(Delimiter::Parenthesis, quote!(#expr));
                group.set_span(last);
                quote_spanned!(first=> &#group)
            });
            quote_spanned!(def=> #private::locker_ref(#borrowed))
        }
        None => quote_spanned!(def=> #private::default_locker()),
    };
    let options_expr = options_chain(&private, config);
    let mut body = *block;
    let lease_pat = match &config.guard {
        Some(guard) => {
            body.stmts
                .insert(0, syn::parse_quote!(let #guard: &#private::Lease = #lease;));
            quote!(#lease)
        }
        None => quote!(_),
    };
    // rustc does not carry an async closure's output type into its body (rust-lang/rust#145105),
    // so `return Ok(&string)` or a tail `Box::new(x)` would not coerce to the declared type. A
    // never-taken `return` of that type fixes the body's return type first, as
    // tracing-attributes does for async blocks.
    if ret.to_string() != "_" {
        let fix_return_type = syn::parse_quote_spanned! {def=>
            #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop)]
            if false {
                return ::core::convert::identity::<#ret>(loop {});
            }
        };
        body.stmts.insert(0, fix_return_type);
    }

    // The call spans the declared return type: a type that is not `LockOutput` is then reported
    // once, there, instead of also at the attribute for each use of the call.
    let declared = match &sig.output {
        ReturnType::Type(_, ty) => quote!(#ty),
        ReturnType::Default => TokenStream::new(),
    };
    let args = quote_spanned!(def=> #locker, #name, &#options, async move |#lease_pat: &#private::Lease| #body);
    let call = around(declared, |first, last| {
        let run = respan(quote!(#private::run::<), first);
        let mut args = Group::new(Delimiter::Parenthesis, args);
        args.set_span(last);
        quote_spanned!(last=> #run #ret, _> #args.await)
    });

    // The const comes first: items after statements read badly (and clippy says so).
    quote_spanned! {def=>
        #(#outer)*
        #vis #sig {
            #(#inner)*
            const #options: #private::LockOptions = #options_expr;
            let #name: ::std::string::String = ::std::format!(#key_format #(, #key_args)*);
            let #locker: ::core::result::Result<#private::Locker, #private::LockError> = #locker_expr;
            #call
        }
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

/// Sets the span of every token, inside groups too.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tree| {
            if let TokenTree::Group(group) = &tree {
                let mut inner = Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                tree = TokenTree::Group(inner);
            } else {
                tree.set_span(span);
            }
            tree
        })
        .collect()
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
    chain
}

/// The type for `run::<R, _>`, so that `?` and `Ok(..)` in the body infer. `impl Trait` cannot be
/// named in a turbofish, so each one becomes `_`: `Result<impl Display, E>` still fixes `E`.
fn return_type(output: &ReturnType) -> TokenStream {
    match output {
        ReturnType::Default => quote!(()),
        ReturnType::Type(_, ty) => {
            let mut ty = (**ty).clone();
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
        return_type(&sig.output).to_string()
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
        assert!(out.contains("run :: < Result < () , E > , _ >"), "{out}");
        assert!(
            out.contains("let lease : & :: lock_runtime :: __private :: Lease = __lock_lease ;"),
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
        assert!(out.starts_with("fn job () { }"), "{out}");
        assert_eq!(out.matches("compile_error").count(), 2, "{out}");
    }
}

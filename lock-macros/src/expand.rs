//! Writes the new body: render the key, pick the locker, build the options as a const, and hand
//! the user's body to the runtime as an `async move` closure. Everything else about the function
//! (attributes, visibility, signature) is emitted exactly as written.

use proc_macro2::{Ident, Literal, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned};
use syn::{AttrStyle, ItemFn, ReturnType};

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
    let raw = errors.push_result(parse::parse_args(args));
    errors.push_result(item::check_async(&func.sig));
    let params = item::bindings(&func.sig);
    let config = raw.and_then(|raw| errors.push_result(config::build(raw, &params)));
    errors.finish()?;
    Ok(generate(
        func,
        &config.expect("no errors, so the options were built"),
    ))
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
        Some(expr) => quote_spanned!(def=> #private::locker_ref(&(#expr))),
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

    // The const comes first: items after statements read badly (and clippy says so).
    quote_spanned! {def=>
        #(#outer)*
        #vis #sig {
            #(#inner)*
            const #options: #private::LockOptions = #options_expr;
            let #name: ::std::string::String = ::std::format!(#key_format #(, #key_args)*);
            let #locker: #private::Locker = #locker_expr;
            #private::run::<#ret, _>(#locker, #name, &#options, async move |#lease_pat: &#private::Lease| #body).await
        }
    }
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
        ("max_exec", config.max_exec_ms),
        ("renew", config.renew_ms),
        ("wait", config.wait_ms),
        ("min_hold", config.min_hold_ms),
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
/// named in a turbofish, so such a return type is left to inference (`_`).
fn return_type(output: &ReturnType) -> TokenStream {
    match output {
        ReturnType::Default => quote!(()),
        ReturnType::Type(_, ty) => {
            let tokens = quote!(#ty);
            if mentions_impl(tokens.clone()) {
                quote!(_)
            } else {
                tokens
            }
        }
    }
}

/// Whether a type mentions `impl`, at any depth (the keyword appears in types only as `impl Trait`).
fn mentions_impl(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|tree| match tree {
        TokenTree::Ident(ident) => ident == "impl",
        TokenTree::Group(group) => mentions_impl(group.stream()),
        _ => false,
    })
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
        assert_eq!(ret("async fn f() -> Result<Vec<impl Display>, E>"), "_");
        assert_eq!(
            ret("async fn f() -> Result<(u8, Box<dyn Fn() -> impl Sized>), E>"),
            "_"
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
        assert!(out.contains("LockOptions :: new (:: lock_runtime :: __private :: Duration :: from_millis (30000)) . wait ("), "{out}");
        assert!(out.contains("run :: < Result < () , E > , _ >"), "{out}");
        assert!(
            out.contains("let lease : & :: lock_runtime :: __private :: Lease = __lock_lease ;"),
            "{out}"
        );
        assert!(!out.contains("compile_error"), "{out}");
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

//! The function under the attribute: where its body is, what the body returns, and the names a
//! key template may use.
//!
//! Two shapes are accepted. An `async fn` with a body; and a plain `fn` that returns a future made
//! by an `async` block (`Box::pin(async move { .. })` or `async move { .. }`, with `Future<Output =
//! R>` in the return type), which is what `#[async_trait]` turns an `async fn` into before this
//! attribute runs. In the second shape the body is that async block, or, in async-trait's own
//! layout, the block it binds the result of (`let __ret: R = { body }; __ret`): the `let`s before
//! that block rebind the parameters (patterns included) and `self` as `__self`.

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use syn::parse::{ParseStream, Parser};
use syn::{
    Attribute, Block, Expr, ExprAsync, FnArg, GenericArgument, Ident, Item, ItemFn, Pat,
    PathArguments, Signature, Stmt, TraitItemFn, Type, TypeParamBound, Visibility,
};

const WHERE: &str = "`#[distributed_lock]` goes on an `async fn` with a body";

/// The function, and what the expansion needs to know about it.
pub(crate) struct LockedFn {
    /// The function as received. The expansion replaces the block at `body` and keeps the rest.
    pub func: ItemFn,
    body: BodyPlace,
    /// The body's output type; `None` for a function without `->`.
    pub output: Option<Type>,
    /// The names a key template may use: the parameters, and what async-trait rebinds them to.
    pub params: Vec<Ident>,
    /// The name async-trait gave `self` inside the body (`__self`), if it renamed it.
    pub self_alias: Option<Ident>,
    /// Where the `async` keyword that makes the body is written, and the function's `fn`: errors
    /// about the body as a whole (a `?` it cannot use) point there, at `async fn`.
    pub async_span: Span,
    pub fn_span: Span,
}

/// Where the body to lock is.
#[derive(Clone, Copy)]
enum BodyPlace {
    /// The block of an `async fn`.
    Fn,
    /// Inside the async block that the function returns: that whole block, or the block that
    /// the `let` statement at this index binds.
    Future { let_index: Option<usize> },
}

impl LockedFn {
    /// The block to lock; `None` never happens for a `LockedFn` made by [`analyze`].
    pub(crate) fn body_mut(&mut self) -> Option<&mut Block> {
        place_mut(&mut self.func.block, self.body)
    }
}

/// Parses the item as a function with a body, or explains where the attribute goes.
pub(crate) fn parse(item: TokenStream) -> syn::Result<ItemFn> {
    let err = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(func) => return Ok(func),
        Err(err) => err,
    };
    // A function whose body syn cannot read (syntax newer than syn, or an error rustc reports
    // too): syn's own error says where, which beats "not on this item".
    if fn_shaped.parse2(item.clone()).is_ok() {
        return Err(err);
    }
    // A trait method without a default body parses as this; say where to put the attribute.
    if let Ok(method) = syn::parse2::<TraitItemFn>(item.clone()) {
        return Err(syn::Error::new_spanned(
            method.sig,
            format!(
                "{WHERE}; this trait method has none: put the attribute on its implementations"
            ),
        ));
    }
    // `#[distributed_lock]` written on an `#[async_trait]` impl or trait instead of a method.
    let block = match syn::parse2::<Item>(item.clone()) {
        Ok(Item::Impl(block)) => Some(("an impl block", block.impl_token.span)),
        Ok(Item::Trait(block)) => Some(("a trait", block.trait_token.span)),
        _ => None,
    };
    if let Some((what, span)) = block {
        let async_trait = if item.to_string().contains("async_trait") {
            " (`#[async_trait]` stays on the block)"
        } else {
            ""
        };
        return Err(syn::Error::new(
            span,
            format!(
                "{WHERE}, not on {what}: put it on each method that runs under the lock, inside \
                 the block{async_trait}"
            ),
        ));
    }
    Err(syn::Error::new_spanned(
        item,
        format!("{WHERE}, not on this item"),
    ))
}

/// Attributes, visibility, signature and any `{ ... }`.
fn fn_shaped(input: ParseStream<'_>) -> syn::Result<()> {
    input.call(Attribute::parse_outer)?;
    input.parse::<Visibility>()?;
    input.parse::<Signature>()?;
    match input.parse::<TokenTree>()? {
        TokenTree::Group(body) if body.delimiter() == Delimiter::Brace && input.is_empty() => {
            Ok(())
        }
        other => Err(syn::Error::new(
            other.span(),
            "expected the function's body",
        )),
    }
}

/// Finds the body of an `async fn`, or of a `fn` returning an async block (async-trait).
pub(crate) fn analyze(mut func: ItemFn) -> syn::Result<LockedFn> {
    let mut params = bindings(&func.sig);
    if let Some(asyncness) = func.sig.asyncness {
        let output = match &func.sig.output {
            syn::ReturnType::Type(_, ty) => Some((**ty).clone()),
            syn::ReturnType::Default => None,
        };
        return Ok(LockedFn {
            async_span: asyncness.span,
            fn_span: func.sig.fn_token.span,
            func,
            body: BodyPlace::Fn,
            output,
            params,
            self_alias: None,
        });
    }
    let output = match &func.sig.output {
        syn::ReturnType::Type(_, ty) => future_output(ty).cloned(),
        syn::ReturnType::Default => None,
    };
    let future = returned_async_block(&mut func.block);
    let (Some(output), Some(future)) = (output.clone(), future) else {
        let message = if output.is_some() {
            // Perhaps a layout of async-trait's that this attribute does not know yet.
            "`#[distributed_lock]` needs an `async fn`: this `fn` returns a future, but not one \
             made by an `async` block (or `Box::pin(async ..)`) whose body the lock could wrap; \
             make it `async fn`"
        } else {
            "`#[distributed_lock]` needs an `async fn`: make it `async fn` (callers then `.await` it)"
        };
        return Err(syn::Error::new(func.sig.fn_token.span, message));
    };
    let async_span = future.async_token.span;
    let stmts = &future.block.stmts;
    let let_index = async_trait_body(stmts);
    let mut self_alias = None;
    for stmt in &stmts[..let_index.unwrap_or(0)] {
        if let Stmt::Local(local) = stmt {
            collect(&local.pat, &mut params);
            self_alias = self_alias.or_else(|| renamed_self(local));
        }
    }
    // Not names the user wrote: async-trait's `__self`, and its `__argN` for pattern parameters
    // (their bindings come from the `let`s above).
    let mut seen = Vec::new();
    params.retain(|p| {
        let generated = Some(p) == self_alias.as_ref() || is_positional_arg(p);
        let fresh = !generated && !seen.contains(p);
        seen.push(p.clone());
        fresh
    });
    Ok(LockedFn {
        async_span,
        fn_span: func.sig.fn_token.span,
        func,
        body: BodyPlace::Future { let_index },
        output: Some(output),
        params,
        self_alias,
    })
}

fn is_positional_arg(ident: &Ident) -> bool {
    ident
        .to_string()
        .strip_prefix("__arg")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn place_mut(block: &mut Block, place: BodyPlace) -> Option<&mut Block> {
    let BodyPlace::Future { let_index } = place else {
        return Some(block);
    };
    let future = returned_async_block(block)?;
    let Some(index) = let_index else {
        return Some(&mut future.block);
    };
    match future.block.stmts.get_mut(index)? {
        Stmt::Local(local) => match &mut *local.init.as_mut()?.expr {
            Expr::Block(bound) => Some(&mut bound.block),
            _ => None,
        },
        _ => None,
    }
}

/// The async block a function body ends with, bare or in `Box::pin(..)`.
fn returned_async_block(block: &mut Block) -> Option<&mut ExprAsync> {
    let Some(Stmt::Expr(tail, None)) = block.stmts.last_mut() else {
        return None;
    };
    match tail {
        Expr::Async(future) => Some(future),
        Expr::Call(call) if call.args.len() == 1 && is_box_pin(&call.func) => {
            match call.args.first_mut()? {
                Expr::Async(future) => Some(future),
                _ => None,
            }
        }
        _ => None,
    }
}

fn is_box_pin(func: &Expr) -> bool {
    let Expr::Path(path) = func else {
        return false;
    };
    let segments: Vec<String> = path
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    segments.ends_with(&["Box".to_owned(), "pin".to_owned()])
}

/// `R` in a return type such as `Pin<Box<dyn Future<Output = R> + Send + 'a>>` or
/// `impl Future<Output = R>`.
fn future_output(ty: &Type) -> Option<&Type> {
    match ty {
        // `Pin<Box<..>>`: look inside the type arguments.
        Type::Path(path) => path.path.segments.iter().find_map(|segment| {
            let PathArguments::AngleBracketed(args) = &segment.arguments else {
                return None;
            };
            args.args.iter().find_map(|arg| match arg {
                GenericArgument::Type(inner) => future_output(inner),
                _ => None,
            })
        }),
        Type::TraitObject(object) => bounds_output(object.bounds.iter()),
        Type::ImplTrait(found) => bounds_output(found.bounds.iter()),
        Type::Paren(inner) => future_output(&inner.elem),
        Type::Group(inner) => future_output(&inner.elem),
        _ => None,
    }
}

fn bounds_output<'a>(mut bounds: impl Iterator<Item = &'a TypeParamBound>) -> Option<&'a Type> {
    bounds.find_map(|bound| match bound {
        TypeParamBound::Trait(found) => future_output_of_path(&found.path),
        _ => None,
    })
}

fn future_output_of_path(path: &syn::Path) -> Option<&Type> {
    let last = path.segments.last().filter(|s| s.ident == "Future")?;
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    args.args.iter().find_map(|arg| match arg {
        GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(&assoc.ty),
        _ => None,
    })
}

/// In async-trait's layout, `let __ret: R = { body }; __ret` or `let _: () = { body };` at the
/// end of the async block, the index of that `let`.
fn async_trait_body(stmts: &[Stmt]) -> Option<usize> {
    let (index, tail) = match stmts {
        [.., Stmt::Local(_), Stmt::Expr(Expr::Path(tail), None)] => {
            (stmts.len() - 2, Some(tail.path.get_ident()?))
        }
        [.., Stmt::Local(_)] => (stmts.len() - 1, None),
        _ => return None,
    };
    let Stmt::Local(local) = &stmts[index] else {
        return None;
    };
    let init = local.init.as_ref().filter(|init| init.diverge.is_none())?;
    if !matches!(&*init.expr, Expr::Block(block) if block.label.is_none()) {
        return None;
    }
    let Pat::Type(typed) = &local.pat else {
        return None;
    };
    match (&*typed.pat, tail) {
        (Pat::Ident(bound), Some(tail)) if bound.ident == *tail => Some(index),
        (Pat::Wild(_), None) => Some(index),
        _ => None,
    }
}

/// `__self` in `let __self = self;` (async-trait's renaming of the receiver).
fn renamed_self(local: &syn::Local) -> Option<Ident> {
    let Pat::Ident(alias) = &local.pat else {
        return None;
    };
    let init = local.init.as_ref()?;
    match &*init.expr {
        Expr::Path(path) if path.path.is_ident("self") => Some(alias.ident.clone()),
        _ => None,
    }
}

/// Every name bound by the parameters, including inside patterns like `(a, b): (u32, u32)`.
/// `self` is not one: the key is built from parameters only.
pub(crate) fn bindings(sig: &Signature) -> Vec<Ident> {
    let mut out = Vec::new();
    for input in &sig.inputs {
        if let FnArg::Typed(typed) = input {
            collect(&typed.pat, &mut out);
        }
    }
    out
}

fn collect(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => {
            out.push(p.ident.clone());
            if let Some((_, sub)) = &p.subpat {
                collect(sub, out);
            }
        }
        Pat::Tuple(p) => p.elems.iter().for_each(|e| collect(e, out)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| collect(e, out)),
        Pat::Struct(p) => p.fields.iter().for_each(|f| collect(&f.pat, out)),
        Pat::Slice(p) => p.elems.iter().for_each(|e| collect(e, out)),
        Pat::Reference(p) => collect(&p.pat, out),
        Pat::Paren(p) => collect(&p.pat, out),
        Pat::Type(p) => collect(&p.pat, out),
        Pat::Or(p) => p.cases.iter().take(1).for_each(|c| collect(c, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;
    use syn::ext::IdentExt;

    fn names(sig: &str) -> Vec<String> {
        let sig: Signature = syn::parse_str(sig).unwrap();
        bindings(&sig)
            .iter()
            .map(|i| i.unraw().to_string())
            .collect()
    }

    #[test]
    fn says_where_the_attribute_goes() {
        let err = |tokens: TokenStream| parse(tokens).err().unwrap().to_string();
        assert!(
            err(quote!(
                struct S;
            ))
            .ends_with("with a body, not on this item")
        );
        let message = err(quote!(
            async fn f(&self);
        ));
        assert!(message.contains("this trait method has none"), "{message}");
        // A body syn cannot read keeps syn's error, which points into the body.
        let message = err(quote!(async fn f() { let = ; }));
        assert!(!message.contains("goes on"), "{message}");
        let message = err(quote!(
            impl S {}
        ));
        assert!(
            message
                .ends_with("not on an impl block: put it on each method that runs under the lock, inside the block"),
            "{message}"
        );
        let message = err(quote!(
            #[async_trait::async_trait]
            trait T {}
        ));
        assert!(
            message.contains("not on a trait")
                && message.ends_with("(`#[async_trait]` stays on the block)"),
            "{message}"
        );
    }

    #[test]
    fn finds_plain_and_pattern_bindings() {
        assert_eq!(
            names("async fn f(&self, a: u32, mut b: &str, _: u8)"),
            ["a", "b"]
        );
        assert_eq!(
            names("async fn f((a, b): (u32, u32), P { x, y: z, .. }: P)"),
            ["a", "b", "x", "z"]
        );
        assert_eq!(
            names("async fn f(&(ref a, [b, ..]): &(u8, [u8; 2]), W(c): W, r#type: u8)"),
            ["a", "b", "c", "type"]
        );
        assert_eq!(
            names("async fn f(whole @ (x, _): (u8, u8))"),
            ["whole", "x"]
        );
    }

    fn analyzed(tokens: TokenStream) -> syn::Result<LockedFn> {
        analyze(syn::parse2(tokens).unwrap())
    }

    fn text(tokens: &impl quote::ToTokens) -> String {
        tokens.to_token_stream().to_string()
    }

    #[test]
    fn an_async_fn_is_its_own_body() {
        let mut locked = analyzed(quote!(
            async fn f(a: u8) -> Result<u8, E> {
                Ok(a)
            }
        ))
        .unwrap();
        assert_eq!(text(&locked.output), "Result < u8 , E >");
        assert_eq!(text(&locked.body_mut()), "{ Ok (a) }");
        assert!(locked.self_alias.is_none());
        let locked = analyzed(quote!(
            async fn f() {}
        ))
        .unwrap();
        assert!(locked.output.is_none());
    }

    #[test]
    fn a_plain_fn_is_refused() {
        let message = |tokens| analyzed(tokens).err().unwrap().to_string();
        assert!(
            message(quote!(
                fn f() {}
            ))
            .contains("make it `async fn`")
        );
        // A future without a readable output type, or a body that is not an async block.
        assert!(
            message(quote!(
                fn f() -> Pin<Box<dyn Future>> {
                    Box::pin(async {})
                }
            ))
            .contains("make it `async fn`")
        );
        assert!(
            message(quote!(
                fn f() -> impl Future<Output = ()> {
                    ready(())
                }
            ))
            .contains("returns a future, but not one made by an `async` block")
        );
    }

    /// What async-trait 0.1.92 makes of `async fn f(&self, id: u32, (a, b): (u8, u8)) -> R`.
    #[test]
    fn async_traits_layout_locks_the_users_block() {
        let mut locked = analyzed(quote!(
            fn f<'life0, 'async_trait>(
                &'life0 self,
                id: u32,
                __arg2: (u8, u8),
            ) -> ::core::pin::Pin<
                Box<
                    dyn ::core::future::Future<Output = Result<u32, E>>
                        + ::core::marker::Send
                        + 'async_trait,
                >,
            >
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async move {
                    if let ::core::option::Option::Some(__ret) =
                        ::core::option::Option::None::<Result<u32, E>>
                    {
                        #[allow(unreachable_code)]
                        return __ret;
                    }
                    let __self = self;
                    let id = id;
                    let (a, b) = {
                        let __arg2 = __arg2;
                        __arg2
                    };
                    let __ret: Result<u32, E> = { Ok(__self.n + id) };
                    #[allow(unreachable_code)]
                    __ret
                })
            }
        ))
        .unwrap();
        assert_eq!(text(&locked.output), "Result < u32 , E >");
        assert_eq!(text(&locked.self_alias), "__self");
        let params: Vec<String> = locked.params.iter().map(ToString::to_string).collect();
        assert_eq!(params, ["id", "a", "b"]);
        assert_eq!(text(&locked.body_mut()), "{ Ok (__self . n + id) }");
    }

    #[test]
    fn async_traits_unit_layout_and_a_bare_async_block() {
        let mut locked = analyzed(quote!(
            fn f<'async_trait>() -> Pin<Box<dyn Future<Output = ()> + Send + 'async_trait>> {
                Box::pin(async move {
                    let _: () = {
                        work().await;
                    };
                })
            }
        ))
        .unwrap();
        assert_eq!(text(&locked.output), "()");
        assert_eq!(text(&locked.body_mut()), "{ work () . await ; }");
        // Any other layout: the whole async block is the body.
        let mut locked = analyzed(quote!(
            fn f(id: u8) -> impl Future<Output = u8> + Send {
                async move {
                    let x: u8 = { id };
                    x + 1
                }
            }
        ))
        .unwrap();
        assert_eq!(text(&locked.output), "u8");
        assert_eq!(text(&locked.body_mut()), "{ let x : u8 = { id } ; x + 1 }");
    }
}

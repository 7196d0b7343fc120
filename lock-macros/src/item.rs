//! The function under the attribute: that it is an `async fn` with a body, and the names its
//! parameters bind (the names a key template may use).

use proc_macro2::{Delimiter, TokenStream, TokenTree};
use syn::parse::{ParseStream, Parser};
use syn::{Attribute, FnArg, Ident, ItemFn, Pat, Signature, TraitItemFn, Visibility};

const WHERE: &str = "`#[distributed_lock]` goes on an `async fn` with a body";

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

/// Rejects a function that is not `async`: the lock is held across the body's awaits.
pub(crate) fn check_async(sig: &Signature) -> syn::Result<()> {
    match sig.asyncness {
        Some(_) => Ok(()),
        None => Err(syn::Error::new(
            sig.fn_token.span,
            "`#[distributed_lock]` needs an `async fn`: make it `async fn` (callers then `.await` it)",
        )),
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
            err(quote::quote!(
                struct S;
            ))
            .ends_with("with a body, not on this item")
        );
        let message = err(quote::quote!(
            async fn f(&self);
        ));
        assert!(message.contains("this trait method has none"), "{message}");
        // A body syn cannot read keeps syn's error, which points into the body.
        let message = err(quote::quote!(async fn f() { let = ; }));
        assert!(!message.contains("goes on"), "{message}");
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
}
